//! In-process rendezvous: the ranks of one local world meet at a tag and
//! hand each other buffers directly, instead of one message per peer.
//!
//! A collective step in which every rank sends something to every other
//! rank (AllReduce's first step, a barrier) costs N - 1 framed messages
//! per rank over a transport; between threads of one process the same
//! step is one deposit and one take per rank:
//!
//! ```text
//!   rank r: deposit(tag, offer)   find the tag's meeting at its arena
//!                                 places (no lock); not there: open it
//!                                 under the table's lock; claim r's slot,
//!                                 fill it, count the arrival; the last of
//!                                 N has its seat at once and wakes the
//!                                 others
//!           poll: arrivals < N -> leave a waker in r's slot, Pending
//!                 arrivals = N -> a seat: every other rank's head and its
//!                                 share for r, read where they lie
//!                                 (`Seat::offers`) or taken as handles
//!                                 (`Seat::take`)
//!           drop the seat         count r's leaving; the last of N to
//!                                 leave empties the meeting and frees
//!                                 its place
//! ```
//!
//! Cost model: where ranks run on cores of their own, a meeting costs the
//! cache lines that move between those cores, one after another where
//! ranks wait on one another. A meeting lives at one of a few arena places
//! given by its OpId (consecutive operations, consecutive places), so a
//! rank finds it by reading a place's key, a line every rank reads and
//! none writes; only the first to arrive takes the table's lock, to open
//! it. Each rank's offer goes to a slot of its own (a cache line of its
//! own), its arrival is one atomic add on the meeting's counter, which
//! the waiters read, and the seats read the others' slots, in parallel
//! and without a lock (`Slot` says who touches an offer when: a read-write
//! lock there cost every reader an atomic write on the slot's line).
//! Measured on a 16-core host (threads that only meet, 2026-11-29): 1.3-1.5
//! us for 2 ranks, 2.9-3.6 for 4, 6.8-8.5 for 8, where the first version
//! (everything under the table's lock, the waiters watching one counter
//! of the whole table) took 2.1-2.4, 6.4-6.7 and 18-21 us, and a bare
//! atomic barrier takes 0.09-0.12, 0.35-0.6 and 1.0-1.4 us
//! (BENCHMARKS.md). Meetings that find their places taken (more than
//! `PROBE` open at once among OpIds `ARENA` apart) open in the table's map
//! instead, under its lock; the first rank there decides, under the lock,
//! where the meeting is, after looking in both, so it is in one of them.
//!
//! Nothing is copied but the few bytes of an inline offer
//! (`OfferData::Inline`, up to `INLINE_BYTES` in all, which the offering
//! rank copies into its slot): a caller that reads a share in place
//! (`Met::bytes`) touches the depositor's bytes and nothing else, a taken
//! share is a reference-counted handle to them. Reading in place matters
//! where ranks run on cores of their own: each handle taken and dropped
//! moves its count's cache line between the cores, one rank after
//! another, and at 8 bytes that was most of what an AllToAll cost beyond
//! a barrier (BENCHMARKS.md, forty-seventh session).
//!
//! A meeting never mixes with messages: the local
//! communicator fails the job when a message meets a meeting of the same
//! operation (OpId) that is still waiting for ranks (see `LocalComm`), so
//! a rank that runs a message protocol where the others meet gets an
//! error instead of a hang.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;

use futures::task::AtomicWaker;

use super::mailbox::KeyHasher;
use crate::Rank;
use crate::error::CommError;
use crate::memory::Buffer;
use crate::stats::Statistics;
use crate::tag::{OpId, Tag};

/// What one rank brings to a meeting: a small header (the caller's to
/// encode, e.g. a collective's kind, type and count) and its data.
#[derive(Debug, Clone)]
pub struct Offer {
    /// Seen by every other rank as it is.
    pub head: [u64; 4],
    /// The buffers for the other ranks.
    pub data: OfferData,
}

/// The buffers of an [`Offer`].
#[derive(Debug, Clone)]
pub enum OfferData {
    /// The same buffer for every rank.
    Same(Buffer),
    /// One buffer per rank, indexed by rank (this rank's entry is unused).
    PerRank(Vec<Buffer>),
    /// One buffer, rank q's share its byte range `ranges[q]` (this rank's
    /// entry unused): one handle for every rank instead of one each, so
    /// the rank that closes the meeting drops one, not N.
    Ranges(Buffer, Vec<std::ops::Range<usize>>),
    /// A few bytes copied into the meeting itself ([`OfferData::same`],
    /// [`OfferData::ranges`] choose it): nothing behind a pointer for the
    /// other ranks to fetch from the offering rank's memory, and nothing
    /// for the closer to drop there.
    Inline(Inline),
}

/// Bytes an [`OfferData::Inline`] holds at most (all shares together).
pub const INLINE_BYTES: usize = 64;
/// Ranks an [`OfferData::Inline`] has shares for at most.
pub const INLINE_RANKS: usize = 8;

/// The shares of an [`OfferData::Inline`]: rank q's are the bytes from
/// the end of rank q - 1's to `ends[q]` (from 0 for rank 0); with
/// `ranks` 0 every rank's share is the first `ends[0]` bytes.
#[derive(Debug, Clone, Copy)]
pub struct Inline {
    bytes: [u8; INLINE_BYTES],
    ends: [u8; INLINE_RANKS],
    ranks: u8,
}

impl Inline {
    fn share(&self, q: Rank) -> Option<&[u8]> {
        let q = q as usize;
        let (start, end) = match self.ranks as usize {
            0 => (0, self.ends[0]),
            k if q < k => (if q == 0 { 0 } else { self.ends[q - 1] }, self.ends[q]),
            _ => return None,
        };
        self.bytes.get(start as usize..end as usize)
    }
}

impl OfferData {
    /// The same bytes for every rank: copied into the meeting where they
    /// are few (`INLINE_BYTES`), else `Same`.
    pub fn same(buf: Buffer) -> OfferData {
        let b = buf.as_slice();
        if b.len() <= INLINE_BYTES {
            let mut bytes = [0u8; INLINE_BYTES];
            bytes[..b.len()].copy_from_slice(b);
            let mut ends = [0u8; INLINE_RANKS];
            ends[0] = b.len() as u8;
            return OfferData::Inline(Inline {
                bytes,
                ends,
                ranks: 0,
            });
        }
        OfferData::Same(buf)
    }

