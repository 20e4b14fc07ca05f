//! Flags as the command line gives them, validated once into a typed run configuration.

use crate::error::BenchError;
use portico_http1::Method;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

/// The `portico bench` flags: the command line parses straight into this (clap `Args`), and tests
/// build it from [`Flags::default`].
#[derive(Debug, Clone, clap::Args)]
pub struct Flags {
    /// Target URL (http:// or https://); more URLs may follow (same scheme, host and port),
    /// requested in turn.
    #[arg(default_value = "", hide_default_value = true, value_name = "URL")]
    pub url: String,
    /// More target URLs, requested in turn with the first.
    #[arg(value_name = "URL")]
    pub more_urls: Vec<String>,
    /// Read more target URLs from FILE, one per line (blank lines and # comments skipped).
    #[arg(long, value_name = "FILE")]
    pub urls_file: Option<PathBuf>,
    /// Offered rate, requests/s over all connections (open loop).
    #[arg(long, short = 'R')]
    pub rate: Option<f64>,
    /// Closed loop: each connection sends its next request when the previous one completes.
    #[arg(long)]
    pub closed: bool,
    /// Connections over all threads (kept open unless --close).
    #[arg(long, short, default_value_t = 10)]
    pub connections: usize,
    /// Threads, each a single-threaded runtime owning connections/threads connections.
    #[arg(long, short, default_value_t = 1)]
    pub threads: usize,
    /// Measured duration (default 10s), e.g. 30s, 2m.
    #[arg(long, short, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Measured requests over all connections, instead of a duration.
    #[arg(long, short = 'n')]
    pub requests: Option<u64>,
    /// Warm-up before the measured phase, excluded from the results.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Request method.
    #[arg(long, short, default_value = "GET")]
    pub method: String,
    /// Request header 'Name: value' (repeatable).
    #[arg(long = "header", short = 'H')]
    pub headers: Vec<String>,
    /// Request body, or @FILE.
    #[arg(long)]
    pub body: Option<String>,
    /// A new connection per request (Connection: close).
    #[arg(long)]
    pub close: bool,
    /// Per-request timeout.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Write the results as JSON to FILE.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the latency percentile distribution (.hgrm, HdrHistogram plotter format) to FILE.
    #[arg(long)]
    pub hgrm: Option<PathBuf>,
    /// Measure the CPU time of this process and its descendants (repeatable).
    #[arg(long = "pid")]
    pub pids: Vec<u32>,
    /// Rate sweep: open-loop steps at START:END:STEP requests/s (or a list R1,R2,...), each with
    /// the warm-up and the duration.
    #[arg(long, value_name = "START:END:STEP")]
    pub sweep: Option<String>,
    /// Sweep: runs per offered rate (default 1).
    #[arg(long, value_name = "N")]
    pub repeat: Option<u32>,
    /// Sweep: service level objective, e.g. 'p99<10ms' (also zero errors, zero non-2xx, every
    /// request sent and finished, generator not lagging); reports the knee.
    #[arg(long, value_name = "pP<LATENCY")]
    pub slo: Option<String>,
    /// Sweep with --slo: bisection steps between the last passing and the first failing rate
    /// (default 4).
    #[arg(long, value_name = "N")]
    pub bisect: Option<u32>,
    /// Name of the run in reports (default: the URL).
    #[arg(long)]
    pub label: Option<String>,
    /// HTTPS: the TLS version to offer, 1.2 or 1.3 (default: both).
    #[arg(long, value_name = "1.2|1.3")]
    pub tls_version: Option<String>,
    /// HTTPS: cipher suites to offer, in order, comma-separated (rustls names, e.g.
    /// TLS13_AES_128_GCM_SHA256).
    #[arg(long, value_name = "LIST")]
    pub tls_ciphers: Option<String>,
    /// HTTPS: key-exchange groups to offer, in order, comma-separated (X25519, secp256r1,
    /// secp384r1, X25519MLKEM768...).
    #[arg(long, value_name = "LIST")]
    pub tls_groups: Option<String>,
    /// HTTPS: session resumption (tickets and session IDs) on or off.
    #[arg(long, value_name = "on|off", default_value = "on", action = clap::ArgAction::Set,
          value_parser = crate::tls::parse_on_off)]
    pub tls_resume: bool,
    /// HTTPS: do not verify the server's certificate (self-signed benchmark certificates).
    #[arg(long, short = 'k')]
    pub insecure: bool,
    /// HTTPS: trust the CA certificates of this PEM file instead of the system's.
    #[arg(long, value_name = "FILE")]
    pub cacert: Option<PathBuf>,
    /// HTTP/2: TLS with ALPN h2 for https:// URLs, h2c with prior knowledge for http:// URLs.
    #[arg(long)]
    pub h2: bool,
    /// HTTP/3 over QUIC (https:// URLs only): ALPN h3, TLS 1.3.
    #[arg(long, conflicts_with = "h2")]
    pub h3: bool,
    /// HTTP/2 and HTTP/3: streams in flight per connection (default 1; h2load's -m).
    #[arg(long, value_name = "N")]
    pub streams: Option<usize>,
    /// HTTP/3: send requests as 0-RTT data when a connection resumes a session (needs
    /// --tls-resume on; the report counts the 0-RTT handshakes the server accepted and refused).
    #[arg(long)]
    pub early_data: bool,
    /// HTTP/3: drop this share of UDP datagrams each way at the generator's sockets, e.g. 1%,
    /// to measure what loss costs (at most 50%).
    #[arg(long, value_name = "PERCENT", value_parser = parse_percent)]
    pub loss: Option<f64>,
    /// The command line, stored in the JSON (set by the CLI, not a flag).
    #[arg(skip)]
    pub command: Option<String>,
}

