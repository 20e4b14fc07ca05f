//! Certificates from an ACME server (RFC 8555): a self-signed stand-in until the first is issued, HTTP-01, TLS-ALPN-01 and DNS-01 challenges, renewal when the server's renewal information (RFC 9773) or two thirds of the lifetime says, a lock shared by the processes of one storage, each certificate's state for the admin API and metrics; orders run on a thread of their own and write the listener's certificate files, which the certificate watcher loads.

use portico_config::{Acme, AcmeChallenge, AcmeKey, Config};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

/// Where an HTTP-01 challenge is fetched.
pub(crate) const CHALLENGE_PREFIX: &str = "/.well-known/acme-challenge/";

/// HTTP-01 key authorizations by token while this process's orders run.
static TOKENS: RwLock<Option<HashMap<String, String>>> = RwLock::new(None);

/// The challenge directories of the storages with HTTP-01 certificates: tokens written there by
/// another process sharing a storage (an upgrade's two processes, instances behind one port)
/// are answered too. Read by a thread of their own into [`SHARED`]: a request never touches the
/// disk.
static CHALLENGE_DIRS: RwLock<Vec<PathBuf>> = RwLock::new(Vec::new());

/// The tokens found in [`CHALLENGE_DIRS`] at the last look, with their key authorizations.
static SHARED: RwLock<Option<HashMap<String, String>>> = RwLock::new(None);

/// How often the challenge directories are read.
const SHARED_EVERY: Duration = Duration::from_millis(250);

/// How long an order waits after writing its HTTP-01 tokens before the server is told to look:
/// other processes sharing the storage read them within [`SHARED_EVERY`].
const SHARED_SETTLE: Duration = Duration::from_secs(1);

/// The biggest token file read (a key authorization is about 90 bytes).
const TOKEN_FILE_MAX: u64 = 1024;

/// A token as ACME makes them (base64url, RFC 8555 8.1): nothing else names a file.
fn valid_token(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= 256
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The key authorization for a challenge path, while its order runs (in this process, or in
/// another one writing to a storage of this configuration). Memory only.
pub(crate) fn challenge_answer(path: &str) -> Option<String> {
    let token = path.strip_prefix(CHALLENGE_PREFIX)?;
    if !valid_token(token) {
        return None;
    }
    let look = |map: &RwLock<Option<HashMap<String, String>>>| {
        let map = map.read().ok()?;
        map.as_ref()?.get(token).cloned()
    };
    look(&TOKENS).or_else(|| look(&SHARED))
}

/// The tokens of `dirs`: regular files (not links) named as tokens, small, in UTF-8.
fn read_shared(dirs: &[PathBuf]) -> HashMap<String, String> {
    let mut found = HashMap::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(token) = name.to_str().filter(|t| valid_token(t)) else {
                continue;
            };
            // `DirEntry::metadata` does not follow a link.
            let small_file = e
                .metadata()
                .is_ok_and(|m| m.is_file() && m.len() <= TOKEN_FILE_MAX);
            let text = small_file.then(|| std::fs::read(e.path()).ok()).flatten();
            if let Some(text) = text.and_then(|t| String::from_utf8(t).ok()) {
                found.insert(token.to_string(), text.trim().to_string());
            }
        }
    }
    found
}

/// The thread that reads the challenge directories into [`SHARED`], started with the first
/// configuration that has one.
fn watch_shared() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let started = std::thread::Builder::new()
            .name("portico-acme-tokens".into())
            .spawn(|| loop {
                let dirs = CHALLENGE_DIRS.read().map(|d| d.clone()).unwrap_or_default();
                let found = (!dirs.is_empty()).then(|| read_shared(&dirs));
                *SHARED.write().unwrap_or_else(|p| p.into_inner()) = found;
                std::thread::sleep(SHARED_EVERY);
            });
        if let Err(e) = started {
            tracing::error!("acme: cannot start reading the challenge directories: {e}");
        }
    });
}

fn set_token(token: &str, value: Option<String>) {
    let mut tokens = TOKENS.write().unwrap_or_else(|p| p.into_inner());
    let tokens = tokens.get_or_insert_with(HashMap::new);
    match value {
        Some(v) => tokens.insert(token.to_string(), v),
        None => tokens.remove(token),
    };
}

fn challenges_dir(a: &Acme) -> PathBuf {
    a.storage.join("challenges")
}

/// What the manager's thread is told.
enum Msg {
    /// The certificates of an applied configuration.
    Specs(Vec<Acme>),
    /// Order these certificates (by [`key`]) now: asked at that time.
    Renew(Vec<String>, SystemTime),
}

/// The manager's thread, started on first use.
static MANAGER: Mutex<Option<mpsc::Sender<Msg>>> = Mutex::new(None);

/// One certificate's state, for the admin API, `/metrics` and the dashboard.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(crate) struct Status {
    pub names: Vec<String>,
    /// The storage directory (two may hold certificates for the same names).
    pub storage: String,
    pub directory: String,
    pub challenge: &'static str,
    /// A certificate from the directory is served (not the stand-in).
    pub issued: bool,
    pub issuer: Option<String>,
    /// When the issued certificate expires (Unix seconds; None for the stand-in).
    pub not_after: Option<u64>,
    /// When it is ordered next (unix seconds), and why then.
    pub next_renewal: Option<u64>,
    pub renewal_basis: &'static str,
    /// An order runs now.
    pub ordering: bool,
    /// The last failed order's error and when it ended (unix seconds); cleared by an issuance.
    pub last_error: Option<String>,
    pub last_error_at: Option<u64>,
    /// Failed orders in a row.
    pub failures: u32,
    /// Orders that ended with a certificate, and that failed, since the process started.
    pub issued_total: u64,
    pub failed_total: u64,
}

/// Every managed certificate's state by its [`key`].
static STATUS: RwLock<BTreeMap<String, Status>> = RwLock::new(BTreeMap::new());

/// The managed certificates' states.
pub(crate) fn status() -> Vec<Status> {
    let all = STATUS.read().unwrap_or_else(|p| p.into_inner());
    all.values().cloned().collect()
}

/// What names one managed certificate: its file (two storages may hold the same names).
fn key(a: &Acme) -> String {
    a.files().cert.display().to_string()
}

