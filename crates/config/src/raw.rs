//! The raw serde model of the TOML file: spans kept on every value a message may point at.

// Tables are never wrapped in `Spanned` (a dotted-key table such as `limits.max_headers = 1` has
// no span and `Spanned` fails on it), except elements of arrays, which always have one.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use toml::Spanned;

/// The whole file.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a configuration table")]
pub(crate) struct RawConfig {
    pub workers: Option<Spanned<Int>>,
    pub drain_timeout: Option<Spanned<Scalar>>,
    pub access_log: Option<RawAccessLog>,
    pub log: Option<RawLog>,
    pub request_id: Option<RawRequestId>,
    pub trace: Option<RawTrace>,
    pub cache: Option<RawCache>,
    pub admin: Option<Spanned<RawAdmin>>,
    pub listeners: Option<Spanned<Vec<Spanned<RawListener>>>>,
    pub upstreams: Option<Entries<RawUpstream>>,
    pub resolver: Option<Spanned<RawResolver>>,
    pub fleet: Option<Spanned<RawFleet>>,
    pub etcd: Option<Spanned<RawEtcd>>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a fleet table")]
pub(crate) struct RawFleet {
    pub redis: Option<Spanned<String>>,
    pub instances: Option<Spanned<Int>>,
    pub sync_interval: Option<Spanned<Scalar>>,
    pub on_redis_down: Option<Spanned<String>>,
    pub prefix: Option<Spanned<String>>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a resolver table")]
pub(crate) struct RawResolver {
    pub nameservers: Option<Spanned<Vec<Spanned<String>>>>,
    pub timeout: Option<Spanned<Scalar>>,
    pub min_ttl: Option<Spanned<Scalar>>,
    pub max_ttl: Option<Spanned<Scalar>>,
    pub hold: Option<Spanned<Scalar>>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "an etcd table")]
pub(crate) struct RawEtcd {
    pub ca_file: Option<Spanned<String>>,
    pub certificate: Option<RawCertificate>,
    pub username: Option<Spanned<String>>,
    pub password_file: Option<Spanned<String>>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a discovery table")]
pub(crate) struct RawDiscovery {
    pub dns: Option<Spanned<String>>,
    pub srv: Option<Spanned<String>>,
    pub etcd: Option<Spanned<String>>,
    pub interval: Option<Spanned<Scalar>>,
    pub family: Option<Spanned<String>>,
    pub weight: Option<Spanned<Int>>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "an access_log table")]
pub(crate) struct RawAccessLog {
    pub path: Option<Spanned<String>>,
    pub format: Option<Spanned<String>>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a log table")]
pub(crate) struct RawLog {
    pub level: Option<Spanned<String>>,
    pub format: Option<Spanned<String>>,
    pub path: Option<Spanned<String>>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a request_id table")]
pub(crate) struct RawRequestId {
    pub header: Option<Spanned<String>>,
    pub from_client: Option<Spanned<bool>>,
    pub response: Option<Spanned<bool>>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a trace table")]
pub(crate) struct RawTrace {
    pub sample_percent: Option<Spanned<Number>>,
    pub otlp_endpoint: Option<Spanned<String>>,
    pub otlp_headers: Option<Entries<Spanned<String>>>,
    pub service_name: Option<Spanned<String>>,
}

/// `[cache]`: the response cache's store.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a cache table")]
pub(crate) struct RawCache {
    pub memory: Option<Spanned<Scalar>>,
    pub max_object: Option<Spanned<Scalar>>,
    pub lock_timeout: Option<Spanned<Scalar>>,
    pub tag_header: Option<Spanned<String>>,
    pub disk_path: Option<Spanned<String>>,
    pub disk_size: Option<Spanned<Scalar>>,
}

/// A route's `cache` table.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a cache table")]
pub(crate) struct RawRouteCache {
    pub enabled: Option<Spanned<bool>>,
    pub query: Option<Spanned<String>>,
    pub query_only: Option<Spanned<StrList>>,
    pub query_except: Option<Spanned<StrList>>,
    pub key_headers: Option<Spanned<StrList>>,
    pub key_cookies: Option<Spanned<StrList>>,
    pub default_ttl: Option<Spanned<Scalar>>,
    pub override_ttl: Option<Spanned<Scalar>>,
    pub stale_if_error: Option<Spanned<Scalar>>,
    pub stale_while_revalidate: Option<Spanned<Scalar>>,
    pub bypass_headers: Option<Spanned<StrList>>,
    pub bypass_cookies: Option<Spanned<StrList>>,
    pub lock: Option<Spanned<bool>>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "an admin table")]
pub(crate) struct RawAdmin {
    pub address: Option<Spanned<String>>,
    pub token: Option<Spanned<String>>,
    pub state_file: Option<Spanned<String>>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a listener table")]
pub(crate) struct RawListener {
    pub name: Option<Spanned<String>>,
    pub address: Option<Spanned<String>>,
    pub limits: Option<RawLimits>,
    /// Not spanned: `[listeners.tls.acme]` alone makes the table implicitly, and an implicit
    /// table has no span.
    pub tls: Option<RawTls>,
    pub routes: Option<Spanned<Vec<Spanned<RawRoute>>>>,
    pub http2: Option<RawHttp2>,
    pub http3: Option<Spanned<RawHttp3>>,
    pub shed: Option<RawShed>,
    pub compression: Option<RawCompression>,
    pub ip_rules: Option<Spanned<StrList>>,
    pub trusted_proxies: Option<Spanned<StrList>>,
    pub proxy_protocol: Option<Spanned<bool>>,
    pub basic_auth: Option<Spanned<RawBasicAuth>>,
    pub jwt: Option<Spanned<RawJwt>>,
    pub client_cert: Option<Spanned<RawClientCert>>,
}

/// `client_cert = { subject = "CN=*,O=Example", san = ["DNS:*.svc"], issuer = "..." }`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a client_cert table")]
pub(crate) struct RawClientCert {
    pub subject: Option<Spanned<StrList>>,
    pub san: Option<Spanned<StrList>>,
    pub issuer: Option<Spanned<StrList>>,
}

/// `jwt = { jwks = "FILE" | jwks_url = "https://...", issuer = "...", audience = "...", ... }`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a jwt table")]
pub(crate) struct RawJwt {
    pub jwks: Option<Spanned<String>>,
    pub jwks_url: Option<Spanned<String>>,
    pub refresh: Option<Spanned<Scalar>>,
    pub algorithms: Option<Spanned<StrList>>,
    pub issuer: Option<Spanned<StrList>>,
    pub audience: Option<Spanned<StrList>>,
    pub leeway: Option<Spanned<Scalar>>,
    pub header: Option<Spanned<String>>,
    pub cookie: Option<Spanned<String>>,
    pub query: Option<Spanned<String>>,
    pub require: Option<Spanned<StrList>>,
    pub claims: Option<Entries<Spanned<StrList>>>,
    pub forward_claims: Option<Entries<Spanned<String>>>,
    pub keep_token: Option<Spanned<bool>>,
    pub realm: Option<Spanned<String>>,
}

/// `basic_auth = { realm = "...", users = { alice = "$2y$..." }, htpasswd = "FILE" }`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a basic_auth table")]
pub(crate) struct RawBasicAuth {
    pub realm: Option<Spanned<String>>,
    pub users: Option<Entries<Spanned<String>>>,
    pub htpasswd: Option<Spanned<String>>,
    pub keep_authorization: Option<Spanned<bool>>,
    pub lockout: Option<Spanned<RawLockout>>,
}

/// `lockout = { failures = 5, window = "1m" }`.
#[derive(Debug, serde::Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a lockout table { failures = N, window = \"1m\" }"
)]
pub(crate) struct RawLockout {
    pub failures: Option<Spanned<Int>>,
    pub window: Option<Spanned<Scalar>>,
}

/// `[listeners.compression]` and `[listeners.routes.compression]`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a compression table")]
pub(crate) struct RawCompression {
    pub enabled: Option<Spanned<bool>>,
    pub algorithms: Option<Spanned<StrList>>,
    pub min_length: Option<Spanned<Scalar>>,
    pub types: Option<Spanned<StrList>>,
    pub gzip_level: Option<Spanned<Int>>,
    pub brotli_level: Option<Spanned<Int>>,
    pub zstd_level: Option<Spanned<Int>>,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a shed table { target = \"20ms\", interval = \"100ms\" }"
)]
pub(crate) struct RawShed {
    pub target: Option<Spanned<Scalar>>,
    pub interval: Option<Spanned<Scalar>>,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "an http2 table")]
pub(crate) struct RawHttp2 {
    pub enabled: Option<Spanned<bool>>,
    pub max_concurrent_streams: Option<Spanned<Int>>,
    pub max_header_list_size: Option<Spanned<Scalar>>,
    pub initial_window_size: Option<Spanned<Scalar>>,
    pub max_frame_size: Option<Spanned<Scalar>>,
    pub max_resets: Option<Spanned<Int>>,
    pub reset_window: Option<Spanned<Scalar>>,
    pub extended_connect: Option<Spanned<bool>>,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "an http3 table")]
