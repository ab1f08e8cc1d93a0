//! CUDA IPC between ranks of one host, and a copy-engine SendRecv over it.
//!
//! Export: `cuIpcGetMemHandle` of a buffer's allocation (plain
//! `cuMemAlloc`, see [`super::Gpu`]) plus the offset into it. Import:
//! `cuIpcOpenMemHandle` with lazy peer access, cached per (peer, handle) and
//! closed when the cache goes. Ranks that are threads of one process cannot
//! open their own process's handles; they use the pointer itself (the
//! address space is shared) after enabling peer access between the devices.
//!
//! [`IpcPeers::exchange`] moves many handles in one batch: every rank sends
//! its list to every other rank over the host communicator, opens what it
//! got, then all ranks pass a barrier, after which every imported pointer
//! is usable.
//!
//! [`IpcSendRecv`]: one step of point-to-point copies through the copy
//! engine, synchronised by semaphores in device memory. Each rank owns an
//! array of `u32` semaphores, `ready[src]` and `free[dst]`, exported to
//! every peer once. For the g-th transfer from S to R:
//!
//! ```text
//!  R (receiver)                              S (sender)
//!  host: Desc{handle of out, len, g} ──────▶ host: take Desc, import, check len
//!  stream: wait out's last write             stream: wait in's last write
//!          write  S.free[R] = g  ──────────▶         wait   free[R] >= g
//!                                                    copy   in ──▶ R's out (CE)
//!          wait   ready[S] >= g  ◀──────────         write  R.ready[S] = g
//!  event E: out is ready                     event E: in may be reused
//! ```
//!
//! Only the 64-byte descriptor crosses the host; the data and both signals
//! stay on the GPUs and are ordered by their streams, so no host thread
//! waits in between. Cost: one host message plus the copy at copy-engine
//! bandwidth.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::CudaStream;
use cudarc::driver::sys::{self, CUdeviceptr};

use super::buffer::DeviceBuffer;
use super::device::{Gpu, GpuEvent};
use super::error::{CudaError, DriverResult};
use crate::comm::Communicator;
use crate::context::Context;
use crate::tag::{OpId, Tag};
use crate::{Buffer, Rank};

/// Length of a serialised [`IpcDesc`].
const DESC_LEN: usize = 64 + 8 * 4 + 4;

/// An exported device range: what a peer needs to map it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpcDesc {
    /// The allocation's IPC handle.
    pub handle: [u8; 64],
    /// The exporting process.
    pub pid: u32,
    /// The allocation's base pointer in the exporter (same-process use).
    pub base: u64,
    /// Offset of the range in the allocation.
    pub offset: u64,
    /// Length of the range in bytes.
    pub len: u64,
    /// A sequence number the protocol uses (the generation).
    pub seq: u64,
}

impl IpcDesc {
    /// Exports `buf` (its allocation and the whole range).
    pub fn export(buf: &DeviceBuffer, seq: u64) -> Result<IpcDesc, CudaError> {
        let gpu = buf.gpu();
        gpu.bind()?;
        let (base, _) = buf.allocation();
        let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: `base` is the start of a cuMemAlloc allocation.
        unsafe { sys::cuIpcGetMemHandle(&mut h, base) }.on(gpu.rank(), "cuIpcGetMemHandle")?;
        let mut handle = [0u8; 64];
        for (d, s) in handle.iter_mut().zip(h.reserved.iter()) {
            *d = *s as u8;
        }
        Ok(IpcDesc {
            handle,
            pid: std::process::id(),
            base,
            offset: buf.ptr() - base,
            len: buf.len() as u64,
            seq,
        })
    }

    fn to_bytes(self) -> Vec<u8> {
        let mut v = Vec::with_capacity(DESC_LEN);
        v.extend_from_slice(&self.handle);
        v.extend_from_slice(&self.pid.to_le_bytes());
        for w in [self.base, self.offset, self.len, self.seq] {
            v.extend_from_slice(&w.to_le_bytes());
        }
        v
    }

