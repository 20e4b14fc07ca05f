//! Route retries: the process-wide retry budget (sans-io, time passed in) and the per-request retry decision.

use crate::metrics::RouteStats;
use crate::telemetry::stats::Stats;
use portico_config::{RetryPolicy, RETRY_BUDGET_WINDOW};
use portico_http1::RequestHead;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// One-second slots in the budget's window.
const SLOTS: usize = RETRY_BUDGET_WINDOW.as_secs() as usize;
/// Parts per million: the budget ratio in integer arithmetic, so `0.2 * 5` is exactly 1.
const PPM: u64 = 1_000_000;

/// A retry budget shared by every worker of the process (one per route with a `retry` table):
/// over the last [`RETRY_BUDGET_WINDOW`], retries may be at most `budget` times the requests
/// that started, plus `min_per_second` per second of the window (Linkerd's and Envoy's budgets).
/// An outage therefore multiplies the load on the group by at most `1 + budget`, instead of by
/// the number of attempts.
///
/// Requests are counted with one compare-exchange on a one-second slot (the hot path: every
/// request of the route); a retry takes a short mutex so that checking the budget and spending
/// from it are one step, and concurrent workers can never overspend it.
#[derive(Debug)]
pub struct RetryBudget {
    base: Instant,
    ratio_ppm: u64,
    /// `min_per_second` times the window, in retries.
    reserve: u64,
    /// Per second slot: (second since `base`) << 32 | count.
    requests: [AtomicU64; SLOTS],
    retries: [AtomicU64; SLOTS],
    spend: Mutex<()>,
}

fn pack(sec: u32, n: u32) -> u64 {
    (u64::from(sec) << 32) | u64::from(n)
}

fn unpack(v: u64) -> (u32, u32) {
    ((v >> 32) as u32, v as u32)
}

impl RetryBudget {
    /// A budget whose clock starts at `base` (any instant not after the first `now` passed in).
    pub fn new(budget: f64, min_per_second: u32, base: Instant) -> Self {
        RetryBudget {
            base,
            ratio_ppm: (budget.clamp(0.0, 1.0) * PPM as f64).round() as u64,
            reserve: u64::from(min_per_second) * SLOTS as u64,
            requests: std::array::from_fn(|_| AtomicU64::new(0)),
            retries: std::array::from_fn(|_| AtomicU64::new(0)),
            spend: Mutex::new(()),
        }
    }

    fn second(&self, now: Instant) -> u32 {
        u32::try_from(now.saturating_duration_since(self.base).as_secs()).unwrap_or(u32::MAX)
    }

    /// Count one request that started at `now` (first attempts only, not retries).
    pub fn deposit(&self, now: Instant) {
        bump(&self.requests, self.second(now));
    }

    /// Spend one retry at `now` if the budget allows it; false = budget exhausted.
    pub fn try_withdraw(&self, now: Instant) -> bool {
        let sec = self.second(now);
        let _serial = self.spend.lock().unwrap_or_else(|e| e.into_inner());
        let requests = window_sum(&self.requests, sec);
        let retries = window_sum(&self.retries, sec);
        let allowed = self.ratio_ppm * requests + self.reserve * PPM;
        if (retries + 1) * PPM > allowed {
            return false;
        }
        bump(&self.retries, sec);
        true
    }

    /// (requests, retries) counted in the window ending at `now`.
    pub fn window(&self, now: Instant) -> (u64, u64) {
        let sec = self.second(now);
        (
            window_sum(&self.requests, sec),
            window_sum(&self.retries, sec),
        )
    }
}

/// Add one to the slot of second `sec`, restarting it when it holds an older second.
fn bump(slots: &[AtomicU64; SLOTS], sec: u32) {
    let slot = &slots[sec as usize % SLOTS];
    let mut cur = slot.load(Ordering::Relaxed);
    loop {
        let (tag, n) = unpack(cur);
        let next = if tag < sec {
            pack(sec, 1)
        } else {
            // The same second, or a newer one another thread read its clock for: count there.
            pack(tag, n.saturating_add(1))
        };
        match slot.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => return,
            Err(actual) => cur = actual,
        }
    }
}

