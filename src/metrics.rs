//! Prometheus metrics: one process-wide registry, names prefixed `floodgate_`.
//!
//! Per-rule counters are resolved once when a config is loaded (see [`RuleCounters`]), so the
//! request path increments a counter it already holds instead of looking labels up.

use std::sync::LazyLock;

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    Opts, Registry, TextEncoder,
};

/// Every metric floodgate exports.
pub struct Metrics {
    registry: Registry,
    /// `floodgate_requests_total{route,status}`.
    pub requests: IntCounterVec,
    /// `floodgate_ratelimit_decisions_total{rule,result}`.
    pub decisions: IntCounterVec,
    /// `floodgate_failure_mode_decisions_total{rule,mode}`.
    pub failure_mode: IntCounterVec,
    /// `floodgate_store_errors_total{kind}` (`error`, `timeout`, `circuit_open`).
    pub store_errors: IntCounterVec,
    /// `floodgate_store_up`: 1 when the store answered last time, 0 when it failed.
    pub store_up: IntGauge,
    /// `floodgate_circuit_breaker_state`: 0 closed, 1 open, 2 half-open.
    pub circuit_state: IntGauge,
    /// `floodgate_store_evicting_policy`: 1 when Redis may evict counter keys.
    pub store_evicting_policy: IntGauge,
    /// `floodgate_connections_open`: client connections open now.
    pub connections_open: IntGauge,
    /// `floodgate_connections_refused_total{reason}` (`max_connections`,
    /// `max_connections_per_ip`): connections closed at accept because a cap was reached.
    pub connections_refused: IntCounterVec,
    /// `floodgate_connection_timeouts_total{kind}` (`header`, `keepalive`): connections closed
    /// because a request head did not arrive in time.
    pub connection_timeouts: IntCounterVec,
    /// `floodgate_decision_duration_seconds`: time to decide a request's rules.
    pub decision_seconds: Histogram,
    /// `floodgate_upstream_duration_seconds{upstream}`: request start to upstream response header.
    pub upstream_seconds: HistogramVec,
    /// `floodgate_config_reloads_total{result}` (`success`, `failure`).
    pub reloads: IntCounterVec,
    /// `floodgate_config_last_reload_success_timestamp_seconds`.
    pub last_reload: Gauge,
    /// `floodgate_memory_store_keys`: keys held by the in-process store.
    pub memory_keys: IntGauge,
    /// `floodgate_memory_store_evictions_total{rule}`: live keys of the rule evicted from the
    /// in-process stores because `max_keys` was reached (incremented by the stores).
    pub memory_evictions: IntCounterVec,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process-wide metrics.
pub fn metrics() -> &'static Metrics {
    &METRICS
}

fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition");
    registry
        .register(Box::new(c.clone()))
        .expect("metric registered once");
    c
}

fn int_gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("static metric definition");
    registry
        .register(Box::new(g.clone()))
        .expect("metric registered once");
    g
}

/// Latency buckets from 50µs to 10s: decisions live at the low end, upstreams higher.
const BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
];

