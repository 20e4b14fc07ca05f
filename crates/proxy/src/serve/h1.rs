//! One HTTP/1.1 connection's task: read each request head under its deadlines, hand the request to the flow, log it, then keep the connection alive (asleep, without buffers, once idle) or close it (lingering after an error).

use crate::conn::{write_simple, Conn, Ctx, HeadScan};
use crate::downstream::http1::H1Down;
use crate::error::error_body;
use crate::error::ProxyError;
use crate::serve::sniff::{classify, Sniffed};
use crate::stream::ClientStream;
use crate::telemetry::stats::{Cause, Outcome, Phase, Side, Termination};
use crate::telemetry::timing::Timings;
use bytes::BytesMut;
use portico_http1::{parse_request, RequestHead};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;

/// How long a closing connection keeps reading after an error response.
const LINGER: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a kept-alive connection waits for its next request with its buffers.
const IDLE_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// The read buffer a sleeping TLS connection keeps (a request head usually fits); a plain one
/// keeps none.
const IDLE_READ: usize = 1024;

/// While the process drains (a stop or a binary upgrade), a kept-alive connection idle this long
/// is closed; a busier one is left open for its next request, which is answered with
/// `Connection: close`. Closing a connection whose client is sending a request at that moment
/// loses the request, so only connections quiet for a while are closed unasked.
const DRAIN_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

// An awake connection's wait hands it to `sleep` after `IDLE_GRACE`, before a drain would close
// it: that wait need not watch for a drain (`sleep` does).
const _: () = assert!(DRAIN_IDLE.as_millis() > IDLE_GRACE.as_millis());

/// When an idle connection that has been idle since `since` is closed: at its keep-alive
/// timeout, or [`DRAIN_IDLE`] after `since` while the process drains.
fn idle_due(
    since: tokio::time::Instant,
    keepalive: std::time::Duration,
    draining: bool,
) -> tokio::time::Instant {
    let due = since + keepalive;
    match draining {
        true => due.min(since + DRAIN_IDLE),
        false => due,
    }
}

/// A plain connection whose first bytes were the HTTP/2 preface, for the HTTP/2 path: its
/// stream, what was read from it, and its context.
pub struct Handoff {
    pub stream: ClientStream,
    pub read: BytesMut,
    pub ctx: Ctx,
}

/// Serve one accepted connection until it closes; its first head deadline runs from
/// `accepted`. With `sniff` (a plain connection that may speak HTTP/2 with prior knowledge),
/// the first bytes read decide the protocol: the HTTP/2 preface ends this path with a
/// [`Handoff`]. A new plain connection waits for its first bytes ([`first_bytes`]) without
/// buffers and without its request future, as a sleeping one does: a client that connects and
/// stays silent costs its task and that small wait until the head deadline closes it.
///
/// Awake, the connection runs [`serve_awake`] on the heap; idle past [`IDLE_GRACE`] that future
/// (the request path's state, several KB) is dropped and the connection sleeps in this small
/// one, with no buffer on plain TCP, until bytes come. Busy connections pay nothing for it: the
/// awake future is built once per wake-up, not per request.
///
/// Not an `async fn`: the connection state is built here and moved into the future once (an
/// `async fn` keeps its arguments and their moved copies side by side in the future, and this
/// future is what an idle connection costs).
pub fn serve_since(
    stream: ClientStream,
    peer: SocketAddr,
    mut ctx: Ctx,
    accepted: Instant,
    mut sniff: bool,
) -> impl std::future::Future<Output = Option<Handoff>> {
    let mut c = Conn {
        client_cert: stream.client_cert().map(Box::new),
        stream,
        peer,
        client_ip: crate::conn::ip_text(peer.ip()),
        // Taken when the first bytes come (`first_bytes` or `read_head`, `restore_buffers`).
        rbuf: BytesMut::new(),
        wbuf: BytesMut::new(),
        ubuf: BytesMut::new(),
        requests: 0,
        timings: Timings::default(),
        send_timeout: ctx.ls.listener.limits.send_timeout,
        timer: crate::fast_timeout::LazyTimer::default(),
    };
    async move {
        // Boxed: the wait's state is not carried by the connection's task afterwards. TLS
        // connections have their first bytes already (the handshake).
        if !c.stream.is_tls() && !Box::pin(first_bytes(&mut c, &ctx, accepted)).await {
            // A connection that closed at once (a health check's probe) gives its buffer back.
            c.release_buffers(0);
            return None;
        }
        loop {
            match Box::pin(serve_awake(&mut c, &mut ctx, accepted, &mut sniff)).await {
                Awake::Closed => {
                    c.release_buffers(0);
                    return None;
                }
                Awake::Http2 => {
                    return Some(Handoff {
                        stream: c.stream,
                        read: c.rbuf,
                        ctx,
                    })
                }
                Awake::Sleep => {}
            }
            if !sleep(&mut c, &mut ctx).await {
                c.release_buffers(0);
                return None;
            }
        }
    }
}

