//! WebSockets over HTTP/2 (RFC 8441 extended CONNECT) end to end: an in-process h2 client through a real portico to an in-process HTTP/1.1 upstream that answers the upgrade, or to an h2 server (extended CONNECT on both legs, also from HTTP/1.1 clients).

use crate::common::{until, T};
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
/// How the scripted upstream answers an upgrade request.
#[derive(Clone, Copy)]
enum Answer {
    /// 101 with the right accept and "welcome" in the same write, then echo; at EOF write
    /// "bye" and close.
    Echo,
    /// 101 whose Sec-WebSocket-Accept is wrong.
    WrongAccept,
    /// 403 with a body.
    Forbidden,
    /// 200: the upstream ignored the upgrade.
    Ok,
    /// 101 and then nothing (for the idle timeout).
    Silent,
    /// 101 with "done", then close.
    CloseFirst,
    /// 101 with `Content-Length: 0` and "hello" in the same write, then read until EOF.
    ContentLength,
    /// 101, then never read; "tick" every 100 ms.
    StuckTicker,
}

/// A scripted HTTP/1.1 upstream: each request head (text) is recorded; `closed` gets one
/// message per connection when the proxy closes it after the handshake.
struct Upstream {
    addr: SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
    closed: mpsc::UnboundedReceiver<()>,
}

async fn upstream(answer: Answer) -> Upstream {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let (tx, closed) = mpsc::unbounded_channel();
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(serve(s, answer, seen.clone(), tx.clone()));
        }
    });
    Upstream {
        addr,
        heads,
        closed,
    }
}

