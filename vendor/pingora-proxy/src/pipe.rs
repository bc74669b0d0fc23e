// floodgate patch: this module is new (see PATCHES.md).

//! A small bounded channel for the two task pipes of an HTTP/1 exchange (downstream to
//! upstream, upstream to downstream), with the part of `tokio::sync::mpsc`'s API that
//! `proxy_h1` uses and the same semantics: `send` and `reserve` wait for a free slot and fail
//! once the receiver is gone; a `Permit` holds a slot until it sends or is dropped; `recv`
//! returns `None` once every sender is gone and the queue is empty; every future is
//! cancel-safe as tokio's is (a dropped `recv` or `reserve` takes nothing).
//!
//! Why not tokio's: a tokio channel allocates its shared state (512 B, cache-padded) and a
//! first block of 32 slots (1.3 KB for `HttpTask`) when it is made, whatever its bound, and an
//! exchange makes two, held for as long as the request waits on its upstream: 4 KiB of the
//! 17 a waiting request held. This one allocates its state (about 150 B) and, on the first
//! send, a queue of the bound's size.
//!
//! Who may wait on it: a channel has one `Sender` and one `Receiver` (neither is `Clone`), and
//! each side keeps one waiting task (one waker slot). `proxy_h1` polls both ends of both pipes
//! of an exchange from the exchange's one task (its `select!` loop), and that is the use this
//! is built and measured for. Any two tasks may hold the two ends: a side polled by another
//! task than the one it registered wakes the earlier one (`register`), so no wake-up is lost;
//! but two tasks waiting on the *same* side at once would wake each other in turn, so a side
//! is to be awaited by one task at a time.
//!
//! Like tokio's channels, `recv` and `reserve` take part in tokio's co-operative budget: a task
//! that keeps finding values (or slots) ready yields to the other tasks of its runtime once
//! its budget is spent, instead of running on for as long as the other end keeps up.

use std::collections::VecDeque;
use std::fmt;
use std::future::poll_fn;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

struct State<T> {
    queue: VecDeque<T>,
    /// Slots taken: queued values and live permits.
    used: usize,
    capacity: usize,
    sender_alive: bool,
    receiver_alive: bool,
    /// The receiver's task, waiting for a value.
    rx_waker: Option<Waker>,
    /// The sender's task, waiting for a slot.
    tx_waker: Option<Waker>,
}

type Shared<T> = Arc<Mutex<State<T>>>;

fn lock<T>(shared: &Shared<T>) -> MutexGuard<'_, State<T>> {
    // No code holding the lock can panic (no user code runs under it): a poisoned lock still
    // holds a consistent state.
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Registers `cx`'s waker in `slot`; a different waker it replaces is woken, so that a wake-up
/// is never lost (both ends of an exchange's pipes normally poll from one task).
fn register(slot: &mut Option<Waker>, cx: &Context<'_>) -> Option<Waker> {
    match slot {
        Some(w) if w.will_wake(cx.waker()) => None,
        _ => slot.replace(cx.waker().clone()),
    }
}

/// Unlocks `state`, then wakes `waker`: a woken task may poll at once (on another thread) and
/// must find the lock free.
fn unlock_and_wake<T>(state: MutexGuard<'_, State<T>>, waker: Option<Waker>) {
    drop(state);
    if let Some(w) = waker {
        w.wake();
    }
}

/// A channel of at most `capacity` values in flight (queued or reserved).
pub(crate) fn channel<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Mutex::new(State {
        queue: VecDeque::new(),
        used: 0,
        capacity: capacity.max(1),
        sender_alive: true,
        receiver_alive: true,
        rx_waker: None,
        tx_waker: None,
    }));
    (
        Sender {
            shared: shared.clone(),
        },
        Receiver { shared },
    )
}

/// The sending half.
pub(crate) struct Sender<T> {
    shared: Shared<T>,
}

/// The receiving half.
pub(crate) struct Receiver<T> {
    shared: Shared<T>,
}

/// One reserved slot of the channel.
pub(crate) struct Permit<'a, T> {
    sender: &'a Sender<T>,
}

/// The receiver is gone; the value that could not be sent.
pub(crate) struct SendError<T>(pub T);

/// Why [`Sender::try_reserve`] returned no permit.
pub(crate) enum TrySendError<T> {
    /// Every slot is taken.
    Full(T),
    /// The receiver is gone.
    Closed(T),
}

