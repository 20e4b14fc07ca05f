//! Successful parses: defaults filled, every spelling, the embedded default, `explain`.

use std::time::Duration;

use portico_config::{
    explain, parse, AccessLogFormat, Action, Balance, HostMatch, ListenerLimits, PathMatch,
    Template, DEFAULT_CONFIG, DEFAULT_MAX_BODY_BYTES,
};

fn route_config(route: &str) -> String {
    format!(
        "[upstreams.api]\nservers = [\"127.0.0.1:9001\"]\n\n[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\n{route}\n"
    )
}

#[test]
fn embedded_default_parses() {
    let config = parse(DEFAULT_CONFIG, "<embedded>").expect("DEFAULT_CONFIG must be valid");
    assert_eq!(config.listeners.len(), 2);
    let proxy = &config.listeners[0];
    assert_eq!(
        (proxy.name.as_str(), proxy.address.to_string().as_str()),
        ("proxy", "127.0.0.1:8080")
    );
    assert_eq!(proxy.routes.len(), 1);
    assert_eq!(proxy.routes[0].name, "proxy#0");
    assert!(proxy.routes[0].matcher.path.is_none() && proxy.routes[0].matcher.hosts.is_empty());
    let Action::Proxy(p) = &proxy.routes[0].action else {
        panic!("proxy route expected")
    };
    let group = &config.upstreams[p.upstream];
    assert_eq!(group.name, "origin");
    assert_eq!(group.servers.len(), 1);
    assert_eq!(group.servers[0].address.to_string(), "127.0.0.1:8081");
    let origin = &config.listeners[1];
    assert_eq!(
        (origin.name.as_str(), origin.address.to_string().as_str()),
        ("origin", "127.0.0.1:8081")
    );
    let Action::Origin(o) = &origin.routes[0].action else {
        panic!("origin route expected")
    };
    assert!(o.root.is_none());
}

#[test]
fn defaults_are_filled() {
    let config = parse(&route_config("proxy = \"api\""), "t.toml").unwrap();
    assert_eq!(config.drain_timeout, Duration::from_secs(30));
    assert!(config.workers.is_none());
    assert!(config.access_log.is_none());
    let listener = &config.listeners[0];
    assert_eq!(listener.name, "127.0.0.1:8080");
    assert_eq!(listener.limits, ListenerLimits::default());
    let d = ListenerLimits::default();
    assert_eq!(d.max_connections, 10_000);
    assert_eq!(d.max_headers, 100);
    assert_eq!(d.max_head_bytes, 65_536);
    assert_eq!(d.max_request_line, 8_192);
    assert_eq!(d.head_timeout, Duration::from_secs(10));
    assert_eq!(d.keepalive_timeout, Duration::from_secs(60));
    assert_eq!(d.body_min_rate, 1024);
    assert_eq!(d.max_requests_per_connection, 0);
    let route = &listener.routes[0];
    assert_eq!(route.name, "127.0.0.1:8080#0");
    assert_eq!(route.max_body_bytes, DEFAULT_MAX_BODY_BYTES);
    assert_eq!(route.max_body_bytes, 1 << 20);
    assert!(route.request_headers.set.is_empty() && route.response_headers.remove.is_empty());
    let Action::Proxy(p) = &route.action else {
        panic!()
    };
    assert!(p.forwarded_headers && !p.via && p.preserve_host);
    assert!(p.strip_prefix.is_none() && p.rewrite_prefix.is_none());
    let group = &config.upstreams[0];
    assert_eq!(group.balance, Balance::RoundRobin);
    assert_eq!(group.keepalive, 64);
    assert_eq!(group.max_connections_per_server, 0);
    assert_eq!(group.connect_timeout, Duration::from_secs(5));
    assert_eq!(group.response_header_timeout, Duration::from_secs(60));
    assert_eq!(group.idle_timeout, Duration::from_secs(60));
    assert_eq!(group.servers[0].weight, 1);
}

