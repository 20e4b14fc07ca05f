//! Following the configuration key: each new revision applied as a reload, the last good document cached on disk, the instance's lease-bound status key, the fleet read for the admin listener.

use super::client::{fleet_json, EtcdKey, Fleet};
use crate::control::Control;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How long an instance's status key outlives its last renewal (seconds).
const STATUS_TTL: u64 = 15;

/// The first line of a cached document: the key it came from (a comment to TOML).
const CACHE_HEAD: &str = "# portico: the last document applied from ";

/// The key the document cached at `path` came from; None when the file cannot be read or does
/// not say (written by an earlier version).
pub fn cache_source(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let first = text.lines().next()?;
    first.strip_prefix(CACHE_HEAD).map(str::to_string)
}

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

/// Follow the key: watch it, and read its revision after each change the watch reports and
/// every few seconds (every `interval` while etcd fails or cannot be watched); a new one is
/// applied as a reload (an invalid document is refused and the running configuration stays). Each instance keeps a key
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
                if let Err(e) = write_cache(&cache, &format!("{CACHE_HEAD}{}\n{text}", key.name())) {
                    tracing::warn!("cannot cache the configuration at {}: {e}", cache.display());
                }
            };
            if let Some(text) = &first {
                keep(text);
            }
            let mut failing = false;
            let mut gone = false;
            let mut retry = false;
            // The revision of etcd the key was last read at: watches start after it (the
            // document's own revision may be older than etcd's compaction).
            let mut read_at = applied;
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
                    if state.keep(&status, &instance, &control) {
                        see_fleet(&key, &control);
                    }
                }
                // Wait for a change: a watch from the revision applied until the status key
                // is due again, then the key is read (a change the watch missed, behind a
                // gateway that holds the stream back, is seen then). While etcd fails, or a
                // reload is to be tried again, or the watch cannot be had: `interval`.
                let due = state.until_due();
                let watched = match failing || retry || due.is_zero() {
                    true => Err(None),
                    false => key.changed_since(read_at, false, due).map_err(Some),
                };
                if let Err(why) = watched {
                    if let Some(e) = why {
                        tracing::debug!("etcd: no watch ({e}); the key is read every {interval:?}");
                    }
                    std::thread::sleep(interval);
                }
                retry = false;
                let Some(control) = weak.upgrade() else {
                    return;
                };
                if control.is_shutting_down() {
                    return;
                }
                let doc = match key.get_at() {
                    Ok((Some(d), at)) => {
                        read_at = at;
                        if gone {
                            tracing::info!(key = key.name(), "etcd: the configuration key is back");
                            gone = false;
                        }
                        d
                    }
                    Ok((None, at)) => {
                        // Watched as any key: it is read again as soon as it is written.
                        read_at = at;
                        if failing {
                            tracing::info!(key = key.name(), "etcd answers again");
                        }
                        if !gone {
                            tracing::warn!(key = key.name(), "etcd: the configuration key is gone; the running configuration stays");
                        }
                        gone = true;
                        failing = false;
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
                // is tried again after `interval`.
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
                            retry = true;
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
    /// How long until the status key is due again (zero: now, or it could not be written).
    fn until_due(&self) -> Duration {
        self.renewed.map_or(Duration::ZERO, |r| {
            Duration::from_secs(STATUS_TTL / 3).saturating_sub(r.elapsed())
        })
    }

    /// Write the status key when it is due (every third of its lease) or changed, with a new
    /// lease when etcd forgot the old one (errors logged at debug level: the follower logs
    /// etcd being unreachable). Whether it was due.
    fn keep(&mut self, key: &EtcdKey, instance: &str, control: &Control) -> bool {
        let due = self
            .renewed
            .is_none_or(|r| r.elapsed() >= Duration::from_secs(STATUS_TTL / 3));
        if !due {
            return false;
        }
        // A new lease each time (the gateway's keep-alive is a stream, which one request
        // cannot use): the key moves to it, and the old one, holding nothing, expires.
        self.lease = key.grant(STATUS_TTL).ok();
        let shared = control.snapshot();
        let listeners: serde_json::Map<String, serde_json::Value> = control
            .addrs()
            .into_iter()
            .map(|(name, a)| (name, a.to_string().into()))
            .collect();
        // Servers of every group, and those a request may go to now (not down, ejected,
        // draining or disabled).
        let now = std::time::Instant::now();
        let (mut servers, mut usable) = (0, 0);
        for u in &shared.upstreams {
            for s in u.status(now) {
                servers += 1;
                usable += usize::from(s.effective_weight > 0);
            }
        }
        let value = serde_json::json!({
            "instance": instance,
            "host": host_name(),
            "listeners": listeners,
            "servers": servers,
            "servers_usable": usable,
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
        true
    }
}

/// Read the fleet for the admin API: the view kept as it was, with the error, when the read
/// fails.
fn see_fleet(key: &EtcdKey, control: &Control) {
    let view = match Fleet::read(key) {
        Ok(f) => fleet_json(&f),
        Err(e) => {
            let mut v = control
                .fleet_view()
                .unwrap_or_else(|| serde_json::json!({ "key": key.name(), "members": [] }));
            v["error"] = e.into();
            v
        }
    };
    control.set_fleet_view(view);
}

/// This machine's name (`/proc/sys/kernel/hostname`), or "?".
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// Where the last good document from etcd is kept by default.
pub fn default_cache() -> PathBuf {
    PathBuf::from("/var/lib/portico/config-cache.toml")
}
