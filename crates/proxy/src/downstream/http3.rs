//! An HTTP/3 request stream as the client of one request: its DATA read under the route's and listener's body limits and checked against its content-length, the response as HEADERS and DATA under QUIC's flow control (interim heads are not passed on, and nothing is tunnelled).

use super::answer;
use super::link::Link;
use super::Who;
use super::{Client, Env, H2Out, HeadFailed, Interims, Kind, RespHead, Sent, Sink, To, Trailers};
use super::{Upload, Watch};
use crate::conn::{self, STALL_TIMEOUT};
use crate::error::ProxyError;
use crate::filter::Edits;
use crate::h2_fields::trailer_map;
use crate::state::{ListenerState, Shared};
use crate::telemetry::stats::{Outcome, Phase};
use crate::telemetry::timing::Timings;
use crate::upstream::pool::UpConn;
use bytes::{Buf, Bytes, BytesMut};
use h2::{RecvStream, SendStream};
use h3::error::{Code, StreamError};
use http::header::HeaderMap;
use portico_config::Route;
use portico_http1::{Framing, RequestHead, ResponseHead};
use std::io;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::time::timeout;

/// The sending half of a request stream: the response.
pub(crate) type H3Send = h3::server::RequestStream<h3_quinn::SendStream<Bytes>, Bytes>;
/// The receiving half of a request stream: the request body and trailers.
pub(crate) type H3Recv = h3::server::RequestStream<h3_quinn::RecvStream, Bytes>;

/// An `h3` stream error on the client's stream as the flow counts it: a stream the client
/// stopped or reset, or a connection gone, is the client closing; anything else an I/O error.
pub(crate) fn h3_err(e: StreamError) -> ProxyError {
    match e {
        StreamError::RemoteTerminate { .. } | StreamError::ConnectionError { .. } => {
            ProxyError::ClientClosed
        }
        other => ProxyError::ClientIo(io::Error::other(other.to_string())),
    }
}

/// `work` (a write to the client) within the listener's `send_timeout`.
async fn within<T>(
    limit: Duration,
    work: impl std::future::Future<Output = Result<T, StreamError>>,
) -> Result<T, ProxyError> {
    match timeout(limit, work).await {
        Err(_) => Err(ProxyError::ClientIo(io::ErrorKind::TimedOut.into())),
        Ok(r) => r.map_err(h3_err),
    }
}

/// What an HTTP/3 request stream lends to the flow.
pub(crate) struct H3Down<'a> {
    pub link: &'a Link,
    pub ls: &'a ListenerState,
    pub shared: &'a Shared,
    pub send: &'a mut H3Send,
    pub recv: &'a mut H3Recv,
    pub body: StreamBody,
    pub timings: &'a mut Timings,
    /// The request's client behind a trusted proxy (None: the socket's peer).
    pub client: Option<(std::net::IpAddr, Box<str>)>,
}

/// What is known of a request stream's body before the flow reads it.
pub(crate) struct StreamBody {
    /// The first chunk, read to learn whether a body follows at all.
    pub first: Option<Bytes>,
    /// The client's `content-length`, which the body must match.
    pub length: Option<u64>,
    /// The stream has no body, or its end was read.
    pub ended: bool,
}

impl<'a> H3Down<'a> {
    fn send_timeout(&self) -> Duration {
        self.ls.listener.limits.send_timeout
    }

    /// The request id field a local answer to `head` carries, if any.
    fn answer_id<'h>(&self, head: &'h RequestHead) -> Option<(&'a str, std::borrow::Cow<'h, str>)> {
        answer::id_field(self.shared, self.timings, head)
    }
}

