//! `portico bench relay`: the floor, a minimal blind one-to-one TCP relay on one thread (epoll, no parsing): about what the kernel charges any proxy for the same bytes.

use rustix::event::epoll;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};

/// The `portico bench relay` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct RelayFlags {
    /// Where to listen.
    #[arg(long, value_name = "ADDR")]
    pub listen: SocketAddr,
    /// Where every accepted connection is relayed to (one connection there per client
    /// connection, opened when the client's is accepted).
    #[arg(long, value_name = "ADDR")]
    pub to: SocketAddr,
}

/// The listener's token (a connection's is its slot times two plus its side).
const LISTENER: u64 = u64::MAX;

/// Bytes read at once (and the most one side holds while the other cannot take them).
const CHUNK: usize = 64 * 1024;

/// One direction's end: a socket, what was read from the other side and not yet written to it,
/// whether its peer ended (FIN read from the other side) and what it is watched for.
struct Side {
    stream: TcpStream,
    /// Bytes for this side, read from the other (the other is not read while any are left).
    pending: Vec<u8>,
    /// This side sent its FIN (read returned 0).
    ended: bool,
    /// Its write half was shut (the other side ended and everything was written).
    shut: bool,
    watched: epoll::EventFlags,
}

impl Side {
    fn new(stream: TcpStream) -> Side {
        Side {
            stream,
            pending: Vec::new(),
            ended: false,
            shut: false,
            watched: epoll::EventFlags::empty(),
        }
    }
}

/// Relay until the process is killed. Errors on a connection close that pair only; an error
/// returned is the listener's or epoll's own.
pub fn relay(f: &RelayFlags) -> std::io::Result<()> {
    // As many connections as the hard limit allows (`portico run` does the same).
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        },
    );
    serve(TcpListener::bind(f.listen)?, f.to)
}

/// Relay the clients of `listener` to `to` until the process is killed.
pub fn serve(listener: TcpListener, to: SocketAddr) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
    let listen = |on: bool| match on {
        true => epoll::add(
            &ep,
            &listener,
            epoll::EventData::new_u64(LISTENER),
            epoll::EventFlags::IN,
        ),
        false => epoll::delete(&ep, &listener),
    };
    listen(true)?;
    // Out of descriptors: not listening until a pair closes (the listener would stay readable).
    let mut paused = false;
    let mut pairs: Vec<Option<[Side; 2]>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut closed: Vec<usize> = Vec::new();
    let mut buf = vec![0u8; CHUNK];
    let mut events: Vec<epoll::Event> = Vec::with_capacity(256);
    loop {
        events.clear();
        match epoll::wait(&ep, rustix::buffer::spare_capacity(&mut events), None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
        for ev in &events {
            let token = ev.data.u64();
            if token == LISTENER {
                if !accept(&listener, to, &ep, &mut pairs, &mut free) && !paused {
                    paused = listen(false).is_ok();
                }
                continue;
            }
            let slot = (token / 2) as usize;
            let side = (token % 2) as usize;
            let Some(Some(pair)) = pairs.get_mut(slot) else {
                continue;
            };
            let ok = step(pair, side, ev.flags, &mut buf) && watch(&ep, pair, slot).is_ok();
            let done = pair.iter().all(|s| s.ended && s.pending.is_empty());
            if !ok || done {
                // Closing the sockets takes them out of epoll; the slot is reused only after
                // this batch (later events of it may name the pair just closed).
                pairs[slot] = None;
                closed.push(slot);
            }
        }
        if !closed.is_empty() && paused {
            paused = listen(true).is_err();
        }
        free.append(&mut closed);
    }
}

/// Accept every waiting client and connect each to `to`; false when out of descriptors.
fn accept(
    listener: &TcpListener,
    to: SocketAddr,
    ep: &rustix::fd::OwnedFd,
    pairs: &mut Vec<Option<[Side; 2]>>,
    free: &mut Vec<usize>,
) -> bool {
    loop {
        let client = match listener.accept() {
            Ok((c, _)) => c,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if e.raw_os_error().is_some_and(is_out_of_fds) => return false,
            // A connection reset before it was accepted: the next one.
            Err(_) => continue,
        };
        // A blocking connect: on loopback it completes at once.
        let server = match TcpStream::connect(to) {
            Ok(s) => s,
            Err(e) if e.raw_os_error().is_some_and(is_out_of_fds) => return false,
            Err(_) => continue,
        };
        let ready = [&client, &server]
            .iter()
            .all(|s| s.set_nonblocking(true).is_ok() && s.set_nodelay(true).is_ok());
        if !ready {
            continue;
        }
        let slot = free.pop().unwrap_or_else(|| {
            pairs.push(None);
            pairs.len() - 1
        });
        let mut pair = [Side::new(client), Side::new(server)];
        if watch(ep, &mut pair, slot).is_ok() {
            pairs[slot] = Some(pair);
        } else {
            free.push(slot);
        }
    }
}

