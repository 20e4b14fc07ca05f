//! The response cache through real sockets: hits, variants, what is never stored, revalidation, the client's conditions and ranges, collapsed misses, stale answers when the upstream fails, invalidation, purges and counters, for HTTP/1.1 and HTTP/2 clients.

use crate::common::{h2c, start_toml, T};
use portico_proxy::Running;
use portico_testkit::{Captured, Client, Hold, Reply, Response, TestUpstream};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// A reply with `fields` and `body`.
fn reply(status: u16, fields: &[(&str, &str)], body: &str) -> Reply {
    Reply::Respond {
        status,
        headers: fields
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
        body: body.as_bytes().to_vec(),
        chunked: false,
    }
}

/// The upstream's answer by path; each body names how many requests the server saw so far,
/// so a cached answer is told apart from a fresh one.
fn answer(r: &Captured, n: usize) -> Reply {
    let body = format!("{} #{n}", r.target);
    let path = r.target.split('?').next().unwrap_or_default();
    match path {
        "/fresh" => reply(
            200,
            &[("Cache-Control", "max-age=60"), ("Cache-Tag", "t1 news")],
            &body,
        ),
        "/chunked" => Reply::Respond {
            status: 200,
            headers: vec![("Cache-Control".into(), "max-age=60".into())],
            body: body.into_bytes(),
            chunked: true,
        },
        "/vary" => reply(
            200,
            &[("Cache-Control", "max-age=60"), ("Vary", "Accept-Language")],
            &body,
        ),
        "/no-store" => reply(200, &[("Cache-Control", "no-store, max-age=60")], &body),
        "/private" => reply(200, &[("Cache-Control", "private, max-age=60")], &body),
        "/cookie" => reply(
            200,
            &[("Cache-Control", "max-age=60"), ("Set-Cookie", "a=b")],
            &body,
        ),
        "/plain" => reply(200, &[], &body),
        // 200 KB: kept in a file, sent from it.
        "/big" => reply(
            200,
            &[("Cache-Control", "max-age=60"), ("ETag", "\"big\"")],
            &big_body(n),
        ),
        // Stale on arrival (its Age is its lifetime), revalidated with its ETag.
        "/etag" => match r.header("if-none-match") {
            Some("\"v1\"") => reply(
                304,
                &[
                    ("ETag", "\"v1\""),
                    ("Cache-Control", "max-age=0"),
                    ("X-Seen", "304"),
                ],
                "",
            ),
            _ => reply(
                200,
                &[
                    ("ETag", "\"v1\""),
                    ("Cache-Control", "max-age=0"),
                    ("Content-Type", "text/plain"),
                ],
                &body,
            ),
        },
        // Fresh for a moment only; may answer for a minute when the upstream fails.
        "/fallback" => match n {
            1 => reply(
                200,
                &[
                    ("Cache-Control", "max-age=5, stale-if-error=60"),
                    ("Age", "5"),
                ],
                &body,
            ),
            _ => reply(503, &[], "down"),
        },
        "/strict" => match n {
            1 => reply(
                200,
                &[
                    (
                        "Cache-Control",
                        "max-age=5, must-revalidate, stale-if-error=60",
                    ),
                    ("Age", "5"),
                ],
                &body,
            ),
            _ => reply(503, &[], "down"),
        },
        "/range" => reply(
            200,
            &[("Cache-Control", "max-age=60"), ("ETag", "\"r\"")],
            "0123456789",
        ),
        // Stale on arrival, answered while a background fetch refreshes it.
        "/swr" => match (n, r.header("if-none-match")) {
            (1, _) => reply(
                200,
                &[
                    ("Cache-Control", "max-age=5, stale-while-revalidate=60"),
                    ("Age", "5"),
                    ("ETag", "\"s1\""),
                ],
                &body,
            ),
            (2, Some("\"s1\"")) => reply(
                200,
                &[("Cache-Control", "max-age=60"), ("ETag", "\"s2\"")],
                &body,
            ),
            _ => reply(500, &[], "unexpected"),
        },
        _ => reply(200, &[("Cache-Control", "max-age=60")], &body),
    }
}

/// The body of `/big` the `n`th time the server answers it.
fn big_body(n: usize) -> String {
    format!("{}#{n}", "0123456789".repeat(20_000))
}

