//! Fuzz the PROXY protocol header reader (v1 and v2) a listener with `proxy_protocol` runs on a connection's first bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use portico_http1::proxy_protocol::{parse, MAX_HEADER};

fuzz_target!(|data: &[u8]| {
    let Ok(Some((_, n))) = parse(data) else {
        return;
    };
    // A header takes bytes it was given, never more than the bound, and every shorter prefix
    // of it asks for more instead of deciding early.
    assert!(n > 0 && n <= data.len() && n <= MAX_HEADER);
    for k in 0..n {
        assert_eq!(parse(&data[..k]), Ok(None), "prefix of {k} bytes");
    }
    // What follows the header does not change it.
    assert_eq!(parse(&data[..n]), parse(data));
});
