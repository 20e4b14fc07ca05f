//! `--h2` runs against an in-process HTTP/2 server (the h2 crate, h2c and TLS with ALPN h2) on 127.0.0.1.

use crate::run;
use bytes::Bytes;
use portico_bench::{Flags, Report};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What the server saw.
#[derive(Default)]
struct Seen {
    connections: AtomicU64,
    requests: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
}

/// How the server answers.
#[derive(Clone, Copy, PartialEq)]
enum Answer {
    /// `200` with the body `ok`.
    Ok,
    /// Every second request (by arrival) is reset with RST_STREAM(INTERNAL_ERROR); the others get
    /// `200 ok`.
    ResetHalf,
    /// `200 ok` after this many milliseconds.
    Slow(u64),
    /// `200 ok`, and each connection is shut down gracefully (GOAWAY) after this many requests.
    GoAwayAfter(u64),
}

/// Serve one accepted connection (plain or TLS) as HTTP/2.
async fn serve<T>(io: T, answer: Answer, seen: Arc<Seen>)
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let Ok(mut conn) = h2::server::handshake(io).await else {
        return;
    };
    seen.connections.fetch_add(1, Ordering::Relaxed);
    let mut on_this = 0u64;
    while let Some(Ok((_req, mut respond))) = conn.accept().await {
        let n = seen.requests.fetch_add(1, Ordering::Relaxed);
        on_this += 1;
        if answer == Answer::GoAwayAfter(on_this) {
            conn.graceful_shutdown();
        }
        let now = seen.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        seen.max_in_flight.fetch_max(now, Ordering::Relaxed);
        let seen = seen.clone();
        // Answered from another task, after the accept loop has taken what is already there.
        tokio::spawn(async move {
            match answer {
                Answer::Slow(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                _ => tokio::task::yield_now().await,
            }
            seen.in_flight.fetch_sub(1, Ordering::Relaxed);
            if answer == Answer::ResetHalf && n % 2 == 1 {
                respond.send_reset(h2::Reason::INTERNAL_ERROR);
                return;
            }
            let resp = http::Response::builder().status(200).body(()).unwrap();
            if let Ok(mut body) = respond.send_response(resp, false) {
                let _ = body.send_data(Bytes::from_static(b"ok"), true);
            }
        });
    }
}

/// An HTTP/2 server on its own thread: h2c with prior knowledge, or TLS (ALPN `alpn`) when a
/// TLS configuration is given.
fn server(answer: Answer, tls: Option<rustls::ServerConfig>) -> (SocketAddr, Arc<Seen>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    let acceptor = tls.map(|c| tokio_rustls::TlsAcceptor::from(Arc::new(c)));
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let Ok((sock, _)) = l.accept().await else {
                    continue;
                };
                let (acceptor, seen) = (acceptor.clone(), s.clone());
                tokio::spawn(async move {
                    match acceptor {
                        None => serve(sock, answer, seen).await,
                        Some(a) => {
                            if let Ok(t) = a.accept(sock).await {
                                serve(t, answer, seen).await;
                            }
                        }
                    }
                });
            }
        });
    });
    (addr, seen)
}

/// A TLS server configuration for `localhost` (self-signed ECDSA P-256) offering `alpn`.
fn tls_config(alpn: &[u8]) -> rustls::ServerConfig {
    let (cert, key, _) = crate::cert();
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![cert], key)
    .unwrap();
    cfg.alpn_protocols = vec![alpn.to_vec()];
    cfg
}

fn flags(addr: SocketAddr) -> Flags {
    Flags {
        url: format!("http://127.0.0.1:{}/", addr.port()),
        h2: true,
        ..Flags::default()
    }
}

/// Every measured request is in exactly one bucket.
fn accounted(r: &Report) {
    let a = &r.requests;
    assert_eq!(
        a.scheduled,
        a.completed + a.errors + a.in_flight + a.unsent,
        "{a:?}"
    );
    assert_eq!(a.sent, a.completed + a.errors + a.in_flight, "{a:?}");
}

#[test]
fn closed_loop_keeps_the_streams_of_two_connections_busy() {
    let (addr, seen) = server(Answer::Ok, None);
    let r = run(Flags {
        closed: true,
        connections: 2,
        streams: Some(8),
        requests: Some(400),
        ..flags(addr)
    });
    eprintln!("{}", r.summary());
    accounted(&r);
    assert_eq!(r.requests.completed, 400, "{:?}", r.requests);
    assert_eq!(r.status.get("200"), Some(&400), "{:?}", r.status);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(seen.connections.load(Ordering::Relaxed), 2);
    assert_eq!(seen.requests.load(Ordering::Relaxed), 400);
    // The streams really were concurrent (16 in flight at most).
    let max = seen.max_in_flight.load(Ordering::Relaxed);
    assert!((2..=16).contains(&max), "max in flight {max}");
    // Opened before the start: none for the measured requests.
    assert_eq!(r.connections_opened, 0);
    assert_eq!(r.bytes, 800);
    assert_eq!((r.protocol.as_str(), r.streams), ("HTTP/2", Some(8)));
    assert!(
        r.summary()
            .contains("2 connections, HTTP/2, 8 streams per connection"),
        "{}",
        r.summary()
    );
    let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    assert_eq!(json["protocol"], "HTTP/2");
    assert_eq!(json["streams"], 8);
}

