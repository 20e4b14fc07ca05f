//! Process-wide counters: requests, upstream reuse, and one termination record per request.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Which side ended (or completed) an exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Completed normally; no side at fault.
    None,
    Client,
    Upstream,
    Proxy,
}

/// Where in the exchange it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    RequestHead,
    Route,
    RequestBody,
    Connect,
    ResponseHead,
    ResponseBody,
    Tunnel,
    Done,
}

/// Why it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    Ok,
    BadRequest,
    Limit,
    Timeout,
    Closed,
    Io,
    /// Every server at its connection limit (or no route).
    NoServer,
    Refused,
    BadResponse,
    Shutdown,
    /// No server of the group (or its fallbacks) can take requests: all down, ejected, draining
    /// or disabled.
    Unavailable,
    /// Every server at its limit and the group's queue full.
    QueueFull,
    /// Waited in the group's queue for `queue_timeout` without a server slot.
    QueueTimeout,
    /// Refused at once because the worker was saturated (load shedding).
    Shed,
    /// The TLS handshake with the upstream failed (certificate not trusted or not valid for the
    /// server name, no common version, the server refused ours).
    Tls,
    /// Refused by a route's policy (a CORS preflight from an origin, method or header it does
    /// not allow).
    Denied,
}

const SIDES: usize = 4;
const PHASES: usize = 8;
const CAUSES: usize = 16;

/// One termination record: exactly one per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Termination {
    pub side: Side,
    pub phase: Phase,
    pub cause: Cause,
}

impl Termination {
    pub const OK: Termination = Termination {
        side: Side::None,
        phase: Phase::Done,
        cause: Cause::Ok,
    };

    pub fn new(side: Side, phase: Phase, cause: Cause) -> Self {
        Termination { side, phase, cause }
    }

    /// (side, phase, cause) in snake case, for metric labels.
    pub fn labels(&self) -> (&'static str, &'static str, &'static str) {
        let side = match self.side {
            Side::None => "none",
            Side::Client => "client",
            Side::Upstream => "upstream",
            Side::Proxy => "proxy",
        };
        let phase = match self.phase {
            Phase::RequestHead => "request_head",
            Phase::Route => "route",
            Phase::RequestBody => "request_body",
            Phase::Connect => "connect",
            Phase::ResponseHead => "response_head",
            Phase::ResponseBody => "response_body",
            Phase::Tunnel => "tunnel",
            Phase::Done => "done",
        };
        let cause = match self.cause {
            Cause::Ok => "ok",
            Cause::BadRequest => "bad_request",
            Cause::Limit => "limit",
            Cause::Timeout => "timeout",
            Cause::Closed => "closed",
            Cause::Io => "io",
            Cause::NoServer => "no_server",
            Cause::Refused => "refused",
            Cause::BadResponse => "bad_response",
            Cause::Shutdown => "shutdown",
            Cause::Unavailable => "unavailable",
            Cause::QueueFull => "queue_full",
            Cause::QueueTimeout => "queue_timeout",
            Cause::Shed => "shed",
            Cause::Tls => "tls",
            Cause::Denied => "denied",
        };
        (side, phase, cause)
    }

    /// Short code like HAProxy's termination state, e.g. `--` for success, `CH` client during head.
    pub fn code(&self) -> String {
        let s = match self.side {
            Side::None => '-',
            Side::Client => 'C',
            Side::Upstream => 'S',
            Side::Proxy => 'P',
        };
        let p = match self.phase {
            Phase::RequestHead => 'H',
            Phase::Route => 'R',
            Phase::RequestBody => 'B',
            Phase::Connect => 'C',
            Phase::ResponseHead => 'W',
            Phase::ResponseBody => 'D',
            Phase::Tunnel => 'T',
            Phase::Done => '-',
        };
        format!("{s}{p}")
    }
}

impl fmt::Display for Termination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}/{:?}/{:?}", self.side, self.phase, self.cause)
    }
}

