//! The client stream of an HTTP/2 connection, corked: the frames the `h2` crate writes during one poll of the connection collect in one buffer and leave in one write after it.

use crate::stream::ClientStream;
use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Buffered bytes above which writes wait for the socket (backpressure to the `h2` crate).
const HIGH: usize = 256 * 1024;

struct Inner<S> {
    io: S,
    buf: Vec<u8>,
    /// Bytes of `buf` already written.
    pos: usize,
    /// A write error seen while draining, reported to the `h2` crate at its next read or write.
    failed: Option<io::ErrorKind>,
}

/// The connection loop's handle on the cork: it drains what a poll wrote.
///
/// The `h2` crate flushes its codec after every DATA frame bigger than a few hundred bytes (it
/// keeps such payloads out of its own buffer), so with many streams in flight each response
/// cost a write system call of its own (two over TLS). Here its flushes only mark the bytes as
/// due; [`Cork::drain`], called by the connection loop after every poll of the connection,
/// writes everything the poll produced at once. All of a connection's I/O happens inside that
/// poll (stream tasks only queue frames and wake it), so nothing waits behind the cork.
pub(crate) struct Cork<S = ClientStream>(Rc<RefCell<Inner<S>>>);

/// The stream given to the `h2` crate.
pub(crate) struct Corked<S = ClientStream>(Rc<RefCell<Inner<S>>>);

/// Cork `io`: the stream for the `h2` crate and the handle that drains it.
pub(crate) fn cork<S>(io: S) -> (Corked<S>, Cork<S>) {
    let inner = Rc::new(RefCell::new(Inner {
        io,
        buf: Vec::with_capacity(16 * 1024),
        pos: 0,
        failed: None,
    }));
    (Corked(inner.clone()), Cork(inner))
}

impl<S: AsyncWrite + Unpin> Inner<S> {
    /// Write out everything buffered, then flush the stream (TLS records leave rustls).
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(kind) = self.failed {
            return Poll::Ready(Err(kind.into()));
        }
        while self.pos < self.buf.len() {
            match Pin::new(&mut self.io).poll_write(cx, &self.buf[self.pos..]) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => {
                    self.failed = Some(io::ErrorKind::WriteZero);
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => self.pos += n,
                Poll::Ready(Err(e)) => {
                    self.failed = Some(e.kind());
                    return Poll::Ready(Err(e));
                }
            }
        }
        self.buf.clear();
        self.pos = 0;
        // A big burst must not keep a big buffer for the connection's life.
        if self.buf.capacity() > HIGH {
            self.buf.shrink_to(16 * 1024);
        }
        Pin::new(&mut self.io).poll_flush(cx).map_err(|e| {
            self.failed = Some(e.kind());
            e
        })
    }
}

impl<S: AsyncWrite + Unpin> Cork<S> {
    /// Write what the last poll of the connection buffered. Pending (the socket is full) wakes
    /// the caller when it is writable again; an error is kept for the `h2` crate, which then
    /// ends the connection at its next poll (the caller is woken for it).
    pub fn drain(&self, cx: &mut Context<'_>) {
        let mut inner = self.0.borrow_mut();
        if inner.pos == inner.buf.len() && inner.failed.is_none() {
            return;
        }
        if let Poll::Ready(Err(_)) = inner.poll_drain(cx) {
            cx.waker().wake_by_ref();
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Corked<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let mut inner = self.0.borrow_mut();
        if let Some(kind) = inner.failed {
            return Poll::Ready(Err(kind.into()));
        }
        Pin::new(&mut inner.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> Corked<S> {
    /// Room for more bytes: past [`HIGH`] the buffer drains first.
    fn poll_room(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut inner = self.0.borrow_mut();
        if let Some(kind) = inner.failed {
            return Poll::Ready(Err(kind.into()));
        }
        if inner.buf.len() - inner.pos >= HIGH {
            match inner.poll_drain(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                // Partly written: more room is enough.
                Poll::Pending if inner.buf.len() - inner.pos < HIGH => {}
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Corked<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        std::task::ready!(self.poll_room(cx))?;
        self.0.borrow_mut().buf.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        std::task::ready!(self.poll_room(cx))?;
        let mut inner = self.0.borrow_mut();
        let mut n = 0;
        for b in bufs {
            inner.buf.extend_from_slice(b);
            n += b.len();
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Deferred: the connection loop drains after the poll (see the module comment).
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.0.borrow().failed {
            Some(kind) => Poll::Ready(Err(kind.into())),
            None => Poll::Ready(Ok(())),
        }
    }

    /// The end of the connection: everything buffered leaves before the stream shuts down.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut inner = self.0.borrow_mut();
        std::task::ready!(inner.poll_drain(cx))?;
        Pin::new(&mut inner.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::cork;
    use std::future::poll_fn;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn writes_leave_only_when_drained_and_all_of_them_at_shutdown() {
        let (a, mut b) = tokio::io::duplex(1 << 20);
        let (mut corked, handle) = cork(a);
        corked.write_all(b"one ").await.unwrap();
        corked.flush().await.unwrap();
        corked.write_all(b"two ").await.unwrap();
        corked.flush().await.unwrap();
        // Nothing has left yet: flushes are deferred.
        let mut buf = [0u8; 16];
        let quick =
            tokio::time::timeout(std::time::Duration::from_millis(20), b.read(&mut buf)).await;
        assert!(quick.is_err(), "bytes left before the drain");
        poll_fn(|cx| {
            handle.drain(cx);
            std::task::Poll::Ready(())
        })
        .await;
        let n = b.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"one two ");
        corked.write_all(b"three").await.unwrap();
        corked.shutdown().await.unwrap();
        let mut rest = Vec::new();
        b.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"three");
    }

    #[tokio::test]
    async fn a_full_peer_holds_writes_back_past_the_high_mark() {
        // The peer reads nothing: the pipe takes 1 KiB, the cork HIGH bytes, then writes wait.
        let (a, _b) = tokio::io::duplex(1024);
        let (mut corked, _handle) = cork(a);
        let chunk = vec![7u8; 64 * 1024];
        let mut written = 0usize;
        let r = tokio::time::timeout(std::time::Duration::from_millis(100), async {
            loop {
                written += corked.write(&chunk).await.unwrap();
            }
        })
        .await;
        assert!(r.is_err());
        assert!(written >= super::HIGH, "{written}");
        assert!(written <= super::HIGH + 2 * chunk.len(), "{written}");
    }
}
