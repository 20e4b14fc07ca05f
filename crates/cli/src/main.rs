//! The `portico` binary: parse flags, load the configuration, run a job, map errors to exit codes.

mod log;
mod systemd;
mod upgrade;

use clap::{Parser, Subcommand};
use portico_config::Config;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

/// mimalloc instead of glibc malloc: see the workspace Cargo.toml (docs/benchmarks.md has the figures).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "portico",
    version,
    about = "Portico: a reverse proxy, its origin server and its benchmark, in one binary"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the reverse proxy (on the embedded default configuration unless --config is given).
    Run {
        /// TOML configuration file.
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Read the configuration from etcd instead, and follow it: `etcd://HOST:PORT/KEY`
        /// (each new revision is applied as a reload; see docs/operations.md, Running a fleet).
        #[arg(long, value_name = "URL", conflicts_with = "config")]
        config_source: Option<String>,
        #[command(flatten)]
        fleet: FleetFlags,
        #[command(flatten)]
        etcd: EtcdFlags,
        /// Worker threads (default: the config's `workers`, else the number of cores).
        #[arg(long, short)]
        workers: Option<usize>,
        #[command(flatten)]
        log: log::LogFlags,
        /// Take the listening sockets of a running Portico from this Unix socket (the running
        /// process starts its successor with it on SIGUSR2; see docs/operations.md).
        #[arg(long = "upgrade-from", value_name = "SOCKET")]
        upgrade_from: Option<PathBuf>,
    },
    /// Configuration in etcd: `portico config push FILE --to etcd://HOST:PORT/KEY`.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// The instances following a configuration key in etcd: `portico fleet status --from URL`.
    #[command(subcommand)]
    Fleet(FleetCommand),
    /// Validate a configuration and print a summary of what it sets up.
    Check {
        /// TOML configuration file (the embedded default when omitted).
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Run the origin web server: static files and synthetic responses for benchmarks.
    Origin {
        /// Directory to serve files from (synthetic endpoints only when omitted).
        #[arg(long)]
        root: Option<PathBuf>,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8081")]
        listen: SocketAddr,
        /// Worker threads (default: the number of cores).
        #[arg(long, short)]
        workers: Option<usize>,
    },
    /// Print a shell completion script (install it where the shell looks, e.g.
    /// /usr/share/bash-completion/completions/portico).
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff) to standard output (`portico man | man -l -`), or write one
    /// page per command into a directory.
    Man {
        /// Write portico.1, portico-run.1, ... into this directory instead.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Load-test an HTTP server: open loop at a fixed rate (coordinated-omission corrected), closed
    /// loop, or a rate sweep; `portico bench report` turns results into an HTML report.
    Bench(Box<BenchCommand>),
}

/// `portico bench [OPTIONS] URL`, or `portico bench report ...`.
#[derive(clap::Args)]
#[command(
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    subcommand_value_name = "report|compare|relay|peer",
    subcommand_help_heading = "Reports",
    disable_help_subcommand = true
)]
struct BenchCommand {
    #[command(subcommand)]
    job: Option<BenchJob>,
    #[command(flatten)]
    flags: Option<portico_bench::Flags>,
}

#[derive(Subcommand)]
enum BenchJob {
    /// Write DIR/index.html (charts inline) and SVG files from one or more --json results (or
    /// from a `bench compare` manifest.json).
    Report(portico_bench::ReportFlags),
    /// Compare proxies side by side on this machine: origin, then direct, relay, portico, nginx,
    /// haproxy, caddy in turn, pinned, with NGINX's scenarios; JSON per run, manifest.json, index.html.
    Compare(Box<portico_bench::CompareFlags>),
    /// The floor `bench compare` measures proxies against: a blind TCP relay (one thread,
    /// epoll, one connection to --to per client connection, no parsing), until killed.
    Relay(portico_bench::RelayFlags),
    /// Write one proxy's `bench compare` configuration into --dir and print the command that
    /// runs it, one argument per line (to measure it by other means, such as a profiler).
    Peer(portico_bench::PeerFlags),
}

