//! The manual (README.md and the guides in docs/) stays true: every metric and config key
//! that exists is documented, and the
//! alert rules and dashboard only name metrics that exist.

use std::collections::BTreeSet;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{ROOT}/{path}")).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// README.md and every guide in docs/, as one text.
fn manual() -> String {
    let mut text = read("README.md");
    let mut guides: Vec<_> = std::fs::read_dir(format!("{ROOT}/docs"))
        .expect("docs/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    guides.sort();
    for g in guides {
        text.push_str(&std::fs::read_to_string(&g).unwrap());
    }
    text
}

/// Every `floodgate_...` word in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("floodgate_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(tail.len());
        out.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// Metric names registered in src/metrics/mod.rs (string literals starting with floodgate_).
fn registered() -> BTreeSet<String> {
    let src = read("src/metrics/mod.rs");
    src.split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| s.starts_with("floodgate_") && !s.contains(' '))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_metric_is_documented() {
    let readme = manual();
    let names = registered();
    assert!(names.len() >= 13, "{names:?}");
    for name in &names {
        assert!(
            readme.contains(&format!("`{name}`")),
            "the manual does not document {name}"
        );
    }
}

#[test]
fn alerts_and_dashboard_name_only_real_metrics() {
    let names = registered();
    let base = |n: &str| {
        for suffix in ["_bucket", "_count", "_sum"] {
            if let Some(b) = n.strip_suffix(suffix) {
                if names.contains(b) {
                    return b.to_string();
                }
            }
        }
        n.to_string()
    };
    let alerts = read("deploy/prometheus/alerts.yml");
    let parsed: serde_yaml::Value = serde_yaml::from_str(&alerts).expect("alerts.yml is YAML");
    let rules = parsed["groups"][0]["rules"].as_sequence().expect("rules");
    let alert_names: Vec<&str> = rules.iter().filter_map(|r| r["alert"].as_str()).collect();
    for wanted in [
        "FloodgateLimiterFailingOpen",
        "FloodgateStoreDown",
        "FloodgateConfigReloadFailing",
        "FloodgateRejectionSpike",
    ] {
        assert!(alert_names.contains(&wanted), "{wanted} missing");
    }
    for r in rules {
        assert!(r["expr"].as_str().is_some_and(|e| !e.is_empty()));
    }
    let dashboard = read("deploy/grafana/floodgate-dashboard.json");
    let d: serde_json::Value = serde_json::from_str(&dashboard).expect("dashboard is JSON");
    assert!(d["panels"][0]["title"]
        .as_str()
        .unwrap()
        .starts_with("Rejections per rule"));
    for n in metric_names(&alerts)
        .iter()
        .chain(metric_names(&dashboard).iter())
    {
        assert!(names.contains(&base(n)), "{n} is not a floodgate metric");
    }
}

#[test]
fn every_config_key_is_documented() {
    let schema = read("src/config/schema.rs");
    let readme = manual();
    let mut keys = BTreeSet::new();
    for line in schema.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("pub ") {
            if let Some((name, _)) = rest.split_once(':') {
                if !name.contains(' ') && !name.contains('(') {
                    keys.insert(name.to_string());
                }
            }
        }
    }
    keys.remove("matcher");
    keys.insert("match".to_string());
    assert!(keys.len() > 30, "{keys:?}");
    for k in keys {
        let documented = readme.contains(&format!("`{k}`"))
            || readme.contains(&format!("[{k}]"))
            || readme.contains(&format!("[[{k}]]"))
            || readme.contains(&format!(".{k}]"));
        assert!(documented, "the manual does not document config key `{k}`");
    }
}
