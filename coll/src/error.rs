//! Errors of collectives: each names the rank, the collective and its
//! OpId, and the peer where one is involved.

use std::fmt;

use braid_core::{CommError, MemoryError, OpId, Rank};

/// Which collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollKind {
    /// Barrier.
    Barrier,
    /// Broadcast.
    Broadcast,
    /// AllGather.
    AllGather,
    /// AllReduce.
    AllReduce,
    /// ReduceScatter.
    ReduceScatter,
    /// AllToAll (equal blocks).
    AllToAll,
    /// AllToAllv (per-peer counts and offsets).
    AllToAllv,
    /// Shuffle.
    Shuffle,
    /// HaloExchange.
    HaloExchange,
    /// SendRecv.
    SendRecv,
}

impl CollKind {
    /// Wire code.
    pub const fn code(self) -> u8 {
        match self {
            CollKind::Barrier => 1,
            CollKind::Broadcast => 2,
            CollKind::AllGather => 3,
            CollKind::AllReduce => 4,
            CollKind::ReduceScatter => 5,
            CollKind::AllToAll => 6,
            CollKind::Shuffle => 7,
            CollKind::HaloExchange => 8,
            CollKind::SendRecv => 9,
            CollKind::AllToAllv => 10,
        }
    }

    /// From a wire code.
    pub fn from_code(c: u8) -> Option<Self> {
        use CollKind::*;
        [
            Barrier,
            Broadcast,
            AllGather,
            AllReduce,
            ReduceScatter,
            AllToAll,
            Shuffle,
            HaloExchange,
            SendRecv,
            AllToAllv,
        ]
        .into_iter()
        .find(|k| k.code() == c)
    }

    /// Name used in statistics and errors.
    pub const fn name(self) -> &'static str {
        match self {
            CollKind::Barrier => "barrier",
            CollKind::Broadcast => "broadcast",
            CollKind::AllGather => "allgather",
            CollKind::AllReduce => "allreduce",
            CollKind::ReduceScatter => "reduce_scatter",
            CollKind::AllToAll => "alltoall",
            CollKind::AllToAllv => "alltoallv",
            CollKind::Shuffle => "shuffle",
            CollKind::HaloExchange => "halo_exchange",
            CollKind::SendRecv => "sendrecv",
        }
    }
}

impl fmt::Display for CollKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A collective's failure.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CollError {
    /// The transport failed (a dead peer, an abort by another rank).
    #[error("rank {rank}: {coll} ({op}): {}", braid_core::error::without_rank(*.rank, &.source.to_string()))]
    Comm {
        /// This rank.
        rank: Rank,
        /// The collective.
        coll: CollKind,
        /// Its OpId.
        op: OpId,
        /// The transport's error.
        #[source]
        source: CommError,
    },
    /// This rank's call and other ranks' calls disagree (kind, element
    /// type, count, root, operator, per-peer counts); every rank fails.
    #[error("rank {rank}: {coll} ({op}): call does not match {}: {detail}", peer_text(*.peer))]
    Mismatch {
        /// This rank.
        rank: Rank,
        /// The collective.
        coll: CollKind,
        /// Its OpId.
        op: OpId,
        /// The peer whose call differs, when known.
        peer: Option<Rank>,
        /// What differs.
        detail: String,
    },
    /// The arguments are wrong; none of the call's data was sent. Wrong
    /// arguments to a collective call abort the job all the same (the
    /// other ranks' calls would wait for this rank's part), so the other
    /// ranks fail too, naming this one; a misused handle (a result taken
    /// before completion, a blocking wait that could never end) fails
    /// only here.
    #[error("rank {rank}: {coll} ({op}): invalid argument: {detail}")]
    InvalidArgument {
        /// This rank.
        rank: Rank,
        /// The collective.
        coll: CollKind,
        /// Its OpId.
        op: OpId,
        /// What is wrong.
        detail: String,
    },
    /// Memory could not be had, or spilling failed.
    #[error("rank {rank}: {coll} ({op}): {source}")]
    Memory {
        /// This rank.
        rank: Rank,
        /// The collective.
        coll: CollKind,
        /// Its OpId.
        op: OpId,
        /// The memory error.
        #[source]
        source: MemoryError,
    },
    /// The collective's protocol panicked (a user-supplied operator, or a
    /// bug in braid); the job is aborted so no peer waits for it.
    #[error("rank {rank}: {coll} ({op}): panicked: {detail}")]
    Panicked {
        /// This rank.
        rank: Rank,
        /// The collective.
        coll: CollKind,
        /// Its OpId.
        op: OpId,
        /// The panic's message.
        detail: String,
    },
    /// A CUDA or NCCL call failed, or the NCCL communicator was aborted.
    #[error("rank {rank}: {coll} ({op}): {detail}")]
    Device {
        /// This rank.
        rank: Rank,
        /// The collective.
        coll: CollKind,
        /// Its OpId.
        op: OpId,
        /// The CUDA or NCCL error.
        detail: String,
    },
}

