//! API keys: the key store and the caller's identity.
//!
//! Secrets are never kept: a key is stored as the SHA-256 of its secret (a plaintext `secret`
//! in the config is hashed at load). A presented key is hashed once and found by the first
//! eight bytes of its digest; the full 32-byte digest is then compared in constant time. Timing
//! can at most reveal whether the digest of the attacker's own guess shares a prefix with some
//! key's digest, which says nothing about any secret.

use std::sync::Arc;

use http::{HeaderMap, HeaderName};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Who is calling: the public side of an API key, or what a verified token's claims say.
/// Never holds a secret nor the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The key's public name, or a token's key id claim (logs, metrics, limit keys,
    /// `X-Floodgate-Key-Id`).
    pub id: HeaderText,
    /// The customer (several keys may share one), or a token's user claim.
    pub user: HeaderText,
    /// The customer's plan, if any.
    pub plan: Option<HeaderText>,
    /// A verified token's issuer and claims (rules match and key on them); `None` for an API
    /// key.
    pub claims: Option<Arc<TokenClaims>>,
}

/// What a verified token brings beside the identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenClaims {
    /// The issuer's name (`[[auth.jwt]] name`).
    pub issuer: Arc<str>,
    /// The issuer forwards the token upstream (`forward_token`).
    pub forward: bool,
    /// The claim set.
    pub claims: serde_json::Map<String, serde_json::Value>,
}

/// Text that is known to be a valid HTTP header value: checked once when the config is loaded,
/// so forwarding it (`X-Floodgate-Key-Id`, ...) cannot fail on a request.
///
/// Only the header value is kept (its bytes are the text's UTF-8): a config of a million keys
/// holds three of these per key, and a clone shares the bytes, so that keys of one customer or
/// plan share one copy.
#[derive(Clone, PartialEq, Eq)]
pub struct HeaderText {
    value: http::HeaderValue,
}

impl HeaderText {
    /// `text` as a header value, or `None` when a header cannot carry it (CR, LF, NUL and
    /// other control bytes), as judged by the `http` crate that writes the headers. Non-ASCII
    /// text goes out as its UTF-8 bytes (RFC 9110's opaque `obs-text`): `from_bytes` takes
    /// them, where `from_str` takes visible ASCII only.
    pub fn new(text: &str) -> Option<HeaderText> {
        let value = http::HeaderValue::from_bytes(text.as_bytes()).ok()?;
        Some(HeaderText { value })
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        // Made from a `&str` by `new`, so always UTF-8 (the empty fallback is never taken).
        std::str::from_utf8(self.value.as_bytes()).unwrap_or_default()
    }

    /// The header value (cloning it shares its bytes).
    pub fn header_value(&self) -> &http::HeaderValue {
        &self.value
    }
}

impl std::ops::Deref for HeaderText {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl std::fmt::Debug for HeaderText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::fmt::Display for HeaderText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for HeaderText {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// One configured key.
#[derive(Debug, Clone)]
pub struct ApiKey {
    /// SHA-256 of the secret.
    pub digest: [u8; 32],
    /// The identity it stands for.
    pub identity: Arc<Identity>,
}

/// Every configured key, indexed for lookup by digest: the digests sorted in one array, each
/// identity at its digest's position (about 40 bytes a key beside the identity itself).
#[derive(Debug, Default)]
pub struct KeyStore {
    digests: Box<[[u8; 32]]>,
    identities: Box<[Arc<Identity>]>,
}

impl KeyStore {
    /// Builds the store. Ids are assumed unique (config validation checks it).
    pub fn new(mut keys: Vec<ApiKey>) -> Self {
        // Stable: of two keys with one secret, the later one answers, as it always has.
        keys.sort_by_key(|k| k.digest);
        let digests = keys.iter().map(|k| k.digest).collect();
        let identities = keys.into_iter().map(|k| k.identity).collect();
        KeyStore {
            digests,
            identities,
        }
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.digests.len()
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// Every configured key's identity (the usage API finds keys by id, user and plan).
    pub fn identities(&self) -> impl Iterator<Item = &Arc<Identity>> {
        self.identities.iter()
    }

    /// The identity of a presented secret, if it is a known key.
    pub fn lookup(&self, secret: &[u8]) -> Option<Arc<Identity>> {
        let digest: [u8; 32] = Sha256::digest(secret).into();
        // Found by the first eight bytes, then compared whole in constant time.
        let first = prefix(&digest);
        let start = self.digests.partition_point(|d| prefix(d) < first);
        let mut found = None;
        for (i, d) in self.digests[start..].iter().enumerate() {
            if prefix(d) != first {
                break;
            }
            if bool::from(d.ct_eq(&digest)) {
                found = Some(self.identities[start + i].clone());
            }
        }
        found
    }
}

/// The key table a config reads, in a cell that every config generation since the start
/// shares: a reload puts its new table into the cell ([`Keys::adopt`]), so that a config still
/// held by an idle thread (until its next request: `crate::gateway::snapshot`) reads the new
/// keys, and the old table is freed at the swap instead of staying beside the new one.
#[derive(Debug, Clone)]
pub struct Keys(Arc<arc_swap::ArcSwap<KeyStore>>);

impl Keys {
    /// A cell of its own holding `table`.
    pub fn new(table: KeyStore) -> Keys {
        Keys::shared(Arc::new(table))
    }

