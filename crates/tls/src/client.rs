//! TLS origination: the rustls client configuration of an upstream group (roots, server name, client certificate, resumption).

use crate::{load_certified_key, read_certificates, TlsError};
use portico_config::{TlsVersion, UpstreamTls};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ClientSessionMemoryCache, ClientSessionStore, ResolvesClientCert};
use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use std::net::SocketAddr;
use std::sync::Arc;

/// The client session store of one upstream group: TLS 1.3 tickets and TLS 1.2 sessions by
/// server name, shared by every worker through the group's configuration. rustls resumes a
/// session only under the certificate verifier and client certificate that made it, so a new
/// [`client_config`] cannot resume the sessions of an earlier one: to keep resuming across a
/// reload, keep the whole [`Origination`]. Cloning shares the store.
#[derive(Clone)]
pub struct ClientSessions {
    store: Option<Arc<dyn ClientSessionStore>>,
}

impl std::fmt::Debug for ClientSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientSessions")
    }
}

impl ClientSessions {
    /// A store of `size` entries; 0 = no resumption.
    pub fn new(size: usize) -> Self {
        ClientSessions {
            store: (size > 0).then(|| {
                Arc::new(ClientSessionMemoryCache::new(size)) as Arc<dyn ClientSessionStore>
            }),
        }
    }
}

/// The TLS client side of one upstream group, built once per configuration: the rustls
/// configuration shared by all workers and the name each server is verified against.
#[derive(Debug, Clone)]
pub struct Origination {
    pub config: Arc<rustls::ClientConfig>,
    /// The configured `server_name`; None = each server's IP address.
    name: Option<ServerName<'static>>,
}

impl Origination {
    /// The name sent as SNI (for DNS names) and that the certificate of the server at `addr`
    /// must be valid for: the configured `server_name`, else the server's IP address.
    pub fn server_name(&self, addr: SocketAddr) -> ServerName<'static> {
        match &self.name {
            Some(n) => n.clone(),
            None => ServerName::IpAddress(addr.ip().into()),
        }
    }
}

/// Build the client configuration of one upstream group: the roots (`ca_file`, else the
/// system's), versions, the client certificate (loaded and checked against its key now),
/// resumption through `sessions`, and ALPN `http/1.1`.
pub fn client_config(
    settings: &UpstreamTls,
    sessions: &ClientSessions,
) -> Result<Origination, TlsError> {
    let provider = crate::provider();
    let name = match &settings.server_name {
        None => None,
        Some(n) => {
            Some(ServerName::try_from(n.clone()).map_err(|_| TlsError::ServerName(n.clone()))?)
        }
    };
    let versions: Vec<&'static rustls::SupportedProtocolVersion> = settings
        .versions
        .iter()
        .map(|v| match v {
            TlsVersion::Tls12 => &rustls::version::TLS12,
            TlsVersion::Tls13 => &rustls::version::TLS13,
        })
        .collect();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)?;
    let builder = if settings.verify {
        builder.with_root_certificates(roots(settings)?)
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification::new(provider.clone())))
    };
    let mut config = match &settings.certificate {
        None => builder.with_no_client_auth(),
        Some(files) => builder
            .with_client_cert_resolver(Arc::new(ClientCert(load_certified_key(files, &provider)?))),
    };
    config.resumption = match &sessions.store {
        Some(store) => rustls::client::Resumption::store(store.clone()),
        None => rustls::client::Resumption::disabled(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Origination {
        config: Arc::new(config),
        name,
    })
}

/// As [`client_config`], offering ALPN `h2` only: for groups that speak HTTP/2 to their servers.
pub fn client_config_h2(
    settings: &UpstreamTls,
    sessions: &ClientSessions,
) -> Result<Origination, TlsError> {
    let mut o = client_config(settings, sessions)?;
    let mut config = (*o.config).clone();
    config.alpn_protocols = vec![b"h2".to_vec()];
    o.config = Arc::new(config);
    Ok(o)
}

/// The roots server certificates must chain to.
fn roots(settings: &UpstreamTls) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    match &settings.ca_file {
        Some(path) => {
            for ca in read_certificates(path)? {
                roots.add(ca).map_err(|e| TlsError::File {
                    path: path.display().to_string(),
                    message: format!("unusable CA certificate: {e}"),
                })?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                let why: Vec<String> = found.errors.iter().map(|e| e.to_string()).collect();
                return Err(TlsError::File {
                    path: "system root certificates (/etc/ssl/certs, or SSL_CERT_FILE / SSL_CERT_DIR)".into(),
                    message: format!(
                        "no usable root certificate found{}{}; install ca-certificates or set ca_file",
                        if why.is_empty() { "" } else { ": " },
                        why.join("; ")
                    ),
                });
            }
        }
    }
    Ok(roots)
}

/// The one client certificate of a group, presented whenever a server asks for one.
#[derive(Debug)]
struct ClientCert(Arc<CertifiedKey>);

impl ResolvesClientCert for ClientCert {
    fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// `verify = false` (and `portico bench --insecure`): any certificate is accepted, but the
/// handshake signatures are still checked with the provider's algorithms, so the session is bound
/// to the key the server presented (not to any identity) and a client does the same work as a
/// verifying one minus the chain.
#[derive(Debug)]
pub struct NoVerification(Arc<CryptoProvider>);

impl NoVerification {
    /// A verifier checking signatures with `provider`'s algorithms.
    pub fn new(provider: Arc<CryptoProvider>) -> Self {
        NoVerification(provider)
    }
}

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> UpstreamTls {
        UpstreamTls {
            ca_file: None,
            server_name: None,
            certificate: None,
            verify: true,
            versions: vec![TlsVersion::Tls12, TlsVersion::Tls13],
            session_cache: 16,
        }
    }

    #[test]
    fn system_roots_load_and_the_default_name_is_the_server_ip() {
        // scripts/test.sh installs ca-certificates, so the system store is not empty.
        let o = client_config(&settings(), &ClientSessions::new(16)).unwrap();
        assert_eq!(o.config.alpn_protocols, vec![b"http/1.1".to_vec()]);
        let h2 = client_config_h2(&settings(), &ClientSessions::new(16)).unwrap();
        assert_eq!(h2.config.alpn_protocols, vec![b"h2".to_vec()]);
        let addr: SocketAddr = "10.0.0.7:8443".parse().unwrap();
        assert_eq!(
            o.server_name(addr),
            ServerName::IpAddress("10.0.0.7".parse::<std::net::IpAddr>().unwrap().into())
        );
        let named = UpstreamTls {
            server_name: Some("api.internal".into()),
            ..settings()
        };
        let o = client_config(&named, &ClientSessions::new(0)).unwrap();
        assert_eq!(
            o.server_name(addr),
            ServerName::try_from("api.internal").unwrap()
        );
    }

    #[test]
    fn file_errors_name_the_file() {
        let missing = UpstreamTls {
            ca_file: Some("/nonexistent/portico-ca.pem".into()),
            ..settings()
        };
        let e = client_config(&missing, &ClientSessions::new(0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/portico-ca.pem"), "{e}");
        let bad_name = UpstreamTls {
            server_name: Some("not a name".into()),
            ..settings()
        };
        assert!(matches!(
            client_config(&bad_name, &ClientSessions::new(0)),
            Err(TlsError::ServerName(_))
        ));
    }
}
