//! Handler tests without the HTTP parser: synthetic forms, static files, conditionals, ranges, traversal.

use crate::response::Response;
use crate::{Body, Origin, RequestView};
use portico_http1::{Coding, Method};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// A request double: method, target, fields.
struct Req {
    method: Method,
    path: String,
    query: Option<String>,
    fields: Vec<(String, Vec<u8>)>,
}

impl Req {
    fn new(method: Method, target: &str) -> Self {
        let (path, query) = match target.split_once('?') {
            Some((p, q)) => (p.to_owned(), Some(q.to_owned())),
            None => (target.to_owned(), None),
        };
        Req {
            method,
            path,
            query,
            fields: Vec::new(),
        }
    }
    fn get(target: &str) -> Self {
        Req::new(Method::Get, target)
    }
    fn with(mut self, name: &str, value: &str) -> Self {
        self.fields
            .push((name.to_owned(), value.as_bytes().to_vec()));
        self
    }
}

impl RequestView for Req {
    fn method(&self) -> &Method {
        &self.method
    }
    fn path(&self) -> &str {
        &self.path
    }
    fn query(&self) -> Option<&str> {
        self.query.as_deref()
    }
    fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| &v[..])
    }
}

/// A directory under the system temp dir, removed on drop.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new() -> Self {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!(
            "portico-origin-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let dir = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn path(&self) -> &Path {
        &self.0
    }
    fn write(&self, rel: &str, content: &[u8]) {
        let p = self.0.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(p, content).unwrap();
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The bytes a body stands for.
fn body_bytes(body: Body) -> Vec<u8> {
    match body {
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
            assert_eq!(v.len() as u64, len, "file body shorter than declared");
            v
        }
    }
}

/// Check the framing invariant and return (status, body bytes).
fn check(resp: Response, head: bool) -> (u16, Vec<u8>, Response) {
    let status = resp.status;
    let cl = resp.content_length;
    let (resp, body) = split(resp);
    let bytes = body_bytes(body);
    match status {
        204 | 304 => {
            assert_eq!(cl, None, "{status} must not carry Content-Length");
            assert!(bytes.is_empty());
        }
        _ if head => assert!(bytes.is_empty(), "HEAD with a body"),
        _ => assert_eq!(
            cl,
            Some(bytes.len() as u64),
            "Content-Length mismatch for {status}"
        ),
    }
    (status, bytes, resp)
}

fn split(mut resp: Response) -> (Response, Body) {
    let body = std::mem::replace(&mut resp.body, Body::Empty);
    (resp, body)
}

fn synthetic() -> Origin {
    Origin::new(None, vec!["index.html".into()], true)
}

fn get(o: &Origin, target: &str) -> (u16, Vec<u8>, Response) {
    check(o.handle(&Req::get(target)), false)
}

// ---------------- synthetic ----------------

#[test]
fn synthetic_bytes_forms() {
    let o = synthetic();
    for (target, n) in [
        ("/bytes/0", 0usize),
        ("/bytes/1", 1),
        ("/bytes/1024", 1024),
        ("/bytes/1k", 1024),
        ("/bytes/100k", 100 * 1024),
        ("/bytes/1m", 1 << 20),
        ("/bytes/1M", 1 << 20),
        ("/bytes/3m", 3 << 20),
        ("/bytes/1m?size=10", 10),
        ("/anything?size=1k", 1024),
        ("/?size=7&v=1", 7),
    ] {
        let (status, body, resp) = get(&o, target);
        assert_eq!(status, 200, "{target}");
        assert_eq!(body.len(), n, "{target}");
        assert_eq!(
            resp.field("content-type"),
            Some("application/octet-stream"),
            "{target}"
        );
        assert_eq!(resp.delay, None);
        assert_eq!(&body[..n.min(64)], &o.pattern[..n.min(64)]);
    }
    let (_, big, _) = get(&o, "/bytes/3m");
    assert!(big.chunks(1 << 20).all(|c| c == &o.pattern[..c.len()]));
}

#[test]
fn synthetic_query_forms() {
    let o = synthetic();
    let (status, body, resp) = get(&o, "/x/y?size=1k&delay=5ms&status=503");
    assert_eq!(
        (status, body.len(), resp.delay),
        (503, 1024, Some(Duration::from_millis(5)))
    );
    let (status, body, resp) = get(&o, "/?delay=2s");
    assert_eq!(
        (status, body.len(), resp.delay),
        (200, 0, Some(Duration::from_secs(2)))
    );
    let (_, _, resp) = get(&o, "/?delay=0");
    assert_eq!(resp.delay, None);
    let (status, _, resp) = get(&o, "/bytes/10?status=404&delay=1ms");
    assert_eq!((status, resp.delay), (404, Some(Duration::from_millis(1))));
    for code in [204, 304] {
        let (status, body, resp) = get(&o, &format!("/?status={code}&size=1k"));
        assert_eq!((status, body.len(), resp.content_length), (code, 0, None));
    }
    let (status, body, resp) = get(&o, "/?status=205&size=1k");
    assert_eq!((status, body.len(), resp.content_length), (205, 0, Some(0)));
}

