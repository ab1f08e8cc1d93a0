//! AllToAll and AllToAllv: every rank sends a (possibly different) slice to
//! every rank.
//!
//! Algorithm: pairwise direct exchange (each rank posts its N-1 sends at
//! once, then receives from every peer). Cost per rank: (N-1) alpha + the
//! bytes it sends and receives times beta.
//!
//! Two result forms over one core: [`alltoallv`] lays the received parts
//! out in one vector (one copy of what is received); [`alltoallv_parts`]
//! returns them per source rank as they arrived (between in-process ranks
//! a part is the sender's own buffer: no copy at all).
//!
//! Over tcp (and mpi) the one-vector forms receive large parts (over
//! 16 KiB: a header, then the data) straight into their places: the
//! data's receive is posted with the header's and offers its place as a
//! landing (`recv_landing`), so the transport reads the socket into the
//! result, and only this rank's own part (and parts that arrived before
//! their receive) is copied; the same bytes as MPI moves, which receives
//! into the caller's buffer. The result is the `_into` call's vector where
//! it already holds the result's length, else a fresh vector whose
//! capacity the parts are written into (nothing zeroed first;
//! `LandingZone::uninit`). At 16 and 64 MiB between 2 and 4 tcp ranks on
//! the 2-core VM this took the `_into` forms from 0.61-1.05 of OpenMPI to
//! 0.78-1.26 (BENCHMARKS.md, thirty-third session), and the fresh
//! `alltoallv` at 2 ranks from 12.0-12.6 to 7.5 ms at 16 MiB and from
//! 44-49 to 34-35 ms at 64 MiB (thirty-fourth session).
//!
//! Counts and offsets are validated against the buffers before anything is
//! sent. Each message carries both counts of its pair (what the sender
//! sends, and what it expects back), so both ranks of a pair that disagree
//! notice. So that every other rank fails too, with no extra message
//! round, each message also carries its sender's two count digests:
//!
//! ```text
//!   S(r) = sum over s of h(r, s, send_counts_r[s])   (r's claims as sender)
//!   R(s) = sum over r of h(r, s, recv_counts_s[r])   (s's claims as receiver)
//! ```
//!
//! (h: a 64-bit mixing hash, sums wrap). Every rank hears from every rank,
//! so every rank computes the same sum of S and sum of R; they are equal
//! when every pair agrees, and differ (but for a 2^-64 chance) when any
//! pair does not. Element types and collective kinds are in every header,
//! which every rank sees from every rank, so those mismatches fail every
//! rank directly.

use std::task::Poll;

use braid_core::comm::OfferData;
use braid_core::memory::LandingZone;
use braid_core::{Backend, Buffer, Context, Tag};
use braid_kernels::Element;
use braid_kernels::hash::{GOLDEN, mix64};
use bytes::BufMut;

use crate::error::{CollError, CollKind, Site};
use crate::handle::{Callback, Handle, spread, start, streaming};
use crate::wire::Elements;
use crate::wire::{
    DataRecv, Framed, Meta, assemble_into, assemble_slices_into, land_parts, meet_framed,
    meet_seat, met_meta, none_refused, recv_framed_all, result_zone, send_framed,
};

/// Bytes of this rank's own part copied between two polls of the
/// receives (~25 us at 10 GB/s: well inside the mpi backend's hand-off to
/// its progress thread, 100 us).
const OWN_PIECE: usize = 256 << 10;

/// Whether this rank's own part of `bytes` is copied by a helper thread
/// while the receives progress here (mpi): from 256 KiB (a hand-off
/// costs ~1 us, the copy ~15-25 us from there; `fill_threads`' share),
/// where the rank has a core beside its own (`fill_threads`, which
/// `BRAID_COPY_THREADS=1` turns off). Without it, two ranks of a 1 MiB
/// AllToAll each copied their own half (17 us on the 2-core VM) and then
/// received the other's (48 us), one after the other; with it, on the
/// 16-core host, the call went from 0.80-0.89 to 1.18-1.39 of
/// `MPI_Alltoall` (BENCHMARKS.md, forty-fourth session).
fn helper_copies(bytes: usize) -> bool {
    braid_core::memory::fill_threads(bytes.saturating_mul(2)) >= 2
}

/// Per-peer element counts and offsets of an AllToAllv.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllToAllvSpec {
    /// Elements sent to each rank.
    pub send_counts: Vec<usize>,
    /// Where each rank's elements start in the send buffer.
    pub send_offsets: Vec<usize>,
    /// Elements received from each rank.
    pub recv_counts: Vec<usize>,
    /// Where each rank's elements go in the result.
    pub recv_offsets: Vec<usize>,
    /// Length of the result.
    pub recv_len: usize,
}

