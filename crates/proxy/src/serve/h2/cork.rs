//! The client stream of an HTTP/2 connection, corked: the frames the `h2` crate writes during one poll of the connection collect in one buffer and leave in one write after it; the frames read are followed for unsolicited PING ACKs.

use super::frame_scan::FrameScan;
use crate::stream::ClientStream;
use bytes::BytesMut;
use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Buffered bytes above which writes wait for the socket (backpressure to the `h2` crate).
const HIGH: usize = 256 * 1024;

/// The buffer's size when writes start (again, after [`Cork::release`]).
const INITIAL: usize = 16 * 1024;

struct Inner<S> {
    io: S,
    /// Bytes read from `io` before the cork (the preface the HTTP/1 path found), read first.
    read_ahead: BytesMut,
    buf: Vec<u8>,
    /// Bytes of `buf` already written.
    pos: usize,
    /// Bytes were written to `io` that its flush has not yet confirmed (over TLS, records can
    /// stay in rustls after a write the socket only partly took).
    flush_due: bool,
    /// A write error seen while draining, reported to the `h2` crate at its next read or write.
    failed: Option<io::ErrorKind>,
    /// Writes taken so far (the connection loop tells a quiet connection by it).
    writes: u64,
    /// Frame boundaries of what the client sent, for counting its PING ACKs.
    scan: FrameScan,
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

/// Cork `io`, from which `read_ahead` was already read: the stream for the `h2` crate and the
/// handle that drains it.
pub(crate) fn cork<S>(io: S, read_ahead: BytesMut) -> (Corked<S>, Cork<S>) {
    let inner = Rc::new(RefCell::new(Inner {
        io,
        read_ahead,
        buf: Vec::with_capacity(INITIAL),
        pos: 0,
        flush_due: false,
        failed: None,
        writes: 0,
        scan: FrameScan::new(),
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
                Poll::Ready(Ok(n)) => {
                    self.pos += n;
                    self.flush_due = true;
                }
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
            self.buf.shrink_to(INITIAL);
        }
        // Pending keeps `flush_due`: the socket's writability wakes the loop, which drains again.
        let r = std::task::ready!(Pin::new(&mut self.io).poll_flush(cx));
        match r {
            Ok(()) => self.flush_due = false,
            Err(ref e) => self.failed = Some(e.kind()),
        }
        Poll::Ready(r)
    }

    /// Drop the bytes already written, so a client that never quite catches up does not grow
    /// the buffer with everything it was ever sent.
    fn compact(&mut self) {
        if self.pos > 0 && (self.pos >= 64 * 1024 || self.pos * 2 >= self.buf.len()) {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
    }
}

impl<S: AsyncWrite + Unpin> Cork<S> {
    /// Write what the last poll of the connection buffered. Pending (the socket is full) wakes
    /// the caller when it is writable again; an error is kept for the `h2` crate, which then
    /// ends the connection at its next poll (the caller is woken for it).
    pub fn drain(&self, cx: &mut Context<'_>) {
        let mut inner = self.0.borrow_mut();
        if inner.pos == inner.buf.len() && !inner.flush_due && inner.failed.is_none() {
            return;
        }
        if let Poll::Ready(Err(_)) = inner.poll_drain(cx) {
            cx.waker().wake_by_ref();
        }
    }

    /// Give the buffer back when everything in it has left (an idle connection holds none;
    /// the next write takes a new one); false when bytes are still leaving.
    pub fn release(&self) -> bool {
        let mut inner = self.0.borrow_mut();
        if inner.pos == inner.buf.len() && !inner.flush_due && inner.failed.is_none() {
            inner.buf = Vec::new();
            inner.pos = 0;
            return true;
        }
        false
    }

    /// Whether it holds a write buffer now.
    pub fn holds_buffer(&self) -> bool {
        self.0.borrow().buf.capacity() > 0
    }

    /// Writes taken so far.
    pub fn writes(&self) -> u64 {
        self.0.borrow().writes
    }

    /// PING ACK frames the client sent since the last call.
    pub fn take_ping_acks(&self) -> u32 {
        self.0.borrow_mut().scan.take_ping_acks()
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
        if inner.scan.pending_ping_acks() > crate::downstream::link::MAX_UNSOLICITED_PING_ACKS {
            // A flood: read no more in this poll of the connection, whose loop takes the count
            // when the poll returns and ends the connection (then reads go on).
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let before = buf.filled().len();
        if !inner.read_ahead.is_empty() {
            let n = buf.remaining().min(inner.read_ahead.len());
            let ahead = inner.read_ahead.split_to(n);
            buf.put_slice(&ahead);
            inner.scan.feed(&ahead);
            if inner.read_ahead.is_empty() {
                // Its buffer goes back.
                inner.read_ahead = BytesMut::new();
            }
            return Poll::Ready(Ok(()));
        }
        let r = Pin::new(&mut inner.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            inner.scan.feed(&buf.filled()[before..]);
        }
        r
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
        inner.compact();
        if inner.buf.capacity() == 0 {
            inner.buf.reserve(INITIAL);
        }
        inner.writes += 1;
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
    use bytes::BytesMut;
    use std::future::poll_fn;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Bytes read before the cork come first, in the reader's pieces, then the stream's; their
    /// buffer goes back once read.
    #[tokio::test]
    async fn bytes_read_ahead_come_first() {
        let (a, mut b) = tokio::io::duplex(1024);
        b.write_all(b" and after").await.unwrap();
        let (mut corked, handle) = cork(a, BytesMut::from(&b"read ahead"[..]));
        let mut small = [0u8; 4];
        corked.read_exact(&mut small).await.unwrap();
        assert_eq!(&small, b"read");
        let mut rest = [0u8; 16];
        let n = corked.read(&mut rest).await.unwrap();
        assert_eq!(&rest[..n], b" ahead");
        assert_eq!(handle.0.borrow().read_ahead.capacity(), 0);
        let n = corked.read(&mut rest).await.unwrap();
        assert_eq!(&rest[..n], b" and after");
    }

    #[tokio::test]
    async fn a_released_buffer_is_given_back_only_once_empty_and_taken_again() {
        let (a, mut b) = tokio::io::duplex(1 << 20);
        let (mut corked, handle) = cork(a, BytesMut::new());
        corked.write_all(b"one").await.unwrap();
        assert!(!handle.release(), "bytes still to send");
        assert!(handle.holds_buffer());
        drain(&handle).await;
        assert!(handle.release());
        assert!(!handle.holds_buffer());
        let before = handle.writes();
        corked.write_all(b"two").await.unwrap();
        assert_eq!(handle.0.borrow().buf.capacity(), super::INITIAL);
        assert!(handle.writes() > before);
        drain(&handle).await;
        let mut buf = [0u8; 8];
        let n = b.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"onetwo");
    }

    #[tokio::test]
    async fn writes_leave_only_when_drained_and_all_of_them_at_shutdown() {
        let (a, mut b) = tokio::io::duplex(1 << 20);
        let (mut corked, handle) = cork(a, BytesMut::new());
        corked.write_all(b"one ").await.unwrap();
        corked.flush().await.unwrap();
        corked.write_all(b"two ").await.unwrap();
        corked.flush().await.unwrap();
        // Nothing has left yet: flushes are deferred.
        let mut buf = [0u8; 16];
        let quick =
            tokio::time::timeout(std::time::Duration::from_millis(20), b.read(&mut buf)).await;
        assert!(quick.is_err(), "bytes left before the drain");
        drain(&handle).await;
        let n = b.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"one two ");
        corked.write_all(b"three").await.unwrap();
        corked.shutdown().await.unwrap();
        let mut rest = Vec::new();
        b.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"three");
    }

    /// A writer that takes at most `take` bytes per write, then is not ready until its next poll,
    /// and whose flush is pending `flush_pending` times before it succeeds.
    struct Slow {
        take: usize,
        ready: bool,
        flush_pending: u32,
        flushed: u32,
    }

    impl tokio::io::AsyncWrite for Slow {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            data: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            if !self.ready {
                self.ready = true;
                cx.waker().wake_by_ref();
                return std::task::Poll::Pending;
            }
            self.ready = false;
            std::task::Poll::Ready(Ok(data.len().min(self.take)))
        }
        fn poll_flush(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            if self.flush_pending > 0 {
                self.flush_pending -= 1;
                cx.waker().wake_by_ref();
                return std::task::Poll::Pending;
            }
            self.flushed += 1;
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    async fn drain<S: tokio::io::AsyncWrite + Unpin>(handle: &super::Cork<S>) {
        poll_fn(|cx| {
            handle.drain(cx);
            std::task::Poll::Ready(())
        })
        .await;
    }

    #[tokio::test]
    async fn a_flush_left_pending_is_retried_at_the_next_drain() {
        // Over TLS a write can leave records in rustls that only the flush pushes out: a drain
        // whose flush was pending must flush again even though its buffer is empty.
        let slow = Slow {
            take: usize::MAX,
            ready: true,
            flush_pending: 1,
            flushed: 0,
        };
        let (mut corked, handle) = cork(slow, BytesMut::new());
        corked.write_all(b"end of a response").await.unwrap();
        drain(&handle).await;
        assert_eq!(handle.0.borrow().io.flushed, 0);
        drain(&handle).await;
        assert_eq!(handle.0.borrow().io.flushed, 1);
        assert!(!handle.0.borrow().flush_due);
    }

    #[tokio::test]
    async fn a_client_that_never_catches_up_does_not_grow_the_buffer() {
        // Each round adds 1,000 bytes and the socket takes 999: the unsent part grows by one
        // byte a round, and what was sent must not stay in the buffer.
        let slow = Slow {
            take: 999,
            ready: true,
            flush_pending: 0,
            flushed: 0,
        };
        let (mut corked, handle) = cork(slow, BytesMut::new());
        let chunk = [1u8; 1000];
        for _ in 0..5_000 {
            corked.write_all(&chunk).await.unwrap();
            drain(&handle).await;
        }
        let inner = handle.0.borrow();
        let unsent = inner.buf.len() - inner.pos;
        assert!(unsent <= 5_000 + 1_000, "{unsent}");
        assert!(inner.buf.len() <= 2 * (64 * 1024), "{}", inner.buf.len());
    }

    #[tokio::test]
    async fn a_full_peer_holds_writes_back_past_the_high_mark() {
        // The peer reads nothing: the pipe takes 1 KiB, the cork HIGH bytes, then writes wait.
        let (a, _b) = tokio::io::duplex(1024);
        let (mut corked, _handle) = cork(a, BytesMut::new());
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
