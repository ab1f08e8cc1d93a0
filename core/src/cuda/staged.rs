//! Host-staged device transfers: the calls of [`NcclWork`](super::NcclWork)
//! carried out through host memory over the host communicator, for ranks
//! that share a GPU (NCCL refuses two ranks on one device) or that are told
//! to (`BRAID_DEVICE_TRANSPORT=host`).
//!
//! Every call runs to its end on the communicator's thread:
//!
//! ```text
//!  stream work before ──▶ synchronize ──▶ device → host copies
//!    ──▶ host messages: every send and receive of the call (or of the
//!        group) in flight at once, so no pair waits on the other's order
//!    ──▶ length checks ──▶ host → device copies on the stream ──▶ synchronize
//! ```
//!
//! Tags: every rank runs its requests in the same order (the slot order),
//! and a call's messages between two ranks go in the same order on both
//! sides, so one tag carries all staged traffic of a communicator: the
//! mailbox keeps per-(src, tag) order, as MPI does.
//!
//! Reductions combine the ranks' contributions in rank order, so every rank
//! gets bit-identical results.
//!
//! Cost: a stream synchronization and host copies per call; AllReduce and
//! ReduceScatter send every rank's whole input to every peer (N (N-1) S
//! bytes in all). This is for development machines and tests (several
//! ranks on one GPU), not for speed.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use cudarc::driver::CudaStream;
use cudarc::driver::result as dres;
use cudarc::driver::sys::CUdeviceptr;

use super::error::{CudaError, DriverResult};
use super::nccl::{CHECK_EVERY, NcclDType, NcclOp, Watch};
use crate::tag::Tag;
use crate::{Buffer, Rank};

/// What a staged call sees: the stream, the ranks and the watch.
#[derive(Clone, Copy)]
pub(super) struct Env<'a> {
    pub(super) stream: &'a Arc<CudaStream>,
    pub(super) rank: Rank,
    pub(super) nranks: u32,
    pub(super) watch: Watch<'a>,
}

/// One point-to-point piece of a group: device pointer, bytes, peer.
#[derive(Clone, Copy)]
pub(super) struct Part {
    pub(super) ptr: CUdeviceptr,
    pub(super) bytes: usize,
    pub(super) peer: Rank,
}

/// The sends and receives of a closed group, in call order.
#[derive(Default)]
pub(super) struct Group {
    depth: u32,
    pub(super) sends: Vec<Part>,
    pub(super) recvs: Vec<Part>,
}

/// The open group of a transport without NCCL (this one and `Solo`):
/// sends and receives are queued while a group is open (groups nest) and
/// handed back when the outermost one closes.
#[derive(Default)]
pub(super) struct Grouping {
    open: RefCell<Option<Group>>,
}

impl Grouping {
    /// Queues `part` (a send, or a receive) in the open group; hands it
    /// back when no group is open.
    pub(super) fn queue(&self, part: Part, send: bool) -> Option<Part> {
        let mut slot = self.open.borrow_mut();
        let Some(g) = slot.as_mut() else {
            return Some(part);
        };
        if send {
            g.sends.push(part);
        } else {
            g.recvs.push(part);
        }
        None
    }

    /// Runs `f` inside a group; returns its result and, when this closed
    /// the outermost group, what the group queued. A failed `f` leaves no
    /// group open, and its parts are dropped.
    pub(super) fn run<R>(
        &self,
        f: impl FnOnce() -> Result<R, CudaError>,
    ) -> Result<(R, Option<Group>), CudaError> {
        self.open
            .borrow_mut()
            .get_or_insert_with(Group::default)
            .depth += 1;
        let r = f();
        let closed = {
            let mut slot = self.open.borrow_mut();
            match slot.as_mut() {
                Some(g) if g.depth > 1 => {
                    g.depth -= 1;
                    None
                }
                _ => slot.take(),
            }
        };
        Ok((r?, closed))
    }
}

