//! One client connection (plain or TLS): connect, write the pre-encoded request, read one response with the codec.

use crate::tls::TlsClient;
use bytes::BytesMut;
use portico_http1::{parse_response, BodyDecoder, Decoded, Limits, Method};
use rustls::pki_types::ServerName;
use serde::Serialize;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// Why a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The connection attempt was refused (nothing listening).
    ConnectRefused,
    /// Another connection failure (e.g. no local port available).
    Connect,
    /// No complete response within `--timeout` of the send.
    Timeout,
    /// The connection was reset (RST, or a write to a closed connection).
    Reset,
    /// The server closed the connection before the response was complete.
    Closed,
    /// The response did not parse as HTTP/1.1 or its body framing was broken.
    BadResponse,
    /// Another socket error.
    Io,
    /// The TLS handshake failed (certificate refused, no common version, suite or group...).
    Tls,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 8] = [
        ErrorKind::ConnectRefused,
        ErrorKind::Connect,
        ErrorKind::Timeout,
        ErrorKind::Reset,
        ErrorKind::Closed,
        ErrorKind::BadResponse,
        ErrorKind::Io,
        ErrorKind::Tls,
    ];

    /// The key used in JSON output.
    pub fn key(self) -> &'static str {
        match self {
            ErrorKind::ConnectRefused => "connect_refused",
            ErrorKind::Connect => "connect",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Reset => "reset",
            ErrorKind::Closed => "closed",
            ErrorKind::BadResponse => "bad_response",
            ErrorKind::Io => "io",
            ErrorKind::Tls => "tls",
        }
    }

    /// Words for the human summary.
    pub fn describe(self) -> &'static str {
        match self {
            ErrorKind::ConnectRefused => "connect refused",
            ErrorKind::Connect => "connect failed",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Reset => "reset",
            ErrorKind::Closed => "closed before the response",
            ErrorKind::BadResponse => "bad response",
            ErrorKind::Io => "other socket error",
            ErrorKind::Tls => "TLS handshake failed",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// Bytes kept free in the read buffer before each read.
const READ_RESERVE: usize = 16 * 1024;
/// Largest body piece taken from the buffer at once (the bytes are only counted).
const DECODE_MAX: usize = usize::MAX;
/// How long a connection that ends waits for the server's FIN before closing anyway.
const FIN_WAIT: std::time::Duration = std::time::Duration::from_millis(10);
/// Most interim (1xx) responses accepted before the final one.
const MAX_INTERIM: usize = 16;

/// A complete response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    /// Head and body bytes.
    pub bytes: u64,
    /// Whether the connection may carry the next request.
    pub reuse: bool,
}

/// A TLS handshake that completed: full or resumed, and what was negotiated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handshake {
    pub resumed: bool,
    /// 0-RTT: None when not tried, else whether the server accepted it.
    pub early: Option<bool>,
    pub version: Option<&'static str>,
    pub suite: Option<&'static str>,
    pub group: Option<&'static str>,
}

/// A connection that was opened (TCP connected, and the TLS handshake done for `https://`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    pub tls: Option<Handshake>,
}

/// A plain or a TLS client stream.
pub type Stream = portico_tls::MaybeTls<TlsStream<portico_tls::Tcp>>;

/// A client connection, opened on demand and reopened after the server closes it.
#[derive(Debug)]
pub struct Conn {
    addr: SocketAddr,
    /// `https://`: the connector (sharing the run's client config and session cache) and name.
    tls: Option<TlsTarget>,
    stream: Option<Stream>,
    buf: BytesMut,
    limits: Limits,
    /// The requests say `Connection: close`: never reuse the connection.
    close_after: bool,
    /// The last connection opened, until [`Conn::take_opened`] collects it.
    opened: Option<Opened>,
}

impl Conn {
    /// A connection to `addr` (TLS with `tls`); `close_after` when the requests carry
    /// `Connection: close`.
    pub fn new(addr: SocketAddr, tls: Option<&TlsClient>, close_after: bool) -> Conn {
        Conn {
            addr,
            tls: tls.map(|t| (t.for_connection(), t.server_name.clone())),
            stream: None,
            buf: BytesMut::with_capacity(READ_RESERVE),
            limits: Limits::default(),
            close_after,
            opened: None,
        }
    }

    /// The connection opened since the last call, if any (for the handshake counts).
    pub fn take_opened(&mut self) -> Option<Opened> {
        self.opened.take()
    }

    /// Whether a connection is open.
    pub fn is_open(&self) -> bool {
        self.stream.is_some()
    }

    /// Open the connection if it is not.
    pub async fn connect(&mut self) -> Result<(), ErrorKind> {
        if self.stream.is_none() {
            let (stream, opened) = open_stream(self.addr, self.tls.as_ref()).await?;
            self.stream = Some(stream);
            self.opened = Some(opened);
            self.buf.clear();
        }
        Ok(())
    }

    /// Drop the connection (after an error or a response that ends it).
    pub fn close(&mut self) {
        self.stream = None;
        self.buf.clear();
    }

    /// Send `request` and read one response to `method`, connecting first if needed. On error the
    /// connection is closed. After a response with `reuse == false` call [`Conn::finish_close`].
    pub async fn exchange(
        &mut self,
        request: &[u8],
        method: &Method,
    ) -> Result<Response, ErrorKind> {
        let r = self.exchange_inner(request, method).await;
        if r.is_err() {
            self.close();
        }
        r
    }

