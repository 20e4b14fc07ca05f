//! Body framing: Content-Length, chunked (RFC 9112 7.1) and close-delimited decoding.

use crate::error::BodyError;
use crate::syntax::{find_byte, hex_value, is_field_line, quoted_string, skip_ows, token_len};
use bytes::{Buf, Bytes, BytesMut};

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

/// Longest chunk-size line accepted, CRLF included.
pub const MAX_CHUNK_SIZE_LINE: usize = 4096;
/// Largest trailer section accepted (field lines with their CRLFs, without the final empty line).
pub const MAX_TRAILERS: usize = 8 * 1024;
/// Largest chunk size accepted (2^63).
pub const MAX_CHUNK_SIZE: u64 = 1 << 63;

/// Incremental body decoder. Feed it the connection's read buffer; it consumes what it decodes.
///
/// Between calls the caller may only append to the buffer (the decoder remembers how far it
/// already searched an incomplete line).
#[derive(Debug, Clone)]
pub struct BodyDecoder {
    framing: Framing,
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// `Length` (and `None`, as `Length(0)`) bodies: bytes still expected.
    Length(u64),
    /// Close-delimited: everything until EOF.
    Close,
    /// Expecting a chunk-size line; `searched` bytes of it were already scanned for LF.
    ChunkSize { searched: usize },
    /// Inside chunk data: bytes left in this chunk.
    ChunkData(u64),
    /// Expecting the CRLF after chunk data.
    ChunkDataEnd,
    /// After the last chunk: `lines` bytes of validated trailer lines are at the front of the
    /// buffer, and the bytes up to `searched` contain no LF.
    Trailers { lines: usize, searched: usize },
    /// `Done` was returned.
    Done,
}

impl BodyDecoder {
    pub fn new(framing: Framing) -> Self {
        let state = match framing {
            Framing::None => State::Length(0),
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::ChunkSize { searched: 0 },
            Framing::Close => State::Close,
        };
        BodyDecoder { framing, state }
    }

    pub fn framing(&self) -> Framing {
        self.framing
    }

    /// Decode the next item from the front of `buf`. `max` bounds the size of one `Data` item
    /// (0 is treated as 1).
    /// Chunk-size lines: hex digits, optional chunk extensions (`;name[=value]`, validated and
    /// dropped), CRLF; sizes beyond 2^63 are `ChunkSizeOverflow`; bare LF, spaces before the size,
    /// a missing CRLF after data are errors. Size lines are limited to 4 KiB, the trailer section
    /// to 8 KiB. After `Done`, further calls return `Done` with no trailers and consume nothing.
    pub fn decode(&mut self, buf: &mut BytesMut, max: usize) -> Result<Decoded, BodyError> {
        let max = max.max(1);
        loop {
            match self.state {
                State::Done => return Ok(done(Bytes::new())),
                State::Length(0) => {
                    self.state = State::Done;
                    return Ok(done(Bytes::new()));
                }
                State::Length(remaining) => {
                    if buf.is_empty() {
                        return Ok(Decoded::NeedMore);
                    }
                    let n = take_len(remaining, max, buf.len());
                    self.state = State::Length(remaining.saturating_sub(n as u64));
                    return Ok(Decoded::Data(buf.split_to(n).freeze()));
                }
                State::Close => {
                    if buf.is_empty() {
                        return Ok(Decoded::NeedMore);
                    }
                    let n = buf.len().min(max);
                    return Ok(Decoded::Data(buf.split_to(n).freeze()));
                }
                State::ChunkSize { searched } => {
                    let searched = if searched > buf.len() { 0 } else { searched };
                    let limit = buf.len().min(MAX_CHUNK_SIZE_LINE);
                    let hay = buf.get(searched..limit).unwrap_or_default();
                    let Some(at) = find_byte(hay, b'\n') else {
                        if buf.len() >= MAX_CHUNK_SIZE_LINE {
                            return Err(BodyError::BadChunkSize);
                        }
                        self.state = State::ChunkSize { searched: limit };
                        return Ok(Decoded::NeedMore);
                    };
                    let lf = searched.saturating_add(at);
                    let line = buf.get(..lf).unwrap_or_default();
                    let line = line.strip_suffix(b"\r").ok_or(BodyError::BadChunkSize)?;
                    let size = parse_chunk_size_line(line)?;
                    buf.advance(lf.saturating_add(1));
                    self.state = if size == 0 {
                        State::Trailers {
                            lines: 0,
                            searched: 0,
                        }
                    } else {
                        State::ChunkData(size)
                    };
                }
                State::ChunkData(remaining) => {
                    if buf.is_empty() {
                        return Ok(Decoded::NeedMore);
                    }
                    let n = take_len(remaining, max, buf.len());
                    let left = remaining.saturating_sub(n as u64);
                    self.state = if left == 0 {
                        State::ChunkDataEnd
                    } else {
                        State::ChunkData(left)
                    };
                    return Ok(Decoded::Data(buf.split_to(n).freeze()));
                }
                State::ChunkDataEnd => {
                    match (buf.first(), buf.get(1)) {
                        (Some(b'\r'), Some(b'\n')) => {}
                        (Some(b'\r'), None) | (None, _) => return Ok(Decoded::NeedMore),
                        _ => return Err(BodyError::BadChunkEnd),
                    }
                    buf.advance(2);
                    self.state = State::ChunkSize { searched: 0 };
                }
                State::Trailers { lines, searched } => {
                    let (lines, searched) = if searched > buf.len() || lines > searched {
                        (0, 0)
                    } else {
                        (lines, searched)
                    };
                    let hay = buf.get(searched..).unwrap_or_default();
                    let Some(at) = find_byte(hay, b'\n') else {
                        // A valid section is at most MAX_TRAILERS bytes plus the final CRLF, of
                        // which at most the CR can be buffered here.
                        if buf.len() > MAX_TRAILERS.saturating_add(1) {
                            return Err(BodyError::BadTrailers);
                        }
                        self.state = State::Trailers {
                            lines,
                            searched: buf.len(),
                        };
                        return Ok(Decoded::NeedMore);
                    };
                    let lf = searched.saturating_add(at);
                    let line = buf.get(lines..lf).unwrap_or_default();
                    let line = line.strip_suffix(b"\r").ok_or(BodyError::BadTrailers)?;
                    if line.is_empty() {
                        let trailers = buf.split_to(lines).freeze();
                        buf.advance(2);
                        self.state = State::Done;
                        return Ok(done(trailers));
                    }
                    if !is_field_line(line) {
                        return Err(BodyError::BadTrailers);
                    }
                    let next = lf.saturating_add(1);
                    if next > MAX_TRAILERS {
                        return Err(BodyError::BadTrailers);
                    }
                    self.state = State::Trailers {
                        lines: next,
                        searched: next,
                    };
                }
            }
        }
    }

