//! The `portico` binary under log pressure: a PING ACK flood is cut and logs nothing per frame, an IP address as TLS server name logs nothing per handshake, and a log output nobody reads never stalls a listener.

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{announced, BIN};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const EMPTY_SETTINGS: [u8; 9] = [0, 0, 0, 4, 0, 0, 0, 0, 0];
/// A PING frame with the ACK flag that nobody asked for.
const PING_ACK: [u8; 17] = [0, 0, 8, 6, 1, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];

/// A proxy on its own config file with an admin listener and a local origin route (over TLS
/// when `tls`, with a fresh self-signed certificate), logging with `RUST_LOG` (the default
/// filter when None) to a pipe nobody reads until [`stop`]; the child and the addresses of its
/// listener and its admin listener.
fn start(name: &str, rust_log: Option<&str>, tls: bool) -> (Child, SocketAddr, SocketAddr) {
    let dir = std::env::temp_dir().join(format!("portico-logging-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut listener_tls = String::new();
    if tls {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(dir.join("c.pem"), cert.pem()).unwrap();
        std::fs::write(dir.join("c.key"), key.serialize_pem()).unwrap();
        listener_tls =
            "[listeners.tls]\ncertificates = [{ cert = \"c.pem\", key = \"c.key\" }]\n".into();
    }
    let cfg = dir.join("portico.toml");
    std::fs::write(
        &cfg,
        format!("workers = 2\n[admin]\naddress = \"127.0.0.1:0\"\n[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n{listener_tls}[[listeners.routes]]\norigin = true\n"),
    )
    .unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["run", "--config"])
        .arg(&cfg)
        .env_remove("RUST_LOG");
    if let Some(filter) = rust_log {
        cmd.env("RUST_LOG", filter);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn portico");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let addrs = announced(&mut out, 2);
    // Keep stdout open (and drained) so the proxy never sees it closed.
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut out, &mut std::io::sink());
    });
    (child, addrs[0], addrs[1])
}

/// Send the preface, empty SETTINGS and `n` unsolicited PING ACKs (what the peer takes of
/// them: the connection may close midway), then read frames until a GOAWAY; its error code,
/// or None if the connection ended without one.
fn ping_ack_flood(addr: SocketAddr, n: usize) -> Option<u32> {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut wire = PREFACE.to_vec();
    wire.extend_from_slice(&EMPTY_SETTINGS);
    for _ in 0..n {
        wire.extend_from_slice(&PING_ACK);
    }
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = w.write_all(&wire);
    });
    let mut r = BufReader::new(s);
    let code = loop {
        let mut head = [0u8; 9];
        if r.read_exact(&mut head).is_err() {
            break None;
        }
        let len = (head[0] as usize) << 16 | (head[1] as usize) << 8 | head[2] as usize;
        let mut payload = vec![0u8; len];
        if r.read_exact(&mut payload).is_err() {
            break None;
        }
        if head[3] == 7 {
            break Some(u32::from_be_bytes(payload[4..8].try_into().unwrap()));
        }
    };
    drop(r);
    let _ = writer.join();
    code
}

fn get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// The value of an unlabelled or labelled sample line in a Prometheus text page.
fn metric(page: &str, sample: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no sample {sample}"))
}

fn stop(mut child: Child) -> String {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let _ = child.wait();
    err
}

#[test]
fn a_ping_ack_flood_is_cut_with_enhance_your_calm_and_logs_no_line_per_frame() {
    let (child, addr, admin) = start("flood", None, false);
    let mut floods = Vec::new();
    for _ in 0..3 {
        floods.push(std::thread::spawn(move || ping_ack_flood(addr, 100_000)));
    }
    for f in floods {
        // 0xb: ENHANCE_YOUR_CALM.
        assert_eq!(f.join().unwrap(), Some(0xb));
    }
    let page = get(admin, "/metrics").unwrap();
    assert_eq!(metric(&page, "portico_h2_ping_floods_total"), 3.0);
    assert!(get(addr, "/bytes/10").unwrap().starts_with("HTTP/1.1 200"));
    let err = stop(child);
    assert!(
        !err.contains("PING ack"),
        "the h2 crate's per-frame warning leaked:\n{err}"
    );
    // A few lines: start, one per flood (rate-limited), stop.
    assert!(err.lines().count() < 20, "{err}");
    assert_eq!(err.matches("PING ACK flood").count(), 3, "{err}");
}

