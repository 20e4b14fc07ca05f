//! Static file serving under a root: safe path mapping, directories, MIME, conditionals, ranges.

use crate::path::{self, PathError};
use crate::range::{self, RangeRequest};
use crate::response::Response;
use crate::validators::Validators;
use crate::RequestView;
use portico_http1::coding::{self, Coding};
use portico_http1::Method;
use std::ffi::OsString;
use std::fs::{self, File, Metadata};
use std::io;
use std::path::{Path, PathBuf};

const ALLOW: &str = "GET, HEAD";

/// The configured root and, if it existed at startup, its canonical form.
#[derive(Debug, Clone)]
pub(crate) struct Root {
    pub configured: PathBuf,
    canonical: Option<PathBuf>,
}

impl Root {
    pub fn new(configured: PathBuf) -> Self {
        let canonical = fs::canonicalize(&configured).ok();
        Root {
            configured,
            canonical,
        }
    }

    /// The canonical root; re-resolved per request if it did not exist at startup.
    fn canonical(&self) -> io::Result<PathBuf> {
        match &self.canonical {
            Some(c) => Ok(c.clone()),
            None => fs::canonicalize(&self.configured),
        }
    }
}

/// Serve `req` from the files under `root`; `precompressed` (empty = off) are the codings whose
/// siblings (`app.js.br`) may stand in for a file, in the server's preference.
pub(crate) fn serve(
    root: &Root,
    index: &[String],
    precompressed: &[Coding],
    req: &impl RequestView,
) -> Response {
    let method = req.method();
    if !matches!(method, Method::Get | Method::Head) {
        return Response::method_not_allowed(ALLOW);
    }
    let decoded = match path::decode(req.path()) {
        Ok(d) => d,
        Err(PathError::Malformed | PathError::Traversal) => {
            return Response::text(400, "bad path\n")
        }
        Err(PathError::TooLong) => return not_found(),
    };
    let root_dir = match root.canonical() {
        Ok(r) => r,
        Err(e) => return io_error(&e),
    };
    let mut candidate = root_dir.clone();
    candidate.extend(&decoded.segments);
    let (real, meta) = match resolve(&root_dir, &candidate) {
        Ok(found) => found,
        Err(resp) => return resp,
    };
    if meta.is_dir() {
        if !decoded.trailing_slash {
            return redirect_to_slash(req.path(), req.query());
        }
        return serve_index(&root_dir, &real, index, precompressed, req);
    }
    if !meta.is_file() || decoded.trailing_slash {
        // Devices, FIFOs, sockets (opening a FIFO would block); `/file.txt/` names no directory.
        return not_found();
    }
    serve_file(&root_dir, &real, &candidate, precompressed, req)
}

/// Canonicalize `candidate` and check it stays under `root_dir` (symlinks escaping the root
/// are refused as not found, revealing nothing about the outside).
fn resolve(root_dir: &Path, candidate: &Path) -> Result<(PathBuf, Metadata), Response> {
    let real = fs::canonicalize(candidate).map_err(|e| io_error(&e))?;
    if !real.starts_with(root_dir) {
        return Err(not_found());
    }
    let meta = fs::metadata(&real).map_err(|e| io_error(&e))?;
    Ok((real, meta))
}

/// A directory asked for with a trailing slash: its first existing index file, else 404
/// (no listings).
fn serve_index(
    root_dir: &Path,
    dir: &Path,
    index: &[String],
    precompressed: &[Coding],
    req: &impl RequestView,
) -> Response {
    for name in index {
        let candidate = dir.join(name);
        match resolve(root_dir, &candidate) {
            Ok((real, meta)) if meta.is_file() => {
                return serve_file(root_dir, &real, &candidate, precompressed, req)
            }
            Ok(_) => continue,
            Err(resp) if resp.status == 403 => return resp,
            Err(_) => continue,
        }
    }
    not_found()
}

/// 301 to the same path with a slash appended (query kept). Leading slashes are collapsed so
/// `//evil.example/dir` cannot become a protocol-relative redirect off site.
fn redirect_to_slash(raw_path: &str, query: Option<&str>) -> Response {
    let mut location = String::with_capacity(raw_path.len() + 2 + query.map_or(0, |q| q.len() + 1));
    location.push('/');
    location.push_str(raw_path.trim_start_matches('/'));
    location.push('/');
    if let Some(q) = query {
        location.push('?');
        location.push_str(q);
    }
    Response::text(301, "moved permanently\n").with_field("Location", location)
}

