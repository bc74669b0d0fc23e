//! Query parameters as the upstream's framework reads them, for the `query:NAME` key part and
//! consistent hashing.
//!
//! Frameworks percent-decode names and values and read `+` as a space
//! (application/x-www-form-urlencoded), so `?user=%61lice`, `?%75ser=alice` and `?user=alice`
//! are one parameter to them: counted by the raw text, each spelling would be a fresh counter
//! (or skip the rule). `;` separates parameters as `&` does, as Rack 2, Perl's CGI and Python
//! before 3.9.2 split on it: a parameter written after a `;` is still seen, and its repetition
//! is still a repetition.
//!
//! A `%` that does not start two hex digits is kept as it is (as WHATWG URL decoding does).

use std::borrow::Cow;

/// A query parameter's value, percent-decoded and with `+` read as a space: bytes, as a value
/// may decode to anything (it is hashed, never shown raw).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryValue<'q>(Cow<'q, [u8]>);

impl QueryValue<'_> {
    /// The decoded bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// The first `name` parameter of `query`, decoded; `name` is compared with each decoded name
/// byte for byte. Does not allocate unless the value has something to decode.
pub fn first<'q>(query: &'q str, name: &str) -> Option<QueryValue<'q>> {
    pairs(query)
        .find(|(k, _)| decodes_to(k, name.as_bytes()))
        .map(|(_, v)| QueryValue(decode(v)))
}

/// Whether `query` has `name` (decoded) more than once.
pub fn is_repeated(query: &str, name: &str) -> bool {
    pairs(query)
        .filter(|(k, _)| decodes_to(k, name.as_bytes()))
        .nth(1)
        .is_some()
}

/// The `name=value` pairs of `query`, raw; a pair without `=` has an empty value.
fn pairs(query: &str) -> impl Iterator<Item = (&str, &str)> {
    query
        .split(['&', ';'])
        .filter(|pair| !pair.is_empty())
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
}

/// `raw`, decoded: borrowed when there is nothing to decode.
fn decode(raw: &str) -> Cow<'_, [u8]> {
    if !raw.bytes().any(|b| b == b'%' || b == b'+') {
        return Cow::Borrowed(raw.as_bytes());
    }
    Cow::Owned(Decoded::new(raw).collect())
}

/// Whether `raw` decodes to exactly `want`, without decoding it into a buffer.
fn decodes_to(raw: &str, want: &[u8]) -> bool {
    Decoded::new(raw).eq(want.iter().copied())
}

/// The bytes `raw` decodes to, one at a time.
struct Decoded<'a> {
    raw: &'a [u8],
    at: usize,
}

impl<'a> Decoded<'a> {
    fn new(raw: &'a str) -> Self {
        Decoded {
            raw: raw.as_bytes(),
            at: 0,
        }
    }
}

impl Iterator for Decoded<'_> {
    type Item = u8;

    fn next(&mut self) -> Option<u8> {
        let b = *self.raw.get(self.at)?;
        self.at += 1;
        match b {
            b'+' => Some(b' '),
            b'%' => {
                let hi = self.raw.get(self.at).copied().and_then(hex);
                let lo = self.raw.get(self.at + 1).copied().and_then(hex);
                match (hi, lo) {
                    (Some(hi), Some(lo)) => {
                        self.at += 2;
                        Some(hi << 4 | lo)
                    }
                    _ => Some(b'%'),
                }
            }
            other => Some(other),
        }
    }
}

fn hex(b: u8) -> Option<u8> {
    char::from(b).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(query: &str, name: &str) -> Option<Vec<u8>> {
        first(query, name).map(|v| v.as_bytes().to_vec())
    }

    #[test]
    fn names_and_values_are_compared_decoded() {
        let alice = Some(b"alice".to_vec());
        assert_eq!(value("user=alice", "user"), alice);
        assert_eq!(value("user=%61lice", "user"), alice);
        assert_eq!(value("user=%61%6C%69%63%65", "user"), alice);
        assert_eq!(value("%75ser=alice", "user"), alice);
        assert_eq!(value("%75%73%65%72=alice", "user"), alice);
        assert_eq!(value("x=1;user=alice", "user"), alice);
        assert_eq!(value("a+b=c+d", "a b"), Some(b"c d".to_vec()));
        assert_eq!(value("q=a%20b", "q"), value("q=a+b", "q"));
        // A literal plus is %2B, not a space.
        assert_eq!(value("q=a%2Bb", "q"), Some(b"a+b".to_vec()));
        // Broken escapes are kept as written.
        assert_eq!(value("q=%zz%4", "q"), Some(b"%zz%4".to_vec()));
        assert_eq!(value("q=100%", "q"), Some(b"100%".to_vec()));
        // Values may decode to any bytes.
        assert_eq!(value("q=%ff%00", "q"), Some(vec![0xff, 0]));
        assert_eq!(value("flag&x=1", "flag"), Some(Vec::new()));
        assert_eq!(value("users=alice", "user"), None);
        assert_eq!(value("", "user"), None);
    }

    #[test]
    fn plain_values_are_borrowed() {
        let q = "user=alice";
        assert!(matches!(first(q, "user").unwrap().0, Cow::Borrowed(_)));
        assert!(matches!(
            first("user=a+b", "user").unwrap().0,
            Cow::Owned(_)
        ));
    }

    #[test]
    fn repetitions_count_every_spelling() {
        assert!(!is_repeated("user=alice", "user"));
        assert!(!is_repeated("user=alice&users=bob", "user"));
        assert!(is_repeated("user=alice&user=bob", "user"));
        assert!(is_repeated("user=alice&%75ser=bob", "user"));
        assert!(is_repeated("user=alice;user=bob", "user"));
        assert!(is_repeated("user=a&user=a", "user"));
        assert!(is_repeated("user&user", "user"));
        assert!(!is_repeated("a=user&b=user", "user"));
    }
}
