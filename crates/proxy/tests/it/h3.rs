//! HTTP/3 end to end: a quinn + h3 client through Portico's QUIC listener to an HTTP/1.1 upstream (bodies, trailers, errors, concurrent streams, drain), and Alt-Svc on the TCP side.

use crate::common::{closed_port, start_toml, T};
use bytes::{Buf, Bytes};
use portico_proxy::Running;
use portico_testkit::{Reply, TestUpstream};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

/// A self-signed certificate for `localhost` under `dir`: (cert path, key path, DER).
fn cert(dir: &Path) -> (String, String, rustls::pki_types::CertificateDer<'static>) {
    let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cp, kp) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cp, c.cert.pem()).unwrap();
    std::fs::write(&kp, c.key_pair.serialize_pem()).unwrap();
    (
        cp.display().to_string(),
        kp.display().to_string(),
        c.cert.der().clone(),
    )
}

/// The configuration of one TLS listener with the certificate files under `dir`: `http3`, the
/// `[listeners.http3]` table's text (None: no HTTP/3), and its routes `routes` (TOML).
fn text(dir: &Path, http3: Option<&str>, routes: &str) -> String {
    let (c, k) = (dir.join("cert.pem"), dir.join("key.pem"));
    let (c, k) = (c.display(), k.display());
    let log = dir.join("access.log").display().to_string();
    let http3 = http3.map_or(String::new(), |h| format!("[listeners.http3]\n{h}"));
    format!(
        r#"
[access_log]
path = "{log}"
format = "json"

[[listeners]]
name = "quic"
address = "127.0.0.1:0"
[listeners.tls]
certificates = [{{ cert = "{c}", key = "{k}" }}]
{http3}
{routes}
"#
    )
}

/// A proxy with one TLS listener serving HTTP/3 (`http3`: the settings), its routes `routes`.
fn proxy(
    dir: &Path,
    http3: &str,
    routes: &str,
) -> (Running, rustls::pki_types::CertificateDer<'static>) {
    let (_, _, der) = cert(dir);
    (start_toml(&text(dir, Some(http3), routes), 1), der)
}

type Sender = h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>;

/// A QUIC client endpoint trusting `ca`, ALPN h3; `early`: it sends 0-RTT data when it resumes.
fn endpoint(ca: &rustls::pki_types::CertificateDer<'static>, early: bool) -> quinn::Endpoint {
    endpoint_with(ca, early, rustls::crypto::ring::default_provider())
}

/// [`endpoint`] with the key exchange groups (and the rest) of `provider`.
fn endpoint_with(
    ca: &rustls::pki_types::CertificateDer<'static>,
    early: bool,
    provider: rustls::crypto::CryptoProvider,
) -> quinn::Endpoint {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let provider = Arc::new(provider);
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    tls.enable_early_data = early;
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(quic)));
    endpoint
}

/// HTTP/3 over `conn`, its driver in a task of its own.
async fn h3_over(conn: quinn::Connection) -> Sender {
    let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn))
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
    });
    send
}

/// An HTTP/3 client connection to `addr` trusting `ca`.
async fn client(
    addr: SocketAddr,
    ca: &rustls::pki_types::CertificateDer<'static>,
) -> (quinn::Endpoint, Sender) {
    let endpoint = endpoint(ca, false);
    let conn = tokio::time::timeout(T, endpoint.connect(addr, "localhost").unwrap())
        .await
        .expect("QUIC handshake in time")
        .expect("QUIC handshake");
    (endpoint, h3_over(conn).await)
}

/// One request: status, selected response fields, body, trailers.
struct Got {
    status: u16,
    headers: http::HeaderMap,
    body: Vec<u8>,
    trailers: Option<http::HeaderMap>,
}

