//! Values with variables (redirects, header rules, rewrites) and `path_regex`: parsing, positions of errors, `explain`.

use portico_config::{explain, parse, Action, PathMatch, Var};

const UPSTREAM: &str = "[upstreams.a]\nservers = [\"127.0.0.1:1\"]\n";

fn config(route: &str) -> Result<portico_config::Config, String> {
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\n{route}\n{UPSTREAM}"
    );
    parse(&text, "t.toml").map_err(|e| e.to_string())
}

fn err(route: &str) -> String {
    config(route)
        .err()
        .unwrap_or_else(|| panic!("expected an error for {route}"))
}

#[test]
fn a_redirect_with_variables_is_one_line() {
    let c = config("redirect = \"https://{host}{uri}\"\nredirect_status = 308").unwrap();
    let Action::Redirect { status, location } = &c.listeners[0].routes[0].action else {
        panic!("not a redirect")
    };
    assert_eq!(*status, 308);
    assert_eq!(
        location.vars().cloned().collect::<Vec<_>>(),
        [Var::Host, Var::Uri]
    );
    assert!(explain(&c).contains("redirect 308 to https://{host}{uri}"));
}

#[test]
fn path_regex_captures_feed_rewrites_redirects_and_headers() {
    let c = config(
        "path_regex = '^/users/(?P<id>[0-9]+)/(.*)$'\nproxy = \"a\"\nrewrite = \"/v2/users/{id}/{2}\"\n\
         request_headers = { set = { \"x-user\" = \"{id}\", \"x-client\" = \"{remote_addr}\" } }",
    )
    .unwrap();
    let r = &c.listeners[0].routes[0];
    let Some(PathMatch::Regex(re)) = &r.matcher.path else {
        panic!("not a regex")
    };
    assert!(re.0.is_match("/users/42/edit") && !re.0.is_match("/users/x/edit"));
    let Action::Proxy(p) = &r.action else {
        panic!()
    };
    assert!(p.rewrite.as_ref().unwrap().uses_captures());
    let text = explain(&c);
    assert!(
        text.contains("path ~ ^/users/(?P<id>[0-9]+)/(.*)$"),
        "{text}"
    );
    assert!(text.contains("rewrite to /v2/users/{id}/{2}"), "{text}");
    // Captures in a redirect of a route with a regex.
    assert!(config("path_regex = '^/old/(.*)'\nredirect = \"/new/{1}\"").is_ok());
}

#[test]
fn errors_point_at_the_variable_inside_the_string() {
    assert_eq!(
        err("redirect = \"https://{hots}{uri}\""),
        "t.toml:4:21: listeners[0].routes[0].redirect: unknown variable {hots}: expected scheme, host, port, path, query, uri, remote_addr, method, header.NAME, cookie.NAME, or a path_regex capture ({1}, {name})"
    );
    assert_eq!(
        err("redirect = \"/new/{1}\""),
        "t.toml:4:18: listeners[0].routes[0].redirect: {1} is a capture, but the route has no path_regex"
    );
    assert_eq!(
        err("path_regex = '^/a/(.*)'\nproxy = \"a\"\nrewrite = \"/b/{2}\""),
        "t.toml:6:15: listeners[0].routes[0].rewrite: {2}: the path_regex has 1 capture group(s)"
    );
    assert_eq!(
        err("proxy = \"a\"\nresponse_headers = { set = { \"x-a\" = \"{cookie.}\" } }"),
        "t.toml:5:39: listeners[0].routes[0].response_headers.set.x-a: invalid cookie name \"\" in {cookie.}"
    );
    assert!(err("path_regex = '^/(['\nproxy = \"a\"").contains("invalid path_regex"));
    assert!(err("path_regex = '^/(?P<host>.*)'\nproxy = \"a\"").contains("is a variable's name"));
    assert!(err("path = \"/a\"\npath_regex = '^/b'\nproxy = \"a\"")
        .contains("`path` or `path_regex`, not both"));
    assert!(
        err("path = \"/a/**\"\nproxy = \"a\"\nstrip_prefix = true\nrewrite = \"/b\"")
            .contains("rewrite and strip_prefix are mutually exclusive")
    );
    assert!(err("proxy = \"a\"\nrewrite = \"b\"").contains("must start with '/' or a variable"));
    assert!(err("redirect = \"/a\"\nrewrite = \"/b\"")
        .contains("`rewrite` only applies to proxy routes"));
    assert!(err("redirect = \"/a}\"").contains("a lone `}`"));
}

