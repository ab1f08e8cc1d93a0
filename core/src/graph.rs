//! The graph runner: runs a rank's nodes as tasks and ends them together.
//!
//! A node is an async function of its context and channels. `Graph::run`
//! spawns every node, returns the first error (with the node's name and the
//! rank), cancels the other nodes, and aborts the communicator so that every
//! other rank's graph ends too instead of waiting on this one. Closing a
//! channel ends the nodes downstream of it, so a graph never hangs on a node
//! that stopped.

use std::future::Future;

use futures::future::BoxFuture;
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::Rank;
use crate::channel::ChannelError;
use crate::context::Context;
use crate::error::{CommError, MemoryError, without_rank};
use crate::event::spawned_task;

/// A boxed error from user code.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a node failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// A channel failed (a consumer left early, seq out of order).
    #[error(transparent)]
    Channel(#[from] ChannelError),
    /// A communicator operation failed.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// Memory could not be had.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// The node panicked.
    #[error("panicked: {0}")]
    Panic(String),
    /// Any other failure. The error is also its source, so a
    /// [`CommError`] inside it (a collective's, carried by a node's own
    /// error type) stays visible to [`crate::world::caused_by_peer`].
    #[error("{0}")]
    Other(#[source] BoxError),
}

impl NodeError {
    /// Wraps any error.
    pub fn other(e: impl Into<BoxError>) -> Self {
        NodeError::Other(e.into())
    }
}

/// Where on a rank a graph's failure was seen: in a node, or in the
/// runner around the nodes (a failure no node had reported yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailedAt {
    /// In the node of this name.
    Node(String),
    /// In the runner: the communicator saw a peer fail while this rank's
    /// nodes computed, and none of them had met it within the grace time.
    PeerWhileRunning,
    /// In the runner: another graph or task of this rank failed while
    /// these nodes ran.
    ElsewhereOnRank,
    /// At the graph's end, where every node of this rank had succeeded and
    /// the ranks check that all of theirs did too.
    End,
}

impl std::fmt::Display for FailedAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FailedAt::Node(n) => write!(f, "node {n:?} failed"),
            FailedAt::PeerWhileRunning => f.write_str("a peer failed while this rank's nodes ran"),
            FailedAt::ElsewhereOnRank => {
                f.write_str("this rank failed elsewhere while these nodes ran")
            }
            FailedAt::End => f.write_str("the graph's end, after this rank's nodes succeeded"),
        }
    }
}

/// A graph's failure on one rank, naming the rank and where it was seen.
#[derive(Debug, thiserror::Error)]
#[error("rank {rank}: {at}: {}", without_rank(*.rank, &.source.to_string()))]
pub struct GraphError {
    /// The rank the node ran on.
    pub rank: Rank,
    /// The node that failed, or the runner's stage.
    pub at: FailedAt,
    /// What went wrong.
    #[source]
    pub source: NodeError,
}

impl GraphError {
    /// The failed node's name; `None` where the runner saw the failure.
    pub fn node(&self) -> Option<&str> {
        match &self.at {
            FailedAt::Node(n) => Some(n),
            _ => None,
        }
    }
}

/// The nodes of one rank's graph.
pub struct Graph {
    ctx: Context,
    nodes: Vec<(String, BoxFuture<'static, Result<(), NodeError>>)>,
}

impl Graph {
    /// An empty graph on `ctx`'s rank.
    pub fn new(ctx: Context) -> Self {
        Graph {
            ctx,
            nodes: Vec::new(),
        }
    }

    /// Adds a node called `name`.
    pub fn add<F>(&mut self, name: impl Into<String>, node: F) -> &mut Self
    where
        F: Future<Output = Result<(), NodeError>> + Send + 'static,
    {
        self.nodes.push((name.into(), Box::pin(node)));
        self
    }

