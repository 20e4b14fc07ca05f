//! Upstream HTTP/2 end to end: HTTP/1.1 and HTTP/2 clients -> portico -> an in-test `h2` server
//! (h2c prior knowledge, and TLS with ALPN h2), multiplexing, gRPC-style trailers, GOAWAY.

use crate::common::T;
use bytes::Bytes;
use h2::client::SendRequest;
use portico_proxy::{start, Running};
use std::future::poll_fn;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Every test step is bounded by this.
/// Streams that must be in flight at once before `/wait` requests are answered.
const WAIT_FOR: usize = 8;

/// An HTTP/2 server on its own thread, counting accepted connections. Paths:
/// `/wait`: answered once `WAIT_FOR` of them are open at once; `/grpc`: echoes the body with
/// `content-type: application/grpc` and trailers `grpc-status: 0`; `/goaway`: answers and
/// sends GOAWAY; anything else: `200` with what the server saw.
struct H2Upstream {
    addr: SocketAddr,
    accepts: Arc<AtomicUsize>,
    /// Connections that ended (the client closed them or they failed).
    closes: Arc<AtomicUsize>,
}

impl H2Upstream {
    fn start(tls: Option<Arc<rustls::ServerConfig>>) -> H2Upstream {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let accepts = Arc::new(AtomicUsize::new(0));
        let counted = accepts.clone();
        let closes = Arc::new(AtomicUsize::new(0));
        let closed = closes.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let waiting = Arc::new((AtomicUsize::new(0), tokio::sync::Notify::new()));
                loop {
                    let Ok((tcp, _)) = listener.accept().await else {
                        return;
                    };
                    counted.fetch_add(1, Ordering::SeqCst);
                    let waiting = waiting.clone();
                    let closed = closed.clone();
                    match &tls {
                        None => {
                            tokio::spawn(async move {
                                serve(tcp, waiting).await;
                                closed.fetch_add(1, Ordering::SeqCst);
                            });
                        }
                        Some(cfg) => {
                            let acceptor = tokio_rustls::TlsAcceptor::from(cfg.clone());
                            tokio::spawn(async move {
                                if let Ok(s) = acceptor.accept(tcp).await {
                                    serve(s, waiting).await;
                                }
                                closed.fetch_add(1, Ordering::SeqCst);
                            });
                        }
                    }
                }
            });
        });
        H2Upstream {
            addr,
            accepts,
            closes,
        }
    }

    fn accepts(&self) -> usize {
        self.accepts.load(Ordering::SeqCst)
    }
}

type Waiting = Arc<(AtomicUsize, tokio::sync::Notify)>;

async fn serve<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(io: S, waiting: Waiting) {
    let Ok(mut conn) = h2::server::handshake(io).await else {
        return;
    };
    while let Some(Ok((req, respond))) = conn.accept().await {
        if req.uri().path() == "/goaway" {
            conn.graceful_shutdown();
        }
        tokio::spawn(answer(req, respond, waiting.clone()));
    }
}

