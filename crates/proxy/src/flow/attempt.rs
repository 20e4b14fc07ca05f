//! The server of one attempt, for either client kind and upstream protocol: the pick (sticky, balancer, queue, fallback, retry exclusion), the forwarded head, the connection (pool or connect, TLS counters and log), outcome reports and retry decisions, and what an exchange returns (`Exchanged`, `UpResponse`).

use crate::downstream::Who;
use crate::error::ProxyError;
use crate::filter::{Edits, Filters};
use crate::headers::{self, Forwarding, HeadOut};
use crate::resilience::retry::{Retry, RetryCause};
use crate::state::Shared;
use crate::telemetry::stats::Phase;
use crate::upstream::pool::{Pool, PoolKey, UpConn};
use crate::upstream::tls::GroupTls;
use portico_config::{Balance, ProxyAction, Route, UpstreamGroup};
use portico_http1::{Framing, RequestHead, ResponseHead};
use portico_upstream::{PickError, Report, ServerGuard, Upstream};
use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// A proxy route as its attempts see it: its configuration, its filters and the forward
/// filters' edits (made once per request).
pub(crate) struct Proxied<'r> {
    pub route: &'r Route,
    pub p: &'r ProxyAction,
    pub filters: &'r Filters,
    pub forward: Edits<'r>,
    /// The group the attempts go to: the route's, or its side of a `split`.
    pub group: usize,
    /// The request body, read whole before the first attempt (`buffer_request`).
    pub buffered: Option<std::rc::Rc<crate::downstream::buffer::Buffered>>,
}

/// The server an attempt goes to, holding its active slot until dropped.
pub struct Picked<'s> {
    /// The group's index (the route's group or a fallback).
    pub gi: usize,
    pub upstream: &'s Upstream,
    pub guard: ServerGuard,
    pub tls: Option<&'s GroupTls>,
    pub pool_key: PoolKey,
    /// The PROXY header a new connection starts with (groups with `proxy_protocol`).
    proxy_header: Option<Box<[u8]>>,
}

/// How the exchange of one attempt ended, in either upstream protocol. Moved once per
/// attempt: a box would cost an allocation per request.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Exchanged {
    /// The final response head (reported to passive checks at `got`), and whether the request
    /// body was completely sent; `reused`: on a connection that served requests before.
    Response {
        resp: UpResponse,
        body_done: bool,
        reused: bool,
        got: Instant,
    },
    /// The attempt failed before anything reached the client and the route's retry policy
    /// granted another.
    Retry,
    /// Answer the client with the error (`body_done`: its request body was read to its end).
    Failed {
        e: ProxyError,
        phase: Phase,
        body_done: bool,
    },
}

/// A final response from the server, and what its body is read from.
pub(crate) enum UpResponse {
    /// An HTTP/1.1 server's head; the body follows on the connection (and in `up.rbuf`).
    H1 { up: UpConn, head: ResponseHead },
    /// An HTTP/2 server's head and body, the request's send side (for an upload still going,
    /// or a tunnel) and the stream slot on its connection.
    H2 {
        lease: crate::upstream::h2_pool::Lease,
        parts: http::response::Parts,
        body: h2::RecvStream,
        send: h2::SendStream<bytes::Bytes>,
    },
}

impl UpResponse {
    pub(crate) fn status(&self) -> u16 {
        match self {
            UpResponse::H1 { head, .. } => head.status(),
            UpResponse::H2 { parts, .. } => parts.status.as_u16(),
        }
    }
}

/// What a failed connect or exchange leads to.
pub enum Failed {
    /// A reused connection the server had closed while idle: try again on a new one.
    Stale,
    /// The route's retry policy and budget granted another attempt (pick again).
    Retry,
    /// Answer the client with the error.
    Fail,
}

