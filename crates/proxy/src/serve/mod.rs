//! The connection tasks: an HTTP/1.1 connection's (`h1`) and an HTTP/2 connection's with one task per stream (`h2`), each handing every request to the flow and recording it when it ends (`finished`).

pub mod h1;
pub mod h2;

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
    };
    if let Some(log) = &shared.access_log {
        log.write(&record);
    }
    if let (Some(exporter), Some(ctx)) = (span_to, trace) {
        exporter.send(crate::telemetry::span::span_json(&record, ctx));
    }
}
