//! Hot reload: the triggers (a watched file changed, SIGHUP, and `POST /reload` from the admin
//! API) and the one reload they all run, [`Gateway::reload`].
//!
//! A reload parses and validates the whole file first (`crate::config::watch::load_settled`
//! waits until the files are complete) and swaps it in with one atomic pointer store: requests
//! in flight keep the `Arc<Config>` they started with, new requests see the new one, and an
//! invalid file changes nothing.

use std::sync::Arc;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use super::{register_rule_series, Gateway};
use crate::config::watch::{files_of, load_settled, ConfigWatch};
use crate::config::{Config, ConfigError};
use crate::metrics::metrics;
use crate::text::unix_now;

/// What the last reload attempt said, for the admin API.
#[derive(Debug, Clone, Default)]
pub struct ReloadStatus {
    /// Successful loads (the start counts as the first).
    pub generation: u64,
    /// Unix time of the last successful load.
    pub last_success_unix: u64,
    /// The error of the last attempt, if it failed (file:line:column: message).
    pub last_error: Option<String>,
    /// Settings changed in the file that take effect only after a restart.
    pub restart_required: Vec<String>,
}

impl Gateway {
    /// Reads, validates and swaps in the config file. On error the old config stays in force
    /// and the error is logged, counted and remembered for the admin API.
    pub async fn reload(&self, trigger: &str) -> Result<ReloadStatus, ConfigError> {
        let _one_at_a_time = self.reload_lock.lock().await;
        let path = self.path.clone();
        // Reading files (until two reads agree) and resolving upstream names block: keep it
        // off the workers.
        let known = files_of(&path, &self.config.load());
        let loaded = tokio::task::spawn_blocking(move || load_settled(&path, known))
            .await
            .unwrap_or_else(|e| {
                Err(ConfigError::whole_file(
                    &self.path,
                    format!("reload task failed: {e}"),
                ))
            });
        match loaded {
            Ok(new) => Ok(self.put_in_force(new, trigger).await),
            Err(e) => {
                metrics().reloads.with_label_values(&["failure"]).inc();
                tracing::error!(trigger, error = %e, "config reload failed; the previous config stays in force");
                self.status.lock().last_error = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// Swaps in a config that loaded: its pools and metric series first, so that no request
    /// sees it half set up.
    async fn put_in_force(&self, new: Config, trigger: &str) -> ReloadStatus {
        let restart = restart_only_changes(&self.started_with, &new);
        for w in &new.warnings {
            tracing::warn!("{w}");
        }
        if !restart.is_empty() {
            tracing::warn!(settings = ?restart, "changed settings take effect only after a restart; the rest of the file is in force");
        }
        // A new issuer's keys before the config serves (each within its fetch_timeout; one
        // whose provider does not answer is in force without keys, and its tokens get 401
        // until the refresh fetches them).
        new.auth.tokens.prepare().await;
        register_rule_series(&new);
        crate::telemetry::reconfigure(new.tracing.as_ref());
        // Top clients are kept by rule name: a removed rule's go with it.
        crate::top::top().retain_rules(&new);
        let mut new = new;
        // One key table in memory: the configs idle threads still hold read the new one.
        let replaced = new.auth.keys.adopt(&self.config.load().auth.keys);
        let new = Arc::new(new);
        super::pools::bind(&new);
        let old = self.config.swap(new);
        // The old config (a key table of a million keys, say) is freed off the workers, and
        // what its load and its life left behind given back at once.
        tokio::task::spawn_blocking(move || {
            drop(replaced);
            drop(old);
            super::memory::release_freed();
        });
        // Quota leases were sized for the old rules: give back what is held (one batched
        // call); the new rules lease afresh.
        self.limiter.return_leases().await;
        metrics().reloads.with_label_values(&["success"]).inc();
        metrics().last_reload.set(unix_now() as f64);
        let mut st = self.status.lock();
        st.generation += 1;
        st.last_success_unix = unix_now();
        st.last_error = None;
        super::in_force_metrics()
            .restart_required
            .set(i64::try_from(restart.len()).unwrap_or(i64::MAX));
        st.restart_required = restart;
        tracing::info!(trigger, generation = st.generation, "config reloaded");
        st.clone()
    }
}

/// Names of settings that differ between the config the process started with and `new`, and
/// that need a restart (listeners, threads, the store).
pub fn restart_only_changes(old: &super::StartedWith, new: &Config) -> Vec<String> {
    let mut out = Vec::new();
    let mut check = |name: &str, changed: bool| {
        if changed {
            out.push(name.to_string());
        }
    };
    check("server.listen", old.server.listen != new.server.listen);
    check(
        "server.admin_listen",
        old.server.admin_listen != new.server.admin_listen,
    );
    check("server.threads", old.server.threads != new.server.threads);
    check("server.tls", old.server.tls != new.server.tls);
    check(
        "server.grace_period",
        old.server.grace_period != new.server.grace_period,
    );
    check(
        "server.log_format",
        old.server.log_format != new.server.log_format,
    );
    check(
        "rls.listen",
        old.rls.as_ref().map(|r| r.0) != new.rls.as_ref().map(|r| r.listen),
    );
    check(
        "rls.threads",
        old.rls.as_ref().map(|r| r.1) != new.rls.as_ref().map(|r| r.threads),
    );
    check(
        "rls.tls",
        old.rls.as_ref().map(|r| &r.2) != new.rls.as_ref().map(|r| &r.tls),
    );
    check("store.backend", old.store.backend != new.store.backend);
    check("store.url(s)", old.store.urls != new.store.urls);
    check("store.max_keys", old.store.max_keys != new.store.max_keys);
    check("store.max_bans", old.store.max_bans != new.store.max_bans);
    check(
        "store.connect_timeout",
        old.store.connect_timeout != new.store.connect_timeout,
    );
    check(
        "store.key_prefix",
        old.store.key_prefix != new.store.key_prefix,
    );
    out.extend(
        crate::telemetry::restart_only_changes(old.tracing.as_ref(), new.tracing.as_ref())
            .into_iter()
            .map(str::to_string),
    );
    out
}

/// The background service that reloads the config when a watched file changes or on SIGHUP.
pub struct Reloader {
    /// The gateway to reload.
    pub gateway: Arc<Gateway>,
}

impl Reloader {
    /// The files a reload of the config in force reads.
    fn files(&self) -> Vec<std::path::PathBuf> {
        files_of(&self.gateway.path, &self.gateway.config.load())
    }
}

#[async_trait]
impl BackgroundService for Reloader {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut watch = ConfigWatch::start(self.files());
        // Compare with what the config in force was read from, not with the files now: an
        // edit made while the watch was being set up must not be missed.
        if watch.fingerprint() != self.gateway.config.load().fingerprint {
            watch.nudge();
        }
        // The files' digest when a reload of them failed, with the writers' closes seen then:
        // the same bytes would fail again, unless a writer has closed since (the failure may
        // have been that it was still writing).
        let mut failed: Option<([u8; 32], u64)> = None;
        let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::error!(error = %e, "cannot handle SIGHUP");
                None
            }
        };
        loop {
            let trigger = tokio::select! {
                _ = shutdown.changed() => return,
                Some(()) = watch.next() => {
                    if !watch.settle().await {
                        continue;
                    }
                    // Nothing to do when the files hold what is in force (a no-op write, or bytes
                    // a POST /reload or SIGHUP already applied) or what already failed. Compared
                    // with the config in force, not with the last reload of this loop: a reload
                    // from elsewhere must not make the watcher miss the file's next state.
                    let now = watch.fingerprint();
                    if now == self.gateway.config.load().fingerprint
                        || failed == Some((now, watch.closes()))
                    {
                        continue;
                    }
                    "file change"
                }
                Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => "SIGHUP",
            };
            let before = (watch.fingerprint(), watch.closes());
            failed = match self.gateway.reload(trigger).await {
                Ok(_) => None,
                Err(_) => Some(before),
            };
            // The keys or token file may have moved: watch what the config in force names.
            watch.set_files(self.files());
        }
    }
}
