//! The limiter the proxy calls: decides every applying rule of a request and turns the rules'
//! decisions into one verdict.
//!
//! - Local rules (and every rule on the memory backend) are decided in process.
//! - Global rules on a Redis backend are decided in one call to the shared store, atomically.
//! - A request rejected by any rule charges no rule: local rules are first *peeked*, the shared
//!   store is asked, and only when it admits are the local rules charged.
//!   Approximation, stated honestly: if a concurrent request takes the last local unit between
//!   the peek and the charge, this request is rejected after the shared store charged it.
//! - When the shared store fails (error, timeout, open circuit) each global rule's
//!   `on_store_error` decides: `open` admits (counted, logged), `closed` refuses with 503,
//!   `local` decides in process with `limit / instances`.
//! - Global rules with `lease` spend permits leased from the shared store in process (see
//!   [`super::lease`]); only keys whose lease ran out join the request's one store call, which
//!   leases more in the same script run. A request rejected by any rule puts the permits it
//!   took back into the lease, uncharged.
//! - Shadow rules are decided after the verdict, one by one, only for admitted requests, and
//!   always in process (a shadow global rule counts per instance): they can never reject or
//!   cost the request a round trip.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::lease::{leasable, lease_metrics, LeaseTable, Take};
use super::memory::MemoryStore;
use super::policy::{FailureMode, Policy, Scope};
use super::redis::RedisStore;
use super::settings::{Backend, Store};
use super::store::{bounded, Grant, SharedStore, StoreError};
use super::{Algorithm, Check, Decision, LeakyMode};

/// `Retry-After` of a 503 caused by a failing store: the circuit breaker's cool-down scale.
pub const STORE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// What the proxy does with a request after the rules have spoken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Forward, after holding the request for `delay` (leaky bucket shaping).
    Allow {
        /// How long to hold the request first.
        delay: Duration,
    },
    /// Refuse: the rules named rejected it.
    Reject {
        /// The status (429, or the first rejecting rule's `status`).
        status: u16,
        /// Time after which the request would be admitted.
        retry_after: Duration,
        /// Rules that rejected it, in file order.
        rules: Vec<Arc<str>>,
    },
    /// Refuse with 503: the store is failing and these rules are `on_store_error = "closed"`.
    Unavailable {
        /// When to try again.
        retry_after: Duration,
        /// The closed rules.
        rules: Vec<Arc<str>>,
    },
}

/// A rule's decision for one request.
#[derive(Debug, Clone)]
pub struct Applied {
    /// The rule.
    pub rule: Arc<Policy>,
    /// The counter the request charged ([`Check::counter`]): who the client is to this rule.
    pub counter: u64,
    /// Its decision.
    pub decision: Decision,
}

/// Everything the limiter decided about one request.
#[derive(Debug)]
pub struct Outcome {
    /// The verdict.
    pub verdict: Verdict,
    /// Enforcing rules that were decided, in file order, with their decisions (headers come
    /// from these).
    pub applied: Vec<Applied>,
    /// Shadow rules that would have rejected the request.
    pub shadow_rejected: Vec<Arc<str>>,
    /// Concurrency slots taken: released when the [`Slots`] is dropped.
    pub leases: Slots,
}

/// The rate limiter: counters and the logic that combines rules.
pub struct Limiter {
    /// Local rules, and every rule on the memory backend.
    local: Arc<MemoryStore>,
    /// `on_store_error = "local"` decisions while the shared store fails.
    fallback: Arc<MemoryStore>,
    /// The shared store (Redis), when configured.
    shared: Option<Arc<dyn SharedStore>>,
    /// Requests being held by shaping rules: per rule name, when each one's wait ends.
    waiting: Waiting,
    /// Quota leases held for leased global rules (see [`super::lease`]).
    leases: Arc<LeaseTable>,
}

/// How many requests one shaping rule (`leaky_bucket`, `mode = "shape"`) may hold waiting at
/// once, per instance, unless its `max_waiting` says otherwise. Each one holds a connection
/// and its request for up to `max_delay`; past this the rule rejects (its status, counted as
/// its rejection), so a flood of keys cannot turn shaping into connection exhaustion.
pub const MAX_WAITING_PER_RULE: usize = 1000;

