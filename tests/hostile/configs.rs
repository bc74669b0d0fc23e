//! Configs that pass `check` but would break at run time: a store that
//! cannot be built must count as down, a file caught mid-write must never be applied
//! half-written, an empty file must never be applied, shaping must not hold requests without
//! bound, and a start must not reload itself. (What `check` now refuses is in tests/check.rs.)

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use floodgate::config::Config;
use floodgate::limiter::engine::{Limiter, Verdict};
use floodgate::limiter::Check;

use crate::common::*;

/// Two routes to the Orders API's echo endpoints, no key needed.
fn two_routes(api: &OrdersApi) -> String {
    format!(
        "{}\n[[routes]]\nname = \"a\"\nmatch = {{ path_prefix = \"/debug/a\" }}\nupstream = \"orders\"\nauth = \"none\"\n\n[[routes]]\nname = \"b\"\nmatch = {{ path_prefix = \"/debug/b\" }}\nupstream = \"orders\"\nauth = \"none\"\n",
        orders_upstream(&[api.addr])
    )
}

/// A store whose URL the client refuses (built here the way an older floodgate's `check` let
/// through, bypassing today's validation) is down for good: it is not quietly replaced by
/// per-instance counting at the full limit. Each rule's `on_store_error` decides, counted;
/// readiness (`/readyz` reports `store().is_up()`) and `floodgate_store_up` say down.
#[tokio::test]
async fn a_store_that_cannot_be_built_is_down_and_failure_modes_apply() {
    let text = r#"
[store]
backend = "redis"
url = "redis://127.0.0.1:1"
instances = 2

[[upstreams]]
name = "u"
targets = ["127.0.0.1:9000"]

[[routes]]
name = "r"
upstream = "u"

[[rules]]
name = "unbuilt-open"
key = ["ip"]
algorithm = "fixed_window"
limit = 1
window = "1h"
on_store_error = "open"

[[rules]]
name = "unbuilt-closed"
key = ["ip"]
algorithm = "fixed_window"
limit = 100
window = "1h"
on_store_error = "closed"

[[rules]]
name = "unbuilt-local"
key = ["ip"]
algorithm = "fixed_window"
limit = 4
window = "1h"
on_store_error = "local"
"#;
    let mut config = Config::from_str(Path::new("gateway.toml"), text).expect("valid config");
    for bad in ["redis://host:notaport", "redis://[::1", "redis://:@:0/x"] {
        let mut store = config.store.clone();
        store.urls = vec![bad.to_string()];
        // As if validation had not refused them: the store judges them itself.
        let limiter = Limiter::new(&store);
        assert!(
            !limiter.in_process(),
            "{bad}: a store that cannot be built must count as down, not be absent"
        );
        assert!(!limiter.store().is_up(), "{bad}: reported up");
    }
    config.store.urls = vec!["redis://host:notaport".to_string()];
    let limiter = Limiter::new(&config.store);
    assert_eq!(floodgate::metrics::metrics().store_up.get(), 0);
    let rule = |name: &str| {
        config
            .rules
            .iter()
            .find(|r| &*r.name == name)
            .expect("rule")
            .clone()
    };
    let check = |rule: &floodgate::rules::Rule| Check {
        rule: rule.name.clone(),
        counter: 7,
        limit: rule.limit.clone(),
        cost: 1,
    };

    // open: admitted (a per-instance limit of 1 would reject the second), and counted.
    let open = rule("unbuilt-open");
    for _ in 0..3 {
        let out = limiter
            .decide(vec![(open.policy.clone(), check(&open))], &config.store)
            .await;
        assert!(
            matches!(out.verdict, Verdict::Allow { .. }),
            "{:?}",
            out.verdict
        );
    }
    assert_eq!(open.counters.fail_open.get(), 3);

    // closed: 503, never a silent admission.
    let closed = rule("unbuilt-closed");
    let out = limiter
        .decide(vec![(closed.policy.clone(), check(&closed))], &config.store)
        .await;
    assert!(
        matches!(out.verdict, Verdict::Unavailable { .. }),
        "{:?}",
        out.verdict
    );
    assert_eq!(closed.counters.fail_closed.get(), 1);

    // local: limit / instances = 2 in process, not the full 4.
    let local = rule("unbuilt-local");
    let mut admitted = 0;
    for _ in 0..4 {
        let out = limiter
            .decide(vec![(local.policy.clone(), check(&local))], &config.store)
            .await;
        if matches!(out.verdict, Verdict::Allow { .. }) {
            admitted += 1;
        }
    }
    assert_eq!(
        admitted, 2,
        "the local fallback divides the limit by instances"
    );
    assert_eq!(local.counters.fail_local.get(), 4);
    assert!(!limiter.store().is_up(), "a down store");
    assert_eq!(floodgate::metrics::metrics().store_up.get(), 0);
}

