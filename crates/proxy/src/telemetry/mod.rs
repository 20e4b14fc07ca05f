//! What the proxy tells about itself: counters and termination records, the access log, the non-blocking log sink and rate-limited log lines, per-request phase timings and ids, trace context and spans.

pub mod access_log;
pub mod logging;
pub mod request_id;
pub mod span;
pub mod stats;
pub mod text;
pub mod timing;
pub mod trace;
