//! The shared store: Redis (standalone or Cluster), deciding all global rules of a request in
//! one atomic Lua call.
//!
//! # Scripts
//! `lua/` holds one file per algorithm, each defining one local function that mirrors its
//! counterpart in [`super::algorithm`] decision for decision (same rounding, same
//! `remaining`, `reset`, `retry_after` and `delay`), helpers (`common.lua`, `gcra.lua`), and
//! `decide.lua`, which decides every check of a request against the stored state and charges
//! all of them only if all admit. They are concatenated at compile time into ONE script
//! ([`DECIDE_LUA`], one SHA) and run with `EVALSHA`; `release.lua` gives concurrency slots back.
//! A `NOSCRIPT` answer (after `SCRIPT FLUSH` or a Redis restart) is met with `SCRIPT LOAD` (to
//! every node, in a cluster) and the same `EVALSHA` again ([`Conn::eval`]), so no caller ever
//! sees it. Time comes from Redis `TIME` inside the script, never from a gateway
//! clock, so gateways whose clocks disagree still share exact limits.
//!
//! # Units
//! Lua numbers are doubles, exact below 2^53. Instants are therefore kept in **microseconds**
//! since the epoch (the resolution of `TIME`), durations in nanoseconds as differences only;
//! see `lua/common.lua`. Windows are whole microseconds (config windows are whole
//! milliseconds; a finer window is rounded up to the next microsecond). Numbers passed to the
//! scripts are capped at 2^53 - 1, which only absurd rules reach.
//!
//! # Keys
//! `<key_prefix><rule>:{<16 hex digits of Check::key>}`. The key digest is the hash tag, so in
//! a cluster the checks of rules keyed on the same parts share a slot and are decided in one
//! call; network input never reaches a key verbatim (it is hashed) and keys have bounded
//! length. Every key carries a TTL that ends when its state stops mattering (window end, bucket
//! refilled, last log entry or lease expired), and the sliding log's sorted set never holds
//! more entries than the rule's limit.
//!
//! # Round trips
//! Standalone: one `EVALSHA` per request whatever the number of rules, on one multiplexed,
//! auto-reconnecting connection shared by every request (requests pipeline on it). Cluster:
//! one `EVALSHA` per hash slot among the request's keys, issued concurrently; each call is
//! atomic, but a request whose keys span slots is not atomic across them (see
//! [`RedisStore::decide`]).
//!
//! # Failures
//! [`RedisStore::new`] never blocks and never fails because Redis is down: it connects in the
//! background and keeps retrying. A decision gives up after its `timeout`
//! ([`StoreError::Timeout`]); after [`breaker::FAILURE_THRESHOLD`] consecutive failures the
//! circuit breaker fails calls fast for [`breaker::COOL_DOWN`], then probes (see
//! [`super::breaker`]). On connect (and on recovery after failures) the store reads Redis'
//! `maxmemory-policy` and warns loudly when it lets Redis evict floodgate's keys.
//!
//! [`breaker::FAILURE_THRESHOLD`]: super::breaker::FAILURE_THRESHOLD
//! [`breaker::COOL_DOWN`]: super::breaker::COOL_DOWN

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, Slot};
use redis::{
    Cmd, ConnectionAddr, ErrorKind, FromRedisValue, IntoConnectionInfo, RedisResult, Script,
    ServerErrorKind, Value,
};
use tokio::sync::watch;

use super::algorithm::MAX_SLIDING_LOG_LIMIT;
use super::breaker::{Breaker, BreakerState, COOL_DOWN, FAILURE_THRESHOLD};
use super::resp::RespConn;
use super::{Algorithm, Check, Decision, LeakyMode};
use crate::config::{Backend, Store};
use crate::metrics::metrics;
use crate::text::push_hex16;

/// The multi-rule decision script: helpers, every algorithm, then `decide.lua`, as one script
/// (one SHA). See `lua/decide.lua` for its arguments and reply.
pub const DECIDE_LUA: &str = concat!(
    include_str!("../../lua/common.lua"),
    "\n",
    include_str!("../../lua/gcra.lua"),
    "\n",
    include_str!("../../lua/fixed_window.lua"),
    "\n",
    include_str!("../../lua/sliding_window_log.lua"),
    "\n",
    include_str!("../../lua/sliding_window_counter.lua"),
    "\n",
    include_str!("../../lua/token_bucket.lua"),
    "\n",
    include_str!("../../lua/leaky_bucket.lua"),
    "\n",
    include_str!("../../lua/concurrency.lua"),
    "\n",
    include_str!("../../lua/decide.lua"),
);

/// The concurrency release script (`lua/release.lua`).
pub const RELEASE_LUA: &str = include_str!("../../lua/release.lua");

static DECIDE: LazyLock<Lua> = LazyLock::new(|| Lua::new(DECIDE_LUA));
static RELEASE: LazyLock<Lua> = LazyLock::new(|| Lua::new(RELEASE_LUA));

