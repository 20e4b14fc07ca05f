//! The client side of one request as the flow sees it: the `Client` trait, implemented by an HTTP/1.1 connection (`http1`), an HTTP/2 stream (`http2`) and an HTTP/3 stream (`http3`) and dispatched statically, so each kind's request future holds only its own state.

pub(crate) mod answer;
pub(crate) mod buffer;
pub(crate) mod http1;
pub(crate) mod http2;
pub(crate) mod http3;
pub(crate) mod link;
mod tunnel;

use crate::conn::ClientBody;
use crate::error::ProxyError;
use crate::filter::Edits;
use crate::h2_fields::trailer_map;
use crate::h2_io::{client_err, finish, send_windowed, Peer};
use crate::headers;
use crate::state::{ListenerState, Shared, Worker};
use crate::telemetry::stats::Outcome;
use crate::telemetry::stats::Phase;
use crate::telemetry::timing::Timings;
use crate::upstream::pool::UpConn;
use ::h2::server::SendResponse;
use ::h2::{RecvStream, SendStream};
use bytes::{Bytes, BytesMut};
use http::header::HeaderMap;
use portico_config::Route;
use portico_http1::{RequestHead, ResponseHead};
use std::cell::RefCell;
use std::future::poll_fn;
use std::net::SocketAddr;
use std::task::Poll;
use std::time::Duration;

/// Who sent the request, for the forwarded head (X-Forwarded-*, hashing, rate-limit keys).
pub struct Who<'a> {
    /// The client's address: the socket's peer, or behind a trusted proxy (`trusted_proxies`)
    /// the client `X-Forwarded-For` names (one address for every use in the request).
    pub ip: &'a str,
    /// The socket's peer (the hop `X-Forwarded-For` is extended with).
    pub peer_ip: &'a str,
    /// The client behind a trusted proxy, when it is not the peer.
    pub forwarded: Option<std::net::IpAddr>,
    /// The client connection is TLS.
    pub tls: bool,
    /// The verified client certificate (mTLS).
    pub cert: Option<&'a portico_tls::ClientCert>,
}

/// `extra` fields of a local answer, and its request id field when it carries one.
pub(crate) fn with_id<'x>(
    extra: &'x [(&'x str, &'x str)],
    id: &'x Option<(&'x str, std::borrow::Cow<'x, str>)>,
) -> std::borrow::Cow<'x, [(&'x str, &'x str)]> {
    match id {
        None => std::borrow::Cow::Borrowed(extra),
        Some((n, v)) => {
            let mut all = extra.to_vec();
            all.push((n, v));
            std::borrow::Cow::Owned(all)
        }
    }
}

/// Most interim (1xx) responses accepted before the final one.
pub(crate) const MAX_INTERIM: usize = 8;

