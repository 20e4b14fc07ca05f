//! The error log (`[log]`: filter, format, destination), request ids (`[request_id]`) and tracing (`[trace]`).

use super::*;
use crate::model::{LogFormat, LogSettings, RequestId, Trace, DEFAULT_REQUEST_ID_HEADER};
use crate::raw::{RawLog, RawRequestId, RawTrace};

const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// Fields a request id may not be carried in.
const OWN_MEANING: [&str; 46] = [
    "host",
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "www-authenticate",
    "proxy-authenticate",
    "location",
    "content-type",
    "content-encoding",
    "content-language",
    "content-location",
    "content-range",
    "content-disposition",
    "content-security-policy",
    "etag",
    "last-modified",
    "cache-control",
    "pragma",
    "expires",
    "age",
    "vary",
    "date",
    "server",
    "user-agent",
    "referer",
    "accept",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "range",
    "if-match",
    "if-none-match",
    "if-modified-since",
    "if-unmodified-since",
    "retry-after",
    "expect",
    "origin",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "x-real-ip",
    "x-client-cert-subject",
    "via",
    "traceparent",
    "tracestate",
];

/// `[log]`: `level` is a filter in `RUST_LOG` syntax restricted to levels and targets.
pub(super) fn log(ctx: &mut Ctx<'_>, raw: &RawLog) -> LogSettings {
    let level = raw
        .level
        .as_ref()
        .and_then(|l| match filter_error(l.get_ref()) {
            Some(message) => {
                ctx.error(start(l), "log.level", message);
                None
            }
            None => Some(l.get_ref().trim().to_string()),
        });
    let format = match raw.format.as_ref() {
        None => LogFormat::Text,
        Some(f) => match f.get_ref().as_str() {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => {
                ctx.error(
                    start(f),
                    "log.format",
                    format!("unknown log format {other:?}; expected \"text\" or \"json\""),
                );
                LogFormat::Text
            }
        },
    };
    let path = raw
        .path
        .as_ref()
        .and_then(|p| match plain_text_error(p.get_ref(), "path") {
            Some(message) => {
                ctx.error(start(p), "log.path", message);
                None
            }
            None => Some(relative_to_config(ctx.file, p.get_ref())),
        });
    LogSettings {
        level,
        format,
        path,
    }
}

/// Why `text` is not a filter of comma-separated `LEVEL` or `TARGET=LEVEL` directives
/// (targets are module paths such as `portico_proxy::control` or `h2`). A bare target, which
/// `RUST_LOG` reads as "everything from it", is refused: here it is most likely a mistyped level.
pub fn filter_error(text: &str) -> Option<String> {
    if text.trim().is_empty() {
        return Some("must name a level: trace, debug, info, warn, error or off".into());
    }
    for directive in text.split(',').map(str::trim) {
        let (target, level) = match directive.split_once('=') {
            Some((t, l)) => (Some(t), Some(l)),
            None if LEVELS.contains(&directive.to_ascii_lowercase().as_str()) => {
                (None, Some(directive))
            }
            None => {
                return Some(format!(
                    "unknown level {directive:?}; expected trace, debug, info, warn, error or off, or TARGET=LEVEL"
                ))
            }
        };
        if let Some(t) = target {
            let ok = !t.is_empty()
                && t.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '-');
            if !ok {
                return Some(format!(
                    "{directive:?} is not a level or a TARGET=LEVEL directive (levels: trace, debug, info, warn, error, off; targets are module paths such as portico_proxy or h2)"
                ));
            }
        }
        if let Some(l) = level {
            if !LEVELS.contains(&l.to_ascii_lowercase().as_str()) {
                return Some(format!(
                    "unknown level {l:?} in {directive:?}; expected trace, debug, info, warn, error or off"
                ));
            }
        }
    }
    None
}

