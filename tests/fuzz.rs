//! Property tests for every parser that faces the network or a file:
//! path and host normalization, X-Forwarded-For, durations, the config loader on mutated
//! shipped configs, the RESP reply parser, and the RateLimit header fields. Each runs
//! thousands of generated cases; none may panic, and each checks the property a user relies
//! on (one spelling per path, limits keyed on the right client, errors that point at a line,
//! headers that a structured-field parser accepts).

use std::borrow::Cow;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use floodgate::config::duration::parse_duration;
use floodgate::config::Config;
use floodgate::limiter::redis::resp::{self, Reply};
use floodgate::limiter::{Algorithm, Decision, Limit};
use floodgate::metrics::RuleCounters;
use floodgate::rules::{Policy, Scope};
use floodgate::wire::normalize::{self, EscapedSlashes};
use floodgate::wire::response::{ceil_secs, RateLimitHeaders, SF_INTEGER_MAX};
use http::{HeaderMap, HeaderValue};
use ipnet::IpNet;
use proptest::prelude::*;
use redis::Value;

/// `cases` generated inputs; failures are reported with the shrunk input rather than saved
/// into the shared source tree.
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

const MODES: [EscapedSlashes; 3] = [
    EscapedSlashes::Reject,
    EscapedSlashes::Keep,
    EscapedSlashes::Unescape,
];

// ---------------------------------------------------------------------------------------------
// Paths

/// Path-shaped strings built from the pieces that matter: slashes, dots, their encodings in
/// both cases, other escapes, malformed escapes, backslashes, path parameters, controls,
/// spaces, overlong UTF-8 and non-ASCII.
fn path_like() -> impl Strategy<Value = String> {
    let piece = prop::sample::select(vec![
        "/",
        "/",
        "/",
        ".",
        "..",
        "%2e",
        "%2E",
        "%2f",
        "%2F",
        "%5c",
        "%5C",
        "%25",
        "%",
        "%4",
        "%zz",
        "%41",
        "%6f",
        "%7e",
        "%3a",
        "%c3%a9",
        "a",
        "b",
        "orders",
        "1",
        "~",
        "-",
        "_",
        "\\",
        "é",
        "?",
        ";",
        ":",
        "%3b",
        "%20",
        "%00",
        "%0a",
        "%7f",
        "%c0%ae",
        "%e0%80%ae",
        "%e0%a0%80",
        "%f0%8f",
        "\t",
    ]);
    (
        prop::bool::weighted(0.9),
        prop::collection::vec(piece, 0..24),
    )
        .prop_map(|(slash, pieces)| {
            let mut s = String::from(if slash { "/" } else { "" });
            for p in pieces {
                s.push_str(p);
            }
            s
        })
}

/// What a path means, computed the slow and obvious way: refuse what frameworks disagree on
/// (`\`, `;`, controls and spaces, edge `%20`, overlong UTF-8), decode every escape this mode
/// decodes, split on `/`, drop empty and `.` segments, let `..` pop (never past the root).
fn reference_segments(raw: &str, mode: EscapedSlashes) -> Option<(Vec<String>, bool)> {
    let mut decoded = String::new();
    let b = raw.as_bytes();
    let mut i = 0;
    let mut previous_escape: Option<u8> = None;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = raw.get(i + 1..i + 3)?;
            let v = u8::from_str_radix(hex, 16).ok()?;
            if !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
                return None;
            }
            let overlong = matches!(v, 0xc0 | 0xc1)
                || (previous_escape == Some(0xe0) && (0x80..0xa0).contains(&v))
                || (previous_escape == Some(0xf0) && (0x80..0x90).contains(&v));
            if overlong || v < 0x20 || v == 0x7f {
                return None;
            }
            let c = char::from(v);
            let slash = c == '/' || c == '\\';
            let unreserved = c.is_ascii_alphanumeric() || "-._~".contains(c);
            // `%3B` goes with the slashes (backends that decode before routing read a path
            // parameter there). Unescape decodes %2F only: a decoded backslash or semicolon is
            // refused like a literal one.
            let refused = match mode {
                EscapedSlashes::Reject => slash || c == ';',
                EscapedSlashes::Unescape => c == '\\' || c == ';',
                EscapedSlashes::Keep => false,
            };
            if refused {
                return None;
            } else if unreserved || (slash && mode == EscapedSlashes::Unescape) {
                decoded.push(c);
            } else {
                decoded.push_str(&format!("%{v:02X}"));
            }
            previous_escape = Some(v);
            i += 3;
        } else {
            let c = raw[i..].chars().next()?;
            if c == '\\' || c == ';' || c <= ' ' || c == '\u{7f}' {
                return None;
            }
            decoded.push(c);
            previous_escape = None;
            i += c.len_utf8();
        }
    }
    if decoded
        .split('/')
        .any(|seg| seg.starts_with("%20") || seg.ends_with("%20"))
    {
        return None;
    }
    let mut stack: Vec<String> = Vec::new();
    let segments: Vec<&str> = decoded[1..].split('/').collect();
    let mut trailing = false;
    for (n, seg) in segments.iter().enumerate() {
        let last = n + 1 == segments.len();
        match *seg {
            "" | "." => trailing = last,
            ".." => {
                stack.pop();
                trailing = last;
            }
            s => {
                stack.push(s.to_string());
                trailing = false;
            }
        }
    }
    Some((stack, trailing))
}