#[test]
fn a_log_output_nobody_reads_costs_lines_not_service() {
    // The h2 crate's trace lines (about 1 KB per frame read): a flood connection writes far
    // more than a pipe holds (64 KiB) and the log's buffer, and this test never reads the pipe.
    let (child, addr, admin) = start("unread", Some("info,h2=trace"), false);
    let started = Instant::now();
    let mut floods = 0;
    let dropped = loop {
        assert_eq!(ping_ack_flood(addr, 1_000), Some(0xb));
        floods += 1;
        // The listener answers at once throughout, as does the admin listener.
        let t = Instant::now();
        let answer = get(addr, "/bytes/100").expect("a request stalled");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        let page = get(admin, "/metrics").expect("the admin listener");
        let dropped = metric(&page, "portico_log_lines_dropped_total{log=\"error\"}");
        if dropped > 0.0 {
            break dropped;
        }
        assert!(
            floods < 500 && started.elapsed() < Duration::from_secs(60),
            "no line dropped after {floods} floods: is the output read after all?"
        );
    };
    // Well past the point where a blocking write would have stalled every worker.
    for _ in 0..20 {
        assert_eq!(ping_ack_flood(addr, 1_000), Some(0xb));
        assert!(get(addr, "/bytes/10").unwrap().starts_with("HTTP/1.1 200"));
    }
    let page = get(admin, "/metrics").unwrap();
    assert!(metric(&page, "portico_log_lines_dropped_total{log=\"error\"}") > dropped);
    // Reading the pipe now lets the log thread write again: it says what it dropped.
    let err = stop(child);
    assert!(
        err.contains("lines dropped"),
        "{}",
        &err[err.len().saturating_sub(2000)..]
    );
}

/// A TLS 1.3 ClientHello record (X25519, TLS_AES_128_GCM_SHA256) whose server_name is `sni`
/// as a host_name, whatever it is: OpenSSL clients such as wrk send an IP address there.
fn client_hello(sni: &str) -> Vec<u8> {
    fn ext(out: &mut Vec<u8>, kind: u16, data: &[u8]) {
        out.extend_from_slice(&kind.to_be_bytes());
        out.extend_from_slice(&(data.len() as u16).to_be_bytes());
        out.extend_from_slice(data);
    }
    let name = sni.as_bytes();
    let mut server_name = ((name.len() + 3) as u16).to_be_bytes().to_vec();
    server_name.push(0);
    server_name.extend_from_slice(&(name.len() as u16).to_be_bytes());
    server_name.extend_from_slice(name);
    let mut key_share = vec![0, 36, 0, 0x1d, 0, 32];
    key_share.extend_from_slice(&[9; 32]);
    let mut exts = Vec::new();
    ext(&mut exts, 0, &server_name);
    ext(&mut exts, 43, &[2, 3, 4]);
    ext(&mut exts, 10, &[0, 2, 0, 0x1d]);
    ext(&mut exts, 51, &key_share);
    ext(&mut exts, 13, &[0, 6, 4, 3, 8, 4, 4, 1]);
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7; 32]);
    body.push(32);
    body.extend_from_slice(&[5; 32]);
    body.extend_from_slice(&[0, 2, 0x13, 0x01, 1, 0]);
    body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
    body.extend_from_slice(&exts);
    let mut hs = vec![1, 0];
    hs.extend_from_slice(&(body.len() as u16).to_be_bytes());
    hs.extend_from_slice(&body);
    let mut record = vec![22, 3, 1];
    record.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    record.extend_from_slice(&hs);
    record
}

#[test]
fn handshakes_with_an_ip_address_as_server_name_log_nothing() {
    let (child, addr, _) = start("ip-sni", None, true);
    for _ in 0..50 {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(&client_hello("127.0.0.1")).unwrap();
        // The handshake goes on (a ServerHello record, type 22) with the default certificate.
        let mut first = [0u8; 1];
        s.read_exact(&mut first).unwrap();
        assert_eq!(first[0], 22);
    }
    let err = stop(child);
    assert!(!err.contains("SNI"), "a per-handshake line:\n{err}");
    assert!(err.lines().count() < 10, "{err}");
}

