//! One HTTP/2 stream: translate, route, run the action (proxy over pooled HTTP/1.1, origin, redirect, respond), relay body and trailers under flow control, record once.

use super::request::{to_http1, Reject};
use super::{Current, Link};
use crate::admit::{self, Refused};
use crate::attempt::{self, Failed};
use crate::conn::{Outcome, MAX_CHUNK, STALL_TIMEOUT};
use crate::error::ProxyError;
use crate::forward::{read_response_head, Head, MAX_INTERIM};
use crate::h2_fields::{append, trailer_map};
use crate::h2_io::{client_err, finish, send_windowed, Peer};
use crate::pool::UpConn;
use crate::resilience::RouteResilience;
use crate::retry::Retry;
use crate::server::Shared;
use crate::stats::{Phase, Termination};
use crate::timing::Timings;
use bytes::{Bytes, BytesMut};
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use http::header::HeaderMap;
use portico_config::{Action, HeaderRules, ProxyAction, Route};
use portico_http1::{
    encode, parse_response, BodyDecoder, Decoded, Framing, Limits, Method, RequestHead,
    ResponseHead,
};
use std::future::poll_fn;
use std::io;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::timeout;

/// Far-away deadline while a request body is still streaming.
const FAR: Duration = Duration::from_secs(365 * 24 * 3600);

/// A stream being served.
struct Stream<'a> {
    link: &'a Link,
    cur: Rc<Current>,
    respond: SendResponse<Bytes>,
    body: RecvStream,
    /// Phase timings for the access log (the head is complete when the stream arrives).
    timings: Timings,
}

/// Serve one stream; exactly one termination record and one access-log line.
pub(super) async fn handle(
    link: &Link,
    req: http::Request<RecvStream>,
    respond: SendResponse<Bytes>,
) {
    let started = Instant::now();
    let cur = link.current();
    cur.shared.stats.requests.fetch_add(1, Ordering::Relaxed);
    let (parts, body) = req.into_parts();
    let has_body = !body.is_end_stream();
    let mut s = Stream {
        link,
        cur,
        respond,
        body,
        timings: Timings::begin(started),
    };
    // An extended CONNECT (RFC 8441) becomes an HTTP/1.1 upgrade request (`tunnel`).
    let translated = match super::tunnel::protocol(&parts) {
        None => to_http1(&parts, has_body, &s.cur.ls.limits),
        Some(p) => super::tunnel::translate(&parts, p, &s.cur.ls.limits),
    };
    let (head, outcome) = match translated {
        Err(reject) => {
            let (e, what) = match reject {
                Reject::Head(e) => (ProxyError::BadHead(e), "refused head"),
                Reject::Malformed(why) => (ProxyError::Http2Malformed(why), why),
                Reject::Connect => (ProxyError::Http2Connect, "CONNECT"),
                Reject::Protocol => {
                    let p = super::tunnel::protocol(&parts).unwrap_or_default();
                    tracing::debug!(peer = %link.peer, protocol = p, "HTTP/2 extended CONNECT for a protocol other than websocket: 501");
                    let e = ProxyError::ExtendedConnect(":protocol other than websocket");
                    (e, "extended CONNECT protocol")
                }
            };
            tracing::debug!(peer = %link.peer, "HTTP/2 request refused: {what}");
            (None, s.fail(None, e, Phase::RequestHead).await)
        }
        Ok(head) => {
            let o = s.run(&head, started).await;
            (Some(head), o)
        }
    };
    // A stream the client reset before its end (any phase) counts towards the rapid-reset limit.
    if outcome.termination == ProxyError::ClientClosed.termination(outcome.termination.phase) {
        link.client_reset();
    }
    s.cur.shared.stats.record(outcome.termination);
    if let Some(log) = &s.cur.shared.access_log {
        log.write(
            link.peer,
            head.as_ref(),
            "HTTP/2.0",
            &outcome,
            &s.timings.phases(started),
        );
    }
}

