//! `explain`: a short human summary of a validated configuration, for `portico check`.

use std::fmt::Write as _;

use crate::model::{
    AccessLogFormat, Action, Balance, Coding, Compression, Config, Cors, HeaderRules,
    HealthCheckKind, HostMatch, ListenerLimits, Matcher, OriginPattern, PathMatch, ProxyAction,
    RateLimitKey, RetryPolicy, Route, SplitKey, StaticAction, UpstreamGroup,
    DEFAULT_MAX_BODY_BYTES,
};
use crate::units::{format_duration, format_size};

/// Listeners (address, limits that differ from the defaults), each route (matcher -> action),
/// upstream groups (servers with weights, balance, timeouts, pool size), access log, workers.
pub fn explain(config: &Config) -> String {
    let mut out = String::new();
    for listener in &config.listeners {
        let _ = writeln!(out, "listener {:?} on {}", listener.name, listener.address);
        if let Some(tls) = &listener.tls {
            let versions: Vec<&str> = tls
                .versions
                .iter()
                .map(|v| match v {
                    crate::model::TlsVersion::Tls12 => "1.2",
                    crate::model::TlsVersion::Tls13 => "1.3",
                })
                .collect();
            let resumption = match (tls.session_tickets, tls.session_cache) {
                (true, 0) => "tickets".to_string(),
                (true, n) => format!("tickets, cache {n}"),
                (false, 0) => "no resumption".to_string(),
                (false, n) => format!("cache {n}"),
            };
            let _ = writeln!(out, "  tls: TLS {}; {resumption}", versions.join(", "));
            if let Some(a) = &listener.acme {
                let how = match &a.challenge {
                    crate::model::AcmeChallenge::Http01 => {
                        "HTTP-01, answered on every listener".to_string()
                    }
                    crate::model::AcmeChallenge::TlsAlpn01 => {
                        "TLS-ALPN-01, answered by this listener".to_string()
                    }
                    crate::model::AcmeChallenge::Dns01 { hook, delay } => format!(
                        "DNS-01, TXT records published by {}{}",
                        hook.display(),
                        match delay.is_zero() {
                            true => String::new(),
                            false => format!(" then {} of waiting", format_duration(*delay)),
                        }
                    ),
                };
                let profile = a
                    .profile
                    .as_ref()
                    .map_or(String::new(), |p| format!(", profile {p}"));
                let _ = writeln!(
                    out,
                    "    certificate for {} from ACME ({}, {how}; {} key{profile}), kept in {}; renewed when the server's renewal information says, else at two thirds of its lifetime",
                    a.names.join(", "),
                    a.directory,
                    a.key_type.name(),
                    a.storage.display()
                );
                let before = match a.refuse_unissued {
                    true => "handshakes refused",
                    false => "a self-signed stand-in served",
                };
                let _ = writeln!(out, "    until it is issued: {before}");
            }
            match tls.watch {
                Some(every) => {
                    let _ = writeln!(
                        out,
                        "    files watched every {}: changed certificates load without a restart",
                        format_duration(every)
                    );
                }
                None => out.push_str("    files not watched: a reload re-reads them\n"),
            }
            if let Some(suites) = &tls.cipher_suites {
                let _ = writeln!(out, "    cipher suites {}", suites.join(", "));
            }
            if let Some(groups) = &tls.groups {
                let _ = writeln!(out, "    groups {}", groups.join(", "));
            }
            if let Some(ca) = &tls.client_auth {
                let mode = if ca.required { "required" } else { "optional" };
                let _ = writeln!(
                    out,
                    "    client certificates {mode}, CA {}",
                    ca.ca.display()
                );
            }
            for (i, c) in tls.certificates.iter().enumerate() {
                let default = if i == 0 { " (default)" } else { "" };
                let _ = writeln!(
                    out,
                    "    certificate {} key {}{default}",
                    c.cert.display(),
                    c.key.display()
                );
            }
        }
        if let Some(shed) = &listener.shed {
            let _ = writeln!(
                out,
                "  shed: fast 503 for new requests while a worker's event loop lags more than {} (after {} above it)",
                format_duration(shed.target),
                format_duration(shed.interval)
            );
        }
        if listener.proxy_protocol {
            let from = match listener.trusted_proxies.is_empty() {
                true => "any peer",
                false => "trusted_proxies only",
            };
            let _ = writeln!(
                out,
                "  proxy_protocol: every connection starts with a PROXY header (v1 or v2); its client believed from {from}"
            );
        }
        let limits = limits_diff(&listener.limits);
        if !limits.is_empty() {
            let _ = writeln!(out, "  limits: {}", limits.join(", "));
        }
        if let Some(line) = http2_line(listener) {
            let _ = writeln!(out, "  {line}");
        }
        if let Some(h) = &listener.http3 {
            let _ = writeln!(out, "  {}", http3_line(h, listener.address.port()));
        }
        for route in &listener.routes {
            let _ = writeln!(
                out,
                "  route {:?}: {} -> {}",
                route.name,
                matcher(&route.matcher),
                action(route, config)
            );
            let extras = route_extras(route, config);
            if !extras.is_empty() {
                let _ = writeln!(out, "    {}", extras.join("; "));
            }
        }
    }
    for group in &config.upstreams {
        let _ = writeln!(
            out,
            "upstream {:?}: {}",
            group.name,
            upstream_summary(group)
        );
        for server in &group.servers {
            let _ = writeln!(out, "  server {} weight {}", server.address, server.weight);
        }
        if let Some(d) = &group.discovery {
            let _ = writeln!(
                out,
                "  discovery: {}",
                discovery_summary(d, &config.resolver)
            );
        }
        let _ = writeln!(out, "  health_check: {}", health_summary(group));
        let _ = writeln!(out, "  passive: {}", passive_summary(group));
        if let Some(s) = &group.sticky_cookie {
            let _ = writeln!(
                out,
                "  sticky_cookie: Set-Cookie: {} (the value names the chosen server)",
                s.set_cookie("ID")
            );
        }
        if group.queue > 0 {
            let _ = writeln!(
                out,
                "  queue: up to {} requests wait at most {} for a server below max_connections_per_server, then 503",
                group.queue,
                format_duration(group.queue_timeout)
            );
        }
        if group.protocol == crate::model::UpstreamProtocol::H2 {
            let _ = writeln!(
                out,
                "  protocol: h2 ({}), requests multiplexed over few connections per server and worker",
                if group.tls.is_some() { "TLS with ALPN h2" } else { "h2c, prior knowledge" }
            );
        }
        if let Some(tls) = &group.tls {
            let _ = writeln!(out, "  tls: {}", upstream_tls_summary(tls));
        }
        if let Some(v) = group.proxy_protocol {
            let _ = writeln!(
                out,
                "  proxy_protocol: v{v}: each connection starts with a PROXY header naming its client; a new connection per request"
            );
        }
        if let Some(fallback) = group.fallback.and_then(|i| config.upstreams.get(i)) {
            let _ = writeln!(
                out,
                "  fallback: {:?} when no server is available",
                fallback.name
            );
        }
    }
    match &config.access_log {
        None => out.push_str("access log: off\n"),
        Some(log) => {
            let format = match log.format {
                AccessLogFormat::Combined => "combined",
                AccessLogFormat::Json => "json",
            };
            let target = log
                .path
                .as_ref()
                .map_or_else(|| "stdout".to_string(), |p| p.display().to_string());
            let _ = writeln!(out, "access log: {format} to {target}");
        }
    }
    let log = &config.log;
    if *log != crate::model::LogSettings::default() {
        let _ = writeln!(
            out,
            "error log: {} at {} to {}",
            match log.format {
                crate::model::LogFormat::Text => "text",
                crate::model::LogFormat::Json => "json",
            },
            log.level.as_deref().unwrap_or("info"),
            log.path
                .as_ref()
                .map_or_else(|| "stderr".to_string(), |p| p.display().to_string())
        );
    }
    if let Some(t) = &config.trace {
        let _ = writeln!(
            out,
            "tracing: W3C traceparent; {}% of new traces sampled; spans {}",
            f64::from(t.sample_basis_points) / 100.0,
            match &t.otlp_endpoint {
                Some(u) => format!(
                    "to {}://{}{} (OTLP/HTTP JSON, service {})",
                    if u.https { "https" } else { "http" },
                    u.authority(),
                    u.target,
                    t.service_name
                ),
                None => "not exported (no otlp_endpoint)".to_string(),
            }
        );
    }
    if let Some(c) = &config.cache {
        let _ = writeln!(
            out,
            "response cache: {} in memory{}, objects up to {}, misses of one URL wait up to {} for its fetch{}",
            format_size(c.memory),
            c.disk.as_ref().map_or_else(String::new, |d| format!(
                " and {} on disk in {}",
                format_size(d.size),
                d.path.display()
            )),
            format_size(c.max_object),
            format_duration(c.lock_timeout),
            c.tag_header
                .as_ref()
                .map_or_else(String::new, |t| format!(", tags from {t}"))
        );
    }
    if let Some(r) = &config.request_id {
        let _ = writeln!(
            out,
            "request ids: in {}, {}{}",
            r.header,
            if r.from_client {
                "the client's kept when well formed"
            } else {
                "always generated"
            },
            if r.response {
                ", returned to clients"
            } else {
                ""
            }
        );
    }
    match &config.admin {
        None => {}
        Some(a) => {
            let auth = if a.token.is_some() {
                "bearer token required"
            } else {
                "no token (loopback only)"
            };
            let _ = writeln!(
                out,
                "admin: http://{}/ (status API, /metrics, dashboard), {auth}",
                a.address
            );
            if let Some(f) = &a.state_file {
                let _ = writeln!(out, "  runtime changes kept in {}", f.display());
            }
        }
    }
    if let Some(f) = &config.fleet {
        let down = match f.on_redis_down {
            crate::model::FleetFallback::Local => format!(
                "each instance limits to 1/{} of the rate on its own",
                f.instances
            ),
            crate::model::FleetFallback::Closed => "fleet-limited requests get 429".to_string(),
        };
        let _ = writeln!(
            out,
            "fleet: rate limits with scope \"fleet\" count through {} (keys {}:*), counts exchanged every {}; while Redis cannot be reached {down}",
            f.redis_shown(),
            f.prefix,
            format_duration(f.sync_interval)
        );
    }
    let workers = config
        .workers
        .map_or_else(|| "one per core".to_string(), |w| w.to_string());
    let _ = writeln!(
        out,
        "workers: {workers}; drain_timeout {}",
        format_duration(config.drain_timeout)
    );
    out
}

