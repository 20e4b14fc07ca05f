//! Raw model -> typed `Config`: every rule, each error with its position and dotted key.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use toml::Spanned;

use crate::error::{quote_key, ConfigError, ConfigErrors};
use crate::model::{
    AccessLog, AccessLogFormat, Action, Admin, Balance, CertificateFiles, ClientAuth, Config,
    HeaderRules, HealthCheck, HealthCheckKind, HostMatch, Http2Settings, HttpCheck, Listener,
    ListenerLimits, Matcher, PassiveCheck, PathMatch, ProxyAction, RateLimit, RateLimitKey,
    RetryOn, RetryPolicy, Route, Server, Shed, StaticAction, StickyCookie, TlsSettings, TlsVersion,
    UpstreamGroup, UpstreamProtocol, UpstreamTls, CIPHER_SUITES, DEFAULT_CHECK_INTERVAL,
    DEFAULT_CHECK_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_DRAIN_TIMEOUT, DEFAULT_FALL,
    DEFAULT_IDLE_TIMEOUT, DEFAULT_KEEPALIVE, DEFAULT_MAX_BODY_BYTES, DEFAULT_QUEUE_TIMEOUT,
    DEFAULT_RATE_LIMIT_KEYS, DEFAULT_RESPONSE_HEADER_TIMEOUT, DEFAULT_RETRY_BUDGET,
    DEFAULT_RETRY_MIN_PER_SECOND, DEFAULT_RISE, DEFAULT_SESSION_CACHE,
    DEFAULT_UPSTREAM_SESSION_CACHE, DEFAULT_WATCH_INTERVAL, KX_GROUPS,
};
use crate::raw::{
    Entries, Int, RawAccessLog, RawAdmin, RawBalance, RawConfig, RawHeaderRules, RawHealthCheck,
    RawHttp2, RawLimits, RawListener, RawPassive, RawRateLimit, RawRespond, RawRetry, RawRoute,
    RawShed, RawSticky, RawTls, RawUpstream, RawUpstreamTls, Scalar, ServerSpec, StrList,
    StrOrBool,
};
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
    let upstreams = upstreams(&mut ctx, raw.upstreams.as_ref());
    let names: Vec<String> = upstreams.iter().map(|u| u.name.clone()).collect();
    let listeners = listeners(&mut ctx, raw.listeners.as_ref(), &names);
    let admin = raw
        .admin
        .as_ref()
        .and_then(|a| admin(&mut ctx, a, &listeners));

    if ctx.errors.is_empty() {
        Ok(Config {
            listeners,
            upstreams,
            access_log,
            admin,
            drain_timeout,
            workers,
        })
    } else {
        let mut errors = ctx.errors;
        errors.sort_by_key(|e| (e.line, e.col));
        Err(ConfigErrors { errors })
    }
}

// ---------------------------------------------------------------------------------------------
// scalars

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
            None => Some(PathBuf::from(p.get_ref())),
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
    Some(Admin { address, token })
}

// ---------------------------------------------------------------------------------------------
// upstreams

fn upstreams(ctx: &mut Ctx<'_>, raw: Option<&Entries<RawUpstream>>) -> Vec<Arc<UpstreamGroup>> {
    let Some(raw) = raw else { return Vec::new() };
    let mut groups: Vec<UpstreamGroup> = raw
        .0
        .iter()
        .map(|(name, up)| upstream(ctx, name, up))
        .collect();
    fallbacks(ctx, raw, &mut groups);
    groups.into_iter().map(Arc::new).collect()
}

/// Resolve every `fallback` to a group index: it must name another defined group, and following
/// fallbacks must never come back to where it started.
fn fallbacks(ctx: &mut Ctx<'_>, raw: &Entries<RawUpstream>, groups: &mut [UpstreamGroup]) {
    let names: Vec<&str> = raw.0.iter().map(|(n, _)| n.get_ref().as_str()).collect();
    for (i, (name, up)) in raw.0.iter().enumerate() {
        let Some(fallback) = &up.fallback else {
            continue;
        };
        let key = sub(&sub("upstreams", name.get_ref()), "fallback");
        match names.iter().position(|n| *n == fallback.get_ref()) {
            None => {
                let known: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
                ctx.error(
                    start(fallback),
                    &key,
                    format!(
                        "unknown upstream group {:?}; defined groups: {}",
                        fallback.get_ref(),
                        known.join(", ")
                    ),
                );
            }
            Some(j) if j == i => {
                ctx.error(start(fallback), &key, "a group cannot fall back to itself")
            }
            Some(j) => {
                if let Some(g) = groups.get_mut(i) {
                    g.fallback = Some(j);
                }
            }
        }
    }
    // A cycle is reported once, at the fallback of its first group in file order.
    for (i, (name, up)) in raw.0.iter().enumerate() {
        let Some(fallback) = &up.fallback else {
            continue;
        };
        let mut path = vec![name.get_ref().as_str()];
        let mut at = groups.get(i).and_then(|g| g.fallback);
        while let Some(j) = at {
            path.push(names.get(j).copied().unwrap_or("?"));
            if j <= i || path.len() > groups.len() {
                break;
            }
            at = groups.get(j).and_then(|g| g.fallback);
        }
        if at == Some(i) {
            ctx.error(
                start(fallback),
                &sub(&sub("upstreams", name.get_ref()), "fallback"),
                format!("fallback cycle: {}", path.join(" -> ")),
            );
        }
    }
    if !ctx.errors.is_empty() {
        // Never hand a cyclic or dangling chain to anyone (the config is refused anyway).
        for g in groups.iter_mut() {
            g.fallback = None;
        }
    }
}

fn health_check(ctx: &mut Ctx<'_>, key: &str, at: usize, raw: &RawHealthCheck) -> HealthCheck {
    let is_tcp = match &raw.kind {
        None => false,
        Some(k) => match k.get_ref().as_str() {
            "http" => false,
            "tcp" => true,
            other => {
                ctx.error(
                    start(k),
                    &sub(key, "type"),
                    format!("unknown health check type {other:?}; expected \"http\" or \"tcp\""),
                );
                false
            }
        },
    };
    let interval = duration(
        ctx,
        raw.interval.as_ref(),
        &sub(key, "interval"),
        DEFAULT_CHECK_INTERVAL,
        false,
    );
    let timeout = duration(
        ctx,
        raw.timeout.as_ref(),
        &sub(key, "timeout"),
        DEFAULT_CHECK_TIMEOUT,
        false,
    );
    if timeout >= interval {
        let (at, which) = match (&raw.timeout, &raw.interval) {
            (Some(t), _) => (start(t), "timeout"),
            (None, Some(i)) => (start(i), "interval"),
            (None, None) => (at, "timeout"),
        };
        ctx.error(
            at,
            &sub(key, which),
            format!(
                "timeout ({}) must be shorter than interval ({})",
                crate::units::format_duration(timeout),
                crate::units::format_duration(interval)
            ),
        );
    }
    let rise = int(
        ctx,
        raw.rise.as_ref(),
        &sub(key, "rise"),
        i64::from(DEFAULT_RISE),
        1,
        1000,
    );
    let fall = int(
        ctx,
        raw.fall.as_ref(),
        &sub(key, "fall"),
        i64::from(DEFAULT_FALL),
        1,
        1000,
    );
    let http_only = [
        ("path", raw.path.as_ref().map(start)),
        ("method", raw.method.as_ref().map(start)),
        ("host", raw.host.as_ref().map(start)),
        ("expect_status", raw.expect_status.as_ref().map(start)),
        ("expect_body", raw.expect_body.as_ref().map(start)),
    ];
    let kind = if is_tcp {
        for (option, at) in http_only {
            if let Some(at) = at {
                ctx.error(
                    at,
                    &sub(key, option),
                    format!("`{option}` only applies to type = \"http\" health checks"),
                );
            }
        }
        HealthCheckKind::Tcp
    } else {
        HealthCheckKind::Http(http_check(ctx, key, raw))
    };
    HealthCheck {
        kind,
        interval,
        timeout,
        rise: u32::try_from(rise).unwrap_or(DEFAULT_RISE),
        fall: u32::try_from(fall).unwrap_or(DEFAULT_FALL),
    }
}

