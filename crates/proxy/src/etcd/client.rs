//! A client of etcd's v3 JSON API (its gRPC gateway), plain or TLS and as an etcd user: keys read, written, listed and watched; the fleet as its instances' status keys say.

use base64::Engine;
use portico_config::{EtcdClient, EtcdUrl, HttpUrl};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_rustls::rustls::ClientConfig;

/// How long one request to etcd may take.
const TIMEOUT: Duration = Duration::from_secs(3);
/// Largest document accepted (etcd's own default request limit is 1.5 MiB).
const MAX_DOCUMENT: usize = 2 * 1024 * 1024;

/// A key in etcd: `etcd://HOST:PORT/KEY` (the key is the path, its leading `/` included), and
/// how it is reached.
#[derive(Debug, Clone)]
pub struct EtcdKey {
    url: EtcdUrl,
    pub key: String,
    client: Arc<Client>,
}

/// How this process talks to one etcd server: TLS for `etcds://` (the CA, a client
/// certificate), and the user it authenticates as, with the token etcd last gave it.
struct Client {
    tls: Option<Arc<ClientConfig>>,
    auth: Option<Auth>,
}

struct Auth {
    user: String,
    /// Read each time a token is asked for: a password changed in etcd and in the file is
    /// taken without a restart.
    password_file: PathBuf,
    token: Mutex<Option<String>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("tls", &self.tls.is_some())
            .field("user", &self.auth.as_ref().map(|a| &a.user))
            .finish()
    }
}

impl Client {
    fn new(url: &EtcdUrl, settings: &EtcdClient) -> Result<Client, String> {
        let tls = match url.tls {
            false => None,
            true => {
                let o = portico_tls::client_config(
                    &portico_config::UpstreamTls {
                        ca_file: settings.ca_file.clone(),
                        server_name: Some(url.host.clone()),
                        certificate: settings.certificate.clone(),
                        verify: true,
                        versions: vec![
                            portico_config::TlsVersion::Tls12,
                            portico_config::TlsVersion::Tls13,
                        ],
                        // resumed handshakes for the connection of each call
                        session_cache: 8,
                    },
                    &portico_tls::ClientSessions::new(8),
                )
                .map_err(|e| format!("TLS to etcd {}: {e}", url.host))?;
                Some(o.config)
            }
        };
        let auth = match (&settings.username, &settings.password_file) {
            (Some(user), Some(file)) => {
                password(file)?;
                if !url.tls {
                    tracing::warn!(
                        "etcd user {user}: its password goes to {}:{} in clear text; use etcds://",
                        url.host,
                        url.port
                    );
                }
                Some(Auth {
                    user: user.clone(),
                    password_file: file.clone(),
                    token: Mutex::new(None),
                })
            }
            _ => None,
        };
        Ok(Client { tls, auth })
    }
}

/// The password in `file` (a trailing newline is not part of it).
fn password(file: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("cannot read the etcd password from {}: {e}", file.display()))?;
    Ok(text.trim_end_matches(['\r', '\n']).to_string())
}

/// Whether etcd refused a call for its token: none, expired or unknown (401, gRPC
/// UNAUTHENTICATED), or older than a change of users or roles (JWT tokens carry the auth
/// revision): a new token may do, as etcd's own client does.
fn auth_refused(status: u16, answer: &serde_json::Value) -> bool {
    let message = answer["message"]
        .as_str()
        .or(answer["error"].as_str())
        .or(answer["error"]["message"].as_str())
        .unwrap_or("");
    status == 401
        || answer["code"].as_i64() == Some(16)
        || answer["error"]["grpc_code"].as_i64() == Some(16)
        || [
            "invalid auth token",
            "revision of auth store is old",
            "user name is empty",
        ]
        .iter()
        .any(|m| message.contains(m))
}

/// A document read from etcd, and the revision that last changed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    pub text: String,
    pub revision: i64,
}

/// Why a call failed: etcd refused the token (a new one may do), or anything else.
enum Failure {
    Auth(String),
    Other(String),
}

