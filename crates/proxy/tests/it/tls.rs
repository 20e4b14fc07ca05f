//! TLS termination end to end: real handshakes from a rustls client, SNI, ALPN, resumption, mTLS.

use portico_proxy::{start, Running};
use portico_testkit::{Reply, TestUpstream};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::HandshakeKind;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

struct Pki {
    ca: CertificateDer<'static>,
    ca_path: PathBuf,
    /// A client certificate (CN=alice, O=Example) signed by the CA, and its key.
    client_chain: Vec<CertificateDer<'static>>,
    client_key: PrivateKeyDer<'static>,
    /// (cert path, key path, cert DER) per leaf
    leaves: Vec<(PathBuf, PathBuf, CertificateDer<'static>)>,
}

/// A CA and one leaf per name list, signed by it, written as PEM files under `dir`.
fn pki(dir: &Path, leaves: &[&[&str]]) -> Pki {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let ca_path = dir.join("ca.pem");
    std::fs::write(&ca_path, ca.pem()).unwrap();
    let client_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut client_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    client_params.distinguished_name = rcgen::DistinguishedName::new();
    client_params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "Example");
    client_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "alice");
    client_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    client_params.subject_alt_names = vec![
        rcgen::SanType::DnsName("alice.clients.example".try_into().unwrap()),
        rcgen::SanType::URI("spiffe://example.org/ns/prod/sa/alice".try_into().unwrap()),
    ];
    let client = client_params.signed_by(&client_key, &ca, &ca_key).unwrap();
    let leaves = leaves
        .iter()
        .enumerate()
        .map(|(i, names)| {
            let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
            let params = rcgen::CertificateParams::new(
                names.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            )
            .unwrap();
            let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
            let (c, k) = (
                dir.join(format!("leaf{i}.pem")),
                dir.join(format!("leaf{i}.key")),
            );
            std::fs::write(&c, cert.pem()).unwrap();
            std::fs::write(&k, key.serialize_pem()).unwrap();
            (c, k, cert.der().clone())
        })
        .collect();
    Pki {
        ca: ca.der().clone(),
        ca_path,
        client_chain: vec![client.der().clone()],
        client_key: PrivateKeyDer::try_from(client_key.serialize_der()).unwrap(),
        leaves,
    }
}

fn tls_proxy(pki: &Pki, upstream: SocketAddr) -> Running {
    tls_proxy_with(pki, upstream, "")
}

/// A TLS listener "tls" proxying to `upstream`, with `extra` lines in its `[listeners.tls]`.
fn tls_proxy_with(pki: &Pki, upstream: SocketAddr, extra: &str) -> Running {
    let certs: Vec<String> = pki
        .leaves
        .iter()
        .map(|(c, k, _)| {
            format!(
                "{{ cert = \"{}\", key = \"{}\" }}",
                c.display(),
                k.display()
            )
        })
        .collect();
    let toml = format!(
        r#"
[[listeners]]
name = "tls"
address = "127.0.0.1:0"
[listeners.tls]
certificates = [{}]
{extra}
[[listeners.routes]]
proxy = "b"
[upstreams.b]
servers = ["{upstream}"]
"#,
        certs.join(", ")
    );
    let cfg = portico_config::parse(&toml, "tls-test.toml").unwrap_or_else(|e| panic!("{e}"));
    start(cfg, 1).expect("start")
}

type Client = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A client configuration trusting the test CA; with the CA's client certificate when `cert`.
fn client_config(
    pki: &Pki,
    provider: rustls::crypto::CryptoProvider,
    cert: bool,
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca.clone()).unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()
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

fn connect(cfg: &Arc<rustls::ClientConfig>, addr: SocketAddr, sni: &str) -> Client {
    let conn =
        rustls::ClientConnection::new(cfg.clone(), ServerName::try_from(sni.to_string()).unwrap())
            .unwrap();
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    rustls::StreamOwned::new(conn, tcp)
}

fn client(pki: &Pki, addr: SocketAddr, sni: &str, alpn: &[&[u8]]) -> Client {
    let mut cfg =
        (*client_config(pki, rustls::crypto::aws_lc_rs::default_provider(), false)).clone();
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    connect(&Arc::new(cfg), addr, sni)
}

