//! TLS: listener termination settings, upstream origination settings, certificate paths and server names.

use super::*;
use crate::model::{Acme, AcmeChallenge, AcmeKey, LETS_ENCRYPT, LETS_ENCRYPT_STAGING};
use crate::raw::RawAcme;

pub(super) fn tls(
    ctx: &mut Ctx<'_>,
    key: &str,
    t: &RawTls,
    listener: usize,
    acme: Option<&Acme>,
) -> Option<TlsSettings> {
    // The table's position: its first key (an implicit table, made by `[listeners.tls.acme]`
    // alone, has no span of its own), else the listener's.
    let at = [
        t.certificates.as_ref().map(start),
        t.acme.as_ref().map(start),
        t.versions.as_ref().map(start),
        t.cipher_suites.as_ref().map(start),
        t.groups.as_ref().map(start),
        t.session_tickets.as_ref().map(start),
        t.session_cache.as_ref().map(start),
        t.client_auth
            .as_ref()
            .and_then(|c| c.ca.as_ref().or(None).map(start)),
        t.client_auth
            .as_ref()
            .and_then(|c| c.required.as_ref().map(start)),
        t.watch.as_ref().map(start),
        t.watch_interval.as_ref().map(start),
    ]
    .into_iter()
    .flatten()
    .min()
    .unwrap_or(listener);
    let mut certificates = Vec::new();
    match &t.certificates {
        Some(list) if t.acme.is_some() => ctx.error(
            start(list),
            &sub(key, "certificates"),
            "a listener's certificate comes from its files or from acme, not both",
        ),
        None if t.acme.is_some() => {
            if let Some(a) = acme {
                certificates.push(a.files());
            }
        }
        None => ctx.error(
            at,
            key,
            "tls needs `certificates = [{ cert = \"chain.pem\", key = \"key.pem\" }]`",
        ),
        Some(list) if list.get_ref().is_empty() => ctx.error(
            start(list),
            &sub(key, "certificates"),
            "must contain at least one certificate",
        ),
        Some(list) => {
            for (i, item) in list.get_ref().iter().enumerate() {
                let ikey = format!("{key}.certificates[{i}]");
                let c = item.get_ref();
                let mut path = |field: &Option<Spanned<String>>, name: &str| match field {
                    None => {
                        ctx.error(
                            start(item),
                            &ikey,
                            format!("certificate needs `{name}` (a PEM file path)"),
                        );
                        None
                    }
                    Some(p) if p.get_ref().trim().is_empty() => {
                        ctx.error(start(p), &sub(&ikey, name), "must be a file path");
                        None
                    }
                    Some(p) => Some(relative_to_config(ctx.file, p.get_ref())),
                };
                let cert = path(&c.cert, "cert");
                let key_path = path(&c.key, "key");
                if let (Some(cert), Some(key)) = (cert, key_path) {
                    certificates.push(CertificateFiles { cert, key });
                }
            }
        }
    }
    let mut versions = Vec::new();
    match &t.versions {
        None => versions = vec![TlsVersion::Tls12, TlsVersion::Tls13],
        Some(v) => {
            for (name, at) in v.get_ref().items(start(v)) {
                match name.as_str() {
                    "1.2" => versions.push(TlsVersion::Tls12),
                    "1.3" => versions.push(TlsVersion::Tls13),
                    other => ctx.error(
                        at,
                        &sub(key, "versions"),
                        format!("unsupported TLS version {other:?}: use \"1.2\" and/or \"1.3\""),
                    ),
                }
            }
            if v.get_ref().items(0).is_empty() {
                ctx.error(
                    start(v),
                    &sub(key, "versions"),
                    "must name at least one version",
                );
            }
        }
    }
    let cipher_suites = t.cipher_suites.as_ref().and_then(|list| {
        let names: Vec<&str> = CIPHER_SUITES.iter().map(|(n, _)| *n).collect();
        let suites = names_from(ctx, &sub(key, "cipher_suites"), list, &names, "cipher suite")?;
        // Every enabled version needs at least one of its suites.
        for v in &versions {
            if !suites
                .iter()
                .any(|s| CIPHER_SUITES.iter().any(|(n, sv)| n == s && sv == v))
            {
                let (label, prefix) = match v {
                    TlsVersion::Tls12 => ("1.2", "TLS_ECDHE_"),
                    TlsVersion::Tls13 => ("1.3", "TLS13_"),
                };
                ctx.error(
                    start(list),
                    &sub(key, "cipher_suites"),
                    format!(
                        "no cipher suite for TLS {label}, which `versions` enables: add a {prefix}* suite or remove \"{label}\" from `versions`"
                    ),
                );
            }
        }
        Some(suites)
    });
    let groups = t.groups.as_ref().and_then(|list| {
        let names: Vec<&str> = KX_GROUPS.iter().map(|(n, _)| *n).collect();
        let groups = names_from(ctx, &sub(key, "groups"), list, &names, "key-exchange group")?;
        let tls12_ok = groups
            .iter()
            .any(|g| KX_GROUPS.iter().any(|(n, classic)| n == g && *classic));
        if versions.contains(&TlsVersion::Tls12) && !tls12_ok {
            ctx.error(
                start(list),
                &sub(key, "groups"),
                "TLS 1.2 cannot use the post-quantum hybrid groups: add X25519, secp256r1 or secp384r1, or set versions = \"1.3\"",
            );
        }
        Some(groups)
    });
    let session_tickets = t.session_tickets.as_ref().is_none_or(|b| *b.get_ref());
    let session_cache = int(
        ctx,
        t.session_cache.as_ref(),
        &sub(key, "session_cache"),
        DEFAULT_SESSION_CACHE as i64,
        0,
        MAX_SESSION_CACHE,
    ) as usize;
    let client_auth = t.client_auth.as_ref().and_then(|c| match &c.ca {
        None => {
            ctx.error(
                at,
                &sub(key, "client_auth"),
                "client_auth needs `ca` (a PEM file of the CA certificates client certificates must chain to)",
            );
            None
        }
        Some(p) if p.get_ref().trim().is_empty() => {
            ctx.error(
                start(p),
                &sub(&sub(key, "client_auth"), "ca"),
                "must be a file path",
            );
            None
        }
        Some(p) => Some(ClientAuth {
            ca: relative_to_config(ctx.file, p.get_ref()),
            required: c.required.as_ref().is_none_or(|b| *b.get_ref()),
        }),
    });
    let watch_interval = duration(
        ctx,
        t.watch_interval.as_ref(),
        &sub(key, "watch_interval"),
        DEFAULT_WATCH_INTERVAL,
        false,
    );
    let watch = t
        .watch
        .as_ref()
        .is_none_or(|b| *b.get_ref())
        .then_some(watch_interval);
    (!certificates.is_empty() && !versions.is_empty()).then_some(TlsSettings {
        certificates,
        versions,
        cipher_suites,
        groups,
        session_tickets,
        session_cache,
        client_auth,
        watch,
        acme_alpn: acme.is_some_and(|a| a.challenge == AcmeChallenge::TlsAlpn01),
        refuse_stand_in: acme.is_some_and(|a| a.refuse_unissued),
    })
}

