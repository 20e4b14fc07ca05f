//! JWT checks: the key source (a JWK set file read now, or a URL), algorithms without `none`, issuers, audiences, token places, claim rules.

use super::*;
use crate::jwks::{algorithm, KeySet, DEFAULT_ALGORITHMS};
use crate::model::{Jwt, JwtKeys};
use crate::raw::RawJwt;
use crate::HttpUrl;

/// How often a JWK set URL is fetched again by default.
const DEFAULT_REFRESH: Duration = Duration::from_secs(600);
/// The largest clock skew taken on `exp` and `nbf`.
const MAX_LEEWAY: Duration = Duration::from_secs(3600);

pub(super) fn jwt(ctx: &mut Ctx<'_>, key: &str, raw: &Spanned<RawJwt>) -> Option<Arc<Jwt>> {
    let r = raw.get_ref();
    let keys = match (&r.jwks, &r.jwks_url) {
        (Some(_), Some(u)) => {
            ctx.error(
                start(u),
                &sub(key, "jwks_url"),
                "give the keys as `jwks` (a file) or `jwks_url`, not both",
            );
            return None;
        }
        (None, None) => {
            ctx.error(
                start(raw),
                key,
                "jwt needs its keys: `jwks` (a JWK set file) or `jwks_url`",
            );
            return None;
        }
        (Some(path), None) => {
            let file = relative_to_config(ctx.file, path.get_ref());
            let read = std::fs::read_to_string(&file)
                .map_err(|e| format!("cannot read JWK set {}: {e}", file.display()))
                .and_then(|text| {
                    KeySet::parse(&text).map_err(|e| format!("{}: {e}", file.display()))
                });
            if let Err(m) = read {
                ctx.error(start(path), &sub(key, "jwks"), m);
            }
            JwtKeys::File(file)
        }
        (None, Some(url)) => {
            if let Err(m) = HttpUrl::parse(url.get_ref()) {
                ctx.error(start(url), &sub(key, "jwks_url"), m);
            }
            let refresh = duration(
                ctx,
                r.refresh.as_ref(),
                &sub(key, "refresh"),
                DEFAULT_REFRESH,
                false,
            );
            JwtKeys::Url {
                url: url.get_ref().clone(),
                refresh,
            }
        }
    };
    if let (JwtKeys::File(_), Some(refresh)) = (&keys, &r.refresh) {
        ctx.error(
            start(refresh),
            &sub(key, "refresh"),
            "`refresh` is for `jwks_url`: a `jwks` file is read again when it changes",
        );
    }
    let algorithms = match &r.algorithms {
        None => DEFAULT_ALGORITHMS.to_vec(),
        Some(list) => {
            let mut out = Vec::new();
            for (i, (name, at)) in list.get_ref().items(start(list)).into_iter().enumerate() {
                let akey = item_key(list, &sub(key, "algorithms"), i);
                match algorithm(&name) {
                    Some(a) => out.push(a),
                    None if name.eq_ignore_ascii_case("none") => ctx.error(
                        at,
                        &akey,
                        "unsigned tokens (`none`) are never taken",
                    ),
                    None => ctx.error(
                        at,
                        &akey,
                        format!("unknown algorithm {name:?} (RS256..512, PS256..512, ES256, ES384, EdDSA, HS256..512)"),
                    ),
                }
            }
            if out.is_empty() && list.get_ref().items(0).is_empty() {
                ctx.error(
                    start(list),
                    &sub(key, "algorithms"),
                    "an empty list takes no token: list algorithms, or leave the key out for every public-key one",
                );
            }
            out
        }
    };
    let strings = |ctx: &mut Ctx<'_>, which: &str, v: &Option<Spanned<StrList>>| {
        let Some(list) = v else {
            return Vec::new();
        };
        if list.get_ref().items(0).is_empty() {
            ctx.error(
                start(list),
                &sub(key, which),
                format!("an empty list: give at least one {which}, or leave the key out"),
            );
        }
        let mut out = Vec::new();
        for (i, (text, at)) in list.get_ref().items(start(list)).into_iter().enumerate() {
            match plain_text_error(&text, which) {
                Some(m) => ctx.error(at, &item_key(list, &sub(key, which), i), m),
                None => out.push(text),
            }
        }
        out
    };
    let issuers = strings(ctx, "issuer", &r.issuer);
    let audiences = strings(ctx, "audience", &r.audience);
    let require = strings(ctx, "require", &r.require);
    let mut leeway = duration(
        ctx,
        r.leeway.as_ref(),
        &sub(key, "leeway"),
        Duration::from_secs(60),
        true,
    );
    if let Some(l) = r.leeway.as_ref().filter(|_| leeway > MAX_LEEWAY) {
        ctx.error(
            start(l),
            &sub(key, "leeway"),
            "a leeway is clock skew: at most 1h",
        );
        leeway = MAX_LEEWAY;
    }
    let header = match &r.header {
        None => Some("authorization".to_string()),
        Some(h) if h.get_ref().is_empty() => None,
        Some(h) => match header_name_error(h.get_ref()) {
            Some(m) => {
                ctx.error(start(h), &sub(key, "header"), m);
                None
            }
            None => Some(h.get_ref().to_ascii_lowercase()),
        },
    };
    let name = |ctx: &mut Ctx<'_>, which: &str, v: &Option<Spanned<String>>| {
        let v = v.as_ref()?;
        if !is_token(v.get_ref()) {
            ctx.error(
                start(v),
                &sub(key, which),
                format!(
                    "{which} name {:?} must be a token (letters, digits, !#$%&'*+-.^_`|~)",
                    v.get_ref()
                ),
            );
            return None;
        }
        Some(v.get_ref().clone())
    };
    let cookie = name(ctx, "cookie", &r.cookie);
    let query = name(ctx, "query", &r.query);
    if header.is_none() && cookie.is_none() && query.is_none() {
        ctx.error(
            start(raw),
            key,
            "jwt has nowhere to find the token: keep `header`, or give a `cookie` or `query` name",
        );
    }
    let mut claims = Vec::new();
    for (claim, values) in r.claims.iter().flat_map(|c| &c.0) {
        let ckey = sub(&sub(key, "claims"), claim.get_ref());
        let list: Vec<String> = values
            .get_ref()
            .items(start(values))
            .into_iter()
            .map(|(v, _)| v)
            .collect();
        if claim.get_ref().is_empty() || list.is_empty() {
            ctx.error(
                start(claim),
                &ckey,
                "a claim rule names a claim and at least one value",
            );
            continue;
        }
        claims.push((claim.get_ref().clone(), list));
    }
    let mut forward_claims = Vec::new();
    for (claim, field) in r.forward_claims.iter().flat_map(|c| &c.0) {
        let fkey = sub(&sub(key, "forward_claims"), claim.get_ref());
        let f = field.get_ref().to_ascii_lowercase();
        let framing = [
            "host",
            "content-length",
            "transfer-encoding",
            "connection",
            "te",
            "upgrade",
        ];
        let portico = [
            "x-forwarded-for",
            "x-forwarded-proto",
            "x-forwarded-host",
            "x-real-ip",
            "x-client-cert-subject",
            "via",
        ];
        match header_name_error(&f) {
            Some(m) => ctx.error(start(field), &fkey, m),
            None if framing.contains(&f.as_str()) => ctx.error(
                start(field),
                &fkey,
                format!("{f:?} frames the request: a claim may not set it"),
            ),
            None if portico.contains(&f.as_str()) => ctx.error(
                start(field),
                &fkey,
                format!("Portico sets {f:?} itself: a claim may not set it"),
            ),
            None => forward_claims.push((claim.get_ref().clone(), f)),
        }
    }
    let realm = realm(ctx, key, r.realm.as_ref());
    Some(Arc::new(Jwt {
        keys,
        algorithms,
        issuers,
        audiences,
        leeway,
        header,
        cookie,
        query,
        require,
        claims,
        forward_claims,
        keep_token: r.keep_token.as_ref().is_some_and(|k| *k.get_ref()),
        realm,
    }))
}
