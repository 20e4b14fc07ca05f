//! Listening sockets passed from a running Portico to its successor over a Unix socket (SCM_RIGHTS), or by a service manager (systemd socket activation): the same sockets, backlogs included, go on accepting, so no connection is refused.

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use std::collections::HashMap;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// File descriptors sent per message (the kernel takes at most 253).
const BATCH: usize = 64;
/// Largest manifest accepted.
const MAX_MANIFEST: usize = 1 << 20;

/// What the predecessor listens on: its listeners by name and configured address, each with the
/// sockets of its workers, and its admin listener.
#[derive(Debug, Default)]
pub struct Inherited {
    listeners: HashMap<(String, SocketAddr), Vec<TcpListener>>,
    admin: Option<TcpListener>,
    /// Sockets a service manager passed (systemd socket activation), by the address they are
    /// bound to: a listener configured on that address takes them.
    by_address: HashMap<SocketAddr, Vec<TcpListener>>,
}

/// One listener in the manifest.
#[derive(serde::Serialize, serde::Deserialize)]
struct Entry {
    name: String,
    /// As configured (port 0 stays 0): with the name, what a successor's listener must match.
    configured: SocketAddr,
    sockets: usize,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Manifest {
    version: u32,
    listeners: Vec<Entry>,
    admin: bool,
}

impl Inherited {
    /// The sockets of the listener `name` configured on `configured`, if the predecessor had it.
    pub fn take(&mut self, name: &str, configured: SocketAddr) -> Option<Vec<TcpListener>> {
        self.listeners
            .remove(&(name.to_string(), configured))
            .or_else(|| self.by_address.remove(&configured))
    }

    /// Sockets a service manager passed (systemd's `LISTEN_FDS`), each taken by the listener
    /// configured on its address.
    pub fn activated(sockets: Vec<TcpListener>) -> Inherited {
        let mut by_address: HashMap<SocketAddr, Vec<TcpListener>> = HashMap::new();
        for s in sockets {
            if let Ok(a) = s.local_addr() {
                by_address.entry(a).or_default().push(s);
            }
        }
        Inherited {
            by_address,
            ..Default::default()
        }
    }

    /// The predecessor's admin listener, if it had one on `address` (or any, for port 0).
    pub fn take_admin(&mut self, address: SocketAddr) -> Option<TcpListener> {
        let l = self.admin.take()?;
        let bound = l.local_addr().ok()?;
        let same = bound == address || (address.port() == 0 && bound.ip() == address.ip());
        same.then_some(l)
    }

