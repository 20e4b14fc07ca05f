//! Reload tests: configuration swapped under live connections, listeners added and removed, load without failures.

use portico_config::Config;
use portico_proxy::{start, ReloadError, Running};
use portico_testkit::{Client, Reply, TestUpstream};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn parse(toml: &str) -> Config {
    portico_config::parse(toml, "test.toml").unwrap_or_else(|e| panic!("config: {e}\n{toml}"))
}

fn fixed(body: &str) -> String {
    format!(
        r#"
drain_timeout = "5s"
[[listeners]]
name = "a"
address = "127.0.0.1:0"
[[listeners.routes]]
respond = {{ status = 200, body = "{body}" }}
"#
    )
}

fn get() -> Vec<u8> {
    b"GET / HTTP/1.1\r\nHost: example.test\r\n\r\n".to_vec()
}

fn body_at(addr: SocketAddr) -> String {
    Client::connect(addr)
        .unwrap()
        .request(&get())
        .unwrap()
        .text()
}

/// Poll `f` until it holds or 5 s pass.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn reload_changes_routes_for_new_and_kept_alive_connections() {
    let p: Running = start(parse(&fixed("one")), 2).unwrap();
    let addr = p.addr("a").unwrap();
    let mut kept = Client::connect(addr).unwrap();
    assert_eq!(kept.request(&get()).unwrap().text(), "one");

    let s = p.reload(parse(&fixed("two"))).unwrap();
    assert_eq!(s.generation, 2);
    assert_eq!(s.kept, vec!["a".to_string()]);
    assert!(s.added.is_empty() && s.removed.is_empty());
    // Same socket (port 0 in the file, the bound port is kept), new behaviour.
    assert_eq!(p.addr("a"), Some(addr));
    assert_eq!(body_at(addr), "two");
    // The kept-alive connection's next request runs on the new snapshot.
    assert_eq!(kept.request(&get()).unwrap().text(), "two");
}

#[test]
fn reload_adds_and_removes_listeners() {
    let p = start(parse(&fixed("one")), 2).unwrap();
    let both = format!(
        "{}\n[[listeners]]\nname = \"b\"\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nrespond = {{ status = 200, body = \"bee\" }}\n",
        fixed("one")
    );
    let s = p.reload(parse(&both)).unwrap();
    assert_eq!(s.added, vec!["b".to_string()]);
    let b = p.addr("b").expect("b bound");
    assert_eq!(body_at(b), "bee");

    // A kept-alive connection on b, idle when b is removed, is closed; b stops accepting.
    let mut idle = Client::connect(b).unwrap();
    assert_eq!(idle.request(&get()).unwrap().text(), "bee");
    let s = p.reload(parse(&fixed("one"))).unwrap();
    assert_eq!(s.removed, vec!["b".to_string()]);
    assert!(p.addr("b").is_none());
    assert!(
        idle.is_closed(),
        "idle connection on a removed listener closes"
    );
    eventually("listener b closed", || TcpStream::connect(b).is_err());
    assert_eq!(body_at(p.addr("a").unwrap()), "one");
}

#[test]
fn failed_reload_changes_nothing() {
    let p = start(parse(&fixed("one")), 2).unwrap();
    let addr = p.addr("a").unwrap();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    // A second listener on a port another process holds (no SO_REUSEPORT there): bind fails.
    let bad = format!(
        "{}\n[[listeners]]\nname = \"b\"\naddress = \"{}\"\n[[listeners.routes]]\nrespond = {{ status = 200, body = \"b\" }}\n",
        fixed("two"),
        taken.local_addr().unwrap()
    );
    let e = p.reload(parse(&bad)).unwrap_err();
    assert!(e.to_string().contains("listener b"), "{e}");
    assert_eq!(body_at(addr), "one");
    assert!(p.addr("b").is_none());

    // Without a configuration source, `Control::reload` says so.
    assert!(matches!(
        p.control().reload("test"),
        Err(ReloadError::NoSource)
    ));
    // An invalid configuration from the source is refused with its message.
    p.control()
        .set_source(Box::new(|| Err("test.toml:3:1: listeners: bad".into())));
    let e = p.control().reload("test").unwrap_err();
    assert!(e.to_string().contains("test.toml:3:1"), "{e}");
    assert_eq!(body_at(addr), "one");
    p.shutdown();
    p.wait();
}