/// The counts of the slots within the window ending at second `sec`.
fn window_sum(slots: &[AtomicU64; SLOTS], sec: u32) -> u64 {
    slots
        .iter()
        .map(|s| unpack(s.load(Ordering::Acquire)))
        .filter(|&(tag, _)| tag <= sec && sec - tag < SLOTS as u32)
        .map(|(_, n)| u64::from(n))
        .sum()
}

/// What failed in an attempt, in the terms of the retry `on` list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryCause {
    Connect,
    Reset,
    Timeout,
    Status(u16),
}

/// One request's retry state: whether it may be retried at all, how many retries are left, and
/// the servers already tried (so the next attempt goes elsewhere).
pub struct Retry<'a> {
    /// None when the route has no policy or this request may not be retried.
    policy: Option<(&'a RetryPolicy, &'a RetryBudget)>,
    left: u32,
    /// When the current attempt started (the first one's clock read serves the pick too).
    started: Instant,
    group: usize,
    tried: Vec<usize>,
    /// The route's counters (retries and refusals are counted per route too).
    counters: &'a RouteStats,
}

impl<'a> Retry<'a> {
    /// The state of a request starting at `now`; counts it in the budget when it is retryable.
    /// Retryable: the route has a policy, the method is idempotent (or `non_idempotent` is set),
    /// there is no request body, or it was read whole first (`replayable`: a streamed body
    /// could not be sent again), and no upgrade.
    pub fn new(
        policy: Option<&'a RetryPolicy>,
        budget: Option<&'a RetryBudget>,
        head: &RequestHead,
        replayable: bool,
        now: Instant,
        counters: &'a RouteStats,
    ) -> Self {
        let policy = match (policy, budget) {
            (Some(p), Some(b))
                if p.retries > 0
                    && (p.non_idempotent || head.method().is_idempotent())
                    && (!head.has_body() || replayable)
                    && !head.upgrade =>
            {
                b.deposit(now);
                Some((p, b))
            }
            _ => None,
        };
        Retry {
            left: policy.map_or(0, |(p, _)| p.retries),
            policy,
            started: now,
            group: usize::MAX,
            tried: Vec::new(),
            counters,
        }
    }

    /// When the current attempt started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Servers of group `group` that earlier attempts of this request failed on.
    pub fn excluded(&self, group: usize) -> &[usize] {
        if group == self.group {
            &self.tried
        } else {
            &[]
        }
    }

    /// Whether a response with this status is worth asking [`Retry::allows`] about (cheap: no
    /// budget is touched).
    pub fn on_status(&self, status: u16) -> bool {
        self.left > 0 && self.policy.is_some_and(|(p, _)| p.on.status(status))
    }

    /// The client has seen part of the current attempt's answer (an interim response): nothing
    /// that happens to the request later is retried.
    pub fn commit(&mut self) {
        self.left = 0;
    }

    /// Decide whether the attempt that failed with `cause` on `server` of `group` is retried:
    /// the policy covers the cause, a retry is left and the budget has room. A granted retry is
    /// counted, spent and remembers the server; a retry refused by the budget is counted.
    pub fn allows(
        &mut self,
        cause: RetryCause,
        group: usize,
        server: usize,
        stats: &Stats,
    ) -> bool {
        let Some((p, budget)) = self.policy else {
            return false;
        };
        let covered = match cause {
            RetryCause::Connect => p.on.connect,
            RetryCause::Reset => p.on.reset,
            RetryCause::Timeout => p.on.timeout,
            RetryCause::Status(s) => p.on.status(s),
        };
        if !covered || self.left == 0 {
            return false;
        }
        let now = Instant::now();
        if !budget.try_withdraw(now) {
            stats
                .retries_budget_exhausted
                .fetch_add(1, Ordering::Relaxed);
            self.counters
                .retries_budget_exhausted
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                ?cause,
                "retry refused: the route's retry budget is exhausted"
            );
            return false;
        }
        stats.retries.fetch_add(1, Ordering::Relaxed);
        self.counters.retries.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(?cause, server, "retrying on another server");
        self.left -= 1;
        self.started = now;
        if group != self.group {
            self.group = group;
            self.tried.clear();
        }
        self.tried.push(server);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn retries_stay_within_the_share_of_requests() {
        let t0 = Instant::now();
        let b = RetryBudget::new(0.2, 0, t0);
        let mut granted = 0;
        for i in 0..50 {
            b.deposit(t0);
            // Every request fails and asks for a retry.
            if b.try_withdraw(t0) {
                granted += 1;
            }
            // Never more than 20% of the requests so far.
            assert!(
                granted * 5 <= i + 1,
                "{granted} retries after {} requests",
                i + 1
            );
        }
        assert_eq!(granted, 10);
        assert_eq!(b.window(t0), (50, 10));
    }

