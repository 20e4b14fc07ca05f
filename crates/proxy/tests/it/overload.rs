//! Overload tests: the bounded upstream queue with its timeout, sticky cookies, load shedding.

use portico_proxy::stats::{Cause, Phase, Side};
use portico_proxy::{start, Running, Termination};
use portico_testkit::{Client, Hold, Reply, TestUpstream};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How long a condition polled by a test may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(10);

fn run(toml: &str, workers: usize) -> Running {
    let cfg = portico_config::parse(toml, "test.toml").unwrap();
    start(cfg, workers).unwrap()
}

/// A proxy with one listener "p" proxying everything to group "g" (`group_keys` added to it).
fn proxy(servers: &[SocketAddr], group_keys: &str, workers: usize) -> Running {
    let list: Vec<String> = servers.iter().map(|s| format!("\"{s}\"")).collect();
    run(
        &format!(
            r#"
[[listeners]]
name = "p"
address = "127.0.0.1:0"

[[listeners.routes]]
proxy = "g"

[upstreams.g]
servers = [{}]
{group_keys}
"#,
            list.join(", ")
        ),
        workers,
    )
}

/// Poll `cond` until it holds; fail the test after [`DEADLINE`].
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + DEADLINE;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn waiting(p: &Running) -> u32 {
    p.control().snapshot().group_stats[0].queue.waiting()
}

fn proxy_cause(p: &Running, cause: Cause) -> u64 {
    p.stats()
        .terminations(Termination::new(Side::Proxy, Phase::Connect, cause))
}

/// An upstream whose every request waits for the test's `Hold`.
fn held_upstream(hold: &Hold) -> TestUpstream {
    let h = hold.clone();
    TestUpstream::start(move |req| {
        h.wait();
        Reply::ok(&req.target)
    })
}

const GET_A: &[u8] = b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n";
const GET_B: &[u8] = b"GET /b HTTP/1.1\r\nHost: t\r\n\r\n";
const GET_C: &[u8] = b"GET /c HTTP/1.1\r\nHost: t\r\n\r\n";

#[test]
fn queued_request_is_admitted_when_a_slot_frees() {
    let hold = Hold::new();
    let up = held_upstream(&hold);
    let p = proxy(
        &[up.addr],
        "max_connections_per_server = 1\nqueue = 4\nqueue_timeout = \"10s\"",
        2,
    );
    let addr = p.addr("p").unwrap();
    let mut a = Client::connect(addr).unwrap();
    a.send(GET_A).unwrap();
    assert!(hold.wait_held(1), "first request reaches the server");
    let mut b = Client::connect(addr).unwrap();
    b.send(GET_B).unwrap();
    eventually("the second request waits in the queue", || waiting(&p) == 1);
    assert_eq!(hold.held(), 1, "the queued request is not sent yet");

    // The first response frees the slot: the queued request goes to the server.
    hold.release(1);
    let r = a.read_response(false).unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "/a"));
    assert!(hold.wait_held(1), "the queued request reaches the server");
    hold.release(1);
    let r = b.read_response(false).unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "/b"));
    assert_eq!(waiting(&p), 0);
    let q = &p.control().snapshot().group_stats[0].queue;
    assert_eq!(
        (
            q.queued.load(std::sync::atomic::Ordering::Relaxed),
            q.admitted.load(std::sync::atomic::Ordering::Relaxed)
        ),
        (1, 1)
    );
}