pub(crate) struct RawHttp3 {
    pub enabled: Option<Spanned<bool>>,
    pub idle_timeout: Option<Spanned<Scalar>>,
    pub max_concurrent_streams: Option<Spanned<Int>>,
    pub stream_window: Option<Spanned<Scalar>>,
    pub connection_window: Option<Spanned<Scalar>>,
    pub max_udp_payload: Option<Spanned<Scalar>>,
    pub congestion: Option<Spanned<String>>,
    pub keep_alive_interval: Option<Spanned<Scalar>>,
    pub max_header_list_size: Option<Spanned<Scalar>>,
    pub validate_above: Option<Spanned<Int>>,
    pub alt_svc_max_age: Option<Spanned<Scalar>>,
    pub max_resets: Option<Spanned<Int>>,
    pub reset_window: Option<Spanned<Scalar>>,
    pub early_data: Option<Spanned<bool>>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a tls table")]
pub(crate) struct RawTls {
    pub certificates: Option<Spanned<Vec<Spanned<RawCertificate>>>>,
    pub acme: Option<Spanned<RawAcme>>,
    pub versions: Option<Spanned<StrList>>,
    pub cipher_suites: Option<Spanned<StrList>>,
    pub groups: Option<Spanned<StrList>>,
    pub session_tickets: Option<Spanned<bool>>,
    pub session_cache: Option<Spanned<Int>>,
    pub client_auth: Option<RawClientAuth>,
    pub watch: Option<Spanned<bool>>,
    pub watch_interval: Option<Spanned<Scalar>>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "an acme table")]
