//! WebSockets to `protocol = "h2"` groups (RFC 8441 extended CONNECT upstream): after the server's 2xx, its stream's DATA relayed to and from the client's HTTP/2 stream or, after a 101, its HTTP/1.1 connection.

use crate::conn::{send_all, Conn};
use crate::error::ProxyError;
use crate::filter::Edits;
use crate::h2_io::{client_err, send_windowed, up_err, Peer};
use crate::headers::{self, ClientFraming};
use crate::stats::Outcome;
use crate::stats::{Phase, Termination};
use bytes::{Bytes, BytesMut};
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use portico_http1::{encode, parse_response, Framing, Limits, Method, RequestHead, ResponseHead};
use std::cell::Cell;
use std::future::poll_fn;
use std::net::SocketAddr;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{timeout, Instant};

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

/// Whether the server reset its stream with NO_ERROR: after its whole answer, it asks for no
/// more of the request (RFC 9113 8.1). The tunnel's other direction then ends without error.
fn stopped_reading(send: &mut SendStream<Bytes>) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    matches!(
        send.poll_reset(&mut cx),
        Poll::Ready(Ok(h2::Reason::NO_ERROR))
    )
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
    let done = Progress::new();
    let r = relay(
        from_client,
        &mut to_client,
        &mut from_server,
        &mut to_server,
        idle,
        send_timeout,
        &done,
    )
    .await;
    let (to_up, to_down) = (done.to_server.get(), done.to_client.get());
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
            if !done.up_done.get() {
                to_server.send_reset(h2::Reason::CANCEL);
            }
            crate::h2::tunnel::stop_client(&mut to_client, done.down_done.get(), &e);
            outcome.termination = e.termination(Phase::Tunnel);
        }
    }
    outcome
}

/// What a tunnel's two directions did: bytes relayed each way, and which directions ended
/// (END_STREAM or EOF passed on, or the server stopped reading: `stopped_reading`).
struct Progress {
    to_server: Cell<u64>,
    to_client: Cell<u64>,
    up_done: Cell<bool>,
    down_done: Cell<bool>,
    /// When a byte last moved either way (the idle timer counts from it).
    last: Cell<Instant>,
}

impl Progress {
    fn new() -> Self {
        Progress {
            to_server: Cell::new(0),
            to_client: Cell::new(0),
            up_done: Cell::new(false),
            down_done: Cell::new(false),
            last: Cell::new(Instant::now()),
        }
    }

    fn moved(&self) {
        self.last.set(Instant::now());
    }

    /// The client-to-server direction ended: at the client's end, or when the server stopped
    /// reading (then the client's further bytes go nowhere).
    fn up_ended(&self) {
        self.up_done.set(true);
    }
}

/// Send the client's END_STREAM on to the server; a server that already stopped reading
/// needs none.
fn end_up(to_server: &mut SendStream<Bytes>, done: &Progress) -> Result<(), ProxyError> {
    match to_server.send_data(Bytes::new(), true) {
        Ok(()) => done.up_ended(),
        Err(_) if stopped_reading(to_server) => done.up_ended(),
        Err(e) => return Err(up_err(e)),
    }
    Ok(())
}

