//! In-memory handshakes against `server_config`: suites, groups, resumption, mTLS, certificate checks.

use super::*;
use portico_config::DEFAULT_SESSION_CACHE;
use rustls::{ClientConfig, ClientConnection, HandshakeKind, ServerConnection};
use std::path::PathBuf;

/// A CA, a server leaf for `localhost` and a client certificate, as PEM files in a fresh directory.
struct Pki {
    dir: PathBuf,
    ca: CertificateDer<'static>,
    server: CertificateFiles,
    client_chain: Vec<CertificateDer<'static>>,
    client_key: PrivateKeyDer<'static>,
}

fn issue(
    params: rcgen::CertificateParams,
    ca: &rcgen::Certificate,
    ca_key: &rcgen::KeyPair,
) -> (rcgen::Certificate, rcgen::KeyPair) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let cert = params.signed_by(&key, ca, ca_key).unwrap();
    (cert, key)
}

fn make_pki(name: &str) -> Pki {
    let dir = std::env::temp_dir().join(format!("portico-tls-hs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "Test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();

    let (cert, key) = issue(
        rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap(),
        &ca,
        &ca_key,
    );
    let server = CertificateFiles {
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
    };
    std::fs::write(&server.cert, cert.pem()).unwrap();
    std::fs::write(&server.key, key.serialize_pem()).unwrap();

    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "Example, Inc.");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "alice");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let (client, client_key) = issue(params, &ca, &ca_key);
    Pki {
        ca: ca.der().clone(),
        server,
        client_chain: vec![client.der().clone()],
        client_key: PrivateKeyDer::try_from(client_key.serialize_der()).unwrap(),
        dir,
    }
}

fn settings(pki: &Pki) -> TlsSettings {
    TlsSettings {
        certificates: vec![pki.server.clone()],
        versions: vec![TlsVersion::Tls12, TlsVersion::Tls13],
        cipher_suites: None,
        groups: None,
        session_tickets: true,
        session_cache: DEFAULT_SESSION_CACHE,
        client_auth: None,
        watch: None,
        acme_alpn: false,
        refuse_stand_in: false,
    }
}

/// A client trusting the test CA, with the given provider (all suites and groups by default).
fn client_with(pki: &Pki, provider: CryptoProvider, cert: bool) -> Arc<ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca.clone()).unwrap();
    let builder = ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .unwrap()
        .with_root_certificates(roots);
    Arc::new(if cert {
        builder
            .with_client_auth_cert(pki.client_chain.clone(), pki.client_key.clone_key())
            .unwrap()
    } else {
        builder.with_no_client_auth()
    })
}

fn client(pki: &Pki) -> Arc<ClientConfig> {
    let mut all = aws_lc_rs::default_provider();
    all.kx_groups = aws_lc_rs::ALL_KX_GROUPS.to_vec();
    client_with(pki, all, false)
}

/// Run a whole handshake in memory, then let the server's post-handshake messages (TLS 1.3
/// tickets) reach the client. Errors from either side end it.
fn handshake(
    server: &Arc<rustls::ServerConfig>,
    client: &Arc<ClientConfig>,
) -> Result<(ClientConnection, ServerConnection), rustls::Error> {
    let mut c = ClientConnection::new(client.clone(), "localhost".try_into().unwrap()).unwrap();
    let mut s = ServerConnection::new(server.clone()).unwrap();
    let mut buf = Vec::new();
    for _ in 0..8 {
        buf.clear();
        c.write_tls(&mut buf).unwrap();
        s.read_tls(&mut &buf[..]).unwrap();
        s.process_new_packets()?;
        buf.clear();
        s.write_tls(&mut buf).unwrap();
        c.read_tls(&mut &buf[..]).unwrap();
        c.process_new_packets()?;
        if !c.is_handshaking() && !s.is_handshaking() && !c.wants_write() && !s.wants_write() {
            return Ok((c, s));
        }
    }
    panic!("handshake did not finish");
}

fn kind(server: &Arc<rustls::ServerConfig>, client: &Arc<ClientConfig>) -> HandshakeKind {
    let (c, s) = handshake(server, client).unwrap();
    assert_eq!(c.handshake_kind(), s.handshake_kind());
    s.handshake_kind().unwrap()
}

