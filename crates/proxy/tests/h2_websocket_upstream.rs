//! WebSockets from HTTP/2 clients to `protocol = "h2"` groups: an in-process h2 client through a
//! real portico to an in-process h2 server, RFC 8441 extended CONNECT on both legs.

use bytes::Bytes;
use h2::client::SendRequest;
use portico_proxy::stats::{Cause, Phase, Side};
use portico_proxy::{start, Running, Termination};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// Every test step is bounded by this.
const T: Duration = Duration::from_secs(10);

/// How the scripted h2 server answers an extended CONNECT.
#[derive(Clone, Copy, PartialEq)]
enum Answer {
    /// 200 with `sec-websocket-protocol: chat`, "welcome", then each DATA echoed in upper
    /// case; at the client's END_STREAM, "bye" and END_STREAM.
    Echo,
    /// 403 with the body "no".
    Forbidden,
    /// 200, then nothing (for the idle timeout).
    Silent,
}

/// What the server saw of one request.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    protocol: Option<String>,
    path: String,
    authority: String,
    headers: http::HeaderMap,
}

struct Server {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// One message per stream when it ends: "end" (clean), "reset" (reset by the proxy).
    ended: mpsc::UnboundedReceiver<&'static str>,
}

/// An h2c server; `extended`: it advertises SETTINGS_ENABLE_CONNECT_PROTOCOL.
async fn server(answer: Answer, extended: bool) -> Server {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (tx, ended) = mpsc::unbounded_channel();
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let (log, tx) = (log.clone(), tx.clone());
            tokio::spawn(async move {
                let mut b = h2::server::Builder::new();
                if extended {
                    b.enable_connect_protocol();
                }
                let Ok(mut conn) = b.handshake::<_, Bytes>(s).await else {
                    return;
                };
                while let Some(Ok((req, respond))) = conn.accept().await {
                    tokio::spawn(stream(req, respond, answer, log.clone(), tx.clone()));
                }
            });
        }
    });
    Server { addr, seen, ended }
}

async fn stream(
    req: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    answer: Answer,
    log: Arc<Mutex<Vec<Seen>>>,
    ended: mpsc::UnboundedSender<&'static str>,
) {
    let (parts, mut body) = req.into_parts();
    log.lock().unwrap().push(Seen {
        method: parts.method.to_string(),
        protocol: parts
            .extensions
            .get::<h2::ext::Protocol>()
            .map(|p| p.as_str().to_string()),
        path: parts.uri.path().to_string(),
        authority: parts.uri.authority().map_or("", |a| a.as_str()).to_string(),
        headers: parts.headers.clone(),
    });
    let status = if answer == Answer::Forbidden {
        403
    } else {
        200
    };
    let mut resp = http::Response::builder().status(status);
    if answer == Answer::Echo {
        resp = resp.header("sec-websocket-protocol", "chat");
    }
    let mut send = respond
        .send_response(resp.body(()).unwrap(), false)
        .unwrap();
    match answer {
        Answer::Forbidden => {
            let _ = send.send_data(Bytes::from_static(b"no"), true);
            return;
        }
        Answer::Silent => {}
        Answer::Echo => {
            let _ = send.send_data(Bytes::from_static(b"welcome"), false);
        }
    }
    loop {
        match body.data().await {
            Some(Ok(d)) => {
                let _ = body.flow_control().release_capacity(d.len());
                if answer == Answer::Echo {
                    let _ = send.send_data(Bytes::from(d.to_ascii_uppercase()), false);
                }
            }
            Some(Err(_)) => {
                let _ = ended.send("reset");
                return;
            }
            None => break,
        }
    }
    let _ = send.send_data(Bytes::from_static(b"bye"), true);
    let _ = ended.send("end");
}

fn proxy(up: SocketAddr, group_extra: &str) -> Running {
    let toml = format!(
        r#"
[[listeners]]
name = "p"
address = "127.0.0.1:0"
[[listeners.routes]]
path = "/fixed"
respond = {{ status = 201, body = "fixed" }}
[[listeners.routes]]
proxy = "b"
[upstreams.b]
servers = ["{up}"]
protocol = "h2"
{group_extra}
"#
    );
    let cfg = portico_config::parse(&toml, "ws-h2-test.toml").unwrap_or_else(|e| panic!("{e}"));
    start(cfg, 1).expect("start")
}

/// An h2c client whose connection has seen the proxy's SETTINGS (a first request answered).
async fn client(addr: SocketAddr) -> SendRequest<Bytes> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let mut c = tokio::time::timeout(T, client.ready())
        .await
        .unwrap()
        .unwrap();
    let get = http::Request::get("http://a/fixed").body(()).unwrap();
    let (resp, _) = c.send_request(get, true).unwrap();
    let resp = tokio::time::timeout(T, resp).await.unwrap().unwrap();
    assert_eq!(resp.status(), 201);
    assert!(c.is_extended_connect_protocol_enabled());
    c
}

