//! Parsing a `Range: bytes=` header against a file length (single ranges only).

/// What a Range header asks of a representation of a given length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RangeRequest {
    /// Ignore the header and send the whole representation (200): malformed, another unit, or
    /// several ranges (multipart/byteranges is not implemented; RFC 9110 14.2 lets a server
    /// ignore Range).
    Ignore,
    /// Send bytes `start..=end` (206).
    Satisfiable { start: u64, end: u64 },
    /// No byte of the representation is in the range (416).
    Unsatisfiable,
}

/// Interpret `value` (a Range field value) for a representation of `len` bytes.
pub(crate) fn parse(value: &[u8], len: u64) -> RangeRequest {
    let Ok(value) = std::str::from_utf8(value) else {
        return RangeRequest::Ignore;
    };
    let Some((unit, spec)) = value.trim().split_once('=') else {
        return RangeRequest::Ignore;
    };
    if !unit.trim().eq_ignore_ascii_case("bytes") {
        return RangeRequest::Ignore;
    }
    let spec = spec.trim();
    if spec.contains(',') {
        return RangeRequest::Ignore;
    }
    let Some((first, last)) = spec.split_once('-') else {
        return RangeRequest::Ignore;
    };
    match (number(first), number(last)) {
        // `-n`: the last n bytes.
        (None, Some(n)) if first.is_empty() => {
            if n == 0 || len == 0 {
                RangeRequest::Unsatisfiable
            } else {
                RangeRequest::Satisfiable {
                    start: len - n.min(len),
                    end: len - 1,
                }
            }
        }
        // `a-`: from a to the end.
        (Some(start), None) if last.is_empty() => satisfiable(start, u64::MAX, len),
        // `a-b`: b before a makes the whole header invalid.
        (Some(start), Some(end)) if start <= end => satisfiable(start, end, len),
        _ => RangeRequest::Ignore,
    }
}

fn satisfiable(start: u64, end: u64, len: u64) -> RangeRequest {
    if start >= len {
        RangeRequest::Unsatisfiable
    } else {
        RangeRequest::Satisfiable {
            start,
            end: end.min(len - 1),
        }
    }
}

/// ASCII digits only; values beyond u64 saturate (they are past any file's end anyway).
fn number(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(s.parse().unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::RangeRequest::*;
    use super::*;

    #[test]
    fn forms() {
        let cases: &[(&str, u64, RangeRequest)] = &[
            ("bytes=0-0", 10, Satisfiable { start: 0, end: 0 }),
            ("bytes=0-9", 10, Satisfiable { start: 0, end: 9 }),
            ("bytes=2-5", 10, Satisfiable { start: 2, end: 5 }),
            ("bytes=2-100", 10, Satisfiable { start: 2, end: 9 }),
            ("bytes=3-", 10, Satisfiable { start: 3, end: 9 }),
            ("bytes=-3", 10, Satisfiable { start: 7, end: 9 }),
            ("bytes=-100", 10, Satisfiable { start: 0, end: 9 }),
            ("Bytes = 1-2", 10, Satisfiable { start: 1, end: 2 }),
            (
                "bytes=0-99999999999999999999999",
                10,
                Satisfiable { start: 0, end: 9 },
            ),
            ("bytes=10-", 10, Unsatisfiable),
            ("bytes=10-20", 10, Unsatisfiable),
            ("bytes=-0", 10, Unsatisfiable),
            ("bytes=0-", 0, Unsatisfiable),
            ("bytes=-5", 0, Unsatisfiable),
            ("bytes=99999999999999999999999-", 10, Unsatisfiable),
            ("bytes=5-2", 10, Ignore),
            ("bytes=0-1,3-4", 10, Ignore),
            ("bytes=-", 10, Ignore),
            ("bytes=", 10, Ignore),
            ("bytes=a-b", 10, Ignore),
            ("bytes=1-2-3", 10, Ignore),
            ("bytes=+1-2", 10, Ignore),
            ("items=0-1", 10, Ignore),
            ("bytes 0-1", 10, Ignore),
            ("", 10, Ignore),
        ];
        for &(v, len, want) in cases {
            assert_eq!(parse(v.as_bytes(), len), want, "{v:?} len {len}");
        }
        assert_eq!(parse(b"bytes=\xff-1", 10), Ignore);
    }
}