fn main() -> ExitCode {
    portico_tls::install_default_provider();
    // Sockets systemd passed (socket activation), taken before any thread starts: it also
    // removes LISTEN_FDS and LISTEN_PID from the environment, so no child sees them.
    let activated = listenfd::ListenFd::from_env();
    let cli = Cli::parse();
    match cli.command {
        // These start the error log once their configuration is read.
        Command::Run { .. } | Command::Origin { .. } => job(cli, activated),
        _ => logged(&Default::default(), &Default::default(), |_| {
            job(cli, activated)
        }),
    }
}

/// Start the error log (the `[log]` table's settings, overridden by flags and RUST_LOG), run
/// `f`, then wait a little for what was logged to leave (unless the log's output is blocked).
fn logged(
    settings: &portico_config::LogSettings,
    flags: &log::LogFlags,
    f: impl FnOnce(&std::sync::Arc<log::Log>) -> ExitCode,
) -> ExitCode {
    let log = std::sync::Arc::new(log::Log::init(settings, flags));
    let code = f(&log);
    log.flush(std::time::Duration::from_secs(2));
    code
}

fn job(cli: Cli, activated: listenfd::ListenFd) -> ExitCode {
    match cli.command {
        Command::Run {
            config_source: Some(url),
            workers,
            log,
            upgrade_from,
            fleet,
            etcd,
            ..
        } => {
            let key = match portico_proxy::etcd::EtcdKey::open(&url, &etcd.settings()) {
                Ok(k) => k,
                Err(e) => return fail(&e),
            };
            let cache = fleet
                .config_cache
                .clone()
                .unwrap_or_else(portico_proxy::etcd::default_cache);
            let (cfg, revision, text, note) = match etcd_load(&key) {
                Ok(Some((cfg, revision, text))) => (cfg, revision, Some(text), None),
                // No key (deleted by mistake, or not pushed yet), a refused document, or etcd
                // not answering: the last document applied here, if there is one.
                loaded => {
                    let missing = matches!(loaded, Ok(None));
                    let why = match loaded {
                        Ok(_) => format!("{}: no such key in etcd; ", key.name()),
                        // A validation error names the key; anything else is etcd not answering.
                        Err(e) if e.starts_with(&key.name()) => {
                            format!("the document in etcd is refused:\n{e}\n")
                        }
                        Err(e) => format!("etcd unreachable ({e}): "),
                    };
                    // Only a document cached from this key (an unmarked one, from an earlier
                    // version, while etcd does not answer or refuses the document, not for a
                    // key that does not exist: a typo must not start another key's document).
                    let source = portico_proxy::etcd::cache_source(&cache);
                    match &source {
                        Some(s) if *s != key.name() => {
                            return fail(&format!(
                                "{why}the cached configuration {} is from {s}, not from this key",
                                cache.display()
                            ))
                        }
                        None if missing && cache.exists() => {
                            return fail(&format!(
                            "{why}the cached configuration {} does not say which key it is from",
                            cache.display()
                        ))
                        }
                        _ => {}
                    }
                    match portico_config::load_all(&cache) {
                        Ok(cfg) => (
                            cfg,
                            0,
                            None,
                            Some(format!(
                                "{why}starting from the cached configuration {}",
                                cache.display()
                            )),
                        ),
                        Err(c) => {
                            return fail(&format!("{why}and no usable cached configuration: {c}"))
                        }
                    }
                }
            };
            logged(&cfg.log.clone(), &log, |l| {
                if let Some(note) = note {
                    tracing::warn!("{note}");
                }
                let k = key.clone();
                let source: portico_proxy::ConfigSource = Box::new(move || match etcd_load(&k) {
                    Ok(Some((cfg, _, _))) => Ok(cfg),
                    Ok(None) => Err(format!("{}: no such key in etcd", k.name())),
                    Err(e) => Err(e),
                });
                let from = match upgrade_from.as_deref() {
                    Some(path) => Takeover::Predecessor(path),
                    None => Takeover::Activated(activated),
                };
                let follow = Follow {
                    key,
                    revision,
                    interval: fleet.config_poll,
                    instance: fleet.instance.clone().unwrap_or_else(instance_name),
                    cache,
                    applied: text,
                };
                run(cfg, workers, source, l, from, Some(follow))
            })
        }
        Command::Run { etcd, .. } if etcd.given() => {
            fail("the --etcd-* flags go with --config-source")
        }
        Command::Run {
            config,
            workers,
            log,
            upgrade_from,
            ..
        } => match load(config.as_deref()) {
            Ok(cfg) => logged(&cfg.log.clone(), &log, |l| {
                let source = Box::new(move || load(config.as_deref()));
                let from = match upgrade_from.as_deref() {
                    Some(path) => Takeover::Predecessor(path),
                    None => Takeover::Activated(activated),
                };
                run(cfg, workers, source, l, from, None)
            }),
            Err(msg) => fail(&msg),
        },
        Command::Fleet(FleetCommand::Status { from, json, etcd }) => {
            let key = match portico_proxy::etcd::EtcdKey::open(&from, &etcd.settings()) {
                Ok(k) => k,
                Err(e) => return fail(&e),
            };
            match portico_proxy::etcd::Fleet::read(&key) {
                Ok(fleet) => {
                    match json {
                        true => println!("{}", portico_proxy::etcd::fleet_json(&fleet)),
                        false => print!("{}", fleet.text()),
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e),
            }
        }
        Command::Config(ConfigCommand::Push { file, to, etcd }) => {
            let key = match portico_proxy::etcd::EtcdKey::open(&to, &etcd.settings()) {
                Ok(k) => k,
                Err(e) => return fail(&e),
            };
            let text = match std::fs::read_to_string(&file) {
                Ok(t) => t,
                Err(e) => return fail(&format!("{}: {e}", file.display())),
            };
            // Validated here, as each instance will: an invalid document is never written.
            if let Err(e) = portico_config::parse_all(&text, &file.display().to_string()) {
                return fail(&e.to_string());
            }
            match key.put(&text) {
                Ok(revision) => {
                    println!("{}: written at revision {revision}", key.name());
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e),
            }
        }
        Command::Check { config } => match load(config.as_deref()) {
            Ok(cfg) => {
                print!("{}", portico_config::explain(&cfg));
                // Certificates and keys are read and checked as `run` would.
                for l in &cfg.listeners {
                    // An ACME certificate not issued yet is obtained by `run`.
                    if let Some(a) = &l.acme {
                        let names = a.names.join(", ");
                        match portico_tls::stored_certificate(&a.files().cert) {
                            Some(c) if !c.stand_in => {
                                let until = c
                                    .not_after
                                    .duration_since(std::time::UNIX_EPOCH)
                                    .map_or(0, |d| d.as_secs() as i64);
                                println!(
                                    "listener {}: ACME certificate for {names}: issued by {}, valid until {}",
                                    l.name,
                                    c.issuer,
                                    portico_tls::utc_date(until)
                                );
                            }
                            _ => println!(
                                "listener {}: ACME certificate for {names}: not issued yet (`portico run` orders it)",
                                l.name
                            ),
                        }
                    }
                    let issued = l.acme.as_ref().is_none_or(|a| a.files().cert.exists());
                    if let Some(tls) = l.tls.as_ref().filter(|_| issued) {
                        let resumption = portico_tls::Resumption::new();
                        if let Err(e) = portico_tls::server_config(tls, &resumption) {
                            return fail(&format!("listener {}: TLS: {e}", l.name));
                        }
                    }
                }
                // Upstream CA files and client certificates too.
                for g in &cfg.upstreams {
                    if let Some(tls) = &g.tls {
                        let sessions = portico_tls::ClientSessions::new(0);
                        if let Err(e) = portico_tls::client_config(tls, &sessions) {
                            return fail(&format!("upstream {}: TLS: {e}", g.name));
                        }
                    }
                }
                let shadowed = portico_config::shadowed_routes(&cfg);
                for warning in certificate_warnings(&cfg).into_iter().chain(shadowed) {
                    eprintln!("warning: {warning}");
                }
                println!("configuration OK");
                ExitCode::SUCCESS
            }
            Err(msg) => fail(&msg),
        },
        Command::Origin {
            root,
            listen,
            workers,
        } => match origin_config(root.clone(), listen) {
            Ok(cfg) => logged(&cfg.log.clone(), &log::LogFlags::default(), |l| {
                run(
                    cfg,
                    workers,
                    Box::new(move || origin_config(root.clone(), listen)),
                    l,
                    Takeover::Activated(listenfd::ListenFd::empty()),
                    None,
                )
            }),
            Err(msg) => fail(&msg),
        },
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut cmd = Cli::command();
            clap_complete::generate(shell, &mut cmd, "portico", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Command::Man { dir } => {
            use clap::CommandFactory;
            let written = match &dir {
                Some(d) => std::fs::create_dir_all(d)
                    .and_then(|()| clap_mangen::generate_to(Cli::command(), d)),
                None => clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout()),
            };
            match written {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&format!("cannot write the man page: {e}")),
            }
        }
        Command::Bench(bench) => match (bench.job, bench.flags) {
            (Some(BenchJob::Report(r)), _) => match portico_bench::render::write(&r) {
                Ok(index) => {
                    println!("wrote {}", index.display());
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e.to_string()),
            },
            (Some(BenchJob::Compare(mut c)), _) => {
                c.command = Some(command_line());
                match portico_bench::compare(&c, &mut std::io::stdout()) {
                    Ok(_) => ExitCode::SUCCESS,
                    Err(e) => fail(&e.to_string()),
                }
            }
            (Some(BenchJob::Relay(r)), _) => match portico_bench::relay(&r) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&format!("portico bench relay: {e}")),
            },
            (Some(BenchJob::Peer(p)), _) => {
                let me = std::env::current_exe()
                    .map_or_else(|_| "portico".to_string(), |p| p.display().to_string());
                match portico_bench::peer(&p, &me, &mut std::io::stdout()) {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => fail(&format!("portico bench peer: {e}")),
                }
            }
            (None, Some(flags)) => run_bench(flags),
            (None, None) => fail("portico bench: a URL is required (see portico bench --help)"),
        },
    }
}

