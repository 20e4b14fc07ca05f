//! The client side of one proxied request, one type over an HTTP/1.1 connection and an HTTP/2 stream (static dispatch): its request body, interim heads, response head and body, error answers and reset watch.

use crate::attempt::{Client, Picked};
use crate::conn::{self, ClientBody, Conn, Ctx, Outcome, STALL_TIMEOUT};
use crate::error::ProxyError;
use crate::fast_timeout::LazyTimer;
use crate::h2::Link;
use crate::h2_fields::{append, trailer_map};
use crate::h2_io::{client_err, finish, send_windowed, Peer};
use crate::headers::{self, ClientFraming};
use crate::retry::Retry;
use crate::server::{ListenerState, Shared, Worker};
use crate::stats::Phase;
use crate::timing::Timings;
use bytes::{Bytes, BytesMut};
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use http::header::HeaderMap;
use portico_config::Route;
use portico_http1::{encode, Framing, Method, RequestHead, ResponseHead, Version};
use std::cell::RefCell;
use std::future::poll_fn;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::time::timeout;

/// Most interim (1xx) responses accepted before the final one.
pub(crate) const MAX_INTERIM: usize = 8;

/// Grace period before the listener's `body_min_rate` is enforced on a request body.
const BODY_RATE_GRACE: Duration = Duration::from_secs(10);

/// The client of one request.
pub(crate) enum Down<'a> {
    /// An HTTP/1.1 (or 1.0) connection, one request at a time.
    H1 { c: &'a mut Conn, ctx: &'a Ctx },
    /// A stream of an HTTP/2 connection.
    H2(H2Down<'a>),
}

/// What an HTTP/2 stream lends to the flow.
pub(crate) struct H2Down<'a> {
    pub link: &'a Link,
    pub ls: &'a ListenerState,
    pub shared: &'a Shared,
    /// Shared with the reset watch and the interim sender; each borrows it for one synchronous
    /// call only.
    pub respond: &'a RefCell<SendResponse<Bytes>>,
    pub body: &'a mut RecvStream,
    pub timings: &'a mut Timings,
    /// The response head wait's timer.
    pub timer: LazyTimer,
}

/// What the flow reads of the connection and the configuration for the whole request.
#[derive(Clone, Copy)]
pub(crate) struct Env<'a> {
    pub shared: &'a Shared,
    pub worker: &'a Worker,
    pub ls: &'a ListenerState,
    pub peer: SocketAddr,
}

/// Watches an HTTP/2 client's stream for a reset (an HTTP/1.1 client has none to watch).
#[derive(Clone, Copy)]
pub(crate) struct Watch<'a>(Option<&'a RefCell<SendResponse<Bytes>>>);

impl Watch<'_> {
    /// There is a stream to watch (an HTTP/2 client).
    pub(crate) fn active(&self) -> bool {
        self.0.is_some()
    }

    /// Completes when the client reset its stream; never for HTTP/1.1 clients.
    pub(crate) async fn reset(self) {
        match self.0 {
            None => std::future::pending().await,
            Some(cell) => {
                // The interim sender borrows the cell only within a synchronous call.
                poll_fn(|cx| match cell.try_borrow_mut() {
                    Ok(mut respond) => respond.poll_reset(cx).map(|_| ()),
                    Err(_) => std::task::Poll::Pending,
                })
                .await
            }
        }
    }

    /// `work`'s output, or the client's reset (`ClientClosed`) when it comes first.
    pub(crate) async fn unless_reset<T, F: std::future::Future<Output = Result<T, ProxyError>>>(
        self,
        work: F,
    ) -> Result<T, ProxyError> {
        if self.0.is_none() {
            return work.await;
        }
        // Boxed: only HTTP/2 streams watch, and the race would widen every request's future.
        Box::pin(async {
            tokio::select! {
                r = work => r,
                () = self.reset() => Err(ProxyError::ClientClosed),
            }
        })
        .await
    }
}

