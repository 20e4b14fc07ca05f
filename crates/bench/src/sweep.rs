//! Rate sweeps: open-loop steps at rising offered rates, repetitions, the SLO and the knee search.

use crate::config::{parse_duration, Config, Flags, Mode, Stop};
use crate::error::BenchError;
use crate::report::{Host, Report, JSON_VERSION, MAX_GENERATOR_LAG_MS};
use crate::run::Progress;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::io::Write;

/// Most steps a sweep may list.
pub const MAX_STEPS: usize = 1000;
/// Most runs per step.
pub const MAX_REPEAT: u32 = 100;
/// Most bisection steps.
pub const MAX_BISECT: u32 = 20;
/// Bisection steps when `--bisect` is not given.
pub const DEFAULT_BISECT: u32 = 4;

/// A validated sweep: the run configuration of every step but its rate, and the plan.
#[derive(Debug, Clone)]
pub struct SweepConfig {
    /// Every step runs this configuration with its own offered rate.
    pub base: Config,
    /// The sweep's offered rates, increasing.
    pub rates: Vec<f64>,
    pub repeat: u32,
    pub slo: Option<Slo>,
    pub bisect: u32,
}

/// What the flags ask for: one run or a sweep.
#[derive(Debug, Clone)]
pub enum Job {
    Run(Box<Config>),
    Sweep(Box<SweepConfig>),
}

impl Job {
    /// Validate the flags, including which combinations make sense.
    pub fn from_flags(f: &Flags) -> Result<Job, BenchError> {
        let Some(spec) = &f.sweep else {
            for (given, name) in [
                (f.repeat.is_some(), "--repeat"),
                (f.slo.is_some(), "--slo"),
                (f.bisect.is_some(), "--bisect"),
            ] {
                if given {
                    return Err(flag(format!("{name} only applies to --sweep")));
                }
            }
            check_label(f)?;
            return Ok(Job::Run(Box::new(checked(Config::from_flags(f)?)?)));
        };
        if f.rate.is_some() || f.closed {
            return Err(flag(
                "--sweep sets the offered rates: it excludes --rate and --closed",
            ));
        }
        if f.requests.is_some() {
            return Err(flag(
                "--sweep runs every step for --duration: it excludes --requests",
            ));
        }
        if f.hgrm.is_some() {
            return Err(flag(
                "--hgrm writes one distribution: with --sweep, every step's is in --json (spectrum)",
            ));
        }
        let rates = parse_rates(spec)?;
        let repeat = f.repeat.unwrap_or(1);
        if repeat == 0 || repeat > MAX_REPEAT {
            return Err(flag(format!("--repeat {repeat}: must be 1..={MAX_REPEAT}")));
        }
        let bisect = f.bisect.unwrap_or(DEFAULT_BISECT);
        if bisect > MAX_BISECT {
            return Err(flag(format!("--bisect {bisect}: must be 0..={MAX_BISECT}")));
        }
        if f.bisect.is_some() && f.slo.is_none() {
            return Err(flag("--bisect needs --slo (it searches the knee)"));
        }
        let slo = f.slo.as_deref().map(Slo::parse).transpose()?;
        check_label(f)?;
        let base = checked(Config::from_flags(&Flags {
            rate: rates.first().copied(),
            ..f.clone()
        })?)?;
        Ok(Job::Sweep(Box::new(SweepConfig {
            base,
            rates,
            repeat,
            slo,
            bisect,
        })))
    }
}

/// `cfg`, once its HTTP/2 requests (`--h2`) can be built: a `-H` field HTTP/2 forbids is a flag
/// error before anything runs.
fn checked(cfg: Config) -> Result<Config, BenchError> {
    if cfg.h2 || cfg.h3 {
        crate::request::h2_requests(&cfg)?;
    }
    Ok(cfg)
}

fn check_label(f: &Flags) -> Result<(), BenchError> {
    match &f.label {
        Some(l) if l.trim().is_empty() || l.len() > 200 || l.chars().any(char::is_control) => Err(
            flag(format!("--label {l:?}: 1 to 200 printable characters")),
        ),
        _ => Ok(()),
    }
}

fn flag(msg: impl Into<String>) -> BenchError {
    BenchError::Flag(msg.into())
}

/// Parse `START:END:STEP` (END included when the steps reach it) or a list `R1,R2,...`, in
/// requests/s, into increasing rates.
pub fn parse_rates(spec: &str) -> Result<Vec<f64>, BenchError> {
    let bad = |why: &str| flag(format!("--sweep {spec:?}: {why}"));
    let num = |s: &str| -> Result<f64, BenchError> {
        let v: f64 = s
            .trim()
            .parse()
            .map_err(|_| bad("expected START:END:STEP or R1,R2,... in requests/s"))?;
        if v.is_finite() && v > 0.0 && v <= 1e9 {
            Ok(v)
        } else {
            Err(bad("rates must be > 0 and <= 1e9"))
        }
    };
    let rates = if spec.contains(':') {
        let parts: Vec<&str> = spec.split(':').collect();
        let [start, end, step] = parts.as_slice() else {
            return Err(bad("expected START:END:STEP"));
        };
        let (start, end, step) = (num(start)?, num(end)?, num(step)?);
        if end < start {
            return Err(bad("END is below START"));
        }
        let n = ((end - start) / step + 1e-9).floor() + 1.0;
        if n > MAX_STEPS as f64 {
            return Err(bad(&format!("more than {MAX_STEPS} steps")));
        }
        (0..n as usize).map(|i| start + i as f64 * step).collect()
    } else {
        spec.split(',').map(num).collect::<Result<Vec<f64>, _>>()?
    };
    if rates.len() > MAX_STEPS {
        return Err(bad(&format!("more than {MAX_STEPS} steps")));
    }
    if rates.windows(2).any(|w| w[1] <= w[0]) {
        return Err(bad("rates must increase"));
    }
    Ok(rates)
}

