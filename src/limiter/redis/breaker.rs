//! The shared store's circuit breaker: after repeated failures, stop calling Redis for a short
//! cool-down so that a dead or stalled Redis costs requests nothing (they fail fast and apply
//! their rule's `on_store_error`) instead of piling up for `store.timeout` each.
//!
//! - **Closed**: calls go through; [`FAILURE_THRESHOLD`] consecutive failures (errors or
//!   timeouts) open it.
//! - **Open**: calls fail at once ([`Breaker::try_call`] returns `None`) for [`COOL_DOWN`].
//! - **Half-open**: after the cool-down, exactly one call goes through as a probe while the
//!   others keep failing fast; its success closes the breaker, its failure opens it again for
//!   another cool-down. So a Redis that comes back is used again without a restart, at most one
//!   cool-down after it returned.
//!
//! Every transition is published: in `floodgate_circuit_breaker_state` (0 closed, 1 open,
//! 2 half-open) for a breaker of its own, or to the hook it was built with (a cluster keeps one
//! breaker per master, see `nodes`).

use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::metrics::metrics;

/// Consecutive failures (errors or timeouts) that open the breaker.
pub const FAILURE_THRESHOLD: u32 = 5;

/// How long an open breaker refuses calls before it lets one probe through. Short: the
/// failure mode applies meanwhile, and a Redis that restarts is back within a second or two.
pub const COOL_DOWN: Duration = Duration::from_secs(1);

/// Where the breaker stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go through.
    Closed,
    /// Calls fail fast until the cool-down ends.
    Open,
    /// One probe call is (or may be) in flight; the others fail fast.
    HalfOpen,
}

impl BreakerState {
    /// The value of `floodgate_circuit_breaker_state`: 0 closed, 1 open, 2 half-open.
    pub fn gauge(self) -> i64 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::Open => 1,
            BreakerState::HalfOpen => 2,
        }
    }
}

/// Told of every transition of a breaker: from, to.
type Hook = Box<dyn Fn(BreakerState, BreakerState) + Send + Sync>;

/// A circuit breaker. Cheap: one uncontended lock per call.
pub struct Breaker {
    threshold: u32,
    cool_down: Duration,
    inner: Mutex<Inner>,
    /// What its log lines name (a cluster node's `host:port`); `None`: the store.
    name: Option<std::sync::Arc<str>>,
    /// Where transitions go; `None`: `floodgate_circuit_breaker_state`.
    hook: Option<Hook>,
}

impl std::fmt::Debug for Breaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Breaker")
            .field("name", &self.name)
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Inner {
    state: BreakerState,
    /// Consecutive failures while closed.
    failures: u32,
    /// When it last opened.
    opened_at: Instant,
    /// Half-open: whether the probe is out.
    probing: bool,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker::new(FAILURE_THRESHOLD, COOL_DOWN)
    }
}

impl Breaker {
    /// A closed breaker that opens after `threshold` consecutive failures (at least 1) and
    /// stays open for `cool_down`.
    pub fn new(threshold: u32, cool_down: Duration) -> Self {
        Breaker {
            threshold: threshold.max(1),
            cool_down,
            inner: Mutex::new(Inner {
                state: BreakerState::Closed,
                failures: 0,
                opened_at: Instant::now(),
                probing: false,
            }),
            name: None,
            hook: None,
        }
    }

    /// [`Breaker::new`] for one of several breakers (a cluster node): its log lines name
    /// `name`, and each transition goes to `hook` (from, to) instead of the gauge. The hook
    /// runs under the breaker's lock: it must be quick and must not call the breaker.
    pub fn with_hook(
        threshold: u32,
        cool_down: Duration,
        name: std::sync::Arc<str>,
        hook: impl Fn(BreakerState, BreakerState) + Send + Sync + 'static,
    ) -> Self {
        Breaker {
            name: Some(name),
            hook: Some(Box::new(hook)),
            ..Breaker::new(threshold, cool_down)
        }
    }

    /// Moves to `to` and tells whoever watches.
    fn transition(&self, inner: &mut Inner, to: BreakerState) {
        let from = std::mem::replace(&mut inner.state, to);
        match &self.hook {
            Some(hook) => hook(from, to),
            None => metrics().circuit_state.set(to.gauge()),
        }
    }

    /// What log lines call it.
    fn name(&self) -> &str {
        self.name.as_deref().unwrap_or("store")
    }

    /// Where the breaker stands now.
    pub fn state(&self) -> BreakerState {
        self.inner.lock().state
    }

