//! AllGather: every rank ends with every rank's chunks.
//!
//! Streaming: chunks are inserted as they arrive (`insert`), each is sent
//! to every other rank at once; `insert_finished` sends each peer a finish
//! marker carrying the number of chunks sent, so a receiver knows when a
//! peer's stream is complete (no receive is posted for a message that may
//! not come); `insert_last` sends a rank's last chunk flagged as its
//! finish, so a one-chunk AllGather costs one message per peer.
//! Extraction is ordered by (rank, seq) or left in arrival order.
//!
//! In-process ranks (`Communicator::meets`) end their streams at a
//! meeting instead of with markers: each rank offers its last chunk (held
//! back from `insert_last` unless it carries user metadata) and the number
//! of chunks it sent as messages, and receives exactly that many from each
//! peer. A one-chunk AllGather is then one meeting and no messages. The
//! messages travel on a second OpId (a message for an operation whose
//! meeting waits says that its sender is in another collective):
//!
//! ```text
//!   insert(c0..ck)  ──► messages at (op + 1, 0)
//!   insert_last(cl) ──► held; the core arrives at (op, 0) at once,
//!                       offering cl and "k+1 chunks by message"
//!   every rank here ──► each reads every peer's last chunk and count,
//!                       then receives that many messages from it
//! ```
//!
//! Algorithm: direct (each rank sends its chunks to the N-1 others).
//! Cost per rank: (N-1) * (alpha + m * beta) sent and received, one step of
//! latency; the same bytes as a ring with N-2 fewer steps. On the local
//! backend the chunks are shared, not copied.
//!
//! One-shot: [`allgather()`] and [`allgather_parts`] (one array per rank,
//! as `MPI_Allgatherv`) exchange one frame per peer in one step, and
//! in-process ranks meet instead (`Communicator::meet`: a deposit and a
//! take per rank, no messages; the parts form copies nothing, the
//! one-vector form copies each part once, from where it lies into its
//! place, without taking a handle of it: at 8 B between 3 and 4 ranks on
//! the 2-core VM that took 0.6-0.9 us off 2.6-4.7, BENCHMARKS.md,
//! seventy-eighth session). A one-shot call is not the streaming
//! [`AllGather`]: ranks that mix the two fail with a mismatch.

use std::sync::{Arc, Mutex};

use braid_core::comm::Communicator;
use braid_core::{Buffer, Context, Event, PackedData, Rank, Tag};
use braid_kernels::{DType, Element};
use futures::FutureExt as _;
use futures::future::BoxFuture;

use crate::error::{CollError, CollKind, Site};
use crate::handle::{
    Callback, Driven, Handle, Left, claim, left_unfinished, start, start_then, streaming,
    until_abandoned,
};
use crate::wire::{
    DataRecv, Elements, FINISH, Framed, INLINE_MAX, LAST, Meta, ONE_SHOT, assemble_into,
    assemble_slices_into, exchange_framed_landing, land_parts, meet_seat, met_meta,
    recv_counted_all, recv_streams_all, result_zone, send_finish, send_framed,
};
use braid_core::comm::OfferData;
use braid_core::memory::LandingZone;

/// How extracted chunks are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtractOrder {
    /// By source rank, then by each chunk's seq.
    RankSeq,
    /// In the order they arrived (this rank's own first).
    Arrival,
}

/// One gathered chunk.
#[derive(Debug, Clone)]
pub struct Gathered {
    /// The rank that inserted it.
    pub rank: Rank,
    /// Its seq on that rank.
    pub seq: u64,
    /// The chunk.
    pub data: PackedData,
}

impl Gathered {
    /// Rank `rank`'s chunk as its frame brought it.
    fn framed(rank: Rank, f: Framed) -> Self {
        Gathered {
            rank,
            seq: f.meta.seq,
            data: PackedData {
                metadata: f.user_meta,
                data: f.data,
            },
        }
    }
}

