//! Who is being limited right now: per rule, the clients with the most rejected and the most
//! admitted requests over the last minute and the last hour, in bounded memory whatever the
//! number of distinct clients.
//!
//! Per-client Prometheus series would explode its cardinality, so the counting happens here,
//! with the Space-Saving heavy-hitters sketch (Metwally, Agrawal, El Abbadi, 2005): a sketch
//! holds at most [`COUNTERS`] (k) counters; a client not held replaces the smallest counter and
//! inherits its count as its possible over-count. Over a stream of N requests every client with
//! more than N/k of them is held, and every held count is at least the true count and at most
//! N/k above it.
//!
//! Windows slide by buckets: "1m" merges six 10-second buckets (the last 50 to 60 seconds),
//! "1h" twelve 5-minute buckets (the last 55 to 60 minutes). Merging keeps the guarantee for
//! the window's total N (see [`RuleTop::top`]). Each rule also keeps its admitted and rejected
//! counts per second for the last [`SERIES_SECONDS`] seconds, for the dashboard's charts.
//!
//! The request path calls [`record`] once per request after the limiter decided (a few
//! hundred nanoseconds: one hash of the key's values, then per applying rule one uncontended
//! lock and two counter updates; nothing is allocated for a client that is already held).
//! State is keyed by rule name, so it survives reloads like the counters do.
//!
//! [`sketch`]: the Space-Saving sketch itself; [`label`]: how a client is named (credentials
//! as a digest); this module: the windows, the per-second series and the blocked keys of each
//! rule, recorded on the request path and read by the admin port's `/top`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Mutex, RwLock};

use crate::config::Config;
use crate::limiter::engine::{Applied, Outcome, Verdict};
use crate::limiter::policy::{Policy, Recent};
use crate::metrics::shards::ShardedU64;
use crate::rules::RequestView;

mod label;
mod sketch;
pub use label::{client_label, descriptor_label};
pub use sketch::SpaceSaving;

/// Counters per sketch (k of Space-Saving). 64 is plenty to name who is being limited, and it
/// keeps the eviction scan (a linear pass over 64 counts) short.
pub const COUNTERS: usize = 64;

/// Seconds of per-second history each rule keeps for the dashboard's charts.
pub const SERIES_SECONDS: usize = 300;

/// Longest value shown for a key part taken from the request (header, query, path), in bytes:
/// request data is shown, but a client cannot make the admin page carry its whole header.
pub const MAX_SHOWN_VALUE: usize = 64;

/// The readable key parts of one client under one rule, as `(part, value)`: `("ip",
/// "10.0.0.7")`, `("api_key", "acme-prod")` (the key id, never the secret). Values of
/// `header:` and `query:` parts that carry credentials are shown as a digest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Client {
    /// The parts in the rule's key order.
    pub parts: Vec<(String, String)>,
}

/// Which window of [`RuleTop::top`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// The last minute (50 to 60 s: six 10-second buckets).
    Minute,
    /// The last hour (55 to 60 min: twelve 5-minute buckets).
    Hour,
}

impl Window {
    /// Every window with its query name.
    pub const NAMES: &'static [(&'static str, Window)] =
        &[("1m", Window::Minute), ("1h", Window::Hour)];

    /// Its query name.
    pub fn as_str(self) -> &'static str {
        crate::text::names::name_of(Self::NAMES, self)
    }

    fn index(self) -> usize {
        match self {
            Window::Minute => 0,
            Window::Hour => 1,
        }
    }
}

/// `(bucket seconds, buckets)` of each window, by [`Window::index`].
const WINDOWS: [(u64, usize); 2] = [(10, 6), (300, 12)];

/// What [`RuleTop::top`] ranks by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    /// Requests this rule rejected.
    Rejected,
    /// Requests admitted while this rule applied.
    Admitted,
}

impl By {
    /// Every ranking with its query name.
    pub const NAMES: &'static [(&'static str, By)] =
        &[("rejected", By::Rejected), ("admitted", By::Admitted)];

    /// Its query name.
    pub fn as_str(self) -> &'static str {
        crate::text::names::name_of(Self::NAMES, self)
    }
}

/// One bucket of a window: who was admitted and who was rejected in it.
#[derive(Debug)]
struct Bucket {
    /// `now / bucket seconds` when it was last written; a bucket of an older epoch is stale.
    epoch: u64,
    admitted: SpaceSaving<Arc<Client>>,
    rejected: SpaceSaving<Arc<Client>>,
}