/// An upstream answering with [`answer`], counting requests per path.
fn upstream() -> TestUpstream {
    let counts = Arc::new(std::sync::Mutex::new(std::collections::HashMap::<
        String,
        usize,
    >::new()));
    TestUpstream::start(move |r| {
        let path = r.target.split('?').next().unwrap_or_default().to_string();
        let n = {
            let mut c = counts.lock().unwrap();
            let e = c.entry(path).or_default();
            *e += 1;
            *e
        };
        answer(r, n)
    })
}

/// A proxy with a caching route to `up`; `store` goes into `[cache]`.
fn proxy(up: SocketAddr, store: &str) -> Running {
    proxy_with(up, store, "")
}

/// The same, with `route` (TOML tables) on the caching route. Objects up to 64 KiB are
/// stored unless `store` says otherwise.
fn proxy_with(up: SocketAddr, store: &str, route: &str) -> Running {
    let store = match store.contains("max_object") {
        true => store.to_string(),
        false => format!("max_object = \"64KiB\"\n{store}"),
    };
    start_toml(
        &format!(
            r#"
[admin]
address = "127.0.0.1:0"

[cache]
memory = "8MiB"
tag_header = "cache-tag"
{store}

[[listeners]]
name = "p"
address = "127.0.0.1:0"

[[listeners.routes]]
path = "/nocache/**"
proxy = "b"

[[listeners.routes]]
proxy = "b"
[listeners.routes.cache]
key_headers = ["x-tenant"]
bypass_headers = ["x-debug"]
{route}

[upstreams.b]
servers = ["{up}"]
"#
        ),
        2,
    )
}

fn get(c: &mut Client, path: &str, extra: &str) -> Response {
    c.request(format!("GET {path} HTTP/1.1\r\nHost: a.test\r\n{extra}\r\n").as_bytes())
        .unwrap()
}

fn seen(up: &TestUpstream, path: &str) -> usize {
    up.requests()
        .iter()
        .filter(|r| r.target.split('?').next() == Some(path))
        .count()
}

/// One admin request: (status, body).
fn admin(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let body = out.split_once("\r\n\r\n").unwrap().1.to_string();
    (out[9..12].parse().unwrap(), body)
}

