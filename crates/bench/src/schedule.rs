//! Open-loop schedule maths: the intended send time of every request, and one request's timing.

use crate::config::Stop;
use std::time::Duration;

/// The intended send times of an open-loop run, as offsets from its start.
///
/// The run offers `rate` requests per second over `C` connections as one uniform stream of global
/// slots: slot `g` is due `g / rate` seconds after the start and belongs to connection `g % C`,
/// whose `i`-th request is therefore slot `i * C + k`. Each connection sends every `C / rate`
/// seconds, connections staggered by `1 / rate`. Slots due before the end of the warm-up are
/// warm-up; the measured slots follow, up to the duration or the request count.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// Nanoseconds between consecutive global slots (`1e9 / rate`).
    slot_ns: f64,
    connections: u64,
    /// First measured slot.
    first_measured: u64,
    /// One past the last slot.
    end: u64,
}

impl Schedule {
    /// The schedule for `rate` requests/s over `connections`, after `warmup`, until `stop`.
    pub fn new(rate: f64, connections: usize, warmup: Duration, stop: Stop) -> Schedule {
        let mut s = Schedule {
            slot_ns: 1e9 / rate,
            connections: (connections as u64).max(1),
            first_measured: 0,
            end: 0,
        };
        s.first_measured = s.first_slot_at_or_after(warmup);
        s.end = match stop {
            Stop::Duration(d) => s.first_slot_at_or_after(warmup.saturating_add(d)),
            Stop::Requests(n) => s.first_measured.saturating_add(n),
        };
        s
    }

    /// When slot `g` is due, from the start of the run.
    pub fn slot_time(&self, g: u64) -> Duration {
        let ns = (g as f64 * self.slot_ns).round();
        Duration::from_nanos(if ns >= u64::MAX as f64 {
            u64::MAX
        } else {
            ns as u64
        })
    }

    /// The global slot of connection `conn`'s `i`-th request.
    pub fn slot(&self, conn: usize, i: u64) -> u64 {
        i.saturating_mul(self.connections)
            .saturating_add(conn as u64)
    }

    /// The connection that sends slot `g`.
    pub fn connection_of(&self, g: u64) -> usize {
        (g % self.connections) as usize
    }

    /// When connection `conn` is due to send its `i`-th request.
    pub fn intended(&self, conn: usize, i: u64) -> Duration {
        self.slot_time(self.slot(conn, i))
    }

    /// The first slot due at or after `t`.
    pub fn first_slot_at_or_after(&self, t: Duration) -> u64 {
        let t_ns = t.as_nanos() as f64;
        let mut g = (t_ns / self.slot_ns).ceil().max(0.0) as u64;
        // Correct the float estimate against slot_time's own rounding.
        while g > 0 && self.slot_time(g - 1) >= t {
            g -= 1;
        }
        while self.slot_time(g) < t {
            g += 1;
        }
        g
    }

    /// Whether slot `g` is in the measured phase.
    pub fn is_measured(&self, g: u64) -> bool {
        (self.first_measured..self.end).contains(&g)
    }

    /// One past the last slot of the run.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// The first measured slot.
    pub fn first_measured(&self) -> u64 {
        self.first_measured
    }

    /// Measured slots over all connections.
    pub fn measured(&self) -> u64 {
        self.end.saturating_sub(self.first_measured)
    }

    /// Measured slots of connection `conn` at or after slot `from`.
    pub fn measured_of_from(&self, conn: usize, from: u64) -> u64 {
        let lo = from.max(self.first_measured);
        let k = conn as u64;
        // Slots g < x with g % C == k.
        let below = |x: u64| {
            if x > k {
                (x - k - 1) / self.connections + 1
            } else {
                0
            }
        };
        below(self.end).saturating_sub(below(lo))
    }

    /// Measured slots of connection `conn`.
    pub fn measured_of(&self, conn: usize) -> u64 {
        self.measured_of_from(conn, 0)
    }

