//! The filter stage: compiled-in filters a route runs at fixed phases of the one flow (request, forwarded head, response head, log), each able to answer the request locally.
//!
//! Phases, in the order a request meets them:
//! - **request**: after routing, before the route's action; a filter may answer (and the action
//!   does not run);
//! - **forward**: the fields of the head sent upstream (once per request, whatever the
//!   upstream's protocol);
//! - **response**: the fields of the final response head sent to the client (also a 101 or a
//!   tunnel's 2xx), whatever the client's protocol;
//! - **log**: the request is over, answered or not.
//!
//! Filters edit heads through [`Edits`], which the one encoder of each protocol applies: a filter
//! never writes protocol bytes.

pub(crate) mod auth;
pub(crate) mod compress;
mod cors;
pub(crate) mod jwks;
pub(crate) mod jwt;

use crate::error::ProxyError;
use crate::metrics::RouteStats;
use crate::resilience::load::WorkerLoad;
use crate::resilience::ratelimit::RateLimiter;
use crate::sticky::cookie_value;
use crate::telemetry::stats::Stats;
use bytes::Bytes;
use compress::Encoder;
use portico_config::{
    Action, HeaderRules, IpRules, Listener, RateLimit, RateLimitKey, Route, UpstreamGroup, Vars,
};
use portico_http1::Coding;
use portico_http1::RequestHead;
use portico_upstream::Upstream;
use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One compiled-in filter. Which phases it takes part in is fixed by its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Filter {
    /// request: 403 for a client address the route's `ip_rules` deny.
    IpRules,
    /// request: 403 for a client certificate (or none) the route's `client_cert` rules do not
    /// match.
    ClientCert,
    /// request: 503 with `Retry-After` while the listener sheds and this worker is saturated.
    Shed,
    /// request: the route's `rate_limit` (429 with `Retry-After`).
    RateLimit,
    /// request: a CORS preflight answered (204) or refused (403) by the route's `cors` policy;
    /// response: the policy's `Access-Control-*` fields.
    Cors,
    /// forward: the route's `request_headers` rules.
    RequestHeaders,
    /// response: the route's `response_headers` rules.
    ResponseHeaders,
    /// response: the route's `compression` (the head's fields, and an encoder for the body).
    Compress,
    /// response: `Set-Cookie` naming the server that answered, for a group with `sticky_cookie`
    /// (the cookie's other half, preferring that server, is part of the server pick).
    StickyCookie,
    /// log: the route's request count and latency histogram.
    RouteMetrics,
}

/// A route's filters, in the order they run.
#[derive(Debug, Clone, Default)]
pub(crate) struct Filters {
    list: Vec<Filter>,
    /// Whether any filter takes part in the request, response head and response body phases
    /// (a phase none takes part in is skipped, with what it would read).
    request: bool,
    response: bool,
    body: bool,
    /// The route's basic auth, checked after the request filters (it may wait for a hash).
    auth: Option<Arc<auth::AuthState>>,
    /// The passes the route's forward auth remembers.
    passes: Arc<auth::PassCache>,
    /// The route's JWT check, after basic auth.
    jwt: Option<Arc<jwt::JwtState>>,
    /// Checks before the action: request filters, basic auth, JWT or forward auth.
    gate: bool,
    /// The proxy action does more than the common case: Authorization dropped (basic auth,
    /// JWT), fields set by claims or forward auth, a split or a mirror.
    rare: bool,
    /// response: the listener's HTTP/3 advertised (`Alt-Svc`), on every proxied response.
    alt_svc: Option<Box<str>>,
}

/// A local answer from the request phase.
#[derive(Debug)]
pub(crate) enum Answer {
    /// Refused: the error it is counted as, its body, and when the client may try again
    /// (`Retry-After`, in seconds).
    Refuse {
        error: ProxyError,
        body: &'static [u8],
        retry_after: Option<u64>,
    },
    /// Answered without a body (a CORS preflight's 204) with these fields.
    Local {
        status: u16,
        fields: Vec<(&'static str, String)>,
    },
}

/// What the request phase reads: the routed request, its client, the route's state and the
/// worker's load.
pub(crate) struct Cx<'r> {
    pub route: &'r Route,
    /// The route's counters.
    pub counters: &'r RouteStats,
    /// The route's rate limiter (shared by all workers), when it has a `rate_limit`.
    pub limiter: Option<&'r RateLimiter>,
    /// This worker's load, and the listener's socket set (shedding is per listener).
    pub load: &'r WorkerLoad,
    pub slot: u64,
    pub stats: &'r Stats,
    pub peer: SocketAddr,
    /// The request's client: the peer, or behind a trusted proxy the client it names (also as
    /// text, `client_ip`).
    pub client: IpAddr,
    pub client_ip: &'r str,
    /// The connection's verified client certificate (mTLS).
    pub cert: Option<&'r portico_tls::ClientCert>,
    pub head: &'r RequestHead,
    /// The clock read at the request head.
    pub now: Instant,
}

