//! The response cache's store: responses by URL with their variants in a memory tier bounded in bytes (moka: TinyLFU admission, so a one-hit scan does not evict the hot set) over an optional disk tier, purges, one upstream fetch per URL at a time, counters.

pub(crate) mod body;
mod disk;
pub(crate) mod file;
pub(crate) mod policy;

pub(crate) use body::Body;
pub use disk::DiskCounters;

use bytes::BytesMut;
use moka::ops::compute::Op;
use portico_config::{CacheDisk, CacheStore, QueryKey, RouteCache};
use portico_http1::{Limits, Method, RequestHead, ResponseHead};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::watch;

/// Most variants (by `Vary` and the route's key fields) kept per URL; the oldest goes first.
const MAX_VARIANTS: usize = 16;
/// What an entry costs beyond its head and body bytes (its bookkeeping, the store's node).
const ENTRY_OVERHEAD: u64 = 256;

/// The response cache shared by every worker; kept across reloads while its memory stays the
/// same.
pub struct Cache {
    memory: u64,
    store: moka::sync::Cache<Arc<str>, Arc<Slot>>,
    /// Shared with the cache an earlier configuration had on the same directory.
    disk: Option<Arc<disk::Disk>>,
    /// URLs being fetched, and the receivers woken when the fetch ends.
    locks: Mutex<HashMap<Arc<str>, watch::Receiver<()>>>,
    pub counters: Counters,
}

/// What the cache did, for `/metrics`.
#[derive(Debug, Default)]
pub struct Counters {
    /// Answered from the cache without asking the upstream.
    pub hits: AtomicU64,
    /// Not in the cache (or not usable): fetched.
    pub misses: AtomicU64,
    /// Answered from a stale entry because the upstream failed (`stale-if-error`).
    pub stale: AtomicU64,
    /// Answered from a stale entry while a background fetch refreshes it
    /// (`stale-while-revalidate`).
    pub updating: AtomicU64,
    /// Background refreshes that stored a response (or refreshed one with a 304).
    pub refreshed: AtomicU64,
    /// Background refreshes that failed or got a response that could not be stored.
    pub refresh_failed: AtomicU64,
    /// Revalidated with the upstream (304) and answered from the cache.
    pub revalidated: AtomicU64,
    /// Waited for another request's fetch of the same URL, then answered from what it stored.
    pub collapsed: AtomicU64,
    /// Requests of caching routes that skipped the cache (method, bypass rules).
    pub bypass: AtomicU64,
    /// Responses stored.
    pub stored: AtomicU64,
    /// Body bytes answered from the cache.
    pub hit_bytes: AtomicU64,
    /// Stored entries removed by unsafe requests to their URL.
    pub invalidated: AtomicU64,
    /// Requests waiting now for another request's fetch of their URL.
    pub waiting: AtomicU64,
    /// Background refreshes running now.
    pub refreshing: AtomicU64,
}

/// Counts a request among the waiting ones while it lives.
pub(crate) struct Waiting<'c>(&'c AtomicU64);

impl<'c> Waiting<'c> {
    pub(crate) fn new(counter: &'c AtomicU64) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        Waiting(counter)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The stored variants of one URL.
pub(crate) struct Slot {
    variants: Vec<Arc<Entry>>,
    /// How long the slot is kept from its last store (its longest-lived variant).
    retain: Duration,
    weight: u32,
}

/// Where a response was fetched for: the route's cache scope (`RouteCache::scope`), the
/// client's scheme and the group (a split's side). Stored responses of one URL serve only
/// requests of their own scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Scope {
    pub route: u64,
    pub tls: bool,
    pub group: usize,
}

/// A stored response.
pub(crate) struct Entry {
    scope: Scope,
    /// The request's values that select this variant: the route's key fields and cookies
    /// (`cookie:NAME`) and the fields the response's `Vary` names (lowercase), each None when
    /// absent.
    select: Vec<(String, Option<Vec<u8>>)>,
    /// The stored fields, in order (for a 304's merge).
    pub fields: Vec<(String, Vec<u8>)>,
    pub status: u16,
    reason: String,
    /// The head as it answers a GET (framed by the body's length) and a HEAD (no body).
    pub get: ResponseHead,
    pub head: ResponseHead,
    pub body: Body,
    /// When it was received, and its age then.
    stored: Instant,
    initial_age: Duration,
    pub fresh_for: Duration,
    pub stale_if_error: Duration,
    pub stale_while_revalidate: Duration,
    /// Every use revalidates first (`no-cache`).
    pub revalidate: bool,
    pub tags: Vec<String>,
}

impl Entry {
    /// The entry's age at `now` (RFC 9111 4.2.3).
    pub(crate) fn age(&self, now: Instant) -> Duration {
        let resident = now.saturating_duration_since(self.stored);
        self.initial_age.saturating_add(resident)
    }

