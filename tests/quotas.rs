//! Sellable quotas against the real stores and the real binary: calendar periods
//! (`calendar`, `timezone`) counted exactly in process, on a real redis-server and on a Redis
//! Cluster across midnight in Tokyo, New York's 23- and 25-hour DST days and a leap day, with
//! the period chosen by Redis' clock; and calendar rules through the binary (headers, exact
//! counts over several instances, leasing).

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::redis::{gateway, hammer, store, store_settings, RedisCluster, RedisServer};
use common::*;
use floodgate::config::{Backend, Store};
use floodgate::limiter::algorithm::{self, State};
use floodgate::limiter::calendar::{Calendar, Period};
use floodgate::limiter::memory::{ManualClock, MemoryStore};
use floodgate::limiter::redis::script::DECIDE_LUA;
use floodgate::limiter::redis::RedisStore;
use floodgate::limiter::{Algorithm, Check, Decision, Limit};

const GENEROUS: Duration = Duration::from_secs(5);
const PREFIX: &str = "fg-quota:";

/// ns since the epoch of an RFC 3339 instant written out in the test.
fn at(instant: &str) -> u64 {
    let t: jiff::Timestamp = instant.parse().expect("an RFC 3339 instant");
    u64::try_from(t.as_nanosecond()).expect("after 1970")
}

fn calendar_limit(limit: u64, period: Period, zone: &str) -> Limit {
    Limit::police(Algorithm::FixedWindow, limit, Duration::from_secs(1), limit)
        .with_calendar(Calendar::new(period, zone).expect("a known zone"))
        .expect("fixed_window takes a calendar")
}

fn check(rule: &str, counter: u64, limit: &Limit) -> Check {
    Check {
        rule: rule.into(),
        counter,
        limit: limit.clone(),
        cost: 1,
    }
}

fn store_config(backend: Backend, urls: Vec<String>) -> Store {
    store_settings(backend, urls, Duration::from_millis(250), PREFIX)
}

/// The reference: `algorithm::decide` on one key at a time, charged when admitted.
#[derive(Default)]
struct Reference {
    states: HashMap<String, State>,
}

impl Reference {
    fn decide(&mut self, key: &str, c: &Check, now_ns: u64) -> Decision {
        let (d, u) = algorithm::decide(self.states.get(key), &c.limit, now_ns, c.cost);
        if d.allowed {
            match self.states.get_mut(key) {
                Some(s) => u.apply(s),
                None => {
                    if let Some(s) = u.into_state() {
                        self.states.insert(key.to_string(), s);
                    }
                }
            }
        }
        d
    }
}

/// The calendar rules these tests count, with the instants each is driven across: midnight in
/// Tokyo, New York's DST days, a week over a DST change, February of a leap year.
fn calendar_cases() -> Vec<(&'static str, Limit, Vec<&'static str>)> {
    vec![
        (
            "tokyo-day",
            calendar_limit(3, Period::Day, "Asia/Tokyo"),
            vec![
                "2026-12-01T14:59:58Z",
                "2026-12-01T14:59:59.999Z",
                "2026-12-01T15:00:00Z",
            ],
        ),
        (
            "ny-day",
            calendar_limit(2, Period::Day, "America/New_York"),
            vec![
                "2026-03-08T04:59:59Z",
                "2026-03-08T05:00:00Z",
                "2026-03-09T03:59:59Z",
                "2026-03-09T04:00:00Z",
                "2026-11-01T03:59:59Z",
                "2026-11-01T04:00:00Z",
                "2026-11-02T04:59:59Z",
                "2026-11-02T05:00:00Z",
            ],
        ),
        (
            "ny-week",
            calendar_limit(4, Period::Week, "America/New_York"),
            vec![
                "2026-03-09T03:59:59Z",
                "2026-03-16T03:59:59Z",
                "2026-03-16T04:00:00Z",
            ],
        ),
        (
            "utc-month",
            calendar_limit(5, Period::Month, "UTC"),
            vec![
                "2028-02-01T00:00:00Z",
                "2028-02-29T23:59:59Z",
                "2028-03-01T00:00:00Z",
            ],
        ),
    ]
}

