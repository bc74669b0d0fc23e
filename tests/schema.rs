//! `floodgate schema` against the loader and the shipped files: the committed
//! gateway.schema.json is what the binary prints, every shipped config validates against it
//! (and names it in its `#:schema` line), and the schema and the loader's parse agree on the
//! keys of every table, so a key added to one and not the other fails here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use floodgate::config::schema::{RawConfig, RawWeightedTarget};
use serde_json::Value;

/// The repository's root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// What `floodgate schema` prints.
fn printed_schema() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .arg("schema")
        .output()
        .expect("floodgate runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// The schema as JSON.
fn schema() -> Value {
    serde_json::from_str(&printed_schema()).expect("the schema is JSON")
}

/// A TOML document as the JSON value the schema is about.
fn as_json(text: &str, what: &str) -> Value {
    let toml: toml::Value =
        toml::from_str(text).unwrap_or_else(|e| panic!("{what} is not TOML: {e}"));
    serde_json::to_value(toml).expect("TOML converts to JSON")
}

/// The validation errors of `instance` against the schema, one line each.
fn errors(validator: &jsonschema::Validator, instance: &Value) -> Vec<String> {
    validator
        .iter_errors(instance)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

/// A validator of the draft-07 schema, which must itself be a valid draft-07 schema.
fn validator(schema: &Value) -> jsonschema::Validator {
    assert_eq!(schema["$schema"], "http://json-schema.org/draft-07/schema#");
    jsonschema::draft7::meta::validate(schema).expect("a valid draft-07 schema");
    jsonschema::draft7::new(schema).expect("the schema compiles")
}

/// The committed schema file, which editors read through the shipped configs' `#:schema` line,
/// is exactly what the binary prints: regenerate it with
/// `cargo run -- schema > gateway.schema.json`.
#[test]
fn committed_schema_is_what_the_binary_prints() {
    let committed = std::fs::read_to_string(root().join("gateway.schema.json"))
        .expect("gateway.schema.json is committed");
    assert!(
        committed == printed_schema(),
        "gateway.schema.json is stale: run `cargo run -- schema > gateway.schema.json`"
    );
}

/// gateway.toml, examples/*.toml and deploy/**/*.toml.
fn shipped_configs() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("a directory") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "toml") {
                out.push(path);
            }
        }
    }
    let mut out = vec![root().join("gateway.toml")];
    walk(&root().join("examples"), &mut out);
    walk(&root().join("deploy"), &mut out);
    out.sort();
    out
}

/// Every shipped config validates against the schema and points its editor at the committed
/// schema file with a `#:schema` first line (a path relative to the config, as taplo reads it).
#[test]
fn every_shipped_config_validates_against_the_schema() {
    let schema = schema();
    let validator = validator(&schema);
    let configs = shipped_configs();
    assert!(
        configs.len() >= 6,
        "too few shipped configs found: {configs:?}"
    );
    let committed = std::fs::canonicalize(root().join("gateway.schema.json")).unwrap();
    for path in configs {
        let text = std::fs::read_to_string(&path).unwrap();
        let what = path.display().to_string();
        let first = text.lines().next().unwrap_or_default();
        let named = first
            .strip_prefix("#:schema ")
            .unwrap_or_else(|| panic!("{what} does not start with a `#:schema` line"));
        let target = path.parent().unwrap().join(named.trim());
        assert_eq!(
            std::fs::canonicalize(&target).ok().as_ref(),
            Some(&committed),
            "{what}: `#:schema {named}` is not the committed schema"
        );
        let errors = errors(&validator, &as_json(&text, &what));
        assert!(
            errors.is_empty(),
            "{what} fails the schema:\n{}",
            errors.join("\n")
        );
    }

    // The Kubernetes ConfigMap's gateway.toml (no `#:schema` line: the pod has no schema file).
    let manifest = std::fs::read_to_string(root().join("deploy/k8s/configmap.yaml")).unwrap();
    let map: serde_yaml::Value = serde_yaml::from_str(&manifest).expect("the ConfigMap is YAML");
    let text = map["data"]["gateway.toml"]
        .as_str()
        .expect("the ConfigMap has a gateway.toml");
    let errors = errors(&validator, &as_json(text, "the ConfigMap's gateway.toml"));
    assert!(
        errors.is_empty(),
        "the ConfigMap's gateway.toml fails the schema:\n{}",
        errors.join("\n")
    );
}

