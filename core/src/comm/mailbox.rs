//! `Mailbox`: the receive side shared by every backend. Messages that
//! arrive before their receive is posted wait in a per-(src, tag) queue;
//! receives posted before their message wait in a per-(src, tag) queue of
//! waiters. One lock orders both, so per-(src, tag) order is the delivery
//! order. A failure (dead peer, abort) fails every waiter and every later
//! receive. A peer that finished its job (`peer_finished`, with the number
//! of messages it sent here) fails, once all of those are delivered, the
//! receives from it that find nothing queued: the ranks' calls differ, and
//! such a receive would otherwise wait for ever. (This assumes that a
//! receive of a (src, tag) with another posted behind it is only dropped
//! before its message comes, as braid's protocols do: they post one
//! receive at a time, or a frame's header and data receives together,
//! dropping the data's only when the header says it came inline. Were a
//! receive dropped after the last message came to it, that message would
//! go back to a queue whose other receive may have been failed already.)
//!
//! Receive futures are cancel-safe: a message handed to a receive that is
//! dropped before it is polled again goes back to the front of its queue;
//! a receive dropped before its message leaves no waiter behind.
//!
//! Once its rank shuts down (`close`), the mailbox refuses new receives
//! with [`CommError::Shutdown`], and a receive from the rank itself that
//! still waits fails the same way: nothing can deliver to it any more.
//!
//! A receive may offer a landing (`recv_landing`): memory of the caller's
//! that the transport delivering its message writes into directly
//! (`claim`, then a view of that memory delivered like any message).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use tokio::sync::oneshot;

use crate::Rank;
use crate::error::CommError;
use crate::memory::{Buffer, Landing};
use crate::tag::{OpId, Tag};

type Key = (Rank, Tag);

/// The mailbox's hash of a (src, tag) key: one multiply per word (the
/// FxHash step). The default SipHash cost ~7% of a small collective's time;
/// keys come from the job's own ranks, so hash flooding is not a concern.
#[derive(Default, Clone, Copy)]
pub(crate) struct KeyHasher(u64);

impl KeyHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl std::hash::Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.add(u64::from(*b));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type KeyMap<V> = HashMap<Key, V, std::hash::BuildHasherDefault<KeyHasher>>;
/// A posted receive: where its message goes, and the caller's memory it
/// may be written into directly (`Mailbox::claim`).
struct Waiter {
    tx: oneshot::Sender<Result<Buffer, CommError>>,
    landing: Option<Landing>,
}

#[derive(Default)]
struct Slot {
    queue: Fifo<Buffer>,
    waiters: Fifo<Waiter>,
}

/// A FIFO that holds one entry without allocating: a (src, tag) slot
/// almost always holds one message or one waiter, and lives for one
/// message, so a `VecDeque` would allocate and free once per message.
#[derive(Default)]
enum Fifo<T> {
    #[default]
    Empty,
    One(T),
    Many(VecDeque<T>),
}

impl<T> Fifo<T> {
    fn is_empty(&self) -> bool {
        match self {
            Fifo::Empty => true,
            Fifo::One(_) => false,
            Fifo::Many(q) => q.is_empty(),
        }
    }

    fn push(&mut self, x: T, front: bool) {
        match std::mem::take(self) {
            Fifo::Empty => *self = Fifo::One(x),
            Fifo::One(y) => {
                let mut q = VecDeque::with_capacity(4);
                if front {
                    q.push_back(x);
                    q.push_back(y);
                } else {
                    q.push_back(y);
                    q.push_back(x);
                }
                *self = Fifo::Many(q);
            }
            Fifo::Many(mut q) => {
                if front {
                    q.push_front(x);
                } else {
                    q.push_back(x);
                }
                *self = Fifo::Many(q);
            }
        }
    }

    fn push_back(&mut self, x: T) {
        self.push(x, false)
    }

    fn push_front(&mut self, x: T) {
        self.push(x, true)
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        let (one, many) = match self {
            Fifo::Empty => (None, None),
            Fifo::One(x) => (Some(x), None),
            Fifo::Many(q) => (None, Some(q.iter_mut())),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }

    /// Keeps the entries for which `keep` holds, in order.
    fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        match std::mem::take(self) {
            Fifo::Empty => {}
            Fifo::One(x) => {
                if keep(&x) {
                    *self = Fifo::One(x);
                }
            }
            Fifo::Many(mut q) => {
                q.retain(|x| keep(x));
                *self = Fifo::Many(q);
            }
        }
    }

