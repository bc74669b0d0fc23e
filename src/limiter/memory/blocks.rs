//! `block_for` in process: the keys a rule rejected, each refused until its block ends. Kept
//! beside the counters (same store, so a reload that keeps the rule keeps its blocks), and
//! bounded like them: at most `max_keys` blocks; a full table first forgets the blocks that
//! ended, then the one that ends soonest.

use std::time::Duration;

use hashbrown::HashMap;
use parking_lot::Mutex;

use crate::limiter::algorithm::quota;
use crate::limiter::{Check, Decision};

/// The blocks of one store: (rule id, key hash) to the instant (ns) the block ends.
#[derive(Default)]
pub(super) struct Blocks {
    until: Mutex<HashMap<(u64, u64), u64>>,
}

impl Blocks {
    /// What is left of the block of `key` at `now`, if it is blocked.
    pub(super) fn left(&self, key: (u64, u64), now: u64) -> Option<u64> {
        let until = *self.until.lock().get(&key)?;
        (until > now).then(|| until - now)
    }

    /// Blocks `key` for `for_ns` from `now`, within `max` blocks.
    pub(super) fn block(&self, key: (u64, u64), now: u64, for_ns: u64, max: usize) {
        let mut until = self.until.lock();
        if until.len() >= max && !until.contains_key(&key) {
            until.retain(|_, end| *end > now);
            if until.len() >= max {
                if let Some(soonest) = until.iter().min_by_key(|(_, end)| **end).map(|(k, _)| *k) {
                    until.remove(&soonest);
                }
            }
        }
        until.insert(key, now.saturating_add(for_ns));
    }

    /// Blocks held now (ended ones included until they are swept).
    pub(super) fn len(&self) -> usize {
        self.until.lock().len()
    }

    /// Forgets the blocks that have ended.
    pub(super) fn sweep(&self, now: u64) {
        self.until.lock().retain(|_, end| *end > now);
    }
}

/// The decision of a check whose key is blocked for `left_ns` more.
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
