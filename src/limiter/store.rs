//! The store as the engine sees it: a small backend-neutral trait (as envoyproxy/ratelimit's
//! `RateLimitCache` and Limitador's `CounterStorage`), so that the engine depends on what a
//! store promises, not on which one it is.
//!
//! Every backend implements it: [`super::memory::MemoryStore`] (the embedded default; the
//! engine decides global rules in it together with the local ones, in one call),
//! [`super::redis::RedisStore`] (one Redis server or a Redis Cluster). [`super::backend::open`]
//! opens the one `[store]` names. The engine's unit tests drive the engine through an in-test
//! implementation to exercise every failure mode without a server, and `tests/stores.rs` runs
//! the same scenarios against every backend.

use std::time::Duration;

use async_trait::async_trait;

use super::algorithm::{horizon, quota};
use super::{Check, Decision, LeakyMode};

/// Why the store could not decide.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// No answer within `store.timeout`.
    #[error("store timed out")]
    Timeout,
    /// The circuit breaker is open: the store is not being called for a cool-down.
    #[error("store circuit breaker open")]
    CircuitOpen,
    /// The store answered with an error, or could not be reached (the text says which; it
    /// never holds a password).
    #[error("store error: {0}")]
    Failed(String),
}

/// What the store charged for one check of [`SharedStore::decide_leased`] beyond its decision:
/// the permits of a quota lease and the window they belong to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Grant {
    /// Permits charged to the shared state for this check: the request's cost plus the
    /// lease's extra permits; 0 when nothing was charged (this check or another of its call
    /// rejected).
    pub granted: u64,
    /// Time until the aligned window the permits were charged to ends (fixed window, sliding
    /// counter): they may not be spent after it. Zero for the buckets.
    pub window_left: Duration,
    /// The end of that window in the store's time (us since the epoch; 0 for the buckets): a
    /// return names it, so that permits are never given back to another window.
    pub window_end_us: u64,
    /// When the store charged them, in its time (us since the epoch; 0: unknown): a return or
    /// a true-up names it, so that it never lands on a counter a usage reset started after
    /// the charge (a new epoch of the counter; see [`UsageChange::Reset`]).
    pub charged_at_us: u64,
}

/// Unspent permits of a quota lease, given back by [`SharedStore::give_back`].
#[derive(Debug, Clone)]
pub struct Return {
    /// The check the lease was taken for (its rule, counter and numbers).
    pub check: Check,
    /// Permits never spent.
    pub permits: u64,
    /// [`Grant::window_end_us`] of the lease.
    pub window_end_us: u64,
    /// [`Grant::charged_at_us`] of the lease's permits: the earliest, when it was filled more
    /// than once (a return older than a reset is dropped, so the earliest errs towards
    /// dropping, which costs availability, never exactness).
    pub charged_at_us: u64,
}

/// What the usage API (`/usage`) does to one counter: look, start it over, or give it more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageChange {
    /// Only read it.
    Read,
    /// Start the counter over: as if the identity had sent nothing. This starts a new *epoch*
    /// of the counter: a refund, true-up or lease return of a charge made before the reset
    /// is dropped, never applied to the new counter (which would admit more than the limit).
    Reset,
    /// `amount` more for the current window only (fixed windows, calendar periods): the
    /// window's count goes down by it, below zero if need be, and the grant ends with the
    /// window. A grant is a difference, which commutes with the differences a refund, a
    /// true-up or a lease return makes: those of charges made before it still land (an extra
    /// charge dropped there would be admitted for free), and the grant stays whole.
    Grant(u64),
}

impl UsageChange {
    /// The change as the stores remember it under an idempotency key: a retry with the same
    /// key must ask for the same change.
    pub fn fingerprint(self) -> (u8, u64) {
        match self {
            UsageChange::Read => (0, 0),
            UsageChange::Reset => (1, 0),
            UsageChange::Grant(n) => (2, n),
        }
    }
}

