//! Request and response heads: strict parsing on httparse, framing decisions per RFC 9112 6.

use crate::body::Framing;
use crate::error::ParseError;
use bytes::{Bytes, BytesMut};
use std::ops::Range;

/// Size limits applied while parsing a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Maximum number of header fields (default 100).
    pub max_headers: usize,
    /// Maximum size of the whole head including the request line and final CRLF (default 64 KiB).
    pub max_head_bytes: usize,
    /// Maximum size of the request line (default 8 KiB).
    pub max_request_line: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_headers: 100, max_head_bytes: 64 * 1024, max_request_line: 8 * 1024 }
    }
}

/// HTTP version of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    Http10,
    Http11,
}

/// Request method. Common ones are variants; anything else valid as a token is `Other`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Post,
    Put,
    Delete,
    Options,
    Patch,
    Connect,
    Trace,
    Other(String),
}

impl Method {
    pub fn as_str(&self) -> &str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Delete => "DELETE",
            Method::Options => "OPTIONS",
            Method::Patch => "PATCH",
            Method::Connect => "CONNECT",
            Method::Trace => "TRACE",
            Method::Other(s) => s,
        }
    }

    /// GET, HEAD, OPTIONS, TRACE, PUT, DELETE (RFC 9110 9.2.2).
    pub fn is_idempotent(&self) -> bool {
        matches!(
            self,
            Method::Get | Method::Head | Method::Options | Method::Trace | Method::Put | Method::Delete
        )
    }
}

/// Byte ranges of one header field inside the head buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FieldPos {
    pub(crate) name: Range<u32>,
    pub(crate) value: Range<u32>,
}

/// A parsed, validated request head. Owns the raw head bytes; accessors borrow from them.
#[derive(Debug, Clone)]
pub struct RequestHead {
    pub(crate) buf: Bytes,
    pub(crate) method: Method,
    pub(crate) target: Range<u32>,
    pub(crate) version: Version,
    pub(crate) fields: Vec<FieldPos>,
    /// How the body that follows is framed: `Framing::None`, `Length(n)` or `Chunked` (never `Close`).
    pub framing: Framing,
    /// Whether the connection may stay open after this exchange (version default, then `Connection`).
    pub keep_alive: bool,
    /// `Expect: 100-continue` was present.
    pub expect_continue: bool,
    /// `Connection: upgrade` plus an `Upgrade` field were present.
    pub upgrade: bool,
}

/// A parsed, validated response head.
#[derive(Debug, Clone)]
pub struct ResponseHead {
    pub(crate) buf: Bytes,
    pub(crate) version: Version,
    pub(crate) status: u16,
    pub(crate) reason: Range<u32>,
    pub(crate) fields: Vec<FieldPos>,
    /// How the body is framed, given the request method (RFC 9112 6.3): `None` for HEAD, 1xx, 204,
    /// 304; `Chunked`; `Length(n)`; or `Close` (read until EOF).
    pub framing: Framing,
    /// Whether the server lets the connection be reused after this response.
    pub keep_alive: bool,
}

/// Parse one request head from the front of `buf`.
///
/// - `Ok(None)`: incomplete, read more (but if `buf` already exceeds the limits, that is an error).
/// - `Ok(Some(head))`: the head bytes (through the final CRLFCRLF) were split off `buf`; the body (if
///   any) and pipelined requests remain in `buf`.
/// - `Err(e)`: the connection must be answered with `e.status()` and closed.
///
/// Leading empty lines before the request line (RFC 9112 2.2) are skipped. Rejects everything the
/// reliability guide lists: CL+TE, differing or malformed CL, TE other than a final `chunked`,
/// obs-fold, whitespace before the colon, bare CR/LF, NUL and control bytes, bad request lines,
/// missing/duplicate Host in HTTP/1.1.
pub fn parse_request(buf: &mut BytesMut, limits: &Limits) -> Result<Option<RequestHead>, ParseError> {
    let _ = (buf, limits);
    unimplemented!("helper: implement")
}

/// Parse one response head from the front of `buf`, for a request with method `method`.
/// Same contract as [`parse_request`]. 1xx responses (other than 101) are returned like any other
/// head with `framing == Framing::None`; the caller forwards them and parses again.
pub fn parse_response(buf: &mut BytesMut, method: &Method, limits: &Limits) -> Result<Option<ResponseHead>, ParseError> {
    let _ = (buf, method, limits);
    unimplemented!("helper: implement")
}

impl RequestHead {
    pub fn method(&self) -> &Method {
        &self.method
    }
    /// The request target exactly as received (validated: visible ASCII only).
    pub fn target(&self) -> &str {
        unimplemented!()
    }
    /// Path part of an origin-form target (before `?`); for absolute-form, the path after the authority.
    pub fn path(&self) -> &str {
        unimplemented!()
    }
    /// Query part without the `?`, if any.
    pub fn query(&self) -> Option<&str> {
        unimplemented!()
    }
    pub fn version(&self) -> Version {
        self.version
    }
    /// Host from the Host field (or the absolute-form authority), without the port, lowercased not
    /// required (compare case-insensitively).
    pub fn host(&self) -> Option<&str> {
        unimplemented!()
    }
    /// All fields in order: (name as received, value with surrounding whitespace trimmed).
    pub fn fields(&self) -> impl Iterator<Item = (&str, &[u8])> + '_ {
        std::iter::empty()
    }
    /// First field with this name (ASCII case-insensitive).
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        let _ = name;
        unimplemented!()
    }
    /// True if `name` is hop-by-hop for this message: the fixed set (Connection, Keep-Alive,
    /// Proxy-Connection, TE, Trailer, Transfer-Encoding, Upgrade, Proxy-Authenticate? no: only the
    /// RFC 9110 7.6.1 set) or listed in this message's Connection field. Content-Length is NOT
    /// hop-by-hop here (the caller decides framing).
    pub fn is_hop_by_hop(&self, name: &str) -> bool {
        let _ = name;
        unimplemented!()
    }
    /// The raw head bytes (request line through the final CRLF CRLF).
    pub fn raw(&self) -> &Bytes {
        &self.buf
    }
}

impl ResponseHead {
    pub fn status(&self) -> u16 {
        self.status
    }
    pub fn reason(&self) -> &str {
        unimplemented!()
    }
    pub fn version(&self) -> Version {
        self.version
    }
    pub fn fields(&self) -> impl Iterator<Item = (&str, &[u8])> + '_ {
        std::iter::empty()
    }
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        let _ = name;
        unimplemented!()
    }
    /// Same rule as [`RequestHead::is_hop_by_hop`], with this response's Connection field.
    pub fn is_hop_by_hop(&self, name: &str) -> bool {
        let _ = name;
        unimplemented!()
    }
    pub fn raw(&self) -> &Bytes {
        &self.buf
    }
}
