//! Interim responses (103 Early Hints) reach clients as they arrive, before the server sends its final response, and commit the attempt (no retry after them).

use crate::common::T;
use portico_proxy::stats::{Cause, Phase, Side};
use portico_proxy::{start, Running, Termination};
use portico_testkit::{Client, Reply, TestUpstream};
use std::future::poll_fn;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// Every test step is bounded by this.
const HINTS: &[u8] = b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n";
const FINAL: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";

fn proxy(servers: &str, route_extra: &str, group_extra: &str) -> Running {
    let toml = format!(
        r#"
[[listeners]]
name = "p"
address = "127.0.0.1:0"
[[listeners.routes]]
proxy = "b"
{route_extra}
[upstreams.b]
servers = [{servers}]
{group_extra}
"#
    );
    let cfg = portico_config::parse(&toml, "early-hints.toml").unwrap_or_else(|e| panic!("{e}"));
    start(cfg, 1).expect("start")
}

/// An HTTP/1.1 server for one request: it sends the 103, then waits until the test has seen
/// it at the client (`go`), and only then sends the final response. A proxy that held the 103
/// until the final response would make the test time out.
async fn held_back_upstream() -> (SocketAddr, oneshot::Sender<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (go, wait) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = Vec::new();
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            let mut chunk = [0u8; 1024];
            let n = s.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the proxy closed before sending a request");
            buf.extend_from_slice(&chunk[..n]);
        }
        s.write_all(HINTS).await.unwrap();
        if wait.await.is_ok() {
            s.write_all(FINAL).await.unwrap();
        }
        // Keep the connection until the proxy is done with it.
        let _ = s.read(&mut [0u8; 64]).await;
    });
    (addr, go)
}

/// Read from `s` into `buf` until it holds `n` complete heads (ends of head).
async fn read_heads(s: &mut TcpStream, buf: &mut Vec<u8>, n: usize) {
    while buf.windows(4).filter(|w| *w == b"\r\n\r\n").count() < n {
        let mut chunk = [0u8; 1024];
        let got = tokio::time::timeout(T, s.read(&mut chunk))
            .await
            .expect("head in time")
            .unwrap();
        assert!(got > 0, "closed early: {}", String::from_utf8_lossy(buf));
        buf.extend_from_slice(&chunk[..got]);
    }
}

