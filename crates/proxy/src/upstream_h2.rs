//! Upstream HTTP/2 (`protocol = "h2"` groups): per worker and server a few multiplexed `h2` client connections (h2c, or TLS with ALPN h2) opened on demand, and one request exchanged over them for HTTP/1.1 and HTTP/2 clients.

use crate::attempt::{failure_report, Exchanged, Picked, UpResponse};
use crate::downstream::{Client, Env, Interim, Interims, Upload};
use crate::error::ProxyError;
use crate::forward::connect;
use crate::h2_fields::{append, DROPPED};
use crate::h2_io::{send_windowed, up_err, Peer};
use crate::pool::{PoolKey, UpStream};
use crate::retry::{Retry, RetryCause};
use crate::server::{Shared, Worker};
use crate::stats::{Phase, Stats};
use crate::upstream_tls::GroupTls;
use bytes::{Bytes, BytesMut};
use h2::client::{ResponseFuture, SendRequest};
use h2::{RecvStream, SendStream};
use http::header::HeaderValue;
use portico_config::UpstreamGroup;
use portico_http1::{parse_request, Limits, RequestHead};
use portico_upstream::Report;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::time::timeout;

/// Streams one connection carries before another is opened, even when the server allows more.
const MAX_STREAMS: usize = 100;

/// Flow-control window of each stream (response bodies).
const STREAM_WINDOW: u32 = 256 * 1024;

/// Far-away deadline while a request body is still streaming.
const FAR: Duration = Duration::from_secs(365 * 24 * 3600);

