//! Process start-up and reload: bind listeners, one single-threaded runtime per worker, configuration snapshots swapped atomically, drain on shutdown.

use crate::access_log::AccessLogger;
use crate::admin::AdminServer;
use crate::conn;
use crate::health::{HealthChecker, ProbeTarget};
use crate::metrics::{GroupStats, Histogram, RouteStats};
use crate::pool::Pool;
use crate::resilience::RouteResilience;
use crate::stats::Stats;
use crate::stream::ClientStream;
use arc_swap::ArcSwap;
use portico_config::{Action, Config, Listener};
use portico_origin::Origin;
use portico_upstream::Upstream;
use socket2::{Domain, Protocol, Socket, Type};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch, Notify};

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
}

/// A bound listener: its sockets outlive configuration snapshots while its name and configured
/// address stay the same, so a reload never closes a listening socket it keeps.
pub struct ListenerSlot {
    pub id: u64,
    pub name: String,
    /// The address as configured (port 0 stays 0): a changed address is a new listener.
    configured: SocketAddr,
    /// The address actually bound.
    pub addr: SocketAddr,
    /// Open connections on this listener across all workers and snapshots.
    pub active: AtomicU32,
    /// Open connections by client address (counted only while `max_connections_per_client` is set).
    pub clients: crate::client_limit::ClientCounts,
    /// Set when the listener is removed by a reload or the process shuts down: accept loops
    /// take what is in the backlog and stop, idle connections close, busy ones finish.
    stop: watch::Sender<bool>,
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
    pub upstream_tls: Vec<Option<Arc<crate::upstream_tls::GroupTls>>>,
    pub stats: Arc<Stats>,
    pub access_log: Option<AccessLogger>,
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
    pub h2pool: crate::upstream_h2_pool::H2Pool,
    /// Connections open on this worker (drain waits for zero).
    pub open: Cell<usize>,
    pub idle_notify: Notify,
    control: Arc<Control>,
    /// This worker's copy of the current snapshot: `Rc` clones stay on this core, the shared
    /// `Arc`'s count is touched once per reload per worker instead of once per request.
    snapshot: RefCell<Snapshot>,
    /// Event-loop lag and load shedding state of this worker.
    pub load: crate::load::WorkerLoad,
}

impl Worker {
    /// The generation of the newest configuration snapshot.
    pub fn generation(&self) -> u64 {
        self.control.generation.load(Ordering::Acquire)
    }

    /// The process's control plane.
    pub fn control(&self) -> &Arc<Control> {
        &self.control
    }

    /// The newest configuration snapshot (one atomic load when nothing changed).
    pub fn snapshot(&self) -> Snapshot {
        let generation = self.control.generation.load(Ordering::Acquire);
        let mut cur = self.snapshot.borrow_mut();
        if cur.generation != generation {
            *cur = Snapshot(Rc::new(self.control.current.load_full()));
        }
        cur.clone()
    }
}

/// Failure to start or to apply a new configuration (a reload that fails changes nothing).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr} (listener {name}): {source}")]
    Bind {
        name: String,
        addr: SocketAddr,
        source: io::Error,
    },
    #[error("cannot open access log {path}: {source}")]
    AccessLog { path: String, source: io::Error },
    #[error("cannot start worker thread: {0}")]
    Thread(io::Error),
    #[error("listener {name}: TLS: {source}")]
    Tls {
        name: String,
        source: portico_tls::TlsError,
    },
    #[error("upstream {name}: TLS: {source}")]
    UpstreamTls {
        name: String,
        source: portico_tls::TlsError,
    },
    #[error("shutting down")]
    ShuttingDown,
}

/// Why a reload was refused (the running configuration stays).
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The configuration source failed: file unreadable or invalid (the message names the file,
    /// line, column and key).
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Apply(#[from] StartError),
    #[error("this process has no configuration source to reload from")]
    NoSource,
}

/// Where `reload` reads the configuration from (the CLI reads the `--config` file).
pub type ConfigSource = Box<dyn Fn() -> Result<Config, String> + Send + Sync>;

/// What a reload changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadSummary {
    pub generation: u64,
    /// Listener names: newly bound, closed, and kept with their sockets.
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub kept: Vec<String>,
}

/// A group's TLS origination as a reload may keep it: (settings id, file stamps, state).
type KeptGroupTls = (
    u64,
    Vec<crate::cert_watch::Stamp>,
    Arc<crate::upstream_tls::GroupTls>,
);

