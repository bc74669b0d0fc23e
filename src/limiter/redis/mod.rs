//! The shared store: Redis (standalone or Cluster), deciding all global rules of a request in
//! one atomic Lua call. [`RedisStore`] implements [`SharedStore`], the only face the engine
//! sees.
//!
//! Split by concern: [`script`] (the scripts and the Rust↔Lua wire contract), `conn` (what to
//! connect with, the live connection and the reconnect loop), [`resp`] (floodgate's own
//! pipelined connection to a `redis://` server), `lanes` (one of those per serving thread),
//! `coalesce` (concurrent decisions of one counter in one call),
//! `cluster` (hash slots), `topology` (which
//! master holds which slots), `nodes` (each destination's breaker and health), [`breaker`]
//! (the circuit breaker) and `probe` (the `maxmemory-policy` eviction probe).
//!
//! # Scripts
//! `lua/` holds one file per algorithm, each defining one local function that mirrors its
//! counterpart in [`super::algorithm`] decision for decision (same rounding, same
//! `remaining`, `reset`, `retry_after` and `delay`), helpers (`common.lua`, `wide.lua`,
//! `gcra.lua`), and
//! `decide.lua`, which decides every check of a request against the stored state and charges
//! all of them only if all admit. They are concatenated at compile time into ONE script
//! ([`script::DECIDE_LUA`], one SHA) and run with `EVALSHA`; `release.lua` gives concurrency
//! slots back and `renew.lua` keeps the slots of a running request alive; `lease_return.lua`
//! gives back the unspent permits of quota leases (`decide.lua` grants them). A `NOSCRIPT` answer (after `SCRIPT FLUSH` or a Redis restart) is met with
//! `SCRIPT LOAD` (to every node, in a cluster) and the same `EVALSHA` again, so no caller ever
//! sees it. Time comes from Redis `TIME` inside the script, never from a gateway
//! clock, so gateways whose clocks disagree still share exact limits.
//!
//! # Units
//! Lua numbers are doubles, exact below 2^53. Instants are therefore kept in **microseconds**
//! since the epoch (the resolution of `TIME`), windows in whole microseconds (config windows
//! are whole milliseconds; a finer window is rounded up to the next microsecond), and the
//! nanosecond durations of the buckets and of a sliding counter's waits as **wide** numbers:
//! whole microseconds plus 0..999 nanoseconds (`lua/wide.lua`). Validation bounds every rule
//! so that all of them stay exact (windows and a bucket's refill up to ten years, limits and
//! bursts up to 10^15: [`super::algorithm::MAX_WINDOW`], [`super::algorithm::MAX_COUNT`]);
//! numbers of a hand-built rule past that are capped below 2^53, never wrapped.
//!
//! # Redis keys
//! `<key_prefix><rule>:{<16 hex digits of Check::counter>}`. The counter id is the hash tag, so in
//! a cluster the checks of rules keyed on the same parts share a slot and are decided in one
//! call; network input never reaches a Redis key verbatim (it is hashed) and Redis keys have
//! bounded length. Every Redis key carries a TTL that ends when its state stops mattering
//! (window end, bucket refilled, last log entry or lease expired), and the sliding log's
//! sorted set never holds more entries than the rule's limit.
//!
//! # Round trips
//! Standalone: at most one `EVALSHA` per request whatever the number of rules, on a pipelined
//! connection shared by every request of the serving thread (`lanes`; the instance's shared
//! one, rebuilt in the background when it breaks, until the thread's own is up); concurrent
//! single-rule decisions of one counter on a thread share one call (`coalesce`). Cluster:
//! one `EVALSHA` per hash slot among the request's keys, issued concurrently; each call is
//! atomic, but a request whose keys span slots is not atomic across them (see
//! [`SharedStore::decide`]).
//!
//! # Failures
//! [`RedisStore::new`] never blocks and never fails because Redis is down: it connects in the
//! background and keeps retrying. A decision gives up after its `timeout`
//! ([`StoreError::Timeout`]); after [`breaker::FAILURE_THRESHOLD`] consecutive failures the
//! circuit breaker fails calls fast for [`breaker::COOL_DOWN`], then probes (see
//! [`breaker`]). In a cluster every master has a breaker of its own: a request whose keys
//! live on healthy masters is decided exactly while the keys of a dead one fail fast (a
//! request touching it fails as a whole, and its rules apply `on_store_error`). On connect (and on recovery after failures) the store reads Redis'
//! `maxmemory-policy` and warns loudly when it lets Redis evict floodgate's keys.

pub mod breaker;
mod cluster;
mod coalesce;
mod conn;
mod lanes;
mod nodes;
mod probe;
mod reconnect;
mod resets;
pub mod resp;
pub mod script;
mod socket;
mod topology;
mod true_up;
mod usage;
mod warm;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use super::store::{
    Changed, Grant, HeardReset, Return, SharedStore, StoreError, StoreStatus, UsageCall,
    UsageChange,
};
use super::{Check, Decision};
use crate::limiter::settings::Store;
use crate::metrics::metrics;
use crate::text::push_hex16;
use breaker::{BreakerState, COOL_DOWN, FAILURE_THRESHOLD};
use conn::{Conn, Target};
pub use conn::{RedisClient, UrlError};
use nodes::{Census, Node};
use reconnect::connect_loop;
use script::{
    grant, hex16, holds_slot, sat, unpack_reply, Lua, Params, DECIDE, LEASE_RETURN, MAX_EXACT,
    RELEASE, RENEW, REPLY_BYTES,
};
pub use socket::CONNECT_TIMEOUT;
use topology::Topology;

