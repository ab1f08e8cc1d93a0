//! Dates and timestamps in CSV files: which columns hold them, and their
//! values parsed strictly.
//!
//! Arrow's CSV reader infers a timestamp's unit from the fractions in the
//! rows it samples and then truncates finer values silently: a column of
//! whole seconds in its first 10,000 rows read a later `...:01.500` as
//! `...:01`, and a date column read a later `2024-02-01 23:00:00` as the
//! day. It also reads `2024-03-09 12:51` (no seconds) as text. So the CSV
//! source reads such columns as text and converts them here:
//!
//! - a date is written year first (`2024-03-09`, `2024/3/9`,
//!   `2024.03.09`) or day first (`09/03/2024`, `9-3-2024`, `09.03.2024`),
//!   the forms DuckDB's and Polars' readers both take, and read the same
//!   way (`03/11/2024` is the 3rd of November in both; month first,
//!   `11/13/2024`, is text in both);
//! - a column whose sampled values are all dates is Date32; one whose
//!   values are all dates or date-times (`T` or a space between, seconds
//!   and a fraction optional, `Z` or an offset optional) is a timestamp in
//!   microseconds, as DuckDB and Polars read one, or in nanoseconds where
//!   a sampled fraction has more than six digits. Where a sampled value
//!   names its zone (`Z`, `+02:00`) the column is in UTC (every value the
//!   instant in UTC; one without a zone read as UTC), as DuckDB's
//!   `TIMESTAMPTZ` and Polars' `Datetime(tz="UTC")`; else it has no zone;
//! - a later value that the column's type cannot hold exactly (a time in a
//!   date column, digits below the unit) fails the read, naming the file's
//!   line, instead of losing digits.

use std::borrow::Cow;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{ArrayRef, Date32Array, RecordBatch, StringArray};
use arrow_array::{TimestampMicrosecondArray, TimestampNanosecondArray};
use arrow_cast::parse::string_to_datetime;
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use chrono::Utc;

use crate::error::{DataError, Result};

/// What a text value is, when it is a date or a date-time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// `YYYY-MM-DD`.
    Date,
    /// A date-time whose fraction has this many digits (0 without one).
    DateTime { digits: u32 },
}

/// `s` with its date written `YYYY-MM-DD` (borrowed where it already
/// is), where it starts with a date in one of the forms of the module doc
/// followed by nothing, a space or `T`; `None` otherwise. Only the digits
/// are moved: whether they make a date is the parser's question.
fn iso(s: &str) -> Option<Cow<'_, str>> {
    let b = s.as_bytes();
    let digits = |from: usize| {
        b[from.min(b.len())..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count()
    };
    let a = digits(0);
    let sep = *b.get(a)?;
    if !matches!(sep, b'-' | b'/' | b'.') {
        return None;
    }
    let m = digits(a + 1);
    let second = a + 1 + m;
    if b.get(second) != Some(&sep) {
        return None;
    }
    let c = digits(second + 1);
    let end = second + 1 + c;
    if !matches!(b.get(end), None | Some(b' ' | b'T')) {
        return None;
    }
    let (year, month, day) = match (a, m, c) {
        (4, 2, 2) if sep == b'-' => return Some(Cow::Borrowed(s)),
        (4, 1..=2, 1..=2) => (&s[..4], &s[a + 1..second], &s[second + 1..end]),
        (1..=2, 1..=2, 4) => (&s[second + 1..end], &s[a + 1..second], &s[..a]),
        _ => return None,
    };
    Some(Cow::Owned(format!(
        "{year}-{month:0>2}-{day:0>2}{}",
        &s[end..]
    )))
}

/// Whether a date-time, written as [`iso`] gives it, names its zone (`Z`
/// or an offset after the time).
fn zoned(iso: &str) -> bool {
    iso.get(11..)
        .is_some_and(|time| time.bytes().any(|c| matches!(c, b'Z' | b'z' | b'+' | b'-')))
}

/// The shape of `s`, a value written as [`iso`] gives it (`None`: neither
/// a date nor a date-time).
fn shape(s: &str) -> Option<Shape> {
    let b = s.as_bytes();
    let date = b.len() >= 10
        && b[..10].iter().enumerate().all(|(i, c)| {
            if i == 4 || i == 7 {
                *c == b'-'
            } else {
                c.is_ascii_digit()
            }
        });
    if !date {
        return None;
    }
    parse(s).ok()?;
    if b.len() == 10 {
        return Some(Shape::Date);
    }
    let digits = fraction_digits(s);
    // Finer than a nanosecond: no timestamp holds it (Arrow's parser
    // would drop the digits past the ninth).
    if digits > 9 {
        return None;
    }
    Some(Shape::DateTime { digits })
}

