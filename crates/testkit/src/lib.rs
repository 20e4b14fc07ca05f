//! Test helpers: scripted upstream servers, raw HTTP/1.1 clients, a DNS server and an etcd server on ephemeral loopback ports.

// Deliberately independent of `portico-http1` (plain `httparse` and hand-written framing) so
// tests do not check the codec against itself.

pub mod dns;
pub mod etcd;

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

/// How long a test client or server waits on a socket before giving up.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// A request as an upstream test server received it.
#[derive(Debug, Clone, Default)]
pub struct Captured {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Raw head bytes as received.
    pub raw_head: Vec<u8>,
    /// Index of the connection this request arrived on (0-based, per server).
    pub connection: usize,
}

impl Captured {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn header_count(&self, name: &str) -> usize {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .count()
    }
}

/// What a test upstream does with a request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A normal response; `chunked` sends the body in two chunks.
    Respond {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
        chunked: bool,
    },
    /// Close the connection without answering.
    Close,
    /// Wait, then answer 200 "late".
    Stall(Duration),
    /// Write these bytes verbatim, then keep serving.
    Raw(Vec<u8>),
    /// Write these bytes verbatim, then close.
    RawThenClose(Vec<u8>),
}

impl Reply {
    pub fn ok(body: &str) -> Reply {
        Reply::Respond {
            status: 200,
            headers: vec![],
            body: body.as_bytes().to_vec(),
            chunked: false,
        }
    }
}

type Handler = dyn Fn(&Captured) -> Reply + Send + Sync;

/// Holds requests inside a test upstream's handler until the test lets them go, so a test can
/// keep a server busy for exactly as long as it needs without sleeping. Clone it into the handler
/// and call [`Hold::wait`] there.
#[derive(Clone, Default)]
pub struct Hold {
    inner: Arc<(Mutex<HoldState>, Condvar)>,
}

#[derive(Default)]
struct HoldState {
    /// Handlers blocked in `wait` now.
    held: usize,
    /// Handlers that may leave `wait` (one each).
    permits: usize,
    /// Everything passes, now and later.
    open: bool,
}

