//! Encoder output, and round trips through the parsers and the chunked decoder.

use super::{decode, request, response, End};
use crate::encode;
use crate::{Framing, Method};
use bytes::{Bytes, BytesMut};

#[test]
fn encoded_request_round_trips() {
    let mut out = BytesMut::new();
    encode::request_line(&mut out, "POST", "/submit?x=1");
    encode::field(&mut out, "Host", b"example.com:8080");
    encode::field(&mut out, "X-Bin", b"caf\xc3\xa9");
    encode::content_length(&mut out, 12345);
    encode::end_head(&mut out);
    assert_eq!(
        &out[..],
        b"POST /submit?x=1 HTTP/1.1\r\nHost: example.com:8080\r\nX-Bin: caf\xc3\xa9\r\nContent-Length: 12345\r\n\r\n"
    );
    let head = request(&out).unwrap();
    assert_eq!(head.method(), &Method::Post);
    assert_eq!(head.path(), "/submit");
    assert_eq!(head.host(), Some("example.com"));
    assert_eq!(head.framing, Framing::Length(12345));
    assert_eq!(head.field("x-bin"), Some(&b"caf\xc3\xa9"[..]));
}

#[test]
fn encoded_response_round_trips() {
    for (status, reason, expect) in [
        (200, "", "OK"),
        (404, "", "Not Found"),
        (418, "I'm a teapot", "I'm a teapot"),
        (599, "", ""),
        (502, "Upstream Gone", "Upstream Gone"),
    ] {
        let mut out = BytesMut::new();
        encode::status_line(&mut out, status, reason);
        encode::field(&mut out, "Transfer-Encoding", b"chunked");
        encode::end_head(&mut out);
        let head = response(&Method::Get, &out).unwrap();
        assert_eq!((head.status(), head.reason()), (status, expect));
        assert_eq!(head.framing, Framing::Chunked);
    }
    let mut out = BytesMut::new();
    encode::status_line(&mut out, 204, "");
    assert_eq!(&out[..], b"HTTP/1.1 204 No Content\r\n");
    // Every status a u16 holds is written in decimal, three digits or not.
    for status in [0, 7, 99, 100, 101, 200, 307, 999, 1000, u16::MAX] {
        let mut out = BytesMut::new();
        encode::status_line(&mut out, status, "R");
        assert_eq!(out, format!("HTTP/1.1 {status} R\r\n").as_bytes());
    }
}

#[test]
fn content_length_digits() {
    for n in [0u64, 7, 10, 99, 100, 4096, 1_000_000_007, u64::MAX] {
        let mut out = BytesMut::new();
        encode::content_length(&mut out, n);
        assert_eq!(out, format!("Content-Length: {n}\r\n").as_bytes());
    }
}

#[test]
fn chunk_headers() {
    for n in [
        1usize,
        9,
        10,
        15,
        16,
        255,
        256,
        4096,
        0xdead_beef,
        usize::MAX,
    ] {
        let mut out = BytesMut::new();
        encode::chunk_header(&mut out, n);
        assert_eq!(out, format!("{n:x}\r\n").as_bytes());
    }
}

#[test]
fn chunked_body_round_trips() {
    let pieces: [&[u8]; 4] = [b"hello", b" ", &[0u8; 300], b"\r\n0\r\n\r\n"];
    let mut out = BytesMut::new();
    let mut expect = Vec::new();
    for p in pieces {
        encode::chunk_header(&mut out, p.len());
        out.extend_from_slice(p);
        out.extend_from_slice(b"\r\n");
        expect.extend_from_slice(p);
    }
    encode::last_chunk(&mut out, b"X-Checksum: abc\r\n");
    for step in [0, 1, 13] {
        let (data, end) = decode(Framing::Chunked, &out, step, 64);
        assert_eq!(data, expect);
        assert_eq!(
            end,
            End::Done(Bytes::from_static(b"X-Checksum: abc\r\n"), 0)
        );
    }
    let mut out = BytesMut::new();
    encode::last_chunk(&mut out, b"");
    assert_eq!(&out[..], b"0\r\n\r\n");
}

#[test]
fn reasons() {
    assert_eq!(encode::reason(200), "OK");
    assert_eq!(encode::reason(101), "Switching Protocols");
    assert_eq!(encode::reason(431), "Request Header Fields Too Large");
    assert_eq!(encode::reason(505), "HTTP Version Not Supported");
    assert_eq!(encode::reason(299), "");
    assert_eq!(encode::reason(0), "");
}
