//! End-to-end tests of the `portico` binary: flags, exit codes, signals, the origin job.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};

use crate::common::{announced, BIN};

fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("portico-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Start `portico ARGS`, wait for its "listener NAME on http://ADDR/" (or https) lines, return them.
fn spawn(args: &[&str], listeners: usize) -> (Child, Vec<SocketAddr>) {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn portico");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let addrs = announced(&mut out, listeners);
    (child, addrs)
}

fn get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn terminate(child: Child) -> (std::process::ExitStatus, String) {
    signal(&child, "TERM");
    terminate_wait(child)
}

/// `portico check --config PATH`: exit code and standard error.
fn check(path: &std::path::Path) -> (Option<i32>, String) {
    let out = Command::new(BIN)
        .args(["check", "--config"])
        .arg(path)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn version_and_help() {
    let out = Command::new(BIN).arg("--version").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("portico "));
    for cmd in ["run", "check", "origin", "bench"] {
        let out = Command::new(BIN).args([cmd, "--help"]).output().unwrap();
        assert!(out.status.success(), "{cmd} --help");
    }
}

#[test]
fn check_explains_the_embedded_default() {
    let out = Command::new(BIN).arg("check").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("127.0.0.1:8080"), "{text}");
    assert!(text.contains("configuration OK"), "{text}");
}

#[test]
fn check_reports_file_line_column_and_key() {
    let d = temp_dir("check");
    let path = d.join("bad.toml");
    std::fs::write(&path, "[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:99999\"\n[[listeners.routes]]\nrespond = { status = 200 }\n").unwrap();
    let (code, err) = check(&path);
    assert_eq!(code, Some(2));
    let want = format!("{}:3:11: listeners[0].address:", path.display());
    assert!(err.contains(&want), "want {want} in {err}");
}

#[test]
fn check_prints_every_validation_error() {
    let d = temp_dir("check-all");
    let path = d.join("bad.toml");
    std::fs::write(
        &path,
        "[[listeners]]\nname = \"a\"\naddress = \"nope\"\n[[listeners.routes]]\nproxy = \"missing\"\n[[listeners]]\nname = \"b\"\naddress = \"127.0.0.1:99999\"\n[[listeners.routes]]\nstatic = \"/x\"\nmax_body = \"lots\"\n",
    )
    .unwrap();
    let (code, err) = check(&path);
    assert_eq!(code, Some(2));
    let lines: Vec<&str> = err.lines().collect();
    let p = path.display();
    let want = [
        format!("error: {p}:3:11: listeners[0].address: "),
        format!("error: {p}:5:9: listeners[0].routes[0].proxy: "),
        format!("error: {p}:8:11: listeners[1].address: "),
        format!("error: {p}:11:12: listeners[1].routes[0].max_body: "),
    ];
    assert_eq!(lines.len(), want.len(), "{err}");
    for (line, want) in lines.iter().zip(&want) {
        assert!(line.starts_with(want.as_str()), "want {want} in {err}");
    }
}

#[test]
fn run_serves_and_stops_gracefully_on_sigterm() {
    let d = temp_dir("run");
    let path = d.join("p.toml");
    std::fs::write(
        &path,
        "[[listeners]]\nname = \"o\"\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\norigin = true\n",
    )
    .unwrap();
    let (child, addrs) = spawn(
        &["run", "--config", path.to_str().unwrap(), "--workers", "1"],
        1,
    );
    let resp = get(addrs[0], "/bytes/10");
    assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "{resp}");
    assert!(resp.ends_with("0123456789"), "{resp}");
    let (status, err) = terminate(child);
    assert!(status.success(), "exit {status:?}: {err}");
    assert!(err.contains("stopped:"), "{err}");
}

#[test]
fn a_second_sigterm_while_draining_exits_at_once() {
    // A server that takes requests and never answers keeps a request in flight.
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let d = temp_dir("second-signal");
    let path = d.join("p.toml");
    std::fs::write(
        &path,
        format!(
            "drain_timeout = \"60s\"\n[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nproxy = \"b\"\n[upstreams.b]\nservers = [\"{}\"]\n",
            server.local_addr().unwrap()
        ),
    )
    .unwrap();
    let (mut child, addrs) = spawn(
        &["run", "--config", path.to_str().unwrap(), "--workers", "1"],
        1,
    );
    let mut client = TcpStream::connect(addrs[0]).unwrap();
    client
        .write_all(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let (upstream, _) = server.accept().unwrap();
    let mut head = BufReader::new(&upstream);
    let mut line = String::new();
    while line != "\r\n" {
        line.clear();
        assert!(head.read_line(&mut line).unwrap() > 0);
    }
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut until = |what: &str| {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(err.read_line(&mut line).unwrap() > 0, "no {what} line");
            if line.contains(what) {
                return;
            }
        }
    };
    signal(&child, "TERM");
    until("shutting down");
    let t = std::time::Instant::now();
    signal(&child, "TERM");
    until("second signal");
    let status = child.wait().unwrap();
    assert!(
        t.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(status.code(), Some(1));
    drop(client);
}

#[test]
fn origin_serves_files_from_root() {
    let d = temp_dir("origin");
    std::fs::write(d.join("hello.txt"), "hello file\n").unwrap();
    let (child, addrs) = spawn(
        &[
            "origin",
            "--root",
            d.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--workers",
            "1",
        ],
        1,
    );
    let resp = get(addrs[0], "/hello.txt");
    assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "{resp}");
    assert!(resp.contains("Content-Type: text/plain"), "{resp}");
    assert!(resp.ends_with("hello file\n"), "{resp}");
    assert!(get(addrs[0], "/../../etc/passwd").starts_with("HTTP/1.1 400"));
    let (status, _) = terminate(child);
    assert!(status.success());
}

