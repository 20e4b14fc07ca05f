//! Who may pass: `ip_rules` (first match decides, ranges merged), `trusted_proxies`, basic auth, forward auth, JWT, and their errors.

use portico_config::{explain, parse, IpRules};
use std::net::IpAddr;

fn config(listener: &str, route: &str) -> Result<portico_config::Config, String> {
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:8080\"\n{listener}\n[[listeners.routes]]\nrespond = {{ status = 200 }}\n{route}\n"
    );
    parse(&text, "t.toml").map_err(|e| e.to_string())
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn the_first_rule_that_covers_an_address_decides() {
    let c = config(
        "",
        "ip_rules = [\"deny 10.1.2.3\", \"allow 10.0.0.0/8\", \"allow 2001:db8::/32\", \"deny all\"]",
    )
    .unwrap();
    let r = c.listeners[0].routes[0].ip_rules.as_ref().unwrap();
    assert!(!r.allows(ip("10.1.2.3")));
    assert!(r.allows(ip("10.1.2.4")) && r.allows(ip("10.255.255.255")));
    assert!(r.allows(ip("2001:db8:1::5")));
    assert!(!r.allows(ip("11.0.0.1")) && !r.allows(ip("::1")));
    // An IPv4 address in IPv6 form is the IPv4 one.
    assert!(r.allows(ip("::ffff:10.9.9.9")) && !r.allows(ip("::ffff:10.1.2.3")));
    assert!(
        explain(&c).contains("ip_rules: 5 address ranges"),
        "{}",
        explain(&c)
    );
    // No rule covers: allowed.
    let c = config("", "ip_rules = \"deny 192.168.0.0/16\"").unwrap();
    assert!(c.listeners[0].routes[0]
        .ip_rules
        .as_ref()
        .unwrap()
        .allows(ip("8.8.8.8")));
}

#[test]
fn ranges_of_one_kind_merge_and_a_long_list_stays_exact() {
    let mut r = IpRules::default();
    for i in 0..10_000u32 {
        // Every other /24 of 10.0.0.0/8 and some adjacent ones that merge.
        let a = 0x0a00_0000 + ((i * 2) << 8);
        r.push(true, IpAddr::from(a.to_be_bytes()), 24);
    }
    r.push(true, ip("10.0.1.0"), 24);
    r.push(false, ip("0.0.0.0"), 0);
    assert!(r.allows(ip("10.0.0.7")) && r.allows(ip("10.0.1.7")) && r.allows(ip("10.0.2.7")));
    assert!(!r.allows(ip("10.0.3.7")));
    assert!(r.allows(ip(&format!(
        "10.{}.{}.1",
        (19_998 >> 8) & 255,
        19_998 & 255
    ))));
    assert!(!r.allows(ip("10.200.0.1")));
    assert_eq!(r.ranges(), 10_000 - 1 + 1);
}

#[test]
fn listener_rules_are_every_routes_default_and_errors_point_at_the_rule() {
    let c = config("ip_rules = [\"allow 127.0.0.1\", \"deny all\"]\ntrusted_proxies = [\"10.0.0.0/8\", \"fd00::/8\"]", "").unwrap();
    let l = &c.listeners[0];
    assert!(l.routes[0]
        .ip_rules
        .as_ref()
        .unwrap()
        .allows(ip("127.0.0.1")));
    assert!(l.trusted_proxies.covers(ip("10.3.3.3")) && !l.trusted_proxies.covers(ip("11.0.0.1")));
    let e = config("", "ip_rules = [\"allow 10.0.0.0/33\"]").unwrap_err();
    assert!(
        e.starts_with("t.toml:6:13: listeners[0].routes[0].ip_rules[0]: invalid prefix length"),
        "{e}"
    );
    assert!(config("", "ip_rules = [\"permit 10.0.0.1\"]")
        .unwrap_err()
        .contains("expected \"allow RANGE\" or \"deny RANGE\""));
    assert!(config("", "ip_rules = [\"allow example.com\"]")
        .unwrap_err()
        .contains("invalid address or range"));
    assert!(config("", "ip_rules = []")
        .unwrap_err()
        .contains("at least one rule"));
    assert!(config("trusted_proxies = [\"10.0.0.0/99\"]", "")
        .unwrap_err()
        .contains("invalid prefix length"));
}

