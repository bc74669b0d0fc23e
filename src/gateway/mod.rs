//! The state every request shares: the config in force (swapped whole on reload), the
//! upstream pools serving it, the limiter's counters, and what the last reload said.
//!
//! - [`reload`]: the reload triggers (watched files, SIGHUP) and the one reload they run.
//! - `pools`: the upstream pools each config generation runs on (the config itself is plain
//!   data, also built by `check`).
//! - `startup`: the store made ready before the front doors serve, and readiness.
//! - [`memory`]: what a config's load and a replaced config leave behind, given back to the OS.

pub mod memory;
mod pools;
pub mod reload;
pub mod snapshot;
mod startup;

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

pub use reload::{restart_only_changes, ReloadStatus, Reloader};

use crate::config::Config;
use crate::limiter::engine::Limiter;
use crate::metrics::metrics;
use crate::upstream::Pool;

/// Shared gateway state.
pub struct Gateway {
    /// The config in force.
    pub config: ArcSwap<Config>,
    /// Rate-limit counters (they survive reloads: state is keyed by rule name).
    pub limiter: Limiter,
    /// The config file to reload from.
    pub path: PathBuf,
    /// The settings that were in force at start (what listeners and store were built from):
    /// those alone, not the whole config, which would keep a first key table of a million keys
    /// alive beside every later one.
    started_with: StartedWith,
    status: Mutex<ReloadStatus>,
    /// Serializes reloads so that two triggers at once cannot swap in an older file last.
    reload_lock: tokio::sync::Mutex<()>,
    /// The start-up warm-up of the store.
    startup: startup::Startup,
}

/// The settings of the config the process started with that only a restart changes.
pub struct StartedWith {
    /// `[server]`.
    pub server: crate::config::Server,
    /// `[store]`.
    pub store: crate::limiter::settings::Store,
    /// `[rls]` listen, threads and tls.
    pub rls: Option<(std::net::SocketAddr, usize, Option<crate::rls::limits::Tls>)>,
    /// `[tracing]`.
    pub tracing: Option<crate::telemetry::Settings>,
}

impl StartedWith {
    /// What of `cfg` only a restart changes.
    pub fn of(cfg: &Config) -> StartedWith {
        StartedWith {
            server: cfg.server.clone(),
            store: cfg.store.clone(),
            rls: cfg
                .rls
                .as_ref()
                .map(|r| (r.listen, r.threads, r.tls.clone())),
            tracing: cfg.tracing.clone(),
        }
    }
}

impl Gateway {
    /// A gateway running `config`.
    pub fn new(config: Config) -> Self {
        let limiter = Limiter::new(&config.store);
        let path = config.path.clone();
        let config = Arc::new(config);
        pools::bind(&config);
        register_rule_series(&config);
        metrics().reloads.with_label_values(&["success"]).inc_by(0);
        metrics().reloads.with_label_values(&["failure"]).inc_by(0);
        metrics().last_reload.set(crate::text::unix_now() as f64);
        in_force_metrics()
            .backend
            .with_label_values(&[config.store.backend.as_str()])
            .set(1);
        in_force_metrics().restart_required.set(0);
        // What reading the file took beyond what the config keeps.
        memory::release_freed();
        Gateway {
            config: ArcSwap::new(config.clone()),
            limiter,
            path,
            started_with: StartedWith::of(&config),
            status: Mutex::new(ReloadStatus {
                generation: 1,
                last_success_unix: crate::text::unix_now(),
                ..ReloadStatus::default()
            }),
            reload_lock: tokio::sync::Mutex::new(()),
            startup: startup::Startup::default(),
        }
    }

    /// The config in force, as a request holds it (see [`snapshot`]).
    pub fn snapshot(&self) -> snapshot::Snapshot {
        snapshot::current(&self.config)
    }

    /// The store backend in force: the one the gateway started with. A reload that changes
    /// `store.backend` waits for a restart (`restart_required`); until then every count stays
    /// where it was.
    pub fn backend_in_force(&self) -> crate::config::Backend {
        self.started_with.store.backend
    }

    /// What the last reload said.
    pub fn reload_status(&self) -> ReloadStatus {
        self.status.lock().clone()
    }
}

impl crate::upstream::service::InForce for Gateway {
    fn pools(&self) -> Vec<Arc<Pool>> {
        let config = self.config.load();
        config.upstreams.iter().map(|u| u.pool()).collect()
    }
}

