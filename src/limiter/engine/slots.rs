//! The concurrency slots one request holds, released when they are dropped.

use std::sync::Arc;
use std::time::Duration;

use crate::limiter::memory::MemoryStore;
use crate::limiter::reservation::Reservations;
use crate::limiter::store::SharedStore;
use crate::limiter::Check;

/// Concurrency slots held by one request (not quota leases: see [`crate::limiter::lease`]).
/// Dropping it releases them, so a slot is given back however the exchange ends: finished,
/// upstream error, client gone or timeout. While held, shared slots are renewed every third of
/// their TTL, so a request longer than the TTL (an export, a stream) keeps its slot until it
/// ends.
#[derive(Default)]
pub struct Slots {
    local_store: Option<Arc<MemoryStore>>,
    local: Vec<Check>,
    fallback_store: Option<Arc<MemoryStore>>,
    fallback: Vec<Check>,
    /// The shared store and the holder id the slots were taken under.
    shared_store: Option<(Arc<dyn SharedStore>, u64)>,
    shared: Vec<Check>,
    /// Renews the shared slots while the request runs; aborted when they are released.
    renewal: Option<tokio::task::JoinHandle<()>>,
    /// The reservations of response-aware rules, held like the slots until the exchange
    /// ends; dropped unsettled, they stay charged.
    pub(super) reservations: Reservations,
}

/// Whether `check` holds a slot while its request runs (rather than a rate unit).
fn holds_slot(check: &Check) -> bool {
    check.limit.algorithm().capabilities().holds_slots
}

impl Slots {
    /// Holds `check`'s slot in the in-process `store`, if it is a concurrency check.
    pub(super) fn hold_local(&mut self, store: &Arc<MemoryStore>, check: &Check) {
        if holds_slot(check) {
            self.local.push(check.clone());
            if self.local_store.is_none() {
                self.local_store = Some(store.clone());
            }
        }
    }

    /// Holds the slots that the `local` fallback `store` took for `checks`.
    pub(super) fn hold_fallback(&mut self, store: &Arc<MemoryStore>, checks: &[Check]) {
        self.fallback = checks.iter().filter(|c| holds_slot(c)).cloned().collect();
        if !self.fallback.is_empty() {
            self.fallback_store = Some(store.clone());
        }
    }

    /// Holds the slots that the shared `store` took for `checks` under `holder`.
    pub(super) fn hold_shared(
        &mut self,
        store: &Arc<dyn SharedStore>,
        holder: u64,
        checks: &[Check],
    ) {
        self.shared = checks.iter().filter(|c| holds_slot(c)).cloned().collect();
        if !self.shared.is_empty() {
            self.shared_store = Some((store.clone(), holder));
        }
    }

    /// Starts renewing the shared slots every third of the store's slot TTL (inside a Tokio
    /// runtime; outside one the slots simply live their TTL). A store without a slot TTL
    /// needs no renewal.
    pub(super) fn renew_while_held(&mut self) {
        let Some((store, holder)) = &self.shared_store else {
            return;
        };
        if self.shared.is_empty() {
            return;
        }
        let Some(ttl) = store.slot_ttl() else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let every = (ttl / 3).max(Duration::from_millis(10));
        let (store, holder, checks) = (store.clone(), *holder, self.shared.clone());
        self.renewal = Some(rt.spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            loop {
                tick.tick().await;
                store.renew(&checks, holder).await;
            }
        }));
    }

    /// The request's reservations, for the proxy to settle on the response.
    pub fn reservations(&mut self) -> &mut Reservations {
        &mut self.reservations
    }

    /// Whether the request holds no slot.
    pub fn is_empty(&self) -> bool {
        self.local.is_empty() && self.fallback.is_empty() && self.shared.is_empty()
    }
}

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slots")
            .field("local", &self.local.len())
            .field("fallback", &self.fallback.len())
            .field("shared", &self.shared.len())
            .finish()
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
        if let Some(store) = &self.local_store {
            for c in self.local.drain(..) {
                store.release(&c);
            }
        }
        if let Some(store) = &self.fallback_store {
            for c in self.fallback.drain(..) {
                store.release(&c);
            }
        }
        if let Some((store, holder)) = self.shared_store.take() {
            let checks = std::mem::take(&mut self.shared);
            if checks.is_empty() {
                return;
            }
            // Releasing needs a round trip; the slots expire by themselves if this cannot run.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move { store.release(&checks, holder).await });
            }
        }
    }
}
