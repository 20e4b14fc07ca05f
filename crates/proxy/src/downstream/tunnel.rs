//! The client's side of a tunnel, for each client kind and upstream protocol: the answer that opens it (an HTTP/1.1 client's 101, an HTTP/2 client's 2xx), then `tunnel::relay` between the client and the server, and the tunnel's one outcome.

use crate::conn::{send_all, Conn};
use crate::error::ProxyError;
use crate::filter::Edits;
use crate::h2_io::{client_err, Peer};
use crate::headers::{self, ClientFraming};
use crate::telemetry::stats::Outcome;
use crate::telemetry::stats::{Phase, Termination};
use crate::tunnel::{self, Progress, SocketIn, SocketOut, StreamIn, StreamOut};
use crate::upstream::pool::UpConn;
use bytes::Bytes;
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use portico_http1::{RequestHead, ResponseHead};
use std::net::SocketAddr;
use std::time::Duration;

/// After a 101: send the head, then relay bytes both ways (`tunnel::relay`) until both sides
/// have closed. Counted as bytes written to the client, the 101 head included.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn h1_to_h1(
    c: &mut Conn,
    mut up: UpConn,
    resp: &ResponseHead,
    edits: &Edits<'_>,
    via: bool,
    head: &RequestHead,
    addr: SocketAddr,
    idle: Duration,
) -> Outcome {
    c.wbuf.clear();
    headers::client_response(
        &mut c.wbuf,
        resp,
        ClientFraming::None,
        edits,
        via,
        head.version(),
        true,
    );
    let send_timeout = c.send_timeout;
    let p = Progress::new();
    let r: Result<(), ProxyError> = async {
        send_all(&mut c.stream, &c.wbuf, send_timeout)
            .await
            .map_err(ProxyError::ClientIo)?;
        p.to_client.set(c.wbuf.len() as u64);
        // Bytes either side sent after its head come first.
        let early = std::mem::take(&mut c.rbuf);
        let (cr, cw) = c.stream.split();
        let (ur, uw) = up.stream.split();
        tunnel::relay(
            &mut SocketIn::new(cr, early, Peer::Client),
            &mut SocketOut::new(uw, idle, Peer::Server),
            &mut SocketIn::new(ur, std::mem::take(&mut up.rbuf), Peer::Server),
            &mut SocketOut::new(cw, send_timeout, Peer::Client),
            &p,
            idle,
        )
        .await
    }
    .await;
    c.wbuf.clear();
    let (to_up, to_client) = (p.to_server.get(), p.to_client.get());
    let termination = match r {
        Ok(()) => {
            tracing::debug!(peer = %c.peer, upstream = %addr, to_up, to_client, "upgrade tunnel ended");
            Termination::OK
        }
        Err(e) => {
            tracing::debug!(peer = %c.peer, upstream = %addr, to_up, to_client, "upgrade tunnel failed: {e}");
            e.termination(Phase::Tunnel)
        }
    };
    Outcome {
        termination,
        status: 101,
        keep_alive: false,
        bytes_sent: to_client,
        upstream: Some(addr),
    }
}

/// The tunnel after the upstream's 101: `:status 200` with the 101's end-to-end fields
/// (`sec-websocket-protocol`, `-extensions`; `sec-websocket-accept` dropped, RFC 8441 5;
/// `content-length` and `transfer-encoding` too, whether from the upstream or the route's
/// header rules: a 2xx to CONNECT has neither, RFC 9110 9.3.6, and a client's h2 would reset
/// the stream at its first DATA), then bytes both ways until both sides have ended (END_STREAM / EOF, passed on as half
/// closes), a reset either way, or `idle` without a byte (the group's `idle_timeout`, as for
/// HTTP/1.1 upgrades). One outcome: status 200 and the bytes sent to the client.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn h2_to_h1(
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
pub(crate) async fn h2_to_h2(
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

/// An HTTP/1.1 client's WebSocket after the server's 2xx to the extended CONNECT: the `101`
/// (`switch_head`, with the response filters' edits), then bytes both ways at once until both
/// sides have ended (EOF and END_STREAM passed on as half closes; a server that stops reading
/// after its end, with NO_ERROR, ends the client's direction too), a reset, or `idle` without
/// a byte either way. Counted as HTTP/1.1 upgrades are: status 101, the head and every byte
/// written to the client.
pub(crate) async fn h1_to_h2(
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
