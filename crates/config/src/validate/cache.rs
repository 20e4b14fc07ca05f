//! The response cache: the `[cache]` store and a route's `cache` table.

use super::*;
use crate::model::{
    CacheDisk, CacheStore, QueryKey, RouteCache, DEFAULT_CACHE_DISK_SIZE,
    DEFAULT_CACHE_LOCK_TIMEOUT, DEFAULT_CACHE_MAX_OBJECT, DEFAULT_CACHE_MEMORY,
};
use crate::raw::{RawCache, RawRouteCache};

/// Smallest `[cache] memory`: 1 MiB.
const MIN_CACHE_MEMORY: u64 = 1 << 20;

/// `[cache]`, or its defaults when a route caches and the table is absent; None when nothing
/// caches and the table is absent.
pub(super) fn cache_store(
    ctx: &mut Ctx<'_>,
    raw: Option<&RawCache>,
    any_route: bool,
) -> Option<CacheStore> {
    let Some(raw) = raw else {
        return any_route.then_some(CacheStore {
            memory: DEFAULT_CACHE_MEMORY,
            max_object: DEFAULT_CACHE_MAX_OBJECT,
            lock_timeout: DEFAULT_CACHE_LOCK_TIMEOUT,
            tag_header: None,
            disk: None,
        });
    };
    let memory = size(
        ctx,
        raw.memory.as_ref(),
        "cache.memory",
        DEFAULT_CACHE_MEMORY,
        MIN_CACHE_MEMORY,
        1 << 40,
    );
    let max_object = size(
        ctx,
        raw.max_object.as_ref(),
        "cache.max_object",
        DEFAULT_CACHE_MAX_OBJECT.min(memory),
        1,
        u64::MAX,
    );
    if max_object > memory {
        if let Some(m) = &raw.max_object {
            ctx.error(
                start(m),
                "cache.max_object",
                format!("must not exceed cache.memory ({})", format_size(memory)),
            );
        }
    }
    let lock_timeout = duration(
        ctx,
        raw.lock_timeout.as_ref(),
        "cache.lock_timeout",
        DEFAULT_CACHE_LOCK_TIMEOUT,
        false,
    );
    let tag_header = raw.tag_header.as_ref().map(|h| {
        let name = h.get_ref().to_ascii_lowercase();
        if let Some(m) = header_name_error(&name) {
            ctx.error(start(h), "cache.tag_header", m);
        }
        name
    });
    let disk = cache_disk(ctx, raw, max_object);
    Some(CacheStore {
        memory,
        max_object: max_object.min(memory),
        lock_timeout,
        tag_header,
        disk,
    })
}

/// `[cache] disk_path` and `disk_size`: the disk tier, when a path is given.
fn cache_disk(ctx: &mut Ctx<'_>, raw: &RawCache, max_object: u64) -> Option<CacheDisk> {
    let Some(path) = raw.disk_path.as_ref() else {
        if let Some(s) = &raw.disk_size {
            ctx.error(
                start(s),
                "cache.disk_size",
                "has no effect without cache.disk_path (the directory of the disk tier)",
            );
        }
        return None;
    };
    if let Some(m) = plain_text_error(path.get_ref(), "the path") {
        ctx.error(start(path), "cache.disk_path", m);
        return None;
    }
    let size = size(
        ctx,
        raw.disk_size.as_ref(),
        "cache.disk_size",
        DEFAULT_CACHE_DISK_SIZE,
        MIN_CACHE_MEMORY,
        1 << 50,
    );
    if size < max_object {
        let m = format!(
            "must be at least cache.max_object ({})",
            format_size(max_object)
        );
        match &raw.disk_size {
            Some(s) => ctx.error(start(s), "cache.disk_size", m),
            None => ctx.error(
                start(path),
                "cache.disk_size",
                format!("(1GiB by default) {m}"),
            ),
        }
    }
    Some(CacheDisk {
        path: relative_to_config(ctx.file, path.get_ref()),
        size,
    })
}