/// A script as the store runs it: its SHA, computed once, for `EVALSHA`, and its source for
/// `SCRIPT LOAD` when Redis does not know it.
struct Lua {
    source: &'static str,
    sha: String,
}

impl Lua {
    fn new(source: &'static str) -> Lua {
        Lua {
            source,
            sha: Script::new(source).get_hash().to_string(),
        }
    }

    /// `EVALSHA <sha> <keys>`, to which the caller appends the keys, then the arguments.
    /// Written straight into one command buffer: redis-rs' `ScriptInvocation` first copies
    /// every key and argument into a vector of its own, a dozen allocations per request.
    fn evalsha(&self, keys: usize) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.sha).arg(keys);
        cmd
    }

    /// `SCRIPT LOAD <source>` (redis-rs' cluster routing sends it to every node).
    fn load(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(self.source);
        cmd
    }
}

/// How long a global concurrency slot is held at most when its request never releases it (the
/// gateway died mid-request, or the release could not reach Redis). Longer than any sane
/// request, so that a live request never loses its slot; short enough that a crashed
/// gateway's slots come back within minutes. A request held longer than this (a very long
/// download) stops counting after it.
pub const LEASE_TTL: Duration = Duration::from_secs(300);

/// Budget of one connection attempt (TCP, TLS, AUTH), separate from the decision timeout.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Budget of a release: it runs off the request path, and a release that is lost holds a slot
/// until its lease expires, so it may wait longer than a decision.
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(1);

/// Backoff between background connection attempts while Redis cannot be reached.
const RECONNECT_MIN: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(1);

/// Budget for reading `maxmemory-policy`.
const POLICY_TIMEOUT: Duration = Duration::from_secs(2);

/// Lua numbers are doubles: integers are exact below 2^53.
const MAX_EXACT: u64 = (1 << 53) - 1;

/// Numbers per check in the decide script's reply.
const REPLY_FIELDS: usize = 5;

/// Bytes per check in the decide script's reply: the numbers are little-endian doubles.
const REPLY_BYTES: usize = REPLY_FIELDS * 8;

/// Why the store could not decide.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// No answer within `store.timeout`.
    #[error("store timed out")]
    Timeout,
    /// The circuit breaker is open: the store is not being called for a cool-down.
    #[error("store circuit breaker open")]
    CircuitOpen,
    /// Redis answered with an error, or the connection failed.
    #[error("store error: {0}")]
    Redis(String),
}

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
    breaker: Breaker,
    /// The last call succeeded (false after a failure, until the next success).
    up: AtomicBool,
    /// The last `maxmemory-policy` read (the most dangerous one, in a cluster).
    policy: Mutex<Option<String>>,
}

/// Where to connect.
#[derive(Clone)]
enum Target {
    Single(Box<redis::Client>),
    Cluster(Box<ClusterClient>),
    /// The URL(s) could not be turned into a client: why (never the URL itself).
    Broken(Arc<str>),
}

/// A Redis URL (or set of cluster seeds) the store cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct UrlError {
    /// Which URL is at fault (0-based, in `store.urls`), or `None` when it is the set of URLs
    /// (cluster seeds that disagree) or the backend.
    pub index: Option<usize>,
    /// What is wrong, without the URL (which may hold a password).
    pub message: String,
}

/// What the store connects with, built from `store.url(s)`. Validation builds one too and
/// throws it away, so that `floodgate check` accepts exactly the URLs the store can use: the
/// same parser (redis-rs `IntoConnectionInfo`) and the same client construction.
pub struct RedisClient {
    target: Target,
    endpoint: String,
}

impl RedisClient {
    /// Parses `urls` for `backend` as the store does, building the redis-rs client (no
    /// connection is made).
    pub fn build(backend: Backend, urls: &[String]) -> Result<RedisClient, UrlError> {
        let at = |index: Option<usize>, message: String| UrlError { index, message };
        let mut endpoints = Vec::with_capacity(urls.len());
        for (i, url) in urls.iter().enumerate() {
            let info = url.as_str().into_connection_info().map_err(|e| {
                at(
                    Some(i),
                    format!(
                        "store URL #{} is not a Redis URL the store can use ({}); write redis://[user:password@]host[:port][/db] or rediss://...",
                        i + 1,
                        redis_reason(&e)
                    ),
                )
            })?;
            if info.redis_settings().db() < 0 {
                return Err(at(
                    Some(i),
                    format!(
                        "store URL #{}: the database number must not be negative",
                        i + 1
                    ),
                ));
            }
            endpoints.push(info.addr().to_string());
        }
        let target = match backend {
            Backend::Redis => {
                let [url] = urls else {
                    return Err(at(
                        None,
                        "store.backend = \"redis\" needs exactly one URL".into(),
                    ));
                };
                let client = redis::Client::open(url.as_str()).map_err(|e| {
                    at(
                        Some(0),
                        format!("store.url is not a valid Redis URL ({})", redis_reason(&e)),
                    )
                })?;
                Target::Single(Box::new(client))
            }
            Backend::RedisCluster => {
                if urls.is_empty() {
                    return Err(at(
                        None,
                        "store.backend = \"redis-cluster\" needs seed URLs".into(),
                    ));
                }
                let client = ClusterClientBuilder::new(urls.iter().map(String::as_str))
                    .connection_timeout(CONNECT_TIMEOUT)
                    .build()
                    .map_err(|e| {
                        at(
                            None,
                            format!(
                                "store.urls cannot form a cluster client ({})",
                                redis_reason(&e)
                            ),
                        )
                    })?;
                Target::Cluster(Box::new(client))
            }
            Backend::Memory => {
                return Err(at(
                    None,
                    "store.backend = \"memory\" has no Redis store".into(),
                ))
            }
        };
        Ok(RedisClient {
            target,
            endpoint: endpoints.join(","),
        })
    }
}

