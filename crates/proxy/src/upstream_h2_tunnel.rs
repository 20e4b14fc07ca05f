//! WebSockets to `protocol = "h2"` groups (RFC 8441 extended CONNECT upstream): after the server's 2xx, its stream's DATA relayed to and from the client's HTTP/2 stream or, after a 101, its HTTP/1.1 connection.

use crate::conn::{send_all, Conn, Outcome};
use crate::error::ProxyError;
use crate::headers::{self, ClientFraming};
use crate::stats::{Phase, Termination};
use crate::upstream_h2::{send_windowed, To};
use bytes::{Bytes, BytesMut};
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use portico_config::{ProxyAction, Route};
use portico_http1::{encode, parse_response, Limits, Method, RequestHead};
use std::cell::Cell;
use std::future::poll_fn;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{timeout, Instant};

/// Whether an HTTP/1.1 request is a WebSocket opening handshake that can become an extended
/// CONNECT: an upgrade to `websocket` (the only token RFC 8441 defines) with the key its
/// `101` must answer.
pub(crate) fn is_websocket(head: &RequestHead) -> bool {
    head.upgrade
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
            let e = crate::upstream_h2::client_err(e);
            outcome.termination = e.termination(Phase::ResponseHead);
            return outcome;
        }
    };
    let up_bytes = Cell::new(0u64);
    let down_bytes = Cell::new(0u64);
    let down_done = Cell::new(false);
    let up_done = Cell::new(false);
    let r = relay(
        from_client,
        &mut to_client,
        &mut from_server,
        &mut to_server,
        idle,
        send_timeout,
        [&up_bytes, &down_bytes],
        [&up_done, &down_done],
    )
    .await;
    let (to_up, to_down) = (up_bytes.get(), down_bytes.get());
    outcome.bytes_sent = to_down;
    match r {
        Ok(()) => {
            tracing::debug!(%peer, upstream = %server, to_up, to_client = to_down, "HTTP/2 WebSocket tunnel to an HTTP/2 server ended");
        }
        Err(e) => {
            tracing::debug!(%peer, upstream = %server, to_up, to_client = to_down, "HTTP/2 WebSocket tunnel to an HTTP/2 server failed: {e}");
            if !up_done.get() {
                to_server.send_reset(h2::Reason::CANCEL);
            }
            crate::h2::stop_client(&mut to_client, down_done.get(), &e);
            outcome.termination = e.termination(Phase::Tunnel);
        }
    }
    outcome
}

