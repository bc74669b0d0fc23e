//! `block_for` in process: the keys a rule rejected (its bans), each refused until its ban
//! ends. Kept beside the counters (same store, so a reload that keeps the rule keeps its
//! bans) but in a table of their own with its own bound (`[store] max_bans`): a flood of new
//! counters evicts counters, never a ban.
//!
//! # When the table is full
//!
//! A client who controls a key part (a header, a made-up user) can mint bans cheaply: one
//! rejected request each. So a full table must not make room by dropping the oldest ban (with
//! one `block_for`, the ban that ends soonest is the oldest one: the very ban the flood is
//! aimed at). It first forgets the bans that have ended; then, as the counters do, it keeps
//! fair shares between rules:
//!
//! - if the rule adding the ban holds the most bans (or as many as any), the *new* ban is not
//!   kept: that rule's key is still limited by its counter, only not banned. A flood of bans
//!   on one rule thus never lifts a live ban of that rule, nor of a rule holding fewer;
//! - else the rule holding the most bans gives up the one that ends soonest among the first
//!   [`EVICTION_SCAN`] of its bans in table order (a random sample: the table's hasher is
//!   seeded per process), so a rule flooded with bans cannot crowd out the bans of another.
//!
//! Either way the ban not kept is counted (`floodgate_memory_store_bans_dropped_total{how}`),
//! to be alarmed on: a growing count means `max_bans` is too small or a client is minting
//! bans. A flood of short bans fills the table only for as long as they last.
//!
//! Ended bans are swept by [`Blocks::sweep`] (the store's periodic sweep), and by a full table
//! once one of its bans may have ended (it keeps a lower bound of the soonest end), so that a
//! full table of live bans costs each new ban O(rules), not a pass over the table.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hashbrown::HashMap;
use parking_lot::Mutex;

use crate::limiter::algorithm::quota;
use crate::limiter::{Check, Decision};

/// How many bans of the largest rule a full table looks at to pick the one that ends soonest.
const EVICTION_SCAN: usize = 64;

/// The bans of one store: (rule id, key hash) to the instant (ns) the ban ends.
pub(super) struct Blocks {
    table: Mutex<Table>,
    /// The most bans held at once.
    max: AtomicUsize,
}

#[derive(Default)]
struct Table {
    until: HashMap<(u64, u64), u64>,
    /// Bans held per rule id (ended ones included until swept).
    per_rule: HashMap<u64, usize>,
    /// No ban held ends before this instant (a lower bound): a full table sweeps only once
    /// one may have ended.
    earliest: u64,
}

/// What [`Blocks::block`] did with a ban it could not simply add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dropped {
    /// The new ban was not kept (its rule holds the most bans).
    Refused,
    /// Another rule's live ban was evicted to keep it.
    Evicted,
}

impl Dropped {
    /// The `how` label of `floodgate_memory_store_bans_dropped_total`.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Dropped::Refused => "refused",
            Dropped::Evicted => "evicted",
        }
    }
}

impl Blocks {
    /// A table of at most `max` bans (at least 1).
    pub(super) fn new(max: usize) -> Self {
        Blocks {
            table: Mutex::new(Table {
                earliest: u64::MAX,
                ..Table::default()
            }),
            max: AtomicUsize::new(max.max(1)),
        }
    }

    /// Sets the most bans held at once (at least 1); a smaller bound applies as bans are added.
    pub(super) fn set_max(&self, max: usize) {
        self.max.store(max.max(1), Ordering::Relaxed);
    }

    /// The most bans held at once.
    pub(super) fn max(&self) -> usize {
        self.max.load(Ordering::Relaxed)
    }

    /// What is left of the ban of `key` at `now`, if it is banned.
    pub(super) fn left(&self, key: (u64, u64), now: u64) -> Option<u64> {
        let until = *self.table.lock().until.get(&key)?;
        (until > now).then(|| until - now)
    }

