//! Fleet rate limits: each key's requests counted in one-second windows by every instance through Redis (a thread exchanges the counts every `sync_interval`), admitted against a sliding-window estimate, with a fallback while Redis cannot be reached.

use crate::resilience::hashed::Identity;
use portico_config::{Fleet as Settings, FleetFallback};
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Shards of a limiter's key map (as for local limits).
const SHARDS: usize = 64;
/// A window's key lives this long in Redis: the current and the previous window are read.
const KEY_TTL_MS: u64 = 3_000;
/// Redis states: no exchange yet, the last one answered, the last one failed.
const UNKNOWN: u8 = 0;
const UP: u8 = 1;
const DOWN: u8 = 2;

/// One key's counts: the fleet's for the current and the previous one-second window, and what
/// this instance admitted that the fleet has not seen yet. Sans-io: time comes in as Unix ms.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Window {
    /// The Unix second the counts are for.
    window: u64,
    /// The fleet's count of the window before.
    prev: u32,
    /// The fleet's count of `window`, as Redis last said (what this instance sent included).
    cur: u32,
    /// Admitted here in `window`, not sent yet.
    local: u32,
    /// Admitted here in the window before, not sent yet (already counted in `prev`).
    local_prev: u32,
    /// Sent to Redis and not answered yet, for `sending_window`: counted until the answer.
    sending: u32,
    sending_window: u64,
    /// Sent for `window` so far (`sending` included).
    own_sent: u32,
    /// This instance's count of the window before.
    own_prev: u32,
    /// What the other instances admitted per request admitted here, in the window before;
    /// None until a window with requests here is known (then `instances - 1` is assumed).
    ratio: Option<f64>,
}

/// What one key sends in an exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Send {
    pub window: u64,
    /// Added to `window`'s count.
    pub add: u32,
    /// Added to the window before's count.
    pub add_prev: u32,
}

impl Window {
    fn roll(&mut self, w: u64) {
        if w <= self.window {
            return;
        }
        let in_flight = match self.sending_window == self.window {
            true => self.sending,
            false => 0,
        };
        if w == self.window + 1 {
            self.prev = self
                .cur
                .saturating_add(self.local)
                .saturating_add(in_flight);
            self.local_prev = self.local;
            self.own_prev = self.own_sent + self.local;
            self.learn();
        } else {
            self.prev = 0;
            self.local_prev = 0;
            self.own_prev = 0;
        }
        self.cur = 0;
        self.local = 0;
        self.own_sent = 0;
        self.window = w;
    }

    /// The fleet's requests of the last second, estimated: the window before weighted by the
    /// share of it still inside the last second, then this window's. What the other instances
    /// admitted since the last exchange is not known yet: each is taken to have admitted as
    /// many as this one (of `instances`), so that near the limit the instances together admit
    /// about what is left, not that many times over.
    fn estimate(&self, now_ms: u64, instances: u32) -> f64 {
        let f = (now_ms % 1000) as f64 / 1000.0;
        let in_flight = match self.sending_window == self.window {
            true => self.sending,
            false => 0,
        };
        let ratio = self.ratio.unwrap_or(f64::from(instances.saturating_sub(1)));
        let others = f64::from(self.local) * ratio;
        f64::from(self.prev) * (1.0 - f)
            + f64::from(self.cur)
            + f64::from(self.local)
            + f64::from(in_flight)
            + others
    }

    /// Admit one request at `now_ms` under `limit` requests per second in a fleet of
    /// `instances`; `Err(wait)`: over it, the estimate falls below the limit after `wait`.
    pub(crate) fn admit(
        &mut self,
        now_ms: u64,
        limit: f64,
        instances: u32,
    ) -> Result<(), Duration> {
        self.roll(now_ms / 1000);
        let estimate = self.estimate(now_ms, instances);
        if estimate + 1.0 <= limit {
            self.local += 1;
            return Ok(());
        }
        // The previous window's share shrinks as time passes; this window's stays, and becomes
        // the previous one's share in the next window.
        let f_now = (now_ms % 1000) as f64 / 1000.0;
        let rest = estimate - f64::from(self.prev) * (1.0 - f_now);
        let in_window = 1000 - now_ms % 1000;
        let wait_ms = if rest + 1.0 <= limit && self.prev > 0 {
            let f_needed = 1.0 - (limit - 1.0 - rest) / f64::from(self.prev);
            (((f_needed - f_now) * 1000.0).ceil() as u64).clamp(1, in_window)
        } else if rest > 0.0 {
            // Next window: rest * (1 - f) + 1 <= limit.
            let f_next = (1.0 - (limit - 1.0) / rest).clamp(0.0, 1.0);
            in_window + (f_next * 1000.0).ceil() as u64
        } else {
            in_window
        };
        Err(Duration::from_millis(wait_ms.max(1)))
    }

