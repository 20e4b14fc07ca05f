//! The results of a run: the accounting, distributions, CPU, timeline, warnings; as text and JSON.

use crate::config::{Config, Mode, Stop};
use crate::conn::ErrorKind;
pub use crate::stats::Handshakes;
use crate::stats::Recorder;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Version of the JSON layout (2: `kind`, `label`, `command`, `started`, `host`, `p95`,
/// `spectrum`; sweeps).
pub const JSON_VERSION: u32 = 2;

/// Percentiles printed in the summary.
pub const PERCENTILES: [f64; 8] = [50.0, 75.0, 90.0, 99.0, 99.9, 99.99, 99.999, 99.9999];

/// Percentiles in the JSON `percentiles` maps: the printed ones and p95 (the reports plot it).
pub const JSON_PERCENTILES: [f64; 9] = [50.0, 75.0, 90.0, 95.0, 99.0, 99.9, 99.99, 99.999, 99.9999];

/// Generator lag (p99) above which the run is flagged: the client, not the server, was late.
pub const MAX_GENERATOR_LAG_MS: f64 = 1.0;

/// Share of requests that waited for their connection above which the summary warns.
const QUEUED_WARN_SHARE: f64 = 0.01;

/// Every measured request, accounted for: `scheduled == completed + errors + in_flight + unsent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accounting {
    /// Open loop: requests the schedule put in the measured phase. Closed loop: requests sent.
    pub scheduled: u64,
    /// Requests that went out (`completed + errors + in_flight`).
    pub sent: u64,
    /// Complete responses, whatever their status.
    pub completed: u64,
    /// Requests that failed (see `errors`).
    pub errors: u64,
    /// Requests sent but unfinished when the run stopped (after the drain).
    pub in_flight: u64,
    /// Requests scheduled but never sent (their connection was still busy at the end).
    pub unsent: u64,
}

/// Warm-up requests, excluded from everything else.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Warmup {
    pub seconds: f64,
    pub completed: u64,
    pub errors: u64,
    pub in_flight: u64,
}

/// A latency distribution in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dist {
    pub count: u64,
    pub mean_ms: f64,
    pub stdev_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    /// Keys `p50`, `p75`, `p90`, `p95`, `p99`, `p99.9`, `p99.99`, `p99.999`, `p99.9999`.
    pub percentiles: BTreeMap<String, f64>,
}

impl Dist {
    /// From a histogram of microseconds.
    pub fn of(h: &Histogram<u64>) -> Dist {
        let empty = h.is_empty();
        let ms = |us: u64| if empty { 0.0 } else { us as f64 / 1000.0 };
        Dist {
            count: h.len(),
            mean_ms: h.mean() / 1000.0,
            stdev_ms: h.stdev() / 1000.0,
            min_ms: ms(h.min()),
            max_ms: ms(h.max()),
            percentiles: JSON_PERCENTILES
                .iter()
                .map(|p| (format!("p{p}"), ms(h.value_at_quantile(p / 100.0))))
                .collect(),
        }
    }

    /// The value at percentile `p` (one of [`JSON_PERCENTILES`]), ms; 0 when absent.
    pub fn at(&self, p: f64) -> f64 {
        self.percentiles
            .get(&format!("p{p}"))
            .copied()
            .unwrap_or(0.0)
    }
}

/// CPU time of the processes named by `--pid` during the measured phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuReport {
    pub pids: Vec<u32>,
    /// Processes in the trees at the end (roots and descendants).
    pub processes: usize,
    /// utime + stime, seconds (10 ms resolution).
    pub seconds: f64,
    /// Share of one core over the measured phase, percent.
    pub percent_of_core: f64,
    /// CPU microseconds per completed request.
    pub us_per_request: Option<f64>,
}

/// CPU time of the load generator itself during the measured phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GeneratorCpu {
    pub seconds: f64,
    pub percent_of_core: f64,
    pub us_per_request: Option<f64>,
}

/// Several URLs: the measured requests of one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UrlReport {
    pub url: String,
    pub completed: u64,
    pub errors: u64,
}