/// Send a WebSocket extended CONNECT and wait for its response head.
async fn open(
    c: &mut SendRequest<Bytes>,
    uri: &str,
) -> (http::Response<h2::RecvStream>, h2::SendStream<Bytes>) {
    let mut req = http::Request::builder()
        .method("CONNECT")
        .uri(uri)
        .header("sec-websocket-version", "13")
        .header("sec-websocket-protocol", "chat, superchat")
        .body(())
        .unwrap();
    req.extensions_mut()
        .insert(h2::ext::Protocol::from_static("websocket"));
    let (resp, send) = c.send_request(req, false).unwrap();
    let resp = tokio::time::timeout(T, resp).await.unwrap().unwrap();
    (resp, send)
}

/// Read DATA until `want` bytes arrived (or the stream ended).
async fn read_n(body: &mut h2::RecvStream, want: usize) -> Vec<u8> {
    let mut got = Vec::new();
    while got.len() < want {
        let Some(d) = tokio::time::timeout(T, body.data())
            .await
            .expect("data in time")
        else {
            break;
        };
        let d = d.unwrap();
        let _ = body.flow_control().release_capacity(d.len());
        got.extend_from_slice(&d);
    }
    got
}

/// Wait for a record (no notification to wait on; polled, bounded).
async fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + T;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn websocket_to_an_h2_group_is_an_extended_connect_with_bytes_both_ways() {
    let mut up = server(Answer::Echo, true).await;
    let p = proxy(up.addr, "");
    let mut c = client(p.addr("p").unwrap()).await;
    // The first request to the server opens the upstream connection: the proxy must wait for
    // the server's SETTINGS before it may send `:protocol`.
    let (resp, mut send) = open(&mut c, "http://app.test/ws?room=1").await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers().get("sec-websocket-protocol").unwrap(),
        "chat"
    );
    assert!(resp.headers().get("content-length").is_none());
    let mut body = resp.into_body();
    assert_eq!(read_n(&mut body, 7).await, b"welcome");
    send.send_data(Bytes::from_static(b"ping"), false).unwrap();
    assert_eq!(read_n(&mut body, 4).await, b"PING");
    send.send_data(Bytes::from(vec![b'x'; 100_000]), false)
        .unwrap();
    assert_eq!(read_n(&mut body, 100_000).await, vec![b'X'; 100_000]);
    // The client's END_STREAM reaches the server, whose last bytes and END_STREAM come back.
    send.send_data(Bytes::new(), true).unwrap();
    assert_eq!(read_n(&mut body, 10).await, b"bye");
    assert!(tokio::time::timeout(T, body.data())
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        tokio::time::timeout(T, up.ended.recv()).await.unwrap(),
        Some("end")
    );

    let seen = up.seen.lock().unwrap()[0].clone();
    assert_eq!(seen.method, "CONNECT");
    assert_eq!(seen.protocol.as_deref(), Some("websocket"));
    assert_eq!(seen.path, "/ws");
    assert_eq!(seen.authority, "app.test");
    assert_eq!(seen.headers.get("sec-websocket-version").unwrap(), "13");
    assert_eq!(
        seen.headers.get("sec-websocket-protocol").unwrap(),
        "chat, superchat"
    );
    for hop in ["sec-websocket-key", "upgrade", "connection"] {
        assert!(seen.headers.get(hop).is_none(), "{hop} forwarded");
    }
    let stats = p.stats().clone();
    until("the success record", || {
        stats.terminations(Termination::OK) == 2
    })
    .await;
}

#[tokio::test]
async fn a_server_that_does_not_allow_extended_connect_gets_none() {
    let up = server(Answer::Echo, false).await;
    let p = proxy(up.addr, "");
    let mut c = client(p.addr("p").unwrap()).await;
    let (resp, _send) = open(&mut c, "http://app.test/ws").await;
    assert_eq!(resp.status(), 501);
    assert!(
        up.seen.lock().unwrap().is_empty(),
        "nothing reached the server"
    );
    let t = Termination::new(Side::Proxy, Phase::RequestHead, Cause::Refused);
    let stats = p.stats().clone();
    until("the proxy-refused record", || stats.terminations(t) == 1).await;
}

#[tokio::test]
async fn a_refusal_is_relayed_as_a_response() {
    let up = server(Answer::Forbidden, true).await;
    let p = proxy(up.addr, "");
    let mut c = client(p.addr("p").unwrap()).await;
    let (resp, _send) = open(&mut c, "http://app.test/ws").await;
    assert_eq!(resp.status(), 403);
    let mut body = resp.into_body();
    assert_eq!(read_n(&mut body, 10).await, b"no");
}

#[tokio::test]
async fn a_client_reset_resets_the_server_stream() {
    let mut up = server(Answer::Echo, true).await;
    let p = proxy(up.addr, "");
    let mut c = client(p.addr("p").unwrap()).await;
    let (resp, mut send) = open(&mut c, "http://app.test/ws").await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    assert_eq!(read_n(&mut body, 7).await, b"welcome");
    send.send_reset(h2::Reason::CANCEL);
    assert_eq!(
        tokio::time::timeout(T, up.ended.recv()).await.unwrap(),
        Some("reset")
    );
    let t = Termination::new(Side::Client, Phase::Tunnel, Cause::Closed);
    let stats = p.stats().clone();
    until("the client-closed record", || stats.terminations(t) == 1).await;
}

