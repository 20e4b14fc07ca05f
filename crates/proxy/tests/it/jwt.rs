//! JWT checks through real sockets: tokens signed here with aws-lc-rs (ES256, RS256, EdDSA, HS256), the good and the bad ones, from a header, cookie or query parameter, for HTTP/1.1 and HTTP/2 clients; JWK sets from a watched file and from a URL that rotates its keys and goes down; htpasswd files written by Apache's `htpasswd`, watched.

use crate::common::{start_toml, until, T};
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{self, EcdsaKeyPair, Ed25519KeyPair, KeyPair};
use base64::Engine;
use portico_testkit::{Client, Reply, StoppableUpstream, TestUpstream};
use serde_json::{json, Value};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// A signing key and its public JWK.
enum Key {
    Es(EcdsaKeyPair),
    Rs(aws_lc_rs::rsa::KeyPair),
    Ed(Ed25519KeyPair),
    Hs(Vec<u8>),
}

struct Signer {
    kid: String,
    key: Key,
}

impl Signer {
    fn es256(kid: &str) -> Signer {
        let k = EcdsaKeyPair::generate(&signature::ECDSA_P256_SHA256_FIXED_SIGNING).unwrap();
        Signer {
            kid: kid.into(),
            key: Key::Es(k),
        }
    }
    fn rs256(kid: &str) -> Signer {
        let k = aws_lc_rs::rsa::KeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048).unwrap();
        Signer {
            kid: kid.into(),
            key: Key::Rs(k),
        }
    }
    fn eddsa(kid: &str) -> Signer {
        Signer {
            kid: kid.into(),
            key: Key::Ed(Ed25519KeyPair::generate().unwrap()),
        }
    }
    fn hs256(kid: &str, secret: &[u8]) -> Signer {
        Signer {
            kid: kid.into(),
            key: Key::Hs(secret.to_vec()),
        }
    }

    fn jwk(&self) -> Value {
        match &self.key {
            Key::Es(k) => {
                let p = k.public_key().as_ref();
                json!({"kty": "EC", "crv": "P-256", "kid": self.kid, "use": "sig",
                       "x": b64(&p[1..33]), "y": b64(&p[33..65])})
            }
            Key::Rs(k) => {
                let p = k.public_key();
                json!({"kty": "RSA", "kid": self.kid, "alg": "RS256",
                       "n": b64(p.modulus().big_endian_without_leading_zero()),
                       "e": b64(p.exponent().big_endian_without_leading_zero())})
            }
            Key::Ed(k) => json!({"kty": "OKP", "crv": "Ed25519", "kid": self.kid,
                                 "x": b64(k.public_key().as_ref())}),
            Key::Hs(s) => json!({"kty": "oct", "kid": self.kid, "alg": "HS256", "k": b64(s)}),
        }
    }

    /// The RSA public key's DER: what an HS/RS confusion attack uses as the HMAC secret.
    fn public_der(&self) -> Vec<u8> {
        match &self.key {
            Key::Rs(k) => k.public_key().as_ref().to_vec(),
            _ => unreachable!(),
        }
    }

    /// A token with `claims`, signed as `alg` says (its own algorithm unless told otherwise).
    fn token(&self, claims: &Value) -> String {
        let alg = match self.key {
            Key::Es(_) => "ES256",
            Key::Rs(_) => "RS256",
            Key::Ed(_) => "EdDSA",
            Key::Hs(_) => "HS256",
        };
        let head = json!({"alg": alg, "typ": "JWT", "kid": self.kid});
        let input = format!(
            "{}.{}",
            b64(head.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let sig = match &self.key {
            Key::Es(k) => k
                .sign(&SystemRandom::new(), input.as_bytes())
                .unwrap()
                .as_ref()
                .to_vec(),
            Key::Rs(k) => {
                let mut sig = vec![0; k.public_modulus_len()];
                k.sign(
                    &signature::RSA_PKCS1_SHA256,
                    &SystemRandom::new(),
                    input.as_bytes(),
                    &mut sig,
                )
                .unwrap();
                sig
            }
            Key::Ed(k) => k.sign(input.as_bytes()).as_ref().to_vec(),
            Key::Hs(s) => hmac(s, &input),
        };
        format!("{input}.{}", b64(&sig))
    }
}

fn hmac(secret: &[u8], input: &str) -> Vec<u8> {
    let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, secret);
    aws_lc_rs::hmac::sign(&key, input.as_bytes())
        .as_ref()
        .to_vec()
}

