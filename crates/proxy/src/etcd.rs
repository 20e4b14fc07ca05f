//! The configuration document in etcd: read and written through etcd's v3 JSON API (its gRPC gateway), the key asked again on an interval, each new revision applied as a reload, the last good document cached on disk.

use crate::control::Control;
use base64::Engine;
use portico_config::HttpUrl;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How long one request to etcd may take.
const TIMEOUT: Duration = Duration::from_secs(3);
/// Largest document accepted (etcd's own default request limit is 1.5 MiB).
const MAX_DOCUMENT: usize = 2 * 1024 * 1024;

/// A key in etcd: `etcd://HOST:PORT/KEY` (the key is the path, its leading `/` included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdKey {
    host: String,
    port: u16,
    pub key: String,
}

/// A document read from etcd, and the revision that last changed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    pub text: String,
    pub revision: i64,
}

impl EtcdKey {
    /// `etcd://HOST:PORT/KEY`.
    pub fn parse(text: &str) -> Result<EtcdKey, String> {
        let usage = "expected etcd://HOST:PORT/KEY, e.g. etcd://127.0.0.1:2379/portico/config";
        let rest = text
            .strip_prefix("etcd://")
            .ok_or_else(|| format!("{text:?}: {usage}"))?;
        let (authority, key) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => return Err(format!("{text:?} names no key: {usage}")),
        };
        if key.len() < 2 {
            return Err(format!("{text:?} names no key: {usage}"));
        }
        // etcd's client port unless one is given
        let has_port = match authority.rfind(']') {
            Some(close) => authority[close..].contains(':'),
            None => authority.contains(':'),
        };
        let authority = match has_port {
            true => authority.to_string(),
            false => format!("{authority}:2379"),
        };
        let url = HttpUrl::parse(&format!("http://{authority}/"))
            .map_err(|e| format!("{text:?}: {e}; {usage}"))?;
        Ok(EtcdKey {
            host: url.host,
            port: url.port,
            key: key.to_string(),
        })
    }

    /// The name documents from this key carry in error messages (`etcd://HOST:PORT/KEY`).
    pub fn name(&self) -> String {
        match self.host.contains(':') {
            true => format!("etcd://[{}]:{}{}", self.host, self.port, self.key),
            false => format!("etcd://{}:{}{}", self.host, self.port, self.key),
        }
    }

    /// This key with another key path (on the same server).
    pub fn sibling(&self, key: String) -> EtcdKey {
        EtcdKey {
            key,
            ..self.clone()
        }
    }

    fn call(&self, path: &str, body: serde_json::Value) -> Result<serde_json::Value, String> {
        let url = HttpUrl {
            https: false,
            host: self.host.clone(),
            port: self.port,
            target: path.to_string(),
        };
        let body = body.to_string().into_bytes();
        let headers = [("Content-Type", "application/json")];
        // On a thread of its own, waited for at most TIMEOUT and a second: a call that hangs
        // (a name lookup) does not stop the follower.
        let a = crate::blocking_http::request_bounded(
            url,
            "POST",
            &headers,
            body,
            TIMEOUT,
            MAX_DOCUMENT * 2,
        )
        .map_err(|e| format!("etcd {}:{}: {e}", self.host, self.port))?;
        let v: serde_json::Value = serde_json::from_slice(&a.body).map_err(|e| {
            format!(
                "etcd {}:{}: HTTP {}, not JSON: {e}",
                self.host, self.port, a.status
            )
        })?;
        if a.status != 200 {
            let why = v["message"].as_str().or(v["error"].as_str()).unwrap_or("");
            return Err(format!(
                "etcd {}:{}: HTTP {} {why}",
                self.host, self.port, a.status
            ));
        }
        Ok(v)
    }

    /// The document at the key (None when the key does not exist).
    pub fn get(&self) -> Result<Option<Document>, String> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let v = self.call(
            "/v3/kv/range",
            serde_json::json!({ "key": b64.encode(&self.key) }),
        )?;
        let Some(kv) = v["kvs"].as_array().and_then(|k| k.first()) else {
            return Ok(None);
        };
        let value = b64
            .decode(kv["value"].as_str().unwrap_or(""))
            .map_err(|e| format!("{}: the value is not base64: {e}", self.name()))?;
        let text = String::from_utf8(value)
            .map_err(|_| format!("{}: the document is not UTF-8", self.name()))?;
        // The gateway writes 64-bit integers as strings.
        let revision = int(&kv["mod_revision"]);
        Ok(Some(Document { text, revision }))
    }

    /// Write `value` at the key; the revision of the write.
    pub fn put(&self, value: &str) -> Result<i64, String> {
        self.put_leased(value, None)
    }

    /// Write `value` at the key, bound to `lease` when given (the key goes with the lease).
    fn put_leased(&self, value: &str, lease: Option<i64>) -> Result<i64, String> {
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
    fn grant(&self, ttl: u64) -> Result<i64, String> {
        let v = self.call(
            "/v3/lease/grant",
            serde_json::json!({ "TTL": ttl.to_string() }),
        )?;
        match int(&v["ID"]) {
            0 => Err(format!(
                "etcd {}:{}: no lease granted",
                self.host, self.port
            )),
            id => Ok(id),
        }
    }

    /// Every key under this one (`KEY/...`) with its value, in key order.
    pub fn list(&self) -> Result<Vec<(String, String)>, String> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let prefix = format!("{}/", self.key);
        let mut end = prefix.clone().into_bytes();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let v = self.call(
            "/v3/kv/range",
            serde_json::json!({ "key": b64.encode(&prefix), "range_end": b64.encode(&end) }),
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
        Ok(out)
    }
}

