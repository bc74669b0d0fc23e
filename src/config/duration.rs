//! Durations as gateway.toml writes them: `"250ms"`, `"1s"`, `"1m"`, `"1h"`, `"1d"`.

use std::time::Duration;

/// Parses `<whole number><unit>` with unit `ms`, `s`, `m`, `h` or `d`.
///
/// Fractions and compound forms (`1m30s`) are refused on purpose: a limit's window should read
/// the same to every operator, and `90s` says it plainly.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(|| {
        format!("duration \"{text}\" has no unit; write e.g. \"{text}s\" (units: ms, s, m, h, d)")
    })?;
    let (number, unit) = text.split_at(split);
    if number.is_empty() {
        return Err(format!(
            "duration \"{text}\" must start with a whole number, e.g. \"250ms\", \"1s\", \"1m\""
        ));
    }
    let n: u64 = number
        .parse()
        .map_err(|_| format!("duration \"{text}\" is too large"))?;
    let unit_ms: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(format!(
                "duration \"{text}\" has unknown unit \"{unit}\" (units: ms, s, m, h, d)"
            ))
        }
    };
    n.checked_mul(unit_ms)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("duration \"{text}\" is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86400)));
    }

    #[test]
    fn refuses_what_is_ambiguous() {
        for bad in [
            "",
            "10",
            "s",
            "1.5s",
            "1m30s",
            "1w",
            "-1s",
            "99999999999999999999s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad} should be refused");
        }
    }
}