/// The staged transport of one communicator (lives on its thread).
pub(super) struct Staged {
    tag: Tag,
    rt: tokio::runtime::Handle,
    group: Grouping,
}

impl Staged {
    /// A transport that sends under `tag` and blocks on `rt`.
    pub(super) fn new(tag: Tag, rt: tokio::runtime::Handle) -> Self {
        Staged {
            tag,
            rt,
            group: Grouping::default(),
        }
    }

    /// AllReduce: every rank's input to every peer, combined in rank order.
    pub(super) fn all_reduce(
        &self,
        e: Env<'_>,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        count: usize,
        dt: NcclDType,
        op: NcclOp,
    ) -> Result<(), CudaError> {
        let bytes = count * dt.size();
        let mine = self.to_host_one(e, send, bytes)?;
        let parts = self.gather_parts(e, mine.clone(), |_| mine.clone(), bytes)?;
        self.to_device(e, &[(recv, &reduce(&parts, dt, op))])
    }

    /// Broadcast from `root`.
    pub(super) fn broadcast(
        &self,
        e: Env<'_>,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        count: usize,
        dt: NcclDType,
        root: Rank,
    ) -> Result<(), CudaError> {
        let bytes = count * dt.size();
        if e.rank == root {
            let data = self.to_host_one(e, send, bytes)?;
            let sends = (0..e.nranks)
                .filter(|&p| p != root)
                .map(|p| (p, data.clone()))
                .collect();
            self.exchange(e, sends, Vec::new())?;
            if send != recv {
                self.to_device(e, &[(recv, data.as_slice())])?;
            }
            Ok(())
        } else {
            let got = self.exchange(e, Vec::new(), vec![(root, bytes)])?;
            self.to_device(e, &[(recv, got[0].as_slice())])
        }
    }

    /// AllGather of `count` elements per rank, in rank order.
    pub(super) fn all_gather(
        &self,
        e: Env<'_>,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        count: usize,
        dt: NcclDType,
    ) -> Result<(), CudaError> {
        let bytes = count * dt.size();
        let mine = self.to_host_one(e, send, bytes)?;
        let parts = self.gather_parts(e, mine.clone(), |_| mine.clone(), bytes)?;
        let dst: Vec<(CUdeviceptr, &[u8])> = parts
            .iter()
            .enumerate()
            .map(|(p, b)| (recv + (p * bytes) as u64, b.as_slice()))
            .collect();
        self.to_device(e, &dst)
    }

    /// ReduceScatter: block p of every rank's input goes to rank p, which
    /// combines them in rank order.
    pub(super) fn reduce_scatter(
        &self,
        e: Env<'_>,
        send: CUdeviceptr,
        recv: CUdeviceptr,
        count: usize,
        dt: NcclDType,
        op: NcclOp,
    ) -> Result<(), CudaError> {
        let bytes = count * dt.size();
        let blocks: Vec<(CUdeviceptr, usize)> = (0..e.nranks as usize)
            .map(|p| (send + (p * bytes) as u64, bytes))
            .collect();
        let mut host: Vec<Option<Buffer>> = self
            .to_host(e, &blocks)?
            .into_iter()
            .map(|v| Some(Buffer::from_vec(v)))
            .collect();
        let mut block = |p: Rank| host[p as usize].take().unwrap_or_default();
        let mine = block(e.rank);
        let parts = self.gather_parts(e, mine, block, bytes)?;
        self.to_device(e, &[(recv, &reduce(&parts, dt, op))])
    }

    /// Sends `part(p)` to every peer p and receives `bytes` from each: every
    /// rank's part for this rank, in rank order (`mine` at this rank's place).
    fn gather_parts(
        &self,
        e: Env<'_>,
        mine: Buffer,
        mut part: impl FnMut(Rank) -> Buffer,
        bytes: usize,
    ) -> Result<Vec<Buffer>, CudaError> {
        let others: Vec<Rank> = (0..e.nranks).filter(|&p| p != e.rank).collect();
        let sends = others.iter().map(|&p| (p, part(p))).collect();
        let recvs = others.iter().map(|&p| (p, bytes)).collect();
        let mut got = self.exchange(e, sends, recvs)?;
        got.insert(e.rank as usize, mine);
        Ok(got)
    }

