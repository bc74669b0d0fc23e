//! Response-aware limits through the real binary, in front of the real demo API (its
//! `POST /login` answers 401 unless the password is right): `count` charges only the statuses
//! it names (in process and in a real redis-server shared by several instances), and
//! `block_for` keeps a rejected key out for its duration.

mod common;

use std::time::{Duration, Instant};

use common::redis::{store, RedisCluster, RedisServer};
use common::*;

const LOGIN_ROUTE: &str = r#"
[[routes]]
name = "login"
match = { path = "/login", methods = ["POST"] }
upstream = "orders"
auth = "none"
"#;

/// A failures-only login rule: `limit` failed logins per `window` and IP.
fn login_rule(algorithm: &str, limit: u64, window: &str, extra: &str) -> String {
    format!(
        r#"
[[rules]]
name = "login"
match = {{ path = "/login", methods = ["POST"] }}
key = ["ip"]
algorithm = "{algorithm}"
limit = {limit}
window = "{window}"
count = {{ status = [401, 403] }}
{extra}
"#
    )
}

fn gateway(api: &OrdersApi, store: &str, rules: &str) -> Gateway {
    Gateway::start(&format!(
        "{}{store}{LOGIN_ROUTE}{rules}",
        orders_upstream(&[api.addr])
    ))
}

async fn login(c: &reqwest::Client, gw: &Gateway, password: &str) -> reqwest::Response {
    c.post(gw.url("/login"))
        .json(&serde_json::json!({ "user": "ann", "password": password }))
        .send()
        .await
        .expect("login answered")
}

/// How many failed logins the demo API saw.
async fn upstream_failures(c: &reqwest::Client, api: &OrdersApi) -> u64 {
    let seen = get_json(c, format!("http://{}/debug/logins", api.addr)).await;
    seen["failed"].as_u64().expect("a count")
}

/// In process and in Redis, on every algorithm that can settle: successful logins are never
/// limited, the (L+1)th failure is refused, and the upstream saw exactly L failures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_failed_logins_are_counted() {
    let redis = RedisServer::start();
    let c = client();
    let backends = [String::new(), store(&redis.url(), "500ms", "")];
    for (b, backend) in backends.iter().enumerate() {
        for algorithm in [
            "fixed_window",
            "sliding_window_log",
            "sliding_window_counter",
            "token_bucket",
            "leaky_bucket",
        ] {
            let api = OrdersApi::start("orders");
            let gw = gateway(&api, backend, &login_rule(algorithm, 3, "1m", ""));
            let what = format!("{algorithm} on backend {b}");
            for i in 0..10 {
                let r = login(&c, &gw, "open-sesame").await;
                assert_eq!(r.status(), 200, "{what}: successful login {i}");
            }
            for i in 0..3 {
                let r = login(&c, &gw, "guess").await;
                assert_eq!(r.status(), 401, "{what}: failure {i} reaches the upstream");
            }
            let r = login(&c, &gw, "guess").await;
            assert_eq!(r.status(), 429, "{what}: the fourth failure is refused");
            let r = login(&c, &gw, "open-sesame").await;
            assert_eq!(
                r.status(),
                429,
                "{what}: a client out of failures is refused whatever it sends"
            );
            assert_eq!(upstream_failures(&c, &api).await, 3, "{what}");
        }
    }
}

/// 60 concurrent failed logins from one client over 3 instances on one Redis: exactly L
/// reach the upstream, however they interleave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_failures_over_three_instances_reach_the_upstream_exactly_l_times() {
    let redis = RedisServer::start();
    let api = OrdersApi::start("orders");
    let backend = store(&redis.url(), "2s", "instances = 3");
    let rules = login_rule("sliding_window_log", 7, "1m", "");
    let gws: Vec<Gateway> = (0..3).map(|_| gateway(&api, &backend, &rules)).collect();
    let c = client();
    let mut tasks = Vec::new();
    for i in 0..60 {
        let (c, url) = (c.clone(), gws[i % 3].url("/login"));
        tasks.push(tokio::spawn(async move {
            c.post(url)
                .json(&serde_json::json!({ "password": "guess" }))
                .send()
                .await
                .map_or(0, |r| r.status().as_u16())
        }));
    }
    let mut statuses = std::collections::BTreeMap::new();
    for t in tasks {
        *statuses.entry(t.await.unwrap()).or_insert(0) += 1;
    }
    assert_eq!(statuses.get(&401), Some(&7), "{statuses:?}");
    assert_eq!(statuses.get(&429), Some(&53), "{statuses:?}");
    assert_eq!(upstream_failures(&c, &api).await, 7);
}