    /// Rank q's share the bytes `range(q)` of `buf`, for `n` ranks: copied
    /// into the meeting where they are few (up to `INLINE_RANKS` ranks and
    /// `INLINE_BYTES` in all), else `Ranges`. A range outside `buf` makes
    /// an offer that the meeting refuses.
    pub fn ranges(
        buf: &Buffer,
        n: u32,
        range: impl Fn(Rank) -> std::ops::Range<usize>,
    ) -> OfferData {
        let b = buf.as_slice();
        if (1..=INLINE_RANKS).contains(&(n as usize)) {
            let mut bytes = [0u8; INLINE_BYTES];
            let mut ends = [0u8; INLINE_RANKS];
            let mut at = 0;
            let fits = (0..n).all(|q| match b.get(range(q)) {
                Some(s) if at + s.len() <= INLINE_BYTES => {
                    bytes[at..at + s.len()].copy_from_slice(s);
                    at += s.len();
                    ends[q as usize] = at as u8;
                    true
                }
                _ => false,
            });
            if fits {
                return OfferData::Inline(Inline {
                    bytes,
                    ends,
                    ranks: n as u8,
                });
            }
        }
        OfferData::Ranges(buf.clone(), (0..n).map(range).collect())
    }

    /// Rank `q`'s share, where it lies; `None` where the offer has no
    /// entry for `q` or its range lies outside the buffer.
    pub fn share(&self, q: Rank) -> Option<&[u8]> {
        match self {
            OfferData::Same(b) => Some(b.as_slice()),
            OfferData::PerRank(v) => v.get(q as usize).map(|b| b.as_slice()),
            OfferData::Ranges(b, r) => b.as_slice().get(r.get(q as usize)?.clone()),
            OfferData::Inline(i) => i.share(q),
        }
    }

    /// Rank `q`'s share as a handle of its own: a clone or a slice of the
    /// offered buffer (shared, not copied), or a copy of inline bytes.
    pub fn share_buffer(&self, q: Rank) -> Option<Buffer> {
        match self {
            OfferData::Same(b) => Some(b.clone()),
            OfferData::PerRank(v) => v.get(q as usize).cloned(),
            OfferData::Ranges(b, r) => {
                let r = r.get(q as usize)?;
                (r.start <= r.end && r.end <= b.len()).then(|| b.slice(r.clone()))
            }
            OfferData::Inline(i) => i.share(q).map(|s| Buffer::from_vec(s.to_vec())),
        }
    }

    /// The ranks it has an entry for (`None`: every rank).
    fn entries(&self) -> Option<usize> {
        match self {
            OfferData::Same(_) => None,
            OfferData::PerRank(v) => Some(v.len()),
            OfferData::Ranges(_, r) => Some(r.len()),
            OfferData::Inline(i) => (i.ranks > 0).then_some(i.ranks as usize),
        }
    }
}

/// What a rank takes from one other rank at a meeting.
#[derive(Debug, Clone)]
pub struct Taken {
    /// The rank that offered it.
    pub src: Rank,
    /// That rank's header.
    pub head: [u64; 4],
    /// That rank's buffer for the taker.
    pub data: Buffer,
}

/// One rank's place at a meeting, on a cache line of its own: written by
/// that rank (its offer, its waker), read by the others once all arrived.
///
/// The offer needs no lock; who touches it when is the meeting's protocol:
///
/// ```text
///   its rank    claims the slot (filled: false -> true; fails while an
///               offer is still there), writes the offer, then counts its
///               arrival (arrived += 1, release)
///   the others  read it only once they saw arrived = N (acquire), and
///               until they count their leaving (left += 1, release)
///   the closer  (the rank whose leaving made left = N) takes it out,
///               then frees the slot (filled = false, release)
/// ```
///
/// So a write happens only while no rank may read, and reads only while no
/// rank may write. Against a lock: no atomic read-modify-write per read
/// (three ranks reading one slot at once each took its lock's line in
/// turn).
#[repr(align(128))]
#[derive(Default)]
struct Slot {
    offer: std::cell::UnsafeCell<Option<Offer>>,
    /// Whether the slot holds an offer (claimed by its rank, freed by the
    /// closer); any rank may read it at any time (`Meeting::lacks`).
    filled: AtomicBool,
    waker: AtomicWaker,
}

// SAFETY: `offer` is written and read only as the protocol above allows
// (one writer at a time, never while a reader reads), ordered by
// `filled`, `Meeting::arrived` and `Meeting::left`; an `Offer` is `Send`
// and `Sync` (buffers are shared handles to immutable bytes).
unsafe impl Sync for Slot {}

impl Slot {
    /// The offer, for a rank that may read it (see the protocol above).
    ///
    /// # Safety
    /// The caller saw every rank arrive (`arrived` = N, acquire) and has
    /// not yet counted its leaving, or is the slot's own rank after its
    /// claim, or is the closer.
    unsafe fn offer(&self) -> &Option<Offer> {
        // SAFETY: per the caller's contract no rank writes meanwhile.
        unsafe { &*self.offer.get() }
    }
}

/// One tag's meeting: its ranks fill and read it without the table's lock.
pub(crate) struct Meeting {
    /// The tag it is open for, as `key_of` packs it; for an arena
    /// meeting, `CLOSING` while it is emptied and `FREE` once closed.
    key: AtomicU64,
    /// Ranks that have filled their slot (each adds one after filling it:
    /// a rank that reads N here sees every slot filled).
    arrived: Padded<AtomicU32>,
    /// Ranks that have taken their share.
    left: Padded<AtomicU32>,
    slots: Box<[Slot]>,
}

/// A value on a cache line of its own (two lines: the adjacent-line
/// prefetcher pairs them).
#[repr(align(128))]
#[derive(Default)]
struct Padded<T>(T);

/// `Meeting::key` of a closed arena meeting.
const FREE: u64 = 0;

/// `Meeting::key` of an arena meeting being emptied: no tag's (a closed
/// meeting's counts are reset while it has it, so no look at the place
/// takes that meeting for its tag's, incomplete) and not yet free.
const CLOSING: u64 = u64::MAX;

/// A tag as `Meeting::key` holds it (never `FREE`).
fn key_of(tag: Tag) -> u64 {
    tag.to_wire() + 1
}

impl Meeting {
    fn new(key: u64, n: u32) -> Self {
        Meeting {
            key: AtomicU64::new(key),
            arrived: Padded::default(),
            left: Padded::default(),
            slots: (0..n).map(|_| Slot::default()).collect(),
        }
    }

