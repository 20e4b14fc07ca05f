//! ACME listeners (`[listeners.tls.acme]`): the certificate files it implies, presets, errors.

use portico_config::{parse, AcmeChallenge, AcmeKey, Config, LETS_ENCRYPT, LETS_ENCRYPT_STAGING};
use std::path::Path;
use std::time::Duration;

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
    // (acme table, other tls lines, what the error says)
    let ok = "names = [\"a.example\"]\naccept_terms = true";
    let cases: &[(&str, &str, &str)] = &[
        ("accept_terms = true", "", "tls.acme: acme needs `names`"),
        ("names = [\"a.example\"]", "", "tls.acme.accept_terms: set accept_terms = true"),
        (
            "names = [\"*.example\"]\naccept_terms = true",
            "",
            "tls.acme.names[0]: \"*.example\": a wildcard name needs challenge = \"dns-01\"",
        ),
        (
            "names = [\"a.*.example\"]\naccept_terms = true\nchallenge = \"dns-01\"\ndns_hook = \"h\"",
            "",
            "tls.acme.names[0]: \"a.*.example\" is not a DNS name",
        ),
        (
            "names = [\"a.example\"]\naccept_terms = true\nchallenge = \"dns-01\"",
            "",
            "tls.acme.challenge: dns-01 needs dns_hook",
        ),
        (
            "names = [\"a.example\"]\naccept_terms = true\nchallenge = \"dns\"",
            "",
            "tls.acme.challenge: expected \"http-01\", \"tls-alpn-01\" or \"dns-01\", found \"dns\"",
        ),
        (
            "names = [\"a.example\"]\naccept_terms = true\ndns_hook = \"h\"",
            "",
            "tls.acme.dns_hook: dns_hook is only used with challenge = \"dns-01\"",
        ),
        (
            "names = [\"a.example\"]\naccept_terms = true\nchallenge = \"dns-01\"\ndns_hook = \"h\"\ndns_delay = \"11m\"",
            "",
            "tls.acme.dns_delay: at most 10m",
        ),
        (
            "names = [\"a.example\"]\naccept_terms = true\nkey_type = \"rsa-1024\"",
            "",
            "tls.acme.key_type: expected \"ecdsa-p256\", \"ecdsa-p384\", \"rsa-2048\" or \"rsa-4096\"",
        ),
        (
            "names = [\"a.example\"]\naccept_terms = true\nprofile = \"a b\"",
            "",
            "tls.acme.profile: \"a b\" is not a profile name",
        ),
        (
            "names = [\"a.example\"]\naccept_terms = true\nunissued = \"wait\"",
            "",
            "tls.acme.unissued: expected \"self-signed\" or \"refuse\"",
        ),
        (
            "names = [\"a.example\", \"192.0.2.1\"]\naccept_terms = true",
            "",
            "tls.acme.names[1]: \"192.0.2.1\" is not a DNS name",
        ),
        (ok, "watch = false", "tls.watch: an ACME listener watches its certificate files"),
        (
            "names = [\"a.example\"]\naccept_terms = true\ndirectory = \"http://ca/dir\"",
            "",
            "tls.acme.directory: expected \"letsencrypt\", \"letsencrypt-staging\" or an https:// directory URL",
        ),
        (
            "names = [\"a.example\"]\naccept_terms = true\nemail = \"nobody\"",
            "",
            "tls.acme.email: \"nobody\" is not an email address",
        ),
        (
            ok,
            "certificates = [{ cert = \"c.pem\", key = \"k.pem\" }]",
            "tls.certificates: a listener's certificate comes from its files or from acme, not both",
        ),
        (
            "names = [\"a.example\"]\naccept_terms = true\nttl = 1",
            "",
            "unknown field `ttl`",
        ),
    ];
    for (acme, extra, expected) in cases {
        let e = config(acme, extra).unwrap_err();
        assert!(e.contains(expected), "{acme:?} {extra:?}: {e}");
    }
}

