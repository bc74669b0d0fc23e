//! Concurrent decisions of one hot counter on one serving thread, made in one script call.
//!
//! Under a hot key (one tenant, one descriptor) every request of a global rule runs the same
//! script on the same Redis key, and the one Redis process running them bounds the gateway.
//! So while a decision of a counter is in flight on a thread, the decisions of the same
//! counter that arrive on that thread wait for it and are then decided together: one call
//! charging their summed cost. Charging `a + b` at one instant admits exactly when charging
//! `a` and then `b` at that instant both admit, for the algorithms allowed here (a fixed
//! window's count, a sliding counter's current window, a token bucket's tokens are sums), so
//! a batch admitted whole is what the same requests one by one would have got, and each gets
//! the `remaining` of its place in the batch. A batch the store refuses is not split: each of
//! its requests asks alone, as it would have without coalescing, so near the limit the
//! decisions are the exact ones of single calls.
//!
//! Requests join a batch only while the counter's last answer left room for the whole batch
//! ([`Counter::room`]): a counter that rejects, or that is about to run out, is decided call
//! by call, so the rejection path pays no extra call. A lone request never waits: it leads
//! (its call starts at once), and only requests that arrive while a call is in flight queue.
//!
//! What is left out: concurrency slots and sliding logs (their state names each request),
//! leaky buckets (a shaped request's delay is its own), rules with `block_for` (a refused
//! batch would ban the key although some of its requests fit), quota leases (they have a
//! batching of their own) and every call that is not a single check. Coalescing runs on the
//! serving threads' current-thread runtimes only (its state is per thread, so a batch, its
//! waiters and the thread's own Redis connection are on one thread and no wake crosses
//! threads).
//!
//! The price is latency for the queued requests: one waits for the call in flight and then for
//! its batch's, two round trips in a row (three when the batch is refused), against one on a
//! pipelined connection. Under a hot key that is what frees Redis; a lone request pays nothing.
//!
//! Bounds: at most [`MAX_COUNTERS`] counters remembered per thread (the least useful, those
//! not in flight, are forgotten first), at most [`MAX_BATCH`] requests in one batch; a waiter
//! waits at most [`WAIT_TIMEOUTS`] times the store's timeout for its batch (the rest of the
//! call in flight, then its own), and a counter in flight for longer than `STALE_AFTER`
//! timeouts is taken for lost.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::lanes::on_current_thread_runtime;
use super::Inner;
use crate::limiter::store::{Grant, StoreError};
use crate::limiter::{Algorithm, Check, Decision, Limit};
use crate::metrics::metrics;

/// Counters one thread remembers (in flight, or with the room their last answer left).
pub const MAX_COUNTERS: usize = 1024;

/// Requests one batch carries; later ones ask alone.
pub const MAX_BATCH: usize = 512;

/// A queued request waits for the call in flight and then its batch's call, each bounded by
/// the store's timeout: at most this many timeouts in all.
pub const WAIT_TIMEOUTS: u32 = 2;

/// A counter's call in flight for longer than this many timeouts is taken for lost.
const STALE_AFTER: u32 = 4;

/// One decision's answer: the check's decision and grant, or why the store gave none.
pub(super) type Answer = Result<(Decision, Grant), StoreError>;

/// Whether `check` may share a call with other requests of its counter (see the module doc).
pub(super) fn eligible(check: &Check) -> bool {
    matches!(
        check.limit.algorithm(),
        Algorithm::FixedWindow | Algorithm::SlidingWindowCounter | Algorithm::TokenBucket
    ) && check.limit.block_for().is_zero()
        && check.cost > 0
}

/// A counter as one thread's coalescing knows it: the store (by address), the rule, the key.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    store: usize,
    rule: Arc<str>,
    counter: u64,
}

/// What one thread knows of one counter.
struct Counter {
    /// The rule's numbers when the counter was last decided here: a request under other
    /// numbers (a reload in between) never joins a batch of the old ones.
    limit: Limit,
    /// The cost of the call in flight led from here (`None`: none in flight).
    flying: Option<u64>,
    /// When that call started: one in flight for longer than [`STALE_AFTER`] times its
    /// timeout is taken for lost (see [`join`]), so no counter can stay in flight for good.
    since: Instant,
    /// What the counter's last answer left (0 after a rejection; `None` before the first
    /// answer and after a failure): a request joins a batch only while it covers the call in
    /// flight, those queued and its own.
    room: Option<u64>,
    /// The cost queued for the next batch.
    queued: u64,
    waiters: Vec<Waiter>,
}