#[test]
fn config_names_are_the_providers_suites_and_groups() {
    let p = aws_lc_rs::default_provider();
    let names: Vec<&str> = p
        .cipher_suites
        .iter()
        .map(|s| s.suite().as_str().unwrap())
        .collect();
    let accepted: Vec<&str> = portico_config::CIPHER_SUITES
        .iter()
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(
        names, accepted,
        "the default suites are exactly the accepted ones"
    );
    for (name, version) in portico_config::CIPHER_SUITES {
        let s = p
            .cipher_suites
            .iter()
            .find(|s| s.suite().as_str() == Some(name))
            .unwrap();
        let v = match version {
            TlsVersion::Tls12 => rustls::ProtocolVersion::TLSv1_2,
            TlsVersion::Tls13 => rustls::ProtocolVersion::TLSv1_3,
        };
        assert_eq!(s.version().version, v, "{name}");
    }
    for (name, tls12) in portico_config::KX_GROUPS {
        let g = aws_lc_rs::ALL_KX_GROUPS
            .iter()
            .find(|g| g.name().as_str() == Some(name))
            .unwrap_or_else(|| panic!("{name} is not an aws-lc-rs group"));
        assert_eq!(
            g.usable_for_version(rustls::ProtocolVersion::TLSv1_2),
            tls12
        );
    }
    for g in p.kx_groups {
        let name = g.name().as_str().unwrap();
        assert!(
            portico_config::KX_GROUPS.iter().any(|(n, _)| *n == name),
            "default group {name} is accepted"
        );
    }
}

#[test]
fn pinned_suite_and_group_are_negotiated_and_others_refused() {
    let pki = make_pki("pin");
    let mut s = settings(&pki);
    s.cipher_suites = Some(vec![
        "TLS13_CHACHA20_POLY1305_SHA256",
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    ]);
    s.groups = Some(vec!["secp384r1"]);
    let server = server_config(&s, &Resumption::new()).unwrap();
    let (c, _) = handshake(&server, &client(&pki)).unwrap();
    assert_eq!(
        c.negotiated_cipher_suite().unwrap().suite(),
        rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256
    );
    assert_eq!(
        c.negotiated_key_exchange_group().unwrap().name(),
        rustls::NamedGroup::secp384r1
    );

    // A client whose only group the server disabled.
    let mut only_x25519 = aws_lc_rs::default_provider();
    only_x25519.kx_groups = vec![aws_lc_rs::kx_group::X25519];
    let e = handshake(&server, &client_with(&pki, only_x25519, false)).unwrap_err();
    assert!(matches!(e, rustls::Error::PeerIncompatible(_)), "{e:?}");

    // A client whose only suite the server disabled.
    let mut only_aes = aws_lc_rs::default_provider();
    only_aes.cipher_suites = vec![aws_lc_rs::cipher_suite::TLS13_AES_256_GCM_SHA384];
    let e = handshake(&server, &client_with(&pki, only_aes, false)).unwrap_err();
    assert!(matches!(e, rustls::Error::PeerIncompatible(_)), "{e:?}");

    // TLS 1.2 gets the pinned 1.2 suite.
    let mut tls12 = aws_lc_rs::default_provider();
    tls12
        .cipher_suites
        .retain(|s| s.version().version == rustls::ProtocolVersion::TLSv1_2);
    let (c, _) = handshake(&server, &client_with(&pki, tls12, false)).unwrap();
    assert_eq!(
        c.negotiated_cipher_suite().unwrap().suite(),
        rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
    );
}

#[test]
fn a_configured_suite_order_is_the_servers_preference() {
    let pki = make_pki("order");
    // The client prefers ChaCha20, then AES-128, then AES-256.
    let mut prefers_chacha = aws_lc_rs::default_provider();
    prefers_chacha.cipher_suites = vec![
        aws_lc_rs::cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
        aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256,
        aws_lc_rs::cipher_suite::TLS13_AES_256_GCM_SHA384,
    ];
    let client = client_with(&pki, prefers_chacha, false);
    let negotiated = |suites: Option<Vec<&'static str>>| {
        let mut s = settings(&pki);
        s.cipher_suites = suites;
        let server = server_config(&s, &Resumption::new()).unwrap();
        let (c, _) = handshake(&server, &client).unwrap();
        c.negotiated_cipher_suite().unwrap().suite()
    };
    // Configured: the server's order decides.
    assert_eq!(
        negotiated(Some(vec![
            "TLS13_AES_256_GCM_SHA384",
            "TLS13_AES_128_GCM_SHA256",
            "TLS13_CHACHA20_POLY1305_SHA256",
        ])),
        rustls::CipherSuite::TLS13_AES_256_GCM_SHA384
    );
    assert_eq!(
        negotiated(Some(vec![
            "TLS13_AES_128_GCM_SHA256",
            "TLS13_CHACHA20_POLY1305_SHA256",
        ])),
        rustls::CipherSuite::TLS13_AES_128_GCM_SHA256
    );
    // Not configured: the client's.
    assert_eq!(
        negotiated(None),
        rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256
    );
}