fn update(a: &Acme, f: impl FnOnce(&mut Status)) {
    let mut all = STATUS.write().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = all.get_mut(&key(a)) {
        f(s);
    }
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Ask for the certificates covering `name` (every one when None) to be ordered now; returns
/// their first names.
pub(crate) fn renew(name: Option<&str>) -> Result<Vec<String>, String> {
    let (wanted, firsts): (Vec<String>, Vec<String>) = {
        let all = STATUS.read().unwrap_or_else(|p| p.into_inner());
        let name = name.map(str::to_ascii_lowercase);
        all.iter()
            .filter(|(_, s)| name.as_ref().is_none_or(|n| covers(&s.names, n)))
            .map(|(key, s)| (key.clone(), s.names[0].clone()))
            .unzip()
    };
    if wanted.is_empty() {
        return Err(match name {
            Some(n) => format!("no ACME certificate covers {n:?}"),
            None => "no certificate is obtained by ACME".to_string(),
        });
    }
    let manager = MANAGER.lock().unwrap_or_else(|p| p.into_inner());
    let sent = manager
        .as_ref()
        .is_some_and(|tx| tx.send(Msg::Renew(wanted, SystemTime::now())).is_ok());
    match sent {
        true => Ok(firsts),
        false => Err("the certificate manager is not running".to_string()),
    }
}

/// Whether a certificate for `names` is valid for `name` (itself, or under a `*.` wildcard
/// one label deep).
fn covers(names: &[String], name: &str) -> bool {
    names.iter().any(|n| match n.strip_prefix("*.") {
        Some(base) => name
            .strip_suffix(base)
            .and_then(|l| l.strip_suffix('.'))
            .is_some_and(|label| !label.is_empty() && !label.contains('.')),
        None => n == name,
    })
}

/// The certificates of `config`, once each (listeners may share one: validation makes sure
/// they order it the same way).
fn specs(config: &Config) -> Vec<Acme> {
    let mut specs: Vec<Acme> = Vec::new();
    for a in config.listeners.iter().filter_map(|l| l.acme.as_ref()) {
        if !specs.iter().any(|b| b.files() == a.files()) {
            specs.push(a.clone());
        }
    }
    specs
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
    let mut dirs: Vec<PathBuf> = specs
        .iter()
        .filter(|a| a.challenge == AcmeChallenge::Http01)
        .map(challenges_dir)
        .collect();
    dirs.sort();
    dirs.dedup();
    if !dirs.is_empty() {
        watch_shared();
    }
    *CHALLENGE_DIRS.write().unwrap_or_else(|p| p.into_inner()) = dirs;
    {
        let mut all = STATUS.write().unwrap_or_else(|p| p.into_inner());
        all.retain(|k, s| {
            specs
                .iter()
                .any(|a| key(a) == *k && a.names == s.names && a.directory == s.directory)
        });
        for a in &specs {
            all.entry(key(a)).or_insert_with(|| Status {
                names: a.names.clone(),
                storage: a.storage.display().to_string(),
                directory: a.directory.clone(),
                challenge: a.challenge.name(),
                renewal_basis: "not looked at yet",
                ..Status::default()
            });
        }
    }
    let mut manager = MANAGER.lock().unwrap_or_else(|p| p.into_inner());
    if specs.is_empty() && manager.is_none() {
        return;
    }
    let specs = match manager.as_ref() {
        Some(tx) => match tx.send(Msg::Specs(specs)) {
            Ok(()) => return,
            Err(mpsc::SendError(Msg::Specs(specs))) => specs,
            Err(_) => return,
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
    let _ = tx.send(Msg::Specs(specs));
    *manager = Some(tx);
}

/// What the certificate in the files was issued for: written with it, compared with the
/// configuration (a new name, another directory, key type or profile: ordered again at once).
#[derive(serde::Serialize, serde::Deserialize, PartialEq, Eq)]
struct Issued {
    directory: String,
    names: Vec<String>,
    #[serde(default = "default_key_type")]
    key_type: String,
    #[serde(default)]
    profile: Option<String>,
}

fn default_key_type() -> String {
    AcmeKey::EcdsaP256.name().to_string()
}

fn issued_path(a: &Acme) -> PathBuf {
    a.files().cert.with_extension("json")
}

fn issued_for(a: &Acme) -> Issued {
    Issued {
        directory: a.directory.clone(),
        names: a.names.clone(),
        key_type: a.key_type.name().to_string(),
        profile: a.profile.clone(),
    }
}

/// A temporary file next to `path`, created with `mode` (never an existing file or a link),
/// holding `data`.
fn temp_file(path: &Path, data: &[u8], mode: u32) -> std::io::Result<PathBuf> {
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

/// How long a start waits for another process's lock to write a stand-in.
const STAND_IN_WAIT: Duration = Duration::from_secs(10);

/// A self-signed certificate for the names while none was issued yet: served (a certificate no
/// client trusts) or refused by the listener, as configured, until the ACME server answers.
fn stand_in(a: &Acme) -> std::io::Result<()> {
    if !a.storage.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&a.storage)?;
    }
    let f = a.files();
    // Under the storage's lock: processes starting together write one stand-in, not two
    // halves of two (a key that does not match the certificate).
    let start = Instant::now();
    let _lock = loop {
        if f.cert.exists() && f.key.exists() {
            return Ok(());
        }
        match lock(a)? {
            Some(l) => break l,
            None if start.elapsed() < STAND_IN_WAIT => {
                std::thread::sleep(Duration::from_millis(20));
            }
            None => {
                let m = format!(
                    "its lock is held by another process for more than {} s",
                    STAND_IN_WAIT.as_secs()
                );
                return Err(std::io::Error::other(m));
            }
        }
    };
    if f.cert.exists() && f.key.exists() {
        return Ok(());
    }
    let other = |e: rcgen::Error| std::io::Error::other(e.to_string());
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(other)?;
    let mut params = rcgen::CertificateParams::new(a.names.clone()).map_err(other)?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, portico_tls::acme::STAND_IN_CN);
    let cert = params.self_signed(&key).map_err(other)?;
    let _ = std::fs::remove_file(issued_path(a));
    write_pair(a, key.serialize_pem().as_bytes(), cert.pem().as_bytes())?;
    let until = match a.refuse_unissued {
        true => "handshakes are refused",
        false => "a self-signed one is served",
    };
    tracing::warn!(
        "acme: no certificate for {} yet: {until} until {} issues it",
        a.names.join(", "),
        a.directory
    );
    Ok(())
}

/// The issued certificate in the files of `a`: None for a stand-in, a certificate issued for
/// other names, directory, key type or profile, or an unreadable file (all due at once).
fn issued_cert(a: &Acme) -> Option<portico_tls::StoredCertificate> {
    let issued = std::fs::read(issued_path(a)).ok()?;
    let issued = serde_json::from_slice::<Issued>(&issued).ok()?;
    if issued != issued_for(a) {
        return None;
    }
    portico_tls::stored_certificate(&a.files().cert).filter(|s| !s.stand_in)
}

/// Two thirds into the certificate's lifetime, less up to 1% of it (the same share for the
/// same names, so that many certificates spread out and a schedule stays put).
fn two_thirds(a: &Acme, c: &portico_tls::StoredCertificate) -> SystemTime {
    let life = c.not_after.duration_since(c.not_before).unwrap_or_default();
    let share = (portico_config::hash::hash64(a.names.join(",").as_bytes()) % 1000) as f64;
    let jitter = life.mul_f64(share / 100_000.0);
    (c.not_before + life.mul_f64(2.0 / 3.0))
        .checked_sub(jitter)
        .unwrap_or(c.not_before)
}

/// The certificate's identifier for renewal information (RFC 9773 4.1): base64url of the
/// authority key identifier and of the serial, joined by a dot.
fn ari_id(c: &portico_tls::StoredCertificate) -> Option<String> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let aki = c.authority_key_id.as_ref()?;
    Some(format!("{}.{}", b64.encode(aki), b64.encode(&c.serial)))
}

/// What the server's renewal information said of one certificate.
#[derive(Debug, Clone, PartialEq)]
enum Ari {
    /// Not asked yet (or the certificate changed).
    Unknown,
    /// The directory has no renewal information: two thirds of the lifetime.
    Unsupported,
    /// Renew at `at` (picked in the window `start`..`end`); ask again at `recheck`.
    Known {
        id: String,
        window: (SystemTime, SystemTime),
        at: SystemTime,
        recheck: SystemTime,
    },
    /// Asking failed: two thirds of the lifetime until `recheck`.
    Failed { id: String, recheck: SystemTime },
}

