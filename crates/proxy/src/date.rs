//! The `Date` header value, formatted once per second per thread.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

thread_local! {
    static CACHE: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
}

/// Call `f` with the current HTTP date (RFC 9110 5.6.7), e.g. `Sun, 06 Nov 1994 08:49:37 GMT`.
pub fn with_date<R>(f: impl FnOnce(&str) -> R) -> R {
    let now = SystemTime::now();
    let secs = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.0 != secs {
            c.0 = secs;
            c.1 = httpdate::fmt_http_date(now);
        }
        f(&c.1)
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_an_imf_fixdate() {
        let d = super::with_date(|d| d.to_string());
        assert!(d.ends_with(" GMT"), "{d}");
        assert_eq!(d.len(), 29, "{d}");
    }
}
