//! An HTTP/2 stream as the client of one request: its DATA read under flow control, interim heads sent at once, the response as HEADERS and DATA under the client's window, a reset watched throughout.

use super::answer;
use super::link::Link;
use super::Who;
use super::{Client, Env, H2Out, HeadFailed, Interims, Kind, RespHead, Sent, To, Upload, Watch};
use crate::conn::{self, STALL_TIMEOUT};
use crate::error::ProxyError;
use crate::filter::Edits;
use crate::h2_io::{client_err, send_windowed, Peer};
use crate::state::{ListenerState, Shared};
use crate::telemetry::stats::Outcome;
use crate::telemetry::stats::Phase;
use crate::telemetry::timing::Timings;
use crate::upstream::pool::UpConn;
use bytes::{Bytes, BytesMut};
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use http::header::HeaderMap;
use portico_config::Route;
use portico_http1::{Framing, RequestHead, ResponseHead};
use std::cell::RefCell;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::time::timeout;

/// What an HTTP/2 stream lends to the flow.
pub(crate) struct H2Down<'a> {
    pub link: &'a Link,
    pub ls: &'a ListenerState,
    pub shared: &'a Shared,
    /// Shared with the reset watch and the interim sender; each borrows it for one synchronous
    /// call only.
    pub respond: &'a RefCell<SendResponse<Bytes>>,
    pub body: &'a mut RecvStream,
    pub timings: &'a mut Timings,
    /// The request's client behind a trusted proxy (None: the socket's peer).
    pub client: Option<(std::net::IpAddr, Box<str>)>,
}

impl<'a> H2Down<'a> {
    fn send_timeout(&self) -> Duration {
        self.ls.listener.limits.send_timeout
    }

    /// The request id field a local answer to `head` carries, if any.
    fn answer_id<'h>(&self, head: &'h RequestHead) -> Option<(&'a str, std::borrow::Cow<'h, str>)> {
        answer::id_field(self.shared, self.timings, head)
    }
}

