//! `--h3`: one HTTP/3 client connection (QUIC, its own UDP socket) shared by the streams of one benchmark connection.

use crate::conn::ErrorKind;
use crate::conn::{Handshake, Opened, Response};
use crate::request::H2Request;
use bytes::{Buf, Bytes};
use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

type SendRequest = h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>;

/// An open HTTP/3 connection: the handle streams are opened with, and whether its driver task
/// still runs.
struct Session {
    send: SendRequest,
    conn: quinn::Connection,
    alive: Rc<Cell<bool>>,
    /// Which connection of this benchmark connection it is (streams of an older one must not
    /// drop a newer one when they fail late).
    number: u64,
}

/// One benchmark connection over HTTP/3, shared by its stream tasks (one thread's runtime):
/// opened on demand, and reopened when the server closed it. Its QUIC endpoint (one UDP
/// socket, as one client machine has) is kept across reconnections.
pub struct H3Conn {
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    server_name: String,
    endpoint: RefCell<Option<quinn::Endpoint>>,
    session: RefCell<Option<Session>>,
    /// Held while connecting, so that the streams waiting for a connection share one.
    connecting: tokio::sync::Mutex<()>,
    /// Connections opened and not yet collected by [`H3Conn::take_opened`].
    opened: RefCell<Vec<Opened>>,
    /// Connections opened so far.
    count: Cell<u64>,
    /// `--close`: a new connection per request.
    close: bool,
}

impl std::fmt::Debug for H3Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H3Conn")
            .field("addr", &self.addr)
            .field("open", &self.live().is_some())
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
            session: RefCell::new(None),
            connecting: tokio::sync::Mutex::new(()),
            opened: RefCell::new(Vec::new()),
            count: Cell::new(0),
            close,
        }
    }

    /// Close the current connection (`--close`: after its one request); the next request opens
    /// another on the same UDP socket.
    pub fn close_now(&self) {
        if let Some(s) = self.session.borrow_mut().take() {
            s.conn.close(0u32.into(), b"");
        }
    }

    /// A connection opened since the last call, if any (for the connection and handshake counts).
    pub fn take_opened(&self) -> Option<Opened> {
        self.opened.borrow_mut().pop()
    }

    fn live(&self) -> Option<(SendRequest, u64)> {
        let s = self.session.borrow();
        s.as_ref()
            .filter(|s| s.alive.get())
            .map(|s| (s.send.clone(), s.number))
    }

    /// Forget connection `number` (it failed), unless a newer one replaced it already.
    fn drop_session(&self, number: u64) {
        let mut s = self.session.borrow_mut();
        if s.as_ref().is_some_and(|s| s.number == number) {
            s.take();
        }
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

    /// The current connection's handle, connecting first when there is none (must run on a
    /// `LocalSet`: the connection's driver is a local task).
    pub async fn sender(&self) -> Result<(SendRequest, u64), ErrorKind> {
        if let Some(s) = self.live() {
            return Ok(s);
        }
        let _one_at_a_time = self.connecting.lock().await;
        if let Some(s) = self.live() {
            return Ok(s);
        }
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
        let number = self.count.get() + 1;
        self.count.set(number);
        *self.session.borrow_mut() = Some(Session {
            send: send.clone(),
            conn,
            alive,
            number,
        });
        // QUIC's handshake is TLS 1.3; whether it resumed a session is not told by quinn.
        self.opened.borrow_mut().push(Opened {
            tls: Some(Handshake {
                resumed: false,
                version: Some("TLSv1.3"),
                suite: None,
                group: None,
            }),
        });
        Ok((send, number))
    }

    /// Send `request` on a new stream (connecting first if needed) and read the response; the
    /// body is counted, not kept. A request the server did not process (its GOAWAY came first)
    /// is sent again on a new connection, at most twice.
    pub async fn exchange(&self, request: &H2Request) -> Result<Response, ErrorKind> {
        let mut tries = 0;
        loop {
            let (send, number) = self.sender().await?;
            match exchange_on(send, request).await {
                Ok(mut r) => {
                    r.reuse = !self.close;
                    return Ok(r);
                }
                Err(Failure::Unprocessed) if tries < 2 => {
                    tries += 1;
                    self.drop_session(number);
                }
                Err(f) => {
                    let kind = f.kind();
                    if !matches!(kind, ErrorKind::Reset | ErrorKind::BadResponse) {
                        self.drop_session(number);
                    }
                    return Err(kind);
                }
            }
        }
    }
}

enum Failure {
    /// The server did not process it (its GOAWAY came first).
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
