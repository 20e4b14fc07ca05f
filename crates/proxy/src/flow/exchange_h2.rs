//! The exchange of one attempt with an HTTP/2 server (`protocol = "h2"` groups), for either client kind: the forwarded head written as an HTTP/2 request, a stream leased from `upstream::h2_pool`, the upload while the response head is awaited, interim responses, resends on another connection after a refusal, retry decisions.

use crate::downstream::{Client, Env, Interim, Interims, Upload};
use crate::error::ProxyError;
use crate::flow::attempt::{failure_report, Exchanged, Picked, Proxied, UpResponse};
use crate::h2_fields::{append, DROPPED};
use crate::h2_io::{send_windowed, up_err, Peer};
use crate::headers::HeadOut;
use crate::resilience::retry::{Retry, RetryCause};
use crate::state::{Shared, Worker};
use crate::telemetry::stats::{Phase, Stats};
use crate::upstream::h2_pool::{open, H2Conn, Lease, Slot};
use crate::upstream::pool::PoolKey;
use bytes::Bytes;
use h2::client::ResponseFuture;
use h2::{RecvStream, SendStream};
use http::header::HeaderValue;
use portico_config::UpstreamGroup;
use portico_http1::RequestHead;
use portico_upstream::Report;
use std::borrow::Cow;
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::time::timeout;

/// Far-away deadline while a request body is still streaming.
const FAR: Duration = Duration::from_secs(365 * 24 * 3600);

/// How an exchange failed, and whether the server surely did not process it.
struct Failure {
    e: ProxyError,
    phase: Phase,
    /// Refused before processing (GOAWAY below its id, REFUSED_STREAM, a dead connection
    /// before the request left): safe to send again on another connection.
    refused: bool,
    /// Only this stream was reset (RST_STREAM): the connection stays usable.
    stream_only: bool,
}

impl Failure {
    /// A failure that says nothing about the connection.
    fn plain(e: ProxyError, phase: Phase) -> Self {
        Failure {
            e,
            phase,
            refused: false,
            stream_only: false,
        }
    }
}

fn is_refusal(e: &h2::Error) -> bool {
    e.is_go_away() || e.reason() == Some(h2::Reason::REFUSED_STREAM)
}

/// The forwarded head as an HTTP/2 request, written by `headers::upstream_request` (the same
/// forwarding rules as for HTTP/1.1 servers): the Host field becomes `:authority`, the fields
/// HTTP/2 does not carry (`h2_fields::DROPPED`) are left out.
pub(super) struct H2Head {
    method: Option<http::Method>,
    target: String,
    authority: Option<String>,
    headers: http::HeaderMap,
}

impl H2Head {
    pub(super) fn new() -> Self {
        H2Head {
            method: None,
            target: String::new(),
            authority: None,
            headers: http::HeaderMap::new(),
        }
    }

    /// The request, to a server at `addr` (its `:authority` when the head has no Host); `te:
    /// trailers` when the client asked for trailers.
    fn request(
        self,
        client: &RequestHead,
        https: bool,
        addr: SocketAddr,
    ) -> Result<http::Request<()>, ProxyError> {
        let authority = match self.authority {
            Some(a) if !a.is_empty() => a,
            _ => addr.to_string(),
        };
        let uri = http::Uri::builder()
            .scheme(if https { "https" } else { "http" })
            .authority(authority)
            .path_and_query(self.target)
            .build()
            .map_err(|_| ProxyError::Internal("forwarded target is not a valid URI"))?;
        let method = self
            .method
            .ok_or(ProxyError::Internal("forwarded method is not valid"))?;
        let mut req = http::Request::new(());
        *req.method_mut() = method;
        *req.uri_mut() = uri;
        *req.version_mut() = http::Version::HTTP_2;
        *req.headers_mut() = self.headers;
        if crate::headers::wants_trailers(client) {
            let map = req.headers_mut();
            map.insert(http::header::TE, HeaderValue::from_static("trailers"));
        }
        Ok(req)
    }
}

impl HeadOut for H2Head {
    fn request_line(&mut self, method: &str, target: &str) {
        self.method = http::Method::from_bytes(method.as_bytes()).ok();
        self.target = target.to_owned();
    }

