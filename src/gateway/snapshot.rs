//! The config a request holds, through a handle of its thread's own.
//!
//! A request keeps the config it started with (a reload mid-request does not change its route)
//! and hands it from phase to phase. Held as a clone of the one `Arc<Config>`, every request
//! wrote that `Arc`'s count several times (taken, copied into the context, copied for a
//! filter, each dropped again), and with two or more threads those writes bounced the count's
//! cache line between the cores on every request. [`Snapshot`] counts in an `Arc` that only
//! its thread's requests share: each thread keeps one around the config in force (renewed on
//! its first request after a reload), and a request clones that one. Reading the config in
//! force is arc-swap's `load`, which writes nothing shared.
//!
//! The same holds for the pool serving a route's upstream: found once per thread and config
//! ([`Snapshot::route_pool`]) and borrowed by each request, not cloned out of the gateway's
//! list of pools per request.
//!
//! A thread that serves nothing after a reload keeps the config it last served until its next
//! request: at most one superseded config (and its pools) per thread, but not its key table,
//! which every config reads from one cell the reload fills (`crate::wire::auth::Keys`).

use std::cell::RefCell;
use std::ops::Deref;
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;

use crate::config::Config;
use crate::upstream::Pool;

/// A request's config: the one in force when it started.
#[derive(Clone)]
pub struct Snapshot(Arc<Held>);

/// What a thread's requests share of one config.
struct Held {
    config: Arc<Config>,
    /// The pool of each route's upstream, by route index, found on first use.
    route_pools: Box<[OnceLock<Arc<Pool>>]>,
}

impl Snapshot {
    fn new(config: Arc<Config>) -> Snapshot {
        let route_pools = config.routes.iter().map(|_| OnceLock::new()).collect();
        Snapshot(Arc::new(Held {
            config,
            route_pools,
        }))
    }

    /// The config as the `Arc` the gateway put in force (for what keeps it beyond the request).
    pub fn arc(&self) -> &Arc<Config> {
        &self.0.config
    }

    /// The pool serving route `route`'s upstream (`Upstream::pool`), `None` for no such route.
    pub fn route_pool(&self, route: usize) -> Option<&Arc<Pool>> {
        let cell = self.0.route_pools.get(route)?;
        Some(cell.get_or_init(|| self.0.config.routes[route].upstream.pool()))
    }
}

impl Deref for Snapshot {
    type Target = Config;

    fn deref(&self) -> &Config {
        &self.0.config
    }
}

thread_local! {
    static HELD: RefCell<Option<Snapshot>> = const { RefCell::new(None) };
}

/// The config in force in `config`, through this thread's handle.
pub fn current(config: &ArcSwap<Config>) -> Snapshot {
    let in_force = config.load();
    let held = HELD.try_with(|held| {
        let mut held = held.borrow_mut();
        match &*held {
            Some(s) if Arc::ptr_eq(s.arc(), &in_force) => s.clone(),
            _ => {
                // A reload (or another gateway in this process, in tests): a handle for the
                // config in force now, which lets go of the one this thread held.
                let fresh = Snapshot::new(arc_swap::Guard::into_inner(in_force));
                *held = Some(fresh.clone());
                fresh
            }
        }
    });
    // During the thread's teardown, a handle of the request's own.
    held.unwrap_or_else(|_| Snapshot::new(config.load_full()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(listen: &str) -> Config {
        let text = format!(
            "[server]\nlisten = [\"{listen}\"]\n[[upstreams]]\nname = \"u\"\ntargets = [\"127.0.0.1:1\"]\n[[routes]]\nname = \"r\"\nmatch = {{}}\nupstream = \"u\"\nauth = \"none\"\n"
        );
        Config::from_str(std::path::Path::new("t.toml"), &text).expect("valid")
    }

    /// Requests on one thread share one handle, so their clones count in it and not in the
    /// config's own `Arc`; a reload gives the next request the new config, and the old one is
    /// let go.
    #[test]
    fn a_thread_shares_one_handle_until_a_reload() {
        let swap = ArcSwap::from_pointee(config("127.0.0.1:8080"));
        let first = current(&swap);
        let second = current(&swap);
        assert!(Arc::ptr_eq(&first.0, &second.0), "one handle per thread");
        let pool = first.route_pool(0).expect("route 0");
        assert!(Arc::ptr_eq(pool, second.route_pool(0).unwrap()));
        assert!(Arc::ptr_eq(
            &pool.settings,
            &first.routes[0].upstream.settings
        ));
        assert!(first.route_pool(1).is_none(), "no second route");
        let in_force = swap.load_full();
        // The swap, this thread's handle, and `in_force`.
        assert_eq!(Arc::strong_count(&in_force), 3);

        swap.store(Arc::new(config("127.0.0.1:9090")));
        let after = current(&swap);
        assert_eq!(after.server.listen[0].to_string(), "127.0.0.1:9090");
        assert_eq!(first.server.listen[0].to_string(), "127.0.0.1:8080");
        drop((first, second));
        // Only `in_force` still holds the superseded config.
        assert_eq!(Arc::strong_count(&in_force), 1);
    }

    /// Another thread gets a handle of its own for the same config.
    #[test]
    fn each_thread_has_its_own_handle() {
        let swap = Arc::new(ArcSwap::from_pointee(config("127.0.0.1:8080")));
        let here = current(&swap);
        let there = {
            let swap = swap.clone();
            std::thread::spawn(move || current(&swap)).join().unwrap()
        };
        assert!(!Arc::ptr_eq(&here.0, &there.0));
        assert!(Arc::ptr_eq(here.arc(), there.arc()), "the same config");
    }
}
