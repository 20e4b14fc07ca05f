//! Runs against scripted servers on 127.0.0.1: corrected percentiles, accounting, output files.

use crate::run;
use portico_bench::report::Accounting;
use portico_bench::{hgrm, Flags, Report};
use portico_testkit::{Reply, TestUpstream};
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

fn flags(addr: SocketAddr, path: &str) -> Flags {
    Flags {
        url: format!("http://{addr}{path}"),
        ..Flags::default()
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Every measured request ends up in exactly one bucket.
fn assert_accounted(a: &Accounting) {
    assert_eq!(
        a.scheduled,
        a.completed + a.errors + a.in_flight + a.unsent,
        "{a:?}"
    );
    assert_eq!(a.sent, a.completed + a.errors + a.in_flight, "{a:?}");
}

#[test]
fn corrected_percentiles_see_the_stall_that_closed_loop_hides() {
    // The server freezes for the first 300 ms of every second (all connections at once, like a GC
    // pause): a request arriving then is answered at the end of the window.
    let start = Instant::now();
    let up = TestUpstream::start(move |_| {
        let phase = start.elapsed().as_micros() % 1_000_000;
        if phase < 300_000 {
            std::thread::sleep(Duration::from_micros((300_000 - phase) as u64));
        }
        Reply::ok("ok")
    });
    let open = run(Flags {
        rate: Some(200.0),
        connections: 4,
        duration: Some(ms(3000)),
        ..flags(up.addr, "/")
    });
    let closed = run(Flags {
        closed: true,
        connections: 1,
        duration: Some(ms(3000)),
        ..flags(up.addr, "/")
    });
    eprintln!("{}\n{}", open.summary(), closed.summary());
    assert_accounted(&open.requests);
    assert_accounted(&closed.requests);
    assert_eq!(open.requests.errors + closed.requests.errors, 0);
    assert!(open.requests.completed >= 500, "{:?}", open.requests);
    let open_p99 = open.latency.at(99.0);
    let closed_p50 = closed.latency.at(50.0);
    let closed_p99 = closed.latency.at(99.0);
    // About 30% of the scheduled requests fall in a stall window: the corrected p99 is close to
    // the 300 ms stall, and the requests that queued behind it are counted as such.
    assert!(open_p99 >= 100.0, "open-loop p99 {open_p99} ms");
    assert!(open.queued > 0);
    // One connection, closed loop: only the request in flight at each stall is slow (a handful of
    // thousands), so even its p99 misses the stall.
    assert!(closed_p50 < 20.0, "closed-loop p50 {closed_p50} ms");
    assert!(closed_p50 * 5.0 < open_p99);
    assert!(
        closed_p99 < open_p99,
        "closed p99 {closed_p99} vs open p99 {open_p99}"
    );
    assert!(closed.requests.completed > 3 * open.requests.completed);
}

#[test]
fn error_statuses_are_completed_requests() {
    let up = TestUpstream::start(|_| Reply::Respond {
        status: 500,
        headers: vec![],
        body: b"boom".to_vec(),
        chunked: true,
    });
    let r = run(Flags {
        rate: Some(200.0),
        connections: 2,
        requests: Some(100),
        ..flags(up.addr, "/err")
    });
    assert_accounted(&r.requests);
    assert_eq!(r.requests.scheduled, 100);
    assert_eq!(r.requests.completed, 100);
    assert_eq!(r.status.get("500"), Some(&100));
    assert_eq!(r.status_classes.get("5xx"), Some(&100));
    assert!(r.warnings.iter().any(|w| w.contains("non-2xx")));
}

#[test]
fn closed_connections_are_errors_and_accounted_for() {
    let up = TestUpstream::start(|_| Reply::Close);
    let open = run(Flags {
        rate: Some(200.0),
        connections: 3,
        requests: Some(100),
        ..flags(up.addr, "/")
    });
    assert_accounted(&open.requests);
    assert_eq!(open.requests.scheduled, 100);
    assert_eq!(open.requests.errors, 100);
    assert_eq!(open.errors.values().sum::<u64>(), 100);
    assert!(open.errors.contains_key("closed") || open.errors.contains_key("reset"));
    let closed = run(Flags {
        closed: true,
        connections: 2,
        requests: Some(50),
        ..flags(up.addr, "/")
    });
    assert_accounted(&closed.requests);
    assert_eq!(closed.requests.scheduled, 50);
    assert_eq!(closed.requests.errors, 50);
}

#[test]
fn refused_connections_are_errors_and_accounted_for() {
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let r = run(Flags {
        rate: Some(100.0),
        connections: 2,
        requests: Some(30),
        ..flags(addr, "/")
    });
    assert_accounted(&r.requests);
    assert_eq!(r.requests.scheduled, 30);
    assert_eq!(r.errors.get("connect_refused"), Some(&30));
}

#[test]
fn unfinished_and_unsent_requests_are_accounted_for() {
    // Every response takes 2 s, longer than the run and its 1 s drain (the timeout is longer
    // still): the first request of each connection is still in flight at the end and the rest
    // are never sent.
    let up = TestUpstream::start(|_| Reply::Stall(Duration::from_secs(2)));
    let r = run(Flags {
        rate: Some(40.0),
        connections: 2,
        duration: Some(ms(500)),
        timeout: ms(1600),
        ..flags(up.addr, "/")
    });
    assert_accounted(&r.requests);
    assert_eq!(r.requests.scheduled, 20);
    assert_eq!(r.requests.in_flight, 2);
    assert_eq!(r.requests.unsent, 18);
    assert!(r.warnings.iter().any(|w| w.contains("never sent")));
    assert!(r.warnings.iter().any(|w| w.contains("in flight")));
}

#[test]
fn timeouts_are_errors() {
    let up = TestUpstream::start(|_| Reply::Stall(Duration::from_millis(400)));
    let r = run(Flags {
        closed: true,
        connections: 1,
        requests: Some(2),
        timeout: ms(100),
        ..flags(up.addr, "/")
    });
    assert_accounted(&r.requests);
    assert_eq!(r.errors.get("timeout"), Some(&2));
}

#[test]
fn requests_carry_method_headers_and_body() {
    let up = TestUpstream::start(|_| Reply::ok("fine"));
    let dir = std::env::temp_dir().join(format!("portico-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let body = dir.join("body.json");
    std::fs::write(&body, b"{\"a\":1}").unwrap();
    let r = run(Flags {
        closed: true,
        connections: 3,
        requests: Some(31),
        method: "POST".into(),
        headers: vec![
            "X-Test: yes".into(),
            "Content-Type: application/json".into(),
        ],
        body: Some(format!("@{}", body.display())),
        ..flags(up.addr, "/submit?x=1")
    });
    assert_accounted(&r.requests);
    assert_eq!(r.requests.completed, 31);
    assert_eq!(r.status.get("200"), Some(&31));
    let seen = up.requests();
    assert_eq!(seen.len(), 31);
    for req in &seen {
        assert_eq!(req.method, "POST");
        assert_eq!(req.target, "/submit?x=1");
        assert_eq!(req.header("x-test"), Some("yes"));
        assert_eq!(req.header("host"), Some(format!("{}", up.addr).as_str()));
        assert_eq!(req.body, b"{\"a\":1}");
    }
    // Keep-alive: one connection per bench connection.
    assert_eq!(up.connection_count(), 3);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn close_mode_opens_a_connection_per_request() {
    let up = TestUpstream::start(|_| Reply::ok("x"));
    let r = run(Flags {
        rate: Some(200.0),
        connections: 2,
        requests: Some(40),
        close: true,
        ..flags(up.addr, "/")
    });
    assert_accounted(&r.requests);
    assert_eq!(r.requests.completed, 40);
    assert!(!r.keep_alive);
    assert_eq!(up.connection_count(), 40);
    assert!(up
        .requests()
        .iter()
        .all(|q| q.header("connection") == Some("close")));
}

#[test]
fn warmup_is_excluded_and_files_are_written() {
    let up = TestUpstream::start(|_| Reply::ok("hello"));
    let dir = std::env::temp_dir().join(format!("portico-bench-out-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (json, hg) = (dir.join("r.json"), dir.join("r.hgrm"));
    let f = Flags {
        rate: Some(500.0),
        connections: 5,
        threads: 2,
        warmup: ms(400),
        requests: Some(500),
        json: Some(json.clone()),
        hgrm: Some(hg.clone()),
        pids: vec![std::process::id()],
        ..flags(up.addr, "/")
    };
    let mut out = Vec::new();
    let r = portico_bench::execute(&f, &mut out, None)
        .unwrap()
        .into_run()
        .unwrap();
    assert_accounted(&r.requests);
    // 0.4 s of warm-up at 500/s (200 slots), then 500 measured requests.
    assert_eq!(r.requests.scheduled, 500);
    assert_eq!(r.requests.completed, 500);
    assert_eq!(r.warmup.completed, 200);
    assert_eq!(up.requests().len(), 700);
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("warm-up 0.40 s excluded"), "{text}");
    assert!(text.contains("500-request test"), "{text}");
    assert!(text.contains("99.9999%"), "{text}");
    assert!(text.contains("coordinated omission corrected"), "{text}");
    assert!(r.cpu.is_some() && r.generator_cpu.is_some());

    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["requests"]["completed"], 500);
    assert_eq!(v["mode"], "open");
    assert_eq!(v["kind"], "run");
    assert_eq!(v["label"], f.url.as_str(), "the label defaults to the URL");
    assert!(v["latency"]["percentiles"]["p95"].is_number());
    let spectrum = v["spectrum"].as_array().unwrap();
    assert!(spectrum.len() > 10);
    assert_eq!(spectrum.last().unwrap()[0], 100.0);
    // The JSON reads back into a report.
    let back: Report = serde_json::from_value(v.clone()).unwrap();
    assert_eq!(back.requests, r.requests);
    assert!(v["latency"]["percentiles"]["p99.9999"].is_number());
    let timeline = v["timeline"].as_array().unwrap();
    assert!(!timeline.is_empty());
    let per_second: u64 = timeline
        .iter()
        .map(|s| s["completed"].as_u64().unwrap())
        .sum();
    assert_eq!(per_second, 500);
    assert!(timeline[0]["p99_ms"].is_number());

    let text = std::fs::read_to_string(&hg).unwrap();
    let h = hgrm::parse(&text).unwrap();
    assert_eq!(h.total_count, 500);
    assert_eq!(h.rows.last().map(|r| r.percentile), Some(1.0));
    for line in text.lines().skip(2).filter(|l| !l.starts_with('#')) {
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cols.len(), 4, "{line}");
        assert!(cols.iter().all(|c| c.parse::<f64>().is_ok()), "{line}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_flags_are_typed_errors() {
    let f = Flags {
        url: "ftp://127.0.0.1/".into(),
        rate: Some(1.0),
        ..Flags::default()
    };
    let e = portico_bench::execute(&f, &mut Vec::new(), None).unwrap_err();
    assert!(e.to_string().contains("https://"), "{e}");
    let f = Flags {
        url: "http://127.0.0.1/".into(),
        rate: Some(1.0),
        insecure: true,
        ..Flags::default()
    };
    let e = portico_bench::execute(&f, &mut Vec::new(), None).unwrap_err();
    assert!(
        e.to_string().contains("--insecure needs an https:// URL"),
        "{e}"
    );
    let f = Flags {
        url: "http://127.0.0.1:1/".into(),
        rate: Some(1.0),
        pids: vec![u32::MAX],
        ..Flags::default()
    };
    assert!(portico_bench::execute(&f, &mut Vec::new(), None).is_err());
}

#[test]
fn a_tiny_sweep_writes_every_step_and_the_knee() {
    let up = TestUpstream::start(|_| Reply::ok("swept"));
    let dir = std::env::temp_dir().join(format!("portico-bench-sweep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("sweep.json");
    let f = Flags {
        sweep: Some("100:200:100".into()),
        duration: Some(ms(1000)),
        connections: 4,
        slo: Some("p99<2s".into()),
        // If the shared machine makes the generator lag (a failed step), one bisection at most.
        bisect: Some(1),
        label: Some("test server".into()),
        pids: vec![std::process::id()],
        json: Some(json.clone()),
        ..flags(up.addr, "/")
    };
    let mut out = Vec::new();
    let s = portico_bench::execute(&f, &mut out, None)
        .unwrap()
        .into_sweep()
        .unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("Sweep @ GET"), "{text}");
    assert!(text.contains("Knee (p99<2s"), "{text}");
    assert!((2..=3).contains(&s.steps.len()), "{}", s.steps.len());

    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["kind"], "sweep");
    assert_eq!(v["label"], "test server");
    assert_eq!(v["rates"], serde_json::json!([100.0, 200.0]));
    assert_eq!(v["slo"]["percentile"], 99.0);
    assert_eq!(v["slo"]["below_ms"], 2000.0);
    let steps = v["steps"].as_array().unwrap();
    assert_eq!(steps[0]["rate"], 100.0);
    assert_eq!(steps[0]["phase"], "sweep");
    assert_eq!(steps[1]["rate"], 200.0);
    for step in steps {
        let runs = step["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 1);
        let run = &runs[0];
        // Each run has the single-run JSON's shape.
        assert_eq!(run["kind"], "run");
        assert_eq!(run["mode"], "open");
        assert_eq!(run["offered_rate"], step["rate"]);
        let r: Report = serde_json::from_value(run.clone()).unwrap();
        assert_accounted(&r.requests);
        assert!(r.requests.completed > 0);
        assert!(r.cpu.is_some(), "CPU sampled per step");
        assert!(step["figures"]["cpu_percent_of_core"].is_number());
        assert!(step["figures"]["p95_ms"].is_number());
        assert!(step["pass"].is_boolean());
        assert_eq!(step["verdicts"].as_array().unwrap().len(), 1);
    }
    assert_eq!(steps[0]["runs"][0]["requests"]["scheduled"], 100);
    assert_eq!(steps[1]["runs"][0]["requests"]["scheduled"], 200);
    // The knee is reported either way: 200 req/s when both steps passed.
    assert!(v["knee"]["note"].is_string());
    if steps.iter().all(|s| s["pass"] == true) {
        assert_eq!(v["knee"]["rate"], 200.0);
    }
    let back: portico_bench::SweepReport = serde_json::from_value(v).unwrap();
    assert_eq!(back.steps.len(), s.steps.len());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn several_urls_are_requested_in_turn_and_counted_apiece() {
    let up = TestUpstream::start(|_| Reply::ok("x"));
    let dir = std::env::temp_dir().join(format!("portico-bench-urls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let list = dir.join("urls.txt");
    std::fs::write(&list, format!("# more\nhttp://{}/c\n\n", up.addr)).unwrap();
    let r = run(Flags {
        more_urls: vec![format!("http://{}/b", up.addr)],
        urls_file: Some(list),
        closed: true,
        connections: 2,
        requests: Some(30),
        warmup: ms(200),
        ..flags(up.addr, "/a")
    });
    assert_accounted(&r.requests);
    assert_eq!(r.requests.completed, 30);
    let per: Vec<(&str, u64)> = r
        .urls
        .iter()
        .map(|u| (u.url.rsplit('/').next().unwrap(), u.completed))
        .collect();
    assert_eq!(per, [("a", 10), ("b", 10), ("c", 10)], "{:?}", r.urls);
    // The server saw all three paths, warm-up requests included.
    let paths: std::collections::BTreeSet<String> =
        up.requests().iter().map(|c| c.target.clone()).collect();
    assert_eq!(paths.into_iter().collect::<Vec<_>>(), ["/a", "/b", "/c"]);
    let s = r.summary();
    assert!(s.contains("3 URLs requested in turn"), "{s}");
    assert!(
        s.contains("warm-up 0.20 s excluded from all results"),
        "{s}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
