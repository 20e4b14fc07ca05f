//! One relay for every tunnel (an upgrade's bytes, a WebSocket over HTTP/2): both directions at once, each from a source to a destination of either kind (a socket half or an HTTP/2 stream), under one idle timer that any byte restarts, half-closes passed on.

use crate::error::ProxyError;
use crate::h2_io::{client_err, send_windowed, up_err, Peer};
use bytes::{Bytes, BytesMut};
use h2::{RecvStream, SendStream};
use std::cell::Cell;
use std::future::poll_fn;
use std::io;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

/// What a tunnel's two directions did: bytes relayed each way, and which directions ended.
pub(crate) struct Progress {
    pub to_server: Cell<u64>,
    pub to_client: Cell<u64>,
    /// The client-to-server direction ended: the client's end was passed on, or the server
    /// stopped reading (its NO_ERROR reset after a complete answer, RFC 9113 8.1).
    pub up_done: Cell<bool>,
    /// The server-to-client direction ended: the server's end was passed on.
    pub down_done: Cell<bool>,
    /// When a byte last moved either way (the idle timer counts from it).
    last: Cell<Instant>,
}

impl Progress {
    pub(crate) fn new() -> Self {
        Progress {
            to_server: Cell::new(0),
            to_client: Cell::new(0),
            up_done: Cell::new(false),
            down_done: Cell::new(false),
            last: Cell::new(Instant::now()),
        }
    }

    /// Bytes moved (the idle timer starts again).
    pub(crate) fn moved(&self) {
        self.last.set(Instant::now());
    }
}

/// Where a tunnel's bytes come from.
pub(crate) trait Source {
    /// The next bytes; None at the peer's end (EOF, END_STREAM).
    async fn recv(&mut self) -> Result<Option<Bytes>, ProxyError>;
    /// `n` bytes were passed on: an HTTP/2 peer may send as many more.
    fn release(&mut self, _n: usize) {}
}

/// Where a tunnel's bytes go.
pub(crate) trait Dest {
    /// Send bytes; Ok(false) when the peer stopped reading instead (the direction is over).
    async fn send(&mut self, d: Bytes) -> Result<bool, ProxyError>;
    /// Pass the other side's end on (a half close).
    async fn end(&mut self) -> Result<(), ProxyError>;
    /// Ready when this peer went away while the other side is awaited: an error, or Ok when
    /// it only stopped reading.
    fn poll_gone(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ProxyError>> {
        Poll::Pending
    }
}

/// A socket's read half.
pub(crate) struct SocketIn<R> {
    r: R,
    buf: BytesMut,
    side: Peer,
}

impl<R> SocketIn<R> {
    /// `early`: bytes already read past a head, relayed first.
    pub(crate) fn new(r: R, early: BytesMut, side: Peer) -> Self {
        SocketIn {
            r,
            buf: early,
            side,
        }
    }
}

impl<R: AsyncRead + Unpin> Source for SocketIn<R> {
    async fn recv(&mut self) -> Result<Option<Bytes>, ProxyError> {
        if !self.buf.is_empty() {
            return Ok(Some(self.buf.split().freeze()));
        }
        if self.buf.capacity() < 4096 {
            self.buf.reserve(16 * 1024);
        }
        match self.r.read_buf(&mut self.buf).await {
            Ok(0) => Ok(None),
            // A TLS server closing without close_notify ends its side as a plain close.
            Err(e) if self.side == Peer::Server && e.kind() == io::ErrorKind::UnexpectedEof => {
                Ok(None)
            }
            Err(e) => Err(self.side.io(e)),
            Ok(_) => Ok(Some(self.buf.split().freeze())),
        }
    }
}

/// A socket's write half; each write (and the shutdown) makes progress within `limit`: the
/// listener's `send_timeout` for a client, the group's `idle_timeout` for a server.
pub(crate) struct SocketOut<W> {
    w: W,
    limit: Duration,
    side: Peer,
}

impl<W> SocketOut<W> {
    pub(crate) fn new(w: W, limit: Duration, side: Peer) -> Self {
        SocketOut { w, limit, side }
    }
}

impl<W: AsyncWrite + Unpin> Dest for SocketOut<W> {
    async fn send(&mut self, d: Bytes) -> Result<bool, ProxyError> {
        let w = &mut self.w;
        let write = async {
            w.write_all(&d).await?;
            w.flush().await
        };
        bounded(self.limit, self.side, write).await.map(|()| true)
    }

    async fn end(&mut self) -> Result<(), ProxyError> {
        bounded(self.limit, self.side, self.w.shutdown()).await
    }
}

/// An HTTP/2 stream's receiving side.
pub(crate) struct StreamIn<'s> {
    s: &'s mut RecvStream,
    side: Peer,
}

impl<'s> StreamIn<'s> {
    pub(crate) fn new(s: &'s mut RecvStream, side: Peer) -> Self {
        StreamIn { s, side }
    }
}

impl Source for StreamIn<'_> {
    async fn recv(&mut self) -> Result<Option<Bytes>, ProxyError> {
        match self.s.data().await {
            None => Ok(None),
            Some(Err(e)) => Err(self.side.error(e)),
            Some(Ok(d)) => Ok(Some(d)),
        }
    }

    fn release(&mut self, n: usize) {
        let _ = self.s.flow_control().release_capacity(n);
    }
}

/// An HTTP/2 stream's sending side: DATA under the peer's window, waiting at most `limit` for
/// it (the listener's `send_timeout` for a client, the group's `idle_timeout` for a server).
pub(crate) struct StreamOut<'s> {
    s: &'s mut SendStream<Bytes>,
    limit: Duration,
    side: Peer,
}