impl AllToAllvSpec {
    /// Equal blocks of `block` elements to and from each of `n` ranks.
    pub fn equal(n: usize, block: usize) -> Self {
        // Saturating: an impossible size fails validation, not here.
        let offs: Vec<usize> = (0..n).map(|i| i.saturating_mul(block)).collect();
        AllToAllvSpec {
            send_counts: vec![block; n],
            send_offsets: offs.clone(),
            recv_counts: vec![block; n],
            recv_offsets: offs,
            recv_len: n.saturating_mul(block),
        }
    }

    /// Contiguous layout from counts alone.
    pub fn from_counts(send_counts: Vec<usize>, recv_counts: Vec<usize>) -> Self {
        let prefix = |c: &[usize]| {
            let mut o = Vec::with_capacity(c.len());
            let mut acc = 0usize;
            for x in c {
                o.push(acc);
                acc = acc.saturating_add(*x);
            }
            (o, acc)
        };
        let (send_offsets, _) = prefix(&send_counts);
        let (recv_offsets, recv_len) = prefix(&recv_counts);
        AllToAllvSpec {
            send_counts,
            send_offsets,
            recv_counts,
            recv_offsets,
            recv_len,
        }
    }

    fn validate(&self, n: usize, send_len: usize, elem_bytes: usize) -> Result<(), String> {
        // Byte lengths are counts times the element size: never overflowing,
        // and within what one allocation may span (isize::MAX bytes).
        if self
            .recv_len
            .checked_mul(elem_bytes)
            .is_none_or(|b| b > isize::MAX as usize)
        {
            return Err(format!(
                "a result of {} elements of {elem_bytes} bytes is larger than one allocation may be",
                self.recv_len
            ));
        }
        for (name, v) in [
            ("send_counts", &self.send_counts),
            ("send_offsets", &self.send_offsets),
            ("recv_counts", &self.recv_counts),
            ("recv_offsets", &self.recv_offsets),
        ] {
            if v.len() != n {
                return Err(format!("{name} has {} entries for {n} ranks", v.len()));
            }
        }
        for p in 0..n {
            let end = self.send_offsets[p].checked_add(self.send_counts[p]);
            if end.is_none_or(|e| e > send_len) {
                return Err(format!(
                    "send slice for rank {p} ({} + {}) is outside the send buffer of {send_len}",
                    self.send_offsets[p], self.send_counts[p]
                ));
            }
            let end = self.recv_offsets[p].checked_add(self.recv_counts[p]);
            if end.is_none_or(|e| e > self.recv_len) {
                return Err(format!(
                    "receive slice for rank {p} ({} + {}) is outside the result of {}",
                    self.recv_offsets[p], self.recv_counts[p], self.recv_len
                ));
            }
        }
        if self.recv_in_rank_order() {
            // Laid out in rank order (every AllToAll, and most AllToAllv):
            // no two slices overlap, nothing to sort.
            return Ok(());
        }
        match overlapping(&self.recv_offsets, &self.recv_counts) {
            Some((a, b)) => Err(format!("receive slices of ranks {a} and {b} overlap")),
            None => Ok(()),
        }
    }
}

/// Two ranks whose non-empty ranges (`offsets[p]` .. `offsets[p] +
/// counts[p]`, each already checked to lie in its buffer) overlap, if
/// any: receives into them would write the same bytes.
pub(crate) fn overlapping(offsets: &[usize], counts: &[usize]) -> Option<(usize, usize)> {
    let mut regions: Vec<(usize, usize, usize)> = (0..counts.len().min(offsets.len()))
        .filter(|p| counts[*p] > 0)
        .map(|p| (offsets[p], offsets[p].saturating_add(counts[p]), p))
        .collect();
    regions.sort_unstable();
    regions
        .windows(2)
        .find(|w| w[1].0 < w[0].1)
        .map(|w| (w[0].2, w[1].2))
}

impl AllToAllvSpec {
    /// Whether the non-empty receive slices follow each other in rank
    /// order without overlap (each ends at or before the next begins).
    fn recv_in_rank_order(&self) -> bool {
        let mut end = 0usize;
        for (o, c) in self.recv_offsets.iter().zip(&self.recv_counts) {
            if *c == 0 {
                continue;
            }
            if *o < end {
                return false;
            }
            end = o.saturating_add(*c);
        }
        true
    }
}

