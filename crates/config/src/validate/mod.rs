//! Raw model -> typed `Config`: every rule, each error with its position and dotted key.

mod access;
mod auth;
mod cache;
mod compression;
mod cors;
mod discovery;
mod fleet;
mod jwt;
mod listeners;
mod logging;
mod routes;
mod tls;
mod upstreams;

use access::*;
use auth::*;
use cache::*;
use compression::*;
use cors::*;
use jwt::*;
use listeners::*;
pub use logging::filter_error as log_filter_error;
use logging::*;
use routes::*;
use tls::*;
use upstreams::*;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use toml::Spanned;

use crate::error::{quote_key, ConfigError, ConfigErrors};
use crate::model::{
    AccessLog, AccessLogFormat, Action, Admin, Balance, BasicAuth, CertificateFiles, ClientAuth,
    Compression, Config, Congestion, HeaderRules, HealthCheck, HealthCheckKind, HostMatch,
    Http2Settings, Http3Settings, HttpCheck, IpRules, Listener, ListenerLimits, Matcher, Mirror,
    PassiveCheck, PathMatch, PathRegex, ProxyAction, RateLimit, RateLimitKey, RequestBuffer,
    RetryOn, RetryPolicy, Route, Server, Shed, Split, SplitKey, StaticAction, StickyCookie,
    TlsSettings, TlsVersion, UpstreamGroup, UpstreamProtocol, UpstreamTls, CIPHER_SUITES,
    DEFAULT_BUFFER_MEMORY, DEFAULT_CHECK_INTERVAL, DEFAULT_CHECK_TIMEOUT, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_DRAIN_TIMEOUT, DEFAULT_FALL, DEFAULT_IDLE_TIMEOUT, DEFAULT_KEEPALIVE,
    DEFAULT_MAX_BODY_BYTES, DEFAULT_QUEUE_TIMEOUT, DEFAULT_RATE_LIMIT_KEYS,
    DEFAULT_RESPONSE_HEADER_TIMEOUT, DEFAULT_RETRY_BUDGET, DEFAULT_RETRY_MIN_PER_SECOND,
    DEFAULT_RISE, DEFAULT_SESSION_CACHE, DEFAULT_UPSTREAM_SESSION_CACHE, DEFAULT_WATCH_INTERVAL,
    KX_GROUPS,
};
use crate::raw::{
    Entries, Int, RawAccessLog, RawAdmin, RawBalance, RawBufferRequest, RawConfig, RawHeaderRules,
    RawHealthCheck, RawHttp2, RawHttp3, RawLimits, RawListener, RawPassive, RawRateLimit,
    RawRespond, RawRetry, RawRoute, RawShed, RawSplit, RawSticky, RawTls, RawUpstream,
    RawUpstreamTls, Scalar, ServerSpec, StrList, StrOrBool,
};
use crate::template::{Captures, Template};
use crate::units::{format_size, parse_duration, parse_size, DURATION_UNITS};

/// Most worker threads accepted.
const MAX_WORKERS: i64 = 1024;
/// Largest `max_head_bytes` / `max_request_line` accepted: 1 MiB.
const MAX_HEAD_LIMIT: u64 = 1 << 20;
/// Largest TLS `session_cache` (entries).
const MAX_SESSION_CACHE: i64 = 10_000_000;
/// Largest server `weight`.
const MAX_WEIGHT: i64 = 1000;
/// Largest upstream `queue` (waiting requests per group).
const MAX_QUEUE: i64 = 1_000_000;
/// Status codes `redirect_status` accepts.
const REDIRECT_STATUSES: [u16; 5] = [301, 302, 303, 307, 308];
/// Headers header rules may not touch: message framing and hop-by-hop headers the proxy manages.
const MANAGED_HEADERS: [&str; 8] = [
    "connection",
    "content-length",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];
const DEFAULT_CONTENT_TYPE: &str = "text/plain; charset=utf-8";
const ACTIONS: &str = "proxy, static, origin, redirect, respond";

struct Ctx<'a> {
    file: &'a str,
    text: &'a str,
    errors: Vec<ConfigError>,
    /// The document has a `[fleet]` table (fleet rate limits may count through it).
    fleet: bool,
    /// The `[etcd]` table, for groups' etcd discovery.
    etcd: crate::model::EtcdClient,
}

