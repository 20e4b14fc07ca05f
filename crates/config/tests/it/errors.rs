//! Every rejection reports `file:line:col: key: message` at the offending value.

use portico_config::{parse, parse_all};

/// The first error, displayed.
fn err(text: &str) -> String {
    match parse(text, "t.toml") {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(e) => e.to_string(),
    }
}

/// A minimal valid file to extend: upstream "api" and one listener with one proxy route.
const UP: &str = "[upstreams.api]\nservers = [\"127.0.0.1:9001\"]\n";

#[test]
fn unknown_key_typo_points_at_the_key() {
    let text = "[[listeners]]\nname = \"public\"\nadress = \"127.0.0.1:8080\"\n";
    assert_eq!(
        err(text),
        "t.toml:3:1: listeners[0].adress: unknown field `adress`, expected one of `name`, `address`, `limits`, `tls`, `routes`, `http2`, `http3`, `shed`, `compression`, `ip_rules`, `trusted_proxies`, `proxy_protocol`, `basic_auth`, `jwt`, `client_cert`; did you mean `address`?"
    );
}

#[test]
fn unknown_key_in_nested_tables() {
    let text = "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[listeners.limits]\nmax_header = 10\n";
    let e = err(text);
    assert!(
        e.starts_with("t.toml:4:1: listeners[0].limits.max_header: unknown field `max_header`"),
        "{e}"
    );
    assert!(e.ends_with("did you mean `max_headers`?"), "{e}");

    let text = format!("{UP}weigth = 2\n");
    let e = err(&text);
    assert!(
        e.starts_with("t.toml:3:1: upstreams.api.weigth: unknown field `weigth`"),
        "{e}"
    );

    let text = "[upstreams.api]\nservers = [\"127.0.0.1:1\", { adress = \"127.0.0.1:2\" }]\n";
    let e = err(text);
    assert!(
        e.starts_with("t.toml:2:29: upstreams.api.servers[1].adress: unknown field `adress`"),
        "{e}"
    );

    let text = "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\nproxy = \"api\"\nrequest_headers = { sett = {} }\n";
    let e = err(text);
    assert!(
        e.starts_with(
            "t.toml:5:21: listeners[0].routes[0].request_headers.sett: unknown field `sett`"
        ),
        "{e}"
    );
}

#[test]
fn type_errors_point_at_the_value() {
    let text = "[upstreams.api]\nservers = [\"127.0.0.1:1\", { address = \"127.0.0.1:2\", weight = \"x\" }]\n";
    assert_eq!(
        err(text),
        "t.toml:2:63: upstreams.api.servers[1].weight: invalid type: string \"x\", expected an integer"
    );
    let text = "workers = \"2\"\n";
    assert_eq!(
        err(text),
        "t.toml:1:11: workers: invalid type: string \"2\", expected an integer"
    );
}

#[test]
fn wrong_table_types_name_what_is_expected() {
    assert_eq!(
        err("upstreams = { api = 5 }\n"),
        "t.toml:1:21: upstreams.api: invalid type: integer `5`, expected an upstream group table"
    );
    assert_eq!(
        err("[[listeners]]\naddress = \"127.0.0.1:1\"\nroutes = [\"x\"]\n"),
        "t.toml:3:11: listeners[0].routes[0]: invalid type: string \"x\", expected a route table"
    );
    assert_eq!(
        err("[upstreams.api]\nservers = [1]\n"),
        "t.toml:2:12: upstreams.api.servers[0]: invalid type: integer `1`, expected a server: \"IP:port\" or { address = \"IP:port\", weight = N }"
    );
}

#[test]
fn syntax_error() {
    let e = err("[[listeners]]\nname = \"x\n");
    assert!(e.starts_with("t.toml:2:10: syntax: "), "{e}");
}

#[test]
fn at_least_one_listener() {
    assert_eq!(
        err(""),
        "t.toml:1:1: listeners: at least one listener is required: add a [[listeners]] table"
    );
    assert_eq!(
        err("workers = 2\nlisteners = []\n"),
        "t.toml:2:13: listeners: at least one listener is required"
    );
}

#[test]
fn listener_needs_address_and_routes() {
    let text = "workers = 1\n\n[[listeners]]\nname = \"a\"\n[[listeners.routes]]\norigin = true\n";
    assert_eq!(
        err(text),
        "t.toml:3:1: listeners[0]: listener needs an `address`, e.g. address = \"127.0.0.1:8080\""
    );
    let text = "[[listeners]]\naddress = \"127.0.0.1:8080\"\n";
    assert_eq!(
        err(text),
        "t.toml:1:1: listeners[0]: listener has no routes: add at least one [[listeners.routes]]"
    );
}

#[test]
fn addresses() {
    let route = "\n[[listeners.routes]]\norigin = true\n";
    let cases = [
        ("8080", "invalid address \"8080\": expected IP:port, e.g. \"127.0.0.1:8080\" or \"[::1]:8080\""),
        ("127.0.0.1", "address \"127.0.0.1\" has no port; write it as IP:port"),
        ("127.0.0.1:99999", "invalid port \"99999\" in \"127.0.0.1:99999\": expected 0-65535"),
        ("example.com:80", "invalid address \"example.com:80\": host names other than localhost are not resolved; use an IP address"),
        ("::1:80", "address \"::1:80\" has no port; write IPv6 addresses in brackets: \"[::1:80]:port\""),
        (":80", "invalid address \":80\": the IP is missing (use \"0.0.0.0:80\" for all interfaces)"),
    ];
    for (address, message) in cases {
        let text = format!("[[listeners]]\naddress = \"{address}\"{route}");
        assert_eq!(
            err(&text),
            format!("t.toml:2:11: listeners[0].address: {message}")
        );
    }
    let text = "[[listeners]]\naddress = \"localhost:8080\"\n[[listeners.routes]]\norigin = true\n";
    let config = parse(text, "t.toml").unwrap();
    assert_eq!(
        config.listeners[0].address,
        "127.0.0.1:8080".parse().unwrap()
    );
    let text = "[[listeners]]\naddress = \"[::1]:8080\"\n[[listeners.routes]]\norigin = true\n";
    assert_eq!(
        parse(text, "t.toml").unwrap().listeners[0].address,
        "[::1]:8080".parse().unwrap()
    );
}