fn run_bench(mut flags: portico_bench::Flags) -> ExitCode {
    flags.command = Some(command_line());
    let mut err = std::io::stderr();
    let progress = std::io::stdout()
        .is_terminal()
        .then_some(&mut err as &mut dyn std::io::Write);
    match portico_bench::execute(&flags, &mut std::io::stdout(), progress) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => fail(&e.to_string()),
    }
}

/// This process's command line, quoted for a POSIX shell where needed.
fn command_line() -> String {
    let mut args: Vec<String> = std::env::args().collect();
    if let Some(first) = args.first_mut() {
        // The program as `portico`, wherever it was run from.
        if first.ends_with("/portico") {
            *first = "portico".to_string();
        }
    }
    args.iter()
        .map(|a| {
            let plain = !a.is_empty()
                && a.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_./:=,@%+".contains(&b));
            if plain {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Certificates that expired, are not valid yet or expire within 30 days, per listener and
/// upstream group; upstream groups that do not verify certificates.
fn certificate_warnings(cfg: &Config) -> Vec<String> {
    let now = std::time::SystemTime::now();
    cfg.listeners
        .iter()
        .filter_map(|l| Some((l, l.tls.as_ref()?)))
        .flat_map(|(l, tls)| {
            portico_tls::certificate_warnings(tls, now)
                .into_iter()
                .map(move |w| format!("listener {}: TLS: {w}", l.name))
        })
        .chain(
            cfg.upstreams
                .iter()
                .filter_map(|g| Some((g, g.tls.as_ref()?)))
                .flat_map(|(g, tls)| {
                    let unverified = (!tls.verify).then(|| {
                        format!(
                            "upstream {}: TLS: verify = false: server certificates are not checked, so anyone on the path can impersonate these servers",
                            g.name
                        )
                    });
                    portico_tls::upstream_certificate_warnings(tls, now)
                        .into_iter()
                        .map(move |w| format!("upstream {}: TLS: {w}", g.name))
                        .chain(unverified)
                }),
        )
        .collect()
}

/// Print `msg` (one `error: ` line per line of it) and return exit status 2.
fn fail(msg: &str) -> ExitCode {
    for line in msg.lines() {
        eprintln!("error: {line}");
    }
    ExitCode::from(2)
}

/// The configuration at `path` (the embedded default without one); every validation error,
/// one per line, when it is invalid.
fn load(path: Option<&std::path::Path>) -> Result<Config, String> {
    match path {
        Some(p) => portico_config::load_all(p).map_err(|e| e.to_string()),
        None => portico_config::parse_all(portico_config::DEFAULT_CONFIG, "<embedded>")
            .map_err(|e| e.to_string()),
    }
}

/// The origin job is a proxy configuration with one listener whose one route is the origin action.
fn origin_config(root: Option<PathBuf>, listen: SocketAddr) -> Result<Config, String> {
    let origin = match &root {
        Some(r) => {
            let r = r
                .canonicalize()
                .map_err(|e| format!("{}: {e}", r.display()))?;
            toml_string(&r.display().to_string())
        }
        None => "true".to_string(),
    };
    let text = format!(
        "[[listeners]]\nname = \"origin\"\naddress = \"{listen}\"\n\n[listeners.limits]\nmax_connections = 100000\n\n[[listeners.routes]]\norigin = {origin}\nmax_body = 0\n"
    );
    portico_config::parse(&text, "<origin flags>").map_err(|e| e.to_string())
}

fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// What `portico run --config-source` follows once started.
struct Follow {
    key: portico_proxy::etcd::EtcdKey,
    revision: i64,
    interval: std::time::Duration,
    instance: String,
    /// Where the last document applied is kept, and the one applied at start (None: started
    /// from that cache).
    cache: PathBuf,
    applied: Option<String>,
}

/// The flags of a configuration from etcd.
#[derive(clap::Args)]
struct FleetFlags {
    /// Where the last good configuration from etcd is kept, with the key it came from, to start
    /// from when etcd cannot be reached, refuses the document or has no such key (default
    /// /var/lib/portico/config-cache.toml).
    #[arg(
        long,
        value_name = "FILE",
        requires = "config_source",
        conflicts_with = "config"
    )]
    config_cache: Option<PathBuf>,
    /// Changes to the etcd key arrive by watch, and the key is read every 5 s anyway; this is
    /// how often it is read while it cannot be watched (etcd unreachable, no watch) and how
    /// soon a reload that failed for a reason other than the document is tried again.
    #[arg(long, value_name = "DURATION", default_value = "500ms", value_parser = duration_flag, conflicts_with = "config")]
    config_poll: std::time::Duration,
    /// This instance's name under KEY/status/ (default: host name and process id).
    #[arg(
        long,
        value_name = "NAME",
        requires = "config_source",
        conflicts_with = "config"
    )]
    instance: Option<String>,
}

