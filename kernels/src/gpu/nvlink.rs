//! NVLink SendRecv by SMs: the sender's blocks copy its data into staging
//! slots in the receiver's memory and flag them ready; the receiver's
//! blocks copy each ready slot to the output and flag it free (protocol
//! picture in `kernels.cu`). One kernel per call does both directions,
//! with distinct send and receive peers (a ring step).
//!
//! Against the copy engine ([`braid_core::cuda::ipc::IpcSendRecv`]) it
//! needs no host message per step (the staging slots are mapped once), and
//! it overlaps the sender's NVLink writes with the receiver's local copies
//! chunk by chunk. Cost (default [`NvlinkConfig`]): 64 sending and 64
//! receiving blocks while a call runs; 32 MiB of staging per source rank; one one-way NVLink latency for
//! the length handshake. A failed call (lengths that differ, a peer that
//! never comes within 10 s) leaves the object unusable.
//!
//! Bandwidth ceiling: an SM writes to a peer in NVLink packets of at most
//! 128 bytes of payload, the copy engine in 256-byte ones (as NCCL's
//! maintainers put it; the figures below agree). On NV18
//! (H100, H200) this kernel reaches ~360 GB/s a direction from 512 MiB up,
//! the same as NCCL's send/recv (also SM-driven), and 1.17-1.34x NCCL from 8
//! to 256 MiB; the copy engine ([`IpcSendRecv`]) reaches ~388 GB/s, so it
//! is the faster choice for the largest steps. Bulk stores through the
//! Tensor Memory Accelerator were measured at the SM's ceiling too
//! (BENCHMARKS.md, 2026-11-26).
//!
//! [`IpcSendRecv`]: braid_core::cuda::ipc::IpcSendRecv

use std::sync::Arc;

use braid_core::cuda::cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};
use braid_core::cuda::ipc::{IpcPeers, wait_event};
use braid_core::cuda::{CudaError, DeviceBuffer, Gpu, GpuEvent};
use braid_core::{Communicator, Context};

use super::launch::{KernelError, Kernels, launched};

/// The smallest chunk (below it the per-chunk handshake dominates).
const MIN_CHUNK: usize = 64 * 1024;

/// Whose memory holds the staging slots between a sender and a receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Staging {
    /// The receiver's: the sender writes over NVLink, the receiver copies
    /// locally (push).
    AtReceiver,
    /// The sender's: the sender copies locally, the receiver reads over
    /// NVLink (pull).
    AtSender,
}

/// The shape of an [`NvlinkSendRecv`]; every rank must use the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvlinkConfig {
    /// Blocks per direction (1 to 256): more move more bytes at once and
    /// hold more SMs while a call runs.
    pub blocks: usize,
    /// Staging slots per block (2 to 16): the sender runs up to
    /// `slots - 1` chunks ahead of the receiver.
    pub slots: usize,
    /// Bytes per slot (64 KiB to 4 MiB, a multiple of 16): the largest
    /// chunk. Staging per peer: blocks x slots x slot_bytes.
    pub slot_bytes: usize,
    /// Where the slots are (the flags are the same either way: `ready` in
    /// the receiver's memory, `free` in the sender's).
    pub staging: Staging,
}

impl Default for NvlinkConfig {
    /// 64 blocks, 2 slots of 256 KiB (32 MiB of staging per source rank).
    fn default() -> Self {
        NvlinkConfig {
            blocks: 64,
            slots: 2,
            slot_bytes: 256 * 1024,
            staging: Staging::AtReceiver,
        }
    }
}

/// Chunk size for `len` bytes: about two chunks per block (every block
/// busy), from 64 KiB to the slot, a multiple of 16 bytes. Both sides
/// compute it from the same length (the handshake checks the lengths).
fn chunk_for(len: usize, c: &NvlinkConfig) -> u64 {
    let x = (len / (2 * c.blocks)).clamp(MIN_CHUNK.min(c.slot_bytes), c.slot_bytes);
    (x / 16 * 16) as u64
}
/// Threads per block (`NV_THREADS`).
const THREADS: u32 = 512;

/// Word offsets into a rank's flag buffer (n ranks, `blocks` blocks per
/// direction).
struct Layout {
    n: usize,
    blocks: usize,
    slots: usize,
}

