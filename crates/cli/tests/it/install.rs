//! What installing Portico on a server relies on: the systemd notify protocol (READY, RELOADING with MONOTONIC_USEC, STOPPING) spoken to a NOTIFY_SOCKET the test binds, shell completions and the man page.

use std::io::BufReader;
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::{announced, BIN};

/// The next datagram on the notify socket, as text.
fn next(sock: &UnixDatagram) -> String {
    let mut buf = [0u8; 4096];
    let n = sock
        .recv(&mut buf)
        .expect("a notification within the timeout");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

fn kill(pid: u32, sig: &str) {
    let st = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(st.success());
}

#[test]
fn the_service_manager_hears_ready_reloading_and_stopping() {
    let dir = std::env::temp_dir().join(format!("portico-notify-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("notify.sock");
    let sock = UnixDatagram::bind(&socket).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let cfg = dir.join("p.toml");
    std::fs::write(
        &cfg,
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\norigin = true\n",
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["run", "--workers", "1", "--config"])
        .arg(&cfg)
        .env("NOTIFY_SOCKET", &socket)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    announced(&mut out, 1);
    let ready = next(&sock);
    assert!(ready.contains("READY=1"), "{ready}");
    assert!(ready.contains("STATUS=serving"), "{ready}");

    kill(child.id(), "HUP");
    let reloading = next(&sock);
    assert!(reloading.contains("RELOADING=1"), "{reloading}");
    let usec: u64 = reloading
        .lines()
        .find_map(|l| l.strip_prefix("MONOTONIC_USEC="))
        .expect("MONOTONIC_USEC with RELOADING")
        .parse()
        .unwrap();
    assert!(usec > 0);
    let again = next(&sock);
    assert!(again.contains("READY=1"), "{again}");
    assert!(again.contains("generation 2"), "{again}");

    kill(child.id(), "TERM");
    let stopping = next(&sock);
    assert!(stopping.contains("STOPPING=1"), "{stopping}");
    assert!(child.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn completions_and_the_man_page_come_from_the_flags() {
    let out = Command::new(BIN)
        .args(["completions", "bash"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let bash = String::from_utf8(out.stdout).unwrap();
    assert!(
        bash.contains("complete -F") && bash.contains("--log-level"),
        "{bash}"
    );
    for shell in ["zsh", "fish"] {
        let out = Command::new(BIN)
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success() && !out.stdout.is_empty(), "{shell}");
    }
    let out = Command::new(BIN)
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
    let out = Command::new(BIN).arg("man").output().unwrap();
    assert!(out.status.success());
    let man = String::from_utf8(out.stdout).unwrap();
    assert!(
        man.starts_with(".ie") || man.contains(".TH portico"),
        "{man}"
    );
    assert!(man.contains("completions") && man.contains("run"), "{man}");
}