#[derive(Subcommand)]
enum FleetCommand {
    /// One line per instance (from its status key under KEY/status/): version, the
    /// configuration revision it runs, whether it applied it, requests, uptime, its error.
    Status {
        /// `etcd://HOST:PORT/KEY`, the key the instances follow.
        #[arg(long, value_name = "URL")]
        from: String,
        /// The fleet as JSON (as the admin API's `/api/fleet` gives it) instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        etcd: EtcdFlags,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Validate FILE as `portico check` does, then write it to the etcd key instances follow.
    Push {
        /// TOML configuration file.
        file: PathBuf,
        /// `etcd://HOST:PORT/KEY` (`etcds://` for TLS).
        #[arg(long, value_name = "URL")]
        to: String,
        #[command(flatten)]
        etcd: EtcdFlags,
    },
}

/// How etcd is reached: TLS for `etcds://` URLs, and an etcd user.
#[derive(clap::Args)]
struct EtcdFlags {
    /// etcds://: the PEM CA certificates etcd's certificate must chain to (default: the
    /// system's roots).
    #[arg(long, value_name = "FILE")]
    etcd_ca: Option<PathBuf>,
    /// etcds://: a client certificate (PEM) for etcd's --client-cert-auth, with --etcd-key.
    #[arg(long, value_name = "FILE", requires = "etcd_key")]
    etcd_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "etcd_cert")]
    etcd_key: Option<PathBuf>,
    /// The etcd user to authenticate as (etcd's `auth enable`), with --etcd-password-file.
    #[arg(long, value_name = "NAME", requires = "etcd_password_file")]
    etcd_user: Option<String>,
    /// The file holding that user's password (a trailing newline is ignored).
    #[arg(long, value_name = "FILE", requires = "etcd_user")]
    etcd_password_file: Option<PathBuf>,
}

