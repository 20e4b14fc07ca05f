//! The response cache (`[cache]` and a route's `cache` table): defaults, keys, errors.

use portico_config::{parse, Action, Config, QueryKey, RouteCache};
use std::time::Duration;

/// `top` lines, then a listener with one proxy route with `route` lines.
fn config(top: &str, route: &str) -> Result<Config, String> {
    let text = format!(
        "{top}\n[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\nproxy = \"a\"\n{route}\n[upstreams.a]\nservers = [\"127.0.0.1:1\"]\n"
    );
    parse(&text, "t.toml").map_err(|e| e.to_string())
}

fn route_cache(c: &Config) -> Option<&RouteCache> {
    match &c.listeners[0].routes[0].action {
        Action::Proxy(p) => p.cache.as_deref(),
        _ => None,
    }
}

#[test]
fn a_caching_route_gets_the_store_defaults() {
    let none = config("", "").unwrap();
    assert!(none.cache.is_none() && route_cache(&none).is_none());
    let c = config("", "[listeners.routes.cache]").unwrap();
    let store = c.cache.clone().unwrap();
    assert_eq!((store.memory, store.max_object), (64 << 20, 8 << 20));
    assert_eq!(store.lock_timeout, Duration::from_secs(5));
    let r = route_cache(&c).unwrap();
    assert_eq!(r.query, QueryKey::All);
    assert!(r.lock && r.default_ttl.is_none() && r.stale_if_error.is_zero());
    let off = config("", "cache = { enabled = false }").unwrap();
    assert!(off.cache.is_none() && route_cache(&off).is_none());
}

#[test]
fn keys_and_lifetimes() {
    let c = config(
        "[cache]\nmemory = \"1GiB\"\nmax_object = \"1MiB\"\ntag_header = \"Surrogate-Key\"",
        "cache = { query_except = [\"utm\", \"fbclid\"], key_headers = [\"X-Tenant\"], default_ttl = \"1m\", stale_if_error = \"1h\", lock = false }",
    )
    .unwrap();
    let store = c.cache.clone().unwrap();
    assert_eq!((store.memory, store.max_object), (1 << 30, 1 << 20));
    assert_eq!(store.tag_header.as_deref(), Some("surrogate-key"));
    let r = route_cache(&c).unwrap();
    assert_eq!(
        r.query,
        QueryKey::Except(vec!["fbclid".into(), "utm".into()])
    );
    assert_eq!(r.key_headers, ["x-tenant"]);
    assert_eq!(r.default_ttl, Some(Duration::from_secs(60)));
    assert_eq!(r.stale_if_error, Duration::from_secs(3600));
    assert!(!r.lock);
    assert!(store.disk.is_none());
}

#[test]
fn the_disk_tier_has_a_path_and_a_size() {
    let c = config("[cache]\ndisk_path = \"/var/cache/portico\"", "cache = {}").unwrap();
    let disk = c.cache.unwrap().disk.unwrap();
    assert_eq!(disk.path, std::path::Path::new("/var/cache/portico"));
    assert_eq!(disk.size, 1 << 30);
    let c = config(
        "[cache]\ndisk_path = \"cache\"\ndisk_size = \"20GiB\"",
        "cache = {}",
    )
    .unwrap();
    let disk = c.cache.unwrap().disk.unwrap();
    // A relative path is taken from the configuration file's directory.
    assert!(disk.path.ends_with("cache"), "{}", disk.path.display());
    assert_eq!(disk.size, 20 << 30);
    let e = |top: &str| config(top, "cache = {}").unwrap_err();
    assert_eq!(
        e("[cache]\ndisk_size = \"1GiB\""),
        "t.toml:2:13: cache.disk_size: has no effect without cache.disk_path (the directory of the disk tier)"
    );
    assert!(e("[cache]\ndisk_path = \"\"").contains("cache.disk_path: the path must not be empty"));
    assert!(e("[cache]\ndisk_path = \"d\"\ndisk_size = \"4MiB\"")
        .contains("cache.disk_size: must be at least cache.max_object (8MiB)"));
}

#[test]
fn errors_name_the_key_and_position() {
    let e = |top: &str, route: &str| config(top, route).unwrap_err();
    assert_eq!(
        e("", "cache = { query = \"some\" }"),
        "t.toml:6:19: listeners[0].routes[0].cache.query: expected \"all\" or \"none\", found \"some\" (query_only and query_except name parameters)"
    );
    assert!(e("", "cache = { query = \"none\", query_only = [\"a\"] }")
        .contains("cache.query_only: query, query_only and query_except exclude each other"));
    assert!(e("", "cache = { key_headers = [\"bad name\"] }")
        .contains("cache.key_headers[0]: invalid field name \"bad name\""));
    assert!(
        e("", "cache = { default_ttl = 60 }").contains("cache.default_ttl: expected a duration")
    );
    assert!(e("[cache]\nmemory = \"1k\"", "cache = {}")
        .contains("cache.memory: must be at least 1048576 bytes"));
    assert!(e(
        "[cache]\nmemory = \"2MiB\"\nmax_object = \"4MiB\"",
        "cache = {}"
    )
    .contains("cache.max_object: must not exceed cache.memory (2MiB)"));
    assert!(e("", "cache = { ttl = \"1m\" }").contains("unknown field `ttl`"));
    let misplaced = parse(
        "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\nrespond = { status = 200 }\ncache = {}\n",
        "t.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        misplaced.contains("`cache` only applies to proxy routes"),
        "{misplaced}"
    );
}
