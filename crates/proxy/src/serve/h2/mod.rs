//! Downstream HTTP/2: protocol choice per connection (ALPN `h2`, h2c prior knowledge), the connection loop (settings, drain, idle, rapid-reset defence), one local task per stream.

mod cork;
pub(crate) mod frame_scan;
pub(crate) mod request;
mod stream;

use crate::downstream::link::Link;
pub use crate::websocket::websocket_accept;

use crate::conn::Ctx;
use crate::stream::ClientStream;
use crate::telemetry::stats::{Cause, Phase, Side, Termination};
use bytes::Bytes;
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

/// How long a connection without streams keeps its write buffer: a busy connection's next
/// stream comes sooner and finds it (as an HTTP/1.1 connection keeps its buffers).
const RELEASE_AFTER: Duration = Duration::from_millis(500);

/// The HTTP/2 client connection preface (RFC 9113 3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Run an accepted (and TLS-terminated) connection as HTTP/2 or HTTP/1.1. Not an `async fn`:
/// the future holds its arguments once (see `serve_since`).
#[allow(clippy::manual_async_fn)]
pub fn dispatch(
    stream: ClientStream,
    peer: SocketAddr,
    ctx: Ctx,
) -> impl std::future::Future<Output = ()> {
    async move {
        let settings = ctx.ls.listener.http2;
        if !settings.enabled {
            return crate::serve::h1::serve_since(stream, peer, ctx, Instant::now()).await;
        }
        // The first head deadline runs from here, sniffing included.
        let accepted = Instant::now();
        let proto = match &stream {
            ClientStream::Tls(t) => {
                if t.get_ref().1.alpn_protocol() == Some(b"h2") {
                    Sniffed::Http2
                } else {
                    Sniffed::Http1
                }
            }
            ClientStream::Plain(s) => {
                let deadline =
                    tokio::time::Instant::from_std(accepted) + ctx.ls.listener.limits.head_timeout;
                // Boxed: its timer and peek buffer are gone once the protocol is known.
                Box::pin(sniff(s, deadline)).await
            }
        };
        match proto {
            // Boxed: an HTTP/1 connection's task does not carry HTTP/2's state.
            Sniffed::Http2 => Box::pin(serve(stream, peer, ctx)).await,
            // A sniff that ran out of time lands here too: the HTTP/1 path finds its head deadline
            // (from `accepted`) already passed and closes as for any head timeout (silently when
            // nothing arrived, 408 when part of a head did).
            Sniffed::Http1 => crate::serve::h1::serve_since(stream, peer, ctx, accepted).await,
            Sniffed::Neither => {
                // Not an HTTP/1.x request line and not the preface: an invalid preface is a
                // connection error (RFC 9113 3.4), so the connection closes without an answer.
                let stats = &ctx.shared.stats;
                stats.requests.fetch_add(1, Ordering::Relaxed);
                stats.record(Termination::new(
                    Side::Client,
                    Phase::RequestHead,
                    Cause::BadRequest,
                ));
                tracing::debug!(%peer, "neither HTTP/1.x nor the HTTP/2 preface: closed");
                // Consume what was peeked so the close is a FIN, not a reset.
                if let ClientStream::Plain(s) = &stream {
                    let mut buf = vec![0u8; SNIFF_MAX];
                    let _ = s.try_read(&mut buf);
                }
            }
        }
    }
}

/// What a plain connection's first bytes say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sniffed {
    Http2,
    Http1,
    /// Neither an HTTP/1.x request line nor the HTTP/2 preface.
    Neither,
}