/// A request queued for the next batch of its counter.
struct Waiter {
    cost: u64,
    tx: oneshot::Sender<Turn>,
}

/// What a waiter is told when its batch is over.
enum Turn {
    /// The batch was admitted: this request's decision and grant.
    Answered(Decision, Grant),
    /// The batch was refused: the request asks alone.
    Alone,
    /// The batch's call failed.
    Failed(StoreError),
}

thread_local! {
    static COUNTERS: RefCell<HashMap<Key, Counter>> = RefCell::new(HashMap::new());
}

/// How a request's decision is to be made.
pub(super) enum Join {
    /// Make the call now; hand what queued meanwhile on with [`Leading::finish`].
    Lead(Leading),
    /// Wait for the batch this request joined ([`Waiting::answer`]).
    Wait(Waiting),
    /// Make the call alone, outside any batch.
    Alone,
}

/// How a batch's call is made: the leader's lease id, timeout and `instances`.
#[derive(Clone, Copy)]
pub(super) struct CallOf {
    pub lease: u64,
    pub timeout: Duration,
    pub instances: u64,
}

/// Where `check` (of the store `inner`, [`eligible`]) is decided: see [`Join`].
pub(super) fn join(inner: &Arc<Inner>, check: &Check, call: CallOf) -> Join {
    if !on_current_thread_runtime() {
        return Join::Alone;
    }
    let key = Key {
        store: Arc::as_ptr(inner) as usize,
        rule: check.rule.clone(),
        counter: check.counter,
    };
    let joined = COUNTERS.try_with(|counters| {
        let Ok(mut counters) = counters.try_borrow_mut() else {
            return Join::Alone;
        };
        if !counters.contains_key(&key) && counters.len() >= MAX_COUNTERS {
            counters.retain(|_, c| c.flying.is_some());
            if counters.len() >= MAX_COUNTERS {
                return Join::Alone;
            }
        }
        let counter = counters.entry(key.clone()).or_insert_with(|| Counter {
            limit: check.limit.clone(),
            flying: None,
            since: Instant::now(),
            room: None,
            queued: 0,
            waiters: Vec::new(),
        });
        if counter.flying.is_some() && counter.since.elapsed() > call.timeout * STALE_AFTER {
            // A call that never handed on (it cannot, by construction; this is the bound if it
            // ever did): its waiters ask alone, and this request leads anew.
            counter.flying = None;
            counter.queued = 0;
            counter.waiters.clear();
        }
        let Some(flying) = counter.flying else {
            if counter.limit != check.limit {
                counter.limit = check.limit.clone();
                counter.room = None;
            }
            counter.flying = Some(check.cost);
            counter.since = Instant::now();
            return Join::Lead(Leading {
                inner: Arc::clone(inner),
                key: key.clone(),
                check: check.clone(),
                call,
                handed_on: false,
            });
        };
        let needed = flying
            .saturating_add(counter.queued)
            .saturating_add(check.cost);
        let fits = counter.room.is_some_and(|room| room >= needed);
        if !fits || counter.limit != check.limit || counter.waiters.len() >= MAX_BATCH {
            return Join::Alone;
        }
        let (tx, rx) = oneshot::channel();
        counter.queued += check.cost;
        counter.waiters.push(Waiter {
            cost: check.cost,
            tx,
        });
        Join::Wait(Waiting { rx })
    });
    joined.unwrap_or(Join::Alone)
}

/// A request whose call leads its counter's batches on this thread.
pub(super) struct Leading {
    inner: Arc<Inner>,
    key: Key,
    /// The leader's check: a batch is the same check at the batch's summed cost.
    check: Check,
    call: CallOf,
    handed_on: bool,
}

impl Leading {
    /// The leader's call is over: what it left is remembered, and the requests that queued
    /// meanwhile are decided as one batch.
    pub(super) fn finish(mut self, answer: &Answer) {
        self.handed_on = true;
        self.hand_on(Some(room_after(answer)));
    }