/// HTTPS runs: what was offered, what was negotiated, and the handshakes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TlsReport {
    /// What the flags asked for.
    pub settings: crate::tls::TlsSettings,
    /// Negotiated by the first handshake (e.g. `TLSv1_3`, `TLS13_AES_128_GCM_SHA256`, `X25519`).
    pub version: Option<String>,
    pub cipher_suite: Option<String>,
    pub group: Option<String>,
    /// Handshakes of the connections measured requests opened.
    pub handshakes: Handshakes,
    /// Handshakes before the measured phase (connections opened ahead, warm-up).
    pub setup_handshakes: Handshakes,
}

/// One second of the measured phase, by completion time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SecondReport {
    pub second: u64,
    pub completed: u64,
    pub errors: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// What was measured besides the recording: wall time and CPU samples.
#[derive(Debug, Clone, Default)]
pub struct Measured {
    /// Measured phase wall time (from the end of the warm-up to the last request's end), seconds.
    pub elapsed_s: f64,
    /// CPU ticks of the `--pid` trees over the measured phase and the processes seen.
    pub cpu_ticks: Option<(u64, usize)>,
    /// The generator's own CPU ticks over the measured phase.
    pub self_ticks: Option<u64>,
    /// Problems found while measuring (e.g. a `--pid` process that went away).
    pub notes: Vec<String>,
    /// Wall-clock start of the measured phase.
    pub started: Option<std::time::SystemTime>,
}

/// The machine a run ran on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Host {
    /// `model name` of /proc/cpuinfo.
    pub cpu: String,
    /// Logical CPUs online.
    pub cpus: usize,
    /// /proc/sys/kernel/osrelease.
    pub kernel: String,
    /// The load average (1, 5 and 15 minutes) when the host was read: a figure above the CPU
    /// count says other work shared the machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_average: Option<[f64; 3]>,
}

/// The load average of /proc/loadavg (1, 5, 15 minutes).
pub fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = text.split_whitespace().map(|v| v.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

impl Host {
    /// This machine (empty strings for what cannot be read).
    pub fn this() -> Host {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_default();
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|k| k.trim().to_string())
            .unwrap_or_default();
        Host {
            cpu,
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            kernel,
            load_average: load_average(),
        }
    }
}

/// The full result of a run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub version: u32,
    /// `run` (a sweep's JSON has `sweep`).
    #[serde(default = "kind_run")]
    pub kind: String,
    /// Name of the run in reports: `--label`, else the URL.
    #[serde(default)]
    pub label: String,
    /// The command line that ran it, when known.
    #[serde(default)]
    pub command: Option<String>,
    /// Version of the `portico` that ran it.
    #[serde(default)]
    pub portico_version: String,
    /// Start of the measured phase, UTC, RFC 3339.
    #[serde(default)]
    pub started: String,
    #[serde(default)]
    pub host: Host,
    pub target: String,
    pub method: String,
    /// `open` or `closed`.
    pub mode: String,
    /// Open loop: requests/s offered.
    pub offered_rate: Option<f64>,
    pub connections: usize,
    pub threads: usize,
    /// False with `--close` (a new connection per request).
    pub keep_alive: bool,
    /// `HTTP/1.1` or `HTTP/2` (`--h2`); files written before `--h2` existed are HTTP/1.1.
    #[serde(default = "http11")]
    pub protocol: String,
    /// HTTP/2: streams in flight per connection (`--streams`).
    #[serde(default)]
    pub streams: Option<usize>,
    /// HTTP/3 `--loss`: the share of datagrams the generator dropped each way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    pub planned_duration_s: Option<f64>,
    pub planned_requests: Option<u64>,
    pub timeout_s: f64,
    pub warmup: Warmup,
    /// Measured phase wall time (to the end of the last request, drain included), seconds.
    pub elapsed_s: f64,
    pub requests: Accounting,
    /// Completed requests per second of the measured window (the planned duration, or the
    /// actual time of a `--requests` run).
    pub achieved_rate: f64,
    pub bytes: u64,
    pub bytes_per_s: f64,
    /// Connections opened for measured requests (one per request with `--close`: the
    /// connections-per-second test).
    #[serde(default)]
    pub connections_opened: u64,
    /// `connections_opened` per second of the measured window.
    #[serde(default)]
    pub connections_per_s: f64,
    /// HTTPS runs.
    #[serde(default)]
    pub tls: Option<TlsReport>,
    /// Runs on several URLs (requested in turn): each one's measured requests. Empty for one URL.
    #[serde(default)]
    pub urls: Vec<UrlReport>,
    /// Completed requests by status code.
    pub status: BTreeMap<String, u64>,
    /// Completed requests by class (`2xx`...).
    pub status_classes: BTreeMap<String, u64>,
    /// Failed requests by kind.
    pub errors: BTreeMap<String, u64>,
    /// Response time: from the intended send time in open loop (coordinated omission corrected),
    /// from the actual send in closed loop.
    pub latency: Dist,
    /// From the actual send to the response.
    pub service: Dist,
    /// Open loop: actual send minus intended send.
    pub send_lag: Option<Dist>,
    /// Open loop: the generator's own delay (send lag not caused by waiting for a busy connection).
    pub generator_lag: Option<Dist>,
    /// Open loop: measured requests that waited for their connection.
    pub queued: u64,
    pub cpu: Option<CpuReport>,
    pub generator_cpu: Option<GeneratorCpu>,
    pub timeline: Vec<SecondReport>,
    pub warnings: Vec<String>,
    /// The latency percentile distribution as the `.hgrm` rows give it: `[percentile (0..=100),
    /// latency ms]`, 5 ticks per half distance to 100%, the last row the maximum.
    #[serde(default)]
    pub spectrum: Vec<(f64, f64)>,
    /// The latency histogram (µs), for `.hgrm` output (not in the JSON).
    #[serde(skip, default = "crate::stats::new_histogram")]
    pub latency_histogram: Histogram<u64>,
}

