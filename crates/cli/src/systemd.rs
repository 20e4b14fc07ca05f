//! systemd: the notify protocol (`Type=notify`: ready once listening, reloading and ready again around each SIGHUP, stopping on SIGTERM, the successor's pid after a binary upgrade; nothing when NOTIFY_SOCKET is unset) and socket activation (LISTEN_FDS).

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

/// The TCP listening sockets systemd passed (socket activation), for the listeners configured
/// on their addresses; None when it passed none. Other kinds of sockets are refused with a
/// warning.
pub fn activated(mut fds: listenfd::ListenFd) -> Option<portico_proxy::handover::Inherited> {
    let mut sockets = Vec::new();
    for i in 0..fds.len() {
        match fds.take_tcp_listener(i) {
            Ok(Some(l)) => sockets.push(l),
            Ok(None) => {}
            Err(e) => tracing::warn!("socket {i} from systemd is not a TCP listener: {e}"),
        }
    }
    if sockets.is_empty() {
        return None;
    }
    let addrs: Vec<String> = sockets
        .iter()
        .filter_map(|s| s.local_addr().ok())
        .map(|a| a.to_string())
        .collect();
    tracing::info!("listening sockets from systemd: {}", addrs.join(", "));
    Some(portico_proxy::handover::Inherited::activated(sockets))
}
