//! The sending side of one data connection (this rank -> one peer).
//!
//! A send first tries to write its frame straight from the calling task
//! (`try_write_vectored` on the socket, no task hop) when nothing is queued
//! or being written; whatever does not fit in the socket buffer, and every
//! send that finds the connection busy, goes to a FIFO queue that the
//! connection's task writes out with vectored writes (header and payload
//! together, several small frames per system call, no copies).
//!
//! Order: a frame is either written inline while no one else writes and the
//! queue is empty, or appended to the queue; the queue is only written by
//! whoever holds `busy`. So frames leave in the order `send` was called.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::net::TcpStream;
use tokio::sync::{Notify, oneshot};

use super::wire::{FRAME_HEADER_LEN, FrameHeader};
use crate::Rank;
use crate::error::CommError;
use crate::memory::Buffer;

/// Frames per vectored write.
const MAX_FRAMES_PER_WRITE: usize = 64;

type Done = oneshot::Sender<Result<(), CommError>>;

struct Frame {
    header: [u8; FRAME_HEADER_LEN],
    payload: Buffer,
    /// Bytes of header + payload already written.
    written: usize,
    done: Option<Done>,
}

impl Frame {
    fn total(&self) -> usize {
        FRAME_HEADER_LEN + self.payload.len()
    }

    /// The unwritten parts.
    fn slices(&self) -> [IoSlice<'_>; 2] {
        let w = self.written;
        if w < FRAME_HEADER_LEN {
            [
                IoSlice::new(&self.header[w..]),
                IoSlice::new(self.payload.as_slice()),
            ]
        } else {
            [
                IoSlice::new(&[]),
                IoSlice::new(&self.payload.as_slice()[w - FRAME_HEADER_LEN..]),
            ]
        }
    }
}

enum Item {
    Frame(Frame),
    Flush(Done),
}

#[derive(Default)]
struct State {
    queue: VecDeque<Item>,
    busy: bool,
    stream: Option<Arc<TcpStream>>,
    error: Option<CommError>,
    closed: bool,
}

/// Who writes a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Write {
    /// The calling task, as far as the socket takes it at once, when the
    /// connection is idle (no task hop for a small message).
    Inline,
    /// The connection's task: the pieces of a striped message, so that
    /// each lane's task writes its own while the caller writes lane 0's.
    Task,
}

/// What became of a send.
pub(super) enum Sent {
    /// Written out already.
    Done,
    /// Queued; the receiver answers when written.
    Queued(oneshot::Receiver<Result<(), CommError>>),
    /// The connection has failed.
    Failed(CommError),
}

/// One outgoing data connection.
pub(super) struct PeerWriter {
    rank: Rank,
    dst: Rank,
    state: Mutex<State>,
    wake: Notify,
}