#[derive(Default)]
struct State {
    inserted: u64,
    /// The seqs this rank inserted: each once.
    seqs: std::collections::HashSet<u64>,
    /// Bytes inserted here (how the wait for the others is chosen).
    bytes: usize,
    finished: bool,
    local: Vec<Gathered>,
    sends: Vec<BoxFuture<'static, Result<(), CollError>>>,
    /// Chunks sent as messages.
    sent: u64,
    /// The last chunk (seq, data), held for the meeting where ranks meet.
    held: Option<(u64, Buffer)>,
    /// How this rank's part ended without `insert_finished` (extracted or
    /// dropped first): the core fails instead of waiting for it.
    abandoned: Option<Left>,
}

/// This rank's part of an AllGather: what it inserted, and the event set
/// when it finished inserting. Extracted or dropped before it finished, it
/// is abandoned: without that the core would wait for `insert_finished`
/// for ever, and every peer for this rank's last chunk; the core fails
/// instead, and with it the job (`site.invalid`).
struct Part {
    state: Arc<Mutex<State>>,
    local_done: Event,
}

impl Part {
    fn abandon(&self, how: Left) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.finished {
            return;
        }
        s.finished = true;
        s.abandoned = Some(how);
        drop(s);
        self.local_done.set();
    }
}

impl Drop for Part {
    fn drop(&mut self) {
        self.abandon(Left::Dropped);
    }
}

/// Whether a chunk is its rank's last.
#[derive(Debug, Clone, Copy)]
enum Stream {
    Continues,
    Ends,
}

/// A streaming AllGather (one instance; create a new one per use).
pub struct AllGather {
    site: Site,
    dtype: DType,
    /// Where chunks travel as messages.
    msgs: Tag,
    ctx: Context,
    part: Part,
    done: Event,
    handle: Handle<Vec<Gathered>>,
    /// The core, not yet running, where `extract` will drive it in its own
    /// task (made on the engine's runtime without a callback); anything
    /// that needs it to run without `extract` (`is_done`,
    /// `extract_blocking`, a drop) hands it to the engine.
    core: Mutex<Option<Driven>>,
}

impl AllGather {
    /// Starts an AllGather of untyped chunks; `callback` runs when every
    /// rank's chunks have arrived here.
    pub fn new(ctx: &Context, callback: Option<Callback>) -> Self {
        Self::with_dtype(ctx, DType::Bytes, callback)
    }