    async fn exchange_inner(
        &mut self,
        request: &[u8],
        method: &Method,
    ) -> Result<Response, ErrorKind> {
        self.connect().await?;
        let Some(stream) = self.stream.as_mut() else {
            return Err(ErrorKind::Connect);
        };
        // Bytes left from an earlier response mean the server sent more than it framed.
        if !self.buf.is_empty() {
            return Err(ErrorKind::BadResponse);
        }
        stream.write_all(request).await.map_err(io_error)?;
        // TLS: push the records out (a no-op on plain TCP).
        stream.flush().await.map_err(io_error)?;
        let mut bytes = 0u64;
        let mut interim = 0usize;
        let head = loop {
            match parse_response(&mut self.buf, method, &self.limits) {
                Ok(Some(head)) => {
                    bytes = bytes.saturating_add(head.raw().len() as u64);
                    let status = head.status();
                    if (100..200).contains(&status) {
                        // 101 would switch protocols: a benchmark of HTTP/1.1 does not expect it.
                        interim += 1;
                        if status == 101 || interim > MAX_INTERIM {
                            return Err(ErrorKind::BadResponse);
                        }
                        continue;
                    }
                    break head;
                }
                Ok(None) => {
                    if read_more(stream, &mut self.buf).await? == 0 {
                        return Err(ErrorKind::Closed);
                    }
                }
                Err(_) => return Err(ErrorKind::BadResponse),
            }
        };
        let mut body = BodyDecoder::new(head.framing);
        let mut eof = false;
        loop {
            let step = if eof {
                body.on_eof()
            } else {
                body.decode(&mut self.buf, DECODE_MAX)
            };
            match step {
                Ok(Decoded::Data(d)) => bytes = bytes.saturating_add(d.len() as u64),
                Ok(Decoded::Done { trailers }) => {
                    bytes = bytes.saturating_add(trailers.len() as u64);
                    break;
                }
                Ok(Decoded::NeedMore) => {
                    if read_more(stream, &mut self.buf).await? == 0 {
                        eof = true;
                    }
                }
                Err(portico_http1::BodyError::Truncated) => return Err(ErrorKind::Closed),
                Err(_) => return Err(ErrorKind::BadResponse),
            }
        }
        Ok(Response {
            status: head.status(),
            bytes,
            reuse: !self.close_after && !eof && head.keep_alive && self.buf.is_empty(),
        })
    }

    /// Close after a response that ends the connection. Waits briefly for the server's FIN first,
    /// so that the server, not the client, holds the TIME_WAIT state (a connection-per-request run
    /// would otherwise run out of local ports).
    pub async fn finish_close(&mut self) {
        if let Some(mut s) = self.stream.take() {
            let mut scratch = [0u8; 512];
            let wait = tokio::time::timeout(FIN_WAIT, async {
                loop {
                    match s.read(&mut scratch).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
            });
            let _ = wait.await;
        }
        self.buf.clear();
    }
}

/// The TLS side of a connection: the client configuration (with its session cache) and the name.
pub type TlsTarget = (Arc<rustls::ClientConfig>, ServerName<'static>);

/// Connect to `addr` (TCP, no Nagle) and do the TLS handshake when `tls` is given.
pub async fn open_stream(
    addr: SocketAddr,
    tls: Option<&TlsTarget>,
) -> Result<(Stream, Opened), ErrorKind> {
    let s = TcpStream::connect(addr).await.map_err(connect_error)?;
    let _ = s.set_nodelay(true);
    Ok(match tls {
        None => (Stream::Plain(s), Opened { tls: None }),
        Some((config, name)) => {
            let t = TlsConnector::from(config.clone())
                .connect(name.clone(), portico_tls::Tcp(s))
                .await
                .map_err(handshake_error)?;
            let c = t.get_ref().1;
            let hs = Handshake {
                resumed: c.handshake_kind() == Some(rustls::HandshakeKind::Resumed),
                early: None,
                version: c.protocol_version().and_then(|v| v.as_str()),
                suite: c.negotiated_cipher_suite().and_then(|s| s.suite().as_str()),
                group: c
                    .negotiated_key_exchange_group()
                    .and_then(|g| g.name().as_str()),
            };
            (Stream::Tls(Box::new(t)), Opened { tls: Some(hs) })
        }
    })
}

/// Read into the spare capacity of `buf`; the number of bytes read, 0 at EOF.
async fn read_more(stream: &mut Stream, buf: &mut BytesMut) -> Result<usize, ErrorKind> {
    if buf.capacity() - buf.len() < READ_RESERVE / 4 {
        buf.reserve(READ_RESERVE);
    }
    stream.read_buf(buf).await.map_err(io_error)
}

fn connect_error(e: io::Error) -> ErrorKind {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => ErrorKind::ConnectRefused,
        io::ErrorKind::TimedOut => ErrorKind::Timeout,
        _ => ErrorKind::Connect,
    }
}

/// A failed TLS handshake: the TLS layer's refusal (bad certificate, nothing in common...) is
/// `tls`; a socket failure during the handshake is what the socket error says.
fn handshake_error(e: io::Error) -> ErrorKind {
    if e.kind() == io::ErrorKind::InvalidData
        || e.get_ref().is_some_and(|i| i.is::<rustls::Error>())
    {
        ErrorKind::Tls
    } else {
        io_error(e)
    }
}

/// The error kind of a socket error.
pub fn io_error(e: io::Error) -> ErrorKind {
    match e.kind() {
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe => ErrorKind::Reset,
        io::ErrorKind::UnexpectedEof => ErrorKind::Closed,
        io::ErrorKind::TimedOut => ErrorKind::Timeout,
        _ => ErrorKind::Io,
    }
}
