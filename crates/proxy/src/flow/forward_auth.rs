//! Forward auth: an auth service asked about each request before its action (2xx: it passes, with fields copied from the answer; else the service's answer goes to the client), passes cached per credential.

use crate::downstream::{Env, Who};
use crate::error::ProxyError;
use crate::filter::auth::PassCache;
use crate::flow::exchange_h1::{final_head, write_within};
use bytes::{Bytes, BytesMut};
use portico_config::ForwardAuth;
use portico_http1::{encode, BodyDecoder, Decoded, Method, RequestHead};
use std::time::Instant;
use tokio::io::AsyncReadExt;
use tokio::time::timeout;

/// The most of an auth service's refusal body passed to the client.
const MAX_BODY: usize = 64 * 1024;
/// Most passes remembered per route; a full cache is emptied.
const CACHE_MAX: usize = 10_000;

/// The fields of the auth service's refusal passed to the client with its status and body.
const ANSWER_FIELDS: [&str; 4] = ["location", "www-authenticate", "set-cookie", "content-type"];

/// What the auth service said.
pub(crate) enum Verdict {
    /// The request passes, with these fields set on the forwarded request.
    Pass(Vec<(usize, String)>),
    /// The client gets this answer instead.
    Answer {
        status: u16,
        fields: Vec<(String, String)>,
        body: Bytes,
    },
    /// The auth service could not be asked (and the route does not fail open).
    Unavailable(ProxyError),
}

/// Ask the route's auth service about `head`.
pub(crate) async fn check(
    env: &Env<'_>,
    fa: &ForwardAuth,
    cache: &PassCache,
    head: &RequestHead,
    who: &WhoOwned,
) -> Verdict {
    let key = credential(fa, head);
    let now = Instant::now();
    if let (Some(k), false) = (&key, fa.cache.is_zero()) {
        if let Ok(c) = cache.passes.lock() {
            if let Some((at, fields)) = c.get(k) {
                if now.duration_since(*at) < fa.cache {
                    return Verdict::Pass(fields.clone());
                }
            }
        }
    }
    env.shared
        .stats
        .forward_auth_calls
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let verdict = match ask(env, fa, head, who).await {
        Ok(v) => v,
        Err(e) if fa.fail_open => {
            tracing::warn!("forward auth unavailable, failing open: {e}");
            Verdict::Pass(Vec::new())
        }
        Err(e) => Verdict::Unavailable(e),
    };
    if let (Verdict::Pass(fields), Some(k), false) = (&verdict, key, fa.cache.is_zero()) {
        if let Ok(mut c) = cache.passes.lock() {
            if c.len() >= CACHE_MAX {
                c.clear();
            }
            c.insert(k, (now, fields.clone()));
        }
    }
    verdict
}

/// The client's address and scheme, owned (the check outlives no borrow of the connection).
pub(crate) struct WhoOwned {
    pub ip: String,
    pub tls: bool,
}

impl WhoOwned {
    pub(crate) fn of(who: &Who<'_>) -> Self {
        WhoOwned {
            ip: who.ip.to_string(),
            tls: who.tls,
        }
    }
}

/// The credential a pass is remembered by: the values of the fields sent along (None when the
/// request has none of them: nothing to remember it by).
fn credential(fa: &ForwardAuth, head: &RequestHead) -> Option<[u8; 32]> {
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    let mut any = false;
    for name in &fa.request_headers {
        ctx.update(name.as_bytes());
        ctx.update(b"\0");
        if let Some(v) = head.field(name) {
            any = true;
            ctx.update(v);
        }
        ctx.update(b"\0");
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    any.then_some(out)
}

/// One request to a server of the auth group, on a connection of its own.
async fn ask(
    env: &Env<'_>,
    fa: &ForwardAuth,
    head: &RequestHead,
    who: &WhoOwned,
) -> Result<Verdict, ProxyError> {
    let shared = env.shared;
    let up = shared
        .upstreams
        .get(fa.group)
        .ok_or(ProxyError::Unavailable)?;
    let guard = up
        .pick_at_excluding(None, &[], Instant::now())
        .map_err(|_| ProxyError::Unavailable)?;
    let group = up.group();
    let tls = shared.upstream_tls.get(fa.group).cloned().flatten();
    let addr = guard.address();
    let mut out = BytesMut::with_capacity(512);
    let target = fa.path.as_deref().unwrap_or(head.target());
    encode::request_line(&mut out, "GET", target);
    let host = head.host().unwrap_or_default().as_bytes();
    encode::field(&mut out, "Host", host);
    encode::field(
        &mut out,
        "X-Forwarded-Method",
        head.method().as_str().as_bytes(),
    );
    let proto: &[u8] = if who.tls { b"https" } else { b"http" };
    encode::field(&mut out, "X-Forwarded-Proto", proto);
    encode::field(&mut out, "X-Forwarded-Host", host);
    encode::field(&mut out, "X-Forwarded-Uri", head.target().as_bytes());
    encode::field(&mut out, "X-Forwarded-For", who.ip.as_bytes());
    for name in &fa.request_headers {
        for (n, v) in head.fields() {
            if n.eq_ignore_ascii_case(name) {
                encode::field(&mut out, n, v);
            }
        }
    }
    encode::field(&mut out, "Connection", b"close");
    encode::end_head(&mut out);
    let (mut c, _) = crate::upstream::pool::connect(
        addr,
        group.connect_timeout,
        tls.as_deref(),
        crate::upstream::pool::local_header(group).as_deref(),
    )
    .await?;
    write_within(&mut c.stream, &out, group.idle_timeout).await?;
    let limit = group.response_header_timeout;
    let rh = final_head(&mut c.stream, &mut c.rbuf, &Method::Get, limit).await?;
    let status = rh.status();
    if (200..300).contains(&status) {
        let fields = fa
            .copy_headers
            .iter()
            .enumerate()
            .filter_map(|(i, n)| {
                rh.field(n)
                    .map(|v| (i, String::from_utf8_lossy(v).into_owned()))
            })
            .collect();
        return Ok(Verdict::Pass(fields));
    }
    // A refusal: its status, the fields a browser needs (a login redirect, a challenge, a
    // cookie), and its body up to MAX_BODY.
    let mut fields = Vec::new();
    for (n, v) in rh.fields() {
        if ANSWER_FIELDS.iter().any(|a| a.eq_ignore_ascii_case(n)) {
            fields.push((n.to_string(), String::from_utf8_lossy(v).into_owned()));
        }
    }
    let mut body = BytesMut::new();
    let mut dec = BodyDecoder::new(rh.framing);
    loop {
        match dec
            .decode(&mut c.rbuf, MAX_BODY)
            .map_err(ProxyError::BadResponseBody)?
        {
            Decoded::Data(d) => {
                if body.len() + d.len() > MAX_BODY {
                    break;
                }
                body.extend_from_slice(&d);
            }
            Decoded::Done { .. } => break,
            Decoded::NeedMore => {
                let n = match timeout(group.idle_timeout, c.stream.read_buf(&mut c.rbuf)).await {
                    Err(_) => return Err(ProxyError::UpstreamIdle),
                    Ok(r) => r.map_err(ProxyError::UpstreamIo)?,
                };
                if n == 0 {
                    break;
                }
            }
        }
    }
    Ok(Verdict::Answer {
        status,
        fields,
        body: body.freeze(),
    })
}
