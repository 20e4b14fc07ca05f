//! The exchange with an HTTP/1.1 server: a pooled or new connection (stale ones replaced), the forwarded head, the request body streamed while the response head is awaited, interim heads.

use crate::conn::{head_may_be_complete, write_framed};
use crate::downstream::{Client, Env, Interim, Interims, Upload};
use crate::error::ProxyError;
use crate::flow::attempt::{Exchanged, Failed, Picked, UpResponse};
use crate::resilience::retry::Retry;
use crate::telemetry::stats::Phase;
use crate::upstream::pool::UpConn;
use bytes::{Bytes, BytesMut};
use portico_http1::{encode, parse_response, Framing, Limits, Method, RequestHead, ResponseHead};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::timeout;

/// The exchange of one attempt with the HTTP/1.1 server `t`: a pooled connection or a new one
/// (a reused connection the server had closed while idle is replaced once, for requests that
/// can be sent again), then [`exchange`]. Failures are reported to the server's passive checks
/// and offered to `retry`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn exchange_attempt<'a, D: Client<'a>>(
    down: &mut D,
    env: Env<'_>,
    t: &Picked<'_>,
    ubuf: &[u8],
    head: &RequestHead,
    upload: &mut Upload,
    interims: &mut Interims<'a>,
    retry: &mut Retry<'_>,
) -> Exchanged {
    let shared = env.shared;
    let group = t.group();
    let chunked = head.framing == Framing::Chunked;
    let mut fresh_only = false;
    loop {
        let mut connect = None;
        let conn = t.connection(shared, &env.worker.pool, fresh_only, &mut connect, retry);
        let r = conn.await;
        down.timings().connect = connect;
        let (mut up, reused) = match r {
            Ok(u) => u,
            Err((_, Failed::Retry)) => return Exchanged::Retry,
            Err((e, _)) => {
                let body_done = upload.is_done();
                return Exchanged::Failed {
                    e,
                    phase: Phase::Connect,
                    body_done,
                };
            }
        };
        let r = exchange(
            down,
            &mut up,
            ubuf,
            head.method(),
            upload,
            chunked,
            interims,
            group.response_header_timeout,
            group.idle_timeout,
        )
        .await;
        // Once the server sent an interim response the attempt is committed (see `Interims`).
        if interims.seen > 0 {
            retry.commit();
        }
        match r {
            Ok((resp, body_done)) => {
                // One clock read: passive checks, the header-time metric, the access log.
                let got = t.responded(resp.status());
                return Exchanged::Response {
                    resp: UpResponse::H1 { up, head: resp },
                    body_done,
                    reused,
                    got,
                };
            }
            Err((e, phase)) => {
                let untouched = up.rbuf.is_empty() && interims.seen == 0;
                match t.failed(shared, retry, head, &e, phase, reused, untouched) {
                    Failed::Stale => fresh_only = true,
                    Failed::Retry => return Exchanged::Retry,
                    Failed::Fail => {
                        let body_done = upload.is_done();
                        return Exchanged::Failed {
                            e,
                            phase,
                            body_done,
                        };
                    }
                }
            }
        }
    }
}