fn limits_diff(limits: &ListenerLimits) -> Vec<String> {
    let d = ListenerLimits::DEFAULT;
    let mut out = Vec::new();
    let mut push = |differs: bool, name: &str, value: String, default: String| {
        if differs {
            out.push(format!("{name} {value} (default {default})"));
        }
    };
    push(
        limits.max_connections != d.max_connections,
        "max_connections",
        limits.max_connections.to_string(),
        d.max_connections.to_string(),
    );
    push(
        limits.max_headers != d.max_headers,
        "max_headers",
        limits.max_headers.to_string(),
        d.max_headers.to_string(),
    );
    push(
        limits.max_head_bytes != d.max_head_bytes,
        "max_head_bytes",
        format_size(limits.max_head_bytes as u64),
        format_size(d.max_head_bytes as u64),
    );
    push(
        limits.max_request_line != d.max_request_line,
        "max_request_line",
        format_size(limits.max_request_line as u64),
        format_size(d.max_request_line as u64),
    );
    push(
        limits.head_timeout != d.head_timeout,
        "head_timeout",
        format_duration(limits.head_timeout),
        format_duration(d.head_timeout),
    );
    push(
        limits.keepalive_timeout != d.keepalive_timeout,
        "keepalive_timeout",
        format_duration(limits.keepalive_timeout),
        format_duration(d.keepalive_timeout),
    );
    push(
        limits.send_timeout != d.send_timeout,
        "send_timeout",
        format_duration(limits.send_timeout),
        format_duration(d.send_timeout),
    );
    push(
        limits.body_min_rate != d.body_min_rate,
        "body_min_rate",
        format!("{}/s", format_size(limits.body_min_rate)),
        format!("{}/s", format_size(d.body_min_rate)),
    );
    let unlimited = |n: u64| {
        if n == 0 {
            "unlimited".to_string()
        } else {
            n.to_string()
        }
    };
    push(
        limits.max_connections_per_client != d.max_connections_per_client,
        "max_connections_per_client",
        unlimited(u64::from(limits.max_connections_per_client)),
        unlimited(u64::from(d.max_connections_per_client)),
    );
    push(
        limits.max_requests_per_connection != d.max_requests_per_connection,
        "max_requests_per_connection",
        unlimited(limits.max_requests_per_connection),
        unlimited(d.max_requests_per_connection),
    );
    out
}