#[tokio::test]
async fn early_hints_reach_http1_clients_before_the_final_response() {
    let (up, go) = held_back_upstream().await;
    let p = proxy(&format!("\"{up}\""), "", "");
    let mut s = TcpStream::connect(p.addr("p").unwrap()).await.unwrap();
    s.write_all(b"GET /page HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    read_heads(&mut s, &mut buf, 1).await;
    assert_eq!(buf, HINTS, "{}", String::from_utf8_lossy(&buf));
    go.send(()).unwrap();
    tokio::time::timeout(T, s.read_to_end(&mut buf))
        .await
        .expect("response in time")
        .unwrap();
    let text = String::from_utf8_lossy(&buf);
    let rest = text.strip_prefix("HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n");
    let rest = rest.unwrap_or_else(|| panic!("{text}"));
    assert!(rest.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(rest.ends_with("\r\n\r\nok"), "{text}");
}

#[tokio::test]
async fn early_hints_reach_http2_clients_before_the_final_response() {
    let (up, go) = held_back_upstream().await;
    let p = proxy(&format!("\"{up}\""), "", "");
    let tcp = TcpStream::connect(p.addr("p").unwrap()).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let mut client = tokio::time::timeout(T, client.ready())
        .await
        .expect("ready")
        .unwrap();
    let req = http::Request::get("http://app.test/page").body(()).unwrap();
    let (mut resp, _) = client.send_request(req, true).unwrap();
    let info = tokio::time::timeout(T, poll_fn(|cx| resp.poll_informational(cx)))
        .await
        .expect("the 103 before the final response")
        .expect("an informational response")
        .unwrap();
    assert_eq!(info.status(), 103);
    assert_eq!(info.headers()["link"], "</a.css>; rel=preload");
    go.send(()).unwrap();
    let resp = tokio::time::timeout(T, resp).await.expect("head").unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut got = Vec::new();
    while let Some(d) = tokio::time::timeout(T, body.data()).await.expect("body") {
        got.extend_from_slice(&d.unwrap());
    }
    assert_eq!(got, b"ok");
}

/// After a 103 reached the client the attempt is committed: a 503 that the route would retry
/// goes to the client after the hints, and the server sees the request once. Without a 103
/// the same 503 is retried.
#[test]
fn no_retry_once_early_hints_went_to_the_client() {
    let up = TestUpstream::start(|r| {
        let busy = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n";
        match r.target.as_str() {
            "/hinted" => Reply::Raw([HINTS, busy.as_slice()].concat()),
            _ => Reply::Raw(busy.to_vec()),
        }
    });
    let p = proxy(
        &format!("\"{}\"", up.addr),
        "retry = { retries = 1, on = [\"reset\", \"503\"] }",
        "",
    );
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    c.send(b"GET /hinted HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    assert_eq!(c.read_one(false).unwrap().status, 103);
    assert_eq!(c.read_one(false).unwrap().status, 503);
    assert_eq!(
        c.request(b"GET /plain HTTP/1.1\r\nHost: a\r\n\r\n")
            .unwrap()
            .status,
        503
    );
    let count = |t: &str| up.requests().iter().filter(|r| r.target == t).count();
    assert_eq!(count("/hinted"), 1, "committed by the 103: not retried");
    assert_eq!(count("/plain"), 2, "retried once");
}

/// An HTTP/2 (h2c) server for one request: a 103, then the final response only once the test
/// saw the 103 at the client (`go`).
async fn held_back_h2_upstream() -> (SocketAddr, oneshot::Sender<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (go, wait) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        let mut conn = h2::server::handshake(s).await.unwrap();
        let (_req, mut respond) = conn.accept().await.unwrap().unwrap();
        // The connection is driven while the stream waits.
        let driver = tokio::spawn(async move { while conn.accept().await.is_some() {} });
        let hints = http::Response::builder()
            .status(103)
            .header("link", "</a.css>; rel=preload")
            .body(())
            .unwrap();
        respond.send_informational(hints).unwrap();
        if wait.await.is_ok() {
            let resp = http::Response::builder()
                .status(200)
                .header("content-length", "2")
                .body(())
                .unwrap();
            let mut send = respond.send_response(resp, false).unwrap();
            send.send_data(bytes::Bytes::from_static(b"ok"), true)
                .unwrap();
        }
        let _ = driver.await;
    });
    (addr, go)
}

fn h2_group(up: SocketAddr) -> Running {
    proxy(&format!("\"{up}\""), "", "protocol = \"h2\"")
}

#[tokio::test]
async fn early_hints_of_an_h2_upstream_reach_http1_clients_before_the_final_response() {
    let (up, go) = held_back_h2_upstream().await;
    let p = h2_group(up);
    let mut s = TcpStream::connect(p.addr("p").unwrap()).await.unwrap();
    s.write_all(b"GET /page HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    read_heads(&mut s, &mut buf, 1).await;
    let hints = b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n";
    assert_eq!(buf, hints, "{}", String::from_utf8_lossy(&buf));
    go.send(()).unwrap();
    tokio::time::timeout(T, s.read_to_end(&mut buf))
        .await
        .expect("response in time")
        .unwrap();
    let text = String::from_utf8_lossy(&buf[hints.len()..]);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.ends_with("\r\n\r\nok"), "{text}");
}

#[tokio::test]
async fn early_hints_of_an_h2_upstream_reach_http2_clients_before_the_final_response() {
    let (up, go) = held_back_h2_upstream().await;
    let p = h2_group(up);
    let tcp = TcpStream::connect(p.addr("p").unwrap()).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let mut client = tokio::time::timeout(T, client.ready())
        .await
        .expect("ready")
        .unwrap();
    let req = http::Request::get("http://app.test/page").body(()).unwrap();
    let (mut resp, _) = client.send_request(req, true).unwrap();
    let info = tokio::time::timeout(T, poll_fn(|cx| resp.poll_informational(cx)))
        .await
        .expect("the 103 before the final response")
        .expect("an informational response")
        .unwrap();
    assert_eq!(info.status(), 103);
    assert_eq!(info.headers()["link"], "</a.css>; rel=preload");
    go.send(()).unwrap();
    let resp = tokio::time::timeout(T, resp).await.expect("head").unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut got = Vec::new();
    while let Some(d) = tokio::time::timeout(T, body.data()).await.expect("body") {
        got.extend_from_slice(&d.unwrap());
    }
    assert_eq!(got, b"ok");
}

/// HTTP/1.0 clients get no interim responses (RFC 9110 15.2), only the final one.
#[test]
fn http10_clients_get_no_early_hints() {
    let up = TestUpstream::start(|_| Reply::Raw([HINTS, FINAL].concat()));
    let p = proxy(&format!("\"{}\"", up.addr), "", "");
    let raw =
        portico_testkit::exchange_raw(p.addr("p").unwrap(), b"GET / HTTP/1.0\r\nHost: a\r\n\r\n")
            .unwrap();
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(!text.contains("103"), "{text}");
}

/// An HTTP/2 client gets a 103 while it is still uploading the request body: the server sends
/// it after the request head and reads the body only after that, and the client sends the body
/// only once it saw the 103.
#[tokio::test]
async fn early_hints_reach_http2_clients_during_the_upload() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 1024];
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let n = s.read(&mut chunk).await.unwrap();
            assert!(n > 0);
            buf.extend_from_slice(&chunk[..n]);
        };
        s.write_all(HINTS).await.unwrap();
        // The body is chunked (no content-length from the client): read to its last chunk.
        while !buf[end..].ends_with(b"0\r\n\r\n") {
            let n = s.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the proxy closed before the body ended");
            buf.extend_from_slice(&chunk[..n]);
        }
        s.write_all(FINAL).await.unwrap();
        let _ = s.read(&mut chunk).await;
    });
    let p = proxy(&format!("\"{up}\""), "", "");
    let tcp = TcpStream::connect(p.addr("p").unwrap()).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let mut client = tokio::time::timeout(T, client.ready())
        .await
        .expect("ready")
        .unwrap();
    let req = http::Request::post("http://app.test/form")
        .body(())
        .unwrap();
    let (mut resp, mut send) = client.send_request(req, false).unwrap();
    let info = tokio::time::timeout(T, poll_fn(|cx| resp.poll_informational(cx)))
        .await
        .expect("the 103 before the body was sent")
        .expect("an informational response")
        .unwrap();
    assert_eq!(info.status(), 103);
    send.send_data(bytes::Bytes::from_static(b"a=1"), true)
        .unwrap();
    let resp = tokio::time::timeout(T, resp).await.expect("head").unwrap();
    assert_eq!(resp.status(), 200);
}

