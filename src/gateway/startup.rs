//! The start: the store is made ready (connected, scripts loaded, a cluster's slot map read)
//! before the front doors serve, within `[store] connect_timeout`, and `/readyz` says not ready
//! until it is.
//!
//! The proxy service's listeners are bound only after [`Gateway::warm_up`] (see
//! `crate::server`), so no request is accepted on a store that would answer it by
//! `on_store_error`; the rate-limit service waits for it too. Past the deadline they serve
//! anyway: a gateway whose Redis is down at start still starts, and its rules apply their
//! `on_store_error` until Redis answers.

use tokio::sync::OnceCell;

use super::Gateway;

/// Whether the warm-up ran, and how it ended.
#[derive(Default)]
pub(super) struct Startup {
    /// Set once the warm-up is over: whether the store got ready within the deadline.
    warmed: OnceCell<bool>,
}

impl Gateway {
    /// Makes the store ready, once, within the start's `store.connect_timeout`; later and
    /// concurrent callers wait for that one warm-up. Whether the store got ready in time. The
    /// connection is made on the caller's runtime: call it from the service that serves
    /// requests.
    pub async fn warm_up(&self) -> bool {
        *self
            .startup
            .warmed
            .get_or_init(|| async {
                let deadline = self.started_with.store.connect_timeout;
                // The token issuers' keys are fetched beside the store, each within its own
                // fetch_timeout.
                let config = self.config.load_full();
                let tokens = config.auth.tokens.prepare();
                let (store, ()) = tokio::join!(self.limiter.store().warm_up(deadline), tokens);
                store
            })
            .await
    }

    /// Whether the gateway is ready for traffic (what `/readyz` answers): on the memory
    /// backend at once; with Redis, once the start-up warm-up is over and the store has been
    /// connected at least once (a later outage does not make it unready: the rules'
    /// `on_store_error` covers that); and in both cases once every `[[auth.jwt]]` issuer has
    /// its keys (kept while its provider is down later).
    pub fn is_ready(&self) -> bool {
        let store = self.limiter.in_process()
            || (self.startup.warmed.initialized() && self.limiter.store().status().connected);
        store && self.config.load().auth.tokens.ready()
    }
}
