//! One request for every client and every upstream protocol: route, the request filters, then a local answer or the proxy action's one attempt-and-retry loop (pick, forwarded head, exchange in the group's protocol, retry decision, interim commit, response filters, tunnel, response head, one relay, release), then the log filters.

mod attempt;
mod cached;
mod exchange_h1;
mod exchange_h2;
pub(crate) mod forward_auth;
mod mirror;
mod refresh;

use crate::cache::Pending;
use crate::conn::MAX_CHUNK;
use crate::downstream::{self, Client, HeadFailed, RespHead, Sent, Sink, Trailers, Upload, Watch};
use crate::error::ProxyError;
use crate::filter::auth::Checked;
use crate::filter::jwt::Refusal;
use crate::filter::{compress, Answer, Compressing, Edits};
use crate::flow::attempt::{Exchanged, Picked, Proxied, UpResponse};
use crate::flow::cached::{Hooks, NoCache};
use crate::metrics::RouteStats;
use crate::resilience::retry::Retry;
use crate::resilience::RouteResilience;
use crate::telemetry::request_id::RequestId;
use crate::telemetry::stats::Outcome;
use crate::telemetry::stats::{Phase, Termination};
use crate::telemetry::trace::TraceCtx;
use crate::upstream::pool::UpConn;
use crate::vars::RequestVars;
use bytes::{Bytes, BytesMut};
use h2::{RecvStream, SendStream};
use http::header::HeaderMap;
use portico_config::{Action, ProxyAction, Route, UpstreamProtocol};
use portico_http1::{BodyDecoder, Decoded, Framing, RequestHead};
use std::borrow::Cow;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::time::timeout;

/// Serve one request whose head arrived (at `started`): route, run the route's filters and its
/// action. The access log's end time is set here.
pub(crate) async fn serve<'a, D: Client<'a>>(
    down: &mut D,
    head: &RequestHead,
    started: Instant,
) -> Outcome {
    let env = down.env();
    let ls = env.ls;
    let trusted = &ls.listener.trusted_proxies;
    if !trusted.is_empty() {
        let client = crate::filter::client_addr(env.peer.ip(), head, trusted);
        if client != env.peer.ip() {
            down.set_client(client);
        }
    }
    if let Some(settings) = &env.shared.config.request_id {
        down.timings().request_id = RequestId::of(settings, head);
    }
    if let Some(settings) = &env.shared.config.trace {
        down.timings().trace = Some(Box::new(TraceCtx::of(settings, head)));
    }
    // An ACME server checking a challenge, on any listener, before any route.
    if head.path().starts_with(crate::acme::CHALLENGE_PREFIX) {
        if let Some(answer) = crate::acme::challenge_answer(head.path()) {
            return down
                .local(head, 200, "text/plain", answer.as_bytes(), &[])
                .await;
        }
    }
    let idx = crate::route::select(
        &ls.listener.routes,
        head.method().as_str(),
        head.host(),
        head.path(),
        |n| head.field(n),
    );
    let Some(idx) = idx else {
        return down
            .fail(head, ProxyError::NoRoute, Phase::Route, false)
            .await;
    };
    down.timings().route = u16::try_from(idx).ok();
    let outcome = run_route(down, head, idx).await;
    // A response the client never got (status 0 or a failed write) still counts its latency.
    // One clock read: the log filters' latency and the end of the access log's timings.
    let done = Instant::now();
    let latency = done.saturating_duration_since(started);
    ls.filters[idx].log(&ls.route_stats[idx], outcome.status, latency);
    down.timings().done = Some(done);
    outcome
}

/// The checks before the action (one may answer), the route's body limit, then its action.
async fn run_route<'a, D: Client<'a>>(down: &mut D, head: &RequestHead, idx: usize) -> Outcome {
    let env = down.env();
    let ls = env.ls;
    let route = &ls.listener.routes[idx];
    let filters = &ls.filters[idx];
    let mut answer = None;
    let mut auth_fields: Option<Box<Passed>> = None;
    if filters.has_gate() {
        // Boxed: only routes with checks pay for their state.
        match Box::pin(gate(down, head, idx)).await {
            Ok(fields) => auth_fields = Some(Box::new(fields)),
            Err(Stop::Answer(a)) => answer = Some(a),
            Err(Stop::Refuse {
                error,
                body,
                fields,
            }) => {
                let fields: Vec<(&str, &str)> =
                    fields.iter().map(|(n, v)| (*n, v.as_str())).collect();
                return down.refuse(head, error, body, &fields).await;
            }
        }
    }
    if route.max_body_bytes > 0 {
        if let Framing::Length(n) = head.framing {
            if n > route.max_body_bytes {
                let e = ProxyError::BodyTooLarge;
                return down.fail(head, e, Phase::RequestBody, false).await;
            }
        }
    }
    let local = answer.is_some() || !matches!(route.action, Action::Proxy(_));
    if local && head.upgrade && D::H2 {
        // Only an extended CONNECT is an upgrade here; a local answer would not tunnel.
        crate::telemetry::logging::log_limited!(info, peer = %env.peer, target = head.target(), "HTTP/2 WebSocket to a route that does not proxy: 501");
        let e = ProxyError::ExtendedConnect("the route does not proxy");
        return down.fail(head, e, Phase::Route, false).await;
    }
    if local {
        // Local answers read the whole request first: the answer then never races the body
        // (and a malformed end of an HTTP/2 stream is a stream error).
        if let Err(e) = downstream::drain(down, head, route).await {
            return down.fail(head, e, Phase::RequestBody, false).await;
        }
    }
    // One local answer (each await of a callee copies its state into this future). `answer`
    // is matched by value: the proxy arm keeps no Option<LocalAnswer> to drop after its await.
    let held: LocalAnswer;
    let (status, content_type, body, fields): (u16, &str, &[u8], Vec<Field<'_>>) = match answer {
        Some(a) => {
            held = a;
            let fields = held
                .fields
                .iter()
                .map(|(n, v)| (n.as_str(), Cow::Borrowed(v.as_str())));
            (
                held.status,
                held.content_type.as_str(),
                &held.body[..],
                fields.collect(),
            )
        }
        None => match &route.action {
            Action::Proxy(p) => return proxy_action(down, head, idx, p, auth_fields).await,
            Action::Static(_) | Action::Origin(_) => {
                return match ls.origins[idx].as_ref() {
                    Some(origin) => down.origin(head, origin).await,
                    None => {
                        down.fail(head, ProxyError::NoRoute, Phase::Route, true)
                            .await
                    }
                };
            }
            Action::Redirect { status, location } => {
                let who = down.who();
                let vars = RequestVars::new(head, route, who.tls, who.ip);
                let location = crate::vars::location(location, &vars);
                (*status, "text/plain", b"", vec![("Location", location)])
            }
            Action::Fixed {
                status,
                content_type,
                body,
            } => (*status, content_type.as_str(), body.as_bytes(), Vec::new()),
        },
    };
    let fields: Vec<(&str, &str)> = fields.iter().map(|(n, v)| (*n, &**v)).collect();
    down.local(head, status, content_type, body, &fields).await
}

