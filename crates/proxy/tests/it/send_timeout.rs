//! The listener's `limits.send_timeout`: a client that stops reading a large response is
//! disconnected after it (HTTP/1.1 and HTTP/2), counted and logged as a client timeout.

use crate::common::T;
use portico_proxy::stats::{Cause, Phase, Side};
use portico_proxy::{start, Running, Termination};
use portico_testkit::{Reply, TestUpstream};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Every wait of these tests is bounded by this (far below the 60 s default send timeout, so
/// a listener that ignored its configured value fails here).
/// The configured send timeout.
const SEND: Duration = Duration::from_millis(300);
/// The upstream's response body: far more than the socket buffers in between can hold.
const BODY: usize = 16 << 20;

fn stalled() -> Termination {
    Termination::new(Side::Client, Phase::ResponseBody, Cause::Timeout)
}

/// Listener "p" with `send_timeout = 300ms`: `/bytes/...` served by the origin, the rest
/// proxied to `up`; JSON access log at `log`.
fn proxy(up: SocketAddr, log: &std::path::Path) -> Running {
    let toml = format!(
        r#"
[access_log]
path = "{}"
format = "json"
[[listeners]]
name = "p"
address = "127.0.0.1:0"
[listeners.limits]
send_timeout = "300ms"
[[listeners.routes]]
path = "/bytes/**"
origin = true
[[listeners.routes]]
proxy = "b"
[upstreams.b]
servers = ["{up}"]
"#,
        log.display()
    );
    let cfg = portico_config::parse(&toml, "t.toml").unwrap_or_else(|e| panic!("{e}"));
    start(cfg, 1).expect("start")
}

fn log_path(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("portico-send-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("access.log");
    let _ = std::fs::remove_file(&path);
    path
}

/// Poll until the proxy counted one stalled client; returns when that happened.
fn wait_counted(p: &Running) -> Instant {
    let end = Instant::now() + T;
    while p.stats().terminations(stalled()) == 0 {
        assert!(Instant::now() < end, "the stalled client was not cut off");
        std::thread::sleep(Duration::from_millis(5));
    }
    Instant::now()
}

/// A client socket with a small receive buffer (no autotuning), so the proxy's writes block
/// after a few hundred KiB at most.
fn small_window_client(addr: SocketAddr) -> TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.set_recv_buffer_size(16 * 1024).unwrap();
    s.connect(&addr.into()).unwrap();
    s.into()
}

#[test]
fn http1_client_that_stops_reading_is_cut_after_send_timeout() {
    let up = TestUpstream::start(|_| Reply::Respond {
        status: 200,
        headers: vec![],
        body: vec![b'x'; BODY],
        chunked: false,
    });
    let log = log_path("h1");
    let p = proxy(up.addr, &log);
    let mut c = small_window_client(p.addr("p").unwrap());
    let sent = Instant::now();
    c.write_all(b"GET /big HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    // The client reads nothing until the proxy has given up on it.
    let cut = wait_counted(&p);
    assert!(
        cut - sent >= SEND,
        "cut after {:?}, before the send timeout",
        cut - sent
    );
    // The connection is closed: what was buffered, then EOF (or a reset), well before T.
    c.set_read_timeout(Some(T)).unwrap();
    let mut got = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!("the connection was not closed: {e}"),
        }
    }
    assert!(got < BODY, "the whole body arrived ({got} bytes)");
    let s = p.stats();
    assert_eq!(s.terminations(stalled()), 1);
    assert_eq!(
        s.terminations(Termination::new(
            Side::Client,
            Phase::ResponseBody,
            Cause::Io
        )),
        0
    );
    p.shutdown();
    p.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("\"target\":\"/big\""))
        .unwrap_or_else(|| panic!("no access-log line: {text}"));
    assert!(
        line.contains("\"side\":\"Client\",\"phase\":\"ResponseBody\",\"cause\":\"Timeout\""),
        "{line}"
    );
}

#[tokio::test]
async fn http2_client_that_grants_no_window_is_cut_after_send_timeout() {
    let log = log_path("h2");
    let p = proxy(portico_testkit::closed_port(), &log);
    let tcp = tokio::net::TcpStream::connect(p.addr("p").unwrap())
        .await
        .unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    let conn = tokio::spawn(conn);
    let mut client = tokio::time::timeout(T, client.ready())
        .await
        .expect("ready")
        .unwrap();
    let req = http::Request::get("http://t/bytes/4m").body(()).unwrap();
    let sent = Instant::now();
    let (resp, _) = client.send_request(req, true).unwrap();
    let resp = tokio::time::timeout(T, resp)
        .await
        .expect("head in time")
        .unwrap();
    assert_eq!(resp.status(), 200);
    // The body is never released: the 64 KiB window the client started with stays full.
    let end = Instant::now() + T;
    while p.stats().terminations(stalled()) == 0 {
        assert!(Instant::now() < end, "the stalled stream was not cut off");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(sent.elapsed() >= SEND);
    // The stream ends with a reset after at most the first window's bytes.
    let mut body = resp.into_body();
    let mut got = 0usize;
    let ended = loop {
        match tokio::time::timeout(T, body.data()).await.expect("in time") {
            Some(Ok(d)) => got += d.len(),
            Some(Err(e)) => break e,
            None => panic!("the stream completed ({got} bytes)"),
        }
    };
    assert!(ended.is_reset(), "{ended}");
    assert!(got <= 65_535, "{got} bytes beyond the window");
    drop(client);
    drop(body);
    let _ = tokio::time::timeout(T, conn).await;
    p.shutdown();
    p.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("\"side\":\"Client\",\"phase\":\"ResponseBody\",\"cause\":\"Timeout\""),
        "{text}"
    );
}