    /// It answers without a revalidation at `now`.
    pub(crate) fn is_fresh(&self, now: Instant) -> bool {
        !self.revalidate && self.age(now) < self.fresh_for
    }

    /// It may answer at `now` while a fetch in the background refreshes it.
    pub(crate) fn serves_while_revalidating(&self, now: Instant) -> bool {
        let until = self.fresh_for.saturating_add(self.stale_while_revalidate);
        !self.revalidate && self.age(now) < until
    }

    /// It may answer in place of an upstream failure at `now`.
    pub(crate) fn serves_on_error(&self, now: Instant) -> bool {
        self.age(now) < self.fresh_for.saturating_add(self.stale_if_error)
    }

    /// The stored validator fields for a conditional request: `ETag`, `Last-Modified`.
    pub(crate) fn validator(&self, name: &str) -> Option<&[u8]> {
        let f = self
            .fields
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name));
        f.map(|(_, v)| &v[..])
    }

    fn weight(&self) -> u64 {
        let fields: usize = self.fields.iter().map(|(n, v)| n.len() + v.len()).sum();
        ENTRY_OVERHEAD + self.body.weight() + 3 * self.get.raw().len() as u64 + fields as u64
    }

    /// The entry answers the request `head` of `scope`.
    fn selected_by(&self, head: &RequestHead, scope: Scope) -> bool {
        self.scope == scope && selects(&self.select, head)
    }
}

/// Whether the request `head` has a variant's selecting values.
fn selects(select: &[(String, Option<Vec<u8>>)], head: &RequestHead) -> bool {
    select
        .iter()
        .all(|(name, value)| request_value(head, name).as_deref() == value.as_deref())
}

/// A response being stored: what is known at its head, its body captured as it is relayed.
pub(crate) struct Pending {
    url: Arc<str>,
    scope: Scope,
    select: Vec<(String, Option<Vec<u8>>)>,
    status: u16,
    reason: String,
    fields: Vec<(String, Vec<u8>)>,
    verdict: policy::Verdict,
    initial_age: Duration,
    received: Instant,
    tags: Vec<String>,
    /// The body so far; None once it passed the size limit.
    body: Option<body::Gather>,
    limit: u64,
}

impl Pending {
    /// The body passed the size limit: it will not be stored.
    pub(crate) fn too_large(&self) -> bool {
        self.body.is_none()
    }

    /// Body bytes as they are relayed.
    #[inline]
    pub(crate) fn push(&mut self, d: &[u8]) {
        if let Some(b) = &mut self.body {
            if b.len() + d.len() as u64 > self.limit || !b.push(d) {
                self.body = None;
            }
        }
    }
}

/// What [`Cache::lock`] gives: the fetch to make, or another request's fetch to wait for.
pub(crate) enum Lock {
    Leader(LockGuard),
    Wait(watch::Receiver<()>),
}

/// Held while a request fetches its URL; dropping it wakes the requests that wait.
pub(crate) struct LockGuard {
    cache: Arc<Cache>,
    url: Arc<str>,
    _tx: watch::Sender<()>,
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Ok(mut locks) = self.cache.locks.lock() {
            locks.remove(&self.url);
        }
    }
}

/// Keeps each slot as long as its longest-lived variant may be used.
struct Retain;

impl moka::Expiry<Arc<str>, Arc<Slot>> for Retain {
    fn expire_after_create(
        &self,
        _: &Arc<str>,
        v: &Arc<Slot>,
        _: std::time::Instant,
    ) -> Option<Duration> {
        Some(v.retain)
    }

    fn expire_after_update(
        &self,
        _: &Arc<str>,
        v: &Arc<Slot>,
        _: std::time::Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        Some(v.retain)
    }
}

impl Cache {
    /// A cache of `memory` bytes over the disk tier `disk`, if any: the one the process already
    /// has on that directory (one tier per directory), else a new one (its directory is created
    /// when missing; what an earlier run stored there is found again in the background).
    pub fn new(memory: u64, disk: Option<&CacheDisk>) -> std::io::Result<Arc<Self>> {
        let store = moka::sync::Cache::builder()
            .max_capacity(memory)
            .weigher(|_: &Arc<str>, s: &Arc<Slot>| s.weight)
            .expire_after(Retain)
            .support_invalidation_closures()
            .build();
        let disk = match disk {
            None => None,
            Some(d) => Some(disk_tier(d)?),
        };
        Ok(Arc::new(Cache {
            memory,
            store,
            disk,
            locks: Mutex::new(HashMap::new()),
            counters: Counters::default(),
        }))
    }

    /// Its memory bound in bytes.
    pub fn capacity(&self) -> u64 {
        self.memory
    }

    /// This cache has the memory and the disk tier `store` asks for.
    pub fn serves(&self, store: &CacheStore) -> bool {
        let disk = self.disk.as_ref().map(|d| d.path());
        let wanted = store.disk.as_ref().map(|d| d.path.as_path());
        self.memory == store.memory && disk == wanted
    }