#[test]
fn cors_policies_parse_and_refuse_what_browsers_would() {
    let c = config(
        "proxy = \"a\"\n[listeners.routes.cors]\nallow_origins = [\"https://app.example.com\", \"https://*.example.org:8443\"]\n\
         allow_methods = [\"put\", \"DELETE\"]\nallow_headers = [\"Content-Type\"]\nexpose_headers = [\"X-Request-Id\"]\n\
         allow_credentials = true\nmax_age = \"1h\"",
    )
    .unwrap();
    let cors = c.listeners[0].routes[0].cors.clone().unwrap();
    assert_eq!(cors.methods, ["PUT", "DELETE"]);
    assert_eq!(cors.headers, Some(vec!["content-type".to_string()]));
    assert!(cors.allows(b"https://app.example.com") && cors.allows(b"https://a.example.org:8443"));
    assert!(
        !cors.allows(b"https://a.example.org") && !cors.allows(b"https://app.example.com.evil")
    );
    let text = explain(&c);
    assert!(text.contains("cors: https://app.example.com, https://*.example.org:8443; methods PUT, DELETE; request headers content-type; credentials; preflights cached 1h"), "{text}");
    assert!(config("proxy = \"a\"\ncors = { allow_origins = \"*\" }")
        .unwrap()
        .listeners[0]
        .routes[0]
        .cors
        .as_ref()
        .unwrap()
        .allows(b"https://anything.test"));
    assert!(
        err("proxy = \"a\"\ncors = { allow_origins = \"*\", allow_credentials = true }")
            .contains("credentials cannot be allowed for any origin")
    );
    assert!(err("proxy = \"a\"\ncors = { allow_methods = [\"GET\"] }")
        .contains("needs `allow_origins`"));
    assert!(
        err("proxy = \"a\"\ncors = { allow_origins = [\"app.example.com\"] }")
            .contains("invalid origin")
    );
    assert!(
        err("proxy = \"a\"\ncors = { allow_origins = [\"*\", \"https://a.b\"] }")
            .contains("list no other origin")
    );
    assert!(
        err("respond = { status = 200 }\ncors = { allow_origins = \"*\" }")
            .contains("`cors` only applies to proxy routes")
    );
}

#[test]
fn buffer_request_needs_a_body_limit() {
    let c = config("proxy = \"a\"\nbuffer_request = { memory = \"1m\" }").unwrap();
    let Action::Proxy(p) = &c.listeners[0].routes[0].action else {
        panic!()
    };
    let b = p.buffer.as_ref().unwrap();
    assert_eq!(b.memory, 1 << 20);
    assert_eq!(b.directory, std::env::temp_dir());
    let c = config("proxy = \"a\"\nbuffer_request = {}").unwrap();
    let Action::Proxy(p) = &c.listeners[0].routes[0].action else {
        panic!()
    };
    assert_eq!(
        p.buffer.as_ref().unwrap().memory,
        portico_config::DEFAULT_BUFFER_MEMORY
    );
    assert!(
        err("proxy = \"a\"\nmax_body = 0\nbuffer_request = { memory = \"1k\" }")
            .contains("needs a body limit")
    );
    assert!(
        err("respond = { status = 200 }\nbuffer_request = { memory = \"1k\" }")
            .contains("`buffer_request` only applies to proxy routes")
    );
    assert!(err("proxy = \"a\"\nbuffer_request = { memory = \"2g\" }").contains("must be at most"));
}