/// Requests held by shaping rules, counted by the instant their wait ends: the proxy holds an
/// admitted request exactly its `delay`, so an entry whose instant has passed is no longer
/// waiting. Bounded: at most each rule's cap of entries per rule.
#[derive(Default)]
struct Waiting {
    rules: parking_lot::Mutex<
        std::collections::HashMap<
            Arc<str>,
            std::collections::BinaryHeap<std::cmp::Reverse<Instant>>,
        >,
    >,
}

impl Waiting {
    /// Takes a waiting place until `now + delay` in each of `rules` (name, `max_waiting`), all
    /// or none. `Err(i)`: `rules[i]` is full.
    fn reserve(
        &self,
        rules: &[(&Arc<str>, usize)],
        now: Instant,
        delay: Duration,
    ) -> Result<(), usize> {
        let mut map = self.rules.lock();
        // Waits that have ended go first. Rules without a waiting request hold no entry, so
        // the map stays as small as the number of rules holding requests right now.
        map.retain(|_, heap| {
            while heap.peek().is_some_and(|r| r.0 <= now) {
                heap.pop();
            }
            !heap.is_empty()
        });
        for (i, (rule, cap)) in rules.iter().enumerate() {
            let waiting = map.get(&***rule).map_or(0, |heap| heap.len());
            if waiting >= (*cap).max(1) {
                return Err(i);
            }
        }
        for (rule, _) in rules {
            map.entry((*rule).clone())
                .or_default()
                .push(std::cmp::Reverse(now + delay));
        }
        Ok(())
    }
}

/// Which store decides a check.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Local,
    Shared,
}

impl Limiter {
    /// A limiter for `store`: in-process stores bounded to `max_keys`, and the Redis store when
    /// the backend is Redis (it connects in the background).
    pub fn new(store: &Store) -> Self {
        let shared: Option<Arc<dyn SharedStore>> = match store.backend {
            Backend::Memory => None,
            Backend::Redis | Backend::RedisCluster => {
                match RedisStore::with_options(store, options_from_env()) {
                    Ok(s) => Some(s),
                    Err(e) => {
                        // Down for good, not absent: absent would make every global rule a
                        // per-instance limit at the full limit while everything reported healthy.
                        tracing::error!(error = %e, "cannot set up the Redis store; it counts as down and global rules apply on_store_error");
                        Some(RedisStore::broken(store, e))
                    }
                }
            }
        };
        Limiter::with_shared(store.max_keys, shared)
    }

    /// A limiter over `shared` (global rules are decided there; `None`: every rule is decided
    /// in process), its in-process stores bounded to `max_keys`. [`Limiter::new`] passes the
    /// Redis store; tests pass a store of their own.
    pub fn with_shared(max_keys: usize, shared: Option<Arc<dyn SharedStore>>) -> Self {
        // Registered up front, so /metrics lists them before the first lease.
        lease_metrics();
        Limiter {
            local: Arc::new(MemoryStore::new(max_keys)),
            fallback: Arc::new(MemoryStore::new(max_keys)),
            shared,
            waiting: Waiting::default(),
            leases: Arc::new(LeaseTable::default()),
        }
    }

    /// The in-process store (for metrics and tests).
    pub fn memory(&self) -> &MemoryStore {
        &self.local
    }

    /// The shared store, if any.
    pub fn shared(&self) -> Option<&Arc<dyn SharedStore>> {
        self.shared.as_ref()
    }

    /// A background service that gives back the unspent permits of ended quota leases, in one
    /// batched call per [`super::lease::RETURN_EVERY`], and every permit held on shutdown.
    pub fn returner(&self) -> Returner {
        Returner {
            table: self.leases.clone(),
            shared: self.shared.clone(),
        }
    }