/// A local answer the checks before the action made (a CORS preflight's 204, a forward auth
/// service's refusal).
struct LocalAnswer {
    status: u16,
    content_type: String,
    fields: Vec<(String, String)>,
    body: Bytes,
}

/// What the checks before the action set on the forwarded request: the fields of the JWT's
/// claims (index into `forward_claims`) and of the forward auth service's answer (index into
/// `copy_headers`).
#[derive(Default)]
struct Passed {
    claims: Option<std::sync::Arc<[(usize, String)]>>,
    forward_auth: Vec<(usize, String)>,
}

/// Where the checks before the action stopped a request.
enum Stop {
    /// Refused: the error it counts as, its body and fields.
    Refuse {
        error: ProxyError,
        body: &'static [u8],
        fields: Vec<(&'static str, String)>,
    },
    /// Answered here.
    Answer(LocalAnswer),
}

/// The checks before the route's action, in their documented order: the request filters (IP
/// rules, shedding, rate limit, CORS preflight), basic auth, JWT, forward auth. Ok with the
/// fields they set on the forwarded request.
async fn gate<'a, D: Client<'a>>(
    down: &mut D,
    head: &RequestHead,
    idx: usize,
) -> Result<Passed, Stop> {
    let env = down.env();
    let ls = env.ls;
    let route = &ls.listener.routes[idx];
    let filters = &ls.filters[idx];
    if filters.has_request_filter() {
        let now = down.timings().head.unwrap_or_else(Instant::now);
        let answer = filters.request(&crate::filter::Cx {
            route,
            counters: &ls.route_stats[idx],
            limiter: ls.resilience.get(idx).and_then(|r| r.rate_limit.as_deref()),
            load: &env.worker.load,
            slot: ls.slot,
            stats: &env.shared.stats,
            peer: env.peer,
            client: down.who().forwarded.unwrap_or(env.peer.ip()),
            client_ip: down.who().ip,
            cert: down.who().cert,
            head,
            now,
        });
        match answer {
            Ok(()) => {}
            Err(Answer::Refuse {
                error,
                body,
                retry_after,
            }) => {
                let fields = retry_after.map(|s| ("Retry-After", s.to_string()));
                return Err(Stop::Refuse {
                    error,
                    body,
                    fields: fields.into_iter().collect(),
                });
            }
            // A preflight carries no credentials: the checks below do not run for it.
            Err(Answer::Local { status, fields }) => {
                return Err(Stop::Answer(LocalAnswer {
                    status,
                    content_type: "text/plain".to_string(),
                    fields: fields
                        .into_iter()
                        .map(|(n, v)| (n.to_string(), v))
                        .collect(),
                    body: Bytes::new(),
                }));
            }
        }
    }
    if let Some(auth) = filters.auth() {
        let client = down.who().forwarded.unwrap_or(env.peer.ip());
        let stats = &env.shared.stats;
        match auth.check(head, client).await {
            Checked::Pass => {}
            Checked::Fail => {
                stats.auth_failures.fetch_add(1, Ordering::Relaxed);
                let error = ProxyError::Unauthorized;
                return Err(Stop::Refuse {
                    body: crate::error::error_body(error.status()),
                    error,
                    fields: vec![("WWW-Authenticate", auth.challenge())],
                });
            }
            Checked::Locked(wait) => {
                stats.auth_lockouts.fetch_add(1, Ordering::Relaxed);
                let error = ProxyError::RateLimited;
                let secs = crate::resilience::ratelimit::retry_after_secs(wait);
                return Err(Stop::Refuse {
                    body: crate::error::error_body(error.status()),
                    error,
                    fields: vec![("Retry-After", secs.to_string())],
                });
            }
        }
    }
    let mut passed = Passed::default();
    if let Some(jwt) = filters.jwt() {
        let stats = &env.shared.stats;
        match jwt.check(head, &stats.jwt_verified) {
            Ok(fields) => passed.claims = Some(fields),
            Err(r) => {
                let error = match r {
                    Refusal::NoKeys => ProxyError::NoKeys,
                    Refusal::Scope(_) => ProxyError::ClaimsRefused,
                    Refusal::Missing | Refusal::Invalid(_) => ProxyError::TokenRefused,
                };
                if r == Refusal::NoKeys {
                    crate::telemetry::logging::log_limited!(warn, route = %route.name, "JWT check without keys (the JWK set was never loaded): 503");
                } else {
                    stats.jwt_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(peer = %env.peer, route = %route.name, "JWT refused: {r:?}");
                }
                return Err(Stop::Refuse {
                    body: crate::error::error_body(error.status()),
                    error,
                    fields: vec![("WWW-Authenticate", jwt.challenge(&r))],
                });
            }
        }
    }
    let Some(fa) = &route.forward_auth else {
        return Ok(passed);
    };
    let who = forward_auth::WhoOwned::of(&down.who());
    match forward_auth::check(&env, fa, filters.pass_cache(), head, &who).await {
        forward_auth::Verdict::Pass(fields) => {
            passed.forward_auth = fields;
            Ok(passed)
        }
        forward_auth::Verdict::Unavailable(e) => {
            tracing::debug!(peer = %env.peer, "forward auth: {e}");
            let error = ProxyError::AuthUnavailable;
            Err(Stop::Refuse {
                body: crate::error::error_body(error.status()),
                error,
                fields: Vec::new(),
            })
        }
        forward_auth::Verdict::Answer {
            status,
            mut fields,
            body,
        } => {
            let stats = &env.shared.stats;
            stats.forward_auth_denied.fetch_add(1, Ordering::Relaxed);
            let at = fields
                .iter()
                .position(|(n, _)| n.eq_ignore_ascii_case("content-type"));
            let content_type = match at {
                Some(i) => fields.remove(i).1,
                None => "text/plain".to_string(),
            };
            Err(Stop::Answer(LocalAnswer {
                status,
                content_type,
                fields,
                body,
            }))
        }
    }
}

/// A field of a local answer.
type Field<'v> = (&'v str, Cow<'v, str>);

/// The proxy action: the forward filters, a buffered body when the route reads bodies whole,
/// then the attempts.
async fn proxy_action<'a, D: Client<'a>>(
    down: &mut D,
    head: &RequestHead,
    idx: usize,
    p: &ProxyAction,
    auth_fields: Option<Box<Passed>>,
) -> Outcome {
    let env = down.env();
    let ls = env.ls;
    let route = &ls.listener.routes[idx];
    let filters = &ls.filters[idx];
    let default = RouteResilience::default();
    let res = ls.resilience.get(idx).unwrap_or(&default);
    let counters = &ls.route_stats[idx];
    let mut forward = Edits::default();
    let group;
    let rid = down.timings().request_id;
    let traceparent = down
        .timings()
        .trace
        .as_ref()
        .map(|t| (t.traceparent(), t.parent == 0));
    {
        let who = down.who();
        let vars = RequestVars::new(head, route, who.tls, who.ip);
        filters.forward(route, &vars, &mut forward);
        if let Some(settings) = &env.shared.config.request_id {
            // A generated id replaces whatever the client sent in its field.
            if let Some(id) = rid.to_forward() {
                forward.replace(&settings.header, id);
            }
        }
        // The upstream's parent span is Portico's; `tracestate` passes as it came, unless
        // Portico started the trace (a `tracestate` without a valid `traceparent` is dropped).
        if let Some((tp, new_trace)) = traceparent {
            forward.replace("traceparent", tp);
            if new_trace {
                forward.drop_field("tracestate");
            }
        }
        group = if filters.is_rare() {
            rare_forward(route, p, head, who.ip, auth_fields, &mut forward)
        } else {
            p.upstream
        };
    }
    // A buffered body is read whole before any server is picked (a slow upload holds no server
    // connection; the attempts replay it).
    let mut buffered = None;
    if let Some(cfg) = p
        .buffer
        .as_ref()
        .filter(|_| head.has_body() && !head.upgrade)
    {
        // Boxed: only buffering routes pay for the reader's state.
        match Box::pin(downstream::buffer::read_all(down, head, route, cfg)).await {
            Ok(b) => {
                let stats = &env.shared.stats;
                stats.requests_buffered.fetch_add(1, Ordering::Relaxed);
                let spilled = b.on_disk();
                stats
                    .request_buffer_file_bytes
                    .fetch_add(spilled, Ordering::Relaxed);
                buffered = Some(b);
            }
            Err(e) => return down.fail(head, e, Phase::RequestBody, false).await,
        }
    }
    let px = Proxied {
        route,
        p,
        filters,
        forward,
        buffered,
        group,
    };
    if filters.is_rare() && p.mirror.is_some() {
        mirror::maybe_spawn(&env, &px, head, &down.who());
    }
    let mut ubuf = down.take_ubuf();
    let o = match (&p.cache, &env.shared.cache) {
        (Some(rc), Some(cache)) => {
            // Boxed: only caching routes pay for the cache's state.
            let c = cached::serve(down, head, px, res, counters, &mut ubuf, rc, cache);
            Box::pin(c).await
        }
        _ => proxy(down, head, &px, res, counters, &mut ubuf, &mut NoCache).await,
    };
    down.put_ubuf(ubuf);
    o
}

/// The proxy action's rare part (`Filters::is_rare`): the credentials basic auth checked are
/// not forwarded (unless kept), the forward auth service's fields replace the client's, and
/// the request's side of a split (once: its retries stay there). Returns the group.
#[inline(never)]
fn rare_forward<'r>(
    route: &'r Route,
    p: &ProxyAction,
    head: &RequestHead,
    ip: &str,
    auth_fields: Option<Box<Passed>>,
    forward: &mut Edits<'r>,
) -> usize {
    // The credentials stay here, unless the route passes them on.
    if route
        .basic_auth
        .as_ref()
        .is_some_and(|a| !a.keep_authorization)
    {
        forward.drop_authorization();
    }
    // The field that carries the token stays here too, unless kept.
    let token_field = route.jwt.as_ref().filter(|j| !j.keep_token);
    match token_field.and_then(|j| j.header.as_deref()) {
        Some("authorization") => forward.drop_authorization(),
        Some(other) => forward.drop_token_field(other),
        None => {}
    }
    let passed = auth_fields.map(|b| *b).unwrap_or_default();
    // Fields of the token's claims replace the client's of the same names.
    if let Some(j) = &route.jwt {
        forward.drop_claim_fields(&j.forward_claims);
        for (i, v) in passed.claims.iter().flat_map(|c| c.iter()) {
            if let Some((_, name)) = j.forward_claims.get(*i) {
                forward.add(name, Cow::Owned(v.clone()));
            }
        }
    }
    // Fields the auth service answered with replace the client's of the same names.
    if let Some(fa) = &route.forward_auth {
        forward.drop_names(&fa.copy_headers);
        for (i, v) in passed.forward_auth {
            if let Some(name) = fa.copy_headers.get(i) {
                forward.add(name, Cow::Owned(v));
            }
        }
    }
    match &p.split {
        None => p.upstream,
        Some(s) => crate::split::group(s, p.upstream, head, ip),
    }
}

