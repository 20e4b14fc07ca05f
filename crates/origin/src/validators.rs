//! Validators for static files: strong ETag, Last-Modified, and the conditional header checks.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// httpdate panics on dates at or after year 10000, so later mtimes get no Last-Modified.
const YEAR_10000: u64 = 253_402_300_800;

/// A file's validators, derived from its length and modification time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Validators {
    /// Strong entity tag with quotes: `"{len:x}-{mtime_nanos:x}"`.
    pub etag: String,
    /// The mtime truncated to whole seconds, if it can be written as an HTTP date.
    pub last_modified: Option<SystemTime>,
}

impl Validators {
    pub fn new(len: u64, mtime: Option<SystemTime>) -> Self {
        let since_epoch = mtime.and_then(|m| m.duration_since(UNIX_EPOCH).ok());
        let nanos = since_epoch.map_or(0, |d| d.as_nanos());
        let last_modified = since_epoch
            .map(|d| d.as_secs())
            .filter(|&s| s < YEAR_10000)
            .map(|s| UNIX_EPOCH + Duration::from_secs(s));
        Validators {
            etag: format!("\"{len:x}-{nanos:x}\""),
            last_modified,
        }
    }

    /// The validators of a precompressed variant: the coding's token goes into the entity tag
    /// (`"{len:x}-{mtime_nanos:x}-br"`), so a variant never shares a tag with the original or
    /// another variant even when lengths and mtimes coincide (files unpacked from one archive).
    pub fn for_coding(mut self, coding: portico_http1::Coding) -> Self {
        self.etag.pop();
        self.etag.push('-');
        self.etag.push_str(coding.token());
        self.etag.push('"');
        self
    }

    /// `Last-Modified` field value.
    pub fn last_modified_value(&self) -> Option<String> {
        self.last_modified.map(httpdate::fmt_http_date)
    }

    /// RFC 9110 13.2.2 steps 3-4 for GET/HEAD: If-None-Match decides when present (weak
    /// comparison, `*` matches), otherwise If-Modified-Since does. True -> 304.
    pub fn not_modified(
        &self,
        if_none_match: Option<&[u8]>,
        if_modified_since: Option<&[u8]>,
    ) -> bool {
        if let Some(inm) = if_none_match {
            return etag_list_matches(inm, &self.etag);
        }
        let (Some(ims), Some(lm)) = (if_modified_since, self.last_modified) else {
            return false;
        };
        match std::str::from_utf8(ims)
            .ok()
            .and_then(|s| httpdate::parse_http_date(s.trim()).ok())
        {
            Some(ims) => lm <= ims,
            // An invalid date is ignored (RFC 9110 13.1.3).
            None => false,
        }
    }

    /// If-Range (RFC 9110 13.1.5): an entity tag must match strongly (a weak tag never does); a
    /// date must equal Last-Modified exactly. True -> the Range applies.
    pub fn if_range_matches(&self, if_range: &[u8]) -> bool {
        let Ok(v) = std::str::from_utf8(if_range) else {
            return false;
        };
        let v = v.trim();
        if v.starts_with("W/") {
            return false;
        }
        if v.starts_with('"') {
            return v == self.etag;
        }
        match (httpdate::parse_http_date(v), self.last_modified) {
            (Ok(date), Some(lm)) => date == lm,
            _ => false,
        }
    }
}

/// Whether an If-None-Match list (`*` or `#entity-tag`) matches `etag` by weak comparison
/// (the opaque tags are equal, ignoring `W/`). A malformed list matches nothing.
fn etag_list_matches(list: &[u8], etag: &str) -> bool {
    let ours = opaque(etag.as_bytes());
    let mut rest = list;
    loop {
        rest = trim_start(rest, |b| b == b' ' || b == b'\t' || b == b',');
        if rest.is_empty() {
            return false;
        }
        if rest.first() == Some(&b'*') {
            return true;
        }
        if let Some(r) = rest.strip_prefix(b"W/") {
            rest = r;
        }
        let Some(r) = rest.strip_prefix(b"\"") else {
            return false;
        };
        let Some(end) = r.iter().position(|&b| b == b'"') else {
            return false;
        };
        let (tag, after) = r.split_at(end);
        if Some(tag) == ours {
            return true;
        }
        rest = after.get(1..).unwrap_or_default();
    }
}

