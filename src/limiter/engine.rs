//! The limiter the proxy calls: decides every applying rule of a request and turns the rules'
//! decisions into one verdict.
//!
//! - Local rules (and every rule on the memory backend) are decided in process.
//! - Global rules are decided in one call to the store the backend names (any
//!   [`SharedStore`]), atomically; on the memory backend that store is the in-process one, and
//!   every rule of a request is decided in one call.
//! - A request rejected by any rule charges no rule: local rules are first *peeked*, the shared
//!   store is asked, and only when it admits are the local rules charged.
//!   Approximation, stated honestly: if a concurrent request takes the last local unit between
//!   the peek and the charge, this request is rejected after the shared store charged it.
//! - When the shared store fails (error, timeout, open circuit) each global rule's
//!   `on_store_error` decides: `open` admits (counted, logged), `closed` refuses with 503,
//!   `local` decides in process with `limit / instances`.
//! - Global rules with `lease` spend permits leased from the shared store in process (see
//!   [`super::lease`]); only keys whose lease ran out join the request's one store call, which
//!   leases more in the same script run. A request rejected by any rule puts the permits it
//!   took back into the lease, uncharged.
//! - Shadow rules are decided after the verdict, one by one, only for admitted requests, and
//!   always in process (a shadow global rule counts per instance): they can never reject or
//!   cost the request a round trip.
//!
//! [`Limiter::decide`] is a pipeline over one [`plan::Step`] per enforcing rule (its policy,
//! its check, where it is decided, its decision), each phase in a file of its own: `plan`
//! (shadow or enforcing, local or shared), `leases` (permits in hand), `shared` (the one store
//! call), `fallback` (`on_store_error`), `shaping` (`max_waiting`) and `settle` (verdict,
//! counters, slots, shadow rules). `slots` holds a request's concurrency slots and
//! `background` the services that return leases and sweep the stores. Time comes from the
//! injected [`Clock`]: the engine never reads one of its own.

mod background;
mod fallback;
mod leases;
mod plan;
mod settle;
mod shaping;
mod shared;
mod slots;

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::backend;
use super::lease::{lease_metrics, LeaseTable};
use super::memory::{Clock, MemoryStore, MonotonicClock};
use super::policy::Policy;
use super::settings::Store;
use super::store::SharedStore;
use super::{Check, Decision};

pub use background::{ResetListener, Returner, Sweeper, SWEEP_EVERY};
pub use shaping::MAX_WAITING_PER_RULE;
pub use slots::Slots;

use plan::{Checks, Plan, Step};
use shaping::Waiting;

/// `Retry-After` of a 503 caused by a failing store: the circuit breaker's cool-down scale.
pub const STORE_RETRY_AFTER: Duration = Duration::from_secs(1);

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
    /// Forward, but serve the request's bodies at `rate` bytes per second: every rule that
    /// would reject it is `mode = "slow"` (the smallest `slow_rate` applies). Charged as a
    /// rejection is: not at all.
    Slow {
        /// Bytes per second, each way.
        rate: u64,
        /// The rules that slowed it, in file order.
        rules: Vec<Arc<str>>,
    },
    /// Refuse with 503: the store is failing and these rules are `on_store_error = "closed"`.
    Unavailable {
        /// When to try again.
        retry_after: Duration,
        /// The closed rules.
        rules: Vec<Arc<str>>,
    },
}

/// A rule's decision for one request.
#[derive(Debug, Clone)]
pub struct Applied {
    /// The rule.
    pub rule: Arc<Policy>,
    /// The counter the request charged ([`Check::counter`]): who the client is to this rule.
    pub counter: u64,
    /// Its decision. On a refused request, a decision that would have admitted shows what
    /// the rule really has left: its `remaining` as before the request when the rule kept
    /// nothing of it (the usual case: all or nothing), as after it when the cost stayed charged
    /// (a Redis Cluster call in another hash slot admitted, or shaping refused it after the
    /// charge).
    pub decision: Decision,
}

