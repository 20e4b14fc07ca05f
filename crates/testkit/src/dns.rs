//! A scripted DNS server on an ephemeral loopback UDP port, with the wire format written by hand (A, AAAA, SRV answers; NXDOMAIN, SERVFAIL, silence).

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// One SRV record: priority, weight, port, target name.
#[derive(Debug, Clone)]
pub struct Srv {
    pub priority: u16,
    pub weight: u16,
    pub port: u16,
    pub target: String,
}

/// The records of one name.
#[derive(Debug, Clone, Default)]
pub struct Records {
    pub a: Vec<Ipv4Addr>,
    pub aaaa: Vec<Ipv6Addr>,
    pub srv: Vec<Srv>,
}

/// How the server answers every query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// From the zone: records, NODATA for a name without records of the type, NXDOMAIN for a
    /// name not in the zone.
    Zone,
    /// SERVFAIL to everything.
    ServFail,
    /// No answer at all (the resolver times out).
    Silent,
}

struct State {
    zone: HashMap<String, Records>,
    mode: Mode,
    ttl: u32,
}

/// A DNS server answering from a zone the test changes as it runs; serves until dropped.
pub struct TestDns {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    queries: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

/// `name` lowercased with a final dot.
fn absolute(name: &str) -> String {
    let n = name.to_ascii_lowercase();
    match n.ends_with('.') {
        true => n,
        false => format!("{n}."),
    }
}

impl TestDns {
    /// Start with an empty zone; every answer carries `ttl` seconds.
    pub fn start(ttl: u32) -> TestDns {
        let socket = UdpSocket::bind("127.0.0.1:0").expect("bind test DNS server");
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .expect("read timeout");
        let addr = socket.local_addr().expect("local addr");
        let state = Arc::new(Mutex::new(State {
            zone: HashMap::new(),
            mode: Mode::Zone,
            ttl,
        }));
        let queries = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, q, st) = (state.clone(), queries.clone(), stop.clone());
        thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while !st.load(Ordering::SeqCst) {
                let Ok((n, from)) = socket.recv_from(&mut buf) else {
                    continue;
                };
                q.fetch_add(1, Ordering::SeqCst);
                let answer = {
                    let state = s.lock().unwrap_or_else(|e| e.into_inner());
                    answer(&buf[..n], &state)
                };
                if let Some(a) = answer {
                    let _ = socket.send_to(&a, from);
                }
            }
        });
        TestDns {
            addr,
            state,
            queries,
            stop,
        }
    }

    /// Set (replace) the records of `name`.
    pub fn set(&self, name: &str, records: Records) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.zone.insert(absolute(name), records);
    }

    /// Take `name` out of the zone: NXDOMAIN from now on.
    pub fn remove(&self, name: &str) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.zone.remove(&absolute(name));
    }

    pub fn set_mode(&self, mode: Mode) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).mode = mode;
    }

    /// Queries received so far (answered or not).
    pub fn queries(&self) -> usize {
        self.queries.load(Ordering::SeqCst)
    }
}

impl Drop for TestDns {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

const A: u16 = 1;
const AAAA: u16 = 28;
const SRV: u16 = 33;

/// The answer to one query datagram, or None (silence, or not a query).
fn answer(query: &[u8], state: &State) -> Option<Vec<u8>> {
    if query.len() < 12 || query[2] & 0x80 != 0 {
        return None;
    }
    if u16::from_be_bytes([query[4], query[5]]) != 1 {
        return None;
    }
    // The question: labels up to the root, then type and class.
    let mut i = 12;
    let mut labels = Vec::new();
    loop {
        let len = *query.get(i)? as usize;
        i += 1;
        if len == 0 {
            break;
        }
        if len > 63 {
            return None;
        }
        labels.push(String::from_utf8_lossy(query.get(i..i + len)?).to_ascii_lowercase());
        i += len;
    }
    let qtype = u16::from_be_bytes([*query.get(i)?, *query.get(i + 1)?]);
    let question_end = i + 4;
    query.get(..question_end)?;
    let name = format!("{}.", labels.join("."));
    let (rcode, answers): (u8, Vec<(u16, Vec<u8>)>) = match state.mode {
        Mode::Silent => return None,
        Mode::ServFail => (2, Vec::new()),
        Mode::Zone => match state.zone.get(&name) {
            None => (3, Vec::new()),
            Some(r) => (
                0,
                match qtype {
                    A => r.a.iter().map(|ip| (A, ip.octets().to_vec())).collect(),
                    AAAA => r
                        .aaaa
                        .iter()
                        .map(|ip| (AAAA, ip.octets().to_vec()))
                        .collect(),
                    SRV => r
                        .srv
                        .iter()
                        .map(|s| {
                            let mut d = Vec::new();
                            d.extend_from_slice(&s.priority.to_be_bytes());
                            d.extend_from_slice(&s.weight.to_be_bytes());
                            d.extend_from_slice(&s.port.to_be_bytes());
                            encode_name(&s.target, &mut d);
                            (SRV, d)
                        })
                        .collect(),
                    _ => Vec::new(),
                },
            ),
        },
    };
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(&query[0..2]);
    // QR, authoritative, the query's RD; RA; the rcode.
    out.push(0x84 | (query[2] & 0x01));
    out.push(0x80 | rcode);
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&(answers.len() as u16).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&query[12..question_end]);
    for (rtype, data) in answers {
        // The owner name points at the question's (offset 12).
        out.extend_from_slice(&[0xC0, 0x0C]);
        out.extend_from_slice(&rtype.to_be_bytes());
        out.extend_from_slice(&1u16.to_be_bytes());
        out.extend_from_slice(&state.ttl.to_be_bytes());
        out.extend_from_slice(&(data.len() as u16).to_be_bytes());
        out.extend_from_slice(&data);
    }
    Some(out)
}

/// A name as labels, uncompressed (SRV targets may not be compressed).
fn encode_name(name: &str, out: &mut Vec<u8>) {
    for label in name
        .trim_end_matches('.')
        .split('.')
        .filter(|l| !l.is_empty())
    {
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
}
