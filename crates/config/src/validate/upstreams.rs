//! Upstream groups: servers, balancing, health checks, passive checks, sticky cookies, queues, fallbacks.

use super::*;

pub(super) fn upstreams(
    ctx: &mut Ctx<'_>,
    raw: Option<&Entries<RawUpstream>>,
) -> Vec<Arc<UpstreamGroup>> {
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
pub(super) fn fallbacks(
    ctx: &mut Ctx<'_>,
    raw: &Entries<RawUpstream>,
    groups: &mut [UpstreamGroup],
) {
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

pub(super) fn health_check(
    ctx: &mut Ctx<'_>,
    key: &str,
    at: usize,
    raw: &RawHealthCheck,
) -> HealthCheck {
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

pub(super) fn http_check(ctx: &mut Ctx<'_>, key: &str, raw: &RawHealthCheck) -> HttpCheck {
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
pub(super) fn status_range(value: &Scalar) -> Result<(u16, u16), String> {
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

pub(super) fn passive(ctx: &mut Ctx<'_>, key: &str, raw: Option<&RawPassive>) -> PassiveCheck {
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

pub(super) fn upstream(
    ctx: &mut Ctx<'_>,
    name: &Spanned<String>,
    raw: &RawUpstream,
) -> UpstreamGroup {
    let key = sub("upstreams", name.get_ref());
    if let Some(message) = plain_text_error(name.get_ref(), "upstream group name") {
        ctx.error(start(name), &key, message);
    }
    let discovery = raw
        .discovery
        .as_ref()
        .and_then(|d| super::discovery::discovery(ctx, &sub(&key, "discovery"), d));
    let discovers = raw.discovery.is_some();
    let servers = match &raw.servers {
        None if discovers => Vec::new(),
        None => {
            ctx.error(
                start(name),
                &key,
                "upstream group has no `servers`; e.g. servers = [\"127.0.0.1:9001\"], or a `discovery`",
            );
            Vec::new()
        }
        Some(list) if list.get_ref().is_empty() && !discovers => {
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
    let proxy_protocol = raw.proxy_protocol.as_ref().and_then(|v| {
        let k = sub(&key, "proxy_protocol");
        let version = match v.get_ref().as_str() {
            "v1" => 1,
            "v2" => 2,
            other => {
                ctx.error(
                    start(v),
                    &k,
                    format!("unknown PROXY protocol version {other:?}: use \"v1\" (text) or \"v2\" (binary)"),
                );
                return None;
            }
        };
        if protocol == UpstreamProtocol::H2 {
            ctx.error(
                start(v),
                &k,
                "a PROXY header names one client per connection, and an HTTP/2 connection carries many clients' requests: use it with protocol = \"http1\"",
            );
        }
        Some(version)
    });
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
        discovery,
        proxy_protocol,
    }
}

/// `protocol = "http1" | "h2"` of an upstream group.
pub(super) fn upstream_protocol(
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
pub(super) fn sticky_cookie(
    ctx: &mut Ctx<'_>,
    key: &str,
    raw: &Spanned<RawSticky>,
) -> Option<StickyCookie> {
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
pub(super) fn queue(
    ctx: &mut Ctx<'_>,
    key: &str,
    raw: &RawUpstream,
    limit: i64,
) -> (u32, Duration) {
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

pub(super) fn servers(ctx: &mut Ctx<'_>, key: &str, list: &[Spanned<ServerSpec>]) -> Vec<Server> {
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

pub(super) fn balance(ctx: &mut Ctx<'_>, key: &str, raw: Option<&RawBalance>) -> Balance {
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
