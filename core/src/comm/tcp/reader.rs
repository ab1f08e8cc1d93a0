//! The receiving side of one data connection (one peer -> this rank).
//!
//! Frames are read by whoever gets to the socket first:
//! - the connection's task ([`reader_task`]), woken by the runtime's I/O
//!   driver when the socket turns readable;
//! - a task waiting for a message from this peer ([`ReadDrive`], the
//!   receive's [`Drive`]): each time its receive is polled it reads what
//!   the socket holds, without blocking. A rank that polls for a small
//!   collective (`Waiting::PollYield`) so takes its reply straight off the
//!   socket; otherwise the reply waits until the kernel has woken the
//!   worker thread parked in the I/O driver (`epoll_wait`), which on a
//!   host with a core for each of a rank's workers is most of a small
//!   collective's time.
//!
//! ```text
//!   socket --recv--> stage (32 KiB) --header--> the frame's memory: the
//!      |                                        landing of the receive it
//!      |                                        goes to, or a pooled buffer
//!      +--recv (payload from 32 KiB up)-------> the frame's memory
//!   whole frame -> mailbox (per (src, tag) in arrival order)
//! ```
//!
//! One lock (`PeerReader::state`) orders the readers: the task takes it, a
//! waiter only tries it (and reads at most [`DRIVE_BUDGET`] bytes a turn,
//! leaving large payloads to the task), so frames are parsed by one reader
//! at a time and delivered in order, and bulk transfers stream as before.
//! The task handles the connection's end (a peer's close, a lost
//! connection), whoever reads it.
//!
//! A peer's large messages come in pieces over several connections
//! (lanes, see the tcp module doc): lane 0's reader is the one above and
//! delivers every message; the other lanes' readers (tasks only) fill the
//! regions lane 0 hands them ([`Lanes`]).

use std::collections::VecDeque;
use std::io::Read as _;
use std::mem::MaybeUninit;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use socket2::SockRef;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::sync::Notify;

use super::wire::{FRAME_HEADER_LEN, FrameHeader, MAX_LANES, stripe_piece};
use super::{LAND_MIN, Shared, connection_lost};
use crate::Rank;
use crate::comm::mailbox::Drive;
use crate::error::CommError;
use crate::memory::{Buffer, Landing, LandingZone};
use crate::tag::Tag;

/// Bytes read from the socket at a time into the stage (headers and small
/// payloads; payloads from this size up are read straight into place).
const STAGE: usize = 32 << 10;
/// The most bytes a waiting task reads in one turn: it is there for its
/// own reply, not to stream another operation's bulk message (the
/// connection's task does that, and so reads every payload of
/// [`LAND_MIN`] bytes or more beyond what the stage holds).
const DRIVE_BUDGET: usize = 64 << 10;

/// One incoming data connection.
pub(super) struct PeerReader {
    src: Rank,
    /// Which of the peer's connections (0: every message; 1..: pieces).
    lane: u8,
    /// The pieces announced to the peer's lanes, and their wake-ups.
    lanes: Arc<Lanes>,
    stream: TcpStream,
    state: Mutex<ReadState>,
}

/// The pieces of one peer's striped messages, as lane 0's headers
/// announce them, and the wake-ups between that peer's readers:
///
/// ```text
///   lane 0: header (len, k) -> the message's memory (landing or pooled),
///           split in k regions; region i queued for lane i; reads piece 0
///   lane i: header -> the next region queued for it (waits for lane 0's
///           header if it came first); reads piece i; the last piece in
///           wakes lane 0
///   lane 0: once every piece is in: the regions joined, one message to
///           the mailbox, then its next frame
/// ```
///
/// Lane 0 delivers a striped message before it reads past it, so messages
/// from a peer reach the mailbox in the order they were sent.
pub(super) struct Lanes {
    /// Per lane (entry 0 unused): regions announced, not yet read into.
    queues: Vec<Mutex<VecDeque<Piece>>>,
    /// Per lane: wakes its reader's task (lane 0's: a stripe it waits for
    /// is complete; lane i's: a region is queued for it).
    wake: Vec<Notify>,
}

impl Lanes {
    pub(super) fn new() -> Self {
        Lanes {
            queues: (0..MAX_LANES)
                .map(|_| Mutex::new(VecDeque::new()))
                .collect(),
            wake: (0..MAX_LANES).map(|_| Notify::new()).collect(),
        }
    }

