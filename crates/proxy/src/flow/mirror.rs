//! Request mirroring: a sampled copy of a request sent, fire-and-forget, to a server of a shadow group; its answer read and dropped, never in the way of the real one.

use crate::downstream::buffer::{Buffered, Replay};
use crate::downstream::{Env, Who};
use crate::error::ProxyError;
use crate::flow::attempt::{forwarded_head, Proxied};
use crate::flow::exchange_h1::{final_head, write_within};
use crate::state::Shared;
use crate::telemetry::stats::Stats;
use crate::upstream::tls::GroupTls;
use bytes::BytesMut;
use portico_config::UpstreamProtocol;
use portico_http1::{encode, Framing, Method, RequestHead};
use portico_upstream::{Report, ServerGuard, Upstream};
use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Mirrored requests in flight on one worker at most; more are dropped (and counted), so a
/// slow shadow group costs memory and sockets only up to this.
pub(crate) const MAX_IN_FLIGHT: usize = 256;

thread_local! {
    /// Mirrored requests in flight on this worker.
    static IN_FLIGHT: Cell<usize> = const { Cell::new(0) };
}

/// What became of the copies of a route's requests, counted in `Stats`.
#[derive(Debug, Clone, Copy)]
enum Fate {
    /// The shadow server answered (any status).
    Answered,
    /// The copy could not be sent or answered (connect error, timeout, reset).
    Failed,
    /// Not sent: no shadow server could take it, or too many copies were in flight.
    Dropped,
    /// Not mirrored: a request whose body streams (not buffered), an upgrade, or an HTTP/2
    /// shadow group.
    Skipped,
}

fn count(stats: &Stats, fate: Fate) {
    let c = match fate {
        Fate::Answered => &stats.mirror_answered,
        Fate::Failed => &stats.mirror_failed,
        Fate::Dropped => &stats.mirror_dropped,
        Fate::Skipped => &stats.mirror_skipped,
    };
    c.fetch_add(1, Relaxed);
}

/// Send a copy of the request when the route mirrors and the request is sampled: the forwarded
/// head is built here (a few microseconds), the rest runs as a task of its own.
pub(crate) fn maybe_spawn(env: &Env<'_>, px: &Proxied<'_>, head: &RequestHead, who: &Who<'_>) {
    let Some(m) = &px.p.mirror else {
        return;
    };
    if m.basis_points < 10_000 && fastrand::u32(0..10_000) >= m.basis_points {
        return;
    }
    let shared = env.shared;
    let stats = &shared.stats;
    let Some(up) = shared.upstreams.get(m.group) else {
        return;
    };
    let group = up.group();
    if head.upgrade
        || (head.has_body() && px.buffered.is_none())
        || group.protocol == UpstreamProtocol::H2
    {
        count(stats, Fate::Skipped);
        return;
    }
    if IN_FLIGHT.get() >= MAX_IN_FLIGHT {
        count(stats, Fate::Dropped);
        return;
    }
    let Ok(guard) = up.pick_at_excluding(None, &[], Instant::now()) else {
        count(stats, Fate::Dropped);
        return;
    };
    let (tls, out) = side_head(shared, m.group, &guard, head, px, who);
    let copy = Copy {
        up: up.clone(),
        guard,
        tls,
        head: out,
        body: px.buffered.clone(),
        chunked: head.framing == Framing::Chunked,
        method: head.method().clone(),
        connect_timeout: group.connect_timeout,
        header_timeout: group.response_header_timeout,
        idle: group.idle_timeout,
        stats: shared.stats.clone(),
    };
    IN_FLIGHT.set(IN_FLIGHT.get() + 1);
    tokio::task::spawn_local(copy.run());
}

/// A side request's forwarded head (a mirrored copy, a cache refresh) to the server `guard`
/// holds in group `gi`, and the group's TLS settings.
pub(crate) fn side_head(
    shared: &Shared,
    gi: usize,
    guard: &ServerGuard,
    head: &RequestHead,
    px: &Proxied<'_>,
    who: &Who<'_>,
) -> (Option<Arc<GroupTls>>, BytesMut) {
    let tls = shared.upstream_tls.get(gi).cloned().flatten();
    let addr = guard.address();
    let mut out = BytesMut::with_capacity(512);
    let server = || match tls.as_deref().and_then(|t| t.host(addr)) {
        Some(host) => host,
        None => addr.to_string(),
    };
    forwarded_head(&mut out, head, px.route, px.p, &px.forward, who, server);
    (tls, out)
}

/// What a side request's failure tells the passive checks.
pub(crate) fn report_of(e: &ProxyError) -> Report {
    match e {
        ProxyError::ConnectTimeout | ProxyError::ResponseTimeout => Report::Timeout,
        ProxyError::ConnectFailed(_) | ProxyError::TlsHandshake(_) => Report::ConnectError,
        _ => Report::Reset,
    }
}

/// One copy on its way to the shadow server.
struct Copy {
    up: Arc<Upstream>,
    guard: ServerGuard,
    tls: Option<Arc<GroupTls>>,
    head: BytesMut,
    body: Option<Rc<Buffered>>,
    chunked: bool,
    method: Method,
    connect_timeout: Duration,
    header_timeout: Duration,
    idle: Duration,
    stats: Arc<Stats>,
}

impl Copy {
    async fn run(self) {
        let r = self.exchange().await;
        IN_FLIGHT.set(IN_FLIGHT.get().saturating_sub(1));
        let now = Instant::now();
        let server = self.guard.index();
        match r {
            Ok(status) => {
                count(&self.stats, Fate::Answered);
                self.up.report(server, Report::Response { status }, now);
            }
            Err(e) => {
                count(&self.stats, Fate::Failed);
                self.up.report(server, report_of(&e), now);
                let addr: SocketAddr = self.guard.address();
                tracing::debug!(server = %addr, "mirrored request failed: {e}");
            }
        }
    }

    /// Connect, send the head and the body, read the response head: its status. The
    /// connection closes after it (the body is not read: nobody waits for it).
    async fn exchange(&self) -> Result<u16, ProxyError> {
        let addr = self.guard.address();
        let (mut c, _) = crate::upstream::pool::connect(
            addr,
            self.connect_timeout,
            self.tls.as_deref(),
            crate::upstream::pool::local_header(self.up.group()).as_deref(),
        )
        .await?;
        // Each write waits at most the group's idle_timeout (a large body to a healthy server
        // takes as long as it takes).
        let idle = self.idle;
        let mut send = BytesMut::new();
        send.extend_from_slice(&self.head);
        if let Some(body) = &self.body {
            let mut replay = Replay::new(body.clone());
            while let Some(piece) = replay.next()? {
                if self.chunked {
                    encode::chunk_header(&mut send, piece.len());
                }
                send.extend_from_slice(&piece);
                if self.chunked {
                    send.extend_from_slice(b"\r\n");
                }
                write_within(&mut c.stream, &send, idle).await?;
                send.clear();
            }
            if self.chunked {
                send.extend_from_slice(b"0\r\n\r\n");
            }
        }
        write_within(&mut c.stream, &send, idle).await?;
        let limit = self.header_timeout;
        let rh = final_head(&mut c.stream, &mut c.rbuf, &self.method, limit).await?;
        Ok(rh.status())
    }
}
