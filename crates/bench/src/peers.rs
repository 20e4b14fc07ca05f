//! `bench compare`: the proxies under test and their fair configurations (one worker, upstream keep-alive, no logging), as text and as files.

use std::path::{Path, PathBuf};

use crate::error::BenchError;

/// A proxy `bench compare` can put between the generator and the origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proxy {
    /// No proxy: the generator talks to the origin (what a proxy costs, by difference).
    Direct,
    /// The floor: `portico bench relay`, a blind TCP relay (what the kernel charges any proxy
    /// for the same bytes; each proxy's own work is what it costs above it).
    Relay,
    Portico,
    Nginx,
    Haproxy,
    Caddy,
    /// A minimal Pingora proxy (`scripts/peers/pingora`), built from crates.io at a pinned
    /// version by `scripts/build-pingora.sh`.
    Pingora,
}

impl Proxy {
    pub const ALL: [Proxy; 7] = [
        Proxy::Direct,
        Proxy::Relay,
        Proxy::Portico,
        Proxy::Nginx,
        Proxy::Haproxy,
        Proxy::Caddy,
        Proxy::Pingora,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Proxy::Direct => "direct",
            Proxy::Relay => "relay",
            Proxy::Portico => "portico",
            Proxy::Nginx => "nginx",
            Proxy::Haproxy => "haproxy",
            Proxy::Caddy => "caddy",
            Proxy::Pingora => "pingora",
        }
    }

    pub fn parse(s: &str) -> Option<Proxy> {
        Proxy::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s.trim()))
    }

    /// The program looked up in PATH (None: nothing to run, or portico itself); Pingora's is
    /// also looked up beside the portico binary, where `scripts/build-pingora.sh` puts it.
    pub fn program(self) -> Option<&'static str> {
        match self {
            Proxy::Direct | Proxy::Relay | Proxy::Portico => None,
            Proxy::Nginx => Some("nginx"),
            Proxy::Haproxy => Some("haproxy"),
            Proxy::Caddy => Some("caddy"),
            Proxy::Pingora => Some("portico-bench-pingora"),
        }
    }

    /// Why it is skipped when its program is not found.
    pub fn not_found(self) -> String {
        match (self, self.program()) {
            (Proxy::Pingora, Some(p)) => format!(
                "{p} is not built (scripts/build-pingora.sh builds it from crates.io beside the \
                 portico binary)"
            ),
            (_, Some(p)) => format!("{p} is not installed (not in PATH)"),
            (_, None) => String::new(),
        }
    }

    /// The arguments printing the program's version (output on stdout or stderr, first line).
    pub fn version_args(self) -> &'static [&'static str] {
        match self {
            Proxy::Direct => &[],
            Proxy::Relay | Proxy::Portico | Proxy::Pingora => &["--version"],
            Proxy::Nginx => &["-v"],
            Proxy::Haproxy => &["-v"],
            Proxy::Caddy => &["version"],
        }
    }

    /// The arguments that print how the program was built, to see whether it can serve HTTP/2
    /// over TLS (None: no need to ask).
    pub fn h2_probe_args(self) -> Option<&'static [&'static str]> {
        match self {
            Proxy::Nginx => Some(&["-V"]),
            Proxy::Haproxy => Some(&["-vv"]),
            Proxy::Direct | Proxy::Relay | Proxy::Portico | Proxy::Caddy | Proxy::Pingora => None,
        }
    }

    /// Whether a build, described by the output of [`Proxy::h2_probe_args`], serves HTTP/2 over
    /// TLS; Err says why not. Direct cannot: the origin speaks plain HTTP/1.1 only.
    pub fn h2_capable(self, build_info: &str) -> Result<(), String> {
        match self {
            Proxy::Direct | Proxy::Relay => Err(self.no_tls().into()),
            Proxy::Portico | Proxy::Caddy | Proxy::Pingora => Ok(()),
            Proxy::Nginx if build_info.contains("http_v2_module") => Ok(()),
            Proxy::Nginx => Err("this nginx was built without http_v2_module".into()),
            Proxy::Haproxy if build_info.contains("mux=H2") => Ok(()),
            Proxy::Haproxy => Err("this haproxy lists no H2 multiplexer (haproxy -vv)".into()),
        }
    }

    /// Whether a build, described by the output of [`Proxy::h2_probe_args`], serves HTTP/3;
    /// Err says why not.
    pub fn h3_capable(self, build_info: &str) -> Result<(), String> {
        match self {
            Proxy::Direct | Proxy::Relay => Err(self.no_tls().into()),
            Proxy::Portico | Proxy::Caddy => Ok(()),
            Proxy::Pingora => Err("Pingora does not serve HTTP/3".into()),
            Proxy::Nginx if build_info.contains("http_v3_module") => Err(
                "this nginx has http_v3_module, but its HTTP/3 configuration is not written here yet"
                    .into(),
            ),
            Proxy::Nginx => Err("this nginx was built without http_v3_module (1.25+ with a QUIC TLS library)".into()),
            Proxy::Haproxy if build_info.contains("+QUIC") => Err(
                "this haproxy has QUIC, but its HTTP/3 configuration is not written here yet".into(),
            ),
            Proxy::Haproxy => Err("this haproxy was built without QUIC (haproxy -vv lists no +QUIC)".into()),
        }
    }

    /// Whether it terminates TLS (HTTPS scenarios run through it).
    pub fn terminates_tls(self) -> bool {
        !matches!(self, Proxy::Direct | Proxy::Relay)
    }

    /// Why HTTPS scenarios skip it.
    pub fn no_tls(self) -> &'static str {
        match self {
            Proxy::Relay => "the relay passes bytes through and the origin speaks plain HTTP only",
            _ => "the origin speaks plain HTTP only",
        }
    }

    /// The configuration file's name.
    pub fn config_name(self) -> &'static str {
        match self {
            Proxy::Direct => "",
            Proxy::Relay => "relay.txt",
            Proxy::Portico => "portico.toml",
            Proxy::Nginx => "nginx.conf",
            Proxy::Haproxy => "haproxy.cfg",
            Proxy::Caddy => "Caddyfile",
            Proxy::Pingora => "pingora.yaml",
        }
    }
}

