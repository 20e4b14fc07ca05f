//! `--h2`: one HTTP/2 client connection (h2c prior knowledge, or TLS with ALPN h2) shared by the streams of one benchmark connection.

use crate::conn::ErrorKind;
use crate::conn::{io_error, open_stream, Opened, Response, Stream, TlsTarget};
use crate::request::H2Request;
use bytes::Bytes;
use h2::client::SendRequest;
use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;

/// Stream and connection flow-control windows the client advertises (2^30 - 1, h2load's
/// default): the server is never held back by the client's windows, which are given back as soon
/// as the data is counted.
const WINDOW: u32 = (1 << 30) - 1;

/// An open HTTP/2 connection: the handle streams are opened with, and whether its driver task
/// still runs.
struct Session {
    send: SendRequest<Bytes>,
    alive: Rc<Cell<bool>>,
    /// Which connection of this benchmark connection it is (streams of an older one must not
    /// drop a newer one when they fail late).
    number: u64,
}

/// One benchmark connection over HTTP/2, shared by its stream tasks (one thread's runtime):
/// opened on demand, and reopened when the server closed it. Its driver is a local task.
pub struct H2Conn {
    addr: SocketAddr,
    tls: Option<TlsTarget>,
    session: RefCell<Option<Session>>,
    /// Held while connecting, so that the streams waiting for a connection share one.
    connecting: tokio::sync::Mutex<()>,
    /// Connections opened and not yet collected by [`H2Conn::take_opened`].
    opened: RefCell<Vec<Opened>>,
    /// Connections opened so far.
    count: Cell<u64>,
}

impl std::fmt::Debug for H2Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H2Conn")
            .field("addr", &self.addr)
            .field("tls", &self.tls.is_some())
            .field("open", &self.live().is_some())
            .finish()
    }
}

impl H2Conn {
    /// A connection to `addr` (TLS with ALPN h2 when `tls` is given, else h2c prior knowledge).
    pub fn new(addr: SocketAddr, tls: Option<&crate::tls::TlsClient>) -> H2Conn {
        H2Conn {
            addr,
            tls: tls.map(|t| (t.for_connection(), t.server_name.clone())),
            session: RefCell::new(None),
            connecting: tokio::sync::Mutex::new(()),
            opened: RefCell::new(Vec::new()),
            count: Cell::new(0),
        }
    }

    /// A connection opened since the last call, if any (for the connection and handshake counts).
    pub fn take_opened(&self) -> Option<Opened> {
        self.opened.borrow_mut().pop()
    }

    /// The handle of the current connection and its number, if it is still up.
    fn live(&self) -> Option<(SendRequest<Bytes>, u64)> {
        let s = self.session.borrow();
        s.as_ref()
            .filter(|s| s.alive.get())
            .map(|s| (s.send.clone(), s.number))
    }

    /// Forget connection `number` (it failed), unless a newer one replaced it already: the next
    /// request opens a new one.
    fn drop_session(&self, number: u64) {
        let mut s = self.session.borrow_mut();
        if s.as_ref().is_some_and(|s| s.number == number) {
            s.take();
        }
    }

    /// The current connection's handle, connecting first when there is none (must run on a
    /// `LocalSet`: the connection's driver is a local task).
    pub async fn sender(&self) -> Result<(SendRequest<Bytes>, u64), ErrorKind> {
        if let Some(s) = self.live() {
            return Ok(s);
        }
        let _one_at_a_time = self.connecting.lock().await;
        if let Some(s) = self.live() {
            return Ok(s);
        }
        let (stream, opened) = open_stream(self.addr, self.tls.as_ref()).await?;
        if let Stream::Tls(t) = &stream {
            if t.get_ref().1.alpn_protocol() != Some(b"h2") {
                // The server does not speak HTTP/2 over TLS (it chose no protocol, or another).
                return Err(ErrorKind::Tls);
            }
        }
        let (send, connection) = h2::client::Builder::new()
            .initial_window_size(WINDOW)
            .initial_connection_window_size(WINDOW)
            .enable_push(false)
            .handshake::<_, Bytes>(stream)
            .await
            .map_err(h2_error)?;
        let alive = Rc::new(Cell::new(true));
        let flag = alive.clone();
        tokio::task::spawn_local(async move {
            let _ = connection.await;
            flag.set(false);
        });
        let number = self.count.get() + 1;
        self.count.set(number);
        *self.session.borrow_mut() = Some(Session {
            send: send.clone(),
            alive,
            number,
        });
        self.opened.borrow_mut().push(opened);
        Ok((send, number))
    }