fn http_check(ctx: &mut Ctx<'_>, key: &str, raw: &RawHealthCheck) -> HttpCheck {
    let path = match &raw.path {
        None => "/".to_string(),
        Some(p) => {
            let text = p.get_ref();
            if !text.starts_with('/')
                || text.contains([' ', '#'])
                || text.chars().any(|c| c.is_control() || !c.is_ascii())
            {
                ctx.error(
                    start(p),
                    &sub(key, "path"),
                    format!("health check path {text:?} must start with '/' and contain only visible ASCII (no spaces or fragment)"),
                );
            }
            text.clone()
        }
    };
    let method = match &raw.method {
        None => "GET".to_string(),
        Some(m) => {
            if !is_token(m.get_ref()) {
                ctx.error(
                    start(m),
                    &sub(key, "method"),
                    format!(
                        "invalid method {:?}: must be a token such as \"GET\" or \"HEAD\"",
                        m.get_ref()
                    ),
                );
            }
            m.get_ref().to_ascii_uppercase()
        }
    };
    let host = raw.host.as_ref().map(|h| {
        let message = if h.get_ref().is_empty() {
            Some("host must not be empty".to_string())
        } else {
            header_value_error(h.get_ref()).or_else(|| {
                h.get_ref()
                    .contains(' ')
                    .then(|| format!("invalid host {:?}: no spaces", h.get_ref()))
            })
        };
        if let Some(message) = message {
            ctx.error(start(h), &sub(key, "host"), message);
        }
        h.get_ref().clone()
    });
    let expect_status = match &raw.expect_status {
        None => (200, 399),
        Some(s) => match status_range(s.get_ref()) {
            Ok(range) => range,
            Err(message) => {
                ctx.error(start(s), &sub(key, "expect_status"), message);
                (200, 399)
            }
        },
    };
    let expect_body = raw.expect_body.as_ref().map(|b| {
        if b.get_ref().is_empty() {
            ctx.error(
                start(b),
                &sub(key, "expect_body"),
                "expect_body must not be empty",
            );
        }
        b.get_ref().clone()
    });
    HttpCheck {
        method,
        path,
        host,
        expect_status,
        expect_body,
    }
}

/// `200`, `"200"` or `"200-399"`: an inclusive range within 100-599.
fn status_range(value: &Scalar) -> Result<(u16, u16), String> {
    let expected = "expected a status such as 200 or a range such as \"200-399\" (within 100-599)";
    let (lo, hi) = match value {
        Scalar::Int(n) => (*n, *n),
        Scalar::Str(text) => {
            let (lo, hi) = text.split_once('-').unwrap_or((text, text));
            match (lo.trim().parse::<i64>(), hi.trim().parse::<i64>()) {
                (Ok(lo), Ok(hi)) => (lo, hi),
                _ => return Err(format!("invalid status range {text:?}: {expected}")),
            }
        }
        _ => return Err(expected.to_string()),
    };
    let valid = |n: i64| (100..=599).contains(&n);
    if !valid(lo) || !valid(hi) {
        return Err(format!("status range {lo}-{hi} is outside 100-599"));
    }
    if lo > hi {
        return Err(format!(
            "status range {lo}-{hi} is empty (the first status is larger)"
        ));
    }
    Ok((lo as u16, hi as u16))
}

fn passive(ctx: &mut Ctx<'_>, key: &str, raw: Option<&RawPassive>) -> PassiveCheck {
    let d = PassiveCheck::DEFAULT;
    let Some(raw) = raw else { return d };
    let max_failures = int(
        ctx,
        raw.max_failures.as_ref(),
        &sub(key, "max_failures"),
        i64::from(d.max_failures),
        0,
        1_000_000,
    );
    let ejection = duration(
        ctx,
        raw.ejection.as_ref(),
        &sub(key, "ejection"),
        d.ejection,
        false,
    );
    let max_ejection = duration(
        ctx,
        raw.max_ejection.as_ref(),
        &sub(key, "max_ejection"),
        d.max_ejection.max(ejection),
        false,
    );
    not_shorter(
        ctx,
        key,
        ("max_ejection", raw.max_ejection.as_ref(), max_ejection),
        ("ejection", raw.ejection.as_ref(), ejection),
    );
    let max_ejected_percent = int(
        ctx,
        raw.max_ejected_percent.as_ref(),
        &sub(key, "max_ejected_percent"),
        i64::from(d.max_ejected_percent),
        0,
        100,
    );
    let slow_start = duration(
        ctx,
        raw.slow_start.as_ref(),
        &sub(key, "slow_start"),
        d.slow_start,
        true,
    );
    PassiveCheck {
        max_failures: u32::try_from(max_failures).unwrap_or(d.max_failures),
        ejection,
        max_ejection,
        max_ejected_percent: u32::try_from(max_ejected_percent).unwrap_or(d.max_ejected_percent),
        slow_start,
    }
}

fn upstream(ctx: &mut Ctx<'_>, name: &Spanned<String>, raw: &RawUpstream) -> UpstreamGroup {
    let key = sub("upstreams", name.get_ref());
    if let Some(message) = plain_text_error(name.get_ref(), "upstream group name") {
        ctx.error(start(name), &key, message);
    }
    let servers = match &raw.servers {
        None => {
            ctx.error(
                start(name),
                &key,
                "upstream group has no `servers`; e.g. servers = [\"127.0.0.1:9001\"]",
            );
            Vec::new()
        }
        Some(list) if list.get_ref().is_empty() => {
            ctx.error(
                start(list),
                &sub(&key, "servers"),
                "must list at least one server",
            );
            Vec::new()
        }
        Some(list) => servers(ctx, &sub(&key, "servers"), list.get_ref()),
    };
    let balance = balance(ctx, &sub(&key, "balance"), raw.balance.as_ref());
    let keepalive = int(
        ctx,
        raw.keepalive.as_ref(),
        &sub(&key, "keepalive"),
        DEFAULT_KEEPALIVE as i64,
        0,
        1_000_000,
    );
    let max_connections_per_server = int(
        ctx,
        raw.max_connections_per_server.as_ref(),
        &sub(&key, "max_connections_per_server"),
        0,
        0,
        i64::from(u32::MAX),
    );
    let connect_timeout = duration(
        ctx,
        raw.connect_timeout.as_ref(),
        &sub(&key, "connect_timeout"),
        DEFAULT_CONNECT_TIMEOUT,
        false,
    );
    let response_header_timeout = duration(
        ctx,
        raw.response_header_timeout.as_ref(),
        &sub(&key, "response_header_timeout"),
        DEFAULT_RESPONSE_HEADER_TIMEOUT,
        false,
    );
    let idle_timeout = duration(
        ctx,
        raw.idle_timeout.as_ref(),
        &sub(&key, "idle_timeout"),
        DEFAULT_IDLE_TIMEOUT,
        false,
    );
    let health_check = raw
        .health_check
        .as_ref()
        .map(|h| health_check(ctx, &sub(&key, "health_check"), start(name), h));
    let passive = passive(ctx, &sub(&key, "passive"), raw.passive.as_ref());
    let (queue, queue_timeout) = queue(ctx, &key, raw, max_connections_per_server);
    let sticky_cookie = raw
        .sticky_cookie
        .as_ref()
        .and_then(|s| sticky_cookie(ctx, &sub(&key, "sticky_cookie"), s));
    if let (Some(s), Balance::HashCookie(hashed), Some(at)) =
        (&sticky_cookie, &balance, raw.sticky_cookie.as_ref())
    {
        if s.name == *hashed {
            ctx.error(
                start(at),
                &sub(&key, "sticky_cookie"),
                format!("cookie {hashed:?} is already the hash_cookie key: Portico would overwrite the client's value; use another name"),
            );
        }
    }
    let tls = raw
        .tls
        .as_ref()
        .and_then(|t| upstream_tls(ctx, &sub(&key, "tls"), start(name), t));
    let protocol = upstream_protocol(ctx, &sub(&key, "protocol"), raw.protocol.as_ref());
    UpstreamGroup {
        name: name.get_ref().clone(),
        servers,
        balance,
        keepalive: usize::try_from(keepalive).unwrap_or(DEFAULT_KEEPALIVE),
        max_connections_per_server: u32::try_from(max_connections_per_server).unwrap_or(0),
        connect_timeout,
        response_header_timeout,
        idle_timeout,
        health_check,
        passive,
        // resolved by `fallbacks` once every group name is known
        fallback: None,
        queue,
        queue_timeout,
        sticky_cookie,
        tls,
        protocol,
    }
}

/// `protocol = "http1" | "h2"` of an upstream group.
fn upstream_protocol(
    ctx: &mut Ctx<'_>,
    key: &str,
    raw: Option<&Spanned<String>>,
) -> UpstreamProtocol {
    let Some(p) = raw else {
        return UpstreamProtocol::Http1;
    };
    match p.get_ref().as_str() {
        "http1" => UpstreamProtocol::Http1,
        "h2" => UpstreamProtocol::H2,
        other => {
            ctx.error(
                start(p),
                key,
                format!("unknown upstream protocol {other:?}: use \"http1\" or \"h2\""),
            );
            UpstreamProtocol::Http1
        }
    }
}