pub(crate) struct RawAcme {
    pub names: Option<Spanned<StrList>>,
    pub email: Option<Spanned<String>>,
    pub directory: Option<Spanned<String>>,
    pub directory_ca: Option<Spanned<String>>,
    pub storage: Option<Spanned<String>>,
    pub accept_terms: Option<Spanned<bool>>,
    pub challenge: Option<Spanned<String>>,
    pub dns_hook: Option<Spanned<String>>,
    pub dns_delay: Option<Spanned<Scalar>>,
    pub key_type: Option<Spanned<String>>,
    pub profile: Option<Spanned<String>>,
    pub unissued: Option<Spanned<String>>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a client_auth table { ca = \"ca.pem\", required = true }"
)]
pub(crate) struct RawClientAuth {
    pub ca: Option<Spanned<String>>,
    pub required: Option<Spanned<bool>>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a certificate table { cert = \"...\", key = \"...\" }"
)]
pub(crate) struct RawCertificate {
    pub cert: Option<Spanned<String>>,
    pub key: Option<Spanned<String>>,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a limits table")]
pub(crate) struct RawLimits {
    pub max_connections: Option<Spanned<Int>>,
    pub max_connections_per_client: Option<Spanned<Int>>,
    pub max_headers: Option<Spanned<Int>>,
    pub max_head_bytes: Option<Spanned<Scalar>>,
    pub max_request_line: Option<Spanned<Scalar>>,
    pub head_timeout: Option<Spanned<Scalar>>,
    pub keepalive_timeout: Option<Spanned<Scalar>>,
    pub send_timeout: Option<Spanned<Scalar>>,
    pub body_min_rate: Option<Spanned<Scalar>>,
    pub max_requests_per_connection: Option<Spanned<Int>>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a route table")]
pub(crate) struct RawRoute {
    pub name: Option<Spanned<String>>,
    // matchers
    pub host: Option<Spanned<StrList>>,
    pub path: Option<Spanned<String>>,
    pub path_regex: Option<Spanned<String>>,
    pub methods: Option<Spanned<StrList>>,
    pub headers: Option<Entries<Spanned<String>>>,
    pub max_body: Option<Spanned<Scalar>>,
    // actions (exactly one)
    pub proxy: Option<Spanned<String>>,
    #[serde(rename = "static")]
    pub static_root: Option<Spanned<String>>,
    pub origin: Option<Spanned<StrOrBool>>,
    pub redirect: Option<Spanned<String>>,
    pub respond: Option<RawRespond>,
    // proxy options
    pub strip_prefix: Option<Spanned<StrOrBool>>,
    pub rewrite_prefix: Option<Spanned<String>>,
    pub rewrite: Option<Spanned<String>>,
    pub forwarded_headers: Option<Spanned<bool>>,
    pub via: Option<Spanned<bool>>,
    pub preserve_host: Option<Spanned<bool>>,
    // static / origin options
    pub index: Option<Spanned<StrList>>,
    pub precompressed: Option<Spanned<StrList>>,
    // redirect options
    pub redirect_status: Option<Spanned<Int>>,
    // header rules
    pub request_headers: Option<RawHeaderRules>,
    pub response_headers: Option<RawHeaderRules>,
    // resilience
    pub retry: Option<RawRetry>,
    pub rate_limit: Option<RawRateLimit>,
    pub compression: Option<RawCompression>,
    pub cache: Option<Spanned<RawRouteCache>>,
    pub cors: Option<RawCors>,
    pub buffer_request: Option<RawBufferRequest>,
    pub split: Option<Spanned<Vec<Spanned<RawSplit>>>>,
    pub split_key: Option<Spanned<String>>,
    pub mirror: Option<Spanned<RawMirror>>,
    pub ip_rules: Option<Spanned<StrList>>,
    pub basic_auth: Option<Spanned<RawBasicAuth>>,
    pub forward_auth: Option<Spanned<RawForwardAuth>>,
    pub jwt: Option<Spanned<RawJwt>>,
    pub client_cert: Option<Spanned<RawClientCert>>,
}

/// `forward_auth = { group = "auth", path = "/verify", ... }`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a forward_auth table")]
pub(crate) struct RawForwardAuth {
    pub group: Option<Spanned<String>>,
    pub path: Option<Spanned<String>>,
    pub request_headers: Option<Spanned<StrList>>,
    pub copy_headers: Option<Spanned<StrList>>,
    pub cache: Option<Spanned<Scalar>>,
    pub fail_open: Option<Spanned<bool>>,
}

/// A route's `mirror`: `{ group = "shadow", percent = 10 }`.
#[derive(Debug, serde::Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mirror table { group = \"NAME\", percent = N }"
)]
pub(crate) struct RawMirror {
    pub group: Option<Spanned<String>>,
    pub percent: Option<Spanned<Number>>,
}

