//! The `mpi` backend (feature `mpi`): ranks started by `mpirun` or `srun`,
//! bytes carried by MPI nonblocking point-to-point.
//!
//! All MPI state lives in one `Engine` behind a mutex; a progress *pass*
//! (one lock hold) does everything there is to do:
//!
//! ```text
//!   take queued requests (sends, flushes, abort, shutdown); MPI_Isend each send
//!   MPI_Test outstanding sends; answer their callers
//!   MPI_Imrecv the held messages that may go now (see `Held`)
//!   MPI_Improbe(any source, any tag) -> hold it (64 KiB or more, from a
//!   peer this rank sends large messages to, no receive waiting for it
//!   yet), or MPI_Imrecv into a fresh (pooled) buffer, or from 64 KiB up
//!   into the landing its receive offered (`recv_landing`); MPI_Test the
//!   receives in flight; completed ones -> the mailbox (per (src, tag) in
//!   match order: MPI does not overtake)
//!   every 64th pass: finish notices (a peer that shut down, and how many
//!   messages it sent here) -> the mailbox, which fails a receive beyond
//!   them; at shutdown: a notice to every peer, then an MPI_Ibarrier
//! ```
//!
//! Who runs passes: with `MPI_THREAD_SERIALIZED` (what every common MPI
//! gives) the waiting tasks themselves. `send` posts its `MPI_Isend` at
//! once when the engine is free (the posting alone, not a pass: over
//! shared memory a pass may copy a large message for milliseconds), and a
//! pending receive or send polls a pass
//! each time it is polled, re-polling at once (spinning, like MPI's own
//! blocking calls) for up to `SPIN`, and past that for as long as messages
//! are in flight, then sleeping until woken. A progress
//! thread, which called `MPI_Init_thread` and will call `MPI_Finalize`,
//! runs passes only while no task has run one for `HANDOFF`: traffic
//! needs no thread hand-off, and a rank that computes still answers its
//! peers. While tasks drive, it checks at growing intervals (up to
//! `NAP_MAX`, or `NAP_MAX_SHARED` where the rank has no core to spare),
//! so it rarely takes a core from them; a task that stops driving wakes
//! it at once. When a pass leaves only held messages (nothing in flight:
//! they wait for receives that tasks post and drive themselves), the
//! thread naps up to `NAP_MAX` instead of polling. With a lower
//! threading level only the progress thread touches MPI
//! (`MPI_THREAD_FUNNELED`), and waiting tasks sleep until it delivers.
//!
//! Cost model: a message costs its MPI time plus one mailbox hand-off
//! (a few hundred ns in the same thread); a thread hand-off (several us)
//! happens only when no task is waiting.
//!
//! Tags: MPI tags are `int` below the job's `MPI_TAG_UB`, which differs
//! between MPI libraries and their transports (2^15 - 1 at the least);
//! braid fits its tags to it (`TagLayout`: user and collective OpIds in
//! separate halves, each wrapping), so two operations of one kind 2^22
//! OpIds apart with Open MPI's ob1 (2^14 with its UCX layer) must not be
//! in flight together.
//!
//! Failures: `abort` calls `MPI_Abort`, which ends every rank of the job;
//! a rank that dies makes the MPI runtime end the others (mpirun, srun), so
//! a job never hangs on a dead rank.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use mpi::request::{Request, StaticScope};
use mpi::topology::AnyCommunicator as _;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator as _, CommunicatorCollectives, Destination, Equivalence, Source};
use tokio::sync::oneshot;

use super::mailbox::{Drive, Driver, Mailbox};
use super::{Backend, Communicator, RecvFuture, SendFuture, check_rank};
use crate::Rank;
use crate::error::CommError;
use crate::memory::{Buffer, BufferPool, Landing};
use crate::stats::Statistics;
use crate::tag::{OpId, Tag};

/// A byte that MPI writes and Rust never reads as such: possibly
/// uninitialised memory (a fresh landing), received into as MPI bytes.
#[repr(transparent)]
struct RawByte(std::mem::MaybeUninit<u8>);

// SAFETY: `RawByte` is one byte (transparent over `MaybeUninit<u8>`), which
// MPI_BYTE describes; any bit pattern, or none, is a valid `RawByte`.
unsafe impl Equivalence for RawByte {
    type Out = <u8 as Equivalence>::Out;
    fn equivalent_datatype() -> Self::Out {
        u8::equivalent_datatype()
    }
}

/// How braid's tags map onto MPI's, fitted to the job's `MPI_TAG_UB`:
///
/// ```text
///   | class (1 bit) | op mod half (bits - 1) | stage (8) |
/// ```
///
/// `class` keeps the user's point-to-point OpIds (below
/// [`OpIdAllocator::FIRST`](crate::tag::OpIdAllocator::FIRST)) apart from
/// collectives' (counted from `FIRST`), so they never share a wire tag;
/// within a class OpIds wrap every `half = 2^(bits - 1)`, with `bits` the
/// most (at most 23) whose tags stay within the bound. MPI guarantees a
/// bound of only 2^15 - 1, and real ones differ: Open MPI's ob1 allows
/// 2^31 - 1 (half 2^22), its UCX layer 2^23 - 1 (half 2^14), the minimum
/// gives half 2^6. Two operations of one class `half` OpIds apart must not
/// be in flight together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TagLayout {
    /// OpIds per class before they wrap (a power of two).
    half: u32,
}

impl TagLayout {
    const FIRST: u32 = crate::tag::OpIdAllocator::FIRST;

    /// The widest layout within `tag_ub` (`MPI_TAG_UB`); `None` below the
    /// standard's minimum of 2^15 - 1.
    fn for_bound(tag_ub: i64) -> Option<TagLayout> {
        if tag_ub < MIN_TAG_UB {
            return None;
        }
        // Largest b with (2^b << 8) - 1 <= tag_ub.
        let bits = (tag_ub + 1).ilog2().saturating_sub(8).min(23);
        Some(TagLayout {
            half: 1 << (bits - 1),
        })
    }

    /// (class, OpId within the class after wrapping).
    fn split(self, op: u32) -> (u32, u32) {
        if op >= Self::FIRST {
            (1, (op - Self::FIRST) % self.half)
        } else {
            (0, op % self.half)
        }
    }

    /// The MPI tag of `t`.
    fn encode(self, t: Tag) -> i32 {
        let (class, low) = self.split(t.op.0);
        ((((class * self.half) | low) << 8) | t.stage as u32) as i32
    }

    /// The tag a receive waits under: the same reduction as the wire.
    fn reduce(self, t: Tag) -> Tag {
        self.decode(self.encode(t))
    }

    /// The (reduced) tag of an MPI tag that `encode` made.
    fn decode(self, t: i32) -> Tag {
        let w = (t as u32) >> 8;
        let low = w % self.half;
        let op = if w >= self.half {
            Self::FIRST + low
        } else {
            low
        };
        Tag::new(OpId(op), (t as u32 & 0xff) as u8)
    }
}

/// `MPI_TAG_UB` of `MPI_COMM_WORLD` (an attribute MPI always sets).
#[repr(C)]
#[derive(Clone)]
struct TagUb(std::ffi::c_int);

