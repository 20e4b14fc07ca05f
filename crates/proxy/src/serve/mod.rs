//! The connection tasks: an HTTP/1.1 connection's (`h1`), an HTTP/2 connection's with one task per stream (`h2`) and a QUIC connection's with one task per HTTP/3 request stream (`h3`), each handing every request to the flow and recording it when it ends (`finished`); a plain connection's protocol from its first bytes (`sniff`); a multiplexed stream's refused head as its error (`refusal`).

pub mod h1;
pub mod h2;
pub(crate) mod h3;
pub(crate) mod sniff;

use crate::state::{ListenerState, Shared};
use crate::telemetry::access_log::Record;
use crate::telemetry::stats::Outcome;
use crate::telemetry::timing::Timings;
use portico_http1::RequestHead;
use std::net::SocketAddr;
use std::time::Instant;

/// What a finished request leaves behind beyond its counters: its access log line and, when
/// its trace is sampled and spans are exported, its span. Nothing is built when neither is on.
#[allow(clippy::too_many_arguments)]
pub(crate) fn finished(
    shared: &Shared,
    ls: &ListenerState,
    peer: SocketAddr,
    head: Option<&RequestHead>,
    protocol: &str,
    outcome: &Outcome,
    timings: &Timings,
    started: Instant,
    tls: Option<(&'static str, Option<&str>)>,
    quic: Option<&dyn Fn() -> (std::time::Duration, u64)>,
) {
    let trace = timings.trace.as_deref();
    let span_to = shared
        .tracer
        .as_deref()
        .filter(|_| trace.is_some_and(|t| t.sampled));
    if shared.access_log.is_none() && span_to.is_none() {
        return;
    }
    let listener = &ls.listener;
    let settings = shared.config.request_id.as_ref();
    let id = head.zip(settings);
    let id = id.and_then(|(h, s)| timings.request_id.text(s, h));
    let record = Record {
        sender: crate::filter::sender(peer, head, &listener.trusted_proxies),
        head,
        protocol,
        outcome,
        phases: &timings.phases(started),
        listener: &listener.name,
        route: timings
            .route
            .and_then(|i| listener.routes.get(usize::from(i)))
            .map(|r| r.name.as_str()),
        tls,
        request_id: id.as_deref(),
        ids: settings.is_some(),
        trace,
        cache: timings.cache.map(|c| c.as_str()),
        // Read only when a line or span is made (the connection's statistics take its lock).
        quic: quic.map(|f| f()),
    };
    if let Some(log) = &shared.access_log {
        log.write(&record);
    }
    if let (Some(exporter), Some(ctx)) = (span_to, trace) {
        exporter.send(crate::telemetry::span::span_json(&record, ctx));
    }
}

/// The error a refused request is answered with (logged at debug level): `protocol`, an
/// extended CONNECT's `:protocol`; `version`, the client's protocol for the log.
pub(crate) fn refusal(
    reject: h2::request::Reject,
    peer: std::net::SocketAddr,
    protocol: Option<&str>,
    version: &str,
) -> crate::error::ProxyError {
    use crate::error::ProxyError;
    let (e, what) = match reject {
        h2::request::Reject::Head(e) => (ProxyError::BadHead(e), "refused head"),
        h2::request::Reject::Malformed(why) => (ProxyError::Http2Malformed(why), why),
        h2::request::Reject::Connect => (ProxyError::Http2Connect, "CONNECT"),
        h2::request::Reject::Protocol => {
            let p = protocol.unwrap_or_default();
            tracing::debug!(%peer, protocol = p, "{version} extended CONNECT for a protocol other than websocket: 501");
            let e = ProxyError::ExtendedConnect(":protocol other than websocket");
            (e, "extended CONNECT protocol")
        }
    };
    tracing::debug!(%peer, "{version} request refused: {what}");
    e
}