impl Filters {
    /// The filters of `route` on listener `l`; `groups`: the configuration's upstream groups,
    /// `keys`: where JWT checks find their key sources.
    pub(crate) fn for_route(
        l: &Listener,
        route: &Route,
        groups: &[Arc<UpstreamGroup>],
        keys: &mut jwks::NextSources<'_>,
    ) -> Filters {
        let mut list = Vec::new();
        // Cheapest first: a stranger is refused before it spends anything.
        if route.ip_rules.is_some() {
            list.push(Filter::IpRules);
        }
        if route.client_cert.is_some() {
            list.push(Filter::ClientCert);
        }
        if l.shed.is_some() {
            list.push(Filter::Shed);
        }
        if route.rate_limit.is_some() {
            list.push(Filter::RateLimit);
        }
        if route.cors.is_some() {
            list.push(Filter::Cors);
        }
        if let Action::Proxy(p) = &route.action {
            if !route.request_headers.is_empty() {
                list.push(Filter::RequestHeaders);
            }
            if !route.response_headers.is_empty() {
                list.push(Filter::ResponseHeaders);
            }
            let split = p
                .split
                .iter()
                .flat_map(|s| s.shares.iter().map(|(g, _)| *g));
            if std::iter::once(p.upstream)
                .chain(split)
                .any(|g| sticky_reachable(groups, g))
            {
                list.push(Filter::StickyCookie);
            }
            if route.compression.is_some() {
                list.push(Filter::Compress);
            }
        }
        list.push(Filter::RouteMetrics);
        let has = |phase: &[Filter]| list.iter().any(|f| phase.contains(f));
        let request = has(&[
            Filter::IpRules,
            Filter::ClientCert,
            Filter::Shed,
            Filter::RateLimit,
            Filter::Cors,
        ]);
        let rare = route
            .basic_auth
            .as_ref()
            .is_some_and(|a| !a.keep_authorization)
            || route.forward_auth.is_some()
            || route.jwt.is_some()
            || matches!(&route.action, Action::Proxy(p) if p.split.is_some() || p.mirror.is_some());
        Filters {
            gate: request
                || route.basic_auth.is_some()
                || route.forward_auth.is_some()
                || route.jwt.is_some(),
            rare,
            alt_svc: None,
            request,
            response: has(&[Filter::ResponseHeaders, Filter::StickyCookie, Filter::Cors]),
            body: has(&[Filter::Compress]),
            auth: route
                .basic_auth
                .clone()
                .map(|a| Arc::new(auth::AuthState::new(a))),
            passes: Arc::default(),
            jwt: route
                .jwt
                .as_ref()
                .map(|j| Arc::new(jwt::JwtState::new(j.clone(), keys.get(&j.keys)))),
            list,
        }
    }

    /// Load what is due of the files and URLs the route's checks read (JWK sets, the htpasswd
    /// file); how long until the next look (None: nothing to watch).
    pub(crate) fn check_sources(&self, now: Instant, stats: &Stats) -> Option<Duration> {
        let keys = self.jwt.as_ref().map(|j| j.source().check(now, stats));
        let file = self.auth.as_ref().and_then(|a| a.check_file(now, stats));
        keys.into_iter().chain(file).min()
    }

    /// The route's JWT check, if it has one.
    #[inline]
    pub(crate) fn jwt(&self) -> Option<&jwt::JwtState> {
        self.jwt.as_deref()
    }

    /// The passes the route's forward auth remembers.
    pub(crate) fn pass_cache(&self) -> &auth::PassCache {
        &self.passes
    }

    /// The route's basic auth, if it asks for one.
    #[inline]
    pub(crate) fn auth(&self) -> Option<&auth::AuthState> {
        self.auth.as_deref()
    }

    /// Whether the route has checks before its action (without, `gate` is skipped).
    #[inline]
    pub(crate) fn has_gate(&self) -> bool {
        self.gate
    }

    /// Whether the proxy action takes its rare path (see `rare`).
    #[inline]
    pub(crate) fn is_rare(&self) -> bool {
        self.rare
    }

    /// Whether the route has request filters (without, the phase is skipped).
    #[inline]
    pub(crate) fn has_request_filter(&self) -> bool {
        self.request
    }

    /// The request phase: the first filter that answers stops the request (the answer is
    /// counted and logged here; the caller sends it in the client's protocol).
    pub(crate) fn request(&self, cx: &Cx<'_>) -> Result<(), Answer> {
        for f in &self.list {
            match f {
                Filter::IpRules => ip_rules(cx)?,
                Filter::ClientCert => client_cert(cx)?,
                Filter::Shed => shed(cx)?,
                Filter::RateLimit => rate_limit(cx)?,
                Filter::Cors => preflight(cx)?,
                _ => {}
            }
        }
        Ok(())
    }

