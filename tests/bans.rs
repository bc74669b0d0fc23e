//! `block_for` bans that hold, and a start that is ready before it accepts, through the real
//! binary on real redis-servers:
//!
//! - a usage reset lifts the ban it used to leave in place (memory, Redis, Redis Cluster);
//! - a flood of minted keys cannot evict a ban from the memory store (its own bounded table);
//! - a ban answered by Redis is still enforced in process while Redis is down (`open` and
//!   `local` rules);
//! - the store is connected, its scripts loaded (and a cluster's slots read) before the proxy
//!   listener accepts; `/readyz` is not ready until then, and a start with Redis unreachable
//!   still serves after `store.connect_timeout`, by the rules' `on_store_error`.

mod common;

use std::net::TcpStream;
use std::time::Duration;

use common::redis::{RedisCluster, RedisServer};
use common::*;

const TOKEN: &str = "bans-admin-token-7";

/// One admin request with this file's token: (status, body).
fn admin(gw: &Gateway, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    admin_json(gw, TOKEN, method, path, body)
}

/// `GET /orders` as acme-prod: (status, Retry-After in seconds).
async fn as_acme(c: &reqwest::Client, gw: &Gateway) -> (u16, Option<u64>) {
    let r = get_with_key(c, gw.url("/orders"), "test").await;
    let retry = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.parse().ok());
    (r.status().as_u16(), retry)
}

const BANNING_RULE: &str = r#"
[[rules]]
name = "per-key"
key = ["api_key"]
algorithm = "fixed_window"
limit = 2
window = "1h"
block_for = "10m"
on_store_error = "closed"
"#;

