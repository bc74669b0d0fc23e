//! What a thread keeps for the last few policies it met: a value made from a policy once and
//! reused by the requests that follow (the `/top` state of its rule, its RateLimit field),
//! instead of looked up in a shared table or made again for every request.

use std::cell::RefCell;
use std::sync::Arc;
use std::thread::LocalKey;

use super::Policy;

/// The values a thread keeps for the last [`Recent::CAPACITY`] policies it met, each held
/// with its policy. Compared by pointer: a policy is never changed once built, and one held
/// here cannot be freed and its address given to another, so a hit is always its own value.
/// A reload's new policies are new entries (an old config's drop out as new ones come in).
/// Bounded: a thread holds at most [`Recent::CAPACITY`] policies, an old config's among them
/// until the thread has met as many others.
#[derive(Debug)]
pub struct Recent<T> {
    entries: Vec<(Arc<Policy>, T)>,
}

impl<T> Recent<T> {
    /// How many policies' values a thread keeps: more than a request usually applies, few
    /// enough that the search is a short scan.
    pub const CAPACITY: usize = 8;

    /// None kept yet (`const`: for a `thread_local!`).
    pub const fn new() -> Self {
        Recent {
            entries: Vec::new(),
        }
    }

    /// The value kept for `policy`, made by `make` when there is none (the oldest entry gives
    /// way when all are taken).
    pub fn get_or_insert_with(&mut self, policy: &Arc<Policy>, make: impl FnOnce() -> T) -> &mut T {
        let at = match self
            .entries
            .iter()
            .position(|(p, _)| Arc::ptr_eq(p, policy))
        {
            Some(at) => at,
            None => {
                if self.entries.len() >= Self::CAPACITY {
                    self.entries.remove(0);
                }
                self.entries.push((policy.clone(), make()));
                self.entries.len() - 1
            }
        };
        &mut self.entries[at].1
    }

    /// Runs `f` on the value the calling thread keeps in `key` for `policy` (made by `make`
    /// when there is none). Gives `f` back unrun when the thread keeps nothing: it is going
    /// away (its thread-locals are gone), or a run is already under way on it.
    pub fn with_kept<R, F: FnOnce(&mut T) -> R>(
        key: &'static LocalKey<RefCell<Recent<T>>>,
        policy: &Arc<Policy>,
        make: impl FnOnce() -> T,
        f: F,
    ) -> Result<R, F> {
        let mut f = Some(f);
        let ran = key.try_with(|recent| {
            let mut recent = recent.try_borrow_mut().ok()?;
            let f = f.take()?;
            Some(f(recent.get_or_insert_with(policy, make)))
        });
        match (ran, f) {
            (Ok(Some(result)), _) => Ok(result),
            (_, Some(f)) => Err(f),
            (_, None) => unreachable!("with_kept ran its writer without a result"),
        }
    }

    /// How many policies are kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl<T> Default for Recent<T> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::limiter::fixtures::policy;

    /// A policy's value is made once; another policy of the same name (a reload's) gets its
    /// own; past the capacity the oldest gives way and is made again when met again.
    #[test]
    fn values_are_made_once_per_policy_and_bounded() {
        let mut recent = Recent::new();
        let mut made = 0;
        let a = policy("a", 10);
        for _ in 0..3 {
            let v = recent.get_or_insert_with(&a, || {
                made += 1;
                a.limit.limit()
            });
            assert_eq!(*v, 10);
        }
        assert_eq!(made, 1);
        let reloaded = policy("a", 20);
        assert_eq!(
            *recent.get_or_insert_with(&reloaded, || reloaded.limit.limit()),
            20
        );
        assert_eq!(*recent.get_or_insert_with(&a, || unreachable!()), 10);

        let others: Vec<_> = (0..Recent::<u64>::CAPACITY * 3)
            .map(|i| policy(&format!("r{i}"), i as u64 + 1))
            .collect();
        for p in &others {
            let v = *recent.get_or_insert_with(p, || p.limit.limit());
            assert_eq!(v, p.limit.limit());
            assert!(recent.len() <= Recent::<u64>::CAPACITY);
        }
        let mut again = false;
        recent.get_or_insert_with(&a, || {
            again = true;
            0
        });
        assert!(again, "the oldest policy's value was not given way");
    }
}
