//! The validated, typed configuration the runtime reads; never re-parsed at runtime.

pub use crate::template::{Captures, Template, Var, Vars};
pub use portico_http1::Coding;
use std::borrow::Cow;
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
    /// The error log: what Portico itself logs (`[log]`).
    pub log: LogSettings,
    /// Request ids (`[request_id]`); None = off.
    pub request_id: Option<RequestId>,
    /// W3C trace context and OpenTelemetry spans (`[trace]`); None = off.
    pub trace: Option<Trace>,
    /// The response cache's store (`[cache]`, or its defaults when a route caches); None = no
    /// route caches.
    pub cache: Option<CacheStore>,
    /// The admin listener (status API, metrics, dashboard); None = no admin listener.
    pub admin: Option<Admin>,
    /// Graceful shutdown: how long in-flight requests get to finish after SIGTERM/SIGINT.
    pub drain_timeout: Duration,
    /// Worker threads; None = available cores. The CLI flag overrides it.
    pub workers: Option<NonZeroU32>,
    /// How upstream groups' `discovery` names are resolved (`[resolver]`; defaults when absent).
    pub resolver: Resolver,
    /// What instances of a fleet share (`[fleet]`); None = this instance shares nothing.
    pub fleet: Option<Fleet>,
    /// How etcd is reached for groups' `discovery = { etcd = ... }` (`[etcd]`: TLS, user).
    pub etcd: EtcdClient,
}

/// What the instances of a fleet share (`[fleet]`): fleet-scoped rate limits counted in Redis.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fleet {
    /// The Redis server the counts go through: `redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]`.
    pub redis: String,
    /// Instances the fleet has: a fleet limit falls back to its rate divided by this while Redis
    /// cannot be reached (`on_redis_down = "local"`).
    pub instances: u32,
    /// How often each instance sends its counts and reads the fleet's.
    pub sync_interval: Duration,
    pub on_redis_down: FleetFallback,
    /// Prefix of every Redis key, so fleets can share a Redis server.
    pub prefix: String,
}

impl Fleet {
    /// The Redis URL with its password replaced by `***`, for logs and `portico check`.
    pub fn redis_shown(&self) -> String {
        match (self.redis.find("://"), self.redis.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => {
                let creds = &self.redis[scheme + 3..at];
                match creds.split_once(':') {
                    Some((user, _)) => format!(
                        "{}{user}:***{}",
                        &self.redis[..scheme + 3],
                        &self.redis[at..]
                    ),
                    // a user name alone: nothing to hide
                    None => self.redis.clone(),
                }
            }
            _ => self.redis.clone(),
        }
    }
}

/// What a fleet rate limit does while Redis cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FleetFallback {
    /// Each instance limits on its own to the rate divided by `instances`.
    Local,
    /// Every request of a fleet-limited route is refused (429).
    Closed,
}

/// How Portico reaches etcd (`[etcd]`, or the `--etcd-*` flags for the configuration source):
/// the CA and client certificate of `etcds://` URLs, and the etcd user it authenticates as.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct EtcdClient {
    /// PEM CA certificates the server's certificate must chain to; None = the system's roots.
    pub ca_file: Option<PathBuf>,
    /// A client certificate and its key (etcd's `--client-cert-auth`).
    pub certificate: Option<CertificateFiles>,
    /// The etcd user (etcd's `auth enable`), with the password in `password_file`.
    pub username: Option<String>,
    pub password_file: Option<PathBuf>,
}

impl EtcdClient {
    /// Whether anything here asks for TLS (a CA or a client certificate).
    pub fn has_tls(&self) -> bool {
        self.ca_file.is_some() || self.certificate.is_some()
    }
}

/// How the names of upstream groups' `discovery` are resolved (`[resolver]`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Resolver {
    /// Name servers asked (UDP, then TCP for truncated answers); empty = the system's
    /// (`/etc/resolv.conf`, whose search domains then apply to names without a final dot).
    pub nameservers: Vec<SocketAddr>,
    /// How long one query waits for an answer before the next attempt (2 attempts).
    pub timeout: Duration,
    /// An answer is asked again no sooner than this, whatever its TTL.
    pub min_ttl: Duration,
    /// ... and no later than this.
    pub max_ttl: Duration,
    /// How long the last servers found are kept once the name no longer exists or has no
    /// records (NXDOMAIN, or no A/AAAA/SRV); failed lookups (timeouts, SERVFAIL) keep them for
    /// as long as they fail.
    pub hold: Duration,
}

impl Resolver {
    /// The documented defaults.
    pub const DEFAULT: Resolver = Resolver {
        nameservers: Vec::new(),
        timeout: Duration::from_secs(2),
        min_ttl: Duration::from_secs(1),
        max_ttl: Duration::from_secs(60),
        hold: Duration::from_secs(30),
    };
}

impl Default for Resolver {
    fn default() -> Self {
        Resolver::DEFAULT
    }
}

/// Servers of an upstream group found by DNS (re-resolved as their TTL expires) or registered
/// in etcd (`[upstreams.NAME.discovery]`); they join the group's listed `servers`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Discovery {
    pub source: DiscoverySource,
    /// Which addresses of the names are used.
    pub family: AddressFamily,
    /// Weight of each address found by `dns`, and of etcd registrations that give none (SRV
    /// records carry their own).
    pub weight: u32,
}

/// What a group's discovery asks.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DiscoverySource {
    /// A and AAAA records of `name`, each address a server on `port`.
    Dns { name: String, port: u16 },
    /// SRV records of `name` (e.g. `_http._tcp.app.internal.`): each target's addresses on the
    /// record's port with its weight; only the records of the lowest priority present.
    Srv { name: String },
    /// The keys under an etcd prefix, one per server (`PREFIX/ANY`, the value `IP:PORT` or
    /// `{"address": "IP:PORT", "weight": N}`), watched, and read at each change and every
    /// `interval`; `name` is the URL written out in full.
    Etcd {
        url: crate::url::EtcdUrl,
        name: String,
        interval: Duration,
        /// The `[etcd]` table's settings.
        client: EtcdClient,
    },
}

impl DiscoverySource {
    /// The name asked, as configured.
    pub fn name(&self) -> &str {
        match self {
            DiscoverySource::Dns { name, .. }
            | DiscoverySource::Srv { name }
            | DiscoverySource::Etcd { name, .. } => name,
        }
    }
}

/// Address families a discovery uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddressFamily {
    /// IPv4 and IPv6 (A and AAAA).
    Any,
    Ipv4,
    Ipv6,
}

/// The admin listener: the status and change API, Prometheus `/metrics` and the dashboard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admin {
    pub address: SocketAddr,
    /// Required as `Authorization: Bearer TOKEN` when set; validation requires one when the
    /// address is not a loopback address.
    pub token: Option<String>,
    /// Where runtime changes made through the API are kept across restarts; None = in memory
    /// only (kept across reloads).
    pub state_file: Option<PathBuf>,
}

/// The error log (`[log]`): its filter, line format and destination.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogSettings {
    /// A `tracing` filter (`info`, `warn,portico_proxy=debug`); None = the built-in default.
    pub level: Option<String>,
    pub format: LogFormat,
    /// None = standard error.
    pub path: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// The default field that carries a request id.
pub const DEFAULT_REQUEST_ID_HEADER: &str = "x-request-id";

/// Request ids (`[request_id]`): one per request, forwarded upstream and logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId {
    /// The field (lowercase) that carries the id upstream, and back to the client when
    /// `response`.
    pub header: String,
    /// Keep a well-formed id the client sent in `header` instead of generating one.
    pub from_client: bool,
    /// Return the id to the client in `header`.
    pub response: bool,
}

