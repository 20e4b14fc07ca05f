//! The keys JWT checks verify with: a JWK set file read again when it changes, or a URL fetched at start, on a timer and when a token names an unknown key, the last good set kept when a fetch fails.

use crate::cert_watch::{stamps, Stamp};
use crate::telemetry::stats::Stats;
use arc_swap::ArcSwapOption;
use portico_config::jwks::{KeySet, KeysUrl};
use portico_config::JwtKeys;
use std::collections::HashMap;
use std::io::{Read, Write};
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
            let loopback = KeysUrl::parse(url).is_ok_and(|u| {
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
                let fetched = KeysUrl::parse(url)
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

/// [`fetch`] on a thread of its own, waited for at most the fetch timeout (and a second): a
/// name lookup that hangs is left to end by itself, and the watcher goes on.
fn fetch_bounded(url: KeysUrl) -> Result<String, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let host = url.host.clone();
    std::thread::Builder::new()
        .name("portico-jwks".into())
        .spawn(move || {
            let _ = tx.send(fetch(&url));
        })
        .map_err(|e| format!("cannot start a fetch thread: {e}"))?;
    rx.recv_timeout(FETCH_TIMEOUT + Duration::from_secs(1))
        .unwrap_or_else(|_| Err(format!("{host}: no answer within {FETCH_TIMEOUT:?}")))
}

/// GET a JWK set document over HTTP/1.0 (no chunked answer, the end is the close), within
/// `FETCH_TIMEOUT`; the body of a 200.
fn fetch(url: &KeysUrl) -> Result<String, String> {
    use std::net::ToSocketAddrs;
    let deadline = Instant::now() + FETCH_TIMEOUT;
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let addrs: Vec<_> = (url.host.as_str(), url.port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {}: {e}", url.host))?
        .collect();
    let mut last = format!("{} has no address", url.host);
    let mut tcp = None;
    for a in addrs {
        match std::net::TcpStream::connect_timeout(&a, left()) {
            Ok(s) => {
                tcp = Some(s);
                break;
            }
            Err(e) => last = format!("cannot connect to {a}: {e}"),
        }
    }
    let tcp = tcp.ok_or(last)?;
    tcp.set_read_timeout(Some(left()))
        .map_err(|e| e.to_string())?;
    tcp.set_write_timeout(Some(left()))
        .map_err(|e| e.to_string())?;
    // Each read waits at most what is left of the fetch's time.
    let ctl = tcp.try_clone().map_err(|e| e.to_string())?;
    let before_read = || -> std::io::Result<()> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        ctl.set_read_timeout(Some(left))
    };
    let host = match url.host.contains(':') {
        true => format!("[{}]", url.host),
        false => url.host.clone(),
    };
    let default_port = if url.https { 443 } else { 80 };
    let authority = match url.port == default_port {
        true => host,
        false => format!("{host}:{}", url.port),
    };
    let request = format!(
        "GET {} HTTP/1.0\r\nHost: {authority}\r\nAccept: application/jwk-set+json, application/json\r\nUser-Agent: portico\r\n\r\n",
        url.target
    );
    let mut answer = Vec::new();
    let io = |e: std::io::Error| format!("{}: {e}", url.host);
    if url.https {
        let mut conn = tls_client(&url.host)?;
        let mut tcp = tcp;
        let mut s = tokio_rustls::rustls::Stream::new(&mut conn, &mut tcp);
        s.write_all(request.as_bytes()).map_err(io)?;
        read_answer(&mut s, &mut answer, &before_read).map_err(io)?;
    } else {
        let mut tcp = tcp;
        tcp.write_all(request.as_bytes()).map_err(io)?;
        read_answer(&mut tcp, &mut answer, &before_read).map_err(io)?;
    }
    body_of(&answer)
}

/// Read the answer: to its `Content-Length` when the head gives one, else until the server
/// closes (a TLS close without close_notify ends it too: the document is checked whole by the
/// parser).
/// `before_read` runs before each read (it bounds the wait, or ends the answer with an error).
fn read_answer(
    r: &mut impl Read,
    out: &mut Vec<u8>,
    before_read: &dyn Fn() -> std::io::Result<()>,
) -> std::io::Result<()> {
    let limit = (MAX_DOCUMENT + 16 * 1024) as usize;
    let mut chunk = [0u8; 16 * 1024];
    while out.len() < limit && !complete(out) {
        before_read()?;
        match r.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !out.is_empty() => break,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Whether `answer` holds a whole head with a `Content-Length` and that many body bytes.
fn complete(answer: &[u8]) -> bool {
    let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&answer[..end]);
    let length = head.split("\r\n").find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse::<usize>().ok())?
    });
    length.is_some_and(|n| answer.len() >= end + 4 + n)
}