#[test]
fn synthetic_bad_params() {
    let o = synthetic();
    for target in [
        "/bytes/",
        "/bytes/abc",
        "/bytes/2g",
        "/bytes/1025m",
        "/bytes/-1",
        "/bytes/1/2",
        "/?size=",
        "/?size=1x",
        "/?delay=61s",
        "/?delay=fast",
        "/?status=600",
        "/?status=199",
        "/?status=abc",
        "/?status",
    ] {
        let (status, body, resp) = get(&o, target);
        assert_eq!(status, 400, "{target}");
        assert!(!body.is_empty() && body.len() < 200, "{target}");
        assert_eq!(
            resp.field("content-type"),
            Some("text/plain; charset=utf-8")
        );
        assert_eq!(resp.delay, None);
    }
}

#[test]
fn synthetic_methods() {
    let o = synthetic();
    let (status, body, _) = check(o.handle(&Req::new(Method::Head, "/bytes/1m")), true);
    assert_eq!((status, body.len()), (200, 0));
    let resp = o.handle(&Req::new(Method::Head, "/bytes/1g"));
    assert_eq!(
        resp.content_length,
        Some(1 << 30),
        "HEAD declares the GET length without building it"
    );
    assert!(matches!(resp.body, Body::Empty));
    for m in [Method::Post, Method::Put] {
        let (status, body, _) = check(o.handle(&Req::new(m, "/bytes/10")), false);
        assert_eq!((status, body.len()), (200, 10));
    }
    for m in [
        Method::Delete,
        Method::Options,
        Method::Other("BREW".into()),
    ] {
        let (status, _, resp) = check(o.handle(&Req::new(m.clone(), "/bytes/10")), false);
        assert_eq!(status, 405, "{m:?}");
        assert_eq!(resp.field("allow"), Some("GET, HEAD, POST, PUT"));
        let (status, _, _) = check(o.handle(&Req::new(m, "/")), false);
        assert_eq!(status, 405);
    }
}

#[test]
fn synthetic_index_and_fallbacks() {
    let o = synthetic();
    let (status, body, resp) = get(&o, "/");
    assert_eq!(status, 200);
    assert_eq!(
        resp.field("content-type"),
        Some("text/plain; charset=utf-8")
    );
    let text = String::from_utf8(body).unwrap();
    assert!(text.contains("Portico origin") && text.contains("/bytes/N") && text.contains("size="));
    let (status, _, _) = get(&o, "/?cachebust=1");
    assert_eq!(status, 200);
    assert_eq!(get(&o, "/nothing").0, 404);
    assert_eq!(get(&o, "/nothing?v=2").0, 404);
    // Not synthetic and no root: nothing is served.
    let plain = Origin::new(None, vec![], false);
    assert_eq!(get(&plain, "/bytes/10").0, 404);
    assert_eq!(get(&plain, "/?size=10").0, 404);
    assert_eq!(get(&plain, "/").0, 404);
}

// ---------------- static ----------------

fn site() -> (TempDir, Origin) {
    let dir = TempDir::new();
    dir.write("index.html", b"<h1>home</h1>\n");
    dir.write("hello.txt", b"hello, world\n");
    dir.write("style.css", b"body{}");
    dir.write("data.json", b"{}");
    dir.write("pic.png", b"\x89PNG");
    dir.write("blob.unknownext", b"??");
    dir.write("empty.txt", b"");
    dir.write("digits.bin", b"0123456789");
    dir.write("sub/index.html", b"sub index");
    dir.write("sub/other.htm", b"other");
    dir.write("alt/home.txt", b"alt home");
    dir.write("evil.com/x", b"x");
    std::fs::create_dir_all(dir.path().join("noindex")).unwrap();
    let o = Origin::new(
        Some(dir.path().to_owned()),
        vec!["index.html".into(), "home.txt".into()],
        false,
    );
    (dir, o)
}

#[test]
fn static_files_and_mime() {
    let (_dir, o) = site();
    for (target, ctype, content) in [
        (
            "/hello.txt",
            "text/plain; charset=utf-8",
            &b"hello, world\n"[..],
        ),
        (
            "/index.html",
            "text/html; charset=utf-8",
            b"<h1>home</h1>\n",
        ),
        ("/style.css", "text/css; charset=utf-8", b"body{}"),
        ("/data.json", "application/json", b"{}"),
        ("/pic.png", "image/png", b"\x89PNG"),
        ("/blob.unknownext", "application/octet-stream", b"??"),
        (
            "/hello%2etxt",
            "text/plain; charset=utf-8",
            b"hello, world\n",
        ),
        ("//sub//./other.htm", "text/html; charset=utf-8", b"other"),
    ] {
        let (status, body, resp) = get(&o, target);
        assert_eq!(status, 200, "{target}");
        assert_eq!(body, content, "{target}");
        assert_eq!(resp.field("content-type"), Some(ctype), "{target}");
        assert_eq!(resp.field("accept-ranges"), Some("bytes"));
        let etag = resp.field("etag").unwrap();
        assert!(
            etag.starts_with(&format!("\"{:x}-", content.len())) && etag.ends_with('"'),
            "{etag}"
        );
        let lm = resp.field("last-modified").unwrap();
        assert!(httpdate::parse_http_date(lm).is_ok(), "{lm}");
    }
    let (status, body, resp) = get(&o, "/empty.txt");
    assert_eq!((status, body.len(), resp.content_length), (200, 0, Some(0)));
    assert!(matches!(resp.body, Body::Empty));
}

