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

    /// Take the most recently used live idle connection to this server, if any.
    pub fn take(&self, group: usize, server: usize) -> Option<UpConn> {
        let mut idle = self.idle.borrow_mut();
        let list = idle.get_mut(group)?.get_mut(server)?;
        let timeout = self.timeouts[group];
        let now = Instant::now();
        while let Some(entry) = list.pop() {
            if now.duration_since(entry.since) >= timeout || !is_idle_alive(&entry.conn) {
                continue;
            }
            return Some(entry.conn);
        }
        None
    }

    /// Return a connection whose last exchange completed cleanly.
    pub fn put(&self, group: usize, server: usize, conn: UpConn) {
        if !conn.rbuf.is_empty() {
            return;
        }
        let mut idle = self.idle.borrow_mut();
        let Some(list) = idle.get_mut(group).and_then(|g| g.get_mut(server)) else {
            return;
        };
        if self.caps[group] == 0 {
            return;
        }
        if list.len() >= self.caps[group] {
            // Drop the oldest, keep the warm one.
            list.remove(0);
        }
        list.push(Idle {
            conn,
            since: Instant::now(),
        });
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
