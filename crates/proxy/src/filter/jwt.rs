//! JWT bearer tokens (RFC 7519, RFC 6750): the token found in a header, cookie or query parameter, its signature checked with the route's keys, its claims with the route's rules, and passes remembered until the token expires.

use super::jwks::KeySource;
use crate::sticky::cookie_value;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::Validation;
use portico_config::Jwt;
use portico_http1::RequestHead;
use serde_json::Value;
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex};

/// Most remembered passes per route; a full cache is emptied (the next tokens are verified
/// again).
const CACHE_MAX: usize = 10_000;
/// Most keys a token without a `kid` is checked against.
const MAX_TRIED: usize = 4;

/// A route's JWT check: its rules, its keys, and the tokens that passed lately (by two keyed
/// 64-bit hashes of the token: no token is kept, and without the keys no two tokens can be made
/// to share an entry).
pub(crate) struct JwtState {
    pub cfg: Arc<Jwt>,
    keys: Arc<KeySource>,
    /// One validation per accepted algorithm (the crate takes only algorithms of the key's
    /// family in one).
    validations: Vec<Validation>,
    ids: (RandomState, RandomState),
    passed: Mutex<HashMap<u128, Pass>>,
}

impl std::fmt::Debug for JwtState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtState").field("cfg", &self.cfg).finish()
    }
}

/// A token that passed: until when (`exp` plus the leeway, seconds since the epoch), under
/// which key set, and the fields its claims set.
#[derive(Clone)]
struct Pass {
    until: u64,
    generation: u64,
    fields: Arc<[(usize, String)]>,
}