/// Pick a server for the request in group `gi` (the route's): a sticky cookie naming an
/// available server with room wins, unless that server already failed this request; else the
/// balancer among servers not excluded by `retry`, waiting in the group's queue when every
/// server is at its limit, and trying the group's `fallback` when none is available. `asked` is
/// when the pick started (moved to the end of a queue wait, so header time counts from the
/// pick). A refusal is counted as the group's `no_server`.
pub async fn pick<'s>(
    shared: &'s Shared,
    mut gi: usize,
    client_ip: &str,
    addresses: impl Fn() -> Option<(SocketAddr, SocketAddr)>,
    head: &RequestHead,
    retry: &Retry<'_>,
    asked: &mut Instant,
) -> Result<Picked<'s>, ProxyError> {
    let mut hops = 0;
    let (upstream, guard) = loop {
        let upstream = &*shared.upstreams[gi];
        if let Some(id) = crate::sticky::request_id(upstream, head) {
            if let Some(guard) = upstream.pick_sticky_at(id, *asked) {
                if !retry.excluded(gi).contains(&guard.index()) {
                    break (upstream, guard);
                }
            }
        }
        let key = hash_key(&upstream.group().balance, client_ip, head);
        let e = match upstream.pick_at_excluding(key, retry.excluded(gi), *asked) {
            Ok(guard) => break (upstream, guard),
            Err(PickError::AtLimit) if upstream.group().queue > 0 => {
                let g = upstream.group();
                let queue = &shared.group_stats[gi].queue;
                match queue
                    .wait(upstream, key, retry.excluded(gi), g.queue, g.queue_timeout)
                    .await
                {
                    Ok(guard) => {
                        *asked = Instant::now();
                        break (upstream, guard);
                    }
                    Err(e) => e,
                }
            }
            Err(PickError::AtLimit) => ProxyError::NoServer,
            Err(PickError::Unavailable) => match upstream.group().fallback {
                // Validation forbids cycles; `hops` only keeps this loop finite regardless.
                Some(f) if f < shared.upstreams.len() && hops < shared.upstreams.len() => {
                    gi = f;
                    hops += 1;
                    continue;
                }
                _ => ProxyError::Unavailable,
            },
        };
        shared.group_stats[gi]
            .no_server
            .fetch_add(1, Ordering::Relaxed);
        return Err(e);
    };
    let tls = shared.upstream_tls.get(gi).and_then(Option::as_deref);
    let pool_key = PoolKey {
        addr: guard.address(),
        tls: tls.map_or(0, |t| t.pool_id),
        proxy: upstream.group().proxy_protocol.unwrap_or(0),
    };
    // A group that sends PROXY headers names the client in each new connection (LOCAL when
    // the addresses cannot be read).
    let proxy_header = upstream.group().proxy_protocol.map(|v| {
        use portico_http1::proxy_protocol::{encode, Header};
        let header = match addresses() {
            Some((source, destination)) => Header::Proxied {
                source,
                destination,
            },
            None => Header::Local,
        };
        encode(v, &header).into_boxed_slice()
    });
    Ok(Picked {
        gi,
        upstream,
        guard,
        tls,
        pool_key,
        proxy_header,
    })
}

/// The hash input for hash balancing, if the group hashes.
fn hash_key<'a>(balance: &Balance, client_ip: &'a str, head: &'a RequestHead) -> Option<&'a [u8]> {
    match balance {
        Balance::HashClientIp => Some(client_ip.as_bytes()),
        Balance::HashHeader(name) => head.field(name),
        Balance::HashCookie(name) => head
            .field("cookie")
            .and_then(|v| crate::sticky::cookie_value(v, name.as_bytes())),
        _ => None,
    }
}

