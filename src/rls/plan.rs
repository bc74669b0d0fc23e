//! A request's descriptors as the engine's checks: which limit each falls under, the counter
//! it charges, and what it costs. Descriptors that charge the same counter of the same limit
//! are one check (their costs added), so that a request cannot pass twice under a counter it
//! fills once.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::RateLimitOverride, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use sha2::{Digest, Sha256};
use tonic::Status;

use super::limits::{RlsLimit, Settings};
use super::metrics::{rls_metrics, OTHER_DOMAIN};
use crate::limiter::algorithm::MAX_COUNT;
use crate::limiter::policy::Policy;
use crate::limiter::{Check, LeakyMode, Limit};
use crate::rules::MAX_KEY_VALUE;

/// One counter a request charges.
#[derive(Debug)]
pub struct Group {
    /// The limit (for its descriptor keys, in `/top`).
    pub limit: Arc<RlsLimit>,
    /// The policy it is decided under: the limit's, or one for the descriptor's override.
    pub policy: Arc<Policy>,
    /// The store check.
    pub check: Check,
    /// The override it was asked with, if any (`requests_per_unit`, `unit`).
    over: Option<(u32, i32)>,
    /// The first descriptor of the group (its values label the client in `/top`).
    pub first: usize,
}

/// A request's descriptors, planned.
#[derive(Debug, Default)]
pub struct Planned {
    /// Per descriptor, in order: the index of its group, `None` when no limit matched.
    pub per_descriptor: Vec<Option<usize>>,
    /// The counters to decide, in the order their first descriptor came.
    pub groups: Vec<Group>,
}

impl Planned {
    /// What the engine decides: each group's policy and check.
    pub fn applying(&self) -> Vec<(Arc<Policy>, Check)> {
        self.groups
            .iter()
            .map(|g| (g.policy.clone(), g.check.clone()))
            .collect()
    }
}

/// Plans `req` (already within [`super::bounds`]) under `settings`. `Err` for an override no
/// limit can be (no unit, zero requests): nothing is charged.
pub fn plan(settings: &Settings, req: &RateLimitRequest) -> Result<Planned, Status> {
    let mut out = Planned {
        per_descriptor: Vec::with_capacity(req.descriptors.len()),
        groups: Vec::new(),
    };
    let known = settings.knows_domain(&req.domain);
    for (i, d) in req.descriptors.iter().enumerate() {
        let entries = || d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str()));
        let Some(limit) = settings.limit_for(&req.domain, entries) else {
            let label = if known {
                req.domain.as_str()
            } else {
                OTHER_DOMAIN
            };
            rls_metrics().unmatched.with_label_values(&[label]).inc();
            out.per_descriptor.push(None);
            continue;
        };
        let over = d.limit.map(|o| (o.requests_per_unit, o.unit));
        let policy = match &d.limit {
            Some(o) => overridden(limit, o, i)?,
            None => limit.policy.clone(),
        };
        let counter = counter_id(d, policy.limit.window(), over);
        let cost = cost(req, d, &policy);
        let same = out.groups.iter().position(|g| {
            Arc::ptr_eq(&g.limit, limit) && g.over == over && g.check.counter == counter
        });
        match same {
            Some(g) => {
                let check = &mut out.groups[g].check;
                check.cost = check.cost.saturating_add(cost).min(MAX_COUNT);
                out.per_descriptor.push(Some(g));
            }
            None => {
                out.per_descriptor.push(Some(out.groups.len()));
                out.groups.push(Group {
                    limit: limit.clone(),
                    check: Check {
                        rule: policy.name.clone(),
                        counter,
                        limit: policy.limit.clone(),
                        cost,
                    },
                    policy,
                    over,
                    first: i,
                });
            }
        }
    }
    Ok(out)
}

/// What a descriptor costs: its own `hits_addend`, else the request's, else the limit's
/// `cost`; 0 counts as not given (Envoy sends 0 for "one request"). Capped where the stores
/// count exactly; a cost above the limit's capacity is simply over the limit.
fn cost(req: &RateLimitRequest, d: &RateLimitDescriptor, policy: &Policy) -> u64 {
    let own = d.hits_addend.map(|h| h.value).filter(|&v| v > 0);
    let request = Some(u64::from(req.hits_addend)).filter(|&v| v > 0);
    own.or(request).unwrap_or(policy.cost).min(MAX_COUNT)
}

