//! The keys JWT checks verify with: a JWK set file read again when it changes, or a URL fetched at start, on a timer and when a token names an unknown key, the last good set kept when a fetch fails.

use crate::cert_watch::{stamps, Stamp};
use crate::telemetry::stats::Stats;
use arc_swap::ArcSwapOption;
use portico_config::jwks::KeySet;
use portico_config::HttpUrl;
use portico_config::JwtKeys;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a JWK set file is looked at.
const FILE_EVERY: Duration = Duration::from_secs(1);
/// The longest one fetch of a JWK set URL may take (connect, TLS, answer).
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest JWK set document taken.
const MAX_DOCUMENT: u64 = 1 << 20;
/// The soonest a token naming an unknown key makes the URL be fetched again (or `refresh`,
/// when shorter).
pub(crate) const MIN_REFETCH: Duration = Duration::from_secs(30);
/// The first wait after a failed fetch (doubled after each failure, at most `refresh`).
const FIRST_BACKOFF: Duration = Duration::from_secs(1);

/// A key set in use, with a number no other loaded set has (passes cached under an older
/// number are checked again).
pub(crate) struct Loaded {
    pub set: KeySet,
    pub generation: u64,
}

/// Where one configuration's keys come from, shared by the routes that name the same file or
/// URL and kept across reloads while the configuration still names it.
pub(crate) struct KeySource {
    origin: JwtKeys,
    keys: ArcSwapOption<Loaded>,
    /// A token named a key the set lacks: fetch again (no sooner than `MIN_REFETCH`).
    wanted: AtomicBool,
    watch: Mutex<Watch>,
}

struct Watch {
    stamp: Vec<Stamp>,
    next: Instant,
    last_fetch: Option<Instant>,
    backoff: Duration,
}

static GENERATION: AtomicU64 = AtomicU64::new(1);

impl KeySource {
    /// A source with nothing loaded yet.
    fn new(origin: JwtKeys) -> KeySource {
        if let JwtKeys::Url { url, .. } = &origin {
            let loopback = HttpUrl::parse(url).is_ok_and(|u| {
                u.host == "localhost"
                    || u.host
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback())
            });
            if url.starts_with("http://") && !loopback {
                tracing::warn!("JWK set {url} is fetched over plain HTTP: whoever is on the path can give Portico keys; use https");
            }
        }
        KeySource {
            origin,
            keys: ArcSwapOption::empty(),
            wanted: AtomicBool::new(false),
            watch: Mutex::new(Watch {
                stamp: Vec::new(),
                next: Instant::now(),
                last_fetch: None,
                backoff: FIRST_BACKOFF,
            }),
        }
    }

    /// The keys in use; None until a set was loaded.
    #[inline]
    pub(crate) fn keys(&self) -> Option<Arc<Loaded>> {
        self.keys.load_full()
    }

    /// A token named a key the set does not have: the next check fetches the URL again (a
    /// file is read again only when it changes).
    pub(crate) fn want_refresh(&self) {
        if matches!(self.origin, JwtKeys::Url { .. }) {
            self.wanted.store(true, Ordering::Relaxed);
        }
    }

    fn name(&self) -> String {
        match &self.origin {
            JwtKeys::File(p) => p.display().to_string(),
            JwtKeys::Url { url, .. } => url.clone(),
        }
    }

    /// Load the keys if due: a file when it changed, a URL every `refresh`, after a failure
    /// with backoff, or when a token wanted an unknown key. A set that cannot be read or
    /// parsed keeps the current one. Returns how long until the next check is due.
    pub(crate) fn check(&self, now: Instant, stats: &Stats) -> Duration {
        let mut w = self.watch.lock().unwrap_or_else(|e| e.into_inner());
        match &self.origin {
            JwtKeys::File(path) => {
                if now < w.next {
                    return w.next - now;
                }
                w.next = now + FILE_EVERY;
                let stamp = stamps(std::slice::from_ref(path));
                if stamp == w.stamp {
                    return FILE_EVERY;
                }
                w.stamp = stamp;
                drop(w);
                let read = std::fs::read_to_string(path)
                    .map_err(|e| e.to_string())
                    .and_then(|text| KeySet::parse(&text));
                self.take(read, stats);
                FILE_EVERY
            }
            JwtKeys::Url { url, refresh } => {
                let wanted = self.wanted.load(Ordering::Relaxed)
                    && w.last_fetch
                        .is_none_or(|t| now >= t + MIN_REFETCH.min(*refresh));
                if now < w.next && !wanted {
                    return (w.next - now).min(crate::cert_watch::MAX_TICK);
                }
                self.wanted.store(false, Ordering::Relaxed);
                w.last_fetch = Some(now);
                let fetched = HttpUrl::parse(url)
                    .and_then(fetch_bounded)
                    .and_then(|text| KeySet::parse(&text));
                let ok = self.take(fetched, stats);
                if ok {
                    w.backoff = FIRST_BACKOFF;
                    w.next = now + *refresh;
                } else {
                    w.next = now + w.backoff;
                    w.backoff = (w.backoff * 2).min(*refresh);
                }
                (w.next - now).min(crate::cert_watch::MAX_TICK)
            }
        }
    }

    /// Put a loaded set in use, or log why it was not. Whether it was.
    fn take(&self, loaded: Result<KeySet, String>, stats: &Stats) -> bool {
        let url = matches!(self.origin, JwtKeys::Url { .. });
        if url {
            stats.jwks_fetches.fetch_add(1, Ordering::Relaxed);
        }
        match loaded {
            Ok(set) => {
                let n = set.keys.len();
                let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
                let first = self.keys.swap(Some(Arc::new(Loaded { set, generation })));
                match first {
                    None => tracing::info!(keys = n, "JWK set {} loaded", self.name()),
                    Some(_) => tracing::info!(keys = n, "JWK set {} changed: loaded", self.name()),
                }
                true
            }
            Err(e) => {
                stats.jwks_failures.fetch_add(1, Ordering::Relaxed);
                let kept = match self.keys.load().is_some() {
                    true => "the keys loaded before stay in use",
                    false => "no keys yet: tokens are refused with 503",
                };
                tracing::warn!("JWK set {} not loaded ({kept}): {e}", self.name());
                false
            }
        }
    }
}

