//! Quota leasing: exact global limits with the shared store off the hot path.
//!
//! A global rule with `lease` takes permits for a key from the shared store in one script
//! call (the same call that decides the request's other global rules), spends them here at
//! memory speed, and gives the unspent ones back when the lease ends. The permits are charged
//! to the shared state *when leased*, from the authoritative state, so the fleet never admits
//! more than the limit; the price is that permits one instance holds are briefly unavailable
//! to the others. The store sizes every lease to at most a fair share of what remains
//! (`remaining / (2 x instances)`), so that lease shrinks to single permits as the budget runs
//! out and the last permits go to whoever asks.
//!
//! What is exact and what is not, stated plainly:
//! - Never more than the limit is charged, whatever the instances do: a permit is spent only
//!   after the store charged it. Windows (fixed, sliding counter): a permit is spent only
//!   within the window it was charged to (the lease ends with the window, measured from
//!   before the call was sent, so an instance's late clock cannot stretch it). Buckets: a
//!   permit is spent at most `lease_ttl` after it was charged, so over any interval of
//!   length `d` at most `burst + rate x (d + lease_ttl)` are admitted, as if the bucket were
//!   checked up to `lease_ttl` early.
//! - A permit left unspent is given back (one batched call per instance, at lease end, on
//!   reload and on shutdown) and is then available to every instance again. A crashed
//!   instance cannot say which of its permits it spent, so they stay charged: they come back
//!   as the algorithm recovers (the window ends, the bucket refills), never later; giving them
//!   back on a timer instead would re-admit the ones it did spend.
//! - The `RateLimit` remaining of a leased rule is an estimate: the global remaining at the
//!   last lease, plus the permits this instance still holds.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prometheus::{HistogramOpts, IntCounterVec, Opts};

use crate::metrics::shards::Histogram;
use tokio::sync::watch;

use super::store::{Grant, Return};
use super::{Algorithm, Check, Decision, LeakyMode};

/// How many permits a rule leases at a time (`lease`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseSize {
    /// `"auto"`: this instance's recent rate for the key times `lease_ttl`, at least one
    /// request's cost; a key seen once a minute leases nothing beyond its request.
    Auto,
    /// A fixed number of permits (at least the request's cost).
    Permits(u64),
}

/// A global rule's quota leasing settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// How many permits to ask for.
    pub size: LeaseSize,
    /// How long this instance may hold unspent permits (`lease_ttl`).
    pub ttl: Duration,
}

/// Default `lease_ttl`.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(1);

/// Whether `algorithm` (in `mode`) can lease: its state is a count of permits that a return
/// can undo. The sliding log keeps one entry per request, concurrency counts requests in
/// flight (not a rate), and shaping holds requests in a queue whose order a lease would break.
pub fn leasable(algorithm: Algorithm, mode: LeakyMode) -> bool {
    algorithm.capabilities().lease_refused(mode).is_none()
}

/// How often the returner looks for ended leases (and at most how late an unspent permit is
/// given back after its lease ended).
pub const RETURN_EVERY: Duration = Duration::from_millis(100);

/// An entry whose lease ended, that holds nothing and saw no request for this long, is
/// forgotten (with its rate estimate: a key that quiet leases nothing beyond its request).
const IDLE: Duration = Duration::from_secs(10);

/// Shards of the table: requests for different keys rarely wait on one lock.
const SHARDS: usize = 32;

/// The lease metrics, registered in the process registry on first use.
pub struct LeaseMetrics {
    /// `floodgate_lease_taken_total{rule}`.
    pub taken: IntCounterVec,
    /// `floodgate_lease_permits_total{rule,event}`: leased, spent, returned.
    pub permits: IntCounterVec,
    /// `floodgate_store_calls_per_request`.
    pub calls_per_request: Histogram,
}

