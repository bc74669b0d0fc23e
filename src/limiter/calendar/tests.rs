use super::*;

/// ns since the epoch of an RFC 3339 instant written out in the test.
fn at(instant: &str) -> u64 {
    let t: Timestamp = instant.parse().expect("an RFC 3339 instant");
    u64::try_from(t.as_nanosecond()).expect("after 1970")
}

fn period(period: Period, zone: &str, now: &str) -> (u64, u64) {
    Calendar::new(period, zone)
        .expect("a known zone")
        .period_at(at(now))
}

const HOUR: u64 = 3_600_000_000_000;

#[test]
fn a_tokyo_day_runs_from_midnight_tokyo_which_is_15_00_utc() {
    // 23:59:59 on 1 December in Tokyo (UTC+9) is still 1 December there.
    assert_eq!(
        period(Period::Day, "Asia/Tokyo", "2026-12-01T14:59:59Z"),
        (at("2026-11-30T15:00:00Z"), at("2026-12-01T15:00:00Z"))
    );
    // One second later it is midnight of 2 December in Tokyo: a new period.
    assert_eq!(
        period(Period::Day, "Asia/Tokyo", "2026-12-01T15:00:00Z"),
        (at("2026-12-01T15:00:00Z"), at("2026-12-02T15:00:00Z"))
    );
}

#[test]
fn a_month_starts_on_the_first_at_midnight_in_its_zone() {
    // 09:00 on 1 December in Tokyo.
    assert_eq!(
        period(Period::Month, "Asia/Tokyo", "2026-12-01T00:00:00Z"),
        (at("2026-11-30T15:00:00Z"), at("2026-12-31T15:00:00Z"))
    );
    // In UTC the same instant is the first instant of December.
    assert_eq!(
        period(Period::Month, "UTC", "2026-12-01T00:00:00Z"),
        (at("2026-12-01T00:00:00Z"), at("2027-01-01T00:00:00Z"))
    );
    // The nanosecond before is still November.
    assert_eq!(
        Calendar::new(Period::Month, "UTC")
            .unwrap()
            .period_at(at("2026-12-01T00:00:00Z") - 1),
        (at("2026-11-01T00:00:00Z"), at("2026-12-01T00:00:00Z"))
    );
}

#[test]
fn weeks_start_on_monday() {
    // Tuesday 1 December 2026; the week began on Monday 30 November.
    assert_eq!(
        period(Period::Week, "UTC", "2026-12-01T12:00:00Z"),
        (at("2026-11-30T00:00:00Z"), at("2026-12-07T00:00:00Z"))
    );
    // Sunday 6 December 23:00 in New York (UTC-5) is still that week there.
    assert_eq!(
        period(Period::Week, "America/New_York", "2026-12-07T04:00:00Z"),
        (at("2026-11-30T05:00:00Z"), at("2026-12-07T05:00:00Z"))
    );
}

#[test]
fn new_york_dst_days_last_23_and_25_hours() {
    // 8 March 2026: clocks go from 02:00 EST to 03:00 EDT.
    let cal = Calendar::new(Period::Day, "America/New_York").unwrap();
    let spring = at("2026-03-08T12:00:00Z");
    assert_eq!(
        cal.period_at(spring),
        (at("2026-03-08T05:00:00Z"), at("2026-03-09T04:00:00Z"))
    );
    assert_eq!(cal.length_at(spring), Duration::from_nanos(23 * HOUR));
    // 1 November 2026: clocks go from 02:00 EDT back to 01:00 EST.
    let autumn = at("2026-11-01T12:00:00Z");
    assert_eq!(
        cal.period_at(autumn),
        (at("2026-11-01T04:00:00Z"), at("2026-11-02T05:00:00Z"))
    );
    assert_eq!(cal.length_at(autumn), Duration::from_nanos(25 * HOUR));
    // The weeks holding them are 167 and 169 hours long.
    let week = Calendar::new(Period::Week, "America/New_York").unwrap();
    assert_eq!(week.length_at(spring), Duration::from_nanos(167 * HOUR));
    assert_eq!(week.length_at(autumn), Duration::from_nanos(169 * HOUR));
}

#[test]
fn february_of_a_leap_year_has_29_days() {
    assert_eq!(
        period(Period::Month, "UTC", "2028-02-29T23:59:59Z"),
        (at("2028-02-01T00:00:00Z"), at("2028-03-01T00:00:00Z"))
    );
    assert_eq!(
        period(Period::Day, "UTC", "2028-02-29T00:00:00Z"),
        (at("2028-02-29T00:00:00Z"), at("2028-03-01T00:00:00Z"))
    );
    assert_eq!(
        period(Period::Month, "UTC", "2027-02-15T00:00:00Z"),
        (at("2027-02-01T00:00:00Z"), at("2027-03-01T00:00:00Z"))
    );
}

