//! `NcclComm`: an NCCL communicator, one rank per GPU, on its own OS thread.
//! Where ranks share a GPU, the same thread serves the same calls through
//! host memory instead (`Transport::HostStaged`, module `staged`); for a
//! single rank, as copies on its stream (`Transport::Solo`, module `solo`).
//!
//! NCCL forbids concurrent calls on one communicator and cudarc's handle is
//! neither `Send` nor `Sync`, so the communicator lives on a thread that
//! takes requests and answers them:
//!
//! ```text
//!  caller (any thread / task)          NCCL thread
//!  ──────────────────────────          ───────────────────────────────────
//!  slot()        seq = n  (call order)
//!  submit(work) ───── Request{seq} ──▶ run requests in seq order:
//!                                        stream waits on input events
//!                                        work(&NcclWork) enqueues NCCL calls
//!                                        record event E, keep buffers alive
//!                                      poll pending events (cuEventQuery)
//!  Completion (a future) ◀── Ok(E) ─── E complete → reply
//! ```
//!
//! Ordering: a request's place is fixed when its `Slot` is taken, at call
//! time, so every rank enqueues its NCCL calls in the order it made them
//! even when a collective first awaits host-side work (sizes, checks).
//!
//! Latency: the thread spins while work is pending or arrived in the last
//! `SPIN`, and sleeps on the channel otherwise; a reply costs one wake-up
//! of the awaiting task. Failure: every millisecond while work is pending
//! the thread checks the host communicator and NCCL's asynchronous error;
//! on either, or on `abort`, it calls `ncclCommAbort` (which unblocks
//! kernels waiting for a dead peer) and fails every pending request.

use std::any::Any;
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use cudarc::driver::CudaStream;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::nccl::{result as nres, sys as nsys};
use tokio::sync::oneshot;

use super::device::{Gpu, GpuEvent};
use super::error::CudaError;
use super::solo::Solo;
use super::staged::{Env, Staged};
use crate::comm::Communicator;
use crate::context::{Context, JobEnd};
use crate::tag::Tag;
use crate::{Buffer, Rank};

/// How long the thread keeps spinning after its last piece of work.
const SPIN: Duration = Duration::from_micros(500);
/// How often pending work checks for failures.
pub(super) const CHECK_EVERY: Duration = Duration::from_millis(1);
/// How long dropping the last handle waits for the thread to finish.
const EXIT_WAIT: Duration = Duration::from_secs(10);

/// Element types NCCL moves and reduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NcclDType {
    /// Bytes.
    U8,
    /// `i32`.
    I32,
    /// `i64`.
    I64,
    /// `f32`.
    F32,
    /// `f64`.
    F64,
}

impl NcclDType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            NcclDType::U8 => 1,
            NcclDType::I32 | NcclDType::F32 => 4,
            NcclDType::I64 | NcclDType::F64 => 8,
        }
    }

    fn raw(self) -> nsys::ncclDataType_t {
        use nsys::ncclDataType_t::*;
        match self {
            NcclDType::U8 => ncclUint8,
            NcclDType::I32 => ncclInt32,
            NcclDType::I64 => ncclInt64,
            NcclDType::F32 => ncclFloat32,
            NcclDType::F64 => ncclFloat64,
        }
    }
}

/// Reduction operators NCCL has built in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NcclOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
}

impl NcclOp {
    fn raw(self) -> nsys::ncclRedOp_t {
        use nsys::ncclRedOp_t::*;
        match self {
            NcclOp::Sum => ncclSum,
            NcclOp::Prod => ncclProd,
            NcclOp::Min => ncclMin,
            NcclOp::Max => ncclMax,
        }
    }
}

/// What a request's work sees on the NCCL thread: thin, unchecked NCCL
/// calls on the communicator's stream (or their host-staged forms, which
/// complete before they return). Pointers must be valid device memory of
/// the communicator's GPU for the counts given.
pub struct NcclWork<'a> {
    comm: nsys::ncclComm_t,
    stream: &'a Arc<CudaStream>,
    rank: Rank,
    nranks: u32,
    watch: Watch<'a>,
    /// Where the calls go: NCCL, or a transport of braid's own.
    path: Path<'a>,
}

/// Where a communicator's calls go (see [`Transport`]).
#[derive(Clone, Copy)]
enum Path<'a> {
    Nccl,
    Staged(&'a Staged),
    Solo(&'a Solo),
}

/// What a wait for NCCL watches so that it can give up: the abort flag
/// (set by `NcclComm::abort` from any thread) and the host communicator.
#[derive(Clone, Copy)]
pub(super) struct Watch<'a> {
    pub(super) flag: &'a AtomicBool,
    pub(super) host: &'a dyn Communicator,
    pub(super) rank: Rank,
}

impl Watch<'_> {
    /// Polls the (non-blocking) communicator until its pending call has
    /// settled: `Ok` once it has, an error if it failed or if the job is
    /// aborting meanwhile (the caller then aborts the communicator).
    fn settle(&self, comm: nsys::ncclComm_t, call: &'static str) -> Result<(), CudaError> {
        self.poll(call, || {
            let mut st = nsys::ncclResult_t::ncclSuccess;
            // SAFETY: a live communicator and an out-parameter.
            let r = unsafe { nsys::ncclCommGetAsyncError(comm, &mut st) };
            if r != nsys::ncclResult_t::ncclSuccess {
                st = r;
            }
            match st {
                nsys::ncclResult_t::ncclSuccess => Ok(true),
                nsys::ncclResult_t::ncclInProgress => Ok(false),
                e => Err(CudaError::Nccl {
                    rank: self.rank,
                    call,
                    detail: format!("{e:?}"),
                }),
            }
        })
    }

    /// Polls `ev` until it completes: an error if the job is aborting or
    /// the host communicator fails meanwhile (the caller then aborts the
    /// NCCL communicator).
    fn complete(&self, ev: &GpuEvent, call: &'static str) -> Result<(), CudaError> {
        self.poll(call, || ev.try_is_complete(self.rank))
    }

    /// Calls `done` until it says so (or fails), yielding between calls;
    /// fails where the job aborts or the host communicator fails meanwhile.
    fn poll(
        &self,
        call: &'static str,
        mut done: impl FnMut() -> Result<bool, CudaError>,
    ) -> Result<(), CudaError> {
        let mut last_check = Instant::now();
        while !done()? {
            if self.flag.load(Ordering::Acquire) {
                return Err(CudaError::Nccl {
                    rank: self.rank,
                    call,
                    detail: "aborted while the call was in progress".into(),
                });
            }
            if last_check.elapsed() >= CHECK_EVERY {
                last_check = Instant::now();
                if let Some(e) = self.host.failure() {
                    return Err(e.into());
                }
            }
            std::thread::yield_now();
        }
        Ok(())
    }
}

