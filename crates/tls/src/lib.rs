//! TLS settings -> rustls: listener server configurations (PEM files, SNI, resumption, mTLS) and upstream client configurations (`client`).

pub mod acme;

use portico_config::{CertificateFiles, ClientAuth, TlsSettings, TlsVersion, UpstreamTls};
use rustls::crypto::{aws_lc_rs, ring, CryptoProvider};
use rustls::server::{
    ClientHello, NoServerSessionStorage, ProducesTickets, ResolvesServerCert,
    ServerSessionMemoryCache, StoresServerSessions, WebPkiClientVerifier,
};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Why a listener's TLS configuration cannot be built; always names the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {message}")]
    File { path: String, message: String },
    #[error("TLS settings refused: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("server_name {0:?} is not a valid DNS name or IP address")]
    ServerName(String),
}

mod client;
pub use client::{client_config, client_config_h2, ClientSessions, NoVerification, Origination};
mod stream;
pub use stream::{MaybeTls, MaybeTlsRead, MaybeTlsWrite, Tcp};

fn file_error(path: &Path, message: impl Into<String>) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        message: message.into(),
    }
}

/// The crypto provider: aws-lc-rs's key exchange, signatures and randomness with ring's cipher
/// suites (their AEADs for records, their hash for the handshake's HKDF). Measured with
/// `examples/providers.rs` (docs/benchmarks.md, "Crypto provider"): on x86-64 the mix costs
/// the server about 20% less per TLS 1.3 handshake than either provider alone, and ring's
/// AES-GCM seals records 31-40% and opens them 16-34% faster than aws-lc-rs's.
pub fn base_provider() -> CryptoProvider {
    CryptoProvider {
        cipher_suites: ring::default_provider().cipher_suites,
        ..aws_lc_rs::default_provider()
    }
}

/// [`base_provider`], shared.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(base_provider())
}

/// Make [`base_provider`] the process's default rustls provider. Portico builds every
/// configuration with an explicit provider; with both of rustls's provider features on, no
/// default could be picked, so a future `ClientConfig::builder()` anywhere would panic instead
/// of using this one. Idempotent.
pub fn install_default_provider() {
    let _ = base_provider().install_default();
}

/// The provider restricted to the listener's cipher suites and key-exchange groups, in the
/// configured order (the provider's defaults where the listener names none).
fn listener_provider(settings: &TlsSettings) -> CryptoProvider {
    let mut provider = base_provider();
    if let Some(names) = &settings.cipher_suites {
        let all = provider.cipher_suites;
        provider.cipher_suites = names
            .iter()
            .filter_map(|n| all.iter().find(|s| s.suite().as_str() == Some(*n)).copied())
            .collect();
    }
    if let Some(names) = &settings.groups {
        let all = aws_lc_rs::ALL_KX_GROUPS;
        provider.kx_groups = names
            .iter()
            .filter_map(|n| all.iter().find(|g| g.name().as_str() == Some(*n)).copied())
            .collect();
    }
    provider
}

/// Session resumption state of one listener: the ticket key rotator and the server-side session
/// cache. Create one per listener and pass it to every [`server_config`] built for that listener,
/// so a rebuilt configuration (a reload) keeps resuming the sessions of the previous one. Cloning
/// shares the state.
#[derive(Clone, Default)]
pub struct Resumption {
    inner: Arc<Mutex<ResumptionState>>,
}

#[derive(Default)]
struct ResumptionState {
    /// Created on first use and kept: rotates its keys every 6 hours, accepting the previous key.
    ticketer: Option<Arc<dyn ProducesTickets>>,
    /// Kept while the configured size stays the same.
    cache: Option<(usize, Arc<ServerSessionMemoryCache>)>,
}

impl std::fmt::Debug for Resumption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Resumption")
    }
}

/// The ticketer (None when tickets are off) and the session storage of one configuration.
type ResumptionParts = (
    Option<Arc<dyn ProducesTickets>>,
    Arc<dyn StoresServerSessions>,
);

impl Resumption {
    pub fn new() -> Self {
        Self::default()
    }

