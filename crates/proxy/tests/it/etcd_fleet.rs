//! The fleet view: instances following one etcd key (a real etcd) see each other under `/api/fleet`, `/api/status` and `/metrics`, with the configuration revision each runs and the skew.

use crate::common::wait_for;
use portico_proxy::etcd::EtcdKey;
use portico_proxy::Running;
use portico_testkit::etcd::Etcd;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The document the instances follow: one listener answering `body`, an admin listener.
pub fn document(body: &str) -> String {
    format!(
        "[admin]\naddress = \"127.0.0.1:0\"\n[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\npath = \"/up\"\nproxy = \"u\"\n[[listeners.routes]]\nrespond = {{ status = 200, body = \"{body}\" }}\n[upstreams.u]\nservers = [\"127.0.0.1:9\", \"127.0.0.1:10\"]\n"
    )
}

/// Two in-process instances, `a` and `b`, following `/fleet/config` in `etcd` (which holds
/// `document("one")`), each reloading from the key when its revision changes.
pub fn fleet_of_two(etcd: &Etcd, cache: &std::path::Path) -> Vec<Running> {
    let url = etcd.url("/fleet/config");
    etcd.put("/fleet/config", &document("one"), None);
    let key = EtcdKey::parse(&url).unwrap();
    let revision = key.get().unwrap().unwrap().revision;
    ["a", "b"]
        .iter()
        .map(|name| {
            let cfg = portico_config::parse(&document("one"), &url).unwrap();
            let p = portico_proxy::start(cfg, 1).unwrap();
            let source = key.clone();
            let name_for_source = url.clone();
            p.control().set_source(Box::new(move || {
                let doc = source.get()?.ok_or("the key is gone")?;
                portico_config::parse(&doc.text, &name_for_source).map_err(|e| e.to_string())
            }));
            portico_proxy::etcd::follow(
                p.control(),
                key.clone(),
                revision,
                Duration::from_millis(100),
                name.to_string(),
                cache.join(format!("{name}.toml")),
                None,
            )
            .unwrap();
            p
        })
        .collect()
}

fn admin_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    (status, out.split_once("\r\n\r\n").unwrap().1.to_string())
}

/// `/api/fleet`, or None before the instance first read the fleet.
fn fleet(p: &Running) -> Option<serde_json::Value> {
    let (status, body) = admin_get(p.admin_addr().unwrap(), "/api/fleet");
    match status {
        404 => None,
        _ => {
            assert_eq!(status, 200, "{body}");
            Some(serde_json::from_str(&body).unwrap())
        }
    }
}

#[test]
fn instances_see_the_fleet_its_revisions_and_the_skew() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(dir.path());
    let two = fleet_of_two(&etcd, dir.path());
    // Each reads the fleet when it writes its own status (at start, then every 5 s).
    let view = wait_for("both instances in b's view", || {
        let v = fleet(&two[1])?;
        (v["instances"] == 2).then_some(v)
    });
    assert_eq!(view["not_running_revision"], 0, "{view}");
    assert_eq!(view["error"], serde_json::Value::Null);
    assert_eq!(view["key"], etcd.url("/fleet/config"));
    let names: Vec<&str> = view["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["instance"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["a", "b"]);
    let b = &view["members"][1];
    assert_eq!(
        b["listeners"]["p"],
        two[1].addr("p").unwrap().to_string(),
        "{b}"
    );
    assert_eq!(
        (&b["servers"], &b["servers_usable"]),
        (&2.into(), &2.into())
    );
    let (_, status) = admin_get(two[1].admin_addr().unwrap(), "/api/status");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["fleet"]["instances"], 2);

    // A new document: both apply it and report its revision; an instance that stopped
    // following (its status key left at an old revision) is counted as skewed.
    etcd.put(
        "/fleet/config/status/ghost",
        r#"{"instance":"ghost","version":"0.1.0","revision":1,"ok":true,"requests":7}"#,
        None,
    );
    etcd.put("/fleet/config", &document("two"), None);
    let view = wait_for("the new revision and the ghost in a's view", || {
        let v = fleet(&two[0])?;
        let current = v["members"]
            .as_array()?
            .iter()
            .filter(|m| m["revision"] == v["revision"] && m["ok"] == true)
            .count();
        (v["instances"] == 3 && current == 2).then_some(v)
    });
    assert_eq!(view["not_running_revision"], 1, "{view}");
    let (_, metrics) = admin_get(two[0].admin_addr().unwrap(), "/metrics");
    assert!(
        metrics.contains("\nportico_fleet_instances 3\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("\nportico_fleet_instances_skewed 1\n"),
        "{metrics}"
    );

    // Without etcd, the last view stays, with the error.
    drop(etcd);
    wait_for("the read error in the view", || {
        let v = fleet(&two[0])?;
        v["error"].as_str().map(|_| assert_eq!(v["instances"], 3))
    });
}

#[test]
fn an_instance_without_etcd_has_no_fleet() {
    let cfg = portico_config::parse(&document("x"), "t.toml").unwrap();
    let p = portico_proxy::start(cfg, 1).unwrap();
    let (status, body) = admin_get(p.admin_addr().unwrap(), "/api/fleet");
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("does not come from etcd"), "{body}");
    let (_, metrics) = admin_get(p.admin_addr().unwrap(), "/metrics");
    assert!(!metrics.contains("portico_fleet_instances"));
}

/// Calls etcd served, by gRPC method (its own `/metrics`).
fn etcd_calls(etcd: &Etcd, method: &str) -> u64 {
    let mut s = TcpStream::connect(("127.0.0.1", etcd.client)).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: e\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.lines()
        .filter(|l| {
            l.starts_with("grpc_server_started_total{")
                && l.contains(&format!("grpc_method=\"{method}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// etcd compacted past the key's own revision (other keys kept changing): the follower watches
/// from the revision it read at, not the document's, so it does not read the key over and over.
#[test]
fn a_compacted_history_does_not_spin_the_follower() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(dir.path());
    etcd.put("/fleet/config", &document("one"), None);
    for i in 0..5 {
        etcd.put("/other", &i.to_string(), None);
    }
    let now = etcd.must("/v3/kv/range", r#"{"key":"AA=="}"#);
    let revision: u64 = now
        .split(r#""revision":""#)
        .nth(1)
        .and_then(|r| r.split('"').next())
        .and_then(|r| r.parse().ok())
        .unwrap();
    etcd.must(
        "/v3/kv/compaction",
        &format!(r#"{{"revision":"{revision}"}}"#),
    );
    let key = EtcdKey::parse(&etcd.url("/fleet/config")).unwrap();
    let applied = key.get().unwrap().unwrap().revision;
    let p = portico_proxy::start(portico_config::parse(&document("one"), "t").unwrap(), 1).unwrap();
    let before = etcd_calls(&etcd, "Range");
    portico_proxy::etcd::follow(
        p.control(),
        key,
        applied,
        Duration::from_millis(100),
        "c".into(),
        dir.path().join("c.toml"),
        None,
    )
    .unwrap();
    // The follower runs: its status key is there.
    wait_for("the status key", || etcd.get("/fleet/config/status/c"));
    // A window to count in (a measurement, not a synchronisation): 2 s, within which the
    // status key is written once and the fleet read once; a follower that spun would read
    // the key about 20 times.
    std::thread::sleep(Duration::from_secs(2));
    let reads = etcd_calls(&etcd, "Range") - before;
    assert!((1..=6).contains(&reads), "{reads} reads of etcd in 2 s");
    drop(p);
}
