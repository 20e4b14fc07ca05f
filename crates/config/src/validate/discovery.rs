//! Service discovery: `[resolver]` and upstream groups' `discovery` (DNS names re-resolved by TTL, etcd prefixes read on an interval).

use super::*;
use crate::model::{AddressFamily, Discovery, DiscoverySource, Resolver};
use crate::raw::{RawDiscovery, RawEtcd, RawResolver};

/// How often an etcd prefix is read anyway (it is watched) unless `interval` says otherwise,
/// and the bounds.
const DEFAULT_ETCD_INTERVAL: Duration = Duration::from_secs(5);
const MIN_ETCD_INTERVAL: Duration = Duration::from_millis(100);
const MAX_ETCD_INTERVAL: Duration = Duration::from_secs(60);

/// Longest `[resolver]` duration accepted (timeouts, TTL bounds, hold): one day.
const MAX_RESOLVER_DURATION: Duration = Duration::from_secs(86_400);

pub(super) fn resolver(ctx: &mut Ctx<'_>, raw: Option<&Spanned<RawResolver>>) -> Resolver {
    let d = Resolver::DEFAULT;
    let Some(table) = raw else { return d };
    let r = table.get_ref();
    let mut nameservers = Vec::new();
    if let Some(list) = &r.nameservers {
        if list.get_ref().is_empty() {
            ctx.error(
                start(list),
                "resolver.nameservers",
                "list at least one name server, or leave `nameservers` out to use the system's",
            );
        }
        for (i, text) in list.get_ref().iter().enumerate() {
            let key = format!("resolver.nameservers[{i}]");
            // A name server is an address: port 53 unless one is given.
            let parsed = text
                .get_ref()
                .parse::<IpAddr>()
                .map(|ip| SocketAddr::new(ip, 53))
                .or_else(|_| text.get_ref().parse::<SocketAddr>());
            match parsed {
                Ok(a) if a.port() == 0 => ctx.error(start(text), &key, "port 0 is not a name server's port"),
                Ok(a) if nameservers.contains(&a) => {
                    ctx.error(start(text), &key, format!("duplicate name server {a}"))
                }
                Ok(a) => nameservers.push(a),
                Err(_) => ctx.error(
                    start(text),
                    &key,
                    format!(
                        "invalid name server {:?}: expected an IP address, with a port if not 53 (\"10.0.0.2\", \"127.0.0.1:5353\", \"[::1]:53\")",
                        text.get_ref()
                    ),
                ),
            }
        }
    }
    let bounded = |ctx: &mut Ctx<'_>, value: Option<&Spanned<Scalar>>, key: &str, default| {
        let v = duration(ctx, value, key, default, false);
        if v > MAX_RESOLVER_DURATION {
            if let Some(at) = value {
                ctx.error(start(at), key, "at most 1 day (\"24h\")");
            }
            return default;
        }
        v
    };
    let timeout = bounded(ctx, r.timeout.as_ref(), "resolver.timeout", d.timeout);
    // A first lookup holds a reload up to about three times this.
    let timeout = match (&r.timeout, timeout > Duration::from_secs(30)) {
        (Some(at), true) => {
            ctx.error(start(at), "resolver.timeout", "at most 30s");
            d.timeout
        }
        _ => timeout,
    };
    let min_ttl = bounded(ctx, r.min_ttl.as_ref(), "resolver.min_ttl", d.min_ttl);
    let max_ttl = bounded(ctx, r.max_ttl.as_ref(), "resolver.max_ttl", d.max_ttl);
    let hold = match &r.hold {
        // zero: servers go as soon as the name does
        Some(h) => {
            let v = duration(ctx, Some(h), "resolver.hold", d.hold, true);
            if v > MAX_RESOLVER_DURATION {
                ctx.error(start(h), "resolver.hold", "at most 1 day (\"24h\")");
                d.hold
            } else {
                v
            }
        }
        None => d.hold,
    };
    if min_ttl > max_ttl {
        let (at, key) = match (&r.min_ttl, &r.max_ttl) {
            (Some(v), _) => (start(v), "resolver.min_ttl"),
            (None, Some(v)) => (start(v), "resolver.max_ttl"),
            (None, None) => (start(table), "resolver"),
        };
        ctx.error(
            at,
            key,
            format!(
                "min_ttl ({}) is above max_ttl ({})",
                humantime(min_ttl),
                humantime(max_ttl)
            ),
        );
    }
    Resolver {
        nameservers,
        timeout,
        min_ttl,
        max_ttl,
        hold,
    }
}