    /// The forward phase: edits of the head sent upstream, for the request `vars` describes.
    pub(crate) fn forward<'r>(&self, route: &'r Route, vars: &dyn Vars, edits: &mut Edits<'r>) {
        for f in &self.list {
            if let Filter::RequestHeaders = f {
                edits.rules(&route.request_headers, vars);
            }
        }
    }

    /// The response phase: edits of the final head sent to the client, which server
    /// `server.1` of `server.0` sent (the response body phase, [`Filters::response_body`],
    /// follows when [`Filters::has_body_filter`]).
    pub(crate) fn response<'r>(
        &'r self,
        route: &'r Route,
        head: &RequestHead,
        vars: &dyn Vars,
        server: Option<(&Upstream, usize)>,
        edits: &mut Edits<'r>,
    ) {
        if !self.response {
            return;
        }
        if let Some(v) = &self.alt_svc {
            edits.add("Alt-Svc", Cow::Borrowed(v));
        }
        for f in &self.list {
            match f {
                Filter::ResponseHeaders => edits.rules(&route.response_headers, vars),
                Filter::StickyCookie => {
                    let Some((upstream, server)) = server else {
                        continue;
                    };
                    if let Some(c) = crate::sticky::set_cookie(upstream, head, server) {
                        edits.add("Set-Cookie", Cow::Owned(c));
                    }
                }
                Filter::Cors => {
                    if let Some(c) = &route.cors {
                        cors::response(c, head, edits);
                    }
                }
                _ => {}
            }
        }
    }

    /// Advertise HTTP/3 on `port` for `max_age` (RFC 7838 `Alt-Svc`) on the route's responses.
    pub(crate) fn advertise_h3(&mut self, port: u16, max_age: std::time::Duration) {
        self.alt_svc = Some(format!("h3=\":{port}\"; ma={}", max_age.as_secs()).into());
        self.response = true;
    }

    /// Whether a filter of the route works on response bodies (compression); without one the
    /// body phase is skipped and the relay is the plain one.
    #[inline]
    pub(crate) fn has_body_filter(&self) -> bool {
        self.body
    }

    /// The response body phase, for the server's final head `resp`: the compression the body
    /// goes through (boxed: the codecs' state is large and most responses have none), with its
    /// fields added to `edits`.
    pub(crate) fn response_body<'r, 'f, F>(
        &self,
        route: &'r Route,
        head: &RequestHead,
        resp: &compress::Response<'_, F>,
        edits: &mut Edits<'r>,
    ) -> Option<Box<Compressing>>
    where
        F: Iterator<Item = (&'f str, &'f [u8])>,
    {
        match self.has_body_filter() {
            true => compress(route, head, resp, edits),
            false => None,
        }
    }

    /// The log phase: the request ended with `status` (0: the client got no response) after
    /// `latency`; `counters`: the route's.
    pub(crate) fn log(&self, counters: &RouteStats, status: u16, latency: Duration) {
        for f in &self.list {
            if let Filter::RouteMetrics = f {
                counters.record(status, latency);
            }
        }
    }
}

/// The compression filter: the plan for this response, applied to the head's edits.
fn compress<'r, 'f, F>(
    route: &'r Route,
    head: &RequestHead,
    resp: &compress::Response<'_, F>,
    edits: &mut Edits<'r>,
) -> Option<Box<Compressing>>
where
    F: Iterator<Item = (&'f str, &'f [u8])>,
{
    let c = route.compression.as_ref()?;
    // A validator the route's header rules remove or set is not added back.
    let rules_own_etag = edits.drops("etag");
    match compress::plan(c, head, resp) {
        compress::Plan::Leave => None,
        compress::Plan::Revalidated { etag, vary } => {
            if vary {
                edits.add("Vary", Cow::Borrowed("Accept-Encoding"));
            }
            if let Some(etag) = etag.filter(|_| !rules_own_etag) {
                edits.replace_etag(etag);
            }
            None
        }
        compress::Plan::Vary => {
            edits.add("Vary", Cow::Borrowed("Accept-Encoding"));
            None
        }
        compress::Plan::Compress { coding, etag, vary } => {
            match Encoder::new(coding, c, resp.length) {
                Ok(enc) => {
                    edits.recode(coding, etag.filter(|_| !rules_own_etag), vary);
                    Some(Box::new(Compressing {
                        enc: Some(enc),
                        coding,
                        bytes_in: 0,
                        bytes_out: 0,
                    }))
                }
                Err(e) => {
                    // The codec could not start (memory): the response goes as it is.
                    tracing::warn!("{} encoder failed to start: {e}", coding.token());
                    None
                }
            }
        }
    }
}

/// A response body on its way through the compression filter, with what went in and out.
pub(crate) struct Compressing {
    enc: Option<Encoder>,
    coding: Coding,
    bytes_in: u64,
    bytes_out: u64,
}

impl Compressing {
    /// Body bytes from the server; the compressed bytes ready to send (`last`: the body ends
    /// with them, and so does the compressed stream).
    pub(crate) fn data(&mut self, d: &[u8], last: bool) -> Result<Bytes, ProxyError> {
        self.bytes_in += d.len() as u64;
        let out = match self.enc.as_mut() {
            Some(e) => e.data(d).map_err(codec_error)?,
            None => {
                return Err(ProxyError::Internal(
                    "data after the end of a compressed body",
                ))
            }
        };
        if !last {
            self.bytes_out += out.len() as u64;
            return Ok(out);
        }
        let end = self.finish()?;
        let mut all = bytes::BytesMut::with_capacity(out.len() + end.len());
        all.extend_from_slice(&out);
        all.extend_from_slice(&end);
        self.bytes_out += out.len() as u64;
        Ok(all.freeze())
    }

