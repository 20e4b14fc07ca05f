//! TLS termination: PEM certificates and keys, SNI selection, the rustls server configuration.

use portico_config::{CertificateFiles, TlsSettings, TlsVersion};
use rustls::crypto::{aws_lc_rs, CryptoProvider};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::path::Path;
use std::sync::Arc;

/// Why a listener's TLS configuration cannot be built; always names the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {message}")]
    File { path: String, message: String },
    #[error("TLS settings refused: {0}")]
    Rustls(#[from] rustls::Error),
}

fn file_error(path: &Path, message: impl Into<String>) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        message: message.into(),
    }
}

/// The crypto provider: aws-lc-rs, the fastest rustls provider on x86-64 for ECDSA P-256
/// handshakes and AES-GCM.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(aws_lc_rs::default_provider())
}

/// Build the server configuration of one listener: its certificates (loaded and checked now),
/// versions, and ALPN `http/1.1`.
pub fn server_config(settings: &TlsSettings) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = provider();
    let certs = settings
        .certificates
        .iter()
        .map(|c| load_certified_key(c, &provider))
        .collect::<Result<Vec<_>, _>>()?;
    let versions: Vec<&'static rustls::SupportedProtocolVersion> = settings
        .versions
        .iter()
        .map(|v| match v {
            TlsVersion::Tls12 => &rustls::version::TLS12,
            TlsVersion::Tls13 => &rustls::version::TLS13,
        })
        .collect();
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions)?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(SniResolver { certs }));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Load a PEM chain and its key, and check that the key belongs to the leaf certificate.
pub fn load_certified_key(
    files: &CertificateFiles,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = CertificateDer::pem_file_iter(&files.cert)
        .map_err(|e| file_error(&files.cert, format!("cannot read certificates: {e}")))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(&files.cert, format!("invalid PEM certificate: {e}")))?;
    if chain.is_empty() {
        return Err(file_error(&files.cert, "no CERTIFICATE block found"));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| file_error(&files.key, format!("cannot read a private key: {e}")))?;
    let signer = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| file_error(&files.key, format!("unsupported private key: {e}")))?;
    let certified = CertifiedKey::new(chain, signer);
    certified.keys_match().map_err(|_| {
        file_error(
            &files.key,
            format!(
                "this key does not match the certificate in {}",
                files.cert.display()
            ),
        )
    })?;
    Ok(Arc::new(certified))
}

/// Picks the first certificate valid for the SNI name; the first certificate otherwise.
#[derive(Debug)]
struct SniResolver {
    certs: Vec<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        if self.certs.len() > 1 {
            if let Some(name) = hello
                .server_name()
                .and_then(|n| ServerName::try_from(n).ok())
            {
                if let Some(found) = self.certs.iter().find(|c| valid_for(c, &name)) {
                    return Some(found.clone());
                }
            }
        }
        self.certs.first().cloned()
    }
}

fn valid_for(cert: &CertifiedKey, name: &ServerName<'_>) -> bool {
    cert.end_entity_cert()
        .ok()
        .and_then(|der| webpki::EndEntityCert::try_from(der).ok())
        .is_some_and(|ee| ee.verify_is_valid_for_subject_name(name).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn write_pair(dir: &Path, stem: &str, names: &[&str]) -> CertificateFiles {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let params =
            rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        let cert = params.self_signed(&key).unwrap();
        let files = CertificateFiles {
            cert: dir.join(format!("{stem}.pem")),
            key: dir.join(format!("{stem}.key")),
        };
        std::fs::write(&files.cert, cert.pem()).unwrap();
        std::fs::write(&files.key, key.serialize_pem()).unwrap();
        files
    }

    fn temp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("portico-tls-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn settings(certificates: Vec<CertificateFiles>) -> TlsSettings {
        TlsSettings {
            certificates,
            versions: vec![TlsVersion::Tls12, TlsVersion::Tls13],
        }
    }

    #[test]
    fn builds_with_matching_files() {
        let d = temp_dir("ok");
        let cfg = server_config(&settings(vec![write_pair(&d, "a", &["a.test"])])).unwrap();
        assert_eq!(cfg.alpn_protocols, vec![b"http/1.1".to_vec()]);
    }

    #[test]
    fn errors_name_the_file() {
        let d = temp_dir("err");
        let a = write_pair(&d, "a", &["a.test"]);
        let b = write_pair(&d, "b", &["b.test"]);
        let missing = CertificateFiles {
            cert: d.join("nope.pem"),
            key: a.key.clone(),
        };
        let e = server_config(&settings(vec![missing]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("nope.pem") && e.contains("cannot read"), "{e}");
        let mismatched = CertificateFiles {
            cert: a.cert.clone(),
            key: b.key.clone(),
        };
        let e = server_config(&settings(vec![mismatched]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("b.key") && e.contains("does not match"), "{e}");
        std::fs::write(d.join("junk.key"), "not a key").unwrap();
        let junk = CertificateFiles {
            cert: a.cert.clone(),
            key: d.join("junk.key"),
        };
        let e = server_config(&settings(vec![junk]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("junk.key"), "{e}");
    }

    #[test]
    fn sni_picks_the_certificate_valid_for_the_name() {
        let d = temp_dir("sni");
        let provider = provider();
        let a = load_certified_key(&write_pair(&d, "a", &["a.test"]), &provider).unwrap();
        let b = load_certified_key(&write_pair(&d, "b", &["*.b.test"]), &provider).unwrap();
        let name = |s: &str| ServerName::try_from(s.to_string()).unwrap();
        assert!(valid_for(&a, &name("a.test")));
        assert!(!valid_for(&a, &name("x.b.test")));
        assert!(valid_for(&b, &name("x.b.test")));
        assert!(!valid_for(&b, &name("b.test")));
    }
}
