//! The route and rule indexes give the linear scan's answer: on random configs (loaded by the
//! real loader) and random requests, the first matching route and the rules that apply, in
//! their order, are the same whether every route and rule is tested or only the index's
//! candidates, indexed or not.

use std::path::Path;

use floodgate::config::{rule_anchors, Config};
use floodgate::rules::{Ambiguous, RequestView};
use floodgate::wire::auth::{HeaderText, Identity};
use floodgate::wire::match_index::{Anchor, MatchIndex, Probe};
use http::{HeaderMap, Method};
use proptest::prelude::*;

const HOSTS: [&str; 3] = ["a.example", "B.example", "c.example"];
const PATHS: [&str; 10] = [
    "/", "/a", "/a/", "/a/b", "/A/b", "/a.json", "/ab", "/a/b.c", "/x/y", "/a/b/c",
];
const METHODS: [&str; 4] = ["GET", "POST", "HEAD", "DELETE"];
const PLANS: [&str; 2] = ["free", "pro"];

/// One `match = {...}` of a route or a rule, as TOML.
fn request_match() -> impl Strategy<Value = Vec<String>> {
    (
        prop::option::of(prop::sample::select(HOSTS.to_vec())),
        prop::option::of((any::<bool>(), prop::sample::select(PATHS.to_vec()))),
        prop::option::of(prop::sample::subsequence(METHODS.to_vec(), 1..3)),
    )
        .prop_map(|(host, path, methods)| {
            let mut parts = Vec::new();
            if let Some(h) = host {
                parts.push(format!("host = \"{h}\""));
            }
            match path {
                Some((true, p)) => parts.push(format!("path = \"{p}\"")),
                Some((false, p)) => parts.push(format!("path_prefix = \"{p}\"")),
                None => {}
            }
            if let Some(m) = methods {
                let list: Vec<String> = m.iter().map(|m| format!("\"{m}\"")).collect();
                parts.push(format!("methods = [{}]", list.join(", ")));
            }
            parts
        })
}

fn route() -> impl Strategy<Value = (Vec<String>, bool)> {
    (request_match(), any::<bool>())
}

fn rule(
    routes: usize,
) -> impl Strategy<Value = (Vec<String>, Option<usize>, Option<&'static str>)> {
    (
        request_match(),
        prop::option::of(0..routes),
        prop::option::of(prop::sample::select(PLANS.to_vec())),
    )
}

fn config_text(
    routes: &[(Vec<String>, bool)],
    rules: &[(Vec<String>, Option<usize>, Option<&str>)],
) -> String {
    let mut t = String::from("[[upstreams]]\nname = \"u\"\ntargets = [\"127.0.0.1:9\"]\n\n");
    for (i, (m, case_sensitive)) in routes.iter().enumerate() {
        t.push_str(&format!(
            "[[routes]]\nname = \"r{i}\"\nupstream = \"u\"\nauth = \"optional\"\ncase_sensitive = {case_sensitive}\nmatch = {{ {} }}\n\n",
            m.join(", ")
        ));
    }
    for (i, (m, route, plan)) in rules.iter().enumerate() {
        let mut m = m.clone();
        if let Some(r) = route {
            m.push(format!("route = \"r{r}\""));
        }
        if let Some(p) = plan {
            m.push(format!("plan = \"{p}\""));
        }
        t.push_str(&format!(
            "[[rules]]\nname = \"q{i}\"\nkey = [\"ip\"]\nalgorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1m\"\nmatch = {{ {} }}\n\n",
            m.join(", ")
        ));
    }
    t
}

/// A request: host, path, method, plan.
fn request() -> impl Strategy<
    Value = (
        Option<&'static str>,
        &'static str,
        &'static str,
        Option<&'static str>,
    ),
> {
    (
        prop::option::of(prop::sample::select(vec![
            "a.example",
            "b.example",
            "other.example",
        ])),
        prop::sample::select(vec![
            "/",
            "/a",
            "/a/b",
            "/A/B",
            "/a.json",
            "/a.v2.json",
            "/ab",
            "/a/b.c",
            "/a/b.c.d",
            "/x/y",
            "/a/b/c",
            "/a/b/c/d",
            "/A.JSON",
            "/zz",
        ]),
        prop::sample::select(vec!["GET", "HEAD", "POST", "PUT", "DELETE"]),
        prop::option::of(prop::sample::select(vec!["free", "pro", "gold"])),
    )
}

