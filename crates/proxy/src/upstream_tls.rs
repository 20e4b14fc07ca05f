//! TLS origination: the upstream byte stream (plain TCP or TLS), each group's connector, the handshake.

use crate::error::ProxyError;
use portico_config::UpstreamTls;
use std::hash::{Hash, Hasher};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// How the servers of one group are reached over TLS, built once per configuration (the rustls
/// client configuration is shared by every worker; so is its session store).
pub struct GroupTls {
    pub connector: tokio_rustls::TlsConnector,
    pub origination: portico_tls::Origination,
    /// Tells pooled connections made with these settings from plain ones and from those made
    /// with other TLS settings to the same address (never 0, which is plain TCP). A hash of the
    /// settings, so connections pooled before a reload that keeps them stay usable.
    pub pool_id: u64,
    /// The configured `server_name` when it is a DNS name: the `Host` sent when the client's is
    /// not forwarded.
    host: Option<String>,
}

impl GroupTls {
    pub fn new(settings: &UpstreamTls, origination: portico_tls::Origination) -> Self {
        GroupTls {
            connector: tokio_rustls::TlsConnector::from(origination.config.clone()),
            origination,
            pool_id: settings_id(settings),
            host: settings
                .server_name
                .clone()
                .filter(|n| n.parse::<std::net::IpAddr>().is_err()),
        }
    }

    /// The `Host` for the server at `addr` when the client's is not forwarded: the configured
    /// DNS `server_name`, with the port unless it is 443. None = use the address.
    pub fn host(&self, addr: SocketAddr) -> Option<String> {
        let name = self.host.as_deref()?;
        Some(match addr.port() {
            443 => name.to_string(),
            port => format!("{name}:{port}"),
        })
    }

    /// The TLS handshake with the server at `addr` over a connected socket. A failure (bad
    /// certificate, wrong name, protocol mismatch, the server closing) is
    /// [`ProxyError::TlsHandshake`].
    pub async fn handshake(
        &self,
        addr: SocketAddr,
        tcp: TcpStream,
    ) -> Result<UpStream, ProxyError> {
        let name = self.origination.server_name(addr);
        match self.connector.connect(name, tcp).await {
            Ok(tls) => Ok(UpStream::Tls(Box::new(tls))),
            Err(e) => Err(ProxyError::TlsHandshake(e)),
        }
    }
}

/// The files a group's TLS origination is built from (CA file, client certificate and key).
pub fn files(settings: &UpstreamTls) -> Vec<std::path::PathBuf> {
    settings
        .ca_file
        .iter()
        .cloned()
        .chain(
            settings
                .certificate
                .iter()
                .flat_map(|c| [c.cert.clone(), c.key.clone()]),
        )
        .collect()
}

/// The pool identity of a group's TLS settings (see [`GroupTls::pool_id`]).
pub fn settings_id(settings: &UpstreamTls) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    settings.hash(&mut h);
    h.finish().max(1)
}

/// An upstream connection's byte stream.
pub enum UpStream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl UpStream {
    /// Write without waiting: plain sockets write what fits now; TLS writes nothing here (its
    /// records go through `write_all` and `flush`), so the caller's slow path handles it.
    pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        match self {
            UpStream::Plain(s) => s.try_write(buf),
            UpStream::Tls(_) => Ok(0),
        }
    }

    /// Whether the connection has completed a resumed TLS handshake.
    pub fn resumed(&self) -> bool {
        match self {
            UpStream::Plain(_) => false,
            UpStream::Tls(s) => {
                s.get_ref().1.handshake_kind() == Some(tokio_rustls::rustls::HandshakeKind::Resumed)
            }
        }
    }

    /// Read and write halves usable at the same time in one task.
    pub fn split(&mut self) -> (UpRead<'_>, UpWrite<'_>) {
        match self {
            UpStream::Plain(s) => {
                let (r, w) = s.split();
                (UpRead::Plain(r), UpWrite::Plain(w))
            }
            UpStream::Tls(s) => {
                let (r, w) = tokio::io::split(s.as_mut());
                (UpRead::Tls(r), UpWrite::Tls(w))
            }
        }
    }

    /// An idle connection must have nothing to read: data means a protocol error, EOF means
    /// closed. Answers from tokio's cached readiness without a syscall when nothing was
    /// signalled. A TLS connection is read through rustls, which consumes records that carry no
    /// data (a late session ticket) and reports a close_notify as EOF.
    pub fn is_idle_alive(&mut self) -> bool {
        match self {
            UpStream::Plain(s) => {
                let mut probe = [0u8; 1];
                matches!(s.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
            UpStream::Tls(s) => {
                let mut probe = [0u8; 1];
                let mut buf = ReadBuf::new(&mut probe);
                let mut cx = Context::from_waker(Waker::noop());
                Pin::new(s.as_mut())
                    .poll_read(&mut cx, &mut buf)
                    .is_pending()
            }
        }
    }
}

impl AsyncRead for UpStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            UpStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            UpStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpStream::Plain(s) => Pin::new(s).poll_flush(cx),
            UpStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            UpStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

type TlsRef<'a> = &'a mut TlsStream<TcpStream>;

/// The read half of an [`UpStream`].
pub enum UpRead<'a> {
    Plain(tokio::net::tcp::ReadHalf<'a>),
    Tls(tokio::io::ReadHalf<TlsRef<'a>>),
}

/// The write half of an [`UpStream`].
pub enum UpWrite<'a> {
    Plain(tokio::net::tcp::WriteHalf<'a>),
    Tls(tokio::io::WriteHalf<TlsRef<'a>>),
}

impl AsyncRead for UpRead<'_> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpRead::Plain(s) => Pin::new(s).poll_read(cx, buf),
            UpRead::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpWrite<'_> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpWrite::Plain(s) => Pin::new(s).poll_write(cx, buf),
            UpWrite::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpWrite::Plain(s) => Pin::new(s).poll_flush(cx),
            UpWrite::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpWrite::Plain(s) => Pin::new(s).poll_shutdown(cx),
            UpWrite::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