#[test]
fn static_head() {
    let (_dir, o) = site();
    let (status, body, resp) = check(o.handle(&Req::new(Method::Head, "/hello.txt")), true);
    assert_eq!(
        (status, body.len(), resp.content_length),
        (200, 0, Some(13))
    );
    assert!(resp.field("etag").is_some());
    // Range is ignored for HEAD.
    let resp = o.handle(&Req::new(Method::Head, "/digits.bin").with("Range", "bytes=0-1"));
    assert_eq!((resp.status, resp.content_length), (200, Some(10)));
}

#[test]
fn static_not_modified() {
    let (_dir, o) = site();
    let (_, _, first) = get(&o, "/hello.txt");
    let etag = first.field("etag").unwrap().to_owned();
    let lm = first.field("last-modified").unwrap().to_owned();
    let cases = [
        (Req::get("/hello.txt").with("If-None-Match", &etag), 304),
        (
            Req::get("/hello.txt").with("If-None-Match", &format!("W/{etag}")),
            304,
        ),
        (
            Req::get("/hello.txt").with("If-None-Match", &format!("\"nope\", {etag}")),
            304,
        ),
        (Req::get("/hello.txt").with("If-None-Match", "*"), 304),
        (
            Req::get("/hello.txt").with("If-None-Match", "\"nope\""),
            200,
        ),
        (Req::get("/hello.txt").with("If-Modified-Since", &lm), 304),
        (
            Req::get("/hello.txt").with("If-Modified-Since", "Thu, 01 Jan 1970 00:00:00 GMT"),
            200,
        ),
        (
            Req::get("/hello.txt").with("If-Modified-Since", "garbage"),
            200,
        ),
        // If-None-Match wins over If-Modified-Since.
        (
            Req::get("/hello.txt")
                .with("If-None-Match", "\"nope\"")
                .with("If-Modified-Since", &lm),
            200,
        ),
        (
            Req::new(Method::Head, "/hello.txt").with("If-None-Match", &etag),
            304,
        ),
    ];
    for (req, want) in cases {
        let head = req.method == Method::Head;
        let (status, body, resp) = check(o.handle(&req), head);
        assert_eq!(status, want, "{:?}", req.fields);
        if status == 304 {
            assert!(body.is_empty());
            assert_eq!(resp.field("etag"), Some(&etag[..]));
            assert_eq!(resp.field("last-modified"), Some(&lm[..]));
        }
    }
}

#[test]
fn static_ranges() {
    let (_dir, o) = site();
    let (_, _, first) = get(&o, "/digits.bin");
    let etag = first.field("etag").unwrap().to_owned();
    let lm = first.field("last-modified").unwrap().to_owned();
    for (range, want_body, content_range) in [
        ("bytes=0-4", &b"01234"[..], "bytes 0-4/10"),
        ("bytes=5-", b"56789", "bytes 5-9/10"),
        ("bytes=-3", b"789", "bytes 7-9/10"),
        ("bytes=8-100", b"89", "bytes 8-9/10"),
        ("bytes=-100", b"0123456789", "bytes 0-9/10"),
    ] {
        let (status, body, resp) = check(
            o.handle(&Req::get("/digits.bin").with("Range", range)),
            false,
        );
        assert_eq!(status, 206, "{range}");
        assert_eq!(body, want_body, "{range}");
        assert_eq!(resp.field("content-range"), Some(content_range));
        assert_eq!(resp.field("accept-ranges"), Some("bytes"));
        assert_eq!(resp.field("content-type"), Some("application/octet-stream"));
    }
    for range in ["bytes=10-", "bytes=100-200", "bytes=-0"] {
        let (status, body, resp) = check(
            o.handle(&Req::get("/digits.bin").with("Range", range)),
            false,
        );
        assert_eq!(status, 416, "{range}");
        assert_eq!(resp.field("content-range"), Some("bytes */10"));
        assert!(body.len() < 100);
    }
    let (status, body, _) = check(
        o.handle(&Req::get("/empty.txt").with("Range", "bytes=0-")),
        false,
    );
    assert_eq!((status, body.len()), (416, "range not satisfiable\n".len()));
    // Multiple, malformed or foreign-unit ranges: the whole file.
    for range in ["bytes=0-1,4-5", "bytes=5-2", "lines=1-2", "bytes=x"] {
        let (status, body, _) = check(
            o.handle(&Req::get("/digits.bin").with("Range", range)),
            false,
        );
        assert_eq!((status, &body[..]), (200, &b"0123456789"[..]), "{range}");
    }
    // If-Range.
    for (if_range, want) in [
        (etag.clone(), 206),
        (format!("W/{etag}"), 200),
        ("\"other\"".to_owned(), 200),
        (lm.clone(), 206),
        ("Thu, 01 Jan 1970 00:00:00 GMT".to_owned(), 200),
    ] {
        let req = Req::get("/digits.bin")
            .with("Range", "bytes=1-2")
            .with("If-Range", &if_range);
        let (status, body, _) = check(o.handle(&req), false);
        assert_eq!(status, want, "{if_range}");
        assert_eq!(body.len(), if want == 206 { 2 } else { 10 });
    }
    // A matching If-None-Match answers 304 before Range is looked at.
    let req = Req::get("/digits.bin")
        .with("Range", "bytes=1-2")
        .with("If-None-Match", &etag);
    assert_eq!(o.handle(&req).status, 304);
}

