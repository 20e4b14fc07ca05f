//! `--h2`: one HTTP/2 client connection (h2c prior knowledge, or TLS with ALPN h2) shared by the streams of one benchmark connection.

use crate::config::{Config, Target};
use crate::conn::{io_error, open_stream, Opened, Response, Stream, TlsTarget};
use crate::error::BenchError;
use crate::stats::ErrorKind;
use bytes::Bytes;
use h2::client::SendRequest;
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH};
use http::{HeaderMap, Method, Uri};
use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;

/// Stream and connection flow-control windows the client advertises (2^30 - 1, h2load's
/// default): the server is never held back by the client's windows, which are given back as soon
/// as the data is counted.
const WINDOW: u32 = (1 << 30) - 1;

/// Header fields HTTP/2 forbids (connection-specific, RFC 9113 section 8.2.2).
const CONNECTION_SPECIFIC: [&str; 5] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
];

/// The run's request to one URL, built once: each send clones its parts.
#[derive(Debug, Clone)]
pub struct H2Request {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
}

impl H2Request {
    fn to_http(&self) -> http::Request<()> {
        let mut r = http::Request::new(());
        *r.method_mut() = self.method.clone();
        *r.uri_mut() = self.uri.clone();
        *r.headers_mut() = self.headers.clone();
        r
    }
}

fn flag(msg: impl Into<String>) -> BenchError {
    BenchError::Flag(msg.into())
}

/// The run's HTTP/2 requests, one per URL (in the order of the URLs): `:method`, `:scheme`,
/// `:authority` (the URL's, or `-H Host`), `:path`, the `-H` fields, `content-length` when there
/// is a body (or the method usually carries one), the body. Refuses fields HTTP/2 forbids.
pub fn requests(cfg: &Config) -> Result<Vec<H2Request>, BenchError> {
    cfg.targets.iter().map(|t| request_to(cfg, t)).collect()
}

fn request_to(cfg: &Config, target: &Target) -> Result<H2Request, BenchError> {
    let method = Method::from_bytes(cfg.method.as_str().as_bytes()).map_err(|_| {
        flag(format!(
            "--method {}: not an HTTP method",
            cfg.method.as_str()
        ))
    })?;
    let mut authority = target.authority.clone();
    let mut headers = HeaderMap::new();
    for (name, value) in &cfg.headers {
        let lower = name.to_ascii_lowercase();
        if lower == "host" {
            authority = value.clone();
            continue;
        }
        if CONNECTION_SPECIFIC.contains(&lower.as_str())
            || (lower == "te" && !value.eq_ignore_ascii_case("trailers"))
        {
            return Err(flag(format!(
                "-H {name}: a connection-specific field, forbidden in HTTP/2"
            )));
        }
        let n = HeaderName::from_bytes(lower.as_bytes())
            .map_err(|_| flag(format!("-H {name}: not a header name")))?;
        let v = HeaderValue::from_str(value)
            .map_err(|_| flag(format!("-H {name}: {value:?} is not a header value")))?;
        headers.append(n, v);
    }
    let body_method = matches!(cfg.method.as_str(), "POST" | "PUT" | "PATCH");
    if !cfg.body.is_empty() || body_method {
        headers.insert(CONTENT_LENGTH, HeaderValue::from(cfg.body.len() as u64));
    }
    let scheme = if target.tls { "https" } else { "http" };
    let uri = Uri::builder()
        .scheme(scheme)
        .authority(authority.as_str())
        .path_and_query(target.path.as_str())
        .build()
        .map_err(|e| flag(format!("{}: not an HTTP/2 request target: {e}", target.url)))?;
    Ok(H2Request {
        method,
        uri,
        headers,
        body: Bytes::from(cfg.body.clone()),
    })
}

/// An open HTTP/2 connection: the handle streams are opened with, and whether its driver task
/// still runs.
struct Session {
    send: SendRequest<Bytes>,
    alive: Rc<Cell<bool>>,
}

/// One benchmark connection over HTTP/2, shared by its stream tasks (one thread's runtime):
/// opened on demand, and reopened when the server closed it. Its driver is a local task.
pub struct H2Conn {
    addr: SocketAddr,
    tls: Option<TlsTarget>,
    session: RefCell<Option<Session>>,
    /// Held while connecting, so that the streams waiting for a connection share one.
    connecting: tokio::sync::Mutex<()>,
    /// Connections opened and not yet collected by [`H2Conn::take_opened`].
    opened: RefCell<Vec<Opened>>,
}

impl std::fmt::Debug for H2Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H2Conn")
            .field("addr", &self.addr)
            .field("tls", &self.tls.is_some())
            .field("open", &self.live().is_some())
            .finish()
    }
}

impl H2Conn {
    /// A connection to `addr` (TLS with ALPN h2 when `tls` is given, else h2c prior knowledge).
    pub fn new(addr: SocketAddr, tls: Option<&crate::tls::TlsClient>) -> H2Conn {
        H2Conn {
            addr,
            tls: tls.map(|t| (t.for_connection(), t.server_name.clone())),
            session: RefCell::new(None),
            connecting: tokio::sync::Mutex::new(()),
            opened: RefCell::new(Vec::new()),
        }
    }

    /// A connection opened since the last call, if any (for the connection and handshake counts).
    pub fn take_opened(&self) -> Option<Opened> {
        self.opened.borrow_mut().pop()
    }

    /// The handle of the current connection, if it is still up.
    fn live(&self) -> Option<SendRequest<Bytes>> {
        let s = self.session.borrow();
        s.as_ref().filter(|s| s.alive.get()).map(|s| s.send.clone())
    }

    /// Forget the current connection (it failed): the next request opens a new one.
    fn drop_session(&self) {
        self.session.borrow_mut().take();
    }

