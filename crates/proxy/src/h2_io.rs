//! HTTP/2 stream I/O both sides share: `h2` errors named after the peer they come from, and DATA sent under the peer's flow-control window.

use crate::error::ProxyError;
use bytes::Bytes;
use h2::SendStream;
use std::future::poll_fn;
use std::io;
use std::time::Duration;

/// The peer of an HTTP/2 stream, which names its failures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Peer {
    Client,
    Server,
}

impl Peer {
    /// An `h2` error of a stream with this peer: a reset by a client is the client leaving; I/O
    /// errors keep their kind (a timeout stays a timeout).
    pub(crate) fn error(self, e: h2::Error) -> ProxyError {
        if self == Peer::Client && e.is_reset() && e.is_remote() {
            return ProxyError::ClientClosed;
        }
        let io = if e.is_io() {
            e.into_io()
        } else {
            Some(io::Error::other(e.to_string()))
        };
        match io {
            Some(io) => self.io(io),
            None => self.gone(),
        }
    }

    /// An I/O error on this peer's side.
    pub(crate) fn io(self, e: io::Error) -> ProxyError {
        match self {
            Peer::Client => ProxyError::ClientIo(e),
            Peer::Server => ProxyError::UpstreamIo(e),
        }
    }

    /// The peer granted no window within the wait.
    fn stalled(self) -> ProxyError {
        match self {
            Peer::Client => ProxyError::ClientIo(io::Error::new(
                io::ErrorKind::TimedOut,
                "client granted no flow-control window in time",
            )),
            Peer::Server => ProxyError::UpstreamIdle,
        }
    }

    /// The stream ended under the send.
    fn gone(self) -> ProxyError {
        match self {
            Peer::Client => ProxyError::ClientClosed,
            Peer::Server => ProxyError::UpstreamClosed,
        }
    }
}

/// An `h2` error on a client's stream.
pub(crate) fn client_err(e: h2::Error) -> ProxyError {
    Peer::Client.error(e)
}

/// An `h2` error on a stream to a server.
pub(crate) fn up_err(e: h2::Error) -> ProxyError {
    Peer::Server.error(e)
}

/// Send `data` as DATA frames under the peer's flow-control window, the last one with
/// END_STREAM when `end` (an empty `data` then sends an empty final frame). Each wait for
/// window is bounded by `limit`: a client that grants none in time is a client timeout, a
/// server its idle timeout. Cancel-safe: what was sent is gone from `data`.
pub(crate) async fn send_windowed(
    send: &mut SendStream<Bytes>,
    data: &mut Bytes,
    end: bool,
    limit: Duration,
    to: Peer,
) -> Result<(), ProxyError> {
    if data.is_empty() {
        return match end {
            true => send.send_data(Bytes::new(), true).map_err(|e| to.error(e)),
            false => Ok(()),
        };
    }
    while !data.is_empty() {
        send.reserve_capacity(data.len());
        let capacity = poll_fn(|cx| send.poll_capacity(cx));
        let cap = match crate::fast_timeout::timeout(limit, capacity).await {
            Err(_) => return Err(to.stalled()),
            Ok(None) => return Err(to.gone()),
            Ok(Some(Err(e))) => return Err(to.error(e)),
            Ok(Some(Ok(n))) => n,
        };
        if cap == 0 {
            continue;
        }
        let chunk = data.split_to(cap.min(data.len()));
        send.send_data(chunk, end && data.is_empty())
            .map_err(|e| to.error(e))?;
    }
    Ok(())
}

/// End a stream to the client with an empty DATA frame carrying END_STREAM.
pub(crate) fn finish(send: &mut SendStream<Bytes>) -> Result<(), ProxyError> {
    send.send_data(Bytes::new(), true).map_err(client_err)
}