/// Both directions at once under one idle timer that any byte either way restarts; the timer
/// is the server's until its END_STREAM has ended the client's stream (`done[1]`), then the
/// client's. `bytes` and `done`: [to the server, to the client].
#[allow(clippy::too_many_arguments)]
async fn relay(
    from_client: &mut RecvStream,
    to_client: &mut SendStream<Bytes>,
    from_server: &mut RecvStream,
    to_server: &mut SendStream<Bytes>,
    idle: Duration,
    send_timeout: Duration,
    bytes: [&Cell<u64>; 2],
    done: [&Cell<bool>; 2],
) -> Result<(), ProxyError> {
    let last = Cell::new(Instant::now());
    // Server -> client. A reset by the client ends it while it waits for the server's bytes.
    let down = async {
        loop {
            let d = tokio::select! {
                d = from_server.data() => d,
                r = poll_fn(|cx| to_client.poll_reset(cx)) => {
                    return Err(match r {
                        Ok(_) => ProxyError::ClientClosed,
                        Err(e) => crate::upstream_h2::client_err(e),
                    });
                }
            };
            match d {
                None => {
                    to_client
                        .send_data(Bytes::new(), true)
                        .map_err(crate::upstream_h2::client_err)?;
                    done[1].set(true);
                    return Ok(());
                }
                Some(Err(e)) => return Err(crate::upstream_h2::up_err(e)),
                Some(Ok(d)) => {
                    last.set(Instant::now());
                    let n = d.len();
                    send_windowed(to_client, d, send_timeout, To::Client).await?;
                    let _ = from_server.flow_control().release_capacity(n);
                    bytes[1].set(bytes[1].get() + n as u64);
                    last.set(Instant::now());
                }
            }
        }
    };
    // Client -> server. A reset by the server ends it while it waits for the client's bytes.
    let up = async {
        loop {
            let d = tokio::select! {
                d = from_client.data() => d,
                r = poll_fn(|cx| to_server.poll_reset(cx)) => {
                    return Err(match r {
                        Ok(_) => ProxyError::UpstreamClosed,
                        Err(e) => crate::upstream_h2::up_err(e),
                    });
                }
            };
            match d {
                None => {
                    to_server
                        .send_data(Bytes::new(), true)
                        .map_err(crate::upstream_h2::up_err)?;
                    done[0].set(true);
                    return Ok(());
                }
                Some(Err(e)) => return Err(crate::upstream_h2::client_err(e)),
                Some(Ok(d)) => {
                    last.set(Instant::now());
                    let n = d.len();
                    send_windowed(to_server, d, idle, To::Server).await?;
                    let _ = from_client.flow_control().release_capacity(n);
                    bytes[0].set(bytes[0].get() + n as u64);
                    last.set(Instant::now());
                }
            }
        }
    };
    tokio::select! {
        r = async { tokio::try_join!(down, up) } => r.map(|_| ()),
        e = crate::h2::idle_watchdog(&last, idle, done[1]) => Err(e),
    }
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
/// (`Upgrade: websocket`, `Sec-WebSocket-Accept` for the client's key, the 2xx's end-to-end
/// fields and the route's response rules), then bytes both ways until both sides have ended
/// (EOF and END_STREAM passed on as half closes), a reset, or `idle` without a byte either way.
/// Counted as HTTP/1.1 upgrades are: status 101, the head and every byte written to the client.
pub(crate) async fn run_h1(
    c: &mut Conn,
    head: &RequestHead,
    route: &Route,
    p: &ProxyAction,
    parts: http::response::Parts,
    legs: H1Legs,
) -> Outcome {
    let H1Legs {
        mut from_server,
        mut to_server,
        server,
        idle,
    } = legs;
    let mut outcome = Outcome {
        termination: Termination::OK,
        status: 101,
        keep_alive: false,
        bytes_sent: 0,
        upstream: Some(server),
    };
    let key = head.field("sec-websocket-key").unwrap_or_default();
    let mut raw = BytesMut::with_capacity(256);
    encode::status_line(&mut raw, 101, "Switching Protocols");
    encode::field(&mut raw, "Upgrade", b"websocket");
    encode::field(&mut raw, "Connection", b"upgrade");
    let accept = crate::h2::websocket_accept(key);
    encode::field(&mut raw, "Sec-WebSocket-Accept", accept.as_bytes());
    for (n, v) in &parts.headers {
        let n = n.as_str();
        let skip = ["content-length", "sec-websocket-accept"];
        if !crate::upstream_h2::DROPPED.contains(&n) && !skip.contains(&n) {
            encode::field(&mut raw, n, v.as_bytes());
        }
    }
    encode::end_head(&mut raw);
    let limits = Limits {
        max_head_bytes: raw.len() + 1,
        ..Limits::default()
    };
    let Ok(Some(rh)) = parse_response(&mut raw, &Method::Get, &limits) else {
        to_server.send_reset(h2::Reason::CANCEL);
        let e = ProxyError::UpstreamIo(std::io::Error::other("response head not valid HTTP/1"));
        outcome.termination = e.termination(Phase::ResponseHead);
        return outcome;
    };
    c.wbuf.clear();
    let version = head.version();
    let rules = &route.response_headers;
    headers::client_response(
        &mut c.wbuf,
        &rh,
        ClientFraming::None,
        rules,
        p.via,
        version,
        true,
    );
    let (mut to_up, mut to_client) = (0u64, 0u64);
    let send_timeout = c.send_timeout;
    let mut up_done = false;
    let r: Result<(), ProxyError> = async {
        send_all(&mut c.stream, &c.wbuf, send_timeout)
            .await
            .map_err(ProxyError::ClientIo)?;
        to_client += c.wbuf.len() as u64;
        // Bytes the client sent after its head, before the 101.
        if !c.rbuf.is_empty() {
            let early = c.rbuf.split().freeze();
            to_up += early.len() as u64;
            send_windowed(&mut to_server, early, idle, To::Server).await?;
        }
        let (mut cr, mut cw) = tokio::io::split(&mut c.stream);
        let mut buf = BytesMut::with_capacity(16 * 1024);
        let (mut client_open, mut server_open) = (true, true);
        let sleep = tokio::time::sleep(idle);
        tokio::pin!(sleep);
        while client_open || server_open {
            if buf.capacity() < 4096 {
                buf.reserve(16 * 1024);
            }
            tokio::select! {
                r = cr.read_buf(&mut buf), if client_open => {
                    match r.map_err(ProxyError::ClientIo)? {
                        0 => {
                            client_open = false;
                            to_server
                                .send_data(Bytes::new(), true)
                                .map_err(crate::upstream_h2::up_err)?;
                            up_done = true;
                        }
                        n => {
                            let d = buf.split().freeze();
                            send_windowed(&mut to_server, d, idle, To::Server).await?;
                            to_up += n as u64;
                        }
                    }
                }
                d = from_server.data(), if server_open => match d {
                    None => {
                        server_open = false;
                        let shut = timeout(send_timeout, cw.shutdown()).await;
                        client_write(shut)?;
                    }
                    Some(Err(e)) => return Err(crate::upstream_h2::up_err(e)),
                    Some(Ok(d)) => {
                        let n = d.len();
                        let write = async {
                            cw.write_all(&d).await?;
                            cw.flush().await
                        };
                        client_write(timeout(send_timeout, write).await)?;
                        let _ = from_server.flow_control().release_capacity(n);
                        to_client += n as u64;
                    }
                },
                _ = &mut sleep => return Err(ProxyError::UpstreamIdle),
            }
            sleep.as_mut().reset(Instant::now() + idle);
        }
        Ok(())
    }
    .await;
    c.wbuf.clear();
    outcome.bytes_sent = to_client;
    match r {
        Ok(()) => {
            tracing::debug!(peer = %c.peer, upstream = %server, to_up, to_client, "upgrade tunnel to an HTTP/2 server ended");
        }
        Err(e) => {
            tracing::debug!(peer = %c.peer, upstream = %server, to_up, to_client, "upgrade tunnel to an HTTP/2 server failed: {e}");
            if !up_done {
                to_server.send_reset(h2::Reason::CANCEL);
            }
            outcome.termination = e.termination(Phase::Tunnel);
        }
    }
    outcome
}

/// A client write bounded by `send_timeout`: a client that takes nothing in time is a client
/// timeout, as for every other client write.
fn client_write(
    r: Result<std::io::Result<()>, tokio::time::error::Elapsed>,
) -> Result<(), ProxyError> {
    match r {
        Ok(r) => r.map_err(ProxyError::ClientIo),
        Err(_) => Err(ProxyError::ClientIo(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "tunnel write stalled",
        ))),
    }
}
