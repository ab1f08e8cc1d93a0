//! How far back a rolling window reaches: a fixed length, or calendar
//! months.
//!
//! A row with order value `t` looks back to `t - w` ([`Window::lower`]);
//! [`crate::rolling::Closed`] says whether that edge is in the window. For
//! a fixed window `t - w` is a subtraction. For a calendar window
//! (`1mo`, `1q`, `1y`, `1mo15d`) it is what DuckDB's `ts - INTERVAL` and
//! Polars' rolling `period` compute on a column without a time zone (or in
//! UTC):
//!
//! ```text
//!   t = 2024-03-31 12:00, w = 1 month 15 days
//!   1. months back on the civil date, the day clamped to the month's end:
//!      2024-02-31 -> 2024-02-29 12:00 (the time of day is kept)
//!   2. then the fixed part:  2024-02-29 12:00 - 15 days = 2024-02-14 12:00
//! ```
//!
//! `lower(t)` is not monotone in `t` where the day is clamped: 2023-03-30
//! 23:00 reaches back to 2023-02-28 23:00, the next row, 2023-03-31 01:00,
//! to 2023-02-28 01:00. DuckDB takes each row's edge as it is, and so do
//! braid's kernels (the window's start pointer may move back); Polars 2.1
//! keeps its start pointer from moving back. [`Window::reach`] (the edge
//! of the start of the row's day) bounds every later row's edge, which
//! is what a rank or a chunk needs to hold below its first row.
//!
//! On a timestamp column in a time zone other than UTC the calendar steps
//! run on the zone's local clock ([`Window::Zoned`]), as RFC 5545 and
//! Polars (2.1) do: months, then weeks, then days back on the local date
//! and time, each step mapped back to an instant, then the fixed part
//! (hours and below) in absolute time:
//!
//! ```text
//!   America/New_York, w = 1 day:
//!   t = 2024-11-03 12:00 EST  ->  2024-11-02 12:00 EDT   (25 hours back)
//!   t = 2024-03-10 12:00 EDT  ->  2024-03-09 12:00 EST   (23 hours back)
//!   a local time that occurs twice (2024-11-03 01:30) keeps the offset the
//!   step started from where it can; one that does not occur (2024-03-10
//!   02:30) is read with the offset before the gap (03:30 EDT).
//! ```

/// What one unit of a temporal order column is, for calendar arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CalendarUnit {
    /// Days since the epoch (Date32).
    Days,
    /// Seconds since the epoch.
    Seconds,
    /// Milliseconds since the epoch (also Date64).
    Millis,
    /// Microseconds since the epoch.
    Micros,
    /// Nanoseconds since the epoch.
    Nanos,
}

impl CalendarUnit {
    /// Units in one second (1 for days: a date column has no time zone,
    /// and [`Window::Zoned`] is not built on one).
    pub const fn per_second(self) -> i64 {
        match self {
            CalendarUnit::Days | CalendarUnit::Seconds => 1,
            CalendarUnit::Millis => 1_000,
            CalendarUnit::Micros => 1_000_000,
            CalendarUnit::Nanos => 1_000_000_000,
        }
    }

    /// Units in one day.
    pub const fn per_day(self) -> i64 {
        match self {
            CalendarUnit::Days => 1,
            CalendarUnit::Seconds => 86_400,
            CalendarUnit::Millis => 86_400_000,
            CalendarUnit::Micros => 86_400_000_000,
            CalendarUnit::Nanos => 86_400_000_000_000,
        }
    }
}

/// Seconds in a day, for the local-clock arithmetic of [`Window::Zoned`].
const DAY_S: i128 = 86_400;

/// The time zone of a timestamp column, as Arrow names it: a zone of the
/// IANA database (`America/New_York`) or a fixed offset (`+05:30`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Zone {
    /// A named zone, whose offset can change (daylight saving time).
    Named(chrono_tz::Tz),
    /// A fixed offset from UTC, in seconds east.
    Fixed(i32),
}

impl std::str::FromStr for Zone {
    type Err = String;

