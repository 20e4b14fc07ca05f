//! Who may pass: `ip_rules` (ordered allow and deny rules over addresses and CIDR ranges), `trusted_proxies` and `client_cert` rules.

use super::*;
use crate::model::IpRules;
use std::net::IpAddr;

/// `["allow 10.0.0.0/8", "deny all"]`: rules in order; `deny` = false.
pub(super) fn ip_rules(ctx: &mut Ctx<'_>, key: &str, raw: &Spanned<StrList>) -> IpRules {
    let mut rules = IpRules::default();
    let items = raw.get_ref().items(start(raw));
    if items.is_empty() {
        ctx.error(
            start(raw),
            key,
            "must list at least one rule, such as \"allow 10.0.0.0/8\"",
        );
    }
    for (i, (text, at)) in items.iter().enumerate() {
        let ikey = item_key(raw, key, i);
        let (verb, what) = text.trim().split_once(' ').unwrap_or((text.trim(), ""));
        let allow = match verb {
            "allow" => true,
            "deny" => false,
            _ => {
                ctx.error(
                    *at,
                    &ikey,
                    format!("invalid rule {text:?}: expected \"allow RANGE\" or \"deny RANGE\" (RANGE: an address, a CIDR range or \"all\")"),
                );
                continue;
            }
        };
        match what.trim() {
            "all" => {
                rules.push(allow, IpAddr::from([0u8; 4]), 0);
                rules.push(allow, IpAddr::from([0u16; 8]), 0);
            }
            range => match cidr(range) {
                Ok((addr, prefix)) => rules.push(allow, addr, prefix),
                Err(m) => ctx.error(*at, &ikey, m),
            },
        }
    }
    rules
}

/// `trusted_proxies`: addresses and ranges whose `X-Forwarded-For` is believed.
pub(super) fn trusted_proxies(ctx: &mut Ctx<'_>, key: &str, raw: &Spanned<StrList>) -> IpRules {
    let mut rules = IpRules::default();
    for (i, (text, at)) in raw.get_ref().items(start(raw)).iter().enumerate() {
        match cidr(text.trim()) {
            Ok((addr, prefix)) => rules.push(true, addr, prefix),
            Err(m) => ctx.error(*at, &item_key(raw, key, i), m),
        }
    }
    rules
}

/// An address (`10.0.0.1`, `2001:db8::1`) or a CIDR range (`10.0.0.0/8`, `2001:db8::/32`).
fn cidr(text: &str) -> Result<(IpAddr, u8), String> {
    let (addr, prefix) = match text.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (text, None),
    };
    let addr: IpAddr = addr.parse().map_err(|_| {
        format!("invalid address or range {text:?}: expected such as \"10.0.0.1\", \"10.0.0.0/8\" or \"2001:db8::/32\"")
    })?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix {
        None => max,
        Some(p) => match p.parse::<u8>() {
            Ok(n) if n <= max => n,
            _ => return Err(format!("invalid prefix length in {text:?}: 0 to {max}")),
        },
    };
    Ok((addr, prefix))
}

/// `client_cert`: subject, SAN and issuer patterns, on a listener that asks for certificates.
pub(super) fn client_cert(
    ctx: &mut Ctx<'_>,
    key: &str,
    raw: &Spanned<crate::raw::RawClientCert>,
    mtls: bool,
) -> Option<Arc<crate::model::ClientCertRules>> {
    let r = raw.get_ref();
    if !mtls {
        ctx.error(
            start(raw),
            key,
            "client_cert rules need a listener that asks for client certificates: [listeners.tls] client_auth",
        );
        return None;
    }
    let mut list = |which: &str, v: &Option<Spanned<StrList>>| {
        let Some(v) = v else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if v.get_ref().items(0).is_empty() {
            ctx.error(
                start(v),
                &sub(key, which),
                "an empty list: give at least one pattern (\"*\" takes any), or leave the key out",
            );
        }
        for (i, (text, at)) in v.get_ref().items(start(v)).into_iter().enumerate() {
            let ikey = item_key(v, &sub(key, which), i);
            match plain_text_error(&text, "a pattern") {
                Some(m) => ctx.error(at, &ikey, m),
                None if which == "san"
                    && !["DNS:", "IP:", "email:", "URI:"]
                        .iter()
                        .any(|p| text.starts_with(p)) =>
                {
                    ctx.error(
                        at,
                        &ikey,
                        format!("a SAN pattern starts with its kind: DNS:, IP:, email: or URI: (found {text:?})"),
                    )
                }
                None => out.push(text),
            }
        }
        out
    };
    let rules = crate::model::ClientCertRules {
        subject: list("subject", &r.subject),
        san: list("san", &r.san),
        issuer: list("issuer", &r.issuer),
    };
    if r.subject.is_none() && r.san.is_none() && r.issuer.is_none() {
        ctx.error(
            start(raw),
            key,
            "client_cert needs at least one of `subject`, `san`, `issuer`",
        );
        return None;
    }
    Some(Arc::new(rules))
}