    pub(crate) fn with_dtype(ctx: &Context, dtype: DType, callback: Option<Callback>) -> Self {
        let site = Site::next(ctx, CollKind::AllGather);
        let op = site.op;
        // Where ranks meet, chunks travel on an OpId of their own: the
        // meeting's OpId takes no messages while it waits (a message there
        // says its sender is in another collective).
        let msgs = if ctx.comm().meets() {
            Tag::new(ctx.next_op_id(), 0)
        } else {
            Tag::new(op, 0)
        };
        let state = Arc::new(Mutex::new(State::default()));
        let local_done = Event::new();
        let done = Event::new();
        let comm = ctx.comm().clone();
        let (st, ld, d2) = (state.clone(), local_done.clone(), done.clone());
        let progress = ctx.progress();
        let defer = callback.is_none() && progress.is_current();
        let start = move || {
            start_then(
                ctx,
                CollKind::AllGather,
                op,
                callback,
                Some(d2),
                async move {
                    let n = comm.nranks();
                    let me = site.rank;
                    let tag = Tag::new(op, 0);
                    let check = |p: Rank, d: DType| check_dtype(site, dtype, p, d);
                    if comm.meets() {
                        ld.wait().await;
                        let left = st.lock().unwrap_or_else(|p| p.into_inner()).abandoned;
                        if let Some(how) = left {
                            return Err(left_unfinished(comm.as_ref(), site, how).await);
                        }
                        let (local, sends, sent, held) = {
                            let mut s = st.lock().unwrap_or_else(|p| p.into_inner());
                            (
                                std::mem::take(&mut s.local),
                                std::mem::take(&mut s.sends),
                                s.sent,
                                s.held.take(),
                            )
                        };
                        let remote =
                            gather_met(comm.as_ref(), site, msgs, dtype, sent, held).await?;
                        futures::future::try_join_all(sends).await?;
                        let mut all = local;
                        all.extend(remote);
                        return Ok(all);
                    }
                    let mut remote = Vec::new();
                    let peers = (0..n).filter(|p| *p != me);
                    let recv = recv_streams_all(comm.as_ref(), site, peers, tag, |p, f| {
                        if f.meta.flags & ONE_SHOT != 0 {
                            return Err(site.mismatch(
                            p,
                            format!("rank {p} is in a one-shot allgather, this rank in a streaming AllGather"),
                        ));
                        }
                        check(p, f.meta.dtype)?;
                        remote.push(Gathered::framed(p, f));
                        Ok(())
                    });
                    // A part abandoned here fails at once, not after the
                    // peers' streams end: theirs may be abandoned too.
                    let left = || st.lock().unwrap_or_else(|p| p.into_inner()).abandoned;
                    let fins = until_abandoned(recv, &ld, comm.as_ref(), site, left).await?;
                    for (p, fin) in fins {
                        check(p, fin.dtype)?;
                    }
                    ld.wait().await;
                    if let Some(how) = left() {
                        return Err(left_unfinished(comm.as_ref(), site, how).await);
                    }
                    let (local, sends) = {
                        let mut s = st.lock().unwrap_or_else(|p| p.into_inner());
                        (std::mem::take(&mut s.local), std::mem::take(&mut s.sends))
                    };
                    futures::future::try_join_all(sends).await?;
                    let mut all = local;
                    all.extend(remote);
                    Ok(all)
                },
            )
        };
        let (handle, core) = if defer { claim(start) } else { (start(), None) };
        AllGather {
            site,
            dtype,
            msgs,
            ctx: ctx.clone(),
            part: Part { state, local_done },
            done,
            handle,
            core: Mutex::new(core.map(|c| Driven::new(c, progress.clone()))),
        }
    }

