//! `DeviceBuffer`: bytes in device memory, and `Resident`: a chunk that is
//! on the device or spilled to host.
//!
//! Stream ordering: a buffer carries the event of its latest write
//! (`ready`). Work that reads or writes it first makes its stream wait on
//! that event, and afterwards records its own event with
//! [`DeviceBuffer::set_ready`] (a write) or [`DeviceBuffer::note_use`] (a
//! read). The allocation remembers its last use, so when it is freed and
//! reused its next user waits for that too.

use std::sync::{Arc, Mutex};

use cudarc::driver::CudaStream;
use cudarc::driver::result;
use cudarc::driver::sys::CUdeviceptr;

use super::device::{Gpu, GpuEvent};
use super::error::{CudaError, DriverResult};
use crate::memory::{Buffer, MemoryType, Reservation};

/// The byte new allocations are filled with when `BRAID_POISON_DEVICE` is
/// set: tests set it so that an output a kernel or collective leaves
/// unwritten shows up as wrong values, not as stale right ones.
pub const POISON: u8 = 0xA5;

static POISON_ON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Fills every new device allocation with [`POISON`] from now on (tests
/// call it; `BRAID_POISON_DEVICE=1` does the same for a whole process).
pub fn poison_new_allocations(on: bool) {
    POISON_ON.store(on, std::sync::atomic::Ordering::Relaxed);
}

fn poison_enabled() -> bool {
    static ENV: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    POISON_ON.load(std::sync::atomic::Ordering::Relaxed)
        || *ENV.get_or_init(|| std::env::var_os("BRAID_POISON_DEVICE").is_some_and(|v| v != "0"))
}

/// One allocation; back to its `Gpu`'s free list on drop.
struct DeviceMem {
    gpu: Arc<Gpu>,
    ptr: CUdeviceptr,
    size: usize,
    /// Work that may still read or write the allocation (pruned as it
    /// completes); a writer and the next owner wait for all of it.
    uses: Mutex<Vec<GpuEvent>>,
    _charge: Option<Arc<crate::memory::Charge>>,
}

impl Drop for DeviceMem {
    fn drop(&mut self) {
        let uses = std::mem::take(self.uses.get_mut().unwrap_or_else(|p| p.into_inner()));
        self.gpu.give(self.ptr, self.size, uses);
    }
}

/// Bytes in device memory on one `Gpu`, with the event of their latest
/// write. Not `Clone`: an output buffer is written in place, so it has one
/// owner; copy with [`DeviceBuffer::try_clone`].
pub struct DeviceBuffer {
    mem: Arc<DeviceMem>,
    len: usize,
    ready: Option<GpuEvent>,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("gpu", &self.mem.gpu.ordinal())
            .field("len", &self.len)
            .finish()
    }
}

impl DeviceBuffer {
    /// `len` bytes of uninitialised device memory, not charged to any
    /// resource.
    pub fn alloc(gpu: &Arc<Gpu>, len: usize) -> Result<DeviceBuffer, CudaError> {
        Self::alloc_inner(gpu, len, None)
    }

    /// `len` bytes charged to a device reservation.
    pub fn alloc_charged(
        gpu: &Arc<Gpu>,
        reservation: &mut Reservation,
        len: usize,
    ) -> Result<DeviceBuffer, CudaError> {
        if reservation.mem_type() != MemoryType::Device {
            return Err(CudaError::Invalid {
                rank: gpu.rank(),
                detail: format!(
                    "device buffer charged to a {} reservation",
                    reservation.mem_type()
                ),
            });
        }
        let charge = reservation
            .take(len as u64)
            .map_err(|source| CudaError::Memory {
                rank: gpu.rank(),
                source,
            })?;
        Self::alloc_inner(gpu, len, Some(charge))
    }

    fn alloc_inner(
        gpu: &Arc<Gpu>,
        len: usize,
        charge: Option<Arc<crate::memory::Charge>>,
    ) -> Result<DeviceBuffer, CudaError> {
        let (ptr, size, uses) = gpu.take(len)?;
        let mut b = DeviceBuffer {
            mem: Arc::new(DeviceMem {
                gpu: gpu.clone(),
                ptr,
                size,
                // The previous owner's work: waited for before any write.
                uses: Mutex::new(uses),
                _charge: charge,
            }),
            len,
            ready: None,
        };
        if poison_enabled() {
            b.fill(POISON)?;
        }
        Ok(b)
    }

