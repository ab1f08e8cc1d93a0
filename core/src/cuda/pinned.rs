//! Page-locked ("pinned") host memory, pooled per device and process.
//!
//! A copy between the device and pageable host memory goes through the
//! driver's own staging buffers: on the H100 host of 2026-11-27 the GPU
//! job's downloads into fresh pageable memory ran at about 3 GB/s. A copy
//! into page-locked memory is one DMA at the link's speed, and it runs
//! asynchronously, so several columns' copies overlap. Page-locking is
//! slow and takes memory from the OS for good, so blocks are kept and
//! reused, and a pool holds at most [`PinnedPool::cap`] bytes: a request
//! beyond that gets `None`, and the caller uses pageable memory instead.
//!
//! A [`PinnedBlock`] can back an Arrow [`Buffer`](arrow_buffer::Buffer)
//! directly (`Buffer::from_custom_allocation`): downloaded columns are
//! then used where they landed, and the block goes back to the pool when
//! the last array that refers to it is dropped.
//!
//! Sizes are rounded up to a power of two from [`MIN_BLOCK`], so blocks of
//! a class are interchangeable. There is one pool per device in a process
//! ([`PinnedPool::for_device`]), shared by the ranks on that device and
//! kept for the process's life: page-locking costs milliseconds a
//! megabyte, so jobs that follow one another reuse the blocks, and ranks
//! sharing a GPU share its cap.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, result};

use super::error::CudaError;
use crate::Rank;

/// The smallest block: smaller requests share this size.
pub const MIN_BLOCK: usize = 1 << 20;

/// The variable that sets a pool's cap in bytes (default
/// [`DEFAULT_CAP`]; 0 turns pinned memory off).
pub const CAP_VAR: &str = "BRAID_PINNED_BYTES";

/// Default cap of a pool: 512 MiB, a few slabs of a download in flight.
pub const DEFAULT_CAP: usize = 512 << 20;

/// A free block's address.
struct Free(NonNull<u8>);

// SAFETY: a free block is page-locked host memory that nothing refers to;
// whoever takes it off the free list owns it.
unsafe impl Send for Free {}

/// Free blocks by size, and the bytes allocated (free or in use).
#[derive(Default)]
struct Blocks {
    free: HashMap<usize, Vec<Free>>,
    free_bytes: usize,
    held: usize,
}

/// One device's page-locked host blocks.
pub struct PinnedPool {
    ctx: Arc<CudaContext>,
    blocks: Mutex<Blocks>,
    cap: usize,
}

impl std::fmt::Debug for PinnedPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedPool")
            .field("ordinal", &self.ctx.ordinal())
            .field("cap", &self.cap)
            .finish()
    }
}

impl PinnedPool {
    /// The process's pool for the device of `ctx` (made on first use, then
    /// shared; nothing is allocated until asked for), capped by [`CAP_VAR`]
    /// or [`DEFAULT_CAP`].
    pub(crate) fn for_device(ctx: &Arc<CudaContext>) -> Arc<PinnedPool> {
        static POOLS: Mutex<Vec<Arc<PinnedPool>>> = Mutex::new(Vec::new());
        let mut pools = POOLS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = pools.iter().find(|p| p.ctx.ordinal() == ctx.ordinal()) {
            return p.clone();
        }
        let cap = match std::env::var(CAP_VAR) {
            Err(_) => DEFAULT_CAP,
            Ok(v) => v.trim().parse::<usize>().unwrap_or_else(|_| {
                tracing::warn!(
                    "{CAP_VAR}={v:?} ignored: expected a number of bytes; \
                     the pinned pool keeps its default cap of {DEFAULT_CAP} bytes"
                );
                DEFAULT_CAP
            }),
        };
        let pool = Arc::new(PinnedPool {
            ctx: ctx.clone(),
            blocks: Mutex::new(Blocks::default()),
            cap,
        });
        pools.push(pool.clone());
        pool
    }

