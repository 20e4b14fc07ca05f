//! The bench crate's integration tests in one binary (one link instead of one per file), a module per concern.

mod bench;
mod h2;
mod h3;
mod https;
