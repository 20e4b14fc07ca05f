//! The origin handler: static files and synthetic responses for the benchmark backend and `static` routes.

mod files;
mod path;
mod range;
mod response;
mod synthetic;
mod validators;

#[cfg(test)]
mod tests;

use bytes::{Bytes, BytesMut};
use portico_http1::{Coding, Method, RequestHead};
use response::Response;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// What the caller sends after the head [`Origin::respond`] wrote.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: Body,
    /// The caller sleeps this long before writing the response (synthetic `delay=`).
    pub delay: Option<Duration>,
}

/// A response body; its length always equals the Content-Length written into the head.
#[derive(Debug)]
pub enum Body {
    Empty,
    Bytes(Bytes),
    /// `len` bytes of `file` starting at `offset` (the caller seeks and streams them).
    File {
        file: std::fs::File,
        offset: u64,
        len: u64,
    },
}

/// A static-file and synthetic-response handler (sync, sans-socket; the connection loop calls it).
///
/// Dispatch: with `synthetic`, `/bytes/N` and any request whose query has `size=`, `delay=` or
/// `status=` get a synthetic answer; otherwise, with a `root`, the static file server answers;
/// otherwise, with `synthetic`, `/` is a small text page describing the endpoints; anything else
/// is 404.
pub struct Origin {
    root: Option<files::Root>,
    index: Vec<String>,
    /// Codings whose precompressed siblings may be served, in the server's preference.
    precompressed: Vec<Coding>,
    synthetic: bool,
    /// One 1 MiB pattern buffer, sliced (no copy) for synthetic bodies up to its size.
    pattern: Bytes,
}

impl fmt::Debug for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Origin")
            .field("root", &self.root.as_ref().map(|r| &r.configured))
            .field("index", &self.index)
            .field("precompressed", &self.precompressed)
            .field("synthetic", &self.synthetic)
            .finish()
    }
}

/// What the handler needs from a request head; implemented by [`RequestHead`] and by test doubles
/// so the logic is testable without the parser.
pub(crate) trait RequestView {
    fn method(&self) -> &Method;
    /// Path of the target, before `?`, still percent-encoded.
    fn path(&self) -> &str;
    fn query(&self) -> Option<&str>;
    /// First field with this name (ASCII case-insensitive), value trimmed.
    fn field(&self, name: &str) -> Option<&[u8]>;
}

impl RequestView for RequestHead {
    fn method(&self) -> &Method {
        RequestHead::method(self)
    }
    fn path(&self) -> &str {
        RequestHead::path(self)
    }
    fn query(&self) -> Option<&str> {
        RequestHead::query(self)
    }
    fn field(&self, name: &str) -> Option<&[u8]> {
        RequestHead::field(self, name)
    }
}

impl Origin {
    /// `root`: static files directory (None = synthetic only); `index`: index file names tried
    /// for directories; `synthetic`: answer `/bytes/N` and `?size=` requests.
    pub fn new(root: Option<PathBuf>, index: Vec<String>, synthetic: bool) -> Self {
        Origin {
            root: root.map(files::Root::new),
            index,
            precompressed: Vec::new(),
            synthetic,
            pattern: synthetic::pattern(),
        }
    }

    /// Serve precompressed siblings of static files (nginx `gzip_static`, Caddy
    /// `precompressed`): for a file `app.js`, the sibling `app.js.br` (`.zst`, `.gz`; see
    /// [`Coding::extension`]) of the coding negotiated from the request's `Accept-Encoding`,
    /// with `Content-Encoding` set, the original's Content-Type, and the sibling's own
    /// validators and length (ranges and conditionals apply to the sibling's bytes). A coding
    /// whose sibling is missing falls back to the client's next acceptable one; with none, the
    /// original is served. Every file response then carries `Vary: Accept-Encoding`.
    ///
    /// `codings` is in the server's order of preference (it breaks ties between equal client
    /// weights); empty (the default) turns the feature off.
    pub fn with_precompressed(mut self, codings: Vec<Coding>) -> Self {
        self.precompressed = codings;
        self
    }

    /// Write the status line and response header fields (not the final empty line, not Date,
    /// not Connection: the caller adds those) for this request into `out`, and return the body
    /// to send. The head always frames the body exactly: Content-Length equals the body length,
    /// except for HEAD (the length a GET would get, with an empty body) and 204/304 (no
    /// Content-Length, empty body).
    pub fn respond(&self, req: &RequestHead, out: &mut BytesMut) -> Reply {
        self.handle(req).encode(out)
    }

    /// The same answer for a client that does not take HTTP/1 bytes (an HTTP/2 stream):
    /// `field` gets each header field in order (names as written, Content-Length last when
    /// there is one), and the status and body come back.
    pub fn respond_fields(&self, req: &RequestHead, field: impl FnMut(&str, &[u8])) -> Reply {
        self.handle(req).fields_to(field)
    }

    pub(crate) fn handle(&self, req: &impl RequestView) -> Response {
        let resp = self.dispatch(req);
        if *req.method() == Method::Head {
            resp.without_body()
        } else {
            resp
        }
    }

    fn dispatch(&self, req: &impl RequestView) -> Response {
        let path = req.path();
        if self.synthetic {
            let size_in_path = path.strip_prefix("/bytes/");
            let query = req.query().map(synthetic::Query::parse);
            if size_in_path.is_some() || query.as_ref().is_some_and(|q| q.any()) {
                return synthetic::respond(req.method(), size_in_path, query, &self.pattern);
            }
        }
        if let Some(root) = &self.root {
            return files::serve(root, &self.index, &self.precompressed, req);
        }
        if self.synthetic && path == "/" {
            return synthetic::index_page(req.method());
        }
        Response::text(404, "not found\n")
    }
}