    /// The ticketer (None when tickets are off) and session storage for `settings`.
    fn parts(&self, settings: &TlsSettings) -> Result<ResumptionParts, TlsError> {
        let mut state = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let ticketer = if settings.session_tickets {
            if state.ticketer.is_none() {
                state.ticketer = Some(aws_lc_rs::Ticketer::new()?);
            }
            state.ticketer.clone()
        } else {
            None
        };
        let storage: Arc<dyn StoresServerSessions> = match settings.session_cache {
            0 => Arc::new(NoServerSessionStorage {}),
            n => match &state.cache {
                Some((size, cache)) if *size == n => cache.clone(),
                _ => {
                    let cache = ServerSessionMemoryCache::new(n);
                    state.cache = Some((n, cache.clone()));
                    cache
                }
            },
        };
        Ok((ticketer, storage))
    }
}

/// Build the server configuration of one listener: its certificates (loaded and checked now),
/// versions, cipher suites, groups, client certificate verification, resumption (from
/// `resumption`, shared with earlier configurations of the same listener), and ALPN `http/1.1`.
/// The result is one `Arc` shared by all workers.
pub fn server_config(
    settings: &TlsSettings,
    resumption: &Resumption,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(listener_provider(settings));
    let mut certs = settings
        .certificates
        .iter()
        .map(|c| load_certified_key(c, &provider))
        .collect::<Result<Vec<_>, _>>()?;
    if settings.refuse_stand_in {
        // No certificate left: every handshake fails until ACME issues one.
        certs.retain(|c| !acme::is_stand_in(c));
    }
    let versions: Vec<&'static rustls::SupportedProtocolVersion> = settings
        .versions
        .iter()
        .map(|v| match v {
            TlsVersion::Tls12 => &rustls::version::TLS12,
            TlsVersion::Tls13 => &rustls::version::TLS13,
        })
        .collect();
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)?;
    let builder = match &settings.client_auth {
        None => builder.with_no_client_auth(),
        Some(auth) => builder.with_client_cert_verifier(client_verifier(auth, provider)?),
    };
    let acme_alpn = settings.acme_alpn;
    let mut config = builder.with_cert_resolver(Arc::new(SniResolver { certs, acme_alpn }));
    // A configured `cipher_suites` list is the server's preference order; without one, the
    // client's order wins (clients without AES hardware put ChaCha20 first).
    config.ignore_client_order = settings.cipher_suites.is_some();
    let (ticketer, storage) = resumption.parts(settings)?;
    match ticketer {
        Some(t) => config.ticketer = t,
        // Without tickets, TLS 1.3 resumes through the cache (stateful tickets); with neither,
        // sending tickets would be useless.
        None if settings.session_cache == 0 => config.send_tls13_tickets = 0,
        None => {}
    }
    config.session_storage = storage;
    // `h2` is added by `with_alpn` for listeners that serve HTTP/2.
    config.alpn_protocols = alpn_protocols(false);
    if acme_alpn {
        config.alpn_protocols.push(acme::ALPN.to_vec());
    }
    Ok(Arc::new(config))
}

/// The ALPN protocols a listener offers, in preference order: `h2` before `http/1.1` when it
/// serves HTTP/2.
pub fn alpn_protocols(http2: bool) -> Vec<Vec<u8>> {
    if http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    }
}

/// `config` with the ALPN list of [`alpn_protocols`] (a copy when it changes), `acme-tls/1`
/// kept last where the listener answers TLS-ALPN-01 challenges.
pub fn with_alpn(config: Arc<rustls::ServerConfig>, http2: bool) -> Arc<rustls::ServerConfig> {
    let mut alpn = alpn_protocols(http2);
    if config.alpn_protocols.iter().any(|p| p == acme::ALPN) {
        alpn.push(acme::ALPN.to_vec());
    }
    if config.alpn_protocols == alpn {
        return config;
    }
    let mut c = (*config).clone();
    c.alpn_protocols = alpn;
    Arc::new(c)
}

/// The mTLS verifier: client certificates must chain to a CA of `auth.ca`.
fn client_verifier(
    auth: &ClientAuth,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let cas = read_certificates(&auth.ca)?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in cas {
        roots
            .add(ca)
            .map_err(|e| file_error(&auth.ca, format!("unusable CA certificate: {e}")))?;
    }
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
    let builder = if auth.required {
        builder
    } else {
        builder.allow_unauthenticated()
    };
    builder
        .build()
        .map_err(|e| file_error(&auth.ca, format!("cannot verify clients with it: {e}")))
}

/// Every CERTIFICATE block of a PEM file (at least one).
pub(crate) fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(path, format!("cannot read certificates: {e}")))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, format!("invalid PEM certificate: {e}")))?;
    if certs.is_empty() {
        return Err(file_error(path, "no CERTIFICATE block found"));
    }
    Ok(certs)
}

