//! Process start-up: bind listeners, run one single-threaded runtime per worker, drain on shutdown.

use crate::access_log::AccessLogger;
use crate::conn;
use crate::pool::Pool;
use crate::stats::Stats;
use crate::stream::ClientStream;
use portico_config::{Action, Config, Listener};
use portico_origin::Origin;
use portico_upstream::Upstream;
use socket2::{Domain, Protocol, Socket, Type};
use std::cell::Cell;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::sync::{watch, Notify};

/// A listener's immutable runtime state, shared by every worker.
pub struct ListenerState {
    pub listener: Listener,
    pub limits: portico_http1::Limits,
    /// One origin handler per route (Some for `static` and `origin` actions).
    pub origins: Vec<Option<Origin>>,
    /// Open connections on this listener across all workers.
    pub active: AtomicU32,
    /// TLS termination (the handshake runs in the connection's task).
    pub tls: Option<tokio_rustls::TlsAcceptor>,
}

/// Process-wide state shared by all workers.
pub struct Shared {
    pub config: Arc<Config>,
    pub listeners: Vec<Arc<ListenerState>>,
    pub upstreams: Vec<Arc<Upstream>>,
    pub stats: Arc<Stats>,
    pub access_log: Option<AccessLogger>,
    pub workers: usize,
}

/// State owned by one worker thread.
pub struct Worker {
    pub pool: Pool,
    /// Connections open on this worker (drain waits for zero).
    pub open: Cell<usize>,
    pub idle_notify: Notify,
}

/// Failure to start.
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
}

/// A running proxy: its bound addresses, a shutdown trigger and its counters.
pub struct Running {
    addrs: Vec<(String, SocketAddr)>,
    shutdown: watch::Sender<bool>,
    threads: Vec<JoinHandle<()>>,
    stats: Arc<Stats>,
}

impl Running {
    /// The bound address of the listener with this name (useful with port 0).
    pub fn addr(&self, name: &str) -> Option<SocketAddr> {
        self.addrs.iter().find(|(n, _)| n == name).map(|(_, a)| *a)
    }

    pub fn addrs(&self) -> &[(String, SocketAddr)] {
        &self.addrs
    }

    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// Begin a graceful shutdown: stop accepting, let in-flight requests finish.
    pub fn shutdown(&self) {
        let _ = self.shutdown.send(true);
    }