    /// A device copy of host bytes (returns once the copy is done).
    pub fn from_host(gpu: &Arc<Gpu>, bytes: &[u8]) -> Result<DeviceBuffer, CudaError> {
        let mut b = Self::alloc(gpu, bytes.len())?;
        if bytes.is_empty() {
            return Ok(b);
        }
        let rank = gpu.rank();
        let s = gpu.stream();
        gpu.bind()?;
        b.wait_writable(s)?;
        // SAFETY: the destination has `bytes.len()` bytes; the stream is
        // synchronised before `bytes` can go away.
        unsafe { result::memcpy_htod_async(b.ptr(), bytes, s.cu_stream()) }
            .on(rank, "cuMemcpyHtoDAsync")
            .map_err(|e| e.with_context(|| format!("{} bytes to a new buffer", bytes.len())))?;
        s.synchronize().on(rank, "cuStreamSynchronize")?;
        b.ready = None;
        Ok(b)
    }

    /// A device copy of a slice of plain values.
    pub fn from_slice<T: bytemuck::Pod>(
        gpu: &Arc<Gpu>,
        v: &[T],
    ) -> Result<DeviceBuffer, CudaError> {
        Self::from_host(gpu, bytemuck::cast_slice(v))
    }

    /// Copies the bytes to host (waits for the latest write first).
    pub fn to_host(&self) -> Result<Vec<u8>, CudaError> {
        let mut v = vec![0u8; self.len];
        self.copy_to_host(&mut v)?;
        Ok(v)
    }

    /// The bytes as plain values; the length must be a multiple of the
    /// value size.
    pub fn to_vec<T: bytemuck::Pod>(&self) -> Result<Vec<T>, CudaError> {
        let sz = std::mem::size_of::<T>();
        if sz == 0 || self.len % sz != 0 {
            return Err(CudaError::Invalid {
                rank: self.gpu().rank(),
                detail: format!(
                    "{} bytes are not a whole number of {sz}-byte values",
                    self.len
                ),
            });
        }
        let mut v = vec![T::zeroed(); self.len / sz];
        self.copy_to_host(bytemuck::cast_slice_mut(&mut v))?;
        Ok(v)
    }

    fn copy_to_host(&self, dst: &mut [u8]) -> Result<(), CudaError> {
        self.read_at(0, dst)
    }

    /// A device-to-device copy on the `Gpu`'s stream.
    pub fn try_clone(&self) -> Result<DeviceBuffer, CudaError> {
        let gpu = self.gpu().clone();
        let mut out = Self::alloc(&gpu, self.len)?;
        out.copy_from(self, gpu.stream())?;
        Ok(out)
    }

    /// Copies `src` (same length) into this buffer, ordered on `stream`.
    pub fn copy_from(
        &mut self,
        src: &DeviceBuffer,
        stream: &Arc<CudaStream>,
    ) -> Result<(), CudaError> {
        let rank = self.gpu().rank();
        if src.len != self.len {
            return Err(CudaError::Invalid {
                rank,
                detail: format!("copy of {} bytes into a {}-byte buffer", src.len, self.len),
            });
        }
        self.gpu().bind()?;
        self.wait_writable(stream)?;
        src.wait_on(stream)?;
        if self.len > 0 {
            // SAFETY: both ranges are `len` bytes of live allocations.
            unsafe {
                result::memcpy_dtod_async(self.ptr(), src.ptr(), self.len, stream.cu_stream())
            }
            .on(rank, "cuMemcpyDtoDAsync")?;
        }
        let ev = self.gpu().record(stream)?;
        src.note_use(ev.clone());
        self.set_ready(ev);
        Ok(())
    }

    /// Copies `len` bytes of `src` from `src_off` into this buffer at
    /// `dst_off`, on the `Gpu`'s stream (slicing, concatenating and packing
    /// columns). Both ranges are checked.
    pub fn copy_region(
        &mut self,
        dst_off: usize,
        src: &DeviceBuffer,
        src_off: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        let gpu = self.gpu().clone();
        let rank = gpu.rank();
        let fits = |off: usize, total: usize| off.checked_add(len).is_some_and(|e| e <= total);
        if !fits(dst_off, self.len) || !fits(src_off, src.len) {
            return Err(CudaError::Invalid {
                rank,
                detail: format!(
                    "copy of {len} bytes from offset {src_off} of a {}-byte buffer to offset \
                     {dst_off} of a {}-byte buffer",
                    src.len, self.len
                ),
            });
        }
        if len == 0 {
            return Ok(());
        }
        let s = gpu.stream();
        gpu.bind()?;
        self.wait_writable(s)?;
        src.wait_on(s)?;
        // SAFETY: both ranges lie inside live allocations (checked above).
        unsafe {
            result::memcpy_dtod_async(
                self.ptr() + dst_off as u64,
                src.ptr() + src_off as u64,
                len,
                s.cu_stream(),
            )
        }
        .on(rank, "cuMemcpyDtoDAsync")?;
        let ev = gpu.record(s)?;
        src.note_use(ev.clone());
        self.set_ready(ev);
        Ok(())
    }

