//! Logging that never blocks a worker: a bounded, non-blocking line sink with its own writer thread, drop counters, rate-limited log lines, and the recent warnings the dashboard shows.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Lines the error log (the `tracing` output) dropped because its output did not keep up.
pub static ERROR_LOG_DROPPED: AtomicU64 = AtomicU64::new(0);
/// Lines the access logs dropped because their output did not keep up.
pub static ACCESS_LOG_DROPPED: AtomicU64 = AtomicU64::new(0);

/// Bytes a sink holds at most while its output is slow or blocked; past that, lines are dropped.
pub const SINK_CAPACITY: usize = 4 << 20;

/// Bytes that make the writer thread write at once; fewer wait up to [`LINGER`] for company.
const BATCH: usize = 64 * 1024;

/// How long the first line of a batch waits for more before it is written. Lines reach the log's
/// output this much later at most, and a busy proxy wakes the writer thread about this often
/// instead of once per line (a wake-up and a write per line cost a worker more than the line).
const LINGER: Duration = Duration::from_millis(50);

struct State {
    buf: Vec<u8>,
    /// The writer thread waits and must be woken: for the first line (it waits without a
    /// deadline while the buffer is empty), for a full batch, a flush or the close.
    asleep: bool,
    /// The writer thread is writing a batch taken out of `buf`.
    writing: bool,
    /// A flush waits: write what is there without lingering.
    flushing: bool,
    /// The last handle is gone: write what is left, then end.
    closed: bool,
}

struct Inner {
    name: &'static str,
    capacity: usize,
    state: Mutex<State>,
    /// Wakes the writer thread (lines or close) and flushers (a batch written).
    cond: Condvar,
    dropped: &'static AtomicU64,
}

/// A bounded, non-blocking line sink: [`Sink::push`] appends a whole line to a buffer that a
/// thread of its own writes out, or drops it (and counts it) when the buffer is full. A slow or
/// blocked output (a pipe nobody reads, a full disk) therefore costs lines, never a stalled
/// worker. When the output takes lines again after drops, the writer thread logs how many were
/// lost (at warn level, through `tracing`). Dropping the last handle lets the thread write what
/// is left and end; nothing waits for it.
#[derive(Clone)]
pub struct Sink(Arc<Handle>);

/// The handle whose drop closes the sink.
struct Handle(Arc<Inner>);

impl Drop for Handle {
    fn drop(&mut self) {
        if let Ok(mut st) = self.0.state.lock() {
            st.closed = true;
        }
        self.0.cond.notify_all();
    }
}

impl Sink {
    /// Start a sink writing to `out` on a thread named `portico-log-NAME`; lines that find
    /// `capacity` bytes already waiting are dropped and counted in `dropped`.
    pub fn new(
        name: &'static str,
        out: Box<dyn Write + Send>,
        capacity: usize,
        dropped: &'static AtomicU64,
    ) -> std::io::Result<Sink> {
        let inner = Arc::new(Inner {
            name,
            capacity,
            state: Mutex::new(State {
                buf: Vec::new(),
                asleep: false,
                writing: false,
                flushing: false,
                closed: false,
            }),
            cond: Condvar::new(),
            dropped,
        });
        let thread = inner.clone();
        std::thread::Builder::new()
            .name(format!("portico-log-{name}"))
            .spawn(move || write_loop(&thread, out))?;
        Ok(Sink(Arc::new(Handle(inner))))
    }