/// A refund of a successful login shows in the settled metric, and the RateLimit headers of
/// the next request show the quota given back.
#[tokio::test]
async fn a_refund_is_counted_and_seen_by_the_next_request() {
    let api = OrdersApi::start("orders");
    let gw = gateway(&api, "", &login_rule("fixed_window", 2, "1m", ""));
    let c = client();
    for _ in 0..3 {
        let r = login(&c, &gw, "open-sesame").await;
        assert_eq!(r.status(), 200);
        let remaining = r.headers()["ratelimit"].to_str().unwrap().to_owned();
        assert!(remaining.contains("r=1"), "{remaining}");
    }
    let metrics = get_text(&c, gw.admin_url("/metrics")).await;
    let refunded = r#"floodgate_response_settled_total{result="refunded",rule="login"}"#;
    assert_eq!(metric_value(&metrics, refunded), Some(3.0), "{metrics}");
    login(&c, &gw, "guess").await;
    let metrics = get_text(&c, gw.admin_url("/metrics")).await;
    let charged = r#"floodgate_response_settled_total{result="charged",rule="login"}"#;
    assert_eq!(metric_value(&metrics, charged), Some(1.0), "{metrics}");
}

/// `check` refuses count where a response cannot true the charge up, with the reason.
#[test]
fn check_refuses_count_where_it_cannot_work() {
    let base = format!(
        "{}{LOGIN_ROUTE}",
        orders_upstream(&["127.0.0.1:9".parse().unwrap()])
    );
    let cases = [
        (
            "algorithm = \"concurrency\"\nlimit = 2\ncount = { status = [401] }",
            "count is not allowed here: concurrency",
        ),
        (
            "algorithm = \"leaky_bucket\"\nlimit = 2\nwindow = \"1s\"\nmode = \"shape\"\nblock_for = \"1m\"",
            "block_for is not allowed here: a shaping leaky bucket",
        ),
        (
            "algorithm = \"fixed_window\"\nlimit = 2\nwindow = \"1s\"\nlease = 5\nblock_for = \"1m\"",
            "block_for is not allowed here: lease",
        ),
        (
            "algorithm = \"fixed_window\"\nlimit = 2\nwindow = \"1s\"\ncount = { status = [\"6xx\"] }",
            "count.status entries are status codes",
        ),
        (
            "algorithm = \"fixed_window\"\nlimit = 2\nwindow = \"1s\"\ncount = { status = [] }",
            "count.status needs at least one status",
        ),
    ];
    for (rule, error) in cases {
        let config = format!("{base}\n[[rules]]\nname = \"r\"\nkey = [\"ip\"]\n{rule}\n");
        let (ok, _, stderr) = check(&config, &[]);
        assert!(!ok, "{rule}: accepted");
        assert!(stderr.contains(error), "{rule}: {stderr}");
        assert!(
            stderr.contains("gateway.toml:"),
            "{rule}: no location: {stderr}"
        );
    }
}

/// `floodgate check` lists what each rule learns from the response: `count`'s statuses,
/// `cost_from`'s source and `block_for`'s duration, and nothing for a rule without them.
#[test]
fn check_lists_count_cost_from_and_block_for() {
    let config = format!(
        "{}{LOGIN_ROUTE}{LLM_ROUTE}{}{}\n[[rules]]\nname = \"plain\"\nkey = [\"ip\"]\nalgorithm = \"fixed_window\"\nlimit = 9\nwindow = \"1s\"\n",
        orders_upstream(&["127.0.0.1:9".parse().unwrap()]),
        login_rule("sliding_window_log", 5, "1m", "block_for = \"15m\""),
        token_rule("header:x-usage-total-tokens"),
    )
    .replace("[401, 403]", "[401, \"5xx\"]");
    let (ok, stdout, stderr) = check(&config, &[]);
    assert!(ok, "{stderr}");
    let rules = stdout
        .split("rules (checked")
        .nth(1)
        .expect("the rules listed");
    let line = |name: &str| {
        rules
            .lines()
            .find(|l| l.contains(&format!(". {name}: ")))
            .unwrap_or_else(|| panic!("{name} listed: {stdout}"))
            .to_owned()
    };
    assert!(
        line("login").ends_with(" | count [401, 5xx] | block_for 15m"),
        "{stdout}"
    );
    assert!(
        line("tokens").ends_with(" | cost_from header:x-usage-total-tokens"),
        "{stdout}"
    );
    let plain = line("plain");
    assert!(
        !plain.contains("count") && !plain.contains("cost_from") && !plain.contains("block_for"),
        "{plain}"
    );
}

