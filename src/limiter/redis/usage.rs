//! The usage API on Redis: one `lua/usage.lua` call on the counter's key (a single key, so a
//! single hash slot on a cluster), atomic with the decisions around it.

use std::time::Duration;

use super::script::{Params, USAGE};
use super::Inner;
use crate::limiter::algorithm;
use crate::limiter::store::{StoreError, Usage, UsageChange};
use crate::limiter::Check;

impl Inner {
    /// Lifts the `block_for` ban of `check`'s key: deletes its block key `<key>:b` (same hash
    /// tag, so the same node), within `timeout`. Whether a ban was live (the key expires with
    /// the ban, so one that exists is live).
    pub(super) async fn lift_ban(
        &self,
        check: &Check,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let mut key = self.redis_key(check);
        key.push_str(":b");
        let mut cmd = redis::cmd("DEL");
        cmd.arg(key.as_str());
        let call = async {
            let conn = self.connection().await?;
            conn.on_key::<i64>(&cmd)
                .await
                .map_err(|e| StoreError::Failed(e.to_string()))
        };
        let deleted = tokio::time::timeout(timeout, call)
            .await
            .map_err(|_| StoreError::Timeout)??;
        Ok(deleted > 0)
    }

    /// The counter of `check` before and after `change`, within `timeout`.
    pub(super) async fn usage(
        &self,
        check: &Check,
        change: UsageChange,
        timeout: Duration,
    ) -> Result<(Usage, Usage), StoreError> {
        let key = self.redis_key(check);
        let (op, amount) = match change {
            UsageChange::Read => ("read", 0),
            UsageChange::Reset => ("reset", 0),
            UsageChange::Grant(n) => ("grant", n),
        };
        let mut cmd = USAGE.evalsha(1);
        cmd.arg(key.as_str())
            .arg(op)
            .arg(amount)
            .arg(&Params::of(check).packed()[..]);
        let call = async {
            let conn = self.connection().await?;
            conn.eval::<Vec<u8>>(&USAGE, &cmd)
                .await
                .map_err(|e| StoreError::Failed(e.to_string()))
        };
        let reply = tokio::time::timeout(timeout, call)
            .await
            .map_err(|_| StoreError::Timeout)??;
        let numbers: Vec<f64> = reply
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
            .collect();
        if numbers.len() != 6 || numbers.iter().any(|n| !n.is_finite()) {
            return Err(StoreError::Failed("unexpected usage reply".into()));
        }
        let limit = algorithm::quota(&check.limit);
        let usage = |at: usize| {
            // Exact integers below 2^53 (see lua/common.lua).
            let remaining = numbers[at].max(0.0) as i64;
            let reset_ns = numbers[at + 1].max(0.0) as u64 * 1000 + numbers[at + 2].max(0.0) as u64;
            let capped = i64::try_from(limit).unwrap_or(i64::MAX);
            Usage {
                limit,
                used: capped.saturating_sub(remaining),
                remaining,
                reset: Duration::from_nanos(reset_ns),
            }
        };
        Ok((usage(0), usage(3)))
    }
}
