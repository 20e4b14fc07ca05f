//! Request head parsing: accepted heads, refused heads (incl. smuggling vectors), limits, buffering.

use super::{request, request_with};
use crate::{
    parse_request, Framing, Limits, Method, ParseError, ParseErrorKind, TargetForm, Version,
};
use bytes::BytesMut;
use ParseErrorKind::*;

/// What an accepted request must look like.
struct Accept {
    name: &'static str,
    raw: &'static [u8],
    method: Method,
    target: &'static str,
    path: &'static str,
    query: Option<&'static str>,
    host: Option<&'static str>,
    framing: Framing,
    keep_alive: bool,
}

fn accept(
    name: &'static str,
    raw: &'static [u8],
    method: Method,
    target: &'static str,
    host: Option<&'static str>,
    framing: Framing,
    keep_alive: bool,
) -> Accept {
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    Accept {
        name,
        raw,
        method,
        target,
        path,
        query,
        host,
        framing,
        keep_alive,
    }
}

#[test]
#[rustfmt::skip]
fn accepted_requests() {
    use Framing::*;
    use Method::*;
    let cases = vec![
        accept("simple get", b"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n", Get, "/", Some("example.com"), None, true),
        accept("path and query", b"GET /a/b?x=1&y=%20 HTTP/1.1\r\nHost: example.com\r\n\r\n", Get, "/a/b?x=1&y=%20", Some("example.com"), None, true),
        accept("empty query", b"GET /a? HTTP/1.1\r\nHost: h\r\n\r\n", Get, "/a?", Some("h"), None, true),
        accept("host with port", b"GET / HTTP/1.1\r\nHost: example.com:8080\r\n\r\n", Get, "/", Some("example.com"), None, true),
        accept("ipv6 host", b"GET / HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n", Get, "/", Some("[::1]"), None, true),
        accept("ipv6 host no port", b"GET / HTTP/1.1\r\nHost: [2001:db8::1]\r\n\r\n", Get, "/", Some("[2001:db8::1]"), None, true),
        accept("empty host value", b"GET / HTTP/1.1\r\nHost:\r\n\r\n", Get, "/", Option::None, None, true),
        accept("pct-encoded host", b"GET / HTTP/1.1\r\nHost: a%2Db.c\r\n\r\n", Get, "/", Some("a%2Db.c"), None, true),
        accept("http/1.0 no host", b"GET / HTTP/1.0\r\n\r\n", Get, "/", Option::None, None, false),
        accept("http/1.0 keep-alive", b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", Get, "/", Option::None, None, true),
        accept("http/1.0 keep-alive then close", b"GET / HTTP/1.0\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n", Get, "/", Option::None, None, false),
        accept("connection close", b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", Get, "/", Some("h"), None, false),
        accept("connection close in a list", b"GET / HTTP/1.1\r\nHost: h\r\nConnection: foo, ,CLOSE\r\n\r\n", Get, "/", Some("h"), None, false),
        accept("content-length zero", b"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n", Post, "/p", Some("h"), Length(0), true),
        accept("content-length", b"PUT /p HTTP/1.1\r\nHost: h\r\nContent-Length: 42\r\n\r\n", Put, "/p", Some("h"), Length(42), true),
        accept("content-length identical list", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5, 5\r\n\r\n", Post, "/", Some("h"), Length(5), true),
        accept("content-length identical fields", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\n", Post, "/", Some("h"), Length(5), true),
        accept("content-length u64 max", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 18446744073709551615\r\n\r\n", Post, "/", Some("h"), Length(u64::MAX), true),
        accept("content-length leading zeros", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 007\r\n\r\n", Post, "/", Some("h"), Length(7), true),
        accept("chunked", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n", Post, "/", Some("h"), Chunked, true),
        accept("chunked any case", b"POST / HTTP/1.1\r\nHost: h\r\ntransfer-encoding: ChUnKeD\r\n\r\n", Post, "/", Some("h"), Chunked, true),
        accept("absolute-form", b"GET http://Example.com:8080/a/b?x=1 HTTP/1.1\r\nHost: other\r\n\r\n", Get, "http://Example.com:8080/a/b?x=1", Some("Example.com"), None, true),
        accept("options asterisk", b"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n", Options, "*", Some("h"), None, true),
        accept("connect authority-form", b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", Connect, "example.com:443", Some("example.com"), None, true),
        accept("other method", b"PURGE /x HTTP/1.1\r\nHost: h\r\n\r\n", Other("PURGE".into()), "/x", Some("h"), None, true),
        accept("head", b"HEAD / HTTP/1.1\r\nHost: h\r\n\r\n", Head, "/", Some("h"), None, true),
        accept("delete", b"DELETE / HTTP/1.1\r\nHost: h\r\n\r\n", Delete, "/", Some("h"), None, true),
        accept("patch", b"PATCH / HTTP/1.1\r\nHost: h\r\n\r\n", Patch, "/", Some("h"), None, true),
        accept("trace", b"TRACE / HTTP/1.1\r\nHost: h\r\n\r\n", Trace, "/", Some("h"), None, true),
        accept("leading crlf", b"\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n", Get, "/", Some("h"), None, true),
        accept("four leading crlf", b"\r\n\r\n\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n", Get, "/", Some("h"), None, true),
        accept("obs-text value", b"GET / HTTP/1.1\r\nHost: h\r\nX: caf\xc3\xa9\xff\r\n\r\n", Get, "/", Some("h"), None, true),
        accept("tab in value", b"GET / HTTP/1.1\r\nHost: h\r\nX: a\tb\r\n\r\n", Get, "/", Some("h"), None, true),
        accept("empty value", b"GET / HTTP/1.1\r\nHost: h\r\nX:\r\n\r\n", Get, "/", Some("h"), None, true),
        accept("token name chars", b"GET / HTTP/1.1\r\nHost: h\r\nX-!#$%&'*+.^_`|~1: v\r\n\r\n", Get, "/", Some("h"), None, true),
    ];
    for c in cases {
        let head = request(c.raw).unwrap_or_else(|e| panic!("{}: refused with {e:?}", c.name));
        assert_eq!(head.method(), &c.method, "{}", c.name);
        assert_eq!(head.target(), c.target, "{}", c.name);
        if head.target_form() == TargetForm::Origin {
            assert_eq!(head.path(), c.path, "{}", c.name);
            assert_eq!(head.query(), c.query, "{}", c.name);
        }
        assert_eq!(head.host(), c.host, "{}", c.name);
        assert_eq!(head.framing, c.framing, "{}", c.name);
        assert_eq!(head.keep_alive, c.keep_alive, "{}", c.name);
        let start = c
            .raw
            .iter()
            .position(|&b| b != b'\r' && b != b'\n')
            .unwrap();
        assert_eq!(&head.raw()[..], &c.raw[start..], "{}", c.name);
    }
}

#[test]
#[rustfmt::skip]
fn refused_requests() {
    let cases: &[(&str, &[u8], ParseErrorKind)] = &[
        // Request smuggling: framing ambiguity.
        ("cl and te", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", ContentLengthAndTransferEncoding),
        ("te and cl", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", ContentLengthAndTransferEncoding),
        ("te and bad cl", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: x\r\n\r\n", ContentLengthAndTransferEncoding),
        ("cl list differs", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1, 2\r\n\r\n", BadContentLength),
        ("cl fields differ", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", BadContentLength),
        ("cl plus", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: +1\r\n\r\n", BadContentLength),
        ("cl minus", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n", BadContentLength),
        ("cl inner space", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length:  1 2\r\n\r\n", BadContentLength),
        ("cl hex", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0x10\r\n\r\n", BadContentLength),
        ("cl overflow", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 18446744073709551616\r\n\r\n", BadContentLength),
        ("cl huge", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999999999999\r\n\r\n", BadContentLength),
        ("cl empty", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length:\r\n\r\n", BadContentLength),
        ("cl empty element", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1,,1\r\n\r\n", BadContentLength),
        ("cl trailing comma", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1,\r\n\r\n", BadContentLength),
        ("cl decimal point", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1.0\r\n\r\n", BadContentLength),
        ("cl then empty field", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length:\r\n\r\n", BadContentLength),
        ("te chunked, gzip", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", BadTransferEncoding),
        ("te gzip, chunked", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", UnsupportedTransferEncoding),
        ("te gzip then chunked fields", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n", UnsupportedTransferEncoding),
        ("te chunked, chunked", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", BadTransferEncoding),
        ("te chunked twice", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", BadTransferEncoding),
        ("te xchunked", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: xchunked\r\n\r\n", BadTransferEncoding),
        ("te chunked junk", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked x\r\n\r\n", BadTransferEncoding),
        ("te chunked quoted", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: \"chunked\"\r\n\r\n", BadTransferEncoding),
        ("te chunked param", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked;x\r\n\r\n", BadTransferEncoding),
        ("te trailing comma", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked,\r\n\r\n", BadTransferEncoding),
        ("te leading comma", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: , chunked\r\n\r\n", BadTransferEncoding),
        ("te empty", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding:\r\n\r\n", BadTransferEncoding),
        ("te gzip only", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n", BadTransferEncoding),
        ("te identity", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: identity\r\n\r\n", BadTransferEncoding),
        ("te vertical tab", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\x0b\r\n\r\n", Malformed),
        ("te in http/1.0", b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", BadTransferEncoding),
        ("te name with space", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding : chunked\r\n\r\n", Malformed),
        // Syntax of field lines.
        ("obs-fold", b"GET / HTTP/1.1\r\nHost: h\r\nX: a\r\n b\r\n\r\n", Malformed),
        ("obs-fold tab", b"GET / HTTP/1.1\r\nHost: h\r\nX: a\r\n\tb\r\n\r\n", Malformed),
        ("space before first field", b"GET / HTTP/1.1\r\n Host: h\r\n\r\n", Malformed),
        ("space before colon", b"GET / HTTP/1.1\r\nHost : h\r\n\r\n", Malformed),
        ("tab before colon", b"GET / HTTP/1.1\r\nHost\t: h\r\n\r\n", Malformed),
        ("empty name", b"GET / HTTP/1.1\r\nHost: h\r\n: v\r\n\r\n", Malformed),
        ("no colon", b"GET / HTTP/1.1\r\nHost: h\r\nXv\r\n\r\n", Malformed),
        ("bad name char", b"GET / HTTP/1.1\r\nHost: h\r\nX(y): v\r\n\r\n", Malformed),
        ("non-ascii name", b"GET / HTTP/1.1\r\nHost: h\r\nX\xc3\xa9: v\r\n\r\n", Malformed),
        ("bare cr in value", b"GET / HTTP/1.1\r\nHost: h\r\nX: a\rb\r\n\r\n", Malformed),
        ("bare cr ending value", b"GET / HTTP/1.1\r\nHost: h\r\nX: a\r\r\n\r\n", Malformed),
        ("bare cr in request line", b"GET / HTTP/1.1\rHost: h\r\n\r\n", Malformed),
        ("bare cr as final line", b"GET / HTTP/1.1\r\nHost: h\r\n\r\r\n", Malformed),
        ("bare lf everywhere", b"GET / HTTP/1.1\nHost: h\n\n", Malformed),
        ("bare lf request line", b"GET / HTTP/1.1\nHost: h\r\n\r\n", Malformed),
        ("bare lf field line", b"GET / HTTP/1.1\r\nHost: h\nX: y\r\n\r\n", Malformed),
        ("bare lf last field line", b"GET / HTTP/1.1\r\nHost: h\n\r\n", Malformed),
        ("bare lf final line", b"GET / HTTP/1.1\r\nHost: h\r\n\n", Malformed),
        ("bare lf no fields", b"GET / HTTP/1.0\n\r\n", Malformed),
        ("bare lf final no fields", b"GET / HTTP/1.0\r\n\n", Malformed),
        ("nul in value", b"GET / HTTP/1.1\r\nHost: h\r\nX: a\0b\r\n\r\n", Malformed),
        ("nul in name", b"GET / HTTP/1.1\r\nHost: h\r\nX\0: b\r\n\r\n", Malformed),
        ("ctl in value", b"GET / HTTP/1.1\r\nHost: h\r\nX: a\x01b\r\n\r\n", Malformed),
        ("del in value", b"GET / HTTP/1.1\r\nHost: h\r\nX: a\x7fb\r\n\r\n", Malformed),
        ("esc in value", b"GET / HTTP/1.1\r\nHost: h\r\nX: \x1b[31m\r\n\r\n", Malformed),
        // Host.
        ("missing host", b"GET / HTTP/1.1\r\nX: y\r\n\r\n", BadHost),
        ("missing host absolute-form", b"GET http://h/ HTTP/1.1\r\n\r\n", BadHost),
        ("two hosts", b"GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", BadHost),
        ("two hosts http/1.0", b"GET / HTTP/1.0\r\nHost: a\r\nhost: b\r\n\r\n", BadHost),
        ("host with space", b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", BadHost),
        ("host with userinfo", b"GET / HTTP/1.1\r\nHost: u@h\r\n\r\n", BadHost),
        ("host with slash", b"GET / HTTP/1.1\r\nHost: h/x\r\n\r\n", BadHost),
        ("host bad port", b"GET / HTTP/1.1\r\nHost: h:8x\r\n\r\n", BadHost),
        ("host long port", b"GET / HTTP/1.1\r\nHost: h:123456\r\n\r\n", BadHost),
        ("host only port", b"GET / HTTP/1.1\r\nHost: :80\r\n\r\n", BadHost),
        ("host unclosed ipv6", b"GET / HTTP/1.1\r\nHost: [::1\r\n\r\n", BadHost),
        ("host junk after ipv6", b"GET / HTTP/1.1\r\nHost: [::1]x\r\n\r\n", BadHost),
        ("host bad pct", b"GET / HTTP/1.1\r\nHost: a%zz\r\n\r\n", BadHost),
        ("host obs-text", b"GET / HTTP/1.1\r\nHost: caf\xc3\xa9\r\n\r\n", BadHost),
        // Request line.
        ("double space", b"GET  / HTTP/1.1\r\nHost: h\r\n\r\n", Malformed),
        ("double space before version", b"GET /  HTTP/1.1\r\nHost: h\r\n\r\n", Malformed),
        ("trailing space", b"GET / HTTP/1.1 \r\nHost: h\r\n\r\n", Malformed),
        ("leading space", b" GET / HTTP/1.1\r\nHost: h\r\n\r\n", Malformed),
        ("tab separator", b"GET\t/ HTTP/1.1\r\nHost: h\r\n\r\n", Malformed),
        ("lowercase version", b"GET / http/1.1\r\nHost: h\r\n\r\n", Malformed),
        ("http/2.0", b"GET / HTTP/2.0\r\nHost: h\r\n\r\n", UnsupportedVersion),
        ("http/1.2", b"GET / HTTP/1.2\r\nHost: h\r\n\r\n", UnsupportedVersion),
        ("http/0.9 style", b"GET / HTTP/0.9\r\n\r\n", UnsupportedVersion),
        ("version without minor", b"GET / HTTP/2\r\nHost: h\r\n\r\n", Malformed),
        ("version junk", b"GET / HTTP/1.1x\r\nHost: h\r\n\r\n", Malformed),
        ("version 1.10", b"GET / HTTP/1.10\r\nHost: h\r\n\r\n", Malformed),
        ("space in target", b"GET /a b HTTP/1.1\r\nHost: h\r\n\r\n", Malformed),
        ("missing version", b"GET /\r\nHost: h\r\n\r\n", Malformed),
        ("missing target", b"GET HTTP/1.1\r\nHost: h\r\n\r\n", Malformed),
        ("bad method char", b"G(T / HTTP/1.1\r\nHost: h\r\n\r\n", Malformed),
        ("too many leading crlf", b"\r\n\r\n\r\n\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n", Malformed),
        ("leading bare lf", b"\nGET / HTTP/1.1\r\nHost: h\r\n\r\n", Malformed),
        ("leading bare cr", b"\rGET / HTTP/1.1\r\nHost: h\r\n\r\n", Malformed),
        // Target forms.
        ("relative target", b"GET a HTTP/1.1\r\nHost: h\r\n\r\n", BadTarget),
        ("asterisk for get", b"GET * HTTP/1.1\r\nHost: h\r\n\r\n", BadTarget),
        ("asterisk with more", b"OPTIONS *x HTTP/1.1\r\nHost: h\r\n\r\n", BadTarget),
        ("authority-form for get", b"GET h:80 HTTP/1.1\r\nHost: h\r\n\r\n", BadTarget),
        ("connect origin-form", b"CONNECT /x HTTP/1.1\r\nHost: h\r\n\r\n", BadTarget),
        ("connect without port", b"CONNECT h HTTP/1.1\r\nHost: h\r\n\r\n", BadTarget),
        ("connect empty port", b"CONNECT h: HTTP/1.1\r\nHost: h\r\n\r\n", BadTarget),
        ("other scheme", b"GET ftp://h/ HTTP/1.1\r\nHost: h\r\n\r\n", BadTarget),
        ("userinfo", b"GET http://u@h/ HTTP/1.1\r\nHost: h\r\n\r\n", BadTarget),
        ("empty authority", b"GET http:///x HTTP/1.1\r\nHost: h\r\n\r\n", BadTarget),
        ("fragment", b"GET /a#f HTTP/1.1\r\nHost: h\r\n\r\n", BadTarget),
        ("obs-text target", b"GET /\xc3\xa9 HTTP/1.1\r\nHost: h\r\n\r\n", BadTarget),
        ("nul in target", b"GET /\0 HTTP/1.1\r\nHost: h\r\n\r\n", Malformed),
    ];
    for &(name, raw, kind) in cases {
        match request(raw) {
            Ok(head) => panic!("{name}: accepted as {head:?}"),
            Err(k) => assert_eq!(k, kind, "{name}"),
        }
    }
}

#[test]
fn error_statuses() {
    let status = |kind| ParseError::new(kind).status();
    assert_eq!(status(Malformed), 400);
    assert_eq!(status(BadHost), 400);
    assert_eq!(status(BadTransferEncoding), 400);
    assert_eq!(status(ContentLengthAndTransferEncoding), 400);
    assert_eq!(status(BadContentLength), 400);
    assert_eq!(status(BadTarget), 400);
    assert_eq!(status(UnsupportedTransferEncoding), 501);
    assert_eq!(status(UnsupportedVersion), 505);
    assert_eq!(status(RequestLineTooLong), 414);
    assert_eq!(status(HeadTooLarge), 431);
    assert_eq!(status(TooManyHeaders), 431);
}

/// Parse `raw` (possibly incomplete) with `limits`: Ok(true) complete, Ok(false) incomplete.
fn outcome(raw: &[u8], limits: &Limits) -> Result<bool, ParseErrorKind> {
    let mut buf = BytesMut::from(raw);
    match parse_request(&mut buf, limits) {
        Ok(Some(_)) => Ok(true),
        Ok(None) => {
            assert_eq!(
                &buf[..],
                raw,
                "incomplete parse must leave the buffer alone"
            );
            Ok(false)
        }
        Err(e) => Err(e.kind),
    }
}

#[test]
fn request_line_limit() {
    let limits = Limits {
        max_request_line: 64,
        ..Limits::default()
    };
    // "GET /aaa HTTP/1.1" of exactly 64 bytes passes, 65 is refused.
    let line = |len: usize| {
        let path = "a".repeat(len - "GET / HTTP/1.1".len());
        format!("GET /{path} HTTP/1.1")
    };
    assert_eq!(line(64).len(), 64);
    let ok = format!("{}\r\nHost: h\r\n\r\n", line(64));
    assert_eq!(outcome(ok.as_bytes(), &limits), Ok(true));
    let long = format!("{}\r\nHost: h\r\n\r\n", line(65));
    assert_eq!(outcome(long.as_bytes(), &limits), Err(RequestLineTooLong));
    // Complete line, incomplete head.
    let long = format!("{}\r\nHost: h\r\n", line(65));
    assert_eq!(outcome(long.as_bytes(), &limits), Err(RequestLineTooLong));
    // No line end yet: waits until the line cannot fit any more.
    let partial = line(200);
    assert_eq!(outcome(&partial.as_bytes()[..64], &limits), Ok(false));
    assert_eq!(
        outcome(&partial.as_bytes()[..65], &limits),
        Err(RequestLineTooLong)
    );
    assert_eq!(
        outcome(format!("{}\r", line(64)).as_bytes(), &limits),
        Ok(false)
    );
    // Same with a version we do not support.
    let v2 = format!("GET /{} HTTP/2.0\r\nHost: h\r\n\r\n", "a".repeat(100));
    assert_eq!(outcome(v2.as_bytes(), &limits), Err(RequestLineTooLong));
    // Default limit: 8 KiB.
    let big = format!("GET /{} HTTP/1.1\r\nHost: h\r\n\r\n", "a".repeat(9000));
    assert_eq!(
        outcome(big.as_bytes(), &Limits::default()),
        Err(RequestLineTooLong)
    );
    assert_eq!(ParseError::new(RequestLineTooLong).status(), 414);
}

#[test]
fn too_many_headers() {
    let mut raw = String::from("GET / HTTP/1.1\r\nHost: h\r\n");
    for i in 0..99 {
        raw.push_str(&format!("X-{i}: v\r\n"));
    }
    let ok = format!("{raw}\r\n");
    assert_eq!(request(ok.as_bytes()).unwrap().fields().count(), 100);
    raw.push_str("X-last: v\r\n");
    assert_eq!(
        outcome(raw.as_bytes(), &Limits::default()),
        Err(TooManyHeaders),
        "detected before the head ends"
    );
    let bad = format!("{raw}\r\n");
    assert_eq!(request(bad.as_bytes()).unwrap_err(), TooManyHeaders);
    // Above the stack array size.
    let limits = Limits {
        max_headers: 300,
        ..Limits::default()
    };
    let mut raw = String::from("GET / HTTP/1.1\r\nHost: h\r\n");
    for i in 0..299 {
        raw.push_str(&format!("X-{i}: v\r\n"));
    }
    let ok = format!("{raw}\r\n");
    assert_eq!(
        request_with(ok.as_bytes(), &limits)
            .unwrap()
            .fields()
            .count(),
        300
    );
    let bad = format!("{raw}X: y\r\n\r\n");
    assert_eq!(
        request_with(bad.as_bytes(), &limits).unwrap_err(),
        TooManyHeaders
    );
    let none = Limits {
        max_headers: 0,
        ..Limits::default()
    };
    assert_eq!(
        request_with(b"GET / HTTP/1.0\r\n\r\n", &none).map(|h| h.fields().count()),
        Ok(0)
    );
    assert_eq!(
        request_with(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n", &none).unwrap_err(),
        TooManyHeaders
    );
}

#[test]
fn head_too_large() {
    let limits = Limits {
        max_head_bytes: 1024,
        ..Limits::default()
    };
    let mut raw = String::from("GET / HTTP/1.1\r\nHost: h\r\n");
    while raw.len() < 1000 {
        raw.push_str("X-Filler: 0123456789\r\n");
    }
    // Incomplete and already over the limit.
    let mut over = raw.clone();
    while over.len() < 1100 {
        over.push_str("X-Filler: 0123456789\r\n");
    }
    assert_eq!(outcome(over.as_bytes(), &limits), Err(HeadTooLarge));
    assert_eq!(
        outcome(format!("{over}\r\n").as_bytes(), &limits),
        Err(HeadTooLarge)
    );
    // Incomplete and under: wait.
    assert_eq!(outcome(raw.as_bytes(), &limits), Ok(false));
    // Exactly at the limit passes.
    let mut exact = raw.clone();
    let pad = 1024 - exact.len() - "X: \r\n\r\n".len();
    exact.push_str(&format!("X: {}\r\n\r\n", "v".repeat(pad)));
    assert_eq!(exact.len(), 1024);
    assert_eq!(outcome(exact.as_bytes(), &limits), Ok(true));
    let mut one_more = raw;
    one_more.push_str(&format!("X: {}\r\n\r\n", "v".repeat(pad + 1)));
    assert_eq!(outcome(one_more.as_bytes(), &limits), Err(HeadTooLarge));
    // Default: 64 KiB.
    let huge = format!(
        "GET / HTTP/1.1\r\nHost: h\r\nX: {}\r\n\r\n",
        "v".repeat(70 * 1024)
    );
    assert_eq!(
        outcome(huge.as_bytes(), &Limits::default()),
        Err(HeadTooLarge)
    );
    assert_eq!(ParseError::new(HeadTooLarge).status(), 431);
}

#[test]
fn incomplete_heads_leave_the_buffer_alone() {
    let raw: &[u8] =
        b"\r\nPOST /upload?x=1 HTTP/1.1\r\nHost: example.com\r\nContent-Length: 3\r\nX: y \r\n\r\n";
    for end in 0..raw.len() {
        assert_eq!(
            outcome(&raw[..end], &Limits::default()),
            Ok(false),
            "prefix of {end} bytes"
        );
    }
    assert_eq!(outcome(raw, &Limits::default()), Ok(true));
    // A version that could still become HTTP/1.1 or a 505 waits too.
    for partial in [
        &b"GET / H"[..],
        b"GET / HTTP/",
        b"GET / HTTP/2",
        b"GET / HTTP/2.0",
        b"GET / HTTP/2.0\r",
    ] {
        assert_eq!(
            outcome(partial, &Limits::default()),
            Ok(false),
            "{:?}",
            String::from_utf8_lossy(partial)
        );
    }
    assert_eq!(
        outcome(b"GET / HTTP/2.0\r\n", &Limits::default()),
        Err(UnsupportedVersion)
    );
    assert_eq!(outcome(b"GET / HTTX", &Limits::default()), Err(Malformed));
    assert_eq!(
        outcome(b"GET / HTTP/2.0x", &Limits::default()),
        Err(Malformed)
    );
}

#[test]
fn pipelined_requests_parse_one_after_another() {
    let first: &[u8] = b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n";
    let second: &[u8] = b"GET /b HTTP/1.1\r\nHost: h\r\n\r\n";
    let mut buf = BytesMut::new();
    buf.extend_from_slice(first);
    buf.extend_from_slice(b"hello");
    buf.extend_from_slice(second);
    let a = parse_request(&mut buf, &Limits::default())
        .unwrap()
        .unwrap();
    assert_eq!(a.target(), "/a");
    assert_eq!(a.framing, Framing::Length(5));
    assert_eq!(&a.raw()[..], first);
    assert_eq!(&buf[..5], b"hello");
    let _ = buf.split_to(5);
    assert_eq!(&buf[..], second, "second request left intact");
    let b = parse_request(&mut buf, &Limits::default())
        .unwrap()
        .unwrap();
    assert_eq!(b.target(), "/b");
    assert!(buf.is_empty());

    // Back to back without a body, plus a stray CRLF between them.
    let mut buf = BytesMut::new();
    buf.extend_from_slice(second);
    buf.extend_from_slice(b"\r\n");
    buf.extend_from_slice(first);
    assert_eq!(
        parse_request(&mut buf, &Limits::default())
            .unwrap()
            .unwrap()
            .target(),
        "/b"
    );
    assert_eq!(&buf[2..], first);
    let a = parse_request(&mut buf, &Limits::default())
        .unwrap()
        .unwrap();
    assert_eq!(a.target(), "/a");
    assert!(buf.is_empty());
}

#[test]
fn fields_and_accessors() {
    let raw: &[u8] = b"GET /p?q HTTP/1.1\r\nHost:  h.example \r\nX-Empty:\r\nX-Trim: \t a b \t\r\nx-trim: second\r\n\r\n";
    let head = request(raw).unwrap();
    let fields: Vec<(&str, &[u8])> = head.fields().collect();
    assert_eq!(
        fields,
        vec![
            ("Host", &b"h.example"[..]),
            ("X-Empty", b""),
            ("X-Trim", b"a b"),
            ("x-trim", b"second")
        ]
    );
    assert_eq!(head.field("x-TRIM"), Some(&b"a b"[..]));
    assert_eq!(head.field("host"), Some(&b"h.example"[..]));
    assert_eq!(head.field("missing"), None);
    assert_eq!(head.field("x-empt"), None);
    assert_eq!(head.host(), Some("h.example"));
    assert_eq!(head.path(), "/p");
    assert_eq!(head.query(), Some("q"));
    assert_eq!(head.version(), Version::Http11);
    assert!(!head.expect_continue);
    assert!(!head.upgrade);
}

#[test]
fn absolute_and_special_targets() {
    let head =
        request(b"GET http://Example.com:8080/a/b?x=1 HTTP/1.1\r\nHost: other\r\n\r\n").unwrap();
    assert_eq!(head.target_form(), TargetForm::Absolute);
    assert_eq!(
        head.host(),
        Some("Example.com"),
        "absolute-form authority wins over Host"
    );
    assert_eq!(head.path(), "/a/b");
    assert_eq!(head.query(), Some("x=1"));
    let head = request(b"GET HTTPS://h HTTP/1.1\r\nHost: h\r\n\r\n").unwrap();
    assert_eq!((head.path(), head.query()), ("/", None));
    let head = request(b"GET http://h?x HTTP/1.1\r\nHost: h\r\n\r\n").unwrap();
    assert_eq!((head.path(), head.query()), ("/", Some("x")));
    let head = request(b"GET http://[::1]:80/ HTTP/1.1\r\nHost: h\r\n\r\n").unwrap();
    assert_eq!(head.host(), Some("[::1]"));
    let head = request(b"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n").unwrap();
    assert_eq!(
        (head.target_form(), head.path(), head.query()),
        (TargetForm::Asterisk, "*", None)
    );
    let head = request(b"CONNECT [::1]:443 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_eq!(
        (head.target_form(), head.path(), head.host()),
        (TargetForm::Authority, "", Some("[::1]"))
    );
}

#[test]
fn expect_upgrade_and_hop_by_hop() {
    let head = request(
        b"GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade, X-Custom\r\nConnection: , keep-alive\r\nUpgrade: websocket\r\nExpect: 100-Continue\r\n\r\n",
    )
    .unwrap();
    assert!(head.upgrade);
    assert!(head.expect_continue);
    assert!(head.keep_alive);
    for name in [
        "Connection",
        "keep-alive",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "transfer-encoding",
        "UPGRADE",
        "x-custom",
        "X-Custom",
    ] {
        assert!(head.is_hop_by_hop(name), "{name}");
    }
    for name in [
        "Content-Length",
        "Host",
        "X-Custo",
        "X-Custom2",
        "Proxy-Authenticate",
        "",
        "t",
    ] {
        assert!(!head.is_hop_by_hop(name), "{name}");
    }
    // Upgrade needs both the field and the Connection token, and HTTP/1.1.
    assert!(
        !request(b"GET / HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\n\r\n")
            .unwrap()
            .upgrade
    );
    assert!(
        !request(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: upgrade\r\n\r\n")
            .unwrap()
            .upgrade
    );
    assert!(
        !request(b"GET / HTTP/1.0\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n")
            .unwrap()
            .upgrade
    );
    assert!(
        !request(b"POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continuex\r\n\r\n")
            .unwrap()
            .expect_continue
    );
    // Many Connection tokens (beyond the inline storage).
    let head = request(
        b"GET / HTTP/1.1\r\nHost: h\r\nConnection: a, b, c, d, e, f\r\nConnection: g\r\n\r\n",
    )
    .unwrap();
    for name in ["a", "b", "c", "d", "e", "f", "G"] {
        assert!(head.is_hop_by_hop(name), "{name}");
    }
    assert!(!head.is_hop_by_hop("h"));
}

#[test]
fn method_helpers() {
    assert_eq!(Method::from_token("GET"), Some(Method::Get));
    assert_eq!(Method::from_token("get"), Some(Method::Other("get".into())));
    assert_eq!(Method::from_token("G T"), None);
    assert_eq!(Method::from_token(""), None);
    assert!(Method::Put.is_idempotent());
    assert!(!Method::Post.is_idempotent());
    assert_eq!(Method::Other("PURGE".into()).as_str(), "PURGE");
    assert_eq!(Version::Http10.as_str(), "HTTP/1.0");
}

#[test]
fn huge_configured_limits_do_not_allocate_or_overflow() {
    let limits = Limits {
        max_headers: usize::MAX,
        max_head_bytes: usize::MAX,
        max_request_line: usize::MAX,
    };
    let head = request_with(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n", &limits).unwrap();
    assert_eq!(head.host(), Some("h"));
    assert_eq!(
        outcome(b"GET / HTTP/1.1\r\nHost: h\r\n", &limits),
        Ok(false)
    );
    let tiny = Limits {
        max_headers: 10,
        max_head_bytes: 0,
        max_request_line: 0,
    };
    assert_eq!(outcome(b"G", &tiny), Err(RequestLineTooLong));
    assert_eq!(outcome(b"", &tiny), Ok(false));
}

#[test]
fn heads_with_and_without_utf8_read_alike() {
    use crate::head::HeadBuf;
    // A UTF-8 head keeps its text validated once; one with obs-text keeps its bytes.
    assert!(matches!(
        HeadBuf::new(bytes::Bytes::from_static(b"caf\xc3\xa9")),
        HeadBuf::Text(_)
    ));
    assert!(matches!(
        HeadBuf::new(bytes::Bytes::from_static(b"caf\xff")),
        HeadBuf::Raw(_)
    ));
    for (raw, x) in [
        (
            &b"GET /a?b HTTP/1.1\r\nHost: h\r\nX: caf\xc3\xa9\r\n\r\n"[..],
            &b"caf\xc3\xa9"[..],
        ),
        (
            b"GET /a?b HTTP/1.1\r\nHost: h\r\nX: caf\xff\r\n\r\n",
            b"caf\xff",
        ),
    ] {
        let head = request(raw).unwrap();
        let parts = (head.target(), head.path(), head.query(), head.host());
        assert_eq!(parts, ("/a?b", "/a", Some("b"), Some("h")));
        let names: Vec<&str> = head.fields().map(|(n, _)| n).collect();
        assert_eq!(names, ["Host", "X"]);
        assert_eq!(head.field("x"), Some(x));
        assert_eq!(head.raw().as_ref(), raw);
    }
}
