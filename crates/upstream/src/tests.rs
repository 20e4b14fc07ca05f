//! Unit tests for the balancer: algorithms in isolation and the shared `Upstream` under threads.

// Tests take a real `now` to hand to the sans-io code.
#![allow(clippy::disallowed_methods)]

use super::*;
use portico_config::{PassiveCheck, Server};
use select::{least_connections, two_random_choices};
use std::time::Duration;

pub(crate) fn group(weights: &[u32], balance: Balance, limit: u32) -> Arc<UpstreamGroup> {
    Arc::new(UpstreamGroup {
        name: "g".into(),
        servers: weights
            .iter()
            .enumerate()
            .map(|(i, &weight)| Server {
                address: SocketAddr::from(([10, 0, 0, i as u8 + 1], 8080)),
                weight,
            })
            .collect(),
        balance,
        keepalive: 64,
        max_connections_per_server: limit,
        connect_timeout: Duration::from_secs(1),
        response_header_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(1),
        health_check: None,
        passive: PassiveCheck::DEFAULT,
        fallback: None,
        queue: 0,
        queue_timeout: Duration::from_secs(1),
        sticky_cookie: None,
        tls: None,
        protocol: Default::default(),
        discovery: None,
        proxy_protocol: None,
    })
}

fn counts(picks: impl IntoIterator<Item = usize>, n: usize) -> Vec<usize> {
    let mut c = vec![0; n];
    for p in picks {
        c[p] += 1;
    }
    c
}

// ---- smooth weighted round robin ----

#[test]
fn swrr_nginx_sequence() {
    let mut s = Swrr::new(3);
    let seq: String = (0..7)
        .map(|_| (b'a' + s.next(&[5, 1, 1], |_| true).unwrap() as u8) as char)
        .collect();
    assert_eq!(seq, "aabacaa");
    // The cycle repeats.
    let seq: String = (0..7)
        .map(|_| (b'a' + s.next(&[5, 1, 1], |_| true).unwrap() as u8) as char)
        .collect();
    assert_eq!(seq, "aabacaa");
}

#[test]
fn swrr_exact_proportions() {
    let w = [3, 2, 7, 1];
    let mut s = Swrr::new(w.len());
    let rounds = 1000;
    let total: u32 = w.iter().sum();
    let picks = (0..total * rounds).map(|_| s.next(&w, |_| true).unwrap());
    assert_eq!(
        counts(picks, 4),
        w.iter().map(|&x| (x * rounds) as usize).collect::<Vec<_>>()
    );
}

#[test]
fn swrr_skips_ineligible_and_handles_none() {
    let mut s = Swrr::new(3);
    for _ in 0..10 {
        assert_eq!(s.next(&[1, 1, 1], |i| i == 2), Some(2));
    }
    assert_eq!(s.next(&[1, 1, 1], |_| false), None);
    assert_eq!(Swrr::new(0).next(&[], |_| true), None);
    // Plain round robin with equal weights.
    let mut s = Swrr::new(3);
    let picks: Vec<_> = (0..6)
        .map(|_| s.next(&[1, 1, 1], |_| true).unwrap())
        .collect();
    assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
}

#[test]
fn upstream_round_robin() {
    let up = Upstream::new(group(&[5, 1, 1], Balance::RoundRobin, 0));
    let seq: String = (0..7)
        .map(|_| (b'a' + up.pick(None, None).unwrap().index() as u8) as char)
        .collect();
    assert_eq!(seq, "aabacaa");
}

// ---- least connections ----

#[test]
fn least_conn_picks_idle_server() {
    let loads = [3u32, 0, 2];
    let mut tb = Swrr::new(3);
    assert_eq!(
        least_connections(&[1, 1, 1], |i| loads[i], |_| true, &mut tb),
        Some(1)
    );
    assert_eq!(
        least_connections(&[1, 1, 1], |i| loads[i], |i| i != 1, &mut tb),
        Some(2)
    );
    assert_eq!(
        least_connections(&[1, 1, 1], |i| loads[i], |_| false, &mut tb),
        None
    );
}

