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
//! Buffers: an input is read by the GPU until the call's handle completes,
//! so (as with MPI's send buffers) do not write it before then; an output
//! is handed back written. A call waits for its output's outstanding reads
//! and writes and its inputs' latest writes before its NCCL work starts.
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
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use braid_core::Context;
use braid_core::cuda::{
    Completion, CudaError, DeviceBuffer, Gpu, GpuEvent, KeepAlive, NcclComm, NcclDType, NcclMode,
    NcclOp, NcclWork,
};
use braid_kernels::{DType, ReduceKind};

use crate::error::{CollError, Site};
use crate::handle::{Callback, Finisher, Handle, manual, start};
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
        Self::new_with(ctx, gpu, NcclMode::default()).await
    }

    /// Like [`DeviceComm::new`], with the NCCL communicator in `mode`.
    pub async fn new_with(
        ctx: &Context,
        gpu: Arc<Gpu>,
        mode: NcclMode,
    ) -> Result<DeviceComm, CudaError> {
        let nccl = NcclComm::init_with(ctx, gpu, mode).await?;
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

/// How long a streaming wrapper keeps polling before it sleeps (see
/// `handle::streaming_spin`): covers the collectives whose latency a
/// wake-up would dominate.
pub(crate) const SPIN: std::time::Duration = std::time::Duration::from_millis(1);

/// The streaming form of a device collective.
pub(crate) async fn streaming<T: Send + 'static>(
    start: impl FnOnce(Option<Callback>) -> Handle<T>,
) -> Result<T, CollError> {
    crate::handle::streaming_spin(SPIN, start).await
}

/// Starts a device collective whose NCCL work is known at call time, with
/// the signature check.
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
    let checked = dc.checks == Checks::Agree && dc.nranks() > 1;
    let check = signature_check(dc, site, sig);
    run_with(
        dc,
        site,
        checked.then_some(check),
        waits,
        keep,
        work,
        done,
        callback,
    )
}

/// What a device collective waits for: its NCCL work and, when checks are
/// on, its host check. Whichever arrives last completes the handle, on its
/// own thread (the NCCL thread or the check's task): no task sits in
/// between, so a completion reaches the caller with one wake-up.
struct Join<T> {
    remaining: AtomicU8,
    site: Site,
    check: Mutex<Option<Result<(), CollError>>>,
    nccl: Mutex<Option<Result<GpuEvent, CudaError>>>,
    finish: Mutex<Option<(Finisher<T>, Done<T>)>>,
}

type Done<T> = Box<dyn FnOnce(GpuEvent) -> T + Send>;

impl<T> Join<T> {
    fn arrive(&self) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let Some((fin, done)) = self.finish.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return;
        };
        let check = self.check.lock().unwrap_or_else(|p| p.into_inner()).take();
        let nccl = self.nccl.lock().unwrap_or_else(|p| p.into_inner()).take();
        let site = self.site;
        let r = match (check, nccl) {
            (Some(Err(e)), _) => Err(e),
            (_, Some(Ok(ev))) => Ok(done(ev)),
            (_, Some(Err(CudaError::Comm(e)))) => Err(site.comm(e)),
            (_, Some(Err(e))) => Err(site.device(e)),
            (_, None) => Err(site.device("the NCCL work was never answered")),
        };
        fin.finish(r);
    }
}

/// Starts a device collective whose NCCL work is known at call time: takes
/// its slot and submits now (so every rank enqueues in call order), runs
/// `check` (if any) alongside; a failed check aborts NCCL so that the work
/// cannot hang.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_with<T: Send + 'static, C>(
    dc: &DeviceComm,
    site: Site,
    check: Option<C>,
    waits: Vec<GpuEvent>,
    keep: Vec<KeepAlive>,
    work: impl FnOnce(&NcclWork<'_>) -> Result<(), CudaError> + Send + 'static,
    done: impl FnOnce(GpuEvent) -> T + Send + 'static,
    callback: Option<Callback>,
) -> Handle<T>
where
    C: Future<Output = Result<(), CollError>> + Send + 'static,
{
    let (handle, fin) = manual(&dc.ctx, site.coll, site.op, callback);
    let join = Arc::new(Join {
        remaining: AtomicU8::new(if check.is_some() { 2 } else { 1 }),
        site,
        check: Mutex::new(None),
        nccl: Mutex::new(None),
        finish: Mutex::new(Some((fin, Box::new(done) as Done<T>))),
    });
    let j = join.clone();
    dc.nccl.slot().submit_then(
        waits,
        keep,
        work,
        Box::new(move |r| {
            *j.nccl.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
            j.arrive();
        }),
    );
    if let Some(check) = check {
        let nccl = dc.nccl.clone();
        dc.ctx.progress().spawn(async move {
            let r = check.await;
            if let Err(e) = &r {
                nccl.abort(&e.to_string());
            }
            *join.check.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
            join.arrive();
        });
    }
    handle
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