/// One rule's sketches and per-second history. Times are whole seconds on the caller's clock.
#[derive(Debug)]
pub struct RuleTop {
    windows: [Vec<Bucket>; 2],
    /// Per second, `(second, admitted, rejected)`, at `second % SERIES_SECONDS`.
    series: Vec<(u64, u64, u64)>,
    /// Keys a `block_for` rule keeps out now: counter → (Unix millisecond the block ends,
    /// who). At most
    /// [`BLOCKED_SHOWN`]: past it, the block ending first makes room.
    blocked: HashMap<u64, (u64, Arc<Client>)>,
}

/// How many blocked keys a rule's `/top` remembers (the store holds every block; this is what
/// is shown of them).
pub const BLOCKED_SHOWN: usize = 256;

impl Default for RuleTop {
    fn default() -> Self {
        let window = |(_, n): (u64, usize)| {
            (0..n)
                .map(|_| Bucket {
                    epoch: u64::MAX,
                    admitted: SpaceSaving::new(COUNTERS),
                    rejected: SpaceSaving::new(COUNTERS),
                })
                .collect()
        };
        RuleTop {
            windows: [window(WINDOWS[0]), window(WINDOWS[1])],
            series: Vec::new(),
            blocked: HashMap::new(),
        }
    }
}

/// A client in a top list.
#[derive(Debug, Clone)]
pub struct Ranked {
    /// Who.
    pub client: Arc<Client>,
    /// The ranked count: at least the true count, at most `error` above it.
    pub count: u64,
    /// How much `count` may over-count.
    pub error: u64,
    /// Admitted requests counted for it in the window (its admitted sketches' counts).
    pub admitted: u64,
    /// Rejected requests counted for it in the window (its rejected sketches' counts).
    pub rejected: u64,
}

/// A top list and what bounds its error.
#[derive(Debug, Clone)]
pub struct TopList {
    /// Requests of the ranked kind in the window (N).
    pub total: u64,
    /// N / k: every client with more requests than this is listed, and no count is more than
    /// this above the truth.
    pub bound: u64,
    /// The clients, highest count first.
    pub clients: Vec<Ranked>,
}

impl RuleTop {
    /// Counts one request of `client` (identified by `hash`) at second `now`.
    pub fn record(
        &mut self,
        now: u64,
        hash: u64,
        admitted: bool,
        label: &mut dyn FnMut() -> Arc<Client>,
    ) {
        for (w, &(len, _)) in WINDOWS.iter().enumerate() {
            let epoch = now / len;
            let buckets = &mut self.windows[w];
            let n = buckets.len() as u64;
            let b = &mut buckets[(epoch % n) as usize];
            if b.epoch != epoch {
                b.epoch = epoch;
                b.admitted.clear();
                b.rejected.clear();
            }
            let sketch = if admitted {
                &mut b.admitted
            } else {
                &mut b.rejected
            };
            sketch.offer(hash, 1, &mut *label);
        }
        if self.series.is_empty() {
            self.series = vec![(u64::MAX, 0, 0); SERIES_SECONDS];
        }
        let slot = &mut self.series[(now % SERIES_SECONDS as u64) as usize];
        if slot.0 != now {
            *slot = (now, 0, 0);
        }
        if admitted {
            slot.1 += 1;
        } else {
            slot.2 += 1;
        }
    }