// The `respond` cell is borrowed across the awaits of answers and tunnels: exclusive there, as
// the reset watch and the interim sender that share it are not polled meanwhile.
#[allow(clippy::await_holding_refcell_ref)]
impl<'a> Client<'a> for H2Down<'a> {
    const H2: bool = true;
    type Out<'o>
        = H2Out
    where
        Self: 'o;

    fn env(&self) -> Env<'a> {
        self.link.env(self.shared, self.ls)
    }

    fn watch(&self) -> Watch<'a> {
        Watch(Some(self.respond))
    }

    fn timings(&mut self) -> &mut Timings {
        self.timings
    }

    async fn head_wait<F: std::future::Future>(
        &mut self,
        due: tokio::time::Instant,
        wait: F,
    ) -> Option<F::Output> {
        tokio::time::timeout_at(due, wait).await.ok()
    }

    fn who(&self) -> Who<'_> {
        self.link.who(&self.client)
    }

    fn addresses(&self) -> Option<(std::net::SocketAddr, std::net::SocketAddr)> {
        self.link.addresses()
    }

    fn set_client(&mut self, ip: std::net::IpAddr) {
        self.client = Some((ip, ip.to_string().into_boxed_str()));
    }

    fn take_ubuf(&mut self) -> BytesMut {
        // Grown by the first write: an HTTP/2 group's head is no bytes.
        BytesMut::new()
    }

    fn put_ubuf(&mut self, _: BytesMut) {}

    async fn fail(&mut self, head: &RequestHead, e: ProxyError, phase: Phase, _: bool) -> Outcome {
        let limit = self.send_timeout();
        let id = self.answer_id(head);
        let id = id.as_ref().map(|(n, v)| (*n, &**v));
        let mut respond = self.respond.borrow_mut();
        let peer = self.link.peer;
        let r = &mut *respond;
        answer::fail(r, peer, Some(head), e, phase, id.as_slice(), limit).await
    }

    async fn refuse(
        &mut self,
        head: &RequestHead,
        e: ProxyError,
        body: &[u8],
        extra: &[(&str, &str)],
    ) -> Outcome {
        let limit = self.send_timeout();
        let id = self.answer_id(head);
        let extra = super::with_id(extra, &id);
        let mut respond = self.respond.borrow_mut();
        let r = &mut *respond;
        answer::refusal(r, Some(head), e, Phase::Route, body, &extra, limit).await
    }

    async fn local(
        &mut self,
        head: &RequestHead,
        status: u16,
        content_type: &str,
        body: &[u8],
        extra: &[(&str, &str)],
    ) -> Outcome {
        let limit = self.send_timeout();
        let id = self.answer_id(head);
        let extra = super::with_id(extra, &id);
        let mut respond = self.respond.borrow_mut();
        let r = &mut *respond;
        answer::local(r, head, status, content_type, body, &extra, limit).await
    }

    async fn origin(&mut self, head: &RequestHead, origin: &portico_origin::Origin) -> Outcome {
        let limit = self.send_timeout();
        let id = self.answer_id(head);
        let id = id.as_ref().map(|(n, v)| (*n, &**v));
        let mut respond = self.respond.borrow_mut();
        origin_answer(&mut respond, head, origin, id, limit).await
    }

    fn has_body(&self, _: &RequestHead) -> bool {
        !self.body.is_end_stream()
    }

    async fn before_upload(&mut self, _: &RequestHead) -> Result<(), ProxyError> {
        Ok(())
    }

    fn upload(&self, _: &RequestHead, route: &Route, body: bool, tunnel: bool) -> Upload {
        Upload::new(match (body, tunnel) {
            (false, false) => Kind::None,
            (false, true) => Kind::Tunnel,
            (true, _) => Kind::Stream {
                started: tokio::time::Instant::now(),
                received: 0,
                min_rate: self.ls.listener.limits.body_min_rate,
                max: route.max_body_bytes,
            },
        })
    }

    async fn body_next(&mut self, up: &mut Upload) -> Result<Option<Bytes>, ProxyError> {
        let Kind::Stream {
            started,
            received,
            min_rate,
            max,
        } = &mut up.kind
        else {
            return Ok(None);
        };
        let due = conn::body_byte_due(*started, *received, *min_rate, conn::BODY_RATE_GRACE);
        let r = match due {
            Some(due) => tokio::time::timeout_at(due, self.body.data()).await,
            None => timeout(STALL_TIMEOUT, self.body.data()).await,
        };
        match r {
            Err(_) => Err(ProxyError::BodyTooSlow),
            Ok(None) => Ok(None),
            Ok(Some(Err(e))) => Err(client_err(e)),
            Ok(Some(Ok(data))) => {
                *received += data.len() as u64;
                if *max > 0 && *received > *max {
                    return Err(ProxyError::BodyTooLarge);
                }
                Ok(Some(data))
            }
        }
    }

    fn body_release(&mut self, n: usize) {
        let _ = self.body.flow_control().release_capacity(n);
    }

    async fn body_trailers(&mut self, up: &Upload) -> Result<Option<HeaderMap>, ProxyError> {
        if !matches!(up.kind, Kind::Stream { .. }) {
            return Ok(None);
        }
        match timeout(STALL_TIMEOUT, self.body.trailers()).await {
            Err(_) => Err(ProxyError::BodyTooSlow),
            Ok(r) => Ok(r.map_err(client_err)?.map(crate::headers::trailer_fields)),
        }
    }

    fn interims(&self, _: &RequestHead) -> Interims<'a> {
        Interims {
            seen: 0,
            to: To::H2(self.respond),
            held: Vec::new(),
        }
    }

    async fn flush_interims(&mut self, _: &mut Interims<'a>) -> std::io::Result<()> {
        Ok(())
    }

    fn switching(
        &self,
        head: &RequestHead,
        rh: &ResponseHead,
        server: SocketAddr,
    ) -> Option<Result<(), ProxyError>> {
        match crate::websocket::check_answer(head, rh) {
            Err(e) => {
                if head.upgrade {
                    crate::telemetry::logging::log_limited!(info, peer = %self.link.peer, upstream = %server, "HTTP/2 WebSocket refused: {e}");
                }
                Some(Err(e))
            }
            Ok(()) => (rh.status() == 101).then_some(Ok(())),
        }
    }

    fn response_head(
        &mut self,
        _: &RequestHead,
        resp: RespHead,
        edits: &Edits<'_>,
        via: bool,
        _: bool,
    ) -> Result<Sent<H2Out>, HeadFailed> {
        self.response_head_apart(resp, edits, via)
    }

    fn response_head_apart(
        &self,
        resp: RespHead,
        edits: &Edits<'_>,
        via: bool,
    ) -> Result<Sent<H2Out>, HeadFailed> {
        let (response, end) = match resp {
            RespHead::H1(r) => (
                crate::h2_fields::response_from(r, edits, via),
                matches!(r.framing, Framing::None | Framing::Length(0)),
            ),
            RespHead::H2 { parts, end } => {
                (crate::h2_fields::response_from_h2(parts, edits, via), end)
            }
        };
        let send = self
            .respond
            .borrow_mut()
            .send_response(response, end)
            .map_err(|e| HeadFailed::Client(client_err(e)))?;
        Ok(Sent {
            end,
            keep_alive: true,
            out: H2Out::new(send, self.send_timeout()),
        })
    }

    async fn tunnel_h1(
        &mut self,
        up: UpConn,
        rh: &ResponseHead,
        edits: &Edits<'_>,
        via: bool,
        _: &RequestHead,
        server: SocketAddr,
        idle: Duration,
    ) -> Outcome {
        let response = crate::h2_fields::response_from(rh, edits, via);
        let send_timeout = self.send_timeout();
        let peer = self.link.peer;
        let mut respond = self.respond.borrow_mut();
        let body = &mut *self.body;
        let tunnel = super::tunnel::h2_to_h1(
            &mut respond,
            body,
            up,
            response,
            peer,
            server,
            idle,
            send_timeout,
        );
        tunnel.await
    }

    async fn tunnel_h2(
        &mut self,
        _: &RequestHead,
        edits: &Edits<'_>,
        via: bool,
        parts: http::response::Parts,
        from_server: RecvStream,
        to_server: SendStream<Bytes>,
        server: SocketAddr,
        idle: Duration,
    ) -> Outcome {
        let response = crate::h2_fields::response_from_h2(parts, edits, via);
        let send_timeout = self.send_timeout();
        let mut respond = self.respond.borrow_mut();
        let legs = super::tunnel::Legs {
            respond: &mut respond,
            from_client: &mut *self.body,
            from_server,
            to_server,
            peer: self.link.peer,
            server,
        };
        super::tunnel::h2_to_h2(legs, response, idle, send_timeout).await
    }
}

