//! Admission of a routed request, shared by HTTP/1.1 requests and HTTP/2 streams: load shedding, then the route's rate limit.

use crate::ratelimit::RateLimiter;
use crate::state::{ListenerState, Worker};
use crate::stats::Stats;
use crate::sticky::cookie_value;
use portico_config::{RateLimit, RateLimitKey};
use portico_http1::RequestHead;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Why a request is refused before its action runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The listener sheds and this worker is saturated: 503 with `Retry-After`.
    Shed,
    /// The route's rate limit: 429 with `Retry-After` (the wait until the key's next token).
    RateLimited(Duration),
}

/// The request that a client sent from `peer` (`client_ip` its address as text) on listener
/// `ls`, routed to route `idx`, at `now` (the clock read at its head): may it run? A refusal is
/// counted and logged here; the caller only answers it in its protocol.
#[allow(clippy::too_many_arguments)]
pub fn check(
    ls: &ListenerState,
    worker: &Worker,
    stats: &Stats,
    idx: usize,
    peer: SocketAddr,
    client_ip: &str,
    head: &RequestHead,
    now: Instant,
) -> Result<(), Refused> {
    if worker.sheds(ls) {
        stats.requests_shed.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(%peer, target = head.target(), "request shed: worker saturated");
        return Err(Refused::Shed);
    }
    let limiter = ls.resilience.get(idx).and_then(|r| r.rate_limit.as_deref());
    if let (Some(limit), Some(limiter)) = (&ls.listener.routes[idx].rate_limit, limiter) {
        if let Err(wait) = check_rate(client_ip, head, limit, limiter, now) {
            ls.route_stats[idx]
                .rate_limited
                .fetch_add(1, Ordering::Relaxed);
            stats.rate_limited.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, target = head.target(), "{}", crate::ProxyError::RateLimited);
            return Err(Refused::RateLimited(wait));
        }
    }
    Ok(())
}

/// Take a token from the bucket of this request's key: the header or cookie value when the
/// limit names one and the request has it, else the client IP (in its own key space).
fn check_rate(
    client_ip: &str,
    head: &RequestHead,
    limit: &RateLimit,
    limiter: &RateLimiter,
    now: Instant,
) -> Result<(), Duration> {
    let ip = (0, client_ip.as_bytes());
    let (kind, key) = match &limit.key {
        RateLimitKey::ClientIp => ip,
        RateLimitKey::Header(name) => head.field(name).map_or(ip, |v| (1, v)),
        RateLimitKey::Cookie(name) => head
            .field("cookie")
            .and_then(|v| cookie_value(v, name.as_bytes()))
            .map_or(ip, |v| (2, v)),
    };
    // The clock read at the head is recent enough (a bucket ignores time running backwards).
    limiter.check(kind, key, now)
}
