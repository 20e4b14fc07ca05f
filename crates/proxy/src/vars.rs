//! The variables of configured templates (`{host}`, `{uri}`, `{header.NAME}`, captures) for one request.

use crate::sticky::cookie_value;
use portico_config::{PathMatch, Route, Template, Var, Vars};
use portico_http1::RequestHead;
use std::borrow::Cow;
use std::cell::OnceCell;

/// One request's variables: its head, how the client connected, and the route's `path_regex`
/// captures (taken on first use).
pub(crate) struct RequestVars<'a> {
    head: &'a RequestHead,
    route: &'a Route,
    tls: bool,
    ip: &'a str,
    captures: OnceCell<Option<regex::Captures<'a>>>,
}

impl<'a> RequestVars<'a> {
    pub(crate) fn new(head: &'a RequestHead, route: &'a Route, tls: bool, ip: &'a str) -> Self {
        RequestVars {
            head,
            route,
            tls,
            ip,
            captures: OnceCell::new(),
        }
    }

    /// The port of the authority the request's host came from (an absolute-form target's,
    /// else the Host field's), if it names one.
    fn port(&self) -> Option<&'a str> {
        let host = match absolute_authority(self.head.target()) {
            Some(a) => a,
            None => std::str::from_utf8(self.head.field("host")?).ok()?,
        };
        let after = match host.strip_prefix('[') {
            // [v6]:port
            Some(v6) => &v6[v6.find(']')? + 1..],
            None => host,
        };
        let (_, port) = after.rsplit_once(':')?;
        (!port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())).then_some(port)
    }
}

impl Vars for RequestVars<'_> {
    fn write(&self, v: &Var, out: &mut String) {
        let head = self.head;
        match v {
            Var::Scheme => out.push_str(if self.tls { "https" } else { "http" }),
            Var::Host => out.push_str(self.head.host().unwrap_or_default()),
            Var::Port => match self.port() {
                Some(p) => out.push_str(p),
                None => out.push_str(if self.tls { "443" } else { "80" }),
            },
            Var::Path => out.push_str(head.path()),
            Var::Query => out.push_str(head.query().unwrap_or_default()),
            Var::Uri => {
                out.push_str(head.path());
                if let Some(q) = head.query() {
                    out.push('?');
                    out.push_str(q);
                }
            }
            Var::RemoteAddr => out.push_str(self.ip),
            Var::Method => out.push_str(head.method().as_str()),
            Var::Header(name) => {
                if let Some(v) = head.field(name) {
                    out.push_str(&String::from_utf8_lossy(v));
                }
            }
            Var::Cookie(name) => {
                let value = head
                    .field("cookie")
                    .and_then(|c| cookie_value(c, name.as_bytes()));
                if let Some(v) = value {
                    out.push_str(&String::from_utf8_lossy(v));
                }
            }
            Var::Capture(i) => {
                let caps = self
                    .captures
                    .get_or_init(|| match &self.route.matcher.path {
                        Some(PathMatch::Regex(re)) => re.0.captures(head.path()),
                        _ => None,
                    });
                if let Some(m) = caps.as_ref().and_then(|c| c.get(*i)) {
                    out.push_str(m.as_str());
                }
            }
        }
    }
}

/// The authority of an absolute-form target (`http://host:port/path` -> `host:port`).
pub(crate) fn absolute_authority(target: &str) -> Option<&str> {
    if target.starts_with('/') {
        return None;
    }
    let rest = target.split_once("://")?.1;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let auth = &rest[..end];
    // Drop userinfo if present (never forwarded).
    Some(auth.rsplit_once('@').map_or(auth, |(_, h)| h)).filter(|a| !a.is_empty())
}

/// The variables of a request target: values taken from fields (`{header.NAME}`,
/// `{cookie.NAME}`) are percent-encoded (everything but unreserved characters), so that a
/// client's field cannot add a path segment, a query, a space or `..` to the target.
struct TargetVars<'v, 'a>(&'v RequestVars<'a>);