impl EtcdFlags {
    fn settings(&self) -> portico_config::EtcdClient {
        portico_config::EtcdClient {
            ca_file: self.etcd_ca.clone(),
            certificate: match (&self.etcd_cert, &self.etcd_key) {
                (Some(cert), Some(key)) => Some(portico_config::CertificateFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                }),
                _ => None,
            },
            username: self.etcd_user.clone(),
            password_file: self.etcd_password_file.clone(),
        }
    }

    fn given(&self) -> bool {
        self.settings() != portico_config::EtcdClient::default()
    }
}

fn duration_flag(text: &str) -> Result<std::time::Duration, String> {
    portico_config::units::parse_duration(text)
        .map_err(|e| e.to_string())
        .and_then(|d| match d.is_zero() {
            true => Err("must be above zero".to_string()),
            false => Ok(d),
        })
}

/// The host name and process id.
fn instance_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "portico".into());
    format!("{host}-{}", std::process::id())
}

/// The document at `key`, validated (errors name `etcd://HOST:PORT/KEY`, line, column and
/// key), with its revision and text; None when the key does not exist.
fn etcd_load(key: &portico_proxy::etcd::EtcdKey) -> Result<Option<(Config, i64, String)>, String> {
    let Some(doc) = key.get()? else {
        return Ok(None);
    };
    let cfg = portico_config::parse_all(&doc.text, &key.name()).map_err(|e| e.to_string())?;
    Ok(Some((cfg, doc.revision, doc.text)))
}