/// In process and in Redis: a client that used up its failures is blocked for `block_for`,
/// longer than its bucket takes to refill (a successful login is refused too, told to retry
/// after what is left of the block), and let in again once the block is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_for_outlasts_a_refilled_bucket_and_ends_on_time() {
    let redis = RedisServer::start();
    let c = client();
    let backends = [String::new(), store(&redis.url(), "500ms", "")];
    for (b, backend) in backends.iter().enumerate() {
        let api = OrdersApi::start("orders");
        // 2 failures per 400ms: the bucket is full again 400ms after it emptied.
        let rules = login_rule("token_bucket", 2, "400ms", "block_for = \"2s\"");
        let gw = gateway(&api, backend, &rules);
        for _ in 0..2 {
            assert_eq!(login(&c, &gw, "guess").await.status(), 401, "backend {b}");
        }
        let r = login(&c, &gw, "guess").await;
        let blocked_at = Instant::now();
        assert_eq!(r.status(), 429, "backend {b}: the third failure is refused");
        assert_eq!(
            r.headers()["retry-after"],
            "2",
            "backend {b}: the rejection that starts the block says when it ends"
        );
        tokio::time::sleep(Duration::from_millis(900)).await;
        let r = login(&c, &gw, "open-sesame").await;
        assert_eq!(
            r.status(),
            429,
            "backend {b}: blocked although the bucket refilled"
        );
        let retry: u64 = r.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=2).contains(&retry), "backend {b}: Retry-After {retry}");
        // /top shows the blocked key and what is left of its block.
        let top = get_json(&c, gw.admin_url("/top?rule=login")).await;
        let blocked = top["blocked"].as_array().expect("blocked list");
        assert_eq!(blocked.len(), 1, "backend {b}: {top}");
        assert_eq!(blocked[0]["key"]["ip"], "127.0.0.1", "backend {b}: {top}");
        let left = blocked[0]["seconds_left"].as_u64().unwrap();
        assert!((1..=2).contains(&left), "backend {b}: {top}");
        // Polling does not extend the block: only the rule's own rejection sets one.
        let back = eventually(Duration::from_secs(10), "the block ends", || async {
            let r = login(&c, &gw, "open-sesame").await;
            (r.status() == 200).then(Instant::now)
        })
        .await;
        let blocked = back - blocked_at;
        assert!(
            blocked >= Duration::from_millis(1900),
            "backend {b}: the block ended after {blocked:?}, before its 2s"
        );
        assert_eq!(upstream_failures(&c, &api).await, 2, "backend {b}");
        let top = get_json(&c, gw.admin_url("/top?rule=login")).await;
        assert_eq!(top["blocked"], serde_json::json!([]), "backend {b}: over");
    }
}

const LLM_ROUTE: &str = r#"
[[routes]]
name = "llm"
match = { path_prefix = "/v1/" }
upstream = "orders"
auth = "none"
"#;

/// A token budget: 100 tokens a minute per IP, 10 reserved per request, the true cost read
/// from `from`.
fn token_rule(from: &str) -> String {
    format!(
        r#"
[[rules]]
name = "tokens"
match = {{ route = "llm" }}
key = ["ip"]
algorithm = "fixed_window"
limit = 100
window = "1h"
cost = 10
cost_from = "{from}"
"#
    )
}

fn llm_gateway(api: &OrdersApi, store: &str, rules: &str) -> Gateway {
    Gateway::start(&format!(
        "{}{store}{LLM_ROUTE}{rules}",
        orders_upstream(&[api.addr])
    ))
}

/// One chat completion of 30 tokens (5 prompt words, 25 completion tokens); the status, the
/// `r` of its RateLimit field and the body, read to its end.
async fn complete(c: &reqwest::Client, gw: &Gateway, usage: &str, stream: bool) -> (u16, String) {
    complete_with(c, gw, usage, stream, 25).await
}

/// One chat completion of 5 prompt words and `max_tokens` completion tokens (at most 10,000:
/// the demo API's cap); the status and the RateLimit field.
async fn complete_with(
    c: &reqwest::Client,
    gw: &Gateway,
    usage: &str,
    stream: bool,
    max_tokens: u64,
) -> (u16, String) {
    let r = c
        .post(gw.url(&format!("/v1/chat/completions?usage={usage}")))
        .json(&serde_json::json!({
            "model": "demo",
            "messages": [{ "role": "user", "content": "one two three four five" }],
            "max_tokens": max_tokens,
            "stream": stream,
            "stream_options": { "include_usage": true },
        }))
        .send()
        .await
        .expect("answered");
    let status = r.status().as_u16();
    let ratelimit = r
        .headers()
        .get("ratelimit")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let _ = r.text().await.expect("the whole body");
    (status, ratelimit)
}

