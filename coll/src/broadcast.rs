//! Broadcast: the root's buffer reaches every rank.
//!
//! Algorithm: one message per rank and round, the agreement on the call
//! and the data together (`wire::check_spreading`): ceil(log2 N)
//! dissemination rounds, each message carrying the minimum and maximum of
//! the ranks' signatures (root) seen so far, and the data where the
//! receiver lacks it, which makes the data's path a binomial tree rooted
//! at `root`. Cost: ceil(log2 N) * (alpha + m * beta) for the data, and no
//! message beyond the check's own: ranks that disagree on the root all
//! fail instead of returning different data, so the root cannot return
//! until it has heard from the others (log2 N one-way latencies), where an
//! unchecked broadcast returns at once.
//!
//! In-process ranks (the local backend) instead meet once at (op, 0)
//! (`Communicator::meet`): every rank sees every rank's root, and the
//! non-roots take the root's buffer (shared, not copied). One deposit and
//! one take per rank replace the rounds.

use braid_core::comm::OfferData;
use braid_core::{Buffer, Context, Rank, Tag};
use braid_kernels::DType;

use crate::error::{CollError, CollKind, Site};
use crate::handle::{Callback, Handle, start, streaming};
use crate::wire::{Meta, Signature, check_spreading, meet_framed};

/// Starts a broadcast from `root`. The root passes `Some(data)`, the others
/// `None`; every rank's handle yields the root's buffer.
pub fn start_broadcast(
    ctx: &Context,
    root: Rank,
    data: Option<Buffer>,
    callback: Option<Callback>,
) -> Handle<Buffer> {
    let site = Site::next(ctx, CollKind::Broadcast);
    let op = site.op;
    let comm = ctx.comm().clone();
    start(ctx, CollKind::Broadcast, op, callback, async move {
        let n = comm.nranks();
        let me = site.rank;
        if root >= n {
            return Err(site.invalid(format!("root {root} is not below nranks {n}")));
        }
        if (me == root) != data.is_some() {
            return Err(site.invalid(if me == root {
                "the root must pass the data"
            } else {
                "only the root passes data"
            }));
        }
        // In-process ranks meet once instead of the tree and the check.
        let meta = Meta::new(CollKind::Broadcast, DType::Bytes).aux(root);
        let offer = OfferData::same(data.clone().unwrap_or_default());
        let met = meet_framed(comm.as_ref(), site, Tag::new(op, 0), meta, offer, |p, f| {
            if f.meta.aux == root {
                Ok(())
            } else {
                Err(site.mismatch(p, format!("root {root} here, {} on rank {p}", f.meta.aux)))
            }
        });
        if let Ok(frames) = met.await? {
            return match data {
                Some(d) => Ok(d),
                None => frames
                    .into_iter()
                    .find(|(p, _)| *p == root)
                    .map(|(_, f)| f.data)
                    .ok_or_else(|| site.mismatch(root, "the root's buffer is missing")),
            };
        }
        let sig = Signature {
            dtype: DType::Bytes,
            aux: root,
            count: 0,
        };
        check_spreading(comm.as_ref(), site, sig, root, data)
            .await?
            .ok_or_else(|| site.mismatch(root, "the root's buffer did not arrive"))
    })
}

/// Broadcasts the root's buffer to every rank.
pub async fn broadcast(
    ctx: &Context,
    root: Rank,
    data: Option<Buffer>,
) -> Result<Buffer, CollError> {
    // Only the root knows the size: the others take it as small.
    let bytes = data.as_ref().map_or(0, |d| d.len());
    streaming(ctx, bytes, |cb| start_broadcast(ctx, root, data, cb)).await
}