/// The TLS files a listener uses: certificate chain, key, and both in one file (HAProxy).
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: String,
    pub key: String,
    pub both: String,
}

/// What a proxy's configuration needs: where it listens (plain and, with TLS files, HTTPS), where
/// the origin is, and a directory of its own for temporary files.
#[derive(Debug, Clone)]
pub struct Setup<'a> {
    pub port: u16,
    pub tls_port: Option<u16>,
    pub origin: std::net::SocketAddr,
    pub dir: &'a Path,
    pub tls: Option<&'a TlsFiles>,
    /// Serve HTTP/2 on the TLS listener too (ALPN `h2` before `http/1.1`; clients offering only
    /// `http/1.1` are unaffected).
    pub h2: bool,
    /// Serve HTTP/3 on the TLS listener's port too (UDP).
    pub h3: bool,
}

/// Upstream keep-alive connections of every proxy: at least the requests the generator keeps in
/// flight (`h2-rps-1k`: 10 connections x 100 streams), so no proxy closes and reopens upstream
/// connections between bursts (HAProxy keeps every idle connection by default anyway).
pub const UPSTREAM_KEEPALIVE: u32 = 1024;

/// The configuration text of `proxy` (empty for `direct`). TLS is 1.3 with X25519 only for all
/// (performance.md: newer stacks default to a slower post-quantum hybrid group), session tickets
/// on, the upstream leg plain HTTP/1.1 with keep-alive.
pub fn config(proxy: Proxy, s: &Setup) -> String {
    match proxy {
        Proxy::Direct => String::new(),
        Proxy::Relay => format!(
            "portico bench relay: 127.0.0.1:{} -> {}, one connection there per client \
             connection, no parsing, one thread (epoll)\n",
            s.port, s.origin
        ),
        Proxy::Portico => portico(s),
        Proxy::Nginx => nginx(s),
        Proxy::Haproxy => haproxy(s),
        Proxy::Caddy => caddy(s),
        Proxy::Pingora => pingora(s),
    }
}

