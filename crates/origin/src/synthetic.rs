//! Synthetic responses for benchmarks: `/bytes/N` and `?size=&delay=&status=` on any path.

use crate::response::{Response, TEXT_PLAIN};
use bytes::Bytes;
use portico_http1::Method;
use std::time::Duration;

/// Size of the shared pattern buffer sliced for synthetic bodies.
pub(crate) const PATTERN_LEN: usize = 1 << 20;
/// Largest synthetic body (1 GiB); above it -> 400.
pub(crate) const MAX_SIZE: u64 = 1 << 30;
/// Longest synthetic delay; above it -> 400.
pub(crate) const MAX_DELAY: Duration = Duration::from_secs(60);

const ALLOW: &str = "GET, HEAD, POST, PUT";
const OCTET_STREAM: &str = "application/octet-stream";

const INDEX_PAGE: &str = "\
Portico origin: the benchmark backend.

Synthetic endpoints:
  GET /bytes/N
      N bytes of application/octet-stream; N is a byte count with an optional
      k, m or g suffix (powers of 1024): /bytes/1024, /bytes/1k, /bytes/100k, /bytes/1m.
      At most 1g.
  GET /any/path?size=1k&delay=5ms&status=503
      Each parameter is optional: size (default 0, same syntax as N), delay before the
      response (default 0; units us, ms (default) or s; at most 60s), status (default 200,
      200-599). On /bytes/N, delay and status apply too and size overrides N.
  POST and PUT are answered like GET (the request body is discarded); HEAD gives the
  headers only; other methods get 405.
";

/// The shared pattern: 64-byte printable lines, so bodies are easy to eyeball and to verify.
pub(crate) fn pattern() -> Bytes {
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_";
    let mut buf = Vec::with_capacity(PATTERN_LEN);
    let mut line = 0usize;
    while buf.len() < PATTERN_LEN {
        for col in 0..63 {
            buf.push(ALPHABET[(line + col) % ALPHABET.len()]);
        }
        buf.push(b'\n');
        line += 1;
    }
    buf.truncate(PATTERN_LEN);
    Bytes::from(buf)
}

/// The synthetic parameters found in a query string (raw values, validated later).
/// Other parameters are ignored so cache-busting parameters do not turn requests into 400s.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Query<'a> {
    pub size: Option<&'a str>,
    pub delay: Option<&'a str>,
    pub status: Option<&'a str>,
}

impl<'a> Query<'a> {
    /// Parse `a=1&b=2`; a repeated parameter keeps its last value; a parameter without `=` has
    /// an empty value.
    pub fn parse(query: &'a str) -> Self {
        let mut q = Query::default();
        for pair in query.split('&') {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "size" => q.size = Some(value),
                "delay" => q.delay = Some(value),
                "status" => q.status = Some(value),
                _ => {}
            }
        }
        q
    }

    /// Whether any synthetic parameter is present.
    pub fn any(&self) -> bool {
        self.size.is_some() || self.delay.is_some() || self.status.is_some()
    }
}

/// A body size: decimal digits with an optional k/m/g suffix (powers of 1024), at most 1 GiB.
pub(crate) fn parse_size(s: &str) -> Result<u64, &'static str> {
    let (digits, mult) = if let Some(d) = s.strip_suffix(['k', 'K']) {
        (d, 1u64 << 10)
    } else if let Some(d) = s.strip_suffix(['m', 'M']) {
        (d, 1 << 20)
    } else if let Some(d) = s.strip_suffix(['g', 'G']) {
        (d, 1 << 30)
    } else {
        (s, 1)
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err("bad size: expected digits with an optional k, m or g suffix\n");
    }
    let too_large = "bad size: at most 1g (1073741824 bytes)\n";
    let n = digits.parse::<u64>().map_err(|_| too_large)?;
    let n = n.checked_mul(mult).ok_or(too_large)?;
    if n > MAX_SIZE {
        return Err(too_large);
    }
    Ok(n)
}

/// A delay: decimal digits with an optional unit `us`, `ms` (default) or `s`, at most 60 s.
pub(crate) fn parse_delay(s: &str) -> Result<Duration, &'static str> {
    let bad = "bad delay: expected digits with an optional us, ms or s unit, at most 60s\n";
    let (digits, unit): (&str, fn(u64) -> Duration) = if let Some(d) = s.strip_suffix("us") {
        (d, Duration::from_micros)
    } else if let Some(d) = s.strip_suffix("ms") {
        (d, Duration::from_millis)
    } else if let Some(d) = s.strip_suffix('s') {
        (d, Duration::from_secs)
    } else {
        (s, Duration::from_millis)
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad);
    }
    let d = unit(digits.parse::<u64>().map_err(|_| bad)?);
    if d > MAX_DELAY {
        return Err(bad);
    }
    Ok(d)
}

/// A status code, 200-599.
pub(crate) fn parse_status(s: &str) -> Result<u16, &'static str> {
    let bad = "bad status: expected 200-599\n";
    if s.len() != 3 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad);
    }
    match s.parse::<u16>() {
        Ok(n) if (200..=599).contains(&n) => Ok(n),
        _ => Err(bad),
    }
}

