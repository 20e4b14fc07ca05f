//! One HTTP/3 request stream: its head read and translated (as an HTTP/2 one is), whether a body follows, the flow with the stream as its client, one record.

use crate::downstream::answer;
use crate::downstream::http3::{h3_err, H3Down, H3Recv, StreamBody};
use crate::downstream::link::Link;
use crate::error::ProxyError;
use crate::serve::h2::request::to_http1;
use crate::serve::refusal;
use crate::telemetry::stats::{Outcome, Phase};
use crate::telemetry::timing::Timings;
use bytes::{Buf, Bytes};
use portico_http1::RequestHead;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// A request stream's resolver, as the `h3` connection hands it over.
pub(super) type Resolver = h3::server::RequestResolver<h3_quinn::Connection, Bytes>;

/// Serve one request stream; exactly one termination record and one access-log line for a
/// stream whose head arrived (a stream without a head within `head_timeout` is dropped, as
/// an HTTP/1.1 connection that sends nothing is).
pub(super) async fn handle(
    link: Rc<Link>,
    conn: quinn::Connection,
    resolver: Resolver,
    early: bool,
) {
    let cur = link.current();
    let limits = cur.ls.listener.limits;
    let resolved = tokio::time::timeout(limits.head_timeout, resolver.resolve_request()).await;
    let (req, stream) = match resolved {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            tracing::debug!(peer = %link.peer, "HTTP/3 request head refused: {e}");
            return;
        }
        Err(_) => {
            tracing::debug!(peer = %link.peer, "HTTP/3 request head not received in time");
            return;
        }
    };
    let started = Instant::now();
    cur.shared.stats.requests.fetch_add(1, Ordering::Relaxed);
    let (mut parts, ()) = req.into_parts();
    // Early data (RFC 8470): a request that came before the handshake completed could be a
    // replay. Safe methods go on, marked so that the server can answer 425 itself; others wait
    // for the client to send them again.
    let early = early.then(|| early_data(&mut parts));
    let (mut send, mut recv) = stream.split();
    let mut timings = Timings::begin(started);
    let due = tokio::time::Instant::from_std(started) + limits.head_timeout;
    let body = match early {
        Some(Err(e)) => Err(e),
        _ => body_follows(&parts, &mut recv, due).await,
    };
    let (head, outcome) = match body {
        Err(e) => {
            let o = answer::fail(
                &mut send,
                link.peer,
                None,
                e,
                Phase::RequestHead,
                &[],
                limits.send_timeout,
            );
            (None, o.await)
        }
        Ok(body) => {
            let translated = to_http1(&parts, !body.ended, &cur.ls.limits)
                .map_err(|reject| refusal(reject, link.peer, None, "HTTP/3"));
            drop(parts);
            match translated {
                Ok(head) => {
                    let mut down = H3Down {
                        link: &link,
                        ls: &cur.ls,
                        shared: &cur.shared,
                        send: &mut send,
                        recv: &mut recv,
                        body,
                        timings: &mut timings,
                        client: None,
                    };
                    // A connection that closes ends its requests at once (their upstream work
                    // too), as a reset HTTP/2 stream does.
                    let o = tokio::select! {
                        o = crate::flow::serve(&mut down, &head, started) => o,
                        _ = conn.closed() => gone(),
                    };
                    (Some(head), o)
                }
                Err(e) => {
                    let limit = limits.send_timeout;
                    let o = answer::fail(
                        &mut send,
                        link.peer,
                        None,
                        e,
                        Phase::RequestHead,
                        &[],
                        limit,
                    );
                    (None, o.await)
                }
            }
        }
    };
    // The stream's halves go with this task: a body not read to its end gets STOP_SENDING.
    finish(
        &link,
        &cur,
        head.as_ref(),
        &outcome,
        &timings,
        started,
        &conn,
    );
}

/// A request that came as early data: `Early-Data: 1` added for a safe method (the client's
/// own copies removed), else refused with 425.
fn early_data(parts: &mut http::request::Parts) -> Result<(), ProxyError> {
    use http::Method;
    if !matches!(parts.method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return Err(ProxyError::TooEarly);
    }
    parts
        .headers
        .insert("early-data", http::HeaderValue::from_static("1"));
    Ok(())
}

/// The outcome of a request whose connection closed under it.
fn gone() -> Outcome {
    let e = ProxyError::ClientClosed;
    Outcome {
        termination: e.termination(Phase::ResponseHead),
        status: e.status(),
        keep_alive: false,
        bytes_sent: 0,
        upstream: None,
    }
}

/// Count and log a finished request; a stream the client reset counts towards the reset limit.
fn finish(
    link: &Link,
    cur: &crate::downstream::link::Current,
    head: Option<&RequestHead>,
    outcome: &Outcome,
    timings: &Timings,
    started: Instant,
    conn: &quinn::Connection,
) {
    let closed = conn.close_reason().is_some();
    let quic = || (conn.rtt(), conn.stats().path.lost_packets);
    // (Streams cut by the connection's close are not resets by the client.)
    let reset = ProxyError::ClientClosed.termination(outcome.termination.phase);
    if outcome.termination == reset && !closed {
        link.client_reset();
    }
    cur.shared.stats.record(outcome.termination);
    let tls = link.tls_info.as_ref().map(|(v, sni)| (*v, sni.as_deref()));
    crate::serve::finished(
        &cur.shared,
        &cur.ls,
        link.peer,
        head,
        "HTTP/3.0",
        outcome,
        timings,
        started,
        tls,
        Some(&quic),
    );
}

/// Whether a body follows the head, and what is known of it. HTTP/3 has no END_STREAM flag
/// on HEADERS: a request without `content-length` is read until its first DATA or its end
/// (within the head deadline `due`), so that a GET does not go upstream as a chunked request;
/// one that expects `100-continue` is taken to have a body without waiting.
async fn body_follows(
    parts: &http::request::Parts,
    recv: &mut H3Recv,
    due: tokio::time::Instant,
) -> Result<StreamBody, ProxyError> {
    let length = match parts.headers.get(http::header::CONTENT_LENGTH) {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or(ProxyError::Http2Malformed("invalid content-length"))?,
        ),
    };
    let known = length.is_some() || parts.headers.contains_key(http::header::EXPECT);
    if known {
        return Ok(StreamBody {
            first: None,
            length,
            ended: length == Some(0),
        });
    }
    let first = match tokio::time::timeout_at(due, recv.recv_data()).await {
        // Still open at the deadline: a body that is slow to start.
        Err(_) => {
            return Ok(StreamBody {
                first: None,
                length,
                ended: false,
            })
        }
        Ok(r) => r
            .map_err(h3_err)?
            .map(|mut b| b.copy_to_bytes(b.remaining())),
    };
    Ok(StreamBody {
        ended: first.is_none(),
        first,
        length,
    })
}
