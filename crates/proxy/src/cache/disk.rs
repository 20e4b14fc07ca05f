//! The response cache's disk tier: each stored response in a file of its own (a JSON head, then the body) under one directory, indexed in memory and bounded in bytes, written and deleted by one thread of its own, and found again after a restart.

use super::body::{Body, BodyFile, FILE_BODY};
use super::file::{bytes, latin1, Meta, PREAMBLE};
use super::{policy, request_value, Cache, Entry, Scope, MAX_VARIANTS};
use bytes::BytesMut;
use portico_http1::RequestHead;
use std::io::{BufWriter, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

/// Writes waiting at most; past that a stored response stays in memory only.
const MAX_QUEUED: usize = 1024;
/// The disk tier: where its files are, what they hold, and the queue of its thread.
pub(crate) struct Disk {
    dir: PathBuf,
    size: u64,
    index: moka::sync::Cache<Arc<str>, Arc<Slot>>,
    /// Held while a URL's entry in the index is read and replaced, and by purges, so that a
    /// write finishing as its URL is purged never brings it back.
    edit: Mutex<()>,
    jobs: mpsc::Sender<Job>,
    queued: AtomicUsize,
    pub counters: DiskCounters,
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
struct Stub {
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
        self.scope == scope
            && self
                .select
                .iter()
                .all(|(name, value)| request_value(head, name).as_deref() == value.as_deref())
    }

    fn same_variant(&self, other: &Stub) -> bool {
        self.scope == other.scope && self.select == other.select
    }
}

pub(crate) enum Job {
    /// Write the response stored for a URL (skipped when the memory tier no longer holds it:
    /// it was purged, invalidated or replaced meanwhile).
    Write(Arc<str>, Arc<Entry>),
    Delete(PathBuf),
    /// Answered once every job before it is done.
    #[cfg(test)]
    Flush(mpsc::Sender<()>),
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
    /// The disk tier in `dir` (created when missing) of `size` bytes, and the receiving end
    /// of its queue for [`run`].
    pub(crate) fn open(dir: &Path, size: u64) -> std::io::Result<(Disk, mpsc::Receiver<Job>)> {
        std::fs::create_dir_all(dir.join("tmp"))?;
        let (jobs, rx) = mpsc::channel();
        let deletes = jobs.clone();
        let index = moka::sync::Cache::builder()
            .max_capacity(size)
            .weigher(|_: &Arc<str>, s: &Arc<Slot>| s.weight)
            .expire_after(Retain)
            .support_invalidation_closures()
            .eviction_listener(move |_, slot: Arc<Slot>, cause| {
                // A replaced slot's files are dealt with by whoever replaced it.
                if cause != moka::notification::RemovalCause::Replaced {
                    for v in &slot.variants {
                        let _ = deletes.send(Job::Delete(v.path.clone()));
                    }
                }
            })
            .build();
        let disk = Disk {
            dir: dir.to_path_buf(),
            size,
            index,
            edit: Mutex::new(()),
            jobs,
            queued: AtomicUsize::new(0),
            counters: DiskCounters::default(),
        };
        Ok((disk, rx))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.size
    }

    /// Files and their bytes.
    pub(crate) fn usage(&self) -> (u64, u64) {
        self.index.run_pending_tasks();
        (self.index.entry_count(), self.index.weighted_size())
    }

    /// `entry` of `url` goes to disk soon (unless the queue is full).
    pub(crate) fn write(&self, url: Arc<str>, entry: Arc<Entry>) {
        if self.queued.fetch_add(1, Ordering::Relaxed) >= MAX_QUEUED {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            self.counters.skipped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if self.jobs.send(Job::Write(url, entry)).is_err() {
            self.queued.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Waits until the jobs queued so far (the scan first) are done.
    #[cfg(test)]
    pub(crate) fn flush(&self) {
        let (tx, rx) = mpsc::channel();
        if self.jobs.send(Job::Flush(tx)).is_ok() {
            let _ = rx.recv();
        }
    }

    /// The stored response on disk that the request `head` of `scope` selects, read back
    /// (its body stays in its file when large). A file that fails to read goes.
    pub(crate) fn get(&self, url: &Arc<str>, head: &RequestHead, scope: Scope) -> Option<Entry> {
        let slot = self.index.get(url)?;
        let stub = slot.variants.iter().find(|s| s.selected_by(head, scope))?;
        match read(&stub.path) {
            Ok(e) => {
                self.counters.reads.fetch_add(1, Ordering::Relaxed);
                Some(e)
            }
            Err(err) => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("cache: {} cannot be read back: {err}", stub.path.display());
                let _guard = self.edit.lock();
                self.drop_variants(url, |s| Arc::ptr_eq(s, stub));
                None
            }
        }
    }

    /// The variants of `url` that `gone` picks go, their files with them.
    fn drop_variants(&self, url: &Arc<str>, gone: impl Fn(&Arc<Stub>) -> bool) {
        let Some(old) = self.index.get(url) else {
            return;
        };
        let (out, kept): (Vec<_>, Vec<_>) = old.variants.iter().cloned().partition(|s| gone(s));
        for s in out {
            let _ = self.jobs.send(Job::Delete(s.path.clone()));
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
    /// file goes instead).
    fn add(&self, url: Arc<str>, stub: Stub) {
        let mut variants = Vec::with_capacity(2);
        if let Some(old) = self.index.get(&url) {
            for s in old.variants.iter() {
                let newer = s.same_variant(&stub) && s.stored > stub.stored;
                if newer {
                    let _ = self.jobs.send(Job::Delete(stub.path));
                    return;
                }
                if s.same_variant(&stub) || variants.len() + 1 >= MAX_VARIANTS {
                    let _ = self.jobs.send(Job::Delete(s.path.clone()));
                } else {
                    variants.push(s.clone());
                }
            }
        }
        variants.insert(0, Arc::new(stub));
        self.store(url, variants);
    }

    /// `entry` of `url` written to a file of its own, then indexed.
    fn write_file(&self, cache: &Cache, url: &Arc<str>, entry: &Arc<Entry>) -> std::io::Result<()> {
        let resident = Instant::now().saturating_duration_since(entry.stored);
        let stored = SystemTime::now() - resident;
        let head = super::file::encode(&Meta::of(url, entry, stored));
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
        let _guard = self.edit.lock();
        // Purged, invalidated or replaced while it waited: it is not written after all.
        if !cache.holds(url, entry) {
            let _ = std::fs::remove_file(&path);
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
        self.add(url.clone(), stub);
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The index from the files already in the directory (those of an earlier run); files that
    /// are not the cache's, expired or unreadable go.
    fn scan(&self) -> (u64, u64) {
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
                let path = f.path();
                let found = read_meta(&path).ok().and_then(|(m, size)| {
                    let until = m.stored() + m.entry(Body::empty())?.retain();
                    (until > now).then_some((m, size, until))
                });
                let Some((meta, size, until)) = found else {
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
                let _guard = self.edit.lock();
                self.add(Arc::from(meta.url), stub);
                files += 1;
                bytes += size;
            }
        }
        (files, bytes)
    }

    /// Removes what matches, with its files.
    pub(crate) fn remove(&self, url: &str) -> bool {
        let _guard = self.edit.lock();
        self.index.remove(url).is_some()
    }

    pub(crate) fn remove_variant(&self, url: &Arc<str>, e: &Entry) {
        let _guard = self.edit.lock();
        self.drop_variants(url, |s| s.scope == e.scope && s.select == e.select);
    }

    pub(crate) fn purge_all(&self) {
        let _guard = self.edit.lock();
        self.index.invalidate_all();
        self.index.run_pending_tasks();
    }

    pub(crate) fn purge_if(
        &self,
        f: impl Fn(&str, &[String]) -> bool + Send + Sync + 'static,
    ) -> Result<(), String> {
        let _guard = self.edit.lock();
        let r = self
            .index
            .invalidate_entries_if(move |k, s| s.variants.iter().any(|v| f(k, &v.tags)));
        self.index.run_pending_tasks();
        r.map(|_| ()).map_err(|e| e.to_string())
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
/// asked until the cache is gone.
pub(crate) fn run(cache: Weak<Cache>, jobs: mpsc::Receiver<Job>) {
    if let Some(c) = cache.upgrade() {
        if let Some(disk) = &c.disk {
            let started = Instant::now();
            let (files, bytes) = disk.scan();
            tracing::info!(
                "cache: {files} stored responses ({bytes} bytes) found on disk in {} ({} ms)",
                disk.dir.display(),
                started.elapsed().as_millis()
            );
        }
    }
    while let Ok(job) = jobs.recv() {
        match job {
            Job::Delete(path) => {
                let _ = std::fs::remove_file(path);
            }
            #[cfg(test)]
            Job::Flush(done) => {
                let _ = done.send(());
            }
            Job::Write(url, entry) => {
                let Some(c) = cache.upgrade() else { return };
                let Some(disk) = &c.disk else { return };
                disk.queued.fetch_sub(1, Ordering::Relaxed);
                if let Err(e) = disk.write_file(&c, &url, &entry) {
                    disk.counters.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("cache: writing a response of {url} to disk failed: {e}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{request, stored, SCOPE};
    use super::super::{Cache, Purge};
    use portico_config::CacheDisk;
    use std::sync::Arc;

    fn files(dir: &std::path::Path) -> usize {
        let subdirs = std::fs::read_dir(dir).unwrap().flatten();
        let subdirs = subdirs.filter(|d| d.file_name() != "tmp");
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
        let br = request("GET / HTTP/1.1\r\nHost: h\r\nAccept-Encoding: br\r\n\r\n");
        let url: Arc<str> = "h/small".into();
        c.purge(&Purge::Url("h/small".into())).unwrap();
        assert!(c.get(&url, &br, SCOPE).is_none());
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
        std::fs::create_dir_all(dir.path().join("ab")).unwrap();
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
}
