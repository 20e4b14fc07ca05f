//! Configuration: TOML text -> raw serde model -> validated, typed `Config` with file:line:col errors.

mod diff;
mod error;
mod explain;
pub mod hash;
pub mod htpasswd;
pub mod jwks;
pub mod model;
mod raw;
mod shadow;
pub mod template;
pub mod units;
mod url;
mod validate;

use std::path::Path;

pub use diff::changes;
pub use error::{ConfigError, ConfigErrors};
pub use explain::{explain, matcher as describe_matcher};
pub use model::*;
pub use shadow::shadowed_routes;
pub use url::{EtcdUrl, HttpUrl};
pub use validate::log_filter_error;

/// The built-in configuration (`crates/config/default.toml`): listener "proxy" on 127.0.0.1:8080
/// proxying everything to upstream group "origin" (127.0.0.1:8081), and listener "origin" on
/// 127.0.0.1:8081 serving the built-in benchmark origin, both in one process.
pub const DEFAULT_CONFIG: &str = include_str!("../default.toml");

/// The `source` name used for [`DEFAULT_CONFIG`] in messages.
pub const EMBEDDED_SOURCE: &str = "<embedded>";

/// Parses and validates `text`; `source` (a file path or `<embedded>`) names it in errors.
/// Returns the first error in file order; [`parse_all`] returns all of them.
pub fn parse(text: &str, source: &str) -> Result<Config, ConfigError> {
    parse_all(text, source).map_err(ConfigErrors::into_first)
}

/// Like [`parse`], but reports every validation error (syntax, unknown keys and type errors stop
/// at the first one).
pub fn parse_all(text: &str, source: &str) -> Result<Config, ConfigErrors> {
    let raw: raw::RawConfig =
        toml::from_str(text).map_err(|e| ConfigErrors::from(error::from_toml(source, text, &e)))?;
    validate::validate(raw, source, text)
}

/// Reads and parses a configuration file (its path, as given, names it in errors).
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    load_all(path).map_err(ConfigErrors::into_first)
}

/// Like [`load`], but reports every validation error.
pub fn load_all(path: &Path) -> Result<Config, ConfigErrors> {
    let source = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors::from(ConfigError::io(
            &source,
            format!("cannot read configuration: {e}"),
        ))
    })?;
    parse_all(&text, &source)
}