impl<'s> StreamOut<'s> {
    pub(crate) fn new(s: &'s mut SendStream<Bytes>, limit: Duration, side: Peer) -> Self {
        StreamOut { s, limit, side }
    }
}

impl StreamOut<'_> {
    /// A server that reset the stream with NO_ERROR answered in full and reads no more.
    fn server_stopped_reading(&mut self) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        self.side == Peer::Server
            && matches!(
                self.s.poll_reset(&mut cx),
                Poll::Ready(Ok(h2::Reason::NO_ERROR))
            )
    }
}

impl Dest for StreamOut<'_> {
    async fn send(&mut self, mut d: Bytes) -> Result<bool, ProxyError> {
        match send_windowed(self.s, &mut d, false, self.limit, self.side).await {
            Ok(()) => Ok(true),
            Err(_) if self.server_stopped_reading() => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn end(&mut self) -> Result<(), ProxyError> {
        match self.s.send_data(Bytes::new(), true) {
            Ok(()) => Ok(()),
            Err(_) if self.server_stopped_reading() => Ok(()),
            Err(e) => Err(self.side.error(e)),
        }
    }

    fn poll_gone(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ProxyError>> {
        self.s.poll_reset(cx).map(|r| match (self.side, r) {
            // A client's reset is the client leaving, whatever its reason.
            (Peer::Client, Ok(_)) => Err(ProxyError::ClientClosed),
            (Peer::Client, Err(e)) => Err(client_err(e)),
            (Peer::Server, Ok(h2::Reason::NO_ERROR)) => Ok(()),
            (Peer::Server, Ok(_)) => Err(ProxyError::UpstreamClosed),
            (Peer::Server, Err(e)) => Err(up_err(e)),
        })
    }
}

/// Relay both directions at once until both have ended (each end passed on as a half close),
/// a failure either way, or `idle` without a byte either way: the server's idle timeout until
/// the server's end has ended the client's side, then the client's (only its side is open).
/// `progress` counts the bytes as they are written, so a failed tunnel counts them too.
pub(crate) async fn relay(
    from_client: &mut impl Source,
    to_server: &mut impl Dest,
    from_server: &mut impl Source,
    to_client: &mut impl Dest,
    progress: &Progress,
    idle: Duration,
) -> Result<(), ProxyError> {
    let p = progress;
    let up = direction(from_client, to_server, &p.to_server, &p.up_done, p);
    let down = direction(from_server, to_client, &p.to_client, &p.down_done, p);
    tokio::select! {
        r = async { tokio::try_join!(up, down) } => r.map(|_| ()),
        e = idle_watchdog(&p.last, idle, &p.down_done) => Err(e),
    }
}

/// One direction: bytes from `from` to `to` until `from` ends (passed on) or `to` stops
/// reading; `to` going away while `from` is awaited ends it too.
async fn direction(
    from: &mut impl Source,
    to: &mut impl Dest,
    count: &Cell<u64>,
    done: &Cell<bool>,
    p: &Progress,
) -> Result<(), ProxyError> {
    loop {
        let next = tokio::select! {
            r = from.recv() => r?,
            gone = poll_fn(|cx| to.poll_gone(cx)) => {
                gone?;
                done.set(true);
                return Ok(());
            }
        };
        let Some(d) = next else {
            to.end().await?;
            done.set(true);
            return Ok(());
        };
        p.moved();
        let n = d.len();
        if !to.send(d).await? {
            done.set(true);
            return Ok(());
        }
        from.release(n);
        count.set(count.get() + n as u64);
        p.moved();
    }
}

/// A tunnel's idle timer: done once `idle` passed since `last` (which any byte either way
/// moves). Silence is the upstream's timeout until the upstream's end has ended the client's
/// side (`client_only`); then only the client's side is open, and it is the client's.
async fn idle_watchdog(
    last: &Cell<Instant>,
    idle: Duration,
    client_only: &Cell<bool>,
) -> ProxyError {
    loop {
        let due = last.get() + idle;
        if Instant::now() >= due {
            if client_only.get() {
                return ProxyError::ClientIo(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "client idle after the upstream's end",
                ));
            }
            return ProxyError::UpstreamIdle;
        }
        tokio::time::sleep_until(due).await;
    }
}

/// A socket write (or shutdown) that must make progress within `limit`: a peer that stops
/// reading would otherwise hang the tunnel for ever, as the idle timer is not polled during a
/// write. Stalled, it is a client timeout for a client, the idle timeout for a server.
async fn bounded(
    limit: Duration,
    side: Peer,
    write: impl std::future::Future<Output = io::Result<()>>,
) -> Result<(), ProxyError> {
    match tokio::time::timeout(limit, write).await {
        Ok(r) => r.map_err(|e| side.io(e)),
        Err(_) => match side {
            Peer::Client => Err(ProxyError::ClientIo(io::Error::new(
                io::ErrorKind::TimedOut,
                "tunnel write stalled",
            ))),
            Peer::Server => Err(ProxyError::UpstreamIdle),
        },
    }
}

/// After a failed tunnel, the client's HTTP/2 stream: reset with NO_ERROR when our side of it
/// had ended (END_STREAM sent: its response was complete, RFC 9113 8.1; a no-op on a stream
/// the client already reset), else with CANCEL unless the client is gone.
pub(crate) fn stop_client(send: &mut SendStream<Bytes>, ended: bool, e: &ProxyError) {
    if ended {
        send.send_reset(h2::Reason::NO_ERROR);
    } else if !e.client_gone() {
        send.send_reset(h2::Reason::CANCEL);
    }
}
