//! Per-route resilience state shared by every worker: retry budget and rate-limit buckets, carried across reloads.

pub mod client_limit;
pub mod fleet;
pub mod hashed;
pub mod load;
pub mod ratelimit;
pub mod retry;
pub mod shed;

use crate::resilience::fleet::{Fleet, FleetCounts};
use crate::resilience::ratelimit::RateLimiter;
use crate::resilience::retry::RetryBudget;
use portico_config::{Action, Listener, Route};
use std::sync::Arc;
use std::time::Instant;

/// One route's process-wide resilience state, indexed like the listener's routes.
#[derive(Debug, Default)]
pub struct RouteResilience {
    /// Present when the route has a `retry` table.
    pub retry_budget: Option<Arc<RetryBudget>>,
    /// Present when the route has a `rate_limit` table.
    pub rate_limit: Option<Arc<RateLimiter>>,
}

/// The state for each route of `l`. A route of the same name in `previous` (the listener of the
/// same name in the running snapshot) with the same settings hands its state over, so a reload
/// neither refills a retry budget or a client's rate-limit bucket nor forgets them.
pub fn for_listener(
    l: &Listener,
    previous: Option<(&Listener, &[RouteResilience])>,
    fleet: Option<&Arc<Fleet>>,
) -> Vec<RouteResilience> {
    let now = Instant::now();
    l.routes
        .iter()
        .map(|r| {
            let before = previous.and_then(|(listener, states)| {
                let i = listener.routes.iter().position(|o| o.name == r.name)?;
                Some((&listener.routes[i], states.get(i)?))
            });
            RouteResilience {
                retry_budget: retry_budget(r, before, now),
                rate_limit: rate_limit(l, r, before, fleet),
            }
        })
        .collect()
}

/// A route's rate limiter: kept from `before` while its settings (and, for a fleet limit, the
/// fleet) stay the same.
fn rate_limit(
    l: &Listener,
    r: &Route,
    before: Option<(&Route, &RouteResilience)>,
    fleet: Option<&Arc<Fleet>>,
) -> Option<Arc<RateLimiter>> {
    let limit = r.rate_limit.as_ref()?;
    let fleet = fleet.filter(|_| limit.fleet);
    if let Some((old, state)) = before {
        if old.rate_limit.as_ref() == Some(limit) {
            if let Some(kept) = &state.rate_limit {
                let same_fleet = match (kept.fleet(), fleet) {
                    (None, None) => true,
                    (Some(c), Some(f)) => Arc::ptr_eq(&c.fleet, f),
                    _ => false,
                };
                if same_fleet {
                    return Some(kept.clone());
                }
            }
        }
    }
    Some(Arc::new(match fleet {
        // While Redis cannot be reached, each instance keeps to its share of the rate.
        Some(f) => {
            let share = limit.rate / f64::from(f.settings.instances);
            let counts = FleetCounts::new(f, &l.name, &r.name, limit.rate, limit.max_keys);
            RateLimiter::with_fleet(counts, share, share.ceil().max(1.0) as u32, limit.max_keys)
        }
        None => RateLimiter::new(limit.rate, limit.burst, limit.max_keys),
    }))
}

fn retry_budget(
    r: &Route,
    before: Option<(&Route, &RouteResilience)>,
    now: Instant,
) -> Option<Arc<RetryBudget>> {
    let policy = match &r.action {
        Action::Proxy(p) => p.retry.as_ref()?,
        _ => return None,
    };
    if let Some((old, state)) = before {
        if let (Action::Proxy(op), Some(b)) = (&old.action, &state.retry_budget) {
            let same = op.retry.as_ref().is_some_and(|o| {
                o.budget == policy.budget && o.min_per_second == policy.min_per_second
            });
            if same {
                return Some(b.clone());
            }
        }
    }
    Some(Arc::new(RetryBudget::new(
        policy.budget,
        policy.min_per_second,
        now,
    )))
}
