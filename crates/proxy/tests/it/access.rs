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
