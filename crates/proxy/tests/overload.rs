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
