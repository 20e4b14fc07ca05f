//! Fuzz the W3C `traceparent` parser: what it accepts is exactly the field written back from the ids it returns.

#![no_main]

use libfuzzer_sys::fuzz_target;
use portico_http1::traceparent::parse_traceparent;

fuzz_target!(|data: &[u8]| {
    let Some((hi, lo, parent, sampled)) = parse_traceparent(data) else {
        return;
    };
    assert!(data.len() >= 55);
    assert!(hi != 0 || lo != 0, "an all-zero trace id");
    assert_ne!(parent, 0, "an all-zero parent id");
    let version = std::str::from_utf8(&data[..2]).unwrap();
    assert_ne!(version, "ff");
    // The ids and flags written back in lowercase hex are the field's first 55 bytes.
    let flags = u8::from_str_radix(std::str::from_utf8(&data[53..55]).unwrap(), 16).unwrap();
    assert_eq!(sampled, flags & 1 == 1);
    let back = format!("{version}-{hi:016x}{lo:016x}-{parent:016x}-{flags:02x}");
    assert_eq!(back.as_bytes(), &data[..55]);
    // Version 00 is exactly 55 bytes; a later one continues only after a dash.
    if version == "00" {
        assert_eq!(data.len(), 55);
    } else if data.len() > 55 {
        assert_eq!(data[55], b'-');
    }
});
