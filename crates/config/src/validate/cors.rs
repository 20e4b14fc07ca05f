//! A route's CORS policy: origins (exact or by subdomain), methods, headers, credentials, max age.

use super::*;
use crate::model::{Cors, OriginPattern};
use crate::raw::RawCors;

/// Methods a preflight may ask for when `allow_methods` is not set: the CORS-safelisted ones.
const DEFAULT_METHODS: [&str; 3] = ["GET", "HEAD", "POST"];

pub(super) fn cors(ctx: &mut Ctx<'_>, key: &str, raw: &RawCors) -> Option<Cors> {
    let okey = sub(key, "allow_origins");
    let Some(origins_raw) = &raw.allow_origins else {
        let at = cors_at(raw).unwrap_or(0);
        ctx.error(
            at,
            &okey,
            "a cors table needs `allow_origins`: the origins allowed (such as [\"https://app.example.com\"]), or [\"*\"] for any",
        );
        return None;
    };
    let items = origins_raw.get_ref().items(start(origins_raw));
    if items.is_empty() {
        ctx.error(
            start(origins_raw),
            &okey,
            "must list at least one origin, or \"*\"",
        );
    }
    let mut origins = Vec::new();
    let mut any = false;
    for (i, (text, at)) in items.iter().enumerate() {
        let ikey = item_key(origins_raw, &okey, i);
        if text == "*" {
            any = true;
            continue;
        }
        match origin_pattern(text) {
            Ok(p) => origins.push(p),
            Err(m) => ctx.error(*at, &ikey, m),
        }
    }
    if any && !origins.is_empty() {
        ctx.error(
            start(origins_raw),
            &okey,
            "\"*\" allows every origin: list no other origin beside it",
        );
    }
    if any {
        origins.clear();
    }
    let credentials = raw.allow_credentials.as_ref().is_some_and(|c| *c.get_ref());
    if credentials && any {
        let at = raw.allow_credentials.as_ref().map_or(0, start);
        ctx.error(
            at,
            &sub(key, "allow_credentials"),
            "credentials cannot be allowed for any origin (browsers refuse `*` with credentials): list the origins",
        );
    }
    let methods = match &raw.allow_methods {
        None => DEFAULT_METHODS.map(String::from).to_vec(),
        Some(list) => {
            let mkey = sub(key, "allow_methods");
            let mut out = Vec::new();
            for (i, (text, at)) in list.get_ref().items(start(list)).iter().enumerate() {
                if is_token(text) {
                    out.push(text.to_ascii_uppercase());
                } else {
                    ctx.error(
                        *at,
                        &item_key(list, &mkey, i),
                        format!("invalid method {text:?}"),
                    );
                }
            }
            out
        }
    };
    let headers = match &raw.allow_headers {
        None => Some(Vec::new()),
        Some(list) => names(ctx, &sub(key, "allow_headers"), list, true),
    };
    let expose_headers = match &raw.expose_headers {
        None => Vec::new(),
        Some(list) => names(ctx, &sub(key, "expose_headers"), list, false).unwrap_or_default(),
    };
    let max_age = raw
        .max_age
        .as_ref()
        .map(|v| duration(ctx, Some(v), &sub(key, "max_age"), Duration::ZERO, true));
    Some(Cors {
        origins,
        methods,
        headers,
        expose_headers,
        credentials,
        max_age,
    })
}

/// Header names (`*` = any when `star`: None).
fn names(ctx: &mut Ctx<'_>, key: &str, list: &Spanned<StrList>, star: bool) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut any = false;
    for (i, (text, at)) in list.get_ref().items(start(list)).iter().enumerate() {
        if star && text == "*" {
            any = true;
        } else if let Some(m) = header_name_error(text) {
            ctx.error(*at, &item_key(list, key, i), m);
        } else {
            out.push(if star {
                text.to_ascii_lowercase()
            } else {
                text.clone()
            });
        }
    }
    (!any).then_some(out)
}

/// `https://app.example.com[:port]` or `https://*.example.com[:port]`.
fn origin_pattern(text: &str) -> Result<OriginPattern, String> {
    let invalid = || {
        format!(
            "invalid origin {text:?}: expected scheme://host[:port] such as \"https://app.example.com\", \"https://*.example.com\" or \"*\""
        )
    };
    let (scheme, rest) = text.split_once("://").ok_or_else(invalid)?;
    if scheme.is_empty()
        || !scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
    {
        return Err(invalid());
    }
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => (h, Some(p)),
        _ => (rest, None),
    };
    let (wild, name) = match host.strip_prefix("*.") {
        Some(n) => (true, n),
        None => (false, host),
    };
    let label_ok =
        |l: &str| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if name.is_empty() || !name.split('.').all(label_ok) {
        return Err(invalid());
    }
    let scheme = scheme.to_ascii_lowercase();
    let default_port = matches!(
        (scheme.as_str(), port),
        ("https", Some("443")) | ("http", Some("80"))
    );
    let port = port
        .filter(|_| !default_port)
        .map_or(String::new(), |p| format!(":{p}"));
    let name = name.to_ascii_lowercase();
    Ok(match wild {
        true => OriginPattern::Subdomains {
            scheme: format!("{scheme}://"),
            suffix: format!(".{name}{port}"),
        },
        false => OriginPattern::Exact(format!("{scheme}://{name}{port}")),
    })
}

/// Where a cors table starts (its first key).
pub(super) fn cors_at(c: &RawCors) -> Option<usize> {
    [
        c.allow_origins.as_ref().map(start),
        c.allow_methods.as_ref().map(start),
        c.allow_headers.as_ref().map(start),
        c.expose_headers.as_ref().map(start),
        c.allow_credentials.as_ref().map(start),
        c.max_age.as_ref().map(start),
    ]
    .into_iter()
    .flatten()
    .min()
}

#[cfg(test)]
mod tests {
    use super::origin_pattern;
    use crate::model::OriginPattern;

    #[test]
    fn origins_are_normalized() {
        assert_eq!(
            origin_pattern("HTTPS://App.Example.com:443"),
            Ok(OriginPattern::Exact("https://app.example.com".into()))
        );
        assert_eq!(
            origin_pattern("http://localhost:3000"),
            Ok(OriginPattern::Exact("http://localhost:3000".into()))
        );
        assert_eq!(
            origin_pattern("https://*.example.com"),
            Ok(OriginPattern::Subdomains {
                scheme: "https://".into(),
                suffix: ".example.com".into()
            })
        );
        for bad in [
            "example.com",
            "https://",
            "https://a b",
            "https://*",
            "https://a.com/path",
            "*.example.com",
        ] {
            assert!(origin_pattern(bad).is_err(), "{bad}");
        }
    }
}
