//! In-process rendezvous: the ranks of one local world meet at a tag and
//! hand each other buffers directly, instead of one message per peer.
//!
//! A collective step in which every rank sends something to every other
//! rank (AllReduce's first step, a barrier) costs N - 1 framed messages
//! per rank over a transport; between threads of one process the same
//! step is one deposit and one take per rank:
//!
//! ```text
//!   rank r: deposit(tag, offer)   the last of N to arrive takes at once
//!                                 and wakes the others
//!           poll(tag): not all arrived -> leave a waker, Pending
//!                      all arrived     -> every other rank's head and its
//!                                         buffer for r (the last of N to
//!                                         take removes the meeting)
//! ```
//!
//! Cost model: a rank that arrives last locks the table once (deposit and
//! take together); one that waits locks it once to deposit, once per
//! poll before the others come and once to take. There is no event per
//! meeting: the waiters' wakers live in the meeting, and the last to
//! arrive wakes them under the lock (a wake only queues a task). Finished
//! meetings go to a spare list, so their vectors are reused.
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
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};

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

/// One tag's meeting.
struct Meet {
    offers: Vec<Option<Offer>>,
    /// The wakers of ranks that wait for the others to arrive, by rank.
    wakers: Vec<Option<Waker>>,
    arrived: u32,
    left: u32,
}

impl Meet {
    /// Wakes every rank that waits here.
    fn wake_all(&mut self) {
        for w in self.wakers.iter_mut() {
            if let Some(w) = w.take() {
                w.wake();
            }
        }
    }
}

/// Finished meetings kept for reuse (their vectors keep their capacity).
const SPARE_MEETS: usize = 16;

#[derive(Default)]
struct State {
    /// Keyed with the mailbox's cheap hasher (tags are not attacker-chosen).
    meets: HashMap<Tag, Meet, std::hash::BuildHasherDefault<KeyHasher>>,
    /// Set once the job failed: (the rank that failed it, why).
    failed: Option<(Rank, String)>,
    /// Ranks that finished their job (shut down): no meeting without them
    /// can complete.
    finished: Vec<Rank>,
    /// Finished meetings, emptied, for the next ones.
    spare: Vec<Meet>,
}

/// The meeting table of one local world.
#[derive(Default)]
pub(crate) struct Rendezvous {
    nranks: u32,
    state: Mutex<State>,
    /// Meetings in progress (lets a send skip the lock when there are none).
    open: AtomicUsize,
    /// Meetings completed, and failures, so far (bumped under the lock):
    /// a waiter that saw no change since its last look at the table knows
    /// without the lock that its meeting is still incomplete.
    changes: AtomicU64,
}

