//! Claims as rules and identities read them: by a name that may be a path into nested
//! objects (`realm_access.roles`), or a whole URI (`https://example.com/tenant`), and the
//! registered claims a verifier must check (RFC 7519 §4.1).

use serde_json::{Map, Value};

use super::Reason;

/// The verified claim set of a token.
pub type Claims = Map<String, Value>;

/// The claim `name` names: a member of that whole name first (a URI claim holds dots), else
/// the member named by the text before a dot, read on with the rest (`a.b.c`), trying each dot
/// from the left. Absent: `None`.
pub fn lookup<'c>(claims: &'c Claims, name: &str) -> Option<&'c Value> {
    if let Some(v) = claims.get(name) {
        return Some(v);
    }
    for (i, _) in name.match_indices('.') {
        if let Some(Value::Object(inner)) = claims.get(&name[..i]) {
            if let Some(v) = lookup(inner, &name[i + 1..]) {
                return Some(v);
            }
        }
    }
    None
}

/// A claim's value as text for a limit key or an identity: a string as is, a number or a
/// boolean as written in JSON; arrays, objects and null have none.
pub fn text(value: &Value) -> Option<std::borrow::Cow<'_, str>> {
    match value {
        Value::String(s) => Some(std::borrow::Cow::Borrowed(s)),
        Value::Number(n) => Some(std::borrow::Cow::Owned(n.to_string())),
        Value::Bool(b) => Some(std::borrow::Cow::Borrowed(if *b {
            "true"
        } else {
            "false"
        })),
        _ => None,
    }
}

/// Whether `value` contains `item`: an element of an array equal to it (as text), or a word of
/// a space-separated string (OAuth's `scope`), or the string itself.
pub fn contains(value: &Value, item: &str) -> bool {
    match value {
        Value::Array(items) => items.iter().any(|v| text(v).is_some_and(|t| t == item)),
        Value::String(s) => s.split(' ').any(|w| w == item),
        other => text(other).is_some_and(|t| t == item),
    }
}

/// Whether `value` equals `want` (as text).
pub fn equals(value: &Value, want: &str) -> bool {
    text(value).is_some_and(|t| t == want)
}

/// What a token's registered claims must satisfy at `now` (Unix seconds).
pub struct Expect<'a> {
    /// `iss`, compared whole.
    pub issuer: &'a str,
    /// `aud` must name one of these (a string or an array of them); empty: not checked.
    pub audiences: &'a [String],
    /// Clock skew allowed on `exp` and `nbf`, in seconds.
    pub leeway: u64,
}

/// Checks `exp` (required), `nbf`, `iss` and `aud`; on success, `exp`.
pub fn check(claims: &Claims, expect: &Expect<'_>, now: u64) -> Result<u64, Reason> {
    let exp = match claims.get("exp") {
        None => return Err(Reason::MissingExp),
        Some(v) => numeric_date(v).ok_or(Reason::Malformed)?,
    };
    if exp.saturating_add(expect.leeway) <= now {
        return Err(Reason::Expired);
    }
    if let Some(nbf) = claims.get("nbf") {
        let nbf = numeric_date(nbf).ok_or(Reason::Malformed)?;
        if nbf > now.saturating_add(expect.leeway) {
            return Err(Reason::NotYetValid);
        }
    }
    if claims.get("iss").and_then(Value::as_str) != Some(expect.issuer) {
        return Err(Reason::WrongIssuer);
    }
    if !expect.audiences.is_empty() {
        let ok = match claims.get("aud") {
            Some(Value::String(a)) => expect.audiences.iter().any(|w| w == a),
            Some(Value::Array(list)) => list
                .iter()
                .filter_map(Value::as_str)
                .any(|a| expect.audiences.iter().any(|w| w == a)),
            _ => false,
        };
        if !ok {
            return Err(Reason::WrongAudience);
        }
    }
    Ok(exp)
}

/// A NumericDate (seconds since the epoch, possibly fractional; RFC 7519 §2), floored. A
/// negative or non-numeric one is not a date.
fn numeric_date(v: &Value) -> Option<u64> {
    match v.as_u64() {
        Some(n) => Some(n),
        None => v
            .as_f64()
            .filter(|f| f.is_finite() && *f >= 0.0)
            .map(|f| f.min(u64::MAX as f64) as u64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claims(v: Value) -> Claims {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn names_reach_nested_and_uri_claims() {
        let c = claims(json!({
            "sub": "u1",
            "realm_access": {"roles": ["admin", "reader"]},
            "https://example.com/tenant": "acme",
            "a": {"b.c": {"d": 7}},
            "scope": "orders:read orders:write",
            "n": 5, "t": true
        }));
        assert_eq!(lookup(&c, "sub"), Some(&json!("u1")));
        assert_eq!(
            lookup(&c, "realm_access.roles"),
            Some(&json!(["admin", "reader"]))
        );
        assert_eq!(
            lookup(&c, "https://example.com/tenant"),
            Some(&json!("acme"))
        );
        assert_eq!(lookup(&c, "a.b.c.d"), Some(&json!(7)));
        assert_eq!(lookup(&c, "realm_access.nope"), None);
        assert!(contains(lookup(&c, "realm_access.roles").unwrap(), "admin"));
        assert!(!contains(lookup(&c, "realm_access.roles").unwrap(), "adm"));
        assert!(contains(lookup(&c, "scope").unwrap(), "orders:write"));
        assert!(!contains(lookup(&c, "scope").unwrap(), "orders"));
        assert_eq!(text(&c["n"]).as_deref(), Some("5"));
        assert_eq!(text(&c["t"]).as_deref(), Some("true"));
        assert!(text(&c["realm_access"]).is_none());
    }

    #[test]
    fn registered_claims_are_checked_with_leeway() {
        let auds = ["api".to_string()];
        let expect = Expect {
            issuer: "https://idp",
            audiences: &auds,
            leeway: 30,
        };
        let ok = json!({"iss": "https://idp", "aud": ["x", "api"], "exp": 1000});
        assert_eq!(check(&claims(ok), &expect, 900), Ok(1000));
        let cases = [
            (
                json!({"iss": "https://idp", "aud": "api"}),
                900,
                Reason::MissingExp,
            ),
            (
                json!({"iss": "https://idp", "aud": "api", "exp": 1000}),
                1030,
                Reason::Expired,
            ),
            (
                json!({"iss": "https://idp", "aud": "api", "exp": "x"}),
                0,
                Reason::Malformed,
            ),
            (
                json!({"iss": "https://idp", "aud": "api", "exp": 9999, "nbf": 1031}),
                1000,
                Reason::NotYetValid,
            ),
            (
                json!({"iss": "https://evil", "aud": "api", "exp": 9999}),
                0,
                Reason::WrongIssuer,
            ),
            (
                json!({"iss": "https://idp", "aud": "other", "exp": 9999}),
                0,
                Reason::WrongAudience,
            ),
            (
                json!({"iss": "https://idp", "exp": 9999}),
                0,
                Reason::WrongAudience,
            ),
        ];
        for (c, now, want) in cases {
            assert_eq!(check(&claims(c.clone()), &expect, now), Err(want), "{c}");
        }
        // Inside the leeway both ways.
        let edge = json!({"iss": "https://idp", "aud": "api", "exp": 1000, "nbf": 1020});
        assert_eq!(check(&claims(edge), &expect, 1010), Ok(1000));
    }
}
