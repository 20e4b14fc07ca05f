//! Rate limiting: a sans-io token bucket and a sharded, bounded map of buckets shared by all workers.

use crate::resilience::fleet::{Decision, FleetCounts};
use crate::resilience::hashed::Identity;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Shards of the bucket map: a worker locks one for a few hash-map operations, so workers rarely
/// meet on the same lock.
const SHARDS: usize = 64;

/// A token bucket: at most `burst` tokens, `rate` tokens added per second; a request takes one.
/// Time comes in as `now`; a `now` earlier than the last one (another thread's clock read) adds
/// nothing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenBucket {
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(burst: u32, now: Instant) -> Self {
        TokenBucket {
            tokens: f64::from(burst),
            last: now,
        }
    }

    fn refill(&mut self, now: Instant, rate: f64, burst: u32) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(f64::from(burst));
        if now > self.last {
            self.last = now;
        }
    }

    /// Take one token at `now`; `Err(wait)`: none is left, the next one comes after `wait`.
    pub fn take(&mut self, now: Instant, rate: f64, burst: u32) -> Result<(), Duration> {
        self.refill(now, rate, burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / rate))
        }
    }

    /// Whether the bucket is full again at `now`: forgetting it changes nothing.
    pub fn is_idle(&self, now: Instant, rate: f64, burst: u32) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens + elapsed * rate >= f64::from(burst)
    }
}

/// `Retry-After` for a wait: whole seconds rounded up, at least 1.
pub fn retry_after_secs(wait: Duration) -> u64 {
    let whole = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    whole.max(1)
}

type Shard = HashMap<u64, TokenBucket, BuildHasherDefault<Identity>>;

/// One route's buckets, one per key, shared by every worker of the process.
///
/// Keys are stored as 64-bit hashes under a per-limiter random SipHash key (a client cannot
/// choose keys that collide), so memory per key is constant whatever the key's length. The map
/// is split in [`SHARDS`] shards, each behind a mutex held only for one lookup (never across an
/// `.await`). At most `max_keys` keys are kept: a full shard first drops its idle buckets (full
/// again, so nothing is lost), and when all are busy the least recently used one (which then
/// starts again from a full bucket: memory stays bounded under a flood of new keys).
pub struct RateLimiter {
    rate: f64,
    burst: u32,
    per_shard: usize,
    hasher: std::collections::hash_map::RandomState,
    shards: Box<[Mutex<Shard>]>,
    /// A fleet limit's counts; the buckets above are then its fallback while Redis cannot be
    /// reached (this instance's share of the rate).
    fleet: Option<Arc<FleetCounts>>,
}

impl std::fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("rate", &self.rate)
            .field("burst", &self.burst)
            .field("keys", &self.len())
            .finish()
    }
}

impl RateLimiter {
    pub fn new(rate: f64, burst: u32, max_keys: usize) -> Self {
        RateLimiter {
            rate,
            burst: burst.max(1),
            per_shard: max_keys.div_ceil(SHARDS).max(1),
            hasher: std::collections::hash_map::RandomState::new(),
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            fleet: None,
        }
    }

    /// A fleet limit: `counts`, with local buckets of `rate` and `burst` while Redis cannot be
    /// reached.
    pub fn with_fleet(counts: Arc<FleetCounts>, rate: f64, burst: u32, max_keys: usize) -> Self {
        RateLimiter {
            fleet: Some(counts),
            ..RateLimiter::new(rate, burst, max_keys)
        }
    }

    /// A fleet limit's counts.
    pub fn fleet(&self) -> Option<&Arc<FleetCounts>> {
        self.fleet.as_ref()
    }

    /// Take one token from `key`'s bucket at `now` (`kind` separates key spaces, e.g. header
    /// values from client IPs); `Err(wait)` = over the limit, a token comes after `wait`.
    pub fn check(&self, kind: u8, key: &[u8], now: Instant) -> Result<(), Duration> {
        if let Some(f) = &self.fleet {
            match f.check(kind, key, now) {
                Decision::Counted(r) => return r,
                Decision::Local => {}
            }
        }
        let mut h = self.hasher.build_hasher();
        h.write_u8(kind);
        h.write(key);
        let hash = h.finish();
        let mut shard = self.shard(hash);
        if let Some(b) = shard.get_mut(&hash) {
            return b.take(now, self.rate, self.burst);
        }
        if shard.len() >= self.per_shard {
            self.make_room(&mut shard, now);
        }
        let mut b = TokenBucket::new(self.burst, now);
        let r = b.take(now, self.rate, self.burst);
        shard.insert(hash, b);
        r
    }

