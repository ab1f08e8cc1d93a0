//! Device collectives (feature `cuda`): the collectives of this crate on
//! device buffers, through NCCL.
//!
//! Same shape as the host collectives: each is one core, `start_*(..,
//! callback) -> Handle`, driven by the context's progress engine, and an
//! async function of the same name that awaits an `Event` set by the
//! callback. The core takes its place in the NCCL call order at call time
//! ([`braid_core::cuda::Slot`]), enqueues on the NCCL thread, and its task
//! awaits the CUDA event recorded after the work (the NCCL thread polls it;
//! no runtime worker blocks).
//!
//! | collective | NCCL | bus bytes (nccl-tests) |
//! |---|---|---|
//! | [`broadcast`] | ncclBroadcast | S |
//! | [`allgather`] | ncclAllGather | S (N-1)/N |
//! | [`allreduce`] | ncclAllReduce | 2 S (N-1)/N |
//! | [`reduce_scatter`] | ncclReduceScatter | S (N-1)/N |
//! | [`alltoall`], [`alltoallv`] | grouped ncclSend/ncclRecv | S (N-1)/N |
//! | [`sendrecv`], [`DeviceHaloExchange`] | grouped ncclSend/ncclRecv | S |
//! | [`DeviceShuffle`] | sizes on host, grouped ncclSend/ncclRecv | |
//!
//! Checks: with [`Checks::Agree`] (the default) every call also runs the
//! host-side agreement round of the host collectives (kind, type, count,
//! root, operator; AllToAllv's and SendRecv's per-pair sizes), alongside
//! the NCCL work. On a mismatch the NCCL communicator is aborted (a
//! mismatched NCCL call may otherwise wait forever) and every rank fails.
//! [`Checks::Off`] skips the round for the last microseconds of latency.

mod alltoallv;
mod dense;
mod p2p;
mod shuffle;

use std::future::Future;
use std::sync::Arc;

use braid_core::Context;
use braid_core::cuda::{
    Completion, CudaError, DeviceBuffer, Gpu, GpuEvent, KeepAlive, NcclComm, NcclDType, NcclOp,
    NcclWork,
};
use braid_kernels::{DType, ReduceKind};

use crate::error::{CollError, Site};
use crate::handle::{Callback, Handle, start};
use crate::wire::{Signature, check_signature};

pub use alltoallv::{DeviceAllToAllv, alltoallv, start_alltoallv};
pub use dense::{
    allgather, allreduce, alltoall, broadcast, reduce_scatter, start_allgather, start_allreduce,
    start_alltoall, start_broadcast, start_reduce_scatter,
};
pub use p2p::{DeviceHalo, DeviceHaloExchange, sendrecv, start_sendrecv};
pub use shuffle::{DeviceShuffle, DeviceShuffled};

/// Whether device collectives check that all ranks' calls agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Checks {
    /// Run the host agreement round alongside each call (default).
    #[default]
    Agree,
    /// Trust the caller.
    Off,
}

/// A rank's device communicator: its host context and NCCL communicator.
#[derive(Debug, Clone)]
pub struct DeviceComm {
    ctx: Context,
    nccl: NcclComm,
    checks: Checks,
}

impl DeviceComm {
    /// Collective over `ctx`: creates the NCCL communicator on `gpu` (the
    /// unique id travels over the host communicator).
    pub async fn new(ctx: &Context, gpu: Arc<Gpu>) -> Result<DeviceComm, CudaError> {
        let nccl = NcclComm::init(ctx, gpu).await?;
        Ok(DeviceComm {
            ctx: ctx.clone(),
            nccl,
            checks: Checks::default(),
        })
    }

    /// The same communicator with other checks.
    pub fn with_checks(mut self, checks: Checks) -> Self {
        self.checks = checks;
        self
    }

    /// The host context.
    pub fn ctx(&self) -> &Context {
        &self.ctx
    }

    /// The NCCL communicator.
    pub fn nccl(&self) -> &NcclComm {
        &self.nccl
    }

    /// The GPU.
    pub fn gpu(&self) -> &Arc<Gpu> {
        self.nccl.gpu()
    }

