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