/// Waits until `n` reservations of rule `tokens` are settled (the metric counts one once the
/// store has it): a `cost_from` true-up lands as the exchange ends, which a client's next
/// request on another connection may overtake.
async fn settled(c: &reqwest::Client, gw: &Gateway, n: u64) {
    eventually(Duration::from_secs(10), "the true-ups landed", || async {
        let metrics = get_text(c, gw.admin_url("/metrics")).await;
        let total: f64 = ["charged", "refunded", "charged_extra"]
            .iter()
            .filter_map(|r| {
                let series =
                    format!(r#"floodgate_response_settled_total{{result="{r}",rule="tokens"}}"#);
                metric_value(&metrics, &series)
            })
            .sum();
        (total >= n as f64).then_some(())
    })
    .await;
}

/// In process and in Redis, through a JSON body, an event stream and a header: each request
/// reserves 10 and is charged its 30 tokens, so a 100-token budget admits 4 (the fourth
/// overshoots by 20, its true cost minus its reservation) and refuses the fifth.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_budgets_through_json_stream_and_header() {
    let redis = RedisServer::start();
    let c = client();
    let variants = [
        ("json:usage.total_tokens", "body", false),
        ("json:usage.total_tokens", "body", true),
        ("header:x-usage-total-tokens", "header", false),
    ];
    for b in 0..2 {
        for (v, (from, usage, stream)) in variants.into_iter().enumerate() {
            // Each case counts in Redis keys of its own.
            let backend = match b {
                0 => String::new(),
                _ => store(&redis.url(), "500ms", &format!("key_prefix = \"v{v}:\"")),
            };
            let api = OrdersApi::start("orders");
            let gw = llm_gateway(&api, &backend, &token_rule(from));
            let what = format!("{from} stream={stream} backend {b}");
            let (status, first) = complete(&c, &gw, usage, stream).await;
            assert_eq!(status, 200, "{what}");
            assert!(
                first.contains("r=90"),
                "{what}: reserved 10 of 100: {first}"
            );
            settled(&c, &gw, 1).await;
            let (_, second) = complete(&c, &gw, usage, stream).await;
            assert!(
                second.contains("r=60"),
                "{what}: charged 30, reserved 10: {second}"
            );
            for i in 3..=4 {
                settled(&c, &gw, i - 1).await;
                assert_eq!(complete(&c, &gw, usage, stream).await.0, 200, "{what}: {i}");
            }
            settled(&c, &gw, 4).await;
            let (status, _) = complete(&c, &gw, usage, stream).await;
            assert_eq!(status, 429, "{what}: 120 tokens spent of 100");
            let metrics = get_text(&c, gw.admin_url("/metrics")).await;
            let extra = r#"floodgate_response_settled_total{result="charged_extra",rule="tokens"}"#;
            assert_eq!(metric_value(&metrics, extra), Some(4.0), "{what}");
        }
    }
}

/// A response without usage settles at the reservation, counted as unread.
#[tokio::test]
async fn a_response_without_usage_is_charged_the_reservation() {
    let api = OrdersApi::start("orders");
    let gw = llm_gateway(&api, "", &token_rule("json:usage.total_tokens"));
    let c = client();
    for i in 0..10 {
        let (status, _) = complete(&c, &gw, "none", i % 2 == 0).await;
        assert_eq!(status, 200, "request {i}: 10 tokens each");
    }
    assert_eq!(complete(&c, &gw, "none", false).await.0, 429);
    let metrics = get_text(&c, gw.admin_url("/metrics")).await;
    let unread = r#"floodgate_cost_unread_total{rule="tokens"}"#;
    assert_eq!(metric_value(&metrics, unread), Some(10.0), "{metrics}");
}

/// The official OpenAI Python client (PyPI `openai`, installed by `make deps`) spends a
/// token budget through the gateway, in JSON and streaming with `include_usage`, and meets
/// the budget's end as a `RateLimitError` (429).
#[tokio::test]
async fn the_openai_python_client_spends_a_token_budget() {
    let api = OrdersApi::start("orders");
    let redis = RedisServer::start();
    let backend = store(&redis.url(), "500ms", "");
    let gw = llm_gateway(&api, &backend, &token_rule("json:usage.total_tokens"));
    let script = r#"
import sys, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0, timeout=10)
messages = [{"role": "user", "content": "one two three four five"}]
for i in range(5):
    try:
        if i % 2 == 0:
            r = client.chat.completions.create(model="demo", messages=messages, max_tokens=25)
            print("ok", r.usage.total_tokens)
        else:
            chunks = client.chat.completions.create(model="demo", messages=messages, max_tokens=25,
                stream=True, stream_options={"include_usage": True})
            usage = [c.usage.total_tokens for c in chunks if c.usage]
            print("ok", usage[-1])
    except openai.RateLimitError as e:
        print("limited", e.status_code)
