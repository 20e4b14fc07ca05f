//! Downstream HTTP/2 end to end: an in-process h2 client (h2c prior knowledge and TLS with ALPN
//! h2) against a real portico and scripted HTTP/1.1 upstreams.

use crate::common::{chunked_upstream, until, T};
use bytes::Bytes;
use h2::client::SendRequest;
use portico_proxy::{start, Running};
use portico_testkit::{closed_port, toml_servers, Reply, TestUpstream};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

/// Every test step is bounded by this.
fn proxy(toml: &str) -> Running {
    let cfg = portico_config::parse(toml, "h2-test.toml").unwrap_or_else(|e| panic!("{e}"));
    start(cfg, 1).expect("start")
}

/// A plain listener "p" whose single route proxies to `up`, with `extra` listener lines.
fn plain_proxy(up: SocketAddr, extra: &str) -> Running {
    proxy(&format!(
        r#"
[[listeners]]
name = "p"
address = "127.0.0.1:0"
{extra}
[[listeners.routes]]
path = "/fixed"
respond = {{ status = 201, body = "fixed" }}
[[listeners.routes]]
proxy = "b"
[upstreams.b]
servers = ["{up}"]
"#
    ))
}

type Conn = JoinHandle<Result<(), h2::Error>>;

/// An h2c (prior knowledge) client on `addr`; the connection runs in its own task.
async fn h2c(addr: SocketAddr) -> (SendRequest<Bytes>, Conn) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    (client, tokio::spawn(conn))
}

struct Got {
    status: u16,
    headers: http::HeaderMap,
    body: Vec<u8>,
    trailers: Option<http::HeaderMap>,
}

async fn read(resp: h2::client::ResponseFuture) -> Result<Got, h2::Error> {
    let resp = tokio::time::timeout(T, resp)
        .await
        .expect("response in time")?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let mut body = resp.into_body();
    let mut out = Vec::new();
    while let Some(d) = tokio::time::timeout(T, body.data())
        .await
        .expect("body in time")
    {
        let d = d?;
        let _ = body.flow_control().release_capacity(d.len());
        out.extend_from_slice(&d);
    }
    let trailers = tokio::time::timeout(T, body.trailers())
        .await
        .expect("trailers")?;
    Ok(Got {
        status,
        headers,
        body: out,
        trailers,
    })
}

fn request(method: &str, uri: &str, fields: &[(&str, &str)]) -> http::Request<()> {
    let mut b = http::Request::builder().method(method).uri(uri);
    for (n, v) in fields {
        b = b.header(*n, *v);
    }
    b.body(()).unwrap()
}

async fn get(client: &mut SendRequest<Bytes>, uri: &str) -> Got {
    let mut c = tokio::time::timeout(T, client.clone().ready())
        .await
        .expect("ready in time")
        .unwrap();
    let (resp, _) = c.send_request(request("GET", uri, &[]), true).unwrap();
    *client = c;
    read(resp).await.unwrap()
}

#[tokio::test]
async fn h2c_multiplexes_streams_to_pooled_http1_upstreams() {
    let up = TestUpstream::start(|r| Reply::ok(&format!("you asked {}", r.target)));
    let p = plain_proxy(up.addr, "");
    let addr = p.addr("p").unwrap();
    let (client, conn) = h2c(addr).await;
    // Eight streams in flight at once on one connection.
    let mut pending = Vec::new();
    for i in 0..8 {
        let mut c = client.clone().ready().await.unwrap();
        let req = request(
            "GET",
            &format!("http://app.test/item/{i}?q=1"),
            &[("cookie", "a=1"), ("cookie", "b=2"), ("te", "trailers")],
        );
        let (resp, _) = c.send_request(req, true).unwrap();
        pending.push((i, resp));
    }
    for (i, resp) in pending {
        let got = read(resp).await.unwrap();
        assert_eq!(got.status, 200);
        assert_eq!(got.body, format!("you asked /item/{i}?q=1").as_bytes());
        assert!(got.headers.get("connection").is_none());
    }
    let reqs = up.requests();
    assert_eq!(reqs.len(), 8);
    for r in &reqs {
        assert_eq!(r.header("x-forwarded-proto"), Some("http"));
        assert_eq!(r.header("x-forwarded-host"), Some("app.test"));
        assert_eq!(r.header("x-forwarded-for"), Some("127.0.0.1"));
        assert_eq!(r.header("host"), Some("app.test"), ":authority is the Host");
        assert_eq!(r.header("cookie"), Some("a=1; b=2"));
        assert_eq!(r.header("te"), None, "TE is hop-by-hop");
    }
    // Local route on the same connection.
    let mut c = client.clone();
    let got = get(&mut c, "http://app.test/fixed").await;
    assert_eq!(
        (got.status, got.body.as_slice()),
        (201, b"fixed".as_slice())
    );
    // Sequential requests reuse upstream connections.
    let before = up.connection_count();
    for _ in 0..3 {
        assert_eq!(get(&mut c, "http://app.test/again").await.status, 200);
    }
    assert!(
        up.connection_count() <= before + 1,
        "pooled connections reused"
    );
    let stats = p.stats();
    assert_eq!(
        stats.requests.load(std::sync::atomic::Ordering::Relaxed),
        12
    );
    assert_eq!(stats.terminations(portico_proxy::Termination::OK), 12);
    drop(c);
    drop(client);
    let _ = tokio::time::timeout(T, conn).await;
}

