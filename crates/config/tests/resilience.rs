//! Route resilience keys (`retry`): defaults, parsing, errors and `explain`.

use portico_config::{explain, parse, Action, ProxyAction, RetryOn, RetryPolicy};

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