#[tokio::test]
async fn an_idle_tunnel_ends_at_the_group_idle_timeout() {
    let mut up = server(Answer::Silent, true).await;
    let p = proxy(up.addr, "idle_timeout = \"300ms\"");
    let mut c = client(p.addr("p").unwrap()).await;
    // Taken before the request: the proxy's timer starts later.
    let started = Instant::now();
    let (resp, _send) = open(&mut c, "http://app.test/ws").await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let end = tokio::time::timeout(T, body.data())
        .await
        .expect("ended in time");
    let err = end.expect("a reset, not a clean end").unwrap_err();
    assert_eq!(err.reason(), Some(h2::Reason::CANCEL));
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(
        tokio::time::timeout(T, up.ended.recv()).await.unwrap(),
        Some("reset")
    );
    let t = Termination::new(Side::Upstream, Phase::Tunnel, Cause::Timeout);
    let stats = p.stats().clone();
    until("the idle record", || stats.terminations(t) == 1).await;
}

/// An HTTP/1.1 client's WebSocket opening handshake (RFC 6455 1.3's key) with `early` bytes
/// in the same write; returns the connection and what it read up to the end of the head.
async fn h1_upgrade(addr: SocketAddr, early: &[u8]) -> (TcpStream, String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut req = b"GET /chat HTTP/1.1\r\nHost: app.test\r\nConnection: Upgrade\r\n\
        Upgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
        Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: chat\r\n\r\n"
        .to_vec();
    req.extend_from_slice(early);
    s.write_all(&req).await.unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = tokio::time::timeout(T, s.read(&mut chunk))
            .await
            .unwrap()
            .unwrap();
        assert!(
            n > 0,
            "closed before the head: {:?}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
    (s, head, got[end..].to_vec())
}

/// Read from `s` until `want` bytes (after `have`) or EOF.
async fn read_tcp(s: &mut TcpStream, mut have: Vec<u8>, want: usize) -> Vec<u8> {
    let mut chunk = [0u8; 4096];
    while have.len() < want {
        let n = tokio::time::timeout(T, s.read(&mut chunk))
            .await
            .unwrap()
            .unwrap();
        if n == 0 {
            break;
        }
        have.extend_from_slice(&chunk[..n]);
    }
    have
}

#[tokio::test]
async fn an_http1_websocket_to_an_h2_group_is_a_101_over_an_extended_connect() {
    let mut up = server(Answer::Echo, true).await;
    let p = proxy(up.addr, "");
    let (mut s, head, rest) = h1_upgrade(p.addr("p").unwrap(), b"early").await;
    assert!(head.starts_with("http/1.1 101 "), "{head}");
    assert!(head.contains("upgrade: websocket\r\n"), "{head}");
    assert!(head.contains("connection: upgrade\r\n"), "{head}");
    // RFC 6455 1.3: the accept for the client's key, made by the proxy (HTTP/2 has none).
    assert!(
        head.contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo=\r\n"),
        "{head}"
    );
    assert!(head.contains("sec-websocket-protocol: chat\r\n"), "{head}");
    assert!(!head.contains("content-length"), "{head}");
    // The server's first bytes, then the client's early bytes echoed.
    assert_eq!(read_tcp(&mut s, rest, 12).await, b"welcomeEARLY");
    s.write_all(b"ping").await.unwrap();
    assert_eq!(read_tcp(&mut s, Vec::new(), 4).await, b"PING");
    // The client's half close reaches the server as END_STREAM; its answer and END_STREAM
    // come back as bytes and EOF.
    s.shutdown().await.unwrap();
    assert_eq!(read_tcp(&mut s, Vec::new(), 100).await, b"bye");
    assert_eq!(
        tokio::time::timeout(T, up.ended.recv()).await.unwrap(),
        Some("end")
    );
    let seen = up.seen.lock().unwrap()[0].clone();
    assert_eq!(seen.method, "CONNECT");
    assert_eq!(seen.protocol.as_deref(), Some("websocket"));
    assert_eq!(seen.path, "/chat");
    assert!(seen.headers.get("sec-websocket-key").is_none());
    assert_eq!(seen.headers.get("sec-websocket-version").unwrap(), "13");
    let stats = p.stats().clone();
    until("the success record", || {
        stats.terminations(Termination::OK) == 1
    })
    .await;
}

#[tokio::test]
async fn an_http1_websocket_refused_by_the_h2_server_gets_its_answer() {
    let up = server(Answer::Forbidden, true).await;
    let p = proxy(up.addr, "");
    let (mut s, head, rest) = h1_upgrade(p.addr("p").unwrap(), b"").await;
    assert!(head.starts_with("http/1.1 403 "), "{head}");
    assert!(!head.contains("upgrade"), "{head}");
    // The server sent no length: chunked.
    assert!(head.contains("transfer-encoding: chunked\r\n"), "{head}");
    assert_eq!(read_tcp(&mut s, rest, 12).await, b"2\r\nno\r\n0\r\n\r\n");
}