impl mpi::attribute::CommAttribute for TagUb {
    fn get_key() -> mpi::attribute::AttributeKey {
        // SAFETY: MPI_TAG_UB is a predefined attribute key of every
        // communicator; it is never freed.
        unsafe { mpi::attribute::AttributeKey::new_unchecked(mpi::ffi::MPI_TAG_UB as i32) }
    }
}

/// Finish notices are looked for once every this many passes (and at
/// every pass while shutting down).
const NOTICE_EVERY: u32 = 64;

/// How long a waiting task keeps polling before it sleeps until woken.
const SPIN: Duration = Duration::from_millis(2);
/// The progress thread runs passes once no task has run one for this long.
const HANDOFF: Duration = Duration::from_micros(100);
/// The longest the progress thread sleeps while tasks drive, where the
/// rank has a core to spare for it: it takes over within HANDOFF +
/// NAP_MAX of the last task-driven pass. Checking every HANDOFF / 2
/// instead woke it 20000 times a second, each wake-up taking a core from
/// a rank on a 2-core host: 8-byte ping-pong over tcp took 10.6-11.2 us
/// with that, 7.5-8.0 us with 1 ms naps (raw MPI 5.6).
const NAP_MAX: Duration = Duration::from_millis(1);
/// The same where the rank has no core to spare ([`nap_cap`]): each
/// wake-up then preempts a thread that is working, such as a task whose
/// pass is copying a message. 1 MiB ping-pong, 2 ranks on 2 cores (each
/// bound to one by mpirun), braid / raw MPI in the same launch, 8 to 11
/// launches each (tcp and shared memory): 0.90-0.98 with 1 ms naps,
/// 0.94-1.05 with 16 ms (BENCHMARKS, 2026-11-28). A task that stops driving (it waited past `SPIN`
/// and found nothing to do) wakes the thread at once instead (see
/// `Shared::handoff`), so only a rank that leaves messages in flight while
/// it computes waits longer for the hand-off.
const NAP_MAX_SHARED: Duration = Duration::from_millis(16);

/// How long the progress thread may nap while tasks drive, for a rank
/// with `local_ranks` ranks on its host: [`NAP_MAX`] where it has a core
/// beside the one its driving task runs on, else [`NAP_MAX_SHARED`].
/// A rank bound to some of the host's cores (mpirun binds ranks by
/// default) owns them; an unbound rank shares the host's with the other
/// local ranks.
fn nap_cap(local_ranks: usize) -> Duration {
    let visible = std::thread::available_parallelism().map_or(1, |n| n.get());
    // SAFETY: sysconf only reads a system value.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    let host = usize::try_from(online).unwrap_or(visible);
    nap_cap_for(visible, host, local_ranks)
}

/// [`nap_cap`] for a rank that may run on `visible` of the host's `host`
/// cores, with `local_ranks` ranks on the host.
fn nap_cap_for(visible: usize, host: usize, local_ranks: usize) -> Duration {
    let spare = if visible < host {
        visible >= 2
    } else {
        visible > local_ranks
    };
    if spare { NAP_MAX } else { NAP_MAX_SHARED }
}

enum Req {
    Send {
        dst: Rank,
        tag: Tag,
        buf: Buffer,
        done: oneshot::Sender<Result<(), CommError>>,
    },
    Flush(oneshot::Sender<()>),
    Abort(String),
    Shutdown(oneshot::Sender<()>),
}

/// Which threads may call MPI (from the threading level MPI provides).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Driving {
    /// `MPI_THREAD_SERIALIZED` or better: any thread, one at a time.
    AnyThread,
    /// Only the progress thread.
    ProgressThread,
}

struct Pending {
    req: Request<'static, [u8], StaticScope>,
    /// Owns the bytes `req` reads; dropped only after `req` completes,
    /// and before `done` is answered.
    buf: Buffer,
    done: oneshot::Sender<Result<(), CommError>>,
}

/// A message matched by `MPI_Improbe` whose `MPI_Imrecv` is in flight.
///
/// Receiving nonblocking lets every matched message progress at once (a
/// window of large rendezvous messages moves as with preposted receives)
/// instead of one blocking `MPI_Mrecv` after another.
struct Incoming {
    /// `None` once complete (the bytes then wait for delivery order).
    req: Option<Request<'static, [RawByte], StaticScope>>,
    /// Owns the bytes `req` writes; never touched until `req` completes.
    buf: RecvTo,
    src: Rank,
    tag: Tag,
}

/// Where an `Incoming` message is received to.
enum RecvTo {
    /// The spare capacity of an empty pooled vector (no receive offered a
    /// landing), `len` bytes of it, given that length once MPI has written
    /// them: nothing is cleared first (zeroing a fresh 64 KiB buffer cost
    /// a few us a message, on the path of every receive).
    Pool { v: Vec<u8>, len: usize },
    /// The landing of the receive it goes to (`Mailbox::claim`).
    Landing(Landing),
}

impl RecvTo {
    fn len(&self) -> usize {
        match self {
            RecvTo::Pool { len, .. } => *len,
            RecvTo::Landing(l) => l.len(),
        }
    }
}

/// Messages from this size up go straight into the landing of the receive
/// they are for, where it offers one (`Communicator::recv_landing`).
const LAND_MIN: usize = 64 << 10;

/// Matched messages from this size up that no receive waits for yet are
/// held (`Held`) before they are received.
const HOLD_MIN: usize = 64 << 10;
/// The longest a message is held when no receive comes for it: 100 us,
/// and as long again as copying it at 1 GB/s takes (8 MiB: 8.5 ms). A
/// rank busy with its part of an exchange (its own block of a 16 MiB
/// AllToAll, or a part that missed its landing) may post its next receive
/// milliseconds after a peer that runs ahead sent; released then, the
/// message misses its landing too (received elsewhere, then copied once
/// more), and the copy makes this rank later still for the next call, so
/// a pair of ranks that fell into it stayed there. With 10 GB/s here (8
/// MiB: 0.9 ms) 20-45% of a 16 MiB AllToAll's received bytes missed their
/// landing between 2 ranks and the call ran at 0.55-0.70 of
/// `MPI_Alltoall`; with 1 GB/s none missed (after the first call), and
/// with the progress thread's naps while it only holds (`Pass::Holding`)
/// the call ran at 0.94-1.06 (2026-11-28). A peer that waits for its send
/// to complete before it posts its receive (none of braid's collectives
/// does) waits up to this long: the limit bounds what that costs.
fn hold_max(len: usize) -> Duration {
    Duration::from_micros(100) + Duration::from_nanos(len as u64)
}

/// Only messages from a peer that this rank sent a message of `HOLD_MIN`
/// or more within this long are held: ranks that exchange. A rank that
/// only receives a stream has no send to post first, and over tcp a held
/// message is not moving (its transfer starts at the receive): holding
/// took a 1 MiB stream from 1.09-1.11 of raw MPI to 0.87-0.91.
const HOLD_PEERS_WITHIN: Duration = Duration::from_millis(50);

