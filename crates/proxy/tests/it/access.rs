//! Who may pass, through real sockets: `ip_rules` by the socket's address, and by `X-Forwarded-For` behind a trusted proxy (right-most untrusted), for HTTP/1.1 and HTTP/2 clients.

use crate::common::{start_toml, T};
use portico_proxy::stats::{Cause, Phase, Side};
use portico_proxy::Termination;
use portico_testkit::{Client, Reply, TestUpstream};
use std::sync::atomic::Ordering::Relaxed;

#[tokio::test]
async fn ip_rules_refuse_strangers_with_403_and_believe_only_trusted_proxies() {
    let up = TestUpstream::start(|_| Reply::ok("in"));
    let p = start_toml(
        &format!(
            r#"
[[listeners]]
name = "direct"
address = "127.0.0.1:0"
ip_rules = ["deny 127.0.0.1", "allow all"]
[[listeners.routes]]
path = "/open"
ip_rules = ["allow all"]
proxy = "b"
[[listeners.routes]]
proxy = "b"

[[listeners]]
name = "behind"
address = "127.0.0.1:0"
trusted_proxies = ["127.0.0.0/8", "10.0.0.0/8"]
[[listeners.routes]]
ip_rules = ["allow 203.0.113.0/24", "deny all"]
proxy = "b"

[upstreams.b]
servers = ["{}"]
"#,
            up.addr
        ),
        1,
    );
    let direct = p.addr("direct").unwrap();
    let behind = p.addr("behind").unwrap();
    let results = tokio::task::spawn_blocking(move || {
        let get = |addr, path: &str, xff: &str| {
            let mut c = Client::connect(addr).unwrap();
            let xff = match xff {
                "" => String::new(),
                v => format!("X-Forwarded-For: {v}\r\n"),
            };
            let req = format!("GET {path} HTTP/1.1\r\nHost: a\r\n{xff}\r\n");
            c.request(req.as_bytes()).unwrap().status
        };
        vec![
            // The listener's rules deny 127.0.0.1; a route with its own rules lets it in.
            get(direct, "/x", ""),
            get(direct, "/open", ""),
            // A client-sent X-Forwarded-For is not believed from an untrusted peer... but the
            // peer (127.0.0.1) is trusted on "behind": the right-most untrusted address counts.
            get(behind, "/", "203.0.113.7"),
            get(behind, "/", "198.51.100.1"),
            // A spoofed left-most entry does not help: the right-most untrusted one decides.
            get(behind, "/", "203.0.113.7, 198.51.100.1, 10.0.0.2"),
            get(behind, "/", "198.51.100.1, 203.0.113.9, 10.0.0.2"),
            // No X-Forwarded-For: the trusted peer itself, which the rules deny.
            get(behind, "/", ""),
        ]
    })
    .await
    .unwrap();
    assert_eq!(results, [403, 200, 200, 403, 403, 200, 403]);
    // HTTP/2 meets the same rules.
    let tcp = tokio::net::TcpStream::connect(direct).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let mut c = client.ready().await.unwrap();
    let req = http::Request::builder().uri("http://a/x").body(()).unwrap();
    let (resp, _) = c.send_request(req, true).unwrap();
    assert_eq!(
        tokio::time::timeout(T, resp)
            .await
            .unwrap()
            .unwrap()
            .status(),
        403
    );
    let denied = Termination::new(Side::Client, Phase::Route, Cause::Denied);
    crate::common::until("5 denials counted", || p.stats().terminations(denied) == 5).await;
    assert_eq!(p.stats().ip_denied.load(Relaxed), 5);
    assert_eq!(up.requests().len(), 3);
}