/// `sticky_cookie`: a token name and attributes a browser keeps as written.
fn sticky_cookie(ctx: &mut Ctx<'_>, key: &str, raw: &Spanned<RawSticky>) -> Option<StickyCookie> {
    let bad_name = |name: &str| {
        (!is_token(name))
            .then(|| format!("invalid cookie name {name:?}: must be a non-empty token"))
    };
    let table = match raw.get_ref() {
        RawSticky::Name(name) => {
            if let Some(message) = bad_name(name) {
                ctx.error(start(raw), key, message);
                return None;
            }
            return Some(StickyCookie {
                name: name.clone(),
                path: "/".into(),
                max_age: None,
                http_only: true,
                secure: false,
                same_site: None,
            });
        }
        RawSticky::Table(t) => t,
    };
    let Some(name) = &table.name else {
        ctx.error(
            start(raw),
            key,
            "sticky_cookie table needs a `name`, e.g. { name = \"PORTICO_SRV\" }",
        );
        return None;
    };
    if let Some(message) = bad_name(name.get_ref()) {
        ctx.error(start(name), &sub(key, "name"), message);
    }
    let path = match &table.path {
        None => "/".to_string(),
        Some(p) => {
            let text = p.get_ref();
            if !text.starts_with('/') || text.chars().any(|c| c == ';' || c.is_control()) {
                ctx.error(
                    start(p),
                    &sub(key, "path"),
                    format!("invalid cookie path {text:?}: must start with '/' and contain no ';' or control characters"),
                );
            }
            text.clone()
        }
    };
    let max_age = table.max_age.as_ref().map(|m| {
        let d = duration(
            ctx,
            Some(m),
            &sub(key, "max_age"),
            Duration::from_secs(1),
            false,
        );
        if d.subsec_nanos() != 0 {
            ctx.error(
                start(m),
                &sub(key, "max_age"),
                "Max-Age is whole seconds: use a duration such as \"30s\", \"10m\" or \"1h\"",
            );
        }
        d.as_secs()
    });
    let secure = table.secure.as_ref().is_some_and(|s| *s.get_ref());
    let same_site = table.samesite.as_ref().and_then(|s| {
        let value = match s.get_ref().to_ascii_lowercase().as_str() {
            "strict" => "Strict",
            "lax" => "Lax",
            "none" => "None",
            other => {
                ctx.error(
                    start(s),
                    &sub(key, "samesite"),
                    format!("unknown SameSite value {other:?}; expected \"strict\", \"lax\" or \"none\""),
                );
                return None;
            }
        };
        if value == "None" && !secure {
            ctx.error(
                start(s),
                &sub(key, "samesite"),
                "samesite = \"none\" needs secure = true (browsers drop such cookies otherwise)",
            );
        }
        Some(value)
    });
    Some(StickyCookie {
        name: name.get_ref().clone(),
        path,
        max_age,
        http_only: table.httponly.as_ref().is_none_or(|h| *h.get_ref()),
        secure,
        same_site,
    })
}

/// `queue` and `queue_timeout`: a queue only makes sense behind a per-server limit, and a
/// timeout only with a queue.
fn queue(ctx: &mut Ctx<'_>, key: &str, raw: &RawUpstream, limit: i64) -> (u32, Duration) {
    let size = int(ctx, raw.queue.as_ref(), &sub(key, "queue"), 0, 0, MAX_QUEUE);
    let timeout = duration(
        ctx,
        raw.queue_timeout.as_ref(),
        &sub(key, "queue_timeout"),
        DEFAULT_QUEUE_TIMEOUT,
        false,
    );
    if let Some(q) = &raw.queue {
        if size > 0 && limit == 0 {
            ctx.error(
                start(q),
                &sub(key, "queue"),
                "a queue needs `max_connections_per_server` (requests wait for a server below that limit)",
            );
        }
    }
    if let Some(t) = &raw.queue_timeout {
        if raw.queue.as_ref().is_none_or(|q| q.get_ref().0 == 0) {
            ctx.error(
                start(t),
                &sub(key, "queue_timeout"),
                "queue_timeout needs a queue: set `queue` to the number of requests that may wait",
            );
        }
    }
    (u32::try_from(size).unwrap_or(0), timeout)
}

fn servers(ctx: &mut Ctx<'_>, key: &str, list: &[Spanned<ServerSpec>]) -> Vec<Server> {
    let mut servers: Vec<Server> = Vec::new();
    for (i, spec) in list.iter().enumerate() {
        let key = format!("{key}[{i}]");
        let (address, weight) = match spec.get_ref() {
            ServerSpec::Address(text) => ((text.as_str(), start(spec), key.clone()), None),
            ServerSpec::Table(table) => {
                let Some(address) = &table.address else {
                    ctx.error(
                        start(spec),
                        &key,
                        "server table needs an `address`, e.g. { address = \"127.0.0.1:9001\", weight = 2 }",
                    );
                    continue;
                };
                (
                    (
                        address.get_ref().as_str(),
                        start(address),
                        sub(&key, "address"),
                    ),
                    table.weight.as_ref(),
                )
            }
        };
        let weight = int(ctx, weight, &sub(&key, "weight"), 1, 1, MAX_WEIGHT);
        let (text, at, address_key) = address;
        match parse_address(text, false) {
            Ok(addr) => {
                if servers.iter().any(|s| s.address == addr) {
                    ctx.error(
                        at,
                        &address_key,
                        format!("duplicate server {addr} in this group"),
                    );
                } else {
                    servers.push(Server {
                        address: addr,
                        weight: u32::try_from(weight).unwrap_or(1),
                    });
                }
            }
            Err(message) => ctx.error(at, &address_key, message),
        }
    }
    servers
}

fn balance(ctx: &mut Ctx<'_>, key: &str, raw: Option<&RawBalance>) -> Balance {
    match raw {
        None | Some(RawBalance::RoundRobin) => Balance::RoundRobin,
        Some(RawBalance::LeastConnections) => Balance::LeastConnections,
        Some(RawBalance::TwoRandomChoices) => Balance::TwoRandomChoices,
        Some(RawBalance::HashClientIp) => Balance::HashClientIp,
        Some(RawBalance::HashHeader(name)) => {
            if let Some(message) = header_name_error(name.get_ref()) {
                ctx.error(start(name), &sub(key, "hash_header"), message);
            }
            Balance::HashHeader(name.get_ref().to_ascii_lowercase())
        }
        Some(RawBalance::HashCookie(name)) => {
            if !is_token(name.get_ref()) {
                ctx.error(
                    start(name),
                    &sub(key, "hash_cookie"),
                    format!(
                        "invalid cookie name {:?}: must be a non-empty token",
                        name.get_ref()
                    ),
                );
            }
            Balance::HashCookie(name.get_ref().clone())
        }
    }
}

// ---------------------------------------------------------------------------------------------
// listeners

fn listeners(
    ctx: &mut Ctx<'_>,
    raw: Option<&Spanned<Vec<Spanned<RawListener>>>>,
    upstreams: &[String],
) -> Vec<Listener> {
    let Some(raw) = raw else {
        ctx.error(
            0,
            "listeners",
            "at least one listener is required: add a [[listeners]] table",
        );
        return Vec::new();
    };
    if raw.get_ref().is_empty() {
        ctx.error(start(raw), "listeners", "at least one listener is required");
    }
    // (address, name, key of the listener) of those seen so far
    let mut seen: Vec<(SocketAddr, String)> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for (i, item) in raw.get_ref().iter().enumerate() {
        let key = format!("listeners[{i}]");
        let l = item.get_ref();
        let address = match &l.address {
            None => {
                ctx.error(
                    start(item),
                    &key,
                    "listener needs an `address`, e.g. address = \"127.0.0.1:8080\"",
                );
                None
            }
            Some(a) => match parse_address(a.get_ref(), true) {
                Ok(addr) => {
                    if let Some((other, other_name)) =
                        seen.iter().find(|(o, _)| conflicts(*o, addr))
                    {
                        let message = if *other == addr {
                            format!("duplicate listener address {addr} (listener {other_name:?} uses it)")
                        } else {
                            format!("address {addr} overlaps listener {other_name:?} on {other}")
                        };
                        ctx.error(start(a), &sub(&key, "address"), message);
                    }
                    Some(addr)
                }
                Err(message) => {
                    ctx.error(start(a), &sub(&key, "address"), message);
                    None
                }
            },
        };
        let name = match &l.name {
            Some(n) => {
                if let Some(message) = plain_text_error(n.get_ref(), "listener name") {
                    ctx.error(start(n), &sub(&key, "name"), message);
                } else if names.contains(n.get_ref()) {
                    ctx.error(
                        start(n),
                        &sub(&key, "name"),
                        format!("duplicate listener name {:?}", n.get_ref()),
                    );
                }
                n.get_ref().clone()
            }
            None => address.map_or_else(|| key.clone(), |a| a.to_string()),
        };
        names.push(name.clone());
        if let Some(addr) = address {
            seen.push((addr, name.clone()));
        }
        let limits = limits(ctx, &sub(&key, "limits"), l.limits.as_ref());
        let tls = l.tls.as_ref().and_then(|t| tls(ctx, &sub(&key, "tls"), t));
        let shed = l.shed.as_ref().map(|s| shed(ctx, &sub(&key, "shed"), s));
        let http2 = http2(ctx, &sub(&key, "http2"), l.http2.as_ref());
        let routes = match &l.routes {
            None => {
                ctx.error(
                    start(item),
                    &key,
                    "listener has no routes: add at least one [[listeners.routes]]",
                );
                Vec::new()
            }
            Some(routes) if routes.get_ref().is_empty() => {
                ctx.error(
                    start(routes),
                    &sub(&key, "routes"),
                    "must contain at least one route",
                );
                Vec::new()
            }
            Some(routes) => routes
                .get_ref()
                .iter()
                .enumerate()
                .filter_map(|(j, r)| {
                    route(ctx, &format!("{key}.routes[{j}]"), &name, j, r, upstreams)
                })
                .collect(),
        };
        out.push(Listener {
            name,
            address: address.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0))),
            limits,
            tls,
            routes,
            shed,
            http2,
        });
    }
    out
}

