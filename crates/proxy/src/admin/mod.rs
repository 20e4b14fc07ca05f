//! The admin listener: status and change API, Prometheus `/metrics` and the live dashboard, on its own thread.

use crate::control::Control;
use crate::metrics::{Exposition, HistogramSnapshot, RouteStats, BUCKETS_US};
use crate::runtime::Changes;
use crate::state::Shared;
use crate::telemetry::stats::Stats;
use bytes::BytesMut;
use portico_config::{Action, Admin, Balance, Route, UpstreamGroup};
use portico_http1::{parse_request, Framing};
use portico_upstream::{AdminState, Health, ServerStatus, Upstream};
use serde_json::{json, Value};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

const DASHBOARD: &str = include_str!("dashboard.html");
/// Largest admin request body.
const MAX_BODY: usize = 64 * 1024;
/// An admin connection idle (or stalled mid-request) this long is closed.
const IDLE: Duration = Duration::from_secs(30);

/// The running admin listener.
pub struct AdminServer {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
    /// A copy of the listening socket, for a successor (binary upgrade).
    copy: std::net::TcpListener,
}

impl AdminServer {
    /// Bind `cfg.address` (or take a predecessor's socket, `inherited`) and serve on a thread
    /// of its own, so a busy data plane never delays the operator and the operator never
    /// delays the data plane.
    pub fn start(
        control: Arc<Control>,
        cfg: &Admin,
        inherited: Option<std::net::TcpListener>,
    ) -> io::Result<AdminServer> {
        let std_listener = match inherited {
            Some(l) => l,
            None => std::net::TcpListener::bind(cfg.address)?,
        };
        std_listener.set_nonblocking(true)?;
        let copy = std_listener.try_clone()?;
        let addr = std_listener.local_addr()?;
        let (stop, mut stopped) = watch::channel(false);
        let token = cfg.token.clone().map(Arc::<str>::from);
        let thread = std::thread::Builder::new()
            .name("portico-admin".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::error!("admin runtime failed to start: {e}");
                        return;
                    }
                };
                rt.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(std_listener) {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::error!("cannot register the admin listener: {e}");
                            return;
                        }
                    };
                    loop {
                        tokio::select! {
                            r = listener.accept() => match r {
                                Ok((stream, peer)) => {
                                    let _ = stream.set_nodelay(true);
                                    tokio::spawn(serve(stream, peer, control.clone(), token.clone()));
                                }
                                Err(e) => {
                                    tracing::warn!("admin accept failed: {e}");
                                    tokio::time::sleep(Duration::from_millis(10)).await;
                                }
                            },
                            _ = stopped.changed() => return,
                        }
                    }
                });
            })?;
        Ok(AdminServer {
            addr,
            stop,
            thread: Some(thread),
            copy,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The listening socket, for a successor.
    pub(crate) fn socket(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.copy.as_fd()
    }

    /// Stop serving and wait for the thread.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.halt();
    }
}

/// One admin request, as the handlers see it.
#[derive(Debug)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    pub authorization: Option<String>,
    pub body: Vec<u8>,
    /// Who asked, for the log lines of changes: `admin API from PEER`.
    pub by: String,
}

/// One admin response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

impl Response {
    fn json(status: u16, v: &Value) -> Response {
        let mut body = serde_json::to_vec_pretty(v).unwrap_or_default();
        body.push(b'\n');
        Response {
            status,
            content_type: "application/json",
            body,
        }
    }

    fn error(status: u16, message: impl Into<String>) -> Response {
        Response::json(status, &json!({ "error": message.into() }))
    }
}

async fn serve(
    mut stream: TcpStream,
    peer: std::net::SocketAddr,
    control: Arc<Control>,
    token: Option<Arc<str>>,
) {
    let mut buf = BytesMut::with_capacity(4096);
    let limits = portico_http1::Limits::default();
    loop {
        let head = loop {
            match parse_request(&mut buf, &limits) {
                Ok(Some(h)) => break h,
                Ok(None) => {}
                Err(e) => {
                    let r = Response::error(400, format!("bad request: {e}"));
                    let _ = write(&mut stream, &r, false).await;
                    return;
                }
            }
            match tokio::time::timeout(IDLE, stream.read_buf(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return,
            }
        };
        let len = match head.framing {
            Framing::None => 0,
            Framing::Length(n) if n <= MAX_BODY as u64 => n as usize,
            _ => {
                let r = Response::error(
                    413,
                    "admin request bodies are limited to 64 KiB, with Content-Length",
                );
                let _ = write(&mut stream, &r, false).await;
                return;
            }
        };
        while buf.len() < len {
            match tokio::time::timeout(IDLE, stream.read_buf(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return,
            }
        }
        let body = buf.split_to(len).to_vec();
        let req = Request {
            method: head.method().as_str().to_string(),
            path: head.path().to_string(),
            query: head.query().map(str::to_string),
            authorization: head
                .field("authorization")
                .map(|v| String::from_utf8_lossy(v).into_owned()),
            body,
            by: format!("admin API from {peer}"),
        };
        // On the blocking pool: a reload, a purge waiting for its files, a large status do not
        // hold up the admin listener's other connections.
        let (c, t) = (control.clone(), token.clone());
        let answered = tokio::task::spawn_blocking(move || (handle(&c, t.as_deref(), &req), req));
        let Ok((resp, req)) = answered.await else {
            return;
        };
        tracing::debug!(method = %req.method, path = %req.path, status = resp.status, "admin");
        if write(&mut stream, &resp, head.keep_alive).await.is_err() || !head.keep_alive {
            return;
        }
    }
}

async fn write(stream: &mut TcpStream, r: &Response, keep_alive: bool) -> io::Result<()> {
    let reason = match r.status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        413 => "Content Too Large",
        422 => "Unprocessable Content",
        _ => "Error",
    };
    let mut out = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\n",
        r.status,
        r.content_type,
        r.body.len()
    );
    if r.status == 401 {
        out.push_str("WWW-Authenticate: Bearer realm=\"portico admin\"\r\n");
    }
    if !keep_alive {
        out.push_str("Connection: close\r\n");
    }
    out.push_str("\r\n");
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(&r.body);
    stream.write_all(&bytes).await
}

/// Whether the request carries the token: `Authorization: Bearer TOKEN`, or `?token=TOKEN` (so a
/// browser can open the dashboard, which passes it on to its API calls).
fn authorized(token: Option<&str>, req: &Request) -> bool {
    let Some(token) = token else { return true };
    let bearer = req
        .authorization
        .as_deref()
        .and_then(|a| a.strip_prefix("Bearer "))
        .map(str::trim);
    let query = req
        .query
        .as_deref()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("token=")));
    [bearer, query]
        .into_iter()
        .flatten()
        .any(|t| constant_time_eq(t.as_bytes(), token.as_bytes()))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Route one admin request (sans-io apart from the control plane it reads and changes).
