//! Error types of the core runtime.
//!
//! Every error names the rank it happened on and, where one is involved, the
//! peer. Errors are `Clone` so that one failure (a dead peer, say) can be
//! handed to every operation that was waiting when it happened.

use crate::Rank;
use crate::tag::Tag;

/// A failure of a communicator operation or of the job's transport.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CommError {
    /// A peer rank outside `0..nranks` was named.
    #[error("rank {rank}: peer rank {peer} is out of range (nranks = {nranks})")]
    InvalidRank {
        /// The rank that made the call.
        rank: Rank,
        /// The rank that was named.
        peer: Rank,
        /// The number of ranks of the job.
        nranks: u32,
    },
    /// A peer process died or its connection broke.
    #[error("rank {rank}: peer rank {peer} died or disconnected ({detail})")]
    PeerDied {
        /// The rank that noticed.
        rank: Rank,
        /// The rank that died.
        peer: Rank,
        /// What was seen.
        detail: String,
    },
    /// A peer failed and aborted the job.
    #[error("rank {rank}: job aborted by {}: {}", aborter(*.rank, *.peer), without_rank(*.peer, .reason))]
    Aborted {
        /// The rank that noticed.
        rank: Rank,
        /// The rank that aborted.
        peer: Rank,
        /// Why it aborted.
        reason: String,
    },
    /// A rank of the job cannot join it as started (another job size, say):
    /// the job cannot start. Its own error is the cause; this rank, which
    /// saw it, only passes it on.
    #[error("rank {rank}: rank {peer} cannot join the job: {detail}")]
    PeerMisfit {
        /// The rank that saw it.
        rank: Rank,
        /// The rank that cannot join.
        peer: Rank,
        /// Why.
        detail: String,
    },
    /// An I/O error on a connection.
    #[error("rank {rank}: I/O error{}: {detail}", peer_suffix(*.peer))]
    Io {
        /// The rank that saw the error.
        rank: Rank,
        /// The peer of the connection, when known.
        peer: Option<Rank>,
        /// The error text.
        detail: String,
    },
    /// A peer (or something that connected to a rank's port) broke the wire
    /// protocol: bad magic, a frame over the size limit, a wrong token.
    #[error("rank {rank}: protocol error{}: {detail}", peer_suffix(*.peer))]
    Protocol {
        /// The rank that saw the error.
        rank: Rank,
        /// The peer, when known.
        peer: Option<Rank>,
        /// What was wrong.
        detail: String,
    },
    /// A message did not fit the reservation it was received into.
    #[error(
        "rank {rank}: message from rank {peer} ({tag}) is {size} bytes, larger than its reservation of {reserved} bytes"
    )]
    ReservationTooSmall {
        /// The receiving rank.
        rank: Rank,
        /// The sender.
        peer: Rank,
        /// The message tag.
        tag: Tag,
        /// The message size.
        size: u64,
        /// The reservation's size.
        reserved: u64,
    },
    /// A message is larger than the backend can carry (MPI counts bytes
    /// in a C int; tcp frames have a configured limit).
    #[error(
        "rank {rank}: a message of {size} bytes to rank {peer} is over the {backend} limit of {limit} bytes"
    )]
    MessageTooLarge {
        /// The sending rank.
        rank: Rank,
        /// The destination.
        peer: Rank,
        /// The message size.
        size: u64,
        /// The largest message the backend carries.
        limit: u64,
        /// The backend.
        backend: &'static str,
    },
    /// The job could not be set up.
    #[error("{}: bootstrap failed: {detail}", who(.rank))]
    Bootstrap {
        /// The rank that failed (`Rank::MAX`: not known yet, as when the
        /// rank's own variable is malformed).
        rank: Rank,
        /// What went wrong.
        detail: String,
    },
    /// A received message could not be charged where the caller asked
    /// (a receive into a reservation of device memory, say).
    #[error("rank {rank}: {source}")]
    Memory {
        /// This rank.
        rank: Rank,
        /// Why.
        #[source]
        source: MemoryError,
    },
    /// A peer finished its job (shut down) and every message it sent this
    /// rank has arrived, yet this rank waits for another one: the ranks'
    /// calls differ (a collective or a receive the peer did not make).
    #[error(
        "rank {rank}: rank {peer} finished its job while this rank waits for it ({tag:?}, a message or a collective's meeting): the ranks' calls differ (a collective or receive that rank did not make)"
    )]
    PeerFinished {
        /// The waiting rank.
        rank: Rank,
        /// The rank that finished.
        peer: Rank,
        /// The message waited for.
        tag: crate::tag::Tag,
    },
    /// The communicator was shut down before the operation finished.
    #[error("rank {rank}: communicator is shut down")]
    Shutdown {
        /// The rank.
        rank: Rank,
    },
    /// An operation did not complete in time.
    #[error("rank {rank}: timed out after {secs} s waiting for {what}")]
    Timeout {
        /// The rank.
        rank: Rank,
        /// What was waited for.
        what: String,
        /// How long.
        secs: u64,
    },
}

