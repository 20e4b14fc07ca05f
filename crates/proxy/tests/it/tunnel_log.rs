//! The access-log line of an HTTP/1.1 upgrade tunnel counts the bytes relayed to the client (the 101 head included), as the HTTP/2 WebSocket tunnel's line counts its DATA.

use crate::common::{until, T};
use portico_proxy::{start, Termination};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[tokio::test]
async fn an_upgrade_tunnel_logs_the_bytes_relayed_to_the_client() {
    // An upstream that accepts the upgrade with "welcome" in the same write, echoes, and says
    // "bye" when the proxy passes on the client's half close.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let switch = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nwelcome";
        if s.write_all(switch).await.is_err() {
            return;
        }
        loop {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if s.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = s.write_all(b"bye").await;
    });
    let dir = std::env::temp_dir().join(format!("portico-tunnel-log-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("access.log");
    let toml = format!(
        "[access_log]\npath = \"{}\"\n[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n\
         [[listeners.routes]]\nproxy = \"b\"\n[upstreams.b]\nservers = [\"{up}\"]\n",
        path.display()
    );
    let cfg = portico_config::parse(&toml, "tunnel-log.toml").unwrap_or_else(|e| panic!("{e}"));
    let p = start(cfg, 1).expect("start");

    let mut s = TcpStream::connect(p.addr("p").unwrap()).await.unwrap();
    s.write_all(
        b"GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    while !got.ends_with(b"welcome") {
        let n = tokio::time::timeout(T, s.read(&mut chunk))
            .await
            .expect("101 in time")
            .unwrap();
        assert!(n > 0, "{}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&chunk[..n]);
    }
    assert!(
        got.starts_with(b"HTTP/1.1 101 "),
        "{}",
        String::from_utf8_lossy(&got)
    );
    let ping = vec![b'x'; 40_000];
    s.write_all(&ping).await.unwrap();
    s.shutdown().await.unwrap();
    tokio::time::timeout(T, s.read_to_end(&mut got))
        .await
        .expect("the tunnel ends in time")
        .unwrap();
    assert!(
        got.ends_with(b"bye"),
        "the echo and the last word came through"
    );

    let stats = p.stats().clone();
    until("the tunnel's record", || {
        stats.terminations(Termination::OK) == 1
    })
    .await;
    let log = || std::fs::read_to_string(&path).unwrap_or_default();
    until("the access-log line", || log().lines().count() == 1).await;
    let line = log();
    // Every byte the client read: the 101 head, "welcome", the 40,000 echoed, "bye".
    let want = format!("\"GET /ws HTTP/1.1\" 101 {} ", got.len());
    assert!(line.contains(&want), "{want} in {line}");
    assert!(got.len() > 40_000 + 10);
    let _ = std::fs::remove_dir_all(&dir);
}