/// A new plain connection's wait for its first bytes, read into `c.rbuf` (true when they came):
/// without buffers or the request future while nothing came, as a sleeping connection waits. A
/// connection that stays silent until the head deadline, or closes first, is closed without a
/// word, as `read_head` would.
async fn first_bytes(c: &mut Conn, ctx: &Ctx, accepted: Instant) -> bool {
    let ClientStream::Plain(tcp) = &c.stream else {
        return true;
    };
    let due = tokio::time::Instant::from_std(accepted) + ctx.ls.listener.limits.head_timeout;
    loop {
        if !matches!(c.timer.timeout_at(due, tcp.readable()).await, Some(Ok(()))) {
            return false;
        }
        // A new socket is reported readable before anything came: the buffer is given back
        // until bytes do.
        c.rbuf = crate::conn::spare_buffer();
        match tcp.try_read_buf(&mut c.rbuf) {
            Ok(0) => return false,
            Ok(_) => return true,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                crate::conn::give_back(std::mem::take(&mut c.rbuf));
            }
            Err(_) => return false,
        }
    }
}

/// How an awake connection's requests ended.
enum Awake {
    /// The connection closed.
    Closed,
    /// Idle past [`IDLE_GRACE`]: it goes to sleep.
    Sleep,
    /// Its first bytes were the HTTP/2 preface.
    Http2,
}

/// Serve requests until the connection closes, stays idle past [`IDLE_GRACE`] or turns out to
/// speak HTTP/2 (with `sniff`, cleared once its first bytes say HTTP/1).
async fn serve_awake(c: &mut Conn, ctx: &mut Ctx, accepted: Instant, sniff: &mut bool) -> Awake {
    loop {
        let mut began = None;
        let head = match read_head(c, ctx, accepted, &mut began, sniff).await {
            Ok(Next::Head(h)) => h,
            Ok(Next::Closed) => return Awake::Closed,
            Ok(Next::Sleep) => return Awake::Sleep,
            Ok(Next::Http2) => return Awake::Http2,
            Ok(Next::Neither) => {
                // Not an HTTP/1.x request line and not the preface: an invalid preface is a
                // connection error (RFC 9113 3.4), so the connection closes without an answer.
                let stats = &ctx.shared.stats;
                stats.requests.fetch_add(1, Ordering::Relaxed);
                stats.record(Termination::new(
                    Side::Client,
                    Phase::RequestHead,
                    Cause::BadRequest,
                ));
                tracing::debug!(peer = %c.peer, "neither HTTP/1.x nor the HTTP/2 preface: closed");
                return Awake::Closed;
            }
            Err(e) => {
                // Its total runs from the request's start, not from the connection's.
                let start = began.unwrap_or_else(Instant::now);
                // Only count it as a request if bytes of one arrived.
                if !matches!(e, ProxyError::ClientClosed) || !c.rbuf.is_empty() {
                    ctx.shared.stats.requests.fetch_add(1, Ordering::Relaxed);
                    let t = e.termination(Phase::RequestHead);
                    ctx.shared.stats.record(t);
                    tracing::debug!(peer = %c.peer, "request head refused: {e}");
                    if !e.client_gone() {
                        let status = e.status();
                        let sent = write_simple(
                            c,
                            status,
                            "text/plain",
                            error_body(status),
                            false,
                            None,
                            &[],
                        )
                        .await;
                        // No head: no phases but the total (not the previous request's).
                        c.timings = Timings::default();
                        log_access(
                            ctx,
                            c,
                            None,
                            &Outcome {
                                termination: t,
                                status,
                                keep_alive: false,
                                bytes_sent: sent.unwrap_or(0),
                                upstream: None,
                            },
                            start,
                        );
                    }
                    close(c, true).await;
                }
                return Awake::Closed;
            }
        };
        c.requests += 1;
        c.restore_buffers();
        // The one clock read at the head: the head phase, the pick time of a proxied request,
        // and the start of a kept-alive connection's request.
        let now = Instant::now();
        let started = began.unwrap_or(now);
        c.timings = Timings::begin(now);
        refresh(ctx);
        c.send_timeout = ctx.ls.listener.limits.send_timeout;
        ctx.shared.stats.requests.fetch_add(1, Ordering::Relaxed);
        let outcome = handle(c, ctx, &head, started).await;
        // The keep-alive wait runs from the response's end (answers the flow refused early,
        // a 404 without a route, did not mark it).
        if c.timings.done.is_none() {
            c.timings.done = Some(Instant::now());
        }
        ctx.shared.stats.record(outcome.termination);
        log_access(ctx, c, Some(&head), &outcome, started);
        if !outcome.keep_alive {
            let lingering = outcome.termination != Termination::OK;
            close(c, lingering).await;
            return Awake::Closed;
        }
    }
}

