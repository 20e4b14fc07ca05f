//! `--h3` runs against an in-process HTTP/3 server (quinn and the h3 crate) on 127.0.0.1.

use crate::run;
use bytes::Bytes;
use portico_bench::{Config, Flags};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What the server saw.
#[derive(Default)]
struct Seen {
    connections: AtomicU64,
    requests: AtomicU64,
}

/// An HTTP/3 server on its own thread answering `200 ok` to every request.
fn server() -> (SocketAddr, Arc<Seen>) {
    server_with(256, false)
}

/// [`server`] with a TLS session cache of `sessions` entries, taking 0-RTT data if `early`.
fn server_with(sessions: usize, early: bool) -> (SocketAddr, Arc<Seen>) {
    let (cert, key, _) = crate::cert();
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![cert], key)
    .unwrap();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    tls.session_storage = rustls::server::ServerSessionMemoryCache::new(sessions);
    if early {
        // QUIC's value: the stream limits, not this, bound 0-RTT data.
        tls.max_early_data_size = u32::MAX;
    }
    let quic = quinn::crypto::rustls::QuicServerConfig::try_from(tls).unwrap();
    let config = quinn::ServerConfig::with_crypto(Arc::new(quic));
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = socket.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let endpoint = quinn::Endpoint::new(
                quinn::EndpointConfig::default(),
                Some(config),
                socket,
                Arc::new(quinn::TokioRuntime),
            )
            .unwrap();
            while let Some(incoming) = endpoint.accept().await {
                let s = s.clone();
                tokio::spawn(async move {
                    let Ok(conn) = incoming.await else { return };
                    s.connections.fetch_add(1, Ordering::Relaxed);
                    let Ok(mut h3) =
                        h3::server::Connection::<_, Bytes>::new(h3_quinn::Connection::new(conn))
                            .await
                    else {
                        return;
                    };
                    while let Ok(Some(resolver)) = h3.accept().await {
                        let s = s.clone();
                        tokio::spawn(async move {
                            let Ok((_, mut stream)) = resolver.resolve_request().await else {
                                return;
                            };
                            s.requests.fetch_add(1, Ordering::Relaxed);
                            let resp = http::Response::builder().status(200).body(()).unwrap();
                            let _ = stream.send_response(resp).await;
                            let _ = stream.send_data(Bytes::from_static(b"ok")).await;
                            let _ = stream.finish().await;
                        });
                    }
                });
            }
        });
    });
    (addr, seen)
}

fn flags(addr: SocketAddr) -> Flags {
    Flags {
        url: format!("https://localhost:{}/", addr.port()),
        h3: true,
        insecure: true,
        ..Flags::default()
    }
}

#[test]
fn closed_loop_over_quic_keeps_the_streams_busy() {
    let (addr, seen) = server();
    let r = run(Flags {
        closed: true,
        connections: 2,
        streams: Some(8),
        requests: Some(400),
        ..flags(addr)
    });
    eprintln!("{}", r.summary());
    assert_eq!(r.requests.completed, 400, "{:?}", r.requests);
    assert_eq!(r.status.get("200"), Some(&400), "{:?}", r.status);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(seen.connections.load(Ordering::Relaxed), 2);
    assert_eq!(seen.requests.load(Ordering::Relaxed), 400);
    assert_eq!(r.bytes, 800);
    assert_eq!((r.protocol.as_str(), r.streams), ("HTTP/3", Some(8)));
}

#[test]
fn close_opens_a_quic_connection_per_request() {
    let (addr, seen) = server();
    let r = run(Flags {
        closed: true,
        close: true,
        connections: 2,
        requests: Some(40),
        ..flags(addr)
    });
    eprintln!("{}", r.summary());
    assert_eq!(r.requests.completed, 40, "{:?}", r.requests);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(seen.connections.load(Ordering::Relaxed), 40);
    assert_eq!(r.connections_opened, 40);
}

