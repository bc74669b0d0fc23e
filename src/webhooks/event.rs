//! One quota event: what a receiver is told (never a secret: the key's public id, its user
//! and plan), and the marker that makes it fire once per counter and window.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

use super::EventKind;
use crate::limiter::policy::Policy;
use crate::limiter::Decision;
use crate::rules::RequestView;

/// A candidate event, and once claimed, an event.
#[derive(Debug, Clone)]
pub struct Event {
    /// Threshold or rejected.
    pub kind: EventKind,
    /// The rule's name.
    pub rule: Arc<str>,
    /// The counter id (which client of the rule).
    pub counter: u64,
    /// The key's public id, user and plan, when the request had a key.
    pub api_key: Option<String>,
    /// The key's user.
    pub user: Option<String>,
    /// The key's plan.
    pub plan: Option<String>,
    /// The fraction crossed (threshold events).
    pub threshold: Option<f64>,
    /// Units counted after the request.
    pub used: i64,
    /// The rule's quota.
    pub limit: u64,
    /// Unix seconds when the window (the quota) is whole again.
    pub window_end: u64,
    /// How long the marker must live: until the window ends.
    pub ttl: Duration,
    /// Unique: receivers de-duplicate retried deliveries by it.
    pub id: String,
}

/// The candidate event of `rule`'s decision `d` for the request `view`.
pub(super) fn candidate(
    rule: &Policy,
    counter: u64,
    view: &RequestView<'_>,
    d: &Decision,
    threshold: Option<f64>,
    used: i64,
) -> Event {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let identity = view.identity;
    Event {
        kind: if threshold.is_some() {
            EventKind::Threshold
        } else {
            EventKind::Rejected
        },
        rule: rule.name.clone(),
        counter,
        api_key: identity.map(|i| i.id.as_str().to_string()),
        user: identity.map(|i| i.user.as_str().to_string()),
        plan: identity.and_then(|i| i.plan.as_ref().map(|p| p.as_str().to_string())),
        threshold,
        used,
        limit: d.limit,
        window_end: (now + d.reset).as_secs_f64().ceil() as u64,
        ttl: d.reset,
        id: format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..)),
    }
}

impl Event {
    /// The name of its once-per-window marker: the same on every instance for the same
    /// rule, counter, event and threshold.
    pub(super) fn marker(&self) -> u64 {
        let mut h = Sha256::new();
        h.update(self.rule.as_bytes());
        h.update([0]);
        h.update(self.counter.to_le_bytes());
        h.update(self.kind.as_str().as_bytes());
        h.update(self.threshold.unwrap_or(0.0).to_le_bytes());
        let digest = h.finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        u64::from_le_bytes(first)
    }

    /// The event as the receiver gets it.
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "id": self.id,
            "event": self.kind.as_str(),
            "rule": &*self.rule,
            "used": self.used,
            "limit": self.limit,
            "window_end": self.window_end,
        });
        if let Some(t) = self.threshold {
            v["threshold"] = t.into();
        }
        for (name, value) in [
            ("api_key", &self.api_key),
            ("user", &self.user),
            ("plan", &self.plan),
        ] {
            if let Some(value) = value {
                v[name] = value.as_str().into();
            }
        }
        v
    }
}
