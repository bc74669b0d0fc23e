//! `[[auth.jwt]]`: token issuers, each with exactly one source of keys, algorithms that fit
//! those keys, and bounded fetch settings.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use jsonwebtoken::{Algorithm, AlgorithmFamily};
use toml::Spanned;

use super::source::Src;
use crate::config::schema::*;
use crate::config::ConfigError;
use crate::jwt::keyset::KeySet;
use crate::jwt::source::{Freshness, KeySource, KeysFrom};
use crate::jwt::{Carrier, Issuer, IssuerSettings, Tokens};

/// Default of `[auth] token_cache_size`.
pub const DEFAULT_TOKEN_CACHE: usize = 100_000;
const MAX_LEEWAY: Duration = Duration::from_secs(300);
const MAX_FETCH_TIMEOUT: Duration = Duration::from_secs(60);

/// The issuers of `[[auth.jwt]]` with their token cache.
pub(super) fn tokens(
    src: &Src,
    raw: &RawAuth,
    dir: &Path,
    warnings: &mut Vec<String>,
) -> Result<Tokens, ConfigError> {
    let mut names = HashSet::new();
    let mut issuers: Vec<Issuer> = Vec::new();
    for j in &raw.jwt {
        let issuer = issuer(src, j, dir, warnings)?;
        if !names.insert(issuer.name.clone()) {
            let at = j.get_ref().name.as_ref().map_or(j.span(), |n| n.span());
            return Err(src.err(
                at,
                format!(
                    "issuer name \"{}\" is used twice (set `name` to tell them apart)",
                    issuer.name
                ),
            ));
        }
        if issuers
            .iter()
            .any(|o| o.issuer == issuer.issuer && o.carrier == issuer.carrier)
        {
            return Err(src.err(
                j.get_ref().issuer.span(),
                format!(
                    "issuer \"{}\" is configured twice for the same header or cookie: a token could not tell which one verifies it",
                    issuer.issuer
                ),
            ));
        }
        issuers.push(issuer);
    }
    let cache = match &raw.token_cache_size {
        None => DEFAULT_TOKEN_CACHE,
        Some(n) => usize::try_from(*n.get_ref())
            .ok()
            .filter(|n| *n <= 10_000_000)
            .ok_or_else(|| {
                src.err(
                    n.span(),
                    "token_cache_size must be a whole number from 0 to 10000000",
                )
            })?,
    };
    Ok(Tokens::new(issuers, cache))
}

fn issuer(
    src: &Src,
    j: &Spanned<RawJwt>,
    dir: &Path,
    warnings: &mut Vec<String>,
) -> Result<Issuer, ConfigError> {
    let r = j.get_ref();
    let iss = r.issuer.get_ref();
    if iss.is_empty() {
        return Err(src.err(r.issuer.span(), "issuer must not be empty"));
    }
    let name: Arc<str> = match &r.name {
        Some(n) if n.get_ref().is_empty() => {
            return Err(src.err(n.span(), "issuer name must not be empty"))
        }
        Some(n) => n.get_ref().as_str().into(),
        None => iss.as_str().into(),
    };
    let algorithms = algorithms(src, r)?;
    let (from, identity) = keys_from(src, j, &algorithms, dir, warnings)?;
    let audiences = r
        .audiences
        .as_ref()
        .map(|a| a.get_ref().clone())
        .unwrap_or_default();
    if audiences.is_empty() {
        warnings.push(format!(
            "issuer \"{name}\" checks no audience: any token it signs for any service is accepted; set audiences"
        ));
    }
    let leeway = bounded(
        src,
        &r.leeway,
        Duration::from_secs(30),
        MAX_LEEWAY,
        "leeway",
        true,
    )?;
    let refresh_interval = bounded(
        src,
        &r.refresh_interval,
        Duration::from_secs(600),
        Duration::from_secs(7 * 86_400),
        "refresh_interval",
        false,
    )?;
    let min_refetch = bounded(
        src,
        &r.min_refetch,
        Duration::from_secs(30),
        refresh_interval,
        "min_refetch",
        false,
    )?;
    let fetch_timeout = bounded(
        src,
        &r.fetch_timeout,
        Duration::from_secs(5),
        MAX_FETCH_TIMEOUT,
        "fetch_timeout",
        false,
    )?;
    let carrier = carrier(src, r)?;
    let freshness = Freshness {
        refresh_interval,
        min_refetch,
        timeout: fetch_timeout,
    };
    let claim = |c: &Option<Spanned<String>>, what: &str| -> Result<Option<String>, ConfigError> {
        match c {
            Some(v) if v.get_ref().is_empty() => {
                Err(src.err(v.span(), format!("{what} must not be empty")))
            }
            Some(v) => Ok(Some(v.get_ref().clone())),
            None => Ok(None),
        }
    };
    let settings = IssuerSettings {
        name: name.clone(),
        issuer: iss.clone(),
        audiences,
        algorithms,
        leeway: leeway.as_secs(),
        carrier,
        user_claim: claim(&r.user_claim, "user_claim")?.unwrap_or_else(|| "sub".into()),
        plan_claim: claim(&r.plan_claim, "plan_claim")?,
        key_id_claim: claim(&r.key_id_claim, "key_id_claim")?,
        forward_token: r.forward_token.unwrap_or(true),
    };
    let keys = KeySource::shared(name, iss, from, freshness, &identity);
    Ok(Issuer::new(settings, keys))
}

