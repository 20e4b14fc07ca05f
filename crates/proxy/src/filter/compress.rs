//! Response compression: whether a response is compressed (and with which coding), and the streaming encoder its body goes through.

use bytes::Bytes;
use portico_config::Compression;
use portico_http1::coding::negotiate;
use portico_http1::{Coding, Method, RequestHead};
use std::io::Write;

/// What compression does to one response.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Nothing: not a response compression applies to (no body, already encoded, a range,
    /// `no-transform`, a type not listed, shorter than the minimum).
    Leave,
    /// Sent as it is, with `Vary: Accept-Encoding`: this client accepts none of the codings,
    /// but another would get a compressed body.
    Vary,
    /// No body here (a `304`, or the answer to `HEAD`), but a `GET` would have been
    /// compressed: the same `Vary` and weak `ETag` that response carries, so a cache's stored
    /// variant matches (RFC 9110 15.4.5).
    Revalidated { etag: Option<String>, vary: bool },
    /// Compressed with this coding; `etag`: the server's ETag, weak, for the new body; `vary`:
    /// `Vary: Accept-Encoding` is added (the server's Vary does not cover it).
    Compress {
        coding: Coding,
        etag: Option<String>,
        vary: bool,
    },
}

/// What the plan reads of a response: its status, whether a body follows, the body's length
/// when it is announced, and its fields.
pub(crate) struct Response<'r, F> {
    pub status: u16,
    /// A body follows the head (false for HEAD responses, 204, 304 and empty bodies).
    pub body: bool,
    /// The announced length of the body (None: unknown, sent chunked or close-delimited).
    pub length: Option<u64>,
    /// Every field (name, value), in order; a name may repeat.
    pub fields: &'r dyn Fn() -> F,
}

/// The plan for a response to `req` under the route's compression settings `c`.
pub(crate) fn plan<'f, F>(c: &Compression, req: &RequestHead, resp: &Response<'_, F>) -> Plan
where
    F: Iterator<Item = (&'f str, &'f [u8])>,
{
    // A response without a body that stands for one Portico would compress: 304, HEAD.
    let headless = *req.method() == Method::Head || resp.status == 304;
    if req.upgrade
        || (!resp.body && !headless)
        || resp.status < 200
        || matches!(resp.status, 204 | 206)
        || (resp.length == Some(0) && !headless)
    {
        return Plan::Leave;
    }
    let mut typed = false;
    let mut has_type = false;
    let mut vary_covers = false;
    let mut etag = None;
    for (name, value) in (resp.fields)() {
        let is = |n: &str| name.eq_ignore_ascii_case(n);
        if is("content-encoding") {
            if !value.trim_ascii().eq_ignore_ascii_case(b"identity") {
                return Plan::Leave;
            }
        } else if is("content-range") {
            return Plan::Leave;
        } else if is("transfer-encoding") {
            // Codings other than chunked are in the payload already.
            if list(value).any(|t| !t.eq_ignore_ascii_case(b"chunked")) {
                return Plan::Leave;
            }
        } else if is("cache-control") {
            if list(value).any(|t| t.eq_ignore_ascii_case(b"no-transform")) {
                return Plan::Leave;
            }
        } else if is("content-type") {
            typed = c.compresses_type(value);
            has_type = true;
        } else if is("vary") {
            vary_covers |=
                list(value).any(|t| t == b"*" || t.eq_ignore_ascii_case(b"accept-encoding"));
        } else if is("etag") {
            etag = Some(value);
        }
    }
    // A 304 usually has no Content-Type: its coding is the one the client's stored response
    // had, which only an accepted coding can be.
    let type_ok = typed || (resp.status == 304 && !has_type);
    if !type_ok || (!headless && resp.length.is_some_and(|n| n < c.min_length)) {
        return Plan::Leave;
    }
    let Some(coding) = negotiate(req.field("accept-encoding"), &c.algorithms) else {
        return match vary_covers {
            true => Plan::Leave,
            false => Plan::Vary,
        };
    };
    // The compressed body is another representation: a strong validator would claim byte
    // equality with the server's, so it is made weak (as nginx does); one that is not text is
    // dropped.
    let etag = etag.and_then(|v| std::str::from_utf8(v.trim_ascii()).ok());
    let etag = etag.map(|v| match v.starts_with("W/") {
        true => v.to_string(),
        false => format!("W/{v}"),
    });
    if headless {
        return Plan::Revalidated {
            etag,
            vary: !vary_covers,
        };
    }
    Plan::Compress {
        coding,
        etag,
        vary: !vary_covers,
    }
}

