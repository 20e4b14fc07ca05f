//! A small blocking HTTP/1.0 client for the control plane's own fetches (JWK sets, OTLP exports): one request per connection, plain or TLS against the system's roots, everything within one deadline.

use portico_config::HttpUrl;
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_rustls::rustls::ClientConfig;

/// A response: its status and body (to `Content-Length` when the head gives one).
#[derive(Debug)]
pub(crate) struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

/// [`request`] on a thread of its own, waited for at most `timeout` and a second: a name lookup
/// that hangs is left to end by itself, and the caller goes on.
pub(crate) fn request_bounded(
    url: HttpUrl,
    method: &'static str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
    timeout: Duration,
    max_body: usize,
) -> Result<Answer, String> {
    request_bounded_with(url, method, headers, body, timeout, max_body, None)
}

/// [`request_bounded`], over TLS with `tls` (a CA, a client certificate) for an `https` URL
/// when given, else against the system's roots.
pub(crate) fn request_bounded_with(
    url: HttpUrl,
    method: &'static str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
    timeout: Duration,
    max_body: usize,
    tls: Option<Arc<ClientConfig>>,
) -> Result<Answer, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let host = url.host.clone();
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    std::thread::Builder::new()
        .name("portico-fetch".into())
        .spawn(move || {
            let headers: Vec<(&str, &str)> = headers
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect();
            let _ = tx.send(request_with(
                &url,
                method,
                &headers,
                &body,
                timeout,
                max_body,
                tls.as_ref(),
            ));
        })
        .map_err(|e| format!("cannot start a fetch thread: {e}"))?;
    rx.recv_timeout(timeout + Duration::from_secs(1))
        .unwrap_or_else(|_| Err(format!("{host}: no answer within {timeout:?}")))
}

/// One HTTP/1.0 request (so the answer is never chunked and ends with the connection), with
/// `Content-Length` when there is a body, within `timeout` from the first lookup to the last
/// byte; answers larger than `max_body` are an error.
pub(crate) fn request(
    url: &HttpUrl,
    method: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
    max_body: usize,
) -> Result<Answer, String> {
    request_with(url, method, headers, body, timeout, max_body, None)
}

/// [`request`], with `tls` for an `https` URL when given.
fn request_with(
    url: &HttpUrl,
    method: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
    max_body: usize,
    tls: Option<&Arc<ClientConfig>>,
) -> Result<Answer, String> {
    use std::net::ToSocketAddrs;
    let deadline = Instant::now() + timeout;
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let addrs: Vec<_> = (url.host.as_str(), url.port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {}: {e}", url.host))?
        .collect();
    let mut last = format!("{} has no address", url.host);
    let mut tcp = None;
    for a in addrs {
        match std::net::TcpStream::connect_timeout(&a, left()) {
            Ok(s) => {
                tcp = Some(s);
                break;
            }
            Err(e) => last = format!("cannot connect to {a}: {e}"),
        }
    }
    let tcp = tcp.ok_or(last)?;
    tcp.set_read_timeout(Some(left()))
        .map_err(|e| e.to_string())?;
    tcp.set_write_timeout(Some(left()))
        .map_err(|e| e.to_string())?;
    // Each read waits at most what is left of the request's time.
    let ctl = tcp.try_clone().map_err(|e| e.to_string())?;
    let before_read = || -> std::io::Result<()> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        ctl.set_read_timeout(Some(left))
    };
    let mut head = format!(
        "{method} {} HTTP/1.0\r\nHost: {}\r\nUser-Agent: portico\r\n",
        url.target,
        url.authority()
    );
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" || method == "PUT" {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    let mut wire = head.into_bytes();
    wire.extend_from_slice(body);
    let mut answer = Vec::new();
    let io = |e: std::io::Error| format!("{}: {e}", url.host);
    let limit = max_body + 16 * 1024;
    if url.https {
        let mut conn = match tls {
            Some(config) => tls_session(config.clone(), &url.host)?,
            None => tls_client(&url.host)?,
        };
        let mut tcp = tcp;
        let mut s = tokio_rustls::rustls::Stream::new(&mut conn, &mut tcp);
        s.write_all(&wire).map_err(io)?;
        read_answer(&mut s, &mut answer, limit, &before_read).map_err(io)?;
    } else {
        let mut tcp = tcp;
        tcp.write_all(&wire).map_err(io)?;
        read_answer(&mut tcp, &mut answer, limit, &before_read).map_err(io)?;
    }
    parse_answer(&answer, max_body)
}

