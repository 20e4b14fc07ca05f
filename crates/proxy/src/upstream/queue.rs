//! The bounded queue of an upstream group: requests that find every server at its limit wait for a released slot.

use crate::error::ProxyError;
use portico_upstream::{PickError, ReleaseHook, ServerGuard, Upstream};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// One group's queue, shared by every worker and kept across reloads while the group's name
/// stays. Waiters register with a [`Notify`] (FIFO for `notify_one`); each released slot of the
/// group wakes one of them through [`ReleaseHook`], so nobody polls. A request that arrives
/// while a slot is free takes it without queueing, so the order is FIFO among waiters only.
#[derive(Debug, Default)]
pub struct GroupQueue {
    /// Requests waiting now, over all workers (at most the group's `queue`).
    waiting: AtomicU32,
    notify: Notify,
    /// Requests that had to wait.
    pub queued: AtomicU64,
    /// Waiting requests that got a server.
    pub admitted: AtomicU64,
    /// Requests refused because `queue` requests were already waiting.
    pub full: AtomicU64,
    /// Waiting requests refused after `queue_timeout`.
    pub timeouts: AtomicU64,
}

impl ReleaseHook for GroupQueue {
    fn released(&self) {
        // Pairs with the fence in `wait`: either the waiter's pick sees the freed slot, or this
        // load sees the waiter.
        fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::Relaxed) > 0 {
            self.notify.notify_one();
        }
    }
}

/// A place in the queue; given back on drop (also when the waiting request is cancelled).
struct Place<'a>(&'a AtomicU32);

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl GroupQueue {
    /// Requests waiting now.
    pub fn waiting(&self) -> u32 {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Wait until a server of `upstream` can take the request: at most `max` requests wait at
    /// once (else [`ProxyError::QueueFull`] at once), each at most `timeout` (else
    /// [`ProxyError::QueueTimeout`]). A group whose servers all become unavailable meanwhile
    /// ends the wait with [`ProxyError::Unavailable`].
    pub async fn wait(
        &self,
        upstream: &Upstream,
        key: Option<&[u8]>,
        exclude: &[usize],
        max: u32,
        timeout: Duration,
    ) -> Result<ServerGuard, ProxyError> {
        let taken = self
            .waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            });
        if taken.is_err() {
            self.full.fetch_add(1, Ordering::Relaxed);
            return Err(ProxyError::QueueFull);
        }
        let _place = Place(&self.waiting);
        fence(Ordering::SeqCst);
        self.queued.fetch_add(1, Ordering::Relaxed);
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Registered before the pick, so a slot released between the pick and the wait
            // still wakes this request.
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match upstream.pick_at_excluding(key, exclude, Instant::now()) {
                Ok(guard) => {
                    self.admitted.fetch_add(1, Ordering::Relaxed);
                    return Ok(guard);
                }
                Err(PickError::Unavailable) => return Err(ProxyError::Unavailable),
                Err(PickError::AtLimit) => {}
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                self.timeouts.fetch_add(1, Ordering::Relaxed);
                return Err(ProxyError::QueueTimeout);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn upstream(limit: u32, queue: u32) -> (Arc<Upstream>, Arc<GroupQueue>) {
        let cfg = portico_config::parse(
            &format!(
                "[upstreams.g]\nservers = [\"10.0.0.1:80\"]\nmax_connections_per_server = {limit}\nqueue = {queue}\n[[listeners]]\naddress = \"127.0.0.1:1\"\n[[listeners.routes]]\nproxy = \"g\"\n"
            ),
            "t.toml",
        )
        .unwrap();
        let u = Arc::new(Upstream::new(Arc::clone(&cfg.upstreams[0])));
        let q = Arc::new(GroupQueue::default());
        assert!(u.set_release_hook(q.clone()));
        (u, q)
    }

    /// Wait on a runtime of its own on another thread, as a request on another worker would.
    fn waiter(
        u: &Arc<Upstream>,
        q: &Arc<GroupQueue>,
        timeout: Duration,
    ) -> std::thread::JoinHandle<Result<usize, String>> {
        let (u, q) = (u.clone(), q.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                q.wait(&u, None, &[], 2, timeout)
                    .await
                    .map(|g| g.index())
                    .map_err(|e| e.to_string())
            })
        })
    }

    fn until(cond: impl Fn() -> bool) {
        let end = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < end, "condition never held");
            std::thread::yield_now();
        }
    }

    #[test]
    fn released_slots_wake_waiters_on_other_threads_and_a_full_queue_refuses() {
        let (u, q) = upstream(1, 2);
        let held = u.pick(None, None).unwrap();
        let a = waiter(&u, &q, Duration::from_secs(10));
        let b = waiter(&u, &q, Duration::from_secs(10));
        until(|| q.waiting() == 2);
        // Two wait: a third is refused at once, without waiting.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let third = rt.block_on(q.wait(&u, None, &[], 2, Duration::from_secs(10)));
        assert!(matches!(third, Err(ProxyError::QueueFull)));
        assert_eq!(q.full.load(Ordering::Relaxed), 1);
        // Each release admits one waiter; the admitted one releases in turn when it finishes.
        drop(held);
        let first = [a, b].into_iter().map(|t| t.join().unwrap());
        for r in first {
            assert_eq!(r, Ok(0));
        }
        assert_eq!(q.waiting(), 0);
        assert_eq!(q.admitted.load(Ordering::Relaxed), 2);
        assert_eq!(u.active(0), 0);
    }

    #[test]
    fn a_waiter_without_a_released_slot_times_out() {
        let (u, q) = upstream(1, 2);
        let _held = u.pick(None, None).unwrap();
        let t0 = Instant::now();
        let r = waiter(&u, &q, Duration::from_millis(50)).join().unwrap();
        assert_eq!(r, Err(ProxyError::QueueTimeout.to_string()));
        assert!(t0.elapsed() >= Duration::from_millis(50));
        assert_eq!(q.timeouts.load(Ordering::Relaxed), 1);
        assert_eq!(q.waiting(), 0, "the place is given back");
    }
}
