//! Upstream servers found by DNS: SRV and A answers followed as they change, pools kept for the servers that stay, held names, failed lookups, the admin API and metrics.

use crate::common::{start_toml, wait_for, T};
use portico_testkit::dns::{Mode, Records, Srv, TestDns};
use portico_testkit::{Client, Reply, TestUpstream};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Instant;

fn get(c: &mut Client) -> (u16, String) {
    let r = c
        .request(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        .expect("response");
    (r.status, r.text())
}

fn admin_get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out.split_once("\r\n\r\n").unwrap().1.to_string()
}

fn config(dns: &TestDns, discovery: &str, extra: &str) -> String {
    format!(
        r#"
[admin]
address = "127.0.0.1:0"

[resolver]
nameservers = ["{dns}"]
timeout = "300ms"
min_ttl = "100ms"
max_ttl = "1s"
{extra}

[[listeners]]
name = "p"
address = "127.0.0.1:0"

[[listeners.routes]]
proxy = "app"

[upstreams.app]
discovery = {discovery}
"#,
        dns = dns.addr
    )
}

fn srv(port: u16, target: &str) -> Srv {
    Srv {
        priority: 10,
        weight: 1,
        port,
        target: target.into(),
    }
}

#[test]
fn srv_answers_are_followed_and_the_servers_that_stay_keep_their_connections() {
    let one = TestUpstream::start(|_| Reply::ok("one"));
    let two = TestUpstream::start(|_| Reply::ok("two"));
    let dns = TestDns::start(0);
    let local = Records {
        a: vec![Ipv4Addr::LOCALHOST],
        ..Default::default()
    };
    dns.set("one.test", local.clone());
    dns.set("two.test", local);
    let name = "_http._tcp.app.test.";
    dns.set(
        name,
        Records {
            srv: vec![srv(one.addr.port(), "one.test.")],
            ..Default::default()
        },
    );
    let p = start_toml(&config(&dns, &format!(r#"{{ srv = "{name}" }}"#), ""), 1);
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    // Resolved before the configuration was applied: the first request has its server.
    assert_eq!(get(&mut c), (200, "one".into()));

    dns.set(
        name,
        Records {
            srv: vec![
                srv(one.addr.port(), "one.test."),
                srv(two.addr.port(), "two.test."),
            ],
            ..Default::default()
        },
    );
    wait_for("the second server to take requests", || {
        (get(&mut c).1 == "two").then_some(())
    });
    // Both take turns, and the first server's pooled connection is the one it had.
    let answers: Vec<String> = (0..6).map(|_| get(&mut c).1).collect();
    assert!(
        answers.iter().any(|a| a == "one") && answers.iter().any(|a| a == "two"),
        "{answers:?}"
    );
    assert_eq!(
        one.connection_count(),
        1,
        "the pool of a server that stayed was kept"
    );

    // Only the second server now; priorities: a higher one is a backup, not used.
    dns.set(
        name,
        Records {
            srv: vec![
                srv(two.addr.port(), "two.test."),
                Srv {
                    priority: 20,
                    ..srv(one.addr.port(), "one.test.")
                },
            ],
            ..Default::default()
        },
    );
    wait_for("the first server to leave", || {
        let n = one.requests().len();
        let all_two = (0..4).all(|_| get(&mut c).1 == "two");
        (all_two && one.requests().len() == n).then_some(())
    });
    assert_eq!(
        two.connection_count(),
        1,
        "the pool of a server that stayed was kept"
    );

    // The admin API and the metrics show what was found.
    let a = p.admin_addr().unwrap();
    let v: serde_json::Value = serde_json::from_str(&admin_get(a, "/api/discovery")).unwrap();
    let g = &v["groups"][0];
    assert_eq!(g["group"], "app");
    assert_eq!(g["kind"], "srv");
    assert_eq!(g["name"], name);
    assert_eq!(g["servers"][0]["address"], two.addr.to_string());
    assert_eq!(g["last_result"], "ok");
    assert!(g["ok_total"].as_u64().unwrap() >= 3, "{g}");
    let metrics = admin_get(a, "/metrics");
    let scrape =
        prometheus_parse::Scrape::parse(metrics.lines().map(|l| Ok(l.to_string()))).unwrap();
    let value = |metric: &str, labels: &[(&str, &str)]| {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| match s.value {
                prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Counter(v) => v,
                _ => f64::NAN,
            })
    };
    assert_eq!(
        value("portico_discovery_servers", &[("group", "app")]),
        Some(1.0)
    );
    assert!(
        value(
            "portico_discovery_lookups_total",
            &[("group", "app"), ("result", "ok")]
        )
        .unwrap()
            >= 3.0
    );
    assert!(value(
        "portico_discovery_last_success_timestamp_seconds",
        &[("group", "app")]
    )
    .is_some());
    p.shutdown();
}

/// Two test servers on the same port of two loopback addresses (A records carry no port).
fn pair() -> (TestUpstream, TestUpstream) {
    for _ in 0..20 {
        let Some(a) =
            TestUpstream::start_on(SocketAddr::from(([127, 0, 0, 2], 0)), |_| Reply::ok("a"))
        else {
            continue;
        };
        let at = SocketAddr::from(([127, 0, 0, 3], a.addr.port()));
        if let Some(b) = TestUpstream::start_on(at, |_| Reply::ok("b")) {
            return (a, b);
        }
    }
    panic!("no port free on both 127.0.0.2 and 127.0.0.3");
}

#[test]
fn a_records_failed_lookups_keep_servers_and_a_gone_name_is_held_then_dropped() {
    let (a, _b) = pair();
    let port = a.addr.port();
    let dns = TestDns::start(0);
    // Not in the zone yet: the proxy starts without a server and answers 503.
    let p = start_toml(
        &config(
            &dns,
            &format!(r#"{{ dns = "app.test:{port}", family = "ipv4" }}"#),
            r#"hold = "3s""#,
        ),
        1,
    );
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    assert_eq!(get(&mut c).0, 503);

    let only = |ip: [u8; 4]| Records {
        a: vec![Ipv4Addr::from(ip)],
        ..Default::default()
    };
    dns.set("app.test", only([127, 0, 0, 2]));
    wait_for("the name to appear", || {
        (get(&mut c) == (200, "a".into())).then_some(())
    });
    dns.set("app.test", only([127, 0, 0, 3]));
    wait_for("the address to change", || {
        (get(&mut c) == (200, "b".into())).then_some(())
    });

    // The name server stops answering: the servers found last stay, lookups are counted failed.
    let failed = |p: &portico_proxy::Running| {
        let v: serde_json::Value =
            serde_json::from_str(&admin_get(p.admin_addr().unwrap(), "/api/discovery")).unwrap();
        v["groups"][0]["failed_total"].as_u64().unwrap()
    };
    let before = failed(&p);
    dns.set_mode(Mode::Silent);
    wait_for("a failed lookup", || (failed(&p) > before).then_some(()));
    assert_eq!(get(&mut c), (200, "b".into()));
    dns.set_mode(Mode::ServFail);
    let before = failed(&p);
    wait_for("a SERVFAIL lookup", || (failed(&p) > before).then_some(()));
    assert_eq!(get(&mut c), (200, "b".into()));

    // The name is gone (NXDOMAIN): held for `hold`, then no server.
    dns.set_mode(Mode::Zone);
    let gone = |p: &portico_proxy::Running| {
        let v: serde_json::Value =
            serde_json::from_str(&admin_get(p.admin_addr().unwrap(), "/api/discovery")).unwrap();
        v["groups"][0]["gone_total"].as_u64().unwrap()
    };
    let before = gone(&p);
    dns.remove("app.test");
    let gone_at = Instant::now();
    wait_for("the name to be seen gone", || {
        (gone(&p) > before).then_some(())
    });
    assert_eq!(get(&mut c), (200, "b".into()), "held");
    wait_for("the hold to end", || (get(&mut c).0 == 503).then_some(()));
    assert!(
        gone_at.elapsed() >= std::time::Duration::from_millis(2500),
        "held {:?}",
        gone_at.elapsed()
    );

    // And back.
    dns.set("app.test", only([127, 0, 0, 2]));
    wait_for("the name to come back", || {
        (get(&mut c) == (200, "a".into())).then_some(())
    });
    p.shutdown();
}

#[test]
fn a_reload_that_changes_the_name_asks_it_before_applying() {
    let one = TestUpstream::start(|_| Reply::ok("one"));
    let two = TestUpstream::start(|_| Reply::ok("two"));
    let dns = TestDns::start(300);
    for (name, up) in [("one.test", &one), ("two.test", &two)] {
        dns.set(
            &format!("_http._tcp.{name}"),
            Records {
                srv: vec![srv(up.addr.port(), "host.test.")],
                ..Default::default()
            },
        );
    }
    dns.set(
        "host.test",
        Records {
            a: vec![Ipv4Addr::LOCALHOST],
            ..Default::default()
        },
    );
    let p = start_toml(&config(&dns, r#"{ srv = "_http._tcp.one.test." }"#, ""), 1);
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    assert_eq!(get(&mut c), (200, "one".into()));
    let next = portico_config::parse(
        &config(&dns, r#"{ srv = "_http._tcp.two.test." }"#, ""),
        "test.toml",
    )
    .unwrap();
    p.reload(next).expect("reload");
    // The new name was asked before the new configuration took requests.
    assert_eq!(get(&mut c), (200, "two".into()));
    p.shutdown();
}

#[test]
fn the_admin_apis_changes_of_a_discovered_server_last_while_dns_drops_and_returns_it() {
    let one = TestUpstream::start(|_| Reply::ok("one"));
    let two = TestUpstream::start(|_| Reply::ok("two"));
    let dns = TestDns::start(0);
    dns.set(
        "host.test",
        Records {
            a: vec![Ipv4Addr::LOCALHOST],
            ..Default::default()
        },
    );
    let name = "_http._tcp.app.test.";
    let both = Records {
        srv: vec![
            srv(one.addr.port(), "host.test."),
            srv(two.addr.port(), "host.test."),
        ],
        ..Default::default()
    };
    dns.set(name, both.clone());
    let p = start_toml(&config(&dns, &format!(r#"{{ srv = "{name}" }}"#), ""), 1);
    let a = p.admin_addr().unwrap();
    // The first server is disabled through the admin API: only the second answers.
    let mut s = TcpStream::connect(a).unwrap();
    write!(
        s,
        "POST /api/groups/app/servers/{}/disable HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
        one.addr
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    for _ in 0..4 {
        assert_eq!(get(&mut c), (200, "two".into()));
    }
    // DNS drops it, then gives it back: still disabled.
    dns.set(
        name,
        Records {
            srv: vec![srv(two.addr.port(), "host.test.")],
            ..Default::default()
        },
    );
    let servers = |p: &portico_proxy::Running| {
        let v: serde_json::Value =
            serde_json::from_str(&admin_get(p.admin_addr().unwrap(), "/api/discovery")).unwrap();
        v["groups"][0]["servers"].as_array().unwrap().len()
    };
    wait_for("the first server to leave", || {
        (servers(&p) == 1).then_some(())
    });
    dns.set(name, both);
    wait_for("the first server to come back", || {
        (servers(&p) == 2).then_some(())
    });
    for _ in 0..6 {
        assert_eq!(
            get(&mut c),
            (200, "two".into()),
            "the disabled server stays disabled"
        );
    }
    let changes = admin_get(a, "/api/changes");
    assert!(changes.contains("disabled"), "{changes}");
    p.shutdown();
}

#[test]
fn a_resolver_change_keeps_the_servers_found_while_the_name_servers_do_not_answer() {
    let one = TestUpstream::start(|_| Reply::ok("one"));
    let dns = TestDns::start(0);
    dns.set(
        "host.test",
        Records {
            a: vec![Ipv4Addr::LOCALHOST],
            ..Default::default()
        },
    );
    dns.set(
        "_http._tcp.app.test",
        Records {
            srv: vec![srv(one.addr.port(), "host.test.")],
            ..Default::default()
        },
    );
    let discovery = r#"{ srv = "_http._tcp.app.test" }"#;
    let p = start_toml(&config(&dns, discovery, ""), 1);
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    assert_eq!(get(&mut c), (200, "one".into()));
    dns.set_mode(Mode::Silent);
    // Another hold (the task starts again from the servers found), then another timeout (the
    // name is asked again, gets no answer, and the servers found stay).
    let held = config(&dns, discovery, r#"hold = "5s""#);
    let slower = held.replace(r#"timeout = "300ms""#, r#"timeout = "200ms""#);
    assert_ne!(held, slower);
    for text in [held, slower] {
        let next = portico_config::parse(&text, "test.toml").unwrap();
        p.reload(next).expect("reload");
        assert_eq!(get(&mut c), (200, "one".into()), "after\n{text}");
    }
    p.shutdown();
}

/// Servers registered under an etcd prefix (a real etcd): each registration joins the group,
/// one whose lease ends leaves it, the servers that stay keep their pools, a value that is no
/// address is left out and shown, etcd gone keeps the servers, an empty prefix is held, then
/// the group has none.
#[test]
fn servers_registered_in_etcd_come_and_go_with_their_keys() {
    let dir = tempfile::tempdir().unwrap();
    let mut etcd = portico_testkit::etcd::Etcd::start(dir.path());
    let one = TestUpstream::start(|_| Reply::ok("one"));
    let two = TestUpstream::start(|_| Reply::ok("two"));
    let lease = etcd.grant(60);
    etcd.put("/svc/app/one", &one.addr.to_string(), Some(lease));
    // a key beside the prefix is not under it
    etcd.put("/svc/apple/x", &two.addr.to_string(), None);
    let toml = format!(
        r#"
[admin]
address = "127.0.0.1:0"

[resolver]
hold = "500ms"

[[listeners]]
name = "p"
address = "127.0.0.1:0"

[[listeners.routes]]
proxy = "app"

[upstreams.app]
discovery = {{ etcd = "{}", interval = "100ms" }}
"#,
        etcd.url("/svc/app")
    );
    let p = start_toml(&toml, 1);
    let admin = p.admin_addr().unwrap();
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    // Read before the configuration was applied: the first request has its server.
    assert_eq!(get(&mut c), (200, "one".into()));
    assert!((0..4).all(|_| get(&mut c).1 == "one"));

    etcd.put(
        "/svc/app/two",
        &format!(r#"{{"address": "{}", "weight": 3}}"#, two.addr),
        None,
    );
    etcd.put("/svc/app/bad", "not an address", None);
    wait_for("the second registration to take requests", || {
        (get(&mut c).1 == "two").then_some(())
    });
    let d = wait_for("the left-out registration in the admin API", || {
        let d = admin_get(admin, "/api/discovery");
        d.contains("/svc/app/bad: ").then_some(d)
    });
    let v: serde_json::Value = serde_json::from_str(&d).unwrap();
    assert_eq!(v["groups"][0]["kind"], "etcd");
    let servers = v["groups"][0]["servers"].as_array().unwrap();
    assert_eq!(servers.len(), 2, "{d}");
    let weight_of = |a: SocketAddr| {
        servers
            .iter()
            .find(|s| s["address"] == a.to_string())
            .map(|s| s["weight"].clone())
    };
    assert_eq!(weight_of(two.addr), Some(3.into()));
    assert_eq!(weight_of(one.addr), Some(1.into()));

    // The first server's lease ends: it leaves, and the second keeps its pooled connection.
    etcd.revoke(lease);
    wait_for("the first server to leave", || {
        let n = one.requests().len();
        let all_two = (0..4).all(|_| get(&mut c).1 == "two");
        (all_two && one.requests().len() == n).then_some(())
    });
    assert_eq!(
        two.connection_count(),
        1,
        "the pool of a server that stayed"
    );

    // etcd gone: the servers found last stay.
    etcd.stop();
    wait_for("the failed read in the admin API", || {
        let v: serde_json::Value =
            serde_json::from_str(&admin_get(admin, "/api/discovery")).unwrap();
        let last = v["groups"][0]["last_result"].as_str().unwrap_or("");
        last.starts_with("failed: etcd").then_some(())
    });
    assert_eq!(get(&mut c), (200, "two".into()));

    // Back, and every registration gone: held for the resolver's hold, then no server.
    etcd.restart();
    // the hold starts at the first delete at the earliest (`bad` alone is nothing usable)
    let gone = Instant::now();
    etcd.delete("/svc/app/two");
    etcd.delete("/svc/app/bad");
    wait_for("the group to have no server", || {
        (get(&mut c).0 != 200).then_some(())
    });
    assert!(
        gone.elapsed() >= std::time::Duration::from_millis(400),
        "held for the hold: {:?}",
        gone.elapsed()
    );
    let d = admin_get(admin, "/api/discovery");
    assert!(d.contains("no server registered"), "{d}");
}

/// A registration arrives by the prefix's watch, long before the next read.
#[test]
fn an_etcd_registration_arrives_by_watch() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = portico_testkit::etcd::Etcd::start(dir.path());
    let one = TestUpstream::start(|_| Reply::ok("one"));
    let two = TestUpstream::start(|_| Reply::ok("two"));
    etcd.put("/w/app/one", &one.addr.to_string(), None);
    let toml = format!(
        "[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nproxy = \"app\"\n[upstreams.app]\ndiscovery = {{ etcd = \"{}\", interval = \"60s\" }}\n",
        etcd.url("/w/app")
    );
    let p = start_toml(&toml, 1);
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    assert_eq!(get(&mut c), (200, "one".into()));
    let put = Instant::now();
    etcd.put("/w/app/two", &two.addr.to_string(), None);
    // the next read would be a minute away: only the watch can bring it within the wait
    wait_for("the second registration by watch", || {
        (get(&mut c).1 == "two").then_some(())
    });
    eprintln!(
        "etcd discovery: a registration took requests {:?} after its write",
        put.elapsed()
    );
    etcd.delete("/w/app/one");
    wait_for("the first server to leave by watch", || {
        let n = one.requests().len();
        let all_two = (0..4).all(|_| get(&mut c).1 == "two");
        (all_two && one.requests().len() == n).then_some(())
    });
}

/// Registrations in an etcd that asks for TLS client certificates (`etcds://` and `[etcd]`):
/// read and watched over TLS; without a client certificate, or with an untrusted CA, refused.
#[test]
fn etcd_over_tls_with_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.clone().self_signed(&ca_key).unwrap();
    let leaf = |names: Vec<String>, client: bool, file: &str| {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(names).unwrap();
        if client {
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, "portico");
            params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        }
        let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
        std::fs::write(d.join(format!("{file}.pem")), cert.pem()).unwrap();
        std::fs::write(d.join(format!("{file}.key")), key.serialize_pem()).unwrap();
    };
    std::fs::write(d.join("ca.pem"), ca.pem()).unwrap();
    // another CA, which signed nothing here
    let other_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let other = ca_params.self_signed(&other_key).unwrap();
    std::fs::write(d.join("other-ca.pem"), other.pem()).unwrap();
    leaf(vec!["127.0.0.1".into()], false, "server");
    leaf(Vec::new(), true, "client");
    let etcd = portico_testkit::etcd::Etcd::start_tls(
        d,
        &portico_testkit::etcd::EtcdTls {
            cert: d.join("server.pem"),
            key: d.join("server.key"),
            client_ca: d.join("ca.pem"),
        },
    );
    let one = TestUpstream::start(|_| Reply::ok("one"));
    let two = TestUpstream::start(|_| Reply::ok("two"));
    etcd.put("/tls/app/one", &one.addr.to_string(), None);
    let url = format!("etcds://127.0.0.1:{}/tls/app", etcd.tls_client.unwrap());
    let toml = format!(
        r#"
[etcd]
ca_file = "{ca}"
certificate = {{ cert = "{cert}", key = "{key}" }}

[[listeners]]
name = "p"
address = "127.0.0.1:0"

[[listeners.routes]]
proxy = "app"

[upstreams.app]
discovery = {{ etcd = "{url}", interval = "60s" }}
"#,
        ca = d.join("ca.pem").display(),
        cert = d.join("client.pem").display(),
        key = d.join("client.key").display(),
    );
    let p = start_toml(&toml, 1);
    let mut c = Client::connect(p.addr("p").unwrap()).unwrap();
    assert_eq!(get(&mut c), (200, "one".into()), "read over TLS at start");
    etcd.put("/tls/app/two", &two.addr.to_string(), None);
    wait_for("the second registration by the TLS watch", || {
        (get(&mut c).1 == "two").then_some(())
    });

    // without the client certificate, and trusting another CA: refused
    let bare = portico_config::EtcdClient {
        ca_file: Some(d.join("ca.pem")),
        ..Default::default()
    };
    let e = portico_proxy::etcd::EtcdKey::open(&url, &bare)
        .unwrap()
        .list()
        .unwrap_err();
    // etcd (Go) answers a missing client certificate with a bad_certificate alert
    assert!(e.contains("BadCertificate"), "no client certificate: {e}");
    let untrusting = portico_config::EtcdClient {
        ca_file: Some(d.join("other-ca.pem")),
        ..Default::default()
    };
    let e = portico_proxy::etcd::EtcdKey::open(&url, &untrusting)
        .unwrap()
        .list()
        .unwrap_err();
    assert!(
        e.contains("invalid peer certificate"),
        "an untrusted server: {e}"
    );
    // TLS settings with a plain URL are refused before any call
    let plain = format!("etcd://127.0.0.1:{}/tls/app", etcd.client);
    assert!(portico_proxy::etcd::EtcdKey::open(&plain, &bare)
        .unwrap_err()
        .contains("write etcds://"));
}
