//! The background task that (re)connects a store: with backoff, for as long as it takes and
//! the store exists; once connected it publishes the connection and reads the server's
//! eviction policy ([`super::probe`]).

use std::sync::atomic::Ordering;
use std::sync::Weak;

use super::conn::{connect, Conn, RECONNECT_MAX, RECONNECT_MIN};
use super::probe::check_policy;
use super::socket::CONNECT_TIMEOUT;
use super::Inner;

/// Connects (with backoff, for as long as it takes and the store exists), publishes the
/// connection, then reads `maxmemory-policy`.
pub(super) async fn connect_loop(store: Weak<Inner>) {
    let mut delay = RECONNECT_MIN;
    let mut attempts: u64 = 0;
    loop {
        let started = tokio::time::Instant::now();
        // Hold the store only while using it, so that dropping it ends this task.
        let Some(inner) = store.upgrade() else {
            return;
        };
        let target = inner.target.clone();
        let endpoint = inner.endpoint.clone();
        drop(inner);
        let attempt = tokio::time::timeout(4 * CONNECT_TIMEOUT, connect(&target)).await;
        let error = match attempt {
            Ok(Ok(conn)) => {
                let Some(inner) = store.upgrade() else {
                    return;
                };
                if matches!(conn, Conn::Cluster(..)) {
                    // Know the masters before the first call, so that each is guarded by its
                    // own breaker from the start.
                    inner.refresh_topology_with(&conn).await;
                    inner.keep_topology_fresh();
                }
                inner.conn.send_replace(Some(conn.clone()));
                inner.connecting.store(false, Ordering::Release);
                tracing::info!(redis = %endpoint, "connected to Redis");
                check_policy(store, conn).await;
                return;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "connection attempt timed out".to_string(),
        };
        // One line at first, then one every ~30 attempts: a long outage must not flood logs.
        if attempts.is_multiple_of(30) {
            tracing::warn!(redis = %endpoint, error = %error, attempts = attempts + 1, "cannot connect to Redis; retrying in the background (global rules apply on_store_error)");
        }
        attempts += 1;
        // The delay counts from the attempt's start: an attempt that waited out its
        // handshake (a black-holed path) is followed at once, so the first attempt after the
        // fault ends is at most one handshake away.
        tokio::time::sleep_until(started + delay).await;
        delay = (delay * 2).min(RECONNECT_MAX);
    }
}
