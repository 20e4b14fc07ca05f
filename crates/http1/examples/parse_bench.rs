//! Rough per-request cost of head parsing: `cargo run -p portico-http1 --release --example parse_bench`.

// A benchmark reads the clock; the library it measures does not.
#![allow(clippy::disallowed_methods)]

use bytes::BytesMut;
use portico_http1::{parse_request, parse_response, BodyDecoder, Decoded, Framing, Limits, Method};
use std::hint::black_box;
use std::time::Instant;

const REQUEST: &[u8] = b"GET /static/app/main.3f9a1c.js?v=2 HTTP/1.1\r\n\
Host: www.example.com\r\n\
User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36\r\n\
Accept: */*\r\n\
Accept-Language: en-US,en;q=0.9\r\n\
Accept-Encoding: gzip, deflate, br\r\n\
Referer: https://www.example.com/\r\n\
Cookie: session=0123456789abcdef0123456789abcdef; theme=dark\r\n\
Sec-Fetch-Dest: script\r\n\
Sec-Fetch-Mode: no-cors\r\n\
Connection: keep-alive\r\n\r\n";

const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\n\
Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n\
Content-Type: application/javascript\r\n\
Content-Length: 1234\r\n\
Cache-Control: public, max-age=31536000\r\n\
ETag: \"3f9a1c\"\r\n\
Connection: keep-alive\r\n\r\n";

fn bench(name: &str, iters: u32, mut f: impl FnMut()) {
    // `parse_bench WORD` runs only the benches whose name contains WORD (handy under perf).
    if let Some(only) = std::env::args().nth(1) {
        if !name.contains(&only) {
            return;
        }
    }
    for _ in 0..iters / 10 {
        f();
    }
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    let ns = start.elapsed().as_nanos() as f64 / f64::from(iters);
    println!("{name:<28} {ns:8.1} ns/op");
}

fn main() {
    let limits = Limits::default();
    let iters = std::env::var("ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let mut buf = BytesMut::with_capacity(4096);
    bench("parse_request (11 fields)", iters, || {
        buf.clear();
        buf.extend_from_slice(REQUEST);
        let head = parse_request(&mut buf, &limits).unwrap().unwrap();
        black_box(head.host());
    });
    bench("httparse alone (baseline)", iters, || {
        let mut headers = [httparse::EMPTY_HEADER; 100];
        let mut req = httparse::Request::new(&mut headers);
        black_box(req.parse(black_box(REQUEST)).unwrap());
    });
    bench("parse_response (6 fields)", iters, || {
        buf.clear();
        buf.extend_from_slice(RESPONSE);
        let head = parse_response(&mut buf, &Method::Get, &limits)
            .unwrap()
            .unwrap();
        black_box(head.framing);
    });
    let mut body = Vec::new();
    for _ in 0..16 {
        body.extend_from_slice(b"400\r\n");
        body.extend(std::iter::repeat_n(b'x', 0x400));
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(b"0\r\n\r\n");
    bench("chunked 16 x 1 KiB", iters / 10, || {
        buf.clear();
        buf.extend_from_slice(&body);
        let mut dec = BodyDecoder::new(Framing::Chunked);
        while let Decoded::Data(d) = dec.decode(&mut buf, 16 * 1024).unwrap() {
            black_box(d);
        }
    });
}
