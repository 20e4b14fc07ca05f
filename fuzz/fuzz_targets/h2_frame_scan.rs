//! Fuzz the HTTP/2 frame-header follower (`crates/proxy/src/serve/h2/frame_scan.rs`, compiled here by
//! path: it needs nothing else): no panic, and the PING ACKs it counts do not depend on how the
//! bytes are split into reads (the first input byte picks the read size).

#![no_main]

#[allow(dead_code)]
#[path = "../../crates/proxy/src/serve/h2/frame_scan.rs"]
mod frame_scan;

use frame_scan::FrameScan;
use libfuzzer_sys::fuzz_target;

/// PING ACKs in `wire` counted the slow, obvious way: walk the frames after the preface.
fn reference(wire: &[u8]) -> u32 {
    let mut at = 24;
    let mut acks = 0;
    while at + 9 <= wire.len() {
        let h = &wire[at..at + 9];
        if h[3] == 6 && h[4] & 1 != 0 {
            acks += 1;
        }
        at += 9 + (usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]));
    }
    acks
}

fuzz_target!(|data: &[u8]| {
    let Some((&split, wire)) = data.split_first() else {
        return;
    };
    let mut whole = FrameScan::new();
    whole.feed(wire);
    let mut pieces = FrameScan::new();
    for piece in wire.chunks(usize::from(split).max(1)) {
        pieces.feed(piece);
    }
    let acks = whole.take_ping_acks();
    assert_eq!(acks, pieces.take_ping_acks());
    assert_eq!(acks, reference(wire));
});