/// How long a global concurrency slot (not a quota lease: the word is historical) counts when
/// its request never releases it (the gateway died mid-request, or the release could not
/// reach Redis): a crashed gateway's slots come back within minutes. A running request renews
/// its slots every third of this, so a request longer than it (an export, a stream) keeps
/// counting until it ends.
pub const LEASE_TTL: Duration = Duration::from_secs(300);

/// Budget of a release: it runs off the request path, and a release that is lost holds a slot
/// until its lease expires, so it may wait longer than a decision.
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(1);

/// Tunables that tests shorten; [`RedisStore::new`] uses the defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// How long an unreleased concurrency slot counts ([`LEASE_TTL`]).
    pub lease_ttl: Duration,
    /// Consecutive failures that open the breaker ([`FAILURE_THRESHOLD`]).
    pub failure_threshold: u32,
    /// How long the breaker stays open before probing ([`COOL_DOWN`]).
    pub cool_down: Duration,
}

impl Options {
    /// The slot lease TTL as the scripts take it: whole microseconds, at least 1.
    fn lease_ttl_us(&self) -> u64 {
        sat(self.lease_ttl.as_micros()).clamp(1, MAX_EXACT)
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            lease_ttl: LEASE_TTL,
            failure_threshold: FAILURE_THRESHOLD,
            cool_down: COOL_DOWN,
        }
    }
}

/// A Redis-backed store. Cheap to share: every request uses the same connection(s).
pub struct RedisStore {
    inner: Arc<Inner>,
}

/// The store's state, shared with its background tasks (which hold it weakly, so that
/// dropping the store ends them).
struct Inner {
    target: Target,
    /// `host:port` of the URL(s): what logs show (never the URL, which may hold a password).
    endpoint: String,
    key_prefix: String,
    options: Options,
    /// The connection once established; `None` until then. Requests wait for it within their
    /// timeout, so the first requests after start do not fail while it is being set up.
    conn: watch::Sender<Option<Conn>>,
    /// The background connection task was spawned.
    started: AtomicBool,
    /// A (re)connection task is running.
    connecting: AtomicBool,
    /// How the nodes (the server; a cluster's masters) stand, summed up.
    census: Arc<Census>,
    /// Which node guards each call: a cluster's masters by slot, else the store's one node.
    topology: ArcSwap<Topology>,
    /// Asks for the slot map to be read again (a master's breaker opened).
    refresh: Arc<Notify>,
    /// The slot map refresh task was spawned.
    refreshing: AtomicBool,
    /// The last `maxmemory-policy` read (the most dangerous one, in a cluster).
    policy: Mutex<Option<String>>,
    /// Reservation true-ups of concurrent requests, coalesced into shared calls.
    true_ups: true_up::Batcher,
    /// What each serving thread's own connection to this store is known by ([`lanes`]).
    lanes: lanes::Key,
}

impl RedisStore {
    /// Builds the store without waiting for Redis: it connects in the background, so the
    /// gateway starts (and applies each rule's `on_store_error`) while Redis is down.
    ///
    /// Fails only on a configuration that can never work: no URL, or a URL that does not
    /// parse (the error never repeats the URL, which may hold a password).
    ///
    /// Connecting needs a Tokio runtime: it starts here when called inside one, otherwise on
    /// [`RedisStore::start`] or the first [`SharedStore::decide`].
    pub fn new(store: &Store) -> Result<Arc<RedisStore>, StoreError> {
        RedisStore::with_options(store, Options::default())
    }

    /// [`RedisStore::new`] with other [`Options`] (tests shorten the lease TTL and the
    /// breaker's cool-down).
    pub fn with_options(store: &Store, options: Options) -> Result<Arc<RedisStore>, StoreError> {
        let client = RedisClient::build(store.backend, &store.urls)
            .map_err(|e| StoreError::Failed(e.to_string()))?;
        Ok(RedisStore::from_parts(
            store,
            options,
            client.target,
            client.endpoint,
        ))
    }

    /// A store that could not be built (its URL(s) cannot be used): it stays down for the
    /// life of the process. Every call fails at once with `why`, so each global rule's
    /// `on_store_error` applies, `/readyz` and `floodgate_store_up` say the store is down, and
    /// no global rule silently turns into a per-instance limit at the full limit.
    pub fn broken(store: &Store, why: StoreError) -> Arc<RedisStore> {
        metrics().store_up.set(0);
        RedisStore::from_parts(
            store,
            Options::default(),
            Target::Broken(why.to_string().into()),
            "(unusable Redis URL)".to_string(),
        )
    }

    fn from_parts(
        store: &Store,
        options: Options,
        target: Target,
        endpoint: String,
    ) -> Arc<RedisStore> {
        let (conn, _) = watch::channel(None);
        let census = Arc::new(Census::default());
        let whole = Node::store(&endpoint, &options, &census);
        let store = Arc::new(RedisStore {
            inner: Arc::new(Inner {
                target,
                endpoint,
                key_prefix: store.key_prefix.clone(),
                options,
                conn,
                started: AtomicBool::new(false),
                connecting: AtomicBool::new(false),
                census,
                topology: ArcSwap::from_pointee(Topology::new(whole)),
                refresh: Arc::new(Notify::new()),
                refreshing: AtomicBool::new(false),
                policy: Mutex::new(None),
                true_ups: true_up::Batcher::default(),
                lanes: lanes::Key::default(),
            }),
        });
        store.start();
        store
    }