/// Exhausts acme-prod's quota into a ban, resets it through the usage API, and checks that
/// the reset lifted the ban: the answer says so and the next request is admitted.
async fn a_reset_lifts_the_ban_on(store: &str) {
    let api = OrdersApi::start("orders");
    let gw = keyed_gateway(TOKEN, &orders_upstream(&[api.addr]), store, BANNING_RULE);
    let c = client();
    assert_eq!(as_acme(&c, &gw).await.0, 200);
    assert_eq!(as_acme(&c, &gw).await.0, 200);
    let (status, retry) = as_acme(&c, &gw).await;
    assert_eq!(status, 429);
    assert!(retry.is_some_and(|r| r > 540), "banned for 10m: {retry:?}");

    let (status, v) = admin(
        &gw,
        "POST",
        "/usage/reset",
        r#"{"rule":"per-key","api_key":"acme-prod"}"#,
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["after"]["remaining"], 2, "{v}");
    assert_eq!(v["ban_lifted"], true, "{v}");
    assert_eq!(
        as_acme(&c, &gw).await,
        (200, None),
        "a reset that answers remaining = limit admits the next request"
    );
    // Nothing left to lift the second time.
    let (_, v) = admin(
        &gw,
        "POST",
        "/usage/reset",
        r#"{"rule":"per-key","api_key":"acme-prod"}"#,
    );
    assert_eq!(v["ban_lifted"], false, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_lifts_a_ban_in_memory() {
    a_reset_lifts_the_ban_on("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_lifts_a_ban_in_redis() {
    let redis = RedisServer::start();
    let store = format!(
        "\n[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout = \"250ms\"\n",
        redis.url()
    );
    a_reset_lifts_the_ban_on(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_lifts_a_ban_in_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let store = cluster.store("250ms", "");
    a_reset_lifts_the_ban_on(&store).await;
}

/// With `max_keys = 200`, a client minting 400 users (each banned after its second request)
/// used to evict the oldest ban, the victim's: once its 1 s window was over, the victim was
/// admitted inside its 15-minute ban. Bans now live in their own table, and a full table
/// refuses the flood's new bans instead of lifting live ones (counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_minted_keys_cannot_evict_a_ban() {
    let api = OrdersApi::start("orders");
    let gw = Gateway::start(&format!(
        "{}{}\n[store]\nmax_keys = 200\nmax_bans = 200\n\n[[rules]]\nname = \"per-user\"\nkey = [\"header:x-user\"]\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1s\"\nblock_for = \"15m\"\n",
        orders_upstream(&[api.addr]),
        common::redis::ROUTES,
    ));
    let c = client();
    let send = |user: String| c.get(gw.url("/orders")).header("x-user", user).send();
    assert_eq!(send("victim".into()).await.unwrap().status(), 200);
    // The second request of a window is refused and banned. Fixed windows are aligned on whole
    // seconds: when a boundary falls between the two requests, the second is the first of the
    // next window (admitted), and the one after it, a moment later, is the refused second.
    let mut second = send("victim".into()).await.unwrap().status();
    if second == 200 {
        second = send("victim".into()).await.unwrap().status();
    }
    assert_eq!(
        second, 429,
        "the victim's second request of a window is refused"
    );
    let banned_at = std::time::Instant::now();

    let started = std::time::Instant::now();
    for i in 0..400 {
        for _ in 0..2 {
            send(format!("minted-{i}")).await.unwrap();
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "flood too slow"
        );
    }
    // Not a race being waited out: the victim's 1 s window must be over, so that only its ban
    // (not its counter) can refuse it.
    let window_over = Duration::from_millis(1100);
    if let Some(left) = window_over.checked_sub(banned_at.elapsed()) {
        tokio::time::sleep(left).await;
    }
    let r = send("victim".into()).await.unwrap();
    assert_eq!(r.status(), 429, "the victim's ban survived the flood");
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry > 800, "still the 15-minute ban: {retry}");

    let metrics = get_text(&c, gw.admin_url("/metrics")).await;
    let refused = metric_value(
        &metrics,
        "floodgate_memory_store_bans_dropped_total{how=\"refused\"}",
    );
    assert!(
        refused.is_some_and(|n| n >= 50.0),
        "the bans not kept are counted: {refused:?}"
    );
    let held = metric_value(&metrics, "floodgate_memory_store_bans");
    assert!(held.is_some_and(|n| n <= 200.0), "bounded: {held:?}");
}

/// A ban Redis answered is remembered in process: with Redis killed, the banned user is still
/// refused under `on_store_error = "open"` (which used to let it through) and `"local"`,
/// while other users get what their rule's `on_store_error` says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ban_holds_while_redis_is_down() {
    let mut redis = RedisServer::start();
    let api = OrdersApi::start("orders");
    let mut rules = String::new();
    for mode in ["open", "local"] {
        rules.push_str(&format!(
            "\n[[rules]]\nname = \"{mode}\"\nmatch = {{ header = {{ name = \"x-mode\", value = \"{mode}\" }} }}\nkey = [\"header:x-user\"]\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1h\"\nblock_for = \"15m\"\non_store_error = \"{mode}\"\n"
        ));
    }
    let gw = common::redis::gateway(
        api.addr,
        &common::redis::store(&redis.url(), "100ms", ""),
        &rules,
    );
    let c = client();
    let send = |mode: &'static str, user: &'static str| {
        c.get(gw.url("/orders"))
            .header("x-mode", mode)
            .header("x-user", user)
            .send()
    };
    for mode in ["open", "local"] {
        assert_eq!(send(mode, "victim").await.unwrap().status(), 200);
        assert_eq!(send(mode, "victim").await.unwrap().status(), 429, "{mode}");
    }

    redis.stop();
    // Once the store fails, open admits users it never saw banned.
    eventually(
        Duration::from_secs(10),
        "open admits during the outage",
        || {
            let r = send("open", "someone");
            async move { (r.await.ok()?.status() == 200).then_some(()) }
        },
    )
    .await;
    for mode in ["open", "local"] {
        for _ in 0..3 {
            let r = send(mode, "victim").await.unwrap();
            assert_eq!(r.status(), 429, "{mode}: the victim is still banned");
            let retry: u64 = r.headers()["retry-after"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            // What Redis said to wait: the ban's end, or the 1 h window's if later.
            assert!((800..=3600).contains(&retry), "{mode}: {retry}");
        }
    }
    assert_eq!(send("local", "other").await.unwrap().status(), 200);
    assert_eq!(
        send("local", "other").await.unwrap().status(),
        429,
        "the local fallback decides (and bans) in process"
    );
    let text = get_text(&c, gw.admin_url("/metrics")).await;
    assert!(text.contains("floodgate_store_up 0"), "the store is down");
}

/// The SHA1 of the decide script, as Redis names it.
fn decide_sha() -> String {
    redis::Script::new(floodgate::limiter::redis::script::DECIDE_LUA)
        .get_hash()
        .to_string()
}

/// Whether `node` has the decide script loaded.
fn has_decide(node: &RedisServer, sha: &str) -> bool {
    let loaded: Vec<i64> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(sha)
        .query(&mut node.connection())
        .unwrap();
    loaded == [1]
}

const CLOSED_RULE: &str = r#"
[[rules]]
name = "closed"
key = ["ip"]
algorithm = "fixed_window"
limit = 1000
window = "1h"
on_store_error = "closed"
"#;

/// Eight fresh starts on a healthy Redis whose scripts were flushed, each with the default
/// 20 ms `store.timeout` and `closed`: the proxy listener accepts only once the scripts are
/// loaded, and each start answers its very first request 200 (it used to make the connection
/// and load the script inside that request's 20 ms: 503 on some starts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_starts_answer_their_first_request() {
    let redis = RedisServer::start();
    let api = OrdersApi::start("orders");
    let sha = decide_sha();
    let store = format!(
        "\n[store]\nbackend = \"redis\"\nurl = \"{}\"\n",
        redis.url()
    );
    for start in 0..8 {
        redis.query::<String>(&["SCRIPT", "FLUSH"]);
        let mut gw = common::redis::gateway(api.addr, &store, CLOSED_RULE);
        assert!(
            has_decide(&redis, &sha),
            "start {start}: scripts loaded before the listener accepted"
        );
        let (status, _) = admin_get(gw.admin, "/readyz").unwrap();
        assert_eq!(status, 200, "start {start}: ready");
        let first = client().get(gw.url("/orders")).send().await.unwrap();
        assert_eq!(first.status(), 200, "start {start}: the first request");
        gw.stop();
    }
}

/// The same on a Redis Cluster: every master has the scripts (and the slot map was read)
/// before the listener accepts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_start_on_a_cluster_is_ready_before_it_accepts() {
    let cluster = RedisCluster::start();
    let api = OrdersApi::start("orders");
    let sha = decide_sha();
    let urls: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    let store = format!(
        "\n[store]\nbackend = \"redis-cluster\"\nurls = [{}]\n",
        urls.join(", ")
    );
    for start in 0..2 {
        for node in &cluster.nodes {
            node.query::<String>(&["SCRIPT", "FLUSH"]);
        }
        let mut gw = common::redis::gateway(api.addr, &store, CLOSED_RULE);
        for (i, node) in cluster.nodes.iter().enumerate() {
            assert!(
                has_decide(node, &sha),
                "start {start}: master {i} has the scripts"
            );
        }
        let first = client().get(gw.url("/orders")).send().await.unwrap();
        assert_eq!(first.status(), 200, "start {start}: the first request");
        gw.stop();
    }
}

