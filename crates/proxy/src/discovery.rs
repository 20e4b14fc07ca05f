//! Upstream groups' `discovery`: DNS names (A/AAAA, SRV) asked again as their TTL expires and etcd prefixes read on an interval, on a thread of their own, each change of a group's servers handed to the control plane.

use crate::etcd::client::EtcdKey;
use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolverConfig, ResolverOpts,
};
use hickory_resolver::proto::rr::{RData, RecordType};
use hickory_resolver::TokioResolver;
use portico_config::{AddressFamily, Discovery, DiscoverySource, Resolver, Server};
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// Largest weight a server may have (the configuration's `weight` limit); SRV weights above it
/// are scaled down.
const MAX_WEIGHT: u32 = 1000;

/// What one lookup of a discovery found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Servers (sorted by address, at least one) and how long the answer holds.
    Found(Vec<Server>, Duration),
    /// The name does not exist or has no records of the kind asked (NXDOMAIN, NODATA, or SRV
    /// records whose targets have no address of the family asked).
    Gone(String),
    /// No answer: timeout, SERVFAIL, refused, no name server reachable.
    Failed(String),
}

/// A group's servers as its discovery last found them, and what asked for them.
#[derive(Debug, Clone)]
pub(crate) struct Found {
    /// Which asking this is: a change a task publishes names it, and one whose asking the
    /// configuration no longer has (its name, or its resolver, changed since) is ignored.
    pub id: u64,
    pub spec: Discovery,
    pub resolver: Resolver,
    /// Empty when nothing was found yet.
    pub servers: Vec<Server>,
    /// The first lookup, which the group's task starts from.
    pub first: Asked,
    pub at: Instant,
}

/// One group's discovery for the thread: what to ask and what was found when the
/// configuration was applied.
#[derive(Debug, Clone)]
pub(crate) struct Watch {
    pub group: String,
    pub found: Found,
}

/// Called with (group, the asking's id, servers) when a group's servers change; false when the
/// configuration with them was refused (the task tries again after its next lookup).
pub(crate) type Publish = Arc<dyn Fn(&str, u64, Vec<Server>) -> bool + Send + Sync>;

/// A new asking's id.
pub(crate) fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The lookups of each group, for the admin API and `/metrics`.
#[derive(Default)]
pub(crate) struct Status {
    groups: Mutex<BTreeMap<String, GroupStatus>>,
}

/// One group's discovery as the admin API and `/metrics` show it.
#[derive(Debug, Clone)]
pub(crate) struct GroupStatus {
    spec: Discovery,
    /// `dns`, `srv` or `etcd`.
    pub kind: &'static str,
    pub name: String,
    /// Servers found by the last successful lookup (those in use while a name is held).
    pub servers: Vec<Server>,
    /// `ok`, `gone: ...` or `failed: ...`.
    pub last_result: String,
    pub last_ok: Option<SystemTime>,
    pub next_lookup: Option<SystemTime>,
    pub ok_total: u64,
    pub gone_total: u64,
    pub failed_total: u64,
    /// etcd registrations the last read left out, each as "KEY: why".
    pub skipped: Vec<String>,
}

impl Status {
    /// Every group's status, by group name.
    pub(crate) fn snapshot(&self) -> Vec<(String, GroupStatus)> {
        let g = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        g.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    pub(crate) fn record(
        &self,
        group: &str,
        spec: &Discovery,
        outcome: &Outcome,
        next: Option<Instant>,
    ) {
        let mut g = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        // Another name for the group starts over.
        if g.get(group).is_some_and(|s| s.spec != *spec) {
            g.remove(group);
        }
        let s = g.entry(group.to_string()).or_insert_with(|| GroupStatus {
            spec: spec.clone(),
            kind: match spec.source {
                DiscoverySource::Dns { .. } => "dns",
                DiscoverySource::Srv { .. } => "srv",
                DiscoverySource::Etcd { .. } => "etcd",
            },
            name: spec.source.name().to_string(),
            servers: Vec::new(),
            last_result: String::new(),
            last_ok: None,
            next_lookup: None,
            ok_total: 0,
            gone_total: 0,
            failed_total: 0,
            skipped: Vec::new(),
        });
        s.next_lookup =
            next.map(|n| SystemTime::now() + n.saturating_duration_since(Instant::now()));
        match outcome {
            Outcome::Found(servers, _) => {
                s.servers = servers.clone();
                s.last_result = "ok".into();
                s.last_ok = Some(SystemTime::now());
                s.ok_total += 1;
            }
            Outcome::Gone(why) => {
                s.last_result = format!("gone: {why}");
                s.gone_total += 1;
            }
            Outcome::Failed(why) => {
                s.last_result = format!("failed: {why}");
                s.failed_total += 1;
            }
        }
    }

    /// The servers a held name gave up (its hold ran out).
    fn cleared(&self, group: &str) {
        let mut g = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = g.get_mut(group) {
            s.servers.clear();
        }
    }

    /// Keep only these groups.
    pub(crate) fn retain(&self, groups: &[&str]) {
        let mut g = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        g.retain(|k, _| groups.contains(&k.as_str()));
    }
}

/// What a group's task does after each lookup (sans-io): which servers to publish and when to
/// ask again.
#[derive(Debug)]
pub(crate) struct Tracker {
    resolver: Resolver,
    /// The servers published last (None: nothing yet).
    last: Option<Vec<Server>>,
    gone_since: Option<Instant>,
    failures: u32,
}

impl Tracker {
    pub(crate) fn new(resolver: Resolver, published: Option<Vec<Server>>) -> Tracker {
        Tracker {
            resolver,
            last: published,
            gone_since: None,
            failures: 0,
        }
    }