/// Proxy one request to the route's upstream group, retrying failed attempts on other servers
/// as the route's `retry` policy and budget allow. `ubuf` holds the forwarded head (its
/// allocation is kept across requests).
async fn proxy<'a, 'r, D: Client<'a>, H: Hooks<'r>>(
    down: &mut D,
    head: &RequestHead,
    px: &Proxied<'_>,
    res: &RouteResilience,
    counters: &RouteStats,
    ubuf: &mut BytesMut,
    cx: &mut H,
) -> Outcome {
    // The clock read at the head serves the budget, the pick (ejection expiry, slow start) and
    // the header-time metric.
    // A buffered body took the client's upload time: the attempts start after it.
    let now = match px.buffered {
        Some(_) => Instant::now(),
        None => down.timings().head.unwrap_or_else(Instant::now),
    };
    let budget = res.retry_budget.as_deref();
    let replayable = px.buffered.is_some();
    let mut retry = Retry::new(px.p.retry.as_ref(), budget, head, replayable, now, counters);
    loop {
        if let Some(outcome) = attempt(down, head, px, &mut retry, ubuf, cx).await {
            return outcome;
        }
    }
}

/// One attempt: pick a server (not one that failed this request before, when another can take
/// it), exchange, relay. None = the attempt failed before anything reached the client and
/// `retry` granted another one.
async fn attempt<'a, 'r, D: Client<'a>, H: Hooks<'r>>(
    down: &mut D,
    head: &RequestHead,
    px: &Proxied<'_>,
    retry: &mut Retry<'_>,
    ubuf: &mut BytesMut,
    cx: &mut H,
) -> Option<Outcome> {
    let (route, p) = (px.route, px.p);
    let env = down.env();
    let shared = env.shared;
    let mut asked = retry.started();
    let watch = down.watch();
    let pick = crate::flow::attempt::pick(
        shared,
        px.group,
        down.who().ip,
        || down.addresses(),
        head,
        retry,
        &mut asked,
    );
    // An HTTP/2 client that resets its stream while the request waits in a queue leaves at once.
    let picked = unless_reset(watch, std::pin::pin!(pick)).await;
    let picked = picked.unwrap_or(Err(ProxyError::ClientClosed));
    let t = match picked {
        Ok(t) => t,
        Err(e) => {
            if let Some(o) = stale_instead(down, head, px, cx).await {
                return Some(o);
            }
            return Some(down.fail(head, e, Phase::Connect, false).await);
        }
    };
    let addr = t.addr();
    let h2_group = t.group().protocol == UpstreamProtocol::H2;
    // The forwarded head in the group's protocol: HTTP/1.1 bytes here, an HTTP/2 request in
    // the HTTP/2 exchange.
    if !h2_group {
        ubuf.clear();
        t.write_head(ubuf, head, route, p, &px.forward, &down.who());
    }
    // A WebSocket opening handshake goes to an HTTP/2 server as an extended CONNECT (other
    // upgrades go as plain requests, without `Upgrade`, which the server may answer).
    let tunnel = h2_group && crate::websocket::is_websocket(head);
    let has_body = head.has_body();
    if has_body && px.buffered.is_none() {
        if let Err(e) = down.before_upload(head).await {
            return Some(down.fail(head, e, Phase::RequestBody, false).await);
        }
    }
    let mut upload = match &px.buffered {
        Some(b) => Upload::replay(b.clone()),
        None => down.upload(head, route, has_body, tunnel),
    };
    let mut interims = down.interims(head);
    let exchanged = {
        let work = async {
            match h2_group {
                // Boxed: its state would otherwise widen every request's future.
                true => {
                    let x = crate::flow::exchange_h2::exchange_attempt(
                        down,
                        env,
                        &t,
                        px,
                        head,
                        &mut upload,
                        &mut interims,
                        retry,
                    );
                    Box::pin(x).await
                }
                false => {
                    crate::flow::exchange_h1::exchange_attempt(
                        down,
                        env,
                        &t,
                        ubuf,
                        head,
                        &mut upload,
                        &mut interims,
                        retry,
                    )
                    .await
                }
            }
        };
        // An HTTP/2 client that resets its stream ends the exchange at once.
        let exchanged = unless_reset(watch, std::pin::pin!(work)).await;
        exchanged.unwrap_or(Exchanged::Failed {
            e: ProxyError::ClientClosed,
            phase: Phase::ResponseHead,
            body_done: false,
        })
    };
    let (resp, body_done, reused, got) = match exchanged {
        Exchanged::Retry => return None,
        Exchanged::Failed {
            e,
            phase,
            body_done,
        } => {
            if let Some(o) = stale_instead(down, head, px, cx).await {
                return Some(o);
            }
            // The access log names the server that refused, timed out or failed.
            let mut o = down.fail(head, e, phase, body_done).await;
            o.upstream = Some(addr);
            return Some(o);
        }
        Exchanged::Response {
            resp,
            body_done,
            reused,
            got,
        } => (resp, body_done, reused, got),
    };
    down.timings().response = Some(got);
    let status = resp.status();
    // A retried response is dropped before any of it is sent (never after an interim response:
    // the retry was committed then); its connection or stream closes with it.
    if t.accepted(shared, retry, asked, got, reused, status) {
        return None;
    }
    // A caching route: a 304 to its revalidation or a failure a stale response stands in for
    // is answered from the cache; a storable response is copied as it streams.
    let mut store = None;
    if let Some(c) = cx.caching() {
        match cached::on_response(c, px, head, &resp, status) {
            cached::Next::Relay(p) => store = p,
            cached::Next::FromCache(fields) => {
                if let UpResponse::H1 { up, head: rh } = resp {
                    let reusable = rh.keep_alive && body_done && rh.framing == Framing::None;
                    t.release(shared, &env.worker.pool, up, reusable);
                }
                let answer = cached::answer_after(down, head, px, c, fields);
                return Some(Box::pin(answer).await);
            }
        }
    }
    // Interim heads still held (they came while the client connection was read for the body).
    if let Err(e) = down.flush_interims(&mut interims).await {
        return Some(client_gone(status, addr, e));
    }
    let idle = t.group().idle_timeout;
    // The server's byte count, kept past the release of `t`.
    let (counted, server) = (t.upstream, t.server());
    let mut edits = Edits::default();
    let rid = down.timings().request_id;
    let who = down.who();
    let vars = RequestVars::new(head, route, who.tls, who.ip);
    let mut z = response_filters(px, head, &vars, &resp, &t, &mut edits);
    if let Some(settings) = shared.config.request_id.as_ref().filter(|r| r.response) {
        if let Some(id) = rid.text(settings, head) {
            edits.replace(&settings.header, id.into_owned());
        }
    }
    if let Some(c) = cx.caching() {
        edits.add("Cache-Status", Cow::Borrowed(c.forwarded(store.is_some())));
    }
    let via = p.via;
    match resp {
        UpResponse::H1 { mut up, head: rh } => {
            // 101: the upgrade's tunnel, or an error when it is not one.
            let switching = down.switching(head, &rh, addr);
            match switching {
                Some(Err(e)) => {
                    let mut o = down.fail(head, e, Phase::ResponseHead, body_done).await;
                    o.upstream = Some(addr);
                    return Some(o);
                }
                Some(Ok(())) => {
                    let tunnel = down.tunnel_h1(up, &rh, &edits, via, head, addr, idle);
                    // Boxed: a rare, long-lived state that would otherwise widen every request.
                    return Some(Box::pin(tunnel).await);
                }
                None => {}
            }
            let up_reusable = rh.keep_alive && body_done && rh.framing != Framing::Close;
            let resp = RespHead::H1(&rh);
            let failed = match down.response_head(head, resp, &edits, via, body_done) {
                Ok(mut sent) => {
                    let r = match sent.end {
                        true => Ok(()),
                        false => {
                            let mut body = UpBody::H1 {
                                up: &mut up,
                                dec: BodyDecoder::new(rh.framing),
                                idle,
                                eof: false,
                                store: store.as_deref_mut(),
                            };
                            relay(&mut body, &mut sent.out, &mut z).await
                        }
                    };
                    record(z, shared);
                    if r.is_ok() {
                        cached::store(cx.caching(), store);
                        // The upstream exchange is complete: free the connection and the
                        // server's active slot before the last client write, so neither waits
                        // on a slow client.
                        t.release(shared, &env.worker.pool, up, up_reusable);
                    }
                    let r = r.map_err(|e| (e, Phase::ResponseBody));
                    let o = end_response(r, sent, status, Some(addr), D::H2).await;
                    counted.add_bytes(server, o.bytes_sent);
                    return Some(o);
                }
                Err(f) => f,
            };
            Some(head_failed(down, head, failed, status, addr, body_done).await)
        }
        UpResponse::H2 {
            lease,
            parts,
            mut body,
            send,
        } => {
            if upload.is_tunnel() && parts.status.is_success() {
                let tunnel = down.tunnel_h2(head, &edits, via, parts, body, send, addr, idle);
                let o = Box::pin(tunnel).await;
                drop(lease);
                return Some(o);
            }
            let end = body.is_end_stream();
            let resp = RespHead::H2 { parts, end };
            // A success before an HTTP/2 client's upload ended streams the rest of it while
            // the response streams back (gRPC bidirectional calls); an early error response
            // ended the upload in the exchange.
            if body_done || status >= 300 {
                drop(send);
                let failed = match down.response_head(head, resp, &edits, via, body_done) {
                    Ok(mut sent) => {
                        let r = match sent.end {
                            true => Ok(()),
                            false => {
                                let mut body = UpBody::h2(&mut body, idle, store.as_deref_mut());
                                relay(&mut body, &mut sent.out, &mut z).await
                            }
                        };
                        record(z, shared);
                        if r.is_ok() {
                            cached::store(cx.caching(), store);
                        }
                        // The exchange is over: free the stream slot and the server's active
                        // slot before the last client write.
                        drop(lease);
                        drop(t);
                        let r = r.map_err(|e| (e, Phase::ResponseBody));
                        let o = end_response(r, sent, status, Some(addr), D::H2).await;
                        counted.add_bytes(server, o.bytes_sent);
                        return Some(o);
                    }
                    Err(f) => f,
                };
                return Some(head_failed(down, head, failed, status, addr, body_done).await);
            }
            let sent = match down.response_head_apart(resp, &edits, via) {
                Ok(s) => s,
                Err(f) => return Some(head_failed(down, head, f, status, addr, body_done).await),
            };
            // Boxed: only HTTP/2 clients stream both ways at once.
            let both = relay_with_upload(down, sent, body, send, upload, idle, status, addr, z);
            let o = Box::pin(both).await;
            drop(lease);
            drop(t);
            counted.add_bytes(server, o.bytes_sent);
            Some(o)
        }
    }
}