/// What a route's matcher takes, in words (`host api.example.com, path /api/**`).
pub fn matcher(m: &Matcher) -> String {
    let mut parts = Vec::new();
    if !m.hosts.is_empty() {
        let hosts: Vec<String> = m
            .hosts
            .iter()
            .map(|h| match h {
                HostMatch::Exact(name) => name.clone(),
                HostMatch::Suffix(suffix) => format!("*{suffix}"),
            })
            .collect();
        parts.push(format!("host {}", hosts.join("|")));
    }
    match &m.path {
        None => {}
        Some(PathMatch::Exact(p)) => parts.push(format!("path = {p}")),
        Some(PathMatch::Prefix(p)) => parts.push(format!("path {p}**")),
        Some(PathMatch::Regex(re)) => parts.push(format!("path ~ {}", re.0.as_str())),
    }
    if !m.methods.is_empty() {
        parts.push(format!("methods {}", m.methods.join("|")));
    }
    for (name, value) in &m.headers {
        match value {
            Some(v) => parts.push(format!("header {name}: {v}")),
            None => parts.push(format!("header {name} present")),
        }
    }
    if parts.is_empty() {
        "any request".to_string()
    } else {
        parts.join(", ")
    }
}

fn files(s: &StaticAction) -> String {
    if s.index.is_empty() {
        "no index files".to_string()
    } else {
        format!("index {}", s.index.join(", "))
    }
}

