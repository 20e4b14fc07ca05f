//! WebSocket handshakes across protocols (sans-io): which HTTP/1.1 requests can become an extended CONNECT, a fresh key, the accept hash, the checks of a server's 101, and the 101 an HTTP/1.1 client gets for an HTTP/2 server's 2xx.

use crate::error::ProxyError;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use portico_http1::{Method, RequestHead, ResponseBuilder, ResponseHead};

/// Whether an HTTP/1.1 request is a WebSocket opening handshake that can become an extended
/// CONNECT: a `GET` without a body (RFC 6455 4.1) upgrading to `websocket` (the only token
/// RFC 8441 defines), with the key its `101` must answer.
pub(crate) fn is_websocket(head: &RequestHead) -> bool {
    head.upgrade
        && *head.method() == Method::Get
        && !head.has_body()
        && head
            .field("upgrade")
            .is_some_and(|u| u.trim_ascii().eq_ignore_ascii_case(b"websocket"))
        && head.field("sec-websocket-key").is_some()
}

/// Whether an upstream answer may go to an HTTP/2 client: a 101 only for an upgrade (an
/// extended CONNECT; then it opens the tunnel) and only when it completes the handshake
/// ([`check_switch`]); for an upgrade no 2xx either, which would tell the client a tunnel is
/// open when none is. Anything else is relayed as a normal response.
pub(crate) fn check_answer(head: &RequestHead, resp: &ResponseHead) -> Result<(), ProxyError> {
    match (head.upgrade, resp.status()) {
        (true, 101) => check_switch(head, resp),
        (true, 200..=299) => Err(ProxyError::NotSwitched(
            "the upstream answered the upgrade with 2xx",
        )),
        (false, 101) => Err(ProxyError::UnexpectedUpgrade),
        _ => Ok(()),
    }
}

/// Whether an upstream's 101 completes the WebSocket handshake of `head` (RFC 6455 4.1: the
/// client fails the connection unless `Upgrade` is websocket and `Sec-WebSocket-Accept` is the
/// hash of its key).
fn check_switch(head: &RequestHead, resp: &ResponseHead) -> Result<(), ProxyError> {
    let upgrade = resp.field("upgrade").unwrap_or_default();
    if !upgrade.eq_ignore_ascii_case(b"websocket") {
        return Err(ProxyError::NotSwitched("101 without Upgrade: websocket"));
    }
    let key = head.field("sec-websocket-key").unwrap_or_default();
    if resp.field("sec-websocket-accept") != Some(websocket_accept(key).as_bytes()) {
        return Err(ProxyError::NotSwitched(
            "Sec-WebSocket-Accept does not match the key",
        ));
    }
    Ok(())
}

/// The `101` for an HTTP/1.1 client whose WebSocket the server accepted with a 2xx:
/// `Upgrade: websocket`, the `Sec-WebSocket-Accept` of the client's key (HTTP/2 has none) and
/// the 2xx's end-to-end fields (`sec-websocket-protocol`, `-extensions`, ...). None when those
/// fields do not make a valid HTTP/1.1 head.
pub(crate) fn switch_head(
    head: &RequestHead,
    parts: &http::response::Parts,
) -> Option<ResponseHead> {
    let key = head.field("sec-websocket-key").unwrap_or_default();
    let limits = crate::h2_fields::from_h2_limits();
    let mut b = ResponseBuilder::new(101, &Method::Get, &limits).ok()?;
    b.field("Upgrade", b"websocket").ok()?;
    b.field("Connection", b"upgrade").ok()?;
    let accept = websocket_accept(key);
    b.field("Sec-WebSocket-Accept", accept.as_bytes()).ok()?;
    let skip = ["content-length", "sec-websocket-accept"];
    crate::h2_fields::copy_fields(&mut b, &parts.headers, &skip)?;
    b.finish().ok()
}

/// A fresh `Sec-WebSocket-Key`: 16 random bytes, base64 (RFC 6455 4.1: a nonce "randomly
/// selected", so no party can predict it), from aws-lc-rs's CSPRNG (already built for rustls).
pub(crate) fn new_key() -> String {
    let mut nonce = [0u8; 16];
    if aws_lc_rs::rand::fill(&mut nonce).is_err() {
        // Not expected (AWS-LC's RAND_bytes aborts rather than fail): a handshake still goes.
        nonce.iter_mut().for_each(|b| *b = fastrand::u8(..));
    }
    STANDARD.encode(nonce)
}

