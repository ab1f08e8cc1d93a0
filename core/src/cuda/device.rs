//! `Gpu`: one CUDA device as a rank uses it, and `GpuEvent`, a recorded
//! point in a stream.
//!
//! Device memory comes from plain `cuMemAlloc` (never a stream-ordered
//! pool): `cuIpcGetMemHandle` rejects pool memory, and every `DeviceBuffer`
//! may be exported. `cuMemAlloc`/`cuMemFree` are slow and synchronising,
//! so freed allocations go back to a per-`Gpu` free list keyed by size and
//! are reused; a reused allocation carries the event of its last use, which
//! its next user's stream waits on (stream-ordered reuse).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{CUdeviceptr, CUevent_flags};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, result};

use super::error::{CudaError, DriverResult};
use super::pinned::PinnedPool;
use crate::Rank;

/// Free-list granularity: allocations are rounded up to this many bytes.
const GRANULE: usize = 512;

/// Free CUDA events of one device (creating one costs a driver call).
type EventPool = Arc<Mutex<Vec<CudaEvent>>>;

/// A CUDA event that goes back to its device's pool when dropped.
#[derive(Debug)]
pub(crate) struct PooledEvent {
    ev: Option<CudaEvent>,
    pool: EventPool,
    /// Seen complete once: later checks need no driver call.
    done: std::sync::atomic::AtomicBool,
}

impl std::ops::Deref for PooledEvent {
    type Target = CudaEvent;
    fn deref(&self) -> &CudaEvent {
        // Always Some until drop.
        self.ev
            .as_ref()
            .unwrap_or_else(|| unreachable!("event taken before drop"))
    }
}

impl Drop for PooledEvent {
    fn drop(&mut self) {
        if let Some(ev) = self.ev.take() {
            let mut p = self.pool.lock().unwrap_or_else(|p| p.into_inner());
            if p.len() < 1024 {
                p.push(ev);
            }
        }
    }
}

/// A point in a CUDA stream; complete once the stream's work before it ran.
#[derive(Debug, Clone)]
pub struct GpuEvent(pub(crate) Arc<PooledEvent>);

impl GpuEvent {
    /// Whether the work before the event has completed (remembered once
    /// seen, so repeated checks of a completed event cost nothing).
    pub fn is_complete(&self) -> bool {
        use std::sync::atomic::Ordering;
        if self.0.done.load(Ordering::Acquire) {
            return true;
        }
        let c = self.0.is_complete();
        if c {
            self.0.done.store(true, Ordering::Release);
        }
        c
    }

    /// Whether the work has completed, as a `Result` (a failed query is a
    /// CUDA error, not "pending").
    pub fn try_is_complete(&self, rank: Rank) -> Result<bool, CudaError> {
        use std::sync::atomic::Ordering;
        if self.0.done.load(Ordering::Acquire) {
            return Ok(true);
        }
        let c = self.0.try_is_complete().on(rank, "cuEventQuery")?;
        if c {
            self.0.done.store(true, Ordering::Release);
        }
        Ok(c)
    }

    /// Blocks the calling thread until the event completes.
    pub fn synchronize(&self, rank: Rank) -> Result<(), CudaError> {
        self.0.synchronize().on(rank, "cuEventSynchronize")
    }

    /// The cudarc event.
    pub fn cuda(&self) -> &CudaEvent {
        &self.0
    }
}

struct Pooled {
    ptr: CUdeviceptr,
    uses: Vec<GpuEvent>,
}

#[derive(Default)]
struct FreeList {
    by_size: HashMap<usize, Vec<Pooled>>,
    bytes: usize,
}

/// One CUDA device used by one rank.
pub struct Gpu {
    rank: Rank,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    free: Mutex<FreeList>,
    events: EventPool,
    /// Most bytes kept in the free list; beyond it frees go to the driver.
    keep_bytes: usize,
    pinned: Arc<PinnedPool>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("rank", &self.rank)
            .field("ordinal", &self.ctx.ordinal())
            .finish()
    }
}

