//! Access log: one line per request, combined format or JSON lines, with phase timings and the termination record.

use crate::telemetry::logging::Sink;
use crate::telemetry::stats::Outcome;
use crate::telemetry::text::json_escape;
use crate::telemetry::timing::Phases;
use portico_config::{AccessLog, AccessLogFormat};
use portico_http1::RequestHead;
use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

/// The access log: lines go through a bounded non-blocking [`Sink`] (a worker never waits on
/// the log's file or pipe; lines that find the sink full are dropped and counted).
pub struct AccessLogger {
    format: AccessLogFormat,
    out: Sink,
}

impl AccessLogger {
    /// Open the file (appending) or take standard output, and start the sink's writer thread.
    pub fn open(cfg: &AccessLog) -> io::Result<Self> {
        let out: Box<dyn Write + Send> = match &cfg.path {
            Some(p) => Box::new(OpenOptions::new().create(true).append(true).open(p)?),
            None => Box::new(io::stdout()),
        };
        Ok(AccessLogger {
            format: cfg.format,
            out: Sink::new(
                "access",
                out,
                crate::telemetry::logging::SINK_CAPACITY,
                &crate::telemetry::logging::ACCESS_LOG_DROPPED,
            )?,
        })
    }

    /// Write one record. Never waits for the output.
    pub fn write(&self, r: &Record<'_>) {
        let line = format_line(self.format, r, SystemTime::now());
        self.out.push(line.as_bytes());
    }

    /// Wait until the lines written so far are out, at most `timeout`.
    pub fn flush(&self, timeout: std::time::Duration) -> bool {
        self.out.flush(timeout)
    }
}

/// Who sent a request: the socket's peer, and the client (the peer, unless a trusted proxy
/// named another).
#[derive(Debug, Clone, Copy)]
pub struct Sender {
    pub peer: SocketAddr,
    pub client: std::net::IpAddr,
}

/// Seconds with microsecond precision, or `-` when the phase did not happen.
fn seconds_or_dash(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".to_string(), |d| format!("{:.6}", d.as_secs_f64()))
}

/// What one access-log line tells about a request.
pub struct Record<'a> {
    /// The socket's peer and the request's client (the one a trusted proxy's `X-Forwarded-For`
    /// names; the peer is logged too, in JSON, when they differ).
    pub sender: Sender,
    /// None when the head could not be read.
    pub head: Option<&'a RequestHead>,
    /// As nginx's `$server_protocol` (`HTTP/1.1`, `HTTP/2.0`).
    pub protocol: &'a str,
    pub outcome: &'a Outcome,
    pub phases: &'a Phases,
    pub listener: &'a str,
    /// The route that took the request (None: no route matched, or no head).
    pub route: Option<&'a str>,
    /// The TLS version and the server name (SNI) the client sent, on TLS listeners.
    pub tls: Option<(&'static str, Option<&'a str>)>,
    /// The request id, when `[request_id]` is on (and the head was read).
    pub request_id: Option<&'a str>,
    /// `[request_id]` is on: the combined line has its column (`-` without an id).
    pub ids: bool,
    /// The request's trace context, when `[trace]` is on (JSON `trace_id` and `span_id`).
    pub trace: Option<&'a crate::telemetry::trace::TraceCtx>,
    /// What the response cache did (caching routes; JSON `cache`).
    pub cache: Option<&'static str>,
    /// An HTTP/3 request's connection: its round-trip time and the packets it lost so far
    /// (JSON `rtt_ms` and `lost_packets`).
    pub quic: Option<(std::time::Duration, u64)>,
}