    /// The servers to publish (when they changed) and when to ask next.
    pub(crate) fn on(&mut self, outcome: &Outcome, now: Instant) -> (Option<Vec<Server>>, Instant) {
        let r = &self.resolver;
        match outcome {
            Outcome::Found(servers, ttl) => {
                self.failures = 0;
                self.gone_since = None;
                let next = now + (*ttl).clamp(r.min_ttl, r.max_ttl);
                if self.last.as_ref() == Some(servers) {
                    return (None, next);
                }
                (Some(servers.clone()), next)
            }
            Outcome::Gone(_) => {
                self.failures += 1;
                let since = *self.gone_since.get_or_insert(now);
                let retry = now + self.backoff();
                let held = self.last.as_ref().is_some_and(|l| !l.is_empty());
                if !held {
                    return (None, retry);
                }
                let until = since + r.hold;
                if now >= until {
                    return (Some(Vec::new()), retry);
                }
                (None, retry.min(until))
            }
            Outcome::Failed(_) => {
                self.failures += 1;
                (None, now + self.backoff())
            }
        }
    }

    /// The servers [`Tracker::on`] gave were applied.
    pub(crate) fn published(&mut self, servers: Vec<Server>) {
        self.last = Some(servers);
    }

    /// After failed lookups: `min_ttl` (at least 1 s), doubling per failure, at most `max_ttl`.
    fn backoff(&self) -> Duration {
        let base = self.resolver.min_ttl.max(Duration::from_secs(1));
        let doubled = base.saturating_mul(1 << self.failures.saturating_sub(1).min(16));
        doubled.min(self.resolver.max_ttl.max(base))
    }
}

/// SRV answers as servers: the records of the lowest priority present, each target's
/// addresses (from `addresses`) on the record's port. Weights are the records' (0 counts as 1),
/// scaled down when one is above the largest weight a server may have. A target of "." (no
/// service) and targets without addresses are left out.
pub(crate) fn srv_servers(
    records: &[(u16, u16, u16, String)],
    addresses: &HashMap<String, Vec<IpAddr>>,
) -> Vec<Server> {
    let Some(lowest) = records.iter().filter(|r| !is_root(&r.3)).map(|r| r.0).min() else {
        return Vec::new();
    };
    let chosen: Vec<_> = records
        .iter()
        .filter(|r| r.0 == lowest && !is_root(&r.3))
        .collect();
    let heaviest = chosen.iter().map(|r| u32::from(r.1)).max().unwrap_or(1);
    let mut servers: Vec<Server> = Vec::new();
    for (_, weight, port, target) in chosen {
        let weight = match heaviest > MAX_WEIGHT {
            true => u32::from(*weight) * MAX_WEIGHT / heaviest,
            false => u32::from(*weight),
        }
        .max(1);
        for ip in addresses
            .get(&target.to_ascii_lowercase())
            .into_iter()
            .flatten()
        {
            let address = SocketAddr::new(*ip, *port);
            if !servers.iter().any(|s| s.address == address) {
                servers.push(Server { address, weight });
            }
        }
    }
    servers.sort_by_key(|s| s.address);
    servers
}

/// The registrations under an etcd prefix (key, value) as servers: each value `IP:PORT` or
/// `{"address": "IP:PORT", "weight": N}` (N from 1 to the largest weight; `weight` when it
/// gives none), sorted by address, an address registered twice counted once (its first key).
/// Also the registrations left out, each as "KEY: why".
pub(crate) fn registered(entries: &[(String, String)], weight: u32) -> (Vec<Server>, Vec<String>) {
    let mut servers: Vec<Server> = Vec::new();
    let mut skipped = Vec::new();
    for (key, value) in entries {
        let parsed = registration(value.trim(), weight);
        match parsed {
            Ok(s) if servers.iter().any(|o| o.address == s.address) => {}
            Ok(s) => servers.push(s),
            Err(why) => skipped.push(format!("{}: {why}", short(key))),
        }
    }
    servers.sort_by_key(|s| s.address);
    (servers, skipped)
}

/// One registration's value as a server.
fn registration(value: &str, weight: u32) -> Result<Server, String> {
    // What is said about a value is kept short (logs, the admin API).
    if value.len() > 256 {
        return Err(format!(
            "a value of {} bytes, not an address or {{\"address\", \"weight\"}}",
            value.len()
        ));
    }
    let (address, weight) = match value.starts_with('{') {
        false => (value.to_string(), weight),
        true => {
            let v: serde_json::Value =
                serde_json::from_str(value).map_err(|e| format!("not JSON: {e}"))?;
            let address = v["address"]
                .as_str()
                .ok_or("no \"address\" string")?
                .to_string();
            let weight = match &v["weight"] {
                serde_json::Value::Null => weight,
                w => match w.as_u64() {
                    Some(n @ 1..) if n <= u64::from(MAX_WEIGHT) => n as u32,
                    _ => {
                        return Err(format!(
                            "weight {w} is not a whole number from 1 to {MAX_WEIGHT}"
                        ))
                    }
                },
            };
            (address, weight)
        }
    };
    let address: SocketAddr = address
        .parse()
        .map_err(|_| format!("{address:?} is not IP:PORT"))?;
    if address.port() == 0 || address.ip().is_unspecified() {
        return Err(format!("{address} is not a server's address"));
    }
    Ok(Server { address, weight })
}

/// What one lookup found: the outcome, the etcd registrations left out ("KEY: why"), and the
/// etcd revision an etcd prefix was read at (a watch from it misses no change).
#[derive(Debug, Clone)]
pub(crate) struct Asked {
    pub outcome: Outcome,
    pub skipped: Vec<String>,
    pub revision: Option<i64>,
}

impl From<Outcome> for Asked {
    fn from(outcome: Outcome) -> Asked {
        Asked {
            outcome,
            skipped: Vec::new(),
            revision: None,
        }
    }
}

/// The etcd prefix of an etcd discovery, reached as its `[etcd]` settings say (their files
/// read now); None for a DNS discovery.
fn etcd_key(d: &Discovery) -> Option<Result<EtcdKey, String>> {
    match &d.source {
        DiscoverySource::Etcd { url, client, .. } => Some(EtcdKey::new(url.clone(), client)),
        _ => None,
    }
}

/// One read of the registrations under an etcd prefix (on a blocking thread: the client is
/// blocking, bounded by its own timeout).
async fn etcd_lookup(key: &EtcdKey, weight: u32, interval: Duration) -> Asked {
    let key = key.clone();
    let read = tokio::task::spawn_blocking(move || key.list_at()).await;
    let (entries, revision) = match read {
        Ok(Ok(e)) => e,
        Ok(Err(e)) => return Outcome::Failed(short(&e)).into(),
        Err(e) => return Outcome::Failed(short(&e)).into(),
    };
    let (servers, skipped) = registered(&entries, weight);
    let outcome = match servers.is_empty() {
        false => Outcome::Found(servers, interval),
        true => Outcome::Gone(match entries.is_empty() {
            true => "no server registered".into(),
            false => format!("{} registration(s), none usable", entries.len()),
        }),
    };
    Asked {
        outcome,
        skipped,
        revision: Some(revision),
    }
}

/// Sleep until `next`; for an etcd prefix read at `revision`, a watch of the prefix ends the
/// wait early at its first change (on a blocking thread; when no watch can be had, the wait
/// goes on to `next`).
async fn wait_until(etcd: Option<&EtcdKey>, revision: Option<i64>, next: Instant) {
    let (Some(key), Some(revision)) = (etcd, revision) else {
        tokio::time::sleep_until(next.into()).await;
        return;
    };
    let key = key.clone();
    let wait = next.saturating_duration_since(Instant::now());
    let watched =
        tokio::task::spawn_blocking(move || key.changed_since(revision, true, wait)).await;
    if !matches!(watched, Ok(Ok(_))) {
        tokio::time::sleep_until(next.into()).await;
    }
}

/// One lookup of a discovery: an etcd prefix read (through `etcd`, or a client made for it
/// when None), or a DNS name asked through `r` (a resolver made for it when None), bounded by
/// the resolver's two attempts.
async fn ask(
    r: Option<&TokioResolver>,
    etcd: Option<&EtcdKey>,
    settings: &Resolver,
    d: &Discovery,
) -> Asked {
    if let DiscoverySource::Etcd { interval, .. } = &d.source {
        return match etcd {
            Some(key) => etcd_lookup(key, d.weight, *interval).await,
            None => match etcd_key(d) {
                Some(Ok(key)) => etcd_lookup(&key, d.weight, *interval).await,
                Some(Err(e)) => Outcome::Failed(e).into(),
                None => Outcome::Failed("not an etcd discovery".into()).into(),
            },
        };
    }
    let made;
    let r = match r {
        Some(r) => r,
        None => match resolver(settings, d.family) {
            Ok(m) => {
                made = m;
                &made
            }
            Err(e) => return Outcome::Failed(e).into(),
        },
    };
    let limit = settings.timeout * 3 + Duration::from_secs(1);
    match tokio::time::timeout(limit, lookup(r, d)).await {
        Ok(o) => o.into(),
        Err(_) => Outcome::Failed("no answer in time".into()).into(),
    }
}

/// What a group's task schedules by: the resolver's settings for DNS names; for an etcd
/// prefix, its interval in place of the TTL bounds (the resolver's `hold` kept).
fn schedule(settings: &Resolver, d: &Discovery) -> Resolver {
    match &d.source {
        DiscoverySource::Etcd { interval, .. } => Resolver {
            min_ttl: *interval,
            max_ttl: *interval,
            ..settings.clone()
        },
        _ => settings.clone(),
    }
}

/// A resolver for these settings: the listed name servers (UDP, TCP when truncated), or the
/// system's.
fn resolver(settings: &Resolver, family: AddressFamily) -> Result<TokioResolver, String> {
    let provider = hickory_resolver::net::runtime::TokioRuntimeProvider::default();
    let mut builder = match settings.nameservers.is_empty() {
        true => TokioResolver::builder(provider)
            .map_err(|e| format!("cannot read the system's resolver configuration: {e}"))?,
        false => {
            let servers = settings
                .nameservers
                .iter()
                .map(|a| {
                    let mut udp = ConnectionConfig::udp();
                    udp.port = a.port();
                    let mut tcp = ConnectionConfig::tcp();
                    tcp.port = a.port();
                    NameServerConfig::new(a.ip(), true, vec![udp, tcp])
                })
                .collect();
            TokioResolver::builder_with_config(ResolverConfig::from_name_servers(servers), provider)
        }
    };
    let opts: &mut ResolverOpts = builder.options_mut();
    opts.timeout = settings.timeout;
    opts.attempts = 2;
    opts.ip_strategy = match family {
        AddressFamily::Any => LookupIpStrategy::Ipv4AndIpv6,
        AddressFamily::Ipv4 => LookupIpStrategy::Ipv4Only,
        AddressFamily::Ipv6 => LookupIpStrategy::Ipv6Only,
    };
    // Every lookup asks the name servers: the tasks keep their own schedule by TTL.
    opts.cache_size = 0;
    // Names are the name servers' answers alone, as for nginx's and HAProxy's resolvers.
    opts.use_hosts_file = hickory_resolver::config::ResolveHosts::Never;
    builder
        .build()
        .map_err(|e| format!("cannot build a resolver: {e}"))
}

fn family_allows(family: AddressFamily, ip: &IpAddr) -> bool {
    match family {
        AddressFamily::Any => true,
        AddressFamily::Ipv4 => ip.is_ipv4(),
        AddressFamily::Ipv6 => ip.is_ipv6(),
    }
}

/// Whether an error means the name is gone (NXDOMAIN or no records) rather than unanswered.
fn classify(e: &hickory_resolver::net::NetError) -> Outcome {
    match e.is_nx_domain() || e.is_no_records_found() {
        true => Outcome::Gone(short(e)),
        false => Outcome::Failed(short(e)),
    }
}

fn short(e: &impl std::fmt::Display) -> String {
    let mut s = e.to_string();
    s.truncate(200);
    s
}

/// `name` with its final dot: names are asked as written, never with search domains appended.
fn absolute(name: &str) -> String {
    match name.ends_with('.') {
        true => name.to_string(),
        false => format!("{name}."),
    }
}

/// The addresses of `name` of the family asked, A and AAAA asked apart: a part that fails
/// fails the whole (an answer to one part alone would drop the other part's servers), a part
/// without records is no address of that family.
async fn addresses(
    r: &TokioResolver,
    name: &str,
    family: AddressFamily,
) -> Result<(Vec<IpAddr>, Instant), Outcome> {
    let kinds: &[RecordType] = match family {
        AddressFamily::Any => &[RecordType::A, RecordType::AAAA],
        AddressFamily::Ipv4 => &[RecordType::A],
        AddressFamily::Ipv6 => &[RecordType::AAAA],
    };
    let mut ips: Vec<IpAddr> = Vec::new();
    let mut valid_until: Option<Instant> = None;
    let mut gone = None;
    for &kind in kinds {
        match r.lookup(name, kind).await {
            Ok(l) => {
                let found: Vec<IpAddr> = l
                    .answers()
                    .iter()
                    .filter_map(|rec| rec.data.ip_addr())
                    .filter(|ip| family_allows(family, ip))
                    .collect();
                if found.is_empty() {
                    gone = Some(format!("no {kind} records"));
                    continue;
                }
                valid_until = Some(valid_until.map_or(l.valid_until(), |v| v.min(l.valid_until())));
                for ip in found {
                    if !ips.contains(&ip) {
                        ips.push(ip);
                    }
                }
            }
            Err(e) => match classify(&e) {
                Outcome::Gone(why) => gone = Some(why),
                other => return Err(other),
            },
        }
    }
    match valid_until {
        Some(v) => Ok((ips, v)),
        None => Err(Outcome::Gone(
            gone.unwrap_or_else(|| "no address records".into()),
        )),
    }
}

/// One lookup of a DNS discovery.
async fn lookup(r: &TokioResolver, d: &Discovery) -> Outcome {
    let now = Instant::now();
    match &d.source {
        DiscoverySource::Etcd { .. } => Outcome::Failed("an etcd prefix is not a DNS name".into()),
        DiscoverySource::Dns { name, port } => {
            match addresses(r, &absolute(name), d.family).await {
                Ok((ips, valid_until)) => {
                    let mut servers: Vec<Server> = ips
                        .into_iter()
                        .map(|ip| Server {
                            address: SocketAddr::new(ip, *port),
                            weight: d.weight,
                        })
                        .collect();
                    servers.sort_by_key(|s| s.address);
                    Outcome::Found(servers, valid_until.saturating_duration_since(now))
                }
                Err(o) => o,
            }
        }
        DiscoverySource::Srv { name } => {
            let l = match r.lookup(absolute(name), RecordType::SRV).await {
                Ok(l) => l,
                Err(e) => return classify(&e),
            };
            let mut valid_until = l.valid_until();
            let mut records = Vec::new();
            for rec in l.answers() {
                if let RData::SRV(s) = &rec.data {
                    let target = s.target.to_ascii().to_ascii_lowercase();
                    records.push((s.priority, s.weight, s.port, target));
                }
            }
            // Each target of the lowest priority asked for its addresses (the answer's
            // additional section may hold some, but not both families, nor their own TTLs).
            let lowest = records.iter().filter(|r| !is_root(&r.3)).map(|r| r.0).min();
            let mut addresses_of: HashMap<String, Vec<IpAddr>> = HashMap::new();
            for (priority, _, _, target) in &records {
                if Some(*priority) != lowest || is_root(target) || addresses_of.contains_key(target)
                {
                    continue;
                }
                match addresses(r, &absolute(target), d.family).await {
                    Ok((ips, until)) => {
                        valid_until = valid_until.min(until);
                        addresses_of.insert(target.clone(), ips);
                    }
                    Err(Outcome::Gone(_)) => {}
                    Err(Outcome::Failed(why)) => {
                        return Outcome::Failed(format!("{target}: {why}"))
                    }
                    Err(o) => return o,
                }
            }
            let servers = srv_servers(&records, &addresses_of);
            match servers.is_empty() {
                false => Outcome::Found(servers, valid_until.saturating_duration_since(now)),
                true => Outcome::Gone("no SRV target with an address".into()),
            }
        }
    }
}

/// An SRV target of "." (or empty): the service is not offered there.
fn is_root(target: &str) -> bool {
    target == "." || target.is_empty()
}

/// The first lookup of each discovery, all at once, on a thread of their own (the caller may
/// be inside a runtime); the caller waits for them (each bounded by its resolver's timeout).
pub(crate) fn resolve_now(asks: &[(String, Discovery, Resolver)]) -> Vec<Found> {
    if asks.is_empty() {
        return Vec::new();
    }
    let outcomes = std::thread::scope(|s| {
        s.spawn(|| {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let why = format!("cannot start the resolver's runtime: {e}");
                    return asks
                        .iter()
                        .map(|_| Outcome::Failed(why.clone()).into())
                        .collect();
                }
            };
            rt.block_on(async {
                let mut set = tokio::task::JoinSet::new();
                for (i, (_, d, r)) in asks.iter().enumerate() {
                    let (d, r) = (d.clone(), r.clone());
                    set.spawn(async move { (i, ask(None, None, &r, &d).await) });
                }
                let mut out: Vec<Asked> =
                    vec![Outcome::Failed("not asked".into()).into(); asks.len()];
                while let Some(joined) = set.join_next().await {
                    if let Ok((i, o)) = joined {
                        out[i] = o;
                    }
                }
                out
            })
        })
        .join()
        .unwrap_or_else(|_| {
            vec![Outcome::Failed("resolver thread failed".into()).into(); asks.len()]
        })
    });
    let at = Instant::now();
    asks.iter()
        .zip(outcomes)
        .map(|((group, spec, resolver), first)| {
            for why in &first.skipped {
                tracing::warn!(
                    upstream = group.as_str(),
                    "discovery: {}: a registration is left out: {why}",
                    spec.source.name()
                );
            }
            let servers = match &first.outcome {
                Outcome::Found(s, _) => s.clone(),
                _ => Vec::new(),
            };
            match &first.outcome {
                Outcome::Found(s, _) => tracing::info!(
                    upstream = group.as_str(),
                    "discovery: {} gives {} server(s): {}",
                    spec.source.name(),
                    s.len(),
                    list(s)
                ),
                Outcome::Gone(why) | Outcome::Failed(why) => tracing::warn!(
                    upstream = group.as_str(),
                    "discovery: {} gives no server yet ({why}); asked again shortly",
                    spec.source.name()
                ),
            }
            Found {
                id: next_id(),
                spec: spec.clone(),
                resolver: resolver.clone(),
                servers,
                first,
                at,
            }
        })
        .collect()
}

