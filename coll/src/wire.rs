//! How collectives frame their messages, convert typed data, and check that
//! every rank made the same call.
//!
//! Every message starts with a 32-byte `Meta`:
//!
//! ```text
//!   kind u8 | dtype u8 | flags u8 | 0u8 | aux u32 | count u64 | seq u64 | meta_len u32 | 0u32
//!   then meta_len bytes of caller metadata, then the data inline
//!   (small data), or, with flag DATA_FOLLOWS, the data as the next message
//!   of the same (src, tag): large data is never copied into a frame.
//! ```
//!
//! A receiver that knows or expects the data to follow posts its receive
//! with the header's ([`DataRecv`]), so that the transport can take the
//! data as soon as it comes (into the caller's memory where it offers a
//! landing) rather than after a round trip through the task.
//!
//! Data larger than the backend's largest message
//! ([`Communicator::max_message`]: 2 GiB - 1 over MPI) goes as pieces:
//!
//! ```text
//!   header (DATA_FOLLOWS | PIECES; total bytes in the 40 bits of byte 3 and
//!   the last u32) | piece 1 | piece 2 | ... (each <= the limit, none empty)
//! ```
//!
//! The receiver takes pieces from the same (src, tag) until they add up
//! to the total, copying each into one vector as it comes (one copy, the
//! memory of one piece beyond the data's own).

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::task::{Poll, ready};

use braid_core::comm::{Met, Offer, OfferData, RecvFuture, Seat, SendFuture};
use braid_core::memory::{AssembleError, Landing, LandingZone};
use braid_core::{Buffer, Communicator, Rank, Tag};
use braid_kernels::{DType, Element};
use bytes::Bytes;

use crate::error::{CollError, CollKind, Site};

/// Size of `Meta` on the wire.
pub(crate) const META_LEN: usize = 32;
/// Data up to this size travels inside the first message.
pub(crate) const INLINE_MAX: usize = 16 << 10;
/// Flag: the data is the next message.
pub(crate) const DATA_FOLLOWS: u8 = 1;
/// Flag: this is a stream's finish marker; `count` is the number of data
/// messages sent before it.
pub(crate) const FINISH: u8 = 2;
/// Flag: this data frame is also its stream's finish marker (a stream of
/// one chunk then costs one message, not two). Needs no count: frames of
/// one (source, tag) arrive in the order they were sent.
pub(crate) const LAST: u8 = 4;
/// Flag: a one-shot call's only frame (the one-shot AllGather), so that a
/// streaming call's chunk is never taken for one, nor the other way round.
pub(crate) const ONE_SHOT: u8 = 8;
/// Flag: the data follows as several messages (pieces), their total
/// length in the header's spare bytes. (16 is allreduce's `IN_RESULT`.)
pub(crate) const PIECES: u8 = 64;
/// The largest frame sent as pieces: its length must fit the header's 40
/// spare bits.
const PIECED_MAX: u64 = (1 << 40) - 1;
/// The most pieces a frame is sent as (each a message, posted at once):
/// with MPI's limit 128 TiB; a limit of a few bytes fails the frame
/// rather than send it a few bytes a message.
const MAX_PIECES: u64 = 1 << 16;

/// The total data length of a frame flagged [`PIECES`] (byte 3 high,
/// bytes 28..32 low), from its first message's bytes.
fn pieced_total(b: &[u8]) -> u64 {
    u64::from(b[3]) << 32 | u64::from(u32::from_le_bytes([b[28], b[29], b[30], b[31]]))
}

/// Length of each piece (but the last) of data over a limit of `limit`
/// bytes a message: whole pages where the limit allows, so that pieces
/// start aligned.
fn piece_len(limit: u64) -> usize {
    let l = usize::try_from(limit).unwrap_or(usize::MAX);
    if l >= 8192 { l & !4095 } else { l }
}

/// How many pieces `len` bytes go as under `limit` (`u64::MAX` where the
/// limit is 0: no piece can be sent).
fn pieces(len: usize, limit: u64) -> u64 {
    match piece_len(limit) {
        0 => u64::MAX,
        p => len.div_ceil(p) as u64,
    }
}

/// The fixed header of a collective's message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Meta {
    pub kind: CollKind,
    pub dtype: DType,
    pub flags: u8,
    pub aux: u32,
    pub count: u64,
    pub seq: u64,
}

impl Meta {
    pub fn new(kind: CollKind, dtype: DType) -> Self {
        Meta {
            kind,
            dtype,
            flags: 0,
            aux: 0,
            count: 0,
            seq: 0,
        }
    }

    pub fn aux(mut self, aux: u32) -> Self {
        self.aux = aux;
        self
    }

    pub fn count(mut self, count: u64) -> Self {
        self.count = count;
        self
    }

    pub fn seq(mut self, seq: u64) -> Self {
        self.seq = seq;
        self
    }

    pub fn flags(mut self, flags: u8) -> Self {
        self.flags |= flags;
        self
    }

    fn encode(&self, meta_len: usize, out: &mut Vec<u8>) {
        out.push(self.kind.code());
        out.push(self.dtype.code());
        out.push(self.flags);
        out.push(0);
        out.extend_from_slice(&self.aux.to_le_bytes());
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&(meta_len as u32).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
    }

    /// The header as four words, for an in-process meeting (no bytes).
    pub(crate) fn pack(&self) -> [u64; 4] {
        let w0 = u64::from(self.kind.code())
            | u64::from(self.dtype.code()) << 8
            | u64::from(self.flags) << 16
            | u64::from(self.aux) << 32;
        [w0, self.count, self.seq, 0]
    }

    /// The inverse of [`Meta::pack`]; `None` for words it cannot give.
    pub(crate) fn unpack(w: [u64; 4]) -> Option<Meta> {
        Some(Meta {
            kind: CollKind::from_code(w[0] as u8)?,
            dtype: DType::from_code((w[0] >> 8) as u8)?,
            flags: (w[0] >> 16) as u8,
            aux: (w[0] >> 32) as u32,
            count: w[1],
            seq: w[2],
        })
    }

