//! Certificates from an ACME server (RFC 8555): a self-signed stand-in until the first one is issued, HTTP-01 answers on every listener, orders and renewals on a thread of their own; the files it writes are the listener's certificate files, which the certificate watcher loads.

use portico_config::{Acme, Config};
use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::{mpsc, Mutex, RwLock};
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
static MANAGER: Mutex<Option<mpsc::Sender<Vec<Acme>>>> = Mutex::new(None);

fn specs(config: &Config) -> Vec<Acme> {
    let listeners = config.listeners.iter();
    listeners.filter_map(|l| l.acme.clone()).collect()
}

/// Make sure every ACME listener of `config` has certificate files (a self-signed stand-in
/// until the first certificate is issued): before its TLS settings load them.
pub(crate) fn prepare(config: &Config) -> std::io::Result<()> {
    for a in &specs(config) {
        stand_in(a).map_err(|e| {
            let m = format!("{}: {e}", a.storage.display());
            std::io::Error::new(e.kind(), m)
        })?;
    }
    Ok(())
}

/// Hand the certificates of an applied `config` to the manager's thread (started on first use,
/// and again if it died).
pub(crate) fn manage(config: &Config) {
    let specs = specs(config);
    let mut manager = MANAGER.lock().unwrap_or_else(|p| p.into_inner());
    if specs.is_empty() && manager.is_none() {
        return;
    }
    let specs = match manager.as_ref() {
        Some(tx) => match tx.send(specs) {
            Ok(()) => return,
            Err(mpsc::SendError(specs)) => specs,
        },
        None => specs,
    };
    let (tx, rx) = mpsc::channel();
    let started = std::thread::Builder::new()
        .name("portico-acme".into())
        .spawn(move || run(rx));
    if let Err(e) = started {
        tracing::error!("acme: cannot start the certificate manager: {e}");
        return;
    }
    let _ = tx.send(specs);
    *manager = Some(tx);
}

/// What the certificate in the files was issued for: written with it, compared with the
/// configuration (a new name, another directory: ordered again at once).
#[derive(serde::Serialize, serde::Deserialize, PartialEq, Eq)]
struct Issued {
    directory: String,
    names: Vec<String>,
}

fn issued_path(a: &Acme) -> std::path::PathBuf {
    a.files().cert.with_extension("json")
}

fn issued_for(a: &Acme) -> Issued {
    Issued {
        directory: a.directory.clone(),
        names: a.names.clone(),
    }
}

/// A temporary file next to `path`, created with `mode` (never an existing file or a link),
/// holding `data`.
fn temp_file(path: &Path, data: &[u8], mode: u32) -> std::io::Result<std::path::PathBuf> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.tmp-{:016x}", fastrand::u64(..)));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)?;
    f.set_permissions(std::fs::Permissions::from_mode(mode))?;
    let written = f.write_all(data).and_then(|()| f.sync_all());
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(tmp)
}

/// `data` in `path` with `mode`, through a temporary file and a rename.
fn write_file(path: &Path, data: &[u8], mode: u32) -> std::io::Result<()> {
    let tmp = temp_file(path, data, mode)?;
    std::fs::rename(&tmp, path)
}

/// A key and its certificate: both written to temporary files first, then renamed one right
/// after the other (the watcher sees a mismatched pair for as short a time as can be).
fn write_pair(a: &Acme, key: &[u8], cert: &[u8]) -> std::io::Result<()> {
    let f = a.files();
    let key_tmp = temp_file(&f.key, key, 0o600)?;
    let cert_tmp = match temp_file(&f.cert, cert, 0o644) {
        Ok(t) => t,
        Err(e) => {
            let _ = std::fs::remove_file(&key_tmp);
            return Err(e);
        }
    };
    std::fs::rename(&key_tmp, &f.key)?;
    std::fs::rename(&cert_tmp, &f.cert)
}

