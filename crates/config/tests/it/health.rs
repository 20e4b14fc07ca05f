//! Health check, passive check and fallback keys: defaults, parsing, errors and `explain`.

use portico_config::{
    explain, parse, parse_all, HealthCheckKind, PassiveCheck, DEFAULT_CHECK_INTERVAL,
};
use std::time::Duration;

const LISTENER: &str =
    "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\nproxy = \"a\"\n";

fn with(groups: &str) -> String {
    format!("{LISTENER}{groups}")
}

fn err(groups: &str) -> String {
    match parse(&with(groups), "t.toml") {
        Ok(_) => panic!("expected an error for:\n{groups}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn defaults_without_tables() {
    let c = parse(&with("[upstreams.a]\nservers = [\"127.0.0.1:1\"]\n"), "t").unwrap();
    let g = &c.upstreams[0];
    assert!(g.health_check.is_none());
    assert_eq!(g.passive, PassiveCheck::DEFAULT);
    assert_eq!(g.passive.max_failures, 5);
    assert_eq!(g.passive.max_ejected_percent, 50);
    assert_eq!(g.fallback, None);
}

#[test]
fn http_check_with_every_key() {
    let c = parse(
        &with(
            r#"[upstreams.a]
servers = ["127.0.0.1:1"]
fallback = "b"
[upstreams.a.health_check]
type = "http"
path = "/healthz?full=1"
method = "head"
host = "app.internal"
expect_status = "200-299"
expect_body = "ok"
interval = "1s"
timeout = "500ms"
rise = 1
fall = 2
[upstreams.a.passive]
max_failures = 3
ejection = "5s"
max_ejection = "1m"
max_ejected_percent = 100
slow_start = "30s"
[upstreams.b]
servers = ["127.0.0.1:2"]
"#,
        ),
        "t",
    )
    .unwrap();
    let g = &c.upstreams[0];
    let h = g.health_check.as_ref().unwrap();
    assert_eq!(
        (h.interval, h.timeout),
        (Duration::from_secs(1), Duration::from_millis(500))
    );
    assert_eq!((h.rise, h.fall), (1, 2));
    let HealthCheckKind::Http(http) = &h.kind else {
        panic!("http expected")
    };
    assert_eq!(http.method, "HEAD");
    assert_eq!(http.path, "/healthz?full=1");
    assert_eq!(http.host.as_deref(), Some("app.internal"));
    assert_eq!(http.expect_status, (200, 299));
    assert_eq!(http.expect_body.as_deref(), Some("ok"));
    assert_eq!(g.passive.max_failures, 3);
    assert_eq!(g.passive.ejection, Duration::from_secs(5));
    assert_eq!(g.passive.max_ejection, Duration::from_secs(60));
    assert_eq!(g.passive.max_ejected_percent, 100);
    assert_eq!(g.passive.slow_start, Duration::from_secs(30));
    assert_eq!(g.fallback, Some(1));

    let out = explain(&c);
    assert!(
        out.contains("  health_check: http HEAD /healthz?full=1 (Host app.internal) expecting 200-299, body contains \"ok\"; every 1s, timeout 500ms; down after 2 failed, up after 1 passed\n"),
        "{out}"
    );
    assert!(
        out.contains("  passive: eject after 3 consecutive failures for 5s (doubling on repeats, at most 1m), at most 100% of servers; slow_start 30s\n"),
        "{out}"
    );
    assert!(
        out.contains("  fallback: \"b\" when no server is available\n"),
        "{out}"
    );
}

#[test]
fn tcp_check_and_defaults() {
    let c = parse(
        &with("[upstreams.a]\nservers = [\"127.0.0.1:1\"]\nhealth_check = { type = \"tcp\" }\npassive = { max_failures = 0 }\n"),
        "t",
    )
    .unwrap();
    let h = c.upstreams[0].health_check.as_ref().unwrap();
    assert_eq!(h.kind, HealthCheckKind::Tcp);
    assert_eq!(h.interval, DEFAULT_CHECK_INTERVAL);
    assert_eq!((h.rise, h.fall), (2, 3));
    let out = explain(&c);
    assert!(
        out.contains("health_check: tcp connect; every 5s, timeout 2s"),
        "{out}"
    );
    assert!(out.contains("passive: off; slow_start off"), "{out}");
    // An empty table is an HTTP check of "/" expecting 200-399.
    let c = parse(
        &with("[upstreams.a]\nservers = [\"127.0.0.1:1\"]\n[upstreams.a.health_check]\n"),
        "t",
    )
    .unwrap();
    let HealthCheckKind::Http(http) = &c.upstreams[0].health_check.as_ref().unwrap().kind else {
        panic!("http expected")
    };
    assert_eq!((http.method.as_str(), http.path.as_str()), ("GET", "/"));
    assert_eq!(http.expect_status, (200, 399));
    assert_eq!(http.host, None);
    // A single status, as an integer.
    let c = parse(
        &with(
            "[upstreams.a]\nservers = [\"127.0.0.1:1\"]\nhealth_check = { expect_status = 204 }\n",
        ),
        "t",
    )
    .unwrap();
    let HealthCheckKind::Http(http) = &c.upstreams[0].health_check.as_ref().unwrap().kind else {
        panic!("http expected")
    };
    assert_eq!(http.expect_status, (204, 204));
}

#[test]
fn bad_values_point_at_the_value() {
    let g = "[upstreams.a]\nservers = [\"127.0.0.1:1\"]\n";
    assert_eq!(
        err(&format!("{g}[upstreams.a.health_check]\nrise = 0\n")),
        "t.toml:8:8: upstreams.a.health_check.rise: must be at least 1, found 0"
    );
    assert_eq!(
        err(&format!("{g}[upstreams.a.health_check]\ninterval = \"1s\"\ntimeout = \"1s\"\n")),
        "t.toml:9:11: upstreams.a.health_check.timeout: timeout (1s) must be shorter than interval (1s)"
    );
    assert_eq!(
        err(&format!("{g}[upstreams.a.health_check]\ninterval = \"1s\"\n")),
        "t.toml:8:12: upstreams.a.health_check.interval: timeout (2s) must be shorter than interval (1s)"
    );
    assert_eq!(
        err(&format!("{g}[upstreams.a.health_check]\ntype = \"udp\"\n")),
        "t.toml:8:8: upstreams.a.health_check.type: unknown health check type \"udp\"; expected \"http\" or \"tcp\""
    );
    assert_eq!(
        err(&format!("{g}[upstreams.a.health_check]\ntype = \"tcp\"\npath = \"/x\"\n")),
        "t.toml:9:8: upstreams.a.health_check.path: `path` only applies to type = \"http\" health checks"
    );
    assert_eq!(
        err(&format!("{g}[upstreams.a.health_check]\nexpect_status = \"399-200\"\n")),
        "t.toml:8:17: upstreams.a.health_check.expect_status: status range 399-200 is empty (the first status is larger)"
    );
    assert_eq!(
        err(&format!("{g}[upstreams.a.health_check]\nexpect_status = \"2xx\"\n")),
        "t.toml:8:17: upstreams.a.health_check.expect_status: invalid status range \"2xx\": expected a status such as 200 or a range such as \"200-399\" (within 100-599)"
    );
    assert_eq!(
        err(&format!("{g}[upstreams.a.health_check]\npath = \"healthz\"\n")),
        "t.toml:8:8: upstreams.a.health_check.path: health check path \"healthz\" must start with '/' and contain only visible ASCII (no spaces or fragment)"
    );
    assert_eq!(
        err(&format!("{g}[upstreams.a.health_check]\nhelth = 1\n"))
            .split(", expected")
            .next()
            .unwrap(),
        "t.toml:8:1: upstreams.a.health_check.helth: unknown field `helth`"
    );
    assert_eq!(
        err(&format!(
            "{g}[upstreams.a.passive]\nmax_ejected_percent = 101\n"
        )),
        "t.toml:8:23: upstreams.a.passive.max_ejected_percent: must be at most 100, found 101"
    );
    assert_eq!(
        err(&format!("{g}[upstreams.a.passive]\nejection = \"1m\"\nmax_ejection = \"10s\"\n")),
        "t.toml:9:16: upstreams.a.passive.max_ejection: max_ejection (10s) must not be shorter than ejection (1m)"
    );
    assert_eq!(
        err(&format!("{g}[upstreams.a.passive]\nejection = \"0s\"\n")),
        "t.toml:8:12: upstreams.a.passive.ejection: must be greater than zero"
    );
}

#[test]
fn fallback_errors() {
    assert_eq!(
        err("[upstreams.a]\nservers = [\"127.0.0.1:1\"]\nfallback = \"nope\"\n"),
        "t.toml:7:12: upstreams.a.fallback: unknown upstream group \"nope\"; defined groups: \"a\""
    );
    assert_eq!(
        err("[upstreams.a]\nservers = [\"127.0.0.1:1\"]\nfallback = \"a\"\n"),
        "t.toml:7:12: upstreams.a.fallback: a group cannot fall back to itself"
    );
    let cycle = "[upstreams.a]\nservers = [\"127.0.0.1:1\"]\nfallback = \"b\"\n[upstreams.b]\nservers = [\"127.0.0.1:2\"]\nfallback = \"c\"\n[upstreams.c]\nservers = [\"127.0.0.1:3\"]\nfallback = \"b\"\n";
    let all = parse_all(&with(cycle), "t.toml").unwrap_err();
    assert_eq!(
        all.to_string(),
        "t.toml:10:12: upstreams.b.fallback: fallback cycle: b -> c -> b",
        "reported once, at the first group of the cycle"
    );
    // A chain is fine.
    let chain = "[upstreams.a]\nservers = [\"127.0.0.1:1\"]\nfallback = \"b\"\n[upstreams.b]\nservers = [\"127.0.0.1:2\"]\nfallback = \"c\"\n[upstreams.c]\nservers = [\"127.0.0.1:3\"]\n";
    let c = parse(&with(chain), "t").unwrap();
    let fallbacks: Vec<_> = c.upstreams.iter().map(|g| g.fallback).collect();
    assert_eq!(fallbacks, [Some(1), Some(2), None]);
}
