//! The response cache's disk tier: each stored response in a file of its own (a JSON head, then the body) under a directory of its own, indexed in memory and bounded in bytes, written and deleted by one thread of its own, and found again after a restart.

use super::body::{Body, BodyFile, FILE_BODY};
use super::file::{bytes, latin1, Meta, PREAMBLE};
use super::{policy, selects, Entry, Purge, Scope, MAX_VARIANTS};
use bytes::BytesMut;
use portico_http1::RequestHead;
use std::collections::HashMap;
use std::io::{BufWriter, ErrorKind, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant, SystemTime};

/// The file that marks a directory as the disk tier's: a directory that holds other files and
/// not this one is refused, never cleaned.
const MARKER: &str = "PORTICO-CACHE";
/// Writes waiting at most, and their body bytes; past either a stored response stays in memory
/// only.
const MAX_QUEUED: u64 = 1024;
const MAX_QUEUED_BYTES: u64 = 256 << 20;

/// The disk tier: where its files are, what they hold, and the queues of its thread.
pub(crate) struct Disk {
    dir: PathBuf,
    size: u64,
    index: moka::sync::Cache<Arc<str>, Arc<Slot>>,
    /// Held while the index is changed, with what was removed lately, so that a write or a
    /// read-back racing with a purge of its URL never brings the response back.
    edit: Mutex<Removals>,
    /// Bumped at every removal; a write carries its value from when it was queued.
    seq: AtomicU64,
    writes: mpsc::Sender<WriteJob>,
    deletes: mpsc::Sender<Delete>,
    queued: AtomicU64,
    queued_bytes: AtomicU64,
    /// The files of an earlier run are still being read.
    scanning: AtomicBool,
    pub counters: DiskCounters,
}

/// What was removed lately: by URL (until no write queued before the removal is left), by
/// purges of many URLs, and everything removed while the scan runs (the files it has not
/// reached yet predate every removal).
#[derive(Default)]
struct Removals {
    urls: HashMap<Arc<str>, u64>,
    many: u64,
    scan_urls: std::collections::HashSet<Arc<str>>,
    scan_other: Vec<Purge>,
}

impl Removals {
    /// `url` was removed at `seq`: writes queued before it must not happen.
    fn url(&mut self, url: Arc<str>, seq: u64, queued: bool, scanning: bool) {
        if scanning {
            self.scan_urls.insert(url.clone());
        }
        // With nothing queued, no write can predate the removal.
        if !queued {
            return;
        }
        if self.urls.len() >= MAX_URL_REMOVALS {
            self.urls.clear();
            self.many = seq;
        } else {
            self.urls.insert(url, seq);
        }
    }

    /// Whether a removal made while the scan ran takes away a file of `url` with `tags`.
    fn scanned_away(&self, url: &str, tags: &[String]) -> bool {
        self.scan_urls.contains(url) || self.scan_other.iter().any(|p| purged(p, url, tags))
    }
}

/// What the disk tier did, for `/metrics`.
#[derive(Debug, Default)]
pub struct DiskCounters {
    /// Stored responses read back from disk into memory.
    pub reads: AtomicU64,
    /// Responses written to disk.
    pub writes: AtomicU64,
    /// Responses not written because the queue of writes was full.
    pub skipped: AtomicU64,
    /// Files that failed to be written or read back.
    pub errors: AtomicU64,
}

/// The files of one URL's variants.
struct Slot {
    variants: Vec<Arc<Stub>>,
    retain: Duration,
    weight: u32,
}

/// A response on disk: what selects it, and its file.
pub(crate) struct Stub {
    scope: Scope,
    select: Vec<(String, Option<Vec<u8>>)>,
    path: PathBuf,
    size: u64,
    /// When it was received, and until when it may be used at all.
    stored: SystemTime,
    until: SystemTime,
    tags: Vec<String>,
}

impl Stub {
    fn selected_by(&self, head: &RequestHead, scope: Scope) -> bool {
        self.scope == scope && selects(&self.select, head)
    }

    fn same_variant(&self, other: &Stub) -> bool {
        self.scope == other.scope && self.select == other.select
    }
}

/// Write the response stored for a URL; `seq` is the removal count when it was queued.
pub(crate) struct WriteJob {
    url: Arc<str>,
    entry: Arc<Entry>,
    seq: u64,
    /// What it holds of the queue's bytes.
    bytes: u64,
}

/// A place in the queue of writes ([`Disk::reserve`]).
pub(crate) struct Ticket {
    seq: u64,
    bytes: u64,
}