    fn from_bytes(b: &[u8]) -> Option<IpcDesc> {
        if b.len() != DESC_LEN {
            return None;
        }
        let mut handle = [0u8; 64];
        handle.copy_from_slice(&b[..64]);
        let pid = u32::from_le_bytes(b[64..68].try_into().ok()?);
        let w = |i: usize| -> Option<u64> {
            Some(u64::from_le_bytes(
                b[68 + i * 8..76 + i * 8].try_into().ok()?,
            ))
        };
        Some(IpcDesc {
            handle,
            pid,
            base: w(0)?,
            offset: w(1)?,
            len: w(2)?,
            seq: w(3)?,
        })
    }
}

/// A peer's allocation mapped into this process; unmapped on drop.
struct Mapped {
    ptr: CUdeviceptr,
    opened: bool,
    gpu: Arc<Gpu>,
}

impl Drop for Mapped {
    fn drop(&mut self) {
        if self.opened && self.gpu.bind().is_ok() {
            // SAFETY: `ptr` came from cuIpcOpenMemHandle; nothing uses it
            // after the cache that owns it is gone.
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
        }
    }
}

fn bad_offset(rank: Rank, peer: Rank) -> CudaError {
    CudaError::Invalid {
        rank,
        detail: format!("IPC descriptor from rank {peer} has an offset past the address space"),
    }
}

/// Imported peer allocations, keyed by (peer, handle).
pub struct IpcCache {
    gpu: Arc<Gpu>,
    map: HashMap<(Rank, [u8; 64]), Arc<Mapped>>,
    peer_ctx: HashMap<usize, bool>,
}

impl IpcCache {
    /// An empty cache for ranks using `gpu`.
    pub fn new(gpu: Arc<Gpu>) -> Self {
        IpcCache {
            gpu,
            map: HashMap::new(),
            peer_ctx: HashMap::new(),
        }
    }

    /// Number of mapped allocations.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether nothing is mapped.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The device pointer, in this process, of `desc`'s range (mapping the
    /// allocation on first use).
    pub fn import(&mut self, peer: Rank, desc: &IpcDesc) -> Result<CUdeviceptr, CudaError> {
        let rank = self.gpu.rank();
        if let Some(m) = self.map.get(&(peer, desc.handle)) {
            return m
                .ptr
                .checked_add(desc.offset)
                .ok_or_else(|| bad_offset(rank, peer));
        }
        self.gpu.bind()?;
        let m = if desc.pid == std::process::id() {
            // Same process: the pointer is valid here; the peer's device
            // must be reachable from ours.
            self.enable_peer_access(desc.base)?;
            Mapped {
                ptr: desc.base,
                opened: false,
                gpu: self.gpu.clone(),
            }
        } else {
            let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
            for (d, s) in h.reserved.iter_mut().zip(desc.handle.iter()) {
                *d = *s as std::ffi::c_char;
            }
            let mut ptr: CUdeviceptr = 0;
            // SAFETY: `h` is a handle a peer exported; NCCL and CUDA
            // validate it and fail cleanly when it is not.
            unsafe {
                sys::cuIpcOpenMemHandle_v2(
                    &mut ptr,
                    h,
                    sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
                )
            }
            .on(rank, "cuIpcOpenMemHandle")?;
            Mapped {
                ptr,
                opened: true,
                gpu: self.gpu.clone(),
            }
        };
        let ptr = m
            .ptr
            .checked_add(desc.offset)
            .ok_or_else(|| bad_offset(rank, peer))?;
        self.map.insert((peer, desc.handle), Arc::new(m));
        Ok(ptr)
    }

