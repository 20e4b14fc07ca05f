//! Building the forwarded request head and the returned response head (hop-by-hop removal, X-Forwarded-*, the filters' edits).

use crate::filter::Edits;
use bytes::BytesMut;
use portico_config::ProxyAction;
use portico_http1::{encode, FieldLine, Framing, RequestHead, ResponseHead, Version};

/// What the forwarded head needs beyond the request: the client and the Host to send.
pub struct Forwarding<'a> {
    /// The client (`X-Real-IP`), and the socket's peer (the hop added to `X-Forwarded-For`):
    /// they differ behind a trusted proxy.
    pub client_ip: &'a str,
    pub peer_ip: &'a str,
    pub proto: &'a str,
    /// Host sent when the client's is not kept (the server address), or the authority of an
    /// absolute-form target when `absolute`.
    pub authority: &'a str,
    /// `authority` came from an absolute-form target and overrides the client's Host field.
    pub absolute: bool,
    /// The verified client certificate's subject, sent as [`CLIENT_CERT_SUBJECT`].
    pub client_cert_subject: Option<&'a str>,
}

/// The header carrying the verified mTLS client certificate's subject (RFC 4514) upstream. A
/// copy sent by the client is always removed, so upstreams can trust it.
pub const CLIENT_CERT_SUBJECT: &str = "X-Client-Cert-Subject";

/// Fields a trailer section never carries onward, in either direction: those RFC 9110 6.5.1
/// does not allow in trailers (framing, routing, request modifiers, authentication, response
/// control data, content metadata), the hop-by-hop ones, and the identity fields Portico sets
/// on forwarded requests (a backend that merges trailers into its headers must not see a
/// client's `X-Forwarded-For` as Portico's).
const NOT_IN_TRAILERS: [&str; 42] = [
    // framing and hop-by-hop
    "content-length",
    "transfer-encoding",
    "trailer",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "upgrade",
    // routing and request modifiers
    "host",
    "expect",
    "max-forwards",
    "cache-control",
    "pragma",
    "range",
    "if-match",
    "if-none-match",
    "if-modified-since",
    "if-unmodified-since",
    "if-range",
    // authentication and state
    "authorization",
    "proxy-authorization",
    "www-authenticate",
    "proxy-authenticate",
    "cookie",
    "set-cookie",
    // response control data
    "age",
    "date",
    "expires",
    "location",
    "retry-after",
    "vary",
    "warning",
    // content metadata
    "content-encoding",
    "content-type",
    "content-range",
    // set by Portico
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "x-real-ip",
    "forwarded",
    "via",
    "x-client-cert-subject",
];

/// True when a trailer field named `name` is dropped rather than forwarded.
pub fn trailer_dropped(name: &str) -> bool {
    NOT_IN_TRAILERS.iter().any(|d| d.eq_ignore_ascii_case(name))
}

/// Raw HTTP/1 trailer lines (`name: value\r\n`, as the chunked decoder returns them) without
/// the fields [`trailer_dropped`] names; the same bytes when none is there.
pub fn trailer_lines(raw: &bytes::Bytes) -> bytes::Bytes {
    let dropped = |line: &[u8]| {
        let name = line.split(|&b| b == b':').next().unwrap_or_default();
        std::str::from_utf8(name).is_ok_and(trailer_dropped)
    };
    let lines = || raw.split_inclusive(|&b| b == b'\n');
    if !lines().any(dropped) {
        return raw.clone();
    }
    let mut out = BytesMut::with_capacity(raw.len());
    for line in lines().filter(|l| !dropped(l)) {
        out.extend_from_slice(line);
    }
    out.freeze()
}

/// Trailers as HTTP/1 trailer lines (`name: value\r\n`) into `out`. The map is one
/// [`trailer_fields`] or `h2_fields::trailer_map` made: the fields [`trailer_dropped`] names are
/// gone from it already.
pub fn encode_trailers(out: &mut BytesMut, map: &http::HeaderMap) {
    for (n, v) in map {
        encode::field(out, n.as_str(), v.as_bytes());
    }
}

