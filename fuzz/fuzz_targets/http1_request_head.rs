//! Fuzz the request head parser: no panics, exact consumption, framing consistency, round trip.

#![no_main]

mod common;

use bytes::BytesMut;
use common::{check_framing_fields, crlf_only, find};
use libfuzzer_sys::fuzz_target;
use portico_http1::{encode, parse_request, Framing, Limits, Version};

const LIMITS: Limits = Limits {
    max_headers: 16,
    max_head_bytes: 4096,
    max_request_line: 1024,
};

fuzz_target!(|data: &[u8]| {
    let mut buf = BytesMut::from(data);
    let head = match parse_request(&mut buf, &LIMITS) {
        Ok(Some(head)) => head,
        Ok(None) => {
            assert_eq!(&buf[..], data, "incomplete parse touched the buffer");
            return;
        }
        Err(e) => {
            assert!(matches!(e.status(), 400 | 414 | 431 | 501 | 505));
            assert_eq!(&buf[..], data, "failed parse touched the buffer");
            return;
        }
    };

    // Exactly the head (after skipped empty lines) was consumed; the rest is untouched.
    let raw = head.raw().clone();
    let skipped = data.len() - raw.len() - buf.len();
    assert!(
        data[..skipped].chunks(2).all(|c| c == b"\r\n"),
        "skipped something other than CRLFs"
    );
    assert_eq!(&data[skipped..skipped + raw.len()], &raw[..]);
    assert_eq!(&data[skipped + raw.len()..], &buf[..]);
    assert!(raw.len() <= LIMITS.max_head_bytes);
    assert_eq!(
        find(&raw, b"\r\n\r\n"),
        Some(raw.len() - 4),
        "head must end at the first empty line"
    );
    assert!(crlf_only(&raw), "bare CR or LF accepted");
    assert!(!raw.contains(&0), "NUL accepted");
    let line_len = find(&raw, b"\r\n").unwrap();
    assert!(line_len <= LIMITS.max_request_line);
    assert!(head.fields().count() <= LIMITS.max_headers);

    // Accessors agree with the raw bytes.
    let target = head.target();
    assert!(target.bytes().all(|b| b.is_ascii_graphic()));
    let request_line = format!(
        "{} {} {}",
        head.method().as_str(),
        target,
        head.version().as_str()
    );
    assert_eq!(request_line.as_bytes(), &raw[..line_len]);
    assert!(target.contains(head.path()) || head.path() == "/");
    if let Some(q) = head.query() {
        assert!(target.ends_with(q));
    }
    if let Some(h) = head.host() {
        assert!(!h.is_empty() && !h.contains(' '));
    }
    if head.version() == Version::Http11 {
        assert_eq!(
            head.fields()
                .filter(|(n, _)| n.eq_ignore_ascii_case("host"))
                .count(),
            1
        );
    }
    check_framing_fields(head.framing, head.fields(), true);
    for (name, value) in head.fields() {
        assert!(head.field(name).is_some());
        assert!(
            !value.starts_with(b" ") && !value.ends_with(b" "),
            "value not trimmed"
        );
        if name.eq_ignore_ascii_case("connection") {
            assert!(head.is_hop_by_hop(name));
        }
    }

    // Every strict prefix of the head is incomplete, not an error.
    for cut in [1, raw.len() / 2, raw.len() - 1] {
        let mut prefix = BytesMut::from(&data[..skipped + cut]);
        assert!(
            matches!(parse_request(&mut prefix, &LIMITS), Ok(None)),
            "prefix of {cut} bytes"
        );
    }

    // Re-encoding an HTTP/1.1 head gives an equivalent head.
    if head.version() == Version::Http11 {
        let mut out = BytesMut::new();
        encode::request_line(&mut out, head.method().as_str(), target);
        for (name, value) in head.fields() {
            encode::field(&mut out, name, value);
        }
        encode::end_head(&mut out);
        let again = parse_request(
            &mut out,
            &Limits {
                max_head_bytes: 1 << 20,
                ..LIMITS
            },
        )
        .expect("re-encoded head refused")
        .expect("re-encoded head incomplete");
        assert!(out.is_empty());
        assert_eq!(again.method(), head.method());
        assert_eq!(again.target(), target);
        assert_eq!(again.host(), head.host());
        assert_eq!(again.framing, head.framing);
        assert_eq!(again.keep_alive, head.keep_alive);
        assert_eq!(again.upgrade, head.upgrade);
        assert_eq!(again.expect_continue, head.expect_continue);
        assert!(again.fields().eq(head.fields()));
    }
    assert_ne!(head.framing, Framing::Close);
});
