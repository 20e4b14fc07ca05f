//! HTTP/2 request -> HTTP/1.1 request head (sans-io): RFC 9113 section 8 checks, then the head is written and parsed by the HTTP/1 codec.

use bytes::BytesMut;
use portico_http1::{encode, parse_request, Limits, ParseError, RequestHead};

/// Why a request cannot be translated.
#[derive(Debug)]
pub enum Reject {
    /// Malformed per RFC 9113 8.1.1 / 8.2 (400).
    Malformed(&'static str),
    /// CONNECT (plain or extended) is not served over HTTP/2 (501).
    Connect,
    /// The HTTP/1 codec refused the translated head (its status: 400, 414, 431, ...).
    Head(ParseError),
}

#[cfg(test)]
impl Reject {
    pub fn status(&self) -> u16 {
        match self {
            Reject::Malformed(_) => 400,
            Reject::Connect => 501,
            Reject::Head(e) => e.status(),
        }
    }
}

/// Fields that are connection-specific in HTTP/1.1 and malformed in HTTP/2 (RFC 9113 8.2.2).
fn connection_specific(name: &str) -> bool {
    matches!(
        name,
        "connection" | "keep-alive" | "proxy-connection" | "transfer-encoding" | "upgrade"
    )
}

/// RFC 9113 8.2.1: a field value must not contain NUL, CR or LF, nor start or end with
/// whitespace.
fn valid_value(v: &[u8]) -> bool {
    !v.iter().any(|&b| b == 0 || b == b'\r' || b == b'\n')
        && !v.first().is_some_and(|b| *b == b' ' || *b == b'\t')
        && !v.last().is_some_and(|b| *b == b' ' || *b == b'\t')
}

/// RFC 9113 8.2: names are lowercase tokens (no uppercase, no pseudo-fields among regular ones).
fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b"!#$%&'*+-.^_`|~".contains(&b)
        })
}