impl<'a> Down<'a> {
    pub(crate) fn env(&self) -> Env<'a> {
        match self {
            Down::H1 { c, ctx } => {
                let ctx: &'a Ctx = ctx;
                Env {
                    shared: &ctx.shared,
                    worker: &ctx.worker,
                    ls: &ctx.ls,
                    peer: c.peer,
                }
            }
            Down::H2(d) => Env {
                shared: d.shared,
                worker: &d.link.worker,
                ls: d.ls,
                peer: d.link.peer,
            },
        }
    }

    pub(crate) fn watch(&self) -> Watch<'a> {
        match self {
            Down::H1 { .. } => Watch(None),
            Down::H2(d) => Watch(Some(d.respond)),
        }
    }

    pub(crate) fn is_h2(&self) -> bool {
        matches!(self, Down::H2(_))
    }

    pub(crate) fn timings(&mut self) -> &mut Timings {
        match self {
            Down::H1 { c, .. } => &mut c.timings,
            Down::H2(d) => d.timings,
        }
    }

    pub(crate) fn timer(&mut self) -> &mut LazyTimer {
        match self {
            Down::H1 { c, .. } => &mut c.timer,
            Down::H2(d) => &mut d.timer,
        }
    }

    /// Who sent the request, for the forwarded head.
    pub(crate) fn client(&self) -> Client<'_> {
        match self {
            Down::H1 { c, .. } => Client {
                ip: &c.client_ip,
                tls: c.stream.is_tls(),
                cert_subject: c.client_cert_subject.as_deref(),
            },
            Down::H2(d) => Client {
                ip: &d.link.client_ip,
                tls: d.link.tls,
                cert_subject: d.link.client_cert_subject.as_deref(),
            },
        }
    }

    /// Pick the request's server (`attempt::pick`); an HTTP/2 client that resets its stream
    /// while the request waits in a queue leaves at once.
    pub(crate) async fn pick<'s>(
        &mut self,
        shared: &'s Shared,
        gi: usize,
        head: &RequestHead,
        retry: &Retry<'_>,
        asked: &mut Instant,
    ) -> Result<Picked<'s>, ProxyError> {
        let watch = self.watch();
        let ip: &str = match self {
            Down::H1 { c, .. } => &c.client_ip,
            Down::H2(d) => &d.link.client_ip,
        };
        let pick = crate::attempt::pick(shared, gi, ip, head, retry, asked);
        watch.unless_reset(pick).await
    }

    /// Answer with the error status for `e` (unless the client is gone) and describe the
    /// failure. `body_done`: the request body was read to its end (an HTTP/1.1 connection
    /// can then carry another request).
    // Exclusive here: the reset watch and the interim sender, which share the cell, are not
    // polled while this answer or tunnel runs.
    #[allow(clippy::await_holding_refcell_ref)]
    pub(crate) async fn fail(
        &mut self,
        head: &RequestHead,
        e: ProxyError,
        phase: Phase,
        body_done: bool,
    ) -> Outcome {
        match self {
            Down::H1 { c, ctx } => conn::fail(c, ctx, head, e, phase, body_done).await,
            Down::H2(d) => {
                tracing::debug!(peer = %d.link.peer, target = head.target(), "HTTP/2 request failed: {e}");
                let body = conn::error_body(e.status());
                let limit = d.ls.listener.limits.send_timeout;
                let mut respond = d.respond.borrow_mut();
                Box::pin(answer_h2(
                    &mut respond,
                    Some(head),
                    e,
                    phase,
                    body,
                    &[],
                    limit,
                ))
                .await
            }
        }
    }

    /// Before a request body is read: `100 Continue` to an HTTP/1.1 client that waits for it.
    pub(crate) async fn before_upload(&mut self, head: &RequestHead) -> Result<(), ProxyError> {
        match self {
            Down::H1 { c, .. } => conn::send_continue(c, head).await,
            Down::H2(_) => Ok(()),
        }
    }

    /// The request body to upload (`body`: the request has one to send), or none; `tunnel`:
    /// the stream stays open for a tunnel's bytes after the answer.
    pub(crate) fn upload(
        &self,
        head: &RequestHead,
        route: &Route,
        body: bool,
        tunnel: bool,
    ) -> Upload {
        let min_rate = self.env().ls.listener.limits.body_min_rate;
        let kind = match (body, tunnel) {
            (false, false) => Kind::None,
            (false, true) => Kind::Tunnel,
            (true, _) => match self {
                Down::H1 { .. } => Kind::H1(ClientBody::new(
                    head.framing,
                    route.max_body_bytes,
                    min_rate,
                )),
                Down::H2(_) => Kind::H2 {
                    started: tokio::time::Instant::now(),
                    received: 0,
                    min_rate,
                    max: route.max_body_bytes,
                },
            },
        };
        Upload {
            kind,
            pending: None,
        }
    }

    /// Where the interim responses of an attempt go: HTTP/2 clients get each at once as
    /// informational HEADERS; HTTP/1.1 clients as raw heads, held for [`Interims::flush`];
    /// HTTP/1.0 clients none (RFC 9110 15.2).
    pub(crate) fn interims(&self, head: &RequestHead) -> Interims<'a> {
        let to = match self {
            Down::H2(d) => To::H2(d.respond),
            Down::H1 { .. } if head.version() == Version::Http11 => To::H1,
            Down::H1 { .. } => To::Dropped,
        };
        Interims {
            seen: 0,
            to,
            held: Vec::new(),
        }
    }
}