async fn serve(
    mut s: TcpStream,
    answer: Answer,
    heads: Arc<Mutex<Vec<String>>>,
    closed: mpsc::UnboundedSender<()>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let rest = buf[end..].to_vec();
    let key = head
        .lines()
        .find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case("sec-websocket-key")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    heads.lock().unwrap().push(head.clone());
    if !head.to_ascii_lowercase().contains("upgrade: websocket") {
        // A plain request (on the same client connection as a tunnel): read the body, 200.
        let len: usize = head
            .lines()
            .find_map(|l| {
                let (n, v) = l.split_once(':')?;
                n.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .unwrap_or(0);
        let mut got = rest.len();
        while got < len {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got += n,
            }
        }
        let r = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        let _ = s.write_all(r.as_bytes()).await;
        return;
    }
    let accept = portico_proxy::h2::websocket_accept(key.as_bytes());
    let switch = |accept: &str| {
        format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Accept: {accept}\r\nSec-WebSocket-Protocol: chat\r\n\r\n"
        )
    };
    match answer {
        Answer::Forbidden => {
            let r = "HTTP/1.1 403 Forbidden\r\ncontent-length: 6\r\n\r\nno way";
            let _ = s.write_all(r.as_bytes()).await;
            return;
        }
        Answer::Ok => {
            let r = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi";
            let _ = s.write_all(r.as_bytes()).await;
            return;
        }
        Answer::WrongAccept => {
            let _ = s
                .write_all(switch("AAAAAAAAAAAAAAAAAAAAAAAAAAA=").as_bytes())
                .await;
            return;
        }
        Answer::CloseFirst => {
            let _ = s.write_all((switch(&accept) + "done").as_bytes()).await;
            drop(s);
            let _ = closed.send(());
            return;
        }
        Answer::ContentLength => {
            let sw = switch(&accept).replace("\r\n\r\n", "\r\nContent-Length: 0\r\n\r\n");
            if s.write_all((sw + "hello").as_bytes()).await.is_err() {
                return;
            }
        }
        Answer::StuckTicker => {
            if s.write_all(switch(&accept).as_bytes()).await.is_err() {
                return;
            }
            loop {
                if s.write_all(b"tick").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Answer::Silent => {
            if s.write_all(switch(&accept).as_bytes()).await.is_err() {
                return;
            }
        }
        Answer::Echo => {
            let first = switch(&accept) + "welcome";
            if s.write_all(first.as_bytes()).await.is_err() {
                return;
            }
        }
    }
    // Bytes that came with the head are the first tunnel bytes.
    if matches!(answer, Answer::Echo) && !rest.is_empty() && s.write_all(&rest).await.is_err() {
        return;
    }
    let mut big = vec![0u8; 64 * 1024];
    loop {
        match s.read(&mut big).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if matches!(answer, Answer::Echo) && s.write_all(&big[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
    // The proxy half-closed (or closed) the tunnel: an echo server still has its say.
    if matches!(answer, Answer::Echo) {
        let _ = s.write_all(b"bye").await;
    }
    drop(s);
    let _ = closed.send(());
}

/// Echo each DATA under the client's window (see `H2Answer::FlowEcho`); END_STREAM back at the
/// end. "end" or "reset".
async fn flow_echo(body: &mut h2::RecvStream, send: &mut h2::SendStream<Bytes>) -> &'static str {
    loop {
        match body.data().await {
            Some(Ok(d)) => {
                let _ = body.flow_control().release_capacity(d.len());
                let mut d = d;
                while !d.is_empty() {
                    send.reserve_capacity(d.len());
                    let Some(Ok(cap)) = std::future::poll_fn(|cx| send.poll_capacity(cx)).await
                    else {
                        return "reset";
                    };
                    if send.send_data(d.split_to(cap.min(d.len())), false).is_err() {
                        return "reset";
                    }
                }
            }
            Some(Err(_)) => return "reset",
            None => break,
        }
    }
    let _ = send.send_data(Bytes::new(), true);
    "end"
}

fn proxy(up: SocketAddr, extra: &str, group_extra: &str) -> Running {
    let toml = format!(
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
{group_extra}
"#
    );
    let cfg = portico_config::parse(&toml, "ws-test.toml").unwrap_or_else(|e| panic!("{e}"));
    start(cfg, 1).expect("start")
}

/// An h2c client whose connection has seen the server's SETTINGS (a first request answered).
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
    c
}

/// Send an extended CONNECT (see `connect`) and wait for its response head.
async fn open(
    c: &mut SendRequest<Bytes>,
    uri: &str,
    protocol: Option<&'static str>,
) -> (http::Response<h2::RecvStream>, h2::SendStream<Bytes>) {
    let (resp, send) = c.send_request(connect(uri, protocol), false).unwrap();
    let resp = tokio::time::timeout(T, resp).await.unwrap().unwrap();
    (resp, send)
}

fn connect(uri: &str, protocol: Option<&'static str>) -> http::Request<()> {
    let mut req = http::Request::builder()
        .method("CONNECT")
        .uri(uri)
        .header("sec-websocket-version", "13")
        .header("sec-websocket-protocol", "chat, superchat")
        .body(())
        .unwrap();
    if let Some(p) = protocol {
        req.extensions_mut()
            .insert(h2::ext::Protocol::from_static(p));
    }
    req
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

/// Send `data` under flow control (as a well-behaved client does).
async fn send_all(send: &mut h2::SendStream<Bytes>, mut data: Bytes, end: bool) {
    if data.is_empty() {
        send.send_data(data, end).unwrap();
        return;
    }
    while !data.is_empty() {
        send.reserve_capacity(data.len());
        let cap = tokio::time::timeout(T, std::future::poll_fn(|cx| send.poll_capacity(cx)))
            .await
            .expect("capacity in time")
            .unwrap()
            .unwrap();
        let n = cap.min(data.len());
        send.send_data(data.split_to(n), end && data.is_empty())
            .unwrap();
    }
}

#[tokio::test]
async fn websocket_over_h2_is_an_http1_upgrade_upstream_with_bytes_both_ways() {
    let mut up = upstream(Answer::Echo).await;
    let dir = std::env::temp_dir().join(format!("portico-h2ws-log-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("access.log");
    let p = proxy(
        up.addr,
        "",
        &format!("[access_log]\npath = \"{}\"\n", path.display()),
    );
    let mut c = client(p.addr("p").unwrap()).await;
    assert!(
        c.is_extended_connect_protocol_enabled(),
        "SETTINGS_ENABLE_CONNECT_PROTOCOL advertised"
    );
    let req = connect("http://chat.test/chat?room=1", Some("websocket"));
    let (resp, mut send) = c.send_request(req, false).unwrap();
    let resp = tokio::time::timeout(T, resp).await.unwrap().unwrap();
    assert_eq!(resp.status(), 200, "RFC 8441: 200, not 101");
    assert_eq!(resp.headers()["sec-websocket-protocol"], "chat");
    assert!(resp.headers().get("sec-websocket-accept").is_none());
    assert!(resp.headers().get("upgrade").is_none());
    let mut body = resp.into_body();

    // What the upstream saw: an HTTP/1.1 WebSocket handshake with a key the proxy made.
    let head = up.heads.lock().unwrap()[0].clone();
    let lower = head.to_ascii_lowercase();
    assert!(head.starts_with("GET /chat?room=1 HTTP/1.1\r\n"), "{head}");
    assert!(lower.contains("\r\nhost: chat.test\r\n"), "{head}");
    assert!(lower.contains("\r\nconnection: upgrade\r\n"), "{head}");
    assert!(lower.contains("\r\nupgrade: websocket\r\n"), "{head}");
    assert!(
        lower.contains("\r\nsec-websocket-version: 13\r\n"),
        "{head}"
    );
    assert!(
        lower.contains("\r\nsec-websocket-protocol: chat, superchat\r\n"),
        "{head}"
    );
    let key = lower
        .lines()
        .find_map(|l| l.strip_prefix("sec-websocket-key: "))
        .expect("a key");
    assert_eq!(key.len(), 24, "{key}");
    assert!(!lower.contains("content-length") && !lower.contains("transfer-encoding"));

    // Bytes that came in the same read as the 101 head are the tunnel's first.
    assert_eq!(read_n(&mut body, 7).await, b"welcome");
    // Small messages both ways.
    send_all(&mut send, Bytes::from_static(b"hello"), false).await;
    assert_eq!(read_n(&mut body, 5).await, b"hello");
    // More than the client's 64 KiB window and the proxy's per-read chunk: flow control both
    // ways (the echo comes back while the client is still sending).
    let big: Vec<u8> = (0..300 * 1024).map(|i| (i % 251) as u8).collect();
    let reader = async { read_n(&mut body, big.len()).await };
    let writer = send_all(&mut send, Bytes::from(big.clone()), false);
    let (echoed, ()) = tokio::join!(reader, writer);
    assert!(echoed == big, "300 KiB echoed intact");

    // END_STREAM from the client is a half close: the upstream sees EOF, still answers, then
    // closes, which ends the stream.
    send_all(&mut send, Bytes::from_static(b"last"), true).await;
    let tail = read_n(&mut body, usize::MAX).await;
    assert_eq!(tail, b"lastbye");
    assert!(body.is_end_stream());
    tokio::time::timeout(T, up.closed.recv()).await.unwrap();

    let stats = p.stats().clone();
    until("the tunnel's record", || {
        stats.terminations(Termination::OK) == 2
    })
    .await;
    let log = || std::fs::read_to_string(&path).unwrap_or_default();
    until("two access-log lines", || log().lines().count() == 2).await;
    let line = log().lines().nth(1).unwrap().to_string();
    let down = 7 + 5 + 300 * 1024 + 7;
    assert!(
        line.contains(&format!("\"GET /chat?room=1 HTTP/2.0\" 200 {down} ")),
        "{line}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_refused_upgrade_reaches_the_client_as_a_response() {
    // 403: passed on as is.
    let up = upstream(Answer::Forbidden).await;
    let p = proxy(up.addr, "", "");
    let mut c = client(p.addr("p").unwrap()).await;
    let (resp, _send) = open(&mut c, "http://a/ws", Some("websocket")).await;
    assert_eq!(resp.status(), 403);
    let mut body = resp.into_body();
    assert_eq!(read_n(&mut body, usize::MAX).await, b"no way");

    // A 2xx would tell the client a tunnel is open: 502 instead, and so for a wrong accept.
    for answer in [Answer::Ok, Answer::WrongAccept] {
        let up = upstream(answer).await;
        let p = proxy(up.addr, "", "");
        let mut c = client(p.addr("p").unwrap()).await;
        let (resp, _send) = open(&mut c, "http://a/ws", Some("websocket")).await;
        assert_eq!(resp.status(), 502);
        let t = Termination::new(Side::Upstream, Phase::ResponseHead, Cause::BadResponse);
        let stats = p.stats().clone();
        until("the 502 record", || stats.terminations(t) == 1).await;
    }
}

#[tokio::test]
async fn an_upstream_close_ends_the_stream_and_the_client_still_half_closes() {
    let mut up = upstream(Answer::CloseFirst).await;
    let p = proxy(up.addr, "", "");
    let mut c = client(p.addr("p").unwrap()).await;
    let (resp, mut send) = open(&mut c, "http://a/ws", Some("websocket")).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    // Upstream EOF = END_STREAM.
    assert_eq!(read_n(&mut body, usize::MAX).await, b"done");
    assert!(body.is_end_stream());
    tokio::time::timeout(T, up.closed.recv()).await.unwrap();
    // The client's side is still open until it ends it: then the tunnel is complete.
    send_all(&mut send, Bytes::new(), true).await;
    let stats = p.stats().clone();
    until("the tunnel's record", || {
        stats.terminations(Termination::OK) == 2
    })
    .await;
}

#[tokio::test]
async fn after_the_upstream_ended_a_silent_client_is_the_one_timed_out() {
    let mut up = upstream(Answer::CloseFirst).await;
    let p = proxy(up.addr, "", "idle_timeout = \"300ms\"");
    let mut c = client(p.addr("p").unwrap()).await;
    let (resp, mut send) = open(&mut c, "http://a/ws", Some("websocket")).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    assert_eq!(read_n(&mut body, usize::MAX).await, b"done");
    assert!(body.is_end_stream());
    tokio::time::timeout(T, up.closed.recv()).await.unwrap();
    // The client never ends its side: at idle_timeout the proxy stops it without an error
    // (its response was complete, RFC 9113 8.1) and the timeout is the client's.
    let reset = tokio::time::timeout(T, std::future::poll_fn(|cx| send.poll_reset(cx)))
        .await
        .expect("reset in time")
        .unwrap();
    assert_eq!(reset, h2::Reason::NO_ERROR);
    let t = Termination::new(Side::Client, Phase::Tunnel, Cause::Timeout);
    let stats = p.stats().clone();
    until("the client-timeout record", || stats.terminations(t) == 1).await;
}

#[tokio::test]
async fn plain_connect_and_other_protocols_are_501() {
    let up = upstream(Answer::Echo).await;
    let p = proxy(up.addr, "", "");
    let mut c = client(p.addr("p").unwrap()).await;
    // Plain CONNECT: Portico is no forward proxy.
    let req = http::Request::builder()
        .method("CONNECT")
        .uri("example.test:443")
        .body(())
        .unwrap();
    let (resp, _send) = c.send_request(req, false).unwrap();
    let resp = tokio::time::timeout(T, resp).await.unwrap().unwrap();
    assert_eq!(resp.status(), 501);
    // An extended CONNECT for another protocol.
    let mut c = tokio::time::timeout(T, c.ready()).await.unwrap().unwrap();
    let (resp, _send) = open(&mut c, "http://a/masque", Some("connect-udp")).await;
    assert_eq!(resp.status(), 501);
    assert!(up.heads.lock().unwrap().is_empty(), "nothing went upstream");
    // Both are the proxy's refusals, not client errors.
    let t = Termination::new(Side::Proxy, Phase::RequestHead, Cause::Refused);
    let stats = p.stats().clone();
    until("two proxy-refused records", || stats.terminations(t) == 2).await;
}

#[tokio::test]
async fn extended_connect_can_be_turned_off() {
    let up = upstream(Answer::Echo).await;
    let p = proxy(up.addr, "http2.extended_connect = false", "");
    let c = client(p.addr("p").unwrap()).await;
    assert!(!c.is_extended_connect_protocol_enabled());
}

#[tokio::test]
async fn a_client_reset_ends_the_tunnel_and_closes_the_upstream() {
    let mut up = upstream(Answer::Echo).await;
    let p = proxy(up.addr, "", "");
    let mut c = client(p.addr("p").unwrap()).await;
    let (resp, mut send) = open(&mut c, "http://a/ws", Some("websocket")).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    send_all(&mut send, Bytes::from_static(b"ping"), false).await;
    assert_eq!(read_n(&mut body, 11).await, b"welcomeping");
    send.send_reset(h2::Reason::CANCEL);
    tokio::time::timeout(T, up.closed.recv())
        .await
        .expect("the upstream connection closed after the reset");
    let t = Termination::new(Side::Client, Phase::Tunnel, Cause::Closed);
    let stats = p.stats().clone();
    until("the client-closed record", || stats.terminations(t) == 1).await;
}

#[tokio::test]
async fn an_idle_tunnel_ends_at_the_group_idle_timeout() {
    let mut up = upstream(Answer::Silent).await;
    let p = proxy(up.addr, "", "idle_timeout = \"300ms\"");
    idle_tunnel_is_cancelled(&p).await;
    tokio::time::timeout(T, up.closed.recv()).await.unwrap();
}

/// Through `p` (a group with `idle_timeout = "300ms"`) to a server that stays silent: the
/// tunnel opens, and the client's stream is reset with CANCEL no sooner than 300 ms after it
/// asked for it, recorded as the upstream's idle timeout.
async fn idle_tunnel_is_cancelled(p: &Running) {
    let mut c = client(p.addr("p").unwrap()).await;
    // Taken before the request: the proxy's timer starts later (after its 200), so however
    // loaded the machine, the reset cannot come sooner than idle_timeout after this.
    let started = Instant::now();
    let (resp, _send) = open(&mut c, "http://a/ws", Some("websocket")).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let end = tokio::time::timeout(T, body.data())
        .await
        .expect("ended in time");
    let err = end.expect("a reset, not a clean end").unwrap_err();
    assert_eq!(err.reason(), Some(h2::Reason::CANCEL));
    assert!(started.elapsed() >= Duration::from_millis(300));
    let t = Termination::new(Side::Upstream, Phase::Tunnel, Cause::Timeout);
    let stats = p.stats().clone();
    until("the idle record", || stats.terminations(t) == 1).await;
}

#[tokio::test]
async fn websocket_to_a_local_route_is_501() {
    let up = upstream(Answer::Echo).await;
    let p = proxy(up.addr, "", "");
    let mut c = client(p.addr("p").unwrap()).await;
    let (resp, _send) = open(&mut c, "http://a/fixed", Some("websocket")).await;
    assert_eq!(resp.status(), 501);
    assert!(up.heads.lock().unwrap().is_empty(), "nothing went upstream");
    // A limitation of the proxy, found at routing.
    let t = Termination::new(Side::Proxy, Phase::Route, Cause::Refused);
    let stats = p.stats().clone();
    until("the proxy-refused record", || stats.terminations(t) == 1).await;
}

#[tokio::test]
async fn a_101_with_content_length_is_a_200_without_it() {
    // RFC 9110 9.3.6: a 2xx to CONNECT has no Content-Length / Transfer-Encoding (the client's
    // h2 would reset the stream at the first DATA).
    let up = upstream(Answer::ContentLength).await;
    let p = proxy(up.addr, "", "");
    let mut c = client(p.addr("p").unwrap()).await;
    let (resp, _send) = open(&mut c, "http://a/ws", Some("websocket")).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("content-length").is_none());
    assert!(resp.headers().get("transfer-encoding").is_none());
    let mut body = resp.into_body();
    let d = tokio::time::timeout(T, body.data()).await.unwrap();
    assert_eq!(d.expect("data").expect("no reset").as_ref(), b"hello");
}

#[tokio::test]
async fn an_upstream_that_stops_reading_ends_the_tunnel_though_it_still_sends() {
    // The upstream never reads but sends a tick every 100 ms: bytes flow to the client, so
    // only a bound on each write to the upstream ends the tunnel. Until then the DATA it does
    // not take holds the stream's and the connection's receive windows.
    let up = upstream(Answer::StuckTicker).await;
    let p = proxy(
        up.addr,
        "http2.initial_window_size = \"16k\"",
        "idle_timeout = \"300ms\"",
    );
    let mut c = client(p.addr("p").unwrap()).await;
    let (resp, mut send) = open(&mut c, "http://a/ws", Some("websocket")).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    // Ticks drained; the stream's end (a reset) is the result.
    let ticks = tokio::spawn(async move {
        loop {
            match body.data().await {
                Some(Ok(d)) => {
                    let _ = body.flow_control().release_capacity(d.len());
                }
                Some(Err(e)) => return Some(e),
                None => return None,
            }
        }
    });
    // Upload until the stream is reset (the proxy's socket to the upstream fills up first).
    let upload = tokio::spawn(async move {
        let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
        loop {
            send.reserve_capacity(chunk.len());
            match std::future::poll_fn(|cx| send.poll_capacity(cx)).await {
                Some(Ok(n)) => {
                    let n = n.min(chunk.len());
                    if send.send_data(chunk.slice(..n), false).is_err() {
                        return;
                    }
                }
                _ => return,
            }
        }
    });
    let end = tokio::time::timeout(T, ticks)
        .await
        .expect("the tunnel ended in time")
        .unwrap();
    let err = end.expect("a reset, not a clean end");
    assert_eq!(err.reason(), Some(h2::Reason::CANCEL));
    tokio::time::timeout(T, upload).await.unwrap().unwrap();
    let t = Termination::new(Side::Upstream, Phase::Tunnel, Cause::Timeout);
    let stats = p.stats().clone();
    until("the upstream-timeout record", || stats.terminations(t) == 1).await;
    // The connection's window is whole again: an upload on the same connection goes through.
    let mut c = tokio::time::timeout(T, c.ready()).await.unwrap().unwrap();
    let len = 256 * 1024;
    let req = http::Request::post("http://a/upload")
        .header("content-length", len)
        .body(())
        .unwrap();
    let (resp, mut send) = c.send_request(req, false).unwrap();
    send_all(&mut send, Bytes::from(vec![b'y'; len]), true).await;
    let resp = tokio::time::timeout(T, resp).await.unwrap().unwrap();
    assert_eq!(resp.status(), 200);
}

// WebSockets to `protocol = "h2"` groups: an in-process h2 server; RFC 8441 extended CONNECT on
// both legs (from HTTP/2 clients) or from an HTTP/1.1 client's upgrade.

/// The proxied group's extra line for an HTTP/2 upstream.
const H2_GROUP: &str = "protocol = \"h2\"";

/// How the scripted h2 server answers an extended CONNECT.
#[derive(Clone, Copy, PartialEq)]
enum H2Answer {
    /// 200 with `sec-websocket-protocol: chat`, "welcome", then each DATA echoed in upper
    /// case; at the client's END_STREAM, "bye" and END_STREAM.
    Echo,
    /// 403 with the body "no".
    Forbidden,
    /// 200, then nothing (for the idle timeout).
    Silent,
    /// 200, then `CLOSE_FIRST` bytes and END_STREAM at once, then the stream's handles are
    /// dropped (h2 resets it with NO_ERROR: the answer is complete, the rest is not wanted).
    CloseFirst,
    /// 200, then each DATA echoed under flow control: the next is read only once the last one
    /// went out (a server that reads as fast as the client's window lets it write).
    FlowEcho,
}

/// How much `H2Answer::CloseFirst` sends (more than one stream window).
const CLOSE_FIRST: usize = 300_000;

/// What the server saw of one request.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    protocol: Option<String>,
    path: String,
    authority: String,
    headers: http::HeaderMap,
}

struct H2Server {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// One message per stream when it ends: "end" (clean), "reset" (reset by the proxy).
    ended: mpsc::UnboundedReceiver<&'static str>,
}

/// An h2c server; `extended`: it advertises SETTINGS_ENABLE_CONNECT_PROTOCOL.
async fn h2_server(answer: H2Answer, extended: bool) -> H2Server {
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
                    tokio::spawn(h2_stream(req, respond, answer, log.clone(), tx.clone()));
                }
            });
        }
    });
    H2Server { addr, seen, ended }
}