async fn answer(
    req: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    waiting: Waiting,
) {
    let (parts, mut body) = req.into_parts();
    if parts.uri.path() == "/bidi" {
        // Answers at once, then echoes each DATA frame as it arrives; trailers at the end.
        let resp = http::Response::builder()
            .status(200)
            .header("content-type", "application/grpc")
            .body(())
            .unwrap();
        let mut send = respond.send_response(resp, false).unwrap();
        while let Some(Ok(d)) = body.data().await {
            let _ = body.flow_control().release_capacity(d.len());
            let _ = send.send_data(d, false);
        }
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        let _ = send.send_trailers(trailers);
        return;
    }
    let mut got = Vec::new();
    while let Some(Ok(d)) = body.data().await {
        let _ = body.flow_control().release_capacity(d.len());
        got.extend_from_slice(&d);
    }
    let path = parts.uri.path().to_string();
    if path == "/wait" {
        let (n, notify) = &*waiting;
        let notified = notify.notified();
        if n.fetch_add(1, Ordering::SeqCst) + 1 >= WAIT_FOR {
            notify.notify_waiters();
        } else {
            notified.await;
        }
    }
    let field = |n: &str| {
        parts
            .headers
            .get(n)
            .map_or("-", |v| v.to_str().unwrap_or("?"))
            .to_string()
    };
    if path == "/nocontent" {
        let resp = http::Response::builder().status(204).body(()).unwrap();
        let _ = respond.send_response(resp, true);
        return;
    }
    if path == "/hints" || path == "/manyhints" {
        // Two 103 Early Hints (nine for `/manyhints`), then the response.
        let n = if path == "/hints" { 2 } else { 9 };
        for link in ["</a.css>; rel=preload", "</b.js>; rel=preload"]
            .iter()
            .cycle()
            .take(n)
        {
            let hints = http::Response::builder()
                .status(103)
                .header("link", *link)
                .body(())
                .unwrap();
            respond.send_informational(hints).unwrap();
        }
        let resp = http::Response::builder()
            .status(200)
            .header("content-length", "2")
            .body(())
            .unwrap();
        let mut send = respond.send_response(resp, false).unwrap();
        let _ = send.send_data(Bytes::from_static(b"ok"), true);
        return;
    }
    if path == "/notmodified" {
        let resp = http::Response::builder().status(304).body(()).unwrap();
        let _ = respond.send_response(resp, true);
        return;
    }
    if path == "/late-end" {
        // A bodiless answer (for HEAD) whose stream ends in a DATA frame after the HEADERS.
        let resp = http::Response::builder()
            .status(200)
            .header("content-length", "5")
            .body(())
            .unwrap();
        let mut send = respond.send_response(resp, false).unwrap();
        let _ = send.send_data(Bytes::new(), true);
        return;
    }
    if path == "/reset" {
        respond.send_reset(h2::Reason::INTERNAL_ERROR);
        return;
    }
    if path == "/slow" {
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    if let Some(n) = path.strip_prefix("/big/") {
        // A large response without content-length, in several DATA frames.
        let n: usize = n.parse().unwrap();
        let resp = http::Response::builder().status(200).body(()).unwrap();
        let mut send = respond.send_response(resp, false).unwrap();
        let line = format!("got {} bytes\n", got.len());
        let _ = send.send_data(Bytes::from(line), false);
        for _ in 0..n / 16384 {
            let _ = send.send_data(Bytes::from(vec![b'x'; 16384]), false);
        }
        let _ = send.send_data(Bytes::new(), true);
        return;
    }
    if path == "/trailers" {
        // Answers with the request's trailers (sorted `name=value;`), then trailers of its own,
        // among them fields that may not travel in trailers.
        let mut seen: Vec<String> = match body.trailers().await {
            Ok(Some(t)) => t
                .iter()
                .map(|(n, v)| format!("{n}={};", v.to_str().unwrap_or("?")))
                .collect(),
            _ => Vec::new(),
        };
        seen.sort();
        let resp = http::Response::builder().status(200).body(()).unwrap();
        let mut send = respond.send_response(resp, false).unwrap();
        send.send_data(Bytes::from(seen.concat()), false).unwrap();
        let mut trailers = http::HeaderMap::new();
        for (n, v) in [
            ("grpc-status", "0"),
            ("set-cookie", "session=stolen"),
            ("x-forwarded-for", "6.6.6.6"),
            ("www-authenticate", "Basic"),
            ("location", "http://evil.example/"),
        ] {
            trailers.insert(n, v.parse().unwrap());
        }
        let _ = send.send_trailers(trailers);
        return;
    }
    if path == "/grpc" {
        let resp = http::Response::builder()
            .status(200)
            .header("content-type", "application/grpc")
            .body(())
            .unwrap();
        let mut send = respond.send_response(resp, false).unwrap();
        let mut echo = format!("te={} ", field("te")).into_bytes();
        echo.extend_from_slice(&got);
        send.send_data(Bytes::from(echo), false).unwrap();
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        trailers.insert("grpc-message", "fine".parse().unwrap());
        let _ = send.send_trailers(trailers);
        return;
    }
    let text = format!(
        "{} {} authority={} xff={} body={}",
        parts.method,
        parts.uri.path_and_query().map_or("", |p| p.as_str()),
        parts.uri.authority().map_or("-", |a| a.as_str()),
        field("x-forwarded-for"),
        String::from_utf8_lossy(&got)
    );
    let resp = http::Response::builder()
        .status(200)
        .header("x-upstream", "h2")
        .body(())
        .unwrap();
    let mut send = respond.send_response(resp, false).unwrap();
    let _ = send.send_data(Bytes::from(text), true);
}

fn proxy(up: SocketAddr, group_extra: &str) -> Running {
    let toml = format!(
        r#"
[[listeners]]
name = "p"
address = "127.0.0.1:0"
[[listeners.routes]]
proxy = "b"
[upstreams.b]
servers = ["{up}"]
protocol = "h2"
connect_timeout = "2s"
{group_extra}
"#
    );
    let cfg = portico_config::parse(&toml, "h2up-test.toml").unwrap_or_else(|e| panic!("{e}"));
    start(cfg, 1).expect("start")
}

async fn h2c(addr: SocketAddr) -> SendRequest<Bytes> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    client
}