impl<T> Sender<T> {
    fn poll_reserve(&self, cx: &mut Context<'_>) -> Poll<Result<(), SendError<()>>> {
        let coop = std::task::ready!(tokio::task::coop::poll_proceed(cx));
        let mut state = lock(&self.shared);
        if !state.receiver_alive {
            coop.made_progress();
            return Poll::Ready(Err(SendError(())));
        }
        if state.used < state.capacity {
            state.used += 1;
            coop.made_progress();
            return Poll::Ready(Ok(()));
        }
        let replaced = register(&mut state.tx_waker, cx);
        unlock_and_wake(state, replaced);
        Poll::Pending
    }

    /// Waits for a free slot and reserves it.
    pub(crate) async fn reserve(&self) -> Result<Permit<'_, T>, SendError<()>> {
        poll_fn(|cx| self.poll_reserve(cx)).await?;
        Ok(Permit { sender: self })
    }

    /// Reserves a free slot, if there is one.
    pub(crate) fn try_reserve(&self) -> Result<Permit<'_, T>, TrySendError<()>> {
        let mut state = lock(&self.shared);
        if !state.receiver_alive {
            return Err(TrySendError::Closed(()));
        }
        if state.used >= state.capacity {
            return Err(TrySendError::Full(()));
        }
        state.used += 1;
        Ok(Permit { sender: self })
    }

    /// Waits for a free slot and sends `value` in it.
    pub(crate) async fn send(&self, value: T) -> Result<(), SendError<T>> {
        match self.reserve().await {
            Ok(permit) => {
                permit.send(value);
                Ok(())
            }
            Err(_) => Err(SendError(value)),
        }
    }

    /// Whether the receiver is gone.
    pub(crate) fn is_closed(&self) -> bool {
        !lock(&self.shared).receiver_alive
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut state = lock(&self.shared);
        state.sender_alive = false;
        let waker = state.rx_waker.take();
        unlock_and_wake(state, waker);
    }
}

impl<T> Permit<'_, T> {
    /// Sends `value` in the reserved slot (dropped if the receiver is gone).
    pub(crate) fn send(self, value: T) {
        let mut state = lock(&self.sender.shared);
        let mut undelivered = None;
        if state.receiver_alive {
            state.queue.push_back(value);
        } else {
            state.used -= 1;
            undelivered = Some(value);
        }
        let waker = state.rx_waker.take();
        unlock_and_wake(state, waker);
        std::mem::forget(self);
        drop(undelivered);
    }
}

impl<T> Drop for Permit<'_, T> {
    fn drop(&mut self) {
        let mut state = lock(&self.sender.shared);
        state.used -= 1;
        let waker = state.tx_waker.take();
        unlock_and_wake(state, waker);
    }
}

impl<T> Receiver<T> {
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let coop = std::task::ready!(tokio::task::coop::poll_proceed(cx));
        let mut state = lock(&self.shared);
        if let Some(value) = state.queue.pop_front() {
            state.used -= 1;
            let waker = state.tx_waker.take();
            unlock_and_wake(state, waker);
            coop.made_progress();
            return Poll::Ready(Some(value));
        }
        if !state.sender_alive {
            coop.made_progress();
            return Poll::Ready(None);
        }
        let replaced = register(&mut state.rx_waker, cx);
        unlock_and_wake(state, replaced);
        Poll::Pending
    }

    /// The next value, or `None` once the sender is gone and nothing is queued.
    pub(crate) async fn recv(&mut self) -> Option<T> {
        poll_fn(|cx| self.poll_recv(cx)).await
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let mut state = lock(&self.shared);
        state.receiver_alive = false;
        let queued = std::mem::take(&mut state.queue);
        state.used -= queued.len();
        let waker = state.tx_waker.take();
        unlock_and_wake(state, waker);
        drop(queued);
    }
}

impl<T> fmt::Debug for Permit<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Permit")
    }
}

impl<T> fmt::Debug for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SendError(..)")
    }
}

impl<T> fmt::Display for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("channel closed")
    }
}

impl<T> std::error::Error for SendError<T> {}

impl<T> fmt::Debug for TrySendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrySendError::Full(_) => f.write_str("Full(..)"),
            TrySendError::Closed(_) => f.write_str("Closed(..)"),
        }
    }
}

impl<T> fmt::Display for TrySendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrySendError::Full(_) => f.write_str("no available capacity"),
            TrySendError::Closed(_) => f.write_str("channel closed"),
        }
    }
}

impl<T> std::error::Error for TrySendError<T> {}