pub fn handle(control: &Control, token: Option<&str>, req: &Request) -> Response {
    if !authorized(token, req) {
        return Response::error(401, "a bearer token is required");
    }
    // Segments percent-decoded: the dashboard encodes a server's address (`10.0.0.1%3A80`).
    let decoded: Vec<String> = req
        .path
        .trim_matches('/')
        .split('/')
        .map(percent_decode)
        .collect();
    let segments: Vec<&str> = decoded.iter().map(String::as_str).collect();
    match (req.method.as_str(), segments.as_slice()) {
        ("GET" | "HEAD", [""]) => Response {
            status: 200,
            content_type: "text/html; charset=utf-8",
            body: DASHBOARD.as_bytes().to_vec(),
        },
        ("GET" | "HEAD", ["metrics"]) => Response {
            status: 200,
            content_type: "text/plain; version=0.0.4; charset=utf-8",
            body: metrics(control).into_bytes(),
        },
        ("GET" | "HEAD", ["api", "status"]) => Response::json(200, &status(control)),
        ("GET" | "HEAD", ["api", "config"]) => {
            let shared = control.snapshot();
            Response::json(
                200,
                &json!({
                    "generation": shared.generation,
                    "explain": portico_config::explain(&shared.config),
                    "groups": groups_json(&shared),
                }),
            )
        }
        ("POST", ["api", "reload"]) => match control.reload(&req.by) {
            Ok(s) => Response::json(
                200,
                &json!({
                    "generation": s.generation,
                    "added": s.added,
                    "removed": s.removed,
                    "kept": s.kept,
                    "changes": s.changes,
                }),
            ),
            Err(e) => Response::error(
                422,
                format!("reload refused, the running configuration stays: {e}"),
            ),
        },
        ("POST", ["api", "groups", group, "servers"]) => add_server(control, group, req),
        ("DELETE", ["api", "groups", group, "servers", server]) => {
            remove_server(control, group, server, &req.by)
        }
        (
            "POST",
            ["api", "groups", group, "servers", server, action @ ("drain" | "disable" | "enable")],
        ) => {
            let state = match *action {
                "drain" => AdminState::Draining,
                "disable" => AdminState::Disabled,
                _ => AdminState::Enabled,
            };
            with_server(control, group, server, |u, i, changes| {
                let address = u.group().servers[i].address;
                u.set_admin_at(i, state, Instant::now());
                changes.record_state(group, address, state);
                tracing::info!(by = req.by, group, server = %address, state = admin_name(state), "admin: server state changed");
                Ok(())
            })
        }
        ("POST" | "PUT", ["api", "groups", group, "servers", server, "weight"]) => {
            let text = String::from_utf8_lossy(&req.body);
            let Ok(weight) = text.trim().parse::<u32>() else {
                return Response::error(
                    400,
                    format!(
                        "the body must be a weight, an integer from 1, found {:?}",
                        text.trim()
                    ),
                );
            };
            with_server(control, group, server, |u, i, changes| {
                let s = &u.group().servers[i];
                // Back to the configured weight: no override left to shadow a later edit of
                // the file.
                if weight == s.weight {
                    u.clear_weight(i);
                } else if !u.set_weight(i, weight) {
                    return Err(Response::error(
                        400,
                        "weight must be at least 1 (use disable to take a server out)",
                    ));
                }
                changes.record_weight(group, s.address, weight, s.weight);
                tracing::info!(by = req.by, group, server = %s.address, weight, "admin: server weight changed");
                Ok(())
            })
        }
        ("GET" | "HEAD", ["api", "cache"]) => match &control.snapshot().cache {
            None => Response::error(404, "no route caches: the configuration has no cache"),
            Some(cache) => Response::json(200, &cache_json(cache)),
        },
        ("DELETE", ["api", "cache"]) => purge(control, req),
        ("GET" | "HEAD", ["api", "acme"]) => {
            Response::json(200, &json!({ "certificates": acme_json() }))
        }
        ("POST", ["api", "acme", "renew"]) => acme_renew(req),
        ("GET" | "HEAD", ["api", "fleet"]) => match control.fleet_view() {
            Some(view) => Response::json(200, &view),
            None => Response::error(
                404,
                "no fleet: this instance's configuration does not come from etcd",
            ),
        },
        ("GET" | "HEAD", ["api", "discovery"]) => {
            Response::json(200, &json!({ "groups": discovery_json(control) }))
        }
        ("GET" | "HEAD", ["api", "changes"]) => {
            let (groups, file) = control.runtime_changes();
            Response::json(
                200,
                &json!({
                    "state_file": file.map(|f| f.display().to_string()),
                    "groups": groups,
                }),
            )
        }
        ("DELETE", ["api", "changes"]) => match control.revert_runtime_changes() {
            Ok(s) => {
                tracing::info!(by = req.by, "admin: runtime changes undone");
                Response::json(200, &json!({ "generation": s.generation, "groups": {} }))
            }
            Err(e) => Response::error(409, format!("change refused: {e}")),
        },
        (
            _,
            [""]
            | ["metrics"]
            | ["api", "status"]
            | ["api", "config"]
            | ["api", "reload"]
            | ["api", "changes"]
            | ["api", "acme"]
            | ["api", "acme", "renew"],
        )
        | (_, ["api", "groups", _, "servers", ..]) => Response::error(405, "method not allowed"),
        _ => Response::error(404, "no such admin resource"),
    }
}

/// The cache's counters and what it holds.
fn cache_json(cache: &crate::cache::Cache) -> Value {
    let c = &cache.counters;
    let (entries, bytes) = cache.usage();
    json!({
        "entries": entries,
        "bytes": bytes,
        "capacity_bytes": cache.capacity(),
        "requests": {
            "hit": c.hits.load(Relaxed),
            "collapsed": c.collapsed.load(Relaxed),
            "miss": c.misses.load(Relaxed),
            "revalidated": c.revalidated.load(Relaxed),
            "stale": c.stale.load(Relaxed),
            "updating": c.updating.load(Relaxed),
            "bypass": c.bypass.load(Relaxed),
        },
        "refreshed": c.refreshed.load(Relaxed),
        "refresh_failed": c.refresh_failed.load(Relaxed),
        "stored": c.stored.load(Relaxed),
        "invalidated": c.invalidated.load(Relaxed),
        "hit_bytes": c.hit_bytes.load(Relaxed),
        "waiting": c.waiting.load(Relaxed),
        "disk": cache.disk_usage().map(|(path, files, bytes, capacity, d)| json!({
            "path": path.display().to_string(),
            "entries": files,
            "bytes": bytes,
            "capacity_bytes": capacity,
            "reads": d.reads.load(Relaxed),
            "writes": d.writes.load(Relaxed),
            "writes_skipped": d.skipped.load(Relaxed),
            "errors": d.errors.load(Relaxed),
        })),
    })
}

/// `DELETE /api/cache`: everything, or `?url=HOST/PATH?QUERY`, `?prefix=HOST/PATH` or
/// `?tag=TAG` (one of them).
fn purge(control: &Control, req: &Request) -> Response {
    use crate::cache::Purge;
    let Some(cache) = control.snapshot().cache.clone() else {
        return Response::error(404, "no route caches: the configuration has no cache");
    };
    let query = req.query.as_deref().unwrap_or_default();
    let pairs: Vec<(String, String)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(&v.replace('+', " ")))
        })
        .collect();
    let purge = match pairs.as_slice() {
        [] => Purge::All,
        [(k, v)] if !v.is_empty() => match k.as_str() {
            "url" => Purge::Url(v.clone()),
            "prefix" => Purge::Prefix(v.clone()),
            "tag" => Purge::Tag(v.clone()),
            _ => {
                return Response::error(400, format!("unknown purge {k:?}: use url, prefix or tag"))
            }
        },
        _ => return Response::error(
            400,
            "purge one thing: ?url=HOST/PATH, ?prefix=HOST/PATH or ?tag=TAG (nothing: everything)",
        ),
    };
    match cache.purge(&purge) {
        Ok(found) => {
            tracing::info!(by = req.by, "admin: cache purged: {purge}");
            Response::json(200, &json!({ "purged": purge.to_string(), "found": found }))
        }
        Err(e) => Response::error(503, format!("purge refused: {e}")),
    }
}

/// `%XX` sequences of a path segment decoded (invalid ones and non-UTF-8 results kept as
/// they came).
fn percent_decode(segment: &str) -> String {
    if !segment.contains('%') {
        return segment.to_string();
    }
    let b = segment.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap_or_else(|_| segment.to_string())
}

