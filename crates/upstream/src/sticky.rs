//! Session persistence by cookie: an opaque, stable id per server, and picking the server an id names.

use crate::{ServerGuard, Upstream};
use portico_config::hash::hash64;
use portico_config::UpstreamGroup;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Salt so the id is not the plain address hash the consistent-hash ring uses.
const SALT: &[u8] = b"portico-sticky-v1:";

/// The cookie value that names the server at `address`: 16 hex digits of a stable hash of the
/// address, so it survives reloads, reordering and servers added around it, and it does not show
/// the address.
pub fn server_id(address: SocketAddr) -> String {
    let mut input = SALT.to_vec();
    input.extend_from_slice(address.to_string().as_bytes());
    format!("{:016x}", hash64(&input))
}

/// The ids of a group's servers, in configuration order (empty when the group has no
/// `sticky_cookie`).
pub(crate) fn ids(group: &UpstreamGroup) -> Box<[String]> {
    if group.sticky_cookie.is_none() {
        return Box::default();
    }
    group.servers.iter().map(|s| server_id(s.address)).collect()
}

impl Upstream {
    /// The sticky cookie value naming `server` (None without `sticky_cookie` or for an unknown
    /// index).
    pub fn sticky_id(&self, server: usize) -> Option<&str> {
        self.sticky_ids.get(server).map(String::as_str)
    }

    /// The server whose sticky id is `id`, at time `now`, with one active request counted on it,
    /// if it is available (Up, not ejected, Enabled) and below `max_connections_per_server`.
    /// None otherwise: the caller picks with the balancer and sets the cookie again. Slow start
    /// does not apply to requests that already belong to a server.
    pub fn pick_sticky_at(&self, id: &[u8], now: Instant) -> Option<ServerGuard> {
        let index = self.sticky_ids.iter().position(|s| s.as_bytes() == id)?;
        let s = self.shared.servers.get(index)?;
        let slow_start = self.shared.group.passive.slow_start;
        let available = s.admin() == crate::AdminState::Enabled
            && !s.down.load(Ordering::Acquire)
            && !s.check_ejection(Some(now), slow_start, &self.shared.group.name);
        if !available || !self.try_acquire(index) {
            return None;
        }
        s.requests.fetch_add(1, Ordering::Relaxed);
        Some(self.guard(index))
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // a real `now` handed to the sans-io code
mod tests {
    use super::*;
    use crate::tests::group;
    use crate::{AdminState, Balance, Report};
    use portico_config::StickyCookie;
    use std::sync::Arc;

    fn sticky(weights: &[u32], limit: u32) -> Upstream {
        let mut g = (*group(weights, Balance::RoundRobin, limit)).clone();
        g.sticky_cookie = Some(StickyCookie {
            name: "S".into(),
            path: "/".into(),
            max_age: None,
            http_only: true,
            secure: false,
            same_site: None,
        });
        Upstream::new(Arc::new(g))
    }

    #[test]
    fn ids_are_stable_opaque_and_distinct() {
        let a = SocketAddr::from(([10, 0, 0, 1], 8080));
        let b = SocketAddr::from(([10, 0, 0, 2], 8080));
        // Pinned: a changed id moves every client to a new server after an upgrade.
        assert_eq!(server_id(a), "44107416476d754b");
        assert_ne!(server_id(a), server_id(b));
        assert!(!server_id(a).contains("10.0.0.1"));
        let u = sticky(&[1, 1], 0);
        assert_eq!(u.sticky_id(1), Some(server_id(b).as_str()));
        assert_eq!(u.sticky_id(2), None);
        // Without sticky_cookie no ids are kept.
        assert_eq!(
            Upstream::new(group(&[1], Balance::RoundRobin, 0)).sticky_id(0),
            None
        );
    }

    #[test]
    fn an_id_picks_its_server_while_it_is_available() {
        let u = sticky(&[1, 1, 1], 1);
        let now = Instant::now();
        let id = u.sticky_id(2).unwrap().to_string();
        let g = u.pick_sticky_at(id.as_bytes(), now).unwrap();
        assert_eq!(g.index(), 2);
        // At its limit: no sticky pick (the balancer chooses another).
        assert!(u.pick_sticky_at(id.as_bytes(), now).is_none());
        drop(g);
        assert_eq!(u.pick_sticky_at(id.as_bytes(), now).unwrap().index(), 2);
        // Disabled, down or ejected: none.
        u.set_admin(2, AdminState::Disabled);
        assert!(u.pick_sticky_at(id.as_bytes(), now).is_none());
        u.set_admin(2, AdminState::Enabled);
        for _ in 0..5 {
            u.report(2, Report::ConnectError, now);
        }
        assert!(u.pick_sticky_at(id.as_bytes(), now).is_none(), "ejected");
        assert!(u.pick_sticky_at(b"nonsense", now).is_none());
        assert_eq!(u.active(2), 0);
    }
}