impl Ctx<'_> {
    fn error(&mut self, at: usize, key: &str, message: impl Into<String>) {
        self.errors
            .push(ConfigError::at(self.file, self.text, at, key, message));
    }
}

/// `parent.key`, quoting the key when it is not a bare TOML key.
fn sub(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        quote_key(key)
    } else {
        format!("{parent}.{}", quote_key(key))
    }
}

fn start<T>(value: &Spanned<T>) -> usize {
    value.span().start
}

/// Turns the raw model into a `Config`, or every error found (sorted by position).
pub(crate) fn validate(raw: RawConfig, file: &str, text: &str) -> Result<Config, ConfigErrors> {
    let mut ctx = Ctx {
        file,
        text,
        errors: Vec::new(),
        fleet: false,
        etcd: Default::default(),
    };

    let workers = raw.workers.as_ref().and_then(|w| {
        let value = int(&mut ctx, Some(w), "workers", 1, 1, MAX_WORKERS);
        u32::try_from(value).ok().and_then(NonZeroU32::new)
    });
    let drain_timeout = duration(
        &mut ctx,
        raw.drain_timeout.as_ref(),
        "drain_timeout",
        DEFAULT_DRAIN_TIMEOUT,
        true,
    );
    let access_log = raw.access_log.as_ref().map(|a| access_log(&mut ctx, a));
    let log = raw
        .log
        .as_ref()
        .map(|l| log(&mut ctx, l))
        .unwrap_or_default();
    let request_id = raw.request_id.as_ref().map(|r| request_id(&mut ctx, r));
    let trace = raw.trace.as_ref().map(|t| trace(&mut ctx, t));
    let resolver = discovery::resolver(&mut ctx, raw.resolver.as_ref());
    let fleet = raw.fleet.as_ref().and_then(|f| fleet::fleet(&mut ctx, f));
    ctx.fleet = fleet.is_some();
    let etcd = raw
        .etcd
        .as_ref()
        .map(|e| discovery::etcd_client(&mut ctx, e))
        .unwrap_or_default();
    ctx.etcd = etcd.clone();
    let upstreams = upstreams(&mut ctx, raw.upstreams.as_ref());
    let names: Vec<String> = upstreams.iter().map(|u| u.name.clone()).collect();
    let listeners = listeners(&mut ctx, raw.listeners.as_ref(), &names);
    let caching = listeners
        .iter()
        .flat_map(|l| &l.routes)
        .any(|r| matches!(&r.action, Action::Proxy(p) if p.cache.is_some()));
    let cache = cache_store(&mut ctx, raw.cache.as_ref(), caching);
    let admin = raw
        .admin
        .as_ref()
        .and_then(|a| admin(&mut ctx, a, &listeners));

    if ctx.errors.is_empty() {
        Ok(Config {
            listeners,
            upstreams,
            access_log,
            log,
            request_id,
            trace,
            cache,
            admin,
            drain_timeout,
            workers,
            resolver,
            fleet,
            etcd,
        })
    } else {
        let mut errors = ctx.errors;
        errors.sort_by_key(|e| (e.line, e.col));
        Err(ConfigErrors { errors })
    }
}

// ---------------------------------------------------------------------------------------------
// scalars

/// The key of item `i` of a string-or-list value: the value's own key when it is one string.
fn item_key(list: &Spanned<StrList>, key: &str, i: usize) -> String {
    match list.get_ref() {
        StrList::One(_) => key.to_string(),
        StrList::Many(_) => format!("{key}[{i}]"),
    }
}

/// An integer in `min..=max` (default when absent).
fn int(
    ctx: &mut Ctx<'_>,
    value: Option<&Spanned<Int>>,
    key: &str,
    default: i64,
    min: i64,
    max: i64,
) -> i64 {
    let Some(value) = value else { return default };
    let n = value.get_ref().0;
    if n < min {
        let message = match min {
            0 => format!("must not be negative, found {n}"),
            1 => format!("must be at least 1, found {n}"),
            _ => format!("must be at least {min}, found {n}"),
        };
        ctx.error(start(value), key, message);
        default
    } else if n > max {
        ctx.error(
            start(value),
            key,
            format!("must be at most {max}, found {n}"),
        );
        default
    } else {
        n
    }
}