impl Stream<'_> {
    async fn run(&mut self, head: &RequestHead, started: Instant) -> Outcome {
        let cur = self.cur.clone();
        let ls = &cur.ls;
        let idx = crate::route::select(
            &ls.listener.routes,
            head.method().as_str(),
            head.host(),
            head.path(),
            |n| head.field(n),
        );
        let Some(idx) = idx else {
            return self
                .fail(Some(head), ProxyError::NoRoute, Phase::Route)
                .await;
        };
        let route = &ls.listener.routes[idx];
        let outcome = self.run_route(head, route, idx).await;
        // One clock read: the route latency and the end of the access log's timings.
        let done = Instant::now();
        ls.route_stats[idx].record(outcome.status, done.saturating_duration_since(started));
        self.timings.done = Some(done);
        outcome
    }

    async fn run_route(&mut self, head: &RequestHead, route: &Route, idx: usize) -> Outcome {
        // Shedding and the route's rate limit, as for HTTP/1.1 (`conn::run_route`).
        let link = self.link;
        let stats = &self.cur.shared.stats;
        let now = self.timings.head.unwrap_or_else(Instant::now);
        let admitted = admit::check(
            &self.cur.ls,
            &link.worker,
            stats,
            idx,
            link.peer,
            &link.client_ip,
            head,
            now,
        );
        match admitted {
            Ok(()) => {}
            Err(Refused::Shed) => {
                let e = ProxyError::Shed;
                return self.refuse(head, e, crate::load::SHED_BODY, &[]).await;
            }
            Err(Refused::RateLimited(wait)) => {
                let secs = crate::ratelimit::retry_after_secs(wait).to_string();
                let e = ProxyError::RateLimited;
                let body = crate::conn::error_body(e.status());
                let extra = [("retry-after", secs.as_str())];
                return self.refuse(head, e, body, &extra).await;
            }
        }
        if route.max_body_bytes > 0 {
            if let Framing::Length(n) = head.framing {
                if n > route.max_body_bytes {
                    let e = ProxyError::BodyTooLarge;
                    return self.fail(Some(head), e, Phase::RequestBody).await;
                }
            }
        }
        if head.upgrade && !matches!(route.action, Action::Proxy(_)) {
            // Only an extended CONNECT is an upgrade here; a local answer would not tunnel.
            crate::log_limited!(info, peer = %link.peer, target = head.target(), "HTTP/2 WebSocket to a route that does not proxy: 501");
            let e = ProxyError::ExtendedConnect("the route does not proxy");
            return self.fail(Some(head), e, Phase::Route).await;
        }
        if !matches!(route.action, Action::Proxy(_)) {
            // Local actions read the whole request first (as for HTTP/1): a malformed end of
            // stream is then a stream error instead of racing the response.
            if let Err(e) = self.drain(route.max_body_bytes).await {
                return self.fail(Some(head), e, Phase::RequestBody).await;
            }
        }
        match &route.action {
            Action::Proxy(p) => self.proxy(head, route, p, idx).await,
            Action::Static(_) | Action::Origin(_) => {
                let cur = self.cur.clone();
                match cur.ls.origins[idx].as_ref() {
                    Some(origin) => self.origin(head, origin).await,
                    None => {
                        self.fail(Some(head), ProxyError::NoRoute, Phase::Route)
                            .await
                    }
                }
            }
            Action::Redirect { status, location } => {
                let extra = [("location", location.as_str())];
                self.local(head, *status, "text/plain", b"", &extra).await
            }
            Action::Fixed {
                status,
                content_type,
                body,
            } => {
                self.local(head, *status, content_type, body.as_bytes(), &[])
                    .await
            }
        }
    }

    /// Read and discard the request body and trailers, under the route's size limit.
    async fn drain(&mut self, max: u64) -> Result<(), ProxyError> {
        if self.body.is_end_stream() {
            return Ok(());
        }
        let started = tokio::time::Instant::now();
        let min_rate = self.cur.ls.listener.limits.body_min_rate;
        let mut received = 0u64;
        loop {
            let Some(next) = next_data(&mut self.body, started, received, min_rate).await? else {
                break;
            };
            received += next.len() as u64;
            if max > 0 && received > max {
                return Err(ProxyError::BodyTooLarge);
            }
            let _ = self.body.flow_control().release_capacity(next.len());
        }
        match timeout(STALL_TIMEOUT, self.body.trailers()).await {
            Err(_) => Err(ProxyError::BodyTooSlow),
            Ok(r) => r.map(|_| ()).map_err(client_err),
        }
    }

    /// Answer with an error status (unless the client is gone) and describe the failure.
    async fn fail(&mut self, head: Option<&RequestHead>, e: ProxyError, phase: Phase) -> Outcome {
        tracing::debug!(peer = %self.link.peer, target = head.map_or("-", |h| h.target()), "HTTP/2 request failed: {e}");
        let body = crate::conn::error_body(e.status());
        self.answer(head, e, phase, body, &[]).await
    }

    /// Refuse a routed request before its action (shed, rate limited; counted and logged by
    /// `admit::check`), with `body` and `extra` fields.
    async fn refuse(
        &mut self,
        head: &RequestHead,
        e: ProxyError,
        body: &[u8],
        extra: &[(&str, &str)],
    ) -> Outcome {
        self.answer(Some(head), e, Phase::Route, body, extra).await
    }

    /// The error response for `e` and its outcome.
    async fn answer(
        &mut self,
        head: Option<&RequestHead>,
        e: ProxyError,
        phase: Phase,
        body: &[u8],
        extra: &[(&str, &str)],
    ) -> Outcome {
        let status = e.status();
        let sent = if e.client_gone() {
            0
        } else {
            let head_only = head.is_some_and(|h| *h.method() == Method::Head);
            send_simple(
                &mut self.respond,
                status,
                "text/plain",
                body,
                extra,
                head_only,
                self.cur.ls.listener.limits.send_timeout,
            )
            .await
            .unwrap_or(0)
        };
        Outcome {
            termination: e.termination(phase),
            status,
            keep_alive: true,
            bytes_sent: sent,
            upstream: None,
        }
    }

    /// A response generated here (respond, redirect).
    async fn local(
        &mut self,
        head: &RequestHead,
        status: u16,
        content_type: &str,
        body: &[u8],
        extra: &[(&str, &str)],
    ) -> Outcome {
        let head_only = *head.method() == Method::Head;
        match send_simple(
            &mut self.respond,
            status,
            content_type,
            body,
            extra,
            head_only,
            self.cur.ls.listener.limits.send_timeout,
        )
        .await
        {
            Ok(n) => Outcome::ok(status, true, n),
            Err(e) => Outcome {
                termination: e.termination(Phase::ResponseBody),
                status,
                keep_alive: true,
                bytes_sent: 0,
                upstream: None,
            },
        }
    }

    /// The origin action: its HTTP/1 head is parsed back and sent as HTTP/2.
    async fn origin(&mut self, head: &RequestHead, origin: &portico_origin::Origin) -> Outcome {
        let mut buf = BytesMut::with_capacity(512);
        let reply = origin.respond(head, &mut buf);
        encode::end_head(&mut buf);
        if let Some(d) = reply.delay {
            tokio::time::sleep(d).await;
        }
        let status = reply.status;
        let resp = match parse_response(&mut buf, head.method(), &Limits::default()) {
            Ok(Some(r)) => r,
            _ => {
                let e = ProxyError::Internal("origin head did not parse");
                return self.fail(Some(head), e, Phase::ResponseHead).await;
            }
        };
        let response = response_from(&resp, &HeaderRules::default(), false);
        let end = matches!(reply.body, portico_origin::Body::Empty);
        let mut send = match self.respond.send_response(response, end) {
            Ok(s) => s,
            Err(e) => return client_failed(e, status, Phase::ResponseHead),
        };
        let limit = self.cur.ls.listener.limits.send_timeout;
        let r: Result<u64, ProxyError> = async {
            match reply.body {
                portico_origin::Body::Empty => Ok(0),
                portico_origin::Body::Bytes(mut b) => {
                    let n = b.len() as u64;
                    send_windowed(&mut send, &mut b, true, limit, Peer::Client).await?;
                    Ok(n)
                }
                portico_origin::Body::File {
                    mut file,
                    offset,
                    len,
                } => {
                    use std::io::{Read, Seek, SeekFrom};
                    file.seek(SeekFrom::Start(offset))
                        .map_err(ProxyError::ClientIo)?;
                    let mut left = len;
                    while left > 0 {
                        let want = left.min(MAX_CHUNK as u64) as usize;
                        let mut buf = vec![0u8; want];
                        let n = file.read(&mut buf).map_err(ProxyError::ClientIo)?;
                        if n == 0 {
                            return Err(ProxyError::ClientIo(io::Error::new(
                                io::ErrorKind::UnexpectedEof,
                                "file shrank while serving",
                            )));
                        }
                        buf.truncate(n);
                        left -= n as u64;
                        send_windowed(
                            &mut send,
                            &mut Bytes::from(buf),
                            left == 0,
                            limit,
                            Peer::Client,
                        )
                        .await?;
                    }
                    Ok(len)
                }
            }
        }
        .await;
        match r {
            Ok(n) => Outcome::ok(status, true, n),
            Err(e) => {
                send.send_reset(h2::Reason::INTERNAL_ERROR);
                Outcome {
                    termination: e.termination(Phase::ResponseBody),
                    status,
                    keep_alive: true,
                    bytes_sent: 0,
                    upstream: None,
                }
            }
        }
    }

    /// The proxy action over a pooled HTTP/1.1 upstream connection: the attempts of
    /// `forward::proxy` (shared in `attempt`), with the route's retry policy and budget.
    async fn proxy(
        &mut self,
        head: &RequestHead,
        route: &Route,
        p: &ProxyAction,
        idx: usize,
    ) -> Outcome {
        let cur = self.cur.clone();
        let ls = &*cur.ls;
        let default = RouteResilience::default();
        let res = ls.resilience.get(idx).unwrap_or(&default);
        let now = self.timings.head.unwrap_or_else(Instant::now);
        let budget = res.retry_budget.as_deref();
        let mut retry = Retry::new(p.retry.as_ref(), budget, head, now, &ls.route_stats[idx]);
        let mut ubuf = BytesMut::with_capacity(1024);
        loop {
            let work = self.attempt(&cur.shared, head, route, p, &mut retry, &mut ubuf);
            if let Some(outcome) = work.await {
                return outcome;
            }
        }
    }

    /// One attempt (see `forward::attempt`); None = it failed before anything reached the
    /// client and `retry` granted another one.
    async fn attempt(
        &mut self,
        shared: &Shared,
        head: &RequestHead,
        route: &Route,
        p: &ProxyAction,
        retry: &mut Retry<'_>,
        ubuf: &mut BytesMut,
    ) -> Option<Outcome> {
        let link = self.link;
        let mut asked = retry.started();
        // A client that resets the stream while it waits in the queue leaves at once.
        let picked = {
            let pick = attempt::pick(shared, p.upstream, &link.client_ip, head, retry, &mut asked);
            tokio::select! {
                r = pick => r,
                _ = poll_fn(|cx| self.respond.poll_reset(cx)) => Err(ProxyError::ClientClosed),
            }
        };
        let t = match picked {
            Ok(t) => t,
            Err(e) => return Some(self.fail(Some(head), e, Phase::Connect).await),
        };
        let group = t.group();
        let addr = t.addr();
        let client = attempt::Client {
            ip: &link.client_ip,
            tls: link.tls,
            cert_subject: link.client_cert_subject.as_deref(),
        };
        t.write_head(ubuf, head, route, p, &client);
        // HTTP/2 groups: the same forwarded head, over a multiplexed connection.
        if group.protocol == portico_config::UpstreamProtocol::H2 {
            let picked = crate::upstream_h2::Picked {
                upstream: t.upstream,
                guard: t.guard,
                gi: t.gi,
                tls: t.tls,
                asked,
            };
            let cur = self.cur.clone();
            let client = crate::upstream_h2::H2Client {
                worker: &link.worker,
                shared: &cur.shared,
                respond: &mut self.respond,
                body: &mut self.body,
                timings: &mut self.timings,
                min_rate: self.cur.ls.listener.limits.body_min_rate,
                send_timeout: self.cur.ls.listener.limits.send_timeout,
                peer: link.peer,
            };
            // Boxed: its state (3.3 KiB) would otherwise widen every stream's future, which is
            // copied into the heap once per stream.
            let work = crate::upstream_h2::proxy_h2(client, head, route, p, picked, ubuf, retry);
            return Box::pin(work).await;
        }
        let has_body = !matches!(head.framing, Framing::None | Framing::Length(0));
        let chunked = head.framing == Framing::Chunked;
        // Interim heads the server sent in this attempt (each went out as it came).
        let mut interim = 0;
        let mut fresh_only = false;
        let (mut up, reused, resp, body_done, got) = loop {
            let pool = &link.worker.pool;
            let (mut up, reused) = match t
                .connection(shared, pool, fresh_only, &mut self.timings.connect, retry)
                .await
            {
                Ok(u) => u,
                Err((_, Failed::Retry)) => return None,
                Err((e, _)) => {
                    // The access log names the server that refused or timed out.
                    let mut o = self.fail(Some(head), e, Phase::Connect).await;
                    o.upstream = Some(t.addr());
                    return Some(o);
                }
            };
            let body_limit = route.max_body_bytes;
            let r = {
                let Stream { respond, body, .. } = self;
                exchange(
                    &mut up,
                    ubuf,
                    head.method(),
                    has_body.then_some(body),
                    chunked,
                    body_limit,
                    self.cur.ls.listener.limits.body_min_rate,
                    group.response_header_timeout,
                    group.idle_timeout,
                    respond,
                    &mut interim,
                )
                .await
            };
            // The first interim response committed the attempt (see `forward::Interims`).
            if interim > 0 {
                retry.commit();
            }
            match r {
                Ok((resp, body_done)) => {
                    let got = t.responded(resp.status());
                    self.timings.response = Some(got);
                    break (up, reused, resp, body_done, got);
                }
                Err((e, phase)) => {
                    let untouched = up.rbuf.is_empty() && interim == 0;
                    match t.failed(shared, retry, head, &e, phase, reused, untouched) {
                        Failed::Stale => fresh_only = true,
                        Failed::Retry => return None,
                        Failed::Fail => {
                            let mut o = self.fail(Some(head), e, phase).await;
                            o.upstream = Some(addr);
                            return Some(o);
                        }
                    }
                }
            }
        };
        let status = resp.status();
        // A retried response is dropped unsent; its connection closes with it.
        if t.accepted(shared, retry, asked, got, reused, status) {
            return None;
        }
        if let Err(e) = super::tunnel::check_answer(head, &resp) {
            if head.upgrade {
                crate::log_limited!(info, peer = %link.peer, upstream = %addr, "HTTP/2 WebSocket refused: {e}");
            }
            let mut o = self.fail(Some(head), e, Phase::ResponseHead).await;
            o.upstream = Some(addr);
            return Some(o);
        }
        if status == 101 {
            let mut response = response_from(&resp, &route.response_headers, p.via);
            if let Some(cookie) = &t.set_cookie {
                append(response.headers_mut(), "set-cookie", cookie.as_bytes());
            }
            let limits = &self.cur.ls.listener.limits;
            let (idle, send_timeout) = (group.idle_timeout, limits.send_timeout);
            let Stream { respond, body, .. } = self;
            let tunnel = super::tunnel::run(
                respond,
                body,
                up,
                response,
                link.peer,
                addr,
                idle,
                send_timeout,
            );
            // Boxed: a rare, long-lived state that would otherwise widen every stream.
            return Some(Box::pin(tunnel).await);
        }
        let up_reusable = resp.keep_alive && body_done && resp.framing != Framing::Close;
        let mut response = response_from(&resp, &route.response_headers, p.via);
        if let Some(cookie) = &t.set_cookie {
            append(response.headers_mut(), "set-cookie", cookie.as_bytes());
        }
        let end = matches!(resp.framing, Framing::None | Framing::Length(0));
        let mut send = match self.respond.send_response(response, end) {
            Ok(s) => s,
            Err(e) => {
                let mut o = client_failed(e, status, Phase::ResponseHead);
                o.upstream = Some(addr);
                return Some(o);
            }
        };
        let relayed = if end {
            // Nothing to relay; a Length(0) body has nothing buffered either.
            Ok(0)
        } else {
            let limit = self.cur.ls.listener.limits.send_timeout;
            relay(&mut up, &mut send, resp.framing, group.idle_timeout, limit).await
        };
        Some(match relayed {
            Ok(sent) => {
                t.release(shared, &link.worker.pool, up, up_reusable);
                Outcome {
                    termination: Termination::OK,
                    status,
                    keep_alive: true,
                    bytes_sent: sent,
                    upstream: Some(addr),
                }
            }
            Err(e) => {
                if !e.client_gone() {
                    send.send_reset(h2::Reason::INTERNAL_ERROR);
                }
                Outcome {
                    termination: e.termination(Phase::ResponseBody),
                    status,
                    keep_alive: true,
                    bytes_sent: 0,
                    upstream: Some(addr),
                }
            }
        })
    }
}

