//! JSON Web Key sets (RFC 7517): the keys a route's JWT check verifies signatures with, read from a file or a fetched document.

use jsonwebtoken::jwk::{Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey};

pub use jsonwebtoken::Algorithm as JwtAlgorithm;

/// The signing keys of a JWK set that Portico can verify with.
pub struct KeySet {
    pub keys: Vec<Key>,
}

/// One verification key: its `kid`, the one algorithm it is for when the set says (`alg`),
/// and the key.
pub struct Key {
    pub kid: Option<String>,
    pub alg: Option<Algorithm>,
    pub key: DecodingKey,
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kids: Vec<&str> = self
            .keys
            .iter()
            .map(|k| k.kid.as_deref().unwrap_or("-"))
            .collect();
        write!(f, "KeySet{kids:?}")
    }
}

/// Most keys taken from one set (identity providers publish two or three).
const MAX_KEYS: usize = 64;

impl KeySet {
    /// The signing keys of a JWK set document (`{"keys": [...]}`). Keys for encryption
    /// (`"use": "enc"`), of unknown types or with unknown algorithms are skipped; a set with no
    /// key left is an error.
    pub fn parse(text: &str) -> Result<KeySet, String> {
        let doc: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let list = doc
            .get("keys")
            .and_then(|k| k.as_array())
            .ok_or("not a JWK set: expected an object with a \"keys\" array")?;
        let mut keys = Vec::new();
        let mut skipped = Vec::new();
        for (i, raw) in list.iter().take(MAX_KEYS).enumerate() {
            match key(raw) {
                Ok(k) => keys.push(k),
                Err(why) => skipped.push(format!("key {i}: {why}")),
            }
        }
        if keys.is_empty() {
            let why = match skipped.is_empty() {
                true => "the set is empty".to_string(),
                false => skipped.join("; "),
            };
            return Err(format!("no signing key Portico can use ({why})"));
        }
        Ok(KeySet { keys })
    }

    /// The keys a token signed with `alg` may have been signed with: the one named `kid`, or
    /// without a `kid` every key of the algorithm's family. A key whose set names its algorithm
    /// is taken only for that algorithm.
    pub fn candidates<'s>(
        &'s self,
        kid: Option<&'s str>,
        alg: Algorithm,
    ) -> impl Iterator<Item = &'s Key> + 's {
        self.keys.iter().filter(move |k| {
            let named = match (kid, &k.kid) {
                (Some(want), Some(have)) => want == have,
                (Some(_), None) => false,
                (None, _) => true,
            };
            named && k.key.family() == alg.family() && k.alg.is_none_or(|a| a == alg)
        })
    }

    /// Whether the set has a key named `kid`.
    pub fn has_kid(&self, kid: &str) -> bool {
        self.keys.iter().any(|k| k.kid.as_deref() == Some(kid))
    }
}

fn key(raw: &serde_json::Value) -> Result<Key, String> {
    let jwk: Jwk = serde_json::from_value(raw.clone()).map_err(|e| e.to_string())?;
    if jwk.common.public_key_use == Some(PublicKeyUse::Encryption) {
        return Err("an encryption key (\"use\": \"enc\")".to_string());
    }
    let alg = match raw.get("alg").and_then(|a| a.as_str()) {
        None => None,
        Some(name) => Some(
            algorithm(name).ok_or_else(|| format!("algorithm {name:?} is not a signature one"))?,
        ),
    };
    let key = DecodingKey::from_jwk(&jwk).map_err(|e| format!("unusable key: {e}"))?;
    if alg.is_some_and(|a| a.family() != key.family()) {
        return Err("its \"alg\" does not fit its key type".to_string());
    }
    if key.family() == AlgorithmFamily::Hmac && key.try_get_as_bytes().is_ok_and(<[u8]>::is_empty) {
        return Err("an empty secret".to_string());
    }
    let kid = jwk.common.key_id.clone();
    Ok(Key { kid, alg, key })
}

/// The JWS algorithm named `name` (RFC 7518), `none` never.
pub fn algorithm(name: &str) -> Option<Algorithm> {
    name.parse().ok()
}

/// The algorithms taken when a route lists none: every public-key one (HMAC only when listed,
/// so that a public key can never be used as a shared secret).
pub const DEFAULT_ALGORITHMS: [Algorithm; 9] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

#[cfg(test)]
mod tests {
    use super::*;

    const EC: &str = r#"{"kty":"EC","crv":"P-256","kid":"e1","alg":"ES256","use":"sig",
        "x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
        "y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}"#;

    #[test]
    fn a_set_keeps_its_signing_keys_and_skips_the_rest() {
        let text = format!(
            r#"{{"keys":[{EC},{{"kty":"oct","kid":"h","k":"c2VjcmV0"}},
            {{"kty":"RSA","use":"enc","n":"AQAB","e":"AQAB"}},{{"kty":"XYZ"}}]}}"#
        );
        let set = KeySet::parse(&text).unwrap();
        assert_eq!(set.keys.len(), 2);
        assert!(set.has_kid("e1") && set.has_kid("h") && !set.has_kid("x"));
        assert_eq!(set.candidates(Some("e1"), Algorithm::ES256).count(), 1);
        // A key named for ES256 is not taken for ES384, nor an EC key for HMAC.
        assert_eq!(set.candidates(Some("e1"), Algorithm::ES384).count(), 0);
        assert_eq!(set.candidates(None, Algorithm::HS256).count(), 1);
        assert_eq!(set.candidates(Some("h"), Algorithm::RS256).count(), 0);
    }

    #[test]
    fn a_set_without_a_usable_key_is_an_error() {
        assert!(KeySet::parse("[]").unwrap_err().contains("\"keys\" array"));
        assert!(KeySet::parse("{\"keys\":[]}")
            .unwrap_err()
            .contains("empty"));
        let e =
            KeySet::parse(r#"{"keys":[{"kty":"EC","alg":"none","x":"a","y":"b"}]}"#).unwrap_err();
        assert!(e.contains("key 0"), "{e}");
        assert!(KeySet::parse("{").unwrap_err().starts_with("not JSON"));
    }

    #[test]
    fn none_is_not_an_algorithm() {
        assert!(algorithm("none").is_none());
        assert_eq!(algorithm("ES256"), Some(Algorithm::ES256));
    }
}
