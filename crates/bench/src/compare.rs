//! `portico bench compare`: origin, each proxy under test in turn (pinned, fair configurations), the scenarios, JSON per run, a manifest and one HTML page.

use crate::config::parse_duration;
use crate::error::BenchError;
use crate::manifest::{Manifest, Metric, ProcessEntry, ProxyEntry, ResultEntry, ScenarioEntry};
use crate::page::Input;
use crate::peers::{self, Proxy, Setup, TlsFiles};
use crate::report::{rfc3339, Host};
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Layout version of `manifest.json`.
pub const MANIFEST_VERSION: u32 = 1;
/// How long a started server gets to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a stopped process gets between SIGTERM and SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// Slack on top of a generator run's planned time before it is killed.
const RUN_SLACK: Duration = Duration::from_secs(30);

/// The `portico bench compare` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct CompareFlags {
    /// Directory for the results (JSON per proxy and scenario), logs, configurations, manifest.json
    /// and index.html (created if missing).
    #[arg(long, short)]
    pub out: PathBuf,
    /// Proxies under test, in order: direct (no proxy), relay (the floor: a blind TCP relay),
    /// portico, nginx, haproxy, caddy, pingora. Those not installed are skipped, and the report
    /// says so (pingora: built by scripts/build-pingora.sh).
    #[arg(
        long,
        default_value = "direct,relay,portico,nginx,haproxy,caddy,pingora",
        value_name = "LIST"
    )]
    pub proxies: String,
    /// Scenarios: `all` (the HTTP ones, plus the HTTPS ones with --https or --cert), `http`,
    /// `https` (HTTPS and HTTP/2 over TLS), `h2`, `h3`, or names: rps-0k, rps-1k, rps-10k,
    /// rps-100k, cps, throughput-1m, latency, https-rps-1k, https-cps, https-cps-resumed,
    /// https-throughput-1m, h2-rps-1k, h3-rps-1k, h3-cps, h3-cps-0rtt.
    #[arg(long, default_value = "all", value_name = "LIST")]
    pub scenarios: String,
    /// Measured time of each run (each rate of the latency sweep is a run).
    #[arg(long, short, default_value = "5s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Warm-up before each run, excluded from its results.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Client connections (the 1 MB scenarios use at most 10).
    #[arg(long, short, default_value_t = 50)]
    pub connections: usize,
    /// Offered rates of the latency sweep, requests/s (a list R1,R2,... or START:END:STEP).
    #[arg(
        long,
        default_value = "2000,5000,10000,20000,30000",
        value_name = "LIST"
    )]
    pub rates: String,
    /// The latency sweep's SLO (the knee is the highest rate meeting it).
    #[arg(long, default_value = "p99<10ms", value_name = "pP<LATENCY")]
    pub slo: String,
    /// Add the HTTPS scenarios, with a self-signed ECDSA P-256 certificate made by openssl.
    #[arg(long)]
    pub https: bool,
    /// HTTPS with this certificate chain (PEM) instead of a generated one (needs --key).
    #[arg(long, requires = "key", value_name = "FILE")]
    pub cert: Option<PathBuf>,
    /// The private key of --cert (PEM).
    #[arg(long, requires = "cert", value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// The portico binary run as origin, proxy and load generator (default: this one).
    #[arg(long, value_name = "PATH")]
    pub portico: Option<PathBuf>,
    /// Do not pin processes to CPUs (pinning needs taskset and 2 CPUs).
    #[arg(long)]
    pub no_pin: bool,
    /// CPU list of the proxy under test (taskset -c).
    #[arg(long, default_value = "0", value_name = "CPUS")]
    pub proxy_cpu: String,
    /// CPU list of the origin and the load generator.
    #[arg(long, default_value = "1", value_name = "CPUS")]
    pub client_cpu: String,
    /// Cap the proxy under test to this percent of one CPU with a cgroup CPU quota (50: half a
    /// core), as a smaller machine or a container limit would; needs a writable cgroup `cpu`
    /// controller (root).
    #[arg(long, value_name = "PERCENT", value_parser = parse_percent)]
    pub proxy_cpu_quota: Option<f64>,
    /// Rounds: every scenario runs this many times per proxy, the proxies alternating within
    /// each round (A B C, A B C...); the report gives medians and min..max.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,
    /// Title of the report.
    #[arg(long)]
    pub title: Option<String>,
    /// The command line, stored in the manifest (set by the CLI, not a flag).
    #[arg(skip)]
    pub command: Option<String>,
}

impl CompareFlags {
    /// Flags with the defaults the command line has, writing to `out`.
    pub fn new(out: PathBuf) -> CompareFlags {
        CompareFlags {
            out,
            proxies: "direct,relay,portico,nginx,haproxy,caddy,pingora".into(),
            scenarios: "all".into(),
            duration: Duration::from_secs(5),
            warmup: Duration::from_secs(1),
            connections: 50,
            rates: "2000,5000,10000,20000,30000".into(),
            slo: "p99<10ms".into(),
            https: false,
            cert: None,
            key: None,
            portico: None,
            no_pin: false,
            proxy_cpu: "0".into(),
            client_cpu: "1".into(),
            proxy_cpu_quota: None,
            rounds: 1,
            title: None,
            command: None,
        }
    }
}

/// One scenario of NGINX's published method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scenario {
    pub name: &'static str,
    /// A few words, for chart labels.
    pub short: &'static str,
    pub title: &'static str,
    pub path: &'static str,
    pub metric: Metric,
    pub https: bool,
    /// A new connection per request.
    pub close: bool,
    /// TLS session resumption on.
    pub resume: bool,
    /// HTTP/2 (TLS with ALPN `h2`), [`H2_CONNECTIONS`] connections × [`H2_STREAMS`] streams.
    pub h2: bool,
    /// HTTP/3 (QUIC), as many connections and streams as HTTP/2.
    pub h3: bool,
    /// HTTP/3 with `--early-data`: each request as 0-RTT data on a resumed session.
    pub early_data: bool,
}

#[allow(clippy::too_many_arguments)] // a table row, argument per column
const fn sc(
    name: &'static str,
    short: &'static str,
    title: &'static str,
    path: &'static str,
    metric: Metric,
    https: bool,
    close: bool,
    resume: bool,
) -> Scenario {
    Scenario {
        name,
        short,
        title,
        path,
        metric,
        https,
        close,
        resume,
        h2: false,
        h3: false,
        early_data: false,
    }
}

