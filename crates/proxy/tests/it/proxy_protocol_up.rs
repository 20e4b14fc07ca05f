//! PROXY headers sent to upstream servers: each connection starts with one naming its client connection and serves one request, and health checks send a LOCAL one.

use crate::common::{start_toml, T};
use portico_testkit::Client;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What a server that expects PROXY headers saw: the header of each connection, and how many
/// requests came on it.
type Seen = Arc<Mutex<Vec<(Vec<u8>, usize)>>>;

/// A server reading a PROXY header (v1 line, or v2 by its length field) at each connection's
/// start, then answering HTTP/1.1 requests with 200 "ok" on it; written by hand, apart from the
/// proxy's own codec.
fn server() -> (SocketAddr, Seen) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let s = seen.clone();
    std::thread::spawn(move || {
        for stream in l.incoming() {
            let Ok(stream) = stream else { continue };
            let s = s.clone();
            std::thread::spawn(move || {
                stream.set_read_timeout(Some(T)).unwrap();
                let mut w = stream.try_clone().unwrap();
                let mut r = BufReader::new(stream);
                let mut first = [0u8; 1];
                if r.read_exact(&mut first).is_err() {
                    return;
                }
                let header = if first[0] == b'P' {
                    let mut line = vec![b'P'];
                    r.read_until(b'\n', &mut line).unwrap();
                    line
                } else {
                    let mut fixed = vec![first[0]; 1];
                    fixed.resize(16, 0);
                    r.read_exact(&mut fixed[1..]).unwrap();
                    let len = u16::from_be_bytes([fixed[14], fixed[15]]) as usize;
                    let mut rest = vec![0u8; len];
                    r.read_exact(&mut rest).unwrap();
                    fixed.extend_from_slice(&rest);
                    fixed
                };
                let i = {
                    let mut g = s.lock().unwrap();
                    g.push((header, 0));
                    g.len() - 1
                };
                loop {
                    // a request head (no bodies here)
                    let mut line = String::new();
                    loop {
                        line.clear();
                        match r.read_line(&mut line) {
                            Ok(0) | Err(_) => return,
                            Ok(_) if line == "\r\n" => break,
                            Ok(_) => {}
                        }
                    }
                    s.lock().unwrap()[i].1 += 1;
                    if w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

fn get(c: &mut Client) -> u16 {
    c.request(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap()
        .status
}

#[test]
fn each_request_gets_a_new_upstream_connection_named_by_a_v1_header() {
    let (up, seen) = server();
    let p = start_toml(
        &format!(
            "[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nproxy = \"b\"\n\
             [upstreams.b]\nservers = [\"{up}\"]\nproxy_protocol = \"v1\"\n"
        ),
        1,
    );
    let listener = p.addr("p").unwrap();
    let mut a = Client::connect(listener).unwrap();
    let mut b = Client::connect(listener).unwrap();
    let (a_port, b_port) = (
        a.writer.local_addr().unwrap().port(),
        b.writer.local_addr().unwrap().port(),
    );
    for _ in 0..3 {
        assert_eq!(get(&mut a), 200);
        assert_eq!(get(&mut b), 200);
    }
    let seen = seen.lock().unwrap().clone();
    let mut headers: Vec<(String, usize)> = seen
        .iter()
        .map(|(h, n)| (String::from_utf8(h.clone()).unwrap(), *n))
        .collect();
    headers.sort();
    let lp = listener.port();
    let mut want = Vec::new();
    for port in [a_port, b_port] {
        for _ in 0..3 {
            want.push((format!("PROXY TCP4 127.0.0.1 127.0.0.1 {port} {lp}\r\n"), 1));
        }
    }
    want.sort();
    assert_eq!(
        headers, want,
        "a connection per request, never reused: a header names one client"
    );
    p.shutdown();
}

#[test]
fn v2_headers_carry_the_client_and_health_checks_send_local() {
    let (up, seen) = server();
    let p = start_toml(
        &format!(
            "[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nproxy = \"b\"\n\
             [upstreams.b]\nservers = [\"{up}\"]\nproxy_protocol = \"v2\"\n\
             [upstreams.b.health_check]\ntype = \"http\"\npath = \"/health\"\ninterval = \"100ms\"\ntimeout = \"50ms\"\n"
        ),
        1,
    );
    let listener = p.addr("p").unwrap();
    let mut a = Client::connect(listener).unwrap();
    let port = a.writer.local_addr().unwrap().port();
    assert_eq!(get(&mut a), 200);
    let local = b"\r\n\r\n\0\r\nQUIT\n\x20\x00\x00\x00".to_vec();
    let mut proxied = b"\r\n\r\n\0\r\nQUIT\n\x21\x11\x00\x0c".to_vec();
    proxied.extend_from_slice(&[127, 0, 0, 1, 127, 0, 0, 1]);
    proxied.extend_from_slice(&port.to_be_bytes());
    proxied.extend_from_slice(&listener.port().to_be_bytes());
    let deadline = Instant::now() + T;
    loop {
        let seen = seen.lock().unwrap().clone();
        let client = seen.iter().any(|(h, n)| *h == proxied && *n == 1);
        let probes = seen.iter().filter(|(h, n)| *h == local && *n == 1).count();
        let other = seen.iter().any(|(h, _)| *h != local && *h != proxied);
        assert!(!other, "an unexpected header: {seen:?}");
        if client && probes >= 2 {
            break;
        }
        assert!(Instant::now() < deadline, "{seen:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    p.shutdown();
}