    /// The peer closed the connection: `Ok(Done)` for close-delimited bodies (or a complete body),
    /// `Err(Truncated)` otherwise.
    pub fn on_eof(&mut self) -> Result<Decoded, BodyError> {
        match self.state {
            State::Done | State::Length(0) | State::Close => {
                self.state = State::Done;
                Ok(done(Bytes::new()))
            }
            _ => Err(BodyError::Truncated),
        }
    }

    /// True once `Done` has been returned.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Bytes of payload still expected for a `Length` body (None for other framings).
    pub fn remaining(&self) -> Option<u64> {
        match (self.framing, self.state) {
            (Framing::Length(_), State::Length(n)) => Some(n),
            (Framing::Length(_), _) => Some(0),
            _ => None,
        }
    }
}

#[inline]
fn done(trailers: Bytes) -> Decoded {
    Decoded::Done { trailers }
}

/// min(remaining, max, available) as usize.
#[inline]
fn take_len(remaining: u64, max: usize, available: usize) -> usize {
    let cap = max.min(available);
    usize::try_from(remaining).map_or(cap, |r| r.min(cap))
}

/// `chunk-size [ chunk-ext ]` (line without its CRLF) -> size.
fn parse_chunk_size_line(line: &[u8]) -> Result<u64, BodyError> {
    let mut size: u64 = 0;
    let mut digits = 0usize;
    for &b in line {
        let Some(d) = hex_value(b) else { break };
        size = size
            .checked_mul(16)
            .and_then(|s| s.checked_add(u64::from(d)))
            .filter(|&s| s <= MAX_CHUNK_SIZE)
            .ok_or(BodyError::ChunkSizeOverflow)?;
        digits = digits.saturating_add(1);
    }
    if digits == 0 {
        return Err(BodyError::BadChunkSize);
    }
    if !valid_chunk_ext(line.get(digits..).unwrap_or_default()) {
        return Err(BodyError::BadChunkSize);
    }
    Ok(size)
}

/// `*( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] )` (RFC 9112 7.1.1).
fn valid_chunk_ext(mut s: &[u8]) -> bool {
    loop {
        if s.is_empty() {
            return true;
        }
        let Some(rest) = skip_ows(s).strip_prefix(b";") else {
            return false;
        };
        let rest = skip_ows(rest);
        let name = token_len(rest);
        if name == 0 {
            return false;
        }
        s = rest.get(name..).unwrap_or_default();
        if let Some(value) = skip_ows(s).strip_prefix(b"=") {
            let value = skip_ows(value);
            if value.first() == Some(&b'"') {
                match quoted_string(value) {
                    Some(after) => s = after,
                    None => return false,
                }
            } else {
                let n = token_len(value);
                if n == 0 {
                    return false;
                }
                s = value.get(n..).unwrap_or_default();
            }
        }
    }
}
