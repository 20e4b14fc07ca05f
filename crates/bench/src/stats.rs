//! Per-thread recording of request outcomes (histograms, status and error counts, timeline) and merging.

use crate::conn::{ErrorKind, Handshake, Opened};
use crate::schedule::Timing;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Largest latency the histograms resolve (µs): one hour. Larger values are recorded as this.
pub const HIST_MAX_US: u64 = 3_600_000_000;
/// Significant decimal digits of the main histograms (3: 0.1% value resolution).
pub const HIST_SIGFIG: u8 = 3;
/// Largest latency of the per-second histograms (µs): one minute.
const SECOND_MAX_US: u64 = 60_000_000;
/// Most timeline seconds kept (a day).
const MAX_SECONDS: usize = 86_400;
/// Status codes are 100..=999.
const STATUS_SLOTS: usize = 1000;

/// A histogram of microseconds with fixed bounds.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIST_MAX_US, HIST_SIGFIG)
        .expect("constant histogram bounds are valid")
}

fn second_histogram() -> Histogram<u32> {
    Histogram::new_with_bounds(1, SECOND_MAX_US, 2).expect("constant histogram bounds are valid")
}

/// Microseconds, for recording.
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// One second of the measured phase, by completion time.
#[derive(Debug, Clone)]
pub struct Second {
    pub completed: u64,
    pub errors: u64,
    /// Latencies (µs) of the requests completed in this second.
    pub latency: Histogram<u32>,
}

/// Counters a progress display reads while the run goes on.
#[derive(Debug, Default)]
pub struct Live {
    pub completed: AtomicU64,
    pub errors: AtomicU64,
    /// p99 latency (µs) of the last whole second this thread saw.
    pub last_p99_us: AtomicU64,
}

/// Everything one worker thread recorded; merged over threads at the end.
#[derive(Debug, Clone)]
pub struct Recorder {
    /// Latency from the intended send time (open loop) or the send (closed loop), µs.
    pub latency: Histogram<u64>,
    /// From the actual send to the response, µs.
    pub service: Histogram<u64>,
    /// Actual send minus intended send (open loop), µs.
    pub send_lag: Histogram<u64>,
    /// The generator's own delay: actual send minus when the request was ready (open loop), µs.
    pub generator_lag: Histogram<u64>,
    /// Completed requests by status code.
    pub status: Vec<u64>,
    /// Failed requests by kind.
    pub errors: [u64; ErrorKind::ALL.len()],
    /// Response bytes (heads and bodies) of measured requests.
    pub bytes: u64,
    /// Measured requests that waited for their connection (open loop).
    pub queued: u64,
    /// Measured requests: scheduled (open loop) or sent (closed loop).
    pub scheduled: u64,
    pub completed: u64,
    pub failed: u64,
    /// Sent but unfinished when the run stopped.
    pub in_flight: u64,
    /// Scheduled but never sent.
    pub unsent: u64,
    /// Warm-up requests that completed, failed or were cut (not in any histogram).
    pub warmup_completed: u64,
    pub warmup_failed: u64,
    pub warmup_in_flight: u64,
    pub timeline: Vec<Second>,
    /// Connections opened for measured requests (one per request with `--close`).
    pub connections: u64,
    /// TLS handshakes of measured requests' connections.
    pub tls: Handshakes,
    /// TLS handshakes before the measured phase (connections opened ahead, warm-up).
    pub setup_tls: Handshakes,
    /// What the first TLS handshake negotiated.
    pub negotiated: Option<Handshake>,
    /// Several URLs: measured requests per URL index, (completed, failed).
    pub per_url: Vec<(u64, u64)>,
    live: Arc<Live>,
}

/// TLS handshakes, full and resumed, and the outcome of those that sent 0-RTT data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handshakes {
    pub full: u64,
    pub resumed: u64,
    /// Connections whose 0-RTT requests the server accepted (`--early-data`).
    #[serde(default)]
    pub early: u64,
    /// Connections whose 0-RTT requests the server refused (their requests went again, on new
    /// connections).
    #[serde(default)]
    pub early_refused: u64,
}

impl Handshakes {
    fn count(&mut self, hs: &Handshake) {
        match hs.resumed {
            true => self.resumed += 1,
            false => self.full += 1,
        }
        match hs.early {
            Some(true) => self.early += 1,
            Some(false) => self.early_refused += 1,
            None => {}
        }
    }

    fn add(&mut self, o: &Handshakes) {
        self.full += o.full;
        self.resumed += o.resumed;
        self.early += o.early;
        self.early_refused += o.early_refused;
    }
}

impl Recorder {
    pub fn new(live: Arc<Live>) -> Recorder {
        Recorder {
            latency: new_histogram(),
            service: new_histogram(),
            send_lag: new_histogram(),
            generator_lag: new_histogram(),
            status: vec![0; STATUS_SLOTS],
            errors: [0; ErrorKind::ALL.len()],
            bytes: 0,
            queued: 0,
            scheduled: 0,
            completed: 0,
            failed: 0,
            in_flight: 0,
            unsent: 0,
            warmup_completed: 0,
            warmup_failed: 0,
            warmup_in_flight: 0,
            timeline: Vec::new(),
            connections: 0,
            tls: Handshakes::default(),
            setup_tls: Handshakes::default(),
            negotiated: None,
            per_url: Vec::new(),
            live,
        }
    }

