//! Upstream groups: balancing, health, ejection and the per-server state shared by all workers.

pub mod ring;
pub mod select;
mod state;
pub mod sticky;

use portico_config::{Balance, UpstreamGroup, DEFAULT_FALL, DEFAULT_RISE};
use ring::Ring;
use select::Swrr;
use state::{Ramp, ServerState};
use std::cell::RefCell;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};
use std::time::{Duration, Instant};

pub use state::{AdminState, Health, Report, ServerStatus};

/// Internal weight units per configured unit: slow start ramps in these, so even a weight-1
/// server starts with about 1% of its share instead of all of it.
const SCALE: u64 = 100;

/// Largest weight [`Upstream::set_weight`] accepts (larger values are lowered to it).
pub const MAX_WEIGHT: u32 = 1_000_000;

thread_local! {
    /// Effective weights of the group being picked from, reused by every pick on this thread.
    static SCRATCH: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

/// State shared between an [`Upstream`] and the guards it hands out.
struct Shared {
    group: Arc<UpstreamGroup>,
    /// Per server, indexed like `group.servers`.
    servers: Box<[Arc<ServerState>]>,
    /// Told when a guard gives its slot back (set once, by whoever queues requests).
    release: OnceLock<Arc<dyn ReleaseHook>>,
}

/// Told each time a [`ServerGuard`] of a group gives its slot back, so requests waiting for a
/// slot can pick again (the proxy's bounded queue). Called on the releasing thread inside
/// `drop`: implementations must be short and never block (e.g. an atomic check, then a wake-up).
pub trait ReleaseHook: Send + Sync {
    fn released(&self);
}

/// How servers are chosen; the locks are held only for one O(n) selection, never across I/O.
enum Policy {
    RoundRobin(Mutex<Swrr>),
    /// The SWRR state breaks ties between equally loaded servers.
    LeastConnections(Mutex<Swrr>),
    TwoRandomChoices,
    /// Requests without a key fall back to round robin. The ring is rebuilt when a weight changes.
    Hash {
        ring: RwLock<Ring>,
        fallback: Mutex<Swrr>,
    },
}

/// Why [`Upstream::pick_at`] found no server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PickError {
    /// No server can take requests: every one is down, ejected, draining or disabled (or the
    /// group is empty). The caller tries the fallback group, or answers 503.
    Unavailable,
    /// Some servers are available, but every one is at `max_connections_per_server`.
    AtLimit,
}

/// One upstream group's balancer and shared per-server state. `Send + Sync`.
///
/// One exists per configured group per process and is shared by every worker thread
/// (`Arc<Upstream>`). [`Upstream::pick_at`] chooses a server with the group's balancing policy
/// among those that can take requests (health Up, not ejected, admin Enabled) and counts one
/// active request on it; the returned [`ServerGuard`] gives the count back on drop. The counts
/// are process-wide, so least connections and `max_connections_per_server` hold for the whole
/// process, not per worker. The limit check and the increment are one compare-exchange loop, so
/// concurrent pickers can never over-admit.
///
/// Nothing here reads a clock: callers pass `now` to everything time-dependent (ejection expiry,
/// slow start, rise / fall bookkeeping). The selection algorithms live in [`select`] and [`ring`].
pub struct Upstream {
    shared: Arc<Shared>,
    /// `max_connections_per_server`; 0 = unlimited.
    limit: u32,
    policy: Policy,
    /// Serializes ejection decisions, so `max_ejected_percent` holds under concurrent failures.
    eject: Mutex<()>,
    /// Sticky cookie values per server (empty without `sticky_cookie`), see [`sticky`].
    sticky_ids: Box<[String]>,
}

impl fmt::Debug for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let active: Vec<u32> = self
            .shared
            .servers
            .iter()
            .map(|s| s.active.load(Ordering::Relaxed))
            .collect();
        f.debug_struct("Upstream")
            .field("group", &self.shared.group.name)
            .field("balance", &self.shared.group.balance)
            .field("active", &active)
            .finish()
    }
}

impl Upstream {
    /// A group with every server Up, Enabled, at its configured weight, with zero counters.
    pub fn new(group: Arc<UpstreamGroup>) -> Self {
        let servers = group
            .servers
            .iter()
            .map(|s| Arc::new(ServerState::new(s.address, Ramp::Off)))
            .collect();
        Self::with_servers(group, servers)
    }