/// Drives every calendar rule across its instants on `store`, three requests per instant
/// (enough to exhaust the smaller limits), comparing each decision with the reference.
/// Returns how many decisions were compared and how many of them rejected.
async fn compare_with_reference(store: &RedisStore) -> (usize, usize) {
    let mut reference = Reference::default();
    let (mut compared, mut rejected) = (0, 0);
    for (name, limit, instants) in calendar_cases() {
        let c = check(name, 0x5eed, &limit);
        let key = store.redis_key(&c);
        for instant in instants {
            for i in 0..3u64 {
                let now_ns = at(instant) + i * 1000;
                let got = store
                    .decide_at(std::slice::from_ref(&c), i, GENEROUS, now_ns / 1000)
                    .await
                    .expect("decide")
                    .remove(0);
                let want = reference.decide(&key, &c, now_ns);
                assert_eq!(got, want, "{name} at {instant} + {i} us");
                compared += 1;
                rejected += usize::from(!got.allowed);
            }
        }
    }
    (compared, rejected)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calendar_periods_on_redis_and_a_cluster_decide_like_the_reference() {
    let server = RedisServer::start();
    let standalone =
        RedisStore::new(&store_config(Backend::Redis, vec![server.url()])).expect("store");
    let (compared, rejected) = compare_with_reference(&standalone).await;
    assert!(
        compared > 40 && rejected > 5,
        "{compared} compared, {rejected} rejected"
    );

    let cluster = RedisCluster::start();
    let clustered =
        RedisStore::new(&store_config(Backend::RedisCluster, cluster.urls())).expect("store");
    let (compared, rejected) = compare_with_reference(&clustered).await;
    assert!(
        compared > 40 && rejected > 5,
        "{compared} compared, {rejected} rejected"
    );
}

/// The reference itself at the written-out boundaries: what the comparison above holds Redis
/// to is what a customer is sold.
#[test]
fn calendar_periods_reset_at_local_midnight_in_process() {
    let clock = Arc::new(ManualClock::new(at("2026-12-01T14:59:58Z")));
    let memory = MemoryStore::with_clock(1000, clock.clone());
    let limit = calendar_limit(2, Period::Day, "Asia/Tokyo");
    let c = check("tokyo-day", 7, &limit);
    assert!(memory.decide(std::slice::from_ref(&c))[0].allowed);
    let second = memory.decide(std::slice::from_ref(&c)).remove(0);
    assert!(second.allowed);
    assert_eq!(second.reset, Duration::from_secs(2), "to midnight in Tokyo");
    let third = memory.decide(std::slice::from_ref(&c)).remove(0);
    assert!(!third.allowed);
    assert_eq!(third.retry_after, Duration::from_secs(2));
    // Midnight in Tokyo (15:00 UTC): a new day, a whole quota, 24 hours to its end.
    clock.set(at("2026-12-01T15:00:00Z"));
    let next = memory.decide(std::slice::from_ref(&c)).remove(0);
    assert!(next.allowed);
    assert_eq!(next.remaining, 1);
    assert_eq!(next.reset, Duration::from_secs(86_400));

    // New York's spring-forward day has 23 hours: from its midnight, 23 h to the next one.
    let ny = check(
        "ny-day",
        7,
        &calendar_limit(5, Period::Day, "America/New_York"),
    );
    let later = Arc::new(ManualClock::new(at("2026-03-08T05:00:00Z")));
    let memory = MemoryStore::with_clock(1000, later.clone());
    assert_eq!(
        memory.decide(std::slice::from_ref(&ny))[0].reset,
        Duration::from_secs(23 * 3600)
    );
    later.set(at("2026-11-01T04:00:00Z"));
    assert_eq!(
        memory.decide(std::slice::from_ref(&ny))[0].reset,
        Duration::from_secs(25 * 3600),
        "the fall-back day has 25 hours"
    );
}

/// One decide.lua call on `key` for a calendar check packed by hand (the contract in
/// lua/decide.lua) whose periods were computed around `gateway_ns`, at Redis time `redis_ns`:
/// (allowed, window end in ns).
fn raw_decide(
    conn: &mut redis::Connection,
    key: &str,
    limit: u64,
    cal: &Calendar,
    gateway_ns: u64,
    redis_ns: u64,
) -> (bool, u64) {
    let mut packed = vec![1u8];
    // cost, limit, window (us), burst, interval (wide), cap (wide), lease, share
    for n in [1, limit, 86_400_000_000, limit, 0, 0, 0, 0, 0, 2] {
        packed.extend_from_slice(&(n as f64).to_le_bytes());
    }
    for ns in cal.around(gateway_ns) {
        packed.extend_from_slice(&((ns / 1000) as f64).to_le_bytes());
    }
    let reply: Vec<u8> = redis::cmd("EVAL")
        .arg(DECIDE_LUA)
        .arg(1)
        .arg(key)
        .arg("0000000000000001")
        .arg(300_000_000)
        .arg((redis_ns / 1000).to_string())
        .arg(&b"tag-0001"[..])
        .arg(packed)
        .query(conn)
        .expect("decide.lua answers");
    let reply = reply
        .strip_prefix(b"tag-0001")
        .expect("the reply starts with the call's tag");
    let number = |i: usize| f64::from_le_bytes(reply[i * 8..i * 8 + 8].try_into().unwrap());
    (number(0) == 1.0, number(10) as u64 * 1000)
}

/// Gateways' clocks differ from Redis': the script counts in the period that holds Redis'
/// time among the three the gateway sends, so a gateway still before midnight cannot charge
/// yesterday once Redis has passed it.
#[test]
fn the_period_is_chosen_by_redis_time_not_the_gateways() {
    let server = RedisServer::start();
    let mut conn = server.connection();
    let cal = Calendar::new(Period::Day, "Asia/Tokyo").unwrap();
    let key = "fg-quota:skew:{0000000000000001}";
    // A gateway at 23:50 in Tokyo, Redis at 23:59:59: yesterday's quota, used up.
    let gateway = at("2026-12-01T14:50:00Z");
    for _ in 0..2 {
        let (ok, end) = raw_decide(&mut conn, key, 2, &cal, gateway, at("2026-12-01T14:59:59Z"));
        assert!(ok);
        assert_eq!(end, at("2026-12-01T15:00:00Z"));
    }
    let (ok, _) = raw_decide(&mut conn, key, 2, &cal, gateway, at("2026-12-01T14:59:59Z"));
    assert!(!ok, "the third of a limit of 2");
    // Redis passes midnight while the gateway is still at 23:50: the new day counts.
    let (ok, end) = raw_decide(&mut conn, key, 2, &cal, gateway, at("2026-12-01T15:00:01Z"));
    assert!(ok, "a new period by Redis' time");
    assert_eq!(end, at("2026-12-02T15:00:00Z"));
    // A gateway already past midnight with Redis still before it: yesterday, still full.
    let ahead = at("2026-12-01T15:05:00Z");
    let key = "fg-quota:skew:{0000000000000002}";
    for _ in 0..2 {
        let (ok, end) = raw_decide(&mut conn, key, 2, &cal, ahead, at("2026-12-01T14:59:00Z"));
        assert!(ok);
        assert_eq!(end, at("2026-12-01T15:00:00Z"), "the previous period");
    }
    let (ok, _) = raw_decide(&mut conn, key, 2, &cal, ahead, at("2026-12-01T14:59:30Z"));
    assert!(!ok);
}

/// The seconds from now to the end of the current UTC day, read before and after `f`.
fn secs_to_utc_midnight() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    86_400 - now % 86_400
}