/// The lease metrics.
pub fn lease_metrics() -> &'static LeaseMetrics {
    static M: LazyLock<LeaseMetrics> = LazyLock::new(|| {
        let taken = IntCounterVec::new(
            Opts::new(
                "floodgate_lease_taken_total",
                "Quota leases taken from the shared store (more than one request's permits), by rule.",
            ),
            &["rule"],
        )
        .expect("static metric definition");
        let permits = IntCounterVec::new(
            Opts::new(
                "floodgate_lease_permits_total",
                "Permits of leased rules, by rule and event (leased: charged to the shared store; spent: admitted requests; returned: given back unspent).",
            ),
            &["rule", "event"],
        )
        .expect("static metric definition");
        let calls_per_request = Histogram::with_opts(
            HistogramOpts::new(
                "floodgate_store_calls_per_request",
                "Shared store decision calls made by each request with a global rule (0 when leases answered it).",
            )
            .buckets(vec![0.0, 1.0, 2.0, 4.0, 8.0]),
        )
        .expect("static metric definition");
        let registry = crate::metrics::metrics();
        registry.register(Box::new(taken.clone()));
        registry.register(Box::new(permits.clone()));
        registry.register(Box::new(calls_per_request.clone()));
        LeaseMetrics {
            taken,
            permits,
            calls_per_request,
        }
    });
    &M
}

type Key = (Arc<str>, u64);

/// One key's lease on this instance.
struct Entry {
    /// Unspent permits in hand.
    held: u64,
    /// When the permits in hand stop being spendable.
    until: Instant,
    /// The window they were charged to (0 for the buckets): what a return names.
    window_end_us: u64,
    /// When the store charged the earliest of them (its time, us): a return names it, so
    /// that it never lands on a counter reset since.
    charged_at_us: u64,
    /// The start of the counter's latest epoch heard of (its time, us; 0: none): permits
    /// charged before it are never spent, refunded into the lease or kept from a grant.
    reset_us: u64,
    /// The check they were leased for (for returns).
    check: Check,
    /// The decision at the last lease: quota, global remaining and reset.
    last: Decision,
    /// Permits spent since `since` (for the rate estimate).
    spent: u64,
    since: Instant,
    /// Requests per second seen for this key (0: unknown).
    rate: f64,
    /// A lease call for this key is under way: later requests wait for it.
    refill: Option<watch::Receiver<()>>,
    /// The store refused this key moments ago: refuse in process until then.
    denied: Option<(Instant, Decision)>,
    /// Spends not yet added to the metric (added in batches, off the hot path).
    unreported: u64,
    last_used: Instant,
}

/// Which lease a request's permits came from: the window they were charged to and when the
/// lease ends. A permit given back into the lease it came from is spent under the same
/// bounds (same window, same lease time) as if it had never left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// The window the lease's permits were charged to (0 for the buckets).
    pub window_end_us: u64,
    /// When the lease's permits stop being spendable.
    pub until: Instant,
    /// When the store charged the earliest of them (its time, us; see [`Grant::charged_at_us`]).
    pub charged_at_us: u64,
}

/// What [`LeaseTable::take`] found for one check.
pub enum Take {
    /// Spent from the permits in hand, of the lease `Stamp` names.
    Spent(Decision, Stamp),
    /// Refused in process: the store refused this key moments ago (refusing more is always
    /// exact).
    Denied(Decision),
    /// Ask the store for a lease of `want` permits; `guard` marks the call in flight so that
    /// concurrent requests for the key wait for it instead of calling too.
    Lease {
        /// Permits to ask for (at least the cost).
        want: u64,
        /// Hand it back with [`LeaseTable::fill`].
        guard: RefillGuard,
    },
    /// Another request is leasing for this key: wait for it, then take again.
    Wait(watch::Receiver<()>),
    /// Leasing is over (shutting down): decide exactly.
    Exact,
}

