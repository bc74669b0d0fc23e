//! Global limits in Redis through the real binary: exact limits across instances, atomicity,
//! one round trip per request, failure modes (open, closed, local) with recovery, scripts
//! flushed mid-run, a slow Redis, global concurrency, and a real 3-master Redis Cluster.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::redis::{
    gateway, gateway_on_threads, hammer, hammer_ratelimit, store, RedisCluster, RedisServer,
};
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_admit_exactly_the_limit() {
    let redis = RedisServer::start();
    let api = OrdersApi::start("orders");
    let rules = r#"
[[rules]]
name = "exact"
match = { header = { name = "x-test", value = "log" } }
key = ["header:x-user"]
algorithm = "sliding_window_log"
limit = 50
window = "1h"
on_store_error = "closed"

[[rules]]
name = "bucket"
match = { header = { name = "x-test", value = "bucket" } }
key = ["header:x-user"]
algorithm = "token_bucket"
limit = 20
window = "1s"
burst = 10
on_store_error = "closed"
"#;
    let s = store(&redis.url(), "250ms", "instances = 3");
    let gws: Vec<Gateway> = (0..3).map(|_| gateway(api.addr, &s, rules)).collect();
    let refs: Vec<&Gateway> = gws.iter().collect();

    let counts = hammer(
        &refs,
        300,
        24,
        "/orders",
        &[("x-test", "log"), ("x-user", "alice")],
    )
    .await;
    eprintln!("sliding log, limit 50, 300 requests over 3 instances: {counts:?}");
    assert_eq!(
        counts.get(&200),
        Some(&50),
        "exactly the limit is admitted: {counts:?}"
    );
    assert_eq!(counts.get(&429), Some(&250), "{counts:?}");

    // Token bucket: never more than burst + rate * t.
    let start = Instant::now();
    let mut admitted = 0;
    let mut total = 0;
    while start.elapsed() < Duration::from_secs(2) {
        let counts = hammer(
            &refs,
            30,
            12,
            "/orders",
            &[("x-test", "bucket"), ("x-user", "bob")],
        )
        .await;
        admitted += counts.get(&200).copied().unwrap_or(0);
        total += counts.values().sum::<usize>();
        assert_eq!(counts.get(&503), None, "{counts:?}");
    }
    let t = start.elapsed().as_secs_f64();
    let bound = 10.0 + 20.0 * t;
    eprintln!(
        "token bucket 20/s burst 10: {admitted} admitted of {total} in {t:.2}s (bound {bound:.1})"
    );
    assert!(admitted as f64 <= bound + 1.0, "{admitted} > {bound}");
    assert!(admitted >= 10, "at least the burst: {admitted}");
}