    fn tag(&self) -> Option<Tag> {
        Tag::from_wire(self.key.load(Ordering::Acquire).checked_sub(1)?)
    }

    fn complete(&self) -> bool {
        self.arrived.0.load(Ordering::Acquire) as usize == self.slots.len()
    }

    /// Whether `rank` has yet to arrive here.
    fn lacks(&self, rank: Rank) -> bool {
        self.slots
            .get(rank as usize)
            .is_some_and(|s| !s.filled.load(Ordering::Acquire))
    }

    /// Empties a meeting that every rank has left, for its next use (by
    /// its closer only). The counts are reset before any slot is freed: a
    /// rank can only arrive here again once its slot is free.
    fn empty(&self) {
        self.left.0.store(0, Ordering::Relaxed);
        self.arrived.0.store(0, Ordering::Release);
        for s in self.slots.iter() {
            // SAFETY: every rank has left (the caller is the closer): none
            // reads the offer, and none writes it until `filled` is false.
            let offer = unsafe { (*s.offer.get()).take() };
            drop(offer);
            drop(s.waker.take());
            s.filled.store(false, Ordering::Release);
        }
    }

    /// Wakes every rank that left a waker here but `except`.
    fn wake(&self, except: Option<Rank>) {
        for (q, s) in self.slots.iter().enumerate() {
            if Some(q as Rank) != except {
                s.waker.wake();
            }
        }
    }
}

/// Meetings kept in place, found without the table's lock (see
/// `Rendezvous::arena`). More than that many at once (or at places taken
/// by older meetings still open) go to the table's map.
const ARENA: usize = 64;

/// Arena places a tag may take: from its OpId's place on.
const PROBE: usize = 4;

/// Where a meeting is: a place of the arena, or the table's map.
pub(crate) enum Place {
    Arena(u32),
    Map(Arc<Meeting>),
}

#[derive(Default)]
struct State {
    /// Meetings that found no free arena place. Keyed with the mailbox's
    /// cheap hasher (tags are not attacker-chosen).
    overflow: HashMap<Tag, Arc<Meeting>, std::hash::BuildHasherDefault<KeyHasher>>,
    /// Set once the job failed: (the rank that failed it, why).
    failed: Option<(Rank, String)>,
    /// Ranks that finished their job (shut down): no meeting without them
    /// can complete.
    finished: Vec<Rank>,
}

/// The meeting table of one local world.
pub(crate) struct Rendezvous {
    nranks: u32,
    /// Meetings by place: a tag's meeting is at one of the `PROBE` places
    /// from its OpId's (`place_of`). A rank looks there without a lock;
    /// it opens a meeting (the first to arrive) under the table's lock,
    /// which looks at the arena and at `State::overflow` again first, so
    /// a tag's meeting is in one place only.
    arena: Box<[Meeting]>,
    state: Mutex<State>,
    /// Meetings in progress (lets a send skip the look when there are none).
    open: AtomicUsize,
    /// Meetings in `State::overflow`.
    overflowing: AtomicUsize,
    /// Set (under the lock) once the job failed or a rank finished: an
    /// arrival or a waiter then looks at the table (under its lock).
    alarm: AtomicBool,
    /// Each rank's statistics (empty: not counted). A rank's seat counts
    /// what it took from and gave to each peer at the meeting, as one
    /// message each way, in its own statistics only (no rank writes
    /// another's counters).
    stats: Vec<Arc<Statistics>>,
}

/// Where a rank stands after its deposit.
pub(crate) enum Arrival {
    /// It arrived last: its seat at the complete meeting.
    Last(Place),
    /// Others have yet to arrive: poll the meeting ([`MeetFuture`]).
    Wait(Place),
}

impl Rendezvous {
    pub(crate) fn new(nranks: u32) -> Self {
        Rendezvous {
            nranks,
            arena: (0..ARENA).map(|_| Meeting::new(FREE, nranks)).collect(),
            state: Mutex::default(),
            open: AtomicUsize::new(0),
            overflowing: AtomicUsize::new(0),
            alarm: AtomicBool::new(false),
            stats: Vec::new(),
        }
    }

