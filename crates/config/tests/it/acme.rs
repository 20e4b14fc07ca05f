//! ACME listeners (`[listeners.tls.acme]`): the certificate files it implies, presets, errors.

use portico_config::{parse, Config, LETS_ENCRYPT, LETS_ENCRYPT_STAGING};

/// A TLS listener with `acme` lines in its acme table (and `extra` in its tls table).
fn config(acme: &str, extra: &str) -> Result<Config, String> {
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:8443\"\n[listeners.tls]\n{extra}\n[listeners.tls.acme]\n{acme}\n[[listeners.routes]]\nrespond = {{ status = 200 }}\n"
    );
    parse(&text, "/etc/portico/t.toml").map_err(|e| e.to_string())
}

#[test]
fn an_acme_listener_serves_the_files_of_its_storage() {
    let c = config(
        "names = [\"Example.com\", \"www.example.com\"]\nemail = \"ops@example.com\"\naccept_terms = true",
        "",
    )
    .unwrap();
    let l = &c.listeners[0];
    let a = l.acme.as_ref().unwrap();
    assert_eq!(a.names, ["example.com", "www.example.com"]);
    assert_eq!(a.contact, ["mailto:ops@example.com"]);
    assert_eq!(a.directory, LETS_ENCRYPT);
    assert_eq!(a.storage, std::path::Path::new("/etc/portico/acme"));
    let files = &l.tls.as_ref().unwrap().certificates;
    assert_eq!(files.len(), 1);
    assert_eq!(
        files[0].cert,
        std::path::Path::new("/etc/portico/acme/example.com.crt")
    );
    assert_eq!(
        files[0].key,
        std::path::Path::new("/etc/portico/acme/example.com.key")
    );
    let staging = config(
        "names = [\"a.example\"]\ndirectory = \"letsencrypt-staging\"\nstorage = \"/var/lib/portico/acme\"\naccept_terms = true",
        "",
    )
    .unwrap();
    let a = staging.listeners[0].acme.clone().unwrap();
    assert_eq!(a.directory, LETS_ENCRYPT_STAGING);
    assert_eq!(a.storage, std::path::Path::new("/var/lib/portico/acme"));
}

#[test]
fn acme_errors_name_the_key() {
    let e = |acme: &str, extra: &str| config(acme, extra).unwrap_err();
    assert!(e("accept_terms = true", "").contains("tls.acme: acme needs `names`"));
    assert!(
        e("names = [\"a.example\"]", "").contains("tls.acme.accept_terms: set accept_terms = true")
    );
    assert!(e("names = [\"*.example\"]\naccept_terms = true", "")
        .contains("tls.acme.names[0]: \"*.example\" is not a DNS name"));
    assert!(e(
        "names = [\"a.example\", \"192.0.2.1\"]\naccept_terms = true",
        ""
    )
    .contains("tls.acme.names[1]: \"192.0.2.1\" is not a DNS name"));
    assert!(e(
        "names = [\"a.example\"]\naccept_terms = true",
        "watch = false"
    )
    .contains("tls.watch: an ACME listener watches its certificate files"));
    assert!(e(
        "names = [\"a.example\"]\naccept_terms = true\ndirectory = \"http://ca/dir\"",
        ""
    )
    .contains("tls.acme.directory: expected \"letsencrypt\", \"letsencrypt-staging\" or an https:// directory URL"));
    assert!(e(
        "names = [\"a.example\"]\naccept_terms = true\nemail = \"nobody\"",
        ""
    )
    .contains("tls.acme.email: \"nobody\" is not an email address"));
    assert!(e(
        "names = [\"a.example\"]\naccept_terms = true",
        "certificates = [{ cert = \"c.pem\", key = \"k.pem\" }]"
    )
    .contains(
        "tls.certificates: a listener's certificate comes from its files or from acme, not both"
    ));
    assert!(
        e("names = [\"a.example\"]\naccept_terms = true\nttl = 1", "")
            .contains("unknown field `ttl`")
    );
}