/// `[listeners.shed]`: lag target and interval; the target must be shorter than the interval
/// (a lag that never lasts as long as the target's own length cannot be told from noise).
fn shed(ctx: &mut Ctx<'_>, key: &str, raw: &RawShed) -> Shed {
    let d = Shed::DEFAULT;
    let target = duration(
        ctx,
        raw.target.as_ref(),
        &sub(key, "target"),
        d.target,
        false,
    );
    let interval = duration(
        ctx,
        raw.interval.as_ref(),
        &sub(key, "interval"),
        d.interval.max(target),
        false,
    );
    if target < Duration::from_millis(1) {
        if let Some(t) = &raw.target {
            ctx.error(
                start(t),
                &sub(key, "target"),
                "must be at least 1ms (event-loop lag is measured with millisecond timers)",
            );
        }
    }
    not_shorter(
        ctx,
        key,
        ("interval", raw.interval.as_ref(), interval),
        ("target", raw.target.as_ref(), target),
    );
    Shed { target, interval }
}

/// `[listeners.http2]`: downstream HTTP/2 settings, in the ranges RFC 9113 6.5.2 allows.
fn http2(ctx: &mut Ctx<'_>, key: &str, raw: Option<&RawHttp2>) -> Http2Settings {
    let d = Http2Settings::DEFAULT;
    let Some(raw) = raw else { return d };
    let enabled = raw.enabled.as_ref().is_none_or(|b| *b.get_ref());
    let max_concurrent_streams = int(
        ctx,
        raw.max_concurrent_streams.as_ref(),
        &sub(key, "max_concurrent_streams"),
        i64::from(d.max_concurrent_streams),
        1,
        10_000,
    );
    let max_header_list_size = size(
        ctx,
        raw.max_header_list_size.as_ref(),
        &sub(key, "max_header_list_size"),
        u64::from(d.max_header_list_size),
        1024,
        MAX_HEAD_LIMIT,
    );
    let initial_window_size = size(
        ctx,
        raw.initial_window_size.as_ref(),
        &sub(key, "initial_window_size"),
        u64::from(d.initial_window_size),
        1024,
        (1 << 31) - 1,
    );
    let max_frame_size = size(
        ctx,
        raw.max_frame_size.as_ref(),
        &sub(key, "max_frame_size"),
        u64::from(d.max_frame_size),
        16 * 1024,
        (1 << 24) - 1,
    );
    let max_resets = int(
        ctx,
        raw.max_resets.as_ref(),
        &sub(key, "max_resets"),
        i64::from(d.max_resets),
        1,
        i64::from(u32::MAX),
    );
    let reset_window = duration(
        ctx,
        raw.reset_window.as_ref(),
        &sub(key, "reset_window"),
        d.reset_window,
        false,
    );
    Http2Settings {
        enabled,
        max_concurrent_streams: u32::try_from(max_concurrent_streams)
            .unwrap_or(d.max_concurrent_streams),
        max_header_list_size: u32::try_from(max_header_list_size).unwrap_or(d.max_header_list_size),
        initial_window_size: u32::try_from(initial_window_size).unwrap_or(d.initial_window_size),
        max_frame_size: u32::try_from(max_frame_size).unwrap_or(d.max_frame_size),
        max_resets: u32::try_from(max_resets).unwrap_or(d.max_resets),
        reset_window,
        extended_connect: raw
            .extended_connect
            .as_ref()
            .map_or(d.extended_connect, |b| *b.get_ref()),
    }
}

/// Two listen addresses cannot both be bound: same port (not 0) and same IP, or one is the
/// wildcard of the same family.
fn conflicts(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port()
        && a.port() != 0
        && a.is_ipv4() == b.is_ipv4()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

fn tls(ctx: &mut Ctx<'_>, key: &str, raw: &Spanned<RawTls>) -> Option<TlsSettings> {
    let t = raw.get_ref();
    let mut certificates = Vec::new();
    match &t.certificates {
        None => ctx.error(
            start(raw),
            key,
            "tls needs `certificates = [{ cert = \"chain.pem\", key = \"key.pem\" }]`",
        ),
        Some(list) if list.get_ref().is_empty() => ctx.error(
            start(list),
            &sub(key, "certificates"),
            "must contain at least one certificate",
        ),
        Some(list) => {
            for (i, item) in list.get_ref().iter().enumerate() {
                let ikey = format!("{key}.certificates[{i}]");
                let c = item.get_ref();
                let mut path = |field: &Option<Spanned<String>>, name: &str| match field {
                    None => {
                        ctx.error(
                            start(item),
                            &ikey,
                            format!("certificate needs `{name}` (a PEM file path)"),
                        );
                        None
                    }
                    Some(p) if p.get_ref().trim().is_empty() => {
                        ctx.error(start(p), &sub(&ikey, name), "must be a file path");
                        None
                    }
                    Some(p) => Some(relative_to_config(ctx.file, p.get_ref())),
                };
                let cert = path(&c.cert, "cert");
                let key_path = path(&c.key, "key");
                if let (Some(cert), Some(key)) = (cert, key_path) {
                    certificates.push(CertificateFiles { cert, key });
                }
            }
        }
    }
    let mut versions = Vec::new();
    match &t.versions {
        None => versions = vec![TlsVersion::Tls12, TlsVersion::Tls13],
        Some(v) => {
            for (name, at) in v.get_ref().items(start(v)) {
                match name.as_str() {
                    "1.2" => versions.push(TlsVersion::Tls12),
                    "1.3" => versions.push(TlsVersion::Tls13),
                    other => ctx.error(
                        at,
                        &sub(key, "versions"),
                        format!("unsupported TLS version {other:?}: use \"1.2\" and/or \"1.3\""),
                    ),
                }
            }
            if v.get_ref().items(0).is_empty() {
                ctx.error(
                    start(v),
                    &sub(key, "versions"),
                    "must name at least one version",
                );
            }
        }
    }
    let cipher_suites = t.cipher_suites.as_ref().and_then(|list| {
        let names: Vec<&str> = CIPHER_SUITES.iter().map(|(n, _)| *n).collect();
        let suites = names_from(ctx, &sub(key, "cipher_suites"), list, &names, "cipher suite")?;
        // Every enabled version needs at least one of its suites.
        for v in &versions {
            if !suites
                .iter()
                .any(|s| CIPHER_SUITES.iter().any(|(n, sv)| n == s && sv == v))
            {
                let (label, prefix) = match v {
                    TlsVersion::Tls12 => ("1.2", "TLS_ECDHE_"),
                    TlsVersion::Tls13 => ("1.3", "TLS13_"),
                };
                ctx.error(
                    start(list),
                    &sub(key, "cipher_suites"),
                    format!(
                        "no cipher suite for TLS {label}, which `versions` enables: add a {prefix}* suite or remove \"{label}\" from `versions`"
                    ),
                );
            }
        }
        Some(suites)
    });
    let groups = t.groups.as_ref().and_then(|list| {
        let names: Vec<&str> = KX_GROUPS.iter().map(|(n, _)| *n).collect();
        let groups = names_from(ctx, &sub(key, "groups"), list, &names, "key-exchange group")?;
        let tls12_ok = groups
            .iter()
            .any(|g| KX_GROUPS.iter().any(|(n, classic)| n == g && *classic));
        if versions.contains(&TlsVersion::Tls12) && !tls12_ok {
            ctx.error(
                start(list),
                &sub(key, "groups"),
                "TLS 1.2 cannot use the post-quantum hybrid groups: add X25519, secp256r1 or secp384r1, or set versions = \"1.3\"",
            );
        }
        Some(groups)
    });
    let session_tickets = t.session_tickets.as_ref().is_none_or(|b| *b.get_ref());
    let session_cache = int(
        ctx,
        t.session_cache.as_ref(),
        &sub(key, "session_cache"),
        DEFAULT_SESSION_CACHE as i64,
        0,
        MAX_SESSION_CACHE,
    ) as usize;
    let client_auth = t.client_auth.as_ref().and_then(|c| match &c.ca {
        None => {
            ctx.error(
                start(raw),
                &sub(key, "client_auth"),
                "client_auth needs `ca` (a PEM file of the CA certificates client certificates must chain to)",
            );
            None
        }
        Some(p) if p.get_ref().trim().is_empty() => {
            ctx.error(
                start(p),
                &sub(&sub(key, "client_auth"), "ca"),
                "must be a file path",
            );
            None
        }
        Some(p) => Some(ClientAuth {
            ca: relative_to_config(ctx.file, p.get_ref()),
            required: c.required.as_ref().is_none_or(|b| *b.get_ref()),
        }),
    });
    let watch_interval = duration(
        ctx,
        t.watch_interval.as_ref(),
        &sub(key, "watch_interval"),
        DEFAULT_WATCH_INTERVAL,
        false,
    );
    let watch = t
        .watch
        .as_ref()
        .is_none_or(|b| *b.get_ref())
        .then_some(watch_interval);
    (!certificates.is_empty() && !versions.is_empty()).then_some(TlsSettings {
        certificates,
        versions,
        cipher_suites,
        groups,
        session_tickets,
        session_cache,
        client_auth,
        watch,
    })
}

/// TLS versions from a `versions` key (default 1.2 and 1.3).
fn tls_versions(ctx: &mut Ctx<'_>, key: &str, raw: Option<&Spanned<StrList>>) -> Vec<TlsVersion> {
    let Some(v) = raw else {
        return vec![TlsVersion::Tls12, TlsVersion::Tls13];
    };
    let mut versions = Vec::new();
    for (name, at) in v.get_ref().items(start(v)) {
        match name.as_str() {
            "1.2" => versions.push(TlsVersion::Tls12),
            "1.3" => versions.push(TlsVersion::Tls13),
            other => ctx.error(
                at,
                key,
                format!("unsupported TLS version {other:?}: use \"1.2\" and/or \"1.3\""),
            ),
        }
    }
    if v.get_ref().items(0).is_empty() {
        ctx.error(start(v), key, "must name at least one version");
    }
    versions
}

/// `[upstreams.NAME.tls]`; `at` is the group name's position (the table itself has no span).
fn upstream_tls(
    ctx: &mut Ctx<'_>,
    key: &str,
    at: usize,
    t: &RawUpstreamTls,
) -> Option<UpstreamTls> {
    let before = ctx.errors.len();
    let file_path = |ctx: &mut Ctx<'_>, value: &Spanned<String>, key: &str| {
        if value.get_ref().trim().is_empty() {
            ctx.error(start(value), key, "must be a file path");
            None
        } else {
            Some(relative_to_config(ctx.file, value.get_ref()))
        }
    };
    let ca_file = t
        .ca_file
        .as_ref()
        .and_then(|p| file_path(ctx, p, &sub(key, "ca_file")));
    let server_name = t.server_name.as_ref().map(|n| {
        if let Some(message) = server_name_error(n.get_ref()) {
            ctx.error(start(n), &sub(key, "server_name"), message);
        }
        n.get_ref().trim_end_matches('.').to_ascii_lowercase()
    });
    let certificate = t.certificate.as_ref().and_then(|c| {
        let ckey = sub(key, "certificate");
        match (&c.cert, &c.key) {
            (Some(cert), Some(k)) => {
                let cert = file_path(ctx, cert, &sub(&ckey, "cert"));
                let k = file_path(ctx, k, &sub(&ckey, "key"));
                Some(CertificateFiles {
                    cert: cert?,
                    key: k?,
                })
            }
            _ => {
                ctx.error(
                    at,
                    &ckey,
                    "a client certificate needs both `cert` and `key` (PEM file paths): certificate = { cert = \"client.pem\", key = \"client.key\" }",
                );
                None
            }
        }
    });
    let verify = t.verify.as_ref().is_none_or(|b| *b.get_ref());
    if let (false, Some(ca)) = (verify, &t.ca_file) {
        ctx.error(
            start(ca),
            &sub(key, "ca_file"),
            "ca_file has no effect with verify = false: remove one of them",
        );
    }
    let versions = tls_versions(ctx, &sub(key, "versions"), t.versions.as_ref());
    let session_cache = int(
        ctx,
        t.session_cache.as_ref(),
        &sub(key, "session_cache"),
        DEFAULT_UPSTREAM_SESSION_CACHE as i64,
        0,
        MAX_SESSION_CACHE,
    ) as usize;
    (ctx.errors.len() == before).then_some(UpstreamTls {
        ca_file,
        server_name,
        certificate,
        verify,
        versions,
        session_cache,
    })
}

