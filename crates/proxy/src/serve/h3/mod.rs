//! Downstream HTTP/3: each worker's QUIC endpoint on a TLS listener's UDP port (Retry while handshakes pile up, the listener's connection limits), its connections (GOAWAY on drain, H3_EXCESSIVE_LOAD on a reset flood), one local task per request stream.

mod stream;

use crate::downstream::link::Link;
use crate::state::{ListenerSlot, ListenerState, Worker};
use portico_config::{Congestion, Http2Settings, Http3Settings};
use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// One connection's `h3` server.
type H3Server = h3::server::Connection<h3_quinn::Connection, bytes::Bytes>;

/// The ALPN token of HTTP/3 (RFC 9114 3.1).
pub const ALPN: &[u8] = b"h3";

/// H3_EXCESSIVE_LOAD (RFC 9114 8.1): the connection ends for a reset flood.
const EXCESSIVE_LOAD: u32 = 0x107;

/// Unidirectional streams a client may open at once: its control stream, the two QPACK
/// streams, and room for reserved (grease) ones.
const UNI_STREAMS: u32 = 16;

/// The QUIC server configuration of a listener: its TLS configuration of the moment with ALPN
/// `h3` (0-RTT only with `early_data`), and its `[listeners.http3]` transport settings.
pub(crate) fn quic_config(
    tls: &tokio_rustls::rustls::ServerConfig,
    s: &Http3Settings,
) -> Result<quinn::ServerConfig, String> {
    let mut tls = tls.clone();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    // 0-RTT: quinn takes all or nothing. rustls allows it only with sessions kept here (the
    // listener's session cache) rather than in tickets: each can be resumed once, so a
    // replayed ClientHello finds nothing (RFC 8446 8.1).
    tls.max_early_data_size = if s.early_data { u32::MAX } else { 0 };
    if s.early_data {
        tls.ticketer = Arc::new(NoTickets);
    }
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(Arc::new(tls))
        .map_err(|e| format!("the TLS configuration cannot serve QUIC: {e}"))?;
    let mut t = quinn::TransportConfig::default();
    let idle = quinn::IdleTimeout::try_from(s.idle_timeout).map_err(|e| e.to_string())?;
    t.max_idle_timeout(Some(idle))
        .max_concurrent_bidi_streams(s.max_concurrent_streams.into())
        .max_concurrent_uni_streams(UNI_STREAMS.into())
        .stream_receive_window(s.stream_window.into())
        .receive_window(s.connection_window.into())
        .keep_alive_interval(s.keep_alive_interval);
    match s.congestion {
        Congestion::Cubic => {
            t.congestion_controller_factory(Arc::new(quinn::congestion::CubicConfig::default()))
        }
        Congestion::Bbr => {
            t.congestion_controller_factory(Arc::new(quinn::congestion::BbrConfig::default()))
        }
        Congestion::NewReno => {
            t.congestion_controller_factory(Arc::new(quinn::congestion::NewRenoConfig::default()))
        }
    };
    let mut c = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    c.transport_config(Arc::new(t));
    // Each worker has its own endpoint: a client that moves to another address may land on
    // another worker's socket, which does not know its connection.
    c.migration(false);
    Ok(c)
}

/// Sessions resumed from the server's cache instead of tickets (rustls's condition for 0-RTT).
#[derive(Debug)]
struct NoTickets;

impl tokio_rustls::rustls::server::ProducesTickets for NoTickets {
    fn enabled(&self) -> bool {
        false
    }
    fn lifetime(&self) -> u32 {
        0
    }
    fn encrypt(&self, _: &[u8]) -> Option<Vec<u8>> {
        None
    }
    fn decrypt(&self, _: &[u8]) -> Option<Vec<u8>> {
        None
    }
}

/// The QUIC configuration built last, and what it was built from: rebuilt only when the
/// listener's TLS configuration (a reload, new certificate files) or its settings change.
struct Built {
    tls: Arc<tokio_rustls::rustls::ServerConfig>,
    settings: Http3Settings,
    quic: Arc<quinn::ServerConfig>,
}