/// Serve one regular file: `real` (canonical, under `root_dir`) is opened, or the precompressed
/// sibling of it the request negotiates; `named` (the path as requested) picks the MIME type.
fn serve_file(
    root_dir: &Path,
    real: &Path,
    named: &Path,
    precompressed: &[Coding],
    req: &impl RequestView,
) -> Response {
    let (file, meta, coding) = match sibling(root_dir, real, precompressed, req) {
        Some((file, meta, c)) => (file, meta, Some(c)),
        None => match open_regular(real) {
            Ok((file, meta)) => (file, meta, None),
            Err(e) => return e,
        },
    };
    let len = meta.len();
    let mut validators = Validators::new(len, meta.modified().ok());
    if let Some(c) = coding {
        validators = validators.for_coding(c);
    }
    let last_modified = validators.last_modified_value();
    let vary = !precompressed.is_empty();

    let with_validators = |mut resp: Response| {
        resp = resp.with_field("ETag", validators.etag.clone());
        if let Some(lm) = &last_modified {
            resp = resp.with_field("Last-Modified", lm.clone());
        }
        if vary {
            // The answer depends on Accept-Encoding whichever variant it is, so caches keep
            // them apart (304 included, RFC 9110 15.4.5).
            resp = resp.with_field("Vary", "Accept-Encoding");
        }
        resp
    };

    if validators.not_modified(req.field("if-none-match"), req.field("if-modified-since")) {
        return with_validators(Response::new(304));
    }

    let mut wanted = RangeRequest::Ignore;
    // Range applies to GET only (RFC 9110 14.2); If-Range that does not match means "send it all".
    if *req.method() == Method::Get {
        if let Some(r) = req.field("range") {
            if req
                .field("if-range")
                .is_none_or(|ir| validators.if_range_matches(ir))
            {
                wanted = range::parse(r, len);
            }
        }
    }

    // The content's fields; Content-Encoding describes the bytes of the selected variant, so it
    // goes on 200 and 206, not on the 416 text or a 304 (which carries no content).
    let content = |resp: Response| {
        let resp = resp.with_field("Content-Type", content_type(named));
        let resp = match coding {
            Some(c) => resp.with_field("Content-Encoding", c.token()),
            None => resp,
        };
        resp.with_field("Accept-Ranges", "bytes")
    };
    match wanted {
        RangeRequest::Unsatisfiable => with_validators(
            Response::text(416, "range not satisfiable\n")
                .with_field("Content-Range", format!("bytes */{len}")),
        ),
        RangeRequest::Satisfiable { start, end } => content(with_validators(Response::new(206)))
            .with_field("Content-Range", format!("bytes {start}-{end}/{len}"))
            .with_file(file, start, end - start + 1),
        RangeRequest::Ignore => {
            content(with_validators(Response::new(200))).with_file(file, 0, len)
        }
    }
}

/// Open `path` and check, on the opened handle, that it is a regular file (so its metadata
/// describes what will be sent).
fn open_regular(path: &Path) -> Result<(File, Metadata), Response> {
    let file = File::open(path).map_err(|e| io_error(&e))?;
    match file.metadata() {
        Ok(m) if m.is_file() => Ok((file, m)),
        Ok(_) => Err(not_found()),
        Err(e) => Err(io_error(&e)),
    }
}

/// The precompressed sibling of `real` to serve instead of it: the coding negotiated from
/// Accept-Encoding among `precompressed`; when its sibling is missing (or not a readable regular
/// file, or a symlink out of `root_dir`), the client's next acceptable coding, and so on. None
/// when the feature is off, the client accepts none, or no acceptable sibling exists.
fn sibling(
    root_dir: &Path,
    real: &Path,
    precompressed: &[Coding],
    req: &impl RequestView,
) -> Option<(File, Metadata, Coding)> {
    if precompressed.is_empty() {
        return None;
    }
    let accept = req.field("accept-encoding");
    let mut offered = precompressed.to_vec();
    while let Some(c) = coding::negotiate(accept, &offered) {
        let mut name = OsString::from(real.as_os_str());
        name.push(c.extension());
        // Checked before opening: opening a FIFO would block.
        if let Ok((sib, meta)) = resolve(root_dir, Path::new(&name)) {
            if meta.is_file() {
                if let Ok((file, meta)) = open_regular(&sib) {
                    return Some((file, meta, c));
                }
            }
        }
        offered.retain(|&o| o != c);
    }
    None
}

/// MIME type by extension; text types get `charset=utf-8`.
fn content_type(path: &Path) -> String {
    let mime = mime_guess::from_path(path).first_or_octet_stream();
    if mime.type_() == mime_guess::mime::TEXT && mime.get_param(mime_guess::mime::CHARSET).is_none()
    {
        format!("{}; charset=utf-8", mime.essence_str())
    } else {
        mime.to_string()
    }
}

fn not_found() -> Response {
    Response::text(404, "not found\n")
}

fn io_error(e: &io::Error) -> Response {
    match e.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory => not_found(),
        io::ErrorKind::PermissionDenied => Response::text(403, "forbidden\n"),
        _ => Response::text(500, "internal error\n"),
    }
}