/// HTTP/2 trailers without the fields [`trailer_dropped`] names.
pub fn trailer_fields(mut map: http::HeaderMap) -> http::HeaderMap {
    let names: Vec<http::HeaderName> = map
        .keys()
        .filter(|n| trailer_dropped(n.as_str()))
        .cloned()
        .collect();
    for n in names {
        map.remove(&n);
    }
    map
}

/// Where a forwarded request head is written, in the upstream's protocol: HTTP/1.1 bytes
/// (`BytesMut`), or an HTTP/2 request (`flow::exchange_h2`). The forwarding rules are written
/// once, in [`upstream_request`].
pub(crate) trait HeadOut {
    fn request_line(&mut self, method: &str, target: &str);
    /// One field whose value is `parts` one after the other.
    fn field(&mut self, name: &str, parts: &[&[u8]]);
    /// One field as received (an HTTP/1 head may copy its line whole).
    fn field_line(&mut self, f: &FieldLine<'_>) {
        self.field(f.name, &[f.value]);
    }
    fn content_length(&mut self, n: u64);
    fn end(&mut self);
}

impl HeadOut for BytesMut {
    fn request_line(&mut self, method: &str, target: &str) {
        encode::request_line(self, method, target);
    }

    fn field(&mut self, name: &str, parts: &[&[u8]]) {
        match parts {
            [one] => encode::field(self, name, one),
            _ => {
                self.extend_from_slice(name.as_bytes());
                self.extend_from_slice(b": ");
                for p in parts {
                    self.extend_from_slice(p);
                }
                self.extend_from_slice(b"\r\n");
            }
        }
    }

    fn field_line(&mut self, f: &FieldLine<'_>) {
        match f.line() {
            Some(line) => self.extend_from_slice(line),
            None => encode::field(self, f.name, f.value),
        }
    }

    fn content_length(&mut self, n: u64) {
        encode::content_length(self, n);
    }

    fn end(&mut self) {
        encode::end_head(self);
    }
}

/// Whether the client's `TE` field asks for trailers.
pub(crate) fn wants_trailers(head: &RequestHead) -> bool {
    head.field("te").is_some_and(|v| {
        v.split(|&b| b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"trailers"))
    })
}

/// Append the fields the filters set or add.
#[inline]
fn write_edits(out: &mut impl HeadOut, edits: &Edits<'_>) {
    if edits.has_fields() {
        write_edit_fields(out, edits);
    }
}

#[inline(never)]
fn write_edit_fields(out: &mut impl HeadOut, edits: &Edits<'_>) {
    for (n, v) in edits.fields() {
        out.field(n, &[v]);
    }
}

