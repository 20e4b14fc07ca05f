//! The data plane: listeners, per-connection tasks, routing, forwarding, local responses.

pub mod access_log;
pub mod admin;
pub mod admit;
pub mod attempt;
pub mod cert_watch;
pub mod client_limit;
pub mod conn;
pub mod date;
pub mod error;
pub mod forward;
pub mod h2;
mod h2_fields;
pub mod h2_interim;
pub mod headers;
pub mod health;
pub mod health_h2;
pub mod load;
pub mod metrics;
pub mod pool;
pub mod queue;
pub mod ratelimit;
pub mod resilience;
pub mod retry;
pub mod route;
pub mod server;
pub mod shed;
pub mod stats;
pub mod sticky;
pub mod stream;
pub mod timing;
pub mod upstream_h2;
pub mod upstream_tls;

pub use error::ProxyError;
pub use health::HealthChecker;
pub use server::{start, ConfigSource, Control, ReloadError, ReloadSummary, Running, StartError};
pub use stats::{Stats, Termination};
