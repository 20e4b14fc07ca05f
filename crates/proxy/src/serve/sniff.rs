//! The protocol of a plain connection from its first bytes: HTTP/2 with prior knowledge (its preface) or HTTP/1.x.

/// The HTTP/2 client connection preface (RFC 9113 3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What a plain connection's first bytes say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sniffed {
    Http2,
    Http1,
    /// Neither an HTTP/1.x request line nor the HTTP/2 preface.
    Neither,
}

/// Classify the first bytes of a plain connection; `None`: more bytes are needed.
pub fn classify(buf: &[u8]) -> Option<Sniffed> {
    let n = buf.len().min(PREFACE.len());
    if buf[..n] == PREFACE[..n] {
        return (buf.len() >= PREFACE.len()).then_some(Sniffed::Http2);
    }
    // Empty lines before a request are allowed (RFC 9112 2.2).
    let start = buf
        .iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(buf.len());
    let rest = &buf[start..];
    // The usual case, decided from the first bytes: a standard method and a space.
    const METHODS: [&[u8]; 8] = [
        b"GET ",
        b"POST ",
        b"HEAD ",
        b"PUT ",
        b"DELETE ",
        b"OPTIONS ",
        b"PATCH ",
        b"TRACE ",
    ];
    if METHODS.iter().any(|m| rest.starts_with(m)) {
        return Some(Sniffed::Http1);
    }
    match rest.iter().position(|&b| b == b'\n') {
        Some(nl) => {
            let line = rest[..nl].strip_suffix(b"\r").unwrap_or(&rest[..nl]);
            if line.ends_with(b" HTTP/1.1") || line.ends_with(b" HTTP/1.0") {
                Some(Sniffed::Http1)
            } else {
                Some(Sniffed::Neither)
            }
        }
        // A long line without an end: the HTTP/1 codec answers it (414).
        None if buf.len() >= SNIFF_MAX => Some(Sniffed::Http1),
        None => None,
    }
}

/// Bytes read at most before deciding.
const SNIFF_MAX: usize = 8 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preface_is_http2_once_complete() {
        assert_eq!(classify(PREFACE), Some(Sniffed::Http2));
        assert_eq!(classify(&PREFACE[..10]), None);
        assert_eq!(
            classify(b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n"),
            Some(Sniffed::Neither)
        );
    }

    #[test]
    fn request_lines_are_http1_and_garbage_is_neither() {
        assert_eq!(
            classify(b"GET / HTTP/1.1\r\nHost: a\r\n"),
            Some(Sniffed::Http1)
        );
        assert_eq!(classify(b"\r\nGET / HTTP/1.0\n"), Some(Sniffed::Http1));
        assert_eq!(classify(b"GET / HTT"), Some(Sniffed::Http1));
        assert_eq!(classify(b"GE"), None);
        assert_eq!(classify(b"BREW / HTT"), None);
        assert_eq!(classify(b"BREW / HTTP/1.1\r\n"), Some(Sniffed::Http1));
        assert_eq!(
            classify(b"INVALID CONNECTION PREFACE\r\n\r\n"),
            Some(Sniffed::Neither)
        );
        assert_eq!(classify(&vec![b'a'; SNIFF_MAX]), Some(Sniffed::Http1));
    }
}
