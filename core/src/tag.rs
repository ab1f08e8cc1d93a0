//! Message tags: which collective instance (`OpId`) and which of its stages
//! a message belongs to.
//!
//! All ranks allocate `OpId`s in the same order from a per-context counter,
//! so an `OpId` names the same collective instance on every rank without any
//! negotiation. A collective uses as few stages as its protocol needs.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};

/// Identifies one collective instance (or one point-to-point conversation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub u32);

/// A message tag: an operation and a stage within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag {
    /// The operation the message belongs to.
    pub op: OpId,
    /// The protocol stage within that operation.
    pub stage: u8,
}

impl Tag {
    /// A tag for `op` at `stage`.
    pub const fn new(op: OpId, stage: u8) -> Self {
        Tag { op, stage }
    }

    /// Packs the tag into 64 bits for a wire header.
    pub const fn to_wire(self) -> u64 {
        ((self.op.0 as u64) << 8) | self.stage as u64
    }

    /// Unpacks a wire tag; `None` if the upper bits are not zero.
    pub const fn from_wire(w: u64) -> Option<Self> {
        if w >> 40 != 0 {
            return None;
        }
        Some(Tag {
            op: OpId((w >> 8) as u32),
            stage: (w & 0xff) as u8,
        })
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "op {} stage {}", self.op.0, self.stage)
    }
}

impl fmt::Display for OpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "op {}", self.0)
    }
}

/// Hands out `OpId`s in call order. Every rank must allocate in the same
/// order (the same sequence of collectives), which is what SPMD code does.
///
/// Ids start at [`OpIdAllocator::FIRST`]; ids below it are free for user
/// point-to-point traffic. The counter wraps after 2^32 - FIRST ids: an id
/// may be reused once every send and receive of its previous owner is done,
/// which holds when fewer than ~4 billion operations are in flight.
#[derive(Debug)]
pub struct OpIdAllocator {
    next: AtomicU32,
}

impl OpIdAllocator {
    /// The first id handed out; `0..FIRST` are reserved for user tags.
    pub const FIRST: u32 = 1 << 16;

    /// A fresh allocator.
    pub fn new() -> Self {
        OpIdAllocator {
            next: AtomicU32::new(Self::FIRST),
        }
    }

    /// The next id.
    pub fn next(&self) -> OpId {
        let mut id = self.next.fetch_add(1, Ordering::Relaxed);
        if id < Self::FIRST {
            // Wrapped around: skip the reserved range.
            self.next.fetch_max(Self::FIRST + 1, Ordering::Relaxed);
            id = Self::FIRST;
        }
        OpId(id)
    }
}

impl Default for OpIdAllocator {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_roundtrip() {
        for (op, stage) in [(0u32, 0u8), (1, 255), (u32::MAX, 7)] {
            let t = Tag::new(OpId(op), stage);
            assert_eq!(Tag::from_wire(t.to_wire()), Some(t));
        }
        assert_eq!(Tag::from_wire(1 << 41), None);
    }

    #[test]
    fn allocator_is_sequential() {
        let a = OpIdAllocator::new();
        let ids: Vec<u32> = (0..5).map(|_| a.next().0).collect();
        assert_eq!(
            ids,
            (OpIdAllocator::FIRST..OpIdAllocator::FIRST + 5).collect::<Vec<_>>()
        );
    }
}