/// A gateway spawned by hand (the harness waits for the proxy listener, which here waits for
/// Redis): stopped when dropped.
struct Starting {
    child: std::process::Child,
    _dir: tempfile::TempDir,
    addr: std::net::SocketAddr,
    admin: std::net::SocketAddr,
}

impl Drop for Starting {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

fn spawn_waiting(api: std::net::SocketAddr, store: &str) -> Starting {
    let dir = tempfile::tempdir().unwrap();
    let (addr, admin) = (free_addr(), free_addr());
    let config = format!(
        "{}{}{store}{}{CLOSED_RULE}",
        server_section(addr, admin),
        orders_upstream(&[api]),
        common::redis::ROUTES
    );
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, config).unwrap();
    let log = dir.path().join("floodgate.log");
    let mut child = spawn_floodgate(&path, dir.path(), &log, &[]);
    wait_for_port(
        admin,
        Duration::from_secs(30),
        &mut child,
        "floodgate (admin)",
    );
    Starting {
        child,
        _dir: dir,
        addr,
        admin,
    }
}

/// Redis unreachable at start: `/readyz` answers 503 and the proxy listener does not accept
/// while the start waits (`connect_timeout = "60s"`); once Redis is up, both are ready and
/// the first request is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_not_ready_while_redis_is_unreachable_at_start() {
    let mut redis = RedisServer::start();
    redis.stop();
    let api = OrdersApi::start("orders");
    let store = format!(
        "\n[store]\nbackend = \"redis\"\nurl = \"{}\"\nconnect_timeout = \"60s\"\n",
        redis.url()
    );
    let gw = spawn_waiting(api.addr, &store);
    for _ in 0..5 {
        let (status, body) = admin_get(gw.admin, "/readyz").unwrap();
        assert_eq!(status, 503, "{body}");
        assert!(body.contains("starting"), "{body}");
        assert!(
            TcpStream::connect_timeout(&gw.addr, Duration::from_millis(200)).is_err(),
            "the proxy listener waits for Redis"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    redis.restart();
    eventually(
        Duration::from_secs(20),
        "ready once Redis is up",
        || async {
            admin_get(gw.admin, "/readyz")
                .ok()
                .filter(|(status, _)| *status == 200)
        },
    )
    .await;
    let first = client()
        .get(format!("http://{}/orders", gw.addr))
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
}

/// Redis unreachable for good: the start serves after `connect_timeout`, by the rules'
/// `on_store_error` (503 for `closed`), and `/readyz` says not ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_without_redis_serves_after_the_deadline() {
    let mut redis = RedisServer::start();
    redis.stop();
    let api = OrdersApi::start("orders");
    let store = format!(
        "\n[store]\nbackend = \"redis\"\nurl = \"{}\"\nconnect_timeout = \"1s\"\n",
        redis.url()
    );
    let gw = common::redis::gateway(api.addr, &store, CLOSED_RULE);
    let r = client().get(gw.url("/orders")).send().await.unwrap();
    assert_eq!(r.status(), 503, "closed: Redis is down");
    let (status, body) = admin_get(gw.admin, "/readyz").unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(gw.logs().contains("not ready within store.connect_timeout"));
}
