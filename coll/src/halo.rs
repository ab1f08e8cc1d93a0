//! HaloExchange: each rank swaps data with its left (rank - 1) and right
//! (rank + 1) neighbours.
//!
//! One-shot: an object is one exchange with a fresh OpId; several rounds
//! are several objects, and how many rounds is up to the caller (an
//! AllReduce of "still need more" decides it at run time). Every rank
//! always sends exactly one message per existing neighbour, an empty one
//! when it has nothing, so a receive is only posted for a message that will
//! come. Left- and right-going messages never share a (src, dst) pair, so
//! one tag carries both. Rank 0 has no left neighbour and rank N-1 no right
//! one: their `from_left` / `from_right` is `None`.
//!
//! Cost: alpha + max(m_left, m_right) * beta, both directions at once.

use braid_core::{Context, OpId, PackedData, Tag};
use braid_kernels::DType;

use crate::error::{CollError, CollKind, Site};
use crate::handle::{Callback, Handle, start, streaming};
use crate::wire::{DataRecv, Meta, none_refused, recv_framed, send_framed};

/// What a rank got from its neighbours.
#[derive(Debug, Clone, Default)]
pub struct Halo {
    /// From rank - 1 (its `send_right`); `None` on rank 0.
    pub from_left: Option<PackedData>,
    /// From rank + 1 (its `send_left`); `None` on rank N-1.
    pub from_right: Option<PackedData>,
}

/// One halo exchange.
#[derive(Debug)]
pub struct HaloExchange {
    ctx: Context,
    op: OpId,
    /// Whether `start` ran: one dropped before aborts the job (see `Drop`).
    started: bool,
}

impl HaloExchange {
    /// A new exchange; every rank must create its objects in the same
    /// order, and start each (one dropped unstarted aborts the job: its
    /// neighbours would wait for its halo for ever).
    pub fn new(ctx: &Context) -> Self {
        HaloExchange {
            ctx: ctx.clone(),
            op: ctx.next_op_id(),
            started: false,
        }
    }

    /// Starts the exchange. What a rank without a neighbour on one side
    /// passes for that side is dropped.
    pub fn start(
        mut self,
        send_left: PackedData,
        send_right: PackedData,
        callback: Option<Callback>,
    ) -> Handle<Halo> {
        self.started = true;
        let op = self.op;
        let site = Site {
            rank: self.ctx.rank(),
            coll: CollKind::HaloExchange,
            op,
        };
        let comm = self.ctx.comm().clone();
        start(
            &self.ctx,
            CollKind::HaloExchange,
            op,
            callback,
            async move {
                let n = comm.nranks();
                let me = site.rank;
                let tag = Tag::new(op, 0);
                let meta = Meta::new(CollKind::HaloExchange, DType::Bytes);
                let mut sends = Vec::new();
                if me > 0 {
                    sends.push(send_framed(
                        comm.as_ref(),
                        site,
                        me - 1,
                        tag,
                        meta,
                        &send_left.metadata,
                        send_left.data,
                    ));
                }
                if me + 1 < n {
                    sends.push(send_framed(
                        comm.as_ref(),
                        site,
                        me + 1,
                        tag,
                        meta,
                        &send_right.metadata,
                        send_right.data,
                    ));
                }
                none_refused(&sends)?;
                let left = async {
                    if me > 0 {
                        let f = recv_framed(comm.as_ref(), site, me - 1, tag, DataRecv::AfterHead)
                            .await?;
                        Ok::<_, CollError>(Some(PackedData {
                            metadata: f.user_meta,
                            data: f.data,
                        }))
                    } else {
                        Ok(None)
                    }
                };
                let right = async {
                    if me + 1 < n {
                        let f = recv_framed(comm.as_ref(), site, me + 1, tag, DataRecv::AfterHead)
                            .await?;
                        Ok::<_, CollError>(Some(PackedData {
                            metadata: f.user_meta,
                            data: f.data,
                        }))
                    } else {
                        Ok(None)
                    }
                };
                let (from_left, from_right) = futures::try_join!(left, right)?;
                for s in sends {
                    s.await?;
                }
                Ok(Halo {
                    from_left,
                    from_right,
                })
            },
        )
    }

    /// Exchanges with both neighbours.
    pub async fn exchange(
        self,
        send_left: PackedData,
        send_right: PackedData,
    ) -> Result<Halo, CollError> {
        let ctx = self.ctx.clone();
        let bytes = send_left.data.len() + send_right.data.len();
        streaming(&ctx, bytes, |cb| self.start(send_left, send_right, cb)).await
    }
}

/// An exchange dropped unstarted took its OpId on this rank, and its
/// neighbours wait for its messages: the job is aborted, naming it, rather
/// than left to hang.
impl Drop for HaloExchange {
    fn drop(&mut self) {
        if !self.started {
            self.ctx.comm().abort(&format!(
                "rank {}: HaloExchange (OpId {}) dropped without being started: \
                 its neighbours would wait for its halo for ever",
                self.ctx.rank(),
                self.op.0
            ));
        }
    }
}