#[test]
fn check_reads_tls_files_and_names_the_missing_one() {
    let d = temp_dir("check-tls");
    let path = d.join("tls.toml");
    std::fs::write(
        &path,
        "[[listeners]]\nname = \"s\"\naddress = \"127.0.0.1:0\"\n[listeners.tls]\ncertificates = [{ cert = \"missing.pem\", key = \"missing.key\" }]\n[[listeners.routes]]\nrespond = { status = 200 }\n",
    )
    .unwrap();
    let (code, err) = check(&path);
    assert_eq!(code, Some(2));
    // Relative paths resolve against the configuration file's directory.
    let want = format!("listener s: TLS: {}", d.join("missing.pem").display());
    assert!(err.contains(&want), "want {want} in {err}");
}

#[test]
fn check_reads_upstream_tls_files_and_warns_about_unverified_groups() {
    let d = temp_dir("check-upstream-tls");
    let path = d.join("up.toml");
    let base = "[[listeners]]\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nproxy = \"a\"\n[upstreams.a]\nservers = [\"127.0.0.1:9443\"]\n[upstreams.a.tls]\n";
    std::fs::write(&path, format!("{base}ca_file = \"missing-ca.pem\"\n")).unwrap();
    let (code, err) = check(&path);
    assert_eq!(code, Some(2));
    let want = format!("upstream a: TLS: {}", d.join("missing-ca.pem").display());
    assert!(err.contains(&want), "want {want} in {err}");
    std::fs::write(&path, format!("{base}verify = false\n")).unwrap();
    let (code, err) = check(&path);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("warning: upstream a: TLS: verify = false"),
        "{err}"
    );
}

#[test]
fn check_warns_about_a_route_an_earlier_one_shadows_and_passes() {
    let d = temp_dir("check-shadow");
    let path = d.join("shadow.toml");
    std::fs::write(
        &path,
        "[[listeners]]\nname = \"web\"\naddress = \"127.0.0.1:0\"\n\
         [[listeners.routes]]\nname = \"all\"\npath = \"/**\"\nrespond = { status = 200 }\n\
         [[listeners.routes]]\nname = \"api\"\npath = \"/api/**\"\nrespond = { status = 201 }\n",
    )
    .unwrap();
    let (code, err) = check(&path);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("warning: listener \"web\": route \"api\" is never reached: route \"all\" before it matches every request it matches"),
        "{err}"
    );
}

fn signal(child: &Child, sig: &str) {
    let st = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(st.success());
}