/// A self-signed certificate for the names while none was issued yet (handshakes work, with a
/// certificate no client trusts, until the ACME server answers).
fn stand_in(a: &Acme) -> std::io::Result<()> {
    if !a.storage.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&a.storage)?;
    }
    let f = a.files();
    if f.cert.exists() && f.key.exists() {
        return Ok(());
    }
    let other = |e: rcgen::Error| std::io::Error::other(e.to_string());
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(other)?;
    let params = rcgen::CertificateParams::new(a.names.clone()).map_err(other)?;
    let cert = params.self_signed(&key).map_err(other)?;
    let _ = std::fs::remove_file(issued_path(a));
    write_pair(a, key.serialize_pem().as_bytes(), cert.pem().as_bytes())?;
    tracing::warn!(
        "acme: no certificate for {} yet: serving a self-signed one until {} issues it",
        a.names.join(", "),
        a.directory
    );
    Ok(())
}

/// When the certificate of `a` is due: now for a stand-in, a certificate issued for other names
/// or by another directory, or an unreadable file, else at two thirds of its lifetime (less up to 1% of it, at random, so that many names spread out).
fn due(a: &Acme, now: SystemTime) -> SystemTime {
    // A stand-in, or a certificate for other names or from another directory.
    let issued = std::fs::read(issued_path(a)).ok();
    let issued = issued.and_then(|t| serde_json::from_slice::<Issued>(&t).ok());
    if issued != Some(issued_for(a)) {
        return now;
    }
    let Some((not_before, not_after)) = validity(&a.files().cert) else {
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
    // Per certificate (by its first name): its settings, failures in a row and when to try
    // again (also a floor after an issuance that did not make it due later).
    let mut waits: HashMap<String, (Acme, u32, SystemTime)> = HashMap::new();
    loop {
        let now = SystemTime::now();
        let mut next = now + Duration::from_secs(3600);
        for a in &specs {
            let name = a.names[0].clone();
            let at = match waits.get(&name) {
                Some((_, _, retry)) => *retry,
                None => due(a, now),
            };
            if at > now {
                next = next.min(at);
                continue;
            }
            let names = a.names.join(", ");
            tracing::info!(
                "acme: ordering a certificate for {names} from {}",
                a.directory
            );
            let order = async { tokio::time::timeout(ORDER_TIMEOUT, issue(a)).await };
            let result = match rt.block_on(order) {
                Ok(r) => r,
                Err(_) => Err(format!(
                    "no certificate within {} s",
                    ORDER_TIMEOUT.as_secs()
                )),
            };
            let failures = waits.get(&name).map_or(0, |(_, n, _)| *n);
            match result {
                Ok(()) => {
                    tracing::info!("acme: certificate for {names} issued by {}", a.directory);
                    let again = due(a, SystemTime::now());
                    if again <= SystemTime::now() {
                        // Not due later (an unreadable chain, a clock far ahead): not again
                        // before an hour.
                        let retry = SystemTime::now() + Duration::from_secs(3600);
                        waits.insert(name, (a.clone(), failures, retry));
                        next = next.min(retry);
                    } else {
                        waits.remove(&name);
                        next = next.min(again);
                    }
                }
                Err(e) => {
                    let n = failures + 1;
                    // 1 minute, doubling, at most 6 hours.
                    let wait = Duration::from_secs(60 << n.min(10).saturating_sub(1))
                        .min(Duration::from_secs(6 * 3600));
                    let retry = SystemTime::now() + wait;
                    let issued = std::fs::read(issued_path(a)).is_ok();
                    let left = validity(&a.files().cert)
                        .and_then(|(_, end)| end.duration_since(SystemTime::now()).ok())
                        .unwrap_or_default();
                    if issued && left < Duration::from_secs(7 * 86400) {
                        tracing::error!("acme: renewing the certificate for {names} failed ({e}); it expires in {} hours; next try in {} s", left.as_secs() / 3600, wait.as_secs());
                    } else {
                        tracing::warn!(
                            "acme: ordering a certificate for {names} failed: {e}; next try in {} s",
                            wait.as_secs()
                        );
                    }
                    waits.insert(name, (a.clone(), n, retry));
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
                // A certificate whose settings changed starts afresh.
                waits.retain(|name, (old, _, _)| {
                    specs.iter().any(|a| &a.names[0] == name && a == old)
                });
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// The longest an order may take, from the account to the certificate.
const ORDER_TIMEOUT: Duration = Duration::from_secs(300);

/// The HTTP-01 tokens of one order, answered while it lives (whatever way it ends).
struct Tokens(Vec<String>);

impl Drop for Tokens {
    fn drop(&mut self) {
        for t in &self.0 {
            set_token(t, None);
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
    let tag = portico_config::hash::hash64(a.directory.as_bytes());
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
    let mut tokens = Tokens(Vec::new());
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
        tokens.0.push(token);
        challenge.set_ready().await.map_err(err)?;
    }
    let retries = RetryPolicy::default();
    match order.poll_ready(&retries).await.map_err(err)? {
        OrderStatus::Ready => {}
        other => return Err(format!("the order is {other:?} after its challenges")),
    }
    drop(tokens);
    let key =
        rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|e| e.to_string())?;
    let csr = request(&a.names, &key)?;
    order.finalize_csr(&csr).await.map_err(err)?;
    let chain = order
        .poll_certificate(&RetryPolicy::default())
        .await
        .map_err(err)?;
    let io = |e: std::io::Error| e.to_string();
    write_pair(a, key.serialize_pem().as_bytes(), chain.as_bytes()).map_err(io)?;
    let issued = serde_json::to_vec(&issued_for(a)).map_err(|e| e.to_string())?;
    write_file(&issued_path(a), &issued, 0o644).map_err(io)?;
    Ok(())
}

/// The certificate request for `names` with `key`: the names as DNS alternative names and an
/// empty subject (a CA such as Let's Encrypt refuses a request whose common name is not one of
/// the names).
fn request(names: &[String], key: &rcgen::KeyPair) -> Result<Vec<u8>, String> {
    let other = |e: rcgen::Error| e.to_string();
    let mut params = rcgen::CertificateParams::new(names.to_vec()).map_err(other)?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    let csr = params.serialize_request(key).map_err(other)?;
    Ok(csr.der().to_vec())
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
        let f = a.files();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&f.key), 0o600);
        assert_eq!(mode(&a.storage), 0o700);
        // No temporary files left behind.
        assert_eq!(std::fs::read_dir(&a.storage).unwrap().count(), 2);
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
        std::fs::write(a.files().cert, cert.pem()).unwrap();
        let now = SystemTime::now();
        // Not known to be issued for these settings: due at once.
        assert_eq!(due(&a, now), now);
        let issued = serde_json::to_vec(&issued_for(&a)).unwrap();
        std::fs::write(issued_path(&a), issued).unwrap();
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600); // 2026-01-01
        let life = Duration::from_secs(90 * 86400);
        let two_thirds = start + life.mul_f64(2.0 / 3.0);
        let at = due(&a, now);
        assert!(at <= two_thirds && at >= two_thirds - life / 100, "{at:?}");
        // Another directory (staging to production) or another name: due at once.
        let production = Acme {
            directory: "https://acme.example/dir".into(),
            ..a.clone()
        };
        assert_eq!(due(&production, now), now);
        let mut more = a.clone();
        more.names.push("c.example".into());
        assert_eq!(due(&more, now), now);
    }

    #[test]
    fn the_certificate_request_names_only_the_names() {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let der = request(&["a.example".into(), "b.example".into()], &key).unwrap();
        use x509_parser::prelude::FromDer;
        let (_, csr) =
            x509_parser::certification_request::X509CertificationRequest::from_der(&der).unwrap();
        assert_eq!(csr.certification_request_info.subject.iter().count(), 0);
        let text = format!(
            "{:?}",
            csr.requested_extensions().unwrap().collect::<Vec<_>>()
        );
        assert!(
            text.contains("a.example") && text.contains("b.example"),
            "{text}"
        );
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