/// W3C trace context (`traceparent`) on every request, and a span per sampled request sent
/// over OTLP (`[trace]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// New traces recorded, in basis points (10_000 = all); a client's trace is recorded when
    /// its `traceparent` says sampled.
    pub sample_basis_points: u32,
    /// The OTLP/HTTP endpoint (JSON encoding) spans are posted to; None = propagation and log
    /// fields only.
    pub otlp_endpoint: Option<crate::HttpUrl>,
    /// Fields sent with every export (an API key).
    pub otlp_headers: Vec<(String, String)>,
    /// The `service.name` resource attribute.
    pub service_name: String,
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
    /// TLS termination; None = plain HTTP.
    pub tls: Option<TlsSettings>,
    /// Routes in file order; the first match wins.
    pub routes: Vec<Route>,
    /// Downstream HTTP/2 (ALPN `h2` on TLS listeners, h2c with prior knowledge on plain ones).
    pub http2: Http2Settings,
    /// Downstream HTTP/3 over QUIC (`[listeners.http3]`, TLS listeners only): UDP on the
    /// listener's port; None = off (the default).
    pub http3: Option<Http3Settings>,
    /// Adaptive load shedding (`[listeners.shed]`); None = off (the default).
    pub shed: Option<Shed>,
    /// Peers whose `X-Forwarded-For` (and PROXY header) names the client (empty: none, the
    /// socket's address is the client's; with `proxy_protocol`, every peer's PROXY header).
    pub trusted_proxies: IpRules,
    /// Every connection starts with a PROXY protocol header (v1 or v2) from a load balancer,
    /// naming the client; a connection without one is closed.
    pub proxy_protocol: bool,
    /// The listener's certificate obtained and renewed by ACME (`[listeners.tls.acme]`); its
    /// files are the TLS settings' one certificate.
    pub acme: Option<Acme>,
}

/// A certificate obtained and renewed from an ACME server (RFC 8555).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acme {
    /// The names the certificate covers (the first is its file name); `*.` wildcards with DNS-01.
    pub names: Vec<String>,
    /// `mailto:` contacts for the account.
    pub contact: Vec<String>,
    /// The ACME directory URL.
    pub directory: String,
    /// A PEM file of the CA that signs the directory's own HTTPS certificate (a test server such
    /// as Pebble); None = the system's roots.
    pub directory_ca: Option<PathBuf>,
    /// Where the account, certificate and key files live (0700).
    pub storage: PathBuf,
    /// How the ACME server checks that the names are ours.
    pub challenge: AcmeChallenge,
    /// The certificate's key type.
    pub key_type: AcmeKey,
    /// The ACME profile ordered (Let's Encrypt: `classic`, `tlsserver`, `shortlived`); None =
    /// the server's default.
    pub profile: Option<String>,
    /// Until a certificate is issued, refuse handshakes (true) or serve a self-signed stand-in.
    pub refuse_unissued: bool,
}

/// The ACME challenge a certificate is ordered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcmeChallenge {
    /// HTTP-01: `/.well-known/acme-challenge/TOKEN` answered on every listener (port 80).
    Http01,
    /// TLS-ALPN-01 (RFC 8737): the TLS listener answers `acme-tls/1` handshakes (port 443).
    TlsAlpn01,
    /// DNS-01: a command publishes the TXT record (`HOOK present|cleanup NAME VALUE`), then
    /// `delay` passes before the server is told to look.
    Dns01 { hook: PathBuf, delay: Duration },
}

impl AcmeChallenge {
    /// The challenge's name in ACME (`http-01`, `tls-alpn-01`, `dns-01`).
    pub fn name(&self) -> &'static str {
        match self {
            AcmeChallenge::Http01 => "http-01",
            AcmeChallenge::TlsAlpn01 => "tls-alpn-01",
            AcmeChallenge::Dns01 { .. } => "dns-01",
        }
    }
}

/// The key type of an ACME certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcmeKey {
    /// ECDSA on P-256 (the default).
    EcdsaP256,
    /// ECDSA on P-384.
    EcdsaP384,
    /// RSA of 2048 bits (for old clients without ECDSA).
    Rsa2048,
    /// RSA of 4096 bits.
    Rsa4096,
}

impl AcmeKey {
    /// The name in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            AcmeKey::EcdsaP256 => "ecdsa-p256",
            AcmeKey::EcdsaP384 => "ecdsa-p384",
            AcmeKey::Rsa2048 => "rsa-2048",
            AcmeKey::Rsa4096 => "rsa-4096",
        }
    }
}

impl Acme {
    /// Whether `other` orders the same certificate the same way: every setting but what a
    /// listener does until it is issued.
    pub fn same_order(&self, other: &Acme) -> bool {
        let mut o = other.clone();
        o.refuse_unissued = self.refuse_unissued;
        *self == o
    }

    /// The files the certificate lives in: `STORAGE/NAME.crt` and `.key` for its first name
    /// (`*.example.com` is spelled `_wildcard.example.com`).
    pub fn files(&self) -> CertificateFiles {
        let name = self.names.first().map_or("certificate", String::as_str);
        let name = match name.strip_prefix("*.") {
            Some(rest) => format!("_wildcard.{rest}"),
            None => name.to_string(),
        };
        CertificateFiles {
            cert: self.storage.join(format!("{name}.crt")),
            key: self.storage.join(format!("{name}.key")),
        }
    }
}

/// Let's Encrypt's production directory (`directory = "letsencrypt"`).
pub const LETS_ENCRYPT: &str = "https://acme-v02.api.letsencrypt.org/directory";
/// Let's Encrypt's staging directory (`directory = "letsencrypt-staging"`).
pub const LETS_ENCRYPT_STAGING: &str = "https://acme-staging-v02.api.letsencrypt.org/directory";

/// Load shedding: while a worker's event loop lags more than `target` (after lagging more for a
/// whole `interval`), new requests on this listener get a fast 503 with `Retry-After`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shed {
    /// Event-loop lag above which a worker counts as saturated (default 20 ms).
    pub target: Duration,
    /// How long the lag must stay above `target` before shedding starts (default 100 ms).
    pub interval: Duration,
}

impl Shed {
    /// The documented defaults.
    pub const DEFAULT: Shed = Shed {
        target: Duration::from_millis(20),
        interval: Duration::from_millis(100),
    };
}

/// Downstream HTTP/2 settings of a listener (`[listeners.http2]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http2Settings {
    /// Serve HTTP/2 (default true): ALPN offers `h2` before `http/1.1` on TLS listeners, and a
    /// plain connection starting with the client preface is HTTP/2 (h2c with prior knowledge).
    pub enabled: bool,
    /// SETTINGS_MAX_CONCURRENT_STREAMS (default 100).
    pub max_concurrent_streams: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE in bytes (default 64 KiB, like the HTTP/1 head limit).
    pub max_header_list_size: u32,
    /// SETTINGS_INITIAL_WINDOW_SIZE for request bodies, per stream (default 1 MiB); the
    /// connection window is 4x this.
    pub initial_window_size: u32,
    /// SETTINGS_MAX_FRAME_SIZE (default 16 KiB, the protocol minimum).
    pub max_frame_size: u32,
    /// Rapid reset defence (CVE-2023-44487): more than this many streams reset by the client
    /// within `reset_window` ends the connection with GOAWAY ENHANCE_YOUR_CALM (default 200).
    pub max_resets: u32,
    pub reset_window: Duration,
    /// SETTINGS_ENABLE_CONNECT_PROTOCOL (RFC 8441, default true): WebSockets over HTTP/2 by
    /// extended CONNECT (`:protocol websocket`), tunnelled as an HTTP/1.1 upgrade upstream.
    pub extended_connect: bool,
}

impl Http2Settings {
    /// The documented defaults.
    pub const DEFAULT: Http2Settings = Http2Settings {
        enabled: true,
        max_concurrent_streams: 100,
        max_header_list_size: 64 * 1024,
        initial_window_size: 1024 * 1024,
        max_frame_size: 16 * 1024,
        max_resets: 200,
        reset_window: Duration::from_secs(10),
        extended_connect: true,
    };
}

