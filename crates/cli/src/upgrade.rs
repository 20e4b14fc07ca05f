//! Binary upgrades without a refused connection: on SIGUSR2 the running process starts the binary now installed at its path with `--upgrade-from SOCKET`, hands it every listening socket, and drains once the successor says it serves.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
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

/// Start the successor and hand it the sockets; Ok(its pid) once it serves. On any failure the
/// successor is stopped and this process goes on as before.
pub fn start_successor(successor: &portico_proxy::Successor) -> Result<u32, String> {
    let path = std::env::temp_dir().join(format!("portico-upgrade-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let result = run(successor, &listener, &path);
    let _ = std::fs::remove_file(&path);
    result
}

fn run(
    successor: &portico_proxy::Successor,
    listener: &UnixListener,
    path: &Path,
) -> Result<u32, String> {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
    let binary = installed_binary().map_err(|e| format!("which binary to start: {e}"))?;
    let mut child = Command::new(&binary)
        .args(arguments())
        .arg(FLAG)
        .arg(path)
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
    let pid = child.id();
    match hand_over(successor, listener, &mut child) {
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
) -> Result<(), String> {
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
        if Instant::now() > deadline {
            return Err(format!("did not connect within {CONNECT_WITHIN:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    successor
        .hand_over(&mut stream)
        .map_err(|e| format!("sending the sockets: {e}"))?;
    stream
        .set_read_timeout(Some(READY_WITHIN))
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    match BufReader::new(&stream).read_line(&mut line) {
        Ok(_) if line.trim() == "ready" => Ok(()),
        Ok(_) => Err(format!(
            "did not start serving ({})",
            match line.trim() {
                "" => "it closed the handover connection",
                other => other,
            }
        )),
        Err(e) => Err(format!(
            "did not say it serves within {READY_WITHIN:?}: {e}"
        )),
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
