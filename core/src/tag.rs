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
/// point-to-point traffic. The counter wraps after 2^32 - FIRST ids: an id
/// may be reused once every send and receive of its previous owner is done,
/// which holds when fewer than ~4 billion operations are in flight.
///
/// Concurrent callers whose order differs between ranks (the nodes of one
/// graph, each a task of its own) cannot share one sequence. A
/// [`Fork`] splits it instead: with `k` classes, the positions still to
/// come, `c, c + 1, c + 2, ...`, are dealt out round-robin, class `j`
/// taking `c + j + k s` for its `s`-th id. Class 0 stays with this
/// allocator; classes `1..k` go to allocators of their own (one per node:
/// see `Graph::run`). Each class draws in an order every rank shares, so
/// every rank gives an operation the same id however its tasks interleave.
/// [`OpIdAllocator::join`] then moves this allocator past every position
/// any class used:
///
/// ```text
///   before the fork     c    c+1  c+2  c+3  c+4  c+5  c+6  c+7  ...
///   k = 4 classes       0    1    2    3    0    1    2    3    ...
///   after the join      c + 4 * (most ids any class drew)
/// ```
///
/// With MPI, whose tags hold an OpId modulo `half` (a power of two, see
/// the mpi backend), distinct classes stay distinct while `k <= half`.
#[derive(Debug)]
pub struct OpIdAllocator {
    seq: Mutex<Seq>,
}

/// Positions `base + stride * n` for `n = count, count + 1, ...` (wrapping).
#[derive(Debug, Clone, Copy)]
struct Seq {
    base: u64,
    stride: u64,
    count: u64,
}

/// An allocator's sequence split into classes (see [`OpIdAllocator`]):
/// undone by [`OpIdAllocator::join`].
#[derive(Debug)]
pub struct Fork {
    before: Seq,
    classes: Vec<std::sync::Arc<OpIdAllocator>>,
}

impl Fork {
    /// The allocator of class `j` (`1..k`; class 0 is the forked one).
    pub fn class(&self, j: usize) -> Option<&std::sync::Arc<OpIdAllocator>> {
        j.checked_sub(1).and_then(|i| self.classes.get(i))
    }
}

impl OpIdAllocator {
    /// The first id handed out; `0..FIRST` are reserved for user tags.
    pub const FIRST: u32 = 1 << 16;

    /// Ids from FIRST up before the counter wraps.
    const RANGE: u64 = (1u64 << 32) - Self::FIRST as u64;

    /// A fresh allocator.
    pub fn new() -> Self {
        Self::with(Seq {
            base: 0,
            stride: 1,
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
        let pos = g.base.wrapping_add(g.stride.wrapping_mul(g.count));
        g.count = g.count.wrapping_add(1);
        OpId(Self::FIRST + (pos % Self::RANGE) as u32)
    }

    /// Splits the positions still to come into `k` classes (at least 1):
    /// this allocator keeps class 0, the fork holds classes `1..k`.
    pub fn fork(&self, k: u32) -> Fork {
        let k = u64::from(k.max(1));
        let mut g = self.lock();
        let before = *g;
        let at = |j: u64| Seq {
            base: before
                .base
                .wrapping_add(before.stride.wrapping_mul(before.count.wrapping_add(j))),
            stride: before.stride.wrapping_mul(k),
            count: 0,
        };
        *g = at(0);
        Fork {
            before,
            classes: (1..k)
                .map(|j| std::sync::Arc::new(Self::with(at(j))))
                .collect(),
        }
    }

    /// Ends `fork`: this allocator continues past every position a class
    /// of it used. Deterministic across ranks when each class drew the
    /// same number of ids on every rank.
    pub fn join(&self, fork: Fork) {
        let mut g = self.lock();
        let k = fork.classes.len() as u64 + 1;
        let most = fork
            .classes
            .iter()
            .map(|c| c.lock().count)
            .fold(g.count, u64::max);
        *g = Seq {
            count: fork.before.count.wrapping_add(k.wrapping_mul(most)),
            ..fork.before
        };
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
    fn forked_classes_never_share_an_id_and_the_join_passes_them_all() {
        for k in [1u32, 2, 3, 4, 8] {
            let a = OpIdAllocator::new();
            let before: Vec<u32> = (0..3).map(|_| a.next().0).collect();
            let fork = a.fork(k);
            // Class j draws j + 1 ids (class 0 from `a` itself).
            let mut seen = std::collections::HashSet::new();
            for j in 0..k as usize {
                let c: &OpIdAllocator = if j == 0 { &a } else { fork.class(j).unwrap() };
                for _ in 0..=j {
                    let id = c.next().0;
                    assert!(!before.contains(&id), "k {k}: id {id} reused");
                    assert!(seen.insert(id), "k {k}: id {id} drawn twice");
                }
            }
            assert!(fork.class(k as usize).is_none() && fork.class(0).is_none());
            a.join(fork);
            let after = a.next().0;
            assert!(
                seen.iter().all(|&id| id < after),
                "k {k}: {after} not past {seen:?}"
            );
            // Every position of the k classes' longest run is skipped, none more.
            assert_eq!(after, OpIdAllocator::FIRST + 3 + k * k, "k {k}");
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
