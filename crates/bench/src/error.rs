//! The typed errors of `portico bench`: bad flags, unusable targets, failed output files.

use std::path::PathBuf;

/// Why a benchmark could not be set up, run or written out. Request failures during a run are
/// not errors of this kind: they are counted in the report.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A flag value that cannot be used (message names the flag).
    #[error("{0}")]
    Flag(String),
    /// The URL cannot be used as a target.
    #[error("bad URL {url:?}: {reason}")]
    Url { url: String, reason: String },
    /// The target host name did not resolve.
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        host: String,
        #[source]
        source: std::io::Error,
    },
    /// Reading `--body @FILE` or writing `--json`/`--hgrm` failed.
    #[error("{}: {source}", path.display())]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A process named by `--pid` cannot be sampled.
    #[error("cannot sample the CPU time of pid {pid}: {reason}")]
    Cpu { pid: u32, reason: String },
    /// The runtime or a worker thread could not be started, or a worker failed.
    #[error("load generator: {0}")]
    Runtime(String),
    /// A `.hgrm` text that does not follow the percentile-distribution format.
    #[error("bad .hgrm text, line {line}: {reason}")]
    Hgrm { line: usize, reason: String },
    /// A `--json` result that `portico bench report` cannot read.
    #[error("{}: {reason}", path.display())]
    Json { path: PathBuf, reason: String },
    /// Writing the human summary failed.
    #[error("writing the summary: {0}")]
    Output(#[source] std::io::Error),
}