/// A 64-bit integer of the gateway's JSON (written as a string), or 0.
fn int(v: &serde_json::Value) -> i64 {
    v.as_str()
        .and_then(|r| r.parse().ok())
        .or(v.as_i64())
        .unwrap_or(0)
}

/// How long an instance's status key outlives its last renewal (seconds).
const STATUS_TTL: u64 = 15;

/// Write `text` to `path` whole: its directory made if missing, a temporary file of this
/// process beside it (readable by its owner only: a document may hold credentials), synced,
/// renamed over it, the directory synced.
pub fn write_cache(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = crate::runtime::with_suffix(path, &format!(".{}.tmp", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// Follow the key: every `interval`, read its revision; a new one is applied as a reload (an
/// invalid document is refused and the running configuration stays). Each instance keeps a key
/// `KEY/status/INSTANCE` bound to a lease of its own, renewed every few seconds: what became of
/// the last revision, and a small snapshot of its state; it goes with the instance. Runs on a
/// thread of its own until the control plane is gone or stops. Each document applied (`first`,
/// the one applied at start, then each new revision) is written to `cache` on this thread, after
/// it is applied: a slow disk never holds a reload.
pub fn follow(
    control: &Arc<Control>,
    key: EtcdKey,
    applied: i64,
    interval: Duration,
    instance: String,
    cache: PathBuf,
    first: Option<String>,
) -> std::io::Result<()> {
    let weak = Arc::downgrade(control);
    let status = key.sibling(format!("{}/status/{instance}", key.key));
    std::thread::Builder::new()
        .name("portico-etcd".into())
        .spawn(move || {
            let keep = |text: &str| {
                if let Err(e) = write_cache(&cache, text) {
                    tracing::warn!("cannot cache the configuration at {}: {e}", cache.display());
                }
            };
            if let Some(text) = &first {
                keep(text);
            }
            let mut failing = false;
            let mut state = Status {
                lease: None,
                renewed: None,
                revision: applied,
                error: None,
            };
            loop {
                {
                    let Some(control) = weak.upgrade() else {
                        return;
                    };
                    if control.is_shutting_down() {
                        return;
                    }
                    state.keep(&status, &instance, &control);
                }
                std::thread::sleep(interval);
                let Some(control) = weak.upgrade() else {
                    return;
                };
                if control.is_shutting_down() {
                    return;
                }
                let doc = match key.get() {
                    Ok(Some(d)) => d,
                    Ok(None) => {
                        if !failing {
                            tracing::warn!(key = key.name(), "etcd: the configuration key is gone; the running configuration stays");
                        }
                        failing = true;
                        continue;
                    }
                    Err(e) => {
                        if !failing {
                            tracing::warn!("etcd unreachable ({e}); the running configuration stays, asked again every {interval:?}");
                        }
                        failing = true;
                        continue;
                    }
                };
                if failing {
                    tracing::info!(key = key.name(), "etcd answers again");
                    failing = false;
                }
                if doc.revision == state.revision {
                    continue;
                }
                // The source reads the key again: the document applied is the newest. A
                // document refused (its errors name the key) is not asked again until it
                // changes; a reload that failed otherwise (etcd gone meanwhile, a port taken)
                // is tried again at the next poll.
                match control.reload("etcd") {
                    Ok(_) => {
                        state.error = None;
                        // What the reload read may be newer: the next poll sees it, and
                        // caches it in its turn.
                        keep(&doc.text);
                    }
                    Err(e) => {
                        let e = e.to_string();
                        if !e.starts_with(&key.name()) {
                            continue;
                        }
                        state.error = Some(e);
                    }
                }
                state.revision = doc.revision;
                // published now, not at the next renewal
                state.renewed = None;
            }
        })?;
    Ok(())
}

/// An instance's status key: the lease it is bound to, when it was last written, what it says.
struct Status {
    lease: Option<i64>,
    renewed: Option<std::time::Instant>,
    revision: i64,
    error: Option<String>,
}

impl Status {
    /// Write the status key when it is due (every third of its lease) or changed, with a new
    /// lease when etcd forgot the old one (errors logged at debug level: the follower logs
    /// etcd being unreachable).
    fn keep(&mut self, key: &EtcdKey, instance: &str, control: &Control) {
        let due = self
            .renewed
            .is_none_or(|r| r.elapsed() >= Duration::from_secs(STATUS_TTL / 3));
        if !due {
            return;
        }
        // A new lease each time (the gateway's keep-alive is a stream, which one request
        // cannot use): the key moves to it, and the old one, holding nothing, expires.
        self.lease = key.grant(STATUS_TTL).ok();
        let shared = control.snapshot();
        let value = serde_json::json!({
            "instance": instance,
            "version": env!("CARGO_PKG_VERSION"),
            "pid": std::process::id(),
            "revision": self.revision,
            "ok": self.error.is_none(),
            "error": self.error,
            "generation": shared.generation,
            "requests": shared.stats.requests.load(std::sync::atomic::Ordering::Relaxed),
            "uptime_seconds": control.started.elapsed().as_secs(),
            "at": crate::telemetry::stats::unix_now(),
        });
        match key.put_leased(&value.to_string(), self.lease) {
            Ok(_) => self.renewed = Some(std::time::Instant::now()),
            Err(e) => {
                self.lease = None;
                tracing::debug!("etcd: cannot write {}: {e}", key.name());
            }
        }
    }
}

/// The fleet as its instances' status keys under `key` say: one line per instance (its name,
/// version, the configuration revision it applied or refused, its requests and uptime), then
/// the key's own revision and how many instances do not run it.
pub fn fleet_status(key: &EtcdKey) -> Result<String, String> {
    use std::fmt::Write;
    let current = key.get()?.map(|d| d.revision);
    let prefix = format!("{}/status/", key.key);
    let mut out = String::new();
    let mut behind = 0;
    let mut n = 0;
    let _ = writeln!(
        out,
        "{:<28} {:<8} {:>9} {:<6} {:>12} {:>9}  error",
        "instance", "version", "revision", "ok", "requests", "uptime"
    );
    for (k, v) in key.list()? {
        if !k.starts_with(&prefix) {
            continue;
        }
        let Ok(s) = serde_json::from_str::<serde_json::Value>(&v) else {
            continue;
        };
        n += 1;
        let revision = s["revision"].as_i64().unwrap_or(0);
        let ok = s["ok"].as_bool().unwrap_or(false);
        if Some(revision) != current || !ok {
            behind += 1;
        }
        let _ = writeln!(
            out,
            "{:<28} {:<8} {:>9} {:<6} {:>12} {:>8}s  {}",
            s["instance"].as_str().unwrap_or("?"),
            s["version"].as_str().unwrap_or("?"),
            revision,
            ok,
            s["requests"].as_u64().unwrap_or(0),
            s["uptime_seconds"].as_u64().unwrap_or(0),
            s["error"].as_str().unwrap_or("")
        );
    }
    let _ = writeln!(
        out,
        "{n} instance(s); the configuration key is at revision {}; {behind} instance(s) not running it",
        current.map_or("(none)".to_string(), |r| r.to_string())
    );
    Ok(out)
}

/// Where the last good document from etcd is kept by default.
pub fn default_cache() -> PathBuf {
    PathBuf::from("/var/lib/portico/config-cache.toml")
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
