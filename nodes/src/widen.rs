//! The type a column takes where the files of one table declare it
//! differently: the narrowest type that holds every file's values exactly,
//! as DuckDB reads such a directory (`int32` in one file and `int64` in
//! another read as `int64`; `string`, `large_string` and dictionaries of
//! strings as one string type; timestamps in the finer unit).

use arrow_schema::{DataType, TimeUnit};

/// The common type of `a` and `b`, or `None` where no type holds the
/// values of both exactly (a `uint64` and a signed integer, timestamps in
/// two zones, a number and text).
pub(crate) fn common_type(a: &DataType, b: &DataType) -> Option<DataType> {
    use DataType::*;
    if a == b {
        return Some(a.clone());
    }
    // A dictionary is its values, stored another way.
    let (a, b) = (values(a), values(b));
    if a == b {
        return Some(a.clone());
    }
    Some(match (a, b) {
        (Null, t) | (t, Null) => t.clone(),
        (x, y) if x.is_integer() && y.is_integer() => common_int(x, y)?,
        (x, y) if is_number(x) && is_number(y) => {
            if x.is_integer() || y.is_integer() {
                Float64
            } else {
                widest_float(x, y)
            }
        }
        (x, y) if is_text(x) && is_text(y) => {
            if [x, y].contains(&&LargeUtf8) {
                LargeUtf8
            } else {
                Utf8
            }
        }
        (x, y) if is_bytes(x) && is_bytes(y) => {
            if [x, y].contains(&&LargeBinary) {
                LargeBinary
            } else {
                Binary
            }
        }
        (Timestamp(u, z), Timestamp(v, w)) if z == w => Timestamp(finer(*u, *v), z.clone()),
        // One zone spelled two ways (`UTC` and `+00:00`, `+0530` and
        // `+05:30`): the same instants, under the zone's plain name.
        (Timestamp(u, Some(z)), Timestamp(v, Some(w))) if zone_name(z) == zone_name(w) => {
            Timestamp(finer(*u, *v), Some(zone_name(z).into()))
        }
        (Timestamp(u, None), Date32) | (Date32, Timestamp(u, None)) => Timestamp(*u, None),
        _ => return None,
    })
}

fn values(t: &DataType) -> &DataType {
    match t {
        DataType::Dictionary(_, v) => v,
        t => t,
    }
}

fn is_number(t: &DataType) -> bool {
    t.is_integer() || t.is_floating()
}

fn is_text(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

fn is_bytes(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView
    )
}

fn widest_float(x: &DataType, y: &DataType) -> DataType {
    let bits = |t: &DataType| t.primitive_width().unwrap_or(8);
    if bits(x) >= bits(y) {
        x.clone()
    } else {
        y.clone()
    }
}

/// The narrowest integer type holding both: a signed type wider than the
/// unsigned one where signs differ (none above 64 bits).
fn common_int(x: &DataType, y: &DataType) -> Option<DataType> {
    let bits = |t: &DataType| t.primitive_width().map(|w| w * 8);
    let (bx, by) = (bits(x)?, bits(y)?);
    let signed = |t: &DataType| t.is_signed_integer();
    let need = match (signed(x), signed(y)) {
        (true, true) | (false, false) => return Some(if bx >= by { x } else { y }.clone()),
        (true, false) => bx.max(by * 2),
        (false, true) => by.max(bx * 2),
    };
    Some(match need {
        ..=8 => DataType::Int8,
        9..=16 => DataType::Int16,
        17..=32 => DataType::Int32,
        33..=64 => DataType::Int64,
        _ => return None,
    })
}