// An HTTP/2 stream's `respond` cell is borrowed across the awaits of these answers: exclusive
// there, as the reset watch and the interim sender that share it are not polled meanwhile.
#[allow(clippy::await_holding_refcell_ref)]
impl Down<'_> {
    /// The buffer for the forwarded head: an HTTP/1.1 connection's (its allocation kept across
    /// requests; give it back with `put_ubuf`), or a new one.
    pub(crate) fn take_ubuf(&mut self) -> BytesMut {
        match self {
            Down::H1 { c, .. } => std::mem::take(&mut c.ubuf),
            Down::H2(_) => BytesMut::with_capacity(1024),
        }
    }

    pub(crate) fn put_ubuf(&mut self, ubuf: BytesMut) {
        if let Down::H1 { c, .. } = self {
            c.ubuf = ubuf;
        }
    }

    /// The client's address as a string (hashing, rate-limit keys).
    pub(crate) fn client_ip(&self) -> &str {
        match self {
            Down::H1 { c, .. } => &c.client_ip,
            Down::H2(d) => &d.link.client_ip,
        }
    }

    /// Refuse a routed request before its action (shed, rate limited) with `body` and `extra`
    /// fields. An HTTP/1.1 connection stays open only when no request body is left unread.
    pub(crate) async fn refuse(
        &mut self,
        head: &RequestHead,
        e: ProxyError,
        body: &[u8],
        extra: &[(&str, &str)],
    ) -> Outcome {
        match self {
            Down::H1 { c, ctx } => {
                let status = e.status();
                let body_done = matches!(head.framing, Framing::None | Framing::Length(0));
                let ka = body_done && conn::may_keep_alive(c, ctx, head);
                let r =
                    conn::write_simple(c, status, "text/plain", body, ka, Some(head), extra).await;
                Outcome {
                    termination: e.termination(Phase::Route),
                    status,
                    keep_alive: ka && r.is_ok(),
                    bytes_sent: r.unwrap_or(0),
                    upstream: None,
                }
            }
            Down::H2(d) => {
                let limit = d.ls.listener.limits.send_timeout;
                let respond = &mut *d.respond.borrow_mut();
                let answer = answer_h2(respond, Some(head), e, Phase::Route, body, extra, limit);
                Box::pin(answer).await
            }
        }
    }

    /// Read and discard the request body (and an HTTP/2 client's trailers) before a local
    /// answer, under the route's size limit and the listener's minimum rate.
    pub(crate) async fn drain(
        &mut self,
        head: &RequestHead,
        route: &Route,
    ) -> Result<(), ProxyError> {
        let body = match self {
            Down::H1 { .. } => !matches!(head.framing, Framing::None | Framing::Length(0)),
            Down::H2(d) => !d.body.is_end_stream(),
        };
        if !body {
            return Ok(());
        }
        self.before_upload(head).await?;
        let mut up = self.upload(head, route, true, false);
        while let Some(d) = up.next(self).await? {
            up.release(self, d.len());
        }
        up.trailers(self).await.map(|_| ())
    }

    /// A complete small response generated here (redirect, fixed answer).
    pub(crate) async fn local(
        &mut self,
        head: &RequestHead,
        status: u16,
        content_type: &str,
        body: &[u8],
        extra: &[(&str, &str)],
    ) -> Outcome {
        let (r, keep_alive) = match self {
            Down::H1 { c, ctx } => {
                let ka = conn::may_keep_alive(c, ctx, head);
                let r =
                    conn::write_simple(c, status, content_type, body, ka, Some(head), extra).await;
                (r, ka)
            }
            Down::H2(d) => {
                let head_only = *head.method() == Method::Head;
                let limit = d.ls.listener.limits.send_timeout;
                let respond = &mut *d.respond.borrow_mut();
                let send =
                    send_simple(respond, status, content_type, body, extra, head_only, limit);
                (Box::pin(send).await, true)
            }
        };
        match r {
            Ok(n) => Outcome::ok(status, keep_alive, n),
            Err(e) => Outcome {
                termination: e.termination(Phase::ResponseBody),
                status,
                keep_alive: keep_alive && self.is_h2(),
                bytes_sent: 0,
                upstream: None,
            },
        }
    }

    /// The origin action's answer (`static` and `origin` routes).
    pub(crate) async fn origin(
        &mut self,
        head: &RequestHead,
        origin: &portico_origin::Origin,
    ) -> Outcome {
        match self {
            Down::H1 { c, ctx } => conn::serve_origin(c, ctx, head, origin).await,
            Down::H2(d) => {
                let limit = d.ls.listener.limits.send_timeout;
                let respond = &mut *d.respond.borrow_mut();
                Box::pin(crate::h2::origin(respond, head, origin, limit)).await
            }
        }
    }
}