#[test]
fn least_conn_respects_weights() {
    // 4 active on a weight-4 server is less loaded (1 per weight) than 2 on a weight-1 server.
    let loads = [4u32, 2];
    let mut tb = Swrr::new(2);
    assert_eq!(
        least_connections(&[4, 1], |i| loads[i], |_| true, &mut tb),
        Some(0)
    );
    // Idle group: ties broken by weighted round robin, 3:1.
    let mut tb = Swrr::new(2);
    let picks = (0..400).map(|_| least_connections(&[3, 1], |_| 0, |_| true, &mut tb).unwrap());
    assert_eq!(counts(picks, 2), [300, 100]);
}

#[test]
fn least_conn_ties_spread() {
    let mut tb = Swrr::new(4);
    let loads = [1u32, 0, 0, 0];
    let picks: Vec<_> = (0..6)
        .map(|_| least_connections(&[1, 1, 1, 1], |i| loads[i], |_| true, &mut tb).unwrap())
        .collect();
    assert_eq!(picks, [1, 2, 3, 1, 2, 3]);
}

#[test]
fn upstream_least_conn_holds_and_balances() {
    let up = Upstream::new(group(&[1, 1, 1], Balance::LeastConnections, 0));
    let held: Vec<_> = (0..9).map(|_| up.pick(None, None).unwrap()).collect();
    assert_eq!((0..3).map(|i| up.active(i)).collect::<Vec<_>>(), [3, 3, 3]);
    let (on_one, _kept): (Vec<_>, Vec<_>) = held.into_iter().partition(|g| g.index() == 1);
    drop(on_one);
    assert_eq!((0..3).map(|i| up.active(i)).collect::<Vec<_>>(), [3, 0, 3]);
    assert_eq!(up.pick(None, None).unwrap().index(), 1);
}

// ---- two random choices ----

#[test]
fn p2c_takes_less_loaded_of_two() {
    let loads = [10u32, 0];
    let mut rng = fastrand::Rng::with_seed(7);
    for _ in 0..100 {
        assert_eq!(
            two_random_choices(&[1, 1], |i| loads[i], |_| true, &mut rng),
            Some(1)
        );
    }
    assert_eq!(
        two_random_choices(&[1, 1], |i| loads[i], |i| i == 0, &mut rng),
        Some(0)
    );
    assert_eq!(
        two_random_choices(&[1, 1], |i| loads[i], |_| false, &mut rng),
        None
    );
}

#[test]
fn p2c_spreads_load_by_weight() {
    let mut rng = fastrand::Rng::with_seed(42);
    // Idle servers: the first draw wins ties, so picks follow the weights.
    let picks =
        (0..40_000).map(|_| two_random_choices(&[1, 1, 2], |_| 0, |_| true, &mut rng).unwrap());
    let c = counts(picks, 3);
    assert!((9_000..11_000).contains(&c[0]), "{c:?}");
    assert!((9_000..11_000).contains(&c[1]), "{c:?}");
    assert!((19_000..21_000).contains(&c[2]), "{c:?}");
}

#[test]
fn upstream_p2c_never_picks_full_server_and_spreads() {
    let up = Upstream::new(group(&[1, 1, 1, 1], Balance::TwoRandomChoices, 2));
    let held: Vec<_> = (0..8).map(|_| up.pick(None, None).unwrap()).collect();
    assert_eq!(
        (0..4).map(|i| up.active(i)).collect::<Vec<_>>(),
        [2, 2, 2, 2]
    );
    assert!(up.pick(None, None).is_none());
    drop(held);
    // Holding guards, P2C keeps the spread tight: max - min stays small.
    let held: Vec<_> = (0..8).map(|_| up.pick(None, None).unwrap()).collect();
    assert!((0..4).all(|i| up.active(i) == 2));
    drop(held);
    let up = Upstream::new(group(&[1, 1, 1, 1], Balance::TwoRandomChoices, 0));
    let held: Vec<_> = (0..400).map(|_| up.pick(None, None).unwrap()).collect();
    let loads: Vec<u32> = (0..4).map(|i| up.active(i)).collect();
    let (min, max) = (*loads.iter().min().unwrap(), *loads.iter().max().unwrap());
    assert!(max - min <= 10, "{loads:?}");
    drop(held);
}