/// The client of one request: what the flow needs of it. `'a` is how long the connection and
/// configuration it lends stay borrowed.
pub(crate) trait Client<'a> {
    /// An HTTP/2 stream: a reset can be watched, interim heads go out at once, and an upload
    /// may go on while the response streams back.
    const H2: bool;
    /// Where a response body goes.
    type Out<'o>: Sink
    where
        Self: 'o;

    fn env(&self) -> Env<'a>;
    fn watch(&self) -> Watch<'a>;
    fn timings(&mut self) -> &mut Timings;
    /// `wait` (for a response head), or None once `due` passed first. An HTTP/1.1 connection
    /// reuses one timer across its requests; an HTTP/2 stream's lives in the wait.
    async fn head_wait<F: std::future::Future>(
        &mut self,
        due: tokio::time::Instant,
        wait: F,
    ) -> Option<F::Output>;
    /// Who sent the request, for the forwarded head and hashing.
    fn who(&self) -> Who<'_>;
    /// The connection's client and the address it connected to, for a PROXY header to a
    /// server (None when the local address cannot be read).
    fn addresses(&self) -> Option<(std::net::SocketAddr, std::net::SocketAddr)>;
    /// Behind a trusted proxy: the request's client, as `X-Forwarded-For` names it.
    fn set_client(&mut self, ip: std::net::IpAddr);
    /// The buffer for the forwarded head (an HTTP/1.1 connection keeps its allocation across
    /// requests: give it back with `put_ubuf`).
    fn take_ubuf(&mut self) -> BytesMut;
    fn put_ubuf(&mut self, ubuf: BytesMut);

    /// Answer with the error status for `e` (unless the client is gone) and describe the
    /// failure. `body_done`: the request body was read to its end (an HTTP/1.1 connection can
    /// then carry another request).
    async fn fail(
        &mut self,
        head: &RequestHead,
        e: ProxyError,
        phase: Phase,
        body_done: bool,
    ) -> Outcome;
    /// Refuse a routed request before its action (shed, rate limited) with `body` and `extra`
    /// fields.
    async fn refuse(
        &mut self,
        head: &RequestHead,
        e: ProxyError,
        body: &[u8],
        extra: &[(&str, &str)],
    ) -> Outcome;
    /// A complete small response generated here (redirect, fixed answer).
    async fn local(
        &mut self,
        head: &RequestHead,
        status: u16,
        content_type: &str,
        body: &[u8],
        extra: &[(&str, &str)],
    ) -> Outcome;
    /// The origin action's answer (`static` and `origin` routes).
    async fn origin(&mut self, head: &RequestHead, origin: &portico_origin::Origin) -> Outcome;

    /// The request has a body to read.
    fn has_body(&self, head: &RequestHead) -> bool;
    /// Before a request body is read (`100 Continue` to an HTTP/1.1 client that waits for it).
    async fn before_upload(&mut self, head: &RequestHead) -> Result<(), ProxyError>;
    /// The request body to upload (`body`: there is one to send), or none; `tunnel`: the
    /// stream stays open for a tunnel's bytes after the answer.
    fn upload(&self, head: &RequestHead, route: &Route, body: bool, tunnel: bool) -> Upload;
    /// The next slice of the body, `None` at its end, under the route's size limit and the
    /// listener's minimum body rate.
    async fn body_next(&mut self, up: &mut Upload) -> Result<Option<Bytes>, ProxyError>;
    /// Flow control: `n` bytes of the body were passed on.
    fn body_release(&mut self, n: usize);
    /// The body's trailers as a field map (after its end).
    async fn body_trailers(&mut self, up: &Upload) -> Result<Option<HeaderMap>, ProxyError>;

    /// Where the interim responses of an attempt go.
    fn interims(&self, head: &RequestHead) -> Interims<'a>;
    /// Write the interim heads held for an HTTP/1.1 client.
    async fn flush_interims(&mut self, i: &mut Interims<'a>) -> std::io::Result<()>;

    /// Whether a final head from an HTTP/1.1 server switches to a tunnel (Some(Ok)), is an
    /// error for this client (Some(Err)), or is a response (None).
    fn switching(
        &self,
        head: &RequestHead,
        rh: &ResponseHead,
        server: SocketAddr,
    ) -> Option<Result<(), ProxyError>>;
    /// Send the response head (with the response filters' `edits` and, when `via`, Via) and
    /// return where its body goes. `body_done`: the request body was read to its end.
    fn response_head(
        &mut self,
        head: &RequestHead,
        resp: RespHead,
        edits: &Edits<'_>,
        via: bool,
        body_done: bool,
    ) -> Result<Sent<Self::Out<'_>>, HeadFailed>;
    /// An HTTP/2 client's response head, its body going out on a stream of its own so that
    /// the upload goes on meanwhile (an HTTP/1.1 client has none: its upload ended first).
    fn response_head_apart(
        &self,
        resp: RespHead,
        edits: &Edits<'_>,
        via: bool,
    ) -> Result<Sent<H2Out>, HeadFailed>;

    /// After an HTTP/1.1 server's 101 to an upgrade: the client's tunnel.
    #[allow(clippy::too_many_arguments)]
    async fn tunnel_h1(
        &mut self,
        up: UpConn,
        rh: &ResponseHead,
        edits: &Edits<'_>,
        via: bool,
        head: &RequestHead,
        server: SocketAddr,
        idle: Duration,
    ) -> Outcome;
    /// After an HTTP/2 server's 2xx to a WebSocket's extended CONNECT: the client's tunnel.
    #[allow(clippy::too_many_arguments)]
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
    ) -> Outcome;
}

