//! TLS origination end to end: portico speaking HTTPS to an in-test tokio-rustls upstream.

use portico_proxy::stats::{Cause, Phase, Side};
use portico_proxy::{start, Running, Termination};
use portico_testkit::Client;
use portico_upstream::Health;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::HandshakeKind;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A CA, a server certificate for `upstream.test` and 127.0.0.1, and a client certificate
/// (CN=portico), all signed by the CA and written as PEM files.
struct Pki {
    dir: PathBuf,
    ca: CertificateDer<'static>,
    server_chain: Vec<CertificateDer<'static>>,
    server_key: PrivateKeyDer<'static>,
    client_cert: CertificateDer<'static>,
}

fn pki(name: &str) -> Pki {
    let dir = std::env::temp_dir().join(format!("portico-tlsup-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();

    let server_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let server_params =
        rcgen::CertificateParams::new(vec!["upstream.test".to_string(), "127.0.0.1".to_string()])
            .unwrap();
    let server = server_params.signed_by(&server_key, &ca, &ca_key).unwrap();

    let client_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut client_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    client_params.distinguished_name = rcgen::DistinguishedName::new();
    client_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "portico");
    client_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let client = client_params.signed_by(&client_key, &ca, &ca_key).unwrap();
    std::fs::write(dir.join("client.pem"), client.pem()).unwrap();
    std::fs::write(dir.join("client.key"), client_key.serialize_pem()).unwrap();

    Pki {
        dir,
        ca: ca.der().clone(),
        server_chain: vec![server.der().clone(), ca.der().clone()],
        server_key: PrivateKeyDer::try_from(server_key.serialize_der()).unwrap(),
        client_cert: client.der().clone(),
    }
}

/// What the upstream saw of one completed handshake.
#[derive(Debug, Clone)]
struct Seen {
    kind: HandshakeKind,
    sni: Option<String>,
    client_cert: Option<CertificateDer<'static>>,
}

/// An HTTPS/1.1 server on its own thread: answers every request `200 tls-upstream`, keeps
/// connections alive, records accepts and handshakes.
struct TlsUpstream {
    addr: SocketAddr,
    accepts: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl TlsUpstream {
    /// `require_client_cert`: mTLS, client certificates must chain to the test CA.
    fn start(pki: &Pki, require_client_cert: bool) -> TlsUpstream {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = if require_client_cert {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(pki.ca.clone()).unwrap();
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let config = builder
            .with_single_cert(pki.server_chain.clone(), pki.server_key.clone_key())
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (accepts, failed, seen) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(Mutex::new(Vec::new())),
        );
        let up = TlsUpstream {
            addr,
            accepts: accepts.clone(),
            failed: failed.clone(),
            seen: seen.clone(),
        };
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    let Ok((tcp, _)) = listener.accept().await else {
                        continue;
                    };
                    accepts.fetch_add(1, Ordering::SeqCst);
                    let (acceptor, failed, seen) = (acceptor.clone(), failed.clone(), seen.clone());
                    tokio::spawn(async move {
                        let Ok(mut tls) = acceptor.accept(tcp).await else {
                            failed.fetch_add(1, Ordering::SeqCst);
                            return;
                        };
                        let conn = tls.get_ref().1;
                        seen.lock().unwrap().push(Seen {
                            kind: conn.handshake_kind().unwrap(),
                            sni: conn.server_name().map(str::to_string),
                            client_cert: conn.peer_certificates().map(|c| c[0].clone()),
                        });
                        serve_http(&mut tls).await;
                    });
                }
            });
        });
        up
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// Answer body-less requests until the client closes.
async fn serve_http<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(s: &mut S) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head: Vec<u8> = buf.drain(..end + 4).collect();
            if head.starts_with(b"GET /echo-host ") {
                // The body is the Host the request came with.
                let text = String::from_utf8_lossy(&head).to_string();
                let host = text
                    .lines()
                    .find_map(|l| l.strip_prefix("host: ").or(l.strip_prefix("Host: ")))
                    .unwrap_or("")
                    .to_string();
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{host}",
                    host.len()
                );
                if s.write_all(resp.as_bytes()).await.is_err() || s.flush().await.is_err() {
                    return;
                }
                continue;
            }
            if head.starts_with(b"POST /count ") {
                // Read the Content-Length body slowly in small reads (portico's socket fills
                // and rustls keeps ciphertext it could not write), answer its length.
                let text = String::from_utf8_lossy(&head).to_lowercase();
                let len: usize = text
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                let mut got = buf.len().min(len);
                buf.drain(..got);
                while got < len {
                    tokio::time::sleep(Duration::from_micros(500)).await;
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got += n,
                    }
                }
                let body = got.to_string();
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                if s.write_all(resp.as_bytes()).await.is_err() || s.flush().await.is_err() {
                    return;
                }
                continue;
            }
            if head.starts_with(b"GET /close ") {
                // A close-delimited body, then the socket dropped without close_notify.
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil-close")
                    .await;
                let _ = s.flush().await;
                return;
            }
            let body = "tls-upstream";
            let resp = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            if s.write_all(resp.as_bytes()).await.is_err() || s.flush().await.is_err() {
                return;
            }
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A plain listener "web" proxying to group "b" = the TLS upstream, with `group` lines in
/// `[upstreams.b]` and `tls` lines in `[upstreams.b.tls]` (after `ca_file`).
fn proxy(pki: &Pki, upstream: SocketAddr, group: &str, tls: &str) -> Running {
    proxy_with_route(pki, upstream, "", group, tls)
}

