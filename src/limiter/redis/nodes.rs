//! Where the store's calls go and how each destination stands. Standalone, the one server is
//! the one node; in a cluster, each master is a node of its own, with its own circuit breaker
//! and "up" flag, so that a dead master fails (fast) only the requests whose keys it holds
//! while the other masters keep deciding exactly. A [`Census`] sums the nodes up for
//! `/readyz` and the gauges: `floodgate_store_up` (every node's last call succeeded),
//! `floodgate_circuit_breaker_state` (the worst breaker: open, else half-open, else closed) and,
//! per cluster master, `floodgate_store_node_circuit_breaker_state{node}`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::breaker::{Breaker, BreakerState};
use super::Options;
use crate::metrics::metrics;

/// One destination of the store's calls.
pub(super) struct Node {
    /// `host:port` of a cluster master (its metric label); `None`: the store as a whole.
    label: Option<Arc<str>>,
    /// Fails this node's calls fast after repeated failures.
    pub(super) breaker: Breaker,
    /// The last call to it succeeded.
    up: AtomicBool,
    census: Arc<Census>,
}

impl Node {
    /// The store as a whole: the standalone server, or a cluster's slots whose master is not
    /// known (yet). Its log lines name `endpoint`; it has no metric series of its own.
    pub(super) fn store(endpoint: &str, options: &Options, census: &Arc<Census>) -> Arc<Node> {
        Node::new(endpoint.into(), None, options, census)
    }

    /// A cluster master at `endpoint` (`host:port`), published as the gauge's `node` label.
    pub(super) fn master(endpoint: &str, options: &Options, census: &Arc<Census>) -> Arc<Node> {
        let label: Arc<str> = endpoint.into();
        metrics()
            .store_node_breaker_state
            .with_label_values(&[&*label])
            .set(BreakerState::Closed.gauge());
        Node::new(label.clone(), Some(label), options, census)
    }

    fn new(
        name: Arc<str>,
        label: Option<Arc<str>>,
        options: &Options,
        census: &Arc<Census>,
    ) -> Arc<Node> {
        let (hook_census, hook_label) = (census.clone(), label.clone());
        let breaker = Breaker::with_hook(
            options.failure_threshold,
            options.cool_down,
            name,
            move |from, to| {
                hook_census.moved(from, to);
                if let Some(label) = &hook_label {
                    metrics()
                        .store_node_breaker_state
                        .with_label_values(&[&**label])
                        .set(to.gauge());
                }
            },
        );
        Arc::new(Node {
            label,
            breaker,
            up: AtomicBool::new(true),
            census: census.clone(),
        })
    }

    /// `host:port` of a cluster master; `None` for the store as a whole.
    pub(super) fn endpoint(&self) -> Option<&str> {
        self.label.as_deref()
    }

    /// Records how its last call went; true when it was failing and now answered.
    pub(super) fn mark(&self, ok: bool) -> bool {
        let was = self.up.swap(ok, Ordering::AcqRel);
        if was != ok {
            self.census.up_changed(ok);
        }
        ok && !was
    }
}

impl Drop for Node {
    /// A master that left the cluster no longer counts, and its series goes.
    fn drop(&mut self) {
        self.census
            .left(self.breaker.state(), self.up.load(Ordering::Acquire));
        if let Some(label) = &self.label {
            let _ = metrics()
                .store_node_breaker_state
                .remove_label_values(&[&**label]);
        }
    }
}

/// How many of the store's nodes are in trouble. Nodes start closed and up, which count
/// nothing; every change is published under one lock, so the gauges never show a stale sum.
#[derive(Default)]
pub(super) struct Census {
    counts: Mutex<Counts>,
}

#[derive(Default, Clone, Copy)]
struct Counts {
    open: usize,
    half_open: usize,
    down: usize,
}

impl Counts {
    fn worst(self) -> BreakerState {
        if self.open > 0 {
            BreakerState::Open
        } else if self.half_open > 0 {
            BreakerState::HalfOpen
        } else {
            BreakerState::Closed
        }
    }

    fn of(&mut self, state: BreakerState) -> Option<&mut usize> {
        match state {
            BreakerState::Closed => None,
            BreakerState::Open => Some(&mut self.open),
            BreakerState::HalfOpen => Some(&mut self.half_open),
        }
    }
}

impl Census {
    /// The worst breaker state among the nodes: open, else half-open, else closed.
    pub(super) fn worst(&self) -> BreakerState {
        self.counts.lock().worst()
    }

    /// Every node answered its last call and no breaker holds calls off.
    pub(super) fn all_well(&self) -> bool {
        let c = *self.counts.lock();
        c.down == 0 && c.worst() == BreakerState::Closed
    }

    fn moved(&self, from: BreakerState, to: BreakerState) {
        let mut c = self.counts.lock();
        if let Some(n) = c.of(from) {
            *n = n.saturating_sub(1);
        }
        if let Some(n) = c.of(to) {
            *n += 1;
        }
        metrics().circuit_state.set(c.worst().gauge());
    }

    fn up_changed(&self, up: bool) {
        let mut c = self.counts.lock();
        c.down = if up {
            c.down.saturating_sub(1)
        } else {
            c.down + 1
        };
        metrics().store_up.set(i64::from(c.down == 0));
    }

    fn left(&self, state: BreakerState, up: bool) {
        let mut c = self.counts.lock();
        if let Some(n) = c.of(state) {
            *n = n.saturating_sub(1);
        }
        if !up {
            c.down = c.down.saturating_sub(1);
        }
        metrics().circuit_state.set(c.worst().gauge());
        metrics().store_up.set(i64::from(c.down == 0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn options() -> Options {
        Options {
            failure_threshold: 1,
            cool_down: Duration::from_secs(60),
            ..Options::default()
        }
    }

    #[test]
    fn one_failing_master_leaves_the_others_closed_and_the_census_says_so() {
        let census = Arc::new(Census::default());
        let a = Node::master("10.0.0.1:7000", &options(), &census);
        let b = Node::master("10.0.0.2:7000", &options(), &census);
        assert!(census.all_well());
        assert!(a.breaker.try_call().unwrap().failure());
        assert!(!a.mark(false));
        assert_eq!(a.breaker.state(), BreakerState::Open);
        assert_eq!(b.breaker.state(), BreakerState::Closed);
        assert!(b.breaker.try_call().is_some(), "b still takes calls");
        assert_eq!(census.worst(), BreakerState::Open);
        assert!(!census.all_well());
        assert_eq!(a.endpoint(), Some("10.0.0.1:7000"));
        // The failing master leaves the cluster: nothing is in trouble any more.
        drop(a);
        assert_eq!(census.worst(), BreakerState::Closed);
        assert!(census.all_well());
        assert!(!b.mark(true), "b never failed");
    }
}
