//! The limiter the proxy calls: decides every applying rule of a request and turns the rules'
//! decisions into one verdict.
//!
//! Enforcing rules are decided together so that a rejected request charges no rule at all.
//! Shadow rules are decided afterwards, one by one and only for admitted requests: they are
//! counted as if enforced but can never reject or hold back another rule's charge.

use std::sync::Arc;
use std::time::Duration;

use super::memory::MemoryStore;
use super::{Algorithm, Check, Decision};
use crate::rules::Rule;

/// What the proxy does with a request after the rules have spoken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Forward, after holding the request for `delay` (leaky bucket shaping).
    Allow {
        /// How long to hold the request first.
        delay: Duration,
    },
    /// Refuse: the rules named rejected it.
    Reject {
        /// The status (429, or the first rejecting rule's `status`).
        status: u16,
        /// Time after which the request would be admitted.
        retry_after: Duration,
        /// Rules that rejected it, in file order.
        rules: Vec<Arc<str>>,
    },
}

/// A rule's decision for one request, and whether it was a shadow decision.
#[derive(Debug, Clone)]
pub struct Applied {
    /// The rule.
    pub rule: Arc<Rule>,
    /// Its decision.
    pub decision: Decision,
}

/// Everything the limiter decided about one request.
#[derive(Debug)]
pub struct Outcome {
    /// The verdict.
    pub verdict: Verdict,
    /// Enforcing rules that applied, in file order, with their decisions (headers come from
    /// these).
    pub applied: Vec<Applied>,
    /// Shadow rules that would have rejected the request.
    pub shadow_rejected: Vec<Arc<str>>,
    /// Concurrency slots taken: released when the `Leases` is dropped.
    pub leases: Leases,
}

/// The rate limiter: counters and the logic that combines rules.
pub struct Limiter {
    store: Arc<MemoryStore>,
}

impl Limiter {
    /// A limiter on the in-process store, bounded to `max_keys` keys.
    pub fn new(max_keys: usize) -> Self {
        Limiter {
            store: Arc::new(MemoryStore::new(max_keys)),
        }
    }

    /// The in-process store (for metrics and tests).
    pub fn memory(&self) -> &MemoryStore {
        &self.store
    }

    /// A background service that sweeps idle keys out of the in-process store.
    pub fn sweeper(&self) -> Sweeper {
        Sweeper {
            store: self.store.clone(),
        }
    }

    /// Decides `checks`, one per applying rule (same order as `rules`).
    pub fn decide(&self, rules: &[Arc<Rule>], checks: Vec<Check>) -> Outcome {
        let mut enforcing_rules = Vec::with_capacity(rules.len());
        let mut enforcing = Vec::with_capacity(checks.len());
        let mut shadow = Vec::new();
        for (rule, check) in rules.iter().zip(checks) {
            if rule.shadow {
                shadow.push((rule.clone(), check));
            } else {
                enforcing_rules.push(rule.clone());
                enforcing.push(check);
            }
        }
        let decisions = if enforcing.is_empty() {
            Vec::new()
        } else {
            self.store.decide(&enforcing)
        };
        let admitted = decisions.iter().all(|d| d.allowed);
        let mut leases = Leases {
            store: self.store.clone(),
            checks: Vec::new(),
        };
        let verdict = if admitted {
            let delay = decisions.iter().map(|d| d.delay).max().unwrap_or_default();
            leases.checks = enforcing
                .iter()
                .filter(|c| c.limit.algorithm == Algorithm::Concurrency)
                .cloned()
                .collect();
            Verdict::Allow { delay }
        } else {
            let mut status = 429;
            let mut retry_after = Duration::ZERO;
            let mut names = Vec::new();
            for (rule, d) in enforcing_rules.iter().zip(&decisions) {
                if !d.allowed {
                    if names.is_empty() {
                        status = rule.status;
                    }
                    retry_after = retry_after.max(d.retry_after);
                    names.push(rule.name.clone());
                }
            }
            Verdict::Reject {
                status,
                retry_after,
                rules: names,
            }
        };
        let mut shadow_rejected = Vec::new();
        if admitted {
            for (rule, check) in shadow {
                let d = self.store.decide(std::slice::from_ref(&check));
                match d.first() {
                    Some(d) if !d.allowed => {
                        rule.counters.shadow_rejected.inc();
                        shadow_rejected.push(rule.name.clone());
                    }
                    Some(_) => {
                        rule.counters.allowed.inc();
                        if check.limit.algorithm == Algorithm::Concurrency {
                            leases.checks.push(check);
                        }
                    }
                    None => {}
                }
            }
        }
        for (rule, d) in enforcing_rules.iter().zip(&decisions) {
            if admitted {
                rule.counters.allowed.inc();
            } else if !d.allowed {
                rule.counters.rejected.inc();
            }
        }
        let applied = enforcing_rules
            .into_iter()
            .zip(decisions)
            .map(|(rule, decision)| Applied { rule, decision })
            .collect();
        Outcome {
            verdict,
            applied,
            shadow_rejected,
            leases,
        }
    }
}

/// Concurrency slots held by one request. Dropping it releases them, so a slot is given back
/// however the exchange ends: finished, upstream error, client gone or timeout.
pub struct Leases {
    store: Arc<MemoryStore>,
    checks: Vec<Check>,
}

impl Leases {
    /// Whether the request holds no slot.
    pub fn is_empty(&self) -> bool {
        self.checks.is_empty()
    }
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases")
            .field("slots", &self.checks.len())
            .finish()
    }
}

impl Drop for Leases {
    fn drop(&mut self) {
        for c in self.checks.drain(..) {
            self.store.release(&c);
        }
    }
}

/// How often idle keys are swept out of the in-process store, so that quiet shards give their
/// memory back even when no request touches them.
pub const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Background service that sweeps the in-process store every [`SWEEP_EVERY`].
pub struct Sweeper {
    /// The store to sweep.
    pub store: Arc<MemoryStore>,
}

#[async_trait::async_trait]
impl pingora::services::background::BackgroundService for Sweeper {
    async fn start(&self, mut shutdown: pingora::server::ShutdownWatch) {
        let mut tick = tokio::time::interval(SWEEP_EVERY);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => {
                    let store = self.store.clone();
                    // Sweeping a million keys takes milliseconds: keep it off the workers.
                    let _ = tokio::task::spawn_blocking(move || store.sweep()).await;
                }
            }
        }
    }
}
