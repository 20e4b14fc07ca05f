//! Request path decoding and validation for the static file server (no traversal, no NUL).

/// A decoded request path split into safe segments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DecodedPath {
    /// Non-empty segments, none of them `.` or `..`, none containing `/`, `\` or NUL.
    pub segments: Vec<String>,
    /// The decoded path ends in `/` (a directory was asked for).
    pub trailing_slash: bool,
}

/// Why a path was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PathError {
    /// Not starting with `/`, bad percent-encoding, NUL, not UTF-8 after decoding (400).
    Malformed,
    /// A `..` segment or a backslash after decoding (400).
    Traversal,
    /// Longer than any file system allows (404).
    TooLong,
}

/// Longest decoded path accepted (Linux PATH_MAX).
const MAX_PATH: usize = 4096;
/// Longest decoded segment accepted (Linux NAME_MAX).
const MAX_SEGMENT: usize = 255;

/// Percent-decode `raw` (an origin-form path) and split it into segments.
///
/// Decoding happens before validation, so `%2e%2e`, `..%2f` and `%5c` are caught like their
/// literal forms. Empty segments and `.` are dropped; `..` anywhere is refused outright rather
/// than resolved, since no legitimate client sends it.
pub(crate) fn decode(raw: &str) -> Result<DecodedPath, PathError> {
    if !raw.starts_with('/') {
        return Err(PathError::Malformed);
    }
    let decoded = percent_decode(raw.as_bytes()).ok_or(PathError::Malformed)?;
    if decoded.contains(&0) {
        return Err(PathError::Malformed);
    }
    if decoded.contains(&b'\\') {
        return Err(PathError::Traversal);
    }
    let decoded = String::from_utf8(decoded).map_err(|_| PathError::Malformed)?;
    let mut segments = Vec::new();
    for seg in decoded.split('/') {
        match seg {
            "" | "." => {}
            ".." => return Err(PathError::Traversal),
            s if s.len() > MAX_SEGMENT => return Err(PathError::TooLong),
            s => segments.push(s.to_owned()),
        }
    }
    if decoded.len() > MAX_PATH {
        return Err(PathError::TooLong);
    }
    Ok(DecodedPath {
        segments,
        trailing_slash: decoded.ends_with('/'),
    })
}

/// `%XX` -> byte; None on a `%` not followed by two hex digits. `+` stays `+` (paths are not forms).
fn percent_decode(raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while let Some(&b) = raw.get(i) {
        if b == b'%' {
            let hi = hex(*raw.get(i + 1)?)?;
            let lo = hex(*raw.get(i + 2)?)?;
            out.push(hi << 4 | lo);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    Some(out)
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(raw: &str) -> (Vec<&'static str>, bool) {
        let d = decode(raw).unwrap_or_else(|e| panic!("{raw}: {e:?}"));
        (
            d.segments.into_iter().map(|s| &*s.leak()).collect(),
            d.trailing_slash,
        )
    }

    #[test]
    fn decodes() {
        assert_eq!(ok("/"), (vec![], true));
        assert_eq!(ok("/a/b.txt"), (vec!["a", "b.txt"], false));
        assert_eq!(ok("/a//./b/"), (vec!["a", "b"], true));
        assert_eq!(ok("/hello%20world"), (vec!["hello world"], false));
        assert_eq!(ok("/a+b%2Bc"), (vec!["a+b+c"], false));
        assert_eq!(ok("/caf%C3%A9"), (vec!["café"], false));
        assert_eq!(ok("/a%2fb"), (vec!["a", "b"], false));
        assert_eq!(ok("/..."), (vec!["..."], false));
        assert_eq!(ok("/..a/a.."), (vec!["..a", "a.."], false));
    }

    #[test]
    fn refuses() {
        use PathError::*;
        let cases = [
            ("", Malformed),
            ("a/b", Malformed),
            ("*", Malformed),
            ("/%", Malformed),
            ("/%4", Malformed),
            ("/%zz", Malformed),
            ("/a%00b", Malformed),
            ("/%ff", Malformed),
            ("/../etc/passwd", Traversal),
            ("/a/../../etc/passwd", Traversal),
            ("/%2e%2e/etc/passwd", Traversal),
            ("/%2E%2E/", Traversal),
            ("/a/..%2f..%2fetc/passwd", Traversal),
            ("/..", Traversal),
            ("/a\\b", Traversal),
            ("/a%5c..%5cb", Traversal),
        ];
        for (raw, want) in cases {
            assert_eq!(decode(raw), Err(want), "{raw:?}");
        }
        assert_eq!(decode(&format!("/{}", "a".repeat(256))), Err(TooLong));
        assert_eq!(decode(&"/abc".repeat(1100)), Err(TooLong));
        assert!(decode(&format!("/{}", "a".repeat(255))).is_ok());
    }
}
