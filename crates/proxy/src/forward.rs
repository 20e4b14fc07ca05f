//! The proxy action: pick a server, reuse or open a connection, stream both ways, release.

use crate::attempt::{self, Failed};
use crate::conn::{
    fail, head_may_be_complete, may_keep_alive, send_all, send_continue, write_framed, ClientBody,
    Conn, Ctx, Outcome, MAX_CHUNK,
};
use crate::error::ProxyError;
use crate::headers::{self, ClientFraming};
use crate::metrics::RouteStats;
use crate::pool::{UpConn, UpStream};
use crate::resilience::RouteResilience;
use crate::retry::Retry;
use crate::stats::{Phase, Termination};
use crate::stream::ClientStream;
use crate::upstream_tls::GroupTls;
use bytes::{Bytes, BytesMut};
use portico_config::{ProxyAction, Route};
use portico_http1::{
    encode, parse_response, BodyDecoder, Decoded, Framing, Limits, Method, RequestHead,
    ResponseHead, Version,
};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

/// Most interim (1xx) responses accepted before the final one.
pub(crate) const MAX_INTERIM: usize = 8;

/// Proxy one request to the route's upstream group, retrying failed attempts on other servers
/// as the route's `retry` policy and budget allow.
pub async fn proxy(
    c: &mut Conn,
    ctx: &Ctx,
    head: &RequestHead,
    route: &Route,
    p: &ProxyAction,
    res: &RouteResilience,
    counters: &RouteStats,
) -> Outcome {
    // The clock read at the head serves the budget, the pick (ejection expiry, slow start) and
    // the header-time metric.
    let now = c.timings.head.unwrap_or_else(Instant::now);
    let budget = res.retry_budget.as_deref();
    let mut retry = Retry::new(p.retry.as_ref(), budget, head, now, counters);
    loop {
        if let Some(outcome) = attempt(c, ctx, head, route, p, &mut retry).await {
            return outcome;
        }
    }
}