// ---- consistent hashing ----

fn hash_owner(up: &Upstream, key: &[u8]) -> usize {
    up.pick(Some(key), None).unwrap().index()
}

#[test]
fn hash_same_key_same_server() {
    let up = Upstream::new(group(&[1, 1, 1, 1], Balance::HashClientIp, 0));
    let up2 = Upstream::new(group(&[1, 1, 1, 1], Balance::HashClientIp, 0));
    for k in 0..1000u32 {
        let key = format!("client-{k}");
        let a = hash_owner(&up, key.as_bytes());
        assert_eq!(a, hash_owner(&up, key.as_bytes()));
        assert_eq!(a, hash_owner(&up2, key.as_bytes()));
    }
}

#[test]
fn hash_distribution_even() {
    let up = Upstream::new(group(
        &[1, 1, 1, 1],
        Balance::HashHeader("x-user".into()),
        0,
    ));
    let picks = (0..10_000u32).map(|k| hash_owner(&up, format!("user-{k}").as_bytes()));
    let c = counts(picks, 4);
    for &n in &c {
        assert!((1875..=3125).contains(&n), "{c:?}");
    }
    // Weighted: a weight-2 server gets about twice the keys.
    let up = Upstream::new(group(&[2, 1, 1], Balance::HashCookie("sid".into()), 0));
    let c = counts((0..10_000u32).map(|k| hash_owner(&up, &k.to_be_bytes())), 3);
    assert!((4000..=6000).contains(&c[0]), "{c:?}");
}

#[test]
fn hash_removing_a_server_moves_only_its_keys() {
    let full = group(&[1, 1, 1, 1], Balance::HashClientIp, 0);
    let up4 = Upstream::new(Arc::clone(&full));
    let mut three = (*full).clone();
    let removed = three.servers.remove(2).address;
    let up3 = Upstream::new(Arc::new(three));
    let mut moved = 0;
    for k in 0..10_000u32 {
        let key = k.to_be_bytes();
        let before = up4.pick(Some(&key), None).unwrap().address();
        let after = up3.pick(Some(&key), None).unwrap().address();
        if before != removed {
            assert_eq!(before, after, "a key not on the removed server moved");
        } else {
            moved += 1;
        }
    }
    assert!((1875..=3125).contains(&moved), "{moved} keys moved");
}

#[test]
fn hash_walks_past_full_or_excluded_server() {
    let up = Upstream::new(group(&[1, 1, 1], Balance::HashClientIp, 1));
    let key = b"\x7f\x00\x00\x01";
    let owner = up.pick(Some(key), None).unwrap();
    let next = up.pick(Some(key), None).unwrap();
    assert_ne!(owner.index(), next.index());
    drop(owner);
    drop(next);
    let owner = hash_owner(&up, key);
    let g = up.pick(Some(key), Some(owner)).unwrap();
    assert_ne!(g.index(), owner);
    // Without a key: round robin.
    drop(g);
    let picks: Vec<_> = (0..3)
        .map(|_| up.pick(None, None).unwrap().index())
        .collect();
    assert_eq!(picks, [0, 1, 2]);
}

// ---- shared behaviour ----