/// Counters shared by every worker of the process.
#[derive(Debug)]
pub struct Stats {
    pub connections_accepted: AtomicU64,
    pub connections_refused: AtomicU64,
    pub requests: AtomicU64,
    pub upstream_requests: AtomicU64,
    pub upstream_reused: AtomicU64,
    pub upstream_connects: AtomicU64,
    pub upstream_retries: AtomicU64,
    /// Attempts sent again to another server under a route's `retry` policy.
    pub retries: AtomicU64,
    /// Retries a route's policy asked for and its retry budget refused.
    pub retries_budget_exhausted: AtomicU64,
    /// Requests refused with 429 by a route's rate limit.
    pub rate_limited: AtomicU64,
    pub tls_handshake_failures: AtomicU64,
    /// Completed TLS handshakes with a full key exchange (including after a HelloRetryRequest).
    pub tls_handshakes_full: AtomicU64,
    /// Completed TLS handshakes that resumed a session (ticket or session cache).
    pub tls_handshakes_resumed: AtomicU64,
    /// Requests answered 503 by load shedding.
    pub requests_shed: AtomicU64,
    /// (worker, listener) pairs shedding now.
    pub shedding: AtomicI64,
    /// TLS handshakes with upstream servers: completed with a full key exchange, resumed, failed.
    pub upstream_tls_full: AtomicU64,
    pub upstream_tls_resumed: AtomicU64,
    pub upstream_tls_failures: AtomicU64,
    /// Listener certificates loaded again because their files changed, and changed files refused.
    pub tls_certificate_reloads: AtomicU64,
    pub tls_certificate_reload_failures: AtomicU64,
    /// Reloads refused (SIGHUP or admin API); whether the last one succeeded; when the
    /// configuration last changed (Unix seconds: start, then each successful reload).
    pub config_reload_failures: AtomicU64,
    pub config_last_reload_ok: AtomicBool,
    pub config_last_reload_at: AtomicU64,
    /// Connections served as HTTP/2 (ALPN h2 or h2c).
    pub h2_connections: AtomicU64,
    /// HTTP/2 connections ended with GOAWAY ENHANCE_YOUR_CALM for resetting too many streams.
    pub h2_reset_floods: AtomicU64,
    /// HTTP/2 connections ended with GOAWAY ENHANCE_YOUR_CALM for an unsolicited PING ACK flood.
    pub h2_ping_floods: AtomicU64,
    /// QUIC connections served as HTTP/3.
    pub h3_connections: AtomicU64,
    /// QUIC handshakes that failed or timed out.
    pub h3_handshake_failures: AtomicU64,
    /// New QUIC clients asked to prove their address with a Retry.
    pub h3_retries: AtomicU64,
    /// HTTP/3 connections closed with H3_EXCESSIVE_LOAD for resetting too many streams.
    pub h3_reset_floods: AtomicU64,
    /// Requests refused 403 by a route's `ip_rules`.
    pub ip_denied: AtomicU64,
    /// Connections closed because their PROXY protocol header was missing, malformed or late.
    pub proxy_protocol_errors: AtomicU64,
    /// Requests refused 403 by a route's `client_cert` rules.
    pub client_cert_denied: AtomicU64,
    /// Requests refused 401 by a route's `basic_auth` (no or wrong credentials).
    pub auth_failures: AtomicU64,
    /// Requests refused 429 because their client address failed basic auth too often.
    pub auth_lockouts: AtomicU64,
    /// Requests a route's forward auth service was asked about (not from the pass cache), and
    /// those it refused.
    pub forward_auth_calls: AtomicU64,
    pub forward_auth_denied: AtomicU64,
    /// Requests refused by a route's `jwt` check (401 or 403), and the tokens verified (not
    /// passes from the cache).
    pub jwt_failures: AtomicU64,
    pub jwt_verified: AtomicU64,
    /// JWK set URL fetches, and loads of a JWK set (file or URL) that failed.
    pub jwks_fetches: AtomicU64,
    pub jwks_failures: AtomicU64,
    /// htpasswd files read again after a change, and those refused.
    pub htpasswd_reloads: AtomicU64,
    pub htpasswd_reload_failures: AtomicU64,
    /// Request bodies read whole before their attempt (`buffer_request`), and the bytes of
    /// them that went to temporary files.
    pub requests_buffered: AtomicU64,
    pub request_buffer_file_bytes: AtomicU64,
    /// Mirrored copies of requests: answered by the shadow server, failed, dropped (no server
    /// or too many in flight), skipped (streamed body, upgrade, HTTP/2 shadow group).
    pub mirror_answered: AtomicU64,
    pub mirror_failed: AtomicU64,
    pub mirror_dropped: AtomicU64,
    pub mirror_skipped: AtomicU64,
    /// Compressed responses, and their body bytes before and after, per coding (in the
    /// order of `Coding::ALL`).
    /// Spans exported over OTLP, dropped (queue full) and failed to export.
    pub trace_export: Arc<ExportStats>,
    pub compression: [Compressed; 3],
    terminations: Vec<AtomicU64>,
}

