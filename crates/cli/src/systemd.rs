//! systemd's notify protocol (`Type=notify`): ready once listening, reloading and ready again around each SIGHUP, stopping on SIGTERM, the successor's pid after a binary upgrade; nothing when NOTIFY_SOCKET is unset.

use sd_notify::NotifyState;

/// Tell the service manager, if any; a failure only costs a debug line (the proxy runs on).
fn send(states: &[NotifyState<'_>]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    if let Err(e) = sd_notify::notify(states) {
        tracing::debug!("sd_notify: {e}");
    }
}

/// Listening: the service is up.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// A reload begins (with the monotonic time `Type=notify-reload` requires).
pub fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now]),
        Err(_) => send(&[NotifyState::Reloading]),
    }
}

/// The graceful stop begins.
pub fn stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("draining")]);
}

/// A successor (binary upgrade) is the service's main process from now on.
pub fn main_pid(pid: u32) {
    let status = format!("upgraded: pid {pid} serves");
    send(&[
        NotifyState::MainPid(pid),
        NotifyState::Ready,
        NotifyState::Status(&status),
    ]);
}
