//! The shared store: Redis (standalone or Cluster), deciding all global rules of a request in
//! one atomic Lua call.
//!
//! STUB: the interface the engine is written against; the implementation lands with the Redis
//! issue.

use std::sync::Arc;
use std::time::Duration;

use super::{Check, Decision};
use crate::config::Store;

/// Why the store could not decide.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// No answer within `store.timeout`.
    #[error("store timed out")]
    Timeout,
    /// The circuit breaker is open: the store is not being called for a cool-down.
    #[error("store circuit breaker open")]
    CircuitOpen,
    /// Redis answered with an error, or the connection failed.
    #[error("store error: {0}")]
    Redis(String),
}

/// A Redis-backed store.
pub struct RedisStore {}

impl RedisStore {
    /// Builds the store without waiting for Redis: it connects in the background, so the
    /// gateway starts (and applies each rule's `on_store_error`) while Redis is down.
    pub fn new(_store: &Store) -> Result<Arc<RedisStore>, StoreError> {
        Err(StoreError::Redis("the Redis store is not built yet".into()))
    }

    /// Decides `checks` atomically (all charged or none) in one round trip (per cluster slot),
    /// giving up after `timeout`. `lease` identifies this request's concurrency slots.
    pub async fn decide(
        &self,
        _checks: &[Check],
        _lease: u64,
        _timeout: Duration,
    ) -> Result<Vec<Decision>, StoreError> {
        Err(StoreError::Redis("not built".into()))
    }

    /// Releases the concurrency slots that `lease` took for `checks`.
    pub async fn release(&self, _checks: &[Check], _lease: u64) {}
}
