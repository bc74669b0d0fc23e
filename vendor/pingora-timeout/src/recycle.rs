// floodgate patch: this module is new (PATCHES.md, "tokio timers recycled").

//! Tokio timers recycled through a per-thread pool.
//!
//! A fresh tokio `Sleep` costs an allocation, a registration in the runtime's timer wheel under
//! the driver's lock on its first poll and a removal under that lock when it is dropped: about
//! 700 instructions for a timeout that waits and is then cancelled, which is what nearly every
//! upstream read and idle watch of a proxy is. A timer given back to this thread's pool stays
//! registered; the next timeout of the same duration resets it to its own deadline, which tokio
//! does without the lock or the wheel when the new deadline is not earlier than the registered
//! one (it only moves the entry's expiry forward; the driver re-files the entry when the old
//! tick comes). Timeouts of one duration start in increasing order, so a recycled timer is
//! nearly always extended in place.
//!
//! Bounds: at most [`DURATIONS`] distinct durations per thread (a new one replaces the one used
//! longest ago) and [`PER_DURATION`] idle timers each; a timer given back beyond that is dropped
//! as before. A pooled timer may still hold the waker of the task that last polled it: when its
//! old deadline passes unused it wakes that task once (a spurious wake, which every future
//! tolerates), and a finished task's memory is kept until then or until the timer is reused, at
//! most `DURATIONS * PER_DURATION` per thread.
//! The pool belongs to one runtime at a time: a timer is only reused on the runtime whose driver
//! it is registered with, and the pool is emptied when the thread meets another runtime.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::runtime::{Handle, Id};
use tokio::time::{sleep_until, Duration, Instant, Sleep};

/// Distinct timeout durations pooled per thread.
pub const DURATIONS: usize = 8;
/// Idle timers kept per duration and thread.
pub const PER_DURATION: usize = 64;

/// This thread's idle timers: the runtime they belong to, and per duration a stack.
#[derive(Default)]
struct Pool {
    runtime: Option<Id>,
    lists: Vec<List>,
    /// Counts takes and puts: when each list was last used.
    clock: u64,
}

/// The idle timers of one duration.
struct List {
    duration: Duration,
    timers: Vec<Pin<Box<Sleep>>>,
    /// [`Pool::clock`] at the list's last take or put.
    used: u64,
}

impl Pool {
    /// An idle timer of `duration` registered with `runtime`'s driver, if there is one.
    fn take(&mut self, runtime: Id, duration: Duration) -> Option<Pin<Box<Sleep>>> {
        if self.runtime != Some(runtime) {
            return None;
        }
        self.clock += 1;
        let list = self.lists.iter_mut().find(|l| l.duration == duration)?;
        list.used = self.clock;
        list.timers.pop()
    }

    /// Keeps `sleep` for the next timeout of `duration`; gives it back when that duration's
    /// stack is full. A duration new to a pool holding [`DURATIONS`] of them takes the place of
    /// the one used longest ago (whose timers are dropped): durations that vary per request
    /// (what is left of a deadline) come and go without keeping the steady ones out.
    fn put(
        &mut self,
        runtime: Id,
        duration: Duration,
        sleep: Pin<Box<Sleep>>,
    ) -> Option<Pin<Box<Sleep>>> {
        if self.runtime != Some(runtime) {
            // Timers of another runtime (one that ended, in tests) must not be reset onto
            // this one's wheel: start over for this runtime.
            self.lists.clear();
            self.runtime = Some(runtime);
        }
        self.clock += 1;
        let i = match self.lists.iter().position(|l| l.duration == duration) {
            Some(i) => i,
            None => {
                let list = List {
                    duration,
                    timers: Vec::new(),
                    used: self.clock,
                };
                if self.lists.len() < DURATIONS {
                    self.lists.push(list);
                    self.lists.len() - 1
                } else {
                    let oldest = (0..self.lists.len())
                        .min_by_key(|&i| self.lists[i].used)
                        .expect("DURATIONS lists");
                    self.lists[oldest] = list;
                    oldest
                }
            }
        };
        let list = &mut self.lists[i];
        list.used = self.clock;
        if list.timers.len() >= PER_DURATION {
            return Some(sleep);
        }
        list.timers.push(sleep);
        None
    }
}

thread_local! {
    static POOL: RefCell<Pool> = RefCell::default();
}

/// A tokio timer that returns to this thread's pool when dropped.
pub struct Recycled {
    sleep: Option<Pin<Box<Sleep>>>,
    duration: Duration,
    runtime: Id,
}

impl Recycled {
    /// A timer firing `duration` from now, on the current runtime's clock: a pooled one reset to
    /// that deadline, or a new one. Panics outside a runtime with a time driver, as
    /// `tokio::time::sleep` does.
    pub fn new(duration: Duration) -> Recycled {
        let runtime = Handle::current().id();
        let deadline = Instant::now() + duration;
        let pooled = POOL
            .try_with(|p| p.borrow_mut().take(runtime, duration))
            .ok()
            .flatten();
        let sleep = match pooled {
            Some(mut sleep) => {
                sleep.as_mut().reset(deadline);
                sleep
            }
            None => Box::pin(sleep_until(deadline)),
        };
        Recycled {
            sleep: Some(sleep),
            duration,
            runtime,
        }
    }
}

impl Future for Recycled {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.sleep
            .as_mut()
            .expect("held until drop")
            .as_mut()
            .poll(cx)
    }
}