    /// Waits (at most 5 s) until the disk tier has deleted the files of what was removed so
    /// far: at shutdown.
    pub fn settle(&self) {
        if let Some(d) = &self.disk {
            d.deleted();
        }
    }

    /// The disk tier's directory, files, bytes, bound and counters, when there is one.
    pub fn disk_usage(&self) -> Option<(&std::path::Path, u64, u64, u64, &DiskCounters)> {
        let d = self.disk.as_ref()?;
        let (files, bytes) = d.usage();
        Some((d.path(), files, bytes, d.capacity(), &d.counters))
    }

    /// Entries and their weight in bytes (the store's pending bookkeeping is done first).
    pub fn usage(&self) -> (u64, u64) {
        self.store.run_pending_tasks();
        (self.store.entry_count(), self.store.weighted_size())
    }

    /// The stored response for `url` that the request `head` of `scope` selects.
    pub(crate) fn get(
        &self,
        url: &Arc<str>,
        head: &RequestHead,
        scope: Scope,
    ) -> Option<Arc<Entry>> {
        if let Some(slot) = self.store.get(url) {
            let found = slot.variants.iter().find(|e| e.selected_by(head, scope));
            if let Some(e) = found {
                return Some(e.clone());
            }
        }
        // Read back from disk into memory, unless it was removed meanwhile.
        let disk = self.disk.as_ref()?;
        let (stub, e) = disk.get(url, head, scope)?;
        let e = Arc::new(e);
        let promote = || self.put_memory(url.clone(), e.clone(), true);
        let promoted = disk.promote(url, &stub, promote);
        promoted.then_some(e)
    }

    /// Store a response whose body was relayed whole; false when it was too large.
    pub(crate) fn insert(&self, p: Pending) -> bool {
        let Some(body) = p.body else {
            return false;
        };
        let Some(entry) = Entry::build(
            p.scope,
            p.select,
            p.status,
            p.reason,
            p.fields,
            body.finish(),
            &p.verdict,
            p.initial_age,
            p.received,
            p.tags,
        ) else {
            return false;
        };
        self.put(p.url, Arc::new(entry));
        true
    }

    /// Store `entry` for `url`, in place of the variant it replaces (and on disk, when there
    /// is a disk tier).
    pub(crate) fn put(&self, url: Arc<str>, entry: Arc<Entry>) {
        // The place in the disk's queue is taken first: a purge after the store below drops
        // the write.
        let ticket = self.disk.as_ref().map(|d| d.reserve(entry.body.len()));
        self.put_memory(url.clone(), entry.clone(), false);
        self.counters.stored.fetch_add(1, Ordering::Relaxed);
        if let (Some(d), Some(Some(ticket))) = (&self.disk, ticket) {
            d.write(ticket, url, entry);
        }
    }

    /// `entry` for `url` in the memory tier, in place of the variant it replaces (unless
    /// `absent` and the variant is there: a read-back from disk never replaces a newer store).
    /// Slots change one request at a time per URL.
    fn put_memory(&self, url: Arc<str>, entry: Arc<Entry>, absent: bool) {
        self.store.entry(url).and_compute_with(|old| {
            let old = old.map(|o| o.into_value());
            let old = old.as_ref().map_or(&[][..], |o| &o.variants[..]);
            if absent && old.iter().any(|v| v.same_variant(&entry)) {
                return Op::Nop;
            }
            let others = old.iter().filter(|v| !v.same_variant(&entry));
            let mut variants = vec![entry.clone()];
            variants.extend(others.take(MAX_VARIANTS - 1).cloned());
            Op::Put(slot(variants))
        });
    }

    /// `entry`'s variant of `url` goes (the others stay).
    pub(crate) fn remove_variant(&self, url: &Arc<str>, entry: &Entry) {
        if let Some(d) = &self.disk {
            d.remove_variant(url, entry);
        }
        self.store.entry(url.clone()).and_compute_with(|old| {
            let Some(old) = old.map(|o| o.into_value()) else {
                return Op::Nop;
            };
            let rest = old.variants.iter().filter(|v| !v.same_variant(entry));
            let variants: Vec<Arc<Entry>> = rest.cloned().collect();
            match variants.is_empty() {
                true => Op::Remove,
                false => Op::Put(slot(variants)),
            }
        });
    }

    /// Every variant of `url` leaves the memory tier; whether there was one.
    fn remove_memory(&self, url: &str) -> bool {
        let r = self
            .store
            .entry(Arc::from(url))
            .and_compute_with(|old| match old {
                Some(_) => Op::Remove,
                None => Op::Nop,
            });
        matches!(r, moka::ops::compute::CompResult::Removed(_))
    }

