//! braid-coll: collectives over a `Context`'s communicator.
//!
//! Each collective is one non-streaming core, started with `start_*` (or an
//! object's constructor) and an optional completion callback, driven by the
//! context's progress engine, and waited on with `Handle::wait`; the async
//! function of the same name is the thin streaming wrapper that awaits the
//! `Event` its core sets on completion (on the engine's runtime it polls
//! that same core in its own task instead of spawning it: one wake-up per
//! wait instead of two; see the `handle` module).
//!
//! | collective | algorithm | steps |
//! |---|---|---|
//! | [`barrier()`] | dissemination (in-process ranks: one meeting) | ceil(log2 N) |
//! | [`broadcast()`] | binomial tree (in-process ranks: one meeting) | ceil(log2 N) |
//! | [`AllGather`] / [`allgather()`] | direct, streaming inserts (one-shot: one meeting in-process) | 1 |
//! | [`allreduce()`] | direct reduce-scatter + allgather | 2 |
//! | [`reduce_scatter`] | direct | 1 |
//! | [`alltoall()`] / [`alltoallv`] | pairwise direct (in-process ranks: one meeting) | 1 |
//! | [`Shuffle`] | direct, streaming inserts, spills | 1 |
//! | [`HaloExchange`] | neighbours | 1 |
//! | [`sendrecv()`] | one step | 1 |
//!
//! Result forms: the one-vector calls return a fresh vector; their `_into`
//! twins ([`allreduce_into`], [`alltoall_into`], [`alltoallv_into`]) write
//! into a vector the caller passes and keeps, reusing its memory (what a
//! loop wants: a fresh multi-MiB vector costs the OS's zeroing of its pages,
//! about as much as the copy into it); the `_parts` forms return the pieces
//! as they arrived (shared, not copied, between in-process ranks).
//!
//! Calls that disagree between ranks (kind, element type, count, root,
//! operator) fail with `CollError::Mismatch` on the rank that notices, which
//! aborts the job so that every rank fails instead of hanging; no call
//! returns data built from mismatched calls.
//!
//! OpIds: each call takes the next OpId of the context (32-bit counter)
//! when it starts: a `start_*` call at once, a streaming call (an async
//! fn, which runs nothing before it is polled) when its future is first
//! polled. So every rank must start, or first poll, its collectives in one
//! order. Ranks whose orders differ fail with a mismatch where the calls
//! that meet differ (kind, element type, count, root, operator); two calls
//! alike in all of these but started in another order on some rank (two
//! futures of the same AllReduce shape, awaited first `a` then `b` on one
//! rank and `b` then `a` on another) cannot be told apart, as in MPI: each
//! meets the other rank's other call and returns data mixed from both. To
//! run such calls at once, start them (`start_*`, or first poll) in one
//! order on every rank, for example with `futures::join!`. Ids are not reused
//! within 4 billion collectives; a call's messages use only its own
//! OpId's tags.

pub mod allgather;
pub mod allreduce;
pub mod alltoall;
pub mod barrier;
pub mod broadcast;
#[cfg(feature = "cuda")]
pub mod device;
pub mod error;
pub mod halo;
mod handle;
pub mod sendrecv;
pub mod shuffle;
mod spill;
mod wire;

pub use wire::Elements;

pub use allgather::{
    AllGather, ExtractOrder, Gathered, allgather, allgather_into, allgather_parts, start_allgather,
    start_allgather_parts,
};
pub use allreduce::{
    CustomReduce, ReduceOp, allreduce, allreduce_into, allreduce_parts, reduce_scatter,
    start_allreduce, start_allreduce_parts, start_reduce_scatter,
};
pub use alltoall::{
    AllToAllvSpec, alltoall, alltoall_into, alltoallv, alltoallv_into, alltoallv_parts,
    start_alltoall, start_alltoallv, start_alltoallv_parts,
};
pub use barrier::{barrier, start_barrier};
pub use braid_kernels::{DType, Element, ReduceKind};
pub use broadcast::{broadcast, start_broadcast};
pub use error::{CollError, CollKind};
pub use halo::{Halo, HaloExchange};
pub use handle::{Callback, Handle};
pub use sendrecv::{sendrecv, start_sendrecv};
pub use shuffle::{PartitionOwner, Shuffle};
pub use spill::remove_spill_dirs;