    /// Enables access from our context to the device that owns `ptr`
    /// (threads of one process).
    fn enable_peer_access(&mut self, ptr: CUdeviceptr) -> Result<(), CudaError> {
        let rank = self.gpu.rank();
        let mut ordinal: i32 = -1;
        // SAFETY: queries an attribute of a pointer into device memory.
        unsafe {
            sys::cuPointerGetAttribute(
                (&mut ordinal as *mut i32).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                ptr,
            )
        }
        .on(rank, "cuPointerGetAttribute")?;
        let ordinal = ordinal.max(0) as usize;
        if ordinal == self.gpu.ordinal() || self.peer_ctx.contains_key(&ordinal) {
            return Ok(());
        }
        let peer =
            cudarc::driver::CudaContext::new(ordinal).on(rank, "cuDevicePrimaryCtxRetain")?;
        self.gpu.bind()?;
        // SAFETY: both contexts are live primary contexts.
        let r = unsafe { sys::cuCtxEnablePeerAccess(peer.cu_ctx(), 0) };
        if r != sys::CUresult::CUDA_SUCCESS
            && r != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
        {
            r.on(rank, "cuCtxEnablePeerAccess")?;
        }
        self.peer_ctx.insert(ordinal, true);
        Ok(())
    }
}

/// Sends `data` to every other rank and receives one message from each
/// (tag `tag`); returns the messages by source rank (own slot: `own`).
async fn all_exchange(
    comm: &Arc<dyn Communicator>,
    tag: Tag,
    data: Vec<u8>,
) -> Result<Vec<Vec<u8>>, CudaError> {
    let me = comm.rank();
    let n = comm.nranks();
    let mut sends = Vec::new();
    for r in (0..n).filter(|&r| r != me) {
        sends.push(comm.send(r, tag, Buffer::from_vec(data.clone())));
    }
    let mut out = vec![Vec::new(); n as usize];
    for r in (0..n).filter(|&r| r != me) {
        out[r as usize] = comm.recv(r, tag).await?.as_slice().to_vec();
    }
    for s in sends {
        s.await?;
    }
    out[me as usize] = data;
    Ok(out)
}

/// Peers' buffers mapped into this process, from one batched exchange.
pub struct IpcPeers {
    cache: IpcCache,
    /// `remote[peer][i]`: the device pointer of peer's i-th buffer.
    remote: Vec<Vec<(CUdeviceptr, u64)>>,
}

impl IpcPeers {
    /// Collective: every rank exports `buffers`, sends the handles to every
    /// other rank in one message, maps what it receives, then passes a
    /// barrier (so a peer's pointers are mapped everywhere before use).
    pub async fn exchange(
        ctx: &Context,
        gpu: Arc<Gpu>,
        buffers: &[&DeviceBuffer],
    ) -> Result<IpcPeers, CudaError> {
        let comm = ctx.comm().clone();
        let op = ctx.next_op_id();
        let mut msg = Vec::with_capacity(buffers.len() * DESC_LEN);
        for (i, b) in buffers.iter().enumerate() {
            msg.extend_from_slice(&IpcDesc::export(b, i as u64)?.to_bytes());
        }
        let got = all_exchange(&comm, Tag::new(op, 0), msg).await?;
        let mut cache = IpcCache::new(gpu.clone());
        let mut remote = Vec::with_capacity(got.len());
        for (peer, bytes) in got.iter().enumerate() {
            let mut v = Vec::new();
            if peer as Rank != ctx.rank() {
                if bytes.len() % DESC_LEN != 0 {
                    return Err(CudaError::Invalid {
                        rank: ctx.rank(),
                        detail: format!(
                            "IPC handle list from rank {peer} is {} bytes",
                            bytes.len()
                        ),
                    });
                }
                for c in bytes.chunks(DESC_LEN) {
                    let d = IpcDesc::from_bytes(c).ok_or_else(|| CudaError::Invalid {
                        rank: ctx.rank(),
                        detail: format!("malformed IPC handle from rank {peer}"),
                    })?;
                    v.push((cache.import(peer as Rank, &d)?, d.len));
                }
            } else {
                v = buffers.iter().map(|b| (b.ptr(), b.len() as u64)).collect();
            }
            remote.push(v);
        }
        all_exchange(&comm, Tag::new(op, 1), Vec::new()).await?;
        Ok(IpcPeers { cache, remote })
    }

    /// The device pointer and length of `peer`'s `index`-th buffer.
    pub fn remote(&self, peer: Rank, index: usize) -> Option<(CUdeviceptr, u64)> {
        self.remote.get(peer as usize)?.get(index).copied()
    }