/// Everything the limiter decided about one request.
#[derive(Debug)]
pub struct Outcome {
    /// The verdict.
    pub verdict: Verdict,
    /// Enforcing rules that were decided, in file order, with their decisions (headers come
    /// from these).
    pub applied: Vec<Applied>,
    /// Shadow rules that would have rejected the request.
    pub shadow_rejected: Vec<Arc<str>>,
    /// Concurrency slots taken: released when the [`Slots`] is dropped.
    pub slots: Slots,
    /// The decision asked the shared store (one call, answered or failed); false when every
    /// rule was decided in process or by leased permits in hand.
    pub asked_store: bool,
    /// The store call, when there was one: when it began and how long it took (answered,
    /// failed or timed out). Trace spans show it (`crate::telemetry`).
    pub store_call: Option<StoreCall>,
}

/// When the shared store was asked and how long its answer (or failure) took.
#[derive(Debug, Clone, Copy)]
pub struct StoreCall {
    /// When the call began.
    pub start: Instant,
    /// Until the answer, the error or the timeout.
    pub took: Duration,
    /// The call failed (error, timeout, open circuit): `on_store_error` decided.
    pub failed: bool,
}

/// The rate limiter: counters and the logic that combines rules.
pub struct Limiter {
    /// Local rules, and every rule on the memory backend.
    local: Arc<MemoryStore>,
    /// `on_store_error = "local"` decisions while the shared store fails.
    fallback: Arc<MemoryStore>,
    /// Where global rules are decided: a shared store (Redis), or `local` itself.
    global: Arc<dyn SharedStore>,
    /// `global` is `local`: every rule is decided in one in-process call.
    in_process: bool,
    /// Requests being held by shaping rules.
    waiting: Waiting,
    /// Quota leases held for leased global rules (see [`super::lease`]).
    leases: Arc<LeaseTable>,
    /// The time of the stores, the leases and the shaping waits.
    clock: Arc<dyn Clock>,
}

impl Limiter {
    /// A limiter for `store`: in-process stores bounded to `max_keys`, and global rules in the
    /// store the backend names ([`backend::open`]; Redis connects in the background).
    pub fn new(store: &Store) -> Self {
        let limiter = Limiter::with_shared(store.max_keys, backend::open(store));
        limiter.local.set_max_bans(store.max_bans);
        limiter.fallback.set_max_bans(store.max_bans);
        limiter
    }

    /// A limiter over `shared` (global rules are decided there; `None`: in the limiter's own
    /// in-process store, with the local rules in one call), its in-process stores bounded to
    /// `max_keys`. [`Limiter::new`] passes the store `[store]` names; tests pass any store,
    /// e.g. one [`MemoryStore`] shared by several limiters standing for instances.
    pub fn with_shared(max_keys: usize, shared: Option<Arc<dyn SharedStore>>) -> Self {
        Limiter::with_clock(max_keys, shared, Arc::new(MonotonicClock::new()))
    }

    /// [`Limiter::with_shared`] on `clock`: tests pass a
    /// [`ManualClock`](super::memory::ManualClock) and move time exactly instead of sleeping.
    pub fn with_clock(
        max_keys: usize,
        shared: Option<Arc<dyn SharedStore>>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        // Registered up front, so /metrics lists them before the first lease.
        lease_metrics();
        let local = Arc::new(MemoryStore::with_clock(max_keys, clock.clone()));
        let in_process = shared.is_none();
        let global = shared.unwrap_or_else(|| local.clone());
        Limiter {
            local,
            fallback: Arc::new(MemoryStore::with_clock(max_keys, clock.clone())),
            global,
            in_process,
            waiting: Waiting::default(),
            leases: Arc::new(LeaseTable::default()),
            clock,
        }
    }