    /// `+HH:MM`, `-HHMM`, `+HH`, `Z` or `utc` (UTC), or a name of the
    /// IANA database.
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s == "Z" || s.eq_ignore_ascii_case("utc") {
            return Ok(Zone::Fixed(0));
        }
        if let Some(rest) = s.strip_prefix('+').or_else(|| s.strip_prefix('-')) {
            let digits: String = rest.chars().filter(|c| *c != ':').collect();
            let ok = digits.bytes().all(|b| b.is_ascii_digit())
                && matches!(digits.len(), 2 | 4)
                && (rest.len() == digits.len() || rest.find(':') == Some(2));
            if !ok {
                return Err(format!("bad time zone offset {s:?} (expected +HH:MM)"));
            }
            let h: i32 = digits[..2]
                .parse()
                .map_err(|_| format!("bad offset {s:?}"))?;
            let m: i32 = match &digits[2..] {
                "" => 0,
                mm => mm.parse().map_err(|_| format!("bad offset {s:?}"))?,
            };
            if h > 23 || m > 59 {
                return Err(format!("time zone offset {s:?} is out of range"));
            }
            let secs = h * 3600 + m * 60;
            return Ok(Zone::Fixed(if s.starts_with('-') { -secs } else { secs }));
        }
        s.parse::<chrono_tz::Tz>()
            .map(Zone::Named)
            .map_err(|_| format!("unknown time zone {s:?}"))
    }
}

impl std::fmt::Display for Zone {
    /// The zone as Arrow names it: `America/New_York`, `+05:30`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Zone::Named(tz) => f.write_str(tz.name()),
            Zone::Fixed(o) => {
                let a = o.unsigned_abs();
                let sign = if *o < 0 { '-' } else { '+' };
                write!(f, "{sign}{:02}:{:02}", a / 3600, a % 3600 / 60)
            }
        }
    }
}

/// Instants (seconds) the zone database is asked about: chrono's range,
/// well inside it. Further out the offset is the one at the bound.
const ZONE_RANGE_S: i64 = 200_000 * 365 * 86_400;

impl Zone {
    /// Whether this zone is UTC under another name: its local clock is
    /// UTC's, so calendar steps need no zone.
    pub fn is_utc(self) -> bool {
        match self {
            Zone::Fixed(o) => o == 0,
            Zone::Named(tz) => matches!(
                tz.name(),
                "UTC"
                    | "Etc/UTC"
                    | "Etc/UCT"
                    | "UCT"
                    | "Etc/Universal"
                    | "Universal"
                    | "Etc/Zulu"
                    | "Zulu"
                    | "Etc/GMT"
                    | "GMT"
                    | "Etc/GMT0"
                    | "GMT0"
                    | "Etc/GMT+0"
                    | "Etc/GMT-0"
                    | "GMT+0"
                    | "GMT-0"
                    | "Etc/Greenwich"
                    | "Greenwich"
            ),
        }
    }

    /// The offset (seconds east of UTC) at the instant `u` (seconds since
    /// the epoch).
    pub fn offset_at(self, u: i64) -> i32 {
        use chrono::{Offset, TimeZone};
        match self {
            Zone::Fixed(o) => o,
            Zone::Named(tz) => {
                let u = u.clamp(-ZONE_RANGE_S, ZONE_RANGE_S);
                match chrono::DateTime::from_timestamp(u, 0) {
                    Some(d) => tz
                        .offset_from_utc_datetime(&d.naive_utc())
                        .fix()
                        .local_minus_utc(),
                    None => 0,
                }
            }
        }
    }

    /// The instant (seconds since the epoch) of local time `n` (seconds
    /// since the local epoch), RFC 5545's way: a local time that occurs
    /// twice takes the instant with offset `prefer` if one has it (the
    /// offset the arithmetic started from), else the earlier; one that
    /// does not occur (a gap) is read with the offset before the gap.
    /// `None` where the instant leaves i64.
    fn localize(self, n: i128, prefer: i32) -> Option<i64> {
        use chrono::{LocalResult, Offset, TimeZone};
        let at = |o: i32| i64::try_from(n - i128::from(o)).ok();
        let tz = match self {
            Zone::Fixed(o) => return at(o),
            Zone::Named(tz) => tz,
        };
        let q = i64::try_from(n.clamp(-i128::from(ZONE_RANGE_S), i128::from(ZONE_RANGE_S))).ok()?;
        let naive = chrono::DateTime::from_timestamp(q, 0)?.naive_utc();
        match tz.offset_from_local_datetime(&naive) {
            LocalResult::Single(o) => at(o.fix().local_minus_utc()),
            LocalResult::Ambiguous(a, b) => {
                let (oa, ob) = (a.fix().local_minus_utc(), b.fix().local_minus_utc());
                if oa == prefer {
                    at(oa)
                } else if ob == prefer {
                    at(ob)
                } else {
                    // The earlier instant: the larger offset.
                    at(oa.max(ob))
                }
            }
            // In a gap: the offset a day before (before the gap).
            LocalResult::None => at(self.offset_at(q.saturating_sub(86_400))),
        }
    }
}