fn toml_str(s: &str) -> String {
    format!("{:?}", s)
}

fn portico(s: &Setup) -> String {
    let route = "\n[[listeners.routes]]\nproxy = \"b\"\n";
    let mut t = format!(
        "# portico bench compare: one worker (--workers 1), no access log, upstream keep-alive\n\
         [[listeners]]\nname = \"http\"\naddress = \"127.0.0.1:{}\"\n\n\
         [listeners.limits]\nmax_connections = 100000\n{route}",
        s.port
    );
    if let (Some(port), Some(tls)) = (s.tls_port, s.tls) {
        t.push_str(&format!(
            "\n[[listeners]]\nname = \"https\"\naddress = \"127.0.0.1:{port}\"\n\n\
             [listeners.limits]\nmax_connections = 100000\n\n\
             [listeners.tls]\ncertificates = [{{ cert = {}, key = {} }}]\nversions = \"1.3\"\n\
             groups = [\"X25519\"]\n{}{route}",
            toml_str(&tls.cert),
            toml_str(&tls.key),
            // No Alt-Svc: the other scenarios' responses stay as they are without HTTP/3.
            // 0-RTT on, as Caddy has it, for the scenario that sends requests as 0-RTT data.
            if s.h3 {
                "\n[listeners.http3]\nalt_svc_max_age = \"0s\"\nearly_data = true\n"
            } else {
                ""
            }
        ));
    }
    t.push_str(&format!(
        "\n[upstreams.b]\nservers = [\"{}\"]\nkeepalive = {UPSTREAM_KEEPALIVE}\n",
        s.origin
    ));
    t
}

fn nginx(s: &Setup) -> String {
    let d = s.dir.display();
    let tls = match (s.tls_port, s.tls) {
        (Some(port), Some(tls)) => format!(
            // `listen ... http2` rather than `http2 on` (1.25.1+): Debian 12 has 1.22; newer
            // versions accept it with a deprecation warning.
            "        listen 127.0.0.1:{port} ssl{};\n\
             \x20       ssl_certificate {};\n\
             \x20       ssl_certificate_key {};\n\
             \x20       ssl_protocols TLSv1.3;\n\
             \x20       ssl_ecdh_curve X25519;\n\
             \x20       ssl_session_tickets on;\n\
             \x20       ssl_session_cache shared:S:10m;\n",
            if s.h2 { " http2" } else { "" },
            tls.cert,
            tls.key
        ),
        _ => String::new(),
    };
    format!(
        "# portico bench compare: scripts/bench-compare.py's configuration (performance.md)\n\
         worker_processes 1;\n\
         daemon off;\n\
         pid {d}/nginx.pid;\n\
         error_log {d}/error.log warn;\n\
         events {{ worker_connections 10000; }}\n\
         http {{\n\
         \x20   access_log off;\n\
         \x20   keepalive_requests 1000000;\n\
         \x20   client_body_temp_path {d}/client_body;\n\
         \x20   proxy_temp_path {d}/proxy;\n\
         \x20   fastcgi_temp_path {d}/fastcgi;\n\
         \x20   uwsgi_temp_path {d}/uwsgi;\n\
         \x20   scgi_temp_path {d}/scgi;\n\
         \x20   upstream b {{ server {}; keepalive {UPSTREAM_KEEPALIVE}; }}\n\
         \x20   server {{\n\
         \x20       listen 127.0.0.1:{};\n\
         {tls}\
         \x20       location / {{\n\
         \x20           proxy_http_version 1.1;\n\
         \x20           proxy_set_header Connection \"\";\n\
         \x20           proxy_pass http://b;\n\
         \x20       }}\n\
         \x20   }}\n\
         }}\n",
        s.origin, s.port
    )
}