/// An idle connection asleep: its buffers given back (a TLS one keeps [`IDLE_READ`] to read its
/// records into), waiting for bytes, its keep-alive timeout or shutdown. True when bytes came.
async fn sleep(c: &mut Conn, ctx: &mut Ctx) -> bool {
    let since = c.timings.done.unwrap_or_else(Instant::now);
    let since = tokio::time::Instant::from_std(since);
    let keepalive = ctx.ls.listener.limits.keepalive_timeout;
    if c.stream.is_tls() {
        c.release_buffers(IDLE_READ);
    } else {
        c.release_buffers(0);
    }
    loop {
        let draining = *ctx.shutdown.borrow();
        let due = idle_due(since, keepalive, draining);
        let ready = match &mut c.stream {
            ClientStream::Plain(tcp) => tokio::select! {
                biased;
                r = tcp.readable() => r.map(|()| 1),
                _ = c.timer.until(due) => return false,
                // Draining from now on: the connection may close sooner.
                _ = ctx.shutdown.changed(), if !draining => continue,
            },
            stream => tokio::select! {
                biased;
                r = stream.read_buf(&mut c.rbuf) => r,
                _ = c.timer.until(due) => return false,
                _ = ctx.shutdown.changed(), if !draining => continue,
            },
        };
        if c.stream.is_tls() {
            return matches!(ready, Ok(n) if n > 0);
        }
        // Bytes (or the end) came: a buffer again to read them into.
        c.rbuf = crate::conn::spare_buffer();
        return ready.is_ok();
    }
}

/// Move the connection to the newest configuration snapshot before a request starts. A listener
/// that a reload removed keeps its last state; its stop signal ends the connection after this
/// request.
fn refresh(ctx: &mut Ctx) {
    if ctx.worker.generation() == ctx.shared.generation {
        return;
    }
    let newest = ctx.worker.snapshot();
    if let Some(ls) = newest.listener(ctx.ls.slot) {
        ctx.ls = ls.clone();
        ctx.shared = newest;
    }
}

/// Close the connection. After an error the client may still be sending (a refused body): read
/// and discard for a moment so the kernel does not answer with a reset that destroys our response.
/// A clean close of plain TCP is the socket's close alone (its FIN is the same as a shutdown's,
/// one system call fewer); TLS sends its close_notify first.
async fn close(c: &mut Conn, lingering: bool) {
    if !lingering && !c.stream.is_tls() {
        return;
    }
    let _ = c.stream.shutdown().await;
    if lingering {
        let drain = async {
            let mut left: usize = 64 * 1024;
            let mut buf = [0u8; 4096];
            while left > 0 {
                match c.stream.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => left = left.saturating_sub(n),
                }
            }
        };
        let _ = timeout(LINGER, drain).await;
    }
}

fn log_access(ctx: &Ctx, c: &Conn, head: Option<&RequestHead>, o: &Outcome, started: Instant) {
    let protocol = head.map_or("HTTP/1.1", |h| h.version().as_str());
    let tls = c.stream.tls_info();
    let (shared, ls) = (&ctx.shared, &ctx.ls);
    super::finished(
        shared, ls, c.peer, head, protocol, o, &c.timings, started, tls, None,
    );
}

/// What waiting for a request head ended with. Not boxed: it is returned once per request,
/// and a box would be an allocation per request.
#[allow(clippy::large_enum_variant)]
enum Next {
    Head(RequestHead),
    /// The connection ended cleanly between requests (EOF, reset, idle timeout or shutdown).
    Closed,
    /// Idle past [`IDLE_GRACE`]: the connection goes to sleep.
    Sleep,
    /// Sniffing: the first bytes are the HTTP/2 preface.
    Http2,
    /// Sniffing: the first bytes are neither HTTP/1.x nor the HTTP/2 preface.
    Neither,
}