/// One managed certificate on the manager's thread.
struct Cert {
    spec: Acme,
    /// Failed orders in a row.
    failures: u32,
    /// Not ordered before this time, and why (a failure's backoff, the lock held elsewhere).
    hold: Option<(SystemTime, &'static str)>,
    ari: Ari,
    /// Ordered at once (the admin API asked).
    forced: bool,
    /// When the last order started (a renewal asked before that is answered by it).
    started: Option<SystemTime>,
    /// Since when another process holds the lock, and whether that was logged.
    lock_since: Option<SystemTime>,
    lock_logged: bool,
}

impl Cert {
    fn new(spec: Acme) -> Cert {
        Cert {
            spec,
            failures: 0,
            hold: None,
            ari: Ari::Unknown,
            forced: false,
            started: None,
            lock_since: None,
            lock_logged: false,
        }
    }
}

/// How long asking for renewal information may take.
const ARI_TIMEOUT: Duration = Duration::from_secs(30);

/// When `c` is due and why, asking the server's renewal information when it is time to; not
/// before the [`floor`] of a certificate just issued.
fn schedule(
    rt: &tokio::runtime::Runtime,
    c: &mut Cert,
    now: SystemTime,
) -> (SystemTime, &'static str) {
    let (at, why) = due(rt, c, now);
    match floor(&c.spec) {
        Some(floor) if !c.forced && at < floor && floor > now => (floor, "just issued"),
        _ => (at, why),
    }
}

/// A certificate just issued (by this process or another, before a restart or not) is not
/// ordered again before a tenth of its life has passed since it was written (at least 10 s, at
/// most an hour), whatever the renewal information says (a window already ended, a clock
/// ahead).
fn floor(a: &Acme) -> Option<SystemTime> {
    let cert = issued_cert(a)?;
    let written = std::fs::metadata(issued_path(a)).ok()?.modified().ok()?;
    // A time ahead of the clock (a clock stepped back, a shared filesystem's skew) is no
    // issuance to wait after.
    if written > SystemTime::now() + Duration::from_secs(60) {
        return None;
    }
    let life = cert
        .not_after
        .duration_since(cert.not_before)
        .unwrap_or_default();
    Some(written + (life / 10).clamp(Duration::from_secs(10), Duration::from_secs(3600)))
}

/// When `c` is due and why (see [`schedule`]).
fn due(rt: &tokio::runtime::Runtime, c: &mut Cert, now: SystemTime) -> (SystemTime, &'static str) {
    if c.forced {
        return (now, "asked through the admin API");
    }
    if let Some((until, why)) = c.hold.filter(|(until, _)| *until > now) {
        return (until, why);
    }
    let Some(cert) = issued_cert(&c.spec) else {
        return (now, "not issued yet");
    };
    let lifetime = (two_thirds(&c.spec, &cert), "two thirds of its lifetime");
    let Some(id) = ari_id(&cert) else {
        return lifetime;
    };
    match &c.ari {
        Ari::Unsupported => return lifetime,
        Ari::Known {
            id: i, at, recheck, ..
        } if *i == id && *recheck > now => {
            return (*at, "the server's renewal information");
        }
        Ari::Failed { id: i, recheck } if *i == id && *recheck > now => return lifetime,
        _ => {}
    }
    let asked =
        rt.block_on(async { tokio::time::timeout(ARI_TIMEOUT, renewal_info(&c.spec, &id)).await });
    let names = c.spec.names.join(", ");
    match asked {
        // A window that ends before it starts is no answer (RFC 9773 4.2).
        Ok(Ok(Some((start, end, _)))) if end <= start => {
            tracing::debug!("acme: an invalid renewal window for {names}");
            c.ari = Ari::Failed {
                id,
                recheck: now + Duration::from_secs(3600),
            };
            lifetime
        }
        Ok(Ok(Some((start, end, retry)))) => {
            let same = match &c.ari {
                Ari::Known {
                    id: i, window, at, ..
                } if *i == id && *window == (start, end) => Some(*at),
                _ => None,
            };
            let at = pick((start, end), same, &cert, now);
            // Asked again when the server says (within a minute and a day).
            let recheck = now + retry.clamp(Duration::from_secs(60), Duration::from_secs(86_400));
            if same.is_none() {
                tracing::info!(
                    "acme: the renewal window of the certificate for {names} is {} to {}: renewing at {}",
                    portico_tls::utc_date(unix(start) as i64),
                    portico_tls::utc_date(unix(end) as i64),
                    portico_tls::utc_date(unix(at) as i64),
                );
            }
            c.ari = Ari::Known {
                id,
                window: (start, end),
                at,
                recheck,
            };
            (at, "the server's renewal information")
        }
        Ok(Ok(None)) => {
            c.ari = Ari::Unsupported;
            lifetime
        }
        Ok(Err(e)) => {
            tracing::debug!("acme: no renewal information for {names}: {e}");
            c.ari = Ari::Failed {
                id,
                recheck: now + Duration::from_secs(3600),
            };
            lifetime
        }
        Err(_) => {
            tracing::debug!(
                "acme: no renewal information for {names} within {} s",
                ARI_TIMEOUT.as_secs()
            );
            c.ari = Ari::Failed {
                id,
                recheck: now + Duration::from_secs(3600),
            };
            lifetime
        }
    }
}

/// When to renew `cert` in the server's renewal window: the time picked before when the window
/// is the same (`same`), else one at random in it (RFC 9773 4.2); at once when the window
/// ended; never later than the last tenth of the certificate's life.
fn pick(
    (start, end): (SystemTime, SystemTime),
    same: Option<SystemTime>,
    cert: &portico_tls::StoredCertificate,
    now: SystemTime,
) -> SystemTime {
    if end <= now {
        return now;
    }
    let life = cert
        .not_after
        .duration_since(cert.not_before)
        .unwrap_or_default();
    let latest = cert
        .not_after
        .checked_sub(life / 10)
        .unwrap_or(cert.not_before);
    let span = end.duration_since(start).unwrap_or_default();
    same.unwrap_or_else(|| start + span.mul_f64(fastrand::f64()))
        .min(latest)
        .max(now.min(end))
}

/// The renewal window of the certificate `id` and when to ask again; None when the directory
/// offers no renewal information.
async fn renewal_info(
    a: &Acme,
    id: &str,
) -> Result<Option<(SystemTime, SystemTime, Duration)>, String> {
    let Some((account, _)) = account(a, false).await? else {
        return Err("no account yet".to_string());
    };
    let (aki, serial) = id.split_once('.').ok_or("a malformed identifier")?;
    let cid = instant_acme::CertificateIdentifier {
        authority_key_identifier: aki.into(),
        serial: serial.into(),
    };
    match account.renewal_info(&cid).await {
        Ok((info, retry)) => {
            let at = |t: i64| {
                let secs = u64::try_from(t).unwrap_or(0);
                SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
            };
            let w = info.suggested_window;
            Ok(Some((
                at(w.start.unix_timestamp()),
                at(w.end.unix_timestamp()),
                retry,
            )))
        }
        Err(instant_acme::Error::Unsupported(_)) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// The storage's lock for the certificate of `a` (`NAME.lock`, flock): held while it is
/// ordered, so that processes sharing the storage order it once. None = another one holds it.
fn lock(a: &Acme) -> std::io::Result<Option<std::fs::File>> {
    try_lock(&a.files().cert.with_extension("lock"))
}

/// The lock file at `path` (flock), created 0600 if need be; None = another process holds it.
fn try_lock(path: &Path) -> std::io::Result<Option<std::fs::File>> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)?;
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(file)),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(e) => Err(std::io::Error::from(e)),
    }
}

/// What identifies the files' current certificate (its bytes), to see that another process
/// renewed it while this one waited for the lock.
fn identity(a: &Acme) -> Option<u64> {
    let cert = std::fs::read(a.files().cert).ok()?;
    let issued = std::fs::read(issued_path(a)).unwrap_or_default();
    Some(portico_config::hash::hash64(&[cert, issued].concat()))
}

/// How long to wait when another process holds a certificate's lock.
const LOCK_WAIT: Duration = Duration::from_secs(10);

/// Why a certificate waits: another process holds its lock.
const LOCK_HELD: &str = "another process is ordering it";

/// The manager's thread: orders each certificate when it is due, retrying with backoff.
fn run(rx: mpsc::Receiver<Msg>) {
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
    // By first name, in the configuration's order.
    let mut certs: Vec<Cert> = Vec::new();
    loop {
        let now = SystemTime::now();
        let mut next = now + Duration::from_secs(3600);
        for c in &mut certs {
            let seen = identity(&c.spec);
            let (at, why) = schedule(&rt, c, now);
            show(c, at, why);
            if at > now {
                // The lock's wait counts only while this process waits for it.
                if why != LOCK_HELD {
                    c.lock_since = None;
                    c.lock_logged = false;
                }
                next = next.min(at);
                continue;
            }
            let lock = match lock(&c.spec) {
                Ok(Some(l)) => {
                    c.lock_since = None;
                    c.lock_logged = false;
                    l
                }
                Ok(None) => {
                    let until = SystemTime::now() + LOCK_WAIT;
                    c.hold = Some((until, LOCK_HELD));
                    show(c, until, LOCK_HELD);
                    let since = *c.lock_since.get_or_insert(now);
                    let waited = now.duration_since(since).unwrap_or_default();
                    if waited > longest_hold(&c.spec) && !c.lock_logged {
                        c.lock_logged = true;
                        tracing::warn!(
                            "acme: another process has held the lock of the certificate for {} ({}) for {} s, longer than an order takes: is it stuck?",
                            c.spec.names.join(", "),
                            c.spec.files().cert.with_extension("lock").display(),
                            waited.as_secs()
                        );
                    }
                    next = next.min(until);
                    continue;
                }
                Err(e) => {
                    let e = format!("cannot lock its storage: {e}");
                    next = next.min(failed(c, e));
                    continue;
                }
            };
            // Renewed by another process while this one waited: looked at afresh.
            if !c.forced && identity(&c.spec) != seen {
                c.ari = Ari::Unknown;
                c.lock_since = None;
                c.lock_logged = false;
                next = now;
                continue;
            }
            let until = order(&rt, c);
            drop(lock);
            show(
                c,
                until,
                c.hold.map_or("looked at again now", |(_, why)| why),
            );
            next = next.min(until);
        }
        let wait = next.duration_since(SystemTime::now()).unwrap_or_default();
        let msg = match rx.recv_timeout(wait) {
            Ok(m) => Some(m),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        };
        for m in msg
            .into_iter()
            .chain(std::iter::from_fn(|| rx.try_recv().ok()))
        {
            match m {
                Msg::Specs(specs) => {
                    // A certificate whose settings changed starts afresh, but for the server's
                    // rate limit.
                    let mut old = std::mem::take(&mut certs);
                    for a in specs {
                        let kept = old.iter().position(|c| c.spec.same_order(&a));
                        certs.push(match kept {
                            Some(i) => {
                                let mut c = old.swap_remove(i);
                                c.spec = a;
                                c
                            }
                            None => {
                                let limited = old.iter().find_map(|c| {
                                    let same = c.spec.names[0] == a.names[0]
                                        && c.spec.directory == a.directory;
                                    c.hold.filter(|(_, why)| same && *why == RATE_LIMITED)
                                });
                                let mut c = Cert::new(a);
                                c.hold = limited;
                                c
                            }
                        });
                    }
                }
                Msg::Renew(keys, asked) => {
                    for c in certs.iter_mut().filter(|c| {
                        // An order that started after the request answered it.
                        keys.contains(&key(&c.spec)) && c.started.is_none_or(|t| t < asked)
                    }) {
                        c.forced = true;
                        c.hold = None;
                    }
                }
            }
        }
    }
}