/// `algorithms`: known names, all of one kind (HMAC or public keys).
fn algorithms(src: &Src, r: &RawJwt) -> Result<Vec<Algorithm>, ConfigError> {
    let Some(list) = &r.algorithms else {
        return Ok(vec![Algorithm::RS256, Algorithm::ES256]);
    };
    if list.get_ref().is_empty() {
        return Err(src.err(list.span(), "algorithms must name at least one algorithm"));
    }
    let mut out = Vec::new();
    for a in list.get_ref() {
        let alg = match a.get_ref().parse::<Algorithm>() {
            Ok(alg) => alg,
            Err(_) => {
                return Err(src.err(
                    a.span(),
                    format!(
                        "unknown algorithm \"{}\" (expected RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA, HS256, HS384 or HS512)",
                        a.get_ref()
                    ),
                ))
            }
        };
        out.push(alg);
    }
    let hmac = out
        .iter()
        .filter(|a| a.family() == AlgorithmFamily::Hmac)
        .count();
    if hmac != 0 && hmac != out.len() {
        return Err(src.err(
            list.span(),
            "algorithms mixes HMAC (HS*) with public-key algorithms: an issuer is one or the other, or a public key could be used as a shared secret",
        ));
    }
    Ok(out)
}

/// Where the keys come from (exactly one source) and what defines that source.
fn keys_from(
    src: &Src,
    j: &Spanned<RawJwt>,
    algorithms: &[Algorithm],
    dir: &Path,
    warnings: &mut Vec<String>,
) -> Result<(KeysFrom, String), ConfigError> {
    let r = j.get_ref();
    let given = [
        r.jwks_url.is_some(),
        r.discovery_url.is_some(),
        r.jwks.is_some(),
        r.secret.is_some(),
        r.secret_file.is_some(),
    ];
    if given.iter().filter(|g| **g).count() != 1 {
        return Err(src.err(
            j.span(),
            format!(
                "issuer \"{}\" needs exactly one of jwks_url, discovery_url, jwks, secret or secret_file",
                r.issuer.get_ref()
            ),
        ));
    }
    let hmac = algorithms[0].family() == AlgorithmFamily::Hmac;
    let secret = match (&r.secret, &r.secret_file) {
        (Some(s), _) => {
            warnings.push(format!(
                "issuer \"{}\" has its secret in the config; use secret_file outside development",
                r.issuer.get_ref()
            ));
            Some((s.get_ref().as_bytes().to_vec(), s.span()))
        }
        (None, Some(f)) => {
            let path = dir.join(f.get_ref());
            let bytes = crate::config::read_capped(&path, crate::config::MAX_SECRET_FILE_BYTES)
                .map_err(|e| {
                    src.err(
                        f.span(),
                        format!("cannot read secret_file \"{}\": {e}", path.display()),
                    )
                })?;
            // A trailing newline is an editor's, not the secret's.
            let trimmed = bytes.trim_ascii_end().to_vec();
            Some((trimmed, f.span()))
        }
        _ => None,
    };
    if let Some((bytes, span)) = secret {
        if !hmac {
            return Err(src.err(
                span,
                "a secret verifies HMAC tokens only: set algorithms to HS256, HS384 or HS512",
            ));
        }
        let need = algorithms.iter().map(hmac_min_len).max().unwrap_or(32);
        if bytes.len() < need {
            return Err(src.err(
                span,
                format!(
                    "the secret is {} bytes; the algorithms need at least {need} (RFC 7518 §3.2)",
                    bytes.len()
                ),
            ));
        }
        let digest = hex::encode(crate::wire::auth::digest_of_bytes(&bytes));
        let set = KeySet::secret(&bytes).map_err(|e| src.err(span, e))?;
        return Ok((KeysFrom::Fixed(Arc::new(set)), format!("secret {digest}")));
    }
    if hmac {
        let at = r.algorithms.as_ref().map_or(j.span(), |a| a.span());
        return Err(src.err(
            at,
            "HMAC algorithms need a secret or secret_file; a JWK Set gives public keys",
        ));
    }
    if let Some(text) = &r.jwks {
        let set =
            KeySet::from_jwks(text.get_ref().as_bytes()).map_err(|e| src.err(text.span(), e))?;
        let digest = hex::encode(crate::wire::auth::digest_of(text.get_ref()));
        return Ok((KeysFrom::Fixed(Arc::new(set)), format!("jwks {digest}")));
    }
    let (url, discovery) = match (&r.jwks_url, &r.discovery_url) {
        (Some(u), _) => (u, false),
        (None, Some(d)) => (d, true),
        _ => unreachable!("one source is given"),
    };
    let what = if discovery {
        "discovery_url"
    } else {
        "jwks_url"
    };
    let uri: http::Uri = url.get_ref().parse().map_err(|_| {
        src.err(
            url.span(),
            format!("{what} \"{}\" is not a URL", url.get_ref()),
        )
    })?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err(src.err(
            url.span(),
            format!("{what} must be an http:// or https:// URL with a host"),
        ));
    }
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err(src.err(url.span(), format!("{what} must not hold credentials")));
    }
    if uri.scheme_str() == Some("http") && !is_loopback(uri.host().unwrap_or_default()) {
        warnings.push(format!(
            "{what} of issuer \"{}\" is plain http: anyone on the path could swap the keys; use https",
            r.issuer.get_ref()
        ));
    }
    let identity = format!("{what} {uri}");
    Ok((
        if discovery {
            KeysFrom::Discovery(uri)
        } else {
            KeysFrom::Url(uri)
        },
        identity,
    ))
}