fn current_config(
    cache: &mut Option<Built>,
    ls: &ListenerState,
    settings: &Http3Settings,
) -> Result<Arc<quinn::ServerConfig>, String> {
    let tls = ls
        .tls
        .as_ref()
        .ok_or("HTTP/3 on a listener without TLS")?
        .config();
    if let Some(b) = cache {
        if Arc::ptr_eq(&b.tls, &tls) && b.settings == *settings {
            return Ok(b.quic.clone());
        }
    }
    let quic = Arc::new(quic_config(&tls, settings)?);
    *cache = Some(Built {
        tls,
        settings: *settings,
        quic: quic.clone(),
    });
    Ok(quic)
}

/// This worker's QUIC endpoint on `socket` (its own `SO_REUSEPORT` UDP socket of the
/// listener's port), or why it cannot start.
pub(crate) fn endpoint(
    socket: std::net::UdpSocket,
    ls: &ListenerState,
) -> Result<quinn::Endpoint, String> {
    let settings = ls.listener.http3.ok_or("HTTP/3 is off on this listener")?;
    let mut cache = None;
    let server = current_config(&mut cache, ls, &settings)?;
    let mut config = quinn::EndpointConfig::default();
    config
        .max_udp_payload_size(settings.max_udp_payload)
        .map_err(|e| e.to_string())?;
    let server = Arc::try_unwrap(server).unwrap_or_else(|a| (*a).clone());
    quinn::Endpoint::new(config, Some(server), socket, Arc::new(quinn::TokioRuntime))
        .map_err(|e| e.to_string())
}

/// Accept QUIC connections on this worker's endpoint of a listener until the listener stops
/// (connections open then finish their requests after a GOAWAY).
pub(crate) async fn accept_loop(
    endpoint: quinn::Endpoint,
    slot: Arc<ListenerSlot>,
    worker: Rc<Worker>,
) {
    let mut stop = slot.stop.subscribe();
    let handshaking = Rc::new(Cell::new(0u32));
    let mut cache: Option<Built> = None;
    loop {
        if *stop.borrow_and_update() {
            break;
        }
        let incoming = tokio::select! {
            i = endpoint.accept() => i,
            _ = stop.changed() => break,
        };
        let Some(incoming) = incoming else { return };
        let shared = worker.snapshot();
        let stats = &shared.stats;
        let Some(ls) = shared.listener(slot.id).cloned() else {
            incoming.refuse();
            continue;
        };
        let Some(settings) = ls.listener.http3 else {
            incoming.refuse();
            continue;
        };
        // Address validation (RFC 9000 8.1): while many handshakes are in progress, a new
        // client first proves it receives at its address (spoofed floods, amplification).
        // Near the connection limit too: unvalidated sources would take its last places.
        let max = ls.listener.limits.max_connections;
        let crowded = slot.active.load(Ordering::Acquire) >= max - max / 4;
        if !incoming.remote_address_validated()
            && incoming.may_retry()
            && (handshaking.get() >= settings.validate_above || crowded)
        {
            stats.h3_retries.fetch_add(1, Ordering::Relaxed);
            let _ = incoming.retry();
            continue;
        }
        let peer = incoming.remote_address();
        if slot.active.fetch_add(1, Ordering::AcqRel) >= max {
            slot.active.fetch_sub(1, Ordering::AcqRel);
            stats.connections_refused.fetch_add(1, Ordering::Relaxed);
            incoming.refuse();
            continue;
        }
        let per_client = ls.listener.limits.max_connections_per_client;
        stats.connections_accepted.fetch_add(1, Ordering::Relaxed);
        handshaking.set(handshaking.get() + 1);
        let admission = Admission {
            guard: crate::state::OpenGuard::new(slot.clone(), worker.clone(), None),
            handshaking: handshaking.clone(),
            client: (per_client > 0).then(|| (peer.ip(), per_client)),
            slot: slot.clone(),
            pending: true,
            due: tokio::time::Instant::now() + ls.listener.limits.head_timeout,
        };
        let config = match current_config(&mut cache, &ls, &settings) {
            Ok(c) => c,
            Err(e) => {
                crate::telemetry::logging::log_limited!(error, listener = %slot.name, "HTTP/3 connection refused: {e}");
                incoming.refuse();
                continue;
            }
        };
        let connecting = match incoming.accept_with(config) {
            Ok(c) => c,
            Err(e) => {
                stats.h3_handshake_failures.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%peer, "QUIC connection refused: {e}");
                continue;
            }
        };
        let ctx = crate::conn::Ctx {
            ls,
            shared,
            worker: worker.clone(),
            shutdown: slot.stop.subscribe(),
        };
        let port = slot.addr.port();
        tokio::task::spawn_local(async move {
            let mut admission = admission;
            let due = admission.due;
            // With early data on, a resuming client's 0-RTT requests are served before its
            // handshake completes (as early ones); otherwise the handshake comes first. Not
            // before the client's whole ClientHello (it may span datagrams, one of them lost):
            // until its transport parameters come, the server has no stream credit, and quinn
            // does not wake an open waiting for it when they do (HTTP/3's setup would wait for
            // the next unrelated wake-up; [`setup`] also polls it again, for the case this
            // does not cover: a HelloRetryRequest, whose second ClientHello brings them).
            let mut connecting = connecting;
            if settings.early_data {
                let hello = tokio::time::timeout_at(due, connecting.handshake_data()).await;
                if !matches!(hello, Ok(Ok(_))) {
                    ctx.shared
                        .stats
                        .h3_handshake_failures
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%peer, "QUIC handshake failed or timed out before its ClientHello");
                    return;
                }
            }
            let (connecting, accepted) = match settings.early_data {
                true => match connecting.into_0rtt() {
                    Ok((conn, accepted)) => (Err(conn), Some(accepted)),
                    Err(c) => (Ok(c), None),
                },
                false => (Ok(connecting), None),
            };
            let conn = match connecting {
                Err(conn) => conn,
                Ok(c) => {
                    let stats = &ctx.shared.stats;
                    let conn = match tokio::time::timeout_at(due, c).await {
                        Ok(Ok(c)) => c,
                        Ok(Err(e)) => {
                            stats.h3_handshake_failures.fetch_add(1, Ordering::Relaxed);
                            tracing::debug!(%peer, "QUIC handshake failed: {e}");
                            return;
                        }
                        Err(_) => {
                            stats.h3_handshake_failures.fetch_add(1, Ordering::Relaxed);
                            tracing::debug!(%peer, "QUIC handshake timed out");
                            return;
                        }
                    };
                    if !admission.complete(stats) {
                        conn.close(0u32.into(), b"too many connections");
                        return;
                    }
                    conn
                }
            };
            Box::pin(serve(conn, peer, ctx, settings, port, accepted, admission)).await;
        });
    }
    // Stopped: new clients are refused (not left waiting for a handshake that never comes)
    // while the endpoint's connections finish; the worker's drain bounds how long.
    tokio::task::spawn_local(async move {
        loop {
            tokio::select! {
                i = endpoint.accept() => match i {
                    Some(i) => i.refuse(),
                    None => return,
                },
                _ = endpoint.wait_idle() => return,
            }
        }
    });
}