fn haproxy(s: &Setup) -> String {
    let tls = match (s.tls_port, s.tls) {
        (Some(port), Some(tls)) => format!(
            "    bind 127.0.0.1:{port} ssl crt {} ssl-min-ver TLSv1.3 curves X25519{}\n",
            tls.both,
            if s.h2 { " alpn h2,http/1.1" } else { "" }
        ),
        _ => String::new(),
    };
    format!(
        "# portico bench compare: scripts/bench-compare.py's configuration (performance.md)\n\
         global\n\
         \x20   nbthread 1\n\
         \x20   maxconn 4096\n\
         defaults\n\
         \x20   mode http\n\
         \x20   timeout connect 5s\n\
         \x20   timeout client 60s\n\
         \x20   timeout server 60s\n\
         \x20   option http-keep-alive\n\
         \x20   http-reuse always\n\
         frontend f\n\
         \x20   bind 127.0.0.1:{}\n\
         {tls}\
         \x20   default_backend b\n\
         backend b\n\
         \x20   server s1 {}\n",
        s.port, s.origin
    )
}

fn caddy(s: &Setup) -> String {
    // Go's transport keeps 2 idle connections per host unless told (Caddy sets 32): the same
    // upstream keep-alive as the other proxies, or it opens and closes origin connections
    // under load.
    let proxy = format!(
        "\x20   reverse_proxy {} {{\n\
         \x20       transport http {{\n\
         \x20           keepalive_idle_conns {UPSTREAM_KEEPALIVE}\n\
         \x20           keepalive_idle_conns_per_host {UPSTREAM_KEEPALIVE}\n\
         \x20       }}\n\
         \x20   }}\n",
        s.origin
    );
    let tls = match (s.tls_port, s.tls) {
        (Some(port), Some(tls)) => format!(
            "\nhttps://:{port} {{\n\
             \x20   bind 127.0.0.1\n\
             \x20   tls {} {} {{\n\
             \x20       protocols tls1.3 tls1.3\n\
             \x20       curves x25519\n\
             \x20   }}\n\
             {proxy}\
             }}\n",
            tls.cert, tls.key
        ),
        _ => String::new(),
    };
    format!(
        "# portico bench compare: GOMAXPROCS=1, no admin endpoint, no automatic HTTPS, no access log;\n\
         # sites without a host name, so that any Host (localhost or 127.0.0.1) reaches the proxy\n\
         {{\n\
         \x20   admin off\n\
         \x20   auto_https off\n\
         }}\n\n\
         http://:{} {{\n\
         \x20   bind 127.0.0.1\n\
         {proxy}\
         }}\n{tls}",
        s.port
    )
}

fn pingora(s: &Setup) -> String {
    let d = s.dir.display();
    format!(
        "# portico bench compare: Pingora's server configuration; the listeners, the origin and\n\
         # the certificate are on the command line. One worker thread, upstream keep-alive pool.\n\
         ---\n\
         version: 1\n\
         threads: 1\n\
         pid_file: {d}/pingora.pid\n\
         upgrade_sock: {d}/pingora_upgrade.sock\n\
         upstream_keepalive_pool_size: {UPSTREAM_KEEPALIVE}\n"
    )
}

/// The command line (program and arguments) that runs `proxy` of `s` with its configuration at
/// `config`. `program` is the binary: portico's for portico and the relay, the one found for
/// Pingora (nginx, HAProxy and Caddy run by name, from PATH).
pub fn command(proxy: Proxy, program: &str, config: &Path, s: &Setup) -> Vec<String> {
    let portico = program;
    let c = config.display().to_string();
    let d = s.dir.display().to_string();
    let (listen, to) = (format!("127.0.0.1:{}", s.port), s.origin.to_string());
    let tls_listen = s.tls_port.map(|p| format!("127.0.0.1:{p}"));
    let v: Vec<&str> = match proxy {
        Proxy::Direct => vec![],
        Proxy::Relay => vec![portico, "bench", "relay", "--listen", &listen, "--to", &to],
        Proxy::Portico => vec![portico, "run", "--config", &c, "--workers", "1"],
        Proxy::Nginx => vec!["nginx", "-c", &c, "-p", &d, "-e", "stderr"],
        Proxy::Haproxy => vec!["haproxy", "-f", &c, "-db"],
        Proxy::Caddy => vec!["caddy", "run", "--config", &c, "--adapter", "caddyfile"],
        Proxy::Pingora => {
            let mut v = vec![program, "--conf", &c, "--listen", &listen, "--origin", &to];
            if let (Some(addr), Some(tls)) = (&tls_listen, s.tls) {
                v.extend(["--tls-listen", addr, "--cert", &tls.cert, "--key", &tls.key]);
                if s.h2 {
                    v.push("--h2");
                }
            }
            v
        }
    };
    v.into_iter().map(String::from).collect()
}