async fn h2_stream(
    req: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    answer: H2Answer,
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
    let status = if answer == H2Answer::Forbidden {
        403
    } else {
        200
    };
    let mut resp = http::Response::builder().status(status);
    if answer == H2Answer::Echo {
        resp = resp.header("sec-websocket-protocol", "chat");
    }
    let mut send = respond
        .send_response(resp.body(()).unwrap(), false)
        .unwrap();
    match answer {
        H2Answer::Forbidden => {
            let _ = send.send_data(Bytes::from_static(b"no"), true);
            return;
        }
        H2Answer::CloseFirst => {
            let _ = send.send_data(Bytes::from(vec![b'z'; CLOSE_FIRST]), true);
            drop((body, send, respond));
            let _ = ended.send("closed first");
            return;
        }
        H2Answer::FlowEcho => {
            let end = flow_echo(&mut body, &mut send).await;
            let _ = ended.send(end);
            return;
        }
        H2Answer::Silent => {}
        H2Answer::Echo => {
            let _ = send.send_data(Bytes::from_static(b"welcome"), false);
        }
    }
    loop {
        match body.data().await {
            Some(Ok(d)) => {
                let _ = body.flow_control().release_capacity(d.len());
                if answer == H2Answer::Echo {
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

#[tokio::test]
async fn websocket_to_an_h2_group_is_an_extended_connect_with_bytes_both_ways() {
    let mut up = h2_server(H2Answer::Echo, true).await;
    let p = proxy(up.addr, "", H2_GROUP);
    let mut c = client(p.addr("p").unwrap()).await;
    // The first request to the server opens the upstream connection: the proxy must wait for
    // the server's SETTINGS before it may send `:protocol`.
    let (resp, mut send) = open(&mut c, "http://app.test/ws?room=1", Some("websocket")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers().get("sec-websocket-protocol").unwrap(),
        "chat"
    );
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
    let up = h2_server(H2Answer::Echo, false).await;
    let p = proxy(up.addr, "", H2_GROUP);
    let mut c = client(p.addr("p").unwrap()).await;
    let (resp, _send) = open(&mut c, "http://app.test/ws", Some("websocket")).await;
    assert_eq!(resp.status(), 501);
    // The same for an HTTP/1.1 client's upgrade (on the connection now settled).
    let (_s, head, _) = h1_upgrade(p.addr("p").unwrap(), b"").await;
    assert!(head.starts_with("http/1.1 501 "), "{head}");
    assert!(
        up.seen.lock().unwrap().is_empty(),
        "nothing reached the server"
    );
    let t = Termination::new(Side::Proxy, Phase::RequestHead, Cause::Refused);
    let stats = p.stats().clone();
    until("two proxy-refused records", || stats.terminations(t) == 2).await;
}

#[tokio::test]
async fn a_refusal_is_relayed_as_a_response() {
    let up = h2_server(H2Answer::Forbidden, true).await;
    let p = proxy(up.addr, "", H2_GROUP);
    let mut c = client(p.addr("p").unwrap()).await;
    let (resp, _send) = open(&mut c, "http://app.test/ws", Some("websocket")).await;
    assert_eq!(resp.status(), 403);
    let mut body = resp.into_body();
    assert_eq!(read_n(&mut body, 10).await, b"no");
}

#[tokio::test]
async fn a_client_reset_resets_the_server_stream() {
    let mut up = h2_server(H2Answer::Echo, true).await;
    let p = proxy(up.addr, "", H2_GROUP);
    let mut c = client(p.addr("p").unwrap()).await;
    let (resp, mut send) = open(&mut c, "http://app.test/ws", Some("websocket")).await;
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
async fn an_idle_tunnel_to_an_h2_server_ends_at_the_group_idle_timeout() {
    let mut up = h2_server(H2Answer::Silent, true).await;
    let group = format!("{H2_GROUP}\nidle_timeout = \"300ms\"");
    let p = proxy(up.addr, "", &group);
    idle_tunnel_is_cancelled(&p).await;
    let ended = tokio::time::timeout(T, up.ended.recv()).await.unwrap();
    assert_eq!(ended, Some("reset"));
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
    let mut up = h2_server(H2Answer::Echo, true).await;
    let p = proxy(up.addr, "", H2_GROUP);
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
    let up = h2_server(H2Answer::Forbidden, true).await;
    let p = proxy(up.addr, "", H2_GROUP);
    let (mut s, head, rest) = h1_upgrade(p.addr("p").unwrap(), b"").await;
    assert!(head.starts_with("http/1.1 403 "), "{head}");
    assert!(!head.contains("upgrade"), "{head}");
    // The server sent no length: chunked.
    assert!(head.contains("transfer-encoding: chunked\r\n"), "{head}");
    assert_eq!(read_tcp(&mut s, rest, 12).await, b"2\r\nno\r\n0\r\n\r\n");
}

#[tokio::test]
async fn a_server_that_ends_first_and_stops_reading_ends_the_tunnel_cleanly() {
    // HTTP/2 client: every byte, END_STREAM, and a NO_ERROR reset for the rest of its side.
    let mut up = h2_server(H2Answer::CloseFirst, true).await;
    let p = proxy(up.addr, "", H2_GROUP);
    let mut c = client(p.addr("p").unwrap()).await;
    let (resp, _send) = open(&mut c, "http://app.test/ws", Some("websocket")).await;
    assert_eq!(resp.status(), 200);
    let ended = tokio::time::timeout(T, up.ended.recv()).await.unwrap();
    assert_eq!(ended, Some("closed first"));
    let mut body = resp.into_body();
    assert_eq!(read_n(&mut body, CLOSE_FIRST + 1).await.len(), CLOSE_FIRST);
    assert!(tokio::time::timeout(T, body.data())
        .await
        .unwrap()
        .is_none());
    let stats = p.stats().clone();
    until("the success record", || {
        stats.terminations(Termination::OK) == 2
    })
    .await;

    // HTTP/1.1 client: every byte and EOF; what it sends after that is dropped, not an error.
    let (mut s, head, rest) = h1_upgrade(p.addr("p").unwrap(), b"").await;
    assert!(head.starts_with("http/1.1 101 "), "{head}");
    assert_eq!(
        read_tcp(&mut s, rest, CLOSE_FIRST + 1).await.len(),
        CLOSE_FIRST
    );
    let _ = s.write_all(b"a close frame, too late").await;
    until("the second success record", || {
        stats.terminations(Termination::OK) == 3
    })
    .await;
    let t = Termination::new(Side::Upstream, Phase::Tunnel, Cause::Closed);
    assert_eq!(stats.terminations(t), 0);
}

#[tokio::test]
async fn megabytes_both_ways_at_once_under_flow_control() {
    // More than the 256 KiB stream windows, written while the echo is read: a relay that
    // served one direction at a time would stall here (each side waits for the other's window).
    const N: usize = 8 * 1024 * 1024;
    let mut up = h2_server(H2Answer::FlowEcho, true).await;
    let p = proxy(up.addr, "", H2_GROUP);
    // HTTP/1.1 client.
    let (s, head, rest) = h1_upgrade(p.addr("p").unwrap(), b"").await;
    assert!(head.starts_with("http/1.1 101 "), "{head}");
    assert!(rest.is_empty());
    let (mut r, mut w) = s.into_split();
    let writer = tokio::spawn(async move {
        let chunk = vec![b'q'; 64 * 1024];
        for _ in 0..N / chunk.len() {
            w.write_all(&chunk).await.unwrap();
        }
        w.shutdown().await.unwrap();
    });
    let mut total = 0;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match tokio::time::timeout(T, r.read(&mut buf)).await {
            Err(_) => panic!("stalled after {total} of {N} bytes echoed"),
            Ok(r) => match r.unwrap() {
                0 => break,
                n => total += n,
            },
        }
    }
    writer.await.unwrap();
    assert_eq!(total, N);
    assert_eq!(
        tokio::time::timeout(T, up.ended.recv()).await.unwrap(),
        Some("end")
    );
    // HTTP/2 client.
    let mut c = client(p.addr("p").unwrap()).await;
    let (resp, mut send) = open(&mut c, "http://app.test/ws", Some("websocket")).await;
    assert_eq!(resp.status(), 200);
    let writer = tokio::spawn(async move {
        for _ in 0..N / (64 * 1024) {
            send_all(&mut send, Bytes::from(vec![b'q'; 64 * 1024]), false).await;
        }
        send_all(&mut send, Bytes::new(), true).await;
    });
    let mut body = resp.into_body();
    assert_eq!(read_n(&mut body, N + 1).await.len(), N);
    writer.await.unwrap();
}

#[tokio::test]
async fn a_connection_that_dies_before_its_settings_is_a_502_not_a_501() {
    // A server that accepts and closes at once: nothing is known of extended CONNECT.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            drop(s);
        }
    });
    let p = proxy(addr, "", H2_GROUP);
    let mut c = client(p.addr("p").unwrap()).await;
    let (resp, _send) = open(&mut c, "http://app.test/ws", Some("websocket")).await;
    assert_eq!(resp.status(), 502);
    let (_s, head, _) = h1_upgrade(p.addr("p").unwrap(), b"").await;
    assert!(head.starts_with("http/1.1 502 "), "{head}");
}
