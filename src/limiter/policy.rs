//! What the limiter needs to know of a rule: how it counts (its [`Limit`], scope and cost),
//! what it does when the store fails, and how it answers. Matching and key building are the
//! rules' business (`crate::rules`); the limiter sees only this.

use std::sync::Arc;

use super::lease::Lease;
use super::Limit;
use crate::metrics::RuleCounters;

mod recent;
mod respond;
pub use recent::Recent;
pub use respond::{CostFrom, Respond, StatusMatch, StatusSet};

/// How many requests one shaping rule (`leaky_bucket`, `mode = "shape"`) may hold waiting at
/// once, per instance, unless its `max_waiting` says otherwise. Each one holds a connection
/// and its request for up to `max_delay`; past this the rule rejects (its status, counted as
/// its rejection), so a flood of keys cannot turn shaping into connection exhaustion.
pub const MAX_WAITING_PER_RULE: usize = 1000;

/// How one rule counts and answers.
#[derive(Debug)]
pub struct Policy {
    /// Unique name: shown in headers, metrics, logs; counters are keyed by it.
    pub name: Arc<str>,
    /// The algorithm and its numbers.
    pub limit: Limit,
    /// Local (per instance) or global (shared store).
    pub scope: Scope,
    /// What to do when the store fails.
    pub on_store_error: FailureMode,
    /// Units charged per request.
    pub cost: u64,
    /// Evaluate and count, never reject.
    pub shadow: bool,
    /// Show this rule in the RateLimit headers.
    pub headers: bool,
    /// Status of this rule's rejections.
    pub status: u16,
    /// Its decision counters (allowed, rejected, skipped, failure modes).
    pub counters: RuleCounters,
    /// Quota leasing (`lease`, `lease_ttl`): global rules of leasable algorithms only (see
    /// [`super::lease`]); `None`: every request is decided by the shared store.
    pub lease: Option<Lease>,
    /// How many requests a shaping rule may hold at once (`max_waiting`); other rules hold
    /// none, and leave it at the default.
    pub max_waiting: usize,
    /// What the rule learns from the response (`count`, `block_for`; see
    /// [`super::reservation`]); the default charges every admitted request.
    pub respond: Respond,
}

impl Policy {
    /// Whether an admitted request's charge can be given back in full when it never reaches
    /// the upstream (`[upstreams.protect]` shed it): the algorithms whose charge a response
    /// can true up, in police mode (a shaping departure slot cannot be given back, and a
    /// slowed request was charged nothing).
    pub fn refundable(&self) -> bool {
        self.limit
            .algorithm()
            .capabilities()
            .settle_refused
            .is_none()
            && self.limit.mode() == super::LeakyMode::Police
    }

    /// This policy counting by `limit` instead (a per-caller limit: `limit_from`, an RLS
    /// descriptor's override): the same rule, its counters and answers, other numbers.
    pub fn with_limit(&self, limit: Limit) -> Policy {
        Policy {
            name: self.name.clone(),
            limit,
            scope: self.scope,
            on_store_error: self.on_store_error,
            cost: self.cost,
            shadow: self.shadow,
            headers: self.headers,
            status: self.status,
            counters: self.counters.clone(),
            lease: None,
            max_waiting: self.max_waiting,
            respond: self.respond.clone(),
        }
    }

    /// A policy named `name` that counts by `limit` in `scope`, every other option at its
    /// gateway.toml default: fail open, cost 1, counted for real, in the headers, status 429,
    /// no lease, the default queue, charged whatever the response. For the rules tests and
    /// benchmarks build by hand; the config sets every field from the file.
    pub fn with_defaults(name: &str, limit: Limit, scope: Scope) -> Policy {
        Policy {
            name: name.into(),
            limit,
            scope,
            on_store_error: FailureMode::Open,
            cost: 1,
            shadow: false,
            headers: true,
            status: 429,
            counters: RuleCounters::for_rule(name),
            lease: None,
            max_waiting: MAX_WAITING_PER_RULE,
            respond: Respond::default(),
        }
    }
}

/// Where a rule's counters live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// In this process only: never touches the store.
    Local,
    /// In the configured store, shared by every instance.
    Global,
}

impl Scope {
    /// Every scope with its gateway.toml name.
    pub const NAMES: &'static [(&'static str, Scope)] =
        &[("local", Scope::Local), ("global", Scope::Global)];

    /// The name used in gateway.toml.
    pub fn as_str(self) -> &'static str {
        crate::text::names::name_of(Self::NAMES, self)
    }
}

/// What a global rule does when the store cannot answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureMode {
    /// Allow (and count the fail-open decision).
    Open,
    /// Refuse with 503.
    Closed,
    /// Decide in process with `limit / instances`.
    Local,
}

impl FailureMode {
    /// Every failure mode with its gateway.toml name.
    pub const NAMES: &'static [(&'static str, FailureMode)] = &[
        ("open", FailureMode::Open),
        ("closed", FailureMode::Closed),
        ("local", FailureMode::Local),
    ];

    /// The name used in gateway.toml.
    pub fn as_str(self) -> &'static str {
        crate::text::names::name_of(Self::NAMES, self)
    }
}
