//! `[fleet]` and fleet-scoped rate limits: the defaults, the refusals, the password kept out of `portico check`.

use portico_config::{parse, FleetFallback};
use std::time::Duration;

const UP: &str = "[upstreams.app]\nservers = [\"127.0.0.1:9001\"]\n";

fn err(text: &str) -> String {
    match parse(text, "t.toml") {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(e) => e.to_string(),
    }
}

fn route(limit: &str) -> String {
    format!("[[listeners]]\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nproxy = \"app\"\nrate_limit = {limit}\n{UP}")
}

#[test]
fn a_fleet_limit_and_the_defaults() {
    let text = format!(
        "[fleet]\nredis = \"redis://:pw@10.0.0.5:6379/2\"\n{}",
        route("{ rate = 50, scope = \"fleet\" }")
    );
    let c = parse(&text, "t.toml").unwrap();
    let f = c.fleet.as_ref().unwrap();
    assert_eq!(f.instances, 1);
    assert_eq!(f.sync_interval, Duration::from_millis(100));
    assert_eq!(f.on_redis_down, FleetFallback::Local);
    assert_eq!(f.prefix, "portico");
    assert_eq!(f.redis_shown(), "redis://:***@10.0.0.5:6379/2");
    let user_only = portico_config::Fleet {
        redis: "redis://ops@h".into(),
        ..f.clone()
    };
    assert_eq!(user_only.redis_shown(), "redis://ops@h");
    let limit = c.listeners[0].routes[0].rate_limit.as_ref().unwrap();
    assert!(limit.fleet);
    let explained = portico_config::explain(&c);
    assert!(!explained.contains("pw@"), "{explained}");
    assert!(explained.contains("over the whole fleet"), "{explained}");
    assert!(
        explained.contains(
            "fleet: rate limits with scope \"fleet\" count through redis://:***@10.0.0.5:6379/2"
        ),
        "{explained}"
    );
    // local is the default scope
    let c = parse(&route("{ rate = 5 }"), "t.toml").unwrap();
    assert!(!c.listeners[0].routes[0].rate_limit.as_ref().unwrap().fleet);
}

#[test]
fn refusals_name_the_key_and_the_value() {
    assert_eq!(
        err(&route("{ rate = 5, scope = \"fleet\" }")),
        "t.toml:5:34: listeners[0].routes[0].rate_limit.scope: a fleet rate limit counts through the `[fleet]` table's Redis server: add one, e.g. [fleet] redis = \"redis://10.0.0.5:6379/0\""
    );
    let fleet = "[fleet]\nredis = \"redis://127.0.0.1\"\n";
    assert_eq!(
        err(&format!("{fleet}{}", route("{ rate = 5, burst = 9, scope = \"fleet\" }"))),
        "t.toml:7:34: listeners[0].routes[0].rate_limit.burst: a fleet rate limit counts requests in a sliding one-second window of at most `rate`; `burst` is for local limits"
    );
    assert_eq!(
        err(&format!("{fleet}{}", route("{ rate = 0.5, scope = \"fleet\" }"))),
        "t.toml:7:23: listeners[0].routes[0].rate_limit.rate: a fleet rate limit allows at least 1 request per second, found 0.5"
    );
    assert!(err(&format!("{fleet}{}", route("{ rate = 5, scope = \"cluster\" }")))
        .ends_with("unknown scope \"cluster\": use \"local\" (this instance) or \"fleet\" (every instance, counted in Redis)"));
    let table = |t: &str| format!("[fleet]\n{t}\n{}", route("{ rate = 5 }"));
    assert_eq!(
        err(&table("instances = 3")),
        "t.toml:1:1: fleet: a fleet table needs `redis`, the server fleet rate limits count through, e.g. redis = \"redis://10.0.0.5:6379/0\""
    );
    for bad in [
        "http://x",
        "redis://",
        "redis://h:0",
        "redis://h:x",
        "redis://h/a",
        "redis://::1:6379",
        "redis://[::1]junk",
        "redis://h h",
        "redis://0.0.0.0",
        "redis://[::]:6379",
        "redis://:pa/ss@h",
    ] {
        let e = err(&table(&format!("redis = \"{bad}\"")));
        assert!(e.starts_with("t.toml:2:9: fleet.redis: "), "{bad}: {e}");
    }
    for good in [
        "redis://h",
        "redis://u:p@h:1/0",
        "redis://[::1]:6379",
        "redis://[::1]",
        "redis://:p%2Fq@redis-1.internal:6380/3",
    ] {
        parse(&table(&format!("redis = \"{good}\"")), "t.toml")
            .unwrap_or_else(|e| panic!("{good}: {e}"));
    }
    assert_eq!(
        err(&table("redis = \"redis://h\"\nsync_interval = \"300ms\"")),
        "t.toml:3:17: fleet.sync_interval: between 10ms and 250ms"
    );
    assert_eq!(
        err(&table("redis = \"redis://h\"\non_redis_down = \"open\"")),
        "t.toml:3:17: fleet.on_redis_down: unknown mode \"open\": use \"local\" (each instance limits to its share) or \"closed\" (429)"
    );
    assert_eq!(
        err(&table("redis = \"redis://h\"\nprefix = \"a b\"")),
        "t.toml:3:10: fleet.prefix: 1 to 64 printable characters, no spaces"
    );
    assert!(err(&table("redis = \"redis://h\"\ninstances = 0"))
        .contains("fleet.instances: must be at least 1"));
}