/// The compressed responses of one coding.
#[derive(Debug, Default)]
pub struct Compressed {
    pub responses: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
}

impl Stats {
    /// The counters of `coding`.
    pub fn compressed(&self, coding: portico_http1::Coding) -> &Compressed {
        let i = portico_http1::Coding::ALL
            .iter()
            .position(|c| *c == coding)
            .unwrap_or(0);
        &self.compression[i]
    }
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            connections_accepted: AtomicU64::new(0),
            connections_refused: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            upstream_requests: AtomicU64::new(0),
            upstream_reused: AtomicU64::new(0),
            upstream_connects: AtomicU64::new(0),
            upstream_retries: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            retries_budget_exhausted: AtomicU64::new(0),
            rate_limited: AtomicU64::new(0),
            tls_handshake_failures: AtomicU64::new(0),
            tls_handshakes_full: AtomicU64::new(0),
            tls_handshakes_resumed: AtomicU64::new(0),
            requests_shed: AtomicU64::new(0),
            shedding: AtomicI64::new(0),
            upstream_tls_full: AtomicU64::new(0),
            upstream_tls_resumed: AtomicU64::new(0),
            upstream_tls_failures: AtomicU64::new(0),
            tls_certificate_reloads: AtomicU64::new(0),
            tls_certificate_reload_failures: AtomicU64::new(0),
            config_reload_failures: AtomicU64::new(0),
            config_last_reload_ok: AtomicBool::new(true),
            config_last_reload_at: AtomicU64::new(unix_now()),
            h2_connections: AtomicU64::new(0),
            h2_reset_floods: AtomicU64::new(0),
            h2_ping_floods: AtomicU64::new(0),
            h3_connections: AtomicU64::new(0),
            h3_handshake_failures: AtomicU64::new(0),
            h3_retries: AtomicU64::new(0),
            h3_reset_floods: AtomicU64::new(0),
            ip_denied: AtomicU64::new(0),
            client_cert_denied: AtomicU64::new(0),
            proxy_protocol_errors: AtomicU64::new(0),
            auth_failures: AtomicU64::new(0),
            auth_lockouts: AtomicU64::new(0),
            forward_auth_calls: AtomicU64::new(0),
            forward_auth_denied: AtomicU64::new(0),
            jwt_failures: AtomicU64::new(0),
            jwt_verified: AtomicU64::new(0),
            jwks_fetches: AtomicU64::new(0),
            jwks_failures: AtomicU64::new(0),
            htpasswd_reloads: AtomicU64::new(0),
            htpasswd_reload_failures: AtomicU64::new(0),
            requests_buffered: AtomicU64::new(0),
            request_buffer_file_bytes: AtomicU64::new(0),
            mirror_answered: AtomicU64::new(0),
            mirror_failed: AtomicU64::new(0),
            mirror_dropped: AtomicU64::new(0),
            mirror_skipped: AtomicU64::new(0),
            trace_export: Default::default(),
            compression: Default::default(),
            terminations: (0..SIDES * PHASES * CAUSES)
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }
}

/// What the span exporter did (for `/metrics`).
#[derive(Debug, Default)]
pub struct ExportStats {
    pub exported: AtomicU64,
    pub dropped: AtomicU64,
    pub failed: AtomicU64,
}

