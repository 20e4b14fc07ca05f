//! Redirects, upstream rewrites and header values with variables and `path_regex` captures, through real sockets for HTTP/1.1 and HTTP/2 clients.

use crate::common::{start_toml, T};
use portico_proxy::Running;
use portico_testkit::{Client, Reply, TestUpstream};

fn proxy(up: &TestUpstream) -> Running {
    start_toml(
        &format!(
            r#"
[[listeners]]
name = "p"
address = "127.0.0.1:0"

[[listeners.routes]]
path = "/old/**"
redirect = "https://{{host}}:8443/new{{uri}}"
redirect_status = 308

[[listeners.routes]]
path_regex = '^/users/(?P<id>[0-9]+)/(\w+)$'
proxy = "b"
rewrite = "/v2/accounts/{{id}}?view={{2}}"
request_headers = {{ set = {{ "x-user" = "{{id}}", "x-peer" = "{{remote_addr}} via {{scheme}}" }} }}
response_headers = {{ add = {{ "x-served-path" = "{{path}}", "x-session" = "{{cookie.sid}}", "x-port" = "{{port}}" }} }}

[[listeners.routes]]
path_regex = '^/files/(.*)$'
proxy = "b"
rewrite = "/static/{{1}}"

[upstreams.b]
servers = ["{}"]
"#,
            up.addr
        ),
        1,
    )
}

#[test]
fn http1_redirects_rewrites_and_headers_render_the_request() {
    let up = TestUpstream::start(|r| Reply::ok(&format!("upstream saw {}", r.target)));
    let p = proxy(&up);
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    let r = c
        .request(b"GET /old/page?a=1 HTTP/1.1\r\nHost: shop.example:8080\r\n\r\n")
        .unwrap();
    assert_eq!(r.status, 308);
    assert_eq!(
        r.header("location"),
        Some("https://shop.example:8443/new/old/page?a=1")
    );
    let r = c
        .request(b"GET /users/42/edit HTTP/1.1\r\nHost: a\r\nCookie: x=1; sid=abc\r\n\r\n")
        .unwrap();
    assert_eq!(r.text(), "upstream saw /v2/accounts/42?view=edit");
    assert_eq!(r.header("x-served-path"), Some("/users/42/edit"));
    assert_eq!(r.header("x-session"), Some("abc"));
    assert_eq!(r.header("x-port"), Some("80"));
    let seen = up.requests().pop().unwrap();
    assert_eq!(seen.header("x-user"), Some("42"));
    assert_eq!(seen.header("x-peer"), Some("127.0.0.1 via http"));
    // The client's query is kept when the rewrite sets none; a path that does not match the
    // regex falls through to no route.
    let r = c
        .request(b"GET /files/css/a.css?v=3 HTTP/1.1\r\nHost: a\r\n\r\n")
        .unwrap();
    assert_eq!(r.text(), "upstream saw /static/css/a.css?v=3");
    let r = c
        .request(b"GET /users/x/edit HTTP/1.1\r\nHost: a\r\n\r\n")
        .unwrap();
    assert_eq!(r.status, 404);
}

#[tokio::test]
async fn http2_clients_get_the_same_values() {
    let up = TestUpstream::start(|r| Reply::ok(&format!("upstream saw {}", r.target)));
    let p = proxy(&up);
    let tcp = tokio::net::TcpStream::connect(p.addr("p").unwrap())
        .await
        .unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let send = |uri: &str| {
        let req = http::Request::builder()
            .uri(uri)
            .header("cookie", "sid=h2")
            .body(())
            .unwrap();
        let client = client.clone();
        async move {
            let mut c = client.ready().await.unwrap();
            let (resp, _) = c.send_request(req, true).unwrap();
            let resp = tokio::time::timeout(T, resp).await.unwrap().unwrap();
            let headers = resp.headers().clone();
            let status = resp.status().as_u16();
            let mut body = resp.into_body();
            let mut got = Vec::new();
            while let Some(d) = body.data().await {
                got.extend_from_slice(&d.unwrap());
            }
            (status, headers, String::from_utf8(got).unwrap())
        }
    };
    let (status, h, _) = send("http://shop.example/old/x").await;
    assert_eq!(status, 308);
    assert_eq!(
        h.get("location").unwrap(),
        "https://shop.example:8443/new/old/x"
    );
    let (_, h, body) = send("http://a.test/users/7/view").await;
    assert_eq!(body, "upstream saw /v2/accounts/7?view=view");
    assert_eq!(h.get("x-session").unwrap(), "h2");
    assert_eq!(up.requests().pop().unwrap().header("x-user"), Some("7"));
}
