//! The usage API on Redis: one `lua/usage.lua` call on the counter's key (a single key, so a
//! single hash slot on a cluster), atomic with the decisions around it.
//!
//! A change carries its deadline in the gateway's clock; the script refuses to apply it once
//! Redis' clock has passed it, and the gateway waits [`CLOCK_GRACE`] beyond the deadline
//! before it answers that the store timed out. So a timeout means "not applied, and never
//! will be" as long as the clocks of Redis and the gateway agree within [`CLOCK_GRACE`]
//! (NTP keeps them within milliseconds). An idempotency key is remembered beside the counter
//! (same hash tag, so the same slot) for [`IDEMPOTENCY_TTL`].

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::script::{unix_now_ns, Params, MAX_EXACT, USAGE};
use super::Inner;
use crate::limiter::algorithm;
use crate::limiter::store::{
    Changed, Replay, StoreError, Usage, UsageCall, UsageChange, IDEMPOTENCY_TTL,
};
use crate::limiter::Check;

/// How far behind the gateway's clock Redis' may be for a timed-out change to be surely
/// refused by the script (see the module's doc comment).
pub const CLOCK_GRACE: Duration = Duration::from_secs(1);

/// Bytes of the script's reply: a status byte, then six little-endian doubles.
pub(super) const REPLY_BYTES: usize = 1 + 6 * 8;

impl Inner {
    /// Lifts the `block_for` ban of `check`'s key: deletes its block key `<key>:b` (same hash
    /// tag, so the same node), within `timeout`. Whether a ban was live (the key expires with
    /// the ban, so one that exists is live).
    pub(super) async fn lift_ban(
        self: &Arc<Self>,
        check: &Check,
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        let mut key = self.redis_key(check);
        key.push_str(":b");
        let mut cmd = redis::cmd("DEL");
        cmd.arg(key.as_str());
        let deadline = Instant::now() + timeout;
        let call = async {
            let conn = self.connection().await?;
            conn.until(deadline, conn.on_key::<i64>(&cmd))
                .await
                .ok_or(StoreError::Timeout)?
                .map_err(|e| StoreError::Failed(e.to_string()))
        };
        Ok(self.within(timeout, call).await? > 0)
    }

    /// The counter of `check` before and after `change`, within `call.timeout`, once per
    /// `call.idempotency_key`.
    pub(super) async fn usage(
        self: &Arc<Self>,
        check: &Check,
        change: UsageChange,
        call: UsageCall<'_>,
    ) -> Result<Changed, StoreError> {
        let key = self.redis_key(check);
        let (op, amount) = match change {
            UsageChange::Read => ("read", 0),
            UsageChange::Reset => ("reset", 0),
            UsageChange::Grant(n) => ("grant", n),
        };
        let timeout_ns = u64::try_from(call.timeout.as_nanos()).unwrap_or(u64::MAX);
        let deadline_us = (unix_now_ns().saturating_add(timeout_ns) / 1000).min(MAX_EXACT);
        let ttl_ms = u64::try_from(IDEMPOTENCY_TTL.as_millis()).unwrap_or(u64::MAX);
        let mut cmd = USAGE.evalsha(1);
        cmd.arg(key.as_str())
            .arg(op)
            .arg(amount.min(MAX_EXACT))
            .arg(&Params::of(check).packed()[..])
            .arg(call.idempotency_key.unwrap_or(""))
            .arg(deadline_us)
            .arg(ttl_ms)
            .arg(self.resets_channel());
        let deadline = Instant::now() + call.timeout + CLOCK_GRACE;
        let call_redis = async {
            let conn = self.connection().await?;
            conn.until(deadline, conn.eval::<Vec<u8>>(&USAGE, &cmd))
                .await
                .ok_or(StoreError::Timeout)?
                .map_err(|e| StoreError::Failed(e.to_string()))
        };
        // Past the deadline the script refuses the change; a reply within the grace is the
        // truth either way.
        let reply = self.within(call.timeout + CLOCK_GRACE, call_redis).await?;
        decode(check, &reply)
    }

    /// `call` within `timeout`. A failure rebuilds our connection if it broke: the usage API's
    /// calls come without requests, whose own failures would have.
    async fn within<T>(
        self: &Arc<Self>,
        timeout: Duration,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let out = tokio::time::timeout(timeout, call)
            .await
            .unwrap_or(Err(StoreError::Timeout));
        if out.is_err() {
            self.reconnect_if_broken();
        }
        out
    }
}

/// The script's reply: status (0 applied now, 1 a repeat of the change made under this
/// idempotency key, 2 that key was used for another change, 3 past its deadline: not
/// applied), then remaining and reset (wide) before and after.
fn decode(check: &Check, reply: &[u8]) -> Result<Changed, StoreError> {
    if reply.len() != REPLY_BYTES {
        return Err(StoreError::Failed("unexpected usage reply".into()));
    }
    let replay = match reply[0] {
        0 => Replay::Fresh,
        1 => Replay::Repeated,
        2 => Replay::Conflict,
        3 => return Err(StoreError::Timeout),
        _ => return Err(StoreError::Failed("unexpected usage reply".into())),
    };
    let numbers: Vec<f64> = reply[1..]
        .chunks_exact(8)
        .map(|b| f64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
        .collect();
    if numbers.iter().any(|n| !n.is_finite()) {
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
    Ok(Changed {
        before: usage(0),
        after: usage(3),
        replay,
    })
}
