//! The epochs of the in-process counters: when a usage reset last started a key over, so that
//! a refund, true-up or lease return of a charge made before it is dropped instead of landing
//! on the new counter (which would admit more than the limit).
//!
//! Kept beside the counters and bounded like the blocks: at most `max_keys` marks, each kept
//! for [`KEEP`] beyond its rule's horizon (a reservation settles when its response ends; a
//! mark must outlive every reservation open at the reset). A full table first forgets the
//! marks that ended, then the one that ends soonest: only a reservation older than that mark
//! could then land on a reset counter.

use std::time::Duration;

use hashbrown::HashMap;
use parking_lot::Mutex;

/// How long a reset's mark outlives its rule's horizon.
pub(super) const KEEP: Duration = Duration::from_secs(3600);

/// One mark: when the epoch started (ns, the store's clock) and when the mark may go.
#[derive(Clone, Copy)]
struct Mark {
    started: u64,
    until: u64,
}

/// The resets of one store: (rule id, key hash) to the epoch's start.
#[derive(Default)]
pub(super) struct Epochs {
    marks: Mutex<HashMap<(u64, u64), Mark>>,
}

impl Epochs {
    /// Starts a new epoch of `key` at `now`, remembered for `keep` (within `max` marks).
    pub(super) fn start(&self, key: (u64, u64), now: u64, keep: Duration, max: usize) {
        let mut marks = self.marks.lock();
        if marks.len() >= max.max(1) && !marks.contains_key(&key) {
            marks.retain(|_, m| m.until > now);
            if marks.len() >= max.max(1) {
                if let Some(soonest) = marks.iter().min_by_key(|(_, m)| m.until).map(|(k, _)| *k) {
                    marks.remove(&soonest);
                }
            }
        }
        let keep = u64::try_from(keep.as_nanos()).unwrap_or(u64::MAX);
        marks.insert(
            key,
            Mark {
                started: now,
                until: now.saturating_add(keep),
            },
        );
    }

    /// Whether a charge made at `charged_at` belongs to the current epoch of `key`: made
    /// after its last reset. A charge in the very instant of the reset counts as before it
    /// (dropping a refund costs availability, applying a stale one exactness).
    pub(super) fn current(&self, key: (u64, u64), charged_at: u64) -> bool {
        self.marks
            .lock()
            .get(&key)
            .is_none_or(|m| charged_at > m.started)
    }

    /// Marks held now.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.marks.lock().len()
    }

    /// Forgets the marks that ended.
    pub(super) fn sweep(&self, now: u64) {
        self.marks.lock().retain(|_, m| m.until > now);
    }
}
