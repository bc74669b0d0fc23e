//! Prometheus metrics: one process-wide registry, names prefixed `floodgate_`.
//!
//! Per-rule counters are resolved once when a config is loaded (see [`RuleCounters`]), so the
//! request path increments a counter it already holds instead of looking labels up. What every
//! proxied request writes (its route's count, the decision and upstream latencies) is kept in
//! per-thread shards ([`shards`]).

pub mod shards;

use std::sync::{Arc, LazyLock, OnceLock};

use prometheus::{
    Encoder, Gauge, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use shards::{Counter, CounterVec, Histogram, HistogramVec};

/// Every metric floodgate exports.
pub struct Metrics {
    registry: Registry,
    /// `floodgate_requests_total{route,status}`.
    pub requests: CounterVec,
    /// `floodgate_ratelimit_decisions_total{rule,result}`.
    pub decisions: IntCounterVec,
    /// `floodgate_ip_refused_total{route}`: requests refused `403` by `allow_ips` /
    /// `deny_ips` (`route="-"`: no route matched; the server's lists refused it).
    pub ip_refused: IntCounterVec,
    /// `floodgate_failure_mode_decisions_total{rule,mode}`.
    pub failure_mode: IntCounterVec,
    /// `floodgate_store_errors_total{kind}` (`error`, `timeout`, `circuit_open`).
    pub store_errors: IntCounterVec,
    /// `floodgate_store_up`: 1 when the store answered last time, 0 when it failed.
    pub store_up: IntGauge,
    /// `floodgate_circuit_breaker_state`: 0 closed, 1 open, 2 half-open (a cluster: the
    /// worst of its masters' breakers).
    pub circuit_state: IntGauge,
    /// `floodgate_store_node_circuit_breaker_state{node}`: each Redis Cluster master's own
    /// breaker (0 closed, 1 open, 2 half-open), labelled with its `host:port`.
    pub store_node_breaker_state: IntGaugeVec,
    /// `floodgate_store_evicting_policy`: 1 when Redis may evict counter keys.
    pub store_evicting_policy: IntGauge,
    /// `floodgate_connections_open`: client connections open now.
    pub connections_open: IntGauge,
    /// `floodgate_connections_total`: client connections admitted since start (each took a
    /// slot under the caps; those refused are in `connections_refused`).
    pub connections_total: IntCounter,
    /// `floodgate_connections_refused_total{reason}` (`max_connections`,
    /// `max_connections_per_ip`, and the rate-limit service's `rls_max_connections`,
    /// `rls_max_connections_per_ip`): connections closed at accept because a cap was reached.
    pub connections_refused: IntCounterVec,
    /// `floodgate_connection_timeouts_total{kind}` (`tls`, `header`, `keepalive`, `body`, and
    /// the rate-limit service's `rls_header`, `rls_request`, `rls_idle`): connections (or, for
    /// `rls_request`, calls) ended because something did not arrive in time.
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
    /// `floodgate_memory_store_bans`: `block_for` bans held by the in-process stores' ban
    /// tables (set when `/metrics` is read).
    pub memory_bans: IntGauge,
    /// `floodgate_memory_store_bans_dropped_total{how}`: bans the full ban table (`max_bans`)
    /// did not keep (`refused`) or evicted for another rule's (`evicted`).
    pub bans_dropped: IntCounterVec,
    /// `floodgate_access_log_dropped_total`: access lines dropped because the writer's queue
    /// was full (see [`crate::request::access_log`]).
    pub access_log_dropped: IntCounter,
    /// `floodgate_trace_spans_dropped_total`: finished spans not delivered to the collector
    /// (the export queue was full, or the export failed or timed out; see
    /// [`crate::telemetry`]).
    pub trace_spans_dropped: IntCounter,
    /// `floodgate_store_coalesced_decisions_total`: admitted decisions of global rules made by
    /// a batch call (requests that queued behind a call of their counter; see
    /// `crate::limiter::redis` coalescing).
    pub store_coalesced: IntCounter,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process-wide metrics.
pub fn metrics() -> &'static Metrics {
    &METRICS
}

/// Registers `c` in `registry` and hands it back.
fn registered<C: prometheus::core::Collector + Clone + 'static>(registry: &Registry, c: C) -> C {
    registry
        .register(Box::new(c.clone()))
        .expect("metric registered once");
    c
}

fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition");
    registered(registry, c)
}

/// A counter family with one label whose values are known at start, each exported at 0 so
/// that a panel shows 0 rather than "no data" and `increase()` sees the first event.
fn counter_vec_at_zero(
    registry: &Registry,
    name: &str,
    help: &str,
    label: &str,
    values: &[&str],
) -> IntCounterVec {
    let c = counter_vec(registry, name, help, &[label]);
    for value in values {
        c.with_label_values(&[value]).inc_by(0);
    }
    c
}