    fn decode(b: &[u8]) -> Option<(Meta, usize)> {
        if b.len() < META_LEN {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let meta = Meta {
            kind: CollKind::from_code(b[0])?,
            dtype: DType::from_code(b[1])?,
            flags: b[2],
            aux: u32_at(4),
            count: u64_at(8),
            seq: u64_at(16),
        };
        Some((meta, u32_at(24) as usize))
    }
}

/// A received framed message.
#[derive(Debug, Clone)]
pub(crate) struct Framed {
    pub meta: Meta,
    pub user_meta: Bytes,
    pub data: Buffer,
}

/// Sends a framed message: one message when the data is small, two (header
/// then data, zero-copy) when it is large. Ordering is fixed at the call.
pub(crate) fn send_framed(
    comm: &dyn Communicator,
    site: Site,
    dst: Rank,
    tag: Tag,
    meta: Meta,
    user_meta: &[u8],
    data: Buffer,
) -> FrameSend {
    let limit = comm.max_message();
    // (Inline only where the whole frame fits one message: under a limit
    // of a few KiB the data follows as pieces. A message to this rank
    // itself counts too: MPI sends it as any other.)
    let inline =
        data.len() <= INLINE_MAX && (META_LEN + user_meta.len() + data.len()) as u64 <= limit;
    // A header the backend would refuse (metadata over its limit, or over
    // the u32 its length is written in): the whole frame is refused, before
    // anything is sent. Its data sent alone would be read as the next
    // frame's header.
    let head_len = (META_LEN + user_meta.len()) as u64;
    if user_meta.len() > u32::MAX as usize || (!inline && head_len > limit) {
        return FrameSend {
            site,
            head: Some(SendFuture::ready(Err(
                braid_core::CommError::MessageTooLarge {
                    rank: site.rank,
                    peer: dst,
                    size: head_len,
                    limit: limit.min(u64::from(u32::MAX)),
                    backend: "frame header",
                },
            ))),
            data: None,
            rest: Vec::new(),
            rest_done: 0,
        };
    }
    let over = !inline && data.len() as u64 > limit;
    if over && (data.len() as u64 > PIECED_MAX || pieces(data.len(), limit) > MAX_PIECES) {
        // Refused whole (the backend's `send` says why): a header sent
        // without its data would have the receiver take the next frame's
        // header for this data, and fail with a mismatch that hides the
        // cause.
        return FrameSend {
            site,
            head: None,
            data: Some(comm.send(dst, tag, data)),
            rest: Vec::new(),
            rest_done: 0,
        };
    }
    let meta = if inline {
        meta
    } else if over {
        meta.flags(DATA_FOLLOWS | PIECES)
    } else {
        meta.flags(DATA_FOLLOWS)
    };
    let mut head =
        Vec::with_capacity(META_LEN + user_meta.len() + if inline { data.len() } else { 0 });
    meta.encode(user_meta.len(), &mut head);
    if over {
        let total = data.len() as u64;
        head[3] = (total >> 32) as u8;
        head[28..32].copy_from_slice(&(total as u32).to_le_bytes());
    }
    head.extend_from_slice(user_meta);
    let second = if inline {
        head.extend_from_slice(data.as_slice());
        None
    } else {
        Some(data)
    };
    let head = comm.send(dst, tag, Buffer::from_vec(head));
    let mut rest = Vec::new();
    let data = match second {
        Some(d) if over => {
            // Every piece posted now, in order after the header: the
            // transport keeps (src, tag) order, so they arrive together.
            let step = piece_len(limit);
            let mut pieces = (0..d.len())
                .step_by(step)
                .map(|s| comm.send(dst, tag, d.slice(s..(s + step).min(d.len()))));
            let first = pieces.next();
            rest.extend(pieces);
            first
        }
        Some(d) => Some(comm.send(dst, tag, d)),
        None => None,
    };
    FrameSend {
        site,
        head: Some(head),
        data,
        rest,
        rest_done: 0,
    }
}

/// A framed message's send ([`send_framed`]): its one or two messages'
/// sends. A plain struct (`Unpin`): a caller can poll it in place and keep
/// it only if the backend has not finished it within the call (the local
/// backend always has).
#[must_use = "a send's error is only seen by awaiting it"]
pub(crate) struct FrameSend {
    site: Site,
    /// The sends still to finish, in order (a finished one is dropped: a
    /// backend's send future need not answer again once it has).
    head: Option<SendFuture>,
    data: Option<SendFuture>,
    /// A pieced frame's pieces after the first ([`PIECES`]); those before
    /// `rest_done` have finished.
    rest: Vec<SendFuture>,
    rest_done: usize,
}

impl Future for FrameSend {
    type Output = Result<(), CollError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        for slot in [&mut this.head, &mut this.data] {
            if let Some(f) = slot {
                let r = ready!(Pin::new(f).poll(cx));
                *slot = None;
                if let Err(e) = r {
                    return Poll::Ready(Err(this.site.comm(e)));
                }
            }
        }
        while let Some(f) = this.rest.get_mut(this.rest_done) {
            let r = ready!(Pin::new(f).poll(cx));
            this.rest_done += 1;
            if let Err(e) = r {
                return Poll::Ready(Err(this.site.comm(e)));
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl FrameSend {
    /// The error of a send refused within the call, seen without polling
    /// ([`SendFuture::refused`]).
    fn refused(&self) -> Option<CollError> {
        [&self.head, &self.data]
            .into_iter()
            .flatten()
            .chain(&self.rest[self.rest_done..])
            .find_map(|f| f.refused())
            .map(|e| self.site.comm(e.clone()))
    }
}

/// Fails where one of `sends` was refused within its call (a message over
/// the backend's limit): a call checks this before it waits for its
/// receives, whose peers may be waiting for their own refused sends (every
/// rank of a ring so: a hang). Sends that fail later fail their peers'
/// receives too.
pub(crate) fn none_refused<'a>(
    sends: impl IntoIterator<Item = &'a FrameSend>,
) -> Result<(), CollError> {
    sends
        .into_iter()
        .find_map(FrameSend::refused)
        .map_or(Ok(()), Err)
}

/// How the data of a frame that follows its header is received.
pub(crate) enum DataRecv {
    /// Its receive is posted once the header says it follows: nothing
    /// extra for a frame whose data comes inline.
    AfterHead,
    /// Its receive is posted with the header's, where the data is
    /// expected to follow (more than `INLINE_MAX` bytes): the transport
    /// can take it the moment it comes, without a round trip through the
    /// task for the header (dropped if the data comes inline after all).
    WithHead,
    /// As `WithHead`, written straight into this landing
    /// (`Communicator::recv_landing`; the frame's data then views it).
    Into(Landing),
}

impl DataRecv {
    /// `WithHead` where a frame of `bytes` would have its data follow.
    pub(crate) fn for_len(bytes: usize) -> DataRecv {
        if bytes > INLINE_MAX {
            DataRecv::WithHead
        } else {
            DataRecv::AfterHead
        }
    }

    /// For a part of `len` bytes whose place is byte `offset` of `zone`:
    /// into that place where its data follows the header (and the zone
    /// has it), else as [`DataRecv::for_len`].
    pub(crate) fn for_part<T: bytemuck::Pod + Send>(
        zone: Option<&LandingZone<T>>,
        offset: usize,
        len: usize,
    ) -> DataRecv {
        match (DataRecv::for_len(len), zone) {
            (DataRecv::WithHead, Some(z)) => z
                .landing(offset, len)
                .map_or(DataRecv::WithHead, DataRecv::Into),
            (d, _) => d,
        }
    }

    /// The data's receive, where it is posted with the header's.
    fn post(self, comm: &dyn Communicator, src: Rank, tag: Tag) -> Option<RecvFuture> {
        match self {
            DataRecv::AfterHead => None,
            DataRecv::WithHead => Some(comm.recv(src, tag)),
            DataRecv::Into(l) => Some(comm.recv_landing(src, tag, l)),
        }
    }
}

/// Receives a framed message from `src` and checks its kind; `data` says
/// when its data's receive is posted.
pub(crate) async fn recv_framed(
    comm: &dyn Communicator,
    site: Site,
    src: Rank,
    tag: Tag,
    data: DataRecv,
) -> Result<Framed, CollError> {
    let mut st = Pending::Head(comm.recv(src, tag), data.post(comm, src, tag));
    std::future::poll_fn(|cx| st.poll_frame(cx, comm, site, src, tag)).await
}

/// A frame's first message, opened.
enum Head {
    /// The whole frame (data inline).
    Whole(Framed),
    /// The header; the data is the next message of the same (src, tag),
    /// or the next messages adding up to the total where it is pieced.
    DataFollows(Meta, Bytes, Option<u64>),
}

/// Fails unless `src`'s frame belongs to the same kind of collective.
fn check_kind(site: Site, src: Rank, meta: &Meta) -> Result<(), CollError> {
    if meta.kind != site.coll {
        return Err(site.mismatch(
            src,
            format!(
                "rank {src} called {} where this rank called {}",
                meta.kind, site.coll
            ),
        ));
    }
    Ok(())
}

/// Decodes and checks the first message of a frame from `src`.
fn open_head(site: Site, src: Rank, first: Buffer) -> Result<Head, CollError> {
    let Some((meta, meta_len)) = Meta::decode(first.as_slice()) else {
        return Err(site.mismatch(src, "received a message that is not a collective frame"));
    };
    check_kind(site, src, &meta)?;
    let body = META_LEN + meta_len;
    if first.len() < body {
        return Err(site.mismatch(src, "truncated frame"));
    }
    let user_meta = if meta_len == 0 {
        Bytes::new()
    } else {
        first.bytes().slice(META_LEN..body)
    };
    if meta.flags & DATA_FOLLOWS != 0 {
        let pieced = (meta.flags & PIECES != 0).then(|| pieced_total(first.as_slice()));
        return Ok(Head::DataFollows(meta, user_meta, pieced));
    }
    let data = if body == first.len() {
        Buffer::default()
    } else {
        first.after(body)
    };
    Ok(Head::Whole(Framed {
        meta,
        user_meta,
        data,
    }))
}

/// One peer's receive in [`drive_frames`]:
/// which message of its current frame it waits for.
enum Pending {
    /// The header, and, where the caller offered a landing for the data,
    /// the data's receive, posted with it so that the transport can
    /// write the data straight into the landing from its first byte.
    Head(RecvFuture, Option<RecvFuture>),
    Data(Meta, Bytes, RecvFuture),
    /// A pieced frame's data ([`PIECES`]), boxed: rare, and larger.
    Pieces(Box<Pieces>),
    Done,
}

/// A pieced frame being received: the pieces so far, copied in order.
struct Pieces {
    meta: Meta,
    user_meta: Bytes,
    /// The data's length as its header gave it.
    total: usize,
    got: Vec<u8>,
    recv: RecvFuture,
}

impl Pieces {
    /// The receive of a pieced frame's data of `total` bytes whose first
    /// piece `recv` takes.
    fn start(
        site: Site,
        src: Rank,
        meta: Meta,
        user_meta: Bytes,
        total: u64,
        recv: RecvFuture,
    ) -> Result<Box<Pieces>, CollError> {
        let memory = |detail: String| CollError::Memory {
            rank: site.rank,
            coll: site.coll,
            op: site.op,
            source: braid_core::MemoryError::OutOfMemory {
                size: total,
                detail,
            },
        };
        let n = usize::try_from(total).map_err(|_| {
            memory(format!(
                "rank {src}'s message is more than this host can address"
            ))
        })?;
        let mut got = Vec::new();
        got.try_reserve_exact(n).map_err(|e| {
            memory(format!(
                "rank {src}'s message of {n} bytes, put together from its pieces: {e}"
            ))
        })?;
        Ok(Box::new(Pieces {
            meta,
            user_meta,
            total: n,
            got,
            recv,
        }))
    }

    /// Takes one piece from `src`; `Some(frame)` once they add up to the
    /// total. A piece that is empty or goes past the total is a frame
    /// this rank cannot be sent: a mismatch, not data read as the next
    /// frame's.
    fn add(&mut self, site: Site, src: Rank, piece: Buffer) -> Result<Option<Framed>, CollError> {
        if piece.is_empty() || self.got.len() + piece.len() > self.total {
            return Err(site.mismatch(
                src,
                format!(
                    "rank {src}'s message of {} bytes in pieces got a piece of {} bytes after {}",
                    self.total,
                    piece.len(),
                    self.got.len()
                ),
            ));
        }
        self.got.extend_from_slice(piece.as_slice());
        drop(piece);
        if self.got.len() < self.total {
            return Ok(None);
        }
        Ok(Some(Framed {
            meta: self.meta,
            user_meta: std::mem::take(&mut self.user_meta),
            data: Buffer::from_vec(std::mem::take(&mut self.got)),
        }))
    }
}

impl Pending {
    /// Drives the current frame; `Ready(Ok)` once it is whole (the state is
    /// then `Done`; post the next receive to take another frame).
    fn poll_frame(
        &mut self,
        cx: &mut std::task::Context<'_>,
        comm: &dyn Communicator,
        site: Site,
        src: Rank,
        tag: Tag,
    ) -> Poll<Result<Framed, CollError>> {
        loop {
            match self {
                Pending::Head(f, data) => {
                    let Poll::Ready(r) = Pin::new(f).poll(cx) else {
                        return Poll::Pending;
                    };
                    let first = match r {
                        Ok(b) => b,
                        Err(e) => return Poll::Ready(Err(site.comm(e))),
                    };
                    // A data receive posted with the header and not needed
                    // (the data came inline) is dropped here: cancel-safe.
                    let data = data.take();
                    match open_head(site, src, first) {
                        Ok(Head::Whole(f)) => {
                            *self = Pending::Done;
                            return Poll::Ready(Ok(f));
                        }
                        Ok(Head::DataFollows(meta, um, None)) => {
                            let data = data.unwrap_or_else(|| comm.recv(src, tag));
                            *self = Pending::Data(meta, um, data);
                        }
                        Ok(Head::DataFollows(meta, um, Some(total))) => {
                            let data = data.unwrap_or_else(|| comm.recv(src, tag));
                            match Pieces::start(site, src, meta, um, total, data) {
                                Ok(p) => *self = Pending::Pieces(p),
                                Err(e) => return Poll::Ready(Err(e)),
                            }
                        }
                        Err(e) => return Poll::Ready(Err(e)),
                    }
                }
                Pending::Data(meta, um, f) => {
                    let Poll::Ready(r) = Pin::new(f).poll(cx) else {
                        return Poll::Pending;
                    };
                    let f = match r {
                        Ok(data) => Framed {
                            meta: *meta,
                            user_meta: std::mem::take(um),
                            data,
                        },
                        Err(e) => return Poll::Ready(Err(site.comm(e))),
                    };
                    *self = Pending::Done;
                    return Poll::Ready(Ok(f));
                }
                Pending::Pieces(p) => {
                    let Poll::Ready(r) = Pin::new(&mut p.recv).poll(cx) else {
                        return Poll::Pending;
                    };
                    let piece = match r {
                        Ok(b) => b,
                        Err(e) => return Poll::Ready(Err(site.comm(e))),
                    };
                    match p.add(site, src, piece) {
                        Ok(Some(f)) => {
                            *self = Pending::Done;
                            return Poll::Ready(Ok(f));
                        }
                        Ok(None) => p.recv = comm.recv(src, tag),
                        Err(e) => return Poll::Ready(Err(e)),
                    }
                }
                Pending::Done => return Poll::Pending,
            }
        }
    }
}

/// What [`drive_frames`] does after a peer's frame.
enum Next {
    /// Post a receive for that peer's next frame.
    Another,
    /// That peer is done.
    Done,
}

/// Receives frames on `tag` from every peer of `peers` at once, handing
/// each to `on_frame` (with the peer's index) as it arrives, until every
/// peer is done. One small state per peer, polled in place (lighter than
/// joining N receive futures). Frames are taken in arrival order, so the
/// first error (a dead peer, a mismatched frame, an error from `on_frame`)
/// ends the wait whichever peer it comes from: waiting on peers in order
/// could wait forever on a peer that is itself waiting for this rank's
/// error.
///
/// `data[i]` says when the data of peer i's first frame is received (see
/// [`DataRecv`]); missing entries are `AfterHead`, as are later frames.
async fn drive_frames(
    comm: &dyn Communicator,
    site: Site,
    peers: &[Rank],
    tag: Tag,
    mut data: Vec<DataRecv>,
    mut on_frame: impl FnMut(usize, Framed) -> Result<Next, CollError>,
) -> Result<(), CollError> {
    data.resize_with(peers.len(), || DataRecv::AfterHead);
    let mut pending: Vec<Pending> = peers
        .iter()
        .zip(data)
        .map(|(p, d)| Pending::Head(comm.recv(*p, tag), d.post(comm, *p, tag)))
        .collect();
    let mut left = pending.len();
    std::future::poll_fn(|cx| {
        for (i, (st, p)) in pending.iter_mut().zip(peers).enumerate() {
            while let Poll::Ready(r) = st.poll_frame(cx, comm, site, *p, tag) {
                match r.and_then(|f| on_frame(i, f)) {
                    Ok(Next::Another) => *st = Pending::Head(comm.recv(*p, tag), None),
                    Ok(Next::Done) => {
                        left -= 1;
                        break;
                    }
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
        }
        if left == 0 {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    })
    .await
}

/// Receives one frame on `tag` from each of `peers` and returns them in
/// the order of `peers`; `check` sees each frame as it arrives (see
/// [`drive_frames`] for the order and errors). `data[i]` says when the
/// data of the frame from `peers[i]` is received (missing entries:
/// `AfterHead`).
pub(crate) async fn recv_framed_all(
    comm: &dyn Communicator,
    site: Site,
    peers: impl IntoIterator<Item = Rank>,
    tag: Tag,
    data: Vec<DataRecv>,
    mut check: impl FnMut(Rank, &Framed) -> Result<(), CollError>,
) -> Result<Vec<(Rank, Framed)>, CollError> {
    let peers: Vec<Rank> = peers.into_iter().collect();
    let mut out: Vec<Option<Framed>> = peers.iter().map(|_| None).collect();
    drive_frames(comm, site, &peers, tag, data, |i, f| {
        check(peers[i], &f)?;
        out[i] = Some(f);
        Ok(Next::Done)
    })
    .await?;
    Ok(peers
        .into_iter()
        .zip(out)
        .filter_map(|(p, f)| f.map(|f| (p, f)))
        .collect())
}

/// Meets every other rank at `tag` (`Communicator::meet`) with `meta` and
/// `data`: `Ok(seat)` once every rank arrived, or the data handed back
/// (`Err`) where the ranks cannot meet (not in-process). The caller reads
/// each other rank's header ([`met_meta`], which checks its kind) and data
/// (`Met::bytes`, where it lies) through the seat, and leaves the meeting
/// by dropping it.
pub(crate) async fn meet_seat<'c>(
    comm: &'c dyn Communicator,
    site: Site,
    tag: Tag,
    meta: Meta,
    data: OfferData,
) -> Result<Result<Seat<'c>, OfferData>, CollError> {
    let offer = Offer {
        head: meta.pack(),
        data,
    };
    match comm.meet(tag, offer) {
        Ok(m) => Ok(Ok(m.await.map_err(|e| site.comm(e))?)),
        Err(offer) => Ok(Err(offer.data)),
    }
}

/// The collective header another rank brought to a meeting, checked to
/// be of this call's kind.
pub(crate) fn met_meta(site: Site, m: &Met<'_>) -> Result<Meta, CollError> {
    let Some(meta) = Meta::unpack(m.head) else {
        return Err(site.mismatch(m.src, "met a rank that is not in a collective"));
    };
    check_kind(site, m.src, &meta)?;
    Ok(meta)
}

/// Meets every other rank at `tag` (`Communicator::meet`) with `meta` and
/// `data`: `Ok(frames)` in rank order, each passed to `check` (their data
/// shared handles of the other ranks' buffers), or the data handed back
/// (`Err`) where the ranks cannot meet (not in-process).
pub(crate) async fn meet_framed(
    comm: &dyn Communicator,
    site: Site,
    tag: Tag,
    meta: Meta,
    data: OfferData,
    mut check: impl FnMut(Rank, &Framed) -> Result<(), CollError>,
) -> Result<Result<Vec<(Rank, Framed)>, OfferData>, CollError> {
    let seat = match meet_seat(comm, site, tag, meta, data).await? {
        Ok(seat) => seat,
        Err(data) => return Ok(Err(data)),
    };
    let mut out = Vec::with_capacity(comm.nranks() as usize - 1);
    for m in seat.offers() {
        let m = m.map_err(|e| site.comm(e))?;
        let f = Framed {
            meta: met_meta(site, &m)?,
            user_meta: Bytes::new(),
            data: m.buffer(),
        };
        check(m.src, &f)?;
        out.push((m.src, f));
    }
    Ok(Ok(out))
}

/// One step in which every rank sends a frame (`meta` and its data for that
/// peer) to every other rank and receives one from each: returns the
/// frames in rank order; `check` sees each as it arrives. In-process ranks
/// meet instead (`Communicator::meet`: one deposit and one take per rank,
/// no messages); other ranks send framed messages. Either way every rank
/// sees every other rank's `meta`, so a mismatch fails on every rank.
pub(crate) async fn exchange_framed(
    comm: &dyn Communicator,
    site: Site,
    tag: Tag,
    meta: Meta,
    data: OfferData,
    check: impl FnMut(Rank, &Framed) -> Result<(), CollError>,
) -> Result<Vec<(Rank, Framed)>, CollError> {
    exchange_framed_landing(
        comm,
        site,
        tag,
        meta,
        data,
        |_, len| DataRecv::for_len(len),
        check,
    )
    .await
}

/// [`exchange_framed`], where a peer's frame sent as messages is received
/// as `early(peer, len)` says: `len` is what this rank sends that peer,
/// which the peer's frame is taken to match (the ranks of one call send
/// alike; a wrong guess costs one dropped receive, or a landing unused).
pub(crate) async fn exchange_framed_landing(
    comm: &dyn Communicator,
    site: Site,
    tag: Tag,
    meta: Meta,
    data: OfferData,
    early: impl FnMut(Rank, usize) -> DataRecv,
    mut check: impl FnMut(Rank, &Framed) -> Result<(), CollError>,
) -> Result<Vec<(Rank, Framed)>, CollError> {
    let data = match meet_framed(comm, site, tag, meta, data, &mut check).await? {
        Ok(frames) => return Ok(frames),
        Err(data) => data,
    };
    // Boxed: the message path's state would otherwise make every caller's
    // future larger, and in-process ranks never take it.
    Box::pin(send_framed_all(comm, site, tag, meta, data, early, check)).await
}

/// `exchange_framed`'s message path: a frame to every other rank, one
/// from each.
async fn send_framed_all(
    comm: &dyn Communicator,
    site: Site,
    tag: Tag,
    meta: Meta,
    data: OfferData,
    mut early: impl FnMut(Rank, usize) -> DataRecv,
    check: impl FnMut(Rank, &Framed) -> Result<(), CollError>,
) -> Result<Vec<(Rank, Framed)>, CollError> {
    let (n, me) = (comm.nranks(), site.rank);
    let mut recvs = Vec::with_capacity(n as usize);
    let sends: Vec<_> = (0..n)
        .filter(|p| *p != me)
        .map(|p| {
            let d = data.share_buffer(p).unwrap_or_default();
            recvs.push(early(p, d.len()));
            send_framed(comm, site, p, tag, meta, &[], d)
        })
        .collect();
    let peers = (0..n).filter(|p| *p != me);
    none_refused(&sends)?;
    let got = recv_framed_all(comm, site, peers, tag, recvs, check).await?;
    for s in sends {
        s.await?;
    }
    Ok(got)
}

/// Receives each of `peers`' streams on `tag`: `each` gets every data
/// frame as it arrives, until that peer's FINISH marker, whose count must
/// equal the frames that came, or its data frame flagged LAST (a receive
/// is only posted while more are announced). Returns the headers of the
/// frames that ended the streams, in the order of `peers`.
pub(crate) async fn recv_streams_all(
    comm: &dyn Communicator,
    site: Site,
    peers: impl IntoIterator<Item = Rank>,
    tag: Tag,
    mut each: impl FnMut(Rank, Framed) -> Result<(), CollError>,
) -> Result<Vec<(Rank, Meta)>, CollError> {
    let peers: Vec<Rank> = peers.into_iter().collect();
    let mut got = vec![0u64; peers.len()];
    let mut fins: Vec<Option<Meta>> = vec![None; peers.len()];
    drive_frames(comm, site, &peers, tag, Vec::new(), |i, f| {
        let p = peers[i];
        if f.meta.flags & FINISH != 0 {
            if f.meta.count != got[i] {
                return Err(site.mismatch(
                    p,
                    format!(
                        "rank {p} says it sent {} chunks, {} arrived",
                        f.meta.count, got[i]
                    ),
                ));
            }
            fins[i] = Some(f.meta);
            return Ok(Next::Done);
        }
        got[i] += 1;
        let next = if f.meta.flags & LAST != 0 {
            fins[i] = Some(f.meta);
            Next::Done
        } else {
            Next::Another
        };
        each(p, f)?;
        Ok(next)
    })
    .await?;
    Ok(peers
        .into_iter()
        .zip(fins)
        .filter_map(|(p, m)| m.map(|m| (p, m)))
        .collect())
}

/// Receives exactly `count` frames on `tag` from each `(peer, count)` of
/// `streams` (none from a peer whose count is 0), handing each to `each`
/// as it arrives (see [`drive_frames`] for the order and errors): for
/// streams whose lengths a meeting told.
pub(crate) async fn recv_counted_all(
    comm: &dyn Communicator,
    site: Site,
    streams: &[(Rank, u64)],
    tag: Tag,
    mut each: impl FnMut(Rank, Framed) -> Result<(), CollError>,
) -> Result<(), CollError> {
    let (peers, mut left): (Vec<Rank>, Vec<u64>) =
        streams.iter().filter(|(_, c)| *c > 0).copied().unzip();
    if peers.is_empty() {
        return Ok(());
    }
    drive_frames(comm, site, &peers, tag, Vec::new(), |i, f| {
        left[i] = left[i].saturating_sub(1);
        each(peers[i], f)?;
        Ok(if left[i] == 0 {
            Next::Done
        } else {
            Next::Another
        })
    })
    .await
}

/// Ends this rank's stream to every other rank: a FINISH marker (`meta`
/// with the FINISH flag) whose count is `count(peer)`.
pub(crate) fn send_finish(
    comm: &dyn Communicator,
    site: Site,
    tag: Tag,
    meta: Meta,
    count: impl Fn(Rank) -> u64,
) -> Vec<futures::future::BoxFuture<'static, Result<(), CollError>>> {
    (0..comm.nranks())
        .filter(|p| *p != site.rank)
        .map(|p| {
            let m = meta.flags(FINISH).count(count(p));
            Box::pin(send_framed(comm, site, p, tag, m, &[], Buffer::default())) as _
        })
        .collect()
}

struct TypedOwner<T: Element>(Vec<T>);

impl<T: Element> AsRef<[u8]> for TypedOwner<T> {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

/// Elements of one type held in a shared buffer: cloning shares the bytes,
/// so a caller can hand the same input to many collectives without copies.
#[derive(Debug)]
pub struct Elements<T> {
    buf: Buffer,
    _t: std::marker::PhantomData<fn() -> T>,
}

impl<T> Clone for Elements<T> {
    fn clone(&self) -> Self {
        Elements {
            buf: self.buf.clone(),
            _t: std::marker::PhantomData,
        }
    }
}

impl<T: Element> Elements<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.buf.len() / std::mem::size_of::<T>()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The elements.
    pub fn as_slice(&self) -> Cow<'_, [T]> {
        typed(&self.buf).unwrap_or(Cow::Borrowed(&[]))
    }

    pub(crate) fn buffer(&self) -> &Buffer {
        &self.buf
    }

    /// Elements `[from, from + len)`, sharing the bytes.
    pub(crate) fn slice(&self, from: usize, len: usize) -> Self {
        let sz = std::mem::size_of::<T>();
        Elements {
            buf: self.buf.slice(from * sz..(from + len) * sz),
            _t: std::marker::PhantomData,
        }
    }

    /// A received buffer whose length the caller checked is a multiple of
    /// the element size.
    pub(crate) fn from_buffer(buf: Buffer) -> Self {
        Elements {
            buf,
            _t: std::marker::PhantomData,
        }
    }
}

impl<T: Element> From<Vec<T>> for Elements<T> {
    fn from(v: Vec<T>) -> Self {
        Elements {
            buf: vec_to_buffer(v),
            _t: std::marker::PhantomData,
        }
    }
}

/// A one-vector result in the vector of `zone`: `parts` are (element
/// offset in the result, data); those that landed in place (views of the
/// zone at their offset, `Communicator::recv_landing`) are there already,
/// the others are copied in, and what no part covers is zeroed
/// (`LandingZone::assemble`). Fails (never in a correct run) if a part
/// does not fit or a view of the zone is still held elsewhere.
pub(crate) fn land_parts<T: Element>(
    site: Site,
    parts: Vec<(usize, Buffer)>,
    zone: LandingZone<T>,
) -> Result<Vec<T>, CollError> {
    zone.assemble(parts).map_err(|e| assemble_error(site, e))
}

/// A result that could not be put together, as this call's error.
fn assemble_error(site: Site, e: AssembleError) -> CollError {
    match e {
        AssembleError::StillHeld => site.comm(braid_core::CommError::Protocol {
            rank: site.rank,
            peer: None,
            detail: "a landed part is still held by the transport".into(),
        }),
        AssembleError::DoesNotFit { .. } | AssembleError::Overlap { .. } => {
            site.disagreement(e.to_string())
        }
    }
}

/// A landing zone of `len` elements for a result, in `vec`'s memory
/// where it has room (`LandingZone::reusing`: an `_into` call's vector),
/// else over a fresh vector; this rank's memory error where the allocator
/// cannot give it.
pub(crate) fn result_zone<T: Element>(
    site: Site,
    vec: Vec<T>,
    len: usize,
) -> Result<LandingZone<T>, CollError> {
    LandingZone::reusing(vec, len).ok_or_else(|| {
        site.memory(braid_core::MemoryError::OutOfMemory {
            size: len.saturating_mul(std::mem::size_of::<T>()) as u64,
            detail: "the result vector could not be allocated".into(),
        })
    })
}

/// `parts` (element offset, data) put together as a result of `len`
/// elements in `out` (its memory reused where it has room; see
/// [`result_zone`] and [`land_parts`]: large copies spread over this
/// rank's cores). On an error `out` is left empty.
pub(crate) fn assemble_into<T: Element>(
    site: Site,
    parts: Vec<(usize, Buffer)>,
    len: usize,
    out: &mut Vec<T>,
) -> Result<(), CollError> {
    let zone = result_zone(site, std::mem::take(out), len)?;
    *out = land_parts(site, parts, zone)?;
    Ok(())
}

/// As [`assemble_into`], from borrowed bytes (element offset, bytes):
/// what a caller that reads other ranks' offers in place passes.
pub(crate) fn assemble_slices_into<T: Element>(
    site: Site,
    parts: &[(usize, &[u8])],
    len: usize,
    out: &mut Vec<T>,
) -> Result<(), CollError> {
    let zone = result_zone(site, std::mem::take(out), len)?;
    *out = zone
        .assemble_slices(parts)
        .map_err(|e| assemble_error(site, e))?;
    Ok(())
}

/// A typed vector as a buffer, without copying.
pub(crate) fn vec_to_buffer<T: Element>(v: Vec<T>) -> Buffer {
    Buffer::from_bytes(Bytes::from_owner(TypedOwner(v)))
}

/// A buffer's bytes as elements: borrowed when aligned, copied otherwise.
pub(crate) fn typed<T: Element>(b: &Buffer) -> Option<Cow<'_, [T]>> {
    typed_bytes(b.as_slice())
}

/// Bytes as elements: borrowed when aligned, copied otherwise; `None`
/// when they are not whole elements.
pub(crate) fn typed_bytes<T: Element>(s: &[u8]) -> Option<Cow<'_, [T]>> {
    if s.len() % std::mem::size_of::<T>() != 0 {
        return None;
    }
    Some(match bytemuck::try_cast_slice::<u8, T>(s) {
        Ok(t) => Cow::Borrowed(t),
        Err(_) => Cow::Owned(bytemuck::pod_collect_to_vec(s)),
    })
}

