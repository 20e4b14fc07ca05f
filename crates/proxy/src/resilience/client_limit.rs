//! Open connections per client IP address of one listener, shared by every worker (`max_connections_per_client`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard};

/// Shards of the address map: a lock is held for one lookup, and different clients rarely share one.
const SHARDS: usize = 16;

/// Counts of open connections by client address; an address with none has no entry, so memory
/// follows the connections that are open.
#[derive(Default)]
pub struct ClientCounts {
    shards: [Mutex<HashMap<IpAddr, u32>>; SHARDS],
}

impl ClientCounts {
    fn shard(&self, ip: &IpAddr) -> MutexGuard<'_, HashMap<IpAddr, u32>> {
        let folded = match ip {
            IpAddr::V4(a) => u32::from(*a) as usize,
            IpAddr::V6(a) => {
                let o = a.octets();
                o.iter()
                    .fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(*b as usize))
            }
        };
        self.shards[folded % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Count one more connection from `ip` unless it already holds `max`; false = refused (and
    /// nothing counted).
    pub fn try_open(&self, ip: IpAddr, max: u32) -> bool {
        let mut map = self.shard(&ip);
        let n = map.entry(ip).or_insert(0);
        if *n >= max {
            if *n == 0 {
                map.remove(&ip);
            }
            return false;
        }
        *n += 1;
        true
    }

    /// A connection counted by [`ClientCounts::try_open`] closed.
    pub fn close(&self, ip: IpAddr) {
        let mut map = self.shard(&ip);
        if let Some(n) = map.get_mut(&ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&ip);
            }
        }
    }

    /// Open connections counted for `ip`.
    #[cfg(test)]
    pub fn open(&self, ip: IpAddr) -> u32 {
        self.shard(&ip).get(&ip).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_address_is_held_to_its_own_limit_and_forgotten_when_it_has_none() {
        let c = ClientCounts::default();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "2001:db8::1".parse().unwrap();
        assert!(c.try_open(a, 2));
        assert!(c.try_open(a, 2));
        assert!(!c.try_open(a, 2), "a third connection is refused");
        assert!(c.try_open(b, 2), "another address is not affected");
        assert_eq!(c.open(a), 2);
        c.close(a);
        assert!(c.try_open(a, 2), "a closed connection frees its place");
        c.close(a);
        c.close(a);
        c.close(b);
        assert_eq!((c.open(a), c.open(b)), (0, 0));
        assert!(c.shards.iter().all(|s| s.lock().unwrap().is_empty()));
        // A refusal with a zero limit leaves no entry behind.
        assert!(!c.try_open(a, 0));
        assert!(c.shards.iter().all(|s| s.lock().unwrap().is_empty()));
    }
}