    fn queue(&self, lane: u8) -> MutexGuard<'_, VecDeque<Piece>> {
        let q = &self.queues[usize::from(lane) % self.queues.len()];
        q.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wake(&self, lane: u8) {
        self.wake[usize::from(lane) % self.wake.len()].notify_one();
    }
}

/// One region of a striped message, for the lane that reads it.
struct Piece {
    stripe: Arc<Stripe>,
    index: u8,
    landing: Landing,
}

/// A striped message's regions, as their readers finish them.
struct Stripe {
    tag: Tag,
    state: Mutex<StripeState>,
}

struct StripeState {
    /// Piece i's region once wholly read.
    done: Vec<Option<Landing>>,
    /// Pieces not yet in.
    left: usize,
}

impl Stripe {
    fn new(tag: Tag, k: u8) -> Self {
        Stripe {
            tag,
            state: Mutex::new(StripeState {
                done: (0..k).map(|_| None).collect(),
                left: usize::from(k),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, StripeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Piece `i` is read; true when it was the last one.
    fn put(&self, i: u8, l: Landing) -> bool {
        let mut st = self.lock();
        if let Some(slot) = st.done.get_mut(usize::from(i)) {
            if slot.replace(l).is_none() {
                st.left -= 1;
            }
        }
        st.left == 0
    }

    fn complete(&self) -> bool {
        self.lock().left == 0
    }

    /// The pieces joined into the message's one region, once all are in.
    fn join(&self) -> Option<Landing> {
        let mut st = self.lock();
        if st.left != 0 {
            return None;
        }
        let mut pieces = st.done.iter_mut().map(Option::take);
        let mut whole = pieces.next().flatten()?;
        for p in pieces {
            whole.unsplit(p?).ok()?;
        }
        Some(whole)
    }
}

/// Where the reading of the connection stands.
struct ReadState {
    /// Bytes read ahead: `stage[lo..hi]` are not parsed yet.
    stage: Box<[u8]>,
    lo: usize,
    hi: usize,
    /// The frame whose payload is being read.
    frame: Option<Incoming>,
    /// Lanes 1..: a piece's header read before lane 0 announced its region.
    held: Option<FrameHeader>,
    /// How the connection ended, once it has.
    end: Option<ReadEnd>,
}

/// A frame whose header is read.
struct Incoming {
    tag: Tag,
    /// Payload bytes on this connection.
    len: usize,
    dest: Dest,
    part: Part,
}

/// What a frame's payload is of its message.
enum Part {
    /// All of it.
    Whole,
    /// Lane 0: the first piece of a striped message.
    First(Box<First>),
    /// Lanes 1..: piece `index` of the stripe.
    Piece(Arc<Stripe>, u8),
}

/// The rest of a striped message, as lane 0 keeps it.
struct First {
    stripe: Arc<Stripe>,
    /// The message's length.
    total: usize,
    /// The pooled vector's zone where no receive offered a landing.
    zone: Option<LandingZone<u8>>,
    /// Whether piece 0 is read (and given to the stripe).
    given: bool,
}

/// Where a message's payload is being read to.
enum Dest {
    /// A buffer of the receive pool (no receive offered a landing yet).
    Pool(Vec<u8>),
    /// The landing of the receive it goes to (counting the bytes in it so
    /// far), and how many of them were read before it was claimed (and
    /// copied in).
    Landing(Landing, usize),
}

impl Dest {
    fn filled(&self) -> usize {
        match self {
            Dest::Pool(v) => v.len(),
            Dest::Landing(l, _) => l.filled(),
        }
    }

    /// Appends `bytes` (no more than the payload's rest).
    fn put(&mut self, bytes: &[u8]) {
        match self {
            Dest::Pool(v) => v.extend_from_slice(bytes),
            Dest::Landing(l, _) => bytes::BufMut::put_slice(l, bytes),
        }
    }
}

/// How a connection ended.
#[derive(Clone)]
enum ReadEnd {
    /// The peer closed it between frames.
    Closed,
    /// It broke, or closed in the middle of a frame.
    Lost(String),
    /// A frame was refused; the rank has failed already.
    Failed,
}

/// Who reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// The connection's task: everything the socket holds.
    Task,
    /// A waiting receive's task: up to [`DRIVE_BUDGET`] bytes, and no
    /// large payload from the socket.
    Waiter,
}

/// What a turn of reading came to.
enum Pumped {
    /// The socket holds nothing more.
    Drained,
    /// A waiter's turn is over; there may be more.
    Left,
    /// The connection has ended (`ReadState::end`).
    Ended,
    /// Nothing to do until another lane of the peer wakes this one: a
    /// piece's region is not announced yet (lanes 1..), or a striped
    /// message's other pieces are not all in (lane 0).
    Blocked,
}

impl PeerReader {
    pub(super) fn new(src: Rank, lane: u8, lanes: Arc<Lanes>, stream: TcpStream) -> Self {
        PeerReader {
            src,
            lane,
            lanes,
            stream,
            state: Mutex::new(ReadState {
                stage: vec![0u8; STAGE].into_boxed_slice(),
                lo: 0,
                hi: 0,
                frame: None,
                held: None,
                end: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ReadState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads from the (non-blocking) socket into initialised bytes.
    fn read(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        let sock = SockRef::from(&self.stream);
        loop {
            match (&*sock).read(buf) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                r => return r,
            }
        }
    }

    /// Reads from the (non-blocking) socket into memory not yet written.
    fn read_uninit(&self, buf: &mut [MaybeUninit<u8>]) -> std::io::Result<usize> {
        let sock = SockRef::from(&self.stream);
        loop {
            match sock.recv(buf) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                r => return r,
            }
        }
    }

    fn refuse(&self, shared: &Shared, detail: String) -> CommError {
        CommError::Protocol {
            rank: shared.rank,
            peer: Some(self.src),
            detail,
        }
    }

    fn no_memory(&self, shared: &Shared, len: usize) -> CommError {
        CommError::Io {
            rank: shared.rank,
            peer: Some(self.src),
            detail: format!("cannot allocate {len} bytes for a message from this peer"),
        }
    }

    /// A frame's header read: where its payload goes. `None` on lanes 1..
    /// where lane 0 has not announced the piece's region yet (the header
    /// is then held until it has).
    fn start(&self, shared: &Shared, header: FrameHeader) -> Result<Option<Incoming>, CommError> {
        let len = header.len as usize;
        if self.lane != 0 {
            if header.pieces != 0 {
                return Err(self.refuse(shared, format!("a striped header on lane {}", self.lane)));
            }
            let Some(p) = self.lanes.queue(self.lane).pop_front() else {
                return Ok(None);
            };
            if p.landing.len() != len || p.stripe.tag != header.tag {
                return Err(self.refuse(
                    shared,
                    format!(
                        "lane {} sent a {len}-byte piece of {:?} where lane 0 announced {} bytes of {:?}",
                        self.lane,
                        header.tag,
                        p.landing.len(),
                        p.stripe.tag
                    ),
                ));
            }
            return Ok(Some(Incoming {
                tag: header.tag,
                len,
                dest: Dest::Landing(p.landing, 0),
                part: Part::Piece(p.stripe, p.index),
            }));
        }
        // The landing of the receive waiting for it (a large message, once
        // that receive is posted), else a pooled buffer; a receive posted
        // while a whole message's payload is read takes over the rest of
        // it, after one copy of what came before (`claim_late`).
        let landing = (len >= LAND_MIN)
            .then(|| shared.mailbox.claim(self.src, header.tag, len, 0))
            .flatten();
        if header.pieces >= 2 {
            return self.start_stripe(shared, header, landing).map(Some);
        }
        let dest = match landing {
            Some(l) => Dest::Landing(l, 0),
            None => Dest::Pool(
                shared
                    .pool
                    .try_take(len)
                    .ok_or_else(|| self.no_memory(shared, len))?,
            ),
        };
        Ok(Some(Incoming {
            tag: header.tag,
            len,
            dest,
            part: Part::Whole,
        }))
    }

    /// Lane 0's header of a striped message: its memory (`landing`, else a
    /// pooled vector's zone) split in the pieces' regions, piece i's queued
    /// for lane i; piece 0's read here.
    fn start_stripe(
        &self,
        shared: &Shared,
        header: FrameHeader,
        landing: Option<Landing>,
    ) -> Result<Incoming, CommError> {
        let (len, k) = (header.len as usize, header.pieces);
        let (mut region, zone) = match landing {
            Some(l) => (l, None),
            None => {
                let v = shared
                    .pool
                    .try_take(len)
                    .ok_or_else(|| self.no_memory(shared, len))?;
                let zone = LandingZone::<u8>::reusing(v, len)
                    .ok_or_else(|| self.no_memory(shared, len))?;
                let l = zone
                    .landing(0, len)
                    .ok_or_else(|| self.no_memory(shared, len))?;
                (l, Some(zone))
            }
        };
        let stripe = Arc::new(Stripe::new(header.tag, k));
        for i in (1..k).rev() {
            let (start, _) = stripe_piece(header.len, k, i);
            let piece = region
                .split_off(start as usize)
                .ok_or_else(|| self.refuse(shared, format!("piece {i} of a {len}-byte message")))?;
            self.lanes.queue(i).push_back(Piece {
                stripe: stripe.clone(),
                index: i,
                landing: piece,
            });
            self.lanes.wake(i);
        }
        Ok(Incoming {
            tag: header.tag,
            len: region.len(),
            dest: Dest::Landing(region, 0),
            part: Part::First(Box::new(First {
                stripe,
                total: len,
                zone,
                given: false,
            })),
        })
    }

    /// A large message read into a pooled buffer so far goes on into the
    /// landing of a receive posted since, if there is one.
    fn claim_late(&self, shared: &Shared, f: &mut Incoming) {
        if let Dest::Pool(buf) = &mut f.dest {
            if f.len >= LAND_MIN && buf.len() < f.len {
                if let Some(mut l) = shared.mailbox.claim(self.src, f.tag, f.len, 0) {
                    let filled = buf.len();
                    bytes::BufMut::put_slice(&mut l, buf);
                    drop(shared.pool.wrap(std::mem::take(buf)));
                    f.dest = Dest::Landing(l, filled);
                }
            }
        }
    }

    /// A frame's payload is all read: a whole message to the mailbox; a
    /// piece to its stripe. `Blocked` while lane 0's striped message waits
    /// for its other pieces (the frame then stays).
    fn complete(&self, shared: &Shared, frame: &mut Option<Incoming>) -> Result<Pumped, CommError> {
        let Some(f) = frame.as_mut() else {
            return Ok(Pumped::Drained);
        };
        match &mut f.part {
            Part::Whole => {
                if let Some(f) = frame.take() {
                    self.finish(shared, f)?;
                }
            }
            Part::Piece(stripe, i) => {
                let dest = std::mem::replace(&mut f.dest, Dest::Pool(Vec::new()));
                if let Dest::Landing(l, _) = dest {
                    if stripe.put(*i, l) {
                        self.lanes.wake(0);
                    }
                }
                *frame = None;
            }
            Part::First(first) => {
                if !first.given {
                    first.given = true;
                    let dest = std::mem::replace(&mut f.dest, Dest::Pool(Vec::new()));
                    if let Dest::Landing(l, _) = dest {
                        first.stripe.put(0, l);
                    }
                }
                if !first.stripe.complete() {
                    return Ok(Pumped::Blocked);
                }
                if let Some(Incoming {
                    tag,
                    part: Part::First(first),
                    ..
                }) = frame.take()
                {
                    self.finish_stripe(shared, tag, *first)?;
                }
            }
        }
        Ok(Pumped::Left)
    }

    /// A striped message's pieces are all in: joined, to the mailbox.
    fn finish_stripe(&self, shared: &Shared, tag: Tag, first: First) -> Result<(), CommError> {
        let total = first.total;
        let broken = || {
            self.refuse(
                shared,
                format!("the pieces of a {total}-byte message do not join"),
            )
        };
        let whole = first.stripe.join().ok_or_else(broken)?;
        let payload = match first.zone {
            None => {
                let view = whole.into_buffer().map_err(|_| broken())?;
                shared.stats.record_landed(total as u64);
                view
            }
            Some(zone) => {
                let v = zone.into_landed_vec(whole).ok_or_else(broken)?;
                Buffer::from_bytes(shared.pool.wrap(v))
            }
        };
        shared.stats.record_recv(self.src, total);
        shared.mailbox.deliver(self.src, tag, payload);
        Ok(())
    }

    /// A whole frame: to the mailbox.
    fn finish(&self, shared: &Shared, f: Incoming) -> Result<(), CommError> {
        let len = f.len;
        shared.stats.record_recv(self.src, len);
        let payload = match f.dest {
            Dest::Pool(buf) => Buffer::from_bytes(shared.pool.wrap(buf)),
            Dest::Landing(l, copied) => match l.into_buffer() {
                Ok(view) => {
                    shared.stats.record_landed((len - copied) as u64);
                    view
                }
                // Called only once every byte is in.
                Err(l) => {
                    return Err(CommError::Protocol {
                        rank: shared.rank,
                        peer: Some(self.src),
                        detail: format!("a {len}-byte message ended at byte {}", l.filled()),
                    });
                }
            },
        };
        shared.mailbox.deliver(self.src, f.tag, payload);
        Ok(())
    }

    /// Reads and delivers frames until the socket holds nothing more, the
    /// connection ends, or (`Turn::Waiter`) the turn is over.
    fn pump(&self, st: &mut ReadState, shared: &Shared, turn: Turn) -> Pumped {
        let budget = match turn {
            Turn::Task => usize::MAX,
            Turn::Waiter => DRIVE_BUDGET,
        };
        if st.end.is_some() {
            return Pumped::Ended;
        }
        let mut read = 0usize;
        loop {
            let ReadState {
                stage,
                lo,
                hi,
                frame,
                held,
                end,
            } = st;
            let refused = |end: &mut Option<ReadEnd>, e: CommError| {
                shared.fail_seen(e);
                *end = Some(ReadEnd::Failed);
                Pumped::Ended
            };
            let Some(f) = frame else {
                // A header read: where its payload goes (lanes 1.. wait
                // for lane 0 to announce it).
                if let Some(h) = held.take() {
                    match self.start(shared, h) {
                        Ok(Some(f)) => *frame = Some(f),
                        Ok(None) => {
                            *held = Some(h);
                            return Pumped::Blocked;
                        }
                        Err(e) => return refused(end, e),
                    }
                    continue;
                }
                // A header: from the stage, or read more into it.
                if *hi - *lo >= FRAME_HEADER_LEN {
                    let mut hb = [0u8; FRAME_HEADER_LEN];
                    hb.copy_from_slice(&stage[*lo..*lo + FRAME_HEADER_LEN]);
                    *lo += FRAME_HEADER_LEN;
                    match FrameHeader::decode(&hb, shared.max_message) {
                        Ok(h) => *held = Some(h),
                        Err(e) => {
                            return refused(
                                end,
                                self.refuse(shared, format!("bad data frame: {e}")),
                            );
                        }
                    }
                    continue;
                }
                if read >= budget {
                    return Pumped::Left;
                }
                stage.copy_within(*lo..*hi, 0);
                *hi -= *lo;
                *lo = 0;
                match self.read(&mut stage[*hi..]) {
                    Ok(0) => {
                        *end = Some(if *hi == 0 {
                            ReadEnd::Closed
                        } else {
                            ReadEnd::Lost(
                                "connection closed in the middle of a frame header".into(),
                            )
                        });
                        return Pumped::Ended;
                    }
                    Ok(n) => {
                        *hi += n;
                        read += n;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Pumped::Drained,
                    Err(e) => {
                        *end = Some(ReadEnd::Lost(format!("data connection failed: {e}")));
                        return Pumped::Ended;
                    }
                }
                continue;
            };
            // The payload: what the stage holds first, then the socket.
            let waits = matches!(&f.part, Part::First(first) if first.given);
            if waits || f.dest.filled() == f.len {
                match self.complete(shared, frame) {
                    Ok(Pumped::Blocked) => return Pumped::Blocked,
                    Ok(_) => {}
                    Err(e) => return refused(end, e),
                }
                continue;
            }
            let need = f.len - f.dest.filled();
            if *hi > *lo {
                let k = need.min(*hi - *lo);
                f.dest.put(&stage[*lo..*lo + k]);
                *lo += k;
                continue;
            }
            if read >= budget || (turn == Turn::Waiter && f.len >= LAND_MIN) {
                return Pumped::Left;
            }
            self.claim_late(shared, f);
            let got = if need >= STAGE {
                // Straight into place.
                let got = match &mut f.dest {
                    Dest::Pool(v) => {
                        // The pool's vector has room for the whole payload
                        // (`BufferPool::try_take`); a read into no room
                        // would look like the peer's close.
                        let spare = v.spare_capacity_mut();
                        if spare.is_empty() {
                            let e = CommError::Io {
                                rank: shared.rank,
                                peer: Some(self.src),
                                detail: format!("no room for a {}-byte message", f.len),
                            };
                            return refused(end, e);
                        }
                        let k = need.min(spare.len());
                        self.read_uninit(&mut spare[..k])
                    }
                    // SAFETY: the socket's read writes initialised bytes.
                    Dest::Landing(l, _) => self.read_uninit(unsafe { l.unfilled() }),
                };
                if let Ok(n) = got {
                    match &mut f.dest {
                        // SAFETY: the socket wrote the first `n` bytes of
                        // the spare capacity (or landing rest) given to it.
                        Dest::Pool(v) => unsafe { v.set_len(v.len() + n) },
                        // SAFETY: as above.
                        Dest::Landing(l, _) => unsafe { bytes::BufMut::advance_mut(l, n) },
                    }
                }
                got
            } else {
                *lo = 0;
                let got = self.read(&mut stage[..]);
                *hi = *got.as_ref().unwrap_or(&0);
                got
            };
            match got {
                Ok(0) => {
                    let detail = format!(
                        "connection closed in the middle of a {}-byte message",
                        f.len
                    );
                    *end = Some(ReadEnd::Lost(detail));
                    return Pumped::Ended;
                }
                Ok(n) => read += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Pumped::Drained,
                Err(e) => {
                    *end = Some(ReadEnd::Lost(format!("data connection failed: {e}")));
                    return Pumped::Ended;
                }
            }
        }
    }
}

/// Reads `reader`'s connection as the socket turns readable, until it ends;
/// while it is blocked on the peer's other lanes (`Pumped::Blocked`), as
/// they wake it instead.
pub(super) async fn reader_task(shared: Arc<Shared>, reader: Arc<PeerReader>) {
    let wake = &reader.lanes.wake[usize::from(reader.lane) % reader.lanes.wake.len()];
    let mut blocked = false;
    loop {
        let woken = if blocked {
            tokio::select! {
                _ = wake.notified() => true,
                // Nothing wakes a blocked lane of a failed job.
                _ = shared.failed.wait() => return,
            }
        } else {
            tokio::select! {
                r = reader.stream.readable() => {
                    if let Err(e) = r {
                        reader.lock().end = Some(ReadEnd::Lost(format!("data connection failed: {e}")));
                    }
                    false
                }
                _ = wake.notified() => true,
            }
        };
        let pumped = if woken {
            // Woken by another lane, not by the socket: read it directly
            // (what it holds now, as a waiting receive does).
            let mut st = reader.lock();
            Ok(reader.pump(&mut st, &shared, Turn::Task))
        } else {
            reader.stream.try_io(Interest::READABLE, || {
                let mut st = reader.lock();
                match reader.pump(&mut st, &shared, Turn::Task) {
                    // Tells tokio the socket is drained: it waits for
                    // the next readiness.
                    Pumped::Drained => Err(std::io::ErrorKind::WouldBlock.into()),
                    p => Ok(p),
                }
            })
        };
        blocked = matches!(pumped, Ok(Pumped::Blocked));
        let end = reader.lock().end.clone();
        match end {
            None => {}
            Some(ReadEnd::Closed | ReadEnd::Failed) => return,
            Some(ReadEnd::Lost(detail)) => {
                // The control plane reports deaths; a reset here usually
                // is one, but only fail the job if nothing else explains
                // it soon (a broken connection to a live peer would
                // otherwise leave its receives waiting for ever).
                tracing::debug!(rank = shared.rank, peer = reader.src, %detail, "data connection error");
                connection_lost(&shared, reader.src, detail).await;
                return;
            }
        }
    }
}

/// A receive's [`Drive`]: reads its peer's socket from the waiting task
/// (see the module doc).
pub(super) struct ReadDrive {
    pub(super) shared: Arc<Shared>,
    pub(super) src: Rank,
}

impl Drive for ReadDrive {
    fn drive(&self, _waited: Duration, _waker: &std::task::Waker) -> bool {
        let Some(reader) = self
            .shared
            .readers
            .get(self.src as usize)
            .and_then(|r| r.get())
        else {
            return false;
        };
        // Another reader at it: its frames reach the mailbox anyway.
        if let Ok(mut st) = reader.state.try_lock() {
            let _ = reader.pump(&mut st, &self.shared, Turn::Waiter);
        }
        false
    }
}
