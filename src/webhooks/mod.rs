//! Quota webhooks (`[[webhooks]]`): a customer's systems hear before the quota runs
//! out ("threshold": a counter crossed a fraction of its limit) and when it has ("rejected").
//!
//! The request path only notices a candidate event (a decision whose count crossed a
//! threshold, or a rejection) and offers it to a bounded queue without waiting ([`observe`]).
//! Off the request path ([`deliver`]) each candidate is claimed once in the store the rule
//! counts in: a marker counter of limit 1 for the rest of the window, so that with several
//! instances on one Redis each threshold fires once per counter per window, and "rejected" at
//! most once. Claimed events are batched into one POST per webhook, signed when the webhook
//! has a `secret`, and retried with backoff (at least once: receivers de-duplicate by the
//! event's `id`). Each webhook has a bounded queue and a worker of its own, so that a receiver
//! that never answers delays and drops only its own events. A full queue drops the event,
//! counted (per webhook, by its name); a request never waits for any of it.

mod deliver;
mod event;

pub use deliver::{
    dropped_metrics, signature, webhook_metrics, DEFAULT_TIMEOUT, QUEUE, WEBHOOK_QUEUE,
};
pub use event::Event;

use std::sync::Arc;

use crate::limiter::engine::{Outcome, Verdict};
use crate::limiter::store::SharedStore;
use crate::rules::RequestView;

/// Which events a webhook receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A counter crossed one of the webhook's `thresholds` (fractions of the limit).
    Threshold,
    /// A request was rejected by the rule (at most once per counter per window).
    Rejected,
}

impl EventKind {
    /// Every event with its gateway.toml name.
    pub const NAMES: &'static [(&'static str, EventKind)] = &[
        ("threshold", EventKind::Threshold),
        ("rejected", EventKind::Rejected),
    ];

    /// The name used in gateway.toml and in the events' JSON.
    pub fn as_str(self) -> &'static str {
        crate::text::names::name_of(Self::NAMES, self)
    }
}

/// One `[[webhooks]]`, validated.
#[derive(Clone, PartialEq)]
pub struct Webhook {
    /// Its name in metrics and logs: `name`, or the URL's host (and port when given), never
    /// the path or query (which may hold a token).
    pub name: String,
    /// One delivery attempt's budget (connect, TLS, send, status line).
    pub timeout: std::time::Duration,
    /// The URL as configured (not logged: its path or query may hold a token).
    pub url: String,
    /// Host to connect to (and to send as `Host` and the TLS name).
    pub host: String,
    /// Port (default 80 / 443).
    pub port: u16,
    /// Path and query to POST to.
    pub path: String,
    /// https.
    pub tls: bool,
    /// The events it receives.
    pub events: Vec<EventKind>,
    /// Fractions of the limit, ascending, for "threshold" events.
    pub thresholds: Vec<f64>,
    /// The HMAC-SHA256 key of the signature header; never logged or sent.
    pub secret: Option<String>,
}

/// The secret is left out, so that a config printed for debugging cannot leak it.
impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook")
            .field("name", &self.name)
            .field("url", &self.url)
            .field("timeout", &self.timeout)
            .field("events", &self.events)
            .field("thresholds", &self.thresholds)
            .field("signed", &self.secret.is_some())
            .finish()
    }
}

/// Notices the candidate events of one decided request and queues them; never waits. `store`
/// is where global rules count (local rules are claimed in the same store: their counts are
/// per instance, their events too).
pub fn observe(
    webhooks: &Arc<[Webhook]>,
    store: &Arc<dyn SharedStore>,
    timeout: std::time::Duration,
    view: &RequestView<'_>,
    outcome: &Outcome,
) {
    if webhooks.is_empty() {
        return;
    }
    let to = deliver::Target {
        webhooks,
        store,
        timeout,
    };
    let rejected = !matches!(outcome.verdict, Verdict::Allow { .. });
    let wants_rejected = webhooks
        .iter()
        .any(|w| w.events.contains(&EventKind::Rejected));
    for a in &outcome.applied {
        let d = &a.decision;
        let limit = i64::try_from(d.limit).unwrap_or(i64::MAX);
        if rejected && !d.allowed && wants_rejected {
            let used = limit;
            deliver::offer(
                &to,
                event::candidate(&a.rule, a.counter, view, d, None, used),
            );
            continue;
        }
        if rejected || !d.allowed {
            // Nothing was charged: no count moved.
            continue;
        }
        let used_after = limit.saturating_sub(i64::try_from(d.remaining).unwrap_or(i64::MAX));
        let used_before = used_after.saturating_sub(i64::try_from(a.rule.cost).unwrap_or(0));
        for w in webhooks.iter() {
            if !w.events.contains(&EventKind::Threshold) {
                continue;
            }
            for &t in &w.thresholds {
                let mark = (t * d.limit as f64).ceil() as i64;
                if used_before < mark && mark <= used_after {
                    let e = event::candidate(&a.rule, a.counter, view, d, Some(t), used_after);
                    deliver::offer(&to, e);
                }
            }
        }
    }
}
