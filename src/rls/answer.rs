//! The engine's outcome as Envoy's `RateLimitResponse`: one status per descriptor in order,
//! the overall code, and the same `RateLimit-Policy` / `RateLimit` (and, when over,
//! `Retry-After`) fields that floodgate's own answers carry, built by the same code
//! ([`RateLimitHeaders`]), for Envoy to pass to the client.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit, Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use tonic::Status;

use super::plan::Planned;
use crate::limiter::calendar::Period;
use crate::limiter::engine::{Outcome, Verdict};
use crate::limiter::policy::Policy;
use crate::limiter::{Decision, Limit};
use crate::wire::response::{whole_seconds_at_least_one, RateLimitHeaders};

/// The response for `planned` decided as `outcome`, or the gRPC error of a closed limit whose
/// store is failing (`UNAVAILABLE`: Envoy's `failure_mode_deny` then decides, as it does when
/// the service cannot be reached).
pub fn response(
    planned: &Planned,
    outcome: &Outcome,
    legacy: bool,
) -> Result<RateLimitResponse, Status> {
    let rejected = match &outcome.verdict {
        Verdict::Allow { .. } => false,
        // A slowed request is a rejected one to Envoy (no rls limit slows: validation).
        Verdict::Reject { .. } | Verdict::Slow { .. } => true,
        Verdict::Unavailable { rules, .. } => {
            let names: Vec<&str> = rules.iter().map(|r| &**r).collect();
            return Err(Status::unavailable(format!(
                "the rate-limit store is failing and limit(s) {} are on_store_error = \"closed\"",
                names.join(", ")
            )));
        }
    };
    let decided: Vec<Option<&Decision>> = planned
        .groups
        .iter()
        .map(|g| {
            outcome
                .applied
                .iter()
                .find(|a| {
                    std::sync::Arc::ptr_eq(&a.rule, &g.policy) && a.counter == g.check.counter
                })
                .map(|a| &a.decision)
        })
        .collect();
    let statuses = planned
        .per_descriptor
        .iter()
        .map(|g| match g {
            None => DescriptorStatus {
                code: Code::Ok as i32,
                ..Default::default()
            },
            Some(g) => status(&planned.groups[*g].policy, decided[*g]),
        })
        .collect();
    let mut headers = Vec::new();
    let (policy, state, legacy) = RateLimitHeaders::text(
        outcome.applied.iter().map(|a| (&*a.rule, &a.decision)),
        legacy,
    );
    if !policy.is_empty() {
        headers.push(header("RateLimit-Policy", policy));
        headers.push(header("RateLimit", state));
    }
    if let Some((limit, remaining, reset)) = legacy {
        headers.push(header("X-RateLimit-Limit", limit.to_string()));
        headers.push(header("X-RateLimit-Remaining", remaining.to_string()));
        headers.push(header("X-RateLimit-Reset", reset.to_string()));
    }
    if let Verdict::Reject { retry_after, .. } = &outcome.verdict {
        let secs = whole_seconds_at_least_one(*retry_after);
        headers.push(header("Retry-After", secs.to_string()));
    }
    Ok(RateLimitResponse {
        overall_code: if rejected { Code::OverLimit } else { Code::Ok } as i32,
        statuses,
        response_headers_to_add: headers,
        ..Default::default()
    })
}

/// One matched descriptor's status. A descriptor of a request that another descriptor
/// rejected was not charged: the engine's decision already says what it really has left.
fn status(policy: &Policy, decision: Option<&Decision>) -> DescriptorStatus {
    let current_limit = Some(current_limit(policy));
    let Some(d) = decision else {
        // A shadow limit: decided after the answer, never over.
        return DescriptorStatus {
            code: Code::Ok as i32,
            current_limit,
            ..Default::default()
        };
    };
    let remaining = d.remaining;
    let until = if d.allowed { d.reset } else { d.retry_after };
    DescriptorStatus {
        code: if d.allowed { Code::Ok } else { Code::OverLimit } as i32,
        current_limit,
        limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(duration(until)),
        ..Default::default()
    }
}

/// `current_limit`: the limit's name, and its numbers as requests per unit when its window is
/// exactly one of Envoy's units; otherwise (`window = "90s"`, `"10m"`) the unit is `UNKNOWN`
/// and `requests_per_unit` is the limit per window, whose length the `RateLimit-Policy` field
/// (`w`) carries.
pub fn current_limit(policy: &Policy) -> RateLimit {
    RateLimit {
        name: policy.name.to_string(),
        requests_per_unit: u32::try_from(policy.limit.limit()).unwrap_or(u32::MAX),
        unit: unit_of(&policy.limit) as i32,
    }
}

/// The unit a window is exactly, if any; a calendar limit's is its period (a day, week or
/// month of its zone).
fn unit_of(limit: &Limit) -> Unit {
    if let Some(c) = limit.calendar() {
        return match c.period() {
            Period::Day => Unit::Day,
            Period::Week => Unit::Week,
            Period::Month => Unit::Month,
        };
    }
    match limit.window().as_millis() {
        1_000 => Unit::Second,
        60_000 => Unit::Minute,
        3_600_000 => Unit::Hour,
        86_400_000 => Unit::Day,
        604_800_000 => Unit::Week,
        _ => Unit::Unknown,
    }
}

fn duration(d: Duration) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: d.subsec_nanos() as i32,
    }
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.into(),
        value,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Algorithm;

    #[test]
    fn a_window_of_one_unit_is_that_unit_and_any_other_unknown() {
        let unit = |secs| {
            unit_of(&Limit::police(
                Algorithm::FixedWindow,
                5,
                Duration::from_secs(secs),
                5,
            ))
        };
        assert_eq!(unit(1), Unit::Second);
        assert_eq!(unit(60), Unit::Minute);
        assert_eq!(unit(3600), Unit::Hour);
        assert_eq!(unit(86_400), Unit::Day);
        assert_eq!(unit(7 * 86_400), Unit::Week);
        assert_eq!(unit(90), Unit::Unknown);
        assert_eq!(unit(120), Unit::Unknown);
    }

    #[test]
    fn a_calendar_limit_is_its_period_in_any_zone() {
        use crate::limiter::calendar::Calendar;
        for (period, unit) in [
            (Period::Day, Unit::Day),
            (Period::Week, Unit::Week),
            (Period::Month, Unit::Month),
        ] {
            let limit = Limit::police(Algorithm::FixedWindow, 5, period.longest(), 5)
                .with_calendar(Calendar::new(period, "Asia/Tokyo").unwrap())
                .unwrap();
            assert_eq!(unit_of(&limit), unit, "{period:?}");
        }
    }
}
