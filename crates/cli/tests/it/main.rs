//! The cli crate's integration tests in one binary (one link instead of one per file), a module per concern.

mod common;

mod cli;
mod compare;
mod etcd;
mod install;
mod logging;
mod upgrade;
