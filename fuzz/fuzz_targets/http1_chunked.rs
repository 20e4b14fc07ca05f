//! Fuzz the chunked decoder: no panics, data bounded by input, feeding pattern does not matter.

#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use portico_http1::{encode, BodyDecoder, BodyError, Decoded, Framing};

#[derive(Debug, Clone, PartialEq, Eq)]
enum End {
    /// Done, with the trailers and the number of input bytes left after the body.
    Done(Bytes, usize),
    /// Input ran out; on_eof said this.
    Eof(Result<(), BodyError>),
    Err(BodyError),
}

/// Decode `input` fed `step` bytes at a time (0: all at once), items of at most `max` bytes.
fn run(input: &[u8], step: usize, max: usize) -> (Vec<u8>, End) {
    let mut dec = BodyDecoder::new(Framing::Chunked);
    let mut buf = BytesMut::new();
    let mut data = Vec::new();
    let mut fed = 0;
    loop {
        match dec.decode(&mut buf, max) {
            Ok(Decoded::Data(d)) => {
                assert!(!d.is_empty() && d.len() <= max.max(1));
                data.extend_from_slice(&d);
                assert!(data.len() <= input.len(), "more data out than bytes in");
            }
            Ok(Decoded::Done { trailers }) => {
                assert!(dec.is_done());
                return (data, End::Done(trailers, buf.len() + input.len() - fed));
            }
            Ok(Decoded::NeedMore) => {
                if fed == input.len() {
                    let eof = dec.on_eof().map(|_| ());
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

fuzz_target!(|input: &[u8]| {
    // First byte: item size and an odd feeding step.
    let Some((&knob, input)) = input.split_first() else {
        return;
    };
    let max = usize::from(knob % 64) + 1;
    let step = usize::from(knob / 64) * 2 + 3;

    let (data, end) = run(input, 0, 4096);
    assert!(data.len() <= input.len());
    assert_eq!(
        run(input, 1, max),
        (data.clone(), end.clone()),
        "byte at a time differs"
    );
    assert_eq!(
        run(input, step, 4096),
        (data.clone(), end.clone()),
        "step {step} differs"
    );

    if let End::Done(trailers, left) = &end {
        // Trailer lines are CRLF-terminated field lines; the body ends where the input says.
        assert!(trailers.is_empty() || trailers.ends_with(b"\r\n"));
        let body_len = input.len() - left;
        assert!(input[..body_len].ends_with(b"\r\n"));
        // Re-encode and decode again.
        let mut out = BytesMut::new();
        for piece in data.chunks(1000) {
            encode::chunk_header(&mut out, piece.len());
            out.extend_from_slice(piece);
            out.extend_from_slice(b"\r\n");
        }
        encode::last_chunk(&mut out, trailers);
        assert_eq!(
            run(&out, 0, 4096),
            (data.clone(), End::Done(trailers.clone(), 0))
        );
    }
});
