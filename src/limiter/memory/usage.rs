//! The usage API on the memory store: read, reset and grant one counter under its shard's
//! lock, so that a change lands between two decisions, never inside one.
//!
//! A reset starts a new epoch of the key (see [`super::epochs`]) under the same lock, so that
//! no refund of an older charge lands on the new counter. A change made with an idempotency
//! key is remembered (bounded: [`MAX_REMEMBERED`] for [`IDEMPOTENCY_TTL`]), and a retry with
//! that key gets the first answer and changes nothing.

use hashbrown::HashMap;
use parking_lot::Mutex;

use super::{epochs, MemoryStore, State, Update};
use crate::limiter::algorithm;
use crate::limiter::store::{Changed, Replay, Usage, UsageChange, IDEMPOTENCY_TTL};
use crate::limiter::Check;

/// The most idempotency keys one store remembers: a full table forgets the answers that
/// expired, then the oldest one (whose retry would then be applied again).
pub const MAX_REMEMBERED: usize = 10_000;

/// One remembered change: what it asked and what it answered, until when.
struct Entry {
    fingerprint: (u8, u64),
    before: Usage,
    after: Usage,
    until: u64,
}

/// Where a remembered change is found: (rule id, key hash, idempotency key).
type Remembering = (u64, u64, Box<str>);

/// The changes made with an idempotency key, to their answers.
#[derive(Default)]
pub(super) struct Remembered {
    entries: Mutex<HashMap<Remembering, Entry>>,
}

impl Remembered {
    /// The answer to a change made before under `key` for this counter, if any.
    fn get(
        &self,
        counter: (u64, u64),
        key: &str,
        change: UsageChange,
        now: u64,
    ) -> Option<Changed> {
        let entries = self.entries.lock();
        let e = entries.get(&(counter.0, counter.1, Box::from(key)))?;
        (e.until > now).then(|| Changed {
            before: e.before,
            after: e.after,
            replay: if e.fingerprint == change.fingerprint() {
                Replay::Repeated
            } else {
                Replay::Conflict
            },
        })
    }

    /// Remembers the answer to a change made under `key`.
    fn remember(&self, counter: (u64, u64), key: &str, change: UsageChange, c: Changed, now: u64) {
        let mut entries = self.entries.lock();
        if entries.len() >= MAX_REMEMBERED {
            entries.retain(|_, e| e.until > now);
            if entries.len() >= MAX_REMEMBERED {
                if let Some(oldest) = entries
                    .iter()
                    .min_by_key(|(_, e)| e.until)
                    .map(|(k, _)| k.clone())
                {
                    entries.remove(&oldest);
                }
            }
        }
        let ttl = u64::try_from(IDEMPOTENCY_TTL.as_nanos()).unwrap_or(u64::MAX);
        entries.insert(
            (counter.0, counter.1, Box::from(key)),
            Entry {
                fingerprint: change.fingerprint(),
                before: c.before,
                after: c.after,
                until: now.saturating_add(ttl),
            },
        );
    }

    /// Forgets the answers that expired.
    pub(super) fn sweep(&self, now: u64) {
        self.entries.lock().retain(|_, e| e.until > now);
    }

    /// Answers remembered now.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries.lock().len()
    }
}

impl MemoryStore {
    /// The counter of `check` before and after `change` (see
    /// [`SharedStore::usage`](crate::limiter::store::SharedStore::usage)), made once per
    /// `idempotency_key`. A grant applies to a fixed window (or calendar period) only; the
    /// caller checks the algorithm, and a grant on another algorithm changes nothing here.
    pub fn usage(
        &self,
        check: &Check,
        change: UsageChange,
        idempotency_key: Option<&str>,
    ) -> Changed {
        let now = self.clock.now_ns();
        let slot = self.slot(check);
        let counter = (slot.rule, slot.hash);
        let mut shard = self.shard(slot.hash).lock();
        let key = idempotency_key.filter(|_| change != UsageChange::Read);
        if let Some(hit) = key.and_then(|k| self.idempotent.get(counter, k, change, now)) {
            return hit;
        }
        let look =
            |state: Option<&State>| Usage::of(&algorithm::decide(state, &check.limit, now, 0).0);
        let before = look(shard.get(slot));
        match change {
            UsageChange::Read => {}
            UsageChange::Reset => {
                shard.remove(slot);
                // Under the shard's lock, which a true-up holds while it reads the epoch.
                let keep = algorithm::horizon(&check.limit).saturating_add(epochs::KEEP);
                self.epochs.start(counter, now, keep, self.max_keys);
            }
            UsageChange::Grant(amount) if check.limit.algorithm().capabilities().grant => {
                let (_, window_end) = check.limit.window_at(now);
                let count = match shard.get(slot) {
                    Some(State::FixedWindow {
                        window_end: end,
                        count,
                    }) if *end == window_end => *count,
                    _ => 0,
                };
                let amount = i64::try_from(amount).unwrap_or(i64::MAX);
                let update = Update::Set(State::FixedWindow {
                    window_end,
                    count: count.saturating_sub(amount),
                });
                let position = shard.position(slot.rule);
                self.write(&mut shard, check, slot, position, update, now, &[slot.hash]);
            }
            UsageChange::Grant(_) => {}
        }
        let after = look(shard.get(slot));
        let changed = Changed {
            before,
            after,
            replay: Replay::Fresh,
        };
        if let Some(k) = key {
            self.idempotent.remember(counter, k, change, changed, now);
        }
        changed
    }
}