    /// The successor of `previous` after a reload: a server whose address was in `previous`
    /// keeps its state (health, admin state, weight override, ejection, counters and its count of
    /// requests in flight, which is shared with `previous` so guards from either stay exact).
    /// New servers start Up and, with slow start, ramp from the first pick. Health is reset to
    /// Up when the new group has no health check, ejections are cleared when it has no passive
    /// checks.
    pub fn new_carrying(group: Arc<UpstreamGroup>, previous: &Upstream) -> Self {
        let new_ramp = if group.passive.slow_start.is_zero() {
            Ramp::Off
        } else {
            Ramp::Pending
        };
        let servers: Box<[Arc<ServerState>]> = group
            .servers
            .iter()
            .map(|s| {
                match previous
                    .shared
                    .servers
                    .iter()
                    .find(|p| p.address == s.address)
                {
                    Some(p) => Arc::clone(p),
                    None => Arc::new(ServerState::new(s.address, new_ramp)),
                }
            })
            .collect();
        for s in servers.iter() {
            if group.health_check.is_none() {
                s.clear_health();
            }
            if group.passive.max_failures == 0 {
                s.clear_ejection();
            }
        }
        Self::with_servers(group, servers)
    }

    fn with_servers(group: Arc<UpstreamGroup>, servers: Box<[Arc<ServerState>]>) -> Self {
        let n = group.servers.len();
        let shared = Arc::new(Shared {
            group,
            servers,
            release: OnceLock::new(),
        });
        let policy = match shared.group.balance {
            Balance::RoundRobin => Policy::RoundRobin(Mutex::new(Swrr::new(n))),
            Balance::LeastConnections => Policy::LeastConnections(Mutex::new(Swrr::new(n))),
            Balance::TwoRandomChoices => Policy::TwoRandomChoices,
            Balance::HashClientIp | Balance::HashHeader(_) | Balance::HashCookie(_) => {
                Policy::Hash {
                    ring: RwLock::new(build_ring(&shared)),
                    fallback: Mutex::new(Swrr::new(n)),
                }
            }
        };
        Upstream {
            limit: shared.group.max_connections_per_server,
            sticky_ids: sticky::ids(&shared.group),
            shared,
            policy,
            eject: Mutex::new(()),
        }
    }

    pub fn group(&self) -> &Arc<UpstreamGroup> {
        &self.shared.group
    }

    /// Install the hook told about every released slot of this group (guards handed out before
    /// included); false when one is already installed. Groups without a hook pay nothing on release.
    pub fn set_release_hook(&self, hook: Arc<dyn ReleaseHook>) -> bool {
        self.shared.release.set(hook).is_ok()
    }

    /// Choose a server and count one active request on it, without a clock: like
    /// [`Upstream::pick_at`], except that ejected servers stay out until a `pick_at` after the
    /// ejection's end notices it is over, and slow start ramps count as full weight. None when no
    /// server can take the request.
    pub fn pick(&self, key: Option<&[u8]>, exclude: Option<usize>) -> Option<ServerGuard> {
        self.pick_inner(key, exclude.as_slice(), None).ok()
    }

    /// Choose a server at time `now` and count one active request on it.
    ///
    /// Only servers that are Up, not ejected (an ejection over at `now` ends here) and Enabled
    /// are candidates, with their effective (slow start) weights. `key` is the hash input for
    /// hash balancing (client IP bytes, header value or cookie value, extracted by the caller
    /// according to `group().balance`); None falls back to round robin, and other policies
    /// ignore it. A key whose server is not a candidate goes to the next candidate on the ring,
    /// and comes back when that server does. Servers at `max_connections_per_server` (if
    /// nonzero) are skipped; `exclude` (a server index, for retries) is skipped when another
    /// server can take the request.
    pub fn pick_at(
        &self,
        key: Option<&[u8]>,
        exclude: Option<usize>,
        now: Instant,
    ) -> Result<ServerGuard, PickError> {
        self.pick_inner(key, exclude.as_slice(), Some(now))
    }

