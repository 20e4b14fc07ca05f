//! W3C trace context through the proxy and OTLP spans sent to a receiver started by the test: a client's trace continued, a new one started, unsampled traces propagated but not exported, for HTTP/1.1 and HTTP/2 clients.

use crate::common::{h2_get, h2c, start_toml, T};
use portico_testkit::{Client, Reply, TestUpstream};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One export as received: its head's lines and its body.
type Export = (Vec<String>, Value);

/// An OTLP/HTTP receiver: every POST body, parsed as JSON, and the fields of each request.
struct Receiver {
    addr: SocketAddr,
    got: Arc<Mutex<Vec<Export>>>,
}

impl Receiver {
    fn start() -> Receiver {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let got: Arc<Mutex<Vec<Export>>> = Arc::default();
        let store = got.clone();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(s) = s else { return };
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut lines = Vec::new();
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        break;
                    }
                    let line = line.trim_end().to_string();
                    if line.is_empty() {
                        break;
                    }
                    lines.push(line);
                }
                let len: usize = lines
                    .iter()
                    .find_map(|l| {
                        let (n, v) = l.split_once(':')?;
                        n.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().ok())?
                    })
                    .unwrap_or(0);
                let mut body = vec![0u8; len];
                r.read_exact(&mut body).unwrap();
                store
                    .lock()
                    .unwrap()
                    .push((lines, serde_json::from_slice(&body).unwrap()));
                let mut s = s;
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}");
            }
        });
        Receiver { addr, got }
    }

    /// Every span received so far.
    fn spans(&self) -> Vec<Value> {
        let got = self.got.lock().unwrap();
        got.iter()
            .flat_map(|(_, v)| {
                v["resourceSpans"][0]["scopeSpans"][0]["spans"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .collect()
    }

    fn wait_for(&self, n: usize) -> Vec<Value> {
        let deadline = Instant::now() + T;
        loop {
            let spans = self.spans();
            if spans.len() >= n {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "{} of {n} spans: {spans:?}",
                spans.len()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    let attrs = span["attributes"].as_array().unwrap();
    let a = attrs.iter().find(|a| a["key"] == key);
    &a.unwrap_or_else(|| panic!("no {key} in {span}"))["value"]
}

const CLIENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7";

#[test]
fn client_traces_continue_new_ones_start_and_sampled_spans_reach_the_collector() {
    let receiver = Receiver::start();
    let up = TestUpstream::start(|_| Reply::ok("hi"));
    let dir = std::env::temp_dir().join(format!("portico-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("access.log");
    let _ = std::fs::remove_file(&log);
    let p = start_toml(
        &format!(
            r#"
access_log = {{ path = "{}", format = "json" }}

[trace]
otlp_endpoint = "http://{}/v1/traces"
otlp_headers = {{ "x-api-key" = "k1" }}
service_name = "edge"

[[listeners]]
name = "p"
address = "127.0.0.1:0"

[[listeners.routes]]
name = "api"
proxy = "b"

[upstreams.b]
servers = ["{}"]
"#,
            log.display(),
            receiver.addr,
            up.addr
        ),
        1,
    );
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();

    // No traceparent: a new trace, sampled (100% by default), Portico's span the parent.
    assert_eq!(
        c.request(b"GET /a?x=1 HTTP/1.1\r\nHost: h\r\n\r\n")
            .unwrap()
            .status,
        200
    );
    let seen = up.requests().pop().unwrap();
    let tp = seen.header("traceparent").unwrap().to_string();
    assert_eq!(tp.len(), 55, "{tp}");
    assert!(tp.ends_with("-01"), "{tp}");
    let (new_trace, new_span) = (tp[3..35].to_string(), tp[36..52].to_string());

    // A sampled client trace: continued, with Portico's span between.
    let req = format!(
        "GET /b HTTP/1.1\r\nHost: h\r\ntraceparent: {CLIENT}-01\r\ntracestate: v=1\r\n\r\n"
    );
    assert_eq!(c.request(req.as_bytes()).unwrap().status, 200);
    let seen = up.requests().pop().unwrap();
    let tp = seen.header("traceparent").unwrap().to_string();
    assert!(
        tp.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
        "{tp}"
    );
    assert_ne!(&tp[36..52], "00f067aa0ba902b7");
    assert_eq!(seen.header_count("traceparent"), 1);
    assert_eq!(seen.header("tracestate"), Some("v=1"));
    let continued_span = tp[36..52].to_string();

    // A tracestate without a traceparent belongs to no trace: dropped.
    let req = "GET /d HTTP/1.1\r\nHost: h\r\ntracestate: v=2\r\n\r\n";
    assert_eq!(c.request(req.as_bytes()).unwrap().status, 200);
    assert_eq!(up.requests().pop().unwrap().header("tracestate"), None);

    // An unsampled client trace: propagated as unsampled, no span exported.
    let req = format!("GET /c HTTP/1.1\r\nHost: h\r\ntraceparent: {CLIENT}-00\r\n\r\n");
    assert_eq!(c.request(req.as_bytes()).unwrap().status, 200);
    let tp = up
        .requests()
        .pop()
        .unwrap()
        .header("traceparent")
        .unwrap()
        .to_string();
    assert!(tp.ends_with("-00"), "{tp}");

    let spans = receiver.wait_for(3);
    assert_eq!(
        spans.len(),
        3,
        "the unsampled trace is not exported: {spans:?}"
    );
    let first = spans.iter().find(|s| s["traceId"] == new_trace).unwrap();
    assert_eq!(first["spanId"], new_span);
    assert!(first.get("parentSpanId").is_none());
    assert_eq!(first["name"], "GET api");
    assert_eq!(first["kind"], 2);
    assert_eq!(attr(first, "http.response.status_code")["intValue"], "200");
    assert_eq!(attr(first, "url.path")["stringValue"], "/a");
    assert_eq!(attr(first, "portico.route")["stringValue"], "api");
    assert_eq!(
        attr(first, "portico.upstream")["stringValue"],
        up.addr.to_string()
    );
    let events: Vec<&str> = first["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(events.contains(&"upstream.first_byte"), "{events:?}");
    let start: u128 = first["startTimeUnixNano"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let end: u128 = first["endTimeUnixNano"].as_str().unwrap().parse().unwrap();
    assert!(start <= end && end - start < 10_000_000_000);
    let second = spans
        .iter()
        .find(|s| s["traceId"] == "4bf92f3577b34da6a3ce929d0e0e4736")
        .unwrap();
    assert_eq!(second["parentSpanId"], "00f067aa0ba902b7");
    assert_eq!(second["spanId"], continued_span);
    // The export carried the service and the configured field.
    let got = receiver.got.lock().unwrap().clone();
    let (fields, body) = &got[0];
    assert!(
        fields[0].starts_with("POST /v1/traces HTTP/1."),
        "{fields:?}"
    );
    assert!(
        fields
            .iter()
            .any(|f| f.eq_ignore_ascii_case("x-api-key: k1")),
        "{fields:?}"
    );
    assert!(fields
        .iter()
        .any(|f| f.eq_ignore_ascii_case("content-type: application/json")));
    assert_eq!(
        body["resourceSpans"][0]["resource"]["attributes"][0]["value"]["stringValue"],
        "edge"
    );

    p.shutdown();
    p.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("\"target\":\"/a?x=1\""))
        .unwrap();
    let v: Value = serde_json::from_str(line).unwrap();
    assert_eq!(v["trace_id"], new_trace);
    assert_eq!(v["span_id"], new_span);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn http2_streams_are_traced_too_and_nothing_is_sampled_at_zero() {
    let receiver = Receiver::start();
    let up = TestUpstream::start(|_| Reply::ok("hi"));
    let p = start_toml(
        &format!(
            "[trace]\nsample_percent = 0\notlp_endpoint = \"http://{}/v1/traces\"\n[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nproxy = \"b\"\n[upstreams.b]\nservers = [\"{}\"]\n",
            receiver.addr, up.addr
        ),
        1,
    );
    let client = h2c(p.addr("p").unwrap()).await;
    let send = |tp: Option<String>| {
        let client = client.clone();
        async move {
            let fields: Vec<(&str, &str)> =
                tp.iter().map(|t| ("traceparent", t.as_str())).collect();
            h2_get(&client, "http://h/x", &fields).await.status.as_u16()
        }
    };
    // New traces are not sampled at 0%: propagated with flags 00, never exported.
    assert_eq!(send(None).await, 200);
    let tp = up
        .requests()
        .pop()
        .unwrap()
        .header("traceparent")
        .unwrap()
        .to_string();
    assert!(tp.ends_with("-00"), "{tp}");
    // A client's sampled trace is recorded whatever the rate.
    assert_eq!(send(Some(format!("{CLIENT}-01"))).await, 200);
    let spans = tokio::task::spawn_blocking(move || receiver.wait_for(1))
        .await
        .unwrap();
    assert_eq!(spans.len(), 1);
    assert_eq!(spans[0]["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(
        attr(&spans[0], "network.protocol.version")["stringValue"],
        "2"
    );
}