#[tokio::test]
async fn basic_auth_asks_for_credentials_and_keeps_them_from_the_server() {
    use base64::Engine;
    let up = TestUpstream::start(|r| {
        let auth = r.header("authorization").unwrap_or("none").to_string();
        Reply::ok(&format!("in, authorization {auth}"))
    });
    let dir = std::env::temp_dir().join(format!("portico-htpasswd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("htpasswd");
    let argon = {
        use argon2::password_hash::{PasswordHasher, SaltString};
        let salt = SaltString::encode_b64(b"0123456789abcdef").unwrap();
        argon2::Argon2::default()
            .hash_password(b"b0b-pw", &salt)
            .unwrap()
            .to_string()
    };
    std::fs::write(&file, format!("# users\nbob:{argon}\n")).unwrap();
    let alice = bcrypt::hash("al1ce-pw", 4).unwrap();
    let p = start_toml(
        &format!(
            r#"
[[listeners]]
name = "p"
address = "127.0.0.1:0"
basic_auth = {{ realm = "staff", users = {{ alice = "{alice}" }}, htpasswd = "{}" }}
[[listeners.routes]]
path = "/pass-on/**"
proxy = "b"
basic_auth = {{ users = {{ alice = "{alice}" }}, keep_authorization = true }}
[[listeners.routes]]
proxy = "b"
[upstreams.b]
servers = ["{}"]
"#,
            file.display(),
            up.addr
        ),
        1,
    );
    let addr = p.addr("p").unwrap();
    let basic = |user: &str, pw: &str| {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pw}"));
        format!("Authorization: Basic {token}\r\n")
    };
    let cases = vec![
        ("/x", String::new()),
        ("/x", basic("alice", "wrong")),
        ("/x", basic("mallory", "al1ce-pw")),
        ("/x", basic("alice", "al1ce-pw")),
        ("/x", basic("alice", "al1ce-pw")),
        ("/x", basic("bob", "b0b-pw")),
        ("/pass-on/x", basic("alice", "al1ce-pw")),
    ];
    let got = tokio::task::spawn_blocking(move || {
        cases
            .into_iter()
            .map(|(path, auth)| {
                let mut c = Client::connect(addr).unwrap();
                let r = c
                    .request(format!("GET {path} HTTP/1.1\r\nHost: a\r\n{auth}\r\n").as_bytes())
                    .unwrap();
                (
                    r.status,
                    r.header("www-authenticate").map(str::to_string),
                    r.text(),
                )
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    let challenge = Some("Basic realm=\"staff\", charset=\"UTF-8\"".to_string());
    for (status, www, _) in &got[..3] {
        assert_eq!((*status, www), (401, &challenge));
    }
    // The credentials are checked here and not passed on, unless the route keeps them.
    assert_eq!(got[3].2, "in, authorization none");
    assert_eq!(got[4].0, 200, "the second time comes from the cache");
    assert_eq!(
        got[5].2, "in, authorization none",
        "argon2 from the htpasswd file"
    );
    assert!(
        got[6].2.starts_with("in, authorization Basic "),
        "{}",
        got[6].2
    );
    // HTTP/2.
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    for (auth, want) in [(None, 401), (Some(basic("bob", "b0b-pw")), 200)] {
        let mut req = http::Request::builder().uri("http://a/x");
        if let Some(a) = &auth {
            req = req.header(
                "authorization",
                a.trim_end().trim_start_matches("Authorization: "),
            );
        }
        let mut c = client.clone().ready().await.unwrap();
        let (resp, _) = c.send_request(req.body(()).unwrap(), true).unwrap();
        assert_eq!(
            tokio::time::timeout(T, resp)
                .await
                .unwrap()
                .unwrap()
                .status(),
            want
        );
    }
    assert_eq!(p.stats().auth_failures.load(Relaxed), 4);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn forward_auth_lets_through_what_the_service_passes_and_caches_the_passes() {
    // The auth service: a session cookie "good" passes with X-User; anything else is sent to
    // a login page.
    let auth = TestUpstream::start(|r| {
        let good = r
            .header("cookie")
            .is_some_and(|c| c.contains("session=good"));
        match good {
            true => Reply::Respond {
                status: 204,
                headers: vec![("X-User".into(), "alice".into())],
                body: Vec::new(),
                chunked: false,
            },
            false => Reply::Respond {
                status: 302,
                headers: vec![
                    ("Location".into(), "https://login.example/?next=x".into()),
                    ("Content-Type".into(), "text/html".into()),
                ],
                body: b"<a href=\"https://login.example/\">log in</a>".to_vec(),
                chunked: false,
            },
        }
    });
    let app = TestUpstream::start(|r| {
        Reply::ok(&format!(
            "app sees user {}",
            r.header("x-user").unwrap_or("none")
        ))
    });
    let p = start_toml(
        &format!(
            r#"
[[listeners]]
name = "p"
address = "127.0.0.1:0"
[[listeners.routes]]
path = "/down/**"
proxy = "app"
forward_auth = {{ group = "gone" }}
[[listeners.routes]]
proxy = "app"
forward_auth = {{ group = "auth", path = "/verify", copy_headers = ["x-user"], cache = "1m" }}
[upstreams.app]
servers = ["{}"]
[upstreams.auth]
servers = ["{}"]
[upstreams.gone]
servers = ["{}"]
"#,
            app.addr,
            auth.addr,
            crate::common::closed_port()
        ),
        1,
    );
    let addr = p.addr("p").unwrap();
    let got = tokio::task::spawn_blocking(move || {
        let get = |path: &str, extra: &str| {
            let mut c = Client::connect(addr).unwrap();
            let req = format!("GET {path} HTTP/1.1\r\nHost: shop.example\r\n{extra}\r\n");
            let r = c.request(req.as_bytes()).unwrap();
            (r.status, r.header("location").map(str::to_string), r.text())
        };
        vec![
            get("/cart", ""),
            // A client's own X-User never reaches the app.
            get("/cart", "Cookie: session=bad\r\nX-User: admin\r\n"),
            get("/cart", "Cookie: session=good\r\nX-User: admin\r\n"),
            get("/cart?again", "Cookie: session=good\r\n"),
            get("/cart?third", "Cookie: session=good\r\n"),
            get("/down/x", "Cookie: session=good\r\n"),
        ]
    })
    .await
    .unwrap();
    let login = Some("https://login.example/?next=x".to_string());
    assert_eq!((got[0].0, &got[0].1), (302, &login));
    assert!(got[0].2.contains("log in"));
    assert_eq!((got[1].0, &got[1].1), (302, &login));
    assert_eq!(got[2].2, "app sees user alice");
    assert_eq!(got[3].2, "app sees user alice");
    assert_eq!(got[4].2, "app sees user alice");
    assert_eq!(got[5].0, 503, "the auth service unreachable");
    // The service saw the request's method, URI and cookie; the passes after the first came
    // from the cache.
    let asked = auth.requests();
    assert_eq!(
        asked.len(),
        3,
        "two refusals and one pass; the next passes were cached"
    );
    assert_eq!(asked[2].target, "/verify");
    assert_eq!(asked[2].header("x-forwarded-uri"), Some("/cart"));
    assert_eq!(asked[2].header("x-forwarded-method"), Some("GET"));
    assert_eq!(asked[2].header("cookie"), Some("session=good"));
    assert_eq!(p.stats().forward_auth_denied.load(Relaxed), 2);
    // HTTP/2 clients are asked about the same way.
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let mut c = client.ready().await.unwrap();
    let req = http::Request::builder()
        .uri("http://shop.example/cart")
        .body(())
        .unwrap();
    let (resp, _) = c.send_request(req, true).unwrap();
    let resp = tokio::time::timeout(T, resp).await.unwrap().unwrap();
    assert_eq!(resp.status(), 302);
    assert_eq!(resp.headers()["location"], "https://login.example/?next=x");
}

#[test]
fn basic_auth_locks_out_an_address_after_repeated_failures() {
    use base64::Engine;
    let up = TestUpstream::start(|_| Reply::ok("in"));
    let hash = bcrypt::hash("pw", 4).unwrap();
    let p = start_toml(
        &format!(
            "[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nproxy = \"b\"\n\
             basic_auth = {{ users = {{ u = \"{hash}\" }}, lockout = {{ failures = 2, window = \"1m\" }} }}\n\
             [upstreams.b]\nservers = [\"{}\"]\n",
            up.addr
        ),
        1,
    );
    let addr = p.addr("p").unwrap();
    let get = |pw: &str| {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("u:{pw}"));
        let mut c = Client::connect(addr).unwrap();
        let req = format!("GET / HTTP/1.1\r\nHost: a\r\nAuthorization: Basic {token}\r\n\r\n");
        let r = c.request(req.as_bytes()).unwrap();
        (r.status, r.header("retry-after").map(str::to_string))
    };
    assert_eq!(get("pw").0, 200, "a pass clears nothing and locks nothing");
    assert_eq!(get("bad").0, 401);
    assert_eq!(get("bad").0, 401);
    // Locked: even the right password is refused until the window ends.
    let (status, retry) = get("pw");
    assert_eq!(status, 429);
    let secs: u64 = retry.unwrap().parse().unwrap();
    assert!((1..=60).contains(&secs), "{secs}");
    assert_eq!(p.stats().auth_lockouts.load(Relaxed), 1);
    assert_eq!(up.requests().len(), 1);
}

#[tokio::test]
async fn behind_a_trusted_proxy_one_client_address_serves_every_use() {
    let up = TestUpstream::start(|r| {
        Reply::ok(&format!(
            "xff={} real={} var={}",
            r.header("x-forwarded-for").unwrap_or("-"),
            r.header("x-real-ip").unwrap_or("-"),
            r.header("x-client").unwrap_or("-")
        ))
    });
    let dir = std::env::temp_dir().join(format!("portico-trusted-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("access.log");
    let p = start_toml(
        &format!(
            r#"
[access_log]
path = "{}"
format = "json"
[[listeners]]
name = "p"
address = "127.0.0.1:0"
trusted_proxies = ["127.0.0.0/8", "10.0.0.0/8"]
[[listeners.routes]]
proxy = "b"
rate_limit = {{ rate = 0.01, burst = 1 }}
request_headers = {{ set = {{ "X-Client" = "{{remote_addr}}" }} }}
[upstreams.b]
servers = ["{}"]
"#,
            log.display(),
            up.addr
        ),
        1,
    );
    let addr = p.addr("p").unwrap();
    let got = tokio::task::spawn_blocking(move || {
        let get = |xff: &str| {
            let mut c = Client::connect(addr).unwrap();
            let req = format!("GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: {xff}\r\n\r\n");
            let r = c.request(req.as_bytes()).unwrap();
            (r.status, r.text())
        };
        [
            get("198.51.100.1, 10.0.0.2"),
            // The same client through another balancer: the same rate-limit key.
            get("198.51.100.1, 10.0.0.3"),
            // Another client has its own bucket.
            get("203.0.113.9"),
        ]
    })
    .await
    .unwrap();
    // X-Forwarded-For gains the hop that connected (the trusted balancer); the client is the
    // right-most untrusted entry, for X-Real-IP, {remote_addr} and the rate limit alike.
    assert_eq!(got[0].0, 200);
    assert_eq!(
        got[0].1,
        "xff=198.51.100.1, 10.0.0.2, 127.0.0.1 real=198.51.100.1 var=198.51.100.1"
    );
    assert_eq!(got[1].0, 429);
    assert_eq!(got[2].0, 200);
    assert_eq!(
        got[2].1,
        "xff=203.0.113.9, 127.0.0.1 real=203.0.113.9 var=203.0.113.9"
    );
    // The access log names the client, and the peer beside it.
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    crate::common::until("three access-log lines", || text().lines().count() == 3).await;
    let first = text().lines().next().unwrap().to_string();
    assert!(
        first.contains("\"client\":\"198.51.100.1\",\"peer\":\"127.0.0.1\""),
        "{first}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_proxy_protocol_header_names_the_client_for_http1_and_http2() {
    let up = TestUpstream::start(|r| {
        Reply::ok(&format!(
            "real={} xff={}",
            r.header("x-real-ip").unwrap_or("-"),
            r.header("x-forwarded-for").unwrap_or("-")
        ))
    });
    let p = start_toml(
        &format!(
            "[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\nproxy_protocol = true\n\
             trusted_proxies = \"127.0.0.0/8\"\nip_rules = [\"allow 192.0.2.0/24\", \"allow 2001:db8::/32\", \"deny all\"]\n\
             [[listeners.routes]]\nproxy = \"b\"\n[upstreams.b]\nservers = [\"{}\"]\n",
            up.addr
        ),
        1,
    );
    let addr = p.addr("p").unwrap();
    let v2 = |cmd: u8, family: u8, addrs: &[u8]| {
        let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
        h.extend([0x20 | cmd, family]);
        h.extend((addrs.len() as u16).to_be_bytes());
        h.extend(addrs);
        h
    };
    let v6 = {
        let mut a = vec![0u8; 36];
        a[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
        a[15] = 9;
        a
    };
    let headers: Vec<Vec<u8>> = vec![
        b"PROXY TCP4 192.0.2.7 127.0.0.1 5555 80\r\n".to_vec(),
        v2(1, 0x21, &v6),
        v2(1, 0x11, &[198, 51, 100, 1, 127, 0, 0, 1, 0, 1, 0, 80]),
        // LOCAL: the balancer's own health check keeps the socket's address (denied here).
        v2(0, 0x00, &[]),
        Vec::new(),
    ];
    let got = tokio::task::spawn_blocking(move || {
        headers
            .iter()
            .map(|h| {
                let mut raw = h.clone();
                raw.extend_from_slice(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
                let out = portico_testkit::exchange_raw(addr, &raw).unwrap_or_default();
                String::from_utf8_lossy(&out).into_owned()
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    assert!(got[0].starts_with("HTTP/1.1 200"), "{}", got[0]);
    assert!(
        got[0].ends_with("real=192.0.2.7 xff=192.0.2.7"),
        "{}",
        got[0]
    );
    assert!(
        got[1].ends_with("real=2001:db8::9 xff=2001:db8::9"),
        "{}",
        got[1]
    );
    assert!(got[2].starts_with("HTTP/1.1 403"), "{}", got[2]);
    assert!(got[3].starts_with("HTTP/1.1 403"), "{}", got[3]);
    assert_eq!(got[4], "", "no header: closed without an answer");
    assert_eq!(p.stats().proxy_protocol_errors.load(Relaxed), 1);
    // A header that arrives in pieces (a v2 header cut inside its signature and its addresses)
    // is waited for, and the request after it is the connection's own.
    let pieces = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut h = v2(1, 0x11, &[192, 0, 2, 44, 127, 0, 0, 1, 0, 1, 0, 80]);
        h.extend_from_slice(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_nodelay(true).unwrap();
        for part in [&h[..5], &h[5..20], &h[20..]] {
            s.write_all(part).unwrap();
            // Not a synchronisation: the test passes either way; the pause makes the proxy
            // likely to see the header in pieces.
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    })
    .await
    .unwrap();
    assert!(
        pieces.ends_with("real=192.0.2.44 xff=192.0.2.44"),
        "{pieces}"
    );
    // HTTP/2 with prior knowledge after the header.
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut tcp, b"PROXY TCP4 192.0.2.8 127.0.0.1 1 80\r\n")
        .await
        .unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let mut c = client.ready().await.unwrap();
    let req = http::Request::builder().uri("http://a/").body(()).unwrap();
    let (resp, _) = c.send_request(req, true).unwrap();
    let resp = tokio::time::timeout(T, resp).await.unwrap().unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut text = Vec::new();
    while let Some(d) = body.data().await {
        text.extend_from_slice(&d.unwrap());
    }
    assert_eq!(text, b"real=192.0.2.8 xff=192.0.2.8");
}