const DAILY: &str = r#"
[[rules]]
name = "daily"
match = { header = { name = "x-test", value = "daily" } }
key = ["header:x-user"]
algorithm = "fixed_window"
limit = 7
calendar = "day"
timezone = "UTC"
on_store_error = "closed"

[[rules]]
name = "daily-leased"
match = { header = { name = "x-test", value = "leased" } }
key = ["header:x-user"]
algorithm = "fixed_window"
limit = 30
calendar = "day"
on_store_error = "closed"
lease = 4
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calendar_rule_through_the_binary_counts_exactly_on_redis_and_shows_its_period() {
    let redis = RedisServer::start();
    let api = OrdersApi::start("orders");
    let s = store(&redis.url(), "250ms", "instances = 3");
    let gws: Vec<Gateway> = (0..3).map(|_| gateway(api.addr, &s, DAILY)).collect();
    let refs: Vec<&Gateway> = gws.iter().collect();
    let c = client();

    let before = secs_to_utc_midnight();
    let r = c
        .get(gws[0].url("/orders"))
        .header("x-test", "daily")
        .header("x-user", "alice")
        .send()
        .await
        .unwrap();
    let after = secs_to_utc_midnight();
    assert_eq!(r.status(), 200);
    let policy = r.headers()["ratelimit-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(policy, "\"daily\";q=7;w=86400");
    let state = r.headers()["ratelimit"].to_str().unwrap().to_string();
    let t: u64 = state
        .rsplit_once(";t=")
        .and_then(|(_, t)| t.parse().ok())
        .unwrap_or_else(|| panic!("{state}"));
    assert!(
        after <= t && t <= before + 1,
        "t = {t}: the seconds to midnight UTC ({before}..{after})"
    );

    // Over three instances, exactly the day's quota (one already spent above).
    let counts = hammer(
        &refs,
        20,
        4,
        "/orders",
        &[("x-test", "daily"), ("x-user", "alice")],
    )
    .await;
    assert_eq!(counts.get(&200), Some(&6), "{counts:?}");
    assert_eq!(counts.get(&429), Some(&14), "{counts:?}");

    // Leased: the instances take permits ahead, and never more than the day's quota in all.
    let counts = hammer(
        &refs,
        60,
        4,
        "/orders",
        &[("x-test", "leased"), ("x-user", "bob")],
    )
    .await;
    let ok = counts.get(&200).copied().unwrap_or(0);
    assert!(ok <= 30, "{ok} admitted of a daily 30: {counts:?}");
    assert!(ok >= 24, "only {ok} of 30 admitted: {counts:?}");
    assert_eq!(
        ok + counts.get(&429).copied().unwrap_or(0),
        60,
        "{counts:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// The usage API: read, reset and grant, on the memory store, Redis and a Redis Cluster.
// ---------------------------------------------------------------------------------------------

const TOKEN: &str = "usage-admin-token-41";

/// One admin request with this file's token: (status, body as JSON).
fn admin(gw: &Gateway, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    admin_json(gw, TOKEN, method, path, body)
}

/// Requests as acme-prod (the demo key whose secret is `test`): how many were admitted.
async fn spend(gw: &Gateway, n: usize) -> usize {
    let counts = hammer(&[gw], n, 4, "/orders", &[("x-api-key", "test")]).await;
    counts.get(&200).copied().unwrap_or(0)
}

const USAGE_RULES: &str = r#"
[[rules]]
name = "daily"
key = ["api_key"]
algorithm = "fixed_window"
limit = 5
calendar = "day"
timezone = "Asia/Tokyo"
on_store_error = "closed"

[[rules]]
name = "per-user"
key = ["user"]
algorithm = "token_bucket"
limit = 100
window = "1h"
on_store_error = "closed"

[[rules]]
name = "per-ip"
key = ["ip"]
algorithm = "fixed_window"
limit = 1000
window = "1h"
"#;

fn usage_gateway(api: std::net::SocketAddr, store: &str, rules: &str) -> Gateway {
    keyed_gateway(TOKEN, &orders_upstream(&[api]), store, rules)
}

fn rule_usage<'a>(v: &'a serde_json::Value, rule: &str) -> &'a serde_json::Value {
    v["rules"]
        .as_array()
        .and_then(|rules| rules.iter().find(|r| r["rule"] == rule))
        .unwrap_or_else(|| panic!("no {rule} in {v}"))
}