/// Format one access-log line (ending in '\n'). Combined: the Apache/nginx combined format,
/// then the total seconds, the termination code, and the head, upstream connect and time to
/// first upstream byte in seconds (`-` when absent), then the request id when ids are on. JSON:
/// the same facts as named fields (the phases as `head_s`, `connect_s` and `ttfb_s`, absent
/// when the phase did not happen) and the time (RFC 3339, milliseconds), host, listener, route,
/// referer, user agent, TLS version and server name, and request id.
pub fn format_line(format: AccessLogFormat, r: &Record<'_>, now: SystemTime) -> String {
    let Sender { peer, client } = r.sender;
    let (head, o, phases, protocol) = (r.head, r.outcome, r.phases, r.protocol);
    let elapsed = phases.total;
    let method = head.map(|h| h.method().as_str()).unwrap_or("-");
    let target = head.map(|h| h.target()).unwrap_or("-");
    let field = |n: &str| {
        head.and_then(|h| h.field(n))
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    let mut s = String::with_capacity(256);
    match format {
        AccessLogFormat::Combined => {
            let _ = write!(
                s,
                "{} - - [{}] \"{} {} {}\" {} {} \"{}\" \"{}\" {:.6} {} {} {} {}",
                client,
                httpdate::fmt_http_date(now),
                method,
                target,
                protocol,
                o.status,
                o.bytes_sent,
                field("referer")
                    .unwrap_or_else(|| "-".into())
                    .replace('"', "%22"),
                field("user-agent")
                    .unwrap_or_else(|| "-".into())
                    .replace('"', "%22"),
                elapsed.as_secs_f64(),
                o.termination.code(),
                seconds_or_dash(phases.head),
                seconds_or_dash(phases.connect),
                seconds_or_dash(phases.ttfb),
            );
            if r.ids {
                let _ = write!(s, " {}", r.request_id.unwrap_or("-"));
            }
            s.push('\n');
        }
        AccessLogFormat::Json => {
            s.push_str("{\"time\":\"");
            rfc3339_millis(now, &mut s);
            let _ = write!(s, "\",\"client\":\"{client}\",");
            if client != peer.ip() {
                let _ = write!(s, "\"peer\":\"{}\",", peer.ip());
            }
            s.push_str("\"method\":\"");
            json_escape(method, &mut s);
            s.push_str("\",\"target\":\"");
            json_escape(target, &mut s);
            let _ = write!(
                s,
                "\",\"protocol\":\"{protocol}\",\"status\":{},\"bytes\":{},\"duration_s\":{:.6},\"termination\":\"{}\",\"side\":\"{:?}\",\"phase\":\"{:?}\",\"cause\":\"{:?}\"",
                o.status,
                o.bytes_sent,
                elapsed.as_secs_f64(),
                o.termination.code(),
                o.termination.side,
                o.termination.phase,
                o.termination.cause
            );
            if let Some(u) = o.upstream {
                let _ = write!(s, ",\"upstream\":\"{u}\"");
            }
            if let Some((rtt, lost)) = r.quic {
                let ms = rtt.as_secs_f64() * 1000.0;
                let _ = write!(s, ",\"rtt_ms\":{ms:.3},\"lost_packets\":{lost}");
            }
            for (name, d) in [
                ("head_s", phases.head),
                ("connect_s", phases.connect),
                ("ttfb_s", phases.ttfb),
            ] {
                if let Some(d) = d {
                    let _ = write!(s, ",\"{name}\":{:.6}", d.as_secs_f64());
                }
            }
            let host = head.and_then(|h| h.host());
            let text = [
                ("host", host.map(std::borrow::Cow::Borrowed)),
                ("listener", Some(r.listener.into())),
                ("route", r.route.map(Into::into)),
                ("referer", field("referer").map(Into::into)),
                ("user_agent", field("user-agent").map(Into::into)),
                ("tls_version", r.tls.map(|t| t.0.into())),
                ("sni", r.tls.and_then(|t| t.1).map(Into::into)),
                ("request_id", r.request_id.map(Into::into)),
                ("trace_id", r.trace.map(|t| t.trace_id().into())),
                ("span_id", r.trace.map(|t| t.span_id().into())),
                ("cache", r.cache.map(Into::into)),
            ];
            for (name, value) in text {
                if let Some(v) = value {
                    let _ = write!(s, ",\"{name}\":\"");
                    json_escape(&v, &mut s);
                    s.push('"');
                }
            }
            s.push_str("}\n");
        }
    }
    s
}

/// `2026-11-26T08:15:53.123Z`: RFC 3339 in UTC with milliseconds.
fn rfc3339_millis(t: SystemTime, out: &mut String) {
    let since = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = portico_http1::calendar::civil_from_days(days as i64);
    let _ = write!(
        out,
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60,
        since.subsec_millis()
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::stats::Termination;
    use bytes::BytesMut;
    use std::time::UNIX_EPOCH;

    fn line(format: AccessLogFormat, phases: &Phases) -> String {
        line_as(format, "HTTP/1.1", phases)
    }

    fn line_as(format: AccessLogFormat, protocol: &str, phases: &Phases) -> String {
        let mut buf =
            BytesMut::from(&b"GET /a?b HTTP/1.1\r\nHost: h\r\nUser-Agent: ua\r\n\r\n"[..]);
        let head = portico_http1::parse_request(&mut buf, &portico_http1::Limits::default())
            .unwrap()
            .unwrap();
        let o = Outcome {
            termination: Termination::OK,
            status: 200,
            keep_alive: true,
            bytes_sent: 12,
            upstream: Some("10.0.0.1:80".parse().unwrap()),
        };
        let peer: SocketAddr = "192.0.2.1:5555".parse().unwrap();
        let sender = Sender {
            peer,
            client: peer.ip(),
        };
        let r = Record {
            sender,
            head: Some(&head),
            protocol,
            outcome: &o,
            phases,
            listener: "web",
            route: None,
            tls: None,
            request_id: None,
            ids: false,
            trace: None,
            cache: None,
            quic: None,
        };
        format_line(format, &r, UNIX_EPOCH)
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn combined_appends_total_termination_and_phases() {
        let fresh = Phases {
            head: Some(MS / 4),
            connect: Some(MS),
            ttfb: Some(3 * MS),
            total: 5 * MS,
        };
        assert_eq!(
            line(AccessLogFormat::Combined, &fresh),
            "192.0.2.1 - - [Thu, 01 Jan 1970 00:00:00 GMT] \"GET /a?b HTTP/1.1\" 200 12 \"-\" \"ua\" 0.005000 -- 0.000250 0.001000 0.003000\n"
        );
        // A reused connection has no connect phase; a local response no upstream phases.
        let reused = Phases {
            connect: None,
            ..fresh
        };
        assert!(line(AccessLogFormat::Combined, &reused)
            .ends_with(" 0.005000 -- 0.000250 - 0.003000\n"));
    }

    #[test]
    fn http2_streams_log_their_protocol() {
        let p = Phases::default();
        let l = line_as(AccessLogFormat::Combined, "HTTP/2.0", &p);
        assert!(l.contains("\"GET /a?b HTTP/2.0\" 200 12 "), "{l}");
        let l = line_as(AccessLogFormat::Json, "HTTP/2.0", &p);
        let v: serde_json::Value = serde_json::from_str(&l).expect("valid JSON");
        assert_eq!(v["protocol"].as_str(), Some("HTTP/2.0"));
    }

    #[test]
    fn json_names_each_phase_and_leaves_out_those_that_did_not_happen() {
        let reused = Phases {
            head: Some(MS / 4),
            connect: None,
            ttfb: Some(3 * MS),
            total: 5 * MS,
        };
        let l = line(AccessLogFormat::Json, &reused);
        assert!(l.contains("\"duration_s\":0.005000"), "{l}");
        assert!(
            l.contains(",\"upstream\":\"10.0.0.1:80\",\"head_s\":0.000250,\"ttfb_s\":0.003000,"),
            "{l}"
        );
        assert!(!l.contains("connect_s"), "{l}");
        let v: serde_json::Value = serde_json::from_str(&l).expect("valid JSON");
        assert_eq!(v["ttfb_s"].as_f64(), Some(0.003));
        assert_eq!(v["time"].as_str(), Some("1970-01-01T00:00:00.000Z"));
        assert_eq!(v["host"].as_str(), Some("h"));
        assert_eq!(v["listener"].as_str(), Some("web"));
        assert_eq!(v["user_agent"].as_str(), Some("ua"));
        assert!(
            v.get("route").is_none() && v.get("request_id").is_none(),
            "{l}"
        );
    }

    #[test]
    fn rfc3339_time_matches_the_http_date() {
        for secs in [
            0u64,
            951_782_400,
            1_795_000_000,
            4_102_444_799,
            1_709_164_800,
        ] {
            let t = UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(7);
            let mut s = String::new();
            rfc3339_millis(t, &mut s);
            // "Tue, 29 Feb 2000 00:00:00 GMT" against "2000-02-29T00:00:00.007Z".
            let http = httpdate::fmt_http_date(t);
            let parts: Vec<&str> = http.split(' ').collect();
            let month = [
                "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
            ]
            .iter()
            .position(|m| *m == parts[2])
            .unwrap()
                + 1;
            let expected = format!("{}-{month:02}-{}T{}.007Z", parts[3], parts[1], parts[4]);
            assert_eq!(s, expected, "{secs}");
        }
    }

    #[test]
    fn route_tls_and_request_id_are_logged_when_known() {
        let mut buf = BytesMut::from(
            &b"GET / HTTP/1.1\r\nHost: example.com:8443\r\nReferer: https://a/\r\n\r\n"[..],
        );
        let head = portico_http1::parse_request(&mut buf, &portico_http1::Limits::default())
            .unwrap()
            .unwrap();
        let o = Outcome::ok(204, true, 0);
        let peer: SocketAddr = "192.0.2.1:5555".parse().unwrap();
        let r = Record {
            sender: Sender {
                peer,
                client: peer.ip(),
            },
            head: Some(&head),
            protocol: "HTTP/1.1",
            outcome: &o,
            phases: &Phases::default(),
            listener: "tls",
            route: Some("api"),
            tls: Some(("TLSv1.3", Some("example.com"))),
            request_id: Some("4bf92f3577b34da6a3ce929d0e0e4736"),
            ids: true,
            trace: None,
            cache: None,
            quic: None,
        };
        let l = format_line(AccessLogFormat::Json, &r, UNIX_EPOCH);
        let v: serde_json::Value = serde_json::from_str(&l).expect("valid JSON");
        assert_eq!(v["route"].as_str(), Some("api"));
        assert_eq!(v["host"].as_str(), Some("example.com"));
        assert_eq!(v["referer"].as_str(), Some("https://a/"));
        assert_eq!(v["tls_version"].as_str(), Some("TLSv1.3"));
        assert_eq!(v["sni"].as_str(), Some("example.com"));
        assert_eq!(
            v["request_id"].as_str(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        let l = format_line(AccessLogFormat::Combined, &r, UNIX_EPOCH);
        assert!(
            l.ends_with(" - - - 4bf92f3577b34da6a3ce929d0e0e4736\n"),
            "{l}"
        );
        // A request without an id (its head was not read) keeps the column count.
        let none = Record {
            head: None,
            request_id: None,
            ..r
        };
        let l = format_line(AccessLogFormat::Combined, &none, UNIX_EPOCH);
        assert!(l.ends_with(" - - - -\n"), "{l}");
    }
}
