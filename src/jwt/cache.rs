//! Verified tokens, kept until their `exp`, so that a caller's next request with the same
//! token costs a hash and a lookup instead of a signature check.
//!
//! Keyed by the token's SHA-256 (the token itself is never kept). Bounded in entries: a shard
//! that is full first drops its expired entries, then an arbitrary one, so a flood of distinct
//! valid tokens costs memory up to the bound and no more. An entry remembers the version of its
//! issuer's key set: a set that changed (a key rotated out) makes it a miss, checked again.

use std::sync::Arc;

use hashbrown::HashMap;
use parking_lot::Mutex;

use crate::wire::auth::Identity;

const SHARDS: usize = 16;

/// One shard: verified tokens by their SHA-256.
type Shard = Mutex<HashMap<[u8; 32], Entry>>;

/// One verified token.
#[derive(Clone)]
pub struct Entry {
    /// Who it stands for.
    pub identity: Arc<Identity>,
    /// Its `exp` (Unix seconds).
    pub exp: u64,
    /// The index of its issuer in the config's list.
    pub issuer: usize,
    /// The version of that issuer's key set it was verified with.
    pub version: u64,
}

/// The cache of one config generation's issuers.
pub struct TokenCache {
    shards: Box<[Shard]>,
    per_shard: usize,
}

impl std::fmt::Debug for TokenCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokenCache({} entries at most)", self.per_shard * SHARDS)
    }
}

impl TokenCache {
    /// A cache of about `entries` tokens (at least one per shard); zero: caching is off.
    pub fn new(entries: usize) -> TokenCache {
        let per_shard = entries.div_ceil(SHARDS);
        TokenCache {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard,
        }
    }

    fn shard(&self, digest: &[u8; 32]) -> &Shard {
        &self.shards[usize::from(digest[0]) % SHARDS]
    }

    /// The entry of `digest` if it has not expired at `now` (Unix seconds).
    pub fn get(&self, digest: &[u8; 32], now: u64) -> Option<Entry> {
        if self.per_shard == 0 {
            return None;
        }
        let mut shard = self.shard(digest).lock();
        match shard.get(digest) {
            Some(e) if e.exp > now => Some(e.clone()),
            Some(_) => {
                shard.remove(digest);
                None
            }
            None => None,
        }
    }

    /// Keeps `entry` for `digest`, making room as the bound requires.
    pub fn insert(&self, digest: [u8; 32], entry: Entry, now: u64) {
        if self.per_shard == 0 {
            return;
        }
        let mut shard = self.shard(&digest).lock();
        if shard.len() >= self.per_shard && !shard.contains_key(&digest) {
            shard.retain(|_, e| e.exp > now);
            if shard.len() >= self.per_shard {
                if let Some(victim) = shard.keys().next().copied() {
                    shard.remove(&victim);
                }
            }
        }
        shard.insert(digest, entry);
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::auth::HeaderText;

    fn entry(exp: u64) -> Entry {
        Entry {
            identity: Arc::new(Identity {
                id: HeaderText::new("u").unwrap(),
                user: HeaderText::new("u").unwrap(),
                plan: None,
                claims: None,
            }),
            exp,
            issuer: 0,
            version: 1,
        }
    }

    #[test]
    fn entries_expire_and_the_bound_holds() {
        let cache = TokenCache::new(32);
        cache.insert([1; 32], entry(100), 0);
        assert!(cache.get(&[1; 32], 99).is_some());
        assert!(cache.get(&[1; 32], 100).is_none(), "expired at exp");
        for i in 0..10_000u32 {
            let mut d = [0u8; 32];
            d[..4].copy_from_slice(&i.to_le_bytes());
            cache.insert(d, entry(1_000), 0);
        }
        assert!(cache.len() <= 32, "{} entries", cache.len());
        let off = TokenCache::new(0);
        off.insert([1; 32], entry(100), 0);
        assert!(off.get(&[1; 32], 0).is_none());
    }
}