/// Find a group and one of its servers (by index or address) in the current snapshot, run `f`
/// (which records what it changed), and answer with the server's new status. Runs under the
/// control plane's lock, so no reload replaces the group meanwhile.
fn with_server(
    control: &Control,
    group: &str,
    server: &str,
    f: impl FnOnce(&Upstream, usize, &mut Changes) -> Result<(), Response>,
) -> Response {
    let found = control.change_runtime(|changes, shared| {
        let Some(u) = shared.upstreams.iter().find(|u| u.group().name == group) else {
            return Err(Response::error(404, format!("no upstream group {group:?}")));
        };
        let Some(i) = server_index(u.group(), server) else {
            return Err(Response::error(
                404,
                format!("group {group:?} has no server {server:?} (give its index or address)"),
            ));
        };
        f(u, i, changes).map(|()| i)
    });
    let i = match found {
        Ok(i) => i,
        Err(r) => return r,
    };
    let shared = control.snapshot();
    let groups = groups_json(&shared);
    let server = groups
        .iter()
        .find(|g| g["name"] == group)
        .and_then(|g| g["servers"].get(i))
        .cloned()
        .unwrap_or(Value::Null);
    Response::json(200, &server)
}

fn server_index(group: &UpstreamGroup, server: &str) -> Option<usize> {
    if let Ok(i) = server.parse::<usize>() {
        return (i < group.servers.len()).then_some(i);
    }
    let addr: SocketAddr = server.parse().ok()?;
    group.servers.iter().position(|s| s.address == addr)
}

/// Record a server list change and apply the configuration again with it, under the control
/// plane's lock: the change goes through the same path as a reload (state of the servers that
/// stay is carried over). A change the configuration cannot take is undone, and nothing else.
fn change_servers(
    control: &Control,
    group: &str,
    change: impl FnOnce(&UpstreamGroup, &mut Changes) -> Result<(), Response>,
) -> Response {
    let applied = control.change_servers(
        |changes, shared| {
            let Some(u) = shared.upstreams.iter().find(|u| u.group().name == group) else {
                return Err(Response::error(404, format!("no upstream group {group:?}")));
            };
            change(u.group(), changes)
        },
        |e| Response::error(409, format!("change refused: {e}")),
    );
    match applied {
        Ok(((), s)) => {
            let shared = control.snapshot();
            let groups = groups_json(&shared);
            let g = groups
                .into_iter()
                .find(|g| g["name"] == group)
                .unwrap_or(Value::Null);
            Response::json(200, &json!({ "generation": s.generation, "group": g }))
        }
        Err(r) => r,
    }
}

fn add_server(control: &Control, group: &str, req: &Request) -> Response {
    let v: Value = match serde_json::from_slice(&req.body) {
        Ok(v) => v,
        Err(e) => {
            return Response::error(
                400,
                format!(
                "the body must be JSON like {{\"address\": \"10.0.0.5:8080\", \"weight\": 1}}: {e}"
            ),
            )
        }
    };
    let Some(address) = v["address"]
        .as_str()
        .and_then(|a| a.parse::<SocketAddr>().ok())
    else {
        return Response::error(
            400,
            "\"address\" must be an IP address with a port, e.g. \"10.0.0.5:8080\"",
        );
    };
    let weight = match &v["weight"] {
        Value::Null => 1,
        w => match w
            .as_u64()
            .and_then(|w| u32::try_from(w).ok())
            .filter(|w| (1..=1000).contains(w))
        {
            Some(w) => w,
            None => return Response::error(400, "\"weight\" must be an integer from 1 to 1000"),
        },
    };
    let r = change_servers(control, group, |g, changes| {
        if g.servers.iter().any(|s| s.address == address) {
            return Err(Response::error(
                409,
                format!("group {group:?} already has server {address}"),
            ));
        }
        changes.record_added(group, address, weight);
        Ok(())
    });
    if r.status == 200 {
        tracing::info!(by = req.by, group, %address, weight, "admin: server added");
    }
    r
}

fn remove_server(control: &Control, group: &str, server: &str, by: &str) -> Response {
    let mut removed = None;
    let r = change_servers(control, group, |g, changes| {
        let Some(i) = server_index(g, server) else {
            return Err(Response::error(
                404,
                format!("group {group:?} has no server {server:?} (give its index or address)"),
            ));
        };
        if g.servers.len() == 1 {
            return Err(Response::error(
                409,
                "cannot remove the last server of a group",
            ));
        }
        let address = g.servers[i].address;
        changes.record_removed(group, address);
        removed = Some(address);
        Ok(())
    });
    if let Some(address) = removed.filter(|_| r.status == 200) {
        tracing::info!(by, group, %address, "admin: server removed");
    }
    r
}

/// A TLS listener's certificates with the end of their validity (read from their files now, so
/// certificates reloaded on change show their new dates).
fn certificates_json(tls: &portico_config::TlsSettings) -> Value {
    let now = crate::telemetry::stats::unix_now() as i64;
    let list: Vec<Value> = portico_tls::certificate_dates(tls)
        .into_iter()
        .map(|c| {
            json!({
                "file": c.file.display().to_string(),
                "subject": c.subject,
                "not_after": portico_tls::utc_date(c.not_after),
                "days_left": (c.not_after - now).div_euclid(86_400),
            })
        })
        .collect();
    Value::Array(list)
}

fn histogram_json(h: &HistogramSnapshot) -> Value {
    json!({
        "count": h.count(),
        "sum_us": h.sum_us,
        "buckets": h.counts.to_vec(),
        "p50": h.quantile(0.50),
        "p95": h.quantile(0.95),
        "p99": h.quantile(0.99),
    })
}

fn action_text(a: &Action, shared: &Shared) -> String {
    match a {
        Action::Proxy(p) => format!(
            "proxy {}",
            shared
                .config
                .upstreams
                .get(p.upstream)
                .map_or("?", |g| g.name.as_str())
        ),
        Action::Static(_) => "static".into(),
        Action::Origin(_) => "origin".into(),
        Action::Redirect { status, .. } => format!("redirect {status}"),
        Action::Fixed { status, .. } => format!("respond {status}"),
    }
}

fn health_name(h: Health) -> &'static str {
    match h {
        Health::Up => "up",
        Health::Down => "down",
    }
}

fn admin_name(a: AdminState) -> &'static str {
    match a {
        AdminState::Enabled => "enabled",
        AdminState::Draining => "draining",
        AdminState::Disabled => "disabled",
    }
}

fn balance_name(b: &Balance) -> String {
    match b {
        Balance::RoundRobin => "round_robin".into(),
        Balance::LeastConnections => "least_connections".into(),
        Balance::TwoRandomChoices => "two_random_choices".into(),
        Balance::HashClientIp => "hash client_ip".into(),
        Balance::HashHeader(h) => format!("hash header {h}"),
        Balance::HashCookie(c) => format!("hash cookie {c}"),
    }
}