enum Cmd {
    /// Start accepting on this worker's socket of a new listener.
    Listen(Arc<ListenerSlot>, std::net::TcpListener),
}

/// The process-wide control plane: the current snapshot, the bound listeners, the workers'
/// command channels. Reloads and admin changes go through it; workers only read.
pub struct Control {
    current: ArcSwap<Shared>,
    generation: AtomicU64,
    pub stats: Arc<Stats>,
    /// Idle upstream connections over all workers' pools.
    pub idle_upstream: Arc<AtomicI64>,
    pub workers: usize,
    pub started: Instant,
    inner: Mutex<Inner>,
    source: Mutex<Option<ConfigSource>>,
    /// Tells worker threads to drain and exit.
    shutdown: watch::Sender<bool>,
    /// Testing aid (microseconds, 0 = off), see [`Control::simulate_saturation`].
    stall_us: AtomicU64,
}

struct Inner {
    slots: Vec<Arc<ListenerSlot>>,
    /// Counters carried across reloads: by (listener, route) name and by group name.
    route_stats: HashMap<(String, String), Arc<RouteStats>>,
    no_server: HashMap<String, Arc<AtomicU64>>,
    header_time: HashMap<(String, SocketAddr), Arc<Histogram>>,
    /// Group queues (waiting requests and their counters), by group name.
    queues: HashMap<String, Arc<crate::queue::GroupQueue>>,
    next_slot: u64,
    senders: Vec<mpsc::UnboundedSender<Cmd>>,
    shutting_down: bool,
    /// Present while a group has a health check (one probe per server for the process).
    health: Option<HealthChecker>,
    /// TLS session resumption state (ticket key rotator, session cache) per listener name.
    resumption: HashMap<String, portico_tls::Resumption>,
    /// TLS origination per upstream group name, with the pool id of its settings and the stamps
    /// of its files (kept by a reload only while both stay the same).
    upstream_tls: HashMap<String, KeptGroupTls>,
}

impl Control {
    /// The current configuration snapshot.
    pub fn snapshot(&self) -> Arc<Shared> {
        self.current.load_full()
    }

    /// The current state of the upstream group with this name.
    pub fn upstream(&self, name: &str) -> Option<Arc<Upstream>> {
        let shared = self.current.load();
        shared
            .upstreams
            .iter()
            .find(|u| u.group().name == name)
            .cloned()
    }

    /// Bound listeners: (name, address).
    pub fn addrs(&self) -> Vec<(String, SocketAddr)> {
        self.lock()
            .slots
            .iter()
            .map(|s| (s.name.clone(), s.addr))
            .collect()
    }

