//! Resilience integration tests: retries on other servers under a budget, with real upstreams that fail on cue.

use crate::common::{closed_port, start_toml};
use portico_proxy::Running;
use portico_testkit::{Client, Reply, TestUpstream};
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;

fn proxy(toml: &str, workers: usize) -> Running {
    start_toml(toml, workers)
}

fn servers(list: &[SocketAddr]) -> String {
    let quoted: Vec<String> = list.iter().map(|a| format!("\"{a}\"")).collect();
    format!("[{}]", quoted.join(", "))
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
    assert!(
        metrics.contains("\nportico_route_retries_total{listener=\"p\",route=\"p#0\"} 3\n"),
        "{metrics}"
    );
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
fn a_head_timeout_is_retried_only_when_listed() {
    let slow = TestUpstream::start(|_| Reply::Stall(std::time::Duration::from_secs(2)));
    let good = TestUpstream::start(|_| Reply::ok("good"));
    let routes = "[[listeners.routes]]\npath = \"/listed\"\nproxy = \"main\"\nretry = { on = [\"timeout\"] }\n[[listeners.routes]]\nproxy = \"main\"\nretry = {}\n";
    let toml = config(routes, &[slow.addr, good.addr]).replace(
        "passive =",
        "response_header_timeout = \"100ms\"\npassive =",
    );
    let p = proxy(&toml, 1);
    // Round robin: the first attempt of the first request goes to the slow server.
    assert_eq!(send(&p, "GET", "/listed", ""), (200, "good".to_string()));
    assert_eq!(p.stats().retries.load(Relaxed), 1);
    // The default list leaves timeouts out: the client gets the 504.
    let statuses: Vec<u16> = (0..2).map(|_| send(&p, "GET", "/x", "").0).collect();
    assert!(statuses.contains(&504), "{statuses:?}");
    assert_eq!(p.stats().retries.load(Relaxed), 1);
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

/// One listener "p" answering 200 itself on a route limited by `limit` (a rate_limit table).
fn limited(limit: &str) -> String {
    format!(
        "drain_timeout = \"2s\"\n[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nrespond = {{ status = 200, body = \"ok\" }}\nrate_limit = {limit}\n"
    )
}

fn get_with(p: &Running, extra: &str) -> portico_testkit::Response {
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    let raw = format!("GET /x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n{extra}\r\n");
    c.request(raw.as_bytes()).unwrap()
}

#[test]
fn over_the_limit_is_429_with_retry_after_per_key() {
    let p = proxy(&limited("{ rate = 0.5, burst = 2, header = \"x-key\" }"), 2);
    for _ in 0..2 {
        assert_eq!(get_with(&p, "X-Key: a\r\n").status, 200);
    }
    let r = get_with(&p, "X-Key: a\r\n");
    assert_eq!(r.status, 429);
    // The next token comes in 2 s (0.5 per second); never less than 1.
    let after: u64 = r
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!((1..=2).contains(&after), "Retry-After {after}");
    // Another key has its own bucket; requests without the header count by client IP.
    assert_eq!(get_with(&p, "X-Key: b\r\n").status, 200);
    assert_eq!(get_with(&p, "").status, 200);
    assert_eq!(get_with(&p, "").status, 200);
    assert_eq!(get_with(&p, "").status, 429);
    assert_eq!(p.stats().rate_limited.load(Relaxed), 2);
    let metrics = portico_proxy::admin::metrics(p.control());
    assert!(
        metrics.contains("\nportico_rate_limited_total 2\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("\nportico_route_rate_limited_total{listener=\"p\",route=\"p#0\"} 2\n"),
        "{metrics}"
    );
    // Routes without the feature have no series.
    assert!(
        !metrics.contains("portico_route_retries_total{"),
        "{metrics}"
    );
    p.shutdown();
}

#[test]
fn the_rate_limit_is_exact_across_workers() {
    let (rate, burst) = (20.0, 10.0);
    let p = proxy(&limited("{ rate = 20, burst = 10 }"), 2);
    let addr = p.addr("p").unwrap();
    let run_for = std::time::Duration::from_millis(1000);
    let started = std::time::Instant::now();
    // Several clients at once, a new connection per request: the kernel spreads the
    // connections over both workers' sockets, and all of them share one bucket (one client IP).
    let threads: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                let (mut ok, mut limited) = (0u64, 0u64);
                let mut last_sent = started;
                while started.elapsed() < run_for {
                    last_sent = std::time::Instant::now();
                    let mut c = Client::connect(addr).unwrap();
                    let r = c
                        .request(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                        .unwrap();
                    match r.status {
                        200 => ok += 1,
                        429 => limited += 1,
                        s => panic!("status {s}"),
                    }
                }
                (ok, limited, last_sent)
            })
        })
        .collect();
    let (mut ok, mut limited, mut last_sent) = (0, 0, started);
    for t in threads {
        let (o, l, sent) = t.join().unwrap();
        ok += o;
        limited += l;
        last_sent = last_sent.max(sent);
    }
    let elapsed = started.elapsed().as_secs_f64();
    // No more than the burst plus the rate over the whole run (+1 for rounding): with a bucket
    // per worker it would be about twice that.
    let most = burst + rate * elapsed;
    // And every token minted while requests kept coming was taken: at least the burst plus the
    // rate until the last request was sent, less the first request's way in (100 ms at most).
    let least = burst + rate * (last_sent - started).as_secs_f64() - rate * 0.1 - 1.0;
    eprintln!("allowed {ok}, limited {limited}, expected {least:.1} to {most:.1}");
    assert!(
        ok as f64 <= most + 1.0,
        "{ok} allowed, at most {most:.1} expected"
    );
    assert!(
        ok as f64 >= least,
        "{ok} allowed, at least {least:.1} expected"
    );
    assert!(limited > 0);
    assert_eq!(p.stats().rate_limited.load(Relaxed), limited);
    p.shutdown();
}