/// redis-rs's reason for refusing a URL or a client: its fixed description (and detail, such
/// as an unknown `protocol`), which never repeat the URL.
fn redis_reason(e: &redis::RedisError) -> String {
    e.to_string().replace(" - InvalidClientConfig", "")
}

/// A live connection, a cheap handle shared by every request. `Lean` (a `redis://` server) is
/// floodgate's own pipelined connection ([`super::resp`]): when it breaks, the store builds a
/// new one. The redis-rs ones (`rediss://` and Unix sockets; clusters, which also follow
/// MOVED/ASK and rediscover slots) reconnect by themselves.
#[derive(Clone)]
enum Conn {
    Lean(RespConn),
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> RedisResult<T> {
        match self {
            Conn::Lean(c) => match c.query(cmd).await {
                Ok(Ok(value)) => Ok(T::from_redis_value(value)?),
                Ok(Err(message)) => Err(server_error(message)),
                Err(e) => Err((ErrorKind::Io, "Redis connection", e.to_string()).into()),
            },
            Conn::Single(c) => cmd.query_async(&mut c.clone()).await,
            Conn::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        }
    }

    /// Runs `cmd`, an `EVALSHA` of `script` (see [`Lua::evalsha`]); when Redis no longer
    /// knows the script (`SCRIPT FLUSH`, a restart, a failover to a fresh node) loads it and
    /// runs `cmd` once more.
    async fn eval<T: FromRedisValue>(&self, script: &Lua, cmd: &Cmd) -> RedisResult<T> {
        match self.query(cmd).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.query::<String>(&script.load()).await?;
                self.query(cmd).await
            }
            reply => reply,
        }
    }

    /// Whether this connection can no longer answer and a new one must be built (only ours:
    /// redis-rs's connections reconnect by themselves).
    fn is_broken(&self) -> bool {
        matches!(self, Conn::Lean(c) if c.is_broken())
    }

    /// Sends `cmd` to the server, or to every master of a cluster.
    async fn everywhere(&self, cmd: redis::Cmd) -> RedisResult<Value> {
        match self {
            Conn::Lean(_) => self.query(&cmd).await,
            Conn::Single(c) => cmd.query_async(&mut c.clone()).await,
            Conn::Cluster(c) => {
                c.clone()
                    .route_command(
                        cmd,
                        RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
                    )
                    .await
            }
        }
    }
}

/// The numbers one check passes to the decide script (see `lua/decide.lua`).
struct Params {
    /// The algorithm's number in `decide.lua`'s table.
    code: u8,
    cost: u64,
    limit: u64,
    window_us: u64,
    burst: u64,
    interval_ns: u64,
    cap_ns: u64,
    /// `Decision::limit`: the quota shown to clients (burst for the buckets).
    quota: u64,
}

impl Params {
    fn of(check: &Check) -> Params {
        let l = &check.limit;
        // Exactly as the reference computes them (algorithm::window_ns / interval_ns).
        let window_ns = sat(l.window.as_nanos()).max(1);
        let interval_ns = window_ns.div_ceil(l.limit.max(1)).max(1);
        let bucket = sat(u128::from(l.burst) * u128::from(interval_ns));
        let (code, limit, cap_ns, quota) = match (l.algorithm, l.mode) {
            (Algorithm::FixedWindow, _) => (1, l.limit, 0, l.limit),
            (Algorithm::SlidingWindowLog, _) => {
                let q = l.limit.min(MAX_SLIDING_LOG_LIMIT);
                (2, q, 0, q)
            }
            (Algorithm::SlidingWindowCounter, _) => (3, l.limit, 0, l.limit),
            (Algorithm::TokenBucket, _) => (4, l.limit, bucket, l.burst),
            (Algorithm::LeakyBucket, LeakyMode::Police) => (5, l.limit, bucket, l.burst),
            (Algorithm::LeakyBucket, LeakyMode::Shape) => {
                let longest = sat(l.max_delay.as_nanos()).min(bucket);
                (6, l.limit, longest, l.burst)
            }
            (Algorithm::Concurrency, _) => (7, l.limit, 0, l.limit),
        };
        Params {
            code,
            cost: check.cost.min(MAX_EXACT),
            limit: limit.min(MAX_EXACT),
            window_us: window_ns.div_ceil(1000).clamp(1, MAX_EXACT),
            burst: l.burst.min(MAX_EXACT),
            interval_ns: interval_ns.min(MAX_EXACT),
            cap_ns: cap_ns.min(MAX_EXACT),
            quota,
        }
    }