    /// Open connections on the listener named `name`.
    pub fn listener_connections(&self, name: &str) -> u32 {
        self.lock()
            .slots
            .iter()
            .find(|s| s.name == name)
            .map_or(0, |s| s.active.load(Ordering::Relaxed))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Validate-and-swap: build everything the new configuration needs (sockets, TLS, upstream
    /// state carried over by group name and server address, access log) and only then publish
    /// it. Any failure leaves the running configuration untouched.
    pub fn apply(&self, config: Config) -> Result<ReloadSummary, StartError> {
        let mut inner = self.lock();
        if inner.shutting_down {
            return Err(StartError::ShuttingDown);
        }
        let old = self.current.load_full();
        if old.generation > 0 && old.config.admin != config.admin {
            tracing::warn!("admin listener settings change only on restart; the admin listener keeps its address and token");
        }
        let access_log = match &config.access_log {
            Some(al) => Some(AccessLogger::open(al).map_err(|source| {
                StartError::AccessLog {
                    path: al
                        .path
                        .as_ref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_else(|| "stdout".into()),
                    source,
                }
            })?),
            None => None,
        };

        // Listeners: keep the sockets of those with the same name and configured address.
        let mut slots: Vec<Arc<ListenerSlot>> = Vec::new();
        let mut fresh: Vec<(Arc<ListenerSlot>, Vec<std::net::TcpListener>)> = Vec::new();
        let mut next_slot = inner.next_slot;
        for l in &config.listeners {
            let kept = inner
                .slots
                .iter()
                .find(|s| s.name == l.name && s.configured == l.address);
            if let Some(s) = kept {
                slots.push(s.clone());
                continue;
            }
            let err = |source| StartError::Bind {
                name: l.name.clone(),
                addr: l.address,
                source,
            };
            let first = bind(l.address).map_err(err)?;
            let actual = first.local_addr().map_err(err)?;
            let mut sockets = vec![first];
            for _ in 1..self.workers {
                sockets.push(bind(actual).map_err(err)?);
            }
            next_slot += 1;
            let slot = Arc::new(ListenerSlot {
                id: next_slot,
                name: l.name.clone(),
                configured: l.address,
                addr: actual,
                active: AtomicU32::new(0),
                clients: Default::default(),
                stop: watch::channel(false).0,
            });
            slots.push(slot.clone());
            fresh.push((slot, sockets));
        }
        let mut route_stats = HashMap::new();
        let mut resumption_kept = HashMap::new();
        let mut listeners = Vec::new();
        for (l, slot) in config.listeners.iter().zip(&slots) {
            let counters: Vec<Arc<RouteStats>> = l
                .routes
                .iter()
                .map(|r| {
                    let key = (l.name.clone(), r.name.clone());
                    let stats = inner.route_stats.get(&key).cloned().unwrap_or_default();
                    route_stats.insert(key, stats.clone());
                    stats
                })
                .collect();
            let tls = match &l.tls {
                Some(t) => {
                    // Ticket keys and the session cache stay with the listener's name, so
                    // clients resume across reloads (and certificate changes).
                    let resumption = inner
                        .resumption
                        .get(&l.name)
                        .cloned()
                        .unwrap_or_else(portico_tls::Resumption::new);
                    resumption_kept.insert(l.name.clone(), resumption.clone());
                    let tls = crate::cert_watch::ListenerTls::new(
                        &l.name,
                        t,
                        resumption,
                        l.http2.enabled,
                    )
                    .map_err(|source| StartError::Tls {
                        name: l.name.clone(),
                        source,
                    })?;
                    Some(Arc::new(tls))
                }
                None => None,
            };
            let previous = old.listeners.iter().find(|p| p.listener.name == l.name);
            let resilience = crate::resilience::for_listener(l, previous.map(|p| &**p));
            listeners.push(Arc::new(listener_state(
                l, slot.id, tls, counters, resilience,
            )));
        }
        let upstreams: Vec<Arc<Upstream>> = config
            .upstreams
            .iter()
            .map(|g| {
                // Health, admin state, weights and counters of servers that stay are carried.
                match old.upstreams.iter().find(|u| u.group().name == g.name) {
                    Some(prev) => Arc::new(Upstream::new_carrying(g.clone(), prev)),
                    None => Arc::new(Upstream::new(g.clone())),
                }
            })
            .collect();
        let mut tls_kept = HashMap::new();
        let mut upstream_tls = Vec::new();
        for g in &config.upstreams {
            let Some(t) = &g.tls else {
                upstream_tls.push(None);
                continue;
            };
            // The protocol is part of the identity: it sets the ALPN offered.
            let h2 = g.protocol == portico_config::UpstreamProtocol::H2;
            let id = crate::upstream_tls::settings_id(t) ^ u64::from(h2);
            let files = crate::cert_watch::stamps(&crate::upstream_tls::files(t));
            let tls = match inner.upstream_tls.get(&g.name) {
                // Same settings and unchanged files: the same rustls configuration, so its
                // sessions keep resuming (rustls resumes a session only under the verifier and
                // client certificate that made it, which is also what keeps this safe).
                Some((kept_id, kept_files, kept)) if *kept_id == id && *kept_files == files => {
                    kept.clone()
                }
                _ => {
                    let sessions = portico_tls::ClientSessions::new(t.session_cache);
                    let build = match h2 {
                        true => portico_tls::client_config_h2,
                        false => portico_tls::client_config,
                    };
                    let origination =
                        build(t, &sessions).map_err(|source| StartError::UpstreamTls {
                            name: g.name.clone(),
                            source,
                        })?;
                    Arc::new(crate::upstream_tls::GroupTls::new(t, origination))
                }
            };
            tls_kept.insert(g.name.clone(), (id, files, tls.clone()));
            upstream_tls.push(Some(tls));
        }
        let mut no_server = HashMap::new();
        let mut header_time = HashMap::new();
        let mut queues = HashMap::new();
        let groups: Vec<GroupStats> = config
            .upstreams
            .iter()
            .map(|g| {
                let refused = inner.no_server.get(&g.name).cloned().unwrap_or_default();
                no_server.insert(g.name.clone(), refused.clone());
                let times = g
                    .servers
                    .iter()
                    .map(|srv| {
                        let key = (g.name.clone(), srv.address);
                        let h = inner.header_time.get(&key).cloned().unwrap_or_default();
                        header_time.insert(key, h.clone());
                        h
                    })
                    .collect();
                let queue = inner.queues.get(&g.name).cloned().unwrap_or_default();
                queues.insert(g.name.clone(), queue.clone());
                GroupStats {
                    no_server: refused,
                    header_time: times,
                    queue,
                }
            })
            .collect();
        for (u, gs) in upstreams.iter().zip(&groups) {
            // Only queueing groups hear about released slots: the others pay nothing.
            if u.group().queue > 0 {
                u.set_release_hook(gs.queue.clone());
            }
        }

        let checked = config.upstreams.iter().any(|g| g.health_check.is_some());
        if checked {
            let targets: Vec<ProbeTarget> = upstreams
                .iter()
                .zip(&upstream_tls)
                .map(|(u, tls)| ProbeTarget {
                    upstream: u.clone(),
                    tls: tls.clone(),
                })
                .collect();
            match &inner.health {
                Some(h) => h.update(targets),
                None => {
                    let h = HealthChecker::start(targets).map_err(StartError::Thread)?;
                    inner.health = Some(h);
                }
            }
        }

        // Commit: nothing below can fail.
        let generation = old.generation + 1;
        self.current.store(Arc::new(Shared {
            generation,
            config: Arc::new(config),
            listeners,
            upstreams,
            group_stats: groups,
            upstream_tls,
            stats: self.stats.clone(),
            access_log,
            workers: self.workers,
        }));
        self.generation.store(generation, Ordering::Release);
        let mut summary = ReloadSummary {
            generation,
            ..Default::default()
        };
        for (slot, sockets) in fresh {
            summary.added.push(slot.name.clone());
            for (tx, socket) in inner.senders.iter().zip(sockets) {
                let _ = tx.send(Cmd::Listen(slot.clone(), socket));
            }
        }
        for s in &inner.slots {
            if slots.iter().any(|k| Arc::ptr_eq(k, s)) {
                summary.kept.push(s.name.clone());
            } else {
                summary.removed.push(s.name.clone());
                s.stop.send_replace(true);
            }
        }
        if !checked {
            if let Some(h) = inner.health.take() {
                h.stop();
            }
        }
        inner.slots = slots;
        inner.next_slot = next_slot;
        // Counters of removed routes and groups go: label cardinality follows the config.
        inner.route_stats = route_stats;
        inner.resumption = resumption_kept;
        inner.upstream_tls = tls_kept;
        inner.no_server = no_server;
        inner.header_time = header_time;
        inner.queues = queues;
        Ok(summary)
    }

    /// Set where [`Control::reload`] reads the configuration from.
    pub fn set_source(&self, source: ConfigSource) {
        *self.source.lock().unwrap_or_else(|e| e.into_inner()) = Some(source);
    }

    /// Read the configuration from its source and apply it (SIGHUP, admin API). An invalid
    /// configuration is refused and the running one stays.
    pub fn reload(&self) -> Result<ReloadSummary, ReloadError> {
        let config = {
            let source = self.source.lock().unwrap_or_else(|e| e.into_inner());
            let source = source.as_ref().ok_or(ReloadError::NoSource)?;
            source().map_err(ReloadError::Config)?
        };
        let summary = self.apply(config)?;
        Ok(summary)
    }

    /// Testing aid: saturate every worker whose listeners shed, by blocking its thread for
    /// `slice` between two of its lag samples (as a CPU-bound burst would), until called with
    /// None. Nothing else uses it.
    pub fn simulate_saturation(&self, slice: Option<Duration>) {
        let us = slice.map_or(0, |d| {
            u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
        });
        self.stall_us.store(us, Ordering::Relaxed);
    }

    /// The stall [`Control::simulate_saturation`] asks for, if any.
    pub fn simulated_stall(&self) -> Option<Duration> {
        match self.stall_us.load(Ordering::Relaxed) {
            0 => None,
            us => Some(Duration::from_micros(us)),
        }
    }

    /// Stop accepting everywhere and let the workers drain.
    pub fn shutdown(&self) {
        let mut inner = self.lock();
        inner.shutting_down = true;
        for s in &inner.slots {
            s.stop.send_replace(true);
        }
        self.shutdown.send_replace(true);
    }
}

fn listener_state(
    l: &Listener,
    slot: u64,
    tls: Option<Arc<crate::cert_watch::ListenerTls>>,
    route_stats: Vec<Arc<RouteStats>>,
    resilience: Vec<RouteResilience>,
) -> ListenerState {
    let origins = l
        .routes
        .iter()
        .map(|r| match &r.action {
            Action::Static(s) => Some(Origin::new(s.root.clone(), s.index.clone(), false)),
            Action::Origin(s) => Some(Origin::new(s.root.clone(), s.index.clone(), true)),
            _ => None,
        })
        .collect();
    ListenerState {
        listener: l.clone(),
        slot,
        limits: portico_http1::Limits {
            max_headers: l.limits.max_headers,
            max_head_bytes: l.limits.max_head_bytes,
            max_request_line: l.limits.max_request_line,
        },
        origins,
        tls,
        route_stats,
        resilience,
    }
}

/// A running proxy: its control plane, the worker threads, the admin listener.
pub struct Running {
    control: Arc<Control>,
    threads: Vec<JoinHandle<()>>,
    admin: Option<AdminServer>,
    /// Polls the files of TLS listeners with `watch` on.
    watcher: Option<crate::cert_watch::CertWatcher>,
}

impl Running {
    /// The bound address of the listener with this name (useful with port 0).
    pub fn addr(&self, name: &str) -> Option<SocketAddr> {
        self.control
            .addrs()
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| a)
    }

    pub fn addrs(&self) -> Vec<(String, SocketAddr)> {
        self.control.addrs()
    }

    pub fn stats(&self) -> &Arc<Stats> {
        &self.control.stats
    }

    pub fn control(&self) -> &Arc<Control> {
        &self.control
    }

    /// The shared state of the upstream group with this name (health, counters, admin state).
    pub fn upstream(&self, name: &str) -> Option<Arc<Upstream>> {
        self.control.upstream(name)
    }

    /// The bound address of the admin listener, if configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(AdminServer::addr)
    }

