//! Telemetry: lock-free latency histograms, per-route and per-group counters, and the Prometheus text exposition.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// Upper bounds of the latency buckets, in microseconds (the last bucket is +Inf).
pub const BUCKETS_US: [u64; 16] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];
const N: usize = BUCKETS_US.len() + 1;

/// A fixed-bucket latency histogram shared by all workers (one relaxed add per observation and
/// bucket, so recording costs no lock).
#[derive(Debug)]
pub struct Histogram {
    counts: [AtomicU64; N],
    sum_us: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_us: AtomicU64::new(0),
        }
    }
}

/// A histogram read at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// Per bucket (not cumulative), the last one being +Inf.
    pub counts: [u64; N],
    pub sum_us: u64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let i = BUCKETS_US.partition_point(|&b| b < us);
        self.counts[i].fetch_add(1, Relaxed);
        self.sum_us.fetch_add(us, Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            counts: std::array::from_fn(|i| self.counts[i].load(Relaxed)),
            sum_us: self.sum_us.load(Relaxed),
        }
    }
}

impl HistogramSnapshot {
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The `q` quantile (0..=1) in seconds, interpolated linearly inside its bucket as
    /// Prometheus' `histogram_quantile` does; the +Inf bucket answers its lower bound. None when
    /// empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * total as f64;
        let mut below = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            if c > 0 && (below + c) as f64 >= rank {
                let lo = if i == 0 { 0 } else { BUCKETS_US[i - 1] } as f64;
                let Some(&hi) = BUCKETS_US.get(i) else {
                    return Some(lo / 1e6);
                };
                let within = ((rank - below as f64) / c as f64).clamp(0.0, 1.0);
                return Some((lo + (hi as f64 - lo) * within) / 1e6);
            }
            below += c;
        }
        None
    }

    /// Difference from an earlier snapshot of the same histogram (for rates over a window).
    pub fn since(&self, earlier: &HistogramSnapshot) -> HistogramSnapshot {
        HistogramSnapshot {
            counts: std::array::from_fn(|i| self.counts[i].saturating_sub(earlier.counts[i])),
            sum_us: self.sum_us.saturating_sub(earlier.sum_us),
        }
    }
}

/// One route's counters; kept across reloads while the listener and route names stay.
#[derive(Debug, Default)]
pub struct RouteStats {
    /// Responses by status class: 1xx..5xx.
    pub responses: [AtomicU64; 5],
    /// From the request's first byte (accept for a connection's first request) to the end of
    /// the response.
    pub latency: Histogram,
    /// Retries granted by the route's retry policy and budget.
    pub retries: AtomicU64,
    /// Retries the policy asked for and the route's budget refused.
    pub retries_budget_exhausted: AtomicU64,
    /// Requests refused with 429 by the route's rate limit.
    pub rate_limited: AtomicU64,
}

impl RouteStats {
    pub fn record(&self, status: u16, elapsed: Duration) {
        if let Some(c) = self
            .responses
            .get(usize::from(status / 100).wrapping_sub(1))
        {
            c.fetch_add(1, Relaxed);
        }
        self.latency.observe(elapsed);
    }
}

/// One upstream group's proxy-side counters in one snapshot; the counters inside are kept across
/// reloads while the group name (and, per server, the server address) stays.
#[derive(Debug, Default)]
pub struct GroupStats {
    /// Requests refused because no server could take them.
    pub no_server: Arc<AtomicU64>,
    /// Per server (indexed like the group's servers): from picking the server to the upstream's
    /// response head (connect and any `100 Continue` included).
    pub header_time: Vec<Arc<Histogram>>,
    /// The group's bounded queue (its counters and the wake-up of waiting requests).
    pub queue: Arc<crate::upstream::queue::GroupQueue>,
}

impl GroupStats {
    /// The group's header-time histogram: the sum of its servers'.
    pub fn header_time_total(&self) -> HistogramSnapshot {
        let mut total = HistogramSnapshot {
            counts: [0; N],
            sum_us: 0,
        };
        for h in &self.header_time {
            let s = h.snapshot();
            for (t, c) in total.counts.iter_mut().zip(s.counts) {
                *t += c;
            }
            total.sum_us += s.sum_us;
        }
        total
    }
}

/// Prometheus text exposition (format 0.0.4) writer with label escaping.
pub struct Exposition {
    out: String,
}

impl Default for Exposition {
    fn default() -> Self {
        Exposition::new()
    }
}

impl Exposition {
    pub fn new() -> Self {
        Exposition {
            out: String::with_capacity(16 * 1024),
        }
    }