    fn field(&mut self, name: &str, parts: &[&[u8]]) {
        let value: Cow<'_, [u8]> = match parts {
            [one] => Cow::Borrowed(one),
            _ => Cow::Owned(parts.concat()),
        };
        if name.eq_ignore_ascii_case("host") {
            self.authority = Some(String::from_utf8_lossy(&value).into_owned());
        } else if !DROPPED.iter().any(|d| d.eq_ignore_ascii_case(name)) {
            append(&mut self.headers, name, &value);
        }
    }

    fn content_length(&mut self, n: u64) {
        let v = HeaderValue::from(n);
        self.headers.append(http::header::CONTENT_LENGTH, v);
    }

    fn end(&mut self) {}
}

/// The HTTP/2 request of a WebSocket opening handshake as an extended CONNECT (RFC 8441 4):
/// `:method CONNECT`, `:protocol websocket`, `:scheme`, `:path` and `:authority` as for any
/// request; the proxy's `sec-websocket-key` dropped (HTTP/2 has none), the client's other
/// `sec-websocket-*` fields kept.
fn extended_connect(mut req: http::Request<()>) -> http::Request<()> {
    *req.method_mut() = http::Method::CONNECT;
    req.headers_mut().remove("sec-websocket-key");
    req.extensions_mut()
        .insert(h2::ext::Protocol::from_static("websocket"));
    req
}

/// How a failure of the response head (or of the stream before it) is classified.
fn head_failure(e: h2::Error) -> Failure {
    Failure {
        refused: is_refusal(&e),
        stream_only: e.is_reset() && !e.is_go_away(),
        e: up_err(e),
        phase: Phase::ResponseHead,
    }
}

/// One response head of an HTTP/2 upstream.
enum Head {
    /// An informational (1xx) response.
    Interim(http::Response<()>),
    /// The final response.
    Final(http::Response<RecvStream>),
}

/// The next response head of `resp`: an interim (1xx) response, taken before the final head
/// each time the stream is polled (`h2` would otherwise skip them), or the final one.
/// Cancel-safe: a new one is made for each head.
async fn response_head(resp: &mut ResponseFuture) -> Result<Head, Failure> {
    poll_fn(|cx| {
        match resp.poll_informational(cx) {
            Poll::Ready(Some(Ok(r))) => return Poll::Ready(Ok(Head::Interim(r))),
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(head_failure(e))),
            Poll::Ready(None) | Poll::Pending => {}
        }
        Pin::new(&mut *resp)
            .poll(cx)
            .map(|r| r.map(Head::Final).map_err(head_failure))
    })
    .await
}

/// Count one interim response of the exchange and pass it on (see `Interims`); more than
/// `MAX_INTERIM` fails the stream, a failed client write fails the request. With `down` (no
/// upload reads the client), an HTTP/1.1 client's head is written at once. Callers box it:
/// interim responses are rare, and its state (a client write) would otherwise widen every
/// exchange's future.
async fn pass_interim<'a, D: Client<'a>>(
    interims: &mut Interims<'a>,
    r: http::Response<()>,
    down: Option<&mut D>,
) -> Result<(), Failure> {
    // Either failure is this stream's only: the connection stays usable.
    let stream_only = |e| Failure {
        stream_only: true,
        ..Failure::plain(e, Phase::ResponseHead)
    };
    interims.hold(Interim::H2(r)).map_err(stream_only)?;
    if let Some(down) = down {
        let flushed = down.flush_interims(interims).await;
        flushed.map_err(|e| stream_only(ProxyError::ClientIo(e)))?;
    }
    Ok(())
}