impl Layout {
    fn hdr_in(&self, src: usize) -> usize {
        8 * src
    }
    fn hdr_back(&self, dst: usize) -> usize {
        8 * self.n + 8 * dst
    }
    fn ready(&self, src: usize) -> usize {
        16 * self.n + src * self.blocks * self.slots
    }
    fn free(&self, dst: usize) -> usize {
        16 * self.n + (self.n + dst) * self.blocks * self.slots
    }
    fn send_cnt(&self, dst: usize) -> usize {
        16 * self.n + 2 * self.n * self.blocks * self.slots + dst * self.blocks
    }
    fn recv_cnt(&self, src: usize) -> usize {
        16 * self.n + 2 * self.n * self.blocks * self.slots + (self.n + src) * self.blocks
    }
    fn err(&self) -> usize {
        16 * self.n + 2 * self.n * self.blocks * self.slots + 2 * self.n * self.blocks
    }
    fn words(&self) -> usize {
        self.err() + 1
    }
}

/// The SM-driven NVLink SendRecv of one group of ranks (one GPU each, one
/// host); create it on every rank.
pub struct NvlinkSendRecv {
    comm: Arc<dyn Communicator>,
    gpu: Arc<Gpu>,
    stream: Arc<CudaStream>,
    layout: Layout,
    config: NvlinkConfig,
    staging: DeviceBuffer,
    flags: DeviceBuffer,
    peers: IpcPeers,
    send_seq: Vec<u32>,
    recv_seq: Vec<u32>,
    failed: bool,
}

fn cuda(rank: u32, call: &'static str) -> impl Fn(String) -> KernelError {
    move |detail| KernelError::Cuda(CudaError::Driver { rank, call, detail })
}

impl NvlinkSendRecv {
    /// Collective: allocates this rank's staging slots and flags and maps
    /// every peer's (CUDA IPC, or pointers between threads of a process).
    /// The [`NvlinkConfig::default`] shape.
    pub async fn new(ctx: &Context, gpu: Arc<Gpu>) -> Result<NvlinkSendRecv, KernelError> {
        Self::with_config(ctx, gpu, NvlinkConfig::default()).await
    }