/// A request body being read from the client for an upload: the chunk being written
/// survives a cancelled upload, so an upload paused while the response head is handled
/// resumes where it stopped.
pub(crate) struct Upload {
    kind: Kind,
    /// A chunk read from the client and not yet all written, and its full length.
    pub pending: Option<(Bytes, usize)>,
}

enum Kind {
    None,
    /// An extended CONNECT (a WebSocket): no body; the stream stays open for the tunnel's
    /// bytes, relayed after the answer.
    Tunnel,
    H1(ClientBody),
    H2 {
        started: tokio::time::Instant,
        received: u64,
        min_rate: u64,
        max: u64,
    },
}

impl Upload {
    pub(crate) fn is_none(&self) -> bool {
        matches!(self.kind, Kind::None)
    }

    pub(crate) fn is_tunnel(&self) -> bool {
        matches!(self.kind, Kind::Tunnel)
    }

    /// No body is uploaded while the response head is awaited (none, or a tunnel).
    pub(crate) fn headless(&self) -> bool {
        matches!(self.kind, Kind::None | Kind::Tunnel)
    }

    /// The whole body was read from the client (true when there is none).
    pub(crate) fn is_done(&self) -> bool {
        match &self.kind {
            Kind::H1(b) => b.is_done(),
            _ => true,
        }
    }

    /// The next slice of the body from `down`, `None` at its end, under the route's size
    /// limit and the listener's minimum body rate.
    pub(crate) async fn next(&mut self, down: &mut Down<'_>) -> Result<Option<Bytes>, ProxyError> {
        match (&mut self.kind, down) {
            (Kind::H1(body), Down::H1 { c, .. }) => body.next(&mut c.stream, &mut c.rbuf).await,
            (
                Kind::H2 {
                    started,
                    received,
                    min_rate,
                    max,
                },
                Down::H2(d),
            ) => {
                let due = conn::body_byte_due(*started, *received, *min_rate, BODY_RATE_GRACE);
                let r = match due {
                    Some(due) => tokio::time::timeout_at(due, d.body.data()).await,
                    None => timeout(STALL_TIMEOUT, d.body.data()).await,
                };
                match r {
                    Err(_) => Err(ProxyError::BodyTooSlow),
                    Ok(None) => Ok(None),
                    Ok(Some(Err(e))) => Err(client_err(e)),
                    Ok(Some(Ok(data))) => {
                        *received += data.len() as u64;
                        if *max > 0 && *received > *max {
                            return Err(ProxyError::BodyTooLarge);
                        }
                        Ok(Some(data))
                    }
                }
            }
            _ => Ok(None),
        }
    }