    /// The top `limit` clients by `by` over `window` at second `now`.
    ///
    /// Merging buckets keeps Space-Saving's guarantee for the window's total N: a client's
    /// count is the sum over buckets of its count where held and of the bucket's
    /// [`SpaceSaving::floor`] where not, so it over-counts by at most Σ floor_j ≤ Σ N_j/k =
    /// N/k; and a client with more than N/k in the window has more than N_j/k in some bucket
    /// j, where it is therefore held, so it is a candidate.
    pub fn top(&self, now: u64, window: Window, by: By, limit: usize) -> TopList {
        let (len, n) = WINDOWS[window.index()];
        let epoch = now / len;
        let live: Vec<&Bucket> = self.windows[window.index()]
            .iter()
            .filter(|b| b.epoch <= epoch && epoch - b.epoch < n as u64)
            .collect();
        fn ranked(b: &Bucket, by: By) -> &SpaceSaving<Arc<Client>> {
            match by {
                By::Rejected => &b.rejected,
                By::Admitted => &b.admitted,
            }
        }
        let total: u64 = live.iter().map(|b| ranked(b, by).total()).sum();
        let mut candidates: HashMap<u64, Arc<Client>> = HashMap::new();
        for b in &live {
            for (h, _, _, label) in ranked(b, by).entries() {
                candidates.entry(h).or_insert_with(|| label.clone());
            }
        }
        let mut clients: Vec<Ranked> = candidates
            .into_iter()
            .map(|(h, client)| {
                let (mut upper, mut lower, mut admitted, mut rejected) = (0, 0, 0, 0);
                for b in &live {
                    let s = ranked(b, by);
                    match s.get(h) {
                        Some((c, e)) => {
                            upper += c;
                            lower += c - e;
                        }
                        None => upper += s.floor(),
                    }
                    admitted += b.admitted.get(h).map_or(0, |(c, _)| c);
                    rejected += b.rejected.get(h).map_or(0, |(c, _)| c);
                }
                match by {
                    By::Rejected => rejected = upper,
                    By::Admitted => admitted = upper,
                }
                Ranked {
                    client,
                    count: upper,
                    error: upper - lower,
                    admitted,
                    rejected,
                }
            })
            .collect();
        clients.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then_with(|| a.client.parts.cmp(&b.client.parts))
        });
        clients.truncate(limit);
        TopList {
            total,
            bound: total / COUNTERS as u64,
            clients,
        }
    }

    /// Notes that the key `hash` is blocked until `until` (a `block_for` rule refused it at
    /// `now`; both Unix milliseconds).
    pub fn block(
        &mut self,
        now: u64,
        hash: u64,
        until: u64,
        label: &mut dyn FnMut() -> Arc<Client>,
    ) {
        if let Some(entry) = self.blocked.get_mut(&hash) {
            entry.0 = entry.0.max(until);
            return;
        }
        if self.blocked.len() >= BLOCKED_SHOWN {
            self.blocked.retain(|_, (end, _)| *end > now);
        }
        if self.blocked.len() >= BLOCKED_SHOWN {
            let first = self.blocked.iter().min_by_key(|(_, (end, _))| *end);
            match first.map(|(h, (end, _))| (*h, *end)) {
                Some((h, end)) if end < until => {
                    self.blocked.remove(&h);
                }
                // Every remembered block outlasts this one: it is the one left out.
                _ => return,
            }
        }
        self.blocked.insert(hash, (until, label()));
    }

    /// The keys blocked at `now` (Unix milliseconds), the longest block first: `(who, Unix
    /// millisecond it ends)`.
    pub fn blocked(&self, now: u64) -> Vec<(Arc<Client>, u64)> {
        let mut live: Vec<(Arc<Client>, u64)> = self
            .blocked
            .values()
            .filter(|(end, _)| *end > now)
            .map(|(end, client)| (client.clone(), *end))
            .collect();
        live.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.parts.cmp(&b.0.parts)));
        live
    }

    /// `(admitted, rejected)` per second for the `SERIES_SECONDS` seconds ending at `now`
    /// (inclusive), oldest first.
    pub fn series(&self, now: u64) -> (Vec<u64>, Vec<u64>) {
        let mut admitted = Vec::with_capacity(SERIES_SECONDS);
        let mut rejected = Vec::with_capacity(SERIES_SECONDS);
        let start = (now + 1).saturating_sub(SERIES_SECONDS as u64);
        for s in start..=now {
            match self.series.get((s % SERIES_SECONDS as u64) as usize) {
                Some(&(at, a, r)) if at == s => {
                    admitted.push(a);
                    rejected.push(r);
                }
                _ => {
                    admitted.push(0);
                    rejected.push(0);
                }
            }
        }
        (admitted, rejected)
    }
}

/// Every rule's [`RuleTop`], by rule name, and the process-wide request totals.
pub struct Top {
    rules: RwLock<HashMap<Arc<str>, Arc<Mutex<RuleTop>>>>,
    started: Instant,
    started_unix: u64,
    /// Requests that had at least one applying rule decided (in per-thread shards: every such
    /// request adds to it).
    pub decided: ShardedU64,
    /// Of those, the ones whose decision asked the shared store (a global rule on the Redis
    /// backend in force, not covered by a lease): each is one round trip (one per hash slot on
    /// a cluster), so `store_requests / decided` is the share of requests that cost a round trip.
    pub store_requests: ShardedU64,
}

/// A rule's state, as the table and the threads' handles hold it.
type Shared = Arc<Mutex<RuleTop>>;

thread_local! {
    /// The calling thread's handles on the states it recorded into last, with their policies.
    static RECENT: RefCell<Recent<Shared>> = const { RefCell::new(Recent::new()) };
}

static TOP: LazyLock<Top> = LazyLock::new(|| Top {
    rules: RwLock::new(HashMap::new()),
    started: Instant::now(),
    started_unix: SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()),
    decided: ShardedU64::default(),
    store_requests: ShardedU64::default(),
});

/// The process-wide top-clients state.
pub fn top() -> &'static Top {
    &TOP
}

impl Top {
    /// Now, in Unix seconds on a monotonic clock (so windows never run backwards).
    pub fn now(&self) -> u64 {
        self.at(Instant::now())
    }

    /// [`Top::now`] in milliseconds: when blocks end.
    pub fn now_ms(&self) -> u64 {
        self.at_ms(Instant::now())
    }