/// Why `name` cannot be a TLS server name: it must be a DNS name (no wildcard, no port) or an
/// IP address.
fn server_name_error(name: &str) -> Option<String> {
    if name.parse::<IpAddr>().is_ok() {
        return None;
    }
    let host = name.strip_suffix('.').unwrap_or(name);
    let valid_label = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    if host.is_empty() || host.len() > 253 || !host.split('.').all(valid_label) {
        return Some(format!(
            "invalid server name {name:?}: expected a DNS name such as \"api.internal.example\" or an IP address (no port, no wildcard)"
        ));
    }
    None
}

/// A non-empty list of names from `known` (matched ignoring ASCII case, returned as spelled in
/// `known`, duplicates dropped); None after reporting an unknown name or an empty list.
fn names_from(
    ctx: &mut Ctx<'_>,
    key: &str,
    list: &Spanned<StrList>,
    known: &[&'static str],
    what: &str,
) -> Option<Vec<&'static str>> {
    let items = list.get_ref().items(start(list));
    if items.is_empty() {
        ctx.error(start(list), key, format!("must name at least one {what}"));
        return None;
    }
    let mut out = Vec::new();
    let mut ok = true;
    for (name, at) in items {
        match known.iter().find(|k| k.eq_ignore_ascii_case(name.trim())) {
            Some(k) if !out.contains(k) => out.push(*k),
            Some(_) => {}
            None => {
                ok = false;
                ctx.error(
                    at,
                    key,
                    format!("unknown {what} {name:?}; accepted: {}", known.join(", ")),
                );
            }
        }
    }
    ok.then_some(out)
}

/// A path from the configuration, relative to the directory of the file it came from.
fn relative_to_config(file: &str, path: &str) -> PathBuf {
    let p = PathBuf::from(path);
    if p.is_absolute() || file.starts_with('<') {
        return p;
    }
    match std::path::Path::new(file).parent() {
        Some(dir) => dir.join(p),
        None => p,
    }
}

fn limits(ctx: &mut Ctx<'_>, key: &str, raw: Option<&RawLimits>) -> ListenerLimits {
    let d = ListenerLimits::DEFAULT;
    let Some(raw) = raw else { return d };
    let max_connections = int(
        ctx,
        raw.max_connections.as_ref(),
        &sub(key, "max_connections"),
        i64::from(d.max_connections),
        1,
        i64::from(u32::MAX),
    );
    let max_connections_per_client = int(
        ctx,
        raw.max_connections_per_client.as_ref(),
        &sub(key, "max_connections_per_client"),
        0,
        0,
        i64::from(u32::MAX),
    );
    let max_headers = int(
        ctx,
        raw.max_headers.as_ref(),
        &sub(key, "max_headers"),
        d.max_headers as i64,
        1,
        10_000,
    );
    let max_head_bytes = size(
        ctx,
        raw.max_head_bytes.as_ref(),
        &sub(key, "max_head_bytes"),
        d.max_head_bytes as u64,
        1,
        MAX_HEAD_LIMIT,
    );
    let max_request_line = size(
        ctx,
        raw.max_request_line.as_ref(),
        &sub(key, "max_request_line"),
        d.max_request_line as u64,
        1,
        MAX_HEAD_LIMIT,
    );
    if max_request_line > max_head_bytes {
        if let Some(v) = raw
            .max_request_line
            .as_ref()
            .or(raw.max_head_bytes.as_ref())
        {
            let which = if raw.max_request_line.is_some() {
                "max_request_line"
            } else {
                "max_head_bytes"
            };
            ctx.error(
                start(v),
                &sub(key, which),
                format!(
                    "max_request_line ({}) must not exceed max_head_bytes ({})",
                    format_size(max_request_line),
                    format_size(max_head_bytes)
                ),
            );
        }
    }
    let head_timeout = duration(
        ctx,
        raw.head_timeout.as_ref(),
        &sub(key, "head_timeout"),
        d.head_timeout,
        false,
    );
    let keepalive_timeout = duration(
        ctx,
        raw.keepalive_timeout.as_ref(),
        &sub(key, "keepalive_timeout"),
        d.keepalive_timeout,
        false,
    );
    let send_timeout = duration(
        ctx,
        raw.send_timeout.as_ref(),
        &sub(key, "send_timeout"),
        d.send_timeout,
        false,
    );
    let body_min_rate = size(
        ctx,
        raw.body_min_rate.as_ref(),
        &sub(key, "body_min_rate"),
        d.body_min_rate,
        0,
        u64::MAX,
    );
    let max_requests = int(
        ctx,
        raw.max_requests_per_connection.as_ref(),
        &sub(key, "max_requests_per_connection"),
        0,
        0,
        i64::MAX,
    );
    ListenerLimits {
        max_connections: u32::try_from(max_connections).unwrap_or(d.max_connections),
        max_connections_per_client: u32::try_from(max_connections_per_client).unwrap_or(0),
        max_headers: usize::try_from(max_headers).unwrap_or(d.max_headers),
        max_head_bytes: to_usize(max_head_bytes),
        max_request_line: to_usize(max_request_line),
        head_timeout,
        keepalive_timeout,
        send_timeout,
        body_min_rate,
        max_requests_per_connection: u64::try_from(max_requests).unwrap_or(0),
    }
}

// ---------------------------------------------------------------------------------------------
// routes

