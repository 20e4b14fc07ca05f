//! Per-worker idle keep-alive pools of upstream connections, one list per server address and transport.

use crate::error::ProxyError;
use crate::upstream::tls::GroupTls;
use bytes::BytesMut;
use rustc_hash::FxHashMap;
use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::time::timeout;

pub use crate::upstream::tls::UpStream;

/// What a pooled connection can be reused for: the server address and the transport (0 = plain
/// TCP, else [`crate::upstream::tls::GroupTls::pool_id`] of the TLS settings it was made with).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PoolKey {
    pub addr: SocketAddr,
    pub tls: u64,
    /// The PROXY protocol version the connection started with (0: none). Such connections are
    /// never pooled (each names one client), and others are never taken for such a group.
    pub proxy: u8,
}

impl PoolKey {
    /// Plain TCP to `addr`.
    pub fn plain(addr: SocketAddr) -> Self {
        PoolKey {
            addr,
            tls: 0,
            proxy: 0,
        }
    }
}

/// An upstream connection and its read buffer.
pub struct UpConn {
    pub stream: UpStream,
    pub rbuf: BytesMut,
}

/// An upstream connection's read buffer.
const UP_RBUF: usize = 16 * 1024;

/// How long a pooled connection keeps its read buffer while it waits.
const IDLE_GRACE: Duration = Duration::from_millis(500);

impl UpConn {
    pub fn new(stream: UpStream) -> Self {
        UpConn {
            stream,
            rbuf: BytesMut::with_capacity(UP_RBUF),
        }
    }
}

struct Idle {
    conn: UpConn,
    since: Instant,
    timeout: Duration,
}

impl Idle {
    fn expired(&self, now: Instant) -> bool {
        now.duration_since(self.since) >= self.timeout
    }
}

/// Idle connections of one worker, by server address and transport (most recently used last).
///
/// Keyed by address rather than by group and server index so that a configuration reload,
/// which renumbers groups and servers, neither misfiles a connection returned by a request that
/// started under the old configuration nor throws away warm connections to servers that stay.
pub struct Pool {
    idle: RefCell<FxHashMap<PoolKey, Vec<Idle>>>,
    /// Idle connections in this pool (for the process-wide gauge).
    len: Cell<i64>,
    /// Idle connections over all workers.
    gauge: Arc<AtomicI64>,
}

impl Pool {
    /// `gauge` counts idle connections over every worker's pool.
    pub fn new(gauge: Arc<AtomicI64>) -> Self {
        Pool {
            idle: RefCell::new(FxHashMap::default()),
            len: Cell::new(0),
            gauge,
        }
    }

    fn adjust(&self, by: i64) {
        if by != 0 {
            self.len.set(self.len.get() + by);
            self.gauge.fetch_add(by, Ordering::Relaxed);
        }
    }

    /// Take the most recently used live idle connection to this server, if any. Connections past
    /// the idle timeout are purged by `put` and the sweeper, so this reads no clock.
    pub fn take(&self, key: PoolKey) -> Option<UpConn> {
        let mut idle = self.idle.borrow_mut();
        let list = idle.get_mut(&key)?;
        let before = list.len();
        let mut found = None;
        while let Some(mut entry) = list.pop() {
            if entry.conn.stream.is_idle_alive() {
                if entry.conn.rbuf.capacity() == 0 {
                    // Its buffer was given back while it waited (see `purge_expired`).
                    entry.conn.rbuf.reserve(UP_RBUF);
                }
                found = Some(entry.conn);
                break;
            }
        }
        let removed = (before - list.len()) as i64;
        drop(idle);
        self.adjust(-removed);
        found
    }

    /// Return a connection whose last exchange completed cleanly. Keeps at most `cap` idle
    /// connections to this server (dropping the oldest) and drops those idle longer than their
    /// timeout.
    pub fn put(&self, key: PoolKey, conn: UpConn, cap: usize, timeout: Duration) {
        // A connection that started with a PROXY header names one client: it is not reused.
        if !conn.rbuf.is_empty() || cap == 0 || key.proxy != 0 {
            return;
        }
        let now = Instant::now();
        let mut idle = self.idle.borrow_mut();
        let list = idle.entry(key).or_default();
        let before = list.len();
        let expired = list.iter().take_while(|e| e.expired(now)).count();
        let over = (list.len() + 1).saturating_sub(cap);
        list.drain(..expired.max(over).min(list.len()));
        list.push(Idle {
            conn,
            since: now,
            timeout,
        });
        let delta = list.len() as i64 - before as i64;
        drop(idle);
        self.adjust(delta);
    }

    /// Close connections idle longer than their timeout (called periodically, so idle
    /// connections are closed even when no traffic comes to `put`).
    pub fn purge_expired(&self) {
        let now = Instant::now();
        let mut removed = 0;
        self.idle.borrow_mut().retain(|_, list| {
            let before = list.len();
            list.retain(|e| !e.expired(now));
            // A connection that waited past the grace gives its read buffer back (a busy
            // pool's connections are taken again sooner and keep theirs).
            for e in list.iter_mut() {
                if e.conn.rbuf.capacity() > 0 && now.duration_since(e.since) >= IDLE_GRACE {
                    e.conn.rbuf = BytesMut::new();
                }
            }
            removed += before - list.len();
            !list.is_empty()
        });
        self.adjust(-(removed as i64));
    }