    fn pop_front(&mut self) -> Option<T> {
        match self {
            Fifo::Empty => None,
            Fifo::One(_) => match std::mem::take(self) {
                Fifo::One(x) => Some(x),
                _ => None,
            },
            Fifo::Many(q) => q.pop_front(),
        }
    }
}

impl<T> IntoIterator for Fifo<T> {
    type Item = T;
    type IntoIter =
        std::iter::Chain<std::option::IntoIter<T>, std::collections::vec_deque::IntoIter<T>>;

    fn into_iter(self) -> Self::IntoIter {
        match self {
            Fifo::Empty => None.into_iter().chain(VecDeque::new()),
            Fifo::One(x) => Some(x).into_iter().chain(VecDeque::new()),
            Fifo::Many(q) => None.into_iter().chain(q),
        }
    }
}

#[derive(Default)]
struct Inner {
    slots: KeyMap<Slot>,
    failed: Option<CommError>,
    /// Messages delivered so far, by source rank (grown on demand).
    delivered: Vec<u64>,
    /// Peers that finished their job: (rank, messages it sent to this rank
    /// in all). Once that many have been delivered, a receive from it
    /// that finds nothing queued can never complete.
    finished: Vec<(Rank, u64)>,
}

impl Inner {
    fn delivered(&self, src: Rank) -> u64 {
        self.delivered.get(src as usize).copied().unwrap_or(0)
    }

    /// Whether `src` finished and everything it sent has been delivered.
    fn drained(&self, src: Rank) -> bool {
        !self.finished.is_empty()
            && self
                .finished
                .iter()
                .any(|(r, sent)| *r == src && self.delivered(src) >= *sent)
    }

    /// Fails the receives waiting on a drained `src` with nothing queued.
    fn fail_orphans(&mut self, me: Rank, src: Rank) {
        self.fail_orphans_after(me, src, None);
    }

    /// [`Inner::fail_orphans`], except the slot of `keep` (which the
    /// message being delivered is for).
    fn fail_orphans_after(&mut self, me: Rank, src: Rank, keep: Option<Tag>) {
        if !self.drained(src) {
            return;
        }
        let orphans: Vec<Key> = self
            .slots
            .iter()
            .filter(|((s, t), slot)| *s == src && Some(*t) != keep && slot.queue.is_empty())
            .map(|(k, _)| *k)
            .collect();
        for key in orphans {
            if let Some(slot) = self.slots.remove(&key) {
                for w in slot.waiters {
                    let _ = w.tx.send(Err(CommError::PeerFinished {
                        rank: me,
                        peer: src,
                        tag: key.1,
                    }));
                }
            }
        }
    }
}

/// Per-rank receive queues.
#[derive(Default)]
pub(crate) struct Mailbox {
    inner: Mutex<Inner>,
    /// The owning rank (named in errors); set once the rank is known.
    rank: std::sync::atomic::AtomicU32,
    /// Whether the rank called `shutdown`: its later sends (checked by
    /// the backends) and receives fail instead of being lost or waiting
    /// for ever.
    closed: std::sync::atomic::AtomicBool,
}

impl Mailbox {
    /// A mailbox of `rank`.
    pub(crate) fn new(rank: Rank) -> Self {
        let m = Mailbox::default();
        m.set_rank(rank);
        m
    }

    /// Records the owning rank (MPI learns it after creating the mailbox).
    pub(crate) fn set_rank(&self, rank: Rank) {
        self.rank.store(rank, std::sync::atomic::Ordering::Relaxed);
    }

    /// Marks the rank as shut down: later receives fail with
    /// [`CommError::Shutdown`], and so do the waiting receives from the
    /// rank itself (no one can send them anything now). Receives from
    /// peers that already wait keep waiting for those peers, which may
    /// still send.
    pub(crate) fn close(&self) {
        self.closed
            .store(true, std::sync::atomic::Ordering::Release);
        let err = self.shutdown_error();
        let me = self.rank.load(std::sync::atomic::Ordering::Relaxed);
        let mut g = self.lock();
        let own: Vec<Key> = g
            .slots
            .iter()
            .filter(|((src, _), slot)| *src == me && slot.queue.is_empty())
            .map(|(k, _)| *k)
            .collect();
        for key in own {
            if let Some(slot) = g.slots.remove(&key) {
                for w in slot.waiters {
                    let _ = w.tx.send(Err(err.clone()));
                }
            }
        }
    }