pub(crate) fn http11() -> String {
    "HTTP/1.1".to_string()
}

/// The protocol a run speaks, as the reports name it.
pub(crate) fn protocol_of(cfg: &Config) -> String {
    match (cfg.h2, cfg.h3) {
        (_, true) => "HTTP/3",
        (true, _) => "HTTP/2",
        _ => "HTTP/1.1",
    }
    .to_string()
}

fn kind_run() -> String {
    "run".to_string()
}

/// The percentile spectrum of a histogram of µs, in ms (see [`Report::spectrum`]).
pub fn spectrum(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    if h.is_empty() {
        return Vec::new();
    }
    h.iter_quantiles(crate::hgrm::TICKS_PER_HALF_DISTANCE)
        .map(|v| {
            (
                v.quantile_iterated_to() * 100.0,
                v.value_iterated_to() as f64 / 1000.0,
            )
        })
        .collect()
}

/// `t` as RFC 3339 UTC to the second, e.g. `2026-11-22T10:04:05Z`.
pub fn rfc3339(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = portico_http1::calendar::civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

impl Report {
    /// Assemble the report of a run.
    pub fn build(cfg: &Config, rec: &Recorder, m: &Measured) -> Report {
        let open = matches!(cfg.mode, Mode::Open { .. });
        let requests = Accounting {
            scheduled: rec.scheduled,
            sent: rec.completed + rec.failed + rec.in_flight,
            completed: rec.completed,
            errors: rec.failed,
            in_flight: rec.in_flight,
            unsent: rec.unsent,
        };
        // Rates are over the measured window: the planned duration (responses that complete in the
        // drain after it count), or the actual time of a count-limited run.
        let elapsed = match cfg.stop {
            Stop::Duration(d) => d.as_secs_f64(),
            Stop::Requests(_) => m.elapsed_s,
        }
        .max(1e-9);
        let per_request =
            |secs: f64| (rec.completed > 0).then(|| secs * 1e6 / rec.completed as f64);
        let mut status = BTreeMap::new();
        let mut classes = BTreeMap::new();
        for (code, n) in rec.status.iter().enumerate().filter(|(_, n)| **n > 0) {
            status.insert(code.to_string(), *n);
            *classes.entry(format!("{}xx", code / 100)).or_insert(0) += n;
        }
        let errors = ErrorKind::ALL
            .iter()
            .map(|k| (k.key().to_string(), rec.errors_of(*k)))
            .filter(|(_, n)| *n > 0)
            .collect();
        let timeline = rec
            .timeline
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let q = |x: f64| {
                    if s.latency.is_empty() {
                        0.0
                    } else {
                        s.latency.value_at_quantile(x) as f64 / 1000.0
                    }
                };
                SecondReport {
                    second: i as u64,
                    completed: s.completed,
                    errors: s.errors,
                    p50_ms: q(0.5),
                    p99_ms: q(0.99),
                }
            })
            .collect();
        let cpu = m.cpu_ticks.map(|(ticks, processes)| {
            let seconds = crate::cpu::seconds(ticks);
            CpuReport {
                pids: cfg.pids.clone(),
                processes,
                seconds,
                percent_of_core: seconds * 100.0 / elapsed,
                us_per_request: per_request(seconds),
            }
        });
        let generator_cpu = m.self_ticks.map(|ticks| {
            let seconds = crate::cpu::seconds(ticks);
            GeneratorCpu {
                seconds,
                percent_of_core: seconds * 100.0 / elapsed,
                us_per_request: per_request(seconds),
            }
        });
        let mut r = Report {
            version: JSON_VERSION,
            kind: kind_run(),
            label: cfg.label.clone().unwrap_or_else(|| cfg.target.url.clone()),
            command: cfg.command.clone(),
            portico_version: env!("CARGO_PKG_VERSION").to_string(),
            started: m.started.map(rfc3339).unwrap_or_default(),
            host: Host::this(),
            target: cfg.target.url.clone(),
            method: cfg.method.as_str().to_string(),
            mode: if open { "open" } else { "closed" }.to_string(),
            offered_rate: match cfg.mode {
                Mode::Open { rate } => Some(rate),
                Mode::Closed => None,
            },
            connections: cfg.connections,
            threads: cfg.threads,
            keep_alive: !cfg.close,
            protocol: protocol_of(cfg),
            streams: (cfg.h2 || cfg.h3).then_some(cfg.streams),
            loss: (cfg.loss > 0.0).then_some(cfg.loss),
            planned_duration_s: match cfg.stop {
                Stop::Duration(d) => Some(d.as_secs_f64()),
                Stop::Requests(_) => None,
            },
            planned_requests: match cfg.stop {
                Stop::Requests(n) => Some(n),
                Stop::Duration(_) => None,
            },
            timeout_s: cfg.timeout.as_secs_f64(),
            warmup: Warmup {
                seconds: cfg.warmup.as_secs_f64(),
                completed: rec.warmup_completed,
                errors: rec.warmup_failed,
                in_flight: rec.warmup_in_flight,
            },
            elapsed_s: m.elapsed_s,
            requests,
            achieved_rate: rec.completed as f64 / elapsed,
            bytes: rec.bytes,
            bytes_per_s: rec.bytes as f64 / elapsed,
            connections_opened: rec.connections,
            connections_per_s: rec.connections as f64 / elapsed,
            tls: cfg.tls.as_ref().map(|t| TlsReport {
                settings: t.settings.clone(),
                version: rec.negotiated.and_then(|n| n.version).map(String::from),
                cipher_suite: rec.negotiated.and_then(|n| n.suite).map(String::from),
                group: rec.negotiated.and_then(|n| n.group).map(String::from),
                handshakes: rec.tls,
                setup_handshakes: rec.setup_tls,
            }),
            urls: if cfg.targets.len() > 1 {
                cfg.targets
                    .iter()
                    .enumerate()
                    .map(|(i, t)| {
                        let (completed, errors) = rec.per_url.get(i).copied().unwrap_or_default();
                        UrlReport {
                            url: t.url.clone(),
                            completed,
                            errors,
                        }
                    })
                    .collect()
            } else {
                Vec::new()
            },
            status,
            status_classes: classes,
            errors,
            latency: Dist::of(&rec.latency),
            service: Dist::of(&rec.service),
            send_lag: open.then(|| Dist::of(&rec.send_lag)),
            generator_lag: open.then(|| Dist::of(&rec.generator_lag)),
            queued: rec.queued,
            cpu,
            generator_cpu,
            timeline,
            warnings: Vec::new(),
            spectrum: spectrum(&rec.latency),
            latency_histogram: rec.latency.clone(),
        };
        r.warnings = r.find_warnings(&m.notes);
        r
    }

    /// Completed responses whose status was not 2xx.
    pub fn non_2xx(&self) -> u64 {
        let classes = self.status_classes.iter();
        classes
            .filter(|(k, _)| k.as_str() != "2xx")
            .map(|(_, n)| n)
            .sum()
    }

    fn find_warnings(&self, notes: &[String]) -> Vec<String> {
        let mut w = Vec::new();
        let a = &self.requests;
        if let Some(lag) = &self.generator_lag {
            let p99 = lag.at(99.0);
            if lag.count > 0 && p99 > MAX_GENERATOR_LAG_MS {
                w.push(format!(
                    "the load generator fell behind its own schedule: p99 of its send lag (from when a \
                     request was due on a free connection to when it went out) is {p99:.3} ms > \
                     {MAX_GENERATOR_LAG_MS} ms, so latencies include the client's own delay. Use more \
                     --threads (and cores), fewer connections, or a lower --rate"
                ));
            }
        }
        if a.unsent > 0 {
            w.push(format!(
                "only {} of {} scheduled requests were sent: {} were never sent because their \
                 connection was still busy when the run ended (the offered rate was not delivered; \
                 raise {} if the server is slow, or see the lag above)",
                a.sent,
                a.scheduled,
                a.unsent,
                if self.streams.is_some() {
                    "--connections or --streams"
                } else {
                    "--connections"
                }
            ));
        }
        if let Some(rate) = self.offered_rate {
            if a.scheduled > 0 && self.queued as f64 > QUEUED_WARN_SHARE * a.scheduled as f64 {
                let (why, capacity, knobs) = match self.streams {
                    Some(m) => (
                        "every stream slot of their connection was taken by a late response",
                        format!("{} connections of {m} streams", self.connections),
                        "--connections or --streams",
                    ),
                    None => (
                        "the previous response on it was late",
                        format!("{} connections", self.connections),
                        "--connections",
                    ),
                };
                w.push(format!(
                    "{} requests ({:.2}%) waited for their connection because {why}; their latency \
                     includes that wait, as it should. If this is more than a stall, {capacity} \
                     cannot carry {rate} req/s at this latency: raise {knobs}",
                    self.queued,
                    100.0 * self.queued as f64 / a.scheduled as f64,
                ));
            }
        }
        if a.in_flight > 0 {
            w.push(format!(
                "{} requests were still in flight when the run stopped: they are counted but not in \
                 the latency distribution",
                a.in_flight
            ));
        }
        let non_2xx = self.non_2xx();
        if a.errors > 0 || non_2xx > 0 {
            w.push(format!(
                "{} errors and {non_2xx} non-2xx responses: not a clean run, void for performance claims",
                a.errors
            ));
        }
        if let Some(t) = &self.tls {
            let h = t.handshakes;
            if t.settings.resumption && h.resumed == 0 && h.full > 1 {
                w.push(format!(
                    "TLS session resumption was on but the server resumed none of {} handshakes",
                    h.full
                ));
            }
            if t.settings.early_data && h.early == 0 && h.early_refused == 0 {
                w.push(match h.resumed {
                    0 => "0-RTT was asked (--early-data) but no connection resumed a session to \
                          send it on (a connection tries from its second handshake on: --close)"
                        .to_string(),
                    n => format!(
                        "0-RTT was asked (--early-data) but none of {n} resumed handshakes \
                         carried 0-RTT data"
                    ),
                });
            }
            if h.early_refused > 0 {
                w.push(format!(
                    "the server refused the 0-RTT data of {} connections (accepted {}): their \
                     requests went again on new connections, each counted in connections per \
                     second",
                    h.early_refused, h.early
                ));
            }
        }
        w.extend(notes.iter().cloned());
        w
    }

    /// The report as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// The corrected latency distribution as a `.hgrm` percentile file.
    pub fn hgrm(&self) -> String {
        crate::hgrm::write(&self.latency_histogram)
    }

    /// The human summary, in the spirit of wrk2's.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let a = &self.requests;
        let planned = match (self.planned_duration_s, self.planned_requests) {
            (Some(d), _) => format!("{d:.2} s test"),
            (_, Some(n)) => format!("{n}-request test"),
            _ => "test".to_string(),
        };
        let _ = writeln!(s, "Running {planned} @ {} {}", self.method, self.target);
        if !self.urls.is_empty() {
            let _ = writeln!(
                s,
                "  {} URLs requested in turn (same connections): {}",
                self.urls.len(),
                self.urls
                    .iter()
                    .take(10)
                    .map(|u| format!("{} ({} done, {} failed)", u.url, u.completed, u.errors))
                    .collect::<Vec<_>>()
                    .join(", ")
                    + if self.urls.len() > 10 { ", ..." } else { "" }
            );
        }
        let mut conn = match self.protocol.as_str() {
            "HTTP/1.1" if self.keep_alive => "HTTP/1.1 keep-alive".to_string(),
            p if !self.keep_alive => format!("{p}, a new connection per request"),
            p => format!(
                "{p}, {} per connection",
                plural(self.streams.unwrap_or(1) as u64, "stream")
            ),
        };
        if let Some(l) = self.loss {
            let pct = (l * 1e6).round() / 1e4;
            let _ = write!(conn, ", {pct}% of datagrams dropped each way");
        }
        let threads = plural(self.threads as u64, "thread");
        let conns = plural(self.connections as u64, "connection");
        match self.offered_rate {
            Some(rate) => {
                let _ = writeln!(s, "  open loop at {rate} req/s; {threads}, {conns}, {conn}");
                let _ = writeln!(
                    s,
                    "  latency measured from each request's intended send time (coordinated omission corrected)"
                );
            }
            None => {
                let _ = writeln!(s, "  closed loop; {threads}, {conns}, {conn}");
                let _ = writeln!(
                    s,
                    "  latency measured from the actual send: closed loop hides stalls, use --rate for latency claims"
                );
            }
        }
        if self.warmup.seconds > 0.0 {
            let _ = writeln!(
                s,
                "  warm-up {:.2} s excluded from all results ({} requests completed, {} failed)",
                self.warmup.seconds, self.warmup.completed, self.warmup.errors
            );
        }
        let l = &self.latency;
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "  Latency     {:>12} {:>12} {:>12}",
            "Avg", "Stdev", "Max"
        );
        let _ = writeln!(
            s,
            "              {:>12} {:>12} {:>12}",
            ms(l.mean_ms),
            ms(l.stdev_ms),
            ms(l.max_ms)
        );
        let kind = if self.offered_rate.is_some() {
            "corrected"
        } else {
            "uncorrected"
        };
        let _ = writeln!(s, "  Latency Distribution (HdrHistogram - {kind})");
        for p in PERCENTILES {
            let _ = writeln!(s, "  {:>9}  {:>12}", format!("{p}%"), ms(l.at(p)));
        }
        let _ = writeln!(s, "  {:>9}  {:>12}", "100%", ms(l.max_ms));
        let sv = &self.service;
        let _ = writeln!(
            s,
            "  Service time (send to response): p50 {}  p99 {}  max {}",
            ms(sv.at(50.0)),
            ms(sv.at(99.0)),
            ms(sv.max_ms)
        );
        if let (Some(lag), Some(gen)) = (&self.send_lag, &self.generator_lag) {
            let _ = writeln!(
                s,
                "  Send lag (actual - intended send): p50 {}  p99 {}  max {}",
                ms(lag.at(50.0)),
                ms(lag.at(99.0)),
                ms(lag.max_ms)
            );
            let _ = writeln!(
                s,
                "    of which the generator's own:   p50 {}  p99 {}  max {}",
                ms(gen.at(50.0)),
                ms(gen.at(99.0)),
                ms(gen.max_ms)
            );
            let _ = writeln!(
                s,
                "    requests that waited for a busy connection: {}",
                self.queued
            );
        }
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "  {} requests in {:.2} s, {} read",
            a.completed,
            self.elapsed_s,
            size(self.bytes as f64)
        );
        let _ = writeln!(
            s,
            "  Requests: {} {} = {} completed + {} errors + {} in flight at the end + {} never sent",
            a.scheduled,
            if self.offered_rate.is_some() {
                "scheduled"
            } else {
                "sent"
            },
            a.completed,
            a.errors,
            a.in_flight,
            a.unsent
        );
        let classes: Vec<String> = self
            .status_classes
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let codes: Vec<String> = self
            .status
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        let _ = writeln!(
            s,
            "  Status: {}",
            if classes.is_empty() {
                "none".to_string()
            } else {
                format!("{} ({})", classes.join(", "), codes.join(", "))
            }
        );
        let errors: Vec<String> = ErrorKind::ALL
            .iter()
            .filter_map(|k| {
                self.errors
                    .get(k.key())
                    .map(|n| format!("{} {n}", k.describe()))
            })
            .collect();
        let _ = writeln!(
            s,
            "  Errors: {}",
            if errors.is_empty() {
                "none".to_string()
            } else {
                errors.join(", ")
            }
        );
        match self.offered_rate {
            Some(rate) => {
                let _ = writeln!(
                    s,
                    "Requests/sec: {:>10.2}  (offered {rate:.2})",
                    self.achieved_rate
                );
            }
            None => {
                let _ = writeln!(s, "Requests/sec: {:>10.2}", self.achieved_rate);
            }
        }
        let _ = writeln!(s, "Transfer/sec: {:>10}", size(self.bytes_per_s));
        if !self.keep_alive || self.connections_opened > 0 {
            let _ = writeln!(
                s,
                "Connections/sec: {:>7.2}  ({} connections opened in the measured phase)",
                self.connections_per_s, self.connections_opened
            );
        }
        if let Some(t) = &self.tls {
            let neg = [&t.version, &t.cipher_suite, &t.group]
                .iter()
                .map(|v| v.as_deref().unwrap_or("?"))
                .collect::<Vec<_>>()
                .join(", ");
            let _ = writeln!(
                s,
                "  TLS: {neg}; resumption {}; certificate {}",
                if t.settings.resumption { "on" } else { "off" },
                t.settings.verify
            );
            let early = |h: &Handshakes| match t.settings.early_data {
                true => format!(
                    " (0-RTT: {} accepted, {} refused)",
                    h.early, h.early_refused
                ),
                false => String::new(),
            };
            let _ = writeln!(
                s,
                "  TLS handshakes: {} full, {} resumed{} (before the measured phase: {} full, {} resumed{})",
                t.handshakes.full,
                t.handshakes.resumed,
                early(&t.handshakes),
                t.setup_handshakes.full,
                t.setup_handshakes.resumed,
                early(&t.setup_handshakes),
            );
        }
        if let Some(c) = &self.cpu {
            let pids: Vec<String> = c.pids.iter().map(u32::to_string).collect();
            let _ = writeln!(
                s,
                "  CPU of pid {} ({} with descendants): {:.2} s, {:.1}% of a core, {} per request",
                pids.join(", "),
                if c.processes == 1 {
                    "1 process".to_string()
                } else {
                    format!("{} processes", c.processes)
                },
                c.seconds,
                c.percent_of_core,
                us(c.us_per_request)
            );
        }
        if let Some(c) = &self.generator_cpu {
            let _ = writeln!(
                s,
                "  Load generator CPU: {:.2} s, {:.1}% of a core, {} per request",
                c.seconds,
                c.percent_of_core,
                us(c.us_per_request)
            );
        }
        for w in &self.warnings {
            let _ = writeln!(s, "WARNING: {w}");
        }
        s
    }
}