async fn request(send: &mut Sender, method: &str, path: &str, body: Option<Vec<u8>>) -> Got {
    let mut req = http::Request::builder()
        .method(method)
        .uri(format!("https://localhost{path}"));
    if let Some(b) = &body {
        req = req.header("content-length", b.len());
    }
    let work = async {
        let mut stream = send.send_request(req.body(()).unwrap()).await.unwrap();
        if let Some(b) = body {
            for chunk in b.chunks(16 * 1024) {
                stream
                    .send_data(Bytes::copy_from_slice(chunk))
                    .await
                    .unwrap();
            }
        }
        stream.finish().await.unwrap();
        let resp = stream.recv_response().await.unwrap();
        let mut out = Vec::new();
        while let Some(mut d) = stream.recv_data().await.unwrap() {
            out.extend_from_slice(&d.copy_to_bytes(d.remaining()));
        }
        let trailers = stream.recv_trailers().await.unwrap();
        Got {
            status: resp.status().as_u16(),
            headers: resp.headers().clone(),
            body: out,
            trailers,
        }
    };
    tokio::time::timeout(T, work)
        .await
        .expect("response in time")
}

fn routes_to(upstream: SocketAddr) -> String {
    format!(
        r#"
[[listeners.routes]]
name = "api"
proxy = "app"
[upstreams.app]
servers = ["{upstream}"]
"#
    )
}

#[tokio::test(flavor = "current_thread")]
async fn requests_bodies_trailers_and_errors_over_http3() {
    let dir = tempfile::tempdir().unwrap();
    let up = TestUpstream::start(|r| {
        match r.target.as_str() {
        "/trailers" => Reply::Raw(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: x-checksum\r\n\r\n3\r\nabc\r\n0\r\nx-checksum: 42\r\n\r\n".to_vec(),
        ),
        "/echo" => Reply::Respond {
            status: 201,
            headers: vec![("x-got".into(), r.body.len().to_string())],
            body: r.body.clone(),
            chunked: false,
        },
        "/cut" => {
            let mut raw = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n".to_vec();
            raw.extend_from_slice(&[b'c'; 50_000]);
            Reply::RawThenClose(raw)
        }
        "/missing" => Reply::Respond {
            status: 404,
            headers: vec![],
            body: b"nope".to_vec(),
            chunked: false,
        },
        _ => Reply::ok(&format!("{} {}", r.method, r.target)),
    }
    });
    let dead = closed_port();
    let routes = format!(
        r#"
[[listeners.routes]]
name = "dead"
path = "/dead/**"
proxy = "dead"
{}
[upstreams.dead]
servers = ["{dead}"]
"#,
        routes_to(up.addr)
    );
    let (p, ca) = proxy(dir.path(), "", &routes);
    let addr = p.addr("quic").unwrap();
    let (_endpoint, mut send) = client(addr, &ca).await;

    let g = request(&mut send, "GET", "/hello?x=1", None).await;
    assert_eq!(g.status, 200);
    assert_eq!(g.body, b"GET /hello?x=1");
    // A body-less GET goes upstream without a body or chunked framing.
    let seen = up.requests();
    let last = seen.last().unwrap();
    assert_eq!(last.header("transfer-encoding"), None);
    assert_eq!(last.header("x-forwarded-proto"), Some("https"));
    assert_eq!(last.header("host"), Some("localhost"));

    for size in [0usize, 1024, 1024 * 1024] {
        let body: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let g = request(&mut send, "POST", "/echo", Some(body.clone())).await;
        assert_eq!(g.status, 201, "POST of {size} bytes");
        assert_eq!(g.headers["x-got"], size.to_string().as_str());
        assert_eq!(g.body, body, "echoed body of {size} bytes");
    }

    let g = request(&mut send, "GET", "/trailers", None).await;
    assert_eq!(g.body, b"abc");
    assert_eq!(g.trailers.expect("trailers")["x-checksum"], "42");

    // A body the server cuts short is a reset stream, never a response that looks whole.
    let cut = async {
        let req = http::Request::get("https://localhost/cut")
            .body(())
            .unwrap();
        let mut stream = send.send_request(req).await.unwrap();
        stream.finish().await.unwrap();
        // The reset may overtake the head (a reset stream's unread data is discarded).
        match stream.recv_response().await {
            Ok(r) => assert_eq!(r.status(), 200),
            Err(_) => return 0,
        }
        let mut n = 0;
        loop {
            match stream.recv_data().await {
                Ok(Some(mut d)) => n += d.copy_to_bytes(d.remaining()).len(),
                Ok(None) => panic!("a cut body ended cleanly after {n} bytes"),
                Err(_) => return n,
            }
        }
    };
    let n = tokio::time::timeout(T, cut).await.expect("in time");
    assert!(n <= 50_000, "{n}");

    let g = request(&mut send, "GET", "/missing", None).await;
    assert_eq!((g.status, g.body.as_slice()), (404, &b"nope"[..]));

    let g = request(&mut send, "GET", "/dead/x", None).await;
    assert_eq!(g.status, 502);

    // Twenty streams at once on the one connection.
    let mut all = Vec::new();
    for i in 0..20 {
        let mut s = send.clone();
        all.push(tokio::spawn(async move {
            request(&mut s, "GET", &format!("/n/{i}"), None).await
        }));
    }
    for (i, h) in all.into_iter().enumerate() {
        let g = h.await.unwrap();
        assert_eq!(g.body, format!("GET /n/{i}").as_bytes());
    }
    let stats = p.stats();
    assert_eq!(
        stats
            .h3_connections
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    // Each stream's access-log line names HTTP/3 and its connection's round-trip time.
    let log = dir.path().join("access.log");
    let line = crate::common::wait_for("the access-log line", || {
        let text = std::fs::read_to_string(&log).ok()?;
        text.lines()
            .find(|l| l.contains("/hello?x=1"))
            .map(str::to_string)
    });
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["protocol"], "HTTP/3.0", "{line}");
    assert_eq!(v["tls_version"], "TLSv1.3", "{line}");
    assert!(v["rtt_ms"].as_f64().is_some_and(|r| r >= 0.0), "{line}");
    assert!(v["lost_packets"].as_u64().is_some(), "{line}");
}

