//! The `[rls]` limits as `floodgate check` prints them and as `/stats` (the dashboard) shows
//! them: in the shape of a rule, the descriptor in the place of the key.

use std::fmt::Write as _;

use super::limits::{RlsLimit, Settings};
use crate::limiter::lease::{Lease, LeaseSize};
use crate::limiter::Window;
use crate::text::humantime;

/// The descriptor as one phrase: `route=orders, user`.
pub fn descriptor_text(l: &RlsLimit) -> Vec<String> {
    l.entries
        .iter()
        .map(|e| match &e.value {
            Some(v) => format!("{}={v}", e.key),
            None => e.key.clone(),
        })
        .collect()
}

/// What `floodgate check` adds for `[rls]`.
pub fn report(rls: &Settings) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "rls on {} (the most specific matching limit applies):",
        rls.listen
    );
    for (i, l) in rls.limits.iter().enumerate() {
        let p = &l.policy;
        let _ = writeln!(
            out,
            "  {}. {}: domain {} | descriptor [{}] | {} | cost {} | scope {} | on_store_error {}{}{}{}",
            i + 1,
            p.name,
            l.domain,
            descriptor_text(l).join(", "),
            numbers(l),
            p.cost,
            p.scope.as_str(),
            p.on_store_error.as_str(),
            p.lease.map(|lease| format!(" | {}", lease_text(&lease))).unwrap_or_default(),
            block_text(l),
            if p.shadow { " | shadow" } else { "" }
        );
    }
    out
}

/// `lease auto for 1s`, as `check` prints a rule's.
fn lease_text(l: &Lease) -> String {
    let size = match l.size {
        LeaseSize::Auto => "auto".to_string(),
        LeaseSize::Permits(n) => n.to_string(),
    };
    format!("lease {size} for {}", humantime(l.ttl))
}

/// ` | block_for 15m`, or nothing.
fn block_text(l: &RlsLimit) -> String {
    let b = l.policy.limit.block_for();
    if b.is_zero() {
        String::new()
    } else {
        format!(" | block_for {}", humantime(b))
    }
}

/// `token_bucket 100/1m burst 100`, `fixed_window 1000/day Asia/Tokyo`.
fn numbers(l: &RlsLimit) -> String {
    let lim = &l.policy.limit;
    let caps = lim.algorithm().capabilities();
    let mut out = format!("{} {}", lim.algorithm().as_str(), lim.limit());
    if let Some(c) = lim.calendar() {
        let _ = write!(out, "/{} {}", c.period().as_str(), c.zone_name());
    } else if caps.window == Window::Required {
        let _ = write!(out, "/{}", humantime(lim.window()));
    }
    if caps.burst {
        let _ = write!(out, " burst {}", lim.burst());
    }
    out
}

/// A limit as `/stats` lists rules (the dashboard reads the same fields): `key` is the
/// descriptor, `rls` names the domain.
pub fn limit_json(l: &RlsLimit) -> serde_json::Value {
    let p = &l.policy;
    let lim = &p.limit;
    let caps = lim.algorithm().capabilities();
    let mut v = serde_json::json!({
        "name": &*p.name,
        "match": {},
        "key": descriptor_text(l),
        "algorithm": lim.algorithm().as_str(),
        "limit": lim.limit(),
        "scope": p.scope.as_str(),
        "on_store_error": p.on_store_error.as_str(),
        "cost": p.cost,
        "shadow": p.shadow,
        "headers": p.headers,
        "status": p.status,
        "rls": { "domain": l.domain },
    });
    if let Some(c) = lim.calendar() {
        v["calendar"] = c.period().as_str().into();
        v["timezone"] = c.zone_name().into();
    } else if caps.window == Window::Required {
        v["window"] = humantime(lim.window()).into();
    }
    if caps.burst {
        v["burst"] = lim.burst().into();
    }
    if !lim.block_for().is_zero() {
        v["block_for"] = humantime(lim.block_for()).into();
    }
    v
}
