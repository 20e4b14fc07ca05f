//! Unit tests for health, passive ejection, slow start, admin changes and reload carry-over.

// Tests take a real `now` to hand to the sans-io code.
#![allow(clippy::disallowed_methods)]

use super::*;
use portico_config::{HealthCheck, HealthCheckKind, PassiveCheck, Server};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A group from the balancer tests' builder, with a TCP health check and quick passive checks.
fn group_with(
    weights: &[u32],
    balance: Balance,
    edit: impl FnOnce(&mut UpstreamGroup),
) -> Arc<UpstreamGroup> {
    let mut g = Arc::unwrap_or_clone(crate::tests::group(weights, balance, 0));
    g.health_check = Some(HealthCheck {
        kind: HealthCheckKind::Tcp,
        interval: Duration::from_secs(1),
        timeout: ms(500),
        rise: 2,
        fall: 3,
    });
    g.passive = PassiveCheck {
        max_failures: 3,
        ejection: ms(100),
        max_ejection: ms(1000),
        max_ejected_percent: 50,
        slow_start: Duration::ZERO,
    };
    edit(&mut g);
    Arc::new(g)
}

fn picks_at(up: &Upstream, n: usize, now: Instant) -> Vec<usize> {
    let mut c = vec![0; up.group().servers.len()];
    for _ in 0..n {
        c[up.pick_at(None, None, now).unwrap().index()] += 1;
    }
    c
}

fn fail(up: &Upstream, server: usize, times: u32, now: Instant) {
    for _ in 0..times {
        up.report(server, Report::ConnectError, now);
    }
}

#[test]
fn servers_start_up_and_enabled() {
    let up = Upstream::new(group_with(&[1, 2], Balance::RoundRobin, |_| {}));
    let t0 = Instant::now();
    let st = up.status(t0);
    assert_eq!(st.len(), 2);
    assert_eq!(st[1].address, SocketAddr::from(([10, 0, 0, 2], 8080)));
    assert_eq!((st[1].weight, st[1].effective_weight), (2, 2));
    assert_eq!(
        (st[0].health, st[0].admin, st[0].ejected),
        (Health::Up, AdminState::Enabled, false)
    );
    assert_eq!(st[0].last_check, None);
    assert_eq!(picks_at(&up, 3, t0), [1, 2]);
    assert_eq!(up.status(t0)[1].requests, 2);
}

#[test]
fn rise_and_fall() {
    let up = Upstream::new(group_with(&[1, 1], Balance::RoundRobin, |_| {}));
    let t0 = Instant::now();
    up.probe_result(1, false, "connect: refused".into(), t0);
    up.probe_result(1, false, "connect: refused".into(), t0);
    assert_eq!(up.status(t0)[1].health, Health::Up, "two failures < fall 3");
    up.probe_result(1, true, "HTTP 200".into(), t0);
    up.probe_result(1, false, "x".into(), t0);
    up.probe_result(1, false, "x".into(), t0);
    assert_eq!(up.status(t0)[1].health, Health::Up, "a pass resets the run");
    up.probe_result(1, false, "HTTP 500".into(), t0);
    let st = &up.status(t0 + ms(7))[1];
    assert_eq!(
        (st.health, st.health_transitions, st.effective_weight),
        (Health::Down, 1, 0)
    );
    assert_eq!(st.last_check.as_deref(), Some("failed: HTTP 500 (7ms ago)"));
    assert_eq!(picks_at(&up, 10, t0), [10, 0], "a down server gets nothing");
    assert!(up.pick(None, None).is_some_and(|g| g.index() == 0));

    up.probe_result(1, true, "HTTP 200".into(), t0);
    up.probe_result(1, false, "x".into(), t0);
    up.probe_result(1, true, "HTTP 200".into(), t0);
    assert_eq!(
        up.status(t0)[1].health,
        Health::Down,
        "a failure resets the rise run"
    );
    up.probe_result(1, true, "HTTP 200".into(), t0);
    let st = &up.status(t0)[1];
    assert_eq!((st.health, st.health_transitions), (Health::Up, 2));
    assert_eq!(picks_at(&up, 10, t0), [5, 5]);

    // Every server down: unavailable, told apart from "all at the limit".
    for _ in 0..3 {
        up.probe_result(0, false, "x".into(), t0);
        up.probe_result(1, false, "x".into(), t0);
    }
    assert_eq!(
        up.pick_at(None, None, t0).unwrap_err(),
        PickError::Unavailable
    );
    assert!(up.pick(None, None).is_none());
    // Out of range is ignored.
    up.probe_result(9, true, "x".into(), t0);
    up.report(9, Report::Reset, t0);
}