/// An HTTP/1.1 client's upload: the 103 the server sends before it has read the body is held
/// while the client is still sending (its connection is being read, not written), and reaches
/// the client once the upload is over, before the final response.
#[tokio::test]
async fn early_hints_reach_http1_clients_after_an_upload() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = l.local_addr().unwrap();
    let (hinted, hints_sent) = oneshot::channel::<()>();
    let (go, wait) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 1024];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut chunk).await.unwrap();
            assert!(n > 0);
            buf.extend_from_slice(&chunk[..n]);
        }
        s.write_all(HINTS).await.unwrap();
        let _ = hinted.send(());
        while !buf.ends_with(b"a=1") {
            let n = s.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the proxy closed before the body ended");
            buf.extend_from_slice(&chunk[..n]);
        }
        if wait.await.is_ok() {
            s.write_all(FINAL).await.unwrap();
        }
        let _ = s.read(&mut chunk).await;
    });
    let p = proxy(&format!("\"{up}\""), "", "");
    let mut s = TcpStream::connect(p.addr("p").unwrap()).await.unwrap();
    s.write_all(
        b"POST /form HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    tokio::time::timeout(T, hints_sent)
        .await
        .expect("the server sent its 103")
        .unwrap();
    // The upload is not over: nothing reaches the client. A short bounded read must find
    // nothing (a proxy passing the 103 on at once would have it here well within this).
    let mut chunk = [0u8; 1024];
    let early = tokio::time::timeout(Duration::from_millis(300), s.read(&mut chunk)).await;
    assert!(
        early.is_err(),
        "the client got something during its upload: {early:?} {}",
        String::from_utf8_lossy(&chunk)
    );
    s.write_all(b"a=1").await.unwrap();
    let mut buf = Vec::new();
    read_heads(&mut s, &mut buf, 1).await;
    assert_eq!(buf, HINTS, "{}", String::from_utf8_lossy(&buf));
    go.send(()).unwrap();
    tokio::time::timeout(T, s.read_to_end(&mut buf))
        .await
        .expect("response in time")
        .unwrap();
    let text = String::from_utf8_lossy(&buf[HINTS.len()..]);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
}