#[test]
fn sighup_reloads_and_refuses_an_invalid_file() {
    let d = temp_dir("hup");
    let path = d.join("p.toml");
    let cfg = |body: &str| {
        format!("[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nrespond = {{ status = 200, body = \"{body}\" }}\n")
    };
    std::fs::write(&path, cfg("one")).unwrap();
    let (child, addrs) = spawn(
        &["run", "--config", path.to_str().unwrap(), "--workers", "2"],
        1,
    );
    assert!(get(addrs[0], "/").ends_with("one"));
    std::fs::write(&path, cfg("two")).unwrap();
    signal(&child, "HUP");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !get(addrs[0], "/").ends_with("two") {
        assert!(std::time::Instant::now() < deadline, "reload not applied");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // An invalid file is refused with its location; the running configuration stays.
    std::fs::write(&path, "[[listeners]]\nname = 5\n").unwrap();
    signal(&child, "HUP");
    let (status, err) = terminate(child);
    assert!(status.success(), "exit {status:?}: {err}");
    assert!(err.contains("reload refused"), "{err}");
    assert!(err.contains(&format!("{}:2:8", path.display())), "{err}");
}

#[test]
fn bench_sweeps_the_origin_and_reports_it() {
    let (origin, addrs) = spawn(&["origin", "--listen", "127.0.0.1:0", "--workers", "1"], 1);
    let dir = temp_dir("bench-report");
    let json = dir.join("sweep.json");
    let url = format!("http://{}/bytes/100", addrs[0]);
    let pid = origin.id().to_string();
    let out = Command::new(BIN)
        .args(["bench", "--sweep", "100,200", "-d", "1s", "-c", "2"])
        .args(["--slo", "p99<1s", "--bisect", "1", "--label", "the origin"])
        .args(["--pid", &pid, "--json"])
        .arg(&json)
        .arg(&url)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("Knee (p99<1s"), "{text}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let command = v["command"].as_str().unwrap();
    assert!(
        command.starts_with("portico bench --sweep 100,200 -d 1s -c 2 --slo 'p99<1s'"),
        "{command}"
    );
    assert!(command.contains("--label 'the origin'"), "{command}");

    let site = dir.join("site");
    let out = Command::new(BIN)
        .args(["bench", "report", "--title", "Origin sweep", "--out"])
        .arg(&site)
        .arg(&json)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let html = std::fs::read_to_string(site.join("index.html")).unwrap();
    assert!(html.contains("<h1>Origin sweep</h1>"));
    assert!(html.contains("the origin @ "));
    for svg in [
        "latency-p95.svg",
        "percentiles.svg",
        "cpu-percent.svg",
        "throughput.svg",
    ] {
        let s = std::fs::read_to_string(site.join(svg)).unwrap();
        assert!(html.contains(&s), "{svg} inline");
    }

    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{\"kind\": \"sweep\", \"steps\": 3}").unwrap();
    let out = Command::new(BIN)
        .args(["bench", "report", "--out"])
        .arg(&site)
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.json: not a sweep result"), "{err}");
    let (status, _) = terminate(origin);
    assert!(status.success());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_warns_about_an_expired_certificate_and_passes() {
    let d = temp_dir("check-expired");
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["old.test".to_string()]).unwrap();
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2021, 1, 1);
    let cert = params.self_signed(&key).unwrap();
    std::fs::write(d.join("old.pem"), cert.pem()).unwrap();
    std::fs::write(d.join("old.key"), key.serialize_pem()).unwrap();
    let path = d.join("tls.toml");
    std::fs::write(
        &path,
        "[[listeners]]\nname = \"s\"\naddress = \"127.0.0.1:0\"\n[listeners.tls]\ncertificates = [{ cert = \"old.pem\", key = \"old.key\" }]\n[[listeners.routes]]\nrespond = { status = 200 }\n",
    )
    .unwrap();
    let (code, err) = check(&path);
    assert_eq!(code, Some(0), "{err}");
    let want = format!(
        "warning: listener s: TLS: {}: certificate (CN=rcgen self signed cert) expired on 2021-01-01 00:00:00 UTC",
        d.join("old.pem").display()
    );
    assert!(err.contains(&want), "want {want} in {err}");
}

#[test]
fn run_announces_tls_listeners_as_https() {
    let d = temp_dir("banner");
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    std::fs::write(d.join("c.pem"), cert.pem()).unwrap();
    std::fs::write(d.join("c.key"), key.serialize_pem()).unwrap();
    let path = d.join("p.toml");
    std::fs::write(
        &path,
        "[[listeners]]\nname = \"s\"\naddress = \"127.0.0.1:0\"\n[listeners.tls]\ncertificates = [{ cert = \"c.pem\", key = \"c.key\" }]\n[[listeners.routes]]\nrespond = { status = 200 }\n\n[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nrespond = { status = 200 }\n",
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["run", "--config", path.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut lines = Vec::new();
    for _ in 0..2 {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        lines.push(line);
    }
    let (status, err) = terminate(child);
    assert!(status.success(), "{err}");
    assert!(
        lines[0].starts_with("portico: listener s on https://127.0.0.1:"),
        "{lines:?}"
    );
    assert!(
        lines[1].starts_with("portico: listener p on http://127.0.0.1:"),
        "{lines:?}"
    );
}

#[test]
fn a_stopping_proxy_refuses_new_connections_while_it_drains() {
    let d = temp_dir("refuse");
    let path = d.join("p.toml");
    std::fs::write(
        &path,
        "[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\norigin = true\n",
    )
    .unwrap();
    let (child, addrs) = spawn(
        &["run", "--config", path.to_str().unwrap(), "--workers", "2"],
        1,
    );
    // A request in flight keeps the process draining for a while.
    let mut slow = TcpStream::connect(addrs[0]).unwrap();
    write!(
        slow,
        "GET /?delay=1500ms HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    signal(&child, "TERM");
    // The port closes at once: a new client is refused, not left hanging in a backlog nobody
    // accepts from.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    loop {
        match TcpStream::connect(addrs[0]) {
            Err(e) => {
                assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
                break;
            }
            Ok(_) => assert!(
                std::time::Instant::now() < deadline,
                "still accepting connections while draining"
            ),
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut answer = String::new();
    slow.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let (status, _) = terminate_wait(child);
    assert!(status.success());
}

/// Wait for a child already signalled; its exit status and standard error.
fn terminate_wait(mut child: Child) -> (std::process::ExitStatus, String) {
    let status = child.wait().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status, err)
}
