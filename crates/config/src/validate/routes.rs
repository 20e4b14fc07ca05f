//! Routes: matchers, actions (proxy, static, origin, redirect, respond), retries, rate limits, header rules.

use super::*;

/// What a route takes from its listener when it does not say.
#[derive(Clone, Copy)]
pub(super) struct RouteDefaults<'a> {
    pub compression: Option<&'a Compression>,
    pub ip_rules: Option<&'a IpRules>,
    pub basic_auth: Option<&'a Arc<BasicAuth>>,
    pub jwt: Option<&'a Arc<crate::model::Jwt>>,
    pub client_cert: Option<&'a Arc<crate::model::ClientCertRules>>,
    /// The listener asks for client certificates (`client_auth`).
    pub mtls: bool,
}

pub(super) fn route(
    ctx: &mut Ctx<'_>,
    key: &str,
    listener: &str,
    index: usize,
    item: &Spanned<RawRoute>,
    upstreams: &[String],
    defaults: RouteDefaults<'_>,
) -> Option<Route> {
    let listener_compression = defaults.compression;
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
    let names = capture_names(&matcher);
    let captures = names.as_deref().map(|names| Captures { names });
    let request_headers = header_rules(
        ctx,
        &sub(key, "request_headers"),
        r.request_headers.as_ref(),
        captures,
    );
    let response_headers = header_rules(
        ctx,
        &sub(key, "response_headers"),
        r.response_headers.as_ref(),
        captures,
    );
    let rate_limit = r
        .rate_limit
        .as_ref()
        .and_then(|raw| rate_limit(ctx, &sub(key, "rate_limit"), start(item), raw));
    let mut action = action(ctx, key, start(item), r, &matcher, upstreams)?;
    scope_cache(&mut action, &name, upstreams);
    if let (Action::Proxy(p), Some(b)) = (&action, &r.buffer_request) {
        if p.buffer.is_some() && max_body_bytes == 0 {
            ctx.error(
                buffer_at(b).unwrap_or(start(item)),
                &sub(key, "buffer_request"),
                "a route that buffers request bodies needs a body limit: max_body = 0 (unlimited) would let one request fill the disk",
            );
        }
    }
    let basic_auth = match &r.basic_auth {
        Some(raw) => basic_auth(ctx, &sub(key, "basic_auth"), raw),
        None => defaults.basic_auth.cloned(),
    };
    let forward_auth = r
        .forward_auth
        .as_ref()
        .and_then(|f| forward_auth(ctx, &sub(key, "forward_auth"), f, upstreams));
    let jwt = match &r.jwt {
        Some(raw) => jwt(ctx, &sub(key, "jwt"), raw),
        None => defaults.jwt.cloned(),
    };
    let client_cert = match &r.client_cert {
        Some(raw) => client_cert(ctx, &sub(key, "client_cert"), raw, defaults.mtls),
        None => defaults.client_cert.cloned(),
    };
    let ip_rules = match &r.ip_rules {
        Some(raw) => Some(ip_rules(ctx, &sub(key, "ip_rules"), raw)),
        None => defaults.ip_rules.cloned(),
    };
    let cors = match (&action, &r.cors) {
        (Action::Proxy(_), Some(c)) => cors(ctx, &sub(key, "cors"), c),
        _ => None,
    };
    if cors.is_some() {
        // Preflights are OPTIONS requests: a route that does not match them never answers one.
        if let Some(m) = r.methods.as_ref().filter(|_| !matcher.methods.is_empty()) {
            if !matcher.methods.iter().any(|m| m == "OPTIONS") {
                ctx.error(
                    start(m),
                    &sub(key, "methods"),
                    "a route with a cors policy must also match OPTIONS (its preflights), or no route answers them",
                );
            }
        }
        let owned = |n: &String| n.starts_with("access-control-");
        let rules = &response_headers;
        if rules.remove.iter().any(owned)
            || rules
                .set
                .iter()
                .chain(rules.add.iter())
                .any(|(n, _)| owned(n))
        {
            let at = r
                .response_headers
                .as_ref()
                .and_then(rules_at)
                .unwrap_or(start(item));
            ctx.error(
                at,
                &sub(key, "response_headers"),
                "the route's cors policy sets the Access-Control-* fields: header rules may not change them",
            );
        }
    }
    // Compression applies to proxied responses (a static route serves precompressed files).
    let compression = match (&action, &r.compression) {
        (Action::Proxy(_), Some(c)) => {
            compression(ctx, &sub(key, "compression"), c, listener_compression)
        }
        (Action::Proxy(_), None) => listener_compression.cloned(),
        _ => None,
    };
    Some(Route {
        name,
        matcher,
        action,
        max_body_bytes,
        request_headers,
        response_headers,
        rate_limit,
        compression,
        cors,
        ip_rules,
        basic_auth,
        forward_auth,
        jwt,
        client_cert,
    })
}

