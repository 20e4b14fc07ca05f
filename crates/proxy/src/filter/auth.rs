//! HTTP Basic authentication (RFC 7617): credentials checked against bcrypt or argon2 hashes off the worker thread, with a short cache of the credentials that passed, and the htpasswd file read again when it changes.

use crate::cert_watch::{stamps, Stamp};
use crate::telemetry::stats::Stats;
use arc_swap::ArcSwap;
use portico_config::BasicAuth;
use portico_http1::RequestHead;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The passes a route's forward auth remembers, per credential (a SHA-256 of the values of the
/// fields sent to the auth service), with the fields they set.
#[derive(Debug, Default)]
pub(crate) struct PassCache {
    pub passes: Mutex<HashMap<[u8; 32], (Instant, CopiedFields)>>,
}

/// Fields a forward auth service's pass sets: (index in `copy_headers`, value).
pub(crate) type CopiedFields = Vec<(usize, String)>;

/// How long credentials that passed are taken again without hashing.
const CACHE_TTL: Duration = Duration::from_secs(300);
/// Most cached credentials per route; a full cache is emptied (the next requests hash again).
const CACHE_MAX: usize = 10_000;
/// How often the htpasswd file is looked at.
const FILE_EVERY: Duration = Duration::from_secs(1);

/// A route's basic auth: its users and the credentials that passed lately (by a SHA-256 of
/// the user and password: no password is kept).
#[derive(Debug)]
pub(crate) struct AuthState {
    pub cfg: Arc<BasicAuth>,
    /// (user, hash) sorted by user: the configuration's, then the htpasswd file's as it changes.
    users: ArcSwap<Vec<(String, String)>>,
    /// The htpasswd file's stamp when last read, and when to look again.
    file: Mutex<(Vec<Stamp>, Instant)>,
    /// Credentials that passed, and the number of the users' version they passed under (a pass
    /// checked against users since replaced is not remembered).
    passed: Mutex<(HashMap<[u8; 32], Instant>, u64)>,
    /// Failed attempts per client address in the current window (with `lockout`).
    failures: Mutex<HashMap<IpAddr, (u32, Instant)>>,
}

/// What a basic-auth check found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Checked {
    Pass,
    Fail,
    /// The client's address failed too often: refused without a check until this much later.
    Locked(Duration),
}