/// A route's `cache` table; None when `enabled = false`.
pub(super) fn route_cache(
    ctx: &mut Ctx<'_>,
    key: &str,
    item: &Spanned<RawRouteCache>,
) -> Option<Box<RouteCache>> {
    let raw = item.get_ref();
    let names = |ctx: &mut Ctx<'_>, name: &str, list: &Option<Spanned<StrList>>, field: bool| {
        let Some(list) = list else {
            return Vec::new();
        };
        let lkey = sub(key, name);
        let mut out = Vec::new();
        for (i, (text, at)) in list.get_ref().items(start(list)).into_iter().enumerate() {
            let ikey = item_key(list, &lkey, i);
            if !is_token(&text) {
                let what = if field { "field" } else { "cookie" };
                ctx.error(at, &ikey, format!("invalid {what} name {text:?}"));
                continue;
            }
            out.push(if field {
                text.to_ascii_lowercase()
            } else {
                text
            });
        }
        out
    };
    let only = names(ctx, "query_only", &raw.query_only, false);
    let except = names(ctx, "query_except", &raw.query_except, false);
    let mut query = match raw.query.as_ref().map(|q| (q, q.get_ref().as_str())) {
        None | Some((_, "all")) => QueryKey::All,
        Some((_, "none")) => QueryKey::None,
        Some((q, other)) => {
            ctx.error(
                start(q),
                &sub(key, "query"),
                format!("expected \"all\" or \"none\", found {other:?} (query_only and query_except name parameters)"),
            );
            QueryKey::All
        }
    };
    let lists = [(&raw.query_only, only), (&raw.query_except, except)];
    for (i, (at, mut list)) in lists.into_iter().enumerate() {
        let Some(at) = at else { continue };
        let name = ["query_only", "query_except"][i];
        if query != QueryKey::All || raw.query.is_some() {
            ctx.error(
                start(at),
                &sub(key, name),
                "query, query_only and query_except exclude each other: use one",
            );
            continue;
        }
        list.sort();
        list.dedup();
        query = match i {
            0 => QueryKey::Only(list),
            _ => QueryKey::Except(list),
        };
    }
    let key_headers = names(ctx, "key_headers", &raw.key_headers, true);
    let key_cookies = names(ctx, "key_cookies", &raw.key_cookies, false);
    let bypass_headers = names(ctx, "bypass_headers", &raw.bypass_headers, true);
    let bypass_cookies = names(ctx, "bypass_cookies", &raw.bypass_cookies, false);
    let ttl = |ctx: &mut Ctx<'_>, name: &str, v: &Option<Spanned<Scalar>>| {
        v.as_ref()
            .map(|v| duration(ctx, Some(v), &sub(key, name), Duration::ZERO, true))
    };
    let default_ttl = ttl(ctx, "default_ttl", &raw.default_ttl);
    let override_ttl = ttl(ctx, "override_ttl", &raw.override_ttl);
    let stale_if_error = ttl(ctx, "stale_if_error", &raw.stale_if_error).unwrap_or_default();
    let stale_while_revalidate =
        ttl(ctx, "stale_while_revalidate", &raw.stale_while_revalidate).unwrap_or_default();
    if raw.enabled.as_ref().is_some_and(|e| !*e.get_ref()) {
        return None;
    }
    Some(Box::new(RouteCache {
        query,
        key_headers,
        key_cookies,
        default_ttl,
        override_ttl,
        stale_if_error,
        stale_while_revalidate,
        bypass_headers,
        bypass_cookies,
        lock: raw.lock.as_ref().is_none_or(|b| *b.get_ref()),
        scope: 0,
    }))
}

/// Set a proxy route's cache scope (see [`RouteCache::scope`]) from its name and group.
pub(super) fn scope_cache(action: &mut Action, route: &str, upstreams: &[String]) {
    let Action::Proxy(p) = action else {
        return;
    };
    let group = upstreams.get(p.upstream).map_or("", String::as_str);
    if let Some(c) = p.cache.as_mut() {
        c.scope = crate::hash::hash64(canonical(route, group, c).as_bytes());
    }
}

/// The route's name, its group and its cache table as one text, spelled the same by every
/// version of Portico (the disk tier's files outlive the process): adding a field to the
/// table fails to compile here until its spelling is decided.
fn canonical(route: &str, group: &str, c: &RouteCache) -> String {
    let RouteCache {
        query,
        key_headers,
        key_cookies,
        default_ttl,
        override_ttl,
        stale_if_error,
        stale_while_revalidate,
        bypass_headers,
        bypass_cookies,
        lock,
        scope: _,
    } = c;
    let query = match query {
        QueryKey::All => "all".to_string(),
        QueryKey::None => "none".to_string(),
        QueryKey::Only(names) => format!("only:{}", names.join(",")),
        QueryKey::Except(names) => format!("except:{}", names.join(",")),
    };
    let ms = |d: &Option<Duration>| d.map_or("-".to_string(), |d| d.as_millis().to_string());
    format!(
        "route={route}\ngroup={group}\nquery={query}\nkey_headers={}\nkey_cookies={}\ndefault_ttl={}\noverride_ttl={}\nstale_if_error={}\nstale_while_revalidate={}\nbypass_headers={}\nbypass_cookies={}\nlock={lock}",
        key_headers.join(","),
        key_cookies.join(","),
        ms(default_ttl),
        ms(override_ttl),
        stale_if_error.as_millis(),
        stale_while_revalidate.as_millis(),
        bypass_headers.join(","),
        bypass_cookies.join(","),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scope_of_a_cache_table_is_the_same_in_every_build() {
        let c = RouteCache {
            query: QueryKey::Except(vec!["utm".into()]),
            key_headers: vec!["x-tenant".into()],
            key_cookies: vec![],
            default_ttl: Some(Duration::from_secs(60)),
            override_ttl: None,
            stale_if_error: Duration::from_secs(3600),
            stale_while_revalidate: Duration::ZERO,
            bypass_headers: vec![],
            bypass_cookies: vec!["session".into()],
            lock: true,
            scope: 0,
        };
        let text = canonical("r", "app", &c);
        assert_eq!(
            text,
            "route=r\ngroup=app\nquery=except:utm\nkey_headers=x-tenant\nkey_cookies=\ndefault_ttl=60000\noverride_ttl=-\nstale_if_error=3600000\nstale_while_revalidate=0\nbypass_headers=\nbypass_cookies=session\nlock=true"
        );
        // The hash itself is pinned in `crate::hash` (a change there orphans every disk tier).
        let scope = |route: &str| crate::hash::hash64(canonical(route, "app", &c).as_bytes());
        assert_ne!(scope("r"), scope("r2"));
    }
}
