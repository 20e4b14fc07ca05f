//! Each worker's multiplexed HTTP/2 connections to the servers of `protocol = "h2"` groups: a few per server, opened on demand (h2c, or TLS with ALPN h2), one open at a time per server and worker with the requests waiting for it, stream slots leased per request.

use crate::error::ProxyError;
use crate::upstream::pool::{connect, PoolKey, UpStream};
use crate::upstream::tls::GroupTls;
use bytes::Bytes;
use h2::client::SendRequest;
use portico_http1::Limits;
use rustc_hash::FxHashMap;
use std::cell::{Cell, RefCell};
use std::future::{poll_fn, Future};
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tokio::time::timeout;

/// Streams one connection carries before another is opened, even when the server allows more.
const MAX_STREAMS: usize = 100;

/// Flow-control window of each stream (response bodies).
const STREAM_WINDOW: u32 = 256 * 1024;

/// One multiplexed connection to a server.
pub(crate) struct H2Conn {
    pub send: SendRequest<Bytes>,
    /// Streams open on it now (requests whose exchange has not ended).
    active: Cell<usize>,
    /// The server's SETTINGS_MAX_CONCURRENT_STREAMS as the driver last saw it.
    max: Rc<Cell<usize>>,
    /// Its driver ended (GOAWAY and drained, or an error), or a request saw it fail.
    pub closed: Rc<Cell<bool>>,
    idle_since: Cell<Instant>,
    /// The group's `idle_timeout` when it was opened: closed after that long without streams.
    idle_timeout: Duration,
    /// The server's first SETTINGS was read (the answer to a PING sent at open came back, and
    /// a server sends its SETTINGS before anything else), or the connection ended: whether it
    /// allows extended CONNECT (RFC 8441) is known. `settled_notify` wakes those waiting.
    settled: Rc<Cell<bool>>,
    settled_notify: Rc<tokio::sync::Notify>,
}

impl H2Conn {
    fn usable(&self, now: Instant, idle: Duration) -> bool {
        !self.closed.get()
            && (self.active.get() > 0 || now.duration_since(self.idle_since.get()) < idle)
    }

    /// Whether the server allows extended CONNECT, waiting (up to `wait`) until its first
    /// SETTINGS was read on a connection just opened. Once allowed it stays so (RFC 8441 3), so
    /// no wait then. A connection that ended first, or no answer in time, is an error: nothing
    /// is known of the server, and the connection is not used for it.
    pub(crate) async fn extended_connect(&self, wait: Duration) -> Result<bool, ProxyError> {
        if self.send.is_extended_connect_protocol_enabled() {
            return Ok(true);
        }
        if !self.settled.get() {
            let settle = async {
                loop {
                    let woken = self.settled_notify.notified();
                    if self.settled.get() {
                        return;
                    }
                    woken.await;
                }
            };
            let _ = timeout(wait, settle).await;
        }
        if self.send.is_extended_connect_protocol_enabled() {
            Ok(true)
        } else if self.closed.get() {
            Err(ProxyError::UpstreamClosed)
        } else if !self.settled.get() {
            Err(ProxyError::ResponseTimeout)
        } else {
            Ok(false)
        }
    }
}

/// Each worker's HTTP/2 connections, by server address and transport (as `pool::Pool`).
#[derive(Default)]
pub struct H2Pool {
    conns: RefCell<FxHashMap<PoolKey, Vec<Rc<H2Conn>>>>,
    /// Servers a connection is being opened to now (at most one open per server and worker):
    /// requests arriving meanwhile wait for it instead of opening one each.
    opening: RefCell<FxHashMap<PoolKey, Rc<Pending>>>,
}

/// A connection being opened, shared with the requests waiting for it.
#[derive(Default)]
struct Pending {
    /// Woken when the open ended (the connection is in the pool, or it failed).
    done: tokio::sync::Notify,
    /// How the open failed. None after a success, or when the opener gave up (its request went
    /// away): a waiter then takes over.
    failed: RefCell<Option<SharedFailure>>,
}

