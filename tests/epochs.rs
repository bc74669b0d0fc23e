//! The usage API's reset and grant under open reservations, leases and store faults, against
//! real redis-server processes, a real Redis Cluster and the real binary: a reset starts a new
//! epoch of the counter that refunds, true-ups and lease returns of older charges cannot
//! touch; a grant shows what it left in `RateLimit`; a change that times out is not applied,
//! and an `Idempotency-Key` makes a retry land once; a concurrency rule is never reset.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::redis::{hammer, store, store_settings, RedisCluster, RedisServer, Stall};
use common::*;
use floodgate::config::Backend;
use floodgate::limiter::redis::RedisStore;
use floodgate::limiter::store::{Return, SharedStore, TrueUp, UsageCall, UsageChange};
use floodgate::limiter::true_up::Adjust;
use floodgate::limiter::{Algorithm, Check, Limit};

const GENEROUS: Duration = Duration::from_secs(5);
const TOKEN: &str = "epochs-admin-token-7";

fn redis_store(backend: Backend, urls: Vec<String>) -> Arc<RedisStore> {
    RedisStore::new(&store_settings(
        backend,
        urls,
        Duration::from_millis(500),
        "fg-epochs:",
    ))
    .expect("store")
}

fn call() -> UsageCall<'static> {
    UsageCall {
        timeout: GENEROUS,
        idempotency_key: None,
    }
}