/// A message matched (`MPI_Improbe`) but not yet received (`MPI_Imrecv`).
///
/// Why hold one: over shared memory a large message is copied inside
/// `MPI_Imrecv`, for milliseconds (16 MiB: ~3 ms on the 2-core VM), and
/// nothing else of this rank's MPI traffic moves meanwhile. A peer that
/// runs ahead (its part of an exchange already sent) would get this
/// rank's pass to copy its next message before this rank posted its own
/// next send; the peer then waits for that send, and the two ranks copy
/// by turns instead of at once. Two ranks exchanging 16 MiB (SendRecv)
/// took 2.1x as long as `MPI_Sendrecv`, which posts both sides before it
/// copies (2026-11-28). Held until a receive waits for it (the rank has
/// posted what it sends before that receive), or `hold_max`, or shutdown;
/// and only from peers that this rank sends large messages to
/// (`HOLD_PEERS_WITHIN`).
struct Held {
    /// Received exactly once: by `release_held` (dropping an unreceived
    /// `Message` panics; an engine dropped with one leaks it instead).
    msg: std::mem::ManuallyDrop<mpi::point_to_point::Message>,
    len: usize,
    src: Rank,
    tag: Tag,
    since: Instant,
}

/// What a pass found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// Something moved (a request posted, a send or receive completed, a
    /// message matched or released).
    Moved,
    /// Nothing moved, but sends or receives are in flight: MPI moves them
    /// only while passes call it (rendezvous, tcp).
    InFlight,
    /// Nothing moved and nothing is in flight; messages are held for
    /// receives not yet posted, the first of them until `until` at the
    /// latest. Passes change nothing before then but for a new message or
    /// request, and the receive a task posts comes with its own passes.
    Holding { until: Instant },
    /// Nothing to do.
    Idle,
}

impl Pass {
    /// Whether a task waiting for a message should go on driving: anything
    /// but `Idle` (a held message is about to be asked for, or released).
    fn busy(self) -> bool {
        self != Pass::Idle
    }
}

/// Everything that calls MPI; one pass at a time (the mutex serialises
/// the calls, as `MPI_THREAD_SERIALIZED` requires).
struct Engine {
    world: SimpleCommunicator,
    /// A duplicate of the world for finish notices (a rank that shuts down
    /// tells each other rank how many messages it sent it), apart from the
    /// data's tags. Freed by hand before `MPI_Finalize`, never by a drop
    /// that could come after it.
    notices: std::mem::ManuallyDrop<SimpleCommunicator>,
    /// This rank's finish notices are posted.
    notices_sent: bool,
    /// Finish notices received (one from every other rank before leaving).
    notices_heard: u32,
    /// Passes run (when to look for finish notices).
    passes: u32,
    nranks: u32,
    rank: Rank,
    tags: TagLayout,
    requests: mpsc::Receiver<Req>,
    pending: Vec<Pending>,
    /// Receives in match order; delivered in that order per (source, tag).
    incoming: Vec<Incoming>,
    /// Matched messages not yet received, in match order (see `Held`).
    held: Vec<Held>,
    /// By peer: when this rank last posted a send of `HOLD_MIN` or more
    /// to it.
    large_sent: Vec<Option<Instant>>,
    flushes: Vec<oneshot::Sender<()>>,
    shutdown_asked: Option<oneshot::Sender<()>>,
    barrier: Option<(Request<'static, ()>, oneshot::Sender<()>)>,
    /// Shutdown's barrier completed: the progress thread finalises and
    /// answers; no pass calls MPI any more.
    finished: Option<oneshot::Sender<()>>,
    /// MPI is finalised: passes do nothing.
    gone: bool,
    /// Every handle is gone without a shutdown (one was started for them).
    orphaned: bool,
    pool: Arc<BufferPool>,
    mailbox: Arc<Mailbox>,
    stats: Arc<Statistics>,
}

// SAFETY: MPI handles are plain values that MPI lets any thread use under
// `MPI_THREAD_SERIALIZED` as long as no two calls overlap; the engine is
// only reached through `Shared::engine`'s mutex, and with a lower
// threading level only the progress thread takes that mutex to call MPI.
unsafe impl Send for Engine {}

impl Engine {
    /// Step 1 of a pass: takes the queued requests, posting each send
    /// (`MPI_Isend`). Returns whether it posted any. Starts a shutdown when
    /// every handle is gone without one.
    fn take_requests(&mut self) -> bool {
        let mut busy = false;
        loop {
            match self.requests.try_recv() {
                Ok(Req::Send {
                    dst,
                    tag,
                    buf,
                    done,
                }) => {
                    busy = true;
                    self.post(dst, tag, buf, done);
                }
                Ok(Req::Flush(done)) => self.flushes.push(done),
                Ok(Req::Abort(reason)) => {
                    // One write: the ranks share the terminal, and a line
                    // written in pieces interleaved with the others'.
                    let line = format!("rank {}: aborting the MPI job: {reason}\n", self.rank);
                    eprint!("{line}");
                    self.world.abort(1);
                }
                Ok(Req::Shutdown(done)) => self.shutdown_asked = Some(done),
                Err(mpsc::TryRecvError::Empty) => return busy,
                Err(mpsc::TryRecvError::Disconnected) => {
                    // Every handle is gone without a shutdown: this rank
                    // shuts down all the same, with no one to answer (its
                    // sends and receives in flight finish, the peers hear
                    // its finish, MPI is finalised once they have too).
                    // Finalising at once would end MPI under requests
                    // still in flight, which rsmpi then panics on.
                    if !self.orphaned {
                        self.orphaned = true;
                        if self.shutdown_asked.is_none() && !self.notices_sent {
                            self.shutdown_asked = Some(oneshot::channel().0);
                        }
                    }
                    return busy;
                }
            }
        }
    }

