//! Response compression (`compression` tables) and precompressed siblings: defaults, inheritance, errors, `explain`.

use portico_config::{explain, parse, Action, Coding, Compression, Config};

const UPSTREAM: &str = "[upstreams.a]\nservers = [\"127.0.0.1:1\"]\n";

/// A listener with `listener` lines, then one proxy route with `route` lines.
fn config(listener: &str, route: &str) -> Result<Config, String> {
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:8080\"\n{listener}\n[[listeners.routes]]\nproxy = \"a\"\n{route}\n{UPSTREAM}"
    );
    parse(&text, "t.toml").map_err(|e| e.to_string())
}

fn of(listener: &str, route: &str) -> Option<Compression> {
    let c = config(listener, route).unwrap_or_else(|e| panic!("{e}"));
    c.listeners[0].routes[0].compression.clone()
}

#[test]
fn off_unless_configured_and_an_empty_table_gets_the_defaults() {
    assert_eq!(of("", ""), None);
    let c = of("[listeners.compression]", "").unwrap();
    assert_eq!(c, Compression::defaults());
    assert_eq!(c.algorithms, [Coding::Zstd, Coding::Br, Coding::Gzip]);
    assert_eq!(
        (c.gzip_level, c.brotli_level, c.zstd_level, c.min_length),
        (6, 4, 3, 256)
    );
    assert!(c.compresses_type(b"text/html; charset=utf-8"));
    assert!(c.compresses_type(b"Application/JSON"));
    assert!(!c.compresses_type(b"image/png"));
    assert!(!c.compresses_type(b"text/"));
    assert!(!c.compresses_type(b"texta/html"));
}

#[test]
fn a_routes_table_overrides_its_listeners_keys_and_may_turn_it_off() {
    let listener = "[listeners.compression]\nalgorithms = [\"gzip\"]\ngzip_level = 9\n";
    let c = of(
        listener,
        "[listeners.routes.compression]\nmin_length = \"1k\"\n",
    )
    .unwrap();
    assert_eq!(c.algorithms, [Coding::Gzip]);
    assert_eq!((c.gzip_level, c.min_length), (9, 1024));
    assert_eq!(of(listener, "compression = { enabled = false }"), None);
    let own = of(
        "",
        "compression = { algorithms = \"br\", types = [\"text/html\"] }",
    )
    .unwrap();
    assert_eq!(own.algorithms, [Coding::Br]);
    assert_eq!(own.types, ["text/html"]);
    assert!(!own.compresses_type(b"text/css"));
}

#[test]
fn errors_name_the_key_and_position() {
    let e = |l: &str, r: &str| config(l, r).unwrap_err();
    assert_eq!(
        e("[listeners.compression]\nalgorithms = [\"gzip\", \"deflate\"]", ""),
        "t.toml:4:23: listeners[0].compression.algorithms[1]: unknown coding \"deflate\": expected zstd, br or gzip"
    );
    assert_eq!(
        e("", "compression = { algorithms = [\"br\", \"br\"] }"),
        "t.toml:6:37: listeners[0].routes[0].compression.algorithms[1]: \"br\" is listed twice"
    );
    assert_eq!(
        e("[listeners.compression]\ngzip_level = 10", ""),
        "t.toml:4:14: listeners[0].compression.gzip_level: must be at most 9, found 10"
    );
    assert!(e("compression = { zstd_level = 0 }", "").contains("zstd_level: must be at least 1"));
    assert!(e("compression = { brotli_level = 12 }", "").contains("must be at most 11"));
    assert!(e("compression = { types = [\"html\"] }", "").contains("invalid media type \"html\""));
    assert!(e("compression = { types = [] }", "").contains("at least one media type"));
    assert!(e("compression = { algorithms = [] }", "").contains("at least one of zstd, br, gzip"));
    assert!(e("compression = { level = 1 }", "").contains("unknown field `level`"));
}

#[test]
fn static_routes_list_precompressed_siblings_and_other_routes_may_not() {
    let text = "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[listeners.compression]\n\
                [[listeners.routes]]\npath = \"/assets/**\"\nstatic = \"/srv\"\nprecompressed = [\"br\", \"gzip\"]\n\
                [[listeners.routes]]\nproxy = \"a\"\n"
        .to_string()
        + UPSTREAM;
    let c = parse(&text, "t.toml").unwrap();
    let Action::Static(s) = &c.listeners[0].routes[0].action else {
        panic!("not static")
    };
    assert_eq!(s.precompressed, [Coding::Br, Coding::Gzip]);
    // The listener's compression applies to proxied responses only.
    assert_eq!(c.listeners[0].routes[0].compression, None);
    assert!(c.listeners[0].routes[1].compression.is_some());
    let text = explain(&c);
    assert!(text.contains("precompressed siblings: br, gzip"), "{text}");
    assert!(
        text.contains("compression: zstd 3, br 4, gzip 6 (in this order)"),
        "{text}"
    );
    let misplaced = config("", "precompressed = [\"br\"]").unwrap_err();
    assert!(
        misplaced.contains("`precompressed` only applies to static routes"),
        "{misplaced}"
    );
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\nstatic = \"/srv\"\n\
         compression = {{ gzip_level = 1 }}\n{UPSTREAM}"
    );
    let e = parse(&text, "t.toml").unwrap_err().to_string();
    assert!(
        e.contains("`compression` only applies to proxy routes"),
        "{e}"
    );
}