fn plural(n: u64, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

fn ms(v: f64) -> String {
    format!("{v:.3}ms")
}

fn us(v: Option<f64>) -> String {
    v.map_or("-".to_string(), |v| format!("{v:.2} us"))
}

fn size(bytes: f64) -> String {
    if bytes >= 1e9 {
        format!("{:.2}GB", bytes / 1e9)
    } else if bytes >= 1e6 {
        format!("{:.2}MB", bytes / 1e6)
    } else if bytes >= 1e3 {
        format!("{:.2}KB", bytes / 1e3)
    } else {
        format!("{bytes:.0}B")
    }
}

/// A report of a run whose requests took `latencies_ms`, plus `errors` failures (open loop at
/// `rate`, else closed loop), for tests.
#[cfg(test)]
pub fn test_report(rate: Option<f64>, latencies_ms: &[u64], errors: u64, lag_ms: u64) -> Report {
    use crate::conn::ErrorKind;
    use crate::schedule::Timing;
    use crate::stats::Recorder;
    use std::time::Duration;
    let cfg = Config::from_flags(&crate::config::Flags {
        url: "http://127.0.0.1:1/".into(),
        rate,
        closed: rate.is_none(),
        ..crate::config::Flags::default()
    })
    .unwrap();
    let ms = Duration::from_millis;
    let mut rec = Recorder::new(Default::default());
    for l in latencies_ms {
        let t = Timing {
            intended: ms(0),
            free: ms(0),
            sent: ms(lag_ms),
            done: ms(*l),
        };
        rec.response(true, true, &t, 200, 10, ms(0));
    }
    for _ in 0..errors {
        let t = Timing {
            intended: ms(0),
            free: ms(0),
            sent: ms(0),
            done: ms(1),
        };
        rec.error(true, true, &t, ErrorKind::Reset, ms(0));
    }
    rec.scheduled = latencies_ms.len() as u64 + errors;
    Report::build(&cfg, &rec, &Measured::default())
}
