//! An HTTP/1.1 (or 1.0) connection as the client of one request: its body read through the HTTP/1 decoder, interim heads held while it is read, the response written through a buffer that lets a small body leave with its head.

use super::H2Out;
use super::Who;
use super::{
    Client, Env, HeadFailed, Interims, Kind, RespHead, Sent, Sink, To, Trailers, Upload, Watch,
};
use crate::conn::{self, ClientBody, Conn, Ctx};
use crate::error::ProxyError;
use crate::filter::Edits;
use crate::headers::{self, ClientFraming};
use crate::stream::ClientStream;
use crate::telemetry::stats::Outcome;
use crate::telemetry::stats::Phase;
use crate::telemetry::timing::Timings;
use crate::upstream::pool::UpConn;
use bytes::{Bytes, BytesMut};
use h2::{RecvStream, SendStream};
use http::header::HeaderMap;
use portico_config::Route;
use portico_http1::{encode, Framing, RequestHead, ResponseHead, Version};
use std::net::SocketAddr;
use std::time::Duration;

/// An HTTP/1.1 connection serving one request.
pub(crate) struct H1Down<'a> {
    pub c: &'a mut Conn,
    pub ctx: &'a Ctx,
    /// The request's client behind a trusted proxy (None: the socket's peer).
    pub client: Option<(std::net::IpAddr, Box<str>)>,
}