    #[test]
    fn the_floor_allows_retries_without_traffic() {
        let t0 = Instant::now();
        let b = RetryBudget::new(0.0, 2, t0);
        // 2 per second over a 10 s window: 20 retries, then none.
        let granted = (0..100).filter(|_| b.try_withdraw(t0)).count();
        assert_eq!(granted, 20);
    }

    #[test]
    fn the_window_slides() {
        let t0 = Instant::now();
        let b = RetryBudget::new(0.5, 0, t0);
        for _ in 0..10 {
            b.deposit(t0);
        }
        assert_eq!((0..10).filter(|_| b.try_withdraw(t0)).count(), 5);
        // 9 s later the same requests still count, the retries too.
        let t9 = t0 + Duration::from_secs(9);
        assert!(!b.try_withdraw(t9));
        // Once they left the window, nothing is allowed without new requests...
        let t10 = t0 + Duration::from_secs(10);
        assert_eq!(b.window(t10), (0, 0));
        assert!(!b.try_withdraw(t10));
        // ...and new requests earn new retries.
        b.deposit(t10);
        b.deposit(t10);
        assert!(b.try_withdraw(t10));
        assert!(!b.try_withdraw(t10));
    }

    #[test]
    fn stale_slots_restart_and_later_clock_reads_are_counted() {
        let t0 = Instant::now();
        let b = RetryBudget::new(1.0, 0, t0);
        b.deposit(t0);
        // The same slot index 10 s later holds the new second only.
        let t10 = t0 + Duration::from_secs(10);
        b.deposit(t10);
        assert_eq!(b.window(t10), (1, 0));
        // A thread that read its clock just before another's newer write still counts.
        b.deposit(t0 + Duration::from_secs(20));
        b.deposit(t10 + Duration::from_millis(999));
        assert_eq!(b.window(t0 + Duration::from_secs(20)).0, 2);
    }

    #[test]
    fn a_committed_request_is_not_retried() {
        use portico_config::RetryOn;
        let policy = RetryPolicy {
            retries: 2,
            on: RetryOn {
                connect: true,
                reset: true,
                timeout: true,
                status_502: true,
                status_503: true,
                status_504: true,
            },
            non_idempotent: false,
            budget: 1.0,
            min_per_second: 10,
        };
        let t0 = Instant::now();
        let budget = RetryBudget::new(1.0, 10, t0);
        let counters = RouteStats::default();
        let stats = Stats::default();
        let mut raw = bytes::BytesMut::from(&b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"[..]);
        let head = portico_http1::parse_request(&mut raw, &portico_http1::Limits::default())
            .unwrap()
            .unwrap();
        let mut r = Retry::new(Some(&policy), Some(&budget), &head, false, t0, &counters);
        assert!(r.on_status(503));
        assert!(r.allows(RetryCause::Reset, 0, 0, &stats));
        // An interim response reached the client: nothing after it is retried, and that is
        // not a budget refusal.
        r.commit();
        assert!(!r.on_status(503));
        for cause in [
            RetryCause::Reset,
            RetryCause::Timeout,
            RetryCause::Status(503),
        ] {
            assert!(!r.allows(cause, 0, 1, &stats));
        }
        assert_eq!(stats.retries.load(Ordering::Relaxed), 1);
        assert_eq!(stats.retries_budget_exhausted.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn concurrent_withdrawals_never_overspend() {
        let t0 = Instant::now();
        let b = std::sync::Arc::new(RetryBudget::new(0.1, 0, t0));
        for _ in 0..1000 {
            b.deposit(t0);
        }
        let granted: usize = (0..4)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || (0..100).filter(|_| b.try_withdraw(t0)).count())
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .sum();
        assert_eq!(granted, 100);
    }
}