/// One attempt: pick a server (not one that failed this request before, when another can take
/// it), exchange, relay. None = the attempt failed before anything reached the client and
/// `retry` granted another one.
async fn attempt(
    c: &mut Conn,
    ctx: &Ctx,
    head: &RequestHead,
    route: &Route,
    p: &ProxyAction,
    retry: &mut Retry<'_>,
) -> Option<Outcome> {
    let shared = &*ctx.shared;
    let mut asked = retry.started();
    let t = match attempt::pick(shared, p.upstream, &c.client_ip, head, retry, &mut asked).await {
        Ok(t) => t,
        Err(e) => return Some(fail(c, ctx, head, e, Phase::Connect, false).await),
    };
    let group = t.group();
    let addr = t.addr();
    let client = attempt::Client {
        ip: &c.client_ip,
        tls: c.stream.is_tls(),
        cert_subject: c.client_cert_subject.as_deref(),
    };
    t.write_head(&mut c.ubuf, head, route, p, &client);

    // HTTP/2 groups: the same forwarded head, over a multiplexed connection.
    if group.protocol == portico_config::UpstreamProtocol::H2 {
        let picked = crate::upstream_h2::Picked {
            upstream: t.upstream,
            guard: t.guard,
            gi: t.gi,
            tls: t.tls,
            asked,
        };
        return crate::upstream_h2::proxy_h1(c, ctx, head, route, p, picked, t.set_cookie, retry)
            .await;
    }

    let mut body = match head.framing {
        Framing::None | Framing::Length(0) => None,
        f => Some(ClientBody::new(
            f,
            route.max_body_bytes,
            ctx.ls.listener.limits.body_min_rate,
        )),
    };
    if body.is_some() {
        if let Err(e) = send_continue(c, head).await {
            return Some(fail(c, ctx, head, e, Phase::RequestBody, false).await);
        }
    }
    // Interim responses go to HTTP/1.1 clients only (RFC 9110 15.2).
    let mut interim = Interims::new(head.version() == Version::Http11);
    let mut fresh_only = false;
    let (mut up, reused, resp, body_done, got) = loop {
        let pool = &ctx.worker.pool;
        let (mut up, reused) = match t
            .connection(shared, pool, fresh_only, &mut c.timings.connect, retry)
            .await
        {
            Ok(u) => u,
            Err((_, Failed::Retry)) => return None,
            Err((e, _)) => {
                // The access log names the server that refused or timed out.
                let mut o = fail(c, ctx, head, e, Phase::Connect, body.is_none()).await;
                o.upstream = Some(t.addr());
                return Some(o);
            }
        };
        let r = exchange(
            &mut c.stream,
            &mut c.rbuf,
            &mut c.timer,
            &mut up,
            &c.ubuf,
            head.method(),
            body.as_mut(),
            head.framing == Framing::Chunked,
            group.response_header_timeout,
            group.idle_timeout,
            c.send_timeout,
            &mut interim,
        )
        .await;
        // Once the server sent an interim response the attempt is committed (see `Interims`).
        if interim.seen > 0 {
            retry.commit();
        }
        match r {
            Ok((resp, body_done)) => {
                // One clock read: passive checks, the header-time metric, the access log.
                let got = t.responded(resp.status());
                c.timings.response = Some(got);
                break (up, reused, resp, body_done, got);
            }
            Err((e, phase)) => {
                let untouched = up.rbuf.is_empty() && interim.seen == 0;
                match t.failed(shared, retry, head, &e, phase, reused, untouched) {
                    Failed::Stale => fresh_only = true,
                    Failed::Retry => return None,
                    Failed::Fail => {
                        let body_done = body.as_ref().is_none_or(|b| b.is_done());
                        let mut o = fail(c, ctx, head, e, phase, body_done).await;
                        o.upstream = Some(addr);
                        return Some(o);
                    }
                }
            }
        }
    };
    // A retried response is dropped before any of it is sent (never after an interim response:
    // the retry was committed then); its connection closes with it.
    if t.accepted(shared, retry, asked, got, reused, resp.status()) {
        return None;
    }
    // Interim heads still held (they came during an upload that ended with this head).
    if let Err(e) = interim.flush(&mut c.stream, c.send_timeout).await {
        return Some(client_gone(resp.status(), addr, e));
    }
    if resp.status() == 101 {
        if !head.upgrade {
            let e = ProxyError::UnexpectedUpgrade;
            return Some(fail(c, ctx, head, e, Phase::ResponseHead, body_done).await);
        }
        return Some(tunnel(c, up, &resp, route, p, head, addr, group.idle_timeout).await);
    }

    let cf = headers::client_framing(resp.framing, head.version());
    let up_reusable = resp.keep_alive && body_done && resp.framing != Framing::Close;
    let keep_alive = body_done && cf != ClientFraming::Close && may_keep_alive(c, ctx, head);
    c.wbuf.clear();
    headers::client_response(
        &mut c.wbuf,
        &resp,
        cf,
        &route.response_headers,
        p.via,
        head.version(),
        keep_alive,
    );
    if let Some(cookie) = &t.set_cookie {
        crate::sticky::append_field(&mut c.wbuf, "Set-Cookie", cookie);
    }
    let status = resp.status();
    let outcome = match relay_body(
        c,
        &mut up,
        resp.framing,
        cf == ClientFraming::Chunked,
        group.idle_timeout,
    )
    .await
    {
        Ok(mut sent) => {
            // The upstream exchange is complete: free the connection and the server's active
            // slot before the last client write, so neither waits on a slow client.
            t.release(shared, &ctx.worker.pool, up, up_reusable);
            match flush(c, &mut sent).await {
                Ok(()) => Outcome {
                    termination: Termination::OK,
                    status,
                    keep_alive,
                    bytes_sent: sent,
                    upstream: Some(addr),
                },
                Err(e) => Outcome {
                    termination: e.termination(Phase::ResponseBody),
                    status,
                    keep_alive: false,
                    bytes_sent: sent,
                    upstream: Some(addr),
                },
            }
        }
        Err(e) => Outcome {
            termination: e.termination(Phase::ResponseBody),
            status,
            keep_alive: false,
            bytes_sent: 0,
            upstream: Some(addr),
        },
    };
    Some(outcome)
}

/// A client write of the response head failed with `e` (a client that accepted nothing within
/// `send_timeout` is a client timeout, as for every other client write).
fn client_gone(status: u16, addr: SocketAddr, e: std::io::Error) -> Outcome {
    Outcome {
        termination: ProxyError::ClientIo(e).termination(Phase::ResponseHead),
        status,
        keep_alive: false,
        bytes_sent: 0,
        upstream: Some(addr),
    }
}