impl Hold {
    pub fn new() -> Hold {
        Hold::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, HoldState> {
        self.inner.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Block (in a handler) until [`Hold::release`] or [`Hold::open`] lets this request go, or
    /// [`IO_TIMEOUT`] passes (so a failing test cannot hang forever).
    pub fn wait(&self) {
        let (_, cv) = &*self.inner;
        let mut st = self.state();
        st.held += 1;
        cv.notify_all();
        let deadline = std::time::Instant::now() + IO_TIMEOUT;
        while !st.open && st.permits == 0 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            st = cv
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        st.permits = st.permits.saturating_sub(1);
        st.held -= 1;
        cv.notify_all();
    }

    /// Requests blocked in [`Hold::wait`] now.
    pub fn held(&self) -> usize {
        self.state().held
    }

    /// Wait until at least `n` requests are held; false after [`IO_TIMEOUT`].
    pub fn wait_held(&self, n: usize) -> bool {
        let (_, cv) = &*self.inner;
        let mut st = self.state();
        let deadline = std::time::Instant::now() + IO_TIMEOUT;
        while st.held < n {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            st = cv
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// Let `n` held (or future) requests go, one each.
    pub fn release(&self, n: usize) {
        self.state().permits += n;
        self.inner.1.notify_all();
    }

    /// Let every request go, now and later.
    pub fn open(&self) {
        self.state().open = true;
        self.inner.1.notify_all();
    }
}

/// A scripted HTTP/1.1 upstream on an ephemeral port; serves until the process exits.
pub struct TestUpstream {
    pub addr: SocketAddr,
    pub connections: Arc<AtomicUsize>,
    pub requests: Arc<Mutex<Vec<Captured>>>,
}

impl TestUpstream {
    pub fn start(handler: impl Fn(&Captured) -> Reply + Send + Sync + 'static) -> TestUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind test upstream");
        Self::serve(listener, handler)
    }

    /// Like [`TestUpstream::start`], on `addr` (another loopback address, a given port); None
    /// when it cannot be bound.
    pub fn start_on(
        addr: SocketAddr,
        handler: impl Fn(&Captured) -> Reply + Send + Sync + 'static,
    ) -> Option<TestUpstream> {
        let listener = TcpListener::bind(addr).ok()?;
        Some(Self::serve(listener, handler))
    }

    fn serve(
        listener: TcpListener,
        handler: impl Fn(&Captured) -> Reply + Send + Sync + 'static,
    ) -> TestUpstream {
        let addr = listener.local_addr().expect("local addr");
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let handler: Arc<Handler> = Arc::new(handler);
        let (c, r) = (connections.clone(), requests.clone());
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let index = c.fetch_add(1, Ordering::SeqCst);
                let (h, r) = (handler.clone(), r.clone());
                thread::spawn(move || {
                    let _ = serve_conn(stream, index, &*h, &r);
                });
            }
        });
        TestUpstream {
            addr,
            connections,
            requests,
        }
    }

    pub fn requests(&self) -> Vec<Captured> {
        self.requests.lock().map(|v| v.clone()).unwrap_or_default()
    }

    pub fn connection_count(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// A scripted upstream that can be stopped (listener closed, open connections shut down, so
/// connects are refused) and started again on the same address: a server that dies and comes back.
pub struct StoppableUpstream {
    pub addr: SocketAddr,
    pub requests: Arc<Mutex<Vec<Captured>>>,
    handler: Arc<Handler>,
    running: Arc<std::sync::atomic::AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    acceptor: Mutex<Option<thread::JoinHandle<()>>>,
    /// While stopped, a bound socket that does not listen holds the port: connects are refused,
    /// and a test running in parallel cannot bind the port and answer in the dead server's place.
    reserved: Mutex<Option<socket2::Socket>>,
}

/// A TCP socket bound to `addr` with `SO_REUSEPORT`, so the listener and the port's reservation
/// can overlap when the server stops or starts again (the port is never free in between). The
/// reservation leaves out `SO_REUSEADDR`: Linux lets two sockets that both set it share a port
/// while neither listens, so a plain `TcpListener::bind` could take the port from it.
fn reuse_port_socket(addr: SocketAddr, reuse_address: bool) -> io::Result<socket2::Socket> {
    let s = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )?;
    s.set_reuse_address(reuse_address)?;
    s.set_reuse_port(true)?;
    s.bind(&addr.into())?;
    Ok(s)
}

fn reuse_port_listener(addr: SocketAddr) -> io::Result<TcpListener> {
    let s = reuse_port_socket(addr, true)?;
    s.listen(128)?;
    Ok(s.into())
}

impl StoppableUpstream {
    pub fn start(
        handler: impl Fn(&Captured) -> Reply + Send + Sync + 'static,
    ) -> StoppableUpstream {
        let listener =
            reuse_port_listener(SocketAddr::from(([127, 0, 0, 1], 0))).expect("bind test upstream");
        let addr = listener.local_addr().expect("local addr");
        let up = StoppableUpstream {
            addr,
            requests: Arc::new(Mutex::new(Vec::new())),
            handler: Arc::new(handler),
            running: Arc::new(std::sync::atomic::AtomicBool::new(true)),
            open: Arc::new(Mutex::new(Vec::new())),
            acceptor: Mutex::new(None),
            reserved: Mutex::new(None),
        };
        up.accept_on(listener);
        up
    }

    fn accept_on(&self, listener: TcpListener) {
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let (handler, log, running, open) = (
            self.handler.clone(),
            self.requests.clone(),
            self.running.clone(),
            self.open.clone(),
        );
        let t = thread::spawn(move || {
            let mut index = 0;
            while running.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let _ = stream.set_nonblocking(false);
                        if let (Ok(mut o), Ok(clone)) = (open.lock(), stream.try_clone()) {
                            o.push(clone);
                        }
                        let (h, l) = (handler.clone(), log.clone());
                        let i = index;
                        index += 1;
                        thread::spawn(move || {
                            let _ = serve_conn(stream, i, &*h, &l);
                        });
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        thread::sleep(Duration::from_millis(2));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(2)),
                }
            }
            // The listener is dropped here: new connects are refused.
        });
        if let Ok(mut a) = self.acceptor.lock() {
            *a = Some(t);
        }
    }

    /// Close the listener and every open connection. The port stays reserved until `restart`.
    pub fn stop(&self) {
        if let Ok(mut r) = self.reserved.lock() {
            if r.is_none() {
                *r = Some(
                    reuse_port_socket(self.addr, false).expect("reserve the stopped server's port"),
                );
            }
        }
        self.running.store(false, Ordering::SeqCst);
        let t = self.acceptor.lock().ok().and_then(|mut a| a.take());
        if let Some(t) = t {
            let _ = t.join();
        }
        if let Ok(mut open) = self.open.lock() {
            for s in open.drain(..) {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }

    /// Listen on the same address again.
    pub fn restart(&self) {
        let listener =
            reuse_port_listener(self.addr).unwrap_or_else(|e| panic!("rebind {}: {e}", self.addr));
        if let Ok(mut r) = self.reserved.lock() {
            *r = None;
        }
        self.running.store(true, Ordering::SeqCst);
        self.accept_on(listener);
    }

    pub fn requests(&self) -> Vec<Captured> {
        self.requests.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

impl Drop for StoppableUpstream {
    fn drop(&mut self) {
        self.stop();
    }
}

fn serve_conn(
    stream: TcpStream,
    index: usize,
    handler: &Handler,
    log: &Mutex<Vec<Captured>>,
) -> io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    loop {
        let Some((mut req, len, chunked)) = read_request_head(&mut reader)? else {
            return Ok(());
        };
        req.connection = index;
        req.body = if chunked {
            read_chunked(&mut reader)?
        } else {
            read_exact_vec(&mut reader, len)?
        };
        let reply = handler(&req);
        let head_only = req.method == "HEAD";
        if let Ok(mut l) = log.lock() {
            l.push(req);
        }
        match reply {
            Reply::Close => {
                let _ = writer.shutdown(Shutdown::Both);
                return Ok(());
            }
            Reply::Stall(d) => {
                thread::sleep(d);
                writer.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlate")?;
            }
            Reply::Raw(bytes) => writer.write_all(&bytes)?,
            Reply::RawThenClose(bytes) => {
                writer.write_all(&bytes)?;
                let _ = writer.shutdown(Shutdown::Both);
                return Ok(());
            }
            Reply::Respond {
                status,
                headers,
                body,
                chunked,
            } => {
                let mut out = format!("HTTP/1.1 {status} X\r\n").into_bytes();
                for (n, v) in &headers {
                    out.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
                }
                let no_body = head_only || status == 204 || status == 304;
                if chunked && !no_body {
                    out.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
                    let mid = body.len() / 2;
                    for part in [&body[..mid], &body[mid..]] {
                        if !part.is_empty() {
                            out.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
                            out.extend_from_slice(part);
                            out.extend_from_slice(b"\r\n");
                        }
                    }
                    out.extend_from_slice(b"0\r\n\r\n");
                } else {
                    if status != 204 && status != 304 {
                        out.extend_from_slice(
                            format!("Content-Length: {}\r\n", body.len()).as_bytes(),
                        );
                    }
                    out.extend_from_slice(b"\r\n");
                    if !no_body {
                        out.extend_from_slice(&body);
                    }
                }
                writer.write_all(&out)?;
            }
        }
    }
}

fn read_head_bytes<R: BufRead>(r: &mut R) -> io::Result<Option<Vec<u8>>> {
    let mut head = Vec::new();
    loop {
        let mut line = Vec::new();
        let n = r.read_until(b'\n', &mut line)?;
        if n == 0 {
            return if head.is_empty() {
                Ok(None)
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            };
        }
        head.extend_from_slice(&line);
        if line == b"\r\n" || line == b"\n" {
            return Ok(Some(head));
        }
    }
}

fn read_request_head<R: BufRead>(r: &mut R) -> io::Result<Option<(Captured, usize, bool)>> {
    let Some(raw) = read_head_bytes(r)? else {
        return Ok(None);
    };
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut headers);
    req.parse(&raw)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let headers: Vec<(String, String)> = req
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_string(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    let len = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0);
    let chunked = headers
        .iter()
        .any(|(n, v)| n.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let cap = Captured {
        method: req.method.unwrap_or("").to_string(),
        target: req.path.unwrap_or("").to_string(),
        headers,
        body: Vec::new(),
        raw_head: raw.clone(),
        connection: 0,
    };
    Ok(Some((cap, len, chunked)))
}

fn read_exact_vec<R: Read>(r: &mut R, len: usize) -> io::Result<Vec<u8>> {
    let mut v = vec![0u8; len];
    r.read_exact(&mut v)?;
    Ok(v)
}

fn read_chunked<R: BufRead>(r: &mut R) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line)?;
        let size_str = line.trim_end().split(';').next().unwrap_or("");
        let size = usize::from_str_radix(size_str, 16)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        if size == 0 {
            // trailers until the empty line
            loop {
                let mut t = String::new();
                r.read_line(&mut t)?;
                if t == "\r\n" || t.is_empty() {
                    return Ok(body);
                }
            }
        }
        body.extend_from_slice(&read_exact_vec(r, size)?);
        let mut crlf = [0u8; 2];
        r.read_exact(&mut crlf)?;
    }
}

