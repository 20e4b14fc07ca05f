//! Listener certificates reloaded without a restart: a swappable TLS configuration per listener and the stamps of its files (the thread that polls them is in `server`).

use crate::telemetry::stats::Stats;
use arc_swap::ArcSwap;
use portico_config::TlsSettings;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// The longest the watcher sleeps, so listeners added by a reload are looked at soon.
pub(crate) const MAX_TICK: Duration = Duration::from_secs(1);

/// What identifies a file's content cheaply: modification time, size and inode (a rename over
/// the file, as certificate tools do, changes the inode). None = the file cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp(Option<(SystemTime, u64, u64)>);

/// The stamps of `paths`, in order.
pub fn stamps(paths: &[PathBuf]) -> Vec<Stamp> {
    paths.iter().map(stamp).collect()
}

fn stamp(path: &PathBuf) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    Stamp(
        std::fs::metadata(path)
            .ok()
            .and_then(|m| Some((m.modified().ok()?, m.len(), m.ino()))),
    )
}

/// TLS termination of one listener in one configuration snapshot: the rustls configuration new
/// handshakes use, replaced when the watcher sees changed files that load correctly. Open
/// connections keep the configuration they were accepted with.
pub struct ListenerTls {
    name: String,
    settings: TlsSettings,
    /// Shared with the listener's earlier and later configurations: a swap keeps resuming.
    resumption: portico_tls::Resumption,
    /// Offer ALPN `h2` (the listener serves HTTP/2).
    http2: bool,
    config: ArcSwap<tokio_rustls::rustls::ServerConfig>,
    watch: Mutex<WatchState>,
}

struct WatchState {
    /// The stamps of `files()` when they were last loaded (or refused).
    stamps: Vec<Stamp>,
    next_check: Instant,
}

impl ListenerTls {
    /// Load the listener's files and build its configuration (an error names the file); `http2`
    /// adds `h2` to the ALPN list.
    pub fn new(
        name: &str,
        settings: &TlsSettings,
        resumption: portico_tls::Resumption,
        http2: bool,
    ) -> Result<ListenerTls, portico_tls::TlsError> {
        // Stamps first: a change while the files are read is seen by the next check.
        let stamps = files(settings).iter().map(stamp).collect();
        let config = portico_tls::server_config(settings, &resumption)?;
        let config = portico_tls::with_alpn(config, http2);
        Ok(ListenerTls {
            name: name.to_string(),
            settings: settings.clone(),
            resumption,
            http2,
            config: ArcSwap::new(config),
            watch: Mutex::new(WatchState {
                stamps,
                next_check: Instant::now() + settings.watch.unwrap_or(MAX_TICK),
            }),
        })
    }

    /// The acceptor for a new connection: one atomic load of the current configuration.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config.load_full())
    }

    /// The configuration new handshakes use now (HTTP/3 builds its QUIC one from it).
    pub(crate) fn config(&self) -> std::sync::Arc<tokio_rustls::rustls::ServerConfig> {
        self.config.load_full()
    }

    /// If the watch interval has passed and a file changed since it was last loaded, load the
    /// files again: a good set replaces the configuration, a bad one is refused with a log line
    /// and the current one stays (it is tried again when the files change again). Returns how
    /// long until the next check is due (None when the listener is not watched).
    pub fn check(&self, now: Instant, stats: &Stats) -> Option<Duration> {
        let every = self.settings.watch?;
        let mut state = self.watch.lock().unwrap_or_else(|e| e.into_inner());
        if now < state.next_check {
            return Some(state.next_check - now);
        }
        state.next_check = now + every;
        let stamps: Vec<Stamp> = files(&self.settings).iter().map(stamp).collect();
        if stamps == state.stamps {
            return Some(every);
        }
        state.stamps = stamps;
        match portico_tls::server_config(&self.settings, &self.resumption) {
            Ok(config) => {
                self.config
                    .store(portico_tls::with_alpn(config, self.http2));
                stats
                    .tls_certificate_reloads
                    .fetch_add(1, Ordering::Relaxed);
                tracing::info!(listener = %self.name, "TLS certificates changed on disk: loaded; new handshakes use them");
            }
            Err(e) => {
                stats
                    .tls_certificate_reload_failures
                    .fetch_add(1, Ordering::Relaxed);
                tracing::error!(listener = %self.name, "TLS certificate files changed but are refused, the previous certificates stay: {e}");
            }
        }
        Some(every)
    }
}

/// The files a listener's TLS configuration is built from.
fn files(settings: &TlsSettings) -> Vec<PathBuf> {
    settings
        .certificates
        .iter()
        .flat_map(|c| [c.cert.clone(), c.key.clone()])
        .chain(settings.client_auth.iter().map(|a| a.ca.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use portico_config::{CertificateFiles, TlsVersion};
    use std::sync::Arc;

    fn write_pair(files: &CertificateFiles) {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        for (path, text) in [(&files.key, key.serialize_pem()), (&files.cert, cert.pem())] {
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, text).unwrap();
            std::fs::rename(&tmp, path).unwrap();
        }
    }

    fn listener(name: &str, watch: Option<Duration>) -> (ListenerTls, CertificateFiles) {
        let dir = std::env::temp_dir().join(format!("portico-watch-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let files = CertificateFiles {
            cert: dir.join("c.pem"),
            key: dir.join("c.key"),
        };
        write_pair(&files);
        let settings = TlsSettings {
            certificates: vec![files.clone()],
            versions: vec![TlsVersion::Tls13],
            cipher_suites: None,
            groups: None,
            session_tickets: true,
            session_cache: 16,
            client_auth: None,
            watch,
            acme_alpn: false,
            refuse_stand_in: false,
        };
        let tls = ListenerTls::new(name, &settings, portico_tls::Resumption::new(), false).unwrap();
        (tls, files)
    }

    #[test]
    fn changed_files_swap_the_configuration_only_when_due_and_valid() {
        let every = Duration::from_secs(5);
        let (tls, files) = listener("due", Some(every));
        let stats = Stats::default();
        let first = tls.config.load_full();
        let now = Instant::now();
        write_pair(&files);
        // Not due yet: nothing read.
        assert!(tls.check(now, &stats).is_some_and(|d| d <= every));
        assert!(Arc::ptr_eq(&first, &tls.config.load_full()));
        // Due: the change is seen and loaded.
        let later = now + 2 * every;
        assert_eq!(tls.check(later, &stats), Some(every));
        let second = tls.config.load_full();
        assert!(!Arc::ptr_eq(&first, &second));
        assert_eq!(stats.tls_certificate_reloads.load(Ordering::Relaxed), 1);
        // Unchanged files: no rebuild.
        tls.check(later + every, &stats);
        assert!(Arc::ptr_eq(&second, &tls.config.load_full()));
        // A broken key is refused once (not again until the files change) and the config stays.
        std::fs::write(&files.key, "junk").unwrap();
        tls.check(later + 2 * every, &stats);
        tls.check(later + 3 * every, &stats);
        assert!(Arc::ptr_eq(&second, &tls.config.load_full()));
        assert_eq!(
            stats
                .tls_certificate_reload_failures
                .load(Ordering::Relaxed),
            1
        );
        assert_eq!(stats.tls_certificate_reloads.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn unwatched_listener_never_reads_its_files_again() {
        let (tls, files) = listener("off", None);
        let stats = Stats::default();
        let first = tls.config.load_full();
        write_pair(&files);
        assert_eq!(
            tls.check(Instant::now() + Duration::from_secs(3600), &stats),
            None
        );
        assert!(Arc::ptr_eq(&first, &tls.config.load_full()));
    }
}