impl Default for Http2Settings {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// QUIC's congestion controller for a listener's HTTP/3 connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Congestion {
    Cubic,
    Bbr,
    NewReno,
}

impl Congestion {
    pub fn as_str(self) -> &'static str {
        match self {
            Congestion::Cubic => "cubic",
            Congestion::Bbr => "bbr",
            Congestion::NewReno => "newreno",
        }
    }
}

/// Downstream HTTP/3 settings of a TLS listener (`[listeners.http3]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http3Settings {
    /// A connection with no packet for this long is closed (QUIC max_idle_timeout, default 30 s).
    pub idle_timeout: Duration,
    /// Requests in flight per connection (bidirectional streams, default 100).
    pub max_concurrent_streams: u32,
    /// Request body bytes a client may send ahead per stream (default 1 MiB).
    pub stream_window: u32,
    /// Request body bytes a client may send ahead per connection (default 4 MiB).
    pub connection_window: u32,
    /// The largest UDP payload accepted (default 1472 bytes: a 1500-byte Ethernet MTU).
    pub max_udp_payload: u16,
    pub congestion: Congestion,
    /// PINGs this often keep idle connections open through NATs; None = none (the default).
    pub keep_alive_interval: Option<Duration>,
    /// The largest request header section, decoded (default 64 KiB).
    pub max_header_list_size: u32,
    /// While more handshakes than this are in progress on a worker, new clients must prove
    /// their address with a Retry first (default 64; 0 = always).
    pub validate_above: u32,
    /// `Alt-Svc` on HTTP/1.1 and HTTP/2 responses advertises HTTP/3 for this long (`ma`,
    /// default 24 h); None = not advertised.
    pub alt_svc_max_age: Option<Duration>,
    /// Streams a client may reset within `reset_window` before the connection is closed with
    /// H3_EXCESSIVE_LOAD (default 200 per 10 s).
    pub max_resets: u32,
    pub reset_window: Duration,
    /// Accept 0-RTT (early data) from resuming clients (default off): safe methods only,
    /// forwarded with `Early-Data: 1`; others are answered 425 Too Early.
    pub early_data: bool,
}

impl Http3Settings {
    /// The documented defaults.
    pub const DEFAULT: Http3Settings = Http3Settings {
        idle_timeout: Duration::from_secs(30),
        max_concurrent_streams: 100,
        stream_window: 1024 * 1024,
        connection_window: 4 * 1024 * 1024,
        max_udp_payload: 1472,
        congestion: Congestion::Cubic,
        keep_alive_interval: None,
        max_header_list_size: 64 * 1024,
        validate_above: 64,
        alt_svc_max_age: Some(Duration::from_secs(86_400)),
        max_resets: 200,
        reset_window: Duration::from_secs(10),
        early_data: false,
    };
}

/// TLS termination settings of a listener (files are read when the listener starts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// Certificate chains with their keys. SNI picks the first whose certificate is valid for
    /// the requested name; the first one is the default (no SNI, or no match).
    pub certificates: Vec<CertificateFiles>,
    /// Allowed protocol versions (default TLS 1.2 and 1.3).
    pub versions: Vec<TlsVersion>,
    /// Cipher suites in preference order, names from [`CIPHER_SUITES`]; None = the provider's
    /// default set (all AEAD with forward secrecy).
    pub cipher_suites: Option<Vec<&'static str>>,
    /// Key-exchange groups in preference order, names from [`KX_GROUPS`]; None = the provider's
    /// defaults.
    pub groups: Option<Vec<&'static str>>,
    /// Stateless session tickets (TLS 1.2 and 1.3) with rotating keys (default on).
    pub session_tickets: bool,
    /// Server-side session cache entries (default 10_000); 0 = no cache.
    pub session_cache: usize,
    /// Client certificate verification (mTLS); None = no client certificates requested.
    pub client_auth: Option<ClientAuth>,
    /// Poll the certificate, key and client CA files this often and load them again when they
    /// change (default every 5 s); None = only a reload re-reads them (`watch = false`).
    pub watch: Option<Duration>,
    /// Answer ACME TLS-ALPN-01 challenges (`acme-tls/1` handshakes) for the names being ordered.
    pub acme_alpn: bool,
    /// Refuse handshakes while the certificate is ACME's self-signed stand-in.
    pub refuse_stand_in: bool,
}

/// Default `watch_interval` of a TLS listener.
pub const DEFAULT_WATCH_INTERVAL: Duration = Duration::from_secs(5);

/// Default `session_cache` size.
pub const DEFAULT_SESSION_CACHE: usize = 10_000;

/// Cipher suites a listener may name, with the protocol version each belongs to: the aws-lc-rs
/// provider's set, all AEAD with forward secrecy (ECDHE for TLS 1.2). Spelled as IANA names.
pub const CIPHER_SUITES: [(&str, TlsVersion); 9] = [
    ("TLS13_AES_256_GCM_SHA384", TlsVersion::Tls13),
    ("TLS13_AES_128_GCM_SHA256", TlsVersion::Tls13),
    ("TLS13_CHACHA20_POLY1305_SHA256", TlsVersion::Tls13),
    ("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", TlsVersion::Tls12),
    ("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", TlsVersion::Tls12),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        TlsVersion::Tls12,
    ),
    ("TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", TlsVersion::Tls12),
    ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", TlsVersion::Tls12),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        TlsVersion::Tls12,
    ),
];

/// Key-exchange groups a listener may name, and whether each also works with TLS 1.2 (the
/// post-quantum hybrids are TLS 1.3 only).
pub const KX_GROUPS: [(&str, bool); 5] = [
    ("X25519", true),
    ("secp256r1", true),
    ("secp384r1", true),
    ("X25519MLKEM768", false),
    ("secp256r1MLKEM768", false),
];

/// mTLS: client certificates verified against a CA bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientAuth {
    /// PEM file of the CA certificates client certificates must chain to.
    pub ca: PathBuf,
    /// true: a handshake without a valid client certificate fails; false: a certificate is
    /// verified when presented and the connection is accepted without one.
    pub required: bool,
}

/// One certificate chain (PEM, leaf first) and its private key (PEM: PKCS#8, SEC1 or PKCS#1).
/// Relative paths in the file are resolved against the configuration file's directory.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CertificateFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TlsVersion {
    Tls12,
    Tls13,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerLimits {
    /// Connections above this are accepted and closed at once (default 10_000).
    pub max_connections: u32,
    /// Open connections one client IP address may hold on this listener, over all workers;
    /// more are accepted and closed at once (default 0 = no per-client limit).
    pub max_connections_per_client: u32,
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
    /// A client receiving a response that accepts no byte (HTTP/1.1: the socket stays full;
    /// HTTP/2: no flow-control window) for this long is disconnected (default 60 s).
    pub send_timeout: Duration,
    /// A request body must arrive at least this fast, averaged since the body started, bytes/s
    /// (default 1024), checked after a 10 s grace -> 408.
    pub body_min_rate: u64,
    /// Max requests per downstream connection (default 0 = unlimited).
    pub max_requests_per_connection: u64,
}