/// The value of cookie `name` in a Cookie header value.
pub fn cookie_value<'a>(header: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    header.split(|&b| b == b';').find_map(|pair| {
        let pair = pair.trim_ascii();
        let eq = pair.iter().position(|&b| b == b'=')?;
        (pair[..eq].trim_ascii() == name).then(|| pair[eq + 1..].trim_ascii())
    })
}

/// Connect to `addr`, and for a TLS group finish the handshake, all under `t`; also says how
/// long that took.
pub(crate) async fn connect(
    addr: SocketAddr,
    t: Duration,
    tls: Option<&GroupTls>,
) -> Result<(UpConn, Duration), ProxyError> {
    let begun = Instant::now();
    let Some(tls) = tls else {
        return match timeout(t, TcpStream::connect(addr)).await {
            Err(_) => Err(ProxyError::ConnectTimeout),
            Ok(Err(e)) => Err(ProxyError::ConnectFailed(e)),
            Ok(Ok(s)) => {
                let took = begun.elapsed();
                let _ = s.set_nodelay(true);
                Ok((UpConn::new(UpStream::Plain(s)), took))
            }
        };
    };
    let connected = timeout(t, async {
        let s = TcpStream::connect(addr)
            .await
            .map_err(ProxyError::ConnectFailed)?;
        let _ = s.set_nodelay(true);
        tls.handshake(addr, s).await
    })
    .await;
    match connected {
        Err(_) => Err(ProxyError::ConnectTimeout),
        Ok(r) => r.map(|u| (UpConn::new(u), begun.elapsed())),
    }
}

/// Send the request head, stream the request body while waiting for the response head; return
/// the final response head and whether the request body was completely sent. Interim heads are
/// passed to the client as they arrive (see `Interims`).
#[allow(clippy::too_many_arguments)]
async fn exchange(
    client: &mut ClientStream,
    client_buf: &mut BytesMut,
    timer: &mut crate::fast_timeout::LazyTimer,
    up: &mut UpConn,
    ubuf: &[u8],
    method: &Method,
    body: Option<&mut ClientBody>,
    chunked: bool,
    header_timeout: Duration,
    idle: Duration,
    send_timeout: Duration,
    interim: &mut Interims,
) -> Result<(ResponseHead, bool), (ProxyError, Phase)> {
    // Most heads fit the socket buffer at once: only arm the timer when they do not.
    let written = match up.stream.try_write(ubuf) {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
        Err(e) => return Err((ProxyError::UpstreamIo(e), Phase::ResponseHead)),
    };
    if written < ubuf.len() {
        // TLS: the records must leave rustls's buffer too (a no-op for plain sockets).
        let write = async {
            up.stream.write_all(&ubuf[written..]).await?;
            up.stream.flush().await
        };
        match timeout(idle, write).await {
            Err(_) => return Err((ProxyError::UpstreamIdle, Phase::ResponseHead)),
            Ok(Err(e)) => return Err((ProxyError::UpstreamIo(e), Phase::ResponseHead)),
            Ok(Ok(())) => {}
        }
    }
    let head_failed = |e: ProxyError| (e, Phase::ResponseHead);
    let (mut ur, mut uw) = up.stream.split();
    if let Some(body) = body {
        // While the body streams up, the client connection is being read for it: interim
        // heads are held until the upload ends (no head timeout runs yet: the body has its own).
        let body_fut = forward_body(client, client_buf, &mut uw, body, chunked, idle);
        tokio::pin!(body_fut);
        loop {
            let head_fut = read_response_head(&mut ur, &mut up.rbuf, method);
            tokio::select! {
                biased;
                r = head_fut => match r.map_err(head_failed)? {
                    Head::Interim(raw) => interim.hold(raw).map_err(head_failed)?,
                    Head::Final(h) => {
                        // A success that arrives before the upload ends (a server streaming its
                        // answer while it reads): finish the upload first, so the request is
                        // complete and both connections stay reusable. An early error ends the
                        // upload (the server refused it).
                        if h.status() < 300 {
                            body_fut.await.map_err(|e| (e, Phase::RequestBody))?;
                            return Ok((h, true));
                        }
                        return Ok((h, false));
                    }
                },
                r = &mut body_fut => {
                    r.map_err(|e| (e, Phase::RequestBody))?;
                    break;
                }
            }
        }
    }
    // The upload is over (or there was none): the head timeout runs, and interim heads go out
    // as they arrive (a slow client's write of one does not count against the server).
    let client_io = |e: std::io::Error| (ProxyError::ClientIo(e), Phase::ResponseHead);
    interim
        .flush(client, send_timeout)
        .await
        .map_err(client_io)?;
    let mut deadline = tokio::time::Instant::now() + header_timeout;
    loop {
        let head_fut = read_response_head(&mut ur, &mut up.rbuf, method);
        let head = match timer.timeout_at(deadline, head_fut).await {
            None => return Err((ProxyError::ResponseTimeout, Phase::ResponseHead)),
            Some(r) => r.map_err(head_failed)?,
        };
        match head {
            Head::Final(h) => return Ok((h, true)),
            Head::Interim(raw) => {
                interim.hold(raw).map_err(head_failed)?;
                let began = tokio::time::Instant::now();
                interim
                    .flush(client, send_timeout)
                    .await
                    .map_err(client_io)?;
                deadline += began.elapsed();
            }
        }
    }
}

