//! What the per-request work around a decision costs: building a rule's counter key, matching
//! a request against 50 rules, and formatting the RateLimit headers.
//!
//! `cargo bench --bench micro` (about 15 seconds). Under `cargo test` (no `--bench` argument,
//! and libtest's flags such as `--test-threads` that criterion would refuse) each measured
//! function runs once as a smoke test instead, in milliseconds.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion};
use floodgate::limiter::{Algorithm, Decision, Limit};
use floodgate::rules::{KeyPart, Policy, RequestView, Rule, RuleMatch, Scope};
use floodgate::wire::auth::{HeaderText, Identity};
use floodgate::wire::matching::RequestMatch;
use floodgate::wire::response::RateLimitHeaders;
use http::{HeaderMap, HeaderName, Method};

fn rule(name: &str, key: Vec<KeyPart>, matcher: RuleMatch, algorithm: Algorithm) -> Rule {
    Rule {
        matcher,
        key_parts: key,
        limit_from: None,
        policy: Arc::new(Policy::with_defaults(
            name,
            Limit::police(
                algorithm,
                100,
                if algorithm == Algorithm::Concurrency {
                    Duration::ZERO
                } else {
                    Duration::from_secs(60)
                },
                20,
            ),
            Scope::Local,
        )),
    }
}

/// The request every benchmark looks at: an authenticated `GET /orders/12345?page=2`.
struct Request {
    headers: HeaderMap,
    identity: Identity,
}

impl Request {
    fn new() -> Self {
        let mut headers = HeaderMap::new();
        headers.insert("host", "api.example.com".parse().unwrap());
        headers.insert("user-agent", "bench/1.0".parse().unwrap());
        headers.insert("accept", "application/json".parse().unwrap());
        headers.insert("x-tenant", "tenant-0042".parse().unwrap());
        headers.insert("x-tier", "gold".parse().unwrap());
        Request {
            headers,
            identity: Identity {
                id: HeaderText::new("acme-prod").unwrap(),
                user: HeaderText::new("acme").unwrap(),
                plan: HeaderText::new("pro"),
                claims: None,
            },
        }
    }

    fn view(&self) -> RequestView<'_> {
        RequestView {
            route: "orders",
            case_sensitive: true,
            method: &Method::GET,
            path: "/orders/12345",
            query: Some("page=2&sort=desc"),
            host: Some("api.example.com"),
            headers: &self.headers,
            ip: "203.0.113.7".parse().unwrap(),
            identity: Some(&self.identity),
        }
    }
}