/// What a call looks like to the other ranks: the fields every rank must
/// agree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Signature {
    pub dtype: DType,
    /// Root, reduction operator, or 0.
    pub aux: u32,
    /// Element count where it must agree, else 0.
    pub count: u64,
}

/// First stage of the agreement rounds (round k uses `AGREE_STAGE + k`),
/// and of every device collective's host messages: each kind's first
/// messages there go to rank + 1 (or to every neighbour it has), framed
/// with the kind, so ranks that called different kinds meet under it and
/// fail ([`check_kind`]) rather than wait under stages of their own.
pub(crate) const AGREE_STAGE: u8 = 200;

/// Every rank learns the minimum and maximum of every rank's `value`, and
/// `data`, which `root` alone passes, reaches every rank on the way.
///
/// Dissemination: round k sends to rank + 2^k and receives from rank -
/// 2^k; min and max are idempotent, so overlapping coverage is harmless.
/// The data rides in the same messages, to the ranks that lack it: with
/// ranks numbered from the root (v), the ranks v < 2^k hold it before
/// round k, and each sends it on to v + 2^k where that is below N (a
/// binomial tree, largest subtrees first, ceil(log2 N) steps):
///
/// ```text
///   v:        0   1   2   3   4
///   round 0:  0 --> 1                 (every rank also sends its
///   round 1:  0 ------> 2, 1 --> 3     min/max to v + 2^k, wrapping)
///   round 2:  0 ----------> 4
/// ```
///
/// Round k's messages go under `stage + k`.
/// Cost: ceil(log2 N) rounds of one 33-byte message, the data added to the
/// messages of N - 1 of them. Returns (min, max), equal on every rank, and
/// the data where it came. Ranks whose `root` differs may find data where
/// they expect none or none where they expect it; every round runs all
/// the same, and (min, max) tell them apart.
pub(crate) async fn agree(
    comm: &dyn Communicator,
    site: Site,
    stage: u8,
    value: [u64; 2],
    root: Rank,
    mut data: Option<Buffer>,
) -> Result<Agreed, CollError> {
    let n = comm.nranks();
    let me = site.rank;
    // This rank's number counted from the root (as this rank sees it).
    let v = (me + n - root % n) % n;
    let (mut lo, mut hi) = (value, value);
    let mut peer = None;
    let mut dist = 1u32;
    let mut round = 0u8;
    while dist < n {
        let tag = Tag::new(site.op, stage + round);
        let carry = data.as_ref().filter(|_| v < dist && v + dist < n);
        let mut body = Vec::with_capacity(AGREE_LEN);
        for w in lo.iter().chain(hi.iter()) {
            body.extend_from_slice(&w.to_le_bytes());
        }
        body.push(u8::from(carry.is_some()));
        let meta = Meta::new(site.coll, DType::Bytes);
        let send = send_framed(
            comm,
            site,
            (me + dist) % n,
            tag,
            meta,
            &body,
            carry.cloned().unwrap_or_default(),
        );
        let src = (me + n - dist) % n;
        none_refused([&send])?;
        let f = recv_framed(comm, site, src, tag, DataRecv::AfterHead).await?;
        send.await?;
        let b = f.user_meta.as_ref();
        if b.len() != AGREE_LEN {
            return Err(site.mismatch(src, "malformed agreement message"));
        }
        let w = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i * 8..i * 8 + 8]);
            u64::from_le_bytes(x)
        };
        // Round 0 brings the neighbour's own value: name it if it differs.
        if round == 0 && [w(0), w(1)] != value {
            peer = Some(src);
        }
        lo = lo.min([w(0), w(1)]);
        hi = hi.max([w(2), w(3)]);
        if b[32] != 0 && data.is_none() {
            data = Some(f.data);
        }
        dist *= 2;
        round += 1;
    }
    Ok(Agreed { lo, hi, data, peer })
}

