//! Request bodies buffered before the attempt (`buffer_request`): replayed to a second server after the first fails, spilled past the memory share to a temporary file, limited to `max_body`, for HTTP/1.1 and HTTP/2 clients.

use crate::common::{start_toml, T};
use bytes::Bytes;
use portico_proxy::Running;
use portico_testkit::{Client, Reply, TestUpstream};
use std::sync::atomic::Ordering::Relaxed;

/// A body of `n` bytes no two windows of which look alike for long.
fn body(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

/// Answers with the body's length and a checksum, so a replayed body is checked byte for byte.
fn echo() -> TestUpstream {
    TestUpstream::start(|r| {
        let sum: u64 = r
            .body
            .iter()
            .enumerate()
            .map(|(i, b)| (i as u64 + 1) * *b as u64)
            .sum();
        Reply::ok(&format!("{} {sum}", r.body.len()))
    })
}

fn expected(b: &[u8]) -> String {
    let sum: u64 = b
        .iter()
        .enumerate()
        .map(|(i, b)| (i as u64 + 1) * *b as u64)
        .sum();
    format!("{} {sum}", b.len())
}

fn proxy(servers: &[&TestUpstream], route: &str) -> Running {
    let list: Vec<String> = servers.iter().map(|s| format!("\"{}\"", s.addr)).collect();
    start_toml(
        &format!(
            "[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nproxy = \"b\"\n\
             max_body = \"1m\"\nbuffer_request = {{ memory = \"16k\" }}\n{route}\n\
             [upstreams.b]\nservers = [{}]\n",
            list.join(", ")
        ),
        1,
    )
}

#[test]
fn a_buffered_post_is_sent_again_to_another_server_after_a_reset() {
    let broken = TestUpstream::start(|_| Reply::Close);
    let good = echo();
    let p = proxy(
        &[&broken, &good],
        "retry = { retries = 1, on = [\"reset\"], non_idempotent = true }",
    );
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    let payload = body(100_000);
    for i in 0..4 {
        let mut req = format!(
            "POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n",
            payload.len()
        )
        .into_bytes();
        req.extend_from_slice(&payload);
        let r = c.request(&req).unwrap();
        assert_eq!(
            (r.status, r.text()),
            (200, expected(&payload)),
            "request {i}"
        );
    }
    // Round robin sent some first attempts to the broken server; each was replayed.
    assert!(!broken.requests().is_empty());
    assert_eq!(
        broken.requests()[0].body,
        payload,
        "the first attempt had the whole body"
    );
    assert_eq!(good.requests().len(), 4);
    let s = p.stats();
    assert_eq!(s.requests_buffered.load(Relaxed), 4);
    // At most 16 KiB of each stayed in memory (a piece that would pass it goes to the file).
    let on_disk = s.request_buffer_file_bytes.load(Relaxed);
    assert!(
        (4 * (100_000 - 16 * 1024)..=4 * 100_000).contains(&on_disk),
        "{on_disk}"
    );
    assert!(s.retries.load(Relaxed) >= 1);
}

#[test]
fn chunked_bodies_are_buffered_and_limited() {
    let up = echo();
    let p = proxy(&[&up], "");
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    let payload = body(50_000);
    let mut req = b"POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for chunk in payload.chunks(7_000) {
        req.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        req.extend_from_slice(chunk);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\nx-sum: 1\r\n\r\n");
    let r = c.request(&req).unwrap();
    assert_eq!((r.status, r.text()), (200, expected(&payload)));
    // Over max_body (1 MiB): 413, and the server never saw it.
    let mut big = b"POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..20 {
        big.extend_from_slice(format!("{:x}\r\n", 60_000).as_bytes());
        big.extend_from_slice(&body(60_000));
        big.extend_from_slice(b"\r\n");
    }
    big.extend_from_slice(b"0\r\n\r\n");
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    c.send(&big).unwrap_or(());
    let r = c.read_response(false).unwrap();
    assert_eq!(r.status, 413);
    assert_eq!(up.requests().len(), 1);
}

#[tokio::test]
async fn http2_uploads_are_buffered_too() {
    let up = echo();
    let p = proxy(&[&up], "");
    let tcp = tokio::net::TcpStream::connect(p.addr("p").unwrap())
        .await
        .unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let payload = Bytes::from(body(200_000));
    let mut c = client.ready().await.unwrap();
    let req = http::Request::builder()
        .method("PUT")
        .uri("http://a/x")
        .body(())
        .unwrap();
    let (resp, mut send) = c.send_request(req, false).unwrap();
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
    let resp = tokio::time::timeout(T, resp).await.unwrap().unwrap();
    assert_eq!(resp.status(), 200);
    let mut b = resp.into_body();
    let mut got = Vec::new();
    while let Some(d) = b.data().await {
        got.extend_from_slice(&d.unwrap());
    }
    assert_eq!(String::from_utf8(got).unwrap(), expected(&payload));
    assert!(p.stats().request_buffer_file_bytes.load(Relaxed) > 0);
}