impl Drop for Recycled {
    fn drop(&mut self) {
        let Some(sleep) = self.sleep.take() else {
            return;
        };
        let (runtime, duration) = (self.runtime, self.duration);
        // During the thread's teardown the pool may be gone: the timer is dropped as before.
        let refused = POOL.try_with(|p| p.borrow_mut().put(runtime, duration, sleep));
        // A timer the pool refused is dropped here, outside the pool's borrow (its drop takes
        // the driver's lock).
        drop(refused);
    }
}

/// The number of idle timers this thread's pool holds (tests).
#[cfg(test)]
pub(crate) fn pooled() -> usize {
    POOL.with(|p| p.borrow().lists.iter().map(|l| l.timers.len()).sum())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokio_timeout;
    use std::task::Waker;
    use std::time::Instant as StdInstant;

    /// Polls `f` once with a waker that does nothing; true when it is still pending.
    fn pending<F: Future + Unpin>(f: &mut F) -> bool {
        Pin::new(f)
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_pending()
    }

    /// A waiting timeout that is dropped gives its timer back; the next one of the same duration
    /// takes it and still waits its own whole duration from its own start.
    #[tokio::test]
    async fn a_recycled_timer_waits_from_its_new_start() {
        let d = Duration::from_millis(300);
        let mut first = Box::pin(tokio_timeout(d, std::future::pending::<()>()));
        assert!(pending(&mut first));
        drop(first);
        assert_eq!(pooled(), 1, "the dropped timeout's timer is pooled");

        tokio::time::sleep(Duration::from_millis(150)).await;
        let start = StdInstant::now();
        let second = tokio_timeout(d, std::future::pending::<()>());
        tokio::pin!(second);
        assert!(pending(&mut second));
        assert_eq!(pooled(), 0, "the second timeout took the pooled timer");
        assert!(second.await.is_err(), "the timeout fires");
        let waited = start.elapsed();
        assert!(waited >= d, "fired after {waited:?}, before its own {d:?}");
        assert!(waited < Duration::from_secs(10), "fired after {waited:?}");
    }

    /// A pooled timer whose deadline passed while it was idle (it fired, or the driver has not
    /// come to it yet) is registered again for its next user's whole duration.
    #[tokio::test]
    async fn a_timer_idle_past_its_deadline_waits_again() {
        let d = Duration::from_millis(50);
        let mut first = Box::pin(tokio_timeout(d, std::future::pending::<()>()));
        assert!(pending(&mut first));
        drop(first);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(pooled(), 1);

        let start = StdInstant::now();
        let second = tokio_timeout(d, std::future::pending::<()>());
        assert!(second.await.is_err());
        let waited = start.elapsed();
        assert!(waited >= d, "fired after {waited:?}, before its own {d:?}");
        assert!(waited < Duration::from_secs(10), "fired after {waited:?}");
    }

    /// The pool keeps at most PER_DURATION idle timers for each of at most DURATIONS durations,
    /// however many timeouts a burst dropped.
    #[tokio::test]
    async fn the_pool_is_bounded() {
        let mut burst = Vec::new();
        for i in 0..(DURATIONS + 3) {
            for _ in 0..(PER_DURATION + 10) {
                let d = Duration::from_secs(60 + i as u64);
                let mut t = Box::pin(tokio_timeout(d, std::future::pending::<()>()));
                assert!(pending(&mut t));
                burst.push(t);
            }
        }
        drop(burst);
        assert_eq!(pooled(), DURATIONS * PER_DURATION);
    }

    /// Durations that differ per timeout (what is left of a deadline) do not keep a steady
    /// duration out of the pool: it takes the place of the one used longest ago.
    #[tokio::test]
    async fn a_steady_duration_is_pooled_among_passing_ones() {
        let steady = Duration::from_secs(30);
        for i in 0..(DURATIONS as u64 * 3) {
            let passing = Duration::from_millis(5_000 + i);
            let mut t = Box::pin(tokio_timeout(passing, std::future::pending::<()>()));
            assert!(pending(&mut t));
        }
        assert_eq!(
            pooled(),
            DURATIONS,
            "one timer of each of the last passing durations"
        );
        for _ in 0..3 {
            let mut t = Box::pin(tokio_timeout(steady, std::future::pending::<()>()));
            assert!(pending(&mut t));
        }
        let steady_pooled = POOL.with(|p| {
            let p = p.borrow();
            p.lists
                .iter()
                .find(|l| l.duration == steady)
                .map(|l| l.timers.len())
        });
        assert_eq!(steady_pooled, Some(1), "the steady duration has its place");
        assert_eq!(
            pooled(),
            DURATIONS,
            "still one list per duration, DURATIONS in all"
        );
    }

    /// Timers pooled under a runtime that ended are not reset onto the next runtime's wheel
    /// (that would panic, or never fire): the next runtime on the thread gets timers that fire.
    #[test]
    fn a_new_runtime_on_the_thread_gets_its_own_timers() {
        let d = Duration::from_millis(30);
        let old = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        old.block_on(async {
            let mut t = Box::pin(tokio_timeout(d, std::future::pending::<()>()));
            assert!(pending(&mut t));
        });
        assert_eq!(pooled(), 1);
        drop(old);

        let new = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        new.block_on(async {
            let start = StdInstant::now();
            assert!(tokio_timeout(d, std::future::pending::<()>())
                .await
                .is_err());
            assert!(start.elapsed() >= d);
        });
        assert_eq!(
            pooled(),
            1,
            "the old runtime's timer was let go for the new one's"
        );
    }
}