#[tokio::test]
async fn one_round_trip_per_request_and_nothing_charged_on_rejection() {
    let redis = RedisServer::start();
    let api = OrdersApi::start("orders");
    let rules = r#"
[[rules]]
name = "tight"
match = { path = "/orders/1" }
key = ["ip"]
algorithm = "fixed_window"
limit = 1
window = "1h"

[[rules]]
name = "roomy"
key = ["ip"]
algorithm = "sliding_window_counter"
limit = 5
window = "1h"

[[rules]]
name = "per-path"
key = ["ip", "path"]
algorithm = "token_bucket"
limit = 100
window = "1m"
"#;
    let gw = gateway(api.addr, &store(&redis.url(), "250ms", ""), rules);
    let c = client();
    // Warm up (the first request may load the script).
    assert_eq!(
        c.get(gw.url("/orders/2")).send().await.unwrap().status(),
        200
    );
    let _: String = redis.query(&["CONFIG", "RESETSTAT"]);
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(
            c.get(gw.url("/orders/1"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16(),
        );
    }
    assert_eq!(statuses, [200, 429, 429, 429]);
    let calls = redis.command_calls("evalsha") + redis.command_calls("eval");
    assert_eq!(
        calls, 4,
        "one script call per request with three global rules"
    );
    // The three rejections charged no other rule: roomy has used 2 (warm-up + 1) of 5.
    let r = c.get(gw.url("/orders/3")).send().await.unwrap();
    let state = r.headers()["ratelimit"].to_str().unwrap().to_string();
    assert!(state.contains("\"roomy\";r=2;"), "{state}");

    // Every key carries the prefix, a TTL, and no raw client value.
    let keys: Vec<String> = redis.query(&["KEYS", "*"]);
    assert!(!keys.is_empty());
    for k in &keys {
        assert!(k.starts_with("floodgate:"), "{k}");
        assert!(
            !k.contains("127.0.0.1") && !k.contains("/orders"),
            "raw value in key {k}"
        );
        let ttl: i64 = redis.query(&["PTTL", k]);
        assert!(ttl > 0, "{k} has no TTL ({ttl})");
    }
}

/// Each serving thread calls Redis on a connection of its own (a call on another thread's
/// connection crosses threads twice), a bounded number of them, and the limit stays exact
/// over them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_serving_thread_calls_redis_on_its_own_connection() {
    let redis = RedisServer::start();
    let api = OrdersApi::start("orders");
    let rules = "[[rules]]\nname = \"shared\"\nkey = [\"header:x-user\"]\nalgorithm = \"fixed_window\"\nlimit = 150\nwindow = \"1h\"\non_store_error = \"closed\"\n";
    let gw = gateway_on_threads(2, api.addr, &store(&redis.url(), "500ms", ""), rules);
    let counts = hammer(&[&gw], 200, 16, "/orders", &[("x-user", "alice")]).await;
    assert_eq!(counts.get(&200), Some(&150), "{counts:?}");
    assert_eq!(counts.get(&429), Some(&50), "{counts:?}");
    let clients: String = redis.query(&["CLIENT", "LIST"]);
    let deciding = clients
        .lines()
        .filter(|l| l.contains(" cmd=evalsha "))
        .count();
    let others = clients
        .lines()
        .filter(|l| !l.contains(" cmd=client|list ") && !l.contains(" cmd=client "))
        .count();
    assert!(
        deciding >= 2,
        "one connection per serving thread decides: {clients}"
    );
    assert!(
        others <= 5,
        "shared, reset listener and one per thread: {clients}"
    );
}