/// Load a PEM chain and its key, and check that the key belongs to the leaf certificate.
pub fn load_certified_key(
    files: &CertificateFiles,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = read_certificates(&files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| file_error(&files.key, format!("cannot read a private key: {e}")))?;
    let signer = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| {
            file_error(
                &files.key,
                format!("unsupported private key (use ECDSA P-256/P-384/P-521, RSA of 2048 bits or more, or Ed25519): {e}"),
            )
        })?;
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

/// Picks the first certificate valid for the SNI name; the first certificate otherwise. An
/// `acme-tls/1` handshake gets the name's challenge certificate, or nothing.
#[derive(Debug)]
struct SniResolver {
    certs: Vec<Arc<CertifiedKey>>,
    /// Answer TLS-ALPN-01 challenges.
    acme_alpn: bool,
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        // A validation offers `acme-tls/1` alone (RFC 8737 3); a client offering it among
        // others is served as any client.
        let mut alpn = hello.alpn().into_iter().flatten();
        if alpn.next() == Some(acme::ALPN) && alpn.next().is_none() {
            let name = hello.server_name().filter(|_| self.acme_alpn)?;
            return acme::challenge(name);
        }
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

/// A chain and its PKCS#8 key as a certificate to serve, signed through [`provider`] (an ACME
/// TLS-ALPN-01 challenge's, for [`acme::set_challenge`]).
pub fn certified_key(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<CertifiedKey>, String> {
    let signer = provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| format!("unusable key: {e}"))?;
    Ok(Arc::new(CertifiedKey::new(chain, signer)))
}
/// What a certificate file holds: read for ACME's schedule, its visibility and `portico check`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCertificate {
    /// The issuer as an RFC 4514 string.
    pub issuer: String,
    pub not_before: std::time::SystemTime,
    pub not_after: std::time::SystemTime,
    /// ACME's self-signed stand-in ([`acme::STAND_IN_CN`]), not an issued certificate.
    pub stand_in: bool,
    /// What identifies the certificate to its CA (RFC 9773): the authority key identifier's
    /// key identifier and the DER serial number.
    pub authority_key_id: Option<Vec<u8>>,
    pub serial: Vec<u8>,
}

/// The first certificate of the PEM file at `path`; None when it cannot be read or parsed.
pub fn stored_certificate(path: &Path) -> Option<StoredCertificate> {
    use x509_parser::extensions::ParsedExtension;
    let pem = std::fs::read(path).ok()?;
    let (_, p) = x509_parser::pem::parse_x509_pem(&pem).ok()?;
    let cert = p.parse_x509().ok()?;
    let at = |t: i64| {
        let secs = u64::try_from(t).ok()?;
        Some(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
    };
    let v = cert.validity();
    let cn = cert.subject().iter_common_name().next();
    let authority_key_id = cert
        .iter_extensions()
        .find_map(|e| match e.parsed_extension() {
            ParsedExtension::AuthorityKeyIdentifier(a) => {
                a.key_identifier.as_ref().map(|k| k.0.to_vec())
            }
            _ => None,
        });
    Some(StoredCertificate {
        issuer: dn(cert.issuer()),
        not_before: at(v.not_before.timestamp())?,
        not_after: at(v.not_after.timestamp())?,
        stand_in: cert.subject() == cert.issuer()
            && cn.and_then(|n| n.as_str().ok()) == Some(acme::STAND_IN_CN),
        authority_key_id,
        serial: cert.tbs_certificate.raw_serial().to_vec(),
    })
}

/// Warn this long before a certificate expires.
pub const EXPIRY_WARNING: Duration = Duration::from_secs(30 * 24 * 3600);

/// Warnings about the listener's certificates at time `now`, each naming the file and the date:
/// a certificate (leaf or chain, or a client CA) that has expired, is not valid yet, or expires
/// within [`EXPIRY_WARNING`]. Files that cannot be read are left to [`server_config`]'s errors.
pub fn certificate_warnings(settings: &TlsSettings, now: SystemTime) -> Vec<String> {
    let files = settings
        .certificates
        .iter()
        .map(|c| (&c.cert, "certificate"))
        .chain(
            settings
                .client_auth
                .iter()
                .map(|a| (&a.ca, "CA certificate")),
        );
    file_warnings(files, now)
}

/// A listener certificate's end-entity facts: its file, subject and the end of its validity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateDates {
    pub file: PathBuf,
    pub subject: String,
    /// Unix seconds.
    pub not_after: i64,
}