/// A response as a test client read it.
#[derive(Debug, Clone, Default)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub trailers: Vec<String>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A blocking HTTP/1.1 client on one connection.
pub struct Client {
    pub reader: BufReader<TcpStream>,
    pub writer: TcpStream,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> io::Result<Client> {
        let s = TcpStream::connect(addr)?;
        s.set_read_timeout(Some(IO_TIMEOUT))?;
        s.set_nodelay(true)?;
        Ok(Client {
            writer: s.try_clone()?,
            reader: BufReader::new(s),
        })
    }

    pub fn send(&mut self, raw: &[u8]) -> io::Result<()> {
        self.writer.write_all(raw)
    }

    /// Read one response; `head_request` means no body follows.
    pub fn read_response(&mut self, head_request: bool) -> io::Result<Response> {
        loop {
            let resp = self.read_one(head_request)?;
            if resp.status >= 200 || resp.status == 101 {
                return Ok(resp);
            }
        }
    }

    /// Read one response, including interim 1xx ones.
    pub fn read_one(&mut self, head_request: bool) -> io::Result<Response> {
        let Some(raw) = read_head_bytes(&mut self.reader)? else {
            return Err(io::ErrorKind::UnexpectedEof.into());
        };
        let mut headers = [httparse::EMPTY_HEADER; 128];
        let mut resp = httparse::Response::new(&mut headers);
        resp.parse(&raw)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let status = resp.code.unwrap_or(0);
        let headers: Vec<(String, String)> = resp
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_string(),
                    String::from_utf8_lossy(h.value).into_owned(),
                )
            })
            .collect();
        let mut out = Response {
            status,
            headers,
            body: Vec::new(),
            trailers: Vec::new(),
        };
        if head_request || status < 200 || status == 204 || status == 304 {
            return Ok(out);
        }
        if out
            .header("transfer-encoding")
            .is_some_and(|v| v.contains("chunked"))
        {
            out.body = read_chunked(&mut self.reader)?;
        } else if let Some(len) = out
            .header("content-length")
            .and_then(|v| v.trim().parse().ok())
        {
            out.body = read_exact_vec(&mut self.reader, len)?;
        } else {
            self.reader.read_to_end(&mut out.body)?;
        }
        Ok(out)
    }

    /// Send a request and read its response.
    pub fn request(&mut self, raw: &[u8]) -> io::Result<Response> {
        self.send(raw)?;
        self.read_response(raw.starts_with(b"HEAD "))
    }

    /// True once the server has closed the connection (EOF within the timeout).
    pub fn is_closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.reader.read(&mut b), Ok(0) | Err(_))
    }
}

