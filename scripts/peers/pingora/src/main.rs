//! A minimal Pingora reverse proxy for `portico bench compare`: every request to one origin, HTTP/1.1 with keep-alive upstream.

use async_trait::async_trait;
use pingora::listeners::tls::TlsSettings;
use pingora::prelude::*;
use pingora::server::configuration::Opt;

/// Sends every request to the one origin, plain HTTP/1.1 (upstream connections are kept alive in
/// Pingora's pool, sized by `upstream_keepalive_pool_size` in the configuration file).
struct ToOrigin {
    origin: std::net::SocketAddr,
}

#[async_trait]
impl ProxyHttp for ToOrigin {
    type CTX = ();
    fn new_ctx(&self) -> Self::CTX {}

    async fn upstream_peer(&self, _: &mut Session, _: &mut Self::CTX) -> Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(self.origin, false, String::new())))
    }
}

const USAGE: &str = "usage: portico-bench-pingora --conf FILE --listen ADDR --origin ADDR \
                     [--tls-listen ADDR --cert FILE --key FILE [--h2]]";

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut conf, mut listen, mut origin, mut tls_listen, mut cert, mut key, mut h2) =
        (None, None, None, None, None, None, false);
    while let Some(a) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| fail(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "--conf" => conf = Some(value()),
            "--listen" => listen = Some(value()),
            "--origin" => origin = Some(value()),
            "--tls-listen" => tls_listen = Some(value()),
            "--cert" => cert = Some(value()),
            "--key" => key = Some(value()),
            "--h2" => h2 = true,
            "--version" => {
                println!("portico-bench-pingora 0.1.0 (pingora 0.9.1, rustls)");
                return;
            }
            _ => fail(&format!("unknown argument {a:?}")),
        }
    }
    let (Some(listen), Some(origin)) = (listen, origin) else {
        fail("--listen and --origin are required")
    };
    let origin = origin
        .parse()
        .unwrap_or_else(|e| fail(&format!("--origin {origin:?}: {e}")));
    let opt = Opt {
        conf,
        ..Opt::default()
    };
    let mut server = Server::new(Some(opt)).unwrap_or_else(|e| fail(&e.to_string()));
    server.bootstrap();
    let mut proxy = http_proxy_service(&server.configuration, ToOrigin { origin });
    proxy.add_tcp(&listen);
    if let Some(addr) = tls_listen {
        let (Some(cert), Some(key)) = (cert, key) else {
            fail("--tls-listen needs --cert and --key")
        };
        let mut tls =
            TlsSettings::intermediate(&cert, &key).unwrap_or_else(|e| fail(&e.to_string()));
        if h2 {
            tls.enable_h2();
        }
        proxy.add_tls_with_settings(&addr, None, tls);
    }
    server.add_service(proxy);
    server.run_forever();
}

fn fail(msg: &str) -> ! {
    eprintln!("portico-bench-pingora: {msg}\n{USAGE}");
    std::process::exit(2)
}