/// As [`proxy`], with `route` lines in the listener's route.
fn proxy_with_route(
    pki: &Pki,
    upstream: SocketAddr,
    route: &str,
    group: &str,
    tls: &str,
) -> Running {
    let toml = proxy_toml(pki, upstream, group, tls)
        .replace("proxy = \"b\"\n", &format!("proxy = \"b\"\n{route}\n"));
    let cfg =
        portico_config::parse(&toml, "tls-upstream-test.toml").unwrap_or_else(|e| panic!("{e}"));
    start(cfg, 1).expect("start")
}

fn proxy_toml(pki: &Pki, upstream: SocketAddr, group: &str, tls: &str) -> String {
    format!(
        r#"
[[listeners]]
name = "web"
address = "127.0.0.1:0"
[[listeners.routes]]
proxy = "b"
[upstreams.b]
servers = ["{upstream}"]
{group}
[upstreams.b.tls]
{ca}
{tls}
"#,
        // verify = false refuses a ca_file
        ca = if tls.contains("verify = false") {
            String::new()
        } else {
            format!("ca_file = \"{}\"", pki.dir.join("ca.pem").display())
        }
    )
}

/// Poll `done` until it holds, for at most 10 s.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn get(c: &mut Client) -> portico_testkit::Response {
    c.request(b"GET / HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .unwrap()
}

#[test]
fn https_upstream_is_verified_and_its_connection_reused() {
    let pki = pki("reuse");
    let up = TlsUpstream::start(&pki, false);
    let p = proxy(&pki, up.addr, "", "server_name = \"upstream.test\"");
    let mut c = Client::connect(p.addr("web").unwrap()).unwrap();
    for _ in 0..3 {
        let r = get(&mut c);
        assert_eq!(r.status, 200);
        assert_eq!(r.text(), "tls-upstream");
    }
    // One TLS connection carried all three requests.
    assert_eq!(up.accepts.load(Ordering::SeqCst), 1);
    let seen = up.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].sni.as_deref(), Some("upstream.test"));
    assert!(seen[0].client_cert.is_none());
    let stats = p.stats();
    assert_eq!(stats.upstream_reused.load(Ordering::Relaxed), 2);
    assert_eq!(stats.upstream_tls_full.load(Ordering::Relaxed), 1);
    p.shutdown();
    p.wait();
}