fn groups_json(shared: &Shared) -> Vec<Value> {
    shared
        .upstreams
        .iter()
        .zip(&shared.group_stats)
        .map(|(u, gs)| {
            let g = u.group();
            let servers: Vec<Value> = u
                .status(Instant::now())
                .into_iter()
                .enumerate()
                .map(|(i, st)| {
                    let time = gs.header_time.get(i).map(|h| h.snapshot());
                    json!({
                        "index": i,
                        "address": st.address.to_string(),
                        "weight": st.weight,
                        "effective_weight": st.effective_weight,
                        "health": health_name(st.health),
                        "admin": admin_name(st.admin),
                        "ejected": st.ejected,
                        "active": st.active,
                        "consecutive_failures": st.consecutive_failures,
                        "requests": st.requests,
                        "responses": st.responses.to_vec(),
                        "failures": st.failures,
                        "bytes": st.bytes,
                        "ejections": st.ejections,
                        "health_transitions": st.health_transitions,
                        "last_check": st.last_check,
                        "state_since_seconds": st.state_since.map(|d| d.as_secs_f64()),
                        "header_time": time.as_ref().map(histogram_json),
                    })
                })
                .collect();
            json!({
                "name": g.name,
                "balance": balance_name(&g.balance),
                "no_server": gs.no_server.load(Relaxed),
                "queue": {
                    "size": g.queue,
                    "timeout_seconds": g.queue_timeout.as_secs_f64(),
                    "waiting": gs.queue.waiting(),
                    "queued": gs.queue.queued.load(Relaxed),
                    "admitted": gs.queue.admitted.load(Relaxed),
                    "full": gs.queue.full.load(Relaxed),
                    "timeouts": gs.queue.timeouts.load(Relaxed),
                },
                "header_time": histogram_json(&gs.header_time_total()),
                "servers": servers,
            })
        })
        .collect()
}

fn counters(stats: &Stats, control: &Control) -> Value {
    json!({
        "connections_accepted": stats.connections_accepted.load(Relaxed),
        "connections_refused": stats.connections_refused.load(Relaxed),
        "h2_connections": stats.h2_connections.load(Relaxed),
        "h3_connections": stats.h3_connections.load(Relaxed),
        "requests": stats.requests.load(Relaxed),
        "upstream_requests": stats.upstream_requests.load(Relaxed),
        "upstream_reused": stats.upstream_reused.load(Relaxed),
        "upstream_connects": stats.upstream_connects.load(Relaxed),
        "upstream_retries": stats.upstream_retries.load(Relaxed),
        "retries": stats.retries.load(Relaxed),
        "retries_budget_exhausted": stats.retries_budget_exhausted.load(Relaxed),
        "rate_limited": stats.rate_limited.load(Relaxed),
        "upstream_idle_connections": control.idle_upstream.load(Relaxed),
        "tls_handshake_failures": stats.tls_handshake_failures.load(Relaxed),
        "requests_shed": stats.requests_shed.load(Relaxed),
        "shedding": stats.shedding.load(Relaxed),
    })
}

/// The resilience policies a route has (`retry`, `rate_limit`), for the dashboard.
fn route_policies(r: &Route) -> Vec<&'static str> {
    let mut out = Vec::new();
    if matches!(&r.action, Action::Proxy(p) if p.retry.is_some()) {
        out.push("retry");
    }
    if r.rate_limit.is_some() {
        out.push("rate_limit");
    }
    out
}

/// The whole state as JSON: what the dashboard polls and an operator scripts against.
pub fn status(control: &Control) -> Value {
    let shared = control.snapshot();
    let listeners: Vec<Value> = shared
        .listeners
        .iter()
        .map(|ls| {
            let l = &ls.listener;
            let routes: Vec<Value> = l
                .routes
                .iter()
                .zip(&ls.route_stats)
                .map(|(r, rs)| {
                    let classes: Vec<u64> = rs.responses.iter().map(|c| c.load(Relaxed)).collect();
                    json!({
                        "name": r.name,
                        "action": action_text(&r.action, &shared),
                        "match": portico_config::describe_matcher(&r.matcher),
                        "responses": classes,
                        "latency": histogram_json(&rs.latency.snapshot()),
                        "retries": rs.retries.load(Relaxed),
                        "retries_budget_exhausted": rs.retries_budget_exhausted.load(Relaxed),
                        "rate_limited": rs.rate_limited.load(Relaxed),
                        "policies": route_policies(r),
                    })
                })
                .collect();
            json!({
                "name": l.name,
                "address": control
                    .addrs()
                    .into_iter()
                    .find(|(n, _)| *n == l.name)
                    .map(|(_, a)| a.to_string()),
                "tls": l.tls.is_some(),
                "certificates": l.tls.as_ref().map(certificates_json),
                "shed": l.shed.is_some(),
                "connections": control.listener_connections(&l.name),
                "routes": routes,
            })
        })
        .collect();
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "pid": std::process::id(),
        "events": crate::telemetry::logging::RECENT.last(20),
        "uptime_seconds": control.started.elapsed().as_secs_f64(),
        "generation": shared.generation,
        "workers": control.workers,
        "buckets_us": BUCKETS_US.to_vec(),
        "counters": counters(&shared.stats, control),
        "listeners": listeners,
        "groups": groups_json(&shared),
        "cache": shared.cache.as_deref().map(cache_json),
        "acme": acme_json(),
        "discovery": discovery_json(control),
        "fleet": control.fleet_view(),
    })
}

/// Each discovering group: what it asks, the servers found, the last lookup and the next.
fn discovery_json(control: &Control) -> Value {
    let unix = |t: Option<std::time::SystemTime>| {
        t.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_secs())
    };
    let list: Vec<Value> = control
        .discovery_status
        .snapshot()
        .into_iter()
        .map(|(group, s)| {
            let next = unix(s.next_lookup);
            let last_ok = unix(s.last_ok);
            json!({
                "group": group,
                "kind": s.kind,
                "name": s.name,
                "servers": s.servers.iter().map(|v| json!({
                    "address": v.address.to_string(),
                    "weight": v.weight,
                })).collect::<Vec<_>>(),
                "last_result": s.last_result,
                "last_ok": last_ok.map(|t| portico_tls::utc_date(t as i64)),
                "last_ok_unix": last_ok,
                "next_lookup": next.map(|t| portico_tls::utc_date(t as i64)),
                "next_lookup_unix": next,
                "ok_total": s.ok_total,
                "gone_total": s.gone_total,
                "failed_total": s.failed_total,
                "skipped": s.skipped,
            })
        })
        .collect();
    Value::Array(list)
}

/// The certificates obtained by ACME: names, issuer, dates, next renewal and why, last error.
fn acme_json() -> Value {
    let list: Vec<Value> = crate::acme::status()
        .into_iter()
        .map(|s| {
            let date = |t: Option<u64>| t.map(|t| portico_tls::utc_date(t as i64));
            json!({
                "names": s.names,
                "storage": s.storage,
                "directory": s.directory,
                "challenge": s.challenge,
                "issued": s.issued,
                "issuer": s.issuer,
                "not_after": date(s.not_after),
                "not_after_unix": s.not_after,
                "next_renewal": date(s.next_renewal),
                "next_renewal_unix": s.next_renewal,
                "renewal_basis": s.renewal_basis,
                "ordering": s.ordering,
                "last_error": s.last_error,
                "last_error_at": date(s.last_error_at),
                "failures": s.failures,
                "issued_total": s.issued_total,
                "failed_total": s.failed_total,
            })
        })
        .collect();
    Value::Array(list)
}

/// `POST /api/acme/renew`: order now the certificate covering `?name=NAME`, or every one.
fn acme_renew(req: &Request) -> Response {
    let query = req.query.as_deref().unwrap_or_default();
    let mut name = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("name", v)) if !v.is_empty() => name = Some(percent_decode(v)),
            _ => {
                return Response::error(
                    400,
                    format!(
                    "unknown query {pair:?}: expected ?name=NAME or nothing (every certificate)"
                ),
                )
            }
        }
    }
    match crate::acme::renew(name.as_deref()) {
        Ok(names) => {
            tracing::info!(by = req.by, certificates = %names.join(" "), "admin: ACME renewal asked");
            Response::json(202, &json!({ "renewing": names }))
        }
        Err(e) => Response::error(404, e),
    }
}

