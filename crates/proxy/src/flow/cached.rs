//! The response cache on the proxy action: a fresh stored response answers (with the client's conditions and range applied), one upstream fetch per URL at a time, a storable response copied as it streams, revalidation with the stored validators, a stale response in place of an upstream failure, and unsafe requests invalidating their URL.

use super::*;
use crate::cache::body::{Body, Part};
use crate::cache::{self, policy, Cache, Entry, Lock, LockGuard, Scope};
use crate::flow::refresh;
use crate::telemetry::timing::CacheStatus;
use portico_config::RouteCache;
use portico_http1::{Method, ResponseHead};
use std::sync::Arc;
use std::time::SystemTime;

/// A cached request on its way to the upstream: the URL it is stored under, the stale
/// response it may fall back on or revalidate, and what happened.
pub(super) struct Caching<'r> {
    cache: Arc<Cache>,
    url: Arc<str>,
    route: &'r RouteCache,
    scope: Scope,
    /// The request carries credentials, or the route checks them.
    credentialed: bool,
    /// A stored response past its freshness.
    stale: Option<Arc<Entry>>,
    /// When the request was sent (for the response's age).
    requested: SystemTime,
    max_object: u64,
    tag_header: Option<&'r str>,
    /// The URL's fetch lock, held until the response is stored or known not to be storable.
    lock: Option<LockGuard>,
}

/// What the attempt loop does for a cache: nothing for routes without one ([`NoCache`], whose
/// hooks compile away in its own copy of the loop), or [`Caching`]'s.
pub(super) trait Hooks<'r> {
    /// The cached request, if this is one.
    fn caching(&mut self) -> Option<&mut Caching<'r>>;
}

/// A request of a route without a cache.
pub(super) struct NoCache;

impl<'r> Hooks<'r> for NoCache {
    #[inline(always)]
    fn caching(&mut self) -> Option<&mut Caching<'r>> {
        None
    }
}

/// A request of a caching route that passes the cache by (a bypass, a `HEAD` miss): the same
/// as [`NoCache`], a type of its own so that the loop routes without a cache run has one
/// caller and stays inlined there.
pub(super) struct Passing;

impl<'r> Hooks<'r> for Passing {
    #[inline(always)]
    fn caching(&mut self) -> Option<&mut Caching<'r>> {
        None
    }
}

impl<'r> Hooks<'r> for Caching<'r> {
    #[inline(always)]
    fn caching(&mut self) -> Option<&mut Caching<'r>> {
        Some(self)
    }
}

impl Caching<'_> {
    /// The `Cache-Status` of a response fetched from the upstream (RFC 9211).
    pub(super) fn forwarded(&self, stored: bool) -> &'static str {
        match (self.stale.is_some(), stored) {
            (false, false) => "portico; fwd=miss",
            (false, true) => "portico; fwd=miss; stored",
            (true, false) => "portico; fwd=stale",
            (true, true) => "portico; fwd=stale; stored",
        }
    }
}

