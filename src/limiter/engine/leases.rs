//! The lease phase: each shared step of a leased rule spends permits in hand (see
//! [`crate::limiter::lease`]), is refused in process (the store refused its key moments ago),
//! or joins the store call, asking for a lease when it may. Shared steps of other rules join
//! the call as exact checks.

use std::sync::Arc;

use super::plan::{Ask, Place, Step};
use crate::limiter::lease::{leasable, Lease, LeaseTable, Take};
use crate::limiter::memory::Clock;
use crate::limiter::settings::Store;
use crate::limiter::Check;

/// How many times a request waits for another request's lease call on the same key before
/// it asks the store itself.
const WAITS: usize = 3;

/// Runs the lease phase over the shared steps. Returns false when a leased rule refused the
/// request in process: then nothing should be asked of the store. Either way, every step
/// that took permits is marked (`from_lease`), to put them back if the request is rejected.
pub(super) async fn take(
    table: &Arc<LeaseTable>,
    clock: &dyn Clock,
    steps: &mut [Step<'_>],
    store: &Store,
) -> bool {
    let mut refused = false;
    for step in steps.iter_mut().filter(|s| s.place == Place::Shared) {
        let Some(lease) = lease_of(step) else {
            step.ask = Some(Ask::Exact);
            continue;
        };
        match take_one(table, clock, step.check, &lease, store).await {
            Take::Spent(d, stamp) => {
                step.decision = Some(d);
                step.from_lease = true;
                step.lease_stamp = Some(stamp);
                step.charged = true;
            }
            Take::Denied(d) => {
                step.decision = Some(d);
                refused = true;
            }
            Take::Lease { want, guard } => {
                let guard = Box::new(guard);
                step.ask = Some(Ask::Lease { want, guard });
            }
            // Still leasing elsewhere after the waits, or leasing is over: decide exactly.
            Take::Wait(_) | Take::Exact => step.ask = Some(Ask::Exact),
        }
    }
    !refused
}

/// Forgets every step's place in the store call: lease calls that will not be made no
/// longer hold the requests waiting on them.
pub(super) fn abandon(steps: &mut [Step]) {
    for step in steps {
        step.ask = None;
    }
}

/// The rule's leasing, where it may lease. Validation allows `lease` only where it is exact;
/// hand-built policies elsewhere are decided exactly.
fn lease_of(step: &Step<'_>) -> Option<Lease> {
    let limit = &step.check.limit;
    step.rule
        .lease
        .filter(|_| leasable(limit.algorithm(), limit.mode()))
}

/// Takes from the lease of `check`'s key; while another request is leasing for the key,
/// waits (up to the store timeout, [`WAITS`] times) to share its call.
async fn take_one(
    table: &Arc<LeaseTable>,
    clock: &dyn Clock,
    check: &Check,
    lease: &Lease,
    store: &Store,
) -> Take {
    let mut waits = 0;
    loop {
        match table.take(check, lease, clock.instant()) {
            Take::Wait(mut rx) if waits < WAITS => {
                waits += 1;
                let _ = tokio::time::timeout(store.timeout, rx.changed()).await;
            }
            other => return other,
        }
    }
}
