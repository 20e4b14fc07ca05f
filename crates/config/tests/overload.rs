//! Overload keys: upstream `queue` / `queue_timeout`, `sticky_cookie`, listener `shed`.

use portico_config::{parse, parse_all};
use std::time::Duration;

/// The first error, displayed.
fn err(text: &str) -> String {
    match parse(text, "t.toml") {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(e) => e.to_string(),
    }
}

const ROUTE: &str =
    "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\nproxy = \"api\"\n";

fn group(keys: &str) -> String {
    format!("[upstreams.api]\nservers = [\"127.0.0.1:9001\"]\n{keys}\n{ROUTE}")
}

#[test]
fn queue_keys_are_typed() {
    let c = parse(
        &group("max_connections_per_server = 10\nqueue = 100\nqueue_timeout = \"250ms\""),
        "t.toml",
    )
    .unwrap();
    let g = &c.upstreams[0];
    assert_eq!(
        (g.queue, g.queue_timeout),
        (100, Duration::from_millis(250))
    );
    let text = portico_config::explain(&c);
    assert!(
        text.contains("queue: up to 100 requests wait at most 250ms"),
        "{text}"
    );
    // Defaults: no queue, 1 s timeout.
    let c = parse(&group(""), "t.toml").unwrap();
    assert_eq!(
        (c.upstreams[0].queue, c.upstreams[0].queue_timeout),
        (0, Duration::from_secs(1))
    );
}

#[test]
fn queue_errors_name_the_key() {
    assert_eq!(
        err(&group("queue = 10")),
        "t.toml:3:9: upstreams.api.queue: a queue needs `max_connections_per_server` (requests wait for a server below that limit)"
    );
    assert_eq!(
        err(&group("max_connections_per_server = 1\nqueue = -1")),
        "t.toml:4:9: upstreams.api.queue: must not be negative, found -1"
    );
    assert_eq!(
        err(&group("max_connections_per_server = 1\nqueue_timeout = \"1s\"")),
        "t.toml:4:17: upstreams.api.queue_timeout: queue_timeout needs a queue: set `queue` to the number of requests that may wait"
    );
    assert_eq!(
        err(&group(
            "max_connections_per_server = 1\nqueue = 5\nqueue_timeout = \"0s\""
        )),
        "t.toml:5:17: upstreams.api.queue_timeout: must be greater than zero"
    );
    assert!(parse_all(&group("queue = 0"), "t.toml").is_ok());
}