#[test]
fn post_quantum_hybrid_group_is_negotiated_when_pinned() {
    let pki = make_pki("pq");
    let mut s = settings(&pki);
    s.versions = vec![TlsVersion::Tls13];
    s.groups = Some(vec!["X25519MLKEM768"]);
    let server = server_config(&s, &Resumption::new()).unwrap();
    let (c, _) = handshake(&server, &client(&pki)).unwrap();
    assert_eq!(
        c.negotiated_key_exchange_group().unwrap().name(),
        rustls::NamedGroup::X25519MLKEM768
    );
}

#[test]
fn resumption_with_tickets_with_cache_only_and_off() {
    let pki = make_pki("resume");
    // Tickets (the default).
    let server = server_config(&settings(&pki), &Resumption::new()).unwrap();
    let c = client(&pki);
    assert_eq!(kind(&server, &c), HandshakeKind::Full);
    assert_eq!(kind(&server, &c), HandshakeKind::Resumed);

    // Tickets off, session cache on: TLS 1.3 stateful resumption and TLS 1.2 session ids.
    let mut s = settings(&pki);
    s.session_tickets = false;
    let server = server_config(&s, &Resumption::new()).unwrap();
    let c = client(&pki);
    assert_eq!(kind(&server, &c), HandshakeKind::Full);
    assert_eq!(kind(&server, &c), HandshakeKind::Resumed);
    let mut tls12 = aws_lc_rs::default_provider();
    tls12
        .cipher_suites
        .retain(|s| s.version().version == rustls::ProtocolVersion::TLSv1_2);
    let c = client_with(&pki, tls12, false);
    assert_eq!(kind(&server, &c), HandshakeKind::Full);
    assert_eq!(kind(&server, &c), HandshakeKind::Resumed);

    // Both off: never resumed, and no useless TLS 1.3 tickets sent.
    s.session_cache = 0;
    let server = server_config(&s, &Resumption::new()).unwrap();
    assert_eq!(server.send_tls13_tickets, 0);
    let c = client(&pki);
    assert_eq!(kind(&server, &c), HandshakeKind::Full);
    assert_eq!(kind(&server, &c), HandshakeKind::Full);
}

#[test]
fn resumption_survives_a_rebuilt_configuration() {
    let pki = make_pki("rebuild");
    for tickets in [true, false] {
        let mut s = settings(&pki);
        s.session_tickets = tickets;
        let resumption = Resumption::new();
        let before = server_config(&s, &resumption).unwrap();
        let c = client(&pki);
        assert_eq!(kind(&before, &c), HandshakeKind::Full);
        // A reload builds a new ServerConfig with the listener's Resumption: still resumes.
        let after = server_config(&s, &resumption).unwrap();
        assert!(!Arc::ptr_eq(&before, &after));
        assert_eq!(
            kind(&after, &c),
            HandshakeKind::Resumed,
            "tickets={tickets}"
        );
        // A new Resumption (another listener) does not know the session.
        let other = server_config(&s, &Resumption::new()).unwrap();
        assert_eq!(kind(&other, &c), HandshakeKind::Full, "tickets={tickets}");
    }
}

