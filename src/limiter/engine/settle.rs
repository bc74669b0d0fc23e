//! The last phase: the steps' decisions become the verdict and the rules' counters; an
//! admitted request keeps its concurrency slots and has its shadow rules decided, a rejected
//! one gives back every slot and puts its leased permits back, uncharged.

use std::sync::Arc;
use std::time::Duration;

use super::plan::{Applying, Place, Plan, Step};
use super::slots::Slots;
use super::{Applied, Limiter, Outcome, Verdict, STORE_RETRY_AFTER};
use crate::limiter::algorithm::quota;
use crate::limiter::memory::MemoryStore;
use crate::limiter::policy::FailureMode;
use crate::limiter::reservation::Reservation;

/// Settles a request whose phases are over: `admitted` is what they concluded, `slots` what
/// the store or the fallback took on its way.
pub(super) fn settle(
    limiter: &Limiter,
    plan: &Plan<'_>,
    admitted: bool,
    mut slots: Slots,
    refundable: bool,
) -> Outcome {
    if admitted {
        slots.renew_while_held();
    } else {
        // Nothing is kept: slots the shared store or the fallback took are given back now.
        slots = Slots::default();
    }
    let mut closed = Vec::new();
    let mut applied = Vec::with_capacity(plan.steps.len());
    for step in &plan.steps {
        let mut charged = step.charged;
        if !admitted && step.from_lease {
            limiter.leases.put_back(step.check);
            charged = false;
        }
        if step.fell_back == Some(FailureMode::Closed) {
            closed.push(step.rule.name.clone());
        }
        if admitted && step.place == Place::Local {
            slots.hold_local(&limiter.local, step.check);
        }
        if admitted && (step.rule.respond.settles() || (refundable && step.rule.refundable())) {
            reserve(limiter, step, &mut slots);
        }
        if let Some(decision) = &step.decision {
            let mut decision = decision.clone();
            if !admitted && decision.allowed && !charged {
                // It would have admitted, but the request was refused and this rule kept
                // nothing of it: what it has left is what it had.
                decision.remaining = decision
                    .remaining
                    .saturating_add(step.check.cost)
                    .min(quota(&step.check.limit));
            }
            applied.push(Applied {
                rule: step.rule.clone(),
                counter: step.check.counter,
                decision,
            });
        }
    }
    // A rule left undecided (an earlier phase refused the request first) might have refused
    // it too: only a rule that can do nothing worse than slow may stay unknown.
    let undecided = plan
        .steps
        .iter()
        .any(|s| s.decision.is_none() && s.rule.limit.slow_rate().is_none());
    let verdict = verdict(admitted, &applied, closed, undecided);
    let shadow_rejected = if admitted {
        shadow_rules(&limiter.local, plan.shadow(), &mut slots)
    } else {
        Vec::new()
    };
    Outcome {
        verdict,
        applied,
        shadow_rejected,
        slots,
        asked_store: false,
        store_call: None,
    }
}

/// Keeps the reservation an admitted step of a response-aware rule (or, with `refundable`,
/// of any rule whose charge can be given back) charged, where it was
/// charged: in process, in the shared store's window, in a quota lease, or in the `local`
/// fallback (`open` charged nothing).
fn reserve(limiter: &Limiter, step: &Step<'_>, slots: &mut Slots) {
    let (rule, check) = (step.rule.clone(), step.check.clone());
    let reservation = match (step.place, step.fell_back) {
        (Place::Local, _) => Reservation::memory(rule, check, &limiter.local),
        (Place::Shared, None) if step.from_lease => match step.lease_stamp {
            Some(stamp) => {
                Reservation::leased(rule, check, &limiter.leases, &limiter.global, stamp)
            }
            None => return,
        },
        (Place::Shared, None) => {
            let (holder, grant) = step.charged_in;
            Reservation::shared(rule, check, &limiter.global, grant, holder)
        }
        (Place::Shared, Some(FailureMode::Local)) => {
            Reservation::memory(rule, check, &limiter.fallback)
        }
        _ => return,
    };
    slots.reservations.push(reservation);
}

/// The verdict, counting each rule's decision: every rule of an admitted request counts it
/// allowed; the rules that rejected a rejected one count it rejected, or slowed when every
/// one of them slows (a 503 of `closed` rules is counted by the fallback).
fn verdict(admitted: bool, applied: &[Applied], closed: Vec<Arc<str>>, undecided: bool) -> Verdict {
    if admitted {
        for a in applied {
            a.rule.counters.allowed.inc();
        }
        let delay = applied
            .iter()
            .map(|a| a.decision.delay)
            .max()
            .unwrap_or_default();
        return Verdict::Allow { delay };
    }
    if !closed.is_empty() {
        return Verdict::Unavailable {
            retry_after: STORE_RETRY_AFTER,
            rules: closed,
        };
    }
    if let Some(slow) = slowed(applied, undecided) {
        return slow;
    }
    let mut status = 429;
    let mut retry_after = Duration::ZERO;
    let mut names = Vec::new();
    for a in applied.iter().filter(|a| !a.decision.allowed) {
        if names.is_empty() {
            status = a.rule.status;
        }
        a.rule.counters.rejected.inc();
        retry_after = retry_after.max(a.decision.retry_after);
        names.push(a.rule.name.clone());
    }
    Verdict::Reject {
        status,
        retry_after,
        rules: names,
    }
}

/// The slowed verdict of a refused request, when every rule that refused it slows
/// (`mode = "slow"`) and no rule that could reject is left undecided: the smallest
/// `slow_rate` applies. `None`: it stays refused.
fn slowed(applied: &[Applied], undecided: bool) -> Option<Verdict> {
    if undecided {
        return None;
    }
    let mut rate = u64::MAX;
    let mut rules = Vec::new();
    for a in applied.iter().filter(|a| !a.decision.allowed) {
        rate = rate.min(a.rule.limit.slow_rate()?);
        rules.push(a.rule.name.clone());
    }
    if rules.is_empty() {
        return None;
    }
    for a in applied.iter().filter(|a| !a.decision.allowed) {
        a.rule.counters.slowed.inc();
    }
    Some(Verdict::Slow { rate, rules })
}

/// Decides an admitted request's shadow rules one by one, in process: they count and never
/// reject. Returns the ones that would have rejected it; the concurrency slots of those that
/// admit are held with the request's.
fn shadow_rules<'a>(
    store: &Arc<MemoryStore>,
    shadow: impl Iterator<Item = &'a Applying>,
    slots: &mut Slots,
) -> Vec<Arc<str>> {
    let mut rejected = Vec::new();
    for (rule, check) in shadow {
        let decisions = store.decide(std::slice::from_ref(check));
        match decisions.first() {
            Some(d) if !d.allowed => {
                rule.counters.shadow_rejected.inc();
                rejected.push(rule.name.clone());
            }
            Some(_) => {
                rule.counters.allowed.inc();
                slots.hold_local(store, check);
                if rule.respond.settles() {
                    let r = Reservation::memory(rule.clone(), check.clone(), store);
                    slots.reservations.push(r);
                }
            }
            None => {}
        }
    }
    rejected
}