#[test]
fn duplicate_listener_addresses() {
    let text = "\
[[listeners]]
name = \"a\"
address = \"127.0.0.1:8080\"
[[listeners.routes]]
origin = true

[[listeners]]
name = \"b\"
address = \"127.0.0.1:8080\"
[[listeners.routes]]
origin = true
";
    assert_eq!(
        err(text),
        "t.toml:9:11: listeners[1].address: duplicate listener address 127.0.0.1:8080 (listener \"a\" uses it)"
    );
    let overlapping = text.replacen(
        "address = \"127.0.0.1:8080\"\n[[listeners.routes]]\norigin = true\n\n",
        "address = \"0.0.0.0:8080\"\n[[listeners.routes]]\norigin = true\n\n",
        1,
    );
    assert_eq!(
        err(&overlapping),
        "t.toml:9:11: listeners[1].address: address 127.0.0.1:8080 overlaps listener \"a\" on 0.0.0.0:8080"
    );
    // port 0 (any free port) may repeat
    let zero = text.replace(":8080", ":0");
    assert!(parse(&zero, "t.toml").is_ok());
}

#[test]
fn duplicate_listener_names() {
    let text = "\
[[listeners]]
name = \"a\"
address = \"127.0.0.1:8080\"
[[listeners.routes]]
origin = true
[[listeners]]
name = \"a\"
address = \"127.0.0.1:8081\"
[[listeners.routes]]
origin = true
";
    assert_eq!(
        err(text),
        "t.toml:7:8: listeners[1].name: duplicate listener name \"a\""
    );
}

/// One listener with one route whose body is `route`, after the upstream "api".
fn with_route(route: &str) -> String {
    format!("{UP}\n[[listeners]]\naddress = \"127.0.0.1:8080\"\n\n[[listeners.routes]]\n{route}\n")
}
// Line numbers in `with_route`: 1-2 upstream, 3 blank, 4 [[listeners]], 5 address, 6 blank,
// 7 [[listeners.routes]], 8.. the route body.

#[test]
fn unknown_upstream_lists_known_names() {
    assert_eq!(
        err(&with_route("path = \"/\"\nproxy = \"apii\"")),
        "t.toml:9:9: listeners[0].routes[0].proxy: unknown upstream group \"apii\"; defined groups: \"api\""
    );
    let text =
        "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\nproxy = \"api\"\n";
    assert_eq!(
        err(text),
        "t.toml:4:9: listeners[0].routes[0].proxy: unknown upstream group \"api\": no upstream groups are defined (add [upstreams.api])"
    );
}

#[test]
fn route_needs_exactly_one_action() {
    assert_eq!(
        err(&with_route("path = \"/\"")),
        "t.toml:7:1: listeners[0].routes[0]: route has no action; set exactly one of proxy, static, origin, redirect, respond"
    );
    assert_eq!(
        err(&with_route("proxy = \"api\"\nstatic = \"/srv/www\"")),
        "t.toml:9:10: listeners[0].routes[0].static: a route has exactly one action, but both `proxy` and `static` are set"
    );
    assert_eq!(
        err(&with_route("origin = true\nrespond = { status = 204 }")),
        "t.toml:9:22: listeners[0].routes[0].respond: a route has exactly one action, but both `origin` and `respond` are set"
    );
}

#[test]
fn options_of_another_action() {
    assert_eq!(
        err(&with_route("static = \"/srv\"\nvia = true")),
        "t.toml:9:7: listeners[0].routes[0].via: `via` only applies to proxy routes; this route's action is `static`"
    );
    assert_eq!(
        err(&with_route("proxy = \"api\"\nindex = [\"a.html\"]")),
        "t.toml:9:9: listeners[0].routes[0].index: `index` only applies to static and origin routes; this route's action is `proxy`"
    );
    assert_eq!(
        err(&with_route("origin = true\nredirect_status = 301")),
        "t.toml:9:19: listeners[0].routes[0].redirect_status: `redirect_status` only applies to redirect routes; this route's action is `origin`"
    );
    assert_eq!(
        err(&with_route("static = \"/srv\"\nresponse_headers = { set = { cache-control = \"max-age=60\" } }")),
        "t.toml:9:30: listeners[0].routes[0].response_headers: `response_headers` only applies to proxy routes; this route's action is `static`"
    );
    assert_eq!(
        err(&with_route("origin = false")),
        "t.toml:8:10: listeners[0].routes[0].origin: origin = false is not an action: use origin = true, or origin = \"/root/dir\" to also serve files"
    );
}

#[test]
fn empty_servers_and_weight_zero() {
    let route =
        "\n[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\nproxy = \"api\"\n";
    assert_eq!(
        err(&format!("[upstreams.api]\nservers = []\n{route}")),
        "t.toml:2:11: upstreams.api.servers: must list at least one server"
    );
    assert_eq!(
        err(&format!("[upstreams.api]\nbalance = \"round_robin\"\n{route}")),
        "t.toml:1:12: upstreams.api: upstream group has no `servers`; e.g. servers = [\"127.0.0.1:9001\"], or a `discovery`"
    );
    assert_eq!(
        err(&format!("[upstreams.api]\nservers = [\"127.0.0.1:1\", {{ address = \"127.0.0.1:2\", weight = 0 }}]\n{route}")),
        "t.toml:2:63: upstreams.api.servers[1].weight: must be at least 1, found 0"
    );
    assert_eq!(
        err(&format!("[upstreams.api]\nservers = [\"127.0.0.1:1\", {{ weight = 2 }}]\n{route}")),
        "t.toml:2:27: upstreams.api.servers[1]: server table needs an `address`, e.g. { address = \"127.0.0.1:9001\", weight = 2 }"
    );
    assert_eq!(
        err(&format!("[upstreams.api]\nservers = [\"127.0.0.1:1\", \"127.0.0.1:0\"]\n{route}")),
        "t.toml:2:27: upstreams.api.servers[1]: invalid address \"127.0.0.1:0\": port 0 is not allowed here"
    );
    assert_eq!(
        err(&format!(
            "[upstreams.api]\nservers = [\"127.0.0.1:1\", \"127.0.0.1:1\"]\n{route}"
        )),
        "t.toml:2:27: upstreams.api.servers[1]: duplicate server 127.0.0.1:1 in this group"
    );
}

