//! The Space-Saving heavy-hitters sketch (Metwally, Agrawal, El Abbadi, 2005) that `/top`
//! counts clients with: at most k counters whatever the number of distinct clients.

use std::hash::{BuildHasher, Hasher};

/// The streaming heavy-hitters sketch (Space-Saving) over client hashes, each held client with
/// a label of type `L`.
///
/// Guarantee, for N = [`SpaceSaving::total`] and k = its capacity: every key whose true count
/// is more than N/k is held; a held key's count is at least its true count, and at most
/// `error` (≤ N/k) above it. It never holds more than k counters.
#[derive(Debug, Clone)]
pub struct SpaceSaving<L> {
    capacity: usize,
    hashes: Vec<u64>,
    counts: Vec<u64>,
    errors: Vec<u64>,
    labels: Vec<L>,
    index: hashbrown::HashMap<u64, u32, Mix>,
    total: u64,
}

/// A hasher for keys that are already hashes: one multiply spreads their bits for the table.
#[derive(Debug, Clone, Copy, Default)]
struct Mix;

impl BuildHasher for Mix {
    type Hasher = MixHasher;
    fn build_hasher(&self) -> MixHasher {
        MixHasher(0)
    }
}

/// See [`Mix`].
#[derive(Debug, Default)]
struct MixHasher(u64);

impl Hasher for MixHasher {
    fn finish(&self) -> u64 {
        self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(26)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) ^ u64::from(*b) ^ (self.0 >> 56);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

impl<L: Clone> SpaceSaving<L> {
    /// An empty sketch of `capacity` counters (at least one). Allocates nothing until used.
    pub fn new(capacity: usize) -> Self {
        SpaceSaving {
            capacity: capacity.max(1),
            hashes: Vec::new(),
            counts: Vec::new(),
            errors: Vec::new(),
            labels: Vec::new(),
            index: hashbrown::HashMap::with_hasher(Mix),
            total: 0,
        }
    }

    /// Counts `weight` for `hash`; `label` is called only when the key is not held yet.
    pub fn offer(&mut self, hash: u64, weight: u64, label: impl FnOnce() -> L) {
        self.total += weight;
        if let Some(&i) = self.index.get(&hash) {
            self.counts[i as usize] += weight;
            return;
        }
        if self.counts.len() < self.capacity {
            self.index.insert(hash, self.counts.len() as u32);
            self.hashes.push(hash);
            self.counts.push(weight);
            self.errors.push(0);
            self.labels.push(label());
            return;
        }
        // Full: the newcomer takes the smallest counter and its count, which bounds how much
        // of the newcomer's count may be someone else's.
        let mut min = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            if c < self.counts[min] {
                min = i;
            }
        }
        self.index.remove(&self.hashes[min]);
        self.index.insert(hash, min as u32);
        self.hashes[min] = hash;
        self.errors[min] = self.counts[min];
        self.counts[min] += weight;
        self.labels[min] = label();
    }

    /// `(count, error)` of `hash` if held: its true count is in `count - error ..= count`.
    pub fn get(&self, hash: u64) -> Option<(u64, u64)> {
        let i = *self.index.get(&hash)? as usize;
        Some((self.counts[i], self.errors[i]))
    }

    /// An upper bound of the true count of any key that is not held: the smallest count when
    /// full, else 0 (a sketch that never evicted has seen every key it did not hold 0 times).
    pub fn floor(&self) -> u64 {
        if self.counts.len() < self.capacity {
            0
        } else {
            self.counts.iter().copied().min().unwrap_or(0)
        }
    }

    /// Total weight offered (N).
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Entries of the hash index (held clients: tests check it never outgrows the capacity).
    #[cfg(test)]
    pub(crate) fn indexed(&self) -> usize {
        self.index.len()
    }

    /// Counters held now (never more than the capacity).
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// k.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Every held key: `(hash, count, error, label)`.
    pub fn entries(&self) -> impl Iterator<Item = (u64, u64, u64, &L)> + '_ {
        (0..self.counts.len()).map(|i| {
            (
                self.hashes[i],
                self.counts[i],
                self.errors[i],
                &self.labels[i],
            )
        })
    }

    /// Forgets everything, keeping the allocations for the next bucket.
    pub fn clear(&mut self) {
        self.hashes.clear();
        self.counts.clear();
        self.errors.clear();
        self.labels.clear();
        self.index.clear();
        self.total = 0;
    }
}
