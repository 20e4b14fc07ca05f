//! Server-side CPU of rustls's crypto providers (aws-lc-rs, ring, and Portico's mix of the two): full and resumed TLS 1.3 handshakes with an ECDSA P-256 certificate and X25519, and 1 KiB and 16 KiB records, in memory.
//
// ```sh
// taskset -c 1 cargo run --release -p portico-tls --example providers -- [ROUNDS]
// ```
//
// Client and server talk through memory buffers in one thread; only the server's calls are
// timed (the client's share is excluded), so each figure is what one connection or one record
// costs the proxy. Providers alternate within each round so that a noisy machine hurts all
// alike; the report gives each round and the median.

use rustls::client::Resumption;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::server::ServerSessionMemoryCache;
use rustls::{ClientConfig, ClientConnection, ServerConfig, ServerConnection};
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

const HANDSHAKES: u32 = 2_000;
const RECORDS: u32 = 50_000;
/// A 1 KiB response and a full-size record (bulk transfers).
const SIZES: [usize; 2] = [1024, 16 * 1024];

type MakeProvider = fn() -> CryptoProvider;

/// What one round measured for one provider, per operation.
#[derive(Clone, Copy, Default)]
struct Figures {
    full: Duration,
    resumed: Duration,
    /// Per record, for each of `SIZES`.
    seal: [Duration; 2],
    open: [Duration; 2],
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .map(|r| r.parse().expect("ROUNDS must be a number"))
        .unwrap_or(5);
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
        .expect("params")
        .self_signed(&key)
        .expect("certificate");
    let chain = vec![cert.der().clone()];
    let pkcs8 = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let providers: [(&str, MakeProvider); 3] = [
        ("aws-lc-rs", rustls::crypto::aws_lc_rs::default_provider),
        ("ring", rustls::crypto::ring::default_provider),
        // aws-lc-rs's key exchange and signatures, ring's cipher suites.
        ("portico", portico_tls::base_provider),
    ];
    let mut all: Vec<Vec<Figures>> = vec![Vec::new(); providers.len()];
    for round in 0..rounds {
        for (i, (name, make)) in providers.iter().enumerate() {
            let f = measure(pinned(make()), &chain, &pkcs8);
            println!("round {round} {name:>10}: {}", line(&f));
            all[i].push(f);
        }
    }
    println!("\nmedian of {rounds} rounds (server side, one core):");
    for (i, (name, _)) in providers.iter().enumerate() {
        let med = |pick: &dyn Fn(&Figures) -> Duration| {
            let mut v: Vec<Duration> = all[i].iter().map(pick).collect();
            v.sort();
            v[v.len() / 2]
        };
        let m = Figures {
            full: med(&|f| f.full),
            resumed: med(&|f| f.resumed),
            seal: [med(&|f| f.seal[0]), med(&|f| f.seal[1])],
            open: [med(&|f| f.open[0]), med(&|f| f.open[1])],
        };
        println!("{name:>10}: {}", line(&m));
    }
}