    /// Take what is to be sent (None: nothing to send and nothing to read: a key idle for two
    /// windows, which may go).
    pub(crate) fn take(&mut self, now_ms: u64) -> Option<Send> {
        self.roll(now_ms / 1000);
        let idle = self.local == 0 && self.local_prev == 0 && self.cur == 0 && self.prev == 0;
        if idle && self.sending == 0 {
            return None;
        }
        let s = Send {
            window: self.window,
            add: self.local,
            add_prev: self.local_prev,
        };
        self.sending = self.local;
        self.sending_window = self.window;
        self.own_sent += self.local;
        self.local = 0;
        self.local_prev = 0;
        Some(s)
    }

    /// Redis's counts after an exchange of `window`: `cur` for it and `prev` for the one before.
    pub(crate) fn answered(&mut self, window: u64, cur: u32, prev: u32) {
        if self.sending_window == window {
            self.sending = 0;
        }
        if self.window == window {
            self.cur = cur;
            // What this instance admitted meanwhile for the window before is in `prev` already.
            self.prev = prev + self.local_prev;
        } else if self.window == window + 1 {
            self.prev = cur + self.local_prev;
            self.learn();
        }
    }

    /// The others' share of the window before, per request admitted here.
    fn learn(&mut self) {
        if self.own_prev > 0 {
            let others = self.prev.saturating_sub(self.own_prev);
            self.ratio = Some(f64::from(others) / f64::from(self.own_prev));
        }
    }

    /// The exchange failed: what was being sent is lost to the fleet.
    pub(crate) fn failed(&mut self) {
        self.sending = 0;
    }

    /// Nothing counted, sent or to send.
    fn is_quiet(&self) -> bool {
        self.local == 0
            && self.local_prev == 0
            && self.cur == 0
            && self.prev == 0
            && self.sending == 0
    }
}

/// A key's counts and its name in Redis.
struct Keyed {
    /// The first 16 bytes of SHA-256 of the key (with its kind): the same on every instance,
    /// and no client can choose two keys that share it.
    id: [u8; 16],
    w: Window,
}

/// Keyed by a random-keyed hash of this process (a client cannot choose keys that collide).
type Shard = HashMap<u64, Keyed, BuildHasherDefault<Identity>>;

/// One route's fleet counts, by key.
pub struct FleetCounts {
    pub fleet: Arc<Fleet>,
    /// The route as every instance names it (listener and route names).
    route: u64,
    limit: f64,
    per_shard: usize,
    hasher: std::collections::hash_map::RandomState,
    shards: Box<[Mutex<Shard>]>,
}

impl std::fmt::Debug for FleetCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetCounts")
            .field("route", &self.route)
            .field("limit", &self.limit)
            .finish()
    }
}

/// What a fleet limit decides while Redis cannot be reached.
pub enum Decision {
    Counted(Result<(), Duration>),
    /// Use the local buckets (this instance's share of the rate).
    Local,
}

impl FleetCounts {
    /// A route's counts, registered with `fleet` for its exchanges.
    pub(crate) fn new(
        fleet: &Arc<Fleet>,
        listener: &str,
        route: &str,
        limit: f64,
        max_keys: usize,
    ) -> Arc<FleetCounts> {
        let name = format!("{listener}\n{route}");
        let c = Arc::new(FleetCounts {
            fleet: fleet.clone(),
            route: portico_config::hash::hash64(name.as_bytes()),
            limit,
            per_shard: max_keys.div_ceil(SHARDS).max(1),
            hasher: std::collections::hash_map::RandomState::new(),
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
        });
        fleet.register(&c);
        c
    }

