//! Body decoding: Content-Length, close-delimited and chunked, whole and byte at a time.

use super::{decode, End};
use crate::body::{MAX_CHUNK_SIZE_LINE, MAX_TRAILERS};
use crate::{BodyDecoder, BodyError, Decoded, Framing};
use bytes::{Bytes, BytesMut};
use BodyError::*;

fn done(trailers: &'static [u8], left: usize) -> End {
    End::Done(Bytes::from_static(trailers), left)
}

/// Every feeding pattern and item size must give the same data and outcome.
fn check(framing: Framing, input: &[u8], data: &[u8], end: End) {
    for step in [0, 1, 2, 3, 7, 64] {
        for max in [1, 3, 4096] {
            let (got, got_end) = decode(framing, input, step, max);
            assert_eq!(
                got,
                data,
                "data, step {step} max {max}, input {:?}",
                String::from_utf8_lossy(input)
            );
            assert_eq!(
                got_end,
                end,
                "end, step {step} max {max}, input {:?}",
                String::from_utf8_lossy(input)
            );
        }
    }
}

#[test]
fn length_bodies() {
    check(Framing::Length(5), b"hello", b"hello", done(b"", 0));
    check(
        Framing::Length(5),
        b"helloGET / HTTP/1.1\r\n",
        b"hello",
        done(b"", 16),
    );
    check(Framing::Length(0), b"next", b"", done(b"", 4));
    check(Framing::None, b"next", b"", done(b"", 4));
    check(Framing::Length(5), b"hel", b"hel", End::Eof(Err(Truncated)));
    check(
        Framing::Length(u64::MAX),
        b"abc",
        b"abc",
        End::Eof(Err(Truncated)),
    );
}

#[test]
fn close_delimited_bodies() {
    check(
        Framing::Close,
        b"anything \r\n at all",
        b"anything \r\n at all",
        End::Eof(Ok(())),
    );
    check(Framing::Close, b"", b"", End::Eof(Ok(())));
}

#[test]
fn length_decoder_details() {
    let mut dec = BodyDecoder::new(Framing::Length(4));
    assert_eq!(dec.remaining(), Some(4));
    let mut buf = BytesMut::from(&b"abcdef"[..]);
    assert_eq!(
        dec.decode(&mut buf, 3),
        Ok(Decoded::Data(Bytes::from_static(b"abc")))
    );
    assert_eq!(dec.remaining(), Some(1));
    assert_eq!(
        dec.decode(&mut buf, 0),
        Ok(Decoded::Data(Bytes::from_static(b"d"))),
        "max 0 acts as 1"
    );
    assert_eq!(dec.remaining(), Some(0));
    assert!(!dec.is_done());
    assert_eq!(
        dec.decode(&mut buf, 3),
        Ok(Decoded::Done {
            trailers: Bytes::new()
        })
    );
    assert!(dec.is_done());
    assert_eq!(
        dec.decode(&mut buf, 3),
        Ok(Decoded::Done {
            trailers: Bytes::new()
        })
    );
    assert_eq!(
        dec.on_eof(),
        Ok(Decoded::Done {
            trailers: Bytes::new()
        })
    );
    assert_eq!(&buf[..], b"ef");
    assert_eq!(dec.framing(), Framing::Length(4));
    assert_eq!(BodyDecoder::new(Framing::Chunked).remaining(), None);
    assert_eq!(BodyDecoder::new(Framing::Close).remaining(), None);
    // A complete Length body whose Done was not yet returned is fine at EOF.
    let mut dec = BodyDecoder::new(Framing::Length(1));
    let mut buf = BytesMut::from(&b"x"[..]);
    assert!(matches!(dec.decode(&mut buf, 10), Ok(Decoded::Data(_))));
    assert_eq!(
        dec.on_eof(),
        Ok(Decoded::Done {
            trailers: Bytes::new()
        })
    );
}

#[test]
fn chunked_bodies() {
    use Framing::Chunked as C;
    check(C, b"5\r\nhello\r\n0\r\n\r\n", b"hello", done(b"", 0));
    check(
        C,
        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        b"hello world",
        done(b"", 0),
    );
    check(C, b"0\r\n\r\n", b"", done(b"", 0));
    check(
        C,
        b"A\r\n0123456789\r\na\r\n0123456789\r\n0\r\n\r\n",
        b"01234567890123456789",
        done(b"", 0),
    );
    check(
        C,
        b"000005\r\nhello\r\n000\r\n\r\nGET",
        b"hello",
        done(b"", 3),
    );
    // Extensions are validated and dropped.
    check(C, b"5;a\r\nhello\r\n0\r\n\r\n", b"hello", done(b"", 0));
    check(
        C,
        b"5 ; a = b ;c=\"q\\\"uo;ted\"\r\nhello\r\n0;last\r\n\r\n",
        b"hello",
        done(b"", 0),
    );
    check(
        C,
        b"5\t;a=\"\"\r\nhello\r\n0\r\n\r\n",
        b"hello",
        done(b"", 0),
    );
    // Trailers.
    check(
        C,
        b"5\r\nhello\r\n0\r\nX-Sum: 1\r\nY:\r\n\r\nrest",
        b"hello",
        done(b"X-Sum: 1\r\nY:\r\n", 4),
    );
    check(C, b"0\r\nX: a\tb \r\n\r\n", b"", done(b"X: a\tb \r\n", 0));
}

