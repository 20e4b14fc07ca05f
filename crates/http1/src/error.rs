//! Typed parse errors, each mapped to the status a server answers with.

/// Why a message head was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseErrorKind {
    /// Syntax error in the request/status line or a header field (incl. obs-fold, whitespace
    /// before the colon, bare CR, NUL or control bytes).
    Malformed,
    /// The request line is longer than `Limits::max_request_line` (414).
    RequestLineTooLong,
    /// The head is larger than `Limits::max_head_bytes` (431).
    HeadTooLarge,
    /// More header fields than `Limits::max_headers` (431).
    TooManyHeaders,
    /// Both Content-Length and Transfer-Encoding present.
    ContentLengthAndTransferEncoding,
    /// Several Content-Length values that differ, or a Content-Length that is not a decimal number.
    BadContentLength,
    /// A Transfer-Encoding other than a single final `chunked` (501 for requests per RFC 9112 6.1
    /// when the coding is unknown; we answer 400 for malformed lists and 501 for unknown codings).
    BadTransferEncoding,
    /// Transfer-Encoding with a coding we do not implement.
    UnsupportedTransferEncoding,
    /// HTTP version other than 1.0 / 1.1 (505).
    UnsupportedVersion,
    /// Missing Host in an HTTP/1.1 request, or several Host fields, or a bad Host value.
    BadHost,
    /// Request target not in origin-form / absolute-form / authority-form (CONNECT) / asterisk-form (OPTIONS).
    BadTarget,
}

/// A message head that cannot be accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("bad HTTP/1.1 head: {kind:?}")]
pub struct ParseError {
    pub kind: ParseErrorKind,
}

impl ParseError {
    pub fn new(kind: ParseErrorKind) -> Self {
        ParseError { kind }
    }

    /// The status a server answers this error with (400, 414, 431, 501, 505).
    pub fn status(&self) -> u16 {
        match self.kind {
            ParseErrorKind::RequestLineTooLong => 414,
            ParseErrorKind::HeadTooLarge | ParseErrorKind::TooManyHeaders => 431,
            ParseErrorKind::UnsupportedTransferEncoding => 501,
            ParseErrorKind::UnsupportedVersion => 505,
            _ => 400,
        }
    }
}

/// A message body whose framing is broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("malformed chunk size line")]
    BadChunkSize,
    #[error("chunk size too large")]
    ChunkSizeOverflow,
    #[error("missing CRLF after chunk data")]
    BadChunkEnd,
    #[error("malformed or oversized trailer section")]
    BadTrailers,
    #[error("connection closed before the body was complete")]
    Truncated,
}