/// Why a request did not pass.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// 401: no token (no error code, RFC 6750 3.1).
    Missing,
    /// 401 `invalid_token`, with a description.
    Invalid(&'static str),
    /// 403 `insufficient_scope`: a valid token whose claims the route does not accept.
    Scope(&'static str),
    /// 503: no key set was ever loaded.
    NoKeys,
}

impl JwtState {
    pub(crate) fn new(cfg: Arc<Jwt>, keys: Arc<KeySource>) -> JwtState {
        let validations = cfg
            .algorithms
            .iter()
            .map(|a| validation(&cfg, *a))
            .collect();
        JwtState {
            cfg,
            keys,
            validations,
            ids: (RandomState::new(), RandomState::new()),
            passed: Mutex::new(HashMap::new()),
        }
    }

    /// What a token is remembered by: two SipHash-1-3 values under random keys (a SHA-256
    /// costs ten times more per request).
    fn id(&self, token: &[u8]) -> u128 {
        let a = self.ids.0.hash_one(token);
        let b = self.ids.1.hash_one(token);
        (u128::from(a) << 64) | u128::from(b)
    }

    /// Where the route's keys come from.
    pub(crate) fn source(&self) -> &KeySource {
        &self.keys
    }

    /// The `WWW-Authenticate` value of a refusal.
    pub(crate) fn challenge(&self, r: &Refusal) -> String {
        let realm = &self.cfg.realm;
        match r {
            Refusal::Missing | Refusal::NoKeys => format!("Bearer realm=\"{realm}\""),
            Refusal::Invalid(why) => format!(
                "Bearer realm=\"{realm}\", error=\"invalid_token\", error_description=\"{why}\""
            ),
            Refusal::Scope(why) => format!(
                "Bearer realm=\"{realm}\", error=\"insufficient_scope\", error_description=\"{why}\""
            ),
        }
    }

    /// Whether the request carries a token the route accepts; Ok with the fields its claims
    /// set (index into `forward_claims`, value). `verified` counts signature checks.
    pub(crate) fn check(
        &self,
        head: &RequestHead,
        verified: &std::sync::atomic::AtomicU64,
    ) -> Result<Arc<[(usize, String)]>, Refusal> {
        let token = self.token(head).ok_or(Refusal::Missing)?;
        let Some(keys) = self.keys.keys() else {
            return Err(Refusal::NoKeys);
        };
        let now = jsonwebtoken::get_current_timestamp();
        let id = self.id(token);
        if let Ok(passed) = self.passed.lock() {
            if let Some(p) = passed.get(&id) {
                if p.generation == keys.generation && now <= p.until {
                    return Ok(p.fields.clone());
                }
            }
        }
        verified.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| Refusal::Invalid("the token is malformed"))?;
        let Some(at) = self.cfg.algorithms.iter().position(|a| *a == header.alg) else {
            return Err(Refusal::Invalid("the token's algorithm is not accepted"));
        };
        let validation = &self.validations[at];
        let kid = header.kid.as_deref();
        let mut claims = None;
        let mut tried = false;
        // Without a `kid`, at most a few keys of the family are tried: a bad token cannot make
        // Portico check its signature against every key of a large set.
        for k in keys.set.candidates(kid, header.alg).take(MAX_TRIED) {
            tried = true;
            match jsonwebtoken::decode::<Value>(token, &k.key, validation) {
                Ok(data) => {
                    claims = Some(data.claims);
                    break;
                }
                Err(e) if matches!(e.kind(), ErrorKind::InvalidSignature) => continue,
                Err(e) => return Err(refusal(e.kind())),
            }
        }
        if !tried {
            if kid.is_some_and(|k| !keys.set.has_kid(k)) {
                self.keys.want_refresh();
                return Err(Refusal::Invalid("the token's key is unknown"));
            }
            return Err(Refusal::Invalid("no key of the token's algorithm"));
        }
        let claims = claims.ok_or(Refusal::Invalid("the signature does not verify"))?;
        for name in &self.cfg.require {
            if claim(&claims, name).is_none_or(Value::is_null) {
                return Err(Refusal::Scope("a required claim is missing"));
            }
        }
        for (name, values) in &self.cfg.claims {
            let ok = claim(&claims, name).is_some_and(|c| matches(name, c, values));
            if !ok {
                return Err(Refusal::Scope("a claim does not match"));
            }
        }
        let fields: Arc<[(usize, String)]> = self
            .cfg
            .forward_claims
            .iter()
            .enumerate()
            .filter_map(|(i, (name, _))| Some((i, field_value(claim(&claims, name)?)?)))
            .collect();
        // `exp` may be a fraction of a second too (the crate takes both).
        let exp = claims.get("exp").map_or(0, |v| {
            v.as_u64()
                .unwrap_or_else(|| v.as_f64().map_or(0, |f| f as u64))
        });
        let pass = Pass {
            until: exp.saturating_add(validation.leeway),
            generation: keys.generation,
            fields: fields.clone(),
        };
        if let Ok(mut passed) = self.passed.lock() {
            if passed.len() >= CACHE_MAX {
                passed.clear();
            }
            passed.insert(id, pass);
        }
        Ok(fields)
    }

    /// The token: from the header (`Bearer` scheme for `Authorization`), else the cookie,
    /// else the query parameter.
    fn token<'h>(&self, head: &'h RequestHead) -> Option<&'h [u8]> {
        let c = &self.cfg;
        let from_header = c.header.as_deref().and_then(|name| {
            let v = head.field(name)?.trim_ascii();
            match strip_bearer(v) {
                Some(t) => Some(t),
                None if name == "authorization" => None,
                None => Some(v),
            }
        });
        let from_cookie = || {
            let name = c.cookie.as_deref()?;
            cookie_value(head.field("cookie")?, name.as_bytes())
        };
        let from_query = || {
            let name = c.query.as_deref()?;
            head.query()?.split('&').find_map(|pair| {
                let (k, v) = pair.split_once('=')?;
                (k == name).then_some(v.as_bytes())
            })
        };
        let found = |t: &&[u8]| !t.is_empty();
        from_header
            .filter(found)
            .or_else(|| from_cookie().filter(found))
            .or_else(|| from_query().filter(found))
    }
}

/// The checks of a token signed with `alg`: issuers, audiences, required claims, `exp` and
/// `nbf` with the leeway.
fn validation(cfg: &Jwt, alg: jsonwebtoken::Algorithm) -> Validation {
    let mut v = Validation::new(alg);
    v.leeway = cfg.leeway.as_secs();
    v.validate_nbf = true;
    if cfg.issuers.is_empty() {
        v.iss = None;
    } else {
        v.set_issuer(&cfg.issuers);
    }
    if cfg.audiences.is_empty() {
        v.validate_aud = false;
    } else {
        v.set_audience(&cfg.audiences);
    }
    // The crate compares `iss` and `aud` only when they are there: configured, they must be.
    // Other required claims are checked after it (a missing one is a scope refusal, 403).
    let mut required = vec!["exp"];
    if !cfg.issuers.is_empty() {
        required.push("iss");
    }
    if !cfg.audiences.is_empty() {
        required.push("aud");
    }
    v.set_required_spec_claims(&required);
    v
}

