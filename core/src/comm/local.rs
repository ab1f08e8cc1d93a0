//! The `local` backend: N ranks inside one process. A send moves the buffer
//! (a reference-counted handle) straight into the destination's mailbox: no
//! bytes are copied and the send completes at once.

use std::sync::Arc;

use futures::future::BoxFuture;

use super::mailbox::Mailbox;
use super::rendezvous::{Offer, Rendezvous};
use super::{Backend, Communicator, MeetFuture, RecvFuture, SendFuture, check_rank};
use crate::Rank;
use crate::error::CommError;
use crate::event::Event;
use crate::memory::Buffer;
use crate::stats::Statistics;
use crate::tag::Tag;

struct World {
    mailboxes: Vec<Arc<Mailbox>>,
    /// Where collective steps meet instead of sending messages.
    rendezvous: Arc<Rendezvous>,
    stats: Vec<Arc<Statistics>>,
    /// Shutdown barrier: which ranks called shutdown (a rank that calls
    /// it again, say after a timed-out first call, counts once).
    shut: std::sync::Mutex<Vec<bool>>,
    all_shut: Event,
}

/// One rank of an in-process job.
pub struct LocalComm {
    rank: Rank,
    world: Arc<World>,
}

impl LocalComm {
    /// Creates the `nranks` communicators of a new in-process job.
    pub fn world(nranks: u32) -> Vec<LocalComm> {
        let stats: Vec<Arc<Statistics>> = (0..nranks)
            .map(|r| Arc::new(Statistics::new(r, nranks)))
            .collect();
        let world = Arc::new(World {
            mailboxes: (0..nranks).map(|r| Arc::new(Mailbox::new(r))).collect(),
            rendezvous: Arc::new(Rendezvous::counted(nranks, stats.clone())),
            stats,
            shut: std::sync::Mutex::new(vec![false; nranks as usize]),
            all_shut: Event::new(),
        });
        (0..nranks)
            .map(|rank| LocalComm {
                rank,
                world: world.clone(),
            })
            .collect()
    }

    fn mailbox(&self) -> &Arc<Mailbox> {
        &self.world.mailboxes[self.rank as usize]
    }

    /// A message for an operation whose meeting waits for ranks: the ranks
    /// disagree on the protocol of that operation (mismatched calls). Fails the job, so every
    /// rank, whichever of the two it waits in, errors instead of hanging.
    fn mixed(&self, tag: Tag, who: Rank) -> CommError {
        let reason = format!(
            "mismatched calls: rank {who} sent a message for operation {} where other ranks meet in-process (the ranks called collectives of different kinds there, one that sends messages such as HaloExchange, SendRecv or Shuffle against one that meets such as Barrier, Broadcast, AllGather or AllReduce, or called their collectives in another order)",
            tag.op.0
        );
        self.abort(&reason);
        self.mailbox().failure().unwrap_or(CommError::Protocol {
            rank: self.rank,
            peer: Some(who),
            detail: reason,
        })
    }
}

impl Communicator for LocalComm {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn nranks(&self) -> u32 {
        self.world.mailboxes.len() as u32
    }

    fn backend(&self) -> Backend {
        Backend::Local
    }

    fn send(&self, dst: Rank, tag: Tag, data: Buffer) -> SendFuture {
        let r = (|| {
            check_rank(self.rank, dst, self.nranks())?;
            if let Some(e) = self.mailbox().failure() {
                return Err(e);
            }
            if self.mailbox().is_closed() {
                return Err(self.mailbox().shutdown_error());
            }
            self.world.stats[self.rank as usize].record_send(dst, data.len());
            self.world.stats[dst as usize].record_recv(self.rank, data.len());
            self.world.mailboxes[dst as usize].deliver(self.rank, tag, data);
            // Delivered first, checked second; `meet` deposits first and
            // checks the mailbox second: one of the two sees the other.
            if self.world.rendezvous.is_waiting(tag.op) {
                return Err(self.mixed(tag, self.rank));
            }
            Ok(())
        })();
        SendFuture::ready(r)
    }

    fn recv(&self, src: Rank, tag: Tag) -> RecvFuture {
        if let Err(e) = check_rank(self.rank, src, self.nranks()) {
            return RecvFuture::ready(Err(e));
        }
        self.mailbox().recv(src, tag)
    }

    fn meets(&self) -> bool {
        true
    }

