//! The error log: filter (RUST_LOG, flag or `[log] level`), text or JSON lines, standard error or a file reopened on reload, all through the non-blocking sink.

use portico_config::{LogFormat, LogSettings};
use portico_proxy::logging::{Sink, DEFAULT_FILTER, ERROR_LOG_DROPPED, SINK_CAPACITY};
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, reload, EnvFilter, Registry};

/// What the command line says about the log (each overrides `[log]`).
#[derive(Debug, Default, Clone, clap::Args)]
pub struct LogFlags {
    /// Log filter: a level (trace, debug, info, warn, error, off) or directives such as
    /// "info,portico_proxy::control=debug"; RUST_LOG, when set, wins over it.
    #[arg(long, value_name = "FILTER", value_parser = parse_level)]
    pub log_level: Option<String>,
    /// Log line format.
    #[arg(long, value_name = "FORMAT", value_parser = ["text", "json"])]
    pub log_format: Option<String>,
}

fn parse_level(text: &str) -> Result<String, String> {
    match portico_config::log_filter_error(text) {
        Some(e) => Err(e),
        None => Ok(text.trim().to_string()),
    }
}

/// Where lines go: standard error or a file that a reload may reopen (rotation) or move.
enum Dest {
    Stderr,
    File(std::fs::File),
}

/// The log thread's output; the [`Log`] handle swaps the file under it.
#[derive(Clone)]
struct Output(Arc<Mutex<Dest>>);

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match &mut *self.0.lock().unwrap_or_else(|e| e.into_inner()) {
            Dest::Stderr => std::io::stderr().write(buf),
            Dest::File(f) => f.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match &mut *self.0.lock().unwrap_or_else(|e| e.into_inner()) {
            Dest::Stderr => std::io::stderr().flush(),
            Dest::File(f) => f.flush(),
        }
    }
}

fn open(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

type Filter = reload::Handle<EnvFilter, Registry>;

/// The running error log: flushed before exit, changed by a reload.
pub struct Log {
    sink: Option<Sink>,
    output: Output,
    filter: Option<Filter>,
    /// RUST_LOG or the flag set the filter: the configuration's `level` does not apply.
    fixed_filter: bool,
    format: LogFormat,
}

/// The filter `[log] level` (or the flag) means: the libraries whose warnings any peer can
/// trigger stay at error unless the filter names them.
pub fn filter_text(level: Option<&str>) -> String {
    let Some(level) = level else {
        return DEFAULT_FILTER.to_string();
    };
    let mut out = level.trim().to_string();
    for lib in ["h2", "rustls", "tokio_rustls"] {
        let named = level.split(',').any(|d| {
            let target = d.split('=').next().unwrap_or("").trim();
            target == lib || target.starts_with(&format!("{lib}::"))
        });
        if !named {
            out.push_str(&format!(",{lib}=error"));
        }
    }
    out
}

impl Log {
    /// Start the error log as `settings` and `flags` say (the file, when it cannot be opened,
    /// is reported and standard error used).
    pub fn init(settings: &LogSettings, flags: &LogFlags) -> Log {
        let env = std::env::var("RUST_LOG").ok().filter(|s| !s.is_empty());
        let fixed_filter = env.is_some() || flags.log_level.is_some();
        let filter = match &env {
            Some(text) => EnvFilter::try_new(text).unwrap_or_else(|e| {
                eprintln!("warning: RUST_LOG ignored: {e}");
                EnvFilter::new(DEFAULT_FILTER)
            }),
            None => EnvFilter::new(filter_text(
                flags.log_level.as_deref().or(settings.level.as_deref()),
            )),
        };
        let format = match flags.log_format.as_deref() {
            Some("json") => LogFormat::Json,
            Some(_) => LogFormat::Text,
            None => settings.format,
        };
        let mut open_error = None;
        let dest = match &settings.path {
            None => Dest::Stderr,
            Some(p) => match open(p) {
                Ok(f) => Dest::File(f),
                Err(e) => {
                    open_error = Some(format!("{}: {e}", p.display()));
                    Dest::Stderr
                }
            },
        };
        let ansi = matches!(dest, Dest::Stderr)
            && format == LogFormat::Text
            && std::io::stderr().is_terminal();
        let output = Output(Arc::new(Mutex::new(dest)));
        let sink = Sink::new(
            "error",
            Box::new(output.clone()),
            SINK_CAPACITY,
            &ERROR_LOG_DROPPED,
        );
        let (filter, handle) = reload::Layer::new(filter);
        // Warnings and errors also go to the dashboard's feed of recent events.
        let registry = tracing_subscriber::registry()
            .with(filter)
            .with(portico_proxy::logging::RecentLayer);
        let writer = sink.as_ref().ok().cloned();
        macro_rules! install {
            ($layer:expr) => {
                match writer {
                    Some(w) => registry.with($layer.with_writer(w)).init(),
                    None => registry
                        .with($layer.with_writer(std::sync::Mutex::new(output.clone())))
                        .init(),
                }
            };
        }
        match format {
            LogFormat::Text => install!(fmt::layer().with_ansi(ansi)),
            LogFormat::Json => install!(fmt::layer().json().flatten_event(true)),
        }
        if let Err(e) = &sink {
            tracing::warn!(
                "log lines are written by the workers themselves: cannot start the log thread: {e}"
            );
        }
        if let Some(e) = open_error {
            tracing::error!("cannot open the log file, logging to standard error: {e}");
        }
        Log {
            sink: sink.ok(),
            output,
            filter: Some(handle),
            fixed_filter,
            format,
        }
    }

    /// A reload's `[log]`: the new filter (unless RUST_LOG or the flag set it) and the file
    /// reopened, so renaming the file and reloading rotates it. The format stays until a restart.
    pub fn apply(&self, settings: &LogSettings) {
        if !self.fixed_filter {
            if let Some(h) = &self.filter {
                let text = filter_text(settings.level.as_deref());
                if let Err(e) = h.reload(EnvFilter::new(text)) {
                    tracing::warn!("log filter not changed: {e}");
                }
            }
        }
        if settings.format != self.format {
            tracing::warn!("log.format changes only on restart; lines keep their format");
        }
        // Opened before the output is locked: the log thread never waits on the file system.
        let next = match &settings.path {
            None => Dest::Stderr,
            Some(p) => match open(p) {
                Ok(f) => Dest::File(f),
                Err(e) => {
                    tracing::error!(
                        "cannot open the log file {}: logging where it did: {e}",
                        p.display()
                    );
                    return;
                }
            },
        };
        let mut dest = self.output.0.lock().unwrap_or_else(|e| e.into_inner());
        let _ = dest_flush(&mut dest);
        *dest = next;
    }

    /// Wait up to `timeout` for what was logged to be written.
    pub fn flush(&self, timeout: std::time::Duration) {
        if let Some(sink) = &self.sink {
            sink.flush(timeout);
        }
    }
}

fn dest_flush(dest: &mut Dest) -> std::io::Result<()> {
    match dest {
        Dest::Stderr => std::io::stderr().flush(),
        Dest::File(f) => f.flush(),
    }
}

#[cfg(test)]
mod tests {
    use super::filter_text;

    #[test]
    fn peer_triggered_library_warnings_stay_off_unless_named() {
        assert_eq!(
            filter_text(Some("warn")),
            "warn,h2=error,rustls=error,tokio_rustls=error"
        );
        assert_eq!(
            filter_text(Some("debug,h2=debug")),
            "debug,h2=debug,rustls=error,tokio_rustls=error"
        );
        assert_eq!(
            filter_text(None),
            portico_proxy::logging::DEFAULT_FILTER.to_string()
        );
    }
}