/// The first (end-entity) certificate of each of the listener's certificate files, read now
/// (files that cannot be read or parsed are left out: [`certificate_warnings`] and
/// [`server_config`] report them).
pub fn certificate_dates(settings: &TlsSettings) -> Vec<CertificateDates> {
    settings
        .certificates
        .iter()
        .filter_map(|c| {
            let certs = read_certificates(&c.cert).ok()?;
            let (_, cert) = x509_parser::parse_x509_certificate(certs.first()?).ok()?;
            Some(CertificateDates {
                file: c.cert.clone(),
                subject: dn(cert.subject()),
                not_after: cert.validity().not_after.timestamp(),
            })
        })
        .collect()
}

/// `YYYY-MM-DD HH:MM:SS UTC` of a Unix time.
pub fn utc_date(t: i64) -> String {
    utc(t)
}

/// Warnings about an upstream group's CA file and client certificate at time `now`, as
/// [`certificate_warnings`] does for a listener.
pub fn upstream_certificate_warnings(settings: &UpstreamTls, now: SystemTime) -> Vec<String> {
    let files = settings
        .ca_file
        .iter()
        .map(|p| (p, "CA certificate"))
        .chain(
            settings
                .certificate
                .iter()
                .map(|c| (&c.cert, "client certificate")),
        );
    file_warnings(files, now)
}

fn file_warnings<'a>(
    files: impl Iterator<Item = (&'a PathBuf, &'static str)>,
    now: SystemTime,
) -> Vec<String> {
    let now = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let soon = EXPIRY_WARNING.as_secs() as i64;
    let mut out = Vec::new();
    for (path, what) in files {
        let Ok(certs) = read_certificates(path) else {
            continue;
        };
        for (i, der) in certs.iter().enumerate() {
            let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
                out.push(format!(
                    "{}: {what} {} cannot be parsed as X.509",
                    path.display(),
                    i + 1
                ));
                continue;
            };
            let which = if certs.len() > 1 {
                format!("{what} {} ({})", i + 1, dn(cert.subject()))
            } else {
                format!("{what} ({})", dn(cert.subject()))
            };
            let (from, until) = (
                cert.validity().not_before.timestamp(),
                cert.validity().not_after.timestamp(),
            );
            let message = if until < now {
                format!("expired on {}", utc(until))
            } else if from > now {
                format!("is not valid before {}", utc(from))
            } else if until - now < soon {
                format!(
                    "expires on {} (in {} days)",
                    utc(until),
                    (until - now) / 86_400
                )
            } else {
                continue;
            };
            out.push(format!("{}: {which} {message}", path.display()));
        }
    }
    out
}

/// A verified client certificate's subject as an RFC 4514 string (`CN=alice,O=Example`, most
/// specific first), printable ASCII only (anything else hex-escaped), for a request header.
pub fn client_subject(der: &CertificateDer<'_>) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    Some(dn(cert.subject()))
}

/// What routes may check of a verified client certificate (mTLS), read once per connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    /// The subject and the issuer as RFC 4514 strings (see [`client_subject`]).
    pub subject: String,
    pub issuer: String,
    /// The subject alternative names: `DNS:name`, `IP:address`, `email:address`, `URI:uri`
    /// (printable ASCII only; names of other kinds are left out).
    pub sans: Vec<String>,
}

/// The subject, issuer and alternative names of a verified client certificate.
pub fn client_cert(der: &CertificateDer<'_>) -> Option<ClientCert> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let mut sans = Vec::new();
    if let Ok(Some(ext)) = cert.subject_alternative_name() {
        for name in &ext.value.general_names {
            let text = match name {
                GeneralName::DNSName(n) => format!("DNS:{n}"),
                GeneralName::RFC822Name(n) => format!("email:{n}"),
                GeneralName::URI(n) => format!("URI:{n}"),
                GeneralName::IPAddress(b) => match b.len() {
                    4 => format!(
                        "IP:{}",
                        std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*b).ok()?)
                    ),
                    16 => format!(
                        "IP:{}",
                        std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*b).ok()?)
                    ),
                    _ => continue,
                },
                _ => continue,
            };
            if text.bytes().all(|b| (0x21..0x7f).contains(&b)) {
                sans.push(text);
            }
        }
    }
    Some(ClientCert {
        subject: dn(cert.subject()),
        issuer: dn(cert.issuer()),
        sans,
    })
}

