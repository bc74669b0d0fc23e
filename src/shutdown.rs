//! Graceful shutdown: after SIGTERM (or after handing the listeners to a new process on an
//! upgrade), exit as soon as the requests in flight have finished, or when
//! `[server] grace_period` runs out, whichever comes first.
//!
//! Pingora 0.9 alone does not do that. On SIGTERM it flips its shutdown watch (every listener
//! stops accepting and is closed, idle keep-alive connections are dropped), then sleeps
//! `grace_period_seconds` unconditionally before stopping its runtimes. On SIGQUIT it first
//! sends the listening sockets to the new process (`--upgrade`), waits 5 s so both accept, and
//! then does the same. On SIGINT it never flips the watch and exits at once.
//!
//! [`Drain`] is a Pingora background service that waits for that same watch. When it flips,
//! the listeners are closing, so no new request can start: it then polls [`InFlight`] and
//! ends the process with exit code 0 once no request has been in flight for a short settle
//! time, or when the grace period is over. Pingora's own wait stays behind it as the last
//! resort. Being a service, it starts after a `-d` fork like every other service.
//!
//! Stops never hang: [`Signals`] replaces Pingora's signal watch. SIGINT exits the process
//! there and then, without Pingora's runtime shutdown (which could spin forever: Pingora runs a
//! listener's accept loop on a random one of a service's runtimes, not always the one the
//! listener is registered with, and once that other runtime's driver is gone the loop's
//! `accept()` fails at once, forever, without yielding — about one SIGINT in five with two
//! threads). SIGTERM and SIGQUIT start a backstop that ends the process if the drain has not
//! (grace period plus a margin), and a SIGINT during a graceful stop still exits at once.
//!
//! What counts as "in flight" is a request whose header has been read and whose response has
//! not been finished: the proxy holds one [`InFlightGuard`] per request (in its per-request
//! context), taken from [`requests`].

use crate::metrics::shards::ShardedU64;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::server::{ShutdownSignal, ShutdownSignalWatch, ShutdownWatch};
use pingora::services::background::BackgroundService;
use tokio::signal::unix::{signal, Signal, SignalKind};

/// How often the in-flight count is looked at while draining.
const POLL: Duration = Duration::from_millis(20);

/// How long the count must stay at zero before the process exits. It covers a request whose
/// header was read just as the listeners closed (its guard is taken a moment later) and lets
/// the last response bytes leave (an HTTP/2 connection writes them from its own task).
const SETTLE: Duration = Duration::from_millis(100);

/// A count of requests in flight. Cloning shares the count. It is kept in per-thread shards
/// ([`ShardedU64`]): every request moves it twice, only a drain reads it.
#[derive(Debug, Clone, Default)]
pub struct InFlight {
    count: Arc<ShardedU64>,
}

impl InFlight {
    /// A new count at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one request in until the returned guard is dropped. Call it when a request
    /// starts and keep the guard as long as the request is being answered.
    pub fn enter(&self) -> InFlightGuard {
        self.count.inc_by(1);
        InFlightGuard {
            count: Held::Shared(self.count.clone()),
        }
    }

    /// [`InFlight::enter`] on a count that lives as long as the process ([`requests`]): the
    /// guard borrows the count instead of holding a clone of its `Arc`, whose shared
    /// reference count every request on every thread would otherwise move twice more.
    pub fn enter_static(&'static self) -> InFlightGuard {
        self.count.inc_by(1);
        InFlightGuard {
            count: Held::Borrowed(&self.count),
        }
    }

    /// How many requests are in flight now.
    pub fn count(&self) -> usize {
        // The shards add up to a count that is never negative as a whole.
        usize::try_from(self.count.get()).unwrap_or(usize::MAX)
    }
}

/// One request in flight; dropping it counts the request out, however the request ended.
#[derive(Debug)]
#[must_use = "the request counts as in flight only while the guard is held"]
pub struct InFlightGuard {
    count: Held,
}

