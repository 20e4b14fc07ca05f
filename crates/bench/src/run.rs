//! A run: worker threads owning their connections, warm-up, CPU sampling, progress, merged results.

use crate::config::{Config, Mode, Stop};
use crate::conn::ErrorKind;
use crate::conn::{Conn, Opened, Response};
use crate::cpu;
use crate::deadline::{watchdog, Deadline};
use crate::error::BenchError;
use crate::h2conn::H2Conn;
use crate::h3conn::H3Conn;
use crate::pacer::{spawn_sleeper, Pacer, Shared};
use crate::report::{Measured, Report};
use crate::request::encode_requests;
use crate::request::H2Request;
use crate::schedule::{thread_of, Schedule, Timing};
use crate::stats::{Live, Recorder};
use bytes::Bytes;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Time between the workers being ready and the first send, so that all start together.
const START_LEAD: Duration = Duration::from_millis(5);
/// Interval of progress reports.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// A snapshot of a run in progress, about once a second.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    /// Since the start (warm-up included).
    pub elapsed: Duration,
    /// Warm-up plus duration, in duration mode.
    pub planned: Option<Duration>,
    pub warming_up: bool,
    /// Completed requests so far (warm-up included).
    pub completed: u64,
    pub errors: u64,
    /// Completions per second since the previous snapshot.
    pub rate: f64,
    /// p99 latency of the last whole second (the highest over threads), ms.
    pub p99_ms: f64,
}

impl Progress {
    /// One status line, e.g. `[  3s / 10s]  12000 done, 0 errors, 4000 req/s, p99 1.234 ms`.
    pub fn line(&self) -> String {
        let total = self
            .planned
            .map(|p| format!(" / {:.0}s", p.as_secs_f64()))
            .unwrap_or_default();
        let p99 = if self.p99_ms > 0.0 {
            format!("{:.3} ms", self.p99_ms)
        } else {
            "-".to_string()
        };
        format!(
            "[{:>4.0}s{total}]{} {} done, {} errors, {:.0} req/s, p99 {p99} (last second)",
            self.elapsed.as_secs_f64(),
            if self.warming_up { " warm-up," } else { "" },
            self.completed,
            self.errors,
            self.rate,
        )
    }
}

/// What every worker reads.
struct Plan {
    cfg: Config,
    /// One request per URL, sent in turn.
    requests: Vec<Bytes>,
    /// `--h2`: the same requests for HTTP/2.
    h2_requests: Vec<H2Request>,
    schedule: Option<Schedule>,
}

/// What one request goes out on: an HTTP/1.1 connection, or a stream of a shared HTTP/2
/// connection.
trait Link {
    /// Send the request to URL `url` and read its response.
    async fn exchange(&mut self, plan: &Plan, url: usize) -> Result<Response, ErrorKind>;
    /// The exchange was abandoned midway (timeout, or the end of the run).
    fn abandon(&mut self);
    /// A connection opened since the last call (for the connection and handshake counts).
    fn take_opened(&mut self) -> Option<Opened>;
    /// After a response that ends the connection.
    async fn finish_close(&mut self);
}

impl Link for Conn {
    async fn exchange(&mut self, plan: &Plan, url: usize) -> Result<Response, ErrorKind> {
        let request = plan.requests.get(url).map(|b| &b[..]).unwrap_or_default();
        Conn::exchange(self, request, &plan.cfg.method).await
    }

    fn abandon(&mut self) {
        // The connection's state is unknown.
        self.close();
    }

    fn take_opened(&mut self) -> Option<Opened> {
        Conn::take_opened(self)
    }

    async fn finish_close(&mut self) {
        Conn::finish_close(self).await;
    }
}