fn cache_json(p: &Running) -> serde_json::Value {
    let (status, body) = admin(p.admin_addr().unwrap(), "GET", "/api/cache");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[test]
fn a_fresh_response_answers_again_with_its_age_and_status() {
    let up = upstream();
    let p = proxy(up.addr, "");
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    let first = get(&mut c, "/fresh", "");
    assert_eq!(first.text(), "/fresh #1");
    assert_eq!(
        first.header("cache-status"),
        Some("portico; fwd=miss; stored")
    );
    for path in ["/fresh", "/chunked"] {
        let _ = get(&mut c, path, "");
        let again = get(&mut c, path, "");
        assert_eq!(again.status, 200);
        assert_eq!(again.text(), format!("{path} #1"));
        assert_eq!(again.header("cache-status"), Some("portico; hit"));
        assert!(again
            .header("age")
            .is_some_and(|a| a.parse::<u64>().unwrap() < 5));
        // A stored chunked body goes out with its length.
        assert_eq!(
            again.header("content-length"),
            Some(&*format!("{}", again.body.len()))
        );
        assert_eq!(seen(&up, path), 1, "{path}");
    }
    // A HEAD is answered from the stored GET: the length and no body.
    c.send(b"HEAD /fresh HTTP/1.1\r\nHost: a.test\r\n\r\n")
        .unwrap();
    let h = c.read_response(true).unwrap();
    assert_eq!((h.status, h.header("content-length")), (200, Some("9")));
    assert_eq!(seen(&up, "/fresh"), 1);
    // The same path on a route without a cache, another host and another query are misses.
    assert_eq!(
        get(&mut c, "/nocache/fresh", "").header("cache-status"),
        None
    );
    let other = c
        .request(b"GET /fresh HTTP/1.1\r\nHost: b.test\r\n\r\n")
        .unwrap();
    assert_eq!(other.text(), "/fresh #2");
    assert_eq!(get(&mut c, "/fresh?x=1", "").text(), "/fresh?x=1 #3");
    let j = cache_json(&p);
    assert_eq!(j["requests"]["hit"], 4, "{j}");
    assert_eq!(j["requests"]["miss"], 4, "{j}");
    assert!(
        j["entries"].as_u64().unwrap() >= 1 && j["bytes"].as_u64().unwrap() > 0,
        "{j}"
    );
}

#[test]
fn variants_by_vary_and_the_routes_key_fields() {
    let up = upstream();
    let p = proxy(up.addr, "");
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    let en = "Accept-Language: en\r\n";
    let fr = "Accept-Language: fr\r\n";
    assert_eq!(get(&mut c, "/vary", en).text(), "/vary #1");
    assert_eq!(get(&mut c, "/vary", fr).text(), "/vary #2");
    assert_eq!(get(&mut c, "/vary", en).text(), "/vary #1");
    assert_eq!(get(&mut c, "/vary", fr).text(), "/vary #2");
    // key_headers: each tenant its own copy.
    assert_eq!(get(&mut c, "/t", "X-Tenant: a\r\n").text(), "/t #1");
    assert_eq!(get(&mut c, "/t", "X-Tenant: b\r\n").text(), "/t #2");
    assert_eq!(get(&mut c, "/t", "X-Tenant: a\r\n").text(), "/t #1");
    assert_eq!(get(&mut c, "/t", "").text(), "/t #3");
}

#[test]
fn what_is_never_stored_or_looked_up() {
    let up = upstream();
    let p = proxy(up.addr, "");
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    for path in ["/no-store", "/private", "/cookie", "/plain"] {
        assert_eq!(get(&mut c, path, "").text(), format!("{path} #1"));
        let again = get(&mut c, path, "");
        assert_eq!(again.text(), format!("{path} #2"), "{path}");
        assert_eq!(again.header("cache-status"), Some("portico; fwd=miss"));
    }
    // Credentials: stored only when the response says a shared cache may.
    let auth = "Authorization: Bearer x\r\n";
    assert_eq!(get(&mut c, "/authed", auth).text(), "/authed #1");
    assert_eq!(get(&mut c, "/authed", auth).text(), "/authed #2");
    // A bypass field skips the cache both ways.
    assert_eq!(get(&mut c, "/skip", "X-Debug: 1\r\n").text(), "/skip #1");
    assert_eq!(get(&mut c, "/skip", "").text(), "/skip #2");
    let bypassed = get(&mut c, "/skip", "X-Debug: 1\r\n");
    assert_eq!(bypassed.text(), "/skip #3");
    assert_eq!(get(&mut c, "/skip", "").text(), "/skip #2");
    let j = cache_json(&p);
    assert_eq!(j["requests"]["bypass"], 2, "{j}");
}

#[test]
fn objects_over_max_object_pass_uncached() {
    let body = "x".repeat(100_000);
    let b2 = body.clone();
    let up = TestUpstream::start(move |_| reply(200, &[("Cache-Control", "max-age=60")], &b2));
    let p = proxy(up.addr, "");
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    for _ in 0..2 {
        let r = get(&mut c, "/large", "");
        assert_eq!(r.body.len(), body.len());
    }
    assert_eq!(up.requests().len(), 2);
}

#[test]
fn a_stale_response_is_revalidated_with_its_etag() {
    let up = upstream();
    let p = proxy(up.addr, "");
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    // Nothing stored yet: the client's own condition goes to the server and its 304 comes
    // back (not stored).
    let conditional = get(&mut c, "/etag", "If-None-Match: \"v1\"\r\n");
    assert_eq!(conditional.status, 304);
    assert_eq!(up.requests()[0].header("if-none-match"), Some("\"v1\""));
    let first = get(&mut c, "/etag", "");
    assert_eq!((first.status, first.text()), (200, "/etag #2".to_string()));
    let second = get(&mut c, "/etag", "");
    assert_eq!(
        (second.status, second.text()),
        (200, "/etag #2".to_string())
    );
    assert_eq!(
        second.header("cache-status"),
        Some("portico; fwd=stale; fwd-status=304")
    );
    // The 304's fields replace the stored ones; the stored ones it lacks stay.
    assert_eq!(second.header("x-seen"), Some("304"));
    assert_eq!(second.header("content-type"), Some("text/plain"));
    let asked = up.requests();
    assert_eq!(asked.len(), 3);
    assert_eq!(asked[1].header("if-none-match"), None);
    assert_eq!(asked[2].header("if-none-match"), Some("\"v1\""));
    assert_eq!(cache_json(&p)["requests"]["revalidated"], 1);
}

#[test]
fn the_clients_conditions_and_ranges_are_answered_from_the_cache() {
    let up = upstream();
    let p = proxy(up.addr, "");
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    assert_eq!(get(&mut c, "/range", "").text(), "0123456789");
    let r = get(&mut c, "/range", "Range: bytes=2-4\r\n");
    assert_eq!((r.status, r.text()), (206, "234".to_string()));
    assert_eq!(r.header("content-range"), Some("bytes 2-4/10"));
    let r = get(&mut c, "/range", "Range: bytes=-3\r\n");
    assert_eq!(r.text(), "789");
    // If-Range with another validator: the whole body.
    let r = get(
        &mut c,
        "/range",
        "Range: bytes=2-4\r\nIf-Range: \"other\"\r\n",
    );
    assert_eq!((r.status, r.body.len()), (200, 10));
    let r = get(&mut c, "/range", "Range: bytes=20-\r\n");
    assert_eq!(
        (r.status, r.header("content-range")),
        (416, Some("bytes */10"))
    );
    let r = get(&mut c, "/range", "If-None-Match: W/\"r\"\r\n");
    assert_eq!((r.status, r.header("etag")), (304, Some("\"r\"")));
    assert!(r.body.is_empty());
    assert_eq!(seen(&up, "/range"), 1);
}

#[test]
fn a_stale_response_answers_when_the_upstream_fails_unless_it_forbids_it() {
    let up = upstream();
    let p = proxy(up.addr, "");
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    assert_eq!(get(&mut c, "/fallback", "").text(), "/fallback #1");
    let r = get(&mut c, "/fallback", "");
    assert_eq!((r.status, r.text()), (200, "/fallback #1".to_string()));
    assert_eq!(
        r.header("cache-status"),
        Some("portico; fwd=stale; detail=stale-if-error")
    );
    assert_eq!(seen(&up, "/fallback"), 2);
    // must-revalidate: the error goes through.
    assert_eq!(get(&mut c, "/strict", "").status, 200);
    assert_eq!(get(&mut c, "/strict", "").status, 503);
    assert_eq!(cache_json(&p)["requests"]["stale"], 1);
}

#[test]
fn a_stale_response_answers_when_no_server_is_up() {
    // The server is stopped after the first answer: the group has nobody left to ask.
    let up = portico_testkit::StoppableUpstream::start(|_| {
        reply(
            200,
            &[
                ("Cache-Control", "max-age=1, stale-if-error=60"),
                ("Age", "1"),
            ],
            "kept",
        )
    });
    let p = proxy(up.addr, "");
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    assert_eq!(get(&mut c, "/x", "").text(), "kept");
    up.stop();
    let r = get(&mut c, "/x", "");
    assert_eq!((r.status, r.text()), (200, "kept".to_string()));
    assert_eq!(
        r.header("cache-status"),
        Some("portico; fwd=stale; detail=stale-if-error")
    );
}

#[test]
fn concurrent_misses_reach_the_upstream_once() {
    let hold = Hold::new();
    let h = hold.clone();
    let fetched = Arc::new(AtomicUsize::new(0));
    let f = fetched.clone();
    let up = TestUpstream::start(move |_| {
        let n = f.fetch_add(1, Ordering::SeqCst) + 1;
        h.wait();
        reply(200, &[("Cache-Control", "max-age=60")], &format!("#{n}"))
    });
    let p = proxy(up.addr, "");
    let addr = p.addr("p").unwrap();
    let client = move || {
        std::thread::spawn(move || {
            let mut c = Client::connect(addr).unwrap();
            let r = get(&mut c, "/hot", "");
            (r.text(), r.header("cache-status").map(str::to_string))
        })
    };
    let first = client();
    assert!(hold.wait_held(1));
    let others: Vec<_> = (0..4).map(|_| client()).collect();
    let deadline = Instant::now() + T;
    while cache_json(&p)["waiting"] != 4 {
        assert!(Instant::now() < deadline, "the other requests never waited");
        std::thread::yield_now();
    }
    hold.open();
    assert_eq!(first.join().unwrap().0, "#1");
    for o in others {
        let (text, status) = o.join().unwrap();
        assert_eq!(text, "#1");
        assert_eq!(status.as_deref(), Some("portico; hit; detail=collapsed"));
    }
    assert_eq!(fetched.load(Ordering::SeqCst), 1);
    assert_eq!(cache_json(&p)["requests"]["collapsed"], 4);
}

#[test]
fn unsafe_requests_invalidate_and_purges_remove() {
    let up = upstream();
    let p = proxy(up.addr, "");
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    assert_eq!(get(&mut c, "/doc", "").text(), "/doc #1");
    assert_eq!(get(&mut c, "/doc", "").text(), "/doc #1");
    let post = c
        .request(b"POST /doc HTTP/1.1\r\nHost: a.test\r\nContent-Length: 1\r\n\r\nx")
        .unwrap();
    assert_eq!(post.status, 200);
    assert_eq!(get(&mut c, "/doc", "").text(), "/doc #3");
    // Purges: by URL, by prefix, by tag, everything.
    let a = p.admin_addr().unwrap();
    for path in ["/fresh", "/news/1", "/news/2", "/other"] {
        let _ = get(&mut c, path, "");
    }
    let (status, body) = admin(a, "DELETE", "/api/cache?url=a.test/other");
    assert_eq!(status, 200);
    let purged: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(purged["purged"], "url a.test/other");
    assert_eq!(purged["found"], true);
    assert_eq!(get(&mut c, "/other", "").text(), "/other #2");
    assert_eq!(admin(a, "DELETE", "/api/cache?prefix=a.test/news/").0, 200);
    assert_eq!(get(&mut c, "/news/1", "").text(), "/news/1 #2");
    assert_eq!(get(&mut c, "/fresh", "").text(), "/fresh #1");
    assert_eq!(admin(a, "DELETE", "/api/cache?tag=news").0, 200);
    assert_eq!(get(&mut c, "/fresh", "").text(), "/fresh #2");
    assert_eq!(admin(a, "DELETE", "/api/cache").0, 200);
    assert_eq!(get(&mut c, "/fresh", "").text(), "/fresh #3");
    assert_eq!(admin(a, "DELETE", "/api/cache?color=red").0, 400);
    let (status, text) = admin(a, "GET", "/metrics");
    assert_eq!(status, 200);
    assert!(
        text.contains("portico_cache_requests_total{status=\"hit\"}"),
        "{text}"
    );
    assert!(text.contains("portico_cache_invalidated_total 1"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_clients_share_the_cache() {
    let up = upstream();
    let p = proxy(up.addr, "");
    let addr = p.addr("p").unwrap();
    let mut c = tokio::task::spawn_blocking(move || {
        let mut c = Client::connect(addr).unwrap();
        let _ = get(&mut c, "/shared", "");
        c
    })
    .await
    .unwrap();
    let client = h2c(addr).await;
    let mut sr = client.clone().ready().await.unwrap();
    let req = http::Request::get("http://a.test/shared").body(()).unwrap();
    let (resp, _) = sr.send_request(req, true).unwrap();
    let resp = tokio::time::timeout(T, resp).await.unwrap().unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["cache-status"], "portico; hit");
    let mut body = resp.into_body();
    let mut got = Vec::new();
    while let Some(d) = body.data().await {
        got.extend_from_slice(&d.unwrap());
    }
    assert_eq!(got, b"/shared #1");
    // And the other way: stored from HTTP/2, answered to HTTP/1.1.
    let req = http::Request::get("http://a.test/from-h2")
        .body(())
        .unwrap();
    let (resp, _) = sr.send_request(req, true).unwrap();
    let resp = tokio::time::timeout(T, resp).await.unwrap().unwrap();
    let mut body = resp.into_body();
    while let Some(d) = body.data().await {
        d.unwrap();
    }
    let r = tokio::task::spawn_blocking(move || get(&mut c, "/from-h2", ""))
        .await
        .unwrap();
    assert_eq!(r.text(), "/from-h2 #1");
    assert_eq!(r.header("cache-status"), Some("portico; hit"));
}

#[test]
fn a_stale_response_answers_while_one_background_fetch_refreshes_it() {
    // The refresh waits in the upstream until the stale answers are checked.
    let hold = Hold::new();
    let h = hold.clone();
    let counts = Arc::new(AtomicUsize::new(0));
    let up = TestUpstream::start(move |r| {
        let n = counts.fetch_add(1, Ordering::SeqCst) + 1;
        if n > 1 {
            h.wait();
        }
        answer(r, n)
    });
    let p = proxy(up.addr, "");
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    assert_eq!(get(&mut c, "/swr", "").text(), "/swr #1");
    // Stale: answered at once, and one refresh goes out with the stored validator.
    for _ in 0..3 {
        let r = get(&mut c, "/swr", "");
        assert_eq!(r.text(), "/swr #1");
        let status = r.header("cache-status");
        assert_eq!(status, Some("portico; hit; detail=stale-while-revalidate"));
    }
    assert!(hold.wait_held(1));
    hold.open();
    let deadline = Instant::now() + T;
    while cache_json(&p)["refreshed"] != 1 {
        assert!(
            Instant::now() < deadline,
            "the refresh never stored: {}",
            cache_json(&p)
        );
        std::thread::yield_now();
    }
    let r = get(&mut c, "/swr", "");
    assert_eq!(r.text(), "/swr #2");
    assert_eq!(r.header("cache-status"), Some("portico; hit"));
    let asked = up.requests();
    assert_eq!(asked.len(), 2, "one refresh for all the stale answers");
    assert_eq!(asked[1].header("if-none-match"), Some("\"s1\""));
    assert_eq!(cache_json(&p)["requests"]["updating"], 3);
}

/// A raw upstream: answers every request with `head` and `first`, then waits for `hold`
/// before `rest` and the close.
fn streaming_upstream(
    head: &'static str,
    first: &'static str,
    rest: &'static str,
    hold: Hold,
) -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let hold = hold.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = s.write_all(head.as_bytes());
                let _ = s.write_all(first.as_bytes());
                hold.wait();
                let _ = s.write_all(rest.as_bytes());
            });
        }
    });
    a
}

