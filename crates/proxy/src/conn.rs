//! An HTTP/1.1 connection below the flow: its buffers and timers, writes under the listener's `send_timeout`, error and local answers, `100 Continue`, request bodies under the route's limits, the origin answer.

use crate::date::with_date;
use crate::error::ProxyError;
use crate::state::{ListenerState, Snapshot, Worker};
use crate::stream::ClientStream;
use crate::telemetry::stats::{Outcome, Phase};
use crate::telemetry::timing::Timings;
use bytes::{Bytes, BytesMut};
use portico_http1::{encode, BodyDecoder, Decoded, Framing, RequestHead, Version};
use portico_origin::Body;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::{timeout, timeout_at};

/// Grace period before the minimum body rate is enforced.
pub(crate) const BODY_RATE_GRACE: std::time::Duration = std::time::Duration::from_secs(10);
/// Largest body slice decoded at once.
pub const MAX_CHUNK: usize = 64 * 1024;

/// How long a client sending a body may make no progress when no minimum rate is set (nginx's
/// `client_body_timeout`). Receiving a response is bounded by the listener's `send_timeout`.
pub const STALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Write all of `buf` to a client. Each write is tried directly (no timer when the socket takes
/// it); the client must accept some bytes within `limit` (the listener's `send_timeout`, nginx's
/// `send_timeout`) whenever its window is full, so a client that stops reading cannot pin the
/// task, and a slow one that progresses is not cut off. Expiry is an error of kind `TimedOut`.
pub async fn send_all(
    stream: &mut ClientStream,
    buf: &[u8],
    limit: std::time::Duration,
) -> std::io::Result<()> {
    let stale = || {
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "client accepted no data in time",
        )
    };
    let stream = match stream {
        ClientStream::Plain(s) => s,
        ClientStream::Tls(s) => {
            // rustls takes the bytes into its buffer (a write returns once some were taken, which
            // needs room freed by the client reading); the flush pushes the last records out.
            let mut off = 0;
            while off < buf.len() {
                match crate::fast_timeout::timeout(limit, s.write(&buf[off..])).await {
                    Err(_) => return Err(stale()),
                    Ok(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
                    Ok(Ok(n)) => off += n,
                    Ok(Err(e)) => return Err(e),
                }
            }
            return match crate::fast_timeout::timeout(limit, s.flush()).await {
                Err(_) => Err(stale()),
                Ok(r) => r,
            };
        }
    };
    let mut off = 0;
    loop {
        match stream.try_write(&buf[off..]) {
            Ok(n) => {
                off += n;
                if off >= buf.len() {
                    return Ok(());
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                match timeout(limit, stream.writable()).await {
                    Err(_) => return Err(stale()),
                    Ok(r) => r?,
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// `first` and then `second`, as [`send_all`] writes one buffer: on plain TCP in one vectored
/// write when the socket takes both (a response's head and a large body: one system call, not
/// two), on TLS one after the other (rustls gathers them into records anyway).
pub async fn send_both(
    stream: &mut ClientStream,
    first: &[u8],
    second: &[u8],
    limit: std::time::Duration,
) -> std::io::Result<()> {
    let mut off = 0;
    if let ClientStream::Plain(s) = stream {
        while off < first.len() {
            let slices = [
                std::io::IoSlice::new(&first[off..]),
                std::io::IoSlice::new(second),
            ];
            match s.try_write_vectored(&slices) {
                Ok(n) => off += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    match timeout(limit, s.writable()).await {
                        Err(_) => {
                            let e = "client accepted no data in time";
                            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, e));
                        }
                        Ok(r) => r?,
                    }
                }
                Err(e) => return Err(e),
            }
        }
    } else {
        send_all(stream, first, limit).await?;
        off = first.len();
    }
    let done = off - first.len();
    match done < second.len() {
        true => send_all(stream, &second[done..], limit).await,
        false => Ok(()),
    }
}

/// `head`, then bytes `at..end` of `file` sent by the kernel from the file (`sendfile`: no copy
/// through the proxy), under `limit` as [`send_all`] writes.
pub async fn send_file(
    s: &tokio::net::TcpStream,
    head: &[u8],
    file: &std::fs::File,
    mut at: u64,
    end: u64,
    limit: std::time::Duration,
) -> std::io::Result<()> {
    use tokio::io::Interest;
    let wait = || async {
        match timeout(limit, s.writable()).await {
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "client accepted no data in time",
            )),
            Ok(r) => r,
        }
    };
    let mut off = 0;
    while off < head.len() {
        // MSG_MORE: the head leaves with the file's first bytes, not in a packet of its own.
        let more = rustix::net::SendFlags::MORE;
        let sent = s.try_io(Interest::WRITABLE, || {
            rustix::net::send(s, &head[off..], more).map_err(std::io::Error::from)
        });
        match sent {
            Ok(n) => off += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => wait().await?,
            Err(e) => return Err(e),
        }
    }
    while at < end {
        let n = usize::try_from(end - at).unwrap_or(usize::MAX).min(1 << 30);
        let sent = s.try_io(Interest::WRITABLE, || {
            rustix::fs::sendfile(s, file, Some(&mut at), n).map_err(std::io::Error::from)
        });
        match sent {
            Ok(0) => {
                let e = "the stored body's file is shorter than its length";
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, e));
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => wait().await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Everything a connection task needs besides its socket.
pub struct Ctx {
    pub ls: Arc<ListenerState>,
    /// The snapshot this connection's current request runs on (refreshed between requests).
    pub shared: Snapshot,
    pub worker: Rc<Worker>,
    pub shutdown: watch::Receiver<bool>,
}

/// A client address as text, for headers, logs and hashing: an IPv4 address is written digit
/// by digit (the standard formatter's padding support costs over a thousand instructions, once
/// per connection); others by the standard formatter.
pub fn ip_text(ip: std::net::IpAddr) -> String {
    let std::net::IpAddr::V4(v4) = ip else {
        return ip.to_string();
    };
    let mut out = String::with_capacity(15);
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        if octet >= 100 {
            out.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            out.push(char::from(b'0' + octet / 10 % 10));
        }
        out.push(char::from(b'0' + octet % 10));
    }
    out
}

/// Downstream connection state.
pub struct Conn {
    pub stream: ClientStream,
    pub peer: SocketAddr,
    pub client_ip: String,
    /// The verified client certificate (mTLS listeners), read once per connection.
    pub client_cert: Option<Box<portico_tls::ClientCert>>,
    pub rbuf: BytesMut,
    pub wbuf: BytesMut,
    /// The request head being sent upstream (kept to reuse its allocation).
    pub ubuf: BytesMut,
    pub requests: u64,
    /// Phase timings of the current request, for the access log.
    pub timings: Timings,
    /// The listener's `limits.send_timeout` (refreshed with the configuration between requests).
    pub send_timeout: std::time::Duration,
    /// The timer of the keep-alive wait and the response head wait, re-armed lazily.
    pub timer: crate::fast_timeout::LazyTimer,
}

/// The write buffer a connection starts with (a response head and a small body fit), and the
/// read buffer it takes when bytes come.
pub const WBUF: usize = 8 * 1024;

/// At most this many spare buffers per worker thread (128 KB).
const SPARE_MAX: usize = 16;

thread_local! {
    /// Buffers this thread's connections gave back when they went to sleep or closed, for the
    /// next connection that needs one: a pop, where the allocator's path for blocks over 1 KB
    /// costs about 300 instructions to allocate and as much again to free, twice per new
    /// connection.
    static SPARE: std::cell::RefCell<Vec<BytesMut>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// How many spare buffers this thread keeps.
#[cfg(test)]
fn spares() -> usize {
    SPARE.with(|s| s.borrow().len())
}

/// An empty buffer of at least [`WBUF`] bytes: a spare one, or a new one.
pub fn spare_buffer() -> BytesMut {
    SPARE
        .with(|s| s.borrow_mut().pop())
        .unwrap_or_else(|| BytesMut::with_capacity(WBUF))
}

/// Keep `buf` as a spare when, emptied, it can take exactly [`WBUF`] bytes without allocating
/// and fewer than [`SPARE_MAX`] are kept; otherwise it is freed. A buffer that grew takes more,
/// one whose allocation a live head or body still shares mostly fewer: both are freed (a grown
/// and shared one that takes exactly [`WBUF`] is kept, which is rare and bounded by the cap).
pub fn give_back(mut buf: BytesMut) {
    buf.clear();
    if !buf.try_reclaim(WBUF) || buf.capacity() != WBUF {
        return;
    }
    SPARE.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < SPARE_MAX {
            s.push(buf);
        }
    });
}

/// The upstream request head's buffer a connection starts with.
const UBUF: usize = 1024;

impl Conn {
    /// An idle or closing connection gives its buffers back (as spares, [`give_back`]),
    /// keeping `read` bytes to read its next request into. An idle connection's read buffer
    /// must be empty (a closing one's unread bytes are dropped).
    pub fn release_buffers(&mut self, read: usize) {
        let rbuf = std::mem::replace(&mut self.rbuf, BytesMut::with_capacity(read));
        give_back(rbuf);
        give_back(std::mem::take(&mut self.wbuf));
        self.ubuf = BytesMut::new();
    }

    /// The write buffers again for a request that came after the buffers were released (or
    /// before they were first taken): taken whole, not grown step by step.
    pub fn restore_buffers(&mut self) {
        if self.wbuf.capacity() == 0 {
            self.wbuf = spare_buffer();
        }
        if self.ubuf.capacity() == 0 {
            self.ubuf.reserve(UBUF);
        }
    }
}

/// When a request head being read is worth parsing: the first bytes at once (a head mostly comes
/// whole in one read), later ones only when they could complete the head, end the request line
/// (checked as soon as it is whole) or break a limit. A head trickled in tiny pieces so costs
/// linear, not quadratic, work.
#[derive(Debug, Default)]
pub(crate) struct HeadScan {
    /// Bytes already searched for the end of the head (0: nothing parsed yet).
    scanned: usize,
    /// A parse saw the request line's end.
    line_checked: bool,
}

impl HeadScan {
    /// Whether `buf`, every byte read so far, is worth parsing now.
    pub fn worth_parsing(&mut self, buf: &[u8], max_head: usize, max_line: usize) -> bool {
        let first = self.scanned == 0;
        // The bytes searched before hold no line end (a parse, or the previous call's search,
        // would have seen it): only the new ones are searched.
        let newline = !first && !self.line_checked && line_ended(buf, self.scanned);
        let worth = first
            || newline
            || head_may_be_complete(buf, self.scanned)
            || buf.len() > max_head
            || (!self.line_checked && buf.len() > max_line);
        self.scanned = buf.len();
        worth
    }

    /// A parse of `buf` found the head incomplete.
    pub fn incomplete(&mut self, buf: &[u8]) {
        if !self.line_checked {
            self.line_checked = line_ended(buf, 0);
        }
    }

    /// The bytes read so far were dropped (empty lines before a request).
    pub fn restart(&mut self) {
        self.scanned = 0;
    }
}

/// Whether the request line in `buf` has ended: a LF after the empty lines that may lead it,
/// searched for from `from` on (the bytes before it known to hold none after those lines).
fn line_ended(buf: &[u8], from: usize) -> bool {
    buf.iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .is_some_and(|start| {
            buf.get(start.max(from)..)
                .is_some_and(|t| t.contains(&b'\n'))
        })
}

/// Whether `buf` holds the end of a head that may have been cut at `from`: CRLF CRLF, or a bare
/// LF pair the parser will refuse. Only the new bytes (and 3 before them) are searched.
pub fn head_may_be_complete(buf: &[u8], from: usize) -> bool {
    let mut i = from.saturating_sub(3);
    // Walk line ends only, stopping at the first that ends an empty line: proportional to the
    // head, not to any body bytes that arrived with it.
    while let Some(p) = buf
        .get(i..)
        .and_then(|t| t.iter().position(|&b| b == b'\n'))
    {
        let nl = i + p;
        match buf.get(nl + 1..) {
            Some([b'\n', ..]) | Some([b'\r', b'\n', ..]) => return true,
            _ => i = nl + 1,
        }
    }
    false
}

/// Decide whether the connection may carry another request after this response.
pub fn may_keep_alive(c: &Conn, ctx: &Ctx, head: &RequestHead) -> bool {
    let max = ctx.ls.listener.limits.max_requests_per_connection;
    head.keep_alive && !*ctx.shutdown.borrow() && (max == 0 || c.requests < max)
}

/// The request id field a local answer to `head` carries, if any.
pub(crate) fn answer_id<'x>(
    c: &Conn,
    ctx: &'x Ctx,
    head: &'x RequestHead,
) -> Option<(&'x str, std::borrow::Cow<'x, str>)> {
    let settings = ctx.shared.config.request_id.as_ref();
    crate::telemetry::request_id::answer_field(settings, c.timings.request_id, head)
}

/// Answer with an error status (if the client is still there) and record the failure.
pub async fn fail(
    c: &mut Conn,
    ctx: &Ctx,
    head: &RequestHead,
    e: ProxyError,
    phase: Phase,
    body_done: bool,
) -> Outcome {
    let t = e.termination(phase);
    tracing::debug!(peer = %c.peer, target = head.target(), "request failed: {e}");
    let status = e.status();
    let body_done = body_done || !head.has_body();
    let ka = body_done && may_keep_alive(c, ctx, head);
    let sent = if e.client_gone() {
        0
    } else {
        let id = answer_id(c, ctx, head);
        write_simple(
            c,
            status,
            "text/plain",
            crate::error::error_body(status),
            ka,
            Some(head),
            id.as_ref().map(|(n, v)| (*n, &**v)).as_slice(),
        )
        .await
        .unwrap_or(0)
    };
    Outcome {
        termination: t,
        status,
        keep_alive: ka && !e.client_gone(),
        bytes_sent: sent,
        upstream: None,
    }
}

/// Write the framing-related tail of a locally generated head: Date, Connection, end.
fn end_local_head(out: &mut BytesMut, keep_alive: bool, version: Version) {
    with_date(|d| encode::field(out, "Date", d.as_bytes()));
    if !keep_alive {
        encode::field(out, "Connection", b"close");
    } else if version == Version::Http10 {
        encode::field(out, "Connection", b"keep-alive");
    }
    encode::end_head(out);
}

/// Write a complete small response generated by Portico itself, in answer to `req` (None when
/// the request head could not be parsed). A HEAD request gets the length but not the body; a 503
/// says when to retry.
pub async fn write_simple(
    c: &mut Conn,
    status: u16,
    content_type: &str,
    body: &[u8],
    keep_alive: bool,
    req: Option<&RequestHead>,
    extra: &[(&str, &str)],
) -> Result<u64, ProxyError> {
    let version = req.map_or(Version::Http11, |r| r.version());
    let head_only = req.is_some_and(|r| r.method() == &portico_http1::Method::Head);
    c.wbuf.clear();
    encode::status_line(&mut c.wbuf, status, "");
    encode::field(&mut c.wbuf, "Server", b"portico");
    for (n, v) in extra {
        encode::field(&mut c.wbuf, n, v.as_bytes());
    }
    if status == 503 {
        encode::field(&mut c.wbuf, "Retry-After", b"1");
    }
    // 204 and 304 carry no body and no Content-Length (RFC 9110 8.6).
    let bodyless = status == 204 || status == 304;
    if !bodyless {
        encode::field(&mut c.wbuf, "Content-Type", content_type.as_bytes());
        encode::content_length(&mut c.wbuf, body.len() as u64);
    }
    end_local_head(&mut c.wbuf, keep_alive, version);
    if !head_only && !bodyless {
        c.wbuf.extend_from_slice(body);
    }
    let n = c.wbuf.len() as u64;
    send_all(&mut c.stream, &c.wbuf, c.send_timeout)
        .await
        .map_err(ProxyError::ClientIo)?;
    c.wbuf.clear();
    Ok(n)
}

/// Send `100 Continue` if the client waits for it before sending a body.
pub async fn send_continue(c: &mut Conn, head: &RequestHead) -> Result<(), ProxyError> {
    if head.expect_continue && head.framing != Framing::None && head.version() == Version::Http11 {
        send_all(
            &mut c.stream,
            b"HTTP/1.1 100 Continue\r\n\r\n",
            c.send_timeout,
        )
        .await
        .map_err(ProxyError::ClientIo)?;
    }
    Ok(())
}

/// A request body being read from the client under the route's limits.
pub struct ClientBody {
    decoder: BodyDecoder,
    max: u64,
    min_rate: u64,
    received: u64,
    started: tokio::time::Instant,
    pub trailers: Bytes,
}

impl ClientBody {
    pub fn new(framing: Framing, max: u64, min_rate: u64) -> Self {
        ClientBody {
            decoder: BodyDecoder::new(framing),
            max,
            min_rate,
            received: 0,
            started: tokio::time::Instant::now(),
            trailers: Bytes::new(),
        }
    }

    pub fn is_done(&self) -> bool {
        self.decoder.is_done()
    }

    /// The next slice of payload, or `None` when the body is complete (trailers kept in `self`).
    pub async fn next<R: AsyncRead + Unpin>(
        &mut self,
        stream: &mut R,
        rbuf: &mut BytesMut,
    ) -> Result<Option<Bytes>, ProxyError> {
        loop {
            if self.decoder.is_done() {
                return Ok(None);
            }
            match self
                .decoder
                .decode(rbuf, MAX_CHUNK)
                .map_err(ProxyError::BadBody)?
            {
                Decoded::Data(d) => {
                    self.received += d.len() as u64;
                    if self.max > 0 && self.received > self.max {
                        return Err(ProxyError::BodyTooLarge);
                    }
                    return Ok(Some(d));
                }
                Decoded::Done { trailers } => {
                    self.trailers = trailers;
                    return Ok(None);
                }
                Decoded::NeedMore => {}
            }
            if rbuf.capacity() - rbuf.len() < 4096 {
                rbuf.reserve(MAX_CHUNK);
            }
            let read = stream.read_buf(rbuf);
            let due = body_byte_due(self.started, self.received, self.min_rate, BODY_RATE_GRACE);
            let r = match due {
                Some(due) => timeout_at(due, read).await,
                None => timeout(STALL_TIMEOUT, read).await,
            };
            match r {
                Err(_) => return Err(ProxyError::BodyTooSlow),
                Ok(Ok(0)) => {
                    self.decoder
                        .on_eof()
                        .map_err(|_| ProxyError::ClientClosed)?;
                    return Ok(None);
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(ProxyError::ClientIo(e)),
            }
        }
    }
}

/// When the next body byte is due for the average rate since `started` to stay at or above
/// `min_rate` bytes/s once `grace` has passed; `None` when the rate is not checked.
pub fn body_byte_due(
    started: tokio::time::Instant,
    received: u64,
    min_rate: u64,
    grace: std::time::Duration,
) -> Option<tokio::time::Instant> {
    if min_rate == 0 {
        return None;
    }
    let allowed = std::time::Duration::from_secs_f64((received + 1) as f64 / min_rate as f64);
    Some(started + grace + allowed)
}

/// Write `data` to `w` with the framing chosen for it (chunked adds size line and CRLF).
pub async fn write_framed<W: AsyncWrite + Unpin>(
    w: &mut W,
    scratch: &mut BytesMut,
    data: &[u8],
    chunked: bool,
) -> std::io::Result<()> {
    if !chunked {
        return w.write_all(data).await;
    }
    scratch.clear();
    encode::chunk_header(scratch, data.len());
    if data.len() <= 16 * 1024 {
        scratch.extend_from_slice(data);
        scratch.extend_from_slice(b"\r\n");
        return w.write_all(scratch).await;
    }
    w.write_all(scratch).await?;
    w.write_all(data).await?;
    w.write_all(b"\r\n").await
}

/// The origin action's answer (`static` and `origin` routes) on an HTTP/1.1 connection.
pub(crate) async fn serve_origin(
    c: &mut Conn,
    ctx: &Ctx,
    head: &RequestHead,
    origin: &portico_origin::Origin,
) -> Outcome {
    let ka = may_keep_alive(c, ctx, head);
    c.wbuf.clear();
    let reply = origin.respond(head, &mut c.wbuf);
    if let Some((name, id)) = answer_id(c, ctx, head) {
        encode::field(&mut c.wbuf, name, id.as_bytes());
    }
    end_local_head(&mut c.wbuf, ka, head.version());
    if let Some(d) = reply.delay {
        tokio::time::sleep(d).await;
    }
    let status = reply.status;
    let result: Result<u64, std::io::Error> = async {
        let mut sent = c.wbuf.len() as u64;
        match reply.body {
            Body::Empty => send_all(&mut c.stream, &c.wbuf, c.send_timeout).await?,
            Body::Bytes(b) => {
                sent += b.len() as u64;
                if b.len() <= 16 * 1024 {
                    c.wbuf.extend_from_slice(&b);
                    send_all(&mut c.stream, &c.wbuf, c.send_timeout).await?;
                } else {
                    send_all(&mut c.stream, &c.wbuf, c.send_timeout).await?;
                    send_all(&mut c.stream, &b, c.send_timeout).await?;
                }
            }
            Body::File {
                mut file,
                offset,
                len,
            } => {
                use std::io::{Read, Seek, SeekFrom};
                send_all(&mut c.stream, &c.wbuf, c.send_timeout).await?;
                file.seek(SeekFrom::Start(offset))?;
                let mut left = len;
                let mut buf = vec![0u8; (len.min(MAX_CHUNK as u64)) as usize];
                while left > 0 {
                    let want = left.min(buf.len() as u64) as usize;
                    let n = file.read(&mut buf[..want])?;
                    if n == 0 {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            "file shrank while serving",
                        ));
                    }
                    send_all(&mut c.stream, &buf[..n], c.send_timeout).await?;
                    left -= n as u64;
                    sent += n as u64;
                }
            }
        }
        Ok(sent)
    }
    .await;
    c.wbuf.clear();
    match result {
        Ok(n) => Outcome::ok(status, ka, n),
        Err(e) => Outcome {
            termination: ProxyError::ClientIo(e).termination(Phase::ResponseBody),
            status,
            keep_alive: false,
            bytes_sent: 0,
            upstream: None,
        },
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn buffers_given_back_are_taken_again_when_nothing_shares_them() {
        use super::{give_back, spare_buffer, spares, SPARE_MAX, WBUF};
        // Each test runs on its own thread: this one's spares start empty.
        assert_eq!(spares(), 0);
        let mut a = spare_buffer();
        assert!(a.capacity() >= WBUF && a.is_empty());
        a.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        let at = a.as_ptr();
        give_back(a);
        assert_eq!(spares(), 1);
        let b = spare_buffer();
        assert_eq!(b.as_ptr(), at, "the spare is taken again");
        assert!(b.is_empty() && b.capacity() >= WBUF);
        assert_eq!(spares(), 0);
        // A head split from it and still alive (it can take fewer than WBUF): freed, not kept.
        let mut c = b;
        c.extend_from_slice(b"abc");
        let head = c.split_to(3).freeze();
        give_back(c);
        assert_eq!(spares(), 0);
        drop(head);
        // Once the head is gone, the whole allocation comes back.
        let mut d = spare_buffer();
        d.extend_from_slice(b"abc");
        let head = d.split_to(3).freeze();
        let at = head.as_ptr();
        drop(head);
        give_back(d);
        assert_eq!(spares(), 1);
        let d = spare_buffer();
        assert_eq!((d.as_ptr(), d.capacity() >= WBUF), (at, true));
        // Grown: freed.
        let mut e = d;
        e.reserve(2 * WBUF);
        give_back(e);
        assert_eq!(spares(), 0);
        // At most SPARE_MAX are kept.
        let many: Vec<_> = (0..SPARE_MAX + 5).map(|_| spare_buffer()).collect();
        many.into_iter().for_each(give_back);
        assert_eq!(spares(), SPARE_MAX);
    }

    #[test]
    fn ip_text_is_the_standard_text() {
        for ip in [
            "0.0.0.0",
            "127.0.0.1",
            "10.0.100.9",
            "192.168.1.255",
            "255.255.255.255",
            "1.20.30.199",
            "::1",
            "::ffff:1.2.3.4",
            "2001:db8::8a2e:370:7334",
        ] {
            let ip: std::net::IpAddr = ip.parse().unwrap();
            assert_eq!(super::ip_text(ip), ip.to_string());
        }
        for o in 0..=255u8 {
            let ip = std::net::IpAddr::from([o, 255 - o, o / 3, 7]);
            assert_eq!(super::ip_text(ip), ip.to_string());
        }
    }

    use super::{body_byte_due, head_may_be_complete, HeadScan};
    use std::time::Duration;

    #[test]
    fn body_rate_deadline_grows_with_bytes_received() {
        let t0 = tokio::time::Instant::now();
        let grace = Duration::from_secs(10);
        assert_eq!(body_byte_due(t0, 0, 0, grace), None, "rate check off");
        // 1 KiB/s: the first byte is due right after the grace period...
        let first = body_byte_due(t0, 0, 1024, grace).unwrap();
        assert!(first - t0 >= grace && first - t0 < grace + Duration::from_millis(2));
        // ...and after 10 KiB the next is due 10 s later than that.
        let later = body_byte_due(t0, 10 * 1024, 1024, grace).unwrap();
        assert!(later - first >= Duration::from_secs(10) - Duration::from_millis(1));
    }

    #[test]
    fn head_end_is_found_across_read_boundaries() {
        let head = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
        assert!(head_may_be_complete(head, 0));
        // The terminator straddles the previous scan position.
        assert!(head_may_be_complete(head, head.len() - 1));
        assert!(head_may_be_complete(head, head.len() - 3));
        assert!(!head_may_be_complete(b"GET / HTTP/1.1\r\nHost: a\r\n", 0));
        // Bare LF pairs are handed to the parser too, which refuses them.
        assert!(head_may_be_complete(b"GET / HTTP/1.1\nHost: a\n\n", 10));
        assert!(!head_may_be_complete(b"", 0));
    }

    #[test]
    fn a_head_is_parsed_at_its_first_bytes_its_line_end_and_its_end() {
        // Trickled one byte at a time: three parses (first byte, line end, head end), not one
        // per byte.
        let head = b"GET /a HTTP/1.1\r\nHost: a\r\nX-Long: aaaaaaaaaaaaaaaaaaaa\r\n\r\n";
        let mut scan = HeadScan::default();
        let mut parsed = Vec::new();
        for n in 1..=head.len() {
            if scan.worth_parsing(&head[..n], 8192, 4096) {
                parsed.push(n);
                scan.incomplete(&head[..n]);
            }
        }
        let line_end = head.iter().position(|&b| b == b'\n').unwrap() + 1;
        assert_eq!(parsed, [1, line_end, head.len()]);
        // A line already seen whole (in the first read) is not parsed again at the next line.
        let mut scan = HeadScan::default();
        assert!(scan.worth_parsing(b"GET / HTTP/1.1\r\nHo", 8192, 4096));
        scan.incomplete(b"GET / HTTP/1.1\r\nHo");
        assert!(!scan.worth_parsing(b"GET / HTTP/1.1\r\nHost: a\r\n", 8192, 4096));
        // Limits: a request line or a head over its limit is parsed (and refused there).
        let mut scan = HeadScan::default();
        assert!(scan.worth_parsing(b"GET /aaaa", 8192, 8));
        scan.incomplete(b"GET /aaaa");
        assert!(scan.worth_parsing(b"GET /aaaaaaaa", 8192, 8));
        // Empty lines before the request line do not end it: its limit still holds.
        let mut scan = HeadScan::default();
        assert!(scan.worth_parsing(b"\r\nGET /a", 8192, 12));
        scan.incomplete(b"\r\nGET /a");
        assert!(!scan.worth_parsing(b"\r\nGET /aa", 8192, 12));
        assert!(scan.worth_parsing(b"\r\nGET /aaaaaaa", 8192, 12));
        // Dropped empty lines: the next bytes are first bytes again.
        scan.restart();
        assert!(scan.worth_parsing(b"G", 8192, 4096));
    }
}