"#;
    let out = tokio::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(gw.url("/v1"))
        .kill_on_drop(true)
        .output()
        .await
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines, ["ok 30", "ok 30", "ok 30", "ok 30", "limited 429"]);
}

/// In process and in Redis: a reload that keeps the rule while a reservation is in flight
/// keeps it, and the refund of the in-flight request lands in the same counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_during_an_in_flight_reservation_keeps_and_settles_it() {
    let redis = RedisServer::start();
    let backends = [
        String::new(),
        store(&redis.url(), "500ms", "key_prefix = \"reload:\""),
    ];
    for (b, backend) in backends.iter().enumerate() {
        let api = OrdersApi::start("orders");
        // The slow login below must not time out upstream.
        let upstream =
            orders_upstream(&[api.addr]).replace("read_timeout = \"2s\"", "read_timeout = \"10s\"");
        let rules = login_rule("fixed_window", 1, "1m", "");
        let gw = Gateway::start(&format!("{upstream}{backend}{LOGIN_ROUTE}{rules}"));
        let c = client();
        // A slow successful login holds the rule's one unit while it runs.
        let slow = {
            let (c, url) = (c.clone(), gw.url("/login?delay_ms=8000"));
            tokio::spawn(async move {
                let body = serde_json::json!({ "password": "open-sesame" });
                c.post(url)
                    .json(&body)
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
            })
        };
        // Only the slow login is sent until it is admitted: no other can take the unit.
        let allowed = r#"floodgate_ratelimit_decisions_total{result="allowed",rule="login"}"#;
        eventually(
            Duration::from_secs(4),
            "the slow login is admitted",
            || async {
                let metrics = get_text(&c, gw.admin_url("/metrics")).await;
                (metric_value(&metrics, allowed) == Some(1.0)).then_some(())
            },
        )
        .await;
        assert_eq!(
            login(&c, &gw, "open-sesame").await.status(),
            429,
            "backend {b}: the slow login holds the unit"
        );
        let path = gw.dir.path().join("gateway.toml");
        let config = std::fs::read_to_string(&path).unwrap();
        let extra = "\n[[rules]]\nname = \"other\"\nmatch = { path = \"/nowhere\" }\nkey = [\"ip\"]\nalgorithm = \"fixed_window\"\nlimit = 9\nwindow = \"1h\"\n";
        std::fs::write(&path, format!("{config}{extra}")).unwrap();
        let r = c.post(gw.admin_url("/reload")).send().await.unwrap();
        assert_eq!(r.status(), 200, "backend {b}: {}", r.text().await.unwrap());
        assert!(!slow.is_finished(), "backend {b}: reloaded while in flight");
        assert_eq!(
            login(&c, &gw, "open-sesame").await.status(),
            429,
            "backend {b}: the reservation survived the reload"
        );
        assert_eq!(slow.await.unwrap().unwrap(), 200, "backend {b}");
        assert_eq!(
            login(&c, &gw, "guess").await.status(),
            401,
            "backend {b}: the in-flight success was refunded after the reload"
        );
        assert_eq!(login(&c, &gw, "guess").await.status(), 429, "backend {b}");
    }
}

/// An upstream on a free loopback port that reads each request's head and lets `answer`
/// write the answer, given the request line and the connection. Its tasks end with the test's
/// runtime.
async fn scripted_upstream<F, Fut>(answer: F) -> std::net::SocketAddr
where
    F: Fn(String, tokio::net::TcpStream) -> Fut + Copy + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let line = String::from_utf8_lossy(&head)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_owned();
                answer(line, socket).await;
            });
        }
    });
    addr
}

/// An upstream on a free loopback port that answers `POST /hang?usage=N` with an event
/// stream whose first event carries `usage.total_tokens = N` (none when N is absent) and then
/// never ends, and any other request with a JSON body of 10 tokens. Its tasks end with the
/// test's runtime.
async fn hanging_stream_upstream() -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    scripted_upstream(|line, mut socket| async move {
        if line.contains("/hang") {
            let usage = line
                .split("usage=")
                .nth(1)
                .and_then(|v| v.split(' ').next())
                .map(|n| format!("data: {{\"usage\":{{\"total_tokens\":{n}}}}}\n\n"))
                .unwrap_or_else(|| "data: {\"choices\":[]}\n\n".to_owned());
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
            let chunk = format!("{:x}\r\n{usage}\r\n", usage.len());
            let _ = socket.write_all(head.as_bytes()).await;
            let _ = socket.write_all(chunk.as_bytes()).await;
            // Never finishes: waits for the gateway to hang up.
            let _ = socket.read(&mut [0u8; 4096]).await;
        } else {
            let body = "{\"usage\":{\"total_tokens\":10}}";
            let answer = format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}", body.len());
            let _ = socket.write_all(answer.as_bytes()).await;
        }
    })
    .await
}