#[derive(Debug, Clone)]
pub struct Route {
    /// The configured `name`, or "{listener name}#{route index}" (index 0-based, file order).
    pub name: String,
    pub matcher: Matcher,
    pub action: Action,
    /// Max request body bytes (default 1 MiB, like nginx client_max_body_size) -> 413. 0 = unlimited.
    pub max_body_bytes: u64,
    pub request_headers: HeaderRules,
    pub response_headers: HeaderRules,
    /// Requests per key (`[listeners.routes.rate_limit]`); None = unlimited.
    pub rate_limit: Option<RateLimit>,
    /// Response compression: the route's own `compression` table, else its listener's; None =
    /// off (the default, and `enabled = false`).
    pub compression: Option<Compression>,
    /// The cross-origin policy (`[listeners.routes.cors]`); None = Portico adds no CORS field.
    pub cors: Option<Cors>,
    /// Which client addresses may use the route (`ip_rules`, the route's or its listener's);
    /// None = any.
    pub ip_rules: Option<IpRules>,
    /// Users and passwords the route asks for (`basic_auth`, the route's or its listener's);
    /// None = none.
    pub basic_auth: Option<std::sync::Arc<BasicAuth>>,
    /// An auth service asked about each request first (`forward_auth`); None = none.
    pub forward_auth: Option<ForwardAuth>,
    /// Bearer tokens the route asks for (`jwt`, the route's or its listener's); None = none.
    pub jwt: Option<std::sync::Arc<Jwt>>,
    /// Which verified client certificates may use the route (`client_cert`, the route's or its
    /// listener's, on listeners with `client_auth`); None = any.
    pub client_cert: Option<std::sync::Arc<ClientCertRules>>,
}

/// Client-certificate rules: for each list that is not empty, one of its patterns must match
/// (`*` matches any run of characters; ASCII case is ignored). A request without a verified
/// certificate matches none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCertRules {
    /// Patterns of the subject, as RFC 4514 text (`CN=alice,O=Example`).
    pub subject: Vec<String>,
    /// Patterns of one subject alternative name: `DNS:...`, `IP:...`, `email:...`, `URI:...`.
    pub san: Vec<String>,
    /// Patterns of the issuer, as RFC 4514 text.
    pub issuer: Vec<String>,
}

/// JWT bearer tokens (RFC 7519) a route asks for: where the token is, the keys its signature is
/// checked with, and what its claims must say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jwt {
    pub keys: JwtKeys,
    /// Signature algorithms taken (`alg` of the token); never `none`.
    pub algorithms: Vec<crate::jwks::JwtAlgorithm>,
    /// `iss` must be one of these (empty: any).
    pub issuers: Vec<String>,
    /// `aud` must name one of these (empty: any).
    pub audiences: Vec<String>,
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway: Duration,
    /// Where the token is looked for, in this order: a header (lowercased; `authorization`
    /// takes the `Bearer` scheme), a cookie, a query parameter.
    pub header: Option<String>,
    pub cookie: Option<String>,
    pub query: Option<String>,
    /// Claims that must be present (`exp` always is).
    pub require: Vec<String>,
    /// Claims that must match: the claim (a dotted path into objects) equals one of the values,
    /// or, for an array (or the space-separated `scope`/`scp`), holds one of them.
    pub claims: Vec<(String, Vec<String>)>,
    /// Claims set as fields on the forwarded request: (claim path, field name lowercased). The
    /// client's own fields of those names are removed.
    pub forward_claims: Vec<(String, String)>,
    /// Forward the `Authorization` field that carried the token (default false: removed).
    pub keep_token: bool,
    /// The `realm` of `WWW-Authenticate`.
    pub realm: String,
}

/// Where a JWT check's keys come from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum JwtKeys {
    /// A JWK set file, watched and read again when it changes.
    File(std::path::PathBuf),
    /// A JWK set URL (`http` or `https`), fetched at start and every `refresh`, and again
    /// (at most every `min_refresh`) when a token names a key the set lacks.
    Url { url: String, refresh: Duration },
}

/// Forward auth: a request to a server of `group` decides whether the request may pass (2xx)
/// or what the client gets instead (any other answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardAuth {
    /// Index into `Config::upstreams`.
    pub group: usize,
    /// The path asked; None = the request's own target.
    pub path: Option<String>,
    /// Request fields sent along (lowercased; default `authorization`, `cookie`).
    pub request_headers: Vec<String>,
    /// Fields of a 2xx answer set on the forwarded request (lowercased).
    pub copy_headers: Vec<String>,
    /// How long a pass is remembered for the same values of `request_headers` (zero: not).
    pub cache: Duration,
    /// The auth service unreachable lets requests pass (default false: 503).
    pub fail_open: bool,
}

/// HTTP Basic authentication (RFC 7617): users with bcrypt or argon2 password hashes, from the
/// configuration and an htpasswd file (watched: read again when it changes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BasicAuth {
    /// The `realm` of `WWW-Authenticate` (default "restricted").
    pub realm: String,
    /// (user, hash), sorted by user; a user in both the file and the table takes the table's.
    pub users: Vec<(String, String)>,
    /// The htpasswd file, watched and read again when it changes; None = users from the table.
    pub htpasswd: Option<std::path::PathBuf>,
    /// The users of the table (which win over the file's when it is read again).
    pub table: Vec<(String, String)>,
    /// Keep the `Authorization` field on the forwarded request (default false: removed).
    pub keep_authorization: bool,
    /// Refuse a client address (429) after this many failures within the window; None = never.
    pub lockout: Option<Lockout>,
}

/// Basic-auth lockout: `failures` failed attempts from one client address within `window`
/// lock that address out until the window ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lockout {
    pub failures: u32,
    pub window: Duration,
}

impl BasicAuth {
    /// The password hash of `user`.
    pub fn hash(&self, user: &str) -> Option<&str> {
        self.users
            .binary_search_by(|(u, _)| u.as_str().cmp(user))
            .ok()
            .map(|i| self.users[i].1.as_str())
    }
}

/// Ordered allow and deny rules over addresses and CIDR ranges: the first rule that covers an
/// address decides; an address no rule covers is allowed. Consecutive rules of one kind are kept
/// as sorted, merged ranges, so a list of 10,000 ranges costs a binary search, not a scan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpRules {
    blocks: Vec<IpBlock>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct IpBlock {
    allow: bool,
    /// Disjoint inclusive ranges, sorted.
    v4: Vec<(u32, u32)>,
    v6: Vec<(u128, u128)>,
}

impl IpRules {
    /// Add a rule at the end: `allow` or deny the range `net` (an address and a prefix length).
    pub fn push(&mut self, allow: bool, addr: std::net::IpAddr, prefix: u8) {
        if self.blocks.last().is_none_or(|b| b.allow != allow) {
            self.blocks.push(IpBlock {
                allow,
                v4: Vec::new(),
                v6: Vec::new(),
            });
        }
        let Some(b) = self.blocks.last_mut() else {
            return;
        };
        match addr {
            std::net::IpAddr::V4(a) => {
                let bits = u32::from(a);
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(prefix.min(32)))
                    .unwrap_or(0);
                insert(&mut b.v4, (bits & mask, bits | !mask));
            }
            std::net::IpAddr::V6(a) => {
                let bits = u128::from(a);
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(prefix.min(128)))
                    .unwrap_or(0);
                insert(&mut b.v6, (bits & mask, bits | !mask));
            }
        }
    }

    /// No rule at all.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Whether the first rule covering `ip` allows it (true when none covers it). An IPv4
    /// address written as IPv6 (`::ffff:a.b.c.d`) is taken as the IPv4 one.
    pub fn allows(&self, ip: std::net::IpAddr) -> bool {
        self.decide(ip).unwrap_or(true)
    }

    /// Whether any rule covers `ip` (for lists of trusted proxies: all rules allow).
    pub fn covers(&self, ip: std::net::IpAddr) -> bool {
        self.decide(ip).is_some()
    }

    fn decide(&self, ip: std::net::IpAddr) -> Option<bool> {
        let ip = match ip {
            std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => std::net::IpAddr::V4(v4),
                None => ip,
            },
            v4 => v4,
        };
        self.blocks.iter().find_map(|b| {
            let hit = match ip {
                std::net::IpAddr::V4(a) => within(&b.v4, u32::from(a)),
                std::net::IpAddr::V6(a) => within(&b.v6, u128::from(a)),
            };
            hit.then_some(b.allow)
        })
    }

    /// The number of merged ranges (for `explain`).
    pub fn ranges(&self) -> usize {
        self.blocks.iter().map(|b| b.v4.len() + b.v6.len()).sum()
    }
}

