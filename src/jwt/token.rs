//! A compact JWS as it arrives: split, base64url-decoded and its JSON read strictly, before any
//! key is looked at.
//!
//! Strict means what RFC 7515 and RFC 7519 leave to the verifier, decided the safe way: a
//! header or claim set that names a member twice is refused (parsers differ on which one wins,
//! so the claim floodgate counts on could differ from the one the backend reads); a `crit`
//! header is refused (floodgate understands no extension, RFC 7515 §4.1.11); `alg: none` and
//! any algorithm outside the issuer's list never reach a key; sizes are capped before decoding.

use base64::Engine;
use jsonwebtoken::Algorithm;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::Reason;

/// Longest token read, in bytes: a bigger one is refused before it is decoded. Real access
/// tokens are well under 4 KiB; a browser cookie cannot exceed 4 KiB.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// A token split and decoded, its signature not yet checked.
#[derive(Debug)]
pub struct Parsed<'t> {
    /// The header's `alg`.
    pub alg: Algorithm,
    /// The header's `kid`, if any.
    pub kid: Option<String>,
    /// The claim set.
    pub claims: Map<String, Value>,
    /// `header.payload`: what the signature covers.
    pub signing_input: &'t [u8],
    /// The signature segment, still base64url.
    pub signature: &'t str,
}

/// Whether `value` is shaped like a compact JWS (three base64url segments, the first a JSON
/// object): how a Bearer value is told from an API key.
pub fn looks_like_jwt(value: &[u8]) -> bool {
    value.starts_with(b"eyJ") && value.iter().filter(|b| **b == b'.').count() == 2
}

/// Splits and decodes `token`.
pub fn parse(token: &[u8]) -> Result<Parsed<'_>, Reason> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(Reason::TooLarge);
    }
    let text = std::str::from_utf8(token).map_err(|_| Reason::Malformed)?;
    let mut parts = text.split('.');
    let (Some(h), Some(p), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Reason::Malformed);
    };
    let header = object(&decode(h)?)?;
    let claims = object(&decode(p)?)?;
    if header.contains_key("crit") {
        return Err(Reason::Crit);
    }
    let alg = match header.get("alg").and_then(Value::as_str) {
        None => return Err(Reason::Malformed),
        Some(a) if a.eq_ignore_ascii_case("none") => return Err(Reason::AlgNone),
        Some(a) => a.parse::<Algorithm>().map_err(|_| Reason::AlgNotAllowed)?,
    };
    let kid = match header.get("kid") {
        None => None,
        Some(Value::String(k)) => Some(k.clone()),
        Some(_) => return Err(Reason::Malformed),
    };
    Ok(Parsed {
        alg,
        kid,
        claims,
        signing_input: &token[..h.len() + 1 + p.len()],
        signature: s,
    })
}

fn decode(segment: &str) -> Result<Vec<u8>, Reason> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(segment)
        .map_err(|_| Reason::BadEncoding)
}

/// A JSON object, each member named once (at every depth).
fn object(bytes: &[u8]) -> Result<Map<String, Value>, Reason> {
    match serde_json::from_slice::<Strict>(bytes) {
        Ok(Strict(Value::Object(map))) => Ok(map),
        Ok(_) => Err(Reason::BadJson),
        Err(e) if e.to_string().starts_with(DUPLICATE) => Err(Reason::DuplicateClaim),
        Err(_) => Err(Reason::BadJson),
    }
}

const DUPLICATE: &str = "duplicate member";

/// A JSON value read by a visitor that refuses a member named twice in one object.
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Strict, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(de::Error::custom(DUPLICATE));
            }
            let Strict(v) = map.next_value()?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s)
    }

    fn token(header: &str, payload: &str) -> String {
        format!("{}.{}.c2ln", b64(header), b64(payload))
    }

    #[test]
    fn a_well_formed_token_is_split_and_decoded() {
        let t = token(
            r#"{"alg":"ES256","kid":"k1"}"#,
            r#"{"sub":"u","n":{"a":1}}"#,
        );
        let p = parse(t.as_bytes()).unwrap();
        assert_eq!(p.alg, Algorithm::ES256);
        assert_eq!(p.kid.as_deref(), Some("k1"));
        assert_eq!(p.claims["sub"], "u");
        assert_eq!(p.signature, "c2ln");
        assert_eq!(p.signing_input, t.rsplit_once('.').unwrap().0.as_bytes());
        assert!(looks_like_jwt(t.as_bytes()));
        assert!(!looks_like_jwt(b"an-api-key"));
    }

    #[test]
    fn hostile_shapes_are_refused_for_what_they_are() {
        let cases = [
            (token(r#"{"alg":"none"}"#, "{}"), Reason::AlgNone),
            (token(r#"{"alg":"NONE"}"#, "{}"), Reason::AlgNone),
            (token(r#"{"alg":"XS999"}"#, "{}"), Reason::AlgNotAllowed),
            (token(r#"{"alg":"ES256","crit":["x"]}"#, "{}"), Reason::Crit),
            (
                token(r#"{"alg":"ES256"}"#, r#"{"sub":"a","sub":"b"}"#),
                Reason::DuplicateClaim,
            ),
            (
                token(r#"{"alg":"ES256"}"#, r#"{"n":{"x":1,"x":2}}"#),
                Reason::DuplicateClaim,
            ),
            (
                token(r#"{"alg":"ES256","alg":"none"}"#, "{}"),
                Reason::DuplicateClaim,
            ),
            (token(r#"{"alg":"ES256"}"#, r#"{"sub":"#), Reason::BadJson),
            (token(r#"{"alg":"ES256"}"#, r#"[1]"#), Reason::BadJson),
            (token(r#"{"alg":"ES256","kid":7}"#, "{}"), Reason::Malformed),
            ("a.b".to_string(), Reason::Malformed),
            ("a.b.c.d".to_string(), Reason::Malformed),
            ("e30.!!!.c2ln".to_string(), Reason::BadEncoding),
            ("x".repeat(MAX_TOKEN_BYTES + 1), Reason::TooLarge),
        ];
        for (t, want) in cases {
            assert_eq!(parse(t.as_bytes()).unwrap_err(), want, "{t:.80}");
        }
    }
}
