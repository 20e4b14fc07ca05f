//! The admin dashboard in a real headless browser (Debian's chromium): it loads, shows live numbers under load, and a down server as down.
//!
//! Ignored by plain `cargo test` (it needs `/usr/bin/chromium`); `scripts/test.sh` installs
//! chromium and runs it with `--ignored`. Set `PORTICO_CHROMIUM` to use another binary.

use portico_proxy::{start, Running};
use portico_testkit::{Client, Reply, TestUpstream};
use portico_upstream::Health;
use std::net::{SocketAddr, TcpListener};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn chromium() -> String {
    std::env::var("PORTICO_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into())
}

/// Load the page in headless chromium, let its timers run for `budget_ms` of virtual time, and
/// return the DOM as the page's script left it.
fn dump_dom(url: &str, budget_ms: u32) -> String {
    // One profile per browser run: the tests of this file run at the same time.
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let run = RUNS.fetch_add(1, Ordering::Relaxed);
    let profile =
        std::env::temp_dir().join(format!("portico-chromium-{}-{run}", std::process::id()));
    let out = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--virtual-time-budget={budget_ms}"))
        .arg("--timeout=30000")
        .arg("--dump-dom")
        .arg(url)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {} ({e}); scripts/test.sh installs it",
                chromium()
            )
        });
    let _ = std::fs::remove_dir_all(&profile);
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The text of the first element carrying `attr` (e.g. `data-server="1.2.3.4:5"`), tags removed.
fn row_text(dom: &str, attr: &str) -> String {
    let Some(at) = dom.find(attr) else {
        panic!("no element with {attr} in the page:\n{dom}")
    };
    // From the end of the element's opening tag to the end of its row.
    let at = dom[at..].find('>').map_or(dom.len(), |e| at + e + 1);
    let end = dom[at..].find("</tr>").map_or(dom.len(), |e| at + e);
    let mut text = String::new();
    let mut in_tag = false;
    for ch in dom[at..end].replace("&nbsp;", " ").chars() {
        match ch {
            '<' => in_tag = true,
            '>' => {
                in_tag = false;
                text.push(' ');
            }
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The numeric value of `data-updates` on <body>: how many polls the page rendered.
fn updates(dom: &str) -> u64 {
    dom.split("data-updates=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[test]
#[ignore = "needs chromium; scripts/test.sh runs it"]
fn dashboard_shows_live_numbers_and_a_down_server() {
    let up = TestUpstream::start(|_| Reply::ok("ok"));
    let dead: SocketAddr = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let toml = format!(
        r#"
[admin]
address = "127.0.0.1:0"
[[listeners]]
name = "p"
address = "127.0.0.1:0"
[[listeners.routes]]
name = "api"
proxy = "b"
[upstreams.b]
servers = ["{}", "{dead}"]
health_check = {{ type = "tcp", interval = "100ms", timeout = "50ms", fall = 1, rise = 1 }}
"#,
        up.addr
    );
    let p: Running = start(portico_config::parse(&toml, "t.toml").unwrap(), 2).unwrap();
    let admin = p.admin_addr().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while p.upstream("b").unwrap().status(Instant::now())[1].health != Health::Down {
        assert!(Instant::now() < deadline, "the dead server never went down");
        std::thread::sleep(Duration::from_millis(10));
    }

    // Steady load while the browser watches; bounded by a flag and a deadline.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let load = {
        let (stop, sent, addr) = (stop.clone(), sent.clone(), p.addr("p").unwrap());
        std::thread::spawn(move || {
            let mut c = Client::connect(addr).unwrap();
            let until = Instant::now() + Duration::from_secs(60);
            while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                let r = c.request(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
                assert_eq!(r.status, 200);
                sent.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    while sent.load(Ordering::Relaxed) < 20 {
        std::thread::sleep(Duration::from_millis(5));
    }

    // The dead server drained too: the page shows the operator's state and the checks' both.
    let mut a = std::net::TcpStream::connect(admin).unwrap();
    std::io::Write::write_all(
        &mut a,
        format!("POST /api/groups/b/servers/{dead}/drain HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut a, &mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    let url = format!("http://{admin}/");
    let first = dump_dom(&url, 4000);
    let second = dump_dom(&url, 4000);
    stop.store(true, Ordering::Relaxed);
    load.join().unwrap();

    assert!(
        updates(&first) >= 2,
        "the page polled fewer than twice:\n{first}"
    );
    // The down and drained server shows both states, since when, and the action that undoes
    // the drain; the live one is up, with the actions that take it out.
    let dead_row = row_text(&first, &format!("data-server=\"{dead}\""));
    assert!(dead_row.contains(" draining down "), "{dead_row}");
    assert!(dead_row.contains(" ago "), "{dead_row}");
    assert!(dead_row.contains(" 0 0 0 B enable "), "{dead_row}");
    let live_row = row_text(&first, &format!("data-server=\"{}\"", up.addr));
    assert!(live_row.contains(" up "), "{live_row}");
    assert!(live_row.contains(" drain disable "), "{live_row}");
    // The groups come first, above the routes; the feed of recent warnings is there.
    let groups_at = first.find("data-group=\"b\"").unwrap();
    assert!(groups_at < first.find("data-route=\"api\"").unwrap());
    assert!(first.contains("Recent warnings and errors"));
    // Requests per second under load: a positive rate, computed from two polls.
    let route = row_text(&first, "data-route=\"api\"");
    let fields: Vec<&str> = route.split(' ').collect();
    // api, the match ("any request"), action words ("proxy", "b"), req/s, 4xx/s, 5xx/s, p50..,
    // total
    assert_eq!(
        fields[..5],
        ["api", "any", "request", "proxy", "b"],
        "{route}"
    );
    let rps: f64 = fields[5].parse().unwrap_or(0.0);
    assert!(rps > 0.0, "no request rate shown: {route}");
    // The totals moved between the two page loads.
    let total = |dom: &str| -> u64 {
        let row = row_text(dom, "data-route=\"api\"");
        row.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert!(
        total(&second) > total(&first),
        "the numbers did not change under load"
    );
}

/// Poll `cond` until it holds, bounded.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The last `n` whitespace-separated fields of a row, as numbers.
fn last_numbers(row: &str, n: usize) -> Vec<u64> {
    let fields: Vec<&str> = row.split(' ').collect();
    fields[fields.len().saturating_sub(n)..]
        .iter()
        .map(|f| f.parse().unwrap_or_else(|_| panic!("{f:?} in {row:?}")))
        .collect()
}

#[test]
#[ignore = "needs chromium; scripts/test.sh runs it"]
fn dashboard_shows_retries_queues_and_shedding() {
    use portico_testkit::{closed_port, Hold};
    let hold = Hold::new();
    let held = {
        let h = hold.clone();
        TestUpstream::start(move |_| {
            h.wait();
            Reply::ok("held")
        })
    };
    let live = TestUpstream::start(|_| Reply::ok("ok"));
    let toml = format!(
        r#"
[admin]
address = "127.0.0.1:0"
[[listeners]]
name = "p"
address = "127.0.0.1:0"
shed = {{ target = "5ms", interval = "20ms" }}
[[listeners.routes]]
name = "queued"
path = "/q/**"
proxy = "q"
[[listeners.routes]]
name = "retried"
path = "/r/**"
proxy = "r"
retry = {{ on = "connect" }}
[[listeners.routes]]
name = "limited"
path = "/l/**"
respond = {{ status = 200, body = "l" }}
rate_limit = {{ rate = 0.01, burst = 1 }}
[[listeners.routes]]
name = "plain"
respond = {{ status = 200, body = "plain" }}
[upstreams.q]
servers = ["{}"]
max_connections_per_server = 1
queue = 1
queue_timeout = "100ms"
[upstreams.r]
servers = ["{}", "{}"]
"#,
        held.addr,
        closed_port(),
        live.addr
    );
    let p: Running = start(portico_config::parse(&toml, "t.toml").unwrap(), 2).unwrap();
    let addr = p.addr("p").unwrap();
    let stats = p.stats().clone();
    let get = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").into_bytes();

    // Queue: one request holds the only slot, one waits and times out, one finds the queue full.
    let mut a = Client::connect(addr).unwrap();
    a.send(&get("/q/a")).unwrap();
    assert!(hold.wait_held(1), "the first request reaches the server");
    let mut b = Client::connect(addr).unwrap();
    b.send(&get("/q/b")).unwrap();
    eventually("the second request waits", || {
        p.control().snapshot().group_stats[0].queue.waiting() == 1
    });
    let full = Client::connect(addr)
        .unwrap()
        .request(&get("/q/c"))
        .unwrap();
    assert_eq!(full.status, 503);
    assert_eq!(b.read_response(false).unwrap().status, 503);
    hold.open();
    assert_eq!(a.read_response(false).unwrap().status, 200);

    // Retries: round robin over a closed port and a live server; every request succeeds, the
    // ones that tried the closed port first were retried.
    let mut c = Client::connect(addr).unwrap();
    for _ in 0..4 {
        assert_eq!(c.request(&get("/r/x")).unwrap().status, 200);
    }
    let retries = stats.retries.load(Ordering::Relaxed);
    assert!(retries >= 1, "no retry happened");

    // Rate limit: one token, then 429.
    assert_eq!(c.request(&get("/l/1")).unwrap().status, 200);
    assert_eq!(c.request(&get("/l/2")).unwrap().status, 429);

    // Shedding: saturate the workers until one sheds, then one request gets the fast 503.
    p.control()
        .simulate_saturation(Some(Duration::from_millis(25)));
    eventually("a worker sheds", || {
        stats.shedding.load(Ordering::Relaxed) >= 1
    });
    let mut shed = 0;
    let end = Instant::now() + Duration::from_secs(10);
    while shed == 0 {
        assert!(Instant::now() < end, "no request was shed");
        // Two workers: a connection may land on the one not shedding yet.
        let r = Client::connect(addr).unwrap().request(&get("/")).unwrap();
        if r.status == 503 {
            shed += 1;
        }
    }
    p.control().simulate_saturation(None);
    eventually("shedding stops", || {
        stats.shedding.load(Ordering::Relaxed) == 0
    });

    let dom = dump_dom(&format!("http://{}/", p.admin_addr().unwrap()), 2500);
    assert!(
        updates(&dom) >= 2,
        "the page polled fewer than twice:\n{dom}"
    );
    let total = |attr: &str| last_numbers(&row_text(&dom, attr), 1)[0];
    assert_eq!(total("data-counter=\"retries\""), retries);
    assert_eq!(total("data-counter=\"rate_limited\""), 1);
    assert_eq!(
        total("data-counter=\"requests_shed\""),
        stats.requests_shed.load(Ordering::Relaxed)
    );
    assert!(total("data-counter=\"requests_shed\"") >= 1);
    assert_eq!(total("data-counter=\"shedding\""), 0);
    let shed_row = row_text(&dom, "data-counter=\"shedding\"");
    assert!(shed_row.contains("with shed: p)"), "{shed_row}");
    // Group q: size 1, 100 ms, nobody waiting; queued 1 (it timed out), full 1, timeouts 1.
    let queue = row_text(&dom, "data-queue=\"q\"");
    assert!(queue.starts_with("q 1 100.0 ms 0 "), "{queue}");
    assert_eq!(last_numbers(&queue, 3), [1, 1, 1], "{queue}");
    assert!(
        !dom.contains("data-queue=\"r\""),
        "a group without a queue is listed"
    );
    // Routes with policies: retries and 429 totals (retries, budget refused, 429).
    let retried = row_text(&dom, "data-policy=\"p/retried\"");
    assert!(retried.contains("retry"), "{retried}");
    assert_eq!(last_numbers(&retried, 3), [retries, 0, 0], "{retried}");
    let limited = row_text(&dom, "data-policy=\"p/limited\"");
    assert!(limited.contains("rate_limit"), "{limited}");
    assert_eq!(last_numbers(&limited, 3), [0, 0, 1], "{limited}");
    assert!(
        !dom.contains("data-policy=\"p/plain\""),
        "a route without policies is listed"
    );
}

#[test]
#[ignore = "needs chromium; scripts/test.sh runs it"]
fn dashboard_shows_the_response_cache() {
    let up = TestUpstream::start(|_| Reply::Respond {
        status: 200,
        headers: vec![("Cache-Control".into(), "max-age=60".into())],
        body: b"cached".to_vec(),
        chunked: false,
    });
    let toml = format!(
        r#"
[admin]
address = "127.0.0.1:0"
[[listeners]]
name = "p"
address = "127.0.0.1:0"
[[listeners.routes]]
proxy = "b"
cache = {{}}
[upstreams.b]
servers = ["{}"]
"#,
        up.addr
    );
    let p = start(portico_config::parse(&toml, "t.toml").unwrap(), 1).unwrap();
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    for _ in 0..3 {
        let r = c
            .request(b"GET /page HTTP/1.1\r\nHost: a.test\r\n\r\n")
            .unwrap();
        assert_eq!(r.text(), "cached");
    }
    let dom = dump_dom(&format!("http://{}/", p.admin_addr().unwrap()), 3000);
    // One miss then two hits: 2 of 3 answered from the cache.
    let total = |attr: &str| last_numbers(&row_text(&dom, attr), 1)[0];
    assert_eq!(total("data-cache=\"hit\""), 2);
    assert_eq!(total("data-cache=\"miss\""), 1);
    assert_eq!(total("data-cache=\"stored\""), 1);
    assert!(dom.contains("66.7%"), "hit ratio missing:\n{dom}");
}

#[test]
#[ignore = "needs chromium; scripts/test.sh runs it"]
fn dashboard_shows_the_fleet() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = portico_testkit::etcd::Etcd::start(dir.path());
    // an instance that stopped following, at an old revision
    etcd.put(
        "/fleet/config/status/ghost",
        r#"{"instance":"ghost","version":"0.1.0","revision":1,"ok":true,"requests":7,"uptime_seconds":90}"#,
        None,
    );
    let two = crate::etcd_fleet::fleet_of_two(&etcd, dir.path());
    let admin = two[1].admin_addr().unwrap();
    // b reads the fleet after it wrote its own status, a's already there
    eventually("b to see the whole fleet", || {
        status_json(admin)["fleet"]["instances"] == 3
    });
    let dom = dump_dom(&format!("http://{admin}/"), 2500);
    let ghost = row_text(&dom, "data-instance=\"ghost\"");
    assert_eq!(ghost, "ghost ? - 0.1.0 1 behind 0/0 - 7 1m 30s", "{ghost}");
    let b = row_text(&dom, "data-instance=\"b\"");
    let listener = two[1].addr("p").unwrap();
    assert!(b.starts_with("b "), "{b}");
    assert!(
        b.contains(&format!(" {listener} {} ", env!("CARGO_PKG_VERSION"))),
        "{b}"
    );
    assert!(b.contains(" current 2/2 "), "{b}");
    assert!(dom.contains(&etcd.url("/fleet/config")), "the key is shown");
    let skew = dom.split("id=\"fleet-skew\"").nth(1).unwrap_or("");
    assert!(
        skew.starts_with(" class=\"err\">1<"),
        "one instance not current: {skew:.40}"
    );
}

fn status_json(admin: SocketAddr) -> serde_json::Value {
    let mut a = std::net::TcpStream::connect(admin).unwrap();
    std::io::Write::write_all(
        &mut a,
        b"GET /api/status HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut a, &mut answer).unwrap();
    serde_json::from_str(answer.split_once("\r\n\r\n").unwrap().1).unwrap()
}
