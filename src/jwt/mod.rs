//! JSON Web Tokens at the front door: `[[auth.jwt]]` issuers, the verification of a Bearer
//! token (or one in another header or a cookie), and the identity its claims make.
//!
//! - [`token`]: the compact form split and its JSON read strictly, before any key is used.
//! - [`claims`]: claims by name or path, and the registered claims checked.
//! - [`keyset`]: an issuer's keys, from a JWK Set or a shared secret.
//! - [`source`]: where the keys come from and how they are kept fresh across reloads.
//! - [`cache`]: verified tokens kept until `exp`.
//! - [`metrics`]: verification outcomes and JWK Set fetches.
//!
//! The cryptography is the `jsonwebtoken` crate's (its RustCrypto backend); this module decides
//! which key, which algorithm and which claims, and refuses everything else before a key is
//! touched. Nothing here logs a token: a token is named by the first bytes of its SHA-256.

pub mod cache;
pub mod claims;
pub mod keyset;
pub mod metrics;
pub mod source;
pub mod token;

use std::sync::{Arc, OnceLock};

use http::{HeaderMap, HeaderName};
use jsonwebtoken::Algorithm;
use sha2::{Digest, Sha256};

use crate::metrics::shards::Counter;
use crate::wire::auth::{HeaderText, Identity, TokenClaims};
use source::KeySource;

/// Longest claim value taken into an identity (user, plan, key id), in bytes.
pub const MAX_IDENTITY_CLAIM: usize = 256;

/// Why a token was refused: the `result` label of `floodgate_jwt_verifications_total` and
/// the `detail` of the 401.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Not three dot-separated segments, or a header without a usable `alg`/`kid`.
    Malformed,
    /// A segment that is not base64url.
    BadEncoding,
    /// A header or claim set that is not a JSON object.
    BadJson,
    /// A member named twice in the header or the claims.
    DuplicateClaim,
    /// Longer than [`token::MAX_TOKEN_BYTES`].
    TooLarge,
    /// `alg: none`.
    AlgNone,
    /// An algorithm the issuer does not accept.
    AlgNotAllowed,
    /// A `crit` header.
    Crit,
    /// An `iss` no configured issuer has (on this carrier).
    UnknownIssuer,
    /// A `kid` the issuer's key set lacks, even after a refetch.
    UnknownKid,
    /// No key of the set verifies the signature.
    BadSignature,
    /// `exp` is past (beyond the leeway).
    Expired,
    /// `nbf` is ahead (beyond the leeway).
    NotYetValid,
    /// `iss` is not the issuer's.
    WrongIssuer,
    /// `aud` names none of the issuer's audiences.
    WrongAudience,
    /// No `exp`: a token that never expires is not accepted.
    MissingExp,
    /// The user claim (or another identity claim) is missing, not text, or cannot be a header
    /// value.
    BadClaims,
    /// The issuer's keys have not been fetched yet.
    NoKeys,
}

impl Reason {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Malformed => "malformed",
            Reason::BadEncoding => "bad_encoding",
            Reason::BadJson => "bad_json",
            Reason::DuplicateClaim => "duplicate_claim",
            Reason::TooLarge => "too_large",
            Reason::AlgNone => "alg_none",
            Reason::AlgNotAllowed => "alg_not_allowed",
            Reason::Crit => "crit",
            Reason::UnknownIssuer => "unknown_issuer",
            Reason::UnknownKid => "unknown_kid",
            Reason::BadSignature => "bad_signature",
            Reason::Expired => "expired",
            Reason::NotYetValid => "not_yet_valid",
            Reason::WrongIssuer => "wrong_issuer",
            Reason::WrongAudience => "wrong_audience",
            Reason::MissingExp => "missing_exp",
            Reason::BadClaims => "bad_claims",
            Reason::NoKeys => "no_keys",
        }
    }

    /// What the 401 says (nothing of the token's content).
    pub fn detail(self) -> &'static str {
        match self {
            Reason::Malformed | Reason::BadEncoding | Reason::BadJson => {
                "the bearer token is not a well-formed JWT"
            }
            Reason::DuplicateClaim => "the token names a header member or claim twice",
            Reason::TooLarge => "the token is too large",
            Reason::AlgNone | Reason::AlgNotAllowed => "the token's algorithm is not accepted",
            Reason::Crit => "the token has critical header extensions, which are not supported",
            Reason::UnknownIssuer | Reason::WrongIssuer => "the token's issuer is not accepted",
            Reason::UnknownKid => "the token's signing key is not known",
            Reason::BadSignature => "the token's signature is not valid",
            Reason::Expired => "the token has expired",
            Reason::NotYetValid => "the token is not valid yet",
            Reason::WrongAudience => "the token is not meant for this audience",
            Reason::MissingExp => "the token has no expiry (exp)",
            Reason::BadClaims => "the token lacks a usable identity claim",
            Reason::NoKeys => "the token's issuer keys are not available yet",
        }
    }
}