type NcclResult = Result<nres::NcclStatus, nres::NcclError>;

impl NcclWork<'_> {
    /// This rank.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// Number of ranks.
    pub fn nranks(&self) -> u32 {
        self.nranks
    }

    /// The communicator's stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }

    fn s(&self) -> nsys::cudaStream_t {
        self.stream.cu_stream() as nsys::cudaStream_t
    }

    /// The view a staged call needs.
    fn env(&self) -> Env<'_> {
        Env {
            stream: self.stream,
            rank: self.rank,
            nranks: self.nranks,
            watch: self.watch,
        }
    }

    /// Maps a call's result; a call left in progress (non-blocking
    /// communicator) is waited for until it settles.
    fn check(&self, call: &'static str, r: NcclResult) -> Result<(), CudaError> {
        match r {
            Ok(nres::NcclStatus::InProgress) => self.watch.settle(self.comm, call),
            Ok(_) => Ok(()),
            Err(e) => Err(CudaError::nccl(self.rank, call, e)),
        }
    }

    /// `ncclAllReduce`.
    pub fn all_reduce(
        &self,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        count: usize,
        dt: NcclDType,
        op: NcclOp,
    ) -> Result<(), CudaError> {
        match self.path {
            Path::Staged(st) => return st.all_reduce(self.env(), send, recv, count, dt, op),
            Path::Solo(so) => return so.copy_through(self.env(), send, recv, count, dt),
            Path::Nccl => {}
        }
        // SAFETY: the caller guarantees the pointers and counts.
        let r = unsafe {
            nres::all_reduce(
                send as _,
                recv as _,
                count,
                dt.raw(),
                op.raw(),
                self.comm,
                self.s(),
            )
        };
        self.check("ncclAllReduce", r)
    }

    /// `ncclBroadcast` (`send` is read on the root only).
    pub fn broadcast(
        &self,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        count: usize,
        dt: NcclDType,
        root: Rank,
    ) -> Result<(), CudaError> {
        match self.path {
            Path::Staged(st) => return st.broadcast(self.env(), send, recv, count, dt, root),
            Path::Solo(so) => return so.broadcast(self.env(), send, recv, count, dt, root),
            Path::Nccl => {}
        }
        // SAFETY: as above.
        let r = unsafe {
            nres::broadcast(
                send as _,
                recv as _,
                count,
                dt.raw(),
                root as i32,
                self.comm,
                self.s(),
            )
        };
        self.check("ncclBroadcast", r)
    }

    /// `ncclAllGather` (`count` elements per rank).
    pub fn all_gather(
        &self,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        count: usize,
        dt: NcclDType,
    ) -> Result<(), CudaError> {
        match self.path {
            Path::Staged(st) => return st.all_gather(self.env(), send, recv, count, dt),
            Path::Solo(so) => return so.copy_through(self.env(), send, recv, count, dt),
            Path::Nccl => {}
        }
        // SAFETY: as above.
        let r =
            unsafe { nres::all_gather(send as _, recv as _, count, dt.raw(), self.comm, self.s()) };
        self.check("ncclAllGather", r)
    }

    /// `ncclReduceScatter` (`count` elements per rank received).
    pub fn reduce_scatter(
        &self,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        count: usize,
        dt: NcclDType,
        op: NcclOp,
    ) -> Result<(), CudaError> {
        match self.path {
            Path::Staged(st) => return st.reduce_scatter(self.env(), send, recv, count, dt, op),
            Path::Solo(so) => return so.copy_through(self.env(), send, recv, count, dt),
            Path::Nccl => {}
        }
        // SAFETY: as above.
        let r = unsafe {
            nres::reduce_scatter(
                send as _,
                recv as _,
                count,
                dt.raw(),
                op.raw(),
                self.comm,
                self.s(),
            )
        };
        self.check("ncclReduceScatter", r)
    }

    /// `ncclSend` of `count` elements.
    pub fn send(
        &self,
        ptr: CUdeviceptr,
        count: usize,
        dt: NcclDType,
        peer: Rank,
    ) -> Result<(), CudaError> {
        match self.path {
            Path::Staged(st) => return st.send(self.env(), ptr, count * dt.size(), peer),
            Path::Solo(so) => return so.send(self.env(), ptr, count * dt.size(), peer),
            Path::Nccl => {}
        }
        // SAFETY: as above.
        let r = unsafe { nres::send(ptr as _, count, dt.raw(), peer as i32, self.comm, self.s()) };
        self.check("ncclSend", r)
    }

    /// `ncclRecv` of `count` elements.
    pub fn recv(
        &self,
        ptr: CUdeviceptr,
        count: usize,
        dt: NcclDType,
        peer: Rank,
    ) -> Result<(), CudaError> {
        match self.path {
            Path::Staged(st) => return st.recv(self.env(), ptr, count * dt.size(), peer),
            Path::Solo(so) => return so.recv(self.env(), ptr, count * dt.size(), peer),
            Path::Nccl => {}
        }
        // SAFETY: as above.
        let r = unsafe { nres::recv(ptr as _, count, dt.raw(), peer as i32, self.comm, self.s()) };
        self.check("ncclRecv", r)
    }

    /// Runs `f` between `ncclGroupStart` and `ncclGroupEnd` (the group is
    /// closed even when `f` fails).
    pub fn group<R>(&self, f: impl FnOnce(&Self) -> Result<R, CudaError>) -> Result<R, CudaError> {
        match self.path {
            Path::Staged(st) => return st.group(self.env(), || f(self)),
            Path::Solo(so) => return so.group(self.env(), || f(self)),
            Path::Nccl => {}
        }
        self.check("ncclGroupStart", nres::group_start())?;
        let r = f(self);
        let end = self.check("ncclGroupEnd", nres::group_end());
        let r = r?;
        end?;
        Ok(r)
    }
}