    /// The check as `decide.lua` reads it: the algorithm's number, then cost, limit, window,
    /// burst, interval and cap as little-endian doubles (exact: all are capped below 2^53).
    fn packed(&self) -> [u8; 49] {
        let mut out = [0; 49];
        out[0] = self.code;
        let numbers = [
            self.cost,
            self.limit,
            self.window_us,
            self.burst,
            self.interval_ns,
            self.cap_ns,
        ];
        for (slot, n) in out[1..].chunks_exact_mut(8).zip(numbers) {
            slot.copy_from_slice(&(n as f64).to_le_bytes());
        }
        out
    }

    /// The decision from the script's five numbers for this check.
    fn decision(&self, reply: &[u64; REPLY_FIELDS]) -> Decision {
        let n = |i: usize| reply[i];
        let allowed = n(0) == 1;
        Decision {
            allowed,
            limit: self.quota,
            remaining: if allowed { n(1) } else { 0 },
            reset: Duration::from_nanos(n(2)),
            // Never 0 when rejected: a client told to retry at once would be rejected again.
            retry_after: if allowed {
                Duration::ZERO
            } else {
                Duration::from_nanos(n(3).max(1))
            },
            delay: if allowed {
                Duration::from_nanos(n(4))
            } else {
                Duration::ZERO
            },
        }
    }
}

/// One check's numbers from the decide script's reply: little-endian doubles holding
/// non-negative integers below 2^53 (anything else reads as 0).
fn unpack_reply(packed: &[u8]) -> [u64; REPLY_FIELDS] {
    let mut numbers = [0; REPLY_FIELDS];
    for (n, bytes) in numbers.iter_mut().zip(packed.chunks_exact(8)) {
        let mut b = [0; 8];
        b.copy_from_slice(bytes);
        let f = f64::from_le_bytes(b);
        if f.is_finite() && f > 0.0 {
            // Saturating, and exact for the integers the script sends.
            *n = f as u64;
        }
    }
    numbers
}