#[test]
fn statuses() {
    assert_eq!(
        err(&with_route("redirect = \"https://example.com/\"\nredirect_status = 200")),
        "t.toml:9:19: listeners[0].routes[0].redirect_status: invalid redirect status 200: expected 301, 302, 303, 307 or 308"
    );
    assert_eq!(
        err(&with_route("respond = { status = 101 }")),
        "t.toml:8:22: listeners[0].routes[0].respond.status: invalid status 101: expected 200-599"
    );
    assert_eq!(
        err(&with_route("respond = { status = 600 }")),
        "t.toml:8:22: listeners[0].routes[0].respond.status: invalid status 600: expected 200-599"
    );
    assert_eq!(
        err(&with_route("respond = { status = 204, body = \"x\" }")),
        "t.toml:8:34: listeners[0].routes[0].respond.body: a 204 response cannot have a body"
    );
}

#[test]
fn header_rules_names_and_values() {
    assert_eq!(
        err(&with_route("proxy = \"api\"\nrequest_headers = { set = { \"x env\" = \"1\" } }")),
        "t.toml:9:29: listeners[0].routes[0].request_headers.set.\"x env\": invalid header name \"x env\": only letters, digits and !#$%&'*+-.^_`|~ are allowed"
    );
    assert_eq!(
        err(&with_route("proxy = \"api\"\nresponse_headers = { add = { x-a = \"a\\r\\nb\" } }")),
        "t.toml:9:36: listeners[0].routes[0].response_headers.add.x-a: invalid header value \"a\\r\\nb\": CR, LF and NUL are not allowed"
    );
    assert_eq!(
        err(&with_route("proxy = \"api\"\nrequest_headers.set.content-length = \"1\"")),
        "t.toml:9:21: listeners[0].routes[0].request_headers.set.content-length: content-length is managed by the proxy (message framing, hop-by-hop) and cannot be changed by header rules"
    );
    assert_eq!(
        err(&with_route("proxy = \"api\"\nrequest_headers = { remove = [\"x-a\", \"\"] }")),
        "t.toml:9:38: listeners[0].routes[0].request_headers.remove[1]: header name must not be empty"
    );
    assert_eq!(
        err(&with_route("proxy = \"api\"\nheaders = { \"x-canary\" = \"a\\u0000\" }")),
        "t.toml:9:26: listeners[0].routes[0].headers.x-canary: invalid header value \"a\\0\": CR, LF and NUL are not allowed"
    );
}

#[test]
fn paths() {
    let cases = [
        ("api/**", "path \"api/**\" must start with '/'"),
        ("/api/*", "path \"/api/*\": '*' is only allowed as a trailing \"/**\" (prefix match), e.g. \"/api/**\""),
        ("/a/**/b", "path \"/a/**/b\": '*' is only allowed as a trailing \"/**\" (prefix match), e.g. \"/a/**/b/**\""),
        ("/api?x=1", "path \"/api?x=1\" must not contain a query or fragment ('?', '#')"),
    ];
    for (path, message) in cases {
        assert_eq!(
            err(&with_route(&format!("path = \"{path}\"\nproxy = \"api\""))),
            format!("t.toml:8:8: listeners[0].routes[0].path: {message}")
        );
    }
}

#[test]
fn hosts() {
    let cases = [
        ("*example.com", "invalid host \"*example.com\": a wildcard must be the whole first label, as in \"*.example.com\""),
        ("a.*.com", "invalid host \"a.*.com\": a wildcard must be the whole first label, as in \"*.example.com\""),
        ("*", "invalid host \"*\": a wildcard must be the whole first label, as in \"*.example.com\""),
        ("example.com:8080", "invalid host \"example.com:8080\": hosts are matched without a port; remove \":port\""),
        ("exa mple.com", "invalid host \"exa mple.com\": expected a host name such as \"example.com\" or \"*.example.com\""),
    ];
    for (host, message) in cases {
        assert_eq!(
            err(&with_route(&format!(
                "host = [\"ok.com\", \"{host}\"]\nproxy = \"api\""
            ))),
            format!("t.toml:8:19: listeners[0].routes[0].host[1]: {message}")
        );
    }
    assert_eq!(
        err(&with_route("host = \"a..com\"\nproxy = \"api\"")),
        "t.toml:8:8: listeners[0].routes[0].host: invalid host \"a..com\": expected a host name such as \"example.com\" or \"*.example.com\""
    );
}

#[test]
fn methods() {
    assert_eq!(
        err(&with_route("methods = [\"GET\", \"PO ST\"]\nproxy = \"api\"")),
        "t.toml:8:19: listeners[0].routes[0].methods[1]: invalid method \"PO ST\": must be a token such as \"GET\""
    );
    assert_eq!(
        err(&with_route("methods = []\nproxy = \"api\"")),
        "t.toml:8:11: listeners[0].routes[0].methods: must not be empty (omit `methods` to match any method)"
    );
}