/// Whether an error number says the process or the system is out of descriptors.
fn is_out_of_fds(errno: i32) -> bool {
    let e = rustix::io::Errno::from_raw_os_error(errno);
    e == rustix::io::Errno::MFILE || e == rustix::io::Errno::NFILE
}

/// Handle `flags` on side `i` of `pair`; false when the pair is to be closed (an error).
fn step(pair: &mut [Side; 2], i: usize, flags: epoll::EventFlags, buf: &mut [u8]) -> bool {
    let o = 1 - i;
    if flags.contains(epoll::EventFlags::ERR) {
        return false;
    }
    if flags.contains(epoll::EventFlags::OUT) && !flush(&mut pair[i]) {
        return false;
    }
    let readable = epoll::EventFlags::IN | epoll::EventFlags::HUP;
    // Read while the other side takes everything; a short read means the socket is drained.
    while flags.intersects(readable) && !pair[i].ended && pair[o].pending.is_empty() {
        match pair[i].stream.read(buf) {
            Ok(0) => pair[i].ended = true,
            Ok(n) => {
                // Written straight from the read buffer; only what the socket did not take
                // is kept (the other side is not read until it is written).
                let mut sent = 0;
                while sent < n {
                    match pair[o].stream.write(&buf[sent..n]) {
                        Ok(0) => return false,
                        Ok(w) => sent += w,
                        Err(e) if e.kind() == ErrorKind::Interrupted => {}
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(_) => return false,
                    }
                }
                pair[o].pending.extend_from_slice(&buf[sent..n]);
                if n < buf.len() {
                    break;
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(_) => return false,
        }
    }
    // A side that ended: its FIN passed on once everything before it was.
    for (from, to) in [(0, 1), (1, 0)] {
        if pair[from].ended && pair[to].pending.is_empty() && !pair[to].shut {
            pair[to].shut = true;
            let _ = pair[to].stream.shutdown(Shutdown::Write);
        }
    }
    true
}

/// Write what `side` has pending; false on an error.
fn flush(side: &mut Side) -> bool {
    while !side.pending.is_empty() {
        match side.stream.write(&side.pending) {
            Ok(0) => return false,
            Ok(n) => {
                side.pending.drain(..n);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}

/// Watch each side of `pair` for what it waits for: reading while the other side can take
/// more, writing while bytes are pending.
fn watch(ep: &rustix::fd::OwnedFd, pair: &mut [Side; 2], slot: usize) -> std::io::Result<()> {
    for i in 0..2 {
        let mut want = epoll::EventFlags::empty();
        if !pair[i].ended && pair[1 - i].pending.is_empty() {
            want |= epoll::EventFlags::IN;
        }
        if !pair[i].pending.is_empty() {
            want |= epoll::EventFlags::OUT;
        }
        let s = &mut pair[i];
        if want == s.watched && !want.is_empty() {
            continue;
        }
        let data = epoll::EventData::new_u64(slot as u64 * 2 + i as u64);
        if s.watched.is_empty() && !want.is_empty() {
            epoll::add(ep, &s.stream, data, want)?;
        } else if !want.is_empty() {
            epoll::modify(ep, &s.stream, data, want)?;
        } else if !s.watched.is_empty() {
            epoll::delete(ep, &s.stream)?;
        }
        s.watched = want;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A relay between a client and an echo server on ephemeral ports: bytes both ways, more
    /// than a chunk, and the ends' FINs passed on.
    #[test]
    fn bytes_and_ends_pass_through_both_ways() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let to = server.local_addr().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let listen = listener.local_addr().unwrap();
        std::thread::spawn(move || serve(listener, to));
        let echo = std::thread::spawn(move || {
            let (mut s, _) = server.accept().unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap();
            s.write_all(&got).unwrap();
            got.len()
        });
        let mut client = TcpStream::connect(listen).unwrap();
        let sent: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        client.write_all(&sent).unwrap();
        client.shutdown(Shutdown::Write).unwrap();
        let mut back = Vec::new();
        client.read_to_end(&mut back).unwrap();
        assert_eq!(echo.join().unwrap(), sent.len());
        assert!(back == sent, "{} bytes came back", back.len());
    }
}