#[test]
fn at_limit_is_not_unavailable() {
    let up = Upstream::new(group_with(&[1, 1], Balance::LeastConnections, |g| {
        g.max_connections_per_server = 1
    }));
    let t0 = Instant::now();
    let _a = up.pick_at(None, None, t0).unwrap();
    let _b = up.pick_at(None, None, t0).unwrap();
    assert_eq!(up.pick_at(None, None, t0).unwrap_err(), PickError::AtLimit);
    let empty = Upstream::new(group_with(&[], Balance::RoundRobin, |_| {}));
    assert_eq!(
        empty.pick_at(None, None, t0).unwrap_err(),
        PickError::Unavailable
    );
}

#[test]
fn ejection_timing_and_doubling() {
    let up = Upstream::new(group_with(&[1, 1], Balance::RoundRobin, |_| {}));
    let t0 = Instant::now();
    fail(&up, 1, 2, t0);
    assert_eq!(up.status(t0)[1].consecutive_failures, 2);
    up.report(1, Report::Response { status: 404 }, t0);
    assert_eq!(
        up.status(t0)[1].consecutive_failures,
        0,
        "a non-5xx answer resets the run"
    );
    fail(&up, 1, 2, t0);
    up.report(1, Report::Response { status: 503 }, t0);
    let st = &up.status(t0)[1];
    assert!(st.ejected, "3 failures in a row eject");
    assert_eq!((st.ejections, st.failures, st.effective_weight), (1, 4, 0));
    assert_eq!(st.responses, [0, 0, 0, 1, 1]);
    assert!(up.status(t0 + ms(99))[1].ejected);
    assert!(
        !up.status(t0 + ms(100))[1].ejected,
        "base ejection is 100ms"
    );
    assert_eq!(picks_at(&up, 4, t0 + ms(50)), [4, 0]);
    // Without a clock the ejection stays until a pick_at notices its end.
    assert_eq!(up.pick(None, None).unwrap().index(), 0);
    assert_eq!(up.pick(None, None).unwrap().index(), 0);
    assert_eq!(picks_at(&up, 4, t0 + ms(100)), [2, 2]);

    // Failing again soon after: each ejection doubles, up to max_ejection (1s).
    let mut now = t0 + ms(150);
    let mut end = t0 + ms(100);
    for expected in [200, 400, 800, 1000, 1000] {
        fail(&up, 1, 3, now);
        assert!(up.status(now + ms(expected - 1))[1].ejected, "{expected}");
        assert!(!up.status(now + ms(expected))[1].ejected, "{expected}");
        end = now + ms(expected);
        now = end + ms(10);
    }
    assert_eq!(up.status(now)[1].ejections, 6);
    // After max_ejection without an ejection, back to the base time.
    let later = end + ms(1000);
    fail(&up, 1, 3, later);
    assert!(up.status(later + ms(99))[1].ejected);
    assert!(!up.status(later + ms(100))[1].ejected);

    // Failures of requests already running while ejected do not extend the ejection.
    let t = later + ms(5000);
    fail(&up, 1, 3, t);
    fail(&up, 1, 3, t + ms(50));
    assert!(!up.status(t + ms(100))[1].ejected);
}

#[test]
fn passive_off_never_ejects() {
    let up = Upstream::new(group_with(&[1, 1], Balance::RoundRobin, |g| {
        g.passive.max_failures = 0
    }));
    let t0 = Instant::now();
    fail(&up, 0, 100, t0);
    let st = &up.status(t0)[0];
    assert!(!st.ejected);
    assert_eq!((st.failures, st.consecutive_failures), (100, 100));
}

#[test]
fn max_ejected_percent_caps_ejections() {
    let up = Upstream::new(group_with(&[1, 1, 1, 1], Balance::RoundRobin, |_| {}));
    let t0 = Instant::now();
    for s in 0..4 {
        fail(&up, s, 3, t0);
    }
    let ejected: Vec<bool> = up.status(t0).iter().map(|s| s.ejected).collect();
    assert_eq!(ejected, [true, true, false, false], "at most 50% of 4");
    // The third keeps counting and is ejected on its next failure once room is made.
    assert_eq!(up.status(t0)[2].consecutive_failures, 3);
    let t1 = t0 + ms(100);
    fail(&up, 2, 1, t1);
    assert!(up.status(t1)[2].ejected);

    // 100%: the whole group can go; the default 50% never ejects a lone server.
    let all = Upstream::new(group_with(&[1, 1], Balance::RoundRobin, |g| {
        g.passive.max_ejected_percent = 100
    }));
    fail(&all, 0, 3, t0);
    fail(&all, 1, 3, t0);
    assert_eq!(
        all.pick_at(None, None, t0).unwrap_err(),
        PickError::Unavailable
    );
    let lone = Upstream::new(group_with(&[1], Balance::RoundRobin, |_| {}));
    fail(&lone, 0, 30, t0);
    assert!(!lone.status(t0)[0].ejected);
    assert!(lone.pick_at(None, None, t0).is_ok());
}