/// The bytes of an agreement message: min and max (two words each) and
/// whether the data follows.
const AGREE_LEN: usize = 33;

/// What [`agree`] returns.
pub(crate) struct Agreed {
    /// The least of every rank's value.
    pub lo: [u64; 2],
    /// The greatest.
    pub hi: [u64; 2],
    /// The root's data, where it came (always at the root).
    pub data: Option<Buffer>,
    /// The rank before this one, when its value differs from this rank's.
    pub peer: Option<Rank>,
}

impl Agreed {
    /// The data when every rank's value was the same, else the mismatch
    /// (the same description on every rank: (min, max) are equal
    /// everywhere; it names the rank before this one where that differs).
    fn verdict(self, site: Site) -> Result<Option<Buffer>, CollError> {
        if self.lo == self.hi {
            return Ok(self.data);
        }
        let detail = Signature::describe(site.coll, self.lo, self.hi);
        Err(match self.peer {
            Some(p) => site.mismatch(p, detail),
            None => site.disagreement(detail),
        })
    }
}

/// Sends `words` to `dst` as a frame of this call's kind (the words its
/// data, little-endian): the host messages of the device collectives, so
/// that a rank that called another kind fails at the first of them
/// ([`AGREE_STAGE`]) instead of waiting under a stage that kind never uses.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn send_words(
    comm: &dyn Communicator,
    site: Site,
    dst: Rank,
    tag: Tag,
    words: &[u64],
) -> FrameSend {
    let mut b = Vec::with_capacity(words.len() * 8);
    for w in words {
        b.extend_from_slice(&w.to_le_bytes());
    }
    let meta = Meta::new(site.coll, DType::Bytes);
    send_framed(comm, site, dst, tag, meta, &[], Buffer::from_vec(b))
}