fn identity(plan: &str) -> Identity {
    Identity {
        id: HeaderText::new("k").unwrap(),
        user: HeaderText::new("u").unwrap(),
        plan: Some(HeaderText::new(plan).unwrap()),
        claims: None,
    }
}

/// The rules that apply, as the linear scan and as `candidates` say, with their outcome.
fn applying(
    cfg: &Config,
    order: impl Iterator<Item = usize>,
    view: &RequestView<'_>,
) -> Vec<(usize, Result<bool, Ambiguous>)> {
    order
        .map(|i| (i, cfg.rules[i].matching(view)))
        .filter(|(_, m)| *m != Ok(false))
        .collect()
}

fn check(
    cfg: &Config,
    forced: (&MatchIndex, &MatchIndex),
    req: (Option<&str>, &str, &str, Option<&str>),
) {
    let (host, path, method, plan) = req;
    let method: Method = method.parse().unwrap();
    let linear = cfg
        .routes
        .iter()
        .position(|r| r.matches(host, &method, path));
    assert_eq!(
        cfg.route_for(host, &method, path),
        linear,
        "route of {req:?}"
    );
    let probe = |route| Probe {
        route: Some(route),
        host,
        path,
        plan,
        method: &method,
    };
    let forced_route = forced
        .0
        .candidates(&Probe {
            route: None,
            plan: None,
            ..probe(0)
        })
        .find(|&i| cfg.routes[i].matches(host, &method, path));
    assert_eq!(forced_route, linear, "forced route index, {req:?}");
    let Some(r) = linear else { return };
    let headers = HeaderMap::new();
    let who = plan.map(identity);
    let view = RequestView {
        route: &cfg.routes[r].name,
        case_sensitive: cfg.routes[r].case_sensitive,
        method: &method,
        path,
        query: None,
        host,
        headers: &headers,
        ip: "10.0.0.1".parse().unwrap(),
        identity: who.as_ref(),
    };
    let all = applying(cfg, 0..cfg.rules.len(), &view);
    let by_index = applying(cfg, cfg.rule_index.candidates(&probe(r)), &view);
    assert_eq!(by_index, all, "rules of {req:?}");
    let by_forced = applying(cfg, forced.1.candidates(&probe(r)), &view);
    assert_eq!(by_forced, all, "forced rule index, {req:?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn indexed_routes_and_rules_answer_as_the_linear_scan(
        (routes, rules) in (1usize..24).prop_flat_map(|n| (
            prop::collection::vec(route(), n),
            prop::collection::vec(rule(n), 0..30),
        )),
        requests in prop::collection::vec(request(), 40),
    ) {
        let text = config_text(&routes, &rules);
        let cfg = Config::from_str(Path::new("gateway.toml"), &text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let route_forced = MatchIndex::build_from(cfg.routes.iter().map(|r| Anchor::of(&r.matcher)), true);
        let rule_forced = MatchIndex::build_from(rule_anchors(&cfg.rules, &cfg.routes).into_iter(), true);
        for req in requests {
            check(&cfg, (&route_forced, &rule_forced), req);
        }
    }
}

/// A path's prefixes are found at every segment boundary and before each dot of its last
/// segment, however deep, and a prefix longer than any filed one costs no lookup.
#[test]
fn prefixes_are_found_at_every_boundary() {
    let prefixes = ["/a", "/a/b", "/a/b.c", "/v1/orders", "/x"];
    let anchors = prefixes.iter().map(|p| Anchor::Prefix {
        host: None,
        prefix: p,
    });
    let index = MatchIndex::build_from(anchors, true);
    let get = |path: &str| -> Vec<usize> {
        index
            .candidates(&Probe {
                route: None,
                host: None,
                path,
                plan: None,
                method: &Method::GET,
            })
            .collect()
    };
    assert_eq!(get("/a/b.c.d"), [0, 1, 2]);
    assert_eq!(get("/A/B/c"), [0, 1], "case folded");
    assert_eq!(get("/v1/orders.json"), [3]);
    assert_eq!(get("/v1/orders/7"), [3]);
    assert_eq!(get("/v1/ordersx"), Vec::<usize>::new());
    assert_eq!(
        get("/a.json/b"),
        Vec::<usize>::new(),
        "a dot only in the last segment"
    );
    assert!(get(&format!("/q{}", "/q".repeat(4000))).is_empty());
}
