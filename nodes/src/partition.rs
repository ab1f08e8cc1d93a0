//! Partitioning record batches: by a hash of key columns, or by ranges
//! between sorted splitters. Keys are compared and hashed in Arrow's row
//! format, so any column types, several columns, descending order and null
//! placement all work the same way. Equal keys always land in the same
//! partition.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, Float64Array, RecordBatch, UInt32Array};
use arrow_row::{RowConverter, Rows, SortField};
use arrow_schema::SortOptions;
use arrow_select::take::take_record_batch;

use crate::error::{DataError, Result};

/// A 64-bit hash of bytes, the same on every rank and process. Ends in a
/// full avalanche (splitmix64's finaliser): every input bit reaches the
/// low bits that `% nparts` keeps. (Without it the low bits of a 4-byte
/// key, whose row is 5 bytes, never reached them: with 2, 4 or 8 ranks
/// 100 small int32, uint32 or date32 keys all went to one rank.)
pub fn hash_bytes(b: &[u8]) -> u64 {
    let mut h: u64 = 0x243f_6a88_85a3_08d3 ^ (b.len() as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut chunks = b.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = (h ^ u64::from_le_bytes(w)).wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 32;
    }
    let mut w = [0u8; 8];
    let rest = chunks.remainder();
    w[..rest.len()].copy_from_slice(rest);
    braid_kernels::hash::mix64(h ^ u64::from_le_bytes(w))
}

/// Index of the named column, or a clear error.
pub fn column_index(batch_schema: &arrow_schema::Schema, name: &str) -> Result<usize> {
    // A name that several columns carry (a CSV header can repeat one)
    // would silently pick the first.
    let times = batch_schema
        .fields()
        .iter()
        .filter(|f| f.name() == name)
        .count();
    if times > 1 {
        return Err(DataError::Invalid(format!(
            "{times} input columns are named {name:?}; rename them to tell them apart"
        )));
    }
    batch_schema
        .index_of(name)
        .map_err(|_| DataError::MissingColumn {
            name: name.to_string(),
            available: column_list(batch_schema),
        })
}

/// The schema's column names for an error, `, `-separated, each cut at
/// 100 characters and the list at 20 names (a CSV file whose header is
/// one 30 MB line printed a 30 MB error).
fn column_list(schema: &arrow_schema::Schema) -> String {
    let cut = |n: &str| match n.char_indices().nth(100) {
        Some((at, _)) => format!("{}...", &n[..at]),
        None => n.to_string(),
    };
    let names = schema.fields().iter().map(|f| cut(f.name()));
    let mut list: Vec<String> = names.take(20).collect();
    if schema.fields().len() > 20 {
        list.push(format!("... {} more", schema.fields().len() - 20));
    }
    list.join(", ")
}