impl Default for Flags {
    fn default() -> Self {
        Flags {
            url: String::new(),
            more_urls: Vec::new(),
            urls_file: None,
            rate: None,
            closed: false,
            connections: 10,
            threads: 1,
            duration: None,
            requests: None,
            warmup: Duration::ZERO,
            method: "GET".to_string(),
            headers: Vec::new(),
            body: None,
            close: false,
            timeout: Duration::from_secs(5),
            json: None,
            hgrm: None,
            pids: Vec::new(),
            sweep: None,
            repeat: None,
            slo: None,
            bisect: None,
            label: None,
            tls_version: None,
            tls_ciphers: None,
            tls_groups: None,
            tls_resume: true,
            insecure: false,
            cacert: None,
            h2: false,
            h3: false,
            streams: None,
            early_data: false,
            loss: None,
            command: None,
        }
    }
}

/// Open loop at a constant offered rate, or closed loop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// Requests per second over all connections.
    Open {
        rate: f64,
    },
    Closed,
}

/// When the measured phase ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// After this long (the warm-up comes before it).
    Duration(Duration),
    /// After this many measured requests over all connections.
    Requests(u64),
}

/// Where the requests go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The URL as given.
    pub url: String,
    /// Host as written in the URL (brackets removed from IPv6 literals).
    pub host: String,
    pub port: u16,
    /// The request target: path and query, at least `/`.
    pub path: String,
    /// The `Host` field value: host, with the port when it is not the scheme's default.
    pub authority: String,
    /// `https://`.
    pub tls: bool,
}

/// A validated benchmark configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The first URL.
    pub target: Target,
    /// Every URL, the first included, requested in turn (one on a single-URL run).
    pub targets: Vec<Target>,
    pub addr: SocketAddr,
    pub mode: Mode,
    pub connections: usize,
    pub threads: usize,
    pub stop: Stop,
    pub warmup: Duration,
    pub method: Method,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub close: bool,
    pub timeout: Duration,
    pub pids: Vec<u32>,
    /// `https://`: the client configuration.
    pub tls: Option<crate::tls::TlsClient>,
    /// `--h2`: HTTP/2 (TLS with ALPN h2, or h2c with prior knowledge).
    pub h2: bool,
    /// `--h3`: HTTP/3 over QUIC.
    pub h3: bool,
    /// Requests in flight per connection: `--streams` with `--h2`, else 1.
    pub streams: usize,
    /// `--loss`: the share of datagrams the generator drops each way (0 to 0.5).
    pub loss: f64,
    /// `--label`.
    pub label: Option<String>,
    /// The command line, for the JSON.
    pub command: Option<String>,
}

/// How long requests still in flight after the last scheduled send may take to finish before
/// they are reported as unfinished: the request timeout, at most this.
pub const MAX_DRAIN: Duration = Duration::from_secs(1);

