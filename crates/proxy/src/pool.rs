//! Per-worker idle keep-alive pools of upstream connections, one list per server.

use bytes::BytesMut;
use std::cell::RefCell;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

/// An upstream connection and its read buffer.
pub struct UpConn {
    pub stream: TcpStream,
    pub rbuf: BytesMut,
}

impl UpConn {
    pub fn new(stream: TcpStream) -> Self {
        UpConn {
            stream,
            rbuf: BytesMut::with_capacity(16 * 1024),
        }
    }
}

struct Idle {
    conn: UpConn,
    since: Instant,
}

/// Idle connections of one worker: `[group][server]` -> most recently used last.
pub struct Pool {
    idle: RefCell<Vec<Vec<Vec<Idle>>>>,
    caps: Vec<usize>,
    timeouts: Vec<Duration>,
}

impl Pool {
    /// `groups[i]` = (server count, idle cap per server, idle timeout) for upstream group `i`.
    pub fn new(groups: &[(usize, usize, Duration)]) -> Self {
        Pool {
            idle: RefCell::new(
                groups
                    .iter()
                    .map(|&(n, _, _)| (0..n).map(|_| Vec::new()).collect())
                    .collect(),
            ),
            caps: groups.iter().map(|&(_, cap, _)| cap).collect(),
            timeouts: groups.iter().map(|&(_, _, t)| t).collect(),
        }
    }

    /// Take the most recently used live idle connection to this server, if any. Connections past
    /// the idle timeout are purged by `put`, so this reads no clock.
    pub fn take(&self, group: usize, server: usize) -> Option<UpConn> {
        let mut idle = self.idle.borrow_mut();
        let list = idle.get_mut(group)?.get_mut(server)?;
        while let Some(entry) = list.pop() {
            if is_idle_alive(&entry.conn) {
                return Some(entry.conn);
            }
        }
        None
    }

    /// Return a connection whose last exchange completed cleanly. Drops the oldest connections
    /// beyond the per-server cap and those idle longer than the group's idle timeout.
    pub fn put(&self, group: usize, server: usize, conn: UpConn) {
        if !conn.rbuf.is_empty() || self.caps.get(group).is_none_or(|&c| c == 0) {
            return;
        }
        let mut idle = self.idle.borrow_mut();
        let Some(list) = idle.get_mut(group).and_then(|g| g.get_mut(server)) else {
            return;
        };
        let now = Instant::now();
        let timeout = self.timeouts[group];
        let expired = list
            .iter()
            .take_while(|e| now.duration_since(e.since) >= timeout)
            .count();
        let over = (list.len() + 1).saturating_sub(self.caps[group]);
        list.drain(..expired.max(over));
        list.push(Idle { conn, since: now });
    }

    /// Close connections idle longer than their group's idle timeout (called periodically, so
    /// idle connections are closed even when no traffic comes to `put`).
    pub fn purge_expired(&self) {
        let now = Instant::now();
        for (g, servers) in self.idle.borrow_mut().iter_mut().enumerate() {
            let timeout = self.timeouts[g];
            for list in servers.iter_mut() {
                let expired = list
                    .iter()
                    .take_while(|e| now.duration_since(e.since) >= timeout)
                    .count();
                list.drain(..expired);
            }
        }
    }

    /// Close every idle connection (shutdown).
    pub fn clear(&self) {
        for g in self.idle.borrow_mut().iter_mut() {
            for s in g.iter_mut() {
                s.clear();
            }
        }
    }
}

/// An idle connection must have nothing to read: data means a protocol error, EOF means closed.
/// `try_read` answers from tokio's cached readiness without a syscall when nothing was signalled.
fn is_idle_alive(conn: &UpConn) -> bool {
    let mut probe = [0u8; 1];
    matches!(conn.stream.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}