fn hmac_min_len(a: &Algorithm) -> usize {
    match a {
        Algorithm::HS384 => 48,
        Algorithm::HS512 => 64,
        _ => 32,
    }
}

fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `header` or `cookie` (not both).
fn carrier(src: &Src, r: &RawJwt) -> Result<Carrier, ConfigError> {
    match (&r.header, &r.cookie) {
        (Some(h), Some(_)) => Err(src.err(h.span(), "set header or cookie, not both")),
        (None, Some(c)) => {
            let name = c.get_ref();
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b))
            {
                return Err(src.err(c.span(), format!("\"{name}\" is not a valid cookie name")));
            }
            Ok(Carrier::Cookie(name.clone()))
        }
        (Some(h), None) => {
            let name = HeaderName::from_bytes(h.get_ref().as_bytes()).map_err(|_| {
                src.err(
                    h.span(),
                    format!("\"{}\" is not a valid header name", h.get_ref()),
                )
            })?;
            Ok(if name == http::header::AUTHORIZATION {
                Carrier::Bearer
            } else {
                Carrier::Header(name)
            })
        }
        (None, None) => Ok(Carrier::Bearer),
    }
}

/// A duration up to `max`, `default` when absent; zero only where `zero_ok`.
fn bounded(
    src: &Src,
    v: &Option<Spanned<String>>,
    default: Duration,
    max: Duration,
    what: &str,
    zero_ok: bool,
) -> Result<Duration, ConfigError> {
    let Some(d) = v else { return Ok(default) };
    let got = src.duration(d)?;
    if got.is_zero() && !zero_ok {
        return Err(src.err(d.span(), format!("{what} must be longer than 0")));
    }
    if got > max {
        return Err(src.err(
            d.span(),
            format!("{what} must be at most {}", crate::text::humantime(max)),
        ));
    }
    Ok(got)
}
