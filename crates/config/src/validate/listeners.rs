//! Listeners: addresses and their conflicts, limits, HTTP/2 and HTTP/3 settings, load shedding.

use super::*;

pub(super) fn listeners(
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
    // ACME certificates seen so far, with their listener's key: one set of files, one spec.
    let mut acmes: Vec<(crate::model::Acme, String)> = Vec::new();
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
        let acme = l.tls.as_ref().and_then(|t| acme(ctx, &sub(&key, "tls"), t));
        if let (Some(a), Some(item)) = (&acme, l.tls.as_ref().and_then(|t| t.acme.as_ref())) {
            // Two listeners may share a certificate (each refusing or not until it is issued),
            // not its files with other settings (each would order over the other's).
            let clash = acmes
                .iter()
                .find(|(b, _)| b.files() == a.files() && !b.same_order(a));
            if let Some((_, other)) = clash {
                let m = format!("its certificate files ({}) are those of {other}'s acme table, with other settings: give it another first name or another storage, or the same settings", a.files().cert.display());
                ctx.error(start(item), &sub(&sub(&key, "tls"), "acme"), m);
            }
            acmes.push((a.clone(), key.clone()));
        }
        let tls = l
            .tls
            .as_ref()
            .and_then(|t| tls(ctx, &sub(&key, "tls"), t, start(item), acme.as_ref()));
        let shed = l.shed.as_ref().map(|s| shed(ctx, &sub(&key, "shed"), s));
        let http2 = http2(ctx, &sub(&key, "http2"), l.http2.as_ref());
        let http3 = l.http3.as_ref().and_then(|h| {
            let settings = http3(ctx, &sub(&key, "http3"), h.get_ref())?;
            let why = match &tls {
                _ if l.tls.is_none() => Some("HTTP/3 runs over QUIC, which is always TLS: add a [listeners.tls] table or remove [listeners.http3]".to_string()),
                None => None,
                Some(t) if !t.versions.contains(&TlsVersion::Tls13) => Some("HTTP/3 needs TLS 1.3 (QUIC's handshake is TLS 1.3): add \"1.3\" to [listeners.tls] versions".to_string()),
                Some(t) if t.cipher_suites.as_ref().is_some_and(|c| !c.contains(&"TLS13_AES_128_GCM_SHA256")) => Some("HTTP/3 needs TLS13_AES_128_GCM_SHA256 among [listeners.tls] cipher_suites (QUIC protects its first packets with it)".to_string()),
                Some(_) if l.proxy_protocol.as_ref().is_some_and(|p| *p.get_ref()) => Some("a PROXY protocol header cannot come over QUIC: serve HTTP/3 on a listener without proxy_protocol".to_string()),
                Some(t) if settings.early_data && t.client_auth.is_some() => Some("early_data with client certificates: a 0-RTT request would come before the certificate is verified; turn one of them off".to_string()),
                Some(t) if settings.early_data && t.session_cache == 0 => Some("early_data needs the session cache (tls.session_cache above 0): 0-RTT resumes sessions kept there, each once, so that a replay finds nothing".to_string()),
                Some(_) => None,
            };
            if let Some(why) = why {
                ctx.error(start(h), &sub(&key, "http3"), why);
            }
            Some(settings)
        });
        let compression = l
            .compression
            .as_ref()
            .and_then(|c| compression(ctx, &sub(&key, "compression"), c, None));
        let listener_ip_rules = l
            .ip_rules
            .as_ref()
            .map(|r| ip_rules(ctx, &sub(&key, "ip_rules"), r));
        let listener_auth = l
            .basic_auth
            .as_ref()
            .and_then(|a| basic_auth(ctx, &sub(&key, "basic_auth"), a));
        let listener_jwt = l.jwt.as_ref().and_then(|a| jwt(ctx, &sub(&key, "jwt"), a));
        let mtls = tls.as_ref().is_some_and(|t| t.client_auth.is_some());
        let listener_cert = l
            .client_cert
            .as_ref()
            .and_then(|c| client_cert(ctx, &sub(&key, "client_cert"), c, mtls));
        let trusted = l
            .trusted_proxies
            .as_ref()
            .map(|r| trusted_proxies(ctx, &sub(&key, "trusted_proxies"), r))
            .unwrap_or_default();
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
                    let key = format!("{key}.routes[{j}]");
                    let defaults = RouteDefaults {
                        compression: compression.as_ref(),
                        ip_rules: listener_ip_rules.as_ref(),
                        basic_auth: listener_auth.as_ref(),
                        jwt: listener_jwt.as_ref(),
                        client_cert: listener_cert.as_ref(),
                        mtls,
                    };
                    route(ctx, &key, &name, j, r, upstreams, defaults)
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
            http3,
            trusted_proxies: trusted,
            proxy_protocol: l.proxy_protocol.as_ref().is_some_and(|p| *p.get_ref()),
            acme,
        });
    }
    out
}