/// Removals recorded by URL at most; past that, one record stands for all of them.
const MAX_URL_REMOVALS: usize = 10_000;

pub(crate) enum Delete {
    File(PathBuf),
    /// Answered once every deletion queued before it is done.
    Flush(mpsc::Sender<()>),
}

/// What `Disk::open` hands to [`run`].
pub(crate) struct Queues {
    writes: mpsc::Receiver<WriteJob>,
    deletes: mpsc::Receiver<Delete>,
}

/// Whether `purge` removes a response of `url` with `tags`.
fn purged(purge: &Purge, url: &str, tags: &[String]) -> bool {
    match purge {
        Purge::All => true,
        Purge::Url(u) => u == url,
        Purge::Prefix(p) => url.starts_with(p.as_str()),
        Purge::Tag(t) => tags.contains(t),
    }
}

/// Whether a failed read means the file is damaged (it goes), rather than that the system
/// could not read it now (too many open files, an I/O error: it stays).
fn damaged(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::InvalidData | ErrorKind::UnexpectedEof | ErrorKind::NotFound
    )
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Meta {
    fn of(url: &str, e: &Entry, stored: SystemTime) -> Meta {
        let since_epoch = stored.duration_since(SystemTime::UNIX_EPOCH);
        Meta {
            url: url.to_string(),
            route: e.scope.route,
            tls: e.scope.tls,
            group: e.scope.group,
            select: e
                .select
                .iter()
                .map(|(n, v)| (n.clone(), v.as_deref().map(latin1)))
                .collect(),
            status: e.status,
            reason: e.reason.clone(),
            fields: e
                .fields
                .iter()
                .map(|(n, v)| (n.clone(), latin1(v)))
                .collect(),
            stored_ms: ms(since_epoch.unwrap_or_default()),
            initial_age_ms: ms(e.initial_age),
            fresh_for_ms: ms(e.fresh_for),
            stale_if_error_ms: ms(e.stale_if_error),
            stale_while_revalidate_ms: ms(e.stale_while_revalidate),
            revalidate: e.revalidate,
            tags: e.tags.clone(),
            body: e.body.len(),
        }
    }

    fn stored(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(self.stored_ms)
    }

    fn scope(&self) -> Scope {
        Scope {
            route: self.route,
            tls: self.tls,
            group: self.group,
        }
    }

    fn select(&self) -> Vec<(String, Option<Vec<u8>>)> {
        let values = self.select.iter();
        values
            .map(|(n, v)| (n.clone(), v.as_deref().map(bytes)))
            .collect()
    }

    /// The stored response with `body`; its age now counts the time it spent on disk.
    fn entry(&self, body: Body) -> Option<Entry> {
        let on_disk = SystemTime::now()
            .duration_since(self.stored())
            .unwrap_or_default();
        let verdict = policy::Verdict {
            fresh_for: Duration::from_millis(self.fresh_for_ms),
            stale_if_error: Duration::from_millis(self.stale_if_error_ms),
            stale_while_revalidate: Duration::from_millis(self.stale_while_revalidate_ms),
            revalidate: self.revalidate,
        };
        let initial_age = Duration::from_millis(self.initial_age_ms).saturating_add(on_disk);
        let fields = self.fields.iter().map(|(n, v)| (n.clone(), bytes(v)));
        Entry::build(
            self.scope(),
            self.select(),
            self.status,
            self.reason.clone(),
            fields.collect(),
            body,
            &verdict,
            initial_age,
            Instant::now(),
            self.tags.clone(),
        )
    }
}

/// Keeps each URL's files as long as the longest-lived of them may be used.
struct Retain;

impl moka::Expiry<Arc<str>, Arc<Slot>> for Retain {
    fn expire_after_create(&self, _: &Arc<str>, v: &Arc<Slot>, _: Instant) -> Option<Duration> {
        Some(v.retain)
    }

    fn expire_after_update(
        &self,
        _: &Arc<str>,
        v: &Arc<Slot>,
        _: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        Some(v.retain)
    }
}