    /// `# HELP` and `# TYPE` lines of a metric family (once per family, before its samples).
    pub fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        write_labels(&mut self.out, labels, None);
        if value.fract() == 0.0 && value.abs() < 1e15 {
            let _ = writeln!(self.out, " {}", value as i64);
        } else {
            let _ = writeln!(self.out, " {value}");
        }
    }

    /// The `_bucket`, `_sum` and `_count` samples of one histogram.
    pub fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &HistogramSnapshot) {
        let mut cumulative = 0;
        for (i, c) in h.counts.iter().enumerate() {
            cumulative += c;
            let le = match BUCKETS_US.get(i) {
                Some(&us) => format_seconds(us),
                None => "+Inf".to_string(),
            };
            let _ = write!(self.out, "{name}_bucket");
            write_labels(&mut self.out, labels, Some(&le));
            let _ = writeln!(self.out, " {cumulative}");
        }
        let _ = write!(self.out, "{name}_sum");
        write_labels(&mut self.out, labels, None);
        let _ = writeln!(self.out, " {}", h.sum_us as f64 / 1e6);
        let _ = write!(self.out, "{name}_count");
        write_labels(&mut self.out, labels, None);
        let _ = writeln!(self.out, " {cumulative}");
    }

    pub fn finish(self) -> String {
        self.out
    }
}

fn format_seconds(us: u64) -> String {
    let s = us as f64 / 1e6;
    format!("{s}")
}

fn write_labels(out: &mut String, labels: &[(&str, &str)], le: Option<&str>) {
    if labels.is_empty() && le.is_none() {
        return;
    }
    out.push('{');
    let mut first = true;
    for (k, v) in labels.iter().copied().chain(le.map(|le| ("le", le))) {
        if !first {
            out.push(',');
        }
        first = false;
        out.push_str(k);
        out.push_str("=\"");
        for ch in v.chars() {
            match ch {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    out.push('}');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_their_bucket_and_quantiles_interpolate() {
        let h = Histogram::default();
        for _ in 0..90 {
            h.observe(Duration::from_micros(80)); // <= 100 us
        }
        for _ in 0..10 {
            h.observe(Duration::from_micros(3_000)); // (2.5 ms, 5 ms]
        }
        let s = h.snapshot();
        assert_eq!(s.count(), 100);
        assert_eq!(s.counts[0], 90);
        assert_eq!(s.counts[5], 10);
        assert_eq!(s.sum_us, 90 * 80 + 10 * 3_000);
        // p50 is inside the first bucket: 0 + 100 us * 50/90.
        let p50 = s.quantile(0.5).unwrap();
        assert!((p50 - 100e-6 * 50.0 / 90.0).abs() < 1e-9, "{p50}");
        // p99 is 9/10 of the way through (2.5 ms, 5 ms].
        let p99 = s.quantile(0.99).unwrap();
        assert!((p99 - 0.00475).abs() < 1e-9, "{p99}");
        assert_eq!(HistogramSnapshot::since(&s, &s).count(), 0);
        assert!(Histogram::default().snapshot().quantile(0.5).is_none());
    }

    #[test]
    fn bucket_edges_are_inclusive_and_overflow_goes_to_inf() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(100));
        h.observe(Duration::from_secs(60));
        let s = h.snapshot();
        assert_eq!(s.counts[0], 1);
        assert_eq!(s.counts[N - 1], 1);
        assert_eq!(s.quantile(1.0), Some(10.0));
    }

    #[test]
    fn exposition_escapes_labels_and_writes_cumulative_buckets() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(200));
        h.observe(Duration::from_micros(200));
        let mut e = Exposition::new();
        e.family("x_seconds", "histogram", "test");
        e.histogram("x_seconds", &[("route", "a\"b\\c\nd")], &h.snapshot());
        e.sample("y_total", &[], 3.0);
        let text = e.finish();
        assert!(text.contains("x_seconds_bucket{route=\"a\\\"b\\\\c\\nd\",le=\"0.0001\"} 0\n"));
        assert!(text.contains("x_seconds_bucket{route=\"a\\\"b\\\\c\\nd\",le=\"0.00025\"} 2\n"));
        assert!(text.contains("le=\"+Inf\"} 2\n"));
        assert!(text.contains("x_seconds_count{route=\"a\\\"b\\\\c\\nd\"} 2\n"));
        assert!(text.contains("x_seconds_sum{route=\"a\\\"b\\\\c\\nd\"} 0.0004\n"));
        assert!(text.ends_with("y_total 3\n"));
    }

    #[test]
    fn route_stats_count_status_classes() {
        let r = RouteStats::default();
        r.record(204, Duration::ZERO);
        r.record(503, Duration::ZERO);
        r.record(0, Duration::ZERO); // no response: latency only
        let classes: Vec<u64> = r.responses.iter().map(|c| c.load(Relaxed)).collect();
        assert_eq!(classes, vec![0, 1, 0, 0, 1]);
        assert_eq!(r.latency.snapshot().count(), 3);
    }
}