/// One GET on a new connection: the response body and how the handshake went.
fn get(cfg: &Arc<rustls::ClientConfig>, addr: SocketAddr, extra: &str) -> (Vec<u8>, HandshakeKind) {
    let mut s = connect(cfg, addr, "localhost");
    s.write_all(format!("GET / HTTP/1.1\r\nHost: localhost\r\n{extra}\r\n").as_bytes())
        .unwrap();
    let (head, body) = read_response(&mut s);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    (body, s.conn.handshake_kind().unwrap())
}

fn counter(p: &Running, f: impl Fn(&portico_proxy::Stats) -> &std::sync::atomic::AtomicU64) -> u64 {
    f(p.stats()).load(std::sync::atomic::Ordering::Relaxed)
}

/// Read one response with a Content-Length body.
fn read_response<S: Read>(s: &mut S) -> (String, Vec<u8>) {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).unwrap(), 1, "connection ended inside a head");
        head.push(b[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    (head, body)
}

#[test]
fn tls_listener_proxies_with_sni_alpn_and_forwarded_proto() {
    let dir = std::env::temp_dir().join(format!("portico-tls-it-{}", std::process::id()));
    let pki = pki(&dir, &[&["localhost"], &["other.test", "*.other.test"]]);
    let up = TestUpstream::start(|_| Reply::ok("secure"));
    let p = tls_proxy(&pki, up.addr);
    let addr = p.addr("tls").unwrap();

    // Default certificate, ALPN http/1.1 (h2 is chosen when offered: see tests/h2.rs), two
    // requests on one TLS connection.
    let mut s = client(&pki, addr, "localhost", &[b"http/1.1"]);
    s.write_all(b"GET /a HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let (head, body) = read_response(&mut s);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(body, b"secure");
    assert_eq!(s.conn.alpn_protocol(), Some(&b"http/1.1"[..]));
    assert_eq!(s.conn.peer_certificates().unwrap()[0], pki.leaves[0].2);
    s.write_all(b"GET /b HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&mut s).1, b"secure");
    let seen = up.requests();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].header("x-forwarded-proto"), Some("https"));

    // SNI picks the certificate valid for the name, wildcard included.
    for name in ["other.test", "www.other.test"] {
        let mut s = client(&pki, addr, name, &[]);
        s.write_all(format!("GET / HTTP/1.1\r\nHost: {name}\r\n\r\n").as_bytes())
            .unwrap();
        assert_eq!(read_response(&mut s).1, b"secure");
        assert_eq!(
            s.conn.peer_certificates().unwrap()[0],
            pki.leaves[1].2,
            "{name}"
        );
    }
}

#[test]
fn plain_http_to_a_tls_listener_is_answered_400_and_tls_goes_on() {
    let dir = std::env::temp_dir().join(format!("portico-tls-plain-{}", std::process::id()));
    let pki = pki(&dir, &[&["localhost"]]);
    let up = TestUpstream::start(|_| Reply::ok("x"));
    let p = tls_proxy(&pki, up.addr);
    let addr = p.addr("tls").unwrap();
    let mut raw = TcpStream::connect(addr).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    raw.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    let mut out = Vec::new();
    let _ = raw.read_to_end(&mut out);
    // Told so in plain HTTP, as nginx does, and nothing reaches the server.
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 400 "), "{text}");
    assert!(
        text.ends_with("the plain HTTP request was refused\n"),
        "{text}"
    );
    assert!(up.requests().is_empty());
    // The listener still serves TLS afterwards.
    let mut s = client(&pki, addr, "localhost", &[]);
    s.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&mut s).1, b"x");
    assert_eq!(
        p.stats()
            .tls_handshake_failures
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[test]
fn missing_certificate_file_stops_start_with_its_path() {
    let cfg = portico_config::parse(
        r#"
[[listeners]]
name = "tls"
address = "127.0.0.1:0"
[listeners.tls]
certificates = [{ cert = "/nonexistent/portico.pem", key = "/nonexistent/portico.key" }]
[[listeners.routes]]
respond = { status = 200 }
"#,
        "t.toml",
    )
    .unwrap();
    let e = start(cfg, 1).err().expect("must not start").to_string();
    assert!(
        e.contains("listener tls") && e.contains("/nonexistent/portico.pem"),
        "{e}"
    );
}

#[test]
fn pinned_group_and_suite_are_negotiated_and_a_disabled_group_is_refused() {
    let dir = std::env::temp_dir().join(format!("portico-tls-pin-{}", std::process::id()));
    let pki = pki(&dir, &[&["localhost"]]);
    let up = TestUpstream::start(|_| Reply::ok("x"));
    let p = tls_proxy_with(
        &pki,
        up.addr,
        "versions = \"1.3\"\ncipher_suites = [\"TLS13_AES_128_GCM_SHA256\"]\ngroups = [\"X25519\"]",
    );
    let addr = p.addr("tls").unwrap();
    let cfg = client_config(&pki, rustls::crypto::aws_lc_rs::default_provider(), false);
    let mut s = connect(&cfg, addr, "localhost");
    s.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&mut s).1, b"x");
    assert_eq!(
        s.conn.negotiated_cipher_suite().unwrap().suite(),
        rustls::CipherSuite::TLS13_AES_128_GCM_SHA256
    );
    assert_eq!(
        s.conn.negotiated_key_exchange_group().unwrap().name(),
        rustls::NamedGroup::X25519
    );

    let mut p384 = rustls::crypto::aws_lc_rs::default_provider();
    p384.kx_groups = vec![rustls::crypto::aws_lc_rs::kx_group::SECP384R1];
    let mut s = connect(&client_config(&pki, p384, false), addr, "localhost");
    assert!(s.write_all(b"GET / HTTP/1.1\r\n\r\n").is_err() || s.read(&mut [0u8; 16]).is_err());
    // One worker: the failed handshake was counted before the next connection was accepted.
    assert_eq!(get(&cfg, addr, "").0, b"x");
    assert_eq!(counter(&p, |s| &s.tls_handshake_failures), 1);
    assert_eq!(up.requests().len(), 2);
}