/// Read and discard the request body (and an HTTP/2 client's trailers) before a local answer,
/// under the route's size limit and the listener's minimum rate.
pub(crate) async fn drain<'a, D: Client<'a>>(
    down: &mut D,
    head: &RequestHead,
    route: &Route,
) -> Result<(), ProxyError> {
    if !down.has_body(head) {
        return Ok(());
    }
    down.before_upload(head).await?;
    let mut up = down.upload(head, route, true, false);
    while let Some(d) = down.body_next(&mut up).await? {
        down.body_release(d.len());
    }
    down.body_trailers(&up).await.map(|_| ())
}

/// What the flow reads of the connection and the configuration for the whole request.
#[derive(Clone, Copy)]
pub(crate) struct Env<'a> {
    pub shared: &'a Shared,
    pub worker: &'a Worker,
    pub ls: &'a ListenerState,
    pub peer: SocketAddr,
}

/// Watches an HTTP/2 client's stream for a reset (an HTTP/1.1 client has none to watch).
#[derive(Clone, Copy)]
pub(crate) struct Watch<'a>(Option<&'a RefCell<SendResponse<Bytes>>>);

impl Watch<'_> {
    /// Ready when the client reset its stream; never for HTTP/1.1 clients.
    pub(crate) fn poll_reset(&self, cx: &mut std::task::Context<'_>) -> Poll<()> {
        match self.0 {
            None => Poll::Pending,
            // The interim sender borrows the cell only within a synchronous call.
            Some(cell) => match cell.try_borrow_mut() {
                Ok(mut respond) => respond.poll_reset(cx).map(|_| ()),
                Err(_) => Poll::Pending,
            },
        }
    }
}

/// A request body being read from the client for an upload: the chunk being written
/// survives a cancelled upload, so an upload paused while the response head is handled
/// resumes where it stopped.
pub(crate) struct Upload {
    kind: Kind,
    /// A chunk read from the client and not yet all written, and its full length.
    pub pending: Option<(Bytes, usize)>,
}

enum Kind {
    None,
    /// An extended CONNECT (a WebSocket): no body; the stream stays open for the tunnel's
    /// bytes, relayed after the answer.
    Tunnel,
    H1(ClientBody),
    /// A body read whole before the attempt (`buffer_request`), sent from the buffer.
    Replay(buffer::Replay),
    /// An HTTP/2 or HTTP/3 stream's DATA, under the route's size limit and the listener's
    /// minimum rate.
    Stream {
        started: tokio::time::Instant,
        received: u64,
        min_rate: u64,
        max: u64,
    },
}

impl Upload {
    fn new(kind: Kind) -> Self {
        Upload {
            kind,
            pending: None,
        }
    }

    pub(crate) fn is_tunnel(&self) -> bool {
        matches!(self.kind, Kind::Tunnel)
    }

    pub(crate) fn is_none(&self) -> bool {
        matches!(self.kind, Kind::None)
    }

    /// No body is uploaded while the response head is awaited (none, or a tunnel).
    pub(crate) fn headless(&self) -> bool {
        matches!(self.kind, Kind::None | Kind::Tunnel)
    }

    /// The whole body was read from the client (true when there is none).
    pub(crate) fn is_done(&self) -> bool {
        match &self.kind {
            Kind::H1(b) => b.is_done(),
            _ => true,
        }
    }

    /// The next slice of the body to send, `None` at its end: from the client, or from the
    /// buffer a buffered body was read into.
    pub(crate) async fn next<'a, D: Client<'a>>(
        &mut self,
        down: &mut D,
    ) -> Result<Option<Bytes>, ProxyError> {
        match &mut self.kind {
            Kind::Replay(r) => r.next(),
            _ => down.body_next(self).await,
        }
    }

    /// `n` bytes were passed on (flow control of an HTTP/2 client still sending).
    pub(crate) fn release<'a, D: Client<'a>>(&self, down: &mut D, n: usize) {
        if !matches!(self.kind, Kind::Replay(_)) {
            down.body_release(n);
        }
    }

