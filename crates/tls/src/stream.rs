//! A byte stream that is plain TCP or TLS over TCP (server or client side), and its split halves: the one enum the proxy's client and upstream streams and the bench's connections share.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Plain TCP, or a TLS stream `T` over TCP (`tokio_rustls::server::TlsStream<TcpStream>` for
/// accepted connections, `tokio_rustls::client::TlsStream<TcpStream>` for connections made). The
/// TLS stream is boxed: it is large, and plain connections should not pay for its size.
/// Generic, so each use compiles to the same code a dedicated enum would.
#[derive(Debug)]
pub enum MaybeTls<T> {
    Plain(TcpStream),
    Tls(Box<T>),
}

impl<T> MaybeTls<T> {
    pub fn is_tls(&self) -> bool {
        matches!(self, MaybeTls::Tls(_))
    }

    /// Write without waiting: plain sockets write what fits now; TLS writes nothing here (its
    /// records go through `write_all` and `flush`), so the caller's slow path handles it.
    pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        match self {
            MaybeTls::Plain(s) => s.try_write(buf),
            MaybeTls::Tls(_) => Ok(0),
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> MaybeTls<T> {
    /// Read and write halves usable at the same time in one task.
    pub fn split(&mut self) -> (MaybeTlsRead<'_, T>, MaybeTlsWrite<'_, T>) {
        match self {
            MaybeTls::Plain(s) => {
                let (r, w) = s.split();
                (MaybeTlsRead::Plain(r), MaybeTlsWrite::Plain(w))
            }
            MaybeTls::Tls(s) => {
                let (r, w) = tokio::io::split(s.as_mut());
                (MaybeTlsRead::Tls(r), MaybeTlsWrite::Tls(w))
            }
        }
    }

    /// An idle connection must have nothing to read: data means a protocol error, EOF means
    /// closed. Answers from tokio's cached readiness without a syscall when nothing was
    /// signalled. A TLS connection is read through rustls, which consumes records that carry no
    /// data (a late session ticket) and reports a close_notify as EOF.
    pub fn is_idle_alive(&mut self) -> bool {
        let mut probe = [0u8; 1];
        match self {
            MaybeTls::Plain(s) => {
                matches!(s.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
            MaybeTls::Tls(s) => {
                let mut buf = ReadBuf::new(&mut probe);
                let mut cx = Context::from_waker(Waker::noop());
                Pin::new(s.as_mut())
                    .poll_read(&mut cx, &mut buf)
                    .is_pending()
            }
        }
    }
}

impl<IO> MaybeTls<tokio_rustls::server::TlsStream<IO>> {
    /// The subject of the client certificate verified during the handshake (mTLS), if any.
    pub fn client_cert_subject(&self) -> Option<String> {
        match self {
            MaybeTls::Plain(_) => None,
            MaybeTls::Tls(s) => crate::client_subject(s.get_ref().1.peer_certificates()?.first()?),
        }
    }
}

impl<IO> MaybeTls<tokio_rustls::client::TlsStream<IO>> {
    /// Whether the connection has completed a resumed TLS handshake.
    pub fn resumed(&self) -> bool {
        match self {
            MaybeTls::Plain(_) => false,
            MaybeTls::Tls(s) => {
                s.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed)
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for MaybeTls<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_read(cx, buf),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for MaybeTls<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_write(cx, buf),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_flush(cx),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_shutdown(cx),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The read half of a [`MaybeTls`] (see [`MaybeTls::split`]).
pub enum MaybeTlsRead<'a, T> {
    Plain(tokio::net::tcp::ReadHalf<'a>),
    Tls(tokio::io::ReadHalf<&'a mut T>),
}

/// The write half of a [`MaybeTls`] (see [`MaybeTls::split`]).
pub enum MaybeTlsWrite<'a, T> {
    Plain(tokio::net::tcp::WriteHalf<'a>),
    Tls(tokio::io::WriteHalf<&'a mut T>),
}

impl<T: AsyncRead + Unpin> AsyncRead for MaybeTlsRead<'_, T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTlsRead::Plain(s) => Pin::new(s).poll_read(cx, buf),
            MaybeTlsRead::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for MaybeTlsWrite<'_, T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTlsWrite::Plain(s) => Pin::new(s).poll_write(cx, buf),
            MaybeTlsWrite::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTlsWrite::Plain(s) => Pin::new(s).poll_flush(cx),
            MaybeTlsWrite::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTlsWrite::Plain(s) => Pin::new(s).poll_shutdown(cx),
            MaybeTlsWrite::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    type Accepted = MaybeTls<tokio_rustls::server::TlsStream<TcpStream>>;
    type Connected = MaybeTls<tokio_rustls::client::TlsStream<TcpStream>>;

    #[tokio::test]
    async fn plain_streams_read_write_split_and_see_the_peer_close() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut a = Connected::Plain(TcpStream::connect(l.local_addr().unwrap()).await.unwrap());
        let mut b = Accepted::Plain(l.accept().await.unwrap().0);
        assert!(!a.is_tls() && !a.resumed());
        assert_eq!(b.client_cert_subject(), None);
        assert!(a.is_idle_alive(), "nothing to read, not closed");

        assert_eq!(a.try_write(b"ping").unwrap(), 4);
        let mut got = [0u8; 4];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        {
            let (mut r, mut w) = b.split();
            w.write_all(b"pong").await.unwrap();
            a.write_all(b"more").await.unwrap();
            r.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"more");
        }
        a.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"pong");

        b.shutdown().await.unwrap();
        drop(b);
        if let MaybeTls::Plain(s) = &a {
            s.readable().await.unwrap();
        }
        assert!(!a.is_idle_alive(), "the peer closed");
    }
}
