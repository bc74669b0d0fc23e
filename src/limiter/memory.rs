//! The in-process store: the embedded default backend and the local fallback when Redis fails.
//!
//! State lives in sharded hash maps, one `parking_lot` mutex per shard, keyed by a 64-bit hash
//! of `(rule name, key digest)`: keying by the rule's name rather than its position keeps the
//! counters across a reload that changes the rule's numbers. Two different pairs whose 64-bit
//! hashes collide share one state; with a per-process random seed the odds are about
//! `n² / 2⁶⁵` (≈ 3·10⁻⁸ with a million live keys), which we accept for 8 bytes a key.
//!
//! Everything here is synchronous and short: no lock is held beyond one call, so async callers
//! may call it directly (never across an `.await`).
//!
//! Idle keys are dropped once their state is equivalent to no state ([`algorithm::expires_at`]):
//! decisions ignore expired states at once, and the memory is reclaimed by sweeps that
//! decisions run as they go: each shard keeps its keys in 16 tables and sweeps one of them
//! every `keys / 16` operations, so each key is looked at about once per as many operations
//! as the shard holds keys (one key per operation on average) and no decision pays for more
//! than 1/16 of a shard. [`MemoryStore::sweep`] sweeps everything, for shards gone quiet.
//!
//! The number of keys is bounded by `max_keys`, split evenly among the shards; a shard that is
//! full evicts a key to make room (see [`MemoryStore::decide`]). Because keys spread over the
//! shards at random, the first evictions come a little before `max_keys` keys in all (with
//! 64 shards and a million keys, the fullest shard fills at about 99.3%): size `max_keys`
//! with headroom.

use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hashbrown::HashMap;
use parking_lot::{Mutex, MutexGuard};

use super::algorithm::{self, State, Update};
use super::{Check, Decision};

/// Where the store's time comes from, in nanoseconds. Injected so that tests and benches
/// control time exactly instead of sleeping.
pub trait Clock: Send + Sync {
    /// The current time in nanoseconds. Must never go backwards.
    fn now_ns(&self) -> u64;
}

/// The production clock: monotonic (immune to wall-clock steps), but starting from the Unix
/// time at its creation, so fixed windows line up with wall-clock seconds and minutes.
#[derive(Debug)]
pub struct MonotonicClock {
    origin: Instant,
    origin_unix_ns: u64,
}

impl MonotonicClock {
    /// A clock that reads the Unix time now and counts monotonically from there.
    pub fn new() -> Self {
        let origin_unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
            });
        MonotonicClock {
            origin: Instant::now(),
            origin_unix_ns,
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now_ns(&self) -> u64 {
        let elapsed = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.origin_unix_ns.saturating_add(elapsed)
    }
}

/// A clock that moves only when told: for tests and benches.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    /// A clock that reads `start_ns` until moved.
    pub fn new(start_ns: u64) -> Self {
        ManualClock {
            now: AtomicU64::new(start_ns),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        // fetch_update cannot fail with a closure that always returns Some.
        let _ = self
            .now
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                Some(now.saturating_add(by))
            });
    }

    /// Sets the time. Callers keep it monotonic, as [`Clock`] requires.
    pub fn set(&self, now_ns: u64) {
        self.now.store(now_ns, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.now.load(Ordering::Relaxed)
    }
}

/// At most this many shards: enough that worker threads rarely meet on one lock.
const MAX_SHARDS: usize = 64;
/// A shard is not made smaller than this many keys by splitting, so that small stores (tests,
/// tiny `max_keys`) have one exact bound instead of 64 tiny ones.
const MIN_KEYS_PER_SHARD: usize = 1024;
/// Hash tables per shard, swept one at a time so that no decision waits for a pass over a
/// whole shard (a shard of 15,000 keys takes about 80 µs; one segment, 1/16 of that).
const SEGMENTS: usize = 16;
/// A segment is swept after at least this many operations on its shard, however few keys
/// the shard holds.
const MIN_OPS_BETWEEN_SWEEPS: u64 = 8;
/// How many keys an eviction looks at to pick the one closest to expiry.
const EVICTION_SAMPLE: usize = 8;

