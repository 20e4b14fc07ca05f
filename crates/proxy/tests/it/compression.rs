//! Response compression through real sockets: HTTP/1.1 and HTTP/2 clients, each coding decoded back, and the responses that must pass untouched.

use crate::common::{start_toml, T};
use bytes::Bytes;
use portico_http1::Coding;
use portico_proxy::Running;
use portico_testkit::{Captured, Client, Reply, TestUpstream};
use std::io::{Read, Write};
use std::sync::atomic::Ordering::Relaxed;

/// A compressible page of about 40 KB.
fn page() -> Vec<u8> {
    (0..1000)
        .flat_map(|i| format!("<p>paragraph {i} of a page worth compressing</p>\n").into_bytes())
        .collect()
}

/// The upstream's answer to `r`: the page as HTML with a strong ETag and Accept-Ranges, unless
/// the path asks for something else.
fn answer(r: &Captured) -> Reply {
    let html = (
        "Content-Type".to_string(),
        "text/html; charset=utf-8".to_string(),
    );
    let mut headers = vec![
        html,
        ("ETag".to_string(), "\"v1\"".to_string()),
        ("Accept-Ranges".to_string(), "bytes".to_string()),
    ];
    let mut status = 200;
    let mut body = page();
    let mut chunked = false;
    match r.target.as_str() {
        "/chunked" => chunked = true,
        "/encoded" => {
            headers.push(("Content-Encoding".into(), "gzip".into()));
            body = gzip(&page());
        }
        "/no-transform" => headers.push(("Cache-Control".into(), "public, no-transform".into())),
        "/png" => headers[0].1 = "image/png".into(),
        "/small" => body = b"<p>tiny</p>".to_vec(),
        "/not-modified" => {
            status = 304;
            headers = vec![("ETag".into(), "\"v1\"".into())];
            body = Vec::new();
        }
        "/range" => {
            status = 206;
            headers.push(("Content-Range".into(), format!("bytes 0-99/{}", body.len())));
            body.truncate(100);
        }
        _ => {}
    }
    Reply::Respond {
        status,
        headers,
        body,
        chunked,
    }
}

fn gzip(d: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(d).unwrap();
    e.finish().unwrap()
}

fn decode(coding: &str, d: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match coding {
        "gzip" => flate2::read::GzDecoder::new(d).read_to_end(&mut out),
        "br" => brotli::Decompressor::new(d, 4096).read_to_end(&mut out),
        "zstd" => zstd::stream::read::Decoder::new(d)
            .unwrap()
            .read_to_end(&mut out),
        other => panic!("unexpected coding {other}"),
    }
    .unwrap_or_else(|e| panic!("{coding} body does not decode: {e}"));
    out
}

/// A proxy whose listener compresses with the defaults (`min_length` 256), routing to `up`.
fn proxy(up: &TestUpstream) -> Running {
    start_toml(
        &format!(
            "[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n[listeners.compression]\n\
             [[listeners.routes]]\nproxy = \"b\"\n[upstreams.b]\nservers = [\"{}\"]\n",
            up.addr
        ),
        1,
    )
}

fn get(path: &str, accept: Option<&str>) -> Vec<u8> {
    let accept = accept.map_or(String::new(), |a| format!("Accept-Encoding: {a}\r\n"));
    format!("GET {path} HTTP/1.1\r\nHost: a.test\r\n{accept}\r\n").into_bytes()
}

#[test]
fn http1_clients_get_each_coding_streamed_and_decodable() {
    let up = TestUpstream::start(answer);
    let p = proxy(&up);
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    for (accept, coding) in [
        ("gzip", "gzip"),
        ("gzip, deflate, br", "br"),
        ("gzip, deflate, br, zstd", "zstd"),
        ("br;q=0.5, gzip", "gzip"),
    ] {
        for path in ["/", "/chunked"] {
            let r = c.request(&get(path, Some(accept))).unwrap();
            assert_eq!(r.status, 200);
            assert_eq!(
                r.header("content-encoding"),
                Some(coding),
                "{accept} {path}"
            );
            assert_eq!(r.header("vary"), Some("Accept-Encoding"));
            assert_eq!(r.header("transfer-encoding"), Some("chunked"));
            assert_eq!(r.header("content-length"), None);
            assert_eq!(r.header("accept-ranges"), None);
            assert_eq!(r.header("etag"), Some("W/\"v1\""), "the validator is weak");
            assert!(
                r.body.len() < page().len() / 4,
                "{coding}: {}",
                r.body.len()
            );
            assert_eq!(decode(coding, &r.body), page(), "{accept} {path}");
        }
    }
    let s = p.stats();
    assert_eq!(s.compressed(Coding::Gzip).responses.load(Relaxed), 4);
    assert_eq!(s.compressed(Coding::Br).responses.load(Relaxed), 2);
    let z = s.compressed(Coding::Zstd);
    assert_eq!(z.responses.load(Relaxed), 2);
    assert_eq!(z.bytes_in.load(Relaxed), 2 * page().len() as u64);
    assert!(z.bytes_out.load(Relaxed) < z.bytes_in.load(Relaxed) / 4);
    // The connection stayed usable throughout: one connection, every response read to its end.
    let r = c.request(&get("/", None)).unwrap();
    assert_eq!(r.body, page());
}