impl AuthState {
    pub(crate) fn new(cfg: Arc<BasicAuth>) -> Self {
        let stamp = stamps(cfg.htpasswd.as_slice());
        AuthState {
            users: ArcSwap::from_pointee(cfg.users.clone()),
            file: Mutex::new((stamp, Instant::now() + FILE_EVERY)),
            cfg,
            passed: Mutex::new((HashMap::new(), 0)),
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Read the htpasswd file again if it changed: a file with a refused line keeps the users
    /// loaded before. Returns how long until the next look (None without a file).
    pub(crate) fn check_file(&self, now: Instant, stats: &Stats) -> Option<Duration> {
        let path = self.cfg.htpasswd.as_ref()?;
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if now < file.1 {
            return Some(file.1 - now);
        }
        file.1 = now + FILE_EVERY;
        let stamp = stamps(std::slice::from_ref(path));
        if stamp == file.0 {
            return Some(FILE_EVERY);
        }
        file.0 = stamp;
        drop(file);
        let name = path.display().to_string();
        let read = std::fs::read_to_string(path).map_err(|e| format!("{name}: {e}"));
        let parsed = read.and_then(|text| {
            let (users, errors) = portico_config::htpasswd::parse(&text, &name);
            match errors.into_iter().next() {
                Some(e) => Err(e),
                None => Ok(users),
            }
        });
        match parsed {
            Ok(users) => {
                let n = users.len();
                // A user removed or given a new password must not pass from the cache, nor from
                // a check of the old hash still running.
                let mut passed = self.passed.lock().unwrap_or_else(|e| e.into_inner());
                self.users.store(Arc::new(portico_config::htpasswd::merge(
                    users,
                    &self.cfg.table,
                )));
                passed.0.clear();
                passed.1 += 1;
                drop(passed);
                stats.htpasswd_reloads.fetch_add(1, Ordering::Relaxed);
                tracing::info!(users = n, "htpasswd file {name} changed: loaded");
            }
            Err(e) => {
                stats
                    .htpasswd_reload_failures
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    "htpasswd file changed but is refused, the users loaded before stay: {e}"
                );
            }
        }
        Some(FILE_EVERY)
    }

    /// The password hash of `user`.
    fn hash(&self, user: &str) -> Option<String> {
        let users = self.users.load();
        users
            .binary_search_by(|(u, _)| u.as_str().cmp(user))
            .ok()
            .map(|i| users[i].1.clone())
    }

    /// The `WWW-Authenticate` value of a 401.
    pub(crate) fn challenge(&self) -> String {
        format!("Basic realm=\"{}\", charset=\"UTF-8\"", self.cfg.realm)
    }

    /// Whether the request's `Authorization` names a user and the password its hash was made
    /// from. A hash is checked on the blocking pool (bcrypt at cost 10 takes tens of
    /// milliseconds: on the worker it would stall every connection of the worker); an unknown
    /// user is checked against a hash too, so that the time taken does not tell which users
    /// exist.
    pub(crate) async fn check(&self, head: &RequestHead, client: IpAddr) -> Checked {
        let now = Instant::now();
        if let Some(wait) = self.locked(client, now) {
            return Checked::Locked(wait);
        }
        let ok = self.verify(head).await;
        self.count(client, ok, now);
        match ok {
            true => Checked::Pass,
            false => Checked::Fail,
        }
    }

    /// How long `client` stays locked out, if it is.
    fn locked(&self, client: IpAddr, now: Instant) -> Option<Duration> {
        let l = self.cfg.lockout?;
        let failures = self.failures.lock().ok()?;
        let (n, since) = failures.get(&client)?;
        let left = l.window.checked_sub(now.duration_since(*since))?;
        (*n >= l.failures && !left.is_zero()).then_some(left)
    }

    /// Count a failure of `client` in its window (a pass clears its count).
    fn count(&self, client: IpAddr, ok: bool, now: Instant) {
        let Some(l) = self.cfg.lockout else {
            return;
        };
        let Ok(mut failures) = self.failures.lock() else {
            return;
        };
        if ok {
            failures.remove(&client);
            return;
        }
        if failures.len() >= CACHE_MAX && !failures.contains_key(&client) {
            failures.retain(|_, (_, since)| now.duration_since(*since) < l.window);
            if failures.len() >= CACHE_MAX {
                failures.clear();
            }
        }
        let e = failures.entry(client).or_insert((0, now));
        if now.duration_since(e.1) >= l.window {
            *e = (0, now);
        }
        e.0 += 1;
    }

    /// Whether the request's credentials are a user's and its password.
    async fn verify(&self, head: &RequestHead) -> bool {
        let Some((user, password)) = credentials(head) else {
            return false;
        };
        let key = digest(&user, &password);
        let now = Instant::now();
        let version = match self.passed.lock() {
            Ok(passed) => {
                if passed
                    .0
                    .get(&key)
                    .is_some_and(|t| now.duration_since(*t) < CACHE_TTL)
                {
                    return true;
                }
                passed.1
            }
            Err(_) => u64::MAX,
        };
        let hash = self.hash(&user);
        let known = hash.is_some();
        let ok = tokio::task::spawn_blocking(move || {
            let hash = hash.unwrap_or_else(|| dummy().to_string());
            verify(&password, &hash)
        })
        .await
        .unwrap_or(false);
        if ok && known {
            if let Ok(mut passed) = self.passed.lock() {
                if passed.1 == version {
                    if passed.0.len() >= CACHE_MAX {
                        passed.0.clear();
                    }
                    passed.0.insert(key, now);
                }
            }
        }
        ok && known
    }
}

/// The user and password of a `Basic` `Authorization` field.
fn credentials(head: &RequestHead) -> Option<(String, String)> {
    use base64::Engine;
    let value = head.field("authorization")?;
    let (scheme, token) = value.split_at(value.iter().position(|&b| b == b' ')?);
    if !scheme.eq_ignore_ascii_case(b"basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(token.trim_ascii())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

fn digest(user: &str, password: &str) -> [u8; 32] {
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    ctx.update(user.as_bytes());
    ctx.update(b"\0");
    ctx.update(password.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// Whether `password` is the one `hash` (bcrypt or argon2, checked when loaded) was made from.
fn verify(password: &str, hash: &str) -> bool {
    if hash.starts_with("$argon2") {
        use argon2::PasswordVerifier;
        return argon2::PasswordHash::new(hash).is_ok_and(|h| {
            argon2::Argon2::default()
                .verify_password(password.as_bytes(), &h)
                .is_ok()
        });
    }
    bcrypt::verify(password, hash).unwrap_or(false)
}

/// A bcrypt hash no password is known for, made once: what unknown users are checked against.
fn dummy() -> &'static str {
    static DUMMY: OnceLock<String> = OnceLock::new();
    DUMMY.get_or_init(|| bcrypt::hash("portico unknown user", 10).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(auth: &str) -> RequestHead {
        let mut buf = bytes::BytesMut::from(
            format!("GET / HTTP/1.1\r\nHost: a\r\n{auth}\r\n\r\n").as_bytes(),
        );
        portico_http1::parse_request(&mut buf, &Default::default())
            .unwrap()
            .unwrap()
    }

    #[test]
    fn credentials_come_from_a_basic_authorization_field() {
        // alice:s3cret:x (a password may contain ':')
        let h = head("Authorization: Basic YWxpY2U6czNjcmV0Ong=");
        assert_eq!(credentials(&h), Some(("alice".into(), "s3cret:x".into())));
        assert_eq!(
            credentials(&head("Authorization: basic YWxpY2U6czNjcmV0Ong="))
                .unwrap()
                .0,
            "alice"
        );
        assert_eq!(credentials(&head("Authorization: Bearer abc")), None);
        assert_eq!(credentials(&head("Authorization: Basic !!!")), None);
        assert_eq!(credentials(&head("X: y")), None);
    }

    #[test]
    fn bcrypt_and_argon2_hashes_verify() {
        let b = bcrypt::hash("pw", 4).unwrap();
        assert!(verify("pw", &b) && !verify("pW", &b));
        use argon2::password_hash::{PasswordHasher, SaltString};
        let salt = SaltString::encode_b64(b"portico-salt-123").unwrap();
        let a = argon2::Argon2::default()
            .hash_password(b"pw", &salt)
            .unwrap()
            .to_string();
        assert!(verify("pw", &a) && !verify("nope", &a));
        assert!(!verify("pw", "$argon2id$broken"));
    }
}