/// The embedded store: exact, atomic per request, bounded in keys. See the module docs.
pub struct MemoryStore {
    shards: Box<[PaddedShard]>,
    hasher: ahash::RandomState,
    clock: Arc<dyn Clock>,
    evictions: AtomicU64,
    max_keys: usize,
}

/// One shard on its own cache lines, so threads working on neighbouring shards do not slow
/// each other down through the lock words (false sharing).
#[repr(align(128))]
struct PaddedShard(Mutex<Shard>);

type Table = HashMap<u64, State, BuildHasherDefault<KeyHasher>>;

/// The keys of one lock, in [`SEGMENTS`] tables so they can be swept piecemeal.
struct Shard {
    segments: [Table; SEGMENTS],
    /// Keys held in all segments.
    len: usize,
    /// Keys this shard may hold: the shards' capacities sum to `max_keys`.
    capacity: usize,
    /// Operations since the last segment was swept.
    ops_since_sweep: u64,
    /// The segment the next sweep looks at.
    next_sweep: usize,
}

/// The map's hasher: keys are already uniform 64-bit hashes, so they are their own hash.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are hashed; this keeps the hasher correct for anything else anyway.
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, key: u64) {
        self.0 = key;
    }
}

impl MemoryStore {
    /// A store of at most `max_keys` keys (at least 1) on the production [`MonotonicClock`].
    pub fn new(max_keys: usize) -> Self {
        Self::with_clock(max_keys, Arc::new(MonotonicClock::new()))
    }

    /// A store of at most `max_keys` keys (at least 1) on `clock`: tests and benches pass a
    /// [`ManualClock`].
    pub fn with_clock(max_keys: usize, clock: Arc<dyn Clock>) -> Self {
        let max_keys = max_keys.max(1);
        let count = (max_keys / MIN_KEYS_PER_SHARD)
            .clamp(1, MAX_SHARDS)
            .next_power_of_two()
            .min(MAX_SHARDS);
        let (base, extra) = (max_keys / count, max_keys % count);
        let shards = (0..count)
            .map(|index| {
                PaddedShard(Mutex::new(Shard {
                    segments: Default::default(),
                    len: 0,
                    capacity: base + usize::from(index < extra),
                    ops_since_sweep: 0,
                    next_sweep: 0,
                }))
            })
            .collect();
        MemoryStore {
            shards,
            hasher: ahash::RandomState::new(),
            clock,
            evictions: AtomicU64::new(0),
            max_keys,
        }
    }

    /// Decides every check of one request atomically: either every rule is charged or none.
    ///
    /// The shards of the checks are locked in ascending order (so concurrent requests cannot
    /// deadlock), every rule is decided, and only if all of them admit the request is each
    /// charged. When one rejects, nothing is stored: each decision still shows its rule's
    /// state, the admitting ones as if charged. Decisions come back in the order of `checks`.
    /// Two checks on the same key see each other's charge, in order.
    ///
    /// A new key in a full shard evicts another key of that shard: an expired one after a
    /// sweep if one is due, else, among a few keys, the one closest to expiry (the least
    /// counted). Evicting a live key forgets its counts, which lets that key through sooner:
    /// counted by [`MemoryStore::evictions`], to be alarmed on.
    pub fn decide(&self, checks: &[Check]) -> Vec<Decision> {
        self.run(checks, true)
    }

    /// What [`MemoryStore::decide`] would answer, without charging anything. The engine peeks
    /// at local rules before it asks the shared store, so that a request the shared store
    /// rejects has charged no local rule either.
    pub fn peek(&self, checks: &[Check]) -> Vec<Decision> {
        self.run(checks, false)
    }