impl From<Failure> for String {
    fn from(f: Failure) -> String {
        match f {
            Failure::Auth(e) | Failure::Other(e) => e,
        }
    }
}

impl EtcdKey {
    /// `etcd://HOST[:PORT]/KEY` (`etcds://` for TLS), port 2379 unless given, reached without a
    /// CA, client certificate or user of its own.
    pub fn parse(text: &str) -> Result<EtcdKey, String> {
        EtcdKey::open(text, &EtcdClient::default())
    }

    /// `etcd://HOST[:PORT]/KEY`, reached as `settings` say (the files are read now).
    pub fn open(text: &str, settings: &EtcdClient) -> Result<EtcdKey, String> {
        let url = EtcdUrl::parse(text)?;
        if settings.has_tls() && !url.tls {
            return Err(format!(
                "{text:?}: a CA or a client certificate is for TLS: write etcds://"
            ));
        }
        EtcdKey::new(url, settings)
    }

    /// The key of `url`, reached as `settings` say (the files are read now).
    pub fn new(url: EtcdUrl, settings: &EtcdClient) -> Result<EtcdKey, String> {
        Ok(EtcdKey {
            client: Arc::new(Client::new(&url, settings)?),
            key: url.key.clone(),
            url,
        })
    }

    /// The name documents from this key carry in error messages (`etcd://HOST:PORT/KEY`).
    pub fn name(&self) -> String {
        EtcdUrl {
            key: self.key.clone(),
            ..self.url.clone()
        }
        .name()
    }

    /// This key with another key path (on the same server, reached the same way).
    pub fn sibling(&self, key: String) -> EtcdKey {
        EtcdKey {
            key,
            url: self.url.clone(),
            client: self.client.clone(),
        }
    }

    /// The token to send (None without a user): the one etcd gave, or a new one when there is
    /// none yet or `renew`.
    fn token(&self, renew: bool) -> Result<Option<String>, String> {
        let Some(auth) = &self.client.auth else {
            return Ok(None);
        };
        let mut token = auth.token.lock().unwrap_or_else(|e| e.into_inner());
        if let (false, Some(t)) = (renew, token.as_ref()) {
            return Ok(Some(t.clone()));
        }
        *token = None;
        let body =
            serde_json::json!({ "name": auth.user, "password": password(&auth.password_file)? });
        let v = self
            .post("/v3/auth/authenticate", &body.to_string(), None)
            .map_err(|e| {
                format!(
                    "etcd: cannot authenticate as {}: {}",
                    auth.user,
                    String::from(e)
                )
            })?;
        let t = v["token"]
            .as_str()
            .filter(|t| !t.is_empty())
            .ok_or_else(|| format!("etcd: authenticated as {}, but no token came", auth.user))?;
        *token = Some(t.to_string());
        Ok(Some(t.to_string()))
    }

    /// One call of the JSON API, with the token (a new one once, when etcd refuses it).
    fn call(&self, path: &str, body: serde_json::Value) -> Result<serde_json::Value, String> {
        let body = body.to_string();
        let token = self.token(false)?;
        match self.post(path, &body, token.as_deref()) {
            Err(Failure::Auth(_)) if token.is_some() => {
                let token = self.token(true)?;
                self.post(path, &body, token.as_deref())
                    .map_err(String::from)
            }
            other => other.map_err(String::from),
        }
    }

