//! Writing heads and chunked framing into an output buffer.

use bytes::BytesMut;

/// Append `METHOD target HTTP/1.1\r\n`.
pub fn request_line(out: &mut BytesMut, method: &str, target: &str) {
    let _ = (out, method, target);
    unimplemented!()
}

/// Append `HTTP/1.1 {status} {reason}\r\n`; an empty reason uses the canonical one for the status.
pub fn status_line(out: &mut BytesMut, status: u16, reason: &str) {
    let _ = (out, status, reason);
    unimplemented!()
}

/// Append `name: value\r\n`.
pub fn field(out: &mut BytesMut, name: &str, value: &[u8]) {
    let _ = (out, name, value);
    unimplemented!()
}

/// Append `Content-Length: n\r\n` (itoa-fast, no allocation).
pub fn content_length(out: &mut BytesMut, n: u64) {
    let _ = (out, n);
    unimplemented!()
}

/// Append the final empty line `\r\n`.
pub fn end_head(out: &mut BytesMut) {
    out.extend_from_slice(b"\r\n");
}

/// Append the chunk-size line for a chunk of `len` bytes (`{hex}\r\n`); the caller writes the data
/// followed by `\r\n`. `len` must be > 0.
pub fn chunk_header(out: &mut BytesMut, len: usize) {
    let _ = (out, len);
    unimplemented!()
}

/// Append the last chunk, the given raw trailer lines (each ending CRLF) and the final CRLF.
pub fn last_chunk(out: &mut BytesMut, trailers: &[u8]) {
    let _ = (out, trailers);
    unimplemented!()
}

/// Canonical reason phrase for a status code ("" if unknown).
pub fn reason(status: u16) -> &'static str {
    let _ = status;
    unimplemented!()
}
