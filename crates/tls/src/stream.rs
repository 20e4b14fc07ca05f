//! A byte stream that is plain TCP or TLS over TCP (server or client side), and its split halves: the one enum the proxy's client and upstream streams and the bench's connections share.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Plain TCP, or a TLS stream `T` over TCP (`tokio_rustls::server::TlsStream<Tcp>` for
/// accepted connections, `tokio_rustls::client::TlsStream<Tcp>` for connections made). The
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
    /// The client certificate verified during the handshake (mTLS), if any.
    pub fn client_cert(&self) -> Option<crate::ClientCert> {
        match self {
            MaybeTls::Plain(_) => None,
            MaybeTls::Tls(s) => crate::client_cert(s.get_ref().1.peer_certificates()?.first()?),
        }
    }

    /// The TLS version (`TLSv1.3`, as nginx's `$ssl_protocol`) and the server name the client
    /// sent (SNI), for a TLS connection.
    pub fn tls_info(&self) -> Option<(&'static str, Option<&str>)> {
        match self {
            MaybeTls::Plain(_) => None,
            MaybeTls::Tls(s) => {
                let c = s.get_ref().1;
                let version = match c.protocol_version() {
                    Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3",
                    Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2",
                    _ => "TLS",
                };
                Some((version, c.server_name()))
            }
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

    /// Forwarded, so writers that gather (the `h2` crate's frame head and payload) make one
    /// `writev` on plain sockets, and one rustls write for all the slices over TLS.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            MaybeTls::Plain(s) => s.is_write_vectored(),
            MaybeTls::Tls(s) => s.is_write_vectored(),
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

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTlsWrite::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            MaybeTlsWrite::Tls(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            MaybeTlsWrite::Plain(s) => s.is_write_vectored(),
            MaybeTlsWrite::Tls(s) => s.is_write_vectored(),
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

/// TCP under rustls. rustls hands its records to the socket as a gathered write; one record (a
/// keep-alive response, the usual case) then goes out as a `send` rather than a `writev`, which
/// costs the kernel less (1.3% of the CPU per HTTPS keep-alive request, docs/benchmarks.md).
#[derive(Debug)]
pub struct Tcp(pub TcpStream);

impl AsyncRead for Tcp {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tcp {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let s = &mut self.get_mut().0;
        match bufs {
            [one] => Pin::new(s).poll_write(cx, one),
            _ => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    type Accepted = MaybeTls<tokio_rustls::server::TlsStream<Tcp>>;
    type Connected = MaybeTls<tokio_rustls::client::TlsStream<Tcp>>;

    #[tokio::test]
    async fn plain_streams_read_write_split_and_see_the_peer_close() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut a = Connected::Plain(TcpStream::connect(l.local_addr().unwrap()).await.unwrap());
        let mut b = Accepted::Plain(l.accept().await.unwrap().0);
        assert!(!a.is_tls() && !a.resumed());
        assert_eq!(b.client_cert(), None);
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

    const SLICES: [&[u8]; 3] = [b"frame head|", b"payload|", b"more payload"];

    /// One vectored write takes every slice (a writer without the forwarding would take the
    /// first slice only), through the stream and through its write half.
    async fn vectored<W: AsyncWrite + Unpin>(w: &mut W) -> usize {
        assert!(w.is_write_vectored());
        let bufs: Vec<_> = SLICES.iter().map(|s| io::IoSlice::new(s)).collect();
        let n = w.write_vectored(&bufs).await.unwrap();
        w.flush().await.unwrap();
        n
    }

    fn expected() -> Vec<u8> {
        SLICES.concat()
    }

    #[tokio::test]
    async fn vectored_writes_go_through_plain_streams() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut a = Connected::Plain(TcpStream::connect(l.local_addr().unwrap()).await.unwrap());
        let mut b = l.accept().await.unwrap().0;
        let all = expected();
        assert_eq!(vectored(&mut a).await, all.len());
        assert_eq!(vectored(&mut a.split().1).await, all.len());
        let mut got = vec![0u8; all.len() * 2];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(got, [all.clone(), all].concat());
    }

    #[tokio::test]
    async fn tcp_under_rustls_writes_one_slice_or_all_of_them() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut a = Tcp(TcpStream::connect(l.local_addr().unwrap()).await.unwrap());
        let mut b = l.accept().await.unwrap().0;
        let n = a.write_vectored(&[io::IoSlice::new(b"one record")]).await;
        assert_eq!(n.unwrap(), 10);
        let all = expected();
        assert_eq!(vectored(&mut a).await, all.len());
        let mut got = vec![0u8; 10 + all.len()];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(got, [b"one record".to_vec(), all].concat());
    }

    #[tokio::test]
    async fn vectored_writes_go_through_tls_streams() {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls_pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
            )
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.der().clone()).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tcp = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let accept = async {
            let tcp = l.accept().await.unwrap().0;
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
            acceptor.accept(Tcp(tcp)).await.unwrap()
        };
        let connect = tokio_rustls::TlsConnector::from(Arc::new(client))
            .connect("localhost".try_into().unwrap(), Tcp(tcp));
        let (b, a) = tokio::join!(accept, connect);
        let mut a = Connected::Tls(Box::new(a.unwrap()));
        let mut b = Accepted::Tls(Box::new(b));
        let all = expected();
        assert_eq!(vectored(&mut a).await, all.len());
        assert_eq!(vectored(&mut a.split().1).await, all.len());
        assert_eq!(vectored(&mut b).await, all.len());
        let mut got = vec![0u8; all.len() * 2];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(got, [all.clone(), all.clone()].concat());
        let mut got = vec![0u8; all.len()];
        a.read_exact(&mut got).await.unwrap();
        assert_eq!(got, all);
    }
}