/// Insert the inclusive range `r` into sorted disjoint `ranges`, merging what it touches.
fn insert<T: Copy + Ord + num_like::Succ>(ranges: &mut Vec<(T, T)>, r: (T, T)) {
    let at = ranges.partition_point(|x| x.1 < r.0 && x.1.succ() < r.0);
    let mut lo = r.0;
    let mut hi = r.1;
    let mut end = at;
    while end < ranges.len() && ranges[end].0 <= hi.succ().max(hi) {
        lo = lo.min(ranges[end].0);
        hi = hi.max(ranges[end].1);
        end += 1;
    }
    ranges.splice(at..end, [(lo, hi)]);
}

/// Whether `x` is in one of the sorted disjoint inclusive `ranges`.
fn within<T: Copy + Ord>(ranges: &[(T, T)], x: T) -> bool {
    let i = ranges.partition_point(|r| r.1 < x);
    ranges.get(i).is_some_and(|r| r.0 <= x)
}

mod num_like {
    /// The next value, saturating (for merging adjacent ranges).
    pub trait Succ {
        fn succ(self) -> Self;
    }
    impl Succ for u32 {
        fn succ(self) -> Self {
            self.saturating_add(1)
        }
    }
    impl Succ for u128 {
        fn succ(self) -> Self {
            self.saturating_add(1)
        }
    }
}

/// A route's CORS policy (the Fetch standard's CORS protocol): preflights answered here,
/// `Access-Control-*` fields on the responses to allowed origins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cors {
    /// Origins allowed; empty = any (`allow_origins = ["*"]`).
    pub origins: Vec<OriginPattern>,
    /// Methods a preflight may ask for, uppercased (default GET, HEAD, POST).
    pub methods: Vec<String>,
    /// Request fields a preflight may ask for, lowercased; None = any (`["*"]`: the requested
    /// ones are allowed back).
    pub headers: Option<Vec<String>>,
    /// Response fields scripts may read beyond the safelisted ones, as written.
    pub expose_headers: Vec<String>,
    /// Cookies and credentials allowed (never with any origin).
    pub credentials: bool,
    /// How long a browser may keep a preflight's answer; None = the browser's default.
    pub max_age: Option<Duration>,
}

/// An allowed origin: exact (`https://app.example.com`, lowercased, default port omitted) or
/// every subdomain of a name under one scheme (`https://*.example.com`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OriginPattern {
    Exact(String),
    /// `scheme://` and `.suffix[:port]`: `https://*.example.com` is ("https://", ".example.com").
    Subdomains {
        scheme: String,
        suffix: String,
    },
}

impl Cors {
    /// Whether a request's `Origin` value is allowed.
    pub fn allows(&self, origin: &[u8]) -> bool {
        if self.origins.is_empty() {
            return true;
        }
        self.origins.iter().any(|p| match p {
            OriginPattern::Exact(o) => origin.eq_ignore_ascii_case(o.as_bytes()),
            OriginPattern::Subdomains { scheme, suffix } => {
                origin.len() > scheme.len() + suffix.len()
                    && origin[..scheme.len()].eq_ignore_ascii_case(scheme.as_bytes())
                    && origin[origin.len() - suffix.len()..].eq_ignore_ascii_case(suffix.as_bytes())
                    && origin[scheme.len()..origin.len() - suffix.len()]
                        .iter()
                        .all(|&b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
            }
        })
    }
}

/// Response compression (`[listeners.compression]`, `[listeners.routes.compression]`): a
/// response whose type is listed and whose length is unknown or at least `min_length` is
/// compressed with the coding the client accepts, preferring the earlier in `algorithms`.
#[derive(Debug, Clone, PartialEq)]
pub struct Compression {
    /// The codings offered, in the server's order of preference (default zstd, br, gzip).
    pub algorithms: Vec<Coding>,
    /// Responses announcing a shorter `Content-Length` are sent as they are (default 256).
    pub min_length: u64,
    /// Media types compressed: `type/subtype` or `type/*`, lowercased (default
    /// [`DEFAULT_COMPRESSION_TYPES`]).
    pub types: Vec<String>,
    /// gzip level 1-9 (default 6, zlib's own default).
    pub gzip_level: u32,
    /// brotli quality 0-11 (default 4: 11 is for files compressed once, far too slow per request).
    pub brotli_level: u32,
    /// zstd level 1-19 (default 3, zstd's own default).
    pub zstd_level: i32,
}

/// The media types compressed when `types` is not set: text, and the structured and script
/// types that are text underneath (not images, video, archives or fonts already compressed).
pub const DEFAULT_COMPRESSION_TYPES: [&str; 13] = [
    "text/*",
    "application/javascript",
    "application/json",
    "application/ld+json",
    "application/manifest+json",
    "application/xml",
    "application/xhtml+xml",
    "application/atom+xml",
    "application/rss+xml",
    "application/wasm",
    "image/svg+xml",
    "font/ttf",
    "font/otf",
];

impl Compression {
    /// The documented defaults.
    pub fn defaults() -> Compression {
        Compression {
            algorithms: Coding::ALL.to_vec(),
            min_length: 256,
            types: DEFAULT_COMPRESSION_TYPES.map(String::from).to_vec(),
            gzip_level: 6,
            brotli_level: 4,
            zstd_level: 3,
        }
    }

