//! Request ids: the client's own when allowed and well formed, else 128 random bits as 32 hex digits; forwarded, returned and logged.

use crate::telemetry::text::push_hex;
use portico_config::RequestId as Settings;
use portico_http1::RequestHead;
use std::borrow::Cow;

/// Longest id taken from a client.
const MAX_LEN: usize = 200;

/// One request's id, kept with its timings (a copy, no allocation): whether the id is the
/// client's (then it is read from the request head) or one generated here.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RequestId {
    /// Request ids are off, or the request was not read.
    #[default]
    None,
    /// The client's field carries it.
    Client,
    /// 128 random bits.
    Generated(u64, u64),
}

impl RequestId {
    /// The id of a request under `settings`: the client's when it sent a well-formed one and
    /// `from_client` allows it, else a new one.
    pub fn of(settings: &Settings, head: &RequestHead) -> RequestId {
        let theirs = settings.from_client
            && head
                .field(&settings.header)
                .is_some_and(|v| well_formed(v) && !repeated(head, &settings.header));
        if theirs {
            RequestId::Client
        } else {
            RequestId::Generated(fastrand::u64(..), fastrand::u64(..))
        }
    }

    /// The id to set on the forwarded request (replacing the client's field): only a
    /// generated id; a client's passes as it came.
    pub fn to_forward(self) -> Option<String> {
        match self {
            RequestId::Generated(a, b) => {
                let mut s = String::with_capacity(32);
                push_hex(&mut s, a);
                push_hex(&mut s, b);
                Some(s)
            }
            _ => None,
        }
    }

    /// The id as text (None when ids are off).
    pub fn text<'h>(self, settings: &Settings, head: &'h RequestHead) -> Option<Cow<'h, str>> {
        match self {
            RequestId::None => None,
            RequestId::Client => head
                .field(&settings.header)
                .and_then(|v| std::str::from_utf8(v).ok())
                .map(Cow::Borrowed),
            RequestId::Generated(..) => self.to_forward().map(Cow::Owned),
        }
    }
}

/// The field a response Portico makes itself (an error, a redirect, the origin) carries when
/// `[request_id] response` is on: (name, id).
pub fn answer_field<'s, 'h>(
    settings: Option<&'s Settings>,
    id: RequestId,
    head: &'h RequestHead,
) -> Option<(&'s str, Cow<'h, str>)> {
    let s = settings.filter(|s| s.response)?;
    Some((&s.header, id.text(s, head)?))
}

/// The field comes more than once (which one would be the id?).
fn repeated(head: &RequestHead, name: &str) -> bool {
    let mut same = head.fields().filter(|(n, _)| n.eq_ignore_ascii_case(name));
    same.next().is_some() && same.next().is_some()
}

/// Visible ASCII only (no spaces or controls), 1 to [`MAX_LEN`] bytes: safe in a log line and
/// in a header field.
fn well_formed(v: &[u8]) -> bool {
    !v.is_empty() && v.len() <= MAX_LEN && v.iter().all(|b| (0x21..=0x7e).contains(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;

    fn head(wire: &[u8]) -> RequestHead {
        let mut buf = BytesMut::from(wire);
        portico_http1::parse_request(&mut buf, &portico_http1::Limits::default())
            .unwrap()
            .unwrap()
    }

    fn settings(from_client: bool) -> Settings {
        Settings {
            header: "x-request-id".into(),
            from_client,
            response: false,
        }
    }

    #[test]
    fn a_clients_well_formed_id_is_kept_when_allowed() {
        let h = head(b"GET / HTTP/1.1\r\nHost: a\r\nX-Request-Id: abc-123\r\n\r\n");
        let id = RequestId::of(&settings(true), &h);
        assert_eq!(id, RequestId::Client);
        assert_eq!(id.text(&settings(true), &h).as_deref(), Some("abc-123"));
        assert_eq!(id.to_forward(), None);
        // Not allowed: a new one, which replaces the client's upstream.
        let id = RequestId::of(&settings(false), &h);
        let text = id.to_forward().unwrap();
        assert_eq!(text.len(), 32);
        assert!(text.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(id.text(&settings(false), &h).as_deref(), Some(&*text));
    }

    #[test]
    fn malformed_repeated_or_missing_ids_are_replaced() {
        let long = format!(
            "GET / HTTP/1.1\r\nHost: a\r\nX-Request-Id: {}\r\n\r\n",
            "a".repeat(201)
        );
        for wire in [
            &b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nHost: a\r\nX-Request-Id: a b\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nX-Request-Id: \xc3\xa9\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nX-Request-Id: a\r\nX-Request-Id: b\r\n\r\n",
            long.as_bytes(),
        ] {
            let id = RequestId::of(&settings(true), &head(wire));
            assert!(matches!(id, RequestId::Generated(..)), "{wire:?}");
        }
        // Two generated ids differ.
        let h = head(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_ne!(
            RequestId::of(&settings(true), &h),
            RequestId::of(&settings(true), &h)
        );
    }
}