/// The count a guard holds.
#[derive(Debug)]
enum Held {
    Borrowed(&'static ShardedU64),
    Shared(Arc<ShardedU64>),
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        match &self.count {
            Held::Borrowed(c) => c.dec_by(1),
            Held::Shared(c) => c.dec_by(1),
        }
    }
}

/// The process-wide count of proxied requests in flight, the one [`Drain`] waits for in the
/// running gateway.
pub fn requests() -> &'static InFlight {
    static REQUESTS: OnceLock<InFlight> = OnceLock::new();
    REQUESTS.get_or_init(InFlight::new)
}

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// No request was left in flight.
    Idle {
        /// Time from the start of the drain to the end of the settle time.
        after: Duration,
    },
    /// The grace period ran out with requests still in flight.
    GraceExpired {
        /// How many requests were still in flight.
        in_flight: usize,
    },
}

/// Waits until `in_flight` has stayed at zero for `settle`, or until `grace` has passed since
/// the call, polling every `poll`.
pub async fn drain(
    in_flight: &InFlight,
    grace: Duration,
    settle: Duration,
    poll: Duration,
) -> Drained {
    let start = Instant::now();
    let mut idle_since: Option<Instant> = None;
    loop {
        let now = Instant::now();
        match in_flight.count() {
            0 => {
                let since = *idle_since.get_or_insert(now);
                if now.duration_since(since) >= settle {
                    return Drained::Idle {
                        after: now.duration_since(start),
                    };
                }
            }
            n => {
                idle_since = None;
                if now.duration_since(start) >= grace {
                    return Drained::GraceExpired { in_flight: n };
                }
            }
        }
        tokio::time::sleep(poll).await;
    }
}

/// The background service that ends the process once a graceful shutdown has drained.
/// Add it with `pingora::services::background::background_service("drain", Drain::new(..))`.
#[derive(Debug)]
pub struct Drain {
    in_flight: InFlight,
    grace: Duration,
}

impl Drain {
    /// Drains `in_flight` for at most `grace` once the server starts shutting down gracefully.
    pub fn new(in_flight: InFlight, grace: Duration) -> Self {
        Drain { in_flight, grace }
    }
}

#[async_trait]
impl BackgroundService for Drain {
    /// Runs for the whole life of the server: waits for Pingora's shutdown watch (flipped on
    /// SIGTERM right away, and on SIGQUIT once the listeners have been handed over), then
    /// drains and exits the process. Never returns on its own otherwise.
    async fn start(&self, mut shutdown: ShutdownWatch) {
        // An error means the server is gone without a graceful shutdown: nothing to drain.
        if shutdown.wait_for(|stopping| *stopping).await.is_err() {
            return;
        }
        tracing::info!(
            in_flight = self.in_flight.count(),
            grace_period = ?self.grace,
            "graceful shutdown: listeners closed, waiting for requests in flight"
        );
        match drain(&self.in_flight, self.grace, SETTLE, POLL).await {
            Drained::Idle { after } => {
                tracing::info!(?after, "graceful shutdown: no request in flight, exiting");
            }
            Drained::GraceExpired { in_flight } => {
                tracing::warn!(
                    in_flight,
                    grace_period = ?self.grace,
                    "graceful shutdown: grace period over, exiting with requests still in flight"
                );
            }
        }
        std::process::exit(0);
    }
}

/// How long Pingora waits, on SIGQUIT, after handing the listeners over before it shuts down
/// (its `CLOSE_TIMEOUT`).
const UPGRADE_HANDOVER: Duration = Duration::from_secs(5);

/// How long past its deadline a graceful stop may take before the backstop ends the process.
const BACKSTOP_MARGIN: Duration = Duration::from_secs(3);

/// The process's stop signals, as Pingora's `UnixShutdownSignalWatch` reads them (SIGQUIT:
/// upgrade, SIGTERM: graceful, SIGINT: fast), but a fast stop exits here, and a graceful one
/// is bounded by a backstop (see the module doc). Pass it to `Server::run`.
#[derive(Debug)]
pub struct Signals {
    grace: Duration,
}