impl Disk {
    /// The disk tier in `dir` (created when missing, refused when it holds files and is not
    /// marked as the cache's) of `size` bytes, and the receiving ends of its queues for [`run`].
    pub(crate) fn open(dir: &Path, size: u64) -> std::io::Result<(Disk, Queues)> {
        std::fs::create_dir_all(dir)?;
        if !dir.join(MARKER).exists() {
            if std::fs::read_dir(dir)?.next().is_some() {
                let e = format!(
                    "{} holds files and is not a Portico cache directory (no {MARKER} file): give the cache a directory of its own",
                    dir.display()
                );
                return Err(std::io::Error::new(ErrorKind::AlreadyExists, e));
            }
            std::fs::write(
                dir.join(MARKER),
                "The response cache of Portico: its files are deleted and replaced at will.\n",
            )?;
        }
        std::fs::create_dir_all(dir.join("tmp"))?;
        let (writes, writes_rx) = mpsc::channel();
        let (deletes, deletes_rx) = mpsc::channel();
        let listener = deletes.clone();
        let index = moka::sync::Cache::builder()
            .max_capacity(size)
            .weigher(|_: &Arc<str>, s: &Arc<Slot>| s.weight)
            .expire_after(Retain)
            .support_invalidation_closures()
            .eviction_listener(move |_, slot: Arc<Slot>, cause| {
                // A replaced slot's files are dealt with by whoever replaced it.
                if cause != moka::notification::RemovalCause::Replaced {
                    for v in &slot.variants {
                        let _ = listener.send(Delete::File(v.path.clone()));
                    }
                }
            })
            .build();
        let disk = Disk {
            dir: dir.to_path_buf(),
            size,
            index,
            edit: Mutex::new(Removals::default()),
            seq: AtomicU64::new(0),
            writes,
            deletes,
            queued: AtomicU64::new(0),
            queued_bytes: AtomicU64::new(0),
            scanning: AtomicBool::new(true),
            counters: DiskCounters::default(),
        };
        let queues = Queues {
            writes: writes_rx,
            deletes: deletes_rx,
        };
        Ok((disk, queues))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.size
    }

    fn edit(&self) -> MutexGuard<'_, Removals> {
        self.edit.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Files and their bytes.
    pub(crate) fn usage(&self) -> (u64, u64) {
        self.index.run_pending_tasks();
        (self.index.entry_count(), self.index.weighted_size())
    }

    /// A place in the queue of writes for a body of `bytes`, taken before the response is
    /// stored in memory (so that a removal after that store always drops the write); None when
    /// the queue is full.
    pub(crate) fn reserve(&self, bytes: u64) -> Option<Ticket> {
        // Counted before the removal count is read: removals are forgotten only while nothing
        // is queued.
        let n = self.queued.fetch_add(1, SeqCst);
        let queued = self.queued_bytes.fetch_add(bytes, SeqCst);
        let seq = self.seq.load(SeqCst);
        if n >= MAX_QUEUED || queued + bytes > MAX_QUEUED_BYTES {
            self.release(bytes);
            self.counters.skipped.fetch_add(1, SeqCst);
            return None;
        }
        Some(Ticket { seq, bytes })
    }

    /// `entry` of `url` goes to disk soon, in the place `ticket` holds.
    pub(crate) fn write(&self, ticket: Ticket, url: Arc<str>, entry: Arc<Entry>) {
        let bytes = ticket.bytes;
        let job = WriteJob {
            url,
            entry,
            seq: ticket.seq,
            bytes,
        };
        if self.writes.send(job).is_err() {
            self.release(bytes);
        }
    }

    /// A queued write is done (or dropped); with nothing left queued, the removals recorded
    /// by URL are forgotten.
    fn release(&self, bytes: u64) {
        self.queued_bytes.fetch_sub(bytes, SeqCst);
        if self.queued.fetch_sub(1, SeqCst) == 1 {
            let mut r = self.edit();
            if self.queued.load(SeqCst) == 0 {
                r.urls.clear();
            }
        }
    }

    /// Waits until the deletions queued so far are done (a purge's files are gone when the
    /// admin API answers).
    /// (At most 5 s: the thread may be busy with a large write or the scan.)
    pub(crate) fn deleted(&self) {
        let (tx, rx) = mpsc::channel();
        if self.deletes.send(Delete::Flush(tx)).is_ok() {
            let _ = rx.recv_timeout(Duration::from_secs(5));
        }
    }

    /// Waits until the scan and the writes queued so far are done.
    #[cfg(test)]
    pub(crate) fn flush(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.scanning.load(SeqCst) || self.queued.load(SeqCst) > 0 {
            assert!(Instant::now() < deadline, "the disk tier's thread is stuck");
            std::thread::sleep(Duration::from_millis(1));
        }
        self.deleted();
    }

