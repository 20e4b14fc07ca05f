//! Coarse request deadlines: one watchdog task per worker instead of a timer per request.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// How often the watchdog looks at the deadlines: the precision of timeouts and of the drain.
pub const WATCH_EVERY: Duration = Duration::from_millis(5);

/// The deadline of one connection's current request.
#[derive(Debug, Default)]
pub struct Deadline {
    at: Cell<Option<Instant>>,
    expired: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Deadline {
    /// Run `fut` until it completes (`Some`) or `at` passes (`None`, give or take [`WATCH_EVERY`]).
    pub async fn run<F: Future>(&self, at: Instant, fut: F) -> Option<F::Output> {
        self.at.set(Some(at));
        self.expired.set(false);
        let out = Guarded {
            deadline: self,
            fut: std::pin::pin!(fut),
        }
        .await;
        self.at.set(None);
        out
    }

    /// Expire the request if its deadline is at or before `now`.
    fn check(&self, now: Instant) {
        if self.at.get().is_some_and(|at| at <= now) && !self.expired.get() {
            self.expired.set(true);
            if let Some(w) = self.waker.borrow_mut().take() {
                w.wake();
            }
        }
    }
}

struct Guarded<'a, F: Future> {
    deadline: &'a Deadline,
    fut: Pin<&'a mut F>,
}

impl<F: Future> Future for Guarded<'_, F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.deadline.expired.get() {
            return Poll::Ready(None);
        }
        if let Poll::Ready(v) = self.fut.as_mut().poll(cx) {
            return Poll::Ready(Some(v));
        }
        let mut w = self.deadline.waker.borrow_mut();
        match w.as_ref() {
            Some(old) if old.will_wake(cx.waker()) => {}
            _ => *w = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

/// Expire the deadlines of `all` as they pass, every [`WATCH_EVERY`]. Runs until dropped.
pub async fn watchdog(all: Vec<Rc<Deadline>>) {
    let mut tick = tokio::time::interval(WATCH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = Instant::now();
        for d in &all {
            d.check(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expires_slow_futures_and_passes_fast_ones() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        let d = Rc::new(Deadline::default());
        let (fast, slow, after) = local.block_on(&rt, async {
            tokio::task::spawn_local(watchdog(vec![d.clone()]));
            let soon = Instant::now() + Duration::from_millis(50);
            let fast = d.run(soon, async { 7 }).await;
            let t = Instant::now();
            let slow = d
                .run(Instant::now() + Duration::from_millis(30), async {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    8
                })
                .await;
            let waited = t.elapsed();
            // The expiry of the previous request does not leak into the next one.
            let after = d
                .run(Instant::now() + Duration::from_millis(100), async {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    9
                })
                .await;
            assert!(waited >= Duration::from_millis(30) && waited < Duration::from_secs(2));
            (fast, slow, after)
        });
        assert_eq!((fast, slow, after), (Some(7), None, Some(9)));
    }
}
