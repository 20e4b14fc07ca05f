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

#[test]
fn sticky_cookie_short_and_long_forms() {
    let c = parse(&group("sticky_cookie = \"SRV\""), "t.toml").unwrap();
    let s = c.upstreams[0].sticky_cookie.as_ref().unwrap();
    assert_eq!(s.set_cookie("x"), "SRV=x; Path=/; HttpOnly");
    let c = parse(
        &group("[upstreams.api.sticky_cookie]\nname = \"S\"\npath = \"/app\"\nmax_age = \"1h\"\nhttponly = false\nsecure = true\nsamesite = \"none\""),
        "t.toml",
    )
    .unwrap();
    let s = c.upstreams[0].sticky_cookie.as_ref().unwrap();
    assert_eq!(
        s.set_cookie("x"),
        "S=x; Path=/app; Max-Age=3600; Secure; SameSite=None"
    );
    let text = portico_config::explain(&c);
    assert!(
        text.contains("sticky_cookie: Set-Cookie: S=ID; Path=/app"),
        "{text}"
    );
    assert!(parse(&group(""), "t.toml").unwrap().upstreams[0]
        .sticky_cookie
        .is_none());
}

#[test]
fn sticky_cookie_errors_name_the_key() {
    assert_eq!(
        err(&group("sticky_cookie = \"a b\"")),
        "t.toml:3:17: upstreams.api.sticky_cookie: invalid cookie name \"a b\": must be a non-empty token"
    );
    assert_eq!(
        err(&group("sticky_cookie = { path = \"/\" }")),
        "t.toml:3:17: upstreams.api.sticky_cookie: sticky_cookie table needs a `name`, e.g. { name = \"PORTICO_SRV\" }"
    );
    assert_eq!(
        err(&group("sticky_cookie = { name = \"S\", path = \"x;y\" }")),
        "t.toml:3:38: upstreams.api.sticky_cookie.path: invalid cookie path \"x;y\": must start with '/' and contain no ';' or control characters"
    );
    assert_eq!(
        err(&group("sticky_cookie = { name = \"S\", max_age = \"1500ms\" }")),
        "t.toml:3:41: upstreams.api.sticky_cookie.max_age: Max-Age is whole seconds: use a duration such as \"30s\", \"10m\" or \"1h\""
    );
    assert_eq!(
        err(&group("sticky_cookie = { name = \"S\", samesite = \"none\" }")),
        "t.toml:3:42: upstreams.api.sticky_cookie.samesite: samesite = \"none\" needs secure = true (browsers drop such cookies otherwise)"
    );
    assert_eq!(
        err(&group("sticky_cookie = { name = \"S\", samesite = \"loose\" }")),
        "t.toml:3:42: upstreams.api.sticky_cookie.samesite: unknown SameSite value \"loose\"; expected \"strict\", \"lax\" or \"none\""
    );
    assert_eq!(
        err(&group("balance = { hash_cookie = \"S\" }\nsticky_cookie = \"S\"")),
        "t.toml:4:17: upstreams.api.sticky_cookie: cookie \"S\" is already the hash_cookie key: Portico would overwrite the client's value; use another name"
    );
    let e = err(&group("sticky_cookie = { name = \"S\", maxage = \"1h\" }"));
    assert!(
        e.starts_with("t.toml:3:31: upstreams.api.sticky_cookie.maxage: unknown field `maxage`"),
        "{e}"
    );
}

fn listener(shed: &str) -> String {
    format!("[[listeners]]\naddress = \"127.0.0.1:8080\"\n{shed}\n[[listeners.routes]]\nrespond = {{ status = 200 }}\n")
}

#[test]
fn shed_is_off_by_default_and_typed_when_set() {
    let c = parse(&listener(""), "t.toml").unwrap();
    assert_eq!(c.listeners[0].shed, None);
    let c = parse(&listener("shed = {}"), "t.toml").unwrap();
    assert_eq!(c.listeners[0].shed, Some(portico_config::Shed::DEFAULT));
    let c = parse(
        &listener("[listeners.shed]\ntarget = \"5ms\"\ninterval = \"50ms\""),
        "t.toml",
    )
    .unwrap();
    let s = c.listeners[0].shed.unwrap();
    assert_eq!(
        (s.target, s.interval),
        (Duration::from_millis(5), Duration::from_millis(50))
    );
    let text = portico_config::explain(&c);
    assert!(
        text.contains("shed: fast 503 for new requests while a worker's event loop lags more than 5ms (after 50ms above it)"),
        "{text}"
    );
}

#[test]
fn shed_errors_name_the_key() {
    assert_eq!(
        err(&listener("shed = { target = \"500us\" }")),
        "t.toml:3:19: listeners[0].shed.target: must be at least 1ms (event-loop lag is measured with millisecond timers)"
    );
    assert_eq!(
        err(&listener("shed = { target = \"50ms\", interval = \"10ms\" }")),
        "t.toml:3:38: listeners[0].shed.interval: interval (10ms) must not be shorter than target (50ms)"
    );
    assert_eq!(
        err(&listener("shed = { target = 5 }")),
        "t.toml:3:19: listeners[0].shed.target: expected a duration string such as \"5s\" (units: us, ms, s, m, h), found the integer 5"
    );
    let e = err(&listener("shed = { targett = \"5ms\" }"));
    assert!(
        e.starts_with("t.toml:3:10: listeners[0].shed.targett: unknown field `targett`"),
        "{e}"
    );
}
