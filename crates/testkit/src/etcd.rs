//! A real etcd server (Debian's `etcd-server`) on loopback ports for tests, and its JSON API's put, delete and get.

use base64::Engine;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// An etcd server on loopback ports, its data under `dir`, killed when dropped.
pub struct Etcd {
    /// The client port (etcd's JSON API).
    pub client: u16,
    child: Option<Child>,
    dir: PathBuf,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

impl Etcd {
    /// Start etcd and wait (at most 20 s) until it answers.
    pub fn start(dir: &Path) -> Etcd {
        let mut e = Etcd {
            client: free_port(),
            child: None,
            dir: dir.to_path_buf(),
        };
        e.restart();
        e
    }

    /// Start it again on the same client port and data (after [`Etcd::stop`]).
    pub fn restart(&mut self) {
        let peer = free_port();
        let c = format!("http://127.0.0.1:{}", self.client);
        let p = format!("http://127.0.0.1:{peer}");
        let log = std::fs::File::create(self.dir.join("etcd.log")).expect("etcd's log file");
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
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self
            .post("/v3/kv/range", r#"{"key":"AA=="}"#)
            .is_some_and(|a| a.starts_with("HTTP/1.1 200"))
        {
            assert!(Instant::now() < deadline, "etcd did not answer in 20 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kill it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `etcd://127.0.0.1:PORT{key}`.
    pub fn url(&self, key: &str) -> String {
        format!("etcd://127.0.0.1:{}{key}", self.client)
    }

    /// One POST to the JSON API: the whole answer, or None when etcd cannot be reached.
    pub fn post(&self, path: &str, body: &str) -> Option<String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.client)).ok()?;
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

    /// Write `value` at `key`, bound to `lease` when given; panics unless etcd says 200.
    pub fn put(&self, key: &str, value: &str, lease: Option<i64>) {
        let lease = lease.map_or(String::new(), |l| format!(r#","lease":"{l}""#));
        let body = format!(
            r#"{{"key":"{}","value":"{}"{lease}}}"#,
            b64(key),
            b64(value)
        );
        let a = self.post("/v3/kv/put", &body).unwrap_or_default();
        assert!(a.starts_with("HTTP/1.1 200"), "etcd put {key}: {a}");
    }

    /// Remove `key`; panics unless etcd says 200.
    pub fn delete(&self, key: &str) {
        let body = format!(r#"{{"key":"{}"}}"#, b64(key));
        let a = self.post("/v3/kv/deleterange", &body).unwrap_or_default();
        assert!(a.starts_with("HTTP/1.1 200"), "etcd delete {key}: {a}");
    }

    /// A lease of `ttl` seconds: its id.
    pub fn grant(&self, ttl: u64) -> i64 {
        let a = self
            .post("/v3/lease/grant", &format!(r#"{{"TTL":"{ttl}"}}"#))
            .unwrap_or_default();
        a.split(r#""ID":""#)
            .nth(1)
            .and_then(|r| r.split('"').next())
            .and_then(|id| id.parse().ok())
            .unwrap_or_else(|| panic!("etcd lease grant: {a}"))
    }

    /// Revoke a lease: its keys go at once.
    pub fn revoke(&self, lease: i64) {
        let a = self
            .post("/v3/lease/revoke", &format!(r#"{{"ID":"{lease}"}}"#))
            .unwrap_or_default();
        assert!(a.starts_with("HTTP/1.1 200"), "etcd lease revoke: {a}");
    }

    /// The value at `key`, or None (absent, or etcd unreachable).
    pub fn get(&self, key: &str) -> Option<String> {
        let a = self.post("/v3/kv/range", &format!(r#"{{"key":"{}"}}"#, b64(key)))?;
        let value = a.split(r#""value":""#).nth(1)?.split('"').next()?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(value)
            .ok()?;
        String::from_utf8(bytes).ok()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}
