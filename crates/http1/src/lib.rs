//! Sans-io HTTP/1.1 (RFC 9112): strict head parsing, body framing, encoding, for both roles.

pub mod body;
pub mod build;
pub mod calendar;
pub mod coding;
pub mod encode;
pub mod error;
pub mod head;
pub mod proxy_protocol;
mod syntax;
pub mod traceparent;

#[cfg(test)]
mod tests;

pub use body::{BodyDecoder, Decoded, Framing};
pub use build::{RequestBuilder, ResponseBuilder};
pub use coding::Coding;
pub use error::{BodyError, ParseError, ParseErrorKind};
pub use head::{
    parse_request, parse_response, FieldLine, Limits, Method, RequestHead, ResponseHead,
    TargetForm, Version,
};