/// Send client bytes to the server; Ok(false) when the server stopped reading instead.
async fn send_up(
    to_server: &mut SendStream<Bytes>,
    mut d: Bytes,
    idle: Duration,
    done: &Progress,
) -> Result<bool, ProxyError> {
    let n = d.len() as u64;
    match send_windowed(to_server, &mut d, false, idle, Peer::Server).await {
        Ok(()) => {
            done.to_server.set(done.to_server.get() + n);
            done.moved();
            Ok(true)
        }
        Err(_) if stopped_reading(to_server) => {
            done.up_ended();
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// Both directions at once under one idle timer that any byte either way restarts; the timer
/// is the server's until its END_STREAM has ended the client's stream (`down_done`), then the
/// client's.
async fn relay(
    from_client: &mut RecvStream,
    to_client: &mut SendStream<Bytes>,
    from_server: &mut RecvStream,
    to_server: &mut SendStream<Bytes>,
    idle: Duration,
    send_timeout: Duration,
    done: &Progress,
) -> Result<(), ProxyError> {
    // Server -> client. A reset by the client ends it while it waits for the server's bytes.
    let down = async {
        loop {
            let d = tokio::select! {
                d = from_server.data() => d,
                r = poll_fn(|cx| to_client.poll_reset(cx)) => {
                    return Err(match r {
                        Ok(_) => ProxyError::ClientClosed,
                        Err(e) => client_err(e),
                    });
                }
            };
            match d {
                None => {
                    to_client
                        .send_data(Bytes::new(), true)
                        .map_err(client_err)?;
                    done.down_done.set(true);
                    return Ok(());
                }
                Some(Err(e)) => return Err(up_err(e)),
                Some(Ok(mut d)) => {
                    done.moved();
                    let n = d.len();
                    send_windowed(to_client, &mut d, false, send_timeout, Peer::Client).await?;
                    let _ = from_server.flow_control().release_capacity(n);
                    done.to_client.set(done.to_client.get() + n as u64);
                    done.moved();
                }
            }
        }
    };
    // Client -> server. A reset by the server ends it while it waits for the client's bytes:
    // an error, unless it is the NO_ERROR of a server that answered in full and stops reading.
    let up = async {
        loop {
            let d = tokio::select! {
                d = from_client.data() => d,
                r = poll_fn(|cx| to_server.poll_reset(cx)) => {
                    return match r {
                        Ok(h2::Reason::NO_ERROR) => {
                            done.up_ended();
                            Ok(())
                        }
                        Ok(_) => Err(ProxyError::UpstreamClosed),
                        Err(e) => Err(up_err(e)),
                    };
                }
            };
            match d {
                None => return end_up(to_server, done),
                Some(Err(e)) => return Err(client_err(e)),
                Some(Ok(d)) => {
                    done.moved();
                    let n = d.len();
                    if !send_up(to_server, d, idle, done).await? {
                        return Ok(());
                    }
                    let _ = from_client.flow_control().release_capacity(n);
                }
            }
        }
    };
    tokio::select! {
        r = async { tokio::try_join!(down, up) } => r.map(|_| ()),
        e = crate::h2::tunnel::idle_watchdog(&done.last, idle, &done.down_done) => Err(e),
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
    let done = Progress::new();
    let r: Result<(), ProxyError> = async {
        send_all(&mut c.stream, &c.wbuf, send_timeout)
            .await
            .map_err(ProxyError::ClientIo)?;
        done.to_client.set(c.wbuf.len() as u64);
        done.moved();
        // Bytes the client sent after its head, before the 101.
        let mut up_open = true;
        if !c.rbuf.is_empty() {
            let early = c.rbuf.split().freeze();
            up_open = send_up(&mut to_server, early, idle, &done).await?;
        }
        let (mut cr, mut cw) = tokio::io::split(&mut c.stream);
        let from_server = &mut from_server;
        let to_server = &mut to_server;
        let done = &done;
        // Server -> client; the server's END_STREAM shuts the client's write side down.
        let down = async {
            loop {
                match from_server.data().await {
                    None => {
                        client_write(timeout(send_timeout, cw.shutdown()).await)?;
                        done.down_done.set(true);
                        return Ok(());
                    }
                    Some(Err(e)) => return Err(up_err(e)),
                    Some(Ok(d)) => {
                        done.moved();
                        let n = d.len();
                        let write = async {
                            cw.write_all(&d).await?;
                            cw.flush().await
                        };
                        client_write(timeout(send_timeout, write).await)?;
                        let _ = from_server.flow_control().release_capacity(n);
                        done.to_client.set(done.to_client.get() + n as u64);
                        done.moved();
                    }
                }
            }
        };
        // Client -> server; the client's EOF is END_STREAM.
        let up = async {
            let mut buf = BytesMut::with_capacity(16 * 1024);
            while up_open {
                if buf.capacity() < 4096 {
                    buf.reserve(16 * 1024);
                }
                if cr.read_buf(&mut buf).await.map_err(ProxyError::ClientIo)? == 0 {
                    return end_up(to_server, done);
                }
                done.moved();
                up_open = send_up(to_server, buf.split().freeze(), idle, done).await?;
            }
            Ok(())
        };
        tokio::select! {
            r = async { tokio::try_join!(down, up) } => r.map(|_| ()),
            e = crate::h2::tunnel::idle_watchdog(&done.last, idle, &done.down_done) => Err(e),
        }
    }
    .await;
    c.wbuf.clear();
    let (to_up, to_client) = (done.to_server.get(), done.to_client.get());
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
            if !done.up_done.get() {
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