/// Read, grant, reset and every refusal, against the store `store` names.
async fn usage_api_on(store: &str) {
    let api = OrdersApi::start("orders");
    let gw = usage_gateway(api.addr, store, USAGE_RULES);
    assert_eq!(spend(&gw, 3).await, 3);

    let (status, v) = admin(&gw, "GET", "/usage?api_key=acme-prod", "");
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["api_key"], "acme-prod");
    let daily = rule_usage(&v, "daily");
    assert_eq!(
        (daily["limit"].as_i64(), daily["used"].as_i64()),
        (Some(5), Some(3)),
        "{v}"
    );
    assert_eq!(daily["remaining"], 2);
    let reset = daily["reset"].as_u64().unwrap();
    assert!((1..=86_400).contains(&reset), "{v}");
    assert_eq!(rule_usage(&v, "per-user")["used"], 3, "{v}");
    let listed: Vec<&str> = v["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rule"].as_str().unwrap())
        .collect();
    assert_eq!(
        listed,
        ["daily", "per-user"],
        "per-ip is not keyed on the identity"
    );
    let (status, v) = admin(&gw, "GET", "/usage?user=acme", "");
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["user"], "acme");
    assert_eq!(
        v["rules"].as_array().unwrap().len(),
        1,
        "only per-user is keyed on user: {v}"
    );

    // Refusals change nothing.
    for (path, body, want) in [
        (
            "/usage/grant",
            r#"{"rule":"nope","api_key":"acme-prod","amount":1}"#,
            404,
        ),
        (
            "/usage/grant",
            r#"{"rule":"daily","api_key":"nobody","amount":1}"#,
            404,
        ),
        (
            "/usage/grant",
            r#"{"rule":"per-ip","api_key":"acme-prod","amount":1}"#,
            400,
        ),
        (
            "/usage/grant",
            r#"{"rule":"daily","api_key":"acme-prod","amount":0}"#,
            400,
        ),
        (
            "/usage/grant",
            r#"{"rule":"daily","api_key":"acme-prod","amount":-4}"#,
            400,
        ),
        (
            "/usage/grant",
            r#"{"rule":"daily","api_key":"acme-prod","amount":"4"}"#,
            400,
        ),
        (
            "/usage/grant",
            r#"{"rule":"daily","api_key":"acme-prod"}"#,
            400,
        ),
        (
            "/usage/grant",
            r#"{"rule":"per-user","user":"acme","amount":4}"#,
            400,
        ),
        ("/usage/reset", r#"{"rule":"daily"}"#, 400),
        (
            "/usage/reset",
            r#"{"rule":"daily","api_key":"acme-prod","user":"acme"}"#,
            400,
        ),
        ("/usage/reset", "not json", 400),
    ] {
        let (status, v) = admin(&gw, "POST", path, body);
        assert_eq!(status, want, "{path} {body}: {v}");
        assert!(
            v["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "problem+json: {v}"
        );
    }
    let (_, v) = admin(&gw, "GET", "/usage?api_key=acme-prod", "");
    assert_eq!(rule_usage(&v, "daily")["used"], 3, "nothing changed: {v}");
    let (status, v) = admin(&gw, "GET", "/usage?api_key=nobody", "");
    assert_eq!(status, 404, "{v}");
    let (status, _) = admin(&gw, "GET", "/usage?ip=1.2.3.4", "");
    assert_eq!(status, 400);

    // A grant of 4: 2 + 4 more today.
    let (status, v) = admin(
        &gw,
        "POST",
        "/usage/grant",
        r#"{"rule":"daily","api_key":"acme-prod","amount":4}"#,
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (v["before"]["used"].as_i64(), v["after"]["used"].as_i64()),
        (Some(3), Some(-1)),
        "{v}"
    );
    assert_eq!(v["after"]["remaining"], 6);
    assert_eq!(spend(&gw, 10).await, 6);

    // A reset: the day starts over.
    let (status, v) = admin(
        &gw,
        "POST",
        "/usage/reset",
        r#"{"rule":"daily","api_key":"acme-prod"}"#,
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (v["before"]["used"].as_i64(), v["after"]["used"].as_i64()),
        (Some(5), Some(0)),
        "{v}"
    );
    assert_eq!(spend(&gw, 10).await, 5);

    let (_, metrics) = admin(&gw, "GET", "/metrics", "");
    let metrics = metrics["raw"].as_str().unwrap_or_default().to_string();
    for (action, n) in [("grant", 1.0), ("reset", 1.0)] {
        let series = format!("floodgate_usage_changes_total{{action=\"{action}\"}}");
        assert_eq!(metric_value(&metrics, &series), Some(n), "{series}");
    }
    let logs = gw.logs();
    drop(gw);
    assert!(
        logs.contains("usage changed through the admin API"),
        "{logs}"
    );
    assert!(logs.contains("admin token"), "who made the change: {logs}");
    assert!(!logs.contains(TOKEN), "the token is never logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_api_on_the_memory_store() {
    usage_api_on("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_api_on_redis() {
    let redis = RedisServer::start();
    usage_api_on(&store(&redis.url(), "250ms", "")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_api_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let s = cluster.store("250ms", "");
    usage_api_on(&s).await;
}

/// A grant that lands while requests pour in is exact: over the day, exactly `limit + amount`
/// are admitted, whatever the interleaving.
async fn grant_under_load_on(store: &str) {
    let api = OrdersApi::start("orders");
    let rules = r#"
[[rules]]
name = "daily"
key = ["api_key"]
algorithm = "fixed_window"
limit = 40
calendar = "day"
on_store_error = "closed"
"#;
    let gw = Arc::new(usage_gateway(api.addr, store, rules));
    let load = {
        let gw = gw.clone();
        tokio::spawn(async move { spend(&gw, 120).await })
    };
    // Once the load has started using the quota, grant 25 more.
    eventually(Duration::from_secs(20), "the load to start", || {
        let (_, v) = admin(&gw, "GET", "/usage?api_key=acme-prod", "");
        let used = rule_usage(&v, "daily")["used"].as_i64().unwrap_or(0);
        std::future::ready((used >= 10).then_some(()))
    })
    .await;
    let (status, v) = admin(
        &gw,
        "POST",
        "/usage/grant",
        r#"{"rule":"daily","api_key":"acme-prod","amount":25}"#,
    );
    assert_eq!(status, 200, "{v}");
    let during = load.await.unwrap();
    let after = spend(&gw, 40).await;
    assert_eq!(
        during + after,
        65,
        "{during} during the load, {after} after"
    );
    let (_, v) = admin(&gw, "GET", "/usage?api_key=acme-prod", "");
    assert_eq!(rule_usage(&v, "daily")["used"], 40, "{v}");
    assert_eq!(rule_usage(&v, "daily")["remaining"], 0, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_during_load_is_exact_on_memory_and_redis() {
    grant_under_load_on("").await;
    let redis = RedisServer::start();
    grant_under_load_on(&store(&redis.url(), "250ms", "")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_during_load_is_exact_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let s = cluster.store("250ms", "");
    grant_under_load_on(&s).await;
}

// ---------------------------------------------------------------------------------------------
// Webhooks: a real HTTP receiver on loopback.
// ---------------------------------------------------------------------------------------------

/// One request the receiver got: its headers (lowercased names) and body.
#[derive(Clone, Debug)]
struct Received {
    headers: HashMap<String, String>,
    body: String,
}

/// A tiny HTTP receiver on a loopback port: answers 204 to every POST (or, when `hang`, never
/// answers), recording each. Stopped, with its thread, when dropped.
struct Receiver {
    addr: std::net::SocketAddr,
    got: Arc<std::sync::Mutex<Vec<Received>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    /// A receiver on a port the kernel picks as it binds: a port picked first and bound
    /// later may meanwhile become the local port of an outgoing connection ("address in
    /// use", seen once in CI).
    fn start(hang: bool) -> Receiver {
        Receiver::start_on(([127, 0, 0, 1], 0).into(), hang)
    }

    /// A receiver on `addr` (a test that brings one up on a port the gateway already uses).
    fn start_on(addr: std::net::SocketAddr, hang: bool) -> Receiver {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind(addr).expect("bind the receiver");
        let addr = listener.local_addr().expect("the receiver's address");
        listener.set_nonblocking(true).unwrap();
        let got = Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (g, s) = (got.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                let Ok((mut conn, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                if hang {
                    held.push(conn);
                    continue;
                }
                conn.set_nonblocking(false).unwrap();
                conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut raw = Vec::new();
                let mut buf = [0u8; 4096];
                let (head, body) = loop {
                    let Ok(n) = conn.read(&mut buf) else {
                        break (String::new(), String::new());
                    };
                    if n == 0 {
                        break (String::new(), String::new());
                    }
                    raw.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&raw).to_string();
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let len = head
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length: ")
                                    .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        if body.len() >= len {
                            break (head.to_string(), body.to_string());
                        }
                    }
                };
                let headers = head
                    .lines()
                    .skip(1)
                    .filter_map(|l| l.split_once(": "))
                    .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
                    .collect();
                g.lock().unwrap().push(Received { headers, body });
                let _ = conn.write_all(
                    b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                );
            }
            drop(held);
        });
        Receiver {
            addr,
            got,
            stop,
            thread: Some(thread),
        }
    }

    fn url(&self) -> String {
        format!("http://{}/hooks/floodgate", self.addr)
    }

    /// Every event received so far, across requests.
    fn events(&self) -> Vec<serde_json::Value> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .flat_map(|r| {
                serde_json::from_str::<Vec<serde_json::Value>>(&r.body).unwrap_or_default()
            })
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

const WEBHOOK_SECRET: &str = "whsec-9c1f-never-in-an-event";

fn webhook_rules(url: &str, limit: u64) -> String {
    format!(
        r#"
[[rules]]
name = "daily"
key = ["api_key"]
algorithm = "fixed_window"
limit = {limit}
calendar = "day"
on_store_error = "closed"

[[webhooks]]
url = "{url}"
events = ["threshold", "rejected"]
thresholds = [0.5, 1.0]
secret = "{WEBHOOK_SECRET}"
"#
    )
}

/// The sum over `gws` of `floodgate_webhook_events_total{result}`.
fn webhook_count(gws: &[&Gateway], result: &str) -> f64 {
    gws.iter()
        .map(|gw| {
            let (_, m) = admin(gw, "GET", "/metrics", "");
            let text = m["raw"].as_str().unwrap_or_default().to_string();
            metric_value(
                &text,
                &format!("floodgate_webhook_events_total{{result=\"{result}\"}}"),
            )
            .unwrap_or(0.0)
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_threshold_fires_once_across_three_instances_signed_and_without_secrets() {
    let receiver = Receiver::start(false);
    let redis = RedisServer::start();
    let api = OrdersApi::start("orders");
    let s = store(&redis.url(), "250ms", "instances = 3");
    let rules = webhook_rules(&receiver.url(), 10);
    let gws: Vec<Gateway> = (0..3)
        .map(|_| usage_gateway(api.addr, &s, &rules))
        .collect();
    let refs: Vec<&Gateway> = gws.iter().collect();
    let counts = hammer(&refs, 30, 3, "/orders", &[("x-api-key", "test")]).await;
    assert_eq!(counts.get(&200), Some(&10), "{counts:?}");

    // Every candidate the instances noticed has been claimed or refused as a duplicate.
    eventually(
        Duration::from_secs(20),
        "every candidate event handled",
        || {
            let queued = webhook_count(&refs, "queued");
            let handled = webhook_count(&refs, "delivered") + webhook_count(&refs, "duplicate");
            std::future::ready((queued > 0.0 && handled == queued).then_some(()))
        },
    )
    .await;
    let events = receiver.events();
    let mut kinds: Vec<String> = events
        .iter()
        .map(|e| format!("{} {}", e["event"].as_str().unwrap(), e["threshold"]))
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        ["rejected null", "threshold 0.5", "threshold 1.0"],
        "{events:?}"
    );
    let ids: std::collections::HashSet<&str> =
        events.iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 3, "unique ids");
    for e in &events {
        assert_eq!(e["rule"], "daily");
        assert_eq!(e["api_key"], "acme-prod");
        assert_eq!(e["user"], "acme");
        assert_eq!(e["plan"], "pro");
        assert_eq!(e["limit"], 10);
        assert!(e["window_end"].as_u64().unwrap() > 1_700_000_000, "{e}");
    }
    assert_eq!(
        events.iter().find(|e| e["threshold"] == 0.5).unwrap()["used"],
        5
    );
    for r in receiver.got.lock().unwrap().iter() {
        assert!(!r.body.contains(WEBHOOK_SECRET), "no secret in an event");
        assert!(
            !r.body.contains("\"test\""),
            "no API key secret in an event"
        );
        let header = r.headers.get("x-floodgate-signature").expect("signed");
        let (t, v1) = header
            .strip_prefix("t=")
            .and_then(|rest| rest.split_once(",v1="))
            .unwrap_or_else(|| panic!("t=...,v1=...: {header}"));
        let t: u64 = t.parse().expect("Unix seconds");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(
            t <= now && now - t < 300,
            "a fresh timestamp: {t}, now {now}"
        );
        let mut mac =
            <hmac::Hmac<sha2::Sha256> as hmac::Mac>::new_from_slice(WEBHOOK_SECRET.as_bytes())
                .unwrap();
        hmac::Mac::update(&mut mac, format!("{t}.{}", r.body).as_bytes());
        let want = hex::encode(hmac::Mac::finalize(mac).into_bytes());
        assert_eq!(v1, want, "the timestamp and the body are signed together");
        readme_receiver_check(header, &r.body, t);
    }
}

/// The manual's receiver check (the ```python block of "Webhooks" in docs/operations.md), run
/// as written by python3 on a captured delivery: it accepts it now, and refuses it with the
/// body changed or when replayed past its 5-minute tolerance.
fn readme_receiver_check(header: &str, body: &str, t: u64) {
    let guide = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .expect("docs/operations.md");
    let section = &guide[guide.find("## Webhooks").expect("a Webhooks section")..];
    let snippet = section
        .split("```python\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("a ```python block in Webhooks");
    let run = |tamper: &str, clock: Option<u64>| -> String {
        let mut script = format!("{snippet}\n");
        if let Some(at) = clock {
            script.push_str(&format!("time.time = lambda: {at}\n"));
        }
        script.push_str(&format!(
            "import sys\nbody = sys.stdin.buffer.read(){tamper}\nprint(verify(sys.argv[1], sys.argv[2], body))\n"
        ));
        let mut child = std::process::Command::new("python3")
            .args(["-c", &script, WEBHOOK_SECRET, header])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs");
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(body.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "the README snippet runs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(run("", None), "True", "a fresh delivery verifies");
    assert_eq!(run(" + b' '", None), "False", "a changed body does not");
    assert_eq!(
        run("", Some(t + 301)),
        "False",
        "nor a replay 5 minutes later"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_retried_until_the_receiver_is_up() {
    let addr = free_addr();
    let api = OrdersApi::start("orders");
    let gw = usage_gateway(
        api.addr,
        "",
        &webhook_rules(&format!("http://{addr}/hooks"), 2),
    );
    assert_eq!(spend(&gw, 2).await, 2);
    // The receiver is down: the first attempts fail, and are logged.
    let started = std::time::Instant::now();
    while !gw.logs().contains("webhook delivery failed; retrying") {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no failed attempt logged: {} {:?}",
            gw.logs(),
            ["queued", "duplicate", "delivered", "dropped_undeliverable"]
                .map(|r| webhook_count(&[&gw], r))
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let receiver = Receiver::start_on(addr, false);
    let events = eventually(
        Duration::from_secs(30),
        "the events after the receiver came up",
        || {
            let e = receiver.events();
            std::future::ready((e.len() >= 2).then_some(e))
        },
    )
    .await;
    let mut thresholds: Vec<f64> = events
        .iter()
        .map(|e| e["threshold"].as_f64().unwrap())
        .collect();
    thresholds.sort_by(f64::total_cmp);
    assert_eq!(thresholds, [0.5, 1.0], "{events:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_receiver_fills_the_bounded_queue_and_requests_never_wait() {
    let receiver = Receiver::start(true);
    let api = OrdersApi::start("orders");
    let rules = format!(
        r#"
[[rules]]
name = "per-user-header"
key = ["header:x-user"]
algorithm = "fixed_window"
limit = 1
window = "1h"

[[webhooks]]
url = "{}"
events = ["threshold"]
thresholds = [1.0]
"#,
        receiver.url()
    );
    let gw = Gateway::start_env(
        |addr, admin_addr| format!("{}admin_token = \"{TOKEN}\"\n", server_section(addr, admin_addr)),
        &format!(
            "{}\n[[routes]]\nname = \"orders\"\nmatch = {{ path_prefix = \"/orders\" }}\nupstream = \"orders\"\nauth = \"none\"\n{rules}",
            orders_upstream(&[api.addr])
        ),
        &[],
        &[("RUST_LOG", "info"), ("FLOODGATE_TEST_WEBHOOK_QUEUE", "2")],
    );
    // 40 clients, each crossing its limit's 100 % once: 40 candidate events for a worker stuck
    // on a receiver that never answers.
    let c = client();
    for i in 0..40 {
        let r = c
            .get(gw.url("/orders"))
            .header("x-user", format!("user-{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "a request never waits for a webhook");
    }
    // Drops happen at the intake queue (counted instead of `queued`) or at the webhook's own
    // queue (after `queued`, counted under the webhook's name as well).
    let own = format!(
        r#"floodgate_webhook_dropped_total{{reason="queue_full",webhook="{}"}}"#,
        receiver.addr
    );
    let (dropped, queued, own_dropped) = eventually(
        Duration::from_secs(10),
        "every event queued or dropped",
        || {
            let (_, m) = admin(&gw, "GET", "/metrics", "");
            let text = m["raw"].as_str().unwrap_or_default().to_string();
            let own_dropped = metric_value(&text, &own).unwrap_or(0.0);
            let dropped = webhook_count(&[&gw], "dropped_queue_full");
            let queued = webhook_count(&[&gw], "queued");
            // Each queue holds 2 (and the worker a batch): most of the 40 are dropped.
            std::future::ready((dropped >= 30.0).then_some((dropped, queued, own_dropped)))
        },
    )
    .await;
    assert_eq!(
        queued + dropped - own_dropped,
        40.0,
        "each offered once: {dropped} dropped, {queued} queued, {own_dropped} by the webhook"
    );
}

/// A receiver that accepts connections and never answers (a black hole) beside a healthy one:
/// each webhook has its own queue and worker, so the healthy receiver gets every event
/// promptly while the other's worker waits out its timeouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_hole_receiver_does_not_delay_a_healthy_one() {
    let hole = Receiver::start(true);
    let healthy = Receiver::start(false);
    let api = OrdersApi::start("orders");
    let rules = format!(
        r#"
[[rules]]
name = "per-user-header"
key = ["header:x-user"]
algorithm = "fixed_window"
limit = 1
window = "1h"

[[webhooks]]
name = "black-hole"
url = "{}"
events = ["threshold"]
thresholds = [1.0]

[[webhooks]]
url = "{}"
events = ["threshold"]
thresholds = [1.0]
"#,
        hole.url(),
        healthy.url()
    );
    let gw = Gateway::start(&format!(
        "{}\n[[routes]]\nname = \"orders\"\nmatch = {{ path_prefix = \"/orders\" }}\nupstream = \"orders\"\nauth = \"none\"\n{rules}",
        orders_upstream(&[api.addr])
    ));
    let c = client();
    for i in 0..20 {
        let r = c
            .get(gw.url("/orders"))
            .header("x-user", format!("user-{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    // Alone, a receiver has its events in milliseconds; behind a black hole that took 10
    // attempts of 5 s each. 10 s is generous for the first and far short of the second.
    eventually(
        Duration::from_secs(10),
        "the healthy receiver has all 20 events",
        || std::future::ready((healthy.events().len() == 20).then_some(())),
    )
    .await;
    let (_, m) = admin(&gw, "GET", "/metrics", "");
    let text = m["raw"].as_str().unwrap_or_default().to_string();
    for name in ["black-hole".to_string(), healthy.addr.to_string()] {
        let series =
            format!(r#"floodgate_webhook_dropped_total{{reason="queue_full",webhook="{name}"}}"#);
        assert_eq!(metric_value(&text, &series), Some(0.0), "{series}");
    }
    assert!(
        !text.contains("/hooks/floodgate"),
        "no URL path in the metrics"
    );
}

/// `GET /usage/thresholds` (the dashboard's "Quota use"): per rule keyed on identities alone,
/// how many of the configured identities are at or above each threshold, read from the store
/// the rule counts in; rules keyed on anything else are not listed.
async fn quota_use_on(store: &str) {
    let api = OrdersApi::start("orders");
    let gw = usage_gateway(api.addr, store, USAGE_RULES);
    let share = |v: &serde_json::Value, rule: &str, t: usize| {
        let r = rule_usage(v, rule);
        (
            r["above"][t]["identities"].as_u64().unwrap(),
            r["identities"].as_u64().unwrap(),
        )
    };
    assert_eq!(spend(&gw, 3).await, 3);
    let (status, v) = admin(&gw, "GET", "/usage/thresholds", "");
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["thresholds"], serde_json::json!([0.8, 1.0]), "{v}");
    assert_eq!(share(&v, "daily", 0), (0, 2), "3 of 5 is under 80 %: {v}");
    assert!(
        v["rules"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["rule"] != "per-ip"),
        "an ip-keyed rule has no identities: {v}"
    );
    assert_eq!(spend(&gw, 1).await, 1);
    let (_, v) = admin(&gw, "GET", "/usage/thresholds", "");
    assert_eq!(share(&v, "daily", 0), (1, 2), "4 of 5: {v}");
    assert_eq!(share(&v, "daily", 1), (0, 2), "{v}");
    assert_eq!(share(&v, "per-user", 0), (0, 2), "4 of 100: {v}");
    assert_eq!(spend(&gw, 3).await, 1, "the fifth is the last");
    let (_, v) = admin(&gw, "GET", "/usage/thresholds", "");
    assert_eq!(share(&v, "daily", 1), (1, 2), "5 of 5: {v}");
    assert_eq!(
        rule_usage(&v, "daily")["above"][1]["share"].as_f64(),
        Some(0.5),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_use_per_threshold_on_memory_and_redis() {
    quota_use_on("").await;
    let redis = RedisServer::start();
    quota_use_on(&store(&redis.url(), "250ms", "")).await;
}