    fn post(
        &self,
        path: &str,
        body: &str,
        token: Option<&str>,
    ) -> Result<serde_json::Value, Failure> {
        let url = HttpUrl {
            https: self.url.tls,
            host: self.url.host.clone(),
            port: self.url.port,
            target: path.to_string(),
        };
        let mut headers = vec![("Content-Type", "application/json")];
        if let Some(t) = token {
            headers.push(("Authorization", t));
        }
        // On a thread of its own, waited for at most TIMEOUT and a second: a call that hangs
        // (a name lookup) does not stop the follower.
        let a = crate::blocking_http::request_bounded_with(
            url,
            "POST",
            &headers,
            body.as_bytes().to_vec(),
            TIMEOUT,
            MAX_DOCUMENT * 2,
            self.client.tls.clone(),
        )
        .map_err(|e| Failure::Other(format!("etcd {}:{}: {e}", self.url.host, self.url.port)))?;
        let v: serde_json::Value = serde_json::from_slice(&a.body).map_err(|e| {
            Failure::Other(format!(
                "etcd {}:{}: HTTP {}, not JSON: {e}",
                self.url.host, self.url.port, a.status
            ))
        })?;
        if a.status != 200 {
            let why = v["message"].as_str().or(v["error"].as_str()).unwrap_or("");
            let e = format!(
                "etcd {}:{}: HTTP {} {why}",
                self.url.host, self.url.port, a.status
            );
            return Err(match auth_refused(a.status, &v) {
                true => Failure::Auth(e),
                false => Failure::Other(e),
            });
        }
        Ok(v)
    }

    /// The document at the key (None when the key does not exist).
    pub fn get(&self) -> Result<Option<Document>, String> {
        self.get_at().map(|(d, _)| d)
    }

    /// [`EtcdKey::get`], and the revision of etcd it was read at (a watch from it misses
    /// nothing, and is not older than etcd's compaction).
    pub fn get_at(&self) -> Result<(Option<Document>, i64), String> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let v = self.call(
            "/v3/kv/range",
            serde_json::json!({ "key": b64.encode(&self.key) }),
        )?;
        let at = int(&v["header"]["revision"]);
        let Some(kv) = v["kvs"].as_array().and_then(|k| k.first()) else {
            return Ok((None, at));
        };
        let value = b64
            .decode(kv["value"].as_str().unwrap_or(""))
            .map_err(|e| format!("{}: the value is not base64: {e}", self.name()))?;
        let text = String::from_utf8(value)
            .map_err(|_| format!("{}: the document is not UTF-8", self.name()))?;
        // The gateway writes 64-bit integers as strings.
        let revision = int(&kv["mod_revision"]);
        Ok((Some(Document { text, revision }), at))
    }

    /// Write `value` at the key; the revision of the write.
    pub fn put(&self, value: &str) -> Result<i64, String> {
        self.put_leased(value, None)
    }

    /// Write `value` at the key, bound to `lease` when given (the key goes with the lease).
    pub(crate) fn put_leased(&self, value: &str, lease: Option<i64>) -> Result<i64, String> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut body =
            serde_json::json!({ "key": b64.encode(&self.key), "value": b64.encode(value) });
        if let Some(id) = lease {
            body["lease"] = serde_json::Value::String(id.to_string());
        }
        let v = self.call("/v3/kv/put", body)?;
        Ok(int(&v["header"]["revision"]))
    }

    /// A lease of `ttl` seconds.
    pub(crate) fn grant(&self, ttl: u64) -> Result<i64, String> {
        let v = self.call(
            "/v3/lease/grant",
            serde_json::json!({ "TTL": ttl.to_string() }),
        )?;
        match int(&v["ID"]) {
            0 => Err(format!(
                "etcd {}:{}: no lease granted",
                self.url.host, self.url.port
            )),
            id => Ok(id),
        }
    }

    /// Wait at most `wait` for a change of the key (with `prefix`, of any key under `KEY/`)
    /// made after `revision` (etcd's revision when the key was read), through a watch of the
    /// JSON API: true when one came, or when `revision` was compacted (read the key to know);
    /// false when the time ran out first; an error when the watch was refused or cancelled.
    /// On a thread of its own, waited for at most `wait` and the request timeout: a name
    /// lookup that hangs does not hold the caller.
    pub fn changed_since(
        &self,
        revision: i64,
        prefix: bool,
        wait: Duration,
    ) -> Result<bool, String> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut create = serde_json::json!({
            "key": b64.encode(&self.key),
            "start_revision": (revision + 1).to_string(),
        });
        if prefix {
            let (from, end) = prefix_range(&self.key);
            create["key"] = b64.encode(from).into();
            create["range_end"] = b64.encode(end).into();
        }
        let body = serde_json::json!({ "create_request": create }).to_string();
        let me = self.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("portico-etcd-watch".into())
            .spawn(move || {
                let _ = tx.send(me.watch(&body, wait));
            })
            .map_err(|e| format!("cannot start a watch thread: {e}"))?;
        rx.recv_timeout(wait + TIMEOUT).unwrap_or_else(|_| {
            Err(format!(
                "etcd {}:{}: no answer within {:?}",
                self.url.host,
                self.url.port,
                wait + TIMEOUT
            ))
        })
    }

    /// Every key under this one (`KEY/...`) with its value, in key order.
    pub fn list(&self) -> Result<Vec<(String, String)>, String> {
        self.list_at().map(|(kvs, _)| kvs)
    }

    /// [`EtcdKey::list`], and the revision of etcd it was read at (a watch from it misses
    /// nothing).
    pub fn list_at(&self) -> Result<(Vec<(String, String)>, i64), String> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let (prefix, end) = prefix_range(&self.key);
        let v = self.call(
            "/v3/kv/range",
            serde_json::json!({ "key": b64.encode(prefix), "range_end": b64.encode(end) }),
        )?;
        let mut out = Vec::new();
        for kv in v["kvs"].as_array().into_iter().flatten() {
            let decode = |f: &str| {
                b64.decode(kv[f].as_str().unwrap_or(""))
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .unwrap_or_default()
            };
            out.push((decode("key"), decode("value")));
        }
        Ok((out, int(&v["header"]["revision"])))
    }
}

