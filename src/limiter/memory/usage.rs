//! The usage API on the memory store: read, reset and grant one counter under its shard's
//! lock, so that a change lands between two decisions, never inside one.

use super::{MemoryStore, State, Update};
use crate::limiter::algorithm;
use crate::limiter::store::{Usage, UsageChange};
use crate::limiter::Check;

impl MemoryStore {
    /// The counter of `check` before and after `change` (see
    /// [`SharedStore::usage`](crate::limiter::store::SharedStore::usage)). A grant applies to
    /// a fixed window (or calendar period) only; the caller checks the algorithm, and a grant
    /// on another algorithm changes nothing here.
    pub fn usage(&self, check: &Check, change: UsageChange) -> (Usage, Usage) {
        let now = self.clock.now_ns();
        let slot = self.slot(check);
        let mut shard = self.shard(slot.hash).lock();
        let look =
            |state: Option<&State>| Usage::of(&algorithm::decide(state, &check.limit, now, 0).0);
        let before = look(shard.get(slot));
        match change {
            UsageChange::Read => {}
            UsageChange::Reset => shard.remove(slot),
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
        (before, after)
    }
}