    /// Flow control: `n` bytes of an HTTP/2 client's body were passed on.
    pub(crate) fn release(&self, down: &mut Down<'_>, n: usize) {
        if let (Kind::H2 { .. }, Down::H2(d)) = (&self.kind, down) {
            let _ = d.body.flow_control().release_capacity(n);
        }
    }

    /// The body's trailers as a field map (after its end).
    pub(crate) async fn trailers(
        &mut self,
        down: &mut Down<'_>,
    ) -> Result<Option<HeaderMap>, ProxyError> {
        match (&self.kind, down) {
            (Kind::H1(body), _) => Ok(Some(trailer_map(&body.trailers))),
            (Kind::H2 { .. }, Down::H2(d)) => match timeout(STALL_TIMEOUT, d.body.trailers()).await
            {
                Err(_) => Err(ProxyError::BodyTooSlow),
                Ok(r) => Ok(r.map_err(client_err)?.map(headers::trailer_fields)),
            },
            _ => Ok(None),
        }
    }

    /// The body's trailers as HTTP/1 lines for a chunked upload (after its end); an HTTP/1.1
    /// client's pass as it sent them.
    pub(crate) async fn trailer_lines(
        &mut self,
        down: &mut Down<'_>,
        out: &mut BytesMut,
    ) -> Result<(), ProxyError> {
        if let Kind::H1(body) = &self.kind {
            out.extend_from_slice(&headers::trailer_lines(&body.trailers));
            return Ok(());
        }
        if let Some(t) = self.trailers(down).await? {
            headers::encode_trailers(out, &t);
        }
        Ok(())
    }
}

/// An interim (1xx, not 101) response of the server.
pub(crate) enum Interim {
    /// An HTTP/1.1 server's head, raw, its hop-by-hop fields removed.
    Raw(Bytes),
    /// An HTTP/2 server's informational response.
    H2(http::Response<()>),
}

enum To<'a> {
    H2(&'a RefCell<SendResponse<Bytes>>),
    H1,
    Dropped,
}

/// The interim (1xx) responses of one attempt, passed to the client as they arrive (103 Early
/// Hints lets a browser preload while the server still works on the answer). An HTTP/1.1
/// client's are held while its connection is read for the request body, then written at once.
///
/// The first interim response commits the attempt: the request is not retried after it
/// (`Retry::commit`), as if the response had begun, even when the route's policy would retry
/// the failure that follows. Retrying could show the client the hints of one server and the
/// answer of another, or hold every hint until the final head, which defeats 103 exactly for
/// the requests that are retried (body-less GETs, the ones browsers preload for). A later
/// failure gets its 502/504 after the interim heads, which RFC 9110 15.2 allows.
pub(crate) struct Interims<'a> {
    /// Interim responses the server sent so far in this attempt.
    pub seen: usize,
    to: To<'a>,
    /// Raw heads for an HTTP/1.1 client not yet written.
    held: Vec<Bytes>,
}

impl Interims<'_> {
    /// Count one interim response and pass it on (HTTP/2 clients) or hold it for `flush`
    /// (HTTP/1.1 clients); more than [`MAX_INTERIM`] is an upstream error. A client that is
    /// gone is not an error here: the reset watch or the final response reports it.
    pub(crate) fn hold(&mut self, i: Interim) -> Result<(), ProxyError> {
        if self.seen >= MAX_INTERIM {
            return Err(ProxyError::TooManyInterim);
        }
        self.seen += 1;
        match &self.to {
            To::H2(cell) => {
                // Never borrowed elsewhere during this call (single-threaded, no await held).
                if let Ok(mut respond) = cell.try_borrow_mut() {
                    match i {
                        Interim::Raw(raw) => crate::h2_interim::forward(&mut respond, &raw),
                        Interim::H2(resp) => crate::h2_interim::forward_h2(&mut respond, resp),
                    }
                }
            }
            To::H1 => match i {
                Interim::Raw(raw) => self.held.push(raw),
                Interim::H2(resp) => {
                    let mut raw = BytesMut::new();
                    crate::h2_interim::http1_head(&mut raw, &resp);
                    if !raw.is_empty() {
                        self.held.push(raw.freeze());
                    }
                }
            },
            To::Dropped => {}
        }
        Ok(())
    }

    /// Whether heads wait to be written.
    pub(crate) fn holding(&self) -> bool {
        !self.held.is_empty()
    }

    /// Write the held heads to an HTTP/1.1 client (one write when several wait), under its
    /// `send_timeout`.
    pub(crate) async fn flush(&mut self, down: &mut Down<'_>) -> std::io::Result<()> {
        if self.held.is_empty() {
            return Ok(());
        }
        let Down::H1 { c, .. } = down else {
            return Ok(());
        };
        // Boxed: rare, and a client write's state would otherwise widen every request's future.
        let held = std::mem::take(&mut self.held);
        Box::pin(async {
            match held.len() {
                1 => conn::send_all(&mut c.stream, &held[0], c.send_timeout).await,
                _ => conn::send_all(&mut c.stream, &held.concat(), c.send_timeout).await,
            }
        })
        .await
    }
}