/// A shaping rule holds at most `max_waiting` requests at once; the next one that would wait
/// is rejected as the rule's rejection (429, counted), and places free up as waits end.
#[tokio::test]
async fn shaping_caps_the_requests_waiting_per_rule() {
    let api = OrdersApi::start("shape-cap");
    let gw = Gateway::start(&format!(
        "{}\n[[rules]]\nname = \"shape-cap\"\nkey = [\"route\"]\nalgorithm = \"leaky_bucket\"\nlimit = 2\nwindow = \"1s\"\nburst = 50\nmode = \"shape\"\nmax_delay = \"30s\"\nmax_waiting = 2\n",
        two_routes(&api)
    ));
    let c = client();
    // Four at once: one leaves now, two wait their turn (500 ms, 1 s), the fourth would be a
    // third waiting request.
    let started = Instant::now();
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let c = c.clone();
            let url = gw.url("/debug/a");
            tokio::spawn(async move {
                let r = c.get(url).send().await.expect("request");
                (r.status().as_u16(), r.text().await.unwrap_or_default())
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.expect("task"));
    }
    let rejected: Vec<&(u16, String)> = statuses.iter().filter(|(s, _)| *s == 429).collect();
    assert_eq!(
        rejected.len(),
        1,
        "exactly the request past max_waiting is rejected: {statuses:?}"
    );
    assert!(rejected[0].1.contains("shape-cap"), "{}", rejected[0].1);
    assert_eq!(statuses.iter().filter(|(s, _)| *s == 200).count(), 3);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the waits are bounded"
    );
    let metrics = get_text(&c, gw.admin_url("/metrics")).await;
    assert!(
        metrics.contains(
            "floodgate_ratelimit_decisions_total{result=\"rejected\",rule=\"shape-cap\"} 1"
        ),
        "{metrics}"
    );
    // The waits are over: the rule holds nothing, so the next request may wait again.
    let r = c.get(gw.url("/debug/a")).send().await.expect("request");
    assert_eq!(r.status().as_u16(), 200);
}

