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

use std::io::Read as _;
use std::mem::MaybeUninit;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use socket2::SockRef;
use tokio::io::Interest;
use tokio::net::TcpStream;

use super::wire::{FRAME_HEADER_LEN, FrameHeader};
use super::{LAND_MIN, Shared, connection_lost};
use crate::Rank;
use crate::comm::mailbox::Drive;
use crate::error::CommError;
use crate::memory::{Buffer, Landing};
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
    stream: TcpStream,
    state: Mutex<ReadState>,
}

/// Where the reading of the connection stands.
struct ReadState {
    /// Bytes read ahead: `stage[lo..hi]` are not parsed yet.
    stage: Box<[u8]>,
    lo: usize,
    hi: usize,
    /// The frame whose payload is being read.
    frame: Option<Incoming>,
    /// How the connection ended, once it has.
    end: Option<ReadEnd>,
}

/// A frame whose header is read.
struct Incoming {
    tag: Tag,
    len: usize,
    dest: Dest,
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
}

impl PeerReader {
    pub(super) fn new(src: Rank, stream: TcpStream) -> Self {
        PeerReader {
            src,
            stream,
            state: Mutex::new(ReadState {
                stage: vec![0u8; STAGE].into_boxed_slice(),
                lo: 0,
                hi: 0,
                frame: None,
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

    /// A frame's header read: where its payload goes.
    fn start(&self, shared: &Shared, hb: &[u8; FRAME_HEADER_LEN]) -> Result<Incoming, CommError> {
        let header =
            FrameHeader::decode(hb, shared.max_message).map_err(|e| CommError::Protocol {
                rank: shared.rank,
                peer: Some(self.src),
                detail: format!("bad data frame: {e}"),
            })?;
        let len = header.len as usize;
        // The landing of the receive waiting for it (a large message, once
        // that receive is posted), else a pooled buffer; a receive posted
        // while the payload is read takes over the rest of it, after one
        // copy of what came before (`claim_late`).
        let landing = (len >= LAND_MIN)
            .then(|| shared.mailbox.claim(self.src, header.tag, len, 0))
            .flatten();
        let dest = match landing {
            Some(l) => Dest::Landing(l, 0),
            None => Dest::Pool(shared.pool.try_take(len).ok_or_else(|| CommError::Io {
                rank: shared.rank,
                peer: Some(self.src),
                detail: format!("cannot allocate {len} bytes for a message from this peer"),
            })?),
        };
        Ok(Incoming {
            tag: header.tag,
            len,
            dest,
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
                end,
            } = st;
            let refused = |end: &mut Option<ReadEnd>, e: CommError| {
                shared.fail_seen(e);
                *end = Some(ReadEnd::Failed);
                Pumped::Ended
            };
            let Some(f) = frame else {
                // A header: from the stage, or read more into it.
                if *hi - *lo >= FRAME_HEADER_LEN {
                    let mut hb = [0u8; FRAME_HEADER_LEN];
                    hb.copy_from_slice(&stage[*lo..*lo + FRAME_HEADER_LEN]);
                    *lo += FRAME_HEADER_LEN;
                    match self.start(shared, &hb) {
                        Ok(f) => *frame = Some(f),
                        Err(e) => return refused(end, e),
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
            let need = f.len - f.dest.filled();
            if need == 0 {
                if let Some(f) = frame.take() {
                    if let Err(e) = self.finish(shared, f) {
                        return refused(end, e);
                    }
                }
                continue;
            }
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
                    Dest::Landing(l, _) => self.read_uninit(l.unfilled()),
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

/// Reads `reader`'s connection as the socket turns readable, until it ends.
pub(super) async fn reader_task(shared: Arc<Shared>, reader: Arc<PeerReader>) {
    loop {
        let turn = match reader.stream.readable().await {
            Ok(()) => reader.stream.try_io(Interest::READABLE, || {
                let mut st = reader.lock();
                match reader.pump(&mut st, &shared, Turn::Task) {
                    // Tells tokio the socket is drained: it waits for
                    // the next readiness.
                    Pumped::Drained => Err(std::io::ErrorKind::WouldBlock.into()),
                    Pumped::Left | Pumped::Ended => Ok(()),
                }
            }),
            Err(e) => {
                reader.lock().end = Some(ReadEnd::Lost(format!("data connection failed: {e}")));
                Ok(())
            }
        };
        if turn.is_err() {
            continue;
        }
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