#[test]
fn open_loop_sends_the_schedule_and_accounts_for_it() {
    let (addr, seen) = server(Answer::Ok, None);
    let r = run(Flags {
        rate: Some(200.0),
        connections: 2,
        streams: Some(4),
        duration: Some(Duration::from_secs(1)),
        ..flags(addr)
    });
    eprintln!("{}", r.summary());
    accounted(&r);
    assert_eq!(r.requests.scheduled, 200, "{:?}", r.requests);
    assert_eq!(r.requests.completed, 200, "{:?}", r.requests);
    assert_eq!(r.status.get("200"), Some(&200));
    assert_eq!(seen.requests.load(Ordering::Relaxed), 200);
    assert_eq!(seen.connections.load(Ordering::Relaxed), 2);
    assert_eq!(r.mode, "open");
    assert!(r.send_lag.is_some());
}

#[test]
fn open_loop_requests_wait_only_when_every_stream_is_busy() {
    // Responses take 40 ms and one connection is due to send every 25 ms: one stream cannot keep
    // up (every request after the first waits for it), three streams can.
    let (addr, _) = server(Answer::Slow(40), None);
    let f = Flags {
        rate: Some(40.0),
        connections: 1,
        duration: Some(Duration::from_millis(500)),
        ..flags(addr)
    };
    let one = run(Flags {
        streams: Some(1),
        ..f.clone()
    });
    eprintln!("{}", one.summary());
    accounted(&one);
    assert_eq!(one.requests.scheduled, 20);
    // Every request but the first waited; those the run had no time for were never sent.
    assert_eq!(one.queued + 1, one.requests.sent, "{:?}", one.requests);
    assert!(one.requests.unsent > 0, "{:?}", one.requests);
    assert!(one.latency.max_ms > 100.0, "{:?}", one.latency);
    let three = run(Flags {
        streams: Some(3),
        ..f
    });
    eprintln!("{}", three.summary());
    accounted(&three);
    assert_eq!(three.requests.completed, 20, "{:?}", three.requests);
    assert_eq!(three.queued, 0);
    assert!(three.latency.max_ms < 100.0, "{:?}", three.latency);
}

#[test]
fn streams_reset_by_the_server_are_counted_as_errors() {
    let (addr, seen) = server(Answer::ResetHalf, None);
    let r = run(Flags {
        closed: true,
        connections: 1,
        streams: Some(4),
        requests: Some(40),
        ..flags(addr)
    });
    eprintln!("{}", r.summary());
    accounted(&r);
    assert_eq!(r.requests.scheduled, 40);
    assert_eq!(seen.requests.load(Ordering::Relaxed), 40);
    assert_eq!(r.requests.completed, 20, "{:?}", r.requests);
    assert_eq!(r.errors.get("reset"), Some(&20), "{:?}", r.errors);
    // A stream reset does not take the connection down.
    assert_eq!(seen.connections.load(Ordering::Relaxed), 1);
    assert!(r.warnings.iter().any(|w| w.contains("20 errors")));
}

#[test]
fn connections_the_server_ends_are_reopened_and_every_request_counted() {
    let (addr, seen) = server(Answer::GoAwayAfter(10), None);
    let r = run(Flags {
        closed: true,
        connections: 1,
        streams: Some(4),
        requests: Some(100),
        ..flags(addr)
    });
    eprintln!("{}", r.summary());
    accounted(&r);
    assert_eq!(r.requests.scheduled, 100);
    assert_eq!(
        r.requests.in_flight + r.requests.unsent,
        0,
        "{:?}",
        r.requests
    );
    // Streams refused by a GOAWAY are `closed` errors; nothing else goes wrong.
    let closed = r.errors.get("closed").copied().unwrap_or(0);
    assert_eq!(r.requests.errors, closed, "{:?}", r.errors);
    assert_eq!(r.requests.completed + closed, 100);
    assert!(r.requests.completed >= 50, "{:?}", r.requests);
    // One connection before the start, then new ones as the server ends them.
    let opened = seen.connections.load(Ordering::Relaxed);
    assert!(opened >= 5, "{opened} connections");
    assert_eq!(r.connections_opened, opened - 1);
}

#[test]
fn https_negotiates_h2_by_alpn() {
    let (addr, seen) = server(Answer::Ok, Some(tls_config(b"h2")));
    let r = run(Flags {
        url: format!("https://localhost:{}/", addr.port()),
        insecure: true,
        closed: true,
        connections: 2,
        streams: Some(4),
        requests: Some(40),
        ..flags(addr)
    });
    eprintln!("{}", r.summary());
    accounted(&r);
    assert_eq!(r.requests.completed, 40, "{:?}", r.requests);
    assert_eq!(seen.connections.load(Ordering::Relaxed), 2);
    let t = r.tls.expect("an HTTPS run reports TLS");
    assert_eq!(t.setup_handshakes.full + t.setup_handshakes.resumed, 2);

    // A server that does not choose h2: every request fails as a `tls` error.
    let (addr, seen) = server(Answer::Ok, Some(tls_config(b"http/1.1")));
    let r = run(Flags {
        url: format!("https://localhost:{}/", addr.port()),
        insecure: true,
        closed: true,
        connections: 1,
        requests: Some(3),
        ..flags(addr)
    });
    accounted(&r);
    assert_eq!(r.requests.completed, 0);
    assert_eq!(r.errors.get("tls"), Some(&3), "{:?}", r.errors);
    assert_eq!(seen.connections.load(Ordering::Relaxed), 0);
}