/// Send the request on `conn`, stream its body while waiting for the response head; return
/// the head and whether the body was completely sent. Interim responses go to `interim` as
/// they arrive.
#[allow(clippy::too_many_arguments)]
async fn exchange<'a, D: Client<'a>>(
    conn: &H2Conn,
    req: http::Request<()>,
    src: &mut Upload,
    down: &mut D,
    header_timeout: Duration,
    idle: Duration,
    finish: bool,
    interim: &mut Interims<'a>,
) -> Result<(http::Response<RecvStream>, SendStream<Bytes>, bool), Failure> {
    let refused = |e: ProxyError| Failure {
        refused: true,
        ..Failure::plain(e, Phase::ResponseHead)
    };
    let ready = match timeout(header_timeout, conn.send.clone().ready()).await {
        Err(_) => return Err(refused(ProxyError::ResponseTimeout)),
        Ok(Err(e)) => return Err(refused(up_err(e))),
        Ok(Ok(r)) => r,
    };
    // The response head is due `header_timeout` after this, a wait for SETTINGS included.
    let asked = tokio::time::Instant::now();
    // RFC 8441 3: `:protocol` only to a server that allows it. A connection that closed or
    // stayed silent before its SETTINGS refused nothing yet: the request may go elsewhere.
    if src.is_tunnel() {
        match conn.extended_connect(header_timeout).await {
            Ok(true) => {}
            Ok(false) => {
                let e = ProxyError::ExtendedConnect("the server does not allow extended CONNECT");
                return Err(Failure::plain(e, Phase::RequestHead));
            }
            Err(e) => return Err(refused(e)),
        }
    }
    let mut ready = ready;
    let (mut resp, mut send) = ready
        .send_request(req, src.is_none())
        .map_err(|e| refused(up_err(e)))?;
    if src.headless() {
        let mut deadline = asked + header_timeout;
        loop {
            match tokio::time::timeout_at(deadline, response_head(&mut resp)).await {
                Err(_) => {
                    let e = ProxyError::ResponseTimeout;
                    return Err(Failure::plain(e, Phase::ResponseHead));
                }
                Ok(r) => match r? {
                    Head::Final(h) => return Ok((h, send, true)),
                    Head::Interim(r) => {
                        // A slow client's write of it does not count against the server.
                        let began = tokio::time::Instant::now();
                        Box::pin(pass_interim(interim, r, Some(&mut *down))).await?;
                        deadline += began.elapsed();
                    }
                },
            }
        }
    }
    let r = {
        let body_fut = upload(&mut send, src, down, idle);
        tokio::pin!(body_fut);
        let sleep = tokio::time::sleep(FAR);
        tokio::pin!(sleep);
        let mut body_done = false;
        loop {
            tokio::select! {
                biased;
                r = response_head(&mut resp) => {
                    let h = match r {
                        Ok(Head::Final(h)) => h,
                        Ok(Head::Interim(r)) => match Box::pin(pass_interim::<D>(interim, r, None)).await {
                            Ok(()) => continue,
                            Err(f) => break Err(f),
                        },
                        Err(f) => break Err(f),
                    };
                    // As for HTTP/1.1: a success finishes the upload first (unless the caller
                    // streams both ways at once), an early error ends it.
                    if finish && !body_done && h.status().as_u16() < 300 {
                        if let Err((e, phase)) = body_fut.await {
                            break Err(Failure::plain(e, phase));
                        }
                        body_done = true;
                    }
                    break Ok((h, body_done));
                }
                r = &mut body_fut, if !body_done => {
                    if let Err((e, phase)) = r {
                        break Err(Failure::plain(e, phase));
                    }
                    body_done = true;
                    sleep.as_mut().reset(tokio::time::Instant::now() + header_timeout);
                }
                _ = &mut sleep => {
                    break Err(Failure::plain(ProxyError::ResponseTimeout, Phase::ResponseHead));
                }
            }
        }
    };
    match r {
        Ok((h, body_done)) => {
            if !body_done && (finish || h.status().as_u16() >= 300) {
                send.send_reset(h2::Reason::CANCEL);
            }
            Ok((h, send, body_done))
        }
        Err(f) => {
            send.send_reset(h2::Reason::CANCEL);
            Err(f)
        }
    }
}

/// Stream the request body and its trailers to the server under its flow control.
pub(crate) async fn upload<'a, D: Client<'a>>(
    send: &mut SendStream<Bytes>,
    up: &mut Upload,
    down: &mut D,
    idle: Duration,
) -> Result<(), (ProxyError, Phase)> {
    let body = Phase::RequestBody;
    loop {
        if up.pending.is_none() {
            match up.next(down).await.map_err(|e| (e, body))? {
                Some(d) => {
                    let n = d.len();
                    up.pending = Some((d, n));
                }
                None => break,
            }
        }
        let Some((d, n)) = up.pending.as_mut() else {
            break;
        };
        let n = *n;
        send_windowed(send, d, false, idle, Peer::Server)
            .await
            .map_err(|e| (e, body))?;
        up.pending = None;
        up.release(down, n);
    }
    match up.trailers(down).await.map_err(|e| (e, body))? {
        Some(t) if !t.is_empty() => send.send_trailers(t),
        _ => send.send_data(Bytes::new(), true),
    }
    .map_err(|e| (up_err(e), body))
}

