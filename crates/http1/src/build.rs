//! Request heads built from a message already split into fields (an HTTP/2 HEADERS frame): written in HTTP/1 form and indexed as written, with a parsed head's checks and no second parse.

use crate::encode;
use crate::error::{ParseError, ParseErrorKind};
use crate::head::{
    parse_target, request_head, FieldScan, Limits, Method, RequestHead, Target, Version,
};
use crate::syntax::is_token;
use bytes::BytesMut;
use std::ops::Range;

/// A request head being built: the request line first, then field by field, then
/// [`RequestBuilder::finish`]. The result is the head [`crate::parse_request`] gives for the same
/// bytes (as HTTP/1.1), and every refusal is the one that parse gives, under the same limits.
pub struct RequestBuilder<'l> {
    buf: BytesMut,
    method: Method,
    target: Range<u32>,
    t: Target,
    scan: FieldScan,
    limits: &'l Limits,
}

fn err(kind: ParseErrorKind) -> ParseError {
    ParseError::new(kind)
}

/// A field value byte a parsed head accepts: HTAB, SP, visible ASCII, obs-text.
fn value_byte(b: u8) -> bool {
    b == b'\t' || (b' '..=b'~').contains(&b) || b >= 0x80
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
        let mut buf = BytesMut::with_capacity(512);
        encode::request_line(&mut buf, method, target);
        if buf.len().saturating_sub(2) > limits.max_request_line {
            return Err(err(ParseErrorKind::RequestLineTooLong));
        }
        let off = method.len().saturating_add(1);
        let t = parse_target(tb, &m, off).map_err(err)?;
        let end = u32::try_from(off.saturating_add(tb.len())).unwrap_or(u32::MAX);
        Ok(RequestBuilder {
            buf,
            method: m,
            target: u32::try_from(off).unwrap_or(u32::MAX)..end,
            t,
            scan: FieldScan::with_capacity(16),
            limits,
        })
    }

    /// One field: `name` a token, `value` without control bytes (surrounding spaces and tabs
    /// are trimmed, as a parse does).
    pub fn field(&mut self, name: &str, value: &[u8]) -> Result<(), ParseError> {
        self.field_list(name, &[value], b"")
    }

    /// One field whose value is `parts` joined with `sep` (the cookie fields of an HTTP/2
    /// request become one).
    pub fn field_list(
        &mut self,
        name: &str,
        parts: &[&[u8]],
        sep: &[u8],
    ) -> Result<(), ParseError> {
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

    /// The head: the Host rule, the framing and the limits on its size checked.
    pub fn finish(mut self) -> Result<RequestHead, ParseError> {
        encode::end_head(&mut self.buf);
        if self.buf.len() > self.limits.max_head_bytes {
            return Err(err(ParseErrorKind::HeadTooLarge));
        }
        let mut head = request_head(self.method, self.target, self.t, Version::Http11, self.scan)
            .map_err(err)?;
        head.buf = self.buf.freeze();
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
}
