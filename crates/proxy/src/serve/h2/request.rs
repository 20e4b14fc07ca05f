//! HTTP/2 request -> HTTP/1.1 request head (sans-io): RFC 9113 section 8 checks, then the head is built field by field with the HTTP/1 codec's checks (no second parse).

use portico_http1::{Limits, ParseError, RequestBuilder, RequestHead};

/// Why a request cannot be translated.
#[derive(Debug)]
pub enum Reject {
    /// Malformed per RFC 9113 8.1.1 / 8.2 (400).
    Malformed(&'static str),
    /// Plain CONNECT is not served over HTTP/2: Portico is no forward proxy (501).
    Connect,
    /// Extended CONNECT (RFC 8441) for a `:protocol` other than `websocket` (501).
    Protocol,
    /// The HTTP/1 codec refused the translated head (its status: 400, 414, 431, ...).
    Head(ParseError),
}

#[cfg(test)]
impl Reject {
    pub fn status(&self) -> u16 {
        match self {
            Reject::Malformed(_) => 400,
            Reject::Connect | Reject::Protocol => 501,
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

/// RFC 9113 8.2.1: a field value must not start or end with whitespace (NUL, CR, LF and the
/// other control bytes are refused by the head's builder).
fn valid_value(v: &[u8]) -> bool {
    !v.first().is_some_and(|b| *b == b' ' || *b == b'\t')
        && !v.last().is_some_and(|b| *b == b' ' || *b == b'\t')
}

/// RFC 9113 8.2: names are lowercase tokens (no uppercase, no pseudo-fields among regular ones).
fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b"!#$%&'*+-.^_`|~".contains(&b)
        })
}

/// Translate a request's header section into an HTTP/1.1 head built by the HTTP/1 codec, so
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
    let target = target(parts)?;
    translate(parts, parts.method.as_str(), target, has_body, None, limits)
}

/// An extended CONNECT (RFC 8441 4-5) with `:protocol websocket` as the HTTP/1.1 opening
/// handshake (RFC 6455 4.1) the upstream expects: `GET :path` with `Connection: upgrade`,
/// `Upgrade: websocket` and `key` as `Sec-WebSocket-Key` (HTTP/2 has none: the proxy makes one
/// for the HTTP/1.1 leg); other protocols are refused ([`Reject::Protocol`]). The client's `sec-websocket-version`, `-protocol`, `-extensions` and other fields go along as
/// for any request; a `sec-websocket-key` it sent is dropped. The stream's DATA is the tunnel,
/// not a body: the head has no framing field.
pub fn extended_to_http1(
    parts: &http::request::Parts,
    protocol: &str,
    key: &str,
    limits: &Limits,
) -> Result<RequestHead, Reject> {
    if parts.method != http::Method::CONNECT {
        return Err(Reject::Malformed(
            ":protocol on a method other than CONNECT",
        ));
    }
    if !protocol.eq_ignore_ascii_case("websocket") {
        return Err(Reject::Protocol);
    }
    if parts.uri.authority().is_none() {
        return Err(Reject::Malformed("extended CONNECT without :authority"));
    }
    let target = target(parts)?;
    if !target.starts_with('/') {
        return Err(Reject::Malformed("extended CONNECT :path must be absolute"));
    }
    if parts.headers.contains_key("content-length") {
        return Err(Reject::Malformed("content-length on extended CONNECT"));
    }
    translate(parts, "GET", target, false, Some(key), limits)
}

/// `:path` (with the query), which must be absolute, or `*` for OPTIONS.
fn target(parts: &http::request::Parts) -> Result<&str, Reject> {
    let target = match parts.uri.path_and_query() {
        Some(pq) if !pq.as_str().is_empty() => pq.as_str(),
        _ => return Err(Reject::Malformed("missing :path")),
    };
    if !(target.starts_with('/') || (target == "*" && parts.method == http::Method::OPTIONS)) {
        return Err(Reject::Malformed(":path must be absolute or * for OPTIONS"));
    }
    Ok(target)
}