/// TLS versions from a `versions` key (default 1.2 and 1.3).
pub(super) fn tls_versions(
    ctx: &mut Ctx<'_>,
    key: &str,
    raw: Option<&Spanned<StrList>>,
) -> Vec<TlsVersion> {
    let Some(v) = raw else {
        return vec![TlsVersion::Tls12, TlsVersion::Tls13];
    };
    let mut versions = Vec::new();
    for (name, at) in v.get_ref().items(start(v)) {
        match name.as_str() {
            "1.2" => versions.push(TlsVersion::Tls12),
            "1.3" => versions.push(TlsVersion::Tls13),
            other => ctx.error(
                at,
                key,
                format!("unsupported TLS version {other:?}: use \"1.2\" and/or \"1.3\""),
            ),
        }
    }
    if v.get_ref().items(0).is_empty() {
        ctx.error(start(v), key, "must name at least one version");
    }
    versions
}

/// `[upstreams.NAME.tls]`; `at` is the group name's position (the table itself has no span).
pub(super) fn upstream_tls(
    ctx: &mut Ctx<'_>,
    key: &str,
    at: usize,
    t: &RawUpstreamTls,
) -> Option<UpstreamTls> {
    let before = ctx.errors.len();
    let file_path = |ctx: &mut Ctx<'_>, value: &Spanned<String>, key: &str| {
        if value.get_ref().trim().is_empty() {
            ctx.error(start(value), key, "must be a file path");
            None
        } else {
            Some(relative_to_config(ctx.file, value.get_ref()))
        }
    };
    let ca_file = t
        .ca_file
        .as_ref()
        .and_then(|p| file_path(ctx, p, &sub(key, "ca_file")));
    let server_name = t.server_name.as_ref().map(|n| {
        if let Some(message) = server_name_error(n.get_ref()) {
            ctx.error(start(n), &sub(key, "server_name"), message);
        }
        n.get_ref().trim_end_matches('.').to_ascii_lowercase()
    });
    let certificate = t.certificate.as_ref().and_then(|c| {
        let ckey = sub(key, "certificate");
        match (&c.cert, &c.key) {
            (Some(cert), Some(k)) => {
                let cert = file_path(ctx, cert, &sub(&ckey, "cert"));
                let k = file_path(ctx, k, &sub(&ckey, "key"));
                Some(CertificateFiles {
                    cert: cert?,
                    key: k?,
                })
            }
            _ => {
                ctx.error(
                    at,
                    &ckey,
                    "a client certificate needs both `cert` and `key` (PEM file paths): certificate = { cert = \"client.pem\", key = \"client.key\" }",
                );
                None
            }
        }
    });
    let verify = t.verify.as_ref().is_none_or(|b| *b.get_ref());
    if let (false, Some(ca)) = (verify, &t.ca_file) {
        ctx.error(
            start(ca),
            &sub(key, "ca_file"),
            "ca_file has no effect with verify = false: remove one of them",
        );
    }
    let versions = tls_versions(ctx, &sub(key, "versions"), t.versions.as_ref());
    let session_cache = int(
        ctx,
        t.session_cache.as_ref(),
        &sub(key, "session_cache"),
        DEFAULT_UPSTREAM_SESSION_CACHE as i64,
        0,
        MAX_SESSION_CACHE,
    ) as usize;
    (ctx.errors.len() == before).then_some(UpstreamTls {
        ca_file,
        server_name,
        certificate,
        verify,
        versions,
        session_cache,
    })
}

