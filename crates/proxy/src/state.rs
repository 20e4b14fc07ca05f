//! The state requests read: a listener's state in one configuration snapshot, the bound listener it accepts on, the snapshot shared by all workers, each worker's own state, one open client connection's place (`OpenGuard`), and what the control plane publishes to the workers.

use crate::metrics::{GroupStats, RouteStats};
use crate::resilience::RouteResilience;
use crate::telemetry::access_log::AccessLogger;
use crate::telemetry::stats::Stats;
use crate::upstream::pool::Pool;
use arc_swap::ArcSwap;
use portico_config::{Config, Listener};
use portico_origin::Origin;
use portico_upstream::Upstream;
use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Notify};

/// A listener's runtime state in one configuration snapshot.
pub struct ListenerState {
    pub listener: Listener,
    /// The bound socket set ([`ListenerSlot::id`]) this listener accepts on.
    pub slot: u64,
    pub limits: portico_http1::Limits,
    /// One origin handler per route (Some for `static` and `origin` actions).
    pub origins: Vec<Option<Origin>>,
    /// TLS termination (the handshake runs in the connection's task); its configuration is
    /// replaced when watched certificate files change.
    pub tls: Option<Arc<crate::cert_watch::ListenerTls>>,
    /// Counters per route, indexed like `listener.routes`.
    pub route_stats: Vec<Arc<RouteStats>>,
    /// Retry budgets per route (shared by all workers), indexed like `listener.routes`.
    pub resilience: Vec<RouteResilience>,
    /// The filters each route runs, indexed like `listener.routes`.
    pub(crate) filters: Vec<crate::filter::Filters>,
}

/// A bound listener: its sockets outlive configuration snapshots while its name and configured
/// address stay the same, so a reload never closes a listening socket it keeps.
pub struct ListenerSlot {
    pub id: u64,
    pub name: String,
    /// The address as configured (port 0 stays 0): a changed address is a new listener.
    pub(crate) configured: SocketAddr,
    /// The address actually bound.
    pub addr: SocketAddr,
    /// HTTP/3 is served on UDP sockets of the same port, bound with this `max_udp_payload`
    /// (None: no HTTP/3). Turning HTTP/3 on or off, or changing that size, binds the listener anew.
    pub(crate) quic: Option<u16>,
    /// Open connections on this listener across all workers and snapshots.
    pub active: AtomicU32,
    /// Open connections by client address (counted only while `max_connections_per_client` is set).
    pub clients: crate::resilience::client_limit::ClientCounts,
    /// Set when the listener is removed by a reload or the process shuts down: accept loops
    /// take what is in the backlog and stop, idle connections close, busy ones finish.
    pub(crate) stop: watch::Sender<bool>,
}

/// One immutable configuration snapshot, shared by all workers. Requests run to completion on
/// the snapshot they started with; the next request on a connection sees the newest one.
pub struct Shared {
    /// 0 before the first configuration, then +1 per applied configuration.
    pub generation: u64,
    pub config: Arc<Config>,
    pub listeners: Vec<Arc<ListenerState>>,
    pub upstreams: Vec<Arc<Upstream>>,
    /// Proxy-side counters per upstream group, indexed like `upstreams`.
    pub group_stats: Vec<GroupStats>,
    /// TLS origination per upstream group, indexed like `upstreams` (None = plain HTTP).
    pub upstream_tls: Vec<Option<Arc<crate::upstream::tls::GroupTls>>>,
    pub stats: Arc<Stats>,
    pub access_log: Option<AccessLogger>,
    /// Where sampled requests' spans go (`[trace] otlp_endpoint`).
    pub tracer: Option<Arc<crate::telemetry::trace::Exporter>>,
    /// The response cache (`[cache]`), kept across reloads while its memory stays the same.
    pub cache: Option<Arc<crate::cache::Cache>>,
    /// What fleet rate limits count through (`[fleet]`), kept across reloads while it stays the same.
    pub fleet: Option<Arc<crate::resilience::fleet::Fleet>>,
    pub workers: usize,
}