fn int_counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("static metric definition");
    registered(registry, c)
}

fn int_gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("static metric definition");
    registered(registry, g)
}

/// A latency histogram over [`BUCKETS`], by `labels`.
fn histogram_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(BUCKETS.to_vec());
    let h = shards::histogram_vec(opts, labels).expect("static metric definition");
    registered(registry, h)
}

/// The store's metrics: errors, up, circuit breakers, eviction policy.
type StoreMetrics = (IntCounterVec, IntGauge, IntGauge, IntGaugeVec, IntGauge);

fn store_metrics(r: &Registry) -> StoreMetrics {
    let store_errors = counter_vec_at_zero(
        r,
        "floodgate_store_errors_total",
        "Store calls that failed, by kind (error, timeout, circuit_open).",
        "kind",
        &["error", "timeout", "circuit_open"],
    );
    let store_up = int_gauge(
        r,
        "floodgate_store_up",
        "1 when the last store call succeeded.",
    );
    let circuit_state = int_gauge(
        r,
        "floodgate_circuit_breaker_state",
        "Store circuit breaker: 0 closed, 1 open, 2 half-open.",
    );
    let store_node_breaker_state = registered(
        r,
        IntGaugeVec::new(
            Opts::new(
                "floodgate_store_node_circuit_breaker_state",
                "Circuit breaker of each Redis Cluster master, by node (host:port): 0 closed, 1 open, 2 half-open.",
            ),
            &["node"],
        )
        .expect("static metric definition"),
    );
    let store_evicting_policy = int_gauge(
        r,
        "floodgate_store_evicting_policy",
        "1 when the Redis maxmemory-policy may evict counter keys (an evicted bucket is a reset limit).",
    );
    store_up.set(1);
    (
        store_errors,
        store_up,
        circuit_state,
        store_node_breaker_state,
        store_evicting_policy,
    )
}

/// The client connections' metrics: open, admitted, refused by reason, timed out by kind.
type ConnectionMetrics = (IntGauge, IntCounter, IntCounterVec, IntCounterVec);

fn connection_metrics(r: &Registry) -> ConnectionMetrics {
    let connections_open = int_gauge(
        r,
        "floodgate_connections_open",
        "Client connections open now.",
    );
    let connections_total = int_counter(
            r,
            "floodgate_connections_total",
            "Client connections admitted since start (refused ones are in floodgate_connections_refused_total).",
        );
    let connections_refused = counter_vec_at_zero(
            r,
            "floodgate_connections_refused_total",
            "Client connections closed at accept because a cap was reached, by reason (max_connections, max_connections_per_ip; rls_max_connections, rls_max_connections_per_ip, rls_ip_refused: the rate-limit service's listener, the last for [server] allow_ips / deny_ips).",
            "reason",
            &[
                "max_connections",
                "max_connections_per_ip",
                "rls_max_connections",
                "rls_max_connections_per_ip",
                "rls_ip_refused",
            ],
        );
    let connection_timeouts = counter_vec_at_zero(
            r,
            "floodgate_connection_timeouts_total",
            "Client connections closed because a TLS handshake, a request head or a request body did not arrive in time, by kind (tls and header: header_timeout, keepalive: keepalive_timeout, body: body_timeout; rls_header: the rate-limit service's TLS handshake or HTTP/2 preface, rls_request: a call's request message (the call, not the connection, is ended), rls_idle: a connection with no call for idle_timeout).",
            "kind",
            &["tls", "header", "keepalive", "body", "rls_header", "rls_request", "rls_idle"],
        );
    (
        connections_open,
        connections_total,
        connections_refused,
        connection_timeouts,
    )
}

/// The in-process store's metrics: keys, evictions, bans held and dropped.
type MemoryStoreMetrics = (IntGauge, IntCounterVec, IntGauge, IntCounterVec);

fn memory_store_metrics(r: &Registry) -> MemoryStoreMetrics {
    let memory_keys = int_gauge(
        r,
        "floodgate_memory_store_keys",
        "Keys held by the in-process store.",
    );
    let memory_evictions = counter_vec(
        r,
        "floodgate_memory_store_evictions_total",
        "Live keys evicted from the in-process store because max_keys was reached, by rule.",
        &["rule"],
    );
    let memory_bans = int_gauge(
        r,
        "floodgate_memory_store_bans",
        "block_for bans held by the in-process store (and bans remembered from Redis).",
    );
    let bans_dropped = counter_vec_at_zero(
            r,
            "floodgate_memory_store_bans_dropped_total",
            "block_for bans the full ban table (store.max_bans) did not keep (refused) or evicted for another rule's (evicted).",
            "how",
            &["refused", "evicted"],
        );
    (memory_keys, memory_evictions, memory_bans, bans_dropped)
}

