//! The in-process store: the embedded default backend and the local fallback when Redis fails.
//!
//! State lives in sharded hash maps, one `parking_lot` mutex per shard. Within a shard each
//! rule has its own tables, found by a 64-bit hash of the rule's name, and a key's state is
//! found in them by a 64-bit hash of `(rule, counter id)`: keying by the rule's name rather
//! than its position keeps the counters across a reload that changes the rule's numbers. Two
//! keys of one rule whose 64-bit hashes collide share one state; with a per-process random
//! seed the odds are about `n² / 2⁶⁵` (≈ 3·10⁻⁸ with a million live keys), which we accept for
//! 8 bytes a key.
//!
//! Everything here is synchronous and short: no lock is held beyond one call, so async callers
//! may call it directly (never across an `.await`).
//!
//! Idle keys are dropped once their state is equivalent to no state ([`algorithm::expires_at`]):
//! decisions ignore expired states at once, and the memory is reclaimed by sweeps that
//! decisions run as they go: each rule keeps its keys of a shard in 16 tables and the shard
//! sweeps one sixteenth of its keys every `keys / 16` operations, so each key is looked at
//! about once per as many operations as the shard holds keys (one key per operation on
//! average) and no decision pays for more than 1/16 of a shard. [`MemoryStore::sweep`] sweeps
//! everything, for shards gone quiet.
//!
//! # Eviction
//!
//! The number of keys is bounded by `max_keys`, split evenly among the shards; a shard that is
//! full makes room for a new key by dropping another one. An evicted live key has its counts
//! forgotten, which lets that client through sooner, so an attacker who can mint keys (a rule
//! keyed on a header they choose) must not be able to pick whose counts are forgotten. Two
//! rules decide the victim (see [`MemoryStore::decide`]):
//!
//! 1. **Fair shares between rules.** The key is taken from the rule that holds the most keys
//!    in the shard; on a tie, from the rule inserting. This is max-min fairness: with `R`
//!    rules holding keys in a shard of capacity `C`, a rule holding at most `C / R` keys there
//!    is never the one that gives a key up to another rule, so one rule's flood of new keys
//!    only ever evicts its own keys once it holds the largest share. A rule that holds more
//!    than its share gives keys back to a growing rule until the two are level.
//! 2. **Limited keys last.** Within that rule, an expired key goes first (nothing is
//!    forgotten), then the key closest to expiry among those that are *not limiting*: whose
//!    state would admit the rule's next request. A key whose state would reject it (no quota
//!    left, or within a blocking period), or that holds concurrency slots in flight, is
//!    evicted only if the 64 keys of the rule looked at are all like that; then the one that
//!    stops limiting first goes. If the largest rule has only such keys, the inserting rule
//!    gives up one of its own non-limiting keys instead.
//!
//! Whether a key is limiting is judged with the rule's numbers as of the last new key it
//! stored in the shard: the store keeps no rule-specific data per key, so its memory per key
//! is unchanged. The sample is the first keys in table order, starting with a random segment:
//! keys sit at positions given by their hash, so that is a random sample, at no cost.
//!
//! Every eviction of a live key is counted per rule ([`MemoryStore::evictions_of`], and the
//! `floodgate_memory_store_evictions_total{rule}` counter), to be alarmed on.
//!
//! Shares are per shard: keys spread over the shards at random, so a rule is within its share
//! of `max_keys` in every shard up to random fluctuation, and the first evictions come a
//! little before `max_keys` keys in all (with 64 shards and a million keys, the fullest shard
//! fills at about 99.3%): size `max_keys` with headroom. Tables per rule and shard cost about
//! 0.6 KB each, for the rules holding keys in a shard; a rule's tables are dropped once it
//! holds no key there.

use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hashbrown::HashMap;
use parking_lot::{Mutex, MutexGuard};
use prometheus::IntCounter;

use super::algorithm::{self, State, Update};
use super::{Check, Decision, Limit};

