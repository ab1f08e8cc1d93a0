//! SendRecv: send to one peer and receive from another in one step (the
//! step of a ring). Cost: alpha + m * beta, both directions at once.
//!
//! Pairing is the caller's: rank r's `src` must be a rank whose `dst` is
//! r in the same call. Peers that do not pair up (rank 1 receives from
//! rank 0, which sends elsewhere) are not detected, as in MPI: the
//! receive waits for a message that never comes (a tcp job's idle peers
//! are still alive, so nothing fails). The kinds of paired calls are
//! checked as in every collective (a receive that gets another kind of
//! collective's frame fails with a mismatch); their sizes are not, and
//! need not agree: each rank receives what its `src` sent, whatever its
//! own part's size (the parts of an uneven ring step differ).

use braid_core::{Buffer, Context, Rank, Tag};
use braid_kernels::DType;

use crate::error::{CollError, CollKind, Site};
use crate::handle::{Callback, Handle, start, streaming};
use crate::wire::{DataRecv, Meta, none_refused, recv_framed, send_framed};

/// Starts sending `data` to `dst` while receiving from `src`.
pub fn start_sendrecv(
    ctx: &Context,
    dst: Rank,
    data: Buffer,
    src: Rank,
    callback: Option<Callback>,
) -> Handle<Buffer> {
    let site = Site::next(ctx, CollKind::SendRecv);
    let op = site.op;
    let comm = ctx.comm().clone();
    start(ctx, CollKind::SendRecv, op, callback, async move {
        let n = comm.nranks();
        for (what, peer) in [("send", dst), ("receive", src)] {
            if peer >= n {
                return Err(site.invalid(format!("{what} peer {peer} is not a rank (nranks {n})")));
            }
        }
        let tag = Tag::new(op, 0);
        let meta = Meta::new(CollKind::SendRecv, DType::Bytes).count(data.len() as u64);
        // The part from src is taken to be as large as this rank's (ring
        // steps move alike parts): its data's receive is then posted with
        // the header's.
        let early = DataRecv::for_len(data.len());
        let send = send_framed(comm.as_ref(), site, dst, tag, meta, &[], data);
        none_refused([&send])?;
        let got = recv_framed(comm.as_ref(), site, src, tag, early).await?;
        send.await?;
        Ok(got.data)
    })
}

/// Sends `data` to `dst` and returns what `src` sent this rank.
pub async fn sendrecv(
    ctx: &Context,
    dst: Rank,
    data: Buffer,
    src: Rank,
) -> Result<Buffer, CollError> {
    let bytes = data.len();
    streaming(ctx, bytes, |cb| start_sendrecv(ctx, dst, data, src, cb)).await
}
