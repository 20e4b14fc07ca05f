//! Route selection (sans-io): the first route in file order whose host, path, method and headers match.

use portico_config::{Matcher, Route};

/// Index of the first matching route. `field` looks up a request header by lowercased name.
pub fn select<'a>(
    routes: &[Route],
    method: &str,
    host: Option<&str>,
    path: &str,
    field: impl Fn(&str) -> Option<&'a [u8]>,
) -> Option<usize> {
    routes
        .iter()
        .position(|r| matches(&r.matcher, method, host, path, &field))
}

fn matches<'a>(
    m: &Matcher,
    method: &str,
    host: Option<&str>,
    path: &str,
    field: &impl Fn(&str) -> Option<&'a [u8]>,
) -> bool {
    if !m.hosts.is_empty() {
        let Some(host) = host else { return false };
        if !m.hosts.iter().any(|h| h.matches(host)) {
            return false;
        }
    }
    if m.path.as_ref().is_some_and(|p| !p.matches(path)) {
        return false;
    }
    if !m.methods.is_empty() && !m.methods.iter().any(|x| x == method) {
        return false;
    }
    m.headers
        .iter()
        .all(|(name, want)| match (field(name), want) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(v), Some(w)) => v == w.as_bytes(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use portico_config::{Action, HeaderRules, HostMatch, PathMatch};

    fn route(name: &str, matcher: Matcher) -> Route {
        Route {
            name: name.into(),
            matcher,
            action: Action::Fixed {
                status: 200,
                content_type: "text/plain".into(),
                body: String::new(),
            },
            max_body_bytes: 0,
            request_headers: HeaderRules::default(),
            response_headers: HeaderRules::default(),
            rate_limit: None,
            compression: None,
            cors: None,
            ip_rules: None,
            basic_auth: None,
            forward_auth: None,
            jwt: None,
            client_cert: None,
        }
    }

    fn pick<'r>(
        routes: &'r [Route],
        method: &str,
        host: Option<&str>,
        path: &str,
    ) -> Option<&'r str> {
        select(routes, method, host, path, |n| {
            if n == "x-canary" {
                Some(b"1".as_slice())
            } else {
                None
            }
        })
        .map(|i| routes[i].name.as_str())
    }

    #[test]
    fn first_match_in_file_order_wins() {
        let routes = vec![
            route(
                "exact",
                Matcher {
                    path: Some(PathMatch::Exact("/health".into())),
                    ..Default::default()
                },
            ),
            route(
                "api",
                Matcher {
                    path: Some(PathMatch::Prefix("/api/".into())),
                    ..Default::default()
                },
            ),
            route(
                "wild",
                Matcher {
                    hosts: vec![HostMatch::Suffix(".example.com".into())],
                    ..Default::default()
                },
            ),
            route(
                "canary",
                Matcher {
                    headers: vec![("x-canary".into(), Some("1".into()))],
                    ..Default::default()
                },
            ),
        ];
        assert_eq!(pick(&routes, "GET", None, "/health"), Some("exact"));
        assert_eq!(pick(&routes, "GET", None, "/healthz"), Some("canary"));
        assert_eq!(
            pick(&routes, "GET", Some("a.example.com"), "/api/x"),
            Some("api")
        );
        assert_eq!(
            pick(&routes, "GET", Some("A.Example.COM"), "/x"),
            Some("wild")
        );
        assert_eq!(
            pick(&routes, "GET", Some("example.com"), "/x"),
            Some("canary")
        );
    }

    #[test]
    fn methods_and_missing_headers_do_not_match() {
        let routes = vec![
            route(
                "post",
                Matcher {
                    methods: vec!["POST".into()],
                    ..Default::default()
                },
            ),
            route(
                "needs-header",
                Matcher {
                    headers: vec![("x-missing".into(), None)],
                    ..Default::default()
                },
            ),
        ];
        assert_eq!(pick(&routes, "POST", None, "/"), Some("post"));
        assert_eq!(pick(&routes, "GET", None, "/"), None);
    }
}