/// One share of a route's `split`: `{ group = "canary", percent = 5 }`.
#[derive(Debug, serde::Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a split share { group = \"NAME\", percent = N }"
)]
pub(crate) struct RawSplit {
    pub group: Option<Spanned<String>>,
    pub percent: Option<Spanned<Number>>,
}

/// `[listeners.routes.buffer_request]`: read the whole request body before contacting a server.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a buffer_request table")]
pub(crate) struct RawBufferRequest {
    pub memory: Option<Spanned<Scalar>>,
    pub directory: Option<Spanned<String>>,
}

/// `[listeners.routes.cors]`: the cross-origin policy of a proxy route.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a cors table")]
pub(crate) struct RawCors {
    pub allow_origins: Option<Spanned<StrList>>,
    pub allow_methods: Option<Spanned<StrList>>,
    pub allow_headers: Option<Spanned<StrList>>,
    pub expose_headers: Option<Spanned<StrList>>,
    pub allow_credentials: Option<Spanned<bool>>,
    pub max_age: Option<Spanned<Scalar>>,
}

/// `[listeners.routes.rate_limit]`: a token bucket per client IP, header value or cookie value.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a rate_limit table")]
pub(crate) struct RawRateLimit {
    pub rate: Option<Spanned<Number>>,
    pub burst: Option<Spanned<Int>>,
    pub header: Option<Spanned<String>>,
    pub cookie: Option<Spanned<String>>,
    pub max_keys: Option<Spanned<Int>>,
    pub scope: Option<Spanned<String>>,
}