#[test]
fn challenges_keys_profiles_and_refusal_are_chosen() {
    let c = config("names = [\"a.example\"]\naccept_terms = true", "").unwrap();
    let a = c.listeners[0].acme.clone().unwrap();
    assert_eq!(a.challenge, AcmeChallenge::Http01);
    assert_eq!(a.key_type, AcmeKey::EcdsaP256);
    assert_eq!(a.profile, None);
    assert!(!a.refuse_unissued);
    let tls = c.listeners[0].tls.as_ref().unwrap();
    assert!(!tls.acme_alpn && !tls.refuse_stand_in);

    let c = config(
        "names = [\"a.example\"]\naccept_terms = true\nchallenge = \"tls-alpn-01\"\nkey_type = \"rsa-2048\"\nprofile = \"shortlived\"\nunissued = \"refuse\"",
        "",
    )
    .unwrap();
    let a = c.listeners[0].acme.clone().unwrap();
    assert_eq!(a.challenge, AcmeChallenge::TlsAlpn01);
    assert_eq!(a.key_type, AcmeKey::Rsa2048);
    assert_eq!(a.profile.as_deref(), Some("shortlived"));
    assert!(a.refuse_unissued);
    let tls = c.listeners[0].tls.as_ref().unwrap();
    assert!(tls.acme_alpn && tls.refuse_stand_in);

    // A wildcard by DNS-01: its files are named for it without the star.
    let c = config(
        "names = [\"*.Example.com\", \"example.com\"]\naccept_terms = true\nchallenge = \"dns-01\"\ndns_hook = \"hooks/dns\"\ndns_delay = \"30s\"",
        "",
    )
    .unwrap();
    let a = c.listeners[0].acme.clone().unwrap();
    assert_eq!(a.names, ["*.example.com", "example.com"]);
    assert_eq!(
        a.challenge,
        AcmeChallenge::Dns01 {
            hook: Path::new("/etc/portico/hooks/dns").to_path_buf(),
            delay: Duration::from_secs(30),
        }
    );
    assert_eq!(
        a.files().cert,
        Path::new("/etc/portico/acme/_wildcard.example.com.crt")
    );
    let text = portico_config::explain(&c);
    assert!(
        text.contains("DNS-01, TXT records published by /etc/portico/hooks/dns then 30s of waiting; ecdsa-p256 key"),
        "{text}"
    );
    assert!(
        text.contains("until it is issued: a self-signed stand-in served"),
        "{text}"
    );
}

#[test]
fn two_listeners_share_a_certificate_only_with_the_same_settings() {
    let two = |second: &str| {
        let text = format!(
            "[[listeners]]\naddress = \"127.0.0.1:8443\"\n[listeners.tls.acme]\nnames = [\"a.example\"]\naccept_terms = true\n[[listeners.routes]]\nrespond = {{ status = 200 }}\n\n[[listeners]]\naddress = \"127.0.0.1:9443\"\n[listeners.tls.acme]\n{second}\naccept_terms = true\n[[listeners.routes]]\nrespond = {{ status = 200 }}\n"
        );
        parse(&text, "/etc/portico/t.toml").map_err(|e| e.to_string())
    };
    assert!(two("names = [\"a.example\"]").is_ok());
    // What a listener does until the certificate is issued is its own.
    assert!(two("names = [\"a.example\"]\nunissued = \"refuse\"").is_ok());
    assert!(two("names = [\"b.example\"]").is_ok());
    assert!(two("names = [\"a.example\"]\nstorage = \"other\"").is_ok());
    let e = two("names = [\"a.example\", \"b.example\"]").unwrap_err();
    assert!(
        e.contains("listeners[1].tls.acme: its certificate files (/etc/portico/acme/a.example.crt) are those of listeners[0]'s acme table"),
        "{e}"
    );
    assert!(two("names = [\"a.example\"]\nkey_type = \"rsa-2048\"").is_err());
}