/// The same commitment over an HTTP/2 upstream: a 103 then a 503 that the route would retry
/// reach the client, and the server sees one request.
#[tokio::test]
async fn no_retry_once_early_hints_of_an_h2_upstream_went_to_the_client() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = l.local_addr().unwrap();
    let requests = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = requests.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(s).await else {
                    return;
                };
                while let Some(Ok((_req, mut respond))) = conn.accept().await {
                    seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let hints = http::Response::builder().status(103).body(()).unwrap();
                    let _ = respond.send_informational(hints);
                    let busy = http::Response::builder().status(503).body(()).unwrap();
                    let _ = respond.send_response(busy, true);
                }
            });
        }
    });
    let p = proxy(
        &format!("\"{up}\""),
        "retry = { retries = 1, on = [\"reset\", \"503\"] }",
        "protocol = \"h2\"",
    );
    let mut s = TcpStream::connect(p.addr("p").unwrap()).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(T, s.read_to_end(&mut buf))
        .await
        .expect("response in time")
        .unwrap();
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 103 Early Hints\r\n"), "{text}");
    assert!(text.contains("\r\n\r\nHTTP/1.1 503 "), "{text}");
    assert_eq!(requests.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// An HTTP/2 client connected to the proxy (h2c), ready for requests.
async fn h2_client(p: &Running) -> h2::client::SendRequest<bytes::Bytes> {
    let tcp = TcpStream::connect(p.addr("p").unwrap()).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    tokio::time::timeout(T, client.ready())
        .await
        .expect("ready")
        .unwrap()
}

/// The informational responses of `resp` until its final head, then that head's status.
async fn informational_then_final(
    resp: &mut h2::client::ResponseFuture,
) -> (Vec<http::StatusCode>, http::StatusCode) {
    let mut infos = Vec::new();
    while let Some(info) = tokio::time::timeout(T, poll_fn(|cx| resp.poll_informational(cx)))
        .await
        .expect("informational in time")
    {
        infos.push(info.unwrap().status());
    }
    let head = tokio::time::timeout(T, resp).await.expect("head").unwrap();
    (infos, head.status())
}

/// The commitment for HTTP/2 clients: after a 103 the 503 the route would retry reaches the
/// client, and the server sees the request once; without a 103 the same 503 is retried.
#[tokio::test]
async fn no_retry_once_early_hints_went_to_an_http2_client() {
    let up = TestUpstream::start(|r| {
        let busy = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n";
        match r.target.as_str() {
            "/hinted" => Reply::Raw([HINTS, busy.as_slice()].concat()),
            _ => Reply::Raw(busy.to_vec()),
        }
    });
    let p = proxy(
        &format!("\"{}\"", up.addr),
        "retry = { retries = 1, on = [\"reset\", \"503\"] }",
        "",
    );
    let mut client = h2_client(&p).await;
    let req = http::Request::get("http://a/hinted").body(()).unwrap();
    let (mut resp, _) = client.send_request(req, true).unwrap();
    let (infos, status) = informational_then_final(&mut resp).await;
    assert_eq!(infos, [103]);
    assert_eq!(status, 503);
    let mut client = tokio::time::timeout(T, client.ready())
        .await
        .expect("ready")
        .unwrap();
    let req = http::Request::get("http://a/plain").body(()).unwrap();
    let (mut resp, _) = client.send_request(req, true).unwrap();
    let (infos, status) = informational_then_final(&mut resp).await;
    assert!(infos.is_empty(), "{infos:?}");
    assert_eq!(status, 503);
    let count = |t: &str| up.requests().iter().filter(|r| r.target == t).count();
    assert_eq!(count("/hinted"), 1, "committed by the 103: not retried");
    assert_eq!(count("/plain"), 2, "retried once");
}

/// At most 8 interim responses per request reach an HTTP/2 client: a server sending a ninth
/// gets the client a 502 after the eight.
#[tokio::test]
async fn a_ninth_interim_response_of_an_http1_upstream_is_a_502_for_http2_clients() {
    let up = TestUpstream::start(|_| Reply::Raw([HINTS.repeat(9).as_slice(), FINAL].concat()));
    let p = proxy(&format!("\"{}\"", up.addr), "", "");
    let mut client = h2_client(&p).await;
    let req = http::Request::get("http://a/").body(()).unwrap();
    let (mut resp, _) = client.send_request(req, true).unwrap();
    let (infos, status) = informational_then_final(&mut resp).await;
    assert_eq!(infos, [103; 8]);
    assert_eq!(status, 502);
}

/// The same limit over an HTTP/2 upstream.
#[tokio::test]
async fn a_ninth_interim_response_of_an_h2_upstream_is_a_502_for_http2_clients() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        let mut conn = h2::server::handshake(s).await.unwrap();
        let (_req, mut respond) = conn.accept().await.unwrap().unwrap();
        let driver = tokio::spawn(async move { while conn.accept().await.is_some() {} });
        for _ in 0..9 {
            let hints = http::Response::builder().status(103).body(()).unwrap();
            if respond.send_informational(hints).is_err() {
                break;
            }
        }
        let resp = http::Response::builder().status(200).body(()).unwrap();
        let _ = respond.send_response(resp, true);
        let _ = driver.await;
    });
    let p = h2_group(up);
    let mut client = h2_client(&p).await;
    let req = http::Request::get("http://a/").body(()).unwrap();
    let (mut resp, _) = client.send_request(req, true).unwrap();
    let (infos, status) = informational_then_final(&mut resp).await;
    assert_eq!(infos, [103; 8]);
    assert_eq!(status, 502);
}

