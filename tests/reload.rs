//! Hot reload under load: twenty rewrites of gateway.toml (valid and invalid, in place and by
//! rename) with zero failed requests; new limits in force quickly; invalid files change
//! nothing; counters survive a change of limit; SIGHUP and POST /reload work too.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn body(api: std::net::SocketAddr, limit: u64) -> String {
    format!(
        "{}\n[[routes]]\nname = \"orders\"\nmatch = {{ path_prefix = \"/orders\" }}\nupstream = \"orders\"\nauth = \"none\"\n\n[[rules]]\nname = \"probe\"\nkey = [\"header:x-probe\"]\nalgorithm = \"fixed_window\"\nlimit = {limit}\nwindow = \"1h\"\n",
        orders_upstream(&[api])
    )
}

/// Writes the whole file, either in place or to a temp file renamed over it (what editors do).
fn write(path: &std::path::Path, text: &str, by_rename: bool) {
    if by_rename {
        let tmp = path.with_extension("toml.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    } else {
        std::fs::write(path, text).unwrap();
    }
}

/// How many requests with `x-probe: probe` are admitted before the first 429 (at most 40).
async fn admitted(c: &reqwest::Client, gw: &Gateway, probe: &str) -> u64 {
    for n in 0..40 {
        let r = c
            .get(gw.url("/orders"))
            .header("x-probe", probe)
            .send()
            .await
            .unwrap();
        if r.status() == 429 {
            return n;
        }
        assert_eq!(r.status(), 200);
    }
    40
}

async fn rule_limit(c: &reqwest::Client, gw: &Gateway) -> u64 {
    let v: Value = get_json(c, gw.admin_url("/rules")).await;
    v["rules"][0]["limit"].as_u64().unwrap()
}

async fn reload_generation(c: &reqwest::Client, gw: &Gateway) -> (u64, Option<String>) {
    let v: Value = get_json(c, gw.admin_url("/readyz")).await;
    (
        v["reload"]["generation"].as_u64().unwrap(),
        v["reload"]["last_error"].as_str().map(str::to_string),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_rewrites_under_load_lose_nothing() {
    let api = OrdersApi::start("orders");
    let gw = Gateway::start_with("", &body(api.addr, 3), &[]);
    let path = gw.dir.path().join("gateway.toml");
    let server = std::fs::read_to_string(&path).unwrap();
    let server = server.split("\n[[upstreams]]").next().unwrap().to_string();
    let c = client();

    // Continuous load without the probe header (the rule does not apply to it).
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let mut load = Vec::new();
    for _ in 0..2 {
        let (stop, ok, failed, c, url) = (
            stop.clone(),
            ok.clone(),
            failed.clone(),
            c.clone(),
            gw.url("/orders"),
        );
        load.push(tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(120);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                match c.get(&url).send().await {
                    Ok(r) if r.status() == 200 => ok.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }

    let mut limit = 3;
    let mut latencies = Vec::new();
    for i in 0..20u64 {
        let by_rename = i % 4 >= 2;
        let (gen_before, _) = reload_generation(&c, &gw).await;
        if i % 2 == 0 {
            limit = 4 + i / 2;
            let started = Instant::now();
            write(
                &path,
                &format!("{server}\n{}", body(api.addr, limit)),
                by_rename,
            );
            let deadline = started + Duration::from_secs(10);
            while rule_limit(&c, &gw).await != limit {
                assert!(
                    Instant::now() < deadline,
                    "limit {limit} never took effect (iteration {i}): {}",
                    gw.logs()
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            latencies.push(started.elapsed());
            assert_eq!(
                admitted(&c, &gw, &format!("p{i}")).await,
                limit,
                "new limit enforced"
            );
        } else {
            let bad = format!("{server}\n{}", body(api.addr, limit))
                .replace(&format!("limit = {limit}"), "limit = \"lots\"");
            write(&path, &bad, by_rename);
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let (_, err) = reload_generation(&c, &gw).await;
                if err.as_deref().is_some_and(|e| e.contains("gateway.toml:")) {
                    break;
                }
                assert!(Instant::now() < deadline, "invalid file never reported");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let (gen_after, _) = reload_generation(&c, &gw).await;
            assert_eq!(gen_after, gen_before, "an invalid file swaps nothing in");
            assert_eq!(
                admitted(&c, &gw, &format!("p{i}")).await,
                limit,
                "old limit still enforced"
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in load {
        t.await.unwrap();
    }
    let failed = failed.load(Ordering::Relaxed);
    let ok = ok.load(Ordering::Relaxed);
    latencies.sort();
    eprintln!(
        "reload latency (write -> in force): median {:?}, max {:?}; load: {ok} ok, {failed} failed",
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1]
    );
    assert_eq!(failed, 0, "requests failed during reloads");
    assert!(ok > 100, "the load kept running ({ok})");
    assert!(
        latencies[latencies.len() / 2] <= Duration::from_secs(1),
        "median reload latency {:?}",
        latencies[latencies.len() / 2]
    );

    let text = get_text(&c, gw.admin_url("/metrics")).await;
    assert!(
        text.contains("floodgate_config_reloads_total{result=\"failure\"} 10"),
        "{text}"
    );
    assert!(text.contains("floodgate_config_reloads_total{result=\"success\"} 10"));
    assert!(gw.logs().contains("config reload failed"));
}

#[tokio::test]
async fn counters_survive_a_limit_change_and_other_triggers_work() {
    let api = OrdersApi::start("orders");
    let gw = Gateway::start(&body(api.addr, 3));
    let path = gw.dir.path().join("gateway.toml");
    let original = std::fs::read_to_string(&path).unwrap();
    let c = client();
    for _ in 0..2 {
        assert_eq!(
            c.get(gw.url("/orders"))
                .header("x-probe", "k")
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
    }

    // POST /reload with the limit raised to 5: the key has used 2, so 3 remain (not 5).
    std::fs::write(&path, original.replace("limit = 3", "limit = 5")).unwrap();
    let r = c.post(gw.admin_url("/reload")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        admitted(&c, &gw, "k").await,
        3,
        "raising a limit does not hand out a fresh quota"
    );

    // SIGHUP with the limit lowered.
    std::fs::write(&path, original.replace("limit = 3", "limit = 1")).unwrap();
    let (gen, _) = reload_generation(&c, &gw).await;
    std::process::Command::new("kill")
        .arg("-HUP")
        .arg(gw.pid().to_string())
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while rule_limit(&c, &gw).await != 1 {
        assert!(Instant::now() < deadline, "SIGHUP did not reload");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(reload_generation(&c, &gw).await.0 > gen);

    // POST /reload of an invalid file: 422 with file:line:column, old config in force.
    std::fs::write(&path, original.replace("limit = 3", "limit = 1\nburst = 7")).unwrap();
    let r = c.post(gw.admin_url("/reload")).send().await.unwrap();
    assert_eq!(r.status(), 422);
    let p: Value = r.json().await.unwrap();
    assert!(
        p["detail"].as_str().unwrap().contains("gateway.toml:"),
        "{p}"
    );
    assert_eq!(rule_limit(&c, &gw).await, 1);

    // A change that needs a restart is reported, not silently ignored.
    let moved = original.replace("threads = 1", "threads = 2");
    std::fs::write(&path, moved).unwrap();
    let r: Value = c
        .post(gw.admin_url("/reload"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        r["reload"]["restart_required"],
        serde_json::json!(["server.threads"])
    );
}
