//! The failure phase: the store call failed (error, timeout, open circuit), and each rule it
//! was asking for decides by its `on_store_error`: `open` admits uncounted, `closed` refuses
//! (the request is answered 503), `local` decides in process with `limit / instances`.
//!
//! Bans outlive the outage: every `block_for` ban the shared store answered is remembered in
//! the fallback store's ban table (bounded by `max_bans`, each with its end), and while the
//! store fails a key banned there is refused (429, `Retry-After` what is left of the ban)
//! whatever its rule's `on_store_error`; the `local` fallback adds the bans it decides itself.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::plan::{Asked, Checks, Step};
use super::slots::Slots;
use super::STORE_RETRY_AFTER;
use crate::limiter::memory::{Clock, MemoryStore};
use crate::limiter::policy::FailureMode;
use crate::limiter::store::StoreError;
use crate::limiter::{Check, Decision};

/// Decides every step the failed call was asking for (and takes it out of the call). Returns
/// whether they all admit; concurrency slots the `local` fallback took go into `slots`.
pub(super) fn apply(
    fallback: &Arc<MemoryStore>,
    clock: &dyn Clock,
    error: &StoreError,
    steps: &mut [Step<'_>],
    instances: u64,
    slots: &mut Slots,
) -> bool {
    let now_s = clock.now_ns() / 1_000_000_000;
    let mut closed = false;
    let mut banned = false;
    let mut local = Checks::new();
    for step in steps.iter_mut().filter(|s| s.ask.is_some()) {
        step.ask = None;
        if let Some(left) = fallback.ban_left(step.check) {
            // Banned when the store last answered: refused until the ban ends, as the store
            // would, whatever on_store_error says.
            step.decision = Some(MemoryStore::banned(step.check, left));
            banned = true;
            continue;
        }
        let rule = &step.rule;
        let mode = rule.on_store_error;
        log_store_failure(error, &rule.name, mode.as_str(), now_s);
        step.fell_back = Some(mode);
        // Open shows the quota full: nothing was counted. Local shows it so until decided.
        let mut decision = Decision::unlimited(step.check.limit.limit());
        match mode {
            FailureMode::Open => rule.counters.fail_open.inc(),
            FailureMode::Closed => {
                rule.counters.fail_closed.inc();
                closed = true;
                decision.allowed = false;
                decision.remaining = 0;
                decision.retry_after = STORE_RETRY_AFTER;
            }
            FailureMode::Local => {
                rule.counters.fail_local.inc();
                local.push(divided(step.check, instances));
            }
        }
        step.decision = Some(decision);
    }
    if closed || banned {
        // Answered 503 (or 429: a ban) whatever the others say: nothing is decided or charged
        // in process.
        return false;
    }
    if local.is_empty() {
        return true;
    }
    let decisions = fallback.decide(&local);
    let admitted = decisions.iter().all(|d| d.allowed);
    if admitted {
        slots.hold_fallback(fallback, &local);
    }
    let fell_back_local = steps
        .iter_mut()
        .filter(|s| s.fell_back == Some(FailureMode::Local));
    for (step, d) in fell_back_local.zip(decisions) {
        step.charged = admitted;
        step.decision = Some(d);
    }
    admitted
}

/// Remembers the bans the store's answer holds: each asked step of a `block_for` rule that
/// the store rejected is banned until its `Retry-After` (what is left of the ban, or, for the
/// rejection that starts one, at least `block_for`). `asked` flags the steps that joined the
/// call.
pub(super) fn remember_bans(fallback: &MemoryStore, steps: &[Step<'_>], asked: &Asked) {
    for (step, _) in steps.iter().zip(asked).filter(|(_, &asked)| asked) {
        if step.check.limit.block_for().is_zero() {
            continue;
        }
        if let Some(d) = step.decision.as_ref().filter(|d| !d.allowed) {
            fallback.remember_ban(step.check, d.retry_after);
        }
    }
}

/// The check with its limit shared out among `instances` gateways (at least 1 each).
fn divided(check: &Check, instances: u64) -> Check {
    let mut c = check.clone();
    c.limit = check.limit.divided(instances);
    c
}

/// Store failures can come at request rate: one log line per second (of `now_s`) at most,
/// with how many decisions were made that way since the last line. Every decision is
/// counted in metrics.
fn log_store_failure(error: &StoreError, rule: &str, mode: &str, now_s: u64) {
    static LAST: AtomicU64 = AtomicU64::new(0);
    static SINCE: AtomicU64 = AtomicU64::new(0);
    let suppressed = SINCE.fetch_add(1, Ordering::Relaxed);
    let last = LAST.load(Ordering::Relaxed);
    if now_s > last
        && LAST
            .compare_exchange(last, now_s, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        SINCE.store(0, Ordering::Relaxed);
        tracing::warn!(
            error = %error,
            rule,
            on_store_error = mode,
            decisions_since_last_line = suppressed + 1,
            "store failed; rule decided by its on_store_error"
        );
    }
}
