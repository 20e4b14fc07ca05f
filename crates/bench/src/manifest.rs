//! The `bench compare` manifest: what ran, where and how, which files hold the results, and the summaries over rounds (written by `compare`, read by the report pages).

use crate::report::Host;
use serde::{Deserialize, Serialize};

/// What a scenario measures, and so which chart it joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Closed loop, keep-alive: requests per second.
    Rps,
    /// Closed loop, a new connection per request: connections per second.
    Cps,
    /// Closed loop, large responses: MB/s.
    Throughput,
    /// Open-loop rate sweep: latency against the offered rate.
    Latency,
}

impl Metric {
    /// What a summary's figure counts in this metric (the text [`Summary::unit`] keeps).
    pub fn unit(self) -> &'static str {
        match self {
            Metric::Rps => "req/s",
            Metric::Cps => "conn/s",
            Metric::Throughput => "MB/s",
            Metric::Latency => "knee req/s",
        }
    }
}

/// The manifest: what ran, where, how, and which files hold the results.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u32,
    /// `compare`.
    pub kind: String,
    pub title: String,
    pub started: String,
    pub finished: String,
    pub command: Option<String>,
    pub portico_version: String,
    /// The machine, read when the comparison ended (its load average then).
    pub host: Host,
    /// The load average (1, 5, 15 minutes) when the comparison started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_at_start: Option<[f64; 3]>,
    /// How processes were pinned (or why not).
    pub pinning: String,
    /// The CPU cap of the proxy under test (`--proxy-cpu-quota`), when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_cap: Option<CapEntry>,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub connections: usize,
    pub rates: String,
    pub slo: String,
    /// The certificate of the HTTPS scenarios.
    pub tls: Option<String>,
    pub origin: ProcessEntry,
    pub generator: ProcessEntry,
    pub proxies: Vec<ProxyEntry>,
    pub scenarios: Vec<ScenarioEntry>,
    /// Rounds per proxy and scenario (1 in manifests before `--rounds`).
    #[serde(default = "one")]
    pub rounds: u32,
    pub results: Vec<ResultEntry>,
    /// Medians and min..max over the rounds, per proxy and scenario (recomputed from the result
    /// files when a page is drawn).
    #[serde(default)]
    pub summary: Vec<Summary>,
}

impl Manifest {
    /// Whether each proxy had a core of its own (see `pinning`).
    pub fn pinned(&self) -> bool {
        !self.pinning.starts_with("not pinned")
    }
}

fn one() -> u32 {
    1
}

/// A process `compare` ran.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProcessEntry {
    pub version: String,
    pub command: Vec<String>,
    /// CPUs it was pinned to.
    pub cpus: Option<String>,
}

/// A proxy under test.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProxyEntry {
    pub name: String,
    pub version: Option<String>,
    pub command: Vec<String>,
    pub environment: Vec<(String, String)>,
    pub cpus: Option<String>,
    /// The configuration file (relative to the output directory) and its text.
    pub config_file: Option<String>,
    pub config: Option<String>,
    /// Why it did not run (not installed...).
    pub skipped: Option<String>,
    /// Why it stopped (failed to start, died).
    pub error: Option<String>,
}

/// A scenario, as run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScenarioEntry {
    pub name: String,
    /// A few words, for chart labels (the name when empty).
    #[serde(default)]
    pub short: String,
    pub title: String,
    pub path: String,
    pub metric: Metric,
    pub https: bool,
    pub close: bool,
    pub resume: bool,
    /// HTTP/2 over TLS (absent in manifests before it existed).
    #[serde(default)]
    pub h2: bool,
    /// HTTP/3 over QUIC (absent in manifests before it existed).
    #[serde(default)]
    pub h3: bool,
}

/// A cgroup CPU quota on the proxy under test.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapEntry {
    /// Percent of one CPU (50: half a core).
    pub percent: f64,
    /// How it was set (the cgroup version and files).
    pub how: String,
}

/// One proxy × scenario.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResultEntry {
    pub proxy: String,
    pub scenario: String,
    /// Its round, from 1.
    #[serde(default = "one")]
    pub round: u32,
    /// The `portico bench --json` file, relative to the output directory.
    pub file: Option<String>,
    /// The generator's command line.
    pub command: Vec<String>,
    pub skipped: Option<String>,
    pub error: Option<String>,
    /// Checks `compare` made of the result (e.g. responses smaller than the origin sends).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Under a CPU cap: how often the cap held the proxy back during the run (warm-up included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttling: Option<String>,
}

/// The median and the extremes of a figure over rounds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// Rounds the figure came from.
    pub n: usize,
}

/// One proxy × scenario over its rounds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub proxy: String,
    pub scenario: String,
    /// What `rate` counts: `req/s`, `conn/s`, `MB/s`, or `knee req/s` for the latency sweep.
    pub unit: String,
    /// The scenario's figure (completed requests/s, connections/s, MB/s, the sweep's knee).
    pub rate: Option<Spread>,
    /// The proxy's CPU µs per request (per connection in the CPS scenarios: one request each).
    pub cpu_us_per_request: Option<Spread>,
    /// The proxy's CPU, % of one core.
    pub cpu_percent_of_core: Option<Spread>,
    /// The round whose `rate` is nearest the median (the earliest on a tie): the page's table and
    /// spectra show that round's run.
    pub median_round: Option<u32>,
    /// The proxy's CPU cap, percent of one CPU, when it had one: its saturation is that share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_cap_percent: Option<f64>,
}

/// A proxy busier than this share of its one core (percent) was what limited a closed-loop run.
pub const SATURATED_PERCENT: f64 = 85.0;

/// The floor's name among the proxies (`portico bench relay`).
pub const FLOOR: &str = "relay";

impl Summary {
    /// Whether its figure is a sweep's knee (a [`Metric::Latency`] scenario).
    pub fn is_knee(&self) -> bool {
        self.unit == Metric::Latency.unit()
    }

    /// Decimals for its figure: a knee is a whole rate (its 0 reads `0`).
    pub fn rate_decimals(&self) -> usize {
        if self.is_knee() {
            0
        } else {
            1
        }
    }

    /// For a closed-loop figure (a saturation rate) of a proxy pinned to its own core: why it is
    /// not the proxy's, when the proxy was not what limited it (its median CPU below
    /// [`SATURATED_PERCENT`] of its core, or of its cap when capped: the generator, the origin or the machine was). Not
    /// said of the floor and `direct` (no proxy), nor of unpinned runs (the proxy shared its
    /// cores). Its CPU per request is still measured, though at less than full load.
    pub fn not_the_bottleneck(&self, pinned: bool) -> Option<String> {
        if !pinned || self.is_knee() || [FLOOR, "direct"].contains(&self.proxy.as_str()) {
            return None;
        }
        let busy = self.cpu_percent_of_core?.median;
        let allowed = self.cpu_cap_percent.map_or(100.0, |c| c.min(100.0));
        let of = match self.cpu_cap_percent {
            Some(c) => format!("of a core, capped to {c}%"),
            None => "of its core".to_string(),
        };
        (busy < SATURATED_PERCENT * allowed / 100.0).then(|| {
            format!(
                "{} {}: not the bottleneck (the proxy used {busy:.0}% {of}): the {} is not its \
                 saturation rate, and its CPU per request was measured at less than full load",
                self.scenario, self.proxy, self.unit
            )
        })
    }
}
