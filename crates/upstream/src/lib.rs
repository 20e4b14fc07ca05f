//! Upstream groups: balancing and the per-server active-request counts shared by all workers.

pub mod hash;
pub mod ring;
pub mod select;

use portico_config::{Balance, UpstreamGroup};
use ring::Ring;
use select::Swrr;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// State shared between an [`Upstream`] and the guards it hands out.
struct Shared {
    group: Arc<UpstreamGroup>,
    /// Active requests per server, indexed like `group.servers`.
    active: Box<[AtomicU32]>,
}

/// How servers are chosen; the mutexes are held only for one O(n) selection, never across I/O.
enum Policy {
    RoundRobin(Mutex<Swrr>),
    /// The SWRR state breaks ties between equally loaded servers.
    LeastConnections(Mutex<Swrr>),
    TwoRandomChoices,
    /// Requests without a key fall back to round robin.
    Hash {
        ring: Ring,
        fallback: Mutex<Swrr>,
    },
}

/// One upstream group's balancer and shared per-server state. `Send + Sync`.
///
/// One exists per configured group per process and is shared by every worker thread
/// (`Arc<Upstream>`). [`Upstream::pick`] chooses a server with the group's balancing policy and
/// counts one active request on it; the returned [`ServerGuard`] gives the count back on drop.
/// The counts are process-wide, so least connections and `max_connections_per_server` hold for
/// the whole process, not per worker. The limit check and the increment are one compare-exchange
/// loop, so concurrent pickers can never over-admit. The selection algorithms themselves are
/// sans-io and live in [`select`] and [`ring`].
pub struct Upstream {
    shared: Arc<Shared>,
    weights: Box<[u32]>,
    /// `max_connections_per_server`; 0 = unlimited.
    limit: u32,
    policy: Policy,
}

impl fmt::Debug for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let active: Vec<u32> = self
            .shared
            .active
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .collect();
        f.debug_struct("Upstream")
            .field("group", &self.shared.group.name)
            .field("balance", &self.shared.group.balance)
            .field("active", &active)
            .finish()
    }
}

impl Upstream {
    pub fn new(group: Arc<UpstreamGroup>) -> Self {
        let n = group.servers.len();
        let weights: Box<[u32]> = group.servers.iter().map(|s| s.weight.max(1)).collect();
        let policy = match group.balance {
            Balance::RoundRobin => Policy::RoundRobin(Mutex::new(Swrr::new(n))),
            Balance::LeastConnections => Policy::LeastConnections(Mutex::new(Swrr::new(n))),
            Balance::TwoRandomChoices => Policy::TwoRandomChoices,
            Balance::HashClientIp | Balance::HashHeader(_) | Balance::HashCookie(_) => {
                let ids: Vec<(String, u32)> = group
                    .servers
                    .iter()
                    .map(|s| (s.address.to_string(), s.weight.max(1)))
                    .collect();
                Policy::Hash {
                    ring: Ring::new(&ids),
                    fallback: Mutex::new(Swrr::new(n)),
                }
            }
        };
        let active = (0..n).map(|_| AtomicU32::new(0)).collect();
        Upstream {
            limit: group.max_connections_per_server,
            shared: Arc::new(Shared { group, active }),
            weights,
            policy,
        }
    }

    pub fn group(&self) -> &Arc<UpstreamGroup> {
        &self.shared.group
    }

    /// Choose a server and count one active request on it.
    ///
    /// `key` is the hash input for hash balancing (client IP bytes, header value or cookie value,
    /// extracted by the caller according to `group().balance`); None falls back to round robin,
    /// and other policies ignore it. Servers at `max_connections_per_server` (if nonzero) are
    /// skipped; `exclude` (a server index, for retries) is skipped when another server can take
    /// the request. None when no server can take it (the caller answers 503).
    pub fn pick(&self, key: Option<&[u8]>, exclude: Option<usize>) -> Option<ServerGuard> {
        if let Some(guard) = self.pick_excluding(key, exclude) {
            return Some(guard);
        }
        match exclude {
            Some(x) if x < self.weights.len() => self.pick_excluding(key, None),
            _ => None,
        }
    }

    /// Current active requests on `server` (0 for an unknown index).
    pub fn active(&self, server: usize) -> u32 {
        self.shared
            .active
            .get(server)
            .map_or(0, |a| a.load(Ordering::Acquire))
    }

    fn pick_excluding(&self, key: Option<&[u8]>, exclude: Option<usize>) -> Option<ServerGuard> {
        let weights = &self.weights[..];
        let load = |i: usize| self.active(i);
        match &self.policy {
            Policy::RoundRobin(state) => {
                let mut st = lock(state);
                self.acquire_with(exclude, |eligible| st.next(weights, eligible))
            }
            Policy::LeastConnections(state) => {
                // The lock is held across the increment too, so concurrent pickers see each
                // other's choices and do not all pile onto the same idle server.
                let mut st = lock(state);
                self.acquire_with(exclude, |eligible| {
                    select::least_connections(weights, load, eligible, &mut st)
                })
            }
            Policy::TwoRandomChoices => {
                let mut rng = fastrand::Rng::new();
                self.acquire_with(exclude, |eligible| {
                    select::two_random_choices(weights, load, eligible, &mut rng)
                })
            }
            Policy::Hash { ring, fallback } => match key {
                Some(key) => self.acquire_with(exclude, |eligible| ring.lookup(key, eligible)),
                None => {
                    let mut st = lock(fallback);
                    self.acquire_with(exclude, |eligible| st.next(weights, eligible))
                }
            },
        }
    }

    /// Run `select` with an eligibility predicate (not excluded, below the limit, not already
    /// lost to a race) and claim a slot on its answer; when another thread took the last slot in
    /// between, that server becomes ineligible and selection runs again (at most once per server).
    fn acquire_with(
        &self,
        exclude: Option<usize>,
        mut select: impl FnMut(&dyn Fn(usize) -> bool) -> Option<usize>,
    ) -> Option<ServerGuard> {
        let mut lost: Vec<usize> = Vec::new();
        while lost.len() <= self.weights.len() {
            let eligible = |i: usize| Some(i) != exclude && self.has_room(i) && !lost.contains(&i);
            let i = select(&eligible)?;
            if self.try_acquire(i) {
                return Some(ServerGuard {
                    shared: Arc::clone(&self.shared),
                    index: i,
                });
            }
            lost.push(i);
        }
        None
    }

    fn has_room(&self, server: usize) -> bool {
        self.shared
            .active
            .get(server)
            .is_some_and(|a| self.limit == 0 || a.load(Ordering::Acquire) < self.limit)
    }

    /// Increment `server`'s count unless it is at the limit; race-free.
    fn try_acquire(&self, server: usize) -> bool {
        let Some(counter) = self.shared.active.get(server) else {
            return false;
        };
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
            .group
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
        if let Some(counter) = self.shared.active.get(self.index) {
            // Never below zero: only guards decrement, and each guard holds one increment.
            let _ = counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_sub(1));
        }
    }
}

#[cfg(test)]
mod tests;