/// The per-request state shared by both client kinds.
struct Run<'a> {
    shared: &'a Shared,
    worker: &'a Worker,
    group: &'a UpstreamGroup,
    picked: &'a Picked<'a>,
    key: PoolKey,
    addr: SocketAddr,
    retryable: bool,
}

impl Run<'_> {
    /// Get a slot (reused or on a new connection) and exchange; a reused connection that failed
    /// before the response head, or any refusal, is retried once on another connection (a new
    /// one unless another has room) for requests that can be sent again.
    async fn go<'a, D: Client<'a>>(
        &self,
        req: http::Request<()>,
        src: &mut Upload,
        down: &mut D,
        finish: bool,
        interim: &mut Interims<'a>,
    ) -> Result<
        (
            Lease,
            http::Response<RecvStream>,
            SendStream<Bytes>,
            bool,
            bool,
        ),
        Failure,
    > {
        // The connection the first exchange failed on, once it did.
        let mut failed_on: Option<Rc<H2Conn>> = None;
        loop {
            let pool = &self.worker.h2pool;
            let g = self.group;
            let slot = pool
                .slot(
                    self.key,
                    g.idle_timeout,
                    g.connect_timeout,
                    failed_on.as_ref(),
                )
                .await;
            let (lease, reused) = match slot {
                Slot::Leased(l) => (l, true),
                Slot::Failed(e) => return Err(Failure::plain(e, Phase::Connect)),
                Slot::Open(opening) => {
                    match open(
                        self.addr,
                        g.connect_timeout,
                        g.idle_timeout,
                        self.picked.tls,
                    )
                    .await
                    {
                        Ok((c, took)) => {
                            down.timings().connect = Some(took);
                            let stats = &self.shared.stats;
                            stats.upstream_connects.fetch_add(1, Ordering::Relaxed);
                            // In the pool before the waiters are woken (no await in between).
                            let lease = pool.add(self.key, c);
                            drop(opening);
                            (lease, false)
                        }
                        Err(e) => {
                            opening.failed(&e);
                            let report = match e {
                                ProxyError::ConnectTimeout => Report::Timeout,
                                _ => Report::ConnectError,
                            };
                            let server = self.picked.server();
                            self.picked.upstream.report(server, report, Instant::now());
                            return Err(Failure::plain(e, Phase::Connect));
                        }
                    }
                }
            };
            let group = self.group;
            let r = exchange(
                &lease.0,
                req.clone(),
                src,
                down,
                group.response_header_timeout,
                group.idle_timeout,
                finish,
                interim,
            )
            .await;
            match r {
                Ok((resp, up_send, body_done)) => {
                    return Ok((lease, resp, up_send, body_done, reused));
                }
                Err(f) => {
                    if f.phase == Phase::ResponseHead && !f.stream_only {
                        // This connection is not to be given new streams (its streams in flight
                        // finish). A head timeout counts too: a connection that stopped answering
                        // would otherwise take up to 100 more requests, each waiting for its 504.
                        lease.0.closed.set(true);
                    }
                    // Not after an interim response: it went to the client (see `Interims`).
                    if failed_on.is_none()
                        && f.phase == Phase::ResponseHead
                        && src.headless()
                        && interim.seen == 0
                        && (f.refused || (reused && self.retryable && !f.stream_only))
                    {
                        let stats = &self.shared.stats;
                        stats.upstream_retries.fetch_add(1, Ordering::Relaxed);
                        failed_on = Some(lease.0.clone());
                        continue;
                    }
                    if let Some(report) = failure_report(&f.e, reused) {
                        let server = self.picked.server();
                        self.picked.upstream.report(server, report, Instant::now());
                    }
                    return Err(f);
                }
            }
        }
    }
}

/// Whether the route's `retry` policy sends the request again, to another server, after an
/// exchange that failed with `f` before any response byte arrived (so nothing reached the
/// client). A refusal (`REFUSED_STREAM`, GOAWAY below the stream) counts as `reset`; it was
/// already sent once more on another connection to the same server for any body-less request
/// (RFC 9113 8.7), and going to another server follows the route's rules (idempotent methods
/// unless `non_idempotent`), as every retry does for HTTP/1.1 groups.
fn retry_after(f: &Failure, picked: &Picked<'_>, retry: &mut Retry<'_>, stats: &Stats) -> bool {
    let cause = match (f.phase, &f.e) {
        (Phase::Connect, _) => RetryCause::Connect,
        (Phase::ResponseHead, ProxyError::ResponseTimeout) => RetryCause::Timeout,
        (Phase::ResponseHead, ProxyError::UpstreamClosed | ProxyError::UpstreamIo(_)) => {
            RetryCause::Reset
        }
        _ => return false,
    };
    retry.allows(cause, picked.gi, picked.server(), stats)
}