/// The properties every normalized path has, whatever the input.
fn assert_normal(out: &str) {
    assert!(out.starts_with('/'), "{out:?} does not start with /");
    assert!(!out.contains("//"), "{out:?} has an empty segment");
    for seg in out.split('/') {
        assert!(seg != "." && seg != "..", "{out:?} has a dot-segment");
    }
    // What remains encoded is upper-case hex and never an unreserved character.
    let b = out.as_bytes();
    for (i, _) in out.match_indices('%') {
        let hex = &b[i + 1..i + 3];
        assert!(
            hex.iter()
                .all(|c| c.is_ascii_digit() || (b'A'..=b'F').contains(c)),
            "{out:?}"
        );
        let v = u8::from_str_radix(std::str::from_utf8(hex).unwrap(), 16).unwrap();
        assert!(
            !(v.is_ascii_alphanumeric() || b"-._~".contains(&v)),
            "{out:?} keeps an unreserved escape"
        );
    }
}

fn check_path(raw: &str) {
    for mode in MODES {
        match normalize::path(raw, mode) {
            Ok(out) => {
                assert_normal(&out);
                // Idempotent: the output is its own normal form, and the fast check sees it.
                let again = normalize::path(&out, mode).expect("normalized path refused");
                assert_eq!(again, out, "not idempotent for {raw:?} ({mode:?})");
                if !out.contains('%') {
                    assert!(
                        matches!(again, Cow::Borrowed(_)),
                        "{out:?} missed the fast path"
                    );
                }
                // Never above the root, and the same segments as the obvious resolution.
                if raw.starts_with('/') {
                    let (segments, trailing) =
                        reference_segments(raw, mode).expect("reference refused what path took");
                    let mut want = String::new();
                    for s in &segments {
                        want.push('/');
                        want.push_str(s);
                    }
                    if want.is_empty() || trailing {
                        want.push('/');
                    }
                    assert_eq!(out, want, "{raw:?} ({mode:?})");
                }
                let key = normalize::trim_trailing_slash(&out);
                assert!(key == "/" || !key.ends_with('/'));
                assert!(key.starts_with('/'));
            }
            Err(_) => {
                if raw.starts_with('/') {
                    assert!(
                        reference_segments(raw, mode).is_none(),
                        "{raw:?} ({mode:?}) refused but well-formed"
                    );
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(config(5000))]

    #[test]
    fn path_normalization_on_path_shaped_input(raw in path_like()) {
        check_path(&raw);
    }

    #[test]
    fn path_normalization_on_arbitrary_strings(raw in any::<String>()) {
        check_path(&raw);
        let slashed = format!("/{raw}");
        check_path(&slashed);
    }

    #[test]
    fn path_normalization_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        check_path(&String::from_utf8_lossy(&bytes));
    }

    /// `..` in any spelling, however many, never climbs above the root: the climb is a no-op
    /// and the path is what follows it.
    #[test]
    fn dot_dot_never_escapes_the_root(ups in 1usize..8, tail in path_like()) {
        let dots = ["..", "%2e%2e", "%2E.", ".%2e"];
        let mut raw = String::new();
        for i in 0..ups {
            raw.push('/');
            raw.push_str(dots[i % dots.len()]);
        }
        let rest = format!("/etc/passwd{tail}");
        raw.push_str(&rest);
        for mode in MODES {
            prop_assert_eq!(normalize::path(&raw, mode), normalize::path(&rest, mode));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Hosts

fn host_like() -> impl Strategy<Value = String> {
    let piece = prop::sample::select(vec![
        "a",
        "B",
        "z",
        "0",
        "9",
        "-",
        "_",
        ".",
        ".",
        ":",
        "::",
        "[",
        "]",
        "@",
        "%",
        " ",
        "/",
        "\\",
        "\t",
        "\0",
        "é",
        "1",
        "80",
        "65535",
        "65536",
        "ffff",
        "127.0.0.1",
        "::1",
        "!",
        "*",
    ]);
    prop::collection::vec(piece, 0..16).prop_map(|p| p.concat())
}

fn check_host(raw: &str) {
    if let Ok(out) = normalize::host(raw) {
        assert!(!out.is_empty(), "{raw:?}");
        assert_eq!(out, out.to_ascii_lowercase(), "{raw:?} not lower-cased");
        assert!(!out.ends_with('.'), "{raw:?} kept a trailing dot");
        if let Some(inner) = out.strip_prefix('[') {
            let inner = inner.strip_suffix(']').expect("bracket without its pair");
            assert!(inner.parse::<std::net::Ipv6Addr>().is_ok(), "{out:?}");
        } else {
            assert!(!out.contains(':'), "{raw:?} kept a port");
        }
        let again = normalize::host(&out).expect("normalized host refused");
        assert_eq!(again, out, "not idempotent for {raw:?}");
        assert!(matches!(again, Cow::Borrowed(_)) || out.starts_with('['));
    }
}

proptest! {
    #![proptest_config(config(5000))]

    #[test]
    fn host_normalization_on_host_shaped_input(raw in host_like()) {
        check_host(&raw);
    }

    #[test]
    fn host_normalization_on_arbitrary_strings(raw in any::<String>()) {
        check_host(&raw);
    }

    /// Every spelling of one host (case, trailing dot, any port) is the same host.
    #[test]
    fn host_spellings_agree(
        labels in prop::collection::vec("[a-zA-Z0-9_-]{1,12}", 1..5),
        dot in any::<bool>(),
        port in prop::option::of(any::<u16>()),
    ) {
        let name = labels.join(".");
        let mut raw = name.clone();
        if dot {
            raw.push('.');
        }
        if let Some(p) = port {
            raw.push_str(&format!(":{p}"));
        }
        prop_assert_eq!(normalize::host(&raw).unwrap(), name.to_ascii_lowercase());
    }

    #[test]
    fn ipv6_host_spellings_agree(ip in any::<std::net::Ipv6Addr>(), port in prop::option::of(any::<u16>())) {
        let want = format!("[{ip}]");
        let mut raw = want.to_ascii_uppercase();
        if let Some(p) = port {
            raw.push_str(&format!(":{p}"));
        }
        prop_assert_eq!(normalize::host(&raw).unwrap(), want.clone());
        let bare = ip.to_string();
        prop_assert_eq!(normalize::host(&bare).unwrap(), want);
    }
}

// ---------------------------------------------------------------------------------------------
// X-Forwarded-For

fn ip_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<std::net::Ipv4Addr>().prop_map(|ip| ip.to_string()),
        any::<std::net::Ipv6Addr>().prop_map(|ip| ip.to_string()),
        any::<std::net::Ipv4Addr>().prop_map(|ip| format!("::ffff:{ip}")),
        prop::sample::select(vec![
            "10.0.0.1",
            "10.1.2.3",
            "127.0.0.1",
            "::1",
            "192.168.0.1",
            "2001:db8::1"
        ])
        .prop_map(String::from),
    ]
}

fn hop() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => ip_text(),
        1 => ip_text().prop_map(|ip| format!("[{ip}]:443")),
        1 => any::<std::net::Ipv4Addr>().prop_map(|ip| format!("{ip}:8080")),
        1 => "[ -~]{0,12}".prop_map(|s| s.replace(',', "")),
        1 => Just(String::new()),
        1 => Just("unknown".to_string()),
    ]
}

fn xff_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => prop::collection::vec((hop(), prop::sample::select(vec![",", ", ", " ,", ",,"])), 0..6)
            .prop_map(|hops| {
                let mut s = String::new();
                for (h, sep) in hops {
                    s.push_str(&h);
                    s.push_str(sep);
                }
                s.into_bytes()
            }),
        1 => prop::collection::vec(any::<u8>(), 0..40),
    ]
}