/// A duration string; `allow_zero` = false rejects "0s".
fn duration(
    ctx: &mut Ctx<'_>,
    value: Option<&Spanned<Scalar>>,
    key: &str,
    default: Duration,
    allow_zero: bool,
) -> Duration {
    let Some(value) = value else { return default };
    let parsed = match value.get_ref() {
        Scalar::Str(text) => parse_duration(text),
        Scalar::Int(n) => Err(format!(
            "expected a duration string such as \"{n}s\" (units: {DURATION_UNITS}), found the integer {n}"
        )),
        Scalar::Float => Err(format!(
            "expected a duration string such as \"1500ms\" (whole numbers; units: {DURATION_UNITS}), found a float"
        )),
        Scalar::Bool => Err(format!(
            "expected a duration string such as \"10s\" (units: {DURATION_UNITS}), found a boolean"
        )),
    };
    match parsed {
        Ok(d) if d.is_zero() && !allow_zero => {
            ctx.error(start(value), key, "must be greater than zero");
            default
        }
        Ok(d) => d,
        Err(message) => {
            ctx.error(start(value), key, message);
            default
        }
    }
}

/// A size (integer bytes or a suffixed string) in `min..=max`.
fn size(
    ctx: &mut Ctx<'_>,
    value: Option<&Spanned<Scalar>>,
    key: &str,
    default: u64,
    min: u64,
    max: u64,
) -> u64 {
    let Some(value) = value else { return default };
    let parsed = match value.get_ref() {
        Scalar::Str(text) => parse_size(text),
        Scalar::Int(n) => u64::try_from(*n).map_err(|_| format!("must not be negative, found {n}")),
        Scalar::Float => {
            Err("sizes are whole bytes: write an integer or a string such as \"64k\"".to_string())
        }
        Scalar::Bool => Err(
            "expected a size: integer bytes or a string such as \"64k\" or \"1MiB\", found a boolean"
                .to_string(),
        ),
    };
    let message = match parsed {
        Ok(n) if n < min => format!("must be at least {min} bytes"),
        Ok(n) if n > max => format!("must be at most {} ({max} bytes)", format_size(max)),
        Ok(n) => return n,
        Err(message) => message,
    };
    ctx.error(start(value), key, message);
    default
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// `IP:port`, `[v6]:port` or `localhost:port` (= 127.0.0.1).
pub(crate) fn parse_address(text: &str, allow_port_zero: bool) -> Result<SocketAddr, String> {
    let addr = match text.parse::<SocketAddr>() {
        Ok(addr) => addr,
        Err(_) => {
            match text.parse::<IpAddr>() {
                Ok(IpAddr::V4(_)) => {
                    return Err(format!("address {text:?} has no port; write it as IP:port"))
                }
                Ok(IpAddr::V6(_)) => {
                    return Err(format!(
                        "address {text:?} has no port; write IPv6 addresses in brackets: \"[{text}]:port\""
                    ))
                }
                Err(_) => {}
            }
            let Some((host, port)) = text.rsplit_once(':') else {
                return Err(format!(
                    "invalid address {text:?}: expected IP:port, e.g. \"127.0.0.1:8080\" or \"[::1]:8080\""
                ));
            };
            let Ok(port) = port.parse::<u16>() else {
                return Err(format!(
                    "invalid port {port:?} in {text:?}: expected 0-65535"
                ));
            };
            if host.eq_ignore_ascii_case("localhost") {
                SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)
            } else if host.parse::<std::net::Ipv6Addr>().is_ok() {
                return Err(format!("IPv6 addresses need brackets: \"[{host}]:{port}\""));
            } else if host.starts_with('[') {
                return Err(format!("invalid IPv6 address in {text:?}"));
            } else if host.is_empty() {
                return Err(format!(
                    "invalid address {text:?}: the IP is missing (use \"0.0.0.0:{port}\" for all interfaces)"
                ));
            } else {
                return Err(format!(
                    "invalid address {text:?}: host names other than localhost are not resolved; use an IP address"
                ));
            }
        }
    };
    if addr.port() == 0 && !allow_port_zero {
        return Err(format!(
            "invalid address {text:?}: port 0 is not allowed here"
        ));
    }
    Ok(addr)
}

/// RFC 9110 `tchar`.
fn is_tchar(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
}

fn is_token(text: &str) -> bool {
    !text.is_empty() && text.chars().all(is_tchar)
}