/// Wait for a complete request head. `began` says when the request began, also when its head
/// failed: accept for the first request, its first byte for later ones, `None` when the head
/// came complete in the first read of a kept-alive connection (it began now).
///
/// The parser runs when [`HeadScan`] says the bytes are worth it, so a head trickled in tiny
/// pieces costs linear, not quadratic, work. While `sniff` is set, the bytes
/// first say which protocol this is ([`classify`]); it is cleared once they say HTTP/1.
async fn read_head(
    c: &mut Conn,
    ctx: &mut Ctx,
    accepted: Instant,
    began: &mut Option<Instant>,
    sniff: &mut bool,
) -> Result<Next, ProxyError> {
    let limits = &ctx.ls.listener.limits;
    *began = (c.requests == 0).then_some(accepted);
    // A new connection gets the head deadline at once; a kept-alive one waits idle first.
    let mut deadline = if c.requests == 0 {
        Some(tokio::time::Instant::from_std(accepted) + limits.head_timeout)
    } else {
        None
    };
    let mut scan = HeadScan::default();
    loop {
        // Empty lines before a request are allowed (RFC 9112 2.2): they start nothing.
        if c.rbuf.iter().all(|&b| b == b'\r' || b == b'\n') {
            c.rbuf.clear();
            scan.restart();
        }
        if *sniff && !c.rbuf.is_empty() {
            match classify(&c.rbuf) {
                Some(Sniffed::Http1) => *sniff = false,
                Some(Sniffed::Http2) => return Ok(Next::Http2),
                Some(Sniffed::Neither) => return Ok(Next::Neither),
                // More bytes are needed (a first request has its head deadline already).
                None => {}
            }
        }
        if !*sniff && !c.rbuf.is_empty() {
            if scan.worth_parsing(&c.rbuf, limits.max_head_bytes, limits.max_request_line) {
                match parse_request(&mut c.rbuf, &ctx.ls.limits) {
                    Ok(Some(h)) => return Ok(Next::Head(h)),
                    Ok(None) => scan.incomplete(&c.rbuf),
                    Err(e) => return Err(ProxyError::BadHead(e)),
                }
            }
            if deadline.is_none() {
                let now = tokio::time::Instant::now();
                *began = Some(now.into_std());
                deadline = Some(now + limits.head_timeout);
            }
        }
        // An idle connection reads into what it kept; any other read has room for a head.
        if c.rbuf.capacity() - c.rbuf.len() < 1024 && !(deadline.is_none() && c.rbuf.is_empty()) {
            c.rbuf.reserve(8 * 1024);
        }
        let n = match deadline {
            None => {
                let draining = *ctx.shutdown.borrow();
                // Idle since the last response ended (its end was read for the access log).
                let since = c.timings.done.unwrap_or_else(Instant::now);
                let since = tokio::time::Instant::from_std(since);
                let due = idle_due(since, limits.keepalive_timeout, draining);
                // A connection still idle after `IDLE_GRACE` goes to sleep (a busy one's next
                // request comes sooner and keeps the connection awake). A drain that begins
                // meanwhile changes neither moment (`DRAIN_IDLE` is longer): `sleep` watches
                // for it, this wait does not (watching cost a registration per request).
                let wake = due.min(since + IDLE_GRACE);
                tokio::select! {
                    biased;
                    r = c.stream.read_buf(&mut c.rbuf) => r,
                    _ = c.timer.until(wake) => {
                        if wake < due {
                            return Ok(Next::Sleep);
                        }
                        return Ok(Next::Closed);
                    }
                }
            }
            // The connection's one timer (no timer of its own in this future).
            Some(d) => match c.timer.timeout_at(d, c.stream.read_buf(&mut c.rbuf)).await {
                None if c.rbuf.is_empty() && c.requests == 0 => return Ok(Next::Closed),
                None => return Err(ProxyError::HeadTimeout),
                Some(r) => r,
            },
        };
        match n {
            Ok(0) | Err(_) if c.rbuf.is_empty() => return Ok(Next::Closed),
            Ok(0) => return Err(ProxyError::ClientClosed),
            Ok(_) => {}
            Err(e) => return Err(ProxyError::ClientIo(e)),
        }
    }
}

async fn handle(c: &mut Conn, ctx: &Ctx, head: &RequestHead, started: Instant) -> Outcome {
    let mut down = H1Down {
        c,
        ctx,
        client: None,
    };
    crate::flow::serve(&mut down, head, started).await
}
