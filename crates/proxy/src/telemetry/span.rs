//! A finished request's span as one OTLP/HTTP JSON span object, written on the worker straight from its access-log record and trace context (one string, no value tree).

use crate::telemetry::access_log::Record;
use crate::telemetry::stats::Termination;
use crate::telemetry::text::json_escape;
use crate::telemetry::text::push_hex;
use crate::telemetry::trace::TraceCtx;
use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

/// The span of a finished request (OTLP JSON: ids in hex, times in nanoseconds as strings):
/// kind `SERVER`, named `METHOD route`, with the OpenTelemetry HTTP server attributes,
/// Portico's own (listener, route, upstream, termination, request id, upstream connect time)
/// and the request head and the upstream's first byte as events; status `ERROR` when the answer was a 5xx or the exchange did not complete.
pub fn span_json(r: &Record<'_>, ctx: &TraceCtx) -> String {
    let end = SystemTime::now();
    let start = end.checked_sub(r.phases.total).unwrap_or(end);
    let mut s = String::with_capacity(1024);
    s.push_str("{\"traceId\":\"");
    push_hex(&mut s, ctx.trace_hi);
    push_hex(&mut s, ctx.trace_lo);
    s.push_str("\",\"spanId\":\"");
    push_hex(&mut s, ctx.span);
    if ctx.parent != 0 {
        s.push_str("\",\"parentSpanId\":\"");
        push_hex(&mut s, ctx.parent);
    }
    let method = r.head.map_or("-", |h| h.method().as_str());
    s.push_str("\",\"name\":\"");
    json_escape(method, &mut s);
    if let Some(route) = r.route {
        s.push(' ');
        json_escape(route, &mut s);
    }
    let _ = write!(
        s,
        "\",\"kind\":2,\"startTimeUnixNano\":\"{}\",\"endTimeUnixNano\":\"{}\",\"attributes\":[",
        nanos(start),
        nanos(end)
    );
    let mut a = Attrs {
        out: &mut s,
        first: true,
    };
    a.str("http.request.method", method);
    a.int("http.response.status_code", i64::from(r.outcome.status));
    a.str("client.address", &r.sender.client.to_string());
    a.str("url.scheme", if r.tls.is_some() { "https" } else { "http" });
    let version = r.protocol.strip_prefix("HTTP/").unwrap_or(r.protocol);
    a.str("network.protocol.version", version.trim_end_matches(".0"));
    a.str("portico.listener", r.listener);
    a.str("portico.termination", &r.outcome.termination.code());
    // Client-supplied values are cut short: a span stays small while the queue holds it. The
    // query is left out (it may carry credentials).
    if let Some(h) = r.head {
        a.str("url.path", cut(h.path(), MAX_PATH));
        if let Some(host) = h.host() {
            a.str("server.address", cut(host, MAX_VALUE));
        }
        if let Some(ua) = h.field("user-agent") {
            a.str(
                "user_agent.original",
                cut(&String::from_utf8_lossy(ua), MAX_VALUE),
            );
        }
    }
    if let Some(c) = r.phases.connect {
        a.int(
            "portico.upstream.connect_us",
            i64::try_from(c.as_micros()).unwrap_or(i64::MAX),
        );
    }
    if let Some(route) = r.route {
        a.str("portico.route", route);
    }
    if let Some(u) = r.outcome.upstream {
        a.str("portico.upstream", &u.to_string());
    }
    if let Some(id) = r.request_id {
        a.str("portico.request_id", id);
    }
    s.push_str("],\"events\":[");
    let at = |d: Duration| nanos(start + d);
    let mut events = Vec::with_capacity(3);
    if let Some(d) = r.phases.head {
        events.push(("request.head", at(d)));
    }
    if let Some(d) = r.phases.ttfb {
        events.push(("upstream.first_byte", at(d)));
    }
    for (i, (name, time)) in events.iter().enumerate() {
        let comma = if i == 0 { "" } else { "," };
        let _ = write!(
            s,
            "{comma}{{\"timeUnixNano\":\"{time}\",\"name\":\"{name}\"}}"
        );
    }
    let error = r.outcome.status >= 500 || r.outcome.termination != Termination::OK;
    let _ = write!(
        s,
        "],\"status\":{{\"code\":{}}}}}",
        if error { 2 } else { 0 }
    );
    s
}