/// The credentials of a `Bearer` value (the scheme is case-insensitive).
fn strip_bearer(v: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = v.split_at_checked(7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| rest.trim_ascii())
}

/// The refusal for a token that failed validation.
fn refusal(kind: &ErrorKind) -> Refusal {
    Refusal::Invalid(match kind {
        ErrorKind::ExpiredSignature => "the token expired",
        ErrorKind::ImmatureSignature => "the token is not valid yet",
        ErrorKind::InvalidIssuer => "the token's issuer is not accepted",
        ErrorKind::InvalidAudience => "the token is not for this audience",
        ErrorKind::MissingRequiredClaim(_) => "a required claim is missing",
        ErrorKind::InvalidClaimFormat(_) => "a claim is malformed",
        ErrorKind::InvalidAlgorithm => "the token's algorithm does not fit its key",
        _ => "the token is malformed",
    })
}

/// The claim at `path` (dots walk into objects: `realm_access.roles`); a claim whose own
/// name has a dot is found first.
fn claim<'c>(claims: &'c Value, path: &str) -> Option<&'c Value> {
    if let Some(v) = claims.get(path) {
        return Some(v);
    }
    path.split('.').try_fold(claims, |v, part| v.get(part))
}

/// Whether claim `c` (named `name`) matches one of `values`: equal, an element of an array,
/// or a word of a space-separated `scope`/`scp`.
fn matches(name: &str, c: &Value, values: &[String]) -> bool {
    let scope = name == "scope" || name == "scp";
    let one = |v: &Value| match v {
        Value::String(s) if scope => s.split(' ').any(|w| values.iter().any(|x| x == w)),
        Value::String(s) => values.iter().any(|x| x == s),
        Value::Number(n) => values.iter().any(|x| *x == n.to_string()),
        Value::Bool(b) => values.iter().any(|x| *x == b.to_string()),
        _ => false,
    };
    match c {
        Value::Array(items) => items.iter().any(one),
        other => one(other),
    }
}

/// A claim as a field value: text as it is, numbers and booleans written out, an array of
/// those joined with commas, anything else as compact JSON; None when the result could not
/// be a field value (control characters).
fn field_value(c: &Value) -> Option<String> {
    let scalar = |v: &Value| match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    };
    let text = match c {
        Value::Null => return None,
        Value::Array(items) => match items.iter().map(scalar).collect::<Option<Vec<_>>>() {
            Some(parts) => parts.join(","),
            None => c.to_string(),
        },
        Value::Object(_) => c.to_string(),
        v => scalar(v)?,
    };
    let bad = text.chars().any(|ch| ch.is_control() && ch != '\t');
    (!bad).then(|| text.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bearer_credentials_need_the_scheme() {
        assert_eq!(strip_bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(strip_bearer(b"bearer  abc "), Some(&b"abc"[..]));
        assert_eq!(strip_bearer(b"Basic abc"), None);
        assert_eq!(strip_bearer(b"Bearer"), None);
    }

    #[test]
    fn claims_are_found_by_dotted_paths_and_matched_in_arrays_and_scopes() {
        let c = json!({"sub": "u1", "realm_access": {"roles": ["a", "admin"]},
            "scope": "read write", "n": 3, "x.y": true});
        assert_eq!(claim(&c, "realm_access.roles").unwrap()[1], "admin");
        assert_eq!(claim(&c, "x.y"), Some(&json!(true)));
        assert!(claim(&c, "realm_access.groups").is_none());
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert!(matches(
            "roles",
            &c["realm_access"]["roles"],
            &v(&["admin"])
        ));
        assert!(matches("scope", &c["scope"], &v(&["write"])));
        assert!(!matches("sub", &json!("read write"), &v(&["write"])));
        assert!(matches("n", &c["n"], &v(&["3"])));
        assert!(!matches("sub", &c["sub"], &v(&["u2"])));
    }

    #[test]
    fn claims_become_field_values_or_nothing() {
        assert_eq!(field_value(&json!("u1")).unwrap(), "u1");
        assert_eq!(field_value(&json!(["a", 2, true])).unwrap(), "a,2,true");
        assert_eq!(field_value(&json!({"k": 1})).unwrap(), "{\"k\":1}");
        assert_eq!(field_value(&json!("a\r\nX-Evil: 1")), None);
        assert_eq!(field_value(&Value::Null), None);
    }
}