/// Receives [`send_words`]' frame from `src`; fails on a frame of another
/// kind of collective or one that is not whole words.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) async fn recv_words(
    comm: &dyn Communicator,
    site: Site,
    src: Rank,
    tag: Tag,
) -> Result<Vec<u64>, CollError> {
    let f = recv_framed(comm, site, src, tag, DataRecv::AfterHead).await?;
    let s = f.data.as_slice();
    if s.len() % 8 != 0 {
        return Err(site.mismatch(src, format!("malformed message of {} bytes", s.len())));
    }
    Ok(s.chunks_exact(8)
        .map(|c| {
            let mut x = [0u8; 8];
            x.copy_from_slice(c);
            u64::from_le_bytes(x)
        })
        .collect())
}

/// Every rank learns every rank's `mine` (a few words each): Bruck-style
/// dissemination, round k sends everything known so far to rank + 2^k and
/// receives from rank - 2^k (the direction of [`agree`]'s rounds, under
/// the same stages, so that a rank in another kind of call meets this
/// one's first frame). Cost: ceil(log2 N) rounds; the messages carry up to
/// N entries, so use it for small per-rank data (counts, flags).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) async fn gather_all(
    comm: &dyn Communicator,
    site: Site,
    mine: Vec<u64>,
) -> Result<Vec<Vec<u64>>, CollError> {
    let n = comm.nranks();
    let me = site.rank;
    let mut known: Vec<Option<Vec<u64>>> = vec![None; n as usize];
    known[me as usize] = Some(mine);
    let mut dist = 1u32;
    let mut round = 0u8;
    while dist < n {
        let tag = Tag::new(site.op, AGREE_STAGE + round);
        let mut body = Vec::new();
        for (r, v) in known.iter().enumerate() {
            if let Some(v) = v {
                body.push(r as u64);
                body.push(v.len() as u64);
                body.extend_from_slice(v);
            }
        }
        let send = send_words(comm, site, (me + dist) % n, tag, &body);
        let src = (me + n - dist) % n;
        none_refused([&send])?;
        let words = recv_words(comm, site, src, tag).await?;
        send.await?;
        let mut i = 0;
        while i + 2 <= words.len() {
            let (r, len) = (words[i], words[i + 1]);
            // Lengths come from the peer: compared, never added unchecked.
            if r >= n as u64 || len > (words.len() - i - 2) as u64 {
                return Err(site.mismatch(src, "malformed gather message"));
            }
            let (r, end) = (r as usize, i + 2 + len as usize);
            known[r].get_or_insert_with(|| words[i + 2..end].to_vec());
            i = end;
        }
        if i != words.len() {
            return Err(site.mismatch(src, "malformed gather message"));
        }
        dist *= 2;
        round += 1;
    }
    known
        .into_iter()
        .enumerate()
        .map(|(r, v)| v.ok_or_else(|| site.mismatch(r as Rank, "no entry gathered")))
        .collect()
}