/// Concurrent requests of one hot counter on a serving thread share script calls (a batch
/// charges their summed cost), and the limit stays exact over two instances: exactly the
/// limit is admitted, each admitted request sees a `remaining` of its own (0 to limit - 1,
/// each once, as one by one), and Redis runs fewer calls than requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_of_one_counter_share_calls_and_stay_exact() {
    let redis = RedisServer::start();
    let api = OrdersApi::start("orders");
    let mut rules = String::new();
    for (name, algorithm, extra) in [
        ("window", "fixed_window", ""),
        ("counter", "sliding_window_counter", ""),
        ("bucket", "token_bucket", "burst = 150\n"),
    ] {
        rules.push_str(&format!(
            "\n[[rules]]\nname = \"{name}\"\nmatch = {{ header = {{ name = \"x-test\", value = \"{name}\" }} }}\nkey = [\"header:x-user\"]\nalgorithm = \"{algorithm}\"\nlimit = 150\nwindow = \"1h\"\n{extra}on_store_error = \"closed\"\n"
        ));
    }
    let s = store(&redis.url(), "2s", "instances = 2");
    let gws = [gateway(api.addr, &s, &rules), gateway(api.addr, &s, &rules)];
    let refs: Vec<&Gateway> = gws.iter().collect();
    let c = client();
    for name in ["window", "counter", "bucket"] {
        let _: String = redis.query(&["CONFIG", "RESETSTAT"]);
        let answers = hammer_ratelimit(
            &refs,
            400,
            64,
            "/orders",
            &[("x-test", name), ("x-user", "hot")],
        )
        .await;
        let mut statuses = BTreeMap::new();
        let mut remaining = Vec::new();
        for (status, state) in answers {
            *statuses.entry(status).or_insert(0) += 1;
            if status == 200 {
                let state = state.expect("an admitted request has RateLimit");
                let r = state
                    .split(';')
                    .find_map(|f| f.strip_prefix("r="))
                    .and_then(|r| r.parse::<u64>().ok())
                    .unwrap_or_else(|| panic!("no remaining in {state}"));
                remaining.push(r);
            }
        }
        assert_eq!(statuses.get(&200), Some(&150), "{name}: {statuses:?}");
        assert_eq!(statuses.get(&429), Some(&250), "{name}: {statuses:?}");
        remaining.sort_unstable();
        let expected: Vec<u64> = (0..150).collect();
        assert_eq!(
            remaining, expected,
            "{name}: each admitted request has the remaining of its place"
        );
        let calls = redis.command_calls("evalsha") + redis.command_calls("eval");
        eprintln!("{name}: 400 requests, 64 at a time, over 2 instances: {calls} script calls");
        assert!(calls < 400, "{name}: {calls} script calls for 400 requests");
    }
    let mut coalesced = 0.0;
    for gw in &gws {
        let metrics = get_text(&c, gw.admin_url("/metrics")).await;
        coalesced += metric_value(&metrics, "floodgate_store_coalesced_decisions_total")
            .expect("the metric is exported");
    }
    assert!(coalesced > 0.0, "no decision shared a call");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_modes_and_recovery() {
    let mut redis = RedisServer::start();
    let api = OrdersApi::start("orders");
    let mut rules = String::new();
    for (mode, limit) in [("open", 3), ("closed", 3), ("local", 10)] {
        rules.push_str(&format!(
            "\n[[rules]]\nname = \"{mode}\"\nmatch = {{ header = {{ name = \"x-mode\", value = \"{mode}\" }} }}\nkey = [\"header:x-user\"]\nalgorithm = \"fixed_window\"\nlimit = {limit}\nwindow = \"1h\"\non_store_error = \"{mode}\"\n"
        ));
    }
    let gw = gateway(
        api.addr,
        &store(&redis.url(), "100ms", "instances = 2"),
        &rules,
    );
    let c = client();
    let send = |mode: &'static str, user: &'static str| {
        c.get(gw.url("/orders"))
            .header("x-mode", mode)
            .header("x-user", user)
            .send()
    };
    // With Redis up, limits are global.
    for _ in 0..3 {
        assert_eq!(send("closed", "u1").await.unwrap().status(), 200);
    }
    assert_eq!(send("closed", "u1").await.unwrap().status(), 429);

    // Kill Redis under load.
    let load = {
        let c = c.clone();
        let url = gw.url("/orders");
        tokio::spawn(async move {
            let mut statuses = BTreeMap::new();
            for i in 0..200 {
                let user = format!("load-{i}");
                let s = c
                    .get(&url)
                    .header("x-mode", "open")
                    .header("x-user", user)
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16();
                *statuses.entry(s).or_insert(0) += 1;
            }
            statuses
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    redis.stop();
    let load = load.await.unwrap();
    assert_eq!(
        load.keys().copied().collect::<Vec<_>>(),
        [200],
        "open rules keep serving: {load:?}"
    );

    for _ in 0..10 {
        assert_eq!(
            send("open", "u2").await.unwrap().status(),
            200,
            "open admits uncounted"
        );
    }
    let r = send("closed", "u3").await.unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let p: serde_json::Value = r.json().await.unwrap();
    assert_eq!(p["type"], "urn:floodgate:problem:limiter-unavailable");
    let mut local = Vec::new();
    for _ in 0..7 {
        local.push(send("local", "u4").await.unwrap().status().as_u16());
    }
    assert_eq!(
        local,
        [200, 200, 200, 200, 200, 429, 429],
        "limit 10 / 2 instances = 5 locally"
    );

    let text = get_text(&c, gw.admin_url("/metrics")).await;
    assert!(text.contains("floodgate_failure_mode_decisions_total{mode=\"open\",rule=\"open\"}"));
    assert!(text.contains("floodgate_store_up 0"), "store reported down");
    let ready: serde_json::Value = get_json(&c, gw.admin_url("/readyz")).await;
    assert_eq!(ready["store"]["up"], false);
    assert!(gw
        .logs()
        .contains("store failed; rule decided by its on_store_error"));

    // Restart Redis (empty): global limiting resumes by itself.
    redis.restart();
    let back = Instant::now();
    loop {
        let s = send("closed", "u5").await.unwrap().status();
        if s == 200 {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(20),
            "no recovery after Redis came back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "global limiting resumed {:?} after Redis restarted",
        back.elapsed()
    );
    for _ in 0..2 {
        assert_eq!(send("closed", "u5").await.unwrap().status(), 200);
    }
    assert_eq!(
        send("closed", "u5").await.unwrap().status(),
        429,
        "counted in Redis again"
    );
}

#[tokio::test]
async fn script_flush_and_a_slow_redis_never_reach_the_client() {
    let redis = RedisServer::start();
    let api = OrdersApi::start("orders");
    let rules = r#"
[[rules]]
name = "open-rule"
key = ["ip"]
algorithm = "token_bucket"
limit = 100000
window = "1s"
on_store_error = "open"
"#;
    let gw = gateway(api.addr, &store(&redis.url(), "50ms", ""), rules);
    let c = client();
    for i in 0..100 {
        if i == 50 {
            let _: String = redis.query(&["SCRIPT", "FLUSH"]);
        }
        let r = c.get(gw.url("/orders")).send().await.unwrap();
        assert_eq!(r.status(), 200, "request {i} after SCRIPT FLUSH");
        assert!(r.headers().contains_key("ratelimit"));
    }
    let text = get_text(&c, gw.admin_url("/metrics")).await;
    assert!(
        text.contains(
            "floodgate_failure_mode_decisions_total{mode=\"open\",rule=\"open-rule\"} 0\n"
        ),
        "SCRIPT FLUSH must not count as a store failure:\n{text}"
    );

    // Stall Redis for a second: decisions give up at 50ms, the rule fails open, latency stays bounded.
    let url = redis.url();
    let sleeper = std::thread::spawn(move || {
        let client = redis::Client::open(url).unwrap();
        let mut conn = client.get_connection().unwrap();
        let _: redis::RedisResult<String> =
            redis::cmd("DEBUG").arg("SLEEP").arg("1").query(&mut conn);
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let start = Instant::now();
    let r = c.get(gw.url("/orders")).send().await.unwrap();
    let took = start.elapsed();
    assert_eq!(r.status(), 200);
    assert!(
        took < Duration::from_millis(800),
        "client waited {took:?} for a stalled Redis"
    );
    sleeper.join().unwrap();
    let text = get_text(&c, gw.admin_url("/metrics")).await;
    assert!(
        text.contains("floodgate_store_errors_total{kind=\"timeout\"}"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_is_global_and_released() {
    let redis = RedisServer::start();
    let api = OrdersApi::start("orders");
    let rules = r#"
[[rules]]
name = "two-in-flight"
key = ["header:x-user"]
algorithm = "concurrency"
limit = 2
on_store_error = "closed"
"#;
    let s = store(&redis.url(), "250ms", "");
    let a = gateway(api.addr, &s, rules);
    let b = gateway(api.addr, &s, rules);
    let c = client();
    let slow = hold_slots(&c, &a.url("/orders?delay_ms=1500"), &[("x-user", "u")], 2);
    wait_for_status(
        &c,
        &b.url("/orders"),
        &[("x-user", "u")],
        429,
        "slots on one instance not seen by the other",
    )
    .await;
    let mut done: Vec<u16> = Vec::new();
    for s in slow {
        done.push(s.await.unwrap());
    }
    assert_eq!(done, [200, 200]);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = c
            .get(b.url("/orders"))
            .header("x-user", "u")
            .send()
            .await
            .unwrap();
        if r.status() == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "slots never released");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_hold_across_two_gateways_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let api = OrdersApi::start("orders");
    let s = cluster.store("250ms", "");
    let rules = r#"
[[rules]]
name = "exact"
key = ["header:x-user"]
algorithm = "sliding_window_log"
limit = 30
window = "1h"
on_store_error = "closed"

[[rules]]
name = "per-ip"
key = ["ip"]
algorithm = "token_bucket"
limit = 100000
window = "1s"
on_store_error = "closed"
"#;
    let a = gateway(api.addr, &s, rules);
    let b = gateway(api.addr, &s, rules);
    for user in ["alice", "bob", "carol"] {
        let counts = hammer(&[&a, &b], 90, 12, "/orders", &[("x-user", user)]).await;
        eprintln!("cluster, limit 30, 90 requests over 2 gateways for {user}: {counts:?}");
        assert_eq!(counts.get(&200), Some(&30), "{user}: {counts:?}");
        assert_eq!(counts.get(&429), Some(&60), "{user}: {counts:?}");
    }
}