    /// Before a wait for the server: what the codec holds, out now.
    pub(crate) fn flush(&mut self) -> Result<Bytes, ProxyError> {
        let out = match self.enc.as_mut() {
            Some(e) => e.flush().map_err(codec_error)?,
            None => Bytes::new(),
        };
        self.bytes_out += out.len() as u64;
        Ok(out)
    }

    /// The end of the body: the end of the compressed stream.
    pub(crate) fn finish(&mut self) -> Result<Bytes, ProxyError> {
        let out = match self.enc.take() {
            Some(e) => e.finish().map_err(codec_error)?,
            None => Bytes::new(),
        };
        self.bytes_out += out.len() as u64;
        Ok(out)
    }

    /// Count the response in `stats` (once, at its end).
    pub(crate) fn record(&self, stats: &Stats) {
        let c = stats.compressed(self.coding);
        c.responses.fetch_add(1, Ordering::Relaxed);
        c.bytes_in.fetch_add(self.bytes_in, Ordering::Relaxed);
        c.bytes_out.fetch_add(self.bytes_out, Ordering::Relaxed);
    }
}

fn codec_error(e: std::io::Error) -> ProxyError {
    tracing::warn!("compression failed: {e}");
    ProxyError::Internal("compression failed")
}

/// Whether the group `gi`, or a fallback it leads to, sets sticky cookies.
fn sticky_reachable(groups: &[Arc<UpstreamGroup>], mut gi: usize) -> bool {
    // Validation forbids fallback cycles; the bound keeps this finite regardless.
    for _ in 0..=groups.len() {
        let Some(g) = groups.get(gi) else {
            return false;
        };
        if g.sticky_cookie.is_some() {
            return true;
        }
        match g.fallback {
            Some(f) => gi = f,
            None => return false,
        }
    }
    false
}

fn shed(cx: &Cx<'_>) -> Result<(), Answer> {
    if !cx.load.shedding(cx.slot) {
        return Ok(());
    }
    cx.stats.requests_shed.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(peer = %cx.peer, target = cx.head.target(), "request shed: worker saturated");
    Err(Answer::Refuse {
        error: ProxyError::Shed,
        body: crate::resilience::load::SHED_BODY,
        retry_after: None,
    })
}

/// The route's `ip_rules`, for the client's address: the socket's, or the right-most address
/// of `X-Forwarded-For` that is not a trusted proxy when the socket's peer is one.
fn ip_rules(cx: &Cx<'_>) -> Result<(), Answer> {
    let Some(rules) = &cx.route.ip_rules else {
        return Ok(());
    };
    let client = cx.client;
    if rules.allows(client) {
        return Ok(());
    }
    cx.stats.ip_denied.fetch_add(1, Ordering::Relaxed);
    let error = ProxyError::IpDenied;
    tracing::debug!(peer = %cx.peer, client = %client, target = cx.head.target(), "{error}");
    Err(Answer::Refuse {
        body: crate::error::error_body(error.status()),
        error,
        retry_after: None,
    })
}

fn client_cert(cx: &Cx<'_>) -> Result<(), Answer> {
    let Some(rules) = &cx.route.client_cert else {
        return Ok(());
    };
    if cx.cert.is_some_and(|c| cert_matches(rules, c)) {
        return Ok(());
    }
    cx.stats.client_cert_denied.fetch_add(1, Ordering::Relaxed);
    let error = ProxyError::CertDenied;
    let subject = cx.cert.map_or("none", |c| c.subject.as_str());
    tracing::debug!(peer = %cx.peer, subject, target = cx.head.target(), "{error}");
    Err(Answer::Refuse {
        body: crate::error::error_body(error.status()),
        error,
        retry_after: None,
    })
}

/// Whether `cert` matches the rules: for each list with patterns, one pattern matches (the
/// subject, one of the SANs, the issuer).
fn cert_matches(rules: &portico_config::ClientCertRules, cert: &portico_tls::ClientCert) -> bool {
    let any = |patterns: &[String], text: &str| patterns.iter().any(|p| glob(p, text));
    (rules.subject.is_empty() || any(&rules.subject, &cert.subject))
        && (rules.issuer.is_empty() || any(&rules.issuer, &cert.issuer))
        && (rules.san.is_empty() || cert.sans.iter().any(|s| any(&rules.san, s)))
}

/// Whether `text` matches `pattern`, where `*` matches any run of characters (none included)
/// and ASCII case is ignored.
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    // The last `*` seen and the text position it was tried at.
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi].eq_ignore_ascii_case(&t[ti]) {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            // Let that `*` take one more character.
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&b| b == b'*')
}