/// `[request_id]`: on when present.
pub(super) fn request_id(ctx: &mut Ctx<'_>, raw: &RawRequestId) -> RequestId {
    let header = match raw.header.as_ref() {
        None => DEFAULT_REQUEST_ID_HEADER.to_string(),
        Some(h) => {
            let name = h.get_ref().to_ascii_lowercase();
            // The id replaces the field both ways: a field with a meaning of its own (framing,
            // credentials, caching, content, Portico's identity fields) would be lost or leak.
            let managed =
                MANAGED_HEADERS.contains(&name.as_str()) || OWN_MEANING.contains(&name.as_str());
            if let Some(message) = header_name_error(&name) {
                ctx.error(start(h), "request_id.header", message);
            } else if managed {
                ctx.error(
                    start(h),
                    "request_id.header",
                    format!("{name:?} has a meaning of its own: choose another field, such as \"x-request-id\" or \"x-correlation-id\""),
                );
            }
            name
        }
    };
    RequestId {
        header,
        from_client: raw.from_client.as_ref().is_none_or(|b| *b.get_ref()),
        response: raw.response.as_ref().is_some_and(|b| *b.get_ref()),
    }
}

/// `[trace]`: on when present.
pub(super) fn trace(ctx: &mut Ctx<'_>, raw: &RawTrace) -> Trace {
    let sample_basis_points = match &raw.sample_percent {
        None => 10_000,
        Some(p) => {
            let bp = (p.get_ref().0 * 100.0).round();
            if !(0.0..=10_000.0).contains(&bp) {
                ctx.error(
                    start(p),
                    "trace.sample_percent",
                    format!("must be between 0 and 100, found {}", p.get_ref().0),
                );
            }
            bp.clamp(0.0, 10_000.0) as u32
        }
    };
    let otlp_endpoint =
        raw.otlp_endpoint
            .as_ref()
            .and_then(|u| match crate::HttpUrl::parse(u.get_ref()) {
                Ok(url) => Some(url),
                Err(m) => {
                    ctx.error(start(u), "trace.otlp_endpoint", m);
                    None
                }
            });
    let mut otlp_headers = Vec::new();
    for (name, value) in raw.otlp_headers.iter().flat_map(|e| &e.0) {
        let key = sub("trace.otlp_headers", name.get_ref());
        if let Some(m) = header_name_error(name.get_ref()) {
            ctx.error(start(name), &key, m);
        } else if header_value_error(value.get_ref()).is_some() {
            // The value is not repeated: it is likely a secret.
            ctx.error(
                start(value),
                &key,
                "invalid value: control characters, CR, LF or leading or trailing spaces",
            );
        } else {
            otlp_headers.push((name.get_ref().clone(), value.get_ref().clone()));
        }
    }
    if raw.otlp_headers.is_some() && otlp_endpoint.is_none() && raw.otlp_endpoint.is_none() {
        if let Some((name, _)) = raw.otlp_headers.iter().flat_map(|e| &e.0).next() {
            ctx.error(
                start(name),
                "trace.otlp_headers",
                "otlp_headers without an otlp_endpoint to send them to",
            );
        }
    }
    let service_name = match &raw.service_name {
        None => "portico".to_string(),
        Some(n) => {
            if let Some(m) = plain_text_error(n.get_ref(), "service_name") {
                ctx.error(start(n), "trace.service_name", m);
            }
            n.get_ref().clone()
        }
    };
    Trace {
        sample_basis_points,
        otlp_endpoint,
        otlp_headers,
        service_name,
    }
}

#[cfg(test)]
mod tests {
    use super::filter_error;

    #[test]
    fn filters() {
        for ok in [
            "info",
            "WARN",
            "info,h2=error",
            "warn, portico_proxy::control=debug",
            "portico_proxy=trace",
            "off",
        ] {
            assert_eq!(filter_error(ok), None, "{ok}");
        }
        for bad in [
            "",
            "loud",
            "info,h2=loud",
            "info,[span]=debug",
            "a b=info",
            "h2",
        ] {
            assert!(filter_error(bad).is_some(), "{bad}");
        }
    }
}
