//! The limiter's background services: returning unspent quota lease permits, and sweeping
//! idle keys out of the in-process stores.

use std::sync::Arc;
use std::time::Duration;

use super::Limiter;
use crate::limiter::lease::{LeaseTable, RETURN_EVERY};
use crate::limiter::memory::{Clock, MemoryStore};
use crate::limiter::store::{HeardReset, SharedStore};

impl Limiter {
    /// A background service that gives back the unspent permits of ended quota leases, in one
    /// batched call per [`RETURN_EVERY`], and every permit held on shutdown.
    pub fn returner(&self) -> Returner {
        Returner {
            table: self.leases.clone(),
            shared: self.global.clone(),
            clock: self.clock.clone(),
        }
    }

    /// Gives back every quota lease permit held now (on reload: a rule's numbers or lease
    /// may have changed). Returns how many the store took back.
    pub async fn return_leases(&self) -> u64 {
        give_back(&self.leases, &self.global, &*self.clock, true).await
    }

    /// A background service that listens for counter resets announced by the shared store
    /// (made by any instance) and forgets this instance's lease permits of the old epochs.
    pub fn reset_listener(&self) -> ResetListener {
        ResetListener {
            table: self.leases.clone(),
            shared: self.global.clone(),
        }
    }

    /// A background service that sweeps idle keys out of the in-process stores.
    pub fn sweeper(&self) -> Sweeper {
        Sweeper {
            stores: vec![self.local.clone(), self.fallback.clone()],
        }
    }
}

/// Gives back what `table` has due (with `all`, everything it holds) in one batched call.
async fn give_back(
    table: &LeaseTable,
    store: &Arc<dyn SharedStore>,
    clock: &dyn Clock,
    all: bool,
) -> u64 {
    let due = table.due(all, clock.instant());
    if due.is_empty() {
        return 0;
    }
    store.give_back(&due).await
}

/// Background service that gives back unspent quota lease permits (see
/// [`Limiter::returner`]).
pub struct Returner {
    table: Arc<LeaseTable>,
    shared: Arc<dyn SharedStore>,
    clock: Arc<dyn Clock>,
}

#[async_trait::async_trait]
impl pingora::services::background::BackgroundService for Returner {
    async fn start(&self, mut shutdown: pingora::server::ShutdownWatch) {
        let mut tick = tokio::time::interval(RETURN_EVERY);
        let (table, shared, clock) = (&self.table, &self.shared, &*self.clock);
        loop {
            tokio::select! {
                _ = shutdown.changed() => {
                    // Shutting down: lease no more, and give back every permit held, so the
                    // other instances get them at once rather than when their window ends.
                    table.close();
                    give_back(table, shared, clock, true).await;
                    return;
                }
                _ = tick.tick() => {
                    give_back(table, shared, clock, false).await;
                }
            }
        }
    }
}

/// Background service that applies resets heard from the shared store to the lease table
/// (see [`Limiter::reset_listener`]).
pub struct ResetListener {
    table: Arc<LeaseTable>,
    shared: Arc<dyn SharedStore>,
}

#[async_trait::async_trait]
impl pingora::services::background::BackgroundService for ResetListener {
    async fn start(&self, mut shutdown: pingora::server::ShutdownWatch) {
        let table = &self.table;
        let heard = |r: HeardReset| {
            table.forget_before(&r.rule, r.counter, r.at_us);
        };
        tokio::select! {
            _ = shutdown.changed() => {}
            _ = self.shared.hear_resets(&heard) => {}
        }
    }
}

/// How often idle keys are swept out of the in-process stores, so that quiet shards give their
/// memory back even when no request touches them.
pub const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Background service that sweeps the in-process stores every [`SWEEP_EVERY`].
pub struct Sweeper {
    stores: Vec<Arc<MemoryStore>>,
}

#[async_trait::async_trait]
impl pingora::services::background::BackgroundService for Sweeper {
    async fn start(&self, mut shutdown: pingora::server::ShutdownWatch) {
        let mut tick = tokio::time::interval(SWEEP_EVERY);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => {
                    let stores = self.stores.clone();
                    // Sweeping a million keys takes milliseconds: keep it off the workers.
                    let _ = tokio::task::spawn_blocking(move || stores.iter().for_each(|s| s.sweep())).await;
                }
            }
        }
    }
}