#[test]
fn a_response_that_is_not_stored_lets_the_waiting_requests_go_at_its_head() {
    let hold = Hold::new();
    let up = streaming_upstream(
        "HTTP/1.1 200 OK\r\nCache-Control: no-store\r\nTransfer-Encoding: chunked\r\n\r\n",
        "5\r\nfirst\r\n",
        "4\r\nrest\r\n0\r\n\r\n",
        hold.clone(),
    );
    let p = proxy(up, "lock_timeout = \"60s\"");
    let addr = p.addr("p").unwrap();
    let streams: Vec<_> = (0..2)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = Client::connect(addr).unwrap();
                get(&mut c, "/events", "").text()
            })
        })
        .collect();
    // Both reach the server while the first response still streams: nobody waits for it.
    assert!(
        hold.wait_held(2),
        "the second request waited for an unstorable response"
    );
    hold.open();
    for s in streams {
        assert_eq!(s.join().unwrap(), "firstrest");
    }
}

#[test]
fn upgrades_skip_the_cache() {
    let hold = Hold::new();
    let up = streaming_upstream(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n",
        "",
        "",
        hold.clone(),
    );
    let p = proxy(up, "lock_timeout = \"60s\"");
    let addr = p.addr("p").unwrap();
    let ws = "GET /ws HTTP/1.1\r\nHost: a.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
    let mut tunnels = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        s.write_all(ws.as_bytes()).unwrap();
        let mut b = [0u8; 512];
        let n = s.read(&mut b).unwrap();
        assert!(
            b[..n].starts_with(b"HTTP/1.1 101"),
            "{}",
            String::from_utf8_lossy(&b[..n])
        );
        tunnels.push(s);
    }
    assert!(hold.wait_held(2));
    hold.open();
    assert_eq!(cache_json(&p)["requests"]["bypass"], 2);
}

