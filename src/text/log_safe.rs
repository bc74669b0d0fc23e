//! What a log line may carry of a request: no control characters a terminal or a log viewer
//! would act on, and a bounded size.
//!
//! Two layers, because log lines are written by floodgate and by Pingora alike:
//! - fields floodgate takes from a request (the access log's `path`) are written through
//!   [`Shown`]: control characters escaped, at most [`MAX_VALUE`] bytes;
//! - every formatted line passes [`line`] on its way to stderr: C1 controls (U+0080-U+009F,
//!   `CSI` among them, which some terminals obey like `ESC [`) are escaped, and a line longer
//!   than [`MAX_LINE`] is cut (JSON lines keep their shape: each long string is cut instead).
//!   Pingora's error lines quote the request's path and Host whole; a client sending a long
//!   one per request would otherwise write that much log per request.
//!
//! The `tracing` text format already escapes `ESC`, C1 and a few others in messages, but not
//! in other fields, and its JSON format escapes C0 only.

use std::borrow::Cow;
use std::fmt::{self, Write as _};

/// Longest value taken from a request that a log field shows, in bytes; the rest is replaced
/// by a note of how much was cut.
pub const MAX_VALUE: usize = 1024;

/// Longest log line written, in bytes: past it, a text line is cut and a JSON line has its
/// long strings cut to [`MAX_VALUE`].
pub const MAX_LINE: usize = 8 * 1024;

/// A value from the network shown in a log field: C0 and C1 controls and DEL as `\u{..}`, at
/// most [`MAX_VALUE`] bytes of it (cut on a character boundary, with the count of bytes cut).
#[derive(Debug, Clone, Copy)]
pub struct Shown<'a>(pub &'a str);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kept = cut(self.0, MAX_VALUE);
        let mut plain = 0;
        for (at, c) in kept.char_indices() {
            if c.is_control() {
                f.write_str(&kept[plain..at])?;
                write!(f, "\\u{{{:x}}}", u32::from(c))?;
                plain = at + c.len_utf8();
            }
        }
        f.write_str(&kept[plain..])?;
        if kept.len() < self.0.len() {
            write!(f, "...[{} bytes cut]", self.0.len() - kept.len())?;
        }
        Ok(())
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// One formatted log event (`json`: the JSON format's one object and newline) as it may be
/// written: borrowed unchanged in the usual case (no C1 control, not too long).
pub fn line(event: &[u8], json: bool) -> Cow<'_, [u8]> {
    let has_c1 = event
        .windows(2)
        .any(|w| w[0] == 0xc2 && (0x80..=0x9f).contains(&w[1]));
    if !has_c1 && event.len() <= MAX_LINE {
        return Cow::Borrowed(event);
    }
    let text = String::from_utf8_lossy(event);
    let escaped = if has_c1 {
        escape_c1(&text, json)
    } else {
        text.into_owned()
    };
    if escaped.len() <= MAX_LINE {
        return Cow::Owned(escaped.into_bytes());
    }
    if json {
        if let Some(bounded) = bound_json(&escaped) {
            return Cow::Owned(bounded.into_bytes());
        }
    }
    Cow::Owned(bound_text(&escaped).into_bytes())
}

/// `text` with each C1 control written as an escape: `\u0080` in JSON (valid inside the
/// strings they can only appear in), `\u{80}` in text (as `tracing` writes them).
fn escape_c1(text: &str, json: bool) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if ('\u{80}'..='\u{9f}').contains(&c) {
            let code = u32::from(c);
            let _ = if json {
                write!(out, "\\u{code:04x}")
            } else {
                write!(out, "\\u{{{code:x}}}")
            };
        } else {
            out.push(c);
        }
    }
    out
}

/// A JSON line with every string longer than [`MAX_VALUE`] cut; `None` if it is not JSON.
fn bound_json(line: &str) -> Option<String> {
    let mut value: serde_json::Value = serde_json::from_str(line.trim_end()).ok()?;
    bound_strings(&mut value);
    let mut out = serde_json::to_string(&value).ok()?;
    out.push('\n');
    Some(out)
}

