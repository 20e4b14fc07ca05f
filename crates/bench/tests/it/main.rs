//! The bench crate's integration tests in one binary (one link instead of one per file), a module per concern.

mod bench;
mod h2;
mod h3;
mod https;

use portico_bench::{Config, Flags, Report};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// One benchmark run with `f`, which must be valid.
fn run(f: Flags) -> Report {
    let cfg = Config::from_flags(&f).expect("valid flags");
    portico_bench::run(&cfg, &mut |_| {}).expect("run")
}

/// A self-signed ECDSA P-256 certificate for `localhost`, its key, and its PEM (for --cacert).
fn cert() -> (CertificateDer<'static>, PrivateKeyDer<'static>, String) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    let c = params.self_signed(&key).unwrap();
    let pem = c.pem();
    (
        c.der().clone(),
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        pem,
    )
}