/// The schema refuses what the loader refuses for a single value: a misspelt key, a name not
/// in a list, a duration without a unit, a bound overstepped. (Guards against a schema so
/// loose that the validation above could not fail.)
#[test]
fn the_schema_refuses_bad_values() {
    let schema = schema();
    let validator = validator(&schema);
    let base = "[[rules]]\nname = \"r\"\nkey = [\"ip\"]\nalgorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1s\"\n";
    assert!(errors(&validator, &as_json(base, "base")).is_empty());
    for (bad, why) in [
        ("limt = 10", "unknown key"),
        ("scope = \"everywhere\"", "name not in the list"),
        ("lease_ttl = \"5\"", "duration without a unit"),
        ("status = 200", "status below 400"),
        ("cost = 0", "cost below 1"),
    ] {
        let doc = format!("{base}{bad}\n");
        let parsed = toml::from_str::<RawConfig>(&doc).map_err(|e| e.to_string());
        let loaded = parsed.and_then(|_| {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("gateway.toml");
            std::fs::write(&path, format!("[[upstreams]]\nname = \"u\"\ntargets = [\"127.0.0.1:1\"]\n[[routes]]\nname = \"a\"\nupstream = \"u\"\n{doc}")).unwrap();
            floodgate::config::Config::load(&path).map(|_| ()).map_err(|e| e.to_string())
        });
        assert!(loaded.is_err(), "the loader accepts {bad}");
        assert!(
            !errors(&validator, &as_json(&doc, bad)).is_empty(),
            "the schema accepts {bad} ({why})"
        );
    }
}

/// The schema of `value`, following `$ref` and the `allOf: [{ $ref }]` draft-07 uses to keep a
/// description beside a reference.
fn resolve<'a>(root: &'a Value, mut value: &'a Value) -> &'a Value {
    loop {
        if let Some(r) = value.get("$ref").and_then(Value::as_str) {
            let name = r.strip_prefix("#/definitions/").expect("a local reference");
            value = &root["definitions"][name];
        } else if let Some([only]) = value
            .get("allOf")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
        {
            value = only;
        } else {
            return value;
        }
    }
}

/// The definition a `$ref` (direct or in a one-element `allOf`) names.
fn ref_name(value: &Value) -> Option<&str> {
    let r = value
        .get("$ref")
        .or_else(|| value.get("allOf")?.get(0)?.get("$ref"))?;
    r.as_str()?.strip_prefix("#/definitions/")
}

/// One table of the schema: the key path reaching it (each segment's name and whether it is an
/// array of tables) and its properties.
struct Table {
    path: Vec<(String, bool)>,
    properties: BTreeSet<String>,
}

/// Every table of the schema reachable as a TOML table or array of tables, and the
/// definitions of the object alternatives of untagged values (`targets` entries), which TOML
/// cannot reach by a header.
fn tables(root: &Value) -> (Vec<Table>, BTreeSet<String>) {
    fn walk(
        root: &Value,
        node: &Value,
        path: Vec<(String, bool)>,
        out: &mut Vec<Table>,
        untagged: &mut BTreeSet<String>,
    ) {
        let node = resolve(root, node);
        let Some(props) = node.get("properties").and_then(Value::as_object) else {
            return;
        };
        assert_eq!(
            node.get("additionalProperties"),
            Some(&Value::Bool(false)),
            "table {path:?} allows unknown keys"
        );
        out.push(Table {
            path: path.clone(),
            properties: props.keys().cloned().collect(),
        });
        for (key, sub) in props {
            let resolved = resolve(root, sub);
            let (target, array) = match resolved.get("items") {
                Some(items) => (resolve(root, items), true),
                None => (resolved, false),
            };
            if let Some(any) = target.get("anyOf").and_then(Value::as_array) {
                for alt in any {
                    if resolve(root, alt).get("properties").is_some() {
                        untagged.insert(ref_name(alt).expect("a named alternative").to_string());
                    }
                }
                continue;
            }
            let mut next = path.clone();
            next.push((key.clone(), array));
            walk(root, target, next, out, untagged);
        }
    }
    let mut out = Vec::new();
    let mut untagged = BTreeSet::new();
    walk(root, root, Vec::new(), &mut out, &mut untagged);
    (out, untagged)
}