impl Picked<'_> {
    pub fn group(&self) -> &UpstreamGroup {
        self.upstream.group()
    }

    pub fn server(&self) -> usize {
        self.guard.index()
    }

    pub fn addr(&self) -> SocketAddr {
        self.guard.address()
    }

    /// Write the request head for this server into `out` (in its protocol), with the forward
    /// filters' `edits`.
    pub(crate) fn write_head(
        &self,
        out: &mut impl HeadOut,
        head: &RequestHead,
        route: &Route,
        p: &ProxyAction,
        edits: &Edits<'_>,
        client: &Who<'_>,
    ) {
        let addr = self.addr();
        let server = || match self.tls.and_then(|t| t.host(addr)) {
            Some(host) => host,
            None => addr.to_string(),
        };
        forwarded_head(out, head, route, p, edits, client, server);
    }

    /// A pooled connection to the server (unless `fresh_only`), else a new one; `connect` is set
    /// to how long a new connection took (None for a pooled one). Also says whether it was
    /// reused. A failed connect is counted, logged (TLS handshakes), reported to the server's
    /// passive checks, and offered to `retry`.
    pub async fn connection(
        &self,
        shared: &Shared,
        pool: &Pool,
        fresh_only: bool,
        connect: &mut Option<Duration>,
        retry: &mut Retry<'_>,
    ) -> Result<(UpConn, bool), (ProxyError, Failed)> {
        *connect = None;
        if !fresh_only {
            if let Some(u) = pool.take(self.pool_key) {
                return Ok((u, true));
            }
        }
        let group = self.group();
        let addr = self.addr();
        let stats = &shared.stats;
        // Boxed: a new connection (and its TLS handshake) is the rare case on kept-alive pools;
        // unboxed, its 1.5 KiB of state would widen every request's future.
        let opening = Box::pin(crate::upstream::pool::connect(
            addr,
            group.connect_timeout,
            self.tls,
            self.proxy_header.as_deref(),
        ));
        match opening.await {
            Ok((u, took)) => {
                *connect = Some(took);
                stats.upstream_connects.fetch_add(1, Ordering::Relaxed);
                if self.tls.is_some() {
                    match u.stream.resumed() {
                        true => &stats.upstream_tls_resumed,
                        false => &stats.upstream_tls_full,
                    }
                    .fetch_add(1, Ordering::Relaxed);
                }
                Ok((u, false))
            }
            Err(e) => {
                let report = match e {
                    ProxyError::ConnectTimeout => Report::Timeout,
                    _ => Report::ConnectError,
                };
                if let (ProxyError::TlsHandshake(why), Some(tls)) = (&e, self.tls) {
                    stats.upstream_tls_failures.fetch_add(1, Ordering::Relaxed);
                    crate::telemetry::logging::log_limited!(
                        warn,
                        group = %group.name,
                        server = %addr,
                        server_name = %tls.origination.server_name(addr).to_str(),
                        "TLS handshake with upstream failed: {why}"
                    );
                } else {
                    crate::telemetry::logging::log_limited!(
                        warn,
                        group = %group.name,
                        server = %addr,
                        "cannot connect to upstream server: {e}"
                    );
                }
                self.upstream.report(self.server(), report, Instant::now());
                let next = match retry.allows(RetryCause::Connect, self.gi, self.server(), stats) {
                    true => Failed::Retry,
                    false => Failed::Fail,
                };
                Err((e, next))
            }
        }
    }

    /// The response head (status `status`) arrived: report it for passive checks. Returns the
    /// clock read made for it (header time, the access log).
    pub fn responded(&self, status: u16) -> Instant {
        let got = Instant::now();
        self.upstream
            .report(self.server(), Report::Response { status }, got);
        got
    }

    /// An exchange on a connection failed with `e` in `phase`; `untouched`: no response byte
    /// (not even an interim response) arrived. Reports the failure for passive checks and
    /// decides: a stale pooled connection is replaced (idempotent, body-less requests only),
    /// else `retry` may grant another attempt when nothing reached the client.
    #[allow(clippy::too_many_arguments)]
    pub fn failed(
        &self,
        shared: &Shared,
        retry: &mut Retry<'_>,
        head: &RequestHead,
        e: &ProxyError,
        phase: Phase,
        reused: bool,
        untouched: bool,
    ) -> Failed {
        let stale_retryable =
            head.method().is_idempotent() && head.framing == Framing::None && !head.upgrade;
        if reused && stale_retryable && untouched && is_stale(e) {
            shared
                .stats
                .upstream_retries
                .fetch_add(1, Ordering::Relaxed);
            return Failed::Stale;
        }
        if let Some(report) = failure_report(e, reused) {
            self.upstream.report(self.server(), report, Instant::now());
        }
        // Retried only when no response byte arrived (and so none reached the client).
        let cause = match e {
            ProxyError::ResponseTimeout => Some(RetryCause::Timeout),
            ProxyError::UpstreamClosed | ProxyError::UpstreamIo(_)
                if phase == Phase::ResponseHead && untouched =>
            {
                Some(RetryCause::Reset)
            }
            _ => None,
        };
        if cause.is_some_and(|cause| retry.allows(cause, self.gi, self.server(), &shared.stats)) {
            return Failed::Retry;
        }
        Failed::Fail
    }

    /// The exchange got a final response head with `status` at `got` (the pick began at
    /// `asked`): header time and counters. True when the route retries this status and
    /// `retry` granted another attempt (the response is then dropped unsent).
    pub fn accepted(
        &self,
        shared: &Shared,
        retry: &mut Retry<'_>,
        asked: Instant,
        got: Instant,
        reused: bool,
        status: u16,
    ) -> bool {
        if let Some(h) = shared.group_stats[self.gi].header_time.get(self.server()) {
            h.observe(got.saturating_duration_since(asked));
        }
        let stats = &shared.stats;
        stats.upstream_requests.fetch_add(1, Ordering::Relaxed);
        if reused {
            stats.upstream_reused.fetch_add(1, Ordering::Relaxed);
        }
        retry.on_status(status)
            && retry.allows(RetryCause::Status(status), self.gi, self.server(), stats)
    }

    /// The upstream exchange is complete: keep the connection when `reusable`, and free the
    /// server's active slot.
    pub fn release(self, shared: &Shared, pool: &Pool, up: UpConn, reusable: bool) {
        if reusable {
            let group = self.group();
            let cap = group.keepalive.div_ceil(shared.workers);
            pool.put(self.pool_key, up, cap, group.idle_timeout);
        }
        drop(self.guard);
    }
}

