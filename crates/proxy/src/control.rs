//! The process's control plane: the current configuration snapshot and how a reload builds and publishes the next one, the bound listeners, the workers' command channels, start and reload errors.

use crate::metrics::{GroupStats, Histogram, RouteStats};
use crate::resilience::RouteResilience;
use crate::state::{ListenerSlot, ListenerState, Published, Shared};
use crate::telemetry::access_log::AccessLogger;
use crate::telemetry::stats::Stats;
use crate::upstream::health::{HealthChecker, ProbeTarget};
use arc_swap::ArcSwap;
use portico_config::{Action, Config, Listener};
use portico_origin::Origin;
use portico_upstream::Upstream;
use socket2::{Domain, Protocol, Socket, Type};
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

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
    #[error("cannot open the response cache: {0}")]
    Cache(io::Error),
    #[error("ACME certificates: {0}")]
    Acme(io::Error),
    #[error("[fleet]: {0}")]
    Fleet(io::Error),
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
    /// Everything that changed, in words (see [`portico_config::changes`]).
    pub changes: Vec<String>,
}

/// What a successful reload calls with the configuration it applied (the CLI changes its error
/// log with it).
pub type ReloadHook = Box<dyn Fn(&Config) + Send + Sync>;

/// A group's TLS origination as a reload may keep it: (settings id, file stamps, state).
type KeptGroupTls = (
    u64,
    Vec<crate::cert_watch::Stamp>,
    Arc<crate::upstream::tls::GroupTls>,
);

pub(crate) enum Cmd {
    /// Start accepting on this worker's socket of a new listener.
    Listen(Arc<ListenerSlot>, std::net::TcpListener),
    /// Start serving HTTP/3 on this worker's UDP socket of a new listener.
    ListenQuic(Arc<ListenerSlot>, std::net::UdpSocket),
}

/// The process-wide control plane: the current snapshot, the bound listeners, the workers'
/// command channels. Reloads and admin changes go through it; workers only read.
pub struct Control {
    /// What the workers read: the current snapshot, its generation, the testing aid's stall.
    pub(crate) published: Arc<Published>,
    pub stats: Arc<Stats>,
    /// Idle upstream connections over all workers' pools.
    pub idle_upstream: Arc<AtomicI64>,
    pub workers: usize,
    pub started: Instant,
    inner: Mutex<Inner>,
    source: Mutex<Option<ConfigSource>>,
    on_reload: Mutex<Option<ReloadHook>>,
    /// Tells worker threads to drain and exit.
    pub(crate) shutdown: watch::Sender<bool>,
    /// The groups' discovery lookups, for the admin API and `/metrics`.
    pub(crate) discovery_status: Arc<crate::discovery::Status>,
    /// The fleet as the etcd follower last read it (the JSON `/api/fleet` gives, with `error`
    /// when the last read failed); None when the configuration does not come from etcd.
    fleet_view: Mutex<Option<serde_json::Value>>,
    /// This control plane, for the discovery thread's changes.
    me: std::sync::Weak<Control>,
}

pub(crate) struct Inner {
    slots: Vec<Arc<ListenerSlot>>,
    /// Counters carried across reloads: by (listener, route) name and by group name.
    route_stats: HashMap<(String, String), Arc<RouteStats>>,
    no_server: HashMap<String, Arc<AtomicU64>>,
    header_time: HashMap<(String, SocketAddr), Arc<Histogram>>,
    /// Group queues (waiting requests and their counters), by group name.
    queues: HashMap<String, Arc<crate::upstream::queue::GroupQueue>>,
    next_slot: u64,
    senders: Vec<mpsc::UnboundedSender<Cmd>>,
    shutting_down: bool,
    /// Present while a group has a health check (one probe per server for the process).
    pub(crate) health: Option<HealthChecker>,
    /// TLS session resumption state (ticket key rotator, session cache) per listener name.
    resumption: HashMap<String, portico_tls::Resumption>,
    /// TLS origination per upstream group name, with the pool id of its settings and the stamps
    /// of its files (kept by a reload only while both stay the same).
    upstream_tls: HashMap<String, KeptGroupTls>,
    /// JWK set files and URLs by what the configuration names (kept while it still does).
    key_sources: crate::filter::jwks::KeySources,
    /// The admin API's changes, re-applied over every configuration.
    runtime: crate::runtime::Changes,
    /// The last configuration applied as it came, before the admin API's changes.
    base: Option<Arc<Config>>,
    /// A copy of every listening socket by slot id, for a successor (binary upgrade).
    copies: HashMap<u64, Vec<std::net::TcpListener>>,
    /// A predecessor's sockets, until the first configuration takes them.
    pub(crate) inherited: Option<crate::handover::Inherited>,
    /// Each discovering group's servers as found last, by group name.
    discovered: HashMap<String, crate::discovery::Found>,
    /// Present while a group has a discovery (one thread for the process).
    discovery: Option<crate::discovery::Manager>,
}