async fn forward_body<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    client: &mut R,
    rbuf: &mut BytesMut,
    upstream: &mut W,
    body: &mut ClientBody,
    chunked: bool,
    idle: Duration,
) -> Result<(), ProxyError> {
    let mut scratch = BytesMut::new();
    while let Some(data) = body.next(client, rbuf).await? {
        let write = async {
            write_framed(upstream, &mut scratch, &data, chunked).await?;
            upstream.flush().await
        };
        match timeout(idle, write).await {
            Err(_) => return Err(ProxyError::UpstreamIdle),
            Ok(Err(e)) => return Err(ProxyError::UpstreamIo(e)),
            Ok(Ok(())) => {}
        }
    }
    if chunked {
        scratch.clear();
        encode::last_chunk(&mut scratch, &crate::headers::trailer_lines(&body.trailers));
        let write = async {
            upstream.write_all(&scratch).await?;
            upstream.flush().await
        };
        match timeout(idle, write).await {
            Err(_) => return Err(ProxyError::UpstreamIdle),
            Ok(r) => r.map_err(ProxyError::UpstreamIo)?,
        }
    }
    Ok(())
}

/// One response head read from an upstream.
pub(crate) enum Head {
    /// An interim (1xx, not 101) head, raw as it came.
    Interim(Bytes),
    /// The final head (101 included).
    Final(ResponseHead),
}

/// Read the next response head: an interim one or the final one. Cancel-safe (what was read
/// stays in `rbuf`), so callers make a new one for each head.
pub(crate) async fn read_response_head<R: AsyncRead + Unpin>(
    ur: &mut R,
    rbuf: &mut BytesMut,
    method: &Method,
) -> Result<Head, ProxyError> {
    let limits = Limits::default();
    // Parse only when the new bytes may end the head (linear work for a trickled head).
    let mut scanned = 0;
    loop {
        if !rbuf.is_empty()
            && (head_may_be_complete(rbuf, scanned) || rbuf.len() > limits.max_head_bytes)
        {
            scanned = rbuf.len();
            match parse_response(rbuf, method, &limits) {
                Ok(Some(h)) if (100..200).contains(&h.status()) && h.status() != 101 => {
                    return Ok(Head::Interim(interim_head(&h)));
                }
                Ok(Some(h)) => return Ok(Head::Final(h)),
                Ok(None) => {}
                Err(e) => return Err(ProxyError::BadResponse(e)),
            }
        } else {
            scanned = rbuf.len();
        }
        if rbuf.capacity() - rbuf.len() < 4096 {
            rbuf.reserve(16 * 1024);
        }
        match ur.read_buf(rbuf).await {
            Ok(0) => return Err(ProxyError::UpstreamClosed),
            Ok(_) => {}
            Err(e) => return Err(ProxyError::UpstreamIo(e)),
        }
    }
}

/// An interim head as passed on: the server's status line and fields without the hop-by-hop
/// ones (`Connection`, `Keep-Alive`, ... and those `Connection` names: RFC 9110 7.6.1), as a
/// final response is relayed.
fn interim_head(h: &ResponseHead) -> Bytes {
    let mut out = BytesMut::with_capacity(h.raw().len());
    encode::status_line(&mut out, h.status(), h.reason());
    for (name, value) in h.fields() {
        if !h.is_hop_by_hop(name) {
            encode::field(&mut out, name, value);
        }
    }
    encode::end_head(&mut out);
    out.freeze()
}