/// Registers the metric series of `config`'s rules (and token issuers) as it is put in force. Validation leaves the
/// registry alone (see [`crate::metrics::RuleCounters`]), so a file that is only checked, or a
/// reload that fails, exports nothing.
fn register_rule_series(config: &Config) {
    crate::rls::metrics::register(config.rls.as_ref());
    config.auth.tokens.register_series();
    let rls_limits = config.rls.iter().flat_map(|r| &r.limits).map(|l| &l.policy);
    for rule in config.rules.iter().map(|r| &r.policy).chain(rls_limits) {
        rule.counters.register();
        crate::limiter::reservation::register_series(rule);
        if rule.lease.is_some() {
            let m = crate::limiter::lease::lease_metrics();
            m.taken.with_label_values(&[&rule.name]);
            for event in ["leased", "spent", "returned"] {
                m.permits.with_label_values(&[&rule.name, event]);
            }
        }
    }
}

/// What is in force, as metrics: `floodgate_store_backend{backend}` (1 for the backend the
/// counts are kept in) and `floodgate_restart_required` (settings a reload changed that wait
/// for a restart; 0 when the file is wholly in force).
struct InForce {
    backend: prometheus::IntGaugeVec,
    restart_required: prometheus::IntGauge,
}

fn in_force_metrics() -> &'static InForce {
    static M: std::sync::LazyLock<InForce> = std::sync::LazyLock::new(|| {
        let backend = prometheus::IntGaugeVec::new(
            prometheus::Opts::new(
                "floodgate_store_backend",
                "1 for the store backend in force (where the counts are kept); a reload that changes it waits for a restart.",
            ),
            &["backend"],
        )
        .expect("valid metric");
        let restart_required = prometheus::IntGauge::new(
            "floodgate_restart_required",
            "Settings changed by the last reload that take effect only after a restart (0: the file is wholly in force).",
        )
        .expect("valid metric");
        metrics().register(Box::new(backend.clone()));
        metrics().register(Box::new(restart_required.clone()));
        InForce {
            backend,
            restart_required,
        }
    });
    &M
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// A config whose one rule is named `rule`, followed by `tail`.
    fn config_text(rule: &str, tail: &str) -> String {
        format!(
            "[[upstreams]]\nname = \"orders\"\ntargets = [\"127.0.0.1:9000\"]\n\n\
             [[routes]]\nname = \"orders\"\nmatch = {{ path_prefix = \"/orders\" }}\nupstream = \"orders\"\n\n\
             [[rules]]\nname = \"{rule}\"\nkey = [\"ip\"]\nalgorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1s\"\n{tail}"
        )
    }

    fn exported(rule: &str) -> bool {
        String::from_utf8(metrics().render())
            .unwrap()
            .contains(&format!("rule=\"{rule}\""))
    }

    #[test]
    fn validating_registers_no_series_and_installing_does() {
        let path = Path::new("/tmp/gateway-metrics-test/gateway.toml");
        // Metrics are process-wide: names no other test uses.
        let checked = "only-checked-rule-5e1c";
        let failed = "in-a-failed-file-rule-5e1c";
        let installed = "installed-rule-5e1c";

        let cfg = Config::from_str(path, &config_text(checked, "")).expect("valid config");
        drop(cfg);
        // The rule before the bad one is fully built before validation fails.
        let bad = "\n[[rules]]\nname = \"broken\"\nkey = [\"ip\"]\nalgorithm = \"no_such_algorithm\"\nlimit = 1\nwindow = \"1s\"\n";
        assert!(Config::from_str(path, &config_text(failed, bad)).is_err());
        let cfg = Config::from_str(path, &config_text(installed, "")).expect("valid config");
        for rule in [checked, failed, installed] {
            assert!(!exported(rule), "{rule} exported before install");
        }

        let gateway = Gateway::new(cfg);
        assert!(exported(installed));
        let text = String::from_utf8(metrics().render()).unwrap();
        for series in [
            format!(
                "floodgate_ratelimit_decisions_total{{result=\"allowed\",rule=\"{installed}\"}} 0"
            ),
            format!(
                "floodgate_failure_mode_decisions_total{{mode=\"open\",rule=\"{installed}\"}} 0"
            ),
        ] {
            assert!(text.contains(&series), "{series} missing from:\n{text}");
        }
        gateway.config.load().rules[0].counters.allowed.inc();
        assert_eq!(gateway.config.load().rules[0].counters.allowed.get(), 1);
        assert!(!exported(checked) && !exported(failed));
    }
}