#[test]
fn resumption_with_tickets_with_the_session_cache_and_off() {
    let dir = std::env::temp_dir().join(format!("portico-tls-resume-{}", std::process::id()));
    let pki = pki(&dir, &[&["localhost"]]);
    let up = TestUpstream::start(|_| Reply::ok("r"));
    let provider = || rustls::crypto::aws_lc_rs::default_provider();
    let tls12 = || {
        let mut p = provider();
        p.cipher_suites
            .retain(|s| s.version().version == rustls::ProtocolVersion::TLSv1_2);
        p
    };
    for (extra, resumes) in [
        ("", true),
        ("session_tickets = false", true),
        ("session_tickets = false\nsession_cache = 0", false),
    ] {
        let p = tls_proxy_with(&pki, up.addr, extra);
        let addr = p.addr("tls").unwrap();
        for (version, cfg) in [
            ("1.3", client_config(&pki, provider(), false)),
            ("1.2", client_config(&pki, tls12(), false)),
        ] {
            assert_eq!(get(&cfg, addr, "").1, HandshakeKind::Full);
            let expected = if resumes {
                HandshakeKind::Resumed
            } else {
                HandshakeKind::Full
            };
            assert_eq!(get(&cfg, addr, "").1, expected, "{extra:?} TLS {version}");
        }
        let (full, resumed) = if resumes { (2, 2) } else { (4, 0) };
        assert_eq!(counter(&p, |s| &s.tls_handshakes_full), full, "{extra:?}");
        assert_eq!(
            counter(&p, |s| &s.tls_handshakes_resumed),
            resumed,
            "{extra:?}"
        );
    }
}

