//! Per-server state shared by every worker: health, admin state, weight override, ejection, counters.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Active health of a server, as decided by the health checker (rise / fall). Servers start Up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Up,
    Down,
}

/// What the operator wants for a server. Draining and Disabled servers get no new requests;
/// requests already running on them finish (Draining is the "finish and go away" intent,
/// Disabled the "off" one; a Disabled server that is enabled again goes through slow start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminState {
    Enabled,
    Draining,
    Disabled,
}

/// What happened to one request sent to a server (passive checks and counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    /// The server answered with this status (a 5xx counts as a failure).
    Response { status: u16 },
    /// The connection could not be opened (refused, unreachable).
    ConnectError,
    /// Connect or response head timed out.
    Timeout,
    /// The connection was reset or closed before a response head.
    Reset,
}

/// A snapshot of one server, for the admin API and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerStatus {
    pub address: SocketAddr,
    /// The configured weight, or the one set by [`crate::Upstream::set_weight`].
    pub weight: u32,
    /// The weight picks use right now: `weight`, lower while slow start ramps (rounded up, so at
    /// least 1), 0 when the server cannot be picked (down, ejected, draining or disabled).
    pub effective_weight: u32,
    pub health: Health,
    pub admin: AdminState,
    /// Ejected by passive checks at the `now` given to `status`.
    pub ejected: bool,
    /// Requests running on the server.
    pub active: u32,
    /// Consecutive failed requests (passive checks; reset by any non-5xx response).
    pub consecutive_failures: u32,
    /// Requests sent (picks of this server).
    pub requests: u64,
    /// Responses by status class: 1xx, 2xx, 3xx, 4xx, 5xx.
    pub responses: [u64; 5],
    /// Connect errors, timeouts and resets before a response.
    pub failures: u64,
    /// Bytes of the server's responses written to clients.
    pub bytes: u64,
    /// Times passive checks ejected the server.
    pub ejections: u64,
    /// Up <-> Down changes made by active checks.
    pub health_transitions: u64,
    /// The last probe's result in words, with its age; None before the first probe.
    pub last_check: Option<String>,
    /// How long ago the state last changed (see `Timing::since`); None: not since it was
    /// added.
    pub state_since: Option<std::time::Duration>,
}

const ENABLED: u8 = 0;
const DRAINING: u8 = 1;
const DISABLED: u8 = 2;

/// The slow start ramp of a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ramp {
    /// Full weight.
    Off,
    /// Ramps from the first time a caller tells the time (added by a reload, or re-enabled).
    Pending,
    /// Ramps from this instant.
    From(Instant),
}

/// The parts that need instants; behind a mutex taken only off the fast path (a failure, a
/// probe, an ejected or ramping server, status).
#[derive(Debug)]
pub(crate) struct Timing {
    pub ejected_until: Option<Instant>,
    /// When the last ejection ended (repeat ejections within `max_ejection` of it double).
    pub last_ejection_end: Option<Instant>,
    /// Doublings of the last ejection.
    pub streak: u32,
    pub ramp: Ramp,
    pub probe_passes: u32,
    pub probe_failures: u32,
    pub last_check: Option<(String, Instant)>,
    /// When the server's state last changed (down or up, ejected or back, the operator's
    /// state); None: not since it was added.
    pub since: Option<Instant>,
}

/// One server's shared state. Shared by `Arc` between an `Upstream` and its successor after a
/// reload when the address stays, so counts of in-flight requests stay exact across reloads.
#[derive(Debug)]
pub(crate) struct ServerState {
    pub address: SocketAddr,
    pub active: AtomicU32,
    /// 0 = the configured weight.
    pub weight_override: AtomicU32,
    admin: AtomicU8,
    pub down: AtomicBool,
    /// Set while `Timing::ejected_until` is Some; cleared lazily by the first pick after it.
    pub ejected: AtomicBool,
    /// Set while `Timing::ramp` is not Off.
    pub ramping: AtomicBool,
    pub consecutive_failures: AtomicU32,
    pub requests: AtomicU64,
    pub responses: [AtomicU64; 5],
    pub failures: AtomicU64,
    /// Bytes of this server's responses written to clients (as the access log counts them).
    pub bytes: AtomicU64,
    pub ejections: AtomicU64,
    pub health_transitions: AtomicU64,
    timing: Mutex<Timing>,
}

