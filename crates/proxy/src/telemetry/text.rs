//! Text for log lines and spans: JSON string escaping and lowercase hex, written by hand on per-request paths.

use std::fmt::Write as _;

/// `s` escaped for a JSON string (quotes, backslashes, control characters).
pub fn json_escape(s: &str, out: &mut String) {
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

/// Append `v` as 16 lowercase hex digits (`format!("{v:016x}")` without the formatting
/// machinery, which costs several times more on a per-request path).
pub fn push_hex(out: &mut String, v: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for shift in (0..16).rev() {
        out.push(DIGITS[((v >> (shift * 4)) & 0xf) as usize] as char);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_what_format_writes() {
        for v in [0, 1, 0xdead_beef, u64::MAX, 0x0123_4567_89ab_cdef] {
            let mut s = String::new();
            push_hex(&mut s, v);
            assert_eq!(s, format!("{v:016x}"));
        }
    }

    #[test]
    fn json_strings_are_escaped() {
        let mut s = String::new();
        json_escape("a\"b\\c\n\u{1}", &mut s);
        assert_eq!(s, "a\\\"b\\\\c\\u000a\\u0001");
    }
}