fn action(route: &Route, config: &Config) -> String {
    match &route.action {
        Action::Proxy(p) => {
            let group = config
                .upstreams
                .get(p.upstream)
                .map_or("?", |g| g.name.as_str());
            let mut options = Vec::new();
            if let Some(strip) = &p.strip_prefix {
                options.push(format!("strip {strip}"));
            }
            if let (Some(to), Some(PathMatch::Prefix(from))) =
                (&p.rewrite_prefix, &route.matcher.path)
            {
                options.push(format!("rewrite {from} -> {to}"));
            }
            if let Some(t) = &p.rewrite {
                options.push(format!("rewrite to {t}"));
            }
            if let Some(s) = &p.split {
                let shares: Vec<String> = s
                    .shares
                    .iter()
                    .map(|(g, bp)| {
                        let name = config.upstreams.get(*g).map_or("?", |u| u.name.as_str());
                        format!("{}% to {name:?}", f64::from(*bp) / 100.0)
                    })
                    .collect();
                let by = match &s.key {
                    SplitKey::Random => "at random".to_string(),
                    SplitKey::ClientIp => "by client IP".to_string(),
                    SplitKey::Header(h) => format!("by header {h}"),
                    SplitKey::Cookie(c) => format!("by cookie {c}"),
                };
                options.push(format!("split {} {by}", shares.join(", ")));
            }
            if let Some(m) = &p.mirror {
                let name = config
                    .upstreams
                    .get(m.group)
                    .map_or("?", |u| u.name.as_str());
                options.push(format!(
                    "mirror {}% to {name:?}",
                    f64::from(m.basis_points) / 100.0
                ));
            }
            if let Some(b) = &p.buffer {
                options.push(format!(
                    "request bodies buffered ({} in memory, then files in {})",
                    format_size(b.memory),
                    b.directory.display()
                ));
            }
            if !p.forwarded_headers {
                options.push("no X-Forwarded-*".to_string());
            }
            if p.via {
                options.push("Via".to_string());
            }
            if !p.preserve_host {
                options.push("Host = server address".to_string());
            }
            if options.is_empty() {
                format!("proxy to {group:?}")
            } else {
                format!("proxy to {group:?} ({})", options.join(", "))
            }
        }
        Action::Static(s) => {
            let root = s
                .root
                .as_ref()
                .map_or_else(|| "?".to_string(), |r| r.display().to_string());
            format!("static files from {root} ({})", files(s))
        }
        Action::Origin(s) => match &s.root {
            None => "origin (synthetic responses)".to_string(),
            Some(root) => format!(
                "origin (synthetic responses, files from {} with {})",
                root.display(),
                files(s)
            ),
        },
        Action::Redirect { status, location } => format!("redirect {status} to {location}"),
        Action::Fixed {
            status,
            content_type,
            body,
        } => {
            format!("respond {status} {content_type} ({} bytes)", body.len())
        }
    }
}

fn rules(which: &str, rules: &HeaderRules) -> Option<String> {
    let mut parts = Vec::new();
    if !rules.remove.is_empty() {
        parts.push(format!("remove {}", rules.remove.join(", ")));
    }
    if !rules.set.is_empty() {
        let names: Vec<&str> = rules.set.iter().map(|(n, _)| n.as_str()).collect();
        parts.push(format!("set {}", names.join(", ")));
    }
    if !rules.add.is_empty() {
        let names: Vec<&str> = rules.add.iter().map(|(n, _)| n.as_str()).collect();
        parts.push(format!("add {}", names.join(", ")));
    }
    (!parts.is_empty()).then(|| format!("{which} headers: {}", parts.join(", ")))
}