/// A client that disconnects mid-stream is charged what the stream had reported by then
/// (40 tokens), or the reservation when it had reported nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_mid_stream_is_charged_what_was_read() {
    let upstream = hanging_stream_upstream().await;
    let gw = Gateway::start(&format!(
        "{}{LLM_ROUTE}{}",
        orders_upstream(&[upstream]).replace("read_timeout = \"2s\"", "read_timeout = \"30s\""),
        token_rule("json:usage.total_tokens")
    ));
    let c = client();
    for (query, result) in [("?usage=40", "charged_extra"), ("", "charged")] {
        let mut r = c
            .post(gw.url(&format!("/v1/hang{query}")))
            .json(&serde_json::json!({ "stream": true }))
            .send()
            .await
            .expect("the stream starts");
        assert_eq!(r.status(), 200);
        let first = r.chunk().await.expect("a first event").expect("bytes");
        assert!(first.starts_with(b"data: "), "{first:?}");
        drop(r);
        let series =
            format!(r#"floodgate_response_settled_total{{result="{result}",rule="tokens"}}"#);
        eventually(Duration::from_secs(10), "the stream is settled", || async {
            let metrics = get_text(&c, gw.admin_url("/metrics")).await;
            (metric_value(&metrics, &series) == Some(1.0)).then_some(())
        })
        .await;
    }
    let metrics = get_text(&c, gw.admin_url("/metrics")).await;
    let unread = r#"floodgate_cost_unread_total{rule="tokens"}"#;
    assert_eq!(metric_value(&metrics, unread), Some(1.0));
    // 40 + 10 (the reservation of the stream that reported nothing) spent; this one reserves
    // 10 more of 100.
    let r = c
        .post(gw.url("/v1/chat/completions"))
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap();
    let ratelimit = r.headers()["ratelimit"].to_str().unwrap().to_owned();
    assert!(ratelimit.contains("r=40"), "{ratelimit}");
}

/// On a real 3-master Redis Cluster, per key in its own slot: successes refunded, the
/// (L+1)th failure refused and blocked, the block key beside the counter (same hash tag),
/// and a token budget trued up through an event stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_block_and_cost_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let backend = cluster.store("500ms", "");
    let api = OrdersApi::start("orders");
    let rules = format!(
        "{}{}",
        login_rule("sliding_window_counter", 2, "1m", "block_for = \"1m\""),
        token_rule("json:usage.total_tokens")
    );
    let gw = Gateway::start(&format!(
        "{}{backend}{LOGIN_ROUTE}{LLM_ROUTE}{rules}",
        orders_upstream(&[api.addr])
    ));
    let c = client();
    for _ in 0..5 {
        assert_eq!(login(&c, &gw, "open-sesame").await.status(), 200);
    }
    for _ in 0..2 {
        assert_eq!(login(&c, &gw, "guess").await.status(), 401);
    }
    let r = login(&c, &gw, "guess").await;
    assert_eq!(r.status(), 429);
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // The block, or the counter's own wait when that is longer (two windows at most).
    assert!(
        (60..=120).contains(&retry),
        "the block announces itself: {retry}"
    );
    let r = login(&c, &gw, "open-sesame").await;
    assert_eq!(r.status(), 429, "blocked whatever it sends");
    assert_eq!(upstream_failures(&c, &api).await, 2);
    assert_eq!(complete(&c, &gw, "body", true).await.0, 200);
    settled(&c, &gw, 1).await;
    let (_, ratelimit) = complete(&c, &gw, "body", false).await;
    assert!(
        ratelimit.contains("r=60"),
        "30 charged, 10 reserved: {ratelimit}"
    );
}