    /// Starts the next batch with what queued (recording `room`, when given), or marks the
    /// counter idle.
    fn hand_on(&self, room: Option<Option<u64>>) {
        let Some(batch_of) = take_waiters(&self.key, room) else {
            return;
        };
        let batch = Batch {
            inner: Arc::clone(&self.inner),
            key: self.key.clone(),
            check: self.check.clone(),
            call: self.call,
            armed: true,
        };
        tokio::spawn(batch.run(batch_of));
    }
}

impl Drop for Leading {
    fn drop(&mut self) {
        // The leader was dropped mid-call (its client went away): those queued behind it
        // must not wait for an answer that will never be handed on.
        if !self.handed_on {
            self.hand_on(None);
        }
    }
}

/// What an answer leaves of its counter for the next batch: its `remaining` when admitted,
/// nothing when refused, unknown when the call failed.
fn room_after(answer: &Answer) -> Option<u64> {
    match answer {
        Ok((d, _)) if d.allowed => Some(d.remaining),
        Ok(_) => Some(0),
        Err(_) => None,
    }
}

/// Records `room` (when given: what the call just over left) and takes the waiters of `key`
/// for the next call, which then counts as in flight, with their summed cost; `None` (the
/// counter now idle) when nobody waits.
fn take_waiters(key: &Key, room: Option<Option<u64>>) -> Option<(Vec<Waiter>, u64)> {
    COUNTERS
        .try_with(|counters| {
            let mut counters = counters.try_borrow_mut().ok()?;
            let counter = counters.get_mut(key)?;
            if let Some(room) = room {
                counter.room = room;
            }
            // Waiters whose request is gone are not charged.
            counter.waiters.retain(|w| !w.tx.is_closed());
            if counter.waiters.is_empty() {
                counter.flying = None;
                counter.queued = 0;
                return None;
            }
            let waiters = std::mem::take(&mut counter.waiters);
            let cost = waiters.iter().map(|w| w.cost).sum();
            counter.flying = Some(cost);
            counter.since = Instant::now();
            counter.queued = 0;
            Some((waiters, cost))
        })
        .ok()
        .flatten()
}

/// The task deciding a counter's batches until nobody waits.
struct Batch {
    inner: Arc<Inner>,
    key: Key,
    check: Check,
    call: CallOf,
    /// The task has not ended on an empty queue (see [`Drop`]).
    armed: bool,
}

impl Drop for Batch {
    fn drop(&mut self) {
        // Dropped mid-call (the runtime shut down): the counter must not stay in flight.
        if self.armed {
            let _ = COUNTERS.try_with(|counters| {
                if let Ok(mut counters) = counters.try_borrow_mut() {
                    counters.remove(&self.key);
                }
            });
        }
    }
}

impl Batch {
    /// Decides `batch` (its waiters and their summed cost), then each batch queued meanwhile.
    async fn run(mut self, mut batch: (Vec<Waiter>, u64)) {
        loop {
            let (waiters, cost) = batch;
            let mut check = self.check.clone();
            check.cost = cost;
            let answer = self.inner.decide_one(&check, self.call).await;
            let room = room_after(&answer);
            hand_out(answer, waiters);
            match take_waiters(&self.key, Some(room)) {
                Some(next) => batch = next,
                None => {
                    self.armed = false;
                    return;
                }
            }
        }
    }
}

/// Gives each waiter its part of the batch's answer: admitted, the `remaining` of its place
/// (the last one the batch's own, each earlier one that plus the cost after it) and a grant
/// of its own cost in the batch's window.
fn hand_out(answer: Answer, waiters: Vec<Waiter>) {
    match answer {
        Ok((decision, grant)) if decision.allowed => {
            let mut remaining = decision.remaining;
            for w in waiters.into_iter().rev() {
                let mine = Decision {
                    remaining,
                    ..decision
                };
                let granted = if grant.granted > 0 { w.cost } else { 0 };
                if w.tx
                    .send(Turn::Answered(mine, Grant { granted, ..grant }))
                    .is_ok()
                {
                    metrics().store_coalesced.inc();
                }
                remaining = remaining.saturating_add(w.cost);
            }
        }
        Ok(_) => {
            for w in waiters {
                let _ = w.tx.send(Turn::Alone);
            }
        }
        Err(e) => {
            for w in waiters {
                let _ = w.tx.send(Turn::Failed(e.clone()));
            }
        }
    }
}