/// An error answer on an HTTP/2 stream (unless the client is gone) with `body` and `extra`
/// fields, and its outcome. Callers that also serve HTTP/1.1 box it: HTTP/2-only state would
/// widen their futures.
pub(crate) async fn answer_h2(
    respond: &mut SendResponse<Bytes>,
    head: Option<&RequestHead>,
    e: ProxyError,
    phase: Phase,
    body: &[u8],
    extra: &[(&str, &str)],
    limit: Duration,
) -> Outcome {
    let status = e.status();
    let sent = if e.client_gone() {
        0
    } else {
        let head_only = head.is_some_and(|h| *h.method() == Method::Head);
        send_simple(respond, status, "text/plain", body, extra, head_only, limit)
            .await
            .unwrap_or(0)
    };
    Outcome {
        termination: e.termination(phase),
        status,
        keep_alive: true,
        bytes_sent: sent,
        upstream: None,
    }
}

/// A small complete response generated here on an HTTP/2 stream; returns the body bytes sent.
pub(crate) async fn send_simple(
    respond: &mut SendResponse<Bytes>,
    status: u16,
    content_type: &str,
    body: &[u8],
    extra: &[(&str, &str)],
    head_only: bool,
    limit: Duration,
) -> Result<u64, ProxyError> {
    let mut b = http::Response::builder()
        .status(status)
        .header("server", "portico");
    for (n, v) in extra {
        b = b.header(*n, *v);
    }
    if status == 503 {
        b = b.header("retry-after", "1");
    }
    let bodyless = status == 204 || status == 304;
    if !bodyless {
        b = b
            .header("content-type", content_type)
            .header("content-length", body.len());
    }
    b = crate::date::with_date(|d| b.header("date", d));
    let response = b
        .body(())
        .map_err(|e| ProxyError::ClientIo(std::io::Error::other(e)))?;
    let end = head_only || bodyless || body.is_empty();
    let mut send = respond.send_response(response, end).map_err(client_err)?;
    if end {
        return Ok(0);
    }
    let mut data = Bytes::copy_from_slice(body);
    send_windowed(&mut send, &mut data, true, limit, Peer::Client).await?;
    Ok(body.len() as u64)
}

/// The response head as it goes to the client: an HTTP/1 head from an HTTP/1.1 server, or an
/// HTTP/2 server's head (`end`: no body follows).
pub(crate) enum RespHead<'r> {
    H1(&'r ResponseHead),
    H2 {
        parts: http::response::Parts,
        end: bool,
    },
}

/// Where a response body goes, as [`crate::flow`] relays it.
pub(crate) enum Out<'o> {
    /// An HTTP/1.1 connection: bytes gather in `c.wbuf` (the head first, so a small body leaves
    /// in the same write) and are written before each wait for the server.
    H1 {
        c: &'o mut Conn,
        chunked: bool,
        /// Trailers are passed on (chunked, and for an HTTP/2 server the client said `TE:
        /// trailers`).
        trailers: bool,
        /// Bytes written to the client so far, the head included.
        sent: u64,
    },
    /// An HTTP/2 stream: DATA under the client's window.
    H2 {
        send: SendStream<Bytes>,
        limit: Duration,
        /// Body bytes sent so far.
        sent: u64,
    },
}

/// The trailers at a response body's end.
pub(crate) enum Trailers {
    /// An HTTP/1.1 server's chunked trailer lines.
    Raw(Bytes),
    /// An HTTP/2 server's trailers, already filtered.
    Map(Option<HeaderMap>),
}