fn humantime(d: Duration) -> String {
    match d.subsec_millis() {
        0 => format!("{}s", d.as_secs()),
        _ => format!("{}ms", d.as_millis()),
    }
}

/// `[etcd]`: how etcd is reached (TLS files, user); paths relative to the configuration file.
pub(super) fn etcd_client(ctx: &mut Ctx<'_>, raw: &Spanned<RawEtcd>) -> crate::model::EtcdClient {
    let e = raw.get_ref();
    let file = |ctx: &mut Ctx<'_>, value: &Spanned<String>, key: &str| {
        if value.get_ref().trim().is_empty() {
            ctx.error(start(value), key, "must be a file path");
            None
        } else {
            Some(super::tls::relative_to_config(ctx.file, value.get_ref()))
        }
    };
    let ca_file = e
        .ca_file
        .as_ref()
        .and_then(|p| file(ctx, p, "etcd.ca_file"));
    let certificate = e.certificate.as_ref().and_then(|c| match (&c.cert, &c.key) {
        (Some(cert), Some(k)) => {
            let cert = file(ctx, cert, "etcd.certificate.cert");
            let key = file(ctx, k, "etcd.certificate.key");
            Some(crate::model::CertificateFiles {
                cert: cert?,
                key: key?,
            })
        }
        (one, other) => {
            let at = one.as_ref().or(other.as_ref()).map_or(start(raw), start);
            ctx.error(
                at,
                "etcd.certificate",
                "a client certificate needs both `cert` and `key` (PEM file paths): certificate = { cert = \"client.pem\", key = \"client.key\" }",
            );
            None
        }
    });
    let username = e.username.as_ref().map(|u| u.get_ref().clone());
    if let Some(u) = e.username.as_ref().filter(|u| u.get_ref().is_empty()) {
        ctx.error(start(u), "etcd.username", "must not be empty");
    }
    let password_file = e
        .password_file
        .as_ref()
        .and_then(|p| file(ctx, p, "etcd.password_file"));
    match (&e.username, &e.password_file) {
        (Some(u), None) => ctx.error(
            start(u),
            "etcd.username",
            "an etcd user needs `password_file`, the file holding its password",
        ),
        (None, Some(p)) => ctx.error(
            start(p),
            "etcd.password_file",
            "a password needs `username`, the etcd user it belongs to",
        ),
        _ => {}
    }
    crate::model::EtcdClient {
        ca_file,
        certificate,
        username,
        password_file,
    }
}