type WorkFn = Box<dyn FnOnce(&NcclWork<'_>) -> Result<(), CudaError> + Send>;
/// Run on the NCCL thread when a request's work has completed (or failed);
/// keep it short: it delays the next request.
pub type OnDone = Box<dyn FnOnce(Result<GpuEvent, CudaError>) + Send>;

/// How a request is answered.
enum Reply {
    Future(oneshot::Sender<Result<GpuEvent, CudaError>>),
    Call(OnDone),
}

impl Reply {
    fn send(self, r: Result<GpuEvent, CudaError>) {
        match self {
            Reply::Future(tx) => {
                let _ = tx.send(r);
            }
            Reply::Call(f) => {
                // A panicking completion (a user callback) must not end the
                // thread that serves every other request.
                let call = std::panic::AssertUnwindSafe(move || f(r));
                if std::panic::catch_unwind(call).is_err() {
                    tracing::error!("a completion callback panicked on the NCCL thread");
                }
            }
        }
    }
}

/// Something kept alive until the request's work has completed on the GPU.
pub type KeepAlive = Box<dyn Any + Send>;

struct Request {
    work: WorkFn,
    waits: Vec<GpuEvent>,
    keep: Vec<KeepAlive>,
    reply: Reply,
}

enum Msg {
    Run(u64, Request),
    Skip(u64),
    Abort(String),
}

struct Shared {
    tx: Mutex<Option<mpsc::Sender<Msg>>>,
    next_seq: AtomicU64,
    rank: Rank,
    nranks: u32,
    transport: Transport,
    gpu: Arc<Gpu>,
    teardown: Arc<Teardown>,
    /// Set by `abort`: a call waiting for NCCL gives up.
    flag: Arc<AtomicBool>,
}

impl Shared {
    fn send(&self, m: Msg) {
        if let Some(tx) = self.tx.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            let _ = tx.send(m);
        }
        self.teardown.unpark();
    }
}

/// When the communicator may go, and how. The last handle's drop comes
/// inside the rank's job: in a failing job, before `run_world` has told
/// the peers, who may still wait inside an operation with this rank.
/// `ncclCommDestroy` then blocks (2026-11-27: 10 s, then the process
/// exited with the NCCL thread still inside it and died of SIGSEGV). So a
/// closed NCCL communicator waits for the job's end
/// ([`Context::on_job_end`]): destroyed when the job finished (no peer can
/// still use it), aborted when it failed or the host communicator fails.
///
/// ```text
///   last handle dropped ──▶ closed ─┐
///                                   ├─▶ thread: Finished → destroy, Failed → abort ─▶ exited
///   job end (run_world) ──▶ end ────┘
///   whichever of the two comes second waits (at most EXIT_WAIT) for `exited`
/// ```
///
/// Host-staged and solo transports own no NCCL communicator: their thread
/// exits as soon as it is closed, and the drop waits for it.
struct Teardown {
    state: Mutex<TeardownState>,
    /// The job ended `Failed` (read by the serving loop at every turn,
    /// without the lock).
    failed: AtomicBool,
    exited: std::sync::Condvar,
    thread: Mutex<Option<std::thread::Thread>>,
}

#[derive(Default)]
struct TeardownState {
    /// How the job ended, once known.
    end: Option<JobEnd>,
    /// Every handle is gone.
    closed: bool,
    /// The thread has finished (the communicator is gone).
    exited: bool,
}

impl Teardown {
    fn lock(&self) -> std::sync::MutexGuard<'_, TeardownState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn unpark(&self) {
        if let Some(t) = self
            .thread
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            t.unpark();
        }
    }

    /// How the job ended, if known yet.
    fn end(&self) -> Option<JobEnd> {
        self.lock().end
    }

    /// Marks the thread finished and wakes every waiter.
    fn set_exited(&self) {
        self.lock().exited = true;
        self.exited.notify_all();
    }

    /// Waits (at most `EXIT_WAIT`) for the thread to finish; never from
    /// the thread itself (a completion callback may hold the last handle).
    fn wait_exit(&self, rank: Rank) {
        let on_thread = self
            .thread
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|t| t.id() == std::thread::current().id());
        if on_thread {
            return;
        }
        self.unpark();
        let st = self.lock();
        let (st, timeout) = self
            .exited
            .wait_timeout_while(st, EXIT_WAIT, |s| !s.exited)
            .unwrap_or_else(|p| p.into_inner());
        drop(st);
        if timeout.timed_out() {
            tracing::warn!(rank, "NCCL thread did not exit in {EXIT_WAIT:?}");
        }
    }
}