#[test]
fn default_server_name_is_the_ip_address_and_sessions_resume() {
    let pki = pki("resume");
    let up = TlsUpstream::start(&pki, false);
    // No server_name: the certificate is verified for 127.0.0.1 (no SNI for an IP address).
    // keepalive = 0: every request opens a new connection, which resumes the first session.
    let p = proxy(&pki, up.addr, "keepalive = 0", "");
    let mut c = Client::connect(p.addr("web").unwrap()).unwrap();
    for _ in 0..3 {
        assert_eq!(get(&mut c).status, 200);
    }
    assert_eq!(up.accepts.load(Ordering::SeqCst), 3);
    let kinds: Vec<HandshakeKind> = up.seen().iter().map(|s| s.kind).collect();
    assert_eq!(
        kinds,
        [
            HandshakeKind::Full,
            HandshakeKind::Resumed,
            HandshakeKind::Resumed
        ]
    );
    assert!(up.seen().iter().all(|s| s.sni.is_none()));
    assert_eq!(p.stats().upstream_tls_resumed.load(Ordering::Relaxed), 2);

    // A reload that keeps the group's TLS settings keeps its sessions: still resumed.
    let same =
        portico_config::parse(&proxy_toml(&pki, up.addr, "keepalive = 0", ""), "t.toml").unwrap();
    p.reload(same).unwrap();
    assert_eq!(get(&mut c).status, 200);
    assert_eq!(
        up.seen().last().unwrap().kind,
        HandshakeKind::Resumed,
        "{:?}",
        up.seen()
    );
    // Other settings (here the session cache size) start a new store: a full handshake.
    let other = portico_config::parse(
        &proxy_toml(&pki, up.addr, "keepalive = 0", "session_cache = 8"),
        "t.toml",
    )
    .unwrap();
    p.reload(other).unwrap();
    assert_eq!(get(&mut c).status, 200);
    assert_eq!(up.seen().last().unwrap().kind, HandshakeKind::Full);
    p.shutdown();
    p.wait();
}

#[test]
fn close_delimited_body_from_a_tls_upstream_without_close_notify() {
    let pki = pki("close");
    let up = TlsUpstream::start(&pki, false);
    let p = proxy(&pki, up.addr, "", "server_name = \"upstream.test\"");
    let mut c = Client::connect(p.addr("web").unwrap()).unwrap();
    let r = c
        .request(b"GET /close HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "until-close");
    p.shutdown();
    p.wait();
}

/// An h2c client (prior knowledge) on `addr`; the connection runs in its own task.
async fn h2c(addr: SocketAddr) -> h2::client::SendRequest<bytes::Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    client.ready().await.unwrap()
}

/// Status and body of an h2 response, or the stream's error.
async fn h2_read(resp: h2::client::ResponseFuture) -> Result<(u16, Vec<u8>), h2::Error> {
    let resp = resp.await?;
    let status = resp.status().as_u16();
    let mut body = resp.into_body();
    let mut out = Vec::new();
    while let Some(d) = body.data().await {
        let d = d?;
        let _ = body.flow_control().release_capacity(d.len());
        out.extend_from_slice(&d);
    }
    Ok((status, out))
}

#[tokio::test]
async fn h2_client_gets_a_close_delimited_tls_body_without_close_notify() {
    let pki = pki("h2close");
    let up = TlsUpstream::start(&pki, false);
    let p = proxy(&pki, up.addr, "", "server_name = \"upstream.test\"");
    let mut c = h2c(p.addr("web").unwrap()).await;
    let req = http::Request::get("http://app.test/close")
        .body(())
        .unwrap();
    let (resp, _) = c.send_request(req, true).unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), h2_read(resp))
        .await
        .expect("response in time");
    // END_STREAM, not RST_STREAM INTERNAL_ERROR.
    let (status, body) = got.expect("a clean end of stream");
    assert_eq!((status, body.as_slice()), (200, b"until-close".as_slice()));
    p.shutdown();
    tokio::task::spawn_blocking(move || p.wait()).await.unwrap();
}

