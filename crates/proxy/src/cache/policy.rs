//! RFC 9111 for a shared cache, sans-io: the `Cache-Control` directives, which responses may be stored, their freshness lifetime and age, and the stored head's fields.

use portico_config::RouteCache;
use std::time::{Duration, SystemTime};

/// The `Cache-Control` directives a shared cache acts on (RFC 9111 5.2). A qualified
/// `no-cache="..."` or `private="..."` is taken as its unqualified form (the stricter one).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Directives {
    pub no_store: bool,
    pub no_cache: bool,
    pub private: bool,
    pub public: bool,
    pub must_revalidate: bool,
    pub proxy_revalidate: bool,
    pub max_age: Option<u64>,
    pub s_maxage: Option<u64>,
    pub stale_if_error: Option<u64>,
    pub stale_while_revalidate: Option<u64>,
}

/// The directives of every `Cache-Control` field value.
pub(crate) fn directives<'v>(values: impl Iterator<Item = &'v [u8]>) -> Directives {
    let mut d = Directives::default();
    for v in values {
        let Ok(text) = std::str::from_utf8(v) else {
            continue;
        };
        for item in split_list(text) {
            let (name, arg) = match item.split_once('=') {
                Some((n, a)) => (n.trim(), Some(a.trim().trim_matches('"'))),
                None => (item, None),
            };
            // A delta-seconds that does not parse is taken as 0 (RFC 9111 1.2.2: invalid
            // freshness information makes the response stale), a larger one than 2^31 as
            // 2^31.
            let secs = || Some(arg.map_or(0, delta_seconds));
            match name.to_ascii_lowercase().as_str() {
                "no-store" => d.no_store = true,
                "no-cache" => d.no_cache = true,
                "private" => d.private = true,
                "public" => d.public = true,
                "must-revalidate" => d.must_revalidate = true,
                "proxy-revalidate" => d.proxy_revalidate = true,
                // A repeated directive keeps its smallest value.
                "max-age" => d.max_age = min(d.max_age, secs()),
                "s-maxage" => d.s_maxage = min(d.s_maxage, secs()),
                "stale-if-error" => d.stale_if_error = min(d.stale_if_error, secs()),
                "stale-while-revalidate" => {
                    d.stale_while_revalidate = min(d.stale_while_revalidate, secs())
                }
                _ => {}
            }
        }
    }
    d
}

/// The largest delta-seconds kept (RFC 9111 1.2.2).
const MAX_DELTA: u64 = 1 << 31;

/// A delta-seconds: digits, at most [`MAX_DELTA`]; anything else 0.
fn delta_seconds(text: &str) -> u64 {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return 0;
    }
    text.parse::<u64>().map_or(MAX_DELTA, |n| n.min(MAX_DELTA))
}

fn min(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, y) => x.or(y),
    }
}

/// The members of a comma-separated list, trimmed, empty ones skipped (commas inside quoted
/// strings kept).
pub(crate) fn split_list(text: &str) -> impl Iterator<Item = &str> {
    let mut quoted = false;
    text.split(move |c| {
        if c == '"' {
            quoted = !quoted;
        }
        c == ',' && !quoted
    })
    .map(str::trim)
    .filter(|s| !s.is_empty())
}

/// Statuses a response may be stored with on heuristic freshness (RFC 9110 15.1), less 206
/// (a cached request asks its server for the whole representation).
const HEURISTIC: [u16; 11] = [200, 203, 204, 300, 301, 308, 404, 405, 410, 414, 501];
/// Statuses stored at all (with explicit freshness): the heuristic ones and the redirects.
const STORABLE: [u16; 14] = [
    200, 203, 204, 300, 301, 302, 307, 308, 404, 405, 410, 414, 451, 501,
];

/// What a response's fields say about storing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Freshness lifetime from when the response was received.
    pub fresh_for: Duration,
    /// Past its freshness, how long it may still answer when the upstream fails.
    pub stale_if_error: Duration,
    /// Past its freshness, how long it may still answer while a fetch in the background
    /// refreshes it.
    pub stale_while_revalidate: Duration,
    /// Every use needs a revalidation first (`no-cache`).
    pub revalidate: bool,
}