fn route_extras(route: &Route, config: &Config) -> Vec<String> {
    let mut out = Vec::new();
    if route.max_body_bytes != DEFAULT_MAX_BODY_BYTES {
        if route.max_body_bytes == 0 {
            out.push("max_body unlimited".to_string());
        } else {
            out.push(format!("max_body {}", format_size(route.max_body_bytes)));
        }
    }
    out.extend(rules("request", &route.request_headers));
    out.extend(rules("response", &route.response_headers));
    if let Action::Proxy(ProxyAction { retry: Some(r), .. }) = &route.action {
        out.push(retry_summary(r));
    }
    if let Some(l) = &route.rate_limit {
        let by = match &l.key {
            RateLimitKey::ClientIp => "client IP".to_string(),
            RateLimitKey::Header(h) => format!("header {h} (else client IP)"),
            RateLimitKey::Cookie(c) => format!("cookie {c} (else client IP)"),
        };
        out.push(match l.fleet {
            true => format!(
                "rate_limit: {}/s per {by} over the whole fleet (a sliding one-second window counted in Redis), at most {} keys; over it 429 with Retry-After",
                l.rate, l.max_keys
            ),
            false => format!(
                "rate_limit: {}/s per {by}, burst {}, at most {} keys; over it 429 with Retry-After",
                l.rate, l.burst, l.max_keys
            ),
        });
    }
    if let Action::Proxy(ProxyAction { cache: Some(c), .. }) = &route.action {
        out.push(cache_summary(c));
    }
    if let Some(c) = &route.compression {
        out.push(compression_summary(c));
    }
    if let Some(c) = &route.cors {
        out.push(cors_summary(c));
    }
    if let Some(a) = &route.basic_auth {
        out.push(format!(
            "basic_auth: {} user(s), realm {:?}{}",
            a.users.len(),
            a.realm,
            if a.keep_authorization {
                ", Authorization passed on"
            } else {
                ""
            }
        ));
    }
    if let Some(j) = &route.jwt {
        out.push(jwt_summary(j));
    }
    if let Some(c) = &route.client_cert {
        let mut parts = Vec::new();
        for (what, list) in [
            ("subject", &c.subject),
            ("SAN", &c.san),
            ("issuer", &c.issuer),
        ] {
            if !list.is_empty() {
                parts.push(format!("{what} {}", list.join(" | ")));
            }
        }
        out.push(format!(
            "client_cert: {}, 403 otherwise",
            parts.join(" and ")
        ));
    }
    if let Some(f) = &route.forward_auth {
        let group = config
            .upstreams
            .get(f.group)
            .map_or("?", |u| u.name.as_str());
        let mut text = format!(
            "forward_auth: ask {group:?} ({}) with {}",
            f.path.as_deref().unwrap_or("the request's target"),
            f.request_headers.join(", ")
        );
        if !f.copy_headers.is_empty() {
            text.push_str(&format!(
                "; its {} set on the request",
                f.copy_headers.join(", ")
            ));
        }
        if !f.cache.is_zero() {
            text.push_str(&format!("; passes cached {}", format_duration(f.cache)));
        }
        if f.fail_open {
            text.push_str("; fails open");
        }
        out.push(text);
    }
    if let Some(r) = &route.ip_rules {
        out.push(format!(
            "ip_rules: {} address ranges, first match decides, 403 when it denies",
            r.ranges()
        ));
    }
    if let Action::Static(s) = &route.action {
        if !s.precompressed.is_empty() {
            let names: Vec<&str> = s.precompressed.iter().map(|c| c.token()).collect();
            out.push(format!("precompressed siblings: {}", names.join(", ")));
        }
    }
    out
}

fn cors_summary(c: &Cors) -> String {
    let origins: Vec<String> = c
        .origins
        .iter()
        .map(|o| match o {
            OriginPattern::Exact(e) => e.clone(),
            OriginPattern::Subdomains { scheme, suffix } => format!("{scheme}*{suffix}"),
        })
        .collect();
    let origins = match origins.is_empty() {
        true => "any origin".to_string(),
        false => origins.join(", "),
    };
    let headers = match &c.headers {
        None => "any".to_string(),
        Some(h) if h.is_empty() => "safelisted only".to_string(),
        Some(h) => h.join(", "),
    };
    let mut text = format!(
        "cors: {origins}; methods {}; request headers {headers}",
        c.methods.join(", ")
    );
    if c.credentials {
        text.push_str("; credentials");
    }
    if let Some(age) = c.max_age {
        text.push_str(&format!("; preflights cached {}", format_duration(age)));
    }
    text
}