#[test]
fn everything_set() {
    let text = r#"
workers = 2
drain_timeout = "5s"

[access_log]
path = "/var/log/portico/access.log"
format = "json"

[[listeners]]
name = "public"
address = "0.0.0.0:8080"
[listeners.limits]
max_connections = 20000
max_headers = 50
max_head_bytes = "32KiB"
max_request_line = 4096
head_timeout = "5s"
keepalive_timeout = "2m"
body_min_rate = "2k"
max_requests_per_connection = 1000

[[listeners.routes]]
name = "api"
host = ["API.example.com", "*.Example.org."]
path = "/api/**"
methods = ["get", "POST", "GET"]
headers = { "X-Canary" = "1", "x-debug" = "*" }
max_body = "10m"
proxy = "api"
rewrite_prefix = "/v2/"
forwarded_headers = false
via = true
preserve_host = false
request_headers = { set = { "x-env" = "prod" }, add = { "x-tag" = "a" }, remove = ["X-Debug"] }
response_headers = { remove = "server" }

[upstreams.api]
servers = ["127.0.0.1:9001", { address = "127.0.0.1:9002", weight = 3 }]
balance = { hash_header = "X-User" }
keepalive = 16
max_connections_per_server = 100
connect_timeout = "250ms"
response_header_timeout = "30s"
idle_timeout = "90s"
"#;
    let config = parse(text, "t.toml").unwrap();
    assert_eq!(config.workers.map(|w| w.get()), Some(2));
    assert_eq!(config.drain_timeout, Duration::from_secs(5));
    let log = config.access_log.as_ref().unwrap();
    assert_eq!(log.format, AccessLogFormat::Json);
    assert_eq!(
        log.path.as_deref(),
        Some(std::path::Path::new("/var/log/portico/access.log"))
    );
    let l = &config.listeners[0];
    assert_eq!(
        l.limits,
        ListenerLimits {
            max_connections: 20_000,
            max_connections_per_client: 0,
            max_headers: 50,
            max_head_bytes: 32_768,
            max_request_line: 4096,
            head_timeout: Duration::from_secs(5),
            keepalive_timeout: Duration::from_secs(120),
            send_timeout: Duration::from_secs(60),
            body_min_rate: 2048,
            max_requests_per_connection: 1000,
        }
    );
    let r = &l.routes[0];
    assert_eq!(r.name, "api");
    assert_eq!(
        r.matcher.hosts,
        [
            HostMatch::Exact("api.example.com".into()),
            HostMatch::Suffix(".example.org".into())
        ]
    );
    assert_eq!(r.matcher.path, Some(PathMatch::Prefix("/api/".into())));
    assert_eq!(r.matcher.methods, ["GET", "POST"]);
    assert_eq!(
        r.matcher.headers,
        [
            ("x-canary".to_string(), Some("1".to_string())),
            ("x-debug".to_string(), None)
        ]
    );
    assert_eq!(r.max_body_bytes, 10 << 20);
    let Action::Proxy(p) = &r.action else {
        panic!()
    };
    assert_eq!(p.strip_prefix, None);
    assert_eq!(p.rewrite_prefix.as_deref(), Some("/v2/"));
    assert!(!p.forwarded_headers && p.via && !p.preserve_host);
    assert_eq!(
        r.request_headers.set,
        [("x-env".to_string(), Template::literal("prod"))]
    );
    assert_eq!(
        r.request_headers.add,
        [("x-tag".to_string(), Template::literal("a"))]
    );
    assert_eq!(r.request_headers.remove, ["x-debug"]);
    assert_eq!(r.response_headers.remove, ["server"]);
    let g = &config.upstreams[0];
    assert_eq!(g.balance, Balance::HashHeader("x-user".into()));
    assert_eq!(
        g.servers.iter().map(|s| s.weight).collect::<Vec<_>>(),
        [1, 3]
    );
    assert_eq!((g.keepalive, g.max_connections_per_server), (16, 100));
    assert_eq!(g.connect_timeout, Duration::from_millis(250));
    assert_eq!(g.response_header_timeout, Duration::from_secs(30));
    assert_eq!(g.idle_timeout, Duration::from_secs(90));
}