/// A service level objective: a latency percentile under a bound, plus a clean run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Slo {
    /// As given, e.g. `p99<10ms`.
    pub text: String,
    /// 0 < percentile <= 100.
    pub percentile: f64,
    /// The latency at `percentile` must be below this, ms.
    pub below_ms: f64,
}

/// Whether one run met the SLO, and why not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub pass: bool,
    /// The latency at the SLO's percentile, ms (None without completed requests).
    pub value_ms: Option<f64>,
    /// Every reason it failed, empty when it passed.
    pub failures: Vec<String>,
    /// The generator fell behind its own schedule: the run measured the generator, not the
    /// server, and says nothing of the SLO (it is run again; see [`VOID_TRIES`]).
    #[serde(default)]
    pub void: bool,
}

/// Tries of a run whose generator fell behind (void) before its step is given up as void.
pub const VOID_TRIES: u32 = 3;

impl Slo {
    /// Parse `pP<LATENCY`, e.g. `p99<10ms`, `p99.9 < 2.5ms` (spaces allowed).
    pub fn parse(s: &str) -> Result<Slo, BenchError> {
        let bad = || {
            flag(format!(
                "--slo {s:?}: expected pPERCENTILE<LATENCY, e.g. 'p99<10ms' or 'p99.9<2ms'"
            ))
        };
        let (p, lat) = s.split_once('<').ok_or_else(bad)?;
        let p = p.trim();
        let p = p.strip_prefix('p').or_else(|| p.strip_prefix('P'));
        let percentile: f64 = p.and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        if !(percentile > 0.0 && percentile <= 100.0) {
            return Err(flag(format!(
                "--slo {s:?}: the percentile must be in (0, 100]"
            )));
        }
        let below = parse_duration(lat).map_err(|_| bad())?;
        if below.is_zero() {
            return Err(flag(format!("--slo {s:?}: the latency bound must be > 0")));
        }
        Ok(Slo {
            text: s.trim().to_string(),
            percentile,
            below_ms: below.as_secs_f64() * 1000.0,
        })
    }

    /// The latency at the SLO's percentile in `r`, ms: from the histogram when the report has it
    /// (a run), else (a report read from JSON) from its percentiles, else from the spectrum (the
    /// first row at or above the percentile: an upper bound).
    pub fn value_ms(&self, r: &Report) -> Option<f64> {
        if r.requests.completed == 0 {
            return None;
        }
        let h = &r.latency_histogram;
        if !h.is_empty() {
            return Some(h.value_at_quantile(self.percentile / 100.0) as f64 / 1000.0);
        }
        if let Some(v) = r.latency.percentiles.get(&format!("p{}", self.percentile)) {
            return Some(*v);
        }
        r.spectrum
            .iter()
            .find(|(p, _)| *p >= self.percentile)
            .or(r.spectrum.last())
            .map(|(_, v)| *v)
    }

    /// Judge one run: the percentile under the bound, no errors and no non-2xx responses, every
    /// scheduled request sent and finished, and the generator on schedule.
    pub fn judge(&self, r: &Report) -> Verdict {
        let mut failures = Vec::new();
        let value_ms = self.value_ms(r);
        match value_ms {
            None => failures.push("no request completed".to_string()),
            Some(v) if v >= self.below_ms => failures.push(format!(
                "p{} {v:.3} ms >= {} ms",
                self.percentile, self.below_ms
            )),
            Some(_) => {}
        }
        let a = &r.requests;
        if a.errors > 0 {
            failures.push(format!("{} errors", a.errors));
        }
        let non_2xx = r.non_2xx();
        if non_2xx > 0 {
            failures.push(format!("{non_2xx} non-2xx"));
        }
        if a.unsent > 0 {
            failures.push(format!("{} never sent", a.unsent));
        }
        if a.in_flight > 0 {
            failures.push(format!("{} unfinished", a.in_flight));
        }
        // Errors, non-2xx answers and requests left unsent or unfinished are the server's,
        // whatever the generator did; only the latency, which includes the generator's lag, is
        // in doubt when it lagged.
        let server_failed =
            value_ms.is_none() || a.errors > 0 || non_2xx > 0 || a.unsent > 0 || a.in_flight > 0;
        let mut void = false;
        if let Some(lag) = &r.generator_lag {
            let p99 = lag.at(99.0);
            if lag.count > 0 && p99 > MAX_GENERATOR_LAG_MS {
                void = !server_failed;
                failures.push(format!(
                    "generator lagging (own send lag p99 {p99:.3} ms > {MAX_GENERATOR_LAG_MS} ms){}",
                    if void { ": void" } else { "" }
                ));
            }
        }
        Verdict {
            pass: failures.is_empty(),
            value_ms,
            failures,
            void,
        }
    }
}