    /// The body's trailers as a field map (after its end).
    pub(crate) async fn trailers<'a, D: Client<'a>>(
        &self,
        down: &mut D,
    ) -> Result<Option<HeaderMap>, ProxyError> {
        match &self.kind {
            Kind::Replay(r) => Ok(r.trailers()),
            _ => down.body_trailers(self).await,
        }
    }

    /// The body's trailers as HTTP/1 lines for a chunked upload (after its end); an HTTP/1.1
    /// client's pass as it sent them.
    pub(crate) async fn trailer_lines<'a, D: Client<'a>>(
        &self,
        down: &mut D,
        out: &mut BytesMut,
    ) -> Result<(), ProxyError> {
        if let Kind::H1(body) = &self.kind {
            out.extend_from_slice(&headers::trailer_lines(&body.trailers));
            return Ok(());
        }
        if let Some(t) = self.trailers(down).await? {
            headers::encode_trailers(out, &t);
        }
        Ok(())
    }
}

/// An interim (1xx, not 101) response of the server.
pub(crate) enum Interim {
    /// An HTTP/1.1 server's head, raw, its hop-by-hop fields removed.
    Raw(Bytes),
    /// An HTTP/2 server's informational response.
    H2(http::Response<()>),
}

enum To<'a> {
    H2(&'a RefCell<SendResponse<Bytes>>),
    H1,
    Dropped,
}

/// The interim (1xx) responses of one attempt, passed to the client as they arrive (103 Early
/// Hints lets a browser preload while the server still works on the answer): HTTP/2 clients
/// get each at once as informational HEADERS; HTTP/1.1 clients as raw heads, held while the
/// connection is read for the request body and written by `Client::flush_interims`; HTTP/1.0
/// clients none (RFC 9110 15.2).
///
/// The first interim response commits the attempt: the request is not retried after it
/// (`Retry::commit`), as if the response had begun, even when the route's policy would retry
/// the failure that follows. Retrying could show the client the hints of one server and the
/// answer of another, or hold every hint until the final head, which defeats 103 exactly for
/// the requests that are retried (body-less GETs, the ones browsers preload for). A later
/// failure gets its 502/504 after the interim heads, which RFC 9110 15.2 allows.
pub(crate) struct Interims<'a> {
    /// Interim responses the server sent so far in this attempt.
    pub seen: usize,
    to: To<'a>,
    /// Raw heads for an HTTP/1.1 client not yet written.
    held: Vec<Bytes>,
}

impl Interims<'_> {
    /// Count one interim response and pass it on (HTTP/2 clients) or hold it (HTTP/1.1
    /// clients); more than [`MAX_INTERIM`] is an upstream error. A client that is gone is not
    /// an error here: the reset watch or the final response reports it.
    pub(crate) fn hold(&mut self, i: Interim) -> Result<(), ProxyError> {
        if self.seen >= MAX_INTERIM {
            return Err(ProxyError::TooManyInterim);
        }
        self.seen += 1;
        match &self.to {
            To::H2(cell) => {
                // Never borrowed elsewhere during this call (single-threaded, no await held).
                if let Ok(mut respond) = cell.try_borrow_mut() {
                    match i {
                        Interim::Raw(raw) => crate::h2_interim::forward(&mut respond, &raw),
                        Interim::H2(resp) => crate::h2_interim::forward_h2(&mut respond, resp),
                    }
                }
            }
            To::H1 => match i {
                Interim::Raw(raw) => self.held.push(raw),
                Interim::H2(resp) => {
                    let mut raw = BytesMut::new();
                    crate::h2_interim::http1_head(&mut raw, &resp);
                    if !raw.is_empty() {
                        self.held.push(raw.freeze());
                    }
                }
            },
            To::Dropped => {}
        }
        Ok(())
    }

    /// Whether heads wait to be written.
    pub(crate) fn holding(&self) -> bool {
        !self.held.is_empty()
    }
}

/// The response head as it goes to the client: an HTTP/1 head from an HTTP/1.1 server, or an
/// HTTP/2 server's head (`end`: no body follows).
pub(crate) enum RespHead<'r> {
    H1(&'r ResponseHead),
    H2 {
        parts: http::response::Parts,
        end: bool,
    },
}