/// 50 rules of every kind of `match`, as an operator with many customers and routes might
/// write them. Against [`Request`], 6 of them apply (every 10th rule plus one plan rule).
fn fifty_rules() -> Vec<Arc<Rule>> {
    (0..50)
        .map(|i| {
            let name = format!("rule-{i:02}");
            let matcher = match i % 10 {
                // Applies: everything, per IP.
                0 if i == 0 => RuleMatch::default(),
                0 => RuleMatch {
                    route: Some("orders".into()),
                    ..Default::default()
                },
                1 => RuleMatch {
                    route: Some(format!("route-{i}")),
                    ..Default::default()
                },
                2 => RuleMatch {
                    request: RequestMatch {
                        path: Some(format!("/login/{i}")),
                        methods: Some(vec![Method::POST]),
                        ..Default::default()
                    },
                    ..Default::default()
                },
                3 => RuleMatch {
                    request: RequestMatch {
                        path_prefix: Some(format!("/api/v{i}/orders")),
                        ..Default::default()
                    },
                    ..Default::default()
                },
                4 => RuleMatch {
                    request: RequestMatch {
                        host: Some(format!("tenant{i}.example.com")),
                        ..Default::default()
                    },
                    ..Default::default()
                },
                5 => RuleMatch {
                    plan: Some(if i == 5 { "pro" } else { "free" }.into()),
                    ..Default::default()
                },
                6 => RuleMatch {
                    header: Some((HeaderName::from_static("x-tier"), Some(format!("tier-{i}")))),
                    ..Default::default()
                },
                7 => RuleMatch {
                    request: RequestMatch {
                        path_prefix: Some("/exports".into()),
                        methods: Some(vec![Method::GET, Method::POST]),
                        ..Default::default()
                    },
                    ..Default::default()
                },
                8 => RuleMatch {
                    route: Some("orders".into()),
                    request: RequestMatch {
                        methods: Some(vec![Method::DELETE]),
                        ..Default::default()
                    },
                    ..Default::default()
                },
                _ => RuleMatch {
                    request: RequestMatch {
                        host: Some("api.example.com".into()),
                        path: Some(format!("/orders/{i}")),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            };
            let key = match i % 3 {
                0 => vec![KeyPart::Ip],
                1 => vec![KeyPart::ApiKey],
                _ => vec![KeyPart::User, KeyPart::Route],
            };
            Arc::new(rule(&name, key, matcher, Algorithm::TokenBucket))
        })
        .collect()
}

fn key_rules() -> Vec<(&'static str, Rule)> {
    let none = RuleMatch::default;
    vec![
        (
            "ip",
            rule("key-ip", vec![KeyPart::Ip], none(), Algorithm::TokenBucket),
        ),
        (
            "api_key",
            rule(
                "key-api",
                vec![KeyPart::ApiKey],
                none(),
                Algorithm::TokenBucket,
            ),
        ),
        (
            "ip+header+query",
            rule(
                "key-composite",
                vec![
                    KeyPart::Ip,
                    KeyPart::Header(HeaderName::from_static("x-tenant")),
                    KeyPart::Query("page".into()),
                ],
                none(),
                Algorithm::TokenBucket,
            ),
        ),
        (
            "user+route+method+path",
            rule(
                "key-long",
                vec![
                    KeyPart::User,
                    KeyPart::Route,
                    KeyPart::Method,
                    KeyPart::Path,
                ],
                none(),
                Algorithm::TokenBucket,
            ),
        ),
    ]
}

fn decision(remaining: u64) -> Decision {
    Decision {
        allowed: true,
        limit: 100,
        remaining,
        reset: Duration::from_millis(2_500),
        retry_after: Duration::ZERO,
        delay: Duration::ZERO,
    }
}

fn header_rules() -> Vec<(Rule, Decision)> {
    vec![
        (
            rule(
                "per-ip-flood",
                vec![KeyPart::Ip],
                RuleMatch::default(),
                Algorithm::TokenBucket,
            ),
            decision(1999),
        ),
        (
            rule(
                "orders-per-key",
                vec![KeyPart::ApiKey],
                RuleMatch::default(),
                Algorithm::SlidingWindowCounter,
            ),
            decision(17),
        ),
        (
            rule(
                "exports",
                vec![KeyPart::User],
                RuleMatch::default(),
                Algorithm::Concurrency,
            ),
            decision(1),
        ),
    ]
}

/// How many of `rules` apply to `view` (what the proxy computes first for every request).
fn count_matching(rules: &[Arc<Rule>], view: &RequestView<'_>) -> usize {
    rules.iter().filter(|r| r.matches(view)).count()
}

/// The proxy's per-request rule work: match every rule, key the ones that apply.
fn checks(rules: &[Arc<Rule>], view: &RequestView<'_>) -> usize {
    let mut applying = Vec::new();
    let mut checks = Vec::new();
    for rule in rules {
        if rule.matches(view) {
            if let Some(check) = rule.check_for(view) {
                applying.push(rule.clone());
                checks.push(check);
            }
        }
    }
    black_box(&applying);
    black_box(checks).len()
}

fn benches(c: &mut Criterion) {
    let req = Request::new();
    let view = req.view();

    let mut group = c.benchmark_group("counter_id");
    for (label, rule) in key_rules() {
        group.bench_function(BenchmarkId::from_parameter(label), |b| {
            b.iter(|| black_box(rule.counter_id(black_box(&view))))
        });
    }
    group.finish();

    let rules = fifty_rules();
    let mut group = c.benchmark_group("rules");
    group.bench_function("match_50", |b| {
        b.iter(|| count_matching(black_box(&rules), black_box(&view)))
    });
    group.bench_function("match_and_key_50", |b| {
        b.iter(|| checks(black_box(&rules), black_box(&view)))
    });
    group.finish();

    let applied = header_rules();
    let mut group = c.benchmark_group("ratelimit_headers");
    for n in [1, 3] {
        for legacy in [false, true] {
            let id = format!(
                "{n}_rule{}{}",
                if n > 1 { "s" } else { "" },
                if legacy { "_legacy" } else { "" }
            );
            group.bench_function(id, |b| {
                b.iter(|| {
                    black_box(RateLimitHeaders::build(
                        applied[..n].iter().map(|(r, d)| (&r.policy, d)),
                        black_box(legacy),
                    ))
                })
            });
        }
    }
    group.finish();
}

/// `cargo test`: every measured function once, with its result checked.
fn smoke() {
    let req = Request::new();
    let view = req.view();
    let mut passed = 0;
    for (label, rule) in key_rules() {
        let key = rule.counter_id(&view);
        assert!(
            key.is_some(),
            "key {label}: every part is present in the request"
        );
        assert_eq!(key, rule.counter_id(&view), "key {label} is deterministic");
        passed += 1;
    }
    let rules = fifty_rules();
    assert_eq!(count_matching(&rules, &view), 6, "6 of the 50 rules apply");
    assert_eq!(checks(&rules, &view), 6, "each applying rule can be keyed");
    passed += 2;
    let applied = header_rules();
    let h = RateLimitHeaders::build(applied.iter().map(|(r, d)| (&r.policy, d)), true);
    assert_eq!(
        h.policy(),
        "\"per-ip-flood\";q=100;w=60, \"orders-per-key\";q=100;w=60, \"exports\";q=100"
    );
    assert_eq!(
        h.state(),
        "\"per-ip-flood\";r=1999;t=3, \"orders-per-key\";r=17;t=3, \"exports\";r=1;t=3"
    );
    assert_eq!(h.legacy, Some((100, 1, 3)));
    passed += 1;
    println!("micro: {passed} passed, 0 failed");
}

fn main() {
    if !std::env::args().any(|arg| arg == "--bench") {
        smoke();
        return;
    }
    let mut criterion = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
    benches(&mut criterion);
    criterion.final_summary();
}