/// An AllToAll(v)'s layout as the core reads it: equal blocks (AllToAll:
/// nothing to allocate or check per peer) or a caller's spec.
enum Layout {
    Equal { n: usize, block: usize },
    Given(AllToAllvSpec),
}

impl Layout {
    /// The collective this layout makes: equal blocks are AllToAll,
    /// given counts AllToAllv (errors name the one the user called).
    fn kind(&self) -> CollKind {
        match self {
            Layout::Equal { .. } => CollKind::AllToAll,
            Layout::Given(_) => CollKind::AllToAllv,
        }
    }

    /// (offset, count) of what this rank sends rank `p`.
    fn send(&self, p: usize) -> (usize, usize) {
        match self {
            Layout::Equal { block, .. } => (p * block, *block),
            Layout::Given(s) => (s.send_offsets[p], s.send_counts[p]),
        }
    }

    /// (offset, count) of what this rank receives from rank `p`.
    fn recv(&self, p: usize) -> (usize, usize) {
        match self {
            Layout::Equal { block, .. } => (p * block, *block),
            Layout::Given(s) => (s.recv_offsets[p], s.recv_counts[p]),
        }
    }

    fn recv_len(&self) -> usize {
        match self {
            Layout::Equal { n, block } => n * block,
            Layout::Given(s) => s.recv_len,
        }
    }

    /// Checks the layout against `n` ranks and a send buffer of
    /// `send_len` elements of `elem_bytes`.
    fn validate(&self, n: usize, send_len: usize, elem_bytes: usize) -> Result<(), String> {
        match self {
            Layout::Equal { n: k, block } => {
                let total = k.checked_mul(*block);
                // The result is as long as the send buffer, which exists:
                // it fits one allocation.
                if send_len % n != 0 {
                    return Err(format!(
                        "{send_len} elements do not split into {n} equal blocks"
                    ));
                }
                if *k != n || total != Some(send_len) {
                    return Err(format!("{send_len} elements are not {n} blocks of {block}"));
                }
                Ok(())
            }
            Layout::Given(s) => s.validate(n, send_len, elem_bytes),
        }
    }

    /// This rank's two count digests (see the module doc).
    fn digests(&self, me: u32, n: u32) -> (u64, u64) {
        let mut sent = 0u64;
        let mut recv = 0u64;
        for p in 0..n {
            let (s, r) = (self.send(p as usize).1, self.recv(p as usize).1);
            sent = sent.wrapping_add(pair_hash(me, p, s));
            recv = recv.wrapping_add(pair_hash(p, me, r));
        }
        (sent, recv)
    }
}

/// The hash of one (source, destination, count) claim: splitmix64's
/// finaliser applied twice, so that every input bit moves every output bit.
fn pair_hash(src: u32, dst: u32, count: usize) -> u64 {
    let mix = |z: u64| mix64(z.wrapping_add(GOLDEN));
    mix(mix((u64::from(src) << 32) | u64::from(dst)) ^ count as u64)
}

/// Starts an AllToAllv whose result is laid out by `spec.recv_offsets`
/// in one vector (one copy of every received element, but for the large
/// parts that land in place over tcp and mpi).
pub fn start_alltoallv<T: Element>(
    ctx: &Context,
    send: impl Into<Elements<T>>,
    spec: AllToAllvSpec,
    callback: Option<Callback>,
) -> Handle<Vec<T>> {
    start_one_vector(ctx, send.into(), Layout::Given(spec), callback, Vec::new())
}

/// Starts an AllToAll ([`alltoall`]'s core): `send` holds N equal blocks
/// and block p goes to rank p; the handle yields the blocks received, in
/// rank order, in one vector. It pairs with the peers' [`alltoall`] and
/// [`alltoall_into`]; an AllToAllv of equal counts is another collective
/// (a mismatch). A length that does not split into N blocks fails the
/// call, and the job with it: the peers would wait for this rank's blocks.
pub fn start_alltoall<T: Element>(
    ctx: &Context,
    send: impl Into<Elements<T>>,
    callback: Option<Callback>,
) -> Handle<Vec<T>> {
    let send: Elements<T> = send.into();
    let layout = equal_layout(ctx, &send);
    start_one_vector(ctx, send, layout, callback, Vec::new())
}

