//! `[auth]`: the key header and every API key, inline and from the keys file (whose errors name
//! the keys file).

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use http::HeaderName;
use toml::Spanned;

use super::source::Src;
use crate::config::schema::*;
use crate::config::*;
use crate::wire::auth::{digest_of, ApiKey, HeaderText, Identity, KeyStore};

/// `[auth]` and the text of its keys file (`None` when there is none).
pub(super) fn auth(
    src: &Src,
    raw: &RawAuth,
    dir: &Path,
    warnings: &mut Vec<String>,
) -> Result<(Auth, Option<String>), ConfigError> {
    let header = match &raw.header {
        Some(h) => HeaderName::from_bytes(h.get_ref().as_bytes()).map_err(|_| {
            src.err(
                h.span(),
                format!("\"{}\" is not a valid header name", h.get_ref()),
            )
        })?,
        None => HeaderName::from_static("x-api-key"),
    };
    let mut seen = HashSet::new();
    let mut keys = Vec::new();
    collect_keys(src, &raw.keys, &mut seen, &mut keys, warnings)?;
    let mut keys_text = None;
    let keys_file = match &raw.keys_file {
        Some(f) => {
            let path = dir.join(f.get_ref());
            let text = std::fs::read_to_string(&path).map_err(|e| {
                src.err(
                    f.span(),
                    format!("cannot read keys file \"{}\": {e}", path.display()),
                )
            })?;
            let file_src = Src {
                path: &path,
                text: &text,
            };
            let parsed: RawKeysFile = toml::from_str(&text).map_err(|e| {
                ConfigError::at(&path, &text, e.span(), e.message().trim_end().to_string())
            })?;
            collect_keys(&file_src, &parsed.keys, &mut seen, &mut keys, warnings)?;
            keys_text = Some(text);
            Some(path)
        }
        None => None,
    };
    let tokens = super::jwt::tokens(src, raw, dir, warnings)?;
    let auth = Auth {
        header,
        forward_key: raw.forward_key,
        keys_file,
        keys: KeyStore::new(keys),
        tokens,
    };
    Ok((auth, keys_text))
}

/// Keys of one file (gateway.toml or the keys file, whichever `src` is): ids unique across
/// both, one of `sha256` or `secret` each.
fn collect_keys(
    src: &Src,
    raw: &[Spanned<RawKey>],
    seen: &mut HashSet<String>,
    out: &mut Vec<ApiKey>,
    warnings: &mut Vec<String>,
) -> Result<(), ConfigError> {
    for k in raw {
        let key = k.get_ref();
        let id = key.id.get_ref();
        if id.is_empty() {
            return Err(src.err(key.id.span(), "key id must not be empty"));
        }
        // They are sent upstream as X-Floodgate-Key-Id/-User/-Plan: a value that cannot be a
        // header value would fail every request made with this key.
        let id_text = header_safe(src, &key.id, "id")?;
        let user = match &key.user {
            Some(u) => header_safe(src, u, "user")?,
            None => id_text.clone(),
        };
        let plan = key
            .plan
            .as_ref()
            .map(|p| header_safe(src, p, "plan"))
            .transpose()?;
        if !seen.insert(id.clone()) {
            return Err(src.err(key.id.span(), format!("key id \"{id}\" is defined twice")));
        }
        let digest = match (&key.sha256, &key.secret) {
            (Some(h), None) => {
                let mut d = [0u8; 32];
                hex::decode_to_slice(h.get_ref().trim(), &mut d).map_err(|_| {
                    src.err(h.span(), format!("key \"{id}\": sha256 must be 64 hex digits (the SHA-256 of the secret)"))
                })?;
                d
            }
            (None, Some(s)) => {
                if s.get_ref().is_empty() {
                    return Err(
                        src.err(s.span(), format!("key \"{id}\": secret must not be empty"))
                    );
                }
                warnings.push(format!(
                    "key \"{id}\" uses a plaintext `secret`; store its sha256 instead outside development"
                ));
                digest_of(s.get_ref())
            }
            _ => {
                return Err(src.err(
                    k.span(),
                    format!("key \"{id}\" needs exactly one of sha256 or secret"),
                ));
            }
        };
        out.push(ApiKey {
            digest,
            identity: Arc::new(Identity {
                id: id_text,
                user,
                plan,
                claims: None,
            }),
        });
    }
    Ok(())
}

/// Refuses an identity value (`id`, `user`, `plan`) that is not a valid HTTP header value
/// (CR, LF, NUL and other control bytes), judged by the same `http` crate that builds the
/// headers sent upstream.
fn header_safe(src: &Src, v: &Spanned<String>, field: &str) -> Result<HeaderText, ConfigError> {
    if let Some(text) = HeaderText::new(v.get_ref()) {
        return Ok(text);
    }
    Err(src.err(
        v.span(),
        format!(
            "key {field} {:?} cannot be sent in a header (it holds a line break or another control character)",
            v.get_ref()
        ),
    ))
}

#[cfg(test)]
mod tests {
    /// Every invalid `[auth]` (and keys file) fixture fails with the error, line and column it names.
    #[test]
    fn every_invalid_fixture_fails_as_it_says() {
        super::super::fixtures::check_section("auth");
    }
}