fn sat(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

impl RedisStore {
    /// Builds the store without waiting for Redis: it connects in the background, so the
    /// gateway starts (and applies each rule's `on_store_error`) while Redis is down.
    ///
    /// Fails only on a configuration that can never work: no URL, or a URL that does not
    /// parse (the error never repeats the URL, which may hold a password).
    ///
    /// Connecting needs a Tokio runtime: it starts here when called inside one, otherwise on
    /// [`RedisStore::start`] or the first [`RedisStore::decide`].
    pub fn new(store: &Store) -> Result<Arc<RedisStore>, StoreError> {
        RedisStore::with_options(store, Options::default())
    }

    /// [`RedisStore::new`] with other [`Options`] (tests shorten the lease TTL and the
    /// breaker's cool-down).
    pub fn with_options(store: &Store, options: Options) -> Result<Arc<RedisStore>, StoreError> {
        let client = RedisClient::build(store.backend, &store.urls)
            .map_err(|e| StoreError::Redis(e.to_string()))?;
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
        let broken = matches!(target, Target::Broken(_));
        let (conn, _) = watch::channel(None);
        let store = Arc::new(RedisStore {
            inner: Arc::new(Inner {
                target,
                endpoint,
                key_prefix: store.key_prefix.clone(),
                breaker: Breaker::new(options.failure_threshold, options.cool_down),
                options,
                conn,
                started: AtomicBool::new(false),
                connecting: AtomicBool::new(false),
                up: AtomicBool::new(!broken),
                policy: Mutex::new(None),
            }),
        });
        store.start();
        store
    }

    /// Starts connecting in the background on the current Tokio runtime, if not already
    /// started; a no-op outside a runtime. Call it once the runtime that serves requests runs
    /// (e.g. from a background service, after Pingora daemonized: a thread or task started
    /// before `fork` would not survive it) so that the connection is ready before the first
    /// request. [`RedisStore::decide`] calls it too.
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

    /// Whether the store is usable right now: connected, the last call succeeded, and the
    /// circuit breaker is closed (for readiness checks).
    pub fn is_up(&self) -> bool {
        self.inner.conn.borrow().is_some()
            && self.inner.up.load(Ordering::Acquire)
            && self.inner.breaker.state() == BreakerState::Closed
    }

    /// Whether a connection has been established (it may be failing now).
    pub fn is_connected(&self) -> bool {
        self.inner.conn.borrow().is_some()
    }

    /// The circuit breaker's state.
    pub fn breaker_state(&self) -> BreakerState {
        self.inner.breaker.state()
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
        self.maxmemory_policy().is_some_and(|p| evicts(&p))
    }

    /// `host:port` of the configured URL(s), comma-separated: safe to log or show (no
    /// password).
    pub fn endpoint(&self) -> &str {
        &self.inner.endpoint
    }

    /// The Redis key holding `check`'s state:
    /// `<key_prefix><rule>:{<16 hex digits of the key digest>}`.
    pub fn key(&self, check: &Check) -> String {
        self.inner.key(check)
    }

    /// Decides `checks` atomically (all charged or none) in one round trip (per cluster slot),
    /// giving up after `timeout`. `lease` identifies this request's concurrency slots (and
    /// names its sliding-log entries), so it must be unique per request (a random `u64`); pass
    /// the same value to [`RedisStore::release`].
    ///
    /// Cluster: checks whose keys hash to different slots are decided by concurrent calls,
    /// each atomic. When one call rejects and another admitted, the admitted one stays charged
    /// (its concurrency slots are given back at once); rules keyed on the same parts share a
    /// slot and never see this.
    ///
    /// On a timeout or error, concurrency slots the call may still have taken are released in
    /// the background (they would expire with their lease anyway).
    pub async fn decide(
        &self,
        checks: &[Check],
        lease: u64,
        timeout: Duration,
    ) -> Result<Vec<Decision>, StoreError> {
        self.decide_inner(checks, lease, timeout, None).await
    }

    /// Test hook: [`RedisStore::decide`] as if Redis' clock read `now_us` (microseconds since
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
        self.decide_inner(checks, lease, timeout, Some(now_us))
            .await
    }

    async fn decide_inner(
        &self,
        checks: &[Check],
        lease: u64,
        timeout: Duration,
        now_us: Option<u64>,
    ) -> Result<Vec<Decision>, StoreError> {
        if checks.is_empty() {
            return Ok(Vec::new());
        }
        self.start();
        let inner = &self.inner;
        if let Target::Broken(why) = &inner.target {
            // Never built: down for good, and every decision says so.
            metrics().store_errors.with_label_values(&["error"]).inc();
            metrics().store_up.set(0);
            return Err(StoreError::Redis(why.to_string()));
        }
        let Some(ticket) = inner.breaker.try_call() else {
            metrics()
                .store_errors
                .with_label_values(&["circuit_open"])
                .inc();
            return Err(StoreError::CircuitOpen);
        };
        let outcome = tokio::time::timeout(timeout, inner.run(checks, lease, now_us)).await;
        let (error, kind) = match outcome {
            Ok(Ok((decisions, partial))) => {
                ticket.success();
                inner.mark_up();
                if partial {
                    // Cluster: another slot rejected; slots this request took elsewhere go back.
                    inner.spawn_release(checks, lease);
                }
                return Ok(decisions);
            }
            Ok(Err(e)) => (e, "error"),
            Err(_) => (StoreError::Timeout, "timeout"),
        };
        metrics().store_errors.with_label_values(&[kind]).inc();
        metrics().store_up.set(0);
        inner.up.store(false, Ordering::Release);
        let opened = ticket.failure();
        if inner.conn.borrow().as_ref().is_some_and(Conn::is_broken) {
            // Our own connection does not reconnect by itself: build the next one now (the
            // failing calls meanwhile count towards the breaker).
            inner.spawn_connect();
        } else if opened && matches!(error, StoreError::Timeout) {
            // A connection that stopped answering (a black-holed peer) never fails by itself:
            // build a fresh one in the background while the breaker holds calls off.
            inner.spawn_connect();
        }
        // The call may have taken slots before it failed or after we stopped waiting.
        inner.spawn_release(checks, lease);
        Err(error)
    }

    /// Releases the concurrency slots that `lease` took for `checks` (other checks are
    /// ignored). Best effort, bounded by [`RELEASE_TIMEOUT`]: a slot that cannot be released
    /// expires with its lease ([`LEASE_TTL`]).
    pub async fn release(&self, checks: &[Check], lease: u64) {
        self.inner.release(checks, lease).await;
    }
}

impl Inner {
    fn key(&self, check: &Check) -> String {
        let mut key = String::with_capacity(self.key_prefix.len() + check.rule.len() + 19);
        key.push_str(&self.key_prefix);
        key.push_str(&check.rule);
        key.push_str(":{");
        push_hex16(&mut key, check.key);
        key.push('}');
        key
    }

    /// Indexes of `keys` grouped by what one script call may touch: all of them (standalone),
    /// or one group per hash slot (cluster), in order of first appearance.
    fn groups(&self, keys: &[String]) -> Vec<Vec<usize>> {
        match self.target {
            Target::Single(_) | Target::Broken(_) => vec![(0..keys.len()).collect()],
            Target::Cluster(_) => {
                let mut groups: Vec<(Slot, Vec<usize>)> = Vec::new();
                for (i, key) in keys.iter().enumerate() {
                    let slot = Slot::for_key(key.as_bytes());
                    match groups.iter_mut().find(|(s, _)| *s == slot) {
                        Some((_, g)) => g.push(i),
                        None => groups.push((slot, vec![i])),
                    }
                }
                groups.into_iter().map(|(_, g)| g).collect()
            }
        }
    }

