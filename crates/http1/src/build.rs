//! Heads built from a message already split into fields (an HTTP/2 HEADERS frame): written in HTTP/1 form and indexed as written, with a parsed head's checks and no second parse.

use crate::encode;
use crate::error::{ParseError, ParseErrorKind};
use crate::head::{
    parse_target, request_head, response_head, FieldScan, Limits, Method, RequestHead,
    ResponseHead, Target, Version,
};
use crate::syntax::is_token;
use bytes::BytesMut;
use std::ops::Range;

fn err(kind: ParseErrorKind) -> ParseError {
    ParseError::new(kind)
}

/// A field value byte a parsed head accepts: HTAB, SP, visible ASCII, obs-text.
fn value_byte(b: u8) -> bool {
    b == b'\t' || (b' '..=b'~').contains(&b) || b >= 0x80
}

fn off32(x: usize) -> u32 {
    u32::try_from(x).unwrap_or(u32::MAX)
}

/// The head's bytes as they are written, and what its fields say, under the limits.
struct Fields<'l> {
    buf: BytesMut,
    scan: FieldScan,
    limits: &'l Limits,
}

impl<'l> Fields<'l> {
    fn new(limits: &'l Limits) -> Self {
        Fields {
            buf: BytesMut::with_capacity(512),
            scan: FieldScan::with_capacity(16),
            limits,
        }
    }

    /// One field whose value is `parts` joined with `sep`, checked as a parse checks it.
    fn field(&mut self, name: &str, parts: &[&[u8]], sep: &[u8]) -> Result<(), ParseError> {
        if self.scan.len() >= self.limits.max_headers {
            return Err(err(ParseErrorKind::TooManyHeaders));
        }
        if !is_token(name.as_bytes()) {
            return Err(err(ParseErrorKind::Malformed));
        }
        let buf = &mut self.buf;
        let len = parts.iter().map(|p| p.len() + sep.len()).sum::<usize>();
        buf.reserve(name.len().saturating_add(len).saturating_add(4));
        let name_off = buf.len();
        buf.extend_from_slice(name.as_bytes());
        buf.extend_from_slice(b": ");
        let value_off = buf.len();
        for (i, p) in parts.iter().enumerate() {
            if i > 0 {
                buf.extend_from_slice(sep);
            }
            buf.extend_from_slice(p);
        }
        let written = buf.get(value_off..).unwrap_or_default();
        // A fold, not an early exit: it vectorizes.
        if !written.iter().fold(true, |ok, &b| ok & value_byte(b)) {
            return Err(err(ParseErrorKind::Malformed));
        }
        let start = written.len() - written.trim_ascii_start().len();
        let value = written.trim_ascii();
        let value_off = value_off.saturating_add(start);
        self.scan
            .field(name.as_bytes(), value, name_off, value_off)
            .map_err(err)?;
        self.buf.extend_from_slice(b"\r\n");
        Ok(())
    }

    /// The empty line; the head's size within `max_head_bytes`.
    fn end(&mut self) -> Result<(), ParseError> {
        encode::end_head(&mut self.buf);
        if self.buf.len() > self.limits.max_head_bytes {
            return Err(err(ParseErrorKind::HeadTooLarge));
        }
        Ok(())
    }
}

/// A request head being built: the request line first, then field by field, then
/// [`RequestBuilder::finish`]. The result is the head [`crate::parse_request`] gives for the same
/// bytes (as HTTP/1.1), and every refusal is the one that parse gives, under the same limits.
pub struct RequestBuilder<'l> {
    f: Fields<'l>,
    method: Method,
    target: Range<u32>,
    t: Target,
}

impl<'l> RequestBuilder<'l> {
    /// `method target HTTP/1.1`: the method a token, the target visible ASCII and in a form the
    /// method allows, the line within `max_request_line`.
    pub fn new(method: &str, target: &str, limits: &'l Limits) -> Result<Self, ParseError> {
        let m = Method::from_token(method).ok_or(err(ParseErrorKind::Malformed))?;
        let tb = target.as_bytes();
        // What the request line's parse refuses before the target's own checks: nothing, or a
        // control byte, a space or DEL (obs-text and fragments are the target check's).
        if tb.is_empty() || tb.iter().any(|&b| b <= b' ' || b == 0x7f) {
            return Err(err(ParseErrorKind::Malformed));
        }
        let mut f = Fields::new(limits);
        encode::request_line(&mut f.buf, method, target);
        if f.buf.len().saturating_sub(2) > limits.max_request_line {
            return Err(err(ParseErrorKind::RequestLineTooLong));
        }
        let off = method.len().saturating_add(1);
        let t = parse_target(tb, &m, off).map_err(err)?;
        Ok(RequestBuilder {
            f,
            method: m,
            target: off32(off)..off32(off.saturating_add(tb.len())),
            t,
        })
    }