    /// The current connection's handle, connecting first when there is none (must run on a
    /// `LocalSet`: the connection's driver is a local task).
    pub async fn sender(&self) -> Result<SendRequest<Bytes>, ErrorKind> {
        if let Some(s) = self.live() {
            return Ok(s);
        }
        let _one_at_a_time = self.connecting.lock().await;
        if let Some(s) = self.live() {
            return Ok(s);
        }
        let (stream, opened) = open_stream(self.addr, self.tls.as_ref()).await?;
        if let Stream::Tls(t) = &stream {
            if t.get_ref().1.alpn_protocol() != Some(b"h2") {
                // The server does not speak HTTP/2 over TLS (it chose no protocol, or another).
                return Err(ErrorKind::Tls);
            }
        }
        let (send, connection) = h2::client::Builder::new()
            .initial_window_size(WINDOW)
            .initial_connection_window_size(WINDOW)
            .enable_push(false)
            .handshake::<_, Bytes>(stream)
            .await
            .map_err(h2_error)?;
        let alive = Rc::new(Cell::new(true));
        let flag = alive.clone();
        tokio::task::spawn_local(async move {
            let _ = connection.await;
            flag.set(false);
        });
        *self.session.borrow_mut() = Some(Session {
            send: send.clone(),
            alive,
        });
        self.opened.borrow_mut().push(opened);
        Ok(send)
    }

    /// Send `request` on a new stream (connecting first if needed) and read the response; the
    /// body is counted, not kept. `Response::bytes` counts the DATA payload (headers are HPACK
    /// compressed and not counted). Dropping the future resets the stream (CANCEL).
    pub async fn exchange(&self, request: &H2Request) -> Result<Response, ErrorKind> {
        let send = self.sender().await?;
        let r = exchange_on(send, request).await;
        if let Err(kind) = &r {
            // A failure of the connection, not only of this stream: reconnect next time.
            if !matches!(kind, ErrorKind::Reset | ErrorKind::BadResponse) {
                self.drop_session();
            }
        }
        r
    }
}

async fn exchange_on(send: SendRequest<Bytes>, request: &H2Request) -> Result<Response, ErrorKind> {
    // Waits while the server's concurrent stream limit is reached.
    let mut send = send.ready().await.map_err(h2_error)?;
    let end = request.body.is_empty();
    let (response, mut body_tx) = send
        .send_request(request.to_http(), end)
        .map_err(h2_error)?;
    if !end {
        body_tx
            .send_data(request.body.clone(), true)
            .map_err(h2_error)?;
    }
    let response = response.await.map_err(h2_error)?;
    let status = response.status().as_u16();
    let mut body = response.into_body();
    let mut bytes = 0u64;
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(h2_error)?;
        bytes = bytes.saturating_add(chunk.len() as u64);
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    body.trailers().await.map_err(h2_error)?;
    Ok(Response {
        status,
        bytes,
        reuse: true,
    })
}

/// The error kind of an HTTP/2 failure: the stream reset by the server is `reset`; the connection
/// gone away (the server's GOAWAY) `closed`; a socket error what the socket says; a protocol
/// error (the client's own RST_STREAM or GOAWAY over a malformed response) `bad_response`.
fn h2_error(e: h2::Error) -> ErrorKind {
    if e.is_reset() || e.is_go_away() {
        return match (e.is_remote(), e.is_reset()) {
            (true, true) => ErrorKind::Reset,
            (true, false) => ErrorKind::Closed,
            (false, _) => ErrorKind::BadResponse,
        };
    }
    match e.into_io() {
        Some(io) => io_error(io),
        None => ErrorKind::BadResponse,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Flags;

    fn cfg(f: Flags) -> Result<Config, BenchError> {
        Config::from_flags(&Flags {
            url: "http://127.0.0.1:8081/p?q=1".into(),
            rate: Some(1.0),
            h2: true,
            ..f
        })
    }

    #[test]
    fn requests_carry_the_pseudo_fields_and_headers() {
        let c = cfg(Flags {
            method: "POST".into(),
            headers: vec!["Host: example:9".into(), "X-A: 1".into()],
            body: Some("hello".into()),
            ..Flags::default()
        })
        .unwrap();
        let r = requests(&c).unwrap();
        let h = r[0].to_http();
        assert_eq!(h.method(), Method::POST);
        assert_eq!(h.uri().to_string(), "http://example:9/p?q=1");
        assert_eq!(h.headers()["x-a"], "1");
        assert_eq!(h.headers()["content-length"], "5");
        assert!(h.headers().get("host").is_none());
        assert_eq!(&r[0].body[..], b"hello");
        let c = cfg(Flags::default()).unwrap();
        let h = requests(&c).unwrap()[0].to_http();
        assert_eq!(h.uri().to_string(), "http://127.0.0.1:8081/p?q=1");
        assert!(h.headers().is_empty());
    }

    #[test]
    fn connection_specific_fields_are_refused() {
        for bad in [
            "Connection: keep-alive",
            "Upgrade: h2c",
            "TE: gzip",
            "Keep-Alive: 5",
        ] {
            let e = cfg(Flags {
                headers: vec![bad.into()],
                ..Flags::default()
            })
            .unwrap_err();
            assert!(e.to_string().contains("forbidden in HTTP/2"), "{bad}: {e}");
        }
        assert!(cfg(Flags {
            headers: vec!["TE: trailers".into()],
            ..Flags::default()
        })
        .is_ok());
    }

    #[test]
    fn errors_map_to_kinds() {
        assert_eq!(
            h2_error(h2::Error::from(h2::Reason::PROTOCOL_ERROR)),
            ErrorKind::BadResponse
        );
    }
}
