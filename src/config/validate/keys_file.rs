//! The keys file, read fast when it keeps to the plain form: `[[keys]]` headers, then
//! `field = "text"` lines, comments and blank lines (what the docs show and tools write). A
//! million keys then load in a fraction of what the TOML parser takes. Anything else (another
//! string form, an escape, an inline table, a duplicate field, a stray line) is read by the
//! TOML parser instead, so that every valid file reads as before and every error in a file
//! is the TOML parser's, with its line and column.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use toml::Spanned;

use crate::config::schema::RawKey;
use crate::wire::auth::KeyStore;

/// The last key table built from a keys file alone (no inline keys), by the file's path and
/// the SHA-256 of its text, with the warnings its keys gave: a reload whose keys file did not
/// change (a route edited) takes that table as it is instead of reading a million keys again.
/// Held weakly: a table no config holds any more is not kept for a reload that may not come.
struct Built {
    path: PathBuf,
    digest: [u8; 32],
    table: Weak<KeyStore>,
    warnings: Vec<String>,
}

static LAST: parking_lot::Mutex<Option<Built>> = parking_lot::Mutex::new(None);

/// The table last built from `path` with this `digest`, and its warnings, if a config still
/// holds it.
pub(super) fn built(path: &Path, digest: &[u8; 32]) -> Option<(Arc<KeyStore>, Vec<String>)> {
    let last = LAST.lock();
    let b = last
        .as_ref()
        .filter(|b| b.path == path && b.digest == *digest)?;
    Some((b.table.upgrade()?, b.warnings.clone()))
}

/// Remembers the table built from `path` with this `digest` ([`built`]).
pub(super) fn remember(path: &Path, digest: [u8; 32], table: &Arc<KeyStore>, warnings: &[String]) {
    *LAST.lock() = Some(Built {
        path: path.to_path_buf(),
        digest,
        table: Arc::downgrade(table),
        warnings: warnings.to_vec(),
    });
}

/// A value as written, and where (for errors).
pub(super) type Field<'a> = (&'a str, Range<usize>);

/// One key's fields as written, borrowed from the file (or from its TOML parse), each with
/// its span.
pub(super) struct KeyFields<'a> {
    /// The table (its `[[keys]]` header).
    pub span: Range<usize>,
    pub id: Field<'a>,
    pub sha256: Option<Field<'a>>,
    pub secret: Option<Field<'a>>,
    pub user: Option<Field<'a>>,
    pub plan: Option<Field<'a>>,
}

impl<'a> KeyFields<'a> {
    /// The fields of a key the TOML parser read.
    pub fn of(raw: &'a Spanned<RawKey>) -> KeyFields<'a> {
        let field = |v: &'a Spanned<String>| (v.get_ref().as_str(), v.span());
        let key = raw.get_ref();
        KeyFields {
            span: raw.span(),
            id: field(&key.id),
            sha256: key.sha256.as_ref().map(field),
            secret: key.secret.as_ref().map(field),
            user: key.user.as_ref().map(field),
            plan: key.plan.as_ref().map(field),
        }
    }
}

/// The `[[keys]]` of a plain file, each spanned as the TOML parser spans it; `None` when the
/// file is not plain (the caller parses it as TOML).
pub(super) fn plain(text: &str) -> Option<Vec<KeyFields<'_>>> {
    let mut keys = Vec::new();
    let mut open: Option<Table> = None;
    let mut offset = 0;
    for raw in text.split_inclusive('\n') {
        let at = offset;
        offset += raw.len();
        let line = match raw.strip_suffix('\n') {
            Some(l) => l.strip_suffix('\r').unwrap_or(l),
            None => raw,
        };
        match read_line(line, at)? {
            Line::Blank => {}
            Line::Header(start) => {
                if let Some(t) = open.take() {
                    keys.push(t.finish()?);
                }
                open = Some(Table::new(start));
            }
            Line::Field(name, value) => {
                let table = open.as_mut()?;
                table.set(name, value)?;
            }
        }
    }
    if let Some(t) = open.take() {
        keys.push(t.finish()?);
    }
    Some(keys)
}

enum Line<'a> {
    Blank,
    /// A `[[keys]]` header at this offset.
    Header(usize),
    /// `name = "value"`: the name, and the value with its span (quotes included).
    Field(&'a str, Field<'a>),
}

fn is_space(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// A byte the plain form takes in a comment or a string: no ASCII control character but tab
/// (TOML refuses those; bytes of other characters, all 0x80 and up, are taken as they are).
fn plain_byte(b: u8) -> bool {
    b == b'\t' || (b >= 0x20 && b != 0x7f)
}

/// What follows a line's last token: spaces, then nothing or a comment.
fn rest_is_blank(rest: &str) -> bool {
    let rest = rest.trim_start_matches([' ', '\t']);
    rest.is_empty() || (rest.starts_with('#') && rest.bytes().all(plain_byte))
}

fn read_line(line: &str, at: usize) -> Option<Line<'_>> {
    let bytes = line.as_bytes();
    let lead = bytes.iter().take_while(|&&b| is_space(b)).count();
    let body = &line[lead..];
    if body.is_empty() || body.starts_with('#') {
        return rest_is_blank(body).then_some(Line::Blank);
    }
    if let Some(after) = body.strip_prefix("[[keys]]") {
        return rest_is_blank(after).then_some(Line::Header(at + lead));
    }
    let name_len = body
        .bytes()
        .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'-')
        .count();
    let name = &body[..name_len];
    let after = body[name_len..].trim_start_matches([' ', '\t']);
    let after = after.strip_prefix('=')?.trim_start_matches([' ', '\t']);
    let value = after.strip_prefix('"')?;
    // One pass to the closing quote: an escape or a control character leaves the line to the
    // TOML parser.
    let close = value
        .bytes()
        .position(|b| b == b'"' || b == b'\\' || !plain_byte(b))?;
    if value.as_bytes()[close] != b'"' {
        return None;
    }
    let text = &value[..close];
    if !rest_is_blank(&value[close + 1..]) {
        return None;
    }
    let quote = at + (line.len() - after.len());
    let span: Range<usize> = quote..quote + close + 2;
    Some(Line::Field(name, (text, span)))
}

