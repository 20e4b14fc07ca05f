//! The CORS filter, sans-io: a preflight's answer, and the `Access-Control-*` fields of a response to an allowed origin.

use super::Edits;
use portico_config::Cors;
use portico_http1::{Method, RequestHead};
use std::borrow::Cow;

/// The `Access-Control-*` fields a server may send; Portico's policy owns them on its routes (a
/// server's own are dropped, so a response never carries two answers).
pub(crate) const CORS_FIELDS: [&str; 6] = [
    "access-control-allow-origin",
    "access-control-allow-credentials",
    "access-control-expose-headers",
    "access-control-allow-methods",
    "access-control-allow-headers",
    "access-control-max-age",
];

/// Methods a page may use without the server naming them (CORS-safelisted).
const SAFELISTED: [&str; 3] = ["GET", "HEAD", "POST"];

/// A preflight's answer: the fields of a `204`, or why it is refused.
pub(crate) type Preflight = Result<Vec<(&'static str, String)>, &'static str>;

/// The answer to `head` when it is a preflight (`OPTIONS` with `Origin` and
/// `Access-Control-Request-Method`); None for any other request.
pub(crate) fn preflight(c: &Cors, head: &RequestHead) -> Option<Preflight> {
    if *head.method() != Method::Options {
        return None;
    }
    let origin = head.field("origin")?;
    let method = head.field("access-control-request-method")?;
    Some(answer(
        c,
        origin,
        method,
        head.field("access-control-request-headers"),
    ))
}

fn answer(c: &Cors, origin: &[u8], method: &[u8], asked: Option<&[u8]>) -> Preflight {
    if !c.allows(origin) {
        return Err("origin not allowed");
    }
    let method = std::str::from_utf8(method).map_err(|_| "method not allowed")?;
    let listed = |m: &String| m == method;
    if !c.methods.iter().any(listed) && !SAFELISTED.contains(&method) {
        return Err("method not allowed");
    }
    let asked = asked.map(|v| String::from_utf8_lossy(v).into_owned());
    let names = || {
        let asked = asked.as_deref().unwrap_or_default();
        asked.split(',').map(str::trim).filter(|n| !n.is_empty())
    };
    if let Some(allowed) = &c.headers {
        if !names().all(|n| allowed.iter().any(|a| a.eq_ignore_ascii_case(n))) {
            return Err("header not allowed");
        }
    }
    let mut fields = vec![("Access-Control-Allow-Origin", allow_origin(c, origin))];
    if c.credentials {
        fields.push(("Access-Control-Allow-Credentials", "true".to_string()));
    }
    fields.push(("Access-Control-Allow-Methods", c.methods.join(", ")));
    let headers = match &c.headers {
        // Any: the ones asked for are allowed back.
        None => names().collect::<Vec<_>>().join(", "),
        Some(list) => list.join(", "),
    };
    if !headers.is_empty() {
        fields.push(("Access-Control-Allow-Headers", headers));
    }
    if let Some(age) = c.max_age {
        fields.push(("Access-Control-Max-Age", age.as_secs().to_string()));
    }
    fields.push((
        "Vary",
        "Origin, Access-Control-Request-Method, Access-Control-Request-Headers".to_string(),
    ));
    Ok(fields)
}

/// `Access-Control-Allow-Origin` for an allowed `origin`: `*` when any origin is allowed
/// without credentials, else the origin itself.
fn allow_origin(c: &Cors, origin: &[u8]) -> String {
    match c.origins.is_empty() && !c.credentials {
        true => "*".to_string(),
        false => String::from_utf8_lossy(origin).into_owned(),
    }
}

/// The response fields for a request under the policy: the server's `Access-Control-*` fields
/// dropped; for an allowed `Origin`, the allowed origin, credentials and exposed fields; and
/// `Vary: Origin` whenever the answer depends on the origin.
pub(crate) fn response(c: &Cors, head: &RequestHead, edits: &mut Edits<'_>) {
    edits.own_cors_fields();
    let varies = !c.origins.is_empty() || c.credentials;
    if varies {
        edits.add("Vary", Cow::Borrowed("Origin"));
    }
    let Some(origin) = head.field("origin") else {
        return;
    };
    if !c.allows(origin) {
        return;
    }
    edits.add(
        "Access-Control-Allow-Origin",
        Cow::Owned(allow_origin(c, origin)),
    );
    if c.credentials {
        edits.add("Access-Control-Allow-Credentials", Cow::Borrowed("true"));
    }
    if !c.expose_headers.is_empty() {
        let exposed = c.expose_headers.join(", ");
        edits.add("Access-Control-Expose-Headers", Cow::Owned(exposed));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cors(table: &str) -> Cors {
        let text = format!(
            "[[listeners]]\naddress = \"127.0.0.1:1\"\n[[listeners.routes]]\nproxy = \"a\"\n\
             [listeners.routes.cors]\n{table}\n[upstreams.a]\nservers = [\"127.0.0.1:2\"]\n"
        );
        let c = portico_config::parse(&text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
        c.listeners[0].routes[0].cors.clone().unwrap()
    }

    fn field<'a>(f: &'a [(&str, String)], name: &str) -> Option<&'a str> {
        f.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn a_preflight_from_an_allowed_origin_gets_the_policy() {
        let c = cors(
            "allow_origins = [\"https://app.example.com\", \"https://*.example.org\"]\n\
             allow_methods = [\"PUT\", \"DELETE\"]\nallow_headers = [\"Content-Type\", \"x-token\"]\n\
             allow_credentials = true\nmax_age = \"10m\"",
        );
        let ok = answer(
            &c,
            b"https://app.example.com",
            b"PUT",
            Some(b"content-type, X-Token"),
        )
        .unwrap();
        assert_eq!(
            field(&ok, "access-control-allow-origin"),
            Some("https://app.example.com")
        );
        assert_eq!(field(&ok, "access-control-allow-credentials"), Some("true"));
        assert_eq!(
            field(&ok, "access-control-allow-methods"),
            Some("PUT, DELETE")
        );
        assert_eq!(
            field(&ok, "access-control-allow-headers"),
            Some("content-type, x-token")
        );
        assert_eq!(field(&ok, "access-control-max-age"), Some("600"));
        assert!(field(&ok, "vary").unwrap().starts_with("Origin"));
        // Subdomains of the pattern, and safelisted methods without being listed.
        assert!(answer(&c, b"https://a.b.example.org", b"GET", None).is_ok());
        assert_eq!(
            answer(&c, b"https://example.org", b"PUT", None),
            Err("origin not allowed")
        );
        assert_eq!(
            answer(&c, b"http://app.example.com", b"PUT", None),
            Err("origin not allowed")
        );
        assert_eq!(
            answer(&c, b"https://evil.com", b"PUT", None),
            Err("origin not allowed")
        );
        assert_eq!(
            answer(&c, b"https://app.example.com", b"PATCH", None),
            Err("method not allowed")
        );
        let h = Some(b"x-other".as_slice());
        assert_eq!(
            answer(&c, b"https://app.example.com", b"PUT", h),
            Err("header not allowed")
        );
    }

    #[test]
    fn any_origin_answers_star_and_any_header_echoes_the_request() {
        let c = cors("allow_origins = \"*\"\nallow_headers = [\"*\"]");
        let ok = answer(&c, b"https://x.test", b"POST", Some(b"X-A, x-b")).unwrap();
        assert_eq!(field(&ok, "access-control-allow-origin"), Some("*"));
        assert_eq!(field(&ok, "access-control-allow-headers"), Some("X-A, x-b"));
        assert_eq!(field(&ok, "access-control-allow-credentials"), None);
        assert_eq!(field(&ok, "access-control-max-age"), None);
    }
}