/// The interim (1xx) heads of one attempt on an HTTP/1.1 server, passed to an HTTP/1.1 client
/// as they arrive (103 Early Hints lets the browser preload while the server still works on
/// the answer). Heads that arrive while the client connection is read for the request body
/// are held until the upload ends. At most [`MAX_INTERIM`] are accepted.
///
/// The first interim head commits the attempt: the request is not retried after it
/// (`Retry::commit`), as if the response had begun, even when the route's policy would retry
/// the failure that follows. Retrying could show the client the hints of one server and the
/// answer of another, or hold every hint until the final head, which defeats 103 exactly for
/// the requests that are retried (body-less GETs, the ones browsers preload for). A later
/// failure gets its 502/504 after the interim heads, which RFC 9110 15.2 allows.
pub(crate) struct Interims {
    /// Interim heads the server sent so far in this attempt.
    pub seen: usize,
    /// The client gets them (HTTP/1.1; HTTP/1.0 clients get none, RFC 9110 15.2).
    to_client: bool,
    /// Heads read but not yet written to the client.
    held: Vec<Bytes>,
}

impl Interims {
    pub(crate) fn new(to_client: bool) -> Self {
        Interims {
            seen: 0,
            to_client,
            held: Vec::new(),
        }
    }

    /// Count one interim head and keep it for the client; too many is an upstream error.
    fn hold(&mut self, raw: Bytes) -> Result<(), ProxyError> {
        if self.seen >= MAX_INTERIM {
            return Err(ProxyError::TooManyInterim);
        }
        self.seen += 1;
        if self.to_client {
            self.held.push(raw);
        }
        Ok(())
    }

    /// Write the held heads to the client, if any.
    async fn flush(&mut self, client: &mut ClientStream, limit: Duration) -> std::io::Result<()> {
        if self.held.is_empty() {
            return Ok(());
        }
        // Boxed: rare, and a client write's state would otherwise widen every request's future.
        Box::pin(self.write_held(client, limit)).await
    }

    /// Write the held heads to the client (one write when several wait).
    async fn write_held(
        &mut self,
        client: &mut ClientStream,
        limit: Duration,
    ) -> std::io::Result<()> {
        match self.held.len() {
            0 => return Ok(()),
            1 => send_all(client, &self.held[0], limit).await?,
            _ => send_all(client, &self.held.concat(), limit).await?,
        }
        self.held.clear();
        Ok(())
    }
}

/// Stream the response body from upstream to client. `c.wbuf` holds the response head; small
/// bodies already buffered go out in the same write. Returns once the upstream side is complete,
/// leaving the last bytes in `c.wbuf` for the caller to flush.
async fn relay_body(
    c: &mut Conn,
    up: &mut UpConn,
    framing: Framing,
    chunked: bool,
    idle: Duration,
) -> Result<u64, ProxyError> {
    let mut dec = BodyDecoder::new(framing);
    let mut sent = 0u64;
    loop {
        let step = dec
            .decode(&mut up.rbuf, MAX_CHUNK)
            .map_err(ProxyError::BadResponseBody)?;
        match step {
            Decoded::Data(d) => {
                if chunked {
                    encode::chunk_header(&mut c.wbuf, d.len());
                }
                if c.wbuf.len() + d.len() <= 64 * 1024 {
                    c.wbuf.extend_from_slice(&d);
                    if chunked {
                        c.wbuf.extend_from_slice(b"\r\n");
                    }
                } else {
                    flush(c, &mut sent).await?;
                    send_all(&mut c.stream, &d, c.send_timeout)
                        .await
                        .map_err(ProxyError::ClientIo)?;
                    sent += d.len() as u64;
                    if chunked {
                        c.wbuf.extend_from_slice(b"\r\n");
                    }
                }
            }
            Decoded::Done { trailers } => {
                if chunked {
                    encode::last_chunk(&mut c.wbuf, &crate::headers::trailer_lines(&trailers));
                }
                return Ok(sent);
            }
            Decoded::NeedMore => {
                flush(c, &mut sent).await?;
                if up.rbuf.capacity() - up.rbuf.len() < 4096 {
                    up.rbuf.reserve(MAX_CHUNK);
                }
                let read = match timeout(idle, up.stream.read_buf(&mut up.rbuf)).await {
                    // A TLS server closing without close_notify (common) ends a close-delimited
                    // body as a plain close would; framed bodies still fail the decoder below.
                    Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(Ok(0)),
                    r => r,
                };
                match read {
                    Err(_) => return Err(ProxyError::UpstreamIdle),
                    Ok(Err(e)) => return Err(ProxyError::UpstreamIo(e)),
                    Ok(Ok(0)) => {
                        if let Decoded::Done { .. } =
                            dec.on_eof().map_err(ProxyError::BadResponseBody)?
                        {
                            if chunked {
                                encode::last_chunk(&mut c.wbuf, b"");
                            }
                            return Ok(sent);
                        }
                        return Err(ProxyError::UpstreamClosed);
                    }
                    Ok(Ok(_)) => {}
                }
            }
        }
    }
}

