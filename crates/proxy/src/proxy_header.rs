//! The PROXY protocol header a load balancer sends before a connection's own bytes: read without taking one of them.

use portico_http1::proxy_protocol::{parse, Header, MAX_HEADER};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// Read the connection's PROXY header, within `within`. The bytes are peeked, and taken only
/// as far as they are the header's: a whole header takes exactly its bytes (TLS or HTTP starts
/// at the connection's own first byte); a part of one is taken whole (it is all header), so
/// the next peek waits for new bytes instead of returning the same ones.
pub(crate) async fn read(stream: &mut TcpStream, within: Duration) -> Result<Header, String> {
    let deadline = tokio::time::Instant::now() + within;
    let mut buf = vec![0u8; MAX_HEADER];
    let mut have = 0;
    loop {
        let n = tokio::time::timeout_at(deadline, stream.peek(&mut buf[have..]))
            .await
            .map_err(|_| "no whole PROXY header in time".to_string())?
            .map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("closed before its PROXY header".to_string());
        }
        let (take, done) = match parse(&buf[..have + n]).map_err(|e| e.to_string())? {
            Some((header, used)) => (used - have, Some(header)),
            None => (n, None),
        };
        let end = have + take;
        while have < end {
            let r = tokio::time::timeout_at(deadline, stream.read(&mut buf[have..end]))
                .await
                .map_err(|_| "no whole PROXY header in time".to_string())?
                .map_err(|e| e.to_string())?;
            if r == 0 {
                return Err("closed inside its PROXY header".to_string());
            }
            // Peeked bytes are there: one read takes them, but a short read is not an error.
            have += r;
        }
        if let Some(header) = done {
            return Ok(header);
        }
        if have >= buf.len() {
            return Err("a PROXY header longer than its bound".to_string());
        }
    }
}