    /// [`Upstream::pick_at`] skipping several servers (a retry after more than one failed
    /// attempt): the servers in `exclude` are skipped when another server can take the request;
    /// when none can, the excluded ones are candidates again.
    pub fn pick_at_excluding(
        &self,
        key: Option<&[u8]>,
        exclude: &[usize],
        now: Instant,
    ) -> Result<ServerGuard, PickError> {
        self.pick_inner(key, exclude, Some(now))
    }

    /// Current active requests on `server` (0 for an unknown index).
    pub fn active(&self, server: usize) -> u32 {
        self.shared
            .servers
            .get(server)
            .map_or(0, |s| s.active.load(Ordering::Acquire))
    }

    /// A snapshot of every server at `now`, in configuration order.
    pub fn status(&self, now: Instant) -> Vec<ServerStatus> {
        let slow_start = self.shared.group.passive.slow_start;
        self.shared
            .servers
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let weight = self.weight(i);
                let ejected = s.is_ejected(now);
                let t = s.timing();
                let available =
                    s.admin() == AdminState::Enabled && !s.down.load(Ordering::Acquire) && !ejected;
                // An ejection that is over but not yet noticed by a pick ramps from its end.
                let ramp = match t.ejected_until {
                    Some(end) if !ejected && !slow_start.is_zero() => Ramp::From(end),
                    _ => t.ramp,
                };
                let effective_weight = if available {
                    let base = u64::from(weight) * SCALE;
                    let (w, _) = ramp_weight(base, ramp, Some(now), slow_start);
                    u32::try_from(w.div_ceil(SCALE)).unwrap_or(u32::MAX)
                } else {
                    0
                };
                let last_check = t.last_check.as_ref().map(|(text, at)| {
                    let age = now.saturating_duration_since(*at);
                    format!("{text} ({}ms ago)", age.as_millis())
                });
                let state_since = t.since.map(|at| now.saturating_duration_since(at));
                drop(t);
                ServerStatus {
                    address: s.address,
                    weight,
                    effective_weight,
                    health: s.health(),
                    admin: s.admin(),
                    ejected,
                    active: s.active.load(Ordering::Acquire),
                    consecutive_failures: s.consecutive_failures.load(Ordering::Relaxed),
                    requests: s.requests.load(Ordering::Relaxed),
                    responses: std::array::from_fn(|c| s.responses[c].load(Ordering::Relaxed)),
                    failures: s.failures.load(Ordering::Relaxed),
                    bytes: s.bytes.load(Ordering::Relaxed),
                    ejections: s.ejections.load(Ordering::Relaxed),
                    health_transitions: s.health_transitions.load(Ordering::Relaxed),
                    last_check,
                    state_since,
                }
            })
            .collect()
    }

    /// [`Upstream::set_admin`], noting `now` as when the server's state changed (when it did).
    pub fn set_admin_at(&self, server: usize, state: AdminState, now: Instant) -> bool {
        let before = self.shared.servers.get(server).map(|s| s.admin());
        let done = self.set_admin(server, state);
        if done && before != Some(state) {
            if let Some(s) = self.shared.servers.get(server) {
                s.timing().since = Some(now);
            }
        }
        done
    }

    /// Set a server's admin state; false = no such server. Draining and Disabled servers get no
    /// new requests from the next pick on. Enabling a Disabled server starts slow start (if set).
    pub fn set_admin(&self, server: usize, state: AdminState) -> bool {
        let Some(s) = self.shared.servers.get(server) else {
            return false;
        };
        let before = s.set_admin(state);
        if state == AdminState::Enabled
            && before == AdminState::Disabled
            && !self.shared.group.passive.slow_start.is_zero()
        {
            s.start_ramp(None);
        }
        true
    }

    /// Override a server's weight from the next pick on (at most [`MAX_WEIGHT`]); false = no such
    /// server, or weight 0 (take a server out with [`Upstream::set_admin`] instead). Hash groups
    /// rebuild their ring: only keys on the points the server gains or loses move.
    pub fn set_weight(&self, server: usize, weight: u32) -> bool {
        let Some(s) = self.shared.servers.get(server) else {
            return false;
        };
        if weight == 0 {
            return false;
        }
        s.weight_override
            .store(weight.min(MAX_WEIGHT), Ordering::Release);
        if let Policy::Hash { ring, .. } = &self.policy {
            let rebuilt = build_ring(&self.shared);
            *ring.write().unwrap_or_else(|e| e.into_inner()) = rebuilt;
        }
        true
    }

    /// Count `n` bytes of `server`'s responses written to a client.
    pub fn add_bytes(&self, server: usize, n: u64) {
        if let Some(s) = self.shared.servers.get(server) {
            s.bytes.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Forget a weight set by [`Upstream::set_weight`]: the configured one applies again (and
    /// follows the configuration across reloads).
    pub fn clear_weight(&self, server: usize) {
        let Some(s) = self.shared.servers.get(server) else {
            return;
        };
        s.weight_override.store(0, Ordering::Release);
        if let Policy::Hash { ring, .. } = &self.policy {
            let rebuilt = build_ring(&self.shared);
            *ring.write().unwrap_or_else(|e| e.into_inner()) = rebuilt;
        }
    }

    /// The configured weight or the one set by [`Upstream::set_weight`] (0 for an unknown index).
    pub fn weight(&self, server: usize) -> u32 {
        weight_of(&self.shared, server)
    }

    /// Count one request outcome on `server` and apply passive checks: connect errors,
    /// timeouts, resets and 5xx responses in a row (`passive.max_failures`) eject the server for
    /// `passive.ejection`, doubled for each ejection that follows the end of the previous one
    /// within `passive.max_ejection` (and at most that), unless that would eject more than
    /// `passive.max_ejected_percent` of the group; then the server stays in and the next failure
    /// tries again. Any other response resets the run of failures.
    pub fn report(&self, server: usize, outcome: Report, now: Instant) {
        let Some(s) = self.shared.servers.get(server) else {
            return;
        };
        let failed = match outcome {
            Report::Response { status } => {
                let class = usize::from(status / 100).clamp(1, 5) - 1;
                s.responses[class].fetch_add(1, Ordering::Relaxed);
                status >= 500
            }
            Report::ConnectError | Report::Timeout | Report::Reset => {
                s.failures.fetch_add(1, Ordering::Relaxed);
                true
            }
        };
        if !failed {
            // No write when there is nothing to reset: the common case stays read-only.
            if s.consecutive_failures.load(Ordering::Relaxed) != 0 {
                s.consecutive_failures.store(0, Ordering::Relaxed);
            }
            return;
        }
        let run = s
            .consecutive_failures
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        let passive = &self.shared.group.passive;
        if passive.max_failures != 0 && run >= passive.max_failures {
            self.try_eject(server, run, now);
        }
    }

    fn try_eject(&self, server: usize, run: u32, now: Instant) {
        let _serial = self.eject.lock().unwrap_or_else(|e| e.into_inner());
        let servers = &self.shared.servers;
        let Some(s) = servers.get(server) else { return };
        if s.is_ejected(now) {
            // Failures of requests that were already running when it was ejected.
            return;
        }
        let passive = &self.shared.group.passive;
        let others = servers
            .iter()
            .enumerate()
            .filter(|(j, o)| *j != server && o.is_ejected(now))
            .count();
        let allowed = servers.len() * passive.max_ejected_percent as usize;
        if (others + 1) * 100 > allowed {
            if run == passive.max_failures {
                // Once per run of failures, not per failure after it; at debug, as a client
                // can cause such runs at will (a 5xx it provokes, then one good request).
                tracing::debug!(
                    group = %self.shared.group.name,
                    server = %s.address,
                    "passive checks: {} failures in a row, but ejecting it would take more than max_ejected_percent ({}%) of the group out: kept in",
                    passive.max_failures,
                    passive.max_ejected_percent
                );
            }
            return;
        }
        let mut t = s.timing();
        if let Some(end) = t.ejected_until.take() {
            // An ejection that ended without a pick noticing it.
            t.last_ejection_end = Some(end);
        }
        let repeat = t
            .last_ejection_end
            .is_some_and(|end| now.saturating_duration_since(end) < passive.max_ejection);
        t.streak = if repeat { (t.streak + 1).min(31) } else { 0 };
        let time = passive
            .ejection
            .saturating_mul(1 << t.streak)
            .min(passive.max_ejection);
        t.ejected_until = Some(now.checked_add(time).unwrap_or(now));
        t.since = Some(now);
        s.ejected.store(true, Ordering::Release);
        drop(t);
        tracing::warn!(
            group = %self.shared.group.name,
            server = %s.address,
            "passive checks: {run} failures in a row (connect errors, timeouts, resets or 5xx): ejected for {time:?}"
        );
        s.ejections.fetch_add(1, Ordering::Relaxed);
        s.consecutive_failures.store(0, Ordering::Relaxed);
    }

    /// Record one active probe of `server`: `fall` failures in a row mark an Up server Down,
    /// `rise` successes in a row bring a Down server back Up (and start slow start, if set).
    /// `detail` (e.g. "HTTP 200", "connect: refused") is kept for [`ServerStatus::last_check`].
    pub fn probe_result(&self, server: usize, ok: bool, detail: String, now: Instant) {
        let Some(s) = self.shared.servers.get(server) else {
            return;
        };
        let group = &self.shared.group;
        let (rise, fall) = group
            .health_check
            .as_ref()
            .map_or((DEFAULT_RISE, DEFAULT_FALL), |h| (h.rise, h.fall));
        let mut t = s.timing();
        t.last_check = Some((
            if ok {
                format!("passed: {detail}")
            } else {
                format!("failed: {detail}")
            },
            now,
        ));
        let down = s.down.load(Ordering::Acquire);
        // Up (true) or down (false), logged once the timing lock is released.
        let mut changed = None;
        if ok {
            t.probe_failures = 0;
            if down {
                t.probe_passes = t.probe_passes.saturating_add(1);
                if t.probe_passes >= rise {
                    t.probe_passes = 0;
                    if !group.passive.slow_start.is_zero() {
                        t.ramp = Ramp::From(now);
                        s.ramping.store(true, Ordering::Release);
                    }
                    s.down.store(false, Ordering::Release);
                    s.health_transitions.fetch_add(1, Ordering::Relaxed);
                    changed = Some(true);
                    t.since = Some(now);
                }
            }
        } else {
            t.probe_passes = 0;
            if !down {
                t.probe_failures = t.probe_failures.saturating_add(1);
                if t.probe_failures >= fall {
                    t.probe_failures = 0;
                    s.down.store(true, Ordering::Release);
                    s.health_transitions.fetch_add(1, Ordering::Relaxed);
                    changed = Some(false);
                    t.since = Some(now);
                }
            }
        }
        drop(t);
        match changed {
            Some(true) => tracing::info!(
                group = %group.name,
                server = %s.address,
                "server up: health check passed {rise} time(s) in a row ({detail})"
            ),
            Some(false) => tracing::warn!(
                group = %group.name,
                server = %s.address,
                "server down: health check failed {fall} time(s) in a row, last: {detail}"
            ),
            None => {}
        }
    }

    fn pick_inner(
        &self,
        key: Option<&[u8]>,
        exclude: &[usize],
        now: Option<Instant>,
    ) -> Result<ServerGuard, PickError> {
        if let [only] = &self.shared.servers[..] {
            return self.pick_only(only, now);
        }
        SCRATCH
            .try_with(|cell| match cell.try_borrow_mut() {
                Ok(mut weights) => self.pick_with(key, exclude, now, &mut weights),
                Err(_) => self.pick_with(key, exclude, now, &mut Vec::new()),
            })
            .unwrap_or_else(|_| self.pick_with(key, exclude, now, &mut Vec::new()))
    }

    fn pick_with(
        &self,
        key: Option<&[u8]>,
        exclude: &[usize],
        now: Option<Instant>,
        weights: &mut Vec<u32>,
    ) -> Result<ServerGuard, PickError> {
        self.effective_weights(now, weights);
        if let Some(guard) = self.pick_excluding(key, exclude, weights) {
            return Ok(guard);
        }
        if exclude.iter().any(|&x| x < weights.len()) {
            if let Some(guard) = self.pick_excluding(key, &[], weights) {
                return Ok(guard);
            }
        }
        if weights.iter().any(|&w| w > 0) {
            Err(PickError::AtLimit)
        } else {
            Err(PickError::Unavailable)
        }
    }

    /// A group of one server: there is nothing to choose, so no weights, policy or exclusions
    /// (an excluded server is a candidate again when no other can take the request); the same
    /// answer as the general path, for less work per request.
    fn pick_only(&self, s: &ServerState, now: Option<Instant>) -> Result<ServerGuard, PickError> {
        if self.weight_at(0, s, now).is_none() {
            return Err(PickError::Unavailable);
        }
        if !self.try_acquire(0) {
            return Err(PickError::AtLimit);
        }
        s.requests.fetch_add(1, Ordering::Relaxed);
        Ok(self.guard(0))
    }

    /// Per server, the weight picks use (in `SCALE` units): 0 for servers that cannot be picked.
    fn effective_weights(&self, now: Option<Instant>, out: &mut Vec<u32>) {
        out.clear();
        for (i, s) in self.shared.servers.iter().enumerate() {
            let w = self
                .weight_at(i, s, now)
                .map_or(0, |w| u32::try_from(w).unwrap_or(u32::MAX).max(1));
            out.push(w);
        }
    }

    /// Server `i`'s weight at `now` (in `SCALE` units, slow start applied and its ramp moved on);
    /// None when it cannot be picked (disabled, down or ejected; an ejection over ends here).
    fn weight_at(&self, i: usize, s: &ServerState, now: Option<Instant>) -> Option<u64> {
        let slow_start = self.shared.group.passive.slow_start;
        let available = s.admin() == AdminState::Enabled
            && !s.down.load(Ordering::Acquire)
            && !s.check_ejection(now, slow_start, &self.shared.group.name);
        if !available {
            return None;
        }
        let base = u64::from(weight_of(&self.shared, i)) * SCALE;
        if !s.ramping.load(Ordering::Acquire) {
            return Some(base);
        }
        let mut t = s.timing();
        let (w, ramp) = ramp_weight(base, t.ramp, now, slow_start);
        if now.is_some() {
            t.ramp = ramp;
            if ramp == Ramp::Off {
                s.ramping.store(false, Ordering::Release);
            }
        }
        Some(w)
    }

    fn pick_excluding(
        &self,
        key: Option<&[u8]>,
        exclude: &[usize],
        weights: &[u32],
    ) -> Option<ServerGuard> {
        let load = |i: usize| self.active(i);
        match &self.policy {
            Policy::RoundRobin(state) => {
                let mut st = lock(state);
                self.acquire_with(exclude, weights, |eligible| st.next(weights, eligible))
            }
            Policy::LeastConnections(state) => {
                // The lock is held across the increment too, so concurrent pickers see each
                // other's choices and do not all pile onto the same idle server.
                let mut st = lock(state);
                self.acquire_with(exclude, weights, |eligible| {
                    select::least_connections(weights, load, eligible, &mut st)
                })
            }
            Policy::TwoRandomChoices => {
                let mut rng = fastrand::Rng::new();
                self.acquire_with(exclude, weights, |eligible| {
                    select::two_random_choices(weights, load, eligible, &mut rng)
                })
            }
            Policy::Hash { ring, fallback } => match key {
                Some(key) => {
                    let ring = ring.read().unwrap_or_else(|e| e.into_inner());
                    self.acquire_with(exclude, weights, |eligible| ring.lookup(key, eligible))
                }
                None => {
                    let mut st = lock(fallback);
                    self.acquire_with(exclude, weights, |eligible| st.next(weights, eligible))
                }
            },
        }
    }

    /// Run `select` with an eligibility predicate (a candidate, not excluded, below the limit,
    /// not already lost to a race) and claim a slot on its answer; when another thread took the
    /// last slot in between, that server becomes ineligible and selection runs again (at most
    /// once per server).
    fn acquire_with(
        &self,
        exclude: &[usize],
        weights: &[u32],
        mut select: impl FnMut(&dyn Fn(usize) -> bool) -> Option<usize>,
    ) -> Option<ServerGuard> {
        let mut lost: Vec<usize> = Vec::new();
        while lost.len() <= weights.len() {
            let eligible = |i: usize| {
                weights.get(i).is_some_and(|&w| w > 0)
                    && !exclude.contains(&i)
                    && self.has_room(i)
                    && !lost.contains(&i)
            };
            let i = select(&eligible)?;
            if self.try_acquire(i) {
                if let Some(s) = self.shared.servers.get(i) {
                    s.requests.fetch_add(1, Ordering::Relaxed);
                }
                return Some(self.guard(i));
            }
            lost.push(i);
        }
        None
    }

    /// The guard of a slot just acquired on `server`.
    fn guard(&self, server: usize) -> ServerGuard {
        ServerGuard {
            shared: Arc::clone(&self.shared),
            index: server,
        }
    }

    fn has_room(&self, server: usize) -> bool {
        self.shared
            .servers
            .get(server)
            .is_some_and(|s| self.limit == 0 || s.active.load(Ordering::Acquire) < self.limit)
    }

    /// Increment `server`'s count unless it is at the limit; race-free.
    fn try_acquire(&self, server: usize) -> bool {
        let Some(s) = self.shared.servers.get(server) else {
            return false;
        };
        let counter = &s.active;
        let mut cur = counter.load(Ordering::Acquire);
        loop {
            if self.limit != 0 && cur >= self.limit {
                return false;
            }
            let Some(next) = cur.checked_add(1) else {
                return false;
            };
            match counter.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }
}

/// The configured weight, or the override (0 for an unknown index).
fn weight_of(shared: &Shared, server: usize) -> u32 {
    let Some(s) = shared.servers.get(server) else {
        return 0;
    };
    match s.weight_override.load(Ordering::Acquire) {
        0 => shared
            .group
            .servers
            .get(server)
            .map_or(1, |c| c.weight.max(1)),
        w => w,
    }
}

/// The ring of a hash group with the current weights.
fn build_ring(shared: &Shared) -> Ring {
    let ids: Vec<(String, u32)> = shared
        .servers
        .iter()
        .enumerate()
        .map(|(i, s)| (s.address.to_string(), weight_of(shared, i)))
        .collect();
    Ring::new(&ids)
}

/// The slow start weight at `now` for a server of full weight `base`, and the ramp to keep:
/// linear from 1 to `base` over `slow_start`. Without `now`, full weight (the ramp unchanged).
fn ramp_weight(base: u64, ramp: Ramp, now: Option<Instant>, slow_start: Duration) -> (u64, Ramp) {
    if slow_start.is_zero() {
        return (base, Ramp::Off);
    }
    let Some(now) = now else { return (base, ramp) };
    let from = match ramp {
        Ramp::Off => return (base, Ramp::Off),
        Ramp::Pending => now,
        Ramp::From(at) => at,
    };
    let elapsed = now.saturating_duration_since(from);
    if elapsed >= slow_start {
        return (base, Ramp::Off);
    }
    let grown = u128::from(base.saturating_sub(1)) * elapsed.as_nanos() / slow_start.as_nanos();
    let w = 1 + u64::try_from(grown).unwrap_or(u64::MAX);
    (w.min(base), Ramp::From(from))
}

/// Lock a selection state; a poisoned lock (a panic elsewhere while held) still holds a valid
/// state, so it is used as is rather than propagating the panic.
fn lock(m: &Mutex<Swrr>) -> MutexGuard<'_, Swrr> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One active request on one server; dropping it gives the slot back.
pub struct ServerGuard {
    shared: Arc<Shared>,
    index: usize,
}

impl ServerGuard {
    /// Index of the server in the group's `servers`.
    pub fn index(&self) -> usize {
        self.index
    }

    pub fn address(&self) -> SocketAddr {
        // `index` always comes from a successful acquire on this group, so it is in range; the
        // fallback only keeps this total.
        self.shared
            .servers
            .get(self.index)
            .map_or(SocketAddr::from(([0, 0, 0, 0], 0)), |s| s.address)
    }
}

impl fmt::Debug for ServerGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerGuard")
            .field("index", &self.index)
            .field("address", &self.address())
            .finish()
    }
}

impl Drop for ServerGuard {
    fn drop(&mut self) {
        if let Some(s) = self.shared.servers.get(self.index) {
            // Never below zero: only guards decrement, and each guard holds one increment.
            let _ = s
                .active
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_sub(1));
        }
        if let Some(hook) = self.shared.release.get() {
            hook.released();
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod health_tests;