/// The proxy action of a caching route.
#[allow(clippy::too_many_arguments)]
pub(super) async fn serve<'a, D: Client<'a>>(
    down: &mut D,
    head: &RequestHead,
    mut px: Proxied<'_>,
    res: &RouteResilience,
    counters: &RouteStats,
    ubuf: &mut BytesMut,
    rc: &RouteCache,
    cache: &Arc<Cache>,
) -> Outcome {
    let env = down.env();
    let Some(settings) = env.shared.config.cache.as_ref() else {
        return proxy(down, head, &px, res, counters, ubuf, &mut Passing).await;
    };
    let c = &cache.counters;
    let method = head.method();
    let safe = matches!(
        method,
        Method::Get | Method::Head | Method::Options | Method::Trace
    );
    let skip = !matches!(method, Method::Get | Method::Head) || head.upgrade || head.has_body();
    if skip || cache::bypassed(head, rc) {
        down.timings().cache = Some(CacheStatus::Bypass);
        c.bypass.fetch_add(1, Ordering::Relaxed);
        let o = proxy(down, head, &px, res, counters, ubuf, &mut Passing).await;
        // RFC 9111 4.4: a successful unsafe request invalidates what is stored for its URL.
        if !safe && (200..400).contains(&o.status) {
            cache.invalidate(&cache::url(head, rc));
        }
        return o;
    }
    let url = cache::url(head, rc);
    let scope = Scope {
        route: rc.scope,
        tls: down.who().tls,
        group: px.group,
    };
    let head_only = *method == Method::Head;
    let credentialed = credentialed(head, px.route);
    let mut waited = false;
    let mut _fetching = None;
    let mut conditional = false;
    let found = loop {
        let found = cache.get(&url, head, scope);
        let now = Instant::now();
        if let Some(e) = found.as_ref().filter(|e| e.is_fresh(now)) {
            let status = match waited {
                true => CacheStatus::Collapsed,
                false => CacheStatus::Hit,
            };
            return answer(down, head, &px, cache, e, status, now).await;
        }
        // Stale within stale-while-revalidate: it answers, and one request per URL starts a
        // refresh in the background (when none can start, this request fetches).
        if let Some(e) = found.as_ref().filter(|e| e.serves_while_revalidating(now)) {
            let updating = CacheStatus::Updating;
            if head_only {
                return answer(down, head, &px, cache, e, updating, now).await;
            }
            match cache.lock(&url) {
                Lock::Wait(_) => return answer(down, head, &px, cache, e, updating, now).await,
                Lock::Leader(guard) => {
                    forward_conditionally(&mut px.forward, e);
                    conditional = true;
                    let stored = refresh::Stored {
                        cache,
                        url: &url,
                        scope,
                        route: rc,
                        entry: e,
                        settings,
                        credentialed,
                    };
                    let who = down.who();
                    match refresh::spawn(&env, &px, head, &who, guard, stored) {
                        Ok(()) => return answer(down, head, &px, cache, e, updating, now).await,
                        Err(guard) => {
                            _fetching = Some(guard);
                            break found;
                        }
                    }
                }
            }
        }
        // A HEAD is not stored; a request that waited once fetches for itself.
        if head_only || !rc.lock || waited {
            break found;
        }
        match cache.lock(&url) {
            Lock::Leader(guard) => {
                _fetching = Some(guard);
                break found;
            }
            Lock::Wait(mut rx) => {
                waited = true;
                let counted = cache::Waiting::new(&c.waiting);
                let wait = tokio::time::timeout(settings.lock_timeout, rx.changed());
                let reset = unless_reset(down.watch(), std::pin::pin!(wait))
                    .await
                    .is_none();
                drop(counted);
                if reset {
                    let e = ProxyError::ClientClosed;
                    return down.fail(head, e, Phase::Connect, false).await;
                }
            }
        }
    };
    down.timings().cache = Some(CacheStatus::Miss);
    c.misses.fetch_add(1, Ordering::Relaxed);
    if head_only {
        return proxy(down, head, &px, res, counters, ubuf, &mut Passing).await;
    }
    // Without a stored response, the client's conditions and range go to the server as they
    // came (its 304 or 206 is relayed, not stored): only a plain GET fills the cache.
    if !conditional {
        if let Some(e) = &found {
            forward_conditionally(&mut px.forward, e);
        }
    }
    let mut caching = Caching {
        cache: cache.clone(),
        url,
        route: rc,
        scope,
        credentialed,
        stale: found,
        requested: SystemTime::now(),
        max_object: settings.max_object,
        tag_header: settings.tag_header.as_deref(),
        lock: _fetching,
    };
    proxy(down, head, &px, res, counters, ubuf, &mut caching).await
}

/// Whether a request's response is kept only when a shared cache may give it to anyone: it
/// carries `Authorization`, or the route checks credentials of its own (RFC 9111 3.5).
pub(super) fn credentialed(head: &RequestHead, route: &Route) -> bool {
    head.field("authorization").is_some()
        || route.basic_auth.is_some()
        || route.jwt.is_some()
        || route.forward_auth.is_some()
}

/// Whether the forward filters `edits` set or drop the request field `name`.
pub(super) fn forwarded(edits: &Edits<'_>, name: &str) -> bool {
    edits.drops(name) || edits.fields().any(|(n, _)| n.eq_ignore_ascii_case(name))
}