/// Most connections one run may open.
pub const MAX_CONNECTIONS: usize = 100_000;
/// Most streams in flight per HTTP/2 connection.
pub const MAX_STREAMS: usize = 10_000;
/// Most requests in flight at once over all connections (connections times streams).
pub const MAX_IN_FLIGHT: usize = 1_000_000;
/// Most worker threads.
pub const MAX_THREADS: usize = 1024;

impl Config {
    /// Validate the flags (reads `--body @FILE` and resolves the host).
    pub fn from_flags(f: &Flags) -> Result<Config, BenchError> {
        let targets = all_targets(f)?;
        let target = targets
            .first()
            .cloned()
            .ok_or_else(|| flag("a URL is required (or --urls-file FILE)"))?;
        let mode = match (f.rate, f.closed) {
            (Some(_), true) => return Err(flag("--rate and --closed exclude each other")),
            (None, false) => {
                return Err(flag(
                    "choose --rate R (open loop, requests/s), --closed (closed loop) or \
                     --sweep START:END:STEP (open-loop rate sweep)",
                ))
            }
            (Some(r), false) if !(r.is_finite() && r > 0.0 && r <= 1e9) => {
                return Err(flag(format!("--rate {r}: must be > 0 requests/s")))
            }
            (Some(rate), false) => Mode::Open { rate },
            (None, true) => Mode::Closed,
        };
        if f.connections == 0 || f.connections > MAX_CONNECTIONS {
            return Err(flag(format!(
                "--connections {}: must be 1..={MAX_CONNECTIONS}",
                f.connections
            )));
        }
        if f.threads == 0 || f.threads > MAX_THREADS {
            return Err(flag(format!(
                "--threads {}: must be 1..={MAX_THREADS}",
                f.threads
            )));
        }
        if f.threads > f.connections {
            return Err(flag(format!(
                "--threads {} exceeds --connections {}: every thread needs a connection",
                f.threads, f.connections
            )));
        }
        let stop = match (f.duration, f.requests) {
            (Some(_), Some(_)) => return Err(flag("--duration and --requests exclude each other")),
            (Some(d), None) if d.is_zero() => return Err(flag("--duration must be > 0")),
            (Some(d), None) => Stop::Duration(d),
            (None, Some(0)) => return Err(flag("--requests must be > 0")),
            (None, Some(n)) => Stop::Requests(n),
            (None, None) => Stop::Duration(Duration::from_secs(10)),
        };
        if f.timeout.is_zero() {
            return Err(flag("--timeout must be > 0"));
        }
        let method = Method::from_token(&f.method)
            .ok_or_else(|| flag(format!("--method {:?}: not an HTTP method token", f.method)))?;
        if method == Method::Connect {
            return Err(flag("--method CONNECT is not supported"));
        }
        let mut headers = Vec::with_capacity(f.headers.len());
        for h in &f.headers {
            headers.push(parse_header(h)?);
        }
        for (name, _) in &headers {
            if name.eq_ignore_ascii_case("content-length")
                || name.eq_ignore_ascii_case("transfer-encoding")
            {
                return Err(flag(format!(
                    "-H {name}: the framing fields are written from --body"
                )));
            }
            if f.close && name.eq_ignore_ascii_case("connection") {
                return Err(flag(
                    "-H Connection: --close already sets Connection: close",
                ));
            }
        }
        let body = match &f.body {
            None => Vec::new(),
            Some(b) => match b.strip_prefix('@') {
                Some(path) => std::fs::read(path).map_err(|source| BenchError::File {
                    path: PathBuf::from(path),
                    source,
                })?,
                None => b.as_bytes().to_vec(),
            },
        };
        let tls = if target.tls {
            Some(crate::tls::TlsClient::new(
                &crate::tls::TlsOptions {
                    version: f.tls_version.clone(),
                    ciphers: f.tls_ciphers.clone(),
                    groups: f.tls_groups.clone(),
                    insecure: f.insecure,
                    cacert: f.cacert.clone(),
                    resume: f.tls_resume,
                    h2: f.h2,
                    h3: f.h3,
                    early_data: f.early_data,
                },
                &target.host,
            )?)
        } else {
            let tls_flags = [
                ("--tls-version", f.tls_version.is_some()),
                ("--tls-ciphers", f.tls_ciphers.is_some()),
                ("--tls-groups", f.tls_groups.is_some()),
                ("--tls-resume off", !f.tls_resume),
                ("--insecure", f.insecure),
                ("--cacert", f.cacert.is_some()),
            ];
            if let Some((name, _)) = tls_flags.iter().find(|(_, given)| *given) {
                return Err(flag(format!("{name} needs an https:// URL")));
            }
            if f.h3 {
                return Err(flag("--h3 needs an https:// URL (QUIC is always TLS)"));
            }
            if f.early_data {
                return Err(flag("--early-data needs --h3 and an https:// URL"));
            }
            None
        };
        let streams = match (f.h2 || f.h3, f.streams) {
            (false, Some(_)) => return Err(flag("--streams needs --h2 or --h3")),
            (false, None) => 1,
            (true, None) => 1,
            (true, Some(n)) if n == 0 || n > MAX_STREAMS => {
                return Err(flag(format!("--streams {n}: must be 1..={MAX_STREAMS}")))
            }
            (true, Some(n)) => n,
        };
        if f.h2 && f.close {
            return Err(flag(
                "--close and --h2 exclude each other (HTTP/2 has no connection-per-request mode)",
            ));
        }
        if f.h3 && f.close && f.streams.is_some_and(|n| n > 1) {
            return Err(flag(
                "--close with --h3 sends one request per connection: --streams must be 1",
            ));
        }
        if f.loss.is_some() && !f.h3 {
            return Err(flag(
                "--loss needs --h3 (the generator drops its own UDP datagrams)",
            ));
        }
        if f.connections.saturating_mul(streams) > MAX_IN_FLIGHT {
            return Err(flag(format!(
                "--connections {} times --streams {streams}: at most {MAX_IN_FLIGHT} in flight",
                f.connections
            )));
        }
        let addr = resolve(&target)?;
        let cfg = Config {
            target,
            targets,
            addr,
            mode,
            connections: f.connections,
            threads: f.threads,
            stop,
            warmup: f.warmup,
            method,
            headers,
            body,
            close: f.close,
            timeout: f.timeout,
            pids: f.pids.clone(),
            tls,
            h2: f.h2,
            h3: f.h3,
            streams,
            loss: f.loss.unwrap_or(0.0),
            label: f.label.clone(),
            command: f.command.clone(),
        };
        Ok(cfg)
    }