impl Signals {
    /// Stops for a server whose `[server] grace_period` is `grace`.
    pub fn new(grace: Duration) -> Self {
        Signals { grace }
    }
}

#[async_trait]
impl ShutdownSignalWatch for Signals {
    async fn recv(&self) -> ShutdownSignal {
        let mut quit = listen(SignalKind::quit());
        let mut term = listen(SignalKind::terminate());
        let mut int = listen(SignalKind::interrupt());
        tokio::select! {
            _ = next(&mut quit) => {
                backstop(UPGRADE_HANDOVER + self.grace + BACKSTOP_MARGIN);
                ShutdownSignal::GracefulUpgrade
            }
            _ = next(&mut term) => {
                backstop(self.grace + BACKSTOP_MARGIN);
                ShutdownSignal::GracefulTerminate
            }
            _ = next(&mut int) => exit_now(),
        }
    }
}

/// A signal stream, or `None` if it cannot be installed (that signal then never arrives).
fn listen(kind: SignalKind) -> Option<Signal> {
    match signal(kind) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::error!(error = %e, "cannot install a signal handler");
            None
        }
    }
}

/// The next delivery of `sig`; pending forever when there is no stream.
async fn next(sig: &mut Option<Signal>) {
    match sig {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// Ends the process now, with status 0 as Pingora's fast stop does. The access log's exit
/// hook writes out what it still holds.
fn exit_now() -> ! {
    tracing::info!("SIGINT received, exiting");
    std::process::exit(0)
}

/// Starts a thread that ends the process `after` from now if nothing else has, or at once on a
/// SIGINT. It has its own small runtime: Pingora's are shutting down or, on its server thread,
/// no longer driven while it sleeps out its grace period.
fn backstop(after: Duration) {
    let spawned = crate::threads::spawn(
        "floodgate-stop",
        move || async move {
            let mut int = listen(SignalKind::interrupt());
            tokio::select! {
                _ = next(&mut int) => exit_now(),
                _ = tokio::time::sleep(after) => {
                    tracing::warn!(?after, "graceful stop did not end in time, exiting");
                    std::process::exit(0);
                }
            }
        },
        move |e| {
            tracing::error!(error = %e, "stop backstop: no runtime, sleeping it out");
            std::thread::sleep(after);
            std::process::exit(0);
        },
    );
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the stop backstop");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn guards_count_in_and_out() {
        let f = InFlight::new();
        let a = f.enter();
        let b = f.clone().enter();
        assert_eq!(f.count(), 2);
        drop(a);
        assert_eq!(f.count(), 1);
        drop(b);
        assert_eq!(f.count(), 0);
    }

    #[test]
    fn process_wide_count_is_one_count() {
        let g = requests().enter();
        assert!(requests().count() >= 1);
        drop(g);
    }

    #[tokio::test]
    async fn idle_drains_after_settle() {
        let f = InFlight::new();
        let out = drain(&f, Duration::from_secs(10), 30 * MS, 5 * MS).await;
        match out {
            Drained::Idle { after } => {
                assert!(after >= 30 * MS);
                assert!(after < Duration::from_secs(5), "{after:?}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn waits_for_the_last_request() {
        let f = InFlight::new();
        let guard = f.enter();
        let started = Instant::now();
        let release = tokio::spawn(async move {
            tokio::time::sleep(200 * MS).await;
            drop(guard);
        });
        let out = drain(&f, Duration::from_secs(10), 20 * MS, 5 * MS).await;
        release.await.unwrap();
        assert!(matches!(out, Drained::Idle { .. }), "{out:?}");
        assert!(started.elapsed() >= 200 * MS);
        assert_eq!(f.count(), 0);
    }

    #[tokio::test]
    async fn grace_period_bounds_the_wait() {
        let f = InFlight::new();
        let _stuck = f.enter();
        let started = Instant::now();
        let out = drain(&f, 100 * MS, 20 * MS, 5 * MS).await;
        assert_eq!(out, Drained::GraceExpired { in_flight: 1 });
        assert!(started.elapsed() >= 100 * MS);
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
