//! Fuzz the HTTP/2 -> HTTP/1.1 request translation (`crates/proxy/src/serve/h2/request.rs`, compiled here
//! by path: it needs only `http` and the HTTP/1 codec): no panic, and an accepted request's head
//! re-parses with the HTTP/1 parser into the same method, target, host and framing; an accepted
//! extended CONNECT (`extended_to_http1`, `:protocol websocket`) is a body-less HTTP/1 upgrade.

#![no_main]

#[allow(dead_code)]
#[path = "../../crates/proxy/src/serve/h2/request.rs"]
mod request;

use bytes::BytesMut;
use http::{HeaderName, HeaderValue, Method, Request, Uri};
use libfuzzer_sys::fuzz_target;
use portico_http1::{parse_request, Framing, Limits};

const LIMITS: Limits = Limits {
    max_headers: 16,
    max_head_bytes: 4096,
    max_request_line: 1024,
};

const METHODS: [&str; 8] = [
    "GET", "POST", "HEAD", "OPTIONS", "PUT", "DELETE", "CONNECT", "PATCH",
];

/// Input: one flag byte (method choice, body, authority), then fields separated by 0xFF:
/// [method if custom,] path, [authority,] then name, value, name, value...
fn build(data: &[u8]) -> Option<(http::request::Parts, bool)> {
    let (&flags, rest) = data.split_first()?;
    let mut parts = rest.split(|&b| b == 0xFF);
    let method = if flags & 0x07 == 0x07 {
        Method::from_bytes(parts.next()?).ok()?
    } else {
        Method::from_bytes(METHODS[usize::from(flags & 0x07)].as_bytes()).ok()?
    };
    let has_body = flags & 0x08 != 0;
    let path = parts.next()?;
    let mut uri = Uri::builder();
    if flags & 0x10 != 0 {
        uri = uri
            .scheme("https")
            .authority(parts.next()?)
            .path_and_query(path);
    } else {
        uri = uri.path_and_query(path);
    }
    let uri = uri.build().ok()?;
    let mut req = Request::builder().method(method).uri(uri);
    while let Some(name) = parts.next() {
        let value = parts.next().unwrap_or(b"");
        let name = HeaderName::from_bytes(name).ok()?;
        let value = HeaderValue::from_bytes(value).ok()?;
        req = req.header(name, value);
    }
    let (parts, ()) = req.body(()).ok()?.into_parts();
    Some((parts, has_body))
}

/// The same parts as an RFC 8441 extended CONNECT: only CONNECT is accepted, and then as the
/// WebSocket handshake `GET :path` with the key, the upgrade fields and no framing.
fn extended(parts: &http::request::Parts) {
    const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
    let head = match request::extended_to_http1(parts, "websocket", KEY, &LIMITS) {
        Ok(head) => head,
        Err(_) => return,
    };
    assert_eq!(parts.method, Method::CONNECT);
    assert!(matches!(
        request::extended_to_http1(parts, "connect-udp", KEY, &LIMITS),
        Err(request::Reject::Protocol)
    ));
    assert_eq!(head.method().as_str(), "GET");
    assert_eq!(head.target(), parts.uri.path_and_query().unwrap().as_str());
    assert!(
        head.upgrade,
        "a WebSocket handshake that is no HTTP/1 upgrade"
    );
    assert_eq!(head.framing, Framing::None);
    assert_eq!(head.field("upgrade"), Some(b"websocket".as_slice()));
    assert_eq!(head.field("sec-websocket-key"), Some(KEY.as_bytes()));
    let mut again = BytesMut::from(&head.raw()[..]);
    let again = parse_request(&mut again, &LIMITS)
        .expect("translated handshake refused")
        .expect("translated handshake incomplete");
    assert!(again.upgrade);
    assert!(again.fields().eq(head.fields()));
}

fuzz_target!(|data: &[u8]| {
    let Some((parts, has_body)) = build(data) else {
        return;
    };
    extended(&parts);
    let head = match request::to_http1(&parts, has_body, &LIMITS) {
        Ok(head) => head,
        Err(request::Reject::Connect) => {
            assert_eq!(parts.method, Method::CONNECT);
            return;
        }
        Err(_) => return,
    };
    let pq = parts.uri.path_and_query().unwrap().as_str();
    assert_eq!(head.method().as_str(), parts.method.as_str());
    assert_eq!(head.target(), pq);
    if let Some(a) = parts.uri.authority() {
        // :authority is forwarded as Host as is; the head's host is its host part (no port).
        assert_eq!(head.field("host"), Some(a.as_str().as_bytes()));
        assert_eq!(head.host(), Some(a.host()));
    }
    let lengths: Vec<_> = parts.headers.get_all("content-length").iter().collect();
    match head.framing {
        Framing::Chunked => assert!(has_body && lengths.is_empty(), "chunked without a reason"),
        Framing::Length(n) => {
            assert!(!lengths.is_empty());
            for v in lengths {
                for elem in std::str::from_utf8(v.as_bytes()).unwrap().split(',') {
                    assert_eq!(elem.trim().parse(), Ok(n), "content-length {v:?}");
                }
            }
        }
        Framing::None => assert!(!has_body || !lengths.is_empty(), "a body lost its framing"),
        Framing::Close => panic!("request with close framing"),
    }
    assert!(!head.upgrade, "an HTTP/2 request became an HTTP/1 upgrade");

    // What is forwarded upstream is this head: it must re-parse to the same request.
    let mut again = BytesMut::from(&head.raw()[..]);
    let again = parse_request(&mut again, &LIMITS)
        .expect("translated head refused")
        .expect("translated head incomplete");
    assert_eq!(again.method(), head.method());
    assert_eq!(again.target(), head.target());
    assert_eq!(again.host(), head.host());
    assert_eq!(again.framing, head.framing);
    assert!(again.fields().eq(head.fields()));
});