/// Why `name` cannot be a TLS server name: it must be a DNS name (no wildcard, no port) or an
/// IP address.
pub(super) fn server_name_error(name: &str) -> Option<String> {
    if name.parse::<IpAddr>().is_ok() {
        return None;
    }
    let host = name.strip_suffix('.').unwrap_or(name);
    let valid_label = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    if host.is_empty() || host.len() > 253 || !host.split('.').all(valid_label) {
        return Some(format!(
            "invalid server name {name:?}: expected a DNS name such as \"api.internal.example\" or an IP address (no port, no wildcard)"
        ));
    }
    None
}

/// A non-empty list of names from `known` (matched ignoring ASCII case, returned as spelled in
/// `known`, duplicates dropped); None after reporting an unknown name or an empty list.
pub(super) fn names_from(
    ctx: &mut Ctx<'_>,
    key: &str,
    list: &Spanned<StrList>,
    known: &[&'static str],
    what: &str,
) -> Option<Vec<&'static str>> {
    let items = list.get_ref().items(start(list));
    if items.is_empty() {
        ctx.error(start(list), key, format!("must name at least one {what}"));
        return None;
    }
    let mut out = Vec::new();
    let mut ok = true;
    for (name, at) in items {
        match known.iter().find(|k| k.eq_ignore_ascii_case(name.trim())) {
            Some(k) if !out.contains(k) => out.push(*k),
            Some(_) => {}
            None => {
                ok = false;
                ctx.error(
                    at,
                    key,
                    format!("unknown {what} {name:?}; accepted: {}", known.join(", ")),
                );
            }
        }
    }
    ok.then_some(out)
}

/// A path from the configuration, relative to the directory of the file it came from.
pub(super) fn relative_to_config(file: &str, path: &str) -> PathBuf {
    let p = PathBuf::from(path);
    if p.is_absolute() || file.starts_with('<') {
        return p;
    }
    match std::path::Path::new(file).parent() {
        Some(dir) => dir.join(p),
        None => p,
    }
}

