//! Sans-io server selection: smooth weighted round robin, least connections, two random choices.

// Every function takes the server weights, the current loads (a closure reading the shared
// counters) and an `eligible` predicate (not excluded, not at its connection limit). Nothing here
// touches a clock, a socket or a global random source, so the algorithms are unit-testable.

/// Smooth weighted round robin state (nginx's algorithm): on every pick each eligible server's
/// `current` grows by its weight, the largest `current` wins and is lowered by the total weight
/// of the eligible servers. Over `sum(weights)` picks every server is chosen exactly `weight`
/// times, interleaved as evenly as possible (5,1,1 gives a a b a c a a).
#[derive(Debug, Clone)]
pub struct Swrr {
    current: Vec<i64>,
}

impl Swrr {
    pub fn new(servers: usize) -> Self {
        Swrr {
            current: vec![0; servers],
        }
    }

    /// Pick one server among those for which `eligible(i)` holds; None if there is none.
    /// Entries beyond `weights.len()` (or beyond the server count given to `new`) are ignored.
    pub fn next(&mut self, weights: &[u32], eligible: impl Fn(usize) -> bool) -> Option<usize> {
        let mut total: i64 = 0;
        let mut best: Option<(usize, i64)> = None;
        for ((i, cur), &w) in self.current.iter_mut().enumerate().zip(weights) {
            if !eligible(i) {
                continue;
            }
            let w = i64::from(w.max(1));
            *cur = cur.saturating_add(w);
            total = total.saturating_add(w);
            // Strictly greater: the first of equal candidates wins, as in nginx.
            if best.is_none_or(|(_, b)| *cur > b) {
                best = Some((i, *cur));
            }
        }
        let (best, _) = best?;
        if let Some(c) = self.current.get_mut(best) {
            *c = c.saturating_sub(total);
        }
        Some(best)
    }
}

/// `a_load / a_weight < b_load / b_weight`, compared without division.
fn less_loaded(a_load: u32, a_weight: u32, b_load: u32, b_weight: u32) -> std::cmp::Ordering {
    let a = u64::from(a_load) * u64::from(b_weight.max(1));
    let b = u64::from(b_load) * u64::from(a_weight.max(1));
    a.cmp(&b)
}

/// Least connections: the eligible server with the fewest active requests relative to its weight;
/// ties (e.g. all idle) are broken by smooth weighted round robin among the tied servers, so load
/// spreads and weights still count when the group is idle.
pub fn least_connections(
    weights: &[u32],
    load: impl Fn(usize) -> u32,
    eligible: impl Fn(usize) -> bool,
    tie_break: &mut Swrr,
) -> Option<usize> {
    let mut best: Option<(usize, u32)> = None;
    for (i, &w) in weights.iter().enumerate() {
        if !eligible(i) {
            continue;
        }
        let l = load(i);
        let better = match best {
            None => true,
            Some((b, bl)) => less_loaded(l, w, bl, weights.get(b).copied().unwrap_or(1)).is_lt(),
        };
        if better {
            best = Some((i, l));
        }
    }
    let (b, bl) = best?;
    let bw = weights.get(b).copied().unwrap_or(1);
    let tied = |i: usize| {
        eligible(i) && less_loaded(load(i), weights.get(i).copied().unwrap_or(1), bl, bw).is_eq()
    };
    // Loads may have moved since the first pass; then the first pass's answer stands.
    Some(tie_break.next(weights, tied).unwrap_or(b))
}

/// Two random choices: draw two distinct eligible servers, each with probability proportional to
/// its weight, and take the one with fewer active requests relative to its weight (the first on a
/// tie). With a single eligible server that one is returned.
pub fn two_random_choices(
    weights: &[u32],
    load: impl Fn(usize) -> u32,
    eligible: impl Fn(usize) -> bool,
    rng: &mut fastrand::Rng,
) -> Option<usize> {
    let total: u64 = weights
        .iter()
        .enumerate()
        .filter(|&(i, _)| eligible(i))
        .map(|(_, &w)| u64::from(w.max(1)))
        .sum();
    if total == 0 {
        return None;
    }
    let a = weighted_draw(weights, &eligible, None, rng.u64(0..total))?;
    let wa = weights.get(a).copied().unwrap_or(1).max(1);
    let rest = total.saturating_sub(u64::from(wa));
    if rest == 0 {
        return Some(a);
    }
    let Some(b) = weighted_draw(weights, &eligible, Some(a), rng.u64(0..rest)) else {
        return Some(a);
    };
    let wb = weights.get(b).copied().unwrap_or(1).max(1);
    if less_loaded(load(b), wb, load(a), wa).is_lt() {
        Some(b)
    } else {
        Some(a)
    }
}

/// The eligible server (other than `skip`) whose cumulative weight interval contains `r`.
fn weighted_draw(
    weights: &[u32],
    eligible: &impl Fn(usize) -> bool,
    skip: Option<usize>,
    mut r: u64,
) -> Option<usize> {
    let mut last = None;
    for (i, &w) in weights.iter().enumerate() {
        if Some(i) == skip || !eligible(i) {
            continue;
        }
        let w = u64::from(w.max(1));
        if r < w {
            return Some(i);
        }
        r -= w;
        last = Some(i);
    }
    // Only reachable if eligibility changed between summing and drawing.
    last
}