/// A document that puts `line` in the table at `path`: a header for each array of tables on
/// the way (`[[rls.limits]]`), and the table's own header.
fn document_at(path: &[(String, bool)], line: &str) -> String {
    let mut doc = String::new();
    for i in 0..path.len() {
        let dotted: Vec<&str> = path[..=i].iter().map(|(k, _)| k.as_str()).collect();
        if path[i].1 {
            doc += &format!("[[{}]]\n", dotted.join("."));
        } else if i + 1 == path.len() {
            doc += &format!("[{}]\n", dotted.join("."));
        }
    }
    doc + line + "\n"
}

/// The key no table has.
const UNKNOWN: &str = "zz_not_a_key";

/// The fields an unknown-field error offers instead ("expected `a`", "expected `a` or `b`",
/// "expected one of `a`, `b`, ..."): the keys the loader knows in that table.
fn known_fields(error: &str) -> BTreeSet<String> {
    assert!(
        error.contains(&format!("unknown field `{UNKNOWN}`")),
        "not the unknown-key error: {error}"
    );
    let (_, list) = error.split_once(", expected ").expect("a list of fields");
    let list = list.lines().next().unwrap_or_default();
    list.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The schema and the loader agree on the keys of every table: for each table of the schema,
/// a document with an unknown key there is refused by the loader's parse, whose error lists
/// exactly the schema's properties; and the schema refuses the same document.
#[test]
fn the_schema_and_the_loader_agree_on_every_key() {
    let schema = schema();
    let validator = validator(&schema);
    let (tables, untagged) = tables(&schema);
    assert!(tables.len() >= 15, "too few tables: {}", tables.len());
    let mut total = 0;
    for table in &tables {
        let doc = document_at(&table.path, &format!("{UNKNOWN} = 1"));
        let error = toml::from_str::<RawConfig>(&doc)
            .map(|_| ())
            .expect_err(&format!("the loader accepts an unknown key:\n{doc}"))
            .to_string();
        let known = known_fields(&error);
        let at: Vec<&str> = table.path.iter().map(|(k, _)| k.as_str()).collect();
        let at = at.join(".");
        assert_eq!(
            table.properties, known,
            "table `{at}`: the schema's keys (left) are not the loader's (right)"
        );
        assert!(
            !errors(&validator, &as_json(&doc, &at)).is_empty(),
            "the schema accepts an unknown key in `{at}`"
        );
        total += known.len();
    }
    assert!(total >= 130, "only {total} keys compared");

    // The object alternatives of untagged values, each parsed as its own type.
    assert_eq!(
        untagged,
        BTreeSet::from(["RawWeightedTarget".to_string()]),
        "a new untagged table: parse it here as its own type"
    );
    let properties: BTreeSet<String> =
        resolve(&schema, &schema["definitions"]["RawWeightedTarget"])["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
    let error = toml::from_str::<RawWeightedTarget>(&format!("{UNKNOWN} = 1"))
        .map(|_| ())
        .expect_err("an unknown target key")
        .to_string();
    assert_eq!(properties, known_fields(&error), "targets entry");
}

/// Every key has a description: the schema is what an editor shows on hover and completion.
#[test]
fn every_key_is_described() {
    let schema = schema();
    let (tables, _) = tables(&schema);
    let mut missing = Vec::new();
    fn find<'a>(root: &'a Value, path: &[(String, bool)]) -> &'a Value {
        let mut node = resolve(root, root);
        for (key, array) in path {
            node = resolve(root, &node["properties"][key]);
            if *array {
                node = resolve(root, &node["items"]);
            }
        }
        node
    }
    for table in &tables {
        let node = find(&schema, &table.path);
        for (key, sub) in node["properties"].as_object().unwrap() {
            let described = sub
                .get("description")
                .or_else(|| resolve(&schema, sub).get("description"))
                .and_then(Value::as_str)
                .is_some_and(|d| !d.trim().is_empty());
            if !described {
                missing.push(format!("{:?}.{key}", table.path));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "keys without a description: {missing:?}"
    );
}
