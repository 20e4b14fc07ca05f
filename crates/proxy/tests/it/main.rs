//! The proxy's integration tests in one binary (one link instead of one per file): each module starts real servers on ephemeral ports in this process.

mod common;

mod access;
mod admin;
mod buffering;
mod cache;
mod compression;
mod cors;
mod dashboard;
mod discovery;
mod early_hints;
mod etcd_fleet;
mod fleet;
mod h2;
mod h2_interim;
mod h2_upstream;
mod h2_websocket;
mod h3;
mod health;
mod jwt;
mod mirror;
mod overload;
mod proxy;
mod proxy_protocol_up;
mod reload;
mod request_id;
mod resilience;
mod send_timeout;
mod split;
mod tls;
mod tls_upstream;
mod trace;
mod tunnel_log;
mod variables;