/// The range of keys under `key/`: its first key and the key after its last.
fn prefix_range(key: &str) -> (Vec<u8>, Vec<u8>) {
    let prefix = format!("{key}/").into_bytes();
    let mut end = prefix.clone();
    if let Some(last) = end.last_mut() {
        // `/` + 1 = `0`: no carry
        *last += 1;
    }
    (prefix, end)
}

/// A connection to etcd, plain or TLS.
trait Stream: std::io::Read + std::io::Write {}
impl<T: std::io::Read + std::io::Write> Stream for T {}

impl EtcdKey {
    /// One watch on etcd's JSON API (`POST /v3/watch`, its answer a stream of JSON messages,
    /// one per line): whether a message with events, or one that ends the watch, came within
    /// `wait`.
    fn watch(&self, body: &str, wait: Duration) -> Result<bool, String> {
        use std::net::ToSocketAddrs;
        let (host, port) = (self.url.host.as_str(), self.url.port);
        let at = format!("etcd {host}:{port}");
        let token = self.token(false)?;
        let deadline = std::time::Instant::now() + wait;
        let addr = (host, port)
            .to_socket_addrs()
            .map_err(|e| format!("{at}: cannot resolve: {e}"))?
            .next()
            .ok_or_else(|| format!("{at}: no address"))?;
        let tcp = std::net::TcpStream::connect_timeout(&addr, TIMEOUT)
            .map_err(|e| format!("{at}: cannot connect: {e}"))?;
        let ctl = tcp.try_clone().map_err(|e| format!("{at}: {e}"))?;
        ctl.set_write_timeout(Some(TIMEOUT))
            .map_err(|e| format!("{at}: {e}"))?;
        ctl.set_read_timeout(Some(TIMEOUT))
            .map_err(|e| format!("{at}: {e}"))?;
        let mut s: Box<dyn Stream> = match &self.client.tls {
            None => Box::new(tcp),
            Some(config) => Box::new(tokio_rustls::rustls::StreamOwned::new(
                crate::blocking_http::tls_session(config.clone(), host)?,
                tcp,
            )),
        };
        let host_field = match host.contains(':') {
            true => format!("[{host}]:{port}"),
            false => format!("{host}:{port}"),
        };
        let auth = token.map_or(String::new(), |t| format!("Authorization: {t}\r\n"));
        write!(
            s,
            "POST /v3/watch HTTP/1.0\r\nHost: {host_field}\r\nUser-Agent: portico\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .and_then(|_| s.flush())
        .map_err(|e| format!("{at}: {e}"))?;
        let mut seen = Vec::new();
        let mut reader = WatchReader::default();
        let mut chunk = [0u8; 8192];
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            ctl.set_read_timeout(Some(left))
                .map_err(|e| format!("{at}: {e}"))?;
            let n = match s.read(&mut chunk) {
                Ok(0) => return Err(format!("{at}: the watch ended")),
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(false)
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("{at}: {e}")),
            };
            seen.extend_from_slice(&chunk[..n]);
            if seen.len() > MAX_DOCUMENT * 2 {
                // a flood of events: there is a change
                return Ok(true);
            }
            match reader.feed(&mut seen) {
                Ok(Some(changed)) => return Ok(changed),
                Ok(None) => continue,
                Err(WatchError { text, auth }) => {
                    if auth {
                        // the token is no longer good: a new one for the next watch
                        let _ = self.token(true);
                    }
                    return Err(format!("{at}: {text}"));
                }
            }
        }
    }
}

