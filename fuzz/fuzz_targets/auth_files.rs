//! Fuzz the readers of access-control files: htpasswd text, JWK set documents and JWK set URLs.

#![no_main]

use libfuzzer_sys::fuzz_target;
use portico_config::htpasswd;
use portico_config::jwks::KeySet;
use portico_config::HttpUrl;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (users, errors) = htpasswd::parse(text, "f");
    for (user, hash) in &users {
        // A user is what precedes the first ':' of its line, and only good hashes are kept.
        assert!(!user.contains(':'));
        assert!(htpasswd::hash_error(hash).is_none());
    }
    for e in &errors {
        assert!(e.starts_with("f:"), "{e}");
    }
    if let Ok(set) = KeySet::parse(text) {
        assert!(!set.keys.is_empty());
    }
    if let Ok(u) = HttpUrl::parse(text) {
        assert!(u.port != 0 && !u.host.is_empty());
        assert!(u.target.starts_with('/'));
        assert!(!u.target.contains(['#', ' ']));
    }
});