/// A success before an HTTP/2 client's upload ended: the rest of the upload (to `send`) goes
/// on while the response body streams back.
#[allow(clippy::too_many_arguments)]
async fn relay_with_upload<'a, D: Client<'a>, O: Sink>(
    down: &mut D,
    sent: Sent<O>,
    mut body: RecvStream,
    mut send: SendStream<Bytes>,
    mut upload: Upload,
    idle: Duration,
    status: u16,
    addr: SocketAddr,
    mut z: Option<Box<Compressing>>,
) -> Outcome {
    let Sent { mut out, end, .. } = sent;
    let mut upload_done = false;
    let r = {
        let relay = async {
            match end {
                true => Ok(()),
                false => relay(&mut UpBody::h2(&mut body, idle, None), &mut out, &mut z).await,
            }
        };
        tokio::pin!(relay);
        let up_fut = crate::flow::exchange_h2::upload(&mut send, &mut upload, down, idle);
        tokio::pin!(up_fut);
        loop {
            tokio::select! {
                r = &mut relay => break r.map_err(|e| (e, Phase::ResponseBody)),
                u = &mut up_fut, if !upload_done => match u {
                    Ok(()) => upload_done = true,
                    Err(e) => break Err(e),
                },
            }
        }
    };
    if !upload_done {
        send.send_reset(h2::Reason::CANCEL);
    }
    record(z, down.env().shared);
    let sent = Sent {
        out,
        keep_alive: true,
        end,
    };
    end_response(r, sent, status, Some(addr), true).await
}

