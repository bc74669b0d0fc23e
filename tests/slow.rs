//! `mode = "slow"` end to end: the real binary in front of the real orders-api. A client past
//! its limit still gets its download (or gets its upload through), at `slow_rate`; a client
//! within it, and another client meanwhile, are not slowed; the upstream's timeout still cuts
//! a slowed response; HTTP/1.1 and h2; the metric, the headers and the access log; and
//! `floodgate check` refuses slow mode where it cannot work.

mod common;

use std::time::{Duration, Instant};

use common::*;

/// 150 KiB: three seconds at 50 KiB/s.
const DOWNLOAD: usize = 150 * 1024;

/// A download route and an upload route, with one rule that slows each `x-client` past its
/// first request a minute to 50 KiB/s. `timeouts` go into the upstream table.
fn config(api: &OrdersApi, timeouts: &str) -> String {
    format!(
        "[[upstreams]]
name = \"orders\"
targets = [\"{}\"]
connect_timeout = \"500ms\"
{timeouts}
[[routes]]
name = \"files\"
match = {{ path_prefix = \"/\" }}
upstream = \"orders\"
auth = \"none\"

[[rules]]
name = \"slow-downloads\"
key = [\"header:x-client\"]
algorithm = \"fixed_window\"
limit = 1
window = \"1h\"
mode = \"slow\"
slow_rate = \"50KiB\"
",
        api.addr
    )
}

/// Upstream timeouts that a slowed transfer of a few seconds fits in.
const ROOMY: &str = "read_timeout = \"10s\"\n";

/// `GET /download` of [`DOWNLOAD`] bytes as `client`: the response's status, headers, body
/// length (or the error that cut it) and how long the whole exchange took.
async fn download(
    c: &reqwest::Client,
    gw: &Gateway,
    client: &str,
) -> (
    u16,
    reqwest::header::HeaderMap,
    Result<usize, String>,
    Duration,
) {
    let started = Instant::now();
    let r = c
        .get(gw.url(&format!("/download?bytes={DOWNLOAD}")))
        .header("x-client", client)
        .send()
        .await
        .expect("GET /download");
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let body = r.bytes().await.map(|b| b.len()).map_err(|e| e.to_string());
    (status, headers, body, started.elapsed())
}

/// The `RateLimit` field of a response.
fn ratelimit(h: &reqwest::header::HeaderMap) -> String {
    h.get("ratelimit")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn a_download_past_the_limit_is_slowed_and_another_client_is_not() {
    let api = OrdersApi::start("slow-h1");
    let gw = Gateway::start(&config(&api, ROOMY));
    let c = client();

    let (status, _, body, took) = download(&c, &gw, "alice").await;
    assert_eq!((status, body), (200, Ok(DOWNLOAD)));
    assert!(
        took < Duration::from_millis(1500),
        "within the limit: {took:?}"
    );

    // Past the limit: served, slowly. Bob, within his, is not slowed meanwhile.
    let slowed = {
        let c = c.clone();
        let url = gw.url(&format!("/download?bytes={DOWNLOAD}"));
        tokio::spawn(async move {
            let started = Instant::now();
            let r = c.get(url).header("x-client", "alice").send().await.unwrap();
            let headers = r.headers().clone();
            let status = r.status().as_u16();
            let len = r.bytes().await.map(|b| b.len()).map_err(|e| e.to_string());
            (status, headers, len, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, _, body, took) = download(&c, &gw, "bob").await;
    assert_eq!((status, body), (200, Ok(DOWNLOAD)));
    assert!(
        took < Duration::from_millis(1500),
        "another client is not slowed: {took:?}"
    );
    let (status, headers, body, took) = slowed.await.unwrap();
    eprintln!("slowed 150 KiB download (HTTP/1.1): {took:?}");
    assert_eq!((status, body), (200, Ok(DOWNLOAD)), "served whole");
    assert!(
        took >= Duration::from_secs(2) && took <= Duration::from_secs(10),
        "150 KiB at 50 KiB/s takes about 3 s, took {took:?}"
    );
    assert!(
        ratelimit(&headers).contains("\"slow-downloads\";r=0;"),
        "over its limit: {:?}",
        ratelimit(&headers)
    );
    assert!(
        headers.get("retry-after").is_none(),
        "served, so no Retry-After"
    );

    let metrics = get_text(&c, gw.admin_url("/metrics")).await;
    let series = "floodgate_ratelimit_decisions_total{result=\"slowed\",rule=\"slow-downloads\"}";
    assert_eq!(metric_value(&metrics, series), Some(1.0), "{metrics}");
    let rejected =
        "floodgate_ratelimit_decisions_total{result=\"rejected\",rule=\"slow-downloads\"}";
    assert_eq!(metric_value(&metrics, rejected), Some(0.0));
    let stats = get_json(&c, gw.admin_url("/stats")).await;
    let rule = stats["rules"]
        .as_array()
        .and_then(|rules| rules.iter().find(|r| r["name"] == "slow-downloads"))
        .expect("the rule in /stats");
    assert_eq!(rule["counters"]["slowed"], 1, "{rule}");
    let top = get_json(
        &c,
        gw.admin_url("/top?rule=slow-downloads&window=1m&by=rejected"),
    )
    .await;
    assert_eq!(
        top["clients"][0]["key"]["header:x-client"], "alice",
        "the slowed client is among the limited ones: {top}"
    );
    let logs = eventually(Duration::from_secs(5), "the slowed access line", || {
        let logs = gw.logs();
        async move {
            logs.lines()
                .any(|l| l.contains("slowed_by") && l.contains("slow-downloads"))
                .then_some(logs)
        }
    })
    .await;
    assert!(
        logs.lines()
            .filter(|l| l.contains("slowed_by"))
            .any(|l| !l.contains("slow-downloads")),
        "requests that were not slowed log slowed_by=-"
    );
}

#[tokio::test]
async fn h2_downloads_are_slowed_too() {
    let api = OrdersApi::start("slow-h2");
    let gw = Gateway::start(&config(&api, ROOMY));
    let c = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let (status, _, body, took) = download(&c, &gw, "carol").await;
    assert_eq!((status, body), (200, Ok(DOWNLOAD)));
    assert!(
        took < Duration::from_millis(1500),
        "within the limit: {took:?}"
    );
    let r = c
        .get(gw.url("/healthz"))
        .header("x-client", "carol-probe")
        .send()
        .await
        .unwrap();
    assert_eq!(r.version(), reqwest::Version::HTTP_2);
    let (status, headers, body, took) = download(&c, &gw, "carol").await;
    eprintln!("slowed 150 KiB download (h2): {took:?}");
    assert_eq!((status, body), (200, Ok(DOWNLOAD)));
    assert!(
        took >= Duration::from_secs(2) && took <= Duration::from_secs(10),
        "150 KiB at 50 KiB/s over h2 takes about 3 s, took {took:?}"
    );
    assert!(ratelimit(&headers).contains(";r=0;"));
}

#[tokio::test]
async fn a_slowed_upload_goes_at_the_slow_rate() {
    let api = OrdersApi::start("slow-upload");
    let gw = Gateway::start(&config(&api, ROOMY));
    let c = client();
    // 200 KiB, more than floodgate reads ahead (64 KiB), so all of it goes at 50 KiB/s:
    // about 4 s.
    let body = vec![b'u'; 200 * 1024];
    let upload = |client: &'static str| {
        let (c, url, body) = (c.clone(), gw.url("/upload"), body.clone());
        async move {
            let started = Instant::now();
            let r = c
                .post(url)
                .header("x-client", client)
                .body(body)
                .send()
                .await
                .expect("POST /upload");
            let status = r.status().as_u16();
            let answer: serde_json::Value = r.json().await.expect("JSON");
            (status, answer["bytes"].as_u64(), started.elapsed())
        }
    };
    let (status, bytes, took) = upload("dave").await;
    assert_eq!((status, bytes), (200, Some(200 * 1024)));
    assert!(
        took < Duration::from_millis(1500),
        "within the limit: {took:?}"
    );
    let (status, bytes, took) = upload("dave").await;
    eprintln!("slowed 200 KiB upload: {took:?}");
    assert_eq!((status, bytes), (200, Some(200 * 1024)), "the whole body");
    assert!(
        took >= Duration::from_secs(2) && took <= Duration::from_secs(12),
        "200 KiB at 50 KiB/s takes about 4 s, took {took:?}"
    );
}

#[tokio::test]
async fn a_slowed_download_is_cut_by_the_upstream_timeout() {
    let api = OrdersApi::start("slow-timeout");
    let gw = Gateway::start(&config(&api, "read_timeout = \"10s\"\ntimeout = \"1s\"\n"));
    let c = client();
    let (status, _, body, _) = download(&c, &gw, "erin").await;
    assert_eq!((status, body), (200, Ok(DOWNLOAD)), "fast enough unslowed");
    let (status, _, body, took) = download(&c, &gw, "erin").await;
    eprintln!("slowed download under a 1 s timeout: {status} {body:?} after {took:?}");
    // The head goes out with the first piece, which waits for its turn: the timeout may come
    // first (504), or cut the body short.
    assert!(
        status == 504 || body.as_ref().map_or(true, |&n| n < DOWNLOAD),
        "cut, not served whole: {status} {body:?}"
    );
    assert!(
        took < Duration::from_millis(2900),
        "cut at the 1 s timeout, before the 3 s the slowed body needs: {took:?}"
    );
}

#[test]
fn check_refuses_slow_mode_where_it_cannot_work() {
    let head = "[[upstreams]]\nname = \"orders\"\ntargets = [\"127.0.0.1:9000\"]\n\n[[routes]]\nname = \"orders\"\nupstream = \"orders\"\n\n[[rules]]\nname = \"r\"\nkey = [\"ip\"]\n";
    let cases = [
        (
            "algorithm = \"token_bucket\"\nlimit = 10\nwindow = \"1s\"\nmode = \"slow\"\n",
            "gateway.toml:15:8: rule \"r\": mode = \"slow\" needs a slow_rate",
        ),
        (
            "algorithm = \"token_bucket\"\nlimit = 10\nwindow = \"1s\"\nslow_rate = \"64KiB\"\n",
            "gateway.toml:15:13: rule \"r\": slow_rate applies only with mode = \"slow\"",
        ),
        (
            "algorithm = \"concurrency\"\nlimit = 10\nmode = \"slow\"\nslow_rate = \"64KiB\"\n",
            "gateway.toml:14:8: rule \"r\": mode = \"slow\" is not allowed here: concurrency",
        ),
        (
            "algorithm = \"leaky_bucket\"\nlimit = 10\nwindow = \"1s\"\nmode = \"slow\"\nmax_delay = \"1s\"\nslow_rate = \"64KiB\"\n",
            "gateway.toml:16:13: rule \"r\": max_delay applies to leaky_bucket with mode = \"shape\" only",
        ),
        (
            "algorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1s\"\nmode = \"slow\"\nslow_rate = \"64 kb\"\n",
            "gateway.toml:16:13: rule \"r\": slow_rate \"64 kb\" has unknown unit \" kb\"",
        ),
    ];
    for (rule, error) in cases {
        let (ok, _, stderr) = check(&format!("{head}{rule}"), &[]);
        assert!(!ok, "{rule} should fail");
        assert!(
            stderr.contains(error),
            "{rule}: wanted {error:?}, got {stderr}"
        );
    }
    let (ok, stdout, stderr) = check(
        &format!("{head}algorithm = \"leaky_bucket\"\nlimit = 10\nwindow = \"1s\"\nmode = \"slow\"\nslow_rate = \"1MiB\"\n"),
        &[],
    );
    assert!(ok, "a slowing leaky bucket is fine: {stderr}");
    assert!(stdout.contains("slow"), "check shows the mode: {stdout}");
}

#[tokio::test]
async fn a_slowed_upload_is_cut_by_the_body_timeout() {
    let api = OrdersApi::start("slow-body-timeout");
    let gw = Gateway::start_with("body_timeout = \"1s\"\n", &config(&api, ROOMY), &[]);
    let c = client();
    // 400 KiB: unslowed it is in at once; slowed it would need 8 s at 50 KiB/s, and the
    // body is due within 1 s of the head.
    let body = vec![b'u'; 400 * 1024];
    let upload = || {
        c.post(gw.url("/upload"))
            .header("x-client", "frank")
            .body(body.clone())
            .send()
    };
    let r = upload().await.expect("the first upload");
    assert_eq!(r.status(), 200, "within the limit, in time");
    let started = Instant::now();
    let cut = match upload().await {
        Ok(r) => {
            let status = r.status().as_u16();
            let bytes = r
                .json::<serde_json::Value>()
                .await
                .ok()
                .map(|v| v["bytes"].clone());
            assert_ne!(
                (status, bytes),
                (200, Some(serde_json::json!(400 * 1024))),
                "a slowed upload past body_timeout is not delivered whole"
            );
            status
        }
        // The connection was closed under the client's feet: cut too.
        Err(_) => 0,
    };
    let took = started.elapsed();
    eprintln!("slowed upload under a 1 s body_timeout: {cut} after {took:?}");
    assert!(cut == 408 || cut == 0, "408 or closed, got {cut}");
    assert!(
        took < Duration::from_secs(5),
        "cut at the 1 s body_timeout, not after the 8 s the slowed body needs: {took:?}"
    );
}

#[tokio::test]
async fn a_global_rule_in_redis_slows_too() {
    let redis = common::redis::RedisServer::start();
    let api = OrdersApi::start("slow-redis");
    let store = common::redis::store(&redis.url(), "250ms", "");
    let gw = Gateway::start(&format!("{store}{}", config(&api, ROOMY)));
    let c = client();
    let (status, _, body, took) = download(&c, &gw, "grace").await;
    assert_eq!((status, body), (200, Ok(DOWNLOAD)));
    assert!(
        took < Duration::from_millis(1500),
        "within the limit: {took:?}"
    );
    let (status, headers, body, took) = download(&c, &gw, "grace").await;
    eprintln!("slowed 150 KiB download, rule in Redis: {took:?}");
    assert_eq!((status, body), (200, Ok(DOWNLOAD)));
    assert!(
        took >= Duration::from_secs(2) && took <= Duration::from_secs(10),
        "150 KiB at 50 KiB/s takes about 3 s, took {took:?}"
    );
    assert!(ratelimit(&headers).contains("\"slow-downloads\";r=0;"));
    assert!(
        redis.command_calls("evalsha") + redis.command_calls("eval") >= 2,
        "both requests were decided in Redis"
    );
    let metrics = get_text(&c, gw.admin_url("/metrics")).await;
    let series = "floodgate_ratelimit_decisions_total{result=\"slowed\",rule=\"slow-downloads\"}";
    assert_eq!(metric_value(&metrics, series), Some(1.0));
}
