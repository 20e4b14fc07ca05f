//! HTTPS client settings: `--tls-*`, `--insecure` and `--cacert` validated into one rustls `ClientConfig` (aws-lc-rs).

use crate::error::BenchError;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{
    ClientSessionMemoryCache, ClientSessionStore, Resumption, Tls12ClientSessionValue,
    Tls13ClientSessionValue, WebPkiServerVerifier,
};
use rustls::crypto::{aws_lc_rs, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// CA bundles tried, in order, when neither `--cacert` nor `--insecure` is given.
const SYSTEM_CA_FILES: [&str; 3] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// TLS session cache entries of each connection's client (it talks to one server).
const SESSION_CACHE: usize = 16;

/// The TLS flags as given (strings), for validation by [`TlsClient::new`].
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// `1.2` or `1.3`; both when None.
    pub version: Option<String>,
    /// Cipher suite names (rustls's, e.g. `TLS13_AES_128_GCM_SHA256`), comma-separated.
    pub ciphers: Option<String>,
    /// Key-exchange group names (e.g. `X25519`, `secp256r1`, `X25519MLKEM768`), comma-separated.
    pub groups: Option<String>,
    /// Skip certificate verification (signatures are still checked, so the cost stays real).
    pub insecure: bool,
    /// Trust these PEM certificates instead of the system's.
    pub cacert: Option<PathBuf>,
    /// Session resumption (tickets / session IDs) on.
    pub resume: bool,
    /// `--h2`: offer ALPN `h2` only (else `http/1.1`).
    pub h2: bool,
    /// `--h3`: offer ALPN `h3` only, TLS 1.3 only (QUIC's handshake).
    pub h3: bool,
    /// `--early-data`: send requests as 0-RTT data on resumed sessions.
    pub early_data: bool,
}

/// What the run asked of TLS, for the report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TlsSettings {
    /// Versions offered, e.g. `["TLSv1_3"]`.
    pub versions: Vec<String>,
    /// Cipher suites offered, in order.
    pub cipher_suites: Vec<String>,
    /// Key-exchange groups offered, in order.
    pub groups: Vec<String>,
    pub resumption: bool,
    /// `--early-data`: 0-RTT requests on resumed QUIC sessions.
    #[serde(default)]
    pub early_data: bool,
    /// Certificate verification: `insecure` (skipped), `cacert FILE` or `system`.
    pub verify: String,
}

/// A validated client configuration and the name the server is reached by.
#[derive(Debug, Clone)]
pub struct TlsClient {
    pub config: Arc<ClientConfig>,
    pub server_name: ServerName<'static>,
    pub settings: TlsSettings,
    /// The server certificate verifier `config` has (a QUIC connection wraps it to count full
    /// handshakes).
    verifier: Arc<dyn ServerCertVerifier>,
}

/// A verifier that counts the certificates it was asked to verify: a resumed TLS 1.3
/// handshake has none (the server sends no certificate), a full one has one. quinn does not
/// tell which kind a QUIC handshake was; this does.
#[derive(Debug)]
pub struct Counting {
    inner: Arc<dyn ServerCertVerifier>,
    /// Certificates verified so far.
    pub verified: AtomicU64,
}

impl ServerCertVerifier for Counting {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.verified.fetch_add(1, Ordering::Relaxed);
        self.inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }

    fn requires_raw_public_keys(&self) -> bool {
        self.inner.requires_raw_public_keys()
    }

    fn root_hint_subjects(&self) -> Option<&[rustls::DistinguishedName]> {
        self.inner.root_hint_subjects()
    }
}

fn flag(msg: impl Into<String>) -> BenchError {
    BenchError::Flag(msg.into())
}

/// Pick names out of `all` (case-insensitive), in the order given; unknown names are an error
/// that lists the known ones.
fn pick<T: Copy>(
    flag_name: &str,
    list: &str,
    all: &[T],
    name_of: impl Fn(&T) -> String,
) -> Result<Vec<T>, BenchError> {
    let mut out = Vec::new();
    for want in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let found = all
            .iter()
            .find(|x| name_of(x).eq_ignore_ascii_case(want))
            .ok_or_else(|| {
                let known: Vec<String> = all.iter().map(&name_of).collect();
                flag(format!(
                    "{flag_name} {want:?}: unknown; known: {}",
                    known.join(", ")
                ))
            })?;
        out.push(*found);
    }
    if out.is_empty() {
        return Err(flag(format!("{flag_name}: empty list")));
    }
    Ok(out)
}