    /// Whether the rank called `shutdown` ([`Mailbox::close`]).
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The error of an operation on a rank that shut down.
    pub(crate) fn shutdown_error(&self) -> CommError {
        CommError::Shutdown {
            rank: self.rank.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands `buf` to the oldest waiter of (src, tag) or queues it.
    pub(crate) fn deliver(&self, src: Rank, tag: Tag, buf: Buffer) {
        self.deliver_at(src, tag, buf, false)
    }

    fn deliver_at(&self, src: Rank, tag: Tag, mut buf: Buffer, front: bool) {
        let mut g = self.lock();
        if g.failed.is_some() {
            return;
        }
        // A message handed back by a dropped receive (`front`) was counted
        // when it first came.
        if !front {
            let i = src as usize;
            if g.delivered.len() <= i {
                g.delivered.resize(i + 1, 0);
            }
            g.delivered[i] += 1;
            if !g.finished.is_empty() {
                // Its last message: receives waiting on its other tags
                // can never complete.
                let me = self.rank.load(std::sync::atomic::Ordering::Relaxed);
                g.fail_orphans_after(me, src, Some(tag));
            }
        }
        let slot = g.slots.entry((src, tag)).or_default();
        while let Some(Waiter { tx, landing }) = slot.waiters.pop_front() {
            // An unclaimed landing is let go before the receive learns of
            // its message: its owner may take its memory back at once
            // (`LandingZone::into_vec`).
            drop(landing);
            match tx.send(Ok(buf)) {
                Ok(()) => {
                    if slot.queue.is_empty() && slot.waiters.is_empty() {
                        g.slots.remove(&(src, tag));
                    }
                    return;
                }
                Err(Ok(b)) => buf = b,
                Err(Err(_)) => return,
            }
        }
        if front {
            slot.queue.push_front(buf);
        } else {
            slot.queue.push_back(buf);
        }
    }

    /// A future for the next message of (src, tag).
    pub(crate) fn recv(self: &Arc<Self>, src: Rank, tag: Tag) -> RecvFuture {
        self.recv_to(src, tag, None)
    }

    /// [`Mailbox::recv`] whose message a transport may write straight into
    /// `landing` ([`Mailbox::claim`]); a message already queued is handed
    /// over as it is.
    pub(crate) fn recv_landing(
        self: &Arc<Self>,
        src: Rank,
        tag: Tag,
        landing: Landing,
    ) -> RecvFuture {
        self.recv_to(src, tag, Some(landing))
    }

    fn recv_to(self: &Arc<Self>, src: Rank, tag: Tag, landing: Option<Landing>) -> RecvFuture {
        let mut g = self.lock();
        if let Some(e) = &g.failed {
            return RecvFuture::ready(Err(e.clone()));
        }
        if self.is_closed() {
            return RecvFuture::ready(Err(self.shutdown_error()));
        }
        if let Some(slot) = g.slots.get_mut(&(src, tag)) {
            if let Some(buf) = slot.queue.pop_front() {
                if slot.queue.is_empty() && slot.waiters.is_empty() {
                    g.slots.remove(&(src, tag));
                }
                return RecvFuture::ready(Ok(buf));
            }
        }
        if g.drained(src) {
            return RecvFuture::ready(Err(CommError::PeerFinished {
                rank: self.rank.load(std::sync::atomic::Ordering::Relaxed),
                peer: src,
                tag,
            }));
        }
        let (tx, rx) = oneshot::channel();
        g.slots
            .entry((src, tag))
            .or_default()
            .waiters
            .push_back(Waiter { tx, landing });
        RecvFuture {
            state: State::Waiting {
                rx,
                mailbox: self.clone(),
                key: (src, tag),
                driver: None,
            },
        }
    }

    /// Removes the waiters of `key` whose receive was dropped.
    fn forget_closed(&self, key: Key) {
        let mut g = self.lock();
        if let Some(slot) = g.slots.get_mut(&key) {
            slot.waiters.retain(|w| !w.tx.is_closed());
            if slot.queue.is_empty() && slot.waiters.is_empty() {
                g.slots.remove(&key);
            }
        }
    }

    /// The landing of the receive that a message of (src, tag) will go to,
    /// taken from it, when that receive has one of exactly `len` bytes:
    /// the caller (the transport reading that message) writes the message
    /// into it and delivers [`Landing::into_buffer`]. `ahead` messages of
    /// (src, tag) come before this one and are not delivered yet (an mpi
    /// rank matches a frame's header and its data in one pass): the
    /// receive is the waiting one after theirs. Sound because one
    /// transport task delivers a source's messages in order: nothing else
    /// reaches that receive first. If a receive is dropped before the
    /// delivery, the landed buffer goes to the next receive or the queue
    /// like any message.
    pub(crate) fn claim(&self, src: Rank, tag: Tag, len: usize, ahead: usize) -> Option<Landing> {
        let mut g = self.lock();
        if g.failed.is_some() {
            return None;
        }
        let slot = g.slots.get_mut(&(src, tag))?;
        if !slot.queue.is_empty() {
            return None;
        }
        let w = slot
            .waiters
            .iter_mut()
            .filter(|w| !w.tx.is_closed())
            .nth(ahead)?;
        // Only an unwritten landing of the message's length: the
        // transports write the message from the landing's filled mark, so
        // a partly written one would take its first bytes and leave the
        // rest (tcp: read as the next frame; MPI: written past the end).
        match &w.landing {
            Some(l) if l.len() == len && l.filled() == 0 => w.landing.take(),
            _ => None,
        }
    }

    /// Whether a receive waits for a message of (`src`, `tag`) that comes
    /// after `ahead` undelivered ones (as in [`Mailbox::claim`]).
    // Only the mpi backend holds messages until a receive waits.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn waits(&self, src: Rank, tag: Tag, ahead: usize) -> bool {
        let mut g = self.lock();
        g.slots.get_mut(&(src, tag)).is_some_and(|slot| {
            slot.queue.is_empty()
                && slot
                    .waiters
                    .iter_mut()
                    .filter(|w| !w.tx.is_closed())
                    .nth(ahead)
                    .is_some()
        })
    }

    /// A rank with a message queued here for operation `op` (any stage),
    /// if any.
    pub(crate) fn queued_for(&self, op: OpId) -> Option<Rank> {
        let g = self.lock();
        g.slots
            .iter()
            .find(|((_, t), slot)| t.op == op && !slot.queue.is_empty())
            .map(|((src, _), _)| *src)
    }

    /// Fails every waiting and later receive with `err` (first failure wins).
    pub(crate) fn fail(&self, err: CommError) {
        let mut g = self.lock();
        if g.failed.is_some() {
            return;
        }
        g.failed = Some(err.clone());
        for (_, slot) in g.slots.drain() {
            for w in slot.waiters {
                let _ = w.tx.send(Err(err.clone()));
            }
        }
    }

    /// Records that `src` finished its job after sending this rank `sent`
    /// messages in all (`None`: the ones delivered so far, for a transport
    /// that delivers at once). Receives from it that find nothing queued
    /// once all have come fail with [`CommError::PeerFinished`].
    pub(crate) fn peer_finished(&self, src: Rank, sent: Option<u64>) {
        let mut g = self.lock();
        if g.failed.is_some() {
            return;
        }
        let sent = sent.unwrap_or_else(|| g.delivered(src));
        g.finished.push((src, sent));
        let me = self.rank.load(std::sync::atomic::Ordering::Relaxed);
        g.fail_orphans(me, src);
    }

    /// The failure, if the mailbox has failed.
    pub(crate) fn failure(&self) -> Option<CommError> {
        self.lock().failed.clone()
    }
}

/// Progress a waiting operation can make by itself: a backend whose
/// transport must be polled (MPI) runs a pass from the waiting task, and
/// tcp reads the peer's socket there, rather than hand every message over
/// from another thread (a thread hand-off costs microseconds per message
/// and, on a busy host, a core).
pub(crate) trait Drive: Send + Sync {
    /// Runs one progress pass unless another thread is running one; returns
    /// whether a task that has waited `waited` should poll again at once
    /// (spin) rather than sleep until `waker` is woken (by its message, or
    /// by the end of the pass another thread is running).
    fn drive(&self, waited: std::time::Duration, waker: &std::task::Waker) -> bool;
}

/// A waiting operation's driver and when it started waiting.
pub(crate) struct Driver {
    drive: Arc<dyn Drive>,
    since: Option<std::time::Instant>,
}

impl Driver {
    pub(crate) fn new(drive: Arc<dyn Drive>) -> Self {
        Driver { drive, since: None }
    }