    /// One progress pass; says whether anything happened, and if not,
    /// what is left that a later pass could move.
    fn pass(&mut self) -> Pass {
        if self.gone || self.finished.is_some() {
            return Pass::Idle;
        }
        // 1. New requests.
        let mut busy = self.take_requests();
        // 2. Outstanding sends.
        let mut i = 0;
        while i < self.pending.len() {
            let p = self.pending.swap_remove(i);
            match p.req.test() {
                Ok(_) => {
                    busy = true;
                    // The bytes go before the caller hears: a sender may
                    // reclaim memory the buffer views once its send is
                    // done (a collective's result it sent a block from).
                    drop(p.buf);
                    let _ = p.done.send(Ok(()));
                }
                Err(req) => {
                    self.pending.push(Pending { req, ..p });
                    let last = self.pending.len() - 1;
                    self.pending.swap(i, last);
                    i += 1;
                }
            }
        }
        if self.pending.is_empty() {
            for f in self.flushes.drain(..) {
                let _ = f.send(());
            }
        }
        // 3. Incoming messages: match every arrived one; start receiving
        // it, or hold it (see `Held`).
        busy |= self.release_held();
        while let Some((msg, status)) = self.world.any_process().immediate_matched_probe() {
            busy = true;
            let len = status.count(u8::equivalent_datatype()).max(0) as usize;
            let (src, tag) = (status.source_rank() as Rank, self.tags.decode(status.tag()));
            // (Small messages, the latency path, stop at `len`: no clock
            // read, no mailbox lock.)
            let after_held =
                !self.held.is_empty() && self.held.iter().any(|h| h.src == src && h.tag == tag);
            if after_held
                || (len >= HOLD_MIN
                    && self.exchanging(src)
                    && self.shutdown_asked.is_none()
                    && !self.notices_sent
                    && !self.mailbox.waits(src, tag, self.undelivered(src, tag)))
            {
                self.held.push(Held {
                    msg: std::mem::ManuallyDrop::new(msg),
                    len,
                    src,
                    tag,
                    since: Instant::now(),
                });
                continue;
            }
            self.start_receive(msg, len, src, tag);
        }
        busy |= self.receive_completed();
        // Finish notices: rank `src` sent this rank `count` messages in
        // all. A receive from it beyond those can never complete, and
        // fails (the ranks' calls differ) instead of hanging. Looked for
        // every NOTICE_EVERY passes, and at every pass once this rank
        // shuts down: each probe runs MPI's progress once more (over tcp,
        // a poll of the sockets: +0.7 us on an 8-byte ping-pong when
        // looked for at every pass).
        self.passes = self.passes.wrapping_add(1);
        let look = self.notices_sent || self.passes % NOTICE_EVERY == 0;
        while let Some((msg, status)) = look
            .then(|| self.notices.any_process().immediate_matched_probe())
            .flatten()
        {
            busy = true;
            let mut count = [0u8; 8];
            msg.matched_receive_into(&mut count[..]);
            self.notices_heard += 1;
            self.mailbox.peer_finished(
                status.source_rank() as Rank,
                Some(u64::from_le_bytes(count)),
            );
        }
        // 4. Shutdown: once our sends are out, a finish notice to every
        // other rank; once theirs have come too, a nonblocking barrier (we
        // keep receiving meanwhile, so no peer's large send can stall).
        if self.pending.is_empty() && self.shutdown_asked.is_some() && !self.notices_sent {
            self.notices_sent = true;
            for q in (0..self.nranks).filter(|q| *q != self.rank) {
                let count = self.stats.peer(q).msgs_sent;
                let buf = Buffer::from_vec(count.to_le_bytes().to_vec());
                // SAFETY: as in `post`: `Pending` keeps `buf` alive and
                // unmoved until MPI reports the send complete.
                let data: &'static [u8] =
                    unsafe { std::slice::from_raw_parts(buf.as_slice().as_ptr(), buf.len()) };
                let req = self
                    .notices
                    .process_at_rank(q as i32)
                    .immediate_send_with_tag(StaticScope, data, 0);
                let (done, _) = oneshot::channel();
                self.pending.push(Pending { req, buf, done });
            }
        }
        if self.pending.is_empty() && self.notices_sent && self.notices_heard + 1 >= self.nranks {
            if let Some(done) = self.shutdown_asked.take() {
                self.barrier = Some((self.world.immediate_barrier(), done));
            }
        }
        // A receive still in flight finishes before MPI is finalised.
        if let Some((req, done)) = self
            .barrier
            .take_if(|_| self.incoming.is_empty() && self.held.is_empty())
        {
            match req.test() {
                Ok(_) => self.finished = Some(done),
                Err(req) => self.barrier = Some((req, done)),
            }
        }
        if busy {
            Pass::Moved
        } else if !self.pending.is_empty() || !self.incoming.is_empty() {
            Pass::InFlight
        } else if let Some(until) = self.held.iter().map(|h| h.since + hold_max(h.len)).min() {
            Pass::Holding { until }
        } else {
            Pass::Idle
        }
    }

    /// Whether this rank sent `src` a message of `HOLD_MIN` or more within
    /// `HOLD_PEERS_WITHIN`.
    fn exchanging(&self, src: Rank) -> bool {
        self.large_sent
            .get(src as usize)
            .copied()
            .flatten()
            .is_some_and(|t| t.elapsed() < HOLD_PEERS_WITHIN)
    }

    /// Messages of (`src`, `tag`) being received or waiting for delivery
    /// here (matched before any that is matched now).
    fn undelivered(&self, src: Rank, tag: Tag) -> usize {
        self.incoming
            .iter()
            .filter(|i| i.src == src && i.tag == tag)
            .count()
    }

    /// Starts receiving the matched message `msg` (`len` bytes from `src`
    /// with `tag`): into the landing its receive offers, or a pooled
    /// buffer.
    fn start_receive(
        &mut self,
        msg: mpi::point_to_point::Message,
        len: usize,
        src: Rank,
        tag: Tag,
    ) {
        // A landing is the receive's that this message goes to: the next
        // one after those of the earlier messages of (src, tag) that wait
        // for delivery here (a frame's header, matched in the same pass).
        let ahead = self.undelivered(src, tag);
        let landing = (len >= LAND_MIN)
            .then(|| self.mailbox.claim(src, tag, len, ahead))
            .flatten();
        // MPI writes every byte: the memory is not cleared first. (A
        // failed allocation is this process's out-of-memory, for a message
        // that exists: it aborts, as any allocation does.)
        let mut buf = match landing {
            Some(l) => RecvTo::Landing(l),
            None => RecvTo::Pool {
                v: self
                    .pool
                    .try_take(len)
                    .unwrap_or_else(|| crate::memory::large_vec(len)),
                len,
            },
        };
        let ptr = match &mut buf {
            RecvTo::Pool { v, .. } => v.spare_capacity_mut().as_mut_ptr() as *mut RawByte,
            // SAFETY: MPI writes the message's bytes there (initialised).
            RecvTo::Landing(l) => unsafe { l.unfilled() }.as_mut_ptr() as *mut RawByte,
        };
        // SAFETY: the slice points into `buf`'s memory (a Vec's spare
        // capacity, at least `len` bytes, or a landing's region of its
        // zone, which the landing keeps alive; either possibly
        // uninitialised: hence `RawByte`), which
        // `Incoming` owns, never reads, resizes or drops before the
        // request completes (moving either does not move the memory).
        let data: &'static mut [RawByte] = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
        let req = msg.immediate_matched_receive_into(StaticScope, data);
        self.incoming.push(Incoming {
            req: Some(req),
            buf,
            src,
            tag,
        });
    }

    /// Starts receiving the held messages that may go now: those a
    /// receive waits for, those held `hold_max` or longer, and all of them
    /// once this rank shuts down; a message stays while an earlier one of
    /// its (source, tag) does. Returns whether any started.
    fn release_held(&mut self) -> bool {
        if self.held.is_empty() {
            return false;
        }
        let all = self.shutdown_asked.is_some() || self.notices_sent;
        let mut stays: Vec<(Rank, Tag)> = Vec::new();
        let mut started = false;
        let mut i = 0;
        while i < self.held.len() {
            let h = &self.held[i];
            let key = (h.src, h.tag);
            let go = !stays.contains(&key)
                && (all
                    || h.since.elapsed() >= hold_max(h.len)
                    || self
                        .mailbox
                        .waits(h.src, h.tag, self.undelivered(h.src, h.tag)));
            if !go {
                stays.push(key);
                i += 1;
                continue;
            }
            let mut h = self.held.remove(i);
            // SAFETY: taken once, from an entry removed from `held`.
            let msg = unsafe { std::mem::ManuallyDrop::take(&mut h.msg) };
            self.start_receive(msg, h.len, h.src, h.tag);
            started = true;
        }
        started
    }