#[test]
fn static_traversal_refused() {
    let (dir, o) = site();
    let outside = TempDir::new();
    outside.write("secret.txt", b"secret");
    for target in [
        "/../etc/passwd",
        "/%2e%2e/etc/passwd",
        "/%2E%2E/",
        "/a/..%2f..%2fetc/passwd",
        "/sub/../../etc/passwd",
        "/hello.txt%00.png",
        "/%00",
        "/sub%5c..%5chello.txt",
        "/sub\\hello.txt",
        "/%zz",
        "*",
    ] {
        let (status, body, _) = get(&o, target);
        assert!(status == 400 || status == 404, "{target}: {status}");
        assert!(!body.starts_with(b"secret") && !body.starts_with(b"root:"));
    }
    let escape = format!("/{}", "../".repeat(20));
    assert_eq!(get(&o, &format!("{escape}etc/passwd")).0, 400);
    // Symlinks: inside the root fine, escaping it refused.
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(
            outside.path().join("secret.txt"),
            dir.path().join("leak.txt"),
        )
        .unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("leakdir")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("hello.txt"), dir.path().join("link.txt"))
            .unwrap();
        assert_eq!(get(&o, "/leak.txt").0, 404);
        assert_eq!(get(&o, "/leakdir/secret.txt").0, 404);
        assert_eq!(get(&o, "/leakdir/").0, 404);
        let (status, body, _) = get(&o, "/link.txt");
        assert_eq!((status, &body[..]), (200, &b"hello, world\n"[..]));
    }
}

#[test]
fn static_directories() {
    let (_dir, o) = site();
    let (status, _, resp) = get(&o, "/sub");
    assert_eq!((status, resp.field("location")), (301, Some("/sub/")));
    let (status, _, resp) = get(&o, "/sub?x=1");
    assert_eq!((status, resp.field("location")), (301, Some("/sub/?x=1")));
    let (status, _, resp) = get(&o, "//evil.com");
    assert_eq!((status, resp.field("location")), (301, Some("/evil.com/")));
    let (status, body, resp) = get(&o, "/sub/");
    assert_eq!((status, &body[..]), (200, &b"sub index"[..]));
    assert_eq!(resp.field("content-type"), Some("text/html; charset=utf-8"));
    let (status, body, _) = get(&o, "/");
    assert_eq!((status, &body[..]), (200, &b"<h1>home</h1>\n"[..]));
    // Second index name.
    let (status, body, resp) = get(&o, "/alt/");
    assert_eq!((status, &body[..]), (200, &b"alt home"[..]));
    assert_eq!(
        resp.field("content-type"),
        Some("text/plain; charset=utf-8")
    );
    // No index, no listing.
    assert_eq!(get(&o, "/noindex/").0, 404);
    assert_eq!(get(&o, "/evil.com/").0, 404);
    let (status, body, resp) = check(o.handle(&Req::new(Method::Head, "/sub")), true);
    assert_eq!((status, body.len()), (301, 0));
    assert!(resp.content_length.is_some_and(|n| n > 0));
}

#[test]
fn static_errors_and_methods() {
    let (dir, o) = site();
    assert_eq!(get(&o, "/missing.txt").0, 404);
    assert_eq!(get(&o, "/missing/deeper.txt").0, 404);
    assert_eq!(get(&o, "/hello.txt/").0, 404);
    assert_eq!(get(&o, "/hello.txt/x").0, 404);
    assert_eq!(get(&o, &format!("/{}", "a".repeat(300))).0, 404);
    for m in [Method::Post, Method::Put, Method::Delete, Method::Options] {
        let (status, _, resp) = check(o.handle(&Req::new(m, "/hello.txt")), false);
        assert_eq!(status, 405);
        assert_eq!(resp.field("allow"), Some("GET, HEAD"));
    }
    // Unreadable file: 403 (skipped when running as a user that bypasses permissions).
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.path().join("locked.txt");
        std::fs::write(&p, b"locked").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o000)).unwrap();
        if std::fs::File::open(&p).is_err() {
            assert_eq!(get(&o, "/locked.txt").0, 403);
        }
    }
    // Root that does not exist.
    let gone = Origin::new(Some(dir.path().join("nope")), vec![], false);
    assert_eq!(get(&gone, "/hello.txt").0, 404);
    // Root created after startup works.
    std::fs::create_dir(dir.path().join("nope")).unwrap();
    std::fs::write(dir.path().join("nope/late.txt"), b"late").unwrap();
    assert_eq!(get(&gone, "/late.txt").0, 200);
}

#[test]
fn origin_with_root_and_synthetic() {
    let (dir, _) = site();
    let o = Origin::new(Some(dir.path().to_owned()), vec!["index.html".into()], true);
    assert_eq!(get(&o, "/bytes/10").1.len(), 10);
    assert_eq!(get(&o, "/hello.txt").1, b"hello, world\n");
    assert_eq!(get(&o, "/hello.txt?size=5").1.len(), 5);
    assert_eq!(get(&o, "/hello.txt?v=5").1, b"hello, world\n");
    assert_eq!(get(&o, "/").1, b"<h1>home</h1>\n");
    assert!(format!("{o:?}").contains("synthetic: true"));
}