fn run(
    cfg: Config,
    workers: Option<usize>,
    source: portico_proxy::ConfigSource,
    log: &std::sync::Arc<log::Log>,
    from: Takeover<'_>,
    follow: Option<Follow>,
) -> ExitCode {
    let workers = workers
        .or(cfg.workers.map(|w| w.get() as usize))
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        });
    if let (Some(before), Some(after)) = portico_proxy::raise_open_files_limit() {
        if before != after {
            tracing::debug!("open files limit raised from {before} to {after}");
        }
    }
    let shadowed = portico_config::shadowed_routes(&cfg);
    for warning in certificate_warnings(&cfg).into_iter().chain(shadowed) {
        tracing::warn!("{warning}");
    }
    // Signal handlers are installed before the listeners are announced: a SIGTERM sent as soon
    // as the addresses are printed must stop gracefully, not kill the process.
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => return fail(&format!("cannot install signal handlers: {e}")),
    };
    // A binary upgrade: the predecessor's sockets, and the line to tell it this one serves.
    let (inherited, mut predecessor) = match from {
        Takeover::Predecessor(path) => match upgrade::take_sockets(path) {
            Ok((i, stream)) => (Some(i), Some(stream)),
            Err(e) => return fail(&e),
        },
        Takeover::Activated(fds) => (systemd::activated(fds), None),
    };
    let mut running = match portico_proxy::start_with(cfg, workers, inherited) {
        Ok(r) => r,
        Err(e) => return fail(&e.to_string()),
    };
    running.control().set_source(source);
    if let Some(f) = follow {
        let interval = f.interval;
        if let Err(e) = portico_proxy::etcd::follow(
            running.control(),
            f.key,
            f.revision,
            interval,
            f.instance,
            f.cache,
            f.applied,
        ) {
            return fail(&format!("cannot start the etcd follower: {e}"));
        }
    }
    let log = log.clone();
    running
        .control()
        .set_reload_hook(Box::new(move |config| log.apply(&config.log)));
    // Listening addresses go to stdout (scripts and tests wait for them); logs go to stderr.
    let config = running.control().snapshot().config.clone();
    for (name, addr) in running.addrs() {
        let tls = config
            .listeners
            .iter()
            .any(|l| l.name == name && l.tls.is_some());
        let scheme = if tls { "https" } else { "http" };
        println!("portico: listener {name} on {scheme}://{addr}/");
        tracing::info!(listener = name, "listening on {scheme}://{addr}/");
    }
    if let Some(addr) = running.admin_addr() {
        println!("portico: admin on http://{addr}/ (dashboard, /metrics, /api/status)");
        tracing::info!("admin listener on http://{addr}/");
    }
    tracing::info!(
        "{workers} worker(s); SIGHUP reloads the configuration; Ctrl-C or SIGTERM stops gracefully"
    );
    match &mut predecessor {
        // The predecessor, still systemd's main process, names this one in its place.
        Some(stream) => {
            upgrade::say_ready(stream);
            tracing::info!("serving on the sockets of the previous process, which now drains");
        }
        None => systemd::ready(&format!("serving, {workers} worker(s)")),
    }
    drop(predecessor);
    let ended = signals.wait(&running);
    match ended {
        Ended::Signal => systemd::stopping(),
        Ended::Upgraded(pid) => {
            running.handed_over();
            systemd::main_pid(pid);
            tracing::info!(
                successor = pid,
                "binary upgrade: the new process serves; this one stops accepting and drains"
            );
        }
    }
    let drain = running.control().snapshot().config.drain_timeout;
    tracing::info!(
        "shutting down: no new connections, finishing requests in flight (at most drain_timeout {drain:?}; a second SIGTERM or Ctrl-C exits at once)"
    );
    running.shutdown();
    let stats = running.stats().clone();
    let (done, drained) = tokio::sync::oneshot::channel();
    let waiter = std::thread::Builder::new()
        .name("portico-stop".into())
        .spawn(move || {
            running.wait();
            let _ = done.send(());
        });
    if let Err(e) = waiter {
        tracing::error!("cannot start the thread that waits for the workers: {e}");
        return ExitCode::FAILURE;
    }
    let signals_to_exit = match ended {
        Ended::Signal => 1,
        Ended::Upgraded(_) => 2,
    };
    match signals.drained(drained, drain + EXIT_GRACE, signals_to_exit) {
        Stop::Drained => {
            tracing::info!("stopped: {}", stats.summary());
            ExitCode::SUCCESS
        }
        Stop::Signalled => {
            tracing::warn!(
                "second signal: exiting without waiting for requests in flight: {}",
                stats.summary()
            );
            ExitCode::FAILURE
        }
        Stop::Overdue => {
            tracing::error!(
                "still not stopped {EXIT_GRACE:?} after drain_timeout: exiting anyway: {}",
                stats.summary()
            );
            ExitCode::FAILURE
        }
    }
}