    /// Time between two requests of one connection (`C / rate`).
    pub fn connection_period(&self) -> Duration {
        Duration::from_nanos((self.slot_ns * self.connections as f64).round() as u64)
    }
}

/// The thread that owns connection `conn` when `threads` threads share the connections.
pub fn thread_of(conn: usize, threads: usize) -> usize {
    conn % threads.max(1)
}

/// The timing of one request, as offsets from the start of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// When the request was due. In closed loop, the same as `sent`.
    pub intended: Duration,
    /// When its connection became free (the previous response completed, or the run started).
    pub free: Duration,
    /// When sending started (connecting first if the connection had to be opened).
    pub sent: Duration,
    /// When the response was complete.
    pub done: Duration,
}

impl Timing {
    /// The earliest the request could go out: when due, or later if its connection was busy.
    pub fn ready(&self) -> Duration {
        self.intended.max(self.free)
    }

    /// Response time as the user sees it: from when the request was due (coordinated omission
    /// corrected). A request that waited for a busy connection includes that wait.
    pub fn latency(&self) -> Duration {
        self.done.saturating_sub(self.intended)
    }

    /// From the actual send to the response (what a closed-loop tool reports).
    pub fn service(&self) -> Duration {
        self.done.saturating_sub(self.sent)
    }

    /// Actual send minus intended send: waiting for the connection plus the generator's delay.
    pub fn send_lag(&self) -> Duration {
        self.sent.saturating_sub(self.intended)
    }

    /// The generator's own delay: from when the request was ready to go to when it went.
    pub fn generator_lag(&self) -> Duration {
        self.sent.saturating_sub(self.ready())
    }

    /// Whether the request had to wait for its connection (the previous response was late).
    pub fn queued(&self) -> bool {
        self.free > self.intended
    }
}

