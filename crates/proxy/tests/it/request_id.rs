//! Request ids: generated or the client's, forwarded upstream, returned to the client on proxied and local answers, and in the access log, for HTTP/1.1 and HTTP/2 clients.

use crate::common::{h2_get, h2c, start_toml};
use portico_proxy::Running;
use portico_testkit::{Client, Reply, TestUpstream};

fn proxy(up: &TestUpstream, log: &std::path::Path, from_client: bool) -> Running {
    start_toml(
        &format!(
            r#"
access_log = {{ path = "{}", format = "json" }}

[request_id]
from_client = {from_client}
response = true

[[listeners]]
name = "p"
address = "127.0.0.1:0"

[[listeners.routes]]
name = "api"
path = "/api/**"
proxy = "b"

[[listeners.routes]]
name = "teapot"
path = "/local"
respond = {{ status = 418, body = "no" }}

[[listeners.routes]]
name = "origin"
path = "/bytes/**"
origin = true

[upstreams.b]
servers = ["{}"]
"#,
            log.display(),
            up.addr
        ),
        1,
    )
}

fn is_generated(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

fn log_lines(p: Running, path: &std::path::Path) -> Vec<serde_json::Value> {
    p.shutdown();
    p.wait();
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).expect(l))
        .collect()
}

#[test]
fn http1_requests_get_one_id_upstream_in_the_answer_and_in_the_log() {
    let dir = std::env::temp_dir().join(format!("portico-rid1-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("access.log");
    let _ = std::fs::remove_file(&log);
    // The server echoes an id of its own: the client sees Portico's, not the server's.
    let up = TestUpstream::start(|_| Reply::Respond {
        status: 200,
        headers: vec![("X-Request-Id".into(), "server-made".into())],
        body: b"hi".to_vec(),
        chunked: false,
    });
    let p = proxy(&up, &log, true);
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();

    // Generated: 32 hex digits, the same upstream and back.
    let r = c
        .request(b"GET /api/a HTTP/1.1\r\nHost: h\r\n\r\n")
        .unwrap();
    let id = r.header("x-request-id").unwrap().to_string();
    assert!(is_generated(&id), "{id}");
    let seen = up.requests().pop().unwrap();
    assert_eq!(seen.header("x-request-id"), Some(id.as_str()));
    assert_eq!(seen.header_count("x-request-id"), 1);

    // The client's own id is kept when well formed...
    let r = c
        .request(b"GET /api/b HTTP/1.1\r\nHost: h\r\nX-Request-Id: trace-42\r\n\r\n")
        .unwrap();
    assert_eq!(r.header("x-request-id"), Some("trace-42"));
    assert_eq!(
        up.requests().pop().unwrap().header("x-request-id"),
        Some("trace-42")
    );
    // ...and replaced, upstream too, when not.
    let r = c
        .request(b"GET /api/c HTTP/1.1\r\nHost: h\r\nX-Request-Id: has space\r\n\r\n")
        .unwrap();
    let replaced = r.header("x-request-id").unwrap();
    assert!(is_generated(replaced), "{replaced}");
    let seen = up.requests().pop().unwrap();
    assert_eq!(seen.header("x-request-id"), Some(replaced));
    assert_eq!(seen.header_count("x-request-id"), 1);

    // Local answers carry it too: a respond route, the origin, an error.
    let r = c
        .request(b"GET /local HTTP/1.1\r\nHost: h\r\n\r\n")
        .unwrap();
    assert_eq!(r.status, 418);
    let local = r.header("x-request-id").unwrap().to_string();
    assert!(is_generated(&local));
    let r = c
        .request(b"GET /bytes/10 HTTP/1.1\r\nHost: h\r\n\r\n")
        .unwrap();
    assert!(is_generated(r.header("x-request-id").unwrap()));
    let r = c
        .request(b"GET /nowhere HTTP/1.1\r\nHost: h\r\n\r\n")
        .unwrap();
    assert_eq!(r.status, 404);
    assert!(is_generated(r.header("x-request-id").unwrap()));

    let lines = log_lines(p, &log);
    let line = |target: &str| {
        lines
            .iter()
            .find(|l| l["target"] == target)
            .unwrap_or_else(|| panic!("{target}: {lines:?}"))
    };
    assert_eq!(line("/api/a")["request_id"], id.as_str());
    assert_eq!(line("/api/a")["route"], "api");
    assert_eq!(line("/api/a")["listener"], "p");
    assert_eq!(line("/api/b")["request_id"], "trace-42");
    assert_eq!(line("/local")["request_id"], local.as_str());
    assert_eq!(line("/local")["route"], "teapot");
    assert!(line("/nowhere").get("route").is_none());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_id_the_client_may_not_choose_is_replaced_upstream() {
    let dir = std::env::temp_dir().join(format!("portico-rid2-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("access.log");
    let _ = std::fs::remove_file(&log);
    let up = TestUpstream::start(|_| Reply::ok("hi"));
    let p = proxy(&up, &log, false);
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    let r = c
        .request(b"GET /api/a HTTP/1.1\r\nHost: h\r\nX-Request-Id: chosen\r\n\r\n")
        .unwrap();
    let id = r.header("x-request-id").unwrap().to_string();
    assert!(is_generated(&id), "{id}");
    let seen = up.requests().pop().unwrap();
    assert_eq!(seen.header("x-request-id"), Some(id.as_str()));
    assert_eq!(seen.header_count("x-request-id"), 1);
    drop(log_lines(p, &log));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn http2_streams_get_ids_the_same_way() {
    let dir = std::env::temp_dir().join(format!("portico-rid3-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("access.log");
    let _ = std::fs::remove_file(&log);
    let up = TestUpstream::start(|_| Reply::ok("hi"));
    let p = proxy(&up, &log, true);
    let client = h2c(p.addr("p").unwrap()).await;
    let send = |uri: &'static str, id: Option<&'static str>| {
        let client = client.clone();
        async move {
            let fields: Vec<(&str, &str)> = id.map(|id| ("x-request-id", id)).into_iter().collect();
            let head = h2_get(&client, uri, &fields).await;
            let id = head.headers["x-request-id"].to_str().unwrap().to_string();
            (head.status.as_u16(), id)
        }
    };
    let (status, id) = send("http://h/api/x", None).await;
    assert_eq!(status, 200);
    assert!(is_generated(&id), "{id}");
    assert_eq!(
        up.requests().pop().unwrap().header("x-request-id"),
        Some(id.as_str())
    );
    assert_eq!(send("http://h/api/y", Some("mine")).await.1, "mine");
    let (status, local) = send("http://h/local", None).await;
    assert_eq!(status, 418);
    assert!(is_generated(&local));
    let (status, origin) = send("http://h/bytes/5", None).await;
    assert_eq!(status, 200);
    assert!(is_generated(&origin));
    let (status, missing) = send("http://h/nowhere", None).await;
    assert_eq!(status, 404);
    assert!(is_generated(&missing));
    drop(client);
    let lines = tokio::task::spawn_blocking(move || log_lines(p, &log))
        .await
        .unwrap();
    let x = lines.iter().find(|l| l["target"] == "/api/x").unwrap();
    assert_eq!(x["request_id"], id.as_str());
    assert_eq!(x["protocol"], "HTTP/2.0");
    assert_eq!(x["host"], "h");
    let _ = std::fs::remove_dir_all(&dir);
}