/// Servers as "IP:port" words.
pub(crate) fn list(servers: &[Server]) -> String {
    let words: Vec<String> = servers.iter().map(|s| s.address.to_string()).collect();
    match words.is_empty() {
        true => "none".into(),
        false => words.join(", "),
    }
}

/// The discovery thread: one task per group, asking its name again as the answer expires.
pub(crate) struct Manager {
    tx: tokio::sync::mpsc::UnboundedSender<Vec<Watch>>,
}

impl Manager {
    /// Start the thread; `publish` is told of every change of a group's servers.
    pub(crate) fn start(publish: Publish, status: Arc<Status>) -> std::io::Result<Manager> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<Watch>>();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name("portico-discovery".into())
            .spawn(move || {
                rt.block_on(async move {
                    let mut tasks: HashMap<u64, tokio::task::AbortHandle> = HashMap::new();
                    while let Some(watches) = rx.recv().await {
                        let keys: Vec<u64> = watches.iter().map(|w| w.found.id).collect();
                        tasks.retain(|k, t| {
                            let keep = keys.contains(k);
                            if !keep {
                                t.abort();
                            }
                            keep
                        });
                        let groups: Vec<&str> = watches.iter().map(|w| w.group.as_str()).collect();
                        status.retain(&groups);
                        for (w, key) in watches.iter().zip(keys) {
                            if tasks.contains_key(&key) {
                                continue;
                            }
                            let task =
                                tokio::spawn(follow(w.clone(), publish.clone(), status.clone()));
                            tasks.insert(key, task.abort_handle());
                        }
                    }
                    for t in tasks.values() {
                        t.abort();
                    }
                })
            })?;
        Ok(Manager { tx })
    }

    /// The discoveries of the configuration just applied: new ones start from what was found
    /// then, gone ones stop, unchanged ones go on.
    pub(crate) fn update(&self, watches: Vec<Watch>) {
        let _ = self.tx.send(watches);
    }
}