impl answer::Answer for SendResponse<Bytes> {
    const PROTOCOL: &'static str = "HTTP/2";

    async fn simple(
        &mut self,
        status: u16,
        content_type: &str,
        body: &[u8],
        extra: &[(&str, &str)],
        head_only: bool,
        limit: Duration,
    ) -> Result<u64, ProxyError> {
        let response = crate::h2_fields::simple_response(status, content_type, body.len(), extra)?;
        let end = answer::bodyless(status, head_only, body);
        let mut send = self.send_response(response, end).map_err(client_err)?;
        if end {
            return Ok(0);
        }
        let mut data = Bytes::copy_from_slice(body);
        send_windowed(&mut send, &mut data, true, limit, Peer::Client).await?;
        Ok(body.len() as u64)
    }
}

/// The origin action on an HTTP/2 stream: the origin's fields as HEADERS (no HTTP/1 head in
/// between), its body as DATA under the client's window (`limit`: the listener's `send_timeout`).
async fn origin_answer(
    respond: &mut SendResponse<Bytes>,
    head: &RequestHead,
    origin: &portico_origin::Origin,
    id: Option<(&str, &str)>,
    limit: Duration,
) -> Outcome {
    let (response, reply) = crate::h2_fields::origin_response(head, origin, id);
    if let Some(d) = reply.delay {
        tokio::time::sleep(d).await;
    }
    let status = reply.status;
    let end = matches!(reply.body, portico_origin::Body::Empty);
    let mut send = match respond.send_response(response, end) {
        Ok(s) => s,
        Err(e) => return client_failed(e, status, Phase::ResponseHead),
    };
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
                let mut left = len;
                let mut at = Some(offset);
                while left > 0 {
                    let mut chunk = crate::h2_fields::file_chunk(&mut file, &mut at, &mut left)?;
                    send_windowed(&mut send, &mut chunk, left == 0, limit, Peer::Client).await?;
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

/// The outcome of a stream the client reset or closed under the response head.
fn client_failed(e: h2::Error, status: u16, phase: Phase) -> Outcome {
    Outcome {
        termination: client_err(e).termination(phase),
        status,
        keep_alive: true,
        bytes_sent: 0,
        upstream: None,
    }
}
