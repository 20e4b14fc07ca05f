//! W3C trace context (the client's `traceparent` continued with Portico's span, or a new trace), and the exporter that sends the spans of sampled requests in batches over OTLP/HTTP (JSON) from a thread of its own.

use crate::telemetry::logging::log_limited;
use crate::telemetry::stats::ExportStats;
use crate::telemetry::text::push_hex;
use portico_config::{HttpUrl, Trace};
use portico_http1::traceparent::parse_traceparent;
use portico_http1::RequestHead;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Spans waiting for the exporter at most; past that, new ones are dropped and counted.
const QUEUE: usize = 8192;
/// Spans per export request, and how long the first of a batch waits for company.
const BATCH: usize = 512;
const LINGER: Duration = Duration::from_secs(1);
/// One export's time (connect, TLS, answer).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// One request's place in a trace: the trace, Portico's span for the request, the client's
/// span it continues (0 for a new trace) and whether the trace is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceCtx {
    pub trace_hi: u64,
    pub trace_lo: u64,
    pub span: u64,
    pub parent: u64,
    pub sampled: bool,
}

impl TraceCtx {
    /// The context of a request under `settings`: the client's trace continued when its
    /// `traceparent` is valid (sampled as it says), else a new trace, sampled at the
    /// configured rate.
    pub fn of(settings: &Trace, head: &RequestHead) -> TraceCtx {
        let span = nonzero_u64();
        let theirs = head
            .field("traceparent")
            .filter(|_| !repeated(head, "traceparent"))
            .and_then(parse_traceparent);
        match theirs {
            Some((trace_hi, trace_lo, parent, sampled)) => TraceCtx {
                trace_hi,
                trace_lo,
                span,
                parent,
                sampled,
            },
            None => TraceCtx {
                trace_hi: fastrand::u64(..),
                trace_lo: nonzero_u64(),
                span,
                parent: 0,
                sampled: fastrand::u32(0..10_000) < settings.sample_basis_points,
            },
        }
    }

    /// The `traceparent` the upstream gets: this trace, Portico's span as the parent.
    pub fn traceparent(&self) -> String {
        let mut s = String::with_capacity(55);
        s.push_str("00-");
        push_hex(&mut s, self.trace_hi);
        push_hex(&mut s, self.trace_lo);
        s.push('-');
        push_hex(&mut s, self.span);
        s.push_str(if self.sampled { "-01" } else { "-00" });
        s
    }

    pub fn trace_id(&self) -> String {
        let mut s = String::with_capacity(32);
        push_hex(&mut s, self.trace_hi);
        push_hex(&mut s, self.trace_lo);
        s
    }

    pub fn span_id(&self) -> String {
        let mut s = String::with_capacity(16);
        push_hex(&mut s, self.span);
        s
    }
}

fn nonzero_u64() -> u64 {
    fastrand::u64(1..)
}

fn repeated(head: &RequestHead, name: &str) -> bool {
    let mut same = head.fields().filter(|(n, _)| n.eq_ignore_ascii_case(name));
    same.next().is_some() && same.next().is_some()
}

/// Spans of sampled requests to one OTLP endpoint: a bounded queue the workers add to without
/// waiting, drained by a thread of its own that posts batches.
pub struct Exporter {
    tx: SyncSender<String>,
    /// What identifies the endpoint, for keeping the exporter across reloads.
    settings: Trace,
    pub stats: Arc<ExportStats>,
}

impl Exporter {
    /// Start the exporter thread for `settings`' endpoint (None without one).
    pub fn start(settings: &Trace, stats: Arc<ExportStats>) -> std::io::Result<Option<Exporter>> {
        let Some(url) = settings.otlp_endpoint.clone() else {
            return Ok(None);
        };
        let (tx, rx) = sync_channel(QUEUE);
        let (headers, service) = (settings.otlp_headers.clone(), settings.service_name.clone());
        let thread_stats = stats.clone();
        std::thread::Builder::new()
            .name("portico-otlp".into())
            .spawn(move || export_loop(rx, url, headers, service, thread_stats))?;
        Ok(Some(Exporter {
            tx,
            settings: settings.clone(),
            stats,
        }))
    }

    /// Whether this exporter serves `settings` as they are (a reload keeps it then).
    pub fn serves(&self, settings: &Trace) -> bool {
        self.settings.otlp_endpoint == settings.otlp_endpoint
            && self.settings.otlp_headers == settings.otlp_headers
            && self.settings.service_name == settings.service_name
    }

