//! Interim (1xx) responses of HTTP/1.1 upstreams reach HTTP/2 clients as informational HEADERS before the final response.

use crate::common::T;
use portico_proxy::start;
use portico_testkit::{Reply, TestUpstream};
use std::future::poll_fn;
use tokio::net::TcpStream;

/// Every test step is bounded by this.
#[tokio::test]
async fn early_hints_reach_http2_clients_before_the_response() {
    let up = TestUpstream::start(|_| {
        Reply::Raw(
            b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\nConnection: x-hop\r\nX-Hop: 1\r\n\r\n\
HTTP/1.1 103 Early Hints\r\nLink: </b.js>; rel=preload\r\n\r\n\
HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                .to_vec(),
        )
    });
    let toml = format!(
        r#"
[[listeners]]
name = "p"
address = "127.0.0.1:0"
[[listeners.routes]]
proxy = "b"
[upstreams.b]
servers = ["{}"]
"#,
        up.addr
    );
    let cfg = portico_config::parse(&toml, "h2-interim.toml").unwrap_or_else(|e| panic!("{e}"));
    let p = start(cfg, 1).expect("start");
    let tcp = TcpStream::connect(p.addr("p").unwrap()).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let mut client = tokio::time::timeout(T, client.ready())
        .await
        .expect("ready")
        .unwrap();
    let req = http::Request::get("http://app.test/page").body(()).unwrap();
    let (mut resp, _) = client.send_request(req, true).unwrap();
    let mut hints = Vec::new();
    while let Some(info) = tokio::time::timeout(T, poll_fn(|cx| resp.poll_informational(cx)))
        .await
        .expect("informational in time")
    {
        let info = info.unwrap();
        assert_eq!(info.status(), 103);
        assert!(!info.headers().contains_key("x-hop"), "{info:?}");
        hints.push(info.headers()["link"].to_str().unwrap().to_string());
    }
    assert_eq!(hints, ["</a.css>; rel=preload", "</b.js>; rel=preload"]);
    let resp = tokio::time::timeout(T, resp).await.expect("head").unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut got = Vec::new();
    while let Some(d) = tokio::time::timeout(T, body.data()).await.expect("body") {
        got.extend_from_slice(&d.unwrap());
    }
    assert_eq!(got, b"ok");
}