/// Where the limiter's time comes from. Injected so that tests and benches control time
/// exactly instead of sleeping: the stores read [`Clock::now_ns`], the engine (quota leases,
/// shaping waits, store-failure log pacing) reads both.
pub trait Clock: Send + Sync {
    /// The current time in nanoseconds. Must never go backwards.
    fn now_ns(&self) -> u64;

    /// The same time as an [`Instant`]: what deadlines kept in process (a lease's end, a
    /// shaping wait's end) are measured in. Moves exactly as [`Clock::now_ns`] does.
    fn instant(&self) -> Instant;
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

    fn instant(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told: for tests and benches.
#[derive(Debug)]
pub struct ManualClock {
    now: AtomicU64,
    /// What [`Clock::instant`] reads while the clock reads `start_ns`: an `Instant` cannot be
    /// made from a number, only moved from one taken once.
    origin: Instant,
    start_ns: u64,
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new(0)
    }
}

impl ManualClock {
    /// A clock that reads `start_ns` until moved.
    pub fn new(start_ns: u64) -> Self {
        ManualClock {
            now: AtomicU64::new(start_ns),
            origin: Instant::now(),
            start_ns,
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

    fn instant(&self) -> Instant {
        // Set below its start (which `Clock` forbids anyway), it reads its start.
        let moved = self.now_ns().saturating_sub(self.start_ns);
        self.origin + Duration::from_nanos(moved)
    }
}

/// At most this many shards: enough that worker threads rarely meet on one lock.
const MAX_SHARDS: usize = 64;
/// A shard is not made smaller than this many keys by splitting, so that small stores (tests,
/// tiny `max_keys`) have one exact bound instead of 64 tiny ones.
const MIN_KEYS_PER_SHARD: usize = 1024;
/// Hash tables per rule and shard, swept one at a time so that no decision waits for a pass
/// over a whole shard (a shard of 15,000 keys takes about 80 µs; one segment, 1/16 of that).
const SEGMENTS: usize = 16;
/// A segment is swept after at least this many operations on its shard, however few keys
/// the shard holds.
const MIN_OPS_BETWEEN_SWEEPS: u64 = 8;
/// How many keys an eviction compares to pick the one closest to expiry.
const EVICTION_SAMPLE: usize = 8;
/// How many keys of a rule an eviction looks at, at most, for one that is not limiting
/// before it settles for a limiting one: bounds the work a store full of exhausted keys
/// costs each new key.
const EVICTION_SCAN: usize = 64;

/// The embedded store: exact, atomic per request, bounded in keys. See the module docs.
pub struct MemoryStore {
    shards: Box<[PaddedShard]>,
    hasher: ahash::RandomState,
    clock: Arc<dyn Clock>,
    evictions: AtomicU64,
    /// Evictions per rule name, shared by the shards (each resolves a rule's entry once, when
    /// the rule first stores a key there).
    rule_evictions: Mutex<std::collections::HashMap<Arc<str>, Arc<RuleEvictions>>>,
    max_keys: usize,
    /// Keys refused by a `block_for` rule until their ban ends: a table of its own, bounded
    /// apart from the counters (see `blocks`).
    blocks: blocks::Blocks,
    /// When a usage reset last started a key over (see [`epochs`]).
    epochs: epochs::Epochs,
    /// Usage changes made with an idempotency key (see [`usage`]).
    idempotent: usage::Remembered,
    /// Bans not kept (or evicted) because the ban table was full.
    bans_dropped: AtomicU64,
}

/// The evictions of one rule: this store's count and the process-wide metric.
struct RuleEvictions {
    count: AtomicU64,
    metric: IntCounter,
}

impl RuleEvictions {
    fn record(&self) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.metric.inc();
    }
}

/// One shard on its own cache lines, so threads working on neighbouring shards do not slow
/// each other down through the lock words (false sharing).
#[repr(align(128))]
struct PaddedShard(Mutex<Shard>);

/// The decisions of one in-process call, inline up to two (no allocation for most requests).
pub(crate) type Decisions = smallvec::SmallVec<[Decision; 2]>;

type Table = HashMap<u64, State, BuildHasherDefault<KeyHasher>>;

/// The keys of one lock, per rule, so that evictions can be charged to the rule that holds
/// the most (module docs).
struct Shard {
    /// The rules holding keys in this shard.
    rules: Vec<RuleKeys>,
    /// Position in `rules` by rule id (the hash of the rule's name).
    index: HashMap<u64, usize, BuildHasherDefault<KeyHasher>>,
    /// Keys held by all rules.
    len: usize,
    /// Keys this shard may hold: the shards' capacities sum to `max_keys`.
    capacity: usize,
    /// Operations since the last segment was swept.
    ops_since_sweep: u64,
    /// The segment the next sweep looks at.
    next_sweep: usize,
}

/// One rule's keys in one shard, in [`SEGMENTS`] tables so they can be swept piecemeal.
struct RuleKeys {
    id: u64,
    segments: [Table; SEGMENTS],
    /// Keys held in all segments.
    len: usize,
    /// The rule's numbers and cost when it last stored a new key here: what an eviction asks
    /// a key's state whether the rule's next request would be rejected.
    limit: Limit,
    cost: u64,
    evictions: Arc<RuleEvictions>,
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

/// Where a check's state lives: its rule's id and its key's hash.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Slot {
    rule: u64,
    hash: u64,
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
                    rules: Vec::new(),
                    index: HashMap::default(),
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
            rule_evictions: Mutex::new(std::collections::HashMap::new()),
            max_keys,
            blocks: blocks::Blocks::new(max_keys),
            epochs: epochs::Epochs::default(),
            idempotent: usage::Remembered::default(),
            bans_dropped: AtomicU64::new(0),
        }
    }