/// The response head of one HTTP/1.1 GET over TLS (ALPN http/1.1) to `addr`.
fn https_head(addr: SocketAddr, ca: &rustls::pki_types::CertificateDer<'static>) -> String {
    use std::io::{Read, Write};
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(cfg), name).unwrap();
    let tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(T)).unwrap();
    let mut s = rustls::StreamOwned::new(conn, tcp);
    s.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    let text = String::from_utf8_lossy(&all).to_string();
    text.split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "current_thread")]
async fn alt_svc_advertises_the_udp_port_on_tcp_responses() {
    let dir = tempfile::tempdir().unwrap();
    let up = TestUpstream::start(|_| Reply::ok("tcp"));
    let (p, ca) = proxy(dir.path(), "alt_svc_max_age = \"1h\"", &routes_to(up.addr));
    let addr = p.addr("quic").unwrap();
    let head = tokio::task::spawn_blocking(move || https_head(addr, &ca))
        .await
        .unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let want = format!("alt-svc: h3=\":{}\"; ma=3600", addr.port());
    assert!(
        head.to_ascii_lowercase().contains(&want),
        "{want} in\n{head}"
    );
    drop(p);

    let dir = tempfile::tempdir().unwrap();
    let (p, ca) = proxy(dir.path(), "alt_svc_max_age = \"0s\"", &routes_to(up.addr));
    let addr = p.addr("quic").unwrap();
    let head = tokio::task::spawn_blocking(move || https_head(addr, &ca))
        .await
        .unwrap();
    assert!(!head.to_ascii_lowercase().contains("alt-svc"), "{head}");
}

