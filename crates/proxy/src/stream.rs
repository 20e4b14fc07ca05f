//! The client side of a connection: plain TCP or TLS over TCP, behind one stream type.

use portico_tls::Tcp;
use tokio_rustls::server::TlsStream;

/// A downstream connection's byte stream (`ClientStream::Plain` or `ClientStream::Tls`), with
/// `is_tls` and `client_cert` (the verified mTLS client certificate).
pub type ClientStream = portico_tls::MaybeTls<TlsStream<Tcp>>;

/// The address the client connected to (a system call: asked only where needed).
pub fn local_addr(s: &ClientStream) -> Option<std::net::SocketAddr> {
    match s {
        portico_tls::MaybeTls::Plain(t) => t.local_addr().ok(),
        portico_tls::MaybeTls::Tls(t) => t.get_ref().0 .0.local_addr().ok(),
    }
}