fn line(f: &Figures) -> String {
    format!(
        "full handshake {:>6.1} us, resumed {:>6.1} us; record seal/open: 1 KiB {:.2}/{:.2} us, \
         16 KiB {:.2}/{:.2} us",
        us(f.full),
        us(f.resumed),
        us(f.seal[0]),
        us(f.open[0]),
        us(f.seal[1]),
        us(f.open[1])
    )
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The benchmark's parameters for every peer: X25519 only, TLS 1.3 AES-256-GCM only.
fn pinned(mut p: CryptoProvider) -> Arc<CryptoProvider> {
    p.kx_groups
        .retain(|g| g.name() == rustls::NamedGroup::X25519);
    p.cipher_suites
        .retain(|s| s.suite() == rustls::CipherSuite::TLS13_AES_256_GCM_SHA384);
    assert_eq!((p.kx_groups.len(), p.cipher_suites.len()), (1, 1));
    Arc::new(p)
}

fn measure(
    provider: Arc<CryptoProvider>,
    chain: &[CertificateDer<'static>],
    key: &PrivateKeyDer<'static>,
) -> Figures {
    let mut server = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_no_client_auth()
        .with_single_cert(chain.to_vec(), key.clone_key())
        .expect("server config");
    // Resumption by the session cache (tickets off), as nginx in the handshake benchmark.
    server.session_storage = ServerSessionMemoryCache::new(10_000);
    server.send_tls13_tickets = 1;
    let server = Arc::new(server);
    let verifier = Arc::new(portico_tls::NoVerification::new(provider.clone()));
    let client = |resume: bool| {
        let mut c = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("TLS 1.3")
            .dangerous()
            .with_custom_certificate_verifier(verifier.clone())
            .with_no_client_auth();
        if !resume {
            c.resumption = Resumption::disabled();
        }
        Arc::new(c)
    };
    let fresh = client(false);
    let resuming = client(true);
    let mut f = Figures::default();

    let mut spent = Duration::ZERO;
    for _ in 0..HANDSHAKES {
        let (_, _, t) = handshake(&fresh, &server);
        spent += t;
    }
    f.full = spent / HANDSHAKES;

    // One full handshake stores the session (the server's ticket reaches the client within
    // `handshake`); every later one resumes and stores the next.
    handshake(&resuming, &server);
    let mut spent = Duration::ZERO;
    for _ in 0..HANDSHAKES {
        let (_, s, t) = handshake(&resuming, &server);
        assert_eq!(
            s.handshake_kind(),
            Some(rustls::HandshakeKind::Resumed),
            "the session was not resumed"
        );
        spent += t;
    }
    f.resumed = spent / HANDSHAKES;

    let (mut c, mut s, _) = handshake(&fresh, &server);
    for (i, size) in SIZES.into_iter().enumerate() {
        (f.seal[i], f.open[i]) = records(&mut c, &mut s, size);
    }
    f
}

/// Per record of `size` bytes: the server sealing one (a response) and opening one (an upload).
fn records(
    c: &mut ClientConnection,
    s: &mut ServerConnection,
    size: usize,
) -> (Duration, Duration) {
    let body = vec![b'x'; size];
    let mut wire = Vec::with_capacity(size + 64);
    let mut plain = vec![0u8; size];
    let (mut seal, mut open) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..RECORDS {
        let t = Instant::now();
        s.writer().write_all(&body).expect("plaintext");
        wire.clear();
        s.write_tls(&mut wire).expect("seal");
        seal += t.elapsed();
        deliver(c, &wire);
        c.reader().read_exact(&mut plain).expect("plaintext");
        c.writer().write_all(&body).expect("plaintext");
        wire.clear();
        c.write_tls(&mut wire).expect("seal");
        let t = Instant::now();
        deliver(s, &wire);
        s.reader().read_exact(&mut plain).expect("plaintext");
        open += t.elapsed();
    }
    (seal / RECORDS, open / RECORDS)
}

/// Feed `wire` to a connection (one `read_tls` takes at most one buffer's worth) and open it.
fn deliver<D>(conn: &mut rustls::ConnectionCommon<D>, mut wire: &[u8]) {
    while !wire.is_empty() {
        conn.read_tls(&mut wire).expect("read");
        conn.process_new_packets().expect("open");
    }
}

/// One handshake through memory; the time the server's side took.
fn handshake(
    client: &Arc<ClientConfig>,
    server: &Arc<ServerConfig>,
) -> (ClientConnection, ServerConnection, Duration) {
    let name = ServerName::try_from("localhost").expect("name");
    let mut c = ClientConnection::new(client.clone(), name).expect("client");
    let mut spent = Duration::ZERO;
    let t = Instant::now();
    let mut s = ServerConnection::new(server.clone()).expect("server");
    spent += t.elapsed();
    let mut wire = Vec::new();
    while c.is_handshaking() || s.is_handshaking() {
        wire.clear();
        while c.wants_write() {
            c.write_tls(&mut wire).expect("client write");
        }
        let t = Instant::now();
        s.read_tls(&mut wire.as_slice()).expect("server read");
        s.process_new_packets().expect("server handshake");
        wire.clear();
        while s.wants_write() {
            s.write_tls(&mut wire).expect("server write");
        }
        spent += t.elapsed();
        c.read_tls(&mut wire.as_slice()).expect("client read");
        c.process_new_packets().expect("client handshake");
    }
    (c, s, spent)
}