#[tokio::test]
async fn request_bodies_upload_chunked_or_with_length() {
    let up = TestUpstream::start(|r| Reply::ok(&format!("got {}", r.body.len())));
    let p = plain_proxy(up.addr, "");
    let (client, _conn) = h2c(p.addr("p").unwrap()).await;
    let payload = Bytes::from(vec![b'x'; 200 * 1024]);

    // No content-length: chunked upstream, sent in several DATA frames under flow control.
    let mut c = client.clone().ready().await.unwrap();
    let (resp, mut send) = c
        .send_request(request("POST", "http://a/up", &[]), false)
        .unwrap();
    let mut rest = payload.clone();
    while !rest.is_empty() {
        send.reserve_capacity(rest.len());
        let cap = std::future::poll_fn(|cx| send.poll_capacity(cx))
            .await
            .unwrap()
            .unwrap();
        let n = cap.min(rest.len());
        send.send_data(rest.split_to(n), rest.is_empty()).unwrap();
    }
    let got = read(resp).await.unwrap();
    assert_eq!(got.status, 200);
    assert_eq!(got.body, b"got 204800");

    // With content-length.
    let mut c = client.clone().ready().await.unwrap();
    let (resp, mut send) = c
        .send_request(
            request("PUT", "http://a/up", &[("content-length", "5")]),
            false,
        )
        .unwrap();
    send.send_data(Bytes::from_static(b"hello"), true).unwrap();
    let got = read(resp).await.unwrap();
    assert_eq!(got.body, b"got 5");

    let reqs = up.requests();
    assert_eq!(reqs[0].header("transfer-encoding"), Some("chunked"));
    assert_eq!(reqs[0].body.len(), payload.len());
    assert_eq!(reqs[1].header("content-length"), Some("5"));
    assert_eq!(reqs[1].body, b"hello");
}

/// A one-connection HTTP/1.1 upstream speaking like a gRPC gateway: it reads the chunked request
/// with its trailers, then answers chunked with `grpc-status` trailers.
fn grpc_upstream() -> (SocketAddr, std::sync::mpsc::Receiver<Vec<u8>>) {
    chunked_upstream(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/grpc\r\ntrailer: grpc-status\r\ntransfer-encoding: chunked\r\n\r\n\
          7\r\n\0\0\0\0\x02ok\r\n0\r\ngrpc-status: 0\r\nset-cookie: session=stolen\r\ncontent-length: 99\r\nX-Forwarded-For: 6.6.6.6\r\ngrpc-message: fine\r\n\r\n"
            .to_vec(),
    )
}

#[tokio::test]
async fn grpc_style_exchange_passes_trailers_both_ways() {
    let (up, seen) = grpc_upstream();
    let p = plain_proxy(up, "");
    let (client, _conn) = h2c(p.addr("p").unwrap()).await;
    let mut c = client.ready().await.unwrap();
    let req = request(
        "POST",
        "http://grpc.test/pkg.Svc/Call",
        &[("content-type", "application/grpc"), ("te", "trailers")],
    );
    let (resp, mut send) = c.send_request(req, false).unwrap();
    send.send_data(Bytes::from_static(b"\0\0\0\0\x03abc"), false)
        .unwrap();
    let mut t = http::HeaderMap::new();
    t.insert("x-req-trailer", "yes".parse().unwrap());
    // Fields that may not travel in trailers never reach the server.
    for (n, v) in [
        ("x-forwarded-for", "6.6.6.6"),
        ("x-real-ip", "6.6.6.6"),
        ("authorization", "Basic eA=="),
        ("cache-control", "no-cache"),
    ] {
        t.insert(n, v.parse().unwrap());
    }
    send.send_trailers(t).unwrap();
    let got = read(resp).await.unwrap();
    assert_eq!(got.status, 200);
    assert_eq!(got.body, b"\0\0\0\0\x02ok");
    let trailers = got.trailers.expect("response trailers");
    assert_eq!(trailers.get("grpc-status").unwrap(), "0");
    assert_eq!(trailers.get("grpc-message").unwrap(), "fine");
    assert_eq!(trailers.len(), 2, "{trailers:?}");
    assert!(
        got.headers.get("trailer").is_none(),
        "hop-by-hop Trailer dropped"
    );
    let raw = String::from_utf8_lossy(&seen.recv_timeout(T).unwrap()).into_owned();
    assert!(raw.starts_with("POST /pkg.Svc/Call HTTP/1.1\r\n"), "{raw}");
    assert!(
        raw.contains("transfer-encoding: chunked\r\n")
            || raw.contains("Transfer-Encoding: chunked\r\n"),
        "{raw}"
    );
    assert!(
        raw.ends_with("\r\n0\r\nx-req-trailer: yes\r\n\r\n"),
        "{raw}"
    );
}

#[tokio::test]
async fn section_8_violations_are_refused() {
    let up = TestUpstream::start(|_| Reply::ok("should not be reached"));
    let p = plain_proxy(up.addr, "");
    let (client, _conn) = h2c(p.addr("p").unwrap()).await;

    // A value with leading whitespace (RFC 9113 8.2.1): 400, never forwarded.
    let mut c = client.clone().ready().await.unwrap();
    let (resp, _) = c
        .send_request(request("GET", "http://a/x", &[("x-pad", " padded")]), true)
        .unwrap();
    assert_eq!(read(resp).await.unwrap().status, 400);

    // CONNECT is not translated: 501.
    let mut c = client.clone().ready().await.unwrap();
    let req = http::Request::builder()
        .method("CONNECT")
        .uri("a.test:443")
        .body(())
        .unwrap();
    let (resp, _) = c.send_request(req, true).unwrap();
    assert_eq!(read(resp).await.unwrap().status, 501);

    // content-length disagreeing with the DATA sent: a stream error, not a request upstream.
    let mut c = client.clone().ready().await.unwrap();
    let (resp, mut send) = c
        .send_request(
            request("POST", "http://a/x", &[("content-length", "10")]),
            false,
        )
        .unwrap();
    send.send_data(Bytes::from_static(b"short"), true).unwrap();
    match read(resp).await {
        Err(e) => assert_eq!(e.reason(), Some(h2::Reason::PROTOCOL_ERROR), "{e}"),
        Ok(g) => assert!(g.status >= 400, "status {}", g.status),
    }

    // The connection is still usable, and the upstream saw nothing.
    let mut c = client.clone();
    assert_eq!(get(&mut c, "http://a/fixed").await.status, 201);
    assert!(up.requests().is_empty());
}

