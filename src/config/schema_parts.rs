//! The pieces the raw config types ([`super::schema`]) name in their schema attributes: the
//! names of a `NAMES` table as an `enum`, the duration syntax, a key that is refused. Apart
//! from `json_schema`, which generates the schema from those types, so that the types and
//! the generator do not import each other.

use std::borrow::Cow;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde_json::Value;

/// The names of a `NAMES` table (`Algorithm::NAMES`, ...) as a schema's `enum`: the same list
/// the loader's `one_of` accepts, so the two cannot drift apart.
pub fn names<T>(table: &[(&'static str, T)]) -> Value {
    Value::Array(table.iter().map(|(name, _)| Value::from(*name)).collect())
}

/// A duration as gateway.toml writes it (`"250ms"`, `"1s"`, `"1m"`, `"1h"`, `"1d"`), for the
/// schema only: the loader reads a `String` and parses it with
/// [`super::duration::parse_duration`].
pub struct DurationText;

impl JsonSchema for DurationText {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        // The loader trims surrounding spaces, so the pattern allows them.
        json_schema!({
            "type": "string",
            "pattern": "^\\s*[0-9]+(ms|s|m|h|d)\\s*$",
            "description": "A whole number and a unit: ms, s, m, h or d (\"250ms\", \"1s\", \"1m\", \"1h\", \"1d\").",
        })
    }
}

/// A key the loader reads only to refuse it with the reason (`[[rls.limits]] count`): the
/// schema allows no value, so an editor flags it as `floodgate check` does.
pub fn refused(_: &mut SchemaGenerator) -> Schema {
    Schema::from(false)
}