#[test]
fn responses_that_must_not_change_pass_untouched() {
    let up = TestUpstream::start(answer);
    let p = proxy(&up);
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    let accept = Some("gzip, br, zstd");
    // A client that accepts no coding: the same bytes, framed as sent, and Vary for caches.
    let r = c.request(&get("/", None)).unwrap();
    assert_eq!(
        (r.header("content-encoding"), r.header("vary")),
        (None, Some("Accept-Encoding"))
    );
    assert_eq!(
        r.header("content-length"),
        Some(page().len().to_string().as_str())
    );
    assert_eq!(
        (r.header("etag"), r.header("accept-ranges")),
        (Some("\"v1\""), Some("bytes"))
    );
    assert_eq!(r.body, page());
    let r = c.request(&get("/", Some("identity, gzip;q=0"))).unwrap();
    assert_eq!(r.header("content-encoding"), None);
    assert_eq!(r.body, page());
    // Already encoded: never compressed twice.
    let r = c.request(&get("/encoded", accept)).unwrap();
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert_eq!(decode("gzip", &r.body), page());
    assert_eq!(r.header("vary"), None);
    // A range, no-transform, a type not listed, a body under min_length.
    for path in ["/range", "/no-transform", "/png", "/small"] {
        let r = c.request(&get(path, accept)).unwrap();
        assert_eq!(r.header("content-encoding"), None, "{path}");
        assert_eq!(r.header("vary"), None, "{path}");
        assert!(r.header("content-length").is_some(), "{path}");
    }
    // HEAD and 304: nothing to compress, but the Vary and weak ETag a compressed GET carries.
    let head = b"HEAD / HTTP/1.1\r\nHost: a.test\r\nAccept-Encoding: gzip\r\n\r\n";
    let r = c.request(head).unwrap();
    assert_eq!(r.header("content-encoding"), None);
    assert_eq!(
        r.header("content-length"),
        Some(page().len().to_string().as_str())
    );
    let weak = (Some("Accept-Encoding"), Some("W/\"v1\""));
    assert_eq!((r.header("vary"), r.header("etag")), weak);
    let r = c.request(&get("/not-modified", accept)).unwrap();
    assert_eq!(r.status, 304);
    assert_eq!((r.header("vary"), r.header("etag")), weak);
    assert_eq!(
        p.stats().compressed(Coding::Gzip).responses.load(Relaxed),
        0
    );
}

#[test]
fn an_http10_client_gets_a_close_delimited_compressed_body() {
    let up = TestUpstream::start(answer);
    let p = proxy(&up);
    let mut s = std::net::TcpStream::connect(p.addr("p").unwrap()).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    s.write_all(b"GET / HTTP/1.0\r\nHost: a.test\r\nAccept-Encoding: gzip\r\n\r\n")
        .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    assert!(head.contains("content-encoding: gzip"), "{head}");
    assert!(
        !head.contains("content-length") && !head.contains("transfer-encoding"),
        "{head}"
    );
    assert_eq!(decode("gzip", &raw[end..]), page());
}

#[test]
fn routes_override_or_turn_off_their_listeners_compression() {
    let up = TestUpstream::start(answer);
    let p = start_toml(
        &format!(
            "[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n\
             [listeners.compression]\nalgorithms = [\"gzip\"]\n\
             [[listeners.routes]]\npath = \"/off/**\"\nproxy = \"b\"\ncompression = {{ enabled = false }}\n\
             [[listeners.routes]]\npath = \"/brotli/**\"\nproxy = \"b\"\ncompression = {{ algorithms = [\"br\"] }}\n\
             [[listeners.routes]]\nproxy = \"b\"\n\
             [upstreams.b]\nservers = [\"{}\"]\n",
            up.addr
        ),
        1,
    );
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    let accept = Some("gzip, br, zstd");
    let r = c.request(&get("/off/x", accept)).unwrap();
    assert_eq!(
        (r.header("content-encoding"), r.header("vary")),
        (None, None)
    );
    let r = c.request(&get("/brotli/x", accept)).unwrap();
    assert_eq!(r.header("content-encoding"), Some("br"));
    let r = c.request(&get("/x", accept)).unwrap();
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert_eq!(decode("gzip", &r.body), page());
}

#[tokio::test]
async fn http2_clients_get_compressed_data_frames() {
    let up = TestUpstream::start(answer);
    let p = proxy(&up);
    let tcp = tokio::net::TcpStream::connect(p.addr("p").unwrap())
        .await
        .unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    for (path, accept, coding) in [
        ("/", "gzip", Some("gzip")),
        ("/chunked", "br, zstd", Some("zstd")),
        ("/", "", None),
        ("/encoded", "gzip", Some("gzip")),
    ] {
        let mut c = client.clone().ready().await.unwrap();
        let mut req = http::Request::builder().uri(format!("http://a.test{path}"));
        if !accept.is_empty() {
            req = req.header("accept-encoding", accept);
        }
        let (resp, _) = c.send_request(req.body(()).unwrap(), true).unwrap();
        let resp = tokio::time::timeout(T, resp).await.unwrap().unwrap();
        let h = resp.headers().clone();
        let mut body = resp.into_body();
        let mut got = Vec::new();
        while let Some(d) = tokio::time::timeout(T, body.data()).await.unwrap() {
            let d: Bytes = d.unwrap();
            let _ = body.flow_control().release_capacity(d.len());
            got.extend_from_slice(&d);
        }
        let ce = h.get("content-encoding").map(|v| v.to_str().unwrap());
        assert_eq!(ce, coding, "{path} {accept}");
        match coding {
            Some(coding) => {
                assert_eq!(decode(coding, &got), page(), "{path}");
                let ours = path != "/encoded";
                assert_eq!(h.get("content-length").is_none(), ours, "{path}");
            }
            None => {
                assert_eq!(got, page());
                assert_eq!(h.get("vary").unwrap(), "Accept-Encoding");
            }
        }
    }
    assert_eq!(
        p.stats().compressed(Coding::Gzip).responses.load(Relaxed),
        1
    );
    assert_eq!(
        p.stats().compressed(Coding::Zstd).responses.load(Relaxed),
        1
    );
}