impl Drop for Shared {
    /// The last handle is gone: close the channel. A communicator with
    /// nothing to tear down across ranks (host-staged, solo), or whose
    /// job's end is known, is waited for here (at most `EXIT_WAIT`), so
    /// that no NCCL or CUDA call runs while the process exits; otherwise
    /// the job's end waits for it ([`Teardown`]).
    fn drop(&mut self) {
        self.tx.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        let wait = {
            let mut st = self.teardown.lock();
            st.closed = true;
            st.end.is_some() || self.transport != Transport::Nccl
        };
        self.teardown.unpark();
        if wait {
            self.teardown.wait_exit(self.rank);
        }
    }
}

/// An NCCL communicator served by its own thread; cheap to clone. The
/// thread ends (and the communicator is destroyed) when the last clone is
/// dropped and its work has completed.
#[derive(Clone)]
pub struct NcclComm {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComm")
            .field("rank", &self.shared.rank)
            .field("nranks", &self.shared.nranks)
            .field("gpu", &self.shared.gpu.ordinal())
            .finish()
    }
}

/// A place in the communicator's call order, taken at call time; the
/// request submitted through it runs after every earlier slot's. Dropping
/// a slot unused gives its place up.
pub struct Slot {
    shared: Arc<Shared>,
    seq: u64,
    used: bool,
}

impl Slot {
    /// Submits work for this slot: the stream waits on `waits`, then `work`
    /// enqueues NCCL calls; `keep` lives until the work completes. The
    /// returned future resolves once the enqueued work has completed.
    pub fn submit(
        self,
        waits: Vec<GpuEvent>,
        keep: Vec<KeepAlive>,
        work: impl FnOnce(&NcclWork<'_>) -> Result<(), CudaError> + Send + 'static,
    ) -> Completion {
        let (tx, rx) = oneshot::channel();
        let rank = self.shared.rank;
        self.send(waits, keep, Box::new(work), Reply::Future(tx));
        Completion { rx, rank }
    }

    /// Like [`Slot::submit`], but `on_done` is called on the NCCL thread
    /// when the work completes, instead of waking a future: the lowest
    /// latency way to learn of completion.
    pub fn submit_then(
        self,
        waits: Vec<GpuEvent>,
        keep: Vec<KeepAlive>,
        work: impl FnOnce(&NcclWork<'_>) -> Result<(), CudaError> + Send + 'static,
        on_done: OnDone,
    ) {
        self.send(waits, keep, Box::new(work), Reply::Call(on_done));
    }

    fn send(mut self, waits: Vec<GpuEvent>, keep: Vec<KeepAlive>, work: WorkFn, reply: Reply) {
        self.used = true;
        self.shared.send(Msg::Run(
            self.seq,
            Request {
                work,
                waits,
                keep,
                reply,
            },
        ));
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.used {
            self.shared.send(Msg::Skip(self.seq));
        }
    }
}

/// Resolves when a submitted request's work has completed on the GPU, with
/// the (complete) event recorded after it.
pub struct Completion {
    rx: oneshot::Receiver<Result<GpuEvent, CudaError>>,
    rank: Rank,
}

impl Future for Completion {
    type Output = Result<GpuEvent, CudaError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let rank = self.rank;
        Pin::new(&mut self.rx).poll(cx).map(|r| {
            r.unwrap_or_else(|_| {
                Err(CudaError::Nccl {
                    rank,
                    call: "request",
                    detail: "the NCCL thread ended before the work completed".into(),
                })
            })
        })
    }
}

impl Completion {
    /// Blocks the calling thread until the work completes.
    pub fn wait_blocking(self) -> Result<GpuEvent, CudaError> {
        let rank = self.rank;
        self.rx.blocking_recv().unwrap_or_else(|_| {
            Err(CudaError::Nccl {
                rank,
                call: "request",
                detail: "the NCCL thread ended before the work completed".into(),
            })
        })
    }
}

impl NcclComm {
    /// Creates the communicator of every rank of `ctx` (collective: every
    /// rank calls it, in the same order relative to other collectives).
    /// Every rank sends rank 0 its GPU's UUID; rank 0 picks the
    /// [`Transport`] (host staging where ranks share a GPU, or as
    /// `BRAID_DEVICE_TRANSPORT` says), makes the NCCL unique id and sends
    /// both over the host communicator; each rank then initialises NCCL (or
    /// the staged transport) on a new thread.
    pub async fn init(ctx: &Context, gpu: Arc<Gpu>) -> Result<NcclComm, CudaError> {
        Self::init_with(ctx, gpu, NcclMode::default()).await
    }