#[tokio::test(flavor = "current_thread")]
async fn every_new_client_proves_its_address_with_a_retry_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let up = TestUpstream::start(|_| Reply::ok("validated"));
    let (p, ca) = proxy(dir.path(), "validate_above = 0", &routes_to(up.addr));
    let (_e, mut send) = client(p.addr("quic").unwrap(), &ca).await;
    let g = request(&mut send, "GET", "/", None).await;
    assert_eq!(g.body, b"validated");
    let retries = p
        .stats()
        .h3_retries
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(retries, 1, "one Retry for the one handshake");

    // The default threshold lets a single handshake through without one.
    let dir = tempfile::tempdir().unwrap();
    let (p, ca) = proxy(dir.path(), "", &routes_to(up.addr));
    let (_e, mut send) = client(p.addr("quic").unwrap(), &ca).await;
    assert_eq!(request(&mut send, "GET", "/", None).await.status, 200);
    assert_eq!(
        p.stats()
            .h3_retries
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

#[tokio::test(flavor = "current_thread")]
async fn shutdown_sends_goaway_and_lets_the_request_in_flight_finish() {
    let dir = tempfile::tempdir().unwrap();
    let hold = portico_testkit::Hold::new();
    let h = hold.clone();
    // A body larger than the client's stream window: much of it is still to go when the
    // connection's last request ends, and must not be cut by the close.
    let up = TestUpstream::start(move |_| {
        h.wait();
        Reply::ok(&"finished".repeat(512 * 1024))
    });
    let (p, ca) = proxy(dir.path(), "", &routes_to(up.addr));
    let (_e, send) = client(p.addr("quic").unwrap(), &ca).await;
    let mut s = send.clone();
    let inflight = tokio::spawn(async move { request(&mut s, "GET", "/slow", None).await });
    let h = hold.clone();
    assert!(tokio::task::spawn_blocking(move || h.wait_held(1))
        .await
        .unwrap());
    p.shutdown();
    // The connection's GOAWAY arrives: the client refuses new requests on it.
    let mut s = send.clone();
    let refused = async {
        loop {
            let req = http::Request::get("https://localhost/new")
                .body(())
                .unwrap();
            if s.send_request(req).await.is_err() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(T, refused)
        .await
        .expect("GOAWAY in time");
    hold.open();
    let g = inflight.await.unwrap();
    assert_eq!(g.status, 200);
    assert!(
        g.body == "finished".repeat(512 * 1024).as_bytes(),
        "{} bytes",
        g.body.len()
    );
    tokio::task::spawn_blocking(move || p.wait()).await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn a_stream_reset_flood_closes_the_connection_with_excessive_load() {
    let dir = tempfile::tempdir().unwrap();
    // Bodies larger than the client's stream window: each response waits on the client, which
    // stops reading it.
    let big = vec![b'x'; 4 << 20];
    let up = TestUpstream::start(move |_| Reply::Respond {
        status: 200,
        headers: vec![],
        body: big.clone(),
        chunked: false,
    });
    let (p, ca) = proxy(dir.path(), "max_resets = 3", &routes_to(up.addr));
    let (_e, mut send) = client(p.addr("quic").unwrap(), &ca).await;
    let flood = async {
        for _ in 0..50 {
            let req = http::Request::get("https://localhost/big")
                .body(())
                .unwrap();
            let Ok(mut stream) = send.send_request(req).await else {
                return;
            };
            if stream.finish().await.is_err() || stream.recv_response().await.is_err() {
                return;
            }
            stream.stop_sending(h3::error::Code::H3_REQUEST_CANCELLED);
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("the connection outlived 50 reset streams");
    };
    tokio::time::timeout(T, flood)
        .await
        .expect("closed in time");
    let floods = || {
        p.stats()
            .h3_reset_floods
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    crate::common::until("the flood counted", || floods() == 1).await;
}

/// What a test forwarder does to the datagrams it passes on.
#[derive(Clone, Default)]
struct Damage {
    /// Drop every n-th datagram (each way; 0: none).
    drop_every: u64,
    /// Hold every n-th back until the next passes it (each way; 0: none).
    swap_every: u64,
    /// Hold the client's QUIC Handshake packets this long (its handshake completes late).
    hold_handshake: std::time::Duration,
    /// Drop the client's second datagram if it is an Initial one (the rest of a ClientHello
    /// too large for one datagram), and say so here; and the server's first (its
    /// acknowledgement of the first half), so that the client resends only after a probe
    /// timeout.
    split_hello: Option<Arc<std::sync::atomic::AtomicBool>>,
}

/// Whether a datagram starts with a QUIC Initial packet (long header, type 0).
fn is_initial(d: &[u8]) -> bool {
    d.first()
        .is_some_and(|b| b & 0x80 != 0 && (b >> 4) & 0x3 == 0)
}

/// Whether a datagram carries a QUIC Handshake packet (the client's Finished): its coalesced
/// long-header packets (RFC 9000 17.2) are walked by their lengths.
fn carries_handshake(mut d: &[u8]) -> bool {
    fn varint(d: &[u8]) -> Option<(u64, usize)> {
        let len = 1usize << (d.first()? >> 6);
        let mut v = u64::from(d[0] & 0x3f);
        for b in d.get(1..len)? {
            v = (v << 8) | u64::from(*b);
        }
        Some((v, len))
    }
    while let Some(&first) = d.first() {
        if first & 0x80 == 0 {
            return false; // a short header runs to the end of the datagram
        }
        let kind = (first >> 4) & 0x3;
        if kind == 2 {
            return true;
        }
        let walk = || -> Option<usize> {
            let dcid = usize::from(*d.get(5)?);
            let mut at = 6 + dcid;
            let scid = usize::from(*d.get(at)?);
            at += 1 + scid;
            if kind == 0 {
                let (token, n) = varint(d.get(at..)?)?;
                at += n + usize::try_from(token).ok()?;
            }
            let (len, n) = varint(d.get(at..)?)?;
            Some(at + n + usize::try_from(len).ok()?)
        };
        match walk() {
            Some(next) if next <= d.len() => d = &d[next..],
            _ => return false,
        }
    }
    false
}

/// A UDP forwarder between one client and `to` that damages datagrams as `damage` says; its
/// address.
async fn forwarder(to: SocketAddr, damage: Damage) -> SocketAddr {
    let front = Arc::new(tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap());
    let back = Arc::new(tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap());
    back.connect(to).await.unwrap();
    let addr = front.local_addr().unwrap();
    let client: Arc<std::sync::Mutex<Option<SocketAddr>>> = Arc::default();
    for up in [true, false] {
        let (front, back, client) = (front.clone(), back.clone(), client.clone());
        let damage = damage.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 65536];
            let mut held: Option<Vec<u8>> = None;
            let mut n = 0u64;
            let every = |k: u64, n: u64| k > 0 && n.is_multiple_of(k);
            loop {
                let got = if up {
                    front.recv_from(&mut buf).await.map(|(len, from)| {
                        *client.lock().unwrap() = Some(from);
                        len
                    })
                } else {
                    back.recv(&mut buf).await
                };
                let Ok(len) = got else { return };
                n += 1;
                if every(damage.drop_every, n) {
                    continue;
                }
                let d = buf[..len].to_vec();
                match (up, n, &damage.split_hello) {
                    (true, 2, Some(flag)) if is_initial(&d) => {
                        flag.store(true, std::sync::atomic::Ordering::Relaxed);
                        continue;
                    }
                    (false, 1, Some(_)) => continue,
                    _ => {}
                }
                if up && !damage.hold_handshake.is_zero() && carries_handshake(&d) {
                    let (back, wait) = (back.clone(), damage.hold_handshake);
                    tokio::spawn(async move {
                        tokio::time::sleep(wait).await;
                        let _ = back.send(&d).await;
                    });
                    continue;
                }
                if every(damage.swap_every, n) && held.is_none() {
                    held = Some(d);
                    continue;
                }
                let mut out = vec![d];
                out.extend(held.take());
                let to = *client.lock().unwrap();
                for d in out {
                    match (up, to) {
                        (true, _) => drop(back.send(&d).await),
                        (false, Some(c)) => drop(front.send_to(&d, c).await),
                        (false, None) => {}
                    }
                }
            }
        });
    }
    addr
}

#[tokio::test(flavor = "current_thread")]
async fn requests_complete_through_loss_and_reordering() {
    let dir = tempfile::tempdir().unwrap();
    let up = TestUpstream::start(|r| Reply::Respond {
        status: 200,
        headers: vec![],
        body: if r.method == "POST" {
            r.body.clone()
        } else {
            vec![b'z'; 200_000]
        },
        chunked: false,
    });
    let (p, ca) = proxy(dir.path(), "", &routes_to(up.addr));
    // One datagram in 20 lost, one in 7 overtaken by the next, each way.
    let damage = Damage {
        drop_every: 20,
        swap_every: 7,
        ..Damage::default()
    };
    let via = forwarder(p.addr("quic").unwrap(), damage).await;
    let (_e, send) = client(via, &ca).await;
    let body: Vec<u8> = (0..300_000).map(|i| (i % 253) as u8).collect();
    let mut all = Vec::new();
    for i in 0..12 {
        let (mut s, body) = (send.clone(), body.clone());
        all.push(tokio::spawn(async move {
            match i % 3 {
                0 => {
                    let g = request(&mut s, "POST", "/up", Some(body.clone())).await;
                    assert_eq!(g.body, body, "echoed through the losses");
                }
                _ => {
                    let g = request(&mut s, "GET", &format!("/down/{i}"), None).await;
                    assert_eq!(g.body.len(), 200_000);
                }
            }
        }));
    }
    for h in all {
        h.await.unwrap();
    }
    let lost = p
        .stats()
        .h3_connections
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(lost, 1, "one connection carried everything");
}

#[tokio::test(flavor = "current_thread")]
async fn a_reload_keeps_the_connection_and_turning_http3_off_drains_it() {
    let dir = tempfile::tempdir().unwrap();
    let hold = portico_testkit::Hold::new();
    let h = hold.clone();
    let up = TestUpstream::start(move |_| {
        h.wait();
        Reply::ok("slow")
    });
    let answer = |b: &str| {
        format!(
            "[[listeners.routes]]\npath = \"/slow\"\nproxy = \"app\"\n\
             [[listeners.routes]]\nrespond = {{ status = 200, body = \"{b}\" }}\n\
             [upstreams.app]\nservers = [\"{}\"]\n",
            up.addr
        )
    };
    let (p, ca) = proxy(dir.path(), "", &answer("one"));
    let (_e, mut send) = client(p.addr("quic").unwrap(), &ca).await;
    assert_eq!(request(&mut send, "GET", "/", None).await.body, b"one");
    // Same listener, new routes and HTTP/3 settings: the open connection serves the new ones.
    let parse = |t: &str| portico_config::parse(t, "reload.toml").unwrap();
    let next = text(dir.path(), Some("alt_svc_max_age = \"1h\""), &answer("two"));
    p.reload(parse(&next)).unwrap();
    assert_eq!(request(&mut send, "GET", "/", None).await.body, b"two");
    let conns = || {
        p.stats()
            .h3_connections
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    assert_eq!(conns(), 1);
    // HTTP/3 off, with a request in flight: the listener is bound anew without UDP, the old
    // connection takes no new request (GOAWAY) and its request in flight finishes.
    let mut s = send.clone();
    let inflight = tokio::spawn(async move { request(&mut s, "GET", "/slow", None).await });
    let h = hold.clone();
    assert!(tokio::task::spawn_blocking(move || h.wait_held(1))
        .await
        .unwrap());
    let off = text(dir.path(), None, &answer("three"));
    let summary = p.reload(parse(&off)).unwrap();
    assert_eq!(summary.added, vec!["quic".to_string()], "{summary:?}");
    let refused = async {
        loop {
            let req = http::Request::get("https://localhost/").body(()).unwrap();
            if send.send_request(req).await.is_err() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(T, refused)
        .await
        .expect("GOAWAY in time");
    hold.open();
    let g = inflight.await.unwrap();
    assert_eq!((g.status, g.body.as_slice()), (200, &b"slow"[..]));
    assert_eq!(conns(), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn a_connection_closed_after_its_last_request_delivers_it_whole_through_loss() {
    let dir = tempfile::tempdir().unwrap();
    let up = TestUpstream::start(|_| Reply::ok(&"w".repeat(300_000)));
    // One request per connection: the proxy closes each connection right after its response.
    let routes = format!(
        "[listeners.limits]\nmax_requests_per_connection = 1\n{}",
        routes_to(up.addr)
    );
    let (p, ca) = proxy(dir.path(), "", &routes);
    let damage = Damage {
        drop_every: 9,
        swap_every: 5,
        ..Damage::default()
    };
    let via = forwarder(p.addr("quic").unwrap(), damage).await;
    let client = endpoint(&ca, false);
    for i in 0..3 {
        let conn = tokio::time::timeout(T, client.connect(via, "localhost").unwrap())
            .await
            .unwrap()
            .unwrap();
        let mut send = h3_over(conn).await;
        let g = request(&mut send, "GET", &format!("/last/{i}"), None).await;
        assert_eq!(g.body.len(), 300_000, "response {i} whole");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn zero_rtt_requests_are_marked_early_and_unsafe_ones_refused_425() {
    let dir = tempfile::tempdir().unwrap();
    let up = TestUpstream::start(|r| {
        Reply::ok(&format!("early={}", r.header("early-data").unwrap_or("-")))
    });
    let (p, ca) = proxy(dir.path(), "early_data = true", &routes_to(up.addr));
    // The client's Handshake packets (its Finished) are held 400 ms: what it sends meanwhile
    // is early data, and the proxy sees it before the handshake completes.
    let damage = Damage {
        hold_handshake: std::time::Duration::from_millis(400),
        ..Damage::default()
    };
    let via = forwarder(p.addr("quic").unwrap(), damage).await;
    let client = endpoint(&ca, true);
    // A first connection leaves a session ticket that allows 0-RTT.
    let first = tokio::time::timeout(T, client.connect(via, "localhost").unwrap())
        .await
        .unwrap()
        .unwrap();
    let mut send = h3_over(first.clone()).await;
    assert_eq!(request(&mut send, "GET", "/", None).await.body, b"early=-");
    first.close(0u32.into(), b"");
    let (conn, accepted) = client
        .connect(via, "localhost")
        .unwrap()
        .into_0rtt()
        .unwrap_or_else(|_| panic!("no 0-RTT: the first connection left no ticket for it"));
    let mut send = h3_over(conn).await;
    let (mut a, mut b) = (send.clone(), send.clone());
    let (get, post) = tokio::join!(
        request(&mut a, "GET", "/early", None),
        request(&mut b, "POST", "/early", Some(b"x".to_vec())),
    );
    assert_eq!(get.body, b"early=1", "a safe method goes on, marked");
    assert_eq!(post.status, 425, "an unsafe one waits for the handshake");
    assert!(
        tokio::time::timeout(T, accepted).await.unwrap(),
        "0-RTT accepted"
    );
    // Sent in 1-RTT (the client's side of the handshake is complete), it is read only once the
    // proxy's is (its Finished, held, has come): not early.
    let again = request(&mut send, "POST", "/late", Some(b"x".to_vec())).await;
    assert_eq!(
        (again.status, again.body.as_slice()),
        (200, &b"early=-"[..])
    );
    assert!(up
        .requests()
        .iter()
        .all(|r| r.method != "POST" || r.target == "/late"));
}

#[tokio::test(flavor = "current_thread")]
async fn early_data_listener_serves_a_client_whose_split_client_hello_lost_a_datagram() {
    let dir = tempfile::tempdir().unwrap();
    let up = TestUpstream::start(|_| Reply::ok("ok"));
    let (p, ca) = proxy(dir.path(), "early_data = true", &routes_to(up.addr));
    let lost = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let damage = Damage {
        split_hello: Some(lost.clone()),
        ..Damage::default()
    };
    let via = forwarder(p.addr("quic").unwrap(), damage).await;
    // A post-quantum key share (X25519MLKEM768 first) makes the ClientHello outgrow a datagram.
    let e = endpoint_with(&ca, false, portico_tls::base_provider());
    let t0 = std::time::Instant::now();
    let conn = tokio::time::timeout(T, e.connect(via, "localhost").unwrap())
        .await
        .unwrap()
        .unwrap();
    let mut send = h3_over(conn).await;
    let g = request(&mut send, "GET", "/", None).await;
    assert_eq!((g.status, g.body.as_slice()), (200, &b"ok"[..]));
    assert!(
        lost.load(std::sync::atomic::Ordering::Relaxed),
        "the ClientHello took one datagram: nothing was lost"
    );
    // The lost half comes again after the client's first probe timeout (about a second).
    // Served before it, the connection's control streams waited for the head timeout (10 s).
    let took = t0.elapsed();
    assert!(took < std::time::Duration::from_secs(5), "{took:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn early_data_listener_serves_a_client_after_a_hello_retry_request() {
    let dir = tempfile::tempdir().unwrap();
    let up = TestUpstream::start(|_| Reply::ok("ok"));
    let (_, _, ca) = cert(dir.path());
    // The client's key share is X25519 (ring's first group); the listener takes only
    // secp256r1, so it asks for another ClientHello, which brings the transport parameters.
    let toml = text(dir.path(), Some("early_data = true"), &routes_to(up.addr)).replace(
        "[listeners.tls]\n",
        "[listeners.tls]\ngroups = [\"secp256r1\"]\n",
    );
    assert!(toml.contains("secp256r1"), "{toml}");
    let p = start_toml(&toml, 1);
    let t0 = std::time::Instant::now();
    let (_e, mut send) = client(p.addr("quic").unwrap(), &ca).await;
    let g = request(&mut send, "GET", "/", None).await;
    assert_eq!((g.status, g.body.as_slice()), (200, &b"ok"[..]));
    // Set up before the parameters came, HTTP/3's control streams waited for the head timeout.
    let took = t0.elapsed();
    assert!(took < std::time::Duration::from_secs(5), "{took:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn renewed_certificate_files_serve_new_quic_handshakes_and_open_connections_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let (c, k, first) = cert(dir.path());
    let p = start_toml(
        &format!(
            r#"
[[listeners]]
name = "quic"
address = "127.0.0.1:0"
[listeners.tls]
certificates = [{{ cert = "{c}", key = "{k}" }}]
watch_interval = "50ms"
[listeners.http3]
[[listeners.routes]]
respond = {{ status = 200, body = "ok" }}
"#
        ),
        1,
    );
    let addr = p.addr("quic").unwrap();
    let presented = |conn: &quinn::Connection| {
        let chain = conn.peer_identity().unwrap();
        let chain = chain
            .downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
            .unwrap();
        chain[0].clone()
    };
    let before = endpoint(&first, false);
    let old = tokio::time::timeout(T, before.connect(addr, "localhost").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(presented(&old), first);
    let mut old_send = h3_over(old).await;
    // New files, as a renewal writes them (a new key too).
    let renewed = tempfile::tempdir().unwrap();
    let (nc, nk, second) = cert(renewed.path());
    std::fs::rename(&nk, &k).unwrap();
    std::fs::rename(&nc, &c).unwrap();
    let reloads = || {
        p.stats()
            .tls_certificate_reloads
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    crate::common::until("the files reloaded", || reloads() == 1).await;
    let after = endpoint(&second, false);
    let new = tokio::time::timeout(T, after.connect(addr, "localhost").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        presented(&new),
        second,
        "a new handshake gets the new certificate"
    );
    let mut new_send = h3_over(new).await;
    assert_eq!(request(&mut new_send, "GET", "/", None).await.body, b"ok");
    assert_eq!(request(&mut old_send, "GET", "/", None).await.body, b"ok");
}