/// A per-route counter family: name, help, the counter, and which routes have it.
type RouteCounter = (
    &'static str,
    &'static str,
    fn(&RouteStats) -> &AtomicU64,
    fn(&Route) -> bool,
);

/// The status classes responses are counted by.
const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// The Prometheus exposition of the whole process: process-wide counters, listeners and
/// routes, groups, servers, terminations.
pub fn metrics(control: &Control) -> String {
    let shared = control.snapshot();
    let mut e = Exposition::new();
    process_metrics(&mut e, control, &shared);
    route_metrics(&mut e, control, &shared);
    group_metrics(&mut e, &shared);
    server_metrics(&mut e, &shared);
    termination_metrics(&mut e, &shared.stats);
    if let Some(cache) = &shared.cache {
        cache_metrics(&mut e, cache);
    }
    acme_metrics(&mut e);
    discovery_metrics(&mut e, control);
    fleet_view_metrics(&mut e, control);
    if let Some(f) = &shared.fleet {
        fleet_metrics(&mut e, f);
    }
    e.finish()
}

/// The fleet's Redis: reachable or not, the mode fleet limits are in, exchanges, keys counted.
fn fleet_metrics(e: &mut Exposition, f: &crate::resilience::fleet::Fleet) {
    let up = f.is_up();
    e.family(
        "portico_fleet_redis_up",
        "gauge",
        "1 when the fleet's Redis answered the last exchange of counts.",
    );
    e.sample("portico_fleet_redis_up", &[], f64::from(u8::from(up)));
    let name = "portico_fleet_mode";
    e.family(
        name,
        "gauge",
        "1 for the mode fleet rate limits are in: shared (counted across the fleet in Redis), local (Redis unreachable: each instance keeps to its share), closed (Redis unreachable: refused).",
    );
    let active = match (up, f.settings.on_redis_down) {
        (true, _) => "shared",
        (false, portico_config::FleetFallback::Local) => "local",
        (false, portico_config::FleetFallback::Closed) => "closed",
    };
    for mode in ["shared", "local", "closed"] {
        e.sample(name, &[("mode", mode)], f64::from(u8::from(mode == active)));
    }
    let name = "portico_fleet_exchanges_total";
    e.family(
        name,
        "counter",
        "Exchanges of counts with the fleet's Redis, by result.",
    );
    for (result, n) in [
        ("ok", f.exchanges_ok.load(Relaxed)),
        ("failed", f.exchanges_failed.load(Relaxed)),
    ] {
        e.sample(name, &[("result", result)], n as f64);
    }
    e.family(
        "portico_fleet_keys",
        "gauge",
        "Keys of fleet rate limits this instance counts now.",
    );
    e.sample("portico_fleet_keys", &[], f.keys() as f64);
}

/// The fleet as the etcd follower last read it: instances, and those not running the key's
/// revision.
fn fleet_view_metrics(e: &mut Exposition, control: &Control) {
    let Some(view) = control.fleet_view() else {
        return;
    };
    let n = |f: &str| view[f].as_u64().unwrap_or(0) as f64;
    e.family(
        "portico_fleet_instances",
        "gauge",
        "Instances with a status key under the etcd configuration key, as last read (every 5 s).",
    );
    e.sample("portico_fleet_instances", &[], n("instances"));
    e.family(
        "portico_fleet_instances_skewed",
        "gauge",
        "Of those, instances not running the key's revision (behind, or refusing it).",
    );
    e.sample(
        "portico_fleet_instances_skewed",
        &[],
        n("not_running_revision"),
    );
}

/// Per discovering group: servers found, lookups by result, the last successful lookup.
fn discovery_metrics(e: &mut Exposition, control: &Control) {
    let all = control.discovery_status.snapshot();
    if all.is_empty() {
        return;
    }
    let name = "portico_discovery_servers";
    e.family(
        name,
        "gauge",
        "Servers the group's discovery found last (kept while its name is held or lookups fail).",
    );
    for (group, s) in &all {
        e.sample(name, &[("group", group.as_str())], s.servers.len() as f64);
    }
    let name = "portico_discovery_lookups_total";
    e.family(
        name,
        "counter",
        "Lookups of the group's discovery (DNS queries, etcd reads), by result: ok, gone (NXDOMAIN, no records, nothing registered), failed (no answer, SERVFAIL, etcd unreachable).",
    );
    for (group, s) in &all {
        for (result, n) in [
            ("ok", s.ok_total),
            ("gone", s.gone_total),
            ("failed", s.failed_total),
        ] {
            e.sample(
                name,
                &[("group", group.as_str()), ("result", result)],
                n as f64,
            );
        }
    }
    let name = "portico_discovery_last_success_timestamp_seconds";
    e.family(
        name,
        "gauge",
        "When the group's discovery last had an answer (Unix seconds); absent before the first.",
    );
    for (group, s) in &all {
        let at = s
            .last_ok
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
        if let Some(at) = at {
            e.sample(name, &[("group", group.as_str())], at.as_secs_f64().floor());
        }
    }
}

/// Per certificate obtained by ACME (labelled by its first name): expiry, next renewal, issued
/// or stand-in, failures in a row, orders by result.
fn acme_metrics(e: &mut Exposition) {
    let all = crate::acme::status();
    if all.is_empty() {
        return;
    }
    type Gauge = fn(&crate::acme::Status) -> Option<f64>;
    let gauges: [(&str, &str, Gauge); 4] = [
        (
            "portico_acme_certificate_expiry_timestamp_seconds",
            "When the issued certificate expires (Unix seconds); absent while the stand-in is served.",
            |s| s.not_after.map(|t| t as f64),
        ),
        (
            "portico_acme_certificate_renewal_timestamp_seconds",
            "When the certificate is ordered next (Unix seconds).",
            |s| s.next_renewal.map(|t| t as f64),
        ),
        (
            "portico_acme_certificate_issued",
            "1 when a certificate from the ACME server is served, 0 while the stand-in is.",
            |s| Some(f64::from(u8::from(s.issued))),
        ),
        (
            "portico_acme_certificate_failures",
            "Failed orders in a row (0 after an issuance).",
            |s| Some(f64::from(s.failures)),
        ),
    ];
    for (name, help, f) in gauges {
        e.family(name, "gauge", help);
        for s in &all {
            if let Some(v) = f(s) {
                let labels = [
                    ("certificate", s.names[0].as_str()),
                    ("storage", &s.storage),
                ];
                e.sample(name, &labels, v);
            }
        }
    }
    let name = "portico_acme_orders_total";
    e.family(
        name,
        "counter",
        "ACME orders since the process started, by result: issued or failed.",
    );
    for s in &all {
        let (first, storage) = (s.names[0].as_str(), s.storage.as_str());
        for (result, n) in [("issued", s.issued_total), ("failed", s.failed_total)] {
            let labels = [
                ("certificate", first),
                ("storage", storage),
                ("result", result),
            ];
            e.sample(name, &labels, n as f64);
        }
    }
}