/// Write the request head sent upstream: request line with `target`, end-to-end fields minus the
/// ones Portico owns and those the filters drop, then Host, X-Forwarded-*, Via, the filters'
/// fields, exactly one framing field, upgrade.
#[inline(always)]
pub(crate) fn upstream_request(
    out: &mut impl HeadOut,
    head: &RequestHead,
    target: &str,
    action: &ProxyAction,
    edits: &Edits<'_>,
    fwd: &Forwarding<'_>,
) {
    out.request_line(head.method().as_str(), target);
    let mut xff: Option<&[u8]> = None;
    let mut via: Option<&[u8]> = None;
    let mut host_value: Option<&[u8]> = None;
    for f in head.field_lines() {
        let (name, value) = (f.name, f.value);
        // Host first: a `Connection: host` must not make the upstream lose it.
        if name.eq_ignore_ascii_case("host") {
            host_value = Some(value);
            continue;
        }
        if head.is_hop_by_hop(name) || name.eq_ignore_ascii_case(CLIENT_CERT_SUBJECT) {
            continue;
        }
        if name.eq_ignore_ascii_case("content-length")
            || name.eq_ignore_ascii_case("transfer-encoding")
            || name.eq_ignore_ascii_case("expect")
        {
            continue;
        }
        if edits.drops(name) {
            continue;
        }
        if action.forwarded_headers {
            if name.eq_ignore_ascii_case("x-forwarded-for") {
                // Several fields are one list; keep the first and append ours (rare case folded).
                if xff.is_none() {
                    xff = Some(value);
                }
                continue;
            }
            if name.eq_ignore_ascii_case("x-forwarded-proto")
                || name.eq_ignore_ascii_case("x-forwarded-host")
                || name.eq_ignore_ascii_case("x-real-ip")
            {
                continue;
            }
        }
        if action.via && name.eq_ignore_ascii_case("via") {
            via = Some(value);
            continue;
        }
        out.field_line(&f);
    }
    if fwd.absolute {
        host_value = Some(fwd.authority.as_bytes());
    }
    if !edits.sets("host") {
        match (action.preserve_host, host_value) {
            (true, Some(h)) => out.field("Host", &[h]),
            _ => out.field("Host", &[fwd.authority.as_bytes()]),
        }
    }
    if action.forwarded_headers {
        match xff {
            Some(prev) if !prev.is_empty() => {
                let ip = fwd.peer_ip.as_bytes();
                out.field("X-Forwarded-For", &[prev, b", ", ip]);
            }
            _ => out.field("X-Forwarded-For", &[fwd.peer_ip.as_bytes()]),
        }
        out.field("X-Forwarded-Proto", &[fwd.proto.as_bytes()]);
        if let Some(h) = host_value {
            out.field("X-Forwarded-Host", &[h]);
        }
        out.field("X-Real-IP", &[fwd.client_ip.as_bytes()]);
    }
    if let Some(subject) = fwd.client_cert_subject {
        out.field(CLIENT_CERT_SUBJECT, &[subject.as_bytes()]);
    }
    if action.via {
        write_via(out, via, head.version());
    }
    write_edits(out, edits);
    match head.framing {
        Framing::Length(n) => out.content_length(n),
        Framing::Chunked => out.field("Transfer-Encoding", &[b"chunked"]),
        Framing::None | Framing::Close => {}
    }
    if head.upgrade {
        if let Some(up) = head.field("upgrade") {
            out.field("Connection", &[b"upgrade"]);
            out.field("Upgrade", &[up]);
        }
    }
    out.end();
}

fn write_via(out: &mut impl HeadOut, prev: Option<&[u8]>, version: Version) {
    let ours: &[u8] = match version {
        Version::Http10 => b"1.0 portico",
        Version::Http11 => b"1.1 portico",
    };
    match prev.filter(|p| !p.is_empty()) {
        Some(p) => out.field("Via", &[p, b", ", ours]),
        None => out.field("Via", &[ours]),
    }
}

/// How the response body is framed towards the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientFraming {
    /// No body (HEAD, 1xx, 204, 304): framing fields copied as the upstream sent them.
    None,
    Length(u64),
    Chunked,
    /// Close-delimited (HTTP/1.0 clients when the length is unknown).
    Close,
}

/// Choose the downstream framing for a response of upstream framing `f` to a client speaking `v`.
pub fn client_framing(f: Framing, v: Version) -> ClientFraming {
    match (f, v) {
        (Framing::None, _) => ClientFraming::None,
        (Framing::Length(n), _) => ClientFraming::Length(n),
        (Framing::Chunked | Framing::Close, Version::Http11) => ClientFraming::Chunked,
        (Framing::Chunked | Framing::Close, Version::Http10) => ClientFraming::Close,
    }
}

