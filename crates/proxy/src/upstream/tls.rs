//! TLS origination: the upstream byte stream (plain TCP or TLS), each group's connector, the handshake.

use crate::error::ProxyError;
use portico_config::UpstreamTls;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
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
        match self.connector.connect(name, portico_tls::Tcp(tcp)).await {
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

/// An upstream connection's byte stream (`UpStream::Plain` or `UpStream::Tls`), with
/// `try_write`, `resumed`, `split` and `is_idle_alive`.
pub type UpStream = portico_tls::MaybeTls<TlsStream<portico_tls::Tcp>>;