impl Metrics {
    fn new() -> Self {
        let registry = Registry::new();
        let requests = counter_vec(
            &registry,
            "floodgate_requests_total",
            "Requests answered, by route and status.",
            &["route", "status"],
        );
        let decisions = counter_vec(
            &registry,
            "floodgate_ratelimit_decisions_total",
            "Rate-limit decisions by rule and result (allowed, rejected, shadow_rejected, skipped).",
            &["rule", "result"],
        );
        let failure_mode = counter_vec(
            &registry,
            "floodgate_failure_mode_decisions_total",
            "Decisions made by a rule's on_store_error because the store failed, by rule and mode.",
            &["rule", "mode"],
        );
        let store_errors = counter_vec(
            &registry,
            "floodgate_store_errors_total",
            "Store calls that failed, by kind (error, timeout, circuit_open).",
            &["kind"],
        );
        let store_up = int_gauge(
            &registry,
            "floodgate_store_up",
            "1 when the last store call succeeded.",
        );
        store_up.set(1);
        let circuit_state = int_gauge(
            &registry,
            "floodgate_circuit_breaker_state",
            "Store circuit breaker: 0 closed, 1 open, 2 half-open.",
        );
        let store_evicting_policy = int_gauge(
            &registry,
            "floodgate_store_evicting_policy",
            "1 when the Redis maxmemory-policy may evict counter keys (an evicted bucket is a reset limit).",
        );
        let connections_open = int_gauge(
            &registry,
            "floodgate_connections_open",
            "Client connections open now.",
        );
        let connections_refused = counter_vec(
            &registry,
            "floodgate_connections_refused_total",
            "Client connections closed at accept because a cap was reached, by reason (max_connections, max_connections_per_ip).",
            &["reason"],
        );
        for reason in ["max_connections", "max_connections_per_ip"] {
            connections_refused.with_label_values(&[reason]).inc_by(0);
        }
        let connection_timeouts = counter_vec(
            &registry,
            "floodgate_connection_timeouts_total",
            "Client connections closed because a request head did not arrive in time, by kind (header: header_timeout, keepalive: keepalive_timeout).",
            &["kind"],
        );
        for kind in ["header", "keepalive"] {
            connection_timeouts.with_label_values(&[kind]).inc_by(0);
        }
        let decision_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "floodgate_decision_duration_seconds",
                "Time to decide all rules of a request.",
            )
            .buckets(BUCKETS.to_vec()),
        )
        .expect("static metric definition");
        registry
            .register(Box::new(decision_seconds.clone()))
            .expect("metric registered once");
        let upstream_seconds = HistogramVec::new(
            HistogramOpts::new(
                "floodgate_upstream_duration_seconds",
                "Time from sending a request upstream to its response header, by upstream.",
            )
            .buckets(BUCKETS.to_vec()),
            &["upstream"],
        )
        .expect("static metric definition");
        registry
            .register(Box::new(upstream_seconds.clone()))
            .expect("metric registered once");
        let reloads = counter_vec(
            &registry,
            "floodgate_config_reloads_total",
            "Config reloads by result (success, failure).",
            &["result"],
        );
        let last_reload = Gauge::new(
            "floodgate_config_last_reload_success_timestamp_seconds",
            "Unix time of the last config load that succeeded.",
        )
        .expect("static metric definition");
        registry
            .register(Box::new(last_reload.clone()))
            .expect("metric registered once");
        let memory_keys = int_gauge(
            &registry,
            "floodgate_memory_store_keys",
            "Keys held by the in-process store.",
        );
        let memory_evictions = counter_vec(
            &registry,
            "floodgate_memory_store_evictions_total",
            "Live keys evicted from the in-process store because max_keys was reached, by rule.",
            &["rule"],
        );
        #[cfg(target_os = "linux")]
        {
            let pc = prometheus::process_collector::ProcessCollector::for_self();
            let _ = registry.register(Box::new(pc));
        }
        Metrics {
            registry,
            requests,
            decisions,
            failure_mode,
            store_errors,
            store_up,
            circuit_state,
            store_evicting_policy,
            connections_open,
            connections_refused,
            connection_timeouts,
            decision_seconds,
            upstream_seconds,
            reloads,
            last_reload,
            memory_keys,
            memory_evictions,
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let families = self.registry.gather();
        // Encoding into a Vec cannot fail for well-formed families.
        let _ = TextEncoder::new().encode(&families, &mut out);
        out
    }
}

/// One rule's decision counters, resolved when the rule is built.
#[derive(Debug, Clone)]
pub struct RuleCounters {
    /// result="allowed".
    pub allowed: IntCounter,
    /// result="rejected".
    pub rejected: IntCounter,
    /// result="shadow_rejected".
    pub shadow_rejected: IntCounter,
    /// result="skipped" (a key part was absent).
    pub skipped: IntCounter,
    /// mode="open".
    pub fail_open: IntCounter,
    /// mode="closed".
    pub fail_closed: IntCounter,
    /// mode="local".
    pub fail_local: IntCounter,
}

impl RuleCounters {
    /// The counters of rule `name`.
    pub fn for_rule(name: &str) -> Self {
        let m = metrics();
        let d = |result: &str| m.decisions.with_label_values(&[name, result]);
        let f = |mode: &str| m.failure_mode.with_label_values(&[name, mode]);
        // The stores increment it; created here at 0 so that `increase()` sees the first one.
        m.memory_evictions.with_label_values(&[name]);
        RuleCounters {
            allowed: d("allowed"),
            rejected: d("rejected"),
            shadow_rejected: d("shadow_rejected"),
            skipped: d("skipped"),
            fail_open: f("open"),
            fail_closed: f("closed"),
            fail_local: f("local"),
        }
    }
}