    /// How long requests in flight may finish after the end of the measured phase.
    pub fn drain(&self) -> Duration {
        self.timeout.min(MAX_DRAIN)
    }
}

fn flag(msg: impl Into<String>) -> BenchError {
    BenchError::Flag(msg.into())
}

/// `--loss`: a percentage (`1%`, `0.5`), above 0 and at most 50, as a share (0.01).
pub fn parse_percent(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let n: f64 = t
        .strip_suffix('%')
        .unwrap_or(t)
        .trim()
        .parse()
        .map_err(|_| format!("{s:?}: a percentage, e.g. 1%"))?;
    if !(n > 0.0 && n <= 50.0) {
        return Err(format!("{s:?}: above 0% and at most 50%"));
    }
    // (Rounded: 1.1 / 100 is 0.011000000000000001 in binary.)
    Ok((n * 1e4).round() / 1e6)
}

/// Most URLs one run may take.
pub const MAX_URLS: usize = 10_000;

/// The URL argument(s) and `--urls-file`, parsed; all on the first URL's scheme, host and port
/// (one set of connections serves them all).
fn all_targets(f: &Flags) -> Result<Vec<Target>, BenchError> {
    let mut urls: Vec<String> = std::iter::once(&f.url)
        .chain(&f.more_urls)
        .filter(|u| !u.is_empty())
        .cloned()
        .collect();
    if let Some(path) = &f.urls_file {
        let text = std::fs::read_to_string(path).map_err(|source| BenchError::File {
            path: path.clone(),
            source,
        })?;
        urls.extend(urls_of_file(&text));
    }
    if urls.len() > MAX_URLS {
        return Err(flag(format!("{} URLs: at most {MAX_URLS}", urls.len())));
    }
    let targets = urls
        .iter()
        .map(|u| parse_url(u))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(first) = targets.first() {
        if let Some(other) = targets.iter().find(|t| {
            (t.tls, t.host.to_ascii_lowercase(), t.port)
                != (first.tls, first.host.to_ascii_lowercase(), first.port)
        }) {
            return Err(flag(format!(
                "{}: every URL of a run must have the scheme, host and port of the first ({})",
                other.url, first.url
            )));
        }
    }
    Ok(targets)
}