fn dn(name: &x509_parser::x509::X509Name<'_>) -> String {
    let registry = x509_parser::objects::oid_registry();
    let mut out = String::new();
    let rdns: Vec<_> = name.iter_rdn().collect();
    for (i, rdn) in rdns.iter().rev().enumerate() {
        if i > 0 {
            out.push(',');
        }
        for (j, attr) in rdn.iter().enumerate() {
            if j > 0 {
                out.push('+');
            }
            match x509_parser::objects::oid2abbrev(attr.attr_type(), registry) {
                Ok(abbrev) => out.push_str(abbrev),
                Err(_) => out.push_str(&attr.attr_type().to_id_string()),
            }
            out.push('=');
            match attr.as_str() {
                Ok(value) => escape_dn_value(&mut out, value),
                Err(_) => {
                    // Not a string: `#` and the hex of its DER encoding (RFC 4514 2.4).
                    out.push('#');
                    use x509_parser::asn1_rs::ToDer;
                    for b in attr.attr_value().to_der_vec().unwrap_or_default() {
                        out.push_str(&format!("{b:02x}"));
                    }
                }
            }
        }
    }
    out
}

/// RFC 4514 2.4 escaping, plus `\HH` for every byte outside printable ASCII so the value is a
/// safe header field value.
fn escape_dn_value(out: &mut String, value: &str) {
    let last = value.len().saturating_sub(1);
    for (i, b) in value.bytes().enumerate() {
        let special = matches!(b, b'"' | b'+' | b',' | b';' | b'<' | b'>' | b'\\')
            || (i == 0 && matches!(b, b'#' | b' '))
            || (i == last && b == b' ');
        if !(0x20..0x7f).contains(&b) {
            out.push_str(&format!("\\{b:02x}"));
        } else if special {
            out.push('\\');
            out.push(b as char);
        } else {
            out.push(b as char);
        }
    }
}

/// `YYYY-MM-DD HH:MM:SS UTC` of a Unix time.
fn utc(t: i64) -> String {
    let (days, secs) = (t.div_euclid(86_400), t.rem_euclid(86_400));
    let (year, month, day) = portico_http1::calendar::civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

#[cfg(test)]
mod handshakes;

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn the_installed_default_is_the_mix_so_implicit_builders_work() {
        install_default_provider();
        install_default_provider();
        let p = CryptoProvider::get_default().expect("a process default");
        let names = |p: &CryptoProvider| format!("{:?} {:?}", p.cipher_suites, p.kx_groups);
        assert_eq!(names(p), names(&base_provider()));
        // Would panic with both provider features on and no default installed.
        let _ = rustls::ClientConfig::builder()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
    }

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
            cipher_suites: None,
            groups: None,
            session_tickets: true,
            session_cache: portico_config::DEFAULT_SESSION_CACHE,
            client_auth: None,
            watch: None,
            acme_alpn: false,
            refuse_stand_in: false,
        }
    }

    #[test]
    fn builds_with_matching_files() {
        let d = temp_dir("ok");
        let cfg = server_config(
            &settings(vec![write_pair(&d, "a", &["a.test"])]),
            &Resumption::new(),
        )
        .unwrap();
        assert_eq!(cfg.alpn_protocols, vec![b"http/1.1".to_vec()]);
        // HTTP/2 listeners offer h2 first; the shared config is copied only when it changes.
        let h2 = with_alpn(cfg.clone(), true);
        assert_eq!(
            h2.alpn_protocols,
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );
        assert!(Arc::ptr_eq(&with_alpn(cfg.clone(), false), &cfg));
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
        let e = server_config(&settings(vec![missing]), &Resumption::new())
            .unwrap_err()
            .to_string();
        assert!(e.contains("nope.pem") && e.contains("cannot read"), "{e}");
        let mismatched = CertificateFiles {
            cert: a.cert.clone(),
            key: b.key.clone(),
        };
        let e = server_config(&settings(vec![mismatched]), &Resumption::new())
            .unwrap_err()
            .to_string();
        assert!(e.contains("b.key") && e.contains("does not match"), "{e}");
        std::fs::write(d.join("junk.key"), "not a key").unwrap();
        let junk = CertificateFiles {
            cert: a.cert.clone(),
            key: d.join("junk.key"),
        };
        let e = server_config(&settings(vec![junk]), &Resumption::new())
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
