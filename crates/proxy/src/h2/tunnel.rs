//! WebSockets over HTTP/2 (RFC 8441 extended CONNECT) as an HTTP/1.1 upgrade upstream: the handshake key and its check, then the stream's DATA relayed to and from the upstream socket (`tunnel::relay`).

use super::request::{extended_to_http1, Reject};
use crate::error::ProxyError;
use crate::h2_io::{client_err, Peer};
use crate::pool::UpConn;
use crate::stats::Outcome;
use crate::stats::{Phase, Termination};
use crate::tunnel::{self, Progress, SocketIn, SocketOut, StreamIn, StreamOut};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use portico_http1::{Limits, RequestHead, ResponseHead};
use std::net::SocketAddr;
use std::time::Duration;

/// The `:protocol` of an extended CONNECT (the h2 crate hands it over as an extension, only
/// when the connection advertised SETTINGS_ENABLE_CONNECT_PROTOCOL).
pub(super) fn protocol(parts: &http::request::Parts) -> Option<&str> {
    parts
        .extensions
        .get::<h2::ext::Protocol>()
        .map(|p| p.as_str())
}

/// An extended CONNECT as the HTTP/1.1 upgrade request for the upstream, with a fresh
/// `Sec-WebSocket-Key` (`request::extended_to_http1`).
pub(super) fn translate(
    parts: &http::request::Parts,
    protocol: &str,
    limits: &Limits,
) -> Result<RequestHead, Reject> {
    extended_to_http1(parts, protocol, &new_key(), limits)
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

/// The tunnel after the upstream's 101: `:status 200` with the 101's end-to-end fields
/// (`sec-websocket-protocol`, `-extensions`; `sec-websocket-accept` dropped, RFC 8441 5;
/// `content-length` and `transfer-encoding` too, whether from the upstream or the route's
/// header rules: a 2xx to CONNECT has neither, RFC 9110 9.3.6, and a client's h2 would reset
/// the stream at its first DATA), then bytes both ways until both sides have ended (END_STREAM / EOF, passed on as half
/// closes), a reset either way, or `idle` without a byte (the group's `idle_timeout`, as for
/// HTTP/1.1 upgrades). One outcome: status 200 and the bytes sent to the client.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run(
    respond: &mut SendResponse<Bytes>,
    body: &mut RecvStream,
    mut up: UpConn,
    mut response: http::Response<()>,
    peer: SocketAddr,
    addr: SocketAddr,
    idle: Duration,
    send_timeout: Duration,
) -> Outcome {
    for name in [
        "sec-websocket-accept",
        "content-length",
        "transfer-encoding",
    ] {
        response.headers_mut().remove(name);
    }
    *response.status_mut() = http::StatusCode::OK;
    let mut outcome = Outcome {
        termination: Termination::OK,
        status: 200,
        keep_alive: true,
        bytes_sent: 0,
        upstream: Some(addr),
    };
    let mut send = match respond.send_response(response, false) {
        Ok(s) => s,
        Err(e) => {
            outcome.termination = client_err(e).termination(Phase::ResponseHead);
            return outcome;
        }
    };
    let p = Progress::new();
    let early = std::mem::take(&mut up.rbuf);
    let (ur, uw) = up.stream.split();
    let r = tunnel::relay(
        &mut StreamIn::new(body, Peer::Client),
        &mut SocketOut::new(uw, idle, Peer::Server),
        &mut SocketIn::new(ur, early, Peer::Server),
        &mut StreamOut::new(&mut send, send_timeout, Peer::Client),
        &p,
        idle,
    )
    .await;
    let (to_up, to_client) = (p.to_server.get(), p.to_client.get());
    outcome.bytes_sent = to_client;
    match r {
        Ok(()) => {
            tracing::debug!(%peer, upstream = %addr, to_up, to_client, "HTTP/2 WebSocket tunnel ended");
        }
        Err(e) => {
            tracing::debug!(%peer, upstream = %addr, to_up, to_client, "HTTP/2 WebSocket tunnel failed: {e}");
            tunnel::stop_client(&mut send, p.down_done.get(), &e);
            outcome.termination = e.termination(Phase::Tunnel);
        }
    }
    outcome
}

/// A fresh `Sec-WebSocket-Key`: 16 random bytes, base64 (RFC 6455 4.1: a nonce "randomly
/// selected", so no party can predict it), from aws-lc-rs's CSPRNG (already built for rustls).
fn new_key() -> String {
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

    fn head(raw: &[u8]) -> RequestHead {
        let mut b = bytes::BytesMut::from(raw);
        portico_http1::parse_request(&mut b, &Limits::default())
            .unwrap()
            .unwrap()
    }

    fn resp(raw: &[u8]) -> ResponseHead {
        let mut b = bytes::BytesMut::from(raw);
        let m = portico_http1::Method::Get;
        portico_http1::parse_response(&mut b, &m, &Limits::default())
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
}