    /// The core if it has not started; the caller drives it or drops it
    /// (which hands it to the engine).
    fn take_core(&self) -> Option<Driven> {
        self.core.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Inserts a chunk with its `seq`; it is sent to every other rank now.
    /// Each of a rank's chunks takes a seq of its own, in any order (they
    /// need not be consecutive); a seq inserted before is refused.
    pub fn insert(&self, seq: u64, data: PackedData) -> Result<(), CollError> {
        self.push(seq, data, Stream::Continues)
    }

    /// Inserts this rank's last chunk and finishes, as `insert` then
    /// `insert_finished` would, in one message per peer instead of two.
    pub fn insert_last(&self, seq: u64, data: PackedData) -> Result<(), CollError> {
        self.push(seq, data, Stream::Ends)
    }

    fn push(&self, seq: u64, data: PackedData, stream: Stream) -> Result<(), CollError> {
        let mut s = self.part.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.finished {
            return Err(self.site.invalid("insert after the stream finished"));
        }
        if !s.seqs.insert(seq) {
            return Err(self.site.invalid(format!(
                "seq {seq} inserted twice: each of a rank's chunks takes a seq of its own (extraction orders them by rank, then seq)"
            )));
        }
        let comm = self.ctx.comm();
        let meets = comm.meets();
        let flags = match stream {
            Stream::Continues => 0,
            // Where ranks meet, the meeting ends the stream.
            Stream::Ends if meets => 0,
            Stream::Ends => LAST,
        };
        if let (Stream::Ends, true, true) = (stream, meets, data.metadata.is_empty()) {
            // The meeting carries it (`gather_met`).
            s.held = Some((seq, data.data.clone()));
        } else {
            s.sent += 1;
            let meta = Meta::new(CollKind::AllGather, self.dtype)
                .flags(flags)
                .seq(seq)
                .count(data.data.len() as u64);
            for p in (0..comm.nranks()).filter(|p| *p != self.site.rank) {
                let mut f = send_framed(
                    comm.as_ref(),
                    self.site,
                    p,
                    self.msgs,
                    meta,
                    &data.metadata,
                    data.data.clone(),
                );
                // Kept only if the backend did not finish it within the
                // call. An error is kept too (the core reports it) and
                // returned now, as the shuffle's: a peer would otherwise
                // only see a count that does not match.
                match (&mut f).now_or_never() {
                    Some(Ok(())) => {}
                    Some(Err(e)) => {
                        s.sends.push(Box::pin(std::future::ready(Err(e.clone()))));
                        return Err(e);
                    }
                    None => s.sends.push(Box::pin(f)),
                }
            }
        }
        s.inserted += 1;
        s.bytes += data.data.len();
        s.local.push(Gathered {
            rank: self.site.rank,
            seq,
            data,
        });
        if let Stream::Ends = stream {
            s.finished = true;
            drop(s);
            self.finish_here();
        }
        Ok(())
    }

    /// This rank has inserted everything: the core may go on, and where
    /// ranks meet it arrives at the meeting now. A core that `extract` is
    /// to drive is polled here once (with a waker that does nothing; the
    /// meeting keeps the waker of its latest poll): otherwise this rank
    /// would arrive only when it extracts, and a peer that extracts first
    /// would wait on it, for ever if this rank first waits on that peer.
    fn finish_here(&self) {
        self.part.local_done.set();
        if self.ctx.comm().meets() {
            let mut core = self.core.lock().unwrap_or_else(|p| p.into_inner());
            if core.as_mut().is_some_and(Driven::poll_once) {
                *core = None;
            }
        }
    }

    /// Says this rank has inserted everything.
    pub fn insert_finished(&self) -> Result<(), CollError> {
        let mut s = self.part.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.finished {
            return Err(self
                .site
                .invalid("already finished (insert_finished or insert_last)"));
        }
        s.finished = true;
        if !self.ctx.comm().meets() {
            let meta = Meta::new(CollKind::AllGather, self.dtype);
            let inserted = s.inserted;
            let tag = self.msgs;
            let fin = send_finish(self.ctx.comm().as_ref(), self.site, tag, meta, |_| inserted);
            s.sends.extend(fin);
        }
        drop(s);
        self.finish_here();
        Ok(())
    }

    /// Whether every rank's chunks have arrived.
    pub fn is_done(&self) -> bool {
        // Asked before `extract`: the core must run to get there.
        drop(self.take_core());
        self.done.is_set()
    }

    /// Waits for every rank's chunks and returns them. Called before this
    /// rank finished inserting, it fails (and with it the job), as nothing
    /// could end the wait.
    pub async fn extract(self, order: ExtractOrder) -> Result<Vec<Gathered>, CollError> {
        self.part.abandon(Left::Extracted);
        let bytes = self
            .part
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .bytes;
        let progress = self.ctx.progress();
        if let Some(core) = self.take_core() {
            core.run(progress.waiting(bytes)).await;
        }
        progress.wait(&self.done, bytes).await;
        self.handle.take().map(|v| sorted(v, order))
    }

    /// Like [`AllGather::extract`], blocking the calling thread.
    pub fn extract_blocking(self, order: ExtractOrder) -> Result<Vec<Gathered>, CollError> {
        self.part.abandon(Left::Extracted);
        drop(self.take_core());
        self.handle.wait().map(|v| sorted(v, order))
    }
}

/// The streaming AllGather's end where ranks meet (see the module doc):
/// offers this rank's held last chunk and the number of chunks it `sent`
/// as messages (on `msgs`) at (op, 0), then receives every peer's messages
/// and returns
/// the peers' chunks, each peer's held one after its messages.
async fn gather_met(
    comm: &dyn Communicator,
    site: Site,
    msgs: Tag,
    dtype: DType,
    sent: u64,
    held: Option<(u64, Buffer)>,
) -> Result<Vec<Gathered>, CollError> {
    let tag = Tag::new(site.op, 0);
    let meta = Meta::new(CollKind::AllGather, dtype).count(sent);
    let (meta, offer) = match held {
        Some((seq, data)) => (meta.flags(LAST).seq(seq), OfferData::same(data)),
        None => (meta.flags(FINISH), OfferData::same(Buffer::default())),
    };
    let seat = match meet_seat(comm, site, tag, meta, offer).await? {
        Ok(seat) => seat,
        Err(_) => return Err(site.invalid("the communicator said its ranks meet, then refused")),
    };
    let n = comm.nranks() as usize;
    let mut counts = Vec::with_capacity(n.saturating_sub(1));
    let mut last = Vec::with_capacity(n.saturating_sub(1));
    for m in seat.offers() {
        let m = m.map_err(|e| site.comm(e))?;
        let p = m.src;
        let meta = met_meta(site, &m)?;
        if meta.flags & ONE_SHOT != 0 {
            return Err(site.mismatch(
                p,
                format!("rank {p} is in a one-shot allgather, this rank in a streaming AllGather"),
            ));
        }
        check_dtype(site, dtype, p, meta.dtype)?;
        counts.push((p, meta.count));
        if meta.flags & LAST != 0 {
            last.push(Gathered {
                rank: p,
                seq: meta.seq,
                data: PackedData {
                    metadata: Default::default(),
                    data: m.buffer(),
                },
            });
        }
    }
    drop(seat);
    let mut remote = Vec::with_capacity(last.len());
    recv_counted_all(comm, site, &counts, msgs, |p, f| {
        if f.meta.flags & (ONE_SHOT | LAST | FINISH) != 0 {
            return Err(site.mismatch(p, format!("rank {p} sent a chunk that ends its stream")));
        }
        check_dtype(site, dtype, p, f.meta.dtype)?;
        remote.push(Gathered::framed(p, f));
        Ok(())
    })
    .await?;
    remote.extend(last);
    Ok(remote)
}

/// Fails unless peer `p`'s element type `theirs` is `ours`.
fn check_dtype(site: Site, ours: DType, p: Rank, theirs: DType) -> Result<(), CollError> {
    if theirs == ours {
        Ok(())
    } else {
        Err(site.mismatch(p, format!("element type {ours} here, {theirs} on rank {p}")))
    }
}

fn sorted(mut v: Vec<Gathered>, order: ExtractOrder) -> Vec<Gathered> {
    if order == ExtractOrder::RankSeq {
        v.sort_by_key(|g| (g.rank, g.seq));
    }
    v
}

/// Starts a one-shot AllGather: every rank's `values` (counts may differ
/// between ranks), one [`Elements`] per rank in rank order (this rank's
/// own is `values`). Between in-process ranks nothing is copied.
pub fn start_allgather_parts<T: Element>(
    ctx: &Context,
    values: impl Into<Elements<T>>,
    callback: Option<Callback>,
) -> Handle<Vec<Elements<T>>> {
    let values: Elements<T> = values.into();
    let site = Site::next(ctx, CollKind::AllGather);
    let comm = ctx.comm().clone();
    start(ctx, site.coll, site.op, callback, async move {
        gather(comm.as_ref(), site, values, None).await
    })
}

/// Starts a one-shot AllGather whose result is one vector: every rank's
/// `values` concatenated in rank order (ranks may contribute different
/// counts). [`allgather`]'s core, for a caller that waits on the handle
/// or its callback instead of awaiting.
pub fn start_allgather<T: Element>(
    ctx: &Context,
    values: impl Into<Elements<T>>,
    callback: Option<Callback>,
) -> Handle<Vec<T>> {
    start_one_vector(ctx, values.into(), Vec::new(), callback)
}

/// The one-vector AllGather's core: the exchange, then the parts laid out
/// in `out`'s memory where it holds enough (else a fresh vector). Over
/// messages, where this rank's part is past the inline size, every peer's
/// part is received straight into the place an even layout gives it
/// (every rank as many elements as this one, as the ranks of one call
/// usually send; `recv_landing`), as AllToAll's are; where the counts
/// turn out to differ, the parts are copied into a result of the right
/// layout (a part that landed elsewhere is never taken as placed). In
/// process the parts are read where they lie and copied once.
fn start_one_vector<T: Element>(
    ctx: &Context,
    values: Elements<T>,
    mut out: Vec<T>,
    callback: Option<Callback>,
) -> Handle<Vec<T>> {
    let site = Site::next(ctx, CollKind::AllGather);
    let comm = ctx.comm().clone();
    let per_rank = values.len();
    let bytes = values.buffer().len();
    let zone = (!comm.meets() && bytes > INLINE_MAX)
        .then(|| (comm.nranks() as usize).checked_mul(per_rank))
        .flatten()
        .and_then(|n| LandingZone::reusing(std::mem::take(&mut out), n));
    start(ctx, site.coll, site.op, callback, async move {
        if comm.meets() {
            meet_into(comm.as_ref(), site, &values, &mut out).await?;
            return Ok(out);
        }
        let parts = gather(comm.as_ref(), site, values, zone.as_ref()).await?;
        let alike = parts.iter().all(|p| p.len() == per_rank);
        let mut len = 0;
        let placed: Vec<(usize, Buffer)> = parts
            .into_iter()
            .map(|p| {
                let at = len;
                len += p.len();
                (at, p.buffer().clone())
            })
            .collect();
        match zone {
            // Laid out as guessed: the landed parts are in place.
            Some(z) if alike => land_parts(site, placed, z),
            // Counts differ between ranks: parts that landed lie where an
            // even layout puts them; all are copied into a result of the
            // right layout (the zone is let go of once they are).
            Some(_) => land_parts(site, placed, result_zone(site, Vec::new(), len)?),
            None => {
                crate::handle::spread(len * std::mem::size_of::<T>()).await;
                assemble_into(site, placed, len, &mut out)?;
                Ok(out)
            }
        }
    })
}

/// The one-vector AllGather between in-process ranks: the ranks meet,
/// each offering its values, and every rank copies every part from its
/// sender's memory straight into its place in `out` (large copies spread
/// over this rank's cores). No handle of another rank's buffer is taken
/// (each moved its count's cache line between the ranks' cores), as in
/// AllToAll's `meet_into`. Checks as [`gather`]'s: a one-shot call, the
/// element type, each part's length against its count.
async fn meet_into<T: Element>(
    comm: &dyn Communicator,
    site: Site,
    values: &Elements<T>,
    out: &mut Vec<T>,
) -> Result<(), CollError> {
    let sz = std::mem::size_of::<T>();
    let meta = Meta::new(CollKind::AllGather, T::DTYPE)
        .flags(ONE_SHOT)
        .count(values.len() as u64);
    let offer = OfferData::same(values.buffer().clone());
    let Ok(seat) = meet_seat(comm, site, Tag::new(site.op, 0), meta, offer).await? else {
        return Err(site.invalid("the communicator said its ranks meet, then refused"));
    };
    // Every rank's bytes in rank order (the offers come in rank order).
    let mut parts: Vec<&[u8]> = Vec::with_capacity(comm.nranks() as usize);
    let own = values.buffer().as_slice();
    for m in seat.offers() {
        let m = m.map_err(|e| site.comm(e))?;
        let p = m.src;
        let theirs = met_meta(site, &m)?;
        let got = m.bytes();
        check_part::<T>(site, p, &theirs, got.len())?;
        if p > site.rank && parts.len() == site.rank as usize {
            parts.push(own);
        }
        parts.push(got);
    }
    if parts.len() == site.rank as usize {
        parts.push(own);
    }
    let mut len = 0;
    let placed: Vec<(usize, &[u8])> = parts
        .into_iter()
        .map(|b| {
            let at = len;
            len += b.len() / sz.max(1);
            (at, b)
        })
        .collect();
    crate::handle::spread(len * sz).await;
    assemble_slices_into(site, &placed, len, out)
}

/// Checks rank `p`'s part of a one-shot AllGather against this rank's
/// call: a one-shot call (not the streaming [`AllGather`]), this element
/// type, and `bytes` matching the count its header announced.
fn check_part<T: Element>(site: Site, p: Rank, meta: &Meta, bytes: usize) -> Result<(), CollError> {
    if meta.flags & ONE_SHOT == 0 {
        let d = format!("rank {p} is in a streaming AllGather, this rank in a one-shot one");
        return Err(site.mismatch(p, d));
    }
    if meta.dtype != T::DTYPE {
        let d = format!("element type {} here, {} on rank {p}", T::DTYPE, meta.dtype);
        return Err(site.mismatch(p, d));
    }
    let size = std::mem::size_of::<T>() as u64;
    if bytes as u64 != meta.count.saturating_mul(size) {
        let d = format!(
            "rank {p} announced {} elements and sent {bytes} bytes",
            meta.count
        );
        return Err(site.mismatch(p, d));
    }
    Ok(())
}

/// The one-shot AllGather's exchange: every rank's part, in rank order.
/// Where `zone` is given, a peer's part that comes as messages is
/// received straight into the zone at its place in a result laid out as
/// if every rank sent as many elements as this one (`recv_landing`); the
/// caller's assembly says whether the parts landed in their places after
/// all.
async fn gather<T: Element>(
    comm: &dyn Communicator,
    site: Site,
    values: Elements<T>,
    zone: Option<&LandingZone<T>>,
) -> Result<Vec<Elements<T>>, CollError> {
    let op = site.op;
    let own_bytes = values.buffer().len();
    let meta = Meta::new(CollKind::AllGather, T::DTYPE)
        .flags(ONE_SHOT)
        .count(values.len() as u64);
    let offer = OfferData::same(values.buffer().clone());
    let check = |p: Rank, f: &crate::wire::Framed| check_part::<T>(site, p, &f.meta, f.data.len());
    let place = |p: Rank, len: usize| DataRecv::for_part(zone, p as usize * own_bytes, len);
    let got =
        exchange_framed_landing(comm, site, Tag::new(op, 0), meta, offer, place, check).await?;
    let mut parts = Vec::with_capacity(got.len() + 1);
    let mut own = Some(values);
    for (p, f) in got {
        if p > site.rank {
            parts.extend(own.take());
        }
        parts.push(Elements::from_buffer(f.data));
    }
    parts.extend(own.take());
    Ok(parts)
}

/// One-shot AllGather: every rank's `values`, one [`Elements`] per rank in
/// rank order (see [`start_allgather_parts`]).
pub async fn allgather_parts<T: Element>(
    ctx: &Context,
    values: impl Into<Elements<T>>,
) -> Result<Vec<Elements<T>>, CollError> {
    let values: Elements<T> = values.into();
    let bytes = values.buffer().len();
    streaming(ctx, bytes, |cb| start_allgather_parts(ctx, values, cb)).await
}

/// Gathers every rank's `values`, concatenated in rank order (ranks may
/// contribute different counts); the streaming wrapper of
/// [`start_allgather`].
pub async fn allgather<T: Element>(
    ctx: &Context,
    values: impl Into<Elements<T>>,
) -> Result<Vec<T>, CollError> {
    let mut out = Vec::new();
    allgather_into(ctx, values, &mut out).await?;
    Ok(out)
}

/// [`allgather`] into `out`: the result written into `out`'s memory where
/// it is large enough (its old contents are replaced), as MPI writes into
/// a receive buffer the caller keeps; a loop that passes the same vector
/// each time writes into memory it has already touched instead of a fresh
/// vector's pages. Over tcp and mpi, large parts are received into `out`
/// laid out as if every rank sent as many elements as this one; where
/// the counts differ, the result is a fresh vector (the parts that landed
/// are copied out of `out`'s memory) and `out`'s old memory is let go.
/// `out` is lent to the call's core: on an error it is left empty.
pub async fn allgather_into<T: Element>(
    ctx: &Context,
    values: impl Into<Elements<T>>,
    out: &mut Vec<T>,
) -> Result<(), CollError> {
    let values: Elements<T> = values.into();
    let bytes = values.buffer().len();
    let mem = std::mem::take(out);
    *out = streaming(ctx, bytes, |cb| start_one_vector(ctx, values, mem, cb)).await?;
    Ok(())
}
