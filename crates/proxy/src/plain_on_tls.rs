//! Plain HTTP sent to a TLS listener: told so with a 400 on the plain connection instead of a silent close.

use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// The answer, in plain HTTP.
const ANSWER: &[u8] = b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 59\r\nConnection: close\r\n\r\nThis port speaks HTTPS: the plain HTTP request was refused\n";

/// Whether the connection's first byte begins a plain HTTP request (a TLS record starts with
/// its content type, 0x16 for a handshake, never a letter); then the 400 is written and the
/// connection shut. Waits at most `within` for that byte; the byte stays unread otherwise.
pub(crate) async fn answer_if_plain(stream: &mut TcpStream, within: Duration) -> bool {
    let mut first = [0u8; 1];
    let peeked = tokio::time::timeout(within, stream.peek(&mut first)).await;
    if !matches!(peeked, Ok(Ok(1))) || !first[0].is_ascii_uppercase() {
        return false;
    }
    let _ = tokio::time::timeout(within, stream.write_all(ANSWER)).await;
    let _ = stream.shutdown().await;
    true
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_answer_is_a_whole_response() {
        let mut buf = bytes::BytesMut::from(super::ANSWER);
        let get = portico_http1::Method::Get;
        let (head, body) = match portico_http1::parse_response(&mut buf, &get, &Default::default())
        {
            Ok(Some(h)) => (h, buf),
            other => panic!("{other:?}"),
        };
        assert_eq!(head.status(), 400);
        assert!(!head.keep_alive);
        assert_eq!(
            head.framing,
            portico_http1::Framing::Length(body.len() as u64)
        );
    }
}