    /// Bans `key` for `for_ns` from `now` (a ban it already has is only ever lengthened).
    /// `Some` when a ban was dropped to stay within the bound (module docs).
    pub(super) fn block(&self, key: (u64, u64), now: u64, for_ns: u64) -> Option<Dropped> {
        let end = now.saturating_add(for_ns);
        let max = self.max();
        let mut t = self.table.lock();
        if let Some(until) = t.until.get_mut(&key) {
            *until = if *until > now { (*until).max(end) } else { end };
            t.earliest = t.earliest.min(end);
            return None;
        }
        let mut dropped = None;
        if t.until.len() >= max && t.earliest <= now {
            t.sweep(now);
        }
        while t.until.len() >= max {
            let (largest, held) = t
                .per_rule
                .iter()
                .max_by_key(|(_, n)| **n)
                .map_or((key.0, 0), |(r, n)| (*r, *n));
            let own = t.per_rule.get(&key.0).copied().unwrap_or(0);
            if own >= held || largest == key.0 {
                return Some(Dropped::Refused);
            }
            let victim = t
                .until
                .iter()
                .filter(|(k, _)| k.0 == largest)
                .take(EVICTION_SCAN)
                .min_by_key(|(_, end)| **end)
                .map(|(k, _)| *k);
            match victim {
                Some(victim) => {
                    t.remove(victim);
                    dropped = Some(Dropped::Evicted);
                }
                // Counts and table disagree: cannot happen, but never loop on it.
                None => return Some(Dropped::Refused),
            }
        }
        t.until.insert(key, end);
        *t.per_rule.entry(key.0).or_insert(0) += 1;
        t.earliest = t.earliest.min(end);
        dropped
    }

    /// Lifts the ban of `key`; whether a live one (not yet ended at `now`) was lifted.
    pub(super) fn lift(&self, key: (u64, u64), now: u64) -> bool {
        self.table.lock().remove(key).is_some_and(|end| end > now)
    }

    /// Bans held now (ended ones included until they are swept).
    pub(super) fn len(&self) -> usize {
        self.table.lock().until.len()
    }

    /// Forgets the bans that have ended.
    pub(super) fn sweep(&self, now: u64) {
        self.table.lock().sweep(now);
    }
}

impl Table {
    fn remove(&mut self, key: (u64, u64)) -> Option<u64> {
        let end = self.until.remove(&key)?;
        if let Some(n) = self.per_rule.get_mut(&key.0) {
            *n -= 1;
            if *n == 0 {
                self.per_rule.remove(&key.0);
            }
        }
        Some(end)
    }

    fn sweep(&mut self, now: u64) {
        let per_rule = &mut self.per_rule;
        let mut earliest = u64::MAX;
        self.until.retain(|key, end| {
            if *end > now {
                earliest = earliest.min(*end);
                return true;
            }
            if let Some(n) = per_rule.get_mut(&key.0) {
                *n -= 1;
            }
            false
        });
        per_rule.retain(|_, n| *n > 0);
        self.earliest = earliest;
    }
}

/// The decision of a check whose key is banned for `left_ns` more.
pub(super) fn blocked(check: &Check, left_ns: u64) -> Decision {
    let left = Duration::from_nanos(left_ns.max(1));
    Decision {
        allowed: false,
        limit: quota(&check.limit),
        remaining: 0,
        reset: left,
        retry_after: left,
        delay: Duration::ZERO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60_000_000_000;

    #[test]
    fn a_flood_of_new_bans_on_one_rule_never_lifts_a_live_ban() {
        let bans = Blocks::new(10);
        assert_eq!(bans.block((1, 0), 0, 15 * MIN), None);
        // 1,000 minted keys, each banned as long, later (so each ends after the victim's).
        let mut refused = 0;
        for k in 1..=1000 {
            if bans.block((1, k), k, 15 * MIN) == Some(Dropped::Refused) {
                refused += 1;
            }
        }
        assert_eq!(refused, 1000 - 9);
        assert!(bans.left((1, 0), 1001).is_some(), "the first ban holds");
        assert_eq!(bans.len(), 10);
    }

    #[test]
    fn a_rule_holding_fewer_bans_takes_from_the_largest() {
        let bans = Blocks::new(4);
        for k in 0..4 {
            bans.block((1, k), 0, MIN);
        }
        // Rule 2 holds none: rule 1's ban that ends soonest goes.
        bans.block((1, 9), 0, 5 * MIN); // refused: rule 1 is the largest
        assert_eq!(bans.block((2, 0), 1, MIN), Some(Dropped::Evicted));
        assert!(bans.left((2, 0), 2).is_some());
        assert_eq!(bans.len(), 4);
        // Now 3 against 1: rule 2 may take one more, then the two are level.
        assert_eq!(bans.block((2, 1), 2, MIN), Some(Dropped::Evicted));
        assert_eq!(bans.block((2, 2), 3, MIN), Some(Dropped::Refused));
    }

    #[test]
    fn ended_bans_make_room_and_a_lift_ends_a_ban() {
        let bans = Blocks::new(2);
        bans.block((1, 0), 0, 10);
        bans.block((1, 1), 0, 10);
        assert_eq!(
            bans.block((1, 2), 20, 10),
            None,
            "the ended ones were swept"
        );
        assert_eq!(bans.len(), 1);
        assert!(bans.lift((1, 2), 21));
        assert!(!bans.lift((1, 2), 21), "nothing left to lift");
        assert_eq!(bans.left((1, 2), 21), None);
    }
}