pub(super) fn rate_limit(
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
    let fleet = match &raw.scope {
        None => false,
        Some(sc) => {
            match sc.get_ref().as_str() {
                "local" => false,
                "fleet" => {
                    if !ctx.fleet {
                        ctx.error(
                        start(sc),
                        &sub(key, "scope"),
                        "a fleet rate limit counts through the `[fleet]` table's Redis server: add one, e.g. [fleet] redis = \"redis://10.0.0.5:6379/0\"",
                    );
                    }
                    if let Some(b) = &raw.burst {
                        ctx.error(
                        start(b),
                        &sub(key, "burst"),
                        "a fleet rate limit counts requests in a sliding one-second window of at most `rate`; `burst` is for local limits",
                    );
                    }
                    if rate < 1.0 {
                        ctx.error(
                        start(rate_value),
                        &sub(key, "rate"),
                        format!("a fleet rate limit allows at least 1 request per second, found {rate}"),
                    );
                    }
                    true
                }
                other => {
                    ctx.error(
                    start(sc),
                    &sub(key, "scope"),
                    format!("unknown scope {other:?}: use \"local\" (this instance) or \"fleet\" (every instance, counted in Redis)"),
                );
                    false
                }
            }
        }
    };
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
        fleet,
    })
}

pub(super) fn matcher(ctx: &mut Ctx<'_>, key: &str, r: &RawRoute) -> Matcher {
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
    if let Some(re) = &r.path_regex {
        let rkey = sub(key, "path_regex");
        if r.path.is_some() {
            ctx.error(
                start(re),
                &rkey,
                "a route matches its path with `path` or `path_regex`, not both",
            );
        } else {
            match path_regex(re.get_ref()) {
                Ok(p) => m.path = Some(p),
                Err(message) => ctx.error(start(re), &rkey, message),
            }
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

/// Most bytes a compiled `path_regex` may take (the regex crate's size limit): a pattern that
/// needs more is refused at load rather than slowing every request.
const PATH_REGEX_SIZE: usize = 1 << 20;

/// A `path_regex`: compiled once; its group names must not shadow a variable's.
pub(crate) fn path_regex(text: &str) -> Result<PathMatch, String> {
    let re = regex::RegexBuilder::new(text)
        .size_limit(PATH_REGEX_SIZE)
        .build()
        .map_err(|e| format!("invalid path_regex {text:?}: {e}"))?;
    const RESERVED: [&str; 8] = [
        "scheme",
        "host",
        "port",
        "path",
        "query",
        "uri",
        "remote_addr",
        "method",
    ];
    if let Some(n) = re.capture_names().flatten().find(|n| RESERVED.contains(n)) {
        return Err(format!(
            "capture group name {n:?} is a variable's name ({{{n}}}); name the group otherwise"
        ));
    }
    Ok(PathMatch::Regex(PathRegex(re)))
}

/// The capture groups of a route's `path_regex` (None without one), for its templates.
pub(super) fn capture_names(m: &Matcher) -> Option<Vec<Option<String>>> {
    match &m.path {
        Some(PathMatch::Regex(re)) => Some(
            re.0.capture_names()
                .map(|n| n.map(str::to_string))
                .collect(),
        ),
        _ => None,
    }
}

/// A value with variables: the error points inside the string, at the variable.
pub(super) fn template(
    ctx: &mut Ctx<'_>,
    key: &str,
    value: &Spanned<String>,
    captures: Option<Captures<'_>>,
) -> Option<Template> {
    match Template::parse(value.get_ref(), captures) {
        Ok(t) => Some(t),
        Err((offset, message)) => {
            // Inside the string when it is written as it reads (one quote, no escapes); else at
            // the value.
            let at = start(value);
            let raw = value.span();
            let written = ctx.text.get(raw.start + 1..raw.end.saturating_sub(1));
            let plain = raw.end - raw.start == value.get_ref().len() + 2
                && written == Some(value.get_ref().as_str());
            ctx.error(if plain { at + 1 + offset } else { at }, key, message);
            None
        }
    }
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
pub(super) fn respond_at(r: &RawRespond) -> Option<usize> {
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
pub(super) fn rules_at(r: &RawHeaderRules) -> Option<usize> {
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

pub(super) fn action(
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
            let precompressed = match &r.precompressed {
                Some(list) => codings(ctx, &sub(key, "precompressed"), list),
                None => Vec::new(),
            };
            Action::Static(StaticAction {
                root: Some(relative_to_config(ctx.file, root.get_ref())),
                index: index(ctx, key, r),
                precompressed,
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
                    Some(relative_to_config(ctx.file, root))
                }
            };
            Action::Origin(StaticAction {
                root,
                index: index(ctx, key, r),
                precompressed: Vec::new(),
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
            let names = capture_names(matcher);
            let captures = names.as_deref().map(|names| Captures { names });
            let location = template(ctx, &sub(key, "redirect"), location, captures)?;
            Action::Redirect { status, location }
        }
        _ => respond(ctx, &sub(key, "respond"), r.respond.as_ref()?),
    };
    Some(action)
}

/// Options that only make sense with another action.
pub(super) fn misplaced_options(
    ctx: &mut Ctx<'_>,
    key: &str,
    route_at: usize,
    r: &RawRoute,
    kind: &str,
) {
    let proxy_options = [
        ("strip_prefix", r.strip_prefix.as_ref().map(start)),
        ("rewrite_prefix", r.rewrite_prefix.as_ref().map(start)),
        ("rewrite", r.rewrite.as_ref().map(start)),
        (
            "buffer_request",
            r.buffer_request.as_ref().and_then(buffer_at),
        ),
        ("split", r.split.as_ref().map(start)),
        ("split_key", r.split_key.as_ref().map(start)),
        ("mirror", r.mirror.as_ref().map(start)),
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
    if kind != "static" {
        if let Some(p) = &r.precompressed {
            misplaced.push(("precompressed", start(p), "static routes"));
        }
    }
    if kind != "proxy" {
        if let Some(c) = &r.cors {
            let at = cors_at(c).unwrap_or(route_at);
            misplaced.push(("cors", at, "proxy routes"));
        }
    }
    if kind != "proxy" {
        if let Some(c) = &r.compression {
            let at = compression_at(c).unwrap_or(route_at);
            misplaced.push((
                "compression",
                at,
                "proxy routes (static routes serve precompressed files)",
            ));
        }
    }
    if kind != "proxy" {
        if let Some(c) = &r.cache {
            misplaced.push(("cache", start(c), "proxy routes"));
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

pub(super) fn index(ctx: &mut Ctx<'_>, key: &str, r: &RawRoute) -> Vec<String> {
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

pub(super) fn proxy(
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
    let mut rewrite = None;
    if let Some(t) = &r.rewrite {
        let rkey = sub(key, "rewrite");
        let names = capture_names(matcher);
        let captures = names.as_deref().map(|names| Captures { names });
        if let Some(other) = [
            ("strip_prefix", r.strip_prefix.is_some()),
            ("rewrite_prefix", r.rewrite_prefix.is_some()),
        ]
        .into_iter()
        .find_map(|(n, set)| set.then_some(n))
        {
            ctx.error(
                start(t),
                &rkey,
                format!("rewrite and {other} are mutually exclusive (rewrite sets the whole upstream target)"),
            );
        } else if let Some(tpl) = template(ctx, &rkey, t, captures) {
            let text = t.get_ref();
            if !text.starts_with(['/', '{']) {
                ctx.error(
                    start(t),
                    &rkey,
                    format!("rewrite {text:?} must start with '/' or a variable such as {{path}}"),
                );
            } else if text.contains('#')
                || text
                    .chars()
                    .any(|c| c.is_control() || c == ' ' || !c.is_ascii())
            {
                ctx.error(
                    start(t),
                    &rkey,
                    format!("rewrite {text:?} must not contain a fragment, spaces, control or non-ASCII characters (percent-encode them)"),
                );
            } else {
                rewrite = Some(tpl);
            }
        }
    }
    let buffer = r.buffer_request.as_ref().map(|b| {
        let bkey = sub(key, "buffer_request");
        let memory = size(
            ctx,
            b.memory.as_ref(),
            &sub(&bkey, "memory"),
            DEFAULT_BUFFER_MEMORY,
            0,
            1 << 30,
        );
        let directory = match &b.directory {
            Some(d) => {
                if let Some(m) = plain_text_error(d.get_ref(), "directory") {
                    ctx.error(start(d), &sub(&bkey, "directory"), m);
                } else if !std::path::Path::new(d.get_ref()).is_dir() {
                    ctx.error(
                        start(d),
                        &sub(&bkey, "directory"),
                        format!(
                            "{:?} is not a directory (it must exist when the configuration loads)",
                            d.get_ref()
                        ),
                    );
                }
                PathBuf::from(d.get_ref())
            }
            None => std::env::temp_dir(),
        };
        RequestBuffer { memory, directory }
    });
    let split = r
        .split
        .as_ref()
        .and_then(|s| split(ctx, key, s, r.split_key.as_ref(), upstream, upstreams));
    if r.split.is_none() {
        if let Some(k) = &r.split_key {
            ctx.error(
                start(k),
                &sub(key, "split_key"),
                "split_key needs a `split` on the route",
            );
        }
    }
    let mirror = r.mirror.as_ref().and_then(|m| {
        let mkey = sub(key, "mirror");
        let raw = m.get_ref();
        let Some(group) = &raw.group else {
            ctx.error(start(m), &mkey, "a mirror needs `group`, the upstream group the copies go to");
            return None;
        };
        let Some(gi) = upstreams.iter().position(|n| n == group.get_ref()) else {
            ctx.error(
                start(group),
                &sub(&mkey, "group"),
                format!("unknown upstream group {:?}", group.get_ref()),
            );
            return None;
        };
        if gi == upstream {
            ctx.error(
                start(group),
                &sub(&mkey, "group"),
                "the mirror group must not be the route's own group (its servers would get every request twice)",
            );
            return None;
        }
        let basis_points = match &raw.percent {
            None => 10_000,
            Some(p) => {
                let bp = (p.get_ref().0 * 100.0).round();
                if !(1.0..=10_000.0).contains(&bp) {
                    ctx.error(
                        start(p),
                        &sub(&mkey, "percent"),
                        format!("must be between 0.01 and 100, found {}", p.get_ref().0),
                    );
                    return None;
                }
                bp as u32
            }
        };
        Some(Mirror { group: gi, basis_points })
    });
    let flag =
        |v: &Option<Spanned<bool>>, default: bool| v.as_ref().map_or(default, |b| *b.get_ref());
    let retry = r
        .retry
        .as_ref()
        .map(|raw| retry(ctx, &sub(key, "retry"), raw));
    let cache = r
        .cache
        .as_ref()
        .and_then(|c| route_cache(ctx, &sub(key, "cache"), c));
    Some(ProxyAction {
        upstream,
        cache,
        strip_prefix,
        rewrite_prefix,
        rewrite,
        buffer,
        split,
        mirror,
        forwarded_headers: flag(&r.forwarded_headers, true),
        via: flag(&r.via, false),
        preserve_host: flag(&r.preserve_host, true),
        retry,
    })
}

/// The position of a retry table's first key (tables carry no span of their own).
pub(super) fn retry_at(r: &RawRetry) -> Option<usize> {
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
pub(super) const RETRY_ON: &str = "\"connect\", \"reset\", \"timeout\", \"502\", \"503\", \"504\"";

pub(super) fn retry(ctx: &mut Ctx<'_>, key: &str, raw: &RawRetry) -> RetryPolicy {
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

pub(super) fn respond(ctx: &mut Ctx<'_>, key: &str, raw: &RawRespond) -> Action {
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

pub(super) fn header_rules(
    ctx: &mut Ctx<'_>,
    key: &str,
    raw: Option<&RawHeaderRules>,
    captures: Option<Captures<'_>>,
) -> HeaderRules {
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
            let Some(value) = template(ctx, &nkey, value, captures) else {
                continue;
            };
            let pair = (lower, value);
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
pub(super) fn not_shorter(
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

/// Where a buffer_request table starts (its first key).
pub(super) fn buffer_at(b: &RawBufferRequest) -> Option<usize> {
    [
        b.memory.as_ref().map(start),
        b.directory.as_ref().map(start),
    ]
    .into_iter()
    .flatten()
    .min()
}

/// A route's `split`: known groups other than the route's own, each once, shares above 0 that
/// add up to 100 at most; `split_key` `random`, `client_ip`, `header:NAME` or `cookie:NAME`.
fn split(
    ctx: &mut Ctx<'_>,
    key: &str,
    raw: &Spanned<Vec<Spanned<RawSplit>>>,
    raw_key: Option<&Spanned<String>>,
    own: usize,
    upstreams: &[String],
) -> Option<Split> {
    let skey = sub(key, "split");
    if raw.get_ref().is_empty() {
        ctx.error(
            start(raw),
            &skey,
            "must list at least one share { group = \"NAME\", percent = N }",
        );
        return None;
    }
    let mut shares = Vec::new();
    let mut total = 0u32;
    for (i, item) in raw.get_ref().iter().enumerate() {
        let ikey = format!("{skey}[{i}]");
        let s = item.get_ref();
        let Some(group) = &s.group else {
            ctx.error(
                start(item),
                &ikey,
                "a share needs `group`, the upstream group it goes to",
            );
            continue;
        };
        let Some(gi) = upstreams.iter().position(|n| n == group.get_ref()) else {
            ctx.error(
                start(group),
                &sub(&ikey, "group"),
                format!("unknown upstream group {:?}", group.get_ref()),
            );
            continue;
        };
        if gi == own || shares.iter().any(|(g, _)| *g == gi) {
            ctx.error(
                start(group),
                &sub(&ikey, "group"),
                format!(
                    "group {:?} is already the route's or another share's",
                    group.get_ref()
                ),
            );
            continue;
        }
        let Some(percent) = &s.percent else {
            ctx.error(
                start(item),
                &ikey,
                "a share needs `percent`, its part of the requests (0.01 to 100)",
            );
            continue;
        };
        let bp = (percent.get_ref().0 * 100.0).round();
        if !(1.0..=10_000.0).contains(&bp) {
            ctx.error(
                start(percent),
                &sub(&ikey, "percent"),
                format!(
                    "must be between 0.01 and 100, found {}",
                    percent.get_ref().0
                ),
            );
            continue;
        }
        total += bp as u32;
        shares.push((gi, bp as u32));
    }
    if total > 10_000 {
        ctx.error(
            start(raw),
            &skey,
            format!(
                "the shares add up to {}%: at most 100",
                f64::from(total) / 100.0
            ),
        );
        return None;
    }
    let key = match raw_key {
        None => SplitKey::Random,
        Some(k) => {
            let text = k.get_ref();
            match text.split_once(':') {
                _ if text == "random" => SplitKey::Random,
                _ if text == "client_ip" => SplitKey::ClientIp,
                Some(("header", h)) if header_name_error(h).is_none() => {
                    SplitKey::Header(h.to_ascii_lowercase())
                }
                Some(("cookie", c)) if is_token(c) => SplitKey::Cookie(c.to_string()),
                _ => {
                    ctx.error(
                        start(k),
                        &sub(key, "split_key"),
                        format!("invalid split_key {text:?}: expected \"random\", \"client_ip\", \"header:NAME\" or \"cookie:NAME\""),
                    );
                    SplitKey::Random
                }
            }
        }
    };
    (!shares.is_empty()).then_some(Split { shares, key })
}