/// Latency buckets from 50µs to 10s: decisions live at the low end, upstreams higher.
const BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
];

impl Metrics {
    fn new() -> Self {
        let registry = Registry::new();
        #[cfg(target_os = "linux")]
        {
            let pc = prometheus::process_collector::ProcessCollector::for_self();
            let _ = registry.register(Box::new(pc));
        }
        let r = &registry;
        let (
            store_errors,
            store_up,
            circuit_state,
            store_node_breaker_state,
            store_evicting_policy,
        ) = store_metrics(r);
        let (connections_open, connections_total, connections_refused, connection_timeouts) =
            connection_metrics(r);
        let (memory_keys, memory_evictions, memory_bans, bans_dropped) = memory_store_metrics(r);
        Metrics {
            ip_refused: counter_vec_at_zero(
                r,
                "floodgate_ip_refused_total",
                "Requests refused 403 because of the client's address (allow_ips, deny_ips of the route or of [server]), by route (\"-\": no route matched).",
                "route",
                &["-"],
            ),
            store_errors,
            store_up,
            circuit_state,
            store_node_breaker_state,
            store_evicting_policy,
            connections_open,
            connections_total,
            connections_refused,
            connection_timeouts,
            memory_keys,
            memory_evictions,
            memory_bans,
            bans_dropped,
            requests: registered(
                r,
                CounterVec::new(
                    Opts::new(
                        "floodgate_requests_total",
                        "Requests answered, by route and status.",
                    ),
                    &["route", "status"],
                )
                .expect("static metric definition"),
            ),
            decisions: counter_vec(
                r,
                "floodgate_ratelimit_decisions_total",
                "Rate-limit decisions by rule and result (allowed, rejected, shadow_rejected, slowed, skipped).",
                &["rule", "result"],
            ),
            failure_mode: counter_vec(
                r,
                "floodgate_failure_mode_decisions_total",
                "Decisions made by a rule's on_store_error because the store failed, by rule and mode.",
                &["rule", "mode"],
            ),
            decision_seconds: registered(
                r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "floodgate_decision_duration_seconds",
                        "Time to decide all rules of a request.",
                    )
                    .buckets(BUCKETS.to_vec()),
                )
                .expect("static metric definition"),
            ),
            upstream_seconds: histogram_vec(
                r,
                "floodgate_upstream_duration_seconds",
                "Time from sending a request upstream to its response header, by upstream.",
                &["upstream"],
            ),
            reloads: counter_vec(
                r,
                "floodgate_config_reloads_total",
                "Config reloads by result (success, failure).",
                &["result"],
            ),
            last_reload: registered(
                r,
                Gauge::new(
                    "floodgate_config_last_reload_success_timestamp_seconds",
                    "Unix time of the last config load that succeeded.",
                )
                .expect("static metric definition"),
            ),
            access_log_dropped: int_counter(
                r,
                "floodgate_access_log_dropped_total",
                "Access log lines dropped because the log writer fell behind (its queue was full).",
            ),
            trace_spans_dropped: int_counter(
                r,
                "floodgate_trace_spans_dropped_total",
                "Finished trace spans dropped: the export queue was full, or the collector failed or timed out.",
            ),
            store_coalesced: int_counter(
                r,
                "floodgate_store_coalesced_decisions_total",
                "Admitted decisions of global rules made by a batch call: requests that queued behind a call of their counter and were decided together.",
            ),
            registry: registry.clone(),
        }
    }

    /// Registers a collector owned by another module (`crate::upstream::metrics`) in the
    /// process registry, so `/metrics` renders it with the rest.
    pub fn register(&self, c: Box<dyn prometheus::core::Collector>) {
        if let Err(e) = self.registry.register(c) {
            tracing::error!(error = %e, "metric registered twice");
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

/// `floodgate_requests_total{route,status}` of one route, resolved per status on first use and
/// kept: the request path then finds its counter by a short scan instead of hashing both
/// labels and taking the registry's lock (`with_label_values`) for every request. The list is
/// read through [`arc_swap`], whose loads write nothing another thread reads (a lock's reader
/// count would be a shared write per request).
#[derive(Debug, Default)]
pub struct RouteRequests {
    by_status: arc_swap::ArcSwapOption<Vec<(u16, Counter)>>,
}

impl RouteRequests {
    /// No series resolved yet (a `static` can hold one).
    pub const fn new() -> RouteRequests {
        RouteRequests {
            by_status: arc_swap::ArcSwapOption::const_empty(),
        }
    }

    /// Counts one request of `route` answered with `status`.
    pub fn inc(&self, route: &str, status: u16) {
        if let Some(known) = &*self.by_status.load() {
            if let Some((_, c)) = known.iter().find(|(s, _)| *s == status) {
                c.inc();
                return;
            }
        }
        let mut digits = String::with_capacity(3);
        crate::text::push_u64(&mut digits, u64::from(status));
        let counter = metrics().requests.with_label_values(&[route, &digits]);
        counter.inc();
        self.by_status.rcu(|known| {
            let mut list = known.as_deref().cloned().unwrap_or_default();
            if !list.iter().any(|(s, _)| *s == status) {
                list.push((status, counter.clone()));
            }
            Some(Arc::new(list))
        });
    }
}

/// One rule's decision counters.
///
/// Built with the rule while a config is validated, but registered in the registry only when
/// the config is installed ([`RuleCounters::register`], called by the gateway at start and on
/// a successful reload): validating a file (`floodgate check`, a reload that fails) must leave
/// `/metrics` as it was, or a typo'd rule name would stay exported until restart.
#[derive(Debug, Clone)]
pub struct RuleCounters {
    /// result="allowed".
    pub allowed: RuleCounter,
    /// result="rejected".
    pub rejected: RuleCounter,
    /// result="shadow_rejected".
    pub shadow_rejected: RuleCounter,
    /// result="slowed": would have rejected, and served the request slowly (`mode = "slow"`).
    pub slowed: RuleCounter,
    /// result="skipped" (a key part was absent).
    pub skipped: RuleCounter,
    /// mode="open".
    pub fail_open: RuleCounter,
    /// mode="closed".
    pub fail_closed: RuleCounter,
    /// mode="local".
    pub fail_local: RuleCounter,
    rule: Arc<str>,
}

impl RuleCounters {
    /// The counters of rule `name`, not yet registered (this touches no metric).
    pub fn for_rule(name: &str) -> Self {
        let rule: Arc<str> = name.into();
        let d = |result| RuleCounter::new(Family::Decisions, rule.clone(), result);
        let f = |mode| RuleCounter::new(Family::FailureMode, rule.clone(), mode);
        RuleCounters {
            allowed: d("allowed"),
            rejected: d("rejected"),
            shadow_rejected: d("shadow_rejected"),
            slowed: d("slowed"),
            skipped: d("skipped"),
            fail_open: f("open"),
            fail_closed: f("closed"),
            fail_local: f("local"),
            rule,
        }
    }

    /// Registers every series of the rule at its current value (0 when new), so that
    /// `increase()` sees the first event; called when the rule's config is put in force.
    pub fn register(&self) {
        for c in [
            &self.allowed,
            &self.rejected,
            &self.shadow_rejected,
            &self.slowed,
            &self.skipped,
            &self.fail_open,
            &self.fail_closed,
            &self.fail_local,
        ] {
            c.resolve();
        }
        // The in-process stores increment it when they evict a key of this rule.
        metrics().memory_evictions.with_label_values(&[&self.rule]);
    }
}

/// Which labelled family a [`RuleCounter`] belongs to.
#[derive(Debug, Clone, Copy)]
enum Family {
    Decisions,
    FailureMode,
}

/// One series of a rule, resolved in the registry on [`RuleCounters::register`] (or on its
/// first increment or reading, for a rule used without being installed, as in unit tests).
/// After that, an increment is one atomic load and one atomic add: no label lookup per request.
#[derive(Debug, Clone)]
pub struct RuleCounter {
    family: Family,
    rule: Arc<str>,
    label: &'static str,
    resolved: OnceLock<IntCounter>,
}

impl RuleCounter {
    fn new(family: Family, rule: Arc<str>, label: &'static str) -> Self {
        RuleCounter {
            family,
            rule,
            label,
            resolved: OnceLock::new(),
        }
    }

    fn resolve(&self) -> &IntCounter {
        self.resolved.get_or_init(|| {
            let vec = match self.family {
                Family::Decisions => &metrics().decisions,
                Family::FailureMode => &metrics().failure_mode,
            };
            vec.with_label_values(&[&*self.rule, self.label])
        })
    }

    /// Adds one.
    pub fn inc(&self) {
        self.resolve().inc();
    }

    /// The series' current value (resolving it, like an increment: series are shared by
    /// every rule of the same name, so a reading must come from the series itself).
    pub fn get(&self) -> u64 {
        self.resolve().get()
    }
}
