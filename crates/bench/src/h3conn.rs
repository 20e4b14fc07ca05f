//! `--h3`: one HTTP/3 client connection (QUIC, its own UDP socket) shared by the streams of one benchmark connection.

use crate::conn::ErrorKind;
use crate::conn::{Handshake, Opened, Response};
use crate::request::H2Request;
use crate::session::{Failure, Opening, Sessions};
use crate::tls::{Counting, Tickets};
use bytes::{Buf, Bytes};
use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::watch;

type SendRequest = h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>;

/// The fixed part of how long a closing connection waits for its session ticket.
const TICKET_GRACE: std::time::Duration = std::time::Duration::from_millis(5);

/// One QUIC connection with HTTP/3 over it.
#[derive(Clone)]
struct Session {
    send: SendRequest,
    conn: quinn::Connection,
    /// This benchmark connection's count of QUIC connections when it opened (from 1).
    id: u64,
    /// Session tickets received before it opened.
    tickets_at_open: u64,
    /// Requests went as 0-RTT data: the handshake's outcome, once known.
    early: Option<watch::Receiver<Option<Outcome>>>,
}

/// What a connection's handshake was, known once it completes (with 0-RTT, after requests went).
#[derive(Debug, Clone, Copy)]
enum Outcome {
    Pending,
    Done(Handshake),
    /// Not counted: the connection failed before its handshake completed (its requests count
    /// the failure).
    Skip,
}

/// The handshake of a connection whose certificates verified so far were `before`.
fn handshake(counting: &Counting, before: u64, early: Option<bool>) -> Handshake {
    Handshake {
        // A resumed TLS 1.3 handshake verifies no certificate.
        resumed: counting.verified.load(Ordering::Relaxed) == before,
        early,
        version: Some("TLSv1.3"),
        suite: None,
        group: None,
    }
}

/// One benchmark connection over HTTP/3, shared by its stream tasks (one thread's runtime):
/// opened on demand, and reopened when the server closed it. Its QUIC endpoint (one UDP
/// socket, as one client machine has) is kept across reconnections.
pub struct H3Conn {
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    /// Counts the certificates `tls` verified: a handshake that verified none resumed.
    counting: Arc<Counting>,
    /// With resumption: `tls`'s session store, which counts the tickets it got.
    tickets: Option<Arc<Tickets>>,
    server_name: String,
    endpoint: RefCell<Option<quinn::Endpoint>>,
    sessions: Sessions<Session, Rc<Cell<Outcome>>>,
    /// `--close`: a new connection per request.
    close: bool,
    /// `--early-data`: requests as 0-RTT data when the session allows it.
    early_data: bool,
    /// `--loss`: the share of datagrams dropped each way.
    loss: f64,
    /// The server refused 0-RTT data: the next connection waits for its handshake (the
    /// requests that were refused go on it). One HTTP/3 session cannot outlive the refusal of
    /// its streams (its driver closes the connection), so they cannot go again on the same.
    refused: Cell<bool>,
    /// The last connection whose refusal set `refused` (its streams fail one by one: only the
    /// first sets it).
    last_refused: Cell<u64>,
    /// QUIC connections opened so far.
    opened: Cell<u64>,
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
    /// A connection to `addr` with the run's TLS client (its ALPN is `h3`), dropping `loss` of
    /// its datagrams each way.
    pub fn new(addr: SocketAddr, tls: &crate::tls::TlsClient, close: bool, loss: f64) -> H3Conn {
        let (config, counting, tickets) = tls.for_quic();
        H3Conn {
            addr,
            tls: config,
            counting,
            tickets,
            server_name: tls.server_name.to_str().into_owned(),
            endpoint: RefCell::new(None),
            sessions: Sessions::new(),
            close,
            early_data: tls.settings.early_data,
            loss,
            refused: Cell::new(false),
            last_refused: Cell::new(0),
            opened: Cell::new(0),
        }
    }

    /// Close the current connection (`--close`: after its one request); the next request opens
    /// another on the same UDP socket. With resumption, it first waits a moment for the
    /// connection's session ticket if none came yet (a server sends it once the client's
    /// Finished came, which can be after the response to a 0-RTT request; closing at once would
    /// leave the next connection a full handshake, where a browser, which stays, resumes): at
    /// most four round trips and [`TICKET_GRACE`], and only while the server sends tickets.
    pub async fn close_now(&self) {
        let Some(s) = self.sessions.take() else {
            return;
        };
        if let Some(t) = &self.tickets {
            if t.received() > 0 || s.id == 1 {
                t.wait_past(s.tickets_at_open, s.conn.rtt() * 4 + TICKET_GRACE)
                    .await;
            }
        }
        s.conn.close(0u32.into(), b"");
    }