impl ServerState {
    pub fn new(address: SocketAddr, ramp: Ramp) -> Self {
        ServerState {
            address,
            active: AtomicU32::new(0),
            weight_override: AtomicU32::new(0),
            admin: AtomicU8::new(ENABLED),
            down: AtomicBool::new(false),
            ejected: AtomicBool::new(false),
            ramping: AtomicBool::new(ramp != Ramp::Off),
            consecutive_failures: AtomicU32::new(0),
            requests: AtomicU64::new(0),
            responses: Default::default(),
            bytes: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            ejections: AtomicU64::new(0),
            health_transitions: AtomicU64::new(0),
            timing: Mutex::new(Timing {
                ejected_until: None,
                last_ejection_end: None,
                streak: 0,
                ramp,
                probe_passes: 0,
                probe_failures: 0,
                last_check: None,
                since: None,
            }),
        }
    }

    /// The timing state; a poisoned lock still holds a valid state.
    pub fn timing(&self) -> MutexGuard<'_, Timing> {
        self.timing.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn admin(&self) -> AdminState {
        match self.admin.load(Ordering::Acquire) {
            ENABLED => AdminState::Enabled,
            DRAINING => AdminState::Draining,
            _ => AdminState::Disabled,
        }
    }

    pub fn set_admin(&self, state: AdminState) -> AdminState {
        let v = match state {
            AdminState::Enabled => ENABLED,
            AdminState::Draining => DRAINING,
            AdminState::Disabled => DISABLED,
        };
        match self.admin.swap(v, Ordering::AcqRel) {
            ENABLED => AdminState::Enabled,
            DRAINING => AdminState::Draining,
            _ => AdminState::Disabled,
        }
    }

    pub fn health(&self) -> Health {
        if self.down.load(Ordering::Acquire) {
            Health::Down
        } else {
            Health::Up
        }
    }

    /// Ejected at `now` (read only: never clears the ejection).
    pub fn is_ejected(&self, now: Instant) -> bool {
        self.ejected.load(Ordering::Acquire)
            && self.timing().ejected_until.is_some_and(|until| now < until)
    }

    /// Whether an ejection is over at `now`; if so, clear it (and start slow start from its end
    /// when `slow_start` is set) and log it for `group`. Returns whether the server is still
    /// ejected.
    pub fn check_ejection(&self, now: Option<Instant>, slow_start: Duration, group: &str) -> bool {
        if !self.ejected.load(Ordering::Acquire) {
            return false;
        }
        let Some(now) = now else { return true };
        let mut t = self.timing();
        match t.ejected_until {
            Some(until) if now < until => true,
            until => {
                t.ejected_until = None;
                if let Some(end) = until {
                    t.last_ejection_end = Some(end);
                    if !slow_start.is_zero() {
                        t.ramp = Ramp::From(end);
                        self.ramping.store(true, Ordering::Release);
                    }
                }
                self.ejected.store(false, Ordering::Release);
                t.since = Some(until.unwrap_or(now));
                drop(t);
                tracing::info!(group, server = %self.address, "passive ejection over: the server takes requests again");
                false
            }
        }
    }

    /// Start a slow start ramp at `at` (None: at the first time a caller tells).
    pub fn start_ramp(&self, at: Option<Instant>) {
        let mut t = self.timing();
        t.ramp = at.map_or(Ramp::Pending, Ramp::From);
        self.ramping.store(true, Ordering::Release);
    }

    /// Clear any ejection (passive checks turned off by a reload).
    pub fn clear_ejection(&self) {
        let mut t = self.timing();
        t.ejected_until = None;
        self.ejected.store(false, Ordering::Release);
        self.consecutive_failures.store(0, Ordering::Relaxed);
    }

    /// Mark up and forget probe streaks (active checks turned off by a reload).
    pub fn clear_health(&self) {
        let mut t = self.timing();
        t.probe_passes = 0;
        t.probe_failures = 0;
        self.down.store(false, Ordering::Release);
    }
}
