//! Binary upgrades without a refused connection: on SIGUSR2 the running process starts the binary now installed at its path with `--upgrade-from SOCKET`, hands it every listening socket, and drains once the successor says it serves.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long the successor gets to connect, and then to start serving.
const CONNECT_WITHIN: Duration = Duration::from_secs(30);
const READY_WITHIN: Duration = Duration::from_secs(60);

/// The flag that makes `portico run` take its sockets from a predecessor.
pub const FLAG: &str = "--upgrade-from";

/// The binary at this process's path now (after a package upgrade, the new one): the kernel
/// names a replaced executable `PATH (deleted)`.
fn installed_binary() -> io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let text = exe.to_string_lossy();
    Ok(match text.strip_suffix(" (deleted)") {
        Some(path) => PathBuf::from(path),
        None => exe,
    })
}

/// This process's arguments without an earlier `--upgrade-from SOCKET`.
fn arguments() -> Vec<std::ffi::OsString> {
    let mut out = Vec::new();
    let mut args = std::env::args_os().skip(1);
    while let Some(a) = args.next() {
        if a == FLAG {
            args.next();
        } else if !a.to_string_lossy().starts_with(&format!("{FLAG}=")) {
            out.push(a);
        }
    }
    out
}

/// Start the successor and hand it the sockets; Ok(its pid) once it serves. On any failure, or
/// when `cancel` is set (this process was told to stop), the successor is stopped and this
/// process goes on as before.
pub fn start_successor(
    successor: &portico_proxy::Successor,
    cancel: &AtomicBool,
) -> Result<u32, String> {
    // A directory of our own (0700, made new: an existing one is refused), so no other user can
    // take the socket's place, connect to it or read the sockets it hands out.
    use std::os::unix::fs::DirBuilderExt;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = std::env::temp_dir().join(format!(
        "portico-upgrade-{}-{nanos:08x}",
        std::process::id()
    ));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join("handover.sock");
    let result = UnixListener::bind(&path)
        .map_err(|e| format!("{}: {e}", path.display()))
        .and_then(|listener| run(successor, &listener, &path, cancel));
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir(&dir);
    result
}

fn run(
    successor: &portico_proxy::Successor,
    listener: &UnixListener,
    path: &Path,
    cancel: &AtomicBool,
) -> Result<u32, String> {
    let binary = installed_binary().map_err(|e| format!("which binary to start: {e}"))?;
    let mut child = Command::new(&binary)
        .args(arguments())
        .arg(FLAG)
        .arg(path)
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
    let pid = child.id();
    match hand_over(successor, listener, &mut child, cancel) {
        Ok(()) => Ok(pid),
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(format!(
                "the new process ({} pid {pid}): {e}",
                binary.display()
            ))
        }
    }
}

fn hand_over(
    successor: &portico_proxy::Successor,
    listener: &UnixListener,
    child: &mut Child,
    cancel: &AtomicBool,
) -> Result<(), String> {
    let stopped = || cancel.load(Ordering::Relaxed);
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + CONNECT_WITHIN;
    let mut stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(format!("accept: {e}")),
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("exited ({status}) before taking the sockets"));
        }
        if stopped() {
            return Err("stopped: this process was told to stop".into());
        }
        if Instant::now() > deadline {
            return Err(format!("did not connect within {CONNECT_WITHIN:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    stream
        .set_write_timeout(Some(CONNECT_WITHIN))
        .map_err(|e| e.to_string())?;
    successor
        .hand_over(&mut stream)
        .map_err(|e| format!("sending the sockets: {e}"))?;
    // Wait for "ready" a little at a time, so a stop signal or the successor's exit ends it.
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + READY_WITHIN;
    let mut reader = BufReader::new(&stream);
    let mut line = String::new();
    loop {
        match reader.read_line(&mut line) {
            // A whole line, or the end of the connection (nothing more will come).
            Ok(0) => break,
            Ok(_) if line.ends_with('\n') => break,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(format!("the handover connection: {e}")),
        }
        if stopped() {
            return Err("stopped: this process was told to stop".into());
        }
        if Instant::now() > deadline {
            return Err(format!("did not say it serves within {READY_WITHIN:?}"));
        }
    }
    match line.trim() {
        "ready" => Ok(()),
        "" => Err("did not start serving (it closed the handover connection)".into()),
        other => Err(format!("did not start serving ({other})")),
    }
}

/// The successor's side: take the predecessor's sockets from `path`; the connection, to say
/// "ready" on once serving.
pub fn take_sockets(
    path: &Path,
) -> Result<(portico_proxy::handover::Inherited, UnixStream), String> {
    let mut stream = UnixStream::connect(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let inherited = portico_proxy::handover::receive(&mut stream)
        .map_err(|e| format!("taking the sockets from {}: {e}", path.display()))?;
    Ok((inherited, stream))
}

/// Tell the predecessor this process serves: it stops accepting and drains.
pub fn say_ready(stream: &mut UnixStream) {
    if let Err(e) = stream.write_all(b"ready\n") {
        tracing::warn!("could not tell the previous process to stop: {e}");
    }
}