/// How long past `drain_timeout` a stopping process waits for its workers before it exits
/// anyway (they cut what is left at `drain_timeout`; this only bounds what should not happen).
const EXIT_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// How a graceful stop ended.
enum Stop {
    /// Every worker drained and exited.
    Drained,
    /// A second SIGTERM or SIGINT came first.
    Signalled,
    /// The deadline passed first.
    Overdue,
}

/// Where listening sockets may come from besides binding them.
enum Takeover<'a> {
    /// A running Portico hands them over on this Unix socket (a binary upgrade).
    Predecessor(&'a std::path::Path),
    /// systemd passed them (socket activation; none when it did not).
    Activated(listenfd::ListenFd),
}

/// Why serving ended.
#[derive(Clone, Copy)]
enum Ended {
    /// SIGTERM or SIGINT.
    Signal,
    /// A successor (this pid) serves on this process's sockets.
    Upgraded(u32),
}

/// SIGTERM, SIGINT, SIGHUP and SIGUSR2 handlers on a small runtime of the main thread.
struct Signals {
    rt: tokio::runtime::Runtime,
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    usr2: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let _guard = rt.enter();
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
            usr2: signal(SignalKind::user_defined2())?,
            rt,
        })
    }

    /// While the workers drain: wait for `drained`, a second SIGTERM or SIGINT, or `limit`,
    /// whichever comes first.
    /// `signals`: how many SIGTERM or SIGINT end the drain at once (1 after a stop signal, 2
    /// after a binary upgrade, whose drain no signal started).
    fn drained(
        mut self,
        mut drained: tokio::sync::oneshot::Receiver<()>,
        limit: std::time::Duration,
        signals: u32,
    ) -> Stop {
        self.rt.block_on(async {
            let deadline = tokio::time::sleep(limit);
            tokio::pin!(deadline);
            let mut seen = 0;
            loop {
                tokio::select! {
                    _ = &mut drained => return Stop::Drained,
                    _ = self.term.recv() => seen += 1,
                    _ = self.int.recv() => seen += 1,
                    _ = &mut deadline => return Stop::Overdue,
                }
                if seen >= signals {
                    return Stop::Signalled;
                }
                tracing::info!(
                    "draining after a binary upgrade: a second SIGTERM or Ctrl-C exits at once"
                );
            }
        })
    }

    /// Wait for SIGTERM or SIGINT, or for a successor to serve; SIGHUP reloads the
    /// configuration meanwhile (an invalid one is logged and refused, and the running one
    /// stays), SIGUSR2 starts the binary now installed as a successor (see `upgrade`).
    fn wait(&mut self, running: &portico_proxy::Running) -> Ended {
        let control = running.control();
        let (done_tx, mut done) = tokio::sync::mpsc::unbounded_channel();
        let mut upgrading = false;
        let cancel = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        self.rt.block_on(async {
            loop {
                // A reload signalled before a stop is applied before it.
                tokio::select! {
                    biased;
                    Some(r) = done.recv() => {
                        upgrading = false;
                        match r {
                            Ok(pid) => return Ended::Upgraded(pid),
                            Err(e) => tracing::error!("binary upgrade failed, this process serves on: {e}"),
                        }
                    },
                    _ = self.usr2.recv() => {
                        if upgrading {
                            tracing::warn!("SIGUSR2: a binary upgrade is already under way");
                            continue;
                        }
                        let successor = match running.successor() {
                            Ok(s) => s,
                            Err(e) => {
                                tracing::error!("binary upgrade: {e}");
                                continue;
                            }
                        };
                        tracing::info!("SIGUSR2: starting the installed binary to take over the sockets");
                        let tx = done_tx.clone();
                        let cancel = cancel.clone();
                        let spawned = std::thread::Builder::new()
                            .name("portico-upgrade".into())
                            .spawn(move || {
                                let _ = tx.send(upgrade::start_successor(&successor, &cancel));
                            });
                        match spawned {
                            Ok(_) => upgrading = true,
                            Err(e) => tracing::error!("binary upgrade: {e}"),
                        }
                    },
                    // The reload logs what changed, or why it was refused.
                    _ = self.hup.recv() => {
                        systemd::reloading();
                        let status = match control.reload("SIGHUP") {
                            Ok(s) => format!("serving, configuration generation {}", s.generation),
                            Err(_) => "serving; the last reload was refused (see the log)".to_string(),
                        };
                        systemd::ready(&status);
                    },
                    _ = self.term.recv() => break,
                    _ = self.int.recv() => break,
                }
            }
            // Told to stop while a successor starts: it is stopped first, so no process is left
            // serving on the sockets without this one knowing.
            if upgrading {
                cancel.store(true, std::sync::atomic::Ordering::Relaxed);
                let ended =
                    tokio::time::timeout(std::time::Duration::from_secs(5), done.recv()).await;
                if let Ok(Some(Ok(pid))) = ended {
                    // It began serving just before: it serves on; this one drains as after
                    // any upgrade.
                    return Ended::Upgraded(pid);
                }
            }
            Ended::Signal
        })
    }
}