/// A caching route's stale response in place of a failed attempt (`stale-if-error`), when one
/// may answer; None for every other route.
async fn stale_instead<'a, 'r, D: Client<'a>, H: Hooks<'r>>(
    down: &mut D,
    head: &RequestHead,
    px: &Proxied<'_>,
    cx: &mut H,
) -> Option<Outcome> {
    let c = cx.caching()?;
    // Boxed: only caching routes pay for the cache's answer state.
    Box::pin(cached::instead_of_error(down, head, px, c)).await
}

/// `work`'s output, or None when the client reset its stream first (never for an HTTP/1.1
/// client). `work` is pinned by the caller and polled where it is: no second copy of its state,
/// as a `select!` or an `async fn` taking it would keep.
fn unless_reset<'w, F: Future>(
    watch: Watch<'w>,
    mut work: Pin<&'w mut F>,
) -> impl Future<Output = Option<F::Output>> + 'w {
    std::future::poll_fn(move |cx| {
        if let Poll::Ready(v) = work.as_mut().poll(cx) {
            return Poll::Ready(Some(v));
        }
        watch.poll_reset(cx).map(|()| None)
    })
}

/// The response head could not go out: an invalid head is answered with its error, a client
/// that is gone only recorded.
async fn head_failed<'a, D: Client<'a>>(
    down: &mut D,
    head: &RequestHead,
    f: HeadFailed,
    status: u16,
    addr: SocketAddr,
    body_done: bool,
) -> Outcome {
    let mut o = match f {
        HeadFailed::Invalid(e) => down.fail(head, e, Phase::ResponseHead, body_done).await,
        HeadFailed::Client(e) => Outcome {
            termination: e.termination(Phase::ResponseHead),
            status,
            keep_alive: D::H2,
            bytes_sent: 0,
            upstream: None,
        },
    };
    o.upstream = Some(addr);
    o
}