/// Checks that every rank made this call with the same signature; if not,
/// every rank fails with a mismatch (no rank returns data). Runs alongside
/// the collective's own messages.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) async fn check_signature(
    comm: &dyn Communicator,
    site: Site,
    sig: Signature,
) -> Result<(), CollError> {
    let a = agree(comm, site, AGREE_STAGE, sig.packed(), 0, None).await?;
    a.verdict(site).map(|_| ())
}

/// [`check_signature`] as a collective's only messages (round k under
/// stage k, so its first messages meet another collective's first ones
/// at stage 0 when ranks call different kinds), and `data`, which `root`
/// alone passes, reaches every rank in the same messages ([`agree`]).
/// Returns the data: on every rank once the check passes.
pub(crate) async fn check_spreading(
    comm: &dyn Communicator,
    site: Site,
    sig: Signature,
    root: Rank,
    data: Option<Buffer>,
) -> Result<Option<Buffer>, CollError> {
    agree(comm, site, 0, sig.packed(), root, data)
        .await?
        .verdict(site)
}

impl Signature {
    fn packed(self) -> [u64; 2] {
        [
            (self.dtype.code() as u64) << 32 | self.aux as u64,
            self.count,
        ]
    }

    /// What differs between this rank's call and a peer's (from the
    /// peer's frame header), or `None` when they match.
    pub(crate) fn differs(self, coll: CollKind, peer: Signature) -> Option<String> {
        let (a, b) = (self.packed(), peer.packed());
        (a != b).then(|| Signature::describe(coll, a, b))
    }