async fn flush(c: &mut Conn, sent: &mut u64) -> Result<(), ProxyError> {
    if !c.wbuf.is_empty() {
        send_all(&mut c.stream, &c.wbuf, c.send_timeout)
            .await
            .map_err(ProxyError::ClientIo)?;
        *sent += c.wbuf.len() as u64;
        c.wbuf.clear();
    }
    Ok(())
}

/// After a 101: send the head, then relay bytes both ways until either side closes.
#[allow(clippy::too_many_arguments)]
async fn tunnel(
    c: &mut Conn,
    mut up: UpConn,
    resp: &ResponseHead,
    route: &Route,
    p: &ProxyAction,
    head: &RequestHead,
    addr: SocketAddr,
    idle: Duration,
) -> Outcome {
    c.wbuf.clear();
    headers::client_response(
        &mut c.wbuf,
        resp,
        ClientFraming::None,
        &route.response_headers,
        p.via,
        head.version(),
        true,
    );
    // Bytes written to the client (the 101 head included, as every HTTP/1.1 response counts
    // its head) and to the upstream, also when the tunnel fails.
    let (mut to_client, mut to_up) = (0u64, 0u64);
    let send_timeout = c.send_timeout;
    let r: Result<(), ProxyError> = async {
        send_all(&mut c.stream, &c.wbuf, send_timeout)
            .await
            .map_err(ProxyError::ClientIo)?;
        to_client += c.wbuf.len() as u64;
        if !up.rbuf.is_empty() {
            send_all(&mut c.stream, &up.rbuf, send_timeout)
                .await
                .map_err(ProxyError::ClientIo)?;
            to_client += up.rbuf.len() as u64;
            up.rbuf.clear();
        }
        if !c.rbuf.is_empty() {
            let early = async {
                up.stream.write_all(&c.rbuf).await?;
                up.stream.flush().await
            };
            bounded(idle, early).await.map_err(upstream_error)?;
            to_up += c.rbuf.len() as u64;
            c.rbuf.clear();
        }
        let ends = TunnelEnds { idle, send_timeout };
        relay_both_ways(
            &mut c.stream,
            &mut up.stream,
            ends,
            &mut to_up,
            &mut to_client,
        )
        .await
    }
    .await;
    c.wbuf.clear();
    let termination = match r {
        Ok(()) => {
            tracing::debug!(peer = %c.peer, upstream = %addr, to_up, to_client, "upgrade tunnel ended");
            Termination::OK
        }
        Err(e) => {
            tracing::debug!(peer = %c.peer, upstream = %addr, to_up, to_client, "upgrade tunnel failed: {e}");
            e.termination(Phase::Tunnel)
        }
    };
    Outcome {
        termination,
        status: 101,
        keep_alive: false,
        bytes_sent: to_client,
        upstream: Some(addr),
    }
}

/// The limits of an upgrade tunnel: silence both ways and each write to the upstream are
/// bounded by the group's `idle_timeout`; each write to the client by the listener's
/// `send_timeout`, as every other client write.
#[derive(Clone, Copy)]
struct TunnelEnds {
    idle: Duration,
    send_timeout: Duration,
}

/// A write (or shutdown) that fails with `TimedOut` when it makes no progress for `limit`: a
/// peer that stops reading would otherwise hang the tunnel for ever, as the idle timer is not
/// polled during a write.
async fn bounded(
    limit: Duration,
    write: impl std::future::Future<Output = std::io::Result<()>>,
) -> std::io::Result<()> {
    match timeout(limit, write).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "tunnel write stalled",
        )),
    }
}

