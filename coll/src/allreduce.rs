//! AllReduce and ReduceScatter.
//!
//! Algorithm: direct reduce-scatter, then (AllReduce) direct allgather.
//! The input of length L is cut into N blocks; rank b owns block b:
//!
//! ```text
//!   phase 1 (stage 0): every rank sends block b of its input to rank b;
//!                      rank b reduces the N contributions in rank order
//!                      0, 1, ..., N-1 (one owner per block, so every rank
//!                      ends with bit-identical values);
//!   phase 2 (stage 1): rank b sends its reduced block to every rank.
//! ```
//!
//! Cost: 2 steps; per rank 2 (N-1)/N * L * beta moved and (N-1)/N * L
//! reduction work (gamma): bandwidth-optimal like a ring, with 2 steps of
//! latency instead of 2 (N-1).
//!
//! Mismatched calls need no separate agreement round: every phase-1 frame
//! carries its sender's (element type, operator, count), so every block
//! owner sees every rank's signature. If any two ranks differ, each owner
//! differs from at least one of them and fails; no rank can finish without
//! every owner's phase-2 block, so no rank returns data.

use std::sync::Arc;

use braid_core::{Buffer, Communicator, Context, Tag};
use braid_kernels::reduce::reduce_into;
use braid_kernels::{Element, ReduceKind};

use crate::error::{CollError, CollKind, Site};
use crate::handle::{Callback, Handle, start, streaming};
use crate::wire::Elements;
use crate::wire::{Meta, Signature, recv_framed, send_framed, typed, vec_to_buffer};

/// A user-supplied reduction: `acc[i] = acc[i] (op) x[i]`. It must be the
/// same function on every rank; it is applied in rank order.
pub type CustomReduce<T> = Arc<dyn Fn(&mut [T], &[T]) + Send + Sync>;

/// A reduction operator.
#[derive(Clone)]
pub enum ReduceOp<T> {
    /// Sum, prod, min or max.
    Builtin(ReduceKind),
    /// A user-supplied operator.
    Custom(CustomReduce<T>),
}

impl<T> std::fmt::Debug for ReduceOp<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReduceOp::Builtin(k) => write!(f, "{k:?}"),
            ReduceOp::Custom(_) => f.write_str("Custom"),
        }
    }
}

impl<T> From<ReduceKind> for ReduceOp<T> {
    fn from(k: ReduceKind) -> Self {
        ReduceOp::Builtin(k)
    }
}

impl<T: Element> ReduceOp<T> {
    fn code(&self) -> u32 {
        match self {
            ReduceOp::Builtin(ReduceKind::Sum) => 1,
            ReduceOp::Builtin(ReduceKind::Prod) => 2,
            ReduceOp::Builtin(ReduceKind::Min) => 3,
            ReduceOp::Builtin(ReduceKind::Max) => 4,
            ReduceOp::Custom(_) => 255,
        }
    }

    fn apply(&self, acc: &mut [T], x: &[T]) {
        match self {
            ReduceOp::Builtin(k) => reduce_into(acc, x, *k),
            ReduceOp::Custom(f) => f(acc, x),
        }
    }
}

/// Block `b` of `len` elements cut into `n` blocks: `[lo, hi)`.
fn block(len: usize, n: u32, b: u32) -> (usize, usize) {
    let lo = (len as u128 * b as u128 / n as u128) as usize;
    let hi = (len as u128 * (b as u128 + 1) / n as u128) as usize;
    (lo, hi)
}

/// Phase 1: this rank's block of the reduction.
async fn reduce_my_block<T: Element>(
    comm: &Arc<dyn Communicator>,
    site: Site,
    data: Elements<T>,
    op: &ReduceOp<T>,
) -> Result<Vec<T>, CollError> {
    let n = comm.nranks();
    let me = site.rank;
    let len = data.len();
    let sz = std::mem::size_of::<T>();
    let tag = Tag::new(site.op, 0);
    let buf = data.buffer().clone();
    let meta = Meta::new(site.coll, T::DTYPE)
        .aux(op.code())
        .count(len as u64);
    let mine = Signature {
        dtype: T::DTYPE,
        aux: op.code(),
        count: len as u64,
    };
    let mut sends = Vec::new();
    for p in (0..n).filter(|p| *p != me) {
        let (lo, hi) = block(len, n, p);
        sends.push(send_framed(
            comm.as_ref(),
            site,
            p,
            tag,
            meta,
            &[],
            buf.slice(lo * sz..hi * sz),
        ));
    }
    let (lo, hi) = block(len, n, me);
    let recvs = (0..n).filter(|p| *p != me).map(|p| {
        let comm = comm.clone();
        async move {
            let f = recv_framed(comm.as_ref(), site, p, tag).await?;
            let theirs = Signature {
                dtype: f.meta.dtype,
                aux: f.meta.aux,
                count: f.meta.count,
            };
            if let Some(d) = mine.differs(site.coll, theirs) {
                return Err(site.mismatch(p, d));
            }
            if f.data.len() != (hi - lo) * sz {
                return Err(site.mismatch(
                    p,
                    format!("rank {p} sent {} bytes for block {me}", f.data.len()),
                ));
            }
            Ok::<_, CollError>(f.data)
        }
    });
    let mut parts: Vec<Option<Buffer>> = futures::future::try_join_all(recvs)
        .await?
        .into_iter()
        .map(Some)
        .collect();
    parts.insert(me as usize, Some(buf.slice(lo * sz..hi * sz)));
    let mut acc: Vec<T> = Vec::new();
    for (q, part) in parts.iter_mut().enumerate() {
        let part = part.take().unwrap_or_default();
        let x = typed::<T>(&part).ok_or_else(|| site.mismatch(q as u32, "bad block length"))?;
        if q == 0 {
            acc = x.into_owned();
        } else {
            op.apply(&mut acc, &x);
        }
    }
    for s in sends {
        s.await?;
    }
    Ok(acc)
}

