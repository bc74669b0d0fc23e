// floodgate patch: this module is new (see PATCHES.md, "I/O kept on the thread that serves it").

//! Which of Pingora's runtime threads the caller runs on.
//!
//! With `work_stealing: false` every thread runs a current-thread runtime with an I/O driver of
//! its own, and a socket is registered with the driver of the runtime that created it: its
//! readiness is seen only when that runtime's thread polls its driver, and reaches a task on
//! another thread as a cross-thread wake. A connection is cheapest served where it is
//! registered, so connections are rebound to the runtime that serves them at accept, and
//! upstream connections are pooled per thread.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// Numbers handed to current-thread runtime threads, from 1.
static NEXT: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's number: `u64::MAX` until first asked inside a runtime.
    static THIS: Cell<u64> = const { Cell::new(u64::MAX) };
}

/// The calling thread's number when it runs a current-thread runtime (never 0), 0 otherwise:
/// on a work-stealing runtime all workers share one I/O driver, so no thread is nearer to a
/// socket than another, and outside a runtime there is no driver at all.
pub(crate) fn current() -> u64 {
    THIS.with(|this| {
        let n = this.get();
        if n != u64::MAX {
            return n;
        }
        let n = match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread => {
                NEXT.fetch_add(1, Ordering::Relaxed)
            }
            Ok(_) => 0,
            // Not remembered: the thread may enter a runtime later.
            Err(_) => return 0,
        };
        this.set(n);
        n
    })
}

/// `key` made distinct per current-thread runtime thread, for the connection pool: a
/// connection is reused on the thread whose driver it is registered with. Unchanged on a
/// work-stealing runtime.
pub(crate) fn pool_key(key: u64) -> u64 {
    key ^ current().wrapping_mul(0x9E37_79B9_7F4A_7C15)
}
