//! In-process rendezvous: the ranks of one local world meet at a tag and
//! hand each other buffers directly, instead of one message per peer.
//!
//! A collective step in which every rank sends something to every other
//! rank (AllReduce's first step, a barrier) costs N - 1 framed messages
//! per rank over a transport; between threads of one process the same
//! step is one deposit and one take per rank:
//!
//! ```text
//!   rank r: deposit(tag, offer)   table lock: find or open the meeting;
//!                                 then, outside it: fill r's slot, count
//!                                 the arrival; the last of N takes at once
//!                                 and wakes the others
//!           poll: arrivals < N -> leave a waker in r's slot, Pending
//!                 arrivals = N -> every other rank's head and its buffer
//!                                 for r, read from their slots (the last
//!                                 of N to take closes the meeting)
//! ```
//!
//! Cost model: where ranks run on cores of their own, a meeting costs the
//! cache lines that move between those cores, one after another where
//! ranks wait on one another. Each rank takes the table's lock once, for
//! a map lookup; its offer goes to a slot of its own (a cache line of its
//! own), its arrival is one atomic add on the meeting's counter, which
//! the waiters read, and the takes read the others' slots, in parallel;
//! the last to take locks the table once more to close the meeting, and
//! empties it for reuse outside that lock. Measured on a 16-core host
//! (threads that only meet, 2026-11-29): 1.8-2.0 us for 2 ranks, 3.7-3.8
//! for 4, 7.0-7.3 for 8, where the first version (everything under the
//! table's lock, the waiters watching one counter of the whole table)
//! took 2.1-2.4, 6.4-6.7 and 18-21 us, and a bare atomic barrier takes
//! 0.09, 0.45-0.5 and 1.0-1.2 us (BENCHMARKS.md).
//!
//! Nothing is copied: a taken buffer is a reference-counted handle to the
//! depositor's bytes. A meeting never mixes with messages: the local
//! communicator fails the job when a message meets a meeting of the same
//! operation (OpId) that is still waiting for ranks (see `LocalComm`), so
//! a rank that runs a message protocol where the others meet gets an
//! error instead of a hang.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::Poll;

use futures::task::AtomicWaker;

use super::mailbox::KeyHasher;
use crate::Rank;
use crate::error::CommError;
use crate::memory::Buffer;
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
#[repr(align(128))]
#[derive(Default)]
struct Slot {
    offer: OnceLock<Offer>,
    waker: AtomicWaker,
}

/// One tag's meeting. Shared by its ranks (`Arc`) from their arrival to
/// their take, so that they fill and read it without the table's lock.
pub(crate) struct Meeting {
    tag: Tag,
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

impl Meeting {
    fn new(tag: Tag, n: u32) -> Self {
        Meeting {
            tag,
            arrived: Padded::default(),
            left: Padded::default(),
            slots: (0..n).map(|_| Slot::default()).collect(),
        }
    }

    /// Emptied for its next use (through its only handle).
    fn reset(&mut self) {
        *self.arrived.0.get_mut() = 0;
        *self.left.0.get_mut() = 0;
        for s in self.slots.iter_mut() {
            s.offer.take();
            s.waker = AtomicWaker::new();
        }
    }

    fn complete(&self) -> bool {
        self.arrived.0.load(Ordering::Acquire) as usize == self.slots.len()
    }

    /// Wakes every rank that left a waker here.
    fn wake_all(&self) {
        for s in self.slots.iter() {
            s.waker.wake();
        }
    }

