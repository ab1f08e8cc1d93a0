//! `Buffer`: bytes that live in one memory type.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

use super::resource::Charge;

/// Where a buffer's bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemoryType {
    /// Device (GPU) memory.
    Device,
    /// Host memory.
    Host,
}

impl MemoryType {
    /// Both types, fastest first: the usual preference order for reserving.
    pub const ALL: [MemoryType; 2] = [MemoryType::Device, MemoryType::Host];

    pub(crate) fn index(self) -> usize {
        match self {
            MemoryType::Device => 0,
            MemoryType::Host => 1,
        }
    }
}

impl fmt::Display for MemoryType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MemoryType::Device => "device",
            MemoryType::Host => "host",
        })
    }
}

/// Bytes in host memory, optionally charged to a `BufferResource`.
///
/// Cloning is cheap (reference counted) and never copies the bytes; the
/// charge is released when the last clone is dropped.
#[derive(Clone, Default)]
pub struct Buffer {
    bytes: Bytes,
    charge: Option<Arc<Charge>>,
}

impl Buffer {
    /// An uncharged host buffer over `bytes` (no copy).
    pub fn from_bytes(bytes: Bytes) -> Self {
        Buffer {
            bytes,
            charge: None,
        }
    }

    /// An uncharged host buffer that takes ownership of `v` (no copy).
    pub fn from_vec(v: Vec<u8>) -> Self {
        Self::from_bytes(Bytes::from(v))
    }

    pub(crate) fn charged(bytes: Bytes, charge: Arc<Charge>) -> Self {
        Buffer {
            bytes,
            charge: Some(charge),
        }
    }

    /// The memory type of the bytes.
    pub fn mem_type(&self) -> MemoryType {
        MemoryType::Host
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The bytes (host memory).
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes
    }

    /// The bytes as a cheaply clonable `Bytes`.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// Takes the bytes out; the charge (if any) stays alive until every
    /// other clone of this buffer is gone, then it is released.
    pub fn into_bytes(self) -> Bytes {
        self.bytes
    }

    /// The bytes from `start` on (empty if `start` is past the end), in
    /// place: unlike [`Buffer::slice`], no second handle to the memory, so
    /// a buffer made from a vector stays one (slicing it allocates the
    /// shared count that two handles need).
    pub fn after(self, start: usize) -> Buffer {
        let mut bytes = self.bytes;
        let n = start.min(bytes.len());
        bytes::Buf::advance(&mut bytes, n);
        Buffer {
            bytes,
            charge: self.charge,
        }
    }

    /// A sub-range sharing the same memory (and charge).
    pub fn slice(&self, range: std::ops::Range<usize>) -> Buffer {
        Buffer {
            bytes: self.bytes.slice(range),
            charge: self.charge.clone(),
        }
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("mem_type", &self.mem_type())
            .field("len", &self.len())
            .field("charged", &self.charge.is_some())
            .finish()
    }
}

impl From<Vec<u8>> for Buffer {
    fn from(v: Vec<u8>) -> Self {
        Buffer::from_vec(v)
    }
}

impl From<Bytes> for Buffer {
    fn from(b: Bytes) -> Self {
        Buffer::from_bytes(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_keeps_the_tail_in_place() {
        let b = Buffer::from_vec((0u8..10).collect());
        let ptr = b.as_slice().as_ptr();
        let t = b.after(4);
        assert_eq!(t.as_slice(), &[4, 5, 6, 7, 8, 9]);
        assert_eq!(t.as_slice().as_ptr(), ptr.wrapping_add(4), "no copy");
        assert!(t.clone().after(6).is_empty());
        assert!(t.after(100).is_empty(), "past the end: empty");
    }
}