#[test]
fn fields_for_http2_are_the_fields_of_the_http1_head() {
    let o = synthetic();
    for raw in [
        "GET /bytes/10 HTTP/1.1\r\nHost: a\r\n\r\n",
        "HEAD /bytes/10 HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET /?status=204 HTTP/1.1\r\nHost: a\r\n\r\n",
        "DELETE /bytes/1 HTTP/1.1\r\nHost: a\r\n\r\n",
    ] {
        let limits = portico_http1::Limits::default();
        let mut b = bytes::BytesMut::from(raw.as_bytes());
        let req = portico_http1::parse_request(&mut b, &limits)
            .unwrap()
            .unwrap();
        let mut head = bytes::BytesMut::new();
        let bytes_reply = o.respond(&req, &mut head);
        portico_http1::encode::end_head(&mut head);
        let parsed = portico_http1::parse_response(&mut head, req.method(), &limits)
            .unwrap()
            .unwrap();
        let mut fields = Vec::new();
        let reply = o.respond_fields(&req, |n, v| fields.push((n.to_owned(), v.to_vec())));
        assert_eq!(reply.status, bytes_reply.status, "{raw}");
        assert_eq!(reply.status, parsed.status(), "{raw}");
        let want: Vec<_> = parsed
            .fields()
            .map(|(n, v)| (n.to_owned(), v.to_vec()))
            .collect();
        assert_eq!(fields, want, "{raw}");
    }
}

// ---------------- precompressed siblings ----------------

const JS: &[u8] = b"console.log('the original, uncompressed');\n";
const JS_BR: &[u8] = b"BR:compressed-js";
const JS_GZ: &[u8] = b"GZ:compressed-js-0123456789";
const CSS_GZ: &[u8] = b"GZ:compressed-css";

/// A root with precompressed siblings next to some files (their contents stand in for real
/// compressed bytes: the origin never decodes them).
fn precompressed_dir() -> TempDir {
    let dir = TempDir::new();
    dir.write("app.js", JS);
    dir.write("app.js.br", JS_BR);
    dir.write("app.js.gz", JS_GZ);
    dir.write("only-gz.css", b"body { color: red }\n");
    dir.write("only-gz.css.gz", CSS_GZ);
    dir.write("plain.txt", b"no siblings\n");
    dir.write("index.html", b"<h1>home</h1>\n");
    dir.write("index.html.gz", b"GZ:index");
    // A directory where a sibling would be is not a sibling.
    dir.write("dir-sibling.txt", b"original\n");
    std::fs::create_dir_all(dir.path().join("dir-sibling.txt.br")).unwrap();
    dir
}

fn precompressed_origin(dir: &TempDir, codings: Vec<Coding>) -> Origin {
    Origin::new(
        Some(dir.path().to_owned()),
        vec!["index.html".into()],
        false,
    )
    .with_precompressed(codings)
}

/// GET `target` with `Accept-Encoding: accept` (None: no such field).
fn get_encoded(o: &Origin, target: &str, accept: Option<&str>) -> (u16, Vec<u8>, Response) {
    let mut req = Req::get(target);
    if let Some(a) = accept {
        req = req.with("Accept-Encoding", a);
    }
    check(o.handle(&req), false)
}

#[test]
fn precompressed_br_is_chosen_over_gzip_when_both_exist() {
    let dir = precompressed_dir();
    let o = precompressed_origin(&dir, Coding::ALL.to_vec());
    let (_, _, original) = get_encoded(&o, "/app.js", None);
    let js_type = original.field("content-type").unwrap().to_owned();
    assert_eq!(js_type, "text/javascript; charset=utf-8");
    // zstd is preferred but has no sibling; br beats gzip by the server's order.
    for accept in ["gzip, deflate, br, zstd", "gzip, br", "br;q=1.0, gzip;q=1"] {
        let (status, body, resp) = get_encoded(&o, "/app.js", Some(accept));
        assert_eq!((status, &body[..]), (200, JS_BR), "{accept}");
        assert_eq!(resp.field("content-encoding"), Some("br"), "{accept}");
        assert_eq!(resp.field("content-type"), Some(&js_type[..]), "{accept}");
        assert_eq!(resp.field("vary"), Some("Accept-Encoding"), "{accept}");
        assert_eq!(resp.field("accept-ranges"), Some("bytes"));
        assert_eq!(resp.content_length, Some(JS_BR.len() as u64));
    }
    // The sibling's validators: its own length in the tag, the coding keeping variants apart.
    let (_, _, br) = get_encoded(&o, "/app.js", Some("br"));
    let (_, _, gz) = get_encoded(&o, "/app.js", Some("gzip"));
    let br_tag = br.field("etag").unwrap();
    let gz_tag = gz.field("etag").unwrap();
    assert!(br_tag.starts_with(&format!("\"{:x}-", JS_BR.len())) && br_tag.ends_with("-br\""));
    assert!(gz_tag.starts_with(&format!("\"{:x}-", JS_GZ.len())) && gz_tag.ends_with("-gzip\""));
    assert_ne!(br_tag, original.field("etag").unwrap());
    assert!(httpdate::parse_http_date(br.field("last-modified").unwrap()).is_ok());
    // Client weights decide over the server's order; the server's order breaks ties.
    let (_, body, resp) = get_encoded(&o, "/app.js", Some("br;q=0.5, gzip;q=0.8"));
    assert_eq!(
        (&body[..], resp.field("content-encoding")),
        (JS_GZ, Some("gzip"))
    );
    let gzip_first = precompressed_origin(&dir, vec![Coding::Gzip, Coding::Br]);
    let (_, body, resp) = get_encoded(&gzip_first, "/app.js", Some("br, gzip"));
    assert_eq!(
        (&body[..], resp.field("content-encoding")),
        (JS_GZ, Some("gzip"))
    );
    // Only the configured codings are looked for.
    let gzip_only = precompressed_origin(&dir, vec![Coding::Gzip]);
    let (_, body, _) = get_encoded(&gzip_only, "/app.js", Some("br"));
    assert_eq!(body, JS);
}