    /// Wait until every worker has drained and exited.
    pub fn wait(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

fn bind(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nodelay(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(4096)?;
    Ok(socket.into())
}

/// Bind every listener (one SO_REUSEPORT socket per worker) and start `workers` threads.
pub fn start(config: Config, workers: usize) -> Result<Running, StartError> {
    let workers = workers.max(1);
    let config = Arc::new(config);
    let stats = Arc::new(Stats::default());
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
    // sockets[worker][listener]
    let mut sockets: Vec<Vec<std::net::TcpListener>> = (0..workers).map(|_| Vec::new()).collect();
    let mut addrs = Vec::new();
    for l in &config.listeners {
        let err = |source| StartError::Bind {
            name: l.name.clone(),
            addr: l.address,
            source,
        };
        let first = bind(l.address).map_err(err)?;
        let actual = first.local_addr().map_err(err)?;
        sockets[0].push(first);
        for w in sockets.iter_mut().skip(1) {
            w.push(bind(actual).map_err(err)?);
        }
        addrs.push((l.name.clone(), actual));
    }
    let mut acceptors = Vec::new();
    for l in &config.listeners {
        acceptors.push(match &l.tls {
            Some(t) => Some(tokio_rustls::TlsAcceptor::from(
                // One Resumption per listener: a rebuilt config (reload) should reuse it.
                portico_tls::server_config(t, &portico_tls::Resumption::new()).map_err(
                    |source| StartError::Tls {
                        name: l.name.clone(),
                        source,
                    },
                )?,
            )),
            None => None,
        });
    }
    let listeners = config
        .listeners
        .iter()
        .zip(acceptors)
        .map(|(l, tls)| {
            let origins = l
                .routes
                .iter()
                .map(|r| match &r.action {
                    Action::Static(s) => Some(Origin::new(s.root.clone(), s.index.clone(), false)),
                    Action::Origin(s) => Some(Origin::new(s.root.clone(), s.index.clone(), true)),
                    _ => None,
                })
                .collect();
            Arc::new(ListenerState {
                listener: l.clone(),
                limits: portico_http1::Limits {
                    max_headers: l.limits.max_headers,
                    max_head_bytes: l.limits.max_head_bytes,
                    max_request_line: l.limits.max_request_line,
                },
                origins,
                active: AtomicU32::new(0),
                tls,
            })
        })
        .collect();
    let upstreams = config
        .upstreams
        .iter()
        .map(|g| Arc::new(Upstream::new(g.clone())))
        .collect();
    let shared = Arc::new(Shared {
        config,
        listeners,
        upstreams,
        stats: stats.clone(),
        access_log,
        workers,
    });
    let (tx, rx) = watch::channel(false);
    let mut threads = Vec::new();
    for (i, socks) in sockets.into_iter().enumerate() {
        let shared = shared.clone();
        let rx = rx.clone();
        let t = std::thread::Builder::new()
            .name(format!("portico-worker-{i}"))
            .spawn(move || worker_main(shared, socks, rx))
            .map_err(StartError::Thread)?;
        threads.push(t);
    }
    Ok(Running {
        addrs,
        shutdown: tx,
        threads,
        stats,
    })
}

fn worker_main(
    shared: Arc<Shared>,
    sockets: Vec<std::net::TcpListener>,
    shutdown: watch::Receiver<bool>,
) {
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
        let groups: Vec<_> = shared
            .config
            .upstreams
            .iter()
            .map(|g| {
                (
                    g.servers.len(),
                    g.keepalive.div_ceil(shared.workers),
                    g.idle_timeout,
                )
            })
            .collect();
        let worker = Rc::new(Worker {
            pool: Pool::new(&groups),
            open: Cell::new(0),
            idle_notify: Notify::new(),
        });
        let mut accepts = Vec::new();
        for (i, std_listener) in sockets.into_iter().enumerate() {
            let listener = match tokio::net::TcpListener::from_std(std_listener) {
                Ok(l) => l,
                Err(e) => {
                    tracing::error!("cannot register listener: {e}");
                    continue;
                }
            };
            let ls = shared.listeners[i].clone();
            accepts.push(tokio::task::spawn_local(accept_loop(
                listener,
                ls,
                shared.clone(),
                worker.clone(),
                shutdown.clone(),
            )));
        }
        // Close idle upstream connections past their idle timeout even without traffic.
        let sweeper = {
            let worker = worker.clone();
            tokio::task::spawn_local(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                loop {
                    tick.tick().await;
                    worker.pool.purge_expired();
                }
            })
        };
        for a in accepts {
            let _ = a.await;
        }
        // Draining: wait for open connections to finish, bounded by the drain timeout.
        let drain = shared.config.drain_timeout;
        let _ = tokio::time::timeout(drain, async {
            while worker.open.get() > 0 {
                worker.idle_notify.notified().await;
            }
        })
        .await;
        sweeper.abort();
        worker.pool.clear();
    });
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    ls: Arc<ListenerState>,
    shared: Arc<Shared>,
    worker: Rc<Worker>,
    mut shutdown: watch::Receiver<bool>,
) {
    let max = ls.listener.limits.max_connections;
    let mut draining = false;
    loop {
        if !draining && *shutdown.borrow() {
            draining = true;
        }
        let accepted = if draining {
            // Shutting down: take the connections the kernel already completed (closing the
            // socket would reset them), then stop. They get one response with `Connection: close`.
            match tokio::time::timeout(Duration::ZERO, listener.accept()).await {
                Ok(r) => r,
                Err(_) => return,
            }
        } else {
            tokio::select! {
                r = listener.accept() => r,
                // A change (or the sender gone) only ever means shutdown.
                _ = shutdown.changed() => {
                    draining = true;
                    continue;
                }
            }
        };
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(_) if draining => return,
            Err(e) => {
                // EMFILE and friends: back off briefly instead of spinning.
                tracing::warn!(listener = %ls.listener.name, "accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        shared
            .stats
            .connections_accepted
            .fetch_add(1, Ordering::Relaxed);
        if ls.active.fetch_add(1, Ordering::AcqRel) >= max {
            ls.active.fetch_sub(1, Ordering::AcqRel);
            shared
                .stats
                .connections_refused
                .fetch_add(1, Ordering::Relaxed);
            drop(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        worker.open.set(worker.open.get() + 1);
        let guard = OpenGuard {
            ls: ls.clone(),
            worker: worker.clone(),
        };
        let ctx = conn::Ctx {
            ls: ls.clone(),
            shared: shared.clone(),
            worker: worker.clone(),
            shutdown: shutdown.clone(),
        };
        tokio::task::spawn_local(async move {
            let stream = match &ctx.ls.tls {
                None => ClientStream::Plain(stream),
                Some(acceptor) => {
                    // The handshake counts against the head deadline of the first request.
                    let deadline = ctx.ls.listener.limits.head_timeout;
                    match tokio::time::timeout(deadline, acceptor.accept(stream)).await {
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
            conn::serve(stream, peer, ctx).await;
            drop(guard);
        });
    }
}

struct OpenGuard {
    ls: Arc<ListenerState>,
    worker: Rc<Worker>,
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.ls.active.fetch_sub(1, Ordering::AcqRel);
        self.worker.open.set(self.worker.open.get() - 1);
        if self.worker.open.get() == 0 {
            self.worker.idle_notify.notify_waiters();
        }
    }
}
