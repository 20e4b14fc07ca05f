//! `portico bench`: an open-loop, coordinated-omission-corrected HTTP/1.1 and HTTP/2 load generator (docs/bench.md).

pub mod cgroup;
pub mod compare;
pub mod compare_page;
pub mod config;
pub mod conn;
pub mod cpu;
pub mod deadline;
pub mod error;
pub mod h2conn;
pub mod h3conn;
pub mod hgrm;
pub mod lossy;
pub mod manifest;
pub mod pacer;
pub mod page;
pub mod peers;
pub mod png;
pub mod relay;
pub mod render;
pub mod report;
pub mod request;
pub mod rounds;
pub mod run;
pub mod schedule;
mod session;
pub mod stats;
pub mod svg;
pub mod sweep;
pub mod tls;

pub use compare::{compare, CompareFlags};
pub use config::{parse_duration, parse_header, parse_url, Config, Flags, Mode, Stop};
pub use error::BenchError;
pub use page::ReportFlags;
pub use peers::{peer, PeerFlags};
pub use relay::{relay, RelayFlags};
pub use report::Report;
pub use run::{run, Progress};
pub use sweep::{Job, SweepReport};

use std::cell::RefCell;
use std::io::Write;

/// What [`execute`] ran: one run or a sweep.
#[derive(Debug, Clone)]
pub enum Outcome {
    Run(Box<Report>),
    Sweep(Box<SweepReport>),
}

impl Outcome {
    /// The single run's report (None for a sweep).
    pub fn into_run(self) -> Option<Report> {
        match self {
            Outcome::Run(r) => Some(*r),
            Outcome::Sweep(_) => None,
        }
    }

    /// The sweep's report (None for a single run).
    pub fn into_sweep(self) -> Option<SweepReport> {
        match self {
            Outcome::Sweep(s) => Some(*s),
            Outcome::Run(_) => None,
        }
    }
}

/// Run the benchmark (or the sweep) the flags describe: write the summary to `out`, progress lines
/// to `progress` (when given, e.g. a terminal), and the `--json` and `--hgrm` files.
pub fn execute(
    flags: &Flags,
    out: &mut dyn Write,
    progress: Option<&mut dyn Write>,
) -> Result<Outcome, BenchError> {
    let job = Job::from_flags(flags)?;
    let progress = RefCell::new(progress);
    let mut show = |p: &Progress| {
        if let Some(w) = progress.borrow_mut().as_mut() {
            let _ = write!(w, "\r\x1b[K{}", p.line());
            let _ = w.flush();
        }
    };
    let write_file = |path: &std::path::Path, text: String| {
        std::fs::write(path, text).map_err(|source| BenchError::File {
            path: path.to_path_buf(),
            source,
        })
    };
    let outcome = match job {
        Job::Run(cfg) => {
            let report = run::run(&cfg, &mut show)?;
            clear(&progress);
            out.write_all(report.summary().as_bytes())
                .map_err(BenchError::Output)?;
            if let Some(path) = &flags.json {
                write_file(path, report.to_json())?;
            }
            if let Some(path) = &flags.hgrm {
                write_file(path, report.hgrm())?;
            }
            Outcome::Run(Box::new(report))
        }
        Job::Sweep(sc) => {
            // Each run's line is written as it ends: clear the progress line first.
            let mut lines = ClearFirst {
                out,
                progress: &progress,
            };
            let report = sweep::run_sweep(&sc, &mut lines, &mut show)?;
            clear(&progress);
            if let Some(path) = &flags.json {
                write_file(path, report.to_json())?;
            }
            Outcome::Sweep(Box::new(report))
        }
    };
    Ok(outcome)
}

fn clear(progress: &RefCell<Option<&mut dyn Write>>) {
    if let Some(w) = progress.borrow_mut().as_mut() {
        let _ = write!(w, "\r\x1b[K");
        let _ = w.flush();
    }
}

/// A writer that clears the progress line before each write to `out`.
struct ClearFirst<'a, 'b> {
    out: &'a mut dyn Write,
    progress: &'a RefCell<Option<&'b mut dyn Write>>,
}

impl Write for ClearFirst<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        clear(self.progress);
        self.out.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}
