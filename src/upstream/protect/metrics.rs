//! The metrics of `[upstreams.protect]`:
//!
//! - `floodgate_upstream_concurrency_limit{upstream}`: the adaptive limit now;
//! - `floodgate_upstream_protect_in_flight{upstream}`: requests holding a slot;
//! - `floodgate_upstream_protect_queued{upstream}`: requests waiting for one;
//! - `floodgate_upstream_shed_total{upstream,reason}`: requests answered 503
//!   `upstream-overloaded`, `reason` = `queue_timeout` or `queue_full`.
//!
//! The three gauges are read from the guards when `/metrics` is scraped: the request path
//! updates no gauge.

use std::sync::LazyLock;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounterVec, IntGaugeVec, Opts};

use super::{guards, Shed};

struct Gauges {
    limit: IntGaugeVec,
    in_flight: IntGaugeVec,
    queued: IntGaugeVec,
}

fn gauge(name: &str, help: &str) -> IntGaugeVec {
    IntGaugeVec::new(Opts::new(name, help), &["upstream"]).expect("static metric definition")
}

static GAUGES: LazyLock<Gauges> = LazyLock::new(|| Gauges {
    limit: gauge(
        "floodgate_upstream_concurrency_limit",
        "The adaptive concurrency limit of an upstream with [upstreams.protect].",
    ),
    in_flight: gauge(
        "floodgate_upstream_protect_in_flight",
        "Requests holding one of the upstream's concurrency slots.",
    ),
    queued: gauge(
        "floodgate_upstream_protect_queued",
        "Requests waiting in the upstream's fair queue for a concurrency slot.",
    ),
});

static SHED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    IntCounterVec::new(
        Opts::new(
            "floodgate_upstream_shed_total",
            "Requests answered 503 upstream-overloaded, by reason (queue_timeout, queue_full).",
        ),
        &["upstream", "reason"],
    )
    .expect("static metric definition")
});

/// Reads the guards at scrape time.
struct Protect;

impl Collector for Protect {
    fn desc(&self) -> Vec<&Desc> {
        let g = &*GAUGES;
        [&g.limit, &g.in_flight, &g.queued]
            .into_iter()
            .flat_map(|v| v.desc())
            .collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let g = &*GAUGES;
        g.limit.reset();
        g.in_flight.reset();
        g.queued.reset();
        for (name, guard) in guards().lock().iter() {
            g.limit
                .with_label_values(&[&**name])
                .set(guard.limit().into());
            g.in_flight
                .with_label_values(&[&**name])
                .set(guard.in_flight().into());
            g.queued
                .with_label_values(&[&**name])
                .set(guard.queued().into());
        }
        let mut out = g.limit.collect();
        out.extend(g.in_flight.collect());
        out.extend(g.queued.collect());
        out
    }
}

static LEFT: LazyLock<IntCounterVec> = LazyLock::new(|| {
    IntCounterVec::new(
        Opts::new(
            "floodgate_upstream_queue_left_total",
            "Requests that left the fair queue because their client went away, never forwarded.",
        ),
        &["upstream"],
    )
    .expect("static metric definition")
});

/// Registers the families (once, with the first guard).
pub(super) fn register() {
    let m = crate::metrics::metrics();
    m.register(Box::new(Protect));
    m.register(Box::new(SHED.clone()));
    m.register(Box::new(LEFT.clone()));
}

/// Exports `upstream`'s shed series at 0, so an `increase()` alert sees the first one.
pub(super) fn export(upstream: &str) {
    for why in [Shed::Timeout, Shed::QueueFull] {
        SHED.with_label_values(&[upstream, why.as_str()]);
    }
    LEFT.with_label_values(&[upstream]);
}

/// Counts one waiter whose client left.
pub(super) fn left(upstream: &str) {
    LEFT.with_label_values(&[upstream]).inc();
}

/// Counts one request shed.
pub(super) fn shed(upstream: &str, why: Shed) {
    SHED.with_label_values(&[upstream, why.as_str()]).inc();
}