/// Every scenario, in the order they run.
pub const SCENARIOS: [Scenario; 15] = [
    sc(
        "rps-0k",
        "RPS 0 KB",
        "HTTP requests/s, 0 KB",
        "/bytes/0",
        Metric::Rps,
        false,
        false,
        true,
    ),
    sc(
        "rps-1k",
        "RPS 1 KB",
        "HTTP requests/s, 1 KB",
        "/bytes/1k",
        Metric::Rps,
        false,
        false,
        true,
    ),
    sc(
        "rps-10k",
        "RPS 10 KB",
        "HTTP requests/s, 10 KB",
        "/bytes/10k",
        Metric::Rps,
        false,
        false,
        true,
    ),
    sc(
        "rps-100k",
        "RPS 100 KB",
        "HTTP requests/s, 100 KB",
        "/bytes/100k",
        Metric::Rps,
        false,
        false,
        true,
    ),
    sc(
        "cps",
        "CPS HTTP",
        "HTTP new connection per request, 0 KB",
        "/bytes/0",
        Metric::Cps,
        false,
        true,
        true,
    ),
    sc(
        "throughput-1m",
        "1 MB HTTP",
        "HTTP throughput, 1 MB",
        "/bytes/1m",
        Metric::Throughput,
        false,
        false,
        true,
    ),
    sc(
        "latency",
        "latency 1 KB",
        "HTTP latency vs offered rate, 1 KB",
        "/bytes/1k",
        Metric::Latency,
        false,
        false,
        true,
    ),
    sc(
        "https-rps-1k",
        "RPS 1 KB HTTPS",
        "HTTPS requests/s, 1 KB",
        "/bytes/1k",
        Metric::Rps,
        true,
        false,
        true,
    ),
    sc(
        "https-cps",
        "CPS HTTPS full",
        "HTTPS new connection per request, full handshakes, 0 KB",
        "/bytes/0",
        Metric::Cps,
        true,
        true,
        false,
    ),
    sc(
        "https-cps-resumed",
        "CPS HTTPS resumed",
        "HTTPS new connection per request, resumed sessions, 0 KB",
        "/bytes/0",
        Metric::Cps,
        true,
        true,
        true,
    ),
    sc(
        "https-throughput-1m",
        "1 MB HTTPS",
        "HTTPS throughput, 1 MB",
        "/bytes/1m",
        Metric::Throughput,
        true,
        false,
        true,
    ),
    Scenario {
        h2: true,
        ..sc(
            "h2-rps-1k",
            "RPS 1 KB HTTP/2",
            "HTTP/2 over TLS requests/s, 1 KB, 10 connections × 100 streams (h2load -c 10 -m 100)",
            "/bytes/1k",
            Metric::Rps,
            true,
            false,
            true,
        )
    },
    Scenario {
        h3: true,
        ..sc(
            "h3-rps-1k",
            "RPS 1 KB HTTP/3",
            "HTTP/3 requests/s, 1 KB, 10 connections × 100 streams",
            "/bytes/1k",
            Metric::Rps,
            true,
            false,
            true,
        )
    },
    Scenario {
        h3: true,
        ..sc(
            "h3-cps",
            "CPS HTTP/3 full",
            "HTTP/3 new QUIC connection per request, full handshakes, 0 KB",
            "/bytes/0",
            Metric::Cps,
            true,
            true,
            false,
        )
    },
    Scenario {
        h3: true,
        early_data: true,
        ..sc(
            "h3-cps-0rtt",
            "CPS HTTP/3 0-RTT",
            "HTTP/3 new QUIC connection per request, resumed sessions, the request as 0-RTT data, 0 KB",
            "/bytes/0",
            Metric::Cps,
            true,
            true,
            true,
        )
    },
];

/// Most connections of the 1 MB scenarios.
const THROUGHPUT_CONNECTIONS: usize = 10;
/// Most connections of the HTTP/2 scenario (h2load's `-c 10` of performance.md's P9).
pub const H2_CONNECTIONS: usize = 10;
/// Streams in flight per connection in the HTTP/2 scenario (h2load's `-m 100`; every server's
/// default stream limit is at least 100).
pub const H2_STREAMS: usize = 100;

/// The scenarios a `--scenarios` value names; the flag says whether any is HTTPS.
pub fn parse_scenarios(spec: &str, https: bool) -> Result<Vec<Scenario>, BenchError> {
    let mut out: Vec<Scenario> = Vec::new();
    for word in spec.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        let add: Vec<Scenario> = match word {
            "all" => SCENARIOS
                .iter()
                .filter(|s| https || !s.https)
                .copied()
                .collect(),
            "http" => SCENARIOS.iter().filter(|s| !s.https).copied().collect(),
            "https" => SCENARIOS.iter().filter(|s| s.https).copied().collect(),
            "h2" => SCENARIOS.iter().filter(|s| s.h2).copied().collect(),
            "h3" => SCENARIOS.iter().filter(|s| s.h3).copied().collect(),
            name => vec![*SCENARIOS.iter().find(|s| s.name == name).ok_or_else(|| {
                let names: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
                BenchError::Flag(format!(
                    "--scenarios {name:?}: unknown; known: all, http, https, h2, h3, {}",
                    names.join(", ")
                ))
            })?],
        };
        for s in add {
            if !out.contains(&s) {
                out.push(s);
            }
        }
    }
    if out.is_empty() {
        return Err(BenchError::Flag("--scenarios: empty list".into()));
    }
    // Run in the table's order, whatever the order given.
    out.sort_by_key(|s| SCENARIOS.iter().position(|t| t == s));
    Ok(out)
}

/// The proxies a `--proxies` value names, in the order given.
pub fn parse_proxies(spec: &str) -> Result<Vec<Proxy>, BenchError> {
    let mut out = Vec::new();
    for word in spec.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        let p = Proxy::parse(word).ok_or_else(|| {
            BenchError::Flag(format!(
                "--proxies {word:?}: unknown; known: direct, relay, portico, nginx, haproxy, caddy, \
                 pingora"
            ))
        })?;
        if !out.contains(&p) {
            out.push(p);
        }
    }
    if out.is_empty() {
        return Err(BenchError::Flag("--proxies: empty list".into()));
    }
    Ok(out)
}

/// What the generator is asked to do for one scenario against one proxy.
#[derive(Debug, Clone)]
pub struct RunSpec<'a> {
    pub scenario: &'a Scenario,
    pub url: String,
    pub label: String,
    pub json: PathBuf,
    pub pid: Option<u32>,
}

