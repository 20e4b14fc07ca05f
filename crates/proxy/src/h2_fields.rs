//! HTTP/1 fields into HTTP/2 field maps, shared by the downstream and upstream HTTP/2 paths: the checked append, trailer lines to a map, the connection-specific names.

use http::header::{HeaderMap, HeaderName, HeaderValue};

/// Append a field if its name and value are valid in HTTP/2 (names are lowercased).
pub(crate) fn append(map: &mut HeaderMap, name: &str, value: &[u8]) {
    if let (Ok(n), Ok(v)) = (
        HeaderName::from_bytes(name.as_bytes()),
        HeaderValue::from_bytes(value),
    ) {
        map.append(n, v);
    }
}

/// Raw HTTP/1 trailer lines (`name: value\r\n`) -> a field map, without the names
/// [`crate::headers::trailer_dropped`] names.
pub(crate) fn trailer_map(raw: &[u8]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for line in raw.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let Ok(name) = std::str::from_utf8(&line[..colon]) else {
            continue;
        };
        if crate::headers::trailer_dropped(name) {
            continue;
        }
        append(&mut map, name, line[colon + 1..].trim_ascii());
    }
    map
}

/// Fields HTTP/2 forbids (RFC 9113 8.2.2) whether or not `Connection` lists them.
pub(crate) const CONNECTION_SPECIFIC: [&str; 6] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
];

#[cfg(test)]
mod tests {
    use super::trailer_map;

    #[test]
    fn chunked_trailers_become_http2_trailers() {
        let t = trailer_map(b"grpc-status: 0\r\nGrpc-Message: ok \r\nTE: x\r\n");
        assert_eq!(t.get("grpc-status").unwrap(), "0");
        assert_eq!(t.get("grpc-message").unwrap(), "ok");
        assert!(t.get("te").is_none());
        assert!(trailer_map(b"").is_empty());
    }

    #[test]
    fn raw_trailers_to_fields() {
        let m = trailer_map(b"grpc-status: 0\r\ngrpc-message: ok\r\nconnection: x\r\n");
        assert_eq!(m["grpc-status"], "0");
        assert_eq!(m["grpc-message"], "ok");
        assert!(!m.contains_key("connection"));
    }
}