    /// The stored response `stale` of `url` after a 304 with `fresh` fields to a request sent
    /// at `requested` (`auth`: it carried credentials), stored again; None when it is no longer
    /// storable (its variant is removed).
    pub(crate) fn revalidated(
        &self,
        (url, route): (&Arc<str>, &RouteCache),
        stale: &Entry,
        fresh: &[(String, Vec<u8>)],
        auth: bool,
        requested: SystemTime,
    ) -> Option<Arc<Entry>> {
        let field = |name: &str| {
            let f = fresh.iter().find(|(n, _)| n.eq_ignore_ascii_case(name));
            f.map(|(_, v)| &v[..])
        };
        // A 304 for another representation (its ETag is not the stored one) refreshes nothing
        // (RFC 9111 4.3.4): the stored one answers once as it is, and goes.
        if let (Some(new), Some(old)) = (field("etag"), stale.validator("etag")) {
            if new != old {
                self.remove_variant(url, stale);
                return None;
            }
        }
        let merged = policy::merged(&stale.fields, fresh);
        let fields = || merged.iter().map(|(n, v)| (n.as_str(), &v[..]));
        let view = policy::Response {
            status: stale.status,
            fields: &fields,
        };
        let received = SystemTime::now();
        let age = policy::initial_age(field("age"), field("date"), requested, received);
        let entry = policy::storable(&view, auth, route, received)
            .and_then(|v| stale.refreshed(fresh, &v, age, Instant::now()));
        match entry {
            Some(e) => {
                let e = Arc::new(e);
                self.put(url.clone(), e.clone());
                Some(e)
            }
            None => {
                self.remove_variant(url, stale);
                None
            }
        }
    }

    /// An unsafe request to `url` succeeded: its stored responses go (RFC 9111 4.4).
    pub(crate) fn invalidate(&self, url: &str) {
        let purge = Purge::Url(url.to_string());
        let on_disk = self.disk.as_ref().is_some_and(|d| d.remove(&purge));
        if self.remove_memory(url) || on_disk {
            self.counters.invalidated.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Fetch `url`, or wait for the request already fetching it.
    pub(crate) fn lock(self: &Arc<Self>, url: &Arc<str>) -> Lock {
        let Ok(mut locks) = self.locks.lock() else {
            return Lock::Wait(watch::channel(()).1);
        };
        if let Some(rx) = locks.get(url) {
            return Lock::Wait(rx.clone());
        }
        let (tx, rx) = watch::channel(());
        locks.insert(url.clone(), rx);
        Lock::Leader(LockGuard {
            cache: self.clone(),
            url: url.clone(),
            _tx: tx,
        })
    }

    /// Remove what `purge` names; the URL form says whether it was stored.
    pub fn purge(&self, purge: &Purge) -> Result<bool, String> {
        let on_disk = self.disk.as_ref().is_some_and(|d| d.remove(purge));
        let r = match purge {
            Purge::All => {
                self.store.invalidate_all();
                Ok(true)
            }
            Purge::Url(url) => Ok(self.remove_memory(url) || on_disk),
            Purge::Prefix(prefix) => {
                let prefix = prefix.clone();
                self.store
                    .invalidate_entries_if(move |k, _| k.starts_with(prefix.as_str()))
                    .map(|_| true)
                    .map_err(|e| e.to_string())
            }
            Purge::Tag(tag) => {
                let tag = tag.clone();
                self.store
                    .invalidate_entries_if(move |_, s| {
                        s.variants.iter().any(|e| e.tags.contains(&tag))
                    })
                    .map(|_| true)
                    .map_err(|e| e.to_string())
            }
        };
        self.store.run_pending_tasks();
        if let Some(d) = &self.disk {
            d.housekeep();
            d.deleted();
        }
        r
    }
}

/// The disk tiers of the process by directory: caches of successive configurations on one
/// directory share its tier (its index and its thread).
static DISKS: Mutex<Option<HashMap<std::path::PathBuf, std::sync::Weak<disk::Disk>>>> =
    Mutex::new(None);

/// The disk tier on `d.path`: the process's, or a new one with its thread started.
fn disk_tier(d: &CacheDisk) -> std::io::Result<Arc<disk::Disk>> {
    let mut disks = DISKS.lock().unwrap_or_else(|p| p.into_inner());
    let disks = disks.get_or_insert_with(HashMap::new);
    disks.retain(|_, w| w.strong_count() > 0);
    if let Some(shared) = disks.get(&d.path).and_then(|w| w.upgrade()) {
        if shared.capacity() != d.size {
            tracing::warn!(
                "cache: disk_size changes on restart; the disk tier in {} keeps {} bytes",
                d.path.display(),
                shared.capacity()
            );
        }
        return Ok(shared);
    }
    let (disk, queues) = disk::Disk::open(&d.path, d.size).map_err(|e| {
        let m = format!("cache disk_path {}: {e}", d.path.display());
        std::io::Error::new(e.kind(), m)
    })?;
    let disk = Arc::new(disk);
    let weak = Arc::downgrade(&disk);
    std::thread::Builder::new()
        .name("portico-cache-disk".into())
        .spawn(move || disk::run(weak, queues))?;
    disks.insert(d.path.clone(), Arc::downgrade(&disk));
    Ok(disk)
}

/// A slot of `variants`, kept as long as the longest-lived of them.
fn slot(variants: Vec<Arc<Entry>>) -> Arc<Slot> {
    let retain = variants
        .iter()
        .map(|e| e.retain())
        .max()
        .unwrap_or_default();
    let weight = variants.iter().map(|e| e.weight()).sum::<u64>();
    Arc::new(Slot {
        variants,
        retain,
        weight: u32::try_from(weight).unwrap_or(u32::MAX),
    })
}

/// What a purge removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Purge {
    All,
    /// One stored URL (`host/path?query`, as its route's key keeps it).
    Url(String),
    /// Every URL that starts with this (`host/path`).
    Prefix(String),
    /// Every response whose tag field lists this tag.
    Tag(String),
}

impl std::fmt::Display for Purge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Purge::All => f.write_str("everything"),
            Purge::Url(u) => write!(f, "url {u}"),
            Purge::Prefix(p) => write!(f, "prefix {p}"),
            Purge::Tag(t) => write!(f, "tag {t}"),
        }
    }
}

