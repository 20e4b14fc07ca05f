//! Configuration from etcd against a real etcd server: three instances follow one key, a change applies everywhere under load without a failed request, an invalid document is refused and reported under each instance's status key, and an instance starts from its cached copy while etcd is down.

use crate::common::{announced, BIN};
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(20);

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An etcd server on loopback ports, killed when dropped.
struct Etcd {
    client: u16,
    child: Option<Child>,
    dir: std::path::PathBuf,
}

impl Etcd {
    fn start(dir: &std::path::Path) -> Etcd {
        let mut e = Etcd {
            client: free_port(),
            child: None,
            dir: dir.to_path_buf(),
        };
        e.restart();
        e
    }

    fn restart(&mut self) {
        let peer = free_port();
        let c = format!("http://127.0.0.1:{}", self.client);
        let p = format!("http://127.0.0.1:{peer}");
        let log = std::fs::File::create(self.dir.join("etcd.log")).unwrap();
        let child = Command::new("etcd")
            .args(["--data-dir", &self.dir.join("data").display().to_string()])
            .args(["--listen-client-urls", &c, "--advertise-client-urls", &c])
            .args([
                "--listen-peer-urls",
                &p,
                "--initial-advertise-peer-urls",
                &p,
            ])
            .args(["--initial-cluster", &format!("default={p}")])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd (Debian package etcd-server; scripts/test.sh installs it)");
        self.child = Some(child);
        wait_for("etcd to answer", || {
            post(self.client, "/v3/kv/range", r#"{"key":"AA=="}"#)
                .filter(|a| a.starts_with("HTTP/1.1 200"))
                .map(|_| ())
        });
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn url(&self) -> String {
        format!("etcd://127.0.0.1:{}/portico/config", self.client)
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One POST to etcd's JSON API: the whole answer, or None when it cannot be reached.
fn post(port: u16, path: &str, body: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: etcd\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

fn wait_for<V>(what: &str, mut f: impl FnMut() -> Option<V>) -> V {
    let deadline = Instant::now() + T;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn document(body: &str) -> String {
    format!(
        "[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nrespond = {{ status = 200, body = \"{body}\" }}\n"
    )
}

fn push(dir: &std::path::Path, url: &str, text: &str) -> std::process::Output {
    let file = dir.join("push.toml");
    std::fs::write(&file, text).unwrap();
    Command::new(BIN)
        .args(["config", "push", &file.display().to_string(), "--to", url])
        .output()
        .unwrap()
}

/// A child process killed when dropped (a failed assertion leaves none behind).
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `portico run --config-source` instance and its listener.
fn instance(dir: &std::path::Path, url: &str, name: &str) -> (Proc, SocketAddr) {
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    let cache = dir.join(format!("{name}.cache.toml"));
    let mut child = Command::new(BIN)
        .args(["run", "--config-source", url, "-w", "1"])
        .args(["--config-cache", &cache.display().to_string()])
        .args(["--config-poll", "100ms", "--instance", name])
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let addr = announced(&mut out, 1)[0];
    // the rest of standard output is not read: nothing more is written there
    (Proc(child), addr)
}

/// The body of `GET /` on a new connection.
fn body(addr: SocketAddr) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.starts_with("HTTP/1.1 200")
        .then(|| out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()))
        .flatten()
}

#[test]
fn instances_follow_one_key_refuse_a_bad_document_and_start_from_their_cache() {
    let dir = std::env::temp_dir().join(format!("portico-etcd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut etcd = Etcd::start(&dir);
    let url = etcd.url();
    let out = push(&dir, &url, &document("one"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // an invalid file is refused before it is written
    let out = push(&dir, &url, "listeners = 5\n");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("push.toml:1:13: listeners"));

    let mut fleet: Vec<(Proc, SocketAddr)> = (1..=3)
        .map(|i| instance(&dir, &url, &format!("i{i}")))
        .collect();
    let addrs: Vec<SocketAddr> = fleet.iter().map(|f| f.1).collect();
    for &a in &addrs {
        assert_eq!(body(a).as_deref(), Some("one"));
    }

    // Requests all along, on one keep-alive connection per instance; the change is written
    // while they run.
    let stop = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let drivers: Vec<_> = addrs
        .iter()
        .map(|&a| {
            let (stop, failed, done) = (stop.clone(), failed.clone(), done.clone());
            std::thread::spawn(move || {
                let mut c = portico_testkit::Client::connect(a).unwrap();
                while !stop.load(Ordering::SeqCst) {
                    match c.request(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n") {
                        Ok(r) if r.status == 200 => done.fetch_add(1, Ordering::SeqCst),
                        _ => {
                            failed.fetch_add(1, Ordering::SeqCst);
                            match portico_testkit::Client::connect(a) {
                                Ok(n) => c = n,
                                Err(_) => std::thread::sleep(Duration::from_millis(10)),
                            }
                            0
                        }
                    };
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let written = Instant::now();
    let out = push(&dir, &url, &document("two"));
    assert!(out.status.success());
    let mut applied = Vec::new();
    for &a in &addrs {
        let deadline = Instant::now() + T;
        while body(a).as_deref() != Some("two") {
            if Instant::now() > deadline {
                let out = Command::new(BIN)
                    .args(["fleet", "status", "--from", &url])
                    .output()
                    .unwrap();
                let mut threads = String::new();
                for (p, _) in &fleet {
                    let pid = p.0.id();
                    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
                        .unwrap()
                        .flatten()
                    {
                        let comm =
                            std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
                        let wchan =
                            std::fs::read_to_string(t.path().join("wchan")).unwrap_or_default();
                        let stat =
                            std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                        let state = stat
                            .split(") ")
                            .nth(1)
                            .and_then(|r| r.split(' ').next())
                            .unwrap_or("?")
                            .to_string();
                        threads.push_str(&format!("{pid} {} {state} {wchan}\n", comm.trim()));
                    }
                }
                panic!(
                    "{a} did not apply the change; the fleet says:\n{}{}\nthreads:\n{threads}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        applied.push(written.elapsed());
    }
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    for d in drivers {
        d.join().unwrap();
    }
    eprintln!(
        "etcd: the change applied on all three {:?} after the write ({} requests meanwhile)",
        applied.iter().max().unwrap(),
        done.load(Ordering::SeqCst)
    );
    assert_eq!(
        failed.load(Ordering::SeqCst),
        0,
        "failed requests during the change"
    );
    assert!(done.load(Ordering::SeqCst) > 10);

    // An invalid document, written past the push check: refused everywhere, each instance says
    // why under its status key, and they keep serving.
    let b64 = |s: &str| {
        let out = Command::new("base64")
            .arg("-w0")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        out.stdin.as_ref().unwrap().write_all(s.as_bytes()).unwrap();
        String::from_utf8(out.wait_with_output().unwrap().stdout).unwrap()
    };
    let bad = format!(
        r#"{{"key":"{}","value":"{}"}}"#,
        b64("/portico/config"),
        b64("listeners = 5\n")
    );
    assert!(post(etcd.client, "/v3/kv/put", &bad)
        .unwrap()
        .starts_with("HTTP/1.1 200"));
    for i in 1..=3 {
        let key = format!(
            r#"{{"key":"{}"}}"#,
            b64(&format!("/portico/config/status/i{i}"))
        );
        wait_for("the refusal under the status key", || {
            let a = post(etcd.client, "/v3/kv/range", &key)?;
            let v = a.split_once("\r\n\r\n")?.1;
            let value = v.split("\"value\":\"").nth(1)?.split('"').next()?;
            let out = Command::new("base64")
                .args(["-d"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .ok()?;
            out.stdin.as_ref()?.write_all(value.as_bytes()).ok()?;
            let status = String::from_utf8(out.wait_with_output().ok()?.stdout).ok()?;
            status
                .contains(&format!(
                    "etcd://127.0.0.1:{}/portico/config:1:13: listeners",
                    etcd.client
                ))
                .then_some(())
        });
    }
    for &a in &addrs {
        assert_eq!(
            body(a).as_deref(),
            Some("two"),
            "the running configuration stays"
        );
    }
    let status = || {
        let out = Command::new(BIN)
            .args(["fleet", "status", "--from", &url])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let refused = status();
    assert!(refused.contains("3 instance(s)"), "{refused}");
    assert!(refused.contains("listeners: invalid type"), "{refused}");
    // a good one applies again
    assert!(push(&dir, &url, &document("three")).status.success());
    for &a in &addrs {
        wait_for("the good document", || {
            (body(a).as_deref() == Some("three")).then_some(())
        });
    }
    let fleet_view = wait_for("every instance to report the revision", || {
        let s = status();
        (s.contains("3 instance(s); the configuration key is at revision")
            && s.contains("; 0 instance(s) not running it"))
        .then_some(s)
    });
    for name in ["i1", "i2", "i3"] {
        assert!(fleet_view.contains(name), "{fleet_view}");
    }

    // etcd stops: the instances keep serving; one started now starts from its cache.
    etcd.stop();
    std::thread::sleep(Duration::from_millis(300));
    for &a in &addrs {
        assert_eq!(body(a).as_deref(), Some("three"));
    }
    let (c, a) = fleet.remove(0);
    drop(c);
    let (again, a2) = instance(&dir, &url, "i1");
    assert_ne!(a, a2);
    assert_eq!(
        body(a2).as_deref(),
        Some("three"),
        "started from the cached copy"
    );
    fleet.push((again, a2));
    drop(fleet);
    let _ = std::fs::remove_dir_all(&dir);
}
