//! floodgate as Envoy's rate-limit service, end to end: the real binary, a gRPC client built
//! from Envoy's own protos (`envoy-types` on tonic), real `redis-server`s for the global
//! limits, and (in `envoy_in_front_of_orders_api`) a real Envoy.

mod common;

use std::time::Duration;

use common::redis::{RedisCluster, RedisServer};
use common::rls::{ask, descriptor, header, request, RlsGateway};
use common::{client, eventually, get_json, get_text, metric_value};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{rate_limit::Unit, Code};
use envoy_types::pb::google::protobuf::UInt64Value;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// `[[rls.limits]]` named `name` of domain `edge` on `descriptor` (TOML), then `rest`.
fn limit(name: &str, descriptor: &str, rest: &str) -> String {
    format!("[[rls.limits]]\nname = \"{name}\"\ndomain = \"edge\"\ndescriptor = {descriptor}\n{rest}\n\n")
}

const PER_USER: &str = "[{ key = \"route\", value = \"orders\" }, { key = \"user\" }]";

#[tokio::test]
async fn every_field_of_the_answer_and_the_headers_envoy_passes_on() {
    let gw = RlsGateway::start(&limit(
        "orders-per-user",
        PER_USER,
        "algorithm = \"fixed_window\"\nlimit = 3\nwindow = \"1m\"\nscope = \"local\"",
    ));
    // The answer shows a minute window: start early in one, so that the counts hold.
    common::early_in_window(Duration::from_secs(60), Duration::from_secs(20)).await;
    let mut c = gw.client().await;
    let alice = || descriptor(&[("route", "orders"), ("user", "alice")]);
    let nobody = || descriptor(&[("route", "users"), ("user", "alice")]);
    for left in [2u32, 1, 0] {
        let r = ask(&mut c, request("edge", vec![alice(), nobody()])).await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses.len(), 2, "one status per descriptor, in order");
        let s = &r.statuses[0];
        assert_eq!(s.code, OK);
        let cl = s.current_limit.as_ref().expect("current_limit");
        assert_eq!(cl.name, "orders-per-user");
        assert_eq!(cl.requests_per_unit, 3);
        assert_eq!(cl.unit, Unit::Minute as i32);
        assert_eq!(s.limit_remaining, left);
        let until = s.duration_until_reset.expect("duration_until_reset");
        assert!(until.seconds <= 60 && (until.seconds > 0 || until.nanos > 0));
        // The unmatched descriptor: OK, and no limit named.
        assert_eq!(r.statuses[1].code, OK);
        assert!(r.statuses[1].current_limit.is_none());
        assert_eq!(
            header(&r, "RateLimit-Policy"),
            Some("\"orders-per-user\";q=3;w=60")
        );
        let state = header(&r, "RateLimit").expect("RateLimit");
        assert!(
            state.starts_with(&format!("\"orders-per-user\";r={left};t=")),
            "{state}"
        );
        assert_eq!(header(&r, "Retry-After"), None);
    }
    let r = ask(&mut c, request("edge", vec![alice()])).await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(r.statuses[0].code, OVER);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    let retry: u64 = header(&r, "Retry-After")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    let until = r.statuses[0].duration_until_reset.unwrap();
    assert!(until.seconds <= 60);
    // Another user has a counter of its own.
    let bob = descriptor(&[("route", "orders"), ("user", "bob")]);
    let r = ask(&mut c, request("edge", vec![bob])).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 2));

    // Per limit, on the rules' series; unmatched descriptors per domain.
    let text = get_text(&client(), gw.admin_url("/metrics")).await;
    let series = |s: &str| metric_value(&text, s);
    assert_eq!(
        series("floodgate_ratelimit_decisions_total{result=\"allowed\",rule=\"orders-per-user\"}"),
        Some(4.0)
    );
    assert_eq!(
        series("floodgate_ratelimit_decisions_total{result=\"rejected\",rule=\"orders-per-user\"}"),
        Some(1.0)
    );
    assert_eq!(
        series("floodgate_rls_unmatched_descriptors_total{domain=\"edge\"}"),
        Some(3.0)
    );
    assert_eq!(
        series("floodgate_rls_requests_total{result=\"over_limit\"}"),
        Some(1.0)
    );
    assert_eq!(
        series("floodgate_rls_requests_total{result=\"ok\"}"),
        Some(4.0)
    );
}