/// The response cache: requests by what it did, stores, invalidations, bytes answered, and
/// what it holds.
fn cache_metrics(e: &mut Exposition, cache: &crate::cache::Cache) {
    let c = &cache.counters;
    e.family(
        "portico_cache_requests_total",
        "counter",
        "Requests of caching routes, by what the cache did: hit, collapsed (answered from another request's fetch), miss, revalidated (304), stale (answered in place of an upstream failure), updating (answered stale while a background fetch refreshes it), bypass.",
    );
    for (status, v) in [
        ("hit", &c.hits),
        ("collapsed", &c.collapsed),
        ("miss", &c.misses),
        ("revalidated", &c.revalidated),
        ("stale", &c.stale),
        ("updating", &c.updating),
        ("bypass", &c.bypass),
    ] {
        e.sample(
            "portico_cache_requests_total",
            &[("status", status)],
            v.load(Relaxed) as f64,
        );
    }
    for (name, help, v) in [
        (
            "portico_cache_stored_total",
            "Responses stored in the cache (a revalidated one again).",
            &c.stored,
        ),
        (
            "portico_cache_refreshes_total",
            "Background refreshes (stale-while-revalidate) that stored a response or refreshed one with a 304.",
            &c.refreshed,
        ),
        (
            "portico_cache_refresh_failures_total",
            "Background refreshes that failed or got a response that could not be stored.",
            &c.refresh_failed,
        ),
        (
            "portico_cache_invalidated_total",
            "Stored URLs removed because an unsafe request to them succeeded.",
            &c.invalidated,
        ),
        (
            "portico_cache_hit_bytes_total",
            "Body bytes answered from the cache.",
            &c.hit_bytes,
        ),
    ] {
        e.family(name, "counter", help);
        e.sample(name, &[], v.load(Relaxed) as f64);
    }
    let (entries, bytes) = cache.usage();
    for (name, help, v) in [
        (
            "portico_cache_entries",
            "URLs held in the cache (each with its variants).",
            entries,
        ),
        (
            "portico_cache_bytes",
            "Bytes the cache holds (heads, bodies and bookkeeping).",
            bytes,
        ),
        (
            "portico_cache_capacity_bytes",
            "The cache's memory bound ([cache] memory).",
            cache.capacity(),
        ),
        (
            "portico_cache_lock_waiting",
            "Requests waiting now for another request's fetch of their URL (collapsed forwarding).",
            c.waiting.load(Relaxed),
        ),
    ] {
        e.family(name, "gauge", help);
        e.sample(name, &[], v as f64);
    }
    let Some((_, files, bytes, capacity, d)) = cache.disk_usage() else {
        return;
    };
    for (name, help, v) in [
        (
            "portico_cache_disk_reads_total",
            "Stored responses read back from the disk tier into memory.",
            &d.reads,
        ),
        (
            "portico_cache_disk_writes_total",
            "Stored responses written to the disk tier.",
            &d.writes,
        ),
        (
            "portico_cache_disk_writes_skipped_total",
            "Stored responses kept in memory only because the disk tier's queue of writes was full.",
            &d.skipped,
        ),
        (
            "portico_cache_disk_errors_total",
            "Files of the disk tier that failed to be written or read back (each is logged).",
            &d.errors,
        ),
    ] {
        e.family(name, "counter", help);
        e.sample(name, &[], v.load(Relaxed) as f64);
    }
    for (name, help, v) in [
        (
            "portico_cache_disk_entries",
            "URLs held in the disk tier.",
            files,
        ),
        (
            "portico_cache_disk_bytes",
            "Bytes of the disk tier's files.",
            bytes,
        ),
        (
            "portico_cache_disk_capacity_bytes",
            "The disk tier's bound ([cache] disk_size).",
            capacity,
        ),
    ] {
        e.family(name, "gauge", help);
        e.sample(name, &[], v as f64);
    }
}