    /// A table whose meetings count each rank's traffic in `stats[rank]`
    /// (one entry per rank), as the local backend's messages are counted.
    pub(crate) fn counted(nranks: u32, stats: Vec<Arc<Statistics>>) -> Self {
        Rendezvous {
            stats,
            ..Rendezvous::new(nranks)
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        super::lock_spinning(&self.state)
    }

    fn failure(rank: Rank, f: &(Rank, String)) -> CommError {
        CommError::Aborted {
            rank,
            peer: f.0,
            reason: f.1.clone(),
        }
    }

    /// Why `rank`'s wait at meeting `m` cannot end, if it cannot: the
    /// job failed (as `rank` sees it), or a rank that has yet to arrive
    /// there finished its job ([`CommError::PeerFinished`], this rank's
    /// own error, as over tcp and MPI where its receive from that rank
    /// fails so).
    fn failed_at(&self, rank: Rank, m: &Meeting) -> Option<CommError> {
        if !self.alarm.load(Ordering::Acquire) {
            return None;
        }
        // The finished rank first: it is why this meeting cannot end, even
        // where another of its ranks has failed over it meanwhile.
        let g = self.lock();
        if let (Some(gone), Some(tag)) = (g.finished.iter().find(|r| m.lacks(**r)), m.tag()) {
            return Some(CommError::PeerFinished {
                rank,
                peer: *gone,
                tag,
            });
        }
        g.failed.as_ref().map(|f| Self::failure(rank, f))
    }

    /// The first of a tag's arena places (consecutive OpIds, consecutive
    /// places; the stages of one operation share its places).
    fn place_of(tag: Tag) -> usize {
        tag.op.0 as usize % ARENA
    }

    /// The arena place of `tag`'s open meeting, if it has one there.
    fn find(&self, tag: Tag) -> Option<u32> {
        let key = key_of(tag);
        let first = Self::place_of(tag);
        (first..first + PROBE)
            .map(|i| i % ARENA)
            .find(|&i| self.arena[i].key.load(Ordering::Acquire) == key)
            .map(|i| i as u32)
    }

    fn meeting<'a>(&'a self, place: &'a Place) -> &'a Meeting {
        match place {
            Place::Arena(i) => &self.arena[*i as usize % ARENA],
            Place::Map(m) => m,
        }
    }

    /// `tag`'s meeting, opened if this rank is the first there; under the
    /// table's lock, with the job's failure and finished ranks checked.
    fn find_or_open(&self, rank: Rank, tag: Tag) -> Result<Place, CommError> {
        let mut g = self.lock();
        if let Some(f) = &g.failed {
            return Err(Self::failure(rank, f));
        }
        let place = match self.find(tag) {
            Some(i) => Place::Arena(i),
            None => match g.overflow.get(&tag) {
                Some(m) => Place::Map(m.clone()),
                None => {
                    self.open.fetch_add(1, Ordering::SeqCst);
                    let first = Self::place_of(tag);
                    let free = (first..first + PROBE)
                        .map(|i| i % ARENA)
                        .find(|&i| self.arena[i].key.load(Ordering::Acquire) == FREE);
                    match free {
                        Some(i) => {
                            self.arena[i].key.store(key_of(tag), Ordering::Release);
                            Place::Arena(i as u32)
                        }
                        None => {
                            let m = Arc::new(Meeting::new(key_of(tag), self.nranks));
                            g.overflow.insert(tag, m.clone());
                            self.overflowing.fetch_add(1, Ordering::SeqCst);
                            Place::Map(m)
                        }
                    }
                }
            },
        };
        // A rank that finished can never arrive: the meeting could not
        // complete. (A rank that finishes later finds this meeting
        // waiting for it: `finish`.)
        let m = self.meeting(&place);
        if let Some(gone) = g.finished.iter().find(|r| m.lacks(**r)) {
            return Err(CommError::PeerFinished {
                rank,
                peer: *gone,
                tag,
            });
        }
        Ok(place)
    }

    /// Leaves `rank`'s offer at `tag`. The rank that completes the
    /// meeting takes its share at once ([`Arrival::Last`]); the others
    /// poll for it ([`MeetFuture`]).
    pub(crate) fn deposit(&self, rank: Rank, tag: Tag, offer: Offer) -> Result<Arrival, CommError> {
        let n = self.nranks;
        if let Some(k) = offer.data.entries() {
            if k != n as usize {
                return Err(CommError::Protocol {
                    rank,
                    peer: None,
                    detail: format!("an offer for {k} ranks in a world of {n}"),
                });
            }
        }
        if let Some(q) = (0..n).find(|q| offer.data.share(*q).is_none()) {
            return Err(CommError::Protocol {
                rank,
                peer: Some(q),
                detail: format!("an offer whose share for rank {q} lies outside its buffer"),
            });
        }
        if rank >= n {
            return Err(CommError::InvalidRank {
                rank,
                peer: rank,
                nranks: n,
            });
        }
        // Without the lock where the meeting is open in the arena and
        // nothing went wrong; else under it.
        let place = match self.find(tag) {
            Some(i) if !self.alarm.load(Ordering::Acquire) => Place::Arena(i),
            _ => self.find_or_open(rank, tag)?,
        };
        let m = self.meeting(&place);
        let Some(slot) = m.slots.get(rank as usize) else {
            return Err(CommError::InvalidRank {
                rank,
                peer: rank,
                nranks: n,
            });
        };
        if slot
            .filled
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(CommError::Protocol {
                rank,
                peer: None,
                detail: format!("rank {rank} met twice at {tag:?}"),
            });
        }
        // SAFETY: this rank claimed the slot (above): no other rank reads
        // the offer until this rank counts its arrival, nor writes it
        // before the closer frees the slot again.
        unsafe { *slot.offer.get() = Some(offer) };
        let arrived = m.arrived.0.fetch_add(1, Ordering::AcqRel) + 1;
        if arrived < n {
            return Ok(Arrival::Wait(place));
        }
        m.wake(Some(rank));
        Ok(Arrival::Last(place))
    }