/// The key sources of one configuration, reusing the previous configuration's for the files
/// and URLs it still names.
#[derive(Default)]
pub(crate) struct KeySources {
    sources: HashMap<JwtKeys, Arc<KeySource>>,
}

impl KeySources {
    /// The sources of a new configuration: `get` takes from `self` (the previous one's).
    pub(crate) fn next(&self) -> NextSources<'_> {
        NextSources {
            previous: self,
            sources: KeySources::default(),
        }
    }
}

/// Key sources being gathered for a new configuration.
pub(crate) struct NextSources<'p> {
    previous: &'p KeySources,
    sources: KeySources,
}

impl NextSources<'_> {
    /// The source of `keys`: the previous configuration's, else a new one (loaded by `finish`).
    pub(crate) fn get(&mut self, keys: &JwtKeys) -> Arc<KeySource> {
        if let Some(s) = self.sources.sources.get(keys) {
            return s.clone();
        }
        let s = self
            .previous
            .sources
            .get(keys)
            .cloned()
            .unwrap_or_else(|| Arc::new(KeySource::new(keys.clone())));
        self.sources.sources.insert(keys.clone(), s.clone());
        s
    }

    /// Load the sources that have no keys yet (URLs fetched side by side, each within the
    /// fetch timeout), and return the set to keep.
    pub(crate) fn finish(self, stats: &Stats) -> KeySources {
        let empty: Vec<&Arc<KeySource>> = self
            .sources
            .sources
            .values()
            .filter(|s| s.keys().is_none())
            .collect();
        std::thread::scope(|scope| {
            for s in empty {
                scope.spawn(move || s.check(Instant::now(), stats));
            }
        });
        self.sources
    }
}

/// GET the JWK set document on a thread of its own, within [`FETCH_TIMEOUT`]: the body of a
/// 200, as text.
fn fetch_bounded(url: HttpUrl) -> Result<String, String> {
    let headers = [("Accept", "application/jwk-set+json, application/json")];
    let answer = crate::blocking_http::request_bounded(
        url,
        "GET",
        &headers,
        Vec::new(),
        FETCH_TIMEOUT,
        MAX_DOCUMENT as usize,
    )?;
    if answer.status != 200 {
        return Err(format!("answered {}", answer.status));
    }
    String::from_utf8(answer.body).map_err(|_| "the document is not UTF-8".to_string())
}
