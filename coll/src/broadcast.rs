//! Broadcast: the root's buffer reaches every rank.
//!
//! Algorithm: binomial tree rooted at `root` (ranks renumbered relative to
//! the root). Cost: ceil(log2 N) * (alpha + m * beta); on the local backend
//! beta is ~0 (buffers are shared, not copied). Alongside the tree every
//! rank takes part in an agreement on the root (`wire::check_signature`:
//! ceil(log2 N) dissemination rounds of one small message), so ranks that
//! disagree on the root all fail instead of returning different data. That
//! round is what a broadcast costs over an unchecked one: the root cannot
//! return until it has heard from the other ranks.
//!
//! In-process ranks (the local backend) instead meet once at (op, 0)
//! (`Communicator::meet`): every rank sees every rank's root, and the
//! non-roots take the root's buffer (shared, not copied). One deposit and
//! one take per rank replace the tree and the root check's rounds.

use braid_core::comm::OfferData;
use braid_core::{Buffer, Context, Rank, Tag};
use braid_kernels::DType;

use crate::error::{CollError, CollKind, Site};
use crate::handle::{Callback, Handle, start, streaming};
use crate::wire::{Meta, Signature, check_signature, meet_framed, recv_framed, send_framed};

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
        let offer = OfferData::Same(data.clone().unwrap_or_default());
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
        let check = check_signature(comm.as_ref(), site, sig);
        let tree = async {
            let tag = Tag::new(op, 0);
            let vr = (me + n - root) % n;
            let mut data = data;
            let mut mask = 1u32;
            while mask < n {
                if vr & mask != 0 {
                    let parent = (vr - mask + root) % n;
                    let f = recv_framed(comm.as_ref(), site, parent, tag).await?;
                    if f.meta.aux != root {
                        return Err(site.mismatch(
                            parent,
                            format!("root {root} here, {} on rank {parent}", f.meta.aux),
                        ));
                    }
                    data = Some(f.data);
                    break;
                }
                mask <<= 1;
            }
            let data = data.unwrap_or_default();
            mask >>= 1;
            let mut sends = Vec::new();
            while mask > 0 {
                if vr + mask < n {
                    let child = (vr + mask + root) % n;
                    let meta = Meta::new(CollKind::Broadcast, DType::Bytes)
                        .aux(root)
                        .count(data.len() as u64);
                    sends.push(send_framed(
                        comm.as_ref(),
                        site,
                        child,
                        tag,
                        meta,
                        &[],
                        data.clone(),
                    ));
                }
                mask >>= 1;
            }
            for s in sends {
                s.await?;
            }
            Ok(data)
        };
        let (_, data) = futures::try_join!(check, tree)?;
        Ok(data)
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