    /// Wakes every rank but `rank` (the one that arrived last).
    fn wake_others(&self, rank: Rank) {
        for (q, s) in self.slots.iter().enumerate() {
            if q != rank as usize {
                s.waker.wake();
            }
        }
    }
}

/// Finished meetings kept for reuse (their slots keep their allocation).
const SPARE_MEETS: usize = 16;

#[derive(Default)]
struct State {
    /// Keyed with the mailbox's cheap hasher (tags are not attacker-chosen).
    meets: HashMap<Tag, Arc<Meeting>, std::hash::BuildHasherDefault<KeyHasher>>,
    /// Set once the job failed: (the rank that failed it, why).
    failed: Option<(Rank, String)>,
    /// Ranks that finished their job (shut down): no meeting without them
    /// can complete.
    finished: Vec<Rank>,
}

/// The meeting table of one local world.
#[derive(Default)]
pub(crate) struct Rendezvous {
    nranks: u32,
    state: Mutex<State>,
    /// Closed meetings no rank holds, emptied, for the next ones (a lock
    /// of its own: they are emptied and put here outside the table's).
    spare: Padded<Mutex<Vec<Arc<Meeting>>>>,
    /// Meetings in progress (lets a send skip the lock when there are none).
    open: AtomicUsize,
    /// Set (under the lock) once the job failed: a waiter checks it
    /// without the lock.
    failed: AtomicBool,
}

/// Where a rank stands after its deposit.
pub(crate) enum Arrival {
    /// It arrived last: what every other rank left for it.
    Last(Vec<Taken>),
    /// Others have yet to arrive: poll the meeting ([`MeetFuture`]).
    Wait(Arc<Meeting>),
}

impl Rendezvous {
    pub(crate) fn new(nranks: u32) -> Self {
        Rendezvous {
            nranks,
            ..Default::default()
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

    /// The job's failure as `rank` sees it, if it failed.
    fn failed_for(&self, rank: Rank) -> Option<CommError> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        self.lock().failed.as_ref().map(|f| Self::failure(rank, f))
    }

    /// Leaves `rank`'s offer at `tag`. The rank that completes the
    /// meeting takes its share at once ([`Arrival::Last`]); the others
    /// poll for it ([`MeetFuture`]).
    pub(crate) fn deposit(&self, rank: Rank, tag: Tag, offer: Offer) -> Result<Arrival, CommError> {
        let n = self.nranks;
        if let OfferData::PerRank(v) = &offer.data {
            if v.len() != n as usize {
                return Err(CommError::Protocol {
                    rank,
                    peer: None,
                    detail: format!("an offer for {} ranks in a world of {n}", v.len()),
                });
            }
        }
        if rank >= n {
            return Err(CommError::InvalidRank {
                rank,
                peer: rank,
                nranks: n,
            });
        }
        let m = {
            let mut guard = self.lock();
            let g = &mut *guard;
            if let Some(f) = &g.failed {
                return Err(Self::failure(rank, f));
            }
            let m = g
                .meets
                .entry(tag)
                .or_insert_with(|| {
                    self.open.fetch_add(1, Ordering::SeqCst);
                    let mut m = super::lock_spinning(&self.spare.0).pop();
                    match m.as_mut().and_then(Arc::get_mut) {
                        Some(m) => m.tag = tag,
                        None => m = None,
                    }
                    m.unwrap_or_else(|| Arc::new(Meeting::new(tag, n)))
                })
                .clone();
            // A rank that finished can never arrive: the meeting could
            // not complete. (A rank that finishes later finds this
            // meeting waiting for it: `finish`.)
            let missing = |r: &&Rank| {
                m.slots
                    .get(**r as usize)
                    .is_some_and(|s| s.offer.get().is_none())
            };
            if let Some(gone) = g.finished.iter().find(missing) {
                return Err(CommError::PeerFinished {
                    rank,
                    peer: *gone,
                    tag,
                });
            }
            m
        };
        let Some(slot) = m.slots.get(rank as usize) else {
            return Err(CommError::InvalidRank {
                rank,
                peer: rank,
                nranks: n,
            });
        };
        if slot.offer.set(offer).is_err() {
            return Err(CommError::Protocol {
                rank,
                peer: None,
                detail: format!("rank {rank} met twice at {tag:?}"),
            });
        }
        let arrived = m.arrived.0.fetch_add(1, Ordering::AcqRel) + 1;
        if arrived < n {
            return Ok(Arrival::Wait(m));
        }
        m.wake_others(rank);
        self.take(m, rank).map(Arrival::Last)
    }

    /// `rank`'s share of the meeting in `m` once every rank has arrived
    /// (taking the handle out of `m`); until then `Pending`, with `cx`'s
    /// waker left to be woken when the last arrives (or the job fails).
    fn poll_take(
        &self,
        rank: Rank,
        m: &mut Option<Arc<Meeting>>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Result<Vec<Taken>, CommError>> {
        let Some(meeting) = m.as_ref() else {
            return Poll::Ready(Err(CommError::Protocol {
                rank,
                peer: None,
                detail: "a meeting polled after it completed".into(),
            }));
        };
        if !meeting.complete() {
            if let Some(s) = meeting.slots.get(rank as usize) {
                s.waker.register(cx.waker());
            }
            // Looked at again after the waker is in place: an arrival or
            // failure before that is seen here, one after wakes it.
            if !meeting.complete() {
                return match self.failed_for(rank) {
                    Some(e) => Poll::Ready(Err(e)),
                    None => Poll::Pending,
                };
            }
        }
        match m.take() {
            Some(meeting) => Poll::Ready(self.take(meeting, rank)),
            None => Poll::Pending,
        }
    }

    /// Takes what every other rank left for `rank` at the complete meeting
    /// `m`, in rank order; the last of N to take closes the meeting.
    fn take(&self, m: Arc<Meeting>, rank: Rank) -> Result<Vec<Taken>, CommError> {
        let n = self.nranks;
        let tag = m.tag;
        let mut out = Vec::with_capacity(n as usize - 1);
        for (q, s) in m.slots.iter().enumerate() {
            if q == rank as usize {
                continue;
            }
            let Some(o) = s.offer.get() else {
                return Err(CommError::Protocol {
                    rank,
                    peer: Some(q as Rank),
                    detail: format!("rank {q} has not arrived at {tag:?}"),
                });
            };
            let data = match &o.data {
                OfferData::Same(b) => b.clone(),
                OfferData::PerRank(v) => match v.get(rank as usize) {
                    Some(b) => b.clone(),
                    None => {
                        return Err(CommError::InvalidRank {
                            rank,
                            peer: rank,
                            nranks: n,
                        });
                    }
                },
            };
            out.push(Taken {
                src: q as Rank,
                head: o.head,
                data,
            });
        }
        if m.left.0.fetch_add(1, Ordering::AcqRel) + 1 == n {
            self.close(m);
        }
        Ok(out)
    }

    /// Removes the meeting `m`, which every rank has left, from the table;
    /// keeps it for reuse where no rank holds it any more (the others drop
    /// their handles as they take, so usually none does).
    fn close(&self, mut m: Arc<Meeting>) {
        {
            let mut g = self.lock();
            if g.meets.get(&m.tag).is_some_and(|e| Arc::ptr_eq(e, &m)) {
                g.meets.remove(&m.tag);
                self.open.fetch_sub(1, Ordering::SeqCst);
            }
        }
        if let Some(meeting) = Arc::get_mut(&mut m) {
            meeting.reset();
            let mut spare = super::lock_spinning(&self.spare.0);
            if spare.len() < SPARE_MEETS {
                spare.push(m);
            }
        }
    }

    /// Whether a meeting of operation `op` (any stage) is still waiting
    /// for ranks. (A complete one may still be open while its ranks take;
    /// the fastest may already send that operation's later messages.)
    pub(crate) fn is_waiting(&self, op: OpId) -> bool {
        if self.open.load(Ordering::SeqCst) == 0 {
            return false;
        }
        self.lock()
            .meets
            .iter()
            .any(|(t, m)| t.op == op && !m.complete())
    }

    /// Records that `rank` finished its job; returns the tag of a meeting
    /// that still waits for it (which can then never complete), if any.
    pub(crate) fn finish(&self, rank: Rank) -> Option<Tag> {
        let mut g = self.lock();
        g.finished.push(rank);
        g.meets
            .iter()
            .find(|(_, m)| {
                m.slots
                    .get(rank as usize)
                    .is_some_and(|s| s.offer.get().is_none())
            })
            .map(|(t, _)| *t)
    }

    /// Fails every meeting, now and later, on behalf of `origin`.
    pub(crate) fn fail(&self, origin: Rank, reason: &str) {
        let mut g = self.lock();
        if g.failed.is_some() {
            return;
        }
        g.failed = Some((origin, reason.to_string()));
        self.failed.store(true, Ordering::Release);
        for m in g.meets.values() {
            m.wake_all();
        }
    }
}

/// A meeting's outcome, as [`crate::comm::Communicator::meet`] returns
/// it: resolved at once where this rank arrived last (or could not
/// arrive), else polled at its meeting. No allocation either way.
#[must_use = "a meeting only completes for this rank once it is polled"]
pub struct MeetFuture {
    rank: Rank,
    state: MeetState,
}

enum MeetState {
    Ready(Option<Result<Vec<Taken>, CommError>>),
    Waiting {
        rv: Arc<Rendezvous>,
        /// Until this rank has taken its share.
        meeting: Option<Arc<Meeting>>,
    },
}

impl MeetFuture {
    /// A meeting already decided for `rank`: what it took, or why not.
    pub fn ready(rank: Rank, r: Result<Vec<Taken>, CommError>) -> Self {
        MeetFuture {
            rank,
            state: MeetState::Ready(Some(r)),
        }
    }

    /// `rank`'s share of `meeting` at `rv`, once every rank has arrived.
    pub(crate) fn waiting(rv: Arc<Rendezvous>, rank: Rank, meeting: Arc<Meeting>) -> Self {
        MeetFuture {
            rank,
            state: MeetState::Waiting {
                rv,
                meeting: Some(meeting),
            },
        }
    }
}

impl std::fmt::Debug for MeetFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            MeetState::Ready(_) => "ready".to_string(),
            MeetState::Waiting { meeting, .. } => match meeting {
                Some(m) => format!("waiting at {:?}", m.tag),
                None => "taken".to_string(),
            },
        };
        f.debug_struct("MeetFuture")
            .field("rank", &self.rank)
            .field("state", &state)
            .finish()
    }
}