#[test]
fn chunked_errors() {
    use Framing::Chunked as C;
    check(C, b"x\r\n", b"", End::Err(BadChunkSize));
    check(C, b"\r\n", b"", End::Err(BadChunkSize));
    check(C, b" 5\r\nhello\r\n0\r\n\r\n", b"", End::Err(BadChunkSize));
    check(C, b"5 \r\nhello\r\n0\r\n\r\n", b"", End::Err(BadChunkSize));
    check(C, b"+5\r\nhello\r\n0\r\n\r\n", b"", End::Err(BadChunkSize));
    check(C, b"0x5\r\nhello\r\n0\r\n\r\n", b"", End::Err(BadChunkSize));
    check(C, b"5g\r\nhello\r\n0\r\n\r\n", b"", End::Err(BadChunkSize));
    check(C, b"5\nhello\r\n0\r\n\r\n", b"", End::Err(BadChunkSize));
    check(C, b"5\r\r\nhello\r\n0\r\n\r\n", b"", End::Err(BadChunkSize));
    check(C, b"5\rx\nhello\r\n0\r\n\r\n", b"", End::Err(BadChunkSize));
    check(C, b"5;\r\nhello\r\n", b"", End::Err(BadChunkSize));
    check(C, b"5;a=\r\nhello\r\n", b"", End::Err(BadChunkSize));
    check(C, b"5;a=\"x\r\nhello\r\n", b"", End::Err(BadChunkSize));
    check(C, b"5;a b\r\nhello\r\n", b"", End::Err(BadChunkSize));
    check(C, b"5;a \r\nhello\r\n", b"", End::Err(BadChunkSize));
    check(C, b"5;a=b c\r\nhello\r\n", b"", End::Err(BadChunkSize));
    check(C, b"5;a\0\r\nhello\r\n", b"", End::Err(BadChunkSize));
    // Size overflow: 2^63 is accepted (then truncated), anything above is refused.
    check(
        C,
        b"8000000000000000\r\nab",
        b"ab",
        End::Eof(Err(Truncated)),
    );
    check(C, b"8000000000000001\r\n", b"", End::Err(ChunkSizeOverflow));
    check(C, b"ffffffffffffffff\r\n", b"", End::Err(ChunkSizeOverflow));
    check(
        C,
        b"10000000000000000\r\n",
        b"",
        End::Err(ChunkSizeOverflow),
    );
    check(
        C,
        b"00000000000000000000001\r\nx\r\n0\r\n\r\n",
        b"x",
        done(b"", 0),
    );
    // Missing CRLF after data.
    check(
        C,
        b"5\r\nhelloX\r\n0\r\n\r\n",
        b"hello",
        End::Err(BadChunkEnd),
    );
    check(
        C,
        b"5\r\nhello\rX0\r\n\r\n",
        b"hello",
        End::Err(BadChunkEnd),
    );
    check(C, b"5\r\nhello\n0\r\n\r\n", b"hello", End::Err(BadChunkEnd));
    check(C, b"3\r\nhello\r\n0\r\n\r\n", b"hel", End::Err(BadChunkEnd));
    // Trailers.
    check(C, b"0\r\nX: a\n\r\n", b"", End::Err(BadTrailers));
    check(C, b"0\r\n\n", b"", End::Err(BadTrailers));
    check(C, b"0\r\nX: a\r\n\n", b"", End::Err(BadTrailers));
    check(C, b"0\r\nX : a\r\n\r\n", b"", End::Err(BadTrailers));
    check(C, b"0\r\n X: a\r\n\r\n", b"", End::Err(BadTrailers));
    check(C, b"0\r\nX: a\r\n b\r\n\r\n", b"", End::Err(BadTrailers));
    check(C, b"0\r\nX: a\rb\r\n\r\n", b"", End::Err(BadTrailers));
    check(C, b"0\r\nX: a\0\r\n\r\n", b"", End::Err(BadTrailers));
    check(C, b"0\r\n: a\r\n\r\n", b"", End::Err(BadTrailers));
    check(C, b"0\r\nnocolon\r\n\r\n", b"", End::Err(BadTrailers));
    // Truncation.
    check(C, b"5\r\nhel", b"hel", End::Eof(Err(Truncated)));
    check(C, b"5\r\nhello", b"hello", End::Eof(Err(Truncated)));
    check(C, b"5\r\nhello\r\n", b"hello", End::Eof(Err(Truncated)));
    check(
        C,
        b"5\r\nhello\r\n0\r\n",
        b"hello",
        End::Eof(Err(Truncated)),
    );
    check(
        C,
        b"5\r\nhello\r\n0\r\nX: y\r\n",
        b"hello",
        End::Eof(Err(Truncated)),
    );
    check(C, b"5", b"", End::Eof(Err(Truncated)));
    check(C, b"", b"", End::Eof(Err(Truncated)));
}

