//! Where an issuer's keys come from, and their state as a real client keeps it: fetched before
//! the issuer serves, refreshed at the `Cache-Control` max-age or the configured interval
//! (whichever is sooner, never sooner than `min_refetch`), fetched again for a token whose
//! `kid` the set lacks at most once per `min_refetch` (minting random `kid`s cannot make
//! floodgate hammer the identity provider), and the last good set kept while the provider is
//! down or serves garbage.
//!
//! A source outlives config generations: sources are shared process-wide by what defines them
//! (URL or inline set, issuer, fetch settings), so a reload that leaves an issuer as it was
//! keeps its fetched keys and does not fetch again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use parking_lot::Mutex;

use super::keyset::KeySet;
use super::metrics::jwt_metrics;

/// Largest JWK Set or discovery document read, in bytes.
pub const MAX_DOCUMENT_BYTES: usize = 512 * 1024;

/// Where the keys are.
#[derive(Debug, Clone)]
pub enum KeysFrom {
    /// Given in the config (`jwks`, or `secret`/`secret_file`): never fetched.
    Fixed(Arc<KeySet>),
    /// `jwks_url`.
    Url(http::Uri),
    /// `discovery_url`: an OpenID Provider's metadata, whose `jwks_uri` holds the set.
    Discovery(http::Uri),
}

/// How a fetched set is kept fresh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Freshness {
    /// Refetch at least this often.
    pub refresh_interval: Duration,
    /// Never fetch more often than this (unknown `kid`s, short max-ages, retries).
    pub min_refetch: Duration,
    /// One fetch's whole budget (discovery and set together).
    pub timeout: Duration,
}

/// The keys of one issuer and how they are kept.
pub struct KeySource {
    /// The issuer's label in metrics and logs.
    pub label: Arc<str>,
    /// The issuer (`iss`), which discovery must confirm.
    issuer: String,
    from: KeysFrom,
    /// How the set is kept fresh.
    pub freshness: Freshness,
    current: ArcSwapOption<KeySet>,
    /// Bumped whenever the set in force changes: cached tokens of an older one are checked
    /// again.
    version: AtomicU64,
    /// Unix seconds of the last successful fetch (0: never).
    fetched_at: AtomicU64,
    /// What the last fetch said, when it failed (cleared by a success).
    last_error: Mutex<Option<String>>,
    /// The last answer's max-age, if it had one.
    max_age: Mutex<Option<Duration>>,
    /// Held while fetching; holds when the last fetch started.
    fetching: tokio::sync::Mutex<Option<Instant>>,
    refresher: AtomicBool,
}

impl std::fmt::Debug for KeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeySource")
            .field("label", &self.label)
            .field("from", &self.from)
            .finish()
    }
}

/// Every source some config holds, by what defines it.
static SOURCES: LazyLock<Mutex<HashMap<String, Weak<KeySource>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

impl KeySource {
    /// The source defined by these settings: the one a config already holds, or a new one
    /// (with no keys yet when they are fetched). `identity` is what defines the source beyond
    /// `from` (for a fixed set, its digest).
    pub fn shared(
        label: Arc<str>,
        issuer: &str,
        from: KeysFrom,
        freshness: Freshness,
        identity: &str,
    ) -> Arc<KeySource> {
        let key = format!("{label}\n{issuer}\n{identity}\n{freshness:?}");
        let mut sources = SOURCES.lock();
        sources.retain(|_, w| w.strong_count() > 0);
        if let Some(found) = sources.get(&key).and_then(Weak::upgrade) {
            return found;
        }
        let fixed = match &from {
            KeysFrom::Fixed(set) => Some(set.clone()),
            _ => None,
        };
        let source = Arc::new(KeySource {
            label,
            issuer: issuer.to_owned(),
            from,
            freshness,
            version: AtomicU64::new(u64::from(fixed.is_some())),
            current: ArcSwapOption::new(fixed),
            fetched_at: AtomicU64::new(0),
            last_error: Mutex::new(None),
            max_age: Mutex::new(None),
            fetching: tokio::sync::Mutex::new(None),
            refresher: AtomicBool::new(false),
        });
        sources.insert(key, Arc::downgrade(&source));
        source
    }

    /// Where the keys come from, as `floodgate check` says it: `jwks_url URL`,
    /// `discovery_url URL`, or how many keys the config gives.
    pub fn describe(&self) -> String {
        match &self.from {
            KeysFrom::Fixed(set) => format!("{} in the config", set.keys.len()),
            KeysFrom::Url(u) => format!("from jwks_url {u}"),
            KeysFrom::Discovery(u) => format!("from discovery_url {u}"),
        }
    }

    /// The set in force (none before the first successful fetch).
    pub fn keys(&self) -> Option<Arc<KeySet>> {
        self.current.load_full()
    }

    /// The version of the set in force.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Whether the keys are fetched (not given in the config).
    pub fn is_fetched(&self) -> bool {
        !matches!(self.from, KeysFrom::Fixed(_))
    }

    /// Seconds since the last successful fetch, if any.
    pub fn age(&self) -> Option<u64> {
        match self.fetched_at.load(Ordering::Relaxed) {
            0 => None,
            at => Some(crate::text::unix_now().saturating_sub(at)),
        }
    }

