//! Packing record batches into bytes (Arrow IPC stream format) to move them
//! between ranks, and back.

use arrow_array::RecordBatch;
use arrow_ipc::reader::StreamReader;
use arrow_ipc::writer::StreamWriter;
use braid_core::{Buffer, PackedData};

use crate::error::Result;

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

/// Unpacks what [`pack`] made.
pub fn unpack(p: &PackedData) -> Result<Vec<RecordBatch>> {
    let reader = StreamReader::try_new(std::io::Cursor::new(p.data.as_slice()), None)?;
    let mut out = Vec::new();
    for b in reader {
        out.push(b?);
    }
    Ok(out)
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
        let back = unpack(&pack(&b).unwrap()).unwrap();
        assert_eq!(back, vec![b]);
    }
}
