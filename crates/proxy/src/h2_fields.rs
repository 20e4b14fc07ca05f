//! HTTP/1 fields and heads into HTTP/2 ones and back, shared by the downstream and upstream HTTP/2 paths: the checked append, trailer lines to a map, the connection-specific names, response heads across protocols; the small answers and origin heads HTTP/2 and HTTP/3 streams send.

use crate::filter::Edits;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use portico_http1::{Framing, Limits, Method, ResponseBuilder, ResponseHead};

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

/// Fields that are connection-specific in HTTP/2 (RFC 9113 8.2.2) or owned by the framing.
pub(crate) const DROPPED: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
    "host",
    "expect",
];

/// The HTTP/2 response for an HTTP/1 response head: hop-by-hop fields dropped (and
/// content-length unless the body is length-delimited), the filters' edits and Via applied.
pub(crate) fn response_from(
    resp: &ResponseHead,
    edits: &Edits<'_>,
    via: bool,
) -> http::Response<()> {
    let mut headers = HeaderMap::new();
    let mut prev_via: Option<&[u8]> = None;
    for (name, value) in resp.fields() {
        if resp.is_hop_by_hop(name) || edits.drops(name) {
            continue;
        }
        if name.eq_ignore_ascii_case("content-length")
            && !matches!(resp.framing, Framing::Length(_) | Framing::None)
        {
            continue;
        }
        if via && name.eq_ignore_ascii_case("via") {
            prev_via = Some(value);
            continue;
        }
        append(&mut headers, name, value);
    }
    let status = http::StatusCode::from_u16(resp.status()).unwrap_or(http::StatusCode::BAD_GATEWAY);
    let via = via.then_some((prev_via, &b"1.1 portico"[..]));
    with_edits(headers, status, via, edits)
}

/// The response with `headers` (the upstream's, already filtered) and `status`, then Via (the
/// upstream's `prev` Via and our `hop` appended) and the fields the filters set or add.
fn with_edits(
    mut headers: HeaderMap,
    status: http::StatusCode,
    via: Option<(Option<&[u8]>, &[u8])>,
    edits: &Edits<'_>,
) -> http::Response<()> {
    if let Some((prev, hop)) = via {
        let mut v = Vec::with_capacity(32);
        if let Some(p) = prev.filter(|p| !p.is_empty()) {
            v.extend_from_slice(p);
            v.extend_from_slice(b", ");
        }
        v.extend_from_slice(hop);
        append(&mut headers, "via", &v);
    }
    for (n, v) in edits.fields() {
        append(&mut headers, n, v);
    }
    let mut r = http::Response::new(());
    *r.status_mut() = status;
    *r.headers_mut() = headers;
    r
}

/// The response for the HTTP/2 client: connection-specific fields dropped, the filters' edits
/// and Via.
pub(crate) fn response_from_h2(
    parts: http::response::Parts,
    edits: &Edits<'_>,
    via: bool,
) -> http::Response<()> {
    let mut headers = parts.headers;
    for d in DROPPED {
        headers.remove(d);
    }
    for n in edits.dropped() {
        headers.remove(n);
    }
    let prev = match via {
        true => headers.remove(http::header::VIA),
        false => None,
    };
    let via = via.then_some((prev.as_ref().map(|p| p.as_bytes()), &b"2 portico"[..]));
    with_edits(headers, parts.status, via, edits)
}

/// The limits of an HTTP/1 head built from an HTTP/2 one: the HTTP/2 header list limit bounded
/// its size already.
pub(crate) fn from_h2_limits() -> Limits {
    Limits {
        max_head_bytes: usize::MAX,
        ..Limits::default()
    }
}

/// An HTTP/2 head's fields into an HTTP/1 one, without the connection-specific ones and `skip`.
/// None when one is not valid HTTP/1.
pub(crate) fn copy_fields(
    b: &mut ResponseBuilder<'_>,
    map: &HeaderMap,
    skip: &[&str],
) -> Option<()> {
    for (n, v) in map {
        let n = n.as_str();
        if !DROPPED.contains(&n) && !skip.contains(&n) {
            b.field(n, v.as_bytes()).ok()?;
        }
    }
    Some(())
}