/// Version, uptime, configuration generation, the process-wide counters, dropped log lines,
/// shedding, idle upstream connections.
fn process_metrics(e: &mut Exposition, control: &Control, shared: &Shared) {
    let stats = &shared.stats;
    e.family("portico_info", "gauge", "Portico version.");
    e.sample(
        "portico_info",
        &[("version", env!("CARGO_PKG_VERSION"))],
        1.0,
    );
    e.family("portico_uptime_seconds", "gauge", "Seconds since start.");
    e.sample(
        "portico_uptime_seconds",
        &[],
        control.started.elapsed().as_secs_f64(),
    );
    e.family(
        "portico_config_generation",
        "gauge",
        "Configurations applied since start (1 = the initial one).",
    );
    e.sample("portico_config_generation", &[], shared.generation as f64);
    e.family(
        "portico_config_last_reload_successful",
        "gauge",
        "Whether the last reload (SIGHUP or admin API) was applied: 1, or refused: 0 (1 before any).",
    );
    e.sample(
        "portico_config_last_reload_successful",
        &[],
        f64::from(u8::from(
            stats
                .config_last_reload_ok
                .load(std::sync::atomic::Ordering::Relaxed),
        )),
    );
    e.family(
        "portico_config_last_reload_success_timestamp_seconds",
        "gauge",
        "When the running configuration was applied (Unix time: the start or the last successful reload).",
    );
    e.sample(
        "portico_config_last_reload_success_timestamp_seconds",
        &[],
        stats
            .config_last_reload_at
            .load(std::sync::atomic::Ordering::Relaxed) as f64,
    );
    let traced = &stats.trace_export;
    let global = [
        (
            "portico_trace_spans_exported_total",
            "Spans of sampled requests the OTLP endpoint accepted.",
            &traced.exported,
        ),
        (
            "portico_trace_spans_dropped_total",
            "Spans dropped because the export queue was full (the endpoint slow or down).",
            &traced.dropped,
        ),
        (
            "portico_trace_export_failures_total",
            "Spans in exports that failed or that the endpoint refused.",
            &traced.failed,
        ),
        (
            "portico_config_reload_failures_total",
            "Reloads refused (an invalid file, a port in use, an unreadable certificate); the running configuration stayed.",
            &stats.config_reload_failures,
        ),
        (
            "portico_connections_accepted_total",
            "Downstream connections accepted.",
            &stats.connections_accepted,
        ),
        (
            "portico_connections_refused_total",
            "Downstream connections closed at once by a listener's max_connections.",
            &stats.connections_refused,
        ),
        (
            "portico_requests_total",
            "Downstream requests (including refused heads).",
            &stats.requests,
        ),
        (
            "portico_upstream_requests_total",
            "Requests that got an upstream response head.",
            &stats.upstream_requests,
        ),
        (
            "portico_upstream_reused_total",
            "Upstream requests sent on a pooled keep-alive connection.",
            &stats.upstream_reused,
        ),
        (
            "portico_upstream_connects_total",
            "Upstream connections opened.",
            &stats.upstream_connects,
        ),
        (
            "portico_upstream_retries_total",
            "Requests retried on a new connection after a stale pooled one failed.",
            &stats.upstream_retries,
        ),
        (
            "portico_retries_total",
            "Attempts sent again to another server under a route's retry policy.",
            &stats.retries,
        ),
        (
            "portico_retries_budget_exhausted_total",
            "Retries a route's retry policy asked for and its retry budget refused.",
            &stats.retries_budget_exhausted,
        ),
        (
            "portico_ip_denied_total",
            "Requests refused 403 by a route's ip_rules.",
            &stats.ip_denied,
        ),
        (
            "portico_proxy_protocol_errors_total",
            "Connections closed because their PROXY protocol header was missing, malformed or late (listeners with proxy_protocol).",
            &stats.proxy_protocol_errors,
        ),
        (
            "portico_client_cert_denied_total",
            "Requests refused 403 by a route's client_cert rules (a certificate they do not match, or none).",
            &stats.client_cert_denied,
        ),
        (
            "portico_basic_auth_failures_total",
            "Requests refused 401 by a route's basic_auth (no or wrong credentials).",
            &stats.auth_failures,
        ),
        (
            "portico_basic_auth_lockouts_total",
            "Requests refused 429 because their client address failed basic auth too often (lockout).",
            &stats.auth_lockouts,
        ),
        (
            "portico_jwt_failures_total",
            "Requests refused by a route's jwt check (401 without a valid token, 403 when its claims do not match).",
            &stats.jwt_failures,
        ),
        (
            "portico_jwt_verified_total",
            "Bearer tokens whose signature was checked (passes from the verified-token cache not counted).",
            &stats.jwt_verified,
        ),
        (
            "portico_jwks_fetches_total",
            "Fetches of a JWK set URL (at start, on its refresh timer, after a failure and for unknown key ids).",
            &stats.jwks_fetches,
        ),
        (
            "portico_jwks_failures_total",
            "JWK set loads (file or URL) that failed; the keys loaded before stay in use.",
            &stats.jwks_failures,
        ),
        (
            "portico_htpasswd_reloads_total",
            "htpasswd files read again after they changed on disk.",
            &stats.htpasswd_reloads,
        ),
        (
            "portico_htpasswd_reload_failures_total",
            "htpasswd files that changed but were refused (a bad line); the users loaded before stay.",
            &stats.htpasswd_reload_failures,
        ),
        (
            "portico_forward_auth_requests_total",
            "Requests a route's forward auth service was asked about (passes from its cache not counted).",
            &stats.forward_auth_calls,
        ),
        (
            "portico_forward_auth_denied_total",
            "Requests a route's forward auth service refused (its answer went to the client).",
            &stats.forward_auth_denied,
        ),
        (
            "portico_request_bodies_buffered_total",
            "Request bodies read whole before a server was picked (buffer_request).",
            &stats.requests_buffered,
        ),
        (
            "portico_request_buffer_file_bytes_total",
            "Bytes of buffered request bodies that went to temporary files (past the memory share).",
            &stats.request_buffer_file_bytes,
        ),
        (
            "portico_rate_limited_total",
            "Requests refused with 429 by a route's rate limit.",
            &stats.rate_limited,
        ),
        (
            "portico_tls_handshake_failures_total",
            "TLS handshakes that failed or timed out.",
            &stats.tls_handshake_failures,
        ),
        (
            "portico_requests_shed_total",
            "Requests answered 503 at once because their worker was saturated (load shedding).",
            &stats.requests_shed,
        ),
        (
            "portico_upstream_tls_handshakes_full_total",
            "TLS handshakes with upstream servers that made a full key exchange.",
            &stats.upstream_tls_full,
        ),
        (
            "portico_upstream_tls_handshakes_resumed_total",
            "TLS handshakes with upstream servers that resumed a session.",
            &stats.upstream_tls_resumed,
        ),
        (
            "portico_upstream_tls_handshake_failures_total",
            "TLS handshakes with upstream servers that failed (certificate, name, protocol).",
            &stats.upstream_tls_failures,
        ),
        (
            "portico_tls_certificate_reloads_total",
            "Listener certificates loaded again because their files changed.",
            &stats.tls_certificate_reloads,
        ),
        (
            "portico_tls_certificate_reload_failures_total",
            "Changed listener certificate files that were refused (the previous certificates stay).",
            &stats.tls_certificate_reload_failures,
        ),
        (
            "portico_h2_connections_total",
            "Downstream connections served as HTTP/2 (ALPN h2 or h2c).",
            &stats.h2_connections,
        ),
        (
            "portico_h2_reset_floods_total",
            "HTTP/2 connections ended with GOAWAY ENHANCE_YOUR_CALM for resetting too many streams.",
            &stats.h2_reset_floods,
        ),
        (
            "portico_h2_ping_floods_total",
            "HTTP/2 connections ended with GOAWAY ENHANCE_YOUR_CALM for sending too many PING acknowledgements Portico never asked for.",
            &stats.h2_ping_floods,
        ),
        (
            "portico_h3_connections_total",
            "QUIC connections served as HTTP/3.",
            &stats.h3_connections,
        ),
        (
            "portico_h3_handshake_failures_total",
            "QUIC handshakes that failed or did not finish within the head timeout.",
            &stats.h3_handshake_failures,
        ),
        (
            "portico_h3_retries_total",
            "New QUIC clients asked to prove their address with a Retry packet.",
            &stats.h3_retries,
        ),
        (
            "portico_h3_reset_floods_total",
            "HTTP/3 connections closed with H3_EXCESSIVE_LOAD for resetting too many streams.",
            &stats.h3_reset_floods,
        ),
    ];
    for (name, help, v) in global {
        e.family(name, "counter", help);
        e.sample(name, &[], v.load(Relaxed) as f64);
    }
    e.family(
        "portico_log_lines_dropped_total",
        "counter",
        "Log lines dropped because the log's output (file, pipe, terminal) did not keep up; workers never wait for it.",
    );
    for (log, v) in [
        ("error", &crate::telemetry::logging::ERROR_LOG_DROPPED),
        ("access", &crate::telemetry::logging::ACCESS_LOG_DROPPED),
    ] {
        e.sample(
            "portico_log_lines_dropped_total",
            &[("log", log)],
            v.load(Relaxed) as f64,
        );
    }
    let compression = [
        (
            "portico_compressed_responses_total",
            "Responses compressed, by coding.",
        ),
        (
            "portico_compression_bytes_in_total",
            "Body bytes compressed (as the server sent them), by coding.",
        ),
        (
            "portico_compression_bytes_out_total",
            "Compressed body bytes sent, by coding.",
        ),
    ];
    for (i, (name, help)) in compression.into_iter().enumerate() {
        e.family(name, "counter", help);
        for coding in portico_http1::Coding::ALL {
            let c = stats.compressed(coding);
            let v = [&c.responses, &c.bytes_in, &c.bytes_out][i];
            e.sample(name, &[("coding", coding.token())], v.load(Relaxed) as f64);
        }
    }
    e.family(
        "portico_mirrored_requests_total",
        "counter",
        "Copies of requests sent to a route's mirror group, by what became of them.",
    );
    for (fate, v) in [
        ("answered", &stats.mirror_answered),
        ("failed", &stats.mirror_failed),
        ("dropped", &stats.mirror_dropped),
        ("skipped", &stats.mirror_skipped),
    ] {
        e.sample(
            "portico_mirrored_requests_total",
            &[("result", fate)],
            v.load(Relaxed) as f64,
        );
    }
    e.family(
        "portico_shedding",
        "gauge",
        "Workers shedding new requests now (counted once per listener with shed).",
    );
    e.sample("portico_shedding", &[], stats.shedding.load(Relaxed) as f64);
    e.family(
        "portico_upstream_idle_connections",
        "gauge",
        "Idle pooled upstream connections over all workers.",
    );
    e.sample(
        "portico_upstream_idle_connections",
        &[],
        control.idle_upstream.load(Relaxed) as f64,
    );
}

