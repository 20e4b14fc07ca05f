//! Sub-millisecond wake-ups at intended send times: a sleeper thread per worker wakes its runtime.

use std::cell::{Cell, RefCell};
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Longest single sleep of the sleeper thread, so that it notices `stop` promptly.
const MAX_SLEEP: Duration = Duration::from_millis(50);
/// Shortest interval between two wake-ups of the sleeper thread: at high rates one wake-up
/// releases several sends (bounding the schedule error it adds to this, well under 1 ms) instead
/// of paying for one thread switch per request.
pub const MIN_TICK: Duration = Duration::from_micros(100);

/// What the sleeper thread and the worker share.
#[derive(Debug)]
pub struct Shared {
    notify: Notify,
    stop: AtomicBool,
    base: Instant,
    /// Up to when the worker has released its waiters ([`Shared::offset`]).
    released: AtomicU64,
}

impl Shared {
    /// `base` is any instant before the first send time.
    pub fn new(base: Instant) -> Shared {
        Shared {
            notify: Notify::new(),
            stop: AtomicBool::new(false),
            base,
            released: AtomicU64::new(0),
        }
    }

    /// Ask the sleeper thread to end.
    pub fn stop(&self) {
        self.stop.store(true, AtomicOrdering::Relaxed);
    }

    /// `t` as 1 + nanoseconds after `base` (0 means nothing released yet).
    fn offset(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.base).as_nanos())
            .unwrap_or(u64::MAX)
            .saturating_add(1)
    }
}

struct Entry {
    at: Instant,
    seq: u64,
    waker: Waker,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// The worker-side half: tasks wait on it until an instant; [`Pacer::run`] wakes them.
///
/// Tokio's timer has millisecond ticks (a sleep ends up to ~1-2 ms late), which would become the
/// schedule error of every open-loop request. Instead each worker has a companion thread
/// ([`spawn_sleeper`]) that sleeps with the OS's high-resolution timer until the next intended
/// send time of the worker's connections and then notifies the worker's pacer task, which wakes
/// the connections whose time has come. Nothing spins: both threads idle between sends.
pub struct Pacer {
    shared: Arc<Shared>,
    waiters: RefCell<BinaryHeap<Reverse<Entry>>>,
    seq: Cell<u64>,
}

impl Pacer {
    pub fn new(shared: Arc<Shared>) -> Pacer {
        Pacer {
            shared,
            waiters: RefCell::new(BinaryHeap::new()),
            seq: Cell::new(0),
        }
    }

    /// Wait until `at`. `at` must be one of the times the sleeper thread was given (or past).
    pub fn until(&self, at: Instant) -> Until<'_> {
        Until { pacer: self, at }
    }

    /// Wake waiters each time the sleeper thread says a time has come. Runs until dropped.
    pub async fn run(&self) {
        loop {
            self.shared.notify.notified().await;
            self.wake_due(Instant::now());
        }
    }

    /// Wake the waiters whose time has come. The worker also calls this whenever it is awake
    /// anyway (after each response), which spares the sleeper thread's notification.
    pub fn wake_due(&self, now: Instant) {
        self.shared
            .released
            .fetch_max(self.shared.offset(now), AtomicOrdering::Relaxed);
        let mut due = Vec::new();
        {
            let mut w = self.waiters.borrow_mut();
            while w.peek().is_some_and(|Reverse(e)| e.at <= now) {
                if let Some(Reverse(e)) = w.pop() {
                    due.push(e.waker);
                }
            }
        }
        for waker in due {
            waker.wake();
        }
    }
}

/// Future of [`Pacer::until`].
pub struct Until<'a> {
    pacer: &'a Pacer,
    at: Instant,
}

impl Future for Until<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.at {
            return Poll::Ready(());
        }
        let seq = self.pacer.seq.get();
        self.pacer.seq.set(seq.wrapping_add(1));
        self.pacer.waiters.borrow_mut().push(Reverse(Entry {
            at: self.at,
            seq,
            waker: cx.waker().clone(),
        }));
        Poll::Pending
    }
}

/// Start the sleeper thread: for each of `times` (ascending), sleep until it (but at least
/// [`MIN_TICK`] after the previous wake-up), then notify the worker unless it already released
/// everything due. Times already past when it wakes are covered by one notification.
pub fn spawn_sleeper(
    name: String,
    shared: Arc<Shared>,
    mut times: impl Iterator<Item = Instant> + Send + 'static,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name).spawn(move || {
        let mut next = times.next();
        let mut last_wake: Option<Instant> = None;
        while let Some(at) = next {
            if shared.stop.load(AtomicOrdering::Relaxed) {
                return;
            }
            let wake_at = last_wake.map_or(at, |w| at.max(w + MIN_TICK));
            let now = Instant::now();
            if wake_at > now {
                std::thread::sleep((wake_at - now).min(MAX_SLEEP));
                continue;
            }
            last_wake = Some(now);
            // The latest time now due, and the first one still ahead.
            let mut due = at;
            next = None;
            for t in times.by_ref() {
                if t > now {
                    next = Some(t);
                    break;
                }
                due = t;
            }
            if shared.released.load(AtomicOrdering::Relaxed) < shared.offset(due) {
                shared.notify.notify_one();
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    #[test]
    fn wakes_waiters_close_to_their_time() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        let shared = Arc::new(Shared::new(Instant::now()));
        let start = Instant::now() + Duration::from_millis(20);
        let times: Vec<Instant> = (0..40)
            .map(|i| start + Duration::from_micros(500 * i))
            .collect();
        let sleeper = spawn_sleeper("t".into(), shared.clone(), times.clone().into_iter()).unwrap();
        let pacer = Rc::new(Pacer::new(shared.clone()));
        let mut lags = local.block_on(&rt, async {
            let p = pacer.clone();
            tokio::task::spawn_local(async move { p.run().await });
            let mut lags = Vec::new();
            for t in times {
                pacer.until(t).await;
                lags.push(Instant::now() - t);
            }
            lags
        });
        shared.stop();
        sleeper.join().unwrap();
        lags.sort();
        // Never early; the median well under tokio's millisecond timer granularity (loose bound:
        // tests may share a busy machine).
        assert_eq!(lags.len(), 40);
        assert!(lags[20] < Duration::from_millis(5), "{lags:?}");
    }
}
