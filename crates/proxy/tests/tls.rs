//! TLS termination end to end: real handshakes from a rustls client, SNI, ALPN, forwarded proto.

use portico_proxy::{start, Running};
use portico_testkit::{Reply, TestUpstream};
use rustls::pki_types::{CertificateDer, ServerName};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

struct Pki {
    ca: CertificateDer<'static>,
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
        leaves,
    }
}

fn tls_proxy(pki: &Pki, upstream: SocketAddr) -> Running {
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

fn client(
    pki: &Pki,
    addr: SocketAddr,
    sni: &str,
    alpn: &[&[u8]],
) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca.clone()).unwrap();
    let mut cfg = rustls::ClientConfig::builder_with_provider(portico_tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let conn = rustls::ClientConnection::new(
        Arc::new(cfg),
        ServerName::try_from(sni.to_string()).unwrap(),
    )
    .unwrap();
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    rustls::StreamOwned::new(conn, tcp)
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

    // Default certificate, ALPN http/1.1, two requests on one TLS connection.
    let mut s = client(&pki, addr, "localhost", &[b"h2", b"http/1.1"]);
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
fn plain_http_to_a_tls_listener_fails_the_handshake_only() {
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
    assert!(
        !out.starts_with(b"HTTP/"),
        "no plaintext answer on a TLS port"
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
