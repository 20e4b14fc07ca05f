//! Per-worker load: the event-loop lag samples fed to each shedding listener's `Shedder` (the probe that takes them is in `server`), and the body of a shed request's 503.

use crate::resilience::shed::{Change, Shedder};
use crate::telemetry::stats::Stats;
use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Time between two lag samples while a listener sheds (100 timer wake-ups per second per worker).
pub const PROBE: Duration = Duration::from_millis(10);
/// How often a worker looks whether a reload turned shedding on, while no listener sheds.
pub(crate) const IDLE_CHECK: Duration = Duration::from_secs(1);

pub const SHED_BODY: &[u8] = b"503 Service Unavailable: overloaded, retry later\n";

/// One worker's shedding state, per listener (by slot) that has `shed` configured. Only this
/// worker's thread touches it.
#[derive(Debug, Default)]
pub struct WorkerLoad {
    shedders: RefCell<Vec<(u64, Shedder)>>,
}

impl WorkerLoad {
    /// Whether new requests on the listener accepting on `slot` are shed on this worker now.
    pub fn shedding(&self, slot: u64) -> bool {
        self.shedders
            .borrow()
            .iter()
            .any(|(s, sh)| *s == slot && sh.shedding())
    }

    /// Forget every listener's state (the worker stops probing).
    pub fn reset(&self, stats: &Stats) {
        self.observe(&[], Duration::ZERO, Instant::now(), stats);
    }

    /// Apply one lag sample to every listener of `listeners` (slot, settings) that sheds.
    pub(crate) fn observe(
        &self,
        listeners: &[(u64, portico_config::Shed)],
        lag: Duration,
        now: Instant,
        stats: &Stats,
    ) {
        let mut shedders = self.shedders.borrow_mut();
        // Listeners that no longer shed (removed, or `shed` turned off by a reload) stop.
        shedders.retain(|(slot, sh)| {
            let keep = listeners.iter().any(|(s, _)| s == slot);
            if !keep && sh.shedding() {
                stats.shedding.fetch_sub(1, Ordering::Relaxed);
            }
            keep
        });
        for &(slot, settings) in listeners {
            let i = match shedders.iter().position(|(s, _)| *s == slot) {
                Some(i) => i,
                None => {
                    shedders.push((slot, Shedder::new(settings)));
                    shedders.len() - 1
                }
            };
            let Some((_, sh)) = shedders.get_mut(i) else {
                continue;
            };
            sh.configure(settings);
            match sh.observe(lag, now) {
                Change::Started => {
                    stats.shedding.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        worker = std::thread::current().name().unwrap_or("?"),
                        lag_ms = lag.as_millis() as u64,
                        target_ms = settings.target.as_millis() as u64,
                        "worker saturated: shedding new requests (503 + Retry-After)"
                    );
                }
                Change::Stopped => {
                    stats.shedding.fetch_sub(1, Ordering::Relaxed);
                    tracing::info!(
                        worker = std::thread::current().name().unwrap_or("?"),
                        lag_ms = lag.as_millis() as u64,
                        "worker caught up: shedding stopped"
                    );
                }
                Change::None => {}
            }
        }
    }
}