    /// A measured request to URL `index` completed (`ok`) or failed (`failed`); neither when it
    /// was cut at the end.
    pub fn url_outcome(&mut self, index: usize, ok: bool, failed: bool) {
        if self.per_url.len() <= index {
            self.per_url.resize(index + 1, (0, 0));
        }
        if let Some(slot) = self.per_url.get_mut(index) {
            slot.0 += u64::from(ok);
            slot.1 += u64::from(failed);
        }
    }

    /// A connection was opened (for a measured request, or before the measured phase).
    pub fn opened(&mut self, measured: bool, o: &Opened) {
        if measured {
            self.connections += 1;
        }
        if let Some(hs) = &o.tls {
            match measured {
                true => self.tls.count(hs),
                false => self.setup_tls.count(hs),
            }
            if self.negotiated.is_none() {
                self.negotiated = Some(*hs);
            }
        }
    }

    /// The timeline second for a completion `since_start` after the start of the measured phase.
    fn second(&mut self, since_start: Duration) -> Option<&mut Second> {
        let idx = usize::try_from(since_start.as_secs()).ok()?;
        if idx >= MAX_SECONDS {
            return None;
        }
        if idx >= self.timeline.len() {
            // Publish the p99 of the last second seen before opening new ones.
            if let Some(last) = self.timeline.last() {
                let p99 = last.latency.value_at_quantile(0.99);
                self.live.last_p99_us.store(p99, Ordering::Relaxed);
            }
            while self.timeline.len() <= idx {
                self.timeline.push(Second {
                    completed: 0,
                    errors: 0,
                    latency: second_histogram(),
                });
            }
        }
        self.timeline.get_mut(idx)
    }

    /// A complete response. `open` says whether `timing.intended` is a schedule time (open loop).
    pub fn response(
        &mut self,
        measured: bool,
        open: bool,
        timing: &Timing,
        status: u16,
        bytes: u64,
        since_start: Duration,
    ) {
        self.live.completed.fetch_add(1, Ordering::Relaxed);
        if !measured {
            self.warmup_completed += 1;
            return;
        }
        self.completed += 1;
        self.bytes = self.bytes.saturating_add(bytes);
        if let Some(n) = self.status.get_mut(usize::from(status)) {
            *n += 1;
        }
        let latency = micros(timing.latency());
        self.latency.saturating_record(latency);
        self.service.saturating_record(micros(timing.service()));
        if open {
            self.send_lag.saturating_record(micros(timing.send_lag()));
            self.generator_lag
                .saturating_record(micros(timing.generator_lag()));
            if timing.queued() {
                self.queued += 1;
            }
        }
        if let Some(s) = self.second(since_start) {
            s.completed += 1;
            s.latency.saturating_record(latency);
        }
    }

    /// A failed request.
    pub fn error(
        &mut self,
        measured: bool,
        open: bool,
        timing: &Timing,
        kind: ErrorKind,
        since_start: Duration,
    ) {
        self.live.errors.fetch_add(1, Ordering::Relaxed);
        if !measured {
            self.warmup_failed += 1;
            return;
        }
        self.failed += 1;
        if let Some(n) = self.errors.get_mut(kind.index()) {
            *n += 1;
        }
        if open {
            self.generator_lag
                .saturating_record(micros(timing.generator_lag()));
            self.send_lag.saturating_record(micros(timing.send_lag()));
            if timing.queued() {
                self.queued += 1;
            }
        }
        if let Some(s) = self.second(since_start) {
            s.errors += 1;
        }
    }

    /// A request still unfinished when the run stopped.
    pub fn unfinished(&mut self, measured: bool) {
        if measured {
            self.in_flight += 1;
        } else {
            self.warmup_in_flight += 1;
        }
    }