/// The opaque tag of a quoted entity tag: `"abc"` or `W/"abc"` -> `abc`.
fn opaque(etag: &[u8]) -> Option<&[u8]> {
    let e = etag.strip_prefix(b"W/").unwrap_or(etag);
    e.strip_prefix(b"\"")?.strip_suffix(b"\"")
}

fn trim_start(mut s: &[u8], skip: impl Fn(u8) -> bool) -> &[u8] {
    while let Some((&b, rest)) = s.split_first() {
        if !skip(b) {
            break;
        }
        s = rest;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v() -> Validators {
        Validators::new(
            0x1234,
            Some(UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789)),
        )
    }

    #[test]
    fn etag_and_date() {
        let v = v();
        let nanos: u128 = 1_700_000_000 * 1_000_000_000 + 123_456_789;
        assert_eq!(v.etag, format!("\"1234-{nanos:x}\""));
        assert_eq!(
            v.last_modified_value().as_deref(),
            Some("Tue, 14 Nov 2023 22:13:20 GMT")
        );
        let pre_epoch = Validators::new(5, UNIX_EPOCH.checked_sub(Duration::from_secs(10)));
        assert_eq!(pre_epoch.etag, "\"5-0\"");
        assert_eq!(pre_epoch.last_modified, None);
        let far = Validators::new(
            5,
            UNIX_EPOCH.checked_add(Duration::from_secs(YEAR_10000 + 5)),
        );
        assert_eq!(far.last_modified_value(), None);
        assert_eq!(Validators::new(0, None).etag, "\"0-0\"");
    }

    #[test]
    fn a_variant_tag_names_its_coding() {
        let v = v();
        let br = v.clone().for_coding(portico_http1::Coding::Br);
        let gz = v.clone().for_coding(portico_http1::Coding::Gzip);
        assert_eq!(
            br.etag,
            format!("{}-br\"", v.etag.strip_suffix('"').unwrap())
        );
        assert!(gz.etag.ends_with("-gzip\"") && gz.etag.starts_with('"'));
        assert_ne!(br.etag, v.etag);
        assert_eq!(br.last_modified, v.last_modified);
        assert!(br.not_modified(Some(br.etag.as_bytes()), None));
        assert!(!br.not_modified(Some(v.etag.as_bytes()), None));
        assert!(br.if_range_matches(br.etag.as_bytes()));
    }

    #[test]
    fn if_none_match() {
        let v = v();
        let tag = v.etag.clone();
        let yes = [
            tag.clone(),
            format!("W/{tag}"),
            format!("\"x\", {tag}"),
            format!("\"a,b\" ,W/{tag}"),
            "*".to_owned(),
            format!("{tag}, \"other\""),
        ];
        for h in yes {
            assert!(v.not_modified(Some(h.as_bytes()), None), "{h}");
        }
        let no = [
            "\"other\"",
            "W/\"other\"",
            "",
            "garbage",
            "\"unterminated",
            "1234",
        ];
        for h in no {
            assert!(!v.not_modified(Some(h.as_bytes()), None), "{h}");
        }
        // If-None-Match present and not matching: If-Modified-Since is not consulted.
        assert!(!v.not_modified(Some(b"\"other\""), Some(b"Tue, 14 Nov 2023 22:13:20 GMT")));
    }

    #[test]
    fn if_modified_since() {
        let v = v();
        assert!(v.not_modified(None, Some(b"Tue, 14 Nov 2023 22:13:20 GMT")));
        assert!(v.not_modified(None, Some(b"Wed, 15 Nov 2023 00:00:00 GMT")));
        assert!(!v.not_modified(None, Some(b"Tue, 14 Nov 2023 22:13:19 GMT")));
        assert!(!v.not_modified(None, Some(b"yesterday")));
        assert!(!v.not_modified(None, None));
        assert!(
            !Validators::new(1, None).not_modified(None, Some(b"Tue, 14 Nov 2023 22:13:20 GMT"))
        );
    }

    #[test]
    fn if_range() {
        let v = v();
        assert!(v.if_range_matches(v.etag.as_bytes()));
        assert!(!v.if_range_matches(format!("W/{}", v.etag).as_bytes()));
        assert!(!v.if_range_matches(b"\"other\""));
        assert!(v.if_range_matches(b"Tue, 14 Nov 2023 22:13:20 GMT"));
        assert!(!v.if_range_matches(b"Wed, 15 Nov 2023 00:00:00 GMT"));
        assert!(!v.if_range_matches(b"nonsense"));
        assert!(!v.if_range_matches(b"\xff"));
    }
}