impl Entry {
    /// Whether `other` is the same variant (scope and selecting values).
    fn same_variant(&self, other: &Entry) -> bool {
        self.scope == other.scope && self.select == other.select
    }

    /// A stored response from its parts; None when its head does not parse back.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn build(
        scope: Scope,
        select: Vec<(String, Option<Vec<u8>>)>,
        status: u16,
        reason: String,
        fields: Vec<(String, Vec<u8>)>,
        body: Body,
        verdict: &policy::Verdict,
        initial_age: Duration,
        stored: Instant,
        tags: Vec<String>,
    ) -> Option<Entry> {
        let length = (status != 204).then_some(body.len());
        let all = || fields.iter().map(|(n, v)| (n.as_str(), &v[..]));
        Some(Entry {
            scope,
            get: response_head(status, &reason, all(), length, &Method::Get)?,
            head: response_head(status, &reason, all(), length, &Method::Head)?,
            select,
            fields,
            status,
            reason,
            body,
            stored,
            initial_age,
            fresh_for: verdict.fresh_for,
            stale_if_error: verdict.stale_if_error,
            stale_while_revalidate: verdict.stale_while_revalidate,
            revalidate: verdict.revalidate,
            tags,
        })
    }

    /// The entry after a 304 that carried `fresh` fields, received at `now`.
    pub(crate) fn refreshed(
        &self,
        fresh: &[(String, Vec<u8>)],
        verdict: &policy::Verdict,
        initial_age: Duration,
        now: Instant,
    ) -> Option<Entry> {
        let fields = policy::merged(&self.fields, fresh);
        Entry::build(
            self.scope,
            self.select.clone(),
            self.status,
            self.reason.clone(),
            fields,
            self.body.clone(),
            verdict,
            initial_age,
            now,
            self.tags.clone(),
        )
    }

    /// How long the store keeps it: while fresh, then while it may answer on errors; one that
    /// can be revalidated as long again as it was fresh, at least 10 s.
    fn retain(&self) -> Duration {
        let validated =
            self.validator("etag").is_some() || self.validator("last-modified").is_some();
        let revalidation = match validated {
            true => self.fresh_for.max(Duration::from_secs(10)),
            false => Duration::ZERO,
        };
        let stale = self.stale_if_error.max(self.stale_while_revalidate);
        self.fresh_for.saturating_add(stale.max(revalidation))
    }
}

/// A response head of `status` with `fields` and, when `length` is given, a `Content-Length`,
/// as it answers a request with `method`; None when it does not parse back (a stored field
/// that is not valid in an HTTP/1.1 head).
pub(crate) fn response_head<'f>(
    status: u16,
    reason: &str,
    fields: impl Iterator<Item = (&'f str, &'f [u8])>,
    length: Option<u64>,
    method: &Method,
) -> Option<ResponseHead> {
    let mut raw = BytesMut::with_capacity(256);
    raw.extend_from_slice(format!("HTTP/1.1 {status} {reason}\r\n").as_bytes());
    let mut count = 0;
    for (n, v) in fields {
        raw.extend_from_slice(n.as_bytes());
        raw.extend_from_slice(b": ");
        raw.extend_from_slice(v);
        raw.extend_from_slice(b"\r\n");
        count += 1;
    }
    if let Some(n) = length {
        raw.extend_from_slice(format!("Content-Length: {n}\r\n").as_bytes());
    }
    raw.extend_from_slice(b"\r\n");
    let limits = Limits {
        max_headers: count + 1,
        max_head_bytes: raw.len(),
        ..Limits::default()
    };
    portico_http1::parse_response(&mut raw, method, &limits).ok()?
}