/// Classify the first bytes of a plain connection; `None`: more bytes are needed.
pub fn classify(buf: &[u8]) -> Option<Sniffed> {
    let n = buf.len().min(PREFACE.len());
    if buf[..n] == PREFACE[..n] {
        return (buf.len() >= PREFACE.len()).then_some(Sniffed::Http2);
    }
    // Empty lines before a request are allowed (RFC 9112 2.2).
    let start = buf
        .iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(buf.len());
    let rest = &buf[start..];
    // The usual case, decided from the first bytes: a standard method and a space.
    const METHODS: [&[u8]; 8] = [
        b"GET ",
        b"POST ",
        b"HEAD ",
        b"PUT ",
        b"DELETE ",
        b"OPTIONS ",
        b"PATCH ",
        b"TRACE ",
    ];
    if METHODS.iter().any(|m| rest.starts_with(m)) {
        return Some(Sniffed::Http1);
    }
    match rest.iter().position(|&b| b == b'\n') {
        Some(nl) => {
            let line = rest[..nl].strip_suffix(b"\r").unwrap_or(&rest[..nl]);
            if line.ends_with(b" HTTP/1.1") || line.ends_with(b" HTTP/1.0") {
                Some(Sniffed::Http1)
            } else {
                Some(Sniffed::Neither)
            }
        }
        // A long line without an end: the HTTP/1 codec answers it (414).
        None if buf.len() >= SNIFF_MAX => Some(Sniffed::Http1),
        None => None,
    }
}

/// Bytes peeked at most before deciding.
const SNIFF_MAX: usize = 8 * 1024;

/// Peek (without consuming) until [`classify`] decides, all of it (the first peek included)
/// before `deadline`, the head deadline measured from accept. A connection that closes or
/// stalls goes to the HTTP/1 path, which handles both.
async fn sniff(s: &TcpStream, deadline: tokio::time::Instant) -> Sniffed {
    let work = async {
        // One small peek decides nearly every connection (the preface, or a method and a space).
        let mut first = [0u8; PREFACE.len()];
        match s.peek(&mut first).await {
            Ok(0) | Err(_) => return Sniffed::Http1,
            Ok(n) => {
                // `classify` only answers once more bytes cannot change the answer.
                if let Some(v) = classify(&first[..n]) {
                    return v;
                }
            }
        }
        let mut buf = vec![0u8; SNIFF_MAX];
        let mut seen = 0;
        let mut backoff = Duration::from_millis(1);
        loop {
            let n = match s.peek(&mut buf).await {
                Ok(0) | Err(_) => return Sniffed::Http1,
                Ok(n) => n,
            };
            if let Some(v) = classify(&buf[..n]) {
                return v;
            }
            // Peeking does not consume, so readiness stays set: wait a little for more bytes
            // (a preface or request line split across segments is rare).
            if n == seen {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(50));
            } else {
                backoff = Duration::from_millis(1);
            }
            seen = n;
        }
    };
    tokio::time::timeout_at(deadline, work)
        .await
        .unwrap_or(Sniffed::Http1)
}