/// How long a store remembers the answer to a change made with an `Idempotency-Key`: a retry
/// within it gets that answer and changes nothing.
pub const IDEMPOTENCY_TTL: Duration = Duration::from_secs(24 * 3600);

/// The longest `Idempotency-Key` the usage API accepts (bytes; printable ASCII only).
pub const MAX_IDEMPOTENCY_KEY: usize = 64;

/// How one usage change is made: its deadline and, optionally, the idempotency key that makes
/// a retry land once.
#[derive(Debug, Clone, Copy)]
pub struct UsageCall<'a> {
    /// How long the store may take. A store that can, refuses to apply a change that reaches
    /// it after this (so that a timeout means "not applied", see [`Changed`]).
    pub timeout: Duration,
    /// The client's `Idempotency-Key` (validated: at most [`MAX_IDEMPOTENCY_KEY`] bytes of
    /// `A-Z a-z 0-9 - _ . :`), remembered per counter for [`IDEMPOTENCY_TTL`].
    pub idempotency_key: Option<&'a str>,
}

/// Whether a change was made now, or had been made before under the same idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// Made now (or a read).
    Fresh,
    /// Made before under this key: the answer is the one that change got; nothing changed now.
    Repeated,
    /// This key was used for another change of this counter: nothing changed now.
    Conflict,
}

/// A counter reset made by any instance (the usage API), as the store announced it: each
/// instance forgets the quota lease permits of that counter charged before `at_us`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeardReset {
    /// The rule's name.
    pub rule: String,
    /// The counter ([`Check::counter`]).
    pub counter: u64,
    /// When the new epoch started, in the store's time (us since the Unix epoch).
    pub at_us: u64,
}

/// A usage change's answer: the counter before and after, and whether it was a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Changed {
    /// The counter before the change.
    pub before: Usage,
    /// The counter after it.
    pub after: Usage,
    /// Made now, or remembered.
    pub replay: Replay,
}

/// One counter as the usage API shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// The rule's quota (`burst` for the buckets).
    pub limit: u64,
    /// Units counted now (`limit - remaining`): below zero when a grant exceeds what was used.
    pub used: i64,
    /// Units the next requests may still take now (more than `limit` after a grant).
    pub remaining: i64,
    /// Time until the quota is whole again (a window's end).
    pub reset: Duration,
}

impl Usage {
    /// The usage a cost-0 look at a counter answers.
    pub fn of(decision: &Decision) -> Usage {
        let limit = i64::try_from(decision.limit).unwrap_or(i64::MAX);
        let remaining = i64::try_from(decision.remaining).unwrap_or(i64::MAX);
        Usage {
            limit: decision.limit,
            used: limit.saturating_sub(remaining),
            remaining,
            reset: decision.reset,
        }
    }
}

/// One reservation's true-up, for [`SharedStore::true_up`].
#[derive(Debug, Clone)]
pub struct TrueUp {
    /// The check the reservation was charged for.
    pub check: Check,
    /// What to refund or charge on top.
    pub adjust: super::true_up::Adjust,
    /// [`Grant::window_end_us`] of the call that charged it (0 for the buckets and the log).
    pub window_end_us: u64,
    /// [`Grant::charged_at_us`] of the call that charged it: a true-up of a charge older than
    /// a reset of its counter is dropped.
    pub charged_at_us: u64,
    /// The holder id the call was made under: names a sliding log's entries.
    pub holder: u64,
}

/// How the shared store stands, for `/readyz` and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreStatus {
    /// Usable right now: connected, the last call succeeded and no circuit breaker holds
    /// calls off.
    pub up: bool,
    /// A connection has been established at least once (it may be failing now).
    pub connected: bool,
    /// Where the store is (`host:port`, comma-separated; `in-process` for the memory store):
    /// safe to log, never a password.
    pub endpoint: String,
    /// The store may drop floodgate's counters by a policy of its own under memory pressure
    /// (Redis' `maxmemory-policy`), which silently resets limits. The memory store's bounded
    /// eviction keeps limiting keys and counts what it forgets, so it reports `false`.
    pub drops_counters: bool,
}

