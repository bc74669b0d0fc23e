//! A shared store in the test: real enough to decide, charge, lease and release, and to fail
//! or hold its answer when told.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{mpsc, Semaphore};

use crate::limiter::store::{Grant, SharedStore, StoreError, StoreStatus};
use crate::limiter::{Algorithm, Check, Decision};

/// What the fake reports of each `release`: the rules named, and the slots' holder.
pub(super) type Released = mpsc::UnboundedReceiver<(Vec<Arc<str>>, u64)>;

/// A shared store that decides each check as an atomic step of its own, as a Redis Cluster
/// does when every key sits in another hash slot: a step that admits is charged even when
/// another rejects, and (as the trait asks) the concurrency slots of a request it did not
/// fully admit are given back before it answers. A leased check of an admitted call is
/// granted what it wants, as far as the limit goes.
pub(super) struct Fake {
    /// Fail every call with this error instead of deciding.
    failing: Mutex<Option<StoreError>>,
    /// Units charged per rule by rate rules, leased permits included (they never come back).
    charged: Mutex<HashMap<Arc<str>, u64>>,
    /// Concurrency slots held per rule, per holder.
    held: Mutex<HashMap<Arc<str>, HashMap<u64, u64>>>,
    /// The slot holder of every decision call, in order: one entry per store call.
    pub(super) holders: Mutex<Vec<u64>>,
    /// Every call to `release` (the rules named, the holder).
    released: mpsc::UnboundedSender<(Vec<Arc<str>>, u64)>,
    /// Each call waits for a permit here before it answers: closed, calls hang until opened.
    gate: Semaphore,
    /// Answer every call with exactly this instead of deciding: a hostile or buggy store.
    pub(super) answer: Mutex<Option<Vec<(Decision, Grant)>>>,
}

impl Fake {
    /// A fake that answers at once.
    pub(super) fn new() -> (Arc<Fake>, Released) {
        Fake::with_gate(Semaphore::MAX_PERMITS)
    }

    /// A fake whose calls wait until [`Fake::open`].
    pub(super) fn gated() -> (Arc<Fake>, Released) {
        Fake::with_gate(0)
    }

    fn with_gate(permits: usize) -> (Arc<Fake>, Released) {
        let (tx, rx) = mpsc::unbounded_channel();
        let fake = Fake {
            failing: Mutex::new(None),
            charged: Mutex::default(),
            held: Mutex::default(),
            holders: Mutex::default(),
            released: tx,
            gate: Semaphore::new(permits),
            answer: Mutex::new(None),
        };
        (Arc::new(fake), rx)
    }

    /// Lets every call waiting at the gate, and every later one, answer.
    pub(super) fn open(&self) {
        self.gate.add_permits(1);
    }

    pub(super) fn fail(&self, error: Option<StoreError>) {
        *self.failing.lock() = error;
    }

    /// Decision calls made so far.
    pub(super) fn calls(&self) -> usize {
        self.holders.lock().len()
    }

    pub(super) fn charged(&self, rule: &str) -> u64 {
        self.charged.lock().get(rule).copied().unwrap_or(0)
    }

    pub(super) fn held(&self, rule: &str) -> u64 {
        self.held.lock().get(rule).map_or(0, |l| l.values().sum())
    }

    fn free(&self, checks: &[Check], holder: u64) {
        let mut held = self.held.lock();
        for c in checks {
            if let Some(holders) = held.get_mut(&c.rule) {
                holders.remove(&holder);
            }
        }
    }

    /// Decides one check as an atomic step: charges its cost if it fits.
    fn step(&self, c: &Check, holder: u64) -> Decision {
        let limit = c.limit.limit();
        let concurrency = c.limit.algorithm() == Algorithm::Concurrency;
        let used = if concurrency {
            self.held(&c.rule)
        } else {
            self.charged(&c.rule)
        };
        let allowed = used + c.cost <= limit;
        if allowed && concurrency {
            *self
                .held
                .lock()
                .entry(c.rule.clone())
                .or_default()
                .entry(holder)
                .or_default() += c.cost;
        } else if allowed {
            *self.charged.lock().entry(c.rule.clone()).or_default() += c.cost;
        }
        Decision {
            allowed,
            limit,
            remaining: if allowed { limit - used - c.cost } else { 0 },
            reset: Duration::from_secs(1),
            retry_after: if allowed {
                Duration::ZERO
            } else {
                Duration::from_secs(1)
            },
            delay: Duration::ZERO,
        }
    }

    /// Permits leased beyond the cost of an admitted check that wants `want`: what is left
    /// of its limit, at most.
    fn lease_extra(&self, c: &Check, want: u64) -> u64 {
        let left = c.limit.limit().saturating_sub(self.charged(&c.rule));
        let extra = want.saturating_sub(c.cost).min(left);
        *self.charged.lock().entry(c.rule.clone()).or_default() += extra;
        extra
    }
}

#[async_trait::async_trait]
impl SharedStore for Fake {
    async fn decide(
        &self,
        checks: &[Check],
        holder: u64,
        timeout: Duration,
    ) -> Result<Vec<Decision>, StoreError> {
        let wants = vec![0; checks.len()];
        let answers = self
            .decide_leased(checks, &wants, 1, holder, timeout)
            .await?;
        Ok(answers.into_iter().map(|(d, _)| d).collect())
    }

    async fn decide_leased(
        &self,
        checks: &[Check],
        wants: &[u64],
        _instances: u64,
        holder: u64,
        _timeout: Duration,
    ) -> Result<Vec<(Decision, Grant)>, StoreError> {
        self.holders.lock().push(holder);
        let _open = self.gate.acquire().await.expect("the gate is never closed");
        if let Some(e) = self.failing.lock().clone() {
            return Err(e);
        }
        if let Some(answer) = self.answer.lock().clone() {
            return Ok(answer);
        }
        let decisions: Vec<Decision> = checks.iter().map(|c| self.step(c, holder)).collect();
        let all = decisions.iter().all(|d| d.allowed);
        if !all {
            // The trait's contract: a request not admitted keeps no slot.
            self.free(checks, holder);
        }
        Ok(decisions
            .into_iter()
            .zip(checks.iter().zip(wants))
            .map(|(d, (c, &want))| {
                let granted = if !all {
                    // Each check is a call of its own: one that admitted stays charged,
                    // but for a slot, given back above.
                    if d.allowed && c.limit.algorithm() != Algorithm::Concurrency {
                        c.cost
                    } else {
                        0
                    }
                } else if want > 0 {
                    c.cost + self.lease_extra(c, want)
                } else {
                    c.cost
                };
                let grant = Grant {
                    granted,
                    ..Grant::default()
                };
                (d, grant)
            })
            .collect())
    }

    async fn release(&self, checks: &[Check], holder: u64) {
        self.free(checks, holder);
        let _ = self
            .released
            .send((checks.iter().map(|c| c.rule.clone()).collect(), holder));
    }

    fn status(&self) -> StoreStatus {
        StoreStatus {
            up: self.failing.lock().is_none(),
            connected: true,
            endpoint: "fake".into(),
            drops_counters: false,
        }
    }
}