/// POST `len` bytes (`content-length` set) from an h2c client to `addr`: the answer's status
/// and body, within 10 s.
async fn h2_upload(addr: SocketAddr, path: &str, len: usize) -> (u16, Vec<u8>) {
    let mut c = h2c(addr).await;
    let req = http::Request::post(format!("http://app.test{path}"))
        .header("content-length", len.to_string())
        .body(())
        .unwrap();
    let (resp, mut send) = c.send_request(req, false).unwrap();
    let upload = async move {
        let chunk = bytes::Bytes::from(vec![b'x'; 64 * 1024]);
        let mut left = len;
        while left > 0 {
            let n = left.min(chunk.len());
            send.reserve_capacity(n);
            // None: the stream ended early (the answer below says why).
            let Some(Ok(cap)) = std::future::poll_fn(|cx| send.poll_capacity(cx)).await else {
                break;
            };
            let n = cap.min(n);
            left -= n;
            send.send_data(chunk.slice(..n), left == 0).unwrap();
        }
    };
    let got = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(upload, h2_read(resp)).1
    })
    .await
    .expect("the upload's answer in time");
    got.unwrap()
}

/// How long [`late_reading_tls_upstream`] leaves each request body unread: far longer than
/// portico needs to write what its socket (and rustls) can take.
const UNREAD_FOR: Duration = Duration::from_millis(300);

/// An HTTPS/1.1 server that reads each request head, then leaves the body unread for
/// `UNREAD_FOR` (portico's socket fills: a 16 KiB receive buffer and 536-byte segments keep
/// what it takes to a few hundred KiB at most), then reads it all and answers with the number of
/// body bytes it got (`Connection: close`).
fn late_reading_tls_upstream(pki: &Pki) -> SocketAddr {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(pki.server_chain.clone(), pki.server_key.clone_key())
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    // Both are inherited by accepted sockets; the fixed receive buffer is not autotuned.
    socket.set_recv_buffer_size(16 * 1024).unwrap();
    socket.set_mss(536).unwrap();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    socket.bind(&any.into()).unwrap();
    socket.listen(8).unwrap();
    socket.set_nonblocking(true).unwrap();
    let listener: std::net::TcpListener = socket.into();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut s) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut buf = Vec::new();
                    let mut chunk = vec![0u8; 64 * 1024];
                    let end = loop {
                        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break end + 4;
                        }
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let text = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                    let len: usize = text
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length: "))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    let mut got = buf.len() - end;
                    tokio::time::sleep(UNREAD_FOR).await;
                    while got < len {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got += n,
                        }
                    }
                    let body = got.to_string();
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = s.write_all(resp.as_bytes()).await;
                    let _ = s.shutdown().await;
                });
            }
        });
    });
    addr
}

/// The last records of an HTTP/2 client's upload must leave rustls even when portico's socket
/// was full as they were written (the upload is flushed, commit 502720d). The server reads
/// nothing for a while: an upload a little larger than the socket takes ends with records
/// rustls could not write, and without the flush they stay there (the server waits for them,
/// portico for the answer: a 504). What the socket takes varies from one connection to the
/// next, so sizes from 48 KiB to 240 KiB in steps of 32 KiB are tried: without the flush, at
/// least one of them stalled in each of the runs tried (5 of 5).
#[tokio::test]
async fn h2_upload_tail_reaches_a_late_reading_tls_upstream() {
    let pki = pki("h2tail");
    let up = late_reading_tls_upstream(&pki);
    let p = proxy_with_route(
        &pki,
        up,
        "max_body = 0",
        "response_header_timeout = \"3s\"",
        "server_name = \"upstream.test\"",
    );
    for kib in (48..=240).step_by(32) {
        let len = kib * 1024;
        let (status, body) = h2_upload(p.addr("web").unwrap(), "/count", len).await;
        let body = String::from_utf8_lossy(&body);
        assert_eq!((status, &*body), (200, &*len.to_string()), "{kib} KiB");
    }
    p.shutdown();
    tokio::task::spawn_blocking(move || p.wait()).await.unwrap();
}

#[tokio::test]
async fn h2_client_uploads_a_large_body_to_a_tls_upstream() {
    let pki = pki("h2upload");
    let up = TlsUpstream::start(&pki, false);
    let p = proxy_with_route(
        &pki,
        up.addr,
        "max_body = 0",
        "",
        "server_name = \"upstream.test\"",
    );
    const LEN: usize = 2 << 20;
    let (status, body) = h2_upload(p.addr("web").unwrap(), "/count", LEN).await;
    assert_eq!((status, body), (200, LEN.to_string().into_bytes()));
    p.shutdown();
    tokio::task::spawn_blocking(move || p.wait()).await.unwrap();
}

