//! One spelling per resource: the request path and host are normalized before routing, rule
//! matching and forwarding, so that `/orders/1`, `//orders/1`, `/x/../orders/1` and
//! `/%6frders/1` are charged as the same resource, and the upstream serves exactly the path
//! that was charged (a rate limit that a client can step around by re-spelling the path or the
//! host is not a limit).
//!
//! Spellings that frameworks disagree on are refused rather than guessed at (400): a backend
//! that reads `/orders;x` as `/orders` (servlet containers strip path parameters),
//! `/x\..\orders` as `/orders` (a backslash is a separator on Windows servers), `/orders%20`
//! as `/orders` (frameworks that trim segments) or `post` as `POST` would otherwise serve the
//! protected resource to a request floodgate routed and counted as something else.
//!
//! The functions are pure and run once per request: when the input is already in normal form
//! (the usual case) they return it borrowed, without allocating.

use std::borrow::Cow;
use std::net::Ipv6Addr;

use http::Method;

/// What to do with `%2F` (`/`), `%5C` (`\`) and `%3B` (`;`) in a path: `[server]
/// escaped_slashes`, and a route's own `escaped_slashes`.
///
/// An encoded slash is the classic way past path-based rules: the gateway sees one segment,
/// while an upstream (or a framework in front of it) that decodes it sees two. An encoded `;`
/// is the same trick for backends that decode before they strip path parameters
/// (`/orders%3Bx` is `/orders` to them). Spring's StrictHttpFirewall refuses all three;
/// Envoy's `path_with_escaped_slashes_action` offers the same choices for the first two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EscapedSlashes {
    /// Refuse the request (`400`): the default, as no ordinary client sends them.
    #[default]
    Reject,
    /// Leave them encoded (hex upper-cased): they are data inside a segment, not separators.
    Keep,
    /// Decode `%2F` to `/` before slashes are merged and dot-segments removed, so it separates
    /// segments like a literal one. `%5C` and `%3B` are still refused: a decoded backslash or
    /// `;` is as ambiguous as a literal one ([`PathError::Backslash`],
    /// [`PathError::PathParameter`]).
    Unescape,
}

impl EscapedSlashes {
    /// Every mode with its gateway.toml name: the one list that parsing, error messages and
    /// `as_str` read.
    pub const NAMES: &'static [(&'static str, EscapedSlashes)] = &[
        ("reject", EscapedSlashes::Reject),
        ("keep", EscapedSlashes::Keep),
        ("unescape", EscapedSlashes::Unescape),
    ];

    /// The name used in gateway.toml.
    pub fn as_str(self) -> &'static str {
        crate::text::names::name_of(Self::NAMES, self)
    }

    /// The mode a gateway.toml name stands for, `None` for any other text.
    pub fn from_name(name: &str) -> Option<EscapedSlashes> {
        Self::NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, mode)| *mode)
    }
}

