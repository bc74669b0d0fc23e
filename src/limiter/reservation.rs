//! Response-aware rules: the reservations an admitted request holds until its response
//! settles them (what a rule learns from the response, `count`, `cost_from` and `block_for`,
//! is part of its policy: [`super::policy::Respond`]).
//!
//! Reserve, then true up: a request is admitted against its rule's budget and charged its
//! `cost` at once (the reservation), exactly as any rule, so that concurrent requests can never
//! together pass the limit. When the response is known the reservation is trued up
//! ([`super::true_up`]): a `count` rule refunds it unless the status matches. The refund goes
//! to the store and window the reservation was charged in, before the response head is sent
//! to the client, so the client's next request already sees it. A request whose response
//! never comes (client gone, upstream failure without a matching status) keeps its
//! reservation: an attacker cannot escape the count by hanging up.

use std::sync::{Arc, LazyLock};

use prometheus::{IntCounterVec, Opts};

use super::lease::{LeaseTable, Stamp};
use super::memory::MemoryStore;
use super::policy::Policy;
pub use super::policy::{CostFrom, Respond, StatusMatch, StatusSet};
use super::store::{Grant, SharedStore, TrueUp};
use super::true_up::Adjust;
use super::Check;

/// Where a reservation was charged.
enum Held {
    /// An in-process store (local rules, the memory backend, the `local` fallback), at this
    /// instant of its clock.
    Memory {
        store: Arc<MemoryStore>,
        charged_at_ns: u64,
    },
    /// The shared store, in the call made under `holder` at `charged_at_us` (the store's
    /// time) whose window ends at `window_end_us`.
    Shared {
        store: Arc<dyn SharedStore>,
        window_end_us: u64,
        charged_at_us: u64,
        holder: u64,
    },
    /// A quota lease of this instance (`lease`): the permits were charged to the shared store
    /// with the lease named by `stamp`, and spent in process.
    Leased {
        table: Arc<LeaseTable>,
        store: Arc<dyn SharedStore>,
        stamp: Stamp,
    },
}

/// One admitted rule's reservation, waiting for the response.
pub struct Reservation {
    rule: Arc<Policy>,
    check: Check,
    held: Held,
}

impl Reservation {
    /// A reservation charged to an in-process `store` just now.
    pub fn memory(rule: Arc<Policy>, check: Check, store: &Arc<MemoryStore>) -> Self {
        let charged_at_ns = store.now_ns();
        Reservation {
            rule,
            check,
            held: Held::Memory {
                store: store.clone(),
                charged_at_ns,
            },
        }
    }

    /// A reservation charged to the shared `store` by the call under `holder`, which answered
    /// `grant` for it.
    pub fn shared(
        rule: Arc<Policy>,
        check: Check,
        store: &Arc<dyn SharedStore>,
        grant: Grant,
        holder: u64,
    ) -> Self {
        Reservation {
            rule,
            check,
            held: Held::Shared {
                store: store.clone(),
                window_end_us: grant.window_end_us,
                charged_at_us: grant.charged_at_us,
                holder,
            },
        }
    }
}

impl Reservation {
    /// A reservation spent from this instance's quota lease `stamp` (of `table`), whose
    /// permits `store` charged.
    pub fn leased(
        rule: Arc<Policy>,
        check: Check,
        table: &Arc<LeaseTable>,
        store: &Arc<dyn SharedStore>,
        stamp: Stamp,
    ) -> Self {
        Reservation {
            rule,
            check,
            held: Held::Leased {
                table: table.clone(),
                store: store.clone(),
                stamp,
            },
        }
    }
}

/// The reservations of one request. Dropped unsettled, they stay charged.
#[derive(Default)]
pub struct Reservations {
    held: Vec<Reservation>,
}

