//! Health integration tests: active probes, passive ejection, 503 when all are down, fallback groups.

use crate::common::{closed_port, start_toml};
use portico_config::{HealthCheck, HealthCheckKind, HttpCheck};
use portico_proxy::stats::{Cause, Phase, Side};
use portico_proxy::{Running, Termination};
use portico_testkit::{Client, Reply, StoppableUpstream, TestUpstream};
use portico_upstream::{Health, ServerStatus};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Upper bound for any awaited condition; conditions are polled, never slept on.
const DEADLINE: Duration = Duration::from_secs(10);

fn proxy(toml: &str, workers: usize) -> Running {
    start_toml(toml, workers)
}

/// One listener "p" proxying everything to group "main"; `groups` defines the groups.
fn config(groups: &str) -> String {
    format!(
        r#"
drain_timeout = "2s"
[[listeners]]
name = "p"
address = "127.0.0.1:0"
[[listeners.routes]]
proxy = "main"

{groups}
"#
    )
}

fn servers(list: &[SocketAddr]) -> String {
    let quoted: Vec<String> = list.iter().map(|a| format!("\"{a}\"")).collect();
    format!("[{}]", quoted.join(", "))
}

fn status(p: &Running, group: &str) -> Vec<ServerStatus> {
    p.upstream(group).expect("group").status(Instant::now())
}

