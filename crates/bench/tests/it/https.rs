//! HTTPS runs against an in-process rustls server on 127.0.0.1: full vs resumed handshakes, pinned groups, verification.

use crate::cert;
use crate::run;
use portico_bench::Flags;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::HandshakeKind;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Handshakes the server saw.
#[derive(Default)]
struct Seen {
    full: AtomicU64,
    resumed: AtomicU64,
}

/// A TLS server answering every request with `200 ok` (keep-alive unless the request says close),
/// on its own thread; counts full and resumed handshakes.
fn server(cert: CertificateDer<'static>, key: PrivateKeyDer<'static>) -> (SocketAddr, Arc<Seen>) {
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![cert], key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let Ok((sock, _)) = l.accept().await else {
                    continue;
                };
                let (acceptor, seen) = (acceptor.clone(), s.clone());
                tokio::spawn(async move {
                    let Ok(mut t) = acceptor.accept(sock).await else {
                        return;
                    };
                    let n = match t.get_ref().1.handshake_kind() {
                        Some(HandshakeKind::Resumed) => &seen.resumed,
                        _ => &seen.full,
                    };
                    n.fetch_add(1, Ordering::Relaxed);
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        let Ok(k) = t.read(&mut chunk).await else {
                            return;
                        };
                        if k == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..k]);
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                            buf.drain(..end + 4);
                            let close = head.contains("connection: close");
                            let reply: &[u8] = if close {
                                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
                            } else {
                                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                            };
                            if t.write_all(reply).await.is_err() {
                                return;
                            }
                            if close {
                                let _ = t.shutdown().await;
                                return;
                            }
                        }
                    }
                });
            }
        });
    });
    (addr, seen)
}

fn flags(addr: SocketAddr) -> Flags {
    Flags {
        url: format!("https://localhost:{}/", addr.port()),
        closed: true,
        connections: 1,
        requests: Some(20),
        insecure: true,
        ..Flags::default()
    }
}

#[test]
fn new_connections_resume_sessions_unless_resumption_is_off() {
    let (c, k, _) = cert();
    let (addr, seen) = server(c, k);
    let r = run(Flags {
        close: true,
        tls_version: Some("1.3".into()),
        tls_groups: Some("x25519".into()),
        ..flags(addr)
    });
    eprintln!("{}", r.summary());
    assert_eq!(r.requests.completed, 20, "{:?}", r.requests);
    assert_eq!(r.connections_opened, 20);
    assert!(r.connections_per_s > 0.0);
    let t = r.tls.clone().expect("an HTTPS run reports TLS");
    // One connection at a time: the first handshake is full, every later one resumes.
    assert_eq!((t.handshakes.full, t.handshakes.resumed), (1, 19));
    assert_eq!(
        (t.version.as_deref(), t.group.as_deref()),
        (Some("TLSv1_3"), Some("X25519"))
    );
    assert_eq!(t.settings.groups, ["X25519"]);
    assert!(r.summary().contains("TLS handshakes: 1 full, 19 resumed"));
    assert_eq!(seen.full.load(Ordering::Relaxed), 1);
    assert_eq!(seen.resumed.load(Ordering::Relaxed), 19);

    let r = run(Flags {
        close: true,
        tls_resume: false,
        ..flags(addr)
    });
    let t = r.tls.clone().unwrap();
    assert_eq!((t.handshakes.full, t.handshakes.resumed), (20, 0));
    assert_eq!(seen.full.load(Ordering::Relaxed), 21);
    assert_eq!(seen.resumed.load(Ordering::Relaxed), 19);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);

    // Many connections at once: each resumes its own session, so only the first handshake of
    // each connection is full (a single shared cache holds at most 8 tickets per server).
    let r = run(Flags {
        close: true,
        connections: 16,
        requests: Some(160),
        ..flags(addr)
    });
    assert_eq!(r.requests.completed, 160, "{:?}", r.requests);
    let t = r.tls.unwrap();
    assert_eq!(t.handshakes.full + t.handshakes.resumed, 160);
    assert_eq!(t.handshakes.full, 16, "{:?}", t.handshakes);
}

#[test]
fn keep_alive_handshakes_happen_before_the_measured_phase() {
    let (c, k, _) = cert();
    let (addr, _) = server(c, k);
    let r = run(Flags {
        connections: 2,
        tls_groups: Some("secp256r1".into()),
        ..flags(addr)
    });
    assert_eq!(r.requests.completed, 20, "{:?}", r.requests);
    let t = r.tls.unwrap();
    assert_eq!(t.handshakes.full + t.handshakes.resumed, 0);
    assert_eq!(t.setup_handshakes.full + t.setup_handshakes.resumed, 2);
    assert_eq!(t.group.as_deref(), Some("secp256r1"));
    assert_eq!(r.connections_opened, 0);
}

#[test]
fn certificates_are_verified_against_cacert() {
    let (c, k, pem) = cert();
    let (addr, _) = server(c, k);
    let dir = std::env::temp_dir().join(format!("portico-bench-https-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.pem");
    std::fs::write(&good, &pem).unwrap();
    let r = run(Flags {
        insecure: false,
        cacert: Some(good),
        ..flags(addr)
    });
    assert_eq!(r.requests.completed, 20, "{:?}", r.requests);
    assert!(r.tls.unwrap().settings.verify.starts_with("cacert"));
    // Another self-signed certificate: every handshake is refused, counted as `tls` errors.
    let other = dir.join("other.pem");
    std::fs::write(&other, cert().2).unwrap();
    let r = run(Flags {
        insecure: false,
        cacert: Some(other),
        requests: Some(3),
        ..flags(addr)
    });
    assert_eq!(r.requests.completed, 0);
    assert_eq!(r.errors.get("tls"), Some(&3), "{:?}", r.errors);
    let _ = std::fs::remove_dir_all(&dir);
}
