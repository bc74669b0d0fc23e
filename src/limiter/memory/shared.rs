//! The memory store behind the store trait, so that the engine holds every backend the same
//! way. The engine decides global rules in its own in-process store in one call with the
//! local ones (it sees that the store is that one); this is the path a memory store shared by
//! several limiters takes, and what the scenario suite of every backend (`tests/stores.rs`)
//! runs.

use std::time::Duration;

use async_trait::async_trait;

use super::MemoryStore;
use crate::limiter::store::{
    Changed, SharedStore, StoreError, StoreStatus, UsageCall, UsageChange,
};
use crate::limiter::{Check, Decision};

#[async_trait]
impl SharedStore for MemoryStore {
    /// One atomic call in process: it never fails and never waits, so `timeout` cannot be
    /// reached. Concurrency slots are counted per check, not per holder: releasing a check
    /// gives back one slot, which is what the holder took.
    async fn decide(
        &self,
        checks: &[Check],
        _holder: u64,
        _timeout: Duration,
    ) -> Result<Vec<Decision>, StoreError> {
        Ok(MemoryStore::decide(self, checks))
    }

    async fn release(&self, checks: &[Check], _holder: u64) {
        let holding = checks
            .iter()
            .filter(|c| c.limit.algorithm().capabilities().holds_slots);
        for check in holding {
            MemoryStore::release(self, check);
        }
    }

    async fn usage(
        &self,
        check: &Check,
        change: UsageChange,
        call: UsageCall<'_>,
    ) -> Result<Changed, StoreError> {
        Ok(MemoryStore::usage(
            self,
            check,
            change,
            call.idempotency_key,
        ))
    }

    async fn lift_ban(&self, check: &Check, _timeout: Duration) -> Result<bool, StoreError> {
        Ok(MemoryStore::lift_ban(self, check))
    }

    fn status(&self) -> StoreStatus {
        StoreStatus {
            up: true,
            connected: true,
            endpoint: "in-process".to_string(),
            drops_counters: false,
        }
    }
}
