//! Values with variables (`{host}`, `{uri}`, `{header.x-id}`, regex captures): parsed and checked once at load, rendered per request.

use std::borrow::Cow;
use std::fmt;

/// A variable a [`Template`] names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Var {
    /// `{scheme}`: `http` or `https`, as the client connected.
    Scheme,
    /// `{host}`: the request's host (Host or `:authority`) without its port.
    Host,
    /// `{port}`: the port in the request's host, else the scheme's default (80, 443).
    Port,
    /// `{path}`: the request path as received (before `?`).
    Path,
    /// `{query}`: the query without `?` (empty when there is none).
    Query,
    /// `{uri}`: the path and, when there is one, `?` and the query.
    Uri,
    /// `{remote_addr}`: the client's IP address.
    RemoteAddr,
    /// `{method}`: the request method.
    Method,
    /// `{header.NAME}`: the request field's value (lowercased name; empty when absent).
    Header(String),
    /// `{cookie.NAME}`: the request cookie's value (empty when absent).
    Cookie(String),
    /// `{1}` or `{NAME}`: a capture group of the route's `path_regex` (empty when it did not
    /// take part in the match); `{0}` is the whole match.
    Capture(usize),
}

/// The variables' names, as messages list them.
pub const VARIABLES: &str = "scheme, host, port, path, query, uri, remote_addr, method, header.NAME, cookie.NAME, or a path_regex capture ({1}, {name})";

/// What a template is rendered against: one request.
pub trait Vars {
    /// Append `v`'s value for this request to `out`.
    fn write(&self, v: &Var, out: &mut String);
}

/// A string with variables, parsed once: `https://{host}{uri}`. `{{` and `}}` are literal braces.
#[derive(Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
    /// The text as written (for `explain` and messages).
    source: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Lit(String),
    Var(Var),
}

impl fmt::Debug for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Template({:?})", self.source)
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

/// The capture groups a template may name: how many there are (group 0 included) and their
/// names (None for unnamed groups), in order.
#[derive(Debug, Default, Clone, Copy)]
pub struct Captures<'a> {
    pub names: &'a [Option<String>],
}

impl Template {
    /// A template without variables.
    pub fn literal(text: &str) -> Template {
        let parts = match text.is_empty() {
            true => Vec::new(),
            false => vec![Part::Lit(text.to_string())],
        };
        Template {
            parts,
            source: text.to_string(),
        }
    }

    /// Parse `text`; `captures`: the groups of the route's `path_regex` (none: captures are
    /// an error). An error is the byte offset in `text` where it is, and the message.
    pub fn parse(text: &str, captures: Option<Captures<'_>>) -> Result<Template, (usize, String)> {
        let mut parts = Vec::new();
        let mut lit = String::new();
        let mut rest = text;
        let offset = |rest: &str| text.len() - rest.len();
        while let Some(i) = rest.find(['{', '}']) {
            lit.push_str(&rest[..i]);
            let at = offset(rest) + i;
            let after = &rest[i + 1..];
            if rest.as_bytes()[i] == b'}' {
                match after.strip_prefix('}') {
                    Some(r) => {
                        lit.push('}');
                        rest = r;
                        continue;
                    }
                    None => return Err((at, "a lone `}`: write `}}` for a literal brace".into())),
                }
            }
            if let Some(r) = after.strip_prefix('{') {
                lit.push('{');
                rest = r;
                continue;
            }
            let Some(end) = after.find('}') else {
                return Err((
                    at,
                    "`{` without its `}`: write `{{` for a literal brace".into(),
                ));
            };
            let name = &after[..end];
            let var = variable(name, captures).map_err(|m| (at, m))?;
            if !lit.is_empty() {
                parts.push(Part::Lit(std::mem::take(&mut lit)));
            }
            parts.push(Part::Var(var));
            rest = &after[end + 1..];
        }
        lit.push_str(rest);
        if !lit.is_empty() {
            parts.push(Part::Lit(lit));
        }
        Ok(Template {
            parts,
            source: text.to_string(),
        })
    }

    /// The value when the template has no variable (rendering it needs no request).
    pub fn as_literal(&self) -> Option<&str> {
        match self.parts.as_slice() {
            [] => Some(""),
            [Part::Lit(s)] => Some(s),
            _ => None,
        }
    }

    /// Whether the template names a capture group.
    pub fn uses_captures(&self) -> bool {
        self.vars().any(|v| matches!(v, Var::Capture(_)))
    }

    /// The variables named, in order.
    pub fn vars(&self) -> impl Iterator<Item = &Var> {
        self.parts.iter().filter_map(|p| match p {
            Part::Var(v) => Some(v),
            Part::Lit(_) => None,
        })
    }

    /// The value for one request.
    pub fn render(&self, vars: &dyn Vars) -> Cow<'_, str> {
        if let Some(s) = self.as_literal() {
            return Cow::Borrowed(s);
        }
        let mut out = String::with_capacity(self.source.len() + 32);
        for p in &self.parts {
            match p {
                Part::Lit(s) => out.push_str(s),
                Part::Var(v) => vars.write(v, &mut out),
            }
        }
        Cow::Owned(out)
    }
}