/// The trailers at a response body's end.
pub(crate) enum Trailers {
    /// An HTTP/1.1 server's chunked trailer lines.
    Raw(Bytes),
    /// An HTTP/2 server's trailers, already filtered.
    Map(Option<HeaderMap>),
}

/// Where a response body goes, as the flow relays it.
pub(crate) trait Sink {
    /// Body bytes; `last`: END_STREAM goes with them (an HTTP/2 client).
    async fn data(&mut self, d: Bytes, last: bool) -> Result<(), ProxyError>;
    /// `data` without waiting, when the bytes fit in what is buffered for the next write (an
    /// HTTP/1.1 client): true when they were taken. The relay's common case, kept inline.
    #[inline]
    fn try_buffer(&mut self, _d: &Bytes) -> bool {
        false
    }
    /// A stored body's bytes `from..to` sent from its file by the kernel, where the client's
    /// connection allows it (plain HTTP/1.1 with a sized body); None where it does not (the
    /// caller relays the bytes).
    async fn file(
        &mut self,
        _f: &crate::cache::body::BodyFile,
        _from: u64,
        _to: u64,
    ) -> Option<Result<(), ProxyError>> {
        None
    }
    /// Before a wait for the server: what is buffered goes out (and at the end of the body).
    async fn flush(&mut self) -> Result<(), ProxyError>;
    /// The body ended (not after a `last` data): trailers, or the end of the stream.
    fn end(&mut self, trailers: Trailers) -> Result<(), ProxyError>;
    /// Completes when the client resets its stream (with why); never for HTTP/1.1.
    async fn reset(&mut self) -> ProxyError;
    /// The body failed with `e`: stop the client's stream (unless it is gone), or drop what
    /// is buffered (the connection closes).
    fn abort(&mut self, e: &ProxyError);
    /// Bytes the access log counts as sent.
    fn sent(&self) -> u64;
}

/// How the response head went out.
pub(crate) struct Sent<O> {
    pub out: O,
    /// The client's connection may carry another request after this response.
    pub keep_alive: bool,
    /// No body follows the head.
    pub end: bool,
}

/// Why the response head did not go out.
pub(crate) enum HeadFailed {
    /// The server's head does not make a valid head for the client: answer with the error.
    Invalid(ProxyError),
    /// The client is gone.
    Client(ProxyError),
}

/// An HTTP/2 response body: DATA under the client's window.
pub(crate) struct H2Out {
    send: SendStream<Bytes>,
    /// The listener's `send_timeout`: the longest wait for the client's window.
    limit: Duration,
    /// Body bytes sent so far.
    sent: u64,
}

impl H2Out {
    pub(crate) fn new(send: SendStream<Bytes>, limit: Duration) -> Self {
        H2Out {
            send,
            limit,
            sent: 0,
        }
    }
}

impl Sink for H2Out {
    async fn data(&mut self, mut d: Bytes, last: bool) -> Result<(), ProxyError> {
        self.sent += d.len() as u64;
        send_windowed(&mut self.send, &mut d, last, self.limit, Peer::Client).await
    }

    async fn flush(&mut self) -> Result<(), ProxyError> {
        Ok(())
    }

    fn end(&mut self, trailers: Trailers) -> Result<(), ProxyError> {
        let map = match trailers {
            Trailers::Raw(raw) => trailer_map(&raw),
            Trailers::Map(t) => t.unwrap_or_default(),
        };
        if map.is_empty() {
            finish(&mut self.send)
        } else {
            self.send.send_trailers(map).map_err(client_err)
        }
    }

    async fn reset(&mut self) -> ProxyError {
        match poll_fn(|cx| self.send.poll_reset(cx)).await {
            Ok(_) => ProxyError::ClientClosed,
            Err(e) => client_err(e),
        }
    }

    fn abort(&mut self, e: &ProxyError) {
        if !e.client_gone() {
            self.send.send_reset(::h2::Reason::INTERNAL_ERROR);
        }
    }

    fn sent(&self) -> u64 {
        self.sent
    }
}