    /// `instant` in the Unix seconds of [`Top::now`].
    pub fn at(&self, instant: Instant) -> u64 {
        self.started_unix + instant.saturating_duration_since(self.started).as_secs()
    }

    /// `instant` in the Unix milliseconds of [`Top::now_ms`].
    pub fn at_ms(&self, instant: Instant) -> u64 {
        let since = instant.saturating_duration_since(self.started).as_millis();
        self.started_unix * 1000 + since as u64
    }

    /// The state of rule `name`, if it has recorded anything.
    pub fn rule(&self, name: &str) -> Option<Arc<Mutex<RuleTop>>> {
        self.rules.read().get(name).cloned()
    }

    fn rule_or_new(&self, name: &Arc<str>) -> Arc<Mutex<RuleTop>> {
        if let Some(r) = self.rules.read().get(name) {
            return r.clone();
        }
        self.rules.write().entry(name.clone()).or_default().clone()
    }

    /// Runs `f` on the state of `policy`'s rule, made if new. The calling thread keeps a
    /// handle on the states of the last policies it recorded for ([`Recent`]), so that a
    /// request's record takes no lock but its rule's own and writes no shared reference count
    /// (the table's read lock and the state's `Arc` were written by every thread's every
    /// request). A handle is held with its policy, so a reload's new policy looks its rule up
    /// by name again: a rule kept by name keeps its state.
    fn with_rule<R>(&self, policy: &Arc<Policy>, f: impl FnOnce(&mut RuleTop) -> R) -> R {
        let make = || self.rule_or_new(&policy.name);
        Recent::with_kept(&RECENT, policy, make, |state| f(&mut state.lock()))
            // The thread is going away (or a record nested in a record): no handle kept.
            .unwrap_or_else(|f| f(&mut self.rule_or_new(&policy.name)))
    }

    /// Drops the state of rules `config` no longer has (called when a config is put in force:
    /// a rule kept by name keeps its history).
    pub fn retain_rules(&self, config: &Config) {
        self.rules.write().retain(|name, _| {
            config.rules.iter().any(|r| r.name == *name)
                || config
                    .rls
                    .as_ref()
                    .is_some_and(|rls| rls.limits.iter().any(|l| l.policy.name == *name))
        });
    }
}

/// Records what each enforcing rule decided for this request: the rules that rejected it
/// count a rejection, and when the request was admitted every applying rule counts an
/// admission. Called by admission once the limiter has decided, at `decided` (the instant the
/// decision's duration was measured with: no second clock read per request); does nothing when
/// `[server] top_clients = false`.
pub fn record(cfg: &Config, view: &RequestView<'_>, outcome: &Outcome, decided: Instant) {
    record_labelled(cfg, outcome, decided, &|a: &Applied| {
        // The rule's key parts are on the rule, which the outcome names by its policy.
        let rule = cfg.rule_of(&a.rule);
        rule.map_or_else(Client::default, |r| client_label(cfg, r, view))
    });
}

/// [`record`] with the client of each applied rule named by `label` (the Envoy rate-limit
/// service names descriptors), asked only for a client a sketch is about to list.
pub fn record_labelled(
    cfg: &Config,
    outcome: &Outcome,
    decided: Instant,
    label: &dyn Fn(&Applied) -> Client,
) {
    if !cfg.server.top_clients || outcome.applied.is_empty() {
        return;
    }
    let t = top();
    let admitted = match outcome.verdict {
        Verdict::Allow { .. } => true,
        // Slowed: limited like a rejection, shown among the rule's rejected clients.
        Verdict::Reject { .. } | Verdict::Slow { .. } => false,
        // The store failed and a rule is closed: nobody was limited by a rule's count.
        Verdict::Unavailable { .. } => return,
    };
    t.decided.inc_by(1);
    if outcome.asked_store {
        t.store_requests.inc_by(1);
    }
    let now = t.at(decided);
    for a in &outcome.applied {
        if !admitted && a.decision.allowed {
            // Rejected by another rule: this one neither admitted nor rejected it.
            continue;
        }
        // The client is the counter the request charged: the digest of the rule's key values.
        let mut shown: Option<Arc<Client>> = None;
        let mut make = || shown.get_or_insert_with(|| Arc::new(label(a))).clone();
        t.with_rule(&a.rule, |state| {
            state.record(now, a.counter, admitted, &mut make);
            if !a.decision.allowed && !a.rule.limit.block_for().is_zero() {
                // A refusal of a blocking rule: the key is kept out until its Retry-After.
                let now_ms = t.at_ms(decided);
                let until = now_ms + a.decision.retry_after.as_millis() as u64;
                state.block(now_ms, a.counter, until, &mut make);
            }
        });
    }
}

#[cfg(test)]
mod tests;