#[test]
fn basic_auth_takes_bcrypt_and_argon2_and_refuses_weak_hashes_with_their_line() {
    let bcrypt = "$2y$10$abcdefghijklmnopqrstuuJ3cvkDU1SLCwEYj0H5M9u2bE6Z2Ct5y";
    let c = config(
        "",
        &format!("basic_auth = {{ users = {{ alice = \"{bcrypt}\" }} }}"),
    )
    .unwrap();
    let auth = c.listeners[0].routes[0].basic_auth.as_ref().unwrap();
    assert_eq!(auth.realm, "restricted");
    assert_eq!(auth.hash("alice"), Some(bcrypt));
    assert_eq!(auth.hash("bob"), None);
    assert!(!auth.keep_authorization);
    assert_eq!(auth.lockout, None);
    let c = config(
        "",
        &format!("basic_auth = {{ users = {{ a = \"{bcrypt}\" }}, lockout = {{ failures = 5, window = \"10m\" }} }}"),
    )
    .unwrap();
    let l = c.listeners[0].routes[0]
        .basic_auth
        .as_ref()
        .unwrap()
        .lockout
        .unwrap();
    assert_eq!(
        (l.failures, l.window),
        (5, std::time::Duration::from_secs(600))
    );
    let e = config(
        "",
        &format!("basic_auth = {{ users = {{ a = \"{bcrypt}\" }}, lockout = {{ failures = 0 }} }}"),
    )
    .unwrap_err();
    assert!(e.contains("lockout.failures: must be at least 1"), "{e}");
    assert!(
        explain(&c).contains("basic_auth: 1 user(s), realm \"restricted\""),
        "{}",
        explain(&c)
    );
    let e = config(
        "",
        "basic_auth = { users = { alice = \"{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=\" } }",
    )
    .unwrap_err();
    assert!(
        e.contains("a SHA-1 hash is refused: use bcrypt (`htpasswd -B`)"),
        "{e}"
    );
    assert!(
        config("", "basic_auth = { users = { alice = \"secret\" } }")
            .unwrap_err()
            .contains("not a password hash")
    );
    assert!(config(
        "",
        &format!("basic_auth = {{ realm = \"a\\\"b\", users = {{ a = \"{bcrypt}\" }} }}")
    )
    .unwrap_err()
    .contains("realm"));
    let dir = std::env::temp_dir().join(format!("portico-auth-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("htpasswd");
    std::fs::write(&file, format!("ok:{bcrypt}\n\nweak:$apr1$abc$def\n")).unwrap();
    let e = config(
        "",
        &format!("basic_auth = {{ htpasswd = \"{}\" }}", file.display()),
    )
    .unwrap_err();
    assert!(
        e.contains(&format!(
            "{}:3: user \"weak\": an MD5 hash is refused",
            file.display()
        )),
        "{e}"
    );
    let e = config("", "basic_auth = { htpasswd = \"/nonexistent/htpasswd\" }").unwrap_err();
    assert!(e.contains("cannot read htpasswd file"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn forward_auth_names_a_known_group() {
    let text = "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\nproxy = \"app\"\n\
                forward_auth = { group = \"auth\", path = \"/verify\", copy_headers = [\"X-User\"], cache = \"30s\" }\n\
                [upstreams.app]\nservers = [\"127.0.0.1:1\"]\n[upstreams.auth]\nservers = [\"127.0.0.1:2\"]\n";
    let c = parse(text, "t.toml").unwrap();
    let fa = c.listeners[0].routes[0].forward_auth.as_ref().unwrap();
    assert_eq!((fa.group, fa.path.as_deref()), (1, Some("/verify")));
    assert_eq!(fa.request_headers, ["authorization", "cookie"]);
    assert_eq!(fa.copy_headers, ["x-user"]);
    assert_eq!(fa.cache, std::time::Duration::from_secs(30));
    assert!(!fa.fail_open);
    assert!(
        explain(&c).contains("forward_auth: ask \"auth\""),
        "{}",
        explain(&c)
    );
    let bad = |t: &str| {
        parse(
            &text.replace("group = \"auth\", path = \"/verify\"", t),
            "t.toml",
        )
        .unwrap_err()
        .to_string()
    };
    assert!(bad("group = \"nope\"").contains("unknown upstream group \"nope\""));
    assert!(bad("path = \"/v\"").contains("needs `group`"));
    assert!(bad("group = \"auth\", path = \"verify\"").contains("must start with '/'"));
}

#[test]
fn jwt_takes_keys_from_a_file_or_a_url_and_never_none() {
    let dir = std::env::temp_dir().join(format!("portico-cfg-jwks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("jwks.json");
    std::fs::write(
        &file,
        r#"{"keys":[{"kty":"oct","kid":"h","alg":"HS256","k":"c2VjcmV0LXNlY3JldC1zZWNyZXQ"}]}"#,
    )
    .unwrap();
    let f = file.display().to_string();
    let c = config(
        &format!("jwt = {{ jwks = \"{f}\", algorithms = \"HS256\", audience = [\"a\", \"b\"] }}"),
        "",
    )
    .unwrap();
    // The listener's check is its routes' default.
    let j = c.listeners[0].routes[0].jwt.as_ref().unwrap();
    assert_eq!(j.keys, portico_config::JwtKeys::File(file.clone()));
    assert_eq!(j.audiences, ["a", "b"]);
    assert_eq!(j.header.as_deref(), Some("authorization"));
    assert_eq!(j.leeway, std::time::Duration::from_secs(60));
    assert!(!j.keep_token);
    assert!(explain(&c).contains("jwt: keys from"), "{}", explain(&c));
    let c = config(
        "",
        "jwt = { jwks_url = \"https://id.example/jwks\", forward_claims = { sub = \"X-User\" }, claims = { role = \"admin\" } }",
    )
    .unwrap();
    let j = c.listeners[0].routes[0].jwt.as_ref().unwrap();
    assert!(
        matches!(&j.keys, portico_config::JwtKeys::Url { refresh, .. } if refresh.as_secs() == 600)
    );
    assert_eq!(
        j.forward_claims,
        [("sub".to_string(), "x-user".to_string())]
    );
    assert!(!j
        .algorithms
        .contains(&portico_config::jwks::JwtAlgorithm::HS256));
    let bad = |route: &str| config("", route).unwrap_err();
    let e = bad("jwt = { issuer = \"x\" }");
    assert!(e.contains("jwt needs its keys"), "{e}");
    let e = bad(&format!(
        "jwt = {{ jwks = \"{f}\", jwks_url = \"http://a/\" }}"
    ));
    assert!(e.contains("not both"), "{e}");
    let e = bad(&format!(
        "jwt = {{ jwks = \"{f}\", algorithms = [\"ES256\", \"none\"] }}"
    ));
    assert!(
        e.contains("algorithms[1]") && e.contains("never taken"),
        "{e}"
    );
    let e = bad(&format!("jwt = {{ jwks = \"{f}\", refresh = \"1m\" }}"));
    assert!(e.contains("`refresh` is for `jwks_url`"), "{e}");
    let e = bad("jwt = { jwks_url = \"ftp://a/\" }");
    assert!(e.contains("not an http:// or https:// URL"), "{e}");
    let e = bad(&format!("jwt = {{ jwks = \"{f}\", header = \"\" }}"));
    assert!(e.contains("nowhere to find the token"), "{e}");
    let e = bad(&format!(
        "jwt = {{ jwks = \"{f}\", forward_claims = {{ sub = \"Host\" }} }}"
    ));
    assert!(e.contains("frames the request"), "{e}");
    std::fs::write(
        &file,
        r#"{"keys":[{"kty":"RSA","use":"enc","n":"AQAB","e":"AQAB"}]}"#,
    )
    .unwrap();
    let e = bad(&format!("jwt = {{ jwks = \"{f}\" }}"));
    assert!(
        e.contains("no signing key") && e.contains("encryption"),
        "{e}"
    );
    assert!(e.contains("jwt.jwks"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn client_cert_rules_need_a_listener_that_asks_for_certificates() {
    let e = config("", "client_cert = { subject = \"CN=*\" }").unwrap_err();
    assert!(
        e.contains("routes[0].client_cert") && e.contains("client_auth"),
        "{e}"
    );
    // With client_auth (the files are only read when the listener starts).
    let tls = "[listeners.tls]\ncertificates = [{ cert = \"c.pem\", key = \"k.pem\" }]\nclient_auth = { ca = \"ca.pem\" }";
    let text = |route: &str| {
        format!(
            "[[listeners]]\naddress = \"127.0.0.1:8443\"\n{tls}\n[[listeners.routes]]\nrespond = {{ status = 200 }}\n{route}\n"
        )
    };
    let c = parse(
        &text("client_cert = { san = [\"DNS:*.svc\", \"URI:spiffe://x/*\"], issuer = \"CN=CA\" }"),
        "t.toml",
    )
    .unwrap();
    let r = c.listeners[0].routes[0].client_cert.as_ref().unwrap();
    assert_eq!(r.san, ["DNS:*.svc", "URI:spiffe://x/*"]);
    assert!(r.subject.is_empty());
    assert!(
        explain(&c).contains("client_cert: SAN DNS:*.svc | URI:spiffe://x/* and issuer CN=CA"),
        "{}",
        explain(&c)
    );
    let e = parse(&text("client_cert = { san = \"*.svc\" }"), "t.toml")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("client_cert.san") && e.contains("DNS:, IP:, email: or URI:"),
        "{e}"
    );
    let e = parse(&text("client_cert = {}"), "t.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("at least one of"), "{e}");
}

#[test]
fn jwt_and_client_cert_lists_are_never_empty_and_claims_never_set_portico_fields() {
    let url = "jwks_url = \"https://id.example/jwks\"";
    let bad = |extra: &str| config("", &format!("jwt = {{ {url}, {extra} }}")).unwrap_err();
    for (extra, want) in [
        ("algorithms = []", "an empty list takes no token"),
        ("issuer = []", "give at least one issuer"),
        ("audience = []", "give at least one audience"),
        ("leeway = \"2h\"", "at most 1h"),
        (
            "forward_claims = { sub = \"X-Real-IP\" }",
            "Portico sets \"x-real-ip\" itself",
        ),
    ] {
        let e = bad(extra);
        assert!(e.contains(want), "{extra}: {e}");
    }
    let tls = "[listeners.tls]\ncertificates = [{ cert = \"c.pem\", key = \"k.pem\" }]\nclient_auth = { ca = \"ca.pem\" }";
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:8443\"\n{tls}\n[[listeners.routes]]\nrespond = {{ status = 200 }}\nclient_cert = {{ subject = [] }}\n"
    );
    let e = parse(&text, "t.toml").unwrap_err().to_string();
    assert!(
        e.contains("client_cert.subject") && e.contains("\"*\" takes any"),
        "{e}"
    );
}