/// Where an issuer's tokens are carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Carrier {
    /// `Authorization: Bearer <token>` (the default).
    Bearer,
    /// The whole value of another header.
    Header(HeaderName),
    /// A cookie's value.
    Cookie(String),
}

impl Carrier {
    /// The token this carrier holds in `headers`, if any. A Bearer value must look like a JWT
    /// (an API key travels the same way); a repeated header or cookie carries none (which one
    /// would the backend read?).
    pub fn find<'h>(&self, headers: &'h HeaderMap) -> Option<&'h [u8]> {
        match self {
            Carrier::Bearer => {
                let mut all = headers.get_all(http::header::AUTHORIZATION).iter();
                let v = all.next()?.as_bytes();
                if all.next().is_some() || v.len() < 7 || !v[..7].eq_ignore_ascii_case(b"bearer ") {
                    return None;
                }
                let t = v[7..].trim_ascii();
                token::looks_like_jwt(t).then_some(t)
            }
            Carrier::Header(name) => {
                let mut all = headers.get_all(name).iter();
                let v = all.next()?.as_bytes().trim_ascii();
                (all.next().is_none() && !v.is_empty()).then_some(v)
            }
            Carrier::Cookie(name) => {
                let mut found = None;
                for h in headers.get_all(http::header::COOKIE) {
                    for pair in h.as_bytes().split(|b| *b == b';') {
                        let pair = pair.trim_ascii();
                        let Some(eq) = pair.iter().position(|b| *b == b'=') else {
                            continue;
                        };
                        if &pair[..eq] == name.as_bytes() {
                            if found.is_some() {
                                return None;
                            }
                            found = Some(pair[eq + 1..].trim_ascii());
                        }
                    }
                }
                found.filter(|v| !v.is_empty())
            }
        }
    }
}

/// One `[[auth.jwt]]`, validated: its settings (read through it, `issuer.name`), its keys and
/// its metric series.
#[derive(Debug)]
pub struct Issuer {
    /// What the config says of it.
    pub settings: IssuerSettings,
    /// Its keys.
    pub keys: Arc<KeySource>,
    ok: OnceLock<Counter>,
    cached: OnceLock<Counter>,
}

/// What `[[auth.jwt]]` says of an issuer, beside where its keys are.
#[derive(Debug)]
pub struct IssuerSettings {
    /// Its label in metrics, logs and `/readyz` (`name`, default the issuer).
    pub name: Arc<str>,
    /// `iss`, compared whole.
    pub issuer: String,
    /// `aud` must name one of these; empty: not checked.
    pub audiences: Vec<String>,
    /// The algorithms accepted.
    pub algorithms: Vec<Algorithm>,
    /// Clock skew allowed on `exp` and `nbf`, in seconds.
    pub leeway: u64,
    /// Where its tokens are carried.
    pub carrier: Carrier,
    /// The claim naming the user (default `sub`).
    pub user_claim: String,
    /// The claim naming the plan, if any.
    pub plan_claim: Option<String>,
    /// The claim naming the key id (default: the user).
    pub key_id_claim: Option<String>,
    /// Forward the token upstream (default), or strip it.
    pub forward_token: bool,
}

impl std::ops::Deref for Issuer {
    type Target = IssuerSettings;

    fn deref(&self) -> &IssuerSettings {
        &self.settings
    }
}

impl Issuer {
    /// An issuer of `settings` verifying with `keys`.
    pub fn new(settings: IssuerSettings, keys: Arc<KeySource>) -> Issuer {
        Issuer {
            settings,
            keys,
            ok: OnceLock::new(),
            cached: OnceLock::new(),
        }
    }

    fn counter<'c>(&self, cell: &'c OnceLock<Counter>, result: &str) -> &'c Counter {
        cell.get_or_init(|| {
            metrics::jwt_metrics()
                .verifications
                .with_label_values(&[&self.name, result])
        })
    }

    /// The identity `claims` make: user, plan and key id by their claims.
    fn identity(&self, claims: claims::Claims) -> Result<Identity, Reason> {
        let text_of = |name: &str| -> Result<Option<HeaderText>, Reason> {
            let Some(v) = claims::lookup(&claims, name) else {
                return Ok(None);
            };
            let t = claims::text(v).ok_or(Reason::BadClaims)?;
            if t.is_empty() || t.len() > MAX_IDENTITY_CLAIM {
                return Err(Reason::BadClaims);
            }
            HeaderText::new(&t).map(Some).ok_or(Reason::BadClaims)
        };
        let user = text_of(&self.user_claim)?.ok_or(Reason::BadClaims)?;
        let plan = match &self.plan_claim {
            Some(p) => text_of(p)?,
            None => None,
        };
        let id = match &self.key_id_claim {
            Some(k) => text_of(k)?.ok_or(Reason::BadClaims)?,
            None => user.clone(),
        };
        Ok(Identity {
            id,
            user,
            plan,
            claims: Some(Arc::new(TokenClaims {
                issuer: self.name.clone(),
                forward: self.forward_token,
                claims,
            })),
        })
    }
}

