//! etcd: its client, and the follower of the configuration key.

pub mod client;
mod follow;

pub use client::{fleet_json, Document, EtcdKey, Fleet, Member};
pub use follow::{cache_source, default_cache, follow, write_cache};