/// What the admin API and the metrics show of `c`, due at `at` for `why`.
fn show(c: &Cert, at: SystemTime, why: &'static str) {
    let stored = portico_tls::stored_certificate(&c.spec.files().cert);
    let issued = issued_cert(&c.spec).is_some();
    update(&c.spec, |s| {
        s.challenge = c.spec.challenge.name();
        s.issued = issued;
        s.issuer = stored.as_ref().map(|c| c.issuer.clone());
        s.not_after = stored
            .as_ref()
            .filter(|_| issued)
            .map(|c| unix(c.not_after));
        s.next_renewal = Some(unix(at));
        s.renewal_basis = why;
        s.failures = c.failures;
    });
}

/// Why a certificate waits for the server's rate limit.
const RATE_LIMITED: &str = "the server's rate limit";

/// The longest an order of `a` may take.
fn order_limit(a: &Acme) -> Duration {
    ORDER_TIMEOUT
        + match &a.challenge {
            AcmeChallenge::Dns01 { delay, .. } => *delay,
            _ => Duration::ZERO,
        }
}

/// The longest another process may hold the lock of `a`'s certificate: an order, its last
/// hook and the DNS-01 cleanups.
fn longest_hold(a: &Acme) -> Duration {
    let cleanups = match a.challenge {
        AcmeChallenge::Dns01 { .. } => CLEANUP_TIMEOUT * a.names.len() as u32,
        _ => Duration::ZERO,
    };
    order_limit(a) + HOOK_TIMEOUT + cleanups
}

/// Order the certificate of `c` now (its lock held); returns when to look at it again.
fn order(rt: &tokio::runtime::Runtime, c: &mut Cert) -> SystemTime {
    let a = &c.spec;
    let names = a.names.join(", ");
    tracing::info!(
        "acme: ordering a certificate for {names} from {} ({})",
        a.directory,
        a.challenge.name()
    );
    c.started = Some(SystemTime::now());
    update(a, |s| s.ordering = true);
    // The certificate being replaced, named to the server when it has renewal information.
    let replaces = match (&c.ari, issued_cert(a)) {
        (Ari::Known { .. }, Some(cert)) => ari_id(&cert),
        _ => None,
    };
    let limit = order_limit(a);
    let result = match rt.block_on(async { tokio::time::timeout(limit, issue(a, replaces)).await })
    {
        Ok(r) => r,
        Err(_) => Err(Failure::new(format!(
            "no certificate within {} s",
            limit.as_secs()
        ))),
    };
    c.forced = false;
    let a = &c.spec;
    update(a, |s| s.ordering = false);
    match result {
        Ok(()) => {
            tracing::info!("acme: certificate for {names} issued by {}", a.directory);
            c.failures = 0;
            c.ari = Ari::Unknown;
            c.hold = None;
            update(a, |s| {
                s.issued_total += 1;
                s.failures = 0;
                s.last_error = None;
                s.last_error_at = None;
            });
            let now = SystemTime::now();
            match issued_cert(a) {
                // Looked at again now: not ordered before its floor.
                Some(cert) if two_thirds(a, &cert) > now => now,
                // Not due later (an unreadable chain, a clock far ahead): not again before an
                // hour.
                _ => {
                    let until = now + Duration::from_secs(3600);
                    c.hold = Some((until, "an issued certificate that is already due"));
                    until
                }
            }
        }
        Err(f) => {
            let until = failed(c, f.message.clone());
            match f.retry_after.filter(|t| *t > until) {
                Some(later) => {
                    c.hold = Some((later, RATE_LIMITED));
                    later
                }
                None => until,
            }
        }
    }
}

/// Record a failed order of `c`: log (an error as expiry nears), count, back off (1 minute,
/// doubling, at most 6 hours); returns when to try again.
fn failed(c: &mut Cert, e: String) -> SystemTime {
    let a = &c.spec;
    let names = a.names.join(", ");
    c.failures += 1;
    c.forced = false;
    let wait = Duration::from_secs(60 << c.failures.min(10).saturating_sub(1))
        .min(Duration::from_secs(6 * 3600));
    let now = SystemTime::now();
    let until = now + wait;
    c.hold = Some((until, "a failed order's backoff"));
    let left = issued_cert(a).and_then(|cert| cert.not_after.duration_since(now).ok());
    match left {
        Some(left) if left < Duration::from_secs(7 * 86400) => tracing::error!(
            "acme: renewing the certificate for {names} failed ({e}); it expires in {} hours; next try in {} s",
            left.as_secs() / 3600,
            wait.as_secs()
        ),
        _ => tracing::warn!(
            "acme: ordering a certificate for {names} failed: {e}; next try in {} s",
            wait.as_secs()
        ),
    }
    let failures = c.failures;
    update(a, |s| {
        s.failed_total += 1;
        s.failures = failures;
        s.last_error = Some(e);
        s.last_error_at = Some(unix(now));
        s.next_renewal = Some(unix(until));
        s.renewal_basis = "a failed order's backoff";
    });
    until
}

/// Why an order failed, and the time the server's rate limit allows another.
struct Failure {
    message: String,
    retry_after: Option<SystemTime>,
}

impl Failure {
    fn new(message: String) -> Failure {
        Failure {
            message,
            retry_after: None,
        }
    }
}

impl From<String> for Failure {
    fn from(message: String) -> Failure {
        Failure::new(message)
    }
}

impl From<&str> for Failure {
    fn from(message: &str) -> Failure {
        Failure::new(message.to_string())
    }
}

impl From<instant_acme::Error> for Failure {
    fn from(e: instant_acme::Error) -> Failure {
        let retry_after = match &e {
            instant_acme::Error::Api(p)
                if p.r#type.as_deref() == Some("urn:ietf:params:acme:error:rateLimited") =>
            {
                p.detail.as_deref().and_then(retry_after)
            }
            _ => None,
        };
        Failure {
            message: e.to_string(),
            retry_after,
        }
    }
}

