//! A route's path rewrite (`strip_prefix`, `prefix_rewrite`, `regex_rewrite`): the path the
//! upstream receives, computed from the client's normalized path after routing, rules and
//! keys have read that one.
//!
//! A rewrite can only produce a path that normalization would have let through unchanged:
//! a result with `..`, `//`, an encoded slash the request's mode refuses, a `?` or an empty
//! path is refused (`400`), never forwarded. A backend behind the gateway therefore never sees
//! a spelling the gateway did not route and count.

use std::borrow::Cow;

use crate::wire::normalize::{self, EscapedSlashes, PathError};

/// The longest `regex_rewrite` pattern, in bytes.
pub const MAX_PATTERN: usize = 4096;
/// The longest `regex_rewrite` substitution, in bytes.
pub const MAX_SUBSTITUTION: usize = 1024;
/// The longest path a rewrite may give (a substitution repeated for every match of a short
/// pattern could otherwise turn one request into megabytes).
pub const MAX_RESULT: usize = 8192;
/// The most memory one compiled `regex_rewrite` may take (the `regex` crate's `size_limit`).
pub const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// How a route rewrites the path it forwards.
#[derive(Debug, Clone)]
pub enum Rewrite {
    /// `strip_prefix = true`: the matched `path_prefix` (or `path`) is removed.
    StripPrefix(Box<str>),
    /// `prefix_rewrite`: the matched prefix (first) is replaced by the second.
    Prefix(Box<str>, Box<str>),
    /// `regex_rewrite`: every match of the pattern in the path is replaced by the
    /// substitution (`$1`, `${name}`); a path it does not match is kept.
    Regex(Box<regex::Regex>, Box<str>),
}

/// Why a rewritten path is not forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RewriteError {
    /// The result does not start with `/` (a prefix stripped off `/orders.json`, or a regex
    /// substitution), or is empty.
    #[error("the route's rewrite of this path does not give a path starting with \"/\"")]
    NotAbsolute,
    /// The result has a `?` or `#`: it would change the query the upstream reads.
    #[error("the route's rewrite of this path gives a \"?\" or \"#\"")]
    Query,
    /// The result is longer than [`MAX_RESULT`].
    #[error("the route's rewrite of this path gives a path longer than 8192 bytes")]
    TooLong,
    /// The result is not in normal form (`..`, `//`, a refused escape, ...).
    #[error("the route's rewrite of this path gives a path the gateway would not forward: {0}")]
    NotNormal(&'static str),
}

impl RewriteError {
    /// What is wrong with the result, without the sentence around it (for `check`).
    pub fn reason(self) -> &'static str {
        match self {
            RewriteError::NotAbsolute => "it does not start with \"/\"",
            RewriteError::TooLong => "it is longer than 8192 bytes",
            RewriteError::Query => "it has a \"?\" or \"#\"",
            RewriteError::NotNormal(why) => why,
        }
    }
}

impl Rewrite {
    /// The path to forward for the client's normalized `path`, or `None` when the rewrite
    /// leaves it as it is; `mode` is the `escaped_slashes` the request was read with.
    pub fn apply(&self, path: &str, mode: EscapedSlashes) -> Result<Option<String>, RewriteError> {
        let out = match self {
            Rewrite::StripPrefix(prefix) => join("", rest_after(path, prefix)),
            Rewrite::Prefix(prefix, with) => join(with, rest_after(path, prefix)),
            Rewrite::Regex(re, with) => match re.replace_all(path, &**with) {
                Cow::Borrowed(_) => return Ok(None),
                Cow::Owned(s) => s,
            },
        };
        if out == path {
            return Ok(None);
        }
        if out.len() > MAX_RESULT {
            return Err(RewriteError::TooLong);
        }
        check(&out, mode)?;
        Ok(Some(out))
    }
}

/// What is left of `path` after the route's matched `prefix` (compared by length: the route
/// matched it, case-insensitively when the route says so, and ASCII case does not change a
/// length).
fn rest_after<'p>(path: &'p str, prefix: &str) -> &'p str {
    path.get(prefix.len()..).unwrap_or("")
}

/// `with` followed by `rest`, one `/` between them when both bring one, `/` when both are
/// empty. A `rest` that is a format suffix (`.json` of `/orders.json` under `/orders`) joins
/// the last segment of `with`, not a segment of its own.
fn join(with: &str, rest: &str) -> String {
    if with.is_empty() && rest.is_empty() {
        return "/".to_owned();
    }
    let with = if rest.starts_with('.') {
        with.strip_suffix('/').unwrap_or(with)
    } else {
        with
    };
    let rest = match (with.ends_with('/'), rest.strip_prefix('/')) {
        (true, Some(r)) => r,
        _ => rest,
    };
    let mut out = String::with_capacity(with.len() + rest.len());
    out.push_str(with);
    out.push_str(rest);
    out
}

