//! ACME's part in TLS termination: TLS-ALPN-01 challenge certificates (RFC 8737) by name while their orders run, and the mark of the self-signed stand-in served before the first issuance.

use rustls::sign::CertifiedKey;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// The ALPN protocol of TLS-ALPN-01 validation handshakes.
pub const ALPN: &[u8] = b"acme-tls/1";

/// The common name of the self-signed certificate served until ACME issues one.
pub const STAND_IN_CN: &str = "Portico ACME stand-in";

/// Challenge certificates by (lowercase) name.
static CHALLENGES: RwLock<Option<HashMap<String, Arc<CertifiedKey>>>> = RwLock::new(None);

/// Answer `acme-tls/1` handshakes for `name` with `cert` (None: stop); see
/// [`crate::certified_key`].
pub fn set_challenge(name: &str, certified: Option<Arc<CertifiedKey>>) {
    let mut all = CHALLENGES.write().unwrap_or_else(|p| p.into_inner());
    let all = all.get_or_insert_with(HashMap::new);
    let name = name.to_ascii_lowercase();
    match certified {
        Some(c) => all.insert(name, c),
        None => all.remove(&name),
    };
}

/// The challenge certificate for `name` while its order runs.
pub(crate) fn challenge(name: &str) -> Option<Arc<CertifiedKey>> {
    let all = CHALLENGES.read().ok()?;
    all.as_ref()?.get(&name.to_ascii_lowercase()).cloned()
}

/// Whether `cert`'s leaf is the stand-in (self-signed, with [`STAND_IN_CN`] as its subject).
pub(crate) fn is_stand_in(cert: &CertifiedKey) -> bool {
    let Ok(der) = cert.end_entity_cert() else {
        return false;
    };
    let Ok((_, c)) = x509_parser::parse_x509_certificate(der) else {
        return false;
    };
    let cn = c.subject().iter_common_name().next();
    c.subject() == c.issuer() && cn.and_then(|n| n.as_str().ok()) == Some(STAND_IN_CN)
}