/// The counter a descriptor charges: a digest of its values (each capped at
/// [`MAX_KEY_VALUE`] bytes and length-prefixed, so values cannot shift into one another), the
/// window (a changed window starts over, as for rules) and the override, which counts apart
/// from the limit's own numbers (as envoyproxy/ratelimit does).
fn counter_id(d: &RateLimitDescriptor, window: Duration, over: Option<(u32, i32)>) -> u64 {
    let mut h = Sha256::new();
    for e in &d.entries {
        let v = &e.value.as_bytes()[..e.value.len().min(MAX_KEY_VALUE)];
        h.update((v.len() as u32).to_le_bytes());
        h.update(v);
    }
    h.update([0xff]);
    h.update(window.as_nanos().to_le_bytes());
    if let Some((n, unit)) = over {
        h.update([0xfe]);
        h.update(n.to_le_bytes());
        h.update(unit.to_le_bytes());
    }
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(first)
}

/// The length of one of Envoy's `RateLimitUnit`s (a month is 30 days and a year 365, as
/// envoyproxy/ratelimit counts them), or `None` for `UNKNOWN` and values it does not define.
pub fn unit_length(unit: i32) -> Option<Duration> {
    let secs = match unit {
        1 => 1,
        2 => 60,
        3 => 3_600,
        4 => 86_400,
        5 => 30 * 86_400,
        6 => 365 * 86_400,
        7 => 7 * 86_400,
        _ => return None,
    };
    Some(Duration::from_secs(secs))
}