/// One `[[keys]]` table being read.
struct Table<'a> {
    /// Where its header starts (the TOML parser spans a table by its header).
    start: usize,
    id: Option<Field<'a>>,
    sha256: Option<Field<'a>>,
    secret: Option<Field<'a>>,
    user: Option<Field<'a>>,
    plan: Option<Field<'a>>,
}

impl<'a> Table<'a> {
    fn new(start: usize) -> Table<'a> {
        Table {
            start,
            id: None,
            sha256: None,
            secret: None,
            user: None,
            plan: None,
        }
    }

    /// Sets a field; `None` for an unknown or repeated one (the TOML parser names it).
    fn set(&mut self, name: &str, value: Field<'a>) -> Option<()> {
        let slot = match name {
            "id" => &mut self.id,
            "sha256" => &mut self.sha256,
            "secret" => &mut self.secret,
            "user" => &mut self.user,
            "plan" => &mut self.plan,
            _ => return None,
        };
        if slot.is_some() {
            return None;
        }
        *slot = Some(value);
        Some(())
    }

    /// The key; `None` without an id (the TOML parser names it).
    fn finish(self) -> Option<KeyFields<'a>> {
        Some(KeyFields {
            span: self.start..self.start + "[[keys]]".len(),
            id: self.id?,
            sha256: self.sha256,
            secret: self.secret,
            user: self.user,
            plan: self.plan,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::schema::RawKeysFile;

    fn spans(keys: &[KeyFields<'_>]) -> Vec<String> {
        keys.iter()
            .map(|k| {
                format!(
                    "{:?} {:?} {:?} {:?} {:?} {:?}",
                    k.span, k.id, k.sha256, k.secret, k.user, k.plan
                )
            })
            .collect()
    }

    /// A plain file reads as the TOML parser reads it, spans and all.
    #[test]
    fn a_plain_file_reads_as_toml_does() {
        let text = "# keys\n\n[[keys]]\nid = \"a\"\nsha256 = \"00\" # hashed\nuser = \"acme #1\"\n\n  [[keys]]  # second\r\n\tid=\"b\"\r\nsecret = \"s\"\r\nplan = \"pro\"\r\n[[keys]]\nid = \"é\"\nplan = \"\"";
        let fast = plain(text).expect("plain");
        let parsed: RawKeysFile = toml::from_str(text).unwrap();
        let slow: Vec<KeyFields<'_>> = parsed.keys.iter().map(KeyFields::of).collect();
        assert_eq!(spans(&fast), spans(&slow));
        assert_eq!(fast.len(), 3);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 2000, failure_persistence: None, ..Default::default() })]

        /// Files made of plain and not-quite-plain lines: whenever the fast reader takes one,
        /// the TOML parser takes it too and reads the same keys, spans and all.
        #[test]
        fn what_the_fast_reader_takes_the_toml_parser_reads_alike(
            lines in proptest::collection::vec(proptest::sample::select(vec![
                "[[keys]]", "  [[keys]] # k", "[[keys]]\r", "id = \"a\"", "id=\"b\"", "\tid = \"c\" # c",
                "sha256 = \"00ff\"", "secret = \"s#1\"", "user = \"é\"", "plan = \"\"",
                "plan = \"p\u{85}\"", "user = \"x\ty\"", "# note", "", "   ", "id = 'lit'",
                "id = \"q\\\"\"", "[keys]", "other = \"x\"", "id = \"a\" x", "# \u{7f}",
                "user = \"\u{1}\"", "\"id\" = \"z\"", "id = \"\"\"m\"\"\"",
            ]), 0..14)
        ) {
            let text = lines.join("\n");
            if let Some(fast) = plain(&text) {
                let parsed: RawKeysFile = toml::from_str(&text)
                    .unwrap_or_else(|e| panic!("the fast reader took what TOML refuses: {text:?}: {e}"));
                let slow: Vec<KeyFields<'_>> = parsed.keys.iter().map(KeyFields::of).collect();
                proptest::prop_assert_eq!(spans(&fast), spans(&slow), "{:?}", text);
            }
        }
    }

    /// Whatever is not plain goes to the TOML parser, valid or not.
    #[test]
    fn anything_else_is_left_to_the_toml_parser() {
        for text in [
            "[[keys]]\nid = 'literal'\n",
            "[[keys]]\nid = \"esc\\u0041\"\n",
            "[[keys]]\nid = \"a\"\nid = \"b\"\n",
            "[[keys]]\nid = \"a\"\nother = \"x\"\n",
            "id = \"outside\"\n",
            "[[keys]]\nsha256 = \"00\"\n",
            "keys = [{ id = \"inline\" }]\n",
            "[[keys]]\nid = \"\"\"multi\"\"\"\n",
            "[[keys]]\nid = \"a\" junk\n",
            "[[keys]]\nid = \"a\"\r",
            "[[keys]]\nid = \"a\x01\"\n",
            "[[keys]] # \x7f\nid = \"a\"\n",
            "[[keys]]\n\"id\" = \"a\"\n",
            "[keys]\nid = \"a\"\n",
        ] {
            assert!(plain(text).is_none(), "{text:?}");
        }
        assert_eq!(plain("").map(|k| k.len()), Some(0));
        assert_eq!(plain("# nothing\n\n").map(|k| k.len()), Some(0));
    }
}