/// A multiplexed connection (HTTP/2 or HTTP/3) that its stream slots share.
trait Mux {
    async fn exchange(&self, request: &H2Request) -> Result<Response, ErrorKind>;
    fn take_opened(&self) -> Option<Opened>;
    /// Open it before the start (a failure is left to the first request, which counts it).
    async fn open(&self);
    /// After a response that ends the connection (`--close`).
    async fn close_now(&self) {}
}

impl Mux for H2Conn {
    async fn exchange(&self, request: &H2Request) -> Result<Response, ErrorKind> {
        H2Conn::exchange(self, request).await
    }
    fn take_opened(&self) -> Option<Opened> {
        H2Conn::take_opened(self)
    }
    async fn open(&self) {
        let _ = H2Conn::open(self).await;
    }
}

impl Mux for H3Conn {
    async fn exchange(&self, request: &H2Request) -> Result<Response, ErrorKind> {
        H3Conn::exchange(self, request).await
    }
    fn take_opened(&self) -> Option<Opened> {
        H3Conn::take_opened(self)
    }
    async fn open(&self) {
        let _ = H3Conn::open(self).await;
    }
    async fn close_now(&self) {
        H3Conn::close_now(self).await;
    }
}

/// One stream slot of a multiplexed connection.
struct Slot<C>(Rc<C>);

impl<C: Mux> Link for Slot<C> {
    async fn exchange(&mut self, plan: &Plan, url: usize) -> Result<Response, ErrorKind> {
        match plan.h2_requests.get(url) {
            Some(r) => self.0.exchange(r).await,
            None => Err(ErrorKind::BadResponse),
        }
    }

    fn abandon(&mut self) {
        // Dropping the exchange reset its stream; the connection goes on.
    }

    fn take_opened(&mut self) -> Option<Opened> {
        self.0.take_opened()
    }

    async fn finish_close(&mut self) {
        self.0.close_now().await;
    }
}

