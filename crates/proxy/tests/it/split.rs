//! Traffic splits through real sockets: shares of a route's requests to another group, the same side for the same cookie, for HTTP/1.1 and HTTP/2 clients.

use crate::common::{start_toml, T};
use portico_testkit::{Client, Reply, TestUpstream};

#[tokio::test]
async fn a_cookie_keeps_a_client_on_its_side_of_a_split() {
    let stable = TestUpstream::start(|_| Reply::ok("stable"));
    let canary = TestUpstream::start(|_| Reply::ok("canary"));
    let p = start_toml(
        &format!(
            "[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nproxy = \"stable\"\n\
             split = [{{ group = \"canary\", percent = 30 }}]\nsplit_key = \"cookie:uid\"\n\
             [upstreams.stable]\nservers = [\"{}\"]\n[upstreams.canary]\nservers = [\"{}\"]\n",
            stable.addr, canary.addr
        ),
        1,
    );
    let addr = p.addr("p").unwrap();
    let side_of = |uid: usize| {
        let mut c = Client::connect(addr).unwrap();
        let req = format!("GET / HTTP/1.1\r\nHost: a\r\nCookie: theme=dark; uid=u{uid}\r\n\r\n");
        c.request(req.as_bytes()).unwrap().text()
    };
    let sides: Vec<String> = (0..200).map(side_of).collect();
    let on_canary = sides.iter().filter(|s| *s == "canary").count();
    assert!(
        (30..90).contains(&on_canary),
        "about 30% of 200 users: {on_canary}"
    );
    // The same user, again and on a new connection: the same side.
    for (uid, side) in sides.iter().enumerate().take(20) {
        assert_eq!(&side_of(uid), side, "user {uid}");
    }
    // HTTP/2 clients follow the same rule.
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    for (uid, side) in sides.iter().enumerate().take(10) {
        let req = http::Request::builder()
            .uri("http://a/")
            .header("cookie", format!("uid=u{uid}"))
            .body(())
            .unwrap();
        let mut c = client.clone().ready().await.unwrap();
        let (resp, _) = c.send_request(req, true).unwrap();
        let mut body = tokio::time::timeout(T, resp)
            .await
            .unwrap()
            .unwrap()
            .into_body();
        let mut got = Vec::new();
        while let Some(d) = body.data().await {
            got.extend_from_slice(&d.unwrap());
        }
        assert_eq!(
            &String::from_utf8(got).unwrap(),
            side,
            "user {uid} over HTTP/2"
        );
    }
}