    /// Gives back every quota lease permit held now (on reload: a rule's numbers or lease
    /// may have changed). Returns how many the store took back.
    pub async fn return_leases(&self) -> u64 {
        give_back(&self.leases, self.shared.as_ref(), true).await
    }

    /// A background service that sweeps idle keys out of the in-process stores.
    pub fn sweeper(&self) -> Sweeper {
        Sweeper {
            stores: vec![self.local.clone(), self.fallback.clone()],
        }
    }

    /// Decides a request's applying rules, each with its check, in file order, under `store`
    /// (the config in force: its timeout and instance count apply).
    pub async fn decide(&self, applying: Vec<(Arc<Policy>, Check)>, store: &Store) -> Outcome {
        let mut enforcing_rules = Vec::with_capacity(applying.len());
        let mut enforcing = Vec::with_capacity(applying.len());
        let mut shadow = Vec::new();
        for (rule, check) in applying {
            if rule.shadow {
                shadow.push((rule, check));
            } else {
                enforcing_rules.push(rule);
                enforcing.push(check);
            }
        }
        let places: Vec<Place> = enforcing_rules
            .iter()
            .map(|r| match (&self.shared, r.scope) {
                (Some(_), Scope::Global) => Place::Shared,
                _ => Place::Local,
            })
            .collect();
        let mut leases = Slots::default();
        let mut decisions: Vec<Option<Decision>> = vec![None; enforcing.len()];
        let mut closed = Vec::new();

        let shared_idx: Vec<usize> = (0..enforcing.len())
            .filter(|&i| places[i] == Place::Shared)
            .collect();
        let local_idx: Vec<usize> = (0..enforcing.len())
            .filter(|&i| places[i] == Place::Local)
            .collect();
        let local_checks: Vec<Check> = local_idx.iter().map(|&i| enforcing[i].clone()).collect();

        let mut admitted = true;
        // Leased permits this request spends: put back if it ends up rejected.
        let mut returned_permits: Vec<usize> = Vec::new();
        if shared_idx.is_empty() {
            // The common, memory-only case: one atomic decision in process.
            if !local_checks.is_empty() {
                let ds = self.local.decide(&local_checks);
                admitted = ds.iter().all(|d| d.allowed);
                place(&mut decisions, &local_idx, ds);
            }
        } else {
            let peeked = if local_checks.is_empty() {
                Vec::new()
            } else {
                self.local.peek(&local_checks)
            };
            if peeked.iter().all(|d| d.allowed) {
                let shared = self
                    .shared
                    .as_ref()
                    .expect("shared places exist only with a shared store")
                    .clone();
                // Leased rules spend the permits in hand; what is left goes to the store in
                // one call: exact checks, and leases for the keys that ran out.
                let mut spent = Vec::new();
                let mut call_idx = Vec::with_capacity(shared_idx.len());
                let mut wants = Vec::with_capacity(shared_idx.len());
                let mut guards = Vec::with_capacity(shared_idx.len());
                let mut denied = false;
                for &i in &shared_idx {
                    let check = &enforcing[i];
                    // Validation allows `lease` only where it is exact; hand-built policies
                    // elsewhere are decided exactly.
                    let Some(lease) = enforcing_rules[i]
                        .lease
                        .filter(|_| leasable(check.limit.algorithm(), check.limit.mode()))
                    else {
                        call_idx.push(i);
                        wants.push(0);
                        guards.push(None);
                        continue;
                    };
                    let mut tries = 0;
                    loop {
                        match self.leases.take(check, &lease, Instant::now()) {
                            Take::Spent(d) => {
                                decisions[i] = Some(d);
                                spent.push(i);
                            }
                            Take::Denied(d) => {
                                decisions[i] = Some(d);
                                denied = true;
                            }
                            Take::Lease { want, guard } => {
                                call_idx.push(i);
                                wants.push(want);
                                guards.push(Some((guard, lease)));
                            }
                            Take::Wait(mut rx) if tries < 3 => {
                                // Another request is leasing for this key: share its call.
                                tries += 1;
                                let _ = tokio::time::timeout(store.timeout, rx.changed()).await;
                                continue;
                            }
                            Take::Wait(_) | Take::Exact => {
                                call_idx.push(i);
                                wants.push(0);
                                guards.push(None);
                            }
                        }
                        break;
                    }
                }
                let mut filled = Vec::new();
                let mut calls = 0.0;
                if denied {
                    // Refused in process by a leased rule: nothing is asked or charged.
                    admitted = false;
                } else if !call_idx.is_empty() {
                    let call_checks: Vec<Check> =
                        call_idx.iter().map(|&i| enforcing[i].clone()).collect();
                    let lease = fastrand::u64(..);
                    let sent = Instant::now();
                    calls = 1.0;
                    // Exact checks want 0 permits: the same call decides them exactly.
                    let answer = shared
                        .decide_leased(&call_checks, &wants, store.instances, lease, store.timeout)
                        .await
                        .and_then(|answers| checked(answers, &call_checks, &wants));
                    match answer {
                        Ok(answers) => {
                            admitted = answers.iter().all(|(d, _)| d.allowed);
                            if admitted {
                                leases.shared = concurrency_checks(&call_checks);
                                if !leases.shared.is_empty() {
                                    leases.shared_store = Some((shared.clone(), lease));
                                }
                            }
                            let mut ds = Vec::with_capacity(answers.len());
                            for (((d, g), guard), &i) in
                                answers.into_iter().zip(guards).zip(&call_idx)
                            {
                                if let Some((guard, l)) = guard {
                                    self.leases.fill(
                                        guard,
                                        &enforcing[i],
                                        &l,
                                        &d,
                                        g,
                                        admitted,
                                        sent,
                                    );
                                    if admitted && g.granted > 0 {
                                        filled.push(i);
                                    }
                                }
                                ds.push(d);
                            }
                            place(&mut decisions, &call_idx, ds);
                        }
                        Err(e) => {
                            // Waiters go on (and meet the same trouble); permits in hand stay
                            // spendable until their lease ends.
                            drop(guards);
                            let (ok, ds) = self.on_store_error(
                                &e,
                                &enforcing_rules,
                                &call_idx,
                                &call_checks,
                                store,
                                &mut leases,
                                &mut closed,
                            );
                            admitted = ok;
                            place(&mut decisions, &call_idx, ds);
                        }
                    }
                }
                lease_metrics().calls_per_request.observe(calls);
                if admitted && !local_checks.is_empty() {
                    let ds = self.local.decide(&local_checks);
                    admitted = ds.iter().all(|d| d.allowed);
                    place(&mut decisions, &local_idx, ds);
                } else {
                    place(&mut decisions, &local_idx, peeked);
                }
                returned_permits = spent.into_iter().chain(filled).collect();
            } else {
                admitted = false;
                place(&mut decisions, &local_idx, peeked);
            }
        }

        if admitted {
            // Shaping rules hold the request: take a waiting place in each, or reject as the
            // first full rule. Its units stay charged (as when a concurrent request wins the
            // last local unit after the peek): only a flood reaches the cap.
            let holding: Vec<usize> = (0..decisions.len())
                .filter(|&i| {
                    enforcing_rules[i].limit.mode == LeakyMode::Shape
                        && decisions[i].as_ref().is_some_and(|d| !d.delay.is_zero())
                })
                .collect();
            if !holding.is_empty() {
                let delay = holding
                    .iter()
                    .filter_map(|&i| decisions[i].as_ref().map(|d| d.delay))
                    .max()
                    .unwrap_or_default();
                let caps: Vec<(&Arc<str>, usize)> = holding
                    .iter()
                    .map(|&i| (&enforcing_rules[i].name, enforcing_rules[i].max_waiting))
                    .collect();
                if let Err(full) = self.waiting.reserve(&caps, Instant::now(), delay) {
                    let i = holding[full];
                    if let Some(d) = decisions[i].as_mut() {
                        d.allowed = false;
                        d.retry_after = d.delay.max(Duration::from_secs(1));
                        d.delay = Duration::ZERO;
                    }
                    tracing::debug!(rule = %enforcing_rules[i].name, "too many requests waiting on a shaping rule; rejected");
                    admitted = false;
                }
            }
        }
        if admitted {
            leases.renew_while_held();
            leases.local = concurrency_checks(local_idx.iter().map(|&i| &enforcing[i]));
            if !leases.local.is_empty() {
                leases.local_store = Some(self.local.clone());
            }
        } else {
            // Nothing was kept: slots the shared store or the fallback took are given back,
            // and leased permits go back to the lease in hand, uncharged.
            leases = Slots::default();
            for i in returned_permits {
                self.leases.put_back(&enforcing[i]);
            }
        }

        let applied: Vec<Applied> = enforcing_rules
            .iter()
            .zip(&enforcing)
            .zip(decisions)
            .filter_map(|((rule, check), d)| {
                d.map(|decision| Applied {
                    rule: rule.clone(),
                    counter: check.counter,
                    decision,
                })
            })
            .collect();
        let verdict = if admitted {
            for a in &applied {
                a.rule.counters.allowed.inc();
            }
            let delay = applied
                .iter()
                .map(|a| a.decision.delay)
                .max()
                .unwrap_or_default();
            Verdict::Allow { delay }
        } else if !closed.is_empty() {
            Verdict::Unavailable {
                retry_after: STORE_RETRY_AFTER,
                rules: closed,
            }
        } else {
            let mut status = 429;
            let mut retry_after = Duration::ZERO;
            let mut names = Vec::new();
            for a in applied.iter().filter(|a| !a.decision.allowed) {
                if names.is_empty() {
                    status = a.rule.status;
                }
                a.rule.counters.rejected.inc();
                retry_after = retry_after.max(a.decision.retry_after);
                names.push(a.rule.name.clone());
            }
            Verdict::Reject {
                status,
                retry_after,
                rules: names,
            }
        };

        let mut shadow_rejected = Vec::new();
        if admitted {
            for (rule, check) in shadow {
                let d = self.local.decide(std::slice::from_ref(&check));
                match d.first() {
                    Some(d) if !d.allowed => {
                        rule.counters.shadow_rejected.inc();
                        shadow_rejected.push(rule.name.clone());
                    }
                    Some(_) => {
                        rule.counters.allowed.inc();
                        if check.limit.algorithm == Algorithm::Concurrency {
                            leases.local.push(check);
                            leases.local_store = Some(self.local.clone());
                        }
                    }
                    None => {}
                }
            }
        }
        Outcome {
            verdict,
            applied,
            shadow_rejected,
            leases,
        }
    }