/// Every issuer of a config and its cache of verified tokens.
#[derive(Debug)]
pub struct Tokens {
    /// `[[auth.jwt]]` in file order.
    pub issuers: Vec<Issuer>,
    /// Verified tokens until their `exp`.
    pub cache: cache::TokenCache,
    /// The distinct carriers of the issuers, in file order.
    carriers: Vec<Carrier>,
}

impl Tokens {
    /// The issuers, with a cache of about `cache_entries` tokens.
    pub fn new(issuers: Vec<Issuer>, cache_entries: usize) -> Tokens {
        let mut carriers: Vec<Carrier> = Vec::new();
        for i in &issuers {
            if !carriers.contains(&i.carrier) {
                carriers.push(i.carrier.clone());
            }
        }
        Tokens {
            issuers,
            cache: cache::TokenCache::new(cache_entries),
            carriers,
        }
    }

    /// No issuer configured.
    pub fn is_empty(&self) -> bool {
        self.issuers.is_empty()
    }

    /// Fetches the keys of every issuer that has none yet (all at once, each within its
    /// `fetch_timeout`) and starts their background refresh: before a config serves, at start
    /// and at each reload (an issuer left as it was keeps its keys and fetches nothing).
    pub async fn prepare(&self) {
        futures::future::join_all(self.issuers.iter().map(|i| i.keys.ensure_loaded())).await;
        for i in &self.issuers {
            i.keys.start_refresher();
        }
    }

    /// Creates every issuer's metric series at 0, as the config is put in force: `ok`
    /// verifications, and for fetched keys the fetches and skipped refetches.
    pub fn register_series(&self) {
        let m = metrics::jwt_metrics();
        for i in &self.issuers {
            i.counter(&i.ok, "ok");
            if i.keys.is_fetched() {
                for result in ["ok", "error"] {
                    m.fetches.with_label_values(&[&i.name, result]);
                }
                m.refetch_skipped.with_label_values(&[&i.name]);
            }
            m.keys.with_label_values(&[&i.name]);
        }
    }

    /// Whether every issuer has keys (what `/readyz` waits for, as for the store).
    pub fn ready(&self) -> bool {
        self.issuers.iter().all(|i| i.keys.keys().is_some())
    }

    /// Each issuer as `/readyz` and the dashboard show it: its keys, their age, the last
    /// fetch error. Sets the age and key-count gauges on the way.
    pub fn status(&self) -> serde_json::Value {
        let m = metrics::jwt_metrics();
        let list: Vec<serde_json::Value> = self
            .issuers
            .iter()
            .map(|i| {
                let keys = i.keys.keys();
                let kids = keys.as_ref().map(|k| k.kids()).unwrap_or_default();
                let count = keys.as_ref().map_or(0, |k| k.keys.len());
                m.keys.with_label_values(&[&i.name]).set(count as i64);
                let age = i.keys.age();
                if let Some(a) = age {
                    m.age.with_label_values(&[&i.name]).set(a as i64);
                }
                serde_json::json!({
                    "name": &*i.name,
                    "issuer": i.issuer,
                    "ready": keys.is_some(),
                    "fetched": i.keys.is_fetched(),
                    "keys": count,
                    "kids": kids,
                    "age_seconds": age,
                    "last_error": i.keys.last_error(),
                })
            })
            .collect();
        serde_json::Value::Array(list)
    }

