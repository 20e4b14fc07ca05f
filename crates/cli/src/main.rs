//! The `portico` binary: parse flags, load the configuration, run a job, map errors to exit codes.

use clap::{Parser, Subcommand};
use portico_config::Config;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

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
        /// Worker threads (default: the config's `workers`, else the number of cores).
        #[arg(long, short)]
        workers: Option<usize>,
    },
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
    /// Load-test an HTTP server: open loop at a fixed rate (coordinated-omission corrected) or closed loop.
    Bench(portico_bench::Flags),
}

fn main() -> ExitCode {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Run { config, workers } => match load(config.as_deref()) {
            Ok(cfg) => run(cfg, workers),
            Err(msg) => fail(&msg),
        },
        Command::Check { config } => match load(config.as_deref()) {
            Ok(cfg) => {
                print!("{}", portico_config::explain(&cfg));
                // Certificates and keys are read and checked as `run` would.
                for l in &cfg.listeners {
                    if let Some(tls) = &l.tls {
                        let resumption = portico_tls::Resumption::new();
                        if let Err(e) = portico_tls::server_config(tls, &resumption) {
                            return fail(&format!("listener {}: TLS: {e}", l.name));
                        }
                    }
                }
                for warning in certificate_warnings(&cfg) {
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
        } => match origin_config(root, listen) {
            Ok(cfg) => run(cfg, workers),
            Err(msg) => fail(&msg),
        },
        Command::Bench(flags) => {
            let mut err = std::io::stderr();
            let progress = std::io::stdout()
                .is_terminal()
                .then_some(&mut err as &mut dyn std::io::Write);
            match portico_bench::execute(&flags, &mut std::io::stdout(), progress) {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => fail(&e.to_string()),
            }
        }
    }
}

/// Certificates that expired, are not valid yet or expire within 30 days, per listener.
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
        .collect()
}

fn fail(msg: &str) -> ExitCode {
    eprintln!("error: {msg}");
    ExitCode::from(2)
}

fn load(path: Option<&std::path::Path>) -> Result<Config, String> {
    match path {
        Some(p) => portico_config::load(p).map_err(|e| e.to_string()),
        None => portico_config::parse(portico_config::DEFAULT_CONFIG, "<embedded>")
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

fn run(cfg: Config, workers: Option<usize>) -> ExitCode {
    let workers = workers
        .or(cfg.workers.map(|w| w.get() as usize))
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        });
    for warning in certificate_warnings(&cfg) {
        tracing::warn!("{warning}");
    }
    let running = match portico_proxy::start(cfg, workers) {
        Ok(r) => r,
        Err(e) => return fail(&e.to_string()),
    };
    // Listening addresses go to stdout (scripts and tests wait for them); logs go to stderr.
    for (name, addr) in running.addrs() {
        println!("portico: listener {name} on http://{addr}/");
    }
    tracing::info!("{workers} worker(s); Ctrl-C or SIGTERM stops gracefully");
    if let Err(e) = wait_for_signal() {
        tracing::error!("cannot wait for signals: {e}");
    }
    tracing::info!("shutting down: no new connections, finishing requests in flight");
    running.shutdown();
    let stats = running.stats().clone();
    running.wait();
    tracing::info!("stopped: {}", stats.summary());
    ExitCode::SUCCESS
}

fn wait_for_signal() -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        Ok(())
    })
}