/// A time zone's plain name: `UTC` for its spellings (`Etc/UTC`, `Z`,
/// `+00:00`, `GMT`, ...), `+HH:MM` for a fixed offset however written
/// (`+0530`, `+05`), any other name as it is.
fn zone_name(z: &str) -> String {
    const UTC: [&str; 14] = [
        "utc",
        "etc/utc",
        "uct",
        "etc/uct",
        "z",
        "zulu",
        "etc/zulu",
        "universal",
        "etc/universal",
        "gmt",
        "etc/gmt",
        "gmt0",
        "etc/gmt0",
        "greenwich",
    ];
    if UTC.contains(&z.to_ascii_lowercase().as_str()) {
        return "UTC".into();
    }
    let offset = (|| {
        let (sign, rest) = match z.as_bytes().first()? {
            b'+' => (1, &z[1..]),
            b'-' => (-1, &z[1..]),
            _ => return None,
        };
        let digits: String = rest.chars().filter(|c| *c != ':').collect();
        if !digits.bytes().all(|c| c.is_ascii_digit()) || !matches!(digits.len(), 2 | 4) {
            return None;
        }
        let h: i32 = digits[..2].parse().ok()?;
        let m: i32 = if digits.len() == 4 {
            digits[2..].parse().ok()?
        } else {
            0
        };
        (rest.len() == digits.len() || rest.as_bytes().get(2) == Some(&b':'))
            .then_some(sign * (h * 60 + m))
    })();
    match offset {
        Some(0) => "UTC".into(),
        Some(m) => format!(
            "{}{:02}:{:02}",
            if m < 0 { '-' } else { '+' },
            m.abs() / 60,
            m.abs() % 60
        ),
        None => z.to_string(),
    }
}

/// The finer of two timestamp units.
pub(crate) fn finer(u: TimeUnit, v: TimeUnit) -> TimeUnit {
    let rank = |t: TimeUnit| match t {
        TimeUnit::Second => 0,
        TimeUnit::Millisecond => 1,
        TimeUnit::Microsecond => 2,
        TimeUnit::Nanosecond => 3,
    };
    if rank(u) >= rank(v) { u } else { v }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DataType::*;
    use std::sync::Arc;

    #[test]
    fn common_types_hold_both_sides_exactly() {
        let dict = |k: DataType, v: DataType| Dictionary(Box::new(k), Box::new(v));
        let ms = Timestamp(TimeUnit::Millisecond, None);
        let ns = Timestamp(TimeUnit::Nanosecond, None);
        let zoned = |u| Timestamp(u, Some(Arc::from("America/New_York")));
        let cases: Vec<(DataType, DataType, Option<DataType>)> = vec![
            (Int32, Int64, Some(Int64)),
            (Int8, UInt8, Some(Int16)),
            (UInt32, Int64, Some(Int64)),
            (UInt32, Int32, Some(Int64)),
            (UInt16, UInt64, Some(UInt64)),
            (UInt64, Int64, None),
            (Int64, Float32, Some(Float64)),
            (Float16, Float32, Some(Float32)),
            (Null, Int32, Some(Int32)),
            (Utf8, LargeUtf8, Some(LargeUtf8)),
            (Utf8View, Utf8, Some(Utf8)),
            (dict(Int32, Utf8), Utf8, Some(Utf8)),
            (dict(Int8, Utf8), dict(Int32, Utf8), Some(Utf8)),
            (
                dict(Int32, Utf8),
                dict(Int32, Utf8),
                Some(dict(Int32, Utf8)),
            ),
            (Binary, LargeBinary, Some(LargeBinary)),
            (ms.clone(), ns.clone(), Some(ns.clone())),
            (Date32, ms.clone(), Some(ms.clone())),
            (
                zoned(TimeUnit::Second),
                zoned(TimeUnit::Microsecond),
                Some(zoned(TimeUnit::Microsecond)),
            ),
            (zoned(TimeUnit::Millisecond), ms.clone(), None),
            (
                Timestamp(TimeUnit::Microsecond, Some(Arc::from("UTC"))),
                Timestamp(TimeUnit::Millisecond, Some(Arc::from("+00:00"))),
                Some(Timestamp(TimeUnit::Microsecond, Some(Arc::from("UTC")))),
            ),
            (
                Timestamp(TimeUnit::Second, Some(Arc::from("+0530"))),
                Timestamp(TimeUnit::Second, Some(Arc::from("+05:30"))),
                Some(Timestamp(TimeUnit::Second, Some(Arc::from("+05:30")))),
            ),
            (
                Timestamp(TimeUnit::Second, Some(Arc::from("+05:30"))),
                Timestamp(TimeUnit::Second, Some(Arc::from("+05:00"))),
                None,
            ),
            (
                Timestamp(TimeUnit::Second, Some(Arc::from("Etc/UTC"))),
                Timestamp(TimeUnit::Second, Some(Arc::from("Europe/London"))),
                None,
            ),
            (Utf8, Int64, None),
            (Boolean, Int64, None),
            (Date32, Date64, None),
        ];
        for (a, b, want) in cases {
            assert_eq!(common_type(&a, &b), want, "{a} and {b}");
            assert_eq!(common_type(&b, &a), want, "{b} and {a}");
        }
    }
}