/// Answer a synthetic request: `size_in_path` is N from `/bytes/N`, `query` the parsed query.
pub(crate) fn respond(
    method: &Method,
    size_in_path: Option<&str>,
    query: Option<Query<'_>>,
    pattern: &Bytes,
) -> Response {
    if !matches!(
        method,
        Method::Get | Method::Head | Method::Post | Method::Put
    ) {
        return Response::method_not_allowed(ALLOW);
    }
    let query = query.unwrap_or_default();
    let size = match query.size.or(size_in_path).map(parse_size).transpose() {
        Ok(size) => size.unwrap_or(0),
        Err(msg) => return Response::text(400, msg),
    };
    let delay = match query.delay.map(parse_delay).transpose() {
        Ok(d) => d.filter(|d| !d.is_zero()),
        Err(msg) => return Response::text(400, msg),
    };
    let status = match query.status.map(parse_status).transpose() {
        Ok(s) => s.unwrap_or(200),
        Err(msg) => return Response::text(400, msg),
    };
    let mut resp = Response::new(status);
    resp.delay = delay;
    if status == 204 || status == 304 {
        // No content and no Content-Length, whatever size was asked for.
        return resp;
    }
    // 205 Reset Content must not carry content (RFC 9110 15.3.6).
    let size = if status == 205 { 0 } else { size };
    let resp = resp.with_field("Content-Type", OCTET_STREAM);
    if *method == Method::Head {
        return resp.with_length_only(size);
    }
    match body(size, pattern) {
        Some(b) => resp.with_bytes(b),
        None => Response::text(500, "cannot allocate the response body\n"),
    }
}

/// `size` bytes of the repeating pattern: a zero-copy slice up to the pattern's size, a fresh
/// buffer above it (None if that allocation fails).
fn body(size: u64, pattern: &Bytes) -> Option<Bytes> {
    let size = usize::try_from(size).ok()?;
    if size <= pattern.len() {
        return Some(pattern.slice(..size));
    }
    let mut buf = Vec::new();
    buf.try_reserve_exact(size).ok()?;
    while buf.len() < size {
        let take = (size - buf.len()).min(pattern.len());
        buf.extend_from_slice(pattern.get(..take)?);
    }
    Some(Bytes::from(buf))
}

/// `/` without a static root: what this server is and what it answers.
pub(crate) fn index_page(method: &Method) -> Response {
    if !matches!(
        method,
        Method::Get | Method::Head | Method::Post | Method::Put
    ) {
        return Response::method_not_allowed(ALLOW);
    }
    Response::new(200)
        .with_field("Content-Type", TEXT_PLAIN)
        .with_bytes(Bytes::from_static(INDEX_PAGE.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("1024"), Ok(1024));
        assert_eq!(parse_size("1k"), Ok(1024));
        assert_eq!(parse_size("100K"), Ok(102_400));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("1024m"), Ok(1 << 30));
        assert!(parse_size("1025m").is_err());
        assert!(parse_size("2g").is_err());
        assert!(parse_size("1073741825").is_err());
        assert!(parse_size("99999999999999999999999").is_err());
        assert!(parse_size("18446744073709551615k").is_err());
        for bad in ["", "k", "-1", "+1", "1.5k", "1kb", " 1", "1 ", "0x10", "１"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn delays() {
        assert_eq!(parse_delay("5ms"), Ok(Duration::from_millis(5)));
        assert_eq!(parse_delay("5"), Ok(Duration::from_millis(5)));
        assert_eq!(parse_delay("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_delay("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_delay("60s"), Ok(MAX_DELAY));
        assert_eq!(parse_delay("60000ms"), Ok(MAX_DELAY));
        for bad in [
            "",
            "ms",
            "s",
            "61s",
            "60001",
            "1.5s",
            "5m",
            "-1ms",
            "99999999999999999999999s",
        ] {
            assert!(parse_delay(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn statuses() {
        assert_eq!(parse_status("200"), Ok(200));
        assert_eq!(parse_status("503"), Ok(503));
        assert_eq!(parse_status("599"), Ok(599));
        for bad in ["", "199", "600", "100", "20", "2000", "+20", "abc", "0200"] {
            assert!(parse_status(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn query_parsing() {
        let q = Query::parse("size=1k&delay=5ms&status=503");
        assert_eq!(
            q,
            Query {
                size: Some("1k"),
                delay: Some("5ms"),
                status: Some("503")
            }
        );
        assert!(q.any());
        let q = Query::parse("v=3&size=1&size=2&x");
        assert_eq!(
            q,
            Query {
                size: Some("2"),
                delay: None,
                status: None
            }
        );
        assert!(!Query::parse("v=1&cache=no").any());
        assert!(!Query::parse("").any());
        assert_eq!(Query::parse("delay").delay, Some(""));
    }

    #[test]
    fn pattern_and_bodies() {
        let p = pattern();
        assert_eq!(p.len(), PATTERN_LEN);
        assert!(p.iter().all(|b| b.is_ascii_graphic() || *b == b'\n'));
        assert_eq!(body(0, &p).map(|b| b.len()), Some(0));
        let small = body(1000, &p).unwrap_or_default();
        assert_eq!(small.len(), 1000);
        assert_eq!(
            small.as_ptr(),
            p.as_ptr(),
            "small bodies are zero-copy slices"
        );
        let big = body(PATTERN_LEN as u64 * 2 + 5, &p).unwrap_or_default();
        assert_eq!(big.len(), PATTERN_LEN * 2 + 5);
        assert_eq!(&big[PATTERN_LEN..PATTERN_LEN * 2], &p[..]);
        assert_eq!(&big[PATTERN_LEN * 2..], &p[..5]);
    }
}