#[test]
fn a_reload_keeps_the_buckets_of_an_unchanged_limit_and_resets_a_changed_one() {
    let text = limited("{ rate = 0.01, burst = 1 }");
    let p = proxy(&text, 1);
    assert_eq!(get_with(&p, "").status, 200);
    assert_eq!(get_with(&p, "").status, 429);
    // The same limit: the empty bucket stays empty (a reload is no way around a limit).
    p.reload(portico_config::parse(&text, "t").unwrap())
        .unwrap();
    assert_eq!(get_with(&p, "").status, 429);
    // A new limit starts with full buckets.
    let changed = limited("{ rate = 0.01, burst = 2 }");
    p.reload(portico_config::parse(&changed, "t").unwrap())
        .unwrap();
    assert_eq!(get_with(&p, "").status, 200);
    p.shutdown();
}

#[test]
fn the_access_log_carries_phase_timings() {
    let dir = std::env::temp_dir().join(format!("portico-phases-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("access.log");
    let _ = std::fs::remove_file(&path);
    let up = TestUpstream::start(|r| {
        if r.target == "/slow" {
            Reply::Stall(std::time::Duration::from_millis(50))
        } else {
            Reply::ok("fast")
        }
    });
    let toml = format!(
        "access_log = {{ path = \"{}\", format = \"json\" }}\n{}",
        path.display(),
        config(RETRY_ROUTE, &[up.addr])
    );
    let p = proxy(&toml, 1);
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    for target in ["/first", "/slow"] {
        let raw = format!("GET {target} HTTP/1.1\r\nHost: t\r\n\r\n");
        assert_eq!(c.request(raw.as_bytes()).unwrap().status, 200);
    }
    drop(c);
    p.shutdown();
    p.wait();
    let log = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(lines.len(), 2, "{log}");
    let secs = |v: &serde_json::Value, k: &str| v[k].as_f64();
    let (first, slow) = (&lines[0], &lines[1]);
    assert_eq!(first["target"], "/first");
    // A new upstream connection: its connect time is logged; the reused one has none.
    assert!(secs(first, "connect_s").is_some(), "{log}");
    assert!(secs(slow, "connect_s").is_none(), "{log}");
    for v in [first, slow] {
        let head = secs(v, "head_s").expect("head_s");
        let ttfb = secs(v, "ttfb_s").expect("ttfb_s");
        let total = secs(v, "duration_s").expect("duration_s");
        assert!(head <= ttfb && ttfb <= total, "{log}");
    }
    // The upstream waited 50 ms before its head.
    assert!(secs(slow, "ttfb_s").unwrap() >= 0.05, "{log}");
}