    /// `place` (taken from `place`) once every rank has arrived at its
    /// meeting; until then `Pending`, with `cx`'s waker left to be woken
    /// when the last arrives (or the job fails).
    fn poll_complete(
        &self,
        rank: Rank,
        place: &mut Option<Place>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Result<Place, CommError>> {
        let taken = || CommError::Protocol {
            rank,
            peer: None,
            detail: "a meeting polled after it completed".into(),
        };
        let Some(p) = place.as_ref() else {
            return Poll::Ready(Err(taken()));
        };
        let m = self.meeting(p);
        if !m.complete() {
            if let Some(s) = m.slots.get(rank as usize) {
                s.waker.register(cx.waker());
            }
            // Looked at again after the waker is in place: an arrival or
            // failure before that is seen here, one after wakes it.
            if !m.complete() {
                return match self.failed_at(rank, m) {
                    Some(e) => Poll::Ready(Err(e)),
                    None => Poll::Pending,
                };
            }
        }
        Poll::Ready(place.take().ok_or_else(taken))
    }

    /// Counts `rank`'s leaving of the complete meeting at `place`; the
    /// last of N to leave closes it.
    fn leave(&self, place: Place) {
        let m = self.meeting(&place);
        if m.left.0.fetch_add(1, Ordering::AcqRel) + 1 == self.nranks {
            self.close(place);
        }
    }

    /// Closes the meeting at `place`, which every rank has left: an arena
    /// meeting is emptied and its place freed (no lock: nothing else
    /// touches a meeting every rank has left, and only an opening, under
    /// the lock, takes a free place); a map meeting leaves the map.
    fn close(&self, place: Place) {
        match place {
            Place::Arena(i) => {
                let m = &self.arena[i as usize % ARENA];
                m.key.store(CLOSING, Ordering::Release);
                m.empty();
                m.key.store(FREE, Ordering::Release);
            }
            Place::Map(m) => {
                let mut g = self.lock();
                if let Some(tag) = m.tag() {
                    if g.overflow.get(&tag).is_some_and(|e| Arc::ptr_eq(e, &m)) {
                        g.overflow.remove(&tag);
                        self.overflowing.fetch_sub(1, Ordering::SeqCst);
                    }
                }
            }
        }
        self.open.fetch_sub(1, Ordering::SeqCst);
    }

    /// Whether a meeting of operation `op` (any stage) is still waiting
    /// for ranks. (A complete one may still be open while its ranks take;
    /// the fastest may already send that operation's later messages.)
    pub(crate) fn is_waiting(&self, op: OpId) -> bool {
        if self.open.load(Ordering::SeqCst) == 0 {
            return false;
        }
        // The key is read again after the count: a closer stores `CLOSING`
        // before it resets the count, so a reset count seen here (0, a
        // meeting that looks like it waits) comes with a key that is no
        // longer this meeting's (acquire on the count, release on its
        // reset). Without the second look a rank could read the key
        // before the closing and the count after it, and fail the job
        // for a message that was sent after the meeting completed.
        let of_op = |m: &Meeting| {
            let key = m.key.load(Ordering::Acquire);
            Tag::from_wire(key.wrapping_sub(1)).is_some_and(|t| t.op == op)
                && !m.complete()
                && m.key.load(Ordering::Acquire) == key
        };
        let first = Self::place_of(Tag::new(op, 0));
        if (first..first + PROBE).any(|i| of_op(&self.arena[i % ARENA])) {
            return true;
        }
        self.overflowing.load(Ordering::SeqCst) > 0
            && self.lock().overflow.values().any(|m| of_op(m))
    }

    /// Every open meeting (the arena's and the map's), under the lock.
    fn open_meetings<'a>(&'a self, g: &'a State) -> impl Iterator<Item = &'a Meeting> {
        self.arena
            .iter()
            .filter(|m| m.tag().is_some())
            .chain(g.overflow.values().map(|m| &**m))
    }

    /// Records that `rank` finished its job. A meeting that still waits
    /// for it can never complete: its waiters are woken, and each fails
    /// with [`CommError::PeerFinished`] naming `rank` (`failed_at`), as
    /// a later arrival there does (`find_or_open`).
    pub(crate) fn finish(&self, rank: Rank) {
        let mut g = self.lock();
        g.finished.push(rank);
        self.alarm.store(true, Ordering::Release);
        for m in self.open_meetings(&g).filter(|m| m.lacks(rank)) {
            m.wake(None);
        }
    }

    /// Fails every meeting, now and later, on behalf of `origin`.
    pub(crate) fn fail(&self, origin: Rank, reason: &str) {
        let mut g = self.lock();
        if g.failed.is_some() {
            return;
        }
        g.failed = Some((origin, reason.to_string()));
        self.alarm.store(true, Ordering::Release);
        for m in self.open_meetings(&g) {
            m.wake(None);
        }
    }
}

/// A meeting's outcome, as [`crate::comm::Communicator::meet`] returns
/// it: resolved at once where this rank arrived last (or could not
/// arrive), else polled at its meeting. No allocation either way, and no
/// count of shared references taken: it borrows the communicator's table.
#[must_use = "a meeting only completes for this rank once it is polled"]
pub struct MeetFuture<'a> {
    rank: Rank,
    state: MeetState<'a>,
}

enum MeetState<'a> {
    Ready(Option<Result<Seat<'a>, CommError>>),
    Waiting {
        rv: &'a Rendezvous,
        /// Until every rank has arrived.
        place: Option<Place>,
    },
}

impl<'a> MeetFuture<'a> {
    /// A meeting that `rank` could not take part in: why.
    pub fn failed(rank: Rank, e: CommError) -> Self {
        MeetFuture {
            rank,
            state: MeetState::Ready(Some(Err(e))),
        }
    }

    /// `rank`'s meeting after its deposit: complete (it arrived last) or
    /// waiting for the others.
    pub(crate) fn arrived(rv: &'a Rendezvous, rank: Rank, arrival: Arrival) -> Self {
        let state = match arrival {
            Arrival::Last(place) => MeetState::Ready(Some(Ok(Seat::new(rv, rank, place)))),
            Arrival::Wait(place) => MeetState::Waiting {
                rv,
                place: Some(place),
            },
        };
        MeetFuture { rank, state }
    }
}

impl std::fmt::Debug for MeetFuture<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            MeetState::Ready(_) => "ready".to_string(),
            MeetState::Waiting { rv, place } => match place {
                Some(p) => format!("waiting at {:?}", rv.meeting(p).tag()),
                None => "taken".to_string(),
            },
        };
        f.debug_struct("MeetFuture")
            .field("rank", &self.rank)
            .field("state", &state)
            .finish()
    }
}

impl<'a> Future for MeetFuture<'a> {
    type Output = Result<Seat<'a>, CommError>;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let rank = this.rank;
        let p = match &mut this.state {
            MeetState::Ready(r) => Poll::Ready(r.take().unwrap_or_else(|| {
                Err(CommError::Protocol {
                    rank,
                    peer: None,
                    detail: "a meeting polled after it completed".into(),
                })
            })),
            MeetState::Waiting { rv, place } => {
                let rv: &'a Rendezvous = rv;
                rv.poll_complete(rank, place, cx)
                    .map(|r| r.map(|p| Seat::new(rv, rank, p)))
            }
        };
        if p.is_ready() {
            this.state = MeetState::Ready(None);
        }
        p
    }
}

/// A rank's seat at a complete meeting: every other rank's offer, read in
/// place (`offers`: nothing cloned, for a caller that copies or reduces
/// the data where it is) or taken as shared handles (`take`). The rank
/// leaves the meeting when its seat is dropped; the last to leave closes
/// the meeting (its offers are dropped then).
pub struct Seat<'a> {
    rv: &'a Rendezvous,
    rank: Rank,
    /// `None` once left.
    place: Option<Place>,
}

/// One other rank's offer for the seat's rank, borrowed from the meeting.
#[derive(Debug, Clone)]
pub struct Met<'s> {
    /// The rank that offered it.
    pub src: Rank,
    /// That rank's header.
    pub head: [u64; 4],
    bytes: &'s [u8],
    offer: &'s OfferData,
    rank: Rank,
}

impl<'s> Met<'s> {
    /// The bytes that rank offered this rank, where they lie.
    pub fn bytes(&self) -> &'s [u8] {
        self.bytes
    }

    /// The same bytes as a handle of their own (shared, not copied, but
    /// for the few bytes of an inline offer).
    pub fn buffer(&self) -> Buffer {
        self.offer.share_buffer(self.rank).unwrap_or_default()
    }
}

impl<'a> Seat<'a> {
    fn new(rv: &'a Rendezvous, rank: Rank, place: Place) -> Self {
        let seat = Seat {
            rv,
            rank,
            place: Some(place),
        };
        seat.count();
        seat
    }