#[test]
fn strip_and_rewrite_prefix() {
    assert_eq!(
        err(&with_route("path = \"/api/**\"\nproxy = \"api\"\nstrip_prefix = \"/api\"\nrewrite_prefix = \"/v2\"")),
        "t.toml:11:18: listeners[0].routes[0].rewrite_prefix: strip_prefix and rewrite_prefix are mutually exclusive (rewrite_prefix already replaces the matched prefix)"
    );
    assert_eq!(
        err(&with_route("path = \"/api\"\nproxy = \"api\"\nstrip_prefix = true")),
        "t.toml:10:16: listeners[0].routes[0].strip_prefix: `strip_prefix` needs a prefix path matcher on this route, such as path = \"/api/**\""
    );
    assert_eq!(
        err(&with_route("proxy = \"api\"\nrewrite_prefix = \"/v2\"")),
        "t.toml:9:18: listeners[0].routes[0].rewrite_prefix: `rewrite_prefix` needs a prefix path matcher on this route, such as path = \"/api/**\""
    );
    assert_eq!(
        err(&with_route("path = \"/api/v1/**\"\nproxy = \"api\"\nstrip_prefix = \"/ap\"")),
        "t.toml:10:16: listeners[0].routes[0].strip_prefix: strip_prefix \"/ap\" must be the route's path prefix \"/api/v1\" or a leading part of it ending before a '/'"
    );
    assert_eq!(
        err(&with_route(
            "path = \"/**\"\nproxy = \"api\"\nstrip_prefix = true"
        )),
        "t.toml:10:16: listeners[0].routes[0].strip_prefix: path \"/**\" has no prefix to strip"
    );
}

#[test]
fn durations_and_sizes_in_context() {
    let limits = |body: &str| {
        format!("[[listeners]]\naddress = \"127.0.0.1:8080\"\n[listeners.limits]\n{body}\n[[listeners.routes]]\norigin = true\n")
    };
    assert_eq!(
        err(&limits("head_timeout = 10")),
        "t.toml:4:16: listeners[0].limits.head_timeout: expected a duration string such as \"10s\" (units: us, ms, s, m, h), found the integer 10"
    );
    assert_eq!(
        err(&limits("keepalive_timeout = \"1.5s\"")),
        "t.toml:4:21: listeners[0].limits.keepalive_timeout: invalid duration \"1.5s\": expected a whole number and a unit (us, ms, s, m, h), e.g. \"10s\" or \"500ms\""
    );
    assert_eq!(
        err(&limits("head_timeout = \"0s\"")),
        "t.toml:4:16: listeners[0].limits.head_timeout: must be greater than zero"
    );
    assert_eq!(
        err(&limits("max_head_bytes = \"64KB\"")),
        "t.toml:4:18: listeners[0].limits.max_head_bytes: invalid size \"64KB\": \"KB\" is ambiguous; write \"64k\" or \"64KiB\" (both mean powers of 1024)"
    );
    assert_eq!(
        err(&limits("max_head_bytes = \"4m\"")),
        "t.toml:4:18: listeners[0].limits.max_head_bytes: must be at most 1MiB (1048576 bytes)"
    );
    assert_eq!(
        err(&limits("max_head_bytes = \"4k\"\nmax_request_line = \"8k\"")),
        "t.toml:5:20: listeners[0].limits.max_request_line: max_request_line (8KiB) must not exceed max_head_bytes (4KiB)"
    );
    assert_eq!(
        err(&limits("max_connections = 0")),
        "t.toml:4:19: listeners[0].limits.max_connections: must be at least 1, found 0"
    );
    assert_eq!(
        err(&limits("body_min_rate = -1")),
        "t.toml:4:17: listeners[0].limits.body_min_rate: must not be negative, found -1"
    );
    let listener =
        "\n[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\norigin = true\n";
    assert_eq!(err(&format!("drain_timeout = \"30\"\n{listener}")), "t.toml:1:17: drain_timeout: invalid duration \"30\": a unit is required (us, ms, s, m, h), e.g. \"30s\"");
    assert_eq!(
        err(&format!("workers = 0\n{listener}")),
        "t.toml:1:11: workers: must be at least 1, found 0"
    );
    assert_eq!(
        err(&format!("workers = 1025\n{listener}")),
        "t.toml:1:11: workers: must be at most 1024, found 1025"
    );
}

#[test]
fn balance_errors() {
    let route =
        "\n[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\nproxy = \"api\"\n";
    assert_eq!(
        err(&format!("{UP}balance = \"rr\"\n{route}")),
        "t.toml:3:11: upstreams.api.balance: unknown balancing method \"rr\"; expected \"round_robin\", \"least_connections\", \"two_random_choices\", \"hash_client_ip\", { hash_header = \"name\" } or { hash_cookie = \"name\" }"
    );
    assert_eq!(
        err(&format!("{UP}balance = \"hash_header\"\n{route}")),
        "t.toml:3:11: upstreams.api.balance: hash_header needs a name: balance = { hash_header = \"name\" }"
    );
    assert_eq!(
        err(&format!("{UP}balance = {{ hash_header = \"x user\" }}\n{route}")),
        "t.toml:3:27: upstreams.api.balance.hash_header: invalid header name \"x user\": only letters, digits and !#$%&'*+-.^_`|~ are allowed"
    );
}

#[test]
fn all_errors_are_collected_in_file_order() {
    let text = "\
[upstreams.api]
servers = [\"127.0.0.1:1\"]
connect_timeout = \"5\"

[[listeners]]
address = \"127.0.0.1:8080\"
[[listeners.routes]]
path = \"x\"
proxy = \"nope\"
";
    let errors = parse_all(text, "t.toml").unwrap_err();
    let lines: Vec<String> = errors.errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            "t.toml:3:19: upstreams.api.connect_timeout: invalid duration \"5\": a unit is required (us, ms, s, m, h), e.g. \"5s\"",
            "t.toml:8:8: listeners[0].routes[0].path: path \"x\" must start with '/'",
            "t.toml:9:9: listeners[0].routes[0].proxy: unknown upstream group \"nope\"; defined groups: \"api\"",
        ]
    );
    assert_eq!(errors.to_string(), lines.join("\n"));
    // `parse` reports the first one.
    assert_eq!(parse(text, "t.toml").unwrap_err().to_string(), lines[0]);
}

