//! Access log: one line per request, combined format or JSON lines, with the termination record.

use crate::conn::Outcome;
use portico_config::{AccessLog, AccessLogFormat};
use portico_http1::RequestHead;
use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// A shared, line-buffered access log sink.
pub struct AccessLogger {
    format: AccessLogFormat,
    out: Mutex<Box<dyn Write + Send>>,
}

impl AccessLogger {
    pub fn open(cfg: &AccessLog) -> io::Result<Self> {
        let out: Box<dyn Write + Send> = match &cfg.path {
            Some(p) => Box::new(io::LineWriter::new(
                OpenOptions::new().create(true).append(true).open(p)?,
            )),
            None => Box::new(io::LineWriter::new(io::stdout())),
        };
        Ok(AccessLogger {
            format: cfg.format,
            out: Mutex::new(out),
        })
    }

    /// Write one record. Never held across an await.
    pub fn write(
        &self,
        peer: SocketAddr,
        head: Option<&RequestHead>,
        o: &Outcome,
        elapsed: Duration,
    ) {
        let line = format_line(self.format, peer, head, o, elapsed, SystemTime::now());
        if let Ok(mut out) = self.out.lock() {
            let _ = out.write_all(line.as_bytes());
        }
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

/// Format one access-log line (ending in '\n').
pub fn format_line(
    format: AccessLogFormat,
    peer: SocketAddr,
    head: Option<&RequestHead>,
    o: &Outcome,
    elapsed: Duration,
    now: SystemTime,
) -> String {
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
                "{} - - [{}] \"{} {} HTTP/1.1\" {} {} \"{}\" \"{}\" {:.6} {}",
                peer.ip(),
                httpdate::fmt_http_date(now),
                method,
                target,
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
            );
        }
        AccessLogFormat::Json => {
            s.push_str("{\"time\":\"");
            s.push_str(&httpdate::fmt_http_date(now));
            let _ = write!(s, "\",\"client\":\"{}\",\"method\":\"", peer.ip());
            json_escape(method, &mut s);
            s.push_str("\",\"target\":\"");
            json_escape(target, &mut s);
            let _ = write!(
                s,
                "\",\"status\":{},\"bytes\":{},\"duration_s\":{:.6},\"termination\":\"{}\",\"side\":\"{:?}\",\"phase\":\"{:?}\",\"cause\":\"{:?}\"",
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
            s.push_str("}\n");
        }
    }
    s
}