#[test]
fn wrong_server_name_is_a_502_with_a_tls_termination() {
    let pki = pki("wrongname");
    let up = TlsUpstream::start(&pki, false);
    let p = proxy(&pki, up.addr, "", "server_name = \"other.test\"");
    let mut c = Client::connect(p.addr("web").unwrap()).unwrap();
    let r = get(&mut c);
    assert_eq!(r.status, 502);
    // The connection is refused by portico: the upstream never completes a handshake.
    assert!(up.seen().is_empty());
    let stats = p.stats();
    assert_eq!(stats.upstream_tls_failures.load(Ordering::Relaxed), 1);
    // The record is counted once the response is written: wait for it.
    let t = Termination::new(Side::Upstream, Phase::Connect, Cause::Tls);
    eventually("the TLS termination record", || stats.terminations(t) == 1);
    // Counted as a connect error for passive checks.
    let status = p.upstream("b").unwrap().status(Instant::now());
    assert_eq!(status[0].failures, 1, "{status:?}");
    assert_eq!(status[0].consecutive_failures, 1, "{status:?}");
    p.shutdown();
    p.wait();
}

#[test]
fn untrusted_upstream_certificate_is_refused() {
    let pki = pki("untrusted");
    let other = self::pki("untrusted-other");
    // The upstream's certificate comes from `other`'s CA; portico trusts `pki`'s.
    let up = TlsUpstream::start(&other, false);
    let p = proxy(&pki, up.addr, "", "server_name = \"upstream.test\"");
    let mut c = Client::connect(p.addr("web").unwrap()).unwrap();
    assert_eq!(get(&mut c).status, 502);
    assert_eq!(p.stats().upstream_tls_failures.load(Ordering::Relaxed), 1);
    p.shutdown();
    p.wait();
}

#[test]
fn verify_false_accepts_an_untrusted_upstream_certificate() {
    let other = pki("unverified");
    let up = TlsUpstream::start(&other, false);
    let pki = pki("unverified-ours");
    let p = proxy(&pki, up.addr, "", "verify = false");
    let mut c = Client::connect(p.addr("web").unwrap()).unwrap();
    let r = get(&mut c);
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "tls-upstream");
    p.shutdown();
    p.wait();
}

#[test]
fn client_certificate_is_presented_to_an_mtls_upstream() {
    let pki = pki("mtls");
    let up = TlsUpstream::start(&pki, true);
    let cert = format!(
        "server_name = \"upstream.test\"\ncertificate = {{ cert = \"{}\", key = \"{}\" }}",
        pki.dir.join("client.pem").display(),
        pki.dir.join("client.key").display()
    );
    let p = proxy(&pki, up.addr, "", &cert);
    let mut c = Client::connect(p.addr("web").unwrap()).unwrap();
    let r = get(&mut c);
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = up.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].client_cert.as_ref(), Some(&pki.client_cert));
    p.shutdown();
    p.wait();

    // Without it the upstream refuses the connection: a 502, never a 200.
    let p = proxy(&pki, up.addr, "", "server_name = \"upstream.test\"");
    let mut c = Client::connect(p.addr("web").unwrap()).unwrap();
    assert_eq!(get(&mut c).status, 502);
    eventually("the upstream refusing the handshake", || {
        up.failed.load(Ordering::SeqCst) > 0
    });
    p.shutdown();
    p.wait();
}

#[test]
fn health_probes_of_an_https_group_speak_tls() {
    let pki = pki("health");
    let up = TlsUpstream::start(&pki, false);
    let check = "health_check = { path = \"/healthz\", interval = \"200ms\", timeout = \"150ms\", rise = 1, fall = 1 }";
    let p = proxy(&pki, up.addr, check, "server_name = \"upstream.test\"");
    let last = |p: &Running| p.upstream("b").unwrap().status(Instant::now())[0].clone();
    eventually("an HTTP 200 probe over TLS", || {
        last(&p).last_check.is_some_and(|c| c.contains("HTTP 200"))
    });
    assert_eq!(last(&p).health, Health::Up);
    // No client sent anything: the handshakes the upstream saw are the probes'.
    let seen = up.seen();
    assert!(!seen.is_empty());
    assert!(seen
        .iter()
        .all(|s| s.sni.as_deref() == Some("upstream.test")));
    p.shutdown();
    p.wait();

    // A certificate that is not valid for the name takes the server down.
    let p = proxy(&pki, up.addr, check, "server_name = \"other.test\"");
    eventually("the server down after a failed TLS probe", || {
        let s = last(&p);
        s.health == Health::Down && s.last_check.is_some_and(|c| c.contains("TLS handshake"))
    });
    let mut c = Client::connect(p.addr("web").unwrap()).unwrap();
    assert_eq!(get(&mut c).status, 503);
    p.shutdown();
    p.wait();
}