    /// Like [`NcclComm::init`], in the given mode.
    pub async fn init_with(
        ctx: &Context,
        gpu: Arc<Gpu>,
        mode: NcclMode,
    ) -> Result<NcclComm, CudaError> {
        let rank = ctx.rank();
        let nranks = ctx.nranks();
        let comm = ctx.comm().clone();
        let op = ctx.next_op_id();
        let tag = Tag::new(op, 0);
        let (transport, id) = agree_transport(comm.as_ref(), &gpu, tag).await?;
        let link = match transport {
            Transport::Nccl => Link::Nccl(id, mode),
            Transport::HostStaged => {
                let rt = tokio::runtime::Handle::try_current().map_err(|_| CudaError::Invalid {
                    rank,
                    detail: "the host-staged device transport needs a tokio runtime".into(),
                })?;
                Link::Staged(Staged::new(Tag::new(op, 1), rt))
            }
            Transport::Solo => Link::Solo(Solo::new()),
        };

        let (tx, rx) = mpsc::channel();
        let teardown = Arc::new(Teardown {
            state: Mutex::new(TeardownState::default()),
            failed: AtomicBool::new(false),
            exited: std::sync::Condvar::new(),
            thread: Mutex::new(None),
        });
        let flag = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared {
            tx: Mutex::new(Some(tx)),
            next_seq: AtomicU64::new(0),
            rank,
            nranks,
            transport,
            gpu: gpu.clone(),
            teardown: teardown.clone(),
            flag: flag.clone(),
        });
        let (init_tx, init_rx) = oneshot::channel();
        let host = comm.clone();
        let thread_flag = flag.clone();
        let thread_td = teardown.clone();
        let handle = std::thread::Builder::new()
            .name(format!("braid-nccl-{rank}"))
            .spawn(move || {
                serve(
                    gpu,
                    rank,
                    nranks,
                    link,
                    rx,
                    host,
                    init_tx,
                    thread_flag,
                    &thread_td,
                );
                thread_td.set_exited();
            })
            .map_err(|e| CudaError::Invalid {
                rank,
                detail: format!("cannot start the NCCL thread: {e}"),
            })?;
        *teardown.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle.thread().clone());
        let hook_td = teardown.clone();
        ctx.on_job_end(move |end| {
            let wait = {
                let mut st = hook_td.lock();
                st.end = Some(end);
                st.closed
            };
            if end == JobEnd::Failed {
                hook_td.failed.store(true, Ordering::Release);
            }
            hook_td.unpark();
            if wait {
                hook_td.wait_exit(rank);
            }
        });
        // Wait for ncclCommInitRank, watching the host communicator: a rank
        // that died before joining would otherwise leave us waiting.
        let mut init_rx = init_rx;
        loop {
            tokio::select! {
                r = &mut init_rx => {
                    return match r {
                        Ok(Ok(())) => Ok(NcclComm { shared }),
                        Ok(Err(e)) => Err(e),
                        Err(_) => Err(CudaError::Nccl { rank, call: "ncclCommInitRank", detail: "NCCL thread ended".into() }),
                    };
                }
                _ = tokio::time::sleep(Duration::from_millis(10)) => {
                    if let Some(e) = comm.failure() {
                        return Err(e.into());
                    }
                }
            }
        }
    }

    /// This rank.
    pub fn rank(&self) -> Rank {
        self.shared.rank
    }

    /// Number of ranks.
    pub fn nranks(&self) -> u32 {
        self.shared.nranks
    }

    /// The GPU.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.shared.gpu
    }

    /// How this communicator moves device data.
    pub fn transport(&self) -> Transport {
        self.shared.transport
    }

    /// Takes the next place in the call order.
    pub fn slot(&self) -> Slot {
        Slot {
            shared: self.shared.clone(),
            seq: self.shared.next_seq.fetch_add(1, Ordering::AcqRel),
            used: false,
        }
    }

    /// Takes the next place and submits `work` to it at once.
    pub fn submit(
        &self,
        waits: Vec<GpuEvent>,
        keep: Vec<KeepAlive>,
        work: impl FnOnce(&NcclWork<'_>) -> Result<(), CudaError> + Send + 'static,
    ) -> Completion {
        self.slot().submit(waits, keep, work)
    }

    /// Aborts the communicator: pending and later requests fail.
    pub fn abort(&self, reason: &str) {
        self.shared.flag.store(true, Ordering::Release);
        self.shared.send(Msg::Abort(reason.to_string()));
    }
}

struct Pending {
    event: GpuEvent,
    reply: Reply,
    _keep: Vec<KeepAlive>,
}

/// How the NCCL communicator's calls behave on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NcclMode {
    /// Calls return once their work is enqueued (NCCL's default; the
    /// fastest: about 10 us per small collective on NVLink). Connections
    /// to every peer are set up by a warm-up right after init, so a later
    /// call never waits on the host for a peer: a mismatched call hangs on
    /// the GPU only, where `ncclCommAbort` ends it. A rank that dies before
    /// joining init is noticed through the host communicator, but the init
    /// call itself cannot be interrupted.
    #[default]
    Blocking,
    /// Every call returns at once and is polled (`blocking = 0`): any wait
    /// can be interrupted, init included. NCCL launches through a
    /// background thread in this mode, which costs tens of microseconds
    /// per call.
    NonBlocking,
}

/// Sets up the connections every later call uses (ring and tree for the
/// collectives, point-to-point with every peer), so that no call made
/// later blocks the host waiting for a peer.
fn warm_up(w: &NcclWork<'_>, gpu: &Arc<Gpu>) -> Result<(), CudaError> {
    let n = w.nranks();
    let big = 4 << 20;
    // Two disjoint regions: `a` (big bytes) and `b` (big bytes).
    let buf = super::DeviceBuffer::alloc(gpu, 2 * big);
    let r = buf.as_ref().map_err(Clone::clone).and_then(|buf| {
        let (a, b) = (buf.ptr(), buf.ptr() + big as u64);
        for count in [8usize, big] {
            w.all_reduce(a, a, count / 4, NcclDType::F32, NcclOp::Sum)?;
            w.broadcast(a, a, count, NcclDType::U8, 0)?;
        }
        let per = big / n as usize / 4 * 4;
        w.all_gather(b, a, per, NcclDType::U8)?;
        w.reduce_scatter(a, b, per / 4, NcclDType::F32, NcclOp::Sum)?;
        w.group(|w| {
            for p in 0..n {
                w.send(a, 64, NcclDType::U8, p)?;
                w.recv(b, 64, NcclDType::U8, p)?;
            }
            Ok(())
        })?;
        // Waited for as the thread waits for any work: a peer that fails
        // meanwhile (its warm-up calls never come) fails this one too,
        // rather than hold a stream synchronise for ever.
        let ev = gpu.record(w.stream())?;
        w.watch.complete(&ev, "warm-up")
    });
    if r.is_err() {
        // SAFETY: abort is the documented way out of hung operations; the
        // communicator is not used again. Before `buf` goes back to the
        // pool: the stream may still be reading it.
        unsafe {
            let _ = nsys::ncclCommAbort(w.comm);
        }
        let _ = w.stream().synchronize();
    }
    drop(buf);
    r
}

