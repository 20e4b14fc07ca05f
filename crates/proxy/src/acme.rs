//! Certificates from an ACME server (RFC 8555): a self-signed stand-in until the first one is issued, HTTP-01 answers on every plain listener, orders and renewals on a thread of their own; the files it writes are the listener's certificate files, which the certificate watcher loads.

use portico_config::{Acme, Config};
use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::{mpsc, Mutex, OnceLock, RwLock};
use std::time::{Duration, SystemTime};

/// Where an HTTP-01 challenge is fetched.
pub(crate) const CHALLENGE_PREFIX: &str = "/.well-known/acme-challenge/";

/// HTTP-01 key authorizations by token while their orders run.
static TOKENS: RwLock<Option<HashMap<String, String>>> = RwLock::new(None);

/// The key authorization for a challenge path, while its order runs.
pub(crate) fn challenge_answer(path: &str) -> Option<String> {
    let token = path.strip_prefix(CHALLENGE_PREFIX)?;
    let tokens = TOKENS.read().ok()?;
    tokens.as_ref()?.get(token).cloned()
}

fn set_token(token: &str, value: Option<String>) {
    let mut tokens = TOKENS.write().unwrap_or_else(|p| p.into_inner());
    let tokens = tokens.get_or_insert_with(HashMap::new);
    match value {
        Some(v) => tokens.insert(token.to_string(), v),
        None => tokens.remove(token),
    };
}

/// The certificates to manage, sent to the manager's thread at each configuration.
static MANAGER: OnceLock<Mutex<mpsc::Sender<Vec<Acme>>>> = OnceLock::new();

/// Make sure every ACME listener of `config` has certificate files (a self-signed stand-in
/// until the first certificate is issued) and hand the list to the manager's thread (started
/// on first use).
pub(crate) fn configure(config: &Config) -> std::io::Result<()> {
    let specs: Vec<Acme> = config
        .listeners
        .iter()
        .filter_map(|l| l.acme.clone())
        .collect();
    for a in &specs {
        stand_in(a)?;
    }
    if specs.is_empty() && MANAGER.get().is_none() {
        return Ok(());
    }
    let tx = match MANAGER.get() {
        Some(tx) => tx,
        None => {
            let (tx, rx) = mpsc::channel();
            std::thread::Builder::new()
                .name("portico-acme".into())
                .spawn(move || run(rx))?;
            MANAGER.get_or_init(|| Mutex::new(tx))
        }
    };
    let tx = tx.lock().unwrap_or_else(|p| p.into_inner());
    let _ = tx.send(specs);
    Ok(())
}

fn files(a: &Acme) -> portico_config::CertificateFiles {
    a.files()
}

/// The marker of a self-signed stand-in: the certificate is ordered at once.
fn stand_in_marker(a: &Acme) -> std::path::PathBuf {
    files(a).cert.with_extension("stand-in")
}

/// Writes `data` to `path` through a temporary file and a rename, with `mode`.
fn write_file(path: &Path, data: &[u8], mode: u32) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// A self-signed certificate for the names while none was issued yet (handshakes work, with a
/// certificate no client trusts, until the ACME server answers).
fn stand_in(a: &Acme) -> std::io::Result<()> {
    std::fs::create_dir_all(&a.storage)?;
    std::fs::set_permissions(&a.storage, std::fs::Permissions::from_mode(0o700))?;
    let f = files(a);
    if f.cert.exists() && f.key.exists() {
        return Ok(());
    }
    let other = |e: rcgen::Error| std::io::Error::other(e.to_string());
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(other)?;
    let params = rcgen::CertificateParams::new(a.names.clone()).map_err(other)?;
    let cert = params.self_signed(&key).map_err(other)?;
    write_file(&f.key, key.serialize_pem().as_bytes(), 0o600)?;
    write_file(&f.cert, cert.pem().as_bytes(), 0o644)?;
    write_file(&stand_in_marker(a), b"", 0o600)?;
    tracing::warn!(
        "acme: no certificate for {} yet: serving a self-signed one until {} issues it",
        a.names.join(", "),
        a.directory
    );
    Ok(())
}

/// When the certificate of `a` is due: now for a stand-in or an unreadable file, else at two
/// thirds of its lifetime (less up to 1% of it, at random, so that many names spread out).
fn due(a: &Acme, now: SystemTime) -> SystemTime {
    if stand_in_marker(a).exists() {
        return now;
    }
    let Some((not_before, not_after)) = validity(&files(a).cert) else {
        return now;
    };
    let life = not_after.duration_since(not_before).unwrap_or_default();
    let jitter = life.mul_f64(fastrand::f64() / 100.0);
    (not_before + life.mul_f64(2.0 / 3.0))
        .checked_sub(jitter)
        .unwrap_or(now)
}