    /// This rank.
    pub fn rank(&self) -> braid_core::Rank {
        self.ctx.rank()
    }

    /// Number of ranks.
    pub fn nranks(&self) -> u32 {
        self.ctx.nranks()
    }
}

/// NCCL's element type for a braid element type.
pub(crate) fn nccl_dtype(d: DType) -> NcclDType {
    match d {
        DType::Bytes => NcclDType::U8,
        DType::I32 => NcclDType::I32,
        DType::I64 => NcclDType::I64,
        DType::F32 => NcclDType::F32,
        DType::F64 => NcclDType::F64,
    }
}

/// NCCL's operator for a braid reduction.
pub(crate) fn nccl_op(k: ReduceKind) -> NcclOp {
    match k {
        ReduceKind::Sum => NcclOp::Sum,
        ReduceKind::Prod => NcclOp::Prod,
        ReduceKind::Min => NcclOp::Min,
        ReduceKind::Max => NcclOp::Max,
    }
}

/// Checks that `buf` is on the communicator's GPU.
pub(crate) fn same_gpu(dc: &DeviceComm, site: &Site, buf: &DeviceBuffer) -> Result<(), CollError> {
    if !Arc::ptr_eq(buf.gpu(), dc.gpu()) && buf.gpu().ordinal() != dc.gpu().ordinal() {
        return Err(site.invalid(format!(
            "buffer is on GPU {}, the communicator on GPU {}",
            buf.gpu().ordinal(),
            dc.gpu().ordinal()
        )));
    }
    Ok(())
}

/// The common end of a device collective: runs the (optional) host check
/// alongside the NCCL completion; a failed check aborts NCCL so that the
/// completion resolves. Returns the (complete) event of the work.
pub(crate) async fn finish(
    dc: &DeviceComm,
    site: Site,
    check: impl Future<Output = Result<(), CollError>>,
    completion: Completion,
) -> Result<GpuEvent, CollError> {
    let nccl = dc.nccl.clone();
    let check = async move {
        let r = check.await;
        if let Err(e) = &r {
            nccl.abort(&e.to_string());
        }
        r
    };
    let (c, r) = futures::join!(check, completion);
    c?;
    r.map_err(|e| match e {
        CudaError::Comm(e) => site.comm(e),
        e => site.device(e),
    })
}

/// The signature check of a call, or nothing when checks are off.
pub(crate) fn signature_check(
    dc: &DeviceComm,
    site: Site,
    sig: Signature,
) -> impl Future<Output = Result<(), CollError>> + Send + 'static {
    let comm = dc.ctx.comm().clone();
    let on = dc.checks == Checks::Agree && dc.nranks() > 1;
    async move {
        if on {
            check_signature(comm.as_ref(), site, sig).await
        } else {
            Ok(())
        }
    }
}

/// Starts a device collective whose NCCL work is known at call time:
/// takes the slot and submits now, then spawns the task that awaits the
/// check and the completion and builds the result.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run<T: Send + 'static>(
    dc: &DeviceComm,
    site: Site,
    sig: Signature,
    waits: Vec<GpuEvent>,
    keep: Vec<KeepAlive>,
    work: impl FnOnce(&NcclWork<'_>) -> Result<(), CudaError> + Send + 'static,
    done: impl FnOnce(GpuEvent) -> T + Send + 'static,
    callback: Option<Callback>,
) -> Handle<T> {
    let completion = dc.nccl.slot().submit(waits, keep, work);
    let check = signature_check(dc, site, sig);
    let dc2 = dc.clone();
    start(&dc.ctx, site.coll, site.op, callback, async move {
        let ev = finish(&dc2, site, check, completion).await?;
        Ok(done(ev))
    })
}

/// Starts a collective that fails at once (bad arguments): the slot is
/// given up, nothing is enqueued.
pub(crate) fn failed<T: Send + 'static>(
    dc: &DeviceComm,
    site: Site,
    e: CollError,
    callback: Option<Callback>,
) -> Handle<T> {
    start(&dc.ctx, site.coll, site.op, callback, async move { Err(e) })
}