#[test]
fn splits_name_known_groups_and_add_up_to_100_at_most() {
    let text = "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\nproxy = \"a\"\n\
                split = [{ group = \"b\", percent = 1.5 }, { group = \"c\", percent = 10 }]\nsplit_key = \"cookie:uid\"\n\
                [upstreams.a]\nservers = [\"127.0.0.1:1\"]\n[upstreams.b]\nservers = [\"127.0.0.1:2\"]\n\
                [upstreams.c]\nservers = [\"127.0.0.1:3\"]\n";
    let c = parse(text, "t.toml").unwrap();
    let Action::Proxy(p) = &c.listeners[0].routes[0].action else {
        panic!()
    };
    let s = p.split.as_ref().unwrap();
    assert_eq!(s.shares, [(1, 150), (2, 1000)]);
    assert_eq!(s.key, portico_config::SplitKey::Cookie("uid".into()));
    let text2 = explain(&c);
    assert!(
        text2.contains("split 1.5% to \"b\", 10% to \"c\" by cookie uid"),
        "{text2}"
    );
    let bad = |split: &str| {
        let t = text.replace(
            "split = [{ group = \"b\", percent = 1.5 }, { group = \"c\", percent = 10 }]\nsplit_key = \"cookie:uid\"",
            split,
        );
        parse(&t, "t.toml").unwrap_err().to_string()
    };
    assert!(
        bad("split = [{ group = \"b\", percent = 60 }, { group = \"c\", percent = 50 }]")
            .contains("add up to 110%")
    );
    assert!(bad("split = [{ group = \"a\", percent = 5 }]").contains("already the route's"));
    assert!(
        bad("split = [{ group = \"x\", percent = 5 }]").contains("unknown upstream group \"x\"")
    );
    assert!(bad("split = [{ group = \"b\", percent = 0 }]").contains("between 0.01 and 100"));
    assert!(bad("split = [{ group = \"b\" }]").contains("needs `percent`"));
    assert!(
        bad("split = [{ group = \"b\", percent = 5 }]\nsplit_key = \"ip\"")
            .contains("invalid split_key")
    );
    assert!(bad("split_key = \"client_ip\"").contains("needs a `split`"));
}

#[test]
fn a_mirror_names_another_group_and_a_share() {
    let text = "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\nproxy = \"a\"\n\
                mirror = { group = \"b\", percent = 2.5 }\n\
                [upstreams.a]\nservers = [\"127.0.0.1:1\"]\n[upstreams.b]\nservers = [\"127.0.0.1:2\"]\n";
    let c = parse(text, "t.toml").unwrap();
    let Action::Proxy(p) = &c.listeners[0].routes[0].action else {
        panic!()
    };
    assert_eq!(
        p.mirror,
        Some(portico_config::Mirror {
            group: 1,
            basis_points: 250
        })
    );
    assert!(explain(&c).contains("mirror 2.5% to \"b\""));
    let bad = |m: &str| {
        parse(
            &text.replace("mirror = { group = \"b\", percent = 2.5 }", m),
            "t.toml",
        )
        .unwrap_err()
        .to_string()
    };
    assert!(bad("mirror = { group = \"a\" }").contains("must not be the route's own group"));
    assert!(bad("mirror = { group = \"zz\" }").contains("unknown upstream group \"zz\""));
    assert!(bad("mirror = { percent = 5 }").contains("needs `group`"));
    assert!(bad("mirror = { group = \"b\", percent = 101 }").contains("between 0.01 and 100"));
}

#[test]
fn cors_routes_must_match_preflights_and_own_their_fields() {
    assert!(
        err("proxy = \"a\"\nmethods = [\"GET\", \"POST\"]\ncors = { allow_origins = \"*\" }")
            .contains("must also match OPTIONS")
    );
    assert!(config(
        "proxy = \"a\"\nmethods = [\"GET\", \"OPTIONS\"]\ncors = { allow_origins = \"*\" }"
    )
    .is_ok());
    assert!(err("proxy = \"a\"\ncors = { allow_origins = \"*\" }\nresponse_headers = { set = { \"access-control-allow-origin\" = \"x\" } }")
        .contains("header rules may not change them"));
    assert!(
        err("proxy = \"a\"\nbuffer_request = { directory = \"/nonexistent/portico\" }")
            .contains("is not a directory")
    );
    // An escape before the variable: the error points at the value, not a wrong column.
    let e = err("redirect = \"\\u0041/{nope}\"");
    assert!(e.starts_with("t.toml:4:12:"), "{e}");
}