/// A TLS client session to `host`, verified against the system's roots.
fn tls_client(host: &str) -> Result<tokio_rustls::rustls::ClientConnection, String> {
    let settings = portico_config::UpstreamTls {
        ca_file: None,
        server_name: Some(host.to_string()),
        certificate: None,
        verify: true,
        versions: vec![
            portico_config::TlsVersion::Tls12,
            portico_config::TlsVersion::Tls13,
        ],
        session_cache: 0,
    };
    let o = portico_tls::client_config(&settings, &portico_tls::ClientSessions::new(0))
        .map_err(|e| e.to_string())?;
    let name = tokio_rustls::rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| format!("{host}: {e}"))?;
    tokio_rustls::rustls::ClientConnection::new(o.config, name).map_err(|e| e.to_string())
}

/// The body of a 200 answer (to `Content-Length` when it says).
fn body_of(answer: &[u8]) -> Result<String, String> {
    let end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("the answer has no complete head")?;
    let head = std::str::from_utf8(&answer[..end]).map_err(|_| "the answer's head is not text")?;
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap_or_default();
    let code = status.split(' ').nth(1).unwrap_or_default();
    if !status.starts_with("HTTP/1.") || code != "200" {
        return Err(format!("answered {status:?}"));
    }
    let mut body = &answer[end + 4..];
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(format!("a {value} answer to an HTTP/1.0 request"));
        }
        if name.eq_ignore_ascii_case("content-length") {
            let n: usize = value.parse().map_err(|_| "a bad Content-Length")?;
            body = body
                .get(..n)
                .ok_or("the answer ended before its Content-Length")?;
        }
    }
    if body.len() as u64 > MAX_DOCUMENT {
        return Err(format!("the document is larger than {MAX_DOCUMENT} bytes"));
    }
    String::from_utf8(body.to_vec()).map_err(|_| "the document is not UTF-8".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_with_a_length_is_complete_without_the_close() {
        assert!(!complete(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{"));
        assert!(complete(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"));
        assert!(!complete(b"HTTP/1.1 200 OK\r\n\r\n{}"));
        let mut out = Vec::new();
        let mut r = &b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nxyz"[..];
        read_answer(&mut r, &mut out, &|| Ok(())).unwrap();
        assert_eq!(body_of(&out).unwrap(), "x");
    }

    #[test]
    fn a_trickled_answer_ends_when_its_time_is_up() {
        // A reader that hands one byte per read and never ends.
        struct Trickle;
        impl Read for Trickle {
            fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
                b[0] = b'x';
                Ok(1)
            }
        }
        let reads = std::cell::Cell::new(0);
        let mut out = Vec::new();
        let e = read_answer(&mut Trickle, &mut out, &|| {
            reads.set(reads.get() + 1);
            match reads.get() > 100 {
                true => Err(std::io::ErrorKind::TimedOut.into()),
                false => Ok(()),
            }
        })
        .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert_eq!(out.len(), 100);
    }

    #[test]
    fn the_body_of_a_200_is_taken_to_its_length() {
        let a = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}xx";
        assert_eq!(body_of(a).unwrap(), "{}");
        let a = b"HTTP/1.0 200 OK\r\n\r\n{\"keys\":[]}";
        assert_eq!(body_of(a).unwrap(), "{\"keys\":[]}");
        assert!(body_of(b"HTTP/1.1 404 Not Found\r\n\r\n")
            .unwrap_err()
            .contains("404"));
        assert!(body_of(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}").is_err());
        assert!(body_of(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}").is_err());
        assert!(body_of(b"HTTP/1.1 200 OK\r\n").is_err());
    }
}