fn route(
    ctx: &mut Ctx<'_>,
    key: &str,
    listener: &str,
    index: usize,
    item: &Spanned<RawRoute>,
    upstreams: &[String],
) -> Option<Route> {
    let r = item.get_ref();
    let name = match &r.name {
        Some(n) => {
            if let Some(message) = plain_text_error(n.get_ref(), "route name") {
                ctx.error(start(n), &sub(key, "name"), message);
            }
            n.get_ref().clone()
        }
        None => format!("{listener}#{index}"),
    };
    let matcher = matcher(ctx, key, r);
    let max_body_bytes = size(
        ctx,
        r.max_body.as_ref(),
        &sub(key, "max_body"),
        DEFAULT_MAX_BODY_BYTES,
        0,
        u64::MAX,
    );
    let request_headers = header_rules(
        ctx,
        &sub(key, "request_headers"),
        r.request_headers.as_ref(),
    );
    let response_headers = header_rules(
        ctx,
        &sub(key, "response_headers"),
        r.response_headers.as_ref(),
    );
    let rate_limit = r
        .rate_limit
        .as_ref()
        .and_then(|raw| rate_limit(ctx, &sub(key, "rate_limit"), start(item), raw));
    let action = action(ctx, key, start(item), r, &matcher, upstreams)?;
    Some(Route {
        name,
        matcher,
        action,
        max_body_bytes,
        request_headers,
        response_headers,
        rate_limit,
    })
}

fn rate_limit(
    ctx: &mut Ctx<'_>,
    key: &str,
    route_at: usize,
    raw: &RawRateLimit,
) -> Option<RateLimit> {
    let Some(rate_value) = &raw.rate else {
        let at = [
            raw.burst.as_ref().map(start),
            raw.header.as_ref().map(start),
            raw.cookie.as_ref().map(start),
            raw.max_keys.as_ref().map(start),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(route_at);
        ctx.error(
            at,
            &sub(key, "rate"),
            "a rate_limit needs `rate`, the requests allowed per second (such as rate = 10)",
        );
        return None;
    };
    let rate = rate_value.get_ref().0;
    if !(rate > 0.0 && rate <= 1e9) {
        ctx.error(
            start(rate_value),
            &sub(key, "rate"),
            format!("must be a number of requests per second above 0 (at most 1e9), found {rate}"),
        );
        return None;
    }
    let default_burst = (rate.ceil() as i64).max(1);
    let burst = int(
        ctx,
        raw.burst.as_ref(),
        &sub(key, "burst"),
        default_burst,
        1,
        1_000_000_000,
    );
    let max_keys = int(
        ctx,
        raw.max_keys.as_ref(),
        &sub(key, "max_keys"),
        DEFAULT_RATE_LIMIT_KEYS as i64,
        1,
        100_000_000,
    );
    let by = match (&raw.header, &raw.cookie) {
        (Some(h), Some(c)) => {
            let (later, at) = if start(c) > start(h) {
                ("cookie", start(c))
            } else {
                ("header", start(h))
            };
            ctx.error(
                at,
                &sub(key, later),
                "a rate limit counts by one key: set `header` or `cookie`, not both (neither = the client IP)",
            );
            RateLimitKey::ClientIp
        }
        (Some(h), None) => {
            if let Some(message) = header_name_error(h.get_ref()) {
                ctx.error(start(h), &sub(key, "header"), message);
            }
            RateLimitKey::Header(h.get_ref().to_ascii_lowercase())
        }
        (None, Some(c)) => {
            if !is_token(c.get_ref()) {
                ctx.error(
                    start(c),
                    &sub(key, "cookie"),
                    format!(
                        "invalid cookie name {:?}: a token (letters, digits and !#$%&'*+-.^_`|~)",
                        c.get_ref()
                    ),
                );
            }
            RateLimitKey::Cookie(c.get_ref().clone())
        }
        (None, None) => RateLimitKey::ClientIp,
    };
    Some(RateLimit {
        rate,
        burst: u32::try_from(burst).unwrap_or(u32::MAX),
        key: by,
        max_keys: usize::try_from(max_keys).unwrap_or(DEFAULT_RATE_LIMIT_KEYS),
    })
}

fn matcher(ctx: &mut Ctx<'_>, key: &str, r: &RawRoute) -> Matcher {
    let mut m = Matcher::default();
    if let Some(host) = &r.host {
        let hkey = sub(key, "host");
        let items = host.get_ref().items(start(host));
        if items.is_empty() {
            ctx.error(
                start(host),
                &hkey,
                "must not be empty (omit `host` to match any host)",
            );
        }
        for (i, (text, at)) in items.iter().enumerate() {
            let ikey = if matches!(host.get_ref(), StrList::One(_)) {
                hkey.clone()
            } else {
                format!("{hkey}[{i}]")
            };
            match host_match(text) {
                Ok(h) if !m.hosts.contains(&h) => m.hosts.push(h),
                Ok(_) => {}
                Err(message) => ctx.error(*at, &ikey, message),
            }
        }
    }
    if let Some(path) = &r.path {
        match path_match(path.get_ref()) {
            Ok(p) => m.path = Some(p),
            Err(message) => ctx.error(start(path), &sub(key, "path"), message),
        }
    }
    if let Some(methods) = &r.methods {
        let mkey = sub(key, "methods");
        let items = methods.get_ref().items(start(methods));
        if items.is_empty() {
            ctx.error(
                start(methods),
                &mkey,
                "must not be empty (omit `methods` to match any method)",
            );
        }
        for (i, (text, at)) in items.iter().enumerate() {
            let ikey = if matches!(methods.get_ref(), StrList::One(_)) {
                mkey.clone()
            } else {
                format!("{mkey}[{i}]")
            };
            if is_token(text) {
                let upper = text.to_ascii_uppercase();
                if !m.methods.contains(&upper) {
                    m.methods.push(upper);
                }
            } else {
                ctx.error(
                    *at,
                    &ikey,
                    format!("invalid method {text:?}: must be a token such as \"GET\""),
                );
            }
        }
    }
    if let Some(headers) = &r.headers {
        let hkey = sub(key, "headers");
        for (name, value) in &headers.0 {
            let nkey = sub(&hkey, name.get_ref());
            if let Some(message) = header_name_error(name.get_ref()) {
                ctx.error(start(name), &nkey, message);
                continue;
            }
            let expected = if value.get_ref() == "*" {
                None
            } else {
                if let Some(message) = header_value_error(value.get_ref()) {
                    ctx.error(start(value), &nkey, message);
                }
                Some(value.get_ref().clone())
            };
            m.headers
                .push((name.get_ref().to_ascii_lowercase(), expected));
        }
    }
    m
}

/// `example.com`, `*.example.com`, an IPv4 address or `[v6]`; lowercased, trailing dot removed.
pub(crate) fn host_match(text: &str) -> Result<HostMatch, String> {
    let lower = text.to_ascii_lowercase();
    let host = lower.strip_suffix('.').unwrap_or(&lower);
    if host.is_empty() {
        return Err("host must not be empty".to_string());
    }
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return match inner.parse::<std::net::Ipv6Addr>() {
            Ok(_) => Ok(HostMatch::Exact(host.to_string())),
            Err(_) => Err(format!("invalid IPv6 host {text:?}")),
        };
    }
    let (suffix, name) = match host.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, host),
    };
    if name.contains('*') || (host.starts_with('*') && !suffix) {
        return Err(format!(
            "invalid host {text:?}: a wildcard must be the whole first label, as in \"*.example.com\""
        ));
    }
    if name.contains(':') {
        return Err(format!(
            "invalid host {text:?}: hosts are matched without a port; remove \":port\""
        ));
    }
    let valid_label = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    if name.is_empty() || !name.split('.').all(valid_label) {
        return Err(format!(
            "invalid host {text:?}: expected a host name such as \"example.com\" or \"*.example.com\""
        ));
    }
    Ok(if suffix {
        HostMatch::Suffix(format!(".{name}"))
    } else {
        HostMatch::Exact(name.to_string())
    })
}

/// `"/exact"` or `"/prefix/**"`.
pub(crate) fn path_match(text: &str) -> Result<PathMatch, String> {
    if !text.starts_with('/') {
        return Err(format!("path {text:?} must start with '/'"));
    }
    if text.contains(['?', '#']) {
        return Err(format!(
            "path {text:?} must not contain a query or fragment ('?', '#')"
        ));
    }
    if text.chars().any(|c| c.is_control() || c == ' ') {
        return Err(format!(
            "path {text:?} must not contain spaces or control characters"
        ));
    }
    if let Some(prefix) = text.strip_suffix("/**") {
        if !prefix.contains('*') {
            return Ok(PathMatch::Prefix(format!("{prefix}/")));
        }
    }
    if text.contains('*') {
        let hint = text.trim_end_matches('*').trim_end_matches('/');
        return Err(format!(
            "path {text:?}: '*' is only allowed as a trailing \"/**\" (prefix match), e.g. \"{hint}/**\""
        ));
    }
    Ok(PathMatch::Exact(text.to_string()))
}

// ---------------------------------------------------------------------------------------------
// actions

/// The first span inside a respond table, if any key is set.
fn respond_at(r: &RawRespond) -> Option<usize> {
    [
        r.status.as_ref().map(start),
        r.body.as_ref().map(start),
        r.content_type.as_ref().map(start),
    ]
    .into_iter()
    .flatten()
    .min()
}

/// The first span inside a header rules table, if any key is set.
fn rules_at(r: &RawHeaderRules) -> Option<usize> {
    let first_key = |e: &Option<Entries<Spanned<String>>>| {
        e.as_ref().and_then(|e| e.0.first().map(|(k, _)| start(k)))
    };
    [
        r.remove.as_ref().map(start),
        first_key(&r.set),
        first_key(&r.add),
    ]
    .into_iter()
    .flatten()
    .min()
}