    /// Close every idle connection to `addr`, plain or TLS (a server disabled or removed).
    pub fn close(&self, addr: SocketAddr) {
        let mut n = 0;
        self.idle.borrow_mut().retain(|k, l| {
            if k.addr == addr {
                n += l.len();
            }
            k.addr != addr
        });
        self.adjust(-(n as i64));
    }

    /// Close every idle connection (shutdown).
    pub fn clear(&self) {
        let n: usize = self.idle.borrow_mut().drain().map(|(_, l)| l.len()).sum();
        self.adjust(-(n as i64));
    }

    /// Idle connections in this worker's pool.
    pub fn len(&self) -> usize {
        self.len.get() as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The PROXY header of a connection Portico makes on its own (a health check, a cache refresh,
/// a mirrored copy, a forward auth request) to a group that sends one: `LOCAL` (v2) or
/// `UNKNOWN` (v1), naming no client.
pub(crate) fn local_header(group: &portico_config::UpstreamGroup) -> Option<Vec<u8>> {
    let v = group.proxy_protocol?;
    Some(portico_http1::proxy_protocol::encode(
        v,
        &portico_http1::proxy_protocol::Header::Local,
    ))
}

/// Connect to `addr`, send `proxy` (a PROXY header) first when given, and for a TLS group
/// finish the handshake, all under `t`; also says how long that took.
pub(crate) async fn connect(
    addr: SocketAddr,
    t: Duration,
    tls: Option<&GroupTls>,
    proxy: Option<&[u8]>,
) -> Result<(UpConn, Duration), ProxyError> {
    let begun = Instant::now();
    let open = async {
        let mut s = TcpStream::connect(addr)
            .await
            .map_err(ProxyError::ConnectFailed)?;
        let _ = s.set_nodelay(true);
        if let Some(header) = proxy {
            use tokio::io::AsyncWriteExt;
            s.write_all(header)
                .await
                .map_err(ProxyError::ConnectFailed)?;
        }
        Ok::<_, ProxyError>(s)
    };
    let Some(tls) = tls else {
        return match timeout(t, open).await {
            Err(_) => Err(ProxyError::ConnectTimeout),
            Ok(Err(e)) => Err(e),
            Ok(Ok(s)) => Ok((UpConn::new(UpStream::Plain(s)), begun.elapsed())),
        };
    };
    let connected = timeout(t, async {
        let s = open.await?;
        tls.handshake(addr, s).await
    })
    .await;
    match connected {
        Err(_) => Err(ProxyError::ConnectTimeout),
        Ok(r) => r.map(|u| (UpConn::new(u), begun.elapsed())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn connections_are_pooled_apart_by_transport() {
        block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let connect = || async {
                let s = tokio::net::TcpStream::connect(addr).await.unwrap();
                let peer = listener.accept().await.unwrap();
                (UpConn::new(UpStream::Plain(s)), peer)
            };
            let pool = Pool::new(Arc::new(AtomicI64::new(0)));
            let plain = PoolKey::plain(addr);
            let tls = PoolKey {
                tls: 7,
                ..PoolKey::plain(addr)
            };
            let (a, _pa) = connect().await;
            pool.put(plain, a, 4, Duration::from_secs(60));
            // A plain connection is never handed out for TLS to the same address.
            assert!(pool.take(tls).is_none());
            assert!(pool.take(plain).is_some());
            let (b, _pb) = connect().await;
            let (c, _pc) = connect().await;
            pool.put(plain, b, 4, Duration::from_secs(60));
            pool.put(tls, c, 4, Duration::from_secs(60));
            assert_eq!(pool.len(), 2);
            // Closing a server closes both kinds.
            pool.close(addr);
            assert!(pool.is_empty());
        });
    }

    #[test]
    fn a_connection_waiting_past_the_grace_gives_its_buffer_back_until_taken() {
        block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let _peer = listener.accept().await.unwrap();
            let pool = Pool::new(Arc::new(AtomicI64::new(0)));
            let key = PoolKey::plain(addr);
            pool.put(
                key,
                UpConn::new(UpStream::Plain(s)),
                4,
                Duration::from_secs(60),
            );
            // Within the grace the sweep keeps the buffer.
            pool.purge_expired();
            let kept = |pool: &Pool| pool.idle.borrow()[&key][0].conn.rbuf.capacity();
            assert!(kept(&pool) >= UP_RBUF);
            // Past it (the entry made older rather than waited for), the buffer goes.
            pool.idle.borrow_mut().get_mut(&key).unwrap()[0].since -= IDLE_GRACE;
            pool.purge_expired();
            assert_eq!(kept(&pool), 0);
            assert_eq!(pool.len(), 1);
            let back = pool.take(key).unwrap();
            assert!(back.rbuf.capacity() >= UP_RBUF);
        });
    }
}