    /// Tests the receives in flight and delivers each completed message
    /// whose earlier messages of the same (source, tag) are delivered
    /// (MPI matches in send order; completion order may differ).
    fn receive_completed(&mut self) -> bool {
        let mut busy = false;
        for inc in &mut self.incoming {
            if let Some(req) = inc.req.take() {
                match req.test() {
                    Ok(_) => busy = true,
                    Err(req) => inc.req = Some(req),
                }
            }
        }
        if !busy {
            return false;
        }
        let mut blocked: Vec<(Rank, Tag)> = Vec::new();
        let mut i = 0;
        while i < self.incoming.len() {
            let inc = &self.incoming[i];
            let key = (inc.src, inc.tag);
            if inc.req.is_some() || blocked.contains(&key) {
                blocked.push(key);
                i += 1;
                continue;
            }
            let inc = self.incoming.remove(i);
            self.stats.record_recv(inc.src, inc.buf.len());
            let payload = match inc.buf {
                RecvTo::Pool { mut v, len } => {
                    // SAFETY: the receive of the matched message, `len`
                    // bytes into this spare capacity (at least `len`), has
                    // completed: MPI wrote every one.
                    unsafe { v.set_len(len) };
                    Buffer::from_bytes(self.pool.wrap(v))
                }
                RecvTo::Landing(mut l) => {
                    self.stats.record_landed(l.len() as u64);
                    // SAFETY: the receive into the landing's whole region
                    // (`len` bytes, the matched message's length, so MPI
                    // wrote every one) has completed.
                    unsafe { l.assume_filled() };
                    // Whole, so always a view.
                    l.into_buffer().unwrap_or_default()
                }
            };
            self.mailbox.deliver(inc.src, inc.tag, payload);
        }
        busy
    }