/// Fails unless `batch` has `schema`'s columns: the same names and types
/// in the same order (nullability may differ). Operators that index a
/// batch's columns by the schema's positions call it on every batch they
/// take, so a chunk of another shape is a clear error (`what` names the
/// operator), not an index out of bounds or a silently wrong column.
pub fn check_columns(what: &str, schema: &arrow_schema::Schema, batch: &RecordBatch) -> Result<()> {
    let (want, got) = (schema.fields(), batch.schema_ref().fields());
    // Chunks usually share the schema's own fields: nothing to compare.
    if want == got {
        return Ok(());
    }
    let same = got.len() == want.len()
        && got
            .iter()
            .zip(want.iter())
            .all(|(g, w)| g.name() == w.name() && g.data_type() == w.data_type());
    if same {
        return Ok(());
    }
    let list = |fs: &arrow_schema::Fields| {
        fs.iter()
            .map(|f| format!("{}: {}", f.name(), f.data_type()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Err(DataError::Invalid(format!(
        "{what}: a chunk's columns ({}) differ from the schema's ({})",
        list(got),
        list(want)
    )))
}

/// A row converter for the given key columns with their sort options.
/// Float keys are encoded as [`order_key_column`] gives them (f64), so
/// they order as DuckDB and Polars order them.
pub fn converter(
    batch_schema: &arrow_schema::Schema,
    keys: &[(usize, SortOptions)],
) -> Result<RowConverter> {
    let fields = keys
        .iter()
        .map(|(i, o)| {
            SortField::new_with_options(group_key_type(batch_schema.field(*i).data_type()), *o)
        })
        .collect();
    Ok(RowConverter::new(fields)?)
}

/// The key columns of `batch` in row format (from [`converter`]).
pub fn key_rows(
    conv: &RowConverter,
    batch: &RecordBatch,
    keys: &[(usize, SortOptions)],
) -> Result<Rows> {
    let cols: Vec<ArrayRef> = keys
        .iter()
        .map(|(i, _)| order_key_column(batch.column(*i)))
        .collect::<Result<_>>()?;
    Ok(conv.convert_columns(&cols)?)
}

/// A key column as sorting compares it: floats as [`canonical_group_key`]
/// makes them, so -0.0 and 0.0 tie and every NaN (of either sign) sorts
/// above +inf, as in DuckDB and Polars (Arrow's sort and row format use
/// IEEE total order: a NaN with its sign bit set, which x86 arithmetic
/// makes, first, and -0.0 before 0.0); any other column as it is. Only
/// the comparison sees this form: the rows keep their values.
pub fn order_key_column(col: &ArrayRef) -> Result<ArrayRef> {
    Ok(canonical_group_key(col)?.unwrap_or_else(|| col.clone()))
}

/// Splits `batch` into `nparts` batches by `dest[i]` (row i's partition).
pub fn split_by(batch: &RecordBatch, dest: &[u32], nparts: usize) -> Result<Vec<RecordBatch>> {
    if dest.len() != batch.num_rows() {
        return Err(DataError::Invalid(format!(
            "{} destinations for {} rows",
            dest.len(),
            batch.num_rows()
        )));
    }
    let mut counts = vec![0usize; nparts];
    for d in dest {
        *counts.get_mut(*d as usize).ok_or_else(|| {
            DataError::Invalid(format!("destination {d} is not below {nparts} partitions"))
        })? += 1;
    }
    let mut idx: Vec<Vec<u32>> = counts.iter().map(|c| Vec::with_capacity(*c)).collect();
    for (i, d) in dest.iter().enumerate() {
        idx[*d as usize].push(i as u32);
    }
    idx.into_iter()
        .map(|ix| {
            if ix.len() == batch.num_rows() {
                return Ok(batch.clone());
            }
            Ok(take_record_batch(batch, &UInt32Array::from(ix))?)
        })
        .collect()
}

/// A key column as grouping compares it: a float column (or a dictionary
/// of floats) becomes f64 with -0.0 as 0.0 and every NaN as one NaN, as
/// DuckDB and Polars group (the row format orders floats totally, so it
/// would tell those apart); lists, fixed-size lists and structs with float
/// values inside are rebuilt with their floats so made (DuckDB and Polars
/// compare nested floats the same way); `None` for any other type, which
/// groups by its values as they are.
pub fn canonical_group_key(col: &ArrayRef) -> Result<Option<ArrayRef>> {
    use arrow_array::cast::AsArray;
    use arrow_array::{FixedSizeListArray, StructArray};
    use arrow_schema::DataType;
    if !is_float_key(col.data_type()) {
        return Ok(None);
    }
    // The canonical form of a child array (as it is where it holds no
    // float).
    let child = |a: &ArrayRef| -> Result<ArrayRef> {
        Ok(canonical_group_key(a)?.unwrap_or_else(|| a.clone()))
    };
    let out: ArrayRef = match col.data_type() {
        DataType::Float16 | DataType::Float32 | DataType::Float64 => {
            let wide = arrow_cast::cast(col, &DataType::Float64)?;
            let f = wide
                .as_any()
                .downcast_ref::<Float64Array>()
                .ok_or_else(|| DataError::Invalid("float key cast failed".into()))?;
            Arc::new(f.unary::<_, arrow_array::types::Float64Type>(|x| {
                if x.is_nan() {
                    f64::NAN
                } else if x == 0.0 {
                    0.0
                } else {
                    x
                }
            }))
        }
        // A dictionary's values, unpacked, in their canonical form.
        DataType::Dictionary(_, v) => child(&arrow_cast::cast(col, v)?)?,
        DataType::List(f) => canonical_list(col.as_list::<i32>(), f, child)?,
        DataType::LargeList(f) => canonical_list(col.as_list::<i64>(), f, child)?,
        DataType::FixedSizeList(f, size) => {
            let l = col.as_fixed_size_list();
            Arc::new(FixedSizeListArray::try_new(
                canonical_field(f),
                *size,
                child(l.values())?,
                l.nulls().cloned(),
            )?)
        }
        DataType::Struct(fields) => {
            let s = col.as_struct();
            let cols = s.columns().iter().map(child).collect::<Result<Vec<_>>>()?;
            let fields: arrow_schema::Fields = fields.iter().map(canonical_field).collect();
            Arc::new(StructArray::try_new(fields, cols, s.nulls().cloned())?)
        }
        other => {
            return Err(DataError::Invalid(format!(
                "no grouping form for key type {other}"
            )));
        }
    };
    Ok(Some(out))
}

/// A list (`i32` or `i64` offsets) with its values in their canonical
/// form (`child`), its offsets and nulls shared.
fn canonical_list<O: arrow_array::OffsetSizeTrait>(
    l: &arrow_array::GenericListArray<O>,
    f: &arrow_schema::FieldRef,
    child: impl Fn(&ArrayRef) -> Result<ArrayRef>,
) -> Result<ArrayRef> {
    Ok(Arc::new(arrow_array::GenericListArray::<O>::try_new(
        canonical_field(f),
        l.offsets().clone(),
        child(l.values())?,
        l.nulls().cloned(),
    )?))
}

/// Whether a key column of this type groups by `canonical_group_key`:
/// floats, dictionaries of floats (a categorical of floats), and lists,
/// fixed-size lists and structs with such values inside.
pub fn is_float_key(t: &arrow_schema::DataType) -> bool {
    use arrow_schema::DataType;
    match t {
        DataType::Float16 | DataType::Float32 | DataType::Float64 => true,
        DataType::Dictionary(_, v) => is_float_key(v),
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            is_float_key(f.data_type())
        }
        DataType::Struct(fields) => fields.iter().any(|f| is_float_key(f.data_type())),
        _ => false,
    }
}

/// The type [`canonical_group_key`] gives a key column of type `t`.
pub fn group_key_type(t: &arrow_schema::DataType) -> arrow_schema::DataType {
    use arrow_schema::DataType;
    if !is_float_key(t) {
        return t.clone();
    }
    match t {
        DataType::Dictionary(_, v) => group_key_type(v),
        DataType::List(f) => DataType::List(canonical_field(f)),
        DataType::LargeList(f) => DataType::LargeList(canonical_field(f)),
        DataType::FixedSizeList(f, size) => DataType::FixedSizeList(canonical_field(f), *size),
        DataType::Struct(fields) => DataType::Struct(fields.iter().map(canonical_field).collect()),
        _ => DataType::Float64,
    }
}

/// A nested type's child field with its type as [`group_key_type`] makes it.
fn canonical_field(f: &arrow_schema::FieldRef) -> arrow_schema::FieldRef {
    if is_float_key(f.data_type()) {
        Arc::new(
            f.as_ref()
                .clone()
                .with_data_type(group_key_type(f.data_type())),
        )
    } else {
        f.clone()
    }
}

/// Hash partitioning on the key columns: row i goes to
/// `hash(key_i) % nparts`. Float keys hash as `canonical_group_key` makes
/// them, so keys that group together land together.
pub fn hash_partition(
    batch: &RecordBatch,
    key_cols: &[usize],
    nparts: usize,
) -> Result<Vec<RecordBatch>> {
    if key_cols.is_empty() {
        return Err(DataError::Invalid(
            "hash partitioning needs at least one key column".into(),
        ));
    }
    if nparts == 0 {
        return Err(DataError::Invalid(
            "hash partitioning needs at least one partition".into(),
        ));
    }
    let mut fields = Vec::with_capacity(key_cols.len());
    let mut cols = Vec::with_capacity(key_cols.len());
    for &i in key_cols {
        let c = batch.columns().get(i).ok_or_else(|| {
            DataError::Invalid(format!(
                "key column {i} is not below the batch's {} columns",
                batch.num_columns()
            ))
        })?;
        let c = canonical_group_key(c)?.unwrap_or_else(|| c.clone());
        fields.push(SortField::new(c.data_type().clone()));
        cols.push(c);
    }
    let conv = RowConverter::new(fields)?;
    let rows = conv.convert_columns(&cols)?;
    let dest: Vec<u32> = (0..rows.num_rows())
        .map(|i| (hash_bytes(rows.row(i).as_ref()) % nparts as u64) as u32)
        .collect();
    split_by(batch, &dest, nparts)
}

/// The sorted splitters of a range partitioning, in the converter's row
/// format; for one ascending 8-byte integer key (int64, timestamp, date64,
/// time64, duration) whose splitters are all non-null, also as integers,
/// so that a batch without null keys is split by integer comparisons
/// instead of row encoding and `memcmp` (same destinations: the row
/// format orders such keys as integers).
#[derive(Debug, Clone)]
pub struct Splitters {
    rows: Vec<Vec<u8>>,
    ints: Option<Vec<i64>>,
}

impl Splitters {
    /// Splitters `rows` (sorted, from `conv`) for the key columns `keys`.
    pub fn new(
        schema: &arrow_schema::Schema,
        conv: &RowConverter,
        keys: &[(usize, SortOptions)],
        rows: Vec<Vec<u8>>,
    ) -> Self {
        let ints = match keys {
            [(c, o)] if !o.descending && eight_byte_int(schema.field(*c).data_type()) => {
                decode_ints(conv, schema.field(*c).data_type(), &rows)
            }
            _ => None,
        };
        Splitters { rows, ints }
    }

    /// Number of splitters (one less than the partitions).
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether there are none (one partition).
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

fn eight_byte_int(t: &arrow_schema::DataType) -> bool {
    use arrow_schema::DataType::*;
    matches!(t, Int64 | Timestamp(..) | Date64 | Time64(_) | Duration(_))
}

/// The splitters as integers, if each is a non-null value of the key's
/// type: read as the row format's valid marker then the big-endian value
/// with its sign bit flipped, and accepted only if encoding the values
/// back gives the same bytes (so a layout this does not know, or bytes
/// from a peer that are not such rows, fall back to the row path).
fn decode_ints(
    conv: &RowConverter,
    t: &arrow_schema::DataType,
    rows: &[Vec<u8>],
) -> Option<Vec<i64>> {
    let mut ints = Vec::with_capacity(rows.len());
    for r in rows {
        let [1, b @ ..] = r.as_slice() else {
            return None;
        };
        let w: [u8; 8] = b.try_into().ok()?;
        ints.push((u64::from_be_bytes(w) ^ (1 << 63)) as i64);
    }
    let values: ArrayRef = Arc::new(arrow_array::Int64Array::from(ints.clone()));
    let typed = arrow_cast::cast(&values, t).ok()?;
    let back = conv.convert_columns(&[typed]).ok()?;
    let same = back.num_rows() == rows.len()
        && rows
            .iter()
            .enumerate()
            .all(|(i, r)| back.row(i).as_ref() == r.as_slice());
    same.then_some(ints)
}

/// Range partitioning: row i goes to the number of splitters below its key.
/// `splitters.len() + 1` partitions.
pub fn range_partition(
    batch: &RecordBatch,
    conv: &RowConverter,
    keys: &[(usize, SortOptions)],
    splitters: &Splitters,
) -> Result<Vec<RecordBatch>> {
    let nparts = splitters.len() + 1;
    if let (Some(ints), [(c, _)]) = (&splitters.ints, keys) {
        if let Some(k) = crate::sort::int_key(batch.column(*c)) {
            let dest: Vec<u32> = k
                .iter()
                .map(|x| ints.partition_point(|s| s < x) as u32)
                .collect();
            return split_by(batch, &dest, nparts);
        }
    }
    let rows = key_rows(conv, batch, keys)?;
    let dest: Vec<u32> = (0..rows.num_rows())
        .map(|i| {
            let r = rows.row(i);
            splitters
                .rows
                .partition_point(|s| s.as_slice() < r.as_ref()) as u32
        })
        .collect();
    split_by(batch, &dest, nparts)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, StringArray};

    use super::*;

    /// A missing column's error lists at most 20 names of at most 100
    /// characters each.
    #[test]
    fn missing_column_errors_stay_short() {
        let long = "h".repeat(30_000);
        use arrow_schema::{DataType, Field};
        let mut fields = vec![Field::new(long.as_str(), DataType::Int64, true)];
        fields.extend((0..50).map(|i| Field::new(format!("c{i}"), DataType::Int64, true)));
        let schema = arrow_schema::Schema::new(fields);
        let e = column_index(&schema, "ts").err().map(|e| e.to_string());
        let e = e.unwrap_or_default();
        assert!(e.len() < 500, "{} bytes", e.len());
        assert!(
            e.contains(&format!("{}...", &long[..100])) && e.contains("c18, ... 31 more"),
            "{e}"
        );
        assert_eq!(column_index(&schema, "c7").ok(), Some(8));
    }

    /// Distinct keys of every integer width, dates, floats and strings
    /// spread over the partitions: with 2000 keys no partition of 2 to 8
    /// gets fewer than half its even share of them. (int32, uint32 and
    /// date32 keys all went to one partition of 2, 4 or 8.)
    #[test]
    fn distinct_keys_of_every_type_spread_over_the_partitions() {
        use arrow_array::{
            Date32Array, Float32Array, Int8Array, Int16Array, Int32Array, UInt16Array, UInt32Array,
            UInt64Array,
        };
        const KEYS: usize = 2000;
        let cols: Vec<ArrayRef> = vec![
            Arc::new(Int8Array::from_iter_values(
                (0..256).map(|i| (i as i16 - 128) as i8),
            )),
            Arc::new(Int16Array::from_iter_values((0..KEYS).map(|i| i as i16))),
            Arc::new(UInt16Array::from_iter_values((0..KEYS).map(|i| i as u16))),
            Arc::new(Int32Array::from_iter_values((0..KEYS).map(|i| i as i32))),
            Arc::new(UInt32Array::from_iter_values((0..KEYS).map(|i| i as u32))),
            Arc::new(Date32Array::from_iter_values(
                (0..KEYS).map(|i| 19000 + i as i32),
            )),
            Arc::new(Int64Array::from_iter_values(
                (0..KEYS).map(|i| i as i64 * 1000),
            )),
            Arc::new(UInt64Array::from_iter_values((0..KEYS).map(|i| i as u64))),
            Arc::new(Float32Array::from_iter_values(
                (0..KEYS).map(|i| i as f32 * 0.5),
            )),
            Arc::new(Float64Array::from_iter_values((0..KEYS).map(|i| i as f64))),
            Arc::new(StringArray::from_iter_values(
                (0..KEYS).map(|i| format!("k{i}")),
            )),
        ];
        for col in cols {
            let keys = col.len();
            let schema = Arc::new(arrow_schema::Schema::new(vec![arrow_schema::Field::new(
                "k",
                col.data_type().clone(),
                false,
            )]));
            let batch = RecordBatch::try_new(schema, vec![col.clone()]).unwrap();
            for n in [2usize, 3, 4, 5, 8] {
                let parts = hash_partition(&batch, &[0], n).unwrap();
                let sizes: Vec<usize> = parts.iter().map(|p| p.num_rows()).collect();
                assert_eq!(sizes.iter().sum::<usize>(), keys);
                assert!(
                    sizes.iter().all(|s| *s * 2 * n >= keys),
                    "{} keys of {} over {n}: {sizes:?}",
                    keys,
                    col.data_type()
                );
            }
        }
    }

    /// 0.0 and -0.0, and NaNs of any bit pattern, land in one partition
    /// each, for f32, f64 and dictionary-of-f64 keys; other values keep
    /// their own keys.
    #[test]
    fn float_keys_hash_as_they_group() {
        use arrow_array::types::Int32Type;
        use arrow_array::{DictionaryArray, Float32Array, Int32Array};
        let odd_nan = f64::from_bits(0x7ff8_0000_dead_beef);
        let f64s = vec![0.0, -0.0, f64::NAN, -f64::NAN, odd_nan, 1.5];
        let cols: Vec<ArrayRef> = vec![
            Arc::new(Float64Array::from(f64s.clone())),
            Arc::new(Float32Array::from(
                f64s.iter().map(|x| *x as f32).collect::<Vec<_>>(),
            )),
            Arc::new(DictionaryArray::<Int32Type>::new(
                Int32Array::from(vec![0, 1, 2, 3, 4, 5]),
                Arc::new(Float64Array::from(f64s.clone())),
            )),
        ];
        for col in cols {
            let what = col.data_type().to_string();
            let c = canonical_group_key(&col).unwrap().expect("a float key");
            let c = c.as_any().downcast_ref::<Float64Array>().unwrap();
            assert_eq!(c.value(0).to_bits(), c.value(1).to_bits(), "{what}: zeros");
            for i in 3..5 {
                assert_eq!(
                    c.value(2).to_bits(),
                    c.value(i).to_bits(),
                    "{what}: NaN {i}"
                );
            }
            assert_eq!(c.value(5), 1.5, "{what}");
            let schema = Arc::new(arrow_schema::Schema::new(vec![
                arrow_schema::Field::new("k", col.data_type().clone(), true),
                arrow_schema::Field::new("row", arrow_schema::DataType::Int32, false),
            ]));
            let rows: ArrayRef = Arc::new(Int32Array::from(vec![0, 1, 2, 3, 4, 5]));
            let b = RecordBatch::try_new(schema, vec![col, rows]).unwrap();
            for nparts in [2, 7, 64] {
                let parts = hash_partition(&b, &[0], nparts).unwrap();
                // The partition that holds input row `row`.
                let with = |row: i32| {
                    parts
                        .iter()
                        .position(|p| {
                            let r = p.column(1).as_any().downcast_ref::<Int32Array>().unwrap();
                            r.values().contains(&row)
                        })
                        .unwrap()
                };
                assert_eq!(with(0), with(1), "{what}: zeros, {nparts} parts");
                assert_eq!(with(2), with(3), "{what}: NaNs, {nparts} parts");
                assert_eq!(with(2), with(4), "{what}: NaNs, {nparts} parts");
            }
        }
    }

    #[test]
    fn equal_keys_share_a_partition() {
        let b = RecordBatch::try_from_iter([
            (
                "k",
                Arc::new(StringArray::from(vec!["a", "b", "a", "c", "b", "a"])) as ArrayRef,
            ),
            (
                "v",
                Arc::new(Int64Array::from(vec![1, 2, 3, 4, 5, 6])) as ArrayRef,
            ),
        ])
        .unwrap();
        let parts = hash_partition(&b, &[0], 3).unwrap();
        assert_eq!(parts.iter().map(|p| p.num_rows()).sum::<usize>(), 6);
        for p in &parts {
            let ks = p.column(0).as_any().downcast_ref::<StringArray>().unwrap();
            for k in ["a", "b", "c"] {
                let here = ks.iter().filter(|x| *x == Some(k)).count();
                let total = ["a", "b", "a", "c", "b", "a"]
                    .iter()
                    .filter(|x| **x == k)
                    .count();
                assert!(here == 0 || here == total, "key {k} split");
            }
        }
    }

    /// Partitioning by no key columns, or by destinations that do not
    /// fit the batch, is an error (no key columns gave no destinations,
    /// and every row was silently dropped).
    #[test]
    fn bad_partitionings_are_errors() {
        let batch = RecordBatch::try_new(
            Arc::new(arrow_schema::Schema::new(vec![arrow_schema::Field::new(
                "k",
                arrow_schema::DataType::Int64,
                false,
            )])),
            vec![Arc::new(Int64Array::from(vec![1, 2, 3]))],
        )
        .unwrap();
        let err = |r: Result<Vec<RecordBatch>>| r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err(hash_partition(&batch, &[], 2)).contains("at least one key"));
        assert!(err(split_by(&batch, &[0, 1], 2)).contains("2 destinations for 3 rows"));
        assert!(err(split_by(&batch, &[0, 2, 1], 2)).contains("destination 2 is not below 2"));
        let parts = split_by(&batch, &[1, 0, 1], 2).unwrap();
        assert_eq!(
            parts.iter().map(RecordBatch::num_rows).collect::<Vec<_>>(),
            vec![1, 2]
        );
    }

    #[test]
    fn range_partition_by_splitters() {
        let b = RecordBatch::try_from_iter([(
            "t",
            Arc::new(Int64Array::from(vec![5, 1, 9, 5, 3])) as ArrayRef,
        )])
        .unwrap();
        let keys = [(0usize, SortOptions::default())];
        let conv = converter(b.schema_ref(), &keys).unwrap();
        let split_rows = conv
            .convert_columns(&[Arc::new(Int64Array::from(vec![3, 5])) as ArrayRef])
            .unwrap();
        let splitters: Vec<Vec<u8>> = (0..2)
            .map(|i| split_rows.row(i).as_ref().to_vec())
            .collect();
        let splitters = Splitters::new(b.schema_ref(), &conv, &keys, splitters);
        assert!(splitters.ints.is_some(), "int64 splitters decode");
        let parts = range_partition(&b, &conv, &keys, &splitters).unwrap();
        let vals = |p: &RecordBatch| -> Vec<i64> {
            p.column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .values()
                .to_vec()
        };
        assert_eq!(vals(&parts[0]), vec![1, 3]);
        assert_eq!(vals(&parts[1]), vec![5, 5]);
        assert_eq!(vals(&parts[2]), vec![9]);
    }

    /// The integer path gives the row path's destinations: random int64
    /// and timestamp keys (negative, ties, extremes), splitters drawn from
    /// them; a batch with a null key and splitters that are not rows of
    /// the key's type take the row path.
    #[test]
    fn integer_splitters_split_as_rows_do() {
        use arrow_array::TimestampMillisecondArray;
        use arrow_schema::{DataType, Field, Schema, TimeUnit};
        let mut x = 0x0123_4567_89AB_CDEFu64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for ts in [false, true] {
            let t = if ts {
                DataType::Timestamp(TimeUnit::Millisecond, None)
            } else {
                DataType::Int64
            };
            let schema = Arc::new(Schema::new(vec![Field::new("k", t, true)]));
            let vals: Vec<i64> = (0..2000)
                .map(|i| match i % 97 {
                    0 => i64::MIN,
                    1 => i64::MAX,
                    _ => (next() % 200) as i64 - 100,
                })
                .collect();
            let col = |v: Vec<Option<i64>>| -> ArrayRef {
                if ts {
                    Arc::new(TimestampMillisecondArray::from(v))
                } else {
                    Arc::new(Int64Array::from(v))
                }
            };
            let keys = [(0usize, SortOptions::default())];
            let conv = converter(&schema, &keys).unwrap();
            let mut picks: Vec<i64> = (0..5).map(|i| vals[i * 397 + 11]).collect();
            picks.sort_unstable();
            let srows = conv
                .convert_columns(&[col(picks.iter().map(|v| Some(*v)).collect())])
                .unwrap();
            let rows: Vec<Vec<u8>> = (0..picks.len())
                .map(|i| srows.row(i).as_ref().to_vec())
                .collect();
            let fast = Splitters::new(&schema, &conv, &keys, rows.clone());
            assert!(fast.ints.is_some(), "ts {ts}: splitters decode");
            let slow = Splitters { rows, ints: None };
            let mut with_null: Vec<Option<i64>> = vals.iter().map(|v| Some(*v)).collect();
            with_null[5] = None;
            for v in [vals.iter().map(|v| Some(*v)).collect(), with_null] {
                let b = RecordBatch::try_new(schema.clone(), vec![col(v)]).unwrap();
                let a = range_partition(&b, &conv, &keys, &fast).unwrap();
                let c = range_partition(&b, &conv, &keys, &slow).unwrap();
                assert_eq!(a.len(), c.len());
                for (p, q) in a.iter().zip(&c) {
                    assert_eq!(p, q, "ts {ts}");
                }
            }
            // Bytes that are not rows of the key's type: the row path.
            let junk = Splitters::new(&schema, &conv, &keys, vec![vec![1, 2, 3], vec![0; 9]]);
            assert!(junk.ints.is_none());
        }
    }
}
