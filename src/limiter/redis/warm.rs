//! The start-up warm-up: connect, read a cluster's slot map and load every script before the
//! gateway accepts requests. Without it the first request made the connection and loaded the
//! decide script inside its own `store.timeout` (20 ms by default), and on a healthy Redis some
//! fresh starts answered their first requests by `on_store_error` (503 for `closed`).

use std::time::Duration;

use tokio::time::Instant;

use super::conn::Target;
use super::script::{DECIDE, LEASE_RETURN, RELEASE, RENEW, TRUE_UP, USAGE};
use super::RedisStore;

/// Pause between two attempts to load the scripts on a connection that failed to.
const RETRY: Duration = Duration::from_millis(100);

impl RedisStore {
    /// Connects (on the current runtime, which then carries the connection), reads a
    /// cluster's slot map (the connect task does it before it publishes the connection) and
    /// loads every script on the server (every master of a cluster), within `deadline`.
    /// Whether all of it was done; past the deadline the connection goes on being made in
    /// the background and requests meanwhile apply their rules' `on_store_error`.
    pub async fn warm_up(&self, deadline: Duration) -> bool {
        if matches!(self.inner.target, Target::Broken(_)) {
            return false;
        }
        self.start();
        let until = Instant::now() + deadline;
        let endpoint = &self.inner.endpoint;
        let ready = async {
            loop {
                let error = match self.inner.connection().await {
                    Ok(conn) => match conn.load_scripts(&scripts()).await {
                        Ok(()) => return,
                        Err(e) => e.to_string(),
                    },
                    Err(e) => e.to_string(),
                };
                tracing::debug!(redis = %endpoint, error = %error, "warm-up: scripts not loaded yet; retrying");
                tokio::time::sleep(RETRY).await;
            }
        };
        match tokio::time::timeout_at(until, ready).await {
            Ok(()) => {
                tracing::info!(redis = %endpoint, "Redis ready: connected and scripts loaded before accepting requests");
                true
            }
            Err(_) => {
                tracing::warn!(
                    redis = %endpoint,
                    connect_timeout_ms = u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX),
                    "Redis not ready within store.connect_timeout; accepting requests anyway (global rules apply on_store_error until Redis answers)"
                );
                false
            }
        }
    }
}

/// Every script the store runs.
fn scripts() -> [&'static super::script::Lua; 6] {
    [&DECIDE, &USAGE, &RELEASE, &RENEW, &LEASE_RETURN, &TRUE_UP]
}