/// Why a path cannot be normalized; every one is answered `400`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// A `%` not followed by two hex digits.
    #[error("the path has a malformed percent-encoding")]
    BadEscape,
    /// `%2F`, `%5C` or `%3B` with `escaped_slashes = "reject"`.
    #[error("the path has an encoded slash or semicolon (%2F, %5C or %3B)")]
    EscapedSlash,
    /// A non-empty path that does not start with `/`: the asterisk-form `*` of
    /// `OPTIONS * HTTP/1.1` (nginx answers it `400` too) or anything else no route can name.
    #[error("the path does not start with \"/\"")]
    NotAbsolute,
    /// A `\` (or a `%5C` decoded by `escaped_slashes = "unescape"`): Windows servers read it as
    /// `/`, others as data, so `/x\..\orders` is `/orders` to some and not to others.
    #[error("the path has a backslash")]
    Backslash,
    /// A `;`: servlet containers strip path parameters (`/orders;x` is `/orders`, `/x/..;/a`
    /// is `/a`), other servers do not. `%3B` follows [`EscapedSlashes`].
    #[error("the path has a \";\" (path parameters are not accepted)")]
    PathParameter,
    /// A control character, raw or percent-encoded (`%00`-`%1F`, `%7F`), or an unencoded
    /// space: C servers stop at `%00`, others strip or trim them.
    #[error("the path has a control character or an unencoded space")]
    ControlByte,
    /// `%20` at the start or end of a segment (a space in the request line arrives so too):
    /// frameworks that trim segments read `/orders%20` as `/orders`. Inside a segment
    /// (`/a%20b`) it is data.
    #[error("a path segment starts or ends with a space")]
    EdgeSpace,
    /// An overlong UTF-8 encoding (`%C0%AE` is `.` to a lenient decoder): no valid UTF-8 text
    /// is spelled so, and a decoder that accepts it sees dot-segments and slashes the
    /// gateway did not.
    #[error("the path has an overlong UTF-8 encoding")]
    Overlong,
    /// Under `escaped_slashes = "keep"`, an escaped `%2F`, `%5C` or `%3B` whose decoded reading
    /// (the one a backend that decodes it serves) is another route's, or matches other rules'
    /// paths: the gateway would route and count one resource and the backend serve another.
    #[error(
        "the path has an encoded slash, backslash or semicolon (%2F, %5C, %3B) that, decoded, \
         reads as another route's path"
    )]
    AmbiguousEscape,
}

/// Normalizes a request path (without its query) as RFC 3986 §6.2.2 describes: decodes
/// percent-encoded unreserved characters (`A-Z a-z 0-9 - . _ ~`), upper-cases the hex of the
/// encodings that remain, merges repeated slashes, and removes dot-segments (§5.2.4) *after*
/// decoding, so `%2e%2e` is `..`. `..` never climbs above the root. A trailing slash is kept
/// (`/orders/1/` stays; see [`trim_trailing_slash`] for the rule key). An empty path is `/`.
///
/// `%2F`/`%5C` follow `escaped`. Bytes that are not ASCII are left as they are (they cannot
/// form a dot-segment or a slash). The spellings of [`PathError`] are refused.
pub fn path(raw: &str, escaped: EscapedSlashes) -> Result<Cow<'_, str>, PathError> {
    if raw.is_empty() {
        return Ok(Cow::Borrowed("/"));
    }
    if !raw.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    let escapes = check_raw_bytes(raw)?;
    if !escapes && is_normal_path(raw) {
        return Ok(Cow::Borrowed(raw));
    }
    if escapes {
        let decoded = decode_path(raw, escaped)?;
        if has_edge_space(&decoded) {
            return Err(PathError::EdgeSpace);
        }
        Ok(Cow::Owned(remove_dot_segments(&decoded)))
    } else {
        Ok(Cow::Owned(remove_dot_segments(raw)))
    }
}

/// Refuses the raw bytes no path may have (`\`, `;`, control characters); `Ok(true)` when
/// the path has a `%` to decode. One pass over the bytes, as every request pays it.
fn check_raw_bytes(raw: &str) -> Result<bool, PathError> {
    let mut escapes = false;
    for &b in raw.as_bytes() {
        match b {
            b'%' => escapes = true,
            b'\\' => return Err(PathError::Backslash),
            b';' => return Err(PathError::PathParameter),
            0..=0x20 | 0x7f => return Err(PathError::ControlByte),
            _ => {}
        }
    }
    Ok(escapes)
}

/// Whether a segment of a decoded path starts or ends with `%20`.
fn has_edge_space(decoded: &str) -> bool {
    decoded
        .split('/')
        .any(|seg| seg.starts_with("%20") || seg.ends_with("%20"))
}

/// The segment check: no empty segment but a final one (a trailing slash), no `.`/`..`.
fn is_normal_path(raw: &str) -> bool {
    let mut segments = raw[1..].split('/').peekable();
    while let Some(seg) = segments.next() {
        let last = segments.peek().is_none();
        if (seg.is_empty() && !last) || seg == "." || seg == ".." {
            return false;
        }
    }
    true
}