impl PeerWriter {
    /// The (not yet connected) connection from `rank` to `dst`.
    pub(super) fn new(rank: Rank, dst: Rank) -> Self {
        PeerWriter {
            rank,
            dst,
            state: Mutex::new(State::default()),
            wake: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends one frame (see the module doc for the order guarantee):
    /// `header` then `payload`.
    pub(super) fn send(&self, header: FrameHeader, payload: Buffer, how: Write) -> Sent {
        let mut frame = Frame {
            header: header.encode(),
            payload,
            written: 0,
            done: None,
        };
        let mut st = self.lock();
        if let Some(e) = &st.error {
            return Sent::Failed(e.clone());
        }
        let idle = how == Write::Inline && !st.busy && st.queue.is_empty();
        let stream = match (&st.stream, idle) {
            (Some(s), true) => s.clone(),
            _ => {
                let (tx, rx) = oneshot::channel();
                frame.done = Some(tx);
                st.queue.push_back(Item::Frame(frame));
                drop(st);
                self.wake.notify_one();
                return Sent::Queued(rx);
            }
        };
        st.busy = true;
        drop(st);
        let total = frame.total();
        let mut err = None;
        while frame.written < total {
            match stream.try_write_vectored(&frame.slices()) {
                Ok(n) => frame.written += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    err = Some(e);
                    break;
                }
            }
        }
        let mut st = self.lock();
        st.busy = false;
        if let Some(e) = err {
            drop(st);
            return Sent::Failed(self.fail_with(format!("write failed: {e}")));
        }
        // Failed or closed while this wrote: no task writes the queue any
        // more (the connection task has ended, or answered the queue
        // already), so the rest of the frame queued would never be answered.
        if frame.written < total {
            if let Some(e) = &st.error {
                return Sent::Failed(e.clone());
            }
        }
        let wake = !st.queue.is_empty() || frame.written < total;
        let out = if frame.written < total {
            let (tx, rx) = oneshot::channel();
            frame.done = Some(tx);
            st.queue.push_front(Item::Frame(frame));
            Sent::Queued(rx)
        } else {
            Sent::Done
        };
        drop(st);
        if wake {
            self.wake.notify_one();
        }
        out
    }

    /// A receiver answered once everything sent before is written.
    pub(super) fn flush(&self) -> oneshot::Receiver<Result<(), CommError>> {
        let (tx, rx) = oneshot::channel();
        let mut st = self.lock();
        if let Some(e) = &st.error {
            let _ = tx.send(Err(e.clone()));
            return rx;
        }
        st.queue.push_back(Item::Flush(tx));
        drop(st);
        self.wake.notify_one();
        rx
    }

    /// Makes the connection task stop, and ends the connection (FIN).
    /// What is still queued is failed (no task writes it any more: left
    /// in the queue, its senders waited for ever), and so is every later
    /// send.
    pub(super) fn close(&self) {
        let stream = {
            let mut st = self.lock();
            st.closed = true;
            st.stream.take()
        };
        self.fail(CommError::Shutdown { rank: self.rank });
        // The connection ends now, whoever still holds the stream: the
        // peer's reader sees its end and lets go of its rank's state, which
        // holds that rank's own writers. Kept open, every dropped rank of
        // an in-process world kept the others' readers (and so their
        // sockets and receive pools) alive until the runtime ended.
        if let Some(s) = stream {
            let _ = socket2::SockRef::from(s.as_ref()).shutdown(std::net::Shutdown::Write);
        }
        self.wake.notify_one();
    }

    /// Records a failure: fails everything queued and every later send.
    pub(super) fn fail(&self, e: CommError) {
        let items: Vec<Item> = {
            let mut st = self.lock();
            if st.error.is_none() {
                st.error = Some(e.clone());
            }
            st.queue.drain(..).collect()
        };
        for it in items {
            let d = match it {
                Item::Frame(f) => f.done,
                Item::Flush(d) => Some(d),
            };
            if let Some(d) = d {
                let _ = d.send(Err(e.clone()));
            }
        }
    }

    fn fail_with(&self, detail: String) -> CommError {
        let e = self.lock().error.clone();
        e.unwrap_or_else(|| {
            let e = CommError::PeerDied {
                rank: self.rank,
                peer: self.dst,
                detail,
            };
            self.fail(e.clone());
            e
        })
    }

    /// The connection's task, once connected: writes the queue out until
    /// closed or failed. Returns the write error, if any.
    pub(super) async fn run(self: Arc<Self>, stream: TcpStream) -> Result<(), std::io::Error> {
        let stream = Arc::new(stream);
        {
            let mut st = self.lock();
            if st.closed {
                // Connected after `close`: end this connection too.
                let _ = socket2::SockRef::from(stream.as_ref()).shutdown(std::net::Shutdown::Write);
                return Ok(());
            }
            st.stream = Some(stream.clone());
        }
        loop {
            let mut batch: Vec<Item> = {
                let mut st = self.lock();
                if st.closed || st.error.is_some() {
                    return Ok(());
                }
                if st.busy || st.queue.is_empty() {
                    None
                } else {
                    st.busy = true;
                    let mut b = Vec::new();
                    while b.len() < MAX_FRAMES_PER_WRITE {
                        match st.queue.pop_front() {
                            Some(it) => b.push(it),
                            None => break,
                        }
                    }
                    Some(b)
                }
            }
            .unwrap_or_default();
            if batch.is_empty() {
                self.wake.notified().await;
                continue;
            }
            let res = write_batch(&stream, &mut batch).await;
            self.lock().busy = false;
            match res {
                Ok(()) => {
                    for it in batch {
                        let d = match it {
                            Item::Frame(f) => f.done,
                            Item::Flush(d) => Some(d),
                        };
                        if let Some(d) = d {
                            let _ = d.send(Ok(()));
                        }
                    }
                }
                Err(e) => {
                    // Put the batch back so `fail` answers every sender.
                    {
                        let mut st = self.lock();
                        for it in batch.into_iter().rev() {
                            st.queue.push_front(it);
                        }
                    }
                    return Err(e);
                }
            }
        }
    }
}

/// Writes every frame of `batch` completely, several per system call.
async fn write_batch(stream: &TcpStream, batch: &mut [Item]) -> std::io::Result<()> {
    let mut first = 0;
    loop {
        while first < batch.len() {
            match &batch[first] {
                Item::Frame(f) if f.written < f.total() => break,
                _ => first += 1,
            }
        }
        if first == batch.len() {
            return Ok(());
        }
        let n = {
            let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(2 * (batch.len() - first));
            for it in &batch[first..] {
                if let Item::Frame(f) = it {
                    for s in f.slices() {
                        if !s.is_empty() {
                            slices.push(s);
                        }
                    }
                }
            }
            stream.writable().await?;
            match stream.try_write_vectored(&slices) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        };
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        let mut left = n;
        for it in &mut batch[first..] {
            if left == 0 {
                break;
            }
            if let Item::Frame(f) = it {
                let take = left.min(f.total() - f.written);
                f.written += take;
                left -= take;
            }
        }
    }
}