    /// Count one request of `key` (`kind` separates key spaces) at `now`.
    pub(crate) fn check(&self, kind: u8, key: &[u8], now: Instant) -> Decision {
        if !self.fleet.is_up() {
            return match self.fleet.settings.on_redis_down {
                FleetFallback::Local => Decision::Local,
                FleetFallback::Closed => Decision::Counted(Err(Duration::from_secs(1))),
            };
        }
        let mut h = self.hasher.build_hasher();
        h.write_u8(kind);
        h.write(key);
        let hash = h.finish();
        let now_ms = self.fleet.unix_ms(now);
        let instances = self.fleet.settings.instances;
        let mut shard = self.shard(hash);
        if let Some(k) = shard.get_mut(&hash) {
            return Decision::Counted(k.w.admit(now_ms, self.limit, instances));
        }
        if shard.len() >= self.per_shard {
            // Keys with nothing to send and nothing counted recently go first; else the one
            // counted longest ago (what it had not sent yet is lost to the fleet).
            let w = now_ms / 1000;
            shard.retain(|_, k| k.w.window + 1 >= w && !k.w.is_quiet());
            if shard.len() >= self.per_shard {
                let oldest = shard
                    .iter()
                    .min_by_key(|(_, k)| k.w.window)
                    .map(|(&h, _)| h);
                if let Some(h) = oldest {
                    shard.remove(&h);
                }
            }
        }
        let digest =
            aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &[&[kind][..], key].concat());
        let mut id = [0u8; 16];
        id.copy_from_slice(&digest.as_ref()[..16]);
        let mut k = Keyed {
            id,
            w: Window::default(),
        };
        let r = k.w.admit(now_ms, self.limit, instances);
        shard.insert(hash, k);
        Decision::Counted(r)
    }

    fn shard(&self, hash: u64) -> MutexGuard<'_, Shard> {
        let i = (hash >> 58) as usize % self.shards.len();
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keys counted now.
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }
}

/// The fleet's shared state: the settings, whether Redis answers, the routes' counts, and the
/// thread that exchanges them.
pub struct Fleet {
    pub settings: Settings,
    /// [`UNKNOWN`] until the first exchange, then [`UP`] or [`DOWN`] as the last one went:
    /// fleet limits count together only while Redis is known to answer.
    state: AtomicU8,
    counts: Mutex<Vec<Weak<FleetCounts>>>,
    /// Unix time at `base`, in ms, set again by the thread (the wall clock may be stepped).
    base: Instant,
    base_unix_ms: AtomicU64,
    pub exchanges_ok: AtomicU64,
    pub exchanges_failed: AtomicU64,
}

impl Fleet {
    /// The shared state and its `portico-fleet` thread, which ends once the state is dropped.
    pub(crate) fn start(settings: &Settings) -> std::io::Result<Arc<Fleet>> {
        let fleet = Arc::new(Fleet {
            settings: settings.clone(),
            state: AtomicU8::new(UNKNOWN),
            counts: Mutex::new(Vec::new()),
            base: Instant::now(),
            base_unix_ms: AtomicU64::new(unix_ms_now()),
            exchanges_ok: AtomicU64::new(0),
            exchanges_failed: AtomicU64::new(0),
        });
        let weak = Arc::downgrade(&fleet);
        let client = redis::Client::open(settings.redis.as_str())
            .map_err(|e| std::io::Error::other(format!("redis {}: {e}", settings.redis_shown())))?;
        std::thread::Builder::new()
            .name("portico-fleet".into())
            .spawn(move || run(weak, client))?;
        Ok(fleet)
    }

    /// Whether Redis answered the last exchange.
    pub(crate) fn is_up(&self) -> bool {
        self.state.load(Ordering::Relaxed) == UP
    }