    /// Runs every node to completion. On the first failure the other nodes
    /// are cancelled, the job is aborted on every rank, and the failure is
    /// returned. A rank whose nodes all succeed returns once every rank's
    /// have (a barrier of empty messages on the graph's own OpId): a node
    /// that fails drops its senders, and the nodes downstream of it, on
    /// its rank, see a clean end of their input and may finish their part
    /// (a shuffle sends its finish) before the abort goes out, so another
    /// rank's nodes could all end well on partial data; the barrier makes
    /// that rank fail with the abort instead of returning `Ok`.
    ///
    /// Each node draws its collectives' OpIds from a class of its own (its
    /// position in the graph; [`OpIdAllocator`](crate::tag::OpIdAllocator)
    /// explains the classes): nodes run at once, in an order that differs
    /// between ranks, and one shared counter would give one node's
    /// collective on one rank the id of another node's on the next. The
    /// classes share a block of ids the graph takes when it starts, in the
    /// context's order (so graphs must start in the same order on every
    /// rank, as collectives do); tasks that are not nodes (tasks a node
    /// spawns among them) draw from the context's own sequence, past the
    /// block.
    pub async fn run(self) -> Result<(), GraphError> {
        let k = self.nodes.len();
        let classes = self
            .ctx
            .op_source()
            .fork(u32::try_from(k + 1).unwrap_or(u32::MAX));
        // The class past the nodes' gives the barrier at the end its id.
        let end = classes.get(k).map(|c| c.next());
        let ctx = self.ctx.clone();
        self.run_nodes(classes).await?;
        match end {
            Some(op) => all_ended_well(&ctx, op).await.map_err(|e| GraphError {
                rank: ctx.rank(),
                at: FailedAt::End,
                source: NodeError::Comm(e),
            }),
            None => Ok(()),
        }
    }