/// Refuses a rewritten path that normalization would have refused or changed.
pub fn check(out: &str, mode: EscapedSlashes) -> Result<(), RewriteError> {
    if !out.starts_with('/') {
        return Err(RewriteError::NotAbsolute);
    }
    // Bytes, not a pattern of chars (a UTF-8 decode of every character).
    if out.bytes().any(|b| b == b'?' || b == b'#') {
        return Err(RewriteError::Query);
    }
    match normalize::path(out, mode) {
        Ok(n) if n == out => Ok(()),
        Ok(_) => Err(RewriteError::NotNormal(
            "it has \"..\", \".\", \"//\" or an escape that need not be one",
        )),
        Err(e) => Err(RewriteError::NotNormal(path_error_text(e))),
    }
}

/// A [`PathError`]'s message as a static text (the problem's detail).
fn path_error_text(e: PathError) -> &'static str {
    match e {
        PathError::BadEscape => "a malformed percent-encoding",
        PathError::EscapedSlash => "an encoded slash or semicolon",
        PathError::NotAbsolute => "no leading \"/\"",
        PathError::Backslash => "a backslash",
        PathError::PathParameter => "a \";\"",
        PathError::ControlByte => "a control character or space",
        PathError::EdgeSpace => "a segment that starts or ends with a space",
        PathError::Overlong => "an overlong UTF-8 encoding",
        PathError::AmbiguousEscape => "an escape read as another route",
    }
}

/// Compiles a `regex_rewrite` pattern within [`MAX_PATTERN`] and [`REGEX_SIZE_LIMIT`], and
/// checks that its substitution is at most [`MAX_SUBSTITUTION`] bytes and names only groups
/// the pattern has. `case_sensitive = false` (the route's): the pattern matches ignoring
/// case, as the route does.
pub fn compile(
    pattern: &str,
    substitution: &str,
    case_sensitive: bool,
) -> Result<regex::Regex, String> {
    if pattern.len() > MAX_PATTERN {
        return Err(format!(
            "the pattern is {} bytes long; at most {MAX_PATTERN} are accepted",
            pattern.len()
        ));
    }
    if substitution.len() > MAX_SUBSTITUTION {
        return Err(format!(
            "the substitution is {} bytes long; at most {MAX_SUBSTITUTION} are accepted",
            substitution.len()
        ));
    }
    let re = regex::RegexBuilder::new(pattern)
        .case_insensitive(!case_sensitive)
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| match e {
            regex::Error::CompiledTooBig(limit) => {
                format!("the pattern compiles to more than {limit} bytes; write a simpler one")
            }
            e => format!("the pattern does not compile: {}", one_line(&e.to_string())),
        })?;
    for group in references(substitution)? {
        let known = match group.parse::<usize>() {
            Ok(n) => n < re.captures_len(),
            Err(_) => re.capture_names().flatten().any(|n| n == group),
        };
        if !known {
            let numbered_then_text = group.chars().next().is_some_and(|c| c.is_ascii_digit())
                && !group.chars().all(|c| c.is_ascii_digit());
            let hint = if numbered_then_text {
                format!(
                    " (to follow a group by text, write \"${{{}}}\")",
                    digits(group)
                )
            } else {
                String::new()
            };
            return Err(format!(
                "the substitution names group \"{group}\", which the pattern does not have{hint}"
            ));
        }
    }
    Ok(re)
}

/// The leading digits of `s`.
fn digits(s: &str) -> &str {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    &s[..end]
}

/// The group names a substitution refers to, as the `regex` crate reads them: `$$` is a `$`,
/// `${name}` and `$name` (the longest run of letters, digits and `_`) name a group.
fn references(substitution: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let mut rest = substitution;
    while let Some(at) = rest.find('$') {
        rest = &rest[at + 1..];
        if let Some(after) = rest.strip_prefix('$') {
            rest = after;
        } else if let Some(inner) = rest.strip_prefix('{') {
            let end = inner
                .find('}')
                .ok_or_else(|| "the substitution has a \"${\" without its \"}\"".to_string())?;
            out.push(&inner[..end]);
            rest = &inner[end + 1..];
        } else {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            if end > 0 {
                out.push(&rest[..end]);
            }
            rest = &rest[end..];
        }
    }
    Ok(out)
}

