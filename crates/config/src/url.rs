//! `http://` and `https://` URLs as blocking fetches need them (scheme, host, port, target), and `etcd://` and `etcds://` keys.

/// An `http` or `https` URL, in the parts a blocking fetch needs (JWK sets, the OTLP endpoint).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpUrl {
    pub https: bool,
    pub host: String,
    pub port: u16,
    /// The path and query (`/` when the URL has none).
    pub target: String,
}

impl HttpUrl {
    /// `http://HOST[:PORT]/PATH` or `https://...`; a bracketed IPv6 host keeps its brackets
    /// out of `host`. No user information, no fragment.
    pub fn parse(text: &str) -> Result<HttpUrl, String> {
        let (https, rest) = if let Some(r) = text.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = text.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(format!("{text:?} is not an http:// or https:// URL"));
        };
        if text.chars().any(|c| c.is_control() || c == ' ' || c == '#') {
            return Err(format!(
                "{text:?} has spaces, control characters or a fragment"
            ));
        }
        let (authority, target) = match rest.find(['/', '?']) {
            Some(i) => (&rest[..i], rest[i..].to_string()),
            None => (rest, "/".to_string()),
        };
        let target = match target.starts_with('?') {
            true => format!("/{target}"),
            false => target,
        };
        if authority.contains('@') {
            return Err(format!(
                "{text:?}: user information in the URL is not supported"
            ));
        }
        let default_port = if https { 443 } else { 80 };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6
                .split_once(']')
                .ok_or_else(|| format!("{text:?}: an unclosed '[' in the host"))?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse().map_err(|_| format!("{text:?}: bad port {p:?}"))?,
                None if after.is_empty() => default_port,
                None => return Err(format!("{text:?}: unexpected {after:?} after the host")),
            };
            (h.to_string(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (
                    h.to_string(),
                    p.parse().map_err(|_| format!("{text:?}: bad port {p:?}"))?,
                ),
                None => (authority.to_string(), default_port),
            }
        };
        if host.is_empty() || port == 0 {
            return Err(format!("{text:?} has no host or port 0"));
        }
        Ok(HttpUrl {
            https,
            host,
            port,
            target,
        })
    }

    /// `HOST[:PORT]` as a `Host` field gives it (the port only when it is not the scheme's).
    pub fn authority(&self) -> String {
        let host = match self.host.contains(':') {
            true => format!("[{}]", self.host),
            false => self.host.clone(),
        };
        let default_port = if self.https { 443 } else { 80 };
        match self.port == default_port {
            true => host,
            false => format!("{host}:{}", self.port),
        }
    }
}

/// A key in etcd: `etcd://HOST[:PORT]/KEY` (`etcds://` for TLS), port 2379 unless given; the
/// key is the path, its leading `/` included (the configuration document, or a prefix under
/// which servers register).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EtcdUrl {
    /// `etcds://`: TLS to etcd.
    pub tls: bool,
    pub host: String,
    pub port: u16,
    pub key: String,
}

impl EtcdUrl {
    /// `etcd://HOST[:PORT]/KEY`, or `etcds://` for TLS.
    pub fn parse(text: &str) -> Result<EtcdUrl, String> {
        let usage = "expected etcd://HOST:PORT/KEY (etcds:// for TLS), e.g. etcd://127.0.0.1:2379/portico/config";
        let (tls, rest) = match (text.strip_prefix("etcd://"), text.strip_prefix("etcds://")) {
            (Some(rest), _) => (false, rest),
            (None, Some(rest)) => (true, rest),
            (None, None) => return Err(format!("{text:?}: {usage}")),
        };
        let (authority, key) = match rest.find('/') {
            // `/services/app/` is `/services/app` (its keys are under `/services/app/`)
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => return Err(format!("{text:?} names no key: {usage}")),
        };
        if key.len() < 2 {
            return Err(format!("{text:?} names no key: {usage}"));
        }
        // etcd's client port unless one is given
        let has_port = match authority.rfind(']') {
            Some(close) => authority[close..].contains(':'),
            None => authority.contains(':'),
        };
        let authority = match has_port {
            true => authority.to_string(),
            false => format!("{authority}:2379"),
        };
        let url = HttpUrl::parse(&format!("http://{authority}/"))
            .map_err(|e| format!("{text:?}: {e}; {usage}"))?;
        Ok(EtcdUrl {
            tls,
            host: url.host,
            port: url.port,
            key: key.to_string(),
        })
    }

    /// `etcd://HOST:PORT/KEY` (`etcds://`), the port always written.
    pub fn name(&self) -> String {
        let scheme = if self.tls { "etcds" } else { "etcd" };
        match self.host.contains(':') {
            true => format!("{scheme}://[{}]:{}{}", self.host, self.port, self.key),
            false => format!("{scheme}://{}:{}{}", self.host, self.port, self.key),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::HttpUrl;

    #[test]
    fn urls_split_into_what_a_fetch_needs() {
        let u = HttpUrl::parse("https://id.example.com/.well-known/jwks.json").unwrap();
        assert_eq!(
            (u.https, &u.host[..], u.port),
            (true, "id.example.com", 443)
        );
        assert_eq!(u.target, "/.well-known/jwks.json");
        let u = HttpUrl::parse("http://[::1]:8080?x=1").unwrap();
        assert_eq!((u.https, &u.host[..], u.port), (false, "::1", 8080));
        assert_eq!(u.target, "/?x=1");
        assert_eq!(HttpUrl::parse("http://a").unwrap().target, "/");
        assert_eq!(u.authority(), "[::1]:8080");
        assert_eq!(HttpUrl::parse("https://a:443/x").unwrap().authority(), "a");
        for bad in [
            "ftp://a/",
            "http://",
            "http://u@a/",
            "http://a:x/",
            "http://a/#f",
        ] {
            assert!(HttpUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