#[tokio::test]
async fn oversized_header_lists_are_refused() {
    let up = TestUpstream::start(|_| Reply::ok("ok"));
    let p = plain_proxy(
        up.addr,
        "[listeners.http2]\nmax_header_list_size = \"2k\"\n[listeners.limits]\nmax_headers = 5",
    );
    let (client, _conn) = h2c(p.addr("p").unwrap()).await;
    // Over SETTINGS_MAX_HEADER_LIST_SIZE: the h2 layer answers 431 (or refuses the stream).
    let big = "v".repeat(4096);
    let mut c = client.clone().ready().await.unwrap();
    let (resp, _) = c
        .send_request(request("GET", "http://a/x", &[("x-big", &big)]), true)
        .unwrap();
    match read(resp).await {
        Ok(g) => assert_eq!(g.status, 431),
        Err(e) => assert_eq!(e.reason(), Some(h2::Reason::REFUSED_STREAM), "{e}"),
    }
    // Within the h2 limit but over the listener's field count: 431 from the translation.
    let fields: Vec<(String, String)> = (0..8).map(|i| (format!("x-{i}"), "1".into())).collect();
    let refs: Vec<(&str, &str)> = fields
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let mut c = client.clone().ready().await.unwrap();
    let (resp, _) = c
        .send_request(request("GET", "http://a/x", &refs), true)
        .unwrap();
    assert_eq!(read(resp).await.unwrap().status, 431);
    let mut c = client.clone();
    assert_eq!(get(&mut c, "http://a/small").await.status, 200);
    assert_eq!(up.requests().len(), 1);
}

#[tokio::test]
async fn rapid_reset_gets_goaway_enhance_your_calm() {
    let up = TestUpstream::start(|_| Reply::Stall(Duration::from_secs(20)));
    let p = plain_proxy(
        up.addr,
        "[listeners.http2]\nmax_resets = 5\nreset_window = \"1m\"",
    );
    let (client, conn) = h2c(p.addr("p").unwrap()).await;
    for i in 0..10 {
        let Ok(ready) = tokio::time::timeout(T, client.clone().ready())
            .await
            .unwrap()
        else {
            break;
        };
        let mut c = ready;
        let Ok((_resp, mut send)) = c.send_request(request("GET", "http://a/slow", &[]), true)
        else {
            break;
        };
        // Reset once the request is in flight upstream: the proxy's own counter sees it.
        // (Or stop once the GOAWAY has ended the connection.)
        until("the request upstream", || {
            up.requests().len() > i || conn.is_finished()
        })
        .await;
        if conn.is_finished() {
            break;
        }
        send.send_reset(h2::Reason::CANCEL);
    }
    let r = tokio::time::timeout(T, conn)
        .await
        .expect("connection ends")
        .unwrap();
    let e = r.expect_err("GOAWAY");
    assert!(e.is_go_away(), "{e}");
    assert_eq!(e.reason(), Some(h2::Reason::ENHANCE_YOUR_CALM), "{e}");
    assert!(up.requests().len() <= 7, "the flood was cut off");
    let flooded = p
        .stats()
        .h2_reset_floods
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(flooded, 1);
}

#[tokio::test]
async fn shutdown_sends_goaway_and_in_flight_streams_finish() {
    let up = TestUpstream::start(|_| Reply::Stall(Duration::from_millis(300)));
    let p = plain_proxy(up.addr, "");
    let (client, conn) = h2c(p.addr("p").unwrap()).await;
    let mut c = client.ready().await.unwrap();
    let (resp, _) = c
        .send_request(request("GET", "http://a/slow", &[]), true)
        .unwrap();
    until("the request upstream", || !up.requests().is_empty()).await;
    p.shutdown();
    let got = read(resp).await.unwrap();
    assert_eq!((got.status, got.body.as_slice()), (200, b"late".as_slice()));
    // The connection then closes cleanly (GOAWAY NO_ERROR).
    let r = tokio::time::timeout(T, conn)
        .await
        .expect("connection ends")
        .unwrap();
    if let Err(e) = r {
        assert_eq!(e.reason(), Some(h2::Reason::NO_ERROR), "{e}");
    }
    tokio::task::spawn_blocking(move || p.wait()).await.unwrap();
}

#[tokio::test]
async fn http1_still_served_on_h2c_listeners_and_garbage_closed() {
    let up = TestUpstream::start(|_| Reply::ok("one"));
    let p = plain_proxy(up.addr, "");
    let addr = p.addr("p").unwrap();
    let r = tokio::task::spawn_blocking(move || {
        let h1 = portico_testkit::exchange_raw(
            addr,
            b"GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        )
        .unwrap();
        // Closed without a byte of answer (a reset would do too).
        let bad = portico_testkit::exchange_raw(addr, b"INVALID CONNECTION PREFACE\r\n\r\n")
            .unwrap_or_default();
        (h1, bad)
    })
    .await
    .unwrap();
    assert!(
        r.0.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&r.0)
    );
    assert!(
        r.1.is_empty(),
        "an invalid preface gets no HTTP/1 answer: {}",
        String::from_utf8_lossy(&r.1)
    );
}