/// Starts an AllReduce of `data` with `op`; every rank's handle yields the
/// same (bit-identical) result.
pub fn start_allreduce<T: Element>(
    ctx: &Context,
    data: impl Into<Elements<T>>,
    op: ReduceOp<T>,
    callback: Option<Callback>,
) -> Handle<Vec<T>> {
    let data: Elements<T> = data.into();
    let site = Site::next(ctx, CollKind::AllReduce);
    let opid = site.op;
    let comm = ctx.comm().clone();
    start(ctx, CollKind::AllReduce, opid, callback, async move {
        let n = comm.nranks();
        let me = site.rank;
        let len = data.len();
        let work = async {
            let mine = reduce_my_block(&comm, site, data, &op).await?;
            if n == 1 {
                return Ok(mine);
            }
            let tag = Tag::new(opid, 1);
            let mine_buf = vec_to_buffer(mine);
            let meta = Meta::new(site.coll, T::DTYPE)
                .aux(op.code())
                .count(len as u64);
            let sends: Vec<_> = (0..n)
                .filter(|p| *p != me)
                .map(|p| send_framed(comm.as_ref(), site, p, tag, meta, &[], mine_buf.clone()))
                .collect();
            let recvs = (0..n).filter(|p| *p != me).map(|p| {
                let comm = comm.clone();
                async move {
                    Ok::<_, CollError>((p, recv_framed(comm.as_ref(), site, p, tag).await?.data))
                }
            });
            let got = futures::future::try_join_all(recvs).await?;
            let mut out: Vec<T> = Vec::with_capacity(len);
            let mut blocks: Vec<Option<Buffer>> = vec![None; n as usize];
            blocks[me as usize] = Some(mine_buf);
            for (p, b) in got {
                blocks[p as usize] = Some(b);
            }
            for (p, b) in blocks.into_iter().enumerate() {
                let b = b.unwrap_or_default();
                let (lo, hi) = block(len, n, p as u32);
                let x =
                    typed::<T>(&b).ok_or_else(|| site.mismatch(p as u32, "bad block length"))?;
                if x.len() != hi - lo {
                    return Err(site.mismatch(p as u32, "reduced block has the wrong length"));
                }
                out.extend_from_slice(&x);
            }
            for s in sends {
                s.await?;
            }
            Ok(out)
        };
        work.await
    })
}

/// Reduces `data` element-wise over all ranks; every rank gets the result.
pub async fn allreduce<T: Element>(
    ctx: &Context,
    data: impl Into<Elements<T>>,
    op: impl Into<ReduceOp<T>>,
) -> Result<Vec<T>, CollError> {
    let (data, op) = (data.into(), op.into());
    streaming(|cb| start_allreduce(ctx, data, op, cb)).await
}

/// Starts a ReduceScatter: `data` has N equal blocks; rank r gets block r
/// reduced over all ranks.
pub fn start_reduce_scatter<T: Element>(
    ctx: &Context,
    data: impl Into<Elements<T>>,
    op: ReduceOp<T>,
    callback: Option<Callback>,
) -> Handle<Vec<T>> {
    let data: Elements<T> = data.into();
    let site = Site::next(ctx, CollKind::ReduceScatter);
    let opid = site.op;
    let comm = ctx.comm().clone();
    start(ctx, CollKind::ReduceScatter, opid, callback, async move {
        let n = comm.nranks() as usize;
        if data.len() % n != 0 {
            return Err(site.invalid(format!(
                "{} elements do not split into {n} equal blocks",
                data.len()
            )));
        }
        reduce_my_block(&comm, site, data, &op).await
    })
}

/// Reduces N equal blocks over all ranks; rank r gets block r.
pub async fn reduce_scatter<T: Element>(
    ctx: &Context,
    data: impl Into<Elements<T>>,
    op: impl Into<ReduceOp<T>>,
) -> Result<Vec<T>, CollError> {
    let (data, op) = (data.into(), op.into());
    streaming(|cb| start_reduce_scatter(ctx, data, op, cb)).await
}