/// Serve an HTTP/2 connection until it closes: accept streams (one local task each), GOAWAY on
/// shutdown or listener stop (streams in flight finish), on idleness, after
/// `max_requests_per_connection` streams, and ENHANCE_YOUR_CALM on a reset flood. A drain the
/// client does not complete (no PING ack, or it stopped reading) is cut once no stream is active
/// and the keep-alive timeout (at most the drain timeout on shutdown) has passed.
pub async fn serve(stream: ClientStream, peer: SocketAddr, mut ctx: Ctx) {
    let settings = ctx.ls.listener.http2;
    let limits = ctx.ls.listener.limits;
    let mut builder = h2::server::Builder::new();
    builder
        .max_concurrent_streams(settings.max_concurrent_streams)
        .max_header_list_size(settings.max_header_list_size)
        .initial_window_size(settings.initial_window_size)
        .initial_connection_window_size(
            settings
                .initial_window_size
                .saturating_mul(4)
                .min((1 << 31) - 1),
        )
        .max_frame_size(settings.max_frame_size)
        // Streams reset before this task accepted them (h2 answers ENHANCE_YOUR_CALM itself).
        .max_pending_accept_reset_streams(settings.max_resets.min(20) as usize);
    if settings.extended_connect {
        // RFC 8441: WebSockets over HTTP/2 (`downstream::tunnel`).
        builder.enable_connect_protocol();
    }
    let link = Rc::new(Link {
        local: crate::stream::local_addr(&stream),
        tls: stream.is_tls(),
        tls_info: stream.tls_info().map(|(v, sni)| (v, sni.map(Box::from))),
        client_cert: stream.client_cert().map(Box::new),
        ..Link::new(&ctx, peer, settings)
    });
    let (corked, cork) = cork::cork(stream);
    let handshake = async {
        let mut hs = std::pin::pin!(builder.handshake::<_, Bytes>(corked));
        // The SETTINGS the handshake queues leave through the cork too.
        poll_fn(|cx| {
            let r = hs.as_mut().poll(cx);
            cork.drain(cx);
            // Counted in the connection's window (the cork reads no more past the limit until
            // the count is taken).
            link.ping_acks(cork.take_ping_acks());
            r
        })
        .await
    };
    let mut conn = match tokio::time::timeout(limits.head_timeout, handshake).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            tracing::debug!(%peer, "HTTP/2 handshake failed: {e}");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "HTTP/2 preface not received in time");
            return;
        }
    };
    ctx.shared
        .stats
        .h2_connections
        .fetch_add(1, Ordering::Relaxed);
    let mut draining = false;
    // When draining began, and the grace the client then has (once no stream is active) to
    // answer the GOAWAY's PING and let h2 close: a client that never acks, or stopped reading,
    // would otherwise hold the connection forever.
    let mut drain_from: Option<Instant> = None;
    let mut grace = limits.keepalive_timeout;
    let mut served: u64 = 0;
    // The cork's write count when last seen, and since when it has not moved: the write buffer
    // goes back once no stream is active and nothing was written for `RELEASE_AFTER` (a PING
    // answered while idle takes a buffer, given back again 500 ms later).
    let mut quiet = (cork.writes(), tokio::time::Instant::now());
    // ENHANCE_YOUR_CALM was sent for a PING ACK flood (once per connection).
    let mut calmed = false;
    if *ctx.shutdown.borrow() {
        conn.graceful_shutdown();
        draining = true;
        grace = grace.min(ctx.shared.config.drain_timeout);
    }
    loop {
        if draining && drain_from.is_none() {
            drain_from = Some(Instant::now());
        }
        let idle_armed = !draining && link.active.get() == 0;
        let idle_at =
            tokio::time::Instant::from_std(link.idle_since.get()) + limits.keepalive_timeout;
        let drain_at = drain_from
            .filter(|_| link.active.get() == 0)
            .map(|t| tokio::time::Instant::from_std(t.max(link.idle_since.get())) + grace);
        let release_armed = idle_armed && cork.holds_buffer();
        let release_at =
            tokio::time::Instant::from_std(link.idle_since.get()).max(quiet.1) + RELEASE_AFTER;
        tokio::select! {
            biased;
            _ = link.calm.notified() => {
                crate::telemetry::logging::log_limited!(info, %peer, "HTTP/2 reset flood: GOAWAY ENHANCE_YOUR_CALM");
                ctx.shared.stats.h2_reset_floods.fetch_add(1, Ordering::Relaxed);
                conn.abrupt_shutdown(h2::Reason::ENHANCE_YOUR_CALM);
                draining = true;
            }
            r = ctx.shutdown.changed(), if !draining => {
                if r.is_err() || *ctx.shutdown.borrow() {
                    conn.graceful_shutdown();
                    draining = true;
                    // The worker waits no longer than this for its connections.
                    grace = grace.min(ctx.shared.config.drain_timeout);
                }
            }
            _ = tokio::time::sleep_until(drain_at.unwrap_or_else(tokio::time::Instant::now)),
                if drain_at.is_some() => {
                // As for the idle timer: a stream accepted since the timer was armed defers it.
                let due = drain_from
                    .map(|t| tokio::time::Instant::from_std(t.max(link.idle_since.get())) + grace);
                let now = tokio::time::Instant::now();
                if link.active.get() == 0 && due.is_some_and(|d| now >= d) {
                    tracing::debug!(%peer, "HTTP/2 drain not completed by the client in time: closed");
                    break;
                }
            }
            _ = tokio::time::sleep_until(release_at), if release_armed => {
                // As for the idle timer: only a connection idle this long gives its buffer
                // back. Each turn either gives it back or moves the deadline on: no spin.
                let now = tokio::time::Instant::now();
                let writes = cork.writes();
                let due = tokio::time::Instant::from_std(link.idle_since.get()) + RELEASE_AFTER;
                if writes != quiet.0 {
                    // written since: quiet from now
                    quiet = (writes, now);
                } else if link.active.get() == 0 && now >= due && !cork.release() {
                    // bytes still leaving: try again later
                    quiet.1 = now;
                }
            }
            _ = tokio::time::sleep_until(idle_at), if idle_armed => {
                // Streams may have come and gone since the timer was armed (the loop does not
                // come round for each accepted stream): only a connection idle this long ends.
                let due = tokio::time::Instant::from_std(link.idle_since.get())
                    + limits.keepalive_timeout;
                if link.active.get() == 0 && tokio::time::Instant::now() >= due {
                    conn.graceful_shutdown();
                    draining = true;
                }
            }
            // Only wakes the loop to re-arm the idle timer. A stream that came and went while the
            // timer was armed leaves a permit here: one harmless extra turn of the loop.
            _ = link.idle.notified(), if !idle_armed => {}
            // Every stream ready is accepted in one poll; whatever the poll wrote leaves in one
            // write after it.
            r = poll_fn(|cx| {
                let r = loop {
                    match conn.poll_accept(cx) {
                        Poll::Ready(Some(Ok((req, respond)))) => {
                            served += 1;
                            link.stream_started();
                            let link = link.clone();
                            tokio::task::spawn_local(async move {
                                // Boxed: the stream's state (several KiB) is then written
                                // once, not copied into the task and again when it finishes.
                                Box::pin(stream::handle(&link, req, respond)).await;
                                link.stream_ended();
                            });
                            let max = limits.max_requests_per_connection;
                            if !draining && max > 0 && served >= max {
                                break Poll::Ready(Accepted::Limit);
                            }
                        }
                        Poll::Ready(None) => break Poll::Ready(Accepted::Closed),
                        Poll::Ready(Some(Err(e))) => break Poll::Ready(Accepted::Failed(e)),
                        Poll::Pending => break Poll::Pending,
                    }
                };
                cork.drain(cx);
                if link.ping_acks(cork.take_ping_acks()) && !calmed {
                    return Poll::Ready(Accepted::PingFlood);
                }
                r
            }) => match r {
                Accepted::Closed => break,
                Accepted::Failed(e) => {
                    tracing::debug!(%peer, "HTTP/2 connection ended: {e}");
                    break;
                }
                Accepted::Limit => {
                    conn.graceful_shutdown();
                    draining = true;
                }
                Accepted::PingFlood => {
                    crate::telemetry::logging::log_limited!(info, %peer, "HTTP/2 PING ACK flood: GOAWAY ENHANCE_YOUR_CALM");
                    ctx.shared.stats.h2_ping_floods.fetch_add(1, Ordering::Relaxed);
                    calmed = true;
                    conn.abrupt_shutdown(h2::Reason::ENHANCE_YOUR_CALM);
                    draining = true;
                }
            }
        }
    }
}

