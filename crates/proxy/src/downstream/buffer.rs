//! Request bodies read whole before a server is picked (`buffer_request`): memory first, then an unnamed temporary file; replayed to each attempt.

use super::{Client, Upload};
use crate::error::ProxyError;
use bytes::{Bytes, BytesMut};
use http::header::HeaderMap;
use portico_config::{RequestBuffer, Route};
use portico_http1::RequestHead;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::rc::Rc;

/// A request body read to its end: its first bytes in memory, the rest in a temporary file,
/// and its trailers.
#[derive(Debug, Default)]
pub(crate) struct Buffered {
    mem: Vec<Bytes>,
    file: Option<File>,
    file_len: u64,
    trailers: Option<HeaderMap>,
}

/// The piece read back from the file at a time.
const FILE_PIECE: usize = 64 * 1024;

impl Buffered {
    /// Bytes that went to the temporary file.
    pub(crate) fn on_disk(&self) -> u64 {
        self.file_len
    }
}

/// Read the whole request body from the client (after `100 Continue` when it waits for one),
/// under the route's `max_body` (413 above it) and the listener's minimum body rate.
pub(crate) async fn read_all<'a, D: Client<'a>>(
    down: &mut D,
    head: &RequestHead,
    route: &Route,
    cfg: &RequestBuffer,
) -> Result<Rc<Buffered>, ProxyError> {
    down.before_upload(head).await?;
    let mut up = down.upload(head, route, true, false);
    let mut b = Buffered::default();
    let mut in_mem = 0u64;
    while let Some(d) = down.body_next(&mut up).await? {
        let n = d.len();
        if in_mem + n as u64 <= cfg.memory && b.file.is_none() {
            in_mem += n as u64;
            b.mem.push(d);
        } else {
            // Written where it is read: a temporary file's writes land in the page cache.
            let f = match &mut b.file {
                Some(f) => f,
                None => b
                    .file
                    .insert(tempfile::tempfile_in(&cfg.directory).map_err(spill_error)?),
            };
            f.write_all(&d).map_err(spill_error)?;
            b.file_len += n as u64;
        }
        down.body_release(n);
    }
    b.trailers = down.body_trailers(&up).await?;
    Ok(Rc::new(b))
}

fn spill_error(e: std::io::Error) -> ProxyError {
    crate::telemetry::logging::log_limited!(warn, "request body buffer: temporary file: {e}");
    ProxyError::Internal("the request body could not be buffered")
}

/// A buffered body being sent to one attempt's server.
#[derive(Debug)]
pub(crate) struct Replay {
    body: Rc<Buffered>,
    /// The next memory piece.
    next: usize,
    /// The next offset in the file.
    file_pos: u64,
}

impl Replay {
    pub(crate) fn new(body: Rc<Buffered>) -> Self {
        Replay {
            body,
            next: 0,
            file_pos: 0,
        }
    }

    /// The next piece of the body, None at its end.
    pub(crate) fn next(&mut self) -> Result<Option<Bytes>, ProxyError> {
        if let Some(b) = self.body.mem.get(self.next) {
            self.next += 1;
            return Ok(Some(b.clone()));
        }
        let Some(f) = &self.body.file else {
            return Ok(None);
        };
        let left = self.body.file_len - self.file_pos;
        if left == 0 {
            return Ok(None);
        }
        let n = left.min(FILE_PIECE as u64) as usize;
        let mut buf = BytesMut::zeroed(n);
        f.read_exact_at(&mut buf, self.file_pos)
            .map_err(spill_error)?;
        self.file_pos += n as u64;
        Ok(Some(buf.freeze()))
    }

    pub(crate) fn trailers(&self) -> Option<HeaderMap> {
        self.body.trailers.clone()
    }
}

impl Upload {
    /// An upload that sends a buffered body (again, for each attempt).
    pub(crate) fn replay(body: Rc<Buffered>) -> Upload {
        Upload::new(super::Kind::Replay(Replay::new(body)))
    }
}
