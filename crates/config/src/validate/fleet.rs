//! `[fleet]`: what the instances of a fleet share (the Redis server fleet rate limits count through).

use super::*;
use crate::model::{Fleet, FleetFallback};
use crate::raw::RawFleet;

/// Most instances a fleet may say it has.
const MAX_INSTANCES: i64 = 10_000;

pub(super) fn fleet(ctx: &mut Ctx<'_>, raw: &Spanned<RawFleet>) -> Option<Fleet> {
    let f = raw.get_ref();
    let Some(redis) = &f.redis else {
        ctx.error(
            start(raw),
            "fleet",
            "a fleet table needs `redis`, the server fleet rate limits count through, e.g. redis = \"redis://10.0.0.5:6379/0\"",
        );
        return None;
    };
    if let Err(m) = redis_url(redis.get_ref()) {
        ctx.error(start(redis), "fleet.redis", m);
    }
    let instances = int(
        ctx,
        f.instances.as_ref(),
        "fleet.instances",
        1,
        1,
        MAX_INSTANCES,
    );
    let sync_interval = duration(
        ctx,
        f.sync_interval.as_ref(),
        "fleet.sync_interval",
        Duration::from_millis(100),
        false,
    );
    // Counts are kept per one-second window until sent: an exchange must come at least once
    // in each window.
    if let Some(at) = &f.sync_interval {
        if !(Duration::from_millis(10)..=Duration::from_millis(250)).contains(&sync_interval) {
            ctx.error(start(at), "fleet.sync_interval", "between 10ms and 250ms");
        }
    }
    let on_redis_down = match &f.on_redis_down {
        None => FleetFallback::Local,
        Some(m) => match m.get_ref().as_str() {
            "local" => FleetFallback::Local,
            "closed" => FleetFallback::Closed,
            other => {
                ctx.error(
                    start(m),
                    "fleet.on_redis_down",
                    format!("unknown mode {other:?}: use \"local\" (each instance limits to its share) or \"closed\" (429)"),
                );
                FleetFallback::Local
            }
        },
    };
    let prefix = match &f.prefix {
        None => "portico".to_string(),
        Some(p) => {
            let ok = !p.get_ref().is_empty()
                && p.get_ref().len() <= 64
                && p.get_ref().bytes().all(|b| b.is_ascii_graphic());
            if !ok {
                ctx.error(
                    start(p),
                    "fleet.prefix",
                    "1 to 64 printable characters, no spaces",
                );
            }
            p.get_ref().clone()
        }
    };
    Some(Fleet {
        redis: redis.get_ref().clone(),
        instances: u32::try_from(instances).unwrap_or(1),
        sync_interval,
        on_redis_down,
        prefix,
    })
}

/// `redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]`.
fn redis_url(url: &str) -> Result<(), String> {
    let example = "e.g. \"redis://10.0.0.5:6379/0\" or \"redis://:PASSWORD@redis.internal:6379\"";
    let Some(rest) = url.strip_prefix("redis://") else {
        return Err(format!("{url:?} is not a redis:// URL; {example}"));
    };
    let (creds, hostport) = match rest.rsplit_once('@') {
        Some((c, h)) => (c, h),
        None => ("", rest),
    };
    if creds.contains(['/', '?', '#', ' ']) {
        return Err(format!(
            "write '/', '?', '#' and spaces in the user or password percent-encoded (%2F, %3F, %23, %20); {example}"
        ));
    }
    let (hostport, db) = hostport.split_once('/').unwrap_or((hostport, ""));
    if hostport.is_empty() {
        return Err(format!("the URL names no host; {example}"));
    }
    // "[v6]:port", "[v6]", "host:port" or "host"
    let (host, port) = match hostport.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((h, "")) => (h, None),
            // anything after the bracket is a port
            Some((h, rest)) => match rest.strip_prefix(':') {
                Some(p) => (h, Some(p)),
                None => ("", None),
            },
            None => ("", None),
        },
        None => match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        },
    };
    let port_ok = port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p > 0));
    let v6 = hostport.starts_with('[');
    let host_ok = match v6 {
        true => host
            .parse::<std::net::Ipv6Addr>()
            .is_ok_and(|ip| !ip.is_unspecified()),
        false => {
            !host.is_empty()
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
                && host
                    .parse::<std::net::Ipv4Addr>()
                    .map_or(true, |ip| !ip.is_unspecified())
        }
    };
    if !host_ok || !port_ok {
        return Err(format!(
            "invalid host or port in {hostport:?} (a name or IP address to connect to; IPv6 in brackets); {example}"
        ));
    }
    if !db.is_empty() && db.parse::<u32>().is_err() {
        return Err(format!("the database {db:?} is not a number; {example}"));
    }
    Ok(())
}