/// Poll `cond` until it holds; panic with `what` after [`DEADLINE`].
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn get(p: &Running) -> (u16, String) {
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    let r = c
        .request(b"GET /x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    (r.status, r.text())
}

/// A handler answering probes of `/health` with 200 and requests with `body`.
fn named(body: &'static str) -> impl Fn(&portico_testkit::Captured) -> Reply + Send + Sync {
    move |r| {
        if r.target == "/health" {
            Reply::ok("ok")
        } else {
            Reply::ok(body)
        }
    }
}

#[test]
fn dead_server_is_marked_down_then_comes_back_after_rise_probes() {
    let a = StoppableUpstream::start(named("a"));
    let b = TestUpstream::start(named("b"));
    let p = proxy(
        &config(&format!(
            r#"[upstreams.main]
servers = {}
keepalive = 0
passive = {{ max_failures = 0 }}
[upstreams.main.health_check]
path = "/health"
interval = "60ms"
timeout = "50ms"
rise = 3
fall = 2
"#,
            servers(&[a.addr, b.addr])
        )),
        2,
    );
    wait_for("a probe of a", || {
        status(&p, "main")[0]
            .last_check
            .as_deref()
            .is_some_and(|c| c.starts_with("passed: HTTP 200"))
    });
    a.stop();
    wait_for("a marked down", || {
        status(&p, "main")[0].health == Health::Down
    });
    let st = &status(&p, "main")[0];
    assert_eq!(st.health_transitions, 1);
    assert!(
        st.last_check
            .as_deref()
            .is_some_and(|c| c.starts_with("failed: connect")),
        "{:?}",
        st.last_check
    );
    for _ in 0..10 {
        assert_eq!(
            get(&p),
            (200, "b".to_string()),
            "traffic avoids the down server"
        );
    }
    let probes_before = a.requests().len();
    a.restart();
    wait_for("a back up", || status(&p, "main")[0].health == Health::Up);
    let probes = a
        .requests()
        .iter()
        .skip(probes_before)
        .filter(|r| r.target == "/health")
        .count();
    assert!(
        probes >= 3,
        "up after rise = 3 passing probes, saw {probes}"
    );
    assert_eq!(status(&p, "main")[0].health_transitions, 2);
    let mut seen_a = false;
    for _ in 0..10 {
        seen_a |= get(&p).1 == "a";
    }
    assert!(seen_a, "traffic returns to the recovered server");
}

#[test]
fn server_answering_5xx_is_ejected_passively_and_traffic_moves() {
    let failing = Arc::new(AtomicBool::new(true));
    let f = failing.clone();
    let a = TestUpstream::start(move |_| {
        if f.load(Ordering::SeqCst) {
            Reply::Respond {
                status: 500,
                headers: vec![],
                body: b"broken".to_vec(),
                chunked: false,
            }
        } else {
            Reply::ok("a")
        }
    });
    let b = TestUpstream::start(|_| Reply::ok("b"));
    let p = proxy(
        &config(&format!(
            r#"[upstreams.main]
servers = {}
passive = {{ max_failures = 3, ejection = "10s" }}
"#,
            servers(&[a.addr, b.addr])
        )),
        2,
    );
    let mut errors = 0;
    for _ in 0..30 {
        let (s, _) = get(&p);
        if s == 500 {
            errors += 1;
        } else {
            assert_eq!(s, 200);
        }
    }
    assert_eq!(errors, 3, "ejected after 3 consecutive 5xx");
    let st = &status(&p, "main")[0];
    assert!(st.ejected);
    assert_eq!((st.ejections, st.responses[4]), (1, 3));
    assert_eq!(status(&p, "main")[1].responses[1], 27);
    failing.store(false, Ordering::SeqCst);
}

#[test]
fn every_server_down_answers_503_with_its_own_cause() {
    let p = proxy(
        &config(&format!(
            r#"[upstreams.main]
servers = {}
health_check = {{ type = "tcp", interval = "50ms", timeout = "40ms", fall = 1 }}
"#,
            servers(&[closed_port(), closed_port()])
        )),
        2,
    );
    wait_for("both down", || {
        status(&p, "main").iter().all(|s| s.health == Health::Down)
    });
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    let r = c.request(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(r.header("retry-after"), Some("1"));
    let unavailable = Termination::new(Side::Proxy, Phase::Connect, Cause::Unavailable);
    let at_limit = Termination::new(Side::Proxy, Phase::Connect, Cause::NoServer);
    wait_for("the termination record", || {
        p.stats().terminations(unavailable) == 1
    });
    assert_eq!(p.stats().terminations(at_limit), 0);
    assert_eq!(
        status(&p, "main").iter().map(|s| s.requests).sum::<u64>(),
        0,
        "no request was sent to a down server"
    );
}

#[test]
fn fallback_group_takes_requests_when_every_server_is_down() {
    let backup = TestUpstream::start(|_| Reply::ok("backup"));
    let main = StoppableUpstream::start(|_| Reply::ok("main"));
    let p = proxy(
        &config(&format!(
            r#"[upstreams.main]
servers = {}
fallback = "backup"
health_check = {{ type = "tcp", interval = "50ms", timeout = "40ms", fall = 1, rise = 1 }}

[upstreams.backup]
servers = {}
"#,
            servers(&[main.addr]),
            servers(&[backup.addr])
        )),
        2,
    );
    assert_eq!(get(&p), (200, "main".to_string()));
    main.stop();
    wait_for("main down", || status(&p, "main")[0].health == Health::Down);
    for _ in 0..5 {
        assert_eq!(get(&p), (200, "backup".to_string()));
    }
    main.restart();
    wait_for("main up", || status(&p, "main")[0].health == Health::Up);
    assert_eq!(get(&p), (200, "main".to_string()));
}

#[test]
fn one_probe_per_server_per_interval_whatever_the_worker_count() {
    let counts: Vec<Arc<AtomicUsize>> = (0..2).map(|_| Arc::new(AtomicUsize::new(0))).collect();
    let ups: Vec<TestUpstream> = counts
        .iter()
        .map(|n| {
            let n = n.clone();
            TestUpstream::start(move |r| {
                if r.target == "/health" {
                    n.fetch_add(1, Ordering::SeqCst);
                }
                Reply::ok("ok")
            })
        })
        .collect();
    let started = Instant::now();
    let p = proxy(
        &config(&format!(
            r#"[upstreams.main]
servers = {}
health_check = {{ path = "/health", host = "health.internal", interval = "100ms", timeout = "50ms" }}
"#,
            servers(&[ups[0].addr, ups[1].addr])
        )),
        4,
    );
    wait_for("8 probes of the first server", || {
        counts[0].load(Ordering::SeqCst) >= 8
    });
    let elapsed = started.elapsed();
    // 8 probes take at least 7 intervals; one prober per worker would take a quarter of that.
    assert!(
        elapsed >= Duration::from_millis(690),
        "8 probes in {elapsed:?}"
    );
    let other = counts[1].load(Ordering::SeqCst);
    let bound = elapsed.as_millis() / 100 + 2;
    assert!(
        other as u128 <= bound,
        "{other} probes of the second server in {elapsed:?}"
    );
    let probe = &ups[0].requests()[0];
    assert_eq!(probe.method, "GET");
    assert_eq!(probe.header("host"), Some("health.internal"));
    assert_eq!(probe.header("user-agent"), Some("portico-health"));
    assert_eq!(probe.header("connection"), Some("close"));

    // Shutdown stops the checker.
    p.shutdown();
    p.wait();
    let after = counts[0].load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        counts[0].load(Ordering::SeqCst),
        after,
        "probes after shutdown"
    );
}

fn http_check(edit: impl FnOnce(&mut HttpCheck)) -> HealthCheck {
    let mut http = HttpCheck {
        method: "GET".into(),
        path: "/health".into(),
        host: None,
        expect_status: (200, 399),
        expect_body: None,
    };
    edit(&mut http);
    HealthCheck {
        kind: HealthCheckKind::Http(http),
        interval: Duration::from_secs(1),
        timeout: Duration::from_millis(300),
        rise: 1,
        fall: 1,
    }
}

#[test]
fn probe_checks_status_body_and_timeout() {
    let up = TestUpstream::start(|r| match r.target.as_str() {
        "/health" => Reply::Respond {
            status: 200,
            headers: vec![],
            body: b"{\"status\": \"degraded\"}".to_vec(),
            chunked: true,
        },
        "/missing" => Reply::Respond {
            status: 404,
            headers: vec![],
            body: vec![],
            chunked: false,
        },
        _ => Reply::Stall(Duration::from_secs(2)),
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let probe = |check: HealthCheck| rt.block_on(portico_proxy::health::probe(up.addr, &check));

    let (ok, detail) = probe(http_check(|_| {}));
    assert!(ok, "{detail}");
    assert!(detail.starts_with("HTTP 200 in "), "{detail}");
    let (ok, detail) = probe(http_check(|h| h.expect_body = Some("degraded".into())));
    assert!(
        ok && detail.starts_with("HTTP 200, body matched"),
        "{detail}"
    );
    let (ok, detail) = probe(http_check(|h| h.expect_body = Some("\"ok\"".into())));
    assert!(!ok);
    assert!(detail.contains("body does not contain"), "{detail}");
    let (ok, detail) = probe(http_check(|h| h.path = "/missing".into()));
    assert_eq!((ok, detail.as_str()), (false, "HTTP 404, expected 200-399"));
    let (ok, detail) = probe(http_check(|h| {
        h.path = "/missing".into();
        h.method = "HEAD".into();
        h.expect_status = (404, 404);
    }));
    assert!(ok, "{detail}");
    let (ok, detail) = probe(http_check(|h| h.path = "/slow".into()));
    assert_eq!((ok, detail.as_str()), (false, "timed out after 300ms"));
    let mut tcp = http_check(|_| {});
    tcp.kind = HealthCheckKind::Tcp;
    assert!(probe(tcp.clone()).0);
    let (ok, detail) = rt.block_on(portico_proxy::health::probe(closed_port(), &tcp));
    assert!(!ok && detail.starts_with("connect: "), "{detail}");
}

#[test]
fn refused_connects_eject_a_server_and_count_as_failures() {
    let b = TestUpstream::start(|_| Reply::ok("b"));
    let p = proxy(
        &config(&format!(
            r#"[upstreams.main]
servers = {}
passive = {{ max_failures = 2, ejection = "30s" }}
"#,
            servers(&[closed_port(), b.addr])
        )),
        2,
    );
    let statuses: Vec<u16> = (0..12).map(|_| get(&p).0).collect();
    assert_eq!(
        statuses.iter().filter(|&&s| s == 502).count(),
        2,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|&&s| s == 200).count(),
        10,
        "{statuses:?}"
    );
    let st = &status(&p, "main")[0];
    assert!(st.ejected);
    assert_eq!((st.failures, st.ejections, st.requests), (2, 1, 2));
}

#[test]
fn probes_keep_their_schedule_across_reloads_that_keep_their_settings() {
    let n = Arc::new(AtomicUsize::new(0));
    let counted = n.clone();
    let up = TestUpstream::start(move |r| {
        if r.target == "/health" {
            counted.fetch_add(1, Ordering::SeqCst);
        }
        Reply::ok("ok")
    });
    let other = TestUpstream::start(|_| Reply::ok("ok"));
    let group = |list: &[SocketAddr]| {
        config(&format!(
            r#"[upstreams.main]
servers = {}
health_check = {{ path = "/health", interval = "1s", timeout = "500ms" }}
"#,
            servers(list)
        ))
    };
    let p = proxy(&group(&[up.addr]), 1);
    wait_for("the first probe", || n.load(Ordering::SeqCst) >= 1);
    let started = Instant::now();
    let first = n.load(Ordering::SeqCst);
    // Reloads every 50 ms for 2.5 s, the other server coming and going (as a discovery's
    // answers would): the probes of the server that stays go on once a second.
    let mut i = 0;
    while started.elapsed() < Duration::from_millis(2500) {
        let list: &[SocketAddr] = match i % 2 {
            0 => &[up.addr, other.addr],
            _ => &[up.addr],
        };
        let cfg = portico_config::parse(&group(list), "test.toml").unwrap();
        p.reload(cfg).expect("reload");
        i += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    let probes = n.load(Ordering::SeqCst) - first;
    assert!(
        (2..=4).contains(&probes),
        "{probes} probes in 2.5 s at 1 a second, through {i} reloads"
    );
    p.shutdown();
}
