//! Messages that flow between the nodes of a rank's graph.

use arrow_array::RecordBatch;
use bytes::Bytes;

use crate::memory::{Buffer, MemoryType};

/// A unit of streamed data with its position in the stream.
#[derive(Debug, Clone)]
pub struct Message {
    /// Position in the stream; strictly increasing along a channel.
    pub seq: u64,
    /// The data.
    pub payload: Payload,
}

impl Message {
    /// A message at `seq` carrying `payload`.
    pub fn new(seq: u64, payload: impl Into<Payload>) -> Self {
        Message {
            seq,
            payload: payload.into(),
        }
    }
}

/// What a message carries.
#[derive(Debug, Clone)]
pub enum Payload {
    /// A table chunk.
    Table(TableChunk),
    /// Packed bytes with a small metadata header (a serialised chunk, a
    /// partition of a shuffle).
    Packed(PackedData),
    /// A table chunk in device memory (feature `cuda`).
    #[cfg(feature = "cuda")]
    Device(crate::cuda::DeviceTable),
}

impl Payload {
    /// Bytes of data held (Arrow buffers' memory for tables).
    pub fn size_bytes(&self) -> usize {
        match self {
            Payload::Table(t) => t.batch.get_array_memory_size(),
            Payload::Packed(p) => p.metadata.len() + p.data.len(),
            #[cfg(feature = "cuda")]
            Payload::Device(t) => t.size_bytes(),
        }
    }

    /// Where the data lives.
    pub fn mem_type(&self) -> MemoryType {
        match self {
            Payload::Table(_) => MemoryType::Host,
            Payload::Packed(p) => p.data.mem_type(),
            #[cfg(feature = "cuda")]
            Payload::Device(_) => MemoryType::Device,
        }
    }

    /// Rows of a table payload (host or device); `None` for packed bytes.
    pub fn num_rows(&self) -> Option<usize> {
        match self {
            Payload::Table(t) => Some(t.num_rows()),
            Payload::Packed(_) => None,
            #[cfg(feature = "cuda")]
            Payload::Device(t) => Some(t.num_rows()),
        }
    }
}

/// A chunk of a table: an Arrow record batch on the host.
#[derive(Debug, Clone)]
pub struct TableChunk {
    batch: RecordBatch,
}

impl TableChunk {
    /// Wraps a record batch.
    pub fn new(batch: RecordBatch) -> Self {
        TableChunk { batch }
    }

    /// The batch.
    pub fn batch(&self) -> &RecordBatch {
        &self.batch
    }

    /// Takes the batch out.
    pub fn into_batch(self) -> RecordBatch {
        self.batch
    }

    /// Number of rows.
    pub fn num_rows(&self) -> usize {
        self.batch.num_rows()
    }
}

impl From<RecordBatch> for Payload {
    fn from(b: RecordBatch) -> Self {
        Payload::Table(TableChunk::new(b))
    }
}

impl From<TableChunk> for Payload {
    fn from(t: TableChunk) -> Self {
        Payload::Table(t)
    }
}

/// Bytes plus a metadata header that says how to read them.
#[derive(Debug, Clone)]
pub struct PackedData {
    /// How to interpret `data`.
    pub metadata: Bytes,
    /// The data.
    pub data: Buffer,
}

impl From<PackedData> for Payload {
    fn from(p: PackedData) -> Self {
        Payload::Packed(p)
    }
}