/// An upstream group's `discovery` table.
pub(super) fn discovery(
    ctx: &mut Ctx<'_>,
    key: &str,
    raw: &Spanned<RawDiscovery>,
) -> Option<Discovery> {
    let d = raw.get_ref();
    let family = match &d.family {
        None => AddressFamily::Any,
        Some(f) => match f.get_ref().as_str() {
            "any" => AddressFamily::Any,
            "ipv4" => AddressFamily::Ipv4,
            "ipv6" => AddressFamily::Ipv6,
            other => {
                ctx.error(
                    start(f),
                    &sub(key, "family"),
                    format!("unknown family {other:?}: use \"any\", \"ipv4\" or \"ipv6\""),
                );
                AddressFamily::Any
            }
        },
    };
    let weight = int(
        ctx,
        d.weight.as_ref(),
        &sub(key, "weight"),
        1,
        1,
        MAX_WEIGHT,
    );
    let given: Vec<(&str, &Spanned<String>)> =
        [("dns", &d.dns), ("srv", &d.srv), ("etcd", &d.etcd)]
            .into_iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
            .collect();
    if let [_, (second, at), ..] = given.as_slice() {
        ctx.error(
            start(*at),
            &sub(key, second),
            "a discovery has one of `dns`, `srv` or `etcd`",
        );
        return None;
    }
    if let Some(i) = &d.interval {
        if d.etcd.is_none() {
            ctx.error(
                start(i),
                &sub(key, "interval"),
                "`interval` is for `etcd` (DNS answers are asked again as their TTL expires)",
            );
        }
    }
    if let Some(etcd) = &d.etcd {
        if let Some(f) = &d.family {
            ctx.error(
                start(f),
                &sub(key, "family"),
                "`family` is for DNS names; etcd registrations carry addresses",
            );
        }
        let k = sub(key, "interval");
        let interval = duration(ctx, d.interval.as_ref(), &k, DEFAULT_ETCD_INTERVAL, false);
        let interval = match (&d.interval, interval) {
            (Some(at), i) if !(MIN_ETCD_INTERVAL..=MAX_ETCD_INTERVAL).contains(&i) => {
                ctx.error(start(at), &k, "between 100ms and 60s");
                DEFAULT_ETCD_INTERVAL
            }
            (_, i) => i,
        };
        let url = match crate::url::EtcdUrl::parse(etcd.get_ref()) {
            Ok(u) => u,
            Err(e) => {
                ctx.error(start(etcd), &sub(key, "etcd"), e);
                return None;
            }
        };
        if ctx.etcd.has_tls() && !url.tls {
            ctx.error(
                start(etcd),
                &sub(key, "etcd"),
                format!(
                    "`[etcd]` has a CA or a client certificate, which only TLS uses: write etcds://{}",
                    etcd.get_ref().trim_start_matches("etcd://")
                ),
            );
            return None;
        }
        return Some(Discovery {
            source: DiscoverySource::Etcd {
                name: url.name(),
                url,
                interval,
                client: ctx.etcd.clone(),
            },
            family: AddressFamily::Any,
            weight: u32::try_from(weight).unwrap_or(1),
        });
    }
    let source = match (&d.dns, &d.srv) {
        (Some(_), Some(_)) | (None, None) => {
            ctx.error(
                start(raw),
                key,
                "discovery needs `dns = \"NAME:PORT\"` (A/AAAA records), `srv = \"_service._tcp.NAME\"` (SRV records) or `etcd = \"etcd://HOST:PORT/PREFIX\"` (servers registered in etcd)",
            );
            return None;
        }
        (Some(dns), None) => {
            let k = sub(key, "dns");
            let text = dns.get_ref();
            let bare = text
                .trim_start_matches('[')
                .split(']')
                .next()
                .unwrap_or(text);
            if text.parse::<SocketAddr>().is_ok() || bare.parse::<IpAddr>().is_ok() {
                ctx.error(
                    start(dns),
                    &k,
                    format!("{text:?} is an IP address: list it in `servers` instead"),
                );
                return None;
            }
            let Some((name, port)) = text.rsplit_once(':') else {
                ctx.error(
                    start(dns),
                    &k,
                    format!(
                        "{text:?} has no port: write it as NAME:PORT, e.g. \"app.internal.:8080\""
                    ),
                );
                return None;
            };
            let port = match port.parse::<u16>() {
                Ok(p) if p > 0 => p,
                _ => {
                    ctx.error(
                        start(dns),
                        &k,
                        format!("invalid port {port:?}: expected 1-65535"),
                    );
                    return None;
                }
            };
            if let Err(m) = dns_name(name) {
                ctx.error(start(dns), &k, m);
                return None;
            }
            DiscoverySource::Dns {
                name: name.to_string(),
                port,
            }
        }
        (None, Some(srv)) => {
            if let Some(w) = &d.weight {
                ctx.error(
                    start(w),
                    &sub(key, "weight"),
                    "SRV records carry each server's weight; `weight` is for `dns`",
                );
            }
            if let Err(m) = dns_name(srv.get_ref()) {
                ctx.error(start(srv), &sub(key, "srv"), m);
                return None;
            }
            DiscoverySource::Srv {
                name: srv.get_ref().clone(),
            }
        }
    };
    Some(Discovery {
        source,
        family,
        weight: u32::try_from(weight).unwrap_or(1),
    })
}

/// A DNS name: labels of letters, digits, `-` and `_`, 1 to 63 bytes each, at most 253 bytes
/// without the optional final dot; not an IP address (those are `servers`).
pub(crate) fn dns_name(name: &str) -> Result<(), String> {
    if name.parse::<IpAddr>().is_ok() || name.starts_with('[') {
        return Err(format!(
            "{name:?} is an IP address: list it in `servers` instead"
        ));
    }
    let bare = name.strip_suffix('.').unwrap_or(name);
    if bare.is_empty() || bare.len() > 253 {
        return Err(format!("invalid DNS name {name:?}: 1 to 253 characters"));
    }
    for label in bare.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !ok {
            return Err(format!(
                "invalid DNS name {name:?}: each dot-separated label is 1 to 63 letters, digits, '-' or '_'"
            ));
        }
    }
    Ok(())
}
