//! Response head parsing: framing per RFC 9112 6.3, keep-alive, refused heads.

use super::response;
use crate::{parse_response, Framing, Limits, Method, ParseErrorKind, Version};
use bytes::BytesMut;
use Framing::*;
use ParseErrorKind::*;

/// (name, request method, wire bytes, status, framing, keep_alive).
type ResponseCase<'a> = (&'a str, &'a Method, &'a [u8], u16, Framing, bool);

#[test]
#[rustfmt::skip]
fn response_framing() {
    let get = Method::Get;
    let head = Method::Head;
    let connect = Method::Connect;
    let cases: &[ResponseCase<'_>] = &[
        ("content-length", &get, b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", 200, Length(5), true),
        ("content-length zero", &get, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", 200, Length(0), true),
        ("chunked", &get, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", 200, Chunked, true),
        ("close-delimited", &get, b"HTTP/1.1 200 OK\r\nServer: x\r\n\r\n", 200, Close, false),
        ("close-delimited no fields", &get, b"HTTP/1.1 200 OK\r\n\r\n", 200, Close, false),
        ("te not final chunked", &get, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", 200, Close, false),
        ("te chunked, gzip", &get, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", 200, Close, false),
        ("te gzip, chunked", &get, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 200, Chunked, true),
        ("head", &head, b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", 200, None, true),
        ("head chunked", &head, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", 200, None, true),
        ("head no length", &head, b"HTTP/1.1 200 OK\r\n\r\n", 200, None, true),
        ("204", &get, b"HTTP/1.1 204 No Content\r\n\r\n", 204, None, true),
        ("204 with length", &get, b"HTTP/1.1 204 No Content\r\nContent-Length: 3\r\n\r\n", 204, None, true),
        ("304", &get, b"HTTP/1.1 304 Not Modified\r\nContent-Length: 100\r\n\r\n", 304, None, true),
        ("100", &get, b"HTTP/1.1 100 Continue\r\n\r\n", 100, None, true),
        ("103", &get, b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n", 103, None, true),
        ("101", &get, b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n", 101, None, true),
        ("connect 200", &connect, b"HTTP/1.1 200 Connection Established\r\n\r\n", 200, None, true),
        ("connect 2xx with length", &connect, b"HTTP/1.1 299 X\r\nContent-Length: 5\r\n\r\n", 299, None, true),
        ("connect 407", &connect, b"HTTP/1.1 407 Auth\r\nContent-Length: 5\r\n\r\n", 407, Length(5), true),
        ("connection close", &get, b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\n", 200, Length(5), false),
        ("http/1.0 length", &get, b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\n", 200, Length(5), false),
        ("http/1.0 keep-alive", &get, b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\nConnection: keep-alive\r\n\r\n", 200, Length(5), true),
        ("http/1.0 keep-alive close-delimited", &get, b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n\r\n", 200, Close, false),
        ("status 999", &get, b"HTTP/1.1 999 Whatever\r\nContent-Length: 1\r\n\r\n", 999, Length(1), true),
        ("no reason", &get, b"HTTP/1.1 404 \r\nContent-Length: 1\r\n\r\n", 404, Length(1), true),
        ("no reason no space", &get, b"HTTP/1.1 404\r\nContent-Length: 1\r\n\r\n", 404, Length(1), true),
    ];
    for &(name, method, raw, status, framing, keep_alive) in cases {
        let head = response(method, raw).unwrap_or_else(|e| panic!("{name}: refused with {e:?}"));
        assert_eq!(head.status(), status, "{name}");
        assert_eq!(head.framing, framing, "{name}");
        assert_eq!(head.keep_alive, keep_alive, "{name}");
        assert_eq!(&head.raw()[..], raw, "{name}");
    }
}

#[test]
#[rustfmt::skip]
fn refused_responses() {
    let get = Method::Get;
    let cases: &[(&str, &[u8], ParseErrorKind)] = &[
        ("cl and te", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", ContentLengthAndTransferEncoding),
        ("cl differs", b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\n", BadContentLength),
        ("cl sign", b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\n", BadContentLength),
        ("te chunked twice", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", BadTransferEncoding),
        ("te empty element", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: ,chunked\r\n\r\n", BadTransferEncoding),
        ("te in http/1.0", b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", BadTransferEncoding),
        ("http/2.0", b"HTTP/2.0 200 OK\r\n\r\n", UnsupportedVersion),
        ("http/2", b"HTTP/2 200 OK\r\n\r\n", Malformed),
        ("lowercase", b"http/1.1 200 OK\r\n\r\n", Malformed),
        ("two digit status", b"HTTP/1.1 20 OK\r\n\r\n", Malformed),
        ("four digit status", b"HTTP/1.1 2000 OK\r\n\r\n", Malformed),
        ("status below 100", b"HTTP/1.1 099 X\r\n\r\n", Malformed),
        ("double space", b"HTTP/1.1  200 OK\r\n\r\n", Malformed),
        ("obs-fold", b"HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n", Malformed),
        ("space before colon", b"HTTP/1.1 200 OK\r\nX : a\r\n\r\n", Malformed),
        ("bare lf", b"HTTP/1.1 200 OK\nContent-Length: 0\n\n", Malformed),
        ("bare lf status line", b"HTTP/1.1 200 OK\nContent-Length: 0\r\n\r\n", Malformed),
        ("bare lf final", b"HTTP/1.1 200 OK\r\n\n", Malformed),
        ("bare cr in reason", b"HTTP/1.1 200 O\rK\r\n\r\n", Malformed),
        ("nul in value", b"HTTP/1.1 200 OK\r\nX: \0\r\n\r\n", Malformed),
        ("leading crlf", b"\r\nHTTP/1.1 200 OK\r\n\r\n", Malformed),
        ("leading lf", b"\nHTTP/1.1 200 OK\r\n\r\n", Malformed),
    ];
    for &(name, raw, kind) in cases {
        match response(&get, raw) {
            Ok(head) => panic!("{name}: accepted as {head:?}"),
            Err(k) => assert_eq!(k, kind, "{name}"),
        }
    }
}

#[test]
fn response_accessors() {
    let raw: &[u8] = b"HTTP/1.0 404 Not Found\r\nConnection: X-Hop\r\nX-Hop: 1\r\nContent-Type: text/plain \r\n\r\nbody";
    let mut buf = BytesMut::from(raw);
    let head = parse_response(&mut buf, &Method::Get, &Limits::default())
        .unwrap()
        .unwrap();
    assert_eq!(&buf[..], b"body");
    assert_eq!(head.status(), 404);
    assert_eq!(head.reason(), "Not Found");
    assert_eq!(head.version(), Version::Http10);
    assert_eq!(head.field("content-type"), Some(&b"text/plain"[..]));
    assert_eq!(head.fields().count(), 3);
    assert!(head.is_hop_by_hop("x-hop"));
    assert!(head.is_hop_by_hop("Transfer-Encoding"));
    assert!(!head.is_hop_by_hop("Content-Type"));
    // obs-text reason: kept as bytes, exposed as "" when not UTF-8.
    let head = response(
        &Method::Get,
        b"HTTP/1.1 200 \xffok\r\nContent-Length: 0\r\n\r\n",
    )
    .unwrap();
    assert_eq!(head.reason(), "");
    let head = response(
        &Method::Get,
        b"HTTP/1.1 200 caf\xc3\xa9\r\nContent-Length: 0\r\n\r\n",
    )
    .unwrap();
    assert_eq!(head.reason(), "caf\u{e9}");
    let head = response(&Method::Get, b"HTTP/1.1 200\r\n\r\n").unwrap();
    assert_eq!(head.reason(), "");
}

#[test]
fn incomplete_responses_and_limits() {
    let raw: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n";
    for end in 0..raw.len() {
        let mut buf = BytesMut::from(&raw[..end]);
        assert!(
            matches!(
                parse_response(&mut buf, &Method::Get, &Limits::default()),
                Ok(Option::None)
            ),
            "prefix {end}"
        );
        assert_eq!(&buf[..], &raw[..end]);
    }
    for partial in [&b"HTTP/2"[..], b"HTTP/2.", b"HTTP/2.0"] {
        let mut buf = BytesMut::from(partial);
        assert!(matches!(
            parse_response(&mut buf, &Method::Get, &Limits::default()),
            Ok(Option::None)
        ));
    }
    let mut buf = BytesMut::from(&b"HTTP/2.0 "[..]);
    assert_eq!(
        parse_response(&mut buf, &Method::Get, &Limits::default())
            .unwrap_err()
            .kind,
        UnsupportedVersion
    );

    let limits = Limits {
        max_head_bytes: 100,
        max_headers: 2,
        ..Limits::default()
    };
    let big = format!("HTTP/1.1 200 OK\r\nX: {}\r\n", "v".repeat(100));
    let mut buf = BytesMut::from(big.as_bytes());
    assert_eq!(
        parse_response(&mut buf, &Method::Get, &limits)
            .unwrap_err()
            .kind,
        HeadTooLarge
    );
    let mut buf = BytesMut::from(&b"HTTP/1.1 200 OK\r\nA: 1\r\nB: 2\r\nC: 3\r\n"[..]);
    assert_eq!(
        parse_response(&mut buf, &Method::Get, &limits)
            .unwrap_err()
            .kind,
        TooManyHeaders
    );
}

#[test]
fn informational_then_final_response() {
    let mut buf = BytesMut::from(
        &b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"[..],
    );
    let first = parse_response(&mut buf, &Method::Post, &Limits::default())
        .unwrap()
        .unwrap();
    assert_eq!((first.status(), first.framing), (100, None));
    let second = parse_response(&mut buf, &Method::Post, &Limits::default())
        .unwrap()
        .unwrap();
    assert_eq!((second.status(), second.framing), (201, Length(2)));
    assert_eq!(&buf[..], b"ok");
}

#[test]
fn field_lines_are_given_only_when_they_read_as_encode_writes_them() {
    let head = response(
        &Method::Get,
        b"HTTP/1.1 200 OK\r\nServer: o\r\nX-A:b\r\nX-B:  c  \r\nX-T:\tt\r\nX-C: \xffd\r\nX-E:\r\nContent-Length: 0\r\n\r\n",
    )
    .unwrap();
    type Line<'a> = (&'a str, &'a [u8], Option<&'a [u8]>);
    let lines: Vec<Line> = head
        .field_lines()
        .map(|f| (f.name, f.value, f.line()))
        .collect();
    let want: [Line; 7] = [
        ("Server", b"o", Some(&b"Server: o\r\n"[..])),
        ("X-A", b"b", Option::None),
        ("X-B", b"c", Option::None),
        ("X-T", b"t", Option::None),
        ("X-C", b"\xffd", Some(&b"X-C: \xffd\r\n"[..])),
        ("X-E", b"", Option::None),
        ("Content-Length", b"0", Some(&b"Content-Length: 0\r\n"[..])),
    ];
    assert_eq!(lines, want);
    // Wherever a line is given, it is what encode::field writes.
    for (name, value, line) in lines {
        let mut out = BytesMut::new();
        crate::encode::field(&mut out, name, value);
        if let Some(line) = line {
            assert_eq!(line, &out[..]);
        }
    }
}
