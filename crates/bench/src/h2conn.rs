//! `--h2`: one HTTP/2 client connection (h2c prior knowledge, or TLS with ALPN h2) shared by the streams of one benchmark connection.

use crate::conn::ErrorKind;
use crate::conn::{io_error, open_stream, Opened, Response, Stream, TlsTarget};
use crate::request::H2Request;
use crate::session::{Failure, Opening, Sessions};
use bytes::Bytes;
use h2::client::SendRequest;
use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;

/// Stream and connection flow-control windows the client advertises (2^30 - 1, h2load's
/// default): the server is never held back by the client's windows, which are given back as soon
/// as the data is counted.
const WINDOW: u32 = (1 << 30) - 1;

/// One benchmark connection over HTTP/2, shared by its stream tasks (one thread's runtime):
/// opened on demand, and reopened when the server closed it. Its driver is a local task.
pub struct H2Conn {
    addr: SocketAddr,
    tls: Option<TlsTarget>,
    sessions: Sessions<SendRequest<Bytes>>,
}

impl std::fmt::Debug for H2Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H2Conn")
            .field("addr", &self.addr)
            .field("tls", &self.tls.is_some())
            .field("open", &self.sessions.live().is_some())
            .finish()
    }
}

impl H2Conn {
    /// A connection to `addr` (TLS with ALPN h2 when `tls` is given, else h2c prior knowledge).
    pub fn new(addr: SocketAddr, tls: Option<&crate::tls::TlsClient>) -> H2Conn {
        H2Conn {
            addr,
            tls: tls.map(|t| (t.for_connection(), t.server_name.clone())),
            sessions: Sessions::new(),
        }
    }

    /// A connection opened since the last call, if any (for the connection and handshake counts).
    pub fn take_opened(&self) -> Option<Opened> {
        self.sessions.take_opened()
    }

    /// Open the connection now, unless it is open (must run on a `LocalSet`).
    pub async fn open(&self) -> Result<(), ErrorKind> {
        self.sessions.get(|| self.connect()).await.map(|_| ())
    }

    /// A new HTTP/2 connection, its driver a local task.
    async fn connect(&self) -> Result<Opening<SendRequest<Bytes>>, ErrorKind> {
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
        Ok((send, alive, opened))
    }

    /// Send `request` on a new stream (connecting first if needed) and read the response; the
    /// body is counted, not kept. `Response::bytes` counts the DATA payload (headers are HPACK
    /// compressed and not counted). Dropping the future resets the stream (CANCEL).
    ///
    /// A stream the server did not process (numbered above its GOAWAY's last stream id, or
    /// reset with REFUSED_STREAM: RFC 9113 8.7 says it may be retried) is sent again on a new
    /// connection ([`Sessions::exchange`]).
    pub async fn exchange(&self, request: &H2Request) -> Result<Response, ErrorKind> {
        let once = |send| exchange_on(send, request);
        self.sessions.exchange(|| self.connect(), once).await
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
