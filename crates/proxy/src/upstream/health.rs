//! Active health checks: one probe per server per interval for the whole process, on its own thread.

use crate::upstream::health_h2::MAX_PROBE_BODY;
use crate::upstream::tls::{GroupTls, UpStream};
use bytes::BytesMut;
use portico_config::{HealthCheck, HealthCheckKind, HttpCheck, UpstreamProtocol};
use portico_http1::{parse_response, BodyDecoder, Decoded, Limits, Method};
use portico_upstream::Upstream;
use std::collections::{HashMap, HashSet};
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

/// A group to probe: its shared state and, for an HTTPS group, how to reach its servers (probes
/// then make the TLS handshake too, with the group's settings).
#[derive(Clone)]
pub struct ProbeTarget {
    pub upstream: Arc<Upstream>,
    pub tls: Option<Arc<GroupTls>>,
}

/// What the checker thread is told: the set of groups to probe, or to stop.
enum Command {
    Probe(Vec<ProbeTarget>),
    Stop,
}

/// The process's health checker: a thread `portico-health` with a single-threaded runtime that
/// probes every server of every group with a `health_check` once per interval and hands each
/// result to [`Upstream::probe_result`]. Workers never probe, so the probe rate does not grow
/// with the worker count. Dropping it stops it too.
pub struct HealthChecker {
    commands: watch::Sender<Command>,
    thread: Option<JoinHandle<()>>,
}

