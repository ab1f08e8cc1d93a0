//! Writing record batches as CSV that tells an empty string from a null.
//!
//! Arrow's CSV writer writes both as an empty field, so a string key `""`
//! and a null key read back as one (DuckDB and Polars write `""` for the
//! empty string and nothing for a null, and Polars reads them back apart).
//! This writer formats values as Arrow's does (its `ArrayFormatter` with
//! the default formats: RFC 3339 timestamps, nulls as nothing) and quotes
//! as the `csv` crate's "necessary" style does (a field holding a comma, a
//! quote or a line break is quoted, quotes doubled), and besides writes a
//! value whose text is empty, and a record of one empty field, as `""`.

use std::io::Write;

use arrow_array::{Array, RecordBatch};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_schema::{ArrowError, DataType, Schema};

/// Why CSV cannot hold `schema`'s columns: the first nested one (list,
/// struct, map) or binary one (Arrow writes bytes as bare hex, which
/// DuckDB and Polars read back as text or numbers: `b"abc"` would come
/// back as `616263`; Polars and pyarrow refuse to write them too), if any.
pub(crate) fn unwritable(schema: &Schema) -> Option<String> {
    let binary = |t: &DataType| {
        matches!(
            t,
            DataType::Binary
                | DataType::LargeBinary
                | DataType::BinaryView
                | DataType::FixedSizeBinary(_)
        )
    };
    let values = |t: &DataType| match t {
        DataType::Dictionary(_, v) => v.as_ref().clone(),
        t => t.clone(),
    };
    let f = schema.fields().iter().find(|f| {
        let t = values(f.data_type());
        t.is_nested() || binary(&t)
    })?;
    let kind = if values(f.data_type()).is_nested() {
        "nested"
    } else {
        "binary"
    };
    Some(format!(
        "column \"{}\" has the {kind} type {}, which CSV cannot hold (write Parquet)",
        f.name(),
        f.data_type()
    ))
}

/// The header line every writer of `schema` starts with, as bytes.
pub(crate) fn header(schema: &Schema) -> Result<Vec<u8>, ArrowError> {
    let mut w = CsvWriter::new(Vec::new(), schema)?;
    w.out.flush()?;
    Ok(std::mem::take(w.out.get_mut()))
}

/// A 64-bit date (milliseconds since the epoch, whole days by Arrow's
/// rule) is written as a date, as Parquet output stores it (a Parquet
/// date) and DuckDB and Polars read it (`DATE`, `Date`); Arrow's default
/// writes it as a date-time, `2020-01-02T00:00:00`, which reads back as a
/// timestamp.
const DATE64_FORMAT: &str = "%Y-%m-%d";

/// A CSV writer of one schema's batches.
pub(crate) struct CsvWriter<W: Write> {
    out: std::io::BufWriter<W>,
    /// One formatted value (reused).
    field: String,
}

impl<W: Write> CsvWriter<W> {
    /// A writer that has written `schema`'s header line; nested columns
    /// (lists, structs, maps) are refused here, before any row is made.
    pub(crate) fn new(out: W, schema: &Schema) -> Result<Self, ArrowError> {
        if let Some(e) = unwritable(schema) {
            return Err(ArrowError::CsvError(e));
        }
        let mut w = CsvWriter {
            out: std::io::BufWriter::with_capacity(1 << 20, out),
            field: String::new(),
        };
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        w.record(names.iter().map(|n| Some(*n)))?;
        Ok(w)
    }

    /// Writes one record: `None` is a null (an empty field).
    fn record<'a>(
        &mut self,
        fields: impl ExactSizeIterator<Item = Option<&'a str>>,
    ) -> Result<(), ArrowError> {
        let alone = fields.len() == 1;
        for (i, f) in fields.enumerate() {
            if i > 0 {
                self.out.write_all(b",")?;
            }
            write_field(&mut self.out, f, alone)?;
        }
        self.out.write_all(b"\n")?;
        Ok(())
    }

    /// Writes the rows of `batch` (whose columns are the header's).
    pub(crate) fn write(&mut self, batch: &RecordBatch) -> Result<(), ArrowError> {
        let options = FormatOptions::default()
            .with_null("")
            .with_datetime_format(Some(DATE64_FORMAT));
        let columns = batch.columns();
        let formatters = columns
            .iter()
            .map(|a| ArrayFormatter::try_new(a.as_ref(), &options))
            .collect::<Result<Vec<_>, _>>()?;
        // Logical nulls: a null-typed column (all null, without a validity
        // buffer) and a dictionary's null values are nulls too.
        let nulls: Vec<_> = columns.iter().map(|a| a.logical_nulls()).collect();
        let alone = columns.len() == 1;
        for row in 0..batch.num_rows() {
            for (i, (f, n)) in formatters.iter().zip(&nulls).enumerate() {
                if i > 0 {
                    self.out.write_all(b",")?;
                }
                if n.as_ref().is_some_and(|n| n.is_null(row)) {
                    write_field(&mut self.out, None, alone)?;
                    continue;
                }
                self.field.clear();
                f.value(row).write(&mut self.field).map_err(|e| {
                    ArrowError::CsvError(format!(
                        "column \"{}\": a value cannot be written as text: {e}",
                        batch.schema().field(i).name()
                    ))
                })?;
                write_field(&mut self.out, Some(&self.field), alone)?;
            }
            self.out.write_all(b"\n")?;
        }
        Ok(())
    }

    /// Flushes what is buffered (an error here is the file's).
    pub(crate) fn finish(mut self) -> Result<(), ArrowError> {
        self.out.flush()?;
        Ok(())
    }
}