/// Longest path, and longest other client-supplied value, a span carries (bytes).
const MAX_PATH: usize = 1024;
const MAX_VALUE: usize = 256;

/// `s` cut to at most `max` bytes, on a character boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Attributes written one after another as OTLP `KeyValue` objects.
struct Attrs<'s> {
    out: &'s mut String,
    first: bool,
}

impl Attrs<'_> {
    fn key(&mut self, key: &str) {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        let _ = write!(self.out, "{{\"key\":\"{key}\",\"value\":");
    }

    fn str(&mut self, key: &str, value: &str) {
        self.key(key);
        self.out.push_str("{\"stringValue\":\"");
        json_escape(value, self.out);
        self.out.push_str("\"}}");
    }

    fn int(&mut self, key: &str, value: i64) {
        self.key(key);
        let _ = write!(self.out, "{{\"intValue\":\"{value}\"}}}}");
    }
}

fn nanos(t: SystemTime) -> u128 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::access_log::Sender;
    use crate::telemetry::stats::Outcome;
    use crate::telemetry::timing::Phases;

    #[test]
    fn a_span_is_one_otlp_json_object() {
        let mut buf = bytes::BytesMut::from(
            &b"GET /a?b=1 HTTP/1.1\r\nHost: h.example\r\nUser-Agent: \"q\"\r\n\r\n"[..],
        );
        let head = portico_http1::parse_request(&mut buf, &portico_http1::Limits::default())
            .unwrap()
            .unwrap();
        let o = Outcome {
            upstream: Some("10.0.0.1:80".parse().unwrap()),
            ..Outcome::ok(502, true, 10)
        };
        let ms = Duration::from_millis;
        let phases = Phases {
            head: Some(ms(1)),
            connect: Some(ms(2)),
            ttfb: Some(ms(4)),
            total: ms(5),
        };
        let peer = "192.0.2.1:5555".parse().unwrap();
        let r = Record {
            sender: Sender {
                peer,
                client: "192.0.2.1".parse().unwrap(),
            },
            head: Some(&head),
            protocol: "HTTP/1.1",
            outcome: &o,
            phases: &phases,
            listener: "web",
            route: Some("api"),
            tls: None,
            request_id: Some("rid"),
            ids: true,
            trace: None,
            cache: None,
            quic: None,
        };
        let ctx = TraceCtx {
            trace_hi: 1,
            trace_lo: 2,
            span: 3,
            parent: 4,
            sampled: true,
        };
        let v: serde_json::Value = serde_json::from_str(&span_json(&r, &ctx)).expect("JSON");
        assert_eq!(v["traceId"], "00000000000000010000000000000002");
        assert_eq!(v["spanId"], "0000000000000003");
        assert_eq!(v["parentSpanId"], "0000000000000004");
        assert_eq!(v["name"], "GET api");
        assert_eq!(v["kind"], 2);
        assert_eq!(v["status"]["code"], 2, "a 502 is an error");
        let start: u128 = v["startTimeUnixNano"].as_str().unwrap().parse().unwrap();
        let end: u128 = v["endTimeUnixNano"].as_str().unwrap().parse().unwrap();
        assert_eq!(end - start, 5_000_000);
        let attr = |k: &str| {
            v["attributes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|a| a["key"] == k)
                .unwrap_or_else(|| panic!("{k}"))["value"]
                .clone()
        };
        assert_eq!(attr("http.response.status_code")["intValue"], "502");
        assert_eq!(attr("user_agent.original")["stringValue"], "\"q\"");
        assert!(
            !v["attributes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a["key"] == "url.query"),
            "the query may carry credentials"
        );
        assert_eq!(attr("portico.upstream.connect_us")["intValue"], "2000");
        assert_eq!(attr("portico.upstream")["stringValue"], "10.0.0.1:80");
        assert_eq!(attr("portico.request_id")["stringValue"], "rid");
        assert_eq!(attr("network.protocol.version")["stringValue"], "1.1");
        let events = v["events"].as_array().unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[1]["name"], "upstream.first_byte");
        let t = |i: usize| -> u128 { events[i]["timeUnixNano"].as_str().unwrap().parse().unwrap() };
        assert_eq!(t(0) - start, 1_000_000);
        assert_eq!(t(1) - start, 4_000_000);
    }
}