/// Who sent a request, for the access log: the peer, and the client behind `trusted` proxies.
pub(crate) fn sender(
    peer: SocketAddr,
    head: Option<&RequestHead>,
    trusted: &IpRules,
) -> crate::telemetry::access_log::Sender {
    let client = match head {
        Some(h) if !trusted.is_empty() => client_addr(peer.ip(), h, trusted),
        _ => peer.ip(),
    };
    crate::telemetry::access_log::Sender { peer, client }
}

/// The client's address: `peer`, unless it is a trusted proxy; then, walking `X-Forwarded-For`
/// from the right (the hop nearest to us first), the first address that is not a trusted proxy
/// (an entry that is not an address stops the walk at the last trusted one).
pub(crate) fn client_addr(peer: IpAddr, head: &RequestHead, trusted: &IpRules) -> IpAddr {
    if trusted.is_empty() || !trusted.covers(peer) {
        return peer;
    }
    let mut entries: Vec<&[u8]> = Vec::new();
    for (name, value) in head.fields() {
        if name.eq_ignore_ascii_case("x-forwarded-for") {
            entries.extend(value.split(|&b| b == b',').map(<[u8]>::trim_ascii));
        }
    }
    let mut client = peer;
    for e in entries.iter().rev() {
        let Some(ip) = std::str::from_utf8(e)
            .ok()
            .and_then(|s| s.parse::<IpAddr>().ok())
        else {
            break;
        };
        client = ip;
        if !trusted.covers(ip) {
            break;
        }
    }
    client
}

/// A CORS preflight: answered here, never proxied.
fn preflight(cx: &Cx<'_>) -> Result<(), Answer> {
    let Some(c) = &cx.route.cors else {
        return Ok(());
    };
    match cors::preflight(c, cx.head) {
        None => Ok(()),
        Some(Ok(fields)) => Err(Answer::Local {
            status: 204,
            fields,
        }),
        Some(Err(why)) => {
            let error = ProxyError::CorsRefused(why);
            tracing::debug!(peer = %cx.peer, target = cx.head.target(), "{error}");
            Err(Answer::Refuse {
                body: crate::error::error_body(error.status()),
                error,
                retry_after: None,
            })
        }
    }
}

fn rate_limit(cx: &Cx<'_>) -> Result<(), Answer> {
    let (Some(limit), Some(limiter)) = (&cx.route.rate_limit, cx.limiter) else {
        return Ok(());
    };
    let Err(wait) = take_token(cx.client_ip, cx.head, limit, limiter, cx.now) else {
        return Ok(());
    };
    cx.counters.rate_limited.fetch_add(1, Ordering::Relaxed);
    cx.stats.rate_limited.fetch_add(1, Ordering::Relaxed);
    let error = ProxyError::RateLimited;
    tracing::debug!(peer = %cx.peer, target = cx.head.target(), "{error}");
    Err(Answer::Refuse {
        body: crate::error::error_body(error.status()),
        error,
        retry_after: Some(crate::resilience::ratelimit::retry_after_secs(wait)),
    })
}

/// Take a token from the bucket of this request's key: the header or cookie value when the
/// limit names one and the request has it, else the client IP (in its own key space).
fn take_token(
    client_ip: &str,
    head: &RequestHead,
    limit: &RateLimit,
    limiter: &RateLimiter,
    now: Instant,
) -> Result<(), Duration> {
    let ip = (0, client_ip.as_bytes());
    let (kind, key) = match &limit.key {
        RateLimitKey::ClientIp => ip,
        RateLimitKey::Header(name) => head.field(name).map_or(ip, |v| (1, v)),
        RateLimitKey::Cookie(name) => head
            .field("cookie")
            .and_then(|v| cookie_value(v, name.as_bytes()))
            .map_or(ip, |v| (2, v)),
    };
    // The clock read at the head is recent enough (a bucket ignores time running backwards).
    limiter.check(kind, key, now)
}

/// Edits of a message's fields from the filters of one phase, applied by the protocol's
/// encoder: the phase's header rules, borrowed from the configuration (fields named in `remove`
/// or `set` are dropped from the message, then every `set` and every `add` field is appended),
/// then the fields other filters add, in their order. Nothing is allocated unless a filter adds
/// a field.
#[derive(Debug, Default)]
pub(crate) struct Edits<'r> {
    rules: Option<&'r HeaderRules>,
    /// The rules' values have variables: all of them were rendered into `added` (first, in the
    /// rules' order), and [`Edits::fields`] takes them from there.
    rendered: bool,
    added: Vec<(&'r str, Cow<'r, str>)>,
    /// The body is sent in another coding (compressed): its length is unknown until its end,
    /// and the fields that described the server's bytes ([`RECODED_DROPS`]) are dropped.
    recoded: bool,
    /// The route's CORS policy answers: the server's `Access-Control-*` fields are dropped.
    cors: bool,
    /// The server's `ETag` is replaced (by a weak one).
    etag: bool,
    /// The client's `Authorization` is not forwarded (basic auth checked it here).
    authorization: bool,
    /// Another field that carried a credential checked here (a JWT's `header`).
    token: Option<&'r str>,
    /// Fields the forward auth service sets: the client's copies are dropped.
    names: Option<&'r [String]>,
    /// Fields a JWT's claims set (claim, field): the client's copies are dropped.
    claims: Option<&'r [(String, String)]>,
    /// Fields Portico sets or drops itself (the request id, `traceparent`, a `tracestate`
    /// without a trace): the message's own are dropped.
    replaced: [Option<&'r str>; 3],
    /// The client's conditional and range fields are not forwarded: the cache asks for the
    /// whole response, with its own validators.
    conditionals: bool,
    /// Any of recoded, cors, etag, authorization, token, names, claims, replaced,
    /// conditionals: the one flag `drops` tests inline.
    owns: bool,
}