fn header_name_error(name: &str) -> Option<String> {
    if name.is_empty() {
        Some("header name must not be empty".to_string())
    } else if !is_token(name) {
        Some(format!(
            "invalid header name {name:?}: only letters, digits and !#$%&'*+-.^_`|~ are allowed"
        ))
    } else {
        None
    }
}

fn header_value_error(value: &str) -> Option<String> {
    if value.contains(['\r', '\n', '\0']) {
        Some(format!(
            "invalid header value {value:?}: CR, LF and NUL are not allowed"
        ))
    } else if value
        .chars()
        .any(|c| (c.is_control() && c != '\t') || c == '\u{7f}')
    {
        Some(format!(
            "invalid header value {value:?}: control characters are not allowed"
        ))
    } else if value.starts_with([' ', '\t']) || value.ends_with([' ', '\t']) {
        Some(format!(
            "invalid header value {value:?}: leading or trailing whitespace is not allowed"
        ))
    } else {
        None
    }
}

/// A non-empty string without control characters (names, paths).
fn plain_text_error(text: &str, what: &str) -> Option<String> {
    if text.is_empty() {
        Some(format!("{what} must not be empty"))
    } else if text.chars().any(char::is_control) {
        Some(format!(
            "{what} {text:?} must not contain control characters"
        ))
    } else {
        None
    }
}

// ---------------------------------------------------------------------------------------------
// access log

fn access_log(ctx: &mut Ctx<'_>, raw: &RawAccessLog) -> AccessLog {
    let path = raw
        .path
        .as_ref()
        .and_then(|p| match plain_text_error(p.get_ref(), "path") {
            Some(message) => {
                ctx.error(start(p), "access_log.path", message);
                None
            }
            None => Some(relative_to_config(ctx.file, p.get_ref())),
        });
    let format = match raw.format.as_ref() {
        None => AccessLogFormat::Combined,
        Some(f) => {
            match f.get_ref().as_str() {
                "combined" => AccessLogFormat::Combined,
                "json" => AccessLogFormat::Json,
                other => {
                    ctx.error(
                    start(f),
                    "access_log.format",
                    format!("unknown access log format {other:?}; expected \"combined\" or \"json\""),
                );
                    AccessLogFormat::Combined
                }
            }
        }
    };
    AccessLog { path, format }
}

// ---------------------------------------------------------------------------------------------
// admin

fn admin(ctx: &mut Ctx<'_>, raw: &Spanned<RawAdmin>, listeners: &[Listener]) -> Option<Admin> {
    let a = raw.get_ref();
    let Some(addr_raw) = &a.address else {
        ctx.error(
            start(raw),
            "admin",
            "admin needs an `address`, e.g. address = \"127.0.0.1:9901\"",
        );
        return None;
    };
    let address = match parse_address(addr_raw.get_ref(), true) {
        Ok(addr) => addr,
        Err(message) => {
            ctx.error(start(addr_raw), "admin.address", message);
            return None;
        }
    };
    if let Some(l) = listeners.iter().find(|l| conflicts(l.address, address)) {
        ctx.error(
            start(addr_raw),
            "admin.address",
            format!(
                "address {address} overlaps listener {:?} on {}",
                l.name, l.address
            ),
        );
    }
    let token = match &a.token {
        None => None,
        Some(t)
            if t.get_ref().is_empty()
                || t.get_ref().bytes().any(|b| !(0x21..0x7f).contains(&b)) =>
        {
            ctx.error(
                start(t),
                "admin.token",
                "the token must be non-empty printable ASCII without spaces",
            );
            None
        }
        Some(t) => Some(t.get_ref().clone()),
    };
    if token.is_none() && a.token.is_none() && !address.ip().is_loopback() {
        ctx.error(
            start(addr_raw),
            "admin.address",
            format!("the admin listener on non-loopback {address} needs a `token`: anyone who reaches it could change the proxy"),
        );
    }
    let state_file =
        a.state_file
            .as_ref()
            .and_then(|p| match plain_text_error(p.get_ref(), "path") {
                Some(message) => {
                    ctx.error(start(p), "admin.state_file", message);
                    None
                }
                None => Some(relative_to_config(ctx.file, p.get_ref())),
            });
    Some(Admin {
        address,
        token,
        state_file,
    })
}

// ---------------------------------------------------------------------------------------------
// upstreams