    /// A cell of its own holding a table other configs may hold too.
    pub fn shared(table: Arc<KeyStore>) -> Keys {
        Keys(Arc::new(arc_swap::ArcSwap::new(table)))
    }

    /// The identity of a presented secret, if it is a known key.
    pub fn lookup(&self, secret: &[u8]) -> Option<Arc<Identity>> {
        self.0.load().lookup(secret)
    }

    /// The table in force.
    pub fn table(&self) -> Arc<KeyStore> {
        self.0.load_full()
    }

    /// Puts this config's table into `older`'s cell and reads that cell from now on: every
    /// config generation that adopted it sees the newest table. Returns the table the cell
    /// held, for the caller to free where it may take its time (a million keys take tens of
    /// milliseconds to free).
    pub fn adopt(&mut self, older: &Keys) -> Option<Arc<KeyStore>> {
        if Arc::ptr_eq(&self.0, &older.0) {
            return None;
        }
        let replaced = older.0.swap(self.0.load_full());
        self.0 = older.0.clone();
        Some(replaced)
    }
}

impl Default for Keys {
    fn default() -> Keys {
        Keys::new(KeyStore::default())
    }
}

fn prefix(digest: &[u8; 32]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(b)
}

/// SHA-256 of a secret, as stored.
pub fn digest_of(secret: &str) -> [u8; 32] {
    digest_of_bytes(secret.as_bytes())
}

/// SHA-256 of secret bytes.
pub fn digest_of_bytes(secret: &[u8]) -> [u8; 32] {
    Sha256::digest(secret).into()
}

/// The key the client presented: the configured header, else `Authorization: Bearer <key>`.
/// Returns `None` when neither is present (or the value is empty).
pub fn presented_key<'h>(headers: &'h HeaderMap, header: &HeaderName) -> Option<&'h [u8]> {
    if let Some(v) = headers.get(header) {
        let v = trim(v.as_bytes());
        if !v.is_empty() {
            return Some(v);
        }
    }
    let auth = headers.get(http::header::AUTHORIZATION)?.as_bytes();
    if auth.len() > 7 && auth[..7].eq_ignore_ascii_case(b"bearer ") {
        let v = trim(&auth[7..]);
        if !v.is_empty() {
            return Some(v);
        }
    }
    None
}

/// Whether any `Authorization` header uses the Bearer scheme (it may carry an API key).
pub fn is_bearer(headers: &HeaderMap) -> bool {
    headers
        .get_all(http::header::AUTHORIZATION)
        .iter()
        .any(|v| v.as_bytes().len() >= 6 && v.as_bytes()[..6].eq_ignore_ascii_case(b"bearer"))
}

fn trim(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &v[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> KeyStore {
        KeyStore::new(vec![ApiKey {
            digest: digest_of("test"),
            identity: Arc::new(Identity {
                id: HeaderText::new("acme-prod").unwrap(),
                user: HeaderText::new("acme").unwrap(),
                plan: HeaderText::new("pro"),
                claims: None,
            }),
        }])
    }

    #[test]
    fn finds_key_by_secret_only() {
        let s = store();
        assert_eq!(s.lookup(b"test").unwrap().id, "acme-prod");
        assert!(s.lookup(b"tes").is_none());
        assert!(s.lookup(b"").is_none());
        // The documented example digest is SHA-256("test").
        assert_eq!(
            hex::encode(digest_of("test")),
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
    }

    #[test]
    fn header_then_bearer() {
        let name = HeaderName::from_static("x-api-key");
        let mut h = HeaderMap::new();
        h.insert("authorization", "Bearer  abc ".parse().unwrap());
        assert_eq!(presented_key(&h, &name), Some(&b"abc"[..]));
        h.insert("x-api-key", "xyz".parse().unwrap());
        assert_eq!(presented_key(&h, &name), Some(&b"xyz"[..]));
        let mut basic = HeaderMap::new();
        basic.insert("authorization", "Basic Zm9v".parse().unwrap());
        assert_eq!(presented_key(&basic, &name), None);
    }
}