/// An upstream failure in a tunnel: a stalled write is the upstream's timeout.
fn upstream_error(e: std::io::Error) -> ProxyError {
    match e.kind() {
        std::io::ErrorKind::TimedOut => ProxyError::UpstreamIdle,
        _ => ProxyError::UpstreamIo(e),
    }
}

/// Copy bytes both ways until both sides have closed; half-closes are passed on. A failure
/// names its side: the client's read or write (a write stalled for `send_timeout` is a client
/// timeout), the upstream's (a write stalled for `idle` is an upstream timeout), or silence
/// both ways for `idle` (recorded as the upstream's idle timeout, as in the HTTP/2 tunnel). The
/// bytes copied each way are added to `a_to_b` and `b_to_a` as they are written, so a failed
/// tunnel counts them too.
async fn relay_both_ways(
    a: &mut ClientStream,
    b: &mut UpStream,
    ends: TunnelEnds,
    a_to_b: &mut u64,
    b_to_a: &mut u64,
) -> Result<(), ProxyError> {
    let TunnelEnds { idle, send_timeout } = ends;
    let (mut ar, mut aw) = tokio::io::split(a);
    let (mut br, mut bw) = b.split();
    let mut abuf = vec![0u8; 16 * 1024];
    let mut bbuf = vec![0u8; 16 * 1024];
    let (mut a_open, mut b_open) = (true, true);
    let sleep = tokio::time::sleep(idle);
    tokio::pin!(sleep);
    while a_open || b_open {
        tokio::select! {
            r = ar.read(&mut abuf), if a_open => {
                let n = r.map_err(ProxyError::ClientIo)?;
                if n == 0 {
                    a_open = false;
                    bounded(idle, bw.shutdown()).await.map_err(upstream_error)?;
                } else {
                    let write = async {
                        bw.write_all(&abuf[..n]).await?;
                        bw.flush().await
                    };
                    bounded(idle, write).await.map_err(upstream_error)?;
                    *a_to_b += n as u64;
                }
            }
            r = br.read(&mut bbuf), if b_open => {
                let n = r.map_err(ProxyError::UpstreamIo)?;
                if n == 0 {
                    b_open = false;
                    bounded(send_timeout, aw.shutdown()).await.map_err(ProxyError::ClientIo)?;
                } else {
                    let write = async {
                        aw.write_all(&bbuf[..n]).await?;
                        aw.flush().await
                    };
                    bounded(send_timeout, write).await.map_err(ProxyError::ClientIo)?;
                    *b_to_a += n as u64;
                }
            }
            _ = &mut sleep => return Err(ProxyError::UpstreamIdle),
        }
        sleep.as_mut().reset(tokio::time::Instant::now() + idle);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{client_gone, cookie_value};
    use crate::stats::{Cause, Phase, Side, Termination};
    use std::io::{Error, ErrorKind};

    #[test]
    fn a_failed_interim_write_keeps_its_cause() {
        let addr = "127.0.0.1:9".parse().unwrap();
        let stalled = client_gone(103, addr, Error::new(ErrorKind::TimedOut, "no room"));
        let timeout = Termination::new(Side::Client, Phase::ResponseHead, Cause::Timeout);
        assert_eq!(stalled.termination, timeout);
        assert!(!stalled.keep_alive);
        let reset = client_gone(103, addr, ErrorKind::ConnectionReset.into());
        assert_eq!(reset.termination.cause, Cause::Io);
    }

    #[test]
    fn interim_heads_lose_their_hop_by_hop_fields() {
        let mut raw = bytes::BytesMut::from(
            &b"HTTP/1.1 103 Early Hints\r\nConnection: close, x-hop\r\nX-Hop: 1\r\n\
               Keep-Alive: timeout=5\r\nLink: </a.css>; rel=preload\r\n\r\n"[..],
        );
        let limits = portico_http1::Limits::default();
        let h = portico_http1::parse_response(&mut raw, &portico_http1::Method::Get, &limits)
            .unwrap()
            .unwrap();
        assert_eq!(
            &super::interim_head(&h)[..],
            b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
        );
    }

    #[test]
    fn cookie_lookup() {
        assert_eq!(
            cookie_value(b"a=1; session=xyz; b=2", b"session"),
            Some(b"xyz".as_slice())
        );
        assert_eq!(cookie_value(b"session=", b"session"), Some(b"".as_slice()));
        assert_eq!(cookie_value(b"sessionx=1", b"session"), None);
        assert_eq!(cookie_value(b"", b"session"), None);
    }
}