/// The one-vector forms' core: the exchange, its result laid out in `out`
/// (its memory reused where it holds enough). Between in-process ranks
/// the parts are met and copied in (each element written once). Over
/// messages (tcp, mpi) the result is a landing zone first: `out` where it
/// already holds the result's length (an `_into` call that reuses its
/// vector), else a fresh vector's unwritten capacity (nothing zeroed
/// first). A large part received after its receive is posted is written
/// straight into its place by the transport (`recv_landing`), and only
/// the rest is copied (this rank's own part, small parts, parts that
/// arrived early).
fn start_one_vector<T: Element>(
    ctx: &Context,
    send: Elements<T>,
    layout: Layout,
    callback: Option<Callback>,
    mut out: Vec<T>,
) -> Handle<Vec<T>> {
    let site = Site::next(ctx, layout.kind());
    let op = site.op;
    let comm = ctx.comm().clone();
    start(ctx, site.coll, op, callback, async move {
        let n = comm.nranks();
        let sz = std::mem::size_of::<T>();
        layout
            .validate(n as usize, send.len(), sz)
            .map_err(|d| site.invalid(d))?;
        let len = layout.recv_len();
        if comm.backend() == Backend::Local {
            meet_into(comm.as_ref(), site, &send, &layout, &mut out).await?;
            return Ok(out);
        }
        let zone = result_zone(site, out, len)?;
        let parts = exchange(&comm, site, send, &layout, Some(&zone)).await?;
        spread(len * sz).await;
        land(site, parts, &layout, zone)
    })
}

/// The result in the zone's vector (see [`land_parts`]).
fn land<T: Element>(
    site: Site,
    parts: Vec<Elements<T>>,
    layout: &Layout,
    zone: LandingZone<T>,
) -> Result<Vec<T>, CollError> {
    let placed = parts
        .into_iter()
        .enumerate()
        .map(|(p, part)| (layout.recv(p).0, part.buffer().clone()))
        .collect();
    land_parts(site, placed, zone)
}

/// This rank's offer at an in-process meeting: its send buffer once, rank
/// p's share its byte range (`spec.send(p)`), none for itself.
fn offer_ranges(spec: &Layout, me: u32, n: u32, buf: &Buffer, sz: usize) -> OfferData {
    OfferData::ranges(buf, n, |p| {
        if p == me {
            0..0
        } else {
            let (o, c) = spec.send(p as usize);
            o * sz..(o + c) * sz
        }
    })
}

