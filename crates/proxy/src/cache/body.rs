//! A stored body: bytes in memory, or (from 64 KiB) a file, in memory (memfd) or on the disk tier, that a plain HTTP/1.1 client is sent by `sendfile`.

use bytes::{Bytes, BytesMut};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// Bodies at least this large are kept in a file: a hit on plain HTTP/1.1 is then sent by the
/// kernel from the file, without a copy through the proxy.
pub(crate) const FILE_BODY: usize = 64 * 1024;

/// The most of a file body read at once for a client that cannot be sent the file itself
/// (TLS, HTTP/2, a compressing route).
const READ_CHUNK: u64 = 64 * 1024;

/// A stored response's body.
#[derive(Clone)]
pub(crate) enum Body {
    Mem(Bytes),
    File(Arc<BodyFile>),
}

/// A body in a file: `len` bytes from `offset`.
pub(crate) struct BodyFile {
    pub file: std::fs::File,
    pub offset: u64,
    pub len: u64,
    /// An unnamed file in memory (memfd), counted in full against the memory tier; else a
    /// file of the disk tier (in the page cache).
    pub in_memory: bool,
}

impl Body {
    pub(crate) fn empty() -> Self {
        Body::Mem(Bytes::new())
    }

    pub(crate) fn len(&self) -> u64 {
        match self {
            Body::Mem(b) => b.len() as u64,
            Body::File(f) => f.len,
        }
    }

    /// What the body costs the memory tier: all of its bytes, except for a file of the disk
    /// tier, which costs one [`FILE_BODY`] (so that the open files the memory tier holds stay
    /// bounded by its memory).
    pub(crate) fn weight(&self) -> u64 {
        match self {
            Body::File(f) if !f.in_memory => FILE_BODY as u64,
            b => b.len(),
        }
    }

    /// Bytes `from..to` of the body, at most [`READ_CHUNK`] of them from a file.
    pub(crate) fn read(&self, from: u64, to: u64) -> std::io::Result<Bytes> {
        match self {
            Body::Mem(b) => Ok(b.slice(from as usize..to as usize)),
            Body::File(f) => {
                let n = (to - from).min(READ_CHUNK) as usize;
                let mut buf = BytesMut::zeroed(n);
                f.file.read_exact_at(&mut buf, f.offset + from)?;
                Ok(buf.freeze())
            }
        }
    }

    /// The whole body written to `out`.
    pub(crate) fn write_to(&self, out: &mut impl Write) -> std::io::Result<()> {
        let mut at = 0;
        while at < self.len() {
            let chunk = self.read(at, self.len())?;
            out.write_all(&chunk)?;
            at += chunk.len() as u64;
        }
        Ok(())
    }
}

/// Bytes `from..to` of a stored body, on their way to a client.
pub(crate) struct Part {
    pub body: Body,
    pub from: u64,
    pub to: u64,
}

impl Part {
    pub(crate) fn whole(body: &Body) -> Self {
        Part {
            body: body.clone(),
            from: 0,
            to: body.len(),
        }
    }

    pub(crate) fn none() -> Self {
        Part {
            body: Body::empty(),
            from: 0,
            to: 0,
        }
    }

    pub(crate) fn len(&self) -> u64 {
        self.to - self.from
    }

    /// The next bytes (a file's at most 64 KiB at a time), and whether they are the last;
    /// None when nothing is left.
    pub(crate) fn next(&mut self) -> Option<std::io::Result<(Bytes, bool)>> {
        if self.from >= self.to {
            return None;
        }
        Some(self.body.read(self.from, self.to).map(|d| {
            self.from += d.len() as u64;
            (d, self.from >= self.to)
        }))
    }
}

/// A body being captured as it is relayed: in memory, then in a memory file once it reaches
/// [`FILE_BODY`]; None past the size limit (or when the file failed).
pub(crate) enum Gather {
    Mem(BytesMut),
    File(std::fs::File, u64),
}

impl Gather {
    pub(crate) fn new() -> Self {
        Gather::Mem(BytesMut::new())
    }

    pub(crate) fn len(&self) -> u64 {
        match self {
            Gather::Mem(b) => b.len() as u64,
            Gather::File(_, n) => *n,
        }
    }

    /// `d` appended; false when the memory file could not take it.
    pub(crate) fn push(&mut self, d: &[u8]) -> bool {
        if let Gather::Mem(b) = self {
            if b.len() + d.len() < FILE_BODY {
                b.extend_from_slice(d);
                return true;
            }
            let Ok(mut file) = memory_file() else {
                return false;
            };
            if file.write_all(b).is_err() {
                return false;
            }
            *self = Gather::File(file, b.len() as u64);
        }
        match self {
            Gather::File(f, n) => {
                *n += d.len() as u64;
                f.write_all(d).is_ok()
            }
            Gather::Mem(_) => true,
        }
    }

    pub(crate) fn finish(self) -> Body {
        match self {
            Gather::Mem(b) => Body::Mem(b.freeze()),
            Gather::File(file, len) => Body::File(Arc::new(BodyFile {
                file,
                offset: 0,
                len,
                in_memory: true,
            })),
        }
    }
}

/// An unnamed file in memory, closed on exec.
fn memory_file() -> std::io::Result<std::fs::File> {
    let fd = rustix::fs::memfd_create(c"portico-cache", rustix::fs::MemfdFlags::CLOEXEC)?;
    Ok(std::fs::File::from(fd))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_body_moves_to_a_memory_file_and_reads_back() {
        let mut g = Gather::new();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        for chunk in data.chunks(10_000) {
            assert!(g.push(chunk));
        }
        assert_eq!(g.len(), 200_000);
        let body = g.finish();
        assert!(matches!(&body, Body::File(f) if f.in_memory));
        assert_eq!(body.weight(), 200_000);
        let part = body.read(65_000, 200_000).unwrap();
        assert_eq!(&part[..], &data[65_000..65_000 + 65_536]);
        let mut whole = Vec::new();
        body.write_to(&mut whole).unwrap();
        assert_eq!(whole, data);
        let mut small = Gather::new();
        assert!(small.push(b"abc"));
        assert!(matches!(small.finish(), Body::Mem(b) if &b[..] == b"abc"));
    }
}