/// Make a worker's multiplexed connections with `make` and, unless each request has a
/// connection of its own (`close`), open them within `timeout` each.
async fn open_all<C: Mux + 'static>(
    n: usize,
    make: impl Fn() -> C,
    close: bool,
    timeout: Duration,
) -> Vec<Rc<C>> {
    let conns: Vec<Rc<C>> = (0..n).map(|_| Rc::new(make())).collect();
    let tasks: Vec<_> = conns
        .iter()
        .filter(|_| !close)
        .map(|c| {
            let c = c.clone();
            tokio::task::spawn_local(async move {
                let _ = tokio::time::timeout(timeout, c.open()).await;
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    conns
}

/// What the stream tasks of one connection share (one task per connection for HTTP/1.1).
#[derive(Default)]
struct Lanes {
    /// Open loop: the connection's next request (index into its slots) not yet taken by a task.
    /// Closed loop: measured requests sent so far.
    next: Cell<u64>,
    /// Tasks of the connection still running.
    active: Cell<usize>,
}

/// One worker thread's state, shared by its connection tasks.
struct Worker {
    plan: Arc<Plan>,
    t0: Instant,
    /// Start of the measured phase (end of the warm-up), from `t0`.
    measure_start: Duration,
    /// End of the measured phase in duration mode: nothing is sent from then on.
    end: Option<Duration>,
    /// End of the drain: requests still unfinished then are reported in flight.
    cut: Option<Duration>,
    rec: RefCell<Recorder>,
    pacer: Option<Rc<Pacer>>,
    /// The URL of this worker's next request (index into `plan.requests`).
    next_url: Cell<usize>,
}

enum Flow {
    Next,
    Stop,
}

impl Worker {
    fn now(&self) -> Duration {
        self.t0.elapsed()
    }

    /// Send one request and record its outcome (`t.done` is filled in here). Returns what to do
    /// next and when the connection became free again.
    async fn request<L: Link>(
        &self,
        conn: &mut L,
        deadline: &Deadline,
        measured: bool,
        mut t: Timing,
    ) -> (Flow, Duration) {
        let cfg = &self.plan.cfg;
        let open = self.plan.schedule.is_some();
        let timeout_at = t.sent + cfg.timeout;
        let (limit, is_cut) = match self.cut {
            Some(c) if c < timeout_at => (c, true),
            _ => (timeout_at, false),
        };
        let urls = self.plan.cfg.targets.len();
        let url = self.next_url.get();
        self.next_url.set(if url + 1 >= urls { 0 } else { url + 1 });
        let exchange = conn.exchange(&self.plan, url);
        let r = deadline.run(self.t0 + limit, exchange).await;
        t.done = self.now();
        let since = t.done.saturating_sub(self.measure_start);
        if r.is_none() {
            conn.abandon();
        }
        let (flow, close) = {
            let mut rec = self.rec.borrow_mut();
            while let Some(o) = conn.take_opened() {
                rec.opened(measured, &o);
            }
            if measured && urls > 1 {
                rec.url_outcome(
                    url,
                    matches!(r, Some(Ok(_))),
                    matches!(r, Some(Err(_)) | None if !is_cut),
                );
            }
            match r {
                Some(Ok(resp)) => {
                    rec.response(measured, open, &t, resp.status, resp.bytes, since);
                    (Flow::Next, !resp.reuse)
                }
                Some(Err(kind)) => {
                    rec.error(measured, open, &t, kind, since);
                    (Flow::Next, false)
                }
                None if is_cut => {
                    rec.unfinished(measured);
                    (Flow::Stop, false)
                }
                None => {
                    rec.error(measured, open, &t, ErrorKind::Timeout, since);
                    (Flow::Next, false)
                }
            }
        };
        if close {
            conn.finish_close().await;
            return (flow, self.now());
        }
        (flow, t.done)
    }

    /// Open loop: send each of connection `k`'s slots at its intended time, or as soon as the
    /// connection (with HTTP/2: one of its stream slots; each task is one) is free if it is late;
    /// never after the end of the measured phase. The connection's tasks take its slots in order
    /// from `lanes`, so a request waits only when every task of its connection is busy.
    async fn open_loop<L: Link>(
        self: Rc<Self>,
        k: usize,
        mut conn: L,
        deadline: Rc<Deadline>,
        lanes: Rc<Lanes>,
    ) {
        let (Some(sched), Some(pacer)) = (self.plan.schedule.as_ref(), self.pacer.clone()) else {
            return;
        };
        let mut free = Duration::ZERO;
        loop {
            let i = lanes.next.get();
            let g = sched.slot(k, i);
            if g >= sched.end() || self.end.is_some_and(|end| self.now() >= end) {
                break;
            }
            lanes.next.set(i + 1);
            let intended = sched.slot_time(g);
            if self.now() < intended {
                pacer.until(self.t0 + intended).await;
            }
            let sent = self.now();
            let t = Timing {
                intended,
                free,
                sent,
                done: sent,
            };
            let (flow, after) = self
                .request(&mut conn, &deadline, sched.is_measured(g), t)
                .await;
            free = after;
            // Awake anyway: release whatever sends are due on the other connections.
            pacer.wake_due(self.t0 + free);
            if let Flow::Stop = flow {
                break;
            }
        }
        // The connection's last task counts the slots nobody took.
        lanes.active.set(lanes.active.get().saturating_sub(1));
        if lanes.active.get() == 0 {
            let left = sched.measured_of_from(k, sched.slot(k, lanes.next.get()));
            self.rec.borrow_mut().unsent += left;
        }
    }

    /// Closed loop: send the next request as soon as the previous one ends (with HTTP/2, each
    /// task is one stream slot of the connection; `lanes.next` counts the connection's measured
    /// requests against its `quota`).
    async fn closed_loop<L: Link>(
        self: Rc<Self>,
        mut conn: L,
        deadline: Rc<Deadline>,
        quota: Option<u64>,
        lanes: Rc<Lanes>,
    ) {
        let mut free = Duration::ZERO;
        let mut now = self.now();
        loop {
            if self.end.is_some_and(|end| now >= end)
                || quota.is_some_and(|q| lanes.next.get() >= q)
            {
                break;
            }
            let measured = now >= self.measure_start;
            if measured {
                lanes.next.set(lanes.next.get() + 1);
                self.rec.borrow_mut().scheduled += 1;
            }
            let t = Timing {
                intended: now,
                free,
                sent: now,
                done: now,
            };
            let (flow, after) = self.request(&mut conn, &deadline, measured, t).await;
            (free, now) = (after, after);
            if let Flow::Stop = flow {
                break;
            }
        }
    }

    /// Start the tasks of connection `k`, one per link (stream slot), each with its deadline.
    /// The stream slots (`--streams` each) of connections `mine`, one task each.
    fn spawn_slots<C: Mux + 'static>(
        self: &Rc<Self>,
        mine: &[usize],
        conns: Vec<Rc<C>>,
        tasks: &mut Vec<tokio::task::JoinHandle<()>>,
        deadlines: &mut Vec<Rc<Deadline>>,
    ) {
        for (&k, conn) in mine.iter().zip(conns) {
            let slots = (0..self.plan.cfg.streams)
                .map(|_| Slot(conn.clone()))
                .collect();
            tasks.extend(self.spawn_connection(k, slots, deadlines));
        }
    }

    fn spawn_connection<L: Link + 'static>(
        self: &Rc<Self>,
        k: usize,
        links: Vec<L>,
        deadlines: &mut Vec<Rc<Deadline>>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let lanes = Rc::new(Lanes::default());
        lanes.active.set(links.len());
        let cfg = &self.plan.cfg;
        links
            .into_iter()
            .map(|link| {
                let d = Rc::new(Deadline::default());
                deadlines.push(d.clone());
                let (w, lanes) = (self.clone(), lanes.clone());
                match cfg.mode {
                    Mode::Open { .. } => tokio::task::spawn_local(w.open_loop(k, link, d, lanes)),
                    Mode::Closed => tokio::task::spawn_local(w.closed_loop(
                        link,
                        d,
                        closed_quota(cfg, k),
                        lanes,
                    )),
                }
            })
            .collect()
    }
}

/// Each connection of a worker: HTTP/1.1 connections, or HTTP/2 connections shared by their
/// stream slots.
enum Conns {
    H1(Vec<Conn>),
    H2(Vec<Rc<H2Conn>>),
    H3(Vec<Rc<H3Conn>>),
}

/// Measured requests of connection `k` in a closed-loop count run.
fn closed_quota(cfg: &Config, k: usize) -> Option<u64> {
    match cfg.stop {
        Stop::Requests(n) => {
            let c = cfg.connections as u64;
            Some(n / c + u64::from((k as u64) < n % c))
        }
        Stop::Duration(_) => None,
    }
}

/// Count the connections a worker opened before the start.
fn opened_before<C: Mux>(rec: &mut Recorder, conns: &[Rc<C>]) {
    for c in conns {
        while let Some(o) = c.take_opened() {
            rec.opened(false, &o);
        }
    }
}

/// A worker's result: its recording and when its last connection finished.
type WorkerResult = Result<(Recorder, Instant), BenchError>;

fn worker(
    plan: Arc<Plan>,
    index: usize,
    live: Arc<Live>,
    ready: mpsc::Sender<Result<(), String>>,
    go: mpsc::Receiver<Instant>,
) -> WorkerResult {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(format!("cannot start a runtime: {e}")));
            return Err(BenchError::Runtime(e.to_string()));
        }
    };
    let local = tokio::task::LocalSet::new();
    let cfg = &plan.cfg;
    let mine: Vec<usize> = (0..cfg.connections)
        .filter(|k| thread_of(*k, cfg.threads) == index)
        .collect();
    // Keep-alive runs open their connections before the start, so that the first requests do not
    // pay for the handshake (failures are left to the first request, which counts them).
    let conns = if let (true, Some(tls)) = (cfg.h3, &cfg.tls) {
        let make = || H3Conn::new(cfg.addr, tls, cfg.close, cfg.loss);
        let open = open_all(mine.len(), make, cfg.close, cfg.timeout);
        Conns::H3(local.block_on(&rt, open))
    } else if cfg.h2 {
        let make = || H2Conn::new(cfg.addr, cfg.tls.as_ref());
        let open = open_all(mine.len(), make, false, cfg.timeout);
        Conns::H2(local.block_on(&rt, open))
    } else {
        Conns::H1(local.block_on(&rt, async {
            let tasks: Vec<_> = mine
                .iter()
                .map(|_| {
                    let mut c = Conn::new(cfg.addr, cfg.tls.as_ref(), cfg.close);
                    let (close, timeout) = (cfg.close, cfg.timeout);
                    tokio::task::spawn_local(async move {
                        if !close {
                            let _ = tokio::time::timeout(timeout, c.connect()).await;
                        }
                        c
                    })
                })
                .collect();
            let mut out = Vec::with_capacity(tasks.len());
            for t in tasks {
                out.push(
                    t.await
                        .unwrap_or_else(|_| Conn::new(cfg.addr, cfg.tls.as_ref(), cfg.close)),
                );
            }
            out
        }))
    };
    let _ = ready.send(Ok(()));
    let t0 = go
        .recv()
        .map_err(|_| BenchError::Runtime("the run was abandoned".to_string()))?;
    let measure_start = cfg.warmup;
    let end = match cfg.stop {
        Stop::Duration(d) => Some(cfg.warmup.saturating_add(d)),
        Stop::Requests(_) => None,
    };
    let mut rec = Recorder::new(live);
    let mut conns = conns;
    match &mut conns {
        Conns::H1(cs) => {
            for c in cs {
                if let Some(o) = c.take_opened() {
                    rec.opened(false, &o);
                }
            }
        }
        Conns::H2(cs) => opened_before(&mut rec, cs),
        Conns::H3(cs) => opened_before(&mut rec, cs),
    }
    let shared = Arc::new(Shared::new(t0));
    let mut sleeper = None;
    let mut pacer = None;
    if let Some(s) = &plan.schedule {
        rec.scheduled = mine.iter().map(|k| s.measured_of(*k)).sum();
        let (a, b, threads) = (s.clone(), s.clone(), cfg.threads);
        let times = (0..s.end())
            .filter(move |g| thread_of(a.connection_of(*g), threads) == index)
            .map(move |g| t0 + b.slot_time(g));
        sleeper = Some(
            spawn_sleeper(format!("bench-pace-{index}"), shared.clone(), times)
                .map_err(|e| BenchError::Runtime(format!("cannot start a thread: {e}")))?,
        );
        pacer = Some(Rc::new(Pacer::new(shared.clone())));
    }
    let w = Rc::new(Worker {
        plan: plan.clone(),
        t0,
        measure_start,
        end,
        cut: end.map(|e| e.saturating_add(cfg.drain())),
        rec: RefCell::new(rec),
        pacer,
        // Threads start at different URLs, so that short runs still spread over them.
        next_url: Cell::new(index % plan.requests.len().max(1)),
    });
    let now = Instant::now();
    if t0 > now {
        std::thread::sleep(t0 - now);
    }
    local.block_on(&rt, async {
        if let Some(p) = w.pacer.clone() {
            tokio::task::spawn_local(async move { p.run().await });
        }
        let mut deadlines = Vec::with_capacity(mine.len() * cfg.streams);
        let mut tasks = Vec::with_capacity(mine.len() * cfg.streams);
        match conns {
            Conns::H1(cs) => {
                for (&k, conn) in mine.iter().zip(cs) {
                    tasks.extend(w.spawn_connection(k, vec![conn], &mut deadlines));
                }
            }
            Conns::H2(cs) => w.spawn_slots(&mine, cs, &mut tasks, &mut deadlines),
            Conns::H3(cs) => w.spawn_slots(&mine, cs, &mut tasks, &mut deadlines),
        }
        tokio::task::spawn_local(watchdog(deadlines));
        for t in tasks {
            let _ = t.await;
        }
    });
    let finished = Instant::now();
    shared.stop();
    if let Some(s) = sleeper {
        let _ = s.join();
    }
    drop(local);
    let rec = w.rec.borrow().clone();
    Ok((rec, finished))
}

