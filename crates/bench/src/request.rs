//! The requests connections send (one per URL), built once per run: HTTP/1.1 bytes with the workspace codec, HTTP/2 requests for `--h2`.

use crate::config::{Config, Target};
use crate::error::BenchError;
use bytes::{Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH};
use http::{HeaderMap, Method, Uri};
use portico_http1::encode;

/// Encode the run's request to its first URL (see [`encode_request_to`]).
pub fn encode_request(cfg: &Config) -> Bytes {
    encode_request_to(cfg, &cfg.target)
}

/// The run's requests, one per URL, in the order of the URLs.
pub fn encode_requests(cfg: &Config) -> Vec<Bytes> {
    cfg.targets
        .iter()
        .map(|t| encode_request_to(cfg, t))
        .collect()
}

/// Encode the run's request to `target`: request line, `Host`, the `-H` fields, `Content-Length`
/// when there is a body (or the method usually carries one), `Connection: close` with `--close`,
/// the body.
pub fn encode_request_to(cfg: &Config, target: &Target) -> Bytes {
    let mut out = BytesMut::with_capacity(256 + cfg.body.len());
    encode::request_line(&mut out, cfg.method.as_str(), &target.path);
    let has_host = cfg
        .headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("host"));
    if !has_host {
        encode::field(&mut out, "Host", target.authority.as_bytes());
    }
    for (name, value) in &cfg.headers {
        encode::field(&mut out, name, value.as_bytes());
    }
    let body_method = matches!(cfg.method.as_str(), "POST" | "PUT" | "PATCH");
    if !cfg.body.is_empty() || body_method {
        encode::content_length(&mut out, cfg.body.len() as u64);
    }
    if cfg.close {
        encode::field(&mut out, "Connection", b"close");
    }
    encode::end_head(&mut out);
    out.extend_from_slice(&cfg.body);
    out.freeze()
}

/// Header fields HTTP/2 forbids (connection-specific, RFC 9113 section 8.2.2).
const CONNECTION_SPECIFIC: [&str; 5] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
];

/// The run's request to one URL, built once: each send clones its parts.
#[derive(Debug, Clone)]
pub struct H2Request {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    pub body: Bytes,
}

impl H2Request {
    pub fn to_http(&self) -> http::Request<()> {
        let mut r = http::Request::new(());
        *r.method_mut() = self.method.clone();
        *r.uri_mut() = self.uri.clone();
        *r.headers_mut() = self.headers.clone();
        r
    }
}

fn flag(msg: impl Into<String>) -> BenchError {
    BenchError::Flag(msg.into())
}

/// The run's HTTP/2 requests (`--h2`), one per URL (in the order of the URLs): `:method`, `:scheme`,
/// `:authority` (the URL's, or `-H Host`), `:path`, the `-H` fields, `content-length` when there
/// is a body (or the method usually carries one), the body. Refuses fields HTTP/2 forbids.
pub fn h2_requests(cfg: &Config) -> Result<Vec<H2Request>, BenchError> {
    cfg.targets.iter().map(|t| request_to(cfg, t)).collect()
}