#[test]
fn routes_schemes_and_listeners_never_share_stored_responses() {
    let public = TestUpstream::start(|_| reply(200, &[("Cache-Control", "max-age=60")], "public"));
    let internal =
        TestUpstream::start(|_| reply(200, &[("Cache-Control", "max-age=60")], "internal"));
    let p = start_toml(
        &format!(
            r#"
[[listeners]]
name = "internal"
address = "127.0.0.1:0"
[[listeners.routes]]
proxy = "internal"
cache = {{}}

[[listeners]]
name = "public"
address = "127.0.0.1:0"
[[listeners.routes]]
proxy = "public"
cache = {{}}

[upstreams.internal]
servers = ["{}"]
[upstreams.public]
servers = ["{}"]
"#,
            internal.addr, public.addr
        ),
        2,
    );
    let mut c = Client::connect(p.addr("internal").unwrap()).unwrap();
    assert_eq!(get(&mut c, "/x", "").text(), "internal");
    let mut c = Client::connect(p.addr("public").unwrap()).unwrap();
    assert_eq!(get(&mut c, "/x", "").text(), "public");
    assert_eq!(
        get(&mut c, "/x", "").header("cache-status"),
        Some("portico; hit")
    );
}

#[test]
fn a_response_varying_on_a_field_the_route_sets_is_not_stored() {
    let up = TestUpstream::start(|r| {
        let v = r.header("x-country").unwrap_or("none").to_string();
        reply(
            200,
            &[("Cache-Control", "max-age=60"), ("Vary", "X-Country")],
            &v,
        )
    });
    let p = proxy_with(
        up.addr,
        "",
        r#"[listeners.routes.request_headers]
set = { "x-country" = "{cookie.country}" }"#,
    );
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    assert_eq!(get(&mut c, "/v", "Cookie: country=fr\r\n").text(), "fr");
    assert_eq!(get(&mut c, "/v", "Cookie: country=de\r\n").text(), "de");
    assert_eq!(get(&mut c, "/v", "Cookie: country=fr\r\n").text(), "fr");
    assert_eq!(up.requests().len(), 3);
}