    /// The mapping cache.
    pub fn cache(&mut self) -> &mut IpcCache {
        &mut self.cache
    }
}

/// Copy-engine SendRecv over CUDA IPC (see the module doc for the
/// protocol). One object per communicator group; create it on every rank.
pub struct IpcSendRecv {
    comm: Arc<dyn Communicator>,
    gpu: Arc<Gpu>,
    stream: Arc<CudaStream>,
    op: OpId,
    /// Our semaphores: `ready[src]` at index src, `free[dst]` at n + dst.
    sems: DeviceBuffer,
    peers: IpcPeers,
    /// Next generation per destination (sends) and per source (receives).
    send_gen: Vec<u32>,
    recv_gen: Vec<u32>,
}

impl IpcSendRecv {
    /// Collective: allocates and exports the semaphores of every rank.
    pub async fn new(ctx: &Context, gpu: Arc<Gpu>) -> Result<IpcSendRecv, CudaError> {
        let n = ctx.nranks() as usize;
        let mut sems = DeviceBuffer::alloc(&gpu, 2 * n * 4)?;
        sems.fill(0)?;
        gpu.stream()
            .synchronize()
            .on(gpu.rank(), "cuStreamSynchronize")?;
        sems.mark_complete();
        let stream = gpu.new_stream()?;
        let op = ctx.next_op_id();
        let peers = IpcPeers::exchange(ctx, gpu.clone(), &[&sems]).await?;
        Ok(IpcSendRecv {
            comm: ctx.comm().clone(),
            gpu,
            stream,
            op,
            sems,
            peers,
            send_gen: vec![0; n],
            recv_gen: vec![0; n],
        })
    }

    fn sem_local(&self, i: usize) -> CUdeviceptr {
        self.sems.ptr() + (i * 4) as u64
    }

    fn sem_remote(&self, peer: Rank, i: usize) -> Result<CUdeviceptr, CudaError> {
        self.peers
            .remote(peer, 0)
            .map(|(p, _)| p + (i * 4) as u64)
            .ok_or_else(|| CudaError::Invalid {
                rank: self.gpu.rank(),
                detail: format!("no semaphores mapped for rank {peer}"),
            })
    }

    /// Sends `send.0` to rank `send.1` and receives into `recv.0` from rank
    /// `recv.1` (either may be absent; the peers must make the matching
    /// calls). The received buffer's length must equal the sent one's.
    /// Returns the receive buffer once the copy into it has completed.
    pub async fn sendrecv(
        &mut self,
        send: Option<(&DeviceBuffer, Rank)>,
        recv: Option<(DeviceBuffer, Rank)>,
    ) -> Result<Option<DeviceBuffer>, CudaError> {
        let ev = self
            .enqueue(send, recv.as_ref().map(|(b, r)| (b, *r)))
            .await?;
        let rank = self.gpu.rank();
        // Watch the host: a peer that died leaves the semaphore wait on the
        // stream unanswered.
        wait_event(&ev, rank, Some(self.comm.as_ref())).await?;
        Ok(recv.map(|(mut b, _)| {
            b.set_ready(ev.clone());
            b
        }))
    }