/// Why a watch failed, and whether for its token (a new one may do).
#[derive(Debug, PartialEq)]
struct WatchError {
    text: String,
    auth: bool,
}

/// Reads a watch's answer as it arrives: the head, then one JSON message per line.
#[derive(Default)]
struct WatchReader {
    head_done: bool,
}

impl WatchReader {
    /// Take what `buf` holds whole (the head, complete lines); Some(true) on a change (or a
    /// watch that ended: a cancel, a compacted revision), None until one.
    fn feed(&mut self, buf: &mut Vec<u8>) -> Result<Option<bool>, WatchError> {
        if !self.head_done {
            let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                return Ok(None);
            };
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let line = head.lines().next().unwrap_or("");
            let status = line.split(' ').nth(1);
            if !line.starts_with("HTTP/1.") || status != Some("200") {
                return Err(WatchError {
                    text: format!("the watch was answered {line:?}"),
                    auth: status == Some("401"),
                });
            }
            buf.drain(..end + 4);
            self.head_done = true;
        }
        while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            // Lines that are not messages (a chunk size, if a gateway chunks) are skipped.
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(&line) else {
                continue;
            };
            if let Some(e) = v.get("error") {
                return Err(WatchError {
                    text: format!("the watch failed: {e}"),
                    auth: auth_refused(200, &v),
                });
            }
            let r = &v["result"];
            let events = r["events"].as_array().is_some_and(|e| !e.is_empty());
            if events || int(&r["compact_revision"]) != 0 {
                return Ok(Some(true));
            }
            if r["canceled"].as_bool() == Some(true) {
                let why = r["cancel_reason"].as_str().unwrap_or("no reason given");
                return Err(WatchError {
                    text: format!("the watch was cancelled: {why}"),
                    auth: auth_refused(200, &serde_json::json!({ "message": why })),
                });
            }
        }
        Ok(None)
    }
}

/// A 64-bit integer of the gateway's JSON (written as a string), or 0.
fn int(v: &serde_json::Value) -> i64 {
    v.as_str()
        .and_then(|r| r.parse().ok())
        .or(v.as_i64())
        .unwrap_or(0)
}

/// One instance as its status key says.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Member {
    pub instance: String,
    pub host: String,
    /// Its listeners' addresses by listener name.
    pub listeners: std::collections::BTreeMap<String, String>,
    /// Upstream servers over its groups, and those a request may go to now.
    pub servers: u64,
    pub servers_usable: u64,
    pub version: String,
    pub pid: u64,
    /// The revision of the configuration key it applied, or refused (`ok` false).
    pub revision: i64,
    pub ok: bool,
    pub error: Option<String>,
    pub requests: u64,
    pub uptime_seconds: u64,
    /// When it wrote its status (Unix seconds).
    pub at: u64,
}

/// The fleet as its instances' status keys under the configuration key say, read at `read_at`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Fleet {
    /// `etcd://HOST:PORT/KEY` of the configuration.
    pub key: String,
    /// The configuration key's revision (None: the key does not exist).
    pub revision: Option<i64>,
    pub members: Vec<Member>,
    /// Unix seconds.
    pub read_at: u64,
}

