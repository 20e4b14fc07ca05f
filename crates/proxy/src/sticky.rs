//! Session persistence by a cookie Portico inserts: the server id a request names, the `Set-Cookie` value for its response, cookie lookup.

use portico_http1::RequestHead;
use portico_upstream::Upstream;

/// The server id the request's sticky cookie carries, if the group has `sticky_cookie` and the
/// request sends it.
pub fn request_id<'a>(upstream: &Upstream, head: &'a RequestHead) -> Option<&'a [u8]> {
    let name = &upstream.group().sticky_cookie.as_ref()?.name;
    cookie_value(head.field("cookie")?, name.as_bytes())
}

/// The `Set-Cookie` value to send with the response when the request goes to `server`: None
/// without `sticky_cookie`, or when the request already names that server.
pub fn set_cookie(upstream: &Upstream, head: &RequestHead, server: usize) -> Option<String> {
    let cookie = upstream.group().sticky_cookie.as_ref()?;
    let id = upstream.sticky_id(server)?;
    if request_id(upstream, head) == Some(id.as_bytes()) {
        return None;
    }
    Some(cookie.set_cookie(id))
}

/// The value of cookie `name` in a Cookie header value.
pub fn cookie_value<'a>(header: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    header.split(|&b| b == b';').find_map(|pair| {
        let pair = pair.trim_ascii();
        let eq = pair.iter().position(|&b| b == b'=')?;
        (pair[..eq].trim_ascii() == name).then(|| pair[eq + 1..].trim_ascii())
    })
}

#[cfg(test)]
mod tests {
    use super::cookie_value;

    #[test]
    fn cookie_lookup() {
        assert_eq!(
            cookie_value(b"a=1; session=xyz; b=2", b"session"),
            Some(b"xyz".as_slice())
        );
        assert_eq!(cookie_value(b"session=", b"session"), Some(b"".as_slice()));
        assert_eq!(cookie_value(b"sessionx=1", b"session"), None);
        assert_eq!(cookie_value(b"", b"session"), None);
    }

    use super::*;
    use bytes::BytesMut;
    use portico_config::{parse, StickyCookie};
    use portico_http1::{parse_request, Limits};
    use std::sync::Arc;

    fn upstream(sticky: &str) -> Upstream {
        let cfg = parse(
            &format!(
                "[upstreams.g]\nservers = [\"10.0.0.1:80\", \"10.0.0.2:80\"]\n{sticky}\n[[listeners]]\naddress = \"127.0.0.1:1\"\n[[listeners.routes]]\nproxy = \"g\"\n"
            ),
            "t.toml",
        )
        .unwrap();
        Upstream::new(Arc::clone(&cfg.upstreams[0]))
    }

    fn head(raw: &str) -> RequestHead {
        let mut buf = BytesMut::from(raw.as_bytes());
        parse_request(&mut buf, &Limits::default())
            .unwrap()
            .unwrap()
    }

    #[test]
    fn cookie_is_set_unless_the_request_names_the_chosen_server() {
        let u = upstream("sticky_cookie = \"SRV\"");
        let id1 = u.sticky_id(1).unwrap().to_string();
        let none = head("GET / HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_eq!(
            set_cookie(&u, &none, 1),
            Some(format!("SRV={id1}; Path=/; HttpOnly"))
        );
        let same = head(&format!(
            "GET / HTTP/1.1\r\nHost: a\r\nCookie: x=1; SRV={id1}\r\n\r\n"
        ));
        assert_eq!(request_id(&u, &same), Some(id1.as_bytes()));
        assert_eq!(set_cookie(&u, &same, 1), None);
        // Another server was chosen (the named one is unavailable): set it again.
        assert!(set_cookie(&u, &same, 0).is_some());
        // Groups without sticky_cookie never set one.
        assert_eq!(set_cookie(&upstream(""), &none, 0), None);
    }

    #[test]
    fn attributes_follow_the_configuration() {
        let c = StickyCookie {
            name: "S".into(),
            path: "/app".into(),
            max_age: Some(3600),
            http_only: false,
            secure: true,
            same_site: Some("Lax"),
        };
        assert_eq!(
            c.set_cookie("ab"),
            "S=ab; Path=/app; Max-Age=3600; Secure; SameSite=Lax"
        );
    }
}
