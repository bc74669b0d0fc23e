//! One connection to a `redis://` server per serving thread.
//!
//! floodgate serves on several threads, each a current-thread Tokio runtime of its own (the
//! proxy's Pingora threads, `work_stealing = false`; the rate-limit service's threads). The
//! store's shared connection ([`super::resp`]) runs its writer and reader on the runtime that
//! made it, so a request served on another thread crosses threads twice per call: its command
//! wakes the writer over there, and the reply wakes the request back here. At two threads that
//! doubled the CPU per call of a global limit. So a thread that serves on a current-thread
//! runtime opens a connection of its own, the first time it needs one, on its own runtime,
//! and uses it for as long as it is sound; until it is up (and while it cannot be made,
//! retried every [`RETRY`]) the thread uses the shared connection, which keeps the store's
//! reconnection, breaker and warm-up as they are.
//!
//! A thread's connection is replaced, never read again, once it broke or was poisoned: a call
//! on it that got no reply within its deadline, or a reply that was not its call's (see
//! `super::resp`). The next call of the thread starts a new one and goes over the shared
//! connection meanwhile. A new connection is handed out only after a `PING` came back on it,
//! so a black-holed path (which accepts TCP connections) yields no connection that looks up.
//!
//! Every call is one atomic script, so which connection carries it changes no decision. A
//! thread keeps connections to at most [`MAX_STORES`] stores (a reload that changes the store
//! builds a new one); a dropped store's are closed when the thread first calls a new one.

use std::cell::RefCell;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::conn::{connect_lean, Conn, Target};
use super::resp::RespConn;

/// How long a thread whose own connection could not be made uses the shared one before trying
/// again.
pub const RETRY: Duration = Duration::from_secs(1);

/// Stores one thread keeps connections to.
pub const MAX_STORES: usize = 4;

/// A thread's own connection to one store.
struct Lane {
    /// The store's identity (see [`Key`]); dead once the store is dropped.
    store: Weak<()>,
    state: State,
}

enum State {
    Connecting,
    Ready(RespConn),
    /// The last attempt failed at this instant.
    Failed(Instant),
}

/// What identifies a store to its lanes: a lane holds it weakly, so a dropped store's lanes
/// are recognised and closed.
pub(super) type Key = Arc<()>;

thread_local! {
    static LANES: RefCell<Vec<Lane>> = const { RefCell::new(Vec::new()) };
}

/// This thread's own connection to the store `key` (reaching `target`), when it has one up;
/// `None` when the caller should use the shared connection: the target is not a `redis://`
/// server, the thread does not serve on a current-thread runtime, or its connection is being
/// made (started here when it is missing, broken, or failed more than [`RETRY`] ago).
pub(super) fn own(key: &Key, target: &Target) -> Option<Conn> {
    if !matches!(target, Target::Single(_)) {
        return None;
    }
    LANES
        .try_with(|lanes| {
            let mut lanes = lanes.try_borrow_mut().ok()?;
            let at = match lanes.iter().position(|l| is(l, key)) {
                Some(i) => {
                    match &lanes[i].state {
                        State::Ready(c) if !c.is_broken() => return Some(Conn::Lean(c.clone())),
                        State::Connecting => return None,
                        State::Failed(when) if when.elapsed() < RETRY => return None,
                        _ => {}
                    }
                    i
                }
                None => {
                    if !on_current_thread_runtime() {
                        return None;
                    }
                    // A new store: the lanes of stores since dropped go now.
                    lanes.retain(|l| l.store.strong_count() > 0);
                    if lanes.len() >= MAX_STORES {
                        lanes.remove(0);
                    }
                    lanes.push(Lane {
                        store: Arc::downgrade(key),
                        state: State::Connecting,
                    });
                    lanes.len() - 1
                }
            };
            lanes[at].state = State::Connecting;
            let (store, target) = (Arc::downgrade(key), target.clone());
            // On this thread's runtime: the connection's tasks run here, and the task finds
            // this thread's lanes when it is done.
            tokio::spawn(async move {
                let made = connect_lean(&target).await;
                let _ = LANES.try_with(|lanes| {
                    let Ok(mut lanes) = lanes.try_borrow_mut() else {
                        return;
                    };
                    if let Some(lane) = lanes.iter_mut().find(|l| l.store.ptr_eq(&store)) {
                        lane.state = match made {
                            Some(Ok(c)) => State::Ready(c),
                            Some(Err(e)) => {
                                tracing::debug!(error = %e, "a thread's own Redis connection failed; it uses the shared one");
                                State::Failed(Instant::now())
                            }
                            None => State::Failed(Instant::now()),
                        };
                    }
                });
            });
            None
        })
        .ok()
        .flatten()
}

fn is(lane: &Lane, key: &Key) -> bool {
    std::ptr::eq(lane.store.as_ptr(), Arc::as_ptr(key))
}

/// Whether the caller runs on a current-thread Tokio runtime (a serving thread's own).
pub(super) fn on_current_thread_runtime() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread)
}