/// Marks a lease call in flight for one key; dropping it without [`LeaseTable::fill`] (the
/// call failed or the request was dropped) lets the waiting requests go on.
pub struct RefillGuard {
    table: Arc<LeaseTable>,
    key: Key,
    /// The rule's leasing settings when the lease was asked for: what the answer is held to.
    lease: Lease,
    _tx: watch::Sender<()>,
}

impl Drop for RefillGuard {
    fn drop(&mut self) {
        let mut shard = self.table.shard(&self.key).lock();
        if let Some(e) = shard.get_mut(&self.key) {
            e.refill = None;
        }
        // `_tx` drops after this: the waiters wake and find the permits (or none).
    }
}

/// The quota leases this instance holds, per (rule, counter).
pub struct LeaseTable {
    shards: Box<[Mutex<HashMap<Key, Entry>>]>,
    /// Unspent permits of ended leases, waiting for the returner.
    returns: Mutex<Vec<Return>>,
    closed: AtomicBool,
}

impl Default for LeaseTable {
    fn default() -> Self {
        LeaseTable {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            returns: Mutex::new(Vec::new()),
            closed: AtomicBool::new(false),
        }
    }
}

impl LeaseTable {
    fn shard(&self, key: &Key) -> &Mutex<HashMap<Key, Entry>> {
        &self.shards[(key.1 as usize) % SHARDS]
    }

    /// Takes `check.cost` permits from the lease in hand, or says what to do instead.
    pub fn take(self: &Arc<Self>, check: &Check, lease: &Lease, now: Instant) -> Take {
        if self.closed.load(Ordering::Acquire) {
            return Take::Exact;
        }
        let key: Key = (check.rule.clone(), check.counter);
        let mut shard = self.shard(&key).lock();
        let e = shard.entry(key.clone()).or_insert_with(|| Entry {
            held: 0,
            until: now,
            window_end_us: 0,
            charged_at_us: 0,
            reset_us: 0,
            check: check.clone(),
            last: Decision::unlimited(check.limit.limit()),
            spent: 0,
            since: now,
            rate: 0.0,
            refill: None,
            denied: None,
            unreported: 0,
            last_used: now,
        });
        e.last_used = now;
        if e.until <= now && e.held > 0 {
            let r = e.give_up();
            self.returns.lock().push(r);
        }
        if e.held >= check.cost {
            e.held -= check.cost;
            e.spent += check.cost;
            e.unreported += check.cost;
            let mut d = e.last.clone();
            d.remaining = d.remaining.saturating_add(e.held);
            let stamp = Stamp {
                window_end_us: e.window_end_us,
                until: e.until,
                charged_at_us: e.charged_at_us,
            };
            return Take::Spent(d, stamp);
        }
        if let Some((until, d)) = &e.denied {
            if *until > now {
                return Take::Denied(d.clone());
            }
            e.denied = None;
        }
        if let Some(rx) = &e.refill {
            return Take::Wait(rx.clone());
        }
        let want = match lease.size {
            LeaseSize::Permits(n) => n.max(check.cost),
            LeaseSize::Auto => e.auto_size(check.cost, lease.ttl, now),
        };
        let (tx, rx) = watch::channel(());
        e.refill = Some(rx);
        drop(shard);
        Take::Lease {
            want,
            guard: RefillGuard {
                table: self.clone(),
                key,
                lease: *lease,
                _tx: tx,
            },
        }
    }