/// Send raw bytes on a new connection and read everything until the server closes.
pub fn exchange_raw(addr: SocketAddr, raw: &[u8]) -> io::Result<Vec<u8>> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.write_all(raw)?;
    let mut out = Vec::new();
    match s.read_to_end(&mut out) {
        Ok(_) => Ok(out),
        Err(e) if !out.is_empty() && e.kind() == io::ErrorKind::ConnectionReset => Ok(out),
        Err(e) => Err(e),
    }
}

/// Status code of the first response in raw bytes.
pub fn status_of(raw: &[u8]) -> Option<u16> {
    let line = raw.split(|&b| b == b'\n').next()?;
    std::str::from_utf8(line)
        .ok()?
        .split(' ')
        .nth(1)?
        .parse()
        .ok()
}

/// Read from a raw socket until a complete message head has arrived. Returns every byte read
/// (bytes after the head may be included) and the length of the head.
pub fn read_past_head<R: Read>(r: &mut R) -> io::Result<(Vec<u8>, usize)> {
    let mut got = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            return Ok((got, end + 4));
        }
        let n = r.read(&mut buf)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        got.extend_from_slice(&buf[..n]);
    }
}

/// A local address nothing listens on: connecting to it is refused.
pub fn closed_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    let a = l.local_addr().expect("local address");
    drop(l);
    a
}

