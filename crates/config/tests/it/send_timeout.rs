//! The listener's `limits.send_timeout`: typed, validated with its position, shown by `explain`.

use portico_config::{explain, parse};
use std::time::Duration;

fn with_limits(body: &str) -> String {
    format!("[[listeners]]\naddress = \"127.0.0.1:8080\"\n[listeners.limits]\n{body}\n[[listeners.routes]]\norigin = true\n")
}

/// The first error, displayed.
fn err(text: &str) -> String {
    match parse(text, "t.toml") {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn send_timeout_defaults_to_60s_and_is_typed() {
    let c = parse(&with_limits(""), "t.toml").unwrap();
    assert_eq!(c.listeners[0].limits.send_timeout, Duration::from_secs(60));
    assert!(!explain(&c).contains("send_timeout"));

    let c = parse(&with_limits("send_timeout = \"300ms\""), "t.toml").unwrap();
    assert_eq!(
        c.listeners[0].limits.send_timeout,
        Duration::from_millis(300)
    );
    let text = explain(&c);
    assert!(text.contains("send_timeout 300ms (default 1m)"), "{text}");
}

#[test]
fn send_timeout_errors_name_the_key_and_position() {
    assert_eq!(
        err(&with_limits("send_timeout = \"0s\"")),
        "t.toml:4:16: listeners[0].limits.send_timeout: must be greater than zero"
    );
    assert_eq!(
        err(&with_limits("send_timeout = 30")),
        "t.toml:4:16: listeners[0].limits.send_timeout: expected a duration string such as \"30s\" (units: us, ms, s, m, h), found the integer 30"
    );
    assert!(err(&with_limits("send_timeout = \"fast\""))
        .starts_with("t.toml:4:16: listeners[0].limits.send_timeout: invalid duration \"fast\""));
}