#[test]
fn mtls_required_optional_and_subject() {
    let pki = make_pki("mtls");
    let mut s = settings(&pki);
    s.client_auth = Some(ClientAuth {
        ca: pki.dir.join("ca.pem"),
        required: true,
    });
    let server = server_config(&s, &Resumption::new()).unwrap();
    let all = || {
        let mut p = aws_lc_rs::default_provider();
        p.kx_groups = aws_lc_rs::ALL_KX_GROUPS.to_vec();
        p
    };
    let with_cert = client_with(&pki, all(), true);
    let (_, conn) = handshake(&server, &with_cert).unwrap();
    let presented = &conn.peer_certificates().unwrap()[0];
    assert_eq!(
        client_subject(presented).as_deref(),
        Some("CN=alice,O=Example\\, Inc.")
    );
    // Resumed sessions keep the verified certificate.
    let (_, conn) = handshake(&server, &with_cert).unwrap();
    assert_eq!(conn.handshake_kind(), Some(HandshakeKind::Resumed));
    assert_eq!(&conn.peer_certificates().unwrap()[0], presented);

    let e = handshake(&server, &client_with(&pki, all(), false)).unwrap_err();
    assert!(matches!(e, rustls::Error::NoCertificatesPresented), "{e:?}");

    // A certificate from another CA is refused even when certificates are optional.
    s.client_auth.as_mut().unwrap().required = false;
    let server = server_config(&s, &Resumption::new()).unwrap();
    let (_, conn) = handshake(&server, &client_with(&pki, all(), false)).unwrap();
    assert!(conn.peer_certificates().is_none());
    let stranger = make_pki("mtls-stranger");
    let mut foreign = (*client_with(&pki, all(), false)).clone();
    foreign.client_auth_cert_resolver = client_with(&stranger, all(), true)
        .client_auth_cert_resolver
        .clone();
    assert!(handshake(&server, &Arc::new(foreign)).is_err());

    // The CA file is checked like certificate files.
    s.client_auth.as_mut().unwrap().ca = pki.dir.join("missing-ca.pem");
    let e = server_config(&s, &Resumption::new())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("missing-ca.pem") && e.contains("cannot read"),
        "{e}"
    );
}

#[test]
fn subject_values_are_escaped_for_a_header() {
    let mut out = String::new();
    escape_dn_value(&mut out, " a,b+c\r\nd\u{e9} ");
    assert_eq!(out, "\\ a\\,b\\+c\\0d\\0ad\\c3\\a9\\ ");
}

#[test]
fn unsupported_key_type_names_the_key_file() {
    let pki = make_pki("ed448");
    // An Ed448 PKCS#8 key (OID 1.3.101.113): well-formed, not supported by aws-lc-rs.
    let mut der = vec![
        0x30, 0x47, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x71, 0x04, 0x3b, 0x04,
        0x39,
    ];
    der.extend([7u8; 57]);
    let b64 = base64(&der);
    let key = pki.dir.join("ed448.key");
    std::fs::write(
        &key,
        format!("-----BEGIN PRIVATE KEY-----\n{b64}\n-----END PRIVATE KEY-----\n"),
    )
    .unwrap();
    let mut s = settings(&pki);
    s.certificates[0].key = key;
    let e = server_config(&s, &Resumption::new())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("ed448.key") && e.contains("unsupported private key"),
        "{e}"
    );
}