/// One field: a null as nothing (but `""` where it is a record's only
/// field, which would otherwise be a blank line that readers skip), an
/// empty value as `""`, a value holding a comma, quote or line break
/// quoted with its quotes doubled, any other as it is.
fn write_field(out: &mut impl Write, f: Option<&str>, alone: bool) -> std::io::Result<()> {
    match f {
        None if alone => out.write_all(b"\"\""),
        None => Ok(()),
        Some("") => out.write_all(b"\"\""),
        Some(v) if v.bytes().any(|c| matches!(c, b',' | b'"' | b'\n' | b'\r')) => {
            out.write_all(b"\"")?;
            for (i, part) in v.split('"').enumerate() {
                if i > 0 {
                    out.write_all(b"\"\"")?;
                }
                out.write_all(part.as_bytes())?;
            }
            out.write_all(b"\"")
        }
        Some(v) => out.write_all(v.as_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{ArrayRef, Int64Array, StringArray};
    use std::sync::Arc;

    fn csv(cols: Vec<(&str, ArrayRef)>) -> String {
        let b = RecordBatch::try_from_iter(cols).unwrap();
        let mut buf = Vec::new();
        let mut w = CsvWriter::new(&mut buf, &b.schema()).unwrap();
        w.write(&b).unwrap();
        w.finish().unwrap();
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn empty_strings_and_nulls_differ_and_specials_are_quoted() {
        let s: ArrayRef = Arc::new(StringArray::from(vec![
            Some(""),
            None,
            Some("a,b"),
            Some("say \"hi\""),
            Some("two\nlines"),
            Some("plain"),
        ]));
        let n: ArrayRef = Arc::new(Int64Array::from(vec![
            Some(1),
            None,
            Some(3),
            Some(4),
            Some(5),
            Some(6),
        ]));
        assert_eq!(
            csv(vec![("s", s), ("n,x", n)]),
            "s,\"n,x\"\n\"\",1\n,\n\"a,b\",3\n\"say \"\"hi\"\"\",4\n\"two\nlines\",5\nplain,6\n"
        );
    }

    /// A null-typed column (pyarrow's type for a column of `None`s) and a
    /// dictionary's null values are written as nulls, not as `""` (which
    /// reads back as an empty string).
    #[test]
    fn null_typed_columns_and_null_dictionary_values_are_nulls() {
        use arrow_array::types::Int32Type;
        use arrow_array::{DictionaryArray, Int32Array, NullArray};
        let z: ArrayRef = Arc::new(NullArray::new(2));
        let d: ArrayRef = Arc::new(DictionaryArray::<Int32Type>::new(
            Int32Array::from(vec![0, 1]),
            Arc::new(StringArray::from(vec![Some("a"), None])),
        ));
        let n: ArrayRef = Arc::new(Int64Array::from(vec![1, 2]));
        assert_eq!(
            csv(vec![("z", z), ("d", d), ("n", n)]),
            "z,d,n\n,a,1\n,,2\n"
        );
    }

    /// 64-bit dates are written as dates (plain and dictionary-encoded),
    /// before and after the epoch; timestamps keep their time of day.
    #[test]
    fn dates_of_64_bits_are_written_as_dates() {
        use arrow_array::types::Int8Type;
        use arrow_array::{Date64Array, DictionaryArray, Int8Array, TimestampMillisecondArray};
        const DAY: i64 = 86_400_000;
        let d: ArrayRef = Arc::new(Date64Array::from(vec![
            Some(0),
            Some(18_263 * DAY),
            None,
            Some(-DAY),
        ]));
        let k: ArrayRef = Arc::new(DictionaryArray::<Int8Type>::new(
            Int8Array::from(vec![1, 0, 1, 0]),
            Arc::new(Date64Array::from(vec![DAY, 2 * DAY])),
        ));
        let t: ArrayRef = Arc::new(TimestampMillisecondArray::from(vec![DAY + 1000, 0, 0, 0]));
        assert_eq!(
            csv(vec![("d", d), ("k", k), ("t", t)]),
            "d,k,t\n1970-01-01,1970-01-03,1970-01-02T00:00:01\n\
             2020-01-02,1970-01-02,1970-01-01T00:00:00\n\
             ,1970-01-03,1970-01-01T00:00:00\n\
             1969-12-31,1970-01-02,1970-01-01T00:00:00\n"
        );
    }

    #[test]
    fn a_lone_null_field_is_not_a_blank_line() {
        let n: ArrayRef = Arc::new(Int64Array::from(vec![None, Some(2)]));
        assert_eq!(csv(vec![("n", n)]), "n\n\"\"\n2\n");
    }
}