/// The provider restricted to the given suites and groups.
pub fn provider(o: &TlsOptions) -> Result<CryptoProvider, BenchError> {
    let mut p = portico_tls::base_provider();
    if let Some(list) = &o.ciphers {
        p.cipher_suites = pick("--tls-ciphers", list, &p.cipher_suites, |s| {
            s.suite().as_str().unwrap_or("?").to_string()
        })?;
    }
    if let Some(list) = &o.groups {
        p.kx_groups = pick("--tls-groups", list, aws_lc_rs::ALL_KX_GROUPS, |g| {
            g.name().as_str().unwrap_or("?").to_string()
        })?;
    }
    Ok(p)
}

/// The versions `--tls-version` allows.
fn versions(v: Option<&str>) -> Result<Vec<&'static rustls::SupportedProtocolVersion>, BenchError> {
    Ok(match v.map(str::trim) {
        None => vec![&rustls::version::TLS13, &rustls::version::TLS12],
        Some("1.3") | Some("tls1.3") | Some("TLSv1.3") => vec![&rustls::version::TLS13],
        Some("1.2") | Some("tls1.2") | Some("TLSv1.2") => vec![&rustls::version::TLS12],
        Some(other) => return Err(flag(format!("--tls-version {other:?}: 1.2 or 1.3"))),
    })
}

fn load_roots(path: &Path) -> Result<rustls::RootCertStore, BenchError> {
    let file_err = |reason: String| BenchError::File {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, reason),
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_err(format!("cannot read certificates: {e}")))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_err(format!("bad PEM: {e}")))?;
    if certs.is_empty() {
        return Err(file_err("no certificate in the file".to_string()));
    }
    let mut roots = rustls::RootCertStore::empty();
    let (_, bad) = roots.add_parsable_certificates(certs);
    if roots.is_empty() {
        return Err(file_err(format!("{bad} certificate(s), none usable")));
    }
    Ok(roots)
}