impl<'a> Client<'a> for H1Down<'a> {
    const H2: bool = false;
    type Out<'o>
        = H1Out<'o>
    where
        Self: 'o;

    fn env(&self) -> Env<'a> {
        let ctx: &'a Ctx = self.ctx;
        Env {
            shared: &ctx.shared,
            worker: &ctx.worker,
            ls: &ctx.ls,
            peer: self.c.peer,
        }
    }

    fn watch(&self) -> Watch<'a> {
        Watch(None)
    }

    fn timings(&mut self) -> &mut Timings {
        &mut self.c.timings
    }

    async fn head_wait<F: std::future::Future>(
        &mut self,
        due: tokio::time::Instant,
        wait: F,
    ) -> Option<F::Output> {
        self.c.timer.timeout_at(due, wait).await
    }

    fn who(&self) -> Who<'_> {
        Who {
            ip: self.client.as_ref().map_or(&self.c.client_ip, |c| &c.1),
            peer_ip: &self.c.client_ip,
            forwarded: self.client.as_ref().map(|c| c.0),
            tls: self.c.stream.is_tls(),
            cert: self.c.client_cert.as_deref(),
        }
    }

    fn addresses(&self) -> Option<(std::net::SocketAddr, std::net::SocketAddr)> {
        Some((self.c.peer, crate::stream::local_addr(&self.c.stream)?))
    }

    fn set_client(&mut self, ip: std::net::IpAddr) {
        self.client = Some((ip, ip.to_string().into_boxed_str()));
    }

    fn take_ubuf(&mut self) -> BytesMut {
        std::mem::take(&mut self.c.ubuf)
    }

    fn put_ubuf(&mut self, ubuf: BytesMut) {
        self.c.ubuf = ubuf;
    }

    async fn fail(
        &mut self,
        head: &RequestHead,
        e: ProxyError,
        phase: Phase,
        body_done: bool,
    ) -> Outcome {
        conn::fail(self.c, self.ctx, head, e, phase, body_done).await
    }

    async fn refuse(
        &mut self,
        head: &RequestHead,
        e: ProxyError,
        body: &[u8],
        extra: &[(&str, &str)],
    ) -> Outcome {
        // The connection stays open only when no request body is left unread.
        let status = e.status();
        let body_done = !head.has_body();
        let ka = body_done && conn::may_keep_alive(self.c, self.ctx, head);
        let id = conn::answer_id(self.c, self.ctx, head);
        let extra = super::with_id(extra, &id);
        let r =
            conn::write_simple(self.c, status, "text/plain", body, ka, Some(head), &extra).await;
        Outcome {
            termination: e.termination(Phase::Route),
            status,
            keep_alive: ka && r.is_ok(),
            bytes_sent: r.unwrap_or(0),
            upstream: None,
        }
    }

    async fn local(
        &mut self,
        head: &RequestHead,
        status: u16,
        content_type: &str,
        body: &[u8],
        extra: &[(&str, &str)],
    ) -> Outcome {
        let ka = conn::may_keep_alive(self.c, self.ctx, head);
        let id = conn::answer_id(self.c, self.ctx, head);
        let extra = super::with_id(extra, &id);
        let r = conn::write_simple(self.c, status, content_type, body, ka, Some(head), &extra);
        match r.await {
            Ok(n) => Outcome::ok(status, ka, n),
            Err(e) => Outcome {
                termination: e.termination(Phase::ResponseBody),
                status,
                keep_alive: false,
                bytes_sent: 0,
                upstream: None,
            },
        }
    }

    async fn origin(&mut self, head: &RequestHead, origin: &portico_origin::Origin) -> Outcome {
        conn::serve_origin(self.c, self.ctx, head, origin).await
    }

    fn has_body(&self, head: &RequestHead) -> bool {
        head.has_body()
    }

    async fn before_upload(&mut self, head: &RequestHead) -> Result<(), ProxyError> {
        conn::send_continue(self.c, head).await
    }

    fn upload(&self, head: &RequestHead, route: &Route, body: bool, tunnel: bool) -> Upload {
        Upload::new(match (body, tunnel) {
            (false, false) => Kind::None,
            (false, true) => Kind::Tunnel,
            (true, _) => Kind::H1(ClientBody::new(
                head.framing,
                route.max_body_bytes,
                self.ctx.ls.listener.limits.body_min_rate,
            )),
        })
    }

    async fn body_next(&mut self, up: &mut Upload) -> Result<Option<Bytes>, ProxyError> {
        match &mut up.kind {
            Kind::H1(body) => body.next(&mut self.c.stream, &mut self.c.rbuf).await,
            _ => Ok(None),
        }
    }

    fn body_release(&mut self, _: usize) {}

    async fn body_trailers(&mut self, up: &Upload) -> Result<Option<HeaderMap>, ProxyError> {
        match &up.kind {
            Kind::H1(body) => Ok(Some(crate::h2_fields::trailer_map(&body.trailers))),
            _ => Ok(None),
        }
    }

    fn interims(&self, head: &RequestHead) -> Interims<'a> {
        Interims {
            seen: 0,
            to: match head.version() {
                Version::Http11 => To::H1,
                Version::Http10 => To::Dropped,
            },
            held: Vec::new(),
        }
    }

    async fn flush_interims(&mut self, i: &mut Interims<'a>) -> std::io::Result<()> {
        if i.held.is_empty() {
            return Ok(());
        }
        // Boxed: rare, and a client write's state would otherwise widen every request's future.
        let held = std::mem::take(&mut i.held);
        let c = &mut *self.c;
        Box::pin(async move {
            match held.len() {
                1 => conn::send_all(&mut c.stream, &held[0], c.send_timeout).await,
                _ => conn::send_all(&mut c.stream, &held.concat(), c.send_timeout).await,
            }
        })
        .await
    }

    fn switching(
        &self,
        head: &RequestHead,
        rh: &ResponseHead,
        _: SocketAddr,
    ) -> Option<Result<(), ProxyError>> {
        // The client checks the 101 of its own upgrade.
        match (rh.status() == 101, head.upgrade) {
            (true, false) => Some(Err(ProxyError::UnexpectedUpgrade)),
            (true, true) => Some(Ok(())),
            _ => None,
        }
    }

    fn response_head(
        &mut self,
        head: &RequestHead,
        resp: RespHead,
        edits: &Edits<'_>,
        via: bool,
        body_done: bool,
    ) -> Result<Sent<H1Out<'_>>, HeadFailed> {
        let h1;
        let (rh, trailers) = match resp {
            RespHead::H1(r) => (r, true),
            RespHead::H2 { parts, end } => {
                let invalid = || {
                    let e = std::io::Error::other("response head not valid HTTP/1");
                    HeadFailed::Invalid(ProxyError::UpstreamIo(e))
                };
                h1 = crate::h2_fields::http1_response(&parts, head.method(), end)
                    .ok_or_else(invalid)?;
                // An HTTP/2 server's trailers go only to a client that asked for them.
                (&h1, headers::wants_trailers(head))
            }
        };
        let c = &mut *self.c;
        // A re-encoded (compressed) body's length is known only at its end.
        let framing = match rh.framing {
            Framing::Length(_) if edits.recoded() => Framing::Chunked,
            f => f,
        };
        let cf = headers::client_framing(framing, head.version());
        let keep_alive =
            body_done && cf != ClientFraming::Close && conn::may_keep_alive(c, self.ctx, head);
        c.wbuf.clear();
        headers::client_response(&mut c.wbuf, rh, cf, edits, via, head.version(), keep_alive);
        let chunked = cf == ClientFraming::Chunked;
        Ok(Sent {
            end: rh.framing == Framing::None,
            keep_alive,
            out: H1Out {
                c,
                chunked,
                trailers: chunked && trailers,
                sent: 0,
            },
        })
    }

    fn response_head_apart(
        &self,
        _: RespHead,
        _: &Edits<'_>,
        _: bool,
    ) -> Result<Sent<H2Out>, HeadFailed> {
        Err(HeadFailed::Invalid(ProxyError::Internal(
            "an HTTP/1.1 client's upload ends before its response",
        )))
    }

    async fn tunnel_h1(
        &mut self,
        up: UpConn,
        rh: &ResponseHead,
        edits: &Edits<'_>,
        via: bool,
        head: &RequestHead,
        server: SocketAddr,
        idle: Duration,
    ) -> Outcome {
        super::tunnel::h1_to_h1(self.c, up, rh, edits, via, head, server, idle).await
    }

    async fn tunnel_h2(
        &mut self,
        head: &RequestHead,
        edits: &Edits<'_>,
        via: bool,
        parts: http::response::Parts,
        from_server: RecvStream,
        to_server: SendStream<Bytes>,
        server: SocketAddr,
        idle: Duration,
    ) -> Outcome {
        let Some(switch) = crate::websocket::switch_head(head, &parts) else {
            let e = ProxyError::UpstreamIo(std::io::Error::other(
                "the 2xx's fields are not valid HTTP/1",
            ));
            let mut o = conn::fail(self.c, self.ctx, head, e, Phase::ResponseHead, false).await;
            o.upstream = Some(server);
            return o;
        };
        let legs = super::tunnel::H1Legs {
            from_server,
            to_server,
            server,
            idle,
        };
        super::tunnel::h1_to_h2(self.c, head, edits, via, switch, legs).await
    }
}