/// Grace period before the listener's `body_min_rate` is enforced (as for HTTP/1.1 bodies).
const BODY_RATE_GRACE: Duration = Duration::from_secs(10);

/// The next DATA of a request body, under the listener's minimum body rate (or
/// [`STALL_TIMEOUT`] when no rate is set); `None` at the end of the body.
async fn next_data(
    body: &mut RecvStream,
    started: tokio::time::Instant,
    received: u64,
    min_rate: u64,
) -> Result<Option<Bytes>, ProxyError> {
    let due = crate::conn::body_byte_due(started, received, min_rate, BODY_RATE_GRACE);
    let r = match due {
        Some(due) => tokio::time::timeout_at(due, body.data()).await,
        None => timeout(STALL_TIMEOUT, body.data()).await,
    };
    match r {
        Err(_) => Err(ProxyError::BodyTooSlow),
        Ok(None) => Ok(None),
        Ok(Some(r)) => r.map(Some).map_err(client_err),
    }
}

fn client_failed(e: h2::Error, status: u16, phase: Phase) -> Outcome {
    Outcome {
        termination: client_err(e).termination(phase),
        status,
        keep_alive: true,
        bytes_sent: 0,
        upstream: None,
    }
}

/// A small complete response generated here; returns the body bytes sent.
async fn send_simple(
    respond: &mut SendResponse<Bytes>,
    status: u16,
    content_type: &str,
    body: &[u8],
    extra: &[(&str, &str)],
    head_only: bool,
    limit: Duration,
) -> Result<u64, ProxyError> {
    let mut b = http::Response::builder()
        .status(status)
        .header("server", "portico");
    for (n, v) in extra {
        b = b.header(*n, *v);
    }
    if status == 503 {
        b = b.header("retry-after", "1");
    }
    let bodyless = status == 204 || status == 304;
    if !bodyless {
        b = b
            .header("content-type", content_type)
            .header("content-length", body.len());
    }
    b = crate::date::with_date(|d| b.header("date", d));
    let response = b
        .body(())
        .map_err(|e| ProxyError::ClientIo(io::Error::other(e)))?;
    let end = head_only || bodyless || body.is_empty();
    let mut send = respond.send_response(response, end).map_err(client_err)?;
    if end {
        return Ok(0);
    }
    send_windowed(
        &mut send,
        &mut Bytes::copy_from_slice(body),
        true,
        limit,
        Peer::Client,
    )
    .await?;
    Ok(body.len() as u64)
}