/// The communicator's configuration (NCCL_CONFIG_INITIALIZER with the
/// mode's `blocking`), laid out as NCCL 2.28 expects.
fn config(mode: NcclMode) -> nsys::ncclConfig_t {
    const UNDEF: i32 = i32::MIN;
    // SAFETY: a plain C struct of integers and pointers; every field is
    // set below.
    let mut c: nsys::ncclConfig_t = unsafe { std::mem::zeroed() };
    c.size = std::mem::offset_of!(nsys::ncclConfig_t, graphUsageMode);
    c.magic = 0xcafe_beef;
    c.version = 22800;
    c.blocking = i32::from(mode == NcclMode::Blocking);
    c.cgaClusterSize = UNDEF;
    c.minCTAs = UNDEF;
    c.maxCTAs = UNDEF;
    c.netName = std::ptr::null();
    c.splitShare = UNDEF;
    c.trafficClass = UNDEF;
    c.commName = std::ptr::null();
    c.collnetEnable = UNDEF;
    c.CTAPolicy = UNDEF;
    c.shrinkShare = UNDEF;
    c.nvlsCTAs = UNDEF;
    c.nChannelsPerNetPeer = UNDEF;
    c.nvlinkCentricSched = UNDEF;
    c.graphUsageMode = UNDEF;
    c.numRmaCtx = UNDEF;
    c.maxP2pPeers = UNDEF;
    c
}