    /// Starts connecting in the background on the current Tokio runtime, if not already
    /// started; a no-op outside a runtime. Call it once the runtime that serves requests runs
    /// (e.g. from a background service, after Pingora daemonized: a thread or task started
    /// before `fork` would not survive it) so that the connection is ready before the first
    /// request. [`SharedStore::decide`] calls it too.
    pub fn start(&self) {
        if self.inner.started.load(Ordering::Acquire)
            || matches!(self.inner.target, Target::Broken(_))
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.inner.started.swap(true, Ordering::AcqRel) {
            return;
        }
        self.inner.connecting.store(true, Ordering::Release);
        runtime.spawn(connect_loop(Arc::downgrade(&self.inner)));
    }

    /// Whether the store is usable right now (for readiness checks): connected, the last
    /// call succeeded and the circuit breaker is closed; in a cluster, the last call to every
    /// master succeeded and none of their breakers holds calls off.
    pub fn is_up(&self) -> bool {
        self.inner
            .conn
            .borrow()
            .as_ref()
            .is_some_and(|c| !c.is_dead())
            && self.inner.census.all_well()
    }

    /// Whether a connection has been established (it may be failing now).
    pub fn is_connected(&self) -> bool {
        self.inner.conn.borrow().is_some()
    }

    /// The circuit breaker's state; in a cluster, the worst of the masters' breakers (open,
    /// else half-open, else closed).
    pub fn breaker_state(&self) -> BreakerState {
        self.inner.census.worst()
    }

    /// Each known cluster master (`host:port`) with its breaker's state, in slot order; empty
    /// for a standalone server and until the slot map is read.
    pub fn node_breakers(&self) -> Vec<(String, BreakerState)> {
        let topology = self.inner.topology.load();
        topology
            .nodes()
            .iter()
            .filter_map(|n| Some((n.endpoint()?.to_string(), n.breaker.state())))
            .collect()
    }

    /// Redis' `maxmemory-policy` as last read (in a cluster, the most dangerous among the
    /// masters); `None` until read, or when Redis forbids `CONFIG` (managed services).
    pub fn maxmemory_policy(&self) -> Option<String> {
        self.inner.policy.lock().clone()
    }

    /// Whether the last read `maxmemory-policy` lets Redis evict floodgate's keys
    /// (`allkeys-*`, and `volatile-*` too since every floodgate key has a TTL). An evicted
    /// counter is a reset limit.
    pub fn evicting_policy(&self) -> bool {
        self.maxmemory_policy().is_some_and(|p| probe::evicts(&p))
    }

    /// `host:port` of the configured URL(s), comma-separated: safe to log or show (no
    /// password).
    pub fn endpoint(&self) -> &str {
        &self.inner.endpoint
    }

    /// The Redis key holding `check`'s state:
    /// `<key_prefix><rule>:{<16 hex digits of the counter id>}`.
    pub fn redis_key(&self, check: &Check) -> String {
        self.inner.redis_key(check)
    }

    /// Test hook: [`SharedStore::decide`] as if Redis' clock read `now_us` (microseconds since
    /// the Unix epoch), so that tests compare the scripts with the Rust reference at chosen
    /// instants. Keys then keep an hour of extra TTL, since Redis expires them in real time.
    /// The gateway never calls this.
    #[doc(hidden)]
    pub async fn decide_at(
        &self,
        checks: &[Check],
        lease: u64,
        timeout: Duration,
        now_us: u64,
    ) -> Result<Vec<Decision>, StoreError> {
        self.decide_exact(checks, lease, timeout, Some(now_us))
            .await
    }

    /// Exact checks only (no lease wanted), at Redis' clock or at `now_us`.
    async fn decide_exact(
        &self,
        checks: &[Check],
        lease: u64,
        timeout: Duration,
        now_us: Option<u64>,
    ) -> Result<Vec<Decision>, StoreError> {
        let wants = vec![0; checks.len()];
        let call = coalesce::CallOf {
            lease,
            timeout,
            instances: 1,
        };
        let ds = self.decide_inner(checks, &wants, call, now_us).await?;
        Ok(ds.into_iter().map(|(d, _)| d).collect())
    }

    /// Decides `checks` (each wanting `wants[i]` leased permits) as `call` says, at Redis'
    /// clock or at `now_us`: a lone exact check of a counter concurrent requests share joins
    /// their call ([`coalesce`]); the others make their own.
    async fn decide_inner(
        &self,
        checks: &[Check],
        wants: &[u64],
        call: coalesce::CallOf,
        now_us: Option<u64>,
    ) -> Result<Vec<(Decision, Grant)>, StoreError> {
        if checks.is_empty() {
            return Ok(Vec::new());
        }
        self.start();
        let inner = &self.inner;
        if let ([check], [0], None) = (checks, wants, now_us) {
            if coalesce::eligible(check) {
                return inner.decide_coalesced(check, call).await.map(|a| vec![a]);
            }
        }
        inner.decide_now(checks, wants, call, now_us).await
    }
}

impl Inner {
    /// One check of a counter that concurrent requests of this thread may share a call with
    /// (see [`coalesce`]).
    async fn decide_coalesced(
        self: &Arc<Self>,
        check: &Check,
        call: coalesce::CallOf,
    ) -> coalesce::Answer {
        match coalesce::join(self, check, call) {
            coalesce::Join::Lead(leading) => {
                let answer = self.decide_one(check, call).await;
                leading.finish(&answer);
                answer
            }
            coalesce::Join::Wait(waiting) => {
                // The call in flight, then the batch's own: each within the timeout.
                let deadline = Instant::now() + call.timeout * coalesce::WAIT_TIMEOUTS;
                match waiting.answer(deadline).await {
                    // A failed batch call was counted where it failed.
                    coalesce::Waited::Decided(answer) => answer,
                    coalesce::Waited::TimedOut => {
                        metrics().store_errors.with_label_values(&["timeout"]).inc();
                        Err(StoreError::Timeout)
                    }
                    // Refused whole: the store answers, so the request asks with a timeout of
                    // its own.
                    coalesce::Waited::Alone => self.decide_one(check, call).await,
                }
            }
            coalesce::Join::Alone => self.decide_one(check, call).await,
        }
    }