    /// Posts one send.
    fn post(
        &mut self,
        dst: Rank,
        tag: Tag,
        buf: Buffer,
        done: oneshot::Sender<Result<(), CommError>>,
    ) {
        // SAFETY: the slice points into `buf`, which `Pending` keeps alive
        // (and unmoved: `Bytes` data is on the heap) until MPI reports the
        // send complete.
        let data: &'static [u8] =
            unsafe { std::slice::from_raw_parts(buf.as_slice().as_ptr(), buf.len()) };
        if buf.len() >= HOLD_MIN {
            if let Some(t) = self.large_sent.get_mut(dst as usize) {
                *t = Some(Instant::now());
            }
        }
        let req = self
            .world
            .process_at_rank(dst as i32)
            .immediate_send_with_tag(StaticScope, data, self.tags.encode(tag));
        self.pending.push(Pending { req, buf, done });
    }
}

/// What the communicator, its waiting operations and the progress thread
/// share.
struct Shared {
    engine: Mutex<Engine>,
    driving: Driving,
    /// When a task last ran a pass (ns since `epoch`).
    last_driven: AtomicU64,
    epoch: Instant,
    /// Tasks that found a pass running on another thread: woken when it
    /// ends, instead of spinning meanwhile. (A pass can take milliseconds:
    /// it is where MPI copies a large message, and a task spinning beside
    /// it took a core from that copy: 0.7-0.8x raw MPI's bandwidth on 2
    /// cores.)
    contended: Mutex<Vec<std::task::Waker>>,
    /// Whether `contended` may be non-empty (spares the lock after passes).
    any_contended: std::sync::atomic::AtomicBool,
    /// The progress thread (unparked to hand the driving over).
    progress_thread: std::thread::Thread,
    /// A task stopped driving: the progress thread's next nap is short,
    /// so it takes over about HANDOFF after the task's last pass.
    handoff: std::sync::atomic::AtomicBool,
    /// The longest nap while tasks drive ([`nap_cap`]).
    nap_max: Duration,
    /// Set while the progress thread runs a pass and any nap after it
    /// (it naps while the engine only holds messages): a request queued
    /// meanwhile wakes it.
    hold_nap: std::sync::atomic::AtomicBool,
    /// Set once the rank has shut down and finalised MPI: a later
    /// `shutdown` (say after a first one's future was dropped) waits for
    /// this instead of queueing requests no pass will take.
    ended: crate::event::Event,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Engine> {
        self.engine.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The engine if no pass is running (and tasks may drive).
    fn try_engine(&self) -> Option<MutexGuard<'_, Engine>> {
        if self.driving != Driving::AnyThread {
            return None;
        }
        match self.engine.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Runs one pass on the engine `e` holds, releases it, then wakes the
    /// tasks that waited for that pass to end; returns what the pass found.
    fn run_pass(&self, mut e: MutexGuard<'_, Engine>) -> Pass {
        let found = e.pass();
        drop(e);
        self.pass_ended();
        found
    }

    /// Wakes the tasks that waited for the pass that just ended; call it
    /// after releasing the engine. Returns whether any did.
    fn pass_ended(&self) -> bool {
        // A load first: the progress thread ends a pass every few us, and
        // most have no waiter (a swap would write the line each time).
        if self.any_contended.load(Ordering::Acquire)
            && self.any_contended.swap(false, Ordering::AcqRel)
        {
            let wakers =
                std::mem::take(&mut *self.contended.lock().unwrap_or_else(|p| p.into_inner()));
            let woke = !wakers.is_empty();
            for w in wakers {
                w.wake();
            }
            return woke;
        }
        false
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn driven_recently(&self) -> bool {
        let last = self.last_driven.load(Ordering::Relaxed);
        self.now_ns().saturating_sub(last) < HANDOFF.as_nanos() as u64
    }
}

impl Drive for Shared {
    fn drive(&self, waited: Duration, waker: &std::task::Waker) -> bool {
        if self.driving != Driving::AnyThread {
            return false;
        }
        let spin = waited < SPIN;
        if spin {
            self.last_driven.store(self.now_ns(), Ordering::Relaxed);
        }
        if let Some(e) = self.try_engine() {
            // Past SPIN, keep driving while messages are in flight (the
            // pass is busy): someone must poll them, and handing that to
            // the progress thread costs wake-ups and lock hand-offs (in a
            // stream of 64 MiB messages over shared memory it ran ~40% of
            // the passes that way, the task sleeping beside it).
            let mut e = e;
            let keep = e.pass().busy() || spin;
            if keep {
                // Again after the pass, before the engine is released: one
                // that copied a large message took milliseconds, and the
                // progress thread (maybe waiting for the lock) must not
                // take that for a task that stopped driving.
                self.last_driven.store(self.now_ns(), Ordering::Relaxed);
            }
            drop(e);
            self.pass_ended();
            if !keep {
                // This task sleeps now: the progress thread takes over
                // soon, whatever its nap (once per wait past SPIN).
                self.handoff.store(true, Ordering::Release);
                self.progress_thread.unpark();
            }
            return keep;
        }
        // Another thread is in a pass: sleep until it ends.
        self.contended
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(waker.clone());
        self.any_contended.store(true, Ordering::Release);
        // It may have ended before the waker was in the list: look again.
        if let Some(e) = self.try_engine() {
            self.run_pass(e);
        }
        false
    }
}

/// One rank of a job started by an MPI launcher.
pub struct MpiComm {
    rank: Rank,
    nranks: u32,
    tags: TagLayout,
    mailbox: Arc<Mailbox>,
    stats: Arc<Statistics>,
    tx: mpsc::Sender<Req>,
    shared: Arc<Shared>,
    /// The largest message `send` takes: MPI's 2 GiB - 1 (a C `int` of
    /// bytes), or less where `BRAID_MPI_MAX_MESSAGE` says. Collectives send
    /// larger data as pieces of at most this.
    max_message: u64,
}

/// The most bytes one MPI message can carry (its count is a C `int`).
const MPI_MAX_MESSAGE: u64 = i32::MAX as u64;

/// `BRAID_MPI_MAX_MESSAGE`, which lowers the largest message (to try
/// collectives' pieced messages at small sizes); it never raises it.
fn max_message_from_env(rank: Rank) -> Result<u64, CommError> {
    let Ok(v) = std::env::var("BRAID_MPI_MAX_MESSAGE") else {
        return Ok(MPI_MAX_MESSAGE);
    };
    match v.trim().parse::<u64>() {
        Ok(m) if m >= crate::comm::MIN_MAX_MESSAGE => Ok(m.min(MPI_MAX_MESSAGE)),
        _ => Err(CommError::Bootstrap {
            rank,
            detail: format!(
                "BRAID_MPI_MAX_MESSAGE={v:?} is not a number of bytes from {} (a collective's frame header alone takes 32) to {MPI_MAX_MESSAGE}",
                crate::comm::MIN_MAX_MESSAGE
            ),
        }),
    }
}

/// The smallest tag bound braid works with: the MPI standard's minimum
/// `MPI_TAG_UB`.
const MIN_TAG_UB: i64 = (1 << 15) - 1;

/// `BRAID_MPI_TAG_UB`, which lowers the job's tag bound (to run a job as
/// under an MPI with a smaller one, such as Open MPI over UCX); it never
/// raises it. `None` where it is not set.
fn tag_ub_from_env(rank: Rank) -> Result<Option<i64>, CommError> {
    let Ok(v) = std::env::var("BRAID_MPI_TAG_UB") else {
        return Ok(None);
    };
    match v.trim().parse::<i64>() {
        Ok(b) if b >= MIN_TAG_UB => Ok(Some(b)),
        Ok(b) => Err(CommError::Bootstrap {
            rank,
            detail: format!(
                "BRAID_MPI_TAG_UB={b} is below {MIN_TAG_UB}; braid needs a tag bound of at least \
                 {MIN_TAG_UB}, as the MPI standard guarantees"
            ),
        }),
        Err(e) => Err(CommError::Bootstrap {
            rank,
            detail: format!("BRAID_MPI_TAG_UB={v:?} is not a number: {e}"),
        }),
    }
}

impl MpiComm {
    /// Initialises MPI on a progress thread and joins MPI_COMM_WORLD.
    /// Call once per process.
    ///
    /// A bad `BRAID_MPI_*` variable is an error before MPI starts. A
    /// failure after `MPI_Init` (an MPI whose own tag bound is below the
    /// standard's) prints its error and ends the job with `MPI_Abort`:
    /// ranks that finalised and exited with an error crashed Open MPI
    /// 4.1's mpirun now and then, or left it hanging in its own finalise.
    pub fn init() -> Result<MpiComm, CommError> {
        // Before MPI starts: a bad value fails every rank at once, and
        // mpirun sees processes that never joined MPI exit with an error
        // (a path it takes cleanly).
        let rank = crate::world::mpi_launch_rank().unwrap_or(Rank::MAX);
        let max_message = max_message_from_env(rank)?;
        let tag_ub = tag_ub_from_env(rank)?;
        let (tx, rx) = mpsc::channel::<Req>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<Arc<Shared>, CommError>>();
        let mailbox = Arc::new(Mailbox::default());
        let mb = mailbox.clone();
        std::thread::Builder::new()
            .name("braid-mpi".into())
            .spawn(move || progress(rx, ready_tx, mb, tag_ub))
            .map_err(|e| CommError::Bootstrap {
                rank,
                detail: format!("cannot start the MPI progress thread: {e}"),
            })?;
        let shared = ready_rx.recv().map_err(|_| CommError::Bootstrap {
            rank,
            detail: "the MPI progress thread died during MPI_Init".into(),
        })??;
        // (No MPI call here: under MPI_THREAD_FUNNELED only the progress
        // thread may make one.)
        let (rank, nranks, stats, tags) = {
            let e = shared.lock();
            (e.rank, e.nranks, e.stats.clone(), e.tags)
        };
        Ok(MpiComm {
            rank,
            nranks,
            tags,
            mailbox,
            stats,
            tx,
            shared,
            max_message,
        })
    }

    /// Runs `f` on `MPI_COMM_WORLD` while no progress pass can run, for
    /// code that calls MPI itself between braid's operations (the MPI
    /// benchmark's raw-MPI side, alternated with braid's in one process).
    /// `None` when MPI lets only the progress thread call it
    /// (`MPI_THREAD_FUNNELED` or lower).
    ///
    /// Nothing of braid's may be in flight to this rank meanwhile, and `f`
    /// must leave no message of its own unreceived: a later pass receives
    /// any source and any tag, and would take it.
    pub fn with_world<R>(&self, f: impl FnOnce(&SimpleCommunicator) -> R) -> Option<R> {
        if self.shared.driving != Driving::AnyThread {
            return None;
        }
        let e = self.shared.lock();
        if e.gone || e.finished.is_some() {
            return None;
        }
        let r = f(&e.world);
        drop(e);
        // Tasks that found the engine taken sleep until a pass ends.
        self.shared.pass_ended();
        Some(r)
    }

    /// A future that resolves when `rx` is answered, running passes while
    /// it waits.
    fn completion(&self, rx: oneshot::Receiver<Result<(), CommError>>) -> MpiSend {
        MpiSend {
            rx,
            driver: Driver::new(self.shared.clone()),
            rank: self.rank,
        }
    }
}

/// A send's completion; polls passes while it waits (see the module doc).
struct MpiSend {
    rx: oneshot::Receiver<Result<(), CommError>>,
    driver: Driver,
    rank: Rank,
}

impl Future for MpiSend {
    type Output = Result<(), CommError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let mut r = Pin::new(&mut this.rx).poll(cx);
        if r.is_pending() {
            this.driver.spin(cx);
            r = Pin::new(&mut this.rx).poll(cx);
        }
        let rank = this.rank;
        r.map(|x| x.unwrap_or(Err(CommError::Shutdown { rank })))
    }
}

/// The progress thread: initialises and finalises MPI, and runs passes
/// while no task does.
fn progress(
    rx: mpsc::Receiver<Req>,
    ready: mpsc::Sender<Result<Arc<Shared>, CommError>>,
    mailbox: Arc<Mailbox>,
    env_tag_ub: Option<i64>,
) {
    let Some((universe, level)) = mpi::initialize_with_threading(mpi::Threading::Serialized) else {
        let _ = ready.send(Err(CommError::Bootstrap {
            rank: Rank::MAX,
            detail: "MPI is already initialised in this process".into(),
        }));
        return;
    };
    let driving = match level {
        mpi::Threading::Serialized | mpi::Threading::Multiple => Driving::AnyThread,
        _ => Driving::ProgressThread,
    };
    // braid's probes take any message on the world. braid initialises MPI
    // itself (it refuses a process where MPI is initialised already), so
    // no other traffic shares it. (The finish notices' duplicate is freed
    // by hand before MPI_Finalize, which runs while the engine may still
    // live: see `Engine::notices`.)
    let world = universe.world();
    let (rank, nranks) = (world.rank() as Rank, world.size() as u32);
    // After MPI_Init a failure aborts the job (see `MpiComm::init`).
    let fail = |detail: String| -> ! {
        let line = format!("{}\n", CommError::Bootstrap { rank, detail });
        eprint!("error: {line}");
        world.abort(1)
    };
    let Some(tag_ub) = world.get_attr::<TagUb>().map(|t| i64::from(t.0)) else {
        fail("MPI_COMM_WORLD has no MPI_TAG_UB attribute (every MPI sets it)".into())
    };
    // (BRAID_MPI_TAG_UB, checked before MPI started, only lowers it.)
    let bound = env_tag_ub.map_or(tag_ub, |b| b.min(tag_ub));
    let Some(tags) = TagLayout::for_bound(bound) else {
        fail(format!(
            "MPI_TAG_UB is {tag_ub}; braid needs a tag bound of at least {MIN_TAG_UB}, as the \
             MPI standard guarantees"
        ))
    };
    mailbox.set_rank(rank);
    // Ranks on this host (a collective call: every rank makes it here).
    let local_ranks = world.split_shared(rank as i32).size().max(1) as usize;
    let shared = Arc::new(Shared {
        engine: Mutex::new(Engine {
            notices: std::mem::ManuallyDrop::new(world.duplicate()),
            notices_sent: false,
            notices_heard: 0,
            passes: 0,
            nranks,
            world,
            rank,
            tags,
            requests: rx,
            pending: Vec::new(),
            incoming: Vec::new(),
            held: Vec::new(),
            large_sent: vec![None; nranks as usize],
            flushes: Vec::new(),
            shutdown_asked: None,
            barrier: None,
            finished: None,
            gone: false,
            orphaned: false,
            pool: BufferPool::new(1 << 30),
            mailbox,
            stats: Arc::new(Statistics::new(rank, nranks)),
        }),
        driving,
        last_driven: AtomicU64::new(0),
        epoch: Instant::now(),
        contended: Mutex::new(Vec::new()),
        any_contended: std::sync::atomic::AtomicBool::new(false),
        progress_thread: std::thread::current(),
        handoff: std::sync::atomic::AtomicBool::new(false),
        nap_max: nap_cap(local_ranks),
        hold_nap: std::sync::atomic::AtomicBool::new(false),
        ended: crate::event::Event::new(),
    });
    let _ = ready.send(Ok(shared.clone()));
    drop(ready);
    let mut idle = 0u32;
    // How long to sleep while tasks drive: doubles while they keep
    // driving (each wake-up preempts a rank's thread on a busy host).
    let mut nap = HANDOFF / 2;
    loop {
        // While tasks drive, nap without touching the engine: taking its
        // lock only to look made a task that tried it meanwhile sleep
        // until some later pass ended (up to a nap and a HANDOFF later).
        if shared.driven_recently() {
            if shared.handoff.swap(false, Ordering::AcqRel) {
                nap = HANDOFF / 2;
            }
            std::thread::park_timeout(nap);
            nap = (nap * 2).min(shared.nap_max);
            continue;
        }
        let found = {
            let mut e = shared.lock();
            if let Some(done) = e.finished.take() {
                e.gone = true;
                // SAFETY: no pass uses `notices` once `gone` is set, and
                // this is its only drop (before MPI_Finalize below).
                unsafe { std::mem::ManuallyDrop::drop(&mut e.notices) };
                drop(e);
                // MPI_Finalize (on this thread, which initialised MPI)
                // before answering: the process may end as soon as
                // shutdown returns.
                drop(universe);
                shared.ended.set();
                let _ = done.send(());
                return;
            }
            if e.gone {
                return;
            }
            // A task may have driven while this thread waited for the
            // lock (it was in a long pass): leave the engine to it.
            if shared.driven_recently() {
                drop(e);
                shared.pass_ended();
                continue;
            }
            nap = HANDOFF / 2;
            // Set before the pass takes its requests: one queued after
            // that wakes this thread from the nap that may follow.
            shared.hold_nap.store(true, Ordering::Release);
            let found = e.pass();
            drop(e);
            if shared.pass_ended() {
                // A task waited for this pass to end so as to drive: leave
                // the engine to it (this thread naps from the next turn).
                // Taking the lock again at once won that race every time:
                // the task, woken, came too late, slept again, and this
                // thread went on driving while it sent (its sends waited
                // for each pass, some milliseconds long: see `drive`).
                shared.last_driven.store(shared.now_ns(), Ordering::Relaxed);
            }
            found
        };
        // Sends in flight need MPI progress (rendezvous): keep polling
        // without sleeping while there is traffic.
        match found {
            Pass::Holding { until } if shared.driving == Driving::AnyThread => {
                // Only held messages: they wait for receives that tasks
                // post (and drive) themselves, or for `until`. Spinning
                // here took a fifth of the core of a rank bound to one,
                // from its task copying its own block of a 16 MiB AllToAll
                // while it held the peer's next message (2026-11-28).
                // Napping at most NAP_MAX still finds new messages, and a
                // request queued meanwhile wakes this thread (`send`).
                idle = 0;
                let nap = until.saturating_duration_since(Instant::now()).min(NAP_MAX);
                std::thread::park_timeout(nap);
            }
            Pass::Moved | Pass::InFlight | Pass::Holding { .. } => idle = 0,
            Pass::Idle => {
                idle = idle.saturating_add(1);
                if idle > 2000 {
                    std::thread::sleep(Duration::from_micros(50));
                } else if idle > 100 {
                    std::thread::yield_now();
                }
            }
        }
        shared.hold_nap.store(false, Ordering::Release);
    }
}

impl Communicator for MpiComm {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn nranks(&self) -> u32 {
        self.nranks
    }