/// Write the response head sent to the client. `keep_alive` is the decision for the client
/// connection (false adds `Connection: close`).
pub(crate) fn client_response(
    out: &mut BytesMut,
    resp: &ResponseHead,
    framing: ClientFraming,
    edits: &Edits<'_>,
    via: bool,
    client_version: Version,
    keep_alive: bool,
) {
    encode::status_line(out, resp.status(), resp.reason());
    let mut prev_via: Option<&[u8]> = None;
    for f in resp.field_lines() {
        let (name, value) = (f.name, f.value);
        if resp.is_hop_by_hop(name) {
            // Transfer-Encoding on a body-less response (HEAD) is kept as sent.
            if !(framing == ClientFraming::None && name.eq_ignore_ascii_case("transfer-encoding")) {
                continue;
            }
        }
        if framing != ClientFraming::None && name.eq_ignore_ascii_case("content-length") {
            continue;
        }
        if edits.drops(name) {
            continue;
        }
        if via && name.eq_ignore_ascii_case("via") {
            prev_via = Some(value);
            continue;
        }
        match f.line() {
            Some(line) => out.extend_from_slice(line),
            None => encode::field(out, name, value),
        }
    }
    if via {
        write_via(out, prev_via, resp.version());
    }
    write_edits(out, edits);
    match framing {
        ClientFraming::Length(n) => encode::content_length(out, n),
        ClientFraming::Chunked => match resp.field("transfer-encoding") {
            // Other codings (e.g. `gzip, chunked`) stay in the payload: keep naming them.
            Some(te) if !te.trim_ascii().eq_ignore_ascii_case(b"chunked") => {
                out.extend_from_slice(b"Transfer-Encoding: ");
                out.extend_from_slice(te.trim_ascii());
                if !ends_with_chunked(te) {
                    out.extend_from_slice(b", chunked");
                }
                out.extend_from_slice(b"\r\n");
            }
            _ => encode::field(out, "Transfer-Encoding", b"chunked"),
        },
        ClientFraming::None | ClientFraming::Close => {}
    }
    if resp.status() == 101 {
        encode::field(out, "Connection", b"upgrade");
        if let Some(up) = resp.field("upgrade") {
            encode::field(out, "Upgrade", up);
        }
    } else if !keep_alive || framing == ClientFraming::Close {
        encode::field(out, "Connection", b"close");
    } else if client_version == Version::Http10 {
        encode::field(out, "Connection", b"keep-alive");
    }
    encode::end_head(out);
}

/// Whether a Transfer-Encoding value's final coding is `chunked`.
fn ends_with_chunked(te: &[u8]) -> bool {
    te.rsplit(|&b| b == b',')
        .next()
        .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"))
}

#[cfg(test)]
mod tests {
    use super::{trailer_dropped, trailer_fields, trailer_lines};
    use bytes::Bytes;

    #[test]
    fn trailer_lines_keep_allowed_fields_and_share_bytes_when_all_are() {
        let clean = Bytes::from_static(b"grpc-status: 0\r\nX-Checksum: abc\r\n");
        let kept = trailer_lines(&clean);
        assert_eq!(kept, clean);
        assert_eq!(
            kept.as_ptr(),
            clean.as_ptr(),
            "no copy when nothing is dropped"
        );
        let spoofed = Bytes::from_static(
            b"X-Forwarded-For: 6.6.6.6\r\nhost: evil\r\nX-Checksum: abc\r\nCONTENT-LENGTH: 9\r\nConnection: close\r\nset-cookie: a=1\r\nx-real-ip: 1\r\ngrpc-status: 0\r\n",
        );
        assert_eq!(
            trailer_lines(&spoofed),
            Bytes::from_static(b"X-Checksum: abc\r\ngrpc-status: 0\r\n")
        );
        assert!(trailer_lines(&Bytes::new()).is_empty());
    }

    #[test]
    fn trailer_fields_drop_the_same_names() {
        let mut map = http::HeaderMap::new();
        for (n, v) in [
            ("x-forwarded-proto", "https"),
            ("authorization", "x"),
            ("grpc-message", "ok"),
            ("via", "1.1 evil"),
        ] {
            map.append(n, v.parse().unwrap());
        }
        let kept = trailer_fields(map);
        let names: Vec<&str> = kept.keys().map(|n| n.as_str()).collect();
        assert_eq!(names, ["grpc-message"]);
        assert!(trailer_dropped("X-Client-Cert-Subject"));
        assert!(!trailer_dropped("grpc-status"));
    }
}