/// How an open that requests waited for failed: each waiter fails with the same kind of error
/// (so its status, termination cause and retry cause are those of the open), saying it was
/// another request's open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FailedAs {
    Timeout,
    Connect,
    Tls,
}

#[derive(Debug, Clone)]
struct SharedFailure {
    what: FailedAs,
    kind: io::ErrorKind,
    msg: String,
}

impl SharedFailure {
    fn of(e: &ProxyError) -> Self {
        let (what, kind) = match e {
            ProxyError::ConnectTimeout => (FailedAs::Timeout, io::ErrorKind::TimedOut),
            ProxyError::ConnectFailed(io) => (FailedAs::Connect, io.kind()),
            ProxyError::TlsHandshake(io) => (FailedAs::Tls, io.kind()),
            _ => (FailedAs::Connect, io::ErrorKind::Other),
        };
        let msg = match e {
            ProxyError::ConnectFailed(io) | ProxyError::TlsHandshake(io) => io.to_string(),
            other => other.to_string(),
        };
        SharedFailure { what, kind, msg }
    }

    /// The error of one request that waited for the open.
    fn error(&self) -> ProxyError {
        let io = || {
            io::Error::new(
                self.kind,
                format!(
                    "{} (the connection another request was opening, which this one waited for)",
                    self.msg
                ),
            )
        };
        match self.what {
            FailedAs::Timeout => ProxyError::ConnectTimeout,
            FailedAs::Connect => ProxyError::ConnectFailed(io()),
            FailedAs::Tls => ProxyError::TlsHandshake(io()),
        }
    }
}

/// Marks a connection being opened; wakes the requests waiting for it when dropped.
pub(crate) struct Opening<'a> {
    pool: &'a H2Pool,
    key: PoolKey,
    pending: Rc<Pending>,
}

impl Opening<'_> {
    /// The open failed with `e`: the waiters fail with the same cause instead of each trying
    /// again (the server was just found unreachable). Their failure is a connect failure of
    /// that server for the route's retry policy too, which then excludes it as it does for the
    /// opener: the open it would try next is the one that just failed.
    pub(crate) fn failed(&self, e: &ProxyError) {
        *self.pending.failed.borrow_mut() = Some(SharedFailure::of(e));
    }
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        let mut map = self.pool.opening.borrow_mut();
        if map
            .get(&self.key)
            .is_some_and(|p| Rc::ptr_eq(p, &self.pending))
        {
            map.remove(&self.key);
        }
        drop(map);
        self.pending.done.notify_waiters();
    }
}

/// What a request gets from the pool.
pub(crate) enum Slot<'a> {
    /// A stream slot on an open connection.
    Leased(Lease),
    /// No connection with room and none being opened: the caller opens one (it is marked as
    /// being opened until this is dropped).
    Open(Opening<'a>),
    /// The connection being opened that the request waited for failed (already reported to
    /// the passive checks by its opener), or none was ready within the wait.
    Failed(ProxyError),
}

/// A stream slot on a connection, freed on drop.
pub(crate) struct Lease(pub(crate) Rc<H2Conn>);

impl Lease {
    fn new(c: Rc<H2Conn>) -> Self {
        c.active.set(c.active.get() + 1);
        Lease(c)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let n = self.0.active.get().saturating_sub(1);
        self.0.active.set(n);
        if n == 0 {
            self.0.idle_since.set(Instant::now());
        }
    }
}

impl H2Pool {
    /// A slot on an open connection with room other than `avoid`, dropping closed connections
    /// and those idle past `idle`.
    fn take(&self, key: PoolKey, idle: Duration, avoid: Option<&Rc<H2Conn>>) -> Option<Lease> {
        let mut map = self.conns.borrow_mut();
        let list = map.get_mut(&key)?;
        let now = Instant::now();
        list.retain(|c| c.usable(now, idle));
        let c = list.iter().find(|c| {
            c.active.get() < c.max.get().clamp(1, MAX_STREAMS)
                && avoid.is_none_or(|a| !Rc::ptr_eq(a, c))
        })?;
        Some(Lease::new(c.clone()))
    }