#[test]
fn mtls_forwards_the_verified_subject_and_never_a_client_sent_one() {
    let dir = std::env::temp_dir().join(format!("portico-tls-mtls-{}", std::process::id()));
    let pki = pki(&dir, &[&["localhost"]]);
    let up = TestUpstream::start(|_| Reply::ok("m"));
    let provider = || rustls::crypto::aws_lc_rs::default_provider();
    let spoof = "X-Client-Cert-Subject: CN=mallory\r\nx-client-cert-subject: CN=eve\r\n";

    let required = tls_proxy_with(
        &pki,
        up.addr,
        &format!("client_auth = {{ ca = \"{}\" }}", pki.ca_path.display()),
    );
    let addr = required.addr("tls").unwrap();
    let with_cert = client_config(&pki, provider(), true);
    assert_eq!(get(&with_cert, addr, spoof).0, b"m");
    let seen = up.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].header_count("x-client-cert-subject"), 1);
    assert_eq!(
        seen[0].header("x-client-cert-subject"),
        Some("CN=alice,O=Example")
    );
    // A resumed session keeps the verified identity.
    assert_eq!(get(&with_cert, addr, "").1, HandshakeKind::Resumed);
    assert_eq!(
        up.requests()[1].header("x-client-cert-subject"),
        Some("CN=alice,O=Example")
    );

    // Required: no certificate, no request.
    let mut s = connect(&client_config(&pki, provider(), false), addr, "localhost");
    let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n");
    let mut out = Vec::new();
    assert!(s.read_to_end(&mut out).is_err() || out.is_empty());
    // One worker: the failed handshake was counted before the next connection was accepted.
    assert_eq!(get(&with_cert, addr, "").0, b"m");
    assert_eq!(counter(&required, |s| &s.tls_handshake_failures), 1);
    assert_eq!(up.requests().len(), 3);

    // Optional: accepted without a certificate, and a client-sent subject is still removed.
    let optional = tls_proxy_with(
        &pki,
        up.addr,
        &format!(
            "client_auth = {{ ca = \"{}\", required = false }}",
            pki.ca_path.display()
        ),
    );
    let addr = optional.addr("tls").unwrap();
    assert_eq!(
        get(&client_config(&pki, provider(), false), addr, spoof).0,
        b"m"
    );
    assert_eq!(up.requests()[3].header_count("x-client-cert-subject"), 0);
    assert_eq!(get(&with_cert, addr, "").0, b"m");
    assert_eq!(
        up.requests()[4].header("x-client-cert-subject"),
        Some("CN=alice,O=Example")
    );

    // A plain TLS listener removes the field too.
    let plain = tls_proxy(&pki, up.addr);
    let addr = plain.addr("tls").unwrap();
    assert_eq!(
        get(&client_config(&pki, provider(), false), addr, spoof).0,
        b"m"
    );
    assert_eq!(up.requests()[5].header_count("x-client-cert-subject"), 0);
}

