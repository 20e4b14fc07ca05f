//! Cheap timeouts: none read the clock or arm a timer for work ready at its first poll, and a connection's successive deadlines share one lazily re-armed timer.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::task::Poll;
use std::time::Duration;
use tokio::time::error::Elapsed;
use tokio::time::{Instant, Sleep};

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

/// One connection's timer for deadlines that come one after another (the wait for the next
/// request, then for a response head). It is only ever moved earlier; when it fires before the
/// deadline being waited for (it was armed for an earlier one), it moves to that deadline. A busy
/// connection's deadlines move later with every request, so the timer is registered about once
/// per timeout instead of once per wait (a registration and a cancellation each). Created at the
/// first wait: a connection that never waits costs nothing.
#[derive(Default)]
pub struct LazyTimer(Option<Pin<Box<Sleep>>>);

impl LazyTimer {
    /// Wait until `due` (a deadline of tokio's clock).
    pub async fn until(&mut self, due: Instant) {
        let timer = match &mut self.0 {
            Some(t) => {
                if t.deadline() > due {
                    t.as_mut().reset(due);
                }
                t
            }
            None => self.0.insert(Box::pin(tokio::time::sleep_until(due))),
        };
        loop {
            timer.as_mut().await;
            if Instant::now() >= due {
                return;
            }
            timer.as_mut().reset(due);
        }
    }

    /// `fut`'s output, or `None` once `due` passed first. As with
    /// [`tokio::time::timeout_at`], `fut` is polled first and the timer outside tokio's
    /// cooperative budget (a busy `fut` cannot starve it).
    pub async fn timeout_at<F: Future>(&mut self, due: Instant, fut: F) -> Option<F::Output> {
        tokio::select! {
            biased;
            v = fut => Some(v),
            _ = tokio::task::unconstrained(self.until(due)) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{timeout, LazyTimer};
    use std::time::Duration;
    use tokio::time::Instant;

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
    async fn a_lazy_timer_armed_early_waits_for_the_later_deadline() {
        let mut t = LazyTimer::default();
        let start = Instant::now();
        let ms = Duration::from_millis;
        // Armed for 30 ms by a wait that ends sooner (the timer is polled, so registered).
        let quick = tokio::time::sleep(ms(1));
        assert_eq!(t.timeout_at(start + ms(30), quick).await, Some(()));
        // A wait for 60 ms: the timer fires at 30 ms, which is not the deadline.
        let never = std::future::pending::<()>();
        assert_eq!(t.timeout_at(start + ms(60), never).await, None);
        assert!(start.elapsed() >= ms(60));
        // A deadline earlier than the armed one moves the timer.
        let mut t = LazyTimer::default();
        let at = Instant::now();
        // Armed an hour ahead by a wait given up after 1 ms.
        let _ = tokio::time::timeout(ms(1), t.until(at + ms(3_600_000))).await;
        let never = std::future::pending::<()>();
        let soon = tokio::time::timeout(ms(5000), t.timeout_at(at + ms(10), never)).await;
        assert_eq!(soon.ok(), Some(None), "the earlier deadline was kept");
    }

    #[tokio::test]
    async fn pending_work_times_out_and_slow_work_finishes() {
        let never = std::future::pending::<()>();
        assert!(timeout(Duration::from_millis(20), never).await.is_err());
        let later = tokio::time::sleep(Duration::from_millis(1));
        assert!(timeout(Duration::from_secs(5), later).await.is_ok());
    }
}