struct Got {
    status: u16,
    headers: http::HeaderMap,
    body: String,
    trailers: Option<http::HeaderMap>,
}

async fn send(
    client: &SendRequest<Bytes>,
    method: &str,
    path: &str,
    fields: &[(&str, &str)],
    body: Option<&[u8]>,
) -> Got {
    let mut b = http::Request::builder()
        .method(method)
        .uri(format!("http://app.test{path}"));
    for (n, v) in fields {
        b = b.header(*n, *v);
    }
    let mut c = tokio::time::timeout(T, client.clone().ready())
        .await
        .expect("ready in time")
        .unwrap();
    let (resp, mut stream) = c.send_request(b.body(()).unwrap(), body.is_none()).unwrap();
    if let Some(body) = body {
        stream
            .send_data(Bytes::copy_from_slice(body), true)
            .unwrap();
    }
    let resp = tokio::time::timeout(T, resp).await.expect("head").unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let mut rb = resp.into_body();
    let mut out = Vec::new();
    while let Some(d) = tokio::time::timeout(T, rb.data()).await.expect("body") {
        let d = d.unwrap();
        let _ = rb.flow_control().release_capacity(d.len());
        out.extend_from_slice(&d);
    }
    let trailers = tokio::time::timeout(T, rb.trailers())
        .await
        .expect("trailers")
        .unwrap();
    Got {
        status,
        headers,
        body: String::from_utf8(out).unwrap(),
        trailers,
    }
}

/// One HTTP/1.1 exchange on a new connection (`Connection: close`): the whole response text.
async fn http1(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(T, s.read_to_end(&mut out))
        .await
        .expect("response in time")
        .unwrap();
    String::from_utf8(out).unwrap()
}

#[tokio::test]
async fn http2_clients_multiplex_over_one_upstream_connection() {
    let up = H2Upstream::start(None);
    let p = proxy(up.addr, "");
    let client = h2c(p.addr("p").unwrap()).await;
    // The server answers none of these until all are open at once: they must share it.
    let mut pending = Vec::new();
    for _ in 0..WAIT_FOR {
        let c = client.clone();
        pending.push(tokio::spawn(async move {
            send(&c, "GET", "/wait", &[], None).await
        }));
    }
    for t in pending {
        let got = t.await.unwrap();
        assert_eq!(got.status, 200);
        assert!(
            got.body.starts_with("GET /wait authority=app.test"),
            "{}",
            got.body
        );
        assert_eq!(got.headers["x-upstream"], "h2");
    }
    let got = send(&client, "POST", "/echo?x=1", &[], Some(b"payload")).await;
    assert_eq!(got.status, 200);
    assert!(
        got.body
            .ends_with("POST /echo?x=1 authority=app.test xff=127.0.0.1 body=payload"),
        "{}",
        got.body
    );
    assert_eq!(up.accepts(), 1, "every stream over one upstream connection");
    drop(p);
}

#[tokio::test]
async fn http1_clients_reach_an_h2_upstream() {
    let up = H2Upstream::start(None);
    let p = proxy(up.addr, "");
    let addr = p.addr("p").unwrap();
    let text = http1(
        addr,
        "POST /echo HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{text}"
    );
    assert!(
        text.contains("POST /echo authority=app.test xff=127.0.0.1 body=hello"),
        "{text}"
    );
    // A chunked upload, then a second client: still one upstream connection.
    let text = http1(
        addr,
        "POST /echo HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    )
    .await;
    assert!(text.contains("body=abc"), "{text}");
    assert_eq!(up.accepts(), 1);
}

#[tokio::test]
async fn a_204_from_an_h2_upstream_gets_no_invented_length() {
    let up = H2Upstream::start(None);
    let p = proxy(up.addr, "");
    let addr = p.addr("p").unwrap();
    let text = http1(
        addr,
        "GET /nocontent HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 204"), "{text}");
    let lower = text.to_ascii_lowercase();
    assert!(!lower.contains("content-length"), "{text}");
    assert!(!lower.contains("transfer-encoding"), "{text}");
}