    /// The stored response on disk that the request `head` of `scope` selects, read back
    /// (its body stays in its file when large), with its stub for [`Disk::promote`]. A
    /// damaged file goes.
    pub(crate) fn get(
        &self,
        url: &Arc<str>,
        head: &RequestHead,
        scope: Scope,
    ) -> Option<(Arc<Stub>, Entry)> {
        let slot = self.index.get(url)?;
        let stub = slot.variants.iter().find(|s| s.selected_by(head, scope))?;
        match read(&stub.path) {
            Ok(e) => {
                self.counters.reads.fetch_add(1, SeqCst);
                Some((stub.clone(), e))
            }
            Err(err) => {
                self.counters.errors.fetch_add(1, SeqCst);
                tracing::warn!("cache: {} cannot be read back: {err}", stub.path.display());
                if damaged(&err) {
                    let _r = self.edit();
                    self.drop_variants(url, |s| Arc::ptr_eq(s, stub));
                }
                None
            }
        }
    }

    /// `promote` runs while `stub` of `url` is still indexed (not removed since it was read
    /// back), with no removal in between; false when it was removed.
    pub(crate) fn promote(&self, url: &Arc<str>, stub: &Arc<Stub>, promote: impl FnOnce()) -> bool {
        let _r = self.edit();
        let slot = self.index.get(url);
        let indexed = slot.is_some_and(|s| s.variants.iter().any(|v| Arc::ptr_eq(v, stub)));
        if indexed {
            promote();
        }
        indexed
    }

    /// The variants of `url` that `gone` picks go, their files with them.
    fn drop_variants(&self, url: &Arc<str>, gone: impl Fn(&Arc<Stub>) -> bool) {
        let Some(old) = self.index.get(url) else {
            return;
        };
        let (out, kept): (Vec<_>, Vec<_>) = old.variants.iter().cloned().partition(|s| gone(s));
        for s in out {
            let _ = self.deletes.send(Delete::File(s.path.clone()));
        }
        self.store(url.clone(), kept);
    }

    /// `url`'s variants are now `variants` (none: it goes).
    fn store(&self, url: Arc<str>, variants: Vec<Arc<Stub>>) {
        if variants.is_empty() {
            self.index.remove(&url);
            return;
        }
        let now = SystemTime::now();
        let until = variants.iter().map(|s| s.until).max().unwrap_or(now);
        let weight = variants.iter().map(|s| s.size).sum::<u64>();
        let slot = Slot {
            variants,
            retain: until.duration_since(now).unwrap_or_default(),
            weight: u32::try_from(weight).unwrap_or(u32::MAX),
        };
        self.index.insert(url, Arc::new(slot));
    }

    /// A stub enters the index in place of the same variant, unless that one is newer (its
    /// file goes instead). Called with the edit lock held.
    fn add(&self, url: Arc<str>, stub: Stub) {
        let mut variants = Vec::with_capacity(2);
        match self.index.get(&url) {
            Some(old) => {
                for s in old.variants.iter() {
                    let newer = s.same_variant(&stub) && s.stored > stub.stored;
                    if newer {
                        let _ = self.deletes.send(Delete::File(stub.path));
                        return;
                    }
                    if s.same_variant(&stub) || variants.len() + 1 >= MAX_VARIANTS {
                        let _ = self.deletes.send(Delete::File(s.path.clone()));
                    } else {
                        variants.push(s.clone());
                    }
                }
            }
            // An expired slot the store has not cleared yet would be reported as replaced
            // (its files kept): removed first, its files go.
            None => {
                self.index.remove(&url);
            }
        }
        variants.insert(0, Arc::new(stub));
        self.store(url, variants);
    }

    /// Whether a removal since `seq` took `url` away.
    fn removed_since(r: &Removals, url: &str, seq: u64) -> bool {
        r.many > seq || r.urls.get(url).is_some_and(|s| *s > seq)
    }