/// Write the forwarded request head into `out` (in the server's protocol), with the forward
/// filters' `edits`; `server`: the Host to send when the client's is not kept (the server's
/// name or address).
pub(crate) fn forwarded_head(
    out: &mut impl HeadOut,
    head: &RequestHead,
    route: &Route,
    p: &ProxyAction,
    edits: &Edits<'_>,
    client: &Who<'_>,
    server: impl FnOnce() -> String,
) {
    let origin_form: Cow<'_, str> = if head.target().starts_with('/') {
        Cow::Borrowed(head.target())
    } else {
        match head.query() {
            Some(q) => Cow::Owned(format!("{}?{}", head.path(), q)),
            None => Cow::Borrowed(head.path()),
        }
    };
    let target = match &p.rewrite {
        Some(t) => {
            let vars = crate::vars::RequestVars::new(head, route, client.tls, client.ip);
            Cow::Owned(crate::vars::rewritten(t, &vars))
        }
        None => route.upstream_target(&origin_form),
    };
    // RFC 9112 3.2.2: for an absolute-form target the target's authority is the host (and
    // the one routing used), whatever the Host field says.
    let absolute = crate::vars::absolute_authority(head.target());
    let authority = match absolute {
        Some(a) => a.to_string(),
        None if p.preserve_host && head.field("host").is_some() => String::new(),
        None => server(),
    };
    headers::upstream_request(
        out,
        head,
        &target,
        p,
        edits,
        &Forwarding {
            client_ip: client.ip,
            peer_ip: client.peer_ip,
            proto: if client.tls { "https" } else { "http" },
            authority: &authority,
            absolute: absolute.is_some(),
            client_cert_subject: client.cert.map(|c| c.subject.as_str()),
        },
    );
}

/// What a failed exchange says about the server, for passive checks: timeouts, and resets
/// before a response. A reused connection closed under us is the keep-alive race (the server
/// closed it while idle), not a failing server; client-side errors say nothing about it.
pub(crate) fn failure_report(e: &ProxyError, reused: bool) -> Option<Report> {
    match e {
        ProxyError::ResponseTimeout | ProxyError::UpstreamIdle => Some(Report::Timeout),
        _ if reused && is_stale(e) => None,
        ProxyError::UpstreamClosed | ProxyError::UpstreamIo(_) => Some(Report::Reset),
        _ => None,
    }
}

/// A reused connection that died before answering: the server closed it while idle.
fn is_stale(e: &ProxyError) -> bool {
    matches!(e, ProxyError::UpstreamClosed | ProxyError::UpstreamIo(_))
}

#[cfg(test)]
mod tests {
    use crate::vars::absolute_authority;

    #[test]
    fn authority_of_absolute_targets() {
        assert_eq!(
            absolute_authority("http://a.test:81/x?y"),
            Some("a.test:81")
        );
        assert_eq!(absolute_authority("http://user@a.test?q"), Some("a.test"));
        assert_eq!(absolute_authority("/x"), None);
        assert_eq!(absolute_authority("http:///x"), None);
    }
}