/// Whether a step was part of the sweep or of the bisection after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Sweep,
    Bisect,
}

/// The knee: the highest offered rate meeting the SLO.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Knee {
    /// The highest passing rate below the first failure (None when the lowest rate failed).
    pub rate: Option<f64>,
    /// The lowest rate known to fail above it (None when every step passed: the knee is at or
    /// above `rate`).
    pub failed_at: Option<f64>,
    /// In words.
    pub note: String,
}

/// The sweep-then-bisect search, without I/O: ask [`KneeSearch::next`] for a rate, run it, tell
/// [`KneeSearch::record`] whether it met the SLO, until `next` returns `None`.
///
/// Every sweep rate is run (the curve past the knee is part of the picture). With an SLO and a
/// passing rate followed by a failing one, the gap between the last pass before the first failure
/// and that failure is then halved up to `bisect` times (rates rounded to whole requests/s). A pass
/// above the first failure does not move the knee: the SLO must hold at every lower sweep rate.
#[derive(Debug, Clone)]
pub struct KneeSearch {
    rates: Vec<f64>,
    slo: bool,
    bisect: u32,
    /// Outcomes of the sweep rates, in order (None: void, the generator fell behind).
    swept: Vec<Option<bool>>,
    /// Last pass and first failure, once the sweep is done.
    bracket: Option<(f64, f64)>,
    bisected: u32,
    /// A bisection rate found void: the bisection stops there (running it again would spend the
    /// same time on the same doubt).
    void_mid: Option<f64>,
}

impl KneeSearch {
    pub fn new(rates: Vec<f64>, slo: bool, bisect: u32) -> KneeSearch {
        KneeSearch {
            rates,
            slo,
            bisect,
            swept: Vec::new(),
            bracket: None,
            bisected: 0,
            void_mid: None,
        }
    }

    /// The next rate to run and its phase, or `None` when the search is over.
    pub fn next(&self) -> Option<(f64, Phase)> {
        if let Some(r) = self.rates.get(self.swept.len()) {
            return Some((*r, Phase::Sweep));
        }
        let (lo, hi) = self.bracket?;
        if self.bisected >= self.bisect || self.void_mid.is_some() {
            return None;
        }
        let mid = ((lo + hi) / 2.0).round();
        (mid > lo && mid < hi).then_some((mid, Phase::Bisect))
    }

    /// The outcome of the rate [`KneeSearch::next`] returned: met the SLO or not, or `None` when
    /// the step was void (it neither passes nor fails; a void bisection step narrows nothing).
    pub fn record(&mut self, pass: Option<bool>) {
        match self.next() {
            Some((_, Phase::Sweep)) => {
                self.swept.push(pass);
                if self.swept.len() == self.rates.len() && self.slo {
                    self.bracket = self.first_fail().and_then(|f| {
                        let below = self.last_pass_below(f)?;
                        Some((self.rates[below], self.rates[f]))
                    });
                }
            }
            Some((mid, Phase::Bisect)) => {
                match (self.bracket.as_mut(), pass) {
                    (Some((lo, _)), Some(true)) => *lo = mid,
                    (Some((_, hi)), Some(false)) => *hi = mid,
                    _ => self.void_mid = Some(mid),
                }
                self.bisected += 1;
            }
            None => {}
        }
    }

    /// The first sweep rate that failed (void ones are not failures).
    fn first_fail(&self) -> Option<usize> {
        self.swept.iter().position(|p| *p == Some(false))
    }

    /// The highest sweep rate below index `f` that passed (void ones skipped).
    fn last_pass_below(&self, f: usize) -> Option<usize> {
        self.swept[..f].iter().rposition(|p| *p == Some(true))
    }

