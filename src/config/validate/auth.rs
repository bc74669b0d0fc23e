//! `[auth]`: the key header and every API key, inline and from the keys file (whose errors name
//! the keys file).

use std::path::Path;
use std::sync::Arc;

use http::HeaderName;

use super::keys_file::{Field, KeyFields};
use super::source::Src;
use crate::config::schema::*;
use crate::config::*;
use crate::wire::auth::{digest_of, ApiKey, HeaderText, Identity, KeyStore, Keys};

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
    // The keys file's text and, when it is not plain, its parse: they outlive `seen`, which
    // borrows the ids and names of both files rather than copying them.
    let mut text = None;
    let parsed: RawKeysFile;
    let mut seen = Seen::default();
    let mut keys = Vec::new();
    collect_keys(
        src,
        raw.keys.iter().map(KeyFields::of),
        &mut seen,
        &mut keys,
        warnings,
    )?;
    let mut file_table = None;
    let keys_file = match &raw.keys_file {
        Some(f) => {
            let path = dir.join(f.get_ref());
            let read = read_text_capped(&path, MAX_KEYS_FILE_BYTES).map_err(|e| {
                src.err(
                    f.span(),
                    format!("cannot read keys file \"{}\": {e}", path.display()),
                )
            })?;
            let text = &*text.insert(read);
            // All keys in the file: the table built from these same bytes, if one is alive.
            let digest = raw
                .keys
                .is_empty()
                .then(|| crate::wire::auth::digest_of(text));
            if let Some((table, said)) = digest.and_then(|d| super::keys_file::built(&path, &d)) {
                warnings.extend(said);
                file_table = Some(table);
            } else {
                let file_src = Src { path: &path, text };
                let fields = match super::keys_file::plain(text) {
                    Some(fields) => fields,
                    None => {
                        parsed = toml::from_str(text).map_err(|e| {
                            ConfigError::at(
                                &path,
                                text,
                                e.span(),
                                e.message().trim_end().to_string(),
                            )
                        })?;
                        parsed.keys.iter().map(KeyFields::of).collect()
                    }
                };
                keys.reserve(fields.len());
                let before = warnings.len();
                collect_keys(
                    &file_src,
                    fields.into_iter(),
                    &mut seen,
                    &mut keys,
                    warnings,
                )?;
                if let Some(d) = digest {
                    let table = Arc::new(KeyStore::new(std::mem::take(&mut keys)));
                    super::keys_file::remember(&path, d, &table, &warnings[before..]);
                    file_table = Some(table);
                }
            }
            Some(path)
        }
        None => None,
    };
    let tokens = super::jwt::tokens(src, raw, dir, warnings)?;
    let auth = Auth {
        header,
        forward_key: raw.forward_key,
        keys_file,
        keys: match file_table {
            Some(table) => Keys::shared(table),
            None => Keys::new(KeyStore::new(keys)),
        },
        tokens,
    };
    drop(seen);
    Ok((auth, text))
}

/// What the keys read so far hold: their ids (unique across both files), and each user and
/// plan once, so that the keys of one customer or plan share one copy of its name.
#[derive(Default)]
struct Seen<'a> {
    ids: hashbrown::HashSet<&'a str, ahash::RandomState>,
    names: hashbrown::HashMap<&'a str, HeaderText, ahash::RandomState>,
}

impl<'a> Seen<'a> {
    /// The one copy of a user or plan name (interned).
    fn name(&mut self, src: &Src, v: Field<'a>, field: &str) -> Result<HeaderText, ConfigError> {
        if let Some(t) = self.names.get(v.0) {
            return Ok(t.clone());
        }
        let t = header_safe(src, &v, field)?;
        self.names.insert(v.0, t.clone());
        Ok(t)
    }
}

