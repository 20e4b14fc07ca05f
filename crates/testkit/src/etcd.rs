//! A real etcd server (Debian's `etcd-server`) on loopback ports for tests, and its JSON API's put, delete and get.

use base64::Engine;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// An etcd server on loopback ports, its data under `dir`, killed when dropped.
pub struct Etcd {
    /// The client port (etcd's JSON API, plain HTTP).
    pub client: u16,
    /// With [`Etcd::start_tls`]: the TLS client port, which asks for a client certificate.
    pub tls_client: Option<u16>,
    /// More arguments for etcd.
    args: Vec<String>,
    /// The token [`Etcd::post`] sends, after [`Etcd::login`].
    token: Option<String>,
    child: Option<Child>,
    dir: PathBuf,
}

/// The files of etcd's TLS client listener.
pub struct EtcdTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The CA client certificates must chain to.
    pub client_ca: PathBuf,
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
        Etcd::start_with(dir, Vec::new(), None)
    }

    /// Start etcd with a TLS client listener too (client certificates required there), on
    /// [`Etcd::tls_client`].
    pub fn start_tls(dir: &Path, tls: &EtcdTls) -> Etcd {
        Etcd::start_with(dir, Vec::new(), Some(tls))
    }

    /// Start etcd with more arguments (`--auth-token-ttl 1`), and a TLS listener when given.
    pub fn start_with(dir: &Path, mut args: Vec<String>, tls: Option<&EtcdTls>) -> Etcd {
        // The client ports survive a restart: below the ephemeral range (see port_for_restarts).
        let tls_client = tls.map(|t| {
            let port = crate::port_for_restarts();
            args.extend([
                "--cert-file".into(),
                t.cert.display().to_string(),
                "--key-file".into(),
                t.key.display().to_string(),
                "--client-cert-auth".into(),
                "--trusted-ca-file".into(),
                t.client_ca.display().to_string(),
            ]);
            port
        });
        let mut e = Etcd {
            client: crate::port_for_restarts(),
            tls_client,
            args,
            token: None,
            child: None,
            dir: dir.to_path_buf(),
        };
        e.restart();
        e
    }

    /// Start it again on the same client port and data (after [`Etcd::stop`]).
    pub fn restart(&mut self) {
        let peer = free_port();
        let mut c = format!("http://127.0.0.1:{}", self.client);
        if let Some(port) = self.tls_client {
            c.push_str(&format!(",https://127.0.0.1:{port}"));
        }
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
            .args(&self.args)
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
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                let log = std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default();
                let tail = &log[log.len().saturating_sub(2000)..];
                panic!("etcd exited ({status}):\n{tail}");
            }
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
        // an fsync on a busy disk can take seconds
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        let auth = self
            .token
            .as_ref()
            .map_or(String::new(), |t| format!("Authorization: {t}\r\n"));
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: etcd\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
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

    /// One call that must answer 200: its body.
    pub fn must(&self, path: &str, body: &str) -> String {
        let a = self.post(path, body).unwrap_or_default();
        assert!(a.starts_with("HTTP/1.1 200"), "etcd {path} {body}: {a}");
        a.split_once("\r\n\r\n")
            .map_or(String::new(), |(_, b)| b.to_string())
    }

    /// Turn authentication on with a `root` user (password `root_password`), and a user `name`
    /// (password `password`) who may read the key `key` and write under `key/status/` (what
    /// Portico's documentation grants a follower); the helper's own calls go as root from
    /// then on.
    pub fn enable_auth(&mut self, root_password: &str, name: &str, password: &str, key: &str) {
        let user = |n: &str, p: &str| format!(r#"{{"name":"{n}","password":"{p}"}}"#);
        self.must("/v3/auth/role/add", r#"{"name":"root"}"#);
        self.must("/v3/auth/user/add", &user("root", root_password));
        self.must("/v3/auth/user/grant", r#"{"user":"root","role":"root"}"#);
        self.must("/v3/auth/role/add", r#"{"name":"follower"}"#);
        // `etcdctl role grant-permission follower read KEY`
        self.must(
            "/v3/auth/role/grant",
            &format!(
                r#"{{"name":"follower","perm":{{"permType":"READ","key":"{}"}}}}"#,
                b64(key)
            ),
        );
        // `... --prefix readwrite KEY/status/` (`/` + 1 is `0`)
        self.must(
            "/v3/auth/role/grant",
            &format!(
                r#"{{"name":"follower","perm":{{"permType":"READWRITE","key":"{}","range_end":"{}"}}}}"#,
                b64(&format!("{key}/status/")),
                b64(&format!("{key}/status0"))
            ),
        );
        self.must("/v3/auth/user/add", &user(name, password));
        self.must(
            "/v3/auth/user/grant",
            &format!(r#"{{"user":"{name}","role":"follower"}}"#),
        );
        self.must("/v3/auth/enable", "{}");
        self.login("root", root_password);
    }

    /// Authenticate the helper's own calls as `name`.
    pub fn login(&mut self, name: &str, password: &str) {
        self.token = None;
        let a = self.must(
            "/v3/auth/authenticate",
            &format!(r#"{{"name":"{name}","password":"{password}"}}"#),
        );
        let token = a
            .split(r#""token":""#)
            .nth(1)
            .and_then(|r| r.split('"').next());
        self.token = Some(token.unwrap_or_else(|| panic!("no token: {a}")).to_string());
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