    /// The knee found so far (None without an SLO or before any sweep result).
    pub fn knee(&self) -> Option<Knee> {
        if !self.slo || self.swept.is_empty() {
            return None;
        }
        let first_fail = self.first_fail();
        let late_passes: Vec<String> = match first_fail {
            Some(f) => self
                .swept
                .iter()
                .zip(&self.rates)
                .skip(f + 1)
                .filter(|(p, _)| **p == Some(true))
                .map(|(_, r)| format!("{r}"))
                .collect(),
            None => Vec::new(),
        };
        let void: Vec<String> = self
            .swept
            .iter()
            .zip(&self.rates)
            .filter(|(p, _)| p.is_none())
            .map(|(_, r)| *r)
            .chain(self.void_mid)
            .map(|r| format!("{r}"))
            .collect();
        // With void steps, "every rate" and "the lowest rate" mean the measured ones.
        let measured = if self.swept.contains(&None) {
            " measured"
        } else {
            ""
        };
        let last_pass = self
            .swept
            .iter()
            .rposition(|p| *p == Some(true))
            .map(|i| self.rates[i]);
        let mut k = match (first_fail, self.bracket) {
            (None, _) if last_pass.is_none() => Knee {
                rate: None,
                failed_at: None,
                note: "no rate measured the server: the generator fell behind at each".to_string(),
            },
            (None, _) => Knee {
                rate: last_pass,
                failed_at: None,
                note: format!(
                    "every{measured} rate met the SLO: the knee is at or above {} req/s",
                    last_pass.unwrap_or(0.0)
                ),
            },
            (Some(f), _) if self.last_pass_below(f).is_none() => Knee {
                rate: None,
                failed_at: self.rates.get(f).copied(),
                note: format!(
                    "even the lowest{measured} rate, {} req/s, failed the SLO",
                    self.rates.get(f).copied().unwrap_or(0.0)
                ),
            },
            (Some(_), Some((lo, hi))) => Knee {
                rate: Some(lo),
                failed_at: Some(hi),
                note: format!(
                    "{lo} req/s met the SLO, {hi} req/s did not (after {} bisection step{})",
                    self.bisected,
                    if self.bisected == 1 { "" } else { "s" }
                ),
            },
            (Some(f), None) => Knee {
                // The sweep is not finished yet.
                rate: self.last_pass_below(f).map(|i| self.rates[i]),
                failed_at: self.rates.get(f).copied(),
                note: "sweep in progress".to_string(),
            },
        };
        if !void.is_empty() {
            let _ = write!(
                k.note,
                "; void (the generator fell behind in {VOID_TRIES} tries, neither pass nor fail{}): \
                 {} req/s",
                if self.void_mid.is_some() {
                    "; the bisection stopped there"
                } else {
                    ""
                },
                void.join(", ")
            );
        }
        if !late_passes.is_empty() {
            let _ = write!(
                k.note,
                "; not monotonic: {} req/s passed again above the first failure",
                late_passes.join(", ")
            );
        }
        Some(k)
    }
}

/// Figures of one step: medians over its runs (sums for errors).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepFigures {
    pub achieved_rate: f64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    /// Failed requests over all runs.
    pub errors: u64,
    /// Non-2xx responses over all runs.
    pub non_2xx: u64,
    pub generator_lag_p99_ms: Option<f64>,
    /// CPU of the `--pid` trees, % of one core.
    pub cpu_percent_of_core: Option<f64>,
    /// CPU of the `--pid` trees, µs per completed request.
    pub cpu_us_per_request: Option<f64>,
}

/// The median of some values (the mean of the middle two for an even count); None when empty.
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let mid = v.get(n / 2).copied()?;
    if n % 2 == 1 {
        Some(mid)
    } else {
        Some((v.get(n / 2 - 1).copied()? + mid) / 2.0)
    }
}

impl StepFigures {
    /// Medians over `runs`.
    pub fn of(runs: &[Report]) -> StepFigures {
        let m = |f: &dyn Fn(&Report) -> f64| median(runs.iter().map(f).collect()).unwrap_or(0.0);
        let opt = |f: &dyn Fn(&Report) -> Option<f64>| median(runs.iter().filter_map(f).collect());
        StepFigures {
            achieved_rate: m(&|r| r.achieved_rate),
            mean_ms: m(&|r| r.latency.mean_ms),
            p50_ms: m(&|r| r.latency.at(50.0)),
            p95_ms: m(&|r| r.latency.at(95.0)),
            p99_ms: m(&|r| r.latency.at(99.0)),
            p999_ms: m(&|r| r.latency.at(99.9)),
            max_ms: m(&|r| r.latency.max_ms),
            errors: runs.iter().map(|r| r.requests.errors).sum(),
            non_2xx: runs
                .iter()
                .flat_map(|r| r.status_classes.iter())
                .filter(|(k, _)| k.as_str() != "2xx")
                .map(|(_, n)| n)
                .sum(),
            generator_lag_p99_ms: opt(&|r| r.generator_lag.as_ref().map(|l| l.at(99.0))),
            cpu_percent_of_core: opt(&|r| r.cpu.as_ref().map(|c| c.percent_of_core)),
            cpu_us_per_request: opt(&|r| r.cpu.as_ref().and_then(|c| c.us_per_request)),
        }
    }
}

/// One offered rate of a sweep: its runs (each the single-run JSON) and their verdicts.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Step {
    pub rate: f64,
    pub phase: Phase,
    /// With an SLO: whether every run met it; None without an SLO, or when void (a run's
    /// generator fell behind in every try).
    pub pass: Option<bool>,
    pub figures: StepFigures,
    pub runs: Vec<Report>,
    /// With an SLO: one per run.
    #[serde(default)]
    pub verdicts: Vec<Verdict>,
    /// Runs found void (the generator fell behind) and run again; not in `runs`.
    #[serde(default)]
    pub voided: u32,
}

