//! Load shedding decision (sans-io): from event-loop lag samples, whether a worker sheds new requests.

use portico_config::Shed;
use std::time::{Duration, Instant};

/// What an observation changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    None,
    /// Shedding starts with this sample.
    Started,
    /// Shedding stops with this sample.
    Stopped,
}

/// One listener's shedding state on one worker. Time comes in as arguments.
///
/// A worker's event loop measures its own lag: how late a timer fires. On a thread-per-core
/// proxy that is the time every ready task waits for the thread, so it grows exactly when this
/// worker (not its upstreams) is saturated; slow upstreams only make tasks wait without using
/// the thread. Like CoDel, one late sample is not overload: shedding starts once the lag has
/// stayed above `target` for a whole `interval`, and stops at the first sample back at or below
/// `target`, so admitted requests keep their latency while excess ones get a fast 503 instead of
/// joining the backlog.
#[derive(Debug, Clone)]
pub struct Shedder {
    settings: Shed,
    /// When the current run of late samples began: a sample of lag `l` at `now` means the loop
    /// was already late at `now - l`.
    above_since: Option<Instant>,
    shedding: bool,
}

impl Shedder {
    pub fn new(settings: Shed) -> Self {
        Shedder {
            settings,
            above_since: None,
            shedding: false,
        }
    }

    /// Whether new requests are shed now.
    pub fn shedding(&self) -> bool {
        self.shedding
    }

    /// New settings after a reload; the current run of late samples is kept.
    pub fn configure(&mut self, settings: Shed) {
        self.settings = settings;
    }

    /// One lag sample taken at `now`.
    pub fn observe(&mut self, lag: Duration, now: Instant) -> Change {
        if lag <= self.settings.target {
            self.above_since = None;
            if self.shedding {
                self.shedding = false;
                return Change::Stopped;
            }
            return Change::None;
        }
        let since = *self
            .above_since
            .get_or_insert_with(|| now.checked_sub(lag).unwrap_or(now));
        if !self.shedding && now.saturating_duration_since(since) >= self.settings.interval {
            self.shedding = true;
            return Change::Started;
        }
        Change::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn shedder() -> (Shedder, Instant) {
        let s = Shed {
            target: 5 * MS,
            interval: 100 * MS,
        };
        (Shedder::new(s), Instant::now())
    }

    #[test]
    fn lag_below_target_never_sheds() {
        let (mut s, t0) = shedder();
        for i in 0..1000 {
            assert_eq!(s.observe(5 * MS, t0 + i * 10 * MS), Change::None);
        }
        assert!(!s.shedding());
    }

    #[test]
    fn sheds_once_lag_stays_above_target_for_an_interval() {
        let (mut s, t0) = shedder();
        // Late samples every ~20 ms: the run starts at the first one's start (t0 + 10 ms - 6 ms).
        let mut t = t0 + 10 * MS;
        assert_eq!(s.observe(6 * MS, t), Change::None);
        let mut started = None;
        for _ in 0..10 {
            t += 20 * MS;
            if s.observe(8 * MS, t) == Change::Started {
                started = Some(t);
                break;
            }
        }
        let started = started.expect("shedding started");
        assert!(s.shedding());
        let run = started - (t0 + 4 * MS);
        assert!(run >= 100 * MS && run < 120 * MS, "{run:?}");
        // Still late: no new transition.
        assert_eq!(s.observe(50 * MS, t + 60 * MS), Change::None);
        assert!(s.shedding());
        // The first sample back under target stops it at once.
        assert_eq!(s.observe(2 * MS, t + 70 * MS), Change::Stopped);
        assert!(!s.shedding());
    }

    #[test]
    fn one_dip_restarts_the_interval() {
        let (mut s, t0) = shedder();
        assert_eq!(s.observe(10 * MS, t0 + 10 * MS), Change::None);
        assert_eq!(s.observe(10 * MS, t0 + 90 * MS), Change::None);
        // Back under target just before the interval is over: the run starts again.
        assert_eq!(s.observe(1 * MS, t0 + 100 * MS), Change::None);
        // The new run starts at 140 ms (a sample 10 ms late at 150 ms).
        assert_eq!(s.observe(10 * MS, t0 + 150 * MS), Change::None);
        assert!(!s.shedding());
        assert_eq!(s.observe(10 * MS, t0 + 230 * MS), Change::None);
        assert_eq!(s.observe(10 * MS, t0 + 240 * MS), Change::Started);
    }

    #[test]
    fn a_stall_longer_than_the_interval_sheds_at_once() {
        // One sample 300 ms late: the loop was late for 300 ms already.
        let (mut s, t0) = shedder();
        assert_eq!(s.observe(300 * MS, t0 + 300 * MS), Change::Started);
        // Reconfigured with a target above the lag: the next sample stops it.
        s.configure(Shed {
            target: 500 * MS,
            interval: 500 * MS,
        });
        assert_eq!(s.observe(300 * MS, t0 + 600 * MS), Change::Stopped);
    }
}
