//! A binary upgrade under load: SIGUSR2 starts the installed binary, which takes the listening sockets; keep-alive, HTTP/2 and new-connection load measured by `portico bench` across it sees no failed request.

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{announced, BIN};

fn get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn status(admin: SocketAddr) -> serde_json::Value {
    let page = get(admin, "/api/status");
    serde_json::from_str(page.split_once("\r\n\r\n").unwrap().1).unwrap()
}

fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

#[test]
fn a_binary_upgrade_under_load_fails_no_request() {
    let dir = std::env::temp_dir().join(format!("portico-upgrade-it-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut origin = Command::new(BIN)
        .args(["origin", "--listen", "127.0.0.1:0", "--workers", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let up = announced(&mut BufReader::new(origin.stdout.take().unwrap()), 1)[0];
    let cfg = dir.join("p.toml");
    std::fs::write(
        &cfg,
        format!(
            "workers = 2\n[admin]\naddress = \"127.0.0.1:0\"\n[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nproxy = \"o\"\n[upstreams.o]\nservers = [\"{up}\"]\n"
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("err.log")).unwrap();
    let mut old = Command::new(BIN)
        .args(["run", "--config"])
        .arg(&cfg)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut out = BufReader::new(old.stdout.take().unwrap());
    let addrs = announced(&mut out, 2);
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut out, &mut std::io::sink());
    });
    let (proxy, admin) = (addrs[0], addrs[1]);
    let old_pid = status(admin)["pid"].as_u64().unwrap() as u32;
    assert_eq!(old_pid, old.id());

    // Keep-alive HTTP/1.1, HTTP/2 with 4 streams per connection, and a new connection per
    // request, open loop, for 5 s.
    let url = format!("http://{proxy}/bytes/1k");
    let loads = [
        ("h1", vec!["-R", "500", "-c", "8"]),
        ("h2", vec!["--h2", "--streams", "4", "-R", "500", "-c", "2"]),
        ("close", vec!["--close", "-R", "150", "-c", "4"]),
    ];
    let benches: Vec<_> = loads
        .iter()
        .map(|(name, flags)| {
            let json = dir.join(format!("{name}.json"));
            let child = Command::new(BIN)
                .arg("bench")
                .args(flags)
                .args(["-d", "5s", "--json"])
                .arg(&json)
                .arg(&url)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            (*name, json, child)
        })
        .collect();

    // Once the load runs (requests counted), the upgrade.
    let deadline = Instant::now() + Duration::from_secs(20);
    while status(admin)["counters"]["requests"].as_u64().unwrap_or(0) < 500 {
        assert!(
            Instant::now() < deadline,
            "the load never reached the proxy"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let st = Command::new("kill")
        .args(["-USR2", &old.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    // The old process drains and exits by itself; the successor answers on the same addresses.
    let deadline = Instant::now() + Duration::from_secs(40);
    let exit = loop {
        if let Some(exit) = old.try_wait().unwrap() {
            break exit;
        }
        if Instant::now() > deadline {
            let _ = old.kill();
            panic!("the old process did not hand over and drain within 40 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(exit.success(), "{exit:?}");
    let new_pid = status(admin)["pid"].as_u64().unwrap() as u32;
    assert_ne!(new_pid, old_pid);
    assert!(get(proxy, "/bytes/3").ends_with("012"));

    for (name, json, mut child) in benches {
        assert!(child.wait().unwrap().success(), "{name}");
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let req = &r["requests"];
        assert_eq!(req["errors"], 0, "{name}: {req} {}", r["errors"]);
        assert_eq!(req["completed"], req["scheduled"], "{name}: {req}");
        assert_eq!(r["status_classes"]["2xx"], req["completed"], "{name}: {r}");
    }
    // Both processes served part of it.
    let served_new = status(admin)["counters"]["requests"].as_u64().unwrap();
    assert!(served_new > 100, "{served_new}");
    let log = std::fs::read_to_string(dir.join("err.log")).unwrap();
    assert!(
        log.contains("binary upgrade: the new process serves"),
        "{log}"
    );

    let _ = Command::new("kill")
        .args(["-TERM", &new_pid.to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(20);
    while alive(new_pid) {
        assert!(Instant::now() < deadline, "the successor did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = origin.kill();
    let _ = origin.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