/// `[listeners.shed]`: lag target and interval; the target must be shorter than the interval
/// (a lag that never lasts as long as the target's own length cannot be told from noise).
pub(super) fn shed(ctx: &mut Ctx<'_>, key: &str, raw: &RawShed) -> Shed {
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
pub(super) fn http2(ctx: &mut Ctx<'_>, key: &str, raw: Option<&RawHttp2>) -> Http2Settings {
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
pub(super) fn conflicts(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port()
        && a.port() != 0
        && a.is_ipv4() == b.is_ipv4()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

pub(super) fn limits(ctx: &mut Ctx<'_>, key: &str, raw: Option<&RawLimits>) -> ListenerLimits {
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

/// `[listeners.http3]`: QUIC and HTTP/3 settings; None when `enabled = false`.
pub(super) fn http3(ctx: &mut Ctx<'_>, key: &str, raw: &RawHttp3) -> Option<Http3Settings> {
    let d = Http3Settings::DEFAULT;
    let idle_timeout = duration(
        ctx,
        raw.idle_timeout.as_ref(),
        &sub(key, "idle_timeout"),
        d.idle_timeout,
        false,
    );
    let max_concurrent_streams = int(
        ctx,
        raw.max_concurrent_streams.as_ref(),
        &sub(key, "max_concurrent_streams"),
        i64::from(d.max_concurrent_streams),
        1,
        10_000,
    );
    let stream_window = size(
        ctx,
        raw.stream_window.as_ref(),
        &sub(key, "stream_window"),
        u64::from(d.stream_window),
        1024,
        (1 << 30) - 1,
    );
    let connection_window = size(
        ctx,
        raw.connection_window.as_ref(),
        &sub(key, "connection_window"),
        u64::from(d.connection_window).max(stream_window),
        1024,
        (1 << 30) - 1,
    );
    if connection_window < stream_window {
        if let Some(v) = &raw.connection_window {
            ctx.error(
                start(v),
                &sub(key, "connection_window"),
                "must not be smaller than stream_window",
            );
        }
    }
    // RFC 9000 18.2: at least 1200; 65527 is the largest UDP payload there is.
    let max_udp_payload = size(
        ctx,
        raw.max_udp_payload.as_ref(),
        &sub(key, "max_udp_payload"),
        u64::from(d.max_udp_payload),
        1200,
        65_527,
    );
    let congestion = match &raw.congestion {
        None => d.congestion,
        Some(c) => match c.get_ref().as_str() {
            "cubic" => Congestion::Cubic,
            "bbr" => Congestion::Bbr,
            "newreno" => Congestion::NewReno,
            other => {
                ctx.error(
                    start(c),
                    &sub(key, "congestion"),
                    format!("unknown congestion controller {other:?}: one of cubic, bbr, newreno"),
                );
                d.congestion
            }
        },
    };
    let keep_alive = duration(
        ctx,
        raw.keep_alive_interval.as_ref(),
        &sub(key, "keep_alive_interval"),
        Duration::ZERO,
        true,
    );
    if !keep_alive.is_zero() && keep_alive >= idle_timeout {
        if let Some(v) = &raw.keep_alive_interval {
            ctx.error(
                start(v),
                &sub(key, "keep_alive_interval"),
                "must be shorter than idle_timeout, or the connection closes between two PINGs",
            );
        }
    }
    let max_header_list_size = size(
        ctx,
        raw.max_header_list_size.as_ref(),
        &sub(key, "max_header_list_size"),
        u64::from(d.max_header_list_size),
        1024,
        MAX_HEAD_LIMIT,
    );
    let validate_above = int(
        ctx,
        raw.validate_above.as_ref(),
        &sub(key, "validate_above"),
        i64::from(d.validate_above),
        0,
        1_000_000,
    );
    let alt_svc = duration(
        ctx,
        raw.alt_svc_max_age.as_ref(),
        &sub(key, "alt_svc_max_age"),
        d.alt_svc_max_age.unwrap_or_default(),
        true,
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
    if raw.enabled.as_ref().is_some_and(|b| !*b.get_ref()) {
        return None;
    }
    Some(Http3Settings {
        idle_timeout,
        max_concurrent_streams: u32::try_from(max_concurrent_streams)
            .unwrap_or(d.max_concurrent_streams),
        stream_window: u32::try_from(stream_window).unwrap_or(d.stream_window),
        connection_window: u32::try_from(connection_window).unwrap_or(d.connection_window),
        max_udp_payload: u16::try_from(max_udp_payload).unwrap_or(d.max_udp_payload),
        congestion,
        keep_alive_interval: (!keep_alive.is_zero()).then_some(keep_alive),
        max_header_list_size: u32::try_from(max_header_list_size).unwrap_or(d.max_header_list_size),
        validate_above: u32::try_from(validate_above).unwrap_or(d.validate_above),
        alt_svc_max_age: (!alt_svc.is_zero()).then_some(alt_svc),
        max_resets: u32::try_from(max_resets).unwrap_or(d.max_resets),
        reset_window,
        early_data: raw.early_data.as_ref().is_some_and(|b| *b.get_ref()),
    })
}