impl<'a> Client<'a> for H3Down<'a> {
    // As for an HTTP/1.1 client: the upload ends before the response streams back, and no
    // reset is watched (a stopped stream fails the next write).
    const H2: bool = false;
    type Out<'o>
        = H3Out<'o>
    where
        Self: 'o;

    fn env(&self) -> Env<'a> {
        self.link.env(self.shared, self.ls)
    }

    fn watch(&self) -> Watch<'a> {
        Watch(None)
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
        BytesMut::new()
    }

    fn put_ubuf(&mut self, _: BytesMut) {}

    async fn fail(&mut self, head: &RequestHead, e: ProxyError, phase: Phase, _: bool) -> Outcome {
        let id = self.answer_id(head);
        let id = id.as_ref().map(|(n, v)| (*n, &**v));
        let (limit, peer) = (self.send_timeout(), self.link.peer);
        answer::fail(self.send, peer, Some(head), e, phase, id.as_slice(), limit).await
    }

    async fn refuse(
        &mut self,
        head: &RequestHead,
        e: ProxyError,
        body: &[u8],
        extra: &[(&str, &str)],
    ) -> Outcome {
        let id = self.answer_id(head);
        let extra = super::with_id(extra, &id);
        let limit = self.send_timeout();
        answer::refusal(self.send, Some(head), e, Phase::Route, body, &extra, limit).await
    }

    async fn local(
        &mut self,
        head: &RequestHead,
        status: u16,
        content_type: &str,
        body: &[u8],
        extra: &[(&str, &str)],
    ) -> Outcome {
        let id = self.answer_id(head);
        let extra = super::with_id(extra, &id);
        let limit = self.send_timeout();
        answer::local(self.send, head, status, content_type, body, &extra, limit).await
    }

    async fn origin(&mut self, head: &RequestHead, origin: &portico_origin::Origin) -> Outcome {
        let id = self.answer_id(head);
        let id = id.as_ref().map(|(n, v)| (*n, &**v));
        let limit = self.send_timeout();
        origin_answer(self.send, head, origin, id, limit).await
    }

    fn has_body(&self, _: &RequestHead) -> bool {
        !self.body.ended
    }

    async fn before_upload(&mut self, _: &RequestHead) -> Result<(), ProxyError> {
        Ok(())
    }

    fn upload(&self, _: &RequestHead, route: &Route, body: bool, _: bool) -> Upload {
        Upload::new(match body {
            false => Kind::None,
            true => Kind::Stream {
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
        let data = match self.body.first.take() {
            Some(d) => Some(d),
            None if self.body.ended => None,
            None => {
                let read = async {
                    match self.recv.recv_data().await {
                        Ok(Some(mut b)) => Ok(Some(b.copy_to_bytes(b.remaining()))),
                        Ok(None) => Ok(None),
                        Err(e) => Err(e),
                    }
                };
                let due =
                    conn::body_byte_due(*started, *received, *min_rate, conn::BODY_RATE_GRACE);
                let r = match due {
                    Some(due) => tokio::time::timeout_at(due, read).await,
                    None => timeout(STALL_TIMEOUT, read).await,
                };
                r.map_err(|_| ProxyError::BodyTooSlow)?.map_err(h3_err)?
            }
        };
        let Some(data) = data else {
            self.body.ended = true;
            if self.body.length.is_some_and(|n| n != *received) {
                return Err(ProxyError::Http2Malformed(
                    "body shorter than content-length",
                ));
            }
            return Ok(None);
        };
        *received += data.len() as u64;
        if self.body.length.is_some_and(|n| *received > n) {
            return Err(ProxyError::Http2Malformed(
                "body longer than content-length",
            ));
        }
        if *max > 0 && *received > *max {
            return Err(ProxyError::BodyTooLarge);
        }
        Ok(Some(data))
    }

    fn body_release(&mut self, _: usize) {}

    async fn body_trailers(&mut self, up: &Upload) -> Result<Option<HeaderMap>, ProxyError> {
        if !matches!(up.kind, Kind::Stream { .. }) {
            return Ok(None);
        }
        match timeout(STALL_TIMEOUT, self.recv.recv_trailers()).await {
            Err(_) => Err(ProxyError::BodyTooSlow),
            Ok(r) => Ok(r.map_err(h3_err)?.map(crate::headers::trailer_fields)),
        }
    }

    fn interims(&self, _: &RequestHead) -> Interims<'a> {
        Interims {
            seen: 0,
            to: To::Dropped,
            held: Vec::new(),
        }
    }

    async fn flush_interims(&mut self, _: &mut Interims<'a>) -> io::Result<()> {
        Ok(())
    }

    fn switching(
        &self,
        _: &RequestHead,
        rh: &ResponseHead,
        _: SocketAddr,
    ) -> Option<Result<(), ProxyError>> {
        // Nothing is upgraded over HTTP/3: a 101 is a server error.
        (rh.status() == 101).then_some(Err(ProxyError::UnexpectedUpgrade))
    }

    fn response_head(
        &mut self,
        _: &RequestHead,
        resp: RespHead,
        edits: &Edits<'_>,
        via: bool,
        _: bool,
    ) -> Result<Sent<H3Out<'_>>, HeadFailed> {
        let (response, end) = match resp {
            RespHead::H1(r) => (
                crate::h2_fields::response_from(r, edits, via),
                matches!(r.framing, Framing::None | Framing::Length(0)),
            ),
            RespHead::H2 { parts, end } => {
                (crate::h2_fields::response_from_h2(parts, edits, via), end)
            }
        };
        Ok(Sent {
            end,
            keep_alive: true,
            out: H3Out {
                limit: self.send_timeout(),
                send: self.send,
                head: Some(response),
                end: end.then(HeaderMap::new),
                sent: 0,
                finished: false,
            },
        })
    }

    fn response_head_apart(
        &self,
        _: RespHead,
        _: &Edits<'_>,
        _: bool,
    ) -> Result<Sent<H2Out>, HeadFailed> {
        // Only for clients whose upload goes on while the response streams back (`H2`).
        Err(HeadFailed::Invalid(ProxyError::Internal(
            "an HTTP/3 response apart from its upload",
        )))
    }

    async fn tunnel_h1(
        &mut self,
        _: UpConn,
        _: &ResponseHead,
        _: &Edits<'_>,
        _: bool,
        head: &RequestHead,
        _: SocketAddr,
        _: Duration,
    ) -> Outcome {
        // `switching` refuses every 101, so no tunnel starts.
        let e = ProxyError::Internal("a tunnel on an HTTP/3 stream");
        self.fail(head, e, Phase::ResponseHead, false).await
    }

    async fn tunnel_h2(
        &mut self,
        head: &RequestHead,
        _: &Edits<'_>,
        _: bool,
        _: http::response::Parts,
        _: RecvStream,
        _: SendStream<Bytes>,
        _: SocketAddr,
        _: Duration,
    ) -> Outcome {
        // Only a WebSocket's extended CONNECT opens one, and HTTP/3 clients cannot send it here.
        let e = ProxyError::Internal("a tunnel on an HTTP/3 stream");
        self.fail(head, e, Phase::ResponseHead, false).await
    }
}