/// The result of a sweep, as `--json` writes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SweepReport {
    pub version: u32,
    /// `sweep`.
    pub kind: String,
    pub label: String,
    pub command: Option<String>,
    pub portico_version: String,
    /// Start of the first step, UTC.
    pub started: String,
    pub host: Host,
    pub target: String,
    pub method: String,
    pub connections: usize,
    pub threads: usize,
    pub keep_alive: bool,
    /// `HTTP/1.1` or `HTTP/2` (`--h2`).
    #[serde(default = "crate::report::http11")]
    pub protocol: String,
    /// HTTP/2: streams in flight per connection.
    #[serde(default)]
    pub streams: Option<usize>,
    pub duration_s: f64,
    pub warmup_s: f64,
    /// The sweep's rates (bisection rates are in `steps` only).
    pub rates: Vec<f64>,
    pub repeat: u32,
    pub bisect: u32,
    pub slo: Option<Slo>,
    /// In the order they ran: the sweep, then the bisection.
    pub steps: Vec<Step>,
    pub knee: Option<Knee>,
}

impl SweepReport {
    /// The report as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// Steps sorted by offered rate.
    pub fn by_rate(&self) -> Vec<&Step> {
        let mut v: Vec<&Step> = self.steps.iter().collect();
        v.sort_by(|a, b| a.rate.total_cmp(&b.rate));
        v
    }

    /// The knee in one line, or what was run without an SLO.
    pub fn conclusion(&self) -> String {
        match (&self.slo, &self.knee) {
            (Some(slo), Some(k)) => {
                let at = k
                    .rate
                    .map_or("none".to_string(), |r| format!("{r:.0} req/s"));
                format!(
                    "Knee ({}, zero errors and non-2xx, every request sent and finished, generator \
                     on schedule): {at}; {}",
                    slo.text, k.note
                )
            }
            _ => format!(
                "{} steps from {} to {} req/s (no --slo: no knee)",
                self.steps.len(),
                self.rates.first().copied().unwrap_or(0.0),
                self.rates.last().copied().unwrap_or(0.0)
            ),
        }
    }
}

/// The header of the per-run table a sweep prints.
pub fn table_header(slo: Option<&Slo>) -> String {
    format!(
        "  {:>9} {:>6} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>8}  {}",
        "offered",
        "run",
        "achieved",
        "mean",
        "p50",
        "p99",
        "p99.9",
        "max",
        "errors",
        "cpu%",
        "cpu us",
        if slo.is_some() { "SLO" } else { "" }
    )
}

/// One line of the per-run table (and the run's warnings, indented, below it).
pub fn table_line(
    rate: f64,
    phase: Phase,
    rep: u32,
    repeat: u32,
    r: &Report,
    v: Option<&Verdict>,
) -> String {
    let run = match phase {
        Phase::Sweep => format!("{rep}/{repeat}"),
        Phase::Bisect => format!("b{rep}/{repeat}"),
    };
    let l = &r.latency;
    let opt = |x: Option<f64>, prec: usize| x.map_or("-".to_string(), |x| format!("{x:.prec$}"));
    let verdict = match v {
        None => String::new(),
        Some(v) if v.pass => "pass".to_string(),
        Some(v) => format!("FAIL: {}", v.failures.join(", ")),
    };
    let mut s = format!(
        "  {:>9.0} {:>6} {:>10.1} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>7} {:>7} {:>8}  {verdict}",
        rate,
        run,
        r.achieved_rate,
        l.mean_ms,
        l.at(50.0),
        l.at(99.0),
        l.at(99.9),
        l.max_ms,
        r.requests.errors,
        opt(r.cpu.as_ref().map(|c| c.percent_of_core), 1),
        opt(r.cpu.as_ref().and_then(|c| c.us_per_request), 2),
    );
    s.truncate(s.trim_end().len());
    s.push('\n');
    for w in &r.warnings {
        let _ = writeln!(s, "            warning: {w}");
    }
    s
}

