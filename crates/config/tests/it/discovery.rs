//! `[resolver]` and upstream groups' `discovery`: what is accepted, the defaults, and each refusal at its value.

use portico_config::{parse, AddressFamily, DiscoverySource, Resolver};
use std::time::Duration;

const ROUTE: &str =
    "[[listeners]]\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nproxy = \"app\"\n";

fn err(text: &str) -> String {
    match parse(text, "t.toml") {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_group_may_have_only_a_discovery_and_the_defaults_hold() {
    let text = format!("[upstreams.app]\ndiscovery = {{ dns = \"app.internal.:8080\" }}\n{ROUTE}");
    let c = parse(&text, "t.toml").unwrap();
    let g = &c.upstreams[0];
    assert!(g.servers.is_empty());
    let d = g.discovery.as_ref().unwrap();
    assert_eq!(
        d.source,
        DiscoverySource::Dns {
            name: "app.internal.".into(),
            port: 8080
        }
    );
    assert_eq!(d.family, AddressFamily::Any);
    assert_eq!(d.weight, 1);
    assert_eq!(c.resolver, Resolver::DEFAULT);
    let explained = portico_config::explain(&c);
    assert!(
        explained.contains("discovery: A and AAAA records of app.internal. on port 8080"),
        "{explained}"
    );
}

#[test]
fn srv_servers_and_resolver_settings() {
    let text = format!(
        "[resolver]\nnameservers = [\"10.0.0.2\", \"127.0.0.1:5353\", \"[::1]:53\"]\ntimeout = \"500ms\"\nmin_ttl = \"5s\"\nmax_ttl = \"10m\"\nhold = \"0s\"\n\
         [upstreams.app]\nservers = [\"127.0.0.1:9001\"]\n[upstreams.app.discovery]\nsrv = \"_http._tcp.app.internal\"\nfamily = \"ipv6\"\n{ROUTE}"
    );
    let c = parse(&text, "t.toml").unwrap();
    let r = &c.resolver;
    let ns: Vec<String> = r.nameservers.iter().map(|a| a.to_string()).collect();
    assert_eq!(ns, ["10.0.0.2:53", "127.0.0.1:5353", "[::1]:53"]);
    assert_eq!(r.timeout, Duration::from_millis(500));
    assert_eq!(r.min_ttl, Duration::from_secs(5));
    assert_eq!(r.max_ttl, Duration::from_secs(600));
    assert_eq!(r.hold, Duration::ZERO);
    let g = &c.upstreams[0];
    assert_eq!(
        g.servers.len(),
        1,
        "listed servers stay beside the discovered ones"
    );
    let d = g.discovery.as_ref().unwrap();
    assert_eq!(
        d.source,
        DiscoverySource::Srv {
            name: "_http._tcp.app.internal".into()
        }
    );
    assert_eq!(d.family, AddressFamily::Ipv6);
}

#[test]
fn refusals_name_the_key_and_the_value() {
    let group = |d: &str| format!("[upstreams.app]\ndiscovery = {d}\n{ROUTE}");
    assert_eq!(
        err(&group("{ dns = \"app.internal\" }")),
        "t.toml:2:21: upstreams.app.discovery.dns: \"app.internal\" has no port: write it as NAME:PORT, e.g. \"app.internal.:8080\""
    );
    assert_eq!(
        err(&group("{ dns = \"10.0.0.1:80\" }")),
        "t.toml:2:21: upstreams.app.discovery.dns: \"10.0.0.1:80\" is an IP address: list it in `servers` instead"
    );
    assert_eq!(
        err(&group("{ dns = \"app..internal:80\" }")),
        "t.toml:2:21: upstreams.app.discovery.dns: invalid DNS name \"app..internal\": each dot-separated label is 1 to 63 letters, digits, '-' or '_'"
    );
    assert_eq!(
        err(&group("{ dns = \"app:0\" }")),
        "t.toml:2:21: upstreams.app.discovery.dns: invalid port \"0\": expected 1-65535"
    );
    assert_eq!(
        err(&group("{ dns = \"a:1\", srv = \"_x._tcp.a\" }")),
        "t.toml:2:34: upstreams.app.discovery.srv: a discovery has one of `dns`, `srv` or `etcd`"
    );
    assert!(err(&group("{ family = \"any\" }")).starts_with(
        "t.toml:2:13: upstreams.app.discovery: discovery needs `dns = \"NAME:PORT\"`"
    ));
    assert_eq!(
        err(&group("{ srv = \"_x._tcp.a\", weight = 3 }")),
        "t.toml:2:43: upstreams.app.discovery.weight: SRV records carry each server's weight; `weight` is for `dns`"
    );
    assert_eq!(
        err(&group("{ dns = \"a:1\", family = \"inet\" }")),
        "t.toml:2:37: upstreams.app.discovery.family: unknown family \"inet\": use \"any\", \"ipv4\" or \"ipv6\""
    );
    assert!(err(&group("{ dns = \"a:1\", port = 2 }"))
        .contains("upstreams.app.discovery.port: unknown field `port`"));
    let resolver =
        |r: &str| format!("[resolver]\n{r}\n[upstreams.app]\nservers = [\"127.0.0.1:1\"]\n{ROUTE}");
    assert_eq!(
        err(&resolver("nameservers = [\"ns1.example\"]")),
        "t.toml:2:16: resolver.nameservers[0]: invalid name server \"ns1.example\": expected an IP address, with a port if not 53 (\"10.0.0.2\", \"127.0.0.1:5353\", \"[::1]:53\")"
    );
    assert_eq!(
        err(&resolver("nameservers = []")),
        "t.toml:2:15: resolver.nameservers: list at least one name server, or leave `nameservers` out to use the system's"
    );
    assert_eq!(
        err(&resolver("min_ttl = \"2m\"\nmax_ttl = \"1m\"")),
        "t.toml:2:11: resolver.min_ttl: min_ttl (120s) is above max_ttl (60s)"
    );
    assert!(err(&group("{ dns = \"[::1]:80\" }"))
        .ends_with("is an IP address: list it in `servers` instead"));
    assert!(err(&group("{ dns = \"::1\" }"))
        .ends_with("is an IP address: list it in `servers` instead"));
    assert_eq!(
        err(&resolver("max_ttl = \"500ms\"")),
        "t.toml:2:11: resolver.max_ttl: min_ttl (1s) is above max_ttl (500ms)"
    );
    assert_eq!(
        err(&resolver("timeout = \"31s\"")),
        "t.toml:2:11: resolver.timeout: at most 30s"
    );
    assert_eq!(
        err(&resolver("timeout = \"0s\"")),
        "t.toml:2:11: resolver.timeout: must be greater than zero"
    );
    assert_eq!(
        err(&resolver("hold = \"25h\"")),
        "t.toml:2:8: resolver.hold: at most 1 day (\"24h\")"
    );
}

#[test]
fn etcd_prefixes_their_interval_and_refusals() {
    let group = |d: &str| format!("[upstreams.app]\ndiscovery = {d}\n{ROUTE}");
    let c = parse(
        &group("{ etcd = \"etcd://10.0.0.5/services/app\", weight = 2 }"),
        "t.toml",
    )
    .unwrap();
    let d = c.upstreams[0].discovery.as_ref().unwrap();
    match &d.source {
        DiscoverySource::Etcd {
            url,
            name,
            interval,
            client,
        } => {
            assert_eq!(*client, portico_config::EtcdClient::default());
            assert!(!url.tls);
            assert_eq!((url.host.as_str(), url.port), ("10.0.0.5", 2379));
            assert_eq!(url.key, "/services/app");
            assert_eq!(name, "etcd://10.0.0.5:2379/services/app");
            assert_eq!(*interval, Duration::from_secs(5));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(d.weight, 2);
    let c = parse(
        &group("{ etcd = \"etcd://[::1]:2380/s\", interval = \"250ms\" }"),
        "t.toml",
    )
    .unwrap();
    assert!(matches!(
        &c.upstreams[0].discovery.as_ref().unwrap().source,
        DiscoverySource::Etcd { interval, name, .. }
            if *interval == Duration::from_millis(250) && name == "etcd://[::1]:2380/s"
    ));
    assert_eq!(
        err(&group("{ etcd = \"http://10.0.0.5/s\" }")),
        "t.toml:2:22: upstreams.app.discovery.etcd: \"http://10.0.0.5/s\": expected etcd://HOST:PORT/KEY (etcds:// for TLS), e.g. etcd://127.0.0.1:2379/portico/config"
    );
    assert_eq!(
        err(&group("{ etcd = \"etcd://e/s\", interval = \"50ms\" }")),
        "t.toml:2:47: upstreams.app.discovery.interval: between 100ms and 60s"
    );
    assert_eq!(
        err(&group("{ dns = \"a:1\", interval = \"1s\" }")),
        "t.toml:2:39: upstreams.app.discovery.interval: `interval` is for `etcd` (DNS answers are asked again as their TTL expires)"
    );
    assert_eq!(
        err(&group("{ etcd = \"etcd://e/s\", family = \"ipv4\" }")),
        "t.toml:2:45: upstreams.app.discovery.family: `family` is for DNS names; etcd registrations carry addresses"
    );
    assert_eq!(
        err(&group("{ srv = \"_x._tcp.a\", etcd = \"etcd://e/s\" }")),
        "t.toml:2:41: upstreams.app.discovery.etcd: a discovery has one of `dns`, `srv` or `etcd`"
    );
}

#[test]
fn the_etcd_table_reaches_etcd_over_tls_as_a_user() {
    let text = format!(
        "[etcd]\nca_file = \"/etc/portico/etcd-ca.pem\"\ncertificate = {{ cert = \"c.pem\", key = \"c.key\" }}\nusername = \"portico\"\npassword_file = \"/run/secrets/etcd\"\n[upstreams.app]\ndiscovery = {{ etcd = \"etcds://10.0.0.5/s\" }}\n{ROUTE}"
    );
    let c = parse(&text, "/etc/portico/t.toml").unwrap();
    let e = &c.etcd;
    assert_eq!(
        e.ca_file.as_deref(),
        Some(std::path::Path::new("/etc/portico/etcd-ca.pem"))
    );
    let cert = e.certificate.as_ref().unwrap();
    assert_eq!(
        cert.cert,
        std::path::Path::new("/etc/portico/c.pem"),
        "relative to the file"
    );
    assert_eq!(e.username.as_deref(), Some("portico"));
    match &c.upstreams[0].discovery.as_ref().unwrap().source {
        DiscoverySource::Etcd {
            url, name, client, ..
        } => {
            assert!(url.tls);
            assert_eq!(name, "etcds://10.0.0.5:2379/s");
            assert_eq!(client, e);
        }
        other => panic!("{other:?}"),
    }
    // TLS settings with a plain URL
    let plain = text.replace("etcds://", "etcd://");
    assert_eq!(
        err(&plain),
        "t.toml:7:22: upstreams.app.discovery.etcd: `[etcd]` has a CA or a client certificate, which only TLS uses: write etcds://10.0.0.5/s"
    );
    assert_eq!(
        err(&format!("[etcd]\nusername = \"u\"\n{ROUTE}")),
        "t.toml:2:12: etcd.username: an etcd user needs `password_file`, the file holding its password"
    );
    assert_eq!(
        err(&format!("[etcd]\npassword_file = \"p\"\n{ROUTE}")),
        "t.toml:2:17: etcd.password_file: a password needs `username`, the etcd user it belongs to"
    );
    assert!(err(&format!("[etcd]\nuser = \"u\"\n{ROUTE}")).contains("unknown field `user`"));
}