    /// A send of `bytes` to `peer`: queued inside a group, at once outside.
    pub(super) fn send(
        &self,
        e: Env<'_>,
        ptr: CUdeviceptr,
        bytes: usize,
        peer: Rank,
    ) -> Result<(), CudaError> {
        match self.group.queue(Part { ptr, bytes, peer }, true) {
            Some(part) => self.run_parts(e, vec![part], Vec::new()),
            None => Ok(()),
        }
    }

    /// A receive of `bytes` from `peer`: queued inside a group, at once
    /// outside.
    pub(super) fn recv(
        &self,
        e: Env<'_>,
        ptr: CUdeviceptr,
        bytes: usize,
        peer: Rank,
    ) -> Result<(), CudaError> {
        match self.group.queue(Part { ptr, bytes, peer }, false) {
            Some(part) => self.run_parts(e, Vec::new(), vec![part]),
            None => Ok(()),
        }
    }

    /// Runs `f` as a group: its sends and receives move together when the
    /// outermost group closes (even when `f` failed, nothing is left open).
    pub(super) fn group<R>(
        &self,
        e: Env<'_>,
        f: impl FnOnce() -> Result<R, CudaError>,
    ) -> Result<R, CudaError> {
        let (r, closed) = self.group.run(f)?;
        if let Some(g) = closed {
            self.run_parts(e, g.sends, g.recvs)?;
        }
        Ok(r)
    }

    /// Moves a group's sends and receives; a rank's sends to itself feed its
    /// receives from itself, in order.
    fn run_parts(&self, e: Env<'_>, sends: Vec<Part>, recvs: Vec<Part>) -> Result<(), CudaError> {
        for p in sends.iter().chain(&recvs) {
            if p.peer >= e.nranks {
                return Err(CudaError::Invalid {
                    rank: e.rank,
                    detail: format!("staged send/receive with rank {} of {}", p.peer, e.nranks),
                });
            }
        }
        let srcs: Vec<(CUdeviceptr, usize)> = sends.iter().map(|p| (p.ptr, p.bytes)).collect();
        let data = self.to_host(e, &srcs)?;
        let mut own: VecDeque<Buffer> = VecDeque::new();
        let mut out = Vec::new();
        for (p, d) in sends.iter().zip(data) {
            let b = Buffer::from_vec(d);
            if p.peer == e.rank {
                own.push_back(b);
            } else {
                out.push((p.peer, b));
            }
        }
        let remote: Vec<(Rank, usize)> = recvs
            .iter()
            .filter(|p| p.peer != e.rank)
            .map(|p| (p.peer, p.bytes))
            .collect();
        let mut got = self.exchange(e, out, remote)?.into_iter();
        let mut placed = Vec::with_capacity(recvs.len());
        for p in &recvs {
            let b = if p.peer == e.rank {
                let b = own.pop_front().ok_or_else(|| CudaError::Invalid {
                    rank: e.rank,
                    detail: "a staged receive from this rank has no matching send".into(),
                })?;
                check_len(e.rank, p.peer, b.len(), p.bytes)?;
                b
            } else {
                got.next().unwrap_or_default()
            };
            placed.push((p.ptr, b));
        }
        let dst: Vec<(CUdeviceptr, &[u8])> =
            placed.iter().map(|(p, b)| (*p, b.as_slice())).collect();
        self.to_device(e, &dst)
    }

