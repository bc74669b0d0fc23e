//! The store phase: the request's one call to the shared store, for every shared step the
//! lease phase left asking (exact checks, and leases for keys that ran out), and the
//! answers handed to the lease table.

use std::sync::Arc;

use super::plan::{Ask, Step};
use super::slots::Slots;
use crate::limiter::lease::LeaseTable;
use crate::limiter::memory::Clock;
use crate::limiter::settings::Store;
use crate::limiter::store::{bounded, Grant, SharedStore, StoreError};
use crate::limiter::{Check, Decision};

/// Whether any step joins the store call.
pub(super) fn asks(steps: &[Step<'_>]) -> bool {
    steps.iter().any(|s| s.ask.is_some())
}

/// Makes the call and gives each asking step its decision. Returns whether the call admits
/// (all or nothing); its concurrency slots then go into `slots`, under a holder id of this
/// request's own. On an error the asking steps are left undecided, for the fallback; their
/// lease calls are over either way.
pub(super) async fn call(
    table: &Arc<LeaseTable>,
    clock: &dyn Clock,
    shared: &Arc<dyn SharedStore>,
    steps: &mut [Step<'_>],
    store: &Store,
    slots: &mut Slots,
) -> Result<bool, StoreError> {
    let asking = || steps.iter().filter(|s| s.ask.is_some());
    let checks: Vec<Check> = asking().map(|s| s.check.clone()).collect();
    // Exact checks want 0 permits: the same call decides them exactly.
    let wants: Vec<u64> = asking()
        .map(|s| match &s.ask {
            Some(Ask::Lease { want, .. }) => *want,
            _ => 0,
        })
        .collect();
    let holder = fastrand::u64(..);
    // A lease's time runs from before the call, so it ends no later than in the store's time.
    let sent = clock.instant();
    let answer = shared
        .decide_leased(&checks, &wants, store.instances, holder, store.timeout)
        .await
        .and_then(|answers| checked(answers, &checks, &wants));
    let answers = match answer {
        Ok(answers) => answers,
        Err(error) => {
            // Waiters go on (and meet the same trouble); permits in hand stay spendable until
            // their lease ends. The steps keep a mark for the fallback.
            for step in steps.iter_mut().filter(|s| s.ask.is_some()) {
                step.ask = Some(Ask::Exact);
            }
            return Err(error);
        }
    };
    let admitted = answers.iter().all(|(d, _)| d.allowed);
    if admitted {
        slots.hold_shared(shared, holder, &checks);
    }
    let asking = steps.iter_mut().filter(|s| s.ask.is_some());
    for (step, (decision, grant)) in asking.zip(answers) {
        // Asked and answered: the step leaves the call.
        if let Some(Ask::Lease { guard, .. }) = step.ask.take() {
            step.lease_stamp = table.fill(*guard, step.check, &decision, grant, admitted, sent);
            step.from_lease = admitted && grant.granted > 0;
        }
        step.charged_in = (holder, grant);
        // A slot of a request the store did not admit whole is given back by the store.
        step.charged = grant.granted > 0 && (admitted || !holds_slots(step.check));
        step.decision = Some(decision);
    }
    Ok(admitted)
}

/// The store's answers, one per check, each held to its rule's own bounds (see [`bounded`]):
/// never trust the store's numbers beyond the rule's. An answer that does not hold one
/// decision per check is a store failure, never an admit.
fn checked(
    answers: Vec<(Decision, Grant)>,
    checks: &[Check],
    wants: &[u64],
) -> Result<Vec<(Decision, Grant)>, StoreError> {
    if answers.len() != checks.len() {
        return Err(StoreError::Failed(format!(
            "the store answered {} decisions for {} checks",
            answers.len(),
            checks.len()
        )));
    }
    Ok(answers
        .into_iter()
        .zip(checks.iter().zip(wants))
        .map(|(answer, (check, &wanted))| bounded(check, wanted, answer))
        .collect())
}

/// Whether `check` holds a concurrency slot rather than a rate unit.
fn holds_slots(check: &Check) -> bool {
    check.limit.algorithm().capabilities().holds_slots
}
