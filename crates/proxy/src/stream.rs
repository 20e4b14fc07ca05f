//! The client side of a connection: plain TCP or TLS over TCP, behind one stream type.

use portico_tls::Tcp;
use tokio_rustls::server::TlsStream;

/// A downstream connection's byte stream (`ClientStream::Plain` or `ClientStream::Tls`), with
/// `is_tls` and `client_cert` (the verified mTLS client certificate).
pub type ClientStream = portico_tls::MaybeTls<TlsStream<Tcp>>;