impl Fleet {
    /// Read the configuration key's revision and every status key under it.
    pub fn read(key: &EtcdKey) -> Result<Fleet, String> {
        let revision = key.get()?.map(|d| d.revision);
        let prefix = format!("{}/status/", key.key);
        let mut members = Vec::new();
        // Only the status keys: a follower may read no more than the key and them.
        for (k, v) in key.sibling(format!("{}/status", key.key)).list()? {
            if !k.starts_with(&prefix) {
                continue;
            }
            let Ok(s) = serde_json::from_str::<serde_json::Value>(&v) else {
                continue;
            };
            let text = |f: &str| s[f].as_str().unwrap_or("?").to_string();
            let n = |f: &str| s[f].as_u64().unwrap_or(0);
            let listeners = s["listeners"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("?").to_string()))
                .collect();
            members.push(Member {
                instance: text("instance"),
                host: text("host"),
                listeners,
                servers: n("servers"),
                servers_usable: n("servers_usable"),
                version: text("version"),
                pid: n("pid"),
                revision: s["revision"].as_i64().unwrap_or(0),
                ok: s["ok"].as_bool().unwrap_or(false),
                error: s["error"].as_str().map(str::to_string),
                requests: n("requests"),
                uptime_seconds: n("uptime_seconds"),
                at: n("at"),
            });
        }
        Ok(Fleet {
            key: key.name(),
            revision,
            members,
            read_at: crate::telemetry::stats::unix_now(),
        })
    }

    /// Instances that do not run the key's revision (behind, ahead, or refusing it).
    pub fn behind(&self) -> usize {
        self.members
            .iter()
            .filter(|m| Some(m.revision) != self.revision || !m.ok)
            .count()
    }

    /// Requests over all instances.
    pub fn requests(&self) -> u64 {
        self.members.iter().map(|m| m.requests).sum()
    }

    /// One line per instance (its name, version, the configuration revision it applied or
    /// refused, its requests and uptime), then the key's own revision and how many instances do
    /// not run it.
    pub fn text(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<28} {:<8} {:>9} {:<6} {:>12} {:>9} {:>9}  error",
            "instance", "version", "revision", "ok", "requests", "uptime", "servers"
        );
        for m in &self.members {
            let _ = writeln!(
                out,
                "{:<28} {:<8} {:>9} {:<6} {:>12} {:>8}s {:>9}  {}",
                m.instance,
                m.version,
                m.revision,
                m.ok,
                m.requests,
                m.uptime_seconds,
                format!("{}/{}", m.servers_usable, m.servers),
                m.error.as_deref().unwrap_or("")
            );
        }
        let _ = writeln!(
            out,
            "{} instance(s), {} request(s) in all; the configuration key is at revision {}; {} instance(s) not running it",
            self.members.len(),
            self.requests(),
            self.revision
                .map_or("(none)".to_string(), |r| r.to_string()),
            self.behind()
        );
        out
    }
}