    fn shard(&self, hash: u64) -> MutexGuard<'_, Shard> {
        // The top bits pick the shard; the map inside uses the whole hash.
        let i = (hash >> 58) as usize % self.shards.len();
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    fn make_room(&self, shard: &mut Shard, now: Instant) {
        let (rate, burst) = (self.rate, self.burst);
        shard.retain(|_, b| !b.is_idle(now, rate, burst));
        if shard.len() >= self.per_shard {
            let oldest = shard.iter().min_by_key(|(_, b)| b.last).map(|(&k, _)| k);
            if let Some(k) = oldest {
                shard.remove(&k);
            }
        }
    }

    /// Keys tracked now.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_bucket_allows_its_burst_then_the_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(3, t0);
        for _ in 0..3 {
            assert_eq!(b.take(t0, 10.0, 3), Ok(()));
        }
        // Empty: the next token comes in 1/10 s.
        let wait = b.take(t0, 10.0, 3).unwrap_err();
        assert!(wait > 99 * MS && wait <= 100 * MS, "{wait:?}");
        // Half-way there, half the wait is left.
        let wait = b.take(t0 + 50 * MS, 10.0, 3).unwrap_err();
        assert!(wait > 49 * MS && wait <= 50 * MS, "{wait:?}");
        assert_eq!(b.take(t0 + 100 * MS, 10.0, 3), Ok(()));
        // Over a second at 10/s: exactly 10 more, never more than the burst at once.
        let t1 = t0 + 100 * MS;
        let allowed = (1..=1000)
            .filter(|i| b.take(t1 + MS * *i, 10.0, 3).is_ok())
            .count();
        assert_eq!(allowed, 10);
        let mut idle = TokenBucket::new(3, t0);
        assert_eq!(idle.take(t0, 10.0, 3), Ok(()));
        let later = t0 + Duration::from_secs(60);
        assert!(idle.is_idle(later, 10.0, 3));
        let granted = (0..10)
            .filter(|_| idle.take(later, 10.0, 3).is_ok())
            .count();
        assert_eq!(granted, 3, "refill stops at the burst");
    }

    #[test]
    fn an_earlier_clock_read_adds_nothing() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        let mut b = TokenBucket::new(1, t1);
        assert_eq!(b.take(t1, 1.0, 1), Ok(()));
        assert!(b.take(t0, 1.0, 1).is_err());
        assert!(b.take(t1, 1.0, 1).is_err());
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds_at_least_one() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(10 * MS), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(10)), 10);
    }

    #[test]
    fn keys_have_their_own_buckets_and_kinds_separate_key_spaces() {
        let t0 = Instant::now();
        let l = RateLimiter::new(1.0, 2, 1000);
        assert!(l.check(0, b"a", t0).is_ok());
        assert!(l.check(0, b"a", t0).is_ok());
        assert!(l.check(0, b"a", t0).is_err());
        assert!(l.check(0, b"b", t0).is_ok());
        assert!(l.check(1, b"a", t0).is_ok(), "another kind, another bucket");
        assert_eq!(l.len(), 3);
    }

    #[test]
    fn memory_is_bounded_idle_buckets_go_first() {
        let t0 = Instant::now();
        let l = RateLimiter::new(1.0, 1, SHARDS * 4);
        // A busy key: its bucket is empty.
        assert!(l.check(0, b"busy", t0).is_ok());
        // A flood of new keys never grows the map beyond its cap.
        for i in 0..10_000u32 {
            let _ = l.check(0, &i.to_be_bytes(), t0 + MS * (i + 1));
            assert!(l.len() <= SHARDS * 4);
        }
        // Ten seconds later every bucket is full again: all are idle, and the first new key of
        // a full shard clears them.
        let later = t0 + Duration::from_secs(30);
        for i in 0..SHARDS as u32 * 64 {
            assert!(l.check(1, &i.to_be_bytes(), later).is_ok());
        }
        assert!(l.len() <= SHARDS * 4);
    }

    #[test]
    fn workers_share_the_buckets_exactly() {
        let t0 = Instant::now();
        let l = std::sync::Arc::new(RateLimiter::new(1.0, 100, 1000));
        let granted: usize = (0..4)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    (0..100).filter(|_| l.check(0, b"k", t0).is_ok()).count()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .sum();
        assert_eq!(granted, 100);
    }
}
