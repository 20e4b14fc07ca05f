//! One HTTP/2 stream: translate, route, admit, run the action (the proxy flow, origin, redirect, respond), record once.

use super::request::{to_http1, Reject};
use super::{Current, Link};
use crate::admit::{self, Refused};
use crate::conn::{Outcome, MAX_CHUNK, STALL_TIMEOUT};
use crate::downstream::{answer_h2, send_simple, Down, H2Down};
use crate::error::ProxyError;
use crate::fast_timeout::LazyTimer;
use crate::h2_io::{client_err, send_windowed, Peer};
use crate::resilience::RouteResilience;
use crate::stats::Phase;
use crate::timing::Timings;
use bytes::{Bytes, BytesMut};
use h2::server::SendResponse;
use h2::RecvStream;
use portico_config::{Action, HeaderRules, ProxyAction, Route};
use portico_http1::{encode, parse_response, Framing, Limits, Method, RequestHead};
use std::cell::RefCell;
use std::io;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::time::timeout;

/// A stream being served.
struct Stream<'a> {
    link: &'a Link,
    cur: Rc<Current>,
    respond: RefCell<SendResponse<Bytes>>,
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
        respond: RefCell::new(respond),
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
        let limit = self.cur.ls.listener.limits.send_timeout;
        answer_h2(self.respond.get_mut(), head, e, phase, body, extra, limit).await
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
            self.respond.get_mut(),
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
        let response = crate::h2_fields::response_from(&resp, &HeaderRules::default(), false);
        let end = matches!(reply.body, portico_origin::Body::Empty);
        let mut send = match self.respond.get_mut().send_response(response, end) {
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

    /// The proxy action: the one flow, with this stream as its client.
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
        let mut ubuf = BytesMut::with_capacity(1024);
        let mut down = Down::H2(H2Down {
            link: self.link,
            ls,
            shared: &cur.shared,
            respond: &self.respond,
            body: &mut self.body,
            timings: &mut self.timings,
            timer: LazyTimer::default(),
        });
        let counters = &ls.route_stats[idx];
        crate::flow::proxy(&mut down, head, route, p, res, counters, &mut ubuf).await
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
