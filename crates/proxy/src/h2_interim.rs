//! Interim (1xx) responses passed on across protocols: those of HTTP/1.1 upstreams to HTTP/2 clients as informational HEADERS, those of HTTP/2 upstreams to HTTP/2 clients and (as raw heads) to HTTP/1.1 clients (103 Early Hints and the like).

use crate::h2_fields::{append, CONNECTION_SPECIFIC};
use bytes::{Bytes, BytesMut};
use h2::server::SendResponse;
use portico_http1::{encode, parse_response, Limits, Method};

/// Send an interim head (a raw HTTP/1.1 1xx head as read, never 101, by
/// `flow::exchange_h1::read_response_head`) to the HTTP/2 client as an informational response: a
/// HEADERS frame without END_STREAM before the final one (RFC 9113 8.1). Connection-specific
/// fields are dropped (RFC 9113 8.2.2), other fields pass as they came, as they do to HTTP/1.1
/// clients. A head that does not parse again or a client that is gone is skipped: the stream's
/// reset watch or the final response reports the client.
pub(crate) fn forward(respond: &mut SendResponse<Bytes>, raw: &[u8]) {
    if let Some(resp) = informational(raw) {
        let _ = respond.send_informational(resp);
    }
}

/// Send one interim response of an HTTP/2 upstream to the HTTP/2 client, as `forward` does
/// for raw heads: connection-specific fields dropped, 101 skipped, a client that is gone
/// ignored (the stream's reset watch or the final response reports it).
pub(crate) fn forward_h2(respond: &mut SendResponse<Bytes>, mut resp: http::Response<()>) {
    if !qualifies(resp.status()) {
        return;
    }
    let headers = resp.headers_mut();
    for name in CONNECTION_SPECIFIC {
        headers.remove(name);
    }
    let _ = respond.send_informational(resp);
}

/// Append an interim response of an HTTP/2 upstream to `out` as a raw HTTP/1.1 head (for
/// HTTP/1.1 clients); nothing for a status that is not a forwardable 1xx.
pub(crate) fn http1_head(out: &mut BytesMut, resp: &http::Response<()>) {
    if !qualifies(resp.status()) {
        return;
    }
    encode::status_line(out, resp.status().as_u16(), "");
    for (name, value) in resp.headers() {
        if !connection_specific(name.as_str()) {
            encode::field(out, name.as_str(), value.as_bytes());
        }
    }
    encode::end_head(out);
}

/// An interim status that is passed on (101 is never one: it is not interim in this sense).
fn qualifies(status: http::StatusCode) -> bool {
    status.is_informational() && status != http::StatusCode::SWITCHING_PROTOCOLS
}

/// The informational response for one raw 1xx head; None when it is not one.
fn informational(raw: &[u8]) -> Option<http::Response<()>> {
    let mut buf = BytesMut::from(raw);
    let limits = Limits {
        max_head_bytes: raw.len() + 1,
        ..Limits::default()
    };
    let head = parse_response(&mut buf, &Method::Get, &limits).ok()??;
    let status = head.status();
    if !(100..200).contains(&status) || status == 101 {
        return None;
    }
    let mut resp = http::Response::new(());
    *resp.status_mut() = http::StatusCode::from_u16(status).ok()?;
    let headers = resp.headers_mut();
    for (name, value) in head.fields() {
        if head.is_hop_by_hop(name) || connection_specific(name) {
            continue;
        }
        append(headers, name, value);
    }
    Some(resp)
}

/// Fields HTTP/2 forbids (RFC 9113 8.2.2) whether or not `Connection` lists them.
fn connection_specific(name: &str) -> bool {
    CONNECTION_SPECIFIC
        .iter()
        .any(|n| n.eq_ignore_ascii_case(name))
}

#[cfg(test)]
mod tests {
    use super::{http1_head, informational};
    use bytes::BytesMut;

    #[test]
    fn early_hints_keep_their_fields_and_lose_connection_ones() {
        let raw = b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\nLink: </b.js>; rel=preload\r\nConnection: keep-alive, x-hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\n\r\n";
        let r = informational(raw).unwrap();
        assert_eq!(r.status(), 103);
        let links: Vec<_> = r.headers().get_all("link").iter().collect();
        assert_eq!(links, ["</a.css>; rel=preload", "</b.js>; rel=preload"]);
        for gone in ["connection", "x-hop", "keep-alive"] {
            assert!(!r.headers().contains_key(gone), "{gone}");
        }
    }

    #[test]
    fn http2_interim_responses_become_raw_http1_heads() {
        let mut out = BytesMut::new();
        let mut hints = http::Response::new(());
        *hints.status_mut() = http::StatusCode::EARLY_HINTS;
        let h = hints.headers_mut();
        h.append("link", "</a.css>; rel=preload".parse().unwrap());
        h.append("link", "</b.js>; rel=preload".parse().unwrap());
        h.append("keep-alive", "timeout=5".parse().unwrap());
        http1_head(&mut out, &hints);
        let mut switching = http::Response::new(());
        *switching.status_mut() = http::StatusCode::SWITCHING_PROTOCOLS;
        http1_head(&mut out, &switching);
        assert_eq!(
            &out[..],
            b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\nlink: </b.js>; rel=preload\r\n\r\n"
        );
    }

    #[test]
    fn only_interim_heads_qualify() {
        assert!(informational(b"HTTP/1.1 100 Continue\r\n\r\n").is_some());
        assert!(informational(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").is_none());
        assert!(informational(b"HTTP/1.1 101 Switching Protocols\r\n\r\n").is_none());
        assert!(informational(b"garbage").is_none());
    }
}