    /// One exact check, in a call of its own.
    async fn decide_one(
        self: &Arc<Self>,
        check: &Check,
        call: coalesce::CallOf,
    ) -> coalesce::Answer {
        let mut answers = self
            .decide_now(std::slice::from_ref(check), &[0], call, None)
            .await?;
        answers
            .pop()
            .ok_or_else(|| StoreError::Failed("the store answered no decision".into()))
    }

    /// Decides `checks` now, one script call per cluster slot (see [`SharedStore::decide`]).
    async fn decide_now(
        self: &Arc<Self>,
        checks: &[Check],
        wants: &[u64],
        call: coalesce::CallOf,
        now_us: Option<u64>,
    ) -> Result<Vec<(Decision, Grant)>, StoreError> {
        let coalesce::CallOf {
            lease,
            timeout,
            instances,
        } = call;
        if let Target::Broken(why) = &self.target {
            // Never built: down for good, and every decision says so.
            metrics().store_errors.with_label_values(&["error"]).inc();
            metrics().store_up.set(0);
            return Err(StoreError::Failed(why.to_string()));
        }
        let keys: Vec<String> = checks.iter().map(|c| self.redis_key(c)).collect();
        let groups = self.groups(&keys);
        // Each call is guarded by the breaker of the node it goes to: one ticket per node,
        // all or none, so that a request touching an open node charges nothing anywhere.
        let topology = self.topology.load_full();
        let (nodes, guard_of) = self.guards(&topology, &keys, &groups);
        let mut tickets = Vec::with_capacity(nodes.len());
        for node in &nodes {
            let Some(ticket) = node.breaker.try_call() else {
                metrics()
                    .store_errors
                    .with_label_values(&["circuit_open"])
                    .inc();
                return Err(StoreError::CircuitOpen);
            };
            tickets.push(ticket);
        }
        let deadline = Instant::now() + timeout;
        let outcomes = self
            .run(
                &keys, &groups, checks, wants, instances, lease, now_us, deadline,
            )
            .await;
        if let Some(error) = self.settle_tickets(&nodes, &guard_of, tickets, &outcomes) {
            let kind = if matches!(error, StoreError::Timeout) {
                "timeout"
            } else {
                "error"
            };
            metrics().store_errors.with_label_values(&[kind]).inc();
            // The calls may have taken slots before they failed or after we stopped waiting.
            self.spawn_release(checks, lease);
            return Err(error);
        }
        let mut decisions: Vec<Option<(Decision, Grant)>> = vec![None; checks.len()];
        let mut some_rejected = false;
        let mut some_admitted = false;
        for (group, outcome) in groups.iter().zip(outcomes) {
            // Every call succeeded (a failure returned above).
            let Ok(answers) = outcome.answers else {
                continue;
            };
            let all = answers.iter().all(|(d, _)| d.allowed);
            for (&i, answer) in group.iter().zip(answers) {
                decisions[i] = Some(answer);
            }
            some_admitted |= all;
            some_rejected |= !all;
        }
        if some_admitted && some_rejected {
            // Cluster: another slot rejected; slots this request took elsewhere go back.
            self.spawn_release(checks, lease);
        }
        Ok(decisions.into_iter().flatten().collect())
    }

    /// The breaker guarding each call of `groups` (`guard_of[g]` indexes `nodes`): a cluster
    /// call by the master of its hash slot, a standalone one by the one node.
    fn guards<'t>(
        &self,
        topology: &'t Topology,
        keys: &[String],
        groups: &[Vec<usize>],
    ) -> (Vec<&'t Arc<Node>>, Vec<usize>) {
        let clustered = matches!(self.target, Target::Cluster(..));
        let mut nodes: Vec<&Arc<Node>> = Vec::with_capacity(1);
        let guard_of = groups
            .iter()
            .map(|g| {
                // Standalone, the one node guards everything (no slot has a master).
                let slot = if clustered {
                    cluster::slot(&keys[g[0]])
                } else {
                    0
                };
                let node = topology.guard(slot);
                match nodes.iter().position(|n| Arc::ptr_eq(n, node)) {
                    Some(i) => i,
                    None => {
                        nodes.push(node);
                        nodes.len() - 1
                    }
                }
            })
            .collect();
        (nodes, guard_of)
    }

    /// Settles each node's breaker ticket by its own calls' outcomes (reconnecting or looking
    /// at the topology again where a failure calls for it); returns the error the request
    /// fails with, if any call failed (a timeout wins: it is what the client waited for).
    fn settle_tickets(
        self: &Arc<Self>,
        nodes: &[&Arc<Node>],
        guard_of: &[usize],
        tickets: Vec<breaker::Ticket<'_>>,
        outcomes: &[Outcome],
    ) -> Option<StoreError> {
        let mut error = None;
        for (i, ticket) in tickets.into_iter().enumerate() {
            let mine = || outcomes.iter().zip(guard_of).filter(|(_, &g)| g == i);
            let failed = mine().find_map(|(o, _)| o.answers.as_ref().err());
            let node = nodes[i];
            if failed.is_some() && mine().all(|(o, _)| o.answers.is_ok() || o.collateral) {
                // Failed only because another call lost its reply on the same connection:
                // says nothing of this node's health (the ticket is given back unsettled).
                drop(ticket);
                self.reconnect_if_broken();
                error = error.or(failed.cloned());
                continue;
            }
            match failed {
                None => {
                    ticket.success();
                    if node.mark(true) {
                        // Back after failures: possibly a restarted Redis with another
                        // configuration.
                        self.spawn_policy_check();
                    }
                }
                Some(e) => {
                    let opened = ticket.failure();
                    node.mark(false);
                    if opened {
                        // A failover may have moved its slots: look again at once.
                        self.refresh.notify_one();
                    }
                    // A call that timed out poisoned its connection (a black-holed peer never
                    // fails it by itself): the shared one is rebuilt in the background, a
                    // thread's own when the thread next calls.
                    self.reconnect_if_broken();
                    if error.is_none() || matches!(e, StoreError::Timeout) {
                        error = Some(e.clone());
                    }
                }
            }
        }
        error
    }
}

