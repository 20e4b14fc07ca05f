//! The config crate's integration tests in one binary (one link instead of one per file), a module per concern.

mod access;
mod acme;
mod cache;
mod compression;
mod discovery;
mod docs;
mod errors;
mod fleet;
mod health;
mod overload;
mod parse;
mod resilience;
mod send_timeout;
mod templates;