/// Digits of a date-time's fraction of a second (0 without one).
fn fraction_digits(s: &str) -> u32 {
    let b = s.as_bytes();
    match b.get(19) {
        Some(b'.') => b[20..].iter().take_while(|c| c.is_ascii_digit()).count() as u32,
        _ => 0,
    }
}

/// `s` as an instant: Arrow's parser, after `HH:MM` without seconds gets
/// `:00` (which that parser does not take).
fn parse(s: &str) -> std::result::Result<chrono::DateTime<Utc>, arrow_schema::ArrowError> {
    let b = s.as_bytes();
    let minutes_only = b.len() >= 16
        && b[13] == b':'
        && b[11..13].iter().chain(&b[14..16]).all(u8::is_ascii_digit)
        && b.get(16).is_none_or(|c| *c != b':' && !c.is_ascii_digit());
    if minutes_only {
        string_to_datetime(&Utc, &format!("{}:00{}", &s[..16], &s[16..]))
    } else {
        string_to_datetime(&Utc, s)
    }
}

/// The type of a column whose sampled values (non-null) are `values`,
/// where every one is a date or a date-time; `None` otherwise (or when
/// there are none).
pub(crate) fn infer(values: &StringArray) -> Option<DataType> {
    let mut any = false;
    let mut times = false;
    let mut zone = false;
    let mut digits = 0;
    for v in values.iter().flatten() {
        any = true;
        let v = iso(v)?;
        match shape(&v)? {
            Shape::Date => {}
            Shape::DateTime { digits: d } => {
                times = true;
                zone |= zoned(&v);
                digits = digits.max(d);
            }
        }
    }
    let unit = if digits > 6 {
        TimeUnit::Nanosecond
    } else {
        TimeUnit::Microsecond
    };
    match (any, times) {
        (false, _) => None,
        (true, false) => Some(DataType::Date32),
        (true, true) => Some(timestamp(unit, zone)),
    }
}

/// A timestamp type: in UTC where the text named zones (`zone`), else
/// without a zone (values are instants in UTC either way).
pub(crate) fn timestamp(unit: TimeUnit, zone: bool) -> DataType {
    DataType::Timestamp(unit, zone.then(|| UTC.into()))
}

/// The zone of a column whose text named zones.
const UTC: &str = "UTC";

/// The common type of two files' types of one CSV column where both are
/// this module's (dates, timestamps with or without [`UTC`]): a timestamp
/// in the finer unit, in UTC where either is (a value without a zone is
/// read as UTC), dates where both are; `None` for other pairs.
pub(crate) fn common_type(a: &DataType, b: &DataType) -> Option<DataType> {
    let time = |t: &DataType| match t {
        DataType::Date32 => Some((None, false)),
        DataType::Timestamp(u, z) if converted(t) => Some((Some(*u), z.is_some())),
        _ => None,
    };
    let ((u, zu), (v, zv)) = (time(a)?, time(b)?);
    Some(match (u, v) {
        (None, None) => DataType::Date32,
        (Some(u), None) | (None, Some(u)) => timestamp(u, zu || zv),
        (Some(u), Some(v)) => timestamp(crate::widen::finer(u, v), zu || zv),
    })
}

/// Whether a column of this (table) type is read as text and converted
/// here.
pub(crate) fn converted(t: &DataType) -> bool {
    match t {
        DataType::Date32 => true,
        DataType::Timestamp(_, z) => z.as_deref().is_none_or(|z| z == UTC),
        _ => false,
    }
}

/// The schema the reader parses with: `table`'s, with the columns this
/// module converts as text.
pub(crate) fn read_schema(table: &SchemaRef) -> SchemaRef {
    if !table.fields().iter().any(|f| converted(f.data_type())) {
        return table.clone();
    }
    Arc::new(Schema::new(
        table
            .fields()
            .iter()
            .map(|f| {
                if converted(f.data_type()) {
                    Arc::new(Field::new(f.name(), DataType::Utf8, true))
                } else {
                    f.clone()
                }
            })
            .collect::<Vec<_>>(),
    ))
}