/// The HTTP/1.1 head for `method target` with the request's fields; `websocket_key`: the
/// WebSocket upgrade fields with this key instead of framing.
fn translate(
    parts: &http::request::Parts,
    method: &str,
    target: &str,
    has_body: bool,
    websocket_key: Option<&str>,
    limits: &Limits,
) -> Result<RequestHead, Reject> {
    let mut out = RequestBuilder::new(method, target, limits).map_err(Reject::Head)?;
    let authority = parts.uri.authority().map(|a| a.as_str());
    if let Some(a) = authority {
        if a.contains('@') {
            return Err(Reject::Malformed(":authority must not contain userinfo"));
        }
        out.field("host", a.as_bytes()).map_err(Reject::Head)?;
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
            return Err(Reject::Malformed("field value with edge whitespace"));
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
            "sec-websocket-key" if websocket_key.is_some() => continue,
            "cookie" => {
                cookies.push(v);
                continue;
            }
            "content-length" => has_length = true,
            _ => {}
        }
        out.field(n, v).map_err(Reject::Head)?;
    }
    if !cookies.is_empty() {
        out.field_list("cookie", &cookies, b"; ")
            .map_err(Reject::Head)?;
    }
    let fixed: &[(&str, &[u8])] = match websocket_key {
        Some(key) => &[
            ("connection", b"upgrade"),
            ("upgrade", b"websocket"),
            ("sec-websocket-key", key.as_bytes()),
        ],
        None if has_body && !has_length => &[("transfer-encoding", b"chunked")],
        None => &[],
    };
    for (n, v) in fixed {
        out.field(n, v).map_err(Reject::Head)?;
    }
    out.finish().map_err(Reject::Head)
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

    const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

    #[test]
    fn websocket_extended_connect_becomes_an_http1_upgrade() {
        let p = parts(
            "CONNECT",
            "https://chat.test/ws?room=1",
            &[
                ("sec-websocket-version", "13"),
                ("sec-websocket-protocol", "chat, superchat"),
                ("sec-websocket-key", "sent-by-the-client"),
                ("cookie", "a=1"),
            ],
        );
        let h = extended_to_http1(&p, "websocket", KEY, &Limits::default()).unwrap();
        assert_eq!(h.method().as_str(), "GET");
        assert_eq!(h.target(), "/ws?room=1");
        assert_eq!(h.host(), Some("chat.test"));
        assert!(
            h.upgrade,
            "Connection: upgrade plus Upgrade make an HTTP/1.1 upgrade"
        );
        assert_eq!(h.framing, Framing::None);
        assert_eq!(h.field("upgrade"), Some(b"websocket".as_slice()));
        assert_eq!(h.field("sec-websocket-key"), Some(KEY.as_bytes()));
        assert_eq!(
            h.fields()
                .filter(|(n, _)| n.eq_ignore_ascii_case("sec-websocket-key"))
                .count(),
            1
        );
        assert_eq!(h.field("sec-websocket-version"), Some(b"13".as_slice()));
        assert_eq!(
            h.field("sec-websocket-protocol"),
            Some(b"chat, superchat".as_slice())
        );
        assert_eq!(h.field("cookie"), Some(b"a=1".as_slice()));
        // The protocol token is case-insensitive (RFC 9110 7.8).
        assert!(extended_to_http1(&p, "WebSocket", KEY, &Limits::default()).is_ok());
    }

    #[test]
    fn other_extended_connects_are_refused() {
        let l = Limits::default();
        let ok = parts("CONNECT", "https://a/ws", &[]);
        let e = extended_to_http1(&ok, "connect-udp", KEY, &l).unwrap_err();
        assert!(matches!(e, Reject::Protocol));
        assert_eq!(e.status(), 501);
        // No :authority.
        let p = parts("CONNECT", "/ws", &[]);
        assert_eq!(
            extended_to_http1(&p, "websocket", KEY, &l)
                .unwrap_err()
                .status(),
            400
        );
        // A body length on a tunnel.
        let p = parts("CONNECT", "https://a/ws", &[("content-length", "3")]);
        assert_eq!(
            extended_to_http1(&p, "websocket", KEY, &l)
                .unwrap_err()
                .status(),
            400
        );
        // :protocol on another method (the h2 crate refuses it first; checked here too).
        let p = parts("GET", "https://a/ws", &[]);
        assert_eq!(
            extended_to_http1(&p, "websocket", KEY, &l)
                .unwrap_err()
                .status(),
            400
        );
        // RFC 9113 8.2.2 still applies.
        let p = parts("CONNECT", "https://a/ws", &[("upgrade", "websocket")]);
        assert!(matches!(
            extended_to_http1(&p, "websocket", KEY, &l),
            Err(Reject::Malformed(_))
        ));
        // And the codec's limits.
        let tight = Limits {
            max_headers: 3,
            ..Limits::default()
        };
        let p = parts("CONNECT", "https://a/ws", &[("x-1", "1")]);
        assert_eq!(
            extended_to_http1(&p, "websocket", KEY, &tight)
                .unwrap_err()
                .status(),
            431
        );
        // Plain CONNECT stays refused by the ordinary translation.
        let p = parts("CONNECT", "a:443", &[]);
        assert!(matches!(to_http1(&p, false, &l), Err(Reject::Connect)));
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
        // Control bytes are the head builder's to refuse (400), edge whitespace ours.
        let l = Limits::default();
        let mut b = RequestBuilder::new("GET", "/", &l).unwrap();
        assert_eq!(b.field("x", b"a\rb").unwrap_err().status(), 400);
        assert_eq!(b.field("x", b"a\0").unwrap_err().status(), 400);
        assert!(!valid_value(b"a\t"));
        assert!(valid_value(b"a b"));
        assert!(valid_value(b""));
        assert!(!valid_name("X-Upper"));
        assert!(!valid_name(":path"));
        assert!(valid_name("x-ok_1"));
    }
}