fn listed(names: &[String], name: &str) -> bool {
    names.iter().any(|n| n.eq_ignore_ascii_case(name))
}

/// The HTTP/2 response for an HTTP/1 response head: hop-by-hop fields dropped (and
/// content-length unless the body is length-delimited), route rules and Via applied.
fn response_from(resp: &ResponseHead, rules: &HeaderRules, via: bool) -> http::Response<()> {
    let mut headers = HeaderMap::new();
    let mut prev_via: Option<&[u8]> = None;
    let set = |n: &str| rules.set.iter().any(|(s, _)| s.eq_ignore_ascii_case(n));
    for (name, value) in resp.fields() {
        if resp.is_hop_by_hop(name) || listed(&rules.remove, name) || set(name) {
            continue;
        }
        if name.eq_ignore_ascii_case("content-length")
            && !matches!(resp.framing, Framing::Length(_) | Framing::None)
        {
            continue;
        }
        if via && name.eq_ignore_ascii_case("via") {
            prev_via = Some(value);
            continue;
        }
        append(&mut headers, name, value);
    }
    if via {
        let mut v = Vec::with_capacity(32);
        if let Some(p) = prev_via.filter(|p| !p.is_empty()) {
            v.extend_from_slice(p);
            v.extend_from_slice(b", ");
        }
        v.extend_from_slice(b"1.1 portico");
        append(&mut headers, "via", &v);
    }
    for (n, v) in rules.set.iter().chain(rules.add.iter()) {
        append(&mut headers, n, v.as_bytes());
    }
    let mut r = http::Response::new(());
    *r.status_mut() =
        http::StatusCode::from_u16(resp.status()).unwrap_or(http::StatusCode::BAD_GATEWAY);
    *r.headers_mut() = headers;
    r
}

