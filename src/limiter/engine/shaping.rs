//! The shaping phase: an admitted request that shaping rules (`leaky_bucket`,
//! `mode = "shape"`) hold takes a waiting place in each, or is rejected as the first full
//! rule's rejection (`max_waiting`).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use super::plan::Step;
use crate::limiter::memory::Clock;
use crate::limiter::LeakyMode;

pub use crate::limiter::policy::MAX_WAITING_PER_RULE;

/// The shortest `Retry-After` of a request refused because its rule holds too many.
const FULL_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Requests held by shaping rules, counted by the instant their wait ends: the proxy holds an
/// admitted request exactly its `delay`, so an entry whose instant has passed is no longer
/// waiting. Bounded: at most each rule's cap of entries per rule.
#[derive(Default)]
pub(super) struct Waiting {
    rules: parking_lot::Mutex<HashMap<Arc<str>, BinaryHeap<Reverse<Instant>>>>,
}

impl Waiting {
    /// Takes a waiting place until `now + delay` in each of `rules` (name, `max_waiting`), all
    /// or none. `Err(i)`: `rules[i]` is full.
    pub(super) fn reserve(
        &self,
        rules: &[(&Arc<str>, usize)],
        now: Instant,
        delay: Duration,
    ) -> Result<(), usize> {
        let mut map = self.rules.lock();
        // Waits that have ended go first. Rules without a waiting request hold no entry, so
        // the map stays as small as the number of rules holding requests right now.
        map.retain(|_, heap| {
            while heap.peek().is_some_and(|r| r.0 <= now) {
                heap.pop();
            }
            !heap.is_empty()
        });
        for (i, (rule, cap)) in rules.iter().enumerate() {
            let waiting = map.get(&***rule).map_or(0, |heap| heap.len());
            if waiting >= (*cap).max(1) {
                return Err(i);
            }
        }
        for (rule, _) in rules {
            map.entry((*rule).clone())
                .or_default()
                .push(Reverse(now + delay));
        }
        Ok(())
    }
}

/// Runs the shaping phase over an admitted request's steps. Returns whether it stays
/// admitted. A request no shaping rule holds costs nothing here (no lock, no clock read).
///
/// A refused request's units stay charged (as when a concurrent request wins the last local
/// unit after the peek): only a flood reaches the cap.
pub(super) fn hold(waiting: &Waiting, steps: &mut [Step<'_>], clock: &dyn Clock) -> bool {
    let holds = |s: &Step<'_>| {
        s.rule.limit.mode() == LeakyMode::Shape
            && s.decision.as_ref().is_some_and(|d| !d.delay.is_zero())
    };
    if !steps.iter().any(holds) {
        return true;
    }
    let mut holding: SmallVec<[&mut Step<'_>; 4]> = steps.iter_mut().filter(|s| holds(s)).collect();
    let delay = holding
        .iter()
        .filter_map(|s| s.decision.as_ref().map(|d| d.delay))
        .max()
        .unwrap_or_default();
    let reserved = {
        let caps: SmallVec<[(&Arc<str>, usize); 4]> = holding
            .iter()
            .map(|s| (&s.rule.name, s.rule.max_waiting))
            .collect();
        waiting.reserve(&caps, clock.instant(), delay)
    };
    let Err(full) = reserved else {
        return true;
    };
    let step = &mut holding[full];
    if let Some(d) = step.decision.as_mut() {
        d.allowed = false;
        d.retry_after = d.delay.max(FULL_RETRY_AFTER);
        d.delay = Duration::ZERO;
    }
    tracing::debug!(rule = %step.rule.name, "too many requests waiting on a shaping rule; rejected");
    false
}
