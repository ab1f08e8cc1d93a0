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
//! - a column whose sampled values are all dates (`YYYY-MM-DD`) is Date32;
//!   one whose values are all dates or date-times (`T` or a space between,
//!   seconds and a fraction optional, `Z` or an offset optional: the
//!   instant in UTC) is a timestamp in microseconds, as DuckDB and Polars
//!   read one, or in nanoseconds where a sampled fraction has more than six
//!   digits;
//! - a later value that the column's type cannot hold exactly (a time in a
//!   date column, digits below the unit) fails the read, naming the file's
//!   line, instead of losing digits.

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

/// The shape of `s` (`None`: neither a date nor a date-time).
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
    let mut digits = 0;
    for v in values.iter().flatten() {
        any = true;
        match shape(v)? {
            Shape::Date => {}
            Shape::DateTime { digits: d } => {
                times = true;
                digits = digits.max(d);
            }
        }
    }
    match (any, times) {
        (false, _) => None,
        (true, false) => Some(DataType::Date32),
        (true, true) => Some(timestamp(if digits > 6 {
            TimeUnit::Nanosecond
        } else {
            TimeUnit::Microsecond
        })),
    }
}

/// A timestamp type without a zone (values are instants in UTC).
pub(crate) fn timestamp(unit: TimeUnit) -> DataType {
    DataType::Timestamp(unit, None)
}

/// Whether a column of this (table) type is read as text and converted
/// here.
pub(crate) fn converted(t: &DataType) -> bool {
    matches!(t, DataType::Date32 | DataType::Timestamp(_, None))
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
    let each = |f: &dyn Fn(&str) -> std::result::Result<i64, String>| {
        text.iter()
            .enumerate()
            .map(|(i, v)| v.map(f).transpose().map_err(|why| (i, why)))
            .collect::<std::result::Result<Vec<Option<i64>>, _>>()
    };
    Ok(match t {
        DataType::Date32 => {
            let days = each(&|v| {
                if shape(v) != Some(Shape::Date) {
                    return Err("is not a date (Date32)".into());
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
        DataType::Timestamp(TimeUnit::Nanosecond, None) => {
            Arc::new(TimestampNanosecondArray::from(each(&|v| {
                if fraction_digits(v) > 9 {
                    return Err("has digits below a nanosecond (Timestamp(ns))".into());
                }
                let d = parse(v).map_err(|_| "is not a date-time (Timestamp(ns))".to_string())?;
                d.timestamp_nanos_opt().ok_or_else(|| {
                    "lies outside the years 1677-2262 of nanosecond timestamps".into()
                })
            })?))
        }
        _ => Arc::new(TimestampMicrosecondArray::from(each(&|v| {
            let d = parse(v).map_err(|_| "is not a date-time (Timestamp(us))".to_string())?;
            if d.timestamp_subsec_nanos() % 1000 != 0 || fraction_digits(v) > 9 {
                return Err("has digits below a microsecond (Timestamp(us))".into());
            }
            Ok(d.timestamp_micros())
        })?)),
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
        let us = Some(timestamp(TimeUnit::Microsecond));
        assert_eq!(t(&[Some("2024-01-01 00:00:00"), Some("2024-01-01")]), us);
        assert_eq!(
            t(&[Some("2024-03-09 12:51"), Some("2024-03-09T12:52Z")]),
            us
        );
        assert_eq!(t(&[Some("2024-01-01T00:00:00.123456+05:30")]), us);
        assert_eq!(
            t(&[Some("2024-01-01 00:00:00.1234567")]),
            Some(timestamp(TimeUnit::Nanosecond))
        );
        assert_eq!(t(&[Some("2024-01-01"), Some("x")]), None);
        assert_eq!(t(&[Some("2024-13-01 00:00:00")]), None);
        // Finer than a nanosecond: no timestamp holds it exactly.
        assert_eq!(t(&[Some("2024-01-01 00:00:00.1234567891")]), None);
        assert_eq!(t(&[None]), None);
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
            Field::new("t", timestamp(TimeUnit::Microsecond), true),
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
            timestamp(TimeUnit::Nanosecond),
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
