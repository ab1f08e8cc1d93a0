//! Packing record batches into bytes (Arrow IPC stream format) to move them
//! between ranks, and back.

use arrow_array::RecordBatch;
use arrow_ipc::reader::StreamReader;
use arrow_ipc::writer::StreamWriter;
use arrow_schema::Schema;
use braid_core::{Buffer, PackedData};

use crate::error::{DataError, Result};

/// Packs `batch` (schema and data) into one buffer.
pub fn pack(batch: &RecordBatch) -> Result<PackedData> {
    let mut out = Vec::with_capacity(batch.get_array_memory_size() + 1024);
    {
        let mut w = StreamWriter::try_new(&mut out, batch.schema_ref())?;
        w.write(batch)?;
        w.finish()?;
    }
    Ok(PackedData {
        metadata: bytes::Bytes::new(),
        data: Buffer::from_vec(out),
    })
}

/// Unpacks what [`pack`] made on a peer, whose batches must have the
/// columns (names and types) of `expected`: a peer that read other data,
/// or was started with other arguments, is an error here rather than a
/// panic or mixed-up columns later.
pub fn unpack(p: &PackedData, expected: &Schema) -> Result<Vec<RecordBatch>> {
    let reader = StreamReader::try_new(std::io::Cursor::new(p.data.as_slice()), None)?;
    let got = reader.schema();
    let same = got.fields().len() == expected.fields().len()
        && got
            .fields()
            .iter()
            .zip(expected.fields())
            .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type());
    if !same {
        return Err(DataError::Invalid(format!(
            "a peer sent rows with columns {} where this rank has {} (do all ranks read the same data with the same arguments?)",
            columns(&got),
            columns(expected)
        )));
    }
    let mut out = Vec::new();
    for b in reader {
        out.push(b?);
    }
    Ok(out)
}

/// `name: type, ...` of a schema's fields, for errors.
fn columns(s: &Schema) -> String {
    let f: Vec<String> = s
        .fields()
        .iter()
        .map(|f| format!("{}: {}", f.name(), f.data_type()))
        .collect();
    format!("[{}]", f.join(", "))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Float64Array, Int64Array};

    use super::*;

    #[test]
    fn roundtrip() {
        let b = RecordBatch::try_from_iter([
            ("a", Arc::new(Int64Array::from(vec![1, 2, 3])) as _),
            (
                "b",
                Arc::new(Float64Array::from(vec![Some(1.5), None, Some(2.0)])) as _,
            ),
        ])
        .unwrap();
        let back = unpack(&pack(&b).unwrap(), &b.schema()).unwrap();
        assert_eq!(back, vec![b]);
    }

    #[test]
    fn other_columns_are_an_error() {
        let b = RecordBatch::try_from_iter([
            ("a", Arc::new(Int64Array::from(vec![1, 2])) as _),
            ("b", Arc::new(Float64Array::from(vec![1.0, 2.0])) as _),
        ])
        .unwrap();
        let packed = pack(&b).unwrap();
        // Fewer columns, other names, other types.
        for other in [b.project(&[0]).unwrap(), b.project(&[1, 0]).unwrap()] {
            let e = unpack(&packed, &other.schema()).unwrap_err().to_string();
            assert!(
                e.contains("a peer sent rows with columns [a: Int64, b: Float64]"),
                "{e}"
            );
        }
        let c = RecordBatch::try_from_iter([
            ("a", Arc::new(Int64Array::from(vec![1, 2])) as _),
            ("b", Arc::new(Int64Array::from(vec![1, 2])) as _),
        ])
        .unwrap();
        assert!(unpack(&packed, &c.schema()).is_err());
    }
}