/// Runs `cmd`, a call of a script that answers `{tag, count}` (release, renew, lease_return,
/// true_up), with a tag of its own appended as the last argument: a reply with another tag is
/// not this call's answer, and poisons `conn` (see [`resp`]'s invariant).
/// The call of decide.lua for the checks of `group` (indices into `keys`, `checks` and
/// `params`), and the tag of its own that the script's reply starts with: a reply that is not
/// this call's is never taken for its answer (see `resp`'s invariant).
fn decide_call(
    group: &[usize],
    keys: &[String],
    checks: &[Check],
    params: &[Params],
    lease: &str,
    lease_ttl_us: u64,
    now: &str,
) -> (redis::Cmd, [u8; 8]) {
    // Keys, lease, TTL, now, tag, checks and perhaps their bans: sized up front, so that
    // building the call costs two allocations, not a string of regrowths.
    let args = 4 + group.len() * 3;
    let bytes: usize = group
        .iter()
        .map(|&i| keys[i].len() + script::PACKED_BYTES + 32 + 20)
        .sum::<usize>()
        + lease.len()
        + now.len()
        + 20
        + 8;
    let mut cmd = DECIDE.evalsha_sized(group.len(), args, bytes);
    for &i in group {
        cmd.arg(keys[i].as_str());
    }
    let tag = fastrand::u64(..).to_le_bytes();
    cmd.arg(lease).arg(lease_ttl_us).arg(now).arg(&tag[..]);
    for &i in group {
        cmd.arg(&params[i].packed()[..]);
    }
    // block_for, per check, only when one of the group blocks (see decide.lua).
    if group
        .iter()
        .any(|&i| !checks[i].limit.block_for().is_zero())
    {
        for &i in group {
            let ms = checks[i].limit.block_for().as_millis();
            cmd.arg(u64::try_from(ms).unwrap_or(u64::MAX).min(MAX_EXACT));
        }
    }
    (cmd, tag)
}

async fn eval_count(conn: &Conn, script: &Lua, mut cmd: redis::Cmd) -> redis::RedisResult<i64> {
    let tag = fastrand::u64(..).to_le_bytes();
    cmd.arg(&tag[..]);
    let (echo, count): (Vec<u8>, i64) = conn.eval(script, &cmd).await?;
    if echo != tag {
        let _ = conn.poison("a script's reply did not answer its call");
        return Err((
            redis::ErrorKind::Io,
            "Redis connection",
            "a reply that does not answer its call".to_string(),
        )
            .into());
    }
    Ok(count)
}

/// One decide call's result, and whether it failed only because another call poisoned its
/// connection ([`Conn::poison`]): such a failure is not counted against the node's breaker.
struct Outcome {
    answers: Result<Vec<(Decision, Grant)>, StoreError>,
    collateral: bool,
}

impl Outcome {
    fn of(answers: Result<Vec<(Decision, Grant)>, StoreError>) -> Outcome {
        Outcome {
            answers,
            collateral: false,
        }
    }
}

/// The sum of what batched best-effort calls (lease returns, reservation true-ups) say the
/// store applied, `None` when they ran out of time ([`Inner::best_effort`]). What fails or
/// times out stays charged, which `what` says in the debug log.
fn applied<E: std::fmt::Display>(results: Option<Vec<Result<i64, E>>>, what: &'static str) -> u64 {
    match results {
        Some(results) => results
            .into_iter()
            .map(|r| match r {
                Ok(n) => u64::try_from(n).unwrap_or(0),
                Err(e) => {
                    tracing::debug!(error = %e, call = what, "store call failed");
                    0
                }
            })
            .sum(),
        None => {
            tracing::debug!(call = what, "store call timed out");
            0
        }
    }
}

/// The engine's face of the store.
#[async_trait]
impl SharedStore for RedisStore {
    /// Decides `checks` atomically (all charged or none) in one round trip (per cluster slot),
    /// giving up after `timeout`. `lease` identifies this request's concurrency slots (and
    /// names its sliding-log entries), so it must be unique per request (a random `u64`); pass
    /// the same value to [`SharedStore::release`].
    ///
    /// Cluster: checks whose keys hash to different slots are decided by concurrent calls,
    /// each atomic. When one call rejects and another admitted, the admitted one stays charged
    /// (its concurrency slots are given back at once); rules keyed on the same parts share a
    /// slot and never see this.
    ///
    /// On a timeout or error, concurrency slots the call may still have taken are released in
    /// the background (they would expire with their lease anyway).
    async fn decide(
        &self,
        checks: &[Check],
        lease: u64,
        timeout: Duration,
    ) -> Result<Vec<Decision>, StoreError> {
        self.decide_exact(checks, lease, timeout, None).await
    }