    /// The token a request presents and where, if it presents one.
    pub fn presented<'h>(&self, headers: &'h HeaderMap) -> Option<(&'h [u8], &Carrier)> {
        self.carriers
            .iter()
            .find_map(|c| c.find(headers).map(|t| (t, c)))
    }

    /// The identity `token` (found on `carrier`) proves, or why it proves none. Counted in
    /// `floodgate_jwt_verifications_total`.
    pub async fn verify(&self, token: &[u8], carrier: &Carrier) -> Result<Arc<Identity>, Reason> {
        let now = crate::text::unix_now();
        let digest: [u8; 32] = Sha256::digest(token).into();
        if let Some(hit) = self.cache.get(&digest, now) {
            if let Some(issuer) = self.issuers.get(hit.issuer) {
                if issuer.keys.version() == hit.version && issuer.carrier == *carrier {
                    issuer.counter(&issuer.cached, "cached").inc();
                    return Ok(hit.identity);
                }
            }
        }
        let mut label: &str = "unknown";
        let outcome = self.verify_uncached(token, carrier, now, &mut label).await;
        match &outcome {
            Ok((index, identity, exp, version)) => {
                let issuer = &self.issuers[*index];
                issuer.counter(&issuer.ok, "ok").inc();
                let entry = cache::Entry {
                    identity: identity.clone(),
                    exp: *exp,
                    issuer: *index,
                    version: *version,
                };
                self.cache.insert(digest, entry, now);
            }
            Err(reason) => {
                metrics::jwt_metrics()
                    .verifications
                    .with_label_values(&[label, reason.as_str()])
                    .inc();
                tracing::debug!(token = %hex::encode(&digest[..4]), issuer = label, reason = reason.as_str(), "bearer token refused");
            }
        }
        outcome.map(|(_, identity, _, _)| identity)
    }

    /// The checks, cheapest first: shape, issuer, algorithm, claims, then the key and the
    /// signature. `label` is set to the issuer's name once it is known.
    async fn verify_uncached<'s>(
        &'s self,
        token: &[u8],
        carrier: &Carrier,
        now: u64,
        label: &mut &'s str,
    ) -> Result<(usize, Arc<Identity>, u64, u64), Reason> {
        let parsed = token::parse(token)?;
        let iss = parsed.claims.get("iss").and_then(|v| v.as_str());
        let index = self
            .issuers
            .iter()
            .position(|i| Some(i.issuer.as_str()) == iss && i.carrier == *carrier)
            .ok_or(Reason::UnknownIssuer)?;
        let issuer = &self.issuers[index];
        *label = &issuer.name;
        if !issuer.algorithms.contains(&parsed.alg) {
            return Err(Reason::AlgNotAllowed);
        }
        let expect = claims::Expect {
            issuer: &issuer.issuer,
            audiences: &issuer.audiences,
            leeway: issuer.leeway,
        };
        let exp = claims::check(&parsed.claims, &expect, now)?;
        let mut version = issuer.keys.version();
        let mut keys = issuer.keys.keys().ok_or(Reason::NoKeys)?;
        if let Some(kid) = parsed.kid.as_deref() {
            if issuer.keys.is_fetched() && !keys.has_kid(kid) {
                issuer.keys.refetch_for_unknown_kid().await;
                version = issuer.keys.version();
                keys = issuer.keys.keys().ok_or(Reason::NoKeys)?;
                if !keys.has_kid(kid) {
                    return Err(Reason::UnknownKid);
                }
            }
        }
        let mut tried = false;
        for key in keys.candidates(parsed.alg, parsed.kid.as_deref()) {
            tried = true;
            let good = jsonwebtoken::crypto::verify(
                parsed.signature,
                parsed.signing_input,
                &key.key,
                parsed.alg,
            );
            if matches!(good, Ok(true)) {
                let identity = issuer.identity(parsed.claims)?;
                return Ok((index, Arc::new(identity), exp, version));
            }
        }
        Err(if tried {
            Reason::BadSignature
        } else {
            Reason::UnknownKid
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JWT: &str = "eyJhbGciOiJFUzI1NiJ9.e30.c2ln";

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn each_carrier_finds_one_token_or_none() {
        let bearer = Carrier::Bearer;
        let auth = format!("Bearer {JWT}");
        assert_eq!(
            bearer.find(&headers(&[("authorization", &auth)])),
            Some(JWT.as_bytes())
        );
        // An API key in Bearer form is not a token; nor is a repeated Authorization.
        assert_eq!(
            bearer.find(&headers(&[("authorization", "Bearer test")])),
            None
        );
        let twice = headers(&[("authorization", &auth), ("authorization", &auth)]);
        assert_eq!(bearer.find(&twice), None);

        let cookie = Carrier::Cookie("session".into());
        let jar = format!("a=1; session={JWT}; b=2");
        assert_eq!(
            cookie.find(&headers(&[("cookie", &jar)])),
            Some(JWT.as_bytes())
        );
        let split = headers(&[("cookie", "a=1"), ("cookie", &format!("session={JWT}"))]);
        assert_eq!(cookie.find(&split), Some(JWT.as_bytes()));
        let repeated = headers(&[("cookie", &format!("session={JWT}; session=x"))]);
        assert_eq!(
            cookie.find(&repeated),
            None,
            "which one would the backend read?"
        );
        assert_eq!(cookie.find(&headers(&[("cookie", "sessionx=1")])), None);

        let header = Carrier::Header(HeaderName::from_static("x-token"));
        assert_eq!(
            header.find(&headers(&[("x-token", JWT)])),
            Some(JWT.as_bytes())
        );
        assert_eq!(header.find(&headers(&[("x-token", " ")])), None);
    }
}