    /// Reads `dst.len()` bytes from `offset` to the host (waits for them).
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<(), CudaError> {
        self.check_read(offset, dst.len())?;
        // SAFETY: `dst` is `dst.len()` writable bytes that outlive the
        // call (it synchronises before it returns).
        unsafe { self.dma_to_host(offset, dst.as_mut_ptr(), dst.len()) }
    }

    /// Bytes `offset..offset + len` in a fresh host vector of 8-byte words
    /// (aligned for any value type; the last word's bytes past `len` are
    /// zero). The vector is a [`large_vec`](crate::memory::large_vec): not
    /// zero-filled first, and advised to use huge pages when large, so a
    /// download of many megabytes writes each page once, directly.
    pub fn read_words(&self, offset: usize, len: usize) -> Result<Vec<u64>, CudaError> {
        self.check_read(offset, len)?;
        let words = len.div_ceil(8);
        let mut v: Vec<u64> = crate::memory::large_vec(words);
        if let Some(last) = v
            .spare_capacity_mut()
            .get_mut(..words)
            .and_then(|s| s.last_mut())
        {
            last.write(0);
        }
        // SAFETY: the spare capacity holds `words * 8 >= len` bytes, which
        // the copy writes before `dma_to_host` returns.
        if let Err(e) = unsafe { self.dma_to_host(offset, v.as_mut_ptr().cast::<u8>(), len) } {
            // A copy that failed to finish may still be writing: never
            // hand its memory back.
            std::mem::forget(v);
            return Err(e);
        }
        // SAFETY: the copy wrote bytes 0..len and the last word was zeroed
        // first, so all `words` words are initialised.
        unsafe { v.set_len(words) };
        Ok(v)
    }

    fn check_read(&self, offset: usize, len: usize) -> Result<(), CudaError> {
        if offset.checked_add(len).is_none_or(|e| e > self.len) {
            return Err(CudaError::Invalid {
                rank: self.gpu().rank(),
                detail: format!(
                    "read of {len} bytes at offset {offset} of a {}-byte buffer",
                    self.len
                ),
            });
        }
        Ok(())
    }

    /// Copies `len` bytes from `offset` (checked by the caller) to `dst`
    /// after the buffer's latest write, and waits for the copy.
    ///
    /// # Safety
    /// `dst` must be valid for `len` bytes of writes until this returns.
    unsafe fn dma_to_host(&self, offset: usize, dst: *mut u8, len: usize) -> Result<(), CudaError> {
        if len == 0 {
            return Ok(());
        }
        // SAFETY: as this function's contract, up to the synchronise below.
        unsafe { self.enqueue_read(offset, dst, len) }?;
        let gpu = self.gpu();
        gpu.stream()
            .synchronize()
            .on(gpu.rank(), "cuStreamSynchronize")
    }