/// How far back the window of a row at `t` reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Window {
    /// `w` units of the order column back: `t - w`.
    Fixed(i64),
    /// `months` calendar months back on the civil date (day clamped to the
    /// month's last), then `then` units more, on an order column of `unit`.
    Calendar {
        /// Calendar months (a quarter is 3, a year 12).
        months: u32,
        /// The fixed part after the months, in the column's units.
        then: i64,
        /// What the order column counts.
        unit: CalendarUnit,
    },
    /// Calendar steps on the local clock of `zone` (see the module doc):
    /// `months` back, then `weeks`, then `days`, each mapped back to an
    /// instant, then `then` units of absolute time, on a timestamp column
    /// of `unit` in that zone.
    Zoned {
        /// Calendar months (a quarter is 3, a year 12).
        months: u32,
        /// Local weeks (a step of its own, as Polars takes it).
        weeks: u32,
        /// Local days.
        days: u32,
        /// The absolute part after the calendar steps, in the column's units.
        then: i64,
        /// What the order column counts (not [`CalendarUnit::Days`]: a
        /// date has no zone).
        unit: CalendarUnit,
        /// The column's time zone.
        zone: Zone,
    },
}

impl From<i64> for Window {
    fn from(w: i64) -> Self {
        Window::Fixed(w)
    }
}

impl Window {
    /// The fixed length, or `None` for a calendar window.
    pub const fn fixed(self) -> Option<i64> {
        match self {
            Window::Fixed(w) => Some(w),
            Window::Calendar { .. } | Window::Zoned { .. } => None,
        }
    }

    /// The fixed part, which must not be negative.
    pub const fn length(self) -> i64 {
        match self {
            Window::Fixed(w) => w,
            Window::Calendar { then, .. } | Window::Zoned { then, .. } => then,
        }
    }

    /// `t - w`, or `None` when it lies below `i64::MIN` (the window has no
    /// lower edge). For a fixed window it never decreases as `t` grows; a
    /// calendar window's can, at a clamped month end (see [`Window::reach`]).
    pub fn lower(self, t: i64) -> Option<i64> {
        match self {
            Window::Fixed(w) => t.checked_sub(w),
            Window::Calendar { months, then, unit } => {
                let per = unit.per_day();
                let day = days_back(t.div_euclid(per), months);
                edge(day, t.rem_euclid(per), per, then)
            }
            Window::Zoned {
                months,
                weeks,
                days,
                then,
                unit,
                zone,
            } => {
                let per = unit.per_second();
                let mut u = t.div_euclid(per);
                // Each step: the local time of u (one offset lookup), the
                // calendar step, the instant of the result.
                if months > 0 {
                    let o = zone.offset_at(u);
                    let n = i128::from(u) + i128::from(o);
                    let day = i64::try_from(n.div_euclid(DAY_S)).ok()?;
                    let n2 = days_back(day, months) * DAY_S + n.rem_euclid(DAY_S);
                    u = zone.localize(n2, o)?;
                }
                for d in [weeks.saturating_mul(7), days] {
                    if d > 0 {
                        let o = zone.offset_at(u);
                        let n2 = i128::from(u) + i128::from(o) - i128::from(d) * DAY_S;
                        u = zone.localize(n2, o)?;
                    }
                }
                let r = i128::from(u) * i128::from(per) + i128::from(t.rem_euclid(per))
                    - i128::from(then);
                i64::try_from(r).ok()
            }
        }
    }

