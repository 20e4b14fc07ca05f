//! Follows the frame headers of an HTTP/2 client's byte stream and counts its PING ACK frames (sans-io).

/// The client connection preface's length (RFC 9113 3.4).
const PREFACE_LEN: usize = 24;

/// Follows the frame headers of an HTTP/2 client's byte stream (after its 24-byte preface) and
/// counts PING frames with the ACK flag: the `h2` crate answers none of them and logs each one
/// it did not ask for, so the connection loop bounds them itself. Sans-io: bytes in, count out.
#[derive(Debug)]
pub struct FrameScan {
    /// Bytes still to skip: the preface, then each frame's payload.
    skip: usize,
    head: [u8; 9],
    /// Bytes of the current frame header in `head`.
    have: usize,
    /// PING ACK frames seen and not yet taken.
    ping_acks: u32,
}

impl FrameScan {
    pub fn new() -> FrameScan {
        FrameScan {
            skip: PREFACE_LEN,
            head: [0; 9],
            have: 0,
            ping_acks: 0,
        }
    }

    /// Follow `bytes`, the next bytes the client sent.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        loop {
            let n = self.skip.min(bytes.len());
            self.skip -= n;
            bytes = &bytes[n..];
            if bytes.is_empty() {
                return;
            }
            let n = (9 - self.have).min(bytes.len());
            self.head[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have < 9 {
                return;
            }
            self.have = 0;
            let h = self.head;
            const PING: u8 = 6;
            const ACK: u8 = 1;
            if h[3] == PING && h[4] & ACK != 0 {
                self.ping_acks = self.ping_acks.saturating_add(1);
            }
            self.skip = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
        }
    }

    /// PING ACKs seen and not yet taken.
    pub fn pending_ping_acks(&self) -> u32 {
        self.ping_acks
    }

    /// PING ACKs seen since the last call.
    pub fn take_ping_acks(&mut self) -> u32 {
        std::mem::take(&mut self.ping_acks)
    }
}

impl Default for FrameScan {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn frame_scan_counts_ping_acks_across_any_split() {
        let mut wire = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        // SETTINGS (empty), PING ACK, a PING ACK's look-alike inside a DATA payload, PING (no
        // ACK), HEADERS whose flags have bit 0 set (END_STREAM), PING ACK.
        wire.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        let ping_ack = [0, 0, 8, 6, 1, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        wire.extend_from_slice(&ping_ack);
        wire.extend_from_slice(&[0, 0, 17, 0, 0, 0, 0, 0, 1]);
        wire.extend_from_slice(&ping_ack);
        wire.extend_from_slice(&[0, 0, 8, 6, 0, 0, 0, 0, 0, 9, 9, 9, 9, 9, 9, 9, 9]);
        wire.extend_from_slice(&[0, 0, 1, 1, 5, 0, 0, 0, 3, 0x82]);
        wire.extend_from_slice(&ping_ack);
        for split in 1..wire.len() {
            let mut scan = super::FrameScan::new();
            for piece in wire.chunks(split) {
                scan.feed(piece);
            }
            assert_eq!(scan.take_ping_acks(), 2, "split {split}");
            assert_eq!(scan.take_ping_acks(), 0);
        }
    }
}