    /// One field: `name` a token, `value` without control bytes (surrounding spaces and tabs
    /// are trimmed, as a parse does).
    pub fn field(&mut self, name: &str, value: &[u8]) -> Result<(), ParseError> {
        self.f.field(name, &[value], b"")
    }

    /// One field whose value is `parts` joined with `sep` (the cookie fields of an HTTP/2
    /// request become one).
    pub fn field_list(
        &mut self,
        name: &str,
        parts: &[&[u8]],
        sep: &[u8],
    ) -> Result<(), ParseError> {
        self.f.field(name, parts, sep)
    }

    /// The head: the Host rule, the framing and the limits on its size checked.
    pub fn finish(mut self) -> Result<RequestHead, ParseError> {
        self.f.end()?;
        let version = Version::Http11;
        let mut head =
            request_head(self.method, self.target, self.t, version, self.f.scan).map_err(err)?;
        head.buf = crate::head::HeadBuf::new(self.f.buf.freeze());
        Ok(head)
    }
}

/// A response head being built: the status line first (the status's canonical reason), then
/// field by field, then [`ResponseBuilder::finish`]; the head [`crate::parse_response`] gives for
/// the same bytes as an answer to `method`, refusals included.
pub struct ResponseBuilder<'l> {
    f: Fields<'l>,
    status: u16,
    method: &'l Method,
    reason: Range<u32>,
}

impl<'l> ResponseBuilder<'l> {
    /// `HTTP/1.1 status reason`, for a request of `method`; a status outside 100..=999 is
    /// refused.
    pub fn new(status: u16, method: &'l Method, limits: &'l Limits) -> Result<Self, ParseError> {
        if !(100..=999).contains(&status) {
            return Err(err(ParseErrorKind::Malformed));
        }
        let mut f = Fields::new(limits);
        encode::status_line(&mut f.buf, status, "");
        // "HTTP/1.1 200 " is 13 bytes.
        let reason = 13..off32(f.buf.len().saturating_sub(2));
        Ok(ResponseBuilder {
            f,
            status,
            method,
            reason,
        })
    }

    /// One field, checked as [`RequestBuilder::field`] checks it.
    pub fn field(&mut self, name: &str, value: &[u8]) -> Result<(), ParseError> {
        self.f.field(name, &[value], b"")
    }