#[test]
fn exclude_works_and_falls_back() {
    for balance in all_balances() {
        let up = Upstream::new(group(&[1, 1, 1], balance.clone(), 0));
        for _ in 0..20 {
            assert_ne!(
                up.pick(Some(b"k"), Some(1)).unwrap().index(),
                1,
                "{balance:?}"
            );
        }
        // Only the excluded server exists: it is used anyway.
        let one = Upstream::new(group(&[1], balance.clone(), 0));
        assert_eq!(one.pick(Some(b"k"), Some(0)).unwrap().index(), 0);
        // Out-of-range exclude is ignored.
        assert!(up.pick(None, Some(99)).is_some());
        // Excluded server is the only one with room: it is used.
        let lim = Upstream::new(group(&[1, 1], balance.clone(), 1));
        let g0 = lim.pick(None, Some(1)).unwrap();
        assert_eq!(g0.index(), 0);
        assert_eq!(lim.pick(None, Some(1)).unwrap().index(), 1);
    }
}

#[test]
fn exclude_several_skips_each_and_falls_back_when_all_are_excluded() {
    let now = Instant::now();
    for balance in all_balances() {
        let up = Upstream::new(group(&[1, 1, 1], balance.clone(), 0));
        for _ in 0..20 {
            let g = up.pick_at_excluding(Some(b"k"), &[0, 2], now).unwrap();
            assert_eq!(g.index(), 1, "{balance:?}");
        }
        // Every server excluded: one of them is used rather than none.
        assert!(up.pick_at_excluding(None, &[0, 1, 2], now).is_ok());
        // An empty list is a plain pick.
        assert!(up.pick_at_excluding(Some(b"k"), &[], now).is_ok());
    }
}

#[test]
fn guard_drop_decrements() {
    for balance in all_balances() {
        let up = Upstream::new(group(&[1], balance, 0));
        let a = up.pick(Some(b"k"), None).unwrap();
        let b = up.pick(Some(b"k"), None).unwrap();
        assert_eq!(up.active(0), 2);
        assert_eq!(a.address(), SocketAddr::from(([10, 0, 0, 1], 8080)));
        drop(a);
        assert_eq!(up.active(0), 1);
        drop(b);
        assert_eq!(up.active(0), 0);
        assert_eq!(up.active(5), 0);
    }
}

#[test]
fn empty_group_and_limits() {
    for balance in all_balances() {
        let up = Upstream::new(group(&[], balance.clone(), 0));
        assert!(up.pick(Some(b"k"), None).is_none());
        assert!(up.pick(None, Some(0)).is_none());
        let up = Upstream::new(group(&[1, 1], balance.clone(), 3));
        let held: Vec<_> = (0..6).map(|_| up.pick(Some(b"k"), None).unwrap()).collect();
        assert!(up.pick(Some(b"k"), None).is_none(), "{balance:?}");
        assert_eq!((up.active(0), up.active(1)), (3, 3));
        drop(held);
        assert_eq!((up.active(0), up.active(1)), (0, 0));
    }
}

fn all_balances() -> Vec<Balance> {
    vec![
        Balance::RoundRobin,
        Balance::LeastConnections,
        Balance::TwoRandomChoices,
        Balance::HashClientIp,
        Balance::HashHeader("x".into()),
        Balance::HashCookie("c".into()),
    ]
}

#[test]
fn max_connections_never_over_admitted_under_threads() {
    const LIMIT: u32 = 3;
    for balance in all_balances() {
        let up = Arc::new(Upstream::new(group(&[1, 2, 1], balance.clone(), LIMIT)));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let up = Arc::clone(&up);
                std::thread::spawn(move || {
                    let mut max_seen = 0;
                    let mut admitted = 0u32;
                    let mut held = Vec::new();
                    for i in 0..20_000u32 {
                        let key = (i % 7).to_be_bytes();
                        let key = (t % 2 == 0).then_some(&key[..]);
                        if let Some(g) = up.pick(key, None) {
                            admitted += 1;
                            max_seen = max_seen.max(up.active(g.index()));
                            held.push(g);
                        }
                        // Hold a few guards at a time, release in varying order.
                        if held.len() > (i as usize % 4) {
                            held.swap_remove(i as usize % held.len());
                        }
                    }
                    (max_seen, admitted)
                })
            })
            .collect();
        let mut max_seen = 0;
        let mut admitted = 0;
        for t in threads {
            let (m, a) = t.join().unwrap();
            max_seen = max_seen.max(m);
            admitted += a;
        }
        assert!(max_seen <= LIMIT, "{balance:?}: saw {max_seen} active");
        assert!(admitted > 0);
        assert_eq!(
            (0..3).map(|i| up.active(i)).sum::<u32>(),
            0,
            "{balance:?}: counts leaked"
        );
    }
}