#[test]
fn numbers_past_their_range_neither_panic_nor_break_the_url() {
    let up = TestUpstream::start(|r| {
        let cc = match r.target.as_str() {
            "/sie" => "max-age=60, stale-if-error=18446744073709551615",
            _ => "max-age=18446744073709551615",
        };
        reply(
            200,
            &[("Cache-Control", cc), ("ETag", "\"x\"")],
            "0123456789",
        )
    });
    let p = proxy(up.addr, "");
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    for path in ["/sie", "/max"] {
        assert_eq!(get(&mut c, path, "").text(), "0123456789");
        let again = get(&mut c, path, "");
        assert_eq!(again.header("cache-status"), Some("portico; hit"), "{path}");
    }
    let r = get(&mut c, "/max", "Range: bytes=0-18446744073709551615\r\n");
    assert_eq!((r.status, r.text()), (206, "0123456789".to_string()));
    assert_eq!(up.requests().len(), 2);
}

#[test]
fn a_304_for_another_etag_does_not_relabel_the_stored_body() {
    let up = TestUpstream::start(|r| match r.header("if-none-match") {
        Some(_) => reply(
            304,
            &[("ETag", "\"v2\""), ("Cache-Control", "max-age=60")],
            "",
        ),
        None => reply(
            200,
            &[("ETag", "\"v1\""), ("Cache-Control", "max-age=0")],
            "old",
        ),
    });
    let p = proxy(up.addr, "");
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    assert_eq!(get(&mut c, "/e", "").text(), "old");
    // Answered once as it was stored (its own ETag), then gone: the next one fetches.
    let r = get(&mut c, "/e", "");
    assert_eq!(
        (r.text().as_str(), r.header("etag")),
        ("old", Some("\"v1\""))
    );
    let r = get(&mut c, "/e", "");
    assert_eq!(r.header("cache-status"), Some("portico; fwd=miss; stored"));
}

