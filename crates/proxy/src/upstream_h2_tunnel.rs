//! WebSockets to `protocol = "h2"` groups (RFC 8441 extended CONNECT upstream): after the server's 2xx, its stream relayed (`tunnel::relay`) to and from the client's HTTP/2 stream or, after a 101, its HTTP/1.1 connection.

use crate::conn::{send_all, Conn};
use crate::error::ProxyError;
use crate::filter::Edits;
use crate::h2_io::{client_err, Peer};
use crate::headers::{self, ClientFraming};
use crate::stats::Outcome;
use crate::stats::{Phase, Termination};
use crate::tunnel::{self, Progress, SocketIn, SocketOut, StreamIn, StreamOut};
use bytes::{Bytes, BytesMut};
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use portico_http1::{encode, parse_response, Framing, Limits, Method, RequestHead, ResponseHead};
use std::net::SocketAddr;
use std::time::Duration;

/// Whether an HTTP/1.1 request is a WebSocket opening handshake that can become an extended
/// CONNECT: a `GET` without a body (RFC 6455 4.1) upgrading to `websocket` (the only token
/// RFC 8441 defines), with the key its `101` must answer.
pub(crate) fn is_websocket(head: &RequestHead) -> bool {
    head.upgrade
        && *head.method() == Method::Get
        && matches!(head.framing, Framing::None | Framing::Length(0))
        && head
            .field("upgrade")
            .is_some_and(|u| u.trim_ascii().eq_ignore_ascii_case(b"websocket"))
        && head.field("sec-websocket-key").is_some()
}

/// The two streams of a tunnel and where they end.
pub(crate) struct Legs<'a> {
    /// The client's stream: its answer, and its DATA (the bytes for the server).
    pub respond: &'a mut SendResponse<Bytes>,
    pub from_client: &'a mut RecvStream,
    /// The server's stream: its DATA (the bytes for the client), and the request's send side.
    pub from_server: RecvStream,
    pub to_server: SendStream<Bytes>,
    pub peer: SocketAddr,
    pub server: SocketAddr,
}

/// Answer the client with the server's 2xx `response` (without `content-length` and
/// `transfer-encoding`: a 2xx to CONNECT has neither, RFC 9110 9.3.6), then relay both ways
/// until both sides have ended (END_STREAM each way, passed on), a reset either way, or `idle`
/// without a byte either way (the group's `idle_timeout`, as for the other tunnels). Writes to
/// the client wait at most `send_timeout` for its window, writes to the server at most `idle`.
/// One outcome: the server's status and the bytes sent to the client.
pub(crate) async fn run(
    legs: Legs<'_>,
    mut response: http::Response<()>,
    idle: Duration,
    send_timeout: Duration,
) -> Outcome {
    let Legs {
        respond,
        from_client,
        mut from_server,
        mut to_server,
        peer,
        server,
    } = legs;
    for name in ["content-length", "transfer-encoding"] {
        response.headers_mut().remove(name);
    }
    let status = response.status().as_u16();
    let mut outcome = Outcome {
        termination: Termination::OK,
        status,
        keep_alive: true,
        bytes_sent: 0,
        upstream: Some(server),
    };
    let mut to_client = match respond.send_response(response, false) {
        Ok(s) => s,
        Err(e) => {
            to_server.send_reset(h2::Reason::CANCEL);
            let e = client_err(e);
            outcome.termination = e.termination(Phase::ResponseHead);
            return outcome;
        }
    };
    let p = Progress::new();
    let r = tunnel::relay(
        &mut StreamIn::new(from_client, Peer::Client),
        &mut StreamOut::new(&mut to_server, idle, Peer::Server),
        &mut StreamIn::new(&mut from_server, Peer::Server),
        &mut StreamOut::new(&mut to_client, send_timeout, Peer::Client),
        &p,
        idle,
    )
    .await;
    let (to_up, to_down) = (p.to_server.get(), p.to_client.get());
    outcome.bytes_sent = to_down;
    match r {
        Ok(()) => {
            tracing::debug!(%peer, upstream = %server, to_up, to_client = to_down, "HTTP/2 WebSocket tunnel to an HTTP/2 server ended");
            // A server that stopped reading leaves the client's side open: once this stream's
            // handles are dropped, h2 resets it with NO_ERROR after the queued DATA and
            // END_STREAM went out (RFC 9113 8.1; an explicit reset now would drop them).
        }
        Err(e) => {
            tracing::debug!(%peer, upstream = %server, to_up, to_client = to_down, "HTTP/2 WebSocket tunnel to an HTTP/2 server failed: {e}");
            if !p.up_done.get() {
                to_server.send_reset(h2::Reason::CANCEL);
            }
            tunnel::stop_client(&mut to_client, p.down_done.get(), &e);
            outcome.termination = e.termination(Phase::Tunnel);
        }
    }
    outcome
}

