//! Access log: one line per request, combined format or JSON lines, with phase timings and the termination record.

use crate::telemetry::logging::Sink;
use crate::telemetry::stats::Outcome;
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

    /// Write one record; `protocol` as nginx's `$server_protocol` (`HTTP/1.1`, `HTTP/2.0`).
    /// Never waits for the output.
    /// `sender`: the socket's peer and the request's client (the one a trusted proxy's
    /// `X-Forwarded-For` names; the peer is logged too, in JSON, when they differ).
    pub fn write(
        &self,
        sender: Sender,
        head: Option<&RequestHead>,
        protocol: &str,
        o: &Outcome,
        phases: &Phases,
    ) {
        let line = format_line(
            self.format,
            sender,
            head,
            protocol,
            o,
            phases,
            SystemTime::now(),
        );
        self.out.push(line.as_bytes());
    }

    /// Wait until the lines written so far are out, at most `timeout`.
    pub fn flush(&self, timeout: std::time::Duration) -> bool {
        self.out.flush(timeout)
    }
}

fn json_escape(s: &str, out: &mut String) {
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
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

/// Format one access-log line (ending in '\n'). Combined: the Apache/nginx combined format,
/// then the total seconds, the termination code, and the head, upstream connect and time to
/// first upstream byte in seconds (`-` when absent). JSON: the same facts as named fields, the
/// phases as `head_s`, `connect_s` and `ttfb_s` (absent when the phase did not happen).
/// `protocol` is the request line's version (`HTTP/2.0` for HTTP/2 streams, as nginx logs them).
pub fn format_line(
    format: AccessLogFormat,
    sender: Sender,
    head: Option<&RequestHead>,
    protocol: &str,
    o: &Outcome,
    phases: &Phases,
    now: SystemTime,
) -> String {
    let Sender { peer, client } = sender;
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
            let _ = writeln!(
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
        }
        AccessLogFormat::Json => {
            s.push_str("{\"time\":\"");
            s.push_str(&httpdate::fmt_http_date(now));
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
            for (name, d) in [
                ("head_s", phases.head),
                ("connect_s", phases.connect),
                ("ttfb_s", phases.ttfb),
            ] {
                if let Some(d) = d {
                    let _ = write!(s, ",\"{name}\":{:.6}", d.as_secs_f64());
                }
            }
            s.push_str("}\n");
        }
    }
    s
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
        format_line(
            format,
            sender,
            Some(&head),
            protocol,
            &o,
            phases,
            UNIX_EPOCH,
        )
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
            l.ends_with(",\"upstream\":\"10.0.0.1:80\",\"head_s\":0.000250,\"ttfb_s\":0.003000}\n"),
            "{l}"
        );
        assert!(!l.contains("connect_s"), "{l}");
        let v: serde_json::Value = serde_json::from_str(&l).expect("valid JSON");
        assert_eq!(v["ttfb_s"].as_f64(), Some(0.003));
    }
}