    /// Enqueues one step and returns the event recorded after it (the
    /// receive buffer is ready, and the send buffer reusable, once it
    /// completes). Exposed for pipelining; [`IpcSendRecv::sendrecv`] waits.
    pub async fn enqueue(
        &mut self,
        send: Option<(&DeviceBuffer, Rank)>,
        recv: Option<(&DeviceBuffer, Rank)>,
    ) -> Result<GpuEvent, CudaError> {
        let n = self.comm.nranks();
        let me = self.gpu.rank();
        let tag = Tag::new(self.op, 2);
        let check = |r: Rank| -> Result<(), CudaError> {
            if r >= n {
                return Err(CudaError::Invalid {
                    rank: me,
                    detail: format!("peer rank {r} out of range (nranks = {n})"),
                });
            }
            Ok(())
        };
        self.gpu.bind()?;
        // Receive side: tell the sender where to copy, then free the slot.
        if let Some((out, src)) = recv {
            check(src)?;
            self.recv_gen[src as usize] += 1;
            let g = self.recv_gen[src as usize];
            // Exported afresh each step (one cheap driver call): a handle
            // cached by address could outlive its allocation, and a new
            // allocation at the same address has a new handle.
            let desc = IpcDesc::export(out, g as u64)?;
            self.comm
                .send(src, tag, Buffer::from_vec(desc.to_bytes()))
                .await?;
            out.wait_writable(&self.stream)?;
            let free = self.sem_remote(src, n as usize + me as usize)?;
            // SAFETY: `free` is the sender's mapped semaphore word.
            unsafe { sys::cuStreamWriteValue32_v2(self.stream.cu_stream(), free, g, 0) }
                .on(me, "cuStreamWriteValue32")?;
        }
        // Send side: wait for the slot, copy, signal.
        if let Some((input, dst)) = send {
            check(dst)?;
            let msg = self.comm.recv(dst, tag).await?;
            let desc = IpcDesc::from_bytes(msg.as_slice()).ok_or_else(|| CudaError::Invalid {
                rank: me,
                detail: format!("malformed SendRecv descriptor from rank {dst}"),
            })?;
            self.send_gen[dst as usize] += 1;
            let g = self.send_gen[dst as usize];
            if desc.seq != g as u64 || desc.len != input.len() as u64 {
                return Err(CudaError::Invalid {
                    rank: me,
                    detail: format!(
                        "SendRecv to rank {dst}: it receives {} bytes (step {}), this rank sends {} (step {g})",
                        desc.len,
                        desc.seq,
                        input.len()
                    ),
                });
            }
            let remote = self.peers.cache().import(dst, &desc)?;
            input.wait_on(&self.stream)?;
            let free = self.sem_local(n as usize + dst as usize);
            let ready = self.sem_remote(dst, me as usize)?;
            // SAFETY: our own semaphore word; a peer's mapped range of
            // `len` bytes; the peer's mapped semaphore word.
            unsafe {
                sys::cuStreamWaitValue32_v2(self.stream.cu_stream(), free, g, 0)
                    .on(me, "cuStreamWaitValue32")?;
                if !input.is_empty() {
                    sys::cuMemcpyDtoDAsync_v2(
                        remote,
                        input.ptr(),
                        input.len(),
                        self.stream.cu_stream(),
                    )
                    .on(me, "cuMemcpyDtoDAsync")?;
                }
                sys::cuStreamWriteValue32_v2(self.stream.cu_stream(), ready, g, 0)
                    .on(me, "cuStreamWriteValue32")?;
            }
        }
        if let Some((_, src)) = recv {
            let g = self.recv_gen[src as usize];
            let ready = self.sem_local(src as usize);
            // SAFETY: our own semaphore word.
            unsafe { sys::cuStreamWaitValue32_v2(self.stream.cu_stream(), ready, g, 0) }
                .on(me, "cuStreamWaitValue32")?;
        }
        let ev = self.gpu.record(&self.stream)?;
        if let Some((b, _)) = send {
            b.note_use(ev.clone());
        }
        if let Some((b, _)) = recv {
            b.note_use(ev.clone());
        }
        Ok(ev)
    }
}

/// Awaits a CUDA event without blocking a runtime worker: polls it,
/// yielding to other tasks between polls, for up to 20 ms, then every
/// millisecond (the timer's resolution). A failed query (a device error)
/// is returned, not taken for "pending"; with `watch`, so is a failure of
/// that communicator (a dead peer whose signal will never come).
pub async fn wait_event(
    ev: &GpuEvent,
    rank: Rank,
    watch: Option<&dyn Communicator>,
) -> Result<(), CudaError> {
    let t = std::time::Instant::now();
    while !ev.try_is_complete(rank)? {
        if let Some(e) = watch.and_then(|c| c.failure()) {
            return Err(e.into());
        }
        if t.elapsed() < std::time::Duration::from_millis(20) {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }
    Ok(())
}