    /// Apply a new configuration without a restart (see [`Control::apply`]).
    pub fn reload(&self, config: Config) -> Result<ReloadSummary, StartError> {
        self.control.apply(config)
    }

    /// Begin a graceful shutdown: stop accepting, let in-flight requests finish.
    pub fn shutdown(&self) {
        self.control.shutdown();
    }

    /// Wait until every worker has drained and exited (the admin listener stays up meanwhile).
    pub fn wait(mut self) {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // Every request has logged its line: let the access log's writer catch up (bounded:
        // its output may be blocked for good).
        if let Some(log) = &self.control.snapshot().access_log {
            log.flush(Duration::from_secs(2));
        }
        if let Some(h) = self.control.lock().health.take() {
            h.stop();
        }
        if let Some(a) = self.admin.take() {
            a.stop();
        }
        drop(self.watcher.take());
    }
}

/// The listen backlog of every listener socket.
const BACKLOG: u32 = 4096;

fn bind(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nodelay(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG as i32)?;
    Ok(socket.into())
}

/// Start `workers` threads and apply `config` (bind every listener, one SO_REUSEPORT socket per
/// worker).
pub fn start(config: Config, workers: usize) -> Result<Running, StartError> {
    portico_tls::install_default_provider();
    let workers = workers.max(1);
    let stats = Arc::new(Stats::default());
    let empty = Shared {
        generation: 0,
        config: Arc::new(Config {
            listeners: Vec::new(),
            upstreams: Vec::new(),
            access_log: None,
            admin: None,
            drain_timeout: config.drain_timeout,
            workers: None,
        }),
        listeners: Vec::new(),
        upstreams: Vec::new(),
        group_stats: Vec::new(),
        upstream_tls: Vec::new(),
        stats: stats.clone(),
        access_log: None,
        workers,
    };
    let mut receivers = Vec::new();
    let mut senders = Vec::new();
    for _ in 0..workers {
        let (tx, rx) = mpsc::unbounded_channel();
        senders.push(tx);
        receivers.push(rx);
    }
    let control = Arc::new(Control {
        current: ArcSwap::from_pointee(empty),
        generation: AtomicU64::new(0),
        stats,
        idle_upstream: Arc::new(AtomicI64::new(0)),
        workers,
        started: Instant::now(),
        inner: Mutex::new(Inner {
            slots: Vec::new(),
            route_stats: HashMap::new(),
            no_server: HashMap::new(),
            header_time: HashMap::new(),
            queues: HashMap::new(),
            next_slot: 0,
            senders,
            shutting_down: false,
            health: None,
            resumption: HashMap::new(),
            upstream_tls: HashMap::new(),
        }),
        source: Mutex::new(None),
        shutdown: watch::channel(false).0,
        stall_us: AtomicU64::new(0),
    });
    let admin = config.admin.clone();
    let mut running = Running {
        control: control.clone(),
        threads: Vec::new(),
        admin: None,
        watcher: None,
    };
    for (i, rx) in receivers.into_iter().enumerate() {
        let control = control.clone();
        let t = std::thread::Builder::new()
            .name(format!("portico-worker-{i}"))
            .spawn(move || worker_main(control, rx));
        match t {
            Ok(t) => running.threads.push(t),
            Err(e) => {
                running.shutdown();
                running.wait();
                return Err(StartError::Thread(e));
            }
        }
    }
    if let Err(e) = control.apply(config) {
        running.shutdown();
        running.wait();
        return Err(e);
    }
    match crate::cert_watch::CertWatcher::start(Arc::downgrade(&control)) {
        Ok(w) => running.watcher = Some(w),
        Err(e) => tracing::warn!("certificate files will not be watched (a reload re-reads them): cannot start the watcher thread: {e}"),
    }
    if let Some(cfg) = admin {
        match AdminServer::start(control, &cfg) {
            Ok(a) => running.admin = Some(a),
            Err(source) => {
                running.shutdown();
                running.wait();
                return Err(StartError::Bind {
                    name: "admin".into(),
                    addr: cfg.address,
                    source,
                });
            }
        }
    }
    Ok(running)
}

