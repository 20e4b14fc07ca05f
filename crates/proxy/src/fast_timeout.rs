//! Timeouts that read no clock and arm no timer when the work is ready at its first poll.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;
use tokio::time::error::Elapsed;

/// [`tokio::time::timeout`], but `fut` is polled once before the deadline exists: writes that
/// fit the socket buffer and capacity already granted (most of them on a busy connection) then
/// cost no clock read and no timer. The limit runs from the first poll that was not ready, a
/// few instructions later than tokio's would.
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

    #[tokio::test]
    async fn ready_work_needs_no_timer_and_pending_work_times_out() {
        // Ready at once: done even with no time at all.
        assert_eq!(timeout(Duration::ZERO, async { 7 }).await.ok(), Some(7));
        let never = std::future::pending::<()>();
        assert!(timeout(Duration::from_millis(20), never).await.is_err());
        let later = tokio::time::sleep(Duration::from_millis(1));
        assert!(timeout(Duration::from_secs(5), later).await.is_ok());
    }
}