/// The fleet as the admin API and `portico fleet status --json` give it: the instances, the
/// totals and the revision skew.
pub fn fleet_json(fleet: &Fleet) -> serde_json::Value {
    let mut v = serde_json::to_value(fleet).unwrap_or_default();
    v["error"] = serde_json::Value::Null;
    v["instances"] = fleet.members.len().into();
    v["requests"] = fleet.requests().into();
    v["not_running_revision"] = fleet.behind().into();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_answer_is_read_as_it_arrives() {
        let mut r = WatchReader::default();
        let mut buf = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"result\":{\"header\":{\"revision\":\"2\"},\"created\":true}}\n{\"result\":{\"hea".to_vec();
        assert_eq!(r.feed(&mut buf), Ok(None), "created, then half a message");
        assert_eq!(buf, b"{\"result\":{\"hea");
        buf.extend_from_slice(b"der\":{},\"events\":[{\"kv\":{\"key\":\"L2s=\"}}]}}\n");
        assert_eq!(r.feed(&mut buf), Ok(Some(true)), "an event");
        // a compacted start revision ends the watch: read the key
        let mut r = WatchReader::default();
        let mut buf =
            b"HTTP/1.0 200 OK\r\n\r\n{\"result\":{\"canceled\":true,\"compact_revision\":\"7\"}}\n"
                .to_vec();
        assert_eq!(r.feed(&mut buf), Ok(Some(true)));
        // a chunk size line (a gateway that chunks) is skipped; an error is one
        let mut r = WatchReader::default();
        let mut buf =
            b"HTTP/1.1 200 OK\r\n\r\n3a\r\n{\"error\":{\"grpc_code\":3,\"message\":\"bad\"}}\n"
                .to_vec();
        assert!(r.feed(&mut buf).unwrap_err().text.contains("bad"));
        // cancelled for another reason (permission withdrawn): an error, not a change
        let mut r = WatchReader::default();
        let mut buf = b"HTTP/1.1 200 OK\r\n\r\n{\"result\":{\"canceled\":true,\"cancel_reason\":\"permission denied\"}}\n".to_vec();
        let e = r.feed(&mut buf).unwrap_err();
        assert!(e.text.contains("permission denied") && !e.auth, "{e:?}");
        let mut r = WatchReader::default();
        let mut buf = b"HTTP/1.1 404 Not Found\r\n\r\n".to_vec();
        assert!(r.feed(&mut buf).unwrap_err().text.contains("404"));
        // an expired or outdated token: a new one is asked for
        let mut r = WatchReader::default();
        let mut buf = b"HTTP/1.1 401 Unauthorized\r\n\r\n".to_vec();
        assert!(r.feed(&mut buf).unwrap_err().auth);
        let mut r = WatchReader::default();
        let mut buf = b"HTTP/1.1 200 OK\r\n\r\n{\"error\":{\"grpc_code\":3,\"message\":\"etcdserver: revision of auth store is old\"}}\n".to_vec();
        assert!(r.feed(&mut buf).unwrap_err().auth);
    }

    #[test]
    fn token_failures_are_told_from_the_rest() {
        let j = |t: &str| serde_json::from_str::<serde_json::Value>(t).unwrap();
        assert!(auth_refused(
            401,
            &j(r#"{"error":"etcdserver: invalid auth token","code":16}"#)
        ));
        assert!(auth_refused(
            400,
            &j(r#"{"error":"etcdserver: revision of auth store is old","code":3}"#)
        ));
        assert!(auth_refused(
            400,
            &j(r#"{"message":"etcdserver: user name is empty"}"#)
        ));
        assert!(!auth_refused(
            403,
            &j(r#"{"error":"etcdserver: permission denied","code":7}"#)
        ));
        assert!(!auth_refused(
            400,
            &j(r#"{"error":"etcdserver: request is too large"}"#)
        ));
    }

    #[test]
    fn keys_are_etcd_urls() {
        let k = EtcdKey::parse("etcd://127.0.0.1:2379/portico/config").unwrap();
        assert_eq!(k.key, "/portico/config");
        assert_eq!(k.name(), "etcd://127.0.0.1:2379/portico/config");
        assert_eq!(k.sibling("/x".into()).name(), "etcd://127.0.0.1:2379/x");
        assert!(EtcdKey::parse("http://127.0.0.1:2379/k").is_err());
        assert!(EtcdKey::parse("etcd://127.0.0.1:2379").is_err());
        assert!(EtcdKey::parse("etcd://127.0.0.1:2379/").is_err());
        assert_eq!(
            EtcdKey::parse("etcd://[::1]:2379/k").unwrap().name(),
            "etcd://[::1]:2379/k"
        );
        assert_eq!(
            EtcdKey::parse("etcd://etcd.internal/k").unwrap().name(),
            "etcd://etcd.internal:2379/k"
        );
        // a prefix written with its slash is the same prefix
        assert_eq!(EtcdKey::parse("etcd://h/svc/app/").unwrap().key, "/svc/app");
        assert!(EtcdKey::parse("etcd://h//").is_err());
        assert_eq!(
            EtcdKey::parse("etcds://h:2380/k").unwrap().name(),
            "etcds://h:2380/k"
        );
    }
}
