//! A background refresh of a stale cached response (`stale-while-revalidate`): its conditional request goes to a server of the route's group in a task of its own, on a connection of its own, while the stale response answers; a 304 refreshes the stored response, a storable answer replaces it.

use crate::cache::{self, Cache, Entry, LockGuard, Scope};
use crate::conn::MAX_CHUNK;
use crate::downstream::{Env, Who};
use crate::error::ProxyError;
use crate::flow::attempt::Proxied;
use crate::flow::exchange_h1::{final_head, write_within};
use crate::flow::mirror::{report_of, side_head};
use crate::upstream::tls::GroupTls;
use bytes::BytesMut;
use portico_config::{CacheStore, RouteCache, UpstreamProtocol};
use portico_http1::{BodyDecoder, Decoded, Framing, Method, RequestHead};
use portico_upstream::{Report, ServerGuard, Upstream};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::io::AsyncReadExt;
use tokio::time::timeout;

/// Background refreshes running at once at most, in the whole process; past that, a request for
/// a stale URL revalidates in the foreground (a flood of distinct stale URLs cannot start an
/// unbounded number of upstream connections).
const MAX_REFRESHES: u64 = 256;

/// Counts a refresh among the running ones while it lives.
struct Running(Arc<Cache>);

impl Running {
    fn start(cache: &Arc<Cache>) -> Option<Running> {
        let n = &cache.counters.refreshing;
        if n.fetch_add(1, Relaxed) >= MAX_REFRESHES {
            n.fetch_sub(1, Relaxed);
            return None;
        }
        Some(Running(cache.clone()))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.counters.refreshing.fetch_sub(1, Relaxed);
    }
}

/// What the stale response is and where it is stored.
pub(super) struct Stored<'s> {
    pub cache: &'s Arc<Cache>,
    pub url: &'s Arc<str>,
    pub scope: Scope,
    pub route: &'s RouteCache,
    pub entry: &'s Arc<Entry>,
    pub settings: &'s CacheStore,
    /// The request carries credentials, or the route checks them.
    pub credentialed: bool,
}

/// Start the refresh of `stored` with the request's forwarded head (its conditional fields set
/// in `px.forward`), holding the URL's fetch lock until it ends; the lock comes back when no
/// refresh can start (an HTTP/2 group, no server able to take it, too many refreshes running),
/// for the request to fetch in the foreground.
pub(super) fn spawn(
    env: &Env<'_>,
    px: &Proxied<'_>,
    head: &RequestHead,
    who: &Who<'_>,
    lock: LockGuard,
    stored: Stored<'_>,
) -> Result<(), LockGuard> {
    let shared = env.shared;
    let Some(up) = shared.upstreams.get(px.group) else {
        return Err(lock);
    };
    let group = up.group();
    if group.protocol == UpstreamProtocol::H2 {
        return Err(lock);
    }
    let Some(running) = Running::start(stored.cache) else {
        return Err(lock);
    };
    let Ok(guard) = up.pick_at_excluding(None, &[], Instant::now()) else {
        return Err(lock);
    };
    let (tls, out) = side_head(shared, px.group, &guard, head, px, who);
    // The fields the forward filters set or drop: a response varying on one is not stored.
    let set = px.forward.fields().map(|(n, _)| n.to_ascii_lowercase());
    let dropped = px.forward.dropped().map(str::to_ascii_lowercase);
    let forwarded: Vec<String> = dropped.chain(set).collect();
    let refresh = Refresh {
        up: up.clone(),
        guard,
        tls,
        head: out,
        request: head.clone(),
        cache: stored.cache.clone(),
        url: stored.url.clone(),
        scope: stored.scope,
        credentialed: stored.credentialed,
        forwarded,
        route: stored.route.clone(),
        stale: stored.entry.clone(),
        max_object: stored.settings.max_object,
        tag_header: stored.settings.tag_header.clone(),
        connect_timeout: group.connect_timeout,
        header_timeout: group.response_header_timeout,
        idle: group.idle_timeout,
        _lock: lock,
        _running: running,
    };
    tokio::task::spawn_local(refresh.run());
    Ok(())
}

/// One refresh on its way to the server.
struct Refresh {
    up: Arc<Upstream>,
    guard: ServerGuard,
    tls: Option<Arc<GroupTls>>,
    head: BytesMut,
    request: RequestHead,
    cache: Arc<Cache>,
    url: Arc<str>,
    scope: Scope,
    credentialed: bool,
    /// The request fields the route's forward filters set or drop (lowercase).
    forwarded: Vec<String>,
    route: RouteCache,
    stale: Arc<Entry>,
    max_object: u64,
    tag_header: Option<String>,
    connect_timeout: Duration,
    header_timeout: Duration,
    idle: Duration,
    /// Held until the refresh ends: other requests answer stale meanwhile.
    _lock: LockGuard,
    _running: Running,
}