    /// Queue one line (or several whole lines) without waiting; false when it was dropped.
    pub fn push(&self, line: &[u8]) -> bool {
        let inner = &self.0 .0;
        let Ok(mut st) = inner.state.lock() else {
            return false;
        };
        if st.buf.len() + line.len() > inner.capacity {
            drop(st);
            inner.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let was = st.buf.len();
        st.buf.extend_from_slice(line);
        // A sleeping writer needs a wake-up for the first line (it then lingers for more) and
        // for a full batch; a busy one takes the whole buffer when it comes back.
        let wake = st.asleep && (was == 0 || (was < BATCH && st.buf.len() >= BATCH));
        if wake {
            st.asleep = false;
        }
        drop(st);
        if wake {
            inner.cond.notify_all();
        }
        true
    }

    /// Wait until what was queued so far is written, at most `timeout` (the output may be
    /// blocked for good). True when everything was written.
    pub fn flush(&self, timeout: Duration) -> bool {
        let inner = &self.0 .0;
        let deadline = Instant::now() + timeout;
        let Ok(mut st) = inner.state.lock() else {
            return false;
        };
        st.flushing = true;
        inner.cond.notify_all();
        let done = loop {
            if st.buf.is_empty() && !st.writing {
                break true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break false;
            }
            st = match inner.cond.wait_timeout(st, left) {
                Ok((st, _)) => st,
                Err(_) => return false,
            };
        };
        st.flushing = false;
        done
    }

    /// A `tracing_subscriber` writer for this sink (one `write` per event, a whole line).
    pub fn writer(&self) -> SinkWriter {
        SinkWriter(self.clone())
    }
}

fn write_loop(inner: &Inner, mut out: Box<dyn Write + Send>) {
    let mut batch = Vec::new();
    let mut reported = inner.dropped.load(Ordering::Relaxed);
    loop {
        {
            let Ok(mut st) = inner.state.lock() else {
                return;
            };
            if st.writing {
                st.writing = false;
                if st.flushing {
                    inner.cond.notify_all();
                }
            }
            // Wait for the first line, then linger for a batch (unless a flush or the close
            // wants it written now).
            let mut since: Option<Instant> = None;
            loop {
                if st.buf.is_empty() {
                    if st.closed {
                        return;
                    }
                    since = None;
                    st.asleep = true;
                    st = match inner.cond.wait(st) {
                        Ok(st) => st,
                        Err(_) => return,
                    };
                    continue;
                }
                let first = *since.get_or_insert_with(Instant::now);
                let left = LINGER.saturating_sub(first.elapsed());
                if st.buf.len() >= BATCH || st.flushing || st.closed || left.is_zero() {
                    break;
                }
                st.asleep = true;
                st = match inner.cond.wait_timeout(st, left) {
                    Ok((st, _)) => st,
                    Err(_) => return,
                };
            }
            st.asleep = false;
            std::mem::swap(&mut batch, &mut st.buf);
            st.writing = true;
        }
        // A write error (a closed pipe, a full disk) loses this batch, not the next ones.
        let _ = out.write_all(&batch).and_then(|()| out.flush());
        batch.clear();
        // A burst must not keep megabytes for the process's life (buffer and batch swap, so
        // both shrink in turn).
        if batch.capacity() > 256 * 1024 {
            batch.shrink_to(64 * 1024);
        }
        // The output took lines again: say how many it missed (through the error log, which
        // is this sink or another, and never waits).
        let dropped = inner.dropped.load(Ordering::Relaxed);
        if dropped > reported {
            tracing::warn!(
                log = inner.name,
                dropped = dropped - reported,
                "log output was blocked or too slow: lines dropped"
            );
            reported = dropped;
        }
    }
}

/// One handle on a [`Sink`] as an `io::Write` (each write is queued whole).
pub struct SinkWriter(Sink);

impl Write for SinkWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.push(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Sink {
    type Writer = SinkWriter;

    fn make_writer(&'a self) -> SinkWriter {
        self.writer()
    }
}

/// The `tracing` filter when `RUST_LOG` is not set: info, but the `h2` and `rustls` crates only
/// at error. Their warnings are about what a peer sent (an unsolicited PING ACK, an IP address
/// as SNI), one line per frame or per handshake that any client can trigger; Portico counts
/// those events itself. `RUST_LOG=info,h2=debug,rustls=debug` shows them.
pub const DEFAULT_FILTER: &str = "info,h2=error,rustls=error,tokio_rustls=error";

/// The last warnings and errors the error log took, newest last, for the dashboard's feed.
pub static RECENT: Recent = Recent {
    lines: Mutex::new(std::collections::VecDeque::new()),
};

/// Lines [`RECENT`] keeps.
const RECENT_MAX: usize = 50;

/// A bounded list of recent warning and error lines.
pub struct Recent {
    lines: Mutex<std::collections::VecDeque<RecentLine>>,
}

/// One warning or error: when (Unix milliseconds), its level, where from, and what it said
/// (the message, then its fields as `name=value`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct RecentLine {
    pub unix_ms: u64,
    pub level: &'static str,
    pub target: String,
    pub message: String,
}

impl Recent {
    pub fn push(&self, line: RecentLine) {
        let Ok(mut lines) = self.lines.lock() else {
            return;
        };
        if lines.len() == RECENT_MAX {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    /// The last `n` lines, oldest first.
    pub fn last(&self, n: usize) -> Vec<RecentLine> {
        let Ok(lines) = self.lines.lock() else {
            return Vec::new();
        };
        let skip = lines.len().saturating_sub(n);
        lines.iter().skip(skip).cloned().collect()
    }
}

/// A `tracing` layer that copies warnings and errors (those the filter lets through) into
/// [`RECENT`].
pub struct RecentLayer;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for RecentLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let meta = event.metadata();
        let level = match *meta.level() {
            tracing::Level::ERROR => "error",
            tracing::Level::WARN => "warn",
            _ => return,
        };
        let mut text = Text::default();
        event.record(&mut text);
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        RECENT.push(RecentLine {
            unix_ms,
            level,
            target: meta.target().to_string(),
            message: text.message + &text.fields,
        });
    }
}

/// An event's message and fields as text.
#[derive(Default)]
struct Text {
    message: String,
    fields: String,
}

impl tracing::field::Visit for Text {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write as _;
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            self.fields.push_str(&format!(" {}={value}", field.name()));
        }
    }
}