#[tokio::test]
async fn nested_descriptors_fixed_values_and_the_more_specific_limit() {
    let gw = RlsGateway::start(&format!(
        "{}{}{}",
        limit(
            "per-user",
            PER_USER,
            "algorithm = \"token_bucket\"\nlimit = 5\nwindow = \"1m\"\nscope = \"local\""
        ),
        limit(
            "ci-user",
            "[{ key = \"route\", value = \"orders\" }, { key = \"user\", value = \"ci\" }]",
            "algorithm = \"sliding_window_counter\"\nlimit = 1\nwindow = \"1h\"\nscope = \"local\""
        ),
        limit(
            "per-route",
            "[{ key = \"route\" }]",
            "algorithm = \"fixed_window\"\nlimit = 100\nwindow = \"1s\"\nscope = \"local\""
        ),
    ));
    let mut c = gw.client().await;
    // Envoy's nested descriptors arrive as one descriptor per level.
    let r = ask(
        &mut c,
        request(
            "edge",
            vec![
                descriptor(&[("route", "orders")]),
                descriptor(&[("route", "orders"), ("user", "ci")]),
                descriptor(&[("route", "orders"), ("user", "dev")]),
            ],
        ),
    )
    .await;
    let names: Vec<&str> = r
        .statuses
        .iter()
        .map(|s| s.current_limit.as_ref().unwrap().name.as_str())
        .collect();
    assert_eq!(names, ["per-route", "ci-user", "per-user"]);
    assert_eq!(
        r.statuses[0].current_limit.as_ref().unwrap().unit,
        Unit::Second as i32
    );
    assert_eq!(
        r.statuses[1].current_limit.as_ref().unwrap().unit,
        Unit::Hour as i32
    );
    let ci = || {
        request(
            "edge",
            vec![descriptor(&[("route", "orders"), ("user", "ci")])],
        )
    };
    assert_eq!(ask(&mut c, ci()).await.overall_code, OVER);
    // A value the limit names must be equal: "Ci" is a user like any other.
    let other = request(
        "edge",
        vec![descriptor(&[("route", "orders"), ("user", "Ci")])],
    );
    let r = ask(&mut c, other).await;
    assert_eq!(
        r.statuses[0].current_limit.as_ref().unwrap().name,
        "per-user"
    );
    assert_eq!(r.overall_code, OK);
}

#[tokio::test]
async fn hits_addend_at_both_levels_and_the_limit_override() {
    let gw = RlsGateway::start(&limit(
        "per-user",
        "[{ key = \"user\" }]",
        "algorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1h\"\nscope = \"local\"",
    ));
    let mut c = gw.client().await;
    let user = |u: &str| descriptor(&[("user", u)]);
    // Request level: 4 for every descriptor.
    let mut req = request("edge", vec![user("a")]);
    req.hits_addend = 4;
    assert_eq!(ask(&mut c, req).await.statuses[0].limit_remaining, 6);
    // Descriptor level overrides the request's.
    let mut d = user("a");
    d.hits_addend = Some(UInt64Value { value: 5 });
    let mut req = request("edge", vec![d]);
    req.hits_addend = 4;
    assert_eq!(ask(&mut c, req).await.statuses[0].limit_remaining, 1);
    // More than is left: over, and nothing charged.
    let mut d = user("a");
    d.hits_addend = Some(UInt64Value { value: 2 });
    let r = ask(&mut c, request("edge", vec![d])).await;
    assert_eq!(r.overall_code, OVER);
    let r = ask(&mut c, request("edge", vec![user("a")])).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 0));

    // The per-descriptor override: its own numbers and its own counter.
    let over = || {
        let mut d = user("b");
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 2,
            unit: Unit::Second as i32,
        });
        d
    };
    let r = ask(&mut c, request("edge", vec![over()])).await;
    let cl = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((cl.requests_per_unit, cl.unit), (2, Unit::Second as i32));
    assert_eq!(r.statuses[0].limit_remaining, 1);
    assert_eq!(header(&r, "RateLimit-Policy"), Some("\"per-user\";q=2;w=1"));
    assert_eq!(
        ask(&mut c, request("edge", vec![over()]))
            .await
            .overall_code,
        OK
    );
    assert_eq!(
        ask(&mut c, request("edge", vec![over()]))
            .await
            .overall_code,
        OVER
    );
    // The limit's own counter of "b" was never touched.
    let r = ask(&mut c, request("edge", vec![user("b")])).await;
    assert_eq!(r.statuses[0].limit_remaining, 9);
}

