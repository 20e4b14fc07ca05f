//! Configuration from etcd against a real etcd server: three instances follow one key, a change applies everywhere under load without a failed request, an invalid document is refused and reported under each instance's status key, and an instance starts from its cached copy while etcd is down.

use crate::common::{announced, BIN};
use portico_testkit::etcd::Etcd;
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(20);

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
        "[admin]\naddress = \"127.0.0.1:0\"\n[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nrespond = {{ status = 200, body = \"{body}\" }}\n"
    )
}

/// Requests an instance counted (its admin listener's `portico_requests_total`).
fn requests(admin: SocketAddr) -> Option<u64> {
    let mut s = TcpStream::connect(admin).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.lines()
        .find_map(|l| l.strip_prefix("portico_requests_total "))
        .and_then(|n| n.trim().parse().ok())
}

fn push(dir: &std::path::Path, url: &str, text: &str) -> std::process::Output {
    push_as(dir, url, text, &[])
}

/// `portico config push` with more flags (`--etcd-user`).
fn push_as(dir: &std::path::Path, url: &str, text: &str, flags: &[&str]) -> std::process::Output {
    let file = dir.join("push.toml");
    std::fs::write(&file, text).unwrap();
    Command::new(BIN)
        .args(["config", "push", &file.display().to_string(), "--to", url])
        .args(flags)
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

/// A `portico run --config-source` instance, its listener and its admin listener.
fn instance(dir: &std::path::Path, url: &str, name: &str) -> (Proc, SocketAddr, SocketAddr) {
    instance_as(dir, url, name, &[])
}

/// [`instance`] with more flags.
fn instance_as(
    dir: &std::path::Path,
    url: &str,
    name: &str,
    flags: &[&str],
) -> (Proc, SocketAddr, SocketAddr) {
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    let cache = dir.join(format!("{name}.cache.toml"));
    let mut child = Command::new(BIN)
        .args(["run", "--config-source", url, "-w", "1"])
        .args(["--config-cache", &cache.display().to_string()])
        // Changes come by watch: the poll is the fallback, long enough not to be what
        // applies them here.
        .args(["--config-poll", "10s", "--instance", name])
        .args(flags)
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    // the listener, then the admin listener
    let addrs = announced(&mut out, 2);
    // the rest of standard output is not read: nothing more is written there
    (Proc(child), addrs[0], addrs[1])
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
    let url = etcd.url("/portico/config");
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

    let mut fleet: Vec<(Proc, SocketAddr, SocketAddr)> = (1..=3)
        .map(|i| instance(&dir, &url, &format!("i{i}")))
        .collect();
    let addrs: Vec<SocketAddr> = fleet.iter().map(|f| f.1).collect();
    for &a in &addrs {
        assert_eq!(body(a).as_deref(), Some("one"));
    }

    // `portico bench` drives each instance (open loop, 200 req/s for 4 s) and the change is
    // written while they run.
    let benches: Vec<(Proc, std::path::PathBuf)> = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let json = dir.join(format!("bench{i}.json"));
            let child = Command::new(BIN)
                .args(["bench", &format!("http://{a}/"), "-R", "200", "-c", "2"])
                .args(["-d", "4s", "--json", &json.display().to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            (Proc(child), json)
        })
        .collect();
    // Each bench has started: every instance counts requests beyond the one `body` sent.
    for (_, _, admin) in &fleet {
        wait_for("the bench to drive the instance", || {
            requests(*admin).filter(|n| *n > 20)
        });
    }
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
                for (p, ..) in &fleet {
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
    let mut benches = benches;
    let under_load = benches
        .iter_mut()
        .all(|(p, _)| p.0.try_wait().ok().flatten().is_none());
    let mut completed = 0;
    for (mut p, json) in benches {
        let status = p.0.wait().unwrap();
        assert!(status.success(), "portico bench: {status}");
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let req = &r["requests"];
        assert_eq!(req["errors"], 0, "failed requests during the change: {req}");
        let classes = r["status_classes"].as_object().unwrap();
        assert!(
            classes.keys().all(|k| k == "2xx"),
            "responses other than 2xx during the change: {classes:?}"
        );
        completed += req["completed"].as_u64().unwrap();
    }
    eprintln!(
        "etcd: the change applied on all three {:?} after the write ({completed} requests by portico bench meanwhile, none failed)",
        applied.iter().max().unwrap(),
    );
    assert!(
        under_load,
        "the change applied after a bench ended: not measured under load"
    );
    assert!(
        applied.iter().max().unwrap() < &Duration::from_secs(3),
        "not by the watch: {applied:?}"
    );
    assert!(completed > 2000, "{completed} requests");

    // An invalid document, written past the push check: refused everywhere, each instance says
    // why under its status key, and they keep serving.
    etcd.put("/portico/config", "listeners = 5\n", None);
    for i in 1..=3 {
        wait_for("the refusal under the status key", || {
            let status = etcd.get(&format!("/portico/config/status/i{i}"))?;
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
        (s.contains("3 instance(s), ")
            && s.contains(" request(s) in all; the configuration key is at revision")
            && s.contains("; 0 instance(s) not running it"))
        .then_some(s)
    });
    for name in ["i1", "i2", "i3"] {
        assert!(fleet_view.contains(name), "{fleet_view}");
    }

    // The key deleted: the instances keep serving, one restarted starts from its cache, and
    // all follow the key once it is written again.
    etcd.delete("/portico/config");
    let (c, _, _) = fleet.pop().unwrap();
    drop(c);
    let (again, a3, admin3) = instance(&dir, &url, "i3");
    assert_eq!(
        body(a3).as_deref(),
        Some("three"),
        "started from the cached copy without the key"
    );
    fleet.push((again, a3, admin3));
    // A key that does not exist (a typo) does not start from another key's cache.
    let other = etcd.url("/portico/typo");
    let cache = dir.join("i3.cache.toml");
    // killed when dropped: a failed assertion leaves no instance behind
    let mut wrong = Proc(
        Command::new(BIN)
            .args(["run", "--config-source", &other, "-w", "1"])
            .args(["--config-cache", &cache.display().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let status = wait_for("the instance of a missing key to give up", || {
        wrong.0.try_wait().unwrap()
    });
    let mut err = String::new();
    wrong
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "no such key in etcd; the cached configuration {} is from {url}, not from this key",
            cache.display()
        )),
        "{err}"
    );
    assert!(push(&dir, &url, &document("four")).status.success());
    let addrs: Vec<SocketAddr> = fleet.iter().map(|f| f.1).collect();
    for &a in &addrs {
        wait_for("the key written again", || {
            (body(a).as_deref() == Some("four")).then_some(())
        });
    }

    // etcd stops: the instances keep serving; one started now starts from its cache.
    etcd.stop();
    std::thread::sleep(Duration::from_millis(300));
    for &a in &addrs {
        assert_eq!(body(a).as_deref(), Some("four"));
    }
    let (c, a, _) = fleet.remove(0);
    drop(c);
    let (again, a2, admin2) = instance(&dir, &url, "i1");
    assert_ne!(a, a2);
    assert_eq!(
        body(a2).as_deref(),
        Some("four"),
        "started from the cached copy"
    );
    fleet.push((again, a2, admin2));
    drop(fleet);
    let _ = std::fs::remove_dir_all(&dir);
}

/// An etcd with authentication on, whose tokens last a second: `config push` as root, an
/// instance following as a user who may only read the key and write its status, its token
/// renewed as it expires; no user, no access.
#[test]
fn an_instance_follows_as_an_etcd_user() {
    let dir = std::env::temp_dir().join(format!("portico-etcd-auth-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.as_path();
    let mut etcd = Etcd::start_with(d, vec!["--auth-token-ttl".into(), "1".into()], None);
    etcd.enable_auth("root-secret", "portico", "follower-secret", "/auth/config");
    let url = etcd.url("/auth/config");
    std::fs::write(d.join("root.pw"), "root-secret\n").unwrap();
    std::fs::write(d.join("portico.pw"), "follower-secret\n").unwrap();
    let root = d.join("root.pw").display().to_string();
    let follower = d.join("portico.pw").display().to_string();
    let as_root = ["--etcd-user", "root", "--etcd-password-file", root.as_str()];
    let as_follower = [
        "--etcd-user",
        "portico",
        "--etcd-password-file",
        follower.as_str(),
    ];

    let out = push(d, &url, &document("one"));
    assert!(!out.status.success(), "written without a user");
    let out = push_as(d, &url, &document("one"), &as_follower);
    assert!(
        !out.status.success(),
        "written by a user who may only read it"
    );
    let out = push_as(d, &url, &document("one"), &as_root);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let (_p, a, admin) = instance_as(d, &url, "u1", &as_follower);
    assert_eq!(body(a).as_deref(), Some("one"));
    // Past the token's second: the next calls get a new one.
    let out = push_as(d, &url, &document("two"), &as_root);
    assert!(out.status.success());
    wait_for("the change, read as the user", || {
        (body(a).as_deref() == Some("two")).then_some(())
    });
    // The status key is renewed every 5 s, each time past the token's life: its time moves
    // (the instance reads the fleet, its own key included, each time it renews it).
    let at = || -> Option<u64> {
        let mut s = TcpStream::connect(admin).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            s,
            "GET /api/fleet HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        let v: serde_json::Value = serde_json::from_str(out.split_once("\r\n\r\n")?.1).ok()?;
        v["members"].as_array()?.first()?["at"].as_u64()
    };
    let first = wait_for("the status key in the fleet view", at);
    wait_for("a renewed status key", || at().filter(|t| *t > first));
    // The documented grants let the follower list the fleet.
    let out = Command::new(BIN)
        .args(["fleet", "status", "--from", &url])
        .args(as_follower)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("; 0 instance(s) not running it"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(etcd);
    let _ = std::fs::remove_dir_all(&dir);
}
