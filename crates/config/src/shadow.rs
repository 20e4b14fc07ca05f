//! Routes no request can reach: an earlier route of the same listener matches every request they match (for `portico check` and the start-up log).

use crate::model::{Config, HostMatch, Matcher, PathMatch};

/// One line per route that an earlier route of its listener shadows.
pub fn shadowed_routes(cfg: &Config) -> Vec<String> {
    let mut out = Vec::new();
    for l in &cfg.listeners {
        for (j, later) in l.routes.iter().enumerate() {
            let earlier = l.routes[..j]
                .iter()
                .find(|e| covers(&e.matcher, &later.matcher));
            if let Some(e) = earlier {
                out.push(format!(
                    "listener {:?}: route {:?} is never reached: route {:?} before it matches every request it matches",
                    l.name, later.name, e.name
                ));
            }
        }
    }
    out
}

/// Whether every request `b` matches is matched by `a` too (false when that cannot be told:
/// a `path_regex`).
fn covers(a: &Matcher, b: &Matcher) -> bool {
    let headers = a.headers.iter().all(|h| b.headers.contains(h));
    let methods = a.methods.is_empty()
        || (!b.methods.is_empty() && b.methods.iter().all(|m| a.methods.contains(m)));
    let hosts = a.hosts.is_empty()
        || (!b.hosts.is_empty()
            && b.hosts
                .iter()
                .all(|h| a.hosts.iter().any(|g| host_covers(g, h))));
    headers && methods && hosts && path_covers(a.path.as_ref(), b.path.as_ref())
}

fn host_covers(a: &HostMatch, b: &HostMatch) -> bool {
    match (a, b) {
        (HostMatch::Exact(x), HostMatch::Exact(y)) => x.eq_ignore_ascii_case(y),
        (HostMatch::Suffix(_), HostMatch::Exact(y)) => a.matches(y),
        (HostMatch::Suffix(s), HostMatch::Suffix(t)) => {
            t.len() >= s.len() && t[t.len() - s.len()..].eq_ignore_ascii_case(s)
        }
        (HostMatch::Exact(_), HostMatch::Suffix(_)) => false,
    }
}

fn path_covers(a: Option<&PathMatch>, b: Option<&PathMatch>) -> bool {
    match (a, b) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(PathMatch::Prefix(p)), Some(PathMatch::Prefix(q))) => q.starts_with(p.as_str()),
        (Some(a @ PathMatch::Prefix(_)), Some(PathMatch::Exact(y))) => a.matches(y),
        (Some(PathMatch::Exact(x)), Some(PathMatch::Exact(y))) => x == y,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(routes: &str) -> Vec<String> {
        let text = format!("[[listeners]]\nname = \"l\"\naddress = \"127.0.0.1:1\"\n{routes}");
        shadowed_routes(&crate::parse(&text, "t.toml").unwrap())
    }

    const R: &str = "[[listeners.routes]]\nrespond = { status = 200 }\n";

    #[test]
    fn a_route_after_one_that_matches_all_it_matches_is_reported() {
        // A catch-all first: everything after it is dead.
        let w = lines(&format!("{R}{R}path = \"/api/**\"\n"));
        assert_eq!(w.len(), 1);
        assert!(
            w[0].contains("route \"l#1\" is never reached: route \"l#0\""),
            "{w:?}"
        );
        // A wider prefix before a narrower one, an exact path inside a prefix.
        assert_eq!(
            lines(&format!(
                "{R}path = \"/api/**\"\n{R}path = \"/api/v1/**\"\n"
            ))
            .len(),
            1
        );
        assert_eq!(
            lines(&format!("{R}path = \"/api/**\"\n{R}path = \"/api\"\n")).len(),
            1
        );
        // A wildcard host before one of its names; any method before GET only.
        assert_eq!(
            lines(&format!(
                "{R}host = \"*.example.com\"\n{R}host = \"a.example.com\"\n"
            ))
            .len(),
            1
        );
        assert_eq!(
            lines(&format!(
                "{R}path = \"/x\"\n{R}path = \"/x\"\nmethods = [\"GET\"]\n"
            ))
            .len(),
            1
        );
    }

    #[test]
    fn the_usual_order_narrow_first_is_fine() {
        assert!(lines(&format!("{R}path = \"/api/**\"\n{R}")).is_empty());
        assert!(lines(&format!(
            "{R}host = \"a.example.com\"\n{R}host = \"*.example.com\"\n"
        ))
        .is_empty());
        assert!(lines(&format!(
            "{R}methods = [\"GET\"]\n{R}methods = [\"GET\", \"POST\"]\n"
        ))
        .is_empty());
        assert!(lines(&format!("{R}path = \"/api/**\"\n{R}path = \"/apix\"\n")).is_empty());
        // A header condition narrows the earlier route; a regex is never judged.
        assert!(lines(&format!("{R}headers = {{ \"x-canary\" = \"1\" }}\n{R}")).is_empty());
        assert!(lines(&format!("{R}path_regex = \"^/\"\n{R}path = \"/a\"\n")).is_empty());
    }
}