impl Reservations {
    /// Adds one.
    pub fn push(&mut self, r: Reservation) {
        self.held.push(r);
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Where the `cost_from` rules among them read their cost (each source once).
    pub fn cost_sources(&self) -> Vec<CostFrom> {
        let mut out: Vec<CostFrom> = Vec::new();
        for r in &self.held {
            if let Some(from) = &r.rule.respond.cost_from {
                if !out.contains(from) {
                    out.push(from.clone());
                }
            }
        }
        out
    }

    /// Gives every reservation back in full: the request was refused before it reached the
    /// upstream (`[upstreams.protect]` shed it), so no rule charges it. Awaited, as
    /// [`Reservations::settle`].
    pub async fn refund_all(&mut self) {
        let all = std::mem::take(&mut self.held).into_iter().map(|r| {
            let adjust = Adjust::between(r.check.cost, 0);
            (adjust, r, false)
        });
        apply(all.collect()).await;
    }

    /// Settles the `count` rules' reservations on the response `status`: each is refunded
    /// unless the status matches (`cost_from` rules wait for [`Reservations::settle_costs`]).
    /// Memory stores are trued up in place; the shared store in one call, awaited, so that
    /// the client's next request sees it.
    pub async fn settle(&mut self, status: u16) {
        let (counted, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|r| r.rule.respond.count.is_some());
        self.held = rest;
        let settled = counted.into_iter().map(|r| {
            let matched = r
                .rule
                .respond
                .count
                .as_ref()
                .is_some_and(|c| c.matches(status));
            let adjust = if matched {
                Adjust::default()
            } else {
                Adjust::between(r.check.cost, 0)
            };
            (adjust, r, false)
        });
        apply(settled.collect()).await;
    }

    /// Settles the `cost_from` rules' reservations at the true cost `cost_of` their source
    /// read: the difference is refunded or charged on top. A source that read nothing (no
    /// such header or path, a body past the bound, the client gone first) settles at the
    /// reservation, counted in `floodgate_cost_unread_total`.
    pub async fn settle_costs(&mut self, cost_of: impl Fn(&CostFrom) -> Option<u64>) {
        let mut settled = Vec::new();
        for r in std::mem::take(&mut self.held) {
            let Some(from) = &r.rule.respond.cost_from else {
                continue;
            };
            match cost_of(from) {
                Some(cost) => {
                    let adjust = Adjust::between(r.check.cost, cost.min(MAX_COST));
                    settled.push((adjust, r, false));
                }
                None => settled.push((Adjust::default(), r, true)),
            }
        }
        apply(settled).await;
    }
}

/// The largest true cost a response may claim: the most a rule may count (10^15), so that a
/// hostile upstream's number stays exact in the stores.
const MAX_COST: u64 = super::algorithm::MAX_COUNT;

/// Applies `settled` (each with whether its cost was unread): memory stores in place, the
/// shared store in one call; then counts them, so that a settled count in the metrics means
/// the store has it.
async fn apply(settled: Vec<(Adjust, Reservation, bool)>) {
    let mut shared: Option<Arc<dyn SharedStore>> = None;
    let mut ups = Vec::new();
    let mut counted = Vec::with_capacity(settled.len());
    for (adjust, r, unread) in settled {
        let result = if adjust.extra > 0 {
            "charged_extra"
        } else if adjust.refund > 0 {
            "refunded"
        } else {
            "charged"
        };
        // Only response-aware rules are counted: a plain rule's reservation is given back
        // only when `[upstreams.protect]` sheds the request.
        if r.rule.respond.settles() {
            counted.push((r.rule.name.clone(), result, unread));
        }
        if adjust.is_none() {
            continue;
        }
        match r.held {
            Held::Memory {
                store,
                charged_at_ns,
            } => {
                store.true_up(&r.check, charged_at_ns, adjust);
            }
            Held::Shared {
                store,
                window_end_us,
                charged_at_us,
                holder,
            } => {
                shared.get_or_insert(store);
                ups.push(TrueUp {
                    check: r.check,
                    adjust,
                    window_end_us,
                    charged_at_us,
                    holder,
                });
            }
            // A refund goes back into the lease the permits came from while it is the key's
            // (exact: they were this instance's, unspent after all); once the key has
            // another lease, to the store's window, as an unleased reservation's would.
            Held::Leased {
                table,
                store,
                stamp,
            } => {
                if adjust.extra == 0 && table.refund(&r.check, adjust.refund, stamp) {
                    continue;
                }
                shared.get_or_insert(store);
                ups.push(TrueUp {
                    check: r.check,
                    adjust,
                    window_end_us: stamp.window_end_us,
                    charged_at_us: stamp.charged_at_us,
                    holder: 0,
                });
            }
        }
    }
    if let Some(store) = shared {
        store.true_up(&ups).await;
    }
    let m = metrics();
    for (rule, result, unread) in counted {
        m.settled(&rule, result);
        if unread {
            m.unread.with_label_values(&[&rule]).inc();
        }
    }
}

impl std::fmt::Debug for Reservations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservations")
            .field("held", &self.held.len())
            .finish()
    }
}

/// The metrics of response-aware rules.
pub struct ReservationMetrics {
    /// `floodgate_response_settled_total{rule,result}`: reservations settled on the response
    /// (`charged`: kept; `refunded`: given back).
    settled: IntCounterVec,
    /// `floodgate_cost_unread_total{rule}`: `cost_from` responses whose cost could not be
    /// read, settled at the reservation.
    unread: IntCounterVec,
}

impl ReservationMetrics {
    fn settled(&self, rule: &str, result: &str) {
        self.settled.with_label_values(&[rule, result]).inc();
    }
}

/// Exports the series of a response-aware `rule` at 0 (when its config is put in force), so
/// that a panel shows 0 rather than no data.
pub fn register_series(rule: &Policy) {
    if !rule.respond.settles() {
        return;
    }
    let m = metrics();
    for result in ["charged", "refunded", "charged_extra"] {
        m.settled.with_label_values(&[&rule.name, result]);
    }
    if rule.respond.cost_from.is_some() {
        m.unread.with_label_values(&[&rule.name]);
    }
}

/// The response-aware metrics, registered on first use.
pub fn metrics() -> &'static ReservationMetrics {
    static M: LazyLock<ReservationMetrics> = LazyLock::new(|| {
        let settled = IntCounterVec::new(
            Opts::new(
                "floodgate_response_settled_total",
                "Reservations of response-aware rules settled on the response, by rule and result (charged: kept as reserved; refunded: given back, all or part; charged_extra: a true cost above the reservation charged on top).",
            ),
            &["rule", "result"],
        )
        .expect("static metric definition");
        let unread = IntCounterVec::new(
            Opts::new(
                "floodgate_cost_unread_total",
                "Responses of cost_from rules whose cost could not be read (no such header or path, past the inspected bytes, client gone first), settled at the reservation, by rule.",
            ),
            &["rule"],
        )
        .expect("static metric definition");
        crate::metrics::metrics().register(Box::new(settled.clone()));
        crate::metrics::metrics().register(Box::new(unread.clone()));
        ReservationMetrics { settled, unread }
    });
    &M
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_match_codes_and_classes() {
        let set = StatusSet::new(vec![
            StatusMatch::Code(401),
            StatusMatch::parse_class("5xx").expect("class"),
        ]);
        assert!(set.matches(401) && set.matches(503));
        assert!(!set.matches(403) && !set.matches(200));
        assert_eq!(StatusMatch::parse_class("6xx"), None);
        assert_eq!(StatusMatch::parse_class("40x"), None);
        assert_eq!(set.to_config_string(), "401, 5xx");
    }
}
