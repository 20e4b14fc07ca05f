//! Fuzz the duration and size parsers of the configuration: no panic, bounded results, and
//! what they accept formats back to text that parses to the same value.

#![no_main]

use libfuzzer_sys::fuzz_target;
use portico_config::units::{
    format_duration, format_size, parse_duration, parse_size, MAX_DURATION,
};

fuzz_target!(|text: &str| {
    match parse_duration(text) {
        Ok(d) => {
            assert!(d <= MAX_DURATION, "{text:?} -> {d:?} above the maximum");
            let shown = format_duration(d);
            assert_eq!(parse_duration(&shown), Ok(d), "{text:?} -> {shown:?}");
        }
        Err(msg) => assert!(!msg.is_empty() && !msg.contains('\n')),
    }
    match parse_size(text) {
        Ok(n) => {
            let shown = format_size(n);
            assert_eq!(parse_size(&shown), Ok(n), "{text:?} -> {shown:?}");
        }
        Err(msg) => assert!(!msg.is_empty() && !msg.contains('\n')),
    }
});