    /// Applies each failed rule's `on_store_error`. Returns whether the shared part admits,
    /// and a decision per shared check.
    #[allow(clippy::too_many_arguments)]
    fn on_store_error(
        &self,
        error: &StoreError,
        rules: &[Arc<Policy>],
        shared_idx: &[usize],
        shared_checks: &[Check],
        store: &Store,
        leases: &mut Slots,
        closed: &mut Vec<Arc<str>>,
    ) -> (bool, Vec<Decision>) {
        let mut ds = Vec::with_capacity(shared_checks.len());
        let mut fallback_pos = Vec::new();
        let mut fallback_checks = Vec::new();
        for (pos, (&i, check)) in shared_idx.iter().zip(shared_checks).enumerate() {
            let rule = &rules[i];
            match rule.on_store_error {
                FailureMode::Open => {
                    rule.counters.fail_open.inc();
                    log_store_failure(error, &rule.name, "open");
                    ds.push(Decision::unlimited(check.limit.limit));
                }
                FailureMode::Closed => {
                    rule.counters.fail_closed.inc();
                    log_store_failure(error, &rule.name, "closed");
                    closed.push(rule.name.clone());
                    let mut d = Decision::unlimited(check.limit.limit);
                    d.allowed = false;
                    d.remaining = 0;
                    d.retry_after = STORE_RETRY_AFTER;
                    ds.push(d);
                }
                FailureMode::Local => {
                    rule.counters.fail_local.inc();
                    log_store_failure(error, &rule.name, "local");
                    ds.push(Decision::unlimited(check.limit.limit));
                    fallback_pos.push(pos);
                    fallback_checks.push(divided(check, store.instances));
                }
            }
        }
        if !closed.is_empty() {
            return (false, ds);
        }
        if fallback_checks.is_empty() {
            return (true, ds);
        }
        let local = self.fallback.decide(&fallback_checks);
        let ok = local.iter().all(|d| d.allowed);
        if ok {
            leases.fallback = concurrency_checks(&fallback_checks);
            if !leases.fallback.is_empty() {
                leases.fallback_store = Some(self.fallback.clone());
            }
        }
        for (pos, d) in fallback_pos.into_iter().zip(local) {
            ds[pos] = d;
        }
        (ok, ds)
    }
}