    /// The in-process store (for metrics and tests).
    pub fn memory(&self) -> &MemoryStore {
        &self.local
    }

    /// Forgets this instance's quota lease of `check`'s key without giving its permits back
    /// (see [`LeaseTable::forget`]): the usage API reset the key's counter. Returns the
    /// permits forgotten.
    pub fn forget_lease(&self, check: &Check) -> u64 {
        self.leases.forget(check)
    }

    /// The store global rules are decided in (the in-process store on the memory backend).
    pub fn store(&self) -> &Arc<dyn SharedStore> {
        &self.global
    }

    /// Whether global rules are decided in the limiter's own in-process store (the memory
    /// backend): no store call, no circuit breaker, limits per instance.
    pub fn in_process(&self) -> bool {
        self.in_process
    }

    /// Decides a request's applying rules, each with its check, in file order, under `store`
    /// (the config in force: its timeout and instance count apply).
    pub async fn decide(&self, applying: Vec<(Arc<Policy>, Check)>, store: &Store) -> Outcome {
        self.decide_refundable(applying, store, false).await
    }

    /// [`Limiter::decide`], keeping with `refundable` every admitted rule's charge that can be
    /// given back as a reservation in the outcome's slots (see
    /// [`Reservations::refund_all`](super::reservation::Reservations::refund_all)): the
    /// request may yet be refused before it reaches the upstream (`[upstreams.protect]`).
    ///
    /// A decision made in process ([`Limiter::asks_store`] false: every rule on the memory
    /// backend, or only local rules) is made right away; only one that may wait on the shared
    /// store allocates its future. Boxed: the store call's future (a kilobyte or more with
    /// Redis) would otherwise sit inside every caller's future, and be moved with it.
    pub async fn decide_refundable(
        &self,
        applying: Vec<(Arc<Policy>, Check)>,
        store: &Store,
        refundable: bool,
    ) -> Outcome {
        if !self.asks_store(&applying) {
            return self.decide_in_process(&applying, refundable);
        }
        Box::pin(self.decide_shared(applying, store, refundable)).await
    }

    /// [`Limiter::decide_refundable`] of a request with a rule on the shared store.
    async fn decide_shared(
        &self,
        applying: Vec<(Arc<Policy>, Check)>,
        store: &Store,
        refundable: bool,
    ) -> Outcome {
        let mut plan = Plan::new(&applying, true);
        let mut slots = Slots::default();
        let (admitted, store_call) = self.decide_with_store(&mut plan, store, &mut slots).await;
        let admitted = admitted && shaping::hold(&self.waiting, &mut plan.steps, &*self.clock);
        let mut outcome = settle::settle(self, &plan, admitted, slots, refundable);
        outcome.asked_store = store_call.is_some();
        outcome.store_call = store_call;
        outcome
    }

    /// Whether deciding `applying` may ask the shared store: some enforcing rule is global
    /// and global rules are not decided in process. Otherwise
    /// [`Limiter::decide_in_process`] decides it without waiting.
    pub fn asks_store(&self, applying: &[(Arc<Policy>, Check)]) -> bool {
        !self.in_process
            && applying
                .iter()
                .any(|(rule, _)| !rule.shadow && rule.scope == super::policy::Scope::Global)
    }

    /// [`Limiter::decide_refundable`] for rules that are all decided in process (see
    /// [`Limiter::asks_store`]): one atomic decision, nothing to wait for.
    pub fn decide_in_process(
        &self,
        applying: &[(Arc<Policy>, Check)],
        refundable: bool,
    ) -> Outcome {
        let mut plan = Plan::new(applying, false);
        let admitted = self.charge_local(&mut plan);
        let admitted = admitted && shaping::hold(&self.waiting, &mut plan.steps, &*self.clock);
        settle::settle(self, &plan, admitted, Slots::default(), refundable)
    }