#[tokio::test]
async fn an_unknown_domain_is_ok_and_counted_as_other() {
    let gw = RlsGateway::start(&limit(
        "per-user",
        "[{ key = \"user\" }]",
        "algorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1h\"\nscope = \"local\"",
    ));
    let mut c = gw.client().await;
    for _ in 0..3 {
        let r = ask(
            &mut c,
            request("elsewhere", vec![descriptor(&[("user", "a")])]),
        )
        .await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses[0].code, OK);
        assert!(r.statuses[0].current_limit.is_none());
        assert!(r.response_headers_to_add.is_empty());
    }
    let text = get_text(&client(), gw.admin_url("/metrics")).await;
    assert_eq!(
        metric_value(
            &text,
            "floodgate_rls_unmatched_descriptors_total{domain=\"other\"}"
        ),
        Some(3.0)
    );
    assert!(
        !text.contains("domain=\"elsewhere\""),
        "a client's domain became a label"
    );
}

#[tokio::test]
async fn a_request_over_one_limit_charges_none() {
    let gw = RlsGateway::start(&format!(
        "{}{}",
        limit(
            "roomy",
            "[{ key = \"user\" }]",
            "algorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1h\"\nscope = \"local\""
        ),
        limit(
            "tight",
            "[{ key = \"ip\" }]",
            "algorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1h\"\nscope = \"local\""
        ),
    ));
    let mut c = gw.client().await;
    let both = || {
        request(
            "edge",
            vec![
                descriptor(&[("user", "a")]),
                descriptor(&[("ip", "10.0.0.1")]),
            ],
        )
    };
    let r = ask(&mut c, both()).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].limit_remaining, 9);
    for _ in 0..5 {
        let r = ask(&mut c, both()).await;
        assert_eq!(r.overall_code, OVER);
        assert_eq!((r.statuses[0].code, r.statuses[1].code), (OK, OVER));
        // Not charged: what it had before this request.
        assert_eq!(r.statuses[0].limit_remaining, 9);
    }
    let r = ask(&mut c, request("edge", vec![descriptor(&[("user", "a")])])).await;
    assert_eq!(
        r.statuses[0].limit_remaining, 8,
        "the rejected requests charged roomy"
    );
}

#[tokio::test]
async fn malformed_requests_get_a_clear_grpc_error_and_charge_nothing() {
    let gw = RlsGateway::start(&limit(
        "per-user",
        "[{ key = \"user\" }]",
        "algorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1h\"\nscope = \"local\"",
    ));
    let mut c = gw.client().await;
    let a = || descriptor(&[("user", "a")]);
    let mut empty_key = a();
    empty_key
        .entries
        .push(descriptor(&[("", "x")]).entries.remove(0));
    let cases = vec![
        (
            "empty domain",
            request("", vec![a()]),
            tonic::Code::InvalidArgument,
            "domain must not be empty",
        ),
        (
            "empty key",
            request("edge", vec![a(), empty_key]),
            tonic::Code::InvalidArgument,
            "empty key",
        ),
        (
            "no descriptors",
            request("edge", vec![]),
            tonic::Code::InvalidArgument,
            "no descriptors",
        ),
        (
            "100 descriptors",
            request("edge", (0..100).map(|_| a()).collect()),
            tonic::Code::InvalidArgument,
            "at most 64",
        ),
        (
            "10,000 descriptors",
            request("edge", (0..10_000).map(|_| a()).collect()),
            tonic::Code::OutOfRange,
            "",
        ),
        (
            "a 1 MB value",
            request(
                "edge",
                vec![a(), descriptor(&[("user", &"v".repeat(1 << 20))])],
            ),
            tonic::Code::OutOfRange,
            "",
        ),
    ];
    for (what, req, code, says) in cases {
        let e = c.should_rate_limit(req).await.expect_err(what);
        // The decoder's limit: RESOURCE_EXHAUSTED or OUT_OF_RANGE depending on where tonic
        // catches it; both say the message is too large.
        if code == tonic::Code::OutOfRange {
            assert!(
                matches!(
                    e.code(),
                    tonic::Code::OutOfRange | tonic::Code::ResourceExhausted
                ),
                "{what}: {e:?}"
            );
            assert!(e.message().contains("too large"), "{what}: {}", e.message());
        } else {
            assert_eq!(e.code(), code, "{what}: {e:?}");
            assert!(e.message().contains(says), "{what}: {}", e.message());
        }
    }
    let r = ask(&mut c, request("edge", vec![a()])).await;
    assert_eq!(
        r.statuses[0].limit_remaining, 4,
        "a refused request charged something"
    );
    // The connection survived all of it.
    assert_eq!(
        ask(&mut c, request("edge", vec![a()])).await.overall_code,
        OK
    );
}