impl HealthChecker {
    /// Start probing `upstreams` (groups without a health check are skipped).
    pub fn start(upstreams: Vec<ProbeTarget>) -> io::Result<HealthChecker> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (commands, rx) = watch::channel(Command::Probe(upstreams));
        let thread = std::thread::Builder::new()
            .name("portico-health".into())
            .spawn(move || rt.block_on(run(rx)))?;
        Ok(HealthChecker {
            commands,
            thread: Some(thread),
        })
    }

    /// Probe this set from now on (after a reload): probes of servers whose settings stay go
    /// on, others start (with new jitter) or stop.
    pub fn update(&self, upstreams: Vec<ProbeTarget>) {
        let _ = self.commands.send(Command::Probe(upstreams));
    }

    /// Stop probing and wait for the thread to end (probes in flight are abandoned).
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for HealthChecker {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Where a server's probe reports: the group's current state, its TLS settings, and the
/// server's index in it (a reload moves them; the probe keeps its schedule).
#[derive(Clone)]
struct Place {
    up: Arc<Upstream>,
    tls: Option<Arc<GroupTls>>,
    index: usize,
}

/// A server's running probe, and what it probes with.
struct Running {
    place: Arc<Mutex<Place>>,
    check: HealthCheck,
    tls: u64,
    protocol: UpstreamProtocol,
    proxy: Option<u8>,
    task: tokio::task::AbortHandle,
}

async fn run(mut rx: watch::Receiver<Command>) {
    // By group name and server address: a server whose probe settings stay the same keeps its
    // probe (and its schedule) across reloads and server-list changes, which may come often
    // (a group's `discovery`).
    let mut probes: HashMap<(String, SocketAddr), Running> = HashMap::new();
    loop {
        let targets = match &*rx.borrow_and_update() {
            Command::Stop => None,
            Command::Probe(targets) => Some(targets.clone()),
        };
        let Some(targets) = targets else { break };
        let mut seen = HashSet::new();
        for target in targets {
            let up = &target.upstream;
            let group = up.group();
            let Some(check) = group.health_check.clone() else {
                continue;
            };
            let tls = target.tls.as_ref().map_or(0, |t| t.pool_id);
            for (index, server) in group.servers.iter().enumerate() {
                let key = (group.name.clone(), server.address);
                let place = Place {
                    up: Arc::clone(up),
                    tls: target.tls.clone(),
                    index,
                };
                let same = probes.get(&key).is_some_and(|r| {
                    r.check == check
                        && r.tls == tls
                        && r.protocol == group.protocol
                        && r.proxy == group.proxy_protocol
                });
                if same {
                    if let Some(r) = probes.get(&key) {
                        *r.place.lock().unwrap_or_else(|e| e.into_inner()) = place;
                    }
                } else {
                    if let Some(old) = probes.remove(&key) {
                        old.task.abort();
                    }
                    let shared = Arc::new(Mutex::new(place));
                    let task =
                        tokio::spawn(probe_loop(shared.clone(), server.address, check.clone()));
                    probes.insert(
                        key.clone(),
                        Running {
                            place: shared,
                            check: check.clone(),
                            tls,
                            protocol: group.protocol,
                            proxy: group.proxy_protocol,
                            task: task.abort_handle(),
                        },
                    );
                }
                seen.insert(key);
            }
        }
        probes.retain(|k, r| {
            let keep = seen.contains(k);
            if !keep {
                r.task.abort();
            }
            keep
        });
        // A change (or the checker dropped) brings the next set.
        if rx.changed().await.is_err() {
            break;
        }
    }
    for r in probes.values() {
        r.task.abort();
    }
}

/// Probe one server forever: a first probe after a random delay of up to a quarter of the
/// interval (so a group's servers are not all probed at the same instant), then one per
/// interval, each reported where `place` says now.
async fn probe_loop(place: Arc<Mutex<Place>>, addr: SocketAddr, check: HealthCheck) {
    let jitter = check.interval.mul_f64(fastrand::f64() / 4.0);
    let start = tokio::time::Instant::now() + jitter;
    let mut tick = tokio::time::interval_at(start, check.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Place { up, tls, index } = place.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let protocol = up.group().protocol;
        let header = crate::upstream::pool::local_header(up.group());
        let (ok, detail) =
            probe_with(addr, &check, tls.as_deref(), protocol, header.as_deref()).await;
        tracing::trace!(group = %up.group().name, %addr, ok, "health probe: {detail}");
        up.probe_result(index, ok, detail, Instant::now());
    }
}

/// One probe of a plain HTTP server under the check's timeout: whether it passed, and what
/// happened in words.
pub async fn probe(addr: SocketAddr, check: &HealthCheck) -> (bool, String) {
    probe_with(addr, check, None, UpstreamProtocol::Http1, None).await
}

/// One probe under the check's timeout. With `tls` (an HTTPS group) the probe makes the TLS
/// handshake as requests do, so a server with a bad certificate fails it (`tcp` checks too), and
/// an `http` check sends its request over TLS. An `http` check of a `protocol = "h2"` group
/// speaks HTTP/2 as its requests do (h2c prior knowledge, or TLS with ALPN h2). A group that
/// sends PROXY headers gets `proxy` (a LOCAL one) first.
pub async fn probe_with(
    addr: SocketAddr,
    check: &HealthCheck,
    tls: Option<&GroupTls>,
    protocol: UpstreamProtocol,
    proxy: Option<&[u8]>,
) -> (bool, String) {
    let started = Instant::now();
    let outcome = tokio::time::timeout(check.timeout, async {
        let mut tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        if let Some(header) = proxy {
            use tokio::io::AsyncWriteExt;
            tcp.write_all(header)
                .await
                .map_err(|e| format!("PROXY header: {e}"))?;
        }
        let stream = match tls {
            None => UpStream::Plain(tcp),
            Some(tls) => tls.handshake(addr, tcp).await.map_err(|e| match e {
                crate::error::ProxyError::TlsHandshake(why) => format!("TLS handshake: {why}"),
                other => other.to_string(),
            })?,
        };
        let connected = if tls.is_some() {
            "TLS handshake done"
        } else {
            "connected"
        };
        match &check.kind {
            HealthCheckKind::Tcp => Ok(connected.to_string()),
            HealthCheckKind::Http(http) if protocol == UpstreamProtocol::H2 => {
                crate::upstream::health_h2::probe(stream, addr, http, tls.is_some()).await
            }
            HealthCheckKind::Http(http) => http_probe(stream, addr, http).await,
        }
    })
    .await;
    let took = started.elapsed();
    match outcome {
        Err(_) => (
            false,
            format!("timed out after {}ms", millis(check.timeout)),
        ),
        Ok(Err(why)) => (false, why),
        Ok(Ok(what)) => (true, format!("{what} in {}ms", millis(took))),
    }
}

fn millis(d: Duration) -> u128 {
    d.as_millis()
}

async fn http_probe(
    mut stream: UpStream,
    addr: SocketAddr,
    check: &HttpCheck,
) -> Result<String, String> {
    let host = check.host.clone().unwrap_or_else(|| addr.to_string());
    let request = format!(
        "{} {} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nUser-Agent: portico-health\r\nAccept: */*\r\n\r\n",
        check.method, check.path
    );
    async {
        stream.write_all(request.as_bytes()).await?;
        stream.flush().await
    }
    .await
    .map_err(|e| format!("write: {e}"))?;
    let method = Method::from_token(&check.method).unwrap_or(Method::Get);
    let limits = Limits::default();
    let mut buf = BytesMut::with_capacity(4096);
    let head = loop {
        match parse_response(&mut buf, &method, &limits) {
            // Interim responses are skipped; the final one decides.
            Ok(Some(h)) if (100..200).contains(&h.status()) && h.status() != 101 => continue,
            Ok(Some(h)) => break h,
            Ok(None) => {}
            Err(e) => return Err(format!("invalid response: {e}")),
        }
        match stream.read_buf(&mut buf).await {
            Ok(0) => return Err("closed before a response".to_string()),
            Ok(_) => {}
            Err(e) => return Err(format!("read: {e}")),
        }
    };
    let status = head.status();
    let (lo, hi) = check.expect_status;
    if !(lo..=hi).contains(&status) {
        return Err(format!("HTTP {status}, expected {lo}-{hi}"));
    }
    let Some(expected) = &check.expect_body else {
        return Ok(format!("HTTP {status}"));
    };
    let mut decoder = BodyDecoder::new(head.framing);
    let mut body: Vec<u8> = Vec::new();
    let found = |body: &[u8]| {
        body.windows(expected.len().max(1))
            .any(|w| w == expected.as_bytes())
    };
    loop {
        match decoder
            .decode(&mut buf, MAX_PROBE_BODY)
            .map_err(|e| format!("invalid body: {e}"))?
        {
            Decoded::Data(d) => {
                let room = MAX_PROBE_BODY.saturating_sub(body.len());
                body.extend_from_slice(&d[..d.len().min(room)]);
                if found(&body) {
                    return Ok(format!("HTTP {status}, body matched"));
                }
                if body.len() >= MAX_PROBE_BODY {
                    break;
                }
            }
            Decoded::Done { .. } => break,
            Decoded::NeedMore => match stream.read_buf(&mut buf).await {
                Ok(0) => {
                    // A close-delimited body ends here.
                    let _ = decoder.on_eof();
                    break;
                }
                Ok(_) => {}
                Err(e) => return Err(format!("read: {e}")),
            },
        }
    }
    Err(format!(
        "HTTP {status}, body does not contain {expected:?} (first {} bytes read)",
        body.len()
    ))
}