    /// Records the store's answer to a lease asked with `guard`: `grant` permits were charged
    /// (0: none); `admitted`: the request itself was admitted and spends its cost. Otherwise
    /// (another rule rejected it) the whole grant goes to the lease in hand. `sent`: when the
    /// call was sent (the lease's time runs from then, so it ends no later than in the store's
    /// time). The lease settings are those the guard was taken under. Returns the lease the
    /// request's own permits belong to, when it was admitted with a grant.
    pub fn fill(
        &self,
        guard: RefillGuard,
        check: &Check,
        decision: &Decision,
        grant: Grant,
        admitted: bool,
        sent: Instant,
    ) -> Option<Stamp> {
        let lease = guard.lease;
        let mut spare = None;
        let mut stamp = None;
        {
            let mut shard = self.shard(&guard.key).lock();
            if let Some(e) = shard.get_mut(&guard.key) {
                e.refill = None;
                if grant.granted == 0 {
                    if !decision.allowed {
                        let wait = decision.retry_after.min(lease.ttl);
                        // From the send: never longer than the store meant.
                        e.denied = Some((sent + wait, decision.clone()));
                    }
                } else {
                    let m = lease_metrics();
                    let extra = if admitted {
                        e.spent += check.cost;
                        e.unreported += check.cost;
                        grant.granted.saturating_sub(check.cost)
                    } else {
                        grant.granted
                    };
                    // Charged before a reset heard meanwhile: the request itself was decided
                    // before it, but the rest belongs to the old epoch.
                    let extra = if grant.charged_at_us < e.reset_us {
                        0
                    } else {
                        extra
                    };
                    m.permits
                        .with_label_values(&[&check.rule, "leased"])
                        .inc_by(grant.granted);
                    if extra > 0 {
                        m.taken.with_label_values(&[&check.rule]).inc();
                    }
                    if e.held > 0 && e.window_end_us != grant.window_end_us {
                        spare = Some(e.give_up());
                    }
                    let mut valid = lease.ttl;
                    if !grant.window_left.is_zero() {
                        valid = valid.min(grant.window_left);
                    }
                    // The earliest charge of the permits in hand: a return older than a reset
                    // is dropped, so erring early costs availability, never exactness.
                    if e.held == 0 || e.charged_at_us == 0 {
                        e.charged_at_us = grant.charged_at_us;
                    } else {
                        e.charged_at_us = e.charged_at_us.min(grant.charged_at_us);
                    }
                    e.held += extra;
                    e.until = sent + valid;
                    e.window_end_us = grant.window_end_us;
                    if admitted {
                        stamp = Some(Stamp {
                            window_end_us: e.window_end_us,
                            until: e.until,
                            charged_at_us: grant.charged_at_us,
                        });
                    }
                    e.check = check.clone();
                    let mut last = decision.clone();
                    if admitted {
                        last.allowed = true;
                    }
                    e.last = last;
                    e.denied = None;
                }
            }
        }
        if let Some(r) = spare {
            self.returns.lock().push(r);
        }
        drop(guard);
        stamp
    }

    /// Gives `permits` a request spent back into the lease `stamp` names (a `count` rule's
    /// refund): true when that lease is still the key's, so the permits are in hand again
    /// (and returned to the store with the rest of it when it ends). False: the key has
    /// another lease now (or none), and the refund must go to the store instead.
    pub fn refund(&self, check: &Check, permits: u64, stamp: Stamp) -> bool {
        if self.closed.load(Ordering::Acquire) {
            return false;
        }
        let key: Key = (check.rule.clone(), check.counter);
        let mut shard = self.shard(&key).lock();
        match shard.get_mut(&key) {
            Some(e)
                if e.window_end_us == stamp.window_end_us
                    && e.until == stamp.until
                    && stamp.charged_at_us >= e.reset_us =>
            {
                e.held = e.held.saturating_add(permits);
                e.spent = e.spent.saturating_sub(permits);
                e.unreported = e.unreported.saturating_sub(permits);
                true
            }
            _ => false,
        }
    }

    /// Puts back the permits a request spent from its lease when another rule rejected it:
    /// the request is charged nothing.
    pub fn put_back(&self, check: &Check) {
        let key: Key = (check.rule.clone(), check.counter);
        let mut shard = self.shard(&key).lock();
        if let Some(e) = shard.get_mut(&key) {
            e.held += check.cost;
            e.spent = e.spent.saturating_sub(check.cost);
            e.unreported = e.unreported.saturating_sub(check.cost);
        }
    }

