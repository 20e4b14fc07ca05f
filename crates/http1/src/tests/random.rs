//! Property-style checks on pseudo-random input: no panics, and invariants of accepted heads.

use crate::BodyDecoder;
use crate::{parse_request, parse_response, Decoded, Framing, Limits, Method};
use bytes::BytesMut;

/// Small deterministic generator (64-bit LCG, Knuth's constants); no dependency needed.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// No bare CR and no bare LF anywhere: the naive check the parser's structural one must match.
fn crlf_only(raw: &[u8]) -> bool {
    raw.iter().enumerate().all(|(i, &b)| match b {
        b'\r' => raw.get(i + 1) == Some(&b'\n'),
        b'\n' => i > 0 && raw[i - 1] == b'\r',
        _ => true,
    })
}

const SEEDS: &[&[u8]] = &[
    b"GET /a?b HTTP/1.1\r\nHost: example.com\r\nConnection: keep-alive, x\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    b"PUT http://h:80/x HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc",
    b"\r\nCONNECT h:443 HTTP/1.1\r\nHost: h\r\n\r\n",
];

/// Bytes that matter to the grammar, to make mutations interesting.
const SPECIAL: &[u8] = b"\r\n :;,\t\0\"\\/?#*0123456789abcfxHTP.";

fn mutate(rng: &mut Lcg, seed: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..=rng.below(4) {
        let b = if rng.below(2) == 0 {
            SPECIAL[rng.below(SPECIAL.len())]
        } else {
            rng.next() as u8
        };
        match rng.below(3) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = b;
            }
            1 => {
                let i = rng.below(v.len() + 1);
                v.insert(i, b);
            }
            _ if !v.is_empty() => {
                let i = rng.below(v.len());
                v.remove(i);
            }
            _ => {}
        }
    }
    v
}

fn check_request(input: &[u8]) {
    let limits = Limits {
        max_headers: 8,
        max_head_bytes: 512,
        max_request_line: 128,
    };
    let mut buf = BytesMut::from(input);
    match parse_request(&mut buf, &limits) {
        Ok(Some(head)) => {
            let raw = head.raw().clone();
            assert!(crlf_only(&raw), "accepted bare CR/LF: {input:?}");
            assert!(raw.ends_with(b"\r\n\r\n"));
            assert!(
                input.ends_with(&[&raw[..], &buf[..]].concat()),
                "head + rest is a suffix of the input"
            );
            assert_ne!(head.framing, Framing::Close);
            let _ = (
                head.target(),
                head.path(),
                head.query(),
                head.host(),
                head.fields().count(),
            );
        }
        Ok(None) => assert_eq!(&buf[..], input),
        Err(_) => {}
    }
}

fn check_response(input: &[u8]) {
    let limits = Limits {
        max_headers: 8,
        max_head_bytes: 512,
        max_request_line: 128,
    };
    for method in [Method::Get, Method::Head, Method::Connect] {
        let mut buf = BytesMut::from(input);
        if let Ok(Some(head)) = parse_response(&mut buf, &method, &limits) {
            assert!(crlf_only(head.raw()));
            assert_eq!([&head.raw()[..], &buf[..]].concat(), input);
            let _ = (head.reason(), head.fields().count());
        }
    }
}

fn check_chunked(input: &[u8]) {
    let mut dec = BodyDecoder::new(Framing::Chunked);
    let mut buf = BytesMut::from(input);
    let mut total = 0;
    while let Ok(Decoded::Data(d)) = dec.decode(&mut buf, 7) {
        total += d.len();
    }
    assert!(total <= input.len());
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = Lcg(0x5eed);
    for _ in 0..20_000 {
        let len = rng.below(96);
        let input: Vec<u8> = (0..len)
            .map(|_| {
                if rng.below(3) == 0 {
                    SPECIAL[rng.below(SPECIAL.len())]
                } else {
                    rng.next() as u8
                }
            })
            .collect();
        check_request(&input);
        check_response(&input);
        check_chunked(&input);
    }
}

#[test]
fn mutated_messages_never_panic() {
    let mut rng = Lcg(42);
    for _ in 0..20_000 {
        let seed = SEEDS[rng.below(SEEDS.len())];
        let input = mutate(&mut rng, seed);
        check_request(&input);
        let as_response = mutate(
            &mut rng,
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nX: y\r\n\r\nabc",
        );
        check_response(&as_response);
        let chunked = mutate(&mut rng, b"5;x=\"y\"\r\nhello\r\n0\r\nT: v\r\n\r\n");
        check_chunked(&chunked);
    }
}
