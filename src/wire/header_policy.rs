//! Request headers whose spelling makes a request mean one thing to floodgate and another to
//! the upstream: refused at admission ([`check`]) or tidied before forwarding
//! ([`for_upstream`]).
//!
//! - Underscores in names (`X_Floodgate_Key_Id`): CGI, WSGI and Rack upstreams turn `-` and
//!   `_` alike into `_` (`HTTP_X_FLOODGATE_KEY_ID`), so such a header reads as the real one.
//!   nginx drops them by default (`underscores_in_headers off`), Envoy can drop or refuse them
//!   (`headers_with_underscores_action`); floodgate drops them by default
//!   (`[server] headers_with_underscores`).
//! - A repeated or list-valued `Content-Length` (`5, 5`): RFC 9110 §8.6 lets a recipient
//!   collapse it, but a sender must not send it, and an upstream that reads the first line or
//!   refuses the list disagrees with one that collapses it about where the body ends.

use http::header::CONTENT_LENGTH;
use http::{HeaderMap, HeaderName, HeaderValue};
use pingora::http::RequestHeader;

use crate::wire::header_names::X_FORWARDED_FOR;

/// What to do with a request header whose name has an underscore:
/// `[server] headers_with_underscores`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Underscores {
    /// Forward the request without them (the default, as nginx does).
    #[default]
    Drop,
    /// Refuse the request (`400`).
    Reject,
    /// Forward them, all but the underscore spellings of the headers floodgate sets itself
    /// (`X-Forwarded-*`, `X-Request-Id`, `X-Floodgate-*`), which are dropped in every mode.
    Allow,
}

impl Underscores {
    /// Every mode with its gateway.toml name.
    pub const NAMES: &'static [(&'static str, Underscores)] = &[
        ("drop", Underscores::Drop),
        ("reject", Underscores::Reject),
        ("allow", Underscores::Allow),
    ];

    /// The name used in gateway.toml.
    pub fn as_str(self) -> &'static str {
        crate::text::names::name_of(Self::NAMES, self)
    }
}

/// Why a request's headers are refused; every one is answered `400`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// More than one `Content-Length` line, or a list in one.
    #[error("the request has more than one Content-Length value")]
    ContentLength,
    /// A name with `_`, with `headers_with_underscores = "reject"`.
    #[error("the request has a header whose name contains an underscore")]
    Underscore,
}

/// Refuses the header spellings of the module doc. Runs for every request: one look at
/// `Content-Length`, and a pass over the names only in `reject` mode.
pub fn check(headers: &HeaderMap, underscores: Underscores) -> Result<(), HeaderError> {
    let mut lengths = headers.get_all(CONTENT_LENGTH).iter();
    if let Some(first) = lengths.next() {
        if lengths.next().is_some() || first.as_bytes().contains(&b',') {
            return Err(HeaderError::ContentLength);
        }
    }
    if underscores == Underscores::Reject && headers.keys().any(has_underscore) {
        return Err(HeaderError::Underscore);
    }
    Ok(())
}

/// Tidies the client's headers in the request to the upstream; called first in
/// `upstream_request_filter`, before floodgate adds its own headers:
/// - names with `_` go (`drop`), or only those that spell a header floodgate sets (`allow`);
/// - several `X-Forwarded-For` lines become one, in order, so the chain floodgate extends is
///   the whole chain the client sent (appending to the first line alone dropped the rest).
pub fn for_upstream(req: &mut RequestHeader, underscores: Underscores) {
    // One pass over the names finds the usual case: nothing to do.
    if req.headers.keys().any(has_underscore) {
        let doomed: Vec<HeaderName> = req
            .headers
            .keys()
            .filter(|name| has_underscore(name))
            .filter(|name| underscores != Underscores::Allow || spells_our_header(name))
            .cloned()
            .collect();
        for name in &doomed {
            req.remove_header(name);
        }
    }
    merge_forwarded_for(req);
}

fn has_underscore(name: &HeaderName) -> bool {
    name.as_str().as_bytes().contains(&b'_')
}

/// Whether `name`, read with `_` as `-` (as CGI does), is a header floodgate sets.
fn spells_our_header(name: &HeaderName) -> bool {
    let dashed = name.as_str().replace('_', "-");
    dashed.starts_with("x-floodgate-")
        || dashed.starts_with("x-forwarded-")
        || dashed == "x-request-id"
}