    /// Like [`NvlinkSendRecv::new`] with the shape `config` (the same on
    /// every rank).
    pub async fn with_config(
        ctx: &Context,
        gpu: Arc<Gpu>,
        config: NvlinkConfig,
    ) -> Result<NvlinkSendRecv, KernelError> {
        let c = config;
        if !(1..=256).contains(&c.blocks)
            || !(2..=16).contains(&c.slots)
            || !(64 * 1024..=4 << 20).contains(&c.slot_bytes)
            || c.slot_bytes % 16 != 0
        {
            return Err(KernelError::Invalid {
                rank: gpu.rank(),
                kernel: "nvlink_sendrecv",
                detail: format!(
                    "{c:?} (blocks 1 to 256, slots 2 to 16, slot bytes 64 KiB to 4 MiB in 16s)"
                ),
            });
        }
        // Every block of a call must be resident at once (senders wait on
        // the peer's receivers): keep the grid within half the GPU.
        {
            let rank = gpu.rank();
            let k = Kernels::get(&gpu)?;
            let f = k.func(rank, "nvlink_sendrecv")?;
            let per_sm = f
                .occupancy_max_active_blocks_per_multiprocessor(THREADS, 0, None)
                .map_err(|e| {
                    cuda(rank, "cuOccupancyMaxActiveBlocksPerMultiprocessor")(format!("{e:?}"))
                })?;
            let sms = gpu
                .context()
                .attribute(braid_core::cuda::cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .map_err(|e| cuda(rank, "cuDeviceGetAttribute")(format!("{e:?}")))?;
            let room = per_sm as usize * sms.max(0) as usize / 2;
            if 2 * c.blocks > room {
                return Err(KernelError::Invalid {
                    rank,
                    kernel: "nvlink_sendrecv",
                    detail: format!(
                        "{} blocks per direction: {} resident blocks needed, room for {room} (half of {sms} SMs x {per_sm})",
                        c.blocks,
                        2 * c.blocks
                    ),
                });
            }
        }
        let n = ctx.nranks() as usize;
        let layout = Layout {
            n,
            blocks: c.blocks,
            slots: c.slots,
        };
        let staging = DeviceBuffer::alloc(&gpu, n * c.blocks * c.slots * c.slot_bytes)?;
        let mut flags = DeviceBuffer::alloc(&gpu, layout.words() * 4)?;
        flags.fill(0)?;
        gpu.stream()
            .synchronize()
            .map_err(|e| cuda(gpu.rank(), "cuStreamSynchronize")(format!("{e:?}")))?;
        flags.mark_complete();
        let stream = gpu.new_stream()?;
        Kernels::get(&gpu)?;
        let peers = IpcPeers::exchange(ctx, gpu.clone(), &[&staging, &flags]).await?;
        // Senders write at this rank's layout into the peers' buffers:
        // every rank must have laid them out alike (the same config), or
        // the writes land past a peer's buffers.
        for p in 0..n as u32 {
            for (i, mine) in [staging.len(), flags.len()].into_iter().enumerate() {
                let theirs = peers.remote(p, i).map(|(_, len)| len);
                if theirs != Some(mine as u64) {
                    return Err(KernelError::Invalid {
                        rank: gpu.rank(),
                        kernel: "nvlink_sendrecv",
                        detail: format!(
                            "rank {p}'s {} buffer holds {} bytes, this rank's {mine}: every rank must use the same NvlinkConfig",
                            ["staging", "flag"][i],
                            theirs.map_or("no".to_string(), |l| l.to_string())
                        ),
                    });
                }
            }
        }
        Ok(NvlinkSendRecv {
            comm: ctx.comm().clone(),
            gpu,
            stream,
            layout,
            config: c,
            staging,
            flags,
            peers,
            send_seq: vec![0; n],
            recv_seq: vec![0; n],
            failed: false,
        })
    }

    fn remote(&self, peer: u32, index: usize) -> Result<u64, KernelError> {
        self.peers
            .remote(peer, index)
            .map(|(p, _)| p)
            .ok_or_else(|| KernelError::Invalid {
                rank: self.gpu.rank(),
                kernel: "nvlink_sendrecv",
                detail: format!("nothing mapped for rank {peer}"),
            })
    }

    /// Enqueues one step on this object's stream: `send.0` to rank
    /// `send.1`, and from rank `recv.1` into `recv.0` (its length must
    /// equal what that rank sends; checked on the device). Returns the
    /// event after the step; the output is ready, and the input reusable,
    /// once it completes. See [`NvlinkSendRecv::sendrecv`] for a checked
    /// wait.
    pub fn enqueue(
        &mut self,
        send: Option<(&DeviceBuffer, u32)>,
        recv: Option<(&mut DeviceBuffer, u32)>,
    ) -> Result<GpuEvent, KernelError> {
        // A failure after the step numbers moved leaves this rank out of
        // step with its peers: the object is unusable from then on.
        let r = self.enqueue_inner(send, recv);
        if r.is_err() {
            self.failed = true;
        }
        r
    }

    fn enqueue_inner(
        &mut self,
        send: Option<(&DeviceBuffer, u32)>,
        recv: Option<(&mut DeviceBuffer, u32)>,
    ) -> Result<GpuEvent, KernelError> {
        let rank = self.gpu.rank();
        let n = self.layout.n as u32;
        let bad = |detail: String| KernelError::Invalid {
            rank,
            kernel: "nvlink_sendrecv",
            detail,
        };
        if self.failed {
            return Err(bad("an earlier step failed; the object is unusable".into()));
        }
        for p in send.iter().map(|s| s.1).chain(recv.iter().map(|r| r.1)) {
            if p >= n || p == rank {
                return Err(bad(format!("peer {p} (this is rank {rank} of {n})")));
            }
        }
        let l = &self.layout;
        let me = rank as usize;
        let base = self.flags.ptr();
        let word = |i: usize| base + 4 * i as u64;
        let cfgn = self.config;
        let region = (cfgn.blocks * cfgn.slots * cfgn.slot_bytes) as u64;
        // Send side.
        let (
            mut sp,
            mut sl,
            mut r_st,
            mut r_hdr,
            mut r_ready,
            mut l_free,
            mut l_back,
            mut s_cnt,
            mut s_seq,
        ) = (0u64, 0u64, 0u64, 0u64, 0u64, 0u64, 0u64, 0u64, 0u32);
        if let Some((b, dst)) = &send {
            let d = *dst as usize;
            self.send_seq[d] = self.send_seq[d].wrapping_add(1);
            sp = b.ptr();
            sl = b.len() as u64;
            r_st = match cfgn.staging {
                Staging::AtReceiver => self.remote(*dst, 0)? + me as u64 * region,
                Staging::AtSender => self.staging.ptr() + d as u64 * region,
            };
            let rf = self.remote(*dst, 1)?;
            r_hdr = rf + 4 * l.hdr_in(me) as u64;
            r_ready = rf + 4 * l.ready(me) as u64;
            l_free = word(l.free(d));
            l_back = word(l.hdr_back(d));
            s_cnt = word(l.send_cnt(d));
            s_seq = self.send_seq[d];
        }
        // Receive side.
        let (
            mut rp,
            mut rl,
            mut l_st,
            mut l_hdr,
            mut l_ready,
            mut r_free,
            mut r_back,
            mut r_cnt,
            mut r_seq,
        ) = (0u64, 0u64, 0u64, 0u64, 0u64, 0u64, 0u64, 0u64, 0u32);
        if let Some((b, src)) = &recv {
            let s = *src as usize;
            self.recv_seq[s] = self.recv_seq[s].wrapping_add(1);
            rp = b.ptr();
            rl = b.len() as u64;
            l_st = match cfgn.staging {
                Staging::AtReceiver => self.staging.ptr() + s as u64 * region,
                Staging::AtSender => self.remote(*src, 0)? + me as u64 * region,
            };
            l_hdr = word(l.hdr_in(s));
            l_ready = word(l.ready(s));
            let rf = self.remote(*src, 1)?;
            r_free = rf + 4 * l.free(me) as u64;
            r_back = rf + 4 * l.hdr_back(me) as u64;
            r_cnt = word(l.recv_cnt(s));
            r_seq = self.recv_seq[s];
        }
        let err = word(l.err());
        let nb = l.blocks as u32;
        let (send_chunk, recv_chunk) =
            (chunk_for(sl as usize, &cfgn), chunk_for(rl as usize, &cfgn));
        let (ns, sb) = (cfgn.slots as u32, cfgn.slot_bytes as u64);
        self.gpu.bind()?;
        if let Some((b, _)) = &send {
            b.wait_on(&self.stream)?;
        }
        if let Some((b, _)) = &recv {
            b.wait_writable(&self.stream)?;
        }
        let k = Kernels::get(&self.gpu)?;
        let f = k.func(rank, "nvlink_sendrecv")?;
        let mut lb = self.stream.launch_builder(f);
        lb.arg(&sp)
            .arg(&sl)
            .arg(&r_st)
            .arg(&r_hdr)
            .arg(&r_ready)
            .arg(&l_free)
            .arg(&l_back)
            .arg(&s_cnt)
            .arg(&s_seq)
            .arg(&rp)
            .arg(&rl)
            .arg(&l_st)
            .arg(&l_hdr)
            .arg(&l_ready)
            .arg(&r_free)
            .arg(&r_back)
            .arg(&r_cnt)
            .arg(&r_seq)
            .arg(&err)
            .arg(&nb)
            .arg(&ns)
            .arg(&sb)
            .arg(&send_chunk)
            .arg(&recv_chunk);
        let cfg = LaunchConfig {
            grid_dim: (2 * nb, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: local pointers lie in this object's live staging and
        // flag buffers and the caller's buffers (lengths passed); remote
        // ones in the peers' mapped staging and flag buffers, at the
        // offsets of the shared layout.
        launched(rank, unsafe { lb.launch(cfg) })?;
        let ev = self.gpu.record(&self.stream)?;
        // The object's own buffers too: dropped (the object, or a
        // cancelled `sendrecv`) while the kernel runs, they would go back
        // to the device's pool and be handed out under it.
        self.staging.note_use(ev.clone());
        self.flags.note_use(ev.clone());
        if let Some((b, _)) = send {
            b.note_use(ev.clone());
        }
        if let Some((b, _)) = recv {
            b.set_ready(ev.clone());
        }
        Ok(ev)
    }

    /// One step, awaited (watching the host communicator), with the
    /// device's verdict: lengths that differ from the peer's, or a peer
    /// that never came, are errors here.
    pub async fn sendrecv(
        &mut self,
        send: Option<(&DeviceBuffer, u32)>,
        recv: Option<(&mut DeviceBuffer, u32)>,
    ) -> Result<(), KernelError> {
        let peer = |p: Option<u32>| p.map_or("no rank".to_string(), |p| format!("rank {p}"));
        let step = format!(
            "sending to {}, receiving from {}",
            peer(send.as_ref().map(|s| s.1)),
            peer(recv.as_ref().map(|r| r.1))
        );
        let ev = self.enqueue(send, recv)?;
        wait_event(&ev, self.gpu.rank(), Some(self.comm.as_ref())).await?;
        // The device's verdict names no peer: the step's are added.
        self.check().map_err(|e| match e {
            KernelError::Invalid {
                rank,
                kernel,
                detail,
            } => KernelError::Invalid {
                rank,
                kernel,
                detail: format!("{detail} ({step})"),
            },
            e => e,
        })
    }

    /// Reads the device's error word (after the steps completed).
    pub fn check(&mut self) -> Result<(), KernelError> {
        let mut w = [0u8; 4];
        self.flags.read_at(4 * self.layout.err(), &mut w)?;
        match u32::from_le_bytes(w) {
            0 => Ok(()),
            code => {
                self.failed = true;
                Err(KernelError::Invalid {
                    rank: self.gpu.rank(),
                    kernel: "nvlink_sendrecv",
                    detail: if code == 1 {
                        "the peer's length differs from this rank's".into()
                    } else {
                        "the peer did not take part within 10 s".into()
                    },
                })
            }
        }
    }
}