    /// Fold another thread's recording into this one.
    pub fn merge(&mut self, other: &Recorder) -> Result<(), String> {
        for (a, b) in [
            (&mut self.latency, &other.latency),
            (&mut self.service, &other.service),
            (&mut self.send_lag, &other.send_lag),
            (&mut self.generator_lag, &other.generator_lag),
        ] {
            a.add(b).map_err(|e| format!("merging histograms: {e:?}"))?;
        }
        for (a, b) in self.status.iter_mut().zip(&other.status) {
            *a += b;
        }
        for (a, b) in self.errors.iter_mut().zip(&other.errors) {
            *a += b;
        }
        self.bytes = self.bytes.saturating_add(other.bytes);
        self.queued += other.queued;
        self.scheduled += other.scheduled;
        self.completed += other.completed;
        self.failed += other.failed;
        self.in_flight += other.in_flight;
        self.unsent += other.unsent;
        self.warmup_completed += other.warmup_completed;
        self.warmup_failed += other.warmup_failed;
        self.warmup_in_flight += other.warmup_in_flight;
        self.connections += other.connections;
        self.tls.add(&other.tls);
        self.setup_tls.add(&other.setup_tls);
        if self.negotiated.is_none() {
            self.negotiated = other.negotiated;
        }
        if self.per_url.len() < other.per_url.len() {
            self.per_url.resize(other.per_url.len(), (0, 0));
        }
        for (a, b) in self.per_url.iter_mut().zip(&other.per_url) {
            a.0 += b.0;
            a.1 += b.1;
        }
        if self.timeline.len() < other.timeline.len() {
            self.timeline.resize_with(other.timeline.len(), || Second {
                completed: 0,
                errors: 0,
                latency: second_histogram(),
            });
        }
        for (a, b) in self.timeline.iter_mut().zip(&other.timeline) {
            a.completed += b.completed;
            a.errors += b.errors;
            a.latency
                .add(&b.latency)
                .map_err(|e| format!("merging histograms: {e:?}"))?;
        }
        Ok(())
    }

    /// Count of failed requests of one kind.
    pub fn errors_of(&self, kind: ErrorKind) -> u64 {
        self.errors.get(kind.index()).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn timing(intended: u64, sent: u64, done: u64) -> Timing {
        Timing {
            intended: ms(intended),
            free: ms(0),
            sent: ms(sent),
            done: ms(done),
        }
    }

    #[test]
    fn merging_threads_adds_everything() {
        let mut a = Recorder::new(Arc::default());
        let mut b = Recorder::new(Arc::default());
        for i in 0..90 {
            a.response(true, true, &timing(i, i, i + 1), 200, 100, ms(i * 10));
        }
        for i in 0..10 {
            b.response(true, true, &timing(i, i + 50, i + 100), 503, 10, ms(2500));
        }
        b.error(true, true, &timing(0, 0, 0), ErrorKind::Reset, ms(2600));
        b.response(false, true, &timing(0, 0, 1), 200, 1, ms(0));
        b.unfinished(true);
        let hs = |resumed, early| Opened {
            tls: Some(Handshake {
                resumed,
                early,
                version: Some("TLSv1_3"),
                suite: None,
                group: Some("X25519"),
            }),
        };
        a.opened(false, &hs(false, None));
        a.opened(true, &hs(true, None));
        a.opened(true, &hs(true, Some(true)));
        b.opened(true, &hs(false, None));
        b.opened(true, &hs(true, Some(false)));
        b.opened(true, &Opened { tls: None });
        a.merge(&b).unwrap();
        assert_eq!(a.connections, 5);
        assert_eq!(
            a.tls,
            Handshakes {
                full: 1,
                resumed: 3,
                early: 1,
                early_refused: 1
            }
        );
        assert_eq!(
            a.setup_tls,
            Handshakes {
                full: 1,
                ..Handshakes::default()
            }
        );
        assert_eq!(a.negotiated.and_then(|n| n.group), Some("X25519"));
        assert_eq!(a.latency.len(), 100);
        assert_eq!(a.completed, 100);
        assert_eq!(a.failed, 1);
        assert_eq!(a.in_flight, 1);
        assert_eq!(a.warmup_completed, 1);
        assert_eq!((a.status[200], a.status[503]), (90, 10));
        assert_eq!(a.errors_of(ErrorKind::Reset), 1);
        assert_eq!(a.bytes, 9100);
        // p90 is a's 1 ms; the top 10% are b's 100 ms latencies; service time stays 50 ms.
        assert!(a.latency.value_at_quantile(0.90) <= 1001);
        assert!(a.latency.value_at_quantile(0.95) >= 100_000);
        assert_eq!(a.service.max(), a.service.highest_equivalent(50_000));
        // Timeline: a's completions in second 0, b's in second 2.
        assert_eq!(a.timeline.len(), 3);
        assert_eq!(
            a.timeline
                .iter()
                .map(|s| (s.completed, s.errors))
                .collect::<Vec<_>>(),
            [(90, 0), (0, 0), (10, 1)]
        );
        assert!(a.timeline[2].latency.value_at_quantile(0.5) >= 99_000);
    }

    #[test]
    fn per_url_counts_merge_by_index() {
        let mut a = Recorder::new(Arc::default());
        let mut b = Recorder::new(Arc::default());
        a.url_outcome(1, true, false);
        b.url_outcome(2, false, true);
        b.url_outcome(1, true, false);
        a.merge(&b).unwrap();
        assert_eq!(a.per_url, [(0, 0), (2, 0), (0, 1)]);
    }

    #[test]
    fn huge_latencies_saturate() {
        let mut a = Recorder::new(Arc::default());
        a.response(
            true,
            false,
            &timing(0, 0, 10 * 3_600_000),
            200,
            0,
            Duration::from_secs(100_000),
        );
        assert_eq!(a.latency.len(), 1);
        assert!(a.latency.max() >= HIST_MAX_US);
        assert!(a.timeline.is_empty());
    }
}