#[test]
fn slow_start_ramps_linearly_after_recovery() {
    let up = Upstream::new(group_with(&[10, 10], Balance::RoundRobin, |g| {
        g.passive.slow_start = Duration::from_secs(10);
        if let Some(h) = g.health_check.as_mut() {
            h.rise = 1;
            h.fall = 1;
        }
    }));
    let t0 = Instant::now();
    assert_eq!(up.status(t0)[1].effective_weight, 10, "no ramp at start-up");
    up.probe_result(1, false, "x".into(), t0);
    up.probe_result(1, true, "x".into(), t0);
    let eff = |at: Duration| up.status(t0 + at)[1].effective_weight;
    assert_eq!(eff(Duration::ZERO), 1);
    assert_eq!(eff(Duration::from_secs(5)), 5);
    assert_eq!(eff(ms(9_999)), 10, "rounded up");
    assert_eq!(eff(Duration::from_secs(10)), 10);
    // 1s in: internal weight 1 + 999 * 0.1 = 100 against 1000.
    assert_eq!(
        picks_at(&up, 1100, t0 + Duration::from_secs(1)),
        [1000, 100]
    );
    // 5s in: 500 against 1000.
    assert_eq!(
        picks_at(&up, 1500, t0 + Duration::from_secs(5)),
        [1000, 500]
    );
    assert_eq!(picks_at(&up, 20, t0 + Duration::from_secs(10)), [10, 10]);

    // After an ejection the ramp starts at the ejection's end.
    let t1 = t0 + Duration::from_secs(20);
    fail(&up, 0, 3, t1);
    assert_eq!(up.status(t1 + ms(100))[0].effective_weight, 1);
    assert_eq!(
        up.status(t1 + ms(100) + Duration::from_secs(5))[0].effective_weight,
        5
    );
    assert_eq!(
        picks_at(&up, 1100, t1 + ms(100) + Duration::from_secs(1)),
        [100, 1000]
    );
}

#[test]
fn admin_state_and_weight_changes_apply_to_the_next_pick() {
    let up = Upstream::new(group_with(&[1, 1], Balance::RoundRobin, |g| {
        g.passive.slow_start = Duration::from_secs(10);
    }));
    let t0 = Instant::now();
    assert!(up.set_weight(0, 3));
    assert_eq!(up.weight(0), 3);
    assert_eq!(picks_at(&up, 40, t0), [30, 10]);
    assert!(!up.set_weight(0, 0), "weight 0 is refused");
    assert!(!up.set_weight(2, 1), "no such server");
    assert!(up.set_weight(1, u32::MAX));
    assert_eq!(up.weight(1), MAX_WEIGHT);
    assert!(up.set_weight(1, 1));
    up.clear_weight(1);
    assert_eq!(up.weight(1), 1, "the configured weight again");

    // When the operator's state changed, as the status tells it.
    assert_eq!(up.status(t0)[1].state_since, None);
    assert!(up.set_admin_at(1, AdminState::Draining, t0));
    let later = t0 + Duration::from_secs(5);
    assert_eq!(
        up.status(later)[1].state_since,
        Some(Duration::from_secs(5))
    );
    assert!(
        up.set_admin_at(1, AdminState::Draining, later),
        "no change: since stays"
    );
    assert_eq!(
        up.status(later)[1].state_since,
        Some(Duration::from_secs(5))
    );
    assert!(up.set_admin(1, AdminState::Enabled));

    assert!(up.set_admin(1, AdminState::Draining));
    let held = up.pick_at(None, None, t0).unwrap();
    assert_eq!(picks_at(&up, 8, t0), [8, 0]);
    assert_eq!(up.status(t0)[1].admin, AdminState::Draining);
    assert_eq!(up.status(t0)[1].effective_weight, 0);
    assert!(up.set_admin(1, AdminState::Enabled));
    assert_eq!(
        up.status(t0)[1].effective_weight,
        1,
        "no slow start after draining"
    );
    assert_eq!(picks_at(&up, 4, t0), [3, 1]);
    drop(held);

    assert!(up.set_admin(0, AdminState::Disabled));
    assert!(up.set_admin(1, AdminState::Disabled));
    assert_eq!(
        up.pick_at(None, None, t0).unwrap_err(),
        PickError::Unavailable
    );
    assert!(!up.set_admin(2, AdminState::Disabled));
    // Re-enabled after Disabled: slow start from the first pick that tells the time.
    assert!(up.set_admin(0, AdminState::Enabled));
    let t1 = t0 + Duration::from_secs(1);
    assert_eq!(picks_at(&up, 1, t1), [1, 0]);
    assert_eq!(
        up.status(t1 + Duration::from_secs(5))[0].effective_weight,
        2
    );
}