/// The last buffered bytes go out, and the request's outcome: a failure in the body stops an
/// HTTP/2 client's stream (unless the client is gone) and closes an HTTP/1.1 connection.
async fn end_response<O: Sink>(
    r: Result<(), (ProxyError, Phase)>,
    sent: Sent<O>,
    status: u16,
    addr: Option<SocketAddr>,
    h2: bool,
) -> Outcome {
    let Sent {
        mut out,
        keep_alive,
        ..
    } = sent;
    let r = match r {
        Ok(()) => out.flush().await.map_err(|e| (e, Phase::ResponseBody)),
        Err(x) => {
            out.abort(&x.0);
            return Outcome {
                termination: x.0.termination(x.1),
                status,
                keep_alive: h2,
                bytes_sent: 0,
                upstream: addr,
            };
        }
    };
    match r {
        Ok(()) => Outcome {
            termination: Termination::OK,
            status,
            keep_alive,
            bytes_sent: out.sent(),
            upstream: addr,
        },
        Err((e, phase)) => Outcome {
            termination: e.termination(phase),
            status,
            keep_alive: false,
            bytes_sent: out.sent(),
            upstream: addr,
        },
    }
}

/// A response body as the server sends it: an HTTP/1.1 connection's bytes through the body
/// decoder, or an HTTP/2 stream's DATA and trailers.
enum UpBody<'u> {
    H1 {
        up: &'u mut UpConn,
        dec: BodyDecoder,
        idle: Duration,
        /// The server closed a close-delimited body: it is complete.
        eof: bool,
        /// The response is being stored: the body is copied as it is handed out.
        store: Option<&'u mut Pending>,
    },
    H2 {
        body: &'u mut RecvStream,
        idle: Duration,
        /// DATA received and not yet handed out.
        pending: Option<Bytes>,
        /// The stream ended, with these trailers.
        end: Option<Option<HeaderMap>>,
        store: Option<&'u mut Pending>,
    },
    /// A stored response's body, handed out as it is read.
    Stored(crate::cache::body::Part),
}