    /// Counts this rank's traffic at the meeting in its statistics: from
    /// each peer the bytes that peer offered it, to each peer the bytes
    /// it offered that peer (shared or copied, the data moved between
    /// them logically), one message each way.
    fn count(&self) {
        let (Some(stats), Some(p)) = (self.rv.stats.get(self.rank as usize), &self.place) else {
            return;
        };
        let m = self.rv.meeting(p);
        // SAFETY: the meeting is complete (a seat exists only then) and
        // this rank has not left it (its seat is being made).
        let own = m
            .slots
            .get(self.rank as usize)
            .and_then(|s| unsafe { s.offer() }.as_ref());
        for (q, s) in m.slots.iter().enumerate() {
            if q == self.rank as usize {
                continue;
            }
            let peer = q as Rank;
            // SAFETY: as above.
            if let Some(o) = unsafe { s.offer() }.as_ref() {
                stats.record_recv(peer, o.data.share(self.rank).map_or(0, |b| b.len()));
            }
            if let Some(o) = own {
                stats.record_send(peer, o.data.share(peer).map_or(0, |b| b.len()));
            }
        }
    }

    /// The other ranks' offers for this rank, in rank order, where they
    /// lie (no reference count touched: three ranks taking one buffer at
    /// once each moved its count's cache line).
    pub fn offers(&self) -> impl Iterator<Item = Result<Met<'_>, CommError>> + '_ {
        let rank = self.rank;
        let n = self.rv.nranks;
        let m = self.place.as_ref().map(|p| self.rv.meeting(p));
        m.into_iter()
            .flat_map(|m| m.slots.iter().enumerate())
            .filter(move |(q, _)| *q != rank as usize)
            .map(move |(q, s)| {
                let src = q as Rank;
                // SAFETY: the meeting is complete (a seat exists only
                // then) and this rank has not left it (its seat is alive).
                let o = unsafe { s.offer() };
                let Some(o) = o.as_ref() else {
                    return Err(CommError::Protocol {
                        rank,
                        peer: Some(src),
                        detail: format!("rank {src} has not arrived at a complete meeting"),
                    });
                };
                let bytes = o.data.share(rank).ok_or(CommError::InvalidRank {
                    rank,
                    peer: rank,
                    nranks: n,
                })?;
                Ok(Met {
                    src,
                    head: o.head,
                    bytes,
                    offer: &o.data,
                    rank,
                })
            })
    }

    /// The other ranks' offers for this rank, in rank order, as shared
    /// handles (the meeting's buffers outlive it); leaves the meeting.
    pub fn take(self) -> Result<Vec<Taken>, CommError> {
        let mut out = Vec::with_capacity(self.rv.nranks as usize - 1);
        for m in self.offers() {
            let m = m?;
            out.push(Taken {
                src: m.src,
                head: m.head,
                data: m.buffer(),
            });
        }
        Ok(out)
    }
}

impl Drop for Seat<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.place.take() {
            self.rv.leave(p);
        }
    }
}