/// The comma-separated items of a field value, trimmed.
fn list(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

/// A response body being compressed: bytes go in as the server sends them, compressed bytes
/// come out. Output is held by the codec until it has a block's worth, until [`Encoder::flush`]
/// (before each wait for the server, so a streamed response is never held back) and at
/// [`Encoder::finish`].
pub(crate) enum Encoder {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Br(Box<brotli::CompressorWriter<Vec<u8>>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

/// The largest window brotli and zstd use, as a power of two: 1 MiB. A window as large as the
/// codecs' defaults (4 to 8 MiB) helps only bodies far larger than a web response, and is
/// memory held per response for as long as it streams.
const MAX_WINDOW_LOG: u32 = 20;

/// The window for a body of `length` bytes (None: unknown): the smallest power of two that
/// holds it, between 2^16 and [`MAX_WINDOW_LOG`].
fn window_log(length: Option<u64>) -> u32 {
    match length {
        Some(n) => (64 - n.saturating_sub(1).leading_zeros()).clamp(16, MAX_WINDOW_LOG),
        None => MAX_WINDOW_LOG,
    }
}
/// brotli's internal buffer between calls.
const BROTLI_BUFFER: usize = 16 * 1024;

impl Encoder {
    /// An encoder for `coding` at the route's level, for a body of `length` bytes (None:
    /// unknown), which sizes the brotli and zstd windows.
    pub(crate) fn new(
        coding: Coding,
        c: &Compression,
        length: Option<u64>,
    ) -> std::io::Result<Encoder> {
        let window = window_log(length);
        Ok(match coding {
            Coding::Gzip => {
                let level = flate2::Compression::new(c.gzip_level);
                Encoder::Gzip(flate2::write::GzEncoder::new(Vec::new(), level))
            }
            Coding::Br => Encoder::Br(Box::new(brotli::CompressorWriter::new(
                Vec::new(),
                BROTLI_BUFFER,
                c.brotli_level,
                window,
            ))),
            Coding::Zstd => {
                let mut e = zstd::stream::write::Encoder::new(Vec::new(), c.zstd_level)?;
                e.window_log(window)?;
                Encoder::Zstd(e)
            }
        })
    }

    /// Compress `d`; what the codec has output so far.
    pub(crate) fn data(&mut self, d: &[u8]) -> std::io::Result<Bytes> {
        match self {
            Encoder::Gzip(e) => e.write_all(d)?,
            Encoder::Br(e) => e.write_all(d)?,
            Encoder::Zstd(e) => e.write_all(d)?,
        }
        Ok(self.take())
    }

    /// Everything compressed so far, out now (a sync flush: the stream goes on after it).
    pub(crate) fn flush(&mut self) -> std::io::Result<Bytes> {
        match self {
            Encoder::Gzip(e) => e.flush()?,
            Encoder::Br(e) => e.flush()?,
            Encoder::Zstd(e) => e.flush()?,
        }
        Ok(self.take())
    }

    /// The end of the compressed stream.
    pub(crate) fn finish(self) -> std::io::Result<Bytes> {
        let out = match self {
            Encoder::Gzip(e) => e.finish()?,
            Encoder::Br(e) => e.into_inner(),
            Encoder::Zstd(e) => e.finish()?,
        };
        Ok(Bytes::from(out))
    }

    /// The codec's output so far, taken.
    fn take(&mut self) -> Bytes {
        let out = match self {
            Encoder::Gzip(e) => e.get_mut(),
            Encoder::Br(e) => e.get_mut(),
            Encoder::Zstd(e) => e.get_mut(),
        };
        match out.is_empty() {
            true => Bytes::new(),
            false => Bytes::from(std::mem::take(out)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn req(wire: &str) -> RequestHead {
        let mut buf = bytes::BytesMut::from(format!("{wire}\r\n\r\n").as_bytes());
        match portico_http1::parse_request(&mut buf, &Default::default()) {
            Ok(Some(head)) => head,
            other => panic!("{other:?}"),
        }
    }

    const GET: &str = "GET /a HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip, br";

    fn plan_for(req_wire: &str, status: u16, length: Option<u64>, fields: &[(&str, &str)]) -> Plan {
        let c = Compression::defaults();
        let fields = || fields.iter().map(|(n, v)| (*n, v.as_bytes()));
        let resp = Response {
            status,
            body: true,
            length,
            fields: &fields,
        };
        plan(&c, &req(req_wire), &resp)
    }

    const HTML: (&str, &str) = ("Content-Type", "text/html; charset=utf-8");

    #[test]
    fn a_listed_type_is_compressed_with_the_preferred_accepted_coding() {
        let p = plan_for(GET, 200, Some(1000), &[HTML, ("ETag", "\"abc\"")]);
        let etag = Some("W/\"abc\"".to_string());
        let coding = Coding::Br;
        assert_eq!(
            p,
            Plan::Compress {
                coding,
                etag,
                vary: true
            }
        );
        // Unknown length (chunked) is compressed; a weak ETag stays as it is; a Vary that
        // covers Accept-Encoding is not repeated.
        let fields = [HTML, ("etag", "W/\"x\""), ("Vary", "Accept-Encoding")];
        let p = plan_for(GET, 404, None, &fields);
        let etag = Some("W/\"x\"".to_string());
        assert_eq!(
            p,
            Plan::Compress {
                coding,
                etag,
                vary: false
            }
        );
        let zstd = "GET / HTTP/1.1\r\nHost: x\r\nAccept-Encoding: zstd;q=0.9, br;q=0.5";
        assert!(matches!(
            plan_for(zstd, 200, None, &[HTML]),
            Plan::Compress {
                coding: Coding::Zstd,
                ..
            }
        ));
    }

    #[test]
    fn responses_that_must_not_change_are_left_alone() {
        let leave = |status, length, fields: &[(&str, &str)]| {
            assert_eq!(
                plan_for(GET, status, length, fields),
                Plan::Leave,
                "{status} {fields:?}"
            );
        };
        leave(200, Some(1000), &[HTML, ("Content-Encoding", "gzip")]);
        leave(
            206,
            Some(1000),
            &[HTML, ("Content-Range", "bytes 0-999/5000")],
        );
        leave(
            200,
            Some(1000),
            &[HTML, ("Content-Range", "bytes 0-999/5000")],
        );
        leave(
            200,
            Some(1000),
            &[HTML, ("Cache-Control", "public, No-Transform")],
        );
        leave(200, Some(1000), &[("Content-Type", "image/png")]);
        leave(200, Some(1000), &[]);
        leave(200, Some(100), &[HTML]);
        leave(200, Some(0), &[HTML]);
        leave(204, None, &[HTML]);
        leave(200, None, &[HTML, ("Transfer-Encoding", "gzip, chunked")]);
        // HEAD and 304: no body to compress, but the fields a compressed GET carries.
        let head = "HEAD /a HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip";
        let revalidated = Plan::Revalidated {
            etag: Some("W/\"e\"".to_string()),
            vary: true,
        };
        assert_eq!(
            plan_for(head, 200, Some(1000), &[HTML, ("ETag", "\"e\"")]),
            revalidated
        );
        assert_eq!(plan_for(GET, 304, None, &[("ETag", "\"e\"")]), revalidated);
        assert_eq!(
            plan_for(GET, 304, None, &[("Content-Type", "image/png")]),
            Plan::Leave
        );
        // identity is no coding at all.
        let p = plan_for(
            GET,
            200,
            Some(1000),
            &[HTML, ("Content-Encoding", "identity")],
        );
        assert!(matches!(p, Plan::Compress { .. }));
    }

    #[test]
    fn a_client_that_accepts_no_coding_still_gets_vary() {
        let plain = "GET / HTTP/1.1\r\nHost: x";
        assert_eq!(plan_for(plain, 200, Some(1000), &[HTML]), Plan::Vary);
        let refused = "GET / HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip;q=0, deflate";
        assert_eq!(plan_for(refused, 200, Some(1000), &[HTML]), Plan::Vary);
        // A Vary that covers Accept-Encoding already is not repeated.
        let p = plan_for(
            plain,
            200,
            Some(1000),
            &[HTML, ("Vary", "Origin, accept-encoding")],
        );
        assert_eq!(p, Plan::Leave);
    }

    fn roundtrip(coding: Coding) -> Vec<u8> {
        let text: Vec<u8> = (0..4000)
            .flat_map(|i| format!("line {i} of the page\n").into_bytes())
            .collect();
        let mut e = Encoder::new(coding, &Compression::defaults(), None).unwrap();
        let mut out = Vec::new();
        for (i, chunk) in text.chunks(7000).enumerate() {
            out.extend_from_slice(&e.data(chunk).unwrap());
            if i % 3 == 0 {
                // A flush in the middle (a wait for the server) makes a readable prefix.
                out.extend_from_slice(&e.flush().unwrap());
            }
        }
        out.extend_from_slice(&e.finish().unwrap());
        assert!(
            out.len() < text.len() / 4,
            "{coding:?}: {} of {}",
            out.len(),
            text.len()
        );
        let mut back = Vec::new();
        match coding {
            Coding::Gzip => flate2::read::GzDecoder::new(&out[..])
                .read_to_end(&mut back)
                .unwrap(),
            Coding::Br => brotli::Decompressor::new(&out[..], 4096)
                .read_to_end(&mut back)
                .unwrap(),
            Coding::Zstd => zstd::stream::read::Decoder::new(&out[..])
                .unwrap()
                .read_to_end(&mut back)
                .unwrap(),
        };
        assert_eq!(back, text, "{coding:?}");
        out
    }

    #[test]
    fn windows_fit_the_body() {
        assert_eq!(window_log(Some(100)), 16);
        assert_eq!(window_log(Some(65_536)), 16);
        assert_eq!(window_log(Some(65_537)), 17);
        assert_eq!(window_log(Some(200_000)), 18);
        assert_eq!(window_log(Some(1 << 40)), MAX_WINDOW_LOG);
        assert_eq!(window_log(None), MAX_WINDOW_LOG);
        // A small window still decodes (brotli and zstd with a length given).
        for c in [Coding::Br, Coding::Zstd] {
            let mut e = Encoder::new(c, &Compression::defaults(), Some(300)).unwrap();
            let mut out = e.data(&[b'a'; 300]).unwrap().to_vec();
            out.extend_from_slice(&e.finish().unwrap());
            let mut back = Vec::new();
            match c {
                Coding::Br => brotli::Decompressor::new(&out[..], 4096).read_to_end(&mut back),
                _ => zstd::stream::read::Decoder::new(&out[..])
                    .unwrap()
                    .read_to_end(&mut back),
            }
            .unwrap();
            assert_eq!(back, [b'a'; 300]);
        }
    }

    #[test]
    fn every_coding_streams_and_decodes_to_the_original() {
        for c in Coding::ALL {
            roundtrip(c);
        }
    }

    #[test]
    fn a_flush_makes_what_was_sent_decodable_before_the_end() {
        let mut e = Encoder::new(Coding::Gzip, &Compression::defaults(), Some(19)).unwrap();
        let mut out = e.data(b"data: first event\n\n").unwrap().to_vec();
        out.extend_from_slice(&e.flush().unwrap());
        let mut d = flate2::write::GzDecoder::new(Vec::new());
        d.write_all(&out).unwrap();
        d.flush().unwrap();
        assert_eq!(d.get_ref().as_slice(), b"data: first event\n\n");
    }
}