    /// What is left of `check`'s block (`block_for`) at `now`, if its key is blocked.
    fn block_left(&self, check: &Check, slot: Slot, now: u64) -> Option<u64> {
        if check.limit.block_for().is_zero() {
            return None;
        }
        self.blocks.left((slot.rule, slot.hash), now)
    }

    /// Blocks `check`'s key, which its rule just rejected in `decision`, if the rule
    /// blocks: the rejection then says to retry when the block ends.
    fn block_after(&self, check: &Check, slot: Slot, now: u64, decision: &mut Decision) {
        let block_for = check.limit.block_for();
        let for_ns = algorithm::sat(block_for.as_nanos());
        if for_ns > 0 {
            self.ban(slot, now, for_ns);
            decision.retry_after = decision.retry_after.max(block_for);
            decision.reset = decision.reset.max(block_for);
        }
    }

    /// Bans the key of `slot` for `for_ns` from `now`, counting a ban the full table dropped.
    fn ban(&self, slot: Slot, now: u64, for_ns: u64) {
        if let Some(dropped) = self.blocks.block((slot.rule, slot.hash), now, for_ns) {
            self.bans_dropped.fetch_add(1, Ordering::Relaxed);
            crate::metrics::metrics()
                .bans_dropped
                .with_label_values(&[dropped.as_str()])
                .inc();
        }
    }

    /// Keys banned by `block_for` rules now (ended bans included until swept).
    pub fn blocked_keys(&self) -> usize {
        self.blocks.len()
    }

    /// Sets the most bans the store holds at once (`[store] max_bans`; at least 1). A store
    /// starts with as many as it holds keys.
    pub fn set_max_bans(&self, max_bans: usize) {
        self.blocks.set_max(max_bans);
    }

    /// The most bans the store holds at once.
    pub fn max_bans(&self) -> usize {
        self.blocks.max()
    }

    /// Bans dropped because the ban table was full, since the store was created: new bans not
    /// kept and live bans evicted for another rule's (see `blocks`).
    pub fn bans_dropped(&self) -> u64 {
        self.bans_dropped.load(Ordering::Relaxed)
    }

