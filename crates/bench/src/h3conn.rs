//! `--h3`: one HTTP/3 client connection (QUIC, its own UDP socket) shared by the streams of one benchmark connection.

use crate::conn::ErrorKind;
use crate::conn::{Handshake, Opened, Response};
use crate::request::H2Request;
use crate::session::{Failure, Opening, Sessions};
use bytes::{Buf, Bytes};
use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

type SendRequest = h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>;

/// One benchmark connection over HTTP/3, shared by its stream tasks (one thread's runtime):
/// opened on demand, and reopened when the server closed it. Its QUIC endpoint (one UDP
/// socket, as one client machine has) is kept across reconnections.
pub struct H3Conn {
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    server_name: String,
    endpoint: RefCell<Option<quinn::Endpoint>>,
    /// A session's handle, and its QUIC connection (to close it).
    sessions: Sessions<(SendRequest, quinn::Connection)>,
    /// `--close`: a new connection per request.
    close: bool,
}

impl std::fmt::Debug for H3Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H3Conn")
            .field("addr", &self.addr)
            .field("open", &self.sessions.live().is_some())
            .finish()
    }
}

impl H3Conn {
    /// A connection to `addr` with the run's TLS client (its ALPN is `h3`).
    pub fn new(addr: SocketAddr, tls: &crate::tls::TlsClient, close: bool) -> H3Conn {
        H3Conn {
            addr,
            tls: tls.for_connection(),
            server_name: tls.server_name.to_str().into_owned(),
            endpoint: RefCell::new(None),
            sessions: Sessions::new(),
            close,
        }
    }

    /// Close the current connection (`--close`: after its one request); the next request opens
    /// another on the same UDP socket.
    pub fn close_now(&self) {
        if let Some((_, conn)) = self.sessions.take() {
            conn.close(0u32.into(), b"");
        }
    }

    /// A connection opened since the last call, if any (for the connection and handshake counts).
    pub fn take_opened(&self) -> Option<Opened> {
        self.sessions.take_opened()
    }

    fn endpoint(&self) -> Result<quinn::Endpoint, ErrorKind> {
        if let Some(e) = &*self.endpoint.borrow() {
            return Ok(e.clone());
        }
        let local: SocketAddr = match self.addr {
            SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
            SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
        };
        let mut e = quinn::Endpoint::client(local).map_err(|_| ErrorKind::Connect)?;
        let quic = quinn::crypto::rustls::QuicClientConfig::try_from(self.tls.clone())
            .map_err(|_| ErrorKind::Tls)?;
        e.set_default_client_config(quinn::ClientConfig::new(Arc::new(quic)));
        *self.endpoint.borrow_mut() = Some(e.clone());
        Ok(e)
    }

    /// Open the connection now, unless it is open (must run on a `LocalSet`).
    pub async fn open(&self) -> Result<(), ErrorKind> {
        self.sessions.get(|| self.connect()).await.map(|_| ())
    }

    /// A new QUIC connection with HTTP/3 over it, its driver a local task.
    async fn connect(&self) -> Result<Opening<(SendRequest, quinn::Connection)>, ErrorKind> {
        let endpoint = self.endpoint()?;
        let connecting = endpoint
            .connect(self.addr, &self.server_name)
            .map_err(|_| ErrorKind::Connect)?;
        let conn = connecting.await.map_err(quic_error)?;
        let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn.clone()))
            .await
            .map_err(|_| ErrorKind::BadResponse)?;
        let alive = Rc::new(Cell::new(true));
        let flag = alive.clone();
        tokio::task::spawn_local(async move {
            let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
            flag.set(false);
        });
        // QUIC's handshake is TLS 1.3; whether it resumed a session is not told by quinn.
        let opened = Opened {
            tls: Some(Handshake {
                resumed: false,
                version: Some("TLSv1.3"),
                suite: None,
                group: None,
            }),
        };
        Ok(((send, conn), alive, opened))
    }

    /// Send `request` on a new stream (connecting first if needed) and read the response; the
    /// body is counted, not kept. A request the server did not process (its GOAWAY came first,
    /// or it rejected the stream) is sent again on a new connection ([`Sessions::exchange`]).
    pub async fn exchange(&self, request: &H2Request) -> Result<Response, ErrorKind> {
        let once = |(send, _)| exchange_on(send, request);
        let mut r = self.sessions.exchange(|| self.connect(), once).await?;
        r.reuse = !self.close;
        Ok(r)
    }
}

async fn exchange_on(mut send: SendRequest, request: &H2Request) -> Result<Response, Failure> {
    let mut stream = send
        .send_request(request.to_http())
        .await
        .map_err(before_response)?;
    let fail = |e| Failure::Other(stream_error(e));
    if !request.body.is_empty() {
        stream.send_data(request.body.clone()).await.map_err(fail)?;
    }
    stream.finish().await.map_err(fail)?;
    let response = stream.recv_response().await.map_err(before_response)?;
    let mut bytes = 0u64;
    while let Some(mut chunk) = stream.recv_data().await.map_err(fail)? {
        let n = chunk.remaining();
        bytes = bytes.saturating_add(n as u64);
        chunk.advance(n);
    }
    stream.recv_trailers().await.map_err(fail)?;
    Ok(Response {
        status: response.status().as_u16(),
        bytes,
        reuse: true,
    })
}

/// A failure before the response head: the server did not process the request when its GOAWAY
/// came first or it rejected the stream (H3_REQUEST_REJECTED, RFC 9114 4.1.1: safe to retry).
fn before_response(e: h3::error::StreamError) -> Failure {
    match e {
        h3::error::StreamError::RemoteClosing { .. } => Failure::Unprocessed,
        h3::error::StreamError::RemoteTerminate { code, .. }
            if code == h3::error::Code::H3_REQUEST_REJECTED =>
        {
            Failure::Unprocessed
        }
        other => Failure::Other(stream_error(other)),
    }
}

/// The error kind of a failed stream: reset by the server `reset`, the connection gone `closed`.
fn stream_error(e: h3::error::StreamError) -> ErrorKind {
    match e {
        h3::error::StreamError::RemoteTerminate { .. } => ErrorKind::Reset,
        h3::error::StreamError::ConnectionError { .. }
        | h3::error::StreamError::RemoteClosing { .. } => ErrorKind::Closed,
        _ => ErrorKind::BadResponse,
    }
}

/// The error kind of a failed QUIC handshake.
fn quic_error(e: quinn::ConnectionError) -> ErrorKind {
    match e {
        quinn::ConnectionError::TimedOut => ErrorKind::Timeout,
        quinn::ConnectionError::ConnectionClosed(_) | quinn::ConnectionError::Reset => {
            ErrorKind::ConnectRefused
        }
        quinn::ConnectionError::TransportError(_) => ErrorKind::Tls,
        _ => ErrorKind::Connect,
    }
}