/// The whole response is asked for, revalidated with the stored validators of `stale`; the
/// client's own conditions are answered from what comes back.
fn forward_conditionally(forward: &mut Edits<'_>, stale: &Entry) {
    forward.drop_conditionals();
    let text = |v: &[u8]| Cow::Owned(String::from_utf8_lossy(v).into_owned());
    if let Some(v) = stale.validator("etag") {
        forward.add("If-None-Match", text(v));
    }
    if let Some(v) = stale.validator("last-modified") {
        forward.add("If-Modified-Since", text(v));
    }
}

/// What the attempt does with the server's final response.
pub(super) enum Next {
    /// Relay it, copying its body into the store when it is storable.
    Relay(Option<Box<cache::Pending>>),
    /// Answer from the cache instead: revalidated by a 304 carrying these fields, or (None) a
    /// stale response standing in for an upstream error.
    FromCache(Option<Vec<(String, Vec<u8>)>>),
}

/// The server answered `status` with `resp`. When it will not be stored, the URL's fetch lock
/// is let go at once (the requests waiting for it fetch for themselves).
pub(super) fn on_response(
    c: &mut Caching<'_>,
    px: &Proxied<'_>,
    head: &RequestHead,
    resp: &UpResponse,
    status: u16,
) -> Next {
    let next = decide(c, px, head, resp, status);
    if matches!(next, Next::Relay(None)) {
        c.lock = None;
    }
    next
}

fn decide(
    c: &Caching<'_>,
    px: &Proxied<'_>,
    head: &RequestHead,
    resp: &UpResponse,
    status: u16,
) -> Next {
    if c.stale.is_some() && status == 304 {
        let fields = match resp {
            UpResponse::H1 { head: rh, .. } => rh
                .fields()
                .map(|(n, v)| (n.to_string(), v.to_vec()))
                .collect(),
            UpResponse::H2 { parts, .. } => parts
                .headers
                .iter()
                .map(|(n, v)| (n.as_str().to_string(), v.as_bytes().to_vec()))
                .collect(),
        };
        return Next::FromCache(Some(fields));
    }
    let now = Instant::now();
    if status >= 500 && c.stale.as_ref().is_some_and(|e| e.serves_on_error(now)) {
        return Next::FromCache(None);
    }
    let forward = |name: &str| forwarded(&px.forward, name);
    let to = cache::Target {
        url: &c.url,
        scope: c.scope,
        route: c.route,
        tag_header: c.tag_header,
        max_object: c.max_object,
        credentialed: c.credentialed,
        forwarded: &forward,
    };
    let pending = match resp {
        // A body that ends with the connection cannot be told from a cut one: not stored.
        UpResponse::H1 { head: rh, .. } if rh.framing == Framing::Close => None,
        UpResponse::H1 { head: rh, .. } => {
            let fields = || rh.fields();
            let view = cache::Head {
                status,
                reason: rh.reason(),
                fields: &fields,
            };
            cache::pending(&to, head, &view, c.requested, now)
        }
        UpResponse::H2 { parts, .. } => {
            let fields = || {
                parts
                    .headers
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_bytes()))
            };
            let view = cache::Head {
                status,
                reason: parts.status.canonical_reason().unwrap_or("Unknown"),
                fields: &fields,
            };
            cache::pending(&to, head, &view, c.requested, now)
        }
    };
    Next::Relay(pending)
}

/// The relayed body of a storable response was complete: store it.
pub(super) fn store(cx: Option<&mut Caching<'_>>, pending: Option<Box<cache::Pending>>) {
    if let (Some(c), Some(p)) = (cx, pending) {
        c.cache.insert(*p);
        // The requests waiting for this fetch find it now.
        c.lock = None;
    }
}

/// The attempt failed: a stale response answers in its place when it may (`stale-if-error`).
pub(super) async fn instead_of_error<'a, D: Client<'a>>(
    down: &mut D,
    head: &RequestHead,
    px: &Proxied<'_>,
    c: &Caching<'_>,
) -> Option<Outcome> {
    let now = Instant::now();
    let e = c.stale.clone().filter(|e| e.serves_on_error(now))?;
    let cache = c.cache.clone();
    Some(answer(down, head, px, &cache, &e, CacheStatus::Stale, now).await)
}