/// The time in a rate-limit problem's detail, as Let's Encrypt writes it: `..., retry after
/// 2025-01-01 12:00:00 UTC: see ...`.
fn retry_after(detail: &str) -> Option<SystemTime> {
    let at = detail.find("retry after ")? + "retry after ".len();
    let t = detail.get(at..at + 23)?;
    let n = |r: std::ops::Range<usize>| t.get(r)?.parse::<i64>().ok();
    let ok = t.ends_with(" UTC")
        && [4, 7].iter().all(|&i| t.as_bytes()[i] == b'-')
        && t.as_bytes()[10] == b' '
        && [13, 16].iter().all(|&i| t.as_bytes()[i] == b':');
    if !ok {
        return None;
    }
    let (y, m, d) = (n(0..4)?, n(5..7)?, n(8..10)?);
    let (hh, mm, ss) = (n(11..13)?, n(14..16)?, n(17..19)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = u64::try_from(days * 86_400 + hh * 3600 + mm * 60 + ss).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
}

/// The longest an order may take, from the account to the certificate (a DNS-01 certificate's
/// `dns_delay` more).
const ORDER_TIMEOUT: Duration = Duration::from_secs(300);

/// How long a DNS-01 hook's `present` may run.
const HOOK_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a DNS-01 hook's `cleanup` may run (it runs as an order ends, on the manager's
/// thread).
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

/// What one order published for its challenges, withdrawn whatever way it ends: HTTP-01
/// tokens (in memory and in the storage), TLS-ALPN-01 certificates, DNS-01 records (the hook's
/// `cleanup`).
#[derive(Default)]
struct Published {
    tokens: Vec<(String, PathBuf)>,
    alpn: Vec<String>,
    records: Vec<(PathBuf, String, String, PathBuf)>,
    /// `present` hooks started: stopped before any cleanup runs (an order whose time is up
    /// leaves them running on the blocking pool).
    running: Vec<Arc<Stop>>,
}

/// Tells a hook's run to stop (its process group killed), and says when it has ended.
#[derive(Default)]
struct Stop {
    asked: AtomicBool,
    ended: AtomicBool,
}

impl Drop for Published {
    fn drop(&mut self) {
        for stop in &self.running {
            stop.asked.store(true, Ordering::Relaxed);
        }
        // The hook's loop looks every 50 ms.
        let start = Instant::now();
        while self
            .running
            .iter()
            .any(|s| !s.ended.load(Ordering::Acquire))
            && start.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        for (token, file) in &self.tokens {
            set_token(token, None);
            let _ = std::fs::remove_file(file);
        }
        for name in &self.alpn {
            portico_tls::acme::set_challenge(name, None);
        }
        for (hook, name, value, dir) in &self.records {
            if let Err(e) = run_hook(hook, "cleanup", name, value, dir, CLEANUP_TIMEOUT, None) {
                tracing::warn!("acme: removing the TXT record {name} failed: {e}");
            }
        }
    }
}

/// Run the DNS-01 hook `hook ACTION NAME VALUE` (NAME fully qualified, with its final dot),
/// at most `limit`, or until `stop` asks; its output goes to a file in `dir`, quoted on
/// failure. Blocks: run on the manager's own thread or the blocking pool.
fn run_hook(
    hook: &Path,
    action: &str,
    name: &str,
    value: &str,
    dir: &Path,
    limit: Duration,
    stop: Option<&Stop>,
) -> Result<(), String> {
    /// Says the run ended, whichever way it returns.
    struct Ended<'a>(Option<&'a Stop>);
    impl Drop for Ended<'_> {
        fn drop(&mut self) {
            if let Some(s) = self.0 {
                s.ended.store(true, Ordering::Release);
            }
        }
    }
    let _ended = Ended(stop);
    let out_path = dir.join(format!(".hook-{:016x}.out", fastrand::u64(..)));
    let out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&out_path)
        .map_err(|e| format!("{}: {e}", out_path.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    use std::os::unix::process::CommandExt;
    // A group of its own: a timeout kills what the hook started too.
    let spawned = std::process::Command::new(hook)
        .process_group(0)
        .args([action, name, value])
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn();
    let ended = match spawned {
        Err(e) => Err(format!("cannot run {}: {e}", hook.display())),
        Ok(mut child) => {
            let start = Instant::now();
            loop {
                match child.try_wait() {
                    Ok(Some(status)) => break Ok(status),
                    Ok(None)
                        if start.elapsed() < limit
                            && !stop.is_some_and(|s| s.asked.load(Ordering::Relaxed)) =>
                    {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    Ok(None) => {
                        let group = rustix::process::Pid::from_child(&child);
                        let _ = rustix::process::kill_process_group(
                            group,
                            rustix::process::Signal::KILL,
                        );
                        let _ = child.kill();
                        let _ = child.wait();
                        break Err(match start.elapsed() < limit {
                            true => "stopped: the order ended".to_string(),
                            false => format!("did not end within {} s", limit.as_secs()),
                        });
                    }
                    Err(e) => break Err(e.to_string()),
                }
            }
        }
    };
    let output = std::fs::read(&out_path).unwrap_or_default();
    let _ = std::fs::remove_file(&out_path);
    let output = String::from_utf8_lossy(&output[output.len().saturating_sub(400)..]);
    let output = output.trim();
    match ended {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(format!(
            "{} {action} {name} ended with {status}{}{output}",
            hook.display(),
            if output.is_empty() { "" } else { ": " }
        )),
        Err(e) => Err(format!("{} {action} {name}: {e}", hook.display())),
    }
}

/// The account file of `a`'s directory (one per directory).
fn account_path(a: &Acme) -> PathBuf {
    let tag = portico_config::hash::hash64(a.directory.as_bytes());
    a.storage.join(format!("account-{tag:016x}.json"))
}

/// An account and the bytes of the file it was read from (or written to).
type Account = (instant_acme::Account, Vec<u8>);

fn account_builder(a: &Acme) -> Result<instant_acme::AccountBuilder, String> {
    match &a.directory_ca {
        Some(ca) => instant_acme::Account::builder_with_root(ca),
        None => instant_acme::Account::builder(),
    }
    .map_err(|e| e.to_string())
}

/// The account in the storage's file for `a`'s directory, if there is a readable one.
async fn stored_account(a: &Acme) -> Result<Option<Account>, String> {
    let Ok(text) = std::fs::read(account_path(a)) else {
        return Ok(None);
    };
    let Ok(creds) = serde_json::from_slice::<instant_acme::AccountCredentials>(&text) else {
        return Ok(None);
    };
    let account = account_builder(a)?.from_credentials(creds).await;
    Ok(Some((account.map_err(|e| e.to_string())?, text)))
}

/// How long a process waits for another to create the account.
const ACCOUNT_WAIT: Duration = Duration::from_secs(60);

/// The storage's lock on the account of `a`'s directory, held while it is created or replaced
/// (processes starting together create one account, not one each).
async fn account_lock(a: &Acme) -> Result<std::fs::File, String> {
    let path = account_path(a).with_extension("lock");
    let start = Instant::now();
    loop {
        match try_lock(&path) {
            Ok(Some(l)) => return Ok(l),
            Ok(None) if start.elapsed() < ACCOUNT_WAIT => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(None) => {
                return Err(format!(
                    "{}: held by another process for more than {} s",
                    path.display(),
                    ACCOUNT_WAIT.as_secs()
                ))
            }
            Err(e) => return Err(format!("{}: {e}", path.display())),
        }
    }
}

/// The account for `a`'s directory: read from the storage, else (when `create`) created and
/// saved there; None when there is none and `create` is false.
async fn account(a: &Acme, create: bool) -> Result<Option<Account>, String> {
    if let Some(account) = stored_account(a).await? {
        return Ok(Some(account));
    }
    if !create {
        return Ok(None);
    }
    let _lock = account_lock(a).await?;
    // Created by another process while this one waited.
    if let Some(account) = stored_account(a).await? {
        return Ok(Some(account));
    }
    // A file that is no account: kept for whoever wants to look, not overwritten.
    let path = account_path(a);
    if path.exists() {
        let aside = aside_path(&path, "unreadable");
        std::fs::rename(&path, &aside).map_err(|e| format!("{}: {e}", path.display()))?;
        tracing::warn!(
            "acme: {} holds no account: kept as {}, creating a new one",
            path.display(),
            aside.display()
        );
    }
    new_account(a).await.map(Some)
}

/// Replace the account whose file held `forgotten` (the server no longer knows it, or
/// deactivated it): unless another process replaced it already, the file is kept aside as
/// `.forgotten-TIME` and a new account created.
async fn replace_account(a: &Acme, forgotten: &[u8]) -> Result<Account, String> {
    let _lock = account_lock(a).await?;
    let path = account_path(a);
    match std::fs::read(&path) {
        Ok(now) if now != forgotten => {
            if let Some(account) = stored_account(a).await? {
                return Ok(account);
            }
        }
        _ => {}
    }
    let aside = aside_path(&path, "forgotten");
    match std::fs::rename(&path, &aside) {
        Ok(()) => tracing::warn!(
            "acme: {} does not know the account in {} (or deactivated it): kept as {}, creating a new one",
            a.directory,
            path.display(),
            aside.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{}: {e}", path.display())),
    }
    new_account(a).await
}

/// Where the account file at `path` is kept aside, `why` (`PATH.WHY-MILLISECONDS`).
fn aside_path(path: &Path, why: &str) -> PathBuf {
    let ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    path.with_extension(format!("json.{why}-{ms}"))
}

/// A new account for `a`'s directory, saved in the storage (the account lock held).
async fn new_account(a: &Acme) -> Result<Account, String> {
    use instant_acme::NewAccount;
    let err = |e: instant_acme::Error| e.to_string();
    let path = account_path(a);
    let contact: Vec<&str> = a.contact.iter().map(String::as_str).collect();
    let new = NewAccount {
        contact: &contact,
        terms_of_service_agreed: true,
        only_return_existing: false,
    };
    let (account, creds) = account_builder(a)?
        .create(&new, a.directory.clone(), None)
        .await
        .map_err(err)?;
    let text = serde_json::to_vec(&creds).map_err(|e| e.to_string())?;
    write_file(&path, &text, 0o600).map_err(|e| format!("{}: {e}", path.display()))?;
    tracing::info!(
        "acme: created an account with {} in {}",
        a.directory,
        path.display()
    );
    Ok((account, text))
}

/// A new key of the configured type.
fn new_key(k: AcmeKey) -> Result<rcgen::KeyPair, String> {
    let rsa = |size| rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, size);
    match k {
        AcmeKey::EcdsaP256 => rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256),
        AcmeKey::EcdsaP384 => rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384),
        AcmeKey::Rsa2048 => rsa(rcgen::RsaKeySize::_2048),
        AcmeKey::Rsa4096 => rsa(rcgen::RsaKeySize::_4096),
    }
    .map_err(|e| e.to_string())
}