/// The client's fields a cache's request drops: it asks for the whole response, and answers
/// the client's conditions itself.
const CONDITIONAL_DROPS: [&str; 4] = ["if-none-match", "if-modified-since", "if-range", "range"];

/// The server's fields a re-encoded body drops: its length, its strong validator (a weak one
/// is added back) and its byte ranges.
const RECODED_DROPS: [&str; 3] = ["content-length", "etag", "accept-ranges"];

impl<'r> Edits<'r> {
    /// The phase's header rules from the configuration (one set per phase); values with
    /// variables are rendered for the request `vars` describes.
    pub(crate) fn rules(&mut self, r: &'r HeaderRules, vars: &dyn Vars) {
        debug_assert!(self.rules.is_none(), "one set of header rules per phase");
        if r.is_empty() {
            return;
        }
        self.rules = Some(r);
        let values = || r.set.iter().chain(r.add.iter());
        if values().any(|(_, t)| t.as_literal().is_none()) {
            let rendered: Vec<_> = values()
                .map(|(n, t)| (n.as_str(), t.render(vars)))
                .collect();
            self.added.splice(0..0, rendered);
            self.rendered = true;
        }
    }

    /// Whether any field is set or added (without, the encoders skip [`Edits::fields`]).
    #[inline]
    pub(crate) fn has_fields(&self) -> bool {
        self.rules.is_some() || !self.added.is_empty()
    }

    /// Append a field (`name` as HTTP/1.1 writes it; HTTP/2 lowercases it).
    pub(crate) fn add(&mut self, name: &'r str, value: Cow<'r, str>) {
        self.added.push((name, value));
    }

    /// The body goes out in `coding`: `Content-Encoding`, `Vary` when `vary`, and the weak
    /// `etag` replace what described the server's bytes.
    pub(crate) fn recode(&mut self, coding: Coding, etag: Option<String>, vary: bool) {
        self.recoded = true;
        self.owns = true;
        self.add("Content-Encoding", Cow::Borrowed(coding.token()));
        if vary {
            self.add("Vary", Cow::Borrowed("Accept-Encoding"));
        }
        if let Some(etag) = etag {
            self.add("ETag", Cow::Owned(etag));
        }
    }

    /// The server's `ETag` gives way to `etag` (a 304 or HEAD answer to a client whose GET
    /// would be compressed).
    pub(crate) fn replace_etag(&mut self, etag: String) {
        self.etag = true;
        self.owns = true;
        self.add("ETag", Cow::Owned(etag));
    }

    /// The message's own fields named `names` are dropped.
    pub(crate) fn drop_names(&mut self, names: &'r [String]) {
        if !names.is_empty() {
            self.names = Some(names);
            self.owns = true;
        }
    }

    /// The fields a JWT's claims set (`forward_claims`) replace the client's of those names.
    pub(crate) fn drop_claim_fields(&mut self, fields: &'r [(String, String)]) {
        if !fields.is_empty() {
            self.claims = Some(fields);
            self.owns = true;
        }
    }

    /// `name` (lowercase) is set to `value`: the message's own field of that name is dropped.
    pub(crate) fn replace(&mut self, name: &'r str, value: String) {
        self.drop_field(name);
        self.add(name, Cow::Owned(value));
    }

    /// The message's own field `name` (lowercase) is dropped.
    pub(crate) fn drop_field(&mut self, name: &'r str) {
        match self.replaced.iter_mut().find(|r| r.is_none()) {
            Some(slot) => *slot = Some(name),
            None => debug_assert!(false, "more replaced fields than slots"),
        }
        self.owns = true;
    }

    /// The field a credential came in (other than `Authorization`) is not forwarded.
    pub(crate) fn drop_token_field(&mut self, name: &'r str) {
        self.token = Some(name);
        self.owns = true;
    }

    /// The client's conditional and range fields are not forwarded.
    pub(crate) fn drop_conditionals(&mut self) {
        self.conditionals = true;
        self.owns = true;
    }

    /// The client's `Authorization` field is not forwarded.
    pub(crate) fn drop_authorization(&mut self) {
        self.authorization = true;
        self.owns = true;
    }

    /// The route's CORS policy owns the `Access-Control-*` fields: the server's are dropped.
    pub(crate) fn own_cors_fields(&mut self) {
        self.cors = true;
        self.owns = true;
    }