#[test]
fn hash_keys_of_a_down_server_move_and_come_back() {
    let up = Upstream::new(group_with(&[1, 1, 1, 1], Balance::HashClientIp, |g| {
        if let Some(h) = g.health_check.as_mut() {
            h.rise = 1;
            h.fall = 1;
        }
    }));
    let t0 = Instant::now();
    let owner = |k: u32| {
        up.pick_at(Some(&k.to_be_bytes()), None, t0)
            .unwrap()
            .index()
    };
    let before: Vec<usize> = (0..2000).map(owner).collect();
    up.probe_result(2, false, "x".into(), t0);
    let during: Vec<usize> = (0..2000).map(owner).collect();
    let mut moved = 0;
    for (b, d) in before.iter().zip(&during) {
        if *b == 2 {
            assert_ne!(*d, 2);
            moved += 1;
        } else {
            assert_eq!(b, d, "only the down server's keys move");
        }
    }
    assert!(moved > 300, "{moved}");
    up.probe_result(2, true, "x".into(), t0);
    let after: Vec<usize> = (0..2000).map(owner).collect();
    assert_eq!(before, after, "keys come back when it recovers");

    // A weight change rebuilds the ring: the server gains keys, others only lose some.
    assert!(up.set_weight(0, 3));
    let weighted: Vec<usize> = (0..2000).map(owner).collect();
    for (b, w) in before.iter().zip(&weighted) {
        assert!(b == w || *w == 0, "a key moved between two other servers");
    }
    let on_zero = weighted.iter().filter(|&&s| s == 0).count();
    assert!(on_zero > 900, "{on_zero}");
}

#[test]
fn new_carrying_keeps_state_by_address() {
    let first = group_with(&[1, 1, 1], Balance::RoundRobin, |g| {
        g.passive.slow_start = Duration::from_secs(10);
    });
    let old = Upstream::new(Arc::clone(&first));
    let t0 = Instant::now();
    for _ in 0..3 {
        old.probe_result(0, false, "x".into(), t0);
    }
    assert!(old.set_admin(1, AdminState::Draining));
    assert!(old.set_weight(1, 7));
    old.report(1, Report::Response { status: 200 }, t0);
    assert!(old.set_admin(1, AdminState::Enabled));
    let held = old.pick_at(None, None, t0).unwrap();
    let held_addr = held.address();

    // Reload: server 0 (10.0.0.1) removed, 10.0.0.2 and 10.0.0.3 kept (reordered), 10.0.0.9 added.
    let mut next = (*first).clone();
    next.servers = vec![
        next.servers[2].clone(),
        next.servers[1].clone(),
        Server {
            address: SocketAddr::from(([10, 0, 0, 9], 8080)),
            weight: 4,
        },
    ];
    let new = Upstream::new_carrying(Arc::new(next), &old);
    let st = new.status(t0);
    assert_eq!(st[1].address, SocketAddr::from(([10, 0, 0, 2], 8080)));
    assert_eq!(
        (st[1].weight, st[1].responses[1]),
        (7, 1),
        "override and counters carried"
    );
    assert_eq!(st[2].weight, 4);
    let held_new = st.iter().position(|s| s.address == held_addr).unwrap();
    assert_eq!(
        st[held_new].active, 1,
        "in-flight count shared with the old group"
    );
    drop(held);
    assert_eq!(new.status(t0)[held_new].active, 0);
    // The new server ramps from the first pick that tells the time.
    let t1 = t0 + Duration::from_secs(1);
    let _ = new.pick_at(None, None, t1);
    assert_eq!(
        new.status(t1 + Duration::from_secs(5))[2].effective_weight,
        2
    );
    assert_eq!(new.status(t1)[0].effective_weight, 1);

    // Health is carried while there is a checker, reset to Up without one.
    let down_old = Upstream::new(group_with(&[1], Balance::RoundRobin, |_| {}));
    for _ in 0..3 {
        down_old.probe_result(0, false, "x".into(), t0);
    }
    let same = Upstream::new_carrying(Arc::clone(down_old.group()), &down_old);
    assert_eq!(same.status(t0)[0].health, Health::Down);
    let unchecked = group_with(&[1], Balance::RoundRobin, |g| g.health_check = None);
    let up_again = Upstream::new_carrying(unchecked, &down_old);
    assert_eq!(up_again.status(t0)[0].health, Health::Up);
}
