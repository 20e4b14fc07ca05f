//! End-to-end table tests: raw request bytes -> parse_request -> Origin::respond -> parse_response.

use bytes::BytesMut;
use portico_http1::{encode, parse_request, parse_response, Framing, Limits};
use portico_origin::{Body, Origin};
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::time::Duration;

/// A directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!(
            "portico-origin-it-{tag}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn write(&self, rel: &str, content: &[u8]) {
        let p = self.0.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Answer {
    status: u16,
    fields: Vec<(String, String)>,
    body: Vec<u8>,
    delay: Option<Duration>,
}

impl Answer {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Send `raw` through the parser and the origin; parse the written head back and check that its
/// framing matches the body exactly.
fn exchange(origin: &Origin, raw: &str) -> Answer {
    let mut input = BytesMut::from(raw.as_bytes());
    let req = parse_request(&mut input, &Limits::default())
        .expect("valid request")
        .expect("complete request");
    let mut out = BytesMut::new();
    let reply = origin.respond(&req, &mut out);
    encode::end_head(&mut out);
    let head = parse_response(&mut out, req.method(), &Limits::default())
        .expect("origin wrote a valid head")
        .expect("complete head");
    assert!(out.is_empty(), "nothing after the head");
    assert_eq!(head.status(), reply.status);
    let body = match reply.body {
        Body::Empty => Vec::new(),
        Body::Bytes(b) => b.to_vec(),
        Body::File {
            mut file,
            offset,
            len,
        } => {
            file.seek(SeekFrom::Start(offset)).unwrap();
            let mut v = Vec::new();
            file.take(len).read_to_end(&mut v).unwrap();
            v
        }
    };
    let cl = head
        .field("content-length")
        .map(|v| std::str::from_utf8(v).unwrap().parse::<u64>().unwrap());
    match head.status() {
        204 | 304 => assert_eq!(cl, None),
        _ => assert!(cl.is_some(), "Content-Length always present"),
    }
    if *req.method() == portico_http1::Method::Head {
        assert!(body.is_empty());
    } else {
        match head.framing {
            Framing::None => assert!(body.is_empty()),
            Framing::Length(n) => assert_eq!(n, body.len() as u64, "framing matches body"),
            other => panic!("unexpected framing {other:?}"),
        }
    }
    Answer {
        status: head.status(),
        fields: head
            .fields()
            .map(|(n, v)| (n.to_owned(), String::from_utf8_lossy(v).into_owned()))
            .collect(),
        body,
        delay: reply.delay,
    }
}

fn get(origin: &Origin, target: &str) -> Answer {
    exchange(origin, &format!("GET {target} HTTP/1.1\r\nHost: t\r\n\r\n"))
}

#[test]
fn synthetic_table() {
    let o = Origin::new(None, vec![], true);
    let cases: &[(&str, u16, usize, Option<&str>)] = &[
        ("/bytes/1024", 200, 1024, Some("application/octet-stream")),
        ("/bytes/1k", 200, 1024, Some("application/octet-stream")),
        (
            "/bytes/100k",
            200,
            100 * 1024,
            Some("application/octet-stream"),
        ),
        ("/bytes/1m", 200, 1 << 20, Some("application/octet-stream")),
        ("/bytes/0", 200, 0, Some("application/octet-stream")),
        (
            "/x?size=1k&status=503",
            503,
            1024,
            Some("application/octet-stream"),
        ),
        ("/x?status=204", 204, 0, None),
        ("/x?status=304", 304, 0, None),
        ("/bytes/2g", 400, 0, Some("text/plain; charset=utf-8")),
        ("/x?size=big", 400, 0, Some("text/plain; charset=utf-8")),
        ("/x?delay=1h", 400, 0, Some("text/plain; charset=utf-8")),
        ("/x?status=99", 400, 0, Some("text/plain; charset=utf-8")),
        ("/", 200, 0, Some("text/plain; charset=utf-8")),
        ("/missing", 404, 0, Some("text/plain; charset=utf-8")),
    ];
    for &(target, status, len, ctype) in cases {
        let a = get(&o, target);
        assert_eq!(a.status, status, "{target}");
        if status == 200 && ctype == Some("application/octet-stream") || status == 503 {
            assert_eq!(a.body.len(), len, "{target}");
        }
        assert_eq!(a.field("content-type"), ctype, "{target}");
        assert!(a.field("date").is_none() && a.field("connection").is_none());
    }
    let a = get(&o, "/x?size=10&delay=5ms");
    assert_eq!(
        (a.status, a.body.len(), a.delay),
        (200, 10, Some(Duration::from_millis(5)))
    );
    let a = exchange(&o, "HEAD /bytes/1m HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(
        (a.status, a.field("content-length"), a.body.len()),
        (200, Some("1048576"), 0)
    );
    let a = exchange(
        &o,
        "POST /bytes/5 HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc",
    );
    assert_eq!((a.status, a.body.len()), (200, 5));
    let a = exchange(&o, "DELETE /bytes/5 HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(
        (a.status, a.field("allow")),
        (405, Some("GET, HEAD, POST, PUT"))
    );
}

#[test]
fn static_table() {
    let dir = TempDir::new("static");
    dir.write("index.html", b"<p>home</p>");
    dir.write("a.txt", b"0123456789");
    dir.write("docs/index.html", b"docs");
    let o = Origin::new(Some(dir.0.clone()), vec!["index.html".into()], false);

    let a = get(&o, "/a.txt");
    assert_eq!((a.status, &a.body[..]), (200, &b"0123456789"[..]));
    assert_eq!(a.field("content-type"), Some("text/plain; charset=utf-8"));
    assert_eq!(a.field("accept-ranges"), Some("bytes"));
    let etag = a.field("etag").unwrap().to_owned();
    let lm = a.field("last-modified").unwrap().to_owned();

    let a = exchange(&o, "HEAD /a.txt HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(
        (a.status, a.field("content-length"), a.body.len()),
        (200, Some("10"), 0)
    );

    let a = exchange(
        &o,
        &format!("GET /a.txt HTTP/1.1\r\nHost: t\r\nIf-None-Match: {etag}\r\n\r\n"),
    );
    assert_eq!((a.status, a.field("etag")), (304, Some(&etag[..])));
    let a = exchange(
        &o,
        &format!("GET /a.txt HTTP/1.1\r\nHost: t\r\nIf-Modified-Since: {lm}\r\n\r\n"),
    );
    assert_eq!(a.status, 304);

    for (range, status, body, content_range) in [
        ("bytes=0-3", 206, &b"0123"[..], Some("bytes 0-3/10")),
        ("bytes=7-", 206, b"789", Some("bytes 7-9/10")),
        ("bytes=-2", 206, b"89", Some("bytes 8-9/10")),
        (
            "bytes=10-",
            416,
            b"range not satisfiable\n",
            Some("bytes */10"),
        ),
        ("bytes=0-1,3-4", 200, b"0123456789", None),
    ] {
        let a = exchange(
            &o,
            &format!("GET /a.txt HTTP/1.1\r\nHost: t\r\nRange: {range}\r\n\r\n"),
        );
        assert_eq!(
            (a.status, &a.body[..], a.field("content-range")),
            (status, body, content_range),
            "{range}"
        );
    }
    let a = exchange(
        &o,
        &format!("GET /a.txt HTTP/1.1\r\nHost: t\r\nRange: bytes=0-0\r\nIf-Range: {etag}\r\n\r\n"),
    );
    assert_eq!((a.status, &a.body[..]), (206, &b"0"[..]));

    let a = get(&o, "/docs");
    assert_eq!((a.status, a.field("location")), (301, Some("/docs/")));
    let a = get(&o, "/docs/");
    assert_eq!((a.status, &a.body[..]), (200, &b"docs"[..]));
    assert_eq!(get(&o, "/").body, b"<p>home</p>");

    for target in [
        "/../etc/passwd",
        "/%2e%2e/",
        "/a/..%2f..%2f",
        "/a.txt%00",
        "/docs/..%2f..%2fetc/passwd",
    ] {
        let a = get(&o, target);
        assert!(a.status == 400 || a.status == 404, "{target}: {}", a.status);
    }
    let a = exchange(
        &o,
        "PUT /a.txt HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n",
    );
    assert_eq!((a.status, a.field("allow")), (405, Some("GET, HEAD")));
    assert_eq!(get(&o, "/nope.txt").status, 404);
}
