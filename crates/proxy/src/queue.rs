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
            match upstream.pick_at(key, None, Instant::now()) {
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