    /// The body is re-encoded: its length is unknown when the head goes out.
    #[inline]
    pub(crate) fn recoded(&self) -> bool {
        self.recoded
    }

    /// Whether the message's own field `name` is dropped (removed or replaced).
    #[inline]
    pub(crate) fn drops(&self, name: &str) -> bool {
        // The common case (no rules, nothing owned) stays inline; the lists are looked at out
        // of line.
        if self.rules.is_none() && !self.owns {
            return false;
        }
        self.drops_listed(name)
    }

    #[inline(never)]
    fn drops_listed(&self, name: &str) -> bool {
        let among = |list: &[&str]| list.iter().any(|n| n.eq_ignore_ascii_case(name));
        self.rules.is_some_and(|r| {
            r.remove.iter().any(|n| n.eq_ignore_ascii_case(name))
                || r.set.iter().any(|(n, _)| n.eq_ignore_ascii_case(name))
        }) || (self.recoded && among(&RECODED_DROPS))
            || (self.cors && among(&cors::CORS_FIELDS))
            || (self.etag && name.eq_ignore_ascii_case("etag"))
            || (self.authorization && name.eq_ignore_ascii_case("authorization"))
            || (self.conditionals && among(&CONDITIONAL_DROPS))
            || self.token.is_some_and(|t| t.eq_ignore_ascii_case(name))
            || self
                .replaced
                .iter()
                .flatten()
                .any(|t| t.eq_ignore_ascii_case(name))
            || self
                .names
                .is_some_and(|n| n.iter().any(|x| x.eq_ignore_ascii_case(name)))
            || self
                .claims
                .is_some_and(|c| c.iter().any(|(_, x)| x.eq_ignore_ascii_case(name)))
    }

    /// Whether a filter sets `name` (the message's own field is replaced).
    #[inline]
    pub(crate) fn sets(&self, name: &str) -> bool {
        self.rules
            .is_some_and(|r| r.set.iter().any(|(n, _)| n.eq_ignore_ascii_case(name)))
    }