    /// Asks to make a call: a [`Ticket`] to report its outcome with, or `None` when the call
    /// must fail fast (open, or half-open with the probe already out).
    pub fn try_call(&self) -> Option<Ticket<'_>> {
        let mut inner = self.inner.lock();
        match inner.state {
            BreakerState::Closed => Some(Ticket::new(self, false)),
            BreakerState::Open => {
                if inner.opened_at.elapsed() < self.cool_down {
                    return None;
                }
                self.transition(&mut inner, BreakerState::HalfOpen);
                inner.probing = true;
                Some(Ticket::new(self, true))
            }
            BreakerState::HalfOpen => {
                if inner.probing {
                    return None;
                }
                // The previous probe was abandoned (its caller went away): send another.
                inner.probing = true;
                Some(Ticket::new(self, true))
            }
        }
    }

    fn succeeded(&self, probe: bool) {
        let mut inner = self.inner.lock();
        match inner.state {
            BreakerState::Closed => inner.failures = 0,
            BreakerState::HalfOpen if probe => {
                self.transition(&mut inner, BreakerState::Closed);
                inner.failures = 0;
                inner.probing = false;
                tracing::info!(
                    redis = self.name(),
                    "Redis answers again: circuit breaker closed"
                );
            }
            // A call that started before the breaker opened: the probe decides, not it.
            _ => {}
        }
    }

    /// Returns true when this failure opened the breaker.
    fn failed(&self, probe: bool) -> bool {
        let mut inner = self.inner.lock();
        let open = match inner.state {
            BreakerState::Closed => {
                inner.failures += 1;
                inner.failures >= self.threshold
            }
            BreakerState::HalfOpen => probe,
            BreakerState::Open => false,
        };
        if open {
            self.transition(&mut inner, BreakerState::Open);
            inner.opened_at = Instant::now();
            inner.probing = false;
            tracing::warn!(
                redis = self.name(),
                cool_down_ms = self.cool_down.as_millis() as u64,
                "Redis failing: circuit breaker open, global rules whose keys it holds apply on_store_error without calling it"
            );
        }
        open
    }

    fn abandoned(&self, probe: bool) {
        if probe {
            let mut inner = self.inner.lock();
            if inner.state == BreakerState::HalfOpen {
                inner.probing = false;
            }
        }
    }
}

/// Permission to make one call; report how it went with [`Ticket::success`] or
/// [`Ticket::failure`]. Dropped unreported (the caller was cancelled), it frees the probe
/// slot so that the next call can probe.
#[must_use = "report the call's outcome"]
#[derive(Debug)]
pub struct Ticket<'a> {
    breaker: &'a Breaker,
    probe: bool,
    settled: bool,
}

impl<'a> Ticket<'a> {
    fn new(breaker: &'a Breaker, probe: bool) -> Self {
        Ticket {
            breaker,
            probe,
            settled: false,
        }
    }

    /// Whether this call is the half-open probe.
    pub fn is_probe(&self) -> bool {
        self.probe
    }

    /// The call succeeded.
    pub fn success(mut self) {
        self.settled = true;
        self.breaker.succeeded(self.probe);
    }

    /// The call failed (error or timeout). Returns true when this failure opened the breaker.
    pub fn failure(mut self) -> bool {
        self.settled = true;
        self.breaker.failed(self.probe)
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.breaker.abandoned(self.probe);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_threshold_consecutive_failures() {
        let b = Breaker::new(3, Duration::from_secs(60));
        for _ in 0..2 {
            assert!(!b.try_call().unwrap().failure());
        }
        // A success in between resets the count.
        b.try_call().unwrap().success();
        assert!(!b.try_call().unwrap().failure());
        assert!(!b.try_call().unwrap().failure());
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.try_call().unwrap().failure());
        assert_eq!(b.state(), BreakerState::Open);
        assert!(b.try_call().is_none());
    }

    #[test]
    fn half_open_lets_one_probe_through_and_closes_on_success() {
        let b = Breaker::new(1, Duration::ZERO);
        assert!(b.try_call().unwrap().failure());
        let probe = b.try_call().expect("cool-down over: probe");
        assert!(probe.is_probe());
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert!(b.try_call().is_none(), "only one probe at a time");
        probe.success();
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(!b.try_call().unwrap().is_probe());
    }

    #[test]
    fn failed_probe_reopens() {
        let b = Breaker::new(1, Duration::from_millis(30));
        assert!(b.try_call().unwrap().failure());
        assert!(b.try_call().is_none());
        let deadline = Instant::now() + Duration::from_secs(5);
        let probe = loop {
            if let Some(t) = b.try_call() {
                break t;
            }
            assert!(Instant::now() < deadline, "no probe after the cool-down");
            std::thread::yield_now();
        };
        assert!(probe.failure());
        assert_eq!(b.state(), BreakerState::Open);
        assert!(b.try_call().is_none());
    }

    #[test]
    fn abandoned_probe_frees_the_probe_slot() {
        let b = Breaker::new(1, Duration::ZERO);
        assert!(b.try_call().unwrap().failure());
        drop(b.try_call().expect("probe"));
        assert_eq!(b.state(), BreakerState::HalfOpen);
        let again = b.try_call().expect("another probe");
        assert!(again.is_probe());
        again.success();
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn a_hook_hears_every_transition() {
        let heard = std::sync::Arc::new(Mutex::new(Vec::new()));
        let log = heard.clone();
        let b = Breaker::with_hook(1, Duration::ZERO, "node:1".into(), move |from, to| {
            log.lock().push((from, to))
        });
        assert!(b.try_call().unwrap().failure());
        b.try_call().expect("probe").success();
        use BreakerState::*;
        assert_eq!(
            *heard.lock(),
            [(Closed, Open), (Open, HalfOpen), (HalfOpen, Closed)]
        );
    }

    #[test]
    fn late_results_of_calls_made_before_opening_change_nothing() {
        let b = Breaker::new(1, Duration::from_secs(60));
        let early = b.try_call().unwrap();
        assert!(b.try_call().unwrap().failure());
        early.success();
        assert_eq!(b.state(), BreakerState::Open);
    }
}