/// The Redis store's options: the defaults, but for the slot TTL that tests of long requests
/// shorten through the internal `FLOODGATE_TEST_SLOT_TTL_MS` environment variable (300 s is
/// too long to wait for in a test). Not a setting (README, "Running the tests").
fn options_from_env() -> super::redis::Options {
    let mut options = super::redis::Options::default();
    if let Some(ms) = std::env::var("FLOODGATE_TEST_SLOT_TTL_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&ms| ms > 0)
    {
        options.lease_ttl = Duration::from_millis(ms);
    }
    options
}

/// The concurrency checks among `checks`: the slots an admitted request holds until it ends.
fn concurrency_checks<'a>(checks: impl IntoIterator<Item = &'a Check>) -> Vec<Check> {
    checks
        .into_iter()
        .filter(|c| c.limit.algorithm == Algorithm::Concurrency)
        .cloned()
        .collect()
}

/// The store's answers, one per check, each held to its rule's own bounds (see [`bounded`]);
/// an answer that does not hold one decision per check is a store failure, never an admit.
fn checked(
    answers: Vec<(Decision, Grant)>,
    checks: &[Check],
    wants: &[u64],
) -> Result<Vec<(Decision, Grant)>, StoreError> {
    if answers.len() != checks.len() {
        return Err(StoreError::Redis(format!(
            "the store answered {} decisions for {} checks",
            answers.len(),
            checks.len()
        )));
    }
    Ok(answers
        .into_iter()
        .zip(checks.iter().zip(wants))
        .map(|(answer, (check, &wanted))| bounded(check, wanted, answer))
        .collect())
}