impl Out<'_> {
    /// Body bytes; `last`: END_STREAM goes with them (an HTTP/2 client).
    pub(crate) async fn data(&mut self, d: Bytes, last: bool) -> Result<(), ProxyError> {
        match self {
            Out::H1 {
                c, chunked, sent, ..
            } => {
                if *chunked {
                    encode::chunk_header(&mut c.wbuf, d.len());
                }
                if c.wbuf.len() + d.len() <= 64 * 1024 {
                    c.wbuf.extend_from_slice(&d);
                } else {
                    flush_h1(c, sent).await?;
                    conn::send_all(&mut c.stream, &d, c.send_timeout)
                        .await
                        .map_err(ProxyError::ClientIo)?;
                    *sent += d.len() as u64;
                }
                if *chunked {
                    c.wbuf.extend_from_slice(b"\r\n");
                }
                Ok(())
            }
            Out::H2 { send, limit, sent } => {
                *sent += d.len() as u64;
                let mut d = d;
                send_windowed(send, &mut d, last, *limit, Peer::Client).await
            }
        }
    }

    /// Before a wait for the server: what an HTTP/1.1 client's buffer holds goes out.
    pub(crate) async fn flush(&mut self) -> Result<(), ProxyError> {
        match self {
            Out::H1 { c, sent, .. } => flush_h1(c, sent).await,
            Out::H2 { .. } => Ok(()),
        }
    }

    /// The body ended (not after a `last` data): trailers, or the end of the stream. An
    /// HTTP/1.1 client's last chunk stays buffered for [`Out::finish`].
    pub(crate) fn end(&mut self, trailers: Trailers) -> Result<(), ProxyError> {
        match self {
            Out::H1 {
                c,
                chunked: true,
                trailers: pass,
                ..
            } => {
                let mut lines = BytesMut::new();
                match trailers {
                    Trailers::Raw(raw) => lines.extend_from_slice(&headers::trailer_lines(&raw)),
                    Trailers::Map(Some(t)) if *pass => headers::encode_trailers(&mut lines, &t),
                    Trailers::Map(_) => {}
                }
                encode::last_chunk(&mut c.wbuf, &lines);
                Ok(())
            }
            Out::H1 { .. } => Ok(()),
            Out::H2 { send, .. } => {
                let map = match trailers {
                    Trailers::Raw(raw) => trailer_map(&raw),
                    Trailers::Map(t) => t.unwrap_or_default(),
                };
                if map.is_empty() {
                    finish(send)
                } else {
                    send.send_trailers(map).map_err(client_err)
                }
            }
        }
    }

    /// Write what is still buffered (after the server's side was released).
    pub(crate) async fn finish(&mut self) -> Result<(), ProxyError> {
        self.flush().await
    }

    /// Completes when an HTTP/2 client resets the stream (with why); never for HTTP/1.1.
    pub(crate) async fn reset(&mut self) -> ProxyError {
        match self {
            Out::H1 { .. } => std::future::pending().await,
            Out::H2 { send, .. } => match poll_fn(|cx| send.poll_reset(cx)).await {
                Ok(_) => ProxyError::ClientClosed,
                Err(e) => client_err(e),
            },
        }
    }

    /// The body failed with `e`: an HTTP/2 client's stream is reset (unless the client is
    /// gone), an HTTP/1.1 client's buffered bytes are dropped (its connection closes).
    pub(crate) fn abort(&mut self, e: &ProxyError) {
        match self {
            Out::H1 { c, .. } => c.wbuf.clear(),
            Out::H2 { send, .. } => {
                if !e.client_gone() {
                    send.send_reset(h2::Reason::INTERNAL_ERROR);
                }
            }
        }
    }

    pub(crate) fn is_h2(&self) -> bool {
        matches!(self, Out::H2 { .. })
    }

    /// Bytes the access log counts as sent.
    pub(crate) fn sent(&self) -> u64 {
        match self {
            Out::H1 { sent, .. } | Out::H2 { sent, .. } => *sent,
        }
    }
}

