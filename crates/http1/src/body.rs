//! Body framing: Content-Length, chunked (RFC 9112 7.1) and close-delimited decoding.

use crate::error::BodyError;
use bytes::{Bytes, BytesMut};

/// How a message body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body at all.
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// Until the connection closes (responses only).
    Close,
}

/// One step of body decoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// Payload bytes (split off the input buffer without copying).
    Data(Bytes),
    /// The input buffer holds no complete next item: read more, then call again.
    NeedMore,
    /// The body is complete. For chunked bodies, `trailers` holds the raw, validated trailer
    /// field lines (each ending in CRLF, without the final empty line), empty if there were none.
    Done { trailers: Bytes },
}

/// Incremental body decoder. Feed it the connection's read buffer; it consumes what it decodes.
#[derive(Debug, Clone)]
pub struct BodyDecoder {
    framing: Framing,
    state: State,
}

#[derive(Debug, Clone)]
enum State {
    Placeholder,
}

impl BodyDecoder {
    pub fn new(framing: Framing) -> Self {
        BodyDecoder { framing, state: State::Placeholder }
    }

    pub fn framing(&self) -> Framing {
        self.framing
    }

    /// Decode the next item from the front of `buf`. `max` bounds the size of one `Data` item.
    /// Chunk-size lines: hex digits, optional chunk extensions (`;name[=value]`, validated and
    /// dropped), CRLF; sizes beyond 2^63 are `ChunkSizeOverflow`; bare LF, spaces before the size,
    /// a missing CRLF after data are errors. Trailer section limited to 8 KiB.
    pub fn decode(&mut self, buf: &mut BytesMut, max: usize) -> Result<Decoded, BodyError> {
        let _ = (buf, max, &self.state);
        unimplemented!()
    }

    /// The peer closed the connection: `Ok(Done)` for close-delimited bodies (or a complete body),
    /// `Err(Truncated)` otherwise.
    pub fn on_eof(&mut self) -> Result<Decoded, BodyError> {
        unimplemented!()
    }

    /// True once `Done` has been returned.
    pub fn is_done(&self) -> bool {
        unimplemented!()
    }

    /// Bytes of payload still expected for a `Length` body (None for other framings).
    pub fn remaining(&self) -> Option<u64> {
        unimplemented!()
    }
}
