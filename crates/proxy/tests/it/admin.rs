//! Admin listener tests: status JSON, Prometheus metrics read back by a parser, token, reload over HTTP.

use portico_proxy::{start, Running};
use portico_testkit::{Client, Reply, TestUpstream};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

fn proxy(up: SocketAddr, admin_extra: &str) -> Running {
    let toml = format!(
        r#"
[admin]
address = "127.0.0.1:0"
{admin_extra}

[[listeners]]
name = "p"
address = "127.0.0.1:0"

[[listeners.routes]]
name = "api"
path = "/api/**"
proxy = "b"

[[listeners.routes]]
respond = {{ status = 404, body = "none" }}

[upstreams.b]
servers = ["{up}"]
"#
    );
    let cfg = portico_config::parse(&toml, "test.toml").unwrap();
    start(cfg, 2).unwrap()
}

/// One admin request on a new connection: (status, body).
fn admin(addr: SocketAddr, method: &str, path: &str, headers: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\nContent-Length: 0\r\n{headers}\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    let body = out.split_once("\r\n\r\n").unwrap().1.to_string();
    (status, body)
}

fn json(addr: SocketAddr, path: &str) -> serde_json::Value {
    let (status, body) = admin(addr, "GET", path, "");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[test]
fn status_and_metrics_count_what_happened() {
    let up = TestUpstream::start(|_| Reply::ok("hi"));
    let p = proxy(up.addr, "");
    let a = p.admin_addr().unwrap();
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    for _ in 0..5 {
        let r = c
            .request(b"GET /api/x HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        assert_eq!(r.status, 200);
    }
    let r = c
        .request(b"GET /other HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    assert_eq!(r.status, 404);

    // Counters are recorded just after the response is written: poll until the last one lands.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let st = loop {
        let st = json(a, "/api/status");
        if st["listeners"][0]["routes"][1]["responses"][3] == 1 {
            break st;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "404 never counted: {st}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert_eq!(st["generation"], 1);
    let routes = &st["listeners"][0]["routes"];
    assert_eq!(routes[0]["name"], "api");
    assert_eq!(routes[0]["action"], "proxy b");
    assert_eq!(routes[0]["responses"][1], 5);
    assert_eq!(routes[0]["latency"]["count"], 5);
    assert_eq!(routes[1]["responses"][3], 1);
    assert_eq!(st["listeners"][0]["connections"], 1);
    let server = &st["groups"][0]["servers"][0];
    assert_eq!(server["address"], up.addr.to_string());
    assert_eq!(server["header_time"]["count"], 5);
    assert_eq!(st["counters"]["upstream_requests"], 5);
    // What the dashboard's overload panel reads: policies, shed, queue settings and counters.
    assert_eq!(routes[0]["policies"], serde_json::json!([]));
    assert_eq!(st["listeners"][0]["shed"], false);
    let queue = &st["groups"][0]["queue"];
    assert_eq!(
        (&queue["size"], &queue["timeout_seconds"]),
        (&0.into(), &1.0.into())
    );
    for k in [
        "retries",
        "retries_budget_exhausted",
        "rate_limited",
        "requests_shed",
        "shedding",
    ] {
        assert_eq!(st["counters"][k], 0, "{k}");
    }

    let (status, text) = admin(a, "GET", "/metrics", "");
    assert_eq!(status, 200);
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("Prometheus text parses");
    let value = |name: &str, labels: &[(&str, &str)]| -> f64 {
        let s = scrape
            .samples
            .iter()
            .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .unwrap_or_else(|| panic!("no sample {name} {labels:?}"));
        match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            ref other => panic!("{name}: unexpected {other:?}"),
        }
    };
    assert_eq!(
        value(
            "portico_route_responses_total",
            &[("route", "api"), ("class", "2xx")]
        ),
        5.0
    );
    assert_eq!(value("portico_upstream_requests_total", &[]), 5.0);
    assert_eq!(
        value("portico_listener_connections", &[("listener", "p")]),
        1.0
    );
    // The server's bytes: five responses of "hi", as the access log counts them.
    let bytes = value(
        "portico_server_response_bytes_total",
        &[("group", "b"), ("server", &up.addr.to_string())],
    );
    assert!((5.0 * 2.0..5.0 * 400.0).contains(&bytes), "{bytes}");
    let st = json(a, "/api/status");
    assert_eq!(st["groups"][0]["servers"][0]["bytes"].as_f64(), Some(bytes));
    // Histograms: the parser groups buckets; the +Inf bucket equals the count.
    let hist = scrape
        .samples
        .iter()
        .find(|s| {
            s.metric == "portico_request_duration_seconds" && s.labels.get("route") == Some("api")
        })
        .expect("route histogram");
    match &hist.value {
        prometheus_parse::Value::Histogram(buckets) => {
            let last = buckets.last().unwrap();
            assert!(last.less_than.is_infinite());
            assert_eq!(last.count, 5.0);
            assert!(buckets.windows(2).all(|w| w[0].count <= w[1].count));
        }
        other => panic!("not a histogram: {other:?}"),
    }
    // Every family has HELP and TYPE, every sample belongs to a declared family.
    for s in &scrape.samples {
        let family = ["_sum", "_count"]
            .iter()
            .find_map(|sfx| s.metric.strip_suffix(sfx))
            .filter(|f| scrape.docs.contains_key(*f))
            .unwrap_or(&s.metric);
        assert!(scrape.docs.contains_key(family), "no HELP for {}", s.metric);
    }
    // HTTP errors of the admin API itself.
    assert_eq!(admin(a, "GET", "/nope", "").0, 404);
    assert_eq!(admin(a, "DELETE", "/metrics", "").0, 405);
    let (status, page) = admin(a, "GET", "/", "");
    assert_eq!(status, 200);
    assert!(page.contains("<html") || page.contains("<!doctype html"));
}

#[test]
fn token_is_required_when_configured() {
    let up = TestUpstream::start(|_| Reply::ok("hi"));
    let p = proxy(up.addr, "token = \"s3cret\"");
    let a = p.admin_addr().unwrap();
    assert_eq!(admin(a, "GET", "/api/status", "").0, 401);
    assert_eq!(
        admin(a, "GET", "/api/status", "Authorization: Bearer wrong\r\n").0,
        401
    );
    assert_eq!(
        admin(a, "GET", "/api/status", "Authorization: Bearer s3cret\r\n").0,
        200
    );
    assert_eq!(admin(a, "GET", "/?token=s3cret", "").0, 200);
    assert_eq!(admin(a, "GET", "/metrics?token=s3cre", "").0, 401);
}

#[test]
fn reload_over_http_without_a_source_is_refused_and_with_one_applies() {
    let up = TestUpstream::start(|_| Reply::ok("hi"));
    let p = proxy(up.addr, "");
    let a = p.admin_addr().unwrap();
    let (status, body) = admin(a, "POST", "/api/reload", "");
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("no configuration source"), "{body}");
    let text = "[admin]\naddress = \"127.0.0.1:0\"\n[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nrespond = { status = 200, body = \"new\" }\n";
    p.control().set_source(Box::new(move || {
        portico_config::parse(text, "new.toml").map_err(|e| e.to_string())
    }));
    let (status, body) = admin(a, "POST", "/api/reload", "");
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(a, "/api/status")["generation"], 2);
    let r = Client::connect(p.addr("p").unwrap())
        .unwrap()
        .request(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    assert_eq!(r.text(), "new");
    // The group is gone with the reload, and so are its metrics.
    let (_, metrics) = admin(a, "GET", "/metrics", "");
    assert!(!metrics.contains("group=\"b\""), "{metrics}");
}

fn admin_body(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\nContent-Length: {}\r\nContent-Type: application/json\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    (status, out.split_once("\r\n\r\n").unwrap().1.to_string())
}

/// Which upstream answered each of `n` requests spread over several connections (and so over
/// both workers).
fn spread(proxy: SocketAddr, n: usize) -> Vec<String> {
    let mut conns: Vec<Client> = (0..8).map(|_| Client::connect(proxy).unwrap()).collect();
    (0..n)
        .map(|i| {
            conns[i % 8]
                .request(b"GET /api/x HTTP/1.1\r\nHost: t\r\n\r\n")
                .unwrap()
                .text()
        })
        .collect()
}

#[test]
fn server_changes_apply_to_every_worker_and_read_back() {
    let a_up = TestUpstream::start(|_| Reply::ok("a"));
    let b_up = TestUpstream::start(|_| Reply::ok("b"));
    let c_up = TestUpstream::start(|_| Reply::ok("c"));
    let toml = format!(
        "[admin]\naddress = \"127.0.0.1:0\"\n[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nproxy = \"b\"\n[upstreams.b]\nservers = [\"{}\", \"{}\"]\n",
        a_up.addr, b_up.addr
    );
    let p = start(portico_config::parse(&toml, "t.toml").unwrap(), 2).unwrap();
    let (a, px) = (p.admin_addr().unwrap(), p.addr("p").unwrap());
    let b_addr = b_up.addr.to_string();

    // Disable b (by address): every worker stops sending to it.
    let (st, body) = admin(
        a,
        "POST",
        &format!("/api/groups/b/servers/{b_addr}/disable"),
        "",
    );
    assert_eq!(st, 200, "{body}");
    assert!(body.contains("\"admin\": \"disabled\""), "{body}");
    assert!(spread(px, 40).iter().all(|t| t == "a"));
    // Enable it again (by index) and weight it 3:1.
    assert_eq!(
        admin(a, "POST", "/api/groups/b/servers/1/enable", "").0,
        200
    );
    let (st, body) = admin_body(a, "PUT", "/api/groups/b/servers/1/weight", "3");
    assert_eq!(st, 200, "{body}");
    let got = spread(px, 40);
    let bs = got.iter().filter(|t| *t == "b").count();
    assert_eq!(
        bs, 30,
        "smooth weighted round robin 3:1 over 40 requests: {got:?}"
    );
    // Drain a: no new requests. Enable it again by its address percent-encoded, as the
    // dashboard's buttons send it.
    assert_eq!(admin(a, "POST", "/api/groups/b/servers/0/drain", "").0, 200);
    assert!(spread(px, 20).iter().all(|t| t == "b"));
    let encoded = a_up.addr.to_string().replace(':', "%3A");
    let (st, body) = admin(
        a,
        "POST",
        &format!("/api/groups/b/servers/{encoded}/enable"),
        "",
    );
    assert_eq!(st, 200, "{body}");

    // Add c: it takes traffic, shows in the effective configuration, and the others keep their
    // state (b's weight 3 survives the change).
    let (st, body) = admin_body(
        a,
        "POST",
        "/api/groups/b/servers",
        &format!("{{\"address\": \"{}\", \"weight\": 1}}", c_up.addr),
    );
    assert_eq!(st, 200, "{body}");
    assert!(spread(px, 50).iter().any(|t| t == "c"));
    let cfg = json(a, "/api/config");
    assert!(cfg["explain"]
        .as_str()
        .unwrap()
        .contains(&c_up.addr.to_string()));
    let servers = &cfg["groups"][0]["servers"];
    assert_eq!(servers[1]["weight"], 3);
    assert_eq!(servers[2]["address"], c_up.addr.to_string());
    // Duplicates, bad bodies, unknown servers and groups are refused with a reason.
    let dup = format!("{{\"address\": \"{}\"}}", c_up.addr);
    assert_eq!(admin_body(a, "POST", "/api/groups/b/servers", &dup).0, 409);
    assert_eq!(
        admin_body(a, "POST", "/api/groups/b/servers", "{\"address\": \"x\"}").0,
        400
    );
    assert_eq!(
        admin_body(a, "PUT", "/api/groups/b/servers/0/weight", "0").0,
        400
    );
    assert_eq!(
        admin(a, "POST", "/api/groups/b/servers/9/disable", "").0,
        404
    );
    assert_eq!(
        admin(a, "POST", "/api/groups/nope/servers/0/disable", "").0,
        404
    );

    // Remove a and c; the last server cannot be removed.
    assert_eq!(
        admin(
            a,
            "DELETE",
            &format!("/api/groups/b/servers/{}", a_up.addr),
            ""
        )
        .0,
        200
    );
    assert_eq!(
        admin(
            a,
            "DELETE",
            &format!("/api/groups/b/servers/{}", c_up.addr),
            ""
        )
        .0,
        200
    );
    assert!(spread(px, 20).iter().all(|t| t == "b"));
    assert_eq!(admin(a, "DELETE", "/api/groups/b/servers/0", "").0, 409);
    let (_, metrics) = admin(a, "GET", "/metrics", "");
    let admin_lines: Vec<&str> = metrics
        .lines()
        .filter(|l| l.contains("admin_state"))
        .collect();
    assert!(
        metrics.contains(&format!(
            "portico_server_admin_state{{group=\"b\",server=\"{b_addr}\",state=\"enabled\"}} 1"
        )),
        "{admin_lines:?}"
    );
    assert!(
        !metrics.contains(&format!("server=\"{}\"", a_up.addr)),
        "removed server's series stay: {metrics}"
    );
}

/// Every metric family the admin listener can expose is in docs/operations.md's table (as
/// `name` without the `portico_` prefix): the names are read from the exposition's source, so
/// families only some configurations emit count too.
#[test]
fn every_metric_is_documented() {
    let source = include_str!("../../src/admin/mod.rs");
    let docs = include_str!("../../../../docs/operations.md");
    let mut names: Vec<&str> = source
        .split("\"portico_")
        .skip(1)
        .map(|rest| {
            let end = rest
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect();
    names.sort_unstable();
    names.dedup();
    assert!(names.len() > 50, "{names:?}");
    let missing: Vec<&&str> = names
        .iter()
        .filter(|n| !docs.contains(&format!("`{n}`")))
        .collect();
    assert!(missing.is_empty(), "not in docs/operations.md: {missing:?}");
}

#[test]
fn runtime_changes_survive_reloads_and_restarts_through_the_state_file() {
    let a_up = TestUpstream::start(|_| Reply::ok("a"));
    let b_up = TestUpstream::start(|_| Reply::ok("b"));
    let c_up = TestUpstream::start(|_| Reply::ok("c"));
    let dir = std::env::temp_dir().join(format!("portico-state-it-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("state.json");
    let toml = |servers: &str| {
        format!(
            "[admin]\naddress = \"127.0.0.1:0\"\nstate_file = \"{}\"\n[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nproxy = \"b\"\n[upstreams.b]\nservers = [{servers}]\n",
            state.display()
        )
    };
    let both = format!("\"{}\", \"{}\"", a_up.addr, b_up.addr);
    let start_with = |text: String| {
        let p = start(portico_config::parse(&text, "t.toml").unwrap(), 2).unwrap();
        p.control().set_source(Box::new(move || {
            portico_config::parse(&text, "t.toml").map_err(|e| e.to_string())
        }));
        p
    };
    let servers = |a: SocketAddr| -> Vec<(String, String, u64)> {
        json(a, "/api/config")["groups"][0]["servers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["address"].as_str().unwrap().to_string(),
                    s["admin"].as_str().unwrap().to_string(),
                    s["weight"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let expected = vec![
        (a_up.addr.to_string(), "draining".to_string(), 1),
        (b_up.addr.to_string(), "enabled".to_string(), 5),
        (c_up.addr.to_string(), "enabled".to_string(), 2),
    ];

    let p = start_with(toml(&both));
    let a = p.admin_addr().unwrap();
    let add = format!("{{\"address\": \"{}\", \"weight\": 2}}", c_up.addr);
    assert_eq!(admin_body(a, "POST", "/api/groups/b/servers", &add).0, 200);
    assert_eq!(admin(a, "POST", "/api/groups/b/servers/0/drain", "").0, 200);
    assert_eq!(
        admin_body(a, "PUT", "/api/groups/b/servers/1/weight", "5").0,
        200
    );
    assert_eq!(servers(a), expected);
    // A reload from the file (which has neither change) keeps them.
    assert_eq!(admin(a, "POST", "/api/reload", "").0, 200);
    assert_eq!(servers(a), expected);
    let changes = json(a, "/api/changes");
    assert_eq!(changes["groups"]["b"]["added"][c_up.addr.to_string()], 2);
    assert_eq!(
        changes["groups"]["b"]["state"][a_up.addr.to_string()],
        "draining"
    );
    p.shutdown();
    p.wait();

    // A restart reads them back from the state file.
    let p = start_with(toml(&both));
    let a = p.admin_addr().unwrap();
    assert_eq!(servers(a), expected);
    assert!(spread(p.addr("p").unwrap(), 30).iter().all(|t| t != "a"));
    p.shutdown();
    p.wait();

    // A file without server a: its drain is forgotten (with a warning), the rest stays.
    let p = start_with(toml(&format!("\"{}\"", b_up.addr)));
    let a = p.admin_addr().unwrap();
    assert_eq!(servers(a), expected[1..].to_vec());
    let changes = json(a, "/api/changes");
    assert!(changes["groups"]["b"].get("state").is_none(), "{changes}");
    let kept = std::fs::read_to_string(&state).unwrap();
    assert!(!kept.contains(&a_up.addr.to_string()), "{kept}");
    // Undoing them: the servers, states and weights of the file, at once and after a reload.
    assert_eq!(admin(a, "DELETE", "/api/changes", "").0, 200);
    let file_only = vec![(b_up.addr.to_string(), "enabled".to_string(), 1)];
    assert_eq!(servers(a), file_only);
    assert_eq!(admin(a, "POST", "/api/reload", "").0, 200);
    assert_eq!(servers(a), file_only);
    assert_eq!(json(a, "/api/changes")["groups"], serde_json::json!({}));
    p.shutdown();
    p.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