/// Send the request head, stream the request body while waiting for the response head; return
/// the final response head and whether the request body was completely sent. Interim heads go
/// to `interims` as they arrive: an HTTP/1.1 client's are held while its connection is read for
/// the body, then written at once.
#[allow(clippy::too_many_arguments)]
async fn exchange<'a, D: Client<'a>>(
    down: &mut D,
    up: &mut UpConn,
    ubuf: &[u8],
    method: &Method,
    upload: &mut Upload,
    chunked: bool,
    interims: &mut Interims<'a>,
    header_timeout: Duration,
    idle: Duration,
) -> Result<(ResponseHead, bool), (ProxyError, Phase)> {
    // Most heads fit the socket buffer at once: only arm the timer when they do not.
    let written = match up.stream.try_write(ubuf) {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
        Err(e) => return Err((ProxyError::UpstreamIo(e), Phase::ResponseHead)),
    };
    if written < ubuf.len() {
        // TLS: the records must leave rustls's buffer too (a no-op for plain sockets).
        let write = async {
            up.stream.write_all(&ubuf[written..]).await?;
            up.stream.flush().await
        };
        match timeout(idle, write).await {
            Err(_) => return Err((ProxyError::UpstreamIdle, Phase::ResponseHead)),
            Ok(Err(e)) => return Err((ProxyError::UpstreamIo(e), Phase::ResponseHead)),
            Ok(Ok(())) => {}
        }
    }
    let head_failed = |e: ProxyError| (e, Phase::ResponseHead);
    let (mut ur, mut uw) = up.stream.split();
    if !upload.headless() {
        // While the body streams up, an HTTP/1.1 client's connection is being read for it:
        // interim heads are held until the upload ends (no head timeout runs yet: the body has
        // its own).
        let body_fut = upload_body(down, upload, &mut uw, chunked, idle);
        tokio::pin!(body_fut);
        loop {
            let head_fut = read_response_head(&mut ur, &mut up.rbuf, method);
            tokio::select! {
                biased;
                r = head_fut => match r.map_err(head_failed)? {
                    Head::Interim(raw) => interims.hold(Interim::Raw(raw)).map_err(head_failed)?,
                    Head::Final(h) => {
                        // A success that arrives before the upload ends (a server streaming its
                        // answer while it reads): finish the upload first, so the request is
                        // complete and both connections stay reusable. An early error ends the
                        // upload (the server refused it).
                        if h.status() < 300 {
                            body_fut.await.map_err(|e| (e, Phase::RequestBody))?;
                            return Ok((h, true));
                        }
                        return Ok((h, false));
                    }
                },
                r = &mut body_fut => {
                    r.map_err(|e| (e, Phase::RequestBody))?;
                    break;
                }
            }
        }
    }
    // The upload is over (or there was none): the head timeout runs, and interim heads go out
    // as they arrive (a slow client's write of one does not count against the server).
    let client_io = |e: std::io::Error| (ProxyError::ClientIo(e), Phase::ResponseHead);
    down.flush_interims(interims).await.map_err(client_io)?;
    let mut deadline = tokio::time::Instant::now() + header_timeout;
    loop {
        let head_fut = read_response_head(&mut ur, &mut up.rbuf, method);
        let head = match down.head_wait(deadline, head_fut).await {
            None => return Err((ProxyError::ResponseTimeout, Phase::ResponseHead)),
            Some(r) => r.map_err(head_failed)?,
        };
        match head {
            Head::Final(h) => return Ok((h, true)),
            Head::Interim(raw) => {
                interims.hold(Interim::Raw(raw)).map_err(head_failed)?;
                if interims.holding() {
                    let began = tokio::time::Instant::now();
                    down.flush_interims(interims).await.map_err(client_io)?;
                    deadline += began.elapsed();
                }
            }
        }
    }
}

/// Stream the request body to the server (chunked with its trailers when the client's had no
/// length), releasing an HTTP/2 client's flow-control capacity as it is written.
async fn upload_body<'a, D: Client<'a>, W: AsyncWrite + Unpin>(
    down: &mut D,
    upload: &mut Upload,
    w: &mut W,
    chunked: bool,
    idle: Duration,
) -> Result<(), ProxyError> {
    let mut scratch = BytesMut::new();
    while let Some(data) = upload.next(down).await? {
        let n = data.len();
        if n > 0 {
            // Flushed: a TLS upstream's last records must not stay buffered in rustls when the
            // socket was full.
            let write = async {
                write_framed(w, &mut scratch, &data, chunked).await?;
                w.flush().await
            };
            match timeout(idle, write).await {
                Err(_) => return Err(ProxyError::UpstreamIdle),
                Ok(Err(e)) => return Err(ProxyError::UpstreamIo(e)),
                Ok(Ok(())) => {}
            }
        }
        upload.release(down, n);
    }
    if chunked {
        let mut lines = BytesMut::new();
        upload.trailer_lines(down, &mut lines).await?;
        scratch.clear();
        encode::last_chunk(&mut scratch, &lines);
        let write = async {
            w.write_all(&scratch).await?;
            w.flush().await
        };
        match timeout(idle, write).await {
            Err(_) => return Err(ProxyError::UpstreamIdle),
            Ok(r) => r.map_err(ProxyError::UpstreamIo)?,
        }
    }
    Ok(())
}

/// Write all of `bytes` and flush them (a TLS server's records must leave rustls's buffer),
/// waiting at most `idle` for the server to take them: for requests on connections of their
/// own (mirrored copies, forward auth).
pub(crate) async fn write_within<W: AsyncWrite + Unpin>(
    w: &mut W,
    bytes: &[u8],
    idle: Duration,
) -> Result<(), ProxyError> {
    let write = async {
        w.write_all(bytes).await?;
        w.flush().await
    };
    match timeout(idle, write).await {
        Err(_) => Err(ProxyError::UpstreamIdle),
        Ok(r) => r.map_err(ProxyError::UpstreamIo),
    }
}

/// The final response head (interim ones skipped) within `limit`.
pub(crate) async fn final_head<R: AsyncRead + Unpin>(
    ur: &mut R,
    rbuf: &mut BytesMut,
    method: &Method,
    limit: Duration,
) -> Result<ResponseHead, ProxyError> {
    let read = async {
        loop {
            if let Head::Final(h) = read_response_head(ur, rbuf, method).await? {
                return Ok(h);
            }
        }
    };
    match timeout(limit, read).await {
        Err(_) => Err(ProxyError::ResponseTimeout),
        Ok(r) => r,
    }
}