#[test]
fn balance_spellings() {
    let cases = [
        ("\"round_robin\"", Balance::RoundRobin),
        ("\"least_connections\"", Balance::LeastConnections),
        ("\"two_random_choices\"", Balance::TwoRandomChoices),
        ("\"hash_client_ip\"", Balance::HashClientIp),
        (
            "{ hash_header = \"X-User\" }",
            Balance::HashHeader("x-user".into()),
        ),
        (
            "{ hash_cookie = \"session\" }",
            Balance::HashCookie("session".into()),
        ),
    ];
    for (spelling, want) in cases {
        let text = format!(
            "[upstreams.api]\nservers = [\"127.0.0.1:1\"]\nbalance = {spelling}\n[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\nproxy = \"api\"\n"
        );
        assert_eq!(
            parse(&text, "t.toml").unwrap().upstreams[0].balance,
            want,
            "{spelling}"
        );
    }
    // dotted-key form of a table works too
    let text = "[upstreams.api]\nservers = [\"127.0.0.1:1\"]\nbalance.hash_cookie = \"sid\"\n[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\nproxy = \"api\"\n";
    assert_eq!(
        parse(text, "t.toml").unwrap().upstreams[0].balance,
        Balance::HashCookie("sid".into())
    );
}

#[test]
fn dotted_keys_and_inline_tables_work_everywhere() {
    let text = r#"
upstreams.api.servers = ["127.0.0.1:1"]
access_log.format = "combined"
listeners = [{ address = "127.0.0.1:8080", limits.max_headers = 10, routes = [{ respond.status = 204 }] }]
"#;
    let config = parse(text, "t.toml").unwrap();
    assert_eq!(config.listeners[0].limits.max_headers, 10);
    assert_eq!(config.access_log.unwrap().path, None);
    let Action::Fixed {
        status,
        ref body,
        ref content_type,
    } = config.listeners[0].routes[0].action
    else {
        panic!()
    };
    assert_eq!(
        (status, body.as_str(), content_type.as_str()),
        (204, "", "text/plain; charset=utf-8")
    );
}

#[test]
fn actions() {
    let config = parse(
        &route_config("static = \"/srv/www\"\nindex = [\"index.html\", \"index.htm\"]"),
        "t",
    )
    .unwrap();
    let Action::Static(s) = &config.listeners[0].routes[0].action else {
        panic!()
    };
    assert_eq!(s.root.as_deref(), Some(std::path::Path::new("/srv/www")));
    assert_eq!(s.index, ["index.html", "index.htm"]);

    let config = parse(&route_config("static = \"site\""), "t").unwrap();
    let Action::Static(s) = &config.listeners[0].routes[0].action else {
        panic!()
    };
    assert_eq!(s.index, ["index.html"]);

    let config = parse(&route_config("origin = \"/srv/www\""), "t").unwrap();
    let Action::Origin(o) = &config.listeners[0].routes[0].action else {
        panic!()
    };
    assert_eq!(o.root.as_deref(), Some(std::path::Path::new("/srv/www")));

    let config = parse(&route_config("redirect = \"https://example.com/\""), "t").unwrap();
    let Action::Redirect { status, location } = &config.listeners[0].routes[0].action else {
        panic!()
    };
    assert_eq!(
        (*status, location.as_literal().unwrap()),
        (302, "https://example.com/")
    );
    let config = parse(
        &route_config("redirect = \"https://example.com/\"\nredirect_status = 308"),
        "t",
    )
    .unwrap();
    let Action::Redirect { status, .. } = &config.listeners[0].routes[0].action else {
        panic!()
    };
    assert_eq!(*status, 308);

    let config = parse(
        &route_config("respond = { status = 503, body = \"down\", content_type = \"text/html\" }"),
        "t",
    )
    .unwrap();
    let Action::Fixed {
        status,
        content_type,
        body,
    } = &config.listeners[0].routes[0].action
    else {
        panic!()
    };
    assert_eq!(
        (*status, content_type.as_str(), body.as_str()),
        (503, "text/html", "down")
    );
}

