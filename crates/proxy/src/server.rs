//! Process start-up: one single-threaded runtime per worker, their accept loops and lag probes, the certificate watcher, the admin listener, drain on shutdown.

use crate::admin::AdminServer;
use crate::conn;
use crate::control::{Cmd, Control, ReloadSummary, StartError, BACKLOG};
use crate::state::{ListenerSlot, Snapshot, Worker};
use crate::stream::ClientStream;
use crate::telemetry::stats::Stats;
use crate::upstream::pool::Pool;
use portico_config::Config;
use portico_upstream::Upstream;
use std::cell::{Cell, RefCell};
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Notify};

/// A running proxy: its control plane, the worker threads, the admin listener.
pub struct Running {
    control: Arc<Control>,
    threads: Vec<JoinHandle<()>>,
    admin: Option<AdminServer>,
    /// Polls the files of TLS listeners with `watch` on.
    watcher: Option<CertWatcher>,
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

    /// A successor serves on this process's sockets: the admin listener stops now (the
    /// successor answers it: changes must reach the process that stays), and draining accept
    /// loops leave the backlogs to the successor.
    pub fn handed_over(&mut self) {
        self.control.handed_over();
        if let Some(a) = self.admin.take() {
            a.stop();
        }
    }

    /// What a successor needs from this process (see [`crate::handover`]), for another thread.
    pub fn successor(&self) -> std::io::Result<Successor> {
        let admin = self.admin.as_ref().map(AdminServer::socket);
        Ok(Successor {
            control: self.control.clone(),
            admin: admin.map(|a| a.try_clone_to_owned()).transpose()?,
        })
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
        // Files of responses removed lately are deleted before the process goes (else a
        // restart would find them again).
        if let Some(cache) = &self.control.snapshot().cache {
            cache.settle();
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

/// Hands this process's listening sockets to a successor (a binary upgrade).
pub struct Successor {
    control: Arc<Control>,
    admin: Option<std::os::fd::OwnedFd>,
}

impl Successor {
    /// Send every listening socket to the successor connected on `to`; this process keeps
    /// serving until it is told to stop.
    pub fn hand_over(&self, to: &mut std::os::unix::net::UnixStream) -> std::io::Result<()> {
        use std::os::fd::AsFd;
        let admin = self.admin.as_ref().map(|a| a.as_fd());
        self.control
            .with_sockets(|listeners| crate::handover::send(to, listeners, admin))
    }
}

/// Start `workers` threads and apply `config` (bind every listener, one SO_REUSEPORT socket per
/// worker).
pub fn start(config: Config, workers: usize) -> Result<Running, StartError> {
    start_with(config, workers, None)
}

/// [`start`], with the listening sockets of a predecessor (a binary upgrade, see
/// [`crate::handover`]): listeners and the admin listener it had go on accepting on them.
pub fn start_with(
    config: Config,
    workers: usize,
    inherited: Option<crate::handover::Inherited>,
) -> Result<Running, StartError> {
    portico_tls::install_default_provider();
    let workers = workers.max(1);
    let (control, receivers) = Control::new(config.drain_timeout, workers);
    let mut inherited = inherited;
    let admin_socket = match (&mut inherited, &config.admin) {
        (Some(i), Some(a)) => i.take_admin(a.address),
        _ => None,
    };
    control.lock().inherited = inherited;
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
    control.load_runtime_changes(admin.as_ref().and_then(|a| a.state_file.as_deref()));
    if let Err(e) = control.apply(config) {
        running.shutdown();
        running.wait();
        return Err(e);
    }
    match CertWatcher::start(Arc::downgrade(&control)) {
        Ok(w) => running.watcher = Some(w),
        Err(e) => tracing::warn!("certificate files will not be watched (a reload re-reads them): cannot start the watcher thread: {e}"),
    }
    if let Some(cfg) = admin {
        match AdminServer::start(control, &cfg, admin_socket) {
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
            snapshot: RefCell::new(Snapshot::new(control.published.current.load_full())),
            published: control.published.clone(),
            load: crate::resilience::load::WorkerLoad::default(),
        });
        let loops: Rc<RefCell<Vec<tokio::task::JoinHandle<()>>>> = Rc::default();
        let listen = {
            let (worker, loops) = (worker.clone(), loops.clone());
            tokio::task::spawn_local(async move {
                while let Some(cmd) = commands.recv().await {
                    let task = match cmd {
                        Cmd::Listen(slot, socket) => {
                            match listening(socket) {
                                Ok((l, each)) => tokio::task::spawn_local(accept_loop(l, each, slot, worker.clone())),
                                Err(e) => {
                                    tracing::error!(listener = %slot.name, "cannot register listener: {e}");
                                    continue;
                                }
                            }
                        }
                        Cmd::ListenQuic(slot, socket) => {
                            let shared = worker.snapshot();
                            let endpoint = match shared.listener(slot.id) {
                                Some(ls) => crate::serve::h3::endpoint(socket, ls),
                                None => continue,
                            };
                            match endpoint {
                                Ok(e) => tokio::task::spawn_local(crate::serve::h3::accept_loop(
                                    e,
                                    slot,
                                    worker.clone(),
                                )),
                                Err(e) => {
                                    tracing::error!(listener = %slot.name, "cannot serve HTTP/3: {e}");
                                    continue;
                                }
                            }
                        }
                    };
                    let mut loops = loops.borrow_mut();
                    loops.retain(|h| !h.is_finished());
                    loops.push(task);
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
        let prober = tokio::task::spawn_local(probe(worker.clone()));
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
        worker.load.reset(&control.stats);
        worker.pool.clear();
        worker.h2pool.clear();
    });
}

/// A listening socket registered with this worker's runtime, with TCP_NODELAY set on it: Linux
/// copies it to each connection when its handshake completes, which saves a system call per
/// accepted connection. True when each accepted connection must still set it itself: off Linux,
/// or when the socket came without it (from a service manager), since connections already in
/// its backlog were copied the option unset.
fn listening(socket: std::net::TcpListener) -> std::io::Result<(tokio::net::TcpListener, bool)> {
    let s = socket2::SockRef::from(&socket);
    let had = s.nodelay().unwrap_or(false);
    let set = s.set_nodelay(true).is_ok();
    let each = !cfg!(target_os = "linux") || !had || !set;
    Ok((tokio::net::TcpListener::from_std(socket)?, each))
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    nodelay_each: bool,
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
            // A successor accepts on these sockets: the backlog is its.
            if worker.published.handed_over.load(Ordering::Acquire) {
                return;
            }
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
                crate::telemetry::logging::log_limited!(warn, listener = %slot.name, "accept failed: {e}");
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
        // Otherwise the listening socket's TCP_NODELAY was copied to it (see `listening`).
        if nodelay_each {
            let _ = stream.set_nodelay(true);
        }
        let guard = crate::state::OpenGuard::new(slot.clone(), worker.clone(), client);
        let ctx = conn::Ctx {
            ls,
            shared,
            worker: worker.clone(),
            shutdown: slot.stop.subscribe(),
        };
        // Bound here, not in the task: the future then holds each once.
        let (mut stream, mut peer) = (stream, peer);
        tokio::task::spawn_local(async move {
            if ctx.ls.listener.proxy_protocol {
                // Boxed: only these listeners' connections carry the reader's state.
                let within = ctx.ls.listener.limits.head_timeout;
                match Box::pin(crate::proxy_header::read(&mut stream, within)).await {
                    Ok(portico_http1::proxy_protocol::Header::Proxied { source, .. }) => {
                        let trusted = &ctx.ls.listener.trusted_proxies;
                        if trusted.is_empty() || trusted.covers(peer.ip()) {
                            peer = source;
                        }
                    }
                    Ok(portico_http1::proxy_protocol::Header::Local) => {}
                    Err(e) => {
                        ctx.shared
                            .stats
                            .proxy_protocol_errors
                            .fetch_add(1, Ordering::Relaxed);
                        crate::telemetry::logging::log_limited!(info, %peer, listener = %ctx.ls.listener.name, "connection closed: {e}");
                        return;
                    }
                }
            }
            let stream = match &ctx.ls.tls {
                None => ClientStream::Plain(stream),
                Some(tls) => {
                    let acceptor = tls.acceptor();
                    // The handshake counts against the head deadline of the first request.
                    let deadline = ctx.ls.listener.limits.head_timeout;
                    // Plain HTTP on a TLS port is told so (as nginx does), not cut silently.
                    if Box::pin(crate::plain_on_tls::answer_if_plain(&mut stream, deadline)).await {
                        ctx.shared
                            .stats
                            .tls_handshake_failures
                            .fetch_add(1, Ordering::Relaxed);
                        crate::telemetry::logging::log_limited!(debug, %peer, listener = %ctx.ls.listener.name, "plain HTTP on a TLS listener: answered 400");
                        return;
                    }
                    // Boxed: the handshake's state is freed once it is done.
                    let accept = Box::pin(acceptor.accept(portico_tls::Tcp(stream)));
                    match tokio::time::timeout(deadline, accept).await {
                        Ok(Ok(tls)) => {
                            ctx.shared.stats.count_handshake(tls.get_ref().1);
                            // An ACME server's TLS-ALPN-01 validation: the handshake was the
                            // answer; nothing follows (RFC 8737 3).
                            if tls.get_ref().1.alpn_protocol() == Some(portico_tls::acme::ALPN) {
                                tracing::info!(%peer, listener = %ctx.ls.listener.name, "acme: TLS-ALPN-01 challenge answered");
                                return;
                            }
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
            crate::serve::h2::dispatch(stream, peer, ctx).await;
            drop(guard);
        });
    }
}

/// The worker's lag probe: while a listener of the current snapshot sheds, sample how late a
/// [`PROBE`] timer fires and feed the [`Shedder`]s. Runs until the worker aborts it.
async fn probe(worker: Rc<Worker>) {
    let mut listeners = Vec::new();
    loop {
        let snapshot = worker.snapshot();
        listeners.clear();
        listeners.extend(
            snapshot
                .listeners
                .iter()
                .filter_map(|l| l.listener.shed.map(|s| (l.slot, s))),
        );
        if listeners.is_empty() {
            worker.load.reset(&snapshot.stats);
            drop(snapshot);
            tokio::time::sleep(crate::resilience::load::IDLE_CHECK).await;
            continue;
        }
        let deadline = tokio::time::Instant::now() + crate::resilience::load::PROBE;
        if let Some(stall) = worker.published.simulated_stall() {
            // Testing aid: hold the thread as a CPU-bound burst would, then let other tasks run.
            std::thread::sleep(stall);
            tokio::task::yield_now().await;
        }
        tokio::time::sleep_until(deadline).await;
        let now = tokio::time::Instant::now();
        let lag = now.saturating_duration_since(deadline);
        worker
            .load
            .observe(&listeners, lag, now.into_std(), &snapshot.stats);
    }
}

/// The thread `portico-watch`: checks the watched listeners of the current configuration when
/// their interval is due, and the JWK sets and htpasswd files of its routes (file reads and
/// fetches stay off the workers). Stops when dropped or when the
/// control plane is gone.
pub struct CertWatcher {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl CertWatcher {
    pub fn start(control: Weak<Control>) -> io::Result<CertWatcher> {
        let (stop, rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("portico-watch".into())
            .spawn(move || loop {
                let Some(control) = control.upgrade() else {
                    return;
                };
                let shared = control.snapshot();
                let now = Instant::now();
                // A JWK set URL is fetched here too (within its timeout): file reads and
                // fetches stay off the workers.
                let sources = shared
                    .listeners
                    .iter()
                    .flat_map(|l| l.filters.iter())
                    .filter_map(|f| f.check_sources(now, &shared.stats));
                let wait = shared
                    .listeners
                    .iter()
                    .filter_map(|l| l.tls.as_ref()?.check(now, &shared.stats))
                    .chain(sources)
                    .fold(crate::cert_watch::MAX_TICK, Duration::min);
                drop(shared);
                drop(control);
                match rx.recv_timeout(wait) {
                    Err(RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
            })?;
        Ok(CertWatcher {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for CertWatcher {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The soft limit on open files raised to the hard limit (as Go's runtime does at start): a
/// proxy holds two descriptors per proxied connection, and the response cache one per large
/// stored body. Returns the limit before and after; unchanged when it cannot be read or set.
pub fn raise_open_files_limit() -> (Option<u64>, Option<u64>) {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let before = getrlimit(Resource::Nofile);
    if before.current < before.maximum {
        let raised = Rlimit {
            current: before.maximum,
            maximum: before.maximum,
        };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            return (before.current, before.maximum);
        }
    }
    (before.current, before.current)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Connections accepted from a listener with TCP_NODELAY get it without a call of their own
    /// (on Linux); a listener that came without it (as a service manager may pass one) has its
    /// connections set it each, since those in its backlog were copied the option unset.
    #[tokio::test]
    async fn accepted_connections_have_nodelay() {
        let bound = crate::control::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let (listener, each) = listening(bound).unwrap();
        assert_eq!(each, !cfg!(target_os = "linux"));
        let _client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        assert!(accepted.nodelay().unwrap());
        // Without it: a connection already queued was copied the option unset.
        let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        socket.set_nonblocking(true).unwrap();
        let queued = std::net::TcpStream::connect(socket.local_addr().unwrap()).unwrap();
        let (listener, each) = listening(socket).unwrap();
        assert!(each);
        let (accepted, _) = listener.accept().await.unwrap();
        assert!(
            !accepted.nodelay().unwrap(),
            "the backlog's connection kept Nagle"
        );
        drop(queued);
    }
}