    /// Listeners the new configuration did not take (closing them here costs nothing: the
    /// predecessor still holds them until it stops).
    pub fn leftover(&self) -> Vec<String> {
        let named = self.listeners.keys().map(|(n, _)| n.clone());
        let passed = self.by_address.keys().map(|a| format!("socket on {a}"));
        named.chain(passed).collect()
    }
}

/// Send every listening socket to the successor on `to`: a length-prefixed JSON manifest, then
/// the descriptors in batches, one byte of data each.
pub fn send(
    to: &mut UnixStream,
    listeners: &[(String, SocketAddr, Vec<BorrowedFd<'_>>)],
    admin: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let manifest = Manifest {
        version: 1,
        listeners: listeners
            .iter()
            .map(|(name, configured, fds)| Entry {
                name: name.clone(),
                configured: *configured,
                sockets: fds.len(),
            })
            .collect(),
        admin: admin.is_some(),
    };
    let text = serde_json::to_vec(&manifest).map_err(io::Error::other)?;
    to.write_all(&(text.len() as u32).to_be_bytes())?;
    to.write_all(&text)?;
    let all: Vec<BorrowedFd<'_>> = listeners
        .iter()
        .flat_map(|(_, _, fds)| fds.iter().copied())
        .chain(admin)
        .collect();
    for batch in all.chunks(BATCH) {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(BATCH))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !control.push(SendAncillaryMessage::ScmRights(batch)) {
            return Err(io::Error::other("file descriptors do not fit the message"));
        }
        rustix::net::sendmsg(
            to.as_fd(),
            &[IoSlice::new(b"F")],
            &mut control,
            SendFlags::empty(),
        )?;
    }
    Ok(())
}

/// Receive the predecessor's sockets from `from` (see [`send`]).
pub fn receive(from: &mut UnixStream) -> io::Result<Inherited> {
    let mut len = [0u8; 4];
    from.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_MANIFEST {
        return Err(io::Error::other("handover manifest too large"));
    }
    let mut text = vec![0u8; len];
    from.read_exact(&mut text)?;
    let manifest: Manifest = serde_json::from_slice(&text).map_err(io::Error::other)?;
    if manifest.version != 1 {
        return Err(io::Error::other(format!(
            "handover version {} is not one this Portico speaks (1)",
            manifest.version
        )));
    }
    let want: usize =
        manifest.listeners.iter().map(|e| e.sockets).sum::<usize>() + usize::from(manifest.admin);
    let mut fds: Vec<OwnedFd> = Vec::with_capacity(want);
    while fds.len() < want {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(BATCH))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let mut byte = [0u8; 1];
        let got = rustix::net::recvmsg(
            from.as_fd(),
            &mut [IoSliceMut::new(&mut byte)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        )?;
        if got.bytes == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("the predecessor sent {} of {want} sockets", fds.len()),
            ));
        }
        for msg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = msg {
                fds.extend(received);
            }
        }
    }
    let mut fds = fds.into_iter();
    let mut inherited = Inherited::default();
    for e in manifest.listeners {
        let sockets: Vec<TcpListener> = fds
            .by_ref()
            .take(e.sockets)
            .map(TcpListener::from)
            .collect();
        inherited.listeners.insert((e.name, e.configured), sockets);
    }
    if manifest.admin {
        inherited.admin = fds.next().map(TcpListener::from);
    }
    Ok(inherited)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn sockets_cross_to_the_other_side_and_keep_accepting() {
        let a = TcpListener::bind("127.0.0.1:0").unwrap();
        let b = TcpListener::bind("127.0.0.1:0").unwrap();
        let admin = TcpListener::bind("127.0.0.1:0").unwrap();
        let (addr_a, addr_admin) = (a.local_addr().unwrap(), admin.local_addr().unwrap());
        let (mut tx, mut rx) = UnixStream::pair().unwrap();
        let configured: SocketAddr = "127.0.0.1:0".parse().unwrap();
        // More sockets than one batch holds.
        let many: Vec<TcpListener> = (0..BATCH + 3)
            .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let sender = std::thread::spawn(move || {
            let list = vec![
                ("p".to_string(), configured, vec![a.as_fd(), b.as_fd()]),
                (
                    "many".to_string(),
                    configured,
                    many.iter().map(|l| l.as_fd()).collect(),
                ),
            ];
            send(&mut tx, &list, Some(admin.as_fd())).unwrap();
        });
        let mut got = receive(&mut rx).unwrap();
        sender.join().unwrap();
        let p = got.take("p", configured).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].local_addr().unwrap(), addr_a);
        assert_eq!(got.take("many", configured).unwrap().len(), BATCH + 3);
        assert!(got.take("p", configured).is_none());
        // The received socket accepts what connects to the original address (the sender's
        // copies are closed by now).
        let c = std::net::TcpStream::connect(addr_a).unwrap();
        let (s, _) = p[0].accept().unwrap();
        assert_eq!(s.peer_addr().unwrap(), c.local_addr().unwrap());
        assert!(got.take_admin("127.0.0.1:9".parse().unwrap()).is_none());
        let mut again = Inherited {
            admin: Some(TcpListener::bind("127.0.0.1:0").unwrap()),
            ..Default::default()
        };
        assert!(again.take_admin(configured).is_some());
        let _ = addr_admin;
    }

    #[test]
    fn a_short_or_garbled_handover_is_an_error() {
        let (mut tx, mut rx) = UnixStream::pair().unwrap();
        tx.write_all(&5u32.to_be_bytes()).unwrap();
        tx.write_all(b"nope!").unwrap();
        assert!(receive(&mut rx).is_err());
        let (mut tx, mut rx) = UnixStream::pair().unwrap();
        let text = br#"{"version":1,"listeners":[{"name":"p","configured":"127.0.0.1:0","sockets":2}],"admin":false}"#;
        tx.write_all(&(text.len() as u32).to_be_bytes()).unwrap();
        tx.write_all(text).unwrap();
        drop(tx);
        let e = receive(&mut rx).unwrap_err();
        assert!(e.to_string().contains("0 of 2"), "{e}");
    }
}