#[test]
fn precompressed_falls_back_to_the_next_acceptable_sibling() {
    let dir = precompressed_dir();
    let o = precompressed_origin(&dir, Coding::ALL.to_vec());
    // br is preferred and accepted, but only the .gz exists.
    let (status, body, resp) = get_encoded(&o, "/only-gz.css", Some("br, gzip"));
    assert_eq!((status, &body[..]), (200, CSS_GZ));
    assert_eq!(resp.field("content-encoding"), Some("gzip"));
    assert_eq!(resp.field("content-type"), Some("text/css; charset=utf-8"));
    // The client's weights order the fallback too.
    let (_, body, _) = get_encoded(&o, "/only-gz.css", Some("br;q=0.9, zstd, gzip;q=0.1"));
    assert_eq!(body, CSS_GZ);
    // No acceptable sibling: the original, still with Vary.
    for (target, accept, want) in [
        ("/only-gz.css", "br", &b"body { color: red }\n"[..]),
        ("/plain.txt", "gzip, br, zstd", b"no siblings\n"),
        ("/dir-sibling.txt", "br", b"original\n"),
    ] {
        let (status, body, resp) = get_encoded(&o, target, Some(accept));
        assert_eq!((status, &body[..]), (200, want), "{target}");
        assert_eq!(resp.field("content-encoding"), None, "{target}");
        assert_eq!(resp.field("vary"), Some("Accept-Encoding"), "{target}");
    }
}

#[test]
fn precompressed_original_without_accept_encoding_or_with_identity() {
    let dir = precompressed_dir();
    let o = precompressed_origin(&dir, Coding::ALL.to_vec());
    for accept in [None, Some("identity"), Some(""), Some("deflate")] {
        let (status, body, resp) = get_encoded(&o, "/app.js", accept);
        assert_eq!((status, &body[..]), (200, JS), "{accept:?}");
        assert_eq!(resp.field("content-encoding"), None, "{accept:?}");
        assert_eq!(resp.field("vary"), Some("Accept-Encoding"), "{accept:?}");
        let etag = resp.field("etag").unwrap();
        assert!(etag.starts_with(&format!("\"{:x}-", JS.len())) && !etag.ends_with("-br\""));
    }
}

#[test]
fn precompressed_refused_codings_are_not_served() {
    let dir = precompressed_dir();
    let o = precompressed_origin(&dir, Coding::ALL.to_vec());
    for (accept, want, coding) in [
        ("br;q=0, gzip", JS_GZ, Some("gzip")),
        ("br;q=0, gzip;q=0", JS, None),
        ("*;q=0", JS, None),
        ("gzip;q=0, *", JS_BR, Some("br")),
        ("br;q=0, gzip;q=0, *", JS, None),
        ("br;q=nonsense", JS, None),
    ] {
        let (status, body, resp) = get_encoded(&o, "/app.js", Some(accept));
        assert_eq!((status, &body[..]), (200, want), "{accept}");
        assert_eq!(resp.field("content-encoding"), coding, "{accept}");
        assert_eq!(resp.field("vary"), Some("Accept-Encoding"), "{accept}");
    }
}

#[test]
fn precompressed_head_gets_the_siblings_length() {
    let dir = precompressed_dir();
    let o = precompressed_origin(&dir, Coding::ALL.to_vec());
    let req = Req::new(Method::Head, "/app.js").with("Accept-Encoding", "gzip");
    let (status, body, resp) = check(o.handle(&req), true);
    assert_eq!(
        (status, body.len(), resp.content_length),
        (200, 0, Some(JS_GZ.len() as u64))
    );
    assert_eq!(resp.field("content-encoding"), Some("gzip"));
    assert_eq!(resp.field("vary"), Some("Accept-Encoding"));
    let (_, _, get) = get_encoded(&o, "/app.js", Some("gzip"));
    assert_eq!(resp.fields, get.fields, "HEAD has the fields of GET");
    let req = Req::new(Method::Head, "/app.js");
    let resp = o.handle(&req);
    assert_eq!(resp.content_length, Some(JS.len() as u64));
}

