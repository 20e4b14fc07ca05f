//! The handler's response before encoding: status, fields, framing and body, and its encoder.

use crate::{Body, Reply};
use bytes::{Bytes, BytesMut};
use portico_http1::encode;
use std::borrow::Cow;
use std::time::Duration;

pub(crate) const TEXT_PLAIN: &str = "text/plain; charset=utf-8";

#[derive(Debug)]
pub(crate) struct Response {
    pub status: u16,
    /// Header fields in the order written (Content-Length is not among them).
    pub fields: Vec<(&'static str, Cow<'static, str>)>,
    /// None only for 204 and 304, which carry no Content-Length.
    pub content_length: Option<u64>,
    pub body: Body,
    pub delay: Option<Duration>,
}

impl Response {
    /// A response with no fields yet and an empty body framed by `Content-Length: 0`.
    pub fn new(status: u16) -> Self {
        let content_length = (!no_content_length(status)).then_some(0);
        Response {
            status,
            fields: Vec::new(),
            content_length,
            body: Body::Empty,
            delay: None,
        }
    }

    /// A short text/plain response (errors, redirects).
    pub fn text(status: u16, text: &'static str) -> Self {
        Response::new(status)
            .with_field("Content-Type", TEXT_PLAIN)
            .with_bytes(Bytes::from_static(text.as_bytes()))
    }

    /// 405 with the given Allow list.
    pub fn method_not_allowed(allow: &'static str) -> Self {
        Response::text(405, "method not allowed\n").with_field("Allow", allow)
    }

    pub fn with_field(mut self, name: &'static str, value: impl Into<Cow<'static, str>>) -> Self {
        self.fields.push((name, value.into()));
        self
    }

    /// Set an in-memory body and its Content-Length (nothing for 204/304).
    pub fn with_bytes(mut self, body: Bytes) -> Self {
        if no_content_length(self.status) {
            return self;
        }
        self.content_length = Some(body.len() as u64);
        self.body = if body.is_empty() {
            Body::Empty
        } else {
            Body::Bytes(body)
        };
        self
    }

    /// Set a file body of `len` bytes from `offset`, and its Content-Length.
    pub fn with_file(mut self, file: std::fs::File, offset: u64, len: u64) -> Self {
        if no_content_length(self.status) {
            return self;
        }
        self.content_length = Some(len);
        self.body = if len == 0 {
            Body::Empty
        } else {
            Body::File { file, offset, len }
        };
        self
    }

    /// Declare a Content-Length without building the body (HEAD of a large synthetic body).
    pub fn with_length_only(mut self, len: u64) -> Self {
        if !no_content_length(self.status) {
            self.content_length = Some(len);
        }
        self.body = Body::Empty;
        self
    }

    /// For HEAD: keep every field and the Content-Length a GET would get, drop the body.
    pub fn without_body(mut self) -> Self {
        self.body = Body::Empty;
        self
    }

    #[cfg(test)]
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_ref())
    }

    /// Write the status line and fields (no final empty line) and hand back the body.
    pub fn encode(self, out: &mut BytesMut) -> Reply {
        encode::status_line(out, self.status, "");
        for (name, value) in &self.fields {
            encode::field(out, name, value.as_bytes());
        }
        if let Some(n) = self.content_length {
            encode::content_length(out, n);
        }
        self.into_reply()
    }

    /// Hand each field to `field` (Content-Length last) and give back the body.
    pub fn fields_to(self, mut field: impl FnMut(&str, &[u8])) -> Reply {
        for (name, value) in &self.fields {
            field(name, value.as_bytes());
        }
        if let Some(n) = self.content_length {
            // Written on the stack: no allocation per answer.
            let mut digits = [0u8; 20];
            let mut rest = &mut digits[..];
            let _ = std::io::Write::write_fmt(&mut rest, format_args!("{n}"));
            let len = 20 - rest.len();
            field("Content-Length", digits.get(..len).unwrap_or_default());
        }
        self.into_reply()
    }

    fn into_reply(self) -> Reply {
        Reply {
            status: self.status,
            body: self.body,
            delay: self.delay,
        }
    }
}

/// 1xx, 204 and 304 responses carry no Content-Length and no content.
fn no_content_length(status: u16) -> bool {
    status < 200 || status == 204 || status == 304
}