    /// Send `request` on a new stream (connecting first if needed) and read the response; the
    /// body is counted, not kept. `Response::bytes` counts the DATA payload (headers are HPACK
    /// compressed and not counted). Dropping the future resets the stream (CANCEL).
    ///
    /// A stream the server did not process (numbered above its GOAWAY's last stream id, or
    /// reset with REFUSED_STREAM: RFC 9113 8.7 says it may be retried) is sent again on a new
    /// connection, at most twice, as browsers do; its latency includes the retry.
    pub async fn exchange(&self, request: &H2Request) -> Result<Response, ErrorKind> {
        let mut tries = 0;
        loop {
            let (send, number) = self.sender().await?;
            let r = exchange_on(send, request).await;
            match r {
                Ok(r) => return Ok(r),
                Err(Failure::Unprocessed) if tries < 2 => {
                    tries += 1;
                    self.drop_session(number);
                }
                Err(f) => {
                    let kind = f.kind();
                    // A failure of the connection, not only of this stream: reconnect next time.
                    if !matches!(kind, ErrorKind::Reset | ErrorKind::BadResponse) {
                        self.drop_session(number);
                    }
                    return Err(kind);
                }
            }
        }
    }
}

/// How one stream failed.
enum Failure {
    /// The server did not process it (GOAWAY above its last stream id, or REFUSED_STREAM).
    Unprocessed,
    Other(ErrorKind),
}

impl Failure {
    fn kind(&self) -> ErrorKind {
        match self {
            Failure::Unprocessed => ErrorKind::Closed,
            Failure::Other(k) => *k,
        }
    }
}

/// A failure before the response head: whether the server may have processed the stream.
fn before_response(e: h2::Error) -> Failure {
    let refused = e.reason() == Some(h2::Reason::REFUSED_STREAM) && e.is_remote();
    if refused || (e.is_go_away() && e.is_remote()) {
        Failure::Unprocessed
    } else {
        Failure::Other(h2_error(e))
    }
}

async fn exchange_on(send: SendRequest<Bytes>, request: &H2Request) -> Result<Response, Failure> {
    // Waits while the server's concurrent stream limit is reached.
    let mut send = send.ready().await.map_err(before_response)?;
    let end = request.body.is_empty();
    let (response, mut body_tx) = send
        .send_request(request.to_http(), end)
        .map_err(before_response)?;
    if !end {
        body_tx
            .send_data(request.body.clone(), true)
            .map_err(before_response)?;
    }
    let response = response.await.map_err(before_response)?;
    exchange_body(response).await.map_err(Failure::Other)
}

async fn exchange_body(response: http::Response<h2::RecvStream>) -> Result<Response, ErrorKind> {
    let status = response.status().as_u16();
    let mut body = response.into_body();
    let mut bytes = 0u64;
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(h2_error)?;
        bytes = bytes.saturating_add(chunk.len() as u64);
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    body.trailers().await.map_err(h2_error)?;
    Ok(Response {
        status,
        bytes,
        reuse: true,
    })
}

/// The error kind of an HTTP/2 failure: the stream reset by the server is `reset`; the connection
/// gone away (the server's GOAWAY) `closed`; a socket error what the socket says; a protocol
/// error (the client's own RST_STREAM or GOAWAY over a malformed response) `bad_response`.
fn h2_error(e: h2::Error) -> ErrorKind {
    if e.is_reset() || e.is_go_away() {
        return match (e.is_remote(), e.is_reset()) {
            (true, true) => ErrorKind::Reset,
            (true, false) => ErrorKind::Closed,
            (false, _) => ErrorKind::BadResponse,
        };
    }
    match e.into_io() {
        Some(io) => io_error(io),
        None => ErrorKind::BadResponse,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_kinds() {
        assert_eq!(
            h2_error(h2::Error::from(h2::Reason::PROTOCOL_ERROR)),
            ErrorKind::BadResponse
        );
    }
}
