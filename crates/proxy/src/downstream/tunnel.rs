//! The client's side of a tunnel, for each client kind and upstream protocol: the answer that opens it (an HTTP/1.1 client's 101, an HTTP/2 client's 2xx), then `tunnel::relay` between the client and the server, and the tunnel's one outcome.

use crate::conn::{send_all, Conn};
use crate::error::ProxyError;
use crate::filter::Edits;
use crate::h2_io::{client_err, Peer};
use crate::headers::{self, ClientFraming};
use crate::telemetry::stats::Outcome;
use crate::telemetry::stats::{Phase, Termination};
use crate::tunnel::{self, Dest, Progress, SocketIn, SocketOut, Source, StreamIn, StreamOut};
use crate::upstream::pool::UpConn;
use bytes::Bytes;
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use portico_http1::{RequestHead, ResponseHead};
use std::net::SocketAddr;
use std::time::Duration;

/// After an HTTP/1.1 server's 101: the 101 to the client, then bytes both ways.
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
    let p = Progress::new();
    // The server's bytes read past its 101 come first.
    let early = std::mem::take(&mut up.rbuf);
    let (ur, uw) = up.stream.split();
    let server = Server {
        from: &mut SocketIn::new(ur, early, Peer::Server),
        to: &mut SocketOut::new(uw, idle, Peer::Server),
        addr,
        idle,
    };
    h1_client(c, resp, edits, via, head, server, &p).await
}

/// The server's side of an HTTP/1.1 client's tunnel.
struct Server<'s, I, O> {
    from: &'s mut I,
    to: &'s mut O,
    addr: SocketAddr,
    /// The group's `idle_timeout`: silence both ways, and each write to the server.
    idle: Duration,
}

/// An HTTP/1.1 client's tunnel: the 101 (`switch`, with the response filters' `edits`), then
/// `tunnel::relay` between the client's connection and `server` until both sides have ended
/// (each end passed on as a half close), a failure, or `idle` without a byte either way.
/// Counted as HTTP/1.1 upgrades are: status 101, the head and every byte written to the client.
async fn h1_client<I: Source, O: Dest>(
    c: &mut Conn,
    switch: &ResponseHead,
    edits: &Edits<'_>,
    via: bool,
    head: &RequestHead,
    server: Server<'_, I, O>,
    p: &Progress,
) -> Outcome {
    c.wbuf.clear();
    let framing = ClientFraming::None;
    headers::client_response(
        &mut c.wbuf,
        switch,
        framing,
        edits,
        via,
        head.version(),
        true,
    );
    let send_timeout = c.send_timeout;
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
            server.to,
            server.from,
            &mut SocketOut::new(cw, send_timeout, Peer::Client),
            p,
            server.idle,
        )
        .await
    }
    .await;
    c.wbuf.clear();
    let (to_up, to_client) = (p.to_server.get(), p.to_client.get());
    let (peer, upstream) = (c.peer, server.addr);
    let termination = match r {
        Ok(()) => {
            tracing::debug!(%peer, %upstream, to_up, to_client, "upgrade tunnel ended");
            Termination::OK
        }
        Err(e) => {
            tracing::debug!(%peer, %upstream, to_up, to_client, "upgrade tunnel failed: {e}");
            e.termination(Phase::Tunnel)
        }
    };
    Outcome {
        termination,
        status: 101,
        keep_alive: false,
        bytes_sent: to_client,
        upstream: Some(upstream),
    }
}

/// The tunnel after the upstream's 101: `:status 200` with the 101's end-to-end fields
/// (`sec-websocket-protocol`, `-extensions`; `sec-websocket-accept` dropped, RFC 8441 5;
/// `content-length` and `transfer-encoding` too, whether from the upstream or the response
/// filters' edits: a 2xx to CONNECT has neither, RFC 9110 9.3.6, and a client's h2 would reset
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

/// An HTTP/1.1 client's WebSocket after an HTTP/2 server's 2xx to the extended CONNECT: the
/// `101` (`websocket::switch_head`), then bytes both ways; a server that stops reading after
/// its end, with NO_ERROR, ends the client's direction too. A failed tunnel cancels the
/// server's stream unless the client's direction had ended.
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
    let p = Progress::new();
    let side = Server {
        from: &mut StreamIn::new(&mut from_server, Peer::Server),
        to: &mut StreamOut::new(&mut to_server, idle, Peer::Server),
        addr: server,
        idle,
    };
    let outcome = h1_client(c, &switch, edits, via, head, side, &p).await;
    if outcome.termination != Termination::OK && !p.up_done.get() {
        to_server.send_reset(h2::Reason::CANCEL);
    }
    outcome
}