    /// [`SharedStore::decide`] with quota leases, in the same single call (per cluster slot):
    /// the script grants each leased check its cost plus a fair share of what remains (see
    /// `lua/decide.lua`).
    async fn decide_leased(
        &self,
        checks: &[Check],
        wants: &[u64],
        instances: u64,
        lease: u64,
        timeout: Duration,
    ) -> Result<Vec<(Decision, Grant)>, StoreError> {
        let call = coalesce::CallOf {
            lease,
            timeout,
            instances,
        };
        self.decide_inner(checks, wants, call, None).await
    }

    /// Gives back unspent lease permits: one `EVALSHA` of `lua/lease_return.lua` (per cluster
    /// slot) for all of them, bounded by [`RELEASE_TIMEOUT`].
    async fn give_back(&self, returns: &[Return]) -> u64 {
        self.inner.give_back(returns).await
    }

    /// Trues up reservations: one `EVALSHA` of `lua/true_up.lua` (per cluster slot) for all
    /// of them and those of the requests settling at the same time (coalesced, see
    /// `true_up.rs`), each call bounded by [`RELEASE_TIMEOUT`].
    async fn true_up(&self, ups: &[crate::limiter::store::TrueUp]) -> u64 {
        self.inner.true_up_batched(ups).await
    }

    /// Renews the concurrency slots `lease` holds: `lua/renew.lua`, bounded by
    /// [`RELEASE_TIMEOUT`].
    async fn renew(&self, checks: &[Check], lease: u64) {
        self.inner.renew(checks, lease).await;
    }

    /// Releases the concurrency slots that `lease` took for `checks` (other checks are
    /// ignored). Best effort, bounded by [`RELEASE_TIMEOUT`]: a slot that cannot be released
    /// expires with its lease ([`LEASE_TTL`]).
    async fn release(&self, checks: &[Check], lease: u64) {
        self.inner.release(checks, lease).await;
    }

    fn slot_ttl(&self) -> Option<Duration> {
        Some(self.inner.options.lease_ttl)
    }

    /// The usage API: one `lua/usage.lua` call on the counter's key.
    async fn usage(
        &self,
        check: &Check,
        change: UsageChange,
        call: UsageCall<'_>,
    ) -> Result<Changed, StoreError> {
        self.inner.usage(check, change, call).await
    }

    /// Deletes the key's block key (`<key>:b`, see `lua/decide.lua`).
    async fn lift_ban(&self, check: &Check, timeout: Duration) -> Result<bool, StoreError> {
        self.inner.lift_ban(check, timeout).await
    }

    /// Subscribes to the store's reset channel (see `resets`).
    async fn hear_resets(&self, heard: &(dyn Fn(HeardReset) + Send + Sync)) {
        self.inner.hear_resets(heard).await
    }

    /// Connects, reads a cluster's slot map and loads the scripts (see `warm`).
    async fn warm_up(&self, deadline: Duration) -> bool {
        RedisStore::warm_up(self, deadline).await
    }

    fn status(&self) -> StoreStatus {
        StoreStatus {
            up: self.is_up(),
            connected: self.is_connected(),
            endpoint: self.endpoint().to_string(),
            drops_counters: self.evicting_policy(),
        }
    }

    fn is_up(&self) -> bool {
        RedisStore::is_up(self)
    }
}

impl Inner {
    fn redis_key(&self, check: &Check) -> String {
        let mut key = String::with_capacity(self.key_prefix.len() + check.rule.len() + 19);
        key.push_str(&self.key_prefix);
        key.push_str(&check.rule);
        key.push_str(":{");
        push_hex16(&mut key, check.counter);
        key.push('}');
        key
    }

    /// Indexes of `keys` grouped by what one script call may touch (see [`cluster::groups`]).
    fn groups(&self, keys: &[String]) -> Vec<Vec<usize>> {
        cluster::groups(matches!(self.target, Target::Cluster(..)), keys)
    }

    /// The connection a call goes over: the thread's own once the shared one has been up
    /// (the warm-up has loaded the scripts through it), so that a call does not cross threads
    /// ([`lanes`]); else the shared one. A shared connection that is dead (ours, poisoned or
    /// broken) is never handed out: the caller waits for its successor, which this starts if
    /// need be (the caller bounds the wait with its timeout), as it waits for the first one.
    async fn connection(self: &Arc<Self>) -> Result<Conn, StoreError> {
        if self.conn.borrow().is_some() {
            if let Some(own) = lanes::own(&self.lanes, &self.target) {
                return Ok(own);
            }
        }
        self.live_shared().await
    }

    /// The shared connection once it is up and not dead: the current one, or the first one,
    /// or the successor of a dead one (started here if need be). The caller bounds the wait.
    async fn live_shared(self: &Arc<Self>) -> Result<Conn, StoreError> {
        let dead = match self.conn.borrow().as_ref() {
            Some(conn) if !conn.is_dead() => return Ok(conn.clone()),
            Some(_) => true,
            None => false,
        };
        // Outside the borrow above: starting the successor reads the watch again.
        if dead {
            self.reconnect_if_broken();
        }
        let mut rx = self.conn.subscribe();
        let conn = rx
            .wait_for(|c| c.as_ref().is_some_and(|c| !c.is_dead()))
            .await
            .map_err(|_| StoreError::Failed("store closed".into()))?
            .clone();
        conn.ok_or_else(|| StoreError::Failed("not connected".into()))
    }

