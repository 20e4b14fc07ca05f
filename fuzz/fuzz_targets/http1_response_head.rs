//! Fuzz the response head parser: no panics, exact consumption, RFC 9112 6.3 framing, round trip.

#![no_main]

mod common;

use bytes::BytesMut;
use common::{check_framing_fields, crlf_only, find};
use libfuzzer_sys::fuzz_target;
use portico_http1::{encode, parse_response, Framing, Limits, Method, Version};

const LIMITS: Limits = Limits {
    max_headers: 16,
    max_head_bytes: 4096,
    max_request_line: 1024,
};

fuzz_target!(|input: &[u8]| {
    // First byte: the method of the request this answers.
    let Some((&selector, data)) = input.split_first() else {
        return;
    };
    let method = match selector % 4 {
        0 => Method::Get,
        1 => Method::Head,
        2 => Method::Connect,
        _ => Method::Post,
    };
    let mut buf = BytesMut::from(data);
    let head = match parse_response(&mut buf, &method, &LIMITS) {
        Ok(Some(head)) => head,
        Ok(None) => {
            assert_eq!(&buf[..], data);
            return;
        }
        Err(_) => {
            assert_eq!(&buf[..], data);
            return;
        }
    };
    let raw = head.raw().clone();
    assert_eq!(
        [&raw[..], &buf[..]].concat(),
        data,
        "head + rest must be the input"
    );
    assert_eq!(find(&raw, b"\r\n\r\n"), Some(raw.len() - 4));
    assert!(crlf_only(&raw));
    assert!(!raw.contains(&0));
    assert!(raw.len() <= LIMITS.max_head_bytes);

    let status = head.status();
    assert!((100..=999).contains(&status));
    let no_body = method == Method::Head
        || status < 200
        || status == 204
        || status == 304
        || (method == Method::Connect && (200..300).contains(&status));
    if no_body {
        assert_eq!(head.framing, Framing::None);
    } else {
        assert_ne!(head.framing, Framing::None);
        check_framing_fields(head.framing, head.fields(), false);
    }
    if head.framing == Framing::Close {
        assert!(!head.keep_alive);
    }
    let _ = head.reason();

    // Prefixes are incomplete.
    for cut in [1, raw.len() / 2, raw.len() - 1] {
        let mut prefix = BytesMut::from(&data[..cut]);
        assert!(
            matches!(parse_response(&mut prefix, &method, &LIMITS), Ok(None)),
            "prefix {cut}"
        );
    }

    // Round trip through the encoder.
    if head.version() == Version::Http11 {
        let mut out = BytesMut::new();
        encode::status_line(&mut out, status, head.reason());
        for (name, value) in head.fields() {
            encode::field(&mut out, name, value);
        }
        encode::end_head(&mut out);
        let again = parse_response(
            &mut out,
            &method,
            &Limits {
                max_head_bytes: 1 << 20,
                ..LIMITS
            },
        )
        .expect("re-encoded head refused")
        .expect("re-encoded head incomplete");
        assert_eq!(again.status(), status);
        assert_eq!(again.framing, head.framing);
        assert_eq!(again.keep_alive, head.keep_alive);
        assert!(again.fields().eq(head.fields()));
    }
});