    /// Whether a response of media type `mime` (a `Content-Type` value; parameters and case
    /// ignored) is compressed.
    pub fn compresses_type(&self, mime: &[u8]) -> bool {
        let essence = mime
            .split(|&b| b == b';')
            .next()
            .unwrap_or_default()
            .trim_ascii();
        self.types.iter().any(|t| match t.strip_suffix('*') {
            Some(prefix) => {
                essence.len() > prefix.len()
                    && essence[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
            }
            None => essence.eq_ignore_ascii_case(t.as_bytes()),
        })
    }
}

/// A token bucket per key, shared by every worker: `burst` tokens at most, `rate` new tokens per
/// second; a request takes one, and a request finding none gets 429 with `Retry-After`.
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimit {
    /// Tokens added per second (> 0; fractions allowed: 0.5 = one request every 2 s).
    pub rate: f64,
    /// Bucket size: requests allowed at once after an idle period (default: `rate` rounded up).
    pub burst: u32,
    pub key: RateLimitKey,
    /// Most keys tracked at once (default 100_000); idle buckets are dropped first when full.
    pub max_keys: usize,
    /// Counted by this instance alone, or by every instance of the fleet (`scope = "fleet"`:
    /// requests in a sliding one-second window, at most `rate`, counted through Redis).
    pub fleet: bool,
}

/// What a rate limit counts requests by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RateLimitKey {
    /// The client's IP address (the default).
    ClientIp,
    /// This request header's value (lowercased name); requests without it count by client IP.
    Header(String),
    /// This cookie's value (name as written); requests without it count by client IP.
    Cookie(String),
}

/// Rate limit `max_keys` when not configured.
pub const DEFAULT_RATE_LIMIT_KEYS: usize = 100_000;

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
    /// Lowercased exact host, no port, no trailing dot.
    Exact(String),
    /// `*.example.com` stored as suffix ".example.com" (matches one or more labels, not the bare
    /// "example.com").
    Suffix(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathMatch {
    /// The whole path (query excluded) equals this string, byte for byte.
    Exact(String),
    /// `path_regex`: the path (query excluded, as received) matches this regular expression
    /// somewhere (anchor it with `^` and `$` to match the whole path); its capture groups are
    /// variables of the route's templates.
    Regex(PathRegex),
    /// `path = "/api/**"` in TOML is `Prefix("/api/")`; `path = "/**"` is `Prefix("/")`.
    /// Matches a path that starts with the string, and also the path equal to the string without
    /// its trailing '/': `Prefix("/api/")` matches "/api", "/api/" and "/api/v1/x" but not "/apix".
    /// See [`PathMatch::matches`].
    Prefix(String),
}

#[derive(Debug, Clone)]
pub enum Action {
    Proxy(ProxyAction),
    Static(StaticAction),
    Redirect {
        status: u16,
        /// `Location`, with variables (`https://{host}{uri}`).
        location: Template,
    },
    Fixed {
        status: u16,
        content_type: String,
        body: String,
    },
    /// The benchmark origin (static files from `root` if set + synthetic `/bytes/N`, `?size=..`).
    Origin(StaticAction),
}

#[derive(Debug, Clone)]
pub struct ProxyAction {
    /// Index into `Config::upstreams`.
    pub upstream: usize,
    /// Remove this prefix from the path before forwarding (then ensure a leading '/'). Never ends
    /// with '/'; validation guarantees every path the route matches starts with it on a segment
    /// boundary. TOML `strip_prefix = true` with `path = "/api/**"` is `Some("/api")`.
    pub strip_prefix: Option<String>,
    /// Replace the route's matched `PathMatch::Prefix` (which ends with '/') with this (which also
    /// ends with '/'); mutually exclusive with `strip_prefix`. TOML `rewrite_prefix = "/v2"` with
    /// `path = "/api/**"` is `Some("/v2/")`: "/api/users" is sent as "/v2/users", the bare "/api"
    /// as "/v2". See [`Route::upstream_target`].
    pub rewrite_prefix: Option<String>,
    /// `rewrite`: the whole target sent upstream, with variables (`/v2/{1}`); the client's query
    /// is appended when the result has none. Exclusive with `strip_prefix` and `rewrite_prefix`.
    pub rewrite: Option<Template>,
    /// Add X-Forwarded-For/-Proto/-Host and X-Real-IP (default true).
    pub forwarded_headers: bool,
    /// Add `Via: 1.1 portico` (default false).
    pub via: bool,
    /// Keep the client's Host header (default true); false sends the upstream server address.
    pub preserve_host: bool,
    /// Retries of failed attempts (`[listeners.routes.retry]`); None = no retries (the one
    /// retry of a stale pooled connection still happens).
    pub retry: Option<RetryPolicy>,
    /// Read the whole request body before a server is picked (`buffer_request`); None = the
    /// body streams to the server as it arrives (the default).
    pub buffer: Option<RequestBuffer>,
    /// Shares of the route's requests sent to other groups (`split`); the rest go to `upstream`.
    pub split: Option<Split>,
    /// A copy of sampled requests sent to a shadow group, its answers discarded (`mirror`).
    pub mirror: Option<Mirror>,
    /// Responses kept in the shared cache and answered from it (`cache`); None = off.
    pub cache: Option<Box<RouteCache>>,
}

/// Default `[cache] memory`: 64 MiB.
pub const DEFAULT_CACHE_MEMORY: u64 = 64 << 20;
/// Default `[cache] max_object`: 8 MiB.
pub const DEFAULT_CACHE_MAX_OBJECT: u64 = 8 << 20;
/// Default `[cache] lock_timeout`: 5 s.
pub const DEFAULT_CACHE_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// The response cache's store, shared by every worker and kept across reloads while its
/// `memory` stays the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheStore {
    /// Bytes of responses (heads and bodies) held in memory at most.
    pub memory: u64,
    /// The largest response body stored; larger ones pass through uncached.
    pub max_object: u64,
    /// How long a request waits for another request's fetch of the same key before fetching
    /// itself (collapsed forwarding).
    pub lock_timeout: Duration,
    /// A response field listing the response's tags (comma or space separated), for purges
    /// by tag; lowercase. None = no tags.
    pub tag_header: Option<String>,
    /// The disk tier: stored responses also written to files that outlive restarts; None =
    /// memory only.
    pub disk: Option<CacheDisk>,
}

/// Default `[cache] disk_size`: 1 GiB.
pub const DEFAULT_CACHE_DISK_SIZE: u64 = 1 << 30;

/// The response cache's disk tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheDisk {
    /// The directory of its files (created when missing).
    pub path: PathBuf,
    /// Bytes of files kept at most (their logical sizes); past it, files go by the index's
    /// admission and eviction (TinyLFU over writes and reads back from disk).
    pub size: u64,
}

/// What a route's cache key takes from the query string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueryKey {
    /// The whole query as sent (the default).
    All,
    /// None of it.
    None,
    /// Only these parameters, sorted by name.
    Only(Vec<String>),
    /// Every parameter but these, sorted by name.
    Except(Vec<String>),
}

/// A route's `cache` table: how its responses are keyed, kept and bypassed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteCache {
    pub query: QueryKey,
    /// Request fields whose values are part of the key (lowercase).
    pub key_headers: Vec<String>,
    /// Cookies whose values are part of the key.
    pub key_cookies: Vec<String>,
    /// Freshness for a response that states none (no `max-age`, `s-maxage` or `Expires`) and
    /// whose status is cacheable by default; None = such responses are not stored.
    pub default_ttl: Option<Duration>,
    /// Freshness for every storable response, whatever it states.
    pub override_ttl: Option<Duration>,
    /// How long past its freshness a response may still answer when the upstream fails, unless
    /// the response's own `stale-if-error` says otherwise or it forbids stale answers.
    pub stale_if_error: Duration,
    /// How long past its freshness a response may still answer while a fetch in the background
    /// refreshes it, unless the response's own `stale-while-revalidate` says otherwise or it
    /// forbids stale answers.
    pub stale_while_revalidate: Duration,
    /// A request with any of these fields skips the cache (neither looked up nor stored).
    pub bypass_headers: Vec<String>,
    /// A request with any of these cookies skips the cache.
    pub bypass_cookies: Vec<String>,
    /// One upstream fetch per key at a time; the other requests for it wait (default true).
    pub lock: bool,
    /// The route's identity for its stored responses: a hash of its name, its group and this
    /// table, so that routes never share them and a reload that changes one of these leaves
    /// what was stored under the old settings unused.
    pub scope: u64,
}

/// Request mirroring: `percent` of the route's requests (in basis points: 10,000 = all) are
/// also sent, fire-and-forget, to a server of `group`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mirror {
    pub group: usize,
    pub basis_points: u32,
}

/// A traffic split: each share's group gets that many hundredths of a percent of the requests,
/// chosen by `key` (the same key value always lands on the same side).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// (group index, basis points: 1 = 0.01%), in order; their sum is at most 10,000.
    pub shares: Vec<(usize, u32)>,
    pub key: SplitKey,
}

/// What decides a request's side of a split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SplitKey {
    /// A fresh draw per request (the default).
    Random,
    /// The client's IP address.
    ClientIp,
    /// This request header's value (lowercased name); a request without it draws at random.
    Header(String),
    /// This cookie's value; a request without it draws at random.
    Cookie(String),
}

/// Request body buffering: up to `memory` bytes in memory, the rest in an unnamed temporary
/// file in `directory`, never more than the route's `max_body` (413 above it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestBuffer {
    /// Bytes kept in memory per request (default 64 KiB).
    pub memory: u64,
    /// Where the temporary files go (default: the system's, `$TMPDIR` or `/tmp`).
    pub directory: PathBuf,
}

/// `buffer_request.memory` when not configured.
pub const DEFAULT_BUFFER_MEMORY: u64 = 64 * 1024;