/// Run the sweep: every step's runs, the bisection, the knee. Each run's line is written to
/// `out` as it finishes; `progress` sees every run's progress.
pub fn run_sweep(
    sc: &SweepConfig,
    out: &mut dyn Write,
    progress: &mut dyn FnMut(&Progress),
) -> Result<SweepReport, BenchError> {
    let base = &sc.base;
    let duration = match base.stop {
        Stop::Duration(d) => d,
        Stop::Requests(_) => return Err(flag("--sweep runs every step for --duration")),
    };
    let mut w = |s: &str| out.write_all(s.as_bytes()).map_err(BenchError::Output);
    w(&format!(
        "Sweep @ {} {}: {} rates from {} to {} req/s, {} run{} each of {:.2} s{}; {} connections, {} thread{}\n",
        base.method.as_str(),
        base.target.url,
        sc.rates.len(),
        sc.rates.first().copied().unwrap_or(0.0),
        sc.rates.last().copied().unwrap_or(0.0),
        sc.repeat,
        if sc.repeat == 1 { "" } else { "s" },
        duration.as_secs_f64(),
        if base.warmup.is_zero() {
            String::new()
        } else {
            format!(" after {:.2} s of warm-up", base.warmup.as_secs_f64())
        },
        base.connections,
        base.threads,
        if base.threads == 1 { "" } else { "s" },
    ))?;
    if let Some(slo) = &sc.slo {
        w(&format!(
            "  SLO {}, zero errors and non-2xx, every request sent and finished, generator on schedule; \
             then up to {} bisection steps\n",
            slo.text, sc.bisect
        ))?;
    }
    w("  latency in ms from the intended send time (coordinated omission corrected)\n")?;
    w(&format!("{}\n", table_header(sc.slo.as_ref())))?;
    let mut search = KneeSearch::new(sc.rates.clone(), sc.slo.is_some(), sc.bisect);
    let mut steps = Vec::new();
    let mut started = String::new();
    while let Some((rate, phase)) = search.next() {
        let cfg = Config {
            mode: Mode::Open { rate },
            ..base.clone()
        };
        let mut runs = Vec::new();
        let mut verdicts = Vec::new();
        let mut voided = 0;
        for rep in 1..=sc.repeat {
            // A run whose generator fell behind is run again, up to VOID_TRIES in all.
            for attempt in 1..=VOID_TRIES {
                let r = crate::run::run(&cfg, progress)?;
                if started.is_empty() {
                    started = r.started.clone();
                }
                let v = sc.slo.as_ref().map(|s| s.judge(&r));
                w(&table_line(rate, phase, rep, sc.repeat, &r, v.as_ref()))?;
                let again = v.as_ref().is_some_and(|v| v.void) && attempt < VOID_TRIES;
                if again {
                    voided += 1;
                    w("            void: the generator fell behind; this run again\n")?;
                    continue;
                }
                runs.push(r);
                verdicts.extend(v);
                break;
            }
        }
        // Met the SLO in every run; a measured failure fails the step; otherwise void when a
        // run was void in every try.
        let failed = verdicts.iter().any(|v: &Verdict| !v.pass && !v.void);
        let pass = match &sc.slo {
            None => None,
            Some(_) if failed => Some(false),
            Some(_) if verdicts.iter().any(|v| v.void) => None,
            Some(_) => Some(true),
        };
        search.record(if sc.slo.is_some() { pass } else { Some(true) });
        steps.push(Step {
            rate,
            phase,
            pass,
            figures: StepFigures::of(&runs),
            runs,
            verdicts,
            voided,
        });
    }
    let report = SweepReport {
        version: JSON_VERSION,
        kind: "sweep".to_string(),
        label: base
            .label
            .clone()
            .unwrap_or_else(|| base.target.url.clone()),
        command: base.command.clone(),
        portico_version: env!("CARGO_PKG_VERSION").to_string(),
        started,
        host: Host::this(),
        target: base.target.url.clone(),
        method: base.method.as_str().to_string(),
        connections: base.connections,
        threads: base.threads,
        keep_alive: !base.close,
        protocol: crate::report::protocol_of(base),
        streams: (base.h2 || base.h3).then_some(base.streams),
        duration_s: duration.as_secs_f64(),
        warmup_s: base.warmup.as_secs_f64(),
        rates: sc.rates.clone(),
        repeat: sc.repeat,
        bisect: sc.bisect,
        slo: sc.slo.clone(),
        steps,
        knee: search.knee(),
    };
    w(&format!("{}\n", report.conclusion()))?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drive a search with a pass/fail oracle; return the rates run and the knee.
    fn drive(
        rates: &[f64],
        slo: bool,
        bisect: u32,
        pass: impl Fn(f64) -> bool,
    ) -> (Vec<(f64, Phase)>, Option<Knee>) {
        let mut s = KneeSearch::new(rates.to_vec(), slo, bisect);
        let mut ran = Vec::new();
        while let Some((r, p)) = s.next() {
            ran.push((r, p));
            s.record(Some(pass(r)));
            assert!(ran.len() < 1000, "the search must end");
        }
        (ran, s.knee())
    }

    fn sweep_rates(a: f64, b: f64, step: f64) -> Vec<f64> {
        let mut v = Vec::new();
        let mut r = a;
        while r <= b {
            v.push(r);
            r += step;
        }
        v
    }

    #[test]
    fn sweep_then_bisection_finds_the_knee() {
        let rates = sweep_rates(1000.0, 10000.0, 1000.0);
        // The server meets the SLO up to 4321 req/s.
        let (ran, knee) = drive(&rates, true, 4, |r| r <= 4321.0);
        let sweep: Vec<f64> = ran
            .iter()
            .filter(|(_, p)| *p == Phase::Sweep)
            .map(|(r, _)| *r)
            .collect();
        assert_eq!(sweep, rates, "every sweep rate runs");
        let bisect: Vec<f64> = ran
            .iter()
            .filter(|(_, p)| *p == Phase::Bisect)
            .map(|(r, _)| *r)
            .collect();
        // 4000 passes, 5000 fails: 4500 F, 4250 P, 4375 F, 4313 P (4312.5 rounds up).
        assert_eq!(bisect, [4500.0, 4250.0, 4375.0, 4313.0]);
        let k = knee.unwrap();
        assert_eq!(k.rate, Some(4313.0));
        assert_eq!(k.failed_at, Some(4375.0));
        assert!(k.note.contains("4 bisection steps"), "{}", k.note);
    }

    #[test]
    fn bisection_stops_at_whole_rates_and_at_zero_steps() {
        let (ran, knee) = drive(&[10.0, 12.0], true, 10, |r| r <= 10.0);
        // Only 11 lies strictly between 10 and 12.
        assert_eq!(ran.last(), Some(&(11.0, Phase::Bisect)));
        assert_eq!(ran.len(), 3);
        assert_eq!(knee.unwrap().rate, Some(10.0));
        let (ran, knee) = drive(&[100.0, 200.0, 300.0], true, 0, |r| r < 250.0);
        assert_eq!(ran.len(), 3);
        let k = knee.unwrap();
        assert_eq!((k.rate, k.failed_at), (Some(200.0), Some(300.0)));
    }

    #[test]
    fn edge_cases_all_pass_all_fail_no_slo_not_monotonic() {
        let rates = [100.0, 200.0, 300.0];
        let (ran, knee) = drive(&rates, true, 4, |_| true);
        assert_eq!(ran.len(), 3, "nothing to bisect");
        let k = knee.unwrap();
        assert_eq!((k.rate, k.failed_at), (Some(300.0), None));
        assert!(k.note.contains("at or above"));

        let (ran, knee) = drive(&rates, true, 4, |_| false);
        assert_eq!(ran.len(), 3);
        let k = knee.unwrap();
        assert_eq!((k.rate, k.failed_at), (None, Some(100.0)));

        let (ran, knee) = drive(&rates, false, 4, |r| r < 150.0);
        assert_eq!(ran.len(), 3);
        assert!(knee.is_none(), "no SLO, no knee");

        // 200 fails but 300 passes: the knee stays below the first failure.
        let (ran, knee) = drive(&rates, true, 1, |r| r != 200.0);
        assert_eq!(ran.last(), Some(&(150.0, Phase::Bisect)));
        let k = knee.unwrap();
        assert_eq!((k.rate, k.failed_at), (Some(150.0), Some(200.0)));
        assert!(k.note.contains("not monotonic: 300"), "{}", k.note);
    }

    /// Drive a search whose steps may be void (`None`).
    fn drive_void(
        rates: &[f64],
        bisect: u32,
        outcome: impl Fn(f64) -> Option<bool>,
    ) -> (Vec<f64>, Knee) {
        let mut s = KneeSearch::new(rates.to_vec(), true, bisect);
        let mut ran = Vec::new();
        while let Some((r, _)) = s.next() {
            ran.push(r);
            s.record(outcome(r));
            assert!(ran.len() < 1000, "the search must end");
        }
        (ran, s.knee().unwrap())
    }

    #[test]
    fn void_steps_neither_pass_nor_fail() {
        let rates = [100.0, 200.0, 300.0, 400.0];
        // The lowest rate void (a cold generator): the knee is still found above it.
        let (_, k) = drive_void(&rates, 0, |r| (r > 100.0).then_some(r < 300.0));
        assert_eq!((k.rate, k.failed_at), (Some(200.0), Some(300.0)));
        assert!(k.note.contains("void"), "{}", k.note);
        assert!(k.note.ends_with(": 100 req/s"), "{}", k.note);
        // A void step below the first failure widens the bracket to the last pass.
        // A void bisection rate narrows nothing and ends the bisection there.
        let (ran, k) = drive_void(
            &rates,
            3,
            |r| if r == 200.0 { None } else { Some(r < 250.0) },
        );
        assert_eq!(ran, [100.0, 200.0, 300.0, 400.0, 200.0], "one try at 200");
        assert_eq!(
            (k.rate, k.failed_at),
            (Some(100.0), Some(300.0)),
            "void mid narrows nothing"
        );
        assert!(k.note.contains("the bisection stopped there"), "{}", k.note);
        assert!(k.note.ends_with(": 200, 200 req/s"), "{}", k.note);
        // Void then every rate passing: at or above the highest, of the rates measured.
        let (_, k) = drive_void(&rates, 0, |r| (r > 100.0).then_some(true));
        assert_eq!((k.rate, k.failed_at), (Some(400.0), None));
        assert!(k.note.starts_with("every measured rate met"), "{}", k.note);
        // Only void steps: no knee, and no claim that every rate passed.
        let (_, k) = drive_void(&rates, 2, |_| None);
        assert_eq!((k.rate, k.failed_at), (None, None));
        assert!(k.note.starts_with("no rate measured"), "{}", k.note);
        // Void, then a failure: nothing passed below it.
        let (_, k) = drive_void(&rates, 2, |r| (r > 100.0).then_some(false));
        assert_eq!((k.rate, k.failed_at), (None, Some(200.0)));
        assert!(
            k.note.starts_with("even the lowest measured rate, 200"),
            "{}",
            k.note
        );
    }

    #[test]
    fn rates_parse() {
        assert_eq!(
            parse_rates("1000:5000:1000").unwrap(),
            [1000.0, 2000.0, 3000.0, 4000.0, 5000.0]
        );
        assert_eq!(parse_rates("100:250:100").unwrap(), [100.0, 200.0]);
        assert_eq!(parse_rates("0.5:1.5:0.5").unwrap(), [0.5, 1.0, 1.5]);
        assert_eq!(parse_rates("7:7:1").unwrap(), [7.0]);
        assert_eq!(
            parse_rates("100, 500,2000").unwrap(),
            [100.0, 500.0, 2000.0]
        );
        for bad in [
            "",
            "1000:5000",
            "5000:1000:100",
            "0:100:10",
            "1:2:0",
            "1:100000:1",
            "a:b:c",
            "100,50",
            "100,,200",
            "-5,10",
            "1:2:3:4",
            "nan,1",
        ] {
            assert!(parse_rates(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn slos_parse() {
        let s = Slo::parse("p99<10ms").unwrap();
        assert_eq!((s.percentile, s.below_ms), (99.0, 10.0));
        let s = Slo::parse(" p99.9 < 2.5ms ").unwrap();
        assert_eq!((s.percentile, s.below_ms), (99.9, 2.5));
        assert_eq!(Slo::parse("p100<1s").unwrap().below_ms, 1000.0);
        for bad in [
            "", "p99", "99<10ms", "p0<1ms", "p101<1ms", "p99<", "p99<0ms", "p99<10x", "px<1ms",
        ] {
            assert!(Slo::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn flags_combine_sensibly() {
        let base = Flags {
            url: "http://127.0.0.1:1/".into(),
            sweep: Some("100:300:100".into()),
            duration: Some(std::time::Duration::from_secs(1)),
            ..Flags::default()
        };
        let Job::Sweep(sc) = Job::from_flags(&base).unwrap() else {
            panic!("a sweep")
        };
        assert_eq!(sc.rates, [100.0, 200.0, 300.0]);
        assert_eq!(
            (sc.repeat, sc.bisect, sc.slo.is_none()),
            (1, DEFAULT_BISECT, true)
        );
        let with = |f: Flags| Job::from_flags(&f).map(|_| ());
        assert!(with(Flags {
            slo: Some("p99<5ms".into()),
            repeat: Some(3),
            bisect: Some(2),
            label: Some("portico".into()),
            ..base.clone()
        })
        .is_ok());
        for bad in [
            Flags {
                rate: Some(5.0),
                ..base.clone()
            },
            Flags {
                closed: true,
                ..base.clone()
            },
            Flags {
                requests: Some(5),
                duration: None,
                ..base.clone()
            },
            Flags {
                hgrm: Some("x".into()),
                ..base.clone()
            },
            Flags {
                repeat: Some(0),
                ..base.clone()
            },
            Flags {
                bisect: Some(3),
                ..base.clone()
            },
            Flags {
                slo: Some("p99>1ms".into()),
                ..base.clone()
            },
            Flags {
                label: Some(" ".into()),
                ..base.clone()
            },
            Flags {
                sweep: None,
                rate: Some(5.0),
                repeat: Some(2),
                ..base.clone()
            },
            Flags {
                sweep: None,
                rate: Some(5.0),
                slo: Some("p99<1ms".into()),
                ..base.clone()
            },
        ] {
            assert!(with(bad.clone()).is_err(), "{bad:?}");
        }
        assert!(matches!(
            Job::from_flags(&Flags {
                sweep: None,
                rate: Some(5.0),
                ..base
            }),
            Ok(Job::Run(_))
        ));
    }

    fn report(latencies_ms: &[u64], errors: u64, lag_ms: u64) -> Report {
        crate::report::test_report(Some(100.0), latencies_ms, errors, lag_ms)
    }

    #[test]
    fn slo_judges_latency_errors_and_generator_lag() {
        let slo = Slo::parse("p99<10ms").unwrap();
        // 99 fast requests and one slow: p99 is fast, p100 is not.
        let mut lat = vec![2u64; 99];
        lat.push(50);
        let v = slo.judge(&report(&lat, 0, 0));
        assert!(v.pass, "{v:?}");
        assert!(v.value_ms.unwrap() < 3.0);
        let v = Slo::parse("p100<10ms").unwrap().judge(&report(&lat, 0, 0));
        assert!(!v.pass);
        assert!(v.failures[0].contains(">= 10 ms"), "{v:?}");
        let v = slo.judge(&report(&[20; 10], 0, 0));
        assert_eq!(v.failures.len(), 1, "{v:?}");
        let v = slo.judge(&report(&[1; 10], 1, 0));
        assert_eq!(v.failures, ["1 errors"]);
        let v = slo.judge(&report(&[5; 10], 0, 3));
        assert!(v.failures[0].contains("generator lagging"), "{v:?}");
        assert!(
            v.void && !v.pass,
            "a lagging generator voids the run: {v:?}"
        );
        let v = slo.judge(&report(&[5; 10], 2, 3));
        assert!(
            !v.void && !v.pass,
            "errors are the server's, lag or not: {v:?}"
        );
        assert!(
            !slo.judge(&report(&[20; 10], 0, 0)).void,
            "a slow server does not"
        );
        let v = slo.judge(&report(&[], 0, 0));
        assert_eq!(v.failures, ["no request completed"]);
        // Read back from JSON (no histogram): the spectrum gives the same verdict.
        let r = report(&lat, 0, 0);
        let back: Report = serde_json::from_str(&r.to_json()).unwrap();
        assert!(back.latency_histogram.is_empty());
        assert!(slo.judge(&back).pass);
        assert!(!Slo::parse("p99.99<10ms").unwrap().judge(&back).pass);
    }

    #[test]
    fn medians() {
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(vec![f64::NAN, 5.0]), Some(5.0));
    }
}