    pub(crate) fn add(&self, key: PoolKey, c: Rc<H2Conn>) -> Lease {
        self.conns
            .borrow_mut()
            .entry(key)
            .or_default()
            .push(c.clone());
        Lease::new(c)
    }

    /// A slot on a connection (not `avoid`), waiting (up to `wait` in all) while a connection
    /// to the same server is being opened. Checking for a marker and setting one happen with no
    /// await in between, so one request at a time opens a connection to a server (per worker);
    /// every waiter is woken when that open ends and takes a slot on it, opens the next one
    /// when it has no room (or its opener went away), or fails with it.
    pub(crate) async fn slot(
        &self,
        key: PoolKey,
        idle: Duration,
        wait: Duration,
        avoid: Option<&Rc<H2Conn>>,
    ) -> Slot<'_> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(l) = self.take(key, idle, avoid) {
                return Slot::Leased(l);
            }
            let pending = self.opening.borrow().get(&key).cloned();
            let Some(p) = pending else {
                let pending = Rc::new(Pending::default());
                self.opening.borrow_mut().insert(key, pending.clone());
                return Slot::Open(Opening {
                    pool: self,
                    key,
                    pending,
                });
            };
            if tokio::time::timeout_at(deadline, p.done.notified())
                .await
                .is_err()
            {
                return Slot::Failed(ProxyError::ConnectTimeout);
            }
            let failed = p.failed.borrow().as_ref().map(SharedFailure::error);
            if let Some(e) = failed {
                tracing::debug!(
                    server = %key.addr,
                    "the connection to the server this request waited for failed: {e}"
                );
                return Slot::Failed(e);
            }
        }
    }

    /// Drop closed connections and those idle past their idle timeout (the worker's sweeper
    /// calls this every second, so servers no request goes to any more are let go too).
    pub fn purge_expired(&self) {
        let now = Instant::now();
        let mut map = self.conns.borrow_mut();
        map.retain(|_, list| {
            list.retain(|c| c.usable(now, c.idle_timeout));
            !list.is_empty()
        });
    }

    /// Drop every connection (their drivers end once their streams have).
    pub fn clear(&self) {
        self.conns.borrow_mut().clear();
    }

    /// Connections open (for tests and stats).
    pub fn len(&self) -> usize {
        self.conns.borrow().values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Open a connection: TCP (and TLS with ALPN h2) and the HTTP/2 preface, all under `t`; its
/// driver runs as a local task of the worker.
pub(crate) async fn open(
    addr: SocketAddr,
    t: Duration,
    idle: Duration,
    tls: Option<&GroupTls>,
) -> Result<(Rc<H2Conn>, Duration), ProxyError> {
    let begun = Instant::now();
    let (up, _) = connect(addr, t, tls, None).await?;
    let stream = up.stream;
    if let UpStream::Tls(s) = &stream {
        if s.get_ref().1.alpn_protocol() != Some(b"h2") {
            return Err(ProxyError::TlsHandshake(io::Error::other(
                "the server did not select ALPN h2",
            )));
        }
    }
    let left = t.saturating_sub(begun.elapsed());
    let handshake = h2::client::Builder::new()
        // Per stream 256 KiB, and room for every stream at once on the connection: a few slow
        // clients can never use up the connection window of the streams sharing it.
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(STREAM_WINDOW * MAX_STREAMS as u32)
        // Nothing here would read pushed streams.
        .enable_push(false)
        // Response header blocks are bounded as HTTP/1 response heads are.
        .max_header_list_size(Limits::default().max_head_bytes as u32)
        .handshake::<_, Bytes>(stream);
    let (send, mut connection) = match timeout(left, handshake).await {
        Err(_) => return Err(ProxyError::ConnectTimeout),
        Ok(Err(e)) => return Err(ProxyError::ConnectFailed(io::Error::other(e))),
        Ok(Ok(pair)) => pair,
    };
    let max = Rc::new(Cell::new(MAX_STREAMS));
    let closed = Rc::new(Cell::new(false));
    let settled = Rc::new(Cell::new(false));
    let settled_notify = Rc::new(tokio::sync::Notify::new());
    let ping = connection.ping_pong();
    let (m, c) = (max.clone(), closed.clone());
    let (s, n) = (settled.clone(), settled_notify.clone());
    tokio::task::spawn_local(async move {
        let settle = |s: &Cell<bool>, n: &tokio::sync::Notify| {
            s.set(true);
            n.notify_waiters();
        };
        let drive = poll_fn(|cx| {
            let r = std::pin::Pin::new(&mut connection).poll(cx);
            m.set(connection.max_concurrent_send_streams());
            r
        });
        // One PING at open: its answer comes after the server's SETTINGS (RFC 9113 3.4), so
        // once it is back, extended CONNECT's setting is known (`H2Conn::extended_connect`).
        let pinged = async {
            if let Some(mut p) = ping {
                let _ = p.ping(h2::Ping::opaque()).await;
            }
        };
        tokio::pin!(drive, pinged);
        let mut answered = false;
        let r = loop {
            tokio::select! {
                r = &mut drive => break r,
                () = &mut pinged, if !answered => {
                    answered = true;
                    settle(&s, &n);
                }
            }
        };
        c.set(true);
        settle(&s, &n);
        if let Err(e) = r {
            tracing::debug!(server = %addr, "upstream HTTP/2 connection ended: {e}");
        }
    });
    let conn = H2Conn {
        send,
        active: Cell::new(0),
        max,
        closed,
        idle_since: Cell::new(Instant::now()),
        idle_timeout: idle,
        settled,
        settled_notify,
    };
    Ok((Rc::new(conn), begun.elapsed()))
}

#[cfg(test)]
mod tests {
    use super::{H2Pool, Slot};
    use crate::error::ProxyError;
    use crate::telemetry::stats::{Cause, Phase};
    use crate::upstream::pool::PoolKey;
    use std::cell::RefCell;
    use std::rc::Rc;
    use std::time::Duration;

    /// What a request waiting in [`H2Pool::slot`] got; `Open` holds the marker until `release`.
    #[derive(Debug, PartialEq)]
    enum Got {
        Open,
        /// The termination cause and the error's text.
        Failed(Cause, String),
    }

    const KEY: PoolKey = PoolKey {
        addr: std::net::SocketAddr::V4(std::net::SocketAddrV4::new(
            std::net::Ipv4Addr::LOCALHOST,
            9,
        )),
        tls: 0,
        proxy: 0,
    };

    /// A request asking `pool` for a slot as a local task; an opener keeps its marker until
    /// `release` is notified, then drops it after marking it failed when `fail`.
    fn waiter(
        pool: &Rc<H2Pool>,
        log: &Rc<RefCell<Vec<(usize, Got)>>>,
        id: usize,
        release: &Rc<tokio::sync::Notify>,
        fail: Option<fn() -> ProxyError>,
    ) -> tokio::task::JoinHandle<()> {
        let (pool, log, release) = (pool.clone(), log.clone(), release.clone());
        tokio::task::spawn_local(async move {
            let slot = pool.slot(KEY, Duration::from_secs(60), Duration::from_secs(30), None);
            match slot.await {
                Slot::Open(opening) => {
                    log.borrow_mut().push((id, Got::Open));
                    release.notified().await;
                    if let Some(e) = fail {
                        opening.failed(&e());
                    }
                }
                Slot::Failed(e) => {
                    let cause = e.termination(Phase::Connect).cause;
                    log.borrow_mut()
                        .push((id, Got::Failed(cause, e.to_string())))
                }
                Slot::Leased(_) => unreachable!("no connection was added"),
            }
        })
    }

    /// Let every local task run until it waits.
    async fn settle() {
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn one_open_per_server_and_its_failure_reaches_every_waiter() {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let pool = Rc::new(H2Pool::default());
                let log = Rc::new(RefCell::new(Vec::new()));
                let release = Rc::new(tokio::sync::Notify::new());
                let tasks: Vec<_> = (0..4)
                    .map(|i| {
                        waiter(
                            &pool,
                            &log,
                            i,
                            &release,
                            Some(|| ProxyError::ConnectTimeout),
                        )
                    })
                    .collect();
                settle().await;
                // One request opens, the others wait for it.
                assert_eq!(*log.borrow(), vec![(0, Got::Open)]);
                release.notify_waiters();
                for t in tasks {
                    tokio::time::timeout(Duration::from_secs(5), t)
                        .await
                        .expect("no waiter is lost")
                        .unwrap();
                }
                // Its failure fails them all at once: no second open.
                let got = log.borrow();
                assert_eq!(got.iter().filter(|(_, g)| *g == Got::Open).count(), 1);
                assert_eq!(got.len(), 4);
                for (_, g) in &got[1..] {
                    assert_eq!(
                        *g,
                        Got::Failed(Cause::Timeout, "upstream connect timed out".into())
                    );
                }
                assert!(pool.opening.borrow().is_empty());
            })
            .await;
    }

    /// Waiters fail with the cause of the open they waited for (not a timeout, not a generic
    /// connect failure), and their error says it was another request's open.
    async fn waiters_get(fail: fn() -> ProxyError) -> Vec<(usize, Got)> {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let pool = Rc::new(H2Pool::default());
                let log = Rc::new(RefCell::new(Vec::new()));
                let release = Rc::new(tokio::sync::Notify::new());
                let tasks: Vec<_> = (0..3)
                    .map(|i| waiter(&pool, &log, i, &release, Some(fail)))
                    .collect();
                settle().await;
                release.notify_waiters();
                for t in tasks {
                    tokio::time::timeout(Duration::from_secs(5), t)
                        .await
                        .expect("no waiter is lost")
                        .unwrap();
                }
                log.take()
            })
            .await
    }

    #[tokio::test]
    async fn waiters_fail_with_the_cause_of_the_open_they_waited_for() {
        let shared = "(the connection another request was opening, which this one waited for)";
        let got = waiters_get(|| {
            ProxyError::ConnectFailed(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "refused",
            ))
        })
        .await;
        assert_eq!(got[0], (0, Got::Open));
        for (_, g) in &got[1..] {
            let text = format!("upstream connect failed: refused {shared}");
            assert_eq!(*g, Got::Failed(Cause::Refused, text));
        }
        let got = waiters_get(|| {
            ProxyError::TlsHandshake(std::io::Error::other("the server did not select ALPN h2"))
        })
        .await;
        assert_eq!(got.len(), 3);
        for (_, g) in &got[1..] {
            let text = format!(
                "TLS handshake with the upstream failed: the server did not select ALPN h2 {shared}"
            );
            assert_eq!(*g, Got::Failed(Cause::Tls, text));
        }
    }

    #[tokio::test]
    async fn an_opener_that_gives_up_hands_over_to_one_waiter() {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let pool = Rc::new(H2Pool::default());
                let log = Rc::new(RefCell::new(Vec::new()));
                let release = Rc::new(tokio::sync::Notify::new());
                let tasks: Vec<_> = (0..3)
                    .map(|i| waiter(&pool, &log, i, &release, None))
                    .collect();
                settle().await;
                assert_eq!(*log.borrow(), vec![(0, Got::Open)]);
                // Each opener goes away without a connection (its request ended): exactly one
                // waiter takes over each time, and every waiter gets its turn.
                for n in 2..=3 {
                    release.notify_waiters();
                    settle().await;
                    assert_eq!(log.borrow().len(), n, "{:?}", log.borrow());
                    assert!(log.borrow().iter().all(|(_, g)| *g == Got::Open));
                }
                release.notify_waiters();
                for t in tasks {
                    tokio::time::timeout(Duration::from_secs(5), t)
                        .await
                        .expect("no waiter is lost")
                        .unwrap();
                }
                assert!(pool.opening.borrow().is_empty());
            })
            .await;
    }
}
