//! Helpers every test module uses: start a proxy from TOML, a port nobody listens on, waiting for a condition.

use portico_proxy::{start, Running};
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

/// How long a test waits for anything before it fails.
pub const T: Duration = Duration::from_secs(10);

/// A proxy running `toml` on `workers` worker threads (a config error fails the test, with the
/// text).
pub fn start_toml(toml: &str, workers: usize) -> Running {
    let cfg =
        portico_config::parse(toml, "test.toml").unwrap_or_else(|e| panic!("config: {e}\n{toml}"));
    start(cfg, workers).expect("start proxy")
}

/// An address on which nothing listens (bound, then closed).
pub fn closed_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    drop(l);
    a
}

/// Poll until `f` holds, failing the test after [`T`].
pub async fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + T;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