fn trusted_nets() -> impl Strategy<Value = Vec<IpNet>> {
    prop::collection::vec(
        prop::sample::select(vec![
            "10.0.0.0/8",
            "127.0.0.0/8",
            "192.168.0.0/16",
            "0.0.0.0/0",
            "::/0",
            "::1/128",
            "2001:db8::/32",
        ]),
        0..4,
    )
    .prop_map(|nets| nets.iter().map(|n| n.parse().unwrap()).collect())
}

/// Every address an XFF header could be read as naming, generously (with or without port or
/// brackets, and the IPv4 form of a mapped address).
fn addresses_in(headers: &HeaderMap) -> Vec<IpAddr> {
    let mut found = Vec::new();
    for value in headers.get_all("x-forwarded-for") {
        let text = String::from_utf8_lossy(value.as_bytes());
        for hop in text.split(',') {
            let hop = hop.trim();
            let mut candidates = vec![hop];
            if let Some(rest) = hop.strip_prefix('[') {
                candidates.push(rest.split(']').next().unwrap_or(rest));
            }
            if let Some((h, _)) = hop.rsplit_once(':') {
                candidates.push(h);
            }
            for c in candidates {
                if let Ok(ip) = c.parse::<IpAddr>() {
                    found.push(ip);
                    found.push(ip.to_canonical());
                }
            }
        }
    }
    found
}