/// The server's side of an HTTP/1.1 client's tunnel.
pub(crate) struct H1Legs {
    pub from_server: RecvStream,
    pub to_server: SendStream<Bytes>,
    pub server: SocketAddr,
    /// The group's `idle_timeout`: silence both ways, and each write to the server.
    pub idle: Duration,
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
    let mut raw = BytesMut::with_capacity(256);
    encode::status_line(&mut raw, 101, "Switching Protocols");
    encode::field(&mut raw, "Upgrade", b"websocket");
    encode::field(&mut raw, "Connection", b"upgrade");
    let accept = crate::h2::tunnel::websocket_accept(key);
    encode::field(&mut raw, "Sec-WebSocket-Accept", accept.as_bytes());
    for (n, v) in &parts.headers {
        let n = n.as_str();
        let skip = ["content-length", "sec-websocket-accept"];
        if !crate::h2_fields::DROPPED.contains(&n) && !skip.contains(&n) {
            encode::field(&mut raw, n, v.as_bytes());
        }
    }
    encode::end_head(&mut raw);
    let limits = Limits {
        max_head_bytes: raw.len() + 1,
        ..Limits::default()
    };
    parse_response(&mut raw, &Method::Get, &limits)
        .ok()
        .flatten()
}

/// An HTTP/1.1 client's WebSocket after the server's 2xx to the extended CONNECT: the `101`
/// (`switch_head`, with the response filters' edits), then bytes both ways at once until both
/// sides have ended (EOF and END_STREAM passed on as half closes; a server that stops reading
/// after its end, with NO_ERROR, ends the client's direction too), a reset, or `idle` without
/// a byte either way. Counted as HTTP/1.1 upgrades are: status 101, the head and every byte
/// written to the client.
pub(crate) async fn run_h1(
    c: &mut Conn,
    head: &RequestHead,
    edits: &Edits<'_>,
    via: bool,
    switch: ResponseHead,
    legs: H1Legs,
) -> Outcome {
    let H1Legs {
        mut from_server,
        mut to_server,
        server,
        idle,
    } = legs;
    c.wbuf.clear();
    let version = head.version();
    headers::client_response(
        &mut c.wbuf,
        &switch,
        ClientFraming::None,
        edits,
        via,
        version,
        true,
    );
    let send_timeout = c.send_timeout;
    let p = Progress::new();
    let r: Result<(), ProxyError> = async {
        send_all(&mut c.stream, &c.wbuf, send_timeout)
            .await
            .map_err(ProxyError::ClientIo)?;
        p.to_client.set(c.wbuf.len() as u64);
        p.moved();
        // Bytes the client sent after its head, before the 101, come first.
        let early = std::mem::take(&mut c.rbuf);
        let (cr, cw) = c.stream.split();
        tunnel::relay(
            &mut SocketIn::new(cr, early, Peer::Client),
            &mut StreamOut::new(&mut to_server, idle, Peer::Server),
            &mut StreamIn::new(&mut from_server, Peer::Server),
            &mut SocketOut::new(cw, send_timeout, Peer::Client),
            &p,
            idle,
        )
        .await
    }
    .await;
    c.wbuf.clear();
    let (to_up, to_client) = (p.to_server.get(), p.to_client.get());
    let mut outcome = Outcome {
        termination: Termination::OK,
        status: 101,
        keep_alive: false,
        bytes_sent: to_client,
        upstream: Some(server),
    };
    match r {
        Ok(()) => {
            tracing::debug!(peer = %c.peer, upstream = %server, to_up, to_client, "upgrade tunnel to an HTTP/2 server ended");
        }
        Err(e) => {
            tracing::debug!(peer = %c.peer, upstream = %server, to_up, to_client, "upgrade tunnel to an HTTP/2 server failed: {e}");
            if !p.up_done.get() {
                to_server.send_reset(h2::Reason::CANCEL);
            }
            outcome.termination = e.termination(Phase::Tunnel);
        }
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::is_websocket;

    fn head(raw: &str) -> portico_http1::RequestHead {
        let mut b = bytes::BytesMut::from(raw.as_bytes());
        portico_http1::parse_request(&mut b, &portico_http1::Limits::default())
            .unwrap()
            .unwrap()
    }

    #[test]
    fn only_a_bodiless_get_upgrading_to_websocket_with_a_key_is_one() {
        let ws = "Host: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: k\r\n";
        assert!(is_websocket(&head(&format!("GET / HTTP/1.1\r\n{ws}\r\n"))));
        assert!(is_websocket(&head(&format!(
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