    /// The lowest `lower(u)` of any `u >= t`: how far back the rows from
    /// `t` on can reach, which bounds what a rank or a chunk must hold
    /// below its first row. `lower(t)` itself for a fixed window; for a
    /// calendar window the edge of the start of `t`'s day (at a clamped
    /// month end a later row's edge can lie below an earlier row's, but
    /// never below the edge of an earlier day's start).
    pub fn reach(self, t: i64) -> Option<i64> {
        match self {
            Window::Fixed(_) => self.lower(t),
            Window::Calendar { months, then, unit } => {
                let per = unit.per_day();
                edge(days_back(t.div_euclid(per), months), 0, per, then)
            }
            Window::Zoned {
                months,
                weeks,
                days,
                then,
                unit,
                ..
            } => {
                // A later row's local time is at most a day (any offset)
                // below t read as UTC; each calendar step keeps the local
                // day order (a gap only moves a time forward); the instant
                // is at most a day from its local time. Another day of
                // slack covers two transitions within a day.
                let per = unit.per_second();
                let day0 = t.div_euclid(per).div_euclid(86_400) - 1;
                let day = days_back(day0, months) - i128::from(weeks) * 7 - i128::from(days) - 2;
                let r = day * DAY_S * i128::from(per) - i128::from(then);
                i64::try_from(r).ok()
            }
        }
    }

    /// [`Window::lower`] for a run of rows: a calendar window's date
    /// arithmetic runs once per day of consecutive rows, not once per row
    /// (sorted rows of one day come one after the other).
    pub fn cursor(self) -> LowerCursor {
        LowerCursor {
            window: self,
            day: None,
        }
    }
}

/// [`Window::lower`] with the last day's calendar step kept (see
/// [`Window::cursor`]).
#[derive(Debug, Clone)]
pub struct LowerCursor {
    window: Window,
    /// The last day seen and that day moved back (`days_back`).
    day: Option<(i64, i128)>,
}

impl LowerCursor {
    /// `t - w` as [`Window::lower`] gives it.
    #[inline]
    pub fn lower(&mut self, t: i64) -> Option<i64> {
        let Window::Calendar { months, then, unit } = self.window else {
            return self.window.lower(t);
        };
        let per = unit.per_day();
        let (day, tod) = (t.div_euclid(per), t.rem_euclid(per));
        let back = match self.day {
            Some((d, b)) if d == day => b,
            _ => {
                let b = days_back(day, months);
                self.day = Some((day, b));
                b
            }
        };
        edge(back, tod, per, then)
    }
}

/// `day * per + tod - then` (all in i128), or `None` below `i64::MIN`
/// (moving back only lowers t, so nothing lands above `i64::MAX`).
fn edge(day: i128, tod: i64, per: i64, then: i64) -> Option<i64> {
    i64::try_from(day * i128::from(per) + i128::from(tod) - i128::from(then)).ok()
}

/// Day `day` moved `months` calendar months back, its day of month
/// clamped to the target month's last.
fn days_back(day: i64, months: u32) -> i128 {
    if months == 0 {
        return day.into();
    }
    let (y, m, d) = civil_from_days(i128::from(day));
    let total = y * 12 + i128::from(m - 1) - i128::from(months);
    let (y2, m2) = (total.div_euclid(12), (total.rem_euclid(12) + 1) as u32);
    days_from_civil(y2, m2, d.min(days_in_month(y2, m2)))
}

