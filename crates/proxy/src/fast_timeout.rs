//! Timeouts that read no clock and arm no timer when the work is ready at its first poll.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;
use tokio::time::error::Elapsed;

/// [`tokio::time::timeout`], but `fut` is polled once before the deadline exists: writes that
/// fit the socket buffer and capacity already granted (most of them on a busy connection) then
/// cost no clock read and no timer. The limit runs from the end of the first poll when that
/// poll was not ready (after its work, a TLS record encrypted for example), not from the call.
pub async fn timeout<F: Future>(limit: Duration, fut: F) -> Result<F::Output, Elapsed> {
    let mut fut = pin!(fut);
    if let Poll::Ready(v) = poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await {
        return Ok(v);
    }
    tokio::time::timeout(limit, fut).await
}

#[cfg(test)]
mod tests {
    use super::timeout;
    use std::time::Duration;

    #[test]
    fn ready_work_arms_no_timer() {
        // A runtime without a time driver: creating tokio's timer there panics.
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let r = rt.block_on(timeout(Duration::from_secs(1), async { 7 }));
        assert_eq!(r.ok(), Some(7));
    }

    #[tokio::test]
    async fn pending_work_times_out_and_slow_work_finishes() {
        let never = std::future::pending::<()>();
        assert!(timeout(Duration::from_millis(20), never).await.is_err());
        let later = tokio::time::sleep(Duration::from_millis(1));
        assert!(timeout(Duration::from_secs(5), later).await.is_ok());
    }
}
