//! Per-route resilience state shared by every worker: the retry budget (and its carry-over across reloads).

use crate::retry::RetryBudget;
use crate::server::ListenerState;
use portico_config::{Action, Listener, Route};
use std::sync::Arc;
use std::time::Instant;

/// One route's process-wide resilience state, indexed like the listener's routes.
#[derive(Debug, Default)]
pub struct RouteResilience {
    /// Present when the route has a `retry` table.
    pub retry_budget: Option<Arc<RetryBudget>>,
}

/// The state for each route of `l`. A route of the same name in `previous` (the listener of the
/// same name in the running snapshot) with the same settings hands its state over, so a reload
/// neither refills a retry budget nor forgets it.
pub fn for_listener(l: &Listener, previous: Option<&ListenerState>) -> Vec<RouteResilience> {
    let now = Instant::now();
    l.routes
        .iter()
        .map(|r| {
            let before = previous.and_then(|p| {
                let i = p.listener.routes.iter().position(|o| o.name == r.name)?;
                Some((&p.listener.routes[i], p.resilience.get(i)?))
            });
            RouteResilience {
                retry_budget: retry_budget(r, before, now),
            }
        })
        .collect()
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