/// An HTTP/2 client that resets its stream after a 103, before the final response: the proxy
/// closes the server connection promptly and records the end as the client's.
#[tokio::test]
async fn an_http2_client_reset_after_early_hints_closes_the_upstream() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = l.local_addr().unwrap();
    let (closed, upstream_closed) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 1024];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the proxy closed before sending a request");
            buf.extend_from_slice(&chunk[..n]);
        }
        s.write_all(HINTS).await.unwrap();
        // No final response: wait for the proxy to close (EOF or reset).
        while let Ok(n) = s.read(&mut chunk).await {
            if n == 0 {
                break;
            }
        }
        let _ = closed.send(());
    });
    let p = proxy(&format!("\"{up}\""), "", "");
    let mut client = h2_client(&p).await;
    let req = http::Request::get("http://a/page").body(()).unwrap();
    let (mut resp, mut send) = client.send_request(req, true).unwrap();
    let info = tokio::time::timeout(T, poll_fn(|cx| resp.poll_informational(cx)))
        .await
        .expect("the 103")
        .expect("an informational response")
        .unwrap();
    assert_eq!(info.status(), 103);
    send.send_reset(h2::Reason::CANCEL);
    tokio::time::timeout(T, upstream_closed)
        .await
        .expect("the upstream connection closed after the reset")
        .unwrap();
    let stats = p.stats().clone();
    let deadline = tokio::time::Instant::now() + T;
    let records = loop {
        let records = stats.termination_counts();
        if !records.is_empty() {
            break records;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no termination record"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let t = Termination::new(Side::Client, Phase::ResponseHead, Cause::Closed);
    assert_eq!(records, [(t, 1)]);
}

/// HTTP/1.0 clients get no interim responses from an HTTP/2 server either, only the final one.
#[tokio::test]
async fn http10_clients_get_no_early_hints_of_an_h2_upstream() {
    let (up, go) = held_back_h2_upstream().await;
    // The server sends its final response right after the 103.
    go.send(()).unwrap();
    let p = h2_group(up);
    let mut s = TcpStream::connect(p.addr("p").unwrap()).await.unwrap();
    s.write_all(b"GET /page HTTP/1.0\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(T, s.read_to_end(&mut buf))
        .await
        .expect("response in time")
        .unwrap();
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(!text.contains("103"), "{text}");
    assert!(text.ends_with("\r\n\r\nok"), "{text}");
}