    /// `w`'s response written to a file of its own, then indexed (unless its URL was removed
    /// since it was queued).
    fn write_file(&self, w: &WriteJob) -> std::io::Result<()> {
        if Self::removed_since(&self.edit(), &w.url, w.seq) {
            return Ok(());
        }
        let entry = &w.entry;
        let resident = Instant::now().saturating_duration_since(entry.stored);
        let stored = SystemTime::now() - resident;
        let head = super::file::encode(&Meta::of(&w.url, entry, stored));
        let name = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
        let tmp = self.dir.join("tmp").join(&name);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        let mut out = BufWriter::with_capacity(64 * 1024, file);
        let written = (|| {
            out.write_all(&head)?;
            entry.body.write_to(&mut out)?;
            out.flush()
        })();
        let size = head.len() as u64 + entry.body.len();
        let path = self.dir.join(&name[..2]).join(&name);
        let placed = written.and_then(|()| {
            std::fs::create_dir_all(path.parent().unwrap_or(&self.dir))?;
            std::fs::rename(&tmp, &path)
        });
        if let Err(e) = placed {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        let r = self.edit();
        if Self::removed_since(&r, &w.url, w.seq) {
            let _ = self.deletes.send(Delete::File(path));
            return Ok(());
        }
        let stub = Stub {
            scope: entry.scope,
            select: entry.select.clone(),
            path,
            size,
            stored,
            until: stored + entry.retain(),
            tags: entry.tags.clone(),
        };
        self.add(w.url.clone(), stub);
        self.counters.writes.fetch_add(1, SeqCst);
        Ok(())
    }

    /// The index from the files already in the directory (those of an earlier run); files that
    /// are not the cache's, expired or damaged go, and so do those a removal made while the
    /// scan ran names.
    fn scan(&self, between: &dyn Fn()) -> (u64, u64) {
        if let Ok(tmp) = std::fs::read_dir(self.dir.join("tmp")) {
            for f in tmp.flatten() {
                let _ = std::fs::remove_file(f.path());
            }
        }
        let Ok(dirs) = std::fs::read_dir(&self.dir) else {
            return (0, 0);
        };
        let (mut files, mut bytes) = (0, 0);
        let now = SystemTime::now();
        for d in dirs.flatten() {
            let name = d.file_name();
            let name = name.to_string_lossy();
            if name.len() != 2 || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
                continue;
            }
            let Ok(entries) = std::fs::read_dir(d.path()) else {
                continue;
            };
            for f in entries.flatten() {
                // Deletions (a purge waits for them) are not held up by a long scan.
                between();
                let path = f.path();
                let (meta, size) = match read_meta(&path) {
                    Ok(found) => found,
                    Err(e) if damaged(&e) => {
                        let _ = std::fs::remove_file(&path);
                        continue;
                    }
                    Err(_) => continue,
                };
                let until = meta
                    .entry(Body::empty())
                    .map(|e| meta.stored() + e.retain());
                let Some(until) = until.filter(|u| *u > now) else {
                    let _ = std::fs::remove_file(&path);
                    continue;
                };
                let stub = Stub {
                    scope: meta.scope(),
                    select: meta.select(),
                    path,
                    size,
                    stored: meta.stored(),
                    until,
                    tags: meta.tags,
                };
                let r = self.edit();
                if r.scanned_away(&meta.url, &stub.tags) {
                    let _ = std::fs::remove_file(&stub.path);
                    continue;
                }
                self.add(Arc::from(meta.url), stub);
                files += 1;
                bytes += size;
            }
        }
        let mut r = self.edit();
        self.scanning.store(false, SeqCst);
        r.scan_urls.clear();
        r.scan_other.clear();
        (files, bytes)
    }

    /// Removes what `purge` names, with its files (deleted by the tier's thread soon after);
    /// whether a URL purge found it.
    pub(crate) fn remove(&self, purge: &Purge) -> bool {
        let mut r = self.edit();
        let seq = self.seq.fetch_add(1, SeqCst) + 1;
        let (queued, scanning) = (self.queued.load(SeqCst) > 0, self.scanning.load(SeqCst));
        if scanning && !matches!(purge, Purge::Url(_)) {
            r.scan_other.push(purge.clone());
        }
        match purge {
            Purge::Url(url) => {
                r.url(Arc::from(url.as_str()), seq, queued, scanning);
                self.index.remove(url.as_str()).is_some()
            }
            Purge::All => {
                r.many = seq;
                self.index.invalidate_all();
                true
            }
            Purge::Prefix(_) | Purge::Tag(_) => {
                r.many = seq;
                let p = purge.clone();
                // Entries are filtered from reads at once, removed by the next maintenance.
                let found = self.index.invalidate_entries_if(move |k, s| {
                    s.variants.iter().any(|v| purged(&p, k, &v.tags))
                });
                found.is_ok()
            }
        }
    }

    /// The maintenance that carries out purges by prefix, tag or everything (outside the edit
    /// lock: it walks the whole index).
    pub(crate) fn housekeep(&self) {
        self.index.run_pending_tasks();
    }