/// The `portico bench` arguments (after the program) of one run.
pub fn bench_args(f: &CompareFlags, r: &RunSpec) -> Vec<String> {
    let s = r.scenario;
    let mut a: Vec<String> = vec!["bench".into()];
    let c = match s.metric {
        Metric::Throughput => f.connections.min(THROUGHPUT_CONNECTIONS),
        _ if (s.h2 || s.h3) && !s.close => f.connections.min(H2_CONNECTIONS),
        _ => f.connections,
    };
    match s.metric {
        Metric::Latency => a.extend([
            "--sweep".into(),
            f.rates.clone(),
            "--slo".into(),
            f.slo.clone(),
            "--bisect".into(),
            "0".into(),
        ]),
        _ => a.push("--closed".into()),
    }
    a.extend([
        "-c".into(),
        c.to_string(),
        "-d".into(),
        secs(f.duration),
        "--warmup".into(),
        secs(f.warmup),
    ]);
    if s.close {
        a.push("--close".into());
    }
    if s.h3 {
        a.push("--h3".into());
        if s.early_data {
            a.push("--early-data".into());
        }
        if !s.close {
            a.extend(["--streams".into(), H2_STREAMS.to_string()]);
        }
    }
    if s.h2 {
        a.extend(["--h2".into(), "--streams".into(), H2_STREAMS.to_string()]);
    }
    if s.https {
        a.extend([
            "--insecure".into(),
            "--tls-version".into(),
            "1.3".into(),
            "--tls-groups".into(),
            "X25519".into(),
            // One suite for every server (some prefer AES-256, some AES-128).
            "--tls-ciphers".into(),
            "TLS13_AES_128_GCM_SHA256".into(),
            "--tls-resume".into(),
            if s.resume { "on" } else { "off" }.into(),
        ]);
    }
    if let Some(pid) = r.pid {
        a.extend(["--pid".into(), pid.to_string()]);
    }
    a.extend([
        "--label".into(),
        r.label.clone(),
        "--json".into(),
        r.json.display().to_string(),
        r.url.clone(),
    ]);
    a
}