/// What a response body has ready.
enum Step {
    /// Bytes; true when they end a sized body (nothing follows them).
    Data(Bytes, bool),
    /// The end of the body, with its trailers.
    End(Trailers),
    /// Nothing until the server sends more ([`UpBody::fill`]).
    Wait,
}

impl<'u> UpBody<'u> {
    fn h2(body: &'u mut RecvStream, idle: Duration, store: Option<&'u mut Pending>) -> Self {
        UpBody::H2 {
            body,
            idle,
            pending: None,
            end: None,
            store,
        }
    }

    /// What is ready without waiting.
    fn step(&mut self) -> Result<Step, ProxyError> {
        match self {
            UpBody::H1 { eof: true, .. } => Ok(Step::End(Trailers::Raw(Bytes::new()))),
            UpBody::H1 { up, dec, store, .. } => {
                match dec
                    .decode(&mut up.rbuf, MAX_CHUNK)
                    .map_err(ProxyError::BadResponseBody)?
                {
                    Decoded::Data(d) => {
                        if let Some(p) = store {
                            p.push(&d);
                        }
                        Ok(Step::Data(d, dec.remaining() == Some(0)))
                    }
                    Decoded::Done { trailers } => Ok(Step::End(Trailers::Raw(trailers))),
                    Decoded::NeedMore => Ok(Step::Wait),
                }
            }
            UpBody::H2 {
                pending,
                end,
                store,
                ..
            } => {
                if let Some(d) = pending.take() {
                    if let Some(p) = store {
                        p.push(&d);
                    }
                    return Ok(Step::Data(d, false));
                }
                match end.take() {
                    Some(t) => Ok(Step::End(Trailers::Map(t))),
                    None => Ok(Step::Wait),
                }
            }
            UpBody::Stored(part) => match part.next() {
                Some(Ok((d, last))) => Ok(Step::Data(d, last)),
                Some(Err(_)) => Err(ProxyError::Internal("a stored body could not be read")),
                None => Ok(Step::End(Trailers::Raw(Bytes::new()))),
            },
        }
    }

    /// Wait for more of the body, at most the group's `idle_timeout`.
    async fn fill(&mut self) -> Result<(), ProxyError> {
        match self {
            UpBody::H1 {
                up, dec, idle, eof, ..
            } => {
                if up.rbuf.capacity() - up.rbuf.len() < 4096 {
                    up.rbuf.reserve(MAX_CHUNK);
                }
                let read = match timeout(*idle, up.stream.read_buf(&mut up.rbuf)).await {
                    // A TLS server closing without close_notify (common) ends a close-delimited
                    // body as a plain close would; framed bodies still fail the decoder below.
                    Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(Ok(0)),
                    r => r,
                };
                match read {
                    Err(_) => Err(ProxyError::UpstreamIdle),
                    Ok(Err(e)) => Err(ProxyError::UpstreamIo(e)),
                    Ok(Ok(0)) => match dec.on_eof().map_err(ProxyError::BadResponseBody)? {
                        Decoded::Done { .. } => {
                            *eof = true;
                            Ok(())
                        }
                        _ => Err(ProxyError::UpstreamClosed),
                    },
                    Ok(Ok(_)) => Ok(()),
                }
            }
            UpBody::Stored(_) => Ok(()),
            UpBody::H2 {
                body,
                idle,
                pending,
                end,
                ..
            } => match timeout(*idle, body.data()).await {
                Err(_) => Err(ProxyError::UpstreamIdle),
                Ok(Some(Err(e))) => Err(crate::h2_io::up_err(e)),
                Ok(Some(Ok(d))) => {
                    if !d.is_empty() {
                        *pending = Some(d);
                    }
                    Ok(())
                }
                Ok(None) => {
                    let trailers = match timeout(*idle, body.trailers()).await {
                        Err(_) => return Err(ProxyError::UpstreamIdle),
                        Ok(r) => r.map_err(crate::h2_io::up_err)?,
                    };
                    *end = Some(trailers.map(crate::headers::trailer_fields));
                    Ok(())
                }
            },
        }
    }

    /// `n` bytes were passed to the client: an HTTP/2 server may send as many more.
    fn release(&mut self, n: usize) {
        if let UpBody::H2 { body, .. } = self {
            let _ = body.flow_control().release_capacity(n);
        }
    }
}