/// Answer from the cache after the server's final response: revalidated by a 304 (`fresh`:
/// its fields, merged into the stored response, which is stored again) or in place of its
/// error (None).
pub(super) async fn answer_after<'a, D: Client<'a>>(
    down: &mut D,
    head: &RequestHead,
    px: &Proxied<'_>,
    c: &mut Caching<'_>,
    fresh: Option<Vec<(String, Vec<u8>)>>,
) -> Outcome {
    let now = Instant::now();
    let Some(stale) = c.stale.clone() else {
        let e = ProxyError::Internal("a cache answer without a stored response");
        return down.fail(head, e, Phase::ResponseHead, true).await;
    };
    let Some(fresh) = fresh else {
        return answer(down, head, px, &c.cache, &stale, CacheStatus::Stale, now).await;
    };
    let at = (&c.url, c.route);
    let entry = c
        .cache
        .revalidated(at, &stale, &fresh, c.credentialed, c.requested)
        .unwrap_or(stale);
    answer(
        down,
        head,
        px,
        &c.cache,
        &entry,
        CacheStatus::Revalidated,
        now,
    )
    .await
}

/// What a stored response answers the client's conditions with.
enum Conditional {
    Whole,
    NotModified,
    Range(std::ops::Range<u64>),
    Unsatisfiable,
}

/// The client's `If-None-Match` (weak comparison), else `If-Modified-Since`, then its `Range`
/// (under `If-Range`), against a stored 200.
fn conditional(head: &RequestHead, e: &Entry) -> Conditional {
    if e.status != 200 {
        return Conditional::Whole;
    }
    let date = |v: &[u8]| {
        let t = std::str::from_utf8(v).ok()?;
        httpdate::parse_http_date(t).ok()
    };
    let etag = e.validator("etag");
    let last_modified = e.validator("last-modified").and_then(date);
    if let Some(inm) = head.field("if-none-match") {
        if etag.is_some_and(|tag| etag_listed(inm, tag)) {
            return Conditional::NotModified;
        }
    } else if let (Some(ims), Some(lm)) = (
        head.field("if-modified-since").and_then(date),
        last_modified,
    ) {
        if lm <= ims {
            return Conditional::NotModified;
        }
    }
    let Some(range) = head
        .field("range")
        .filter(|_| *head.method() == Method::Get)
    else {
        return Conditional::Whole;
    };
    if let Some(ir) = head.field("if-range") {
        // A strong validator must match exactly (RFC 9110 13.1.5).
        let matches = match ir.first() {
            Some(b'"') => etag.is_some_and(|t| t == ir),
            _ => date(ir).is_some_and(|d| Some(d) == last_modified),
        };
        if !matches {
            return Conditional::Whole;
        }
    }
    match policy::range(range, e.body.len()) {
        Ok(Some(r)) => Conditional::Range(r),
        Ok(None) => Conditional::Whole,
        Err(()) => Conditional::Unsatisfiable,
    }
}

/// Whether an `If-None-Match` list names `tag` (weak comparison) or is `*`.
fn etag_listed(list: &[u8], tag: &[u8]) -> bool {
    let weak = |t: &[u8]| t.strip_prefix(b"W/").unwrap_or(t).to_vec();
    let tag = weak(tag);
    let list = String::from_utf8_lossy(list);
    let listed = policy::split_list(&list).any(|t| t == "*" || weak(t.as_bytes()) == tag);
    listed
}

/// Fields a 304 carries from the stored response (RFC 9110 15.4.5).
const NOT_MODIFIED_FIELDS: [&str; 7] = [
    "cache-control",
    "content-location",
    "date",
    "etag",
    "expires",
    "last-modified",
    "vary",
];

/// The head and body a stored response answers `head` with.
fn what_to_send(head: &RequestHead, e: &Entry) -> Option<(ResponseHead, Part)> {
    let method = head.method();
    let stored = || e.fields.iter().map(|(n, v)| (n.as_str(), &v[..]));
    let len = e.body.len();
    Some(match conditional(head, e) {
        Conditional::Whole if *method == Method::Head => (e.head.clone(), Part::none()),
        Conditional::Whole => (e.get.clone(), Part::whole(&e.body)),
        Conditional::NotModified => {
            let kept = stored().filter(|(n, _)| {
                NOT_MODIFIED_FIELDS
                    .iter()
                    .any(|k| k.eq_ignore_ascii_case(n))
            });
            let h = cache::response_head(304, "Not Modified", kept, None, method)?;
            (h, Part::none())
        }
        Conditional::Range(r) => {
            let range = format!("bytes {}-{}/{len}", r.start, r.end - 1);
            let fields = stored().chain(std::iter::once(("Content-Range", range.as_bytes())));
            let n = r.end - r.start;
            let h = cache::response_head(206, "Partial Content", fields, Some(n), method)?;
            let part = Part {
                body: e.body.clone(),
                from: r.start,
                to: r.end,
            };
            (h, part)
        }
        Conditional::Unsatisfiable => {
            let range = format!("bytes */{len}");
            let fields = std::iter::once(("Content-Range", range.as_bytes()));
            let h = cache::response_head(416, "Range Not Satisfiable", fields, Some(0), method)?;
            (h, Part::none())
        }
    })
}