/// At most [`Limit::BURST`] lines per [`Limit::WINDOW`] for one log call site; the first line
/// after a window with suppressed lines says how many.
pub struct Limit {
    /// Start of the current window, in milliseconds since the process's first limited line.
    window: AtomicU64,
    /// Lines in the current window (admitted or not).
    count: AtomicU64,
    /// Lines suppressed and not yet reported.
    suppressed: AtomicU64,
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl Limit {
    pub const BURST: u64 = 10;
    pub const WINDOW: Duration = Duration::from_secs(10);

    #[allow(clippy::new_without_default)] // used in statics
    pub const fn new() -> Limit {
        Limit {
            window: AtomicU64::new(0),
            count: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(lines suppressed since the last admitted one)` when this line may be logged.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(epoch().elapsed())
    }

    fn admit_at(&self, now: Duration) -> Option<u64> {
        let now_ms = now.as_millis() as u64;
        let start = self.window.load(Ordering::Relaxed);
        if now_ms.saturating_sub(start) >= Self::WINDOW.as_millis() as u64
            && self
                .window
                .compare_exchange(start, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.count.store(0, Ordering::Relaxed);
        }
        if self.count.fetch_add(1, Ordering::Relaxed) < Self::BURST {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// `tracing::warn!` (or another level) limited per call site to [`Limit::BURST`] lines per
/// [`Limit::WINDOW`], with a `suppressed` field counting the lines left out before this one.
macro_rules! log_limited {
    ($level:ident, $($rest:tt)+) => {{
        static LIMIT: $crate::telemetry::logging::Limit = $crate::telemetry::logging::Limit::new();
        if let Some(suppressed) = LIMIT.admit() {
            tracing::$level!(suppressed, $($rest)+);
        }
    }};
}
pub(crate) use log_limited;

#[cfg(test)]
mod tests {
    use super::{Limit, Sink};
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    /// An output that blocks every write until it is opened, then records what it got.
    #[derive(Clone, Default)]
    struct Gate {
        open: Arc<(Mutex<bool>, std::sync::Condvar)>,
        got: Arc<Mutex<Vec<u8>>>,
    }

    impl Gate {
        fn open(&self) {
            *self.open.0.lock().unwrap() = true;
            self.open.1.notify_all();
        }
    }

    impl Write for Gate {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let mut open = self.open.0.lock().unwrap();
            while !*open {
                open = self.open.1.wait(open).unwrap();
            }
            self.got.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_blocked_output_drops_and_counts_lines_and_never_blocks_the_caller() {
        static DROPPED: AtomicU64 = AtomicU64::new(0);
        let gate = Gate::default();
        let sink = Sink::new("test-blocked", Box::new(gate.clone()), 1000, &DROPPED).unwrap();
        let line = [b'x'; 99];
        let started = Instant::now();
        let mut kept = 0;
        for _ in 0..10_000 {
            if sink.push(&line) {
                kept += 1;
            }
        }
        assert!(started.elapsed() < Duration::from_secs(2));
        // The writer took one batch (and blocks on it); at most 1,000 bytes wait behind it.
        assert!(kept <= 20, "{kept}");
        assert_eq!(DROPPED.load(Ordering::Relaxed), 10_000 - kept);
        assert!(!sink.flush(Duration::from_millis(20)), "flush must give up");
        gate.open();
        assert!(sink.flush(Duration::from_secs(5)));
        assert_eq!(gate.got.lock().unwrap().len(), kept as usize * 99);
        // After recovery, lines pass again.
        assert!(sink.push(b"after\n"));
        assert!(sink.flush(Duration::from_secs(5)));
        assert!(gate.got.lock().unwrap().ends_with(b"after\n"));
    }

    #[test]
    fn an_unread_pipe_costs_lines_not_time() {
        static DROPPED: AtomicU64 = AtomicU64::new(0);
        // A real socket whose reader never reads: the kernel takes its buffer, then blocks.
        let (reader, writer) = std::os::unix::net::UnixStream::pair().unwrap();
        let sink = Sink::new("test-pipe", Box::new(writer), 64 * 1024, &DROPPED).unwrap();
        let line = [b'y'; 200];
        let started = Instant::now();
        for _ in 0..50_000 {
            sink.push(&line);
        }
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(DROPPED.load(Ordering::Relaxed) > 40_000);
        drop(sink);
        drop(reader);
    }

    #[test]
    fn closing_the_sink_writes_what_is_left() {
        static DROPPED: AtomicU64 = AtomicU64::new(0);
        let (mut reader, writer) = std::os::unix::net::UnixStream::pair().unwrap();
        let sink = Sink::new("test-close", Box::new(writer), 1 << 20, &DROPPED).unwrap();
        for i in 0..100 {
            assert!(sink.push(format!("line {i}\n").as_bytes()));
        }
        drop(sink);
        // The thread ends (closing its end of the socket) once everything left is written.
        let mut all = String::new();
        reader.read_to_string(&mut all).unwrap();
        assert_eq!(all.lines().count(), 100);
        assert!(all.ends_with("line 99\n"));
    }

    #[test]
    fn recent_warnings_keep_their_message_and_fields() {
        use tracing_subscriber::layer::SubscriberExt;
        let subscriber = tracing_subscriber::registry().with(super::RecentLayer);
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!("not kept");
            tracing::warn!(group = "g", server = %"10.0.0.1:80", "server down: {}", "refused");
        });
        let last = super::RECENT.last(50);
        let line = last
            .iter()
            .rev()
            .find(|l| l.message.starts_with("server down"))
            .expect("the warning");
        assert_eq!(line.level, "warn");
        assert_eq!(
            line.message,
            "server down: refused group=g server=10.0.0.1:80"
        );
        assert!(!last.iter().any(|l| l.message == "not kept"));
    }

    #[test]
    fn limit_admits_a_burst_per_window_and_reports_what_it_left_out() {
        let l = Limit::new();
        let t0 = Duration::from_secs(100);
        for _ in 0..Limit::BURST {
            assert_eq!(l.admit_at(t0), Some(0));
        }
        for _ in 0..5 {
            assert_eq!(l.admit_at(t0 + Duration::from_secs(1)), None);
        }
        let later = t0 + Limit::WINDOW + Duration::from_millis(1);
        assert_eq!(l.admit_at(later), Some(5));
        assert_eq!(l.admit_at(later), Some(0));
    }
}
