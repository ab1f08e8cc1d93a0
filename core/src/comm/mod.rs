//! Communicators: tagged point-to-point messages between the ranks of a job.
//!
//! The `Communicator` trait is what collectives are written against. Every
//! backend gives the same guarantees:
//!
//! - `send` takes its place in the (src, dst, tag) order when it is *called*
//!   (not when its future is first polled), and messages of one (src, dst,
//!   tag) triple are received in that order.
//! - Sends are eager: the bytes are handed to the transport and the future
//!   resolves once they are written out (or delivered, in process).
//! - A receive names its source and tag; there is no "any source" receive.
//! - A dead peer or an abort fails every pending and later operation with an
//!   error that names that peer.
//!
//! Backends: [`local`] (ranks are tasks of one process), [`tcp`] (one
//! process per rank) and, with the `mpi` feature, `mpi` (ranks started by
//! mpirun or srun).

pub mod local;
mod mailbox;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod rendezvous;
pub mod tcp;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::BoxFuture;

use crate::Rank;
use crate::error::CommError;
use crate::memory::{Buffer, Landing, Reservation};
use crate::stats::Statistics;
use crate::tag::Tag;

/// The smallest message limit a backend takes from its environment
/// (`BRAID_MAX_MESSAGE`, `BRAID_MPI_MAX_MESSAGE`): a collective's frame
/// header alone takes 32 bytes, and under a smaller limit no collective
/// could send a frame.
pub const MIN_MAX_MESSAGE: u64 = 64;

pub use mailbox::RecvFuture;
pub use rendezvous::{MeetFuture, Met, Offer, OfferData, Seat, Taken};

/// Which transport a communicator uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// Ranks are tasks in one process; payloads are moved, not copied.
    Local,
    /// One process per rank over TCP.
    Tcp,
    /// Ranks started by mpirun or srun; MPI carries the bytes (feature
    /// `mpi`).
    Mpi,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Local => "local",
            Backend::Tcp => "tcp",
            Backend::Mpi => "mpi",
        })
    }
}

impl std::str::FromStr for Backend {
    type Err = String;
    /// `local`, `tcp` or `mpi`, in any letter case, spaces around ignored
    /// (as `--closed` and `--aggs` take theirs).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "local" => Ok(Backend::Local),
            "tcp" => Ok(Backend::Tcp),
            "mpi" => Ok(Backend::Mpi),
            _ => Err(format!(
                "unknown backend {s:?} (expected local, tcp or mpi; from --backend, or the environment's BRAID_BACKEND)"
            )),
        }
    }
}

/// Tagged point-to-point messaging between the ranks of a job.
pub trait Communicator: Send + Sync + 'static {
    /// This rank.
    fn rank(&self) -> Rank;

    /// The number of ranks.
    fn nranks(&self) -> u32;

    /// The transport.
    fn backend(&self) -> Backend;

    /// Sends `data` to `dst` with `tag`. Ordering is fixed at the call; the
    /// future resolves when the bytes have left this rank. Over tcp and mpi,
    /// to another rank, the transport has dropped its handles to `data` by
    /// then (a sender may reclaim memory that `data` views); between
    /// in-process ranks the buffer itself is what the receiver gets.
    fn send(&self, dst: Rank, tag: Tag, data: Buffer) -> SendFuture;

    /// The largest message this backend sends to another rank (tcp's
    /// `BRAID_MAX_MESSAGE`, MPI's 2 GiB - 1 or `BRAID_MPI_MAX_MESSAGE`);
    /// `send` refuses a larger one. Collectives send larger data as
    /// pieces of at most this (braid-coll's frames).
    fn max_message(&self) -> u64 {
        u64::MAX
    }

    /// Receives the next message from `src` with `tag`.
    fn recv(&self, src: Rank, tag: Tag) -> RecvFuture;

    /// Receives the next message from `src` with `tag`, written straight
    /// into `landing` where the transport can (tcp, for a large message of
    /// exactly the landing's length that is still to be read): the buffer
    /// is then a view of the landing's region
    /// ([`LandingZone::holds`](crate::memory::LandingZone::holds) says
    /// so); otherwise it is the message's own, as from `recv`.
    fn recv_landing(&self, src: Rank, tag: Tag, landing: Landing) -> RecvFuture {
        drop(landing);
        self.recv(src, tag)
    }

    /// Receives the next message from `src` with `tag` and charges it to
    /// `reservation`; fails if the message is larger than the reservation.
    fn recv_into(
        &self,
        src: Rank,
        tag: Tag,
        mut reservation: Reservation,
    ) -> BoxFuture<'static, Result<Buffer, CommError>> {
        let rank = self.rank();
        let fut = self.recv(src, tag);
        Box::pin(async move {
            let buf = fut.await?;
            let size = buf.len() as u64;
            let reserved = reservation.size();
            reservation.adopt(buf.into_bytes()).map_err(|e| match e {
                crate::error::MemoryError::ReservationExceeded { .. } => {
                    CommError::ReservationTooSmall {
                        rank,
                        peer: src,
                        tag,
                        size,
                        reserved,
                    }
                }
                other => CommError::Memory {
                    rank,
                    source: other,
                },
            })
        })
    }

    /// Meets every other rank at `tag` and swaps buffers with them without
    /// messages (see [`rendezvous`]): resolves to what every other rank
    /// offered this rank, in rank order, once all have arrived (a [`Seat`]:
    /// read them in place, or take them). Only
    /// ranks that share an address space can meet: other backends hand the
    /// offer back (`Err`), and the caller sends messages instead.
    fn meet(&self, tag: Tag, offer: Offer) -> Result<MeetFuture<'_>, Offer> {
        let _ = tag;
        Err(offer)
    }

    /// Whether [`meet`](Communicator::meet) takes offers here (the ranks
    /// share an address space): for a protocol that must choose before it
    /// meets what it sends as messages (the streaming AllGather keeps its
    /// last chunk for the meeting instead of sending it).
    fn meets(&self) -> bool {
        false
    }

    /// Fails the whole job: every rank's pending and later operations fail
    /// with an error naming this rank and `reason`.
    fn abort(&self, reason: &str);

    /// The failure this communicator has seen, if any.
    fn failure(&self) -> Option<CommError>;

    /// Ends the job cleanly: flushes this rank's sends and waits until every
    /// rank has called `shutdown`, so no rank leaves while a peer may still
    /// need it. On a failed communicator it only makes sure this rank's
    /// failure notices have left, then returns the failure.
    fn shutdown(&self) -> BoxFuture<'static, Result<(), CommError>>;

    /// Traffic statistics of this rank.
    fn statistics(&self) -> &std::sync::Arc<Statistics>;
}