fn action(
    ctx: &mut Ctx<'_>,
    key: &str,
    route_at: usize,
    r: &RawRoute,
    matcher: &Matcher,
    upstreams: &[String],
) -> Option<Action> {
    let mut present: Vec<(&str, usize)> = Vec::new();
    if let Some(v) = &r.proxy {
        present.push(("proxy", start(v)));
    }
    if let Some(v) = &r.static_root {
        present.push(("static", start(v)));
    }
    if let Some(v) = &r.origin {
        present.push(("origin", start(v)));
    }
    if let Some(v) = &r.redirect {
        present.push(("redirect", start(v)));
    }
    if let Some(v) = &r.respond {
        present.push(("respond", respond_at(v).unwrap_or(route_at)));
    }
    present.sort_by_key(|(_, at)| *at);
    let kind = match present.as_slice() {
        [] => {
            ctx.error(
                route_at,
                key,
                format!("route has no action; set exactly one of {ACTIONS}"),
            );
            return None;
        }
        [(kind, _)] => *kind,
        [(first, _), (second, at), ..] => {
            ctx.error(
                *at,
                &sub(key, second),
                format!(
                    "a route has exactly one action, but both `{first}` and `{second}` are set"
                ),
            );
            return None;
        }
    };
    misplaced_options(ctx, key, route_at, r, kind);
    let action = match kind {
        "proxy" => Action::Proxy(proxy(ctx, key, r, matcher, upstreams)?),
        "static" => {
            let root = r.static_root.as_ref()?;
            if let Some(message) = plain_text_error(root.get_ref(), "static root") {
                ctx.error(start(root), &sub(key, "static"), message);
            }
            Action::Static(StaticAction {
                root: Some(PathBuf::from(root.get_ref())),
                index: index(ctx, key, r),
            })
        }
        "origin" => {
            let origin = r.origin.as_ref()?;
            let root = match origin.get_ref() {
                StrOrBool::Bool(true) => None,
                StrOrBool::Bool(false) => {
                    ctx.error(
                        start(origin),
                        &sub(key, "origin"),
                        "origin = false is not an action: use origin = true, or origin = \"/root/dir\" to also serve files",
                    );
                    None
                }
                StrOrBool::Str(root) => {
                    if let Some(message) = plain_text_error(root, "origin root") {
                        ctx.error(start(origin), &sub(key, "origin"), message);
                    }
                    Some(PathBuf::from(root))
                }
            };
            Action::Origin(StaticAction {
                root,
                index: index(ctx, key, r),
            })
        }
        "redirect" => {
            let location = r.redirect.as_ref()?;
            let message = if location.get_ref().is_empty() {
                Some("redirect location must not be empty".to_string())
            } else {
                header_value_error(location.get_ref())
            };
            if let Some(message) = message {
                ctx.error(start(location), &sub(key, "redirect"), message);
            }
            let status = match &r.redirect_status {
                None => 302,
                Some(s) => {
                    match u16::try_from(s.get_ref().0) {
                        Ok(code) if REDIRECT_STATUSES.contains(&code) => code,
                        _ => {
                            ctx.error(
                            start(s),
                            &sub(key, "redirect_status"),
                            format!("invalid redirect status {}: expected 301, 302, 303, 307 or 308", s.get_ref().0),
                        );
                            302
                        }
                    }
                }
            };
            Action::Redirect {
                status,
                location: location.get_ref().clone(),
            }
        }
        _ => respond(ctx, &sub(key, "respond"), r.respond.as_ref()?),
    };
    Some(action)
}

/// Options that only make sense with another action.
fn misplaced_options(ctx: &mut Ctx<'_>, key: &str, route_at: usize, r: &RawRoute, kind: &str) {
    let proxy_options = [
        ("strip_prefix", r.strip_prefix.as_ref().map(start)),
        ("rewrite_prefix", r.rewrite_prefix.as_ref().map(start)),
        ("forwarded_headers", r.forwarded_headers.as_ref().map(start)),
        ("via", r.via.as_ref().map(start)),
        ("preserve_host", r.preserve_host.as_ref().map(start)),
    ];
    let mut misplaced: Vec<(&str, usize, &str)> = Vec::new();
    if kind != "proxy" {
        for (option, at) in proxy_options {
            if let Some(at) = at {
                misplaced.push((option, at, "proxy routes"));
            }
        }
    }
    if kind != "proxy" {
        for (option, rules) in [
            ("request_headers", &r.request_headers),
            ("response_headers", &r.response_headers),
        ] {
            if let Some(rules) = rules {
                misplaced.push((option, rules_at(rules).unwrap_or(route_at), "proxy routes"));
            }
        }
    }
    if kind != "proxy" {
        if let Some(retry) = &r.retry {
            misplaced.push(("retry", retry_at(retry).unwrap_or(route_at), "proxy routes"));
        }
    }
    if kind != "static" && kind != "origin" {
        if let Some(index) = &r.index {
            misplaced.push(("index", start(index), "static and origin routes"));
        }
    }
    if kind != "redirect" {
        if let Some(status) = &r.redirect_status {
            misplaced.push(("redirect_status", start(status), "redirect routes"));
        }
    }
    for (option, at, applies) in misplaced {
        ctx.error(
            at,
            &sub(key, option),
            format!("`{option}` only applies to {applies}; this route's action is `{kind}`"),
        );
    }
}

fn index(ctx: &mut Ctx<'_>, key: &str, r: &RawRoute) -> Vec<String> {
    let Some(index) = &r.index else {
        return StaticAction::default().index;
    };
    let ikey = sub(key, "index");
    let mut out = Vec::new();
    for (i, (name, at)) in index.get_ref().items(start(index)).into_iter().enumerate() {
        let nkey = if matches!(index.get_ref(), StrList::One(_)) {
            ikey.clone()
        } else {
            format!("{ikey}[{i}]")
        };
        if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\\', '\0']) {
            ctx.error(
                at,
                &nkey,
                format!(
                    "invalid index file name {name:?}: a plain file name such as \"index.html\""
                ),
            );
        } else {
            out.push(name);
        }
    }
    out
}

fn proxy(
    ctx: &mut Ctx<'_>,
    key: &str,
    r: &RawRoute,
    matcher: &Matcher,
    upstreams: &[String],
) -> Option<ProxyAction> {
    let group = r.proxy.as_ref()?;
    let upstream = match upstreams.iter().position(|n| n == group.get_ref()) {
        Some(i) => i,
        None => {
            let message = if upstreams.is_empty() {
                format!(
                    "unknown upstream group {:?}: no upstream groups are defined (add [upstreams.{}])",
                    group.get_ref(),
                    quote_key(group.get_ref())
                )
            } else {
                let known: Vec<String> = upstreams.iter().map(|n| format!("{n:?}")).collect();
                format!(
                    "unknown upstream group {:?}; defined groups: {}",
                    group.get_ref(),
                    known.join(", ")
                )
            };
            ctx.error(start(group), &sub(key, "proxy"), message);
            0
        }
    };
    // The matched prefix without its trailing '/': "/api/**" -> "/api", "/**" -> "".
    let prefix = match &matcher.path {
        Some(PathMatch::Prefix(p)) => Some(p.strip_suffix('/').unwrap_or(p).to_string()),
        _ => None,
    };
    let needs_prefix = |option: &str| {
        format!("`{option}` needs a prefix path matcher on this route, such as path = \"/api/**\"")
    };
    let mut strip_prefix = None;
    let mut rewrite_prefix = None;
    if let (Some(strip), Some(rewrite)) = (&r.strip_prefix, &r.rewrite_prefix) {
        let (later_key, at) = if start(rewrite) > start(strip) {
            ("rewrite_prefix", start(rewrite))
        } else {
            ("strip_prefix", start(strip))
        };
        ctx.error(
            at,
            &sub(key, later_key),
            "strip_prefix and rewrite_prefix are mutually exclusive (rewrite_prefix already replaces the matched prefix)",
        );
    } else if let Some(strip) = &r.strip_prefix {
        let skey = sub(key, "strip_prefix");
        match (strip.get_ref(), &prefix) {
            (StrOrBool::Bool(false), _) => {}
            (_, None) => ctx.error(start(strip), &skey, needs_prefix("strip_prefix")),
            (StrOrBool::Bool(true), Some(prefix)) => {
                if prefix.is_empty() {
                    ctx.error(start(strip), &skey, "path \"/**\" has no prefix to strip");
                } else {
                    strip_prefix = Some(prefix.clone());
                }
            }
            (StrOrBool::Str(text), Some(prefix)) => {
                let trimmed = text.strip_suffix('/').unwrap_or(text);
                if !text.starts_with('/') || trimmed.is_empty() {
                    ctx.error(
                        start(strip),
                        &skey,
                        format!("strip_prefix {text:?} must start with '/' and not be just \"/\""),
                    );
                } else if prefix == trimmed || prefix.starts_with(&format!("{trimmed}/")) {
                    strip_prefix = Some(trimmed.to_string());
                } else {
                    ctx.error(
                        start(strip),
                        &skey,
                        format!(
                            "strip_prefix {text:?} must be the route's path prefix {prefix:?} or a leading part of it ending before a '/'"
                        ),
                    );
                }
            }
        }
    } else if let Some(rewrite) = &r.rewrite_prefix {
        let rkey = sub(key, "rewrite_prefix");
        let text = rewrite.get_ref();
        match &prefix {
            None => ctx.error(start(rewrite), &rkey, needs_prefix("rewrite_prefix")),
            Some(_) if !text.starts_with('/') => {
                ctx.error(start(rewrite), &rkey, format!("rewrite_prefix {text:?} must start with '/'"))
            }
            Some(_) if text.contains(['?', '#', ' ']) || text.chars().any(char::is_control) => ctx.error(
                start(rewrite),
                &rkey,
                format!("rewrite_prefix {text:?} must be a plain path (no query, fragment, spaces or control characters)"),
            ),
            Some(_) => rewrite_prefix = Some(format!("{}/", text.trim_end_matches('/'))),
        }
    }
    let flag =
        |v: &Option<Spanned<bool>>, default: bool| v.as_ref().map_or(default, |b| *b.get_ref());
    let retry = r
        .retry
        .as_ref()
        .map(|raw| retry(ctx, &sub(key, "retry"), raw));
    Some(ProxyAction {
        upstream,
        strip_prefix,
        rewrite_prefix,
        forwarded_headers: flag(&r.forwarded_headers, true),
        via: flag(&r.via, false),
        preserve_host: flag(&r.preserve_host, true),
        retry,
    })
}