/// In process and in Redis, a `sliding_window_log` token budget (100 a 3 s window, 10
/// reserved): an extra charge is owed on top of the log until the reservation's window ends,
/// a hostile answer of 10,005 tokens is one debt rather than an entry per token (in Redis: the
/// sorted set keeps the reserved units only, the debt is a key `<counter key>:d`), and the
/// budget is whole again once the debt's window has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliding_log_owes_extra_charges_until_their_window_ends() {
    let redis = RedisServer::start();
    let c = client();
    let rule = token_rule("json:usage.total_tokens")
        .replace("fixed_window", "sliding_window_log")
        .replace("\"1h\"", "\"3s\"");
    for b in 0..2 {
        let backend = match b {
            0 => String::new(),
            _ => store(&redis.url(), "500ms", "key_prefix = \"log:\""),
        };
        let api = OrdersApi::start("orders");
        let gw = llm_gateway(&api, &backend, &rule);
        let what = format!("backend {b}");
        let (status, first) = complete(&c, &gw, "body", false).await;
        assert_eq!(status, 200, "{what}");
        assert!(first.contains("r=90"), "{what}: reserved 10: {first}");
        settled(&c, &gw, 1).await;
        let (_, second) = complete(&c, &gw, "body", true).await;
        assert!(
            second.contains("r=60"),
            "{what}: 10 reserved + 20 owed, then 10 reserved: {second}"
        );
        settled(&c, &gw, 2).await;
        let (status, _) = complete_with(&c, &gw, "body", false, 10_000).await;
        assert_eq!(status, 200, "{what}: 60 left, 10 reserved");
        settled(&c, &gw, 3).await;
        let (status, _) = complete(&c, &gw, "body", false).await;
        assert_eq!(status, 429, "{what}: 10,005 tokens spent of 100");
        if b == 1 {
            let keys: Vec<String> = redis.query(&["KEYS", "log:*"]);
            let log = keys.iter().find(|k| k.ends_with('}')).expect("the log");
            let entries: u64 = redis.query(&["ZCARD", log]);
            assert!(
                entries <= 30,
                "{what}: one entry per reserved unit: {entries}"
            );
            let debt: i64 = redis.query(&["PTTL", &format!("{log}:d")]);
            assert!(debt > 0, "{what}: the debt beside the log: {keys:?}");
        }
        eventually(Duration::from_secs(10), "the debt ended", || async {
            (complete(&c, &gw, "none", false).await.0 == 200).then_some(())
        })
        .await;
    }
}

/// 32 clients logging in successfully at once through a global `count` rule on one Redis:
/// none is limited, every refund lands (the failures that follow are counted from 0: exactly
/// L reach the upstream), and the refunds of concurrent requests share their `EVALSHA`
/// calls: with one decide call per request, fewer than 2 calls per request (one true-up call
/// per refund before they were coalesced).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_refunds_share_their_redis_calls() {
    let redis = RedisServer::start();
    let api = OrdersApi::start("orders");
    let backend = store(&redis.url(), "2s", "");
    let gw = gateway(&api, &backend, &login_rule("fixed_window", 40, "1m", ""));
    let c = client();
    assert_eq!(login(&c, &gw, "open-sesame").await.status(), 200);
    let before = redis.command_calls("evalsha");
    let (clients, each) = (32u64, 10u64);
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (c, url) = (c.clone(), gw.url("/login"));
            tokio::spawn(async move {
                let mut ok = 0u64;
                for _ in 0..each {
                    let r = c
                        .post(&url)
                        .json(&serde_json::json!({ "user": "ann", "password": "open-sesame" }))
                        .send()
                        .await;
                    ok += u64::from(r.is_ok_and(|r| r.status() == 200));
                }
                ok
            })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        ok += t.await.expect("client task");
    }
    let requests = clients * each;
    assert_eq!(ok, requests, "successful logins are never limited");
    let calls = redis.command_calls("evalsha") - before;
    eprintln!("{calls} EVALSHA for {requests} requests");
    assert!(
        calls < 2 * requests,
        "{calls} EVALSHA for {requests} requests: the refunds were not coalesced"
    );
    for i in 0..40 {
        assert_eq!(login(&c, &gw, "guess").await.status(), 401, "failure {i}");
    }
    assert_eq!(login(&c, &gw, "guess").await.status(), 429);
    assert_eq!(upstream_failures(&c, &api).await, 40);
}