    /// The connection, waiting for the first one to be established (the caller bounds the
    /// wait with its timeout).
    async fn connection(&self) -> Result<Conn, StoreError> {
        if let Some(conn) = self.conn.borrow().clone() {
            return Ok(conn);
        }
        let mut rx = self.conn.subscribe();
        let conn = rx
            .wait_for(Option::is_some)
            .await
            .map_err(|_| StoreError::Redis("store closed".into()))?
            .clone();
        conn.ok_or_else(|| StoreError::Redis("not connected".into()))
    }

    /// Runs the decide script: the decisions, and whether a cluster request was admitted in
    /// some slots but rejected in others.
    async fn run(
        &self,
        checks: &[Check],
        lease: u64,
        now_us: Option<u64>,
    ) -> Result<(Vec<Decision>, bool), StoreError> {
        let conn = self.connection().await?;
        let keys: Vec<String> = checks.iter().map(|c| self.key(c)).collect();
        let params: Vec<Params> = checks.iter().map(Params::of).collect();
        let lease = hex16(lease);
        let lease_ttl_us = sat(self.options.lease_ttl.as_micros()).clamp(1, MAX_EXACT);
        let now = now_us
            .map(|n| n.min(MAX_EXACT).to_string())
            .unwrap_or_default();
        let groups = self.groups(&keys);
        let call = |group: &[usize]| {
            let mut cmd = DECIDE.evalsha(group.len());
            for &i in group {
                cmd.arg(keys[i].as_str());
            }
            cmd.arg(lease.as_str()).arg(lease_ttl_us).arg(now.as_str());
            for &i in group {
                cmd.arg(&params[i].packed()[..]);
            }
            let conn = conn.clone();
            async move { conn.eval::<Vec<u8>>(&DECIDE, &cmd).await }
        };
        let replies = match groups.as_slice() {
            [group] => vec![call(group).await],
            _ => futures::future::join_all(groups.iter().map(|g| call(g))).await,
        };
        let mut decisions: Vec<Option<Decision>> = vec![None; checks.len()];
        let mut some_rejected = false;
        let mut some_admitted = false;
        for (group, reply) in groups.iter().zip(replies) {
            let reply = reply.map_err(|e| StoreError::Redis(e.to_string()))?;
            if reply.len() != group.len() * REPLY_BYTES {
                return Err(StoreError::Redis(format!(
                    "decide script answered {} bytes for {} checks",
                    reply.len(),
                    group.len()
                )));
            }
            let mut all = true;
            for (&i, packed) in group.iter().zip(reply.chunks_exact(REPLY_BYTES)) {
                let d = params[i].decision(&unpack_reply(packed));
                all &= d.allowed;
                decisions[i] = Some(d);
            }
            some_admitted |= all;
            some_rejected |= !all;
        }
        let decisions = decisions.into_iter().flatten().collect();
        Ok((decisions, some_admitted && some_rejected))
    }

    fn mark_up(self: &Arc<Self>) {
        metrics().store_up.set(1);
        if !self.up.swap(true, Ordering::AcqRel) {
            // Back after failures: possibly a restarted Redis with another configuration.
            if let Some(conn) = self.conn.borrow().clone() {
                tokio::spawn(check_policy(Arc::downgrade(self), conn));
            }
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

    async fn release(&self, checks: &[Check], lease: u64) {
        let held: Vec<&Check> = checks.iter().filter(|c| holds_slot(c)).collect();
        if held.is_empty() {
            return;
        }
        // Not connected yet: nothing can have been acquired through this store.
        let Some(conn) = self.conn.borrow().clone() else {
            return;
        };
        let keys: Vec<String> = held.iter().map(|c| self.key(c)).collect();
        let lease = hex16(lease);
        let calls = self.groups(&keys).into_iter().map(|group| {
            let mut cmd = RELEASE.evalsha(group.len());
            for &i in &group {
                cmd.arg(keys[i].as_str());
            }
            cmd.arg(lease.as_str());
            for &i in &group {
                cmd.arg(held[i].cost);
            }
            let conn = conn.clone();
            async move { conn.eval::<i64>(&RELEASE, &cmd).await }
        });
        match tokio::time::timeout(RELEASE_TIMEOUT, futures::future::join_all(calls)).await {
            Ok(results) => {
                for r in results {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "concurrency release failed; the lease will expire");
                    }
                }
            }
            Err(_) => {
                tracing::debug!("concurrency release timed out; the lease will expire");
            }
        }
    }
}

/// A lease id as the scripts name it: 16 hex digits.
fn hex16(lease: u64) -> String {
    let mut s = String::with_capacity(16);
    push_hex16(&mut s, lease);
    s
}