/// The line of the CSV file at `path` on which its record `record` starts
/// (the header is record 0; lines count from 1), counting the line breaks
/// inside quoted fields, which a record number does not; `record + 1`
/// where the file cannot be read that far. For error messages only: it
/// reads the file up to that record.
pub(crate) fn record_line(path: &std::path::Path, record: usize) -> usize {
    let found = (|| {
        let mut r = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .delimiter(crate::source::csv_delimiter(path).ok()?)
            .from_reader(crate::source::open_csv(path).ok()?);
        let mut rec = csv::ByteRecord::new();
        for _ in 0..=record {
            if !r.read_byte_record(&mut rec).ok()? {
                return None;
            }
        }
        usize::try_from(rec.position()?.line()).ok()
    })();
    found.unwrap_or(record + 1)
}

/// `b` (read with [`read_schema`]) with its date and timestamp columns
/// converted to `table`'s types; `first_record` is the file's record
/// number of its first row (the header is record 0), for errors, which
/// name `path` and the row's line.
pub(crate) fn convert(
    b: RecordBatch,
    table: &SchemaRef,
    path: &std::path::Path,
    first_record: usize,
) -> Result<RecordBatch> {
    if b.schema().fields() == table.fields() {
        return Ok(b);
    }
    let cols = b
        .columns()
        .iter()
        .zip(table.fields())
        .map(|(c, f)| {
            if !converted(f.data_type()) {
                return Ok(c.clone());
            }
            let text = c.as_string_opt::<i32>().ok_or_else(|| {
                DataError::file(path, format!("column \"{}\" was not read as text", f.name()))
            })?;
            column(text, f.data_type()).map_err(|(row, why)| {
                DataError::file(
                    path,
                    format!(
                        "line {}: value '{}' of column \"{}\" {why}, the type inferred from the file's first 10,000 rows (give such data as Parquet, or with a value of that kind in those rows)",
                        record_line(path, first_record + row),
                        text.value(row),
                        f.name()
                    ),
                )
            })
        })
        .collect::<Result<Vec<ArrayRef>>>()?;
    Ok(RecordBatch::try_new(table.clone(), cols)?)
}