/// Decodes unreserved characters, upper-cases the other escapes and applies `escaped` to
/// `%2F`/`%5C`. The output keeps a `%` only as the start of a valid upper-case escape, so
/// decoding it again changes nothing (no `%252e` turns into `.`).
fn decode_path(raw: &str, escaped: EscapedSlashes) -> Result<String, PathError> {
    let bytes = raw.as_bytes();
    let mut out = String::with_capacity(raw.len());
    let mut copied = 0;
    let mut i = 0;
    // The byte of the escape just before this one, if this one follows it directly.
    let mut previous: Option<u8> = None;
    while i < bytes.len() {
        if bytes[i] != b'%' {
            i += 1;
            previous = None;
            continue;
        }
        out.push_str(&raw[copied..i]);
        let (Some(hi), Some(lo)) = (
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) else {
            return Err(PathError::BadEscape);
        };
        let byte = hi << 4 | lo;
        if is_overlong(previous, byte) {
            return Err(PathError::Overlong);
        }
        match byte {
            0..=0x1f | 0x7f => return Err(PathError::ControlByte),
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(char::from(byte));
            }
            b'/' | b'\\' | b';' => match escaped {
                EscapedSlashes::Reject => return Err(PathError::EscapedSlash),
                EscapedSlashes::Keep => push_escape(&mut out, byte),
                EscapedSlashes::Unescape if byte == b'\\' => return Err(PathError::Backslash),
                EscapedSlashes::Unescape if byte == b';' => return Err(PathError::PathParameter),
                EscapedSlashes::Unescape => out.push('/'),
            },
            _ => push_escape(&mut out, byte),
        }
        i += 3;
        copied = i;
        previous = Some(byte);
    }
    out.push_str(&raw[copied..]);
    Ok(out)
}

/// Whether `byte`, decoded right after `previous`, makes an overlong UTF-8 form (RFC 3629 §4:
/// `C0`/`C1` lead bytes, `E0` before `80`-`9F`, `F0` before `80`-`8F`).
fn is_overlong(previous: Option<u8>, byte: u8) -> bool {
    matches!(byte, 0xc0 | 0xc1)
        || matches!(
            (previous, byte),
            (Some(0xe0), 0x80..=0x9f) | (Some(0xf0), 0x80..=0x8f)
        )
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn push_escape(out: &mut String, byte: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push('%');
    out.push(char::from(HEX[usize::from(byte >> 4)]));
    out.push(char::from(HEX[usize::from(byte & 0xf)]));
}

/// Merges slashes and removes `.`/`..` segments of `path` (which starts with `/`). Empty
/// segments are dropped before `..` is applied, as nginx's `merge_slashes` does, so `/a//..`
/// is `/`, not `/a/`. A path ending in `/`, `/.` or `/..` keeps a trailing slash (RFC 3986
/// §5.2.4 leaves one there too).
fn remove_dot_segments(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut trailing = false;
    let mut segments = path[1..].split('/').peekable();
    while let Some(seg) = segments.next() {
        let last = segments.peek().is_none();
        match seg {
            "" | "." => trailing = last,
            ".." => {
                // At the root there is nothing to climb out of.
                let parent = out.rfind('/').unwrap_or(0);
                out.truncate(parent);
                trailing = last;
            }
            _ => {
                out.push('/');
                out.push_str(seg);
                trailing = false;
            }
        }
    }
    if out.is_empty() || trailing {
        out.push('/');
    }
    out
}

/// The path without one trailing slash (the root stays `/`): what the `path` key part counts,
/// so `/orders/1/` and `/orders/1` share a counter. Expects a [`path`]-normalized path.
pub fn trim_trailing_slash(path: &str) -> &str {
    if path.len() > 1 {
        path.strip_suffix('/').unwrap_or(path)
    } else {
        path
    }
}

/// Why a Host header (or a target's authority) is refused; every one is answered `400`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// No host name (``, `:80`, `.`).
    #[error("the host is empty")]
    Empty,
    /// A colon with no port after it (`api.example.com:`).
    #[error("the host has an empty port")]
    EmptyPort,
    /// A port that is not a number from 0 to 65535.
    #[error("the host's port is not a number from 0 to 65535")]
    BadPort,
    /// `user@host`: no client has a reason to send credentials in a Host header.
    #[error("the host contains userinfo (@)")]
    Userinfo,
    /// A character a host name cannot hold (whitespace, `/`, `%`, control or non-ASCII bytes)
    /// or an empty label (`a..b`).
    #[error("the host contains a character or label a host name cannot have")]
    BadChar,
    /// A bracketed literal that is not an IPv6 address (`[v1.x]`, `[::1%eth0]`, `[::1`).
    #[error("the host is not a valid IPv6 literal")]
    BadIpLiteral,
    /// A name longer than [`MAX_HOST`] bytes: no DNS name is, and every byte of one is
    /// compared, hashed and (on an upstream error) logged.
    #[error("the host is longer than 253 characters")]
    TooLong,
}