/// The URLs of a `--urls-file` text: one per line, trimmed; blank lines and `#` comments skipped.
pub fn urls_of_file(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect()
}

fn resolve(t: &Target) -> Result<SocketAddr, BenchError> {
    let mut addrs = (t.host.as_str(), t.port)
        .to_socket_addrs()
        .map_err(|source| BenchError::Resolve {
            host: t.host.clone(),
            source,
        })?;
    addrs.next().ok_or_else(|| BenchError::Resolve {
        host: t.host.clone(),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "no address"),
    })
}

/// Parse `http://host[:port][/path][?query]` or `https://...`. Other schemes are refused.
pub fn parse_url(url: &str) -> Result<Target, BenchError> {
    let bad = |reason: &str| BenchError::Url {
        url: url.to_string(),
        reason: reason.to_string(),
    };
    let lower = url
        .get(..8)
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    let (rest, tls) = if lower.starts_with("http://") {
        (url.get(7..).unwrap_or_default(), false)
    } else if lower.starts_with("https://") {
        (url.get(8..).unwrap_or_default(), true)
    } else {
        return Err(bad("expected http://HOST[:PORT]/PATH or https://..."));
    };
    let default_port = if tls { 443 } else { 80 };
    let rest = rest.split('#').next().unwrap_or_default();
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(split);
    if authority.is_empty() {
        return Err(bad("missing host"));
    }
    if authority.contains('@') {
        return Err(bad("user information in the URL is not supported"));
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let end = v6.find(']').ok_or_else(|| bad("unclosed [ in host"))?;
        let host = v6.get(..end).unwrap_or_default();
        let after = v6.get(end + 1..).unwrap_or_default();
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return Err(bad("junk after ]")),
        };
        (host, port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() || host.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(bad("bad host"));
    }
    let port = match port {
        None => default_port,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| bad("bad port"))?,
    };
    let path = if tail.is_empty() {
        "/".to_string()
    } else if tail.starts_with('?') {
        format!("/{tail}")
    } else {
        tail.to_string()
    };
    if path.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(bad(
            "spaces or control bytes in the path (percent-encode them)",
        ));
    }
    let host_in_field = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    let authority = if port == default_port {
        host_in_field
    } else {
        format!("{host_in_field}:{port}")
    };
    Ok(Target {
        url: url.to_string(),
        host: host.to_string(),
        port,
        path,
        authority,
        tls,
    })
}

