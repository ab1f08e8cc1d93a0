//! The one-rank device transport: the calls of [`NcclWork`](super::NcclWork)
//! for a communicator of a single rank, which has no peer to move data to.
//!
//! Every call is a device-to-device copy on the communicator's stream (or
//! nothing, in place), ordered with the stream's other work like NCCL's own
//! calls, with no host synchronization:
//!
//! ```text
//!   all_reduce, reduce_scatter, all_gather, broadcast (root 0):
//!       recv <- send, count elements
//!   group { send(to 0) ... recv(from 0) ... }:
//!       the i-th send feeds the i-th receive (lengths checked)
//! ```
//!
//! Why not NCCL with one rank: creating its communicator took 0.39-0.56 s
//! on an H200 machine and its first calls more (a 1M-row rolling job on one
//! GPU ran 1.32-1.42 s with it, 0.37-0.44 s without; BENCHMARKS.md, "One-GPU
//! jobs without NCCL"), and it needs libnccl where a one-GPU job needs none.

use cudarc::driver::result as dres;
use cudarc::driver::sys::CUdeviceptr;

use super::error::{CudaError, DriverResult};
use super::nccl::NcclDType;
use super::staged::{Env, Grouping, Part};
use crate::Rank;

/// The one-rank transport of a communicator (lives on its thread).
#[derive(Default)]
pub(super) struct Solo {
    group: Grouping,
}

impl Solo {
    /// A transport for a communicator of one rank.
    pub(super) fn new() -> Self {
        Self::default()
    }

    /// `recv <- send` on the stream: `bytes` bytes, nothing when in place.
    fn copy(
        &self,
        e: Env<'_>,
        recv: CUdeviceptr,
        send: CUdeviceptr,
        bytes: usize,
    ) -> Result<(), CudaError> {
        if bytes == 0 || recv == send {
            return Ok(());
        }
        // SAFETY: the caller guarantees both pointers hold `bytes` bytes of
        // device memory that outlive the stream's work (as for NCCL calls).
        unsafe { dres::memcpy_dtod_async(recv, send, bytes, e.stream.cu_stream()) }
            .on(e.rank, "cuMemcpyDtoDAsync")
    }

    /// AllReduce, ReduceScatter and AllGather of one rank: the input is the
    /// result (`count` elements).
    pub(super) fn copy_through(
        &self,
        e: Env<'_>,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        count: usize,
        dt: NcclDType,
    ) -> Result<(), CudaError> {
        self.copy(e, recv, send, count * dt.size())
    }

    /// Broadcast from `root`, which must be this rank.
    pub(super) fn broadcast(
        &self,
        e: Env<'_>,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        count: usize,
        dt: NcclDType,
        root: Rank,
    ) -> Result<(), CudaError> {
        peer_is_me(e, root, "broadcast root")?;
        self.copy(e, recv, send, count * dt.size())
    }

    /// A send of `bytes` to `peer` (this rank), inside a group.
    pub(super) fn send(
        &self,
        e: Env<'_>,
        ptr: CUdeviceptr,
        bytes: usize,
        peer: Rank,
    ) -> Result<(), CudaError> {
        peer_is_me(e, peer, "send to")?;
        self.queue(e, Part { ptr, bytes, peer }, true)
    }

    /// A receive of `bytes` from `peer` (this rank), inside a group.
    pub(super) fn recv(
        &self,
        e: Env<'_>,
        ptr: CUdeviceptr,
        bytes: usize,
        peer: Rank,
    ) -> Result<(), CudaError> {
        peer_is_me(e, peer, "receive from")?;
        self.queue(e, Part { ptr, bytes, peer }, false)
    }

    fn queue(&self, e: Env<'_>, part: Part, send: bool) -> Result<(), CudaError> {
        match self.group.queue(part, send) {
            None => Ok(()),
            // A lone send to oneself has no receive to meet (NCCL would
            // wait forever): only a group can pair them.
            Some(_) => Err(CudaError::Invalid {
                rank: e.rank,
                detail: "a send to or receive from this rank outside a group (one rank)".into(),
            }),
        }
    }

    /// Runs `f` as a group: when the outermost group closes, its i-th send
    /// feeds its i-th receive (a failed `f` leaves nothing open and moves
    /// nothing).
    pub(super) fn group<R>(
        &self,
        e: Env<'_>,
        f: impl FnOnce() -> Result<R, CudaError>,
    ) -> Result<R, CudaError> {
        let (r, closed) = self.group.run(f)?;
        if let Some(g) = closed {
            if g.sends.len() != g.recvs.len() {
                return Err(CudaError::Invalid {
                    rank: e.rank,
                    detail: format!(
                        "a group of {} sends to and {} receives from this rank (one rank)",
                        g.sends.len(),
                        g.recvs.len()
                    ),
                });
            }
            for (s, d) in g.sends.iter().zip(&g.recvs) {
                if s.bytes != d.bytes {
                    return Err(CudaError::Invalid {
                        rank: e.rank,
                        detail: format!(
                            "a send of {} bytes to this rank meets a receive of {} (one rank)",
                            s.bytes, d.bytes
                        ),
                    });
                }
            }
            for (s, d) in g.sends.iter().zip(&g.recvs) {
                self.copy(e, d.ptr, s.ptr, s.bytes)?;
            }
        }
        Ok(r)
    }
}

/// A peer of a one-rank communicator must be rank 0.
fn peer_is_me(e: Env<'_>, peer: Rank, what: &str) -> Result<(), CudaError> {
    if peer == e.rank {
        Ok(())
    } else {
        Err(CudaError::Invalid {
            rank: e.rank,
            detail: format!("{what} rank {peer} in a communicator of {} rank", e.nranks),
        })
    }
}