impl Rendezvous {
    pub(crate) fn new(nranks: u32) -> Self {
        Rendezvous {
            nranks,
            ..Default::default()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn failure(rank: Rank, f: &(Rank, String)) -> CommError {
        CommError::Aborted {
            rank,
            peer: f.0,
            reason: f.1.clone(),
        }
    }

    /// Leaves `rank`'s offer at `tag`. The rank that completes the
    /// meeting takes its share at once (`Some`); the others poll for it
    /// ([`Rendezvous::poll_take`]).
    pub(crate) fn deposit(
        &self,
        rank: Rank,
        tag: Tag,
        offer: Offer,
    ) -> Result<Option<Vec<Taken>>, CommError> {
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
        let mut guard = self.lock();
        let g = &mut *guard;
        if let Some(f) = &g.failed {
            return Err(Self::failure(rank, f));
        }
        let spare = &mut g.spare;
        let m = g.meets.entry(tag).or_insert_with(|| {
            self.open.fetch_add(1, Ordering::SeqCst);
            let mut m = spare.pop().unwrap_or_else(|| Meet {
                offers: Vec::new(),
                wakers: Vec::new(),
                arrived: 0,
                left: 0,
            });
            m.offers.resize(n as usize, None);
            m.wakers.resize(n as usize, None);
            m
        });
        let slot = &mut m.offers[rank as usize];
        if slot.is_some() {
            return Err(CommError::Protocol {
                rank,
                peer: None,
                detail: format!("rank {rank} met twice at {tag:?}"),
            });
        }
        *slot = Some(offer);
        let missing = |r: &&Rank| m.offers.get(**r as usize).is_some_and(|o| o.is_none());
        if let Some(gone) = g.finished.iter().find(missing) {
            return Err(CommError::PeerFinished {
                rank,
                peer: *gone,
                tag,
            });
        }
        m.arrived += 1;
        if m.arrived < n {
            return Ok(None);
        }
        self.changes.fetch_add(1, Ordering::Release);
        m.wake_all();
        self.take_locked(g, rank, tag).map(Some)
    }

    /// What every other rank left for `rank` at `tag`, in rank order, once
    /// all have arrived; until then `Pending`, with `cx`'s waker left to be
    /// woken when the last arrives (or the job fails).
    pub(crate) fn poll_take(
        &self,
        rank: Rank,
        tag: Tag,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Result<Vec<Taken>, CommError>> {
        let mut guard = self.lock();
        let g = &mut *guard;
        if let Some(f) = &g.failed {
            return Poll::Ready(Err(Self::failure(rank, f)));
        }
        if let Some(m) = g.meets.get_mut(&tag) {
            if m.arrived < self.nranks {
                if let Some(w) = m.wakers.get_mut(rank as usize) {
                    match w {
                        Some(w) if w.will_wake(cx.waker()) => {}
                        _ => *w = Some(cx.waker().clone()),
                    }
                }
                return Poll::Pending;
            }
        }
        Poll::Ready(self.take_locked(g, rank, tag))
    }

    /// Takes what every other rank left for `rank` at `tag`, in rank order
    /// (every rank has arrived); the last of N to take removes the meeting.
    fn take_locked(&self, g: &mut State, rank: Rank, tag: Tag) -> Result<Vec<Taken>, CommError> {
        let n = self.nranks;
        let Some(m) = g.meets.get_mut(&tag) else {
            return Err(CommError::Protocol {
                rank,
                peer: None,
                detail: format!("no meeting at {tag:?}"),
            });
        };
        let mut out = Vec::with_capacity(n as usize - 1);
        for (q, o) in m.offers.iter().enumerate() {
            if q == rank as usize {
                continue;
            }
            let Some(o) = o else {
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
        m.left += 1;
        if m.left == n {
            if let Some(mut m) = g.meets.remove(&tag) {
                if g.spare.len() < SPARE_MEETS {
                    m.offers.clear();
                    m.wakers.clear();
                    m.arrived = 0;
                    m.left = 0;
                    g.spare.push(m);
                }
            }
            self.open.fetch_sub(1, Ordering::SeqCst);
        }
        Ok(out)
    }

    /// Whether a meeting of operation `op` (any stage) is still waiting
    /// for ranks. (A complete one may still be open while its ranks take;
    /// the fastest may already send that operation's later messages.)
    pub(crate) fn is_waiting(&self, op: OpId) -> bool {
        if self.open.load(Ordering::SeqCst) == 0 {
            return false;
        }
        let n = self.nranks;
        self.lock()
            .meets
            .iter()
            .any(|(t, m)| t.op == op && m.arrived < n)
    }

    /// Records that `rank` finished its job; returns the tag of a meeting
    /// that still waits for it (which can then never complete), if any.
    pub(crate) fn finish(&self, rank: Rank) -> Option<Tag> {
        let mut g = self.lock();
        g.finished.push(rank);
        g.meets
            .iter()
            .find(|(_, m)| m.offers.get(rank as usize).is_some_and(|o| o.is_none()))
            .map(|(t, _)| *t)
    }

    /// Fails every meeting, now and later, on behalf of `origin`.
    pub(crate) fn fail(&self, origin: Rank, reason: &str) {
        let mut g = self.lock();
        if g.failed.is_some() {
            return;
        }
        g.failed = Some((origin, reason.to_string()));
        self.changes.fetch_add(1, Ordering::Release);
        for m in g.meets.values_mut() {
            m.wake_all();
        }
    }
}

/// A meeting's outcome, as [`crate::comm::Communicator::meet`] returns
/// it: resolved at once where this rank arrived last (or could not
/// arrive), else polled at the meeting table. No allocation either way.
#[must_use = "a meeting only completes for this rank once it is polled"]
pub struct MeetFuture {
    rank: Rank,
    state: MeetState,
}

enum MeetState {
    Ready(Option<Result<Vec<Taken>, CommError>>),
    Waiting {
        rv: Arc<Rendezvous>,
        tag: Tag,
        /// The table's `changes` read before the last look at it, and the
        /// identity (data, vtable) of the waker left there then: while
        /// both still hold, a poll (a polling waiter's many) returns
        /// `Pending` without the lock. (The table keeps that waker, and so
        /// its task, alive until `changes` moves: the identity cannot be
        /// another task's meanwhile.)
        seen: Option<(u64, usize, usize)>,
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

    /// `rank`'s share at `tag` of `rv`, once every rank has arrived.
    pub(crate) fn waiting(rv: Arc<Rendezvous>, rank: Rank, tag: Tag) -> Self {
        MeetFuture {
            rank,
            state: MeetState::Waiting {
                rv,
                tag,
                seen: None,
            },
        }
    }
}

impl std::fmt::Debug for MeetFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            MeetState::Ready(_) => "ready".to_string(),
            MeetState::Waiting { tag, .. } => format!("waiting at {tag:?}"),
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
            MeetState::Waiting { rv, tag, seen } => {
                // Read before the lock is taken: a completion after this
                // bumps the count past it, so the next poll looks again.
                let now = rv.changes.load(Ordering::Acquire);
                let w = cx.waker();
                let id = (
                    now,
                    w.data() as usize,
                    w.vtable() as *const std::task::RawWakerVTable as usize,
                );
                if *seen == Some(id) {
                    return Poll::Pending;
                }
                let p = rv.poll_take(rank, *tag, cx);
                *seen = p.is_pending().then_some(id);
                p
            }
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

    fn head(r: u64) -> [u64; 4] {
        [r, 0, 0, 0]
    }

    #[test]
    fn every_rank_takes_every_other_ranks_offer() {
        let rv = Arc::new(Rendezvous::new(3));
        let tag = Tag::new(OpId(7), 0);
        let mut got = Vec::new();
        for r in 0..3u32 {
            let data = OfferData::PerRank(
                (0..3u8)
                    .map(|q| Buffer::from_vec(vec![r as u8 * 10 + q]))
                    .collect(),
            );
            let early = rv
                .deposit(
                    r,
                    tag,
                    Offer {
                        head: head(r as u64),
                        data,
                    },
                )
                .unwrap();
            assert_eq!(early.is_some(), r == 2, "taken at once only by the last");
            if r < 2 {
                assert!(
                    MeetFuture::waiting(rv.clone(), r, tag)
                        .now_or_never()
                        .is_none(),
                    "pending until every rank arrived"
                );
            }
            got.push(early);
        }
        for (r, early) in got.into_iter().enumerate() {
            let r = r as u32;
            let got = match early {
                Some(t) => t,
                None => MeetFuture::waiting(rv.clone(), r, tag)
                    .now_or_never()
                    .unwrap()
                    .unwrap(),
            };
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
        assert_eq!(g.spare.len(), 1, "and keeps it for the next");
    }

    #[test]
    fn the_last_arrival_wakes_the_waiters() {
        let rv = Arc::new(Rendezvous::new(2));
        let tag = Tag::new(OpId(3), 0);
        let offer = |r: u64| Offer {
            head: head(r),
            data: OfferData::Same(Buffer::from_vec(vec![r as u8])),
        };
        assert!(rv.deposit(0, tag, offer(0)).unwrap().is_none());
        let woken = Arc::new(AtomicUsize::new(0));
        struct Count(Arc<AtomicUsize>);
        impl std::task::Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let waker = Waker::from(Arc::new(Count(woken.clone())));
        let mut cx = std::task::Context::from_waker(&waker);
        let mut fut = MeetFuture::waiting(rv.clone(), 0, tag);
        assert!(Pin::new(&mut fut).poll(&mut cx).is_pending());
        assert!(Pin::new(&mut fut).poll(&mut cx).is_pending());
        assert_eq!(woken.load(Ordering::SeqCst), 0);
        let last = rv.deposit(1, tag, offer(1)).unwrap().unwrap();
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
        assert!(rv.deposit(0, tag, offer.clone()).unwrap().is_none());
        let mut fut = MeetFuture::waiting(rv.clone(), 0, tag);
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
}
