//! The Redis side of a reservation's true-up (see [`crate::limiter::reservation`]): one
//! `EVALSHA` of `lua/true_up.lua` per cluster slot for a batch, each key trued up atomically
//! in the window its reservation was charged in.
//!
//! True-ups of concurrent requests are coalesced: a request queues its true-ups and waits for
//! the flush that carries them; while one flush is in flight, whatever is queued meanwhile
//! goes in the next one, so N requests settling at once cost Redis a few calls, not N. That
//! is exact: a true-up never depends on another (each names its key, window and entries),
//! and the request still waits until its batch has landed, so the client's next request sees
//! its refund, as with a call of its own. A lone request pays no wait for batching (the
//! flush starts at once); a request that queues behind a flush in flight waits for that one
//! and its own, at most twice [`RELEASE_TIMEOUT`].

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::script::{hex16, Params, TRUE_UP};
use super::{applied, Inner, RELEASE_TIMEOUT};
use crate::limiter::store::TrueUp;

/// The most true-ups one `EVALSHA` carries: a larger flush is sent as several calls at once,
/// so that no script call grows with the load.
const MAX_PER_CALL: usize = 256;

/// True-ups queued for the next flush (see the module's doc comment).
#[derive(Default)]
pub(super) struct Batcher {
    queue: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    ups: Vec<TrueUp>,
    /// Whom to wake when the flush that takes `ups` has landed, with what it applied.
    waiters: Vec<oneshot::Sender<u64>>,
    /// A flush task is running: it takes what is queued when its call returns.
    flushing: bool,
}

/// Clears `flushing` when the flush task is dropped mid-call (its runtime shut down): the next
/// true-up then starts a new one instead of queueing behind a task that is gone.
struct Flushing {
    inner: Arc<Inner>,
    /// Still to clear: the task has not ended on an empty queue (which clears `flushing`
    /// under the same lock that saw the queue empty, so no true-up is left behind).
    armed: bool,
}

impl Drop for Flushing {
    fn drop(&mut self) {
        if self.armed {
            self.inner.true_ups.queue.lock().flushing = false;
        }
    }
}

impl Inner {
    /// Queues `ups` for the next flush and waits until it has landed; returns how many the
    /// store applied in that flush (theirs and those coalesced with them). Failures cost a
    /// refund (it stays charged), never exactness.
    pub(super) async fn true_up_batched(self: &Arc<Self>, ups: &[TrueUp]) -> u64 {
        let ups = ups.iter().filter(|u| !u.adjust.is_none()).cloned();
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut q = self.true_ups.queue.lock();
            let before = q.ups.len();
            q.ups.extend(ups);
            if q.ups.len() == before {
                return 0;
            }
            q.waiters.push(tx);
            !std::mem::replace(&mut q.flushing, true)
        };
        if start {
            tokio::spawn(flush(Flushing {
                inner: Arc::clone(self),
                armed: true,
            }));
        }
        // The flush in flight, then the one carrying these, each bounded by RELEASE_TIMEOUT.
        match tokio::time::timeout(RELEASE_TIMEOUT * 2, rx).await {
            Ok(Ok(applied)) => applied,
            _ => 0,
        }
    }

    /// Applies `ups` now; returns how many the store applied (a reservation of an ended
    /// window, or of a key gone, is not).
    async fn true_up(self: &Arc<Self>, ups: &[TrueUp]) -> u64 {
        if ups.is_empty() {
            return 0;
        }
        let deadline = Instant::now() + RELEASE_TIMEOUT;
        let Some(conn) = self.shared_by(deadline).await else {
            return 0;
        };
        let keys: Vec<String> = ups.iter().map(|u| self.redis_key(&u.check)).collect();
        let calls = self.groups(&keys).into_iter().flat_map(|group| {
            group
                .chunks(MAX_PER_CALL)
                .map(|group| {
                    let mut cmd = TRUE_UP.evalsha(group.len());
                    for &i in group {
                        cmd.arg(keys[i].as_str());
                    }
                    for &i in group {
                        let u = &ups[i];
                        cmd.arg(
                            &Params::of(&u.check).true_up_packed(
                                u.adjust,
                                u.window_end_us,
                                u.charged_at_us,
                            )[..],
                        );
                    }
                    for &i in group {
                        cmd.arg(hex16(ups[i].holder).as_str());
                    }
                    let conn = conn.clone();
                    async move { super::eval_count(&conn, &TRUE_UP, cmd).await }
                })
                .collect::<Vec<_>>()
        });
        applied(
            self.best_effort(&conn, deadline, calls).await,
            "reservation true-up; the reservation stays charged",
        )
    }
}

/// Sends what is queued, one flush after another, until the queue is empty.
async fn flush(mut guard: Flushing) {
    loop {
        let (ups, waiters) = {
            let mut q = guard.inner.true_ups.queue.lock();
            if q.ups.is_empty() {
                q.flushing = false;
                drop(q);
                guard.armed = false;
                return;
            }
            (std::mem::take(&mut q.ups), std::mem::take(&mut q.waiters))
        };
        let applied = guard.inner.true_up(&ups).await;
        for w in waiters {
            let _ = w.send(applied);
        }
    }
}