/// Answer the request from the stored response `e`, with the route's response filters, `Age`
/// and `Cache-Status`.
async fn answer<'a, D: Client<'a>>(
    down: &mut D,
    head: &RequestHead,
    px: &Proxied<'_>,
    cache: &Cache,
    e: &Entry,
    status: CacheStatus,
    now: Instant,
) -> Outcome {
    let env = down.env();
    let shared = env.shared;
    down.timings().cache = Some(status);
    let c = &cache.counters;
    let (counter, word) = match status {
        CacheStatus::Collapsed => (&c.collapsed, "portico; hit; detail=collapsed"),
        CacheStatus::Revalidated => (&c.revalidated, "portico; fwd=stale; fwd-status=304"),
        CacheStatus::Stale => (&c.stale, "portico; fwd=stale; detail=stale-if-error"),
        CacheStatus::Updating => (&c.updating, "portico; hit; detail=stale-while-revalidate"),
        _ => (&c.hits, "portico; hit"),
    };
    counter.fetch_add(1, Ordering::Relaxed);
    let Some((rh, body)) = what_to_send(head, e) else {
        let e = ProxyError::Internal("a stored response head does not parse");
        return down.fail(head, e, Phase::ResponseHead, true).await;
    };
    c.hit_bytes.fetch_add(body.len(), Ordering::Relaxed);
    let mut edits = Edits::default();
    let rid = down.timings().request_id;
    let who = down.who();
    let vars = RequestVars::new(head, px.route, who.tls, who.ip);
    px.filters.response(px.route, head, &vars, None, &mut edits);
    let mut z = match px.filters.has_body_filter() {
        true => body_filter(px, head, &rh, &mut edits),
        false => None,
    };
    edits.add("Age", Cow::Owned(e.age(now).as_secs().to_string()));
    edits.add("Cache-Status", Cow::Borrowed(word));
    if let Some(settings) = shared.config.request_id.as_ref().filter(|r| r.response) {
        if let Some(id) = rid.text(settings, head) {
            edits.replace(&settings.header, id.into_owned());
        }
    }
    let sent_status = rh.status();
    let failed = match down.response_head(head, RespHead::H1(&rh), &edits, px.p.via, true) {
        Ok(mut sent) => {
            let r = match (sent.end, &body.body, &z) {
                (true, ..) => Ok(()),
                // A large body from its file, by the kernel, where the client allows it.
                (false, Body::File(f), None) => match sent.out.file(f, body.from, body.to).await {
                    Some(r) => r,
                    None => relay(&mut UpBody::Stored(body), &mut sent.out, &mut z).await,
                },
                (false, ..) => relay(&mut UpBody::Stored(body), &mut sent.out, &mut z).await,
            };
            record(z, shared);
            let r = r.map_err(|e| (e, Phase::ResponseBody));
            return end_response(r, sent, sent_status, None, D::H2).await;
        }
        Err(f) => f,
    };
    match failed {
        HeadFailed::Invalid(e) => down.fail(head, e, Phase::ResponseHead, true).await,
        HeadFailed::Client(e) => Outcome {
            termination: e.termination(Phase::ResponseHead),
            status: sent_status,
            keep_alive: D::H2,
            bytes_sent: 0,
            upstream: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn if_none_match_compares_weakly_and_star_matches() {
        assert!(etag_listed(b"\"a\", \"b\"", b"\"b\""));
        assert!(etag_listed(b"W/\"a\"", b"\"a\""));
        assert!(etag_listed(b"\"a\"", b"W/\"a\""));
        assert!(etag_listed(b"*", b"\"x\""));
        assert!(!etag_listed(b"\"a\"", b"\"ab\""));
    }
}