/// A QUIC connection being admitted: counted among the worker's handshakes in progress (the
/// Retry threshold) until its handshake ends, and in its client's share
/// (`max_connections_per_client`) once the handshake completed, so that datagrams with a forged
/// source cannot use up a real client's share. Holds the connection's place in the listener.
struct Admission {
    guard: crate::state::OpenGuard,
    handshaking: Rc<Cell<u32>>,
    /// The client and its share, counted when the handshake completes.
    client: Option<(std::net::IpAddr, u32)>,
    slot: Arc<ListenerSlot>,
    /// Still counted in `handshaking`.
    pending: bool,
    /// When the handshake and HTTP/3's setup must be done (`head_timeout` after the first
    /// datagram).
    due: tokio::time::Instant,
}

impl Admission {
    /// The handshake completed; false when the client is over its share (the connection is
    /// then closed).
    fn complete(&mut self, stats: &crate::telemetry::stats::Stats) -> bool {
        self.end_handshake();
        if let Some((ip, share)) = self.client.take() {
            if !self.slot.clients.try_open(ip, share) {
                stats.connections_refused.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(listener = %self.slot.name, client = %ip, "QUIC connection refused: max_connections_per_client reached");
                return false;
            }
            self.guard.counts_client(ip);
        }
        true
    }