/// The HTTP/1 head of an HTTP/2 server's response (for an HTTP/1.1 client, so that the HTTP/1
/// path's framing choice and the filters' edits apply): connection-specific fields dropped; `end`: no body
/// follows. None when its fields do not make a valid HTTP/1 head.
pub(crate) fn http1_response(
    parts: &http::response::Parts,
    method: &Method,
    end: bool,
) -> Option<ResponseHead> {
    let status = parts.status.as_u16();
    let limits = from_h2_limits();
    let mut b = ResponseBuilder::new(status, method, &limits).ok()?;
    copy_fields(&mut b, &parts.headers, &[])?;
    // No length is invented for responses that have no body by definition (RFC 9110 6.4.1,
    // 8.6): a HEAD response's length describes the resource, 1xx/204/304 carry none.
    let bodiless = *method == Method::Head || status < 200 || status == 204 || status == 304;
    if !bodiless && !parts.headers.contains_key(http::header::CONTENT_LENGTH) {
        match end {
            true => b.field("content-length", b"0").ok()?,
            false => b.field("transfer-encoding", b"chunked").ok()?,
        }
    }
    b.finish().ok()
}

/// A small complete response generated here, as HTTP/2 and HTTP/3 streams send it: the
/// status, `Server`, `Date`, the `extra` fields, `Retry-After` on a 503 and the body's type
/// and length (none on 204 and 304).
pub(crate) fn simple_response(
    status: u16,
    content_type: &str,
    body_len: usize,
    extra: &[(&str, &str)],
) -> Result<http::Response<()>, crate::error::ProxyError> {
    let mut b = http::Response::builder()
        .status(status)
        .header("server", "portico");
    for (n, v) in extra {
        b = b.header(*n, *v);
    }
    if status == 503 {
        b = b.header("retry-after", "1");
    }
    if !(status == 204 || status == 304) {
        b = b
            .header("content-type", content_type)
            .header("content-length", body_len);
    }
    b = crate::date::with_date(|d| b.header("date", d));
    b.body(())
        .map_err(|e| crate::error::ProxyError::ClientIo(std::io::Error::other(e)))
}

/// The origin action's answer as a response head of fields (no HTTP/1 head in between; the
/// request id field `id` added) and the reply whose body follows it.
pub(crate) fn origin_response(
    head: &portico_http1::RequestHead,
    origin: &portico_origin::Origin,
    id: Option<(&str, &str)>,
) -> (http::Response<()>, portico_origin::Reply) {
    let mut headers = HeaderMap::new();
    let reply = origin.respond_fields(head, |n, v| {
        if !DROPPED.iter().any(|d| d.eq_ignore_ascii_case(n)) {
            append(&mut headers, n, v);
        }
    });
    if let Some((n, v)) = id {
        append(&mut headers, n, v.as_bytes());
    }
    let mut response = http::Response::new(());
    *response.status_mut() =
        http::StatusCode::from_u16(reply.status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    *response.headers_mut() = headers;
    (response, reply)
}

/// The next chunk (at most `conn::MAX_CHUNK` bytes) of an origin file's range: `at` is the
/// offset to seek to before the first read (taken then), `left` what remains of the range.
pub(crate) fn file_chunk(
    file: &mut std::fs::File,
    at: &mut Option<u64>,
    left: &mut u64,
) -> Result<bytes::Bytes, crate::error::ProxyError> {
    use crate::error::ProxyError;
    use std::io::{Read, Seek, SeekFrom};
    if let Some(offset) = at.take() {
        file.seek(SeekFrom::Start(offset))
            .map_err(ProxyError::ClientIo)?;
    }
    let want = (*left).min(crate::conn::MAX_CHUNK as u64) as usize;
    let mut buf = vec![0u8; want];
    let n = file.read(&mut buf).map_err(ProxyError::ClientIo)?;
    if n == 0 {
        return Err(ProxyError::ClientIo(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "file shrank while serving",
        )));
    }
    buf.truncate(n);
    *left -= n as u64;
    Ok(bytes::Bytes::from(buf))
}

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