/// `[listeners.routes.retry]`: retries of failed proxied requests.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a retry table")]
pub(crate) struct RawRetry {
    pub retries: Option<Spanned<Int>>,
    pub on: Option<Spanned<StrList>>,
    pub non_idempotent: Option<Spanned<bool>>,
    pub budget: Option<Spanned<Number>>,
    pub min_per_second: Option<Spanned<Int>>,
}

/// An integer or a float (`budget = 0.2`, `budget = 1`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Number(pub f64);

impl<'de> Deserialize<'de> for Number {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Number;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Number, E> {
                Ok(Number(v as f64))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Number, E> {
                Ok(Number(v as f64))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Number, E> {
                Ok(Number(v))
            }
        }
        deserializer.deserialize_any(V)
    }
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = r#"a respond table such as { status = 200, body = "ok" }"#
)]
pub(crate) struct RawRespond {
    pub status: Option<Spanned<Int>>,
    pub body: Option<Spanned<String>>,
    pub content_type: Option<Spanned<String>>,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a header rules table with remove, set and add"
)]
pub(crate) struct RawHeaderRules {
    pub remove: Option<Spanned<StrList>>,
    pub set: Option<Entries<Spanned<String>>>,
    pub add: Option<Entries<Spanned<String>>>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "an upstream group table")]
pub(crate) struct RawUpstream {
    pub servers: Option<Spanned<Vec<Spanned<ServerSpec>>>>,
    pub balance: Option<RawBalance>,
    pub keepalive: Option<Spanned<Int>>,
    pub max_connections_per_server: Option<Spanned<Int>>,
    pub connect_timeout: Option<Spanned<Scalar>>,
    pub response_header_timeout: Option<Spanned<Scalar>>,
    pub idle_timeout: Option<Spanned<Scalar>>,
    pub health_check: Option<RawHealthCheck>,
    pub passive: Option<RawPassive>,
    pub fallback: Option<Spanned<String>>,
    pub tls: Option<RawUpstreamTls>,
    pub queue: Option<Spanned<Int>>,
    pub queue_timeout: Option<Spanned<Scalar>>,
    pub sticky_cookie: Option<Spanned<RawSticky>>,
    pub protocol: Option<Spanned<String>>,
    pub discovery: Option<Spanned<RawDiscovery>>,
    pub proxy_protocol: Option<Spanned<String>>,
}