#[tokio::test]
async fn early_hints_from_an_h2_upstream_reach_http1_clients() {
    let up = H2Upstream::start(None);
    let p = proxy(up.addr, "");
    let addr = p.addr("p").unwrap();
    let text = http1(
        addr,
        "GET /hints HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(
        text.starts_with(
            "HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n\
HTTP/1.1 103 Early Hints\r\nlink: </b.js>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\n"
        ),
        "{text}"
    );
    assert!(text.ends_with("\r\n\r\nok"), "{text}");
    // Never to HTTP/1.0 clients (RFC 9110 15.2).
    let text = http1(addr, "GET /hints HTTP/1.0\r\nHost: app.test\r\n\r\n").await;
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    // More than 8 is a broken server, as for HTTP/1.1 upstreams: the first 8 went out as they
    // came, the 9th gets the request a 502.
    let text = http1(
        addr,
        "GET /manyhints HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(
        text.matches("HTTP/1.1 103 Early Hints\r\n").count(),
        8,
        "{text}"
    );
    let last = text.rsplit("\r\n\r\nHTTP/1.1 ").next().unwrap_or("");
    assert!(last.starts_with("502"), "{text}");
}

#[tokio::test]
async fn early_hints_from_an_h2_upstream_reach_http2_clients() {
    let up = H2Upstream::start(None);
    let p = proxy(up.addr, "");
    let client = h2c(p.addr("p").unwrap()).await;
    let mut c = tokio::time::timeout(T, client.ready())
        .await
        .expect("ready")
        .unwrap();
    let req = http::Request::get("http://app.test/hints")
        .body(())
        .unwrap();
    let (mut resp, _) = c.send_request(req, true).unwrap();
    let mut hints = Vec::new();
    while let Some(info) = tokio::time::timeout(T, poll_fn(|cx| resp.poll_informational(cx)))
        .await
        .expect("informational in time")
    {
        let info = info.unwrap();
        assert_eq!(info.status(), 103);
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

/// HEAD, 204 and 304 answers (no body read from the upstream stream) give back the server's
/// active count and the connection's stream slot, for both client kinds, over one connection.
#[tokio::test]
async fn bodiless_answers_give_their_slots_back() {
    let up = H2Upstream::start(None);
    let p = proxy(up.addr, "");
    let addr = p.addr("p").unwrap();
    let group = p.upstream("b").unwrap();
    let asks = [
        ("HEAD", "/late-end", 200),
        ("GET", "/nocontent", 204),
        ("GET", "/notmodified", 304),
    ];
    let mut s = TcpStream::connect(addr).await.unwrap();
    for (method, path, status) in asks {
        let req = format!("{method} {path} HTTP/1.1\r\nHost: app.test\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            let n = tokio::time::timeout(T, s.read(&mut b))
                .await
                .expect("head in time")
                .unwrap();
            assert_eq!(n, 1, "closed after {}", String::from_utf8_lossy(&head));
            head.push(b[0]);
        }
        let head = String::from_utf8(head).unwrap();
        assert!(head.starts_with(&format!("HTTP/1.1 {status}")), "{head}");
        assert_eq!(group.active(0), 0, "{method} {path}");
    }
    let client = h2c(addr).await;
    for (method, path, status) in asks {
        let got = send(&client, method, path, &[], None).await;
        assert_eq!(got.status, status);
        assert_eq!(got.body, "");
        assert_eq!(group.active(0), 0, "{method} {path}");
    }
    assert_eq!(up.accepts(), 1);
}

#[tokio::test]
async fn grpc_style_exchange_passes_trailers() {
    let up = H2Upstream::start(None);
    let p = proxy(up.addr, "");
    let addr = p.addr("p").unwrap();
    let client = h2c(addr).await;
    let fields = [("content-type", "application/grpc"), ("te", "trailers")];
    let got = send(&client, "POST", "/grpc", &fields, Some(b"\0\0\0\0\x02hi")).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.headers["content-type"], "application/grpc");
    assert_eq!(got.body, "te=trailers \0\0\0\0\x02hi");
    let trailers = got.trailers.expect("trailers");
    assert_eq!(trailers["grpc-status"], "0");
    assert_eq!(trailers["grpc-message"], "fine");

    // An HTTP/1.1 client that accepts trailers gets them in the chunked body.
    let text = http1(
        addr,
        "POST /grpc HTTP/1.1\r\nHost: app.test\r\nTE: trailers\r\nContent-Type: application/grpc\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("te=trailers hi"), "{text}");
    assert!(
        text.ends_with("0\r\ngrpc-status: 0\r\ngrpc-message: fine\r\n\r\n"),
        "{text:?}"
    );
    // Without `TE: trailers` it gets none.
    let text = http1(
        addr,
        "POST /grpc HTTP/1.1\r\nHost: app.test\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
    )
    .await;
    assert!(text.ends_with("0\r\n\r\n"), "{text:?}");
    assert!(!text.contains("grpc-status"), "{text:?}");
}

#[tokio::test]
async fn trailers_that_may_not_travel_are_dropped_both_ways() {
    let up = H2Upstream::start(None);
    let p = proxy(up.addr, "");
    let addr = p.addr("p").unwrap();
    // From an HTTP/1.1 client: identity, routing and framing fields in the trailer section
    // never reach the server; its own such trailers never reach the client.
    let text = http1(
        addr,
        "POST /trailers HTTP/1.1\r\nHost: app.test\r\nTE: trailers\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
         2\r\nhi\r\n0\r\nX-Forwarded-For: 6.6.6.6\r\nHost: evil.example\r\nContent-Length: 99\r\nX-Real-IP: 6.6.6.6\r\nAuthorization: Basic eA==\r\nX-Checksum: abc\r\n\r\n",
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("\r\nx-checksum=abc;\r\n"), "{text:?}");
    assert!(text.ends_with("0\r\ngrpc-status: 0\r\n\r\n"), "{text:?}");
    // From an HTTP/2 client.
    let client = h2c(addr).await;
    let mut c = client.ready().await.unwrap();
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/trailers"))
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (resp, mut body) = c.send_request(req, false).unwrap();
    body.send_data(Bytes::from_static(b"hi"), false).unwrap();
    let mut t = http::HeaderMap::new();
    for (n, v) in [
        ("x-forwarded-for", "6.6.6.6"),
        ("x-forwarded-host", "evil.example"),
        ("x-client-cert-subject", "CN=admin"),
        ("cookie", "session=1"),
        ("x-checksum", "abc"),
    ] {
        t.insert(n, v.parse().unwrap());
    }
    body.send_trailers(t).unwrap();
    let resp = tokio::time::timeout(T, resp).await.unwrap().unwrap();
    let mut rb = resp.into_body();
    let mut got = Vec::new();
    while let Some(d) = tokio::time::timeout(T, rb.data()).await.unwrap() {
        got.extend_from_slice(&d.unwrap());
    }
    assert_eq!(String::from_utf8_lossy(&got), "x-checksum=abc;");
    let trailers = tokio::time::timeout(T, rb.trailers())
        .await
        .unwrap()
        .unwrap()
        .expect("trailers");
    let names: Vec<&str> = trailers.keys().map(|n| n.as_str()).collect();
    assert_eq!(names, ["grpc-status"]);
}

#[tokio::test]
async fn goaway_leads_to_a_new_connection() {
    let up = H2Upstream::start(None);
    let p = proxy(up.addr, "");
    let client = h2c(p.addr("p").unwrap()).await;
    let got = send(&client, "GET", "/goaway", &[], None).await;
    assert_eq!(got.status, 200);
    assert_eq!(up.accepts(), 1);
    for _ in 0..3 {
        let got = send(&client, "GET", "/after", &[], None).await;
        assert_eq!(got.status, 200, "{}", got.body);
    }
    assert_eq!(up.accepts(), 2, "one new connection after the GOAWAY");
}

#[tokio::test]
async fn upstream_down_is_a_502() {
    let gone = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let p = proxy(gone, "");
    let addr = p.addr("p").unwrap();
    let client = h2c(addr).await;
    let got = send(&client, "GET", "/x", &[], None).await;
    assert_eq!(got.status, 502);
    let text = http1(
        addr,
        "GET /x HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 502"), "{text}");
}

/// A TLS (ALPN h2 only) [`H2Upstream`] for `upstream.test`, its CA file written under `dir`;
/// returns it and the group's `[upstreams.b.tls]` table.
fn tls_h2_upstream(dir: &std::path::Path) -> (H2Upstream, String) {
    std::fs::create_dir_all(dir).unwrap();
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let params = rcgen::CertificateParams::new(vec!["upstream.test".to_string()]).unwrap();
    let cert = params.self_signed(&key).unwrap();
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, cert.pem()).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
        )
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let up = H2Upstream::start(Some(Arc::new(config)));
    let table = format!(
        "[upstreams.b.tls]\nca_file = {:?}\nserver_name = \"upstream.test\"\n",
        ca.display().to_string()
    );
    (up, table)
}