    fn run(&self, checks: &[Check], charge: bool) -> Vec<Decision> {
        let now = self.clock.now_ns();
        if let [check] = checks {
            // The common case, without the bookkeeping of several shards.
            let hash = self.hash(check);
            let mut shard = self.shard(hash).lock();
            shard.ops_since_sweep += 1;
            let (decision, update) =
                algorithm::decide(shard.get(hash), &check.limit, now, check.cost);
            if decision.allowed && charge {
                self.write(&mut shard, hash, update, now, &[hash]);
            }
            shard.sweep_if_due(now);
            return vec![decision];
        }

        let hashes: Vec<u64> = checks.iter().map(|check| self.hash(check)).collect();
        let mut order: Vec<usize> = hashes.iter().map(|&hash| self.shard_index(hash)).collect();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<(usize, MutexGuard<'_, Shard>)> = order
            .iter()
            .map(|&index| (index, self.shards[index].0.lock()))
            .collect();

        // Only with a key checked twice does a check need to see an earlier one's charge.
        let repeated = hashes
            .iter()
            .enumerate()
            .any(|(i, hash)| hashes[..i].contains(hash));
        let mut pending: Vec<Option<State>> = Vec::new();
        if repeated {
            pending.resize(checks.len(), None);
        }
        let mut decisions = Vec::with_capacity(checks.len());
        let mut updates = Vec::with_capacity(checks.len());
        for (i, (check, &hash)) in checks.iter().zip(&hashes).enumerate() {
            let shard = guard(&mut guards, self.shard_index(hash));
            shard.ops_since_sweep += 1;
            let earlier = if repeated {
                hashes[..i].iter().rposition(|&h| h == hash)
            } else {
                None
            };
            let stored = match earlier {
                Some(j) => pending[j].as_ref(),
                None => shard.get(hash),
            };
            let (decision, update) = algorithm::decide(stored, &check.limit, now, check.cost);
            if repeated {
                pending[i] = charged(stored.cloned(), update.clone());
            }
            decisions.push(decision);
            updates.push(update);
        }

        if charge && decisions.iter().all(|decision| decision.allowed) {
            for (&hash, update) in hashes.iter().zip(updates) {
                let shard = guard(&mut guards, self.shard_index(hash));
                self.write(shard, hash, update, now, &hashes);
            }
        }
        for (_, shard) in &mut guards {
            shard.sweep_if_due(now);
        }
        decisions
    }

    /// Gives back a concurrency slot taken by `check` (same rule, key and cost) when its
    /// exchange ends. A key with nothing left in flight is dropped. Does nothing if the key is
    /// gone (evicted) or the rule is no longer a concurrency rule.
    pub fn release(&self, check: &Check) {
        let hash = self.hash(check);
        let mut shard = self.shard(hash).lock();
        if let Some(state) = shard.get_mut(hash) {
            if algorithm::release(state, check.cost) {
                shard.remove(hash);
            }
        }
    }

    /// Drops every expired key now, one segment at a time (each lock held for one pass over
    /// 1/16 of a shard). Optional: decisions already sweep as they go; a periodic call returns
    /// the memory of keys that went idle in shards that see no traffic any more.
    pub fn sweep(&self) {
        let now = self.clock.now_ns();
        for shard in self.shards.iter() {
            for segment in 0..SEGMENTS {
                shard.0.lock().sweep(segment, now);
            }
        }
    }

    /// Keys held, expired ones not yet swept included. Locks each shard in turn: for metrics,
    /// not for the request path.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|shard| shard.0.lock().len).sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most keys the store holds.
    pub fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// Live keys evicted to make room for new ones since the store was created. Each one had
    /// its counts forgotten: a steadily growing number means `max_keys` is too small.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    fn hash(&self, check: &Check) -> u64 {
        self.hasher.hash_one((&*check.rule, check.key))
    }

    /// The shard of a key: bits 32 to 37 of its hash (segments use the next bits; hashbrown
    /// places a key by its low bits and tags it with its top 7, which must stay varied).
    fn shard_index(&self, hash: u64) -> usize {
        (hash >> 32) as usize & (self.shards.len() - 1)
    }

    fn shard(&self, hash: u64) -> &Mutex<Shard> {
        &self.shards[self.shard_index(hash)].0
    }

    /// Charges one admitted check to its key, making room for a new key if the shard is full.
    /// `protected` are the keys of the request being charged, never evicted by it.
    fn write(&self, shard: &mut Shard, hash: u64, update: Update, now: u64, protected: &[u64]) {
        if let Some(state) = shard.get_mut(hash) {
            update.apply(state);
            return;
        }
        let Some(state) = update.into_state() else {
            return;
        };
        if shard.len >= shard.capacity {
            // Expired keys make room without forgetting anything.
            shard.sweep_if_due(now);
        }
        while shard.len >= shard.capacity {
            match shard.evict(hash, now, protected) {
                Some(true) => {
                    self.evictions.fetch_add(1, Ordering::Relaxed);
                }
                Some(false) => {}
                // Only keys of this request left: hold one more than the capacity rather
                // than lose a charge; the next insertion gets back under it.
                None => break,
            }
        }
        shard.insert(hash, state);
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.shards.len())
            .field("max_keys", &self.max_keys)
            .field("evictions", &self.evictions())
            .finish_non_exhaustive()
    }
}