/// The exchange of one attempt with the HTTP/2 server `t`: the forwarded head written as an
/// HTTP/2 request (an extended CONNECT for a WebSocket), a stream on a multiplexed connection
/// (`Run::go`), failures reported and offered to `retry`. An HTTP/1.1 client's upload ends
/// before the response (`finish`); an HTTP/2 client's may go on while the response streams.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn exchange_attempt<'a, D: Client<'a>>(
    down: &mut D,
    env: Env<'_>,
    t: &Picked<'_>,
    px: &Proxied<'_>,
    head: &RequestHead,
    upload: &mut Upload,
    interims: &mut Interims<'a>,
    retry: &mut Retry<'_>,
) -> Exchanged {
    let addr = t.addr();
    let mut out = H2Head::new();
    t.write_head(&mut out, head, px.route, px.p, &px.forward, &down.who());
    let req = out.request(head, t.tls.is_some(), addr);
    let tunnel = upload.is_tunnel();
    let req = match req.map(|r| if tunnel { extended_connect(r) } else { r }) {
        Ok(r) => r,
        Err(e) => {
            return Exchanged::Failed {
                e,
                phase: Phase::RequestHead,
                body_done: false,
            }
        }
    };
    let run = Run {
        shared: env.shared,
        worker: env.worker,
        group: t.group(),
        picked: t,
        key: t.pool_key,
        addr,
        retryable: head.method().is_idempotent() && upload.headless(),
    };
    let finish = !D::H2;
    let r = run.go(req, upload, down, finish, interims).await;
    // The first interim response committed the attempt (see `downstream::Interims`).
    if interims.seen > 0 {
        retry.commit();
    }
    match r {
        Ok((lease, resp, send, body_done, reused)) => {
            let got = t.responded(resp.status().as_u16());
            let (parts, body) = resp.into_parts();
            Exchanged::Response {
                resp: UpResponse::H2 {
                    lease,
                    parts,
                    body,
                    send,
                },
                body_done,
                reused,
                got,
            }
        }
        Err(f) if retry_after(&f, t, retry, &env.shared.stats) => Exchanged::Retry,
        Err(f) => Exchanged::Failed {
            e: f.e,
            phase: f.phase,
            body_done: upload.headless(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::H2Head;
    use crate::headers::HeadOut;
    use bytes::BytesMut;
    use portico_http1::{parse_request, Limits};

    #[test]
    fn forwarded_head_becomes_an_http2_request() {
        let mut client = BytesMut::from(
            &b"POST /svc/M HTTP/1.1\r\nHost: a.test\r\nTE: trailers\r\ncontent-type: application/grpc\r\n\r\n"[..],
        );
        let client = parse_request(&mut client, &Limits::default())
            .unwrap()
            .unwrap();
        let mut up = H2Head::new();
        up.request_line("POST", "/svc/M");
        up.field("Content-Type", &[b"application/grpc"]);
        up.field("Host", &[b"a.test"]);
        up.field("X-Forwarded-For", &[b"1.2.3.4", b", ", b"5.6.7.8"]);
        up.field("Connection", &[b"keep-alive"]);
        up.field("Transfer-Encoding", &[b"chunked"]);
        up.content_length(7);
        up.end();
        let addr = "127.0.0.1:9".parse().unwrap();
        let r = up.request(&client, false, addr).unwrap();
        assert_eq!(r.method(), http::Method::POST);
        assert_eq!(r.uri().to_string(), "http://a.test/svc/M");
        assert_eq!(r.headers()["te"], "trailers");
        assert_eq!(r.headers()["x-forwarded-for"], "1.2.3.4, 5.6.7.8");
        assert_eq!(r.headers()["content-length"], "7");
        assert_eq!(r.headers()["content-type"], "application/grpc");
        for gone in ["connection", "transfer-encoding", "host"] {
            assert!(!r.headers().contains_key(gone), "{gone}");
        }
    }
}