/// Puts `ds` (decisions for the checks at `idx`) into their places.
fn place(out: &mut [Option<Decision>], idx: &[usize], ds: Vec<Decision>) {
    for (&i, d) in idx.iter().zip(ds) {
        out[i] = Some(d);
    }
}

/// The check with its limit shared out among `instances` gateways (at least 1 each).
fn divided(check: &Check, instances: u64) -> Check {
    let mut c = check.clone();
    c.limit = check.limit.divided(instances);
    c
}

/// Store failures can come at request rate: one log line per second at most, with how many
/// decisions were made that way since the last line. Every decision is counted in metrics.
fn log_store_failure(error: &StoreError, rule: &str, mode: &str) {
    static LAST: AtomicU64 = AtomicU64::new(0);
    static SINCE: AtomicU64 = AtomicU64::new(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let suppressed = SINCE.fetch_add(1, Ordering::Relaxed);
    let last = LAST.load(Ordering::Relaxed);
    if now > last
        && LAST
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        SINCE.store(0, Ordering::Relaxed);
        tracing::warn!(
            error = %error,
            rule,
            on_store_error = mode,
            decisions_since_last_line = suppressed + 1,
            "store failed; rule decided by its on_store_error"
        );
    }
}

/// Concurrency slots held by one request (not quota leases: see [`super::lease`]). Dropping it
/// releases them, so a slot is given back however the exchange ends: finished, upstream error,
/// client gone or timeout. While held, shared slots are renewed every third of their TTL, so
/// a request longer than the TTL (an export, a stream) keeps its slot until it ends.
#[derive(Default)]
pub struct Slots {
    local_store: Option<Arc<MemoryStore>>,
    local: Vec<Check>,
    fallback_store: Option<Arc<MemoryStore>>,
    fallback: Vec<Check>,
    shared_store: Option<(Arc<dyn SharedStore>, u64)>,
    shared: Vec<Check>,
    /// Renews the shared slots while the request runs; aborted when they are released.
    renewal: Option<tokio::task::JoinHandle<()>>,
}

