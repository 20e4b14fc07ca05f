//! The requests connections send (one per URL), encoded once per run with the workspace codec.

use crate::config::{Config, Target};
use bytes::{Bytes, BytesMut};
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
}