/// The NCCL thread.
#[allow(clippy::too_many_arguments)]
fn serve(
    gpu: Arc<Gpu>,
    rank: Rank,
    nranks: u32,
    link: Link,
    rx: mpsc::Receiver<Msg>,
    host: Arc<dyn Communicator>,
    init: oneshot::Sender<Result<(), CudaError>>,
    flag: Arc<AtomicBool>,
    teardown: &Teardown,
) {
    let watch = Watch {
        flag: &flag,
        host: host.as_ref(),
        rank,
    };
    let mut comm: nsys::ncclComm_t = std::ptr::null_mut();
    let setup = (|| -> Result<Arc<CudaStream>, CudaError> {
        gpu.bind()?;
        let stream = gpu.new_stream()?;
        let Link::Nccl(id, mode) = &link else {
            return Ok(stream);
        };
        let (id, mode) = (*id, *mode);
        let mut cfg = config(mode);
        // SAFETY: `comm` is written by NCCL; every rank joins with the same
        // id; `cfg` is a complete configuration.
        let r = unsafe {
            nsys::ncclCommInitRankConfig(&mut comm, nranks as i32, id, rank as i32, &mut cfg)
        };
        match r {
            nsys::ncclResult_t::ncclSuccess => {}
            nsys::ncclResult_t::ncclInProgress => watch.settle(comm, "ncclCommInitRankConfig")?,
            e => {
                return Err(CudaError::Nccl {
                    rank,
                    call: "ncclCommInitRankConfig",
                    detail: format!("{e:?}"),
                });
            }
        }
        Ok(stream)
    })();
    let (comm, stream) = match setup {
        Ok(stream) => (comm, stream),
        Err(e) => {
            if !comm.is_null() {
                // SAFETY: abort frees a communicator whose init failed.
                unsafe {
                    let _ = nsys::ncclCommAbort(comm);
                }
            }
            let _ = init.send(Err(e));
            return;
        }
    };
    let path = match &link {
        Link::Staged(st) => Path::Staged(st),
        Link::Solo(so) => Path::Solo(so),
        Link::Nccl(..) => Path::Nccl,
    };
    let work = NcclWork {
        comm,
        stream: &stream,
        rank,
        nranks,
        watch,
        path,
    };
    if matches!(link, Link::Nccl(_, NcclMode::Blocking)) {
        // (A failed warm-up has aborted the communicator.)
        if let Err(e) = warm_up(&work, &gpu) {
            let _ = init.send(Err(e));
            return;
        }
    }
    let _ = init.send(Ok(()));
    let mut queued: BTreeMap<u64, Option<Request>> = BTreeMap::new();
    let mut next = 0u64;
    let mut pending: VecDeque<Pending> = VecDeque::new();
    // Requests that failed once their work may have been enqueued (a
    // failed NCCL call, a panic inside a group, a failed event record):
    // answered with their error only after the abort below has let the
    // stream drain, so that what they hold (the output the answer hands
    // back, the inputs) cannot go back to the pool while NCCL still uses
    // it.
    let mut failed_late: Vec<(Reply, Vec<KeepAlive>, CudaError)> = Vec::new();
    let mut aborted: Option<String> = None;
    let mut closed = false;
    let mut last_activity = Instant::now();
    let mut last_check = Instant::now();

    let fail = |reply: Reply, why: &str| {
        reply.send(Err(CudaError::Nccl {
            rank,
            call: "communicator",
            detail: format!("aborted: {why}"),
        }));
    };

    loop {
        // 1. Take what has arrived.
        loop {
            match rx.try_recv() {
                Ok(Msg::Run(seq, r)) => {
                    queued.insert(seq, Some(r));
                }
                Ok(Msg::Skip(seq)) => {
                    queued.insert(seq, None);
                }
                Ok(Msg::Abort(why)) => {
                    if aborted.is_none() {
                        aborted = Some(why);
                    }
                }
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    closed = true;
                    break;
                }
            }
            last_activity = Instant::now();
        }
        // 2. Failure checks while work is pending; a job that failed while
        //    a handle still lives aborts too.
        if aborted.is_none() && teardown.failed.load(Ordering::Acquire) {
            aborted = Some("the rank's job failed".into());
        }
        if aborted.is_none() && !pending.is_empty() && last_check.elapsed() >= CHECK_EVERY {
            last_check = Instant::now();
            if let Some(e) = host.failure() {
                aborted = Some(e.to_string());
            } else if !comm.is_null() {
                let mut st = nsys::ncclResult_t::ncclSuccess;
                // SAFETY: a live communicator and an out-parameter.
                let _ = unsafe { nsys::ncclCommGetAsyncError(comm, &mut st) };
                if st != nsys::ncclResult_t::ncclSuccess && st != nsys::ncclResult_t::ncclInProgress
                {
                    aborted = Some(format!("NCCL asynchronous error {st:?}"));
                }
            }
        }
        if let Some(why) = &aborted {
            tracing::debug!(
                rank,
                pending = pending.len(),
                "aborting NCCL communicator: {why}"
            );
            if !comm.is_null() {
                // SAFETY: abort is the documented way out of hung operations.
                unsafe {
                    let _ = nsys::ncclCommAbort(comm);
                }
            }
            // Let what was enqueued finish (or fail) before the buffers the
            // pending requests hold go back to the pool.
            let _ = stream.synchronize();
            for (reply, keep, e) in failed_late.drain(..) {
                reply.send(Err(e));
                drop(keep);
            }
            for p in pending.drain(..) {
                fail(p.reply, why);
            }
            for (_, r) in std::mem::take(&mut queued) {
                if let Some(r) = r {
                    fail(r.reply, why);
                }
            }
            // Answer everything else that arrives, until every handle is gone.
            tracing::debug!(rank, "NCCL communicator aborted");
            while let Ok(m) = rx.recv() {
                if let Msg::Run(_, r) = m {
                    fail(r.reply, why);
                }
            }
            tracing::debug!(rank, "NCCL thread exits after abort");
            return;
        }
        // 3. Run queued requests in call order.
        while aborted.is_none() {
            let Some(entry) = queued.remove(&next) else {
                break;
            };
            next += 1;
            let Some(req) = entry else { continue };
            let r = (|| -> Result<GpuEvent, CudaError> {
                for ev in &req.waits {
                    if !ev.is_complete() {
                        stream
                            .wait(&ev.0)
                            .map_err(|e| CudaError::driver(rank, "cuStreamWaitEvent", e))?;
                    }
                }
                // A panicking request must not take the thread (and every
                // later request) with it.
                // (Not `Invalid`: it may have panicked with part of its
                // work enqueued, or inside a group left open; the
                // communicator is aborted.)
                let w = std::panic::AssertUnwindSafe(|| (req.work)(&work));
                std::panic::catch_unwind(w).unwrap_or_else(|_| {
                    Err(CudaError::Nccl {
                        rank,
                        call: "request",
                        detail: "a request's work panicked on the NCCL thread".into(),
                    })
                })?;
                gpu.record(&stream)
            })();
            match r {
                Ok(event) => pending.push_back(Pending {
                    event,
                    reply: req.reply,
                    _keep: req.keep,
                }),
                // A request refused before any work (bad arguments).
                Err(e @ CudaError::Invalid { .. }) => req.reply.send(Err(e)),
                Err(e) => {
                    // A failed NCCL call leaves the communicator unusable;
                    // everything after it fails the same way.
                    if aborted.is_none() {
                        aborted = Some(e.to_string());
                    }
                    failed_late.push((req.reply, req.keep, e));
                }
            }
            last_activity = Instant::now();
        }
        // 4. Answer completed work (one stream: completes in order).
        while let Some(p) = pending.front() {
            match p.event.try_is_complete(rank) {
                Ok(true) => {
                    if let Some(p) = pending.pop_front() {
                        p.reply.send(Ok(p.event));
                    }
                    last_activity = Instant::now();
                }
                Ok(false) => break,
                Err(e) => {
                    aborted = Some(e.to_string());
                    break;
                }
            }
        }
        // 5. Idle: spin for a while, then sleep.
        if pending.is_empty() && queued.is_empty() {
            if closed {
                break;
            }
            if last_activity.elapsed() > SPIN {
                std::thread::park_timeout(Duration::from_millis(50));
            } else {
                std::hint::spin_loop();
            }
        } else if !pending.is_empty() {
            std::hint::spin_loop();
        } else if !closed {
            // Requests wait for an earlier slot still being filled (a halo
            // waiting for its sizes): sleep briefly instead of spinning; a
            // submit unparks the thread.
            std::thread::park_timeout(Duration::from_micros(200));
        } else {
            // Queued work waits for a slot that can no longer come.
            for (_, r) in std::mem::take(&mut queued) {
                if let Some(r) = r {
                    fail(r.reply, "a slot before this request was never filled");
                }
            }
            break;
        }
    }
    if comm.is_null() {
        return;
    }
    // Closed with no work pending: destroy once the job finished (every
    // peer is done with the communicator), abort if it failed or the host
    // communicator fails meanwhile (a peer may be waiting for this rank
    // inside an operation, and destroy would wait for it).
    let end = loop {
        if let Some(end) = teardown.end() {
            break end;
        }
        if host.failure().is_some() {
            break JobEnd::Failed;
        }
        std::thread::park_timeout(Duration::from_millis(10));
    };
    tracing::debug!(rank, ?end, "tearing the NCCL communicator down");
    // SAFETY: no work is pending; destroy and abort both free the
    // communicator, abort without waiting for peers.
    unsafe {
        let _ = match end {
            JobEnd::Finished => nsys::ncclCommDestroy(comm),
            JobEnd::Failed => nsys::ncclCommAbort(comm),
        };
    }
}

/// What the communicator's thread talks through.
enum Link {
    /// An NCCL communicator to create from the unique id, in this mode.
    Nccl(nsys::ncclUniqueId, NcclMode),
    /// Host staging (no NCCL communicator).
    Staged(Staged),
    /// One rank: copies on the stream (no NCCL communicator).
    Solo(Solo),
}