impl Future for MeetFuture {
    type Output = Result<Vec<Taken>, CommError>;

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
            MeetState::Waiting { rv, meeting } => rv.poll_take(rank, meeting, cx),
        };
        if p.is_ready() {
            this.state = MeetState::Ready(None);
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt as _;
    use std::task::Waker;

    /// What `r`'s deposit left it: taken at once, or a future to poll.
    fn arrive(rv: &Arc<Rendezvous>, r: Rank, tag: Tag, offer: Offer) -> MeetFuture {
        match rv.deposit(r, tag, offer) {
            Ok(Arrival::Last(t)) => MeetFuture::ready(r, Ok(t)),
            Ok(Arrival::Wait(m)) => MeetFuture::waiting(rv.clone(), r, m),
            Err(e) => MeetFuture::ready(r, Err(e)),
        }
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
            let got = fut.now_or_never().unwrap().unwrap();
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
        let g = rv.lock();
        assert!(g.meets.is_empty(), "the last taker removes the meeting");
        assert_eq!(
            rv.spare.0.lock().unwrap().len(),
            1,
            "and keeps it for the next"
        );
        assert_eq!(rv.open.load(Ordering::SeqCst), 0);
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
        let last = arrive(&rv, 1, tag, offer(1))
            .now_or_never()
            .unwrap()
            .unwrap();
        assert_eq!(last[0].data.as_slice(), &[0]);
        assert_eq!(woken.load(Ordering::SeqCst), 1, "woken once");
        match Pin::new(&mut fut).poll(&mut cx) {
            Poll::Ready(Ok(t)) => assert_eq!(t[0].data.as_slice(), &[1]),
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

    /// Ranks on threads of their own meet thousands of times, two
    /// meetings in flight at once entered in opposite orders by odd and
    /// even ranks, tags reused: every rank takes exactly what each other
    /// rank left for it at that meeting, and the table ends empty.
    #[test]
    fn threads_meet_many_times_with_two_meetings_in_flight() {
        const N: u32 = 4;
        const ROUNDS: u32 = 2000;
        let rv = Arc::new(Rendezvous::new(N));
        let threads: Vec<_> = (0..N)
            .map(|r| {
                let rv = rv.clone();
                std::thread::spawn(move || {
                    let offer = |k: u32, which: u8| Offer {
                        head: [r as u64, k as u64, which as u64, 0],
                        data: OfferData::PerRank(
                            (0..N)
                                .map(|q| Buffer::from_vec(vec![r as u8, q as u8, which, k as u8]))
                                .collect(),
                        ),
                    };
                    for k in 0..ROUNDS {
                        // Tags repeat every 7 rounds: reused once closed.
                        let tags = [Tag::new(OpId(k % 7 + 1), 0), Tag::new(OpId(k % 7 + 1), 1)];
                        let order: [u8; 2] = if r % 2 == 0 { [0, 1] } else { [1, 0] };
                        let mut futs: Vec<(u8, MeetFuture)> = order
                            .iter()
                            .map(|&w| (w, arrive(&rv, r, tags[w as usize], offer(k, w))))
                            .collect();
                        for (w, fut) in futs.iter_mut() {
                            let got = loop {
                                if let Some(g) = fut.now_or_never() {
                                    break g;
                                }
                                std::thread::yield_now();
                            };
                            let got = got.unwrap_or_else(|e| panic!("rank {r} round {k}: {e}"));
                            let srcs: Vec<u32> = got.iter().map(|t| t.src).collect();
                            let want: Vec<u32> = (0..N).filter(|q| *q != r).collect();
                            assert_eq!(srcs, want);
                            for t in got {
                                assert_eq!(t.head, [t.src as u64, k as u64, *w as u64, 0]);
                                assert_eq!(t.data.as_slice(), &[t.src as u8, r as u8, *w, k as u8]);
                            }
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(rv.lock().meets.is_empty());
        assert_eq!(rv.open.load(Ordering::SeqCst), 0);
    }
}