/// An error Redis answered, as redis-rs would classify it (`NOSCRIPT` must be recognised).
fn server_error(message: String) -> redis::RedisError {
    let kind = if message.starts_with("NOSCRIPT") {
        ErrorKind::Server(ServerErrorKind::NoScript)
    } else {
        ErrorKind::Extension
    };
    (kind, "Redis answered an error", message).into()
}

fn holds_slot(check: &Check) -> bool {
    check.limit.algorithm == Algorithm::Concurrency && check.cost > 0
}

/// Connects (with backoff, for as long as it takes and the store exists), publishes the
/// connection, then reads `maxmemory-policy`.
async fn connect_loop(store: Weak<Inner>) {
    let mut delay = RECONNECT_MIN;
    let mut attempts: u64 = 0;
    loop {
        // Hold the store only while using it, so that dropping it ends this task.
        let Some(inner) = store.upgrade() else {
            return;
        };
        let target = inner.target.clone();
        let endpoint = inner.endpoint.clone();
        drop(inner);
        let attempt = tokio::time::timeout(4 * CONNECT_TIMEOUT, connect(&target)).await;
        let error = match attempt {
            Ok(Ok(conn)) => {
                let Some(inner) = store.upgrade() else {
                    return;
                };
                inner.conn.send_replace(Some(conn.clone()));
                inner.connecting.store(false, Ordering::Release);
                tracing::info!(redis = %endpoint, "connected to Redis");
                check_policy(store, conn).await;
                return;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "connection attempt timed out".to_string(),
        };
        // One line at first, then one every ~30 attempts: a long outage must not flood logs.
        if attempts.is_multiple_of(30) {
            tracing::warn!(redis = %endpoint, error = %error, attempts = attempts + 1, "cannot connect to Redis; retrying in the background (global rules apply on_store_error)");
        }
        attempts += 1;
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(RECONNECT_MAX);
    }
}

async fn connect(target: &Target) -> RedisResult<Conn> {
    match target {
        Target::Single(client) => {
            let info = client.get_connection_info();
            if let ConnectionAddr::Tcp(host, port) = info.addr() {
                let settings = info.redis_settings();
                return RespConn::connect(
                    host,
                    *port,
                    settings.username(),
                    settings.password(),
                    settings.db(),
                    CONNECT_TIMEOUT,
                )
                .await
                .map(Conn::Lean)
                .map_err(|e| (ErrorKind::Io, "cannot connect to Redis", e.to_string()).into());
            }
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(CONNECT_TIMEOUT))
                // Decisions have their own deadline (store.timeout); a response timeout here
                // would only fire after the caller stopped waiting.
                .set_response_timeout(None)
                // Reconnect quickly after Redis returns: few retries, short delays; the next
                // command starts another round if these fail.
                .set_number_of_retries(2)
                .set_min_delay(Duration::from_millis(100))
                .set_max_delay(Duration::from_secs(1))
                // Every request of the process queues on this connection.
                .set_pipeline_buffer_size(4096);
            ConnectionManager::new_with_config((**client).clone(), config)
                .await
                .map(Conn::Single)
        }
        Target::Cluster(client) => client.get_async_connection().await.map(Conn::Cluster),
        Target::Broken(why) => Err((
            ErrorKind::InvalidClientConfig,
            "the Redis store could not be built",
            why.to_string(),
        )
            .into()),
    }
}

/// Reads `maxmemory-policy` (every master of a cluster) and warns loudly when Redis may
/// evict floodgate's keys. Errors are ignored: managed Redis services often forbid `CONFIG`.
async fn check_policy(store: Weak<Inner>, conn: Conn) {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory-policy");
    let reply = tokio::time::timeout(POLICY_TIMEOUT, conn.everywhere(cmd)).await;
    let Some(inner) = store.upgrade() else {
        return;
    };
    let value = match reply {
        Ok(Ok(value)) => value,
        Ok(Err(e)) => {
            tracing::info!(redis = %inner.endpoint, error = %e, "cannot read Redis maxmemory-policy (CONFIG may be disabled); make sure it is noeviction");
            return;
        }
        Err(_) => return,
    };
    let mut policies = Vec::new();
    collect_policies(&value, &mut policies);
    // The most dangerous one wins: a single evicting master resets the limits it holds.
    let Some(policy) = policies
        .iter()
        .find(|p| evicts(p))
        .or(policies.first())
        .cloned()
    else {
        return;
    };
    let evicting = evicts(&policy);
    metrics().store_evicting_policy.set(i64::from(evicting));
    if evicting {
        tracing::error!(
            redis = %inner.endpoint,
            maxmemory_policy = %policy,
            "REDIS MAY EVICT RATE-LIMIT KEYS: maxmemory-policy {policy} lets Redis delete floodgate's counters under memory pressure, and an evicted counter is a reset limit. Set maxmemory-policy noeviction (every floodgate key has a TTL, so volatile-* policies evict them too)."
        );
    }
    *inner.policy.lock() = Some(policy);
}

/// Whether a `maxmemory-policy` may evict floodgate keys (all of them have TTLs).
fn evicts(policy: &str) -> bool {
    policy.starts_with("allkeys-") || policy.starts_with("volatile-")
}