proptest! {
    #![proptest_config(config(4000))]

    #[test]
    fn xff_yields_the_peer_or_an_address_from_the_header(
        peer in ip_text(),
        values in prop::collection::vec(xff_value(), 0..3),
        trusted in trusted_nets(),
    ) {
        let peer: IpAddr = peer.parse().unwrap();
        let mut headers = HeaderMap::new();
        for v in &values {
            if let Ok(v) = HeaderValue::from_bytes(v) {
                headers.append("x-forwarded-for", v);
            }
        }
        let got = floodgate::wire::client::client_ip(peer, &headers, &trusted);
        prop_assert!(
            got == peer || got == peer.to_canonical() || addresses_in(&headers).contains(&got),
            "client {} is neither the peer {} nor in {:?}", got, peer, headers
        );
        // An untrusted peer is never overridden by what it wrote.
        if !trusted.iter().any(|n| n.contains(&peer) || n.contains(&peer.to_canonical())) {
            prop_assert!(got == peer || got == peer.to_canonical());
        }
    }

    /// Whatever a trusted proxy's chain holds left of the client's address (garbage, non-ASCII
    /// bytes, empty elements), and however many empty elements follow it, the client is that
    /// address: one bad element never turns the proxy into everyone's client.
    #[test]
    fn xff_elements_left_of_the_client_do_not_matter(
        junk in prop::collection::vec(any::<u8>(), 0..24),
        client in ip_text(),
        empties in 0usize..3,
    ) {
        let peer: IpAddr = "10.0.0.1".parse().unwrap();
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let client: IpAddr = client.parse().unwrap();
        prop_assume!(!trusted[0].contains(&client.to_canonical()));
        let mut chain = junk;
        chain.extend_from_slice(b", ");
        chain.extend_from_slice(client.to_string().as_bytes());
        for _ in 0..empties {
            chain.extend_from_slice(b", ");
        }
        let Ok(value) = HeaderValue::from_bytes(&chain) else {
            return Ok(());
        };
        let mut headers = HeaderMap::new();
        headers.insert("x-forwarded-for", value);
        prop_assert_eq!(
            floodgate::wire::client::client_ip(peer, &headers, &trusted),
            client.to_canonical()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Durations

const UNITS: [(&str, u64); 5] = [
    ("ms", 1),
    ("s", 1_000),
    ("m", 60_000),
    ("h", 3_600_000),
    ("d", 86_400_000),
];

proptest! {
    #![proptest_config(config(5000))]

    #[test]
    fn duration_parsing_never_panics(text in any::<String>()) {
        let _ = parse_duration(&text);
    }

    #[test]
    fn duration_parsing_never_panics_on_duration_shaped_input(
        text in "[ ]?-?[0-9]{0,24}(ms|s|m|h|d|w|us|S|\\.5s|)[ ]?"
    ) {
        let _ = parse_duration(&text);
    }

    #[test]
    fn durations_round_trip(unit in 0usize..UNITS.len(), n in any::<u64>(), pad in any::<bool>()) {
        let (name, ms) = UNITS[unit];
        let n = if ms == 1 { n } else { n % (u64::MAX / ms + 1) };
        let text = if pad { format!(" {n}{name} ") } else { format!("{n}{name}") };
        prop_assert_eq!(parse_duration(&text), Ok(Duration::from_millis(n * ms)));
        // One past the largest: refused, not wrapped.
        if ms > 1 {
            let too_big = format!("{}{name}", u64::MAX / ms + 1);
            prop_assert!(parse_duration(&too_big).is_err());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The config loader on mutated shipped configs

const SHIPPED: [(&str, &str); 3] = [
    ("gateway.toml", include_str!("../gateway.toml")),
    (
        "gateway-redis.toml",
        include_str!("../examples/gateway-redis.toml"),
    ),
    (
        "gateway-cluster.toml",
        include_str!("../examples/gateway-cluster.toml"),
    ),
];

#[derive(Debug, Clone)]
enum Mutation {
    /// Delete bytes `[at, at + len)`.
    Delete(usize, usize),
    /// Duplicate line `n`.
    DuplicateLine(usize),
    /// Delete line `n`.
    DeleteLine(usize),
    /// Swap lines `a` and `b`.
    SwapLines(usize, usize),
    /// Replace the character at `at` with `c`.
    Replace(usize, char),
    /// Insert `text` at `at`.
    Insert(usize, String),
    /// Keep only the first `at` bytes (a file caught mid-write).
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let any_char = prop_oneof![
        3 => prop::sample::select(vec![
            '"', '\'', '[', ']', '{', '}', '=', ',', '.', '#', '\n', ' ', '0', '9', '-', 'x', 'é',
            '\\', '\0', '\r', ':', '/', '%', '\u{7f}',
        ]),
        1 => any::<char>(),
    ];
    let snippet = prop::sample::select(vec![
        "[[routes]]\n",
        "[[rules]]\n",
        "[server]\n",
        "name = \"orders\"\n",
        "limit = 18446744073709551615\n",
        "limit = -1\n",
        "window = \"0s\"\n",
        "window = \"99999999999d\"\n",
        "max_delay = \"999999d\"\n",
        "key = []\n",
        "match = { path = \"x\" }\n",
        "url = \"redis://host:notaport\"\n",
        "url = \"redis://[::1\"\n",
        "listen = [\"0.0.0.0:99999\"]\n",
        "id = \"a\\r\\nb\"\n",
        "status = 99\n",
        "cost = 0\n",
        "\"\"\"",
        "= ",
        "\u{feff}",
    ])
    .prop_map(String::from);
    prop_oneof![
        (any::<usize>(), 1usize..200).prop_map(|(a, l)| Mutation::Delete(a, l)),
        any::<usize>().prop_map(Mutation::DuplicateLine),
        any::<usize>().prop_map(Mutation::DeleteLine),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::SwapLines(a, b)),
        (any::<usize>(), any_char).prop_map(|(a, c)| Mutation::Replace(a, c)),
        (any::<usize>(), snippet).prop_map(|(a, s)| Mutation::Insert(a, s)),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

/// The nearest char boundary at or below `at % (len + 1)`.
fn boundary(text: &str, at: usize) -> usize {
    let mut at = at % (text.len() + 1);
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn apply(text: &mut String, m: &Mutation) {
    let mut lines: Vec<String> = text.split_inclusive('\n').map(String::from).collect();
    let line = |n: usize| n % lines.len().max(1);
    match m {
        Mutation::Delete(at, len) => {
            let a = boundary(text, *at);
            let b = boundary(text, (a + len).min(text.len()));
            if b > a {
                text.replace_range(a..b, "");
            }
        }
        Mutation::Replace(at, c) => {
            let a = boundary(text, *at);
            if let Some(old) = text[a..].chars().next() {
                text.replace_range(a..a + old.len_utf8(), &c.to_string());
            }
        }
        Mutation::Insert(at, s) => {
            let a = boundary(text, *at);
            text.insert_str(a, s);
        }
        Mutation::Truncate(at) => {
            let a = boundary(text, *at);
            text.truncate(a);
        }
        Mutation::DuplicateLine(n) if !lines.is_empty() => {
            let i = line(*n);
            let dup = lines[i].clone();
            lines.insert(i, dup);
            *text = lines.concat();
        }
        Mutation::DeleteLine(n) if !lines.is_empty() => {
            let i = line(*n);
            lines.remove(i);
            *text = lines.concat();
        }
        Mutation::SwapLines(a, b) if !lines.is_empty() => {
            let (a, b) = (line(*a), line(*b));
            lines.swap(a, b);
            *text = lines.concat();
        }
        _ => {}
    }
}

/// Loads `text` as `dir/name`; an error must name the file and, when it has a line, one that
/// exists in the text, in the `file:line:col: message` form.
fn check_config(dir: &Path, name: &str, text: &str) {
    let path: PathBuf = dir.join(name);
    let Err(e) = Config::from_str(&path, text) else {
        return;
    };
    let shown = e.to_string();
    assert!(!e.message.trim().is_empty(), "empty message: {shown}");
    assert!(
        e.file.starts_with(dir),
        "error names {} instead of a file of the config: {shown}",
        e.file.display()
    );
    let file = e.file.display().to_string();
    if e.line == 0 {
        assert_eq!(e.column, 0, "{shown}");
        assert!(shown.starts_with(&format!("{file}: ")), "{shown}");
    } else {
        assert!(e.column >= 1, "{shown}");
        let prefix = format!("{file}:{}:{}: ", e.line, e.column);
        assert!(shown.starts_with(&prefix), "{shown}");
        if e.file == path {
            let lines = text.split('\n').count();
            assert!(
                e.line <= lines,
                "line {} is past the end ({lines} lines): {shown}",
                e.line
            );
            let width = text.split('\n').nth(e.line - 1).unwrap().chars().count();
            assert!(
                e.column <= width + 1,
                "column {} is past the end of line {} ({width} chars): {shown}",
                e.column,
                e.line
            );
        }
    }
}

#[test]
fn shipped_configs_load_unmutated() {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in SHIPPED {
        Config::from_str(&dir.path().join(name), text)
            .unwrap_or_else(|e| panic!("shipped {name} does not load: {e}"));
    }
}

proptest! {
    #![proptest_config(config(2000))]

    #[test]
    fn config_loader_on_mutated_configs(
        which in 0usize..SHIPPED.len(),
        mutations in prop::collection::vec(mutation(), 1..4),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (name, text) = SHIPPED[which];
        let mut text = text.to_string();
        for m in &mutations {
            apply(&mut text, m);
        }
        check_config(dir.path(), name, &text);
    }
}

// ---------------------------------------------------------------------------------------------
// RESP replies

/// A reply as the generator builds it: errors are kept apart from values because RESP says
/// them differently at the top (a failed call) and inside an array (an element).
#[derive(Debug, Clone)]
enum Gen {
    Okay,
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Gen>),
}

fn gen_reply() -> impl Strategy<Value = Gen> {
    let line = "[^\r\n]{0,16}";
    let leaf = prop_oneof![
        Just(Gen::Okay),
        line.prop_filter("OK is Okay", |s: &String| s != "OK")
            .prop_map(Gen::Status),
        line.prop_map(Gen::Error),
        any::<i64>().prop_map(Gen::Int),
        prop::collection::vec(any::<u8>(), 0..48).prop_map(Gen::Bulk),
        Just(Gen::Nil),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop::collection::vec(inner, 0..8).prop_map(Gen::Array)
    })
}

fn encode(g: &Gen, out: &mut Vec<u8>) {
    match g {
        Gen::Okay => out.extend_from_slice(b"+OK\r\n"),
        Gen::Status(s) => out.extend_from_slice(format!("+{s}\r\n").as_bytes()),
        Gen::Error(s) => out.extend_from_slice(format!("-{s}\r\n").as_bytes()),
        Gen::Int(n) => out.extend_from_slice(format!(":{n}\r\n").as_bytes()),
        Gen::Bulk(b) => {
            out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
            out.extend_from_slice(b);
            out.extend_from_slice(b"\r\n");
        }
        Gen::Nil => out.extend_from_slice(b"$-1\r\n"),
        Gen::Array(items) => {
            out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
            for i in items {
                encode(i, out);
            }
        }
    }
}

fn expected(g: &Gen, nested: bool) -> Reply {
    Ok(match g {
        Gen::Okay => Value::Okay,
        Gen::Status(s) => Value::SimpleString(s.clone()),
        Gen::Error(s) if nested => Value::SimpleString(s.clone()),
        Gen::Error(s) => return Err(s.clone()),
        Gen::Int(n) => Value::Int(*n),
        Gen::Bulk(b) => Value::BulkString(b.clone()),
        Gen::Nil => Value::Nil,
        Gen::Array(items) => Value::Array(
            items
                .iter()
                .map(|i| expected(i, true).expect("nested replies are values"))
                .collect(),
        ),
    })
}

fn resp_tokens() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop::sample::select(vec![
            "*",
            "$",
            ":",
            "+",
            "-",
            "\r\n",
            "\r",
            "\n",
            "-1",
            "-2",
            "0",
            "1",
            "3",
            "8",
            "99999999999",
            "9223372036854775808",
            "abc",
            "OK",
            "é",
        ]),
        0..24,
    )
    .prop_map(|t| t.concat().into_bytes())
}

fn check_resp(bytes: &[u8]) {
    if let Ok(Some((_, used))) = resp::parse(bytes, 0) {
        assert!(used > 0 && used <= bytes.len(), "{bytes:?} used {used}");
    }
}

proptest! {
    #![proptest_config(config(5000))]

    #[test]
    fn resp_parser_never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..96)) {
        check_resp(&bytes);
    }

    #[test]
    fn resp_parser_never_panics_on_reply_shaped_bytes(bytes in resp_tokens()) {
        check_resp(&bytes);
    }

    /// An encoded reply parses back to itself, using exactly its bytes (what follows is the
    /// next reply's), and every strict prefix asks for more bytes rather than failing.
    #[test]
    fn resp_replies_round_trip(g in gen_reply(), trailing in prop::collection::vec(any::<u8>(), 0..8)) {
        let mut bytes = Vec::new();
        encode(&g, &mut bytes);
        let len = bytes.len();
        let want = expected(&g, false);
        for cut in 0..len {
            prop_assert_eq!(resp::parse(&bytes[..cut], 0), Ok(None), "prefix {}", cut);
        }
        bytes.extend_from_slice(&trailing);
        prop_assert_eq!(resp::parse(&bytes, 0), Ok(Some((want, len))));
    }
}

// ---------------------------------------------------------------------------------------------
// RateLimit header fields

/// A rule name gateway.toml accepts: non-empty, no quotes, backslashes or control characters.
fn rule_name() -> impl Strategy<Value = String> {
    prop_oneof!["[a-z][a-z0-9-]{0,15}", "[ -~]{1,16}", any::<String>(),]
        .prop_map(|s| {
            s.chars()
                .filter(|c| !c.is_control() && *c != '"' && *c != '\\')
                .collect::<String>()
        })
        .prop_filter("names are non-empty", |s| !s.is_empty())
}

#[derive(Debug, Clone)]
struct Applied {
    name: String,
    headers: bool,
    concurrency: bool,
    limit: u64,
    window: Duration,
    decision: Decision,
}

fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (0u64..100_000).prop_map(Duration::from_millis),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        Just(Duration::MAX),
        Just(Duration::ZERO),
    ]
}