/// The protocol is told from the first bytes read, however they are split: a preface whose
/// first part comes alone, and an HTTP/1.1 request line cut after two bytes, are both served.
#[test]
fn split_first_bytes_still_tell_the_protocol() {
    let up = TestUpstream::start(|_| Reply::ok("one"));
    let p = plain_proxy(up.addr, "");
    let addr = p.addr("p").unwrap();
    let quiet = |s: &mut std::net::TcpStream| {
        // Nothing is answered to a part (a short wait: the proxy had its chance to read it).
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut b = [0u8; 1];
        assert!(s.read(&mut b).is_err(), "no answer to a part");
        s.set_read_timeout(Some(T)).unwrap();
    };
    // HTTP/2 with prior knowledge.
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let preface = portico_proxy::h2::PREFACE;
    // Up to the blank line: a complete HTTP/1-looking head on its own.
    s.write_all(&preface[..18]).unwrap();
    quiet(&mut s);
    let mut out = preface[18..].to_vec();
    out.extend(frame(0x4, 0, 0, &[])); // SETTINGS
    let get = [0x82, 0x86, 0x84, 0x41, 0x01, b'a']; // :method GET, :scheme http, :path /, :authority a
    out.extend(frame(0x1, 0x5, 1, &get)); // HEADERS, END_STREAM | END_HEADERS
    s.write_all(&out).unwrap();
    // Frames until the response's HEADERS on stream 1: `:status 200` is HPACK's index 8.
    let status = loop {
        let mut head = [0u8; 9];
        s.read_exact(&mut head).unwrap();
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let mut payload = vec![0u8; len];
        s.read_exact(&mut payload).unwrap();
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        assert_ne!(head[3], 0x7, "GOAWAY: {payload:?}");
        if head[3] == 0x1 && stream == 1 {
            break payload[0];
        }
    };
    assert_eq!(status, 0x88, ":status 200");
    // HTTP/1.1.
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(b"GE").unwrap();
    quiet(&mut s);
    s.write_all(b"T /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).unwrap();
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert_eq!(up.requests().len(), 2);
}

// --- TLS with ALPN ---------------------------------------------------------------------------

fn write_cert(dir: &Path) -> (PathBuf, PathBuf, rustls::pki_types::CertificateDer<'static>) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let (c, k) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (c, k, cert.der().clone())
}

#[tokio::test]
async fn tls_alpn_selects_h2_and_http1_remains_available() {
    let dir = std::env::temp_dir().join(format!("portico-h2-it-{}", std::process::id()));
    let (cert, key, der) = write_cert(&dir);
    let up = TestUpstream::start(|_| Reply::ok("over tls"));
    let p = proxy(&format!(
        r#"
[[listeners]]
name = "tls"
address = "127.0.0.1:0"
[listeners.tls]
certificates = [{{ cert = "{}", key = "{}" }}]
[[listeners.routes]]
proxy = "b"
[upstreams.b]
servers = ["{}"]
"#,
        cert.display(),
        key.display(),
        up.addr
    ));
    let addr = p.addr("tls").unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der).unwrap();
    let connect = |alpn: Vec<Vec<u8>>| {
        let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots.clone())
        .with_no_client_auth();
        cfg.alpn_protocols = alpn;
        let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
        async move {
            let tcp = TcpStream::connect(addr).await.unwrap();
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            connector.connect(name, tcp).await.unwrap()
        }
    };
    let tls = connect(vec![b"h2".to_vec(), b"http/1.1".to_vec()]).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (client, _conn) = h2::client::handshake(tls).await.unwrap();
    let _conn = tokio::spawn(_conn);
    let mut c = client.clone();
    let got = get(&mut c, "https://localhost/secure").await;
    assert_eq!(
        (got.status, got.body.as_slice()),
        (200, b"over tls".as_slice())
    );
    assert_eq!(up.requests()[0].header("x-forwarded-proto"), Some("https"));

    // A client that offers only http/1.1 gets it.
    let tls = connect(vec![b"http/1.1".to_vec()]).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let _ = std::fs::remove_dir_all(&dir);
}

/// One raw HTTP/2 frame.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

#[test]
fn continuation_flood_ends_the_connection() {
    let up = TestUpstream::start(|_| Reply::ok("never"));
    let p = plain_proxy(up.addr, "[listeners.http2]\nmax_header_list_size = \"4k\"");
    let mut s = std::net::TcpStream::connect(p.addr("p").unwrap()).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    s.set_write_timeout(Some(T)).unwrap();
    // Ten literal fields of ~100 bytes per frame (HPACK "literal without indexing, new name").
    let mut block = Vec::new();
    for i in 0..10u8 {
        block.extend_from_slice(&[0x00, 0x03, b'x', b'-', b'a' + i, 100]);
        block.extend_from_slice(&[b'v'; 100]);
    }
    let mut out = portico_proxy::h2::PREFACE.to_vec();
    out.extend(frame(0x4, 0, 0, &[])); // SETTINGS
    let get = [0x82, 0x86, 0x84, 0x41, 0x01, b'a']; // :method GET, :scheme http, :path /, :authority a
    out.extend(frame(0x1, 0, 1, &get)); // HEADERS without END_HEADERS
    let _ = s.write_all(&out);
    // Up to ~1 MB of CONTINUATION frames that never end the header block.
    for _ in 0..1000 {
        if s.write_all(&frame(0x9, 0, 1, &block)).is_err() {
            break;
        }
    }
    // The server must have ended the connection: GOAWAY (ENHANCE_YOUR_CALM) or a reset.
    if let Some(code) = goaway_code(&mut s) {
        assert_eq!(code, 0xb, "GOAWAY ENHANCE_YOUR_CALM");
    }
    assert!(up.requests().is_empty());
}