    /// Every send and receive at once; received buffers in `recvs` order,
    /// each checked against its expected length.
    fn exchange(
        &self,
        e: Env<'_>,
        sends: Vec<(Rank, Buffer)>,
        recvs: Vec<(Rank, usize)>,
    ) -> Result<Vec<Buffer>, CudaError> {
        let host = e.watch.host;
        let tag = self.tag;
        let mut peers: Vec<Rank> = sends
            .iter()
            .map(|p| p.0)
            .chain(recvs.iter().map(|p| p.0))
            .collect();
        peers.sort_unstable();
        peers.dedup();
        let send_all =
            futures::future::try_join_all(sends.into_iter().map(|(p, b)| host.send(p, tag, b)));
        let recv_all = futures::future::try_join_all(recvs.iter().map(|&(p, _)| host.recv(p, tag)));
        let (_, got) = self.block(e, &peers, futures::future::try_join(send_all, recv_all))?;
        for (b, &(p, want)) in got.iter().zip(&recvs) {
            check_len(e.rank, p, b.len(), want)?;
        }
        Ok(got)
    }

    /// Waits for `fut` (messages with `peers`) on the runtime, giving up
    /// when the communicator is aborted or the host communicator fails.
    fn block<T>(
        &self,
        e: Env<'_>,
        peers: &[Rank],
        fut: impl Future<Output = Result<T, crate::error::CommError>>,
    ) -> Result<T, CudaError> {
        let w = e.watch;
        self.rt.block_on(async move {
            tokio::pin!(fut);
            loop {
                tokio::select! {
                    r = &mut fut => return r.map_err(CudaError::from),
                    _ = tokio::time::sleep(CHECK_EVERY) => {
                        if w.flag.load(Ordering::Acquire) {
                            return Err(CudaError::Nccl {
                                rank: w.rank,
                                call: "staged transfer",
                                detail: format!("aborted while moving data with ranks {peers:?}"),
                            });
                        }
                        if let Some(err) = w.host.failure() {
                            return Err(err.into());
                        }
                    }
                }
            }
        })
    }

    /// Copies device ranges to host (after the stream's earlier work).
    fn to_host(&self, e: Env<'_>, src: &[(CUdeviceptr, usize)]) -> Result<Vec<Vec<u8>>, CudaError> {
        let mut out: Vec<Vec<u8>> = src.iter().map(|&(_, b)| vec![0u8; b]).collect();
        for (v, &(ptr, _)) in out.iter_mut().zip(src) {
            if !v.is_empty() {
                // SAFETY: the caller guarantees `ptr` holds `v.len()` bytes
                // of device memory; `v` outlives the synchronize below.
                unsafe { dres::memcpy_dtoh_async(v.as_mut_slice(), ptr, e.stream.cu_stream()) }
                    .on(e.rank, "cuMemcpyDtoHAsync")?;
            }
        }
        e.stream.synchronize().on(e.rank, "cuStreamSynchronize")?;
        Ok(out)
    }

    /// One device range as a host buffer (this rank's part of a collective).
    fn to_host_one(&self, e: Env<'_>, src: CUdeviceptr, bytes: usize) -> Result<Buffer, CudaError> {
        let mut v = self.to_host(e, &[(src, bytes)])?;
        Ok(Buffer::from_vec(v.swap_remove(0)))
    }

    /// Copies host bytes to device ranges on the stream and waits for them.
    fn to_device(&self, e: Env<'_>, dst: &[(CUdeviceptr, &[u8])]) -> Result<(), CudaError> {
        for &(ptr, b) in dst {
            if !b.is_empty() {
                // SAFETY: the caller guarantees `ptr` holds `b.len()` bytes
                // of device memory; `b` outlives the synchronize below.
                unsafe { dres::memcpy_htod_async(ptr, b, e.stream.cu_stream()) }
                    .on(e.rank, "cuMemcpyHtoDAsync")
                    .map_err(|err| {
                        err.with_context(|| {
                            format!("host-staged transfer, {} bytes to {ptr:#x}", b.len())
                        })
                    })?;
            }
        }
        e.stream.synchronize().on(e.rank, "cuStreamSynchronize")
    }
}

/// A received length must be the one this rank expects (a mismatched call).
fn check_len(rank: Rank, peer: Rank, got: usize, want: usize) -> Result<(), CudaError> {
    if got == want {
        Ok(())
    } else {
        Err(CudaError::Invalid {
            rank,
            detail: format!(
                "staged transfer from rank {peer}: {got} bytes where this call expects \
                 {want}: the peer's call does not match this one"
            ),
        })
    }
}

