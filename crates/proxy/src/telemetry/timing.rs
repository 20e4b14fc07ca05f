//! Per-request phase timings for the access log, recorded from clock reads the request makes anyway, with the request's route and id.

use std::time::{Duration, Instant};

/// Instants and durations of one request's phases. Reset when a request head is complete; each
/// field is set by the code that reads the clock at that point for its own use (the pick, the
/// passive-check report, the route latency), so recording them costs no extra clock read
/// except around a new upstream connect.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Timings {
    /// The request head was complete (parsed).
    pub head: Option<Instant>,
    /// The upstream TCP connect of the attempt that got the response; None when that attempt
    /// reused a pooled connection (or nothing was proxied).
    pub connect: Option<Duration>,
    /// The upstream response head arrived (its first bytes: a head comes in one read).
    pub response: Option<Instant>,
    /// The response ended (the last byte was handed to the client socket).
    pub done: Option<Instant>,
    /// The request's id (`[request_id]`), set when it is routed.
    pub request_id: crate::telemetry::request_id::RequestId,
    /// The index of the route that took the request, for the access log.
    pub route: Option<u16>,
    /// The request's trace context (`[trace]`), boxed: connections without tracing pay a
    /// pointer.
    pub trace: Option<Box<crate::telemetry::trace::TraceCtx>>,
    /// What the response cache did for the request (caching routes only).
    pub cache: Option<CacheStatus>,
}

/// What the response cache did for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheStatus {
    /// Answered from the cache.
    Hit,
    /// Answered from what another request's fetch of the same URL stored.
    Collapsed,
    /// Fetched from the upstream.
    Miss,
    /// Revalidated with the upstream (304) and answered from the cache.
    Revalidated,
    /// Answered from a stale response because the upstream failed.
    Stale,
    /// Answered from a stale response while a background fetch refreshes it.
    Updating,
    /// Skipped the cache (method, a request body, the route's bypass rules).
    Bypass,
}

impl CacheStatus {
    /// The word in the access log.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheStatus::Hit => "hit",
            CacheStatus::Collapsed => "collapsed",
            CacheStatus::Miss => "miss",
            CacheStatus::Revalidated => "revalidated",
            CacheStatus::Stale => "stale",
            CacheStatus::Updating => "updating",
            CacheStatus::Bypass => "bypass",
        }
    }
}

/// The phase durations an access-log line shows, each from the request's start (accept for a
/// connection's first request, its first byte for later ones) except `connect`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Phases {
    /// Start to complete request head.
    pub head: Option<Duration>,
    /// The upstream connect itself; None when a pooled connection was reused.
    pub connect: Option<Duration>,
    /// Start to the upstream response head (time to first upstream byte).
    pub ttfb: Option<Duration>,
    /// Start to the end of the response.
    pub total: Duration,
}

impl Timings {
    /// Timings of a request whose head was complete at `head`.
    pub fn begin(head: Instant) -> Self {
        Timings {
            head: Some(head),
            ..Timings::default()
        }
    }

    /// The durations relative to `started`; the clock is read only if the end was not recorded.
    pub fn phases(&self, started: Instant) -> Phases {
        let since = |t: Instant| t.saturating_duration_since(started);
        Phases {
            head: self.head.map(since),
            connect: self.connect,
            ttfb: self.response.map(since),
            total: since(self.done.unwrap_or_else(Instant::now)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_are_measured_from_the_request_start() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let t = Timings {
            head: Some(t0 + ms(2)),
            connect: Some(ms(1)),
            response: Some(t0 + ms(7)),
            done: Some(t0 + ms(9)),
            ..Timings::default()
        };
        assert_eq!(
            t.phases(t0),
            Phases {
                head: Some(ms(2)),
                connect: Some(ms(1)),
                ttfb: Some(ms(7)),
                total: ms(9),
            }
        );
        // Nothing recorded: only the total, read from the clock.
        let p = Timings::default().phases(t0);
        assert_eq!((p.head, p.connect, p.ttfb), (None, None, None));
        assert!(p.total >= ms(0));
        assert_eq!(Timings::begin(t0).phases(t0).head, Some(Duration::ZERO));
    }
}
