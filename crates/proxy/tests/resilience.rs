//! Resilience integration tests: retries on other servers under a budget, with real upstreams that fail on cue.

use portico_proxy::{start, Running};
use portico_testkit::{Client, Reply, TestUpstream};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::Ordering::Relaxed;

fn proxy(toml: &str, workers: usize) -> Running {
    let cfg =
        portico_config::parse(toml, "test.toml").unwrap_or_else(|e| panic!("config: {e}\n{toml}"));
    start(cfg, workers).expect("start proxy")
}

fn servers(list: &[SocketAddr]) -> String {
    let quoted: Vec<String> = list.iter().map(|a| format!("\"{a}\"")).collect();
    format!("[{}]", quoted.join(", "))
}

fn closed_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    drop(l);
    a
}

/// One listener "p" whose routes are `routes`, in front of group "main" (round robin, passive
/// checks off so a failing server keeps being picked).
fn config(routes: &str, group: &[SocketAddr]) -> String {
    format!(
        r#"
drain_timeout = "2s"
[[listeners]]
name = "p"
address = "127.0.0.1:0"
{routes}

[upstreams.main]
servers = {}
passive = {{ max_failures = 0 }}
"#,
        servers(group)
    )
}

/// Send one request on a new connection; the response's status and body.
fn send(p: &Running, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let r = c.request(raw.as_bytes()).unwrap();
    (r.status, r.text())
}

fn get(p: &Running) -> (u16, String) {
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    let r = c
        .request(b"GET /x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    (r.status, r.text())
}

fn status_503() -> Reply {
    Reply::Respond {
        status: 503,
        headers: vec![],
        body: b"down".to_vec(),
        chunked: false,
    }
}

const RETRY_ROUTE: &str = "[[listeners.routes]]\nproxy = \"main\"\nretry = {}\n";

#[test]
fn a_refused_connect_is_retried_on_the_other_server() {
    let good = TestUpstream::start(|_| Reply::ok("good"));
    let p = proxy(&config(RETRY_ROUTE, &[closed_port(), good.addr]), 1);
    for _ in 0..6 {
        assert_eq!(get(&p), (200, "good".to_string()));
    }
    // Round robin sent half of the first attempts to the dead server.
    assert_eq!(p.stats().retries.load(Relaxed), 3);
    assert_eq!(good.requests().len(), 6);
    p.shutdown();
}

#[test]
fn a_503_is_retried_on_the_other_server_and_never_reaches_the_client() {
    let bad = TestUpstream::start(|_| status_503());
    let good = TestUpstream::start(|_| Reply::ok("good"));
    let p = proxy(&config(RETRY_ROUTE, &[bad.addr, good.addr]), 1);
    for _ in 0..6 {
        assert_eq!(get(&p), (200, "good".to_string()));
    }
    assert_eq!(bad.requests().len(), 3);
    assert_eq!(p.stats().retries.load(Relaxed), 3);
    let metrics = portico_proxy::admin::metrics(p.control());
    assert!(metrics.contains("\nportico_retries_total 3\n"), "{metrics}");
    p.shutdown();
}

#[test]
fn a_reset_before_the_response_is_retried() {
    let bad = TestUpstream::start(|_| Reply::Close);
    let good = TestUpstream::start(|_| Reply::ok("good"));
    let p = proxy(&config(RETRY_ROUTE, &[bad.addr, good.addr]), 1);
    for _ in 0..4 {
        assert_eq!(get(&p), (200, "good".to_string()));
    }
    assert_eq!(p.stats().retries.load(Relaxed), 2);
    p.shutdown();
}

#[test]
fn non_idempotent_methods_and_bodies_are_not_retried_unless_allowed() {
    let bad = TestUpstream::start(|_| status_503());
    let good = TestUpstream::start(|_| Reply::ok("good"));
    let routes = "[[listeners.routes]]\npath = \"/any/**\"\nproxy = \"main\"\nretry = { non_idempotent = true }\n[[listeners.routes]]\nproxy = \"main\"\nretry = {}\n";
    let p = proxy(&config(routes, &[bad.addr, good.addr]), 1);
    // POST without a body on the default policy: half of them get the 503 as it is.
    let statuses: Vec<u16> = (0..4).map(|_| send(&p, "POST", "/x", "").0).collect();
    assert_eq!(
        statuses.iter().filter(|&&s| s == 503).count(),
        2,
        "{statuses:?}"
    );
    assert_eq!(p.stats().retries.load(Relaxed), 0);
    // Allowed by the route: retried.
    for _ in 0..4 {
        assert_eq!(send(&p, "POST", "/any/x", ""), (200, "good".to_string()));
    }
    assert_eq!(p.stats().retries.load(Relaxed), 2);
    // A request with a body is never retried (it was streamed, not kept).
    let statuses: Vec<u16> = (0..4)
        .map(|_| send(&p, "POST", "/any/x", "abc").0)
        .collect();
    assert_eq!(
        statuses.iter().filter(|&&s| s == 503).count(),
        2,
        "{statuses:?}"
    );
    assert_eq!(p.stats().retries.load(Relaxed), 2);
    p.shutdown();
}

#[test]
fn retries_stop_at_the_budget_share_when_the_whole_group_fails() {
    let a = TestUpstream::start(|_| status_503());
    let b = TestUpstream::start(|_| status_503());
    let routes = "[[listeners.routes]]\nproxy = \"main\"\n[listeners.routes.retry]\nretries = 3\nbudget = 0.2\nmin_per_second = 0\n";
    // Two workers: the budget is one for the process, not one per worker.
    let p = proxy(&config(routes, &[a.addr, b.addr]), 2);
    let requests = 50;
    for _ in 0..requests {
        assert_eq!(get(&p).0, 503);
    }
    let stats = p.stats();
    // 20% of 50 requests: 10 retries in all, although each request asked for up to 3.
    assert_eq!(stats.retries.load(Relaxed), 10);
    // Each request's last failed attempt asked the budget once more and was refused (3 retries
    // were never reached).
    assert_eq!(stats.retries_budget_exhausted.load(Relaxed), 50);
    assert_eq!(a.requests().len() + b.requests().len(), requests + 10);
    let metrics = portico_proxy::admin::metrics(p.control());
    assert!(
        metrics.contains("\nportico_retries_budget_exhausted_total 50\n"),
        "{metrics}"
    );
    p.shutdown();
}