    /// What the last fetch said when it failed.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().clone()
    }

    /// Fetches the set if there is none yet, waiting for a fetch in progress.
    pub async fn ensure_loaded(&self) {
        if self.keys().is_some() || !self.is_fetched() {
            return;
        }
        let mut last = self.fetching.lock().await;
        if self.keys().is_none() {
            *last = Some(Instant::now());
            self.fetch_now().await;
        }
    }

    /// A token named a `kid` the set lacks: fetch the set again, unless a fetch started less
    /// than `min_refetch` ago (then the caller reads the set as it is). Callers during a
    /// fetch wait for it.
    pub async fn refetch_for_unknown_kid(&self) {
        if !self.is_fetched() {
            return;
        }
        let mut last = self.fetching.lock().await;
        if last.is_some_and(|at| at.elapsed() < self.freshness.min_refetch) {
            jwt_metrics()
                .refetch_skipped
                .with_label_values(&[&self.label])
                .inc();
            return;
        }
        *last = Some(Instant::now());
        self.fetch_now().await;
    }

    /// One fetch, its outcome recorded: a good set replaces the one in force, a failure keeps
    /// it.
    async fn fetch_now(&self) {
        let m = jwt_metrics();
        match self.fetch().await {
            Ok((set, max_age)) => {
                let changed = self
                    .keys()
                    .is_none_or(|old| old.kids() != set.kids() || old.keys.len() != set.keys.len());
                if changed {
                    self.current.store(Some(Arc::new(set)));
                    self.version.fetch_add(1, Ordering::AcqRel);
                }
                self.fetched_at
                    .store(crate::text::unix_now(), Ordering::Relaxed);
                *self.max_age.lock() = max_age;
                *self.last_error.lock() = None;
                m.fetches.with_label_values(&[&self.label, "ok"]).inc();
            }
            Err(e) => {
                tracing::warn!(issuer = %self.label, error = %e, "cannot fetch the JWK Set; the last good one stays in force");
                *self.last_error.lock() = Some(e);
                m.fetches.with_label_values(&[&self.label, "error"]).inc();
            }
        }
    }

    /// The set and its max-age, discovery and set together within `fetch_timeout`.
    async fn fetch(&self) -> Result<(KeySet, Option<Duration>), String> {
        let timeout = self.freshness.timeout;
        match tokio::time::timeout(timeout, self.fetch_unbounded()).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "{}: no answer within fetch_timeout ({})",
                self.describe(),
                crate::text::humantime(timeout)
            )),
        }
    }

    async fn fetch_unbounded(&self) -> Result<(KeySet, Option<Duration>), String> {
        // `fetch` bounds both requests together, and says so; each one's own bound is only a
        // backstop, past it.
        let budget = self.freshness.timeout.saturating_mul(2);
        let url = match &self.from {
            KeysFrom::Fixed(_) => return Err("the keys are not fetched".into()),
            KeysFrom::Url(u) => u.clone(),
            KeysFrom::Discovery(d) => self.jwks_uri(d).await?,
        };
        let got = crate::wire::outbound::get(&url, budget, MAX_DOCUMENT_BYTES)
            .await
            .map_err(|e| format!("JWK Set {url}: {e}"))?;
        let set = KeySet::from_jwks(&got.body).map_err(|e| format!("JWK Set {url}: {e}"))?;
        Ok((set, got.max_age))
    }

    /// The `jwks_uri` of the provider's metadata, which must name this issuer (OpenID
    /// Connect Discovery §4.3: a document that names another issuer is not this one's).
    async fn jwks_uri(&self, discovery: &http::Uri) -> Result<http::Uri, String> {
        let backstop = self.freshness.timeout.saturating_mul(2);
        let got = crate::wire::outbound::get(discovery, backstop, MAX_DOCUMENT_BYTES)
            .await
            .map_err(|e| format!("discovery {discovery}: {e}"))?;
        let doc: serde_json::Value = serde_json::from_slice(&got.body)
            .map_err(|_| format!("discovery {discovery}: the document is not JSON"))?;
        let named = doc.get("issuer").and_then(|v| v.as_str());
        if named != Some(self.issuer.as_str()) {
            return Err(format!(
                "discovery {discovery}: the document names issuer {:?}, not {:?}",
                named.unwrap_or(""),
                self.issuer
            ));
        }
        let uri = doc
            .get("jwks_uri")
            .and_then(|v| v.as_str())
            .ok_or_else(|| format!("discovery {discovery}: no jwks_uri"))?;
        let parsed: http::Uri = uri
            .parse()
            .map_err(|_| format!("discovery {discovery}: jwks_uri is not a URL"))?;
        if !matches!(parsed.scheme_str(), Some("http" | "https")) {
            return Err(format!("discovery {discovery}: jwks_uri is not http(s)"));
        }
        Ok(parsed)
    }

    /// Starts the background refresh of a fetched set, once per source, on the caller's
    /// runtime. It ends when no config holds the source any more.
    pub fn start_refresher(self: &Arc<Self>) {
        if !self.is_fetched() || self.refresher.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut failures = 0u32;
            loop {
                let Some(source) = weak.upgrade() else { return };
                let wait = source.next_wait(failures);
                drop(source);
                tokio::time::sleep(wait).await;
                let Some(source) = weak.upgrade() else { return };
                {
                    let mut last = source.fetching.lock().await;
                    *last = Some(Instant::now());
                    source.fetch_now().await;
                }
                failures = if source.last_error().is_some() {
                    failures.saturating_add(1)
                } else {
                    0
                };
            }
        });
    }

    /// How long until the next refresh: the max-age or the interval, whichever is sooner, not
    /// under `min_refetch`; after failures, `min_refetch` doubled per failure, up to the interval.
    fn next_wait(&self, failures: u32) -> Duration {
        let f = self.freshness;
        if failures > 0 || self.keys().is_none() {
            let backoff = f.min_refetch.saturating_mul(1 << failures.min(16));
            return backoff.min(f.refresh_interval).max(f.min_refetch);
        }
        let by_age = self.max_age.lock().unwrap_or(f.refresh_interval);
        by_age.min(f.refresh_interval).max(f.min_refetch)
    }
}