impl Refresh {
    async fn run(self) {
        let r = self.exchange().await;
        let now = Instant::now();
        let server = self.guard.index();
        let c = &self.cache.counters;
        match r {
            Ok((status, stored)) => {
                let counter = if stored {
                    &c.refreshed
                } else {
                    &c.refresh_failed
                };
                counter.fetch_add(1, Relaxed);
                self.up.report(server, Report::Response { status }, now);
            }
            Err(e) => {
                c.refresh_failed.fetch_add(1, Relaxed);
                self.up.report(server, report_of(&e), now);
                tracing::debug!(server = %self.guard.address(), url = %self.url, "cache refresh failed: {e}");
            }
        }
    }

    /// Connect, send the conditional request, read the answer: its status, and whether the
    /// store took it. The connection closes after it.
    async fn exchange(&self) -> Result<(u16, bool), ProxyError> {
        let addr = self.guard.address();
        let (mut c, _) = crate::upstream::pool::connect(
            addr,
            self.connect_timeout,
            self.tls.as_deref(),
            crate::upstream::pool::local_header(self.up.group()).as_deref(),
        )
        .await?;
        let requested = SystemTime::now();
        write_within(&mut c.stream, &self.head, self.idle).await?;
        let rh = final_head(
            &mut c.stream,
            &mut c.rbuf,
            &Method::Get,
            self.header_timeout,
        )
        .await?;
        let status = rh.status();
        if status == 304 {
            let fresh: Vec<(String, Vec<u8>)> = rh
                .fields()
                .map(|(n, v)| (n.to_string(), v.to_vec()))
                .collect();
            let at = (&self.url, &self.route);
            let auth = self.credentialed;
            let kept = self
                .cache
                .revalidated(at, &self.stale, &fresh, auth, requested);
            return Ok((status, kept.is_some()));
        }
        let fields = || rh.fields();
        let view = cache::Head {
            status,
            reason: rh.reason(),
            fields: &fields,
        };
        let forwarded = |name: &str| self.forwarded.iter().any(|f| f == name);
        let to = cache::Target {
            url: &self.url,
            scope: self.scope,
            route: &self.route,
            tag_header: self.tag_header.as_deref(),
            max_object: self.max_object,
            credentialed: self.credentialed,
            forwarded: &forwarded,
        };
        let pending = match rh.framing {
            // A body that ends with the connection cannot be told from a cut one.
            Framing::Close => None,
            _ => cache::pending(&to, &self.request, &view, requested, Instant::now()),
        };
        let Some(mut p) = pending else {
            // No longer storable: the stale response goes too (a server error leaves it, for
            // stale-if-error).
            if status < 500 {
                self.cache.invalidate(&self.url);
            }
            return Ok((status, false));
        };
        let mut dec = BodyDecoder::new(rh.framing);
        loop {
            match dec
                .decode(&mut c.rbuf, MAX_CHUNK)
                .map_err(ProxyError::BadResponseBody)?
            {
                Decoded::Data(d) => {
                    p.push(&d);
                    if p.too_large() {
                        return Ok((status, false));
                    }
                }
                Decoded::Done { .. } => break,
                Decoded::NeedMore => {
                    if c.rbuf.capacity() - c.rbuf.len() < 4096 {
                        c.rbuf.reserve(MAX_CHUNK);
                    }
                    match timeout(self.idle, c.stream.read_buf(&mut c.rbuf)).await {
                        Err(_) => return Err(ProxyError::UpstreamIdle),
                        Ok(Err(e)) if e.kind() != std::io::ErrorKind::UnexpectedEof => {
                            return Err(ProxyError::UpstreamIo(e))
                        }
                        Ok(Ok(0)) | Ok(Err(_)) => {
                            match dec.on_eof().map_err(ProxyError::BadResponseBody)? {
                                Decoded::Done { .. } => break,
                                _ => return Err(ProxyError::UpstreamClosed),
                            }
                        }
                        Ok(Ok(_)) => {}
                    }
                }
            }
        }
        Ok((status, self.cache.insert(*p)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refreshes_are_capped_in_the_whole_process() {
        let cache = Cache::new(1 << 20, None).unwrap();
        let running: Vec<Running> = (0..MAX_REFRESHES)
            .map(|_| Running::start(&cache).unwrap())
            .collect();
        assert!(Running::start(&cache).is_none());
        drop(running);
        assert_eq!(cache.counters.refreshing.load(Relaxed), 0);
        assert!(Running::start(&cache).is_some());
    }
}