/// Seconds since the Unix epoch (0 on a clock before it).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn slot(t: Termination) -> usize {
    (t.side as usize * PHASES + t.phase as usize) * CAUSES + t.cause as usize
}

impl Stats {
    /// Count one completed TLS handshake as full or resumed.
    pub fn count_handshake(&self, conn: &tokio_rustls::rustls::ServerConnection) {
        match conn.handshake_kind() {
            Some(tokio_rustls::rustls::HandshakeKind::Resumed) => &self.tls_handshakes_resumed,
            _ => &self.tls_handshakes_full,
        }
        .fetch_add(1, Relaxed);
    }

    /// Count one finished request with its termination record.
    pub fn record(&self, t: Termination) {
        self.terminations[slot(t)].fetch_add(1, Relaxed);
    }

    /// How many requests ended with this record.
    pub fn terminations(&self, t: Termination) -> u64 {
        self.terminations[slot(t)].load(Relaxed)
    }

    /// All non-zero termination counters.
    pub fn termination_counts(&self) -> Vec<(Termination, u64)> {
        let sides = [Side::None, Side::Client, Side::Upstream, Side::Proxy];
        let phases = [
            Phase::RequestHead,
            Phase::Route,
            Phase::RequestBody,
            Phase::Connect,
            Phase::ResponseHead,
            Phase::ResponseBody,
            Phase::Tunnel,
            Phase::Done,
        ];
        let causes = [
            Cause::Ok,
            Cause::BadRequest,
            Cause::Limit,
            Cause::Timeout,
            Cause::Closed,
            Cause::Io,
            Cause::NoServer,
            Cause::Refused,
            Cause::BadResponse,
            Cause::Shutdown,
            Cause::Unavailable,
            Cause::QueueFull,
            Cause::QueueTimeout,
            Cause::Shed,
            Cause::Tls,
            Cause::Denied,
        ];
        let mut out = Vec::new();
        for &side in &sides {
            for &phase in &phases {
                for &cause in &causes {
                    let t = Termination { side, phase, cause };
                    let n = self.terminations(t);
                    if n > 0 {
                        out.push((t, n));
                    }
                }
            }
        }
        out
    }

    /// One-line summary for the shutdown log.
    pub fn summary(&self) -> String {
        let up = self.upstream_requests.load(Relaxed);
        let reused = self.upstream_reused.load(Relaxed);
        let share = if up == 0 {
            0.0
        } else {
            reused as f64 * 100.0 / up as f64
        };
        let mut s = format!(
            "connections={} refused={} tls_handshakes_full={} tls_handshakes_resumed={} tls_handshake_failures={} requests={} upstream_requests={} upstream_reused={} ({share:.3}%) upstream_connects={} retries={}",
            self.connections_accepted.load(Relaxed),
            self.connections_refused.load(Relaxed),
            self.tls_handshakes_full.load(Relaxed),
            self.tls_handshakes_resumed.load(Relaxed),
            self.tls_handshake_failures.load(Relaxed),
            self.requests.load(Relaxed),
            up,
            reused,
            self.upstream_connects.load(Relaxed),
            self.upstream_retries.load(Relaxed),
        );
        s.push_str(&format!(
            " route_retries={} retries_budget_exhausted={} rate_limited={}",
            self.retries.load(Relaxed),
            self.retries_budget_exhausted.load(Relaxed),
            self.rate_limited.load(Relaxed),
        ));
        for (t, n) in self.termination_counts() {
            s.push_str(&format!(" {t}={n}"));
        }
        s
    }
}

/// What one request did: its termination record, status, whether the connection can carry
/// another request, bytes sent, the server it went to.
pub struct Outcome {
    pub termination: Termination,
    pub status: u16,
    /// The connection can carry another request.
    pub keep_alive: bool,
    pub bytes_sent: u64,
    pub upstream: Option<std::net::SocketAddr>,
}

impl Outcome {
    pub fn ok(status: u16, keep_alive: bool, bytes_sent: u64) -> Self {
        Outcome {
            termination: Termination::OK,
            status,
            keep_alive,
            bytes_sent,
            upstream: None,
        }
    }
}