fn bound_strings(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::String(s) if s.len() > MAX_VALUE => {
            let kept = cut(s, MAX_VALUE).len();
            let note = format!("...[{} bytes cut]", s.len() - kept);
            s.truncate(kept);
            s.push_str(&note);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(bound_strings),
        serde_json::Value::Object(fields) => fields.values_mut().for_each(bound_strings),
        _ => {}
    }
}

/// A text line cut to [`MAX_LINE`] bytes, with the count of bytes cut and its newline.
fn bound_text(line: &str) -> String {
    let body = line.strip_suffix('\n').unwrap_or(line);
    let kept = cut(body, MAX_LINE);
    let mut out = String::with_capacity(MAX_LINE + 32);
    out.push_str(kept);
    let _ = write!(out, "...[{} bytes cut]", body.len() - kept.len());
    // A cut may fall inside a colour: end it rather than colour the lines that follow.
    if kept.contains('\u{1b}') {
        out.push_str("\u{1b}[0m");
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_escapes_controls_and_bounds_length() {
        assert_eq!(Shown("/orders/1").to_string(), "/orders/1");
        assert_eq!(Shown("/a\u{9b}31mb").to_string(), "/a\\u{9b}31mb");
        assert_eq!(
            Shown("/a\u{1b}[2J\u{7f}\u{85}").to_string(),
            "/a\\u{1b}[2J\\u{7f}\\u{85}"
        );
        assert_eq!(Shown("/caf\u{e9}").to_string(), "/caf\u{e9}");
        let long = "x".repeat(MAX_VALUE + 10);
        let shown = Shown(&long).to_string();
        assert!(shown.starts_with(&"x".repeat(MAX_VALUE)));
        assert!(shown.ends_with("...[10 bytes cut]"), "{shown}");
        // Cut on a character boundary.
        let wide = "\u{e9}".repeat(MAX_VALUE);
        let shown = Shown(&wide).to_string();
        assert!(
            shown.starts_with(&"\u{e9}".repeat(MAX_VALUE / 2)),
            "{shown}"
        );
        assert!(shown.ends_with("...[1024 bytes cut]"), "{shown}");
    }

    #[test]
    fn ordinary_lines_pass_unchanged() {
        let text = b"2026-01-01T00:00:00Z  INFO access: method=GET path=/x status=200\n";
        assert!(matches!(line(text, false), Cow::Borrowed(_)));
        let json = b"{\"fields\":{\"path\":\"/caf\xc3\xa9\"}}\n";
        assert!(matches!(line(json, true), Cow::Borrowed(_)));
    }

    #[test]
    fn c1_controls_are_escaped_in_both_formats() {
        let text = "INFO access: path=/a\u{9b}31m\u{80}b\n";
        assert_eq!(
            line(text.as_bytes(), false).as_ref(),
            b"INFO access: path=/a\\u{9b}31m\\u{80}b\n"
        );
        let json = "{\"fields\":{\"path\":\"/a\u{9b}b\"}}\n";
        let out = line(json.as_bytes(), true);
        let parsed: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(parsed["fields"]["path"], "/a\u{9b}b", "still the same text");
        assert!(!out.windows(2).any(|w| w == [0xc2, 0x9b]));
    }

    #[test]
    fn long_lines_are_cut() {
        let text = format!(
            "ERROR pingora_proxy: Fail to proxy: GET /{}\n",
            "p".repeat(60_000)
        );
        let out = line(text.as_bytes(), false);
        assert!(out.len() <= MAX_LINE + 64, "{}", out.len());
        assert!(out.ends_with(b" bytes cut]\n"));
        assert!(out.starts_with(b"ERROR pingora_proxy: Fail to proxy: GET /ppp"));

        let json = serde_json::json!({
            "level": "ERROR",
            "fields": {"message": format!("Fail to proxy, Host: {}", "a".repeat(60_000))},
        });
        let json = format!("{json}\n");
        let out = line(json.as_bytes(), true);
        assert!(out.len() <= MAX_LINE, "{}", out.len());
        assert!(out.ends_with(b"\n"));
        let parsed: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(parsed["level"], "ERROR");
        let message = parsed["fields"]["message"].as_str().unwrap();
        assert!(message.starts_with("Fail to proxy, Host: aaa"), "{message}");
        assert!(message.len() < MAX_VALUE + 32);
    }
}