fn worker_main(control: Arc<Control>, mut commands: mpsc::UnboundedReceiver<Cmd>) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("worker runtime failed to start: {e}");
            return;
        }
    };
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let mut shutdown = control.shutdown.subscribe();
        let worker = Rc::new(Worker {
            pool: Pool::new(control.idle_upstream.clone()),
            h2pool: Default::default(),
            open: Cell::new(0),
            idle_notify: Notify::new(),
            snapshot: RefCell::new(Snapshot(Rc::new(control.current.load_full()))),
            control,
            load: crate::load::WorkerLoad::default(),
        });
        let loops: Rc<RefCell<Vec<tokio::task::JoinHandle<()>>>> = Rc::default();
        let listen = {
            let (worker, loops) = (worker.clone(), loops.clone());
            tokio::task::spawn_local(async move {
                while let Some(Cmd::Listen(slot, socket)) = commands.recv().await {
                    let listener = match tokio::net::TcpListener::from_std(socket) {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::error!(listener = %slot.name, "cannot register listener: {e}");
                            continue;
                        }
                    };
                    let mut loops = loops.borrow_mut();
                    loops.retain(|h| !h.is_finished());
                    loops.push(tokio::task::spawn_local(accept_loop(
                        listener,
                        slot,
                        worker.clone(),
                    )));
                }
            })
        };
        // Close idle upstream connections past their idle timeout even without traffic.
        let sweeper = {
            let worker = worker.clone();
            tokio::task::spawn_local(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                loop {
                    tick.tick().await;
                    worker.pool.purge_expired();
                    worker.h2pool.purge_expired();
                }
            })
        };
        let prober = tokio::task::spawn_local(crate::load::probe(worker.clone()));
        while !*shutdown.borrow_and_update() {
            if shutdown.changed().await.is_err() {
                break;
            }
        }
        listen.abort();
        let pending: Vec<_> = loops.borrow_mut().drain(..).collect();
        for a in pending {
            let _ = a.await;
        }
        // Draining: wait for open connections to finish, bounded by the drain timeout.
        let drain = worker.snapshot().config.drain_timeout;
        let _ = tokio::time::timeout(drain, async {
            while worker.open.get() > 0 {
                worker.idle_notify.notified().await;
            }
        })
        .await;
        sweeper.abort();
        prober.abort();
        worker.load.reset(&worker.control.stats);
        worker.pool.clear();
        worker.h2pool.clear();
    });
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    slot: Arc<ListenerSlot>,
    worker: Rc<Worker>,
) {
    let mut stop = slot.stop.subscribe();
    let mut draining = false;
    // Connections taken from the backlog while stopping: at most a backlog's worth, so clients
    // that keep connecting cannot hold the stop open.
    let mut taken_while_draining = 0u32;
    loop {
        if !draining && *stop.borrow_and_update() {
            draining = true;
        }
        let accepted = if draining {
            // Stopping: take the connections the kernel already completed (closing the socket
            // would reset them), then stop. They get one response with `Connection: close`.
            taken_while_draining += 1;
            if taken_while_draining > BACKLOG {
                return;
            }
            match tokio::time::timeout(Duration::ZERO, listener.accept()).await {
                Ok(r) => r,
                Err(_) => return,
            }
        } else {
            tokio::select! {
                r = listener.accept() => r,
                // A change (or the sender gone) only ever means stop.
                _ = stop.changed() => {
                    draining = true;
                    continue;
                }
            }
        };
        let shared = worker.snapshot();
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(_) if draining => return,
            Err(e) => {
                // EMFILE and friends: back off briefly instead of spinning.
                crate::log_limited!(warn, listener = %slot.name, "accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        shared
            .stats
            .connections_accepted
            .fetch_add(1, Ordering::Relaxed);
        // Only between a reload's removal of this listener and this loop seeing the stop.
        let Some(ls) = shared.listener(slot.id).cloned() else {
            continue;
        };
        let max = ls.listener.limits.max_connections;
        if slot.active.fetch_add(1, Ordering::AcqRel) >= max {
            slot.active.fetch_sub(1, Ordering::AcqRel);
            shared
                .stats
                .connections_refused
                .fetch_add(1, Ordering::Relaxed);
            drop(stream);
            continue;
        }
        let per_client = ls.listener.limits.max_connections_per_client;
        let client = (per_client > 0).then(|| peer.ip());
        if let Some(ip) = client {
            if !slot.clients.try_open(ip, per_client) {
                slot.active.fetch_sub(1, Ordering::AcqRel);
                shared
                    .stats
                    .connections_refused
                    .fetch_add(1, Ordering::Relaxed);
                tracing::debug!(listener = %slot.name, client = %ip, "connection refused: max_connections_per_client reached");
                drop(stream);
                continue;
            }
        }
        let _ = stream.set_nodelay(true);
        worker.open.set(worker.open.get() + 1);
        let guard = OpenGuard {
            slot: slot.clone(),
            worker: worker.clone(),
            client,
        };
        let ctx = conn::Ctx {
            ls,
            shared,
            worker: worker.clone(),
            shutdown: slot.stop.subscribe(),
        };
        tokio::task::spawn_local(async move {
            let stream = match &ctx.ls.tls {
                None => ClientStream::Plain(stream),
                Some(tls) => {
                    let acceptor = tls.acceptor();
                    // The handshake counts against the head deadline of the first request.
                    let deadline = ctx.ls.listener.limits.head_timeout;
                    match tokio::time::timeout(deadline, acceptor.accept(portico_tls::Tcp(stream)))
                        .await
                    {
                        Ok(Ok(tls)) => {
                            ctx.shared.stats.count_handshake(tls.get_ref().1);
                            ClientStream::Tls(Box::new(tls))
                        }
                        Ok(Err(e)) => {
                            ctx.shared
                                .stats
                                .tls_handshake_failures
                                .fetch_add(1, Ordering::Relaxed);
                            tracing::debug!(%peer, "TLS handshake failed: {e}");
                            return;
                        }
                        Err(_) => {
                            ctx.shared
                                .stats
                                .tls_handshake_failures
                                .fetch_add(1, Ordering::Relaxed);
                            tracing::debug!(%peer, "TLS handshake timed out");
                            return;
                        }
                    }
                }
            };
            crate::h2::dispatch(stream, peer, ctx).await;
            drop(guard);
        });
    }
}

struct OpenGuard {
    slot: Arc<ListenerSlot>,
    worker: Rc<Worker>,
    /// The client address counted in `slot.clients`, if it was.
    client: Option<std::net::IpAddr>,
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