    fn meet(&self, tag: Tag, offer: Offer) -> Result<MeetFuture<'_>, Offer> {
        let rv = &self.world.rendezvous;
        let rank = self.rank;
        if self.mailbox().is_closed() {
            return Ok(MeetFuture::failed(rank, self.mailbox().shutdown_error()));
        }
        // (A meeting that waits for a rank that finished fails with
        // `PeerFinished` here, and for the ranks already waiting in it:
        // `Rendezvous::finish` woke them.)
        let arrival = match rv.deposit(rank, tag, offer) {
            Ok(a) => a,
            Err(e) => return Ok(MeetFuture::failed(rank, e)),
        };
        // (The last to arrive holds its seat here: dropped on an error
        // below, it leaves the meeting as its peers do.)
        let met = MeetFuture::arrived(rv, rank, arrival);
        // A message for this operation, while its meeting still waits for
        // ranks, comes from a rank that is not at the meeting: the ranks of
        // a meeting only send for its operation once it is complete (the
        // fastest may do so before this check, hence the second test).
        if let Some(src) = self.mailbox().queued_for(tag.op) {
            if rv.is_waiting(tag.op) {
                let e = self.mixed(tag, src);
                drop(met);
                return Ok(MeetFuture::failed(rank, e));
            }
        }
        Ok(met)
    }

    fn abort(&self, reason: &str) {
        // Mailboxes first, then meetings: a rank released from a meeting
        // finds its communicator failed already (and does not abort again
        // in its own name). Already failed: that failure is what every
        // rank hears.
        if self.mailbox().failure().is_none() {
            for (r, mb) in self.world.mailboxes.iter().enumerate() {
                mb.fail(CommError::Aborted {
                    rank: r as Rank,
                    peer: self.rank,
                    reason: reason.to_string(),
                });
            }
        }
        self.world.rendezvous.fail(self.rank, reason);
        // Release ranks waiting in shutdown too.
        self.world.all_shut.set();
    }

    fn failure(&self) -> Option<CommError> {
        self.mailbox().failure()
    }

    fn shutdown(&self) -> BoxFuture<'static, Result<(), CommError>> {
        let world = self.world.clone();
        let rank = self.rank;
        self.mailbox().close();
        // This rank sends nothing more: a rank that waits for a message
        // from it, or meets without it, would wait forever (their calls
        // differ). Such receives and meetings fail with
        // `CommError::PeerFinished`, the waiting rank's own error, as
        // over tcp and MPI.
        if self.mailbox().failure().is_none() {
            for (q, mb) in world.mailboxes.iter().enumerate() {
                if q != rank as usize {
                    mb.peer_finished(rank, None);
                }
            }
            world.rendezvous.finish(rank);
        }
        {
            let mut shut = world.shut.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(me) = shut.get_mut(rank as usize) {
                *me = true;
            }
            if shut.iter().all(|s| *s) {
                world.all_shut.set();
            }
        }
        Box::pin(async move {
            world.all_shut.wait().await;
            match world.mailboxes[rank as usize].failure() {
                Some(e) => Err(e),
                None => Ok(()),
            }
        })
    }

    fn statistics(&self) -> &Arc<Statistics> {
        &self.world.stats[self.rank as usize]
    }
}

/// A rank dropped without `shutdown` (a thread of the caller's that ended
/// early, say) finishes as `shutdown` would, without waiting for the
/// others: its peers' receives from it and the meetings that wait for it
/// fail instead of waiting for ever, and their own shutdowns no longer
/// wait for it. (`run_world` always shuts a rank down; a world made with
/// [`LocalComm::world`] is the caller's to end.)
impl Drop for LocalComm {
    fn drop(&mut self) {
        if !self.mailbox().is_closed() {
            drop(self.shutdown());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tag::OpId;

    /// Rank 0 dropped without a shutdown: rank 1's receive from it and
    /// its own shutdown end (both waited for ever).
    #[test]
    fn a_dropped_rank_ends_its_peers_waits() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut comms = LocalComm::world(2);
            let one = comms.pop().unwrap();
            let zero = comms.pop().unwrap();
            let tag = Tag::new(OpId(1), 0);
            zero.send(1, tag, Buffer::from_vec(vec![5])).await.unwrap();
            let waiting = one.recv(0, Tag::new(OpId(2), 0));
            drop(zero);
            let limit = std::time::Duration::from_secs(10);
            // What was sent before the drop still arrives.
            let got = tokio::time::timeout(limit, one.recv(0, tag)).await.unwrap();
            assert_eq!(got.unwrap().as_slice(), &[5]);
            let e = tokio::time::timeout(limit, waiting)
                .await
                .expect("the receive from the dropped rank still waits")
                .unwrap_err();
            assert!(e.to_string().contains("rank 0"), "{e}");
            tokio::time::timeout(limit, one.shutdown())
                .await
                .expect("the shutdown waits for the dropped rank")
                .unwrap();
        });
    }
}