    /// Enqueues a copy of bytes `offset..offset + len` to `dst` on the
    /// `Gpu`'s stream, after the buffer's latest write, and returns
    /// without waiting (asynchronous where `dst` is page-locked).
    ///
    /// # Safety
    /// `dst` must be valid for `len` bytes of writes, and nothing may read
    /// or free it, until the `Gpu`'s stream has been synchronised.
    pub(crate) unsafe fn enqueue_read(
        &self,
        offset: usize,
        dst: *mut u8,
        len: usize,
    ) -> Result<(), CudaError> {
        self.check_read(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let gpu = self.gpu();
        let s = gpu.stream();
        gpu.bind()?;
        self.wait_on(s)?;
        // SAFETY: the range lies inside the allocation (checked above) and
        // the caller keeps `dst` for the copy.
        unsafe {
            cudarc::driver::sys::cuMemcpyDtoHAsync_v2(
                dst.cast(),
                self.ptr() + offset as u64,
                len,
                s.cu_stream(),
            )
        }
        .on(gpu.rank(), "cuMemcpyDtoHAsync")
    }

    /// Fills every byte with `value`, ordered on the `Gpu`'s stream (for
    /// poisoning outputs in tests).
    pub fn fill(&mut self, value: u8) -> Result<(), CudaError> {
        let gpu = self.gpu().clone();
        let s = gpu.stream();
        gpu.bind()?;
        self.wait_writable(s)?;
        if self.len > 0 {
            // SAFETY: `len` bytes of a live allocation.
            unsafe { result::memset_d8_async(self.ptr(), value, self.len, s.cu_stream()) }
                .on(gpu.rank(), "cuMemsetD8Async")?;
        }
        let ev = gpu.record(s)?;
        self.set_ready(ev);
        Ok(())
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device the memory is on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.mem.gpu
    }

    /// The raw device pointer (valid while the buffer lives).
    pub fn ptr(&self) -> CUdeviceptr {
        self.mem.ptr
    }

    /// The allocation's base pointer and size (for CUDA IPC export).
    pub fn allocation(&self) -> (CUdeviceptr, usize) {
        (self.mem.ptr, self.mem.size)
    }

    /// The event of the latest write, if it may still be pending.
    pub fn ready(&self) -> Option<&GpuEvent> {
        self.ready.as_ref()
    }

    /// Makes `stream` wait for the latest write (enough to read).
    pub fn wait_on(&self, stream: &CudaStream) -> Result<(), CudaError> {
        if let Some(ev) = &self.ready {
            if !ev.is_complete() {
                stream
                    .wait(ev.cuda())
                    .on(self.gpu().rank(), "cuStreamWaitEvent")?;
            }
        }
        Ok(())
    }

    /// Makes `stream` wait for every outstanding read and write (needed
    /// before writing: a read on another stream may still be running).
    pub fn wait_writable(&self, stream: &CudaStream) -> Result<(), CudaError> {
        for ev in self.write_waits() {
            stream
                .wait(ev.cuda())
                .on(self.gpu().rank(), "cuStreamWaitEvent")?;
        }
        Ok(())
    }

    /// The events a writer must wait for: the latest write and every use
    /// that may still be running.
    pub fn write_waits(&self) -> Vec<GpuEvent> {
        let mut v: Vec<GpuEvent> = self
            .ready
            .iter()
            .filter(|e| !e.is_complete())
            .cloned()
            .collect();
        let uses = self.mem.uses.lock().unwrap_or_else(|p| p.into_inner());
        v.extend(uses.iter().filter(|e| !e.is_complete()).cloned());
        v
    }

    /// Records a write: `ev` is the new latest write (and last use).
    pub fn set_ready(&mut self, ev: GpuEvent) {
        self.note_use(ev.clone());
        self.ready = Some(ev);
    }

    /// Marks the buffer written and complete (the caller synchronised).
    pub fn mark_complete(&mut self) {
        self.ready = None;
    }

    /// A handle that keeps the allocation alive (for work still in flight
    /// after the buffer itself may be dropped).
    pub fn keep_alive(&self) -> super::nccl::KeepAlive {
        Box::new(self.mem.clone())
    }

    /// Records a read: the allocation is not reused before `ev`.
    pub fn note_use(&self, ev: GpuEvent) {
        let mut uses = self.mem.uses.lock().unwrap_or_else(|p| p.into_inner());
        uses.retain(|e| !e.is_complete());
        uses.push(ev);
    }

    /// Copies the bytes into a host buffer charged to `reservation` (a host
    /// reservation), for spilling.
    pub fn spill(&self, reservation: &mut Reservation) -> Result<Buffer, CudaError> {
        let rank = self.gpu().rank();
        let v = self.to_host()?;
        reservation
            .adopt(bytes::Bytes::from(v))
            .map_err(|source| CudaError::Memory { rank, source })
    }
}

/// A chunk of bytes that lives on the device or was spilled to host.
#[derive(Debug)]
pub enum Resident {
    /// In device memory.
    Device(DeviceBuffer),
    /// Spilled to (or produced on) the host.
    Host(Buffer),
}

impl Resident {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Resident::Device(d) => d.len(),
            Resident::Host(h) => h.len(),
        }
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the bytes are now.
    pub fn mem_type(&self) -> MemoryType {
        match self {
            Resident::Device(_) => MemoryType::Device,
            Resident::Host(_) => MemoryType::Host,
        }
    }

    /// Moves the bytes to host memory charged to `reservation`; returns how
    /// many device bytes were freed.
    pub fn spill(&mut self, reservation: &mut Reservation) -> Result<usize, CudaError> {
        if let Resident::Device(d) = self {
            let n = d.len();
            let h = d.spill(reservation)?;
            *self = Resident::Host(h);
            return Ok(n);
        }
        Ok(0)
    }

    /// The bytes on the device (copied back if spilled).
    pub fn into_device(self, gpu: &Arc<Gpu>) -> Result<DeviceBuffer, CudaError> {
        match self {
            Resident::Device(d) => Ok(d),
            Resident::Host(h) => DeviceBuffer::from_host(gpu, h.as_slice()),
        }
    }
}