/// Creates `s.dir` with the subdirectories the configuration names (nginx's temporary files,
/// Caddy's data and configuration), writes the configuration of `proxy` there under its
/// [`Proxy::config_name`], and returns its path and text.
pub fn write_config(proxy: Proxy, s: &Setup) -> Result<(PathBuf, String), BenchError> {
    let file = |path: &Path| {
        let path = path.to_path_buf();
        move |source| BenchError::File { path, source }
    };
    for sub in [
        "",
        "client_body",
        "proxy",
        "fastcgi",
        "uwsgi",
        "scgi",
        "data",
        "config",
    ] {
        let d = s.dir.join(sub);
        std::fs::create_dir_all(&d).map_err(file(&d))?;
    }
    let text = config(proxy, s);
    let path = s.dir.join(proxy.config_name());
    std::fs::write(&path, &text).map_err(file(&path))?;
    Ok((path, text))
}

/// `portico bench peer PROXY`: one proxy of `bench compare`, configured as it configures it, for
/// measuring it by other means (a profiler, another load generator).
#[derive(clap::Args, Debug, Clone)]
pub struct PeerFlags {
    /// The proxy: relay, portico, nginx, haproxy, caddy or pingora.
    #[arg(value_name = "PROXY")]
    pub proxy: String,
    /// The port it listens on (127.0.0.1, plain HTTP).
    #[arg(long, value_name = "PORT")]
    pub port: u16,
    /// The origin it forwards to.
    #[arg(long, value_name = "ADDR")]
    pub origin: std::net::SocketAddr,
    /// Where its configuration and temporary files go (created if missing).
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
}

/// Writes the configuration of `f.proxy` into `f.dir` and prints the command that runs it, one
/// argument per line (`env NAME=VALUE ...` first when it needs environment variables), as
/// `bench compare` would run it unpinned. `portico` is the binary run for portico and the relay.
pub fn peer(f: &PeerFlags, portico: &str, out: &mut dyn std::io::Write) -> Result<(), BenchError> {
    let proxy = match Proxy::parse(&f.proxy) {
        Some(Proxy::Direct) | None => {
            let names: Vec<_> = Proxy::ALL[1..].iter().map(|p| p.name()).collect();
            return Err(BenchError::Flag(format!(
                "unknown proxy {:?}: one of {}",
                f.proxy,
                names.join(", ")
            )));
        }
        Some(p) => p,
    };
    let dir = std::path::absolute(&f.dir).map_err(|source| BenchError::File {
        path: f.dir.clone(),
        source,
    })?;
    let s = Setup {
        port: f.port,
        tls_port: None,
        origin: f.origin,
        dir: &dir,
        tls: None,
        h2: false,
        h3: false,
    };
    let (path, _) = write_config(proxy, &s)?;
    let found = proxy.program().map(|p| {
        locate(proxy, p, Path::new(portico))
            .map_or_else(|| p.to_string(), |f| f.display().to_string())
    });
    let program = found.as_deref().unwrap_or(portico);
    let env = environment(proxy, &dir);
    let mut args: Vec<String> = Vec::new();
    if !env.is_empty() {
        args.push("env".into());
        args.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    }
    args.extend(command(proxy, program, &path, &s));
    let write = |e: std::io::Error| BenchError::Runtime(format!("cannot print the command: {e}"));
    for a in args {
        writeln!(out, "{a}").map_err(write)?;
    }
    Ok(())
}

