//! The first phase: a request's applying rules become one [`Step`] each (shadow rules are set
//! aside for after the verdict), and every step knows where it is decided. The later phases
//! fill in each step's decision; nothing is kept in arrays side by side.

use std::sync::Arc;

use smallvec::SmallVec;

use crate::limiter::lease::RefillGuard;
use crate::limiter::policy::{FailureMode, Policy, Scope};
use crate::limiter::{Check, Decision};

/// Checks handed to a store in one call that does not wait (the in-process stores), kept
/// inline: most requests meet a handful of rules. Across an `.await` a `Vec` is kept instead,
/// so that the futures stay small (moving a future moves all of it).
pub(super) type Checks = SmallVec<[Check; 4]>;

/// Which store decides a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Place {
    /// In process: local rules, and every rule when there is no shared store.
    Local,
    /// The shared store (or, while it fails, the rule's `on_store_error`).
    Shared,
}

/// How a shared step joins the request's one store call.
pub(super) enum Ask {
    /// Decided exactly by the call.
    Exact,
    /// Decided by the call, which also leases up to `want` permits for the key; `guard`
    /// marks the lease call in flight until the answer is filled in (or the guard dropped).
    Lease {
        /// Permits to ask for (at least the cost).
        want: u64,
        /// Hands the answer to the lease table.
        guard: RefillGuard,
    },
}

/// One enforcing rule on its way through the engine.
pub(super) struct Step {
    /// The rule.
    pub(super) rule: Arc<Policy>,
    /// What it asks of its store for this request.
    pub(super) check: Check,
    /// Where it is decided.
    pub(super) place: Place,
    /// Set by the lease phase for the shared steps that join the store call.
    pub(super) ask: Option<Ask>,
    /// Its decision, once a phase made one (`None`: never decided, because an earlier phase
    /// refused the request first).
    pub(super) decision: Option<Decision>,
    /// The request took `check.cost` permits of this key's quota lease (spent from the permits
    /// in hand, or charged by the store call along with a lease): they go back into the lease
    /// if the request is rejected after all.
    pub(super) from_lease: bool,
    /// The store failed and this rule's `on_store_error` decided it.
    pub(super) fell_back: Option<FailureMode>,
}

impl Step {
    /// A step not yet decided.
    pub(super) fn new(rule: Arc<Policy>, check: Check, place: Place) -> Step {
        Step {
            rule,
            check,
            place,
            ask: None,
            decision: None,
            from_lease: false,
            fell_back: None,
        }
    }

    /// Whether its decision (so far) admits: false when undecided. (What tests look at.)
    #[cfg(test)]
    pub(super) fn admits(&self) -> bool {
        self.decision.as_ref().is_some_and(|d| d.allowed)
    }
}

/// A request's steps and its shadow rules.
pub(super) struct Plan {
    /// The enforcing rules, in file order. On the heap, not inline: a step is a few hundred
    /// bytes, and the plan moves from phase to phase (measured: inline steps made the
    /// memory-only decision slower, by their copies, than the one allocation costs).
    pub(super) steps: Vec<Step>,
    /// The shadow rules, decided only if the request is admitted (see `settle`).
    pub(super) shadow: Vec<(Arc<Policy>, Check)>,
}

impl Plan {
    /// Splits `applying` (in file order) into enforcing steps and shadow rules. With a
    /// `shared` store, global rules are decided there; without one, every rule is local.
    pub(super) fn new(applying: Vec<(Arc<Policy>, Check)>, shared: bool) -> Plan {
        let mut steps = Vec::with_capacity(applying.len());
        let mut shadow = Vec::new();
        for (rule, check) in applying {
            if rule.shadow {
                shadow.push((rule, check));
                continue;
            }
            let place = if shared && rule.scope == Scope::Global {
                Place::Shared
            } else {
                Place::Local
            };
            steps.push(Step::new(rule, check, place));
        }
        Plan { steps, shadow }
    }

    /// Whether any step is decided by the shared store.
    pub(super) fn has_shared(&self) -> bool {
        self.steps.iter().any(|s| s.place == Place::Shared)
    }

    /// The checks of the local steps, in order: what one in-process call decides.
    pub(super) fn local_checks<C: FromIterator<Check>>(&self) -> C {
        self.steps
            .iter()
            .filter(|s| s.place == Place::Local)
            .map(|s| s.check.clone())
            .collect()
    }

    /// Gives the local steps their decisions, as [`Plan::local_checks`] ordered them.
    pub(super) fn put_local(&mut self, decisions: Vec<Decision>) {
        let local = self.steps.iter_mut().filter(|s| s.place == Place::Local);
        for (step, d) in local.zip(decisions) {
            step.decision = Some(d);
        }
    }
}