#[tokio::test]
async fn tls_with_alpn_h2() {
    let dir = std::env::temp_dir().join(format!("portico-h2up-{}", std::process::id()));
    let (up, table) = tls_h2_upstream(&dir);
    let p = proxy(up.addr, &table);
    let addr = p.addr("p").unwrap();
    let client = h2c(addr).await;
    for _ in 0..3 {
        let got = send(&client, "GET", "/over-tls", &[], None).await;
        assert_eq!(got.status, 200);
        assert!(
            got.body.starts_with("GET /over-tls authority=app.test"),
            "{}",
            got.body
        );
    }
    let text = http1(
        addr,
        "GET /h1 HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(text.contains("GET /h1 authority=app.test"), "{text}");
    assert_eq!(up.accepts(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn large_bodies_both_ways_under_flow_control() {
    let up = H2Upstream::start(None);
    let p = proxy(up.addr, "");
    let addr = p.addr("p").unwrap();
    let upload = vec![b'u'; 1 << 20];
    let client = h2c(addr).await;
    let got = send(&client, "POST", "/big/1048576", &[], Some(&upload)).await;
    assert_eq!(got.status, 200);
    assert!(got.body.starts_with("got 1048576 bytes\n"));
    assert_eq!(got.body.len(), "got 1048576 bytes\n".len() + (1 << 20));

    let mut req = format!(
        "POST /big/1048576 HTTP/1.1\r\nHost: app.test\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        upload.len()
    )
    .into_bytes();
    req.extend_from_slice(&upload);
    let mut s = TcpStream::connect(addr).await.unwrap();
    let (mut r, mut w) = s.split();
    let (wrote, read) = tokio::join!(w.write_all(&req), async {
        let mut out = Vec::new();
        tokio::time::timeout(T, r.read_to_end(&mut out))
            .await
            .expect("response in time")
            .map(|_| out)
    });
    wrote.unwrap();
    let text = String::from_utf8(read.unwrap()).unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{}", &text[..100]);
    assert!(text.contains("got 1048576 bytes\n"));
    let xs = text.bytes().filter(|&b| b == b'x').count();
    assert_eq!(xs, 1 << 20);
    assert_eq!(up.accepts(), 1);
}

#[tokio::test]
async fn response_header_timeout_is_a_504() {
    let up = H2Upstream::start(None);
    let p = proxy(up.addr, "response_header_timeout = \"300ms\"");
    let client = h2c(p.addr("p").unwrap()).await;
    let got = send(&client, "GET", "/slow", &[], None).await;
    assert_eq!(got.status, 504);
    // A connection whose response timed out gets no new streams (it may have stopped answering):
    // the next request opens another one.
    let got = send(&client, "GET", "/fast", &[], None).await;
    assert_eq!(got.status, 200);
    assert_eq!(up.accepts(), 2);
}

#[tokio::test]
async fn bidirectional_stream_interleaves_messages() {
    let up = H2Upstream::start(None);
    let p = proxy(up.addr, "");
    let client = h2c(p.addr("p").unwrap()).await;
    let req = http::Request::builder()
        .method("POST")
        .uri("http://app.test/bidi")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let mut c = client.clone().ready().await.unwrap();
    let (resp, mut stream) = c.send_request(req, false).unwrap();
    stream
        .send_data(Bytes::from_static(b"ping1"), false)
        .unwrap();
    let resp = tokio::time::timeout(T, resp).await.expect("head").unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    // The first message comes back before the client has sent the second one.
    let d = tokio::time::timeout(T, body.data()).await.expect("echo 1");
    assert_eq!(d.unwrap().unwrap(), "ping1");
    stream
        .send_data(Bytes::from_static(b"ping2"), true)
        .unwrap();
    let d = tokio::time::timeout(T, body.data()).await.expect("echo 2");
    assert_eq!(d.unwrap().unwrap(), "ping2");
    assert!(tokio::time::timeout(T, body.data())
        .await
        .expect("end")
        .is_none());
    let trailers = tokio::time::timeout(T, body.trailers())
        .await
        .expect("trailers");
    assert_eq!(trailers.unwrap().expect("trailers")["grpc-status"], "0");
}

#[tokio::test]
async fn idle_connections_are_closed_after_idle_timeout() {
    let up = H2Upstream::start(None);
    let p = proxy(up.addr, "idle_timeout = \"300ms\"");
    let client = h2c(p.addr("p").unwrap()).await;
    let got = send(&client, "GET", "/x", &[], None).await;
    assert_eq!(got.status, 200);
    assert_eq!(up.closes.load(Ordering::SeqCst), 0);
    // The worker's sweeper closes it with no further request (polled, bounded by T).
    let deadline = std::time::Instant::now() + T;
    while up.closes.load(Ordering::SeqCst) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "idle connection not closed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let got = send(&client, "GET", "/y", &[], None).await;
    assert_eq!(got.status, 200);
    assert_eq!(up.accepts(), 2);
}

#[tokio::test]
async fn a_stream_reset_is_a_502_and_keeps_the_connection() {
    let up = H2Upstream::start(None);
    let p = proxy(up.addr, "");
    let client = h2c(p.addr("p").unwrap()).await;
    let got = send(&client, "GET", "/before", &[], None).await;
    assert_eq!(got.status, 200);
    // On the reused connection: not taken for a dead connection, so not sent again.
    let got = send(&client, "GET", "/reset", &[], None).await;
    assert_eq!(got.status, 502);
    let got = send(&client, "GET", "/after", &[], None).await;
    assert_eq!(got.status, 200);
    assert_eq!(
        up.accepts(),
        1,
        "a RST_STREAM does not retire the connection"
    );
}

/// How a [`failing_h2`] server fails every request.
#[derive(Clone, Copy)]
enum Fail {
    /// A `503` head.
    Status503,
    /// RST_STREAM REFUSED_STREAM (refused unprocessed, RFC 9113 8.7).
    Refuse,
    /// RST_STREAM INTERNAL_ERROR before any response byte.
    Reset,
}

/// An HTTP/2 server that fails every request as `how` says; returns its address and the
/// count of requests it saw.
fn failing_h2(how: Fail) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let counted = seen.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            while let Ok((tcp, _)) = listener.accept().await {
                let counted = counted.clone();
                tokio::spawn(async move {
                    let Ok(mut conn) = h2::server::handshake(tcp).await else {
                        return;
                    };
                    while let Some(Ok((_req, mut respond))) = conn.accept().await {
                        counted.fetch_add(1, Ordering::SeqCst);
                        match how {
                            Fail::Status503 => {
                                let resp = http::Response::builder().status(503).body(()).unwrap();
                                if let Ok(mut s) = respond.send_response(resp, false) {
                                    let _ = s.send_data(Bytes::from_static(b"down"), true);
                                }
                            }
                            Fail::Refuse => respond.send_reset(h2::Reason::REFUSED_STREAM),
                            Fail::Reset => respond.send_reset(h2::Reason::INTERNAL_ERROR),
                        }
                    }
                });
            }
        });
    });
    (addr, seen)
}