#[test]
fn a_close_delimited_body_is_not_stored() {
    let hold = Hold::new();
    hold.open();
    let up = streaming_upstream(
        "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nConnection: close\r\n\r\n",
        "whole?",
        "",
        hold,
    );
    let p = proxy(up, "");
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    let r = get(&mut c, "/c", "");
    assert_eq!(r.header("cache-status"), Some("portico; fwd=miss"));
}

/// Poll until `f` holds, failing the test after [`T`].
fn wait_for(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + T;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_are_answered_from_their_files_whole_in_ranges_and_over_http2() {
    let up = upstream();
    let p = proxy(up.addr, "max_object = \"1MiB\"");
    let addr = p.addr("p").unwrap();
    let big = big_body(1);
    let b = big.clone();
    let mut c = tokio::task::spawn_blocking(move || {
        let mut c = Client::connect(addr).unwrap();
        let first = get(&mut c, "/big", "");
        assert_eq!(first.text(), b);
        assert_eq!(
            first.header("cache-status"),
            Some("portico; fwd=miss; stored")
        );
        // Hits on plain HTTP/1.1 go out by sendfile: whole, a range, a HEAD, on one connection.
        for _ in 0..2 {
            let hit = get(&mut c, "/big", "");
            assert_eq!(hit.header("cache-status"), Some("portico; hit"));
            assert_eq!(hit.text(), b);
        }
        let part = get(&mut c, "/big", "Range: bytes=65530-131099\r\n");
        assert_eq!(part.status, 206);
        assert_eq!(part.text(), &b[65530..131100]);
        let head = c
            .request(b"HEAD /big HTTP/1.1\r\nHost: a.test\r\n\r\n")
            .unwrap();
        assert_eq!(head.header("content-length"), Some("200002"));
        let tail = get(&mut c, "/big", "Range: bytes=-2\r\n");
        assert_eq!(tail.text(), "#1");
        c
    })
    .await
    .unwrap();
    // An HTTP/2 client gets it read from the file in pieces.
    let client = h2c(addr).await;
    let mut sr = client.clone().ready().await.unwrap();
    let req = http::Request::get("http://a.test/big").body(()).unwrap();
    let (resp, _) = sr.send_request(req, true).unwrap();
    let resp = tokio::time::timeout(T, resp).await.unwrap().unwrap();
    assert_eq!(resp.headers()["cache-status"], "portico; hit");
    let mut body = resp.into_body();
    let mut got = Vec::new();
    while let Some(d) = body.data().await {
        let d = d.unwrap();
        got.extend_from_slice(&d);
        let _ = body.flow_control().release_capacity(d.len());
    }
    assert_eq!(got, big.as_bytes());
    let r = tokio::task::spawn_blocking(move || get(&mut c, "/big", ""))
        .await
        .unwrap();
    assert_eq!(r.text(), big);
    assert_eq!(seen(&up, "/big"), 1);
    let json = cache_json(&p);
    assert_eq!(json["hit_bytes"], 4 * 200_002 + 65_570 + 2);
    assert!(json["disk"].is_null());
}

#[test]
fn the_disk_tier_answers_after_a_restart_and_purges_reach_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!(
        "max_object = \"1MiB\"\ndisk_path = \"{}\"\ndisk_size = \"16MiB\"",
        dir.path().display()
    );
    let up = upstream();
    let disk = |p: &Running| cache_json(p)["disk"].clone();
    {
        let p = proxy(up.addr, &store);
        let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
        assert_eq!(get(&mut c, "/fresh", "").text(), "/fresh #1");
        assert_eq!(get(&mut c, "/big", "").text(), big_body(1));
        assert_eq!(get(&mut c, "/etag", "").text(), "/etag #1");
        wait_for("three files written", || disk(&p)["writes"] == 3);
        assert_eq!(disk(&p)["entries"], 3);
    }
    // A new process on the same directory: the files are found and answer without the upstream.
    let p = proxy(up.addr, &store);
    wait_for("three files found", || disk(&p)["entries"] == 3);
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    let fresh = get(&mut c, "/fresh", "");
    assert_eq!(fresh.text(), "/fresh #1");
    assert_eq!(fresh.header("cache-status"), Some("portico; hit"));
    let age: u64 = fresh.header("age").unwrap().parse().unwrap();
    assert!(age < 60, "{age}");
    let big = get(&mut c, "/big", "");
    assert_eq!(big.text(), big_body(1));
    assert_eq!(big.header("cache-status"), Some("portico; hit"));
    // Read back from disk, a stale response still revalidates with its ETag.
    let etag = get(&mut c, "/etag", "");
    assert_eq!(etag.text(), "/etag #1");
    assert_eq!(etag.header("x-seen"), Some("304"));
    assert_eq!((seen(&up, "/fresh"), seen(&up, "/big")), (1, 1));
    assert_eq!(disk(&p)["reads"], 3);
    // A purge by tag removes the file too: the next process does not find it.
    let (status, _) = admin(p.admin_addr().unwrap(), "DELETE", "/api/cache?tag=news");
    assert_eq!(status, 200);
    wait_for("the purged file gone", || disk(&p)["entries"] == 2);
    // An invalidation just before a graceful stop: its file is deleted before the process goes.
    let post = c
        .request(b"POST /etag HTTP/1.1\r\nHost: a.test\r\nContent-Length: 0\r\n\r\n")
        .unwrap();
    assert_eq!(post.status, 200);
    drop(c);
    p.shutdown();
    p.wait();
    let p = proxy(up.addr, &store);
    wait_for("one file found", || disk(&p)["entries"] == 1);
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    assert_eq!(get(&mut c, "/fresh", "").text(), "/fresh #2");
    let big = get(&mut c, "/big", "");
    assert_eq!(big.header("cache-status"), Some("portico; hit"));
    let etag = get(&mut c, "/etag", "");
    assert_eq!(
        etag.header("cache-status"),
        Some("portico; fwd=miss; stored")
    );
}