/// `[listeners.tls.acme]`: names, contact, directory (a preset or an https URL), the
/// directory's CA, storage, terms accepted, challenge (with its DNS hook), key type, profile,
/// what happens before the first issuance.
pub(super) fn acme(ctx: &mut Ctx<'_>, key: &str, raw: &RawTls) -> Option<Acme> {
    let item = raw.acme.as_ref()?;
    let a = item.get_ref();
    if let Some(w) = raw.watch.as_ref().filter(|w| !*w.get_ref()) {
        let m = "an ACME listener watches its certificate files (renewals load from them): remove watch = false";
        ctx.error(start(w), &sub(key, "watch"), m);
    }
    let key = sub(key, "acme");
    let challenge = acme_challenge(ctx, &key, a);
    let dns = matches!(challenge, AcmeChallenge::Dns01 { .. });
    let mut names = Vec::new();
    match &a.names {
        None => ctx.error(
            start(item),
            &key,
            "acme needs `names`, the DNS names of the certificate: names = [\"example.com\"]",
        ),
        Some(list) => {
            for (i, (name, at)) in list.get_ref().items(start(list)).into_iter().enumerate() {
                let name = name.to_ascii_lowercase();
                // A wildcard covers one label left of a DNS name; only DNS-01 can prove it.
                let (wildcard, base) = match name.strip_prefix("*.") {
                    Some(rest) => (true, rest),
                    None => (false, name.as_str()),
                };
                let ok = !base.is_empty()
                    && base.len() <= 253
                    && base.split('.').all(|l| {
                        !l.is_empty()
                            && l.len() <= 63
                            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                            && !l.starts_with('-')
                            && !l.ends_with('-')
                    });
                // An address is not a DNS name (its last label would be all digits).
                let address = base
                    .rsplit('.')
                    .next()
                    .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()));
                let key = item_key(list, &sub(&key, "names"), i);
                if !ok || address {
                    ctx.error(at, &key, format!("{name:?} is not a DNS name"));
                } else if wildcard && !dns {
                    let m = format!("{name:?}: a wildcard name needs challenge = \"dns-01\"");
                    ctx.error(at, &key, m);
                } else if !names.contains(&name) {
                    names.push(name);
                }
            }
            if names.is_empty() && list.get_ref().items(0).is_empty() {
                ctx.error(
                    start(list),
                    &sub(&key, "names"),
                    "must name at least one DNS name",
                );
            }
            if names.len() > 100 {
                let m = "at most 100 names per certificate (Let's Encrypt's limit)";
                ctx.error(start(list), &sub(&key, "names"), m);
            }
        }
    }
    let directory = match a.directory.as_ref() {
        None => LETS_ENCRYPT.to_string(),
        Some(d) => match d.get_ref().as_str() {
            "letsencrypt" => LETS_ENCRYPT.to_string(),
            "letsencrypt-staging" => LETS_ENCRYPT_STAGING.to_string(),
            url if url.starts_with("https://") && url.len() > 8 => url.to_string(),
            other => {
                ctx.error(
                    start(d),
                    &sub(&key, "directory"),
                    format!("expected \"letsencrypt\", \"letsencrypt-staging\" or an https:// directory URL, found {other:?}"),
                );
                String::new()
            }
        },
    };
    let contact = match a.email.as_ref() {
        None => Vec::new(),
        Some(e) => {
            let text = e.get_ref();
            if !text.contains('@') || text.contains(char::is_whitespace) {
                ctx.error(
                    start(e),
                    &sub(&key, "email"),
                    format!("{text:?} is not an email address"),
                );
            }
            vec![format!("mailto:{text}")]
        }
    };
    if a.accept_terms.as_ref().map(|t| *t.get_ref()) != Some(true) {
        let at = a.accept_terms.as_ref().map_or(start(item), start);
        ctx.error(
            at,
            &sub(&key, "accept_terms"),
            "set accept_terms = true to agree to the ACME server's terms of service",
        );
    }
    let directory_ca = a
        .directory_ca
        .as_ref()
        .map(|p| relative_to_config(ctx.file, p.get_ref()));
    let storage = match a.storage.as_ref() {
        Some(p) => relative_to_config(ctx.file, p.get_ref()),
        None => relative_to_config(ctx.file, "acme"),
    };
    let key_type = match a.key_type.as_ref() {
        None => AcmeKey::EcdsaP256,
        Some(k) => match k.get_ref().as_str() {
            "ecdsa-p256" => AcmeKey::EcdsaP256,
            "ecdsa-p384" => AcmeKey::EcdsaP384,
            "rsa-2048" => AcmeKey::Rsa2048,
            "rsa-4096" => AcmeKey::Rsa4096,
            other => {
                let m = format!(
                    "expected \"ecdsa-p256\", \"ecdsa-p384\", \"rsa-2048\" or \"rsa-4096\", found {other:?}"
                );
                ctx.error(start(k), &sub(&key, "key_type"), m);
                AcmeKey::EcdsaP256
            }
        },
    };
    let profile = a.profile.as_ref().and_then(|p| {
        let text = p.get_ref();
        let ok = !text.is_empty()
            && text.len() <= 64
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !ok {
            let m = format!("{text:?} is not a profile name (such as \"shortlived\")");
            ctx.error(start(p), &sub(&key, "profile"), m);
        }
        ok.then(|| text.clone())
    });
    let refuse_unissued = match a.unissued.as_ref() {
        None => false,
        Some(u) => match u.get_ref().as_str() {
            "self-signed" => false,
            "refuse" => true,
            other => {
                let m = format!("expected \"self-signed\" or \"refuse\", found {other:?}");
                ctx.error(start(u), &sub(&key, "unissued"), m);
                false
            }
        },
    };
    (!names.is_empty() && !directory.is_empty()).then_some(Acme {
        names,
        contact,
        directory,
        directory_ca,
        storage,
        challenge,
        key_type,
        profile,
        refuse_unissued,
    })
}