#[test]
fn io_error_names_the_file() {
    let e = portico_config::load(std::path::Path::new("/nonexistent/portico.toml")).unwrap_err();
    assert_eq!(e.file, "/nonexistent/portico.toml");
    assert_eq!(e.line, 0);
    assert!(
        e.to_string()
            .starts_with("/nonexistent/portico.toml: cannot read configuration: "),
        "{e}"
    );
}

#[test]
fn error_fields_are_exposed() {
    let e = parse(&with_route("path = \"/\"\nproxy = \"apii\""), "p.toml").unwrap_err();
    assert_eq!((e.file.as_str(), e.line, e.col), ("p.toml", 9, 9));
    assert_eq!(e.key, "listeners[0].routes[0].proxy");
    assert_eq!(
        e.message,
        "unknown upstream group \"apii\"; defined groups: \"api\""
    );
}

#[test]
fn hostile_input_does_not_panic() {
    let inputs = [
        "\u{0}",
        "[[listeners]]\naddress = \"\u{10FFFF}:1\"",
        "workers = 99999999999999999999",
        "[[listeners]]\n[[listeners.routes]]\n[[listeners.routes]]\npath = \"/é/**\"\nstrip_prefix = \"/é\"\nproxy = \"\"",
        "listeners = [{ address = \"127.0.0.1:1\", routes = [{ respond = {} }] }, 5]",
        "upstreams = { \"\" = { servers = [\"\"] } }",
        "[upstreams]\na.servers = [{}]\na.balance.hash_cookie = \"\"",
        "[[listeners]]\naddress = \"127.0.0.1:1\"\nlimits.max_head_bytes = \"99999999999999999999g\"",
    ];
    for text in inputs {
        let _ = parse_all(text, "t.toml");
    }
}

