//! Calendar periods (`calendar = "day" | "week" | "month"`, `timezone`): the window of a
//! fixed-window rule that sells a quota per day, week or month of a time zone rather than per
//! aligned stretch of seconds.
//!
//! A period starts at midnight in its zone (weeks on Monday, months on the 1st) and ends at the
//! next period's start, so its length follows the zone's offset changes: a day is 23 or 25
//! hours across a DST change. A midnight that a zone skips (a DST gap at 00:00) starts the
//! period at the first instant after the gap; a repeated midnight (a fold) at its first
//! occurrence. The zone rules come from the tz database bundled in the binary (`jiff`), so a
//! period does not depend on the host's `/usr/share/zoneinfo`.

use std::sync::Arc;
use std::time::Duration;

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

/// Which calendar period a quota counts in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Period {
    /// From midnight to midnight.
    Day,
    /// From Monday midnight to the next Monday midnight.
    Week,
    /// From the 1st at midnight to the next 1st at midnight.
    Month,
}

impl Period {
    /// Every period with its gateway.toml name.
    pub const NAMES: &'static [(&'static str, Period)] = &[
        ("day", Period::Day),
        ("week", Period::Week),
        ("month", Period::Month),
    ];

    /// The name used in gateway.toml.
    pub fn as_str(self) -> &'static str {
        crate::text::names::name_of(Self::NAMES, self)
    }

    /// A bound on the length of any period of this kind in any zone: the rule's nominal window
    /// (what its horizon, lease bounds and eviction judge by). A day of a zone that moves by a
    /// whole day (Samoa, 2011) is shorter, never longer, and offset changes are at most a few
    /// hours, so one spare day is ample.
    pub fn longest(self) -> Duration {
        let days = match self {
            Period::Day => 2,
            Period::Week => 8,
            Period::Month => 32,
        };
        Duration::from_secs(days * 86_400)
    }
}

/// A period in a zone: what a calendar rule's window is.
#[derive(Clone, Debug)]
pub struct Calendar {
    period: Period,
    zone: TimeZone,
    /// The zone's IANA name as configured: what equality, the counter id and describe use.
    zone_name: Arc<str>,
}

/// Two calendars are equal when the config says the same: the zone follows from its name.
impl PartialEq for Calendar {
    fn eq(&self, other: &Calendar) -> bool {
        self.period == other.period && self.zone_name == other.zone_name
    }
}

impl Calendar {
    /// The calendar of `period` in the IANA zone `zone` (`"UTC"`, `"Asia/Tokyo"`), or why the
    /// zone is unknown.
    pub fn new(period: Period, zone: &str) -> Result<Calendar, String> {
        let tz = TimeZone::get(zone).map_err(|_| {
            format!(
                "unknown time zone \"{zone}\"; use an IANA name such as \"UTC\" or \"Asia/Tokyo\""
            )
        })?;
        Ok(Calendar {
            period,
            zone: tz,
            zone_name: zone.into(),
        })
    }

    /// The period kind.
    pub fn period(&self) -> Period {
        self.period
    }

    /// The zone's name as configured.
    pub fn zone_name(&self) -> &str {
        &self.zone_name
    }

    /// The period that contains `now_ns` (ns since the Unix epoch): `[start, end)` in ns.
    /// Outside what the calendar can compute (past the year 9999, never on a real clock) it
    /// answers the aligned span of the period's longest length, so no input panics.
    pub fn period_at(&self, now_ns: u64) -> (u64, u64) {
        self.compute(now_ns).unwrap_or_else(|| {
            let len = u64::try_from(self.period.longest().as_nanos()).unwrap_or(u64::MAX);
            let start = now_ns - now_ns % len;
            (start, start.saturating_add(len))
        })
    }

    /// The boundaries of the periods before, at and after `now_ns`: previous start, current
    /// start, next start, next end (ns). What the Redis store sends, so that the script picks
    /// the period by Redis' own clock when it is a little off the gateway's.
    pub fn around(&self, now_ns: u64) -> [u64; 4] {
        let (start, end) = self.period_at(now_ns);
        let (previous, _) = self.period_at(start.saturating_sub(1));
        let (_, next_end) = self.period_at(end);
        [previous, start, end, next_end]
    }

    /// The length of the period that contains `now_ns`.
    pub fn length_at(&self, now_ns: u64) -> Duration {
        let (start, end) = self.period_at(now_ns);
        Duration::from_nanos(end - start)
    }

    fn compute(&self, now_ns: u64) -> Option<(u64, u64)> {
        let now = Timestamp::from_nanosecond(i128::from(now_ns)).ok()?;
        let today = now.to_zoned(self.zone.clone()).date();
        let (first, next) = match self.period {
            Period::Day => (today, today.tomorrow().ok()?),
            Period::Week => {
                let back = i64::from(today.weekday().to_monday_zero_offset());
                let monday = today.checked_sub(back.days()).ok()?;
                (monday, monday.checked_add(7.days()).ok()?)
            }
            Period::Month => {
                let first = today.first_of_month();
                (first, today.last_of_month().tomorrow().ok()?)
            }
        };
        let start = self.midnight(first)?;
        let end = self.midnight(next)?;
        (start <= now_ns && now_ns < end).then_some((start, end))
    }

    /// The first instant of `date` in the zone (after a gap, at its end).
    fn midnight(&self, date: Date) -> Option<u64> {
        let zoned = date.to_zoned(self.zone.clone()).ok()?;
        u64::try_from(zoned.timestamp().as_nanosecond()).ok()
    }
}

#[cfg(test)]
mod tests;