/// The response filters for the server's final head `resp`: the head's edits, and (when the
/// route has a body filter) the compression its body goes through, if any.
fn response_filters<'r>(
    px: &Proxied<'r>,
    head: &RequestHead,
    vars: &RequestVars<'_>,
    resp: &UpResponse,
    t: &Picked<'_>,
    edits: &mut Edits<'r>,
) -> Option<Box<Compressing>> {
    let (filters, route) = (px.filters, px.route);
    filters.response(route, head, vars, Some((t.upstream, t.server())), edits);
    if !filters.has_body_filter() {
        return None;
    }
    match resp {
        UpResponse::H1 { head: rh, .. } => body_filter(px, head, rh, edits),
        UpResponse::H2 { parts, body, .. } => {
            let fields = || {
                parts
                    .headers
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_bytes()))
            };
            let length = parts.headers.get(http::header::CONTENT_LENGTH);
            let length = length.and_then(|v| v.to_str().ok()?.parse().ok());
            let view = compress::Response {
                status: parts.status.as_u16(),
                body: !body.is_end_stream(),
                length,
                fields: &fields,
            };
            filters.response_body(route, head, &view, edits)
        }
    }
}

/// The body filter (compression) for an HTTP/1 response head `rh`, if the route's filters
/// apply one to it.
fn body_filter<'r>(
    px: &Proxied<'r>,
    head: &RequestHead,
    rh: &portico_http1::ResponseHead,
    edits: &mut Edits<'r>,
) -> Option<Box<Compressing>> {
    let fields = || rh.fields();
    let (body, length) = match rh.framing {
        Framing::None => (false, None),
        Framing::Length(n) => (true, Some(n)),
        Framing::Chunked | Framing::Close => (true, None),
    };
    let view = compress::Response {
        status: rh.status(),
        body,
        length,
        fields: &fields,
    };
    px.filters.response_body(px.route, head, &view, edits)
}

/// Count a compressed response.
#[inline]
fn record(z: Option<Box<Compressing>>, shared: &crate::state::Shared) {
    if let Some(z) = z {
        z.record(&shared.stats);
    }
}

/// Relay a response body to the client until the server's side is complete (an HTTP/1.1
/// client's last bytes stay buffered for the final [`Sink::flush`]), through the compression
/// filter `z` when there is one. An HTTP/2 client's reset ends it while it waits for the
/// server.
async fn relay<O: Sink>(
    up: &mut UpBody<'_>,
    out: &mut O,
    z: &mut Option<Box<Compressing>>,
) -> Result<(), ProxyError> {
    // Two loops, so that the common one (no body filter) stays as small as it was.
    match z {
        None => relay_plain(up, out).await,
        Some(z) => relay_coded(up, out, z).await,
    }
}

async fn relay_plain<O: Sink>(up: &mut UpBody<'_>, out: &mut O) -> Result<(), ProxyError> {
    loop {
        match up.step()? {
            Step::Data(d, last) => {
                let n = d.len();
                if !out.try_buffer(&d) {
                    out.data(d, last).await?;
                }
                up.release(n);
                if last {
                    return Ok(());
                }
            }
            Step::End(trailers) => return out.end(trailers),
            Step::Wait => {
                out.flush().await?;
                tokio::select! {
                    r = up.fill() => r?,
                    e = out.reset() => return Err(e),
                }
            }
        }
    }
}

/// The relay through the compression filter: what the codec makes goes out; at a sized body's
/// end the compressed stream ends (chunked, or a stream's END_STREAM), and before each wait for
/// the server the codec is flushed.
async fn relay_coded<O: Sink>(
    up: &mut UpBody<'_>,
    out: &mut O,
    z: &mut Compressing,
) -> Result<(), ProxyError> {
    loop {
        match up.step()? {
            Step::Data(d, last) => {
                let n = d.len();
                let c = z.data(&d, last)?;
                if !c.is_empty() {
                    out.data(c, false).await?;
                }
                up.release(n);
                if last {
                    return out.end(Trailers::Raw(Bytes::new()));
                }
            }
            Step::End(trailers) => {
                let c = z.finish()?;
                if !c.is_empty() {
                    out.data(c, false).await?;
                }
                return out.end(trailers);
            }
            Step::Wait => {
                let c = z.flush()?;
                if !c.is_empty() {
                    out.data(c, false).await?;
                }
                out.flush().await?;
                tokio::select! {
                    r = up.fill() => r?,
                    e = out.reset() => return Err(e),
                }
            }
        }
    }
}

/// A client write of the response head failed with `e` (a client that accepted nothing within
/// `send_timeout` is a client timeout, as for every other client write).
fn client_gone(status: u16, addr: SocketAddr, e: std::io::Error) -> Outcome {
    Outcome {
        termination: ProxyError::ClientIo(e).termination(Phase::ResponseHead),
        status,
        keep_alive: false,
        bytes_sent: 0,
        upstream: Some(addr),
    }
}

#[cfg(test)]
mod tests {
    use super::client_gone;
    use crate::telemetry::stats::{Cause, Phase, Side, Termination};
    use std::io::{Error, ErrorKind};

    #[test]
    fn a_failed_interim_write_keeps_its_cause() {
        let addr = "127.0.0.1:9".parse().unwrap();
        let stalled = client_gone(103, addr, Error::new(ErrorKind::TimedOut, "no room"));
        let timeout = Termination::new(Side::Client, Phase::ResponseHead, Cause::Timeout);
        assert_eq!(stalled.termination, timeout);
        assert!(!stalled.keep_alive);
        let reset = client_gone(103, addr, ErrorKind::ConnectionReset.into());
        assert_eq!(reset.termination.cause, Cause::Io);
    }
}