/// The response's view for [`storable`]: its status and fields.
pub(crate) struct Response<'r, F> {
    pub status: u16,
    pub fields: &'r F,
}

/// Whether a shared cache may store the response to a GET that carried `authorization`
/// (RFC 9111 3 and 3.5), and how long it stays fresh; None = not stored. Responses that set
/// cookies or vary on everything are not stored either.
pub(crate) fn storable<'f, F, I>(
    resp: &Response<'_, F>,
    authorization: bool,
    route: &RouteCache,
    received: SystemTime,
) -> Option<Verdict>
where
    F: Fn() -> I,
    I: Iterator<Item = (&'f str, &'f [u8])>,
{
    if !STORABLE.contains(&resp.status) {
        return None;
    }
    let field = |name: &'static str| {
        (resp.fields)()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    };
    let d = directives(field("cache-control"));
    if d.no_store || d.private {
        return None;
    }
    if authorization && !(d.public || d.must_revalidate || d.s_maxage.is_some()) {
        return None;
    }
    if field("set-cookie").next().is_some() {
        return None;
    }
    if field("vary").any(|v| v.split(|b| *b == b',').any(|t| t.trim_ascii() == b"*")) {
        return None;
    }
    let validators = field("etag").next().is_some() || field("last-modified").next().is_some();
    let explicit = d
        .s_maxage
        .or(d.max_age)
        .map(Duration::from_secs)
        .or_else(|| {
            // Expires minus Date (RFC 9111 4.2.1); an invalid Expires is in the past.
            let expires = field("expires").next()?;
            let at = std::str::from_utf8(expires)
                .ok()
                .and_then(|t| httpdate::parse_http_date(t).ok());
            let date = field("date")
                .next()
                .and_then(|v| std::str::from_utf8(v).ok())
                .and_then(|t| httpdate::parse_http_date(t).ok())
                .unwrap_or(received);
            Some(
                at.and_then(|a| a.duration_since(date).ok())
                    .unwrap_or_default(),
            )
        });
    let fresh_for = match (route.override_ttl, explicit) {
        (Some(ttl), _) => ttl,
        (None, Some(e)) => e,
        // Revalidated on every use: its freshness does not matter.
        (None, None) if d.no_cache => Duration::ZERO,
        (None, None) if HEURISTIC.contains(&resp.status) || d.public => route.default_ttl?,
        (None, None) => return None,
    };
    let revalidate = d.no_cache && route.override_ttl.is_none();
    // Kept only when it can answer: fresh for a while, or revalidated by its validators.
    if (fresh_for.is_zero() || revalidate) && !validators {
        return None;
    }
    let strict = d.must_revalidate || d.proxy_revalidate || d.s_maxage.is_some() || d.no_cache;
    let stale = |directive: Option<u64>, configured: Duration| match (strict, directive) {
        (true, _) => Duration::ZERO,
        (false, Some(s)) => Duration::from_secs(s),
        (false, None) => configured,
    };
    Some(Verdict {
        fresh_for,
        stale_if_error: stale(d.stale_if_error, route.stale_if_error),
        stale_while_revalidate: stale(d.stale_while_revalidate, route.stale_while_revalidate),
        revalidate,
    })
}

/// The age of a response when received (RFC 9111 4.2.3, `corrected_initial_age`): its `Age`
/// plus the time the request took, or how far its `Date` is behind the clock when larger.
pub(crate) fn initial_age(
    age: Option<&[u8]>,
    date: Option<&[u8]>,
    requested: SystemTime,
    received: SystemTime,
) -> Duration {
    let age = age
        .and_then(|v| std::str::from_utf8(v).ok())
        .map(|t| Duration::from_secs(delta_seconds(t.trim())))
        .unwrap_or_default();
    let delay = received.duration_since(requested).unwrap_or_default();
    let apparent = date
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|t| httpdate::parse_http_date(t).ok())
        .and_then(|d| received.duration_since(d).ok())
        .unwrap_or_default();
    apparent.max(age.saturating_add(delay))
}