#[tokio::test]
async fn a_reload_swaps_the_limits() {
    let first = limit(
        "per-user",
        "[{ key = \"user\" }]",
        "algorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1h\"\nscope = \"local\"",
    );
    let gw = RlsGateway::start(&first);
    let mut c = gw.client().await;
    let a = || request("edge", vec![descriptor(&[("user", "a")])]);
    assert_eq!(ask(&mut c, a()).await.overall_code, OK);
    assert_eq!(ask(&mut c, a()).await.overall_code, OVER);
    let text = std::fs::read_to_string(gw.config_path()).unwrap();
    let next = text.replace(
        &first,
        &(limit(
            "per-user",
            "[{ key = \"user\" }]",
            "algorithm = \"fixed_window\"\nlimit = 50\nwindow = \"1h\"\nscope = \"local\"",
        ) + &limit(
            "per-team",
            "[{ key = \"team\" }]",
            "algorithm = \"fixed_window\"\nlimit = 7\nwindow = \"1h\"\nscope = \"local\"",
        )),
    );
    std::fs::write(gw.config_path(), next).unwrap();
    let http = reqwest::Client::new();
    let st = http
        .post(gw.admin_url("/reload"))
        .send()
        .await
        .unwrap()
        .status();
    assert!(st.is_success(), "{st}");
    let r = ask(&mut c, a()).await;
    assert_eq!(r.overall_code, OK, "the new limit (50) is in force");
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        50
    );
    let r = ask(&mut c, request("edge", vec![descriptor(&[("team", "x")])])).await;
    assert_eq!(
        r.statuses[0].current_limit.as_ref().unwrap().name,
        "per-team"
    );
    // An invalid file changes nothing.
    std::fs::write(gw.config_path(), text.replace("limit = 1\n", "limit = 0\n")).unwrap();
    let st = http
        .post(gw.admin_url("/reload"))
        .send()
        .await
        .unwrap()
        .status();
    assert!(!st.is_success());
    let r = ask(&mut c, request("edge", vec![descriptor(&[("team", "x")])])).await;
    assert_eq!(
        r.statuses[0].limit_remaining, 5,
        "the config in force stayed"
    );
}

/// Sends `n` single-descriptor requests round robin over `clients`, `n / clients` at a time
/// on each, and counts the answers: (ok, over).
async fn spread(clients: &[common::rls::Client], n: usize, d: &[(&str, &str)]) -> (usize, usize) {
    let mut tasks = Vec::new();
    for i in 0..n {
        let mut c = clients[i % clients.len()].clone();
        let req = request("edge", vec![descriptor(d)]);
        tasks.push(tokio::spawn(
            async move { ask(&mut c, req).await.overall_code },
        ));
    }
    let (mut ok, mut over) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            OK => ok += 1,
            OVER => over += 1,
            other => panic!("code {other}"),
        }
    }
    (ok, over)
}

/// `n` instances of one config, each with a client of its own.
async fn fleet(body: &str, n: usize) -> (Vec<RlsGateway>, Vec<common::rls::Client>) {
    let gws: Vec<RlsGateway> = (0..n).map(|_| RlsGateway::start(body)).collect();
    let mut clients = Vec::new();
    for g in &gws {
        clients.push(g.client().await);
    }
    (gws, clients)
}

fn redis_store(url: &str, timeout: &str) -> String {
    format!(
        "[store]\nbackend = \"redis\"\nurl = \"{url}\"\ntimeout = \"{timeout}\"\ninstances = 3\n\n"
    )
}

#[tokio::test]
async fn three_instances_on_one_redis_admit_exactly_the_limit() {
    let redis = RedisServer::start();
    let body = format!(
        "{}{}{}",
        redis_store(&redis.url(), "2s"),
        limit(
            "global",
            "[{ key = \"user\" }]",
            "algorithm = \"sliding_window_log\"\nlimit = 25\nwindow = \"1m\""
        ),
        limit(
            "leased",
            "[{ key = \"team\" }]",
            "algorithm = \"token_bucket\"\nlimit = 30\nwindow = \"1h\"\nlease = 4"
        ),
    );
    let (_gws, clients) = fleet(&body, 3).await;
    assert_eq!(spread(&clients, 90, &[("user", "a")]).await, (25, 65));
    // Leased (permits charged to the shared counter when leased, spent in process): never
    // over. Permits another instance holds, or that a lease ending gives back a moment after
    // the burst, may go unspent in it (README, "Quota leasing": what it costs).
    let (ok, over) = spread(&clients, 90, &[("team", "t")]).await;
    assert_eq!(ok + over, 90);
    assert!((27..=30).contains(&ok), "{ok} of 30 admitted");
}