async fn flush_h1(c: &mut Conn, sent: &mut u64) -> Result<(), ProxyError> {
    if !c.wbuf.is_empty() {
        conn::send_all(&mut c.stream, &c.wbuf, c.send_timeout)
            .await
            .map_err(ProxyError::ClientIo)?;
        *sent += c.wbuf.len() as u64;
        c.wbuf.clear();
    }
    Ok(())
}

/// How the response head went out.
pub(crate) struct Sent<'o> {
    pub out: Out<'o>,
    /// An HTTP/1.1 connection may carry another request after this response.
    pub keep_alive: bool,
    /// No body follows the head.
    pub end: bool,
}

/// Why the response head did not go out.
pub(crate) enum HeadFailed {
    /// The server's head does not make a valid head for the client: answer with the error.
    Invalid(ProxyError),
    /// The client is gone.
    Client(ProxyError),
}

impl<'a> Down<'a> {
    /// Send the response head (with the route's response rules, Via and a sticky cookie) and
    /// return where its body goes. `body_done`: the request body was read to its end.
    pub(crate) fn response_head(
        &mut self,
        head: &RequestHead,
        resp: RespHead<'_>,
        route: &Route,
        via: bool,
        set_cookie: Option<&str>,
        body_done: bool,
    ) -> Result<Sent<'_>, HeadFailed> {
        match self {
            Down::H1 { c, ctx } => {
                let h1;
                let (rh, trailers) = match resp {
                    RespHead::H1(r) => (r, true),
                    RespHead::H2 { parts, end } => {
                        h1 = crate::h2_fields::http1_response(&parts, head.method(), end).ok_or(
                            HeadFailed::Invalid(ProxyError::UpstreamIo(std::io::Error::other(
                                "response head not valid HTTP/1",
                            ))),
                        )?;
                        let te = head.field("te").is_some_and(|v| {
                            v.split(|&b| b == b',')
                                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"trailers"))
                        });
                        (&h1, te)
                    }
                };
                let cf = headers::client_framing(rh.framing, head.version());
                let keep_alive =
                    body_done && cf != ClientFraming::Close && conn::may_keep_alive(c, ctx, head);
                c.wbuf.clear();
                headers::client_response(
                    &mut c.wbuf,
                    rh,
                    cf,
                    &route.response_headers,
                    via,
                    head.version(),
                    keep_alive,
                );
                if let Some(cookie) = set_cookie {
                    crate::sticky::append_field(&mut c.wbuf, "Set-Cookie", cookie);
                }
                let chunked = cf == ClientFraming::Chunked;
                Ok(Sent {
                    end: rh.framing == Framing::None,
                    keep_alive,
                    out: Out::H1 {
                        c,
                        chunked,
                        trailers: chunked && trailers,
                        sent: 0,
                    },
                })
            }
            Down::H2(_) => self.h2_response_head(resp, route, via, set_cookie),
        }
    }

    /// [`Down::response_head`] for an HTTP/2 client, whose body then goes out on its own
    /// stream (borrowing nothing of `self`, so the upload can go on at the same time).
    pub(crate) fn h2_response_head(
        &self,
        resp: RespHead<'_>,
        route: &Route,
        via: bool,
        set_cookie: Option<&str>,
    ) -> Result<Sent<'static>, HeadFailed> {
        let Down::H2(d) = self else {
            return Err(HeadFailed::Invalid(ProxyError::Internal(
                "an HTTP/2 response head for an HTTP/1.1 client",
            )));
        };
        let (mut response, end) = match resp {
            RespHead::H1(r) => (
                crate::h2_fields::response_from(r, &route.response_headers, via),
                matches!(r.framing, Framing::None | Framing::Length(0)),
            ),
            RespHead::H2 { parts, end } => (
                crate::h2_fields::response_from_h2(parts, &route.response_headers, via),
                end,
            ),
        };
        if let Some(cookie) = set_cookie {
            append(response.headers_mut(), "set-cookie", cookie.as_bytes());
        }
        let send = d
            .respond
            .borrow_mut()
            .send_response(response, end)
            .map_err(|e| HeadFailed::Client(client_err(e)))?;
        Ok(Sent {
            end,
            keep_alive: true,
            out: Out::H2 {
                send,
                limit: d.ls.listener.limits.send_timeout,
                sent: 0,
            },
        })
    }
}