/// Open connections per listener; responses, counters and latency per route.
fn route_metrics(e: &mut Exposition, control: &Control, shared: &Shared) {
    e.family(
        "portico_listener_connections",
        "gauge",
        "Open downstream connections per listener.",
    );
    for ls in &shared.listeners {
        let name = ls.listener.name.as_str();
        e.sample(
            "portico_listener_connections",
            &[("listener", name)],
            f64::from(control.listener_connections(name)),
        );
    }
    e.family(
        "portico_route_responses_total",
        "counter",
        "Responses per route by status class.",
    );
    for ls in &shared.listeners {
        for (r, rs) in ls.listener.routes.iter().zip(&ls.route_stats) {
            for (class, c) in CLASSES.iter().zip(&rs.responses) {
                let labels = [
                    ("listener", ls.listener.name.as_str()),
                    ("route", r.name.as_str()),
                    ("class", class),
                ];
                e.sample(
                    "portico_route_responses_total",
                    &labels,
                    c.load(Relaxed) as f64,
                );
            }
        }
    }
    let route_counters: [RouteCounter; 3] = [
        (
            "portico_route_retries_total",
            "Retries per route (routes with a retry policy).",
            |rs| &rs.retries,
            |r| matches!(&r.action, Action::Proxy(p) if p.retry.is_some()),
        ),
        (
            "portico_route_retries_budget_exhausted_total",
            "Retries refused by the route's retry budget (routes with a retry policy).",
            |rs| &rs.retries_budget_exhausted,
            |r| matches!(&r.action, Action::Proxy(p) if p.retry.is_some()),
        ),
        (
            "portico_route_rate_limited_total",
            "Requests refused with 429 by the route's rate limit (routes with a rate limit).",
            |rs| &rs.rate_limited,
            |r| r.rate_limit.is_some(),
        ),
    ];
    for (name, help, counter, applies) in route_counters {
        e.family(name, "counter", help);
        for ls in &shared.listeners {
            for (r, rs) in ls.listener.routes.iter().zip(&ls.route_stats) {
                if applies(r) {
                    let labels = [
                        ("listener", ls.listener.name.as_str()),
                        ("route", r.name.as_str()),
                    ];
                    e.sample(name, &labels, counter(rs).load(Relaxed) as f64);
                }
            }
        }
    }
    e.family(
        "portico_request_duration_seconds",
        "histogram",
        "Downstream request duration per route, from the request's first byte to the end of the response.",
    );
    for ls in &shared.listeners {
        for (r, rs) in ls.listener.routes.iter().zip(&ls.route_stats) {
            let labels = [
                ("listener", ls.listener.name.as_str()),
                ("route", r.name.as_str()),
            ];
            e.histogram(
                "portico_request_duration_seconds",
                &labels,
                &rs.latency.snapshot(),
            );
        }
    }
}

/// Per group: refusals for want of a server, its queue, the response-head time of each server.
fn group_metrics(e: &mut Exposition, shared: &Shared) {
    e.family(
        "portico_group_no_server_total",
        "counter",
        "Requests refused with 503 because no server of the group could take them.",
    );
    for (u, gs) in shared.upstreams.iter().zip(&shared.group_stats) {
        e.sample(
            "portico_group_no_server_total",
            &[("group", u.group().name.as_str())],
            gs.no_server.load(Relaxed) as f64,
        );
    }
    e.family(
        "portico_group_queue_waiting",
        "gauge",
        "Requests waiting in the group's queue for a server below max_connections_per_server.",
    );
    for (u, gs) in shared.upstreams.iter().zip(&shared.group_stats) {
        e.sample(
            "portico_group_queue_waiting",
            &[("group", u.group().name.as_str())],
            f64::from(gs.queue.waiting()),
        );
    }
    type QueueField = fn(&crate::upstream::queue::GroupQueue) -> u64;
    let queue: [(&str, &str, QueueField); 4] = [
        (
            "portico_group_queued_total",
            "Requests that waited in the group's queue.",
            |q| q.queued.load(Relaxed),
        ),
        (
            "portico_group_queue_admitted_total",
            "Waiting requests that got a server.",
            |q| q.admitted.load(Relaxed),
        ),
        (
            "portico_group_queue_full_total",
            "Requests refused with 503 because the group's queue was full.",
            |q| q.full.load(Relaxed),
        ),
        (
            "portico_group_queue_timeouts_total",
            "Waiting requests refused with 503 after the group's queue_timeout.",
            |q| q.timeouts.load(Relaxed),
        ),
    ];
    for (name, help, field) in queue {
        e.family(name, "counter", help);
        for (u, gs) in shared.upstreams.iter().zip(&shared.group_stats) {
            e.sample(
                name,
                &[("group", u.group().name.as_str())],
                field(&gs.queue) as f64,
            );
        }
    }
    e.family(
        "portico_upstream_header_duration_seconds",
        "histogram",
        "Time from picking an upstream server to its response head, per server.",
    );
    for (u, gs) in shared.upstreams.iter().zip(&shared.group_stats) {
        let g = u.group();
        for (s, h) in g.servers.iter().zip(&gs.header_time) {
            let addr = s.address.to_string();
            e.histogram(
                "portico_upstream_header_duration_seconds",
                &[("group", g.name.as_str()), ("server", &addr)],
                &h.snapshot(),
            );
        }
    }
}

/// Per server: activity, health, weights, admin state, responses.
fn server_metrics(e: &mut Exposition, shared: &Shared) {
    let now = Instant::now();
    let servers: Vec<(String, Vec<ServerStatus>)> = shared
        .upstreams
        .iter()
        .map(|u| (u.group().name.clone(), u.status(now)))
        .collect();
    type Field = fn(&ServerStatus) -> f64;
    let per_server: [(&str, &str, &str, Field); 10] = [
        ("portico_server_active_requests", "gauge", "Requests in flight per upstream server.", |s| f64::from(s.active)),
        ("portico_server_healthy", "gauge", "1 when active checks say up and passive checks have not ejected the server.", |s| f64::from(u8::from(s.health == Health::Up && !s.ejected))),
        ("portico_server_effective_weight", "gauge", "The weight picks use now: 0 when the server cannot be picked, lower during slow start.", |s| f64::from(s.effective_weight)),
        ("portico_server_weight", "gauge", "Configured or admin-set weight.", |s| f64::from(s.weight)),
        ("portico_server_requests_total", "counter", "Requests sent to the server.", |s| s.requests as f64),
        ("portico_server_failures_total", "counter", "Connect errors, timeouts and resets before a response.", |s| s.failures as f64),
        ("portico_server_response_bytes_total", "counter", "Bytes of the server's responses written to clients, as the access log counts them.", |s| s.bytes as f64),
        ("portico_server_consecutive_failures", "gauge", "Consecutive failed requests (passive checks).", |s| f64::from(s.consecutive_failures)),
        ("portico_server_ejections_total", "counter", "Times passive checks ejected the server.", |s| s.ejections as f64),
        ("portico_server_health_transitions_total", "counter", "Up/down changes made by active health checks.", |s| s.health_transitions as f64),
    ];
    for (name, kind, help, field) in per_server {
        e.family(name, kind, help);
        for (group, list) in &servers {
            for st in list {
                let addr = st.address.to_string();
                e.sample(name, &[("group", group), ("server", &addr)], field(st));
            }
        }
    }
    e.family(
        "portico_server_admin_state",
        "gauge",
        "The operator's state for the server: 1 for the current state.",
    );
    for (group, list) in &servers {
        for st in list {
            let addr = st.address.to_string();
            for state in [
                AdminState::Enabled,
                AdminState::Draining,
                AdminState::Disabled,
            ] {
                let labels = [
                    ("group", group.as_str()),
                    ("server", &addr),
                    ("state", admin_name(state)),
                ];
                e.sample(
                    "portico_server_admin_state",
                    &labels,
                    f64::from(u8::from(st.admin == state)),
                );
            }
        }
    }
    e.family(
        "portico_server_responses_total",
        "counter",
        "Upstream responses per server by status class.",
    );
    for (group, list) in &servers {
        for st in list {
            let addr = st.address.to_string();
            for (class, n) in CLASSES.iter().zip(st.responses) {
                let labels = [
                    ("group", group.as_str()),
                    ("server", &addr),
                    ("class", class),
                ];
                e.sample("portico_server_responses_total", &labels, n as f64);
            }
        }
    }
}

/// Finished requests by termination record.
fn termination_metrics(e: &mut Exposition, stats: &Stats) {
    e.family(
        "portico_terminations_total",
        "counter",
        "Finished requests by termination record: which side ended it, in which phase, why.",
    );
    for (t, n) in stats.termination_counts() {
        let (side, phase, cause) = t.labels();
        e.sample(
            "portico_terminations_total",
            &[("side", side), ("phase", phase), ("cause", cause)],
            n as f64,
        );
    }
}
