//! Quota leasing (`lease`) through the real binary against real redis-servers: exact across
//! three gateway instances for every leasable algorithm, a hot key that seldom touches Redis,
//! cold keys that cost no more than before, leased and exact rules in one round trip with
//! all-or-nothing, unspent permits returned on reload and shutdown, a crashed instance that
//! never makes the fleet over-admit, a Redis Cluster, and concurrency slots renewed while a
//! request longer than their TTL runs.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::redis::{gateway, hammer, store, RedisCluster, RedisServer, ROUTES};
use common::*;

/// A `[store]` table for `url` with the decision budget these tests use.
fn leasing_store(url: &str, extra: &str) -> String {
    store(url, "250ms", extra)
}

fn admitted(counts: &BTreeMap<u16, usize>) -> usize {
    counts.get(&200).copied().unwrap_or(0)
}

/// One leased rule per leasable algorithm, each matched by `x-test = <its name>`, with windows
/// long enough that nothing refills during a test (and aligned windows that do not end
/// during it): the exact count is the limit.
fn leased_rules(limit: u64, lease: &str) -> String {
    let mut out = String::new();
    let burst = format!("burst = {limit}\n");
    for (name, algorithm, extra) in [
        ("fw", "fixed_window", String::new()),
        ("swc", "sliding_window_counter", String::new()),
        ("tb", "token_bucket", burst.clone()),
        ("lb", "leaky_bucket", format!("{burst}mode = \"police\"\n")),
    ] {
        out.push_str(&format!(
            "\n[[rules]]\nname = \"{name}\"\nmatch = {{ header = {{ name = \"x-test\", value = \"{name}\" }} }}\nkey = [\"header:x-user\"]\nalgorithm = \"{algorithm}\"\nlimit = {limit}\nwindow = \"1d\"\n{extra}on_store_error = \"closed\"\nlease = {lease}\n"
        ));
    }
    out
}

/// A fixed-window rule `name` on `x-user` that leases `lease` permits for `lease_ttl`, closed
/// when the store fails.
fn leased_fixed_window(
    name: &str,
    limit: u64,
    window: &str,
    lease: u64,
    lease_ttl: &str,
) -> String {
    format!(
        "\n[[rules]]\nname = \"{name}\"\nkey = [\"header:x-user\"]\nalgorithm = \"fixed_window\"\nlimit = {limit}\nwindow = \"{window}\"\nlease = {lease}\nlease_ttl = \"{lease_ttl}\"\non_store_error = \"closed\"\n"
    )
}

/// The count of a fixed window's state at `key` (see lua/common.lua: tag, window end, count
/// as little-endian doubles).
fn fixed_window_count(redis: &RedisServer, pattern: &str) -> u64 {
    let keys: Vec<String> = redis.query(&["KEYS", pattern]);
    assert_eq!(keys.len(), 1, "one state key for {pattern}: {keys:?}");
    let state: Vec<u8> = redis.query(&["GET", &keys[0]]);
    assert_eq!(state.len(), 17, "a fixed window's packed state");
    f64::from_le_bytes(state[9..17].try_into().unwrap()) as u64
}

/// Milliseconds since the epoch on this machine's clock, which Redis (running here) shares.
fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// Which aligned 3 s window the clock is in.
fn window_index() -> u128 {
    now_ms() / 3000
}

