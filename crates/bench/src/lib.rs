//! `portico bench`: an open-loop, coordinated-omission-corrected HTTP/1.1 load generator (docs/bench.md).

pub mod config;
pub mod conn;
pub mod cpu;
pub mod deadline;
pub mod error;
pub mod hgrm;
pub mod pacer;
pub mod report;
pub mod request;
pub mod run;
pub mod schedule;
pub mod stats;

pub use config::{parse_duration, parse_header, parse_url, Config, Flags, Mode, Stop};
pub use error::BenchError;
pub use report::Report;
pub use run::{run, Progress};

use std::io::Write;

/// Run the benchmark the flags describe: write the summary to `out`, progress lines to `progress`
/// (when given, e.g. a terminal), and the `--json` and `--hgrm` files.
pub fn execute(
    flags: &Flags,
    out: &mut dyn Write,
    mut progress: Option<&mut dyn Write>,
) -> Result<Report, BenchError> {
    let cfg = Config::from_flags(flags)?;
    let mut show = |p: &Progress| {
        if let Some(w) = progress.as_mut() {
            let _ = write!(w, "\r\x1b[K{}", p.line());
            let _ = w.flush();
        }
    };
    let report = run::run(&cfg, &mut show)?;
    if let Some(w) = progress.as_mut() {
        let _ = write!(w, "\r\x1b[K");
        let _ = w.flush();
    }
    out.write_all(report.summary().as_bytes())
        .map_err(BenchError::Output)?;
    let write_file = |path: &std::path::Path, text: String| {
        std::fs::write(path, text).map_err(|source| BenchError::File {
            path: path.to_path_buf(),
            source,
        })
    };
    if let Some(path) = &flags.json {
        write_file(path, report.to_json())?;
    }
    if let Some(path) = &flags.hgrm {
        write_file(path, report.hgrm())?;
    }
    Ok(report)
}