/// Longest host name accepted, without port and trailing dot: the longest DNS name
/// (RFC 1035 §2.3.4, 255 octets on the wire, 253 characters as text).
pub const MAX_HOST: usize = 253;

/// Longest Host value looked at: [`MAX_HOST`], a trailing dot and `:65535`.
const MAX_HOST_VALUE: usize = MAX_HOST + 1 + 6;

/// Normalizes a Host header value or URI authority to the host that rules and routes compare:
/// lower-case, without the port, without one trailing dot (`API.Example.com.:8080` is
/// `api.example.com`).
///
/// IPv6 literals come out in brackets, in the canonical text of RFC 5952
/// (`[0:0::1]:8080` is `[::1]`), which keeps them apart from a port and matches how they are
/// written in a URL. A bare IPv6 address (`::1`, as an operator may write a config `host`) is
/// accepted and bracketed, so a config value normalized with this function compares equal to
/// every request spelling of the same host.
///
/// The host must be a reg-name of unreserved and sub-delim characters (RFC 3986 §3.2.2)
/// without empty labels; `%` (percent-encoded names) and non-ASCII (IDNs travel as punycode)
/// are refused. Surrounding whitespace is refused too: HTTP parsers strip it before this runs.
pub fn host(raw: &str) -> Result<Cow<'_, str>, HostError> {
    if raw.len() > MAX_HOST_VALUE {
        return Err(HostError::TooLong);
    }
    // One pass finds what the rare spellings need (a userinfo `@`, the colons of an IPv6
    // literal or a port): this runs on every request.
    let mut userinfo = false;
    let mut colons = 0usize;
    let mut first_colon = None;
    for (i, &b) in raw.as_bytes().iter().enumerate() {
        match b {
            b'@' => userinfo = true,
            b':' => {
                first_colon.get_or_insert(i);
                colons += 1;
            }
            _ => {}
        }
    }
    if userinfo {
        return Err(HostError::Userinfo);
    }
    if let Some(rest) = raw.strip_prefix('[') {
        let (literal, after) = rest.split_once(']').ok_or(HostError::BadIpLiteral)?;
        check_port(after)?;
        let ip: Ipv6Addr = literal.parse().map_err(|_| HostError::BadIpLiteral)?;
        return Ok(Cow::Owned(format!("[{ip}]")));
    }
    if colons > 1 {
        let ip: Ipv6Addr = raw.parse().map_err(|_| HostError::BadChar)?;
        return Ok(Cow::Owned(format!("[{ip}]")));
    }
    let (name, port) = match first_colon {
        Some(at) => raw.split_at(at),
        None => (raw, ""),
    };
    check_port(port)?;
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() {
        return Err(HostError::Empty);
    }
    if name.len() > MAX_HOST {
        return Err(HostError::TooLong);
    }
    // Labels are checked in the same pass as their bytes: an empty one is a dot at the start,
    // after another dot or at the end.
    let mut upper = false;
    let mut after_dot = true;
    for b in name.bytes() {
        match b {
            b'.' if after_dot => return Err(HostError::BadChar),
            b'.' => {
                after_dot = true;
                continue;
            }
            b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'~' => {}
            b'A'..=b'Z' => upper = true,
            b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'=' => {}
            _ => return Err(HostError::BadChar),
        }
        after_dot = false;
    }
    if after_dot {
        return Err(HostError::BadChar);
    }
    if upper {
        Ok(Cow::Owned(name.to_ascii_lowercase()))
    } else {
        Ok(Cow::Borrowed(name))
    }
}