/// `text` on one line (the `regex` crate's errors draw the pattern over several).
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEEP: EscapedSlashes = EscapedSlashes::Keep;
    const REJECT: EscapedSlashes = EscapedSlashes::Reject;

    fn strip(prefix: &str) -> Rewrite {
        Rewrite::StripPrefix(prefix.into())
    }

    #[test]
    fn strip_prefix_keeps_the_rest_and_the_root() {
        let r = strip("/svc");
        assert_eq!(
            r.apply("/svc/a/b", REJECT).unwrap().as_deref(),
            Some("/a/b")
        );
        assert_eq!(r.apply("/svc", REJECT).unwrap().as_deref(), Some("/"));
        assert_eq!(r.apply("/svc/", REJECT).unwrap().as_deref(), Some("/"));
        let suffixed = Rewrite::Prefix("/api/orders".into(), "/orders/".into());
        assert_eq!(
            suffixed
                .apply("/api/orders.json", REJECT)
                .unwrap()
                .as_deref(),
            Some("/orders.json"),
            "a format suffix stays on its segment"
        );
        let to_root = Rewrite::Prefix("/api/orders".into(), "/".into());
        assert_eq!(
            to_root.apply("/api/orders.json", REJECT),
            Err(RewriteError::NotAbsolute)
        );
        assert_eq!(
            r.apply("/svc.json", REJECT),
            Err(RewriteError::NotAbsolute),
            "a stripped format suffix leaves no path"
        );
        // A root prefix strips nothing.
        assert_eq!(strip("").apply("/a", REJECT).unwrap(), None);
    }

    #[test]
    fn prefix_rewrite_replaces_the_prefix_with_one_slash_between() {
        let r = Rewrite::Prefix("/api/orders".into(), "/orders".into());
        assert_eq!(
            r.apply("/api/orders/7", REJECT).unwrap().as_deref(),
            Some("/orders/7")
        );
        assert_eq!(
            r.apply("/api/orders", REJECT).unwrap().as_deref(),
            Some("/orders")
        );
        let r = Rewrite::Prefix("/api".into(), "/v2/".into());
        assert_eq!(r.apply("/api/x", REJECT).unwrap().as_deref(), Some("/v2/x"));
        let r = Rewrite::Prefix("".into(), "/v1".into());
        assert_eq!(r.apply("/x", REJECT).unwrap().as_deref(), Some("/v1/x"));
    }

    #[test]
    fn regex_rewrite_replaces_matches_and_keeps_other_paths() {
        let re = compile("^/users/([0-9]+)/orders$", "/orders?user=$1", true).unwrap();
        let r = Rewrite::Regex(Box::new(re), "/orders?user=$1".into());
        assert_eq!(r.apply("/users/7/orders", REJECT), Err(RewriteError::Query));
        let re = compile("^/v1/(?P<rest>.*)$", "/v2/${rest}", true).unwrap();
        let r = Rewrite::Regex(Box::new(re), "/v2/${rest}".into());
        assert_eq!(
            r.apply("/v1/a/b", REJECT).unwrap().as_deref(),
            Some("/v2/a/b")
        );
        assert_eq!(r.apply("/other", REJECT).unwrap(), None);
    }

    #[test]
    fn a_result_normalization_would_refuse_is_refused() {
        let bad = [
            ("/x/../admin", "dot-segment"),
            ("//admin", "double slash"),
            ("/a%2Fb", "encoded slash under reject"),
            ("/a;b", "semicolon"),
            ("/a%41", "needless escape"),
            ("", "empty"),
            ("a", "relative"),
        ];
        for (out, why) in bad {
            assert!(check(out, REJECT).is_err(), "{why}: {out}");
        }
        assert!(
            check("/a%2Fb", KEEP).is_ok(),
            "kept escapes stay under keep"
        );
        assert!(check("/orders/7", REJECT).is_ok());
        let re = compile("^/(.*)$", "/x/$1/..", true).unwrap();
        let r = Rewrite::Regex(Box::new(re), "/x/$1/..".into());
        assert!(matches!(
            r.apply("/a", REJECT),
            Err(RewriteError::NotNormal(_))
        ));
    }

    #[test]
    fn patterns_and_substitutions_are_checked_when_loaded() {
        assert!(compile("(", "/", true)
            .unwrap_err()
            .contains("does not compile"));
        let e = compile("^/(a)$", "/$2", true).unwrap_err();
        assert!(e.contains("group \"2\""), "{e}");
        let e = compile("^/(a)$", "/$1x", true).unwrap_err();
        assert!(e.contains("${1}"), "{e}");
        assert!(compile("^/(?P<id>a)$", "/${id}/$$", true).is_ok());
        let e = compile(&"a".repeat(MAX_PATTERN + 1), "/", true).unwrap_err();
        assert!(e.contains("at most"), "{e}");
        let e = compile("^/(\\w{1000}){1000}$", "/", true).unwrap_err();
        assert!(e.contains("compiles to more than"), "{e}");
        assert!(compile("^/(a)$", "/${1", true)
            .unwrap_err()
            .contains("without"));
        let e = compile("^/(a)$", &"x".repeat(MAX_SUBSTITUTION + 1), true).unwrap_err();
        assert!(e.contains("substitution is"), "{e}");
        let insensitive = compile("^/api/(.*)$", "/$1", false).unwrap();
        assert!(
            insensitive.is_match("/API/x"),
            "a case-insensitive route's pattern"
        );
        let re = compile("[a-z]", "/0123456789", true).unwrap();
        let r = Rewrite::Regex(Box::new(re), "/0123456789".into());
        assert_eq!(
            r.apply(&format!("/{}", "a".repeat(1000)), KEEP),
            Err(RewriteError::TooLong)
        );
    }
}