/// The validity of the first certificate in a PEM file.
fn validity(path: &Path) -> Option<(SystemTime, SystemTime)> {
    let pem = std::fs::read(path).ok()?;
    let (_, p) = x509_parser::pem::parse_x509_pem(&pem).ok()?;
    let cert = p.parse_x509().ok()?;
    let v = cert.validity();
    let at = |t: i64| Some(SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(t).ok()?));
    Some((at(v.not_before.timestamp())?, at(v.not_after.timestamp())?))
}

/// The manager's thread: orders each certificate when it is due, retrying with backoff.
fn run(rx: mpsc::Receiver<Vec<Acme>>) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("acme: cannot start: {e}");
            return;
        }
    };
    let mut specs: Vec<Acme> = Vec::new();
    // Failures in a row per certificate (by its first name) and when to try again.
    let mut failures: HashMap<String, (u32, SystemTime)> = HashMap::new();
    loop {
        let now = SystemTime::now();
        let mut next = now + Duration::from_secs(3600);
        for a in &specs {
            let name = a.names[0].clone();
            let at = match failures.get(&name) {
                Some((_, retry)) => *retry,
                None => due(a, now),
            };
            if at > now {
                next = next.min(at);
                continue;
            }
            tracing::info!(
                "acme: ordering a certificate for {} from {}",
                a.names.join(", "),
                a.directory
            );
            match rt.block_on(issue(a)) {
                Ok(()) => {
                    failures.remove(&name);
                    tracing::info!(
                        "acme: certificate for {} issued by {}",
                        a.names.join(", "),
                        a.directory
                    );
                    next = next.min(due(a, SystemTime::now()));
                }
                Err(e) => {
                    let n = failures.get(&name).map_or(1, |(n, _)| n + 1);
                    // 1 minute, doubling, at most 6 hours.
                    let wait = Duration::from_secs(60 << n.min(9).saturating_sub(1))
                        .min(Duration::from_secs(6 * 3600));
                    let retry = SystemTime::now() + wait;
                    let left = validity(&files(a).cert)
                        .and_then(|(_, end)| end.duration_since(SystemTime::now()).ok())
                        .unwrap_or_default();
                    if left < Duration::from_secs(7 * 86400) && !stand_in_marker(a).exists() {
                        tracing::error!("acme: renewing the certificate for {} failed ({e}); it expires in {} hours; next try in {} s", a.names.join(", "), left.as_secs() / 3600, wait.as_secs());
                    } else {
                        tracing::warn!(
                            "acme: ordering a certificate for {} failed: {e}; next try in {} s",
                            a.names.join(", "),
                            wait.as_secs()
                        );
                    }
                    failures.insert(name, (n, retry));
                    next = next.min(retry);
                }
            }
        }
        let wait = next.duration_since(SystemTime::now()).unwrap_or_default();
        match rx.recv_timeout(wait) {
            Ok(new) => {
                specs = new;
                while let Ok(newer) = rx.try_recv() {
                    specs = newer;
                }
                failures.retain(|name, _| specs.iter().any(|a| &a.names[0] == name));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// The account for `a`'s directory: read from the storage, else created and saved there.
async fn account(a: &Acme) -> Result<instant_acme::Account, String> {
    use instant_acme::{Account, AccountCredentials, NewAccount};
    let err = |e: instant_acme::Error| e.to_string();
    let builder = || match &a.directory_ca {
        Some(ca) => Account::builder_with_root(ca).map_err(err),
        None => Account::builder().map_err(err),
    };
    // One account file per directory.
    let tag = a.directory.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let path = a.storage.join(format!("account-{tag:016x}.json"));
    if let Ok(text) = std::fs::read(&path) {
        if let Ok(creds) = serde_json::from_slice::<AccountCredentials>(&text) {
            return builder()?.from_credentials(creds).await.map_err(err);
        }
    }
    let contact: Vec<&str> = a.contact.iter().map(String::as_str).collect();
    let new = NewAccount {
        contact: &contact,
        terms_of_service_agreed: true,
        only_return_existing: false,
    };
    let (account, creds) = builder()?
        .create(&new, a.directory.clone(), None)
        .await
        .map_err(err)?;
    let text = serde_json::to_vec(&creds).map_err(|e| e.to_string())?;
    write_file(&path, &text, 0o600).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(account)
}

/// Order the certificate of `a` with HTTP-01 challenges and write it with a new key.
async fn issue(a: &Acme) -> Result<(), String> {
    use instant_acme::{
        AuthorizationStatus, ChallengeType, Identifier, NewOrder, OrderStatus, RetryPolicy,
    };
    let err = |e: instant_acme::Error| e.to_string();
    let account = account(a).await?;
    let ids: Vec<Identifier> = a.names.iter().cloned().map(Identifier::Dns).collect();
    let mut order = account.new_order(&NewOrder::new(&ids)).await.map_err(err)?;
    let mut tokens = Vec::new();
    let result = async {
        let mut authorizations = order.authorizations();
        while let Some(authz) = authorizations.next().await {
            let mut authz = authz.map_err(err)?;
            match authz.status {
                AuthorizationStatus::Pending => {}
                AuthorizationStatus::Valid => continue,
                other => return Err(format!("an authorization is {other:?}")),
            }
            let mut challenge = authz
                .challenge(ChallengeType::Http01)
                .ok_or("the server offers no http-01 challenge")?;
            let token = challenge.token.clone();
            set_token(
                &token,
                Some(challenge.key_authorization().as_str().to_string()),
            );
            tokens.push(token);
            challenge.set_ready().await.map_err(err)?;
        }
        let retries = RetryPolicy::default();
        match order.poll_ready(&retries).await.map_err(err)? {
            OrderStatus::Ready => Ok(()),
            other => Err(format!("the order is {other:?} after its challenges")),
        }
    }
    .await;
    for t in &tokens {
        set_token(t, None);
    }
    result?;
    let other = |e: rcgen::Error| e.to_string();
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(other)?;
    let params = rcgen::CertificateParams::new(a.names.clone()).map_err(other)?;
    let csr = params.serialize_request(&key).map_err(other)?;
    order.finalize_csr(csr.der()).await.map_err(err)?;
    let chain = order
        .poll_certificate(&RetryPolicy::default())
        .await
        .map_err(err)?;
    let f = files(a);
    let io = |e: std::io::Error| e.to_string();
    write_file(&f.key, key.serialize_pem().as_bytes(), 0o600).map_err(io)?;
    write_file(&f.cert, chain.as_bytes(), 0o644).map_err(io)?;
    let _ = std::fs::remove_file(stand_in_marker(a));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(dir: &Path) -> Acme {
        Acme {
            names: vec!["a.example".into(), "b.example".into()],
            contact: vec![],
            directory: "https://127.0.0.1:1/dir".into(),
            directory_ca: None,
            storage: dir.join("acme"),
        }
    }

    #[test]
    fn a_stand_in_is_written_once_and_ordered_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let a = spec(dir.path());
        stand_in(&a).unwrap();
        let f = files(&a);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&f.key), 0o600);
        assert_eq!(mode(&a.storage), 0o700);
        let now = SystemTime::now();
        assert_eq!(due(&a, now), now);
        // Files that exist are never replaced by a stand-in.
        let before = std::fs::read(&f.cert).unwrap();
        stand_in(&a).unwrap();
        assert_eq!(std::fs::read(&f.cert).unwrap(), before);
    }

    #[test]
    fn an_issued_certificate_is_due_at_two_thirds_of_its_lifetime() {
        let dir = tempfile::tempdir().unwrap();
        let a = spec(dir.path());
        std::fs::create_dir_all(&a.storage).unwrap();
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(a.names.clone()).unwrap();
        params.not_before = rcgen::date_time_ymd(2026, 1, 1);
        params.not_after = rcgen::date_time_ymd(2026, 4, 1);
        let cert = params.self_signed(&key).unwrap();
        std::fs::write(files(&a).cert, cert.pem()).unwrap();
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600); // 2026-01-01
        let life = Duration::from_secs(90 * 86400);
        let two_thirds = start + life.mul_f64(2.0 / 3.0);
        let at = due(&a, SystemTime::now());
        assert!(at <= two_thirds && at >= two_thirds - life / 100, "{at:?}");
    }

    #[test]
    fn challenges_are_answered_while_their_order_runs() {
        set_token("tok-123", Some("tok-123.thumb".into()));
        let path = format!("{CHALLENGE_PREFIX}tok-123");
        assert_eq!(challenge_answer(&path).as_deref(), Some("tok-123.thumb"));
        assert_eq!(challenge_answer("/tok-123"), None);
        set_token("tok-123", None);
        assert_eq!(challenge_answer(&path), None);
    }
}