impl Vars for TargetVars<'_, '_> {
    fn write(&self, v: &Var, out: &mut String) {
        if !matches!(v, Var::Header(_) | Var::Cookie(_)) {
            return self.0.write(v, out);
        }
        let mut raw = String::new();
        self.0.write(v, &mut raw);
        for b in raw.bytes() {
            if b.is_ascii_alphanumeric() || b"-_~".contains(&b) {
                out.push(char::from(b));
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
    }
}

/// The upstream target a `rewrite` template makes: a leading '/' when the value has none, and
/// the client's query appended when the value has no query of its own (as nginx's `rewrite`).
/// Field values in it are percent-encoded ([`TargetVars`]).
pub(crate) fn rewritten(t: &Template, vars: &RequestVars<'_>) -> String {
    let value: Cow<'_, str> = t.render(&TargetVars(vars));
    let mut out = String::with_capacity(value.len() + 16);
    if !value.starts_with('/') {
        out.push('/');
    }
    out.push_str(&value);
    if !value.contains('?') {
        if let Some(q) = vars.head.query() {
            out.push('?');
            out.push_str(q);
        }
    }
    out
}

/// A redirect's `Location`. A path-relative target (written starting with one `/`) whose value
/// starts with `//` or `/\\` after the variables are filled in (a capture or `{path}` of
/// `/go//evil.example`) would be taken by browsers as another host: its leading slashes and
/// backslashes become one `/`.
pub(crate) fn location<'t>(t: &'t Template, vars: &RequestVars<'_>) -> Cow<'t, str> {
    let value = t.render(vars);
    let source = t.to_string();
    let relative = source.starts_with('/') && !source.starts_with("//");
    if relative && (value.starts_with("//") || value.starts_with("/\\")) {
        let rest = value.trim_start_matches(['/', '\\']);
        return Cow::Owned(format!("/{rest}"));
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;

    fn config(route: &str) -> portico_config::Config {
        let text = format!(
            "[[listeners]]\naddress = \"127.0.0.1:1\"\n[[listeners.routes]]\n{route}\n\
             [upstreams.a]\nservers = [\"127.0.0.1:2\"]\n"
        );
        portico_config::parse(&text, "t.toml").unwrap_or_else(|e| panic!("{e}"))
    }

    fn head(wire: &str) -> RequestHead {
        let mut buf = BytesMut::from(format!("{wire}\r\n\r\n").as_bytes());
        portico_http1::parse_request(&mut buf, &Default::default())
            .unwrap()
            .unwrap()
    }

    #[test]
    fn every_variable_reads_the_request() {
        let c = config(
            "path_regex = '^/u/(?P<id>[0-9]+)/(\\w+)$'\nredirect = \"{scheme}|{host}|{port}|{path}|{query}|{uri}|{remote_addr}|{method}|{header.x-a}|{cookie.sid}|{id}|{2}|{0}|{header.none}\"",
        );
        let route = &c.listeners[0].routes[0];
        let portico_config::Action::Redirect { location, .. } = &route.action else {
            panic!()
        };
        let h = head("GET /u/42/edit?x=1 HTTP/1.1\r\nHost: Example.com:8443\r\nX-A: b\r\nCookie: a=1; sid=s2");
        let vars = RequestVars::new(&h, route, true, "10.0.0.9");
        assert_eq!(
            location.render(&vars),
            "https|Example.com|8443|/u/42/edit|x=1|/u/42/edit?x=1|10.0.0.9|GET|b|s2|42|edit|/u/42/edit|"
        );
        let h = head("GET /u/1/x HTTP/1.1\r\nHost: [::1]");
        let vars = RequestVars::new(&h, route, false, "::1");
        let t = Template::parse("{host} {port} {query}.", None).unwrap();
        assert_eq!(t.render(&vars), "[::1] 80 .");
    }

    #[test]
    fn field_values_are_encoded_in_targets_and_redirects_stay_on_the_host() {
        let c = config(
            "path_regex = '^/go/(.*)$'\nproxy = \"a\"\nrewrite = \"/t/{header.x-tenant}/{cookie.s}{uri}\"",
        );
        let route = &c.listeners[0].routes[0];
        let portico_config::Action::Proxy(p) = &route.action else {
            panic!()
        };
        let h = head("GET /go/x HTTP/1.1\r\nHost: a\r\nX-Tenant: a HTTP/1.0\r\nCookie: s=..");
        let vars = RequestVars::new(&h, route, false, "1");
        let target = rewritten(p.rewrite.as_ref().unwrap(), &vars);
        assert_eq!(target, "/t/a%20HTTP%2F1%2E0/%2E%2E/go/x");
        let h = head("GET /go//evil.example HTTP/1.1\r\nHost: a");
        let vars = RequestVars::new(&h, route, false, "1");
        let names = [None, None];
        let caps = Some(portico_config::Captures { names: &names });
        let t = Template::parse("/{1}", caps).unwrap();
        assert_eq!(location(&t, &vars), "/evil.example");
        let t = Template::parse("{path}", None).unwrap();
        assert_eq!(
            location(&t, &vars),
            "/go//evil.example",
            "not path-relative as written"
        );
        let t = Template::parse("//cdn.example{path}", None).unwrap();
        assert_eq!(location(&t, &vars), "//cdn.example/go//evil.example");
        // {port} comes from the same authority as {host}.
        let h = head("GET http://b.example:8443/x HTTP/1.1\r\nHost: b.example");
        let vars = RequestVars::new(&h, route, false, "1");
        let t = Template::parse("{host}:{port}", None).unwrap();
        assert_eq!(t.render(&vars), "b.example:8443");
    }

    #[test]
    fn a_rewrite_keeps_the_query_unless_it_sets_one() {
        let c = config("path_regex = '^/old/(.*)$'\nproxy = \"a\"\nrewrite = \"/new/{1}\"");
        let route = &c.listeners[0].routes[0];
        let portico_config::Action::Proxy(p) = &route.action else {
            panic!()
        };
        let t = p.rewrite.as_ref().unwrap();
        let h = head("GET /old/a/b?q=1 HTTP/1.1\r\nHost: x");
        assert_eq!(
            rewritten(t, &RequestVars::new(&h, route, false, "1")),
            "/new/a/b?q=1"
        );
        let own = Template::parse(
            "{1}?page={1}",
            Some(portico_config::Captures {
                names: &[None, None],
            }),
        )
        .unwrap();
        assert_eq!(
            rewritten(&own, &RequestVars::new(&h, route, false, "1")),
            "/a/b?page=a/b"
        );
    }
}