impl Gpu {
    /// The number of CUDA devices; 0 when there is no driver or no GPU
    /// (never fails, so tests can skip).
    pub fn count() -> usize {
        // SAFETY: only probes whether the driver library can be loaded.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return 0;
        }
        CudaContext::device_count()
            .map(|n| n.max(0) as usize)
            .unwrap_or(0)
    }

    /// Opens device `ordinal` for `rank`.
    pub fn open(rank: Rank, ordinal: usize) -> Result<Arc<Gpu>, CudaError> {
        let n = Self::count();
        if ordinal >= n {
            return Err(CudaError::NoDevice {
                rank,
                detail: format!("device {ordinal} asked for, {n} present"),
            });
        }
        let ctx = CudaContext::new(ordinal).on(rank, "cuDevicePrimaryCtxRetain")?;
        let stream = ctx.new_stream().on(rank, "cuStreamCreate")?;
        let total = ctx.total_mem().on(rank, "cuDeviceTotalMem")?;
        Ok(Arc::new(Gpu {
            rank,
            stream,
            free: Mutex::new(FreeList::default()),
            events: Arc::new(Mutex::new(Vec::new())),
            keep_bytes: total / 4,
            pinned: PinnedPool::for_device(&ctx),
            ctx,
        }))
    }

    /// The device for `rank`: `BRAID_GPU` if set, else the node-local rank
    /// (`OMPI_COMM_WORLD_LOCAL_RANK`, `SLURM_LOCALID`, `LOCAL_RANK`) or the
    /// rank itself, modulo the number of devices.
    pub fn for_rank(rank: Rank) -> Result<Arc<Gpu>, CudaError> {
        let n = Self::count();
        if n == 0 {
            return Err(CudaError::NoDevice {
                rank,
                detail: "no CUDA driver or no GPU on this host".into(),
            });
        }
        let var = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<usize>().ok());
        let ordinal = match var("BRAID_GPU") {
            Some(o) => o,
            None => {
                let local = var("OMPI_COMM_WORLD_LOCAL_RANK")
                    .or_else(|| var("SLURM_LOCALID"))
                    .or_else(|| var("LOCAL_RANK"))
                    .unwrap_or(rank as usize);
                local % n
            }
        };
        Self::open(rank, ordinal)
    }

    /// The rank that opened this device.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The device's UUID: the same for every rank that uses this physical
    /// GPU, whatever its ordinal there (`CUDA_VISIBLE_DEVICES` renumbers).
    pub fn uuid(&self) -> Result<[u8; 16], CudaError> {
        let u = self.ctx.uuid().on(self.rank, "cuDeviceGetUuid")?;
        Ok(u.bytes.map(|c| c as u8))
    }

    /// The cudarc context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Page-locked host blocks for copies to and from this device (the
    /// process's pool for the device, shared with other ranks on it).
    pub fn pinned(&self) -> &Arc<PinnedPool> {
        &self.pinned
    }

    /// The compute stream: where buffer copies and kernels go by default.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// A new non-blocking stream on this device.
    pub fn new_stream(&self) -> Result<Arc<CudaStream>, CudaError> {
        self.ctx.new_stream().on(self.rank, "cuStreamCreate")
    }

    /// Makes this device's context current on the calling thread.
    pub fn bind(&self) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().on(self.rank, "cuCtxSetCurrent")
    }

    /// Records an event on `stream` (timing disabled: cheaper; events are
    /// pooled).
    pub fn record(&self, stream: &CudaStream) -> Result<GpuEvent, CudaError> {
        let pooled = self.events.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let ev = match pooled {
            Some(ev) => ev,
            None => self
                .ctx
                .new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
                .on(self.rank, "cuEventCreate")?,
        };
        ev.record(stream).on(self.rank, "cuEventRecord")?;
        Ok(GpuEvent(Arc::new(PooledEvent {
            ev: Some(ev),
            pool: self.events.clone(),
            done: std::sync::atomic::AtomicBool::new(false),
        })))
    }

    /// Takes `len` bytes (rounded up to the granule) from the free list or
    /// the driver; returns the pointer, the rounded size and the event the
    /// first user must wait on.
    pub(crate) fn take(
        &self,
        len: usize,
    ) -> Result<(CUdeviceptr, usize, Vec<GpuEvent>), CudaError> {
        let size = len
            .max(1)
            .div_ceil(GRANULE)
            .checked_mul(GRANULE)
            .ok_or_else(|| CudaError::Invalid {
                rank: self.rank,
                detail: format!("a device buffer of {len} bytes"),
            })?;
        {
            let mut fl = self.free.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(p) = fl.by_size.get_mut(&size).and_then(|v| v.pop()) {
                fl.bytes -= size;
                return Ok((p.ptr, size, p.uses));
            }
        }
        self.bind()?;
        // SAFETY: a plain allocation in the bound context.
        match unsafe { result::malloc_sync(size) } {
            Ok(ptr) => Ok((ptr, size, Vec::new())),
            Err(_) => {
                // Out of memory: give the free list back and try once more.
                self.trim();
                // SAFETY: as above.
                let ptr = unsafe { result::malloc_sync(size) }
                    .on(self.rank, "cuMemAlloc")
                    .map_err(|e| {
                        e.with_context(|| {
                            let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
                            match result::mem_get_info() {
                                Ok((free, total)) => format!(
                                    "{:.2} GiB asked; {:.2} GiB of the device's {:.2} GiB free",
                                    gib(size),
                                    gib(free),
                                    gib(total)
                                ),
                                Err(_) => format!("{:.2} GiB asked", gib(size)),
                            }
                        })
                    })?;
                Ok((ptr, size, Vec::new()))
            }
        }
    }

    /// Returns an allocation to the free list (or the driver when the list
    /// is full).
    pub(crate) fn give(&self, ptr: CUdeviceptr, size: usize, uses: Vec<GpuEvent>) {
        {
            let mut fl = self.free.lock().unwrap_or_else(|p| p.into_inner());
            if fl.bytes + size <= self.keep_bytes {
                fl.bytes += size;
                fl.by_size
                    .entry(size)
                    .or_default()
                    .push(Pooled { ptr, uses });
                return;
            }
        }
        self.free_now(ptr, uses);
    }

    fn free_now(&self, ptr: CUdeviceptr, uses: Vec<GpuEvent>) {
        for ev in uses {
            let _ = ev.0.synchronize();
        }
        if self.bind().is_ok() {
            // SAFETY: `ptr` came from cuMemAlloc in this context and its last
            // use has completed. A failure here only leaks.
            let _ = unsafe { result::free_sync(ptr) };
        }
    }

    /// Frees every allocation in the free list.
    pub fn trim(&self) {
        let all: Vec<Pooled> = {
            let mut fl = self.free.lock().unwrap_or_else(|p| p.into_inner());
            fl.bytes = 0;
            fl.by_size.drain().flat_map(|(_, v)| v).collect()
        };
        for p in all {
            self.free_now(p.ptr, p.uses);
        }
    }

    /// Bytes held in the free list.
    pub fn pooled_bytes(&self) -> usize {
        self.free.lock().unwrap_or_else(|p| p.into_inner()).bytes
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        self.trim();
    }
}