    /// Lifts the `block_for` ban of `check`'s key (the usage API's reset); whether a live ban
    /// was lifted.
    pub fn lift_ban(&self, check: &Check) -> bool {
        let slot = self.slot(check);
        self.blocks
            .lift((slot.rule, slot.hash), self.clock.now_ns())
    }

    /// What is left of the `block_for` ban of `check`'s key, if its rule bans and the key is
    /// banned.
    pub fn ban_left(&self, check: &Check) -> Option<Duration> {
        let now = self.clock.now_ns();
        self.block_left(check, self.slot(check), now)
            .map(Duration::from_nanos)
    }

    /// Remembers a ban another store (Redis) answered for `check`'s key: refused for `left`
    /// from now. What the engine enforces while that store cannot be asked.
    pub fn remember_ban(&self, check: &Check, left: Duration) {
        let for_ns = algorithm::sat(left.as_nanos());
        if for_ns > 0 && !check.limit.block_for().is_zero() {
            self.ban(self.slot(check), self.clock.now_ns(), for_ns);
        }
    }

    /// The decision of `check` while its key is banned for `left` more.
    pub fn banned(check: &Check, left: Duration) -> Decision {
        blocks::blocked(check, algorithm::sat(left.as_nanos()))
    }

    /// Decides every check of one request atomically: either every rule is charged or none.
    ///
    /// The shards of the checks are locked in ascending order (so concurrent requests cannot
    /// deadlock), every rule is decided, and only if all of them admit the request is each
    /// charged. When one rejects, nothing is stored: each decision still shows its rule's
    /// state, the admitting ones as if charged. Decisions come back in the order of `checks`.
    /// Two checks on the same key see each other's charge, in order.
    ///
    /// A new key in a full shard evicts another key of that shard (module docs): an expired
    /// one after a sweep if one is due, else a key of the rule holding the most keys there,
    /// the one closest to expiry among a few that are not limiting. Evicting a live key
    /// forgets its counts, which lets that key through sooner: counted per rule by
    /// [`MemoryStore::evictions_of`], to be alarmed on. The keys of the request being charged
    /// are never evicted by it.
    pub fn decide(&self, checks: &[Check]) -> Vec<Decision> {
        self.run(checks, true).into_vec()
    }

    /// [`MemoryStore::decide`], its decisions kept inline: what the engine calls per request
    /// (most requests meet a rule or two, which then need no allocation).
    pub(crate) fn decide_inline(&self, checks: &[Check]) -> Decisions {
        self.run(checks, true)
    }

    /// What [`MemoryStore::decide`] would answer, without charging anything. The engine peeks
    /// at local rules before it asks the shared store, so that a request the shared store
    /// rejects has charged no local rule either.
    pub fn peek(&self, checks: &[Check]) -> Vec<Decision> {
        self.run(checks, false).into_vec()
    }

