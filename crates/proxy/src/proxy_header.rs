//! The PROXY protocol header a load balancer sends before a connection's own bytes: read without taking one of them.

use portico_http1::proxy_protocol::{parse, Header, MAX_HEADER};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// How long to wait before looking again at a header that arrived in parts.
const AGAIN: Duration = Duration::from_millis(2);

/// Read the connection's PROXY header, within `within`: the bytes are peeked until the header
/// is whole, then exactly its bytes are read, so TLS or HTTP starts at the connection's own
/// first byte.
pub(crate) async fn read(stream: &mut TcpStream, within: Duration) -> Result<Header, String> {
    let deadline = tokio::time::Instant::now() + within;
    let mut buf = vec![0u8; MAX_HEADER];
    loop {
        let n = tokio::time::timeout_at(deadline, stream.peek(&mut buf))
            .await
            .map_err(|_| "no whole PROXY header in time".to_string())?
            .map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("closed before its PROXY header".to_string());
        }
        match parse(&buf[..n]).map_err(|e| e.to_string())? {
            Some((header, used)) => {
                stream
                    .read_exact(&mut buf[..used])
                    .await
                    .map_err(|e| e.to_string())?;
                return Ok(header);
            }
            // Part of a header: the rest is on its way (peek would return the same bytes at
            // once, so wait a little first).
            None => {
                if tokio::time::Instant::now() + AGAIN > deadline {
                    return Err("no whole PROXY header in time".to_string());
                }
                tokio::time::sleep(AGAIN).await;
            }
        }
    }
}