/// Parse a duration: a number with a unit `us`, `ms`, `s`, `m` or `h` (`1.5s`, `250ms`); a bare
/// number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, BenchError> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale = match unit.trim() {
        "" | "s" => 1.0,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return Err(flag(format!("{s:?}: unknown unit (use us, ms, s, m or h)"))),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| flag(format!("{s:?}: expected a duration like 10s or 250ms")))?;
    let secs = n * scale;
    if !(secs.is_finite() && (0.0..=1e7).contains(&secs)) {
        return Err(flag(format!("{s:?}: out of range")));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parse `Name: value` into a header field (name a token, value without CR, LF or NUL).
pub fn parse_header(s: &str) -> Result<(String, String), BenchError> {
    let (name, value) = s
        .split_once(':')
        .ok_or_else(|| flag(format!("-H {s:?}: expected 'Name: value'")))?;
    let name = name.trim();
    let value = value.trim();
    if name.is_empty() || Method::from_token(name).is_none() {
        return Err(flag(format!("-H {s:?}: the field name is not a token")));
    }
    if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
        return Err(flag(format!("-H {s:?}: CR, LF or NUL in the value")));
    }
    Ok((name.to_string(), value.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let t = parse_url("http://127.0.0.1:8081/bytes/1k?x=1").unwrap();
        assert_eq!(
            (
                t.host.as_str(),
                t.port,
                t.path.as_str(),
                t.authority.as_str()
            ),
            ("127.0.0.1", 8081, "/bytes/1k?x=1", "127.0.0.1:8081")
        );
        let t = parse_url("http://localhost").unwrap();
        assert_eq!(
            (t.port, t.path.as_str(), t.authority.as_str()),
            (80, "/", "localhost")
        );
        let t = parse_url("HTTP://[::1]:9/?q#frag").unwrap();
        assert_eq!(
            (t.host.as_str(), t.path.as_str(), t.authority.as_str()),
            ("::1", "/?q", "[::1]:9")
        );
        let t = parse_url("https://localhost:8443/x").unwrap();
        assert!(t.tls);
        assert_eq!((t.port, t.authority.as_str()), (8443, "localhost:8443"));
        let t = parse_url("HTTPS://h/").unwrap();
        assert_eq!((t.port, t.authority.as_str(), t.tls), (443, "h", true));
        assert!(!parse_url("http://h:443/").unwrap().tls);
        for bad in [
            "https:///",
            "ftp://x/",
            "http:///",
            "http://x:0/",
            "http://x:99999/",
            "http://u@x/",
            "http://x/a b",
            "x:80",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn several_urls_share_one_origin() {
        let base = Flags {
            url: "http://127.0.0.1:1/a".into(),
            more_urls: vec!["http://127.0.0.1:1/b?x".into()],
            rate: Some(1.0),
            ..Flags::default()
        };
        let c = Config::from_flags(&base).unwrap();
        let paths: Vec<&str> = c.targets.iter().map(|t| t.path.as_str()).collect();
        assert_eq!(paths, ["/a", "/b?x"]);
        let e = Config::from_flags(&Flags {
            more_urls: vec!["http://127.0.0.1:2/".into()],
            ..base.clone()
        })
        .unwrap_err();
        assert!(e.to_string().contains("scheme, host and port"), "{e}");
        let e = Config::from_flags(&Flags {
            url: String::new(),
            more_urls: Vec::new(),
            ..base
        })
        .unwrap_err();
        assert!(e.to_string().contains("a URL is required"), "{e}");
        assert_eq!(
            urls_of_file("# list\nhttp://h/a\n\n  http://h/b  \n#http://h/c\n"),
            ["http://h/a", "http://h/b"]
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("40us").unwrap(), Duration::from_micros(40));
        for bad in ["", "s", "10x", "-1s", "1e400s", "1.2.3s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn headers() {
        assert_eq!(
            parse_header("X-A:  b c ").unwrap(),
            ("X-A".to_string(), "b c".to_string())
        );
        assert!(parse_header("no colon").is_err());
        assert!(parse_header("bad name: x").is_err());
        assert!(parse_header(": x").is_err());
    }

    #[test]
    fn flags_validate() {
        let base = Flags {
            url: "http://127.0.0.1:1/".into(),
            rate: Some(100.0),
            ..Flags::default()
        };
        let c = Config::from_flags(&base).unwrap();
        assert_eq!(c.mode, Mode::Open { rate: 100.0 });
        assert_eq!(c.stop, Stop::Duration(Duration::from_secs(10)));
        let cases = [
            Flags {
                rate: None,
                ..base.clone()
            },
            Flags {
                closed: true,
                ..base.clone()
            },
            Flags {
                rate: Some(0.0),
                ..base.clone()
            },
            Flags {
                connections: 0,
                ..base.clone()
            },
            Flags {
                threads: 11,
                ..base.clone()
            },
            Flags {
                requests: Some(5),
                duration: Some(Duration::from_secs(1)),
                ..base.clone()
            },
            Flags {
                method: "G T".into(),
                ..base.clone()
            },
            Flags {
                headers: vec!["Content-Length: 3".into()],
                ..base.clone()
            },
            Flags {
                body: Some("@/nonexistent/file".into()),
                ..base.clone()
            },
            Flags {
                insecure: true,
                ..base.clone()
            },
            Flags {
                tls_groups: Some("X25519".into()),
                ..base.clone()
            },
            Flags {
                url: "https://127.0.0.1:1/".into(),
                insecure: true,
                tls_version: Some("1.0".into()),
                ..base.clone()
            },
            Flags {
                streams: Some(8),
                ..base.clone()
            },
            Flags {
                h2: true,
                streams: Some(0),
                ..base.clone()
            },
            Flags {
                h2: true,
                close: true,
                ..base.clone()
            },
            Flags {
                h2: true,
                connections: 1000,
                streams: Some(10_000),
                ..base.clone()
            },
        ];
        for f in cases {
            assert!(Config::from_flags(&f).is_err(), "{f:?}");
        }
        let c = Config::from_flags(&Flags {
            h2: true,
            streams: Some(8),
            ..base.clone()
        })
        .unwrap();
        assert!(c.h2);
        assert_eq!(c.streams, 8);
        assert_eq!(Config::from_flags(&base).unwrap().streams, 1);
    }
}