/// Clients on kept-alive and new connections run through several reloads that change the upstream
/// group's settings and a route: not one request fails, and no connection is refused.
#[test]
fn reloads_under_load_lose_nothing() {
    let up1 = TestUpstream::start(|_| Reply::ok("x"));
    let up2 = TestUpstream::start(|_| Reply::ok("y"));
    let cfg = |servers: &str, keepalive: u32| {
        format!(
            r#"
drain_timeout = "5s"
[[listeners]]
name = "p"
address = "127.0.0.1:0"
[[listeners.routes]]
proxy = "b"
[upstreams.b]
servers = [{servers}]
keepalive = {keepalive}
"#
        )
    };
    let one = format!("\"{}\"", up1.addr);
    let two = format!("\"{}\", \"{}\"", up1.addr, up2.addr);
    let p = start(parse(&cfg(&one, 16)), 2).unwrap();
    let addr = p.addr("p").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for i in 0..4 {
        let (stop, ok) = (stop.clone(), ok.clone());
        clients.push(std::thread::spawn(move || -> Result<(), String> {
            let close = i % 2 == 1;
            let req: &[u8] = if close {
                b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
            } else {
                b"GET / HTTP/1.1\r\nHost: t\r\n\r\n"
            };
            let mut c = Client::connect(addr).map_err(|e| format!("connect: {e}"))?;
            let deadline = Instant::now() + Duration::from_secs(20);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                if close {
                    c = Client::connect(addr).map_err(|e| format!("connect: {e}"))?;
                }
                let r = c.request(req).map_err(|e| format!("request: {e}"))?;
                if r.status != 200 {
                    return Err(format!("status {}", r.status));
                }
                ok.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        }));
    }
    for round in 0..6 {
        // Let some requests through on each configuration.
        let before = ok.load(Ordering::Relaxed);
        eventually("progress", || ok.load(Ordering::Relaxed) >= before + 50);
        let next = if round % 2 == 0 {
            cfg(&two, 8)
        } else {
            cfg(&one, 16)
        };
        p.reload(parse(&next)).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap().unwrap();
    }
    assert_eq!(p.stats().connections_refused.load(Ordering::Relaxed), 0);
    assert!(ok.load(Ordering::Relaxed) >= 300);
    // Both servers were used after the reloads that added the second one.
    assert!(up2.connection_count() > 0);
}

#[test]
fn a_port_another_proxy_listens_on_is_refused_not_shared() {
    let first = start(parse(&fixed("one")), 1).unwrap();
    let addr = first.addr("a").unwrap();
    // A second proxy on the same address: both would listen with SO_REUSEPORT and split the
    // traffic between them without a word.
    let text = fixed("two").replace("127.0.0.1:0", &addr.to_string());
    let e = match start(parse(&text), 1) {
        Ok(_) => panic!("a second proxy started on {addr}"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("address in use") && e.contains(&addr.to_string()),
        "{e}"
    );
    // The first one still has the port to itself.
    assert_eq!(body_at(addr), "one");
    // Its own reload may move a listener onto a port it holds (renamed: a new listener).
    let moved = fixed("three")
        .replace("127.0.0.1:0", &addr.to_string())
        .replace("name = \"a\"", "name = \"b\"");
    first.reload(parse(&moved)).unwrap();
    // (A connection the old listener's queue held while it closed may be reset: asked again.)
    let answer = || {
        let c = Client::connect(addr).and_then(|mut c| c.request(&get()));
        c.map(|r| r.text()).unwrap_or_default()
    };
    eventually("the renamed listener answering", || answer() == "three");
}
