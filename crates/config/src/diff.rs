//! What changed between two configurations, in words for the reload log line and the admin API's answer.

use crate::model::{Config, Listener, UpstreamGroup};
use std::collections::BTreeSet;

/// One phrase per change: `listener "api" added`, `route "web/static" changed`, `group
/// "backend": server 10.0.0.3:80 removed`, `access_log changed`. Settings are compared whole
/// (a listener's own settings apart from its routes, each route, each group apart from its
/// servers, each server's weight); nothing for an identical configuration.
pub fn changes(old: &Config, new: &Config) -> Vec<String> {
    let mut out = Vec::new();
    let top = [
        ("workers", same(&old.workers, &new.workers)),
        ("drain_timeout", old.drain_timeout == new.drain_timeout),
        ("access_log", same(&old.access_log, &new.access_log)),
        ("log", old.log == new.log),
        ("request_id", old.request_id == new.request_id),
        ("trace", old.trace == new.trace),
        ("cache", old.cache == new.cache),
        ("admin", old.admin == new.admin),
    ];
    for (key, equal) in top {
        if !equal {
            out.push(format!("{key} changed"));
        }
    }
    named(
        &mut out,
        "listener",
        &old.listeners,
        &new.listeners,
        |l| &l.name,
        |a, b| {
            let mut changes = Vec::new();
            if !same(&without_routes(a), &without_routes(b)) {
                changes.push(format!("listener {:?} changed", a.name));
            }
            named(
                &mut changes,
                "route",
                &a.routes,
                &b.routes,
                |r| &r.name,
                |x, y| {
                    if same(x, y) {
                        vec![]
                    } else {
                        vec![format!("route {:?} changed", x.name)]
                    }
                },
            );
            changes
        },
    );
    named(
        &mut out,
        "group",
        &old.upstreams,
        &new.upstreams,
        |g| &g.name,
        |a, b| {
            let mut changes = Vec::new();
            if !same(&without_servers(a), &without_servers(b)) {
                changes.push(format!("group {:?} changed", a.name));
            }
            for s in &b.servers {
                match a.servers.iter().find(|o| o.address == s.address) {
                    None => changes.push(format!("group {:?}: server {} added", a.name, s.address)),
                    Some(o) if o.weight != s.weight => changes.push(format!(
                        "group {:?}: server {} weight {} -> {}",
                        a.name, s.address, o.weight, s.weight
                    )),
                    Some(_) => {}
                }
            }
            for s in &a.servers {
                if !b.servers.iter().any(|n| n.address == s.address) {
                    changes.push(format!("group {:?}: server {} removed", a.name, s.address));
                }
            }
            changes
        },
    );
    out
}

/// Items by name: added, removed, and `inner`'s findings for those in both (new order).
fn named<T>(
    out: &mut Vec<String>,
    what: &str,
    old: &[T],
    new: &[T],
    name: impl Fn(&T) -> &String,
    inner: impl Fn(&T, &T) -> Vec<String>,
) {
    let old_names: BTreeSet<&String> = old.iter().map(&name).collect();
    for n in new {
        match old.iter().find(|o| name(o) == name(n)) {
            None => out.push(format!("{what} {:?} added", name(n))),
            Some(o) => out.extend(inner(o, n)),
        }
    }
    for o in old_names {
        if !new.iter().any(|n| name(n) == o) {
            out.push(format!("{what} {o:?} removed"));
        }
    }
}

/// Equal as far as their `Debug` forms tell (the model does not implement `PartialEq` whole:
/// compiled patterns do not compare); a reload is rare, so the cost does not matter.
fn same<T: std::fmt::Debug>(a: &T, b: &T) -> bool {
    format!("{a:?}") == format!("{b:?}")
}

fn without_routes(l: &Listener) -> Listener {
    Listener {
        routes: Vec::new(),
        ..l.clone()
    }
}

fn without_servers(g: &UpstreamGroup) -> UpstreamGroup {
    UpstreamGroup {
        servers: Vec::new(),
        ..g.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::changes;
    use crate::parse;

    const BASE: &str = r#"
[[listeners]]
name = "web"
address = "127.0.0.1:8080"

[[listeners.routes]]
name = "api"
path = "/api/"
proxy = "backend"

[[listeners.routes]]
name = "rest"
origin = true

[upstreams.backend]
servers = ["127.0.0.1:9001", "127.0.0.1:9002"]
"#;

    #[test]
    fn names_each_change_and_nothing_for_the_same_file() {
        let a = parse(BASE, "a.toml").unwrap();
        assert_eq!(
            changes(&a, &parse(BASE, "a.toml").unwrap()),
            Vec::<String>::new()
        );
        let edited = BASE
            .replace("path = \"/api/\"", "path = \"/v2/\"")
            .replace(
                "\"127.0.0.1:9002\"",
                "{ address = \"127.0.0.1:9003\", weight = 2 }",
            )
            .replace("name = \"rest\"", "name = \"other\"")
            + "\n[access_log]\n";
        let b = parse(&edited, "a.toml").unwrap();
        assert_eq!(
            changes(&a, &b),
            vec![
                "access_log changed",
                "route \"api\" changed",
                "route \"other\" added",
                "route \"rest\" removed",
                "group \"backend\": server 127.0.0.1:9003 added",
                "group \"backend\": server 127.0.0.1:9002 removed",
            ]
        );
    }
}