/// Combines equal-length parts element by element, in order.
fn reduce(parts: &[Buffer], dt: NcclDType, op: NcclOp) -> Vec<u8> {
    let mut acc = parts
        .first()
        .map(|b| b.as_slice().to_vec())
        .unwrap_or_default();
    for p in &parts[1.min(parts.len())..] {
        combine(&mut acc, p.as_slice(), dt, op);
    }
    acc
}

/// `acc[i] = acc[i] op x[i]` over elements of `dt` (native byte order;
/// integers wrap, as NCCL's do).
fn combine(acc: &mut [u8], x: &[u8], dt: NcclDType, op: NcclOp) {
    macro_rules! apply {
        ($t:ty, $sum:expr, $prod:expr, $min:expr, $max:expr) => {{
            const W: usize = std::mem::size_of::<$t>();
            let f: fn($t, $t) -> $t = match op {
                NcclOp::Sum => $sum,
                NcclOp::Prod => $prod,
                NcclOp::Min => $min,
                NcclOp::Max => $max,
            };
            for (a, b) in acc.chunks_exact_mut(W).zip(x.chunks_exact(W)) {
                let mut wa = [0u8; W];
                let mut wb = [0u8; W];
                wa.copy_from_slice(a);
                wb.copy_from_slice(b);
                let r = f(<$t>::from_ne_bytes(wa), <$t>::from_ne_bytes(wb));
                a.copy_from_slice(&r.to_ne_bytes());
            }
        }};
    }
    macro_rules! int {
        ($t:ty) => {
            apply!(
                $t,
                <$t>::wrapping_add,
                <$t>::wrapping_mul,
                <$t as Ord>::min,
                <$t as Ord>::max
            )
        };
    }
    match dt {
        NcclDType::U8 => int!(u8),
        NcclDType::I32 => int!(i32),
        NcclDType::I64 => int!(i64),
        NcclDType::F32 => apply!(f32, |a, b| a + b, |a, b| a * b, f32::min, f32::max),
        NcclDType::F64 => apply!(f64, |a, b| a + b, |a, b| a * b, f64::min, f64::max),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf<T: Copy>(v: &[T], to: fn(T) -> Vec<u8>) -> Buffer {
        Buffer::from_vec(v.iter().flat_map(|&x| to(x)).collect())
    }

    #[test]
    fn reductions_combine_in_rank_order() {
        let to = |x: f64| x.to_ne_bytes().to_vec();
        let a = buf(&[1.0, 5.0, -2.0], to);
        let b = buf(&[2.0, 4.0, -3.0], to);
        let c = buf(&[3.0, 6.0, 0.5], to);
        let parts = [a, b, c];
        let back = |v: Vec<u8>| -> Vec<f64> {
            v.chunks_exact(8)
                .map(|c| {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(c);
                    f64::from_ne_bytes(w)
                })
                .collect()
        };
        assert_eq!(
            back(reduce(&parts, NcclDType::F64, NcclOp::Sum)),
            [6.0, 15.0, -4.5]
        );
        assert_eq!(
            back(reduce(&parts, NcclDType::F64, NcclOp::Prod)),
            [6.0, 120.0, 3.0]
        );
        assert_eq!(
            back(reduce(&parts, NcclDType::F64, NcclOp::Min)),
            [1.0, 4.0, -3.0]
        );
        assert_eq!(
            back(reduce(&parts, NcclDType::F64, NcclOp::Max)),
            [3.0, 6.0, 0.5]
        );
        let to = |x: i32| x.to_ne_bytes().to_vec();
        let a = buf(&[i32::MAX, 7], to);
        let b = buf(&[1, -9], to);
        let sum = reduce(&[a, b], NcclDType::I32, NcclOp::Sum);
        assert_eq!(sum, buf(&[i32::MIN, -2], to).as_slice());
    }
}
