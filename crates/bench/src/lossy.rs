//! `--loss`: the generator's QUIC socket drops a share of its datagrams each way, so a run measures what loss costs.

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

/// A UDP socket that drops each datagram, sent or received, with a fixed probability.
#[derive(Debug)]
pub struct Lossy {
    inner: Arc<dyn AsyncUdpSocket>,
    /// A datagram is dropped when its draw (0..2^32) falls below this.
    threshold: u64,
    /// The draws' state (xorshift64*: the loss pattern needs no more than that).
    state: AtomicU64,
}

impl Lossy {
    /// Wrap `inner`, dropping `share` (0 to 1) of the datagrams; `seed` picks the pattern.
    pub fn new(inner: Arc<dyn AsyncUdpSocket>, share: f64, seed: u64) -> Lossy {
        Lossy {
            inner,
            threshold: (share.clamp(0.0, 1.0) * (1u64 << 32) as f64) as u64,
            state: AtomicU64::new(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1),
        }
    }

    /// Whether the next datagram is lost.
    fn lose(&self) -> bool {
        let step = |mut x: u64| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x
        };
        let prev = self
            .state
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |x| Some(step(x)))
            .unwrap_or(1);
        (step(prev).wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) < self.threshold
    }

    /// Drop lost datagrams out of one received buffer (several when the kernel coalesced them,
    /// `stride` bytes each but the last): the kept ones move to the front. Returns the bytes kept.
    fn filter(&self, buf: &mut [u8], len: usize, stride: usize) -> usize {
        let stride = stride.max(1);
        let (mut read, mut kept) = (0, 0);
        while read < len {
            let n = stride.min(len - read);
            if !self.lose() {
                buf.copy_within(read..read + n, kept);
                kept += n;
            }
            read += n;
        }
        kept
    }
}

impl AsyncUdpSocket for Lossy {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        // One datagram per transmit (no segmentation offload: see max_transmit_segments).
        if self.lose() {
            return Ok(());
        }
        self.inner.try_send(transmit)
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        // One buffer at a time, so a fully lost one is simply not returned.
        let (Some(buf), Some(m)) = (bufs.first_mut(), meta.first_mut()) else {
            return Poll::Ready(Ok(0));
        };
        loop {
            let n =
                match self
                    .inner
                    .poll_recv(cx, std::slice::from_mut(buf), std::slice::from_mut(m))
                {
                    Poll::Ready(Ok(n)) => n,
                    other => return other,
                };
            if n == 0 {
                return Poll::Ready(Ok(0));
            }
            m.len = self.filter(buf, m.len, m.stride);
            if m.len > 0 {
                return Poll::Ready(Ok(1));
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        1
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lossy(share: f64) -> Lossy {
        let std = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _g = rt.enter();
        let inner = quinn::Runtime::wrap_udp_socket(&quinn::TokioRuntime, std).unwrap();
        Lossy::new(inner, share, 7)
    }

    #[test]
    fn the_share_lost_is_the_one_asked() {
        for share in [0.0, 0.01, 0.05, 0.2] {
            let l = lossy(share);
            let lost = (0..100_000).filter(|_| l.lose()).count() as f64 / 100_000.0;
            assert!((lost - share).abs() < 0.005, "{share}: {lost}");
        }
    }

    #[test]
    fn coalesced_datagrams_are_dropped_one_by_one() {
        let l = lossy(0.5);
        // Ten datagrams of 4 bytes and a short last one, each byte its datagram's number.
        let mut buf: Vec<u8> = (0..10u8).flat_map(|i| [i; 4]).chain([10, 10]).collect();
        let len = buf.len();
        let kept = l.filter(&mut buf, len, 4);
        assert!(kept > 0 && kept < len, "{kept}");
        let out = &buf[..kept];
        // Whole datagrams in order, every one but a short last of the full stride.
        let mut last = None;
        for d in out.chunks(4) {
            assert!(d.iter().all(|b| *b == d[0]), "{out:?}");
            assert!(last < Some(d[0]), "{out:?}");
            assert!(d.len() == 4 || d[0] == 10, "{out:?}");
            last = Some(d[0]);
        }
    }
}