    fn run(&self, checks: &[Check], charge: bool) -> Decisions {
        let now = self.clock.now_ns();
        if let [check] = checks {
            // The common case, without the bookkeeping of several shards.
            let slot = self.slot(check);
            // A blocked key is refused before its counter is read (nothing is charged).
            if let Some(left) = self.block_left(check, slot, now) {
                return smallvec::smallvec![blocks::blocked(check, left)];
            }
            let mut shard = self.shard(slot.hash).lock();
            shard.ops_since_sweep += 1;
            let position = shard.position(slot.rule);
            let stored = shard.state(position, slot.hash);
            let (decision, update) = algorithm::decide(stored, &check.limit, now, check.cost);
            if decision.allowed && charge {
                self.write(&mut shard, check, slot, position, update, now, &[slot.hash]);
            }
            shard.sweep_if_due(now);
            drop(shard);
            let mut decision = decision;
            if !decision.allowed {
                self.block_after(check, slot, now, &mut decision);
            }
            return smallvec::smallvec![decision];
        }

        let slots: Vec<Slot> = checks.iter().map(|check| self.slot(check)).collect();
        let blocked: Vec<Option<u64>> = checks
            .iter()
            .zip(&slots)
            .map(|(check, &slot)| self.block_left(check, slot, now))
            .collect();
        let hashes: Vec<u64> = slots.iter().map(|slot| slot.hash).collect();
        let mut order: Vec<usize> = hashes.iter().map(|&hash| self.shard_index(hash)).collect();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<(usize, MutexGuard<'_, Shard>)> = order
            .iter()
            .map(|&index| (index, self.shards[index].0.lock()))
            .collect();

        // Only with a key checked twice does a check need to see an earlier one's charge.
        let repeated = slots
            .iter()
            .enumerate()
            .any(|(i, slot)| slots[..i].contains(slot));
        let mut pending: Vec<Option<State>> = Vec::new();
        if repeated {
            pending.resize(checks.len(), None);
        }
        let mut decisions = Decisions::with_capacity(checks.len());
        let mut updates = Vec::with_capacity(checks.len());
        for (i, (check, &slot)) in checks.iter().zip(&slots).enumerate() {
            let shard = guard(&mut guards, self.shard_index(slot.hash));
            shard.ops_since_sweep += 1;
            let earlier = if repeated {
                slots[..i].iter().rposition(|&s| s == slot)
            } else {
                None
            };
            let stored = match earlier {
                Some(j) => pending[j].as_ref(),
                None => shard.get(slot),
            };
            let (decision, update) = match blocked[i] {
                Some(left) => (blocks::blocked(check, left), Update::Nothing),
                None => algorithm::decide(stored, &check.limit, now, check.cost),
            };
            if repeated {
                pending[i] = charged(stored.cloned(), update.clone());
            }
            decisions.push(decision);
            updates.push(update);
        }

        if charge && decisions.iter().all(|decision| decision.allowed) {
            for ((check, &slot), update) in checks.iter().zip(&slots).zip(updates) {
                let shard = guard(&mut guards, self.shard_index(slot.hash));
                // Looked up again: an earlier write may have swept, which moves positions.
                let position = shard.position(slot.rule);
                self.write(shard, check, slot, position, update, now, &hashes);
            }
        }
        for (_, shard) in &mut guards {
            shard.sweep_if_due(now);
        }
        drop(guards);
        for (i, (check, d)) in checks.iter().zip(&mut decisions).enumerate() {
            if !d.allowed && blocked[i].is_none() {
                self.block_after(check, slots[i], now, d);
            }
        }
        decisions
    }

    /// Gives back a concurrency slot taken by `check` (same rule, key and cost) when its
    /// exchange ends. A key with nothing left in flight is dropped. Does nothing if the key is
    /// gone (evicted) or the rule is no longer a concurrency rule.
    pub fn release(&self, check: &Check) {
        let slot = self.slot(check);
        let mut shard = self.shard(slot.hash).lock();
        if let Some(state) = shard.get_mut(slot) {
            if algorithm::release(state, check.cost) {
                shard.remove(slot);
            }
        }
    }

    /// Trues up the reservation `check` made at `charged_at_ns` (see
    /// [`super::true_up`]): refunds or charges on top, in the window it was charged in.
    /// Returns whether the key still held that charge (evicted, its window over, or reset by
    /// the usage API since: nothing is done).
    pub fn true_up(
        &self,
        check: &Check,
        charged_at_ns: u64,
        adjust: super::true_up::Adjust,
    ) -> bool {
        let now = self.clock.now_ns();
        let slot = self.slot(check);
        let mut shard = self.shard(slot.hash).lock();
        // Read under the shard's lock, which a reset holds while it starts the new epoch.
        if !self.epochs.current((slot.rule, slot.hash), charged_at_ns) {
            return false;
        }
        shard.get_mut(slot).is_some_and(|state| {
            super::true_up::true_up(state, &check.limit, now, charged_at_ns, adjust)
        })
    }

    /// The store's time now (what a reservation records as the instant it was charged).
    pub fn now_ns(&self) -> u64 {
        self.clock.now_ns()
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
        self.blocks.sweep(now);
        self.epochs.sweep(now);
        self.idempotent.sweep(now);
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

    /// Live keys evicted to make room for new ones since the store was created, all rules
    /// together. Each one had its counts forgotten: a steadily growing number means
    /// `max_keys` is too small, or a client is minting keys.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Live keys of rule `rule` evicted since the store was created (see
    /// [`MemoryStore::evictions`]). The process-wide metric
    /// `floodgate_memory_store_evictions_total{rule}` counts the same, over every store.
    pub fn evictions_of(&self, rule: &str) -> u64 {
        self.rule_evictions
            .lock()
            .get(rule)
            .map_or(0, |entry| entry.count.load(Ordering::Relaxed))
    }

    /// Where `check`'s state lives. The rule's id is hashed apart from the key so that a
    /// shard can keep each rule's keys in their own tables.
    fn slot(&self, check: &Check) -> Slot {
        let rule = self.hasher.hash_one(&*check.rule);
        Slot {
            rule,
            hash: self.hasher.hash_one((rule, check.counter)),
        }
    }

    /// The shard of a key: bits 32 to 37 of its hash (segments use the next bits; hashbrown
    /// places a key by its low bits and tags it with its top 7, which must stay varied).
    fn shard_index(&self, hash: u64) -> usize {
        (hash >> 32) as usize & (self.shards.len() - 1)
    }

    fn shard(&self, hash: u64) -> &Mutex<Shard> {
        &self.shards[self.shard_index(hash)].0
    }

    /// The eviction counters of rule `name`, created on first use.
    fn rule_evictions(&self, name: &Arc<str>) -> Arc<RuleEvictions> {
        self.rule_evictions
            .lock()
            .entry(name.clone())
            .or_insert_with(|| {
                Arc::new(RuleEvictions {
                    count: AtomicU64::new(0),
                    metric: crate::metrics::metrics()
                        .memory_evictions
                        .with_label_values(&[name]),
                })
            })
            .clone()
    }

    /// Charges one admitted check to its key, making room for a new key if the shard is full.
    /// `position` is the rule's in the shard, looked up since the last sweep (the caller
    /// already needed it, and this spares a second lookup on the common path). `protected`
    /// are the keys of the request being charged, never evicted by it.
    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        shard: &mut Shard,
        check: &Check,
        slot: Slot,
        position: Option<usize>,
        update: Update,
        now: u64,
        protected: &[u64],
    ) {
        if let Some(state) = position.and_then(|rule| shard.rules[rule].get_mut(slot.hash)) {
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
        // No sweep (which may drop a rule's tables) runs between here and the insertion, so
        // the position stays valid.
        let rule = match shard.index.get(&slot.rule) {
            Some(&rule) => rule,
            None => shard.add_rule(slot.rule, self.rule_evictions(&check.rule), check),
        };
        let keys = &mut shard.rules[rule];
        if keys.limit != check.limit || keys.cost != check.cost {
            keys.limit = check.limit.clone();
            keys.cost = check.cost;
        }
        while shard.len >= shard.capacity {
            match shard.evict(rule, slot.hash, now, protected) {
                Some(Evicted::Live(victim)) => {
                    self.evictions.fetch_add(1, Ordering::Relaxed);
                    shard.rules[victim].evictions.record();
                }
                Some(Evicted::Expired) => {}
                // Only keys of this request left: hold one more than the capacity rather
                // than lose a charge; the next insertion gets back under it.
                None => break,
            }
        }
        shard.insert(rule, slot.hash, state);
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

/// What an eviction removed.
enum Evicted {
    /// A live key of the rule at this position in the shard: its counts are forgotten.
    Live(usize),
    /// An expired key: nothing is forgotten.
    Expired,
}

/// The key a rule would give up.
#[derive(Clone, Copy)]
enum Candidate {
    /// Expired: free to drop.
    Expired(u64),
    /// Live but not limiting: its next request would be admitted anyway.
    Open(u64),
    /// Limiting (or holding concurrency slots): dropping it lets a limited client through.
    Limiting(u64),
}

impl Shard {
    /// The segment of a key: bits 38 to 41 of its hash, independent of the shard's.
    fn segment(hash: u64) -> usize {
        (hash >> 38) as usize % SEGMENTS
    }

    /// The position of rule `id` in `rules`, if it holds keys here. Valid until a sweep.
    fn position(&self, id: u64) -> Option<usize> {
        self.index.get(&id).copied()
    }

    /// The state of key `hash` of the rule at `position`.
    fn state(&self, position: Option<usize>, hash: u64) -> Option<&State> {
        self.rules[position?].segments[Self::segment(hash)].get(&hash)
    }

    fn get(&self, slot: Slot) -> Option<&State> {
        self.state(self.position(slot.rule), slot.hash)
    }

    fn get_mut(&mut self, slot: Slot) -> Option<&mut State> {
        let rule = self.position(slot.rule)?;
        self.rules[rule].get_mut(slot.hash)
    }

    /// Makes room for the keys of a rule new to this shard; returns its position.
    fn add_rule(&mut self, id: u64, evictions: Arc<RuleEvictions>, check: &Check) -> usize {
        self.rules.push(RuleKeys {
            id,
            segments: Default::default(),
            len: 0,
            limit: check.limit.clone(),
            cost: check.cost,
            evictions,
        });
        let position = self.rules.len() - 1;
        self.index.insert(id, position);
        position
    }

    /// Adds a key the shard does not hold to the rule at position `rule`.
    fn insert(&mut self, rule: usize, hash: u64, state: State) {
        let keys = &mut self.rules[rule];
        if keys.segments[Self::segment(hash)]
            .insert(hash, state)
            .is_none()
        {
            keys.len += 1;
            self.len += 1;
        }
    }

    fn remove(&mut self, slot: Slot) {
        if let Some(&rule) = self.index.get(&slot.rule) {
            self.remove_at(rule, slot.hash);
        }
    }

    fn remove_at(&mut self, rule: usize, hash: u64) {
        let keys = &mut self.rules[rule];
        if keys.segments[Self::segment(hash)].remove(&hash).is_some() {
            keys.len -= 1;
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

    /// Drops the expired keys of one segment of every rule, gives back the memory of a table
    /// left mostly empty (after a burst of keys that went idle: hash tables never shrink
    /// alone), and drops the tables of rules left with no key.
    fn sweep(&mut self, segment: usize, now: u64) {
        let mut emptied = false;
        for keys in &mut self.rules {
            let table = &mut keys.segments[segment];
            let before = table.len();
            table.retain(|_, state| algorithm::expires_at(state) > now);
            let after = table.len();
            if table.capacity() > 64 && table.capacity() > 4 * after {
                table.shrink_to(2 * after);
            }
            keys.len -= before - after;
            self.len -= before - after;
            emptied |= keys.len == 0;
        }
        if emptied {
            self.rules.retain(|keys| keys.len > 0);
            self.index.clear();
            for (position, keys) in self.rules.iter().enumerate() {
                self.index.insert(keys.id, position);
            }
        }
        self.ops_since_sweep = 0;
    }

    /// Removes one key to make room for `hash`, a new key of the rule at position `inserting`
    /// (module docs): from the rule holding the most keys (the inserting one on a tie), an
    /// expired key, else a non-limiting one, else, if the inserting rule has a non-limiting
    /// key, that one, else the largest rule's limiting key closest to expiry. `None`: only
    /// keys of this request are left.
    fn evict(
        &mut self,
        inserting: usize,
        hash: u64,
        now: u64,
        protected: &[u64],
    ) -> Option<Evicted> {
        let first = Self::segment(hash);
        let mut largest = inserting;
        for (position, keys) in self.rules.iter().enumerate() {
            if keys.len > self.rules[largest].len {
                largest = position;
            }
        }
        // The largest rule first, then the inserting one (giving up its own key is always
        // fair), then, only if those two hold nothing but this request's keys, the others.
        let mut order = std::iter::once(largest)
            .chain((inserting != largest).then_some(inserting))
            .chain((0..self.rules.len()).filter(|&p| p != largest && p != inserting));
        let mut limiting = None;
        let (rule, candidate) = loop {
            let Some(rule) = order.next() else {
                break limiting?;
            };
            match self.rules[rule].candidate(first, now, protected) {
                Some(Candidate::Limiting(key)) => {
                    limiting = limiting.or(Some((rule, Candidate::Limiting(key))));
                }
                Some(found) => break (rule, found),
                None => {}
            }
            if rule == inserting && limiting.is_some() {
                // Both had only limiting keys: the largest rule's goes (the others are within
                // their share).
                break limiting?;
            }
        };
        let (key, live) = match candidate {
            Candidate::Expired(key) => (key, false),
            Candidate::Open(key) | Candidate::Limiting(key) => (key, true),
        };
        self.remove_at(rule, key);
        Some(if live {
            Evicted::Live(rule)
        } else {
            Evicted::Expired
        })
    }
}

impl RuleKeys {
    fn get_mut(&mut self, hash: u64) -> Option<&mut State> {
        self.segments[Shard::segment(hash)].get_mut(&hash)
    }

    /// The key this rule would give up: the first expired key met, else the non-limiting key
    /// closest to expiry among the first [`EVICTION_SAMPLE`], else the first non-limiting key
    /// among the first [`EVICTION_SCAN`], else the limiting key closest to expiry among the
    /// first [`EVICTION_SAMPLE`]. Keys in `protected` are skipped; `None` if no other key.
    fn candidate(&self, first: usize, now: u64, protected: &[u64]) -> Option<Candidate> {
        let mut keys = (0..SEGMENTS)
            .flat_map(|offset| self.segments[(first + offset) % SEGMENTS].iter())
            .filter(|(key, _)| !protected.contains(key))
            .take(EVICTION_SCAN);
        let mut sample: [(u64, u64, Option<&State>); EVICTION_SAMPLE] =
            [(0, 0, None); EVICTION_SAMPLE];
        let mut sampled = 0;
        for (&key, state) in keys.by_ref().take(EVICTION_SAMPLE) {
            let expires = algorithm::expires_at(state);
            if expires <= now {
                return Some(Candidate::Expired(key));
            }
            sample[sampled] = (expires, key, Some(state));
            sampled += 1;
        }
        let sample = &mut sample[..sampled];
        // The closest to expiry is the least counted: try it first.
        sample.sort_unstable_by_key(|&(expires, key, _)| (expires, key));
        for &(_, key, state) in sample.iter() {
            if state.is_some_and(|state| !self.limiting(state, now)) {
                return Some(Candidate::Open(key));
            }
        }
        // Every key sampled is limiting: look further for one that is not.
        for (&key, state) in keys {
            if algorithm::expires_at(state) <= now {
                return Some(Candidate::Expired(key));
            }
            if !self.limiting(state, now) {
                return Some(Candidate::Open(key));
            }
        }
        sample.first().map(|&(_, key, _)| Candidate::Limiting(key))
    }

    /// Whether forgetting `state` would let the rule's next request through when it would
    /// otherwise be rejected: the state would reject it (no quota left, or within a blocking
    /// period), or holds concurrency slots that are still in flight.
    fn limiting(&self, state: &State, now: u64) -> bool {
        algorithm::expires_at(state) == u64::MAX
            || !algorithm::decide(Some(state), &self.limit, now, self.cost)
                .0
                .allowed
    }
}

mod blocks;
mod epochs;
mod shared;

#[cfg(test)]
mod tests;
mod usage;
