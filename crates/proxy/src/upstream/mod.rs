//! The servers' side below the flow: connections and their pools (plain, TLS, multiplexed HTTP/2), the group queue for a server slot, active health checks.

pub mod h2_pool;
pub mod health;
pub mod health_h2;
pub mod pool;
pub mod queue;
pub mod tls;