/// Poll `path` until it holds a line containing every one of `needles`; that line.
fn wait_for_line(path: &std::path::Path, needles: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| needles.iter().all(|n| l.contains(n))) {
            return line.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no line with {needles:?} in {}:\n{text}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn post(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn a_json_log_file_beside_the_config_records_state_changes_and_every_reload() {
    let dir = std::env::temp_dir().join(format!("portico-logging-json-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    // A port nobody listens on: the health check fails at once.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let base = format!(
        "workers = 1\n[log]\nformat = \"json\"\npath = \"logs/portico.log\"\n[admin]\naddress = \"127.0.0.1:0\"\n\
         [upstreams.dead]\nservers = [\"{dead}\"]\nhealth_check = {{ type = \"tcp\", interval = \"100ms\", timeout = \"50ms\", fall = 1 }}\n\
         [[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nname = \"gone\"\npath = \"/gone/\"\nproxy = \"dead\"\n[[listeners.routes]]\norigin = true\n"
    );
    let cfg = dir.join("portico.toml");
    std::fs::write(&cfg, &base).unwrap();
    let mut child = Command::new(BIN)
        .args(["run", "--config"])
        .arg(&cfg)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn portico");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let addrs = announced(&mut out, 2);
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut out, &mut std::io::sink());
    });
    let log = dir.join("logs/portico.log");

    // A server going down says which check failed.
    let down = wait_for_line(&log, &["server down", &dead.to_string()]);
    assert!(down.contains("\"level\":\"WARN\""), "{down}");
    assert!(down.contains("\"group\":\"dead\""), "{down}");

    // A reload by signal names who asked and what changed.
    std::fs::write(&cfg, base.replace("name = \"gone\"", "name = \"went\"")).unwrap();
    let _ = Command::new("kill")
        .arg("-HUP")
        .arg(child.id().to_string())
        .status();
    let reloaded = wait_for_line(&log, &["configuration reloaded", "SIGHUP"]);
    assert!(reloaded.contains(r#"route \"went\" added"#), "{reloaded}");
    assert!(reloaded.contains(r#"route \"gone\" removed"#), "{reloaded}");

    // A refused reload through the API: logged with the caller, counted, flagged.
    std::fs::write(&cfg, base.replace("fall = 1", "fall = 0")).unwrap();
    let answer = post(addrs[1], "/api/reload");
    assert!(answer.starts_with("HTTP/1.1 422"), "{answer}");
    let refused = wait_for_line(&log, &["reload refused", "admin API from 127.0.0.1"]);
    assert!(refused.contains("\"level\":\"ERROR\""), "{refused}");
    assert!(refused.contains("fall"), "{refused}");
    let page = get(addrs[1], "/metrics").unwrap();
    assert_eq!(metric(&page, "portico_config_reload_failures_total"), 1.0);
    assert_eq!(metric(&page, "portico_config_last_reload_successful"), 0.0);
    assert_eq!(metric(&page, "portico_config_generation"), 2.0);

    let err = stop(child);
    // Everything went to the file, one JSON object per line with a time and a level.
    assert!(!err.contains("server down"), "{err}");
    let text = std::fs::read_to_string(&log).unwrap();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect(line);
        assert!(
            v["timestamp"].is_string() && v["level"].is_string(),
            "{line}"
        );
    }
    assert!(text.contains("stopped"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_log_level_flag_wins_over_the_file() {
    let dir = std::env::temp_dir().join(format!("portico-logging-flag-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("portico.toml");
    std::fs::write(
        &cfg,
        "[log]\nlevel = \"debug\"\n[[listeners]]\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\norigin = true\n",
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["run", "--log-level", "warn", "--config"])
        .arg(&cfg)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn portico");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let addr = announced(&mut out, 1)[0];
    assert!(get(addr, "/bytes/10").unwrap().starts_with("HTTP/1.1 200"));
    let err = stop(child);
    assert!(!err.contains("INFO") && !err.contains("DEBUG"), "{err}");
    // Without the flag the file's level applies: the start line is info.
    let mut child = Command::new(BIN)
        .args(["run", "--config"])
        .arg(&cfg)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn portico");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    announced(&mut out, 1);
    let err = stop(child);
    assert!(err.contains("INFO") && err.contains("worker(s)"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