/// A proxy to an h2 group of `servers` (round robin) whose route has `retry`.
fn proxy_to(servers: &[SocketAddr], retry: &str) -> Running {
    let list = servers
        .iter()
        .map(|s| format!("\"{s}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let toml = format!(
        r#"
[[listeners]]
name = "p"
address = "127.0.0.1:0"
[[listeners.routes]]
proxy = "b"
{retry}
[upstreams.b]
servers = [{list}]
protocol = "h2"
connect_timeout = "2s"
"#
    );
    let cfg = portico_config::parse(&toml, "h2up-retry.toml").unwrap_or_else(|e| panic!("{e}"));
    start(cfg, 1).expect("start")
}

/// Requests from an HTTP/2 client and from HTTP/1.1 clients through a group of a good server and
/// a failing one: every one gets the good server's 200, the failing server saw some of them.
async fn all_succeed_through_retries(bad: SocketAddr, bad_seen: Option<&AtomicUsize>) {
    let good = H2Upstream::start(None);
    let retry = "retry = { retries = 1, on = [\"connect\", \"reset\", \"503\"] }";
    // The failing server first: round robin sends it the first request of each client kind.
    let p = proxy_to(&[bad, good.addr], retry);
    let addr = p.addr("p").unwrap();
    let client = h2c(addr).await;
    for i in 0..4 {
        let got = send(&client, "GET", &format!("/h2/{i}"), &[], None).await;
        assert_eq!(got.status, 200, "HTTP/2 client, request {i}: {}", got.body);
        assert!(
            got.body.starts_with(&format!("GET /h2/{i} ")),
            "{}",
            got.body
        );
    }
    for i in 0..4 {
        let text = http1(
            addr,
            &format!("GET /h1/{i} HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n"),
        )
        .await;
        assert!(
            text.starts_with("HTTP/1.1 200"),
            "HTTP/1.1 client, request {i}: {text}"
        );
        assert!(text.contains(&format!("GET /h1/{i} ")), "{text}");
    }
    let retries = p.stats().retries.load(Ordering::Relaxed);
    assert_eq!(
        retries, 4,
        "every other request went to the failing server first"
    );
    if let Some(seen) = bad_seen {
        assert!(seen.load(Ordering::SeqCst) >= 4);
    }
    // Without a retry policy the failing server's share fails.
    let p = proxy_to(&[bad, good.addr], "");
    let text = http1(
        p.addr("p").unwrap(),
        "GET /x HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(!text.starts_with("HTTP/1.1 200"), "{text}");
}

#[tokio::test]
async fn route_retry_skips_a_server_answering_503() {
    let (bad, seen) = failing_h2(Fail::Status503);
    all_succeed_through_retries(bad, Some(&seen)).await;
}

#[tokio::test]
async fn route_retry_skips_a_server_resetting_streams() {
    let (bad, seen) = failing_h2(Fail::Reset);
    all_succeed_through_retries(bad, Some(&seen)).await;
}

#[tokio::test]
async fn route_retry_skips_a_server_refusing_streams() {
    let (bad, seen) = failing_h2(Fail::Refuse);
    all_succeed_through_retries(bad, Some(&seen)).await;
}

#[tokio::test]
async fn route_retry_skips_a_server_that_is_down() {
    let gone = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    all_succeed_through_retries(gone, None).await;
}

#[tokio::test]
async fn requests_with_a_body_are_not_retried() {
    let (bad, seen) = failing_h2(Fail::Status503);
    let good = H2Upstream::start(None);
    let p = proxy_to(
        &[bad, good.addr],
        "retry = { retries = 1, non_idempotent = true }",
    );
    let text = http1(
        p.addr("p").unwrap(),
        "PUT /x HTTP/1.1\r\nHost: app.test\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert_eq!(seen.load(Ordering::SeqCst), 1);
    assert_eq!(p.stats().retries.load(Ordering::Relaxed), 0);
}

/// An HTTP/2-only server answering `/health` with `200 ok` (counted) while `up`, and closing
/// every new connection at once while not (down: the HTTP/2 handshake fails).
fn switchable_h2() -> (SocketAddr, Arc<AtomicBool>, Arc<AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let up = Arc::new(AtomicBool::new(true));
    let probes = Arc::new(AtomicUsize::new(0));
    let (is_up, counted) = (up.clone(), probes.clone());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            while let Ok((tcp, _)) = listener.accept().await {
                if !is_up.load(Ordering::SeqCst) {
                    drop(tcp);
                    continue;
                }
                let counted = counted.clone();
                tokio::spawn(async move {
                    let Ok(mut conn) = h2::server::handshake(tcp).await else {
                        return;
                    };
                    while let Some(Ok((req, mut respond))) = conn.accept().await {
                        let status = match req.uri().path() {
                            "/health" => {
                                counted.fetch_add(1, Ordering::SeqCst);
                                200
                            }
                            _ => 404,
                        };
                        let resp = http::Response::builder().status(status).body(()).unwrap();
                        if let Ok(mut s) = respond.send_response(resp, false) {
                            let _ = s.send_data(Bytes::from_static(b"all ok"), true);
                        }
                    }
                });
            }
        });
    });
    (addr, up, probes)
}