/// The limit's policy with the descriptor's `limit` override: `requests_per_unit` per unit
/// (and as the bucket size), the limit's algorithm and every other option kept (`block_for`
/// too); no lease (a lease is sized for the limit's own numbers) and no calendar (the unit is
/// the window).
fn overridden(limit: &RlsLimit, o: &RateLimitOverride, i: usize) -> Result<Arc<Policy>, Status> {
    let window = unit_length(o.unit).ok_or_else(|| {
        Status::invalid_argument(format!(
            "descriptor {i}: the limit override has no known unit ({})",
            o.unit
        ))
    })?;
    if o.requests_per_unit == 0 {
        return Err(Status::invalid_argument(format!(
            "descriptor {i}: the limit override's requests_per_unit must be at least 1"
        )));
    }
    let n = u64::from(o.requests_per_unit);
    let p = &limit.policy;
    // The cap validation puts on a written limit (sliding_window_log keeps one entry per
    // admitted request): a client's override must not lift it.
    if let Some(cap) = p.limit.algorithm().capabilities().limit_cap {
        if n > cap.max {
            return Err(Status::invalid_argument(format!(
                "descriptor {i}: the limit override's requests_per_unit is at most {} here: {}",
                cap.max, cap.why
            )));
        }
    }
    let numbers = Limit::new(
        p.limit.algorithm(),
        n,
        window,
        n,
        LeakyMode::Police,
        Duration::ZERO,
    )
    .map_err(|e| Status::invalid_argument(format!("descriptor {i}: the limit override: {e}")))?
    // A value the limit's own numbers would block is blocked under an override's too.
    .blocking(p.limit.block_for());
    Ok(Arc::new(p.with_limit(numbers)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::policy::Scope;
    use crate::limiter::Algorithm;
    use crate::rls::limits::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry as ReqEntry;
    use envoy_types::pb::google::protobuf::UInt64Value;

    fn settings() -> Settings {
        let limit = |name: &str, key: &str| {
            Arc::new(RlsLimit {
                domain: "edge".into(),
                entries: vec![Entry {
                    key: key.into(),
                    value: None,
                }],
                policy: Arc::new(Policy {
                    cost: 2,
                    counters: crate::metrics::RuleCounters::for_rule("unit-test-rls-plan"),
                    ..Policy::with_defaults(
                        name,
                        Limit::police(Algorithm::FixedWindow, 10, Duration::from_secs(60), 10),
                        Scope::Local,
                    )
                }),
            })
        };
        Settings::new(
            "127.0.0.1:1".parse().unwrap(),
            vec![limit("per-user", "user"), limit("per-ip", "ip")],
        )
    }

    fn descriptor(key: &str, value: &str) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: vec![ReqEntry {
                key: key.into(),
                value: value.into(),
            }],
            ..Default::default()
        }
    }

    fn request(descriptors: Vec<RateLimitDescriptor>, hits: u32) -> RateLimitRequest {
        RateLimitRequest {
            domain: "edge".into(),
            descriptors,
            hits_addend: hits,
        }
    }

    #[test]
    fn costs_come_from_the_descriptor_then_the_request_then_the_limit() {
        let s = settings();
        let mut own = descriptor("user", "a");
        own.hits_addend = Some(UInt64Value { value: 5 });
        let mut zero = descriptor("ip", "1.2.3.4");
        zero.hits_addend = Some(UInt64Value { value: 0 });
        let p = plan(&s, &request(vec![own.clone(), zero.clone()], 3)).unwrap();
        let costs: Vec<u64> = p.groups.iter().map(|g| g.check.cost).collect();
        assert_eq!(costs, [5, 3]);
        let p = plan(&s, &request(vec![descriptor("user", "a")], 0)).unwrap();
        assert_eq!(
            p.groups[0].check.cost, 2,
            "the limit's cost when nothing is given"
        );
        own.hits_addend = Some(UInt64Value { value: u64::MAX });
        let p = plan(&s, &request(vec![own], 0)).unwrap();
        assert_eq!(p.groups[0].check.cost, MAX_COUNT);
    }

    #[test]
    fn one_counter_asked_twice_is_one_check_with_both_costs() {
        let s = settings();
        let req = request(
            vec![
                descriptor("user", "a"),
                descriptor("nobody", "x"),
                descriptor("user", "a"),
                descriptor("user", "b"),
            ],
            1,
        );
        let p = plan(&s, &req).unwrap();
        assert_eq!(p.per_descriptor, [Some(0), None, Some(0), Some(1)]);
        assert_eq!(p.groups[0].check.cost, 2);
        assert_ne!(p.groups[0].check.counter, p.groups[1].check.counter);
    }

    #[test]
    fn an_override_counts_apart_and_a_bad_one_is_refused() {
        let s = settings();
        let mut over = descriptor("user", "a");
        over.limit = Some(RateLimitOverride {
            requests_per_unit: 3,
            unit: 1,
        });
        let p = plan(&s, &request(vec![descriptor("user", "a"), over.clone()], 1)).unwrap();
        assert_eq!(p.groups.len(), 2);
        assert_ne!(p.groups[0].check.counter, p.groups[1].check.counter);
        assert_eq!(p.groups[1].policy.limit.limit(), 3);
        assert_eq!(p.groups[1].policy.limit.window(), Duration::from_secs(1));
        for bad in [(0, 1), (3, 0), (3, 99)] {
            over.limit = Some(RateLimitOverride {
                requests_per_unit: bad.0,
                unit: bad.1,
            });
            let e = plan(&s, &request(vec![over.clone()], 1)).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad:?}");
        }
    }

    #[test]
    fn an_override_cannot_lift_the_algorithms_cap() {
        let mut s = settings();
        let l = Arc::get_mut(&mut s.limits[0]).unwrap();
        let p = Arc::get_mut(&mut l.policy).unwrap();
        p.limit = Limit::police(Algorithm::SlidingWindowLog, 10, Duration::from_secs(60), 10);
        let mut over = descriptor("user", "a");
        over.limit = Some(RateLimitOverride {
            requests_per_unit: u32::MAX,
            unit: 1,
        });
        let e = plan(&s, &request(vec![over.clone()], 1)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        over.limit = Some(RateLimitOverride {
            requests_per_unit: 1000,
            unit: 1,
        });
        assert!(plan(&s, &request(vec![over], 1)).is_ok());
    }

    #[test]
    fn values_are_capped_like_key_parts() {
        let s = settings();
        let long = "v".repeat(MAX_KEY_VALUE + 10);
        let capped = "v".repeat(MAX_KEY_VALUE);
        let a = plan(&s, &request(vec![descriptor("user", &long)], 1)).unwrap();
        let b = plan(&s, &request(vec![descriptor("user", &capped)], 1)).unwrap();
        assert_eq!(a.groups[0].check.counter, b.groups[0].check.counter);
    }
}
