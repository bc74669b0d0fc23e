//! The upstream pools each config generation runs on. The gateway attaches them as it puts a
//! config in force ([`bind`]); the request path reaches them from the config's own upstream
//! ([`Upstream::pool`]).
//!
//! Why not inside the config: a [`Config`] is plain data, and `floodgate check` builds one too,
//! which must start nothing. A pool is run time (its live membership over the health and
//! passive state that outlives reloads, `crate::upstream::pools`).
//!
//! Each generation keeps its own pools as long as a request still holds that generation, so a
//! request in flight across a reload keeps selecting among the targets its config named.

use std::sync::{Arc, LazyLock, Weak};

use arc_swap::ArcSwap;

use crate::config::{Config, Upstream};
use crate::upstream::Pool;

/// The pools of one config generation: `pools[i]` serves `upstreams[i]`.
struct Generation {
    config: Weak<Config>,
    pools: Vec<Arc<Pool>>,
}

/// Every generation still held by someone, newest first. Process-wide because the request path
/// reaches a pool from the config alone; found by the config's own objects, so two gateways in
/// one process (unit tests) never see each other's pools.
static GENERATIONS: LazyLock<ArcSwap<Vec<Arc<Generation>>>> =
    LazyLock::new(|| ArcSwap::from_pointee(Vec::new()));

/// Attaches a pool to every upstream of `config` (over the state an earlier generation left
/// for the same name) and makes them the ones [`Upstream::pool`] finds, before `config` is put
/// in force. Generations nobody holds any more are forgotten here.
pub(super) fn bind(config: &Arc<Config>) {
    let pools = config
        .upstreams
        .iter()
        .map(|u| crate::upstream::pools().attach(&u.name, &u.settings))
        .collect();
    let generation = Arc::new(Generation {
        config: Arc::downgrade(config),
        pools,
    });
    GENERATIONS.rcu(|list| {
        let mut next = Vec::with_capacity(list.len() + 1);
        next.push(generation.clone());
        next.extend(list.iter().filter(|g| g.config.strong_count() > 0).cloned());
        next
    });
}

impl Upstream {
    /// The pool serving this upstream: the one the gateway attached when it put this config in
    /// force. A config no gateway put in force (nothing on the request path holds one) gets a
    /// pool built for the call, over the same shared state.
    pub fn pool(&self) -> Arc<Pool> {
        let generations = GENERATIONS.load();
        generations
            .iter()
            .flat_map(|g| &g.pools)
            .find(|p| Arc::ptr_eq(&p.settings, &self.settings))
            .cloned()
            .unwrap_or_else(|| crate::upstream::pools().attach(&self.name, &self.settings))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn config(port: u16) -> Config {
        let text = format!(
            "[[upstreams]]\nname = \"pools-test-{port}\"\ntargets = [\"127.0.0.1:{port}\"]\n\n\
             [[routes]]\nname = \"r\"\nupstream = \"pools-test-{port}\"\n"
        );
        Config::from_str(Path::new("/tmp/pools-test/gateway.toml"), &text).expect("valid config")
    }

    #[test]
    fn a_generation_keeps_its_pools_while_it_is_held() {
        let old = Arc::new(config(7401));
        bind(&old);
        let pool = old.upstreams[0].pool();
        assert!(
            Arc::ptr_eq(&pool, &old.upstreams[0].pool()),
            "one pool per bind"
        );
        // A newer generation does not take the pools of one still held.
        let new = Arc::new(config(7402));
        bind(&new);
        assert!(Arc::ptr_eq(&pool, &old.upstreams[0].pool()));
        assert!(!Arc::ptr_eq(&pool, &new.upstreams[0].pool()));
        // Once nothing holds it, the next bind forgets it.
        let forgotten = Arc::as_ptr(&pool);
        drop((old, pool));
        bind(&new);
        let generations = GENERATIONS.load();
        let mut held = generations.iter().flat_map(|g| &g.pools);
        assert!(
            !held.any(|p| Arc::as_ptr(p) == forgotten),
            "a dropped generation's pools stay"
        );
    }
}