fn applied() -> impl Strategy<Value = Applied> {
    (
        rule_name(),
        prop::bool::weighted(0.9),
        any::<bool>(),
        prop_oneof![1u64..1_000_000, 1u64..=u64::MAX],
        prop_oneof![
            (1u64..86_400_000).prop_map(Duration::from_millis),
            any::<u64>().prop_map(Duration::from_millis),
        ],
        // What is left: mostly what limits leave (uniform u64s are nearly all past the
        // 15-digit cap, where every value is written the same).
        (
            any::<bool>(),
            prop_oneof![0u64..1_000_000, any::<u64>()],
            duration(),
            duration(),
        ),
    )
        .prop_map(
            |(name, headers, concurrency, limit, window, (allowed, remaining, reset, retry))| {
                Applied {
                    name,
                    headers,
                    concurrency,
                    limit,
                    window: if concurrency { Duration::ZERO } else { window },
                    decision: Decision {
                        allowed,
                        limit,
                        remaining,
                        reset,
                        retry_after: retry,
                        delay: Duration::ZERO,
                    },
                }
            },
        )
}

fn rule_of(a: &Applied) -> Policy {
    let algorithm = if a.concurrency {
        Algorithm::Concurrency
    } else {
        Algorithm::TokenBucket
    };
    Policy {
        headers: a.headers,
        counters: RuleCounters::for_rule("fuzz"),
        ..Policy::with_defaults(
            &a.name,
            Limit::police(algorithm, a.limit, a.window, a.limit),
            Scope::Local,
        )
    }
}