    /// The head: its framing for the request's method, the limits on its size checked.
    pub fn finish(mut self) -> Result<ResponseHead, ParseError> {
        self.f.end()?;
        let (status, version) = (self.status, Version::Http11);
        let mut head =
            response_head(status, self.reason, version, self.f.scan, self.method).map_err(err)?;
        head.buf = crate::head::HeadBuf::new(self.f.buf.freeze());
        Ok(head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{parse_request, Framing};

    /// The built head and the parsed head of the same bytes agree in every accessor.
    fn same_as_parsed(method: &str, target: &str, fields: &[(&str, &[u8])]) {
        let limits = Limits::default();
        let mut b = RequestBuilder::new(method, target, &limits).unwrap();
        for (n, v) in fields {
            b.field(n, v).unwrap();
        }
        let built = b.finish().unwrap();
        let mut raw = BytesMut::from(&built.raw()[..]);
        let parsed = parse_request(&mut raw, &limits).unwrap().unwrap();
        assert_eq!(built.raw(), parsed.raw());
        assert_eq!(built.method(), parsed.method());
        assert_eq!(built.target(), parsed.target());
        assert_eq!(built.target_form(), parsed.target_form());
        assert_eq!(built.path(), parsed.path());
        assert_eq!(built.query(), parsed.query());
        assert_eq!(built.host(), parsed.host());
        assert_eq!(
            built.fields().collect::<Vec<_>>(),
            parsed.fields().collect::<Vec<_>>()
        );
        assert_eq!(built.framing, parsed.framing);
        assert_eq!(built.keep_alive, parsed.keep_alive);
        assert_eq!(built.expect_continue, parsed.expect_continue);
        assert_eq!(built.upgrade, parsed.upgrade);
        assert_eq!(built.is_hop_by_hop("x-a"), parsed.is_hop_by_hop("x-a"));
    }

    #[test]
    fn built_heads_are_the_heads_a_parse_gives() {
        same_as_parsed("GET", "/a/b?c=1", &[("host", b"example.test:8443")]);
        same_as_parsed(
            "POST",
            "/u",
            &[
                ("host", b"[::1]:80"),
                ("content-length", b"5"),
                ("expect", b"100-continue"),
                ("cookie", b"a=1; b=2"),
            ],
        );
        same_as_parsed(
            "PUT",
            "/c",
            &[("host", b"h"), ("transfer-encoding", b"chunked")],
        );
        same_as_parsed("OPTIONS", "*", &[("host", b"h"), ("x-obs", b"caf\xc3\xa9")]);
        same_as_parsed(
            "GET",
            "/ws",
            &[
                ("host", b"h"),
                ("connection", b"upgrade, x-a"),
                ("upgrade", b"websocket"),
                ("x-a", b"1"),
            ],
        );
    }

    #[test]
    fn refusals_are_a_parse_refusals() {
        let limits = Limits {
            max_headers: 2,
            max_head_bytes: 80,
            max_request_line: 30,
        };
        let kind = |r: Result<RequestHead, ParseError>| r.unwrap_err().kind;
        let new = |m: &str, t: &str| RequestBuilder::new(m, t, &limits).map(|_| ());
        assert_eq!(
            new("GET", "/a b").unwrap_err().kind,
            ParseErrorKind::Malformed
        );
        assert_eq!(
            new("GET", "/a#frag").unwrap_err().kind,
            ParseErrorKind::BadTarget
        );
        assert_eq!(new("GET", "*").unwrap_err().kind, ParseErrorKind::BadTarget);
        assert_eq!(new("G T", "/").unwrap_err().kind, ParseErrorKind::Malformed);
        assert_eq!(
            new("GET", "/0123456789012345678901234").unwrap_err().kind,
            ParseErrorKind::RequestLineTooLong
        );
        let build = |fields: &[(&str, &[u8])]| {
            let mut b = RequestBuilder::new("GET", "/", &limits)?;
            for (n, v) in fields {
                b.field(n, v)?;
            }
            b.finish()
        };
        assert_eq!(kind(build(&[])), ParseErrorKind::BadHost);
        assert_eq!(
            kind(build(&[("host", b"a"), ("host", b"b")])),
            ParseErrorKind::BadHost
        );
        assert_eq!(
            kind(build(&[("host", b"a"), ("x", b"1"), ("y", b"2")])),
            ParseErrorKind::TooManyHeaders
        );
        assert_eq!(
            kind(build(&[("host", b"a"), ("x", &[b'a'; 60])])),
            ParseErrorKind::HeadTooLarge
        );
        assert_eq!(
            kind(build(&[("host", b"a"), ("x", b"a\x01b")])),
            ParseErrorKind::Malformed
        );
        assert_eq!(
            kind(build(&[("host", b"a"), ("content-length", b"x")])),
            ParseErrorKind::BadContentLength
        );
        assert_eq!(
            kind(build(&[("host", b"a"), ("bad name", b"1")])),
            ParseErrorKind::Malformed
        );
        let ok = build(&[("host", b" a "), ("content-length", b"3")]).unwrap();
        assert_eq!((ok.host(), ok.framing), (Some("a"), Framing::Length(3)));
    }

    /// The built response and the parsed response of the same bytes agree, for `method`.
    fn response_as_parsed(status: u16, method: Method, fields: &[(&str, &[u8])]) -> ResponseHead {
        let limits = Limits::default();
        let mut b = ResponseBuilder::new(status, &method, &limits).unwrap();
        for (n, v) in fields {
            b.field(n, v).unwrap();
        }
        let built = b.finish().unwrap();
        let mut raw = BytesMut::from(&built.raw()[..]);
        let parsed = crate::parse_response(&mut raw, &method, &limits)
            .unwrap()
            .unwrap();
        assert_eq!(built.raw(), parsed.raw());
        assert_eq!(built.status(), parsed.status());
        assert_eq!(built.reason(), parsed.reason());
        assert_eq!(
            built.fields().collect::<Vec<_>>(),
            parsed.fields().collect::<Vec<_>>()
        );
        assert_eq!(built.framing, parsed.framing);
        assert_eq!(built.keep_alive, parsed.keep_alive);
        built
    }

    #[test]
    fn built_responses_are_the_responses_a_parse_gives() {
        let ok = response_as_parsed(200, Method::Get, &[("content-length", b"5"), ("x", b"1")]);
        assert_eq!((ok.reason(), ok.framing), ("OK", Framing::Length(5)));
        let te = [("transfer-encoding", b"chunked".as_slice())];
        assert_eq!(
            response_as_parsed(200, Method::Get, &te).framing,
            Framing::Chunked
        );
        let head = response_as_parsed(200, Method::Head, &[("content-length", b"5")]);
        assert_eq!(head.framing, Framing::None);
        assert_eq!(
            response_as_parsed(204, Method::Get, &[]).framing,
            Framing::None
        );
        let close = response_as_parsed(200, Method::Get, &[]);
        assert_eq!((close.framing, close.keep_alive), (Framing::Close, false));
        response_as_parsed(
            101,
            Method::Get,
            &[("upgrade", b"websocket"), ("connection", b"upgrade")],
        );
        let limits = Limits::default();
        assert!(ResponseBuilder::new(99, &Method::Get, &limits).is_err());
        let mut b = ResponseBuilder::new(200, &Method::Get, &limits).unwrap();
        b.field("content-length", b"1").unwrap();
        b.field("transfer-encoding", b"chunked").unwrap();
        assert_eq!(
            b.finish().unwrap_err().kind,
            ParseErrorKind::ContentLengthAndTransferEncoding
        );
    }
}
