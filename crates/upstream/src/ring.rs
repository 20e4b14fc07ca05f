//! Consistent hashing ring with weighted virtual nodes (sans-io, deterministic).

use portico_config::hash::hash64;

/// Virtual nodes per unit of weight.
pub const VNODES_PER_WEIGHT: u64 = 160;

/// Upper bound on ring points so huge weights cannot blow up memory (16 bytes per point);
/// above it every server's share is scaled down proportionally (at least one point each).
pub const MAX_POINTS: u64 = 1 << 18;

/// A sorted ring of `(point hash, server index)`.
///
/// A server's points are derived from its identity (its address), never from its position in the
/// list, so removing one server moves only the keys that server owned.
#[derive(Debug, Clone, Default)]
pub struct Ring {
    points: Vec<(u64, u32)>,
}

impl Ring {
    /// Build a ring from `(identity, weight)` per server, in server-index order.
    pub fn new<I: AsRef<[u8]>>(servers: &[(I, u32)]) -> Self {
        let total_weight: u64 = servers.iter().map(|(_, w)| u64::from((*w).max(1))).sum();
        let wanted = total_weight.saturating_mul(VNODES_PER_WEIGHT);
        let mut points = Vec::new();
        let mut id_buf = Vec::new();
        for (index, (id, weight)) in servers.iter().enumerate() {
            let Ok(index) = u32::try_from(index) else {
                break;
            };
            let w = u64::from((*weight).max(1));
            let vnodes = if wanted <= MAX_POINTS {
                w * VNODES_PER_WEIGHT
            } else {
                // w * MAX_POINTS / total_weight, computed without overflow.
                let scaled =
                    u128::from(w) * u128::from(MAX_POINTS) / u128::from(total_weight.max(1));
                u64::try_from(scaled).unwrap_or(1).max(1)
            };
            for v in 0..vnodes {
                id_buf.clear();
                id_buf.extend_from_slice(id.as_ref());
                id_buf.push(b'#');
                push_decimal(&mut id_buf, v);
                points.push((hash64(&id_buf), index));
            }
        }
        // Ties between identical points (duplicate identities) are broken by server index.
        points.sort_unstable();
        Ring { points }
    }

    /// Number of points on the ring.
    pub fn len(&self) -> usize {
        self.points.len()
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// The server owning `key`: the first point clockwise from `hash64(key)`. If that server is
    /// not eligible, walk on clockwise to the next point whose server is eligible. None if no
    /// server on the ring is eligible.
    pub fn lookup(&self, key: &[u8], eligible: impl Fn(usize) -> bool) -> Option<usize> {
        if self.points.is_empty() {
            return None;
        }
        let h = hash64(key);
        let start = self.points.partition_point(|&(p, _)| p < h);
        let (after, before) = (self.points.get(start..)?, self.points.get(..start)?);
        let mut last_checked: Option<u32> = None;
        for &(_, server) in after.iter().chain(before) {
            // Consecutive points of one server are checked once.
            if last_checked == Some(server) {
                continue;
            }
            last_checked = Some(server);
            let server = server as usize;
            if eligible(server) {
                return Some(server);
            }
        }
        None
    }
}

/// Append the decimal digits of `n` without allocating.
fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring_of(addrs: &[&str]) -> Ring {
        let servers: Vec<(&str, u32)> = addrs.iter().map(|a| (*a, 1)).collect();
        Ring::new(&servers)
    }

    #[test]
    fn decimal() {
        let mut v = Vec::new();
        push_decimal(&mut v, 0);
        v.push(b' ');
        push_decimal(&mut v, 1234567890);
        v.push(b' ');
        push_decimal(&mut v, u64::MAX);
        assert_eq!(v, b"0 1234567890 18446744073709551615");
    }

    #[test]
    fn size_and_weights() {
        let r = Ring::new(&[("a", 1), ("b", 3)]);
        assert_eq!(r.len(), 4 * VNODES_PER_WEIGHT as usize);
        let big = Ring::new(&[("a", u32::MAX), ("b", 1)]);
        assert!(big.len() as u64 <= MAX_POINTS + 2);
        assert!(
            big.points.iter().any(|&(_, s)| s == 1),
            "every server keeps at least one point"
        );
        assert!(Ring::new::<&str>(&[]).lookup(b"k", |_| true).is_none());
    }

    #[test]
    fn same_key_same_server() {
        let r = ring_of(&["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"]);
        for k in 0..100u32 {
            let key = k.to_be_bytes();
            let a = r.lookup(&key, |_| true);
            assert!(a.is_some());
            assert_eq!(a, r.lookup(&key, |_| true));
            assert_eq!(
                a,
                ring_of(&["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"]).lookup(&key, |_| true)
            );
        }
    }

    #[test]
    fn walks_to_next_distinct_eligible_server() {
        let r = ring_of(&["a:1", "b:1", "c:1"]);
        for k in 0..200u32 {
            let key = k.to_le_bytes();
            let owner = r.lookup(&key, |_| true).unwrap_or(usize::MAX);
            let other = r.lookup(&key, |i| i != owner);
            assert!(other.is_some_and(|o| o != owner));
            assert_eq!(r.lookup(&key, |_| false), None);
        }
    }
}