/// A request queued for its counter's next batch.
pub(super) struct Waiting {
    rx: oneshot::Receiver<Turn>,
}

/// What a waiter ends with.
pub(super) enum Waited {
    /// Decided by its batch (or the batch failed).
    Decided(Answer),
    /// To ask alone.
    Alone,
    /// Its own deadline passed before the batch answered.
    TimedOut,
}

impl Waiting {
    /// Waits for the batch, at most until `deadline`.
    pub(super) async fn answer(self, deadline: Instant) -> Waited {
        match tokio::time::timeout_at(deadline, self.rx).await {
            Ok(Ok(Turn::Answered(d, g))) => Waited::Decided(Ok((d, g))),
            Ok(Ok(Turn::Failed(e))) => Waited::Decided(Err(e)),
            // Refused whole, or the batch was dropped: ask alone.
            Ok(Ok(Turn::Alone)) | Ok(Err(_)) => Waited::Alone,
            Err(_) => Waited::TimedOut,
        }
    }
}

#[cfg(test)]
mod tests {
    //! The queue's bounds and its hand-overs, on a store whose server is not there: every call
    //! made fails (nothing listens on its port), which is what a batch must survive.
    use super::*;
    use crate::limiter::redis::RedisStore;
    use crate::limiter::settings::{Backend, Store};