/// An HTTP/1.1 response body: bytes gather in the connection's write buffer (the head first,
/// so a small body leaves in the same write) and are written before each wait for the server.
pub(crate) struct H1Out<'o> {
    c: &'o mut Conn,
    chunked: bool,
    /// Trailers are passed on (chunked, and for an HTTP/2 server the client said `TE:
    /// trailers`).
    trailers: bool,
    /// Bytes written to the client so far, the head included.
    sent: u64,
}

/// The most an HTTP/1.1 response body gathers in the write buffer before it is written.
const GATHER: usize = 64 * 1024;

impl Sink for H1Out<'_> {
    #[inline]
    fn try_buffer(&mut self, d: &Bytes) -> bool {
        let c = &mut *self.c;
        // A chunk header and its CRLF take at most 20 bytes.
        if c.wbuf.len() + d.len() + 20 > GATHER {
            return false;
        }
        if self.chunked {
            encode::chunk_header(&mut c.wbuf, d.len());
        }
        c.wbuf.extend_from_slice(d);
        if self.chunked {
            c.wbuf.extend_from_slice(b"\r\n");
        }
        true
    }

    async fn data(&mut self, d: Bytes, _: bool) -> Result<(), ProxyError> {
        let c = &mut *self.c;
        if self.chunked {
            encode::chunk_header(&mut c.wbuf, d.len());
        }
        if c.wbuf.len() + d.len() <= GATHER {
            c.wbuf.extend_from_slice(&d);
        } else {
            // What is buffered (the head, a chunk header) and the body leave in one write.
            conn::send_both(&mut c.stream, &c.wbuf, &d, c.send_timeout)
                .await
                .map_err(ProxyError::ClientIo)?;
            self.sent += (c.wbuf.len() + d.len()) as u64;
            c.wbuf.clear();
        }
        if self.chunked {
            self.c.wbuf.extend_from_slice(b"\r\n");
        }
        Ok(())
    }

    async fn file(
        &mut self,
        f: &crate::cache::body::BodyFile,
        from: u64,
        to: u64,
    ) -> Option<Result<(), ProxyError>> {
        let c = &mut *self.c;
        let ClientStream::Plain(s) = &c.stream else {
            return None;
        };
        if self.chunked {
            return None;
        }
        let (at, end) = (f.offset + from, f.offset + to);
        let r = conn::send_file(s, &c.wbuf, &f.file, at, end, c.send_timeout).await;
        self.sent += c.wbuf.len() as u64 + (to - from);
        c.wbuf.clear();
        Some(r.map_err(ProxyError::ClientIo))
    }

    async fn flush(&mut self) -> Result<(), ProxyError> {
        let c = &mut *self.c;
        if !c.wbuf.is_empty() {
            conn::send_all(&mut c.stream, &c.wbuf, c.send_timeout)
                .await
                .map_err(ProxyError::ClientIo)?;
            self.sent += c.wbuf.len() as u64;
            c.wbuf.clear();
        }
        Ok(())
    }

    fn end(&mut self, trailers: Trailers) -> Result<(), ProxyError> {
        // The last chunk stays buffered for the final flush.
        if self.chunked {
            let mut lines = BytesMut::new();
            match trailers {
                Trailers::Raw(raw) => lines.extend_from_slice(&headers::trailer_lines(&raw)),
                Trailers::Map(Some(t)) if self.trailers => headers::encode_trailers(&mut lines, &t),
                Trailers::Map(_) => {}
            }
            encode::last_chunk(&mut self.c.wbuf, &lines);
        }
        Ok(())
    }

    async fn reset(&mut self) -> ProxyError {
        std::future::pending().await
    }

    fn abort(&mut self, _: &ProxyError) {
        self.c.wbuf.clear();
    }

    fn sent(&self) -> u64 {
        self.sent
    }
}