/// Joins several `X-Forwarded-For` lines into one (RFC 9110 §5.3: a list's lines are one
/// list). The bytes are kept as sent, so an element floodgate cannot read still reaches the
/// upstream.
fn merge_forwarded_for(req: &mut RequestHeader) {
    let lines = req.headers.get_all(X_FORWARDED_FOR.name());
    if lines.iter().nth(1).is_none() {
        return;
    }
    let mut joined = Vec::new();
    for line in lines {
        if !joined.is_empty() {
            joined.extend_from_slice(b", ");
        }
        joined.extend_from_slice(line.as_bytes());
    }
    // Header values joined by ", " are a header value; should that ever fail, the lines stay.
    if let Ok(value) = HeaderValue::from_bytes(&joined) {
        let _ = X_FORWARDED_FOR.set_request(req, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_bytes(v).unwrap(),
            );
        }
        h
    }

    fn request(pairs: &[(&str, &[u8])]) -> RequestHeader {
        let mut req = RequestHeader::build("GET", b"/", None).unwrap();
        for (k, v) in pairs {
            req.append_header(k.to_string(), HeaderValue::from_bytes(v).unwrap())
                .unwrap();
        }
        req
    }

    fn names(req: &RequestHeader) -> Vec<&str> {
        let mut n: Vec<&str> = req.headers.keys().map(HeaderName::as_str).collect();
        n.sort_unstable();
        n
    }

    #[test]
    fn content_length_must_be_one_value() {
        let ok = headers(&[("content-length", b"5")]);
        assert_eq!(check(&ok, Underscores::Drop), Ok(()));
        assert_eq!(check(&HeaderMap::new(), Underscores::Drop), Ok(()));
        for bad in [
            headers(&[("content-length", b"5, 5")]),
            headers(&[("content-length", b"5,5")]),
            headers(&[("content-length", b"5"), ("content-length", b"5")]),
            headers(&[("content-length", b"0"), ("content-length", b"0")]),
        ] {
            assert_eq!(
                check(&bad, Underscores::Allow),
                Err(HeaderError::ContentLength),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn underscores_are_refused_only_in_reject_mode() {
        let h = headers(&[("x_user", b"a"), ("accept", b"*/*")]);
        assert_eq!(check(&h, Underscores::Reject), Err(HeaderError::Underscore));
        assert_eq!(check(&h, Underscores::Drop), Ok(()));
        assert_eq!(check(&h, Underscores::Allow), Ok(()));
        let clean = headers(&[("x-user", b"a")]);
        assert_eq!(check(&clean, Underscores::Reject), Ok(()));
    }

    #[test]
    fn underscore_headers_are_dropped_before_forwarding() {
        let sent: &[(&str, &[u8])] = &[
            ("X_Floodgate_Key_Id", b"admin"),
            ("x_forwarded_for", b"9.9.9.9"),
            ("X_Request_Id", b"forged"),
            ("x_custom", b"1"),
            ("x-custom", b"2"),
        ];
        let mut dropped = request(sent);
        for_upstream(&mut dropped, Underscores::Drop);
        assert_eq!(names(&dropped), ["x-custom"]);
        let mut allowed = request(sent);
        for_upstream(&mut allowed, Underscores::Allow);
        assert_eq!(names(&allowed), ["x-custom", "x_custom"]);
        // The wire form agrees with the map: the dropped names are not written either.
        let mut wire = Vec::new();
        dropped.header_to_h1_wire(&mut wire);
        let wire = String::from_utf8(wire).unwrap().to_ascii_lowercase();
        assert!(!wire.contains('_'), "{wire}");
    }

    #[test]
    fn forwarded_for_lines_are_joined_in_order() {
        let mut req = request(&[
            ("x-forwarded-for", b"1.2.3.4"),
            ("accept", b"*/*"),
            ("X-Forwarded-For", b"\xc3\xa9, 5.6.7.8"),
        ]);
        for_upstream(&mut req, Underscores::Drop);
        let lines: Vec<&[u8]> = req
            .headers
            .get_all(X_FORWARDED_FOR.name())
            .iter()
            .map(HeaderValue::as_bytes)
            .collect();
        assert_eq!(lines, [&b"1.2.3.4, \xc3\xa9, 5.6.7.8"[..]]);
        let mut one = request(&[("x-forwarded-for", b"1.2.3.4")]);
        for_upstream(&mut one, Underscores::Drop);
        assert_eq!(one.headers[X_FORWARDED_FOR.name()], "1.2.3.4");
    }

    #[test]
    fn names_round_trip() {
        for (name, mode) in Underscores::NAMES {
            assert_eq!(mode.as_str(), *name);
        }
        assert_eq!(Underscores::default(), Underscores::Drop);
    }
}