/// The TLS-ALPN-01 certificate for `name` (RFC 8737 3): self-signed, the name as its only
/// alternative name, the key authorization's digest in a critical acmeIdentifier extension.
fn alpn_certificate(name: &str, digest: &[u8]) -> Result<(Vec<u8>, Vec<u8>), String> {
    let other = |e: rcgen::Error| e.to_string();
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(other)?;
    let mut params = rcgen::CertificateParams::new(vec![name.to_string()]).map_err(other)?;
    params.custom_extensions = vec![rcgen::CustomExtension::new_acme_identifier(digest)];
    let cert = params.self_signed(&key).map_err(other)?;
    Ok((cert.der().to_vec(), key.serialize_der()))
}

/// Publish the answer to one challenge of `a` for `name` (as the authorization spells it,
/// `*.` for a wildcard).
async fn publish(
    a: &Acme,
    published: &mut Published,
    name: &str,
    token: &str,
    key_authorization: &instant_acme::KeyAuthorization,
) -> Result<(), String> {
    match &a.challenge {
        AcmeChallenge::Http01 => {
            if !valid_token(token) {
                return Err(format!("the server sent a malformed token {token:?}"));
            }
            let dir = challenges_dir(a);
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .map_err(|e| format!("{}: {e}", dir.display()))?;
            let file = dir.join(token);
            let value = key_authorization.as_str().to_string();
            set_token(token, Some(value.clone()));
            published.tokens.push((token.to_string(), file.clone()));
            write_file(&file, value.as_bytes(), 0o644)
                .map_err(|e| format!("{}: {e}", file.display()))?;
        }
        AcmeChallenge::TlsAlpn01 => {
            let (cert, key) = alpn_certificate(name, key_authorization.digest().as_ref())?;
            let key = tokio_rustls::rustls::pki_types::PrivatePkcs8KeyDer::from(key);
            let certified = portico_tls::certified_key(vec![cert.into()], key.into())?;
            portico_tls::acme::set_challenge(name, Some(certified));
            published.alpn.push(name.to_string());
        }
        AcmeChallenge::Dns01 { hook, .. } => {
            let base = name.strip_prefix("*.").unwrap_or(name);
            let record = format!("_acme-challenge.{base}.");
            let value = key_authorization.dns_value();
            // Withdrawn whatever way `present` ends (it may have published before failing or
            // timing out).
            published.records.push((
                hook.clone(),
                record.clone(),
                value.clone(),
                a.storage.clone(),
            ));
            // Off the runtime's thread: the order's timeout still ends a hook that hangs (and
            // stops it before the cleanup).
            let (h, dir) = (hook.clone(), a.storage.clone());
            let stop = Arc::new(Stop::default());
            published.running.push(stop.clone());
            let ran = tokio::task::spawn_blocking(move || {
                run_hook(
                    &h,
                    "present",
                    &record,
                    &value,
                    &dir,
                    HOOK_TIMEOUT,
                    Some(&stop),
                )
            });
            ran.await.map_err(|e| e.to_string())??;
        }
    }
    Ok(())
}

/// A new order for the names of `a`, naming the certificate it `replaces` when the server
/// takes it.
async fn open_order(
    account: &instant_acme::Account,
    a: &Acme,
    replaces: Option<&str>,
) -> Result<instant_acme::Order, instant_acme::Error> {
    use instant_acme::{Identifier, NewOrder};
    let ids: Vec<Identifier> = a.names.iter().cloned().map(Identifier::Dns).collect();
    let new = || {
        let order = NewOrder::new(&ids);
        match &a.profile {
            Some(p) => order.profile(p),
            None => order,
        }
    };
    let replaced = replaces.and_then(|id| {
        let (aki, serial) = id.split_once('.')?;
        Some(instant_acme::CertificateIdentifier {
            authority_key_identifier: aki.into(),
            serial: serial.into(),
        })
    });
    let Some(r) = replaced else {
        return account.new_order(&new()).await;
    };
    match account.new_order(&new().replaces(r)).await {
        // A server that refuses the replacement (already replaced, not this account's, or
        // malformed to it): a plain order. Any other error (a rate limit, the network) ends
        // the order.
        Err(instant_acme::Error::Api(p))
            if p.r#type.as_deref().is_some_and(|t| {
                [":alreadyReplaced", ":malformed", ":unauthorized"]
                    .iter()
                    .any(|e| t.ends_with(e))
            }) =>
        {
            tracing::debug!(
                "acme: an order replacing {} was refused ({}); ordering afresh",
                replaces.unwrap_or(""),
                instant_acme::Error::Api(p)
            );
            account.new_order(&new()).await
        }
        r => r,
    }
}

/// Whether the server's problem says it no longer knows the account, or deactivated it.
fn forgotten(p: &instant_acme::Problem) -> bool {
    let t = p.r#type.as_deref().unwrap_or("");
    let detail = p.detail.as_deref().unwrap_or("").to_ascii_lowercase();
    t.ends_with(":accountDoesNotExist")
        || (t.ends_with(":unauthorized") && detail.contains("deactivated"))
}