/// Limit 10 an hour: 5 reservations charged and a lease of 5 taken before a reset, 10 charged
/// after it; then the old reservations are refunded and the lease's 4 unspent permits given
/// back. None of that may land on the new counter: it stays at 10, and the next request is
/// refused (before epochs: 9 more were admitted, 19 in the window after the reset).
async fn old_refunds_and_returns_never_land_after_a_reset(store: &dyn SharedStore) {
    let c = Check {
        rule: "r".into(),
        counter: 42,
        limit: Limit::police(Algorithm::FixedWindow, 10, Duration::from_secs(3600), 10),
        cost: 1,
    };
    let one = std::slice::from_ref(&c);
    // Connected (the store connects in the background).
    eventually(GENEROUS, "the store connects", || async {
        store
            .usage(&c, UsageChange::Read, call())
            .await
            .is_ok()
            .then_some(())
    })
    .await;
    let mut old = Vec::new();
    for holder in 0..5 {
        let (d, g) = store
            .decide_leased(one, &[0], 1, holder, GENEROUS)
            .await
            .expect("decide")[0]
            .clone();
        assert!(d.allowed);
        old.push(TrueUp {
            check: c.clone(),
            adjust: Adjust {
                refund: 1,
                extra: 0,
            },
            window_end_us: g.window_end_us,
            charged_at_us: g.charged_at_us,
            holder,
        });
    }
    let (d, lease) = store
        .decide_leased(one, &[5], 1, 9, GENEROUS)
        .await
        .expect("lease")[0]
        .clone();
    assert!(d.allowed && lease.granted == 3, "{d:?} {lease:?}");
    let changed = store
        .usage(&c, UsageChange::Reset, call())
        .await
        .expect("reset");
    assert_eq!((changed.before.used, changed.after.used), (8, 0));
    for holder in 100..110 {
        let d = store.decide(one, holder, GENEROUS).await.expect("decide");
        assert!(d[0].allowed, "the reset counter admits 10");
    }
    assert_eq!(store.true_up(&old).await, 0, "old refunds are dropped");
    let back = Return {
        check: c.clone(),
        permits: 2,
        window_end_us: lease.window_end_us,
        charged_at_us: lease.charged_at_us,
    };
    assert_eq!(
        store.give_back(&[back]).await,
        0,
        "old lease permits are dropped"
    );
    let d = store.decide(one, 200, GENEROUS).await.expect("decide");
    assert!(
        !d[0].allowed,
        "still 10 counted after the reset: {:?}",
        d[0]
    );
    let now = store
        .usage(&c, UsageChange::Read, call())
        .await
        .expect("read");
    assert_eq!(now.before.used, 10);

    // A refund of a charge made after the reset still lands.
    let (_, g) = {
        let d = store
            .usage(&c, UsageChange::Reset, call())
            .await
            .expect("reset");
        assert_eq!(d.after.used, 0);
        store
            .decide_leased(one, &[0], 1, 300, GENEROUS)
            .await
            .expect("decide")[0]
            .clone()
    };
    let fresh = TrueUp {
        check: c.clone(),
        adjust: Adjust {
            refund: 1,
            extra: 0,
        },
        window_end_us: g.window_end_us,
        charged_at_us: g.charged_at_us,
        holder: 300,
    };
    assert_eq!(store.true_up(&[fresh]).await, 1);
    let now = store
        .usage(&c, UsageChange::Read, call())
        .await
        .expect("read");
    assert_eq!(now.before.used, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_refunds_and_returns_never_land_after_a_reset_on_redis() {
    let server = RedisServer::start();
    let store = redis_store(Backend::Redis, vec![server.url()]);
    old_refunds_and_returns_never_land_after_a_reset(&*store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_refunds_and_returns_never_land_after_a_reset_on_a_cluster() {
    let cluster = RedisCluster::start();
    let store = redis_store(Backend::RedisCluster, cluster.urls());
    old_refunds_and_returns_never_land_after_a_reset(&*store).await;
}

// ---------------------------------------------------------------------------------------------
// Through the binary.
// ---------------------------------------------------------------------------------------------

/// One admin request by hand, with extra headers: (status, headers text, body as JSON).
fn admin(
    gw: &Gateway,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, serde_json::Value) {
    let method = if body.is_empty() { "GET" } else { "POST" };
    common::admin_request(
        gw.admin,
        TOKEN,
        method,
        path,
        headers,
        body,
        Duration::from_secs(15),
    )
}

fn gateway_with(api: std::net::SocketAddr, store: &str, rules: &str) -> Gateway {
    // The upstream may take its time: requests are held in flight across a reset.
    let upstream = format!(
        "[[upstreams]]\nname = \"orders\"\ntargets = [\"{api}\"]\nread_timeout = \"15s\"\n"
    );
    keyed_gateway(TOKEN, &upstream, store, rules)
}

const KEY: (&str, &str) = ("x-api-key", "test");

/// A metric of `gw` (0 when it is not listed).
fn metric_of(gw: &Gateway, series: &str) -> f64 {
    let (_, _, m) = admin(gw, "/metrics", &[], "");
    metric_value(m["raw"].as_str().unwrap_or_default(), series).unwrap_or(0.0)
}

fn used(gw: &Gateway, rule: &str) -> i64 {
    let (status, _, v) = admin(gw, "/usage?api_key=acme-prod", &[], "");
    assert_eq!(status, 200, "{v}");
    v["rules"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["rule"] == rule))
        .and_then(|r| r["used"].as_i64())
        .unwrap_or_else(|| panic!("no {rule} in {v}"))
}

/// Limit 10, counting only 200s: 10 requests that will answer 404 (refunded) are in flight
/// across a reset, and 10 200s fill the new counter meanwhile. When the 404s end, their
/// refunds must not land on the new counter: no more 200 reaches the upstream in the window
/// (before epochs: 10 more did, 20 counted responses with a limit of 10).
async fn refunds_across_a_reset_on(store: &str) {
    let api = OrdersApi::start("orders");
    let rules = r#"
[[rules]]
name = "ok-only"
key = ["api_key"]
algorithm = "fixed_window"
limit = 10
window = "1h"
count = { status = [200] }
on_store_error = "closed"
"#;
    let gw = gateway_with(api.addr, store, rules);
    let c = client();
    let slow: Vec<_> = (0..10)
        .map(|_| {
            let req = c
                .get(gw.url("/orders/999999?delay_ms=5000"))
                .header(KEY.0, KEY.1);
            tokio::spawn(async move { req.send().await.map(|r| r.status().as_u16()).unwrap_or(0) })
        })
        .collect();
    eventually(GENEROUS, "10 reservations open", || async {
        (used(&gw, "ok-only") == 10).then_some(())
    })
    .await;
    let (status, _, v) = admin(
        &gw,
        "/usage/reset",
        &[],
        r#"{"rule":"ok-only","api_key":"acme-prod"}"#,
    );
    assert_eq!(status, 200, "{v}");
    let counts = hammer(&[&gw], 10, 4, "/orders", &[KEY]).await;
    assert_eq!(counts.get(&200), Some(&10), "{counts:?}");
    for t in slow {
        assert_eq!(t.await.unwrap(), 404);
    }
    // Settled (the 404s answered): their refunds went to the old epoch.
    eventually(GENEROUS, "the refunds settled", || async {
        let series = "floodgate_response_settled_total{result=\"refunded\",rule=\"ok-only\"}";
        (metric_of(&gw, series) == 10.0).then_some(())
    })
    .await;
    let more = hammer(&[&gw], 10, 4, "/orders", &[KEY]).await;
    assert_eq!(
        more.get(&200),
        None,
        "over the limit after the reset: {more:?}"
    );
    assert_eq!(used(&gw, "ok-only"), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_across_a_reset_never_land_on_memory() {
    refunds_across_a_reset_on("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_across_a_reset_never_land_on_redis() {
    let redis = RedisServer::start();
    refunds_across_a_reset_on(&store(&redis.url(), "250ms", "")).await;
}

const DAILY: &str = r#"
[[rules]]
name = "daily"
key = ["api_key"]
algorithm = "fixed_window"
limit = 100
window = "1h"
on_store_error = "closed"
"#;

/// After a grant, `RateLimit` shows what is left (148), as `/usage` does, on every store.
async fn a_grant_shows_in_ratelimit_on(store: &str) {
    let api = OrdersApi::start("orders");
    let gw = gateway_with(api.addr, store, DAILY);
    let counts = hammer(&[&gw], 2, 1, "/orders", &[KEY]).await;
    assert_eq!(counts.get(&200), Some(&2), "{counts:?}");
    let (status, _, v) = admin(
        &gw,
        "/usage/grant",
        &[],
        r#"{"rule":"daily","api_key":"acme-prod","amount":50}"#,
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["after"]["remaining"], 148, "{v}");
    let r = client()
        .get(gw.url("/orders"))
        .header(KEY.0, KEY.1)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let state = r.headers()["ratelimit"].to_str().unwrap().to_string();
    assert!(state.contains(";r=147;"), "{state}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_shows_in_ratelimit_on_memory() {
    a_grant_shows_in_ratelimit_on("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_shows_in_ratelimit_on_redis() {
    let redis = RedisServer::start();
    a_grant_shows_in_ratelimit_on(&store(&redis.url(), "250ms", "")).await;
}

/// A grant while Redis stalls past the change's deadline answers 503 and is not applied when
/// Redis resumes (before: `used` 3 became -4 later). A retry with an Idempotency-Key lands
/// once; the same key for another change is refused; a bad key is a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_grant_is_not_applied_and_a_keyed_retry_lands_once() {
    let redis = RedisServer::start();
    let api = OrdersApi::start("orders");
    // The request path keeps its own short deadline; a change gets 2 s whatever it is.
    let gw = gateway_with(api.addr, &store(&redis.url(), "250ms", ""), DAILY);
    let counts = hammer(&[&gw], 3, 1, "/orders", &[KEY]).await;
    assert_eq!(counts.get(&200), Some(&3), "{counts:?}");
    let grant = r#"{"rule":"daily","api_key":"acme-prod","amount":7}"#;
    let idem = ("idempotency-key", "grant-7-for-acme");
    {
        let _stall = Stall::start(&redis, "5");
        // The stall has begun once a PING from another connection goes unanswered.
        std::thread::sleep(Duration::from_millis(300));
        let (status, _, v) = admin(&gw, "/usage/grant", &[idem], grant);
        assert_eq!(status, 503, "{v}");
        let detail = v["detail"].as_str().unwrap_or_default();
        assert!(detail.contains("not applied"), "{v}");
    }
    // Redis answers again: the grant it received late was refused there.
    assert_eq!(used(&gw, "daily"), 3);
    let (status, head, v) = admin(&gw, "/usage/grant", &[idem], grant);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["after"]["used"], -4, "{v}");
    assert!(!head.contains("idempotency-replayed"), "{head}");
    let (status, head, v) = admin(&gw, "/usage/grant", &[idem], grant);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["replayed"], true, "{v}");
    assert!(head.contains("idempotency-replayed: true"), "{head}");
    assert_eq!(used(&gw, "daily"), -4, "the retry was applied once");
    let other = r#"{"rule":"daily","api_key":"acme-prod","amount":8}"#;
    let (status, _, v) = admin(&gw, "/usage/grant", &[idem], other);
    assert_eq!(status, 409, "{v}");
    let long = "k".repeat(65);
    for bad in [long.as_str(), "has space", "é"] {
        let (status, _, v) = admin(&gw, "/usage/grant", &[("idempotency-key", bad)], grant);
        assert_eq!(status, 400, "{bad}: {v}");
    }
    assert_eq!(used(&gw, "daily"), -4, "refusals change nothing");
}

const CONCURRENT: &str = r#"
[[rules]]
name = "two-at-once"
key = ["api_key"]
algorithm = "concurrency"
limit = 2
on_store_error = "closed"
"#;

/// A reset of a concurrency rule is refused (409) and frees no slot: with 2 requests
/// running, a third is still refused (before: the reset freed both, 4 ran at once).
async fn a_concurrency_reset_is_refused_on(store: &str) {
    let api = OrdersApi::start("orders");
    let gw = gateway_with(api.addr, store, CONCURRENT);
    let c = client();
    let held = hold_slots(&c, &gw.url("/orders?delay_ms=3000"), &[KEY], 2);
    eventually(GENEROUS, "2 slots held", || async {
        (used(&gw, "two-at-once") == 2).then_some(())
    })
    .await;
    let (status, _, v) = admin(
        &gw,
        "/usage/reset",
        &[],
        r#"{"rule":"two-at-once","api_key":"acme-prod"}"#,
    );
    assert_eq!(status, 409, "{v}");
    assert!(
        v["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("concurrency"),
        "{v}"
    );
    assert_eq!(used(&gw, "two-at-once"), 2);
    let r = c
        .get(gw.url("/orders"))
        .header(KEY.0, KEY.1)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429, "a third request while 2 run");
    for t in held {
        assert_eq!(t.await.unwrap(), 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_reset_is_refused_on_memory() {
    a_concurrency_reset_is_refused_on("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_reset_is_refused_on_redis() {
    let redis = RedisServer::start();
    a_concurrency_reset_is_refused_on(&store(&redis.url(), "250ms", "")).await;
}

/// Two gateways on one store, limit 100 an hour, `lease = 50` held for an hour: gateway A
/// leases and spends one permit, holding the rest; then a reset is made through gateway B.
/// A hears it from the store and drops the permits of the old epoch, so at most 100 requests
/// are admitted over both in the window after the reset (before: A spent the permits it held
/// on top of the new counter's 100).
async fn a_reset_voids_every_instance_lease_on(store: &str) {
    let api = OrdersApi::start("orders");
    let rules = r#"
[[rules]]
name = "leased"
key = ["api_key"]
algorithm = "fixed_window"
limit = 100
window = "1h"
lease = 50
lease_ttl = "1h"
on_store_error = "closed"
"#;
    let store = format!("{store}instances = 2\n");
    let a = gateway_with(api.addr, &store, rules);
    let b = gateway_with(api.addr, &store, rules);
    for gw in [&a, &b] {
        eventually(GENEROUS, "listening for resets", || async {
            (metric_of(gw, "floodgate_store_resets_listening") == 1.0).then_some(())
        })
        .await;
    }
    let first = hammer(&[&a], 1, 1, "/orders", &[KEY]).await;
    assert_eq!(first.get(&200), Some(&1), "{first:?}");
    let leased = used(&b, "leased");
    assert!(leased > 1, "A holds a lease: {leased} charged");
    let (status, _, v) = admin(
        &b,
        "/usage/reset",
        &[],
        r#"{"rule":"leased","api_key":"acme-prod"}"#,
    );
    assert_eq!(status, 200, "{v}");
    eventually(GENEROUS, "A hears the reset", || async {
        (metric_of(&a, "floodgate_store_resets_heard_total") >= 1.0).then_some(())
    })
    .await;
    let after = hammer(&[&a, &b], 200, 4, "/orders", &[KEY]).await;
    let admitted = after.get(&200).copied().unwrap_or(0);
    assert!(
        (50..=100).contains(&admitted),
        "admitted after the reset (limit 100): {after:?}"
    );
    assert!(used(&b, "leased") <= 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_voids_every_instance_lease_on_redis() {
    let redis = RedisServer::start();
    a_reset_voids_every_instance_lease_on(&store(&redis.url(), "250ms", "")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_voids_every_instance_lease_in_a_cluster() {
    let cluster = RedisCluster::start();
    a_reset_voids_every_instance_lease_on(&cluster.store("250ms", "")).await;
}

/// After a Redis restart with no proxied traffic, the usage API reconnects by itself (before:
/// every reset answered 503 until a request came), and the reset listener subscribes again:
/// a reset made after the restart is heard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_usage_api_and_the_reset_listener_come_back_after_a_redis_restart() {
    let mut redis = RedisServer::start();
    let api = OrdersApi::start("orders");
    let gw = gateway_with(api.addr, &store(&redis.url(), "250ms", ""), DAILY);
    eventually(GENEROUS, "listening for resets", || async {
        (metric_of(&gw, "floodgate_store_resets_listening") == 1.0).then_some(())
    })
    .await;
    redis.restart();
    eventually(
        Duration::from_secs(15),
        "a reset after the restart",
        || async {
            let (status, _, _) = admin(
                &gw,
                "/usage/reset",
                &[],
                r#"{"rule":"daily","api_key":"acme-prod"}"#,
            );
            (status == 200 && metric_of(&gw, "floodgate_store_resets_heard_total") >= 1.0)
                .then_some(())
        },
    )
    .await;
}