/// Fields a stored head never keeps: hop-by-hop, framing (the stored body's length is set
/// anew) and `Age` (computed for each answer).
const NOT_STORED: [&str; 11] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authenticate",
    "content-length",
    "age",
    "cache-status",
];

/// Whether a response field is kept in the stored head; `connection`: the names the
/// response's `Connection` field lists.
pub(crate) fn kept(name: &str, connection: &[&str]) -> bool {
    !NOT_STORED.iter().any(|n| n.eq_ignore_ascii_case(name))
        && !connection.iter().any(|n| n.eq_ignore_ascii_case(name))
}

/// The stored fields after a 304 (RFC 9111 4.3.4): each field the 304 carries replaces the
/// stored ones of its name, except the ones a stored head never keeps.
pub(crate) fn merged<'a>(
    stored: &'a [(String, Vec<u8>)],
    fresh: &'a [(String, Vec<u8>)],
) -> Vec<(String, Vec<u8>)> {
    let replaced = |n: &str| fresh.iter().any(|(f, _)| f.eq_ignore_ascii_case(n));
    let mut out: Vec<(String, Vec<u8>)> = stored
        .iter()
        .filter(|(n, _)| !replaced(n))
        .cloned()
        .collect();
    out.extend(fresh.iter().filter(|(n, _)| kept(n, &[])).cloned());
    out
}