    fn store() -> Arc<RedisStore> {
        // A loopback port that was free a moment ago: nothing answers there.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        RedisStore::new(&Store {
            backend: Backend::Redis,
            urls: vec![format!("redis://127.0.0.1:{port}")],
            timeout: Duration::from_millis(100),
            key_prefix: "t:".into(),
            instances: 1,
            max_keys: 10,
            max_bans: crate::limiter::settings::DEFAULT_MAX_BANS,
            connect_timeout: Duration::from_millis(100),
        })
        .unwrap()
    }

    fn check(counter: u64) -> Check {
        crate::limiter::fixtures::check(
            "hot",
            counter,
            Algorithm::FixedWindow,
            1000,
            Duration::from_secs(60),
            1000,
        )
    }

    const CALL: CallOf = CallOf {
        lease: 1,
        timeout: Duration::from_millis(100),
        instances: 1,
    };

    fn admitted(remaining: u64) -> Answer {
        let mut d = Decision::unlimited(1000);
        d.remaining = remaining;
        Ok((d, Grant::default()))
    }

    /// A counter whose last answer left `room`, with a call of it in flight (the leader).
    fn flying_with_room(inner: &Arc<Inner>, c: &Check, room: u64) -> Leading {
        let Join::Lead(first) = join(inner, c, CALL) else {
            panic!("an idle counter leads");
        };
        first.finish(&admitted(room));
        let Join::Lead(leader) = join(inner, c, CALL) else {
            panic!("an idle counter leads");
        };
        leader
    }

    #[tokio::test]
    async fn a_leader_dropped_mid_call_hands_its_waiters_on_and_the_counter_comes_back() {
        let store = store();
        let inner = &store.inner;
        let c = check(1);
        let leader = flying_with_room(inner, &c, 100);
        let waiters: Vec<Waiting> = (0..3)
            .map(|_| match join(inner, &c, CALL) {
                Join::Wait(w) => w,
                _ => panic!("room for them: they queue"),
            })
            .collect();
        // The leader's request goes away before its call answers.
        drop(leader);
        let deadline = Instant::now() + Duration::from_secs(30);
        for w in waiters {
            // The batch ran (and failed: no server): each waiter hears it, well before its
            // own deadline would have answered for it.
            match w.answer(deadline).await {
                Waited::Decided(Err(_)) => {}
                Waited::TimedOut => panic!("the waiters were left waiting"),
                Waited::Decided(Ok(_)) => panic!("no server, no admission"),
                Waited::Alone => panic!("a failed batch is a failure, not a refusal"),
            }
        }
        assert!(Instant::now() < deadline, "the waiters were left waiting");
        // Nothing in flight any more: the next request leads, it does not queue forever.
        let mut next = join(inner, &c, CALL);
        for _ in 0..100 {
            if matches!(next, Join::Lead(_)) {
                break;
            }
            tokio::task::yield_now().await;
            next = join(inner, &c, CALL);
        }
        assert!(
            matches!(next, Join::Lead(_)),
            "the counter stayed in flight"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_never_hands_on_is_taken_for_lost() {
        let store = store();
        let inner = &store.inner;
        let c = check(6);
        // A leader that never hands on (what no path does: this is the bound if one did).
        std::mem::forget(flying_with_room(inner, &c, 100));
        let Join::Wait(stranded) = join(inner, &c, CALL) else {
            panic!("room for it: it queues");
        };
        tokio::time::advance(CALL.timeout * STALE_AFTER + Duration::from_millis(1)).await;
        assert!(
            matches!(join(inner, &c, CALL), Join::Lead(_)),
            "the counter stayed in flight"
        );
        let answer = stranded
            .answer(Instant::now() + Duration::from_secs(1))
            .await;
        assert!(
            matches!(answer, Waited::Alone),
            "the stranded waiter asks alone"
        );
    }

    #[tokio::test]
    async fn requests_queue_only_while_the_last_answer_leaves_room_for_the_batch() {
        let store = store();
        let inner = &store.inner;
        let c = check(2);
        // Room 3: the leader's own 1 and two more.
        let _leader = flying_with_room(inner, &c, 3);
        assert!(matches!(join(inner, &c, CALL), Join::Wait(_)));
        let _kept = join(inner, &c, CALL);
        assert!(matches!(_kept, Join::Wait(_)));
        assert!(
            matches!(join(inner, &c, CALL), Join::Alone),
            "a fourth would not fit: it asks alone"
        );
        // A counter whose last answer refused queues nobody.
        let refused = check(3);
        let Join::Lead(first) = join(inner, &refused, CALL) else {
            panic!("an idle counter leads");
        };
        let mut no = Decision::unlimited(1000);
        no.allowed = false;
        first.finish(&Ok((no, Grant::default())));
        let _leader = join(inner, &refused, CALL);
        assert!(matches!(join(inner, &refused, CALL), Join::Alone));
        // Another limit for the same counter (a reload in between) never joins the old batch.
        let mut other = c.clone();
        other.limit = Limit::police(Algorithm::FixedWindow, 5, Duration::from_secs(60), 5);
        assert!(matches!(join(inner, &other, CALL), Join::Alone));
    }

    #[tokio::test]
    async fn a_batch_and_the_counters_remembered_are_bounded() {
        let store = store();
        let inner = &store.inner;
        let c = check(4);
        let _leader = flying_with_room(inner, &c, u64::MAX);
        let mut queued = Vec::new();
        loop {
            match join(inner, &c, CALL) {
                Join::Wait(w) => queued.push(w),
                Join::Alone => break,
                Join::Lead(_) => panic!("a call is in flight"),
            }
            assert!(queued.len() <= MAX_BATCH, "the batch grew past its cap");
        }
        assert_eq!(queued.len(), MAX_BATCH);
        // Counters in flight fill the table; one more is decided alone, not remembered.
        let mut leaders = Vec::new();
        for counter in 100.. {
            match join(inner, &check(counter), CALL) {
                Join::Lead(l) => leaders.push(l),
                Join::Alone => break,
                Join::Wait(_) => panic!("a new counter has nothing in flight"),
            }
            assert!(leaders.len() <= MAX_COUNTERS, "the table grew past its cap");
        }
        let in_table = COUNTERS.with(|c| c.borrow().len());
        assert_eq!(in_table, MAX_COUNTERS);
        // Once they are idle, new counters take their place.
        for l in leaders {
            l.finish(&admitted(10));
        }
        assert!(matches!(
            join(inner, &check(5_000_000), CALL),
            Join::Lead(_)
        ));
        assert!(COUNTERS.with(|c| c.borrow().len()) <= MAX_COUNTERS);
    }
}