/// Run the benchmark `cfg` describes. `progress` is called about once a second.
pub fn run(cfg: &Config, progress: &mut dyn FnMut(&Progress)) -> Result<Report, BenchError> {
    if !cfg.pids.is_empty() {
        cpu::sample_trees(&cfg.pids)?;
    }
    let plan = Arc::new(Plan {
        cfg: cfg.clone(),
        requests: encode_requests(cfg),
        h2_requests: if cfg.h2 || cfg.h3 {
            crate::request::h2_requests(cfg)?
        } else {
            Vec::new()
        },
        schedule: match cfg.mode {
            Mode::Open { rate } => Some(Schedule::new(rate, cfg.connections, cfg.warmup, cfg.stop)),
            Mode::Closed => None,
        },
    });
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<(usize, WorkerResult)>();
    let mut gos = Vec::new();
    let mut handles = Vec::new();
    let mut lives = Vec::new();
    for index in 0..cfg.threads {
        let (go_tx, go_rx) = mpsc::channel();
        let live = Arc::new(Live::default());
        let (plan, ready, done, l) = (
            plan.clone(),
            ready_tx.clone(),
            done_tx.clone(),
            live.clone(),
        );
        let h = std::thread::Builder::new()
            .name(format!("bench-{index}"))
            .spawn(move || {
                let r = worker(plan, index, l, ready, go_rx);
                let _ = done.send((index, r));
            })
            .map_err(|e| BenchError::Runtime(format!("cannot start a thread: {e}")))?;
        gos.push(go_tx);
        handles.push(h);
        lives.push(live);
    }
    drop((ready_tx, done_tx));
    for _ in 0..cfg.threads {
        let failure = match ready_rx.recv() {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => e,
            Err(_) => "a worker thread ended early".to_string(),
        };
        drop(gos);
        for h in handles {
            let _ = h.join();
        }
        return Err(BenchError::Runtime(failure));
    }
    let t0 = Instant::now() + START_LEAD;
    for g in &gos {
        let _ = g.send(t0);
    }
    let tw = t0 + cfg.warmup;
    let planned = match cfg.stop {
        Stop::Duration(d) => Some(cfg.warmup.saturating_add(d)),
        Stop::Requests(_) => None,
    };
    let mut results: Vec<Option<(Recorder, Instant)>> = (0..cfg.threads).map(|_| None).collect();
    let mut first_error = None;
    let mut remaining = cfg.threads;
    let mut start_sample: Option<(Option<cpu::TreeSample>, Option<u64>)> = None;
    let mut started = None;
    let mut notes = Vec::new();
    let mut next_tick = t0 + PROGRESS_EVERY;
    let (mut last_completed, mut last_tick) = (0u64, t0);
    let sample = |notes: &mut Vec<String>| {
        let tree = if cfg.pids.is_empty() {
            None
        } else {
            match cpu::sample_trees(&cfg.pids) {
                Ok(s) => Some(s),
                Err(e) => {
                    notes.push(format!("CPU not measured: {e}"));
                    None
                }
            }
        };
        (tree, cpu::sample_self())
    };
    while remaining > 0 {
        let now = Instant::now();
        if start_sample.is_none() && now >= tw {
            start_sample = Some(sample(&mut notes));
            started = Some(std::time::SystemTime::now());
        }
        let wake = if start_sample.is_none() {
            tw.min(next_tick)
        } else {
            next_tick
        };
        match done_rx.recv_timeout(wake.saturating_duration_since(now)) {
            Ok((i, r)) => {
                remaining -= 1;
                match r {
                    Ok(x) => {
                        if let Some(slot) = results.get_mut(i) {
                            *slot = Some(x);
                        }
                    }
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let now = Instant::now();
                if now >= next_tick {
                    let completed: u64 = lives
                        .iter()
                        .map(|l| l.completed.load(Ordering::Relaxed))
                        .sum();
                    let errors = lives.iter().map(|l| l.errors.load(Ordering::Relaxed)).sum();
                    let p99 = lives
                        .iter()
                        .map(|l| l.last_p99_us.load(Ordering::Relaxed))
                        .max()
                        .unwrap_or(0);
                    let dt = now.duration_since(last_tick).as_secs_f64().max(1e-9);
                    progress(&Progress {
                        elapsed: now.duration_since(t0),
                        planned,
                        warming_up: now < tw,
                        completed,
                        errors,
                        rate: completed.saturating_sub(last_completed) as f64 / dt,
                        p99_ms: p99 as f64 / 1000.0,
                    });
                    (last_completed, last_tick) = (completed, now);
                    next_tick += PROGRESS_EVERY;
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let end_sample = sample(&mut notes);
    let start_sample = start_sample.unwrap_or_else(|| end_sample.clone());
    for h in handles {
        if h.join().is_err() {
            first_error.get_or_insert(BenchError::Runtime("a worker thread panicked".to_string()));
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    let mut merged: Option<Recorder> = None;
    let mut finished = tw;
    for (rec, done) in results.into_iter().flatten() {
        finished = finished.max(done);
        match merged.as_mut() {
            None => merged = Some(rec),
            Some(m) => m.merge(&rec).map_err(BenchError::Runtime)?,
        }
    }
    let merged = merged.ok_or_else(|| BenchError::Runtime("no worker results".to_string()))?;
    let cpu_ticks = match (&start_sample.0, &end_sample.0) {
        (Some(a), Some(b)) => Some((b.ticks.saturating_sub(a.ticks), b.processes)),
        _ => None,
    };
    let self_ticks = match (start_sample.1, end_sample.1) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    let measured = Measured {
        elapsed_s: finished.saturating_duration_since(tw).as_secs_f64(),
        cpu_ticks,
        self_ticks,
        notes,
        started: started.or_else(|| Some(std::time::SystemTime::now())),
    };
    Ok(Report::build(cfg, &merged, &measured))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Flags;

    #[test]
    fn closed_loop_quotas_split_the_count() {
        let cfg = Config::from_flags(&Flags {
            url: "http://127.0.0.1:1/".into(),
            closed: true,
            connections: 4,
            requests: Some(10),
            ..Flags::default()
        })
        .unwrap();
        let q: Vec<u64> = (0..4).filter_map(|k| closed_quota(&cfg, k)).collect();
        assert_eq!(q, [3, 3, 2, 2]);
    }

    #[test]
    fn progress_line() {
        let p = Progress {
            elapsed: Duration::from_secs(3),
            planned: Some(Duration::from_secs(12)),
            warming_up: true,
            completed: 1200,
            errors: 1,
            rate: 400.4,
            p99_ms: 0.0,
        };
        assert_eq!(
            p.line(),
            "[   3s / 12s] warm-up, 1200 done, 1 errors, 400 req/s, p99 - (last second)"
        );
        let p = Progress {
            warming_up: false,
            planned: None,
            p99_ms: 1.5,
            ..p
        };
        assert_eq!(
            p.line(),
            "[   3s] 1200 done, 1 errors, 400 req/s, p99 1.500 ms (last second)"
        );
    }
}