#[tokio::test]
async fn origin_and_redirect_actions_answer_over_h2() {
    let p = proxy(
        r#"
[[listeners]]
name = "o"
address = "127.0.0.1:0"
[[listeners.routes]]
path = "/old"
redirect = "/new"
redirect_status = 308
[[listeners.routes]]
origin = true
"#,
    );
    let (client, _conn) = h2c(p.addr("o").unwrap()).await;
    let mut c = client.clone();
    let got = get(&mut c, "http://o.test/bytes/20000").await;
    assert_eq!(got.status, 200);
    assert_eq!(got.body.len(), 20000);
    assert_eq!(got.headers.get("content-length").unwrap(), "20000");
    let got = get(&mut c, "http://o.test/?size=10&status=404").await;
    assert_eq!((got.status, got.body.len()), (404, 10));
    let got = get(&mut c, "http://o.test/old").await;
    assert_eq!(got.status, 308);
    assert_eq!(got.headers.get("location").unwrap(), "/new");
}

#[tokio::test]
async fn a_reload_that_removes_the_listener_sends_goaway() {
    let up = TestUpstream::start(|_| Reply::Stall(Duration::from_millis(200)));
    let p = plain_proxy(up.addr, "");
    let (client, conn) = h2c(p.addr("p").unwrap()).await;
    let mut c = client.ready().await.unwrap();
    let (resp, _) = c
        .send_request(request("GET", "http://a/slow", &[]), true)
        .unwrap();
    until("the request upstream", || !up.requests().is_empty()).await;
    let other = portico_config::parse(
        "[[listeners]]\nname = \"q\"\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nrespond = { status = 200 }\n",
        "reload.toml",
    )
    .unwrap();
    let summary = p.reload(other).unwrap();
    assert_eq!(summary.removed, vec!["p".to_string()]);
    // The stream in flight finishes, then the connection ends with GOAWAY NO_ERROR.
    let got = read(resp).await.unwrap();
    assert_eq!((got.status, got.body.as_slice()), (200, b"late".as_slice()));
    let r = tokio::time::timeout(T, conn)
        .await
        .expect("connection ends")
        .unwrap();
    if let Err(e) = r {
        assert_eq!(e.reason(), Some(h2::Reason::NO_ERROR), "{e}");
    }
}

/// Read until the server's GOAWAY (its error code) or the end of the connection (`None`);
/// panics if the connection stays open.
fn goaway_code(s: &mut std::net::TcpStream) -> Option<u32> {
    let mut seen = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return None,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
            Err(e) => panic!("the connection stayed open: {e}"),
        }
        // Walk the frames received so far looking for GOAWAY (type 7).
        let mut at = 0;
        while seen.len() >= at + 9 {
            let len = u32::from_be_bytes([0, seen[at], seen[at + 1], seen[at + 2]]) as usize;
            if seen.len() < at + 9 + len {
                break;
            }
            if seen[at + 3] == 0x7 && len >= 8 {
                let p = &seen[at + 9..at + 17];
                return Some(u32::from_be_bytes([p[4], p[5], p[6], p[7]]));
            }
            at += 9 + len;
        }
    }
}

#[test]
fn hpack_bomb_ends_the_connection() {
    let up = TestUpstream::start(|_| Reply::ok("never"));
    let p = plain_proxy(up.addr, "[listeners.http2]\nmax_header_list_size = \"4k\"");
    let mut s = std::net::TcpStream::connect(p.addr("p").unwrap()).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    s.set_write_timeout(Some(T)).unwrap();
    // One 3000-byte field added to the dynamic table, then referenced 2000 times: a 5 KB block
    // that decodes to 6 MB.
    let mut block = vec![0x82, 0x86, 0x84, 0x41, 0x01, b'a'];
    block.extend_from_slice(&[0x40, 0x03, b'x', b'-', b'b', 0x7f, 0xb9, 0x16]);
    block.extend_from_slice(&[b'v'; 3000]);
    block.extend(std::iter::repeat_n(0xbe, 2000)); // indexed: dynamic entry 62
    let mut out = portico_proxy::h2::PREFACE.to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    out.extend(frame(0x1, 0x4 | 0x1, 1, &block)); // HEADERS, END_HEADERS | END_STREAM
    let _ = s.write_all(&out);
    if let Some(code) = goaway_code(&mut s) {
        assert_eq!(code, 0xb, "GOAWAY ENHANCE_YOUR_CALM");
    }
    assert!(up.requests().is_empty());
}

/// Send `uri` with `fields` on `client` without waiting for the answer.
async fn send(
    client: &SendRequest<Bytes>,
    uri: &str,
    fields: &[(&str, &str)],
) -> h2::client::ResponseFuture {
    let mut c = tokio::time::timeout(T, client.clone().ready())
        .await
        .expect("ready in time")
        .unwrap();
    c.send_request(request("GET", uri, fields), true).unwrap().0
}