/// A single byte range of a `Range` field for a body of `len` bytes: Ok(Some(start..end)),
/// Ok(None) to answer the whole body (no range, several, or not bytes), Err when none of it
/// is satisfiable (416).
pub(crate) fn range(value: &[u8], len: u64) -> Result<Option<std::ops::Range<u64>>, ()> {
    let Some(spec) = std::str::from_utf8(value)
        .ok()
        .and_then(|t| t.trim().strip_prefix("bytes="))
    else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return Ok(None);
    };
    let num = |s: &str| s.trim().parse::<u64>().ok();
    let r = match (a.trim().is_empty(), num(a), num(b)) {
        (true, _, Some(n)) if n > 0 => len.saturating_sub(n)..len,
        (true, _, _) => return Err(()),
        (false, Some(s), None) if b.trim().is_empty() => s..len,
        (false, Some(s), Some(e)) if e >= s => s..e.saturating_add(1).min(len),
        _ => return Ok(None),
    };
    if r.start >= len {
        return Err(());
    }
    Ok(Some(r))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> RouteCache {
        RouteCache {
            query: portico_config::QueryKey::All,
            key_headers: Vec::new(),
            key_cookies: Vec::new(),
            default_ttl: None,
            override_ttl: None,
            stale_if_error: Duration::ZERO,
            stale_while_revalidate: Duration::ZERO,
            bypass_headers: Vec::new(),
            bypass_cookies: Vec::new(),
            lock: true,
            scope: 1,
        }
    }

    /// The verdict on a response whose head is `raw` (status line and fields, as on the wire).
    fn verdict(raw: &str, auth: bool, r: &RouteCache) -> Option<Verdict> {
        let mut lines = raw.split("\r\n");
        let status: u16 = lines.next().unwrap()[9..12].parse().unwrap();
        let fields: Vec<(&str, &[u8])> = lines
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (n, v) = l.split_once(':').unwrap();
                (n, v.trim().as_bytes())
            })
            .collect();
        let f = || fields.iter().copied();
        let now = httpdate::parse_http_date("Thu, 26 Nov 2026 12:00:00 GMT").unwrap();
        storable(&Response { status, fields: &f }, auth, r, now)
    }

    #[test]
    fn directives_are_case_insensitive_and_quoted_commas_stay_inside() {
        let d = directives(
            [
                &b"Public, MAX-AGE=60, no-cache=\"set-cookie, x-a\""[..],
                b"s-maxage=\"30\", max-age=10, stale-if-error=x",
            ]
            .into_iter(),
        );
        assert!(d.public && d.no_cache && !d.private);
        assert_eq!(
            (d.max_age, d.s_maxage, d.stale_if_error),
            (Some(10), Some(30), Some(0))
        );
        // Past 2^31, 2^31; signs and fractions are not delta-seconds.
        let big = b"max-age=18446744073709551616, s-maxage=-1, stale-if-error=1.5";
        let d = directives([&big[..]].into_iter());
        let (max, s, sie) = (d.max_age, d.s_maxage, d.stale_if_error);
        assert_eq!((max, s, sie), (Some(1 << 31), Some(0), Some(0)));
    }

    #[test]
    fn freshness_comes_from_s_maxage_then_max_age_then_expires() {
        let r = route();
        let v = verdict(
            "HTTP/1.1 200 OK\r\nCache-Control: max-age=60, s-maxage=5\r\n",
            false,
            &r,
        );
        assert_eq!(v.unwrap().fresh_for, Duration::from_secs(5));
        let v = verdict(
            "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\n",
            false,
            &r,
        );
        assert_eq!(v.unwrap().fresh_for, Duration::from_secs(60));
        let v = verdict(
            "HTTP/1.1 200 OK\r\nDate: Thu, 26 Nov 2026 12:00:00 GMT\r\nExpires: Thu, 26 Nov 2026 12:02:00 GMT\r\n",
            false,
            &r,
        );
        assert_eq!(v.unwrap().fresh_for, Duration::from_secs(120));
        // An invalid Expires is in the past: without validators, nothing to keep.
        assert_eq!(
            verdict("HTTP/1.1 200 OK\r\nExpires: 0\r\n", false, &r),
            None
        );
    }

    #[test]
    fn what_a_shared_cache_must_not_store() {
        let r = route();
        for raw in [
            "HTTP/1.1 200 OK\r\nCache-Control: no-store, max-age=60\r\n",
            "HTTP/1.1 200 OK\r\nCache-Control: private, max-age=60\r\n",
            "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nSet-Cookie: a=b\r\n",
            "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nVary: accept, *\r\n",
            "HTTP/1.1 206 Partial Content\r\nCache-Control: max-age=60\r\n",
            "HTTP/1.1 500 Error\r\nCache-Control: max-age=60\r\n",
            // No freshness information and no heuristic configured.
            "HTTP/1.1 200 OK\r\nLast-Modified: Thu, 26 Nov 2026 11:00:00 GMT\r\n",
        ] {
            assert_eq!(verdict(raw, false, &r), None, "{raw}");
        }
        // A request with credentials: only what the response explicitly allows.
        let ok = "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\n";
        assert_eq!(verdict(ok, true, &r), None);
        let public = "HTTP/1.1 200 OK\r\nCache-Control: public, max-age=60\r\n";
        assert!(verdict(public, true, &r).is_some());
        let shared = "HTTP/1.1 200 OK\r\nCache-Control: s-maxage=60\r\n";
        assert!(verdict(shared, true, &r).is_some());
    }

    #[test]
    fn heuristic_and_overridden_freshness_only_when_configured() {
        let mut r = route();
        r.default_ttl = Some(Duration::from_secs(30));
        let plain = "HTTP/1.1 200 OK\r\n";
        assert_eq!(
            verdict(plain, false, &r).unwrap().fresh_for,
            Duration::from_secs(30)
        );
        // 302 is not heuristically cacheable.
        assert_eq!(
            verdict("HTTP/1.1 302 Found\r\nLocation: /\r\n", false, &r),
            None
        );
        r.override_ttl = Some(Duration::from_secs(5));
        let long = "HTTP/1.1 200 OK\r\nCache-Control: max-age=600, no-cache\r\n";
        let v = verdict(long, false, &r).unwrap();
        assert_eq!((v.fresh_for, v.revalidate), (Duration::from_secs(5), false));
    }

    #[test]
    fn no_cache_needs_validators_and_revalidates_every_use() {
        let r = route();
        let bare = "HTTP/1.1 200 OK\r\nCache-Control: no-cache\r\n";
        assert_eq!(verdict(bare, false, &r), None);
        let tagged = "HTTP/1.1 200 OK\r\nCache-Control: no-cache\r\nETag: \"a\"\r\n";
        assert!(verdict(tagged, false, &r).unwrap().revalidate);
    }

    #[test]
    fn stale_if_error_from_the_response_the_route_or_never() {
        let mut r = route();
        r.stale_if_error = Duration::from_secs(600);
        let sie = |raw| verdict(raw, false, &r).unwrap().stale_if_error.as_secs();
        assert_eq!(sie("HTTP/1.1 200 OK\r\nCache-Control: max-age=1\r\n"), 600);
        assert_eq!(
            sie("HTTP/1.1 200 OK\r\nCache-Control: max-age=1, stale-if-error=5\r\n"),
            5
        );
        assert_eq!(
            sie("HTTP/1.1 200 OK\r\nCache-Control: max-age=1, must-revalidate\r\n"),
            0
        );
        assert_eq!(sie("HTTP/1.1 200 OK\r\nCache-Control: s-maxage=1\r\n"), 0);
        let swr = |raw| {
            verdict(raw, false, &r)
                .unwrap()
                .stale_while_revalidate
                .as_secs()
        };
        assert_eq!(
            swr("HTTP/1.1 200 OK\r\nCache-Control: max-age=1, stale-while-revalidate=30\r\n"),
            30
        );
        assert_eq!(swr("HTTP/1.1 200 OK\r\nCache-Control: max-age=1\r\n"), 0);
        assert_eq!(swr("HTTP/1.1 200 OK\r\nCache-Control: max-age=1, must-revalidate, stale-while-revalidate=30\r\n"), 0);
    }

    #[test]
    fn initial_age_takes_the_larger_of_age_plus_delay_and_apparent_age() {
        let at = |t| httpdate::parse_http_date(t).unwrap();
        let requested = at("Thu, 26 Nov 2026 12:00:00 GMT");
        let received = at("Thu, 26 Nov 2026 12:00:02 GMT");
        let age = initial_age(Some(b"10"), None, requested, received);
        assert_eq!(age, Duration::from_secs(12));
        let date = b"Thu, 26 Nov 2026 11:59:00 GMT";
        let age = initial_age(Some(b"10"), Some(date), requested, received);
        assert_eq!(age, Duration::from_secs(62));
        // A Date ahead of the clock adds nothing; a bad Age counts as 0.
        let ahead = b"Thu, 26 Nov 2026 13:00:00 GMT";
        assert_eq!(
            initial_age(Some(b"x"), Some(ahead), requested, received),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn a_304_replaces_the_fields_it_carries() {
        let f = |n: &str, v: &str| (n.to_string(), v.as_bytes().to_vec());
        let stored = [
            f("ETag", "\"a\""),
            f("Cache-Control", "max-age=1"),
            f("Content-Type", "text/plain"),
        ];
        let fresh = [
            f("cache-control", "max-age=60"),
            f("Content-Length", "0"),
            f("Age", "3"),
        ];
        let m = merged(&stored, &fresh);
        assert_eq!(
            m,
            vec![
                f("ETag", "\"a\""),
                f("Content-Type", "text/plain"),
                f("cache-control", "max-age=60")
            ]
        );
    }

    #[test]
    fn single_byte_ranges() {
        assert_eq!(range(b"bytes=0-9", 100), Ok(Some(0..10)));
        assert_eq!(range(b"bytes=90-", 100), Ok(Some(90..100)));
        assert_eq!(range(b"bytes=-10", 100), Ok(Some(90..100)));
        assert_eq!(range(b"bytes=-200", 100), Ok(Some(0..100)));
        assert_eq!(range(b"bytes=50-500", 100), Ok(Some(50..100)));
        assert_eq!(range(b"bytes=100-", 100), Err(()));
        assert_eq!(range(b"bytes=-0", 100), Err(()));
        // Several ranges, other units and nonsense: the whole body.
        assert_eq!(range(b"bytes=0-1,5-6", 100), Ok(None));
        assert_eq!(range(b"items=0-1", 100), Ok(None));
        assert_eq!(range(b"bytes=9-1", 100), Ok(None));
        assert_eq!(
            range(b"bytes=0-18446744073709551615", 100),
            Ok(Some(0..100))
        );
    }
}