/// One multiplexed connection to a server.
struct H2Conn {
    send: SendRequest<Bytes>,
    /// Streams open on it now (requests whose exchange has not ended).
    active: Cell<usize>,
    /// The server's SETTINGS_MAX_CONCURRENT_STREAMS as the driver last saw it.
    max: Rc<Cell<usize>>,
    /// Its driver ended (GOAWAY and drained, or an error), or a request saw it fail.
    closed: Rc<Cell<bool>>,
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
    async fn extended_connect(&self, wait: Duration) -> Result<bool, ProxyError> {
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
    conns: RefCell<HashMap<PoolKey, Vec<Rc<H2Conn>>>>,
    /// Servers a connection is being opened to now (at most one open per server and worker):
    /// requests arriving meanwhile wait for it instead of opening one each.
    opening: RefCell<HashMap<PoolKey, Rc<Pending>>>,
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
struct Opening<'a> {
    pool: &'a H2Pool,
    key: PoolKey,
    pending: Rc<Pending>,
}

impl Opening<'_> {
    /// The open failed with `e`: the waiters fail with the same cause instead of each trying
    /// again (the server was just found unreachable). Their failure is a connect failure of
    /// that server for the route's retry policy too, which then excludes it as it does for the
    /// opener: the open it would try next is the one that just failed.
    fn failed(&self, e: &ProxyError) {
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
enum Slot<'a> {
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
pub(crate) struct Lease(Rc<H2Conn>);

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

    fn add(&self, key: PoolKey, c: Rc<H2Conn>) -> Lease {
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
    async fn slot(
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
async fn open(
    addr: SocketAddr,
    t: Duration,
    idle: Duration,
    tls: Option<&GroupTls>,
) -> Result<(Rc<H2Conn>, Duration), ProxyError> {
    let begun = Instant::now();
    let (up, _) = connect(addr, t, tls).await?;
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

/// How an exchange failed, and whether the server surely did not process it.
struct Failure {
    e: ProxyError,
    phase: Phase,
    /// Refused before processing (GOAWAY below its id, REFUSED_STREAM, a dead connection
    /// before the request left): safe to send again on another connection.
    refused: bool,
    /// Only this stream was reset (RST_STREAM): the connection stays usable.
    stream_only: bool,
}

impl Failure {
    /// A failure that says nothing about the connection.
    fn plain(e: ProxyError, phase: Phase) -> Self {
        Failure {
            e,
            phase,
            refused: false,
            stream_only: false,
        }
    }
}

fn is_refusal(e: &h2::Error) -> bool {
    e.is_go_away() || e.reason() == Some(h2::Reason::REFUSED_STREAM)
}

/// The HTTP/2 request for the forwarded HTTP/1 head `ubuf` (built by
/// `headers::upstream_request`): `:authority` from its Host, connection-specific fields dropped,
/// `te: trailers` when the client asked for trailers.
fn build_request(
    ubuf: &[u8],
    client: &RequestHead,
    https: bool,
    addr: SocketAddr,
) -> Result<http::Request<()>, ProxyError> {
    let mut buf = BytesMut::from(ubuf);
    let limits = Limits {
        max_head_bytes: ubuf.len() + 1,
        ..Limits::default()
    };
    let head = match parse_request(&mut buf, &limits) {
        Ok(Some(h)) => h,
        _ => return Err(ProxyError::Internal("forwarded head did not parse")),
    };
    let authority = match head.field("host") {
        Some(h) if !h.is_empty() => String::from_utf8_lossy(h).into_owned(),
        _ => addr.to_string(),
    };
    let uri = http::Uri::builder()
        .scheme(if https { "https" } else { "http" })
        .authority(authority.as_str())
        .path_and_query(head.target())
        .build()
        .map_err(|_| ProxyError::Internal("forwarded target is not a valid URI"))?;
    let method = http::Method::from_bytes(head.method().as_str().as_bytes())
        .map_err(|_| ProxyError::Internal("forwarded method is not valid"))?;
    let mut req = http::Request::new(());
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.version_mut() = http::Version::HTTP_2;
    let map = req.headers_mut();
    for (name, value) in head.fields() {
        if DROPPED.iter().any(|d| d.eq_ignore_ascii_case(name)) {
            continue;
        }
        append(map, name, value);
    }
    let wants_trailers = client.field("te").is_some_and(|v| {
        v.split(|&b| b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"trailers"))
    });
    if wants_trailers {
        map.insert(http::header::TE, HeaderValue::from_static("trailers"));
    }
    Ok(req)
}

/// The HTTP/2 request of a WebSocket opening handshake as an extended CONNECT (RFC 8441 4):
/// `:method CONNECT`, `:protocol websocket`, `:scheme`, `:path` and `:authority` as for any
/// request; the proxy's `sec-websocket-key` dropped (HTTP/2 has none), the client's other
/// `sec-websocket-*` fields kept.
fn extended_connect(mut req: http::Request<()>) -> http::Request<()> {
    *req.method_mut() = http::Method::CONNECT;
    req.headers_mut().remove("sec-websocket-key");
    req.extensions_mut()
        .insert(h2::ext::Protocol::from_static("websocket"));
    req
}

/// How a failure of the response head (or of the stream before it) is classified.
fn head_failure(e: h2::Error) -> Failure {
    Failure {
        refused: is_refusal(&e),
        stream_only: e.is_reset() && !e.is_go_away(),
        e: up_err(e),
        phase: Phase::ResponseHead,
    }
}

/// One response head of an HTTP/2 upstream.
enum Head {
    /// An informational (1xx) response.
    Interim(http::Response<()>),
    /// The final response.
    Final(http::Response<RecvStream>),
}

/// The next response head of `resp`: an interim (1xx) response, taken before the final head
/// each time the stream is polled (`h2` would otherwise skip them), or the final one.
/// Cancel-safe: a new one is made for each head.
async fn response_head(resp: &mut ResponseFuture) -> Result<Head, Failure> {
    poll_fn(|cx| {
        match resp.poll_informational(cx) {
            Poll::Ready(Some(Ok(r))) => return Poll::Ready(Ok(Head::Interim(r))),
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(head_failure(e))),
            Poll::Ready(None) | Poll::Pending => {}
        }
        Pin::new(&mut *resp)
            .poll(cx)
            .map(|r| r.map(Head::Final).map_err(head_failure))
    })
    .await
}

/// Count one interim response of the exchange and pass it on (see `Interims`); more than
/// `MAX_INTERIM` fails the stream, a failed client write fails the request. With `down` (no
/// upload reads the client), an HTTP/1.1 client's head is written at once. Callers box it:
/// interim responses are rare, and its state (a client write) would otherwise widen every
/// exchange's future.
async fn pass_interim<'a, D: Client<'a>>(
    interims: &mut Interims<'a>,
    r: http::Response<()>,
    down: Option<&mut D>,
) -> Result<(), Failure> {
    // Either failure is this stream's only: the connection stays usable.
    let stream_only = |e| Failure {
        stream_only: true,
        ..Failure::plain(e, Phase::ResponseHead)
    };
    interims.hold(Interim::H2(r)).map_err(stream_only)?;
    if let Some(down) = down {
        let flushed = down.flush_interims(interims).await;
        flushed.map_err(|e| stream_only(ProxyError::ClientIo(e)))?;
    }
    Ok(())
}

/// Send the request on `conn`, stream its body while waiting for the response head; return
/// the head and whether the body was completely sent. Interim responses go to `interim` as
/// they arrive.
#[allow(clippy::too_many_arguments)]
async fn exchange<'a, D: Client<'a>>(
    conn: &H2Conn,
    req: http::Request<()>,
    src: &mut Upload,
    down: &mut D,
    header_timeout: Duration,
    idle: Duration,
    finish: bool,
    interim: &mut Interims<'a>,
) -> Result<(http::Response<RecvStream>, SendStream<Bytes>, bool), Failure> {
    let refused = |e: ProxyError| Failure {
        refused: true,
        ..Failure::plain(e, Phase::ResponseHead)
    };
    let ready = match timeout(header_timeout, conn.send.clone().ready()).await {
        Err(_) => return Err(refused(ProxyError::ResponseTimeout)),
        Ok(Err(e)) => return Err(refused(up_err(e))),
        Ok(Ok(r)) => r,
    };
    // The response head is due `header_timeout` after this, a wait for SETTINGS included.
    let asked = tokio::time::Instant::now();
    // RFC 8441 3: `:protocol` only to a server that allows it. A connection that closed or
    // stayed silent before its SETTINGS refused nothing yet: the request may go elsewhere.
    if src.is_tunnel() {
        match conn.extended_connect(header_timeout).await {
            Ok(true) => {}
            Ok(false) => {
                let e = ProxyError::ExtendedConnect("the server does not allow extended CONNECT");
                return Err(Failure::plain(e, Phase::RequestHead));
            }
            Err(e) => return Err(refused(e)),
        }
    }
    let mut ready = ready;
    let (mut resp, mut send) = ready
        .send_request(req, src.is_none())
        .map_err(|e| refused(up_err(e)))?;
    if src.headless() {
        let mut deadline = asked + header_timeout;
        loop {
            match tokio::time::timeout_at(deadline, response_head(&mut resp)).await {
                Err(_) => {
                    let e = ProxyError::ResponseTimeout;
                    return Err(Failure::plain(e, Phase::ResponseHead));
                }
                Ok(r) => match r? {
                    Head::Final(h) => return Ok((h, send, true)),
                    Head::Interim(r) => {
                        // A slow client's write of it does not count against the server.
                        let began = tokio::time::Instant::now();
                        Box::pin(pass_interim(interim, r, Some(&mut *down))).await?;
                        deadline += began.elapsed();
                    }
                },
            }
        }
    }
    let r = {
        let body_fut = upload(&mut send, src, down, idle);
        tokio::pin!(body_fut);
        let sleep = tokio::time::sleep(FAR);
        tokio::pin!(sleep);
        let mut body_done = false;
        loop {
            tokio::select! {
                biased;
                r = response_head(&mut resp) => {
                    let h = match r {
                        Ok(Head::Final(h)) => h,
                        Ok(Head::Interim(r)) => match Box::pin(pass_interim::<D>(interim, r, None)).await {
                            Ok(()) => continue,
                            Err(f) => break Err(f),
                        },
                        Err(f) => break Err(f),
                    };
                    // As for HTTP/1.1: a success finishes the upload first (unless the caller
                    // streams both ways at once), an early error ends it.
                    if finish && !body_done && h.status().as_u16() < 300 {
                        if let Err((e, phase)) = body_fut.await {
                            break Err(Failure::plain(e, phase));
                        }
                        body_done = true;
                    }
                    break Ok((h, body_done));
                }
                r = &mut body_fut, if !body_done => {
                    if let Err((e, phase)) = r {
                        break Err(Failure::plain(e, phase));
                    }
                    body_done = true;
                    sleep.as_mut().reset(tokio::time::Instant::now() + header_timeout);
                }
                _ = &mut sleep => {
                    break Err(Failure::plain(ProxyError::ResponseTimeout, Phase::ResponseHead));
                }
            }
        }
    };
    match r {
        Ok((h, body_done)) => {
            if !body_done && (finish || h.status().as_u16() >= 300) {
                send.send_reset(h2::Reason::CANCEL);
            }
            Ok((h, send, body_done))
        }
        Err(f) => {
            send.send_reset(h2::Reason::CANCEL);
            Err(f)
        }
    }
}

/// Stream the request body and its trailers to the server under its flow control.
pub(crate) async fn upload<'a, D: Client<'a>>(
    send: &mut SendStream<Bytes>,
    up: &mut Upload,
    down: &mut D,
    idle: Duration,
) -> Result<(), (ProxyError, Phase)> {
    let body = Phase::RequestBody;
    loop {
        if up.pending.is_none() {
            match down.body_next(up).await.map_err(|e| (e, body))? {
                Some(d) => {
                    let n = d.len();
                    up.pending = Some((d, n));
                }
                None => break,
            }
        }
        let Some((d, n)) = up.pending.as_mut() else {
            break;
        };
        let n = *n;
        send_windowed(send, d, false, idle, Peer::Server)
            .await
            .map_err(|e| (e, body))?;
        up.pending = None;
        down.body_release(n);
    }
    match down.body_trailers(up).await.map_err(|e| (e, body))? {
        Some(t) if !t.is_empty() => send.send_trailers(t),
        _ => send.send_data(Bytes::new(), true),
    }
    .map_err(|e| (up_err(e), body))
}

/// The per-request state shared by both client kinds.
struct Run<'a> {
    shared: &'a Shared,
    worker: &'a Worker,
    group: &'a UpstreamGroup,
    picked: &'a Picked<'a>,
    key: PoolKey,
    addr: SocketAddr,
    retryable: bool,
}

impl Run<'_> {
    /// Get a slot (reused or on a new connection) and exchange; a reused connection that failed
    /// before the response head, or any refusal, is retried once on another connection (a new
    /// one unless another has room) for requests that can be sent again.
    async fn go<'a, D: Client<'a>>(
        &self,
        req: http::Request<()>,
        src: &mut Upload,
        down: &mut D,
        finish: bool,
        interim: &mut Interims<'a>,
    ) -> Result<
        (
            Lease,
            http::Response<RecvStream>,
            SendStream<Bytes>,
            bool,
            bool,
        ),
        Failure,
    > {
        // The connection the first exchange failed on, once it did.
        let mut failed_on: Option<Rc<H2Conn>> = None;
        loop {
            let pool = &self.worker.h2pool;
            let g = self.group;
            let slot = pool
                .slot(
                    self.key,
                    g.idle_timeout,
                    g.connect_timeout,
                    failed_on.as_ref(),
                )
                .await;
            let (lease, reused) = match slot {
                Slot::Leased(l) => (l, true),
                Slot::Failed(e) => return Err(Failure::plain(e, Phase::Connect)),
                Slot::Open(opening) => {
                    match open(
                        self.addr,
                        g.connect_timeout,
                        g.idle_timeout,
                        self.picked.tls,
                    )
                    .await
                    {
                        Ok((c, took)) => {
                            down.timings().connect = Some(took);
                            let stats = &self.shared.stats;
                            stats.upstream_connects.fetch_add(1, Ordering::Relaxed);
                            // In the pool before the waiters are woken (no await in between).
                            let lease = pool.add(self.key, c);
                            drop(opening);
                            (lease, false)
                        }
                        Err(e) => {
                            opening.failed(&e);
                            let report = match e {
                                ProxyError::ConnectTimeout => Report::Timeout,
                                _ => Report::ConnectError,
                            };
                            let server = self.picked.server();
                            self.picked.upstream.report(server, report, Instant::now());
                            return Err(Failure::plain(e, Phase::Connect));
                        }
                    }
                }
            };
            let group = self.group;
            let r = exchange(
                &lease.0,
                req.clone(),
                src,
                down,
                group.response_header_timeout,
                group.idle_timeout,
                finish,
                interim,
            )
            .await;
            match r {
                Ok((resp, up_send, body_done)) => {
                    return Ok((lease, resp, up_send, body_done, reused));
                }
                Err(f) => {
                    if f.phase == Phase::ResponseHead && !f.stream_only {
                        // This connection is not to be given new streams (its streams in flight
                        // finish). A head timeout counts too: a connection that stopped answering
                        // would otherwise take up to 100 more requests, each waiting for its 504.
                        lease.0.closed.set(true);
                    }
                    // Not after an interim response: it went to the client (see `Interims`).
                    if failed_on.is_none()
                        && f.phase == Phase::ResponseHead
                        && src.headless()
                        && interim.seen == 0
                        && (f.refused || (reused && self.retryable && !f.stream_only))
                    {
                        let stats = &self.shared.stats;
                        stats.upstream_retries.fetch_add(1, Ordering::Relaxed);
                        failed_on = Some(lease.0.clone());
                        continue;
                    }
                    if let Some(report) = failure_report(&f.e, reused) {
                        let server = self.picked.server();
                        self.picked.upstream.report(server, report, Instant::now());
                    }
                    return Err(f);
                }
            }
        }
    }
}

/// Whether the route's `retry` policy sends the request again, to another server, after an
/// exchange that failed with `f` before any response byte arrived (so nothing reached the
/// client). A refusal (`REFUSED_STREAM`, GOAWAY below the stream) counts as `reset`; it was
/// already sent once more on another connection to the same server for any body-less request
/// (RFC 9113 8.7), and going to another server follows the route's rules (idempotent methods
/// unless `non_idempotent`), as every retry does for HTTP/1.1 groups.
fn retry_after(f: &Failure, picked: &Picked<'_>, retry: &mut Retry<'_>, stats: &Stats) -> bool {
    let cause = match (f.phase, &f.e) {
        (Phase::Connect, _) => RetryCause::Connect,
        (Phase::ResponseHead, ProxyError::ResponseTimeout) => RetryCause::Timeout,
        (Phase::ResponseHead, ProxyError::UpstreamClosed | ProxyError::UpstreamIo(_)) => {
            RetryCause::Reset
        }
        _ => return false,
    };
    retry.allows(cause, picked.gi, picked.server(), stats)
}

/// The exchange of one attempt with the HTTP/2 server `t`: the forwarded head `ubuf` as an
/// HTTP/2 request (an extended CONNECT for a WebSocket), a stream on a multiplexed connection
/// (`Run::go`), failures reported and offered to `retry`. An HTTP/1.1 client's upload ends
/// before the response (`finish`); an HTTP/2 client's may go on while the response streams.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn exchange_attempt<'a, D: Client<'a>>(
    down: &mut D,
    env: Env<'_>,
    t: &Picked<'_>,
    ubuf: &[u8],
    head: &RequestHead,
    upload: &mut Upload,
    interims: &mut Interims<'a>,
    retry: &mut Retry<'_>,
) -> Exchanged {
    let addr = t.addr();
    let req = build_request(ubuf, head, t.tls.is_some(), addr);
    let tunnel = upload.is_tunnel();
    let req = match req.map(|r| if tunnel { extended_connect(r) } else { r }) {
        Ok(r) => r,
        Err(e) => {
            return Exchanged::Failed {
                e,
                phase: Phase::RequestHead,
                body_done: false,
            }
        }
    };
    let run = Run {
        shared: env.shared,
        worker: env.worker,
        group: t.group(),
        picked: t,
        key: t.pool_key,
        addr,
        retryable: head.method().is_idempotent() && upload.headless(),
    };
    let finish = !D::H2;
    let r = run.go(req, upload, down, finish, interims).await;
    // The first interim response committed the attempt (see `downstream::Interims`).
    if interims.seen > 0 {
        retry.commit();
    }
    match r {
        Ok((lease, resp, send, body_done, reused)) => {
            let got = t.responded(resp.status().as_u16());
            let (parts, body) = resp.into_parts();
            Exchanged::Response {
                resp: UpResponse::H2 {
                    lease,
                    parts,
                    body,
                    send,
                },
                body_done,
                reused,
                got,
            }
        }
        Err(f) if retry_after(&f, t, retry, &env.shared.stats) => Exchanged::Retry,
        Err(f) => Exchanged::Failed {
            e: f.e,
            phase: f.phase,
            body_done: upload.headless(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::{build_request, H2Pool, Slot};
    use crate::error::ProxyError;
    use crate::pool::PoolKey;
    use crate::stats::{Cause, Phase};
    use bytes::BytesMut;
    use portico_http1::{parse_request, Limits};
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

    #[test]
    fn forwarded_head_becomes_an_http2_request() {
        let mut client = BytesMut::from(
            &b"POST /svc/M HTTP/1.1\r\nHost: a.test\r\nTE: trailers\r\ncontent-type: application/grpc\r\n\r\n"[..],
        );
        let client = parse_request(&mut client, &Limits::default())
            .unwrap()
            .unwrap();
        let up = b"POST /svc/M HTTP/1.1\r\nContent-Type: application/grpc\r\nHost: a.test\r\nX-Forwarded-For: 1.2.3.4\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n";
        let addr = "127.0.0.1:9".parse().unwrap();
        let r = build_request(up, &client, false, addr).unwrap();
        assert_eq!(r.method(), http::Method::POST);
        assert_eq!(r.uri().to_string(), "http://a.test/svc/M");
        assert_eq!(r.headers()["te"], "trailers");
        assert_eq!(r.headers()["x-forwarded-for"], "1.2.3.4");
        assert_eq!(r.headers()["content-type"], "application/grpc");
        for gone in ["connection", "transfer-encoding", "host"] {
            assert!(!r.headers().contains_key(gone), "{gone}");
        }
    }
}
