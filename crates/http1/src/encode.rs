//! Writing heads and chunked framing into an output buffer.

use bytes::BytesMut;

/// Append `METHOD target HTTP/1.1\r\n`. The caller passes a valid method token and target.
pub fn request_line(out: &mut BytesMut, method: &str, target: &str) {
    out.reserve(method.len().saturating_add(target.len()).saturating_add(11));
    out.extend_from_slice(method.as_bytes());
    out.extend_from_slice(b" ");
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
}

/// Append `HTTP/1.1 {status} {reason}\r\n`; an empty reason uses the canonical one for the status.
pub fn status_line(out: &mut BytesMut, status: u16, reason: &str) {
    let reason = if reason.is_empty() {
        self::reason(status)
    } else {
        reason
    };
    out.reserve(reason.len().saturating_add(16));
    if (100..1000).contains(&status) {
        // Every status on the wire has three digits: one copy for the line up to the reason.
        let digit = |n: u16| b'0' + (n % 10) as u8;
        out.extend_from_slice(&[
            b'H',
            b'T',
            b'T',
            b'P',
            b'/',
            b'1',
            b'.',
            b'1',
            b' ',
            digit(status / 100),
            digit(status / 10),
            digit(status),
            b' ',
        ]);
    } else {
        out.extend_from_slice(b"HTTP/1.1 ");
        decimal(out, u64::from(status));
        out.extend_from_slice(b" ");
    }
    out.extend_from_slice(reason.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Append `name: value\r\n`.
pub fn field(out: &mut BytesMut, name: &str, value: &[u8]) {
    out.reserve(name.len().saturating_add(value.len()).saturating_add(4));
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Append `Content-Length: n\r\n` (itoa-fast, no allocation).
pub fn content_length(out: &mut BytesMut, n: u64) {
    out.reserve(38);
    out.extend_from_slice(b"Content-Length: ");
    decimal(out, n);
    out.extend_from_slice(b"\r\n");
}

/// Append the final empty line `\r\n`.
pub fn end_head(out: &mut BytesMut) {
    out.extend_from_slice(b"\r\n");
}

/// Append the chunk-size line for a chunk of `len` bytes (`{hex}\r\n`); the caller writes the data
/// followed by `\r\n`. `len` must be > 0 (0 would write the last-chunk line).
pub fn chunk_header(out: &mut BytesMut, len: usize) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0u8; 18];
    let mut i = digits.len() - 2;
    digits[i] = b'\r';
    digits[i + 1] = b'\n';
    let mut n = len as u64;
    loop {
        i -= 1;
        digits[i] = HEX[(n & 0xf) as usize];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// Append the last chunk, the given raw trailer lines (each ending CRLF) and the final CRLF.
pub fn last_chunk(out: &mut BytesMut, trailers: &[u8]) {
    out.reserve(trailers.len().saturating_add(5));
    out.extend_from_slice(b"0\r\n");
    out.extend_from_slice(trailers);
    out.extend_from_slice(b"\r\n");
}

/// Append `n` in decimal without allocating.
fn decimal(out: &mut BytesMut, mut n: u64) {
    // u64::MAX has 20 digits.
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// Canonical reason phrase for a status code ("" if unknown).
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        102 => "Processing",
        103 => "Early Hints",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        203 => "Non-Authoritative Information",
        204 => "No Content",
        205 => "Reset Content",
        206 => "Partial Content",
        207 => "Multi-Status",
        208 => "Already Reported",
        226 => "IM Used",
        300 => "Multiple Choices",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        305 => "Use Proxy",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        416 => "Range Not Satisfiable",
        417 => "Expectation Failed",
        421 => "Misdirected Request",
        422 => "Unprocessable Content",
        423 => "Locked",
        424 => "Failed Dependency",
        425 => "Too Early",
        426 => "Upgrade Required",
        428 => "Precondition Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        451 => "Unavailable For Legal Reasons",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        506 => "Variant Also Negotiates",
        507 => "Insufficient Storage",
        508 => "Loop Detected",
        510 => "Not Extended",
        511 => "Network Authentication Required",
        _ => "",
    }
}
