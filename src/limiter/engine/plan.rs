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

/// A request's steps, inline up to two: most requests meet a rule or two, and the plan of an
/// in-process decision then allocates nothing.
pub(super) type Steps<'a> = SmallVec<[Step<'a>; 2]>;

/// Which steps joined the store call, one flag per step (inline, as [`Checks`]).
pub(super) type Asked = SmallVec<[bool; 8]>;

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
        /// Hands the answer to the lease table. Boxed: it is big, rare (one per lease call,
        /// which waits for a round trip anyway), and every step would carry its size.
        guard: Box<RefillGuard>,
    },
}

/// One applying rule, with its check: what the proxy hands the engine for a request.
pub(super) type Applying = (Arc<Policy>, Check);

/// One enforcing rule on its way through the engine. It borrows its rule and check from the
/// request's applying list, which outlives every phase: a step is then small enough to move
/// and copy cheaply, and nothing is cloned to make it.
pub(super) struct Step<'a> {
    /// The rule.
    pub(super) rule: &'a Arc<Policy>,
    /// What it asks of its store for this request.
    pub(super) check: &'a Check,
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
    /// Which lease those permits came from (a refund goes back into it).
    pub(super) lease_stamp: Option<crate::limiter::lease::Stamp>,
    /// The store failed and this rule's `on_store_error` decided it.
    pub(super) fell_back: Option<FailureMode>,
    /// The shared store's call that decided it: its holder id and what it charged (the
    /// window and the instant, which a reservation's true-up names).
    pub(super) charged_in: (u64, crate::limiter::store::Grant),
    /// The request's cost was charged to this rule's counter and stays charged even if the
    /// request is refused (by another rule a store decided apart, or by shaping): a refused
    /// request shows what a rule really has left by it.
    pub(super) charged: bool,
}

impl Step<'_> {
    /// Whether its decision (so far) admits: false when undecided. (What tests look at.)
    #[cfg(test)]
    pub(super) fn admits(&self) -> bool {
        self.decision.as_ref().is_some_and(|d| d.allowed)
    }
}

/// A request's steps, and its shadow rules.
pub(super) struct Plan<'a> {
    /// The enforcing rules, in file order.
    pub(super) steps: Steps<'a>,
    /// Every applying rule, shadow ones included.
    applying: &'a [Applying],
}

impl<'a> Plan<'a> {
    /// One step per enforcing rule of `applying` (in file order); shadow rules wait. With a
    /// `shared` store, global rules are decided there; without one, every rule is local.
    pub(super) fn new(applying: &'a [Applying], shared: bool) -> Plan<'a> {
        let mut steps = Steps::with_capacity(applying.len());
        for (rule, check) in applying.iter().filter(|(rule, _)| !rule.shadow) {
            let place = if shared && rule.scope == Scope::Global {
                Place::Shared
            } else {
                Place::Local
            };
            steps.push(Step {
                rule,
                check,
                place,
                ask: None,
                decision: None,
                from_lease: false,
                lease_stamp: None,
                fell_back: None,
                charged_in: (0, crate::limiter::store::Grant::default()),
                charged: false,
            });
        }
        Plan { steps, applying }
    }

    /// The shadow rules, in file order: decided only if the request is admitted (`settle`).
    pub(super) fn shadow(&self) -> impl Iterator<Item = &'a Applying> {
        self.applying.iter().filter(|(rule, _)| rule.shadow)
    }

    /// The checks of the local steps, in order: what one in-process call decides.
    pub(super) fn local_checks<C: FromIterator<Check>>(&self) -> C {
        self.steps
            .iter()
            .filter(|s| s.place == Place::Local)
            .map(|s| s.check.clone())
            .collect()
    }

    /// Gives the local steps their decisions, as [`Plan::local_checks`] ordered them;
    /// `charged`: the call that made them charged (a decision that admitted them all), rather
    /// than peeked.
    pub(super) fn put_local(
        &mut self,
        decisions: impl IntoIterator<Item = Decision>,
        charged: bool,
    ) {
        let local = self.steps.iter_mut().filter(|s| s.place == Place::Local);
        for (step, d) in local.zip(decisions) {
            step.charged = charged && d.allowed;
            step.decision = Some(d);
        }
    }
}
