//! Byte-level grammar helpers shared by the head parser and the body decoder (RFC 9110 5.6).

/// `tchar` (RFC 9110 5.6.2) as a lookup table.
static TCHAR: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        t[i] = matches!(
            b,
            b'a'..=b'z'
                | b'A'..=b'Z'
                | b'0'..=b'9'
                | b'!'
                | b'#'
                | b'$'
                | b'%'
                | b'&'
                | b'\''
                | b'*'
                | b'+'
                | b'-'
                | b'.'
                | b'^'
                | b'_'
                | b'`'
                | b'|'
                | b'~'
        );
        i += 1;
    }
    t
};

#[inline]
pub(crate) fn is_tchar(b: u8) -> bool {
    TCHAR[usize::from(b)]
}

/// `1*tchar`.
#[inline]
pub(crate) fn is_token(s: &[u8]) -> bool {
    !s.is_empty() && s.iter().all(|&b| is_tchar(b))
}

/// Number of leading `tchar` bytes.
#[inline]
pub(crate) fn token_len(s: &[u8]) -> usize {
    s.iter().take_while(|&&b| is_tchar(b)).count()
}

#[inline]
pub(crate) fn is_ows(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// Strip leading optional whitespace.
#[inline]
pub(crate) fn skip_ows(s: &[u8]) -> &[u8] {
    let n = s.iter().take_while(|&&b| is_ows(b)).count();
    s.get(n..).unwrap_or_default()
}

/// Strip optional whitespace on both ends.
#[inline]
pub(crate) fn trim_ows(s: &[u8]) -> &[u8] {
    let s = skip_ows(s);
    let n = s.iter().rev().take_while(|&&b| is_ows(b)).count();
    s.get(..s.len().saturating_sub(n)).unwrap_or_default()
}

/// `field-vchar` / SP / HTAB: what a field value may contain (obs-text allowed, controls not).
#[inline]
pub(crate) fn is_field_value_byte(b: u8) -> bool {
    b == b'\t' || (b' '..=b'~').contains(&b) || b >= 0x80
}

/// Elements of a comma-separated list (RFC 9110 5.6.1): `(offset in s, element trimmed of OWS)`.
/// Empty elements are yielded (as empty slices) so that callers can decide whether to accept them.
pub(crate) fn list_elements(s: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    let mut pos = 0usize;
    s.split(|&b| b == b',').map(move |raw| {
        let start = pos;
        pos = pos.saturating_add(raw.len()).saturating_add(1);
        let lead = raw.iter().take_while(|&&b| is_ows(b)).count();
        (start.saturating_add(lead), trim_ows(raw))
    })
}

/// Parse a `quoted-string` starting at `s[0] == '"'`; returns what follows the closing quote.
pub(crate) fn quoted_string(s: &[u8]) -> Option<&[u8]> {
    let (&first, mut rest) = s.split_first()?;
    if first != b'"' {
        return None;
    }
    loop {
        let (&b, tail) = rest.split_first()?;
        rest = tail;
        match b {
            b'"' => return Some(rest),
            b'\\' => {
                let (&q, tail) = rest.split_first()?;
                if !is_field_value_byte(q) {
                    return None;
                }
                rest = tail;
            }
            b'\t' | b' ' | 0x21 | 0x23..=0x5B | 0x5D..=0x7E | 0x80..=0xFF => {}
            _ => return None,
        }
    }
}

/// A validated `uri-host [ ":" port ]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Authority {
    /// End of the host part (the host is `0..host_end`, IPv6 literals keep their brackets).
    pub(crate) host_end: usize,
    /// True if a `:port` with at least one digit follows the host.
    pub(crate) has_port: bool,
}

/// reg-name bytes other than pct-encoding (RFC 3986 3.2.2: unreserved / sub-delims).
static REG_NAME: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        t[i] = matches!(
            b,
            b'a'..=b'z'
                | b'A'..=b'Z'
                | b'0'..=b'9'
                | b'-'
                | b'.'
                | b'_'
                | b'~'
                | b'!'
                | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
        );
        i += 1;
    }
    t
};

/// Validate `uri-host [ ":" port ]` (RFC 3986 3.2.2 / 3.2.3): reg-name (unreserved, sub-delims,
/// pct-encoded), IPv4 (a reg-name syntactically) or a bracketed IP literal; port is at most 5
/// digits and may be empty. The host must not be empty.
pub(crate) fn parse_authority(a: &[u8]) -> Option<Authority> {
    let host_end = if a.first() == Some(&b'[') {
        let close = find_byte(a, b']')?;
        let inner = a.get(1..close)?;
        let ok = !inner.is_empty()
            && inner.iter().all(|&b| {
                b.is_ascii_alphanumeric() || matches!(b, b':' | b'.' | b'-' | b'_' | b'~' | b'%')
            });
        if !ok {
            return None;
        }
        close.checked_add(1)?
    } else {
        reg_name_len(a)?
    };
    let rest = a.get(host_end..)?;
    let has_port = match rest.split_first() {
        None => false,
        Some((&b':', port)) => {
            if port.len() > 5 || !port.iter().all(u8::is_ascii_digit) {
                return None;
            }
            !port.is_empty()
        }
        Some(_) => return None,
    };
    Some(Authority { host_end, has_port })
}

/// Length of the non-empty reg-name at the start of `s`, which must end there or at a ':';
/// None for an empty name or any other byte.
fn reg_name_len(s: &[u8]) -> Option<usize> {
    let mut i = 0usize;
    while let Some(&b) = s.get(i) {
        if REG_NAME[usize::from(b)] {
            i = i.saturating_add(1);
        } else if b == b'%' {
            let hex = |j: usize| s.get(j).is_some_and(u8::is_ascii_hexdigit);
            if !(hex(i.saturating_add(1)) && hex(i.saturating_add(2))) {
                return None;
            }
            i = i.saturating_add(3);
        } else if b == b':' {
            break;
        } else {
            return None;
        }
    }
    (i > 0).then_some(i)
}

/// Validate one trailer/header field line (without its CRLF): `token ":" OWS value OWS`.
pub(crate) fn is_field_line(line: &[u8]) -> bool {
    let n = token_len(line);
    if n == 0 {
        return false;
    }
    match line.get(n..).and_then(|r| r.split_first()) {
        Some((&b':', value)) => value.iter().all(|&b| is_field_value_byte(b)),
        _ => false,
    }
}

/// Value of an ASCII hex digit.
#[inline]
pub(crate) fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Position of the first `needle` byte.
#[inline]
pub(crate) fn find_byte(hay: &[u8], needle: u8) -> Option<usize> {
    hay.iter().position(|&b| b == needle)
}