/// How a communicator moves device data between ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// NCCL, one rank per GPU: chosen wherever every rank has its own GPU.
    Nccl,
    /// Through host memory over the host communicator (see the `staged`
    /// module): chosen when ranks share a GPU, which NCCL refuses, or with
    /// `BRAID_DEVICE_TRANSPORT=host`. Much slower; for development
    /// machines and tests.
    HostStaged,
    /// A communicator of one rank (the default there): every call is a
    /// device-to-device copy on its stream, or nothing in place (see the
    /// `solo` module); no NCCL communicator is created, so a one-GPU job
    /// starts faster and needs no libnccl.
    Solo,
}

/// The environment variable that picks the transport at rank 0: `nccl`,
/// `host`, or `auto` (the default: [`Transport::Solo`] for one rank, NCCL
/// unless two ranks share a GPU).
pub const TRANSPORT_VAR: &str = "BRAID_DEVICE_TRANSPORT";

/// Collective: every rank sends rank 0 its GPU's UUID; rank 0 picks the
/// transport (and, for NCCL, makes the unique id) and tells every rank.
/// A failure at rank 0 reaches every rank as an error.
async fn agree_transport(
    comm: &dyn Communicator,
    gpu: &Gpu,
    tag: Tag,
) -> Result<(Transport, nsys::ncclUniqueId), CudaError> {
    const NCCL: u8 = 0;
    const HOST: u8 = 1;
    const SOLO: u8 = 2;
    const FAILED: u8 = 255;
    let rank = comm.rank();
    let nranks = comm.nranks();
    // A rank that cannot read its UUID still answers (with no bytes), so
    // that rank 0 fails every rank instead of waiting for it.
    let uuid = gpu.uuid();
    let mine = uuid.as_ref().map(|u| u.to_vec()).unwrap_or_default();
    let msg = if rank == 0 {
        let mut ids = vec![mine];
        for r in 1..nranks {
            ids.push(comm.recv(r, tag).await?.as_slice().to_vec());
        }
        let unread = ids.iter().position(|id| id.len() != 16);
        let decided = match (uuid.clone(), unread) {
            (Err(e), _) => Err(e),
            (Ok(_), Some(r)) => Err(CudaError::Invalid {
                rank,
                detail: format!("rank {r} could not read its GPU's UUID"),
            }),
            (Ok(_), None) => pick_transport(rank, &ids),
        };
        let decided = decided.and_then(|t| match t {
            Transport::HostStaged => Ok((HOST, vec![0u8; 128])),
            Transport::Solo => Ok((SOLO, vec![0u8; 128])),
            Transport::Nccl => {
                nccl_present(rank)?;
                let id = nres::get_uniqueid()
                    .map_err(|e| CudaError::nccl(rank, "ncclGetUniqueId", e))?;
                Ok((NCCL, id.internal.iter().map(|&c| c as u8).collect()))
            }
        });
        let mut msg = vec![FAILED];
        if let Ok((code, id)) = &decided {
            msg = vec![*code];
            msg.extend_from_slice(id);
        }
        for r in 1..nranks {
            comm.send(r, tag, Buffer::from_vec(msg.clone())).await?;
        }
        decided?;
        msg
    } else {
        comm.send(0, tag, Buffer::from_vec(mine)).await?;
        uuid?;
        comm.recv(0, tag).await?.as_slice().to_vec()
    };
    let bad = |detail: String| CudaError::Invalid { rank, detail };
    let transport = match msg.first() {
        Some(&NCCL) => {
            nccl_present(rank)?;
            Transport::Nccl
        }
        Some(&HOST) => Transport::HostStaged,
        Some(&SOLO) => Transport::Solo,
        Some(&FAILED) => {
            return Err(bad("rank 0 could not set up the device communicator".into()));
        }
        _ => return Err(bad(format!("bad transport message from rank 0: {msg:?}"))),
    };
    if msg.len() != 129 {
        return Err(bad(format!(
            "transport message from rank 0 has {} bytes, not 129",
            msg.len()
        )));
    }
    let mut internal = [0 as std::ffi::c_char; 128];
    for (d, s) in internal.iter_mut().zip(&msg[1..]) {
        *d = *s as std::ffi::c_char;
    }
    Ok((transport, nsys::ncclUniqueId { internal }))
}

/// Rank 0's choice from every rank's GPU UUID and `BRAID_DEVICE_TRANSPORT`.
fn pick_transport(rank: Rank, uuids: &[Vec<u8>]) -> Result<Transport, CudaError> {
    let shared = (0..uuids.len())
        .flat_map(|a| (a + 1..uuids.len()).map(move |b| (a, b)))
        .find(|&(a, b)| uuids[a] == uuids[b]);
    let want = std::env::var(TRANSPORT_VAR).unwrap_or_default();
    match want.as_str() {
        "nccl" => Ok(Transport::Nccl),
        "host" => Ok(Transport::HostStaged),
        "" | "auto" if uuids.len() == 1 => Ok(Transport::Solo),
        "" | "auto" => Ok(match shared {
            Some((a, b)) => {
                tracing::warn!(
                    "ranks {a} and {b} share a GPU, which NCCL does not allow: device data \
                     goes through host memory (slower; one GPU per rank is the fast path)"
                );
                Transport::HostStaged
            }
            None => Transport::Nccl,
        }),
        other => Err(CudaError::Invalid {
            rank,
            detail: format!("{TRANSPORT_VAR}={other:?}: expected nccl, host or auto"),
        }),
    }
}

/// Whether libnccl can be loaded (an error that says what to do if not).
fn nccl_present(rank: Rank) -> Result<(), CudaError> {
    // SAFETY: only probes whether the library can be loaded.
    if unsafe { nsys::is_culib_present() } {
        Ok(())
    } else {
        Err(CudaError::NoDevice {
            rank,
            detail: format!(
                "libnccl could not be loaded (is it on LD_LIBRARY_PATH?); \
                 {TRANSPORT_VAR}=host moves device data through host memory instead"
            ),
        })
    }
}