impl std::fmt::Debug for Seat<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seat")
            .field("rank", &self.rank)
            .field(
                "tag",
                &self.place.as_ref().and_then(|p| self.rv.meeting(p).tag()),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt as _;
    use std::task::Waker;

    /// Every meeting closed: none open, no place taken, none in the map,
    /// no offer left behind.
    fn assert_all_closed(rv: &Rendezvous) {
        assert_eq!(rv.open.load(Ordering::SeqCst), 0);
        assert!(rv.lock().overflow.is_empty());
        for m in rv.arena.iter() {
            assert_eq!(m.key.load(Ordering::SeqCst), FREE);
            assert!(m.slots.iter().all(|s| !s.filled.load(Ordering::SeqCst)));
            // SAFETY: every meeting is closed: no rank touches a slot.
            assert!(m.slots.iter().all(|s| unsafe { s.offer() }.is_none()));
        }
    }

    /// What `r`'s deposit left it: a seat at once, or a future to poll.
    fn arrive(rv: &Rendezvous, r: Rank, tag: Tag, offer: Offer) -> MeetFuture<'_> {
        match rv.deposit(r, tag, offer) {
            Ok(a) => MeetFuture::arrived(rv, r, a),
            Err(e) => MeetFuture::failed(r, e),
        }
    }

    /// What a meeting's seat takes (leaving it).
    fn taken(r: Result<Seat<'_>, CommError>) -> Result<Vec<Taken>, CommError> {
        r?.take()
    }

    fn head(r: u64) -> [u64; 4] {
        [r, 0, 0, 0]
    }

    #[test]
    fn every_rank_takes_every_other_ranks_offer() {
        let rv = Arc::new(Rendezvous::new(3));
        let tag = Tag::new(OpId(7), 0);
        let mut futs = Vec::new();
        for r in 0..3u32 {
            let data = OfferData::PerRank(
                (0..3u8)
                    .map(|q| Buffer::from_vec(vec![r as u8 * 10 + q]))
                    .collect(),
            );
            let mut fut = arrive(
                &rv,
                r,
                tag,
                Offer {
                    head: head(r as u64),
                    data,
                },
            );
            let ready = matches!(fut.state, MeetState::Ready(_));
            assert_eq!(ready, r == 2, "taken at once only by the last");
            if r < 2 {
                assert!(
                    (&mut fut).now_or_never().is_none(),
                    "pending until every rank arrived"
                );
            }
            futs.push(fut);
        }
        for (r, fut) in futs.into_iter().enumerate() {
            let r = r as u32;
            let got = taken(fut.now_or_never().unwrap()).unwrap();
            let want: Vec<(u32, u8)> = (0..3u32)
                .filter(|q| *q != r)
                .map(|q| (q, q as u8 * 10 + r as u8))
                .collect();
            let seen: Vec<(u32, u8)> = got
                .iter()
                .map(|t| {
                    assert_eq!(t.head, head(t.src as u64));
                    (t.src, t.data.as_slice()[0])
                })
                .collect();
            assert_eq!(seen, want);
        }
        assert!(!rv.is_waiting(tag.op), "complete");
        // The last taker closed it.
        assert_all_closed(&rv);
    }

    /// A seat read in place holds the meeting open, its offers alive,
    /// until it is dropped; the last seat dropped closes it.
    #[test]
    fn a_seat_holds_the_meeting_until_it_is_dropped() {
        let rv = Rendezvous::new(2);
        let tag = Tag::new(OpId(9), 1);
        let offer = |r: u8| Offer {
            head: head(r as u64),
            data: OfferData::Same(Buffer::from_vec(vec![r; 3])),
        };
        let first = arrive(&rv, 0, tag, offer(7));
        let seat1 = arrive(&rv, 1, tag, offer(8))
            .now_or_never()
            .unwrap()
            .unwrap();
        let seat0 = first.now_or_never().unwrap().unwrap();
        let seen: Vec<(u32, Vec<u8>)> = seat0
            .offers()
            .map(|m| m.map(|m| (m.src, m.bytes().to_vec())))
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(seen, vec![(1, vec![8; 3])]);
        drop(seat0);
        assert_eq!(rv.open.load(Ordering::SeqCst), 1, "rank 1 still reads");
        let m = seat1.offers().next().unwrap().unwrap();
        assert_eq!((m.src, m.head, m.bytes()), (0, head(7), &[7u8; 3][..]));
        drop(seat1);
        assert_all_closed(&rv);
    }

    #[test]
    fn the_last_arrival_wakes_the_waiters() {
        let rv = Arc::new(Rendezvous::new(2));
        let tag = Tag::new(OpId(3), 0);
        let offer = |r: u64| Offer {
            head: head(r),
            data: OfferData::Same(Buffer::from_vec(vec![r as u8])),
        };
        let mut fut = arrive(&rv, 0, tag, offer(0));
        let woken = Arc::new(AtomicUsize::new(0));
        struct Count(Arc<AtomicUsize>);
        impl std::task::Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let waker = Waker::from(Arc::new(Count(woken.clone())));
        let mut cx = std::task::Context::from_waker(&waker);
        assert!(Pin::new(&mut fut).poll(&mut cx).is_pending());
        assert!(Pin::new(&mut fut).poll(&mut cx).is_pending());
        assert_eq!(woken.load(Ordering::SeqCst), 0);
        let last = taken(arrive(&rv, 1, tag, offer(1)).now_or_never().unwrap()).unwrap();
        assert_eq!(last[0].data.as_slice(), &[0]);
        assert_eq!(woken.load(Ordering::SeqCst), 1, "woken once");
        match Pin::new(&mut fut).poll(&mut cx) {
            Poll::Ready(r) => assert_eq!(taken(r).unwrap()[0].data.as_slice(), &[1]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_failure_releases_and_fails_the_waiters() {
        let rv = Arc::new(Rendezvous::new(2));
        let tag = Tag::new(OpId(1), 0);
        let offer = Offer {
            head: head(0),
            data: OfferData::Same(Buffer::default()),
        };
        let mut fut = arrive(&rv, 0, tag, offer.clone());
        assert!((&mut fut).now_or_never().is_none());
        assert!(rv.is_waiting(tag.op));
        assert!(!rv.is_waiting(OpId(2)));
        rv.fail(1, "test");
        assert!(matches!(
            fut.now_or_never(),
            Some(Err(CommError::Aborted {
                rank: 0,
                peer: 1,
                ..
            }))
        ));
        assert!(matches!(
            rv.deposit(1, tag, offer),
            Err(CommError::Aborted {
                rank: 1,
                peer: 1,
                ..
            })
        ));
    }

    #[test]
    fn an_offer_with_a_share_outside_its_buffer_is_refused() {
        let rv = Rendezvous::new(2);
        let tag = Tag::new(OpId(4), 0);
        let bad = Offer {
            head: head(0),
            data: OfferData::Ranges(Buffer::from_vec(vec![0; 4]), vec![0..0, 2..6]),
        };
        assert!(matches!(
            rv.deposit(0, tag, bad),
            Err(CommError::Protocol {
                rank: 0,
                peer: Some(1),
                ..
            })
        ));
        let short = Offer {
            head: head(0),
            data: OfferData::Ranges(
                Buffer::from_vec(vec![0; 4]),
                std::iter::once(0..4).collect(),
            ),
        };
        assert!(matches!(
            rv.deposit(0, tag, short),
            Err(CommError::Protocol {
                rank: 0,
                peer: None,
                ..
            })
        ));
        assert_all_closed(&rv);
    }

    /// Few bytes go inline, more stay in their buffer; either way every
    /// rank's share and its handle are the bytes asked for.
    #[test]
    fn offers_of_few_bytes_are_inline() {
        let buf = Buffer::from_vec((0..100u8).collect());
        let same = OfferData::same(buf.slice(10..20));
        assert!(matches!(same, OfferData::Inline(_)));
        for q in [0, 3, 200] {
            assert_eq!(same.share(q), Some(&buf.as_slice()[10..20]));
            assert_eq!(
                same.share_buffer(q).unwrap().as_slice(),
                &buf.as_slice()[10..20]
            );
        }
        assert!(matches!(OfferData::same(buf.clone()), OfferData::Same(_)));
        // Shares out of order, one empty, 5 ranks.
        let r = |q: u32| match q {
            2 => 0..0,
            q => 30 - 5 * q as usize..33 - 5 * q as usize,
        };
        let inl = OfferData::ranges(&buf, 5, r);
        assert!(matches!(inl, OfferData::Inline(_)));
        assert_eq!(inl.entries(), Some(5));
        for q in 0..5 {
            assert_eq!(inl.share(q), Some(&buf.as_slice()[r(q)]), "rank {q}");
            assert_eq!(
                inl.share_buffer(q).unwrap().as_slice(),
                &buf.as_slice()[r(q)]
            );
        }
        assert_eq!(inl.share(5), None);
        // Too many bytes, too many ranks, or a range outside the buffer.
        assert!(matches!(
            OfferData::ranges(&buf, 2, |q| 40 * q as usize..40 * q as usize + 40),
            OfferData::Ranges(..)
        ));
        assert!(matches!(
            OfferData::ranges(&buf, 9, |q| q as usize..q as usize + 1),
            OfferData::Ranges(..)
        ));
        let bad = OfferData::ranges(&buf, 2, |q| 99 * q as usize..99 * q as usize + 2);
        assert!(matches!(bad, OfferData::Ranges(..)));
        assert_eq!(bad.share(1), None);
    }

    #[test]
    fn meeting_twice_is_an_error() {
        let rv = Rendezvous::new(2);
        let tag = Tag::new(OpId(1), 0);
        let offer = Offer {
            head: head(0),
            data: OfferData::Same(Buffer::default()),
        };
        rv.deposit(0, tag, offer.clone()).unwrap();
        assert!(matches!(
            rv.deposit(0, tag, offer),
            Err(CommError::Protocol { rank: 0, .. })
        ));
    }

    /// Ranks on threads of their own meet thousands of times, six
    /// meetings in flight at once entered in opposite orders by odd and
    /// even ranks, their OpIds sharing arena places (so some open in the
    /// map, and which ones varies), tags reused: every rank takes exactly
    /// what each other rank left for it at that meeting, and the table
    /// ends empty.
    #[test]
    fn threads_meet_many_times_with_meetings_in_flight() {
        const N: u32 = 4;
        const ROUNDS: u32 = 1000;
        const AT_ONCE: u8 = 6;
        let rv = Arc::new(Rendezvous::new(N));
        let threads: Vec<_> = (0..N)
            .map(|r| {
                let rv = rv.clone();
                std::thread::spawn(move || {
                    // Rank 0 offers a buffer a rank, rank 1 one buffer
                    // in ranges, ranks 2 and 3 inline bytes.
                    let offer = |k: u32, w: u8| {
                        let all: Vec<u8> = (0..N)
                            .flat_map(|q| [r as u8, q as u8, w, k as u8])
                            .collect();
                        let buf = Buffer::from_vec(all);
                        let data = match r {
                            0 => OfferData::PerRank(
                                (0..N as usize)
                                    .map(|q| buf.slice(4 * q..4 * q + 4))
                                    .collect(),
                            ),
                            1 => OfferData::Ranges(
                                buf,
                                (0..N as usize).map(|q| 4 * q..4 * q + 4).collect(),
                            ),
                            _ => {
                                let d = OfferData::ranges(&buf, N, |q| {
                                    4 * q as usize..4 * q as usize + 4
                                });
                                assert!(matches!(d, OfferData::Inline(_)));
                                d
                            }
                        };
                        Offer {
                            head: [r as u64, k as u64, w as u64, 0],
                            data,
                        }
                    };
                    for k in 0..ROUNDS {
                        // Tags repeat every 5 rounds: reused once closed.
                        let tag = |w: u8| Tag::new(OpId(k % 5 + 1 + w as u32 * ARENA as u32), w);
                        let mut order: Vec<u8> = (0..AT_ONCE).collect();
                        if r % 2 == 1 {
                            order.reverse();
                        }
                        let mut futs: Vec<(u8, MeetFuture)> = order
                            .iter()
                            .map(|&w| (w, arrive(&rv, r, tag(w), offer(k, w))))
                            .collect();
                        for (w, fut) in futs.iter_mut() {
                            // Bounded: a rank that failed (panicked) never
                            // comes, and the test must fail, not hang.
                            let since = std::time::Instant::now();
                            let got = loop {
                                if let Some(g) = fut.now_or_never() {
                                    break g;
                                }
                                assert!(
                                    since.elapsed().as_secs() < 20,
                                    "rank {r} round {k}: stuck"
                                );
                                std::thread::yield_now();
                            };
                            let seat = got.unwrap_or_else(|e| panic!("rank {r} round {k}: {e}"));
                            // Every rank has arrived: whoever is closing
                            // it, the meeting no longer waits (a send
                            // for its operation is no mismatch).
                            for _ in 0..20 {
                                assert!(!rv.is_waiting(tag(*w).op), "rank {r} round {k}");
                            }
                            // Read in place on odd rounds (the seat leaves
                            // after the checks), taken on even ones.
                            let got: Vec<(u32, [u64; 4], Vec<u8>)> = if k % 2 == 1 {
                                let v = seat
                                    .offers()
                                    .map(|m| m.map(|m| (m.src, m.head, m.bytes().to_vec())))
                                    .collect::<Result<_, _>>()
                                    .unwrap();
                                drop(seat);
                                v
                            } else {
                                let v = seat.take().unwrap();
                                v.into_iter()
                                    .map(|t| (t.src, t.head, t.data.as_slice().to_vec()))
                                    .collect()
                            };
                            // Left: while another rank may be closing it,
                            // still no meeting of this operation waits (no
                            // later one can open before this rank goes on).
                            for _ in 0..50 {
                                assert!(!rv.is_waiting(tag(*w).op), "rank {r} round {k}, left");
                            }
                            let srcs: Vec<u32> = got.iter().map(|t| t.0).collect();
                            let want: Vec<u32> = (0..N).filter(|q| *q != r).collect();
                            assert_eq!(srcs, want);
                            for (src, head, data) in got {
                                assert_eq!(head, [src as u64, k as u64, *w as u64, 0]);
                                assert_eq!(data, [src as u8, r as u8, *w, k as u8]);
                            }
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_all_closed(&rv);
    }

    /// More meetings at once than their OpIds' arena places hold: the
    /// rest open in the table's map, ranks that arrive in the opposite
    /// order find each where it was opened, and every place is free at
    /// the end.
    #[test]
    fn meetings_past_their_arena_places_open_in_the_map() {
        let rv = Arc::new(Rendezvous::new(2));
        // OpIds with one first place: PROBE of them fill it, the rest
        // overflow.
        let tags: Vec<Tag> = (0..PROBE as u32 + 3)
            .map(|k| Tag::new(OpId(5 + k * ARENA as u32), 0))
            .collect();
        let offer = |r: u64, k: usize| Offer {
            head: [r, k as u64, 0, 0],
            data: OfferData::Same(Buffer::from_vec(vec![r as u8, k as u8])),
        };
        let mut waiting: Vec<MeetFuture> = tags
            .iter()
            .enumerate()
            .map(|(k, t)| arrive(&rv, 0, *t, offer(0, k)))
            .collect();
        assert_eq!(rv.lock().overflow.len(), 3);
        assert!(tags.iter().all(|t| rv.is_waiting(t.op)));
        for (k, t) in tags.iter().enumerate().rev() {
            let got = taken(arrive(&rv, 1, *t, offer(1, k)).now_or_never().unwrap()).unwrap();
            assert_eq!(got[0].data.as_slice(), &[0, k as u8]);
            assert!(!rv.is_waiting(t.op));
        }
        for (k, fut) in waiting.iter_mut().enumerate() {
            let got = taken(fut.now_or_never().unwrap()).unwrap();
            assert_eq!(got[0].head, [1, k as u64, 0, 0]);
            assert_eq!(got[0].data.as_slice(), &[1, k as u8]);
        }
        assert_all_closed(&rv);
    }
}
