//! Response-aware rules: what a rule learns from the upstream's response (`count`, the
//! statuses it charges; `block_for`, how long a rejected key stays out), and the reservations
//! an admitted request holds until its response settles them.
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
use std::time::Duration;

use prometheus::{IntCounterVec, Opts};

use super::memory::MemoryStore;
use super::policy::Policy;
use super::store::{SharedStore, TrueUp};
use super::true_up::Adjust;
use super::Check;

/// What a rule learns from the response. The default learns nothing: every admitted request
/// is charged its cost, whatever the answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Respond {
    /// `count = { status = [...] }`: only responses with these statuses are charged.
    pub count: Option<StatusSet>,
    /// `block_for`: once the rule rejects a key, the key is refused for this long.
    pub block_for: Option<Duration>,
}

impl Respond {
    /// Whether an admitted request's charge waits for its response.
    pub fn settles(&self) -> bool {
        self.count.is_some()
    }
}

/// The statuses a `count` rule charges: codes (`401`) and classes (`"4xx"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusSet {
    entries: Vec<StatusMatch>,
}

/// One entry of a [`StatusSet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusMatch {
    /// One status code, 100..=599.
    Code(u16),
    /// A class: `4` for `"4xx"`.
    Class(u16),
}

impl StatusMatch {
    /// An entry as written in gateway.toml: a code of 100..=599, or a class `"1xx"`..`"5xx"`.
    pub fn parse_class(text: &str) -> Option<StatusMatch> {
        match text.as_bytes() {
            [d @ b'1'..=b'5', b'x' | b'X', b'x' | b'X'] => {
                Some(StatusMatch::Class(u16::from(d - b'0')))
            }
            _ => None,
        }
    }
}

impl StatusSet {
    /// A set of these entries.
    pub fn new(entries: Vec<StatusMatch>) -> Self {
        StatusSet { entries }
    }

    /// Whether `status` is charged.
    pub fn matches(&self, status: u16) -> bool {
        self.entries.iter().any(|e| match *e {
            StatusMatch::Code(c) => c == status,
            StatusMatch::Class(k) => status / 100 == k,
        })
    }
}

/// Where a reservation was charged.
enum Held {
    /// An in-process store (local rules, the memory backend, the `local` fallback), at this
    /// instant of its clock.
    Memory {
        store: Arc<MemoryStore>,
        charged_at_ns: u64,
    },
    /// The shared store, in the call made under `holder` whose window ends at `window_end_us`.
    Shared {
        store: Arc<dyn SharedStore>,
        window_end_us: u64,
        holder: u64,
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

    /// A reservation charged to the shared `store` by the call under `holder`.
    pub fn shared(
        rule: Arc<Policy>,
        check: Check,
        store: &Arc<dyn SharedStore>,
        window_end_us: u64,
        holder: u64,
    ) -> Self {
        Reservation {
            rule,
            check,
            held: Held::Shared {
                store: store.clone(),
                window_end_us,
                holder,
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

    /// Settles every reservation on the response `status`: a `count` rule's is refunded
    /// unless the status matches. Memory stores are trued up in place; the shared store in
    /// one call, awaited, so that the client's next request sees it.
    pub async fn settle(&mut self, status: u16) {
        let mut shared: Option<Arc<dyn SharedStore>> = None;
        let mut ups = Vec::new();
        for r in std::mem::take(&mut self.held) {
            let Some(count) = &r.rule.respond.count else {
                continue;
            };
            if count.matches(status) {
                metrics().settled(&r.rule.name, "charged");
                continue;
            }
            let adjust = Adjust::between(r.check.cost, 0);
            metrics().settled(&r.rule.name, "refunded");
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
                    holder,
                } => {
                    shared.get_or_insert(store);
                    ups.push(TrueUp {
                        check: r.check,
                        adjust,
                        window_end_us,
                        holder,
                    });
                }
            }
        }
        if let Some(store) = shared {
            store.true_up(&ups).await;
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
}

impl ReservationMetrics {
    fn settled(&self, rule: &str, result: &str) {
        self.settled.with_label_values(&[rule, result]).inc();
    }
}

/// The response-aware metrics, registered on first use.
pub fn metrics() -> &'static ReservationMetrics {
    static M: LazyLock<ReservationMetrics> = LazyLock::new(|| {
        let settled = IntCounterVec::new(
            Opts::new(
                "floodgate_response_settled_total",
                "Reservations of response-aware rules settled on the response, by rule and result (charged: kept; refunded: given back).",
            ),
            &["rule", "result"],
        )
        .expect("static metric definition");
        crate::metrics::metrics().register(Box::new(settled.clone()));
        ReservationMetrics { settled }
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
    }
}