impl Control {
    /// The current configuration snapshot.
    pub fn snapshot(&self) -> Arc<Shared> {
        self.published.current.load_full()
    }

    /// The current state of the upstream group with this name.
    pub fn upstream(&self, name: &str) -> Option<Arc<Upstream>> {
        let shared = self.published.current.load();
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

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Validate-and-swap: build everything the new configuration needs (sockets, TLS, upstream
    /// state carried over by group name and server address, access log) and only then publish
    /// it. Any failure leaves the running configuration untouched.
    pub fn apply(&self, config: Config) -> Result<ReloadSummary, StartError> {
        let mut inner = self.lock();
        self.apply_locked(&mut inner, config)
    }

    /// [`Control::apply`] under the control plane's lock, held by the caller.
    fn apply_locked(
        &self,
        inner: &mut Inner,
        mut config: Config,
    ) -> Result<ReloadSummary, StartError> {
        if inner.shutting_down {
            return Err(StartError::ShuttingDown);
        }
        let old = self.published.current.load_full();
        // The admin API's changes go over the new configuration (kept only if it is applied).
        let base = Arc::new(config.clone());
        // The admin API's changes go over the servers the configuration lists; those found by
        // the groups' discovery join them (but for those the API removed). A discovery not
        // asked before is asked now.
        let (discovered, asked_now) = self.discovered_for(inner, &config);
        let mut runtime = inner.runtime.clone();
        let dropped = runtime.apply_to(&mut config);
        merge_discovered(&mut config, &discovered, &runtime);
        let changes = match old.generation {
            0 => Vec::new(),
            _ => portico_config::changes(&old.config, &config),
        };
        if old.generation > 0 && old.config.admin != config.admin {
            tracing::warn!("admin listener settings change only on restart; the admin listener keeps its address and token");
        }
        // The span exporter: kept while its endpoint stays the same.
        let tracer = match &config.trace {
            None => None,
            Some(t) => match old.tracer.as_ref().filter(|e| e.serves(t)) {
                Some(e) => Some(e.clone()),
                None => {
                    crate::telemetry::trace::Exporter::start(t, self.stats.trace_export.clone())
                        .map_err(StartError::Thread)?
                        .map(Arc::new)
                }
            },
        };
        // ACME listeners get certificate files (a stand-in until one is issued) before their
        // TLS settings load them.
        crate::acme::prepare(&config).map_err(StartError::Acme)?;
        // The response cache: kept, with what it holds, while its memory and disk tier stay
        // the same.
        let cache = match config.cache.as_ref() {
            None => None,
            Some(c) => Some(match old.cache.as_ref().filter(|k| k.serves(c)) {
                Some(k) => k.clone(),
                None => crate::cache::Cache::new(c.memory, c.disk.as_ref())
                    .map_err(StartError::Cache)?,
            }),
        };
        // What fleet rate limits count through: kept while its settings stay the same.
        let fleet = match &config.fleet {
            None => None,
            Some(f) => Some(match old.fleet.as_ref().filter(|k| k.settings == *f) {
                Some(k) => k.clone(),
                None => crate::resilience::fleet::Fleet::start(f).map_err(StartError::Fleet)?,
            }),
        };
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
        // New listeners: their slot, each worker's socket, and a copy of each for a successor.
        type Fresh = (
            Arc<ListenerSlot>,
            Vec<std::net::TcpListener>,
            Vec<std::net::TcpListener>,
            Vec<std::net::UdpSocket>,
        );
        let mut fresh: Vec<Fresh> = Vec::new();
        let mut next_slot = inner.next_slot;
        for l in &config.listeners {
            let kept = inner.slots.iter().find(|s| {
                s.name == l.name
                    && s.configured == l.address
                    && s.quic == l.http3.map(|h| h.max_udp_payload)
            });
            if let Some(s) = kept {
                slots.push(s.clone());
                continue;
            }
            let err = |source| StartError::Bind {
                name: l.name.clone(),
                addr: l.address,
                source,
            };
            // A port another process listens on is refused, even when that process shares it
            // (SO_REUSEPORT, as every Portico's listeners do): two proxies would silently split
            // the traffic. A port this process holds itself (a listener renamed or moved by this
            // reload) is shared on purpose until the old listener stops.
            // A predecessor's sockets (a binary upgrade) keep accepting, backlog included.
            let inherited = inner
                .inherited
                .as_mut()
                .and_then(|i| i.take(&l.name, l.address))
                .filter(|s| !s.is_empty());
            let ours = inner.slots.iter().any(|s| s.addr == l.address);
            if l.address.port() != 0 && !ours && inherited.is_none() {
                if let Err(e) = probe(l.address) {
                    let held = e.kind() == io::ErrorKind::AddrInUse;
                    return Err(err(match held {
                        true => io::Error::new(
                            io::ErrorKind::AddrInUse,
                            "address in use: another process listens on it (another Portico?)",
                        ),
                        false => e,
                    }));
                }
            }
            let passed = inherited.is_some();
            let mut sockets = match inherited {
                Some(s) => s,
                None => vec![bind(l.address).map_err(err)?],
            };
            for s in &sockets {
                s.set_nonblocking(true).map_err(err)?;
            }
            let actual = sockets[0].local_addr().map_err(err)?;
            // One per worker (more when a predecessor had more workers: none is closed, as a
            // closed socket would reset the connections in its backlog). Passed sockets are
            // shared by the workers rather than joined by new ones: a new socket would take
            // connections at once, and lose them if this process then failed to start.
            let given = sockets.len();
            while sockets.len() < self.workers {
                let more = match passed {
                    true => sockets[sockets.len() % given].try_clone().map_err(err)?,
                    false => bind(actual).map_err(err)?,
                };
                sockets.push(more);
            }
            let copies = sockets
                .iter()
                .map(std::net::TcpListener::try_clone)
                .collect::<io::Result<Vec<_>>>()
                .map_err(err)?;
            // HTTP/3: a UDP socket per worker on the same port. Not passed on by an upgrade:
            // the successor binds its own beside its predecessor's.
            let mut quic = Vec::new();
            if l.http3.is_some() {
                let udp_err =
                    |e: io::Error| err(io::Error::new(e.kind(), format!("UDP (HTTP/3): {e}")));
                if l.address.port() != 0 && !ours && !passed {
                    probe_udp(actual).map_err(udp_err)?;
                }
                for _ in 0..self.workers.max(1) {
                    quic.push(bind_udp(actual).map_err(udp_err)?);
                }
                let got = quic.first().map_or(UDP_BUFFER, |s| {
                    socket2::SockRef::from(s).recv_buffer_size().unwrap_or(0) / 2
                });
                if got < UDP_BUFFER {
                    tracing::warn!(
                        listener = %l.name,
                        "HTTP/3: the kernel gave each UDP socket a {} KiB receive buffer, not the {} KiB asked: a burst of new clients may overflow it (each then waits a second to resend); raise net.core.rmem_max, or run with CAP_NET_ADMIN",
                        got >> 10,
                        UDP_BUFFER >> 10
                    );
                }
            }
            next_slot += 1;
            let slot = Arc::new(ListenerSlot {
                id: next_slot,
                name: l.name.clone(),
                configured: l.address,
                addr: actual,
                quic: l.http3.map(|h| h.max_udp_payload),
                active: AtomicU32::new(0),
                clients: Default::default(),
                stop: watch::channel(false).0,
            });
            slots.push(slot.clone());
            fresh.push((slot, sockets, copies, quic));
        }
        let mut route_stats = HashMap::new();
        let mut resumption_kept = HashMap::new();
        let mut listeners = Vec::new();
        let mut key_sources = inner.key_sources.next();
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
            let resilience = crate::resilience::for_listener(
                l,
                previous.map(|p| (&p.listener, &p.resilience[..])),
                fleet.as_ref(),
            );
            let alt_svc = l.http3.and_then(|h| h.alt_svc_max_age);
            let filters = l
                .routes
                .iter()
                .map(|r| {
                    let mut f = crate::filter::Filters::for_route(
                        l,
                        r,
                        &config.upstreams,
                        &mut key_sources,
                    );
                    if let Some(ma) = alt_svc {
                        f.advertise_h3(slot.addr.port(), ma);
                    }
                    f
                })
                .collect();
            listeners.push(Arc::new(listener_state(
                l, slot.id, tls, counters, resilience, filters,
            )));
        }
        // New JWK sets are loaded now (a URL within its fetch timeout): the configuration
        // starts with its keys.
        let key_sources = key_sources.finish(&self.stats);
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
            let id = crate::upstream::tls::settings_id(t) ^ u64::from(h2);
            let files = crate::cert_watch::stamps(&crate::upstream::tls::files(t));
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
                    Arc::new(crate::upstream::tls::GroupTls::new(t, origination))
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
        // The checker's thread starts here (it can fail); it learns what to probe once the
        // configuration is committed.
        if checked && inner.health.is_none() {
            let h = HealthChecker::start(Vec::new()).map_err(StartError::Thread)?;
            inner.health = Some(h);
        }

        if !discovered.is_empty() && inner.discovery.is_none() {
            let me = self.me.clone();
            let publish: crate::discovery::Publish =
                Arc::new(move |group, id, servers| match me.upgrade() {
                    Some(control) => control.discovered(group, id, servers),
                    None => true,
                });
            let m = crate::discovery::Manager::start(publish, self.discovery_status.clone())
                .map_err(StartError::Thread)?;
            inner.discovery = Some(m);
        }

        // Commit: nothing below can fail.
        let probes: Option<Vec<ProbeTarget>> = checked.then(|| {
            upstreams
                .iter()
                .zip(&upstream_tls)
                .map(|(u, tls)| ProbeTarget {
                    upstream: u.clone(),
                    tls: tls.clone(),
                })
                .collect()
        });
        crate::acme::manage(&config);
        let watches: Vec<crate::discovery::Watch> = discovered
            .iter()
            .map(|(group, found)| crate::discovery::Watch {
                group: group.clone(),
                found: found.clone(),
            })
            .collect();
        let names: Vec<&str> = watches.iter().map(|w| w.group.as_str()).collect();
        self.discovery_status.retain(&names);
        for group in &asked_now {
            if let Some(f) = discovered.get(group) {
                self.discovery_status
                    .record(group, &f.spec, &f.first.outcome, None);
                self.discovery_status
                    .skipped(group, f.first.skipped.clone());
            }
        }
        match watches.is_empty() {
            // the thread ends with its channel
            true => inner.discovery = None,
            false => {
                if let Some(m) = &inner.discovery {
                    m.update(watches);
                }
            }
        }
        inner.discovered = discovered;
        runtime.apply_states(&upstreams);
        for w in &dropped {
            tracing::warn!("{w}");
        }
        if !dropped.is_empty() || runtime.groups != inner.runtime.groups {
            if let Err(e) = runtime.save() {
                tracing::error!("runtime changes not saved: {e}");
            }
        }
        inner.runtime = runtime;
        inner.base = Some(base);
        let generation = old.generation + 1;
        self.published.current.store(Arc::new(Shared {
            generation,
            config: Arc::new(config),
            listeners,
            upstreams,
            group_stats: groups,
            upstream_tls,
            stats: self.stats.clone(),
            access_log,
            tracer,
            cache,
            fleet,
            workers: self.workers,
        }));
        self.published
            .generation
            .store(generation, Ordering::Release);
        let mut summary = ReloadSummary {
            generation,
            changes,
            ..Default::default()
        };
        for (slot, sockets, copies, quic) in fresh {
            summary.added.push(slot.name.clone());
            let n = inner.senders.len().max(1);
            for (i, socket) in sockets.into_iter().enumerate() {
                if let Some(tx) = inner.senders.get(i % n) {
                    let _ = tx.send(Cmd::Listen(slot.clone(), socket));
                }
            }
            for (i, socket) in quic.into_iter().enumerate() {
                if let Some(tx) = inner.senders.get(i % n) {
                    let _ = tx.send(Cmd::ListenQuic(slot.clone(), socket));
                }
            }
            inner.copies.insert(slot.id, copies);
        }
        if let Some(left) = inner.inherited.take() {
            for name in left.leftover() {
                tracing::warn!(listener = name, "a passed listening socket no listener of this configuration takes: closed (a predecessor keeps its own until it stops)");
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
        match probes {
            Some(targets) => {
                if let Some(h) = &inner.health {
                    h.update(targets);
                }
            }
            None => {
                if let Some(h) = inner.health.take() {
                    h.stop();
                }
            }
        }
        inner
            .copies
            .retain(|id, _| slots.iter().any(|s| s.id == *id));
        inner.slots = slots;
        inner.next_slot = next_slot;
        // Counters of removed routes and groups go: label cardinality follows the config.
        inner.route_stats = route_stats;
        inner.resumption = resumption_kept;
        inner.upstream_tls = tls_kept;
        inner.key_sources = key_sources;
        inner.no_server = no_server;
        inner.header_time = header_time;
        inner.queues = queues;
        Ok(summary)
    }

    /// Each discovering group's servers: as found before while its discovery and the name
    /// servers stay the same, else asked now (all at once, each bounded by the resolver's
    /// timeout), keeping the servers found before while the new asking finds none. Also the
    /// groups asked now.
    fn discovered_for(
        &self,
        inner: &Inner,
        config: &Config,
    ) -> (HashMap<String, crate::discovery::Found>, Vec<String>) {
        let mut out = HashMap::new();
        let mut asks = Vec::new();
        let r = &config.resolver;
        for g in &config.upstreams {
            let Some(d) = &g.discovery else { continue };
            let before = inner.discovered.get(&g.name).filter(|f| f.spec == *d);
            match before {
                Some(f)
                    if f.resolver.nameservers == r.nameservers
                        && f.resolver.timeout == r.timeout =>
                {
                    let mut f = f.clone();
                    if f.resolver != *r {
                        // Other TTL bounds or hold: a new task, from the servers found.
                        f.resolver = r.clone();
                        f.id = crate::discovery::next_id();
                        // its watch from the revision read first (a change since is read
                        // at once)
                        f.first = crate::discovery::Asked {
                            outcome: crate::discovery::Outcome::Found(
                                f.servers.clone(),
                                Duration::ZERO,
                            ),
                            ..f.first.clone()
                        };
                        f.at = Instant::now();
                    }
                    out.insert(g.name.clone(), f);
                }
                _ => asks.push((g.name.clone(), d.clone(), r.clone())),
            }
        }
        let found = crate::discovery::resolve_now(&asks);
        let mut fresh = Vec::new();
        for ((group, _, _), mut f) in asks.into_iter().zip(found) {
            let kept = inner.discovered.get(&group).filter(|b| b.spec == f.spec);
            if let (true, Some(b)) = (f.servers.is_empty(), kept) {
                f.servers = b.servers.clone();
            }
            fresh.push(group.clone());
            out.insert(group, f);
        }
        (out, fresh)
    }

    /// The discovery thread found other servers for `group`: apply the last configuration
    /// again with them (a change for a discovery the configuration no longer has is ignored).
    fn discovered(&self, group: &str, id: u64, servers: Vec<portico_config::Server>) -> bool {
        let mut inner = self.lock();
        if inner.shutting_down || inner.base.is_none() {
            return true;
        }
        let Some(found) = inner.discovered.get_mut(group).filter(|f| f.id == id) else {
            return true;
        };
        if found.servers == servers {
            return true;
        }
        let before = std::mem::replace(&mut found.servers, servers.clone());
        let name = found.spec.source.name().to_string();
        let config = self.base_config(&inner);
        match self.apply_locked(&mut inner, config) {
            Ok(summary) => {
                let added: Vec<_> = servers
                    .iter()
                    .filter(|s| !before.iter().any(|b| b.address == s.address))
                    .cloned()
                    .collect();
                let removed: Vec<_> = before
                    .iter()
                    .filter(|b| !servers.iter().any(|s| s.address == b.address))
                    .cloned()
                    .collect();
                tracing::info!(
                    upstream = group,
                    generation = summary.generation,
                    "discovery: {name} now gives {} server(s): {}; added: {}; removed: {}",
                    servers.len(),
                    crate::discovery::list(&servers),
                    crate::discovery::list(&added),
                    crate::discovery::list(&removed),
                );
                true
            }
            Err(e) => {
                if let Some(f) = inner.discovered.get_mut(group) {
                    f.servers = before;
                }
                tracing::error!(
                    upstream = group,
                    "discovery: {name} gives other servers, but the configuration with them was refused: {e}"
                );
                false
            }
        }
    }

    /// Read the admin API's changes kept in `file` (`[admin] state_file`), before the first
    /// configuration is applied. Portico starts without them if the file cannot be read, saying
    /// so; a file that is not a state file is set aside first (renamed `*.bad`).
    pub fn load_runtime_changes(&self, file: Option<&std::path::Path>) {
        let changes = match crate::runtime::Changes::load(file) {
            Ok(c) => {
                if !c.groups.is_empty() {
                    tracing::info!(
                        groups = c.groups.len(),
                        "runtime changes from the state file will be applied"
                    );
                }
                c
            }
            Err(e) => {
                let kept = match file.filter(|_| e.corrupt) {
                    Some(f) => {
                        let bad = crate::runtime::with_suffix(f, ".bad");
                        match std::fs::rename(f, &bad) {
                            Ok(()) => format!(" (set aside as {})", bad.display()),
                            Err(r) => format!(" (could not be set aside: {r})"),
                        }
                    }
                    None => String::new(),
                };
                tracing::error!(
                    "starting without the admin API's earlier changes: {}{kept}",
                    e.message
                );
                crate::runtime::Changes::empty(file)
            }
        };
        self.lock().runtime = changes;
    }

    /// Make and record a change of the admin API on the current snapshot, under the control
    /// plane's lock (no reload runs meanwhile); when it succeeds, save the state file, if any.
    pub(crate) fn change_runtime<T, E>(
        &self,
        change: impl FnOnce(&mut crate::runtime::Changes, &Shared) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut inner = self.lock();
        let shared = self.snapshot();
        let r = change(&mut inner.runtime, &shared);
        if r.is_ok() {
            if let Err(e) = inner.runtime.save() {
                tracing::error!("runtime change not saved: {e}");
            }
        }
        r
    }

    /// Record a change of the servers' lists and apply the last configuration again with it,
    /// all under the lock (a reload waits); a change the configuration cannot take is undone.
    pub(crate) fn change_servers<T, E>(
        &self,
        change: impl FnOnce(&mut crate::runtime::Changes, &Shared) -> Result<T, E>,
        refused: impl FnOnce(StartError) -> E,
    ) -> Result<(T, ReloadSummary), E> {
        let mut inner = self.lock();
        let before = inner.runtime.clone();
        let t = change(&mut inner.runtime, &self.snapshot())?;
        let config = self.base_config(&inner);
        match self.apply_locked(&mut inner, config) {
            Ok(summary) => {
                if let Err(e) = inner.runtime.save() {
                    tracing::error!("runtime change not saved: {e}");
                }
                Ok((t, summary))
            }
            Err(e) => {
                inner.runtime = before;
                Err(refused(e))
            }
        }
    }

    /// The last configuration applied, as it came (before the admin API's changes).
    fn base_config(&self, inner: &Inner) -> Config {
        match &inner.base {
            Some(b) => (**b).clone(),
            None => (*self.snapshot().config).clone(),
        }
    }

    /// The admin API's changes in effect, and the state file they are kept in.
    pub(crate) fn runtime_changes(
        &self,
    ) -> (
        std::collections::BTreeMap<String, crate::runtime::GroupChanges>,
        Option<std::path::PathBuf>,
    ) {
        let inner = self.lock();
        (
            inner.runtime.groups.clone(),
            inner.runtime.file().map(std::path::Path::to_path_buf),
        )
    }

    /// Every listener's sockets as (name, configured address, sockets), for a successor.
    pub(crate) fn with_sockets<T>(
        &self,
        f: impl FnOnce(&[(String, SocketAddr, Vec<std::os::fd::BorrowedFd<'_>>)]) -> T,
    ) -> T {
        use std::os::fd::AsFd;
        let inner = self.lock();
        let list: Vec<_> = inner
            .slots
            .iter()
            .filter_map(|s| {
                let copies = inner.copies.get(&s.id)?;
                Some((
                    s.name.clone(),
                    s.configured,
                    copies.iter().map(|c| c.as_fd()).collect(),
                ))
            })
            .collect();
        f(&list)
    }

    /// Undo the admin API's changes: servers as the configuration lists them, every state and
    /// weight the API set back to the configuration's. Nothing changes if the configuration
    /// cannot be applied again.
    pub(crate) fn revert_runtime_changes(&self) -> Result<ReloadSummary, StartError> {
        let mut inner = self.lock();
        let before = inner.runtime.clone();
        let undone = std::mem::take(&mut inner.runtime.groups);
        let config = self.base_config(&inner);
        let summary = match self.apply_locked(&mut inner, config) {
            Ok(s) => s,
            Err(e) => {
                inner.runtime = before;
                return Err(e);
            }
        };
        // States and weights are carried from one snapshot to the next: set them back.
        for u in &self.snapshot().upstreams {
            let Some(g) = undone.get(&u.group().name) else {
                continue;
            };
            for (i, s) in u.group().servers.iter().enumerate() {
                if g.state.contains_key(&s.address) {
                    u.set_admin_at(i, portico_upstream::AdminState::Enabled, Instant::now());
                }
                if g.weight.contains_key(&s.address) {
                    u.clear_weight(i);
                }
            }
        }
        if let Err(e) = inner.runtime.save() {
            tracing::error!("runtime change not saved: {e}");
        }
        Ok(summary)
    }

    /// Set where [`Control::reload`] reads the configuration from.
    pub fn set_source(&self, source: ConfigSource) {
        *self.source.lock().unwrap_or_else(|e| e.into_inner()) = Some(source);
    }

    /// Set the hook a successful reload calls with the configuration it applied.
    pub fn set_reload_hook(&self, hook: ReloadHook) {
        *self.on_reload.lock().unwrap_or_else(|e| e.into_inner()) = Some(hook);
    }

    /// Read the configuration from its source and apply it (SIGHUP, admin API); `by` says who
    /// asked, for the log line every reload writes (what changed, or why it was refused). An
    /// invalid configuration is refused and the running one stays.
    pub fn reload(&self, by: &str) -> Result<ReloadSummary, ReloadError> {
        let result = self.read_and_apply();
        let stats = &self.stats;
        match &result {
            Ok((summary, config)) => {
                stats.config_last_reload_ok.store(true, Ordering::Relaxed);
                stats
                    .config_last_reload_at
                    .store(crate::telemetry::stats::unix_now(), Ordering::Relaxed);
                let changes = match summary.changes.is_empty() {
                    true => "nothing".to_string(),
                    false => summary.changes.join("; "),
                };
                tracing::info!(
                    by,
                    generation = summary.generation,
                    "configuration reloaded: changed: {changes}"
                );
                if let Some(hook) = &*self.on_reload.lock().unwrap_or_else(|e| e.into_inner()) {
                    hook(config);
                }
            }
            Err(e) => {
                stats.config_reload_failures.fetch_add(1, Ordering::Relaxed);
                stats.config_last_reload_ok.store(false, Ordering::Relaxed);
                tracing::error!(by, "reload refused, the running configuration stays: {e}");
            }
        }
        result.map(|(summary, _)| summary)
    }

    fn read_and_apply(&self) -> Result<(ReloadSummary, Arc<Config>), ReloadError> {
        let config = {
            let source = self.source.lock().unwrap_or_else(|e| e.into_inner());
            let source = source.as_ref().ok_or(ReloadError::NoSource)?;
            source().map_err(ReloadError::Config)?
        };
        let summary = self.apply(config)?;
        Ok((summary, self.snapshot().config.clone()))
    }

    /// Testing aid: saturate every worker whose listeners shed, by blocking its thread for
    /// `slice` between two of its lag samples (as a CPU-bound burst would), until called with
    /// None. Nothing else uses it.
    pub fn simulate_saturation(&self, slice: Option<Duration>) {
        let us = slice.map_or(0, |d| {
            u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
        });
        self.published.stall_us.store(us, Ordering::Relaxed);
    }

    /// The fleet view the etcd follower read (see [`Control::fleet_view`]).
    pub(crate) fn set_fleet_view(&self, view: serde_json::Value) {
        *self.fleet_view.lock().unwrap_or_else(|e| e.into_inner()) = Some(view);
    }

    /// The fleet as the etcd follower last read it; None when the configuration does not come
    /// from etcd.
    pub fn fleet_view(&self) -> Option<serde_json::Value> {
        self.fleet_view
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether the process is stopping.
    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// Stop accepting everywhere and let the workers drain.
    pub fn shutdown(&self) {
        let mut inner = self.lock();
        inner.shutting_down = true;
        // The copies kept for a successor go first: once the accept loops stop, a socket left
        // open would take connections nobody accepts (a closed port refuses them at once). A
        // successor holds copies of its own.
        inner.copies.clear();
        inner.discovery = None;
        for s in &inner.slots {
            s.stop.send_replace(true);
        }
        self.shutdown.send_replace(true);
    }

    /// A successor serves on this process's sockets: draining accept loops take nothing more
    /// from the backlogs (the successor accepts those connections).
    pub fn handed_over(&self) {
        self.published.handed_over.store(true, Ordering::Release);
    }
}

fn listener_state(
    l: &Listener,
    slot: u64,
    tls: Option<Arc<crate::cert_watch::ListenerTls>>,
    route_stats: Vec<Arc<RouteStats>>,
    resilience: Vec<RouteResilience>,
    filters: Vec<crate::filter::Filters>,
) -> ListenerState {
    let origins = l
        .routes
        .iter()
        .map(|r| match &r.action {
            Action::Static(s) => Some(
                Origin::new(s.root.clone(), s.index.clone(), false)
                    .with_precompressed(s.precompressed.clone()),
            ),
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
        filters,
    }
}

impl Control {
    /// A control plane with an empty configuration for `workers` workers, and the receiving end
    /// of each worker's command channel.
    pub(crate) fn new(
        drain_timeout: Duration,
        workers: usize,
    ) -> (Arc<Control>, Vec<mpsc::UnboundedReceiver<Cmd>>) {
        let stats = Arc::new(Stats::default());
        let empty = Shared {
            generation: 0,
            config: Arc::new(Config {
                listeners: Vec::new(),
                upstreams: Vec::new(),
                access_log: None,
                log: Default::default(),
                request_id: None,
                trace: None,
                cache: None,
                admin: None,
                drain_timeout,
                workers: None,
                resolver: Default::default(),
                fleet: None,
                etcd: Default::default(),
            }),
            listeners: Vec::new(),
            upstreams: Vec::new(),
            group_stats: Vec::new(),
            upstream_tls: Vec::new(),
            stats: stats.clone(),
            access_log: None,
            tracer: None,
            cache: None,
            fleet: None,
            workers,
        };
        let mut receivers = Vec::new();
        let mut senders = Vec::new();
        for _ in 0..workers {
            let (tx, rx) = mpsc::unbounded_channel();
            senders.push(tx);
            receivers.push(rx);
        }
        let control = Arc::new_cyclic(|me| Control {
            published: Arc::new(Published {
                current: ArcSwap::from_pointee(empty),
                generation: AtomicU64::new(0),
                stall_us: AtomicU64::new(0),
                handed_over: std::sync::atomic::AtomicBool::new(false),
            }),
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
                key_sources: Default::default(),
                runtime: Default::default(),
                base: None,
                copies: HashMap::new(),
                inherited: None,
                discovered: HashMap::new(),
                discovery: None,
            }),
            source: Mutex::new(None),
            on_reload: Mutex::new(None),
            shutdown: watch::channel(false).0,
            discovery_status: Default::default(),
            fleet_view: Mutex::new(None),
            me: me.clone(),
        });
        (control, receivers)
    }
}

/// Add each group's discovered servers to those it lists (a listed or API-added address stays
/// as it is; one the admin API removed stays out).
fn merge_discovered(
    config: &mut Config,
    found: &HashMap<String, crate::discovery::Found>,
    runtime: &crate::runtime::Changes,
) {
    for group in &mut config.upstreams {
        let Some(f) = found.get(&group.name) else {
            continue;
        };
        let removed = runtime
            .groups
            .get(&group.name)
            .map(|c| &c.removed[..])
            .unwrap_or(&[]);
        let g = Arc::make_mut(group);
        for s in &f.servers {
            if !g.servers.iter().any(|l| l.address == s.address) && !removed.contains(&s.address) {
                g.servers.push(s.clone());
            }
        }
    }
}

/// The listen backlog of every listener socket.
pub(crate) const BACKLOG: u32 = 4096;

/// Whether `addr` is free of other listeners: a bind without SO_REUSEPORT fails on a port
/// held by any listening socket, shared or not. The socket is closed at once.
fn probe(addr: SocketAddr) -> io::Result<()> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())
}

/// Whether UDP `addr` is free of other sockets (a bind without SO_REUSEPORT fails on a port
/// any socket holds). The socket is closed at once.
fn probe_udp(addr: SocketAddr) -> io::Result<()> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    socket.bind(&addr.into())
}

/// The receive and send buffers an HTTP/3 socket asks for. A worker's one socket takes all its
/// clients' datagrams: a burst of new clients (two 1,200-byte datagrams each with a post-quantum
/// key share) overflows the kernel's default of about 200 KiB, and a client whose first flight
/// was dropped resends it only after a probe timeout, about a second.
const UDP_BUFFER: usize = 4 << 20;

/// One worker's UDP socket of an HTTP/3 listener (SO_REUSEPORT: the kernel spreads clients
/// over the workers by their address, so a connection's datagrams reach one worker), with
/// buffers of [`UDP_BUFFER`] where the kernel allows: above `net.core.rmem_max` (`wmem_max`)
/// only with CAP_NET_ADMIN.
fn bind_udp(addr: SocketAddr) -> io::Result<std::net::UdpSocket> {
    use rustix::net::sockopt;
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    if sockopt::set_socket_recv_buffer_size_force(&socket, UDP_BUFFER).is_err() {
        let _ = socket.set_recv_buffer_size(UDP_BUFFER);
    }
    if sockopt::set_socket_send_buffer_size_force(&socket, UDP_BUFFER).is_err() {
        let _ = socket.set_send_buffer_size(UDP_BUFFER);
    }
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

pub(crate) fn bind(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nodelay(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG as i32)?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http3_sockets_get_the_receive_buffer_the_kernel_allows() {
        let s = bind_udp("127.0.0.1:0".parse().unwrap()).unwrap();
        // Linux reports twice what was set (the other half is its bookkeeping).
        let got = socket2::SockRef::from(&s).recv_buffer_size().unwrap() / 2;
        let max: usize = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0);
        // CAP_NET_ADMIN (bit 12 of the effective set) lets it past rmem_max.
        let privileged = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|t| {
                let hex = t
                    .lines()
                    .find_map(|l| l.strip_prefix("CapEff:"))?
                    .trim()
                    .to_string();
                u64::from_str_radix(&hex, 16).ok()
            })
            .is_some_and(|caps| caps & (1 << 12) != 0);
        let floor = if privileged {
            UDP_BUFFER
        } else {
            UDP_BUFFER.min(max)
        };
        assert!(got >= floor, "{got} < {floor} (rmem_max {max})");
    }
}