#[test]
fn around_gives_the_neighbouring_periods() {
    let cal = Calendar::new(Period::Day, "America/New_York").unwrap();
    assert_eq!(
        cal.around(at("2026-03-08T12:00:00Z")),
        [
            at("2026-03-07T05:00:00Z"),
            at("2026-03-08T05:00:00Z"),
            at("2026-03-09T04:00:00Z"),
            at("2026-03-10T04:00:00Z"),
        ]
    );
}

#[test]
fn unknown_zones_are_refused_by_name() {
    let e = Calendar::new(Period::Day, "Mars/Olympus").unwrap_err();
    assert!(e.contains("\"Mars/Olympus\""), "{e}");
    assert!(Calendar::new(Period::Day, "UTC").is_ok());
}

#[test]
fn no_period_is_longer_than_its_bound() {
    for zone in [
        "UTC",
        "America/New_York",
        "Australia/Lord_Howe",
        "Pacific/Apia",
    ] {
        for (_, p) in Period::NAMES {
            let cal = Calendar::new(*p, zone).unwrap();
            let mut now = at("2011-01-01T00:00:00Z");
            while now < at("2013-01-01T00:00:00Z") {
                let (start, end) = cal.period_at(now);
                assert!(start <= now && now < end, "{zone} {p:?} at {now}");
                assert!(Duration::from_nanos(end - start) <= p.longest());
                now = end;
            }
        }
    }
}

/// The same periods as Python's `zoneinfo` (the system's tz database) for a spread of
/// instants and zones: a second, independent implementation of the calendar rules.
#[test]
fn periods_match_python_zoneinfo() {
    let zones = [
        "UTC",
        "Asia/Tokyo",
        "America/New_York",
        "Europe/London",
        "Australia/Sydney",
        "America/Sao_Paulo",
        "Asia/Kolkata",
    ];
    // Every 7 h 13 min across 2024..2028 (DST changes, leap days, month ends), from a script
    // that prints "zone period now start end" in seconds.
    let script = r#"
import sys, datetime as dt
from zoneinfo import ZoneInfo
UTC = dt.timezone.utc
def midnight(d, tz):
    # The first instant of date d: walk UTC instants around local midnight.
    naive = dt.datetime(d.year, d.month, d.day)
    for fold in (0, 1):
        local = naive.replace(tzinfo=tz, fold=fold)
        back = local.astimezone(UTC).astimezone(tz)
        if back.replace(tzinfo=None) == naive:
            return int(local.astimezone(UTC).timestamp())
    # A skipped midnight: the period starts where the gap ends.
    return int(naive.replace(tzinfo=tz, fold=0).astimezone(UTC).timestamp())
for zone in sys.argv[1:]:
    tz = ZoneInfo(zone)
    t = int(dt.datetime(2024, 1, 1, tzinfo=UTC).timestamp())
    end = int(dt.datetime(2028, 12, 31, tzinfo=UTC).timestamp())
    while t < end:
        d = dt.datetime.fromtimestamp(t, tz).date()
        spans = {
            "day": (d, d + dt.timedelta(days=1)),
            "week": (d - dt.timedelta(days=d.weekday()), d - dt.timedelta(days=d.weekday()) + dt.timedelta(days=7)),
            "month": (d.replace(day=1), (d.replace(day=28) + dt.timedelta(days=4)).replace(day=1)),
        }
        for name, (a, b) in spans.items():
            print(zone, name, t, midnight(a, tz), midnight(b, tz))
        t += 7 * 3600 + 13 * 60
"#;
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(zones)
        .output()
        .expect("python3 runs (the calendar is checked against its zoneinfo)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut compared = 0;
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let period = Period::NAMES.iter().find(|(n, _)| *n == f[1]).unwrap().1;
        let secs = |i: usize| f[i].parse::<u64>().unwrap() * 1_000_000_000;
        let cal = Calendar::new(period, f[0]).unwrap();
        assert_eq!(cal.period_at(secs(2)), (secs(3), secs(4)), "{line}");
        compared += 1;
    }
    // 7 zones x 3 periods x ~6,000 instants.
    assert!(compared > 100_000, "only {compared} periods compared");
}