/// Write the head, stream the request body while waiting for the response head; return the
/// final head and whether the request body was completely sent. Interim heads go to the client
/// as informational HEADERS as they arrive (`interim` counts them, at most `MAX_INTERIM`); a
/// client reset of the stream ends it.
#[allow(clippy::too_many_arguments)]
async fn exchange(
    up: &mut UpConn,
    ubuf: &[u8],
    method: &Method,
    body: Option<&mut RecvStream>,
    chunked: bool,
    max_body: u64,
    min_rate: u64,
    header_timeout: Duration,
    idle: Duration,
    respond: &mut SendResponse<Bytes>,
    interim: &mut usize,
) -> Result<(ResponseHead, bool), (ProxyError, Phase)> {
    let reset = (ProxyError::ClientClosed, Phase::ResponseHead);
    // TLS: the records must leave rustls's buffer too (a no-op for plain sockets).
    let write = async {
        up.stream.write_all(ubuf).await?;
        up.stream.flush().await
    };
    tokio::select! {
        r = crate::fast_timeout::timeout(idle, write) => match r {
            Err(_) => return Err((ProxyError::UpstreamIdle, Phase::ResponseHead)),
            Ok(Err(e)) => return Err((ProxyError::UpstreamIo(e), Phase::ResponseHead)),
            Ok(Ok(())) => {}
        },
        _ = poll_fn(|cx| respond.poll_reset(cx)) => return Err(reset),
    }
    let (mut ur, mut uw) = up.stream.split();
    let mut body_done = body.is_none();
    let upload = async {
        match body {
            Some(body) => upload(body, &mut uw, chunked, max_body, min_rate, idle).await,
            None => Ok(()),
        }
    };
    tokio::pin!(upload);
    // The head timeout runs once the upload is over (the body has its own timeouts).
    let mut deadline = tokio::time::Instant::now() + if body_done { header_timeout } else { FAR };
    loop {
        // A new read per head: it is cancel-safe (what was read stays in `up.rbuf`).
        let head_fut = read_response_head(&mut ur, &mut up.rbuf, method);
        let head = tokio::select! {
            biased;
            r = head_fut => r.map_err(|e| (e, Phase::ResponseHead))?,
            r = &mut upload, if !body_done => {
                r.map_err(|e| (e, Phase::RequestBody))?;
                body_done = true;
                deadline = tokio::time::Instant::now() + header_timeout;
                continue;
            }
            _ = tokio::time::sleep_until(deadline) => {
                return Err((ProxyError::ResponseTimeout, Phase::ResponseHead));
            }
            _ = poll_fn(|cx| respond.poll_reset(cx)) => return Err(reset),
        };
        match head {
            Head::Interim(raw) => {
                if *interim >= MAX_INTERIM {
                    return Err((ProxyError::TooManyInterim, Phase::ResponseHead));
                }
                *interim += 1;
                crate::h2_interim::forward(respond, std::slice::from_ref(&raw), method);
            }
            Head::Final(h) => {
                // A success before the upload ended: finish it first; an early error ends it.
                if !body_done && h.status() < 300 {
                    tokio::select! {
                        r = &mut upload => r.map_err(|e| (e, Phase::RequestBody))?,
                        _ = poll_fn(|cx| respond.poll_reset(cx)) => return Err(reset),
                    }
                    body_done = true;
                }
                return Ok((h, body_done));
            }
        }
    }
}