/// Why the connection loop's accept branch returned.
enum Accepted {
    /// The connection closed (after a GOAWAY, once its streams ended).
    Closed,
    /// The connection failed (I/O or a protocol error).
    Failed(h2::Error),
    /// `max_requests_per_connection` streams were accepted.
    Limit,
    /// The client sent more PING ACKs than it was asked for.
    PingFlood,
}

#[cfg(test)]
mod tests {
    use super::{classify, Sniffed, PREFACE, SNIFF_MAX};

    #[test]
    fn preface_is_http2_once_complete() {
        assert_eq!(classify(PREFACE), Some(Sniffed::Http2));
        assert_eq!(classify(&PREFACE[..10]), None);
        assert_eq!(
            classify(b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n"),
            Some(Sniffed::Neither)
        );
    }

    #[test]
    fn request_lines_are_http1_and_garbage_is_neither() {
        assert_eq!(
            classify(b"GET / HTTP/1.1\r\nHost: a\r\n"),
            Some(Sniffed::Http1)
        );
        assert_eq!(classify(b"\r\nGET / HTTP/1.0\n"), Some(Sniffed::Http1));
        assert_eq!(classify(b"GET / HTT"), Some(Sniffed::Http1));
        assert_eq!(classify(b"GE"), None);
        assert_eq!(classify(b"BREW / HTT"), None);
        assert_eq!(classify(b"BREW / HTTP/1.1\r\n"), Some(Sniffed::Http1));
        assert_eq!(
            classify(b"INVALID CONNECTION PREFACE\r\n\r\n"),
            Some(Sniffed::Neither)
        );
        assert_eq!(classify(&vec![b'a'; SNIFF_MAX]), Some(Sniffed::Http1));
    }
}
