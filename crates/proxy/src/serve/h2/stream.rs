//! One HTTP/2 stream: translate its head, run it through the flow with the stream as its client, record it once.

use super::request::to_http1;
use crate::downstream::answer;
use crate::downstream::http2::H2Down;
use crate::downstream::link::{Current, Link};
use crate::error::ProxyError;
use crate::telemetry::stats::Outcome;
use crate::telemetry::stats::Phase;
use crate::telemetry::timing::Timings;
use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use portico_http1::RequestHead;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// A stream being served.
struct Stream<'a> {
    link: &'a Link,
    cur: Rc<Current>,
    respond: RefCell<SendResponse<Bytes>>,
    body: RecvStream,
    /// Phase timings for the access log (the head is complete when the stream arrives).
    timings: Timings,
}

/// Serve one stream; exactly one termination record and one access-log line. The head is
/// translated before the stream's future is made, so that future holds the translated head
/// only (not the `http` request and its parts as well: it is moved into the heap once per
/// stream, and every byte of it is copied).
pub(super) fn handle<'l>(
    link: &'l Link,
    req: http::Request<RecvStream>,
    respond: SendResponse<Bytes>,
) -> impl std::future::Future<Output = ()> + 'l {
    let started = Instant::now();
    let cur = link.current();
    cur.shared.stats.requests.fetch_add(1, Ordering::Relaxed);
    let (parts, body) = req.into_parts();
    let has_body = !body.is_end_stream();
    // An extended CONNECT (RFC 8441) becomes an HTTP/1.1 upgrade request (`downstream::tunnel`).
    let translated = match protocol(&parts) {
        None => to_http1(&parts, has_body, &cur.ls.limits),
        Some(p) => translate(&parts, p, &cur.ls.limits),
    };
    let translated = translated
        .map_err(|reject| crate::serve::refusal(reject, link.peer, protocol(&parts), "HTTP/2"));
    drop(parts);
    let (head, refused) = match translated {
        Ok(head) => (Some(head), None),
        Err(e) => (None, Some(e)),
    };
    async move {
        let mut s = Stream {
            link,
            cur,
            respond: RefCell::new(respond),
            body,
            timings: Timings::begin(started),
        };
        // Borrowed: the head stays where the future keeps it, not copied into a second slot.
        let outcome = match (&head, refused) {
            (Some(head), _) => s.run(head, started).await,
            (None, e) => {
                let e = e.unwrap_or(ProxyError::Internal("an HTTP/2 stream without a head"));
                s.refused(e).await
            }
        };
        // A stream the client reset before its end (any phase) counts towards the rapid-reset
        // limit.
        if outcome.termination == ProxyError::ClientClosed.termination(outcome.termination.phase) {
            link.client_reset();
        }
        s.cur.shared.stats.record(outcome.termination);
        let tls = link.tls_info.as_ref().map(|(v, sni)| (*v, sni.as_deref()));
        crate::serve::finished(
            &s.cur.shared,
            &s.cur.ls,
            link.peer,
            head.as_ref(),
            "HTTP/2.0",
            &outcome,
            &s.timings,
            started,
            tls,
            None,
        );
    }
}

impl Stream<'_> {
    /// Route and run the request: the one flow, with this stream as its client.
    async fn run(&mut self, head: &RequestHead, started: Instant) -> Outcome {
        let cur = self.cur.clone();
        let mut down = H2Down {
            link: self.link,
            ls: &cur.ls,
            shared: &cur.shared,
            respond: &self.respond,
            body: &mut self.body,
            timings: &mut self.timings,
            client: None,
        };
        crate::flow::serve(&mut down, head, started).await
    }

    /// A stream refused before it had a head: its error answer and outcome.
    async fn refused(&mut self, e: ProxyError) -> Outcome {
        let limit = self.cur.ls.listener.limits.send_timeout;
        let respond = self.respond.get_mut();
        answer::fail(
            respond,
            self.link.peer,
            None,
            e,
            Phase::RequestHead,
            &[],
            limit,
        )
        .await
    }
}

/// The `:protocol` of an extended CONNECT (the h2 crate hands it over as an extension, only
/// when the connection advertised SETTINGS_ENABLE_CONNECT_PROTOCOL).
fn protocol(parts: &http::request::Parts) -> Option<&str> {
    parts
        .extensions
        .get::<h2::ext::Protocol>()
        .map(|p| p.as_str())
}

/// An extended CONNECT as the HTTP/1.1 upgrade request for the upstream, with a fresh
/// `Sec-WebSocket-Key` (`request::extended_to_http1`).
fn translate(
    parts: &http::request::Parts,
    protocol: &str,
    limits: &portico_http1::Limits,
) -> Result<RequestHead, super::request::Reject> {
    super::request::extended_to_http1(parts, protocol, &crate::websocket::new_key(), limits)
}