impl Slots {
    /// Starts renewing the shared slots every third of the store's slot TTL (inside a Tokio
    /// runtime; outside one the slots simply live their TTL).
    fn renew_while_held(&mut self) {
        let Some((store, id)) = &self.shared_store else {
            return;
        };
        if self.shared.is_empty() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let every = (store.slot_ttl() / 3).max(Duration::from_millis(10));
        let (store, id, checks) = (store.clone(), *id, self.shared.clone());
        self.renewal = Some(rt.spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            loop {
                tick.tick().await;
                store.renew(&checks, id).await;
            }
        }));
    }

    /// Whether the request holds no slot.
    pub fn is_empty(&self) -> bool {
        self.local.is_empty() && self.fallback.is_empty() && self.shared.is_empty()
    }
}

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slots")
            .field("local", &self.local.len())
            .field("fallback", &self.fallback.len())
            .field("shared", &self.shared.len())
            .finish()
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
        if let Some(store) = &self.local_store {
            for c in self.local.drain(..) {
                store.release(&c);
            }
        }
        if let Some(store) = &self.fallback_store {
            for c in self.fallback.drain(..) {
                store.release(&c);
            }
        }
        if let Some((store, lease)) = self.shared_store.take() {
            let checks = std::mem::take(&mut self.shared);
            if checks.is_empty() {
                return;
            }
            // Releasing needs a round trip; the lease expires by itself if this cannot run.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move { store.release(&checks, lease).await });
            }
        }
    }
}

/// Gives back what `table` has due (with `all`, everything it holds) in one batched call.
async fn give_back(table: &LeaseTable, shared: Option<&Arc<dyn SharedStore>>, all: bool) -> u64 {
    let due = table.due(all, Instant::now());
    match shared {
        Some(store) if !due.is_empty() => store.give_back(&due).await,
        _ => 0,
    }
}

/// Background service that gives back unspent quota lease permits (see
/// [`Limiter::returner`]).
pub struct Returner {
    table: Arc<LeaseTable>,
    shared: Option<Arc<dyn SharedStore>>,
}

#[async_trait::async_trait]
impl pingora::services::background::BackgroundService for Returner {
    async fn start(&self, mut shutdown: pingora::server::ShutdownWatch) {
        let mut tick = tokio::time::interval(super::lease::RETURN_EVERY);
        loop {
            tokio::select! {
                _ = shutdown.changed() => {
                    // Shutting down: lease no more, and give back every permit held, so the
                    // other instances get them at once rather than when their window ends.
                    self.table.close();
                    give_back(&self.table, self.shared.as_ref(), true).await;
                    return;
                }
                _ = tick.tick() => {
                    give_back(&self.table, self.shared.as_ref(), false).await;
                }
            }
        }
    }
}

/// How often idle keys are swept out of the in-process stores, so that quiet shards give their
/// memory back even when no request touches them.
pub const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Background service that sweeps the in-process stores every [`SWEEP_EVERY`].
pub struct Sweeper {
    stores: Vec<Arc<MemoryStore>>,
}

#[async_trait::async_trait]
impl pingora::services::background::BackgroundService for Sweeper {
    async fn start(&self, mut shutdown: pingora::server::ShutdownWatch) {
        let mut tick = tokio::time::interval(SWEEP_EVERY);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => {
                    let stores = self.stores.clone();
                    // Sweeping a million keys takes milliseconds: keep it off the workers.
                    let _ = tokio::task::spawn_blocking(move || stores.iter().for_each(|s| s.sweep())).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