fn base64(data: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
fn expiry_warnings_name_the_file_and_date() {
    let dir = std::env::temp_dir().join(format!("portico-tls-expiry-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let write = |stem: &str, from: (i32, u8, u8), until: (i32, u8, u8)| {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(vec![format!("{stem}.test")]).unwrap();
        params.not_before = rcgen::date_time_ymd(from.0, from.1, from.2);
        params.not_after = rcgen::date_time_ymd(until.0, until.1, until.2);
        let cert = params.self_signed(&key).unwrap();
        let files = CertificateFiles {
            cert: dir.join(format!("{stem}.pem")),
            key: dir.join(format!("{stem}.key")),
        };
        std::fs::write(&files.cert, cert.pem()).unwrap();
        std::fs::write(&files.key, key.serialize_pem()).unwrap();
        files
    };
    // "Now" is 2030-06-01 00:00:00 UTC.
    let now = UNIX_EPOCH + Duration::from_secs(1_906_502_400);
    assert_eq!(utc(1_906_502_400), "2030-06-01 00:00:00 UTC");
    let certs = vec![
        write("fine", (2030, 1, 1), (2031, 1, 1)),
        write("expired", (2029, 1, 1), (2030, 5, 1)),
        write("future", (2030, 7, 1), (2031, 1, 1)),
        write("soon", (2030, 1, 1), (2030, 6, 21)),
    ];
    let s = TlsSettings {
        certificates: certs,
        versions: vec![TlsVersion::Tls13],
        cipher_suites: None,
        groups: None,
        session_tickets: true,
        session_cache: 0,
        client_auth: None,
        watch: None,
        acme_alpn: false,
        refuse_stand_in: false,
    };
    let w = certificate_warnings(&s, now);
    assert_eq!(w.len(), 3, "{w:#?}");
    let path = |stem: &str| dir.join(format!("{stem}.pem")).display().to_string();
    assert!(w[0].starts_with(&path("expired")), "{}", w[0]);
    assert!(
        w[0].ends_with("expired on 2030-05-01 00:00:00 UTC"),
        "{}",
        w[0]
    );
    assert!(w[1].starts_with(&path("future")), "{}", w[1]);
    assert!(
        w[1].ends_with("is not valid before 2030-07-01 00:00:00 UTC"),
        "{}",
        w[1]
    );
    assert!(w[2].starts_with(&path("soon")), "{}", w[2]);
    assert!(
        w[2].ends_with("expires on 2030-06-21 00:00:00 UTC (in 20 days)"),
        "{}",
        w[2]
    );
    // Expired certificates still load: a warning, not an error.
    server_config(&s, &Resumption::new()).unwrap();
}

/// A client that checks nothing (an ACME server's validation looks at the certificate
/// itself), offering `alpn`.
fn unverified(alpn: &[u8]) -> Arc<ClientConfig> {
    let mut c = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(crate::client::NoVerification::new(provider())))
        .with_no_client_auth();
    c.alpn_protocols = vec![alpn.to_vec()];
    Arc::new(c)
}

#[test]
fn acme_tls_alpn_handshakes_get_the_challenge_certificate_only_where_asked() {
    let pki = make_pki("acme-alpn");
    let mut s = settings(&pki);
    s.acme_alpn = true;
    let server = with_alpn(server_config(&s, &Resumption::new()).unwrap(), true);
    assert_eq!(server.alpn_protocols.last().unwrap(), acme::ALPN);
    // No challenge for the name: the handshake fails.
    assert!(handshake(&server, &unverified(acme::ALPN)).is_err());
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let der = cert.der().clone();
    let key = PrivateKeyDer::try_from(key.serialize_der()).unwrap();
    acme::set_challenge(
        "LocalHost",
        Some(certified_key(vec![der.clone()], key).unwrap()),
    );
    let (c, srv) = handshake(&server, &unverified(acme::ALPN)).unwrap();
    assert_eq!(srv.alpn_protocol(), Some(acme::ALPN));
    assert_eq!(c.peer_certificates().unwrap()[0], der);
    // Other clients get the listener's certificate, one offering acme-tls/1 among others too.
    let (c, srv) = handshake(&server, &client(&pki)).unwrap();
    assert_eq!(srv.alpn_protocol(), None);
    assert_ne!(c.peer_certificates().unwrap()[0], der);
    let mut both = (*unverified(acme::ALPN)).clone();
    both.alpn_protocols.push(b"h2".to_vec());
    let (c, srv) = handshake(&server, &Arc::new(both)).unwrap();
    assert_eq!(srv.alpn_protocol(), Some(&b"h2"[..]));
    assert_ne!(c.peer_certificates().unwrap()[0], der);
    // A listener that does not answer TLS-ALPN-01 refuses such handshakes.
    let plain = server_config(&settings(&pki), &Resumption::new()).unwrap();
    assert!(handshake(&plain, &unverified(acme::ALPN)).is_err());
    acme::set_challenge("localhost", None);
    assert!(handshake(&server, &unverified(acme::ALPN)).is_err());
    std::fs::remove_dir_all(&pki.dir).unwrap();
}

#[test]
fn a_stand_in_is_refused_when_configured() {
    let pki = make_pki("stand-in");
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, acme::STAND_IN_CN);
    let cert = params.self_signed(&key).unwrap();
    let files = CertificateFiles {
        cert: pki.dir.join("stand-in.pem"),
        key: pki.dir.join("stand-in.key"),
    };
    std::fs::write(&files.cert, cert.pem()).unwrap();
    std::fs::write(&files.key, key.serialize_pem()).unwrap();
    let stored = stored_certificate(&files.cert).unwrap();
    assert!(stored.stand_in && stored.authority_key_id.is_none());
    assert!(!stored_certificate(&pki.server.cert).unwrap().stand_in);
    let mut s = settings(&pki);
    s.certificates = vec![files];
    let served = server_config(&s, &Resumption::new()).unwrap();
    assert!(handshake(&served, &unverified(b"http/1.1")).is_ok());
    s.refuse_stand_in = true;
    let refused = server_config(&s, &Resumption::new()).unwrap();
    assert!(handshake(&refused, &unverified(b"http/1.1")).is_err());
    // An issued certificate is served with refusal on.
    let mut s = settings(&pki);
    s.refuse_stand_in = true;
    let issued = server_config(&s, &Resumption::new()).unwrap();
    assert!(handshake(&issued, &client(&pki)).is_ok());
    std::fs::remove_dir_all(&pki.dir).unwrap();
}