/// Stream the request body upstream (chunked when the client sent no content-length, with its
/// trailers), releasing flow-control capacity as it is written.
async fn upload<W: AsyncWrite + Unpin>(
    body: &mut RecvStream,
    w: &mut W,
    chunked: bool,
    max: u64,
    min_rate: u64,
    idle: Duration,
) -> Result<(), ProxyError> {
    let mut scratch = BytesMut::new();
    let started = tokio::time::Instant::now();
    let mut received = 0u64;
    loop {
        let Some(next) = next_data(body, started, received, min_rate).await? else {
            break;
        };
        let n = next.len();
        received += n as u64;
        if max > 0 && received > max {
            return Err(ProxyError::BodyTooLarge);
        }
        if n > 0 {
            // Flushed like the HTTP/1.1 path: a TLS upstream's last records must not stay
            // buffered in rustls when the socket was full.
            let write = async {
                crate::conn::write_framed(w, &mut scratch, &next, chunked).await?;
                w.flush().await
            };
            match timeout(idle, write).await {
                Err(_) => return Err(ProxyError::UpstreamIdle),
                Ok(Err(e)) => return Err(ProxyError::UpstreamIo(e)),
                Ok(Ok(())) => {}
            }
        }
        let _ = body.flow_control().release_capacity(n);
    }
    if chunked {
        let trailers = match timeout(STALL_TIMEOUT, body.trailers()).await {
            Err(_) => return Err(ProxyError::BodyTooSlow),
            Ok(r) => r.map_err(client_err)?,
        };
        let mut lines = BytesMut::new();
        if let Some(t) = &trailers {
            crate::headers::encode_trailers(&mut lines, t);
        }
        scratch.clear();
        encode::last_chunk(&mut scratch, &lines);
        let write = async {
            w.write_all(&scratch).await?;
            w.flush().await
        };
        match timeout(idle, write).await {
            Err(_) => return Err(ProxyError::UpstreamIdle),
            Ok(r) => r.map_err(ProxyError::UpstreamIo)?,
        }
    }
    Ok(())
}

