//! Checks shared by the fuzz targets.

#![allow(dead_code)]

use portico_http1::Framing;

/// Every CR is followed by LF and every LF preceded by CR (a naive scan, independent of the
/// parser's own structural check).
pub fn crlf_only(raw: &[u8]) -> bool {
    raw.iter().enumerate().all(|(i, &b)| match b {
        b'\r' => raw.get(i + 1) == Some(&b'\n'),
        b'\n' => i > 0 && raw.get(i - 1) == Some(&b'\r'),
        _ => true,
    })
}

/// Position of the first occurrence of `needle`.
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The framing the fields imply (RFC 9112 6.3), checked independently of the parser: with a
/// single Content-Length value or a Transfer-Encoding ending in chunked.
pub fn check_framing_fields<'a>(
    framing: Framing,
    fields: impl Iterator<Item = (&'a str, &'a [u8])>,
    request: bool,
) {
    let mut cl = Vec::new();
    let mut te = Vec::new();
    for (name, value) in fields {
        if name.eq_ignore_ascii_case("content-length") {
            cl.push(value);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            te.push(value);
        }
    }
    match framing {
        Framing::Chunked => {
            assert!(cl.is_empty(), "chunked with Content-Length");
            let last = te.last().expect("chunked without Transfer-Encoding");
            let last = std::str::from_utf8(last)
                .unwrap()
                .rsplit(',')
                .next()
                .unwrap()
                .trim();
            assert!(last.eq_ignore_ascii_case("chunked"));
        }
        Framing::Length(n) => {
            assert!(te.is_empty(), "length with Transfer-Encoding");
            for v in &cl {
                for elem in std::str::from_utf8(v).unwrap().split(',') {
                    assert_eq!(
                        elem.trim().parse::<u64>().ok(),
                        Some(n),
                        "Content-Length element"
                    );
                }
            }
            assert!(
                !cl.is_empty() || !request,
                "request Length without Content-Length"
            );
        }
        Framing::None | Framing::Close => {
            if request {
                assert!(framing == Framing::None, "request with Close framing");
                assert!(
                    cl.is_empty() && te.is_empty(),
                    "request with no body but CL/TE"
                );
            }
            assert!(!(cl.len() > 0 && te.len() > 0), "CL and TE accepted");
        }
    }
}
