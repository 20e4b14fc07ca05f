//! CORS through real sockets: preflights answered or refused locally, the policy's fields on proxied responses, the server's own dropped, for HTTP/1.1 and HTTP/2 clients.

use crate::common::{start_toml, T};
use portico_proxy::stats::{Cause, Phase, Side};
use portico_proxy::{Running, Termination};
use portico_testkit::{Client, Reply, TestUpstream};

/// An upstream that sets its own (wrong) CORS field, which the policy must replace.
fn upstream() -> TestUpstream {
    TestUpstream::start(|_| Reply::Respond {
        status: 200,
        headers: vec![
            ("Access-Control-Allow-Origin".into(), "*".into()),
            ("X-Request-Id".into(), "r1".into()),
        ],
        body: b"data".to_vec(),
        chunked: false,
    })
}

fn proxy(up: &TestUpstream) -> Running {
    start_toml(
        &format!(
            r#"
[[listeners]]
name = "p"
address = "127.0.0.1:0"
[[listeners.routes]]
path = "/api/**"
proxy = "b"
[listeners.routes.cors]
allow_origins = ["https://app.example.com", "https://*.example.org"]
allow_methods = ["GET", "PUT", "DELETE"]
allow_headers = ["content-type", "authorization"]
expose_headers = ["X-Request-Id"]
allow_credentials = true
max_age = "10m"
[[listeners.routes]]
proxy = "b"
[upstreams.b]
servers = ["{}"]
"#,
            up.addr
        ),
        1,
    )
}

fn preflight(origin: &str, method: &str, headers: &str) -> Vec<u8> {
    format!(
        "OPTIONS /api/items HTTP/1.1\r\nHost: api.example.com\r\nOrigin: {origin}\r\n\
         Access-Control-Request-Method: {method}\r\nAccess-Control-Request-Headers: {headers}\r\n\r\n"
    )
    .into_bytes()
}

#[test]
fn http1_preflights_are_answered_here_and_responses_carry_the_policy() {
    let up = upstream();
    let p = proxy(&up);
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    let r = c
        .request(&preflight(
            "https://app.example.com",
            "PUT",
            "Content-Type, Authorization",
        ))
        .unwrap();
    assert_eq!(r.status, 204);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example.com")
    );
    assert_eq!(
        r.header("access-control-allow-methods"),
        Some("GET, PUT, DELETE")
    );
    assert_eq!(
        r.header("access-control-allow-headers"),
        Some("content-type, authorization")
    );
    assert_eq!(r.header("access-control-allow-credentials"), Some("true"));
    assert_eq!(r.header("access-control-max-age"), Some("600"));
    assert_eq!(r.header("content-length"), None);
    // Refused: an origin, a method, a header the policy does not list; the connection stays.
    for req in [
        preflight("https://evil.test", "PUT", "content-type"),
        preflight("https://app.example.com", "PATCH", "content-type"),
        preflight("https://a.example.org", "PUT", "x-secret"),
    ] {
        let r = c.request(&req).unwrap();
        assert_eq!(r.status, 403);
        assert_eq!(r.header("access-control-allow-origin"), None);
    }
    assert!(up.requests().is_empty(), "no preflight reached the server");
    // Counted as the client's, at routing, denied (the record lands just after the answer).
    let denied = Termination::new(Side::Client, Phase::Route, Cause::Denied);
    let deadline = std::time::Instant::now() + T;
    while p.stats().terminations(denied) < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "3 denied preflights counted"
        );
        std::thread::yield_now();
    }
    // An actual request from an allowed origin: the policy's fields, not the server's.
    let get = b"GET /api/items HTTP/1.1\r\nHost: a\r\nOrigin: https://x.example.org\r\n\r\n";
    let r = c.request(get).unwrap();
    assert_eq!(r.status, 200);
    let acao: Vec<_> = r
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("access-control-allow-origin"))
        .collect();
    assert_eq!(acao.len(), 1, "{:?}", r.headers);
    assert_eq!(acao[0].1, "https://x.example.org");
    assert_eq!(
        r.header("access-control-expose-headers"),
        Some("X-Request-Id")
    );
    assert_eq!(r.header("vary"), Some("Origin"));
    // Another origin and no origin: proxied without CORS fields, still Vary: Origin.
    let r = c
        .request(b"GET /api/items HTTP/1.1\r\nHost: a\r\nOrigin: https://evil.test\r\n\r\n")
        .unwrap();
    assert_eq!(
        (r.status, r.header("access-control-allow-origin")),
        (200, None)
    );
    let r = c
        .request(b"GET /api/items HTTP/1.1\r\nHost: a\r\n\r\n")
        .unwrap();
    assert_eq!(
        (r.header("access-control-allow-origin"), r.header("vary")),
        (None, Some("Origin"))
    );
    // A plain OPTIONS (no Access-Control-Request-Method) is proxied; a route without a policy
    // passes the server's fields as they are.
    let r = c
        .request(
            b"OPTIONS /api/items HTTP/1.1\r\nHost: a\r\nOrigin: https://app.example.com\r\n\r\n",
        )
        .unwrap();
    assert_eq!(r.text(), "data");
    let r = c
        .request(b"GET /other HTTP/1.1\r\nHost: a\r\nOrigin: https://evil.test\r\n\r\n")
        .unwrap();
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
}

#[tokio::test]
async fn http2_preflights_and_responses() {
    let up = upstream();
    let p = proxy(&up);
    let tcp = tokio::net::TcpStream::connect(p.addr("p").unwrap())
        .await
        .unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let send = |method: &str, fields: &[(&str, &str)]| {
        let mut req = http::Request::builder()
            .method(method)
            .uri("http://api.example.com/api/items");
        for (n, v) in fields {
            req = req.header(*n, *v);
        }
        let req = req.body(()).unwrap();
        let client = client.clone();
        async move {
            let mut c = client.ready().await.unwrap();
            let (resp, _) = c.send_request(req, true).unwrap();
            tokio::time::timeout(T, resp).await.unwrap().unwrap()
        }
    };
    let ok = send(
        "OPTIONS",
        &[
            ("origin", "https://app.example.com"),
            ("access-control-request-method", "DELETE"),
        ],
    )
    .await;
    assert_eq!(ok.status(), 204);
    assert_eq!(
        ok.headers()["access-control-allow-origin"],
        "https://app.example.com"
    );
    let refused = send(
        "OPTIONS",
        &[
            ("origin", "https://evil.test"),
            ("access-control-request-method", "DELETE"),
        ],
    )
    .await;
    assert_eq!(refused.status(), 403);
    let got = send("GET", &[("origin", "https://app.example.com")]).await;
    assert_eq!(got.status(), 200);
    let acao: Vec<_> = got
        .headers()
        .get_all("access-control-allow-origin")
        .iter()
        .collect();
    assert_eq!(acao, ["https://app.example.com"]);
    assert_eq!(got.headers()["access-control-allow-credentials"], "true");
}