/// The values that follow `maxmemory-policy` in a `CONFIG GET` reply (RESP2 array or RESP3
/// map, per node in a cluster reply).
fn collect_policies(value: &Value, out: &mut Vec<String>) {
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    };
    match value {
        Value::Array(items) | Value::Set(items) => {
            let mut pending = false;
            for item in items {
                if pending {
                    if let Some(t) = text(item) {
                        out.push(t);
                    }
                    pending = false;
                } else if text(item).as_deref() == Some("maxmemory-policy") {
                    pending = true;
                } else {
                    collect_policies(item, out);
                }
            }
        }
        Value::Map(pairs) => {
            for (k, v) in pairs {
                if text(k).as_deref() == Some("maxmemory-policy") {
                    if let Some(t) = text(v) {
                        out.push(t);
                    }
                } else {
                    collect_policies(v, out);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Limit;

    fn check(algorithm: Algorithm, limit: u64, window: Duration, burst: u64) -> Check {
        Check {
            rule: "r".into(),
            key: 0xabc,
            limit: Limit {
                algorithm,
                limit,
                window,
                burst,
                mode: LeakyMode::Shape,
                max_delay: Duration::from_millis(250),
            },
            cost: 1,
        }
    }

    #[test]
    fn params_match_the_reference_rounding() {
        let p = Params::of(&check(Algorithm::TokenBucket, 3, Duration::from_secs(1), 5));
        assert_eq!(p.interval_ns, 333_333_334);
        assert_eq!(p.cap_ns, 5 * 333_333_334);
        assert_eq!(p.window_us, 1_000_000);
        assert_eq!(p.quota, 5);
        let p = Params::of(&check(
            Algorithm::LeakyBucket,
            10,
            Duration::from_secs(1),
            20,
        ));
        assert_eq!(p.code, 6, "leaky shape");
        assert_eq!(
            p.cap_ns, 250_000_000,
            "longest wait = min(max_delay, burst * interval)"
        );
        let p = Params::of(&check(
            Algorithm::SlidingWindowLog,
            u64::MAX,
            Duration::from_secs(1),
            1,
        ));
        assert_eq!(p.limit, MAX_SLIDING_LOG_LIMIT);
        assert_eq!(p.quota, MAX_SLIDING_LOG_LIMIT);
        let p = Params::of(&check(Algorithm::FixedWindow, u64::MAX, Duration::MAX, 1));
        assert_eq!(p.limit, MAX_EXACT);
        assert_eq!(p.window_us, MAX_EXACT);
    }

    #[test]
    fn rejected_decisions_never_say_retry_now() {
        let p = Params::of(&check(Algorithm::FixedWindow, 1, Duration::from_secs(1), 1));
        let d = p.decision(&[0, 5, 10, 0, 7]);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.retry_after, Duration::from_nanos(1));
        assert_eq!(d.delay, Duration::ZERO);
    }

    #[test]
    fn replies_unpack_exactly_and_garbage_reads_as_zero() {
        let packed: Vec<u8> = [1.0, 9_007_199_254_740_991.0, -3.0, f64::NAN, 1e300]
            .iter()
            .flat_map(|f: &f64| f.to_le_bytes())
            .collect();
        assert_eq!(
            unpack_reply(&packed),
            [1, 9_007_199_254_740_991, 0, 0, u64::MAX]
        );
        // A short reply never panics: the missing numbers read as 0.
        assert_eq!(unpack_reply(&packed[..12]), [1, 0, 0, 0, 0]);
    }

    #[test]
    fn policies_are_read_from_every_reply_shape() {
        let pair = |p: &str| {
            Value::Array(vec![
                Value::BulkString(b"maxmemory-policy".to_vec()),
                Value::BulkString(p.as_bytes().to_vec()),
            ])
        };
        let mut out = Vec::new();
        collect_policies(&pair("noeviction"), &mut out);
        assert_eq!(out, ["noeviction"]);
        let cluster = Value::Map(vec![
            (
                Value::SimpleString("127.0.0.1:1".into()),
                pair("noeviction"),
            ),
            (
                Value::SimpleString("127.0.0.1:2".into()),
                pair("allkeys-lru"),
            ),
        ]);
        let mut out = Vec::new();
        collect_policies(&cluster, &mut out);
        assert_eq!(out, ["noeviction", "allkeys-lru"]);
        assert!(evicts("allkeys-lru") && evicts("volatile-ttl") && !evicts("noeviction"));
    }

    #[test]
    fn urls_with_passwords_never_show_in_errors() {
        let store = Store {
            backend: Backend::Redis,
            urls: vec!["http://user:s3cret@host:1".into()],
            timeout: Duration::from_millis(20),
            key_prefix: "p:".into(),
            instances: 1,
            max_keys: 10,
        };
        let err = RedisStore::new(&store).err().expect("not a Redis URL");
        assert!(!err.to_string().contains("s3cret"), "{err}");
    }
}
