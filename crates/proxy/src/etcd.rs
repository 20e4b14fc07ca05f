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
        format!("etcd://{}:{}{}", self.host, self.port, self.key)
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
        let revision = kv["mod_revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .or(kv["mod_revision"].as_i64())
            .unwrap_or(0);
        Ok(Some(Document { text, revision }))
    }

    /// Write `value` at the key; the revision of the write.
    pub fn put(&self, value: &str) -> Result<i64, String> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let v = self.call(
            "/v3/kv/put",
            serde_json::json!({ "key": b64.encode(&self.key), "value": b64.encode(value) }),
        )?;
        Ok(v["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .unwrap_or(0))
    }
}

/// Write `text` to `path` whole: a temporary file beside it, synced, renamed over it.
pub fn write_cache(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = crate::runtime::with_suffix(path, ".tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Follow the key: every `interval`, read its revision; a new one is applied as a reload (an
/// invalid document is refused and the running configuration stays), and what became of it is
/// written under `STATUS/INSTANCE` (`status` key), with the revision. Runs on a thread of its own
/// until the control plane is gone.
pub fn follow(
    control: &Arc<Control>,
    key: EtcdKey,
    applied: i64,
    interval: Duration,
    instance: String,
) -> std::io::Result<()> {
    let control = Arc::downgrade(control);
    let status = key.sibling(format!("{}/status/{instance}", key.key));
    std::thread::Builder::new()
        .name("portico-etcd".into())
        .spawn(move || {
            let mut seen = applied;
            let mut failing = false;
            publish(&status, &instance, seen, None);
            loop {
                std::thread::sleep(interval);
                let Some(control) = control.upgrade() else {
                    return;
                };
                if control.is_shutting_down() {
                    return;
                }
                let revision = match key.get() {
                    Ok(Some(d)) => d.revision,
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
                if revision == seen {
                    continue;
                }
                seen = revision;
                // The source reads the key again: the document applied is the newest.
                let error = control.reload("etcd").err().map(|e| e.to_string());
                publish(&status, &instance, revision, error.as_deref());
            }
        })?;
    Ok(())
}

/// Write this instance's state under its status key (errors only logged).
fn publish(status: &EtcdKey, instance: &str, revision: i64, error: Option<&str>) {
    let value = serde_json::json!({
        "instance": instance,
        "version": env!("CARGO_PKG_VERSION"),
        "revision": revision,
        "ok": error.is_none(),
        "error": error,
        "at": crate::telemetry::stats::unix_now(),
    });
    if let Err(e) = status.put(&value.to_string()) {
        tracing::warn!("etcd: cannot write {}: {e}", status.name());
    }
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
        assert!(EtcdKey::parse("etcd://[::1]:2379/k").is_ok());
    }
}
