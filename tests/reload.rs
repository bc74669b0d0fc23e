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

// ---- Files written slowly: never applied before they are complete ----

/// A writer thread that truncates `path`, writes `text[..cut]`, holds the file open for
/// `pause`, writes the rest and closes it: a slow pipe, a script, a stopped editor.
struct SlowWriter {
    closed: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SlowWriter {
    fn start(path: &std::path::Path, text: &str, cut: usize, pause: Duration) -> SlowWriter {
        use std::io::Write as _;
        let (path, text) = (path.to_path_buf(), text.to_string());
        let closed = Arc::new(AtomicBool::new(false));
        let done = closed.clone();
        let thread = std::thread::spawn(move || {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(&path)
                .expect("open for writing");
            f.write_all(&text.as_bytes()[..cut]).expect("first part");
            std::thread::sleep(pause);
            f.write_all(&text.as_bytes()[cut..]).expect("the rest");
            drop(f);
            done.store(true, Ordering::SeqCst);
        });
        SlowWriter {
            closed,
            thread: Some(thread),
        }
    }

    /// Whether it has written everything and closed the file.
    fn closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

impl Drop for SlowWriter {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Waits until the gateway's watcher is up: a write that begins before it is not seen as one
/// under way.
async fn watching(gw: &Gateway) {
    eventually(Duration::from_secs(10), "the watcher up", || async {
        gw.logs()
            .contains("watching the config files")
            .then_some(())
    })
    .await;
}

/// The config of `gw` with the probe rule's limit set to `limit`, and where its `[[rules]]`
/// begin: the text before is a valid config without the rule (asserted), which is what
/// applying a prefix would put in force.
fn with_limit(gw: &Gateway, limit: u64) -> (String, usize) {
    let path = gw.config_path();
    let text = std::fs::read_to_string(&path).unwrap();
    let old = text
        .lines()
        .find(|l| l.starts_with("limit = "))
        .unwrap()
        .to_string();
    let text = text.replace(&old, &format!("limit = {limit}"));
    let cut = text.find("[[rules]]").unwrap();
    let prefix = floodgate::config::Config::from_str(&path, &text[..cut]).expect("valid prefix");
    assert!(prefix.rules.is_empty());
    (text, cut)
}

async fn failed_reloads(c: &reqwest::Client, gw: &Gateway) -> f64 {
    let text = get_text(c, gw.admin_url("/metrics")).await;
    metric_value(&text, "floodgate_config_reloads_total{result=\"failure\"}").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_pauses_mid_write_never_gets_its_prefix_applied() {
    let api = OrdersApi::start("orders");
    let gw = Gateway::start(&body(api.addr, 3));
    watching(&gw).await;
    let c = client();
    let (full, cut) = with_limit(&gw, 7);
    // Far past the old check (two reads 100 ms apart) and its debounce.
    let writer = SlowWriter::start(&gw.config_path(), &full, cut, Duration::from_millis(1500));
    tokio::time::sleep(Duration::from_millis(400)).await;
    let mut rounds = 0;
    while !writer.closed() {
        // Traffic during the pause is counted by the rule in force. A round that the writer's
        // close overlaps may meet the whole file: only rounds that ended before it count.
        let n = admitted(&c, &gw, &format!("pause-{rounds}")).await;
        let (generation, _) = reload_generation(&c, &gw).await;
        if writer.closed() {
            break;
        }
        assert_eq!(n, 3, "the prefix (no rule) is in force: {}", gw.logs());
        assert_eq!(generation, 1, "something was applied");
        rounds += 1;
    }
    assert!(rounds >= 2, "the pause was watched ({rounds} rounds)");
    eventually(
        Duration::from_secs(10),
        "the whole file in force",
        || async { (rule_limit(&c, &gw).await == 7).then_some(()) },
    )
    .await;
    assert_eq!(admitted(&c, &gw, "after").await, 7);
    let (generation, error) = reload_generation(&c, &gw).await;
    assert_eq!(generation, 2, "one reload, of the whole file");
    assert_eq!(error, None);
    assert_eq!(
        failed_reloads(&c, &gw).await,
        0.0,
        "a slow writer is no failure"
    );
}

#[tokio::test]
async fn a_reload_asked_for_mid_write_waits_for_the_writer_to_close() {
    let api = OrdersApi::start("orders");
    let gw = Gateway::start(&body(api.addr, 3));
    watching(&gw).await;
    let c = client();

    // POST /reload in the writer's pause answers once the writer is done, with its file.
    let (full, cut) = with_limit(&gw, 7);
    let writer = SlowWriter::start(&gw.config_path(), &full, cut, Duration::from_millis(1000));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = c.post(gw.admin_url("/reload")).send().await.unwrap();
    assert!(
        writer.closed(),
        "POST /reload answered before the writer closed"
    );
    assert_eq!(r.status(), 200);
    assert_eq!(
        rule_limit(&c, &gw).await,
        7,
        "POST /reload applied the whole file"
    );
    drop(writer);

    // SIGHUP in a pause applies nothing until the writer is done.
    let (full, cut) = with_limit(&gw, 8);
    let writer = SlowWriter::start(&gw.config_path(), &full, cut, Duration::from_millis(2000));
    tokio::time::sleep(Duration::from_millis(300)).await;
    gw.signal("HUP");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!writer.closed());
    assert_eq!(rule_limit(&c, &gw).await, 7, "SIGHUP applied the prefix");
    drop(writer);
    wait_for_limit(&c, &gw, 8, "the second file in force").await;
    assert_eq!(failed_reloads(&c, &gw).await, 0.0);
}

#[tokio::test]
async fn a_writer_that_keeps_the_file_open_is_refused_then_applied_when_it_closes() {
    let api = OrdersApi::start("orders");
    let gw = Gateway::start(&body(api.addr, 3));
    watching(&gw).await;
    let c = client();
    let (full, cut) = with_limit(&gw, 7);
    // Longer than a reload waits for a writer (5 s).
    let writer = SlowWriter::start(&gw.config_path(), &full, cut, Duration::from_millis(6500));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = c.post(gw.admin_url("/reload")).send().await.unwrap();
    assert!(!writer.closed());
    assert_eq!(r.status(), 422);
    let p: Value = r.json().await.unwrap();
    let detail = p["detail"].as_str().unwrap();
    assert!(
        detail.contains("gateway.toml") && detail.contains("open for writing"),
        "{detail}"
    );
    assert_eq!(rule_limit(&c, &gw).await, 3, "the config in force stays");
    assert_eq!(admitted(&c, &gw, "held").await, 3);
    drop(writer);
    eventually(
        Duration::from_secs(10),
        "the whole file in force once closed",
        || async { (rule_limit(&c, &gw).await == 7).then_some(()) },
    )
    .await;
    assert_eq!(reload_generation(&c, &gw).await, (2, None));
}

#[tokio::test]
async fn a_slowly_written_keys_file_is_applied_only_when_complete() {
    let key =
        |id: &str, secret: &str| format!("[[keys]]\nid = \"{id}\"\nsecret = \"{secret}\"\n\n");
    let api = OrdersApi::start("orders");
    let routes = format!(
        "[auth]\nkeys_file = \"keys.toml\"\n\n{}\n[[routes]]\nname = \"orders\"\nmatch = {{ path_prefix = \"/orders\" }}\nupstream = \"orders\"\nauth = \"required\"\n",
        orders_upstream(&[api.addr])
    );
    let keys = format!("{}{}", key("first", "one"), key("second", "two"));
    let gw = Gateway::start_with("", &routes, &[("keys.toml", &keys)]);
    watching(&gw).await;
    let c = client();
    let status = |secret: &'static str| {
        let (c, url) = (c.clone(), gw.url("/orders"));
        async move {
            c.get(url)
                .header("x-api-key", secret)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(status("two").await, 200);
    // The new file adds a third key; cut after the first, as a writer pausing there leaves it.
    let new = format!("{keys}{}", key("third", "three"));
    let writer = SlowWriter::start(
        &gw.dir.path().join("keys.toml"),
        &new,
        key("first", "one").len(),
        Duration::from_millis(1500),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    while !writer.closed() {
        assert_eq!(
            status("two").await,
            200,
            "a half-written keys file is in force"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eventually(
        Duration::from_secs(10),
        "the third key in force",
        || async { (status("three").await == 200).then_some(()) },
    )
    .await;
    assert_eq!(status("two").await, 200);
    assert_eq!(reload_generation(&c, &gw).await, (2, None));
}

// ---- Symlinked configs ----

/// Puts `text` at `path` by writing a temporary file beside it and renaming it over.
fn replace(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp-new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Makes `link` a symlink to `target`, atomically (a new link renamed over it).
fn relink(link: &std::path::Path, target: &std::path::Path) {
    let mut name = link.file_name().unwrap().to_os_string();
    name.push(".tmp-link");
    let tmp = link.with_file_name(name);
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).unwrap();
    std::fs::rename(&tmp, link).unwrap();
}

async fn wait_for_limit(c: &reqwest::Client, gw: &Gateway, limit: u64, what: &str) {
    eventually(Duration::from_secs(10), what, || async {
        (rule_limit(c, gw).await == limit).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_config_symlinked_from_another_folder_follows_its_target() {
    let api = OrdersApi::start("orders");
    let gw = Gateway::start(&body(api.addr, 3));
    let c = client();
    let config = gw.config_path();
    let text = std::fs::read_to_string(&config).unwrap();
    let at = |limit: u64| text.replace("limit = 3", &format!("limit = {limit}"));
    let elsewhere = tempfile::tempdir().unwrap();
    let links = tempfile::tempdir().unwrap();
    let real = elsewhere.path().join("real.toml");

    // gateway.toml becomes a link into another folder (a change in its own folder).
    std::fs::write(&real, at(12)).unwrap();
    relink(&config, &real);
    wait_for_limit(&c, &gw, 12, "gateway.toml relinked").await;
    // The target edited in place, then replaced by a rename in its own folder.
    std::fs::write(&real, at(4)).unwrap();
    wait_for_limit(&c, &gw, 4, "the link's target edited in place").await;
    replace(&real, &at(5));
    wait_for_limit(&c, &gw, 5, "the link's target replaced by a rename").await;

    // A chain: gateway.toml -> links/link.toml -> elsewhere/second.toml.
    let second = elsewhere.path().join("second.toml");
    std::fs::write(&second, at(6)).unwrap();
    let link = links.path().join("link.toml");
    relink(&link, &second);
    relink(&config, &link);
    wait_for_limit(&c, &gw, 6, "gateway.toml relinked to a chain").await;
    std::fs::write(&second, at(8)).unwrap();
    wait_for_limit(&c, &gw, 8, "the chain's end edited").await;

    // The link in the middle swapped: the new end is followed, the old one no more.
    let third = elsewhere.path().join("third.toml");
    std::fs::write(&third, at(9)).unwrap();
    relink(&link, &third);
    wait_for_limit(&c, &gw, 9, "the chain's middle link swapped").await;
    std::fs::write(&second, at(11)).unwrap();
    std::fs::write(&third, at(10)).unwrap();
    wait_for_limit(&c, &gw, 10, "the new end edited").await;
    assert_eq!(
        rule_limit(&c, &gw).await,
        10,
        "the old end is no longer followed"
    );
    assert!(reload_generation(&c, &gw).await.1.is_none());
}

#[tokio::test]
async fn a_kubernetes_style_data_swap_reloads_the_config_and_its_keys() {
    let api = OrdersApi::start("orders");
    let keys = "[[keys]]\nid = \"k1\"\nsecret = \"one\"\n";
    let config = format!("[auth]\nkeys_file = \"keys.toml\"\n\n{}", body(api.addr, 3));
    let gw = Gateway::start_with("", &config, &[("keys.toml", keys)]);
    let c = client();
    let dir = gw.dir.path();
    let text = std::fs::read_to_string(gw.config_path()).unwrap();
    // What the kubelet builds: files in a timestamped folder, `..data` linking to it, and
    // each name a link through `..data`.
    let publish = |stamp: &str, config: &str, keys: &str| {
        let folder = dir.join(stamp);
        std::fs::create_dir(&folder).unwrap();
        std::fs::write(folder.join("gateway.toml"), config).unwrap();
        std::fs::write(folder.join("keys.toml"), keys).unwrap();
        relink(&dir.join("..data"), std::path::Path::new(stamp));
    };
    publish("..2024_05_01_1", &text, keys);
    relink(
        &gw.config_path(),
        std::path::Path::new("..data/gateway.toml"),
    );
    relink(
        &dir.join("keys.toml"),
        std::path::Path::new("..data/keys.toml"),
    );
    // The swap: a new folder, `..data` renamed over, the old folder removed.
    let keys2 =
        "[[keys]]\nid = \"k1\"\nsecret = \"one\"\n\n[[keys]]\nid = \"k2\"\nsecret = \"two\"\n";
    publish(
        "..2024_05_01_2",
        &text.replace("limit = 3", "limit = 5"),
        keys2,
    );
    std::fs::remove_dir_all(dir.join("..2024_05_01_1")).unwrap();
    wait_for_limit(&c, &gw, 5, "the ConfigMap swap").await;
    let r = c
        .get(gw.url("/orders"))
        .header("x-api-key", "two")
        .header("x-probe", "p")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "the keys file came with it");
    assert!(reload_generation(&c, &gw).await.1.is_none());
}

/// One rule for every algorithm — a reload that changes a rule's `window` starts
/// its counts over; one that changes its `limit` keeps them.
#[tokio::test]
async fn a_changed_window_starts_the_counts_over_and_a_changed_limit_keeps_them() {
    let api = OrdersApi::start("orders-1");
    let c = client();
    for algorithm in [
        "fixed_window",
        "sliding_window_log",
        "sliding_window_counter",
        "token_bucket",
        "leaky_bucket",
    ] {
        let cfg = |limit: u64, window: &str| {
            format!(
                "{}\n[[routes]]\nname = \"debug\"\nmatch = {{ path_prefix = \"/debug\" }}\nupstream = \"orders\"\nauth = \"none\"\n\
                 [[rules]]\nname = \"r\"\nkey = [\"ip\"]\nalgorithm = \"{algorithm}\"\nlimit = {limit}\nwindow = \"{window}\"\nscope = \"local\"\n",
                orders_upstream(&[api.addr])
            )
        };
        let gw = Gateway::start(&cfg(3, "1h"));
        let status = |path: &'static str| {
            let c = c.clone();
            let url = gw.url(path);
            async move { c.get(url).send().await.unwrap().status().as_u16() }
        };
        let reload = |text: String| {
            std::fs::write(gw.config_path(), text).unwrap();
            let c = c.clone();
            let url = gw.admin_url("/reload");
            async move {
                let r = c.post(url).send().await.unwrap();
                assert_eq!(r.status(), 200, "{algorithm}");
            }
        };
        for _ in 0..3 {
            assert_eq!(status("/debug/a").await, 200, "{algorithm}");
        }
        assert_eq!(status("/debug/a").await, 429, "{algorithm}: 3 of 3 used");
        // 1h -> 2h: a fresh count.
        reload(cfg(3, "2h")).await;
        assert_eq!(
            status("/debug/a").await,
            200,
            "{algorithm}: a changed window starts over"
        );
        assert_eq!(status("/debug/a").await, 200, "{algorithm}");
        // limit 3 -> 4, same window: the 2 used stay used, 2 are left.
        reload(cfg(4, "2h")).await;
        assert_eq!(status("/debug/a").await, 200, "{algorithm}");
        assert_eq!(status("/debug/a").await, 200, "{algorithm}");
        assert_eq!(
            status("/debug/a").await,
            429,
            "{algorithm}: a changed limit keeps the count"
        );
    }
}