/// A token whose header is `head` (any algorithm claimed), HMAC-signed with `secret`.
fn forged(head: &Value, claims: &Value, secret: &[u8]) -> String {
    let input = format!(
        "{}.{}",
        b64(head.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    format!("{input}.{}", b64(&hmac(secret, &input)))
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Claims the test routes accept, with `extra` merged in.
fn claims(extra: Value) -> Value {
    let mut c = json!({"iss": "https://id.test", "aud": "api", "sub": "u1", "exp": now() + 600,
                       "realm_access": {"roles": ["dev", "admin"]}});
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

fn jwks(keys: &[&Signer]) -> String {
    json!({"keys": keys.iter().map(|k| k.jwk()).collect::<Vec<_>>()}).to_string()
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("portico-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// (status, WWW-Authenticate, body) of a GET with `extra` header lines.
fn get(addr: std::net::SocketAddr, path: &str, extra: &str) -> (u16, String, String) {
    let mut c = Client::connect(addr).unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: a\r\n{extra}\r\n");
    let r = c.request(req.as_bytes()).unwrap();
    let challenge = r.header("www-authenticate").unwrap_or_default().to_string();
    (r.status, challenge, r.text())
}

fn bearer(token: &str) -> String {
    format!("Authorization: Bearer {token}\r\n")
}

#[tokio::test]
async fn jwt_checks_signatures_and_claims_and_forwards_claims_as_fields() {
    let up = TestUpstream::start(|r| {
        Reply::ok(&format!(
            "user={} roles={} auth={}",
            r.header("x-user").unwrap_or("none"),
            r.header("x-roles").unwrap_or("none"),
            r.header("authorization").unwrap_or("none")
        ))
    });
    let (es, rs, ed) = (
        Signer::es256("es"),
        Signer::rs256("rs"),
        Signer::eddsa("ed"),
    );
    let hs = Signer::hs256("hs", b"a shared secret of 32 bytes!!!!!");
    let dir = temp_dir("jwt");
    let file = dir.join("jwks.json");
    std::fs::write(&file, jwks(&[&es, &rs, &ed, &hs])).unwrap();
    let p = start_toml(
        &format!(
            r#"
[[listeners]]
name = "p"
address = "127.0.0.1:0"
[[listeners.routes]]
path = "/c/**"
proxy = "b"
jwt = {{ jwks = "{f}", header = "", cookie = "at", query = "access_token", keep_token = true }}
[[listeners.routes]]
path = "/h/**"
proxy = "b"
jwt = {{ jwks = "{f}", header = "X-Token", require = "email" }}
[[listeners.routes]]
proxy = "b"
jwt = {{ jwks = "{f}", algorithms = ["ES256", "RS256", "EdDSA", "HS256"], issuer = "https://id.test", audience = "api", realm = "api", claims = {{ "realm_access.roles" = ["admin", "ops"] }}, forward_claims = {{ sub = "X-User", "realm_access.roles" = "X-Roles" }} }}
[upstreams.b]
servers = ["{}"]
"#,
            up.addr,
            f = file.display(),
        ),
        1,
    );
    let addr = p.addr("p").unwrap();
    let good = claims(json!({}));
    let tokens = [
        es.token(&good),
        rs.token(&good),
        ed.token(&good),
        hs.token(&good),
    ];
    let bad: Vec<(&str, String)> = vec![
        ("expired", es.token(&claims(json!({"exp": now() - 3600})))),
        ("audience", es.token(&claims(json!({"aud": "other"})))),
        (
            "issuer",
            es.token(&claims(json!({"iss": "https://evil.test"}))),
        ),
        ("not yet", es.token(&claims(json!({"nbf": now() + 3600})))),
        ("no exp", {
            let mut c = claims(json!({}));
            c.as_object_mut().unwrap().remove("exp");
            es.token(&c)
        }),
        // A route with an issuer and an audience needs them in the token.
        ("no iss", {
            let mut c = claims(json!({}));
            c.as_object_mut().unwrap().remove("iss");
            es.token(&c)
        }),
        ("no aud", {
            let mut c = claims(json!({}));
            c.as_object_mut().unwrap().remove("aud");
            es.token(&c)
        }),
        ("numeric aud", es.token(&claims(json!({"aud": 7})))),
        ("tampered", {
            // A character inside the signature (the last one may carry only padding bits).
            let mut t = es.token(&good).into_bytes();
            let i = t.len() - 10;
            t[i] = if t[i] == b'A' { b'B' } else { b'A' };
            String::from_utf8(t).unwrap()
        }),
        ("unknown key", Signer::es256("gone").token(&good)),
        ("none", {
            let h = b64(json!({"alg": "none", "typ": "JWT"}).to_string().as_bytes());
            format!("{h}.{}.", b64(good.to_string().as_bytes()))
        }),
        // HS/RS confusion: HMAC keyed with the RSA public key, naming the RSA key.
        (
            "hs with the rsa key",
            forged(
                &json!({"alg": "HS256", "kid": "rs"}),
                &good,
                &rs.public_der(),
            ),
        ),
        ("garbage", "not.a.token".to_string()),
    ];
    let forbidden = es.token(&claims(json!({"realm_access": {"roles": ["guest"]}})));
    let (t2, bad2, f2) = (tokens.clone(), bad.clone(), forbidden.clone());
    let got = tokio::task::spawn_blocking(move || {
        let none = get(addr, "/x", "");
        let passes: Vec<_> = t2
            .iter()
            .map(|t| get(addr, "/x", &format!("{}X-User: admin\r\n", bearer(t))))
            .collect();
        let refusals: Vec<_> = bad2
            .iter()
            .map(|(_, t)| get(addr, "/x", &bearer(t)))
            .collect();
        let scope = get(addr, "/x", &bearer(&f2));
        let basic = get(addr, "/x", "Authorization: Basic dTpw\r\n");
        (none, passes, refusals, scope, basic)
    })
    .await
    .unwrap();
    let (none, passes, refusals, scope, basic) = got;
    assert_eq!((none.0, &none.1[..]), (401, "Bearer realm=\"api\""));
    assert_eq!(basic.0, 401);
    for (i, r) in passes.iter().enumerate() {
        assert_eq!(r.0, 200, "token {i}: {r:?}");
        // The claims replace the client's X-User; the token is not passed on.
        assert_eq!(r.2, "user=u1 roles=dev,admin auth=none", "token {i}");
    }
    for ((what, _), r) in bad.iter().zip(&refusals) {
        assert_eq!(r.0, 401, "{what}: {r:?}");
        assert!(r.1.contains("error=\"invalid_token\""), "{what}: {}", r.1);
    }
    assert!(refusals[0].1.contains("expired"), "{}", refusals[0].1);
    assert_eq!(scope.0, 403);
    assert!(scope.1.contains("insufficient_scope"), "{}", scope.1);
    // Passes are remembered: the same tokens again verify nothing.
    let verified = p.stats().jwt_verified.load(Relaxed);
    let t3 = tokens.clone();
    let again = tokio::task::spawn_blocking(move || {
        t3.iter()
            .map(|t| get(addr, "/x", &bearer(t)).0)
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    assert_eq!(again, [200; 4]);
    assert_eq!(p.stats().jwt_verified.load(Relaxed), verified);
    assert_eq!(
        p.stats().jwt_failures.load(Relaxed),
        2 + bad.len() as u64 + 1
    );
    // A cookie and a query parameter carry tokens where the route says; the token stays.
    let t = tokens[0].clone();
    let with_email = es.token(&claims(json!({"email": "u1@example.org"})));
    let places = tokio::task::spawn_blocking(move || {
        [
            get(addr, "/c/1", &format!("Cookie: a=1; at={t}; b=2\r\n")),
            get(addr, &format!("/c/2?x=1&access_token={t}"), ""),
            get(addr, "/c/3", &bearer(&t)),
            // A token in another field is not passed on either; a required claim the token
            // lacks is a scope refusal.
            get(
                addr,
                "/h/1",
                &format!("X-Token: {t}\r\nAuthorization: Basic dTpw\r\n"),
            ),
            get(
                addr,
                "/h/2",
                &format!("X-Token: {with_email}\r\nAuthorization: Basic dTpw\r\n"),
            ),
        ]
    })
    .await
    .unwrap();
    assert_eq!(places[0].0, 200);
    assert_eq!(places[1].0, 200);
    assert_eq!(places[2].0, 401, "this route does not look at headers");
    assert_eq!(places[3].0, 403, "no email claim: {:?}", places[3]);
    assert!(places[3].1.contains("insufficient_scope"));
    assert_eq!(places[4].0, 200);
    let last = up.requests().pop().unwrap();
    assert_eq!(last.target, "/h/2");
    assert_eq!(last.header("x-token"), None, "the token's field stays here");
    assert_eq!(last.header("authorization"), Some("Basic dTpw"));
    // HTTP/2 clients meet the same check.
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    for (token, want) in [
        (Some(&tokens[1]), 200),
        (None, 401),
        (Some(&forbidden), 403),
    ] {
        let mut c = client.clone().ready().await.unwrap();
        let mut req = http::Request::builder().uri("http://a/x");
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let (resp, _) = c.send_request(req.body(()).unwrap(), true).unwrap();
        let resp = tokio::time::timeout(T, resp).await.unwrap().unwrap();
        assert_eq!(resp.status(), want);
        if want == 200 {
            let mut body = resp.into_body();
            let mut text = Vec::new();
            while let Some(d) = body.data().await {
                text.extend_from_slice(&d.unwrap());
            }
            assert_eq!(text, b"user=u1 roles=dev,admin auth=none");
        } else {
            assert!(resp.headers()["www-authenticate"]
                .to_str()
                .unwrap()
                .starts_with("Bearer realm=\"api\""));
        }
    }
    // The file changes: a new key set is taken, the old keys stop passing.
    let es2 = Signer::es256("es2");
    std::fs::write(&file, jwks(&[&es2])).unwrap();
    let fresh = es2.token(&good);
    let old = tokens[0].clone();
    let after = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + T;
        while get(addr, "/x", &bearer(&fresh)).0 != 200 {
            assert!(std::time::Instant::now() < deadline, "new key never taken");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        get(addr, "/x", &bearer(&old)).0
    })
    .await
    .unwrap();
    assert_eq!(
        after, 401,
        "a pass cached under the old keys is checked again"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn jwks_urls_are_fetched_at_start_refreshed_and_kept_when_the_server_goes_down() {
    let (k1, k2) = (Signer::es256("k1"), Signer::es256("k2"));
    let served = Arc::new(Mutex::new(jwks(&[&k1])));
    let s = served.clone();
    let idp = StoppableUpstream::start(move |_| Reply::ok(&s.lock().unwrap()));
    let up = TestUpstream::start(|_| Reply::ok("in"));
    let p = start_toml(
        &format!(
            r#"
[[listeners]]
name = "p"
address = "127.0.0.1:0"
[[listeners.routes]]
path = "/nokeys"
proxy = "b"
jwt = {{ jwks_url = "http://{}/jwks" }}
[[listeners.routes]]
proxy = "b"
jwt = {{ jwks_url = "http://{}/.well-known/jwks.json", refresh = "1s" }}
[upstreams.b]
servers = ["{}"]
"#,
            crate::common::closed_port(),
            idp.addr,
            up.addr
        ),
        1,
    );
    let addr = p.addr("p").unwrap();
    let good = claims(json!({}));
    let (t1, t2) = (k1.token(&good), k2.token(&good));
    // Fetched before the configuration took traffic: the first request passes.
    let (a, b) = (t1.clone(), t2.clone());
    let first = tokio::task::spawn_blocking(move || {
        [
            get(addr, "/x", &bearer(&a)).0,
            get(addr, "/x", &bearer(&b)).0,
            get(addr, "/nokeys", &bearer(&a)).0,
        ]
    })
    .await
    .unwrap();
    assert_eq!(first, [200, 401, 503]);
    assert_eq!(idp.requests()[0].target, "/.well-known/jwks.json");
    // The identity provider rotates: the new key is taken on the next refresh.
    *served.lock().unwrap() = jwks(&[&k1, &k2]);
    let b = t2.clone();
    tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + T;
        while get(addr, "/x", &bearer(&b)).0 != 200 {
            assert!(
                std::time::Instant::now() < deadline,
                "rotated key never taken"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    })
    .await
    .unwrap();
    // It goes down: fetches fail, the keys stay.
    idp.stop();
    let failed = p.stats().jwks_failures.load(Relaxed);
    until("a failed refresh", || {
        p.stats().jwks_failures.load(Relaxed) > failed
    })
    .await;
    let (a, b) = (t1.clone(), t2.clone());
    let down = tokio::task::spawn_blocking(move || {
        [
            get(addr, "/x", &bearer(&a)).0,
            get(addr, "/x", &bearer(&b)).0,
        ]
    })
    .await
    .unwrap();
    assert_eq!(down, [200, 200]);
}

/// A user line made by Apache's `htpasswd` (bcrypt).
fn htpasswd(args: &[&str]) {
    let out = std::process::Command::new("htpasswd")
        .args(args)
        .output()
        .expect("htpasswd (Debian's apache2-utils; scripts/test.sh installs it)");
    assert!(out.status.success(), "htpasswd {args:?}: {out:?}");
}

#[tokio::test]
async fn htpasswd_files_from_apache_htpasswd_are_read_again_when_they_change() {
    let up = TestUpstream::start(|_| Reply::ok("in"));
    let dir = temp_dir("htpasswd-watch");
    let file = dir.join("users");
    let f = file.to_str().unwrap().to_string();
    htpasswd(&["-c", "-b", "-B", "-C", "5", &f, "alice", "al1ce"]);
    let p = start_toml(
        &format!(
            "[[listeners]]\nname = \"p\"\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\nproxy = \"b\"\n\
             basic_auth = {{ htpasswd = \"{f}\" }}\n[upstreams.b]\nservers = [\"{}\"]\n",
            up.addr
        ),
        1,
    );
    let addr = p.addr("p").unwrap();
    let basic = |user: &str, pw: &str| {
        let t = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pw}"));
        format!("Authorization: Basic {t}\r\n")
    };
    let (a, b) = (basic("alice", "al1ce"), basic("bob", "b0b"));
    let (a2, b2) = (a.clone(), b.clone());
    let before =
        tokio::task::spawn_blocking(move || [get(addr, "/", &a2).0, get(addr, "/", &b2).0])
            .await
            .unwrap();
    assert_eq!(before, [200, 401]);
    // bob is added and alice removed: within a second the file is read again, and alice's
    // remembered pass goes with her.
    htpasswd(&["-b", "-B", "-C", "5", &f, "bob", "b0b"]);
    htpasswd(&["-D", &f, "alice"]);
    until("the file read again", || {
        p.stats().htpasswd_reloads.load(Relaxed) >= 1
    })
    .await;
    let (a2, b2) = (a.clone(), b.clone());
    let after = tokio::task::spawn_blocking(move || [get(addr, "/", &a2).0, get(addr, "/", &b2).0])
        .await
        .unwrap();
    assert_eq!(after, [401, 200]);
    // A line with a refused hash: the file is refused whole, the users loaded before stay.
    let mut text = std::fs::read_to_string(&file).unwrap();
    text.push_str("carol:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=\n");
    std::fs::write(&file, text).unwrap();
    until("the change refused", || {
        p.stats().htpasswd_reload_failures.load(Relaxed) >= 1
    })
    .await;
    let b2 = b.clone();
    let kept = tokio::task::spawn_blocking(move || get(addr, "/", &b2).0)
        .await
        .unwrap();
    assert_eq!(kept, 200);
    let _ = std::fs::remove_dir_all(&dir);
}