#[test]
fn precompressed_ranges_apply_to_the_sibling() {
    let dir = precompressed_dir();
    let o = precompressed_origin(&dir, Coding::ALL.to_vec());
    let gz_len = JS_GZ.len();
    let (_, _, full) = get_encoded(&o, "/app.js", Some("gzip"));
    let gz_tag = full.field("etag").unwrap().to_owned();
    let (_, _, original) = get_encoded(&o, "/app.js", None);
    let js_tag = original.field("etag").unwrap().to_owned();
    let ranged = |range: &str, if_range: Option<&str>| {
        let mut req = Req::get("/app.js")
            .with("Accept-Encoding", "gzip")
            .with("Range", range);
        if let Some(ir) = if_range {
            req = req.with("If-Range", ir);
        }
        check(o.handle(&req), false)
    };
    let (status, body, resp) = ranged("bytes=0-3", None);
    assert_eq!((status, &body[..]), (206, &JS_GZ[..4]));
    assert_eq!(
        resp.field("content-range"),
        Some(&format!("bytes 0-3/{gz_len}")[..])
    );
    assert_eq!(resp.field("content-encoding"), Some("gzip"));
    assert_eq!(resp.field("vary"), Some("Accept-Encoding"));
    assert_eq!(
        resp.field("content-type"),
        Some("text/javascript; charset=utf-8")
    );
    let (status, body, _) = ranged("bytes=-5", None);
    assert_eq!((status, &body[..]), (206, &JS_GZ[gz_len - 5..]));
    // If-Range compares with the sibling's validators.
    let (status, body, _) = ranged("bytes=0-3", Some(&gz_tag));
    assert_eq!((status, &body[..]), (206, &JS_GZ[..4]));
    let (status, body, resp) = ranged("bytes=0-3", Some(&js_tag));
    assert_eq!((status, &body[..]), (200, JS_GZ));
    assert_eq!(resp.field("content-encoding"), Some("gzip"));
    // Past the sibling's end (not the original's): 416 with the sibling's length, no coding
    // on the error text.
    let past = format!("bytes={gz_len}-");
    assert!(gz_len < JS.len());
    let (status, _, resp) = ranged(&past, None);
    assert_eq!(status, 416);
    assert_eq!(
        resp.field("content-range"),
        Some(&format!("bytes */{gz_len}")[..])
    );
    assert_eq!(resp.field("content-encoding"), None);
    assert_eq!(resp.field("vary"), Some("Accept-Encoding"));
    // The original, ranged, when the client accepts no coding.
    let req = Req::get("/app.js").with("Range", "bytes=0-6");
    let (status, body, resp) = check(o.handle(&req), false);
    assert_eq!((status, &body[..]), (206, &JS[..7]));
    assert_eq!(resp.field("content-encoding"), None);
    assert_eq!(resp.field("vary"), Some("Accept-Encoding"));
}

#[test]
fn precompressed_not_modified_uses_the_siblings_etag() {
    let dir = precompressed_dir();
    let o = precompressed_origin(&dir, Coding::ALL.to_vec());
    let (_, _, br) = get_encoded(&o, "/app.js", Some("br"));
    let br_tag = br.field("etag").unwrap().to_owned();
    let br_lm = br.field("last-modified").unwrap().to_owned();
    let (_, _, original) = get_encoded(&o, "/app.js", None);
    let js_tag = original.field("etag").unwrap().to_owned();
    let conditional = |accept: Option<&str>, inm: &str| {
        let mut req = Req::get("/app.js").with("If-None-Match", inm);
        if let Some(a) = accept {
            req = req.with("Accept-Encoding", a);
        }
        check(o.handle(&req), false)
    };
    let (status, body, resp) = conditional(Some("br"), &br_tag);
    assert_eq!((status, body.len()), (304, 0));
    assert_eq!(resp.field("etag"), Some(&br_tag[..]));
    assert_eq!(resp.field("last-modified"), Some(&br_lm[..]));
    assert_eq!(resp.field("vary"), Some("Accept-Encoding"));
    assert_eq!(resp.field("content-encoding"), None);
    // Another variant's tag does not validate this one.
    let (status, body, resp) = conditional(Some("br"), &js_tag);
    assert_eq!((status, &body[..]), (200, JS_BR));
    assert_eq!(resp.field("etag"), Some(&br_tag[..]));
    let (status, body, _) = conditional(None, &br_tag);
    assert_eq!((status, &body[..]), (200, JS));
    let (status, _, _) = conditional(Some("gzip"), &br_tag);
    assert_eq!(status, 200);
    // A cache holding both variants revalidates with both tags.
    let (status, _, resp) = conditional(None, &format!("{br_tag}, {js_tag}"));
    assert_eq!(status, 304);
    assert_eq!(resp.field("etag"), Some(&js_tag[..]));
    assert_eq!(resp.field("vary"), Some("Accept-Encoding"));
}

#[test]
fn precompressed_variants_never_share_an_etag() {
    // Same length and mtime (an archive unpacked in one go): the tags still differ.
    let dir = TempDir::new();
    dir.write("same.txt", b"12345678");
    dir.write("same.txt.gz", b"abcdefgh");
    dir.write("same.txt.br", b"ABCDEFGH");
    let when = std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    for name in ["same.txt", "same.txt.gz", "same.txt.br"] {
        let f = std::fs::File::options()
            .write(true)
            .open(dir.path().join(name))
            .unwrap();
        f.set_modified(when).unwrap();
    }
    let o = precompressed_origin(&dir, Coding::ALL.to_vec());
    let tags: Vec<String> = [None, Some("gzip"), Some("br")]
        .into_iter()
        .map(|a| {
            let (_, _, resp) = get_encoded(&o, "/same.txt", a);
            resp.field("etag").unwrap().to_owned()
        })
        .collect();
    assert_ne!(tags[0], tags[1]);
    assert_ne!(tags[0], tags[2]);
    assert_ne!(tags[1], tags[2]);
}

#[test]
fn precompressed_index_files_too() {
    let dir = precompressed_dir();
    let o = precompressed_origin(&dir, Coding::ALL.to_vec());
    let (status, body, resp) = get_encoded(&o, "/", Some("gzip, br"));
    assert_eq!((status, &body[..]), (200, &b"GZ:index"[..]));
    assert_eq!(resp.field("content-encoding"), Some("gzip"));
    assert_eq!(resp.field("content-type"), Some("text/html; charset=utf-8"));
    assert_eq!(resp.field("vary"), Some("Accept-Encoding"));
    // Redirects and errors are not file responses: no Vary.
    std::fs::create_dir_all(dir.path().join("sub")).unwrap();
    for target in ["/sub", "/sub/", "/missing.js"] {
        let (status, _, resp) = get_encoded(&o, target, Some("gzip"));
        assert!(status == 301 || status == 404, "{target}");
        assert_eq!(resp.field("vary"), None, "{target}");
        assert_eq!(resp.field("content-encoding"), None, "{target}");
    }
}