/// One group's discovery: ask again as each answer expires, publish each change.
async fn follow(w: Watch, publish: Publish, status: Arc<Status>) {
    let Watch { group, found } = w;
    let spec = found.spec;
    // The servers the configuration has now (found now, or kept from an earlier asking).
    let published = Some(found.servers.clone()).filter(|s| !s.is_empty());
    let mut tracker = Tracker::new(schedule(&found.resolver, &spec), published);
    let (_, mut next) = tracker.on(&found.first.outcome, found.at);
    let r = match &spec.source {
        DiscoverySource::Etcd { .. } => None,
        _ => match resolver(&found.resolver, spec.family) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::error!(upstream = group.as_str(), "discovery: {e}");
                None
            }
        },
    };
    // The etcd client, made once (its files read, its token kept); one that cannot be made
    // (a CA file unreadable) is tried again before each read, which fails with the reason.
    let mut etcd = etcd_key(&spec).and_then(Result::ok);
    let mut left_out = found.first.skipped.clone();
    let mut revision = found.first.revision;
    loop {
        status.record_next(&group, next);
        wait_until(etcd.as_ref(), revision, next).await;
        if etcd.is_none() {
            etcd = etcd_key(&spec).and_then(Result::ok);
        }
        let Asked {
            outcome,
            skipped,
            revision: read_at,
        } = ask(r.as_ref(), etcd.as_ref(), &found.resolver, &spec).await;
        // After a failed read no watch (it would start from a revision whose change is still
        // unread, and end at once): the backoff holds.
        revision = match outcome {
            Outcome::Failed(_) => None,
            _ => read_at.or(revision),
        };
        let now = Instant::now();
        let (change, at) = tracker.on(&outcome, now);
        next = at;
        status.record(&group, &spec, &outcome, Some(next));
        if matches!(outcome, Outcome::Found(..) | Outcome::Gone(..)) && skipped != left_out {
            for why in skipped.iter().filter(|w| !left_out.contains(w)) {
                tracing::warn!(
                    upstream = group.as_str(),
                    "discovery: {}: a registration is left out: {why}",
                    spec.source.name()
                );
            }
            status.skipped(&group, skipped.clone());
            left_out = skipped;
        }
        match &outcome {
            Outcome::Found(..) => {}
            Outcome::Gone(why) => tracing::warn!(
                "discovery: {} for upstream {group}: nothing found ({why}); servers found before are kept for the hold ({:?})",
                spec.source.name(),
                found.resolver.hold
            ),
            Outcome::Failed(why) => tracing::warn!(
                "discovery: {} for upstream {group}: lookup failed ({why}); the servers found last are kept",
                spec.source.name()
            ),
        }
        if let Some(servers) = change {
            // Refused (the configuration with them could not be applied): asked again after
            // the next lookup.
            if publish(&group, found.id, servers.clone()) {
                if servers.is_empty() {
                    status.cleared(&group);
                }
                tracker.published(servers);
            }
        }
    }
}