/// Where global checks are decided: all or nothing per request, giving back concurrency slots
/// when the request ends. A store several gateways share (Redis) makes the limits global; the
/// memory store keeps them per instance.
#[async_trait]
pub trait SharedStore: Send + Sync {
    /// Decides `checks` (one decision each, in order), giving up after `timeout`. `holder`
    /// identifies this request's concurrency slots (the slots' holder, not a quota lease):
    /// unique per request (a random `u64`), and passed again to [`SharedStore::release`] once
    /// the request ends.
    ///
    /// All or nothing: when any check rejects, the request keeps no concurrency slot in the
    /// store. A store whose atomic steps do not span every key (Redis Cluster: one call per
    /// hash slot) may have charged the steps that admitted; it gives their concurrency slots
    /// back by itself, while the rate units they charged stay charged. On an error the store
    /// likewise gives back whatever the failed call may have taken (only the store knows
    /// whether the call went out). So the engine releases a holder's slots only for requests
    /// it kept.
    async fn decide(
        &self,
        checks: &[Check],
        holder: u64,
        timeout: Duration,
    ) -> Result<Vec<Decision>, StoreError>;

    /// Gives back the concurrency slots that `holder` took for `checks` (other checks are
    /// ignored). Best effort: a slot that cannot be released expires after
    /// [`SharedStore::slot_ttl`], if the store has one. Called when the request's
    /// [`Slots`](super::engine::Slots) are dropped.
    async fn release(&self, checks: &[Check], holder: u64);

    /// [`SharedStore::decide`], where `wants[i] > 0` asks to *lease* that many permits for
    /// check `i` (quota leasing): the store charges the request's cost plus at most a fair
    /// share of what remains (`remaining / (2 x instances)`), never more than wanted, and says
    /// how many in the [`Grant`]. `wants[i] == 0`: an exact check. All or nothing as `decide`.
    /// The default leases nothing beyond the cost (a store that cannot lease stays exact).
    async fn decide_leased(
        &self,
        checks: &[Check],
        wants: &[u64],
        instances: u64,
        holder: u64,
        timeout: Duration,
    ) -> Result<Vec<(Decision, Grant)>, StoreError> {
        let _ = (wants, instances);
        let ds = self.decide(checks, holder, timeout).await?;
        let all = ds.iter().all(|d| d.allowed);
        Ok(ds
            .into_iter()
            .zip(checks)
            .map(|(d, c)| {
                let granted = if all { c.cost } else { 0 };
                (
                    d,
                    Grant {
                        granted,
                        ..Grant::default()
                    },
                )
            })
            .collect())
    }

    /// Gives back the unspent permits of quota leases, in one call (per cluster slot).
    /// Returns how many the store took back (permits of a window that has ended are not).
    /// Best effort: permits that cannot be returned stay charged until their window ends or
    /// their bucket refills, which costs availability, never exactness.
    async fn give_back(&self, returns: &[Return]) -> u64 {
        let _ = returns;
        0
    }

    /// Trues up reservations of response-aware rules (see [`super::reservation`]), in one
    /// call (per cluster slot), each in the window it was charged in and atomic per key.
    /// Returns how many were applied (one whose window has ended is not). Best effort like
    /// [`SharedStore::give_back`]: a refund that cannot be applied stays charged, which costs
    /// availability, never exactness. The default applies none.
    async fn true_up(&self, ups: &[TrueUp]) -> u64 {
        let _ = ups;
        0
    }

    /// Keeps the concurrency slots `holder` holds for `checks` alive while their request runs
    /// (see [`SharedStore::decide`]); called periodically until the request ends.
    async fn renew(&self, checks: &[Check], holder: u64) {
        let _ = (checks, holder);
    }

    /// How long a concurrency slot counts when its request never releases it (a crashed
    /// gateway's slots in a store that outlives it); held slots are renewed well within it
    /// ([`SharedStore::renew`]). `None`: slots live exactly as long as their request, as in a
    /// store that lives and dies with the process, and are never renewed.
    fn slot_ttl(&self) -> Option<Duration> {
        None
    }