/// Two instances on one Redis with a leased failures-only rule (`lease = 3`, 500 ms leases):
/// successful logins are refunded into the lease they were spent from, so they are never
/// limited and cost Redis less than a call each; failures stay exact over both instances:
/// L reach the upstream, and no more once the leases in hand have been given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_count_rule_refunds_into_its_lease_and_stays_exact() {
    let redis = RedisServer::start();
    let api = OrdersApi::start("orders");
    let backend = store(&redis.url(), "2s", "instances = 2");
    let rules = login_rule("token_bucket", 6, "1h", "lease = 3\nlease_ttl = \"500ms\"");
    let gws = [
        gateway(&api, &backend, &rules),
        gateway(&api, &backend, &rules),
    ];
    let c = client();
    assert_eq!(login(&c, &gws[0], "open-sesame").await.status(), 200);
    let before = redis.command_calls("evalsha");
    for i in 0..20 {
        let r = login(&c, &gws[0], "open-sesame").await;
        assert_eq!(r.status(), 200, "successful login {i}");
    }
    let calls = redis.command_calls("evalsha") - before;
    eprintln!("{calls} EVALSHA for 20 refunded logins");
    assert!(calls < 20, "{calls} EVALSHA for 20 refunded logins");
    // Permits one instance holds are briefly unavailable to the other: keep trying both.
    let failed = std::sync::atomic::AtomicU64::new(0);
    eventually(
        Duration::from_secs(10),
        "6 failures reached the upstream",
        || async {
            for gw in &gws {
                if login(&c, gw, "guess").await.status() == 401 {
                    failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
            (failed.load(std::sync::atomic::Ordering::Relaxed) >= 6).then_some(())
        },
    )
    .await;
    // Long enough for every lease in hand to end and be given back.
    tokio::time::sleep(Duration::from_millis(800)).await;
    for gw in &gws {
        assert_eq!(login(&c, gw, "guess").await.status(), 429);
        assert_eq!(login(&c, gw, "open-sesame").await.status(), 429);
    }
    assert_eq!(upstream_failures(&c, &api).await, 6);
}

/// An upstream on a free loopback port that reports a fixed cost: `/v1/h/A[/B...]` in one
/// `x-usage-total-tokens` header per value, `/v1/j/N` as `usage.total_tokens` in a JSON body
/// (N written as is, so any JSON number). Its tasks end with the test's runtime.
async fn fixed_cost_upstream() -> std::net::SocketAddr {
    use tokio::io::AsyncWriteExt;
    scripted_upstream(|line, mut socket| async move {
        let path = line.split(' ').nth(1).unwrap_or("/").to_owned();
        let (headers, body) = if let Some(values) = path.strip_prefix("/v1/h/") {
            let headers: String = values
                .split('/')
                .map(|v| format!("x-usage-total-tokens: {v}\r\n"))
                .collect();
            (headers, "{}".to_owned())
        } else {
            let n = path.strip_prefix("/v1/j/").unwrap_or("0");
            (
                String::new(),
                format!("{{\"usage\":{{\"total_tokens\":{n}}}}}"),
            )
        };
        let answer = format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
        let _ = socket.write_all(answer.as_bytes()).await;
    })
    .await
}

/// Costs as upstreams write them, through the binary: `2.1` is 3 (refunded from the
/// reservation of 10), a repeated header is unreadable (charged the reservation, counted),
/// `3e3` and `3000.0` and a number past 2^64 are charged (capped at 10^15), and the budget of
/// 100 is then spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn costs_are_read_as_numbers_capped_and_rounded_up() {
    let upstream = fixed_cost_upstream().await;
    let c = client();
    let settled_as = |gw: &Gateway, result: &str, want: f64| {
        let series =
            format!(r#"floodgate_response_settled_total{{result="{result}",rule="tokens"}}"#);
        let url = gw.admin_url("/metrics");
        let c = c.clone();
        async move {
            eventually(
                Duration::from_secs(10),
                &format!("{series} = {want}"),
                || async {
                    let metrics = get_text(&c, url.clone()).await;
                    (metric_value(&metrics, &series) == Some(want)).then_some(())
                },
            )
            .await;
        }
    };
    let post = |gw: &Gateway, path: &str| {
        let url = gw.url(path);
        let c = c.clone();
        async move {
            let r = c
                .post(url)
                .json(&serde_json::json!({}))
                .send()
                .await
                .expect("answered");
            let status = r.status().as_u16();
            let _ = r.text().await;
            status
        }
    };

    let header_gw = Gateway::start(&format!(
        "{}{LLM_ROUTE}{}",
        orders_upstream(&[upstream]),
        token_rule("header:x-usage-total-tokens")
    ));
    assert_eq!(post(&header_gw, "/v1/h/2.1").await, 200);
    settled_as(&header_gw, "refunded", 1.0).await;
    assert_eq!(post(&header_gw, "/v1/h/5/7").await, 200);
    settled_as(&header_gw, "charged", 1.0).await;
    let metrics = get_text(&c, header_gw.admin_url("/metrics")).await;
    let unread = r#"floodgate_cost_unread_total{rule="tokens"}"#;
    assert_eq!(
        metric_value(&metrics, unread),
        Some(1.0),
        "the repeated header"
    );
    assert_eq!(post(&header_gw, "/v1/h/3e3").await, 200);
    settled_as(&header_gw, "charged_extra", 1.0).await;
    assert_eq!(
        post(&header_gw, "/v1/h/1").await,
        429,
        "3 + 10 + 3000 of 100 spent"
    );
    drop(header_gw);

    for cost in ["3000.0", "99999999999999999999"] {
        let gw = Gateway::start(&format!(
            "{}{LLM_ROUTE}{}",
            orders_upstream(&[upstream]),
            token_rule("json:usage.total_tokens")
        ));
        assert_eq!(post(&gw, &format!("/v1/j/{cost}")).await, 200, "{cost}");
        settled_as(&gw, "charged_extra", 1.0).await;
        assert_eq!(post(&gw, "/v1/j/1").await, 429, "{cost} of 100 spent");
    }
}