/// The variable `name` names (the text between the braces).
fn variable(name: &str, captures: Option<Captures<'_>>) -> Result<Var, String> {
    let simple = match name {
        "scheme" => Some(Var::Scheme),
        "host" => Some(Var::Host),
        "port" => Some(Var::Port),
        "path" => Some(Var::Path),
        "query" => Some(Var::Query),
        "uri" => Some(Var::Uri),
        "remote_addr" => Some(Var::RemoteAddr),
        "method" => Some(Var::Method),
        _ => None,
    };
    if let Some(v) = simple {
        return Ok(v);
    }
    if let Some(h) = name.strip_prefix("header.") {
        if h.is_empty() || !h.bytes().all(is_tchar) {
            return Err(format!("invalid header name {h:?} in {{{name}}}"));
        }
        return Ok(Var::Header(h.to_ascii_lowercase()));
    }
    if let Some(c) = name.strip_prefix("cookie.") {
        if c.is_empty() || !c.bytes().all(is_tchar) {
            return Err(format!("invalid cookie name {c:?} in {{{name}}}"));
        }
        return Ok(Var::Cookie(c.to_string()));
    }
    let is_index = !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit());
    let is_name = name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !is_index && !is_name || name.is_empty() {
        return Err(format!("unknown variable {{{name}}}: expected {VARIABLES}"));
    }
    let Some(c) = captures else {
        return Err(match is_index {
            true => format!("{{{name}}} is a capture, but the route has no path_regex"),
            false => format!("unknown variable {{{name}}}: expected {VARIABLES}"),
        });
    };
    if is_index {
        return match name.parse::<usize>() {
            Ok(i) if i < c.names.len() => Ok(Var::Capture(i)),
            _ => Err(format!(
                "{{{name}}}: the path_regex has {} capture group(s)",
                c.names.len().saturating_sub(1)
            )),
        };
    }
    match c.names.iter().position(|n| n.as_deref() == Some(name)) {
        Some(i) => Ok(Var::Capture(i)),
        None => Err(format!("unknown variable {{{name}}}: expected {VARIABLES}")),
    }
}

/// RFC 9110 tchar.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Req;
    impl Vars for Req {
        fn write(&self, v: &Var, out: &mut String) {
            out.push_str(match v {
                Var::Scheme => "https",
                Var::Host => "example.com",
                Var::Uri => "/a?b=1",
                Var::Header(h) if h == "x-id" => "42",
                Var::Capture(1) => "7",
                _ => "",
            });
        }
    }

    #[test]
    fn variables_and_literal_braces_render() {
        let t = Template::parse("{scheme}://{host}{uri}", None).unwrap();
        assert_eq!(t.render(&Req), "https://example.com/a?b=1");
        assert!(t.as_literal().is_none() && !t.uses_captures());
        let t = Template::parse("id={header.X-Id};{{json}}", None).unwrap();
        assert_eq!(t.render(&Req), "id=42;{json}");
        let t = Template::parse("/plain", None).unwrap();
        assert_eq!(t.as_literal(), Some("/plain"));
        assert!(matches!(t.render(&Req), Cow::Borrowed("/plain")));
        assert_eq!(Template::parse("", None).unwrap().as_literal(), Some(""));
        assert_eq!(
            Template::parse("a{{b}}", None).unwrap().as_literal(),
            Some("a{b}")
        );
    }

    #[test]
    fn captures_by_index_and_name() {
        let names = [None, Some("id".to_string()), None];
        let c = Some(Captures { names: &names });
        let t = Template::parse("/users/{id}/{2}/{0}", c).unwrap();
        assert!(t.uses_captures());
        let vars: Vec<_> = t.vars().cloned().collect();
        assert_eq!(vars, [Var::Capture(1), Var::Capture(2), Var::Capture(0)]);
        assert_eq!(Template::parse("/{1}", c).unwrap().render(&Req), "/7");
        let e = Template::parse("/{3}", c).unwrap_err();
        assert_eq!(
            e,
            (1, "{3}: the path_regex has 2 capture group(s)".to_string())
        );
        assert!(Template::parse("/{nope}", c)
            .unwrap_err()
            .1
            .contains("unknown variable {nope}"));
    }

    #[test]
    fn errors_point_at_the_variable() {
        let e = |t: &str| Template::parse(t, None).unwrap_err();
        assert_eq!(e("https://{hots}/").0, 8);
        assert!(e("https://{hots}/")
            .1
            .starts_with("unknown variable {hots}: expected scheme, host"));
        assert_eq!(
            e("/{1}").1,
            "{1} is a capture, but the route has no path_regex"
        );
        assert_eq!(
            e("a}b"),
            (1, "a lone `}`: write `}}` for a literal brace".to_string())
        );
        assert_eq!(e("a{b").0, 1);
        assert!(e("{header.}").1.contains("invalid header name"));
        assert!(e("{header.a b}").1.contains("invalid header name"));
        assert!(e("{cookie.a;b}").1.contains("invalid cookie name"));
        assert!(e("{}").1.contains("unknown variable {}"));
        assert!(e("{a-b}").1.contains("unknown variable {a-b}"));
    }
}
