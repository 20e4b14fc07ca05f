//! What the binary's test modules share: its path, and reading the addresses it announces.

use std::io::BufRead;
use std::net::SocketAddr;

/// The `portico` binary this test build made.
pub const BIN: &str = env!("CARGO_BIN_EXE_portico");

/// Read `out` (the binary's standard output) until it has announced `n` addresses
/// (`... on http://ADDR/...` or `https://`), in order: listeners first, then the admin listener.
pub fn announced(out: &mut impl BufRead, n: usize) -> Vec<SocketAddr> {
    let mut addrs = Vec::new();
    while addrs.len() < n {
        let mut line = String::new();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "portico exited before listening"
        );
        if let Some(rest) = line.trim().split("://").nth(1) {
            let addr = rest.split('/').next().unwrap();
            addrs.push(addr.parse().unwrap());
        }
    }
    addrs
}