    fn backend(&self) -> Backend {
        Backend::Mpi
    }

    fn max_message(&self) -> u64 {
        self.max_message
    }

    fn send(&self, dst: Rank, tag: Tag, data: Buffer) -> SendFuture {
        if let Err(e) = check_rank(self.rank, dst, self.nranks) {
            return SendFuture::ready(Err(e));
        }
        let rank = self.rank;
        if self.mailbox.is_closed() {
            return SendFuture::ready(Err(self.mailbox.shutdown_error()));
        }
        // MPI counts bytes in a C int (rsmpi panics past it, in the
        // progress pass): refuse such a message here, where it is clear.
        if data.len() as u64 > self.max_message {
            return SendFuture::ready(Err(CommError::MessageTooLarge {
                rank,
                peer: dst,
                size: data.len() as u64,
                limit: self.max_message,
                backend: "MPI",
            }));
        }
        self.stats.record_send(dst, data.len());
        let (done, rx) = oneshot::channel();
        let req = Req::Send {
            dst,
            tag: self.tags.reduce(tag),
            buf: data,
            done,
        };
        // Post at once when the engine is free: queued requests first (a
        // pass takes them in order), so per (dst, tag) order holds. Only
        // the posting, not a whole pass: a pass receives what has arrived,
        // and over shared memory a large receive copies inside
        // `MPI_Imrecv`, for milliseconds. A frame's header sent that way
        // held back its own data's send while this rank copied the
        // peer's, so two ranks that exchanged 16 MiB took turns instead
        // of copying at once (2026-11-28: SendRecv at 0.45 of
        // MPI_Sendrecv over shared memory). The waits that follow drive
        // the receives.
        if let Some(mut e) = self.shared.try_engine() {
            if e.gone || e.finished.is_some() {
                return SendFuture::ready(Err(CommError::Shutdown { rank }));
            }
            if self.tx.send(req).is_err() {
                return SendFuture::ready(Err(CommError::Shutdown { rank }));
            }
            e.take_requests();
            drop(e);
            self.shared.pass_ended();
        } else if self.tx.send(req).is_err() {
            return SendFuture::ready(Err(CommError::Shutdown { rank }));
        } else if self.shared.hold_nap.load(Ordering::Acquire) {
            // A pass is running and may have taken its requests already:
            // the progress thread, napping, takes this one.
            self.shared.progress_thread.unpark();
        }
        SendFuture::waiting(self.completion(rx))
    }