/// Read the answer: to its `Content-Length` when the head gives one, else until the server
/// closes (a TLS close without close_notify ends it too), at most `limit` bytes.
/// `before_read` runs before each read (it bounds the wait, or ends the answer with an error).
fn read_answer(
    r: &mut impl Read,
    out: &mut Vec<u8>,
    limit: usize,
    before_read: &dyn Fn() -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut chunk = [0u8; 16 * 1024];
    while out.len() < limit && !complete(out) {
        before_read()?;
        match r.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !out.is_empty() => break,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Whether `answer` holds a whole head with a `Content-Length` and that many body bytes.
fn complete(answer: &[u8]) -> bool {
    let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&answer[..end]);
    let length = head.split("\r\n").find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse::<usize>().ok())?
    });
    length.is_some_and(|n| answer.len() >= end + 4 + n)
}

/// A TLS client session to `host` with `config`.
pub(crate) fn tls_session(
    config: Arc<ClientConfig>,
    host: &str,
) -> Result<tokio_rustls::rustls::ClientConnection, String> {
    let name = tokio_rustls::rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| format!("{host}: {e}"))?;
    tokio_rustls::rustls::ClientConnection::new(config, name).map_err(|e| e.to_string())
}

/// A TLS client session to `host`, verified against the system's roots.
fn tls_client(host: &str) -> Result<tokio_rustls::rustls::ClientConnection, String> {
    let settings = portico_config::UpstreamTls {
        ca_file: None,
        server_name: Some(host.to_string()),
        certificate: None,
        verify: true,
        versions: vec![
            portico_config::TlsVersion::Tls12,
            portico_config::TlsVersion::Tls13,
        ],
        session_cache: 0,
    };
    let o = portico_tls::client_config(&settings, &portico_tls::ClientSessions::new(0))
        .map_err(|e| e.to_string())?;
    let name = tokio_rustls::rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| format!("{host}: {e}"))?;
    tokio_rustls::rustls::ClientConnection::new(o.config, name).map_err(|e| e.to_string())
}

/// The status and body of an answer (to `Content-Length` when it says; a chunked answer is
/// refused, as this client cannot read one).
fn parse_answer(answer: &[u8], max_body: usize) -> Result<Answer, String> {
    let end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("the answer has no complete head")?;
    let head = std::str::from_utf8(&answer[..end]).map_err(|_| "the answer's head is not text")?;
    let mut lines = head.split("\r\n");
    let line = lines.next().unwrap_or_default();
    let status = line
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.split(' ').nth(1))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| format!("answered {line:?}"))?;
    let mut body = &answer[end + 4..];
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(format!("a {value} answer (only Content-Length is read)"));
        }
        if name.eq_ignore_ascii_case("content-length") {
            let n: usize = value.parse().map_err(|_| "a bad Content-Length")?;
            body = body
                .get(..n)
                .ok_or("the answer ended before its Content-Length")?;
        }
    }
    if body.len() > max_body {
        return Err(format!("the answer is larger than {max_body} bytes"));
    }
    Ok(Answer {
        status,
        body: body.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_with_a_length_is_complete_without_the_close() {
        assert!(!complete(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{"));
        assert!(complete(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"));
        assert!(!complete(b"HTTP/1.1 200 OK\r\n\r\n{}"));
        let mut out = Vec::new();
        let mut r = &b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nxyz"[..];
        read_answer(&mut r, &mut out, 1 << 20, &|| Ok(())).unwrap();
        assert_eq!(parse_answer(&out, 10).unwrap().body, b"x");
    }

    #[test]
    fn a_trickled_answer_ends_when_its_time_is_up() {
        // A reader that hands one byte per read and never ends.
        struct Trickle;
        impl Read for Trickle {
            fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
                b[0] = b'x';
                Ok(1)
            }
        }
        let reads = std::cell::Cell::new(0);
        let mut out = Vec::new();
        let e = read_answer(&mut Trickle, &mut out, 1 << 20, &|| {
            reads.set(reads.get() + 1);
            match reads.get() > 100 {
                true => Err(std::io::ErrorKind::TimedOut.into()),
                false => Ok(()),
            }
        })
        .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert_eq!(out.len(), 100);
    }

    #[test]
    fn status_and_body_are_taken_to_the_length() {
        let a = parse_answer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}xx", 10).unwrap();
        assert_eq!((a.status, &a.body[..]), (200, &b"{}"[..]));
        let a = parse_answer(b"HTTP/1.0 200 OK\r\n\r\n{\"keys\":[]}", 100).unwrap();
        assert_eq!(a.body, b"{\"keys\":[]}");
        assert_eq!(
            parse_answer(b"HTTP/1.1 404 Not Found\r\n\r\n", 10)
                .unwrap()
                .status,
            404
        );
        assert!(parse_answer(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}",
            10
        )
        .is_err());
        assert!(parse_answer(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}", 10).is_err());
        assert!(parse_answer(b"HTTP/1.1 200 OK\r\n", 10).is_err());
        assert!(parse_answer(b"HTTP/1.1 200 OK\r\n\r\n0123456789a", 10).is_err());
        assert!(parse_answer(b"SSH-2.0\r\n\r\n", 10).is_err());
    }
}
