//! The threads floodgate starts beside Pingora's (the stop backstop, the trace exporter, webhook
//! delivery, the rate-limit service's threads), each with a runtime of its own: Pingora's runtimes are sized and run for
//! requests, may be shutting down, and must not hold a task stuck on a slow peer.

use std::future::Future;

/// Starts thread `name` that runs the future `task()` makes to its end on a current-thread
/// runtime (I/O and timers) of its own. `Err` when the thread could not start; when the
/// runtime could not be built, `no_runtime` runs on the thread instead, with the error.
pub fn spawn<F, Fut, E>(name: &str, task: F, no_runtime: E) -> std::io::Result<()>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future,
    E: FnOnce(std::io::Error) + Send + 'static,
{
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => {
                    rt.block_on(task());
                }
                Err(e) => no_runtime(e),
            }
        })
        .map(drop)
}