    fn register(&self, c: &Arc<FleetCounts>) {
        let mut list = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(c));
    }

    /// Keys counted now over every route.
    pub(crate) fn keys(&self) -> usize {
        self.live().iter().map(|c| c.len()).sum()
    }

    fn live(&self) -> Vec<Arc<FleetCounts>> {
        let mut list = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|w| w.strong_count() > 0);
        list.iter().filter_map(Weak::upgrade).collect()
    }

    fn unix_ms(&self, now: Instant) -> u64 {
        let since = now.saturating_duration_since(self.base).as_millis() as u64;
        self.base_unix_ms.load(Ordering::Relaxed) + since
    }

    /// Set the Unix time at `base` again from the wall clock.
    fn anchor(&self) {
        let since = self.base.elapsed().as_millis() as u64;
        self.base_unix_ms
            .store(unix_ms_now().saturating_sub(since), Ordering::Relaxed);
    }

    /// One exchange: every key's counts sent, the fleet's read back, in one pipeline.
    fn exchange(&self, con: &mut redis::Connection) -> redis::RedisResult<()> {
        let now_ms = self.unix_ms(Instant::now());
        let prefix = &self.settings.prefix;
        // (counts, key hash, what was sent)
        let mut sent: Vec<(Arc<FleetCounts>, u64, [u8; 16], Send)> = Vec::new();
        let mut pipe = redis::pipe();
        for c in self.live() {
            for shard in c.shards.iter() {
                let mut map = shard.lock().unwrap_or_else(|e| e.into_inner());
                map.retain(|&hash, k| match k.w.take(now_ms) {
                    None => false,
                    Some(s) => {
                        sent.push((c.clone(), hash, k.id, s));
                        true
                    }
                });
            }
        }
        if sent.is_empty() {
            let _: String = redis::cmd("PING").query(con)?;
            return Ok(());
        }
        for (c, _, id, s) in &sent {
            let id = format!(
                "{:016x}{:016x}",
                u64::from_be_bytes(id[..8].try_into().unwrap_or_default()),
                u64::from_be_bytes(id[8..].try_into().unwrap_or_default())
            );
            for (window, add) in [(s.window, s.add), (s.window.saturating_sub(1), s.add_prev)] {
                let key = format!("{prefix}:{:016x}:{id}:{window}", c.route);
                match add {
                    0 => pipe.cmd("GET").arg(&key),
                    n => pipe
                        .cmd("INCRBY")
                        .arg(&key)
                        .arg(n)
                        .cmd("PEXPIRE")
                        .arg(&key)
                        .arg(KEY_TTL_MS)
                        .ignore(),
                };
            }
        }
        let answers: redis::RedisResult<Vec<Option<u64>>> = pipe.query(con);
        let answers = match answers {
            Ok(a) if a.len() == sent.len() * 2 => a,
            Ok(_) => {
                self.failed(&sent);
                return Err(redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "unexpected answer count",
                )));
            }
            Err(e) => {
                self.failed(&sent);
                return Err(e);
            }
        };
        for ((c, hash, _, s), pair) in sent.iter().zip(answers.chunks(2)) {
            let count = |v: Option<u64>| u32::try_from(v.unwrap_or(0)).unwrap_or(u32::MAX);
            let mut map = c.shard(*hash);
            if let Some(k) = map.get_mut(hash) {
                k.w.answered(s.window, count(pair[0]), count(pair[1]));
            }
        }
        Ok(())
    }

    fn failed(&self, sent: &[(Arc<FleetCounts>, u64, [u8; 16], Send)]) {
        for (c, hash, _, _) in sent {
            if let Some(k) = c.shard(*hash).get_mut(hash) {
                k.w.failed();
            }
        }
    }
}

fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The `portico-fleet` thread: an exchange every `sync_interval`, a new connection after a
/// failure; ends once the fleet state is dropped.
fn run(fleet: Weak<Fleet>, client: redis::Client) {
    let mut con: Option<redis::Connection> = None;
    loop {
        let Some(f) = fleet.upgrade() else { return };
        let interval = f.settings.sync_interval;
        let started = Instant::now();
        f.anchor();
        let limit = interval.clamp(Duration::from_millis(100), Duration::from_secs(1));
        let result = match con.as_mut() {
            Some(c) => f.exchange(c),
            None => client.get_connection_with_timeout(limit).and_then(|mut c| {
                c.set_read_timeout(Some(limit))?;
                c.set_write_timeout(Some(limit))?;
                let r = f.exchange(&mut c);
                con = Some(c);
                r
            }),
        };
        match result {
            Ok(()) => {
                f.exchanges_ok.fetch_add(1, Ordering::Relaxed);
                if f.state.swap(UP, Ordering::Relaxed) == DOWN {
                    tracing::info!(
                        redis = f.settings.redis_shown(),
                        "fleet: Redis answers again: fleet rate limits are counted across the fleet"
                    );
                }
            }
            Err(e) => {
                con = None;
                f.exchanges_failed.fetch_add(1, Ordering::Relaxed);
                if f.state.swap(DOWN, Ordering::Relaxed) != DOWN {
                    let mode = match f.settings.on_redis_down {
                        FleetFallback::Local => format!(
                            "each instance limits to 1/{} of the rate on its own",
                            f.settings.instances
                        ),
                        FleetFallback::Closed => "fleet-limited requests get 429".into(),
                    };
                    tracing::error!(
                        redis = f.settings.redis_shown(),
                        "fleet: Redis cannot be reached ({e}): {mode} until it answers"
                    );
                }
            }
        }
        drop(f);
        std::thread::sleep(interval.saturating_sub(started.elapsed()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 12:00:00.000 on some day, in Unix ms.
    const T0: u64 = 1_800_000_000_000;

    #[test]
    fn one_instance_alone_admits_the_limit_per_window() {
        let mut w = Window::default();
        let admitted = (0..200)
            .filter(|i| w.admit(T0 + i * 2, 100.0, 1).is_ok())
            .count();
        assert_eq!(admitted, 100);
        // the next window: the previous one weighs in as it slides out
        let wait = w.admit(T0 + 1000, 100.0, 1).unwrap_err();
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_millis(1000),
            "{wait:?}"
        );
        // spread over the next window, the earlier one sliding out makes room as it goes: about
        // the limit again, never more
        let later = (0..100)
            .filter(|i| w.admit(T0 + 1000 + i * 10, 100.0, 1).is_ok())
            .count();
        assert!((90..=100).contains(&later), "{later}");
        // and at any moment no more than the limit over the last second, as estimated
        assert!(w.estimate(T0 + 1995, 1) <= 100.0);
    }

    #[test]
    fn the_wait_of_a_full_window_reaches_into_the_next_one() {
        let mut w = Window::default();
        for i in 0..10 {
            assert!(w.admit(T0 + i, 10.0, 1).is_ok());
        }
        let wait = w.admit(T0 + 500, 10.0, 1).unwrap_err();
        assert_eq!(wait, Duration::from_millis(600));
        assert!(w.admit(T0 + 1099, 10.0, 1).is_err());
        assert!(w.admit(T0 + 1100, 10.0, 1).is_ok());
    }

    #[test]
    fn the_fleets_counts_from_redis_count_against_the_limit() {
        let mut w = Window::default();
        assert!(w.admit(T0, 10.0, 1).is_ok());
        let s = w.take(T0 + 50).unwrap();
        assert_eq!(
            s,
            Send {
                window: T0 / 1000,
                add: 1,
                add_prev: 0
            }
        );
        // In flight: still counted.
        for _ in 0..9 {
            assert!(w.admit(T0 + 60, 10.0, 1).is_ok());
        }
        assert!(w.admit(T0 + 60, 10.0, 1).is_err());
        // Redis says the fleet (others included) counted 8 in this window: with the 9 admitted
        // since, 17 > 10.
        w.answered(T0 / 1000, 8, 0);
        assert!(w.admit(T0 + 70, 10.0, 1).is_err());
        let s = w.take(T0 + 100).unwrap();
        assert_eq!(s.add, 9);
        w.answered(T0 / 1000, 17, 0);
        assert!(w.admit(T0 + 900, 10.0, 1).is_err());
        // Two seconds later all of it slid out.
        assert!(w.admit(T0 + 2100, 10.0, 1).is_ok());
    }

    #[test]
    fn between_exchanges_the_others_are_taken_to_admit_as_many() {
        // 3 instances, 60 of 100 counted already: 40 left, this one takes a third of them
        // before the next exchange tells it what the others did.
        let mut w = Window::default();
        assert!(w.admit(T0, 100.0, 3).is_ok());
        w.take(T0 + 10).unwrap();
        w.answered(T0 / 1000, 60, 0);
        let admitted = (0..100)
            .filter(|i| w.admit(T0 + 20 + i, 100.0, 3).is_ok())
            .count();
        assert_eq!(admitted, 14);
        // the others did nothing: the next exchange says so, and this one goes on
        let s = w.take(T0 + 200).unwrap();
        w.answered(s.window, 74, 0);
        let more = (0..100)
            .filter(|i| w.admit(T0 + 210 + i, 100.0, 3).is_ok())
            .count();
        assert_eq!(more, 9);
        // The next window learns from this one: the others admitted 59 of 83, 2.46 per request
        // admitted here.
        let s = w.take(T0 + 990).unwrap();
        w.answered(s.window, 83, 0);
        assert!(w.admit(T0 + 1000, 1000.0, 3).is_ok());
        let ratio = w.ratio.unwrap();
        assert!((ratio - 59.0 / 24.0).abs() < 0.01, "{ratio}");
    }

    #[test]
    fn an_instance_that_takes_all_the_traffic_learns_it() {
        let mut w = Window::default();
        let mut admitted = 0;
        for ms in (0..3000).step_by(5) {
            admitted += usize::from(w.admit(T0 + ms, 100.0, 3).is_ok());
            if ms % 50 == 0 {
                // nobody else: Redis's count is this instance's
                if let Some(s) = w.take(T0 + ms) {
                    let cur = w.own_sent;
                    let prev = w.own_prev;
                    w.answered(s.window, cur, prev);
                }
            }
        }
        assert_eq!(w.ratio, Some(0.0));
        assert!((280..=300).contains(&admitted), "{admitted}");
    }

    #[test]
    fn counts_admitted_before_a_window_ends_go_to_that_window() {
        let mut w = Window::default();
        for _ in 0..3 {
            assert!(w.admit(T0 + 990, 100.0, 1).is_ok());
        }
        // The exchange comes after the window turned: the 3 go to the window before.
        let s = w.take(T0 + 1010).unwrap();
        assert_eq!(
            s,
            Send {
                window: T0 / 1000 + 1,
                add: 0,
                add_prev: 3
            }
        );
        w.answered(s.window, 4, 10);
        assert_eq!(w.prev, 10);
        assert_eq!(w.cur, 4);
    }

    #[test]
    fn an_answer_for_a_window_that_has_turned_becomes_the_previous_count() {
        let mut w = Window::default();
        assert!(w.admit(T0 + 900, 100.0, 1).is_ok());
        let s = w.take(T0 + 950).unwrap();
        assert!(w.admit(T0 + 1001, 100.0, 1).is_ok());
        // in flight when the window turned: counted in prev, not again in cur
        assert_eq!(w.prev, 1);
        w.answered(s.window, 30, 0);
        assert_eq!(w.prev, 30);
        assert_eq!(w.local, 1);
    }

    #[test]
    fn a_failed_exchange_forgets_what_was_in_flight_and_idle_keys_go() {
        let mut w = Window::default();
        assert!(w.admit(T0, 5.0, 1).is_ok());
        w.take(T0 + 10).unwrap();
        w.failed();
        assert_eq!(w.estimate(T0 + 20, 1), 0.0);
        assert!(
            w.take(T0 + 30).is_none(),
            "nothing counted: nothing to send or read"
        );
        let mut busy = Window::default();
        assert!(busy.admit(T0, 5.0, 1).is_ok());
        assert!(busy.take(T0 + 100).is_some());
        busy.answered(T0 / 1000, 1, 0);
        assert!(
            busy.take(T0 + 1100).is_some(),
            "the window before still counts"
        );
        assert!(
            busy.take(T0 + 3100).is_none(),
            "two windows later it is idle"
        );
    }
}