/// When and how often a failed proxied request is sent again, to another server of the group.
/// Only requests without a body are retried (the body is streamed, never buffered), and only
/// idempotent methods unless `non_idempotent`; upgrade requests never.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Retries after the first attempt (default 1).
    pub retries: u32,
    /// Which failures are retried.
    pub on: RetryOn,
    /// Also retry POST, PATCH and other non-idempotent methods (default false).
    pub non_idempotent: bool,
    /// Retries may be at most this share of the route's requests over the last
    /// [`RETRY_BUDGET_WINDOW`] (default 0.2), plus the floor below. Shared by all workers.
    pub budget: f64,
    /// Retries always allowed per second regardless of traffic, over the window (default 10).
    pub min_per_second: u32,
}

/// The failures a [`RetryPolicy`] retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryOn {
    /// The TCP connect failed (refused, unreachable) or timed out: nothing was sent.
    pub connect: bool,
    /// The server closed or reset the connection before any response byte.
    pub reset: bool,
    /// No response head within the group's `response_header_timeout`.
    pub timeout: bool,
    /// A 502 response head.
    pub status_502: bool,
    /// A 503 response head.
    pub status_503: bool,
    /// A 504 response head.
    pub status_504: bool,
}

impl RetryOn {
    /// The default `on` list: connect, reset, 502, 503, 504 (not timeout: a timed-out request
    /// has already waited `response_header_timeout`).
    pub const DEFAULT: RetryOn = RetryOn {
        connect: true,
        reset: true,
        timeout: false,
        status_502: true,
        status_503: true,
        status_504: true,
    };

    /// Whether a response with this status is retried.
    pub fn status(&self, status: u16) -> bool {
        match status {
            502 => self.status_502,
            503 => self.status_503,
            504 => self.status_504,
            _ => false,
        }
    }

    /// The names, in the order of the `on` key's documentation.
    pub fn names(&self) -> Vec<&'static str> {
        [
            (self.connect, "connect"),
            (self.reset, "reset"),
            (self.timeout, "timeout"),
            (self.status_502, "502"),
            (self.status_503, "503"),
            (self.status_504, "504"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }
}

/// The window over which a retry budget compares retries with requests.
pub const RETRY_BUDGET_WINDOW: Duration = Duration::from_secs(10);
/// Retry `budget` when not configured.
pub const DEFAULT_RETRY_BUDGET: f64 = 0.2;
/// Retry `min_per_second` when not configured.
pub const DEFAULT_RETRY_MIN_PER_SECOND: u32 = 10;

#[derive(Debug, Clone)]
pub struct StaticAction {
    pub root: Option<PathBuf>,
    /// Index file names tried for directories (default ["index.html"]).
    pub index: Vec<String>,
    /// Precompressed siblings (`app.js.br`) served to clients that accept their coding, in this
    /// order of preference (default none).
    pub precompressed: Vec<Coding>,
}

/// Header rewrite rules, applied in order: remove, then set (replace), then add (append).
#[derive(Debug, Clone, Default)]
pub struct HeaderRules {
    /// Lowercased names.
    pub remove: Vec<String>,
    /// Values may have variables (`{remote_addr}`, `{header.NAME}`).
    pub set: Vec<(String, Template)>,
    pub add: Vec<(String, Template)>,
}

impl HeaderRules {
    /// No rule at all.
    pub fn is_empty(&self) -> bool {
        self.remove.is_empty() && self.set.is_empty() && self.add.is_empty()
    }
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
    /// TCP connect to a server must complete within this (default 5 s) -> 504; a refused connect -> 502.
    pub connect_timeout: Duration,
    /// Time from request sent to response head received (default 60 s) -> 504.
    pub response_header_timeout: Duration,
    /// Idle pooled connection closed after this (default 60 s); also the read/write inactivity timeout while streaming.
    pub idle_timeout: Duration,
    /// Active health checks (`[upstreams.NAME.health_check]`); None = servers are never probed.
    pub health_check: Option<HealthCheck>,
    /// Passive checks, ejection and slow start (`[upstreams.NAME.passive]`; defaults when absent).
    pub passive: PassiveCheck,
    /// Index into `Config::upstreams` of the group that takes requests when no server of this one
    /// is available (all down, ejected, draining or disabled). Never this group; no cycles.
    pub fallback: Option<usize>,
    /// HTTPS to the servers (`[upstreams.NAME.tls]`); None = plain HTTP.
    pub tls: Option<UpstreamTls>,
    /// Requests that may wait, process-wide, for a server slot when every available server is
    /// at `max_connections_per_server` (default 0: none wait, 503 at once). Needs a limit.
    pub queue: u32,
    /// Longest wait in that queue before a 503 (default 1 s).
    pub queue_timeout: Duration,
    /// Session persistence by a cookie Portico sets (`sticky_cookie`); None = off.
    pub sticky_cookie: Option<StickyCookie>,
    /// The protocol spoken to the servers (`protocol`, default `http1`).
    pub protocol: UpstreamProtocol,
    /// More servers found by DNS (`discovery`); None = only the listed `servers`.
    pub discovery: Option<Discovery>,
    /// The PROXY protocol version (1 or 2) each connection to the servers starts with
    /// (`proxy_protocol`); None = none.
    pub proxy_protocol: Option<u8>,
}

/// The protocol an upstream group speaks to its servers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum UpstreamProtocol {
    /// HTTP/1.1 over pooled keep-alive connections.
    #[default]
    Http1,
    /// HTTP/2, many requests multiplexed over few connections per server: TLS with ALPN `h2`
    /// when the group has `tls`, else h2c with prior knowledge.
    H2,
}

/// Session persistence: responses set a cookie naming the chosen server (an opaque id derived
/// from its address), and requests carrying it go to that server while it is available.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StickyCookie {
    /// A token.
    pub name: String,
    /// The `Path` attribute (default "/").
    pub path: String,
    /// The `Max-Age` attribute in seconds; None = a session cookie (default).
    pub max_age: Option<u64>,
    /// The `HttpOnly` attribute (default true: scripts have no use for it).
    pub http_only: bool,
    /// The `Secure` attribute (default false).
    pub secure: bool,
    /// The `SameSite` attribute: "Strict", "Lax" or "None"; None = not sent (default).
    pub same_site: Option<&'static str>,
}

impl StickyCookie {
    /// A `Set-Cookie` value giving the cookie `value`, with every attribute.
    pub fn set_cookie(&self, value: &str) -> String {
        let mut out = format!("{}={value}; Path={}", self.name, self.path);
        if let Some(age) = self.max_age {
            out.push_str(&format!("; Max-Age={age}"));
        }
        if self.http_only {
            out.push_str("; HttpOnly");
        }
        if self.secure {
            out.push_str("; Secure");
        }
        if let Some(s) = self.same_site {
            out.push_str("; SameSite=");
            out.push_str(s);
        }
        out
    }
}

/// TLS origination: how the proxy speaks HTTPS to the servers of a group (files are read when
/// the configuration is applied, once per group, not per connection).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UpstreamTls {
    /// PEM file of the CA certificates server certificates must chain to; None = the system's
    /// root certificates (/etc/ssl/certs).
    pub ca_file: Option<PathBuf>,
    /// The name sent as SNI and that server certificates must be valid for (a DNS name or an IP
    /// address); None = each server's own IP address (no SNI is sent for an IP address).
    pub server_name: Option<String>,
    /// A client certificate and key presented to the servers (mTLS to upstreams).
    pub certificate: Option<CertificateFiles>,
    /// Verify server certificates (default true). false accepts any certificate: `portico check`
    /// and `portico run` warn about it.
    pub verify: bool,
    /// Allowed protocol versions (default TLS 1.2 and 1.3).
    pub versions: Vec<TlsVersion>,
    /// Client session cache entries for resumption to the servers, shared by all workers
    /// (default 256); 0 = every connection makes a full handshake.
    pub session_cache: usize,
}

