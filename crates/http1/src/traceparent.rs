//! The W3C Trace Context `traceparent` field (level 1), parsed: trace id, parent span id, sampled flag.

/// A `traceparent` value (W3C Trace Context, level 1): (trace id high and low halves, parent
/// span id, sampled). Version `00` is exactly 55 characters; a later version may carry more
/// after a `-`, and `ff` is invalid. Ids are lowercase hex and not all zeros.
pub fn parse_traceparent(v: &[u8]) -> Option<(u64, u64, u64, bool)> {
    if v.len() < 55 || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    let version = &v[..2];
    if version == b"ff" || !lower_hex(version) {
        return None;
    }
    if version == b"00" && v.len() != 55 {
        return None;
    }
    if v.len() > 55 && v[55] != b'-' {
        return None;
    }
    let (trace, parent, flags) = (&v[3..35], &v[36..52], &v[53..55]);
    if !lower_hex(trace) || !lower_hex(parent) || !lower_hex(flags) {
        return None;
    }
    let hex = |b: &[u8]| u64::from_str_radix(std::str::from_utf8(b).ok()?, 16).ok();
    let (hi, lo, parent) = (hex(&trace[..16])?, hex(&trace[16..])?, hex(parent)?);
    let flags = u8::from_str_radix(std::str::from_utf8(flags).ok()?, 16).ok()?;
    if (hi == 0 && lo == 0) || parent == 0 {
        return None;
    }
    Some((hi, lo, parent, flags & 1 == 1))
}

fn lower_hex(b: &[u8]) -> bool {
    b.iter()
        .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_follows_the_w3c_rules() {
        let ok = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(
            parse_traceparent(ok),
            Some((
                0x4bf92f3577b34da6,
                0xa3ce929d0e0e4736,
                0x00f067aa0ba902b7,
                true
            ))
        );
        let unsampled = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        assert_eq!(parse_traceparent(unsampled).map(|t| t.3), Some(false));
        // A later version may carry more after a dash.
        let later = b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-ever";
        assert!(parse_traceparent(later).is_some());
        for bad in [
            &b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x"[..],
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            b"0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"",
        ] {
            assert_eq!(
                parse_traceparent(bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