/// A self-signed certificate for `localhost` and its key as PEM.
fn self_signed() -> (String, String, CertificateDer<'static>) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    (cert.pem(), key.serialize_pem(), cert.der().clone())
}

/// Replace `path` at once (write a temporary file, rename it over), as certificate tools do.
fn replace(path: &std::path::Path, content: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, content).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

type TlsClient = rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>;

/// A TLS connection to the listener trusting `roots`, without resumption (so every handshake
/// shows the certificate the listener serves now).
fn tls_connect(addr: SocketAddr, roots: &[CertificateDer<'static>]) -> TlsClient {
    let mut store = rustls::RootCertStore::empty();
    for r in roots {
        store.add(r.clone()).unwrap();
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(store)
    .with_no_client_auth();
    cfg.resumption = rustls::client::Resumption::disabled();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(cfg), name).unwrap();
    let tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut s = rustls::StreamOwned::new(conn, tcp);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock).unwrap();
    }
    s
}

/// One GET on a TLS connection: the status.
fn tls_get(s: &mut TlsClient) -> u16 {
    use std::io::{Read, Write};
    s.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
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
    head[9..12].parse().unwrap()
}

fn served_certificate(
    addr: SocketAddr,
    roots: &[CertificateDer<'static>],
) -> CertificateDer<'static> {
    let s = tls_connect(addr, roots);
    s.conn.peer_certificates().unwrap()[0].clone()
}