    pub(crate) fn remove_variant(&self, url: &Arc<str>, e: &Entry) {
        let mut r = self.edit();
        let seq = self.seq.fetch_add(1, SeqCst) + 1;
        let (queued, scanning) = (self.queued.load(SeqCst) > 0, self.scanning.load(SeqCst));
        r.url(url.clone(), seq, queued, scanning);
        self.drop_variants(url, |s| s.scope == e.scope && s.select == e.select);
    }
}

/// The head of the file at `path` and the file's size.
fn read_meta(path: &Path) -> std::io::Result<(Meta, u64)> {
    let file = std::fs::File::open(path)?;
    let (meta, _, size) = meta_of(&file)?;
    Ok((meta, size))
}

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

/// A file's head, where its body starts, and its size; an error when it is not whole.
fn meta_of(file: &std::fs::File) -> std::io::Result<(Meta, u64, u64)> {
    let mut pre = [0u8; PREAMBLE as usize];
    file.read_exact_at(&mut pre, 0)?;
    let n = super::file::head_len(&pre).map_err(invalid)?;
    let mut raw = vec![0u8; n as usize];
    file.read_exact_at(&mut raw, PREAMBLE)?;
    let meta = super::file::meta(&raw).map_err(invalid)?;
    let size = file.metadata()?.len();
    if !super::file::whole(size, n, &meta) {
        return Err(invalid("cut short"));
    }
    Ok((meta, PREAMBLE + n, size))
}

/// The stored response in the file at `path`: a body of [`FILE_BODY`] or more stays in the
/// file, a smaller one is read.
fn read(path: &Path) -> std::io::Result<Entry> {
    let file = std::fs::File::open(path)?;
    let (meta, start, _) = meta_of(&file)?;
    let body = match meta.body >= FILE_BODY as u64 {
        true => Body::File(Arc::new(BodyFile {
            file,
            offset: start,
            len: meta.body,
            in_memory: false,
        })),
        false => {
            let mut b = BytesMut::zeroed(meta.body as usize);
            file.read_exact_at(&mut b, start)?;
            Body::Mem(b.freeze())
        }
    };
    meta.entry(body)
        .ok_or_else(|| invalid("its head does not parse"))
}

