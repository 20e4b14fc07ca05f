//! Helpers the test modules share: start a proxy from TOML, a port nobody listens on, waiting for a condition, a raw chunked upstream.

use portico_proxy::{start, Running};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

/// How long a test waits for anything before it fails.
pub const T: Duration = Duration::from_secs(10);

/// A proxy running `toml` on `workers` worker threads (a config error fails the test, with the
/// text).
pub fn start_toml(toml: &str, workers: usize) -> Running {
    let cfg =
        portico_config::parse(toml, "test.toml").unwrap_or_else(|e| panic!("config: {e}\n{toml}"));
    start(cfg, workers).expect("start proxy")
}

/// An address on which nothing listens (bound, then closed).
pub fn closed_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    drop(l);
    a
}

/// Poll until `f` holds, failing the test after [`T`].
pub async fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + T;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Poll `f` from a blocking test until it gives Some, failing the test after [`T`].
pub fn wait_for<V>(what: &str, mut f: impl FnMut() -> Option<V>) -> V {
    let deadline = Instant::now() + T;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A one-exchange HTTP/1.1 server: reads a chunked request to the end of its trailer section,
/// hands the raw bytes over, then writes `answer`.
pub fn chunked_upstream(answer: Vec<u8>) -> (SocketAddr, std::sync::mpsc::Receiver<Vec<u8>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        // The request ends with the last chunk's trailer section.
        while !seen.windows(5).any(|w| w == b"\r\n0\r\n") || !seen.ends_with(b"\r\n\r\n") {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
        let _ = tx.send(seen);
        let _ = s.write_all(&answer);
        let _ = s.read(&mut buf);
    });
    (addr, rx)
}

/// An HTTP/2 client connection with prior knowledge (h2c) to `addr`, its driver spawned.
pub async fn h2c(addr: SocketAddr) -> h2::client::SendRequest<bytes::Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    client
}

/// GET `uri` on a new stream with `fields`; the response head (the body is not read).
pub async fn h2_get(
    client: &h2::client::SendRequest<bytes::Bytes>,
    uri: &str,
    fields: &[(&str, &str)],
) -> http::response::Parts {
    let mut req = http::Request::builder().uri(uri);
    for (n, v) in fields {
        req = req.header(*n, *v);
    }
    let mut c = client.clone().ready().await.unwrap();
    let (resp, _) = c.send_request(req.body(()).unwrap(), true).unwrap();
    let resp = tokio::time::timeout(T, resp).await.unwrap().unwrap();
    resp.into_parts().0
}
