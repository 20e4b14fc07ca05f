//! Request mirroring through real sockets: copies reach the shadow group with their bodies, a shadow that is down never touches the real answers, and what cannot be copied is counted.

use crate::common::{closed_port, start_toml, until, T};
use portico_testkit::{Client, Reply, TestUpstream};
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;

fn config(main: SocketAddr, shadow: SocketAddr) -> String {
    format!(
        r#"
[[listeners]]
name = "p"
address = "127.0.0.1:0"
[[listeners.routes]]
path = "/buffered/**"
proxy = "main"
buffer_request = {{}}
mirror = {{ group = "shadow" }}
[[listeners.routes]]
proxy = "main"
mirror = {{ group = "shadow", percent = 100 }}
[upstreams.main]
servers = ["{main}"]
[upstreams.shadow]
servers = ["{shadow}"]
"#
    )
}

#[tokio::test]
async fn copies_reach_the_shadow_group_with_their_bodies() {
    let main = TestUpstream::start(|r| Reply::ok(&format!("main {}", r.body.len())));
    let shadow = TestUpstream::start(|_| Reply::ok("shadow: never seen by clients"));
    let p = start_toml(&config(main.addr, shadow.addr), 1);
    let addr = p.addr("p").unwrap();
    let s = tokio::task::spawn_blocking(move || {
        let mut c = Client::connect(addr).unwrap();
        for i in 0..5 {
            let r = c
                .request(format!("GET /page/{i}?x=1 HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes())
                .unwrap();
            assert_eq!(r.text(), "main 0");
        }
        let r = c
            .request(
                b"POST /buffered/form HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\nhello world",
            )
            .unwrap();
        assert_eq!(r.text(), "main 11");
        // A streamed body (no buffer_request) is not copied: counted as skipped.
        let r = c
            .request(b"POST /stream HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc")
            .unwrap();
        assert_eq!(r.text(), "main 3");
    });
    s.await.unwrap();
    until("six copies answered", || {
        p.stats().mirror_answered.load(Relaxed) == 6
    })
    .await;
    let copies = shadow.requests();
    assert_eq!(copies.len(), 6);
    assert!(copies.iter().any(|c| c.target == "/page/3?x=1"));
    let form = copies
        .iter()
        .find(|c| c.target == "/buffered/form")
        .unwrap();
    assert_eq!(form.body, b"hello world");
    assert_eq!(form.header("x-forwarded-for"), Some("127.0.0.1"));
    assert_eq!(p.stats().mirror_skipped.load(Relaxed), 1);
    assert_eq!(main.requests().len(), 7);
}

#[tokio::test]
async fn a_shadow_that_is_down_never_touches_the_real_answers() {
    let main = TestUpstream::start(|_| Reply::ok("main"));
    let p = start_toml(&config(main.addr, closed_port()), 1);
    let addr = p.addr("p").unwrap();
    // HTTP/2 client as well as HTTP/1.1.
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    for _ in 0..5 {
        let req = http::Request::builder().uri("http://a/x").body(()).unwrap();
        let mut c = client.clone().ready().await.unwrap();
        let (resp, _) = c.send_request(req, true).unwrap();
        let resp = tokio::time::timeout(T, resp).await.unwrap().unwrap();
        assert_eq!(resp.status(), 200);
    }
    tokio::task::spawn_blocking(move || {
        let mut c = Client::connect(addr).unwrap();
        for _ in 0..5 {
            assert_eq!(
                c.request(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
                    .unwrap()
                    .text(),
                "main"
            );
        }
    })
    .await
    .unwrap();
    // Every copy failed or was dropped (the shadow's server is ejected after failures), none
    // reached a client.
    until("ten copies accounted for", || {
        let s = p.stats();
        s.mirror_failed.load(Relaxed) + s.mirror_dropped.load(Relaxed) == 10
    })
    .await;
    assert_eq!(main.requests().len(), 10);
    assert_eq!(p.stats().mirror_answered.load(Relaxed), 0);
}