/// Parses `field` as an RFC 8941 List of Items whose bare items are Strings, returning each
/// member's string and integer parameters.
fn parse_members(field: &str) -> Vec<(String, Vec<(String, i64)>)> {
    let list = sfv::Parser::parse_list(field.as_bytes())
        .unwrap_or_else(|e| panic!("{field:?} is not a structured-field list: {e}"));
    list.into_iter()
        .map(|entry| {
            let sfv::ListEntry::Item(item) = entry else {
                panic!("{field:?} has an inner list");
            };
            let sfv::BareItem::String(name) = item.bare_item else {
                panic!("{field:?}: a member is not a string");
            };
            let params = item
                .params
                .into_iter()
                .map(|(k, v)| {
                    let sfv::BareItem::Integer(n) = v else {
                        panic!("{field:?}: parameter {k} is not an integer");
                    };
                    (k, n)
                })
                .collect();
            (name, params)
        })
        .collect()
}

proptest! {
    #![proptest_config(config(3000))]

    #[test]
    fn ratelimit_fields_are_structured_field_lists(
        applied in prop::collection::vec(applied(), 0..5),
        legacy in any::<bool>(),
    ) {
        let rules: Vec<Arc<Policy>> = applied.iter().map(|a| Arc::new(rule_of(a))).collect();
        let h = RateLimitHeaders::build(
            rules.iter().zip(applied.iter().map(|a| &a.decision)),
            legacy,
        );
        // A response's fields (made from what the thread keeps when one rule shows them) are
        // the text the rate-limit service answers with (always written whole).
        let (policy, state, legacy_fields) = RateLimitHeaders::text(
            rules.iter().map(|r| &**r).zip(applied.iter().map(|a| &a.decision)),
            legacy,
        );
        prop_assert_eq!(h.policy(), policy.as_str());
        prop_assert_eq!(h.state(), state.as_str());
        prop_assert_eq!(h.legacy, legacy_fields);
        let shown: Vec<&Applied> = applied.iter().filter(|a| a.headers).collect();
        if shown.is_empty() {
            prop_assert!(h.policy().is_empty() && h.state().is_empty());
            prop_assert!(h.legacy.is_none());
            return Ok(());
        }
        // Both are valid header values (visible ASCII and spaces only) ...
        for field in [h.policy(), h.state()] {
            prop_assert!(HeaderValue::from_str(field).is_ok(), "{:?}", field);
            prop_assert!(field.bytes().all(|b| (0x20..0x7f).contains(&b)), "{:?}", field);
        }
        // ... and lists with one member per shown rule, in order, with sf-integers.
        let policy = parse_members(h.policy());
        let state = parse_members(h.state());
        prop_assert_eq!(policy.len(), shown.len());
        prop_assert_eq!(state.len(), shown.len());
        for ((a, (pname, pparams)), (sname, sparams)) in shown.iter().zip(&policy).zip(&state) {
            prop_assert_eq!(pname, sname);
            // A printable ASCII name is sent as it is.
            if a.name.bytes().all(|b| (0x20..0x7f).contains(&b)) {
                prop_assert_eq!(pname, &a.name);
            }
            let keys: Vec<&str> = pparams.iter().map(|(k, _)| k.as_str()).collect();
            let want: &[&str] = if a.concurrency { &["q"] } else { &["q", "w"] };
            prop_assert_eq!(keys, want);
            let q = pparams[0].1;
            prop_assert!(q >= 0);
            prop_assert_eq!(q as u64, a.limit.min(SF_INTEGER_MAX));
            let keys: Vec<&str> = sparams.iter().map(|(k, _)| k.as_str()).collect();
            prop_assert_eq!(keys, vec!["r", "t"]);
            if !a.concurrency {
                let w = ceil_secs(a.window).clamp(1, SF_INTEGER_MAX);
                prop_assert_eq!(pparams[1].1 as u64, w);
            }
            prop_assert_eq!(sparams[0].1 as u64, a.decision.remaining.min(SF_INTEGER_MAX));
            let d = &a.decision;
            // On a rejection, `t` is the rule's own Retry-After (whole seconds, at least 1).
            let t = if d.allowed {
                ceil_secs(d.reset)
            } else {
                ceil_secs(d.retry_after).max(1)
            };
            prop_assert_eq!(sparams[1].1 as u64, t.min(SF_INTEGER_MAX));
        }
    }
}

/// The cases the generator found: a non-ASCII rule name (valid in gateway.toml) and numbers
/// past 15 digits made fields that RFC 8941 parsers refuse, and `Duration::MAX` overflowed.
#[test]
fn ratelimit_fields_escape_names_and_cap_numbers() {
    let a = Applied {
        name: "café \u{1F600}".to_string(),
        headers: true,
        concurrency: false,
        limit: u64::MAX,
        window: Duration::from_secs(60),
        decision: Decision {
            // Admitted: its `t` is the time until the quota is back, here past 15 digits.
            allowed: true,
            limit: u64::MAX,
            remaining: 1_000_000_000_000_000,
            reset: Duration::MAX,
            retry_after: Duration::ZERO,
            delay: Duration::ZERO,
        },
    };
    let rule = Arc::new(rule_of(&a));
    let h = RateLimitHeaders::build(std::iter::once((&rule, &a.decision)), false);
    assert_eq!(
        h.policy(),
        "\"caf%C3%A9 %F0%9F%98%80\";q=999999999999999;w=60"
    );
    assert_eq!(
        h.state(),
        "\"caf%C3%A9 %F0%9F%98%80\";r=999999999999999;t=999999999999999"
    );
    parse_members(h.policy());
    parse_members(h.state());
}
