//! What the generator's HTTP/2 and HTTP/3 connections share: one benchmark connection's current session (opened on demand by one of its waiting streams, numbered, forgotten after a failure) and the retry of requests the server did not process.

use crate::conn::{ErrorKind, Opened, Response};
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::rc::Rc;

/// How one stream failed.
pub(crate) enum Failure {
    /// The server did not process it (its GOAWAY came first, or it refused the stream).
    Unprocessed,
    Other(ErrorKind),
}

impl Failure {
    fn kind(&self) -> ErrorKind {
        match self {
            Failure::Unprocessed => ErrorKind::Closed,
            Failure::Other(k) => *k,
        }
    }
}

/// A new session: the handle streams are opened with, a flag its driver task clears when it
/// ends, and what opening it did (for the connection and handshake counts: an [`Opened`], or
/// what tells it once the handshake completes).
pub(crate) type Opening<S, O = Opened> = (S, Rc<Cell<bool>>, O);

/// An open session.
struct Current<S> {
    handle: S,
    /// Cleared when its driver ends.
    alive: Rc<Cell<bool>>,
    /// Which session of this connection it is (streams of an older one must not forget a newer
    /// one when they fail late).
    number: u64,
}

/// The current session of one benchmark connection, shared by its stream tasks (one thread's
/// runtime).
pub(crate) struct Sessions<S, O = Opened> {
    current: RefCell<Option<Current<S>>>,
    /// Held while connecting, so that the streams waiting for a session share one.
    connecting: tokio::sync::Mutex<()>,
    /// Sessions opened and not yet collected by [`Sessions::take_opened`].
    opened: RefCell<Vec<O>>,
    /// Sessions opened so far.
    count: Cell<u64>,
}

impl<S: Clone, O> Sessions<S, O> {
    pub(crate) fn new() -> Self {
        Sessions {
            current: RefCell::new(None),
            connecting: tokio::sync::Mutex::new(()),
            opened: RefCell::new(Vec::new()),
            count: Cell::new(0),
        }
    }

    /// A session opened since the last call, if any.
    pub(crate) fn take_opened(&self) -> Option<O> {
        self.opened.borrow_mut().pop()
    }

    /// The first session opened since the last call whose record `pick` takes, if any.
    pub(crate) fn take_first(&self, pick: impl Fn(&O) -> bool) -> Option<O> {
        let mut opened = self.opened.borrow_mut();
        let at = opened.iter().position(pick)?;
        Some(opened.remove(at))
    }

    /// The current session's handle and number, if it is still up.
    pub(crate) fn live(&self) -> Option<(S, u64)> {
        let c = self.current.borrow();
        c.as_ref()
            .filter(|c| c.alive.get())
            .map(|c| (c.handle.clone(), c.number))
    }

    /// Forget session `number` (it failed), unless a newer one replaced it already: the next
    /// request opens a new one.
    fn forget(&self, number: u64) {
        let mut c = self.current.borrow_mut();
        if c.as_ref().is_some_and(|c| c.number == number) {
            c.take();
        }
    }

    /// Take the current session out (to close it).
    pub(crate) fn take(&self) -> Option<S> {
        self.current.borrow_mut().take().map(|c| c.handle)
    }

    /// The current session, or a new one from `open` when there is none (must run on a
    /// `LocalSet`: sessions' drivers are local tasks).
    pub(crate) async fn get<F>(&self, open: impl FnOnce() -> F) -> Result<(S, u64), ErrorKind>
    where
        F: Future<Output = Result<Opening<S, O>, ErrorKind>>,
    {
        if let Some(s) = self.live() {
            return Ok(s);
        }
        let _one_at_a_time = self.connecting.lock().await;
        if let Some(s) = self.live() {
            return Ok(s);
        }
        let (handle, alive, opened) = open().await?;
        let number = self.count.get() + 1;
        self.count.set(number);
        *self.current.borrow_mut() = Some(Current {
            handle: handle.clone(),
            alive,
            number,
        });
        self.opened.borrow_mut().push(opened);
        Ok((handle, number))
    }

    /// One request through `once` on the current session (opened with `open` if needed). A
    /// request the server did not process is sent again on a new session, at most twice, as
    /// browsers do (its latency includes the retry); a failure of the session, not only of
    /// the stream, has the next request open a new one.
    pub(crate) async fn exchange<F, G>(
        &self,
        open: impl Fn() -> F,
        once: impl Fn(S) -> G,
    ) -> Result<Response, ErrorKind>
    where
        F: Future<Output = Result<Opening<S, O>, ErrorKind>>,
        G: Future<Output = Result<Response, Failure>>,
    {
        let mut tries = 0;
        loop {
            let (handle, number) = self.get(&open).await?;
            match once(handle).await {
                Ok(r) => return Ok(r),
                Err(Failure::Unprocessed) if tries < 2 => {
                    tries += 1;
                    self.forget(number);
                }
                Err(f) => {
                    let kind = f.kind();
                    if !matches!(kind, ErrorKind::Reset | ErrorKind::BadResponse) {
                        self.forget(number);
                    }
                    return Err(kind);
                }
            }
        }
    }
}