#[test]
fn h3_needs_https_and_one_stream_per_closing_connection() {
    let plain = Flags {
        url: "http://127.0.0.1:9/".into(),
        h3: true,
        closed: true,
        ..Flags::default()
    };
    let e = Config::from_flags(&plain).unwrap_err().to_string();
    assert!(e.contains("--h3 needs an https:// URL"), "{e}");
    let many = Flags {
        closed: true,
        close: true,
        streams: Some(4),
        ..flags("127.0.0.1:9".parse().unwrap())
    };
    let e = Config::from_flags(&many).unwrap_err().to_string();
    assert!(e.contains("--streams must be 1"), "{e}");
}

#[test]
fn handshakes_are_counted_full_or_resumed() {
    let (addr, _) = server();
    let closing = |resume| Flags {
        closed: true,
        close: true,
        connections: 2,
        requests: Some(30),
        tls_resume: resume,
        ..flags(addr)
    };
    let r = run(closing(true));
    eprintln!("{}", r.summary());
    assert_eq!(r.requests.completed, 30, "{:?}", r.errors);
    let h = r.tls.as_ref().unwrap().handshakes;
    // Each connection's first handshake is full, and each later one resumes its last session.
    assert_eq!(h.full + h.resumed, 30, "{h:?}");
    assert!(h.full <= 4 && h.resumed >= 26, "{h:?}");
    assert_eq!((h.early, h.early_refused), (0, 0), "{h:?}");
    let h = run(closing(false)).tls.unwrap().handshakes;
    assert_eq!((h.full, h.resumed), (30, 0), "{h:?}");
}

#[test]
fn early_data_rides_resumed_sessions_and_refusals_are_sent_again() {
    let early = |addr| Flags {
        closed: true,
        close: true,
        connections: 2,
        requests: Some(30),
        early_data: true,
        ..flags(addr)
    };
    let (addr, seen) = server_with(256, true);
    let r = run(early(addr));
    eprintln!("{}", r.summary());
    assert_eq!(r.requests.completed, 30, "{:?}", r.errors);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let h = r.tls.as_ref().unwrap().handshakes;
    assert!(h.early >= 26 && h.early_refused == 0, "{h:?}");
    assert_eq!(seen.requests.load(Ordering::Relaxed), 30);
    // A server that forgets sessions (one cache entry for two clients) refuses most 0-RTT
    // attempts: those requests go again on a new connection, and none is lost.
    let (addr, seen) = server_with(1, true);
    let r = run(early(addr));
    eprintln!("{}", r.summary());
    assert_eq!(r.requests.completed, 30, "{:?}", r.errors);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let h = r.tls.as_ref().unwrap().handshakes;
    assert!(h.early_refused > 0, "{h:?}");
    assert_eq!(seen.requests.load(Ordering::Relaxed), 30);
}

#[test]
fn requests_complete_through_loss() {
    let (addr, seen) = server();
    let r = run(Flags {
        closed: true,
        connections: 2,
        streams: Some(4),
        requests: Some(200),
        loss: Some(0.05),
        ..flags(addr)
    });
    eprintln!("{}", r.summary());
    assert_eq!(r.requests.completed, 200, "{:?}", r.errors);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(r.loss, Some(0.05));
    assert_eq!(seen.requests.load(Ordering::Relaxed), 200);
    assert!(r.summary().contains("5% of datagrams dropped each way"));
}

#[test]
fn early_data_and_loss_need_h3() {
    let plain = Flags {
        url: "https://localhost:9/".into(),
        closed: true,
        insecure: true,
        ..Flags::default()
    };
    let e = |f: Flags| Config::from_flags(&f).unwrap_err().to_string();
    let msg = e(Flags {
        early_data: true,
        ..plain.clone()
    });
    assert!(msg.contains("--early-data needs --h3"), "{msg}");
    let msg = e(Flags {
        loss: Some(0.01),
        ..plain.clone()
    });
    assert!(msg.contains("--loss needs --h3"), "{msg}");
    let msg = e(Flags {
        early_data: true,
        tls_resume: false,
        closed: true,
        ..flags("127.0.0.1:9".parse().unwrap())
    });
    assert!(msg.contains("--tls-resume on"), "{msg}");
    assert!(portico_bench::config::parse_percent("60%").is_err());
    assert_eq!(portico_bench::config::parse_percent("1%"), Ok(0.01));
    assert_eq!(portico_bench::config::parse_percent("1.1"), Ok(0.011));
}