#[test]
fn client_cert_rules_admit_by_subject_san_and_issuer_for_http1_and_http2() {
    let dir = std::env::temp_dir().join(format!("portico-tls-certrules-{}", std::process::id()));
    let pki = pki(&dir, &[&["localhost"]]);
    let up = TestUpstream::start(|r| Reply::ok(&r.target));
    let (c, k, _) = &pki.leaves[0];
    let toml = format!(
        r#"
[[listeners]]
name = "tls"
address = "127.0.0.1:0"
client_cert = {{ san = "URI:spiffe://example.org/ns/prod/*" }}
[listeners.tls]
certificates = [{{ cert = "{}", key = "{}" }}]
client_auth = {{ ca = "{}", required = false }}
[[listeners.routes]]
path = "/subject"
proxy = "b"
client_cert = {{ subject = ["CN=bob,*", "CN=alice,O=Example"] }}
[[listeners.routes]]
path = "/servers"
proxy = "b"
client_cert = {{ san = "DNS:*.servers.example" }}
[[listeners.routes]]
path = "/issuer"
proxy = "b"
client_cert = {{ issuer = "CN=rcgen*", subject = "cn=ALICE,*" }}
[[listeners.routes]]
proxy = "b"
[upstreams.b]
servers = ["{}"]
"#,
        c.display(),
        k.display(),
        pki.ca_path.display(),
        up.addr
    );
    let cfg = portico_config::parse(&toml, "t.toml").unwrap_or_else(|e| panic!("{e}"));
    let p = start(cfg, 1).expect("start");
    let addr = p.addr("tls").unwrap();
    let provider = || rustls::crypto::aws_lc_rs::default_provider();
    let status = |cfg: &Arc<rustls::ClientConfig>, path: &str| {
        let mut s = connect(cfg, addr, "localhost");
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes())
            .unwrap();
        let (head, _) = read_response(&mut s);
        head[9..12].to_string()
    };
    let alice = client_config(&pki, provider(), true);
    let nobody = client_config(&pki, provider(), false);
    let got: Vec<String> = ["/subject", "/servers", "/issuer", "/other"]
        .iter()
        .map(|path| status(&alice, path))
        .collect();
    assert_eq!(got, ["200", "403", "200", "200"]);
    // Without a certificate no rule matches; the listener's rule is the default.
    assert_eq!(status(&nobody, "/subject"), "403");
    assert_eq!(status(&nobody, "/other"), "403");
    assert_eq!(counter(&p, |s| &s.client_cert_denied), 3);
    // HTTP/2 over the same handshake meets the same rules.
    let mut h2cfg = (*alice).clone();
    h2cfg.alpn_protocols = vec![b"h2".to_vec()];
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let statuses = rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        let tls = tokio_rustls::TlsConnector::from(Arc::new(h2cfg))
            .connect(name, tcp)
            .await
            .unwrap();
        let (client, conn) = h2::client::handshake(tls).await.unwrap();
        tokio::spawn(conn);
        let mut out = Vec::new();
        for path in ["/subject", "/servers"] {
            let mut c = client.clone().ready().await.unwrap();
            let req = http::Request::builder()
                .uri(format!("https://localhost{path}"))
                .body(())
                .unwrap();
            let (resp, _) = c.send_request(req, true).unwrap();
            out.push(resp.await.unwrap().status().as_u16());
        }
        out
    });
    assert_eq!(statuses, [200, 403]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_tls_connection_asleep_past_its_grace_wakes_for_its_next_request() {
    let dir = std::env::temp_dir().join(format!("portico-tls-sleep-{}", std::process::id()));
    let pki = pki(&dir, &[&["localhost"]]);
    let up = TestUpstream::start(|r| Reply::ok(&r.target));
    let p = tls_proxy(&pki, up.addr);
    let mut s = client(&pki, p.addr("tls").unwrap(), "localhost", &[b"http/1.1"]);
    for path in ["/1", "/2", "/3"] {
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes())
            .unwrap();
        let (head, body) = read_response(&mut s);
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert_eq!(body, path.as_bytes());
        // The scenario is the idle time itself: past the 500 ms grace, the connection sleeps
        // (its request state dropped) and must wake whole for the next request.
        std::thread::sleep(Duration::from_millis(700));
    }
    assert_eq!(up.requests().len(), 3);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tls_client_that_stops_reading_is_cut_after_send_timeout() {
    use portico_proxy::stats::{Cause, Phase, Side};
    use portico_proxy::Termination;
    let dir = std::env::temp_dir().join(format!("portico-tls-send-{}", std::process::id()));
    let pki = pki(&dir, &[&["localhost"]]);
    let body = 16 << 20;
    let up = TestUpstream::start(move |_| Reply::Respond {
        status: 200,
        headers: vec![],
        body: vec![b'x'; body],
        chunked: false,
    });
    // `extra` lands in [listeners.tls]; a new table header starts the listener's limits.
    let p = tls_proxy_with(
        &pki,
        up.addr,
        "[listeners.limits]\nsend_timeout = \"300ms\"",
    );
    let cfg = client_config(&pki, rustls::crypto::aws_lc_rs::default_provider(), false);
    // A small receive buffer (no autotuning): the proxy's writes block early.
    let tcp = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    tcp.set_recv_buffer_size(16 * 1024).unwrap();
    tcp.connect(&p.addr("tls").unwrap().into()).unwrap();
    let tcp: TcpStream = tcp.into();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let conn =
        rustls::ClientConnection::new(cfg, ServerName::try_from("localhost").unwrap()).unwrap();
    let mut s = rustls::StreamOwned::new(conn, tcp);
    let sent = std::time::Instant::now();
    s.write_all(b"GET /big HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let stalled = Termination::new(Side::Client, Phase::ResponseBody, Cause::Timeout);
    let end = sent + Duration::from_secs(10);
    while p.stats().terminations(stalled) == 0 {
        assert!(
            std::time::Instant::now() < end,
            "the stalled client was not cut"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(sent.elapsed() >= Duration::from_millis(300));
    // The connection ends (close_notify, EOF or a reset) before the whole body arrived.
    let mut got = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e)
                if e.kind() != std::io::ErrorKind::WouldBlock
                    && e.kind() != std::io::ErrorKind::TimedOut =>
            {
                break
            }
            Err(e) => panic!("the connection was not closed: {e}"),
        }
    }
    assert!(got < body, "the whole body arrived ({got} bytes)");
}