/// `sticky_cookie = "NAME"` or `sticky_cookie = { name = "NAME", path = "/", ... }`.
#[derive(Debug)]
pub(crate) enum RawSticky {
    Name(String),
    Table(RawStickyTable),
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a sticky_cookie table")]
pub(crate) struct RawStickyTable {
    pub name: Option<Spanned<String>>,
    pub path: Option<Spanned<String>>,
    pub max_age: Option<Spanned<Scalar>>,
    pub httponly: Option<Spanned<bool>>,
    pub secure: Option<Spanned<bool>>,
    pub samesite: Option<Spanned<String>>,
}

impl<'de> Deserialize<'de> for RawSticky {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawSticky;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a cookie name or { name = \"NAME\", path = \"/\", max_age = \"1h\", httponly = true, secure = true, samesite = \"lax\" }")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawSticky, E> {
                Ok(RawSticky::Name(v.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawSticky, A::Error> {
                RawStickyTable::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(RawSticky::Table)
            }
        }
        deserializer.deserialize_any(V)
    }
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "an upstream tls table")]
pub(crate) struct RawUpstreamTls {
    pub ca_file: Option<Spanned<String>>,
    pub server_name: Option<Spanned<String>>,
    pub certificate: Option<RawCertificate>,
    pub verify: Option<Spanned<bool>>,
    pub versions: Option<Spanned<StrList>>,
    pub session_cache: Option<Spanned<Int>>,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a health_check table")]
pub(crate) struct RawHealthCheck {
    #[serde(rename = "type")]
    pub kind: Option<Spanned<String>>,
    pub path: Option<Spanned<String>>,
    pub method: Option<Spanned<String>>,
    pub host: Option<Spanned<String>>,
    pub expect_status: Option<Spanned<Scalar>>,
    pub expect_body: Option<Spanned<String>>,
    pub interval: Option<Spanned<Scalar>>,
    pub timeout: Option<Spanned<Scalar>>,
    pub rise: Option<Spanned<Int>>,
    pub fall: Option<Spanned<Int>>,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a passive table")]
pub(crate) struct RawPassive {
    pub max_failures: Option<Spanned<Int>>,
    pub ejection: Option<Spanned<Scalar>>,
    pub max_ejection: Option<Spanned<Scalar>>,
    pub max_ejected_percent: Option<Spanned<Int>>,
    pub slow_start: Option<Spanned<Scalar>>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a server table")]
pub(crate) struct RawServer {
    pub address: Option<Spanned<String>>,
    pub weight: Option<Spanned<Int>>,
}

/// A server: `"IP:port"` or `{ address = "IP:port", weight = 3 }`.
#[derive(Debug)]
pub(crate) enum ServerSpec {
    Address(String),
    Table(RawServer),
}

impl<'de> Deserialize<'de> for ServerSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ServerSpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a server: \"IP:port\" or { address = \"IP:port\", weight = N }")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ServerSpec, E> {
                Ok(ServerSpec::Address(v.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ServerSpec, A::Error> {
                RawServer::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(ServerSpec::Table)
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// `balance = "round_robin"` or `balance = { hash_header = "x-user" }`.
#[derive(Debug)]
pub(crate) enum RawBalance {
    RoundRobin,
    LeastConnections,
    TwoRandomChoices,
    HashClientIp,
    HashHeader(Spanned<String>),
    HashCookie(Spanned<String>),
}

const BALANCE_EXPECTED: &str = "\"round_robin\", \"least_connections\", \"two_random_choices\", \"hash_client_ip\", { hash_header = \"name\" } or { hash_cookie = \"name\" }";

impl<'de> Deserialize<'de> for RawBalance {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawBalance;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a balancing method: {BALANCE_EXPECTED}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawBalance, E> {
                match v {
                    "round_robin" => Ok(RawBalance::RoundRobin),
                    "least_connections" => Ok(RawBalance::LeastConnections),
                    "two_random_choices" => Ok(RawBalance::TwoRandomChoices),
                    "hash_client_ip" => Ok(RawBalance::HashClientIp),
                    "hash_header" | "hash_cookie" => Err(E::custom(format!(
                        "{v} needs a name: balance = {{ {v} = \"name\" }}"
                    ))),
                    _ => Err(E::custom(format!(
                        "unknown balancing method {v:?}; expected {BALANCE_EXPECTED}"
                    ))),
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawBalance, A::Error> {
                let Some(kind) = map.next_key::<String>()? else {
                    return Err(de::Error::custom(format!(
                        "empty balance table; expected {BALANCE_EXPECTED}"
                    )));
                };
                let balance = match kind.as_str() {
                    "hash_header" => RawBalance::HashHeader(map.next_value()?),
                    "hash_cookie" => RawBalance::HashCookie(map.next_value()?),
                    _ => {
                        return Err(de::Error::custom(format!(
                            "unknown balancing method `{kind}`; a balance table is {{ hash_header = \"name\" }} or {{ hash_cookie = \"name\" }}"
                        )))
                    }
                };
                if map.next_key::<String>()?.is_some() {
                    return Err(de::Error::custom(
                        "a balance table has exactly one key: hash_header or hash_cookie",
                    ));
                }
                Ok(balance)
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A string or a list of strings (`host = "a"` or `host = ["a", "b"]`).
#[derive(Debug)]
pub(crate) enum StrList {
    One(String),
    Many(Vec<Spanned<String>>),
}

impl StrList {
    /// The items with their spans; a single string gets the span of the whole value.
    pub fn items(&self, whole_start: usize) -> Vec<(String, usize)> {
        match self {
            StrList::One(s) => vec![(s.clone(), whole_start)],
            StrList::Many(list) => list
                .iter()
                .map(|s| (s.get_ref().clone(), s.span().start))
                .collect(),
        }
    }
}

impl<'de> Deserialize<'de> for StrList {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StrList;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or a list of strings")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<StrList, E> {
                Ok(StrList::One(v.to_string()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<StrList, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element::<Spanned<String>>()? {
                    items.push(item);
                }
                Ok(StrList::Many(items))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A string or a boolean (`origin = true` / `origin = "/srv/www"`, `strip_prefix = true` / `"/api"`).
#[derive(Debug)]
pub(crate) enum StrOrBool {
    Str(String),
    Bool(bool),
}

impl<'de> Deserialize<'de> for StrOrBool {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StrOrBool;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("true, false or a string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<StrOrBool, E> {
                Ok(StrOrBool::Str(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<StrOrBool, E> {
                Ok(StrOrBool::Bool(v))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// An integer ("expected an integer" instead of serde's "expected i64").
#[derive(Debug, Clone, Copy)]
pub(crate) struct Int(pub i64);

impl<'de> Deserialize<'de> for Int {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Int;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Int, E> {
                Ok(Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Int, E> {
                i64::try_from(v)
                    .map(Int)
                    .map_err(|_| E::custom("integer out of range"))
            }
        }
        deserializer.deserialize_i64(V)
    }
}

/// A string, integer, float or boolean; durations and sizes are checked in validation so their
/// messages can say what is expected.
#[derive(Debug, Clone)]
pub(crate) enum Scalar {
    Str(String),
    Int(i64),
    Float,
    Bool,
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or a number")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar::Str(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar::Int(v))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Scalar, E> {
                Ok(Scalar::Float)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Scalar, E> {
                Ok(Scalar::Bool)
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A table read in document order, keys with their spans (`[upstreams.<name>]`, header maps).
#[derive(Debug)]
pub(crate) struct Entries<V>(pub Vec<(Spanned<String>, V)>);

impl<V> Default for Entries<V> {
    fn default() -> Self {
        Entries(Vec::new())
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for Entries<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntriesVisitor<V>(PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for EntriesVisitor<V> {
            type Value = Entries<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a table")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries<V>, A::Error> {
                let mut entries = Vec::new();
                while let Some(key) = map.next_key::<Spanned<String>>()? {
                    let value = map.next_value::<V>()?;
                    entries.push((key, value));
                }
                Ok(Entries(entries))
            }
        }
        deserializer.deserialize_map(EntriesVisitor(PhantomData))
    }
}