    async fn run_nodes(
        self,
        classes: Vec<std::sync::Arc<crate::tag::OpIdAllocator>>,
    ) -> Result<(), GraphError> {
        let rank = self.ctx.rank();
        let mut set = JoinSet::new();
        let mut names = std::collections::HashMap::new();
        for (i, (name, fut)) in self.nodes.into_iter().enumerate() {
            let span = tracing::info_span!("node", rank, name = %name);
            let h = match classes.get(i) {
                Some(ops) => set.spawn(spawned_task(
                    self.ctx.with_op_source(ops.clone(), fut).instrument(span),
                )),
                None => set.spawn(spawned_task(fut.instrument(span))),
            };
            names.insert(h.id(), name);
        }
        // On the first failure the rest are cancelled and drained. Of the
        // failures seen by then, the most likely root cause is reported: a
        // consumer that fails makes its producer see a closed channel an
        // instant later, and either may be joined first.
        let mut failures: Vec<(u8, GraphError)> = Vec::new();
        // A peer's death or abort is seen by the communicator when it
        // happens, but by the nodes only at their next message: a node
        // that computes or writes for long after its last collective would
        // go on for nothing. Checked every `FAILURE_CHECK`, a failure that
        // no node has reported within `FAILURE_GRACE` cancels them (a node
        // that waits on a message reports it at once, under its own name).
        let mut check = tokio::time::interval(FAILURE_CHECK);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failure_seen: Option<tokio::time::Instant> = None;
        // When the other ranks are told of this rank's failure: once the
        // cancelled nodes have ended, or `DRAIN_GRACE` after the first
        // failure where one has not (a node in synchronous work or a
        // blocking wait ends only when that does, and a peer it waits for
        // may in turn wait for this rank: a hang, were the abort held
        // until every node had ended).
        let mut tell_at: Option<tokio::time::Instant> = None;
        let best = |failures: &[(u8, GraphError)]| {
            failures
                .iter()
                .enumerate()
                .min_by_key(|(i, (p, _))| (*p, *i))
                .map(|(i, _)| i)
        };
        loop {
            let res = tokio::select! {
                res = set.join_next_with_id() => match res {
                    Some(res) => res,
                    None => break,
                },
                _ = tokio::time::sleep_until(tell_at.unwrap_or_else(tokio::time::Instant::now)),
                    if tell_at.is_some() =>
                {
                    // (Once: later failures are no first one, and set no
                    // time again.)
                    tell_at = None;
                    if let Some(pos) = best(&failures) {
                        let e = &failures[pos].1;
                        tracing::debug!("{e} (nodes still ending)");
                        self.ctx.comm().abort(&e.to_string());
                    }
                    continue;
                }
                _ = check.tick(), if failures.is_empty() => {
                    if let Some(e) = self.ctx.comm().failure() {
                        let seen = *failure_seen.get_or_insert_with(tokio::time::Instant::now);
                        if seen.elapsed() < FAILURE_GRACE {
                            continue;
                        }
                        set.abort_all();
                        tell_at = Some(tokio::time::Instant::now() + DRAIN_GRACE);
                        // (This rank's own abort: another graph or task
                        // of this rank failed, not a peer.)
                        let at = match &e {
                            CommError::Aborted { peer, .. } if *peer == rank => {
                                FailedAt::ElsewhereOnRank
                            }
                            _ => FailedAt::PeerWhileRunning,
                        };
                        failures.push((
                            NodeError::Comm(e.clone()).consequence_rank(),
                            GraphError {
                                rank,
                                at,
                                source: NodeError::Comm(e),
                            },
                        ));
                    }
                    continue;
                }
            };
            let (id, err) = match res {
                Ok((_, Ok(()))) => continue,
                Ok((id, Err(e))) => (id, e),
                Err(je) if je.is_cancelled() => continue,
                Err(je) => {
                    let id = je.id();
                    let msg = match je.try_into_panic() {
                        Ok(p) => panic_message(p),
                        Err(e) => e.to_string(),
                    };
                    (id, NodeError::Panic(msg))
                }
            };
            if failures.is_empty() {
                set.abort_all();
                tell_at = Some(tokio::time::Instant::now() + DRAIN_GRACE);
            }
            let node = names.get(&id).cloned().unwrap_or_default();
            failures.push((
                err.consequence_rank(),
                GraphError {
                    rank,
                    at: FailedAt::Node(node),
                    source: err,
                },
            ));
        }
        let Some(pos) = best(&failures) else {
            return Ok(());
        };
        let e = failures.swap_remove(pos).1;
        tracing::debug!("{e}");
        // Ranks blocked on this one must not wait forever (a no-op where
        // they were told already).
        self.ctx.comm().abort(&e.to_string());
        Err(e)
    }
}

/// How often a running graph checks its communicator for a peer's failure
/// (one lock and a clone of nothing where there is none).
const FAILURE_CHECK: std::time::Duration = std::time::Duration::from_millis(100);

/// How long a failed graph's cancelled nodes have to end before the other
/// ranks are told of the failure all the same: long enough for a node
/// that fails as a consequence (a producer whose consumer failed) to be
/// seen, so that the cause is what the ranks are told.
const DRAIN_GRACE: std::time::Duration = std::time::Duration::from_millis(200);

/// How long a failure the communicator has seen is left to the nodes to
/// report (under their own names) before the graph cancels them.
const FAILURE_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// Returns once every rank has arrived (a dissemination barrier: ceil(log2
/// N) rounds, each an empty message to `me + d` and one from `me - d`, on
/// `op`'s tags); fails with the job's abort where a rank aborts instead.
async fn all_ended_well(ctx: &Context, op: crate::OpId) -> Result<(), CommError> {
    let comm = ctx.comm();
    let (n, me) = (comm.nranks(), comm.rank());
    let (mut dist, mut round) = (1u32, 0u8);
    while dist < n {
        let tag = crate::Tag::new(op, round);
        let send = comm.send((me + dist) % n, tag, crate::Buffer::default());
        let recv = comm.recv((me + n - dist) % n, tag);
        let (sent, got) = futures::join!(send, recv);
        sent?;
        got?;
        dist = dist.saturating_mul(2);
        round = round.wrapping_add(1);
    }
    Ok(())
}

impl NodeError {
    /// 0 for failures that start trouble, higher for those that usually
    /// follow from another failure (a peer's abort, a closed channel).
    fn consequence_rank(&self) -> u8 {
        match self {
            NodeError::Panic(_) | NodeError::Memory(_) => 0,
            NodeError::Other(e) => match crate::world::first_comm_error(e.as_ref()) {
                Some(CommError::Aborted { .. } | CommError::PeerDied { .. }) => 2,
                Some(_) => 1,
                None => 0,
            },
            NodeError::Comm(CommError::Aborted { .. } | CommError::PeerDied { .. }) => 2,
            NodeError::Comm(_) => 1,
            NodeError::Channel(_) => 3,
        }
    }
}

/// The text of a caught panic's payload (a `&str` or `String` message).
pub fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}