#[test]
fn queue_timeout_answers_503_with_retry_after() {
    let hold = Hold::new();
    let up = held_upstream(&hold);
    let p = proxy(
        &[up.addr],
        "max_connections_per_server = 1\nqueue = 4\nqueue_timeout = \"200ms\"",
        1,
    );
    let addr = p.addr("p").unwrap();
    let mut a = Client::connect(addr).unwrap();
    a.send(GET_A).unwrap();
    assert!(hold.wait_held(1));
    let mut b = Client::connect(addr).unwrap();
    let asked = Instant::now();
    let r = b.request(GET_B).unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(
        asked.elapsed() >= Duration::from_millis(200),
        "answered before the queue timeout: {:?}",
        asked.elapsed()
    );
    eventually("queue_timeout counted", || {
        proxy_cause(&p, Cause::QueueTimeout) == 1
    });
    assert_eq!(proxy_cause(&p, Cause::QueueFull), 0);
    // The connection stays usable, and the held request still completes.
    hold.open();
    assert_eq!(a.read_response(false).unwrap().status, 200);
    assert_eq!(b.request(GET_C).unwrap().status, 200);
    let q = &p.control().snapshot().group_stats[0].queue;
    assert_eq!(q.timeouts.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[test]
fn full_queue_answers_503_at_once() {
    let hold = Hold::new();
    let up = held_upstream(&hold);
    let p = proxy(
        &[up.addr],
        "max_connections_per_server = 1\nqueue = 1\nqueue_timeout = \"10s\"",
        2,
    );
    let addr = p.addr("p").unwrap();
    let mut a = Client::connect(addr).unwrap();
    a.send(GET_A).unwrap();
    assert!(hold.wait_held(1));
    let mut b = Client::connect(addr).unwrap();
    b.send(GET_B).unwrap();
    eventually("the second request waits in the queue", || waiting(&p) == 1);
    // The queue is full: the third is refused while the first is held and the second waits,
    // so the refusal cannot have waited for either.
    let mut c = Client::connect(addr).unwrap();
    let r = c.request(GET_C).unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(waiting(&p), 1);
    assert_eq!(hold.held(), 1);
    eventually("queue_full counted", || {
        proxy_cause(&p, Cause::QueueFull) == 1
    });
    let metrics = portico_proxy::admin::metrics(p.control());
    for line in [
        "portico_group_queue_full_total{group=\"g\"} 1\n",
        "portico_group_queue_waiting{group=\"g\"} 1\n",
        "portico_terminations_total{side=\"proxy\",phase=\"connect\",cause=\"queue_full\"} 1\n",
    ] {
        assert!(metrics.contains(line), "{line} missing from:\n{metrics}");
    }

    hold.open();
    assert_eq!(a.read_response(false).unwrap().status, 200);
    assert_eq!(b.read_response(false).unwrap().status, 200);
    assert_eq!(proxy_cause(&p, Cause::QueueTimeout), 0);
}

#[test]
fn without_a_queue_a_full_group_answers_503_at_once() {
    let hold = Hold::new();
    let up = held_upstream(&hold);
    let p = proxy(&[up.addr], "max_connections_per_server = 1", 1);
    let addr = p.addr("p").unwrap();
    let mut a = Client::connect(addr).unwrap();
    a.send(GET_A).unwrap();
    assert!(hold.wait_held(1));
    let r = Client::connect(addr).unwrap().request(GET_B).unwrap();
    assert_eq!(r.status, 503);
    eventually("no_server counted", || {
        proxy_cause(&p, Cause::NoServer) == 1
    });
    assert_eq!(proxy_cause(&p, Cause::QueueFull), 0);
    hold.open();
    assert_eq!(a.read_response(false).unwrap().status, 200);
}

/// One admin request on a new connection: the status.
fn admin_post(addr: SocketAddr, path: &str) -> u16 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out[9..12].parse().unwrap()
}

/// The `NAME=value` part of a Set-Cookie header.
fn cookie_pair(r: &portico_testkit::Response) -> Option<String> {
    r.header("set-cookie")
        .map(|v| v.split(';').next().unwrap_or("").to_string())
}

#[test]
fn sticky_cookie_is_set_honoured_and_set_again_when_its_server_is_disabled() {
    let ups: Vec<TestUpstream> = (0..3)
        .map(|i| TestUpstream::start(move |_| Reply::ok(&format!("s{i}"))))
        .collect();
    let addrs: Vec<SocketAddr> = ups.iter().map(|u| u.addr).collect();
    let list: Vec<String> = addrs.iter().map(|s| format!("\"{s}\"")).collect();
    let p = run(
        &format!(
            r#"
[admin]
address = "127.0.0.1:0"

[[listeners]]
name = "p"
address = "127.0.0.1:0"

[[listeners.routes]]
proxy = "g"

[upstreams.g]
servers = [{}]
balance = "least_connections"
sticky_cookie = {{ name = "PORTICO_SRV", max_age = "1h" }}
"#,
            list.join(", ")
        ),
        2,
    );
    let addr = p.addr("p").unwrap();
    // A new client: the balancer picks, the response names the server.
    let first = Client::connect(addr)
        .unwrap()
        .request(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    assert_eq!(first.status, 200);
    let set = first
        .header("set-cookie")
        .expect("Set-Cookie on the first response");
    assert!(set.ends_with("; Path=/; Max-Age=3600; HttpOnly"), "{set}");
    let cookie = cookie_pair(&first).unwrap();
    let server = first.text();
    assert!(
        !addrs.iter().any(|a| set.contains(&a.to_string())),
        "the id does not show the address: {set}"
    );

    // With the cookie, every request (new connections, other workers) goes to that server and
    // the cookie is not set again; without it the balancer spreads them.
    let with = format!("GET / HTTP/1.1\r\nHost: t\r\nCookie: a=b; {cookie}\r\n\r\n");
    let mut seen_without = std::collections::HashSet::new();
    for _ in 0..12 {
        let r = Client::connect(addr)
            .unwrap()
            .request(with.as_bytes())
            .unwrap();
        assert_eq!(r.text(), server);
        assert_eq!(r.header("set-cookie"), None);
        let r = Client::connect(addr)
            .unwrap()
            .request(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        seen_without.insert(r.text());
    }
    assert!(
        seen_without.len() >= 2,
        "balancer never spread: {seen_without:?}"
    );

    // Its server is disabled: the balancer picks another and the cookie names the new one.
    let index = server[1..].parse::<usize>().unwrap();
    let a = p.admin_addr().unwrap();
    let path = format!("/api/groups/g/servers/{}/disable", addrs[index]);
    assert_eq!(admin_post(a, &path), 200);
    let r = Client::connect(addr)
        .unwrap()
        .request(with.as_bytes())
        .unwrap();
    assert_eq!(r.status, 200);
    assert_ne!(r.text(), server);
    let moved = cookie_pair(&r).expect("cookie set again");
    assert_ne!(moved, cookie);
    // And the new cookie sticks to the new server.
    let again = format!("GET / HTTP/1.1\r\nHost: t\r\nCookie: {moved}\r\n\r\n");
    for _ in 0..5 {
        let r2 = Client::connect(addr)
            .unwrap()
            .request(again.as_bytes())
            .unwrap();
        assert_eq!(r2.text(), r.text());
        assert_eq!(r2.header("set-cookie"), None);
    }
    // Enabled again, the old cookie finds its server again; ids come from addresses, so a
    // reload that reorders the servers keeps them.
    assert_eq!(
        admin_post(a, &format!("/api/groups/g/servers/{}/enable", addrs[index])),
        200
    );
    let r = Client::connect(addr)
        .unwrap()
        .request(with.as_bytes())
        .unwrap();
    assert_eq!(r.text(), server);
    let reversed: Vec<String> = list.iter().rev().cloned().collect();
    let cfg = format!(
        "[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nproxy = \"g\"\n[upstreams.g]\nservers = [{}]\nsticky_cookie = \"PORTICO_SRV\"\n",
        reversed.join(", ")
    );
    p.reload(portico_config::parse(&cfg, "reload.toml").unwrap())
        .unwrap();
    for _ in 0..4 {
        let r = Client::connect(addr)
            .unwrap()
            .request(with.as_bytes())
            .unwrap();
        assert_eq!(r.text(), server);
        assert_eq!(r.header("set-cookie"), None);
    }
}

fn shedding(p: &Running) -> i64 {
    p.stats()
        .shedding
        .load(std::sync::atomic::Ordering::Relaxed)
}

#[test]
fn saturated_worker_sheds_new_requests_fast_while_admitted_ones_finish() {
    let hold = Hold::new();
    let up = held_upstream(&hold);
    let p = run(
        &format!(
            r#"
[[listeners]]
name = "p"
address = "127.0.0.1:0"
shed = {{ target = "5ms", interval = "20ms" }}

[[listeners.routes]]
path = "/held"
proxy = "g"

[[listeners.routes]]
respond = {{ status = 200, body = "fast" }}

[[listeners]]
name = "internal"
address = "127.0.0.1:0"

[[listeners.routes]]
respond = {{ status = 200, body = "internal" }}

[upstreams.g]
servers = ["{}"]
"#,
            up.addr
        ),
        1,
    );
    let addr = p.addr("p").unwrap();
    let internal = p.addr("internal").unwrap();
    let get = b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n";
    assert_eq!(
        Client::connect(addr).unwrap().request(get).unwrap().status,
        200
    );
    // Admitted before the worker saturates: held by the upstream.
    let mut admitted = Client::connect(addr).unwrap();
    admitted
        .send(b"GET /held HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    assert!(hold.wait_held(1));
    let mut kept = Client::connect(addr).unwrap();
    assert_eq!(kept.request(get).unwrap().status, 200);

    // Every lag sample now comes at least 20 ms late (4x the target): the worker sheds.
    p.control()
        .simulate_saturation(Some(Duration::from_millis(25)));
    eventually("the worker starts shedding", || shedding(&p) == 1);
    for _ in 0..5 {
        let asked = Instant::now();
        let r = Client::connect(addr).unwrap().request(get).unwrap();
        assert_eq!(r.status, 503);
        assert_eq!(r.header("retry-after"), Some("1"));
        assert!(r.text().contains("overloaded"), "{}", r.text());
        assert!(
            asked.elapsed() < Duration::from_secs(2),
            "shed answer took {:?}",
            asked.elapsed()
        );
    }
    // A kept-alive connection gets the same answer and stays open.
    assert_eq!(kept.request(get).unwrap().status, 503);
    // A listener without `shed` on the same worker still serves.
    let r = Client::connect(internal).unwrap().request(get).unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "internal"));
    // The admitted request completes normally while the worker is still saturated.
    hold.open();
    let r = admitted.read_response(false).unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "/held"));
    assert_eq!(shedding(&p), 1);

    // Load gone: the first sample back under target stops shedding.
    p.control().simulate_saturation(None);
    eventually("shedding stops", || shedding(&p) == 0);
    assert_eq!(kept.request(get).unwrap().status, 200);
    let shed = p
        .stats()
        .requests_shed
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(shed, 6);
    eventually("every shed request recorded", || {
        p.stats()
            .terminations(Termination::new(Side::Proxy, Phase::Route, Cause::Shed))
            == 6
    });
    let metrics = portico_proxy::admin::metrics(p.control());
    for line in [
        "portico_requests_shed_total 6\n",
        "portico_shedding 0\n",
        "portico_terminations_total{side=\"proxy\",phase=\"route\",cause=\"shed\"} 6\n",
    ] {
        assert!(metrics.contains(line), "{line} missing from:\n{metrics}");
    }
}
