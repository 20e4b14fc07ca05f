//! Downstream HTTP/2: protocol choice per connection (ALPN `h2`, h2c prior knowledge), the connection loop (settings, drain, idle, rapid-reset defence), one local task per stream.

mod cork;
pub(crate) mod frame_scan;
pub(crate) mod request;
mod stream;

use crate::downstream::link::Link;
pub use crate::websocket::websocket_accept;

use crate::conn::Ctx;
use crate::stream::ClientStream;
use bytes::{Bytes, BytesMut};
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::{Duration, Instant};

/// How long a connection without streams keeps its write buffer: a busy connection's next
/// stream comes sooner and finds it (as an HTTP/1.1 connection keeps its buffers).
const RELEASE_AFTER: Duration = Duration::from_millis(500);

pub use super::sniff::PREFACE;

/// Run an accepted (and TLS-terminated) connection as HTTP/2 or HTTP/1.1. Not an `async fn`:
/// the future holds its arguments once (see `serve_since`).
#[allow(clippy::manual_async_fn)]
pub fn dispatch(
    stream: ClientStream,
    peer: SocketAddr,
    ctx: Ctx,
) -> impl std::future::Future<Output = ()> {
    async move {
        // The first head deadline runs from here, the protocol's detection included.
        let accepted = Instant::now();
        let enabled = ctx.ls.listener.http2.enabled;
        let sniff = match &stream {
            ClientStream::Tls(t) if enabled && t.get_ref().1.alpn_protocol() == Some(b"h2") => {
                // Boxed: an HTTP/1 connection's task does not carry HTTP/2's state.
                return Box::pin(serve(stream, peer, ctx, BytesMut::new())).await;
            }
            ClientStream::Tls(_) => false,
            // Plain: HTTP/2 with prior knowledge is told by its preface, which the HTTP/1 path
            // looks for in the first bytes it reads (no read of its own before).
            ClientStream::Plain(_) => enabled,
        };
        if let Some(h) = crate::serve::h1::serve_since(stream, peer, ctx, accepted, sniff).await {
            Box::pin(serve(h.stream, peer, h.ctx, h.read)).await
        }
    }
}

/// Serve an HTTP/2 connection until it closes: accept streams (one local task each), GOAWAY on
/// shutdown or listener stop (streams in flight finish), on idleness, after
/// `max_requests_per_connection` streams, and ENHANCE_YOUR_CALM on a reset flood. A drain the
/// client does not complete (no PING ack, or it stopped reading) is cut once no stream is active
/// and the keep-alive timeout (at most the drain timeout on shutdown) has passed.
/// `read`: bytes of the connection already read (the preface, when the HTTP/1 path found it).
pub async fn serve(stream: ClientStream, peer: SocketAddr, mut ctx: Ctx, read: BytesMut) {
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
    let (corked, cork) = cork::cork(stream, read);
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