    /// Permits to give back now: those of ended leases, and (with `all`) every permit in
    /// hand. Forgets idle entries and adds batched spends to the metric.
    pub fn due(&self, all: bool, now: Instant) -> Vec<Return> {
        let mut out = std::mem::take(&mut *self.returns.lock());
        let m = lease_metrics();
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            shard.retain(|_, e| {
                if e.unreported > 0 {
                    m.permits
                        .with_label_values(&[&e.check.rule, "spent"])
                        .inc_by(e.unreported);
                    e.unreported = 0;
                }
                if e.held > 0 && (all || e.until <= now) {
                    out.push(e.give_up());
                }
                e.held > 0 || e.refill.is_some() || now.duration_since(e.last_used) < IDLE
            });
        }
        for r in &out {
            m.permits
                .with_label_values(&[&r.check.rule, "returned"])
                .inc_by(r.permits);
        }
        out
    }

    /// Stops leasing (shutting down): every later check is decided exactly, and [`due`]
    /// with `all` collects what is held.
    ///
    /// [`due`]: LeaseTable::due
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Forgets the lease this instance holds for `check`'s key, without giving its permits
    /// back: the usage API reset the key's counter, and the permits were charged to the old
    /// one (a return would now land on the new counter, and spending them would admit more
    /// than the new counter allows). Requests for the key lease anew from the reset counter.
    /// Returns the permits forgotten.
    pub fn forget(&self, check: &Check) -> u64 {
        let key: Key = (check.rule.clone(), check.counter);
        let mut shard = self.shard(&key).lock();
        let Some(e) = shard.get_mut(&key) else {
            return 0;
        };
        e.denied = None;
        std::mem::take(&mut e.held)
    }

    /// Forgets the permits this instance holds of the counter `counter` of `rule` that were
    /// charged before `at_us` (the store's time): another instance (or this one) reset the
    /// counter then, and those permits belong to the old epoch. A grant or refund of the old
    /// epoch arriving later is dropped too. Permits leased after the reset are kept. Returns
    /// the permits forgotten.
    pub fn forget_before(&self, rule: &str, counter: u64, at_us: u64) -> u64 {
        let key: Key = (Arc::from(rule), counter);
        let mut shard = self.shard(&key).lock();
        let Some(e) = shard.get_mut(&key) else {
            return 0;
        };
        e.reset_us = e.reset_us.max(at_us);
        if e.charged_at_us >= at_us {
            return 0;
        }
        e.denied = None;
        std::mem::take(&mut e.held)
    }

    /// Permits held for `check`'s key right now (tests and `/rules`).
    pub fn held(&self, check: &Check) -> u64 {
        let key: Key = (check.rule.clone(), check.counter);
        self.shard(&key).lock().get(&key).map_or(0, |e| e.held)
    }
}

impl Entry {
    /// Takes every permit in hand out, as a return.
    fn give_up(&mut self) -> Return {
        let permits = std::mem::take(&mut self.held);
        Return {
            check: self.check.clone(),
            permits,
            window_end_us: self.window_end_us,
            charged_at_us: self.charged_at_us,
        }
    }