/// Poll `cond` (every 10 ms) until it holds; panic with `what` after [`T`].
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !cond() {
        assert!(start.elapsed() < T, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn http_health_checks_of_h2_groups_speak_http2() {
    let (addr, up, probes) = switchable_h2();
    let p = proxy(
        addr,
        r#"[upstreams.b.health_check]
path = "/health"
expect_body = "ok"
interval = "60ms"
timeout = "50ms"
rise = 2
fall = 2
"#,
    );
    let group = p.upstream("b").unwrap();
    let server = || group.status(std::time::Instant::now()).remove(0);
    let passed = |s: &portico_upstream::ServerStatus| {
        s.last_check
            .as_deref()
            .is_some_and(|c| c.starts_with("passed: HTTP/2 200, body matched"))
    };
    wait_for("an HTTP/2 probe that passes", || passed(&server()));
    assert!(probes.load(Ordering::SeqCst) >= 1);
    assert_eq!(server().health, portico_upstream::Health::Up);
    up.store(false, Ordering::SeqCst);
    wait_for("the server marked down", || {
        server().health == portico_upstream::Health::Down
    });
    let st = server();
    assert!(
        st.last_check
            .as_deref()
            .is_some_and(|c| c.starts_with("failed: HTTP/2")),
        "{:?}",
        st.last_check
    );
    up.store(true, Ordering::SeqCst);
    wait_for("the server back up", || {
        server().health == portico_upstream::Health::Up
    });
    assert!(passed(&server()));
    assert_eq!(server().health_transitions, 2);
}

#[test]
fn http_health_checks_of_tls_h2_groups_use_alpn_h2() {
    let dir = std::env::temp_dir().join(format!("portico-h2up-health-{}", std::process::id()));
    let (up, table) = tls_h2_upstream(&dir);
    let check =
        "[upstreams.b.health_check]\npath = \"/health\"\ninterval = \"60ms\"\ntimeout = \"50ms\"\n";
    let p = proxy(up.addr, &format!("{check}{table}"));
    let group = p.upstream("b").unwrap();
    wait_for("an HTTP/2 probe over TLS that passes", || {
        group.status(std::time::Instant::now())[0]
            .last_check
            .as_deref()
            .is_some_and(|c| c.starts_with("passed: HTTP/2 200"))
    });
    let _ = std::fs::remove_dir_all(&dir);
}
