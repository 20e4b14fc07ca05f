//! HTTP Basic authentication (realm, users from the table and an htpasswd file, hashes checked to be bcrypt or argon2) and forward auth.

use super::*;
use crate::htpasswd::hash_error;
use crate::model::BasicAuth;
use crate::model::ForwardAuth;
use crate::raw::{RawBasicAuth, RawForwardAuth};

pub(super) fn basic_auth(
    ctx: &mut Ctx<'_>,
    key: &str,
    raw: &Spanned<RawBasicAuth>,
) -> Option<Arc<BasicAuth>> {
    let r = raw.get_ref();
    let realm = realm(ctx, key, r.realm.as_ref());
    let mut file_users = Vec::new();
    let mut htpasswd = None;
    if let Some(path) = &r.htpasswd {
        let hkey = sub(key, "htpasswd");
        let file = relative_to_config(ctx.file, path.get_ref());
        match std::fs::read_to_string(&file) {
            Err(e) => ctx.error(
                start(path),
                &hkey,
                format!("cannot read htpasswd file {}: {e}", file.display()),
            ),
            Ok(text) => {
                let (users, errors) = crate::htpasswd::parse(&text, &file.display().to_string());
                for m in errors {
                    ctx.error(start(path), &hkey, m);
                }
                file_users = users;
            }
        }
        htpasswd = Some(file);
    }
    let mut table: Vec<(String, String)> = Vec::new();
    if let Some(listed) = &r.users {
        let ukey = sub(key, "users");
        for (user, hash) in &listed.0 {
            let name = user.get_ref();
            if name.is_empty() || name.contains(':') || name.chars().any(char::is_control) {
                ctx.error(
                    start(user),
                    &sub(&ukey, name),
                    "a user name is text without ':' or control characters",
                );
                continue;
            }
            match hash_error(hash.get_ref()) {
                Some(m) => ctx.error(start(hash), &sub(&ukey, name), m),
                None => crate::htpasswd::set_user(&mut table, name, hash.get_ref()),
            }
        }
    }
    if r.users.as_ref().is_none_or(|u| u.0.is_empty()) && r.htpasswd.is_none() {
        ctx.error(
            start(raw),
            key,
            "basic_auth needs `users` or an `htpasswd` file",
        );
        return None;
    }
    Some(Arc::new(BasicAuth {
        realm,
        users: crate::htpasswd::merge(file_users, &table),
        htpasswd,
        table,
        keep_authorization: r.keep_authorization.as_ref().is_some_and(|k| *k.get_ref()),
        lockout: r.lockout.as_ref().map(|l| {
            let lkey = sub(key, "lockout");
            let raw = l.get_ref();
            let failures = int(
                ctx,
                raw.failures.as_ref(),
                &sub(&lkey, "failures"),
                10,
                1,
                1_000_000,
            );
            let window = duration(
                ctx,
                raw.window.as_ref(),
                &sub(&lkey, "window"),
                Duration::from_secs(60),
                false,
            );
            crate::model::Lockout {
                failures: failures as u32,
                window,
            }
        }),
    }))
}

/// A `realm` (default "restricted"): printable text without quotes or backslashes.
pub(super) fn realm(ctx: &mut Ctx<'_>, key: &str, v: Option<&Spanned<String>>) -> String {
    let Some(v) = v else {
        return "restricted".to_string();
    };
    let text = v.get_ref();
    if text.is_empty()
        || text
            .chars()
            .any(|c| c.is_control() || c == '"' || c == '\\')
    {
        ctx.error(
            start(v),
            &sub(key, "realm"),
            "a realm is printable text without quotes or backslashes",
        );
    }
    text.clone()
}

/// `forward_auth`: a known group, a path, header names, a cache time.
pub(super) fn forward_auth(
    ctx: &mut Ctx<'_>,
    key: &str,
    raw: &Spanned<RawForwardAuth>,
    upstreams: &[String],
) -> Option<ForwardAuth> {
    let r = raw.get_ref();
    let Some(group) = &r.group else {
        ctx.error(
            start(raw),
            key,
            "forward_auth needs `group`, the upstream group of the auth service",
        );
        return None;
    };
    let Some(gi) = upstreams.iter().position(|n| n == group.get_ref()) else {
        ctx.error(
            start(group),
            &sub(key, "group"),
            format!("unknown upstream group {:?}", group.get_ref()),
        );
        return None;
    };
    let path = r.path.as_ref().and_then(|p| {
        let text = p.get_ref();
        if !text.starts_with('/') || text.chars().any(|c| c.is_control() || c == ' ' || c == '#') {
            ctx.error(
                start(p),
                &sub(key, "path"),
                format!("path {text:?} must start with '/' and have no spaces or '#'"),
            );
            return None;
        }
        Some(text.clone())
    });
    let names = |ctx: &mut Ctx<'_>, which: &str, v: &Option<Spanned<StrList>>, default: &[&str]| {
        let Some(list) = v else {
            return default.iter().map(|s| s.to_string()).collect();
        };
        let mut out = Vec::new();
        for (text, at) in list.get_ref().items(start(list)) {
            match header_name_error(&text) {
                Some(m) => ctx.error(at, &sub(key, which), m),
                None => out.push(text.to_ascii_lowercase()),
            }
        }
        out
    };
    let request_headers = names(
        ctx,
        "request_headers",
        &r.request_headers,
        &["authorization", "cookie"],
    );
    let copy_headers = names(ctx, "copy_headers", &r.copy_headers, &[]);
    let cache = duration(
        ctx,
        r.cache.as_ref(),
        &sub(key, "cache"),
        Duration::ZERO,
        true,
    );
    Some(ForwardAuth {
        group: gi,
        path,
        request_headers,
        copy_headers,
        cache,
        fail_open: r.fail_open.as_ref().is_some_and(|f| *f.get_ref()),
    })
}
