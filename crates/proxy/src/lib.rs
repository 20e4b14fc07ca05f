//! The data plane: listeners, per-connection tasks, routing, forwarding, local responses.

pub mod admin;
mod cert_watch;
mod conn;
mod control;
mod date;
mod downstream;
mod error;
mod fast_timeout;
mod filter;
mod flow;
mod h2_fields;
mod h2_interim;
mod h2_io;
mod headers;
mod metrics;
mod proxy_header;
mod resilience;
mod route;
mod serve;
mod server;
mod split;
mod state;
mod sticky;
mod stream;
mod telemetry;
mod tunnel;
mod upstream;
mod vars;
mod websocket;

pub use control::{ConfigSource, Control, ReloadError, ReloadSummary, StartError};
pub use error::ProxyError;
pub use serve::h2;
pub use server::{start, Running};
pub use telemetry::stats::{Stats, Termination};
pub use telemetry::{logging, stats};
pub use upstream::health::{self, HealthChecker};
