//! The Redis side of a reservation's true-up (see [`crate::limiter::reservation`]): one
//! `EVALSHA` of `lua/true_up.lua` per cluster slot for a batch, each key trued up atomically
//! in the window its reservation was charged in.

use super::script::{hex16, Params, TRUE_UP};
use super::{applied_within, Inner};
use crate::limiter::store::TrueUp;

impl Inner {
    /// Applies `ups`; returns how many the store applied (a reservation of an ended window,
    /// or of a key gone, is not). Failures cost a refund (it stays charged), never exactness.
    pub(super) async fn true_up(&self, ups: &[TrueUp]) -> u64 {
        let ups: Vec<&TrueUp> = ups.iter().filter(|u| !u.adjust.is_none()).collect();
        if ups.is_empty() {
            return 0;
        }
        let Some(conn) = self.conn.borrow().clone() else {
            return 0;
        };
        let keys: Vec<String> = ups.iter().map(|u| self.redis_key(&u.check)).collect();
        let calls = self.groups(&keys).into_iter().map(|group| {
            let mut cmd = TRUE_UP.evalsha(group.len());
            for &i in &group {
                cmd.arg(keys[i].as_str());
            }
            for &i in &group {
                let u = ups[i];
                cmd.arg(&Params::of(&u.check).true_up_packed(u.adjust, u.window_end_us)[..]);
            }
            for &i in &group {
                cmd.arg(hex16(ups[i].holder).as_str());
            }
            let conn = conn.clone();
            async move { conn.eval::<i64>(&TRUE_UP, &cmd).await }
        });
        applied_within(calls, "reservation true-up; the reservation stays charged").await
    }
}