impl TlsClient {
    /// Validate the options for a server reached as `host`.
    pub fn new(o: &TlsOptions, host: &str) -> Result<TlsClient, BenchError> {
        let provider = Arc::new(provider(o)?);
        let versions = match o.h3 {
            true if o.version.as_deref().is_some_and(|v| !v.contains('3')) => {
                return Err(flag("--h3 needs TLS 1.3 (QUIC's handshake is TLS 1.3)"))
            }
            true => vec![&rustls::version::TLS13],
            false => versions(o.version.as_deref())?,
        };
        // Every version needs a suite of its own.
        for v in &versions {
            if !provider
                .cipher_suites
                .iter()
                .any(|s| s.version().version == v.version)
            {
                return Err(flag(format!(
                    "--tls-ciphers: no cipher suite for {:?}",
                    v.version
                )));
            }
        }
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&versions)
            .map_err(|e| flag(format!("TLS settings: {e}")))?;
        if o.early_data && !(o.h3 && o.resume) {
            return Err(flag(
                "--early-data needs --h3 and --tls-resume on (0-RTT rides a resumed session)",
            ));
        }
        let (verifier, verify): (Arc<dyn ServerCertVerifier>, String) = if o.insecure {
            (
                Arc::new(portico_tls::NoVerification::new(provider.clone())),
                "insecure (certificate not verified)".to_string(),
            )
        } else {
            let (roots, what) = match &o.cacert {
                Some(p) => (load_roots(p)?, format!("cacert {}", p.display())),
                None => {
                    let path = SYSTEM_CA_FILES
                        .iter()
                        .map(Path::new)
                        .find(|p| p.exists())
                        .ok_or_else(|| {
                            flag("no system CA bundle found: give --cacert FILE or --insecure")
                        })?;
                    (load_roots(path)?, format!("system ({})", path.display()))
                }
            };
            let v = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| flag(format!("certificate verifier: {e}")))?;
            (v, what)
        };
        let mut config = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier.clone())
            .with_no_client_auth();
        config.enable_early_data = o.early_data;
        config.alpn_protocols = if o.h3 {
            vec![b"h3".to_vec()]
        } else if o.h2 {
            vec![b"h2".to_vec()]
        } else {
            vec![b"http/1.1".to_vec()]
        };
        config.resumption = if o.resume {
            Resumption::in_memory_sessions(SESSION_CACHE)
        } else {
            Resumption::disabled()
        };
        let server_name = ServerName::try_from(host.to_string())
            .map_err(|e| flag(format!("{host:?} is not a TLS server name: {e}")))?;
        let settings = TlsSettings {
            versions: versions
                .iter()
                .map(|v| format!("{:?}", v.version))
                .collect(),
            cipher_suites: provider
                .cipher_suites
                .iter()
                .map(|s| s.suite().as_str().unwrap_or("?").to_string())
                .collect(),
            groups: provider
                .kx_groups
                .iter()
                .map(|g| g.name().as_str().unwrap_or("?").to_string())
                .collect(),
            resumption: o.resume,
            early_data: o.early_data,
            verify,
        };
        Ok(TlsClient {
            config: Arc::new(config),
            server_name,
            settings,
            verifier,
        })
    }

    /// The configuration one connection uses: with resumption, a copy with a session cache of
    /// its own, so that each connection resumes its own previous session like a returning user.
    /// (One shared cache keeps at most 8 TLS 1.3 tickets per server in rustls: with more
    /// connections than that opening at once, the others would do full handshakes.)
    pub fn for_connection(&self) -> Arc<ClientConfig> {
        if !self.settings.resumption {
            return self.config.clone();
        }
        let mut c = (*self.config).clone();
        c.resumption = Resumption::in_memory_sessions(SESSION_CACHE);
        Arc::new(c)
    }

    /// [`TlsClient::for_connection`] for one QUIC benchmark connection, with a verifier of its
    /// own that counts full handshakes (its connections open one after another) and, with
    /// resumption, a session store that counts the tickets it got.
    pub fn for_quic(&self) -> (Arc<ClientConfig>, Arc<Counting>, Option<Arc<Tickets>>) {
        let mut c = (*self.for_connection()).clone();
        let counting = Arc::new(Counting {
            inner: self.verifier.clone(),
            verified: AtomicU64::new(0),
        });
        c.dangerous().set_certificate_verifier(counting.clone());
        let tickets = self.settings.resumption.then(|| {
            Arc::new(Tickets {
                inner: ClientSessionMemoryCache::new(SESSION_CACHE),
                received: AtomicU64::new(0),
                arrived: tokio::sync::Notify::new(),
            })
        });
        if let Some(t) = &tickets {
            c.resumption = Resumption::store(t.clone());
        }
        (Arc::new(c), counting, tickets)
    }
}

/// An in-memory session store that counts the TLS 1.3 tickets it was given: a QUIC connection
/// closed right after its response can wait for its ticket (a server may send it after the
/// response to 0-RTT requests).
#[derive(Debug)]
pub struct Tickets {
    inner: ClientSessionMemoryCache,
    received: AtomicU64,
    arrived: tokio::sync::Notify,
}

impl Tickets {
    /// Tickets received so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Wait until more than `seen` tickets were received, at most `limit`; whether they were.
    pub async fn wait_past(&self, seen: u64, limit: std::time::Duration) -> bool {
        let wait = async {
            loop {
                let arrived = self.arrived.notified();
                let mut arrived = std::pin::pin!(arrived);
                arrived.as_mut().enable();
                if self.received() > seen {
                    return;
                }
                arrived.await;
            }
        };
        tokio::time::timeout(limit, wait).await.is_ok()
    }
}

impl ClientSessionStore for Tickets {
    fn set_kx_hint(&self, server_name: ServerName<'static>, group: rustls::NamedGroup) {
        self.inner.set_kx_hint(server_name, group);
    }