/// Default upstream TLS `session_cache` size.
pub const DEFAULT_UPSTREAM_SESSION_CACHE: usize = 256;

/// Active health check of every server of a group: one probe per server per `interval`, for the
/// whole process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    pub kind: HealthCheckKind,
    /// Time between the start of two probes of one server (default 5 s).
    pub interval: Duration,
    /// A probe (connect, request, response) must finish within this (default 2 s; < `interval`).
    pub timeout: Duration,
    /// Consecutive successful probes that bring a down server back up (default 2).
    pub rise: u32,
    /// Consecutive failed probes that mark an up server down (default 3).
    pub fall: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthCheckKind {
    /// A TCP connect that succeeds within the timeout.
    Tcp,
    /// An HTTP/1.1 request whose response status (and optionally body) is as expected.
    Http(HttpCheck),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpCheck {
    /// Uppercase method token (default "GET").
    pub method: String,
    /// Origin-form request target (default "/").
    pub path: String,
    /// Host header; None = the server's address.
    pub host: Option<String>,
    /// Accepted statuses, inclusive (default 200-399).
    pub expect_status: (u16, u16),
    /// The first 64 KiB of the body must contain this string.
    pub expect_body: Option<String>,
}

/// Passive checks: servers failing real requests are ejected for a while.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassiveCheck {
    /// Consecutive failures (connect errors, timeouts, resets before a response, 5xx responses)
    /// that eject a server (default 5; 0 = passive checks off).
    pub max_failures: u32,
    /// First ejection time (default 10 s); doubles on each repeat ejection.
    pub ejection: Duration,
    /// Longest ejection (default 5 min).
    pub max_ejection: Duration,
    /// Never eject more than this percentage of the group's servers (default 50).
    pub max_ejected_percent: u32,
    /// A recovered or newly added server's weight ramps linearly from 1 to its weight over this
    /// time (default 0 = off).
    pub slow_start: Duration,
}

impl PassiveCheck {
    /// The documented defaults.
    pub const DEFAULT: PassiveCheck = PassiveCheck {
        max_failures: 5,
        ejection: Duration::from_secs(10),
        max_ejection: Duration::from_secs(300),
        max_ejected_percent: 50,
        slow_start: Duration::ZERO,
    };
}

impl Default for PassiveCheck {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Health check `interval` when not configured.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(5);
/// Health check `timeout` when not configured.
pub const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(2);
/// Health check `rise` when not configured.
pub const DEFAULT_RISE: u32 = 2;
/// Health check `fall` when not configured.
pub const DEFAULT_FALL: u32 = 3;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    pub address: SocketAddr,
    /// Weight >= 1 (default 1).
    pub weight: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Balance {
    /// Smooth weighted round robin (the default).
    RoundRobin,
    /// The server with the fewest in-flight requests.
    LeastConnections,
    /// Two servers picked at random; the one with fewer in-flight requests wins.
    TwoRandomChoices,
    /// A hash of the client IP picks the server (sticky per client).
    HashClientIp,
    /// A hash of this request header's value picks the server. Lowercased header name.
    HashHeader(String),
    /// A hash of this cookie's value picks the server. Cookie name as written (case-sensitive).
    HashCookie(String),
}

/// Route `max_body` when not configured: 1 MiB.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 1024 * 1024;
/// `drain_timeout` when not configured.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// Upstream `keepalive` when not configured.
pub const DEFAULT_KEEPALIVE: usize = 64;
/// Upstream `connect_timeout` when not configured.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Upstream `response_header_timeout` when not configured.
pub const DEFAULT_RESPONSE_HEADER_TIMEOUT: Duration = Duration::from_secs(60);
/// Upstream `idle_timeout` when not configured.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Upstream `queue_timeout` when not configured.
pub const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(1);

impl ListenerLimits {
    /// The documented defaults of every limit.
    pub const DEFAULT: ListenerLimits = ListenerLimits {
        max_connections: 10_000,
        max_connections_per_client: 0,
        max_headers: 100,
        max_head_bytes: 64 * 1024,
        max_request_line: 8 * 1024,
        head_timeout: Duration::from_secs(10),
        keepalive_timeout: Duration::from_secs(60),
        send_timeout: Duration::from_secs(60),
        body_min_rate: 1024,
        max_requests_per_connection: 0,
    };
}

impl Default for ListenerLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl Default for StaticAction {
    /// No root, index `["index.html"]`.
    fn default() -> Self {
        StaticAction {
            root: None,
            index: vec!["index.html".to_string()],
            precompressed: Vec::new(),
        }
    }
}

impl HostMatch {
    /// Whether `host` (the request host without its port, any case, optional trailing dot) matches.
    pub fn matches(&self, host: &str) -> bool {
        let host = host.strip_suffix('.').unwrap_or(host);
        match self {
            HostMatch::Exact(name) => host.eq_ignore_ascii_case(name),
            HostMatch::Suffix(suffix) => {
                host.len() > suffix.len()
                    && host
                        .get(host.len() - suffix.len()..)
                        .is_some_and(|tail| tail.eq_ignore_ascii_case(suffix))
            }
        }
    }
}

/// A compiled `path_regex` (compared by its source text).
#[derive(Debug, Clone)]
pub struct PathRegex(pub regex::Regex);

impl PartialEq for PathRegex {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_str() == other.0.as_str()
    }
}

impl Eq for PathRegex {}

impl PathMatch {
    /// Whether the request path (the target up to `?`, as received: no decoding, no
    /// normalization) matches. `Prefix("/api/")` matches "/api", "/api/", "/api/x", not "/apix".
    pub fn matches(&self, path: &str) -> bool {
        match self {
            PathMatch::Exact(exact) => path == exact,
            PathMatch::Regex(re) => re.0.is_match(path),
            PathMatch::Prefix(prefix) => {
                path.starts_with(prefix.as_str())
                    || prefix
                        .strip_suffix('/')
                        .is_some_and(|bare| !bare.is_empty() && path == bare)
            }
        }
    }
}

impl Route {
    /// The request target to send upstream for a client `target` ("/path?query") that matched
    /// this route: for a proxy action, `strip_prefix` removed (a leading '/' kept) or the matched
    /// prefix replaced by `rewrite_prefix`; the query is kept. Otherwise the target unchanged.
    pub fn upstream_target<'a>(&self, target: &'a str) -> Cow<'a, str> {
        let Action::Proxy(proxy) = &self.action else {
            return Cow::Borrowed(target);
        };
        // Most routes change nothing: answer before searching the target.
        if proxy.strip_prefix.is_none() && proxy.rewrite_prefix.is_none() {
            return Cow::Borrowed(target);
        }
        let (path, query) = match target.find('?') {
            Some(at) => target.split_at(at),
            None => (target, ""),
        };
        let rewritten = if proxy.rewrite.is_some() {
            // Rendered with the request's variables by the proxy, not here.
            return Cow::Borrowed(target);
        } else if let Some(strip) = &proxy.strip_prefix {
            match path.strip_prefix(strip.as_str()) {
                Some("") => "/".to_string(),
                Some(rest) if rest.starts_with('/') => rest.to_string(),
                _ => return Cow::Borrowed(target),
            }
        } else if let (Some(to), Some(PathMatch::Prefix(from))) =
            (&proxy.rewrite_prefix, &self.matcher.path)
        {
            if let Some(rest) = path.strip_prefix(from.as_str()) {
                format!("{to}{rest}")
            } else if from.strip_suffix('/') == Some(path) {
                // the bare prefix: "/api" with "/api/" -> "/v2/" becomes "/v2"
                match to.strip_suffix('/') {
                    Some("") | None => "/".to_string(),
                    Some(bare) => bare.to_string(),
                }
            } else {
                return Cow::Borrowed(target);
            }
        } else {
            return Cow::Borrowed(target);
        };
        Cow::Owned(rewritten + query)
    }
}