/// A send's completion, as [`Communicator::send`] returns it: already
/// resolved where the backend finished the send within the call (the
/// local backend always, tcp whenever the socket took the bytes at once),
/// so the common small send costs no allocation; otherwise a boxed future.
#[must_use = "a send's error is only seen by awaiting its future"]
pub struct SendFuture(SendState);

enum SendState {
    Ready(Result<(), CommError>),
    Waiting(BoxFuture<'static, Result<(), CommError>>),
}

impl SendFuture {
    /// A send that finished within the call, with its result.
    pub fn ready(r: Result<(), CommError>) -> Self {
        SendFuture(SendState::Ready(r))
    }

    /// The error of a send the backend refused within the call (a
    /// message over its limit, a communicator shut or failed), seen
    /// without polling; `None` for a send that succeeded or is under way.
    pub fn refused(&self) -> Option<&CommError> {
        match &self.0 {
            SendState::Ready(Err(e)) => Some(e),
            _ => None,
        }
    }

    /// A send that completes later, when `f` does.
    pub fn waiting(f: impl Future<Output = Result<(), CommError>> + Send + 'static) -> Self {
        SendFuture(SendState::Waiting(Box::pin(f)))
    }
}

impl Future for SendFuture {
    type Output = Result<(), CommError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.0 {
            // Cloned, not taken: polling again after completion gives the
            // same answer instead of a panic.
            SendState::Ready(r) => Poll::Ready(r.clone()),
            SendState::Waiting(f) => f.as_mut().poll(cx),
        }
    }
}

impl fmt::Debug for SendFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            SendState::Ready(_) => "SendFuture::Ready",
            SendState::Waiting(_) => "SendFuture::Waiting",
        })
    }
}

pub(crate) fn check_rank(rank: Rank, peer: Rank, nranks: u32) -> Result<(), CommError> {
    if peer < nranks {
        Ok(())
    } else {
        Err(CommError::InvalidRank { rank, peer, nranks })
    }
}

/// Locks `m` as a table shared by the ranks of a process is locked: first
/// a bounded spin on `try_lock`, then the blocking lock. Its holders keep
/// it for well under a microsecond, but `std`'s lock puts a waiter to
/// sleep once another already sleeps, and a sleeping thread is woken by a
/// system call and, in a virtual machine, an interrupt to an idle core:
/// microseconds per hand-over where ranks meet on cores of their own.
/// A poisoned lock is taken as it is (its holders leave it consistent).
pub(crate) fn lock_spinning<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    for _ in 0..LOCK_SPINS {
        match m.try_lock() {
            Ok(g) => return g,
            Err(std::sync::TryLockError::Poisoned(p)) => return p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => std::hint::spin_loop(),
        }
    }
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Attempts of [`lock_spinning`] before it blocks (tens of microseconds:
/// a holder that was preempted is not waited for by spinning much longer).
const LOCK_SPINS: u32 = 1000;
