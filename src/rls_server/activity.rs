//! A rate-limit service connection's activity: its open calls, and when the last one ended or
//! the client last sent a PING, for the connection's idle timeout (`super::conn`); each call
//! holds an [`OpenGuard`] while it runs (`super::call`).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// A connection's open calls and when the last one ended (or the client last PINGed), for
/// its idle timeout.
pub struct Activity {
    open: AtomicUsize,
    /// When the last call ended or the last PING arrived, in ms since `base`.
    last_ms: AtomicU64,
    base: Instant,
    ended: Notify,
}

impl Activity {
    pub(super) fn new() -> Self {
        Activity {
            open: AtomicUsize::new(0),
            last_ms: AtomicU64::new(0),
            base: Instant::now(),
            ended: Notify::new(),
        }
    }

    /// A call begins; it ends when the guard drops.
    pub fn enter(self: &Arc<Self>) -> OpenGuard {
        self.open.fetch_add(1, Ordering::AcqRel);
        OpenGuard(self.clone())
    }

    /// Records now as the last use: a call ended, or the client sent a PING (keeping the
    /// connection warm).
    pub(super) fn touch(&self) {
        let ms = u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.fetch_max(ms, Ordering::AcqRel);
    }

    /// Resolves once no call has been open, and no PING arrived, for `timeout`.
    pub(super) async fn idle(&self, timeout: Duration) {
        loop {
            if self.open.load(Ordering::Acquire) > 0 {
                self.ended.notified().await;
                continue;
            }
            let last = self.last_ms.load(Ordering::Acquire);
            let due = self.base + Duration::from_millis(last) + timeout;
            tokio::select! {
                () = tokio::time::sleep_until(due) => {
                    if self.open.load(Ordering::Acquire) == 0
                        && self.last_ms.load(Ordering::Acquire) == last
                    {
                        return;
                    }
                }
                () = self.ended.notified() => {}
            }
        }
    }
}

/// One open call of a connection (see [`Activity::enter`]).
pub struct OpenGuard(Arc<Activity>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        let a = &self.0;
        a.touch();
        a.open.fetch_sub(1, Ordering::AcqRel);
        a.ended.notify_one();
    }
}