    fn end_handshake(&mut self) {
        if self.pending {
            self.pending = false;
            self.handshaking
                .set(self.handshaking.get().saturating_sub(1));
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.end_handshake();
    }
}

/// Serve an HTTP/3 connection until it closes: one local task per request stream, GOAWAY on
/// shutdown or listener stop (requests in flight finish, then the connection closes),
/// H3_EXCESSIVE_LOAD on a reset flood, and a close after `max_requests_per_connection`.
async fn serve(
    conn: quinn::Connection,
    peer: SocketAddr,
    mut ctx: crate::conn::Ctx,
    settings: Http3Settings,
    port: u16,
    accepted: Option<quinn::ZeroRttAccepted>,
    mut admission: Admission,
) {
    let limits = ctx.ls.listener.limits;
    ctx.shared
        .stats
        .h3_connections
        .fetch_add(1, Ordering::Relaxed);
    let hd = conn
        .handshake_data()
        .and_then(|d| d.downcast::<quinn::crypto::rustls::HandshakeData>().ok());
    let sni = hd.and_then(|h| h.server_name).map(String::into_boxed_str);
    let cert = conn
        .peer_identity()
        .and_then(|i| {
            i.downcast::<Vec<tokio_rustls::rustls::pki_types::CertificateDer<'static>>>()
                .ok()
        })
        .and_then(|chain| portico_tls::client_cert(chain.first()?));
    // The reset limit is HTTP/3's own; the rest of the HTTP/2 settings is unused here.
    let resets = Http2Settings {
        max_resets: settings.max_resets,
        reset_window: settings.reset_window,
        ..Http2Settings::DEFAULT
    };
    let link = Rc::new(Link {
        local: conn.local_ip().map(|ip| SocketAddr::new(ip, port)),
        tls: true,
        tls_info: Some(("TLSv1.3", sni)),
        client_cert: cert.map(Box::new),
        ..Link::new(&ctx, peer, resets)
    });
    let mut builder = h3::server::builder();
    builder.max_field_section_size(u64::from(settings.max_header_list_size));
    let made = builder.build::<_, bytes::Bytes>(h3_quinn::Connection::new(conn.clone()));
    let mut h3 = match setup(made, admission.due, accepted.is_some()).await {
        Some(Ok(h)) => h,
        Some(Err(e)) => {
            tracing::debug!(%peer, "HTTP/3 connection failed to start: {e}");
            return;
        }
        None => {
            tracing::debug!(%peer, "HTTP/3 control streams not received in time");
            return;
        }
    };
    let mut draining = *ctx.shutdown.borrow();
    if draining {
        goaway(&mut h3, &conn, limits.send_timeout).await;
    }
    let mut served: u64 = 0;
    // Served from its 0-RTT data: until the handshake completes (within the head deadline),
    // the streams it opens are early (they came as 0-RTT data: 1-RTT data waits for the
    // handshake).
    let mut early = accepted.map(Box::pin);
    let handshake_due = admission.due;
    loop {
        if draining && link.active.get() == 0 {
            break;
        }
        tokio::select! {
            biased;
            _ = link.calm.notified() => {
                crate::telemetry::logging::log_limited!(info, %peer, "HTTP/3 reset flood: closed with H3_EXCESSIVE_LOAD");
                ctx.shared.stats.h3_reset_floods.fetch_add(1, Ordering::Relaxed);
                conn.close(EXCESSIVE_LOAD.into(), b"too many streams reset");
                break;
            }
            // Before the streams: a stream accepted once the handshake completed is not early.
            _ = async { early.as_mut().expect("guarded").await }, if early.is_some() => {
                early = None;
                if conn.close_reason().is_some() || !admission.complete(&ctx.shared.stats) {
                    conn.close(0u32.into(), b"");
                    break;
                }
            }
            _ = tokio::time::sleep_until(handshake_due), if early.is_some() => {
                ctx.shared.stats.h3_handshake_failures.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%peer, "QUIC handshake after 0-RTT not completed in time");
                conn.close(0u32.into(), b"");
                break;
            }
            r = ctx.shutdown.changed(), if !draining => {
                if r.is_err() || *ctx.shutdown.borrow() {
                    goaway(&mut h3, &conn, limits.send_timeout).await;
                    draining = true;
                }
            }
            _ = link.idle.notified(), if draining => {}
            // Not once draining: the GOAWAY said no stream from its id on is processed, and
            // the `h3` crate would still hand over the one with that very id.
            r = h3.accept(), if !draining => match r {
                Ok(Some(resolver)) => {
                    served += 1;
                    link.stream_started();
                    let (link, quic, early) = (link.clone(), conn.clone(), early.is_some());
                    tokio::task::spawn_local(async move {
                        Box::pin(stream::handle(link.clone(), quic, resolver, early)).await;
                        link.stream_ended();
                    });
                    let max = limits.max_requests_per_connection;
                    if !draining && max > 0 && served >= max {
                        goaway(&mut h3, &conn, limits.send_timeout).await;
                        draining = true;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    if !e.is_h3_no_error() {
                        tracing::debug!(%peer, "HTTP/3 connection ended: {e}");
                    }
                    break;
                }
            }
        }
    }
    // Requests in flight finish first (a closed connection ends them at once; the worker's
    // drain bounds the rest).
    while link.active.get() > 0 {
        link.idle.notified().await;
    }
    // Closing the connection at once would drop response bytes not yet sent or acknowledged
    // (the responses' writes only queued them), and a close is not resent when lost. It closes
    // once a quiet window passed in which it sent nothing and received no acknowledgement (the
    // last bytes went out, and no loss was being repaired: a lost packet is resent within a
    // probe timeout, which the window exceeds many times), or when the client closes it; within
    // the keep-alive timeout (at most the drain timeout on shutdown). Waiting for each stream's
    // acknowledgement would be exact, but the `h3` crate does not expose quinn's streams.
    let mut grace = limits.keepalive_timeout;
    if *ctx.shutdown.borrow() {
        grace = grace.min(ctx.shared.config.drain_timeout);
    }
    let until = tokio::time::Instant::now() + grace;
    let activity = || {
        let s = conn.stats();
        (s.udp_tx.bytes, s.frame_rx.acks)
    };
    let mut seen = activity();
    loop {
        // Eight times a probe timeout without its variance term (RTT + the client's 25 ms
        // acknowledgement delay), and at least a second: jitter (which widens the real probe
        // timeout) stays inside it.
        let pto = conn.rtt() + std::time::Duration::from_millis(25);
        let quiet = (pto * 8).max(std::time::Duration::from_secs(1));
        tokio::select! {
            _ = conn.closed() => return,
            _ = tokio::time::sleep_until(until.min(tokio::time::Instant::now() + quiet)) => {}
        }
        let now = activity();
        if now == seen || tokio::time::Instant::now() >= until {
            return;
        }
        seen = now;
    }
}

/// HTTP/3's setup (the control streams opened, SETTINGS sent), by `due`; for a connection
/// served before its handshake completed (`early`), polled again every [`SETUP_POLL`] as well.
/// Such a connection may have no stream credit yet (after a HelloRetryRequest, the client's
/// transport parameters come with the second ClientHello), and quinn does not wake an open
/// waiting for credit when they arrive. After a completed handshake there is credit.
async fn setup<F: std::future::Future>(
    made: F,
    due: tokio::time::Instant,
    early: bool,
) -> Option<F::Output> {
    if !early {
        return tokio::time::timeout_at(due, made).await.ok();
    }
    let mut made = std::pin::pin!(made);
    let mut poll = tokio::time::interval_at(
        due.min(tokio::time::Instant::now() + SETUP_POLL),
        SETUP_POLL,
    );
    let deadline = tokio::time::sleep_until(due);
    let mut deadline = std::pin::pin!(deadline);
    loop {
        tokio::select! {
            biased;
            r = &mut made => return Some(r),
            _ = &mut deadline => return None,
            _ = poll.tick() => {}
        }
    }
}

/// How often HTTP/3's setup is polled again while it waits (see [`setup`]).
const SETUP_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// GOAWAY, after which no new request is accepted; bounded by `limit`: a client that grants no
/// flow control on the control stream has its connection closed instead of holding it open.
async fn goaway(h3: &mut H3Server, conn: &quinn::Connection, limit: std::time::Duration) {
    if !matches!(
        tokio::time::timeout(limit, h3.shutdown(1)).await,
        Ok(Ok(()))
    ) {
        conn.close(0u32.into(), b"");
    }
}
