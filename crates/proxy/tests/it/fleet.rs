//! Fleet rate limits against a real redis-server: three instances hold one limit together, fall back to their share when Redis stops, count together again when it is back; the closed mode refuses.

use crate::common::{start_toml, wait_for, T};
use portico_proxy::Running;
use portico_testkit::Client;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A redis-server on a loopback port, killed when dropped.
struct Redis {
    port: u16,
    child: Option<Child>,
}

impl Redis {
    fn start() -> Redis {
        let mut r = Redis {
            port: portico_testkit::port_for_restarts(),
            child: None,
        };
        r.restart();
        r
    }

    /// Start (again) on the same port, and wait until it answers.
    fn restart(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (Debian package redis-server; scripts/test.sh installs it)");
        let port = self.port;
        let child = self.child.insert(child);
        wait_for("redis-server to answer", || {
            // Another test may have bound the port while Redis was down: say so.
            if let Ok(Some(st)) = child.try_wait() {
                panic!("redis-server exited ({st}): port {port} taken meanwhile?");
            }
            let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
            s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
            s.write_all(b"PING\r\n").ok()?;
            let mut buf = [0u8; 7];
            s.read_exact(&mut buf).ok()?;
            (&buf == b"+PONG\r\n").then_some(())
        });
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}

fn instance(port: u16, prefix: &str, mode: &str) -> Running {
    start_toml(
        &format!(
            r#"
[admin]
address = "127.0.0.1:0"

[fleet]
redis = "redis://127.0.0.1:{port}/0"
instances = 3
sync_interval = "50ms"
on_redis_down = "{mode}"
prefix = "{prefix}"

[[listeners]]
name = "p"
address = "127.0.0.1:0"

[[listeners.routes]]
name = "api"
rate_limit = {{ rate = 100, scope = "fleet", header = "x-tenant" }}
respond = {{ status = 200, body = "ok" }}
"#
        ),
        1,
    )
}

/// A gauge or counter of the instance's `/metrics`.
fn metric(p: &Running, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut s = TcpStream::connect(p.admin_addr().unwrap()).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let body = out.split_once("\r\n\r\n").unwrap().1;
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).unwrap();
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Counter(v) => v,
            _ => f64::NAN,
        })
}

fn in_mode(p: &Running, mode: &str) -> bool {
    metric(p, "portico_fleet_mode", &[("mode", mode)]) == Some(1.0)
}

/// Offer `per_second` requests a second of tenant "acme" to each address for `secs`, paced
/// (open loop); the responses by status, (200s, 429s), of the requests due from `from` seconds
/// on (the first second of a fresh count may take the whole limit at once, as a full bucket
/// would).
fn offer(addrs: &[SocketAddr], per_second: u32, secs: u32, from: u32) -> (u32, u32) {
    let rates: Vec<(SocketAddr, u32)> = addrs.iter().map(|&a| (a, per_second)).collect();
    offer_each(&rates, secs, from)
}

/// [`offer`] with a rate of its own for each address.
fn offer_each(rates: &[(SocketAddr, u32)], secs: u32, from: u32) -> (u32, u32) {
    let threads: Vec<_> = rates
        .iter()
        .map(|&(a, per_second)| {
            std::thread::spawn(move || {
                let mut c = Client::connect(a).unwrap();
                let start = Instant::now();
                let (mut ok, mut limited) = (0, 0);
                for i in 0..per_second * secs {
                    let due = start + Duration::from_secs_f64(f64::from(i) / f64::from(per_second));
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    let r = c
                        .request(b"GET / HTTP/1.1\r\nHost: t\r\nX-Tenant: acme\r\n\r\n")
                        .unwrap();
                    let counted = i >= per_second * from;
                    match r.status {
                        200 => ok += u32::from(counted),
                        429 => limited += u32::from(counted),
                        s => panic!("unexpected status {s}"),
                    }
                }
                (ok, limited)
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().unwrap())
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

#[test]
fn three_instances_hold_one_limit_fall_back_to_their_share_and_share_again() {
    let mut redis = Redis::start();
    let prefix = format!("t{}", std::process::id());
    let fleet: Vec<Running> = (0..3)
        .map(|_| instance(redis.port, &prefix, "local"))
        .collect();
    let addrs: Vec<SocketAddr> = fleet.iter().map(|p| p.addr("p").unwrap()).collect();

    // 300 requests a second offered over the three, for a limit of 100 a second: the last 3 s
    // of 4 counted.
    let (ok, limited) = offer(&addrs, 100, 4, 1);
    eprintln!("shared: {ok} admitted of {} in 3 s", ok + limited);
    assert!(
        (270..=330).contains(&ok),
        "admitted {ok} in 3 s, not within 10% of 300"
    );
    assert!(fleet.iter().all(|p| in_mode(p, "shared")));
    assert!(metric(&fleet[0], "portico_fleet_keys", &[]).unwrap() >= 1.0);

    // Uneven: 250, 40 and 10 a second. Alone each of the last two would get all it asks, the
    // first 100: together they get 100.
    let uneven = [(addrs[0], 250), (addrs[1], 40), (addrs[2], 10)];
    let (ok, _) = offer_each(&uneven, 4, 1);
    eprintln!("uneven: {ok} admitted in 3 s");
    assert!(
        (270..=330).contains(&ok),
        "admitted {ok} in 3 s of an uneven load"
    );

    // All of it to one instance: the same limit (the others' share is not held back).
    let (ok, _) = offer(&addrs[..1], 300, 4, 1);
    eprintln!("one instance: {ok} admitted in 3 s");
    assert!(
        (270..=330).contains(&ok),
        "admitted {ok} in 3 s through one instance"
    );

    // Redis stops: each instance keeps to a third of the rate on its own.
    redis.stop();
    for p in &fleet {
        wait_for("the local mode", || in_mode(p, "local").then_some(()));
    }
    let (ok, limited) = offer(&addrs, 100, 4, 1);
    eprintln!("local: {ok} admitted of {} in 3 s", ok + limited);
    // 3 x 33.3 a second
    assert!(
        (270..=330).contains(&ok),
        "admitted {ok} in 3 s without Redis"
    );

    // Redis back: counted together again.
    redis.restart();
    for p in &fleet {
        wait_for("the shared mode", || in_mode(p, "shared").then_some(()));
    }
    let (ok, _) = offer(&addrs, 100, 4, 1);
    eprintln!("shared again: {ok} admitted in 3 s");
    assert!(
        (270..=330).contains(&ok),
        "admitted {ok} in 3 s, not within 10% of 300"
    );
    assert!(
        metric(
            &fleet[0],
            "portico_fleet_exchanges_total",
            &[("result", "failed")]
        )
        .unwrap()
            >= 1.0
    );
    for p in fleet {
        p.shutdown();
    }
}

#[test]
fn the_closed_mode_refuses_while_redis_cannot_be_reached() {
    let mut redis = Redis::start();
    let port = redis.port;
    redis.stop();
    let p = instance(port, &format!("c{}", std::process::id()), "closed");
    wait_for("the closed mode", || in_mode(&p, "closed").then_some(()));
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    let r = c
        .request(b"GET / HTTP/1.1\r\nHost: t\r\nX-Tenant: acme\r\n\r\n")
        .unwrap();
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("1"));
    redis.restart();
    wait_for("the shared mode", || in_mode(&p, "shared").then_some(()));
    let r = c
        .request(b"GET / HTTP/1.1\r\nHost: t\r\nX-Tenant: acme\r\n\r\n")
        .unwrap();
    assert_eq!(r.status, 200);
    p.shutdown();
}
