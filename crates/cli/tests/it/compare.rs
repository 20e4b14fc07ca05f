//! `portico bench compare` end to end: direct, the relay and portico with very short runs, JSON results, the manifest and the HTML page.

use std::process::Command;

use crate::common::BIN;

#[test]
fn compare_direct_and_portico_writes_results_manifest_and_page() {
    let dir = std::env::temp_dir().join(format!("portico-cli-compare-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // A certificate for the HTTPS scenario (no openssl needed).
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    let cert = params.self_signed(&key).unwrap();
    std::fs::write(dir.join("cert.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), key.serialize_pem()).unwrap();
    let out_dir = dir.join("out");
    // nginx and haproxy live in /usr/sbin: with this PATH they are "not installed", whatever the
    // machine has, so the skip is tested too.
    let out = Command::new(BIN)
        .env("PATH", "/usr/bin:/bin")
        .args([
            "bench",
            "compare",
            "--proxies",
            "direct,relay,portico,nginx",
        ])
        .args([
            "--scenarios",
            "rps-1k,cps,latency,https-cps-resumed,h2-rps-1k",
        ])
        .args([
            "-d", "300ms", "--warmup", "0s", "-c", "4", "--rates", "200,400", "--rounds", "2",
        ])
        .args(["--title", "compare test", "--cert"])
        .arg(dir.join("cert.pem"))
        .arg("--key")
        .arg(dir.join("key.pem"))
        .arg("--out")
        .arg(&out_dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("nginx: skipped"), "{text}");
    assert!(text.contains("round 2/2"), "{text}");
    assert!(
        text.contains("Summary (2 rounds, proxies alternating within each;"),
        "{text}"
    );

    let read = |p: &str| std::fs::read_to_string(out_dir.join(p)).unwrap();
    let m: serde_json::Value = serde_json::from_str(&read("manifest.json")).unwrap();
    assert_eq!(m["kind"], "compare");
    assert!(!m["host"]["kernel"].as_str().unwrap().is_empty());
    assert!(m["command"].as_str().unwrap().contains("bench compare"));
    let proxies = m["proxies"].as_array().unwrap();
    assert_eq!(proxies.len(), 4);
    assert_eq!(m["rounds"], 2);
    // Medians over both rounds of every scenario that ran (portico: 5, direct: 3, the relay:
    // 2, neither HTTPS nor new connections).
    let summary = m["summary"].as_array().unwrap();
    assert_eq!(summary.len(), 10, "{summary:?}");
    for x in summary {
        if x["scenario"] != "latency" || x["rate"].is_object() {
            // A round whose sweep found no knee (a loaded machine) has no latency figure.
            let n = x["rate"]["n"].as_u64().unwrap();
            let want = if x["scenario"] == "latency" {
                1..=2
            } else {
                2..=2
            };
            assert!(want.contains(&n), "{x}");
            assert!(
                x["rate"]["min"].as_f64() <= x["rate"]["max"].as_f64(),
                "{x}"
            );
        }
        assert_eq!(
            x["cpu_us_per_request"].is_object(),
            (x["proxy"] == "portico" || x["proxy"] == "relay") && x["scenario"] != "latency",
            "{x}"
        );
    }
    assert!(proxies[1]["command"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a == "relay"));
    assert!(proxies[2]["config"]
        .as_str()
        .unwrap()
        .contains("[upstreams.b]"));
    assert!(proxies[3]["skipped"]
        .as_str()
        .unwrap()
        .contains("not installed"));
    // direct and portico: every scenario has a parseable result, except HTTPS for direct (the
    // origin is plain HTTP).
    for r in m["results"].as_array().unwrap() {
        let (proxy, scenario) = (
            r["proxy"].as_str().unwrap(),
            r["scenario"].as_str().unwrap(),
        );
        let https = scenario == "https-cps-resumed" || scenario == "h2-rps-1k";
        let expect_result = proxy == "portico"
            || (proxy == "direct" && !https)
            || (proxy == "relay" && !https && scenario != "cps");
        assert_eq!(r["file"].is_string(), expect_result, "{r}");
        if !expect_result {
            assert!(r["skipped"].is_string(), "{r}");
            assert_eq!(r["round"], 1, "a skip is recorded once: {r}");
            continue;
        }
        let round = r["round"].as_u64().unwrap();
        assert!(
            r["file"]
                .as_str()
                .unwrap()
                .ends_with(&format!("-{scenario}-r{round}.json")),
            "{r}"
        );
        let v: serde_json::Value =
            serde_json::from_str(&read(r["file"].as_str().unwrap())).unwrap();
        let kind = v["kind"].as_str().unwrap();
        assert_eq!(
            kind,
            if scenario == "latency" {
                "sweep"
            } else {
                "run"
            },
            "{r}"
        );
        if kind == "run" {
            assert!(v["requests"]["completed"].as_u64().unwrap() > 0, "{v}");
            assert_eq!(v["requests"]["errors"], 0, "{v}");
            // The proxy's CPU was sampled; direct has no proxy.
            assert_eq!(v["cpu"].is_object(), proxy != "direct", "{r}");
        }
        if scenario == "h2-rps-1k" {
            // HTTP/2 over TLS 1.3, 4 connections (-c 4, at most 10) of 100 streams each.
            assert_eq!(v["protocol"], "HTTP/2", "{v}");
            assert_eq!(v["streams"], 100, "{v}");
            assert_eq!(v["tls"]["version"], "TLSv1_3", "{v}");
            assert!(v["command"]
                .as_str()
                .unwrap()
                .contains("--h2 --streams 100 "));
            assert_eq!(v["connections"], 4, "{v}");
        }
        if scenario == "https-cps-resumed" {
            let h = &v["tls"]["handshakes"];
            let (full, resumed) = (h["full"].as_u64().unwrap(), h["resumed"].as_u64().unwrap());
            assert_eq!(full + resumed, v["connections_opened"].as_u64().unwrap());
            assert!(resumed > 0 && full >= 1, "{h}");
            assert_eq!(v["tls"]["group"], "X25519");
        }
    }
    // Portico stopped gracefully (SIGTERM): it logs its counters when it stops.
    assert!(read("logs/portico.log").contains("stopped:"));

    let html = read("index.html");
    assert!(html.contains("<h1>compare test</h1>"));
    for id in [
        "compare-rps",
        "compare-cps",
        "compare-cpu",
        "compare-latency-p99",
        "compare-percentiles",
    ] {
        assert!(html.contains(&format!("<figure id=\"{id}\">")), "{id}");
        let svg = read(&format!("{id}.svg"));
        assert!(html.contains(&svg), "{id} inline");
        // And as a PNG beside it: the signature, an IHDR chunk, a real image.
        let png = std::fs::read(out_dir.join(format!("{id}.png"))).unwrap();
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "{id}.png");
        assert_eq!(&png[12..16], b"IHDR", "{id}.png");
        let width = u32::from_be_bytes([png[16], png[17], png[18], png[19]]);
        assert!(
            width >= 760 && png.len() > 5000,
            "{id}.png: {width} px, {} bytes",
            png.len()
        );
    }
    assert!(html.contains("<b>nginx</b>: skipped"));
    // Portico's own work: its CPU per request above the relay's.
    assert!(html.contains("<h2>Own work above the floor</h2>"), "{html}");
    assert!(text.contains("rps-1k: portico "), "{text}");
    // And at one offered rate, from the latency sweep.
    assert!(
        html.contains("<li>latency sweep at 400 req/s offered to every proxy")
            || html.contains("<li>latency sweep at 200 req/s offered to every proxy"),
        "{html}"
    );
    assert!(html.contains("<h2>Results</h2>") && html.contains("<h2>Manifest</h2>"));
    assert!(html.contains("HTTPS new connection per request, resumed sessions"));
    assert!(html.contains("HTTP/2 over TLS requests/s"));
    // Both proxies are in the rate chart's legend.
    let rps = read("compare-rps.svg");
    assert!(rps.contains(">direct<") && rps.contains(">portico<"));
    assert!(rps.contains(">RPS 1 KB HTTP/2<"), "{rps}");

    // `portico bench report` renders the same page from the manifest.
    let again = dir.join("again");
    let out = Command::new(BIN)
        .args(["bench", "report", "--out"])
        .arg(&again)
        .arg(out_dir.join("manifest.json"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let html2 = std::fs::read_to_string(again.join("index.html")).unwrap();
    assert!(html2.contains("<figure id=\"compare-latency-p99\">"));
    let png = std::fs::read(again.join("compare-rps.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Whether `pid` is a live process (not gone, not a zombie waiting for a reaper).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, t)| !t.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

#[test]
fn an_interrupted_compare_leaves_no_server_behind() {
    use std::io::BufRead;
    let dir = std::env::temp_dir().join(format!("portico-cli-compare-int-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut child = Command::new(BIN)
        .args(["bench", "compare", "--proxies", "portico"])
        .args([
            "--scenarios",
            "rps-1k",
            "-d",
            "60s",
            "--warmup",
            "0s",
            "-c",
            "2",
        ])
        .arg("--out")
        .arg(&dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The origin's and the proxy's pids, from the progress lines.
    let mut pids = Vec::new();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    while pids.len() < 2 {
        let line = lines.next().expect("a progress line").unwrap();
        if let Some(p) = line.rsplit_once("(pid ") {
            pids.push(p.1.trim_end_matches(')').parse::<u32>().unwrap());
        }
    }
    assert!(pids.iter().all(|p| alive(*p)), "{pids:?}");
    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    // Its children got SIGTERM (SIGKILL after 2 s) before it exited.
    for p in &pids {
        assert!(!alive(*p), "pid {p} survived");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