    fn recv(&self, src: Rank, tag: Tag) -> RecvFuture {
        if let Err(e) = check_rank(self.rank, src, self.nranks) {
            return RecvFuture::ready(Err(e));
        }
        self.mailbox
            .recv(src, self.tags.reduce(tag))
            .driven_by(self.shared.clone())
    }

    fn recv_landing(&self, src: Rank, tag: Tag, landing: Landing) -> RecvFuture {
        if let Err(e) = check_rank(self.rank, src, self.nranks) {
            return RecvFuture::ready(Err(e));
        }
        self.mailbox
            .recv_landing(src, self.tags.reduce(tag), landing)
            .driven_by(self.shared.clone())
    }

    fn abort(&self, reason: &str) {
        // MPI_Abort ends this process: the program's cleanup first.
        crate::world::run_process_abort_hooks();
        let _ = self.tx.send(Req::Abort(reason.to_string()));
        if self.shared.driving == Driving::AnyThread {
            // MPI_Abort from here, now (it does not return).
            self.shared.lock().pass();
        }
        // MPI_Abort ends this process too; give it a moment.
        std::thread::sleep(Duration::from_secs(5));
    }

    fn failure(&self) -> Option<CommError> {
        self.mailbox.failure()
    }

    fn shutdown(&self) -> BoxFuture<'static, Result<(), CommError>> {
        let (ftx, frx) = oneshot::channel();
        let (stx, srx) = oneshot::channel();
        let rank = self.rank;
        if self.mailbox.is_closed() {
            // Called before: that call's requests are queued already.
            let shared = self.shared.clone();
            let mailbox = self.mailbox.clone();
            return Box::pin(async move {
                shared.ended.wait().await;
                mailbox.failure().map_or(Ok(()), Err)
            });
        }
        self.mailbox.close();
        let ok = self.tx.send(Req::Flush(ftx)).is_ok() && self.tx.send(Req::Shutdown(stx)).is_ok();
        Box::pin(async move {
            if !ok {
                return Err(CommError::Shutdown { rank });
            }
            let _ = frx.await;
            srx.await.map_err(|_| CommError::Shutdown { rank })
        })
    }

    fn statistics(&self) -> &Arc<Statistics> {
        &self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIRST: u32 = TagLayout::FIRST;

    #[test]
    fn naps_are_long_only_without_a_spare_core() {
        // (cores the rank may use, the host's cores, ranks on the host).
        let long = [
            (1, 2, 2),  // mpirun's binding: one core a rank
            (2, 2, 2),  // unbound, as many ranks as cores
            (4, 4, 8),  // unbound, oversubscribed
            (1, 64, 1), // bound to one core of a large host
        ];
        let short = [
            (2, 2, 1),   // one rank, two cores
            (64, 64, 8), // unbound on a large host
            (8, 64, 8),  // bound to 8 cores each
        ];
        for (v, h, l) in long {
            assert_eq!(
                nap_cap_for(v, h, l),
                NAP_MAX_SHARED,
                "{v} of {h} cores, {l} ranks"
            );
        }
        for (v, h, l) in short {
            assert_eq!(nap_cap_for(v, h, l), NAP_MAX, "{v} of {h} cores, {l} ranks");
        }
    }

    #[test]
    fn tag_layout_fits_the_bound() {
        // (MPI_TAG_UB, OpIds per class): the standard's minimum, Open MPI
        // over UCX, one below a power of two, ob1 (INT_MAX).
        let cases = [
            ((1i64 << 15) - 1, 1u32 << 6),
            ((1 << 23) - 1, 1 << 14),
            ((1 << 24) - 2, 1 << 14),
            (i64::from(i32::MAX), 1 << 22),
        ];
        for (ub, half) in cases {
            let l = TagLayout::for_bound(ub).unwrap();
            assert_eq!(l.half, half, "MPI_TAG_UB {ub}");
            // The largest tag it makes is within the bound.
            let top = l.encode(Tag::new(OpId(FIRST + half - 1), u8::MAX));
            assert!(top >= 0 && i64::from(top) <= ub, "MPI_TAG_UB {ub}: {top}");
            assert_eq!(
                i64::from(top),
                ub.min(i64::from(i32::MAX)).min(((half as i64) << 9) - 1)
            );
        }
        assert_eq!(TagLayout::for_bound((1 << 15) - 2), None);
        assert_eq!(TagLayout::for_bound(-1), None);
    }

    #[test]
    fn tag_layout_round_trips_and_keeps_classes_apart() {
        let l = TagLayout::for_bound((1 << 23) - 1).unwrap();
        let half = 1u32 << 14;
        let mut seen = std::collections::HashMap::new();
        for op in [0u32, 1, 255, half - 1, half, half + 3, FIRST - 1] {
            for stage in [0u8, 1, 255] {
                let t = Tag::new(OpId(op), stage);
                let r = l.reduce(t);
                assert_eq!(r, Tag::new(OpId(op % half), stage));
                assert_eq!(l.decode(l.encode(t)), r);
                assert_eq!(l.reduce(r), r);
                seen.insert(l.encode(t), r);
            }
        }
        for op in [
            FIRST,
            FIRST + 1,
            FIRST + half - 1,
            FIRST + half,
            FIRST + 70_001,
            u32::MAX,
        ] {
            for stage in [0u8, 1, 255] {
                let t = Tag::new(OpId(op), stage);
                let r = l.reduce(t);
                assert_eq!(r, Tag::new(OpId(FIRST + (op - FIRST) % half), stage));
                assert_eq!(l.decode(l.encode(t)), r);
                assert_eq!(l.reduce(r), r);
                // A collective's wire tag is never a user OpId's.
                assert!(
                    seen.get(&l.encode(t)).is_none_or(|u| u.op.0 >= FIRST),
                    "{t:?}"
                );
            }
        }
    }
}