fn compression_summary(c: &Compression) -> String {
    let levels: Vec<String> = c
        .algorithms
        .iter()
        .map(|a| match a {
            Coding::Zstd => format!("zstd {}", c.zstd_level),
            Coding::Br => format!("br {}", c.brotli_level),
            Coding::Gzip => format!("gzip {}", c.gzip_level),
        })
        .collect();
    format!(
        "compression: {} (in this order), responses of {} from {} bytes or of unknown length",
        levels.join(", "),
        c.types.join(", "),
        c.min_length
    )
}

fn cache_summary(c: &crate::model::RouteCache) -> String {
    use crate::model::QueryKey;
    let mut key = String::from("host, path");
    match &c.query {
        QueryKey::All => key.push_str(", query"),
        QueryKey::None => {}
        QueryKey::Only(p) => key.push_str(&format!(", query parameters {}", p.join(", "))),
        QueryKey::Except(p) => key.push_str(&format!(", query without {}", p.join(", "))),
    }
    for h in &c.key_headers {
        key.push_str(&format!(", {h}"));
    }
    for k in &c.key_cookies {
        key.push_str(&format!(", cookie {k}"));
    }
    let mut text = format!("cache: GET and HEAD by {key}");
    match (c.override_ttl, c.default_ttl) {
        (Some(t), _) => text.push_str(&format!(
            "; fresh for {} whatever responses say",
            format_duration(t)
        )),
        (None, Some(t)) => text.push_str(&format!(
            "; {} when a response states no lifetime",
            format_duration(t)
        )),
        (None, None) => {}
    }
    if !c.stale_if_error.is_zero() {
        text.push_str(&format!(
            "; stale up to {} when the upstream fails",
            format_duration(c.stale_if_error)
        ));
    }
    let bypass: Vec<String> = c
        .bypass_headers
        .iter()
        .cloned()
        .chain(c.bypass_cookies.iter().map(|k| format!("cookie {k}")))
        .collect();
    if !bypass.is_empty() {
        text.push_str(&format!("; bypassed by {}", bypass.join(", ")));
    }
    if !c.lock {
        text.push_str("; concurrent misses all fetch");
    }
    text
}

fn retry_summary(r: &RetryPolicy) -> String {
    let methods = if r.non_idempotent {
        "any method"
    } else {
        "idempotent methods"
    };
    format!(
        "retry: up to {} on {} ({methods}, requests without a body), another server when one is available; budget {}% of requests + {}/s",
        r.retries,
        r.on.names().join(", "),
        (r.budget * 1000.0).round() / 10.0,
        r.min_per_second
    )
}

fn upstream_summary(group: &UpstreamGroup) -> String {
    let balance = match &group.balance {
        Balance::RoundRobin => "round_robin".to_string(),
        Balance::LeastConnections => "least_connections".to_string(),
        Balance::TwoRandomChoices => "two_random_choices".to_string(),
        Balance::HashClientIp => "hash_client_ip".to_string(),
        Balance::HashHeader(name) => format!("hash_header {name}"),
        Balance::HashCookie(name) => format!("hash_cookie {name}"),
    };
    let per_server = if group.max_connections_per_server == 0 {
        "unlimited".to_string()
    } else {
        group.max_connections_per_server.to_string()
    };
    format!(
        "{balance}; connect_timeout {}, response_header_timeout {}, idle_timeout {}; keepalive {} idle per server; max_connections_per_server {per_server}",
        format_duration(group.connect_timeout),
        format_duration(group.response_header_timeout),
        format_duration(group.idle_timeout),
        group.keepalive,
    )
}

