//! Opens the store `[store]` names. The one place that knows which type each backend is: the
//! engine takes whatever store it is given ([`super::engine::Limiter::with_shared`]).

use std::sync::Arc;
use std::time::Duration;

use super::redis::{Options, RedisStore};
use super::settings::{Backend, Store};
use super::store::SharedStore;

/// The store for global rules that `store` names: `None` for the memory backend (the engine
/// decides them in its own in-process store, with the local rules, in one call), the Redis
/// store for `redis` and `redis-cluster` (it connects in the background).
///
/// A Redis store whose URL(s) cannot be used counts as down for good, not as absent: absent
/// would make every global rule a per-instance limit at the full limit while everything
/// reported healthy. Validation refuses such URLs, so this happens only to settings made by
/// hand.
pub fn open(store: &Store) -> Option<Arc<dyn SharedStore>> {
    match store.backend {
        Backend::Memory => None,
        Backend::Redis | Backend::RedisCluster => {
            Some(match RedisStore::with_options(store, options_from_env()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(error = %e, "cannot set up the Redis store; it counts as down and global rules apply on_store_error");
                    RedisStore::broken(store, e)
                }
            })
        }
    }
}

/// The Redis store's options: the defaults, but for the slot TTL that tests of long requests
/// shorten through the internal `FLOODGATE_TEST_SLOT_TTL_MS` environment variable (300 s is
/// too long to wait for in a test). Not a setting (README, "Running the tests").
fn options_from_env() -> Options {
    let mut options = Options::default();
    if let Some(ms) = std::env::var("FLOODGATE_TEST_SLOT_TTL_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&ms| ms > 0)
    {
        options.lease_ttl = Duration::from_millis(ms);
    }
    options
}