/// The position of a retry table's first key (tables carry no span of their own).
fn retry_at(r: &RawRetry) -> Option<usize> {
    [
        r.retries.as_ref().map(start),
        r.on.as_ref().map(start),
        r.non_idempotent.as_ref().map(start),
        r.budget.as_ref().map(start),
        r.min_per_second.as_ref().map(start),
    ]
    .into_iter()
    .flatten()
    .min()
}

/// Names the retry `on` list accepts.
const RETRY_ON: &str = "\"connect\", \"reset\", \"timeout\", \"502\", \"503\", \"504\"";

fn retry(ctx: &mut Ctx<'_>, key: &str, raw: &RawRetry) -> RetryPolicy {
    let retries = int(ctx, raw.retries.as_ref(), &sub(key, "retries"), 1, 0, 10);
    let on = match &raw.on {
        None => RetryOn::DEFAULT,
        Some(list) => {
            let okey = sub(key, "on");
            let mut on = RetryOn {
                connect: false,
                reset: false,
                timeout: false,
                status_502: false,
                status_503: false,
                status_504: false,
            };
            let items = list.get_ref().items(start(list));
            if items.is_empty() {
                ctx.error(
                    start(list),
                    &okey,
                    format!("an empty list retries nothing; name one or more of {RETRY_ON}, or remove the retry table"),
                );
            }
            for (i, (name, at)) in items.into_iter().enumerate() {
                let flag = match name.as_str() {
                    "connect" => &mut on.connect,
                    "reset" => &mut on.reset,
                    "timeout" => &mut on.timeout,
                    "502" => &mut on.status_502,
                    "503" => &mut on.status_503,
                    "504" => &mut on.status_504,
                    _ => {
                        let ikey = if matches!(list.get_ref(), StrList::One(_)) {
                            okey.clone()
                        } else {
                            format!("{okey}[{i}]")
                        };
                        ctx.error(
                            at,
                            &ikey,
                            format!("unknown retry condition {name:?}; expected {RETRY_ON}"),
                        );
                        continue;
                    }
                };
                *flag = true;
            }
            on
        }
    };
    let budget = match &raw.budget {
        None => DEFAULT_RETRY_BUDGET,
        Some(b) => {
            let v = b.get_ref().0;
            if (0.0..=1.0).contains(&v) {
                v
            } else {
                ctx.error(
                    start(b),
                    &sub(key, "budget"),
                    format!("must be a share of requests between 0 and 1 (such as 0.2), found {v}"),
                );
                DEFAULT_RETRY_BUDGET
            }
        }
    };
    let min_per_second = int(
        ctx,
        raw.min_per_second.as_ref(),
        &sub(key, "min_per_second"),
        i64::from(DEFAULT_RETRY_MIN_PER_SECOND),
        0,
        1_000_000,
    );
    RetryPolicy {
        retries: u32::try_from(retries).unwrap_or(1),
        on,
        non_idempotent: raw.non_idempotent.as_ref().is_some_and(|b| *b.get_ref()),
        budget,
        min_per_second: u32::try_from(min_per_second).unwrap_or(DEFAULT_RETRY_MIN_PER_SECOND),
    }
}

fn respond(ctx: &mut Ctx<'_>, key: &str, raw: &RawRespond) -> Action {
    let status = match &raw.status {
        None => 200,
        Some(s) => match u16::try_from(s.get_ref().0) {
            Ok(code) if (200..=599).contains(&code) => code,
            _ => {
                ctx.error(
                    start(s),
                    &sub(key, "status"),
                    format!("invalid status {}: expected 200-599", s.get_ref().0),
                );
                200
            }
        },
    };
    let body = raw
        .body
        .as_ref()
        .map_or_else(String::new, |b| b.get_ref().clone());
    if let (Some(b), 204 | 205 | 304) = (&raw.body, status) {
        if !body.is_empty() {
            ctx.error(
                start(b),
                &sub(key, "body"),
                format!("a {status} response cannot have a body"),
            );
        }
    }
    let content_type = match &raw.content_type {
        None => DEFAULT_CONTENT_TYPE.to_string(),
        Some(c) => {
            let message = if c.get_ref().is_empty() {
                Some("content_type must not be empty".to_string())
            } else {
                header_value_error(c.get_ref())
            };
            if let Some(message) = message {
                ctx.error(start(c), &sub(key, "content_type"), message);
            }
            c.get_ref().clone()
        }
    };
    Action::Fixed {
        status,
        content_type,
        body,
    }
}

// ---------------------------------------------------------------------------------------------
// header rules

fn header_rules(ctx: &mut Ctx<'_>, key: &str, raw: Option<&RawHeaderRules>) -> HeaderRules {
    let mut rules = HeaderRules::default();
    let Some(raw) = raw else { return rules };
    let check_name = |ctx: &mut Ctx<'_>, name: &str, at: usize, key: &str| -> Option<String> {
        let lower = name.to_ascii_lowercase();
        let message = header_name_error(name).or_else(|| {
            MANAGED_HEADERS.contains(&lower.as_str()).then(|| {
                format!("{lower} is managed by the proxy (message framing, hop-by-hop) and cannot be changed by header rules")
            })
        });
        match message {
            Some(message) => {
                ctx.error(at, key, message);
                None
            }
            None => Some(lower),
        }
    };
    if let Some(remove) = &raw.remove {
        let rkey = sub(key, "remove");
        for (i, (name, at)) in remove
            .get_ref()
            .items(start(remove))
            .into_iter()
            .enumerate()
        {
            let nkey = if matches!(remove.get_ref(), StrList::One(_)) {
                rkey.clone()
            } else {
                format!("{rkey}[{i}]")
            };
            if let Some(lower) = check_name(ctx, &name, at, &nkey) {
                if !rules.remove.contains(&lower) {
                    rules.remove.push(lower);
                }
            }
        }
    }
    for (which, entries) in [("set", &raw.set), ("add", &raw.add)] {
        let Some(entries) = entries else { continue };
        let wkey = sub(key, which);
        for (name, value) in &entries.0 {
            let nkey = sub(&wkey, name.get_ref());
            let Some(lower) = check_name(ctx, name.get_ref(), start(name), &nkey) else {
                continue;
            };
            if let Some(message) = header_value_error(value.get_ref()) {
                ctx.error(start(value), &nkey, message);
                continue;
            }
            let pair = (lower, value.get_ref().clone());
            if which == "set" {
                if rules.set.iter().any(|(n, _)| *n == pair.0) {
                    ctx.error(
                        start(name),
                        &nkey,
                        format!(
                            "{} is set twice (header names are case-insensitive)",
                            pair.0
                        ),
                    );
                    continue;
                }
                rules.set.push(pair);
            } else {
                rules.add.push(pair);
            }
        }
    }
    rules
}

/// Error unless duration `long` is at least `short`, at `long`'s key when it was written, else
/// at `short`'s (the one the reader can change).
fn not_shorter(
    ctx: &mut Ctx<'_>,
    key: &str,
    long: (&str, Option<&Spanned<Scalar>>, Duration),
    short: (&str, Option<&Spanned<Scalar>>, Duration),
) {
    if long.2 >= short.2 {
        return;
    }
    let (at, which) = match (long.1, short.1) {
        (Some(l), _) => (start(l), long.0),
        (None, Some(s)) => (start(s), short.0),
        (None, None) => (0, long.0),
    };
    ctx.error(
        at,
        &sub(key, which),
        format!(
            "{} ({}) must not be shorter than {} ({})",
            long.0,
            crate::units::format_duration(long.2),
            short.0,
            crate::units::format_duration(short.2)
        ),
    );
}