/// A plain listener "p" whose one route (`route_keys` added) proxies to group "g" of
/// `servers` (`group_keys` added).
fn group_proxy(servers: &[SocketAddr], route_keys: &str, group_keys: &str) -> Running {
    proxy(&format!(
        "[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nproxy = \"g\"\n{route_keys}\n[upstreams.g]\nservers = {}\n{group_keys}\n",
        toml_servers(servers)
    ))
}

#[tokio::test]
async fn rate_limited_streams_get_429_with_retry_after() {
    let up = TestUpstream::start(|_| Reply::ok("ok"));
    let p = group_proxy(&[up.addr], "rate_limit = { rate = 0.5, burst = 2 }", "");
    let (client, _conn) = h2c(p.addr("p").unwrap()).await;
    // Five streams at once on one connection: the burst passes, the rest are refused.
    let mut pending = Vec::new();
    for i in 0..5 {
        pending.push(send(&client, &format!("http://a/{i}"), &[]).await);
    }
    let mut statuses = Vec::new();
    for resp in pending {
        let got = read(resp).await.unwrap();
        if got.status == 429 {
            let after: u64 = got.headers["retry-after"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!((1..=2).contains(&after), "Retry-After {after}");
            assert!(String::from_utf8_lossy(&got.body).contains("429"));
        }
        statuses.push(got.status);
    }
    statuses.sort();
    assert_eq!(statuses, [200, 200, 429, 429, 429]);
    assert_eq!(
        up.requests().len(),
        2,
        "refused streams never reach upstream"
    );
    let stats = p.stats();
    assert_eq!(
        stats
            .rate_limited
            .load(std::sync::atomic::Ordering::Relaxed),
        3
    );
    let metrics = portico_proxy::admin::metrics(p.control());
    assert!(
        metrics.contains("\nportico_route_rate_limited_total{listener=\"p\",route=\"p#0\"} 3\n"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_refused_connect_is_retried_on_the_other_server() {
    let good = TestUpstream::start(|_| Reply::ok("good"));
    let servers = [closed_port(), good.addr];
    let p = group_proxy(&servers, "retry = {}", "passive = { max_failures = 0 }");
    let (client, _conn) = h2c(p.addr("p").unwrap()).await;
    let mut c = client.clone();
    for _ in 0..6 {
        let got = get(&mut c, "http://a/x").await;
        assert_eq!((got.status, got.body.as_slice()), (200, b"good".as_slice()));
    }
    // Round robin sent half of the first attempts to the refusing server.
    let stats = p.stats();
    assert_eq!(stats.retries.load(std::sync::atomic::Ordering::Relaxed), 3);
    assert_eq!(good.requests().len(), 6);
}

#[tokio::test]
async fn sticky_cookie_is_set_and_honoured() {
    let ups: Vec<TestUpstream> = (0..3)
        .map(|i| TestUpstream::start(move |_| Reply::ok(&format!("s{i}"))))
        .collect();
    let addrs: Vec<SocketAddr> = ups.iter().map(|u| u.addr).collect();
    let sticky = "sticky_cookie = { name = \"PORTICO_SRV\", max_age = \"1h\" }";
    let p = group_proxy(&addrs, "", sticky);
    let (client, _conn) = h2c(p.addr("p").unwrap()).await;
    let first = read(send(&client, "http://a/", &[]).await).await.unwrap();
    assert_eq!(first.status, 200);
    let set = first.headers["set-cookie"].to_str().unwrap().to_string();
    assert!(set.ends_with("; Path=/; Max-Age=3600; HttpOnly"), "{set}");
    let cookie = set.split(';').next().unwrap().to_string();
    let server = first.body.clone();
    // With the cookie every stream goes to that server and the cookie is not set again;
    // without it the balancer spreads them.
    let mut seen_without = std::collections::HashSet::new();
    for _ in 0..6 {
        let fields = [("cookie", "a=b"), ("cookie", cookie.as_str())];
        let got = read(send(&client, "http://a/", &fields).await)
            .await
            .unwrap();
        assert_eq!(got.body, server);
        assert!(got.headers.get("set-cookie").is_none());
        let got = read(send(&client, "http://a/", &[]).await).await.unwrap();
        assert!(got.headers.get("set-cookie").is_some());
        seen_without.insert(got.body);
    }
    assert!(seen_without.len() >= 2, "balancer never spread");
}

#[tokio::test]
async fn queued_stream_is_admitted_when_a_slot_frees() {
    let hold = portico_testkit::Hold::new();
    let h = hold.clone();
    let up = TestUpstream::start(move |req| {
        h.wait();
        Reply::ok(&req.target)
    });
    let queue = "max_connections_per_server = 1\nqueue = 4\nqueue_timeout = \"10s\"";
    let p = group_proxy(&[up.addr], "", queue);
    let held = |n: usize| {
        let h = hold.clone();
        tokio::task::spawn_blocking(move || h.wait_held(n))
    };
    let waiting = || p.control().snapshot().group_stats[0].queue.waiting();
    let (client, _conn) = h2c(p.addr("p").unwrap()).await;
    let a = send(&client, "http://t/a", &[]).await;
    assert!(held(1).await.unwrap(), "first stream reaches the server");
    let b = send(&client, "http://t/b", &[]).await;
    until("the second stream waits in the queue", || waiting() == 1).await;
    assert_eq!(hold.held(), 1, "the queued stream is not sent yet");
    // The first response frees the slot: the queued stream goes to the server.
    hold.release(1);
    let got = read(a).await.unwrap();
    assert_eq!((got.status, got.body.as_slice()), (200, b"/a".as_slice()));
    assert!(
        held(1).await.unwrap(),
        "the queued stream reaches the server"
    );
    hold.release(1);
    let got = read(b).await.unwrap();
    assert_eq!((got.status, got.body.as_slice()), (200, b"/b".as_slice()));
    assert_eq!(waiting(), 0);
    let q = &p.control().snapshot().group_stats[0].queue;
    let relaxed = std::sync::atomic::Ordering::Relaxed;
    assert_eq!((q.queued.load(relaxed), q.admitted.load(relaxed)), (1, 1));
}

#[tokio::test]
async fn a_saturated_worker_sheds_streams_with_503() {
    let up = TestUpstream::start(|_| Reply::ok("ok"));
    let p = plain_proxy(up.addr, "shed = { target = \"5ms\", interval = \"20ms\" }");
    let (client, _conn) = h2c(p.addr("p").unwrap()).await;
    let mut c = client.clone();
    assert_eq!(get(&mut c, "http://a/x").await.status, 200);
    let relaxed = std::sync::atomic::Ordering::Relaxed;
    p.control()
        .simulate_saturation(Some(Duration::from_millis(25)));
    until("the worker starts shedding", || {
        p.stats().shedding.load(relaxed) == 1
    })
    .await;
    let got = get(&mut c, "http://a/x").await;
    assert_eq!(got.status, 503);
    assert_eq!(got.headers["retry-after"], "1");
    assert!(String::from_utf8_lossy(&got.body).contains("overloaded"));
    p.control().simulate_saturation(None);
    until("shedding stops", || p.stats().shedding.load(relaxed) == 0).await;
    assert_eq!(get(&mut c, "http://a/x").await.status, 200);
    assert_eq!(p.stats().requests_shed.load(relaxed), 1);
    assert_eq!(
        up.requests().len(),
        2,
        "the shed stream never reached upstream"
    );
}

#[tokio::test]
async fn access_log_names_the_protocol_http2() {
    let up = TestUpstream::start(|_| Reply::ok("ok"));
    let dir = std::env::temp_dir().join(format!("portico-h2-log-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("access.log");
    let p = proxy(&format!(
        "[access_log]\npath = \"{}\"\n[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nproxy = \"b\"\n[upstreams.b]\nservers = [\"{}\"]\n",
        path.display(),
        up.addr
    ));
    let (client, _conn) = h2c(p.addr("p").unwrap()).await;
    let mut c = client.clone();
    assert_eq!(get(&mut c, "http://a/logged").await.status, 200);
    let log = || std::fs::read_to_string(&path).unwrap_or_default();
    until("the access-log line", || log().lines().count() == 1).await;
    let line = log();
    assert!(line.contains("\"GET /logged HTTP/2.0\" 200 2 "), "{line}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_refused_connect_is_logged_with_its_server() {
    let refusing = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let dir = std::env::temp_dir().join(format!("portico-h2-refused-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("access.log");
    let p = proxy(&format!(
        "[access_log]\npath = \"{}\"\nformat = \"json\"\n[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nproxy = \"b\"\n[upstreams.b]\nservers = [\"{refusing}\"]\n",
        path.display(),
    ));
    let (client, _conn) = h2c(p.addr("p").unwrap()).await;
    let mut c = client.clone();
    assert_eq!(get(&mut c, "http://a/refused").await.status, 502);
    let log = || std::fs::read_to_string(&path).unwrap_or_default();
    until("the access-log line", || log().lines().count() == 1).await;
    let line = log();
    assert!(line.contains("\"cause\":\"Refused\""), "{line}");
    assert!(
        line.contains(&format!("\"upstream\":\"{refusing}\"")),
        "{line}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Read until the server closes the connection (EOF or reset); everything received. Panics if
/// it stays open past the read timeout set on `s`.
fn read_to_close(s: &mut std::net::TcpStream) -> Vec<u8> {
    let mut seen = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return seen,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return seen,
            Err(e) => panic!("the connection stayed open: {e}"),
        }
    }
}

#[test]
fn a_silent_connection_is_closed_at_the_head_deadline() {
    let up = TestUpstream::start(|_| Reply::ok("never"));
    let p = plain_proxy(up.addr, "[listeners.limits]\nhead_timeout = \"200ms\"");
    let addr = p.addr("p").unwrap();
    // Nothing sent: the protocol sniff must not wait past the head deadline.
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    let started = Instant::now();
    let got = read_to_close(&mut s);
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    assert!(started.elapsed() < T);
    // A request line begun but not finished: the same deadline, answered as HTTP/1 (408).
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    s.write_all(b"GE").unwrap();
    let got = read_to_close(&mut s);
    assert!(
        got.starts_with(b"HTTP/1.1 408"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    assert!(up.requests().is_empty());
}

#[test]
fn a_client_that_never_acks_the_drain_ping_is_closed() {
    let up = TestUpstream::start(|_| Reply::ok("never"));
    let p = plain_proxy(up.addr, "[listeners.limits]\nkeepalive_timeout = \"200ms\"");
    let mut s = std::net::TcpStream::connect(p.addr("p").unwrap()).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    // The preface and SETTINGS, then nothing: no SETTINGS ack, no PING ack. The idle timeout
    // starts the drain (GOAWAY + PING), which this client never completes.
    let mut out = portico_proxy::h2::PREFACE.to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    s.write_all(&out).unwrap();
    let started = Instant::now();
    let got = read_to_close(&mut s);
    assert!(started.elapsed() < T);
    // Frames received: the server's SETTINGS, its GOAWAY and PING.
    let mut kinds = Vec::new();
    let mut at = 0;
    while got.len() >= at + 9 {
        let len = u32::from_be_bytes([0, got[at], got[at + 1], got[at + 2]]) as usize;
        kinds.push(got[at + 3]);
        at += 9 + len;
    }
    assert!(kinds.contains(&0x7), "GOAWAY sent: {kinds:?}");
    assert!(kinds.contains(&0x6), "PING sent: {kinds:?}");
}

/// Read frames from `s` until stream 1 ends (a frame with END_STREAM, or a reset); returns the
/// (type, flags, payload length) of every frame on stream 1.
fn stream1_frames(s: &mut std::net::TcpStream) -> Vec<(u8, u8, usize)> {
    let mut seen = Vec::new();
    let mut buf = [0u8; 16384];
    let mut out = Vec::new();
    let mut at = 0;
    loop {
        while seen.len() >= at + 9 {
            let len = u32::from_be_bytes([0, seen[at], seen[at + 1], seen[at + 2]]) as usize;
            if seen.len() < at + 9 + len {
                break;
            }
            let (kind, flags) = (seen[at + 3], seen[at + 4]);
            let id = u32::from_be_bytes([seen[at + 5], seen[at + 6], seen[at + 7], seen[at + 8]]);
            at += 9 + len;
            if id == 1 {
                out.push((kind, flags, len));
                if flags & 0x1 != 0 || kind == 0x3 {
                    return out;
                }
            }
        }
        match s.read(&mut buf) {
            Ok(0) => panic!("closed before stream 1 ended: {out:?}"),
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e) => panic!("stream 1 did not end: {e}; frames {out:?}"),
        }
    }
}

#[test]
fn a_sized_body_ends_with_its_last_data_frame() {
    let up = TestUpstream::start(|c| {
        if c.target == "/chunked" {
            Reply::Respond {
                status: 200,
                headers: vec![],
                body: b"hello world".to_vec(),
                chunked: true,
            }
        } else {
            Reply::ok("hello")
        }
    });
    let p = plain_proxy(up.addr, "");
    for (path, data) in [("/sized", vec![5]), ("/chunked", vec![5, 6, 0])] {
        let mut s = std::net::TcpStream::connect(p.addr("p").unwrap()).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        let mut block = vec![0x82, 0x86, 0x44, path.len() as u8]; // GET, http, :path literal
        block.extend_from_slice(path.as_bytes());
        block.extend_from_slice(&[0x41, 0x01, b'a']); // :authority a
        let mut out = portico_proxy::h2::PREFACE.to_vec();
        out.extend(frame(0x4, 0, 0, &[]));
        out.extend(frame(0x1, 0x4 | 0x1, 1, &block));
        s.write_all(&out).unwrap();
        let frames = stream1_frames(&mut s);
        assert_eq!(frames[0].0, 0x1, "{path}: HEADERS first: {frames:?}");
        let sizes: Vec<usize> = frames[1..].iter().map(|f| f.2).collect();
        assert!(frames[1..].iter().all(|f| f.0 == 0x0), "{path}: {frames:?}");
        // Only the last DATA frame carries END_STREAM; a sized body needs no empty one after.
        assert_eq!(sizes, data, "{path}: {frames:?}");
    }
}

#[tokio::test]
async fn the_connection_closes_after_max_requests_per_connection() {
    let up = TestUpstream::start(|_| Reply::ok("hi"));
    let p = plain_proxy(
        up.addr,
        "[listeners.limits]\nmax_requests_per_connection = 2",
    );
    let (client, conn) = h2c(p.addr("p").unwrap()).await;
    // Both streams in flight at once: accepted in one poll of the connection.
    let mut c = client.ready().await.unwrap();
    let (a, _) = c
        .send_request(request("GET", "http://a/1", &[]), true)
        .unwrap();
    let mut c = c.ready().await.unwrap();
    let (b, _) = c
        .send_request(request("GET", "http://a/2", &[]), true)
        .unwrap();
    for resp in [a, b] {
        let got = read(resp).await.unwrap();
        assert_eq!((got.status, got.body.as_slice()), (200, b"hi".as_slice()));
    }
    // The client keeps its handle: only the server's GOAWAY can end the connection.
    let r = tokio::time::timeout(T, conn)
        .await
        .expect("the server ends the connection")
        .unwrap();
    if let Err(e) = r {
        assert_eq!(e.reason(), Some(h2::Reason::NO_ERROR), "{e}");
    }
    drop(c);
}

#[tokio::test]
async fn a_stream_while_the_idle_timer_runs_defers_the_idle_close() {
    let up = TestUpstream::start(|_| Reply::ok("hi"));
    let keepalive = Duration::from_millis(600);
    let p = plain_proxy(up.addr, "[listeners.limits]\nkeepalive_timeout = \"600ms\"");
    let (mut client, conn) = h2c(p.addr("p").unwrap()).await;
    // The idle timer was armed when the connection began; a stream comes and goes before it
    // fires, so the connection has been idle for less than the timeout when it does.
    tokio::time::sleep(keepalive / 2).await;
    assert_eq!(get(&mut client, "http://a/").await.status, 200);
    let last = Instant::now();
    let r = tokio::time::timeout(T, conn)
        .await
        .expect("the idle connection is closed")
        .unwrap();
    let idle = last.elapsed();
    assert!(
        idle >= keepalive - Duration::from_millis(50),
        "closed after {idle:?} idle"
    );
    if let Err(e) = r {
        assert_eq!(e.reason(), Some(h2::Reason::NO_ERROR), "{e}");
    }
    drop(client);
}