impl Shared {
    /// The state of the listener accepting on `slot` in this snapshot.
    pub fn listener(&self, slot: u64) -> Option<&Arc<ListenerState>> {
        self.listeners.iter().find(|l| l.slot == slot)
    }
}

/// A worker's handle on a snapshot: cloning it is a thread-local count, unlike the `Arc` inside,
/// whose count all workers would contend for on every request.
#[derive(Clone)]
#[allow(clippy::redundant_allocation)] // the extra allocation is the point: a non-atomic count
pub struct Snapshot(Rc<Arc<Shared>>);

impl Snapshot {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Snapshot(Rc::new(shared))
    }
}

impl std::ops::Deref for Snapshot {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// State owned by one worker thread.
pub struct Worker {
    pub pool: Pool,
    /// Multiplexed HTTP/2 connections to the servers of `protocol = "h2"` groups.
    pub h2pool: crate::upstream::h2_pool::H2Pool,
    /// Connections open on this worker (drain waits for zero).
    pub open: Cell<usize>,
    pub idle_notify: Notify,
    pub(crate) published: Arc<Published>,
    /// This worker's copy of the current snapshot: `Rc` clones stay on this core, the shared
    /// `Arc`'s count is touched once per reload per worker instead of once per request.
    pub(crate) snapshot: RefCell<Snapshot>,
    /// Event-loop lag and load shedding state of this worker.
    pub load: crate::resilience::load::WorkerLoad,
}

impl Worker {
    /// The generation of the newest configuration snapshot.
    pub fn generation(&self) -> u64 {
        self.published.generation.load(Ordering::Acquire)
    }

    /// The newest configuration snapshot (one atomic load when nothing changed).
    pub fn snapshot(&self) -> Snapshot {
        let generation = self.published.generation.load(Ordering::Acquire);
        let mut cur = self.snapshot.borrow_mut();
        if cur.generation != generation {
            *cur = Snapshot(Rc::new(self.published.current.load_full()));
        }
        cur.clone()
    }
}

/// What the control plane publishes to the workers: the current snapshot and its generation
/// (workers only read them), and the testing aid's stall.
pub struct Published {
    pub(crate) current: ArcSwap<Shared>,
    pub(crate) generation: AtomicU64,
    /// Testing aid (microseconds, 0 = off), set by `Control::simulate_saturation`.
    pub(crate) stall_us: AtomicU64,
    /// A successor took the listening sockets (a binary upgrade).
    pub(crate) handed_over: std::sync::atomic::AtomicBool,
}

impl Published {
    /// The stall `Control::simulate_saturation` asks for, if any.
    pub fn simulated_stall(&self) -> Option<Duration> {
        match self.stall_us.load(Ordering::Relaxed) {
            0 => None,
            us => Some(Duration::from_micros(us)),
        }
    }
}

/// One open client connection (TCP, or QUIC for HTTP/3), counted for the listener's limits and
/// the worker's drain until dropped.
pub(crate) struct OpenGuard {
    slot: Arc<ListenerSlot>,
    worker: Rc<Worker>,
    /// The client address counted in `slot.clients`, if it was.
    client: Option<std::net::IpAddr>,
}

impl OpenGuard {
    /// The connection now counts in `slot.clients` for `ip` (released with the guard).
    pub(crate) fn counts_client(&mut self, ip: std::net::IpAddr) {
        self.client = Some(ip);
    }

    /// A connection counted in `slot.active` (and for `client` in `slot.clients`) opens.
    pub(crate) fn new(
        slot: Arc<ListenerSlot>,
        worker: Rc<Worker>,
        client: Option<std::net::IpAddr>,
    ) -> OpenGuard {
        worker.open.set(worker.open.get() + 1);
        OpenGuard {
            slot,
            worker,
            client,
        }
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.slot.active.fetch_sub(1, Ordering::AcqRel);
        if let Some(ip) = self.client {
            self.slot.clients.close(ip);
        }
        self.worker.open.set(self.worker.open.get() - 1);
        if self.worker.open.get() == 0 {
            self.worker.idle_notify.notify_waiters();
        }
    }
}