fn request_to(cfg: &Config, target: &Target) -> Result<H2Request, BenchError> {
    let method = Method::from_bytes(cfg.method.as_str().as_bytes()).map_err(|_| {
        flag(format!(
            "--method {}: not an HTTP method",
            cfg.method.as_str()
        ))
    })?;
    let mut authority = target.authority.clone();
    let mut headers = HeaderMap::new();
    for (name, value) in &cfg.headers {
        let lower = name.to_ascii_lowercase();
        if lower == "host" {
            authority = value.clone();
            continue;
        }
        if CONNECTION_SPECIFIC.contains(&lower.as_str())
            || (lower == "te" && !value.eq_ignore_ascii_case("trailers"))
        {
            return Err(flag(format!(
                "-H {name}: a connection-specific field, forbidden in HTTP/2"
            )));
        }
        let n = HeaderName::from_bytes(lower.as_bytes())
            .map_err(|_| flag(format!("-H {name}: not a header name")))?;
        let v = HeaderValue::from_str(value)
            .map_err(|_| flag(format!("-H {name}: {value:?} is not a header value")))?;
        headers.append(n, v);
    }
    let body_method = matches!(cfg.method.as_str(), "POST" | "PUT" | "PATCH");
    if !cfg.body.is_empty() || body_method {
        headers.insert(CONTENT_LENGTH, HeaderValue::from(cfg.body.len() as u64));
    }
    let scheme = if target.tls { "https" } else { "http" };
    let uri = Uri::builder()
        .scheme(scheme)
        .authority(authority.as_str())
        .path_and_query(target.path.as_str())
        .build()
        .map_err(|e| flag(format!("{}: not an HTTP/2 request target: {e}", target.url)))?;
    Ok(H2Request {
        method,
        uri,
        headers,
        body: Bytes::from(cfg.body.clone()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Flags;

    fn cfg(f: Flags) -> Config {
        Config::from_flags(&Flags {
            url: "http://127.0.0.1:8081/p?q=1".into(),
            rate: Some(1.0),
            ..f
        })
        .unwrap()
    }

    #[test]
    fn get_request() {
        let r = encode_request(&cfg(Flags::default()));
        assert_eq!(
            &r[..],
            b"GET /p?q=1 HTTP/1.1\r\nHost: 127.0.0.1:8081\r\n\r\n"
        );
    }

    #[test]
    fn post_with_headers_body_and_close() {
        let r = encode_request(&cfg(Flags {
            method: "POST".into(),
            headers: vec!["Host: example".into(), "X-A: 1".into()],
            body: Some("hello".into()),
            close: true,
            ..Flags::default()
        }));
        assert_eq!(
            &r[..],
            &b"POST /p?q=1 HTTP/1.1\r\nHost: example\r\nX-A: 1\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"[..]
        );
        let r = encode_request(&cfg(Flags {
            method: "PUT".into(),
            ..Flags::default()
        }));
        assert!(r.ends_with(b"Content-Length: 0\r\n\r\n"));
    }

    /// A `--h2` configuration on `f`.
    fn h2_cfg(f: Flags) -> Result<Config, BenchError> {
        Config::from_flags(&Flags {
            url: "http://127.0.0.1:8081/p?q=1".into(),
            rate: Some(1.0),
            h2: true,
            ..f
        })
    }

    #[test]
    fn requests_carry_the_pseudo_fields_and_headers() {
        let c = h2_cfg(Flags {
            method: "POST".into(),
            headers: vec!["Host: example:9".into(), "X-A: 1".into()],
            body: Some("hello".into()),
            ..Flags::default()
        })
        .unwrap();
        let r = h2_requests(&c).unwrap();
        let h = r[0].to_http();
        assert_eq!(h.method(), Method::POST);
        assert_eq!(h.uri().to_string(), "http://example:9/p?q=1");
        assert_eq!(h.headers()["x-a"], "1");
        assert_eq!(h.headers()["content-length"], "5");
        assert!(h.headers().get("host").is_none());
        assert_eq!(&r[0].body[..], b"hello");
        let c = h2_cfg(Flags::default()).unwrap();
        let h = h2_requests(&c).unwrap()[0].to_http();
        assert_eq!(h.uri().to_string(), "http://127.0.0.1:8081/p?q=1");
        assert!(h.headers().is_empty());
    }

    #[test]
    fn connection_specific_fields_are_refused() {
        for bad in [
            "Connection: keep-alive",
            "Upgrade: h2c",
            "TE: gzip",
            "Keep-Alive: 5",
        ] {
            let c = h2_cfg(Flags {
                headers: vec![bad.into()],
                ..Flags::default()
            })
            .unwrap();
            let e = h2_requests(&c).unwrap_err();
            assert!(e.to_string().contains("forbidden in HTTP/2"), "{bad}: {e}");
        }
        let c = h2_cfg(Flags {
            headers: vec!["TE: trailers".into()],
            ..Flags::default()
        })
        .unwrap();
        assert!(h2_requests(&c).is_ok());
    }
}
