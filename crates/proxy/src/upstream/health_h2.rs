//! Active `http` health probes of `protocol = "h2"` groups: the check's request over HTTP/2 (h2c prior knowledge, or TLS with ALPN h2) with the `h2` client.

use crate::upstream::tls::UpStream;
use bytes::Bytes;
use portico_config::HttpCheck;
use portico_http1::Limits;
use std::net::SocketAddr;

/// At most this much of a probe response body is read when looking for `expect_body`.
pub const MAX_PROBE_BODY: usize = 64 * 1024;

/// One HTTP/2 request on `stream` (already connected, TLS done for an HTTPS group): the same
/// status and body expectations as the HTTP/1.1 probe. The caller bounds it by the check's
/// timeout.
pub(crate) async fn probe(
    stream: UpStream,
    addr: SocketAddr,
    check: &HttpCheck,
    https: bool,
) -> Result<String, String> {
    if let UpStream::Tls(s) = &stream {
        if s.get_ref().1.alpn_protocol() != Some(b"h2") {
            return Err("TLS handshake: the server did not select ALPN h2".to_string());
        }
    }
    let (send, mut conn) = h2::client::Builder::new()
        .enable_push(false)
        .max_header_list_size(Limits::default().max_head_bytes as u32)
        .handshake::<_, Bytes>(stream)
        .await
        .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
    let host = check.host.clone().unwrap_or_else(|| addr.to_string());
    let scheme = if https { "https" } else { "http" };
    let req = http::Request::builder()
        .method(check.method.as_str())
        .uri(format!("{scheme}://{host}{}", check.path))
        .header("user-agent", "portico-health")
        .header("accept", "*/*")
        .body(())
        .map_err(|e| format!("invalid probe request: {e}"))?;
    let exchange = async move {
        let mut send = send.ready().await.map_err(|e| format!("HTTP/2: {e}"))?;
        let (resp, _) = send
            .send_request(req, true)
            .map_err(|e| format!("HTTP/2: {e}"))?;
        let resp = resp.await.map_err(|e| format!("HTTP/2 response: {e}"))?;
        judge(resp, check).await
    };
    // The connection is driven alongside the exchange; dropped with it when the probe is done.
    tokio::select! {
        biased;
        r = exchange => r,
        r = &mut conn => Err(match r {
            Ok(()) => "HTTP/2 connection closed before a response".to_string(),
            Err(e) => format!("HTTP/2 connection: {e}"),
        }),
    }
}

/// The check's verdict on a response: its status in range and, when asked, `expect_body` in
/// the first [`MAX_PROBE_BODY`] bytes.
async fn judge(resp: http::Response<h2::RecvStream>, check: &HttpCheck) -> Result<String, String> {
    let status = resp.status().as_u16();
    let (lo, hi) = check.expect_status;
    if !(lo..=hi).contains(&status) {
        return Err(format!("HTTP/2 {status}, expected {lo}-{hi}"));
    }
    let Some(expected) = &check.expect_body else {
        return Ok(format!("HTTP/2 {status}"));
    };
    let mut body = resp.into_body();
    let mut got: Vec<u8> = Vec::new();
    let found = |b: &[u8]| {
        b.windows(expected.len().max(1))
            .any(|w| w == expected.as_bytes())
    };
    while let Some(d) = body.data().await {
        let d = d.map_err(|e| format!("HTTP/2 body: {e}"))?;
        let _ = body.flow_control().release_capacity(d.len());
        let room = MAX_PROBE_BODY.saturating_sub(got.len());
        got.extend_from_slice(&d[..d.len().min(room)]);
        if found(&got) {
            return Ok(format!("HTTP/2 {status}, body matched"));
        }
        if got.len() >= MAX_PROBE_BODY {
            break;
        }
    }
    Err(format!(
        "HTTP/2 {status}, body does not contain {expected:?} (first {} bytes read)",
        got.len()
    ))
}