    /// Runs the decide script, one call per group of `keys` (see [`Inner::groups`]), all
    /// within `deadline`: each group's decisions and grants, or why its call failed.
    #[allow(clippy::too_many_arguments)]
    async fn run(
        self: &Arc<Self>,
        keys: &[String],
        groups: &[Vec<usize>],
        checks: &[Check],
        wants: &[u64],
        instances: u64,
        lease: u64,
        now_us: Option<u64>,
        deadline: Instant,
    ) -> Vec<Outcome> {
        let conn = match tokio::time::timeout_at(deadline, self.connection()).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return groups.iter().map(|_| Outcome::of(Err(e.clone()))).collect(),
            Err(_) => {
                return groups
                    .iter()
                    .map(|_| Outcome::of(Err(StoreError::Timeout)))
                    .collect()
            }
        };
        let params: Vec<Params> = checks
            .iter()
            .zip(wants.iter().chain(std::iter::repeat(&0)))
            .map(|(c, &w)| match now_us {
                // An injected time is the gateway's too: calendar periods are around it.
                Some(us) => Params::leasing(c, w, instances).around(c, us.saturating_mul(1000)),
                None => Params::leasing(c, w, instances),
            })
            .collect();
        let lease = hex16(lease);
        let lease_ttl_us = self.options.lease_ttl_us();
        let now = now_us
            .map(|n| n.min(MAX_EXACT).to_string())
            .unwrap_or_default();
        let call = |group: &[usize]| {
            let (cmd, tag) = decide_call(group, keys, checks, &params, &lease, lease_ttl_us, &now);
            let conn = conn.clone();
            let params = &params;
            let group = group.to_vec();
            async move {
                let reply = match conn
                    .until(deadline, conn.eval::<Vec<u8>>(&DECIDE, &cmd))
                    .await
                {
                    None => return Outcome::of(Err(StoreError::Timeout)),
                    Some(Err(e)) => {
                        return Outcome {
                            answers: Err(StoreError::Failed(e.to_string())),
                            collateral: conn.was_poisoned(),
                        }
                    }
                    Some(Ok(reply)) => reply,
                };
                let Some(numbers) = reply
                    .strip_prefix(&tag[..])
                    .filter(|n| n.len() == group.len() * REPLY_BYTES)
                else {
                    // Another call's reply (one went missing before it): nothing on this
                    // connection can be trusted any more.
                    // The first call to see it counts against the breaker; the replies the
                    // reader had already handed out behind it are collateral.
                    let first = conn.poison("a decide reply did not answer its call");
                    return Outcome {
                        answers: Err(StoreError::Failed(format!(
                            "the store's reply ({} bytes) does not answer this call of {} checks",
                            reply.len(),
                            group.len()
                        ))),
                        collateral: !first,
                    };
                };
                let numbers: Vec<_> = numbers
                    .chunks_exact(REPLY_BYTES)
                    .map(unpack_reply)
                    .collect();
                let all = numbers.iter().all(|n| n[0] == 1);
                Outcome::of(Ok(group
                    .iter()
                    .zip(&numbers)
                    .map(|(&i, n)| (params[i].decision(n), grant(n, all)))
                    .collect()))
            }
        };
        match groups {
            [group] => vec![call(group).await],
            _ => futures::future::join_all(groups.iter().map(|g| call(g))).await,
        }
    }

    /// Reads `maxmemory-policy` again in the background (a node came back).
    fn spawn_policy_check(self: &Arc<Self>) {
        if let Some(conn) = self.conn.borrow().clone() {
            tokio::spawn(probe::check_policy(Arc::downgrade(self), conn));
        }
    }

    /// Reads the cluster's slot map again on the current connection (see `topology`).
    async fn refresh_topology(&self) {
        let Some(conn) = self.conn.borrow().clone() else {
            return;
        };
        self.refresh_topology_with(&conn).await;
    }

    /// Reads the cluster's slot map on `conn`, from a known master or else a seed, and makes
    /// each master's node guard its slots. Kept as it was when no node answers.
    async fn refresh_topology_with(&self, conn: &Conn) {
        let current = self.topology.load_full();
        // Masters that answer first: asking one that fails costs a timeout (and, for one that
        // answers garbage, connections).
        let mut masters: Vec<&Arc<Node>> = current.nodes().iter().collect();
        masters.sort_by_key(|n| n.breaker.state() != BreakerState::Closed);
        let candidates: Vec<String> = masters
            .iter()
            .filter_map(|n| n.endpoint().map(str::to_string))
            .chain(self.endpoint.split(',').map(str::to_string))
            .collect();
        let Some(ranges) = topology::read(conn, &candidates).await else {
            tracing::debug!(redis = %self.endpoint, "cannot read the cluster's slot map; keeping the last one");
            return;
        };
        let next = current.next(ranges, |endpoint| match endpoint {
            Some(e) => Node::master(e, &self.options, &self.census),
            None => Node::store(&self.endpoint, &self.options, &self.census),
        });
        self.topology.store(Arc::new(next));
    }

    /// Starts reading the slot map every [`topology::REFRESH_EVERY`], once.
    fn keep_topology_fresh(self: &Arc<Self>) {
        if !self.refreshing.swap(true, Ordering::AcqRel) {
            tokio::spawn(topology::refresh_loop(Arc::downgrade(self)));
        }
    }

    /// Starts a fresh connection in the background when ours broke: floodgate's own
    /// pipelined connection does not reconnect by itself. Called after any failed call.
    fn reconnect_if_broken(self: &Arc<Self>) {
        if self.conn.borrow().as_ref().is_some_and(Conn::is_broken) {
            self.spawn_connect();
        }
    }

    /// Starts a fresh connection in the background unless one is being made.
    fn spawn_connect(self: &Arc<Self>) {
        if self.connecting.swap(true, Ordering::AcqRel) {
            return;
        }
        tokio::spawn(connect_loop(Arc::downgrade(self)));
    }

    /// Releases `checks`' concurrency slots of `lease` in the background, if any.
    fn spawn_release(self: &Arc<Self>, checks: &[Check], lease: u64) {
        let held: Vec<Check> = checks.iter().filter(|c| holds_slot(c)).cloned().collect();
        if held.is_empty() {
            return;
        }
        let inner = self.clone();
        tokio::spawn(async move { inner.release(&held, lease).await });
    }

    /// The shared connection for a best-effort call (a release, a renewal, a lease return, a
    /// true-up): the current one, or, when it is dead, its successor if it comes before
    /// `deadline` (this starts it). `None` when none comes in time, or when the store never
    /// connected (so nothing can have been taken through it).
    async fn shared_by(self: &Arc<Self>, deadline: Instant) -> Option<Conn> {
        if self.conn.borrow().is_none() {
            return None;
        }
        tokio::time::timeout_at(deadline, self.live_shared())
            .await
            .ok()?
            .ok()
    }

    /// Runs best-effort `calls` on `conn` (from [`Inner::shared_by`]) until `deadline`: calls
    /// past it poison `conn` ([`Conn::until`]), whose successor is then started at once rather
    /// than by the next call. `None` when the deadline passed.
    async fn best_effort<F: std::future::Future>(
        self: &Arc<Self>,
        conn: &Conn,
        deadline: Instant,
        calls: impl Iterator<Item = F>,
    ) -> Option<Vec<F::Output>> {
        let done = conn.until(deadline, futures::future::join_all(calls)).await;
        self.reconnect_if_broken();
        done
    }

    async fn give_back(self: &Arc<Self>, returns: &[Return]) -> u64 {
        let returns: Vec<&Return> = returns.iter().filter(|r| r.permits > 0).collect();
        if returns.is_empty() {
            return 0;
        }
        let deadline = Instant::now() + RELEASE_TIMEOUT;
        let Some(conn) = self.shared_by(deadline).await else {
            return 0;
        };
        let keys: Vec<String> = returns.iter().map(|r| self.redis_key(&r.check)).collect();
        let calls = self.groups(&keys).into_iter().map(|group| {
            let mut cmd = LEASE_RETURN.evalsha(group.len());
            for &i in &group {
                cmd.arg(keys[i].as_str());
            }
            for &i in &group {
                let r = returns[i];
                cmd.arg(
                    &Params::of(&r.check).return_packed(
                        r.permits,
                        r.window_end_us,
                        r.charged_at_us,
                    )[..],
                );
            }
            let conn = conn.clone();
            async move { eval_count(&conn, &LEASE_RETURN, cmd).await }
        });
        applied(
            self.best_effort(&conn, deadline, calls).await,
            "lease return; the permits stay charged until their window ends",
        )
    }

    async fn renew(self: &Arc<Self>, checks: &[Check], lease: u64) {
        let ttl_us = self.options.lease_ttl_us();
        if let Some(Err(_)) = self.slot_calls(&RENEW, checks, lease, Some(ttl_us)).await {
            tracing::debug!("concurrency slot renewal timed out; it is retried");
        }
    }

    async fn release(self: &Arc<Self>, checks: &[Check], lease: u64) {
        match self.slot_calls(&RELEASE, checks, lease, None).await {
            Some(Ok(results)) => {
                for r in results {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "concurrency release failed; the lease will expire");
                    }
                }
            }
            Some(Err(_)) => {
                tracing::debug!("concurrency release timed out; the lease will expire");
            }
            None => {}
        }
    }

    /// Runs `script` (release.lua or renew.lua) on the Redis keys of the checks that hold a
    /// concurrency slot, one call per cluster slot group, bounded by [`RELEASE_TIMEOUT`]:
    /// KEYS are the keys; ARGV the lease id, `ttl_us` when given, then each check's cost.
    /// `None` when there is nothing to do: no slot held, or not connected yet (so nothing can
    /// have been acquired through this store).
    async fn slot_calls(
        self: &Arc<Self>,
        script: &'static Lua,
        checks: &[Check],
        lease: u64,
        ttl_us: Option<u64>,
    ) -> Option<Result<Vec<redis::RedisResult<i64>>, ()>> {
        let held: Vec<&Check> = checks.iter().filter(|c| holds_slot(c)).collect();
        if held.is_empty() {
            return None;
        }
        let deadline = Instant::now() + RELEASE_TIMEOUT;
        let Some(conn) = self.shared_by(deadline).await else {
            return Some(Err(()));
        };
        let keys: Vec<String> = held.iter().map(|c| self.redis_key(c)).collect();
        let lease = hex16(lease);
        let calls = self.groups(&keys).into_iter().map(|group| {
            let mut cmd = script.evalsha(group.len());
            for &i in &group {
                cmd.arg(keys[i].as_str());
            }
            cmd.arg(lease.as_str());
            if let Some(ttl) = ttl_us {
                cmd.arg(ttl);
            }
            for &i in &group {
                cmd.arg(held[i].cost);
            }
            let conn = conn.clone();
            async move { eval_count(&conn, script, cmd).await }
        });
        Some(self.best_effort(&conn, deadline, calls).await.ok_or(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::settings::Backend;

    #[test]
    fn urls_with_passwords_never_show_in_errors() {
        let store = Store {
            backend: Backend::Redis,
            urls: vec!["http://user:s3cret@host:1".into()],
            timeout: Duration::from_millis(20),
            key_prefix: "p:".into(),
            instances: 1,
            max_keys: 10,
            max_bans: crate::limiter::settings::DEFAULT_MAX_BANS,
            connect_timeout: crate::limiter::settings::DEFAULT_CONNECT_TIMEOUT,
        };
        let err = RedisStore::new(&store).err().expect("not a Redis URL");
        assert!(!err.to_string().contains("s3cret"), "{err}");
    }
}