#[tokio::test]
async fn a_redis_cluster_admits_exactly_the_limit() {
    let cluster = RedisCluster::start();
    let body = format!(
        "{}{}",
        cluster.store("2s", ""),
        limit(
            "global",
            "[{ key = \"user\" }]",
            "algorithm = \"fixed_window\"\nlimit = 20\nwindow = \"1h\""
        ),
    );
    let (_gws, clients) = fleet(&body, 2).await;
    for user in ["a", "b", "c"] {
        assert_eq!(
            spread(&clients, 40, &[("user", user)]).await,
            (20, 20),
            "{user}"
        );
    }
}

#[tokio::test]
async fn a_failing_store_follows_each_limits_on_store_error() {
    // A port nothing listens on: every store call fails at once.
    let dead = common::free_addr();
    let body = format!(
        "{}{}{}{}",
        redis_store(&format!("redis://{dead}"), "100ms"),
        limit(
            "open",
            "[{ key = \"o\" }]",
            "algorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1h\"\non_store_error = \"open\""
        ),
        limit(
            "closed",
            "[{ key = \"c\" }]",
            "algorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1h\"\non_store_error = \"closed\""
        ),
        limit(
            "local",
            "[{ key = \"l\" }]",
            "algorithm = \"fixed_window\"\nlimit = 6\nwindow = \"1h\"\non_store_error = \"local\""
        ),
    );
    let gw = RlsGateway::start(&body);
    let mut c = gw.client().await;
    let one = |k: &str| request("edge", vec![descriptor(&[(k, "x")])]);
    for _ in 0..3 {
        assert_eq!(ask(&mut c, one("o")).await.overall_code, OK, "open admits");
    }
    let e = c
        .should_rate_limit(one("c"))
        .await
        .expect_err("closed refuses");
    assert_eq!(e.code(), tonic::Code::Unavailable);
    assert!(e.message().contains("closed"), "{}", e.message());
    // local: limit / instances (6 / 3) in process.
    let mut codes = Vec::new();
    for _ in 0..4 {
        codes.push(ask(&mut c, one("l")).await.overall_code);
    }
    assert_eq!(codes, [OK, OK, OVER, OVER]);
    let text = get_text(&client(), gw.admin_url("/metrics")).await;
    assert_eq!(
        metric_value(
            &text,
            "floodgate_failure_mode_decisions_total{mode=\"closed\",rule=\"closed\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric_value(
            &text,
            "floodgate_rls_requests_total{result=\"unavailable\"}"
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn a_stopped_redis_is_store_trouble_until_it_answers_again() {
    let mut redis = RedisServer::start();
    let body = format!(
        "{}{}",
        redis_store(&redis.url(), "200ms"),
        limit(
            "closed",
            "[{ key = \"c\" }]",
            "algorithm = \"fixed_window\"\nlimit = 3\nwindow = \"1h\"\non_store_error = \"closed\""
        ),
    );
    let gw = RlsGateway::start(&body);
    let mut c = gw.client().await;
    let one = || request("edge", vec![descriptor(&[("c", "x")])]);
    assert_eq!(ask(&mut c, one()).await.overall_code, OK);
    redis.stop();
    let e = c
        .should_rate_limit(one())
        .await
        .expect_err("closed, store down");
    assert_eq!(e.code(), tonic::Code::Unavailable);
    redis.restart();
    // The count is Redis's (it was not persisted: a fresh server counts from zero).
    eventually(Duration::from_secs(20), "the store answers again", || {
        let mut c = c.clone();
        async move {
            c.should_rate_limit(one())
                .await
                .ok()
                .map(|r| r.into_inner())
        }
    })
    .await;
}

#[tokio::test]
async fn an_rls_only_config_runs_without_a_proxy_and_stops_on_sigint() {
    let mut gw = RlsGateway::start(&limit(
        "per-user",
        "[{ key = \"user\" }]",
        "algorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1h\"\nscope = \"local\"",
    ));
    let mut c = gw.client().await;
    assert_eq!(
        ask(&mut c, request("edge", vec![descriptor(&[("user", "a")])]))
            .await
            .overall_code,
        OK
    );
    // No proxy listener was opened: the default 0.0.0.0:8080 is not taken for it.
    assert!(!gw.logs().contains("0.0.0.0:8080"), "{}", gw.logs());
    let st = reqwest::get(gw.admin_url("/healthz"))
        .await
        .unwrap()
        .status();
    assert!(st.is_success());
    common::send_signal(gw.pid(), "INT");
    assert!(
        gw.wait_exit(Duration::from_secs(10)).is_some(),
        "still running after SIGINT"
    );
    assert!(
        std::net::TcpStream::connect(gw.rls).is_err(),
        "the rls listener outlived the process"
    );
}

#[test]
fn check_accepts_an_rls_only_config_and_names_a_bad_limit() {
    let ok = "[rls]\nlisten = \"127.0.0.1:18081\"\n\n".to_string()
        + &limit(
            "per-user",
            PER_USER,
            "algorithm = \"token_bucket\"\nlimit = 100\nwindow = \"1m\"",
        );
    let (passed, _, err) = common::check(&ok, &[]);
    assert!(passed, "{err}");
    let bad = ok.replace("window = \"1m\"", "window = \"0s\"");
    let (passed, _, err) = common::check(&bad, &[]);
    assert!(!passed);
    assert!(
        err.contains("gateway.toml:10:10: rls limit \"per-user\": window must be at least 1ms"),
        "{err}"
    );
}

/// examples/rls.toml and examples/rls-envoy.yaml (the README's pair), ports moved to free ones.
fn shipped_pair(
    rls: std::net::SocketAddr,
    admin: std::net::SocketAddr,
    envoy: std::net::SocketAddr,
    envoy_admin: std::net::SocketAddr,
    api: std::net::SocketAddr,
) -> (String, String) {
    let read = |f: &str| {
        std::fs::read_to_string(format!("{}/examples/{f}", env!("CARGO_MANIFEST_DIR"))).unwrap()
    };
    let toml = read("rls.toml")
        .replace("\"127.0.0.1:8081\"", &format!("\"{rls}\""))
        .replace("\"127.0.0.1:9901\"", &format!("\"{admin}\""));
    let yaml = read("rls-envoy.yaml");
    let port = |from: u16, to: u16| (format!("port_value: {from} "), format!("port_value: {to} "));
    let mut moved = yaml.clone();
    for (from, to) in [
        port(10000, envoy.port()),
        port(9000, api.port()),
        port(8081, rls.port()),
        port(9902, envoy_admin.port()),
    ] {
        assert!(
            moved.contains(&from),
            "examples/rls-envoy.yaml has no {from}"
        );
        moved = moved.replace(&from, &to);
    }
    (toml, moved)
}

#[tokio::test]
async fn envoy_in_front_of_orders_api_asks_floodgate() {
    let api = common::OrdersApi::start("orders");
    let (rls, admin, envoy_addr, envoy_admin) = (
        common::free_addr(),
        common::free_addr(),
        common::free_addr(),
        common::free_addr(),
    );
    let (toml, yaml) = shipped_pair(rls, admin, envoy_addr, envoy_admin, api.addr);
    let gw = RlsGateway::start_config(&toml, rls, admin);
    let envoy = common::rls::Envoy::start(&yaml, envoy_addr);
    let c = reqwest::Client::new();
    let get = |user: &str| {
        c.get(format!("http://{envoy_addr}/orders"))
            .header("x-user", user)
            .send()
    };
    // The limit is 5 per user (token bucket, burst 5).
    for i in 0..5 {
        let r = get("alice").await.unwrap();
        assert_eq!(r.status(), 200, "request {i}: {}", envoy.logs());
        let policy = r
            .headers()
            .get("ratelimit-policy")
            .map(|v| v.to_str().unwrap().to_string());
        let policy =
            policy.expect("Envoy passes floodgate's RateLimit-Policy on an allowed answer");
        assert!(policy.contains("\"orders-per-user\";q=5;w=60"), "{policy}");
        assert!(
            policy.contains("\"per-client-address\";q=1000;w=60"),
            "{policy}"
        );
        let state = r.headers()["ratelimit"].to_str().unwrap().to_string();
        assert!(
            state.contains(&format!("\"orders-per-user\";r={};", 4 - i)),
            "{state}"
        );
    }
    let r = get("alice").await.unwrap();
    assert_eq!(r.status(), 429, "the 6th request is Envoy's 429");
    let h = r.headers();
    assert_eq!(
        h.get("x-envoy-ratelimited").map(|v| v.to_str().unwrap()),
        Some("true")
    );
    assert!(h["ratelimit-policy"]
        .to_str()
        .unwrap()
        .contains("\"orders-per-user\";q=5;w=60"));
    assert!(h["ratelimit"]
        .to_str()
        .unwrap()
        .contains("\"orders-per-user\";r=0;t="));
    let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    // Another user, and a request without x-user (only the address descriptor): admitted.
    assert_eq!(get("bob").await.unwrap().status(), 200);
    let r = c
        .get(format!("http://{envoy_addr}/orders"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = get_text(&client(), gw.admin_url("/metrics")).await;
    assert_eq!(
        metric_value(
            &text,
            "floodgate_ratelimit_decisions_total{result=\"rejected\",rule=\"orders-per-user\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric_value(
            &text,
            "floodgate_ratelimit_decisions_total{result=\"allowed\",rule=\"per-client-address\"}"
        ),
        Some(7.0),
        "the address limit was charged only for admitted requests"
    );
}

#[test]
fn the_rls_guide_shows_the_pair_the_envoy_test_runs() {
    let read =
        |f: &str| std::fs::read_to_string(format!("{}/{f}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let readme = read("docs/rls.md");
    for (file, fence) in [
        ("examples/rls.toml", "toml"),
        ("examples/rls-envoy.yaml", "yaml"),
    ] {
        let block = format!("```{fence}\n{}```", read(file));
        assert!(
            readme.contains(&block),
            "docs/rls.md's copy of {file} differs from the file"
        );
    }
}

#[tokio::test]
async fn top_and_the_dashboard_list_rls_limits_and_their_clients() {
    let gw = RlsGateway::start(&limit(
        "per-user",
        "[{ key = \"user\" }, { key = \"api_key\" }]",
        "algorithm = \"fixed_window\"\nlimit = 2\nwindow = \"1h\"\nscope = \"local\"",
    ));
    let mut c = gw.client().await;
    let d = || {
        request(
            "edge",
            vec![descriptor(&[("user", "alice"), ("api_key", "s3cret")])],
        )
    };
    for _ in 0..5 {
        ask(&mut c, d()).await;
    }
    let top = get_json(&client(), gw.admin_url("/top?rule=per-user&by=rejected")).await;
    let first = &top["clients"][0];
    assert_eq!(first["key"]["user"], "alice", "{top}");
    assert_eq!(first["rejected"], 3, "{top}");
    let shown = first["key"]["api_key"].as_str().unwrap();
    assert!(
        shown.starts_with("sha256:") && !shown.contains("s3cret"),
        "{shown}"
    );
    let stats = get_json(&client(), gw.admin_url("/stats")).await;
    let rule = stats["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "per-user")
        .unwrap_or_else(|| panic!("/stats lists no per-user: {stats}"));
    assert_eq!(rule["rls"]["domain"], "edge");
    assert_eq!(rule["counters"]["rejected"], 3);
    assert_eq!(rule["key"], serde_json::json!(["user", "api_key"]));
    let (ok, out, err) = common::check(&std::fs::read_to_string(gw.config_path()).unwrap(), &[]);
    assert!(ok, "{err}");
    assert!(
        out.contains("per-user: domain edge | descriptor [user, api_key] | fixed_window 2/1h"),
        "{out}"
    );
}

#[tokio::test]
async fn the_gateway_and_the_rls_run_in_one_process_and_a_shadow_limit_never_rejects() {
    let api = common::OrdersApi::start("orders");
    let rls = common::free_addr();
    let gw = common::Gateway::start(&format!(
        "{}\n[[routes]]\nname = \"orders\"\nmatch = {{ path_prefix = \"/orders\" }}\nupstream = \"orders\"\nauth = \"none\"\n\n\
         [[rules]]\nname = \"per-ip\"\nkey = [\"ip\"]\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1h\"\nscope = \"local\"\n\n\
         [rls]\nlisten = \"{rls}\"\n\n{}",
        common::orders_upstream(&[api.addr]),
        limit(
            "dark",
            "[{ key = \"user\" }]",
            "algorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1h\"\nscope = \"local\"\nshadow = true"
        ),
    ));
    let mut c = common::rls::connect(rls).await;
    for _ in 0..4 {
        let r = ask(&mut c, request("edge", vec![descriptor(&[("user", "a")])])).await;
        assert_eq!(r.overall_code, OK, "a shadow limit never rejects");
        assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().name, "dark");
    }
    let http = common::client();
    assert_eq!(
        http.get(gw.url("/orders")).send().await.unwrap().status(),
        200
    );
    assert_eq!(
        http.get(gw.url("/orders")).send().await.unwrap().status(),
        429
    );
    let text = common::get_text(&http, gw.admin_url("/metrics")).await;
    assert_eq!(
        metric_value(
            &text,
            "floodgate_ratelimit_decisions_total{result=\"shadow_rejected\",rule=\"dark\"}"
        ),
        Some(3.0)
    );
}

#[tokio::test]
async fn block_for_keeps_a_rejected_value_out_in_process_and_in_redis_and_top_shows_it() {
    let redis = RedisServer::start();
    for (backend, store, scope) in [
        ("memory", String::new(), "local"),
        ("redis", redis_store(&redis.url(), "1s"), "global"),
    ] {
        let gw = RlsGateway::start(&format!(
            "{}{store}",
            limit(
                "per-user",
                "[{ key = \"user\" }]",
                &format!("algorithm = \"fixed_window\"\nlimit = 1\nwindow = \"200ms\"\nscope = \"{scope}\"\nblock_for = \"1m\""),
            )
        ));
        let mut c = gw.client().await;
        let alice = || request("edge", vec![descriptor(&[("user", "alice")])]);
        let r = ask(&mut c, alice()).await;
        assert_eq!(r.overall_code, OK, "{backend}");
        // The first rejection (the second call, unless a window boundary fell between) starts
        // the block, and already says how long it lasts.
        let mut r = ask(&mut c, alice()).await;
        for _ in 0..10 {
            if r.overall_code == OVER {
                break;
            }
            r = ask(&mut c, alice()).await;
        }
        assert_eq!(r.overall_code, OVER, "{backend}");
        let until = r.statuses[0].duration_until_reset.unwrap();
        assert!(until.seconds >= 50, "{backend}: {until:?}");
        let retry: u64 = header(&r, "Retry-After").unwrap().parse().unwrap();
        assert!((50..=60).contains(&retry), "{backend}: {retry}");
        // Its 200 ms window has long ended: the value is still refused, others are not.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let r = ask(&mut c, alice()).await;
        assert_eq!(r.overall_code, OVER, "{backend}: blocked past its window");
        let bob = ask(
            &mut c,
            request("edge", vec![descriptor(&[("user", "bob")])]),
        )
        .await;
        assert_eq!(bob.overall_code, OK, "{backend}");
        let top = get_json(&client(), gw.admin_url("/top?rule=per-user")).await;
        let blocked = top["blocked"].as_array().expect("blocked list");
        assert_eq!(blocked.len(), 1, "{backend}: {top}");
        assert_eq!(blocked[0]["key"]["user"], "alice", "{backend}: {top}");
        let (ok, out, err) =
            common::check(&std::fs::read_to_string(gw.config_path()).unwrap(), &[]);
        assert!(ok, "{err}");
        assert!(out.contains("| block_for 1m"), "{backend}: {out}");
    }
}

#[tokio::test]
async fn a_calendar_limit_counts_per_day_and_reports_the_day_unit() {
    let gw = RlsGateway::start(&limit(
        "daily",
        "[{ key = \"user\" }]",
        "algorithm = \"fixed_window\"\nlimit = 2\ncalendar = \"day\"\ntimezone = \"UTC\"\nscope = \"local\"",
    ));
    let mut c = gw.client().await;
    let alice = || request("edge", vec![descriptor(&[("user", "alice")])]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let to_midnight = 86_400 - now % 86_400;
    for left in [1, 0] {
        let r = ask(&mut c, alice()).await;
        assert_eq!(r.overall_code, OK);
        let s = &r.statuses[0];
        let cl = s.current_limit.as_ref().unwrap();
        assert_eq!((cl.requests_per_unit, cl.unit), (2, Unit::Day as i32));
        assert_eq!(s.limit_remaining, left);
        // The quota is back at the next midnight (UTC), not a sliding day from now.
        let until = s.duration_until_reset.unwrap().seconds as u64;
        assert!(
            until <= to_midnight + 1 && until + 30 >= to_midnight,
            "{until} s to reset, {to_midnight} s to midnight"
        );
    }
    assert_eq!(ask(&mut c, alice()).await.overall_code, OVER);
    let (ok, out, err) = common::check(&std::fs::read_to_string(gw.config_path()).unwrap(), &[]);
    assert!(ok, "{err}");
    assert!(
        out.contains("daily: domain edge | descriptor [user] | fixed_window 2/day UTC"),
        "{out}"
    );
}