/// Keys of one file (gateway.toml or the keys file, whichever `src` is): ids unique across
/// both, one of `sha256` or `secret` each.
fn collect_keys<'a>(
    src: &Src,
    raw: impl Iterator<Item = KeyFields<'a>>,
    seen: &mut Seen<'a>,
    out: &mut Vec<ApiKey>,
    warnings: &mut Vec<String>,
) -> Result<(), ConfigError> {
    for key in raw {
        let id = key.id.0;
        if id.is_empty() {
            return Err(src.err(key.id.1, "key id must not be empty"));
        }
        // They are sent upstream as X-Floodgate-Key-Id/-User/-Plan: a value that cannot be a
        // header value would fail every request made with this key.
        let id_text = header_safe(src, &key.id, "id")?;
        let user = match key.user {
            Some(u) => seen.name(src, u, "user")?,
            None => id_text.clone(),
        };
        let plan = key.plan.map(|p| seen.name(src, p, "plan")).transpose()?;
        if !seen.ids.insert(id) {
            return Err(src.err(key.id.1, format!("key id \"{id}\" is defined twice")));
        }
        let digest = match (key.sha256, key.secret) {
            (Some((h, span)), None) => {
                let mut d = [0u8; 32];
                hex::decode_to_slice(h.trim(), &mut d).map_err(|_| {
                    src.err(span, format!("key \"{id}\": sha256 must be 64 hex digits (the SHA-256 of the secret)"))
                })?;
                d
            }
            (None, Some((secret, span))) => {
                if secret.is_empty() {
                    return Err(src.err(span, format!("key \"{id}\": secret must not be empty")));
                }
                warnings.push(format!(
                    "key \"{id}\" uses a plaintext `secret`; store its sha256 instead outside development"
                ));
                digest_of(secret)
            }
            _ => {
                return Err(src.err(
                    key.span,
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
fn header_safe(src: &Src, v: &Field<'_>, field: &str) -> Result<HeaderText, ConfigError> {
    if let Some(text) = HeaderText::new(v.0) {
        return Ok(text);
    }
    Err(src.err(
        v.1.clone(),
        format!(
            "key {field} {:?} cannot be sent in a header (it holds a line break or another control character)",
            v.0
        ),
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::config::Config;

    /// A config whose keys are all in an unchanged keys file takes the table a config in
    /// force built from the same bytes, warnings included; a changed file is read again.
    #[test]
    fn an_unchanged_keys_file_keeps_its_table() {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys.toml");
        let first = "[[keys]]\nid = \"a\"\nsecret = \"s-a\"\n";
        std::fs::write(&keys, first).unwrap();
        let text = "[auth]\nkeys_file = \"keys.toml\"\n[[upstreams]]\nname = \"u\"\ntargets = [\"127.0.0.1:9\"]\n[[routes]]\nname = \"r\"\nupstream = \"u\"\n";
        let path = dir.path().join("gateway.toml");
        let load = || Config::from_str(&path, text).unwrap();
        let one = load();
        let two = load();
        assert!(Arc::ptr_eq(&one.auth.keys.table(), &two.auth.keys.table()));
        assert_eq!(one.warnings, two.warnings);
        assert!(two.warnings.iter().any(|w| w.contains("plaintext")));
        assert!(two.auth.keys.lookup(b"s-a").is_some());
        std::fs::write(
            &keys,
            format!("{first}[[keys]]\nid = \"b\"\nsecret = \"s-b\"\n"),
        )
        .unwrap();
        let three = load();
        assert!(!Arc::ptr_eq(
            &one.auth.keys.table(),
            &three.auth.keys.table()
        ));
        assert!(three.auth.keys.lookup(b"s-b").is_some());
        assert!(one.auth.keys.lookup(b"s-b").is_none());
        // Inline keys beside the file: always read (ids are checked across both).
        let both = format!("[[auth.keys]]\nid = \"c\"\nsecret = \"s-c\"\n{text}");
        let four = Config::from_str(&path, &both).unwrap();
        assert!(four.auth.keys.lookup(b"s-c").is_some() && four.auth.keys.lookup(b"s-b").is_some());
    }

    /// Every invalid `[auth]` (and keys file) fixture fails with the error, line and column it names.
    #[test]
    fn every_invalid_fixture_fails_as_it_says() {
        super::super::fixtures::check_section("auth");
    }
}