    /// Queue a span (one OTLP JSON span object) without waiting (dropped and counted when the
    /// queue is full).
    pub fn send(&self, span: String) {
        if self.tx.try_send(span).is_err() {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn export_loop(
    rx: Receiver<String>,
    url: HttpUrl,
    headers: Vec<(String, String)>,
    service: String,
    stats: Arc<ExportStats>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    let mut open = true;
    while open {
        // The first span of a batch waits without a deadline; then up to LINGER for more.
        match rx.recv() {
            Ok(s) => batch.push(s),
            Err(_) => break,
        }
        let until = Instant::now() + LINGER;
        while batch.len() < BATCH {
            match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
                Ok(s) => batch.push(s),
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        let n = batch.len() as u64;
        let body = export_body(&service, &batch).into_bytes();
        batch.clear();
        let mut fields: Vec<(&str, &str)> = vec![("Content-Type", "application/json")];
        fields.extend(headers.iter().map(|(n, v)| (n.as_str(), v.as_str())));
        match crate::blocking_http::request(&url, "POST", &fields, &body, EXPORT_TIMEOUT, 64 * 1024)
        {
            Ok(a) if (200..300).contains(&a.status) => {
                stats.exported.fetch_add(n, Ordering::Relaxed);
            }
            Ok(a) => {
                stats.failed.fetch_add(n, Ordering::Relaxed);
                log_limited!(warn, spans = n, "OTLP export refused: HTTP {}", a.status);
            }
            Err(e) => {
                stats.failed.fetch_add(n, Ordering::Relaxed);
                log_limited!(warn, spans = n, "OTLP export failed: {e}");
            }
        }
    }
}

/// An OTLP/HTTP JSON `ExportTraceServiceRequest` around `spans` (each one span object).
pub fn export_body(service: &str, spans: &[String]) -> String {
    let mut service_json = String::new();
    crate::telemetry::text::json_escape(service, &mut service_json);
    let version = env!("CARGO_PKG_VERSION");
    let mut body = String::with_capacity(256 + spans.iter().map(|s| s.len() + 1).sum::<usize>());
    body.push_str(&format!(
        "{{\"resourceSpans\":[{{\"resource\":{{\"attributes\":[{{\"key\":\"service.name\",\"value\":{{\"stringValue\":\"{service_json}\"}}}},{{\"key\":\"service.version\",\"value\":{{\"stringValue\":\"{version}\"}}}}]}},\"scopeSpans\":[{{\"scope\":{{\"name\":\"portico\",\"version\":\"{version}\"}},\"spans\":["
    ));
    for (i, span) in spans.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str(span);
    }
    body.push_str("]}]}]}");
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn a_request_continues_the_clients_trace_or_starts_one() {
        let settings = Trace {
            sample_basis_points: 0,
            otlp_endpoint: None,
            otlp_headers: Vec::new(),
            service_name: "p".into(),
        };
        let head = |wire: &[u8]| {
            let mut buf = bytes::BytesMut::from(wire);
            portico_http1::parse_request(&mut buf, &portico_http1::Limits::default())
                .unwrap()
                .unwrap()
        };
        let h = head(b"GET / HTTP/1.1\r\nHost: a\r\ntraceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\n\r\n");
        let c = TraceCtx::of(&settings, &h);
        assert_eq!(c.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(c.parent, 0x00f067aa0ba902b7);
        assert!(c.sampled, "the client's sampled flag is followed");
        let tp = c.traceparent();
        assert!(tp.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-") && tp.ends_with("-01"));
        assert_ne!(
            &tp[36..52],
            "00f067aa0ba902b7",
            "Portico's own span is the parent"
        );
        assert!(parse_traceparent(tp.as_bytes()).is_some());
        // No (or a bad) traceparent: a new trace, sampled at the configured rate (0% here).
        let n = TraceCtx::of(
            &settings,
            &head(b"GET / HTTP/1.1\r\nHost: a\r\ntraceparent: junk\r\n\r\n"),
        );
        assert_eq!(n.parent, 0);
        assert!(!n.sampled);
        assert!(n.traceparent().ends_with("-00"));
        let all = Trace {
            sample_basis_points: 10_000,
            ..settings
        };
        assert!(TraceCtx::of(&all, &head(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")).sampled);
    }

    #[test]
    fn a_batch_is_one_export_request() {
        let spans = vec![
            "{\"spanId\":\"a\"}".to_string(),
            "{\"spanId\":\"b\"}".to_string(),
        ];
        let v: Value = serde_json::from_str(&export_body("ed\"ge", &spans)).expect("JSON");
        let rs = &v["resourceSpans"][0];
        assert_eq!(
            rs["resource"]["attributes"][0]["value"]["stringValue"],
            "ed\"ge"
        );
        assert_eq!(rs["scopeSpans"][0]["scope"]["name"], "portico");
        assert_eq!(rs["scopeSpans"][0]["spans"][1]["spanId"], "b");
    }
}