/// Translate a request's header section into an HTTP/1.1 head parsed by the HTTP/1 codec, so
/// routing, forwarding rules and the access log see the same `RequestHead` an HTTP/1 request
/// gives. `has_body`: the HEADERS frame did not end the stream. Framing: the client's
/// content-length when it sent one (the h2 crate checks DATA against it), else chunked when a
/// body follows. `:authority` becomes Host (RFC 9113 8.3.1); cookie fields are joined with "; "
/// (8.2.3).
pub fn to_http1(
    parts: &http::request::Parts,
    has_body: bool,
    limits: &Limits,
) -> Result<RequestHead, Reject> {
    if parts.method == http::Method::CONNECT {
        return Err(Reject::Connect);
    }
    let target = match parts.uri.path_and_query() {
        Some(pq) if !pq.as_str().is_empty() => pq.as_str(),
        _ => return Err(Reject::Malformed("missing :path")),
    };
    if !(target.starts_with('/') || (target == "*" && parts.method == http::Method::OPTIONS)) {
        return Err(Reject::Malformed(":path must be absolute or * for OPTIONS"));
    }
    let mut out = BytesMut::with_capacity(512);
    encode::request_line(&mut out, parts.method.as_str(), target);
    let authority = parts.uri.authority().map(|a| a.as_str());
    if let Some(a) = authority {
        if a.contains('@') {
            return Err(Reject::Malformed(":authority must not contain userinfo"));
        }
        encode::field(&mut out, "host", a.as_bytes());
    }
    let mut cookies: Vec<&[u8]> = Vec::new();
    let mut has_length = false;
    for (name, value) in &parts.headers {
        let n = name.as_str();
        let v = value.as_bytes();
        if !valid_name(n) {
            return Err(Reject::Malformed("field name not a lowercase token"));
        }
        if !valid_value(v) {
            return Err(Reject::Malformed(
                "field value with NUL, CR, LF or edge whitespace",
            ));
        }
        if connection_specific(n) {
            return Err(Reject::Malformed("connection-specific field"));
        }
        match n {
            "te" if v != b"trailers" => {
                return Err(Reject::Malformed("te other than \"trailers\""));
            }
            // The HTTP/1 codec would treat it as an HTTP/1 upgrade; HTTP/2 has none.
            "http2-settings" => continue,
            "host" if authority.is_some() => continue,
            "cookie" => {
                cookies.push(v);
                continue;
            }
            "content-length" => has_length = true,
            _ => {}
        }
        encode::field(&mut out, n, v);
    }
    if !cookies.is_empty() {
        out.extend_from_slice(b"cookie: ");
        for (i, c) in cookies.iter().enumerate() {
            if i > 0 {
                out.extend_from_slice(b"; ");
            }
            out.extend_from_slice(c);
        }
        out.extend_from_slice(b"\r\n");
    }
    if has_body && !has_length {
        encode::field(&mut out, "transfer-encoding", b"chunked");
    }
    encode::end_head(&mut out);
    match parse_request(&mut out, limits) {
        Ok(Some(head)) => Ok(head),
        Ok(None) => Err(Reject::Malformed("incomplete translated head")),
        Err(e) => Err(Reject::Head(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use portico_http1::Framing;

    fn parts(method: &str, uri: &str, fields: &[(&str, &str)]) -> http::request::Parts {
        let mut b = http::Request::builder().method(method).uri(uri);
        for (n, v) in fields {
            b = b.header(*n, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn authority_becomes_host_and_cookies_join() {
        let p = parts(
            "GET",
            "https://example.test/a?b=1",
            &[("host", "other"), ("cookie", "a=1"), ("cookie", "b=2")],
        );
        let h = to_http1(&p, false, &Limits::default()).unwrap();
        assert_eq!(h.target(), "/a?b=1");
        assert_eq!(h.host(), Some("example.test"));
        assert_eq!(h.field("cookie"), Some(b"a=1; b=2".as_slice()));
        assert_eq!(h.framing, Framing::None);
        assert_eq!(h.fields().filter(|(n, _)| *n == "host").count(), 1);
    }

    #[test]
    fn body_framing_is_length_or_chunked() {
        let p = parts("POST", "http://a/u", &[("content-length", "5")]);
        let h = to_http1(&p, true, &Limits::default()).unwrap();
        assert_eq!(h.framing, Framing::Length(5));
        let p = parts("POST", "http://a/u", &[]);
        let h = to_http1(&p, true, &Limits::default()).unwrap();
        assert_eq!(h.framing, Framing::Chunked);
    }

    #[test]
    fn section_8_violations_are_refused() {
        let l = Limits::default();
        for (n, v) in [
            ("connection", "close"),
            ("keep-alive", "1"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "h2c"),
            ("te", "gzip"),
        ] {
            let p = parts("GET", "http://a/", &[(n, v)]);
            assert!(
                matches!(to_http1(&p, false, &l), Err(Reject::Malformed(_))),
                "{n}"
            );
        }
        let p = parts("GET", "http://a/", &[("x", " padded")]);
        assert!(matches!(to_http1(&p, false, &l), Err(Reject::Malformed(_))));
        let p = parts("GET", "http://a/", &[("te", "trailers")]);
        assert!(to_http1(&p, false, &l).is_ok());
        let p = parts("CONNECT", "a:443", &[]);
        assert_eq!(to_http1(&p, false, &l).unwrap_err().status(), 501);
    }

    #[test]
    fn codec_limits_apply_to_the_translated_head() {
        let l = Limits {
            max_headers: 3,
            ..Limits::default()
        };
        let p = parts(
            "GET",
            "http://a/",
            &[("x-1", "1"), ("x-2", "2"), ("x-3", "3"), ("x-4", "4")],
        );
        assert_eq!(to_http1(&p, false, &l).unwrap_err().status(), 431);
    }

    #[test]
    fn values_and_names_checked_directly() {
        assert!(!valid_value(b"a\rb"));
        assert!(!valid_value(b"a\0"));
        assert!(!valid_value(b"a\t"));
        assert!(valid_value(b"a b"));
        assert!(valid_value(b""));
        assert!(!valid_name("X-Upper"));
        assert!(!valid_name(":path"));
        assert!(valid_name("x-ok_1"));
    }
}