fn upstream_tls_summary(tls: &crate::model::UpstreamTls) -> String {
    let versions: Vec<&str> = tls
        .versions
        .iter()
        .map(|v| match v {
            crate::model::TlsVersion::Tls12 => "1.2",
            crate::model::TlsVersion::Tls13 => "1.3",
        })
        .collect();
    let verify = match (tls.verify, &tls.ca_file) {
        (false, _) => "certificates NOT verified (verify = false)".to_string(),
        (true, Some(ca)) => format!("verified against {}", ca.display()),
        (true, None) => "verified against the system roots".to_string(),
    };
    let name = match &tls.server_name {
        Some(n) => format!("server name {n}"),
        None => "server name: each server's IP address".to_string(),
    };
    let client = match &tls.certificate {
        Some(c) => format!(
            "client certificate {} key {}",
            c.cert.display(),
            c.key.display()
        ),
        None => "no client certificate".to_string(),
    };
    let resumption = match tls.session_cache {
        0 => "no resumption".to_string(),
        n => format!("session cache {n}"),
    };
    format!(
        "HTTPS, TLS {}; {verify}; {name}; {client}; {resumption}",
        versions.join(", ")
    )
}

fn health_summary(group: &UpstreamGroup) -> String {
    let Some(h) = &group.health_check else {
        return "off (servers are only taken out by passive checks and the admin)".to_string();
    };
    let probe = match &h.kind {
        HealthCheckKind::Tcp => "tcp connect".to_string(),
        HealthCheckKind::Http(c) => {
            let host = c
                .host
                .as_ref()
                .map_or_else(|| "the server address".to_string(), |h| h.clone());
            let (lo, hi) = c.expect_status;
            let status = if lo == hi {
                lo.to_string()
            } else {
                format!("{lo}-{hi}")
            };
            let body = c
                .expect_body
                .as_ref()
                .map_or_else(String::new, |b| format!(", body contains {b:?}"));
            format!(
                "http {} {} (Host {host}) expecting {status}{body}",
                c.method, c.path
            )
        }
    };
    format!(
        "{probe}; every {}, timeout {}; down after {} failed, up after {} passed",
        format_duration(h.interval),
        format_duration(h.timeout),
        h.fall,
        h.rise
    )
}

fn passive_summary(group: &UpstreamGroup) -> String {
    let p = &group.passive;
    let ejection = if p.max_failures == 0 {
        "off".to_string()
    } else {
        format!(
            "eject after {} consecutive failures for {} (doubling on repeats, at most {}), at most {}% of servers",
            p.max_failures,
            format_duration(p.ejection),
            format_duration(p.max_ejection),
            p.max_ejected_percent
        )
    };
    let slow_start = if p.slow_start.is_zero() {
        "off".to_string()
    } else {
        format_duration(p.slow_start)
    };
    format!("{ejection}; slow_start {slow_start}")
}

/// HTTP/2 settings that differ from the defaults (HTTP/2 is on by default: ALPN `h2` on TLS
/// listeners, h2c with prior knowledge on plain ones), `None` when all are defaults.
fn http2_line(listener: &crate::model::Listener) -> Option<String> {
    let h = &listener.http2;
    let d = crate::model::Http2Settings::DEFAULT;
    if !h.enabled {
        return Some("http2: off (HTTP/1.1 only)".into());
    }
    let mut diff = Vec::new();
    let mut num = |name: &str, v: u32, dv: u32, size: bool| {
        if v != dv {
            let f = |n: u32| {
                if size {
                    format_size(u64::from(n))
                } else {
                    n.to_string()
                }
            };
            diff.push(format!("{name} {} (default {})", f(v), f(dv)));
        }
    };
    num(
        "max_concurrent_streams",
        h.max_concurrent_streams,
        d.max_concurrent_streams,
        false,
    );
    num(
        "max_header_list_size",
        h.max_header_list_size,
        d.max_header_list_size,
        true,
    );
    num(
        "initial_window_size",
        h.initial_window_size,
        d.initial_window_size,
        true,
    );
    num("max_frame_size", h.max_frame_size, d.max_frame_size, true);
    num("max_resets", h.max_resets, d.max_resets, false);
    if h.reset_window != d.reset_window {
        diff.push(format!(
            "reset_window {} (default {})",
            format_duration(h.reset_window),
            format_duration(d.reset_window)
        ));
    }
    if h.extended_connect != d.extended_connect {
        diff.push("extended_connect off (no WebSockets over HTTP/2; default on)".into());
    }
    if diff.is_empty() {
        return None;
    }
    let how = if listener.tls.is_some() {
        "ALPN h2"
    } else {
        "h2c"
    };
    Some(format!("http2 ({how}): {}", diff.join(", ")))
}