/// The disk tier's thread: finds what an earlier run left, then writes and deletes files as
/// asked (deletions first) until the tier is gone.
pub(crate) fn run(disk: Weak<Disk>, q: Queues) {
    let deletions = || {
        while let Ok(job) = q.deletes.try_recv() {
            match job {
                Delete::File(path) => {
                    let _ = std::fs::remove_file(path);
                }
                Delete::Flush(done) => {
                    let _ = done.send(());
                }
            }
        }
    };
    if let Some(d) = disk.upgrade() {
        let started = Instant::now();
        let (files, bytes) = d.scan(&deletions);
        tracing::info!(
            "cache: {files} stored responses ({bytes} bytes) found on disk in {} ({} ms)",
            d.dir.display(),
            started.elapsed().as_millis()
        );
    }
    loop {
        deletions();
        let w = match q.writes.recv_timeout(Duration::from_millis(100)) {
            Ok(w) => w,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                deletions();
                return;
            }
        };
        let Some(d) = disk.upgrade() else {
            continue;
        };
        if let Err(e) = d.write_file(&w) {
            d.counters.errors.fetch_add(1, SeqCst);
            tracing::warn!("cache: writing a response of {} to disk failed: {e}", w.url);
        }
        let bytes = w.bytes;
        drop(w);
        d.release(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{request, stored, SCOPE};
    use super::super::{Cache, Purge};
    use portico_config::CacheDisk;
    use std::sync::atomic::Ordering::SeqCst;
    use std::sync::Arc;

    fn files(dir: &std::path::Path) -> usize {
        let subdirs = std::fs::read_dir(dir).unwrap().flatten();
        let subdirs = subdirs.filter(|d| d.file_name().len() == 2);
        subdirs
            .map(|d| std::fs::read_dir(d.path()).unwrap().count())
            .sum()
    }

    fn flush(c: &Cache) {
        c.disk.as_ref().unwrap().flush();
    }

    #[test]
    fn responses_outlive_the_cache_and_purges_delete_their_files() {
        let dir = tempfile::tempdir().unwrap();
        let disk = CacheDisk {
            path: dir.path().join("c"),
            size: 1 << 30,
        };
        let req = request("GET / HTTP/1.1\r\nHost: h\r\nAccept-Encoding: gzip\r\n\r\n");
        let large: &'static [u8] = Vec::leak((0..100_000u32).map(|i| i as u8).collect());
        {
            let c = Cache::new(1 << 20, Some(&disk)).unwrap();
            stored(&c, "h/small", &req, "Accept-Encoding", b"small body");
            stored(&c, "h/large", &req, "", large);
            stored(&c, "h/gone", &req, "", b"x");
            // Purged before its write: never written.
            c.purge(&Purge::Url("h/gone".into())).unwrap();
            flush(&c);
            assert_eq!(files(&disk.path), 2);
            assert_eq!(c.disk_usage().unwrap().1, 2);
        }
        // A new cache on the same directory (a restart) finds both, with their variants.
        let c = Cache::new(1 << 20, Some(&disk)).unwrap();
        flush(&c);
        let small = c.get(&"h/small".into(), &req, SCOPE).unwrap();
        assert_eq!(&small.body.read(0, 10).unwrap()[..], b"small body");
        assert!(small.is_fresh(std::time::Instant::now()));
        assert_eq!(small.tags, ["a", "b"]);
        // Another variant of it was never stored.
        let br = request("GET / HTTP/1.1\r\nHost: h\r\nAccept-Encoding: br\r\n\r\n");
        let url: Arc<str> = "h/small".into();
        assert!(c.get(&url, &br, SCOPE).is_none());
        c.purge(&Purge::Url("h/small".into())).unwrap();
        assert!(c.get(&url, &req, SCOPE).is_none());
        let e = c.get(&"h/large".into(), &req, SCOPE).unwrap();
        assert!(matches!(&e.body, super::Body::File(f) if !f.in_memory));
        let mut body = Vec::new();
        e.body.write_to(&mut body).unwrap();
        assert_eq!(body, large);
        assert_eq!(e.get.field("content-length"), Some(&b"100000"[..]));
        c.purge(&Purge::Tag("b".into())).unwrap();
        flush(&c);
        assert_eq!(files(&disk.path), 0);
        assert!(c.get(&"h/large".into(), &req, SCOPE).is_none());
    }

    #[test]
    fn the_size_bound_deletes_the_least_used_files_and_foreign_files_go() {
        let dir = tempfile::tempdir().unwrap();
        let disk = CacheDisk {
            path: dir.path().to_path_buf(),
            size: 1 << 20,
        };
        // A directory that holds files and is not marked as the cache's is refused.
        std::fs::create_dir_all(dir.path().join("ab")).unwrap();
        let e = Cache::new(64 << 20, Some(&disk)).err().unwrap();
        assert!(
            e.to_string().contains("is not a Portico cache directory"),
            "{e}"
        );
        std::fs::write(dir.path().join(super::MARKER), b"").unwrap();
        std::fs::write(dir.path().join("ab").join("junk"), b"not a cache file").unwrap();
        let c = Cache::new(64 << 20, Some(&disk)).unwrap();
        let req = request("GET / HTTP/1.1\r\nHost: h\r\n\r\n");
        let body: &'static [u8] = Vec::leak(vec![7u8; 200_000]);
        for i in 0..10 {
            stored(&c, &format!("h/{i}"), &req, "", body);
        }
        flush(&c);
        c.disk.as_ref().unwrap().index.run_pending_tasks();
        flush(&c);
        let (_, entries, bytes, cap, _) = c.disk_usage().unwrap();
        assert!(
            bytes <= cap && entries <= 5,
            "{entries} files, {bytes} bytes"
        );
        assert_eq!(files(dir.path()), entries as usize);
    }

    #[test]
    fn responses_reach_the_disk_when_memory_cannot_hold_them() {
        let dir = tempfile::tempdir().unwrap();
        let disk = CacheDisk {
            path: dir.path().join("c"),
            size: 64 << 20,
        };
        // 1 MiB of memory, 40 responses of 100 KB: most are evicted from memory at once.
        let c = Cache::new(1 << 20, Some(&disk)).unwrap();
        let req = request("GET / HTTP/1.1\r\nHost: h\r\n\r\n");
        let body: &'static [u8] = Vec::leak(vec![3u8; 100_000]);
        for i in 0..40 {
            stored(&c, &format!("h/{i}"), &req, "", body);
        }
        flush(&c);
        assert_eq!(files(&disk.path), 40);
        assert_eq!(c.disk_usage().unwrap().1, 40);
        for i in 0..40 {
            let e = c.get(&format!("h/{i}").into(), &req, SCOPE).unwrap();
            assert_eq!(e.body.len(), 100_000);
        }
    }

    #[test]
    fn a_new_configuration_on_the_same_directory_shares_its_tier() {
        let dir = tempfile::tempdir().unwrap();
        let disk = CacheDisk {
            path: dir.path().join("c"),
            size: 64 << 20,
        };
        let req = request("GET / HTTP/1.1\r\nHost: h\r\n\r\n");
        let a = Cache::new(1 << 20, Some(&disk)).unwrap();
        stored(&a, "h/a", &req, "", b"a");
        flush(&a);
        // More memory: a new memory tier, the same disk tier (no second scan of the files).
        let b = Cache::new(2 << 20, Some(&disk)).unwrap();
        assert!(Arc::ptr_eq(
            a.disk.as_ref().unwrap(),
            b.disk.as_ref().unwrap()
        ));
        assert_eq!(
            &b.get(&"h/a".into(), &req, SCOPE)
                .unwrap()
                .body
                .read(0, 1)
                .unwrap()[..],
            b"a"
        );
        // A purge through the new one reaches the shared files.
        b.purge(&Purge::Url("h/a".into())).unwrap();
        drop(a);
        flush(&b);
        assert_eq!(files(&disk.path), 0);
        // The tier's thread outlives the first cache.
        stored(&b, "h/b", &req, "", b"b");
        flush(&b);
        assert_eq!(files(&disk.path), 1);
    }

    #[test]
    fn a_purge_during_the_scan_applies_to_the_files_it_has_not_reached() {
        let dir = tempfile::tempdir().unwrap();
        let disk = CacheDisk {
            path: dir.path().join("c"),
            size: 64 << 20,
        };
        let req = request("GET / HTTP/1.1\r\nHost: h\r\n\r\n");
        {
            let c = Cache::new(1 << 20, Some(&disk)).unwrap();
            stored(&c, "h/a", &req, "", b"a");
            stored(&c, "h/b", &req, "", b"b");
            flush(&c);
        }
        // A restart: a purge arrives before the scan has read the files.
        let (d, _queues) = super::Disk::open(&disk.path, disk.size).unwrap();
        assert!(!d.remove(&Purge::Url("h/a".into())));
        assert_eq!(d.scan(&|| {}).0, 1);
        assert!(d.index.get("h/a").is_none() && d.index.get("h/b").is_some());
        assert_eq!(files(&disk.path), 1);
    }

    /// A response with `body` stored in a cache without a disk tier, for writing by hand.
    fn entry(url: &str, body: &'static [u8]) -> Arc<super::Entry> {
        let c = Cache::new(1 << 20, None).unwrap();
        let req = request("GET / HTTP/1.1\r\nHost: h\r\n\r\n");
        stored(&c, url, &req, "", body);
        c.get(&url.into(), &req, SCOPE).unwrap()
    }

    #[test]
    fn a_write_queued_before_a_purge_of_its_url_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let (d, q) = super::Disk::open(dir.path(), 64 << 20).unwrap();
        d.scan(&|| {});
        let e = entry("h/a", b"a");
        // Queued (its place taken as it is stored in memory), then the URL is purged.
        let t = d.reserve(1).unwrap();
        assert!(!d.remove(&Purge::Url("h/a".into())));
        d.write(t, "h/a".into(), e.clone());
        let job = q.writes.recv().unwrap();
        d.write_file(&job).unwrap();
        d.release(job.bytes);
        assert!(d.index.get("h/a").is_none());
        // Stored again after the purge: written.
        let t = d.reserve(1).unwrap();
        d.write(t, "h/a".into(), e);
        let job = q.writes.recv().unwrap();
        d.write_file(&job).unwrap();
        d.release(job.bytes);
        assert!(d.index.get("h/a").is_some());
        // Nothing queued: the removals by URL are forgotten.
        assert_eq!(d.queued.load(SeqCst), 0);
        assert!(d.edit().urls.is_empty());
    }

    #[test]
    fn the_queue_of_writes_is_bounded_in_count_and_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let (d, _q) = super::Disk::open(dir.path(), 64 << 20).unwrap();
        let tickets: Vec<_> = (0..super::MAX_QUEUED)
            .map(|_| d.reserve(10).unwrap())
            .collect();
        assert!(d.reserve(10).is_none());
        for t in tickets {
            d.release(t.bytes);
        }
        assert!(d.reserve(super::MAX_QUEUED_BYTES + 1).is_none());
        assert_eq!((d.queued.load(SeqCst), d.queued_bytes.load(SeqCst)), (0, 0));
        assert!(d.reserve(10).is_some());
        assert_eq!(d.counters.skipped.load(SeqCst), 2);
    }
}
