//! A `slow_rate` as gateway.toml writes it (`64KiB`, `1MiB`, `1500B`: bytes per second, per
//! request): parsed by the config's validation, shown by `check`, applied by
//! `crate::request::throttle`.

/// The smallest `slow_rate`: 1 KiB per second. Below it, one 64 KiB piece of an upstream's
/// body would keep a client waiting more than a minute between two writes.
pub const MIN_SLOW_RATE: u64 = 1024;

/// The largest `slow_rate`: 1 GiB per second (faster is not a slowdown).
pub const MAX_SLOW_RATE: u64 = 1024 * 1024 * 1024;

/// Parses a `slow_rate`: a whole number of `B`, `KiB` or `MiB` (per second, per request),
/// between [`MIN_SLOW_RATE`] and [`MAX_SLOW_RATE`].
pub fn parse_rate(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).ok_or_else(|| {
        format!("slow_rate \"{t}\" has no unit; write e.g. \"{t}KiB\" (units: B, KiB, MiB)")
    })?;
    let (number, unit) = t.split_at(split);
    if number.is_empty() {
        return Err(format!(
            "slow_rate \"{t}\" must start with a whole number, e.g. \"64KiB\""
        ));
    }
    let scale: u64 = match unit {
        "B" => 1,
        "KiB" => 1024,
        "MiB" => 1024 * 1024,
        _ => {
            return Err(format!(
                "slow_rate \"{t}\" has unknown unit \"{unit}\" (units: B, KiB, MiB)"
            ))
        }
    };
    let rate = number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .filter(|&r| r <= MAX_SLOW_RATE)
        .ok_or_else(|| format!("slow_rate \"{t}\" is more than 1GiB per second"))?;
    if rate < MIN_SLOW_RATE {
        return Err(format!(
            "slow_rate \"{t}\" is less than 1KiB per second (a single 64KiB piece of a body would wait over a minute)"
        ));
    }
    Ok(rate)
}

/// A rate as gateway.toml writes it: `64KiB`, `1MiB`, `1500B` (what `check` shows).
pub fn show_rate(rate: u64) -> String {
    match rate {
        r if r >= 1 << 20 && r % (1 << 20) == 0 => format!("{}MiB", r >> 20),
        r if r >= 1 << 10 && r % (1 << 10) == 0 => format!("{}KiB", r >> 10),
        r => format!("{r}B"),
    }
}