/// The guard of shard `index`. Every shard of the request was locked, so it is always found
/// (the default position only spares an `unwrap`).
fn guard<'a, 'g>(guards: &'a mut [(usize, MutexGuard<'g, Shard>)], index: usize) -> &'a mut Shard {
    let position = guards
        .iter()
        .position(|(locked, _)| *locked == index)
        .unwrap_or_default();
    &mut guards[position].1
}

/// The state after charging `update` to `state` (the tentative state a repeated key shows to
/// its later checks).
fn charged(state: Option<State>, update: Update) -> Option<State> {
    match state {
        Some(mut state) => {
            update.apply(&mut state);
            Some(state)
        }
        None => update.into_state(),
    }
}

impl Shard {
    /// The segment of a key: bits 38 to 41 of its hash, independent of the shard's.
    fn segment(hash: u64) -> usize {
        (hash >> 38) as usize % SEGMENTS
    }

    fn get(&self, hash: u64) -> Option<&State> {
        self.segments[Self::segment(hash)].get(&hash)
    }

    fn get_mut(&mut self, hash: u64) -> Option<&mut State> {
        self.segments[Self::segment(hash)].get_mut(&hash)
    }

    /// Adds a key the shard does not hold.
    fn insert(&mut self, hash: u64, state: State) {
        if self.segments[Self::segment(hash)]
            .insert(hash, state)
            .is_none()
        {
            self.len += 1;
        }
    }

    fn remove(&mut self, hash: u64) {
        if self.segments[Self::segment(hash)].remove(&hash).is_some() {
            self.len -= 1;
        }
    }

    /// Sweeps the next segment once the shard has seen as many operations since the last
    /// sweep as a segment holds keys: each key is then looked at about once per as many
    /// operations as the shard holds keys, one key per operation on average, and no
    /// operation pays for more than one segment.
    fn sweep_if_due(&mut self, now: u64) {
        let period = ((self.len / SEGMENTS) as u64).max(MIN_OPS_BETWEEN_SWEEPS);
        if self.ops_since_sweep >= period {
            let segment = self.next_sweep;
            self.next_sweep = (segment + 1) % SEGMENTS;
            self.sweep(segment, now);
        }
    }

    /// Drops the expired keys of one segment, and gives back the memory of a table left
    /// mostly empty (after a burst of keys that went idle): hash tables never shrink alone.
    fn sweep(&mut self, segment: usize, now: u64) {
        let table = &mut self.segments[segment];
        let before = table.len();
        table.retain(|_, state| algorithm::expires_at(state) > now);
        let after = table.len();
        if table.capacity() > 64 && table.capacity() > 4 * after {
            table.shrink_to(2 * after);
        }
        self.len -= before - after;
        self.ops_since_sweep = 0;
    }

    /// Removes one key to make room for `hash`: an expired one if the sample holds one, else
    /// the one that expires first. `Some(true)`: a live key was evicted; `Some(false)`: an
    /// expired key was dropped; `None`: nothing could be removed.
    ///
    /// The sample is the first keys in table order, starting with the new key's segment: keys
    /// sit at positions given by their hash, so that is a random sample, at no cost.
    fn evict(&mut self, hash: u64, now: u64, protected: &[u64]) -> Option<bool> {
        let first = Self::segment(hash);
        let (victim, expires) = (0..SEGMENTS)
            .flat_map(|offset| self.segments[(first + offset) % SEGMENTS].iter())
            .filter(|(key, _)| !protected.contains(key))
            .take(EVICTION_SAMPLE)
            .map(|(&key, state)| (key, algorithm::expires_at(state)))
            .min_by_key(|&(_, expires)| expires)?;
        self.remove(victim);
        Some(expires > now)
    }
}

#[cfg(test)]
mod tests;