    /// The usage API: the counter of `check` (its rule, counter id and numbers; the cost is
    /// not charged) before and after `change`, made atomically in the store, within
    /// `call.timeout`, once per `call.idempotency_key`. [`StoreError::Timeout`] means the
    /// change was not applied and will not be (a change that reaches the store past its
    /// deadline is refused there); after another error a change the store received may have
    /// been applied, which a retry with the same idempotency key makes harmless. The default
    /// answers that this store keeps no usage.
    async fn usage(
        &self,
        check: &Check,
        change: UsageChange,
        call: UsageCall<'_>,
    ) -> Result<Changed, StoreError> {
        let _ = (check, change, call);
        Err(StoreError::Failed("this store keeps no usage".into()))
    }

    /// Listens for counter resets made by any instance, calling `heard` for each, until the
    /// future is dropped (it reconnects by itself). A store that only this instance uses (the
    /// default) never hears one: this instance forgets its own lease where it resets.
    async fn hear_resets(&self, heard: &(dyn Fn(HeardReset) + Send + Sync)) {
        let _ = heard;
        std::future::pending::<()>().await
    }

    /// Lifts the `block_for` ban of `check`'s key (the usage API's reset), within `timeout`:
    /// whether a live ban was lifted. The default keeps no bans.
    async fn lift_ban(&self, check: &Check, timeout: Duration) -> Result<bool, StoreError> {
        let _ = (check, timeout);
        Ok(false)
    }

    /// Gets the store ready to decide before the gateway accepts requests: connected, its
    /// scripts loaded, a cluster's slot map read. Gives up after `deadline`; whether it got
    /// ready. Called once at start, on the runtime that serves requests. The default is ready
    /// at once (a store in process).
    async fn warm_up(&self, deadline: Duration) -> bool {
        let _ = deadline;
        true
    }

    /// How the store stands right now.
    fn status(&self) -> StoreStatus;

    /// Whether the store is usable right now (what `/readyz` reports): [`StoreStatus::up`].
    fn is_up(&self) -> bool {
        self.status().up
    }
}

/// One answer of a shared store held to what its rule can ever say: a buggy or hostile store,
/// or a state written by the rule before a reload, cannot hold a request longer than the
/// rule's `max_delay` (nor any request of a rule that does not shape), tell a client to wait
/// beyond the rule's [`horizon`], show more quota than the rule has (beyond what a usage grant
/// can add, for a rule that takes grants), or lease more permits
/// than `wanted` (at least the check's cost; 0 for an exact check). The engine applies it to
/// every answer before using it.
pub fn bounded(check: &Check, wanted: u64, answer: (Decision, Grant)) -> (Decision, Grant) {
    let (mut d, mut g) = answer;
    let limit = &check.limit;
    let longest = horizon(limit);
    d.limit = quota(limit);
    d.reset = d.reset.min(longest);
    if d.allowed {
        // A grant (the usage API) leaves more than the limit for the rest of its window: a
        // rule that takes grants may show up to the most one grant can add on top.
        let most = if limit.algorithm().capabilities().grant {
            d.limit.saturating_add(super::algorithm::MAX_COUNT)
        } else {
            d.limit
        };
        d.remaining = d.remaining.min(most);
        d.retry_after = Duration::ZERO;
        d.delay = if limit.mode() == LeakyMode::Shape {
            d.delay.min(limit.max_delay())
        } else {
            Duration::ZERO
        };
        g.granted = g.granted.min(wanted.max(check.cost));
    } else {
        d.remaining = 0;
        // Never 0 either: a client told to retry at once would be rejected again.
        d.retry_after = d.retry_after.clamp(Duration::from_nanos(1), longest);
        d.delay = Duration::ZERO;
        g.granted = 0;
    }
    g.window_left = g.window_left.min(limit.window());
    (d, g)
}