/// The one-vector forms between in-process ranks: the ranks meet, each
/// offering its send buffer in per-peer ranges, and every part is copied
/// from its sender's memory straight into its place in `out` (laid out as
/// `spec` says, gaps zeroed; large copies spread over this rank's cores).
/// No handle of another rank's buffer is taken: with ranks on cores of
/// their own, each such handle moved its count's cache line between them
/// (at 8 bytes, most of what an AllToAll cost beyond a barrier). Checks
/// as `exchange` does: element type and each part's length as they come,
/// then the digests of every pair's counts.
async fn meet_into<T: Element>(
    comm: &dyn braid_core::Communicator,
    site: Site,
    send: &Elements<T>,
    spec: &Layout,
    out: &mut Vec<T>,
) -> Result<(), CollError> {
    let n = comm.nranks();
    let me = site.rank;
    let sz = std::mem::size_of::<T>();
    let (so, sc) = spec.send(me as usize);
    let (ro, self_recv) = spec.recv(me as usize);
    if sc != self_recv {
        return Err(site.invalid(format!(
            "its counts send {sc} elements to itself but receive {self_recv} from itself"
        )));
    }
    let (mut sent_sum, mut recv_sum) = spec.digests(me, n);
    let meta = Meta::new(site.coll, T::DTYPE).count(sent_sum).seq(recv_sum);
    let buf = send.buffer();
    // (Inside `send`: `spec` was validated against its length.)
    let own = buf.as_slice().get(so * sz..(so + sc) * sz).ok_or_else(|| {
        site.invalid(format!(
            "its own part (elements {so}..{}) lies outside its {} elements",
            so + sc,
            send.len()
        ))
    })?;
    let offer = offer_ranges(spec, me, n, buf, sz);
    let seat = match meet_seat(comm, site, Tag::new(site.op, 0), meta, offer).await? {
        Ok(seat) => seat,
        Err(_) => {
            return Err(site.comm(braid_core::CommError::Protocol {
                rank: me,
                peer: None,
                detail: "in-process ranks could not meet".into(),
            }));
        }
    };
    let mut placed: Vec<(usize, &[u8])> = Vec::with_capacity(n as usize);
    placed.push((ro, own));
    let mut first_err = None;
    for m in seat.offers() {
        let m = m.map_err(|e| site.comm(e))?;
        let meta = met_meta(site, &m)?;
        if meta.dtype != T::DTYPE {
            let d = format!(
                "element type {} here, {} on rank {}",
                T::DTYPE,
                meta.dtype,
                m.src
            );
            return Err(site.mismatch(m.src, d));
        }
        sent_sum = sent_sum.wrapping_add(meta.count);
        recv_sum = recv_sum.wrapping_add(meta.seq);
        let (o, want) = spec.recv(m.src as usize);
        let got = m.bytes();
        if got.len() != want * sz {
            let d = format!(
                "rank {} sends {} elements, this rank expects {want}",
                m.src,
                got.len() / sz.max(1)
            );
            first_err.get_or_insert(site.mismatch(m.src, d));
        } else {
            placed.push((o, got));
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    if sent_sum != recv_sum {
        return Err(site.disagreement("another rank's per-peer counts disagree with its peer's"));
    }
    spread(spec.recv_len() * sz).await;
    assemble_slices_into(site, &placed, spec.recv_len(), out)
}

/// Starts an AllToAllv whose result is one [`Elements`] per source rank,
/// in rank order: no copy at all between in-process ranks, and none of
/// received bytes over a network (what a consumer that works per peer,
/// such as a shuffle, wants). `spec.recv_offsets` and `recv_len` are
/// validated but do not shape the result.
pub fn start_alltoallv_parts<T: Element>(
    ctx: &Context,
    send: impl Into<Elements<T>>,
    spec: AllToAllvSpec,
    callback: Option<Callback>,
) -> Handle<Vec<Elements<T>>> {
    start_parts(
        ctx,
        send.into(),
        Layout::Given(spec),
        callback,
        |parts, _, _| parts,
    )
}

/// The one AllToAllv core: validate, exchange per-peer parts (checking
/// every pair's counts through the digests); `finish` shapes the result.
fn start_parts<T: Element, R: Send + 'static>(
    ctx: &Context,
    send: Elements<T>,
    layout: Layout,
    callback: Option<Callback>,
    finish: impl FnOnce(Vec<Elements<T>>, Layout, Site) -> R + Send + 'static,
) -> Handle<R> {
    let site = Site::next(ctx, layout.kind());
    let op = site.op;
    let comm = ctx.comm().clone();
    start(ctx, site.coll, op, callback, async move {
        let n = comm.nranks();
        layout
            .validate(n as usize, send.len(), std::mem::size_of::<T>())
            .map_err(|d| site.invalid(d))?;
        let parts = exchange(&comm, site, send, &layout, None).await?;
        Ok(finish(parts, layout, site))
    })
}

/// Sends every peer its slice and receives every peer's, checking each
/// pair's counts and element type; returns the parts by source rank (this
/// rank's own part is a slice of `send`).
///
/// In-process ranks meet instead (`Communicator::meet`): each deposits its
/// per-peer slices with its two digests in the header, and takes its part
/// from every peer; a part's length is checked against `recv_counts`, and
/// the digest sums catch the pairs whose sender is wrong.
///
/// Over messages with a `zone`, each peer's part is offered its place in
/// the zone (`recv_landing`; the part then views it), and this rank's own
/// part is copied there while the others arrive.
async fn exchange<T: Element>(
    comm: &std::sync::Arc<dyn braid_core::Communicator>,
    site: Site,
    send: Elements<T>,
    spec: &Layout,
    zone: Option<&LandingZone<T>>,
) -> Result<Vec<Elements<T>>, CollError> {
    let n = comm.nranks();
    let me = site.rank;
    let sz = std::mem::size_of::<T>();
    let tag = Tag::new(site.op, 0);
    let (so, sc) = spec.send(me as usize);
    let self_recv = spec.recv(me as usize).1;
    if sc != self_recv {
        return Err(site.invalid(format!(
            "its counts send {sc} elements to itself but receive {self_recv} from itself"
        )));
    }
    let (mut sent_sum, mut recv_sum) = spec.digests(me, n);
    let mut parts: Vec<Option<Elements<T>>> = (0..n).map(|_| None).collect();
    parts[me as usize] = Some(send.slice(so, sc));
    let buf = send.buffer().clone();
    let slice_for = |p: u32| {
        let (o, c) = spec.send(p as usize);
        buf.slice(o * sz..(o + c) * sz)
    };
    let wrong_dtype = |p: u32, f: &Framed| {
        (f.meta.dtype != T::DTYPE).then(|| {
            format!(
                "element type {} here, {} on rank {p}",
                T::DTYPE,
                f.meta.dtype
            )
        })
    };
    // A part whose length is not what this rank expects from its sender.
    let wrong_length = |p: u32, f: &Framed| {
        let want = spec.recv(p as usize).1;
        (f.data.len() != want * sz).then(|| {
            format!(
                "rank {p} sends {} elements, this rank expects {want}",
                f.data.len() / sz.max(1)
            )
        })
    };
    let mut first_err = None;
    let meta = Meta::new(site.coll, T::DTYPE).count(sent_sum).seq(recv_sum);
    let slices = offer_ranges(spec, me, n, &buf, sz);
    let check = |p: u32, f: &Framed| wrong_dtype(p, f).map_or(Ok(()), |d| Err(site.mismatch(p, d)));
    match meet_framed(comm.as_ref(), site, tag, meta, slices, check).await? {
        Ok(frames) => {
            for (p, f) in frames {
                sent_sum = sent_sum.wrapping_add(f.meta.count);
                recv_sum = recv_sum.wrapping_add(f.meta.seq);
                match wrong_length(p, &f) {
                    Some(d) => {
                        first_err.get_or_insert(site.mismatch(p, d));
                    }
                    None => parts[p as usize] = Some(Elements::from_buffer(f.data)),
                }
            }
        }
        Err(_) => {
            let digests = {
                let mut d = [0u8; 16];
                d[..8].copy_from_slice(&sent_sum.to_le_bytes());
                d[8..].copy_from_slice(&recv_sum.to_le_bytes());
                d
            };
            let mut sends = Vec::new();
            for p in (0..n).filter(|p| *p != me) {
                // count: what this rank sends p; seq: what it expects from p.
                let meta = Meta::new(site.coll, T::DTYPE)
                    .count(spec.send(p as usize).1 as u64)
                    .seq(spec.recv(p as usize).1 as u64);
                sends.push(send_framed(
                    comm.as_ref(),
                    site,
                    p,
                    tag,
                    meta,
                    &digests,
                    slice_for(p),
                ));
            }
            let peers = (0..n).filter(|p| *p != me);
            // Every part's size is known: a large one's receive is posted
            // with its header's, into its place in the result where there
            // is one.
            let data = peers
                .clone()
                .map(|p| {
                    let (o, c) = spec.recv(p as usize);
                    DataRecv::for_part(zone, o * sz, c * sz)
                })
                .collect();
            none_refused(&sends)?;
            let frames = recv_framed_all(comm.as_ref(), site, peers, tag, data, |_, _| Ok(()));
            // This rank's own part goes to its place while the others
            // arrive (the receives are posted at the first poll), a piece
            // at a time with the receives polled between pieces: a
            // transport that progresses in the polling task (mpi) goes on
            // receiving there, rather than in a progress thread that
            // takes over from a task gone quiet (a third busy thread
            // where ranks share cores, whose copies then queue behind this
            // one).
            let mut frames = std::pin::pin!(frames);
            let mut got = None;
            if let Poll::Ready(r) = futures::poll!(frames.as_mut()) {
                got = Some(r);
            }
            // This rank's own part and its place in the result.
            let own_place = match (got.is_none(), zone, parts[me as usize].as_ref()) {
                (true, Some(z), Some(own)) => {
                    let (o, c) = spec.recv(me as usize);
                    (c > 0)
                        .then(|| z.landing(o * sz, c * sz))
                        .flatten()
                        .filter(|l| l.len() == own.buffer().len())
                        .map(|l| (l, own.buffer().clone()))
                }
                _ => None,
            };
            if let Some((mut l, own)) = own_place {
                if comm.backend() == Backend::Mpi && helper_copies(own.len()) {
                    // Over MPI the receives progress in this thread (a pass
                    // copies a shared-memory message inside `MPI_Imrecv`): a
                    // helper copies this rank's own part meanwhile, where the
                    // rank has a core to spare for it.
                    let copy = braid_core::par::spawn(move || {
                        l.put_slice(own.as_slice());
                        l.into_buffer()
                    });
                    let r = frames.as_mut().await;
                    if let Ok(view) = copy.join() {
                        parts[me as usize] = Some(Elements::from_buffer(view));
                    }
                    got = Some(r);
                } else {
                    for piece in own.as_slice().chunks(OWN_PIECE) {
                        l.put_slice(piece);
                        if got.is_none()
                            && l.remaining_mut() > 0
                            && let Poll::Ready(r) = futures::poll!(frames.as_mut())
                        {
                            got = Some(r);
                        }
                    }
                    if let Ok(view) = l.into_buffer() {
                        parts[me as usize] = Some(Elements::from_buffer(view));
                    }
                }
            }
            let frames = match got {
                Some(r) => r?,
                None => frames.await?,
            };
            for (p, f) in frames {
                let want = spec.recv(p as usize).1;
                let sent = spec.send(p as usize).1;
                let word = |i: usize| {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(&f.user_meta[i * 8..i * 8 + 8]);
                    u64::from_le_bytes(w)
                };
                let err = if f.user_meta.len() != 16 {
                    Some(format!("rank {p} sent a malformed AllToAll header"))
                } else if let Some(d) = wrong_dtype(p, &f) {
                    Some(d)
                } else if f.meta.count != want as u64 {
                    Some(format!(
                        "rank {p} sends {} elements, this rank expects {want}",
                        f.meta.count
                    ))
                } else if f.meta.seq != sent as u64 {
                    Some(format!(
                        "this rank sends {sent} elements to rank {p}, which expects {}",
                        f.meta.seq
                    ))
                } else {
                    // The header's count was checked; the data must match it too.
                    wrong_length(p, &f)
                };
                if f.user_meta.len() == 16 {
                    sent_sum = sent_sum.wrapping_add(word(0));
                    recv_sum = recv_sum.wrapping_add(word(1));
                }
                match err {
                    Some(d) => {
                        first_err.get_or_insert(site.mismatch(p, d));
                    }
                    None => parts[p as usize] = Some(Elements::from_buffer(f.data)),
                }
            }
            for s in sends {
                s.await?;
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    if sent_sum != recv_sum {
        return Err(site.disagreement("another rank's per-peer counts disagree with its peer's"));
    }
    parts
        .into_iter()
        .enumerate()
        .map(|(p, x)| x.ok_or_else(|| site.mismatch(p as u32, "no part received")))
        .collect()
}

/// AllToAllv: sends `spec.send_counts[p]` elements at `send_offsets[p]` to
/// each rank p; returns the elements received, laid out by `recv_offsets`.
pub async fn alltoallv<T: Element>(
    ctx: &Context,
    send: impl Into<Elements<T>>,
    spec: AllToAllvSpec,
) -> Result<Vec<T>, CollError> {
    let send: Elements<T> = send.into();
    let bytes = send.buffer().len();
    streaming(ctx, bytes, |cb| start_alltoallv(ctx, send, spec, cb)).await
}

/// AllToAllv with the result as one [`Elements`] per source rank (see
/// [`start_alltoallv_parts`]): zero-copy between in-process ranks.
pub async fn alltoallv_parts<T: Element>(
    ctx: &Context,
    send: impl Into<Elements<T>>,
    spec: AllToAllvSpec,
) -> Result<Vec<Elements<T>>, CollError> {
    let send: Elements<T> = send.into();
    let bytes = send.buffer().len();
    streaming(ctx, bytes, |cb| start_alltoallv_parts(ctx, send, spec, cb)).await
}

/// AllToAllv into `out`: [`alltoallv`]'s result, written into `out`'s
/// memory where it is large enough (its old contents are replaced). A
/// loop that passes the same vector each time writes into memory it has
/// already touched, as MPI writes into a receive buffer the caller keeps;
/// a fresh result vector per call costs the OS's zeroing of its pages,
/// about as much as the copy itself at a few MiB and more. On an error
/// `out` is left as it was, or empty where it was lent to the call
/// (between in-process ranks; over tcp or mpi once it holds the result's
/// length) or the result could not be allocated.
pub async fn alltoallv_into<T: Element>(
    ctx: &Context,
    send: impl Into<Elements<T>>,
    spec: AllToAllvSpec,
    out: &mut Vec<T>,
) -> Result<(), CollError> {
    exchange_into(ctx, send.into(), Layout::Given(spec), out).await
}

/// AllToAll: `send` holds N equal blocks; block p goes to rank p; the
/// result holds the blocks received, in rank order.
pub async fn alltoall<T: Element>(
    ctx: &Context,
    send: impl Into<Elements<T>>,
) -> Result<Vec<T>, CollError> {
    let send: Elements<T> = send.into();
    let bytes = send.buffer().len();
    streaming(ctx, bytes, |cb| start_alltoall(ctx, send, cb)).await
}

/// AllToAll into `out` (see [`alltoallv_into`] for why a reused vector).
pub async fn alltoall_into<T: Element>(
    ctx: &Context,
    send: impl Into<Elements<T>>,
    out: &mut Vec<T>,
) -> Result<(), CollError> {
    let send: Elements<T> = send.into();
    let layout = equal_layout(ctx, &send);
    exchange_into(ctx, send, layout, out).await
}

/// The `_into` forms' one body: `out` is lent to the one-vector core for
/// the call and comes back with the result, where the core can use its
/// memory: always between in-process ranks (the parts are copied into
/// it), and over messages once it holds the result's length (a landing
/// zone). Otherwise the parts core runs and its parts are copied into
/// `out` in the caller's task (after [`spread`]), `out` untouched on an
/// error of the exchange (emptied on one of the result's allocation).
async fn exchange_into<T: Element>(
    ctx: &Context,
    send: Elements<T>,
    layout: Layout,
    out: &mut Vec<T>,
) -> Result<(), CollError> {
    let bytes = send.buffer().len();
    if ctx.comm().backend() == Backend::Local || out.len() >= layout.recv_len() {
        let mem = std::mem::take(out);
        *out = streaming(ctx, bytes, |cb| {
            start_one_vector(ctx, send, layout, cb, mem)
        })
        .await?;
        return Ok(());
    }
    let (parts, layout, site) = streaming(ctx, bytes, |cb| {
        start_parts(ctx, send, layout, cb, |p, l, s| (p, l, s))
    })
    .await?;
    spread(layout.recv_len() * std::mem::size_of::<T>()).await;
    let placed = parts
        .iter()
        .enumerate()
        .map(|(p, e)| (layout.recv(p).0, e.buffer().clone()))
        .collect();
    assemble_into(site, placed, layout.recv_len(), out)
}

/// AllToAll's layout: N equal blocks of `send`. A length that does not
/// split fails in the core's validation (`Layout::validate`), which fails
/// the job too, as the other ranks would wait for this rank's blocks.
fn equal_layout<T: Element>(ctx: &Context, send: &Elements<T>) -> Layout {
    let n = ctx.nranks() as usize;
    Layout::Equal {
        n,
        block: send.len() / n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (the test needs no crate for it).
    fn next(s: &mut u64) -> u64 {
        *s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *s >> 33
    }

    fn sums(specs: &[AllToAllvSpec]) -> (u64, u64) {
        specs
            .iter()
            .enumerate()
            .map(|(r, s)| {
                let n = s.send_counts.len() as u32;
                Layout::Given(s.clone()).digests(r as u32, n)
            })
            .fold((0, 0), |(a, b), (x, y)| {
                (a.wrapping_add(x), b.wrapping_add(y))
            })
    }

    #[test]
    fn digests_agree_exactly_when_every_pair_agrees() {
        let mut seed = 7u64;
        for n in [1usize, 2, 3, 4, 5, 8] {
            for _ in 0..50 {
                // counts[r][s]: what r sends s.
                let counts: Vec<Vec<usize>> = (0..n)
                    .map(|_| (0..n).map(|_| next(&mut seed) as usize % 5).collect())
                    .collect();
                let spec = |c: &Vec<Vec<usize>>, r: usize| {
                    AllToAllvSpec::from_counts(c[r].clone(), (0..n).map(|s| c[s][r]).collect())
                };
                let specs: Vec<_> = (0..n).map(|r| spec(&counts, r)).collect();
                let (a, b) = sums(&specs);
                assert_eq!(a, b, "{n} ranks: matched calls must agree");
                // One receiver expects one more element from one sender.
                let (r, s) = (next(&mut seed) as usize % n, next(&mut seed) as usize % n);
                let mut bad = specs.clone();
                bad[s].recv_counts[r] += 1;
                let (a, b) = sums(&bad);
                assert_ne!(a, b, "{n} ranks: pair ({r}, {s}) disagrees");
                // Two receivers swap what they expect from one sender.
                if n >= 3 && counts[0][1] != counts[0][2] {
                    let mut bad = specs.clone();
                    bad[1].recv_counts[0] = counts[0][2];
                    bad[2].recv_counts[0] = counts[0][1];
                    let (a, b) = sums(&bad);
                    assert_ne!(a, b, "{n} ranks: swapped expectations");
                }
            }
        }
    }

    #[test]
    fn a_result_larger_than_an_allocation_is_refused() {
        // 2^60 u64s is 2^63 bytes: it fits usize but not one allocation
        // (isize::MAX), where `Vec::with_capacity` would panic.
        let mut spec = AllToAllvSpec::equal(1, 0);
        spec.recv_len = 1 << 60;
        let e = spec.validate(1, 0, 8).unwrap_err();
        assert!(e.contains("larger than one allocation"), "{e}");
        spec.recv_len = usize::MAX;
        assert!(spec.validate(1, 0, 8).is_err());
        spec.recv_len = 1 << 20;
        assert_eq!(spec.validate(1, 0, 8), Ok(()));
    }
}
