//! A finished request's span, built from its access-log record and its trace context.

use crate::telemetry::access_log::Record;
use crate::telemetry::stats::Termination;
use crate::telemetry::trace::{Attr, SpanRecord, TraceCtx};
use std::time::{Duration, SystemTime};

/// The span of a finished request, from its access-log record: named `METHOD route`, with
/// the OpenTelemetry HTTP server attributes, Portico's own (listener, route, upstream,
/// termination, request id) and the phases as events; an error when the answer was a 5xx or
/// the exchange did not complete.
pub fn span(r: &Record<'_>, ctx: &TraceCtx) -> SpanRecord {
    let end = SystemTime::now();
    let start = end.checked_sub(r.phases.total).unwrap_or(end);
    let method = r.head.map_or("-", |h| h.method().as_str());
    let name = match r.route {
        Some(route) => format!("{method} {route}"),
        None => method.to_string(),
    };
    let mut attributes = vec![
        ("http.request.method", Attr::Str(method.to_string())),
        (
            "http.response.status_code",
            Attr::Int(i64::from(r.outcome.status)),
        ),
        ("client.address", Attr::Str(r.sender.client.to_string())),
        (
            "url.scheme",
            Attr::Str(if r.tls.is_some() { "https" } else { "http" }.into()),
        ),
        (
            "network.protocol.version",
            Attr::Str(
                r.protocol
                    .strip_prefix("HTTP/")
                    .unwrap_or(r.protocol)
                    .trim_end_matches(".0")
                    .into(),
            ),
        ),
        ("portico.listener", Attr::Str(r.listener.to_string())),
        (
            "portico.termination",
            Attr::Str(r.outcome.termination.code().to_string()),
        ),
    ];
    if let Some(h) = r.head {
        attributes.push(("url.path", Attr::Str(h.path().to_string())));
        if let Some(q) = h.query() {
            attributes.push(("url.query", Attr::Str(q.to_string())));
        }
        if let Some(host) = h.host() {
            attributes.push(("server.address", Attr::Str(host.to_string())));
        }
        if let Some(ua) = h.field("user-agent") {
            let ua = String::from_utf8_lossy(ua).into_owned();
            attributes.push(("user_agent.original", Attr::Str(ua)));
        }
    }
    if let Some(route) = r.route {
        attributes.push(("portico.route", Attr::Str(route.to_string())));
    }
    if let Some(u) = r.outcome.upstream {
        attributes.push(("portico.upstream", Attr::Str(u.to_string())));
    }
    if let Some(id) = r.request_id {
        attributes.push(("portico.request_id", Attr::Str(id.to_string())));
    }
    let at = |d: Duration| start + d;
    let mut events = Vec::new();
    if let Some(d) = r.phases.head {
        events.push(("request.head", at(d)));
    }
    if let (Some(c), Some(t)) = (r.phases.connect, r.phases.ttfb) {
        // The connect ended before the first byte came; it is known by its length only.
        events.push(("upstream.connect", at(t.saturating_sub(c))));
    }
    if let Some(d) = r.phases.ttfb {
        events.push(("upstream.first_byte", at(d)));
    }
    let error = r.outcome.status >= 500 || r.outcome.termination != Termination::OK;
    SpanRecord {
        ctx: *ctx,
        name,
        start,
        end,
        attributes,
        events,
        error,
    }
}
