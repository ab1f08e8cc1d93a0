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
            Window::Calendar { .. } => None,
        }
    }

    /// The fixed part, which must not be negative.
    pub const fn length(self) -> i64 {
        match self {
            Window::Fixed(w) => w,
            Window::Calendar { then, .. } => then,
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
}
