//! The eviction-policy probe: on connect (and on recovery after failures) the store reads
//! Redis' `maxmemory-policy` and warns loudly when it lets Redis evict floodgate's keys, since
//! an evicted counter is a reset limit.

use std::sync::Weak;
use std::time::Duration;

use redis::Value;

use super::conn::Conn;
use super::Inner;
use crate::metrics::metrics;

/// Budget for reading `maxmemory-policy`.
const POLICY_TIMEOUT: Duration = Duration::from_secs(2);

/// Reads `maxmemory-policy` (every master of a cluster) and warns loudly when Redis may
/// evict floodgate's keys. Errors are ignored: managed Redis services often forbid `CONFIG`.
pub(super) async fn check_policy(store: Weak<Inner>, conn: Conn) {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory-policy");
    let reply = tokio::time::timeout(POLICY_TIMEOUT, conn.everywhere(cmd)).await;
    let Some(inner) = store.upgrade() else {
        return;
    };
    let value = match reply {
        Ok(Ok(value)) => value,
        Ok(Err(e)) => {
            tracing::info!(redis = %inner.endpoint, error = %e, "cannot read Redis maxmemory-policy (CONFIG may be disabled); make sure it is noeviction");
            return;
        }
        Err(_) => return,
    };
    let mut policies = Vec::new();
    collect_policies(&value, &mut policies);
    // The most dangerous one wins: a single evicting master resets the limits it holds.
    let Some(policy) = policies
        .iter()
        .find(|p| evicts(p))
        .or(policies.first())
        .cloned()
    else {
        return;
    };
    let evicting = evicts(&policy);
    metrics().store_evicting_policy.set(i64::from(evicting));
    if evicting {
        tracing::error!(
            redis = %inner.endpoint,
            maxmemory_policy = %policy,
            "REDIS MAY EVICT RATE-LIMIT KEYS: maxmemory-policy {policy} lets Redis delete floodgate's counters under memory pressure, and an evicted counter is a reset limit. Set maxmemory-policy noeviction (every floodgate key has a TTL, so volatile-* policies evict them too)."
        );
    }
    *inner.policy.lock() = Some(policy);
}

/// Whether a `maxmemory-policy` may evict floodgate keys (all of them have TTLs).
pub(super) fn evicts(policy: &str) -> bool {
    policy.starts_with("allkeys-") || policy.starts_with("volatile-")
}

/// The values that follow `maxmemory-policy` in a `CONFIG GET` reply (RESP2 array or RESP3
/// map, per node in a cluster reply).
fn collect_policies(value: &Value, out: &mut Vec<String>) {
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    };
    match value {
        Value::Array(items) | Value::Set(items) => {
            let mut pending = false;
            for item in items {
                if pending {
                    if let Some(t) = text(item) {
                        out.push(t);
                    }
                    pending = false;
                } else if text(item).as_deref() == Some("maxmemory-policy") {
                    pending = true;
                } else {
                    collect_policies(item, out);
                }
            }
        }
        Value::Map(pairs) => {
            for (k, v) in pairs {
                if text(k).as_deref() == Some("maxmemory-policy") {
                    if let Some(t) = text(v) {
                        out.push(t);
                    }
                } else {
                    collect_policies(v, out);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_are_read_from_every_reply_shape() {
        let pair = |p: &str| {
            Value::Array(vec![
                Value::BulkString(b"maxmemory-policy".to_vec()),
                Value::BulkString(p.as_bytes().to_vec()),
            ])
        };
        let mut out = Vec::new();
        collect_policies(&pair("noeviction"), &mut out);
        assert_eq!(out, ["noeviction"]);
        let cluster = Value::Map(vec![
            (
                Value::SimpleString("127.0.0.1:1".into()),
                pair("noeviction"),
            ),
            (
                Value::SimpleString("127.0.0.1:2".into()),
                pair("allkeys-lru"),
            ),
        ]);
        let mut out = Vec::new();
        collect_policies(&cluster, &mut out);
        assert_eq!(out, ["noeviction", "allkeys-lru"]);
        assert!(evicts("allkeys-lru") && evicts("volatile-ttl") && !evicts("noeviction"));
    }
}
