//! Unit tests: wire bytes in, parsed heads, errors and body items out.

mod body;
mod encode;
mod random;
mod request;
mod response;

use crate::{
    parse_request, parse_response, BodyDecoder, BodyError, Decoded, Framing, Limits, Method,
};
use crate::{ParseErrorKind, RequestHead, ResponseHead};
use bytes::{Bytes, BytesMut};

/// Parse a request with default limits, requiring the whole input to be one head.
pub(crate) fn request(raw: &[u8]) -> Result<RequestHead, ParseErrorKind> {
    request_with(raw, &Limits::default())
}

pub(crate) fn request_with(raw: &[u8], limits: &Limits) -> Result<RequestHead, ParseErrorKind> {
    let mut buf = BytesMut::from(raw);
    match parse_request(&mut buf, limits) {
        Ok(Some(head)) => Ok(head),
        Ok(None) => panic!("incomplete: {:?}", String::from_utf8_lossy(raw)),
        Err(e) => Err(e.kind),
    }
}

pub(crate) fn response(method: &Method, raw: &[u8]) -> Result<ResponseHead, ParseErrorKind> {
    let mut buf = BytesMut::from(raw);
    match parse_response(&mut buf, method, &Limits::default()) {
        Ok(Some(head)) => Ok(head),
        Ok(None) => panic!("incomplete: {:?}", String::from_utf8_lossy(raw)),
        Err(e) => Err(e.kind),
    }
}

/// How a body decoding run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum End {
    /// `Done` with these trailers, and this many input bytes left unconsumed.
    Done(Bytes, usize),
    /// Input exhausted without `Done`; `on_eof` then said this.
    Eof(Result<(), BodyError>),
    Err(BodyError),
}

/// Feed `input` to a decoder `step` bytes at a time (0 = all at once), `max` bytes per item.
/// Returns the concatenated data and how it ended.
pub(crate) fn decode(framing: Framing, input: &[u8], step: usize, max: usize) -> (Vec<u8>, End) {
    let mut dec = BodyDecoder::new(framing);
    let mut buf = BytesMut::new();
    let mut data = Vec::new();
    let mut fed = 0;
    loop {
        match dec.decode(&mut buf, max) {
            Ok(Decoded::Data(d)) => {
                assert!(!d.is_empty(), "empty Data item");
                assert!(d.len() <= max.max(1));
                data.extend_from_slice(&d);
            }
            Ok(Decoded::Done { trailers }) => {
                assert!(dec.is_done());
                let left = buf.len() + input.len() - fed;
                return (data, End::Done(trailers, left));
            }
            Ok(Decoded::NeedMore) => {
                if fed == input.len() {
                    let eof = dec
                        .on_eof()
                        .map(|d| assert!(matches!(d, Decoded::Done { .. })));
                    return (data, End::Eof(eof));
                }
                let n = if step == 0 {
                    input.len() - fed
                } else {
                    step.min(input.len() - fed)
                };
                buf.extend_from_slice(&input[fed..fed + n]);
                fed += n;
            }
            Err(e) => return (data, End::Err(e)),
        }
    }
}