    /// Drives once; on `true` the caller re-polls at once (it has already
    /// asked to be woken).
    pub(crate) fn spin(&mut self, cx: &mut Context<'_>) -> bool {
        let since = *self.since.get_or_insert_with(std::time::Instant::now);
        let spin = self.drive.drive(since.elapsed(), cx.waker());
        if spin {
            cx.waker().wake_by_ref();
        }
        spin
    }
}

enum State {
    Ready(Option<Result<Buffer, CommError>>),
    Waiting {
        rx: oneshot::Receiver<Result<Buffer, CommError>>,
        mailbox: Arc<Mailbox>,
        key: Key,
        driver: Option<Driver>,
    },
    Done,
}

/// The future returned by a receive.
pub struct RecvFuture {
    state: State,
}

impl RecvFuture {
    pub(crate) fn ready(r: Result<Buffer, CommError>) -> Self {
        RecvFuture {
            state: State::Ready(Some(r)),
        }
    }

    /// While waiting, the receive runs `drive`'s progress passes itself.
    pub(crate) fn driven_by(mut self, drive: Arc<dyn Drive>) -> Self {
        if let State::Waiting { driver, .. } = &mut self.state {
            *driver = Some(Driver::new(drive));
        }
        self
    }
}

impl Future for RecvFuture {
    type Output = Result<Buffer, CommError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        match &mut this.state {
            State::Ready(r) => {
                let r = r
                    .take()
                    .unwrap_or_else(|| Err(CommError::Shutdown { rank: Rank::MAX }));
                this.state = State::Done;
                Poll::Ready(r)
            }
            State::Waiting {
                rx,
                mailbox,
                driver,
                ..
            } => {
                let mut r = Pin::new(&mut *rx).poll(cx);
                if r.is_pending() {
                    // A driven receive runs a pass (which may deliver its
                    // message) and looks again.
                    if let Some(d) = driver {
                        d.spin(cx);
                        r = Pin::new(&mut *rx).poll(cx);
                    }
                }
                let Poll::Ready(r) = r else {
                    return Poll::Pending;
                };
                let out = r.unwrap_or_else(|_| {
                    Err(mailbox
                        .failure()
                        .unwrap_or_else(|| mailbox.shutdown_error()))
                });
                this.state = State::Done;
                Poll::Ready(out)
            }
            State::Done => Poll::Pending,
        }
    }
}