/// An HTTP/3 response: its head goes out with the first body bytes or the first flush (the
/// flow makes heads without waiting), its end (FIN, after trailers if any) at the flush that
/// follows the body's end.
pub(crate) struct H3Out<'s> {
    send: &'s mut H3Send,
    /// The head, until it is written.
    head: Option<http::Response<()>>,
    /// The body ended, with these trailers (empty: none); the stream is finished at the next
    /// flush.
    end: Option<HeaderMap>,
    /// The listener's `send_timeout`: the longest wait for the client's flow control.
    limit: Duration,
    sent: u64,
    /// The stream was finished (FIN after the whole response).
    finished: bool,
}

impl Drop for H3Out<'_> {
    fn drop(&mut self) {
        // A response that did not end in full is reset: the stream's own drop would finish it,
        // and the client would take a cut body for a whole one.
        if !self.finished {
            self.send.stop_stream(Code::H3_INTERNAL_ERROR);
        }
    }
}

impl H3Out<'_> {
    async fn write_head(&mut self) -> Result<(), ProxyError> {
        match self.head.take() {
            Some(h) => within(self.limit, self.send.send_response(h)).await,
            None => Ok(()),
        }
    }
}

impl Sink for H3Out<'_> {
    async fn data(&mut self, d: Bytes, last: bool) -> Result<(), ProxyError> {
        self.write_head().await?;
        self.sent += d.len() as u64;
        if !d.is_empty() {
            within(self.limit, self.send.send_data(d)).await?;
        }
        if last {
            self.end = Some(HeaderMap::new());
            return self.flush().await;
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), ProxyError> {
        self.write_head().await?;
        if let Some(trailers) = self.end.take() {
            if !trailers.is_empty() {
                within(self.limit, self.send.send_trailers(trailers)).await?;
            }
            within(self.limit, self.send.finish()).await?;
            self.finished = true;
        }
        Ok(())
    }

    fn end(&mut self, trailers: Trailers) -> Result<(), ProxyError> {
        self.end = Some(match trailers {
            Trailers::Raw(raw) => trailer_map(&raw),
            Trailers::Map(t) => t.unwrap_or_default(),
        });
        Ok(())
    }

    async fn reset(&mut self) -> ProxyError {
        // A stopped stream shows as a failed write instead.
        std::future::pending().await
    }

    fn abort(&mut self, _: &ProxyError) {
        // Also when the client is gone: a reset stream is never taken for a whole response.
        self.send.stop_stream(Code::H3_INTERNAL_ERROR);
        self.finished = true;
    }

    fn sent(&self) -> u64 {
        self.sent
    }
}

impl answer::Answer for H3Send {
    const PROTOCOL: &'static str = "HTTP/3";

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
        let bodyless = answer::bodyless(status, head_only, body);
        let r = async {
            within(limit, self.send_response(response)).await?;
            if !bodyless {
                within(limit, self.send_data(Bytes::copy_from_slice(body))).await?;
            }
            within(limit, self.finish()).await
        };
        if let Err(e) = r.await {
            // Never left for the stream's drop to finish as if whole.
            self.stop_stream(Code::H3_INTERNAL_ERROR);
            return Err(e);
        }
        Ok(if bodyless { 0 } else { body.len() as u64 })
    }
}

/// The origin action on an HTTP/3 stream: the origin's fields as HEADERS, its body as DATA.
async fn origin_answer(
    send: &mut H3Send,
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
    let r: Result<u64, ProxyError> = async {
        within(limit, send.send_response(response)).await?;
        let n = match reply.body {
            portico_origin::Body::Empty => 0,
            portico_origin::Body::Bytes(b) => {
                let n = b.len() as u64;
                within(limit, send.send_data(b)).await?;
                n
            }
            portico_origin::Body::File {
                mut file,
                offset,
                len,
            } => {
                let mut left = len;
                let mut at = Some(offset);
                while left > 0 {
                    let chunk = crate::h2_fields::file_chunk(&mut file, &mut at, &mut left)?;
                    within(limit, send.send_data(chunk)).await?;
                }
                len
            }
        };
        within(limit, send.finish()).await?;
        Ok(n)
    }
    .await;
    match r {
        Ok(n) => Outcome::ok(status, true, n),
        Err(e) => {
            send.stop_stream(Code::H3_INTERNAL_ERROR);
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
