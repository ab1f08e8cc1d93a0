//! Message tags: which collective instance (`OpId`) and which of its stages
//! a message belongs to.
//!
//! All ranks allocate `OpId`s in the same order from a per-context counter,
//! so an `OpId` names the same collective instance on every rank without any
//! negotiation. A collective uses as few stages as its protocol needs.

use std::fmt;
use std::sync::Mutex;

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
/// point-to-point traffic. The counter wraps after 2^31 ids: an id may be
/// reused once every send and receive of its previous owner is done, which
/// holds when fewer than ~2 billion operations are in flight.
///
/// Concurrent callers whose order differs between ranks (the nodes of one
/// graph, each a task of its own) cannot share one sequence.
/// [`OpIdAllocator::fork`] gives them allocators of their own: it takes
/// the next block of this allocator's positions (2^16 a class, at most
/// 1/256 of them, aligned to its size) as one allocation in this
/// allocator's order, and deals the block out round-robin, class `j` of
/// `k` taking `start + j + k s` for its `s`-th id (wrapping within the
/// block's share, `block / k`).
/// Each class draws in an order every rank shares, so every rank gives an
/// operation the same id however its tasks interleave; this allocator
/// goes on past the block at once, so graphs that run at once, or end in
/// another order on another rank, do not disturb it:
///
/// ```text
///   this allocator   ... c | block: start .. start + B | start + B ...
///   k = 4 classes            0 1 2 3 0 1 2 3 0 1 2 3 ...
/// ```
///
/// With MPI, whose tags hold an OpId modulo `half` (a power of two, see
/// the mpi backend), the classes of one block stay distinct while `k <=
/// half`, and graphs that run at once while their blocks together stay
/// within `half` ids (Open MPI's ob1: 2^22).
#[derive(Debug)]
pub struct OpIdAllocator {
    seq: Mutex<Seq>,
}

/// Positions `base + stride * (n % cap)` for `n = count, count + 1, ...`.
#[derive(Debug, Clone, Copy)]
struct Seq {
    base: u64,
    stride: u64,
    /// Positions before the sequence wraps (a power of two).
    cap: u64,
    count: u64,
}

impl OpIdAllocator {
    /// The first id handed out; `0..FIRST` are reserved for user tags.
    pub const FIRST: u32 = 1 << 16;

    /// Positions of the context's sequence (ids FIRST .. FIRST + 2^31).
    const POSITIONS: u64 = 1 << 31;

    /// A fork takes at most this share of its allocator's positions.
    const BLOCK_SHARE: u64 = 256;

    /// Ids a forked class (a graph node) draws before its ids wrap: more
    /// than a node has open at once.
    const CLASS_IDS: u64 = 1 << 16;

    /// A fresh allocator.
    pub fn new() -> Self {
        Self::with(Seq {
            base: 0,
            stride: 1,
            cap: Self::POSITIONS,
            count: 0,
        })
    }

    fn with(seq: Seq) -> Self {
        OpIdAllocator {
            seq: Mutex::new(seq),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seq> {
        self.seq.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next id.
    pub fn next(&self) -> OpId {
        let mut g = self.lock();
        let pos = g.base + g.stride * (g.count % g.cap);
        g.count = g.count.wrapping_add(1);
        OpId(Self::FIRST + (pos % Self::POSITIONS) as u32)
    }

    /// `k` allocators (at least 1) of their own, sharing out the next
    /// block of this allocator's positions; this allocator continues past
    /// the block.
    pub fn fork(&self, k: u32) -> Vec<std::sync::Arc<OpIdAllocator>> {
        let k = u64::from(k.max(1)).next_power_of_two();
        let mut g = self.lock();
        // A power of two dividing cap: CLASS_IDS a class (ids of graphs
        // that run at once stay close together, as MPI's narrow tags
        // need), at most 1/256 of cap, and at least k where cap allows.
        let block = (k * Self::CLASS_IDS)
            .min(g.cap / Self::BLOCK_SHARE)
            .max(k)
            .min(g.cap);
        let start = g.count.div_ceil(block).wrapping_mul(block) % g.cap;
        g.count = start + block;
        let at = g.base + g.stride * start;
        let (stride, cap) = (g.stride * k, (block / k).max(1));
        (0..k)
            .map(|j| {
                std::sync::Arc::new(Self::with(Seq {
                    base: at + g.stride * j,
                    stride,
                    cap,
                    count: 0,
                }))
            })
            .collect()
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
    fn forked_classes_never_share_an_id_and_the_allocator_goes_on_past_them() {
        for k in [1u32, 2, 3, 4, 8, 1000] {
            let a = OpIdAllocator::new();
            let before: Vec<u32> = (0..3).map(|_| a.next().0).collect();
            let classes = a.fork(k);
            assert_eq!(classes.len(), (k as usize).next_power_of_two());
            // The allocator goes on at once, past every class's ids.
            let after = a.next().0;
            let mut seen = std::collections::HashSet::new();
            for (j, c) in classes.iter().enumerate() {
                for _ in 0..=j.min(20) {
                    let id = c.next().0;
                    assert!(
                        !before.contains(&id) && id != after,
                        "k {k}: id {id} reused"
                    );
                    assert!(id < after, "k {k}: class id {id} not below {after}");
                    assert!(seen.insert(id), "k {k}: id {id} drawn twice");
                }
            }
            // A second fork (a graph running beside the first) takes a
            // block of its own.
            for c in a.fork(k) {
                let id = c.next().0;
                assert!(!seen.contains(&id) && id > after, "k {k}: id {id}");
            }
        }
    }

    #[test]
    fn a_class_wraps_within_its_share_and_nested_forks_stay_inside_it() {
        let a = OpIdAllocator::new();
        let classes = a.fork(4);
        let share = OpIdAllocator::CLASS_IDS as usize;
        let c = &classes[1];
        let first = c.next().0;
        let ids: Vec<u32> = (1..share).map(|_| c.next().0).collect();
        assert_eq!(c.next().0, first, "wraps after its share");
        let own: std::collections::HashSet<u32> = ids.iter().copied().chain([first]).collect();
        assert_eq!(own.len(), share);
        // A graph inside that node forks the node's class: its ids are
        // the class's own positions.
        let inner = classes[2].fork(3);
        let mut class2 = std::collections::HashSet::new();
        let probe = a.fork(1); // nothing of the first block is handed out again
        let outside = probe[0].next().0;
        for i in &inner {
            for _ in 0..5 {
                let id = i.next().0;
                assert!(!own.contains(&id) && id != outside, "inner id {id}");
                assert!(class2.insert(id));
                assert_eq!((id - first) % 4, 1, "inner id {id} outside node 2's class");
            }
        }
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