/// Model of one open-loop connection: request `i` goes out at `intended[i]` or, if the connection
/// is still busy then, as soon as the previous response completes; it takes `service[i]`. This is
/// the rule the connection loop follows, without sockets or clock (used by tests).
pub fn simulate(intended: &[Duration], service: &[Duration]) -> Vec<Timing> {
    let mut free = Duration::ZERO;
    intended
        .iter()
        .zip(service)
        .map(|(&intended, &service)| {
            let sent = intended.max(free);
            let t = Timing {
                intended,
                free,
                sent,
                done: sent + service,
            };
            free = t.done;
            t
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn intended_times_are_uniform_and_staggered() {
        // 1000 req/s over 4 connections: each connection every 4 ms, offset by 1 ms.
        let s = Schedule::new(1000.0, 4, Duration::ZERO, Stop::Duration(ms(100)));
        assert_eq!(s.connection_period(), ms(4));
        assert_eq!(s.intended(0, 0), ms(0));
        assert_eq!(s.intended(1, 0), ms(1));
        assert_eq!(s.intended(3, 0), ms(3));
        assert_eq!(s.intended(0, 1), ms(4));
        assert_eq!(s.intended(2, 5), ms(22));
        // The union over connections is one slot per millisecond.
        let mut all: Vec<Duration> = (0..4)
            .flat_map(|k| (0..25).map(move |i| (k, i)))
            .map(|(k, i)| s.intended(k, i))
            .collect();
        all.sort();
        for (g, t) in all.iter().enumerate() {
            assert_eq!(*t, ms(g as u64));
        }
        assert_eq!(s.end(), 100);
        assert_eq!(s.measured(), 100);
        assert_eq!((0..4).map(|k| s.measured_of(k)).sum::<u64>(), 100);
    }

    #[test]
    fn fractional_periods_do_not_drift() {
        // 3 req/s: slots at 0, 333.333..., 666.666... ms; slot 3e6 exactly 1e6 s later.
        let s = Schedule::new(3.0, 1, Duration::ZERO, Stop::Requests(10));
        assert_eq!(s.slot_time(1), Duration::from_nanos(333_333_333));
        assert_eq!(s.slot_time(2), Duration::from_nanos(666_666_667));
        assert_eq!(s.slot_time(3_000_000), Duration::from_secs(1_000_000));
    }

    #[test]
    fn warmup_and_measured_window() {
        // 100 req/s, 3 connections, 0.5 s warm-up, 1 s measured: slots 50..150 are measured.
        let s = Schedule::new(100.0, 3, ms(500), Stop::Duration(ms(1000)));
        assert_eq!(s.first_measured(), 50);
        assert_eq!(s.end(), 150);
        assert!(!s.is_measured(49));
        assert!(s.is_measured(50));
        assert!(s.is_measured(149));
        assert!(!s.is_measured(150));
        assert_eq!(s.measured(), 100);
        // Slots 50..150 by connection: k=0: 51,54,..,147 (33); k=1: 52..148 (33); k=2: 50..149 (34).
        assert_eq!(
            (s.measured_of(0), s.measured_of(1), s.measured_of(2)),
            (33, 33, 34)
        );
        // Remaining measured slots of connection 2 from slot 140: 140, 143, 146, 149.
        assert_eq!(s.measured_of_from(2, 140), 4);
        assert_eq!(s.measured_of_from(2, 150), 0);
        // Count mode: the first 10 slots at or after the warm-up.
        let s = Schedule::new(100.0, 3, ms(500), Stop::Requests(10));
        assert_eq!((s.first_measured(), s.end(), s.measured()), (50, 60, 10));
        assert_eq!((0..3).map(|k| s.measured_of(k)).sum::<u64>(), 10);
    }

    #[test]
    fn first_slot_rounding() {
        let s = Schedule::new(7.0, 2, Duration::ZERO, Stop::Requests(1));
        for g in 0..1000u64 {
            let t = s.slot_time(g);
            assert_eq!(s.first_slot_at_or_after(t), g);
            assert_eq!(s.first_slot_at_or_after(t + Duration::from_nanos(1)), g + 1);
        }
    }

    #[test]
    fn threads_own_connections_round_robin() {
        assert_eq!(
            (0..6).map(|k| thread_of(k, 4)).collect::<Vec<_>>(),
            [0, 1, 2, 3, 0, 1]
        );
        assert_eq!(thread_of(5, 0), 0);
    }

    #[test]
    fn late_connection_queues_and_latency_counts_from_intended_time() {
        // One connection due every 100 ms; the 2nd request stalls for 450 ms. The 3rd..6th are due
        // while the connection is busy: they go out back to back once it frees up, and their
        // latency is measured from when they were due, not from when they went out.
        let intended: Vec<Duration> = (0..7).map(|i| ms(100 * i)).collect();
        let service = [1, 450, 1, 1, 1, 1, 1].map(ms);
        let t = simulate(&intended, &service);
        assert_eq!(t[1].done, ms(550));
        assert_eq!(
            t.iter().map(|t| t.sent).collect::<Vec<_>>(),
            [0, 100, 550, 551, 552, 553, 600].map(ms)
        );
        assert_eq!(
            t.iter().map(|t| t.latency()).collect::<Vec<_>>(),
            [1, 450, 351, 252, 153, 54, 1].map(ms)
        );
        // What a closed-loop tool would have reported: only the stalled request is slow.
        assert_eq!(
            t.iter().map(|t| t.service()).collect::<Vec<_>>(),
            service.to_vec()
        );
        assert_eq!(
            t.iter().map(|t| t.queued()).collect::<Vec<_>>(),
            [false, false, true, true, true, true, false]
        );
        // The wait for the connection is send lag, but not the generator's own lag.
        assert_eq!(t[3].send_lag(), ms(251));
        assert!(t.iter().all(|t| t.generator_lag().is_zero()));
    }

    #[test]
    fn generator_lag_is_delay_after_ready() {
        let t = Timing {
            intended: ms(10),
            free: ms(5),
            sent: ms(12),
            done: ms(15),
        };
        assert_eq!(
            (
                t.ready(),
                t.generator_lag(),
                t.send_lag(),
                t.latency(),
                t.service()
            ),
            (ms(10), ms(2), ms(2), ms(5), ms(3))
        );
    }
}