    /// Names the first field in which two packed signatures differ.
    fn describe(coll: CollKind, lo: [u64; 2], hi: [u64; 2]) -> String {
        let dtype = |w: u64| {
            DType::from_code((w >> 32) as u8)
                .map(|d| d.to_string())
                .unwrap_or_default()
        };
        if lo[0] >> 32 != hi[0] >> 32 {
            format!(
                "ranks pass different element types ({} and {})",
                dtype(lo[0]),
                dtype(hi[0])
            )
        } else if lo[0] != hi[0] {
            let (a, b) = (lo[0] as u32, hi[0] as u32);
            match coll {
                CollKind::Broadcast => format!("ranks pass different roots ({a} and {b})"),
                CollKind::AllReduce | CollKind::ReduceScatter => format!(
                    "ranks pass different reduction operators ({} and {})",
                    crate::allreduce::op_name(a),
                    crate::allreduce::op_name(b)
                ),
                _ => format!("ranks pass different parameters ({a} and {b})"),
            }
        } else {
            format!("ranks pass different counts ({} and {})", lo[1], hi[1])
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_mismatch_names_the_reduction_operators() {
        let w = |aux: u64| [(u64::from(DType::F64.code()) << 32) | aux, 10];
        let d = Signature::describe(CollKind::AllReduce, w(3), w(4));
        assert!(d.contains("(Min and Max)"), "{d}");
        let d = Signature::describe(CollKind::ReduceScatter, w(1), w(255));
        assert!(d.contains("(Sum and a custom operator)"), "{d}");
        let d = Signature::describe(CollKind::Broadcast, w(0), w(2));
        assert!(d.contains("different roots (0 and 2)"), "{d}");
    }

    /// Pieces add up to the header's total in order; an empty piece or
    /// one past the total is a mismatch naming the peer, not data.
    #[test]
    fn pieces_add_up_to_their_total_and_no_further() {
        let site = Site {
            rank: 1,
            coll: CollKind::Shuffle,
            op: braid_core::OpId(7),
        };
        let meta = Meta::new(CollKind::Shuffle, DType::Bytes);
        // (A receive that never completes: `add` is handed the pieces.)
        let comm = LocalComm::world(1).remove(0);
        let start = || {
            let recv = comm.recv(0, braid_core::Tag::new(OpId(1), 0));
            Pieces::start(site, 3, meta, Bytes::new(), 10, recv).unwrap()
        };
        let b = |v: &[u8]| Buffer::from_vec(v.to_vec());
        let mut p = start();
        assert!(p.add(site, 3, b(&[1, 2, 3, 4])).unwrap().is_none());
        let f = p.add(site, 3, b(&[5, 6, 7, 8, 9, 10])).unwrap().unwrap();
        assert_eq!(f.data.as_slice(), &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        let mut p = start();
        let e = p.add(site, 3, Buffer::default()).unwrap_err().to_string();
        assert!(e.contains("rank 3") && e.contains("0 bytes"), "{e}");
        let mut p = start();
        assert!(p.add(site, 3, b(&[0; 8])).unwrap().is_none());
        let e = p.add(site, 3, b(&[0; 3])).unwrap_err().to_string();
        assert!(e.contains("10 bytes") && e.contains("after 8"), "{e}");
        // Piece lengths: whole pages from 8 KiB up; a limit of 0 sends none.
        assert_eq!(piece_len(i32::MAX as u64), (1 << 31) - 4096);
        assert_eq!(piece_len(5000), 5000);
        assert_eq!(pieces(10_001, 5000), 3);
        assert_eq!(pieces(1, 0), u64::MAX);
    }

    #[test]
    fn a_frame_send_never_polls_a_finished_send_again() {
        use futures::FutureExt as _;
        // The data's send finishes on its second poll; the header's at
        // once. An `async` block panics if polled after it finished, as
        // some backends' send futures do.
        // The same for a pieced frame's later pieces.
        let twice = || {
            let mut polls = 0;
            std::future::poll_fn(move |cx| {
                polls += 1;
                if polls < 2 {
                    cx.waker().wake_by_ref();
                    Poll::Pending
                } else {
                    Poll::Ready(Ok(()))
                }
            })
        };
        let mut f = FrameSend {
            site: Site {
                rank: 0,
                coll: CollKind::AllGather,
                op: braid_core::OpId(1),
            },
            head: Some(SendFuture::waiting(async { Ok(()) })),
            data: Some(SendFuture::waiting(twice())),
            rest: vec![
                SendFuture::waiting(async { Ok(()) }),
                SendFuture::waiting(twice()),
            ],
            rest_done: 0,
        };
        assert!((&mut f).now_or_never().is_none(), "the data is pending");
        assert!((&mut f).now_or_never().is_none(), "a piece is pending");
        assert!(matches!((&mut f).now_or_never(), Some(Ok(()))));
    }
    use braid_core::OpId;
    use braid_core::comm::local::LocalComm;

    /// A local rank whose backend carries messages of at most `limit`
    /// bytes (as MPI's 2 GiB - 1, made small).
    struct Limited {
        inner: LocalComm,
        limit: u64,
    }

    impl Communicator for Limited {
        fn rank(&self) -> Rank {
            self.inner.rank()
        }
        fn nranks(&self) -> u32 {
            self.inner.nranks()
        }
        fn backend(&self) -> braid_core::Backend {
            self.inner.backend()
        }
        fn max_message(&self) -> u64 {
            self.limit
        }
        fn send(&self, dst: Rank, tag: Tag, data: Buffer) -> SendFuture {
            if data.len() as u64 > self.limit {
                return SendFuture::ready(Err(braid_core::CommError::MessageTooLarge {
                    rank: self.rank(),
                    peer: dst,
                    size: data.len() as u64,
                    limit: self.limit,
                    backend: "test",
                }));
            }
            self.inner.send(dst, tag, data)
        }
        fn recv(&self, src: Rank, tag: Tag) -> RecvFuture {
            self.inner.recv(src, tag)
        }
        fn abort(&self, reason: &str) {
            self.inner.abort(reason)
        }
        fn failure(&self) -> Option<braid_core::CommError> {
            self.inner.failure()
        }
        fn shutdown(
            &self,
        ) -> futures::future::BoxFuture<'static, Result<(), braid_core::CommError>> {
            self.inner.shutdown()
        }
        fn statistics(&self) -> &std::sync::Arc<braid_core::Statistics> {
            self.inner.statistics()
        }
    }

    /// A frame whose header the backend would refuse (metadata over its
    /// limit) is refused whole: its data, sent alone, would be read as
    /// the next frame's header.
    #[test]
    fn a_frame_whose_header_is_too_large_sends_nothing() {
        use futures::FutureExt as _;
        let mut world = LocalComm::world(2);
        let peer = world.remove(1);
        let comm = Limited {
            inner: world.remove(0),
            limit: 25_000,
        };
        let site = Site {
            rank: 0,
            coll: CollKind::Shuffle,
            op: OpId(9),
        };
        let tag = Tag::new(OpId(9), 0);
        let meta = Meta::new(CollKind::Shuffle, DType::Bytes);
        let f = send_framed(
            &comm,
            site,
            1,
            tag,
            meta,
            &[7u8; 30_000],
            Buffer::from_vec(vec![1u8; 20_000]),
        );
        let e = f.refused().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("frame header") && e.contains("rank 1"), "{e}");
        assert!(
            peer.recv(0, tag).now_or_never().is_none(),
            "something was sent"
        );
        // Within the limit the same frame goes (header, then data).
        let f = send_framed(
            &comm,
            site,
            1,
            tag,
            meta,
            &[7u8; 100],
            Buffer::from_vec(vec![1u8; 20_000]),
        );
        assert!(f.refused().is_none());
    }

    /// Every rank learns every rank's words, for every rank count.
    #[test]
    fn gather_all_gives_every_rank_everything() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        for n in [1u32, 2, 3, 4, 5, 8] {
            let comms = LocalComm::world(n);
            let want: Vec<Vec<u64>> = (0..n as u64)
                .map(|r| (0..r % 3 + 1).map(|i| r * 1000 + i).collect())
                .collect();
            let tasks: Vec<_> = comms
                .into_iter()
                .map(|c| {
                    let mine = want[c.rank() as usize].clone();
                    rt.spawn(async move {
                        let site = Site {
                            rank: c.rank(),
                            coll: CollKind::AllToAll,
                            op: OpId(7),
                        };
                        gather_all(&c, site, mine).await
                    })
                })
                .collect();
            for t in tasks {
                let got = rt.block_on(t).unwrap().unwrap();
                assert_eq!(got, want, "{n} ranks");
            }
        }
    }

