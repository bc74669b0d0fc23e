//! `floodgate schema`: the JSON Schema of gateway.toml, generated from the raw types the loader
//! parses ([`super::schema`]), so that an editor (taplo / Even Better TOML, through a
//! `#:schema` line) completes and checks the same keys `floodgate check` knows.
//!
//! The schema is draft-07, the draft taplo reads best. It states what a single value can be
//! (type, name list, duration syntax, numeric bounds); what depends on several keys (a lease
//! only for some algorithms, `slow_rate` only with `mode = "slow"`) stays with `floodgate
//! check`, which names file, line and column.

use schemars::generate::SchemaSettings;
use serde_json::Value;

use super::schema::RawConfig;

/// The schema of gateway.toml as pretty-printed JSON, ending in a newline.
pub fn gateway_schema() -> String {
    let mut schema = SchemaSettings::draft07()
        .into_generator()
        .into_root_schema_for::<RawConfig>();
    schema.insert("title".into(), "floodgate gateway.toml".into());
    let mut value = schema.to_value();
    drop_null(&mut value);
    let mut text = serde_json::to_string_pretty(&value).unwrap_or_default();
    text.push('\n');
    text
}

/// TOML has no null, so an `Option`'s `null` alternative (which schemars adds for JSON) would
/// only clutter an editor's completion: remove it from every `type` list, `anyOf` and `enum`,
/// and drop a `null` default (a key that is absent by default).
fn drop_null(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if let Some(Value::Array(types)) = map.get_mut("type") {
                types.retain(|t| t != "null");
                if types.len() == 1 {
                    let only = types.remove(0);
                    map.insert("type".into(), only);
                }
            }
            if let Some(Value::Array(any)) = map.get_mut("anyOf") {
                any.retain(|s| s != &serde_json::json!({ "type": "null" }));
                if any.len() == 1 {
                    let only = any.remove(0);
                    map.remove("anyOf");
                    match only {
                        // Draft-07 ignores a `$ref`'s siblings (the description): keep the
                        // reference in an `allOf`, as schemars does for a required field.
                        Value::Object(inner) if inner.contains_key("$ref") => {
                            map.insert("allOf".into(), Value::Array(vec![Value::Object(inner)]));
                        }
                        Value::Object(inner) => {
                            for (k, v) in inner {
                                map.entry(k).or_insert(v);
                            }
                        }
                        other => {
                            map.insert("allOf".into(), Value::Array(vec![other]));
                        }
                    }
                }
            }
            if map.get("default").is_some_and(Value::is_null) {
                map.remove("default");
            }
            if map.get("enum").is_some() {
                if let Some(Value::Array(list)) = map.get_mut("enum") {
                    list.retain(|v| !v.is_null());
                }
            }
            map.values_mut().for_each(drop_null);
        }
        Value::Array(list) => list.iter_mut().for_each(drop_null),
        _ => {}
    }
}
