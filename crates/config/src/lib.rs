//! Configuration: TOML text -> raw serde model -> validated, typed `Config` with file:line:col errors.

pub mod model;

pub use model::*;