    /// Decides every local step in one atomic call; returns whether they all admit.
    fn charge_local(&self, plan: &mut Plan<'_>) -> bool {
        // One step (the usual case): its check is decided where it lies, not cloned.
        let decisions = match &plan.steps[..] {
            [] => return true,
            [step] => self.local.decide_inline(std::slice::from_ref(step.check)),
            _ => self.local.decide_inline(&plan.local_checks::<Checks>()),
        };
        let admitted = decisions.iter().all(|d| d.allowed);
        plan.put_local(decisions, admitted);
        admitted
    }

    /// With global rules on the shared store: peek at the local rules, spend or take leases,
    /// make the one store call (or fall back), and only then charge the local rules. Returns
    /// whether every step admits, and the store call if there was one; slots the store or the
    /// fallback took go into `slots`.
    async fn decide_with_store(
        &self,
        plan: &mut Plan<'_>,
        store: &Store,
        slots: &mut Slots,
    ) -> (bool, Option<StoreCall>) {
        let local: Vec<Check> = plan.local_checks();
        let peeked = if local.is_empty() {
            Vec::new()
        } else {
            self.local.peek(&local)
        };
        if !peeked.iter().all(|d| d.allowed) {
            plan.put_local(peeked, false);
            return (false, None);
        }
        let steps = &mut plan.steps;
        let mut admitted = leases::take(&self.leases, &*self.clock, steps, store).await;
        let asks = admitted && shared::asks(steps);
        let mut call = None;
        if !admitted {
            // Refused in process by a leased rule: nothing is asked or charged, and requests
            // waiting on this one's lease calls go on.
            leases::abandon(steps);
        } else if asks {
            let start = Instant::now();
            let (ok, failed) = self.ask_shared(steps, store, slots).await;
            admitted = ok;
            call = Some(StoreCall {
                start,
                took: start.elapsed(),
                failed,
            });
        }
        let calls = if asks { 1.0 } else { 0.0 };
        lease_metrics().calls_per_request.observe(calls);
        if admitted && !local.is_empty() {
            let decisions = self.local.decide_inline(&local);
            admitted = decisions.iter().all(|d| d.allowed);
            plan.put_local(decisions, admitted);
        } else {
            plan.put_local(peeked, false);
        }
        (admitted, call)
    }

    /// The one store call for the steps that ask, or, when it fails, their `on_store_error`.
    /// Returns whether they all admit, and whether the call failed.
    async fn ask_shared(
        &self,
        steps: &mut [Step<'_>],
        store: &Store,
        slots: &mut Slots,
    ) -> (bool, bool) {
        let clock = &*self.clock;
        let asked: plan::Asked = steps.iter().map(|s| s.ask.is_some()).collect();
        match shared::call(&self.leases, clock, &self.global, steps, store, slots).await {
            Ok(admitted) => {
                if !admitted {
                    fallback::remember_bans(&self.fallback, steps, &asked);
                }
                (admitted, false)
            }
            Err(e) => (
                fallback::apply(&self.fallback, clock, &e, steps, store.instances, slots),
                true,
            ),
        }
    }

    /// `block_for` bans held in process: the in-process store's and those remembered from the
    /// shared store (ended ones until swept). For metrics: locks each ban table once.
    pub fn bans_held(&self) -> usize {
        let remembered = if self.in_process {
            0
        } else {
            self.fallback.blocked_keys()
        };
        self.local.blocked_keys() + remembered
    }

    /// Lifts the `block_for` ban of `check`'s key that this limiter holds in process: the
    /// in-process store's (local rules, and every rule on the memory backend) and the bans it
    /// remembers from the shared store for an outage. Whether a live ban was lifted. The
    /// shared store's own ban is lifted with [`SharedStore::lift_ban`].
    pub fn lift_ban(&self, check: &Check) -> bool {
        let local = self.local.lift_ban(check);
        let remembered = self.fallback.lift_ban(check);
        local || remembered
    }
}

#[cfg(test)]
mod tests;