#[test]
fn mutated_configs_never_panic() {
    let base = "\
workers = 2
[[listeners]]
name = \"p\"
address = \"127.0.0.1:8080\"
limits = { max_head_bytes = \"64k\", head_timeout = \"10s\" }
[[listeners.routes]]
host = [\"*.a.com\"]
path = \"/api/**\"
proxy = \"api\"
rewrite_prefix = \"/v2\"
request_headers = { set = { x-a = \"1\" }, remove = \"x-b\" }
[upstreams.api]
servers = [\"127.0.0.1:1\", { address = \"[::1]:2\", weight = 3 }]
balance = { hash_header = \"x-u\" }
";
    assert!(parse(base, "t.toml").is_ok());
    let chars: Vec<char> = base.chars().collect();
    for i in 0..chars.len() {
        let mut deleted = chars.clone();
        deleted.remove(i);
        let _ = parse_all(&deleted.iter().collect::<String>(), "t.toml");
        for replacement in ['"', '[', '*', '\0', 'é', '0', '/', '.'] {
            let mut replaced = chars.clone();
            replaced[i] = replacement;
            let _ = parse_all(&replaced.iter().collect::<String>(), "t.toml");
        }
    }
}

#[test]
fn tls_needs_certificates_and_known_versions() {
    let base = "[[listeners]]\naddress = \"127.0.0.1:8443\"\n[[listeners.routes]]\nrespond = { status = 200 }\n";
    let text = format!("{base}[listeners.tls]\nversions = [\"1.3\"]\n");
    let e = err(&text);
    assert!(
        e.starts_with("t.toml:6:12: listeners[0].tls: tls needs `certificates"),
        "{e}"
    );
    let text = format!(
        "{base}[listeners.tls]\ncertificates = [{{ cert = \"a.pem\", key = \"a.key\" }}]\nversions = [\"1.3\", \"1.1\"]\n"
    );
    assert_eq!(
        err(&text),
        "t.toml:7:20: listeners[0].tls.versions: unsupported TLS version \"1.1\": use \"1.2\" and/or \"1.3\""
    );
    let text = format!("{base}[listeners.tls]\ncertificates = [{{ cert = \"a.pem\" }}]\n");
    let e = err(&text);
    assert!(
        e.contains("listeners[0].tls.certificates[0]: certificate needs `key`"),
        "{e}"
    );
}

#[test]
fn tls_paths_resolve_against_the_config_directory() {
    let text = "[[listeners]]\naddress = \"127.0.0.1:8443\"\n[listeners.tls]\ncertificates = [{ cert = \"certs/a.pem\", key = \"/abs/a.key\" }]\n[[listeners.routes]]\nrespond = { status = 200 }\n";
    let cfg = parse(text, "/etc/portico/portico.toml").unwrap();
    let tls = cfg.listeners[0].tls.as_ref().unwrap();
    assert_eq!(
        tls.certificates[0].cert,
        std::path::Path::new("/etc/portico/certs/a.pem")
    );
    assert_eq!(tls.certificates[0].key, std::path::Path::new("/abs/a.key"));
    assert_eq!(tls.versions.len(), 2, "TLS 1.2 and 1.3 by default");
}

#[test]
fn log_files_and_served_directories_resolve_against_the_config_directory() {
    let text = "access_log = { path = \"logs/access.log\" }\n[log]\npath = \"/var/log/p.log\"\n[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\npath = \"/s/\"\nstatic = \"www\"\n[[listeners.routes]]\norigin = \"files\"\n";
    let cfg = parse(text, "/etc/portico/portico.toml").unwrap();
    let access = cfg.access_log.as_ref().unwrap().path.as_deref();
    assert_eq!(
        access,
        Some(std::path::Path::new("/etc/portico/logs/access.log"))
    );
    assert_eq!(
        cfg.log.path.as_deref(),
        Some(std::path::Path::new("/var/log/p.log"))
    );
    let root = |i: usize| match &cfg.listeners[0].routes[i].action {
        portico_config::Action::Static(s) | portico_config::Action::Origin(s) => s.root.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(root(0), Some("/etc/portico/www".into()));
    assert_eq!(root(1), Some("/etc/portico/files".into()));
}

#[test]
fn log_and_request_id_tables_are_checked() {
    let base = "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\norigin = true\n";
    assert_eq!(
        err(&format!("[log]\nlevel = \"loud\"\n{base}")),
        "t.toml:2:9: log.level: unknown level \"loud\"; expected trace, debug, info, warn, error or off, or TARGET=LEVEL"
    );
    assert_eq!(
        err(&format!("[log]\nformat = \"xml\"\n{base}")),
        "t.toml:2:10: log.format: unknown log format \"xml\"; expected \"text\" or \"json\""
    );
    assert_eq!(
        err(&format!("[request_id]\nheader = \"X-Forwarded-For\"\n{base}")),
        "t.toml:2:10: request_id.header: \"x-forwarded-for\" has a meaning of its own: choose another field, such as \"x-request-id\" or \"x-correlation-id\""
    );
    assert!(
        err(&format!("[request_id]\nheader = \"Set-Cookie\"\n{base}"))
            .contains("meaning of its own")
    );
    let cfg = parse(&format!("[request_id]\nresponse = true\n{base}"), "t.toml").unwrap();
    let rid = cfg.request_id.unwrap();
    assert_eq!(
        (rid.header.as_str(), rid.from_client, rid.response),
        ("x-request-id", true, true)
    );
    assert!(parse(base, "t.toml").unwrap().request_id.is_none());
}

#[test]
fn admin_needs_a_token_off_loopback_and_its_own_port() {
    let l = "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\nrespond = { status = 200 }\n";
    let e = err(&format!("[admin]\naddress = \"0.0.0.0:9901\"\n{l}"));
    assert!(
        e.starts_with("t.toml:2:11: admin.address: the admin listener on non-loopback 0.0.0.0:9901 needs a `token`"),
        "{e}"
    );
    let e = err(&format!("[admin]\naddress = \"127.0.0.1:8080\"\n{l}"));
    assert!(
        e.starts_with("t.toml:2:11: admin.address: address 127.0.0.1:8080 overlaps listener"),
        "{e}"
    );
    let e = err(&format!(
        "[admin]\naddress = \"127.0.0.1:9901\"\ntoken = \"a b\"\n{l}"
    ));
    assert!(e.starts_with("t.toml:3:9: admin.token:"), "{e}");
    let e = err(&format!("[admin]\ntoken = \"x\"\n{l}"));
    assert!(
        e.starts_with("t.toml:1:1: admin: admin needs an `address`"),
        "{e}"
    );
    // With a token, any address is allowed.
    let ok = parse(
        &format!("[admin]\naddress = \"0.0.0.0:9901\"\ntoken = \"x\"\n{l}"),
        "t.toml",
    )
    .unwrap();
    assert_eq!(ok.admin.unwrap().token.as_deref(), Some("x"));
}

/// A TLS listener whose `[listeners.tls]` table ends the file, so `extra` lines go into it.
fn tls_with(extra: &str) -> String {
    format!(
        "[[listeners]]\naddress = \"127.0.0.1:8443\"\n[[listeners.routes]]\nrespond = {{ status = 200 }}\n[listeners.tls]\ncertificates = [{{ cert = \"a.pem\", key = \"a.key\" }}]\n{extra}"
    )
}

#[test]
fn tls_unknown_suite_and_group_names_list_the_accepted_ones() {
    let e = err(&tls_with(
        "cipher_suites = [\"TLS13_AES_128_GCM_SHA256\", \"TLS_RSA_WITH_AES_128_CBC_SHA\"]\nversions = \"1.3\"\n",
    ));
    assert!(
        e.starts_with("t.toml:7:46: listeners[0].tls.cipher_suites: unknown cipher suite \"TLS_RSA_WITH_AES_128_CBC_SHA\"; accepted: TLS13_AES_256_GCM_SHA384, TLS13_AES_128_GCM_SHA256,"),
        "{e}"
    );
    let e = err(&tls_with("groups = [\"X25519\", \"ffdhe2048\"]\n"));
    assert_eq!(
        e,
        "t.toml:7:21: listeners[0].tls.groups: unknown key-exchange group \"ffdhe2048\"; accepted: X25519, secp256r1, secp384r1, X25519MLKEM768, secp256r1MLKEM768"
    );
    let e = err(&tls_with("groups = []\n"));
    assert_eq!(
        e,
        "t.toml:7:10: listeners[0].tls.groups: must name at least one key-exchange group"
    );
}

#[test]
fn tls_suites_must_cover_every_enabled_version() {
    let e = err(&tls_with(
        "cipher_suites = [\"TLS13_AES_128_GCM_SHA256\"]\n",
    ));
    assert_eq!(
        e,
        "t.toml:7:17: listeners[0].tls.cipher_suites: no cipher suite for TLS 1.2, which `versions` enables: add a TLS_ECDHE_* suite or remove \"1.2\" from `versions`"
    );
    let e = err(&tls_with(
        "versions = \"1.3\"\ncipher_suites = \"TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256\"\n",
    ));
    assert!(e.contains("no cipher suite for TLS 1.3"), "{e}");
    let e = err(&tls_with("groups = \"X25519MLKEM768\"\n"));
    assert!(
        e.starts_with("t.toml:7:10: listeners[0].tls.groups: TLS 1.2 cannot use the post-quantum hybrid groups"),
        "{e}"
    );
    // Names match ignoring case and come back spelled canonically.
    let cfg = parse(
        &tls_with("versions = \"1.3\"\ncipher_suites = [\"tls13_aes_128_gcm_sha256\"]\ngroups = [\"x25519mlkem768\", \"X25519\"]\n"),
        "t.toml",
    )
    .unwrap();
    let tls = cfg.listeners[0].tls.as_ref().unwrap();
    assert_eq!(
        tls.cipher_suites.as_deref(),
        Some(&["TLS13_AES_128_GCM_SHA256"][..])
    );
    assert_eq!(
        tls.groups.as_deref(),
        Some(&["X25519MLKEM768", "X25519"][..])
    );
}

#[test]
fn tls_resumption_and_client_auth_keys() {
    let cfg = parse(&tls_with(""), "/etc/p/p.toml").unwrap();
    let tls = cfg.listeners[0].tls.as_ref().unwrap();
    assert!(tls.session_tickets);
    assert_eq!(tls.session_cache, 10_000);
    assert_eq!(tls.cipher_suites, None);
    assert_eq!(tls.groups, None);
    assert_eq!(tls.client_auth, None);

    let cfg = parse(
        &tls_with(
            "session_tickets = false\nsession_cache = 0\nclient_auth = { ca = \"ca.pem\" }\n",
        ),
        "/etc/p/p.toml",
    )
    .unwrap();
    let tls = cfg.listeners[0].tls.as_ref().unwrap();
    assert!(!tls.session_tickets);
    assert_eq!(tls.session_cache, 0);
    let ca = tls.client_auth.as_ref().unwrap();
    assert_eq!(ca.ca, std::path::Path::new("/etc/p/ca.pem"));
    assert!(ca.required, "required by default");
    let cfg = parse(
        &tls_with("client_auth = { ca = \"ca.pem\", required = false }\n"),
        "t.toml",
    )
    .unwrap();
    assert!(
        !cfg.listeners[0]
            .tls
            .as_ref()
            .unwrap()
            .client_auth
            .as_ref()
            .unwrap()
            .required
    );

    assert_eq!(
        err(&tls_with("session_cache = -1\n")),
        "t.toml:7:17: listeners[0].tls.session_cache: must not be negative, found -1"
    );
    let e = err(&tls_with("client_auth = { required = true }\n"));
    assert!(
        e.starts_with("t.toml:6:16: listeners[0].tls.client_auth: client_auth needs `ca`"),
        "{e}"
    );
    let e = err(&tls_with(
        "client_auth = { ca = \"ca.pem\", optional = true }\n",
    ));
    assert!(e.contains("unknown field `optional`"), "{e}");
}

/// Upstream "api" with a `[upstreams.api.tls]` table ending the file, so `extra` lines go into it.
fn upstream_tls_with(extra: &str) -> String {
    format!(
        "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\nproxy = \"api\"\n{UP}[upstreams.api.tls]\n{extra}"
    )
}

#[test]
fn upstream_tls_keys_are_validated_at_their_position() {
    assert_eq!(
        err(&upstream_tls_with("server_name = \"*.example.com\"\n")),
        "t.toml:8:15: upstreams.api.tls.server_name: invalid server name \"*.example.com\": expected a DNS name such as \"api.internal.example\" or an IP address (no port, no wildcard)"
    );
    assert_eq!(
        err(&upstream_tls_with("server_name = \"api.test:443\"\n"))
            .split(": invalid")
            .next(),
        Some("t.toml:8:15: upstreams.api.tls.server_name")
    );
    assert_eq!(
        err(&upstream_tls_with("versions = \"1.0\"\n")),
        "t.toml:8:12: upstreams.api.tls.versions: unsupported TLS version \"1.0\": use \"1.2\" and/or \"1.3\""
    );
    assert_eq!(
        err(&upstream_tls_with("ca_file = \"\"\n")),
        "t.toml:8:11: upstreams.api.tls.ca_file: must be a file path"
    );
    assert_eq!(
        err(&upstream_tls_with("session_cache = -1\n")),
        "t.toml:8:17: upstreams.api.tls.session_cache: must not be negative, found -1"
    );
    assert_eq!(
        err(&upstream_tls_with("verify = false\nca_file = \"ca.pem\"\n")),
        "t.toml:9:11: upstreams.api.tls.ca_file: ca_file has no effect with verify = false: remove one of them"
    );
    let e = err(&upstream_tls_with("certificate = { cert = \"c.pem\" }\n"));
    assert!(
        e.starts_with("t.toml:5:12: upstreams.api.tls.certificate: a client certificate needs both `cert` and `key`"),
        "{e}"
    );
    let e = err(&upstream_tls_with("sni = \"x\"\n"));
    assert!(e.contains("unknown field `sni`"), "{e}");
}

#[test]
fn upstream_tls_defaults_and_paths() {
    let cfg = parse(
        &upstream_tls_with("ca_file = \"certs/ca.pem\"\nserver_name = \"API.Internal.\"\n"),
        "/etc/portico/portico.toml",
    )
    .unwrap();
    let tls = cfg.upstreams[0].tls.as_ref().unwrap();
    assert_eq!(
        tls.ca_file.as_deref(),
        Some(std::path::Path::new("/etc/portico/certs/ca.pem"))
    );
    assert_eq!(tls.server_name.as_deref(), Some("api.internal"));
    assert!(tls.verify);
    assert_eq!(tls.versions.len(), 2);
    assert_eq!(
        tls.session_cache,
        portico_config::DEFAULT_UPSTREAM_SESSION_CACHE
    );
    assert!(tls.certificate.is_none());
    // An empty table: HTTPS with the system roots and the servers' IP addresses as names.
    let cfg = parse(&upstream_tls_with(""), "t.toml").unwrap();
    let tls = cfg.upstreams[0].tls.as_ref().unwrap();
    assert!(tls.ca_file.is_none() && tls.server_name.is_none());
}

#[test]
fn listener_tls_watch_keys() {
    let cfg = parse(&tls_with(""), "t.toml").unwrap();
    assert_eq!(
        cfg.listeners[0].tls.as_ref().unwrap().watch,
        Some(portico_config::DEFAULT_WATCH_INTERVAL)
    );
    let cfg = parse(&tls_with("watch_interval = \"250ms\"\n"), "t.toml").unwrap();
    assert_eq!(
        cfg.listeners[0].tls.as_ref().unwrap().watch,
        Some(std::time::Duration::from_millis(250))
    );
    let cfg = parse(&tls_with("watch = false\n"), "t.toml").unwrap();
    assert_eq!(cfg.listeners[0].tls.as_ref().unwrap().watch, None);
    assert_eq!(
        err(&tls_with("watch_interval = \"0s\"\n")),
        "t.toml:7:18: listeners[0].tls.watch_interval: must be greater than zero"
    );
}

#[test]
fn http2_settings_are_range_checked() {
    let text = format!(
        "{UP}[[listeners]]\naddress = \"127.0.0.1:0\"\nhttp2 = {{ max_frame_size = 1024 }}\n[[listeners.routes]]\nproxy = \"api\"\n"
    );
    let e = err(&text);
    assert!(
        e.contains("listeners[0].http2.max_frame_size: must be at least 16384 bytes"),
        "{e}"
    );
    let text = format!(
        "{UP}[[listeners]]\naddress = \"127.0.0.1:0\"\n[listeners.http2]\nreset_window = \"0s\"\n[[listeners.routes]]\nproxy = \"api\"\n"
    );
    let e = err(&text);
    assert!(
        e.contains("listeners[0].http2.reset_window: must be greater than zero"),
        "{e}"
    );
    let text = format!(
        "{UP}[[listeners]]\naddress = \"127.0.0.1:0\"\n[listeners.http2]\nextended_connect = \"yes\"\n[[listeners.routes]]\nproxy = \"api\"\n"
    );
    let e = err(&text);
    assert!(e.contains("extended_connect"), "{e}");
    assert!(e.contains(":6:20:"), "{e}");
}

#[test]
fn upstream_protocol() {
    let route =
        "\n[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\nproxy = \"api\"\n";
    assert_eq!(
        err(&format!("{UP}protocol = \"h2c\"\n{route}")),
        "t.toml:3:12: upstreams.api.protocol: unknown upstream protocol \"h2c\": use \"http1\" or \"h2\""
    );
    let cfg = parse(&format!("{UP}protocol = \"h2\"\n{route}"), "t.toml").unwrap();
    assert_eq!(
        cfg.upstreams[0].protocol,
        portico_config::UpstreamProtocol::H2
    );
    let text = portico_config::explain(&cfg);
    assert!(
        text.contains("protocol: h2 (h2c, prior knowledge)"),
        "{text}"
    );
    let cfg = parse(&with_route("proxy = \"api\""), "t.toml").unwrap();
    assert_eq!(
        cfg.upstreams[0].protocol,
        portico_config::UpstreamProtocol::Http1
    );
}

#[test]
fn upstream_proxy_protocol_versions_and_not_over_http2() {
    let route = "[[listeners]]\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nproxy = \"api\"\n";
    let c = parse(&format!("{UP}proxy_protocol = \"v2\"\n{route}"), "t.toml").unwrap();
    assert_eq!(c.upstreams[0].proxy_protocol, Some(2));
    assert!(portico_config::explain(&c).contains("proxy_protocol: v2"));
    assert_eq!(
        err(&format!("{UP}proxy_protocol = \"2\"\n{route}")),
        "t.toml:3:18: upstreams.api.proxy_protocol: unknown PROXY protocol version \"2\": use \"v1\" (text) or \"v2\" (binary)"
    );
    assert_eq!(
        err(&format!("{UP}protocol = \"h2\"\nproxy_protocol = \"v1\"\n{route}")),
        "t.toml:4:18: upstreams.api.proxy_protocol: a PROXY header names one client per connection, and an HTTP/2 connection carries many clients' requests: use it with protocol = \"http1\""
    );
}

#[test]
fn http3_needs_tls_1_3_and_known_settings() {
    let base = "[[listeners]]\naddress = \"127.0.0.1:8443\"\n[[listeners.routes]]\nrespond = { status = 200 }\n";
    let tls = "[listeners.tls]\ncertificates = [{ cert = \"a.pem\", key = \"a.key\" }]\n";
    let e = err(&format!("{base}[listeners.http3]\n"));
    assert!(
        e.starts_with("t.toml:5:1: listeners[0].http3: HTTP/3 runs over QUIC, which is always TLS"),
        "{e}"
    );
    let e = err(&format!(
        "{base}{tls}versions = [\"1.2\"]\n[listeners.http3]\n"
    ));
    assert!(
        e.contains("listeners[0].http3: HTTP/3 needs TLS 1.3"),
        "{e}"
    );
    let e = err(&format!(
        "{base}{tls}[listeners.http3]\ncongestion = \"vegas\"\n"
    ));
    assert!(
        e.starts_with(
            "t.toml:8:14: listeners[0].http3.congestion: unknown congestion controller \"vegas\""
        ),
        "{e}"
    );
    let e = err(&format!(
        "{base}{tls}[listeners.http3]\nmax_udp_payload = 1000\n"
    ));
    assert!(
        e.contains("http3.max_udp_payload: must be at least 1200 bytes"),
        "{e}"
    );
    let e = err(&format!(
        "{base}{tls}[listeners.http3]\nidle_timeout = \"10s\"\nkeep_alive_interval = \"10s\"\n"
    ));
    assert!(
        e.contains("http3.keep_alive_interval: must be shorter than idle_timeout"),
        "{e}"
    );
    let cfg = parse(
        &format!("{base}{tls}[listeners.http3]\ncongestion = \"bbr\"\nalt_svc_max_age = \"0s\"\n"),
        "t.toml",
    )
    .unwrap();
    let h3 = cfg.listeners[0].http3.expect("on");
    assert_eq!(h3.congestion, portico_config::Congestion::Bbr);
    assert_eq!(h3.alt_svc_max_age, None);
    let e = err(&format!(
        "{base}{tls}session_cache = 0\n[listeners.http3]\nearly_data = true\n"
    ));
    assert!(e.contains("early_data needs the session cache"), "{e}");
    let cfg = parse(
        &format!("{base}{tls}[listeners.http3]\nenabled = false\n"),
        "t.toml",
    )
    .unwrap();
    assert!(cfg.listeners[0].http3.is_none());
}
