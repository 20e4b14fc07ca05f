//! The state of one HTTP/2 or HTTP/3 connection its streams share: the worker, the peer, the current configuration, stream counts, the reset and PING ACK budgets, and who a stream's request is from.

use crate::state::{ListenerState, Snapshot, Worker};
use portico_config::Http2Settings;
use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// The configuration a stream runs on: its listener's state in a snapshot. Streams share it by
/// `Rc` (a thread-local count), not by cloning the `Arc`s all workers share.
pub(crate) struct Current {
    pub ls: Arc<ListenerState>,
    pub shared: Snapshot,
}

/// State of one HTTP/2 connection shared with its stream tasks (all on this worker's thread).
pub(crate) struct Link {
    pub worker: Rc<Worker>,
    pub peer: SocketAddr,
    /// The address the client connected to.
    pub local: Option<SocketAddr>,
    pub client_ip: String,
    pub tls: bool,
    /// The TLS version and the server name the client sent, for the access log.
    pub tls_info: Option<(&'static str, Option<Box<str>>)>,
    pub client_cert: Option<Box<portico_tls::ClientCert>>,
    pub(crate) slot: u64,
    pub(crate) current: RefCell<Rc<Current>>,
    pub(crate) settings: Http2Settings,
    /// Streams whose task is running.
    pub(crate) active: Cell<usize>,
    /// When the last stream ended (or the connection began).
    pub(crate) idle_since: Cell<Instant>,
    /// Wakes the connection loop when `active` drops to zero.
    pub(crate) idle: Notify,
    /// Client resets in the current `reset_window`.
    pub(crate) resets: Windowed,
    /// Signalled once resets exceed the limit.
    pub(crate) calm: Notify,
    /// PING ACKs from the client in the current `reset_window`.
    pub(crate) ping_acks: Windowed,
}

/// Events of one kind counted per window: the count starts again once `window` has passed since
/// the window began.
pub(crate) struct Windowed(Cell<(Instant, u32)>);

impl Windowed {
    pub(crate) fn new() -> Windowed {
        Windowed(Cell::new((Instant::now(), 0)))
    }

    /// Add `n` events now; the count in the current window.
    fn add(&self, n: u32, window: Duration) -> u32 {
        let now = Instant::now();
        let (start, seen) = self.0.get();
        let (start, seen) = if now.duration_since(start) > window {
            (now, n)
        } else {
            (start, seen.saturating_add(n))
        };
        self.0.set((start, seen));
        seen
    }
}

/// PING ACKs a client may send per `reset_window` without being asked. Portico's server side
/// sends one PING per connection (with its graceful GOAWAY), so a client acknowledges at most
/// that one; past this, the ACKs are a flood (each costs the `h2` crate work and, before it was
/// silenced, a log line) and the connection ends with GOAWAY ENHANCE_YOUR_CALM.
pub const MAX_UNSOLICITED_PING_ACKS: u32 = 10;

impl Link {
    /// A new connection's state from `peer` on `ctx`'s listener, with no stream yet; the
    /// connection's own facts (local address, TLS, client certificate) are set by the caller.
    pub(crate) fn new(ctx: &crate::conn::Ctx, peer: SocketAddr, settings: Http2Settings) -> Link {
        Link {
            worker: ctx.worker.clone(),
            peer,
            local: None,
            client_ip: crate::conn::ip_text(peer.ip()),
            tls: false,
            tls_info: None,
            client_cert: None,
            slot: ctx.ls.slot,
            current: RefCell::new(Rc::new(Current {
                ls: ctx.ls.clone(),
                shared: ctx.shared.clone(),
            })),
            settings,
            active: Cell::new(0),
            idle_since: Cell::new(Instant::now()),
            idle: Notify::new(),
            resets: Windowed::new(),
            calm: Notify::new(),
            ping_acks: Windowed::new(),
        }
    }

    /// What the flow reads of the connection and a stream's configuration.
    pub(crate) fn env<'a>(
        &'a self,
        shared: &'a crate::state::Shared,
        ls: &'a ListenerState,
    ) -> super::Env<'a> {
        super::Env {
            shared,
            worker: &self.worker,
            ls,
            peer: self.peer,
        }
    }

    /// Who sent a stream's request: the connection's peer, or `client` (behind a trusted
    /// proxy, with its text).
    pub(crate) fn who<'s>(
        &'s self,
        client: &'s Option<(std::net::IpAddr, Box<str>)>,
    ) -> super::Who<'s> {
        super::Who {
            ip: client.as_ref().map_or(&self.client_ip, |c| &c.1),
            peer_ip: &self.client_ip,
            forwarded: client.as_ref().map(|c| c.0),
            tls: self.tls,
            cert: self.client_cert.as_deref(),
        }
    }

    /// The connection's client and the address it connected to.
    pub(crate) fn addresses(&self) -> Option<(SocketAddr, SocketAddr)> {
        Some((self.peer, self.local?))
    }

    /// The newest snapshot and this listener's state in it (a listener a reload removed keeps
    /// its last state until the connection ends).
    pub fn current(&self) -> Rc<Current> {
        let mut cur = self.current.borrow_mut();
        if self.worker.generation() != cur.shared.generation {
            let newest = self.worker.snapshot();
            if let Some(ls) = newest.listener(self.slot) {
                *cur = Rc::new(Current {
                    ls: ls.clone(),
                    shared: newest,
                });
            }
        }
        cur.clone()
    }

    pub(crate) fn stream_started(&self) {
        self.active.set(self.active.get() + 1);
    }

    pub(crate) fn stream_ended(&self) {
        self.active.set(self.active.get().saturating_sub(1));
        if self.active.get() == 0 {
            self.idle_since.set(Instant::now());
            self.idle.notify_one();
        }
    }

    /// Count `n` PING ACKs from the client; true once they exceed
    /// [`MAX_UNSOLICITED_PING_ACKS`] within a `reset_window`.
    pub(crate) fn ping_acks(&self, n: u32) -> bool {
        n > 0 && self.ping_acks.add(n, self.settings.reset_window) > MAX_UNSOLICITED_PING_ACKS
    }

    /// Count a stream reset by the client; past the limit the connection gets GOAWAY
    /// ENHANCE_YOUR_CALM (rapid reset, CVE-2023-44487).
    pub fn client_reset(&self) {
        let n = self.resets.add(1, self.settings.reset_window);
        if n == self.settings.max_resets.saturating_add(1) {
            self.calm.notify_one();
        }
    }
}
