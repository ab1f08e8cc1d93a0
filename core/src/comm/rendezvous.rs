//! In-process rendezvous: the ranks of one local world meet at a tag and
//! hand each other buffers directly, instead of one message per peer.
//!
//! A collective step in which every rank sends something to every other
//! rank (AllReduce's first step, a barrier) costs N - 1 framed messages
//! per rank over a transport; between threads of one process the same
//! step is one deposit and one take per rank:
//!
//! ```text
//!   rank r: deposit(tag, offer)        (the last of N to arrive sets `done`)
//!           wait(done)
//!           take(tag): every other rank's head and its buffer for r
//!                      (the last of N to take removes the meeting)
//! ```
//!
//! Nothing is copied: a taken buffer is a reference-counted handle to the
//! depositor's bytes. A meeting never mixes with messages: the local
//! communicator fails the job when a message meets a meeting of the same
//! operation (OpId) that is still waiting for ranks (see `LocalComm`), so
//! a rank that runs a message protocol where the others meet gets an
//! error instead of a hang.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::mailbox::KeyHasher;
use crate::Rank;
use crate::error::CommError;
use crate::event::Event;
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
    arrived: u32,
    left: u32,
    done: Event,
}

#[derive(Default)]
struct State {
    /// Keyed with the mailbox's cheap hasher (tags are not attacker-chosen).
    meets: HashMap<Tag, Meet, std::hash::BuildHasherDefault<KeyHasher>>,
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
    /// Meetings in progress (lets a send skip the lock when there are none).
    open: AtomicUsize,
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

    /// Leaves `rank`'s offer at `tag`; the returned event is set once every
    /// rank has arrived (or the job failed).
    pub(crate) fn deposit(&self, rank: Rank, tag: Tag, offer: Offer) -> Result<Event, CommError> {
        if let OfferData::PerRank(v) = &offer.data {
            if v.len() != self.nranks as usize {
                return Err(CommError::Protocol {
                    rank,
                    peer: None,
                    detail: format!(
                        "an offer for {} ranks in a world of {}",
                        v.len(),
                        self.nranks
                    ),
                });
            }
        }
        let mut guard = self.lock();
        let g = &mut *guard;
        if let Some(f) = &g.failed {
            return Err(Self::failure(rank, f));
        }
        let n = self.nranks;
        let m = g.meets.entry(tag).or_insert_with(|| {
            self.open.fetch_add(1, Ordering::SeqCst);
            Meet {
                offers: vec![None; n as usize],
                arrived: 0,
                left: 0,
                done: Event::new(),
            }
        });
        let Some(slot) = m.offers.get_mut(rank as usize) else {
            return Err(CommError::InvalidRank {
                rank,
                peer: rank,
                nranks: n,
            });
        };
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
        if m.arrived == n {
            m.done.set();
        }
        Ok(m.done.clone())
    }

    /// Takes what every other rank left for `rank` at `tag`, in rank order;
    /// call once the deposit's event is set.
    pub(crate) fn take(&self, rank: Rank, tag: Tag) -> Result<Vec<Taken>, CommError> {
        let mut g = self.lock();
        if let Some(f) = &g.failed {
            return Err(Self::failure(rank, f));
        }
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
            g.meets.remove(&tag);
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
        for m in g.meets.values() {
            m.done.set();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(r: u64) -> [u64; 4] {
        [r, 0, 0, 0]
    }

    #[test]
    fn every_rank_takes_every_other_ranks_offer() {
        let rv = Rendezvous::new(3);
        let tag = Tag::new(OpId(7), 0);
        let mut events = Vec::new();
        for r in 0..3u32 {
            let data = OfferData::PerRank(
                (0..3u8)
                    .map(|q| Buffer::from_vec(vec![r as u8 * 10 + q]))
                    .collect(),
            );
            let ev = rv
                .deposit(
                    r,
                    tag,
                    Offer {
                        head: head(r as u64),
                        data,
                    },
                )
                .unwrap();
            assert_eq!(ev.is_set(), r == 2, "set only when the last arrives");
            events.push(ev);
        }
        for r in 0..3u32 {
            let got = rv.take(r, tag).unwrap();
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
        assert!(
            rv.lock().meets.is_empty(),
            "the last taker removes the meeting"
        );
    }

    #[test]
    fn a_failure_releases_and_fails_the_waiters() {
        let rv = Rendezvous::new(2);
        let tag = Tag::new(OpId(1), 0);
        let offer = Offer {
            head: head(0),
            data: OfferData::Same(Buffer::default()),
        };
        let ev = rv.deposit(0, tag, offer.clone()).unwrap();
        assert!(!ev.is_set());
        assert!(rv.is_waiting(tag.op));
        assert!(!rv.is_waiting(OpId(2)));
        rv.fail(1, "test");
        assert!(ev.is_set());
        assert!(matches!(
            rv.take(0, tag),
            Err(CommError::Aborted {
                rank: 0,
                peer: 1,
                ..
            })
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
