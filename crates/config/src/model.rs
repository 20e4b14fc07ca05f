//! The validated, typed configuration the runtime reads; never re-parsed at runtime.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// A whole validated configuration (an immutable snapshot).
#[derive(Debug, Clone)]
pub struct Config {
    pub listeners: Vec<Listener>,
    /// Upstream groups by index; routes refer to them by index into this vector.
    pub upstreams: Vec<Arc<UpstreamGroup>>,
    pub access_log: Option<AccessLog>,
    /// Graceful shutdown: how long in-flight requests get to finish after SIGTERM/SIGINT.
    pub drain_timeout: Duration,
    /// Worker threads; None = available cores. The CLI flag overrides it.
    pub workers: Option<NonZeroU32>,
}

#[derive(Debug, Clone)]
pub struct AccessLog {
    /// None = stdout.
    pub path: Option<PathBuf>,
    pub format: AccessLogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessLogFormat {
    Combined,
    Json,
}

#[derive(Debug, Clone)]
pub struct Listener {
    pub name: String,
    pub address: SocketAddr,
    pub limits: ListenerLimits,
    /// Routes in file order; the first match wins.
    pub routes: Vec<Route>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerLimits {
    /// Connections above this are accepted and closed at once (default 10_000).
    pub max_connections: u32,
    /// Max header fields (default 100) -> 431.
    pub max_headers: usize,
    /// Max head size incl. request line (default 64 KiB) -> 431.
    pub max_head_bytes: usize,
    /// Max request line (default 8 KiB) -> 414.
    pub max_request_line: usize,
    /// Whole request head must arrive within this after the first byte or connection idle (default 10 s) -> 408.
    pub head_timeout: Duration,
    /// Idle keep-alive connection closed after this (default 60 s).
    pub keepalive_timeout: Duration,
    /// A request body must arrive at least this fast, averaged since the body started, bytes/s
    /// (default 1024), checked after a 10 s grace -> 408.
    pub body_min_rate: u64,
    /// Max requests per downstream connection (default 0 = unlimited).
    pub max_requests_per_connection: u64,
}

#[derive(Debug, Clone)]
pub struct Route {
    /// "listener/route-index" or the configured `name`.
    pub name: String,
    pub matcher: Matcher,
    pub action: Action,
    /// Max request body bytes (default 1 MiB, like nginx client_max_body_size) -> 413. 0 = unlimited.
    pub max_body_bytes: u64,
    pub request_headers: HeaderRules,
    pub response_headers: HeaderRules,
}

#[derive(Debug, Clone, Default)]
pub struct Matcher {
    /// Empty = any host.
    pub hosts: Vec<HostMatch>,
    /// None = any path.
    pub path: Option<PathMatch>,
    /// Empty = any method. Uppercase method names.
    pub methods: Vec<String>,
    /// All must match: (lowercased header name, exact value or None = present).
    pub headers: Vec<(String, Option<String>)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMatch {
    /// Lowercased exact host, no port.
    Exact(String),
    /// `*.example.com` stored as suffix ".example.com" (matches one or more labels).
    Suffix(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathMatch {
    Exact(String),
    /// Prefix on segment boundary not required: plain string prefix ("/api" matches "/apix").
    /// `path = "/api/**"` in TOML is Prefix("/api/").
    Prefix(String),
}

#[derive(Debug, Clone)]
pub enum Action {
    Proxy(ProxyAction),
    Static(StaticAction),
    Redirect { status: u16, location: String },
    Fixed { status: u16, content_type: String, body: String },
    /// The benchmark origin (static files from `root` if set + synthetic `/bytes/N`, `?size=..`).
    Origin(StaticAction),
}

#[derive(Debug, Clone)]
pub struct ProxyAction {
    /// Index into `Config::upstreams`.
    pub upstream: usize,
    /// Remove this prefix from the path before forwarding (then ensure a leading '/').
    pub strip_prefix: Option<String>,
    /// Replace the matched prefix with this (applied after strip; mutually exclusive with strip).
    pub rewrite_prefix: Option<String>,
    /// Add X-Forwarded-For/-Proto/-Host and X-Real-IP (default true).
    pub forwarded_headers: bool,
    /// Add `Via: 1.1 portico` (default false).
    pub via: bool,
    /// Keep the client's Host header (default true); false sends the upstream server address.
    pub preserve_host: bool,
}

#[derive(Debug, Clone)]
pub struct StaticAction {
    pub root: Option<PathBuf>,
    /// Index file names tried for directories (default ["index.html"]).
    pub index: Vec<String>,
}

/// Header rewrite rules, applied in order: remove, then set (replace), then add (append).
#[derive(Debug, Clone, Default)]
pub struct HeaderRules {
    /// Lowercased names.
    pub remove: Vec<String>,
    pub set: Vec<(String, String)>,
    pub add: Vec<(String, String)>,
}

#[derive(Debug, Clone)]
pub struct UpstreamGroup {
    pub name: String,
    pub servers: Vec<Server>,
    pub balance: Balance,
    /// Max idle keep-alive connections kept per server (default 64, per process).
    pub keepalive: usize,
    /// Max concurrent connections per server, 0 = unlimited (default 0) -> 503 when reached.
    pub max_connections_per_server: u32,
    pub connect_timeout: Duration,
    /// Time from request sent to response head received (default 60 s) -> 504.
    pub response_header_timeout: Duration,
    /// Idle pooled connection closed after this (default 60 s); also the read/write inactivity timeout while streaming.
    pub idle_timeout: Duration,
}

#[derive(Debug, Clone)]
pub struct Server {
    pub address: SocketAddr,
    /// Weight >= 1 (default 1).
    pub weight: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Balance {
    RoundRobin,
    LeastConnections,
    TwoRandomChoices,
    HashClientIp,
    /// Lowercased header name.
    HashHeader(String),
    HashCookie(String),
}