/// What the store needs of a response to keep it: begun at its head by [`pending`].
pub(crate) struct Head<'h, F> {
    pub status: u16,
    pub reason: &'h str,
    pub fields: &'h F,
}

/// Where and how a request's response would be stored.
pub(crate) struct Target<'t> {
    pub url: &'t Arc<str>,
    pub scope: Scope,
    pub route: &'t RouteCache,
    pub tag_header: Option<&'t str>,
    pub max_object: u64,
    /// The request carried credentials (`Authorization`, or the route checks basic auth, a
    /// JWT or a forward auth service; `flow::cached::credentialed` decides): only responses a
    /// shared cache may keep for any client are stored (RFC 9111 3.5).
    pub credentialed: bool,
    /// Whether the route's filters set or drop a request field on its way to the server: a
    /// response that varies on one is not stored (its variant would be chosen by the client's
    /// field, not the one the server saw).
    pub forwarded: &'t dyn Fn(&str) -> bool,
}

/// A response to store, if the route's policy and RFC 9111 allow it: its kept fields, its
/// variant's selecting values, its age; the body follows through [`Pending::push`].
pub(crate) fn pending<'f, F, I>(
    to: &Target<'_>,
    head: &RequestHead,
    resp: &Head<'_, F>,
    requested: SystemTime,
    received: Instant,
) -> Option<Box<Pending>>
where
    F: Fn() -> I,
    I: Iterator<Item = (&'f str, &'f [u8])>,
{
    let now = SystemTime::now();
    let view = policy::Response {
        status: resp.status,
        fields: resp.fields,
    };
    let route = to.route;
    let verdict = policy::storable(&view, to.credentialed, route, now)?;
    let field = |name: &str| {
        (resp.fields)()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    };
    let initial_age = policy::initial_age(field("age"), field("date"), requested, now);
    let connection: Vec<&str> = (resp.fields)()
        .filter(|(n, _)| n.eq_ignore_ascii_case("connection"))
        .filter_map(|(_, v)| std::str::from_utf8(v).ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    let fields: Vec<(String, Vec<u8>)> = (resp.fields)()
        .filter(|(n, _)| policy::kept(n, &connection))
        .map(|(n, v)| (n.to_string(), v.to_vec()))
        .collect();
    let mut select = key_values(head, route);
    for v in (resp.fields)().filter(|(n, _)| n.eq_ignore_ascii_case("vary")) {
        let names = std::str::from_utf8(v.1).unwrap_or_default();
        for name in policy::split_list(names) {
            let name = name.to_ascii_lowercase();
            if (to.forwarded)(&name) {
                return None;
            }
            if !select.iter().any(|(n, _)| *n == name) {
                let value = request_value(head, &name);
                select.push((name, value));
            }
        }
    }
    let tags = match to.tag_header.and_then(field) {
        Some(v) => String::from_utf8_lossy(v)
            .split([',', ' '])
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .collect(),
        None => Vec::new(),
    };
    Some(Box::new(Pending {
        url: to.url.clone(),
        scope: to.scope,
        select,
        status: resp.status,
        reason: resp.reason.to_string(),
        fields,
        verdict,
        initial_age,
        received,
        tags,
        body: Some(body::Gather::new()),
        limit: to.max_object,
    }))
}

/// The route's key fields and cookies as the request carries them.
fn key_values(head: &RequestHead, route: &RouteCache) -> Vec<(String, Option<Vec<u8>>)> {
    let fields = route.key_headers.iter().cloned();
    let cookies = route.key_cookies.iter().map(|c| format!("cookie:{c}"));
    fields
        .chain(cookies)
        .map(|name| {
            let value = request_value(head, &name);
            (name, value)
        })
        .collect()
}

/// A request's value for a selecting name: a field's values joined by ", ", or a cookie's
/// value (`cookie:NAME`).
fn request_value(head: &RequestHead, name: &str) -> Option<Vec<u8>> {
    if let Some(cookie) = name.strip_prefix("cookie:") {
        return cookie_value(head, cookie).map(|v| v.as_bytes().to_vec());
    }
    let mut out: Option<Vec<u8>> = None;
    for (_, v) in head.fields().filter(|(n, _)| n.eq_ignore_ascii_case(name)) {
        match &mut out {
            None => out = Some(v.to_vec()),
            Some(o) => {
                o.extend_from_slice(b", ");
                o.extend_from_slice(v);
            }
        }
    }
    out
}

/// The value of the cookie `name` in the request's `Cookie` fields.
pub(crate) fn cookie_value<'h>(head: &'h RequestHead, name: &str) -> Option<&'h str> {
    head.fields()
        .filter(|(n, _)| n.eq_ignore_ascii_case("cookie"))
        .filter_map(|(_, v)| std::str::from_utf8(v).ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
}