/// Whether `method` is spelled as methods are: upper-case letters, `-` and `_`, as every
/// registered method is (RFC 9110 §9.1: methods are case-sensitive). `post` is not `POST`
/// to a route or rule with `methods = ["POST"]`, but many servers upper-case it (or answer
/// 400, as nginx does): refused, it cannot reach one as `POST` uncounted.
pub fn method_is_canonical(method: &Method) -> bool {
    method
        .as_str()
        .bytes()
        .all(|b| b.is_ascii_uppercase() || b == b'-' || b == b'_')
}

/// `after` is what follows the host: nothing, or `:` and a port of 0..=65535.
fn check_port(after: &str) -> Result<(), HostError> {
    if after.is_empty() {
        return Ok(());
    }
    let port = after.strip_prefix(':').ok_or(HostError::BadIpLiteral)?;
    if port.is_empty() {
        return Err(HostError::EmptyPort);
    }
    if !port.bytes().all(|b| b.is_ascii_digit()) || port.parse::<u16>().is_err() {
        return Err(HostError::BadPort);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(raw: &str, mode: EscapedSlashes) -> Result<String, PathError> {
        path(raw, mode).map(Cow::into_owned)
    }

    fn p(raw: &str) -> String {
        norm(raw, EscapedSlashes::Reject).unwrap()
    }

    #[test]
    fn normal_paths_are_borrowed_unchanged() {
        for raw in [
            "/",
            "/orders",
            "/orders/1",
            "/orders/1/",
            "/a.b/..c/...",
            "/~x_y-z",
        ] {
            let got = path(raw, EscapedSlashes::Reject).unwrap();
            assert!(matches!(got, Cow::Borrowed(_)), "{raw}");
            assert_eq!(got, raw);
        }
    }

    #[test]
    fn trailing_slash_is_kept_and_slashes_merged() {
        assert_eq!(p("/orders/1/"), "/orders/1/");
        assert_eq!(p("/orders/1//"), "/orders/1/");
        assert_eq!(p("//orders"), "/orders");
        assert_eq!(p("///"), "/");
        assert_eq!(p("/a//b///c"), "/a/b/c");
    }

    #[test]
    fn dot_segments_are_removed_without_escaping_the_root() {
        assert_eq!(p("/a/./b/../c"), "/a/c");
        assert_eq!(p("/../../etc"), "/etc");
        assert_eq!(p("/.."), "/");
        assert_eq!(p("/."), "/");
        assert_eq!(p("/a/b/.."), "/a/");
        assert_eq!(p("/a/b/."), "/a/b/");
        assert_eq!(p("/a//.."), "/");
        assert_eq!(p("/a/..b/c.."), "/a/..b/c..");
    }

    #[test]
    fn unreserved_escapes_are_decoded_before_dot_removal() {
        assert_eq!(p("/%6Frders"), "/orders");
        assert_eq!(p("/%6frders"), "/orders");
        assert_eq!(p("/%2e%2e/x"), "/x");
        assert_eq!(p("/a/%2E/b/%2e%2E/c"), "/a/c");
        assert_eq!(p("/%7e"), "/~");
        assert_eq!(p("/%7E"), "/~");
        assert_eq!(p("/%3a"), "/%3A");
        assert_eq!(p("/%25"), "/%25");
        // %25 is never decoded, so a second pass cannot turn %252e into a dot.
        assert_eq!(p("/%252e%252e/x"), "/%252e%252e/x");
        assert_eq!(p("/caf%c3%a9"), "/caf%C3%A9");
    }

    #[test]
    fn encoded_slashes_follow_the_mode() {
        use EscapedSlashes::*;
        assert_eq!(norm("/a%2fb", Reject), Err(PathError::EscapedSlash));
        assert_eq!(norm("/a%5Cb", Reject), Err(PathError::EscapedSlash));
        assert_eq!(norm("/a%2fb", Keep).unwrap(), "/a%2Fb");
        assert_eq!(norm("/a%5cb", Keep).unwrap(), "/a%5Cb");
        assert_eq!(norm("/a%2fb", Unescape).unwrap(), "/a/b");
        // A decoded backslash is as ambiguous as a literal one.
        assert_eq!(norm("/a%5cb", Unescape), Err(PathError::Backslash));
        // Decoded slashes merge and separate dot-segments like literal ones.
        assert_eq!(norm("/a%2f%2f..%2fb", Unescape).unwrap(), "/b");
        assert_eq!(norm("/a/..%2f..%2fb", Keep).unwrap(), "/a/..%2F..%2Fb");
        // `%3B` as the slashes: refused, kept, or (decoded, a path parameter) refused.
        for semicolon in ["/orders%3Bx", "/orders%3bx"] {
            assert_eq!(norm(semicolon, Reject), Err(PathError::EscapedSlash));
            assert_eq!(norm(semicolon, Keep).unwrap(), "/orders%3Bx");
            assert_eq!(norm(semicolon, Unescape), Err(PathError::PathParameter));
        }
    }

    #[test]
    fn malformed_escapes_and_odd_forms_are_errors() {
        for bad in ["/%zz", "/%4", "/%", "/a%g1", "/%%41"] {
            assert_eq!(
                norm(bad, EscapedSlashes::Keep),
                Err(PathError::BadEscape),
                "{bad}"
            );
        }
        assert_eq!(
            norm("*", EscapedSlashes::Reject),
            Err(PathError::NotAbsolute)
        );
        assert_eq!(
            norm("orders", EscapedSlashes::Reject),
            Err(PathError::NotAbsolute)
        );
        assert_eq!(p(""), "/");
    }

    #[test]
    fn spellings_frameworks_disagree_on_are_refused() {
        use EscapedSlashes::*;
        for mode in [Reject, Keep, Unescape] {
            for (raw, want) in [
                ("/x\\..\\orders", PathError::Backslash),
                ("/orders\\", PathError::Backslash),
                ("/orders;x", PathError::PathParameter),
                ("/x/..;/orders", PathError::PathParameter),
                ("/orders;", PathError::PathParameter),
                ("/orders%00", PathError::ControlByte),
                ("/orders%0a", PathError::ControlByte),
                ("/orders%0D%0A", PathError::ControlByte),
                ("/orders%09", PathError::ControlByte),
                ("/orders%1f", PathError::ControlByte),
                ("/orders%7F", PathError::ControlByte),
                ("/orders\0", PathError::ControlByte),
                ("/orders\t", PathError::ControlByte),
                ("/orders x", PathError::ControlByte),
                ("/orders\x7f", PathError::ControlByte),
                ("/orders%20", PathError::EdgeSpace),
                ("/%20orders", PathError::EdgeSpace),
                ("/orders%20/1", PathError::EdgeSpace),
                ("/orders/%20", PathError::EdgeSpace),
                ("/%c0%ae%c0%ae/orders", PathError::Overlong),
                ("/%C0%AF", PathError::Overlong),
                ("/%c1%9c", PathError::Overlong),
                ("/%e0%80%ae", PathError::Overlong),
                ("/%f0%80%80%ae", PathError::Overlong),
            ] {
                assert_eq!(norm(raw, mode), Err(want), "{raw:?} with {mode:?}");
            }
        }
        // Data, not separators: kept as sent (hex upper-cased).
        assert_eq!(p("/a%20b"), "/a%20b");
        assert_eq!(
            norm("/orders%3bx", EscapedSlashes::Keep).unwrap(),
            "/orders%3Bx"
        );
        assert_eq!(p("/caf%C3%A9"), "/caf%C3%A9");
        assert_eq!(p("/%e0%a0%80"), "/%E0%A0%80");
        assert_eq!(p("/%f0%90%80%80"), "/%F0%90%80%80");
        assert_eq!(p("/%c2%80"), "/%C2%80");
        // Non-ASCII text is left as it is.
        assert_eq!(p("/caf\u{e9}"), "/caf\u{e9}");
    }

    #[test]
    fn methods_must_be_upper_case_tokens() {
        for ok in ["GET", "POST", "PROPFIND", "M-SEARCH", "X_Y"] {
            let m = Method::from_bytes(ok.as_bytes()).unwrap();
            assert!(method_is_canonical(&m), "{ok}");
        }
        for bad in ["post", "Post", "gEt", "GET1", "G.T", "GET!"] {
            let m = Method::from_bytes(bad.as_bytes()).unwrap();
            assert!(!method_is_canonical(&m), "{bad}");
        }
    }

    #[test]
    fn trim_trailing_slash_keeps_the_root() {
        assert_eq!(trim_trailing_slash("/orders/1/"), "/orders/1");
        assert_eq!(trim_trailing_slash("/orders/1"), "/orders/1");
        assert_eq!(trim_trailing_slash("/"), "/");
    }

    #[test]
    fn escaped_slashes_names_round_trip() {
        for (name, mode) in EscapedSlashes::NAMES {
            assert_eq!(mode.as_str(), *name);
            assert_eq!(EscapedSlashes::from_name(name), Some(*mode));
        }
        assert_eq!(EscapedSlashes::from_name("Reject"), None);
        assert_eq!(EscapedSlashes::default(), EscapedSlashes::Reject);
    }

    #[test]
    fn hosts_lose_case_port_and_trailing_dot() {
        let h = |raw| host(raw).unwrap().into_owned();
        assert_eq!(h("api.example.com"), "api.example.com");
        assert!(matches!(host("api.example.com").unwrap(), Cow::Borrowed(_)));
        assert_eq!(h("API.Example.COM"), "api.example.com");
        assert_eq!(h("api.example.com:8080"), "api.example.com");
        assert_eq!(h("api.example.com."), "api.example.com");
        assert_eq!(h("Api.Example.com.:443"), "api.example.com");
        assert_eq!(h("127.0.0.1:80"), "127.0.0.1");
        assert_eq!(h("localhost:0"), "localhost");
    }

    #[test]
    fn ipv6_literals_are_bracketed_and_canonical() {
        let h = |raw| host(raw).unwrap().into_owned();
        assert_eq!(h("[::1]"), "[::1]");
        assert_eq!(h("[::1]:8080"), "[::1]");
        assert_eq!(h("[0:0:0::1]"), "[::1]");
        assert_eq!(h("[2001:DB8::A]:443"), "[2001:db8::a]");
        // A config value written without brackets means the same host.
        assert_eq!(h("::1"), "[::1]");
        assert_eq!(host("[::1"), Err(HostError::BadIpLiteral));
        assert_eq!(host("[v1.x]"), Err(HostError::BadIpLiteral));
        assert_eq!(host("[::1]x"), Err(HostError::BadIpLiteral));
        assert_eq!(host("[::1]:"), Err(HostError::EmptyPort));
    }

    /// `host` as it was written before its checks shared one pass over the bytes: the
    /// one-pass version must answer every input alike.
    fn host_reference(raw: &str) -> Result<Cow<'_, str>, HostError> {
        if raw.len() > MAX_HOST_VALUE {
            return Err(HostError::TooLong);
        }
        if raw.contains('@') {
            return Err(HostError::Userinfo);
        }
        if let Some(rest) = raw.strip_prefix('[') {
            let (literal, after) = rest.split_once(']').ok_or(HostError::BadIpLiteral)?;
            check_port(after)?;
            let ip: Ipv6Addr = literal.parse().map_err(|_| HostError::BadIpLiteral)?;
            return Ok(Cow::Owned(format!("[{ip}]")));
        }
        if raw.bytes().filter(|&b| b == b':').count() > 1 {
            let ip: Ipv6Addr = raw.parse().map_err(|_| HostError::BadChar)?;
            return Ok(Cow::Owned(format!("[{ip}]")));
        }
        let (name, port) = match raw.find(':') {
            Some(at) => raw.split_at(at),
            None => (raw, ""),
        };
        check_port(port)?;
        let name = name.strip_suffix('.').unwrap_or(name);
        if name.is_empty() {
            return Err(HostError::Empty);
        }
        if name.len() > MAX_HOST {
            return Err(HostError::TooLong);
        }
        let mut upper = false;
        for label in name.split('.') {
            if label.is_empty() {
                return Err(HostError::BadChar);
            }
            for b in label.bytes() {
                match b {
                    b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'~' => {}
                    b'A'..=b'Z' => upper = true,
                    b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'=' => {
                    }
                    _ => return Err(HostError::BadChar),
                }
            }
        }
        if upper {
            Ok(Cow::Owned(name.to_ascii_lowercase()))
        } else {
            Ok(Cow::Borrowed(name))
        }
    }

    #[test]
    fn the_one_pass_host_check_answers_as_the_reference() {
        // Every string of up to 5 bytes over the bytes the checks branch on, and longer names.
        const ALPHABET: &[u8] = b"a.A:@[]1-$ ";
        let mut inputs: Vec<String> = vec![String::new()];
        let mut last: Vec<String> = vec![String::new()];
        for _ in 0..5 {
            let mut next = Vec::new();
            for s in &last {
                for &b in ALPHABET {
                    let mut t = s.clone();
                    t.push(b as char);
                    next.push(t);
                }
            }
            inputs.extend(next.iter().cloned());
            last = next;
        }
        for extra in [
            "api.example.com",
            "API.example.com.:8080",
            "[2001:db8::1]:443",
            "2001:db8::1",
            "a..b",
            ".a",
            "a.",
            "a..",
            "a.b.:80",
        ] {
            inputs.push(extra.to_string());
        }
        inputs.push("a".repeat(MAX_HOST + 1));
        inputs.push("a".repeat(MAX_HOST_VALUE + 1));
        for raw in &inputs {
            assert_eq!(host(raw), host_reference(raw), "{raw:?}");
        }
    }

    #[test]
    fn bad_hosts_are_refused() {
        assert_eq!(host(""), Err(HostError::Empty));
        assert_eq!(host(":80"), Err(HostError::Empty));
        assert_eq!(host("."), Err(HostError::Empty));
        assert_eq!(host("api.example.com:"), Err(HostError::EmptyPort));
        assert_eq!(host(":abc"), Err(HostError::BadPort));
        assert_eq!(host("a:abc"), Err(HostError::BadPort));
        assert_eq!(host("a:65536"), Err(HostError::BadPort));
        assert_eq!(host("a:+80"), Err(HostError::BadPort));
        assert_eq!(host("user@host"), Err(HostError::Userinfo));
        // At most a DNS name's 253 characters, with or without port and trailing dot.
        let longest = [
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(61),
        ]
        .join(".");
        assert_eq!(longest.len(), MAX_HOST);
        assert_eq!(host(&longest).unwrap(), longest.as_str());
        assert_eq!(
            host(&format!("{longest}.:65535")).unwrap(),
            longest.as_str()
        );
        assert_eq!(host(&format!("{longest}e")), Err(HostError::TooLong));
        assert_eq!(host(&format!("{longest}e:1")), Err(HostError::TooLong));
        assert_eq!(host(&"a".repeat(64 * 1024)), Err(HostError::TooLong));
        for bad in [
            "a b", " a", "a\t", "a/b", "a\\b", "a\0", "a\r\nb", "a%41", "é.com", "a..b", ".a",
            "a..", "a:b:c",
        ] {
            assert_eq!(host(bad), Err(HostError::BadChar), "{bad:?}");
        }
    }
}