/// A text column as `t` (Date32, or a timestamp in us or ns); on failure
/// the row and why.
fn column(text: &StringArray, t: &DataType) -> std::result::Result<ArrayRef, (usize, String)> {
    // Each value written as `iso` gives it (`not`: why one that is no
    // date at all fails).
    let each = |not: &str, f: &dyn Fn(&str) -> std::result::Result<i64, String>| {
        text.iter()
            .enumerate()
            .map(|(i, v)| {
                v.map(|v| iso(v).ok_or_else(|| not.to_string()).and_then(|v| f(&v)))
                    .transpose()
                    .map_err(|why| (i, why))
            })
            .collect::<std::result::Result<Vec<Option<i64>>, _>>()
    };
    Ok(match t {
        DataType::Date32 => {
            let not = "is not a date (Date32)";
            let days = each(not, &|v| {
                if shape(v) != Some(Shape::Date) {
                    return Err(not.into());
                }
                let d = parse(v).map_err(|e| e.to_string())?;
                Ok(d.timestamp().div_euclid(86_400))
            })?;
            let days: Vec<Option<i32>> = days
                .into_iter()
                .map(|d| d.and_then(|d| i32::try_from(d).ok()))
                .collect();
            Arc::new(Date32Array::from(days))
        }
        DataType::Timestamp(TimeUnit::Nanosecond, zone) => {
            let not = "is not a date-time (Timestamp(ns))";
            let ns = each(not, &|v| {
                if fraction_digits(v) > 9 {
                    return Err("has digits below a nanosecond (Timestamp(ns))".into());
                }
                let d = parse(v).map_err(|_| not.to_string())?;
                d.timestamp_nanos_opt().ok_or_else(|| {
                    "lies outside the years 1677-2262 of nanosecond timestamps".into()
                })
            })?;
            Arc::new(TimestampNanosecondArray::from(ns).with_timezone_opt(zone.clone()))
        }
        DataType::Timestamp(_, zone) => {
            let not = "is not a date-time (Timestamp(us))";
            let us = each(not, &|v| {
                let d = parse(v).map_err(|_| not.to_string())?;
                if d.timestamp_subsec_nanos() % 1000 != 0 || fraction_digits(v) > 9 {
                    return Err("has digits below a microsecond (Timestamp(us))".into());
                }
                Ok(d.timestamp_micros())
            })?;
            Arc::new(TimestampMicrosecondArray::from(us).with_timezone_opt(zone.clone()))
        }
        t => {
            return Err((
                0,
                format!("is read as {t}, which CSV text is not converted to"),
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Array;

    fn strings(v: &[Option<&str>]) -> StringArray {
        StringArray::from(v.to_vec())
    }

    #[test]
    fn infers_dates_and_timestamps_by_their_finest_value() {
        let t = |v: &[Option<&str>]| infer(&strings(v));
        assert_eq!(t(&[Some("2024-01-01"), None]), Some(DataType::Date32));
        let us = Some(timestamp(TimeUnit::Microsecond, false));
        let us_utc = Some(timestamp(TimeUnit::Microsecond, true));
        assert_eq!(t(&[Some("2024-01-01 00:00:00"), Some("2024-01-01")]), us);
        // A value that names its zone puts the column in UTC.
        assert_eq!(
            t(&[Some("2024-03-09 12:51"), Some("2024-03-09T12:52Z")]),
            us_utc
        );
        assert_eq!(t(&[Some("2024-01-01T00:00:00.123456+05:30")]), us_utc);
        assert_eq!(t(&[Some("2024-01-01T00:00:00-08:00")]), us_utc);
        assert_eq!(
            t(&[Some("2024-01-01 00:00:00.1234567")]),
            Some(timestamp(TimeUnit::Nanosecond, false))
        );
        assert_eq!(t(&[Some("2024-01-01"), Some("x")]), None);
        assert_eq!(t(&[Some("2024-13-01 00:00:00")]), None);
        // Finer than a nanosecond: no timestamp holds it exactly.
        assert_eq!(t(&[Some("2024-01-01 00:00:00.1234567891")]), None);
        assert_eq!(t(&[None]), None);
    }

    /// Year-first and day-first dates, with `-`, `/` or `.` and one or
    /// two digits of day and month, read as DuckDB and Polars read them;
    /// month first, a two-digit year and mixed separators are no dates.
    #[test]
    fn reads_dates_written_year_first_or_day_first() {
        let iso = |s: &str| iso(s).map(|c| c.into_owned());
        for (text, want) in [
            ("2024-03-09", "2024-03-09"),
            ("2024/3/9", "2024-03-09"),
            ("2024.03.09 10:00", "2024-03-09 10:00"),
            ("09/03/2024", "2024-03-09"),
            ("9-3-2024T10:00:00Z", "2024-03-09T10:00:00Z"),
            ("13.11.2024 19:21:29.5", "2024-11-13 19:21:29.5"),
        ] {
            assert_eq!(iso(text).as_deref(), Some(want), "{text}");
        }
        for text in [
            "09/03/24",
            "2024/03-09",
            "2024-03-09x",
            "123/4/2024",
            "2024",
            "",
            "1.5",
        ] {
            assert_eq!(iso(text), None, "{text}");
        }
        let t = |v: &[Option<&str>]| infer(&strings(v));
        assert_eq!(
            t(&[Some("03/11/2024"), Some("4.12.2024"), Some("2024/12/31")]),
            Some(DataType::Date32)
        );
        assert_eq!(
            t(&[Some("13/11/2024 19:21:29"), Some("04/12/2024 10:00")]),
            Some(timestamp(TimeUnit::Microsecond, false))
        );
        // Month first (the 13th month) and a day past the month's end.
        assert_eq!(t(&[Some("11/13/2024")]), None);
        assert_eq!(t(&[Some("31/02/2024")]), None);
        // The values: day first, then converted as ISO text is.
        let table: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("d", DataType::Date32, true),
            Field::new("t", timestamp(TimeUnit::Microsecond, true), true),
        ]));
        let b = RecordBatch::try_new(
            read_schema(&table),
            vec![
                Arc::new(strings(&[Some("03/11/2024"), Some("1970.1.2")])),
                Arc::new(strings(&[
                    Some("03/11/2024 01:00+01:00"),
                    Some("2024/11/3 00:00:00.25"),
                ])),
            ],
        )
        .unwrap();
        let b = convert(b, &table, std::path::Path::new("x.csv"), 1).unwrap();
        let d = b.column(0).as_any().downcast_ref::<Date32Array>().unwrap();
        assert_eq!((d.value(0), d.value(1)), (20_030, 1));
        let ts = b
            .column(1)
            .as_any()
            .downcast_ref::<TimestampMicrosecondArray>()
            .unwrap();
        assert_eq!(ts.timezone(), Some(UTC));
        assert_eq!(
            (ts.value(0), ts.value(1)),
            (20_030 * 86_400_000_000, 20_030 * 86_400_000_000 + 250_000)
        );
    }

    /// Two files' types of one column: the finer unit, UTC where either
    /// is, dates only where both are.
    #[test]
    fn files_of_dates_and_timestamps_meet_in_one_type() {
        let (us, ns) = (TimeUnit::Microsecond, TimeUnit::Nanosecond);
        let c = |a: &DataType, b: &DataType| common_type(a, b);
        assert_eq!(
            c(&DataType::Date32, &DataType::Date32),
            Some(DataType::Date32)
        );
        assert_eq!(
            c(&DataType::Date32, &timestamp(us, true)),
            Some(timestamp(us, true))
        );
        assert_eq!(
            c(&timestamp(ns, false), &timestamp(us, true)),
            Some(timestamp(ns, true))
        );
        assert_eq!(c(&timestamp(us, false), &DataType::Utf8), None);
        let other = DataType::Timestamp(us, Some("+02:00".into()));
        assert_eq!(c(&other, &timestamp(us, false)), None);
    }

    /// A record's line counts the line breaks of the quoted fields before
    /// it; an unreadable file or a record past its end gives record + 1.
    #[test]
    fn record_lines_count_quoted_line_breaks() {
        let path = std::env::temp_dir().join(format!("braid-recline-{}.csv", std::process::id()));
        std::fs::write(&path, "a,b\n1,\"x\ny\"\n2,z\n3,\"p\n\nq\"\n4,w\n").unwrap();
        let lines: Vec<usize> = (0..5).map(|r| record_line(&path, r)).collect();
        assert_eq!(lines, [1, 2, 4, 5, 8]);
        assert_eq!(record_line(&path, 9), 10);
        assert_eq!(record_line(std::path::Path::new("/nonexistent.csv"), 3), 4);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn converts_exactly_or_names_the_line() {
        let table: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("d", DataType::Date32, true),
            Field::new("t", timestamp(TimeUnit::Microsecond, false), true),
        ]));
        let read = |d: &[Option<&str>], t: &[Option<&str>]| {
            let b = RecordBatch::try_new(
                read_schema(&table),
                vec![Arc::new(strings(d)), Arc::new(strings(t))],
            )
            .unwrap();
            convert(b, &table, std::path::Path::new("x.csv"), 1)
        };
        let b = read(
            &[Some("1969-12-31"), None],
            &[
                Some("2024-02-01 00:00:01.5"),
                Some("2024-02-01T00:01+01:00"),
            ],
        )
        .unwrap();
        let d = b.column(0).as_any().downcast_ref::<Date32Array>().unwrap();
        assert_eq!((d.value(0), d.is_null(1)), (-1, true));
        let t = b
            .column(1)
            .as_any()
            .downcast_ref::<TimestampMicrosecondArray>()
            .unwrap();
        assert_eq!(t.value(0), 1_706_745_601_500_000);
        assert_eq!(t.value(1), 1_706_745_660_000_000 - 3_600_000_000);
        let e = read(&[Some("2024-02-01 23:00:00"), None], &[None, None])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 2: value '2024-02-01 23:00:00' of column \"d\" is not a date"),
            "{e}"
        );
        let e = read(&[None, None], &[None, Some("2024-02-01 00:00:00.1234567")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 3:") && e.contains("below a microsecond"),
            "{e}"
        );
        // Past a nanosecond's digits (Arrow's parser would drop them).
        let e = read(
            &[None, None],
            &[None, Some("2024-02-01 00:00:00.1230000001")],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("below a microsecond"), "{e}");
        let ns: SchemaRef = Arc::new(Schema::new(vec![Field::new(
            "t",
            timestamp(TimeUnit::Nanosecond, false),
            true,
        )]));
        let b = RecordBatch::try_new(
            read_schema(&ns),
            vec![Arc::new(strings(&[
                Some("2024-02-01 00:00:00.123456789"),
                Some("2024-02-01 00:00:00.1234567891"),
            ]))],
        )
        .unwrap();
        let e = convert(b, &ns, std::path::Path::new("x.csv"), 1)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 3:") && e.contains("below a nanosecond"),
            "{e}"
        );
    }
}