/// Order the certificate of `a` with its challenge and write it with a new key; `replaces`
/// names the certificate it renews (renewal information's identifier).
async fn issue(a: &Acme, replaces: Option<String>) -> Result<(), Failure> {
    use instant_acme::{AuthorizationStatus, ChallengeType, OrderStatus, RetryPolicy};
    let (account, text) = account(a, true).await?.ok_or("no account")?;
    let mut order = match open_order(&account, a, replaces.as_deref()).await {
        // The server forgot the account (a test server restarted) or deactivated it: a new
        // one.
        Err(instant_acme::Error::Api(p)) if forgotten(&p) => {
            let (account, _) = replace_account(a, &text).await?;
            open_order(&account, a, None).await?
        }
        r => r?,
    };
    let kind = match a.challenge {
        AcmeChallenge::Http01 => ChallengeType::Http01,
        AcmeChallenge::TlsAlpn01 => ChallengeType::TlsAlpn01,
        AcmeChallenge::Dns01 { .. } => ChallengeType::Dns01,
    };
    // First every answer is published, then the server is told to look (a wildcard and its
    // base name share one TXT name: both values must be there).
    let mut published = Published::default();
    let mut pending = 0;
    let mut authorizations = order.authorizations();
    while let Some(authz) = authorizations.next().await {
        let mut authz = authz?;
        match authz.status {
            AuthorizationStatus::Pending => {}
            AuthorizationStatus::Valid => continue,
            other => return Err(format!("an authorization is {other:?}").into()),
        }
        let name = authz.identifier().to_string();
        // Only the names asked for (the server's word names the hook's record and the
        // challenge certificate).
        if !a.names.contains(&name) {
            return Err(format!("the server asks to prove {name:?}, not one of the names").into());
        }
        let challenge = authz.challenge(kind.clone()).ok_or_else(|| {
            format!(
                "the server offers no {} challenge for {name}",
                a.challenge.name()
            )
        })?;
        let key_authorization = challenge.key_authorization();
        publish(
            a,
            &mut published,
            &name,
            &challenge.token,
            &key_authorization,
        )
        .await?;
        pending += 1;
    }
    if pending > 0 {
        match &a.challenge {
            AcmeChallenge::Dns01 { delay, .. } => tokio::time::sleep(*delay).await,
            AcmeChallenge::Http01 => tokio::time::sleep(SHARED_SETTLE).await,
            AcmeChallenge::TlsAlpn01 => {}
        }
        let mut authorizations = order.authorizations();
        while let Some(authz) = authorizations.next().await {
            let mut authz = authz?;
            if authz.status != AuthorizationStatus::Pending {
                continue;
            }
            let mut challenge = authz
                .challenge(kind.clone())
                .ok_or("the challenge went away")?;
            challenge.set_ready().await?;
        }
    }
    // Validation from several places and issuance can take a while: up to 2 minutes each.
    let retries = RetryPolicy::new()
        .backoff(1.5)
        .timeout(Duration::from_secs(120));
    match order.poll_ready(&retries).await? {
        OrderStatus::Ready => {}
        other => return Err(format!("the order is {other:?} after its challenges").into()),
    }
    drop(published);
    let key = new_key(a.key_type)?;
    let csr = request(&a.names, &key)?;
    order.finalize_csr(&csr).await?;
    let chain = order.poll_certificate(&retries).await?;
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
            challenge: AcmeChallenge::Http01,
            key_type: AcmeKey::EcdsaP256,
            profile: None,
            refuse_unissued: false,
        }
    }

    /// A self-signed certificate for the names of `a`, valid from January 1st to April 1st of
    /// `year`, in its certificate file.
    fn write_cert(a: &Acme, year: i32) {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(a.names.clone()).unwrap();
        params.not_before = rcgen::date_time_ymd(year, 1, 1);
        params.not_after = rcgen::date_time_ymd(year, 4, 1);
        std::fs::write(a.files().cert, params.self_signed(&key).unwrap().pem()).unwrap();
    }

    #[test]
    fn listeners_sharing_a_certificate_order_it_once_and_storages_keep_theirs_apart() {
        let listener = |port: u16, storage: &str, extra: &str| {
            format!(
                "[[listeners]]\naddress = \"127.0.0.1:{port}\"\n[listeners.tls.acme]\nnames = [\"a.example\"]\nstorage = \"{storage}\"\naccept_terms = true\n{extra}\n[[listeners.routes]]\nrespond = {{ status = 200 }}\n\n"
            )
        };
        let text = [
            listener(8443, "/s1", ""),
            listener(9443, "/s1", "unissued = \"refuse\""),
            listener(10443, "/s2", ""),
        ]
        .concat();
        let config = portico_config::parse(&text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
        let specs = specs(&config);
        let keys: Vec<String> = specs.iter().map(key).collect();
        assert_eq!(keys, ["/s1/a.example.crt", "/s2/a.example.crt"]);
    }

    /// The record of what the files of `a` were issued for, written at `when`.
    fn write_issued(a: &Acme, when: SystemTime) {
        let issued = serde_json::to_vec(&issued_for(a)).unwrap();
        std::fs::write(issued_path(a), issued).unwrap();
        let file = std::fs::File::options()
            .write(true)
            .open(issued_path(a))
            .unwrap();
        file.set_modified(when).unwrap();
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
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
        // No temporary files left behind: the pair and the lock.
        let mut left: Vec<String> = std::fs::read_dir(&a.storage)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["a.example.crt", "a.example.key", "a.example.lock"]);
        assert!(portico_tls::stored_certificate(&f.cert).unwrap().stand_in);
        let now = SystemTime::now();
        let mut c = Cert::new(a.clone());
        assert_eq!(schedule(&runtime(), &mut c, now), (now, "not issued yet"));
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
        write_cert(&a, 2026);
        let now = SystemTime::now();
        let rt = runtime();
        // Not known to be issued for these settings: due at once.
        assert_eq!(schedule(&rt, &mut Cert::new(a.clone()), now).0, now);
        write_issued(&a, now - Duration::from_secs(7200));
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600); // 2026-01-01
        let life = Duration::from_secs(90 * 86400);
        let two = start + life.mul_f64(2.0 / 3.0);
        // No authority key identifier (self-signed): no renewal information to ask for.
        let (at, why) = schedule(&rt, &mut Cert::new(a.clone()), now);
        assert!(at <= two && at >= two - life / 100, "{at:?}");
        assert_eq!(why, "two thirds of its lifetime");
        // The same time at every look.
        assert_eq!(schedule(&rt, &mut Cert::new(a.clone()), now).0, at);
        // Another directory (staging to production), name, key type or profile: due at once.
        let production = Acme {
            directory: "https://acme.example/dir".into(),
            ..a.clone()
        };
        let mut more = a.clone();
        more.names.push("c.example".into());
        let rsa = Acme {
            key_type: AcmeKey::Rsa2048,
            ..a.clone()
        };
        let short = Acme {
            profile: Some("shortlived".into()),
            ..a.clone()
        };
        for other in [production, more, rsa, short] {
            assert_eq!(schedule(&rt, &mut Cert::new(other), now).0, now);
        }
        // Asked through the admin API; held back after a failure.
        let mut c = Cert::new(a.clone());
        c.forced = true;
        assert_eq!(schedule(&rt, &mut c, now).0, now);
        let mut c = Cert::new(a);
        c.hold = Some((now + Duration::from_secs(60), "a failed order's backoff"));
        assert_eq!(schedule(&rt, &mut c, now).0, now + Duration::from_secs(60));
    }

    #[test]
    fn the_renewal_identifier_is_the_authority_key_and_serial_in_base64url() {
        let stored = portico_tls::StoredCertificate {
            issuer: String::new(),
            not_before: SystemTime::UNIX_EPOCH,
            not_after: SystemTime::UNIX_EPOCH,
            stand_in: false,
            authority_key_id: Some(vec![0x69, 0x88, 0x5B, 0x6B, 0x87, 0x46, 0x40, 0x41]),
            serial: vec![0x00, 0x87, 0x65, 0x43, 0x21],
        };
        // RFC 9773 4.1's example.
        assert_eq!(ari_id(&stored).unwrap(), "aYhba4dGQEE.AIdlQyE");
        let none = portico_tls::StoredCertificate {
            authority_key_id: None,
            ..stored
        };
        assert_eq!(ari_id(&none), None);
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
    fn keys_of_every_type_are_made() {
        // With the size of the public key's DER encoding.
        for (k, public) in [
            (AcmeKey::EcdsaP256, 91),
            (AcmeKey::EcdsaP384, 120),
            (AcmeKey::Rsa2048, 294),
            (AcmeKey::Rsa4096, 550),
        ] {
            let key = new_key(k).unwrap();
            let pem = key.serialize_pem();
            use tokio_rustls::rustls::pki_types::{pem::PemObject, PrivateKeyDer};
            let der = PrivateKeyDer::from_pem_slice(pem.as_bytes());
            assert!(der.is_ok(), "{k:?}");
            assert_eq!(key.public_key_der().len(), public, "{k:?}");
        }
    }

    #[test]
    fn a_tls_alpn_certificate_carries_the_digest_in_a_critical_extension() {
        let digest = [7u8; 32];
        let (cert, _) = alpn_certificate("a.example", &digest).unwrap();
        let (_, c) = x509_parser::parse_x509_certificate(&cert).unwrap();
        let ext = c
            .extensions()
            .iter()
            .find(|e| e.oid.to_id_string() == "1.3.6.1.5.5.7.1.31")
            .expect("acmeIdentifier");
        assert!(ext.critical);
        // An OCTET STRING of the 32-byte digest.
        assert_eq!(&ext.value[..2], &[0x04, 0x20]);
        assert_eq!(&ext.value[2..], &digest);
        let text = format!("{:?}", c.subject_alternative_name().unwrap().unwrap().value);
        assert!(text.contains("a.example"), "{text}");
    }

    #[test]
    fn a_name_is_covered_by_itself_or_a_wildcard_one_label_deep() {
        let names = ["example.com".to_string(), "*.example.com".to_string()];
        assert!(covers(&names, "example.com"));
        assert!(covers(&names, "www.example.com"));
        assert!(!covers(&names, "a.b.example.com"));
        assert!(!covers(&names, "wwwexample.com"));
        assert!(!covers(&names, ".example.com"));
        assert!(!covers(&names, "example.org"));
    }

    #[test]
    fn a_renewal_time_is_kept_in_its_window_and_the_certificate_life() {
        let t = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        let cert = portico_tls::StoredCertificate {
            issuer: String::new(),
            not_before: t(0),
            not_after: t(1000),
            stand_in: false,
            authority_key_id: None,
            serial: vec![],
        };
        for _ in 0..100 {
            let at = pick((t(600), t(700)), None, &cert, t(100));
            assert!(at >= t(600) && at <= t(700), "{at:?}");
        }
        // The same window keeps the time picked.
        assert_eq!(pick((t(600), t(700)), Some(t(650)), &cert, t(100)), t(650));
        // An ended window: now; one inside the last tenth of the life: before it.
        assert_eq!(pick((t(200), t(300)), None, &cert, t(400)), t(400));
        assert_eq!(pick((t(950), t(990)), None, &cert, t(100)), t(900));
        // A window that started: not before now.
        assert!(pick((t(0), t(500)), Some(t(50)), &cert, t(100)) == t(100));
    }

    #[test]
    fn a_certificate_just_issued_waits_for_its_floor() {
        let dir = tempfile::tempdir().unwrap();
        let a = spec(dir.path());
        std::fs::create_dir_all(&a.storage).unwrap();
        write_cert(&a, 2020);
        let now = SystemTime::now();
        let rt = runtime();
        // Expired long ago, but written a minute ago (by this process or another, before a
        // restart or not): not before a tenth of its life, at most an hour.
        write_issued(&a, now - Duration::from_secs(60));
        let mut c = Cert::new(a.clone());
        let (at, why) = schedule(&rt, &mut c, now);
        assert_eq!((at, why), (now + Duration::from_secs(3540), "just issued"));
        c.forced = true;
        assert_eq!(schedule(&rt, &mut c, now).0, now);
        // Written two hours ago: due now.
        write_issued(&a, now - Duration::from_secs(7200));
        let mut c = Cert::new(a);
        assert!(schedule(&rt, &mut c, now).0 <= now);
    }

    #[test]
    fn shared_tokens_are_read_from_small_regular_files_named_as_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("tok-1"), "tok-1.thumb\n").unwrap();
        std::fs::write(d.join("not.a.token"), "x").unwrap();
        std::fs::write(d.join("big"), vec![b'a'; 2000]).unwrap();
        std::fs::write(dir.path().join("secret"), "no").unwrap();
        std::os::unix::fs::symlink(d.join("secret"), d.join("link")).unwrap();
        std::fs::create_dir(d.join("sub")).unwrap();
        let found = read_shared(&[d.to_path_buf(), d.join("missing")]);
        let mut keys: Vec<&String> = found.keys().collect();
        keys.sort();
        assert_eq!(keys, ["secret", "tok-1"]);
        assert_eq!(found["tok-1"], "tok-1.thumb");
    }

    #[test]
    fn challenges_are_answered_from_memory_and_from_the_storage() {
        set_token("tok-123", Some("tok-123.thumb".into()));
        let path = format!("{CHALLENGE_PREFIX}tok-123");
        assert_eq!(challenge_answer(&path).as_deref(), Some("tok-123.thumb"));
        assert_eq!(challenge_answer("/tok-123"), None);
        set_token("tok-123", None);
        assert_eq!(challenge_answer(&path), None);
        // Read from the storage by another process's thread.
        let mut shared = HashMap::new();
        shared.insert("tok-456".to_string(), "tok-456.thumb".to_string());
        *SHARED.write().unwrap() = Some(shared);
        let answer = challenge_answer(&format!("{CHALLENGE_PREFIX}tok-456"));
        assert_eq!(answer.as_deref(), Some("tok-456.thumb"));
        for bad in ["../tok-456", "tok-456/", "", "a/b"] {
            assert_eq!(
                challenge_answer(&format!("{CHALLENGE_PREFIX}{bad}")),
                None,
                "{bad}"
            );
        }
        *SHARED.write().unwrap() = None;
    }

    #[test]
    fn the_storage_lock_is_held_by_one_holder_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let a = spec(dir.path());
        std::fs::create_dir_all(&a.storage).unwrap();
        let first = lock(&a).unwrap().expect("free");
        // flock belongs to the open file: a second open is refused, as another process is.
        assert!(lock(&a).unwrap().is_none());
        drop(first);
        assert!(lock(&a).unwrap().is_some());
    }

    #[test]
    fn a_rate_limit_says_when_to_try_again() {
        let detail = "too many certificates (5) already issued for this exact set of identifiers in the last 168h0m0s, retry after 2025-01-02 03:04:05 UTC: see https://letsencrypt.org/docs/rate-limits/";
        let at = retry_after(detail).unwrap();
        assert_eq!(
            at,
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_735_787_045)
        );
        assert_eq!(retry_after("retry after tomorrow"), None);
        assert_eq!(retry_after("retry after 2025-13-02 03:04:05 UTC"), None);
        assert_eq!(retry_after("no time here"), None);
    }

    #[test]
    fn a_dns_hook_is_run_with_its_arguments_and_its_failure_quoted() {
        let dir = tempfile::tempdir().unwrap();
        let hook = dir.path().join("hook");
        let calls = dir.path().join("calls");
        let script = format!(
            "#!/bin/sh\necho \"$1 $2 $3\" >> {}\n[ \"$1\" = present ] || {{ echo no such zone >&2; exit 3; }}\n",
            calls.display()
        );
        std::fs::write(&hook, script).unwrap();
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o700)).unwrap();
        run_hook(
            &hook,
            "present",
            "_acme-challenge.a.example.",
            "v1",
            dir.path(),
            HOOK_TIMEOUT,
            None,
        )
        .unwrap();
        let e = run_hook(
            &hook,
            "cleanup",
            "_acme-challenge.a.example.",
            "v1",
            dir.path(),
            CLEANUP_TIMEOUT,
            None,
        )
        .unwrap_err();
        assert!(
            e.contains("exit status: 3") && e.ends_with("no such zone"),
            "{e}"
        );
        let text = std::fs::read_to_string(&calls).unwrap();
        assert_eq!(
            text,
            "present _acme-challenge.a.example. v1\ncleanup _acme-challenge.a.example. v1\n"
        );
        let missing = run_hook(
            &dir.path().join("none"),
            "present",
            "n.",
            "v",
            dir.path(),
            HOOK_TIMEOUT,
            None,
        );
        assert!(missing.unwrap_err().contains("cannot run"));
        // One that outlives its limit is killed, with what it started.
        let slow = dir.path().join("slow");
        std::fs::write(&slow, "#!/bin/sh\nsleep 30 &\nwait\n").unwrap();
        std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o700)).unwrap();
        let start = Instant::now();
        let limit = Duration::from_secs(1);
        let e = run_hook(&slow, "cleanup", "n.", "v", dir.path(), limit, None);
        assert!(e.unwrap_err().ends_with("did not end within 1 s"));
        assert!(start.elapsed() < Duration::from_secs(10));
        // One asked to stop (its order's time is up) is killed at once, and says it ended.
        let stop = Stop::default();
        stop.asked.store(true, Ordering::Relaxed);
        let e = run_hook(
            &slow,
            "present",
            "n.",
            "v",
            dir.path(),
            HOOK_TIMEOUT,
            Some(&stop),
        );
        assert!(e.unwrap_err().ends_with("stopped: the order ended"));
        assert!(stop.ended.load(Ordering::Acquire));
        // The output files are gone.
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 3, "{left:?}");
    }
}