/// One `GET /orders` with `headers`: its status.
async fn get_orders(c: &reqwest::Client, gw: &Gateway, headers: &[(&str, &str)]) -> u16 {
    let mut req = c.get(gw.url("/orders"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap().status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_never_admit_more_than_the_limit() {
    let redis = RedisServer::start();
    let api = OrdersApi::start("orders");
    let limit = 90;
    let s = leasing_store(&redis.url(), "instances = 3");
    let rules = leased_rules(limit, "\"auto\"");
    let gws: Vec<Gateway> = (0..3).map(|_| gateway(api.addr, &s, &rules)).collect();
    let refs: Vec<&Gateway> = gws.iter().collect();
    for name in ["fw", "swc", "tb", "lb"] {
        // 2x the limit, spread over the three instances, a bounded number at a time.
        let counts = hammer(
            &refs,
            2 * limit as usize,
            6,
            "/orders",
            &[("x-test", name), ("x-user", "alice")],
        )
        .await;
        eprintln!(
            "{name}: limit {limit}, {} offered over 3 instances: {counts:?}",
            2 * limit
        );
        let ok = admitted(&counts);
        assert!(
            ok <= limit as usize,
            "{name}: {ok} admitted > limit {limit}"
        );
        assert!(
            ok as f64 >= 0.9 * limit as f64,
            "{name}: only {ok} of {limit} admitted under steady load"
        );
        assert_eq!(
            ok + counts.get(&429).copied().unwrap_or(0),
            2 * limit as usize,
            "{name}: {counts:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_seldom_calls_redis_and_cold_keys_cost_no_more() {
    let redis = RedisServer::start();
    let api = OrdersApi::start("orders");
    let rules = r#"
[[rules]]
name = "hot"
match = { header = { name = "x-test", value = "hot" } }
key = ["header:x-user"]
algorithm = "token_bucket"
limit = 1000000
window = "1s"
lease = "auto"

[[rules]]
name = "cold"
match = { header = { name = "x-test", value = "cold" } }
key = ["header:x-user"]
algorithm = "token_bucket"
limit = 1000
window = "1m"
lease = "auto"
lease_ttl = "50ms"
"#;
    let gw = gateway(api.addr, &leasing_store(&redis.url(), ""), rules);
    let c = client();
    // Warm the connection and load the script (a first EVALSHA meets NOSCRIPT and is sent
    // again).
    assert_eq!(
        get_orders(&c, &gw, &[("x-test", "cold"), ("x-user", "warm")]).await,
        200
    );

    // Cold keys: a key seen once, and a key seen less often than its lease TTL, cost one
    // call per request, never more (no lease to return).
    let before = redis.command_calls("evalsha");
    let mut sent = 0;
    for i in 0..10 {
        let user = format!("once-{i}");
        assert_eq!(
            get_orders(&c, &gw, &[("x-test", "cold"), ("x-user", &user)]).await,
            200
        );
        sent += 1;
    }
    for _ in 0..5 {
        assert_eq!(
            get_orders(&c, &gw, &[("x-test", "cold"), ("x-user", "seldom")]).await,
            200
        );
        sent += 1;
        // The load shape under test: one request per 200 ms, four lease TTLs apart.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Let the returner run past its period: it must find nothing to give back.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let calls = redis.command_calls("evalsha") - before;
    eprintln!("cold keys: {calls} EVALSHA for {sent} requests");
    assert_eq!(calls, sent, "one call per cold request, no lease returns");

    let n = 3000;
    let before = redis.command_calls("evalsha");
    let stats_before = get_json(&c, gw.admin_url("/stats")).await["store"].clone();
    let counts = hammer(
        &[&gw],
        n,
        16,
        "/orders",
        &[("x-test", "hot"), ("x-user", "big")],
    )
    .await;
    assert_eq!(admitted(&counts), n, "{counts:?}");
    let calls = redis.command_calls("evalsha") - before;
    let per_request = calls as f64 / n as f64;
    eprintln!("hot key: {calls} EVALSHA for {n} requests = {per_request:.4} per request");
    assert!(per_request <= 0.05, "{calls} calls for {n} requests");
    // /stats counts the requests that asked the store, not every request with a global rule:
    // a request spent from a lease made no call.
    let stats = get_json(&c, gw.admin_url("/stats")).await["store"].clone();
    let asked = stats["store_requests"].as_u64().unwrap()
        - stats_before["store_requests"].as_u64().unwrap();
    let decided = stats["decided_requests"].as_u64().unwrap()
        - stats_before["decided_requests"].as_u64().unwrap();
    assert_eq!(decided, n as u64, "{stats}");
    assert!(asked <= calls, "{asked} requests asked, {calls} EVALSHA");

    // /rules shows leasing; /metrics counts leases, permits and calls per request (spends
    // are added in batches by the returner: poll, bounded).
    let rules = get_json(&c, gw.admin_url("/rules")).await;
    assert_eq!(rules["rules"][0]["lease"], "auto", "{rules}");
    assert_eq!(rules["rules"][1]["lease_ttl"], "50ms", "{rules}");
    let start = Instant::now();
    loop {
        let m = get_text(&c, gw.admin_url("/metrics")).await;
        let spent = metric_value(
            &m,
            "floodgate_lease_permits_total{event=\"spent\",rule=\"hot\"}",
        )
        .unwrap_or(0.0);
        if spent >= n as f64 {
            assert!(
                m.contains("floodgate_lease_taken_total{rule=\"hot\"}"),
                "{m}"
            );
            assert!(
                m.contains("floodgate_lease_permits_total{event=\"leased\",rule=\"hot\"}"),
                "{m}"
            );
            assert!(m.contains("floodgate_store_calls_per_request_count"), "{m}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "spent permits not counted: {spent}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_and_exact_rules_share_one_round_trip_all_or_nothing() {
    let redis = RedisServer::start();
    let api = OrdersApi::start("orders");
    let rules = leased_fixed_window("leased", 100, "1d", 20, "1h")
        + r#"
[[rules]]
name = "exact"
match = { header = { name = "x-test", value = "both" } }
key = ["header:x-user"]
algorithm = "sliding_window_log"
limit = 10
window = "1h"
on_store_error = "closed"
"#;
    let gw = gateway(api.addr, &leasing_store(&redis.url(), ""), &rules);
    // Load the script first (a first EVALSHA meets NOSCRIPT and is sent again).
    let warm = hammer(&[&gw], 1, 1, "/orders", &[("x-user", "warm")]).await;
    assert_eq!(admitted(&warm), 1);
    let before = redis.command_calls("evalsha");
    let counts = hammer(
        &[&gw],
        40,
        1,
        "/orders",
        &[("x-test", "both"), ("x-user", "u")],
    )
    .await;
    let calls = redis.command_calls("evalsha") - before;
    assert_eq!(admitted(&counts), 10, "{counts:?}");
    assert!(calls <= 40, "at most one round trip per request: {calls}");
    // The 30 requests the exact rule rejected charged the leased rule nothing: 90 are left.
    let counts = hammer(&[&gw], 150, 4, "/orders", &[("x-user", "u")]).await;
    assert_eq!(admitted(&counts), 90, "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unspent_permits_come_back_on_reload_and_shutdown() {
    let redis = RedisServer::start();
    let api = OrdersApi::start("orders");
    let rules = &leased_fixed_window("fw", 100, "1d", 40, "1h");
    let s = leasing_store(&redis.url(), "key_prefix = \"fg:\"");
    let a = gateway(api.addr, &s, rules);
    let c = client();

    // Reload: one request leases 40 permits (held for an hour); a reload gives back 39.
    assert_eq!(get_orders(&c, &a, &[("x-user", "r")]).await, 200);
    assert_eq!(fixed_window_count(&redis, "fg:fw:*"), 40, "leased");
    let r = c.post(a.admin_url("/reload")).send().await.unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    eventually(Duration::from_secs(5), "returned on reload", || {
        std::future::ready((fixed_window_count(&redis, "fg:fw:*") == 1).then_some(()))
    })
    .await;

    // Shutdown (SIGTERM): the lease taken again is given back before the process exits.
    assert_eq!(get_orders(&c, &a, &[("x-user", "r")]).await, 200);
    assert_eq!(fixed_window_count(&redis, "fg:fw:*"), 41);
    send_signal(a.pid(), "TERM");
    eventually(Duration::from_secs(10), "returned on shutdown", || {
        std::future::ready((fixed_window_count(&redis, "fg:fw:*") == 2).then_some(()))
    })
    .await;

    // Another instance gets every permit left: 98.
    let b = gateway(api.addr, &s, rules);
    let counts = hammer(&[&b], 150, 4, "/orders", &[("x-user", "r")]).await;
    assert_eq!(admitted(&counts), 98, "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_instance_never_makes_the_fleet_over_admit() {
    let redis = RedisServer::start();
    let api = OrdersApi::start("orders");
    let rules = &leased_fixed_window("fw", 50, "3s", 20, "10s");
    let s = leasing_store(&redis.url(), "key_prefix = \"fg:\"");
    let mut a = gateway(api.addr, &s, rules);
    let b = gateway(api.addr, &s, rules);
    let c = client();
    // Wait for the start of a window, so the whole test fits in it.
    eventually(Duration::from_secs(5), "a fresh window", || {
        std::future::ready((now_ms() % 3000 < 300).then_some(()))
    })
    .await;
    let first = window_index();
    assert_eq!(get_orders(&c, &a, &[("x-user", "k")]).await, 200);
    send_signal(a.pid(), "KILL");
    a.stop();
    // A held 19 unspent permits when it died: they stay charged (A may have spent them), so
    // B admits what is left and no more.
    let counts = hammer(&[&b], 60, 4, "/orders", &[("x-user", "k")]).await;
    assert_eq!(admitted(&counts), 30, "{counts:?}");
    // They come back when the window ends: B gets the whole limit in the next window.
    eventually(Duration::from_secs(8), "the next window", || {
        std::future::ready((window_index() > first).then_some(()))
    })
    .await;
    let counts = hammer(&[&b], 60, 4, "/orders", &[("x-user", "k")]).await;
    assert_eq!(admitted(&counts), 50, "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_exact_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let api = OrdersApi::start("orders");
    let s = cluster.store("250ms", "instances = 2");
    let rules = format!(
        "{}{}",
        leased_rules(60, "\"auto\""),
        r#"
[[rules]]
name = "per-ip"
key = ["ip"]
algorithm = "sliding_window_log"
limit = 100000
window = "1s"
on_store_error = "closed"
"#
    );
    let a = gateway(api.addr, &s, &rules);
    let b = gateway(api.addr, &s, &rules);
    for name in ["fw", "tb"] {
        for user in ["alice", "bob"] {
            let counts = hammer(
                &[&a, &b],
                120,
                6,
                "/orders",
                &[("x-test", name), ("x-user", user)],
            )
            .await;
            eprintln!("cluster {name} {user}: {counts:?}");
            let ok = admitted(&counts);
            assert!(ok <= 60, "{name} {user}: {ok} > 60");
            assert!(ok >= 54, "{name} {user}: only {ok} of 60");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_slot_is_renewed_while_its_request_runs() {
    // The slot TTL shortened to 1 s (an internal test hook; 300 s in production), given to this
    // gateway alone. Renewal runs every third of it, so one renewal may be late by up to two
    // thirds of a TTL (a loaded machine) before the slot lapses.
    const TTL_MS: u64 = 1000;
    let redis = RedisServer::start();
    let api = OrdersApi::start("orders");
    let rules = r#"
[[rules]]
name = "exports"
key = ["header:x-user"]
algorithm = "concurrency"
limit = 1
on_store_error = "closed"
"#;
    // The upstream may take its time: the request under test lasts 6 s, six slot TTLs.
    let ttl = TTL_MS.to_string();
    let gw = Gateway::start_env(
        server_section,
        &format!(
            "[[upstreams]]\nname = \"orders\"\ntargets = [\"{}\"]\nread_timeout = \"20s\"\n{}{ROUTES}{rules}",
            api.addr,
            leasing_store(&redis.url(), "")
        ),
        &[],
        &[("FLOODGATE_TEST_SLOT_TTL_MS", &ttl)],
    );
    let c = client();
    let probe = || async {
        c.get(gw.url("/orders"))
            .header("x-user", "e")
            .send()
            .await
            .map(|r| r.status().as_u16())
            .unwrap_or(0)
    };
    // Start the long request and wait (bounded) until it holds the slot. A probe may win the
    // slot first, and the long request is then refused: start it again.
    let start = Instant::now();
    let mut long = loop {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the long request never held its slot"
        );
        let req = c.get(gw.url("/orders?delay_ms=6000")).header("x-user", "e");
        let long = tokio::spawn(async move { req.send().await.map(|r| r.status().as_u16()) });
        let mut held = false;
        while !long.is_finished() {
            if probe().await == 429 {
                held = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if held {
            break long;
        }
    };
    let held_at = Instant::now();
    // While it runs, far past the slot TTL, the slot stays taken. A probe admitted means the
    // slot was freed: only the long request ending may do that.
    let mut ended = None;
    while ended.is_none() {
        if long.is_finished() {
            ended = Some((&mut long).await);
            break;
        }
        let status = probe().await;
        if status != 429 {
            let done = tokio::time::timeout(Duration::from_secs(1), &mut long).await;
            assert!(
                done.is_ok(),
                "probe got {status} {:?} after the slot was held, while the request still ran",
                held_at.elapsed()
            );
            ended = done.ok();
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        held_at.elapsed() >= Duration::from_millis(3 * TTL_MS),
        "the request ended before three slot TTLs passed: nothing was shown"
    );
    assert_eq!(ended.unwrap().unwrap().unwrap(), 200);
    // It ended: the slot is free again.
    let start = Instant::now();
    while probe().await != 200 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "slot not released"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn check_refuses_lease_where_it_cannot_be_exact_and_shows_it_where_it_is() {
    let base = "[[upstreams]]\nname = \"orders\"\ntargets = [\"127.0.0.1:9\"]\n\n[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n\n[[routes]]\nname = \"orders\"\nmatch = { path_prefix = \"/orders\" }\nupstream = \"orders\"\n";
    for (algorithm, extra, reason) in [
        (
            "sliding_window_log",
            "window = \"1m\"\n",
            "sliding_window_log keeps one timestamp per request",
        ),
        ("concurrency", "", "concurrency counts requests in flight"),
        (
            "leaky_bucket",
            "window = \"1s\"\nmode = \"shape\"\n",
            "a shaping leaky bucket",
        ),
    ] {
        let config = format!(
            "{base}\n[[rules]]\nname = \"r\"\nkey = [\"ip\"]\nalgorithm = \"{algorithm}\"\nlimit = 10\n{extra}lease = \"auto\"\n"
        );
        let (ok, _out, err) = check(&config, &[]);
        assert!(!ok, "{algorithm}: lease accepted");
        assert!(err.contains(reason), "{algorithm}: {err}");
        // file:line:col of the lease value.
        let line = config.lines().position(|l| l.starts_with("lease")).unwrap() + 1;
        assert!(
            err.contains(&format!("gateway.toml:{line}:9")),
            "{algorithm}: {err}"
        );
    }
    let token_bucket = |extra: &str| {
        format!(
            "{base}\n[[rules]]\nname = \"r\"\nkey = [\"ip\"]\nalgorithm = \"token_bucket\"\nlimit = 10\nwindow = \"1s\"\n{extra}"
        )
    };
    let (ok, _out, err) = check(&token_bucket("lease = 0\n"), &[]);
    assert!(
        !ok && err.contains("lease must be \"auto\" or a whole number"),
        "{err}"
    );
    let (ok, _out, err) = check(&token_bucket("scope = \"local\"\nlease = 5\n"), &[]);
    assert!(!ok && err.contains("global rules only"), "{err}");
    let (ok, out, err) = check(&token_bucket("lease = 5\nlease_ttl = \"250ms\"\n"), &[]);
    assert!(ok, "{err}");
    assert!(out.contains("lease 5 for 250ms"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_in_hand_are_spent_while_redis_is_down_then_on_store_error_applies() {
    let mut redis = RedisServer::start();
    let api = OrdersApi::start("orders");
    let rules = &leased_fixed_window("fw", 100, "1d", 20, "1h");
    let gw = gateway(api.addr, &leasing_store(&redis.url(), ""), rules);
    // One request leases 20 permits: its own and 19 in hand.
    let counts = hammer(&[&gw], 1, 1, "/orders", &[("x-user", "d")]).await;
    assert_eq!(admitted(&counts), 1, "{counts:?}");
    redis.stop();
    let counts = hammer(&[&gw], 30, 1, "/orders", &[("x-user", "d")]).await;
    assert_eq!(admitted(&counts), 19, "the permits in hand: {counts:?}");
    assert_eq!(counts.get(&503), Some(&11), "then closed: {counts:?}");
}