    /// The names of the message's own fields that are dropped.
    pub(crate) fn dropped(&self) -> impl Iterator<Item = &str> + '_ {
        let rules = self.rules.into_iter().flat_map(|r| {
            let set = r.set.iter().map(|(n, _)| n.as_str());
            r.remove.iter().map(String::as_str).chain(set)
        });
        let recoded = RECODED_DROPS.iter().copied().filter(|_| self.recoded);
        let cors = cors::CORS_FIELDS.iter().copied().filter(|_| self.cors);
        let etag = std::iter::once("etag").filter(|_| self.etag);
        let auth = std::iter::once("authorization").filter(|_| self.authorization);
        let conditionals = CONDITIONAL_DROPS
            .iter()
            .copied()
            .filter(|_| self.conditionals);
        let token = self
            .token
            .into_iter()
            .chain(self.replaced.into_iter().flatten());
        let names = self.names.into_iter().flatten().map(String::as_str);
        let claims = self.claims.into_iter().flatten().map(|(_, f)| f.as_str());
        rules
            .chain(recoded)
            .chain(cors)
            .chain(etag)
            .chain(auth)
            .chain(conditionals)
            .chain(token)
            .chain(names)
            .chain(claims)
    }

    /// The fields to append: every `set`, every `add`, then what other filters added.
    pub(crate) fn fields(&self) -> impl Iterator<Item = (&str, &[u8])> + '_ {
        let rules = self
            .rules
            .filter(|_| !self.rendered)
            .into_iter()
            .flat_map(|r| r.set.iter().chain(r.add.iter()));
        let rules = rules.map(|(n, t)| (n.as_str(), t.as_literal().unwrap_or_default().as_bytes()));
        rules.chain(self.added.iter().map(|(n, v)| (*n, v.as_bytes())))
    }

    /// No filter edits.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.rules.is_none() && self.added.is_empty() && !self.recoded && !self.cors && !self.etag
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(toml: &str) -> portico_config::Config {
        portico_config::parse(toml, "test.toml").unwrap()
    }

    const GROUPS: &str = "[upstreams.a]\nservers = [\"10.0.0.1:80\"]\nfallback = \"b\"\n\
                          [upstreams.b]\nservers = [\"10.0.0.2:80\"]\n";

    #[test]
    fn a_route_runs_only_the_filters_its_configuration_asks_for() {
        let c = config(&format!(
            "{GROUPS}[[listeners]]\naddress = \"127.0.0.1:1\"\n\
             [[listeners.routes]]\nproxy = \"a\"\n\
             [[listeners.routes]]\nproxy = \"a\"\nrate_limit = {{ rate = 5.0, burst = 5 }}\n\
             [listeners.routes.request_headers]\nset = {{ \"x-a\" = \"1\" }}\n\
             [listeners.routes.response_headers]\nremove = [\"server\"]\n\
             [[listeners.routes]]\nrespond = {{ status = 204 }}\nrate_limit = {{ rate = 1.0, burst = 1 }}\n"
        ));
        let l = &c.listeners[0];
        let none = jwks::KeySources::default();
        let of =
            |i: usize| Filters::for_route(l, &l.routes[i], &c.upstreams, &mut none.next()).list;
        assert_eq!(of(0), [Filter::RouteMetrics]);
        assert_eq!(
            of(1),
            [
                Filter::RateLimit,
                Filter::RequestHeaders,
                Filter::ResponseHeaders,
                Filter::RouteMetrics
            ]
        );
        // A local answer runs the request and log phases.
        assert_eq!(of(2), [Filter::RateLimit, Filter::RouteMetrics]);
    }

    #[test]
    fn globs_match_runs_of_characters_ignoring_ascii_case() {
        assert!(glob("CN=*,O=Example", "CN=alice,O=Example"));
        assert!(glob("cn=ALICE,o=example", "CN=alice,O=Example"));
        assert!(!glob("CN=*,O=Example", "CN=alice,O=Example Corp"));
        assert!(glob("DNS:*.svc.example", "DNS:a.b.svc.example"));
        assert!(!glob("DNS:*.svc.example", "DNS:svc.example"));
        assert!(glob(
            "URI:spiffe://example.org/*",
            "URI:spiffe://example.org/ns/a"
        ));
        assert!(glob("*", "") && glob("a**b", "ab") && !glob("a*b", "a"));
        assert!(glob("*a*a*a", "aaaa") && !glob("*a*b", "aaaa"));
        let cert = portico_tls::ClientCert {
            subject: "CN=alice,O=Example".into(),
            issuer: "CN=Example CA".into(),
            sans: vec![
                "DNS:alice.clients.example".into(),
                "email:a@example.org".into(),
            ],
        };
        let rules = |subject: &[&str], san: &[&str], issuer: &[&str]| {
            let v = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
            portico_config::ClientCertRules {
                subject: v(subject),
                san: v(san),
                issuer: v(issuer),
            }
        };
        assert!(cert_matches(
            &rules(&["CN=bob,*", "CN=alice,*"], &[], &[]),
            &cert
        ));
        assert!(cert_matches(
            &rules(&[], &["email:*@example.org"], &["CN=Example CA"]),
            &cert
        ));
        // Every list given must match.
        assert!(!cert_matches(
            &rules(&["CN=alice,*"], &[], &["CN=Other CA"]),
            &cert
        ));
        assert!(!cert_matches(
            &rules(&[], &["DNS:*.servers.example"], &[]),
            &cert
        ));
    }

    #[test]
    fn sticky_cookies_are_set_for_the_group_or_its_fallback() {
        let mut c = config(&format!(
            "{GROUPS}[[listeners]]\naddress = \"127.0.0.1:1\"\n[[listeners.routes]]\nproxy = \"a\"\n"
        ));
        let l = c.listeners[0].clone();
        let sticky_of = |groups: &[Arc<UpstreamGroup>]| {
            let keys = jwks::KeySources::default();
            Filters::for_route(&l, &l.routes[0], groups, &mut keys.next())
                .list
                .contains(&Filter::StickyCookie)
        };
        assert!(!sticky_of(&c.upstreams));
        let sticky = config(
            "[upstreams.s]\nservers = [\"10.0.0.1:80\"]\nsticky_cookie = \"SRV\"\n\
             [[listeners]]\naddress = \"127.0.0.1:1\"\n[[listeners.routes]]\nproxy = \"s\"\n",
        );
        Arc::make_mut(&mut c.upstreams[1]).sticky_cookie =
            sticky.upstreams[0].sticky_cookie.clone();
        assert!(sticky_of(&c.upstreams));
    }

    #[test]
    fn edits_drop_removed_and_replaced_fields_and_append_in_order() {
        struct Ip;
        impl Vars for Ip {
            fn write(&self, v: &portico_config::Var, out: &mut String) {
                assert_eq!(*v, portico_config::Var::RemoteAddr);
                out.push_str("10.0.0.1");
            }
        }
        let t = |s: &str| portico_config::Template::parse(s, None).unwrap();
        let rules = HeaderRules {
            remove: vec!["server".into()],
            set: vec![("x-frame-options".into(), t("DENY"))],
            add: vec![
                ("x-extra".into(), t("1")),
                ("x-ip".into(), t("ip={remote_addr}")),
            ],
        };
        let mut e = Edits::default();
        assert!(e.is_empty() && !e.drops("server"));
        e.rules(&rules, &Ip);
        e.add("set-cookie", Cow::Owned("SRV=abc".into()));
        assert!(e.drops("Server") && e.drops("X-Frame-Options") && !e.drops("x-extra"));
        assert!(e.sets("x-frame-options") && !e.sets("server"));
        let fields: Vec<_> = e.fields().collect();
        assert_eq!(
            fields,
            [
                ("x-frame-options", b"DENY".as_slice()),
                ("x-extra", b"1".as_slice()),
                ("x-ip", b"ip=10.0.0.1".as_slice()),
                ("set-cookie", b"SRV=abc".as_slice())
            ]
        );
    }
}
