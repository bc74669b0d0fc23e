//! The verification keys of one issuer: a JWK Set (RFC 7517) read into keys, or the one shared
//! secret of an HMAC issuer, and the pick of the key a token names.
//!
//! A JWK Set never yields a symmetric key (`kty: oct`): a published set is public, and a
//! secret in it would let anyone sign. A key marked `use: enc` is skipped; a key that names an
//! `alg` verifies that algorithm only; one of a type this build cannot read is skipped and
//! counted, so that a set with one odd key still serves its others.

use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::Value;

/// Most keys kept from one set: a set is a handful of keys; one with thousands would make
/// every unknown-`kid` token scan them.
pub const MAX_KEYS: usize = 64;

/// One usable key.
pub struct Key {
    /// Its `kid`, if it has one.
    pub kid: Option<String>,
    /// The one algorithm it verifies, when the set says (`alg`).
    pub alg: Option<Algorithm>,
    /// The key.
    pub key: DecodingKey,
}

/// The keys of one issuer, as last read.
#[derive(Default)]
pub struct KeySet {
    /// The keys, in the set's order.
    pub keys: Vec<Key>,
    /// Entries of the set that were skipped (not for signing, symmetric, or unreadable).
    pub skipped: usize,
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kids: Vec<_> = self.keys.iter().map(|k| k.kid.as_deref()).collect();
        f.debug_struct("KeySet")
            .field("kids", &kids)
            .field("skipped", &self.skipped)
            .finish()
    }
}

impl KeySet {
    /// The set in `json` (`{"keys": [...]}`), or why it is not one. A set with no usable key
    /// is an error: keeping it would refuse every token.
    pub fn from_jwks(json: &[u8]) -> Result<KeySet, String> {
        let doc: Value =
            serde_json::from_slice(json).map_err(|e| format!("the JWK Set is not JSON: {e}"))?;
        let Some(Value::Array(entries)) = doc.get("keys") else {
            return Err("the JWK Set has no \"keys\" array".into());
        };
        let mut set = KeySet::default();
        for entry in entries {
            match key_of(entry) {
                Some(k) if set.keys.len() < MAX_KEYS => set.keys.push(k),
                _ => set.skipped += 1,
            }
        }
        if set.keys.is_empty() {
            return Err(format!(
                "the JWK Set holds no usable signature key ({} skipped)",
                set.skipped
            ));
        }
        Ok(set)
    }

    /// The set of an HMAC issuer: its one secret.
    pub fn secret(secret: &[u8]) -> Result<KeySet, String> {
        let key = DecodingKey::from_secret(secret).map_err(|e| format!("the secret: {e}"))?;
        Ok(KeySet {
            keys: vec![Key {
                kid: None,
                alg: None,
                key,
            }],
            skipped: 0,
        })
    }

    /// The keys that may verify a token signed with `alg` and naming `kid`: the key with that
    /// `kid`, and keys that have none (a token that names none may be checked against every
    /// key of the right type).
    pub fn candidates<'s>(
        &'s self,
        alg: Algorithm,
        kid: Option<&'s str>,
    ) -> impl Iterator<Item = &'s Key> + 's {
        self.keys.iter().filter(move |k| {
            (kid.is_none() || k.kid.is_none() || k.kid.as_deref() == kid)
                && k.alg.is_none_or(|a| a == alg)
                && k.key.family() == alg.family()
        })
    }

    /// Whether the set has a key named `kid`.
    pub fn has_kid(&self, kid: &str) -> bool {
        self.keys.iter().any(|k| k.kid.as_deref() == Some(kid))
    }

    /// The `kid`s, for `/readyz` and the dashboard.
    pub fn kids(&self) -> Vec<String> {
        self.keys.iter().filter_map(|k| k.kid.clone()).collect()
    }
}

/// One entry of a set as a signature key, if it is one this build can use.
fn key_of(entry: &Value) -> Option<Key> {
    if entry.get("kty").and_then(Value::as_str) == Some("oct") {
        return None;
    }
    if entry
        .get("use")
        .and_then(Value::as_str)
        .is_some_and(|u| u != "sig")
    {
        return None;
    }
    let alg = match entry.get("alg").and_then(Value::as_str) {
        None => None,
        Some(a) => Some(a.parse::<Algorithm>().ok()?),
    };
    let jwk: jsonwebtoken::jwk::Jwk = serde_json::from_value(entry.clone()).ok()?;
    let key = DecodingKey::from_jwk(&jwk).ok()?;
    let kid = entry.get("kid").and_then(Value::as_str).map(str::to_owned);
    Some(Key { kid, alg, key })
}

#[cfg(test)]
mod tests {
    use super::*;

    const EC: &str = r#"{"kty":"EC","crv":"P-256","kid":"ec-1","alg":"ES256","use":"sig",
        "x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
        "y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}"#;

    #[test]
    fn a_set_keeps_signature_keys_only() {
        let json = format!(
            r#"{{"keys":[{EC},
                {{"kty":"oct","k":"c2VjcmV0","kid":"s"}},
                {{"kty":"EC","crv":"P-256","use":"enc","kid":"e","x":"a","y":"b"}},
                {{"kty":"XYZ","kid":"odd"}}]}}"#
        );
        let set = KeySet::from_jwks(json.as_bytes()).unwrap();
        assert_eq!(set.kids(), vec!["ec-1".to_string()]);
        assert_eq!(set.skipped, 3);
        assert_eq!(set.candidates(Algorithm::ES256, Some("ec-1")).count(), 1);
        assert_eq!(set.candidates(Algorithm::ES256, None).count(), 1);
        // The key says ES256: it verifies nothing else, nor does an unknown kid find it.
        assert_eq!(set.candidates(Algorithm::ES384, Some("ec-1")).count(), 0);
        assert_eq!(set.candidates(Algorithm::HS256, None).count(), 0);
        assert_eq!(set.candidates(Algorithm::ES256, Some("other")).count(), 0);
    }

    #[test]
    fn a_set_without_usable_keys_is_refused() {
        for bad in [
            "not json",
            r#"{"keys": 5}"#,
            r#"{"keys": [{"kty":"oct","k":"c2VjcmV0"}]}"#,
        ] {
            assert!(KeySet::from_jwks(bad.as_bytes()).is_err(), "{bad}");
        }
    }
}