/// The longest `dns_delay`.
const MAX_DNS_DELAY: Duration = Duration::from_secs(600);

/// `challenge` (default `http-01`) with `dns_hook` and `dns_delay` for `dns-01`.
fn acme_challenge(ctx: &mut Ctx<'_>, key: &str, a: &RawAcme) -> AcmeChallenge {
    let named = a
        .challenge
        .as_ref()
        .map(|c| (c.get_ref().as_str(), start(c)));
    let challenge = match named {
        None | Some(("http-01", _)) => AcmeChallenge::Http01,
        Some(("tls-alpn-01", _)) => AcmeChallenge::TlsAlpn01,
        Some(("dns-01", at)) => match a.dns_hook.as_ref() {
            None => {
                let m = "dns-01 needs dns_hook = \"/path/to/command\" (called as COMMAND present|cleanup NAME VALUE)";
                ctx.error(at, &sub(key, "challenge"), m);
                AcmeChallenge::Http01
            }
            Some(h) if h.get_ref().trim().is_empty() => {
                ctx.error(start(h), &sub(key, "dns_hook"), "must be a command's path");
                AcmeChallenge::Http01
            }
            Some(h) => {
                let k = sub(key, "dns_delay");
                let delay = duration(ctx, a.dns_delay.as_ref(), &k, Duration::ZERO, true);
                if delay > MAX_DNS_DELAY {
                    let at = a.dns_delay.as_ref().map_or(at, start);
                    ctx.error(at, &k, "at most 10m");
                }
                AcmeChallenge::Dns01 {
                    hook: relative_to_config(ctx.file, h.get_ref()),
                    delay,
                }
            }
        },
        Some((other, at)) => {
            let m = format!("expected \"http-01\", \"tls-alpn-01\" or \"dns-01\", found {other:?}");
            ctx.error(at, &sub(key, "challenge"), m);
            AcmeChallenge::Http01
        }
    };
    if named.is_none_or(|(n, _)| n != "dns-01") {
        for (field, k) in [
            (a.dns_hook.as_ref().map(start), "dns_hook"),
            (a.dns_delay.as_ref().map(start), "dns_delay"),
        ] {
            if let Some(at) = field {
                let m = format!("{k} is only used with challenge = \"dns-01\"");
                ctx.error(at, &sub(key, k), m);
            }
        }
    }
    challenge
}