#[test]
fn path_rule_prefix_also_matches_the_bare_prefix() {
    let config = parse(&route_config("path = \"/api/**\"\nproxy = \"api\""), "t").unwrap();
    let path = config.listeners[0].routes[0].matcher.path.clone().unwrap();
    assert_eq!(path, PathMatch::Prefix("/api/".into()));
    for yes in ["/api", "/api/", "/api/users", "/api/v1/x"] {
        assert!(path.matches(yes), "{yes}");
    }
    for no in ["/apix", "/ap", "/", "/API", "/v1/api"] {
        assert!(!path.matches(no), "{no}");
    }
    let all = PathMatch::Prefix("/".into());
    assert!(all.matches("/") && all.matches("/x"));
    let exact = PathMatch::Exact("/health".into());
    assert!(exact.matches("/health") && !exact.matches("/health/") && !exact.matches("/healthz"));
}

#[test]
fn host_matching() {
    let exact = HostMatch::Exact("example.com".into());
    assert!(
        exact.matches("example.com")
            && exact.matches("EXAMPLE.com")
            && exact.matches("example.com.")
    );
    assert!(!exact.matches("www.example.com"));
    let suffix = HostMatch::Suffix(".example.com".into());
    assert!(suffix.matches("a.example.com") && suffix.matches("a.b.EXAMPLE.com"));
    assert!(
        !suffix.matches("example.com")
            && !suffix.matches("badexample.com")
            && !suffix.matches(".example.com")
    );
}

#[test]
fn strip_and_rewrite_targets() {
    let route =
        |body: &str| parse(&route_config(body), "t").unwrap().listeners[0].routes[0].clone();
    let proxy = |r: &portico_config::Route| match &r.action {
        Action::Proxy(p) => p.clone(),
        _ => panic!("proxy route expected"),
    };

    let strip = route("path = \"/api/**\"\nproxy = \"api\"\nstrip_prefix = true");
    assert_eq!(proxy(&strip).strip_prefix.as_deref(), Some("/api"));
    assert_eq!(strip.upstream_target("/api/users?x=1"), "/users?x=1");
    assert_eq!(strip.upstream_target("/api"), "/");
    assert_eq!(strip.upstream_target("/api?x"), "/?x");
    assert_eq!(strip.upstream_target("/api/"), "/");

    let explicit = route("path = \"/api/v1/**\"\nproxy = \"api\"\nstrip_prefix = \"/api/\"");
    assert_eq!(proxy(&explicit).strip_prefix.as_deref(), Some("/api"));
    assert_eq!(explicit.upstream_target("/api/v1/x"), "/v1/x");
    assert_eq!(explicit.upstream_target("/api/v1"), "/v1");

    let off = route("path = \"/api/**\"\nproxy = \"api\"\nstrip_prefix = false");
    assert_eq!(proxy(&off).strip_prefix, None);
    assert_eq!(off.upstream_target("/api/x?q"), "/api/x?q");

    let rewrite = route("path = \"/api/**\"\nproxy = \"api\"\nrewrite_prefix = \"/v2\"");
    let p = proxy(&rewrite);
    assert_eq!(
        (p.strip_prefix.as_deref(), p.rewrite_prefix.as_deref()),
        (None, Some("/v2/"))
    );
    assert_eq!(rewrite.upstream_target("/api/users"), "/v2/users");
    assert_eq!(rewrite.upstream_target("/api"), "/v2");
    assert_eq!(rewrite.upstream_target("/api/?q=1"), "/v2/?q=1");
    assert_eq!(rewrite.upstream_target("/api?q=1"), "/v2?q=1");

    let to_root = route("path = \"/api/**\"\nproxy = \"api\"\nrewrite_prefix = \"/\"");
    assert_eq!(proxy(&to_root).rewrite_prefix.as_deref(), Some("/"));
    assert_eq!(to_root.upstream_target("/api/users"), "/users");
    assert_eq!(to_root.upstream_target("/api"), "/");

    let prepend = route("path = \"/**\"\nproxy = \"api\"\nrewrite_prefix = \"/v2/\"");
    assert_eq!(proxy(&prepend).rewrite_prefix.as_deref(), Some("/v2/"));
    assert_eq!(prepend.upstream_target("/users"), "/v2/users");
    assert_eq!(prepend.upstream_target("/"), "/v2/");

    let plain = route("path = \"/api/**\"\nproxy = \"api\"");
    assert_eq!(plain.upstream_target("/api/x?y"), "/api/x?y");
}