/// Where the program of `proxy` is: in PATH, or (Pingora's, which `scripts/build-pingora.sh`
/// builds into the portico binary's target directory) beside `portico`.
pub fn locate(proxy: Proxy, program: &str, portico: &Path) -> Option<PathBuf> {
    in_path(program).or_else(|| {
        let beside = portico.parent()?.join(program);
        (proxy == Proxy::Pingora && beside.is_file()).then_some(beside)
    })
}

/// Whether `program` is an executable in PATH.
pub fn in_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// Environment variables a proxy runs with.
pub fn environment(proxy: Proxy, dir: &Path) -> Vec<(String, String)> {
    match proxy {
        Proxy::Caddy => vec![
            ("GOMAXPROCS".into(), "1".into()),
            // Caddy keeps state under $HOME / XDG dirs: keep it in the run's directory.
            ("HOME".into(), dir.display().to_string()),
            (
                "XDG_DATA_HOME".into(),
                dir.join("data").display().to_string(),
            ),
            (
                "XDG_CONFIG_HOME".into(),
                dir.join("config").display().to_string(),
            ),
        ],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The TLS files of the tests' setups, under /tmp/x.
    fn files() -> TlsFiles {
        TlsFiles {
            cert: "/tmp/x/cert.pem".into(),
            key: "/tmp/x/key.pem".into(),
            both: "/tmp/x/both.pem".into(),
        }
    }

    fn setup<'a>(dir: &'a Path, tls: Option<&'a TlsFiles>) -> Setup<'a> {
        Setup {
            port: 18080,
            tls_port: tls.map(|_| 18443),
            origin: "127.0.0.1:18081".parse().unwrap(),
            dir,
            tls,
            h2: tls.is_some(),
            h3: tls.is_some(),
        }
    }

    #[test]
    fn peer_writes_the_configuration_and_prints_the_command() {
        let dir = std::env::temp_dir().join(format!("portico-peer-test-{}", std::process::id()));
        let f = PeerFlags {
            proxy: "HAProxy".into(),
            port: 18080,
            origin: "127.0.0.1:18081".parse().unwrap(),
            dir: dir.clone(),
        };
        let mut out = Vec::new();
        peer(&f, "/bin/portico", &mut out).unwrap();
        let cfg = dir.join("haproxy.cfg");
        let want = format!("haproxy\n-f\n{}\n-db\n", cfg.display());
        assert_eq!(String::from_utf8(out).unwrap(), want);
        let text = std::fs::read_to_string(&cfg).unwrap();
        assert_eq!(text, config(Proxy::Haproxy, &setup(&dir, None)));
        assert!(
            text.contains("bind 127.0.0.1:18080") && text.contains("server s1 127.0.0.1:18081")
        );

        // Caddy's environment comes first, through env; the relay runs the given binary.
        let mut out = Vec::new();
        peer(
            &PeerFlags {
                proxy: "caddy".into(),
                ..f.clone()
            },
            "/bin/portico",
            &mut out,
        )
        .unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(out.starts_with("env\nGOMAXPROCS=1\n"), "{out}");
        let mut out = Vec::new();
        peer(
            &PeerFlags {
                proxy: "relay".into(),
                ..f.clone()
            },
            "/bin/portico",
            &mut out,
        )
        .unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(
            out.starts_with("/bin/portico\nbench\nrelay\n--listen\n127.0.0.1:18080\n"),
            "{out}"
        );

        for bad in ["direct", "squid"] {
            let e = peer(
                &PeerFlags {
                    proxy: bad.into(),
                    ..f.clone()
                },
                "/bin/portico",
                &mut Vec::new(),
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains("unknown proxy") && e.contains("haproxy"), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn http2_capability_from_build_info() {
        assert!(Proxy::Nginx
            .h2_capable("configure arguments: --with-http_ssl_module --with-http_v2_module")
            .is_ok());
        let e = Proxy::Nginx
            .h2_capable("configure arguments: --with-http_ssl_module")
            .unwrap_err();
        assert!(e.contains("http_v2_module"), "{e}");
        assert!(Proxy::Haproxy
            .h2_capable("  h2 : mode=HTTP  side=FE|BE  mux=H2    flags=HTX")
            .is_ok());
        assert!(Proxy::Haproxy.h2_capable("h1 : mode=HTTP mux=H1").is_err());
        assert!(Proxy::Direct.h2_capable("").is_err());
        assert!(Proxy::Portico.h2_capable("").is_ok() && Proxy::Caddy.h2_capable("").is_ok());
        assert_eq!(Proxy::Caddy.h2_probe_args(), None);
    }

    #[test]
    fn http3_capability_from_build_info() {
        assert!(Proxy::Portico.h3_capable("").is_ok() && Proxy::Caddy.h3_capable("").is_ok());
        let e = Proxy::Nginx
            .h3_capable("configure arguments: --with-http_v2_module")
            .unwrap_err();
        assert!(e.contains("http_v3_module"), "{e}");
        let e = Proxy::Haproxy
            .h3_capable("Feature list : +OPENSSL -QUIC")
            .unwrap_err();
        assert!(e.contains("without QUIC"), "{e}");
        assert!(Proxy::Relay.h3_capable("").is_err());
    }

    #[test]
    fn names_round_trip() {
        for p in Proxy::ALL {
            assert_eq!(Proxy::parse(p.name()), Some(p));
        }
        assert_eq!(Proxy::parse(" NGINX "), Some(Proxy::Nginx));
        assert_eq!(Proxy::parse("envoy"), None);
    }

    #[test]
    fn configurations_are_fair_and_complete() {
        let dir = Path::new("/tmp/x");
        let files = files();
        let plain = setup(dir, None);
        let tls = setup(dir, Some(&files));
        // Portico: a valid configuration (parsed by the real loader), one listener without TLS,
        // two with, both to the same keep-alive group.
        for (s, listeners) in [(&plain, 1), (&tls, 2)] {
            let text = config(Proxy::Portico, s);
            let cfg = portico_config_check(&text);
            assert_eq!(cfg.matches("[[listeners]]").count(), listeners, "{text}");
            assert!(text.contains("servers = [\"127.0.0.1:18081\"]"));
            assert!(text.contains("keepalive = 1024"));
        }
        let t = config(Proxy::Portico, &tls);
        assert!(t.contains("versions = \"1.3\"") && t.contains("groups = [\"X25519\"]"));
        assert!(t.contains("[listeners.http3]"), "{t}");
        let no_h3 = Setup {
            h3: false,
            ..tls.clone()
        };
        assert!(!config(Proxy::Portico, &no_h3).contains("http3"));
        let n = config(Proxy::Nginx, &tls);
        for want in [
            "worker_processes 1;",
            "access_log off;",
            "keepalive 1024;",
            "proxy_http_version 1.1;",
            "proxy_set_header Connection \"\";",
            "listen 127.0.0.1:18080;",
            "listen 127.0.0.1:18443 ssl http2;",
            "ssl_ecdh_curve X25519;",
            "pid /tmp/x/nginx.pid;",
        ] {
            assert!(n.contains(want), "{want}\n{n}");
        }
        assert!(!config(Proxy::Nginx, &plain).contains("ssl"));
        // Without the HTTP/2 scenario (or a build able to serve it), TLS listeners stay HTTP/1.1.
        let no_h2 = Setup {
            h2: false,
            h3: false,
            ..tls.clone()
        };
        assert!(config(Proxy::Nginx, &no_h2).contains("listen 127.0.0.1:18443 ssl;"));
        assert!(!config(Proxy::Haproxy, &no_h2).contains("alpn"));
        let h = config(Proxy::Haproxy, &tls);
        for want in [
            "nbthread 1",
            "http-reuse always",
            "option http-keep-alive",
            "bind 127.0.0.1:18080\n",
            "ssl crt /tmp/x/both.pem ssl-min-ver TLSv1.3 curves X25519 alpn h2,http/1.1\n",
            "server s1 127.0.0.1:18081",
        ] {
            assert!(h.contains(want), "{want}\n{h}");
        }
        assert!(!h.contains("log "), "no logging");
        let c = config(Proxy::Caddy, &tls);
        for want in [
            "admin off",
            "http://:18080 {\n    bind 127.0.0.1\n",
            "https://:18443 {\n    bind 127.0.0.1\n",
            "tls /tmp/x/cert.pem /tmp/x/key.pem",
            "curves x25519",
            "reverse_proxy 127.0.0.1:18081",
        ] {
            assert!(c.contains(want), "{want}\n{c}");
        }
        assert_eq!(c.matches('{').count(), c.matches('}').count());
        assert_eq!(n.matches('{').count(), n.matches('}').count());
        assert_eq!(config(Proxy::Direct, &tls), "");
        let cmd = command(
            Proxy::Portico,
            "/bin/portico",
            Path::new("/tmp/x/portico.toml"),
            &plain,
        );
        assert_eq!(
            cmd,
            [
                "/bin/portico",
                "run",
                "--config",
                "/tmp/x/portico.toml",
                "--workers",
                "1"
            ]
        );
        assert!(environment(Proxy::Caddy, dir).contains(&("GOMAXPROCS".into(), "1".into())));
        // The floor: the relay between the same ports, through no TLS.
        let relay = command(Proxy::Relay, "/bin/portico", Path::new("/tmp/x/r"), &tls);
        assert_eq!(
            relay.join(" "),
            "/bin/portico bench relay --listen 127.0.0.1:18080 --to 127.0.0.1:18081"
        );
        assert!(config(Proxy::Relay, &tls).contains("127.0.0.1:18080 -> 127.0.0.1:18081"));
        assert!(!Proxy::Relay.terminates_tls() && Proxy::Relay.h2_capable("").is_err());
    }

    #[test]
    fn pingora_configuration_and_command() {
        let dir = Path::new("/tmp/x");
        let files = files();
        let tls = setup(dir, Some(&files));
        let c = config(Proxy::Pingora, &tls);
        for want in [
            "\nthreads: 1\n",
            "pid_file: /tmp/x/pingora.pid\n",
            "upgrade_sock: /tmp/x/pingora_upgrade.sock\n",
            "upstream_keepalive_pool_size: 1024\n",
        ] {
            assert!(c.contains(want), "{want}\n{c}");
        }
        let bin = "/t/release/portico-bench-pingora";
        let conf = Path::new("/tmp/x/pingora.yaml");
        assert_eq!(
            command(Proxy::Pingora, bin, conf, &tls).join(" "),
            "/t/release/portico-bench-pingora --conf /tmp/x/pingora.yaml --listen 127.0.0.1:18080 \
             --origin 127.0.0.1:18081 --tls-listen 127.0.0.1:18443 --cert /tmp/x/cert.pem \
             --key /tmp/x/key.pem --h2"
        );
        assert_eq!(
            command(Proxy::Pingora, bin, conf, &setup(dir, None)).join(" "),
            "/t/release/portico-bench-pingora --conf /tmp/x/pingora.yaml --listen 127.0.0.1:18080 \
             --origin 127.0.0.1:18081"
        );
        assert!(Proxy::Pingora.h2_capable("").is_ok() && Proxy::Pingora.h3_capable("").is_err());
        assert!(Proxy::Pingora
            .not_found()
            .contains("scripts/build-pingora.sh"));
        assert!(Proxy::Nginx.not_found().contains("not installed"));
    }

    /// A light structural check of the TOML (the crate does not depend on the config crate):
    /// it parses as TOML with the keys the loader wants.
    fn portico_config_check(text: &str) -> String {
        for line in text
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        {
            let ok = line.starts_with('[') || line.contains(" = ");
            assert!(ok, "not a TOML line: {line}");
        }
        text.to_string()
    }
}