impl CollError {
    /// The rank the error happened on.
    pub fn rank(&self) -> Rank {
        match self {
            CollError::Comm { rank, .. }
            | CollError::Mismatch { rank, .. }
            | CollError::InvalidArgument { rank, .. }
            | CollError::Memory { rank, .. }
            | CollError::Panicked { rank, .. }
            | CollError::Device { rank, .. } => *rank,
        }
    }
}

fn peer_text(peer: Option<Rank>) -> String {
    match peer {
        Some(p) => format!("rank {p}'s"),
        None => "the other ranks' calls".into(),
    }
}

impl CollError {
    /// Whether this error should abort the job. Every failure leaves peers
    /// waiting for messages that will never come, except the transport's
    /// own failure (`comm_failed`: a dead peer, another rank's abort), which
    /// the other ranks hear about already. A transport error that only this
    /// rank saw (a message over the transport's limit, a send refused at
    /// once) aborts too: a peer may wait for the data after its header.
    pub(crate) fn aborts_job(&self, comm_failed: bool) -> bool {
        match self {
            // Another rank's failure, already the job's.
            CollError::Comm {
                source: CommError::Aborted { .. } | CommError::PeerDied { .. },
                ..
            } => false,
            CollError::Comm { .. } => !comm_failed,
            _ => true,
        }
    }
}

/// Identifies one collective call for building errors.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Site {
    pub rank: Rank,
    pub coll: CollKind,
    pub op: OpId,
}

impl Site {
    /// The next call of `coll` on this rank: takes the context's next OpId.
    pub fn next(ctx: &braid_core::Context, coll: CollKind) -> Site {
        Site {
            rank: ctx.rank(),
            coll,
            op: ctx.next_op_id(),
        }
    }

    pub fn comm(&self, e: CommError) -> CollError {
        CollError::Comm {
            rank: self.rank,
            coll: self.coll,
            op: self.op,
            source: e,
        }
    }

    /// This rank left a collective of inserts and a finish (AllGather,
    /// Shuffle) before its finish: extracted or dropped first. Its peers
    /// would wait for the rest of its part for ever; the error aborts the
    /// job instead.
    pub fn abandoned(&self, how: &str) -> CollError {
        self.invalid(format!(
            "{how} before insert_finished: the other ranks would wait \
             for the rest of this rank's part for ever"
        ))
    }

    pub fn mismatch(&self, peer: Rank, detail: impl Into<String>) -> CollError {
        CollError::Mismatch {
            rank: self.rank,
            coll: self.coll,
            op: self.op,
            peer: Some(peer),
            detail: detail.into(),
        }
    }

    pub fn disagreement(&self, detail: impl Into<String>) -> CollError {
        CollError::Mismatch {
            rank: self.rank,
            coll: self.coll,
            op: self.op,
            peer: None,
            detail: detail.into(),
        }
    }

    pub fn invalid(&self, detail: impl Into<String>) -> CollError {
        CollError::InvalidArgument {
            rank: self.rank,
            coll: self.coll,
            op: self.op,
            detail: detail.into(),
        }
    }

    #[cfg(feature = "cuda")]
    pub fn device(&self, e: impl std::fmt::Display) -> CollError {
        CollError::Device {
            rank: self.rank,
            coll: self.coll,
            op: self.op,
            detail: e.to_string(),
        }
    }

    pub fn memory(&self, e: MemoryError) -> CollError {
        CollError::Memory {
            rank: self.rank,
            coll: self.coll,
            op: self.op,
            source: e,
        }
    }
}