    fn kx_hint(&self, server_name: &ServerName<'_>) -> Option<rustls::NamedGroup> {
        self.inner.kx_hint(server_name)
    }

    fn set_tls12_session(&self, server_name: ServerName<'static>, value: Tls12ClientSessionValue) {
        self.inner.set_tls12_session(server_name, value);
    }

    fn tls12_session(&self, server_name: &ServerName<'_>) -> Option<Tls12ClientSessionValue> {
        self.inner.tls12_session(server_name)
    }

    fn remove_tls12_session(&self, server_name: &ServerName<'static>) {
        self.inner.remove_tls12_session(server_name);
    }

    fn insert_tls13_ticket(
        &self,
        server_name: ServerName<'static>,
        value: Tls13ClientSessionValue,
    ) {
        self.inner.insert_tls13_ticket(server_name, value);
        self.received.fetch_add(1, Ordering::Relaxed);
        self.arrived.notify_waiters();
    }

    fn take_tls13_ticket(
        &self,
        server_name: &ServerName<'static>,
    ) -> Option<Tls13ClientSessionValue> {
        self.inner.take_tls13_ticket(server_name)
    }
}

/// Parse `on`/`off` (also `yes`/`no`, `true`/`false`, `1`/`0`).
pub fn parse_on_off(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "on" | "yes" | "true" | "1" => Ok(true),
        "off" | "no" | "false" | "0" => Ok(false),
        other => Err(format!("{other:?}: on or off")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> TlsOptions {
        TlsOptions {
            insecure: true,
            resume: true,
            ..TlsOptions::default()
        }
    }

    #[test]
    fn pinned_version_suites_and_groups() {
        let c = TlsClient::new(
            &TlsOptions {
                version: Some("1.3".into()),
                ciphers: Some("tls13_aes_128_gcm_sha256".into()),
                groups: Some("x25519, secp256r1".into()),
                resume: false,
                ..opts()
            },
            "localhost",
        )
        .unwrap();
        assert_eq!(c.settings.versions, ["TLSv1_3"]);
        assert_eq!(c.settings.cipher_suites, ["TLS13_AES_128_GCM_SHA256"]);
        assert_eq!(c.settings.groups, ["X25519", "secp256r1"]);
        assert!(!c.settings.resumption);
        assert!(c.settings.verify.starts_with("insecure"));
        assert_eq!(c.config.alpn_protocols, [b"http/1.1".to_vec()]);
        // An IP address is a server name too (no SNI is sent for it).
        assert!(TlsClient::new(&opts(), "127.0.0.1").is_ok());
        let h2 = TlsClient::new(&TlsOptions { h2: true, ..opts() }, "localhost").unwrap();
        assert_eq!(h2.config.alpn_protocols, [b"h2".to_vec()]);
    }

    #[test]
    fn bad_settings_name_the_flag() {
        let err = |o: TlsOptions| TlsClient::new(&o, "localhost").unwrap_err().to_string();
        let e = err(TlsOptions {
            groups: Some("x448".into()),
            ..opts()
        });
        assert!(
            e.contains("--tls-groups \"x448\"") && e.contains("X25519"),
            "{e}"
        );
        let e = err(TlsOptions {
            ciphers: Some("RC4".into()),
            ..opts()
        });
        assert!(e.contains("--tls-ciphers"), "{e}");
        let e = err(TlsOptions {
            version: Some("1.1".into()),
            ..opts()
        });
        assert!(e.contains("--tls-version"), "{e}");
        // TLS 1.2 only, with only TLS 1.3 suites: nothing to negotiate.
        let e = err(TlsOptions {
            version: Some("1.2".into()),
            ciphers: Some("TLS13_AES_256_GCM_SHA384".into()),
            ..opts()
        });
        assert!(e.contains("no cipher suite"), "{e}");
        let e = err(TlsOptions {
            insecure: false,
            cacert: Some("/nonexistent/ca.pem".into()),
            ..opts()
        });
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
    }

    #[test]
    fn on_off() {
        assert_eq!(parse_on_off("ON"), Ok(true));
        assert_eq!(parse_on_off("off"), Ok(false));
        assert!(parse_on_off("maybe").is_err());
    }
}