fn is_leap(y: i128) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: i128, m: u32) -> u32 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's
/// `days_from_civil`); i128, so every i64 day count and its year fit.
fn days_from_civil(y: i128, m: u32, d: u32) -> i128 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i128::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i128::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The proleptic Gregorian date (year, month, day) of a day count since
/// 1970-01-01 (H. Hinnant's `civil_from_days`).
fn civil_from_days(z: i128) -> (i128, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const DAY_US: i64 = 86_400_000_000;

    /// Microseconds of a date and time, by counting days year by year
    /// and month by month from 1970 (independent of the civil formulas).
    fn us(y: i64, m: u32, d: u32, h: i64) -> i64 {
        let mut days = 0i64;
        if y >= 1970 {
            for yy in 1970..y {
                days += if is_leap(yy.into()) { 366 } else { 365 };
            }
        } else {
            for yy in y..1970 {
                days -= if is_leap(yy.into()) { 366 } else { 365 };
            }
        }
        for mm in 1..m {
            days += i64::from(days_in_month(y.into(), mm));
        }
        days += i64::from(d) - 1;
        days * DAY_US + h * 3_600_000_000
    }

    fn cal(months: u32, then: i64) -> Window {
        Window::Calendar {
            months,
            then,
            unit: CalendarUnit::Micros,
        }
    }

    #[test]
    fn civil_round_trips_every_day_of_eight_centuries() {
        let (lo, hi) = (
            days_from_civil(1600, 1, 1) as i64,
            days_from_civil(2400, 12, 31) as i64,
        );
        let mut prev = civil_from_days(i128::from(lo) - 1);
        for z in lo..=hi {
            let (y, m, d) = civil_from_days(z.into());
            assert_eq!(days_from_civil(y, m, d), i128::from(z));
            // The next day of the previous date, by hand.
            let (py, pm, pd) = prev;
            let want = if pd < days_in_month(py, pm) {
                (py, pm, pd + 1)
            } else if pm < 12 {
                (py, pm + 1, 1)
            } else {
                (py + 1, 1, 1)
            };
            assert_eq!((y, m, d), want, "day {z}");
            prev = (y, m, d);
        }
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
    }

    #[test]
    fn months_clamp_to_the_end_of_the_month_and_keep_the_time() {
        let w = cal(1, 0);
        assert_eq!(w.lower(us(2024, 3, 31, 12)), Some(us(2024, 2, 29, 12)));
        assert_eq!(w.lower(us(2023, 3, 31, 12)), Some(us(2023, 2, 28, 12)));
        assert_eq!(w.lower(us(2024, 3, 1, 0)), Some(us(2024, 2, 1, 0)));
        assert_eq!(w.lower(us(2024, 1, 15, 7)), Some(us(2023, 12, 15, 7)));
        assert_eq!(
            cal(12, 0).lower(us(2024, 2, 29, 1)),
            Some(us(2023, 2, 28, 1))
        );
        assert_eq!(
            cal(3, 0).lower(us(2024, 5, 31, 0)),
            Some(us(2024, 2, 29, 0))
        );
        // Months first, then the fixed part (DuckDB and Polars agree).
        assert_eq!(
            cal(1, 15 * DAY_US).lower(us(2024, 3, 31, 12)),
            Some(us(2024, 2, 14, 12))
        );
        // Before 1970, where the day and time of day floor.
        assert_eq!(w.lower(us(1969, 3, 31, 5)), Some(us(1969, 2, 28, 5)));
        assert_eq!(
            cal(25, 0).lower(us(1901, 1, 31, 23)),
            Some(us(1898, 12, 31, 23))
        );
        // Other units.
        let days = Window::Calendar {
            months: 1,
            then: 0,
            unit: CalendarUnit::Days,
        };
        assert_eq!(
            days.lower(us(2024, 3, 30, 0) / DAY_US),
            Some(us(2024, 2, 29, 0) / DAY_US)
        );
        let ns = Window::Calendar {
            months: 1,
            then: 1,
            unit: CalendarUnit::Nanos,
        };
        assert_eq!(
            ns.lower(us(2024, 3, 31, 12) * 1000 + 5),
            Some(us(2024, 2, 29, 12) * 1000 + 4)
        );
    }

    #[test]
    fn reach_never_decreases_and_the_cursor_agrees() {
        let mut rng = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for months in [0, 1, 2, 3, 11, 12, 13, 1200] {
            let w = cal(months, (next() % 3) as i64 * DAY_US);
            let mut cur = w.cursor();
            let mut t = us(1950, 1, 1, 0);
            let mut prev = None;
            while t < us(2050, 1, 1, 0) {
                let l = w.lower(t);
                assert_eq!(cur.lower(t), l, "t {t}");
                assert!(l <= Some(t));
                let r = w.reach(t);
                assert!(r <= l && r >= prev, "reach({t}) = {r:?}, before {prev:?}");
                prev = r;
                t += (next() % (40 * DAY_US as u64)) as i64;
            }
        }
    }

    #[test]
    fn reach_bounds_every_later_edge() {
        // 2023-03-29..31 all clamp to 2023-02-28: the edges of later rows
        // with earlier times of day lie below those of earlier rows.
        let w = cal(1, 0);
        let late = us(2023, 3, 30, 23);
        let next = us(2023, 3, 31, 1);
        assert!(w.lower(next) < w.lower(late));
        assert_eq!(w.reach(late), Some(us(2023, 2, 28, 0)));
        let mut t = us(2023, 1, 1, 0);
        while t < us(2023, 6, 1, 0) {
            let r = w.reach(t);
            let mut u = t;
            while u < t + 70 * DAY_US {
                assert!(w.lower(u) >= r, "lower({u}) below reach({t})");
                u += 3_600_000_000 * 5;
            }
            t += 3_600_000_000 * 7;
        }
        assert_eq!(Window::Fixed(3).reach(10), Some(7));
    }

    #[test]
    fn the_ends_of_i64() {
        let w = Window::Calendar {
            months: 1,
            then: 0,
            unit: CalendarUnit::Nanos,
        };
        // Within a month of i64::MIN there is no lower edge.
        assert_eq!(w.lower(i64::MIN), None);
        assert_eq!(w.lower(i64::MIN + 10 * 86_400_000_000_000), None);
        assert!(w.lower(i64::MAX).is_some_and(|l| l < i64::MAX));
        let s = Window::Calendar {
            months: 1,
            then: 0,
            unit: CalendarUnit::Seconds,
        };
        assert!(s.lower(i64::MAX).is_some());
        assert_eq!(s.lower(i64::MIN), None);
        let d = Window::Calendar {
            months: u32::MAX,
            then: i64::MAX,
            unit: CalendarUnit::Days,
        };
        // i64::MAX days, ~1.3e11 days of months and i64::MAX back.
        assert!(
            d.lower(i64::MAX)
                .is_some_and(|l| (-131_000_000_000..-130_000_000_000).contains(&l))
        );
        assert_eq!(d.cursor().lower(i64::MIN), None);
        assert_eq!(Window::Fixed(5).lower(i64::MIN + 4), None);
        assert_eq!(Window::Fixed(5).lower(10), Some(5));
    }

    const H_US: i64 = 3_600_000_000;

    fn zoned(months: u32, weeks: u32, days: u32, then: i64, zone: &str) -> Window {
        Window::Zoned {
            months,
            weeks,
            days,
            then,
            unit: CalendarUnit::Micros,
            zone: zone.parse().unwrap(),
        }
    }

    /// Expected instants from Polars 2.1's `offset_by` on the same inputs
    /// (UTC hours given as `us(.., h) + minutes`).
    #[test]
    fn local_days_and_months_follow_the_zone() {
        let ny = |m, w, d, then| zoned(m, w, d, then, "America/New_York");
        let half = 30 * 60_000_000;
        // 1 day back over the fall-back: 25 hours; over the spring-forward: 23.
        assert_eq!(
            ny(0, 0, 1, 0).lower(us(2024, 11, 3, 17)),
            Some(us(2024, 11, 2, 16))
        );
        assert_eq!(
            ny(0, 0, 1, 0).lower(us(2024, 3, 10, 16)),
            Some(us(2024, 3, 9, 17))
        );
        // Hours are absolute, after the days (RFC 5545).
        assert_eq!(
            ny(0, 0, 1, H_US).lower(us(2024, 3, 10, 7) + half),
            Some(us(2024, 3, 9, 7) + half)
        );
        // A gap: 2024-03-10 02:30 does not occur; read with EST: 03:30 EDT.
        assert_eq!(
            ny(0, 0, 1, 0).lower(us(2024, 3, 11, 6) + half),
            Some(us(2024, 3, 10, 7) + half)
        );
        // A gap in the middle: 1 month to 2024-03-10 02:30 (03:30 EDT),
        // then 1 day from there (03:30 EST).
        assert_eq!(
            ny(1, 0, 1, 0).lower(us(2024, 4, 10, 6) + half),
            Some(us(2024, 3, 9, 8) + half)
        );
        // 2024-11-03 01:30 occurs twice: the offset the step started from.
        assert_eq!(
            ny(1, 0, 0, 0).lower(us(2024, 12, 3, 6) + half),
            Some(us(2024, 11, 3, 6) + half)
        );
        assert_eq!(
            ny(20, 0, 0, 0).lower(us(2025, 7, 5, 5) + half),
            Some(us(2023, 11, 5, 5) + half)
        );
        // Weeks, then days, each its own step.
        assert_eq!(
            ny(0, 1, 0, 0).lower(us(2024, 11, 10, 5) + half),
            Some(us(2024, 11, 3, 4) + half)
        );
        assert_eq!(
            ny(0, 1, 1, 0).lower(us(2024, 11, 11, 5) + half),
            Some(us(2024, 11, 3, 4) + half)
        );
        // A fixed offset's local month: 2023-03-31 01:30 +05:30 back to
        // 2023-02-28 01:30 (UTC's calendar would give 02-28 20:00 UTC).
        let ist = zoned(1, 0, 0, 0, "+05:30");
        assert_eq!(ist.lower(us(2023, 3, 30, 20)), Some(us(2023, 2, 27, 20)));
        // A zone without DST: a day is 24 hours.
        let kol = zoned(0, 0, 1, 0, "Asia/Kolkata");
        assert_eq!(kol.lower(us(2024, 6, 1, 3)), Some(us(2024, 5, 31, 3)));
        // Other units keep the part below a second.
        let ns = Window::Zoned {
            months: 0,
            weeks: 0,
            days: 1,
            then: 2,
            unit: CalendarUnit::Nanos,
            zone: "America/New_York".parse().unwrap(),
        };
        assert_eq!(
            ns.lower(us(2024, 11, 3, 17) * 1000 + 7),
            Some(us(2024, 11, 2, 16) * 1000 + 5)
        );
    }

    #[test]
    fn zones_parse_as_arrow_names_them() {
        assert_eq!("+05:30".parse::<Zone>(), Ok(Zone::Fixed(19_800)));
        assert_eq!("-0800".parse::<Zone>(), Ok(Zone::Fixed(-28_800)));
        assert_eq!("+01".parse::<Zone>(), Ok(Zone::Fixed(3_600)));
        assert!("+5:30".parse::<Zone>().is_err());
        assert!("+25:00".parse::<Zone>().is_err());
        assert!("Mars/Olympus".parse::<Zone>().is_err());
        let ny: Zone = "America/New_York".parse().unwrap();
        assert_eq!(ny.to_string(), "America/New_York");
        assert_eq!(Zone::Fixed(-19_800).to_string(), "-05:30");
        assert!("Etc/UTC".parse::<Zone>().unwrap().is_utc());
        assert!("+00:00".parse::<Zone>().unwrap().is_utc());
        assert!("Z".parse::<Zone>().unwrap().is_utc());
        assert!("utc".parse::<Zone>().unwrap().is_utc());
        assert!(!ny.is_utc());
    }

    #[test]
    fn zoned_reach_bounds_every_later_edge() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for zone in [
            "America/New_York",
            "Australia/Lord_Howe",
            "Pacific/Apia",
            "Europe/Dublin",
            "America/St_Johns",
            "-03:30",
        ] {
            for (m, w, d, then) in [(0, 0, 1, 0), (1, 0, 0, 0), (0, 1, 1, H_US), (13, 0, 2, 5)] {
                let win = zoned(m, w, d, then, zone);
                let mut cur = win.cursor();
                let mut t = us(2011, 1, 1, 0);
                let mut prev = None;
                while t < us(2013, 1, 1, 0) {
                    let l = win.lower(t);
                    assert_eq!(cur.lower(t), l, "{zone} t {t}");
                    assert!(l <= Some(t), "{zone} t {t}");
                    let r = win.reach(t);
                    assert!(r >= prev, "{zone}: reach went back at {t}");
                    prev = r;
                    // Every later edge within 40 days stays above reach(t).
                    let mut u = t;
                    for _ in 0..40 {
                        u += (next() % (DAY_US as u64)) as i64;
                        assert!(
                            win.lower(u) >= r,
                            "{zone} {m}/{w}/{d}: lower({u}) below reach({t})"
                        );
                    }
                    t += (next() % (3 * DAY_US as u64)) as i64;
                }
            }
        }
        // Far out of the zone database's range, and at the ends of i64.
        let w = zoned(1, 0, 1, 0, "America/New_York");
        assert!(w.lower(i64::MAX).is_some());
        assert_eq!(w.lower(i64::MIN), None);
        assert!(w.reach(i64::MAX).is_some_and(|r| r < i64::MAX));
        let s = Window::Zoned {
            months: u32::MAX,
            weeks: u32::MAX,
            days: u32::MAX,
            then: i64::MAX,
            unit: CalendarUnit::Seconds,
            zone: "Pacific/Apia".parse().unwrap(),
        };
        assert_eq!(s.lower(0), None);
        assert_eq!(s.reach(0), None);
        assert!(s.reach(i64::MAX) <= s.lower(i64::MAX));
    }
}