#[test]
fn listener_certificate_files_are_watched_and_swapped_without_dropping_connections() {
    let dir = std::env::temp_dir().join(format!("portico-tlsup-watch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (cert_path, key_path) = (dir.join("site.pem"), dir.join("site.key"));
    let (a_pem, a_key, a_der) = self_signed();
    let (b_pem, b_key, b_der) = self_signed();
    std::fs::write(&cert_path, &a_pem).unwrap();
    std::fs::write(&key_path, &a_key).unwrap();
    let roots = [a_der.clone(), b_der.clone()];

    let up = portico_testkit::TestUpstream::start(|_| portico_testkit::Reply::ok("hello"));
    let toml = format!(
        r#"
[[listeners]]
name = "tls"
address = "127.0.0.1:0"
[listeners.tls]
certificates = [{{ cert = "{}", key = "{}" }}]
watch_interval = "50ms"
[[listeners.routes]]
proxy = "b"
[upstreams.b]
servers = ["{}"]
"#,
        cert_path.display(),
        key_path.display(),
        up.addr
    );
    let cfg = portico_config::parse(&toml, "watch-test.toml").unwrap_or_else(|e| panic!("{e}"));
    let p = start(cfg, 1).expect("start");
    let addr = p.addr("tls").unwrap();

    // A connection opened with certificate A.
    let mut old = tls_connect(addr, &roots);
    assert_eq!(old.conn.peer_certificates().unwrap()[0], a_der);
    assert_eq!(tls_get(&mut old), 200);

    // Certificate B replaces A on disk: new handshakes get B, without a reload.
    replace(&key_path, &b_key);
    replace(&cert_path, &b_pem);
    eventually("new handshakes serving the new certificate", || {
        served_certificate(addr, &roots) == b_der
    });
    // Counted just after the swap (the handshake above may see the new one first).
    eventually("the reload counted", || {
        p.stats().tls_certificate_reloads.load(Ordering::Relaxed) >= 1
    });
    // The connection opened before carries on.
    assert_eq!(tls_get(&mut old), 200);
    assert_eq!(tls_get(&mut old), 200);

    // A broken replacement is refused and B stays.
    let failures = p
        .stats()
        .tls_certificate_reload_failures
        .load(Ordering::Relaxed);
    replace(
        &cert_path,
        "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n",
    );
    eventually("the broken certificate refused", || {
        p.stats()
            .tls_certificate_reload_failures
            .load(Ordering::Relaxed)
            > failures
    });
    assert_eq!(served_certificate(addr, &roots), b_der);
    let mut new = tls_connect(addr, &roots);
    assert_eq!(tls_get(&mut new), 200);
    assert_eq!(tls_get(&mut old), 200);

    // Fixed again (A this time): loaded.
    replace(&key_path, &a_key);
    replace(&cert_path, &a_pem);
    eventually("the fixed certificate loaded", || {
        served_certificate(addr, &roots) == a_der
    });
    p.shutdown();
    p.wait();
}

#[test]
fn a_reload_rereads_the_certificate_files_of_an_unwatched_listener() {
    let dir = std::env::temp_dir().join(format!("portico-tlsup-nowatch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (cert_path, key_path) = (dir.join("site.pem"), dir.join("site.key"));
    let (a_pem, a_key, a_der) = self_signed();
    let (b_pem, b_key, b_der) = self_signed();
    std::fs::write(&cert_path, &a_pem).unwrap();
    std::fs::write(&key_path, &a_key).unwrap();
    let roots = [a_der.clone(), b_der.clone()];
    let toml = format!(
        r#"
[[listeners]]
name = "tls"
address = "127.0.0.1:0"
[listeners.tls]
certificates = [{{ cert = "{}", key = "{}" }}]
watch = false
[[listeners.routes]]
respond = {{ status = 200, body = "ok" }}
"#,
        cert_path.display(),
        key_path.display(),
    );
    let cfg = portico_config::parse(&toml, "nowatch-test.toml").unwrap_or_else(|e| panic!("{e}"));
    let p = start(cfg.clone(), 1).expect("start");
    let addr = p.addr("tls").unwrap();
    assert_eq!(served_certificate(addr, &roots), a_der);
    // A reload (SIGHUP, the admin API) re-reads the files.
    replace(&key_path, &b_key);
    replace(&cert_path, &b_pem);
    p.reload(cfg).unwrap();
    assert_eq!(served_certificate(addr, &roots), b_der);
    p.shutdown();
    p.wait();
}

#[test]
fn host_is_the_server_name_when_the_client_host_is_not_preserved() {
    let pki = pki("host");
    let up = TlsUpstream::start(&pki, false);
    let p = proxy_with_route(
        &pki,
        up.addr,
        "preserve_host = false",
        "",
        "server_name = \"upstream.test\"",
    );
    let mut c = Client::connect(p.addr("web").unwrap()).unwrap();
    let r = c
        .request(b"GET /echo-host HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), format!("upstream.test:{}", up.addr.port()));
    p.shutdown();
    p.wait();
}

#[tokio::test]
async fn http2_streams_count_tls_handshake_failures_as_http1_requests_do() {
    let pki = pki("h2-wrongname");
    let up = TlsUpstream::start(&pki, false);
    let p = proxy(&pki, up.addr, "", "server_name = \"other.test\"");
    let tcp = tokio::net::TcpStream::connect(p.addr("web").unwrap())
        .await
        .unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    let _conn = tokio::spawn(conn);
    let mut c = client.ready().await.unwrap();
    let req = http::Request::get("http://app.test/").body(()).unwrap();
    let (resp, _) = c.send_request(req, true).unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), resp)
        .await
        .expect("response in time")
        .unwrap();
    assert_eq!(resp.status(), 502);
    assert!(up.seen().is_empty());
    let stats = p.stats();
    assert_eq!(stats.upstream_tls_failures.load(Ordering::Relaxed), 1);
    let t = Termination::new(Side::Upstream, Phase::Connect, Cause::Tls);
    let deadline = Instant::now() + Duration::from_secs(10);
    while stats.terminations(t) != 1 {
        assert!(Instant::now() < deadline, "no TLS termination record");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
