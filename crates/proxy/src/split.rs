//! Traffic splits: a request's side (the route's group or a share's), the same side for the same key.

use crate::sticky::cookie_value;
use portico_config::{Split, SplitKey};
use portico_http1::RequestHead;

/// The group `head` goes to under `split`: a share's group for the share its key falls in (in
/// ten-thousandths, by the stable hash consistent hashing uses, so every instance of a fleet
/// puts the same key on the same side), else `own`. A request without the key's header or cookie draws at random.
pub(crate) fn group(split: &Split, own: usize, head: &RequestHead, client_ip: &str) -> usize {
    let key = match &split.key {
        SplitKey::Random => None,
        SplitKey::ClientIp => Some(client_ip.as_bytes()),
        SplitKey::Header(h) => head.field(h),
        SplitKey::Cookie(c) => head
            .field("cookie")
            .and_then(|v| cookie_value(v, c.as_bytes())),
    };
    let point = match key {
        Some(k) => (portico_config::hash::hash64(k) % 10_000) as u32,
        None => fastrand::u32(0..10_000),
    };
    side(split, own, point)
}

/// The group of `point` in 0..10,000: the shares take the first basis points, in order.
fn side(split: &Split, own: usize, point: u32) -> usize {
    let mut upto = 0;
    for &(g, bp) in &split.shares {
        upto += bp;
        if point < upto {
            return g;
        }
    }
    own
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(key: SplitKey) -> Split {
        Split {
            shares: vec![(7, 500), (8, 1500)],
            key,
        }
    }

    #[test]
    fn shares_take_their_basis_points_in_order() {
        let s = split(SplitKey::Random);
        assert_eq!(side(&s, 0, 0), 7);
        assert_eq!(side(&s, 0, 499), 7);
        assert_eq!(side(&s, 0, 500), 8);
        assert_eq!(side(&s, 0, 1999), 8);
        assert_eq!(side(&s, 0, 2000), 0);
        assert_eq!(side(&s, 0, 9999), 0);
    }

    #[test]
    fn a_key_always_lands_on_the_same_side_and_keys_spread_as_the_shares_say() {
        let s = split(SplitKey::ClientIp);
        let mut buf = bytes::BytesMut::from(&b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"[..]);
        let head = portico_http1::parse_request(&mut buf, &Default::default())
            .unwrap()
            .unwrap();
        let mut counts = [0usize; 9];
        for i in 0..20_000 {
            let ip = format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256);
            let g = group(&s, 0, &head, &ip);
            assert_eq!(g, group(&s, 0, &head, &ip), "stable");
            counts[g] += 1;
        }
        // 5% and 15% of 20,000, within a few standard deviations.
        assert!((800..1200).contains(&counts[7]), "{counts:?}");
        assert!((2600..3400).contains(&counts[8]), "{counts:?}");
    }
}
