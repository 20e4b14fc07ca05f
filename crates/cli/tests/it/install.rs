//! What installing Portico on a server relies on: the systemd notify protocol (READY, RELOADING with MONOTONIC_USEC, STOPPING) spoken to a NOTIFY_SOCKET the test binds, socket activation through systemd-socket-activate, shell completions and the man page.

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

#[test]
fn a_socket_systemd_passes_is_the_listeners() {
    // systemd-socket-activate (the systemd package; scripts/test.sh installs it) listens, and
    // execs Portico with the socket as fd 3 (LISTEN_FDS=1) once a client connects.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = std::env::temp_dir().join(format!("portico-activate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("p.toml");
    std::fs::write(
        &cfg,
        format!("workers = 2\n[[listeners]]\nname = \"web\"\naddress = \"127.0.0.1:{port}\"\n[[listeners.routes]]\norigin = true\n"),
    )
    .unwrap();
    let mut child = Command::new("systemd-socket-activate")
        .arg("-l")
        .arg(format!("127.0.0.1:{port}"))
        .arg(BIN)
        .args(["run", "--config"])
        .arg(&cfg)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("systemd-socket-activate (Debian's systemd package)");
    // Connecting starts Portico, which answers on the socket it was given: the first request
    // waited in the backlog, no connection was refused.
    let answer = |n: usize| {
        let mut s = loop {
            match std::net::TcpStream::connect(("127.0.0.1", port)) {
                Ok(s) => break s,
                // The activator may not listen yet.
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        std::io::Write::write_all(
            &mut s,
            format!("GET /bytes/{n} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .unwrap();
        let mut out = String::new();
        std::io::Read::read_to_string(&mut s, &mut out).unwrap();
        out
    };
    assert!(answer(5).ends_with("\r\n\r\n01234"));
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let addr = announced(&mut out, 1)[0];
    assert_eq!(addr.port(), port);
    for _ in 0..4 {
        assert!(answer(3).ends_with("012"));
    }
    kill(child.id(), "TERM");
    assert!(child.wait().unwrap().success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("listening sockets from systemd"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
