//! Barrier: no rank leaves before every rank has entered.
//!
//! Algorithm: dissemination. Round k (k = 0, 1, ... while 2^k < N): send
//! to rank + 2^k, receive from rank - 2^k (mod N). Cost: ceil(log2 N)
//! rounds of one empty message: ceil(log2 N) * alpha.
//!
//! In-process ranks (the local backend) instead meet once at (op, 0)
//! (`Communicator::meet`): one deposit and one take per rank.
//!
//! Reusable: every barrier takes a fresh OpId, so the messages of two
//! generations can never be confused (each round's tag is (op, k)).
//! Round 0 is a ring, so a rank that called something else where this rank
//! called Barrier is caught by the kind check of round 0.

use braid_core::comm::OfferData;
use braid_core::{Buffer, Context, Tag};
use braid_kernels::DType;

use crate::error::{CollError, CollKind, Site};
use crate::handle::{Callback, Handle, start, streaming};
use crate::wire::{DataRecv, Meta, meet_framed, none_refused, recv_framed, send_framed};

/// Starts a barrier; `callback` runs when it completes.
pub fn start_barrier(ctx: &Context, callback: Option<Callback>) -> Handle<()> {
    let site = Site::next(ctx, CollKind::Barrier);
    let op = site.op;
    let comm = ctx.comm().clone();
    start(ctx, CollKind::Barrier, op, callback, async move {
        let n = comm.nranks();
        let me = site.rank;
        // In-process ranks meet once instead of the message rounds.
        let meta = Meta::new(CollKind::Barrier, DType::Bytes);
        let empty = OfferData::same(Buffer::default());
        let met = meet_framed(comm.as_ref(), site, Tag::new(op, 0), meta, empty, |_, _| {
            Ok(())
        });
        if met.await?.is_ok() {
            return Ok(());
        }
        let mut dist = 1u32;
        let mut round = 0u8;
        while dist < n {
            let tag = Tag::new(op, round);
            let meta = Meta::new(CollKind::Barrier, DType::Bytes);
            let send = send_framed(
                comm.as_ref(),
                site,
                (me + dist) % n,
                tag,
                meta,
                &[],
                Buffer::default(),
            );
            // A send refused within its call (a message limit below a
            // frame's header) fails here; its peer's receive would wait.
            none_refused([&send])?;
            recv_framed(
                comm.as_ref(),
                site,
                (me + n - dist) % n,
                tag,
                DataRecv::AfterHead,
            )
            .await?;
            send.await?;
            dist *= 2;
            round += 1;
        }
        Ok(())
    })
}

/// Waits until every rank has called `barrier`.
pub async fn barrier(ctx: &Context) -> Result<(), CollError> {
    streaming(ctx, 0, |cb| start_barrier(ctx, cb)).await
}