#[test]
fn chunked_line_limits() {
    use Framing::Chunked as C;
    // A size line of exactly the limit (CRLF included) passes; one more byte fails.
    let ext = |len: usize| format!("1;{}\r\n", "a".repeat(len - 4));
    let ok = format!("{}x\r\n0\r\n\r\n", ext(MAX_CHUNK_SIZE_LINE));
    assert_eq!(ext(MAX_CHUNK_SIZE_LINE).len(), MAX_CHUNK_SIZE_LINE);
    check(C, ok.as_bytes(), b"x", done(b"", 0));
    let long = format!("{}x\r\n0\r\n\r\n", ext(MAX_CHUNK_SIZE_LINE + 1));
    check(C, long.as_bytes(), b"", End::Err(BadChunkSize));
    check(
        C,
        "1".repeat(10_000).as_bytes(),
        b"",
        End::Err(BadChunkSize),
    );

    // Trailer section of exactly MAX_TRAILERS bytes passes.
    let line = |len: usize| format!("X: {}\r\n", "v".repeat(len - 5));
    let mut section = String::new();
    while section.len() + 1000 < MAX_TRAILERS {
        section.push_str(&line(1000));
    }
    let fill = MAX_TRAILERS - section.len();
    let exact = format!("{section}{}", line(fill));
    assert_eq!(exact.len(), MAX_TRAILERS);
    let input = format!("0\r\n{exact}\r\n");
    let (data, end) = decode(C, input.as_bytes(), 0, 4096);
    assert!(data.is_empty());
    assert_eq!(end, End::Done(Bytes::from(exact.clone()), 0));
    for step in [1, 5] {
        assert_eq!(
            decode(C, input.as_bytes(), step, 4096).1,
            End::Done(Bytes::from(exact.clone()), 0)
        );
    }
    let over = format!("0\r\n{section}{}\r\n", line(fill + 1));
    check(C, over.as_bytes(), b"", End::Err(BadTrailers));
    let endless = format!("0\r\nX: {}", "v".repeat(MAX_TRAILERS));
    check(C, endless.as_bytes(), b"", End::Err(BadTrailers));
}

#[test]
fn chunked_after_done_consumes_nothing() {
    let mut dec = BodyDecoder::new(Framing::Chunked);
    let mut buf = BytesMut::from(&b"1\r\na\r\n0\r\n\r\nNEXT"[..]);
    let mut items = Vec::new();
    loop {
        let item = dec.decode(&mut buf, 100).unwrap();
        let end = matches!(item, Decoded::Done { .. });
        items.push(item);
        if end {
            break;
        }
    }
    assert_eq!(
        items,
        vec![
            Decoded::Data(Bytes::from_static(b"a")),
            Decoded::Done {
                trailers: Bytes::new()
            }
        ]
    );
    assert_eq!(
        dec.decode(&mut buf, 100),
        Ok(Decoded::Done {
            trailers: Bytes::new()
        })
    );
    assert_eq!(&buf[..], b"NEXT");
    assert_eq!(
        dec.on_eof(),
        Ok(Decoded::Done {
            trailers: Bytes::new()
        })
    );
}

#[test]
fn large_chunk_is_split_by_max() {
    let mut input = b"4000\r\n".to_vec();
    input.extend(std::iter::repeat_n(b'z', 0x4000));
    input.extend_from_slice(b"\r\n0\r\n\r\n");
    let mut dec = BodyDecoder::new(Framing::Chunked);
    let mut buf = BytesMut::from(&input[..]);
    let mut sizes = Vec::new();
    while let Decoded::Data(d) = dec.decode(&mut buf, 4096).unwrap() {
        sizes.push(d.len());
    }
    assert_eq!(sizes, vec![4096; 4]);
    assert!(dec.is_done());
}