#[test]
fn routes_keep_file_order() {
    let text = r#"
[upstreams.api]
servers = ["127.0.0.1:9001"]

[[listeners]]
name = "edge"
address = "127.0.0.1:8080"

[[listeners.routes]]
path = "/api/**"
proxy = "api"

[[listeners.routes]]
path = "/health"
respond = { body = "ok" }

[[listeners.routes]]
static = "/srv/www"
"#;
    let config = parse(text, "t").unwrap();
    let names: Vec<&str> = config.listeners[0]
        .routes
        .iter()
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(names, ["edge#0", "edge#1", "edge#2"]);
}

#[test]
fn explain_mentions_listeners_routes_and_upstreams() {
    let text = r#"
[[listeners]]
name = "public"
address = "0.0.0.0:8080"
limits = { max_connections = 500, head_timeout = "5s" }

[[listeners.routes]]
name = "api"
host = "api.example.com"
path = "/api/**"
proxy = "api"
strip_prefix = true
max_body = "10m"
request_headers = { set = { "x-env" = "prod" } }

[[listeners.routes]]
respond = { status = 404, body = "no" }

[upstreams.api]
servers = ["127.0.0.1:9001", { address = "127.0.0.1:9002", weight = 3 }]
balance = "least_connections"
"#;
    let out = explain(&parse(text, "t").unwrap());
    let expected = "\
listener \"public\" on 0.0.0.0:8080
  limits: max_connections 500 (default 10000), head_timeout 5s (default 10s)
  route \"api\": host api.example.com, path /api/** -> proxy to \"api\" (strip /api)
    max_body 10MiB; request headers: set x-env
  route \"public#1\": any request -> respond 404 text/plain; charset=utf-8 (2 bytes)
upstream \"api\": least_connections; connect_timeout 5s, response_header_timeout 1m, idle_timeout 1m; keepalive 64 idle per server; max_connections_per_server unlimited
  server 127.0.0.1:9001 weight 1
  server 127.0.0.1:9002 weight 3
  health_check: off (servers are only taken out by passive checks and the admin)
  passive: eject after 5 consecutive failures for 10s (doubling on repeats, at most 5m), at most 50% of servers; slow_start off
access log: off
workers: one per core; drain_timeout 30s
";
    assert_eq!(out, expected);
    let default = explain(&parse(DEFAULT_CONFIG, "<embedded>").unwrap());
    assert!(
        default.contains("listener \"proxy\" on 127.0.0.1:8080"),
        "{default}"
    );
    assert!(
        default.contains("route \"origin#0\": any request -> origin (synthetic responses)"),
        "{default}"
    );
    assert!(
        default.contains("upstream \"origin\": round_robin"),
        "{default}"
    );
}

#[test]
fn explain_shows_http2_settings_that_differ() {
    let text = r#"
[[listeners]]
address = "127.0.0.1:8080"
http2 = { max_concurrent_streams = 10, reset_window = "1m" }
[[listeners.routes]]
respond = { status = 200 }
[[listeners]]
address = "127.0.0.1:8081"
http2.enabled = false
[[listeners.routes]]
respond = { status = 200 }
"#;
    let out = explain(&parse(text, "t").unwrap());
    assert!(
        out.contains("  http2 (h2c): max_concurrent_streams 10 (default 100), reset_window 1m (default 10s)\n"),
        "{out}"
    );
    assert!(out.contains("  http2: off (HTTP/1.1 only)\n"), "{out}");
}

#[test]
fn extended_connect_is_on_by_default_and_shown_when_off() {
    let on = "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\nrespond = { status = 200 }\n";
    let cfg = parse(on, "t").unwrap();
    assert!(cfg.listeners[0].http2.extended_connect);
    let off = "[[listeners]]\naddress = \"127.0.0.1:8080\"\nhttp2.extended_connect = false\n[[listeners.routes]]\nrespond = { status = 200 }\n";
    let cfg = parse(off, "t").unwrap();
    assert!(!cfg.listeners[0].http2.extended_connect);
    let out = explain(&cfg);
    assert!(
        out.contains(
            "  http2 (h2c): extended_connect off (no WebSockets over HTTP/2; default on)\n"
        ),
        "{out}"
    );
}