/// `Sec-WebSocket-Accept` for a key: base64(SHA-1(key + the RFC 6455 GUID)).
pub fn websocket_accept(key: &[u8]) -> String {
    const GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
    let mut input = Vec::with_capacity(key.len() + GUID.len());
    input.extend_from_slice(key);
    input.extend_from_slice(GUID);
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, &input);
    STANDARD.encode(digest.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_is_the_rfc_6455_example_and_keys_are_fresh() {
        // RFC 6455 1.3.
        assert_eq!(
            websocket_accept(b"dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
        let (a, b) = (new_key(), new_key());
        assert_eq!(a.len(), 24);
        assert!(a.ends_with("=="));
        assert_ne!(a, b);
    }

    fn head(raw: impl AsRef<[u8]>) -> RequestHead {
        let mut b = bytes::BytesMut::from(raw.as_ref());
        portico_http1::parse_request(&mut b, &portico_http1::Limits::default())
            .unwrap()
            .unwrap()
    }

    fn resp(raw: &[u8]) -> ResponseHead {
        let mut b = bytes::BytesMut::from(raw);
        let m = portico_http1::Method::Get;
        portico_http1::parse_response(&mut b, &m, &portico_http1::Limits::default())
            .unwrap()
            .unwrap()
    }

    #[test]
    fn a_101_must_prove_it_read_the_key() {
        let h = head(b"GET /ws HTTP/1.1\r\nhost: a\r\nconnection: upgrade\r\nupgrade: websocket\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n");
        let ok = resp(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: WebSocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n");
        assert!(check_switch(&h, &ok).is_ok());
        let wrong = resp(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: AAAA\r\n\r\n");
        assert!(check_switch(&h, &wrong).is_err());
        let missing = resp(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n");
        assert!(check_switch(&h, &missing).is_err());
        let other = resp(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n");
        let e = check_switch(&h, &other).unwrap_err();
        assert_eq!(e.status(), 502);
        // Which answers may reach the client at all.
        assert!(check_answer(&h, &ok).is_ok());
        let got = |raw: &[u8]| resp(raw);
        assert!(check_answer(&h, &got(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")).is_err());
        assert!(check_answer(
            &h,
            &got(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n")
        )
        .is_ok());
        let plain = head(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n");
        assert!(
            check_answer(&plain, &ok).is_err(),
            "101 without an upgrade request"
        );
        assert!(check_answer(
            &plain,
            &got(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        )
        .is_ok());
    }

    #[test]
    fn only_a_bodiless_get_upgrading_to_websocket_with_a_key_is_one() {
        let ws = "Host: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: k\r\n";
        assert!(is_websocket(&head(format!("GET / HTTP/1.1\r\n{ws}\r\n"))));
        assert!(is_websocket(&head(format!(
            "GET / HTTP/1.1\r\n{}\r\n",
            ws.replace("websocket", "WebSocket")
        ))));
        let post = format!("POST / HTTP/1.1\r\n{ws}Content-Length: 2\r\n\r\nhi");
        assert!(!is_websocket(&head(&post)), "a POST");
        let body = format!("GET / HTTP/1.1\r\n{ws}Content-Length: 2\r\n\r\nhi");
        assert!(!is_websocket(&head(&body)), "a GET with a body");
        let other = format!("GET / HTTP/1.1\r\n{}\r\n", ws.replace("websocket", "foo"));
        assert!(!is_websocket(&head(&other)), "another protocol");
        let keyless = format!(
            "GET / HTTP/1.1\r\n{}\r\n",
            ws.replace("Sec-WebSocket-Key: k\r\n", "")
        );
        assert!(!is_websocket(&head(&keyless)), "no key");
        let plain =
            "GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nSec-WebSocket-Key: k\r\n\r\n";
        assert!(
            !is_websocket(&head(plain)),
            "Upgrade without Connection: upgrade"
        );
    }
}