/// A duration as `portico bench` reads it, in seconds (`1.5s`).
fn secs(d: Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

/// The planned time of one run (warm-up and duration, per rate for a sweep).
fn planned(f: &CompareFlags, s: &Scenario) -> Duration {
    let steps = match s.metric {
        Metric::Latency => crate::sweep::parse_rates(&f.rates)
            .map(|r| r.len())
            .unwrap_or(1),
        _ => 1,
    };
    (f.warmup + f.duration + crate::config::MAX_DRAIN) * steps as u32
}

/// The body size the origin sends for a `/bytes/N` path (k and m are powers of 1024, as the
/// origin reads them).
pub fn expected_body(path: &str) -> Option<u64> {
    let n = path.strip_prefix("/bytes/")?;
    let (digits, scale) = match n.as_bytes().last()? {
        b'k' => (&n[..n.len() - 1], 1024),
        b'm' => (&n[..n.len() - 1], 1024 * 1024),
        _ => (n, 1),
    };
    digits.parse::<u64>().ok().map(|d| d * scale)
}

/// What a run's figures say is wrong with it beyond its own warnings: responses smaller than the
/// origin's body (the proxy answered by itself instead of forwarding).
pub fn check_run(s: &Scenario, r: &crate::report::Report) -> Vec<String> {
    let mut w = Vec::new();
    let non_2xx = r.non_2xx();
    if r.requests.errors > 0 || non_2xx > 0 {
        w.push(format!(
            "{} failed requests and {non_2xx} non-2xx responses: not a clean run; the figures are \
             void",
            r.requests.errors
        ));
    }
    if let (Some(body), true) = (expected_body(s.path), r.requests.completed > 0) {
        let mean = r.bytes / r.requests.completed;
        if mean < body {
            w.push(format!(
                "responses averaged {mean} bytes but the origin sends {body}-byte bodies for {}: \
                 they did not come from the origin; the figures are void",
                s.path
            ));
        }
    }
    w
}

/// The children running now, for the signal guard; `true` once a signal stopped the comparison
/// (no child may start after that).
static CHILDREN: std::sync::Mutex<(Vec<u32>, bool)> = std::sync::Mutex::new((Vec::new(), false));

/// Stop every child (and its descendants) then exit, when this process gets SIGINT, SIGTERM or
/// SIGHUP: a comparison stopped from outside (Ctrl-C, a CI timeout) leaves no server behind.
fn guard_signals() {
    let _ = std::thread::Builder::new()
        .name("compare-signals".into())
        .spawn(|| {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            let got = rt.block_on(async {
                use tokio::signal::unix::{signal, SignalKind};
                let (Ok(mut t), Ok(mut i), Ok(mut h)) = (
                    signal(SignalKind::terminate()),
                    signal(SignalKind::interrupt()),
                    signal(SignalKind::hangup()),
                ) else {
                    return false;
                };
                tokio::select! {
                    _ = t.recv() => true,
                    _ = i.recv() => true,
                    _ = h.recv() => true,
                }
            });
            if !got {
                return;
            }
            let roots: Vec<u32> = CHILDREN
                .lock()
                .map(|mut c| {
                    c.1 = true;
                    c.0.clone()
                })
                .unwrap_or_default();
            let all: Vec<u32> = roots
                .iter()
                .flat_map(|p| crate::cpu::descendants(*p))
                .collect();
            signal("-TERM", &roots);
            let end = Instant::now() + Duration::from_secs(2);
            while Instant::now() < end && all.iter().any(|p| running(*p)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let left: Vec<u32> = all.into_iter().filter(|p| running(*p)).collect();
            if !left.is_empty() {
                signal("-KILL", &left);
            }
            // The exit below skips destructors: the CPU cap's cgroup is removed here.
            crate::cgroup::remove_all();
            eprintln!("bench compare: interrupted; its servers were stopped");
            std::process::exit(130);
        });
}

/// A child process that is stopped (SIGTERM, then SIGKILL for the whole tree) when dropped, so
/// that nothing outlives the comparison, even on an error.
struct Proc {
    child: Child,
}

impl Proc {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Wait for the process to exit on its own, at most `limit`.
    fn wait_for(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let end = Instant::now() + limit;
        loop {
            if let Some(st) = self.exited() {
                return Some(st);
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stop(&mut self) {
        let pid = self.pid();
        if self.exited().is_some() {
            if let Ok(mut c) = CHILDREN.lock() {
                c.0.retain(|p| *p != pid);
            }
            return;
        }
        let tree = crate::cpu::descendants(pid);
        signal("-TERM", &[pid]);
        if self.wait_for(STOP_TIMEOUT).is_none() {
            let _ = self.child.kill();
        }
        // Workers a master left behind (nginx's, should the master not have stopped them).
        let left: Vec<u32> = tree.into_iter().filter(|p| *p != pid).collect();
        let still: Vec<u32> = left.into_iter().filter(|p| running(*p)).collect();
        if !still.is_empty() {
            signal("-KILL", &still);
        }
        let _ = self.child.wait();
        if let Ok(mut c) = CHILDREN.lock() {
            c.0.retain(|p| *p != pid);
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether `pid` is a running process (not gone, and not a zombie left for its parent to reap).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, t)| !t.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// Send a signal with kill(1) (the crate forbids unsafe code, so no libc).
fn signal(sig: &str, pids: &[u32]) {
    let mut c = Command::new("kill");
    c.arg(sig);
    for p in pids {
        c.arg(p.to_string());
    }
    let _ = c.stdout(Stdio::null()).stderr(Stdio::null()).status();
}

/// `--proxy-cpu-quota`: a percent of one CPU, at least 1 (`50` or `50%`).
fn parse_percent(s: &str) -> Result<f64, String> {
    match s.trim().trim_end_matches('%').parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 1.0 => Ok(v),
        _ => Err(format!(
            "{s:?}: a percent of one CPU, at least 1 (50 is half a core)"
        )),
    }
}

/// A CPU list as taskset and /proc write it (`0-2,5`); None when malformed.
pub fn parse_cpu_list(s: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.parse::<u32>().ok()?, b.parse::<u32>().ok()?);
                if b < a || b - a > 4096 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    Some(out)
}

/// A free port on 127.0.0.1 (bound and released; a race with other programs is possible but
/// harmless here: the server would fail to start and say so).
fn free_port() -> Result<u16, BenchError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| rt(format!("no free port: {e}")))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| rt(format!("no free port: {e}")))
}

fn rt(msg: String) -> BenchError {
    BenchError::Runtime(msg)
}

/// The last lines of a log file, for error messages.
fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let v: Vec<&str> = text.lines().collect();
    v[v.len().saturating_sub(lines)..].join(" | ")
}

/// Start `cmd` (with taskset when `cpus` is given), output to `log`.
fn spawn(
    cmd: &[String],
    env: &[(String, String)],
    cpus: Option<&str>,
    log: &Path,
) -> Result<Proc, String> {
    let full = pinned(cmd, cpus);
    let (program, args) = full.split_first().ok_or("empty command")?;
    let out = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out
        .try_clone()
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let child = Command::new(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    let mut p = Proc { child };
    let stopping = match CHILDREN.lock() {
        Ok(mut c) if !c.1 => {
            c.0.push(p.pid());
            false
        }
        _ => true,
    };
    if stopping {
        // Interrupted meanwhile: this one must not run.
        let _ = p.child.kill();
        let _ = p.child.wait();
        return Err("interrupted".to_string());
    }
    Ok(p)
}

/// `cmd` prefixed with `taskset -c CPUS` when pinned.
fn pinned(cmd: &[String], cpus: Option<&str>) -> Vec<String> {
    match cpus {
        Some(c) => ["taskset".to_string(), "-c".into(), c.to_string()]
            .into_iter()
            .chain(cmd.iter().cloned())
            .collect(),
        None => cmd.to_vec(),
    }
}

/// Wait until every port accepts a connection (or the process exits, or time runs out).
fn wait_ready(p: &mut Proc, ports: &[u16], log: &Path) -> Result<(), String> {
    let end = Instant::now() + START_TIMEOUT;
    for port in ports {
        let addr = SocketAddr::from(([127, 0, 0, 1], *port));
        loop {
            if let Some(st) = p.exited() {
                return Err(format!("exited at start ({st}): {}", tail(log, 5)));
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                break;
            }
            if Instant::now() >= end {
                return Err(format!(
                    "port {port} not open after {START_TIMEOUT:?}: {}",
                    tail(log, 5)
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

/// The first line a program prints for its version.
fn version_of(program: &str, args: &[&str]) -> String {
    match Command::new(program).args(args).output() {
        Ok(o) => {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            text.lines()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .unwrap_or("unknown")
                .to_string()
        }
        Err(e) => format!("unknown ({e})"),
    }
}

/// Everything a program prints about its build (stdout and stderr), empty when it cannot run.
fn build_info(program: &str, args: &[&str]) -> String {
    match Command::new(program).args(args).output() {
        Ok(o) => format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(_) => String::new(),
    }
}

/// Make a self-signed ECDSA P-256 certificate for localhost and 127.0.0.1 with openssl.
fn make_cert(dir: &Path) -> Result<TlsFiles, String> {
    let files = TlsFiles {
        cert: dir.join("cert.pem").display().to_string(),
        key: dir.join("key.pem").display().to_string(),
        both: dir.join("both.pem").display().to_string(),
    };
    let st = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &files.key,
            "-out",
            &files.cert,
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-days",
            "2",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("cannot run openssl: {e}"))?;
    if !st.status.success() {
        return Err(format!(
            "openssl failed: {}",
            String::from_utf8_lossy(&st.stderr).trim()
        ));
    }
    write_both(&files)?;
    Ok(files)
}

/// HAProxy wants the chain and the key in one file.
fn write_both(files: &TlsFiles) -> Result<(), String> {
    let cert = std::fs::read_to_string(&files.cert).map_err(|e| format!("{}: {e}", files.cert))?;
    let key = std::fs::read_to_string(&files.key).map_err(|e| format!("{}: {e}", files.key))?;
    std::fs::write(&files.both, format!("{cert}\n{key}"))
        .map_err(|e| format!("{}: {e}", files.both))
}

fn file_err(path: &Path) -> impl Fn(std::io::Error) -> BenchError + '_ {
    move |source| BenchError::File {
        path: path.to_path_buf(),
        source,
    }
}

/// Path of `p` relative to `base` as text (for the manifest).
fn rel(p: &Path, base: &Path) -> String {
    p.strip_prefix(base).unwrap_or(p).display().to_string()
}

/// Run the comparison; progress lines go to `out`. Returns the path of `index.html`.
/// Run the comparison (see [`compare_inner`]). When a signal interrupted it, the signal guard
/// is stopping the children and exits with 130 itself: the run's own end (a child stopped by that
/// signal may make it finish early, even "successfully") must not win that race with exit 0.
pub fn compare(f: &CompareFlags, out: &mut dyn Write) -> Result<PathBuf, BenchError> {
    let r = compare_inner(f, out);
    let interrupted = CHILDREN.lock().map(|c| c.1).unwrap_or(false);
    if interrupted {
        // The guard gives the children at most 2 s, then exits with 130: wait for it.
        let end = Instant::now() + Duration::from_secs(30);
        while Instant::now() < end {
            std::thread::sleep(Duration::from_millis(50));
        }
        std::process::exit(130);
    }
    r
}

fn compare_inner(f: &CompareFlags, out: &mut dyn Write) -> Result<PathBuf, BenchError> {
    let proxies = parse_proxies(&f.proxies)?;
    let want_https = f.https || f.cert.is_some();
    let mut scenarios = parse_scenarios(&f.scenarios, want_https)?;
    crate::sweep::parse_rates(&f.rates)?;
    crate::sweep::Slo::parse(&f.slo)?;
    if f.connections == 0 || f.connections > crate::config::MAX_CONNECTIONS {
        return Err(BenchError::Flag(format!(
            "--connections {}: must be 1..={}",
            f.connections,
            crate::config::MAX_CONNECTIONS
        )));
    }
    if f.duration.is_zero() {
        return Err(BenchError::Flag("--duration must be > 0".into()));
    }
    guard_signals();
    let portico = match &f.portico {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .map_err(|e| rt(format!("cannot find the portico binary: {e}")))?,
    };
    let portico_s = portico.display().to_string();
    let dir = &f.out;
    for sub in ["", "results", "logs", "configs"] {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d).map_err(file_err(&d))?;
    }
    let dir = dir.canonicalize().map_err(file_err(dir))?;
    let started = rfc3339(std::time::SystemTime::now());
    let load_at_start = crate::report::load_average();
    let say = |out: &mut dyn Write, line: String| {
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    };

    // Pinning.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (pin, pinning) = if f.no_pin {
        (false, "not pinned (--no-pin)".to_string())
    } else if peers::in_path("taskset").is_none() {
        (false, "not pinned: taskset not found".to_string())
    } else if cpus < 2 {
        (false, format!("not pinned: {cpus} CPU"))
    } else if let Some(bad) = [&f.proxy_cpu, &f.client_cpu].into_iter().find(|list| {
        let allowed = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                    .and_then(|v| parse_cpu_list(v.trim()))
            });
        match (parse_cpu_list(list), allowed) {
            (Some(want), Some(allowed)) => !want.iter().all(|c| allowed.contains(c)),
            (None, _) => true,
            (Some(_), None) => false,
        }
    }) {
        (
            false,
            format!("not pinned: CPU list {bad:?} is not within this process's allowed CPUs"),
        )
    } else {
        (
            true,
            format!(
                "taskset: proxy on CPU {}, origin and load generator on CPU {}",
                f.proxy_cpu, f.client_cpu
            ),
        )
    };
    let proxy_cpus = pin.then(|| f.proxy_cpu.clone());
    let client_cpus = pin.then(|| f.client_cpu.clone());
    // The CPU cap: one cgroup for the whole comparison, which each proxy's command joins.
    let cap = match f.proxy_cpu_quota {
        Some(percent) => Some(
            crate::cgroup::CpuCap::create(
                &format!("portico-bench-{}", std::process::id()),
                percent,
            )
            .map_err(|e| BenchError::Flag(format!("--proxy-cpu-quota: {e}")))?,
        ),
        None => None,
    };
    let capped = |cmd: Vec<String>| match &cap {
        Some(c) => c.wrap(&cmd),
        None => cmd,
    };
    say(
        out,
        format!(
            "bench compare: {pinning}{}; results in {}",
            cap.as_ref()
                .map(|c| format!("; {}", c.describe()))
                .unwrap_or_default(),
            dir.display()
        ),
    );

    // TLS files.
    let mut tls_note = None;
    let tls: Option<TlsFiles> = if !scenarios.iter().any(|s| s.https) {
        None
    } else {
        let tls_dir = dir.join("configs").join("tls");
        std::fs::create_dir_all(&tls_dir).map_err(file_err(&tls_dir))?;
        let made = match (&f.cert, &f.key) {
            (Some(c), Some(k)) => {
                let files = TlsFiles {
                    cert: c.canonicalize().map_err(file_err(c))?.display().to_string(),
                    key: k.canonicalize().map_err(file_err(k))?.display().to_string(),
                    both: tls_dir.join("both.pem").display().to_string(),
                };
                write_both(&files).map(|_| (files, format!("given: {}", c.display())))
            }
            _ => make_cert(&tls_dir).map(|files| {
                (
                    files,
                    "self-signed ECDSA P-256 for localhost, made by openssl".to_string(),
                )
            }),
        };
        match made {
            Ok((files, note)) => {
                tls_note = Some(format!(
                    "{note}; TLS 1.3 with X25519 pinned on every server and the client, which offers \
                     only TLS13_AES_128_GCM_SHA256"
                ));
                Some(files)
            }
            Err(e) => {
                say(out, format!("HTTPS scenarios skipped: {e}"));
                tls_note = Some(format!("HTTPS scenarios skipped: {e}"));
                scenarios.retain(|s| !s.https);
                if scenarios.is_empty() {
                    return Err(rt(format!("no scenario left to run: {e}")));
                }
                None
            }
        }
    };

    // The origin.
    let origin_port = free_port()?;
    let origin_addr = SocketAddr::from(([127, 0, 0, 1], origin_port));
    let origin_cmd: Vec<String> = vec![
        portico_s.clone(),
        "origin".into(),
        "--listen".into(),
        origin_addr.to_string(),
        "--workers".into(),
        "1".into(),
    ];
    let origin_log = dir.join("logs").join("origin.log");
    let mut origin = spawn(&origin_cmd, &[], client_cpus.as_deref(), &origin_log).map_err(rt)?;
    wait_ready(&mut origin, &[origin_port], &origin_log)
        .map_err(|e| rt(format!("the origin: {e}")))?;
    let portico_version = version_of(&portico_s, &["--version"]);
    say(
        out,
        format!(
            "origin: {portico_version} on {origin_addr} (pid {})",
            origin.pid()
        ),
    );

    let mut proxy_entries: Vec<ProxyEntry> = Vec::new();
    let mut results = Vec::new();
    // A proxy's entry is made in the first round; later rounds add their errors to it.
    let keep = |entries: &mut Vec<ProxyEntry>, round: u32, entry: ProxyEntry| match entries
        .iter_mut()
        .find(|e| e.name == entry.name)
    {
        Some(e) => {
            if let (None, Some(err)) = (&e.error, entry.error) {
                e.error = Some(format!("round {round}: {err}"));
            }
        }
        None => entries.push(entry),
    };
    // Rounds: each proxy in turn (A B C, A B C...), started afresh in each round.
    for round in 1..=f.rounds {
        if f.rounds > 1 {
            say(out, format!("round {round}/{}", f.rounds));
        }
        for proxy in &proxies {
            let name = proxy.name();
            let mut entry = ProxyEntry {
                name: name.to_string(),
                version: None,
                command: Vec::new(),
                environment: Vec::new(),
                cpus: None,
                config_file: None,
                config: None,
                skipped: None,
                error: None,
            };
            let skip_all = |results: &mut Vec<ResultEntry>, why: &str| {
                for s in &scenarios {
                    results.push(ResultEntry {
                        proxy: name.to_string(),
                        scenario: s.name.to_string(),
                        round,
                        file: None,
                        command: Vec::new(),
                        skipped: Some(why.to_string()),
                        error: None,
                        warnings: Vec::new(),
                        throttling: None,
                    });
                }
            };
            // The binary it runs: portico's own, or its program found (nginx, HAProxy and Caddy
            // in PATH; Pingora's there or beside the portico binary).
            let program = match proxy.program() {
                None => Some(portico_s.clone()),
                Some(p) => peers::locate(*proxy, p, Path::new(&portico_s))
                    .map(|found| found.display().to_string()),
            };
            let Some(program) = program else {
                let why = proxy.not_found();
                if round == 1 {
                    say(out, format!("{name}: skipped, {why}"));
                    entry.skipped = Some(why.clone());
                    skip_all(&mut results, &why);
                    keep(&mut proxy_entries, round, entry);
                }
                continue;
            };
            // Whether it can serve the HTTP/2 and HTTP/3 scenarios (its build asked once, only
            // when one of them runs).
            let (wants_h2, wants_h3) = (
                scenarios.iter().any(|s| s.h2),
                scenarios.iter().any(|s| s.h3),
            );
            let info = match (wants_h2 || wants_h3, proxy.program(), proxy.h2_probe_args()) {
                (true, Some(program), Some(args)) => build_info(program, args),
                _ => String::new(),
            };
            let mut support = |wants: bool, protocol: &str, capable: Result<(), String>| {
                if !wants {
                    return Err(format!("no {protocol} scenario"));
                }
                if let Err(why) = &capable {
                    if proxy.terminates_tls() && round == 1 {
                        say(out, format!("{name}: {protocol} scenario skipped, {why}"));
                    }
                }
                capable
            };
            let h2_support = support(wants_h2, "HTTP/2", proxy.h2_capable(&info));
            let h3_support = support(wants_h3, "HTTP/3", proxy.h3_capable(&info));
            // Start the proxy (direct: nothing to start).
            let port = free_port()?;
            let tls_port = match &tls {
                Some(_) if proxy.terminates_tls() => Some(free_port()?),
                _ => None,
            };
            let mut running: Option<Proc> = None;
            if *proxy != Proxy::Direct {
                let pdir = dir.join("configs").join(name);
                let setup = Setup {
                    port,
                    tls_port,
                    origin: origin_addr,
                    dir: &pdir,
                    tls: tls.as_ref(),
                    h2: h2_support.is_ok(),
                    h3: h3_support.is_ok(),
                };
                let (cfg_path, text) = peers::write_config(*proxy, &setup)?;
                let cmd = peers::command(*proxy, &program, &cfg_path, &setup);
                let env = peers::environment(*proxy, &pdir);
                entry.version = Some(match proxy {
                    Proxy::Portico => portico_version.clone(),
                    Proxy::Relay => format!("portico bench relay, {portico_version}"),
                    _ => version_of(&program, proxy.version_args()),
                });
                entry.command = capped(pinned(&cmd, proxy_cpus.as_deref()));
                entry.environment = env.clone();
                entry.cpus = proxy_cpus.clone();
                entry.config_file = Some(rel(&cfg_path, &dir));
                entry.config = Some(text);
                let log = dir.join("logs").join(format!("{name}.log"));
                let ports: Vec<u16> = std::iter::once(port).chain(tls_port).collect();
                let started = spawn(&entry.command, &env, None, &log).and_then(|mut p| {
                    wait_ready(&mut p, &ports, &log)?;
                    Ok(p)
                });
                match started {
                    Ok(p) => {
                        say(
                            out,
                            format!(
                                "{name}: {} on 127.0.0.1:{port}{} (pid {})",
                                entry.version.as_deref().unwrap_or("?"),
                                tls_port
                                    .map(|p| format!(" and :{p} (TLS)"))
                                    .unwrap_or_default(),
                                p.pid()
                            ),
                        );
                        running = Some(p);
                    }
                    Err(e) => {
                        say(out, format!("{name}: failed to start: {e}"));
                        entry.error = Some(format!("failed to start: {e}"));
                        skip_all(&mut results, "the proxy failed to start");
                        keep(&mut proxy_entries, round, entry);
                        continue;
                    }
                }
            } else {
                entry.version = Some(format!("no proxy: the origin, {portico_version}"));
            }
            for s in &scenarios {
                let mut r = ResultEntry {
                    proxy: name.to_string(),
                    scenario: s.name.to_string(),
                    round,
                    file: None,
                    command: Vec::new(),
                    skipped: None,
                    error: None,
                    warnings: Vec::new(),
                    throttling: None,
                };
                if let Some(p) = running.as_mut() {
                    if let Some(st) = p.exited() {
                        let e = format!("the proxy exited ({st})");
                        entry.error.get_or_insert(e.clone());
                        r.error = Some(e);
                        results.push(r);
                        continue;
                    }
                }
                // A skip is the same in every round: recorded once.
                let mut skip = |r: ResultEntry| {
                    if round == 1 {
                        results.push(r);
                    }
                };
                if s.close && *proxy == Proxy::Relay {
                    r.skipped = Some(
                        "a new connection per request: the relay opens one to the origin for \
                         each, where the proxies reuse theirs (no floor here)"
                            .into(),
                    );
                    skip(r);
                    continue;
                }
                if let (true, Err(why)) = (s.h2, &h2_support) {
                    r.skipped = Some(why.clone());
                    skip(r);
                    continue;
                }
                if let (true, Err(why)) = (s.h3, &h3_support) {
                    r.skipped = Some(why.clone());
                    skip(r);
                    continue;
                }
                let url = match (s.https, *proxy) {
                    (true, p) if !p.terminates_tls() => {
                        r.skipped = Some(p.no_tls().into());
                        skip(r);
                        continue;
                    }
                    (true, _) => match tls_port {
                        Some(tp) => format!("https://localhost:{tp}{}", s.path),
                        None => {
                            r.skipped = Some("no certificate".into());
                            skip(r);
                            continue;
                        }
                    },
                    (false, Proxy::Direct) => format!("http://{origin_addr}{}", s.path),
                    (false, _) => format!("http://127.0.0.1:{port}{}", s.path),
                };
                let suffix = if f.rounds > 1 {
                    format!("-r{round}")
                } else {
                    String::new()
                };
                let json = dir
                    .join("results")
                    .join(format!("{name}-{}{suffix}.json", s.name));
                let spec = RunSpec {
                    scenario: s,
                    url,
                    label: name.to_string(),
                    json: json.clone(),
                    pid: running.as_ref().map(Proc::pid),
                };
                let cmd: Vec<String> = std::iter::once(portico_s.clone())
                    .chain(bench_args(f, &spec))
                    .collect();
                r.command = pinned(&cmd, client_cpus.as_deref());
                let _ = std::fs::remove_file(&json);
                let log = dir
                    .join("logs")
                    .join(format!("{name}-{}{suffix}.txt", s.name));
                let before = cap.as_ref().map(|c| c.throttling());
                let outcome = spawn(&cmd, &[], client_cpus.as_deref(), &log).and_then(|mut g| {
                    match g.wait_for(planned(f, s) + RUN_SLACK) {
                        Some(st) if st.success() => Ok(()),
                        Some(st) => Err(format!("the generator failed ({st}): {}", tail(&log, 3))),
                        None => Err("the generator overran its time and was stopped".to_string()),
                    }
                });
                match outcome
                    .and_then(|_| Input::load(&json).map_err(|e| format!("no usable result: {e}")))
                {
                    Ok(input) => {
                        say(
                            out,
                            format!("  {name:<8} {:<20} {}", s.name, one_line(&input)),
                        );
                        if let Input::Run(run) = &input {
                            r.warnings = check_run(s, run);
                        }
                        for w in &r.warnings {
                            say(out, format!("    warning: {w}"));
                        }
                        if let (Some(c), Some(b), Some(_)) = (&cap, before, &running) {
                            let t = c.throttling().since(b).text();
                            say(out, format!("    cap: {t}"));
                            r.throttling = Some(t);
                        }
                        r.file = Some(rel(&json, &dir));
                    }
                    Err(e) => {
                        say(out, format!("  {name:<8} {:<20} error: {e}", s.name));
                        r.error = Some(e);
                    }
                }
                results.push(r);
            }
            if let Some(mut p) = running.take() {
                if let Some(st) = p.exited() {
                    entry
                        .error
                        .get_or_insert(format!("the proxy exited ({st})"));
                }
                p.stop();
            }
            keep(&mut proxy_entries, round, entry);
        }
    }
    origin.stop();

    let manifest = Manifest {
        version: MANIFEST_VERSION,
        kind: "compare".into(),
        title: f
            .title
            .clone()
            .unwrap_or_else(|| "portico bench compare".to_string()),
        started,
        finished: rfc3339(std::time::SystemTime::now()),
        command: f.command.clone(),
        portico_version,
        host: Host::this(),
        load_at_start,
        pinning,
        cpu_cap: cap.as_ref().map(|c| crate::manifest::CapEntry {
            percent: c.percent,
            how: c.describe(),
        }),
        duration_s: f.duration.as_secs_f64(),
        warmup_s: f.warmup.as_secs_f64(),
        connections: f.connections,
        rates: f.rates.clone(),
        slo: f.slo.clone(),
        tls: tls_note,
        origin: ProcessEntry {
            version: version_of(&portico_s, &["--version"]),
            command: pinned(&origin_cmd, client_cpus.as_deref()),
            cpus: client_cpus.clone(),
        },
        generator: ProcessEntry {
            version: version_of(&portico_s, &["--version"]),
            command: vec![portico_s.clone(), "bench".into()],
            cpus: client_cpus,
        },
        proxies: proxy_entries,
        scenarios: scenarios
            .iter()
            .map(|s| ScenarioEntry {
                name: s.name.into(),
                short: s.short.into(),
                title: s.title.into(),
                path: s.path.into(),
                metric: s.metric,
                https: s.https,
                close: s.close,
                resume: s.resume,
                h2: s.h2,
                h3: s.h3,
            })
            .collect(),
        rounds: f.rounds,
        results,
        summary: Vec::new(),
    };
    let mut manifest = manifest;
    manifest.summary =
        crate::rounds::summaries(&manifest, &crate::rounds::load_all(&manifest, &dir));
    say(
        out,
        crate::rounds::table(&manifest.summary, manifest.rounds, manifest.pinned())
            .trim_end()
            .to_string(),
    );
    let mpath = dir.join("manifest.json");
    let text = serde_json::to_string_pretty(&manifest).map_err(|e| rt(e.to_string()))?;
    std::fs::write(&mpath, text).map_err(file_err(&mpath))?;
    let index = crate::compare_page::write(&manifest, &dir, &dir)?;
    say(
        out,
        format!("wrote {} and {}", mpath.display(), index.display()),
    );
    Ok(index)
}

/// One line about a result for the progress output.
fn one_line(input: &Input) -> String {
    match input {
        Input::Run(r) => {
            let cpu = r
                .cpu
                .as_ref()
                .and_then(|c| c.us_per_request)
                .map(|u| format!(", proxy CPU {u:.2} us/req"))
                .unwrap_or_default();
            let conns = if r.keep_alive {
                String::new()
            } else {
                format!(", {:.0} conn/s", r.connections_per_s)
            };
            let non_2xx = r.non_2xx();
            format!(
                "{:.0} req/s{conns}, {:.1} MB/s{cpu}, {} errors, {non_2xx} non-2xx",
                r.achieved_rate,
                r.bytes_per_s / 1e6,
                r.requests.errors
            )
        }
        Input::Sweep(s) => s.conclusion(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenario_lists() {
        let names = |v: Vec<Scenario>| v.iter().map(|s| s.name).collect::<Vec<_>>();
        assert_eq!(
            names(parse_scenarios("all", false).unwrap()),
            [
                "rps-0k",
                "rps-1k",
                "rps-10k",
                "rps-100k",
                "cps",
                "throughput-1m",
                "latency"
            ]
        );
        assert_eq!(parse_scenarios("all", true).unwrap().len(), SCENARIOS.len());
        assert_eq!(
            names(parse_scenarios("latency, https-cps,rps-1k,rps-1k", false).unwrap()),
            ["rps-1k", "latency", "https-cps"]
        );
        assert!(parse_scenarios("https", false)
            .unwrap()
            .iter()
            .all(|s| s.https));
        let e = parse_scenarios("rps-2k", false).unwrap_err().to_string();
        assert!(e.contains("rps-2k") && e.contains("throughput-1m"), "{e}");
        assert!(parse_scenarios(",", false).is_err());
        assert_eq!(
            parse_proxies("portico, direct,portico").unwrap(),
            [Proxy::Portico, Proxy::Direct]
        );
        assert!(parse_proxies("envoy").is_err());
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("0-2,5"), Some(vec![0, 1, 2, 5]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("a"), None);
        assert_eq!(parse_cpu_list(""), None);
    }

    #[test]
    fn response_sizes_are_checked_against_the_origin() {
        assert_eq!(expected_body("/bytes/0"), Some(0));
        assert_eq!(expected_body("/bytes/1k"), Some(1024));
        assert_eq!(expected_body("/bytes/1m"), Some(1 << 20));
        assert_eq!(expected_body("/other"), None);
        let s = SCENARIOS.iter().find(|s| s.name == "rps-1k").unwrap();
        let mut r = crate::report::test_report(None, &[1; 10], 0, 0);
        r.bytes = 10 * 124;
        let w = check_run(s, &r);
        assert!(w[0].contains("averaged 124 bytes"), "{w:?}");
        r.bytes = 10 * 1200;
        assert!(check_run(s, &r).is_empty());
        // A run with a failed request is void too.
        let mut r = crate::report::test_report(None, &[1; 10], 1, 0);
        r.bytes = 10 * 1200;
        let w = check_run(s, &r);
        assert!(w[0].starts_with("1 failed requests and 0 non-2xx"), "{w:?}");
    }

    #[test]
    fn generator_arguments_per_scenario() {
        let f = CompareFlags {
            duration: Duration::from_millis(1500),
            ..CompareFlags::new("/tmp/o".into())
        };
        let find = |n: &str| SCENARIOS.iter().find(|s| s.name == n).unwrap();
        let names = |v: Vec<Scenario>| v.iter().map(|s| s.name).collect::<Vec<_>>();
        let spec = |n: &'static str, pid| RunSpec {
            scenario: find(n),
            url: "https://localhost:9/bytes/0".into(),
            label: "nginx".into(),
            json: "/tmp/o/results/nginx-x.json".into(),
            pid,
        };
        let a = bench_args(&f, &spec("https-cps", Some(42))).join(" ");
        assert_eq!(
            a,
            "bench --closed -c 50 -d 1.5s --warmup 1s --close --insecure --tls-version 1.3 \
             --tls-groups X25519 --tls-ciphers TLS13_AES_128_GCM_SHA256 --tls-resume off --pid 42 --label nginx \
             --json /tmp/o/results/nginx-x.json https://localhost:9/bytes/0"
        );
        let a = bench_args(&f, &spec("https-cps-resumed", None)).join(" ");
        assert!(a.contains("--tls-resume on") && !a.contains("--pid"), "{a}");
        let a = bench_args(&f, &spec("h2-rps-1k", Some(7))).join(" ");
        assert!(
            a.starts_with(
                "bench --closed -c 10 -d 1.5s --warmup 1s --h2 --streams 100 --insecure --tls-version 1.3 "
            ),
            "{a}"
        );
        assert_eq!(names(parse_scenarios("h2", false).unwrap()), ["h2-rps-1k"]);
        assert!(names(parse_scenarios("https", false).unwrap()).contains(&"h2-rps-1k"));
        let a = bench_args(&f, &spec("throughput-1m", None)).join(" ");
        assert!(a.starts_with("bench --closed -c 10 "), "{a}");
        let a = bench_args(&f, &spec("latency", Some(1))).join(" ");
        assert!(
            a.starts_with(
                "bench --sweep 2000,5000,10000,20000,30000 --slo p99<10ms --bisect 0 -c 50"
            ),
            "{a}"
        );
        // Every argument list is one `portico bench` accepts.
        for s in &SCENARIOS {
            let mut args = vec!["portico".to_string()];
            args.extend(bench_args(&f, &spec(s.name, Some(1))).into_iter().skip(1));
            let parsed = <crate::Flags as clap::FromArgMatches>::from_arg_matches(
                &<crate::Flags as clap::Args>::augment_args(clap::Command::new("portico"))
                    .try_get_matches_from(&args)
                    .unwrap_or_else(|e| panic!("{}: {e}", s.name)),
            )
            .unwrap();
            assert_eq!(parsed.close, s.close, "{}", s.name);
            assert_eq!(parsed.tls_resume, s.resume, "{}", s.name);
            assert_eq!(parsed.h2, s.h2, "{}", s.name);
            assert_eq!(parsed.h3, s.h3, "{}", s.name);
            assert_eq!(parsed.early_data, s.early_data, "{}", s.name);
        }
        // Five rates, each warm-up + duration + drain.
        assert_eq!(
            planned(&f, find("latency")),
            Duration::from_millis(3500) * 5
        );
        assert_eq!(
            pinned(&["a".to_string()], Some("0")),
            ["taskset", "-c", "0", "a"]
        );
    }

    #[test]
    fn processes_are_stopped_when_dropped() {
        let dir = std::env::temp_dir().join(format!("portico-compare-proc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("sleep.log");
        let p = spawn(&["sleep".to_string(), "30".to_string()], &[], None, &log).unwrap();
        let pid = p.pid();
        assert!(Path::new(&format!("/proc/{pid}")).exists());
        drop(p);
        // Reaped by the drop: no process (and no zombie) is left with that pid.
        let gone = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map_or(true, |s| !s.contains("(sleep)"));
        assert!(gone);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