/// Whether the route's bypass rules send the request past the cache.
pub(crate) fn bypassed(head: &RequestHead, route: &RouteCache) -> bool {
    route.bypass_headers.iter().any(|h| head.field(h).is_some())
        || route
            .bypass_cookies
            .iter()
            .any(|c| cookie_value(head, c).is_some())
}

/// The URL a request is stored under: host (lowercase) and path, with the query the route's
/// key keeps (parameters in their order, or sorted by name when the route lists some).
pub(crate) fn url(head: &RequestHead, route: &RouteCache) -> Arc<str> {
    let host = head.host().unwrap_or_default();
    let mut url = String::with_capacity(host.len() + head.target().len());
    url.extend(host.chars().map(|c| c.to_ascii_lowercase()));
    url.push_str(head.path());
    let query = head.query().filter(|q| !q.is_empty());
    match (&route.query, query) {
        (_, None) | (QueryKey::None, _) => {}
        (QueryKey::All, Some(q)) => {
            url.push('?');
            url.push_str(q);
        }
        (QueryKey::Only(names), Some(q)) | (QueryKey::Except(names), Some(q)) => {
            let only = matches!(route.query, QueryKey::Only(_));
            let mut params: Vec<&str> = q
                .split('&')
                .filter(|p| {
                    let name = p.split_once('=').map_or(*p, |(n, _)| n);
                    !p.is_empty() && names.iter().any(|n| n == name) == only
                })
                .collect();
            params.sort_unstable();
            if !params.is_empty() {
                url.push('?');
                url.push_str(&params.join("&"));
            }
        }
    }
    Arc::from(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn request(raw: &str) -> RequestHead {
        let mut b = BytesMut::from(raw);
        portico_http1::parse_request(&mut b, &Limits::default())
            .unwrap()
            .unwrap()
    }

    fn route(query: QueryKey) -> RouteCache {
        RouteCache {
            query,
            key_headers: vec!["accept-language".into()],
            key_cookies: vec!["lang".into()],
            default_ttl: None,
            override_ttl: None,
            stale_if_error: Duration::ZERO,
            stale_while_revalidate: Duration::ZERO,
            bypass_headers: vec!["x-no-cache".into()],
            bypass_cookies: vec!["session".into()],
            lock: true,
            scope: 1,
        }
    }

    #[test]
    fn urls_keep_the_query_the_route_names() {
        let h = request("GET /a/b?z=1&utm=x&a=2 HTTP/1.1\r\nHost: Example.COM\r\n\r\n");
        assert_eq!(
            &*url(&h, &route(QueryKey::All)),
            "example.com/a/b?z=1&utm=x&a=2"
        );
        assert_eq!(&*url(&h, &route(QueryKey::None)), "example.com/a/b");
        let only = QueryKey::Only(vec!["a".into(), "z".into()]);
        assert_eq!(&*url(&h, &route(only)), "example.com/a/b?a=2&z=1");
        let except = QueryKey::Except(vec!["utm".into()]);
        assert_eq!(&*url(&h, &route(except)), "example.com/a/b?a=2&z=1");
        let bare = request("GET /p? HTTP/1.1\r\nHost: h\r\n\r\n");
        assert_eq!(&*url(&bare, &route(QueryKey::All)), "h/p");
    }

    #[test]
    fn bypass_by_field_or_cookie() {
        let r = route(QueryKey::All);
        let plain = request("GET / HTTP/1.1\r\nHost: h\r\nCookie: lang=en\r\n\r\n");
        assert!(!bypassed(&plain, &r));
        let field = request("GET / HTTP/1.1\r\nHost: h\r\nX-No-Cache: 1\r\n\r\n");
        assert!(bypassed(&field, &r));
        let cookie = request("GET / HTTP/1.1\r\nHost: h\r\nCookie: lang=en; session=abc\r\n\r\n");
        assert!(bypassed(&cookie, &r));
    }

    pub(super) const SCOPE: Scope = Scope {
        route: 1,
        tls: false,
        group: 0,
    };

    pub(super) fn stored(
        cache: &Cache,
        url: &str,
        req: &RequestHead,
        vary: &str,
        body: &'static [u8],
    ) {
        let mut fields = vec![
            ("Cache-Control", &b"max-age=60"[..]),
            ("Cache-Tag", b"a, b"),
        ];
        if !vary.is_empty() {
            fields.push(("Vary", vary.as_bytes()));
        }
        let f = || fields.iter().copied();
        let resp = Head {
            status: 200,
            reason: "OK",
            fields: &f,
        };
        let r = route(QueryKey::All);
        let url: Arc<str> = url.into();
        let no = |_: &str| false;
        let to = Target {
            url: &url,
            scope: SCOPE,
            route: &r,
            tag_header: Some("cache-tag"),
            max_object: 1 << 20,
            credentialed: false,
            forwarded: &no,
        };
        let now = SystemTime::now();
        let mut p = pending(&to, req, &resp, now, Instant::now()).unwrap();
        p.push(body);
        assert!(cache.insert(*p));
    }

    #[test]
    fn variants_by_vary_and_key_fields() {
        let cache = Cache::new(1 << 20, None).unwrap();
        let gzip = request("GET / HTTP/1.1\r\nHost: h\r\nAccept-Encoding: gzip\r\n\r\n");
        let br = request("GET / HTTP/1.1\r\nHost: h\r\nAccept-Encoding: br\r\n\r\n");
        let french = request(
            "GET / HTTP/1.1\r\nHost: h\r\nAccept-Encoding: gzip\r\nAccept-Language: fr\r\n\r\n",
        );
        stored(&cache, "h/", &gzip, "Accept-Encoding", b"gz");
        assert!(cache.get(&"h/".into(), &br, SCOPE).is_none());
        stored(&cache, "h/", &br, "accept-encoding", b"br");
        assert_eq!(
            &cache
                .get(&"h/".into(), &gzip, SCOPE)
                .unwrap()
                .body
                .read(0, 2)
                .unwrap()[..],
            b"gz"
        );
        assert_eq!(
            &cache
                .get(&"h/".into(), &br, SCOPE)
                .unwrap()
                .body
                .read(0, 2)
                .unwrap()[..],
            b"br"
        );
        // The route's key field selects too.
        assert!(cache.get(&"h/".into(), &french, SCOPE).is_none());
        let e = cache.get(&"h/".into(), &gzip, SCOPE).unwrap();
        assert_eq!(e.get.field("content-length"), Some(&b"2"[..]));
        assert_eq!(e.head.framing, portico_http1::Framing::None);
        assert!(e.is_fresh(Instant::now()));
        // Another scope (route, scheme or group) never sees them.
        let https = Scope { tls: true, ..SCOPE };
        assert!(cache.get(&"h/".into(), &gzip, https).is_none());
        // One variant goes, the other stays.
        let url: Arc<str> = "h/".into();
        cache.remove_variant(&url, &e);
        assert!(cache.get(&"h/".into(), &gzip, SCOPE).is_none());
        assert!(cache.get(&"h/".into(), &br, SCOPE).is_some());
    }

    #[test]
    fn purges_by_url_prefix_tag_and_all() {
        let cache = Cache::new(1 << 20, None).unwrap();
        let req = request("GET / HTTP/1.1\r\nHost: h\r\n\r\n");
        for url in ["h/a", "h/b/1", "h/b/2", "g/c"] {
            stored(&cache, url, &req, "", b"x");
        }
        assert_eq!(cache.purge(&Purge::Url("h/a".into())), Ok(true));
        assert_eq!(cache.purge(&Purge::Url("h/a".into())), Ok(false));
        cache.purge(&Purge::Prefix("h/b/".into())).unwrap();
        assert!(
            cache.get(&"h/b/1".into(), &req, SCOPE).is_none()
                && cache.get(&"h/b/2".into(), &req, SCOPE).is_none()
        );
        assert!(cache.get(&"g/c".into(), &req, SCOPE).is_some());
        cache.purge(&Purge::Tag("b".into())).unwrap();
        assert!(cache.get(&"g/c".into(), &req, SCOPE).is_none());
        stored(&cache, "g/d", &req, "", b"x");
        cache.purge(&Purge::All).unwrap();
        assert!(cache.get(&"g/d".into(), &req, SCOPE).is_none());
    }

    #[test]
    fn a_body_over_the_limit_is_not_stored() {
        let cache = Cache::new(1 << 20, None).unwrap();
        let req = request("GET / HTTP/1.1\r\nHost: h\r\n\r\n");
        let fields = [("Cache-Control", &b"max-age=60"[..])];
        let f = || fields.iter().copied();
        let resp = Head {
            status: 200,
            reason: "OK",
            fields: &f,
        };
        let r = route(QueryKey::All);
        let url: Arc<str> = "h/".into();
        let no = |_: &str| false;
        let to = Target {
            url: &url,
            scope: SCOPE,
            route: &r,
            tag_header: None,
            max_object: 4,
            credentialed: false,
            forwarded: &no,
        };
        let mut p = pending(&to, &req, &resp, SystemTime::now(), Instant::now()).unwrap();
        p.push(b"abc");
        p.push(b"de");
        assert!(!cache.insert(*p));
    }

    #[test]
    fn one_fetch_per_url_and_waiters_wake_when_it_ends() {
        let cache = Cache::new(1 << 20, None).unwrap();
        let url: Arc<str> = "h/x".into();
        let Lock::Leader(guard) = cache.lock(&url) else {
            panic!("the first request fetches");
        };
        let Lock::Wait(mut rx) = cache.lock(&url) else {
            panic!("the second waits");
        };
        drop(guard);
        // The sender is gone: the wait ends at once.
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert!(rt.block_on(rx.changed()).is_err());
        assert!(matches!(cache.lock(&url), Lock::Leader(_)));
    }
}