/// A free loopback port below the kernel's ephemeral range, for a server a test stops and starts
/// again on the same port: while it is down no connect() (to it or anywhere) is given the port as
/// its source, as one in the ephemeral range can be (a client reconnecting to 127.0.0.1:P from P
/// connects to itself and holds P), and the restart would fail to bind.
pub fn port_for_restarts() -> u16 {
    let low = ephemeral_low();
    let (from, to) = (low.saturating_sub(12_000).max(1024), low);
    // Ports handed out to this process's tests stay theirs while their server is down.
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    // Each test process probes from its own place; within one, `GIVEN` keeps the ports apart.
    let start = std::process::id().wrapping_mul(7919);
    let span = u32::from(to.saturating_sub(from));
    let port = (0..span)
        .map(|i| from + ((start.wrapping_add(i)) % span) as u16)
        .find(|p| !given.contains(p) && TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .unwrap_or_else(|| {
            // No room below the ephemeral range (it starts at 1024 or so): the race is back,
            // rare as it is.
            let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
            l.local_addr().expect("local address").port()
        });
    given.push(port);
    port
}

/// The first port of the kernel's ephemeral range (32768 when it cannot be read).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768)
}

/// `list` as a TOML array of quoted addresses (a group's `servers`).
pub fn toml_servers(list: &[SocketAddr]) -> String {
    let quoted: Vec<String> = list.iter().map(|a| format!("\"{a}\"")).collect();
    format!("[{}]", quoted.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(addr: SocketAddr) -> io::Result<String> {
        let r = Client::connect(addr)?.request(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")?;
        Ok(r.text())
    }

    #[test]
    fn ports_for_restarts_lie_below_the_ephemeral_range_and_are_handed_out_once() {
        let low = ephemeral_low();
        let ports: Vec<u16> = (0..50).map(|_| port_for_restarts()).collect();
        if low > 2048 {
            assert!(ports.iter().all(|&p| p >= 1024 && p < low), "{ports:?}");
        }
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "{ports:?}");
    }

    #[test]
    fn a_stopped_upstream_refuses_connects_and_keeps_its_port_until_restarted() {
        let up = StoppableUpstream::start(|_| Reply::ok("alive"));
        assert_eq!(answered(up.addr).unwrap(), "alive");
        up.stop();
        let refused = TcpStream::connect(up.addr).map(|_| ()).unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
        let taken = TcpListener::bind(up.addr).map(|_| ()).unwrap_err();
        assert_eq!(taken.kind(), io::ErrorKind::AddrInUse, "port left free");
        up.restart();
        assert_eq!(answered(up.addr).unwrap(), "alive");
    }
}