    /// A connection whose handshake completed since the last call, if any (for the connection
    /// and handshake counts; one still in its handshake is counted by a later call).
    pub fn take_opened(&self) -> Option<Opened> {
        let done = |o: &Rc<Cell<Outcome>>| !matches!(o.get(), Outcome::Pending);
        loop {
            match self.sessions.take_first(done)?.get() {
                Outcome::Done(hs) => return Some(Opened { tls: Some(hs) }),
                _ => continue,
            }
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
        let mut e = match self.loss > 0.0 {
            false => quinn::Endpoint::client(local).map_err(|_| ErrorKind::Connect)?,
            true => lossy_endpoint(local, self.loss).map_err(|_| ErrorKind::Connect)?,
        };
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

    /// A new QUIC connection with HTTP/3 over it, its driver a local task. With
    /// `--early-data` and a session to resume, it is handed over before its handshake
    /// completes, so that the first requests go as 0-RTT data.
    async fn connect(&self) -> Result<Opening<Session, Rc<Cell<Outcome>>>, ErrorKind> {
        let endpoint = self.endpoint()?;
        let connecting = endpoint
            .connect(self.addr, &self.server_name)
            .map_err(|_| ErrorKind::Connect)?;
        let before = self.counting.verified.load(Ordering::Relaxed);
        let id = self.opened.get() + 1;
        self.opened.set(id);
        let tickets_at_open = self.tickets.as_ref().map_or(0, |t| t.received());
        let outcome = Rc::new(Cell::new(Outcome::Pending));
        let early_try = match self.early_data && !self.refused.replace(false) {
            true => connecting.into_0rtt(),
            false => Err(connecting),
        };
        let (conn, early) = match early_try {
            Ok((conn, accepted)) => {
                let (tx, rx) = watch::channel(None);
                let (out, counting, c) = (outcome.clone(), self.counting.clone(), conn.clone());
                tokio::task::spawn_local(async move {
                    let ok = accepted.await;
                    // Not accepted because the connection ended: no handshake to count.
                    let o = match !ok && c.close_reason().is_some() {
                        true => Outcome::Skip,
                        false => Outcome::Done(handshake(&counting, before, Some(ok))),
                    };
                    out.set(o);
                    let _ = tx.send(Some(o));
                });
                (conn, Some(rx))
            }
            Err(connecting) => {
                let conn = connecting.await.map_err(quic_error)?;
                outcome.set(Outcome::Done(handshake(&self.counting, before, None)));
                (conn, None)
            }
        };
        session(conn, id, tickets_at_open, early, outcome).await
    }

    /// Send `request` on a new stream (connecting first if needed) and read the response; the
    /// body is counted, not kept. A request the server did not process (its GOAWAY came first,
    /// it rejected the stream, or it refused the 0-RTT data the request went in) is sent again
    /// on a new connection ([`Sessions::exchange`]).
    pub async fn exchange(&self, request: &H2Request) -> Result<Response, ErrorKind> {
        let once = |s: Session| async move {
            let r = exchange_on(s.send, request).await;
            match (r, s.early) {
                (Err(Failure::Other(kind)), Some(mut early)) => {
                    // The server refused the 0-RTT data: it never saw the request. (A connection
                    // that failed is a failure.)
                    match early.wait_for(Option::is_some).await.map(|v| *v) {
                        Ok(Some(Outcome::Done(h))) if h.early == Some(false) => {
                            s.conn.close(0u32.into(), b"");
                            if self.last_refused.replace(s.id) != s.id {
                                self.refused.set(true);
                            }
                            Err(Failure::Unprocessed)
                        }
                        _ => Err(Failure::Other(kind)),
                    }
                }
                (r, _) => r,
            }
        };
        let mut r = self.sessions.exchange(|| self.connect(), once).await?;
        r.reuse = !self.close;
        Ok(r)
    }
}

/// An HTTP/3 session over `conn`, its driver a local task.
async fn session(
    conn: quinn::Connection,
    id: u64,
    tickets_at_open: u64,
    early: Option<watch::Receiver<Option<Outcome>>>,
    outcome: Rc<Cell<Outcome>>,
) -> Result<Opening<Session, Rc<Cell<Outcome>>>, ErrorKind> {
    let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn.clone()))
        .await
        .map_err(|_| ErrorKind::BadResponse)?;
    let alive = Rc::new(Cell::new(true));
    let flag = alive.clone();
    tokio::task::spawn_local(async move {
        let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
        flag.set(false);
    });
    Ok((
        Session {
            send,
            conn,
            id,
            tickets_at_open,
            early,
        },
        alive,
        outcome,
    ))
}

/// A client endpoint on `local` whose socket drops `loss` of the datagrams each way.
fn lossy_endpoint(local: SocketAddr, loss: f64) -> std::io::Result<quinn::Endpoint> {
    let socket = std::net::UdpSocket::bind(local)?;
    let runtime =
        quinn::default_runtime().ok_or_else(|| std::io::Error::other("no async runtime found"))?;
    let inner = runtime.wrap_udp_socket(socket)?;
    // Each connection's socket its own loss pattern.
    let seed = inner.local_addr().map(|a| a.port() as u64).unwrap_or(1);
    quinn::Endpoint::new_with_abstract_socket(
        quinn::EndpointConfig::default(),
        None,
        Arc::new(crate::lossy::Lossy::new(inner, loss, seed)),
        runtime,
    )
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
