//! Numbers and durations as text, with no dependency on the rest of the crate (config, upstreams
//! and descriptions all format through here), and its neighbours: [`names`] (each config
//! enum's names, listed once), [`rate`] (a `slow_rate`) and [`log_safe`] (what a log line may
//! carry), and the wall clock in seconds ([`unix_now`]).
//!
//! The digit writers are for the request path: `format!` and `write!` go through `core::fmt`'s
//! dynamic dispatch, which took about 2 % of a gateway's CPU under `perf` (Redis keys, lease
//! and request ids, RateLimit headers); these write the digits directly.

pub mod log_safe;
pub mod names;
pub mod rate;

/// Whole seconds since the Unix epoch by the wall clock (0 for a clock set before it): what
/// reload times and token expiries are read against.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A duration the way gateway.toml writes it (the inverse of
/// `crate::config::duration::parse_duration` for whole units): `1m`, `1500ms`, `1d`.
pub fn humantime(d: std::time::Duration) -> String {
    let ms = d.as_millis();
    for (unit, size) in [
        ("d", 86_400_000u128),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

thread_local! {
    static SCRATCH: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// The scratch text kept between calls, at most (a longer one is given back).
const SCRATCH_KEPT: usize = 4096;

/// Runs `write` on this thread's empty scratch `String` and returns what it makes of the text:
/// for a value built piece by piece on the request path and then copied once into its own
/// exact allocation (`Bytes::copy_from_slice`, `HeaderValue::from_bytes`). Building in a fresh
/// `String` instead costs its allocation, and handing it over with room to spare
/// (`Bytes::from`) a second one for the shared owner. A nested call gets a fresh `String`.
pub fn with_scratch<R>(write: impl FnOnce(&mut String) -> R) -> R {
    let mut write = Some(write);
    let made = SCRATCH
        .try_with(|cell| {
            let mut text = cell.try_borrow_mut().ok()?;
            text.clear();
            let made = (write.take()?)(&mut text);
            if text.capacity() > SCRATCH_KEPT {
                *text = String::new();
            }
            Some(made)
        })
        .ok()
        .flatten();
    match (made, write) {
        (Some(made), _) => made,
        (None, Some(write)) => write(&mut String::new()),
        // Not reachable: the closure runs `write` only when it returns what it made.
        (None, None) => unreachable!("with_scratch ran its writer without a result"),
    }
}

/// Appends `n` as 16 lowercase hex digits, zero-padded (like `{:016x}`).
pub fn push_hex16(out: &mut String, n: u64) {
    let mut digits = [0u8; 16];
    hex16_into(&mut digits, n);
    push_ascii(out, &digits);
}

/// Writes `n` as 16 lowercase hex digits into `out` (16 bytes; fewer are left as they are).
pub fn hex16_into(out: &mut [u8], n: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, d) in out.iter_mut().take(16).enumerate() {
        *d = DIGITS[((n >> ((15 - i) * 4)) & 0xf) as usize];
    }
}

/// Appends `n` in decimal (like `{}`): itoa's two digits a step, and no UTF-8 check of
/// its own digits.
pub fn push_u64(out: &mut String, n: u64) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// Appends an IP address as `Display` writes it, an IPv4 one digit by digit (`core::fmt`'s
/// padding support costs more than the digits: ~1,600 instructions an address; itoa's digits
/// through `push_str`, or a buffer checked by `from_utf8`, still ~210, most of it the UTF-8
/// check of a few bytes). IPv6 goes through `Display` (its `::` compression is not worth
/// redoing).
pub fn push_ip(out: &mut String, ip: std::net::IpAddr) {
    match ip {
        std::net::IpAddr::V4(v4) => {
            out.reserve(15);
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                if octet >= 100 {
                    out.push(char::from(b'0' + octet / 100));
                }
                if octet >= 10 {
                    out.push(char::from(b'0' + octet / 10 % 10));
                }
                out.push(char::from(b'0' + octet % 10));
            }
        }
        std::net::IpAddr::V6(v6) => {
            use std::fmt::Write as _;
            let _ = write!(out, "{v6}");
        }
    }
}

/// Appends digits, which are ASCII, in one copy: extending a `String` char by char encodes and
/// checks room for each (twice the instructions of the digits' own arithmetic).
fn push_ascii(out: &mut String, digits: &[u8]) {
    // Only the hex writer above calls this, with ASCII digits; should that ever change,
    // nothing is appended rather than invalid UTF-8.
    if let Ok(text) = std::str::from_utf8(digits) {
        out.push_str(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        for ip in [
            "0.0.0.0",
            "127.0.0.1",
            "255.255.255.255",
            "10.20.3.40",
            "100.9.99.109",
            "::1",
            "2001:db8::7",
        ] {
            let ip: std::net::IpAddr = ip.parse().unwrap();
            let mut out = String::from("x=");
            push_ip(&mut out, ip);
            assert_eq!(out, format!("x={ip}"));
        }
    }

    #[test]
    fn every_octet_is_written_as_display_writes_it() {
        for o in 0..=255u8 {
            for ip in [[o, 0, 9, o], [1, o, o, 200]] {
                let ip = std::net::IpAddr::from(ip);
                let mut out = String::new();
                push_ip(&mut out, ip);
                assert_eq!(out, ip.to_string());
            }
        }
    }

    /// The scratch starts empty on every call, a nested call gets a text of its own, and a
    /// large text is not kept.
    #[test]
    fn the_scratch_is_empty_each_time_and_nests() {
        assert_eq!(
            with_scratch(|t| {
                t.push_str("abc");
                t.clone()
            }),
            "abc"
        );
        let (outer, inner) = with_scratch(|t| {
            t.push_str("outer");
            let inner = with_scratch(|u| {
                assert!(u.is_empty());
                u.push_str("inner");
                u.clone()
            });
            (t.clone(), inner)
        });
        assert_eq!((outer.as_str(), inner.as_str()), ("outer", "inner"));
        with_scratch(|t| t.push_str(&"x".repeat(SCRATCH_KEPT + 1)));
        assert_eq!(with_scratch(|t| (t.len(), t.capacity())), (0, 0));
    }

    #[test]
    fn durations_read_like_the_config() {
        assert_eq!(humantime(Duration::from_secs(60)), "1m");
        assert_eq!(humantime(Duration::from_millis(1500)), "1500ms");
        assert_eq!(humantime(Duration::from_secs(86400)), "1d");
    }

    #[test]
    fn same_text_as_format() {
        for n in [0, 1, 9, 10, 255, 4096, 1 << 53, u64::MAX - 1, u64::MAX] {
            let mut s = String::new();
            push_hex16(&mut s, n);
            assert_eq!(s, format!("{n:016x}"));
            let mut s = String::from("x");
            push_u64(&mut s, n);
            assert_eq!(s, format!("x{n}"));
        }
    }
}
