//! Route resilience keys (`retry`, `rate_limit`): defaults, parsing, errors and `explain`.

use portico_config::{
    explain, parse, Action, ProxyAction, RateLimit, RateLimitKey, RetryOn, RetryPolicy,
};

const UPSTREAM: &str = "[upstreams.a]\nservers = [\"127.0.0.1:1\"]\n";

/// A listener with one proxy route whose extra lines are `route`.
fn with(route: &str) -> String {
    format!(
        "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\nproxy = \"a\"\n{route}\n{UPSTREAM}"
    )
}

fn err(route: &str) -> String {
    match parse(&with(route), "t.toml") {
        Ok(_) => panic!("expected an error for:\n{route}"),
        Err(e) => e.to_string(),
    }
}

fn retry_of(route: &str) -> Option<RetryPolicy> {
    let c = parse(&with(route), "t.toml").unwrap_or_else(|e| panic!("{e}"));
    match &c.listeners[0].routes[0].action {
        Action::Proxy(ProxyAction { retry, .. }) => retry.clone(),
        _ => panic!("not a proxy route"),
    }
}

#[test]
fn no_table_no_retries_and_an_empty_table_gets_the_defaults() {
    assert_eq!(retry_of(""), None);
    let r = retry_of("[listeners.routes.retry]\n").unwrap();
    assert_eq!(r.retries, 1);
    assert_eq!(r.on, RetryOn::DEFAULT);
    assert!(!r.on.timeout && r.on.connect && r.on.status(503) && !r.on.status(500));
    assert!(!r.non_idempotent);
    assert_eq!(r.budget, 0.2);
    assert_eq!(r.min_per_second, 10);
}

#[test]
fn every_key() {
    let r = retry_of(
        "retry = { retries = 3, on = [\"timeout\", \"503\"], non_idempotent = true, budget = 0.5, min_per_second = 0 }",
    )
    .unwrap();
    assert_eq!(r.retries, 3);
    assert_eq!(r.on.names(), vec!["timeout", "503"]);
    assert!(r.non_idempotent);
    assert_eq!(r.budget, 0.5);
    assert_eq!(r.min_per_second, 0);
    let text = explain(&parse(&with("retry = { on = \"connect\", budget = 1 }"), "t").unwrap());
    assert!(
        text.contains("retry: up to 1 on connect (idempotent methods, requests without a body)"),
        "{text}"
    );
    assert!(text.contains("budget 100% of requests + 10/s"), "{text}");
}

#[test]
fn errors_name_the_key_and_position() {
    assert_eq!(
        err("[listeners.routes.retry]\nretries = 11\n"),
        "t.toml:6:11: listeners[0].routes[0].retry.retries: must be at most 10, found 11"
    );
    assert_eq!(
        err("[listeners.routes.retry]\non = [\"connect\", \"500\"]\n"),
        "t.toml:6:18: listeners[0].routes[0].retry.on[1]: unknown retry condition \"500\"; expected \"connect\", \"reset\", \"timeout\", \"502\", \"503\", \"504\""
    );
    assert_eq!(
        err("[listeners.routes.retry]\nbudget = 1.5\n"),
        "t.toml:6:10: listeners[0].routes[0].retry.budget: must be a share of requests between 0 and 1 (such as 0.2), found 1.5"
    );
    assert!(err("[listeners.routes.retry]\non = []\n").contains("an empty list retries nothing"));
    assert!(err("[listeners.routes.retry]\nbudget = \"20%\"\n").contains("a number"));
}

#[test]
fn retry_only_on_proxy_routes() {
    let text = "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\norigin = true\nretry = { retries = 2 }\n";
    let e = parse(text, "t.toml").unwrap_err().to_string();
    assert_eq!(
        e,
        "t.toml:5:21: listeners[0].routes[0].retry: `retry` only applies to proxy routes; this route's action is `origin`"
    );
}

fn limit_of(route: &str) -> Option<RateLimit> {
    let c = parse(&with(route), "t.toml").unwrap_or_else(|e| panic!("{e}"));
    c.listeners[0].routes[0].rate_limit.clone()
}

#[test]
fn rate_limit_defaults_and_keys() {
    assert_eq!(limit_of(""), None);
    let l = limit_of("rate_limit = { rate = 2.5 }").unwrap();
    assert_eq!(l.rate, 2.5);
    assert_eq!(l.burst, 3, "the burst defaults to the rate rounded up");
    assert_eq!(l.key, RateLimitKey::ClientIp);
    assert_eq!(l.max_keys, 100_000);
    let l = limit_of("[listeners.routes.rate_limit]\nrate = 100\nburst = 20\nheader = \"X-Api-Key\"\nmax_keys = 50\n").unwrap();
    assert_eq!((l.burst, l.max_keys), (20, 50));
    assert_eq!(l.key, RateLimitKey::Header("x-api-key".into()));
    let l = limit_of("rate_limit = { rate = 0.1, cookie = \"sid\" }").unwrap();
    assert_eq!((l.burst, l.key), (1, RateLimitKey::Cookie("sid".into())));
    let text = explain(&parse(&with("rate_limit = { rate = 5, cookie = \"sid\" }"), "t").unwrap());
    assert!(
        text.contains("rate_limit: 5/s per cookie sid (else client IP), burst 5"),
        "{text}"
    );
}

#[test]
fn rate_limit_errors_name_the_key_and_position() {
    assert_eq!(
        err("[listeners.routes.rate_limit]\nburst = 5\n"),
        "t.toml:6:9: listeners[0].routes[0].rate_limit.rate: a rate_limit needs `rate`, the requests allowed per second (such as rate = 10)"
    );
    assert_eq!(
        err("[listeners.routes.rate_limit]\nrate = 0\n"),
        "t.toml:6:8: listeners[0].routes[0].rate_limit.rate: must be a number of requests per second above 0 (at most 1e9), found 0"
    );
    assert_eq!(
        err("[listeners.routes.rate_limit]\nrate = 1\nburst = 0\n"),
        "t.toml:7:9: listeners[0].routes[0].rate_limit.burst: must be at least 1, found 0"
    );
    assert_eq!(
        err("rate_limit = { rate = 1, header = \"a\", cookie = \"b\" }"),
        "t.toml:5:49: listeners[0].routes[0].rate_limit.cookie: a rate limit counts by one key: set `header` or `cookie`, not both (neither = the client IP)"
    );
    assert!(err("rate_limit = { rate = 1, header = \"a b\" }").contains("invalid header name"));
    assert!(err("rate_limit = { rate = 1, cookie = \"a;b\" }").contains("invalid cookie name"));
    assert!(err("rate_limit = { rate = 1, max_keys = 0 }").contains("must be at least 1"));
}