#[test]
fn precompressed_sibling_symlink_out_of_the_root_is_ignored() {
    #[cfg(unix)]
    {
        let dir = precompressed_dir();
        let outside = TempDir::new();
        outside.write("secret.br", b"secret");
        dir.write("linked.js", b"linked original");
        dir.write("linked.js.gz", b"GZ:linked");
        std::os::unix::fs::symlink(
            outside.path().join("secret.br"),
            dir.path().join("linked.js.br"),
        )
        .unwrap();
        // A sibling symlinked inside the root is fine.
        dir.write("inner.js", b"inner original");
        std::os::unix::fs::symlink(dir.path().join("app.js.br"), dir.path().join("inner.js.br"))
            .unwrap();
        let o = precompressed_origin(&dir, Coding::ALL.to_vec());
        let (status, body, resp) = get_encoded(&o, "/linked.js", Some("br"));
        assert_eq!((status, &body[..]), (200, &b"linked original"[..]));
        assert_eq!(resp.field("content-encoding"), None);
        let (status, body, resp) = get_encoded(&o, "/linked.js", Some("br, gzip"));
        assert_eq!((status, &body[..]), (200, &b"GZ:linked"[..]));
        assert_eq!(resp.field("content-encoding"), Some("gzip"));
        let (status, body, resp) = get_encoded(&o, "/inner.js", Some("br"));
        assert_eq!((status, &body[..]), (200, JS_BR));
        assert_eq!(resp.field("content-encoding"), Some("br"));
    }
}

#[test]
fn precompressed_sibling_asked_for_by_name_is_a_plain_file() {
    let dir = precompressed_dir();
    let o = precompressed_origin(&dir, Coding::ALL.to_vec());
    for accept in [None, Some("gzip, br")] {
        let (status, body, resp) = get_encoded(&o, "/app.js.gz", accept);
        assert_eq!((status, &body[..]), (200, JS_GZ), "{accept:?}");
        assert_eq!(resp.field("content-encoding"), None, "{accept:?}");
        assert_eq!(resp.field("content-type"), Some("application/gzip"));
        let etag = resp.field("etag").unwrap();
        assert!(!etag.ends_with("-gzip\""), "{etag}");
    }
}

#[test]
fn precompressed_is_off_by_default() {
    let dir = precompressed_dir();
    let default = Origin::new(
        Some(dir.path().to_owned()),
        vec!["index.html".into()],
        false,
    );
    let empty = precompressed_origin(&dir, vec![]);
    for o in [&default, &empty] {
        for target in ["/app.js", "/"] {
            let (status, body, resp) = get_encoded(o, target, Some("gzip, br, zstd"));
            assert_eq!(status, 200);
            assert!(!body.starts_with(b"GZ:") && !body.starts_with(b"BR:"));
            assert_eq!(resp.field("content-encoding"), None);
            assert_eq!(resp.field("vary"), None);
        }
    }
    assert!(format!("{default:?}").contains("precompressed: []"));
}

#[test]
fn precompressed_through_a_parsed_head() {
    let dir = precompressed_dir();
    let o = precompressed_origin(&dir, vec![Coding::Br, Coding::Gzip]);
    let limits = portico_http1::Limits::default();
    for (raw, coding, len) in [
        (
            "GET /app.js HTTP/1.1\r\nHost: a\r\nAccept-Encoding:  gzip, deflate, br \r\n\r\n",
            Some(&b"br"[..]),
            JS_BR.len(),
        ),
        (
            "GET /app.js HTTP/1.1\r\nHost: a\r\naccept-encoding: gzip\r\n\r\n",
            Some(b"gzip"),
            JS_GZ.len(),
        ),
        ("GET /app.js HTTP/1.1\r\nHost: a\r\n\r\n", None, JS.len()),
    ] {
        let mut b = bytes::BytesMut::from(raw.as_bytes());
        let req = portico_http1::parse_request(&mut b, &limits)
            .unwrap()
            .unwrap();
        let mut head = bytes::BytesMut::new();
        let reply = o.respond(&req, &mut head);
        portico_http1::encode::end_head(&mut head);
        let parsed = portico_http1::parse_response(&mut head, req.method(), &limits)
            .unwrap()
            .unwrap();
        assert_eq!(reply.status, 200, "{raw}");
        assert_eq!(parsed.field("content-encoding"), coding, "{raw}");
        assert_eq!(parsed.field("vary"), Some(&b"Accept-Encoding"[..]), "{raw}");
        assert_eq!(
            parsed.field("content-length"),
            Some(len.to_string().as_bytes()),
            "{raw}"
        );
        let mut fields = Vec::new();
        o.respond_fields(&req, |n, v| fields.push((n.to_owned(), v.to_vec())));
        let want: Vec<_> = parsed
            .fields()
            .map(|(n, v)| (n.to_owned(), v.to_vec()))
            .collect();
        assert_eq!(fields, want, "{raw}");
    }
}