/// One response head read from an upstream.
pub(crate) enum Head {
    /// An interim (1xx, not 101) head, raw as it came.
    Interim(Bytes),
    /// The final head (101 included).
    Final(ResponseHead),
}

/// Read the next response head: an interim one or the final one. Cancel-safe (what was read
/// stays in `rbuf`), so callers make a new one for each head.
pub(crate) async fn read_response_head<R: AsyncRead + Unpin>(
    ur: &mut R,
    rbuf: &mut BytesMut,
    method: &Method,
) -> Result<Head, ProxyError> {
    let limits = Limits::default();
    // Parse the first bytes at once (a head mostly comes whole), then only when new bytes may
    // end the head (linear work for a trickled head).
    let mut scanned = 0;
    loop {
        if !rbuf.is_empty()
            && (scanned == 0
                || head_may_be_complete(rbuf, scanned)
                || rbuf.len() > limits.max_head_bytes)
        {
            scanned = rbuf.len();
            match parse_response(rbuf, method, &limits) {
                Ok(Some(h)) if (100..200).contains(&h.status()) && h.status() != 101 => {
                    return Ok(Head::Interim(interim_head(&h)));
                }
                Ok(Some(h)) => return Ok(Head::Final(h)),
                Ok(None) => {}
                Err(e) => return Err(ProxyError::BadResponse(e)),
            }
        } else {
            scanned = rbuf.len();
        }
        if rbuf.capacity() - rbuf.len() < 4096 {
            rbuf.reserve(16 * 1024);
        }
        match ur.read_buf(rbuf).await {
            Ok(0) => return Err(ProxyError::UpstreamClosed),
            Ok(_) => {}
            Err(e) => return Err(ProxyError::UpstreamIo(e)),
        }
    }
}

/// An interim head as passed on: the server's status line and fields without the hop-by-hop
/// ones (`Connection`, `Keep-Alive`, ... and those `Connection` names: RFC 9110 7.6.1), as a
/// final response is relayed.
fn interim_head(h: &ResponseHead) -> Bytes {
    let mut out = BytesMut::with_capacity(h.raw().len());
    encode::status_line(&mut out, h.status(), h.reason());
    for (name, value) in h.fields() {
        if !h.is_hop_by_hop(name) {
            encode::field(&mut out, name, value);
        }
    }
    encode::end_head(&mut out);
    out.freeze()
}

#[cfg(test)]
mod tests {

    #[test]
    fn interim_heads_lose_their_hop_by_hop_fields() {
        let mut raw = bytes::BytesMut::from(
            &b"HTTP/1.1 103 Early Hints\r\nConnection: close, x-hop\r\nX-Hop: 1\r\n\
               Keep-Alive: timeout=5\r\nLink: </a.css>; rel=preload\r\n\r\n"[..],
        );
        let limits = portico_http1::Limits::default();
        let h = portico_http1::parse_response(&mut raw, &portico_http1::Method::Get, &limits)
            .unwrap()
            .unwrap();
        assert_eq!(
            &super::interim_head(&h)[..],
            b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
        );
    }

    /// Reads that return the given pieces one by one, then end of file.
    struct Pieces(std::collections::VecDeque<&'static [u8]>);

    impl tokio::io::AsyncRead for Pieces {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            if let Some(p) = self.0.pop_front() {
                buf.put_slice(p);
            }
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_response_head_in_pieces_is_read_whole() {
        let pieces = [
            &b"HTTP/1.1 1"[..],
            b"03 Early Hints\r\n\r\nHTTP/1.1 2",
            b"00 OK\r\nContent-",
            b"Length: 2\r\n",
            b"\r\nok",
        ];
        let mut up = Pieces(pieces.into_iter().collect());
        let mut rbuf = bytes::BytesMut::new();
        let get = portico_http1::Method::Get;
        let first = super::read_response_head(&mut up, &mut rbuf, &get).await;
        assert!(matches!(first, Ok(super::Head::Interim(ref h)) if h.starts_with(b"HTTP/1.1 103")));
        match super::read_response_head(&mut up, &mut rbuf, &get).await {
            Ok(super::Head::Final(h)) => {
                assert_eq!(h.status(), 200);
                assert_eq!(h.field("content-length"), Some(&b"2"[..]));
            }
            _ => panic!("a final head"),
        }
        assert_eq!(&rbuf[..], b"ok");
        // A head cut short by the end of the stream.
        let mut up = Pieces([&b"HTTP/1.1 200 OK\r\n"[..]].into_iter().collect());
        let cut = super::read_response_head(&mut up, &mut bytes::BytesMut::new(), &get).await;
        assert!(matches!(cut, Err(crate::error::ProxyError::UpstreamClosed)));
    }
}