    /// `"auto"`: the recent rate times the lease TTL, at least `cost`, at most the limit.
    fn auto_size(&mut self, cost: u64, ttl: Duration, now: Instant) -> u64 {
        let elapsed = now
            .duration_since(self.since)
            .max(Duration::from_millis(1))
            .as_secs_f64();
        if self.spent > 0 {
            let observed = self.spent as f64 / elapsed;
            self.rate = if self.rate > 0.0 {
                (self.rate + observed) / 2.0
            } else {
                observed
            };
        } else if elapsed > ttl.as_secs_f64() {
            self.rate = 0.0;
        }
        self.spent = 0;
        self.since = now;
        let want = (self.rate * ttl.as_secs_f64()).ceil();
        let cap = self.check.limit.limit().max(self.check.limit.burst());
        (want.min(cap as f64) as u64).max(cost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(counter: u64) -> Check {
        crate::limiter::fixtures::check(
            "r",
            counter,
            Algorithm::TokenBucket,
            1000,
            Duration::from_secs(1),
            1000,
        )
    }

    const AUTO: Lease = Lease {
        size: LeaseSize::Auto,
        ttl: Duration::from_secs(1),
    };

    fn lease(t: &Arc<LeaseTable>, c: &Check, now: Instant) -> (u64, RefillGuard) {
        match t.take(c, &AUTO, now) {
            Take::Lease { want, guard } => (want, guard),
            _ => panic!("expected to lease"),
        }
    }

    fn granted(n: u64) -> Grant {
        Grant {
            granted: n,
            ..Grant::default()
        }
    }

    #[tokio::test]
    async fn a_first_request_leases_only_itself_and_waiters_share_the_call() {
        let t = Arc::new(LeaseTable::default());
        let c = check(1);
        let now = Instant::now();
        let (want, guard) = lease(&t, &c, now);
        assert_eq!(
            want, 1,
            "a key never seen leases nothing beyond its request"
        );
        // A concurrent request for the key waits for that call instead of making its own.
        let Take::Wait(mut rx) = t.take(&c, &AUTO, now) else {
            panic!("expected to wait")
        };
        let d = Decision::unlimited(1000);
        t.fill(guard, &c, &d, granted(5), true, now);
        assert!(rx.changed().await.is_err(), "waiters are woken");
        assert_eq!(t.held(&c), 4);
        let Take::Spent(d, _) = t.take(&c, &AUTO, now) else {
            panic!("expected to spend")
        };
        assert!(d.allowed);
        assert_eq!(t.held(&c), 3);
        // Another rule rejected the request: its permit goes back, uncharged.
        t.put_back(&c);
        assert_eq!(t.held(&c), 4);
    }

    /// A usage reset forgets the lease in hand: its permits are neither spent nor returned
    /// (they belong to the counter the reset ended); the next request leases anew. A return
    /// names the earliest charge of the permits it gives back.
    #[test]
    fn a_forgotten_lease_is_neither_spent_nor_returned() {
        let t = Arc::new(LeaseTable::default());
        let c = check(3);
        let now = Instant::now();
        let (_, guard) = lease(&t, &c, now);
        let first = Grant {
            granted: 10,
            charged_at_us: 500,
            ..Grant::default()
        };
        t.fill(guard, &c, &Decision::unlimited(1000), first, true, now);
        assert_eq!(t.held(&c), 9);
        assert_eq!(t.forget(&c), 9);
        assert_eq!(t.held(&c), 0);
        assert!(t.due(true, now).is_empty(), "nothing to give back");
        assert!(matches!(t.take(&c, &AUTO, now), Take::Lease { .. }));

        let c = check(4);
        let (_, guard) = lease(&t, &c, now);
        t.fill(guard, &c, &Decision::unlimited(1000), first, false, now);
        // Refilled while permits are in hand: the return names the earlier charge.
        let Take::Spent(..) = t.take(&c, &AUTO, now) else {
            panic!("expected to spend")
        };
        let more = Grant {
            granted: 3,
            charged_at_us: 900,
            ..Grant::default()
        };
        let guard = RefillGuard {
            table: t.clone(),
            key: (c.rule.clone(), c.counter),
            lease: AUTO,
            _tx: watch::channel(()).0,
        };
        t.fill(guard, &c, &Decision::unlimited(1000), more, false, now);
        let due = t.due(true, now);
        assert_eq!((due.len(), due[0].permits), (1, 12));
        assert_eq!(due[0].charged_at_us, 500);
    }

    /// A reset heard from the store (another instance's) drops the permits charged before it
    /// and keeps those charged after it; a lease call that was in flight across it keeps
    /// only the request's own permit, and a refund of the old epoch is not taken back in.
    #[test]
    fn a_heard_reset_drops_only_what_was_charged_before_it() {
        let t = Arc::new(LeaseTable::default());
        let c = check(5);
        let now = Instant::now();
        let at = |granted, charged_at_us| Grant {
            granted,
            charged_at_us,
            ..Grant::default()
        };
        let d = Decision::unlimited(1000);
        let (_, guard) = lease(&t, &c, now);
        t.fill(guard, &c, &d, at(10, 500), true, now);
        let Take::Spent(_, old_stamp) = t.take(&c, &AUTO, now) else {
            panic!("expected to spend")
        };
        assert_eq!(
            t.forget_before(&c.rule, c.counter, 400),
            0,
            "leased after it"
        );
        assert_eq!(t.held(&c), 8);
        assert_eq!(t.forget_before(&c.rule, c.counter, 600), 8);
        assert_eq!(t.held(&c), 0);
        assert!(!t.refund(&c, 1, old_stamp), "a refund of the old epoch");
        assert_eq!(t.held(&c), 0);
        // A lease asked before the reset and answered after it was heard.
        let (_, guard) = lease(&t, &c, now);
        t.fill(guard, &c, &d, at(10, 550), true, now);
        assert_eq!(t.held(&c), 0, "only the request's own permit");
        // Leased in the new epoch: spent as usual.
        let (_, guard) = lease(&t, &c, now);
        t.fill(guard, &c, &d, at(10, 700), true, now);
        assert_eq!(t.held(&c), 9);
        assert_eq!(t.forget_before("other-rule", c.counter, 900), 0);
        assert_eq!(t.held(&c), 9);
    }

    #[test]
    fn ended_leases_are_returned_and_refusals_are_remembered_briefly() {
        let t = Arc::new(LeaseTable::default());
        let c = check(2);
        let now = Instant::now();
        let (_, guard) = lease(&t, &c, now);
        t.fill(
            guard,
            &c,
            &Decision::unlimited(1000),
            granted(10),
            true,
            now,
        );
        assert!(t.due(false, now).is_empty(), "the lease still runs");
        let later = now + Duration::from_secs(2);
        let due = t.due(false, later);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].permits, 9);
        assert_eq!(t.held(&c), 0);

        let (_, guard) = lease(&t, &c, later);
        let mut refused = Decision::unlimited(1000);
        refused.allowed = false;
        refused.retry_after = Duration::from_millis(200);
        t.fill(guard, &c, &refused, granted(0), false, later);
        assert!(matches!(t.take(&c, &AUTO, later), Take::Denied(_)));
        let after = later + Duration::from_millis(250);
        assert!(matches!(t.take(&c, &AUTO, after), Take::Lease { .. }));
    }

    #[test]
    fn a_closed_table_decides_exactly_and_gives_everything_back() {
        let t = Arc::new(LeaseTable::default());
        let c = check(3);
        let now = Instant::now();
        let (_, guard) = lease(&t, &c, now);
        t.fill(guard, &c, &Decision::unlimited(1000), granted(7), true, now);
        t.close();
        assert!(matches!(t.take(&c, &AUTO, now), Take::Exact));
        let due = t.due(true, now);
        assert_eq!(due.iter().map(|r| r.permits).sum::<u64>(), 6);
    }

    #[test]
    fn only_counting_algorithms_lease() {
        assert!(leasable(Algorithm::FixedWindow, LeakyMode::Police));
        assert!(leasable(Algorithm::LeakyBucket, LeakyMode::Police));
        assert!(!leasable(Algorithm::LeakyBucket, LeakyMode::Shape));
        assert!(!leasable(Algorithm::SlidingWindowLog, LeakyMode::Police));
        assert!(!leasable(Algorithm::Concurrency, LeakyMode::Police));
    }
}