/// Relay the response body as DATA frames, its chunked trailers as HTTP/2 trailers (gRPC's
/// `grpc-status`). Returns the body bytes sent once the upstream side is complete.
async fn relay(
    up: &mut UpConn,
    send: &mut SendStream<Bytes>,
    framing: Framing,
    idle: Duration,
    limit: Duration,
) -> Result<u64, ProxyError> {
    let mut dec = BodyDecoder::new(framing);
    let mut sent = 0u64;
    loop {
        let step = dec
            .decode(&mut up.rbuf, MAX_CHUNK)
            .map_err(ProxyError::BadResponseBody)?;
        match step {
            Decoded::Data(mut d) => {
                sent += d.len() as u64;
                // The last bytes of a sized body carry END_STREAM: no empty DATA frame after.
                let last = dec.remaining() == Some(0);
                send_windowed(send, &mut d, last, limit, Peer::Client).await?;
                if last {
                    return Ok(sent);
                }
            }
            Decoded::Done { trailers } => {
                let map = trailer_map(&trailers);
                if map.is_empty() {
                    finish(send)?;
                } else {
                    send.send_trailers(map).map_err(client_err)?;
                }
                return Ok(sent);
            }
            Decoded::NeedMore => {
                if up.rbuf.capacity() - up.rbuf.len() < 4096 {
                    up.rbuf.reserve(MAX_CHUNK);
                }
                let read = tokio::select! {
                    r = timeout(idle, up.stream.read_buf(&mut up.rbuf)) => r,
                    r = poll_fn(|cx| send.poll_reset(cx)) => {
                        return Err(match r {
                            Ok(_) => ProxyError::ClientClosed,
                            Err(e) => client_err(e),
                        });
                    }
                };
                let read = match read {
                    // A TLS server closing without close_notify (common) ends a close-delimited
                    // body as a plain close would; framed bodies still fail the decoder below.
                    Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(Ok(0)),
                    r => r,
                };
                match read {
                    Err(_) => return Err(ProxyError::UpstreamIdle),
                    Ok(Err(e)) => return Err(ProxyError::UpstreamIo(e)),
                    Ok(Ok(0)) => {
                        if let Decoded::Done { .. } =
                            dec.on_eof().map_err(ProxyError::BadResponseBody)?
                        {
                            finish(send)?;
                            return Ok(sent);
                        }
                        return Err(ProxyError::UpstreamClosed);
                    }
                    Ok(Ok(_)) => {}
                }
            }
        }
    }
}
