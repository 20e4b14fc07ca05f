//! The small answers of a multiplexed stream (HTTP/2 or HTTP/3), written once for both: an error's status and body, a local response, their outcomes, and the request id field they carry.

use crate::error::ProxyError;
use crate::telemetry::stats::{Outcome, Phase};
use portico_http1::{Method, RequestHead};
use std::net::SocketAddr;
use std::time::Duration;

/// A stream that can send a small complete response made here.
pub(crate) trait Answer {
    /// The protocol, for log lines.
    const PROTOCOL: &'static str;
    /// `status` with `content_type`, `extra` fields and `body` (none when `head_only`, and none
    /// on 204 and 304), each write within `limit`; the body bytes sent.
    async fn simple(
        &mut self,
        status: u16,
        content_type: &str,
        body: &[u8],
        extra: &[(&str, &str)],
        head_only: bool,
        limit: Duration,
    ) -> Result<u64, ProxyError>;
}

/// Whether a small answer goes without a body: asked so (`HEAD`), by its status (204, 304), or
/// empty.
pub(crate) fn bodyless(status: u16, head_only: bool, body: &[u8]) -> bool {
    head_only || status == 204 || status == 304 || body.is_empty()
}

/// A failed request from `peer`: logged, answered with its error status (unless the client is
/// gone), and its outcome.
pub(crate) async fn fail<A: Answer>(
    a: &mut A,
    peer: SocketAddr,
    head: Option<&RequestHead>,
    e: ProxyError,
    phase: Phase,
    extra: &[(&str, &str)],
    limit: Duration,
) -> Outcome {
    let target = head.map_or("-", |h| h.target());
    tracing::debug!(%peer, target, "{} request failed: {e}", A::PROTOCOL);
    let body = crate::error::error_body(e.status());
    refusal(a, head, e, phase, body, extra, limit).await
}

/// An error answer (unless the client is gone) with `body` and `extra` fields, and its outcome.
pub(crate) async fn refusal<A: Answer>(
    a: &mut A,
    head: Option<&RequestHead>,
    e: ProxyError,
    phase: Phase,
    body: &[u8],
    extra: &[(&str, &str)],
    limit: Duration,
) -> Outcome {
    let status = e.status();
    let sent = if e.client_gone() {
        0
    } else {
        let head_only = head.is_some_and(|h| *h.method() == Method::Head);
        a.simple(status, "text/plain", body, extra, head_only, limit)
            .await
            .unwrap_or(0)
    };
    Outcome {
        termination: e.termination(phase),
        status,
        keep_alive: true,
        bytes_sent: sent,
        upstream: None,
    }
}

/// A complete small response generated here (redirect, fixed answer) to `head`, and its outcome.
pub(crate) async fn local<A: Answer>(
    a: &mut A,
    head: &RequestHead,
    status: u16,
    content_type: &str,
    body: &[u8],
    extra: &[(&str, &str)],
    limit: Duration,
) -> Outcome {
    let head_only = *head.method() == Method::Head;
    match a
        .simple(status, content_type, body, extra, head_only, limit)
        .await
    {
        Ok(n) => Outcome::ok(status, true, n),
        Err(e) => Outcome {
            termination: e.termination(Phase::ResponseBody),
            status,
            keep_alive: true,
            bytes_sent: 0,
            upstream: None,
        },
    }
}

/// The request id field a local answer to `head` carries, if any (`[request_id]` on).
pub(crate) fn id_field<'a, 'h>(
    shared: &'a crate::state::Shared,
    timings: &crate::telemetry::timing::Timings,
    head: &'h RequestHead,
) -> Option<(&'a str, std::borrow::Cow<'h, str>)> {
    let settings = shared.config.request_id.as_ref();
    crate::telemetry::request_id::answer_field(settings, timings.request_id, head)
}