/// A file truncated and written again slowly is never applied half-written: while it is being
/// written (and a `POST /reload` lands in the middle, and the pause outlasts the quiet period
/// of 100 ms), every request to a route of the file is answered by it and `/readyz` always
/// counts both routes. A writer that closes between two parts is caught only by that quiet
/// period, a matter of timing that this test does not rely on.
#[tokio::test]
async fn a_file_caught_mid_write_is_never_applied_half_written() {
    let api = OrdersApi::start("mid-write");
    let gw = Gateway::start(&two_routes(&api));
    let path = gw.config_path();
    let full = std::fs::read_to_string(&path).expect("config");
    // Cut right after route "a": valid TOML, valid config, but route "b" is missing.
    let cut = full.find("[[routes]]\nname = \"b\"").expect("route b");
    let (first, rest) = full.split_at(cut);

    let c = client();
    let stop = Arc::new(AtomicBool::new(false));
    let poller = {
        let (c, stop) = (c.clone(), stop.clone());
        let (url, ready) = (gw.url("/debug/b"), gw.admin_url("/readyz"));
        tokio::spawn(async move {
            let mut bad = Vec::new();
            let mut polls = 0;
            while !stop.load(Ordering::Relaxed) {
                let status = c.get(&url).send().await.expect("GET b").status().as_u16();
                if status != 200 {
                    bad.push(format!("GET /debug/b answered {status}"));
                }
                let r: serde_json::Value = c
                    .get(&ready)
                    .send()
                    .await
                    .expect("readyz")
                    .json()
                    .await
                    .expect("json");
                if r["routes"] != 2 {
                    bad.push(format!("/readyz said {} routes", r["routes"]));
                }
                polls += 1;
            }
            (polls, bad)
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    for round in 0..3 {
        // Truncate, write the first part, ask for a reload in the middle of the write, then
        // finish it: the writer is slow, not done, and holds the file open meanwhile (its
        // close says when it is done, however long the pause: no timing is assumed here).
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&path)
            .expect("truncate");
        std::io::Write::write_all(&mut f, first.as_bytes()).expect("first part");
        let reload = {
            let c = c.clone();
            let url = gw.admin_url("/reload");
            tokio::spawn(async move { c.post(url).send().await.map(|r| r.status().as_u16()) })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        std::io::Write::write_all(&mut f, rest.as_bytes()).expect("rest");
        drop(f);
        let status = reload.await.expect("task").expect("POST /reload");
        assert_eq!(status, 200, "round {round}: the complete file is valid");
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let (polls, bad) = poller.await.expect("poller");
    assert!(polls > 10, "the poller ran ({polls} polls)");
    assert!(
        bad.is_empty(),
        "half-written file in force ({} bad answers), first: {:?}",
        bad.len(),
        &bad[..bad.len().min(6)]
    );
    let st = get_json(&c, gw.admin_url("/readyz")).await;
    assert!(st["reload"]["last_error"].is_null(), "{st}");
}

/// A reload to an empty file is refused: the old config stays in force, and the reload status
/// shows why.
#[tokio::test]
async fn a_reload_to_an_empty_file_is_refused() {
    let api = OrdersApi::start("empty-file");
    let gw = Gateway::start(&two_routes(&api));
    let c = client();
    std::fs::write(gw.config_path(), "").expect("truncate");
    // The watcher sees it; wait until the failed reload is recorded.
    let deadline = Instant::now() + Duration::from_secs(10);
    let st = loop {
        let st = get_json(&c, gw.admin_url("/readyz")).await;
        if !st["reload"]["last_error"].is_null() {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "no reload attempt recorded: {st}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let error = st["reload"]["last_error"].as_str().expect("error text");
    assert!(
        error.contains("gateway.toml") && error.contains("empty"),
        "{error}"
    );
    assert_eq!(st["reload"]["generation"], 1, "{st}");
    assert_eq!(st["routes"], 2, "{st}");
    let r = c.get(gw.url("/debug/b")).send().await.expect("GET");
    assert_eq!(r.status().as_u16(), 200, "the old routes stay in force");
    // POST /reload says the same.
    let r = c.post(gw.admin_url("/reload")).send().await.expect("POST");
    assert_eq!(r.status().as_u16(), 422);
    assert!(r.text().await.unwrap_or_default().contains("empty"));
}

/// Starting is not a reload: with or without a keys file, nothing reloads until a file
/// changes.
#[tokio::test]
async fn a_start_does_not_reload_itself() {
    let api = OrdersApi::start("no-spurious-reload");
    let plain = Gateway::start(&two_routes(&api));
    let with_keys = Gateway::start_with(
        "",
        &format!("[auth]\nkeys_file = \"keys.toml\"\n{}", two_routes(&api)),
        &[("keys.toml", "[[keys]]\nid = \"k\"\nsha256 = \"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\"\n")],
    );
    let c = client();
    // The reloader compares the files with the config in force as soon as it starts; a
    // mismatch would reload within its 100 ms debounce. Give it ample time.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for gw in [&plain, &with_keys] {
        let st = get_json(&c, gw.admin_url("/readyz")).await;
        assert_eq!(st["reload"]["generation"], 1, "{st}");
        let logs = gw.logs();
        assert!(!logs.contains("config reloaded"), "{logs}");
    }
}