impl Drop for RecvFuture {
    fn drop(&mut self) {
        if let State::Waiting {
            rx, mailbox, key, ..
        } = &mut self.state
        {
            rx.close();
            if let Ok(Ok(buf)) = rx.try_recv() {
                mailbox.deliver_at(key.0, key.1, buf, true);
            } else {
                // Not delivered: its waiter (and any landing it holds, with
                // the memory behind it) goes now, not at the next message.
                mailbox.forget_closed(*key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tag::OpId;

    #[tokio::test]
    async fn order_and_cancel_safety() {
        let mb = Arc::new(Mailbox::default());
        let t = Tag::new(OpId(1), 0);
        // A receive posted first, then dropped after its message arrived.
        let f = mb.recv(0, t);
        mb.deliver(0, t, Buffer::from_vec(vec![1]));
        mb.deliver(0, t, Buffer::from_vec(vec![2]));
        drop(f);
        assert_eq!(mb.recv(0, t).await.unwrap().as_slice(), &[1]);
        assert_eq!(mb.recv(0, t).await.unwrap().as_slice(), &[2]);
        let pending = mb.recv(0, t);
        mb.fail(CommError::Shutdown { rank: 0 });
        assert!(pending.await.is_err());
        assert!(mb.recv(0, t).await.is_err());
    }
}