    /// Most bytes the pool allocates.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Bytes allocated now, free or in use.
    pub fn held_bytes(&self) -> usize {
        self.lock().held
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Blocks> {
        self.blocks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A block of at least `len` bytes: a free one of its size; else, when
    /// the pool is at its cap, the smallest larger free one; else a new one
    /// (free blocks of other sizes are released to make room, since
    /// page-locking is slow, only then). `None` when a new one would take
    /// the pool past its cap, or the driver cannot lock more memory.
    /// `rank` is the asking rank, named in errors.
    pub fn take(
        self: &Arc<Self>,
        rank: Rank,
        len: usize,
    ) -> Result<Option<PinnedBlock>, CudaError> {
        let size = match len.max(MIN_BLOCK).checked_next_power_of_two() {
            Some(s) if s <= self.cap => s,
            _ => return Ok(None),
        };
        let release = {
            let mut b = self.lock();
            if let Some(p) = b.free.get_mut(&size).and_then(Vec::pop) {
                b.free_bytes -= size;
                return Ok(Some(self.block(p.0, size)));
            }
            if b.held + size > self.cap {
                let larger = b
                    .free
                    .iter()
                    .filter(|(s, v)| **s > size && !v.is_empty())
                    .map(|(s, _)| *s)
                    .min();
                if let Some(p) = larger.and_then(|s| Some((s, b.free.get_mut(&s)?.pop()?))) {
                    b.free_bytes -= p.0;
                    return Ok(Some(self.block((p.1).0, p.0)));
                }
            }
            if b.held - b.free_bytes + size > self.cap {
                return Ok(None);
            }
            // Room from free blocks of other sizes, largest first.
            let mut release = Vec::new();
            let mut sizes: Vec<usize> = b.free.keys().copied().collect();
            sizes.sort_unstable_by(|a, b| b.cmp(a));
            for s in sizes {
                while b.held + size > self.cap {
                    match b.free.get_mut(&s).and_then(Vec::pop) {
                        Some(p) => {
                            b.free_bytes -= s;
                            b.held -= s;
                            release.push(p);
                        }
                        None => break,
                    }
                }
            }
            // Counted now, so concurrent takes cannot overshoot the cap.
            b.held += size;
            release
        };
        self.free_blocks(release);
        if let Err(e) = self.ctx.bind_to_thread() {
            self.lock().held -= size;
            return Err(CudaError::driver(rank, "cuCtxSetCurrent", e));
        }
        // Portable: pinned for every context of the process, not only the
        // one current here (ranks on other devices read these blocks too,
        // as the sources of host-staged and host-side transfers).
        // SAFETY: a plain page-locked allocation.
        let made =
            unsafe { result::malloc_host(size, cudarc::driver::sys::CU_MEMHOSTALLOC_PORTABLE) }
                .ok()
                .and_then(|p| NonNull::new(p.cast::<u8>()));
        match made {
            Some(p) => Ok(Some(self.block(p, size))),
            // The OS would not lock more memory: pageable memory will do.
            None => {
                self.lock().held -= size;
                Ok(None)
            }
        }
    }

    fn block(self: &Arc<Self>, ptr: NonNull<u8>, size: usize) -> PinnedBlock {
        PinnedBlock {
            pool: self.clone(),
            ptr,
            size,
        }
    }

    fn give(&self, ptr: NonNull<u8>, size: usize) {
        let mut b = self.lock();
        b.free_bytes += size;
        b.free.entry(size).or_default().push(Free(ptr));
    }

    fn free_blocks(&self, ptrs: Vec<Free>) {
        if ptrs.is_empty() || self.ctx.bind_to_thread().is_err() {
            return;
        }
        for Free(p) in ptrs {
            // SAFETY: `p` came from cuMemHostAlloc in this context and is in
            // no block (it was taken off the free list). A failure leaks.
            let _ = unsafe { result::free_host(p.as_ptr().cast()) };
        }
    }
}

impl Drop for PinnedPool {
    fn drop(&mut self) {
        // Every block holds the pool, so none is in use here.
        let all: Vec<Free> = self.lock().free.drain().flat_map(|(_, v)| v).collect();
        self.free_blocks(all);
    }
}

/// A page-locked host block of a pool; back to the pool on drop.
pub struct PinnedBlock {
    pool: Arc<PinnedPool>,
    ptr: NonNull<u8>,
    size: usize,
}

// SAFETY: the block owns its memory exclusively; shared access is only
// through `&self` (reads of the address), writes need `&mut self`.
unsafe impl Send for PinnedBlock {}
// SAFETY: as above.
unsafe impl Sync for PinnedBlock {}

impl std::fmt::Debug for PinnedBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedBlock")
            .field("size", &self.size)
            .finish()
    }
}

impl PinnedBlock {
    /// The block's bytes (at least the length asked for).
    pub fn size(&self) -> usize {
        self.size
    }

    /// The start of the block: page-aligned, so aligned for any value.
    pub fn as_ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// The block's bytes, to fill on the host.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the block owns `size` bytes of host memory (initialised:
        // cuMemHostAlloc's pages come zeroed from the OS, and reused ones
        // hold old bytes), and `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.size) }
    }
}

impl Drop for PinnedBlock {
    fn drop(&mut self) {
        self.pool.give(self.ptr, self.size);
    }
}