/// `msg` without a leading "rank {rank}: ": an error quoted inside
/// another that names the same rank already (an abort's reason is the
/// aborting rank's own error, which names it).
pub fn without_rank(rank: Rank, msg: &str) -> &str {
    msg.strip_prefix("rank ")
        .and_then(|rest| rest.strip_prefix(rank.to_string().as_str()))
        .and_then(|rest| rest.strip_prefix(": "))
        .unwrap_or(msg)
}

/// Who aborted, as `rank` says it: "this rank" where it was `rank`
/// itself (its own earlier failure, heard again by a later call).
fn aborter(rank: Rank, peer: Rank) -> String {
    if rank == peer {
        "this rank".into()
    } else {
        format!("rank {peer}")
    }
}

fn peer_suffix(peer: Option<Rank>) -> String {
    match peer {
        Some(p) => format!(" with peer rank {p}"),
        None => String::new(),
    }
}

impl CommError {
    /// The peer rank this error is about, if any.
    pub fn peer(&self) -> Option<Rank> {
        match self {
            CommError::InvalidRank { peer, .. }
            | CommError::PeerDied { peer, .. }
            | CommError::PeerMisfit { peer, .. }
            | CommError::PeerFinished { peer, .. }
            | CommError::Aborted { peer, .. }
            | CommError::ReservationTooSmall { peer, .. }
            | CommError::MessageTooLarge { peer, .. } => Some(*peer),
            CommError::Io { peer, .. } | CommError::Protocol { peer, .. } => *peer,
            _ => None,
        }
    }
}

/// A failure of the memory layer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum MemoryError {
    /// No memory type had room for a reservation.
    #[error("cannot reserve {size} bytes: {detail}")]
    OutOfMemory {
        /// Requested size.
        size: u64,
        /// Per-type availability.
        detail: String,
    },
    /// An allocation asked for more than its reservation holds.
    #[error("allocation of {size} bytes exceeds the reservation's remaining {remaining} bytes")]
    ReservationExceeded {
        /// Requested size.
        size: u64,
        /// What the reservation had left.
        remaining: u64,
    },
    /// A host buffer was asked of a reservation of device memory.
    #[error(
        "a device reservation cannot hold a host buffer ({size} bytes): reserve host memory for it"
    )]
    NotHost {
        /// The buffer's size.
        size: u64,
    },
    /// Spilling to disk failed (spills go under the temp directory,
    /// `$TMPDIR`).
    #[error(
        "spill I/O failed: {0} (spills go under $TMPDIR, /tmp by default: point it at a disk with room, or raise the memory limit)"
    )]
    Spill(String),
}

/// A rank as bootstrap errors name it: `Rank::MAX` stands for one that
/// is not known yet (printed as such, not as 4294967295).
fn who(rank: &Rank) -> String {
    if *rank == Rank::MAX {
        "rank unknown".into()
    } else {
        format!("rank {rank}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bootstrap error before the rank is known says so; after, it
    /// names the rank.
    #[test]
    fn bootstrap_errors_name_the_rank_when_known() {
        let e = |rank| {
            CommError::Bootstrap {
                rank,
                detail: "x".into(),
            }
            .to_string()
        };
        assert_eq!(e(Rank::MAX), "rank unknown: bootstrap failed: x");
        assert_eq!(e(3), "rank 3: bootstrap failed: x");
    }

    /// An abort names the aborting rank once: its reason, that rank's own
    /// error, starts with the same name, which is dropped; a reason naming
    /// another rank (or a rank whose number starts the same) is kept whole.
    #[test]
    fn an_abort_names_the_aborting_rank_once() {
        let e = |peer, reason: &str| {
            CommError::Aborted {
                rank: 0,
                peer,
                reason: reason.into(),
            }
            .to_string()
        };
        assert_eq!(
            e(3, "rank 3: node \"sink\" failed: boom"),
            "rank 0: job aborted by rank 3: node \"sink\" failed: boom"
        );
        assert_eq!(
            e(3, "rank 31: lost"),
            "rank 0: job aborted by rank 3: rank 31: lost"
        );
        assert_eq!(
            e(3, "rank 2: lost"),
            "rank 0: job aborted by rank 3: rank 2: lost"
        );
        assert_eq!(e(3, "plain"), "rank 0: job aborted by rank 3: plain");
        assert_eq!(
            e(0, "rank 0: node \"a\" failed: x"),
            "rank 0: job aborted by this rank: node \"a\" failed: x"
        );
        assert_eq!(without_rank(12, "rank 12: x"), "x");
        assert_eq!(without_rank(1, "rank 12: x"), "rank 12: x");
    }
}