impl Status {
    pub(crate) fn skipped(&self, group: &str, skipped: Vec<String>) {
        let mut g = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = g.get_mut(group) {
            s.skipped = skipped;
        }
    }

    fn record_next(&self, group: &str, next: Instant) {
        let mut g = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = g.get_mut(group) {
            s.next_lookup =
                Some(SystemTime::now() + next.saturating_duration_since(Instant::now()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(a: &str, weight: u32) -> Server {
        Server {
            address: a.parse().unwrap(),
            weight,
        }
    }

    fn settings() -> Resolver {
        Resolver {
            min_ttl: Duration::from_secs(2),
            max_ttl: Duration::from_secs(60),
            hold: Duration::from_secs(30),
            ..Resolver::DEFAULT
        }
    }

    #[test]
    fn srv_takes_the_lowest_priority_its_ports_and_weights() {
        let records = vec![
            (10, 5, 8080, "a.example.".to_string()),
            (10, 0, 8081, "b.example.".to_string()),
            (20, 100, 9000, "backup.example.".to_string()),
            (10, 3, 8082, "gone.example.".to_string()),
        ];
        let mut addresses = HashMap::new();
        addresses.insert(
            "a.example.".to_string(),
            vec!["10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()],
        );
        addresses.insert("b.example.".to_string(), vec!["10.0.0.1".parse().unwrap()]);
        addresses.insert(
            "backup.example.".to_string(),
            vec!["10.0.0.9".parse().unwrap()],
        );
        let got = srv_servers(&records, &addresses);
        assert_eq!(
            got,
            vec![
                server("10.0.0.1:8080", 5),
                server("10.0.0.1:8081", 1),
                server("10.0.0.2:8080", 5),
            ]
        );
    }

    #[test]
    fn srv_weights_above_the_largest_are_scaled_and_dot_means_none() {
        let records = vec![
            (0, 65535, 1, "a.".to_string()),
            (0, 655, 2, "a.".to_string()),
            (0, 1, 3, "a.".to_string()),
        ];
        let mut addresses = HashMap::new();
        addresses.insert("a.".to_string(), vec!["10.0.0.1".parse().unwrap()]);
        let got = srv_servers(&records, &addresses);
        let weights: Vec<u32> = got.iter().map(|s| s.weight).collect();
        assert_eq!(weights, vec![1000, 9, 1]);
        assert!(srv_servers(&[(0, 1, 80, ".".to_string())], &addresses).is_empty());
        assert!(srv_servers(&[], &addresses).is_empty());
    }

    #[test]
    fn etcd_registrations_are_addresses_or_json_and_the_rest_is_left_out() {
        let entries: Vec<(String, String)> = [
            ("/s/a", "10.0.0.2:80"),
            ("/s/b", r#"{"address": "10.0.0.1:8080", "weight": 7}"#),
            ("/s/c", " 10.0.0.2:80\n"),
            ("/s/d", "app.internal:80"),
            ("/s/e", r#"{"address": "10.0.0.3:80", "weight": 0}"#),
            ("/s/f", r#"{"weight": 2}"#),
            ("/s/g", "0.0.0.0:80"),
            ("/s/h", r#"{"address": "[::1]:81"}"#),
            ("/s/i", "{not json"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let (servers, skipped) = registered(&entries, 4);
        assert_eq!(
            servers,
            vec![
                server("10.0.0.1:8080", 7),
                server("10.0.0.2:80", 4),
                server("[::1]:81", 4),
            ]
        );
        let keys: Vec<&str> = skipped
            .iter()
            .map(|s| s.split(':').next().unwrap())
            .collect();
        assert_eq!(
            keys,
            vec!["/s/d", "/s/e", "/s/f", "/s/g", "/s/i"],
            "{skipped:?}"
        );
        assert!(
            skipped[0].contains("\"app.internal:80\" is not IP:PORT"),
            "{skipped:?}"
        );
        assert!(skipped[1].contains("weight 0 is not a whole number from 1 to 1000"));
    }

    #[test]
    fn an_etcd_prefix_is_read_on_its_interval() {
        let d = Discovery {
            source: DiscoverySource::Etcd {
                url: portico_config::EtcdUrl::parse("etcd://e/s").unwrap(),
                name: "etcd://e:2379/s".into(),
                interval: Duration::from_millis(200),
                client: Default::default(),
            },
            family: AddressFamily::Any,
            weight: 1,
        };
        let t0 = Instant::now();
        let mut t = Tracker::new(schedule(&settings(), &d), None);
        let one = vec![server("10.0.0.1:80", 1)];
        let (_, next) = t.on(&Outcome::Found(one, Duration::from_millis(200)), t0);
        assert_eq!(
            next,
            t0 + Duration::from_millis(200),
            "not the resolver's min_ttl"
        );
        let (_, next) = t.on(&Outcome::Failed("refused".into()), t0);
        assert_eq!(
            next,
            t0 + Duration::from_secs(1),
            "etcd down: asked every second"
        );
        let (_, next) = t.on(&Outcome::Failed("refused".into()), t0);
        assert_eq!(next, t0 + Duration::from_secs(1));
    }

    #[test]
    fn a_change_is_published_once_and_the_ttl_is_clamped() {
        let t0 = Instant::now();
        let mut t = Tracker::new(settings(), None);
        let one = vec![server("10.0.0.1:80", 1)];
        let (p, next) = t.on(&Outcome::Found(one.clone(), Duration::from_secs(0)), t0);
        assert_eq!(p, Some(one.clone()));
        assert_eq!(next, t0 + Duration::from_secs(2), "min_ttl");
        // refused: offered again after the next lookup
        let (p, _) = t.on(&Outcome::Found(one.clone(), Duration::from_secs(0)), t0);
        assert_eq!(p, Some(one.clone()), "not applied: offered again");
        t.published(one.clone());
        let (p, next) = t.on(&Outcome::Found(one.clone(), Duration::from_secs(3600)), t0);
        assert_eq!(p, None, "the same servers are not published again");
        assert_eq!(next, t0 + Duration::from_secs(60), "max_ttl");
        let two = vec![server("10.0.0.1:80", 1), server("10.0.0.2:80", 1)];
        let (p, next) = t.on(&Outcome::Found(two.clone(), Duration::from_secs(5)), t0);
        assert_eq!(p, Some(two));
        assert_eq!(next, t0 + Duration::from_secs(5));
    }

    #[test]
    fn failures_keep_the_servers_and_back_off() {
        let t0 = Instant::now();
        let mut t = Tracker::new(settings(), Some(vec![server("10.0.0.1:80", 1)]));
        let mut waits = Vec::new();
        for _ in 0..8 {
            let (p, next) = t.on(&Outcome::Failed("timeout".into()), t0);
            assert_eq!(p, None);
            waits.push((next - t0).as_secs());
        }
        assert_eq!(waits, vec![2, 4, 8, 16, 32, 60, 60, 60]);
        // an answer resets the backoff
        let one = vec![server("10.0.0.1:80", 1)];
        assert_eq!(
            t.on(&Outcome::Found(one, Duration::from_secs(10)), t0).0,
            None
        );
        let (_, next) = t.on(&Outcome::Failed("timeout".into()), t0);
        assert_eq!(next, t0 + Duration::from_secs(2));
    }

    #[test]
    fn a_gone_name_is_held_then_its_servers_go() {
        let t0 = Instant::now();
        let mut t = Tracker::new(settings(), Some(vec![server("10.0.0.1:80", 1)]));
        let gone = Outcome::Gone("NXDOMAIN".into());
        let (p, next) = t.on(&gone, t0);
        assert_eq!(p, None, "held");
        assert!(next <= t0 + Duration::from_secs(30));
        let (p, next) = t.on(&gone, t0 + Duration::from_secs(29));
        assert_eq!(p, None);
        assert_eq!(
            next,
            t0 + Duration::from_secs(30),
            "the next lookup is at the end of the hold"
        );
        let (p, _) = t.on(&gone, t0 + Duration::from_secs(30));
        assert_eq!(p, Some(Vec::new()), "the hold is over: no server");
        t.published(Vec::new());
        let (p, _) = t.on(&gone, t0 + Duration::from_secs(40));
        assert_eq!(p, None, "published once");
        // back
        let one = vec![server("10.0.0.3:80", 1)];
        let (p, _) = t.on(
            &Outcome::Found(one.clone(), Duration::from_secs(10)),
            t0 + Duration::from_secs(50),
        );
        assert_eq!(p, Some(one));
    }

    #[test]
    fn a_name_gone_from_the_start_publishes_nothing() {
        let t0 = Instant::now();
        let mut t = Tracker::new(settings(), None);
        let (p, _) = t.on(&Outcome::Gone("NXDOMAIN".into()), t0);
        assert_eq!(p, None);
        let (p, _) = t.on(
            &Outcome::Gone("NXDOMAIN".into()),
            t0 + Duration::from_secs(100),
        );
        assert_eq!(p, None);
    }
}