#[test]
fn send_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Upstream>();
    assert_send_sync::<ServerGuard>();
}

// ---- release hook (the proxy's queue) ----

#[test]
fn release_hook_hears_every_released_slot_after_the_count_drops() {
    use std::sync::atomic::AtomicUsize;
    struct Count(Arc<Upstream>, AtomicUsize);
    impl ReleaseHook for Arc<Count> {
        fn released(&self) {
            // The slot is already free when the hook runs: a waiter picking now succeeds.
            assert_eq!(self.0.active(0), 0);
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }
    let u = Arc::new(Upstream::new(group(&[1], Balance::RoundRobin, 1)));
    let g = u.pick(None, None).unwrap();
    let hook = Arc::new(Count(u.clone(), AtomicUsize::new(0)));
    assert!(u.set_release_hook(Arc::new(hook.clone())));
    assert!(!u.set_release_hook(Arc::new(hook.clone())), "set once");
    assert!(u.pick(None, None).is_none(), "at the limit");
    drop(g);
    assert_eq!(hook.1.load(Ordering::SeqCst), 1);
    drop(u.pick(None, None).unwrap());
    assert_eq!(hook.1.load(Ordering::SeqCst), 2);
}

// ---- a group with no server (a discovery that has found none yet) ----

#[test]
fn a_group_without_servers_picks_none_under_every_balance() {
    for balance in [
        Balance::RoundRobin,
        Balance::LeastConnections,
        Balance::TwoRandomChoices,
        Balance::HashClientIp,
        Balance::HashHeader("x-user".into()),
        Balance::HashCookie("user".into()),
    ] {
        let up = Upstream::new(group(&[], balance.clone(), 0));
        let now = Instant::now();
        assert!(up.pick_at(Some(b"k"), None, now).is_err(), "{balance:?}");
        assert!(up.pick_at(None, Some(0), now).is_err(), "{balance:?}");
        assert!(
            up.pick_at_excluding(None, &[0, 1], now).is_err(),
            "{balance:?}"
        );
        assert!(up.status(now).is_empty());
        // and a later group with servers carries nothing, and picks
        let next = Upstream::new_carrying(group(&[1, 1], balance.clone(), 0), &up);
        assert!(next.pick_at(Some(b"k"), None, now).is_ok(), "{balance:?}");
    }
}

#[test]
fn a_group_of_one_answers_as_the_general_path_does() {
    for balance in [
        Balance::RoundRobin,
        Balance::LeastConnections,
        Balance::TwoRandomChoices,
        Balance::HashClientIp,
    ] {
        let up = Upstream::new(group(&[3], balance.clone(), 2));
        let now = Instant::now();
        // An excluded server is a candidate again when no other can take the request.
        let a = up.pick_at(Some(b"k"), Some(0), now).unwrap();
        let b = up.pick_at(None, None, now).unwrap();
        assert_eq!((a.index(), b.index()), (0, 0));
        assert_eq!(up.active(0), 2);
        assert!(matches!(
            up.pick_at(None, None, now),
            Err(PickError::AtLimit)
        ));
        drop(a);
        assert_eq!(up.active(0), 1);
        assert!(up.set_admin(0, AdminState::Disabled));
        assert!(matches!(
            up.pick_at(None, None, now),
            Err(PickError::Unavailable)
        ));
        assert!(up.pick(None, None).is_none());
        assert!(up.set_admin(0, AdminState::Enabled));
        drop(b);
        assert!(up.pick(None, None).is_some());
        assert_eq!(up.status(now)[0].requests, 3);
    }
}