    /// One rank's host messages of a device collective of kind `form`
    /// (as `device` sends them): the signature agreement (AllReduce), the
    /// gathered counts (AllToAllv), lists to every peer (Shuffle), sizes
    /// to both neighbours (HaloExchange), a ring step (SendRecv).
    async fn device_form(c: &LocalComm, form: u32) -> Result<(), CollError> {
        let (me, n) = (c.rank(), c.nranks());
        let coll = [
            CollKind::AllReduce,
            CollKind::AllToAllv,
            CollKind::Shuffle,
            CollKind::HaloExchange,
            CollKind::SendRecv,
        ][form as usize];
        let site = Site {
            rank: me,
            coll,
            op: OpId(11),
        };
        let tag = Tag::new(site.op, AGREE_STAGE);
        let (to, from): (Vec<Rank>, Vec<Rank>) = match form {
            0 => {
                let sig = Signature {
                    dtype: DType::F64,
                    aux: 0,
                    count: 10,
                };
                return check_signature(c, site, sig).await;
            }
            1 => return gather_all(c, site, vec![1, 2]).await.map(|_| ()),
            2 => {
                let peers: Vec<Rank> = (0..n).filter(|&p| p != me).collect();
                (peers.clone(), peers)
            }
            3 => {
                let nb: Vec<Rank> = [me.checked_sub(1), (me + 1 < n).then_some(me + 1)]
                    .into_iter()
                    .flatten()
                    .collect();
                (nb.clone(), nb)
            }
            _ => (vec![(me + 1) % n], vec![(me + n - 1) % n]),
        };
        let sent: Vec<_> = to
            .iter()
            .map(|&p| send_words(c, site, p, tag, &[8]))
            .collect();
        for p in from {
            recv_words(c, site, p, tag).await?;
        }
        for f in sent {
            f.await?;
        }
        Ok(())
    }

    /// Ranks that call different kinds of device collective at one
    /// operation meet at their first host messages: a rank sees the other
    /// kind's frame and fails, its abort fails the rest, and no rank waits
    /// for a stage the other kind never uses (they used to: the gathered
    /// counts went under stages of their own, the sizes as bare words).
    #[test]
    fn device_checks_of_different_kinds_fail_instead_of_waiting() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for n in [2u32, 3, 4, 5, 8] {
            let mut cases: Vec<Vec<u32>> = Vec::new();
            // Every pair of forms, one rank apart from the rest ...
            for a in 0..5 {
                for b in (0..5).filter(|&b| b != a) {
                    for odd in [0, n - 1] {
                        cases.push((0..n).map(|r| if r == odd { a } else { b }).collect());
                    }
                }
            }
            // ... and random mixes.
            while cases.len() < 60 {
                let c: Vec<u32> = (0..n).map(|_| (next() % 5) as u32).collect();
                if c.iter().any(|&f| f != c[0]) {
                    cases.push(c);
                }
            }
            for forms in cases {
                let tasks: Vec<_> = LocalComm::world(n)
                    .into_iter()
                    .zip(forms.clone())
                    .map(|(c, form)| {
                        rt.spawn(async move {
                            let r = device_form(&c, form).await;
                            if let Err(e) = &r {
                                c.abort(&e.to_string());
                            }
                            (c, r.map_err(|e| e.to_string()))
                        })
                    })
                    .collect();
                let ends: Vec<(LocalComm, Result<(), String>)> = rt.block_on(async {
                    let all = futures::future::join_all(tasks);
                    match tokio::time::timeout(std::time::Duration::from_secs(20), all).await {
                        Ok(rs) => rs.into_iter().map(|r| r.unwrap()).collect(),
                        Err(_) => panic!("{n} ranks, forms {forms:?}: a rank waited"),
                    }
                });
                // A rank whose own messages all matched (two HaloExchange
                // neighbours) sees the abort instead: on its communicator,
                // which the device work's thread watches.
                for (r, (c, res)) in ends.iter().enumerate() {
                    assert!(
                        res.is_err() || c.failure().is_some(),
                        "{n} ranks, forms {forms:?}: rank {r} ended well"
                    );
                }
                let results: Vec<_> = ends.into_iter().map(|(_, r)| r).collect();
                assert!(
                    results.iter().any(|r| r
                        .as_ref()
                        .is_err_and(|e| e.contains("where this rank called"))),
                    "{n} ranks, forms {forms:?}: nobody named the kinds: {results:?}"
                );
            }
        }
    }
}