/// HTTP/3: the UDP port, the advertisement, and the settings that differ from the defaults.
fn http3_line(h: &crate::model::Http3Settings, port: u16) -> String {
    let d = crate::model::Http3Settings::DEFAULT;
    let port = match port {
        0 => "the listener's port".to_string(),
        p => format!("UDP {p}"),
    };
    let mut parts = vec![match h.alt_svc_max_age {
        Some(ma) => format!("advertised by Alt-Svc for {}", format_duration(ma)),
        None => "not advertised (no Alt-Svc)".to_string(),
    }];
    if h.idle_timeout != d.idle_timeout {
        parts.push(format!("idle_timeout {}", format_duration(h.idle_timeout)));
    }
    if h.max_concurrent_streams != d.max_concurrent_streams {
        parts.push(format!(
            "max_concurrent_streams {}",
            h.max_concurrent_streams
        ));
    }
    if h.stream_window != d.stream_window || h.connection_window != d.connection_window {
        parts.push(format!(
            "windows {} per stream, {} per connection",
            format_size(u64::from(h.stream_window)),
            format_size(u64::from(h.connection_window))
        ));
    }
    if h.congestion != d.congestion {
        parts.push(format!("congestion {}", h.congestion.as_str()));
    }
    if let Some(k) = h.keep_alive_interval {
        parts.push(format!("keep-alive PING every {}", format_duration(k)));
    }
    if h.validate_above != d.validate_above {
        parts.push(match h.validate_above {
            0 => "every new client validated with a Retry".to_string(),
            n => format!("Retry above {n} handshakes in progress"),
        });
    }
    if h.early_data {
        parts.push("0-RTT for safe methods (Early-Data: 1)".to_string());
    }
    format!("http3 (QUIC on {port}): {}", parts.join(", "))
}

fn jwt_summary(j: &crate::model::Jwt) -> String {
    let keys = match &j.keys {
        crate::model::JwtKeys::File(f) => format!("keys from {}", f.display()),
        crate::model::JwtKeys::Url { url, refresh } => {
            format!("keys from {url} (every {})", format_duration(*refresh))
        }
    };
    let algs: Vec<String> = j.algorithms.iter().map(|a| format!("{a:?}")).collect();
    let mut places = Vec::new();
    if let Some(h) = &j.header {
        places.push(format!("header {h}"));
    }
    if let Some(c) = &j.cookie {
        places.push(format!("cookie {c}"));
    }
    if let Some(q) = &j.query {
        places.push(format!("query {q}"));
    }
    let mut text = format!(
        "jwt: {keys}; {}; token from {}",
        algs.join(", "),
        places.join(", then ")
    );
    if !j.issuers.is_empty() {
        text.push_str(&format!("; iss {}", j.issuers.join(" | ")));
    }
    if !j.audiences.is_empty() {
        text.push_str(&format!("; aud {}", j.audiences.join(" | ")));
    }
    for (c, v) in &j.claims {
        text.push_str(&format!("; {c} = {}", v.join(" | ")));
    }
    for (c, f) in &j.forward_claims {
        text.push_str(&format!("; {c} -> {f}"));
    }
    text
}

/// What a group's `discovery` asks, how often, and of whom.
fn discovery_summary(d: &crate::model::Discovery, r: &crate::model::Resolver) -> String {
    use crate::model::{AddressFamily, DiscoverySource};
    let family = match d.family {
        AddressFamily::Any => "A and AAAA",
        AddressFamily::Ipv4 => "A",
        AddressFamily::Ipv6 => "AAAA",
    };
    let what = match &d.source {
        DiscoverySource::Dns { name, port } => {
            format!("{family} records of {name} on port {port}, weight {}", d.weight)
        }
        DiscoverySource::Srv { name } => format!(
            "SRV records of {name} (lowest priority present; ports and weights from the records; targets' {family})"
        ),
        DiscoverySource::Etcd {
            name,
            interval,
            client,
            ..
        } => {
            let user = client
                .username
                .as_ref()
                .map_or(String::new(), |u| format!(" as etcd user {u}"));
            return format!(
                "servers registered under {name}/{user} (weight {} unless a registration gives one), watched, and read at each change and every {}; kept {} after the last one is gone, and while etcd does not answer",
                d.weight,
                format_duration(*interval),
                format_duration(r.hold)
            )
        }
    };
    let whom = match r.nameservers.is_empty() {
        true => "the system's name servers".to_string(),
        false => r
            .nameservers
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(", "),
    };
    format!(
        "{what}; asked of {whom} again as the TTL expires (between {} and {}); kept {} after the name is gone, and while lookups fail",
        format_duration(r.min_ttl),
        format_duration(r.max_ttl),
        format_duration(r.hold)
    )
}
