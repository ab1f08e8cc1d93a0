//! Graph runner tests: a failing producer, a failing consumer, a panicking
//! node and an early-closing consumer each end the graph on every rank, with
//! the error reported (node and rank named) and no hang; a healthy graph
//! delivers every message in order. Every rank count, local and tcp.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail by panicking

use braid_tests::runtime;
use std::sync::Arc;
use std::time::Duration;

use braid_core::comm::tcp::TcpComm;
use braid_core::world::{context_for, contexts};
use braid_core::{
    Buffer, CommError, Communicator, Context, FailedAt, Graph, GraphError, MemoryLimits, Message,
    NodeError, OpId, PackedData, Tag, WorldSpec, channel,
};
use braid_tests::RANK_COUNTS;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    Healthy,
    FailingProducer,
    FailingConsumer,
    PanickingNode,
    EarlyClosingConsumer,
}

const MSGS: u64 = 100;

fn msg(seq: u64) -> Message {
    Message::new(
        seq,
        PackedData {
            metadata: bytes::Bytes::new(),
            data: Buffer::from_vec(seq.to_le_bytes().to_vec()),
        },
    )
}

async fn rank_graph(ctx: Context, sc: Scenario, failing: u32) -> Result<u64, GraphError> {
    let rank = ctx.rank();
    let n = ctx.nranks();
    let me_fails = rank == failing && sc != Scenario::Healthy;
    let (mut tx, mut rx) = channel(2);
    let total = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut g = Graph::new(ctx.clone());
    g.add("source", async move {
        for s in 0..MSGS {
            if me_fails && sc == Scenario::FailingProducer && s == 10 {
                return Err(NodeError::other("producer failed at message 10"));
            }
            tx.send(msg(s)).await?;
        }
        Ok(())
    });
    let t2 = total.clone();
    g.add("sink", async move {
        let mut expect = 0;
        while let Some(m) = rx.recv().await {
            if m.seq != expect {
                return Err(NodeError::other(format!(
                    "seq {} where {expect} was due",
                    m.seq
                )));
            }
            expect += 1;
            t2.fetch_add(m.seq, std::sync::atomic::Ordering::Relaxed);
            if me_fails {
                match sc {
                    Scenario::FailingConsumer if m.seq == 5 => {
                        return Err(NodeError::other("consumer failed at message 5"));
                    }
                    Scenario::PanickingNode if m.seq == 5 => panic!("sink panicked at message 5"),
                    Scenario::EarlyClosingConsumer if m.seq == 3 => return Ok(()),
                    _ => {}
                }
            }
        }
        Ok(())
    });
    let comm = ctx.comm().clone();
    g.add("peer", async move {
        // A ring exchange: on a healthy run every rank hears from its
        // left neighbour; otherwise this waits until the failure arrives.
        let tag = Tag::new(OpId(3), 0);
        if sc == Scenario::Healthy {
            comm.send((rank + 1) % n, tag, Buffer::from_vec(vec![rank as u8]))
                .await?;
        }
        let b = comm.recv((rank + n - 1) % n, tag).await?;
        if b.as_slice() != [((rank + n - 1) % n) as u8] {
            return Err(NodeError::other("wrong ring payload"));
        }
        Ok(())
    });
    let res = g.run().await;
    // Leave the job the way a rank should: after every rank is done (or,
    // on failure, once this rank's notices have left).
    let down = ctx.comm().shutdown().await;
    res?;
    if sc == Scenario::Healthy {
        if let Err(e) = down {
            panic!("rank {rank}: shutdown failed: {e}");
        }
    }
    Ok(total.load(std::sync::atomic::Ordering::Relaxed))
}

fn check(results: Vec<Result<u64, GraphError>>, sc: Scenario, failing: u32) {
    for (r, res) in results.into_iter().enumerate() {
        let r = r as u32;
        match (sc, res) {
            (Scenario::Healthy, Ok(sum)) => assert_eq!(sum, MSGS * (MSGS - 1) / 2),
            (Scenario::Healthy, Err(e)) => panic!("healthy graph failed: {e}"),
            (_, Ok(_)) => panic!("{sc:?}: rank {r} finished without error"),
            (_, Err(e)) => {
                assert_eq!(e.rank, r);
                if r == failing {
                    let text = e.to_string();
                    match sc {
                        Scenario::FailingProducer => {
                            assert_eq!(e.node(), Some("source"));
                            assert!(text.contains("producer failed"), "{text}");
                        }
                        Scenario::FailingConsumer => {
                            assert_eq!(e.node(), Some("sink"));
                            assert!(text.contains("consumer failed"), "{text}");
                        }
                        Scenario::PanickingNode => {
                            assert_eq!(e.node(), Some("sink"));
                            assert!(
                                matches!(e.source, NodeError::Panic(ref m) if m.contains("sink panicked")),
                                "{text}"
                            );
                        }
                        Scenario::EarlyClosingConsumer => {
                            assert_eq!(e.node(), Some("source"));
                            assert!(
                                matches!(
                                    e.source,
                                    NodeError::Channel(braid_core::ChannelError::Closed)
                                ),
                                "{text}"
                            );
                        }
                        Scenario::Healthy => unreachable!(),
                    }
                } else {
                    assert_eq!(e.node(), Some("peer"), "rank {r}: {e}");
                    match e.source {
                        NodeError::Comm(CommError::Aborted {
                            peer, ref reason, ..
                        }) => {
                            assert_eq!(peer, failing, "{sc:?} n={} rank {r}: {reason}", failing + 1)
                        }
                        other => {
                            panic!("rank {r}: expected an abort by rank {failing}, got {other}")
                        }
                    }
                }
            }
        }
    }
}

const SCENARIOS: [Scenario; 5] = [
    Scenario::Healthy,
    Scenario::FailingProducer,
    Scenario::FailingConsumer,
    Scenario::PanickingNode,
    Scenario::EarlyClosingConsumer,
];

async fn run_all(ctxs: Vec<Context>, sc: Scenario) -> Vec<Result<u64, GraphError>> {
    let failing = ctxs.len() as u32 - 1;
    let hs: Vec<_> = ctxs
        .into_iter()
        .map(|c| tokio::spawn(rank_graph(c, sc, failing)))
        .collect();
    let mut out = Vec::new();
    for h in hs {
        let r = tokio::time::timeout(Duration::from_secs(30), h)
            .await
            .unwrap_or_else(|_| panic!("{sc:?}: a rank's graph hung"))
            .expect("graph task");
        out.push(r);
    }
    out
}

#[test]
fn graph_failures_local() {
    let rt = runtime();
    for n in RANK_COUNTS {
        for sc in SCENARIOS {
            rt.block_on(async {
                let ctxs = contexts(&WorldSpec::Local { nranks: n }, MemoryLimits::UNLIMITED)
                    .await
                    .expect("contexts");
                check(run_all(ctxs, sc).await, sc, n - 1);
            });
        }
    }
}

#[test]
fn graph_failures_tcp() {
    let rt = runtime();
    for n in RANK_COUNTS {
        for sc in SCENARIOS {
            rt.block_on(async {
                let comms = TcpComm::in_process_world(n).await.expect("world");
                let ctxs = comms
                    .into_iter()
                    .map(|c| {
                        context_for(
                            Arc::new(c) as Arc<dyn Communicator>,
                            MemoryLimits::UNLIMITED,
                        )
                    })
                    .collect();
                check(run_all(ctxs, sc).await, sc, n - 1);
            });
        }
    }
}

/// A rank whose job panics outside any graph node (in the job's own code)
/// fails the in-process world with the panic's message, on every rank
/// count, while the other ranks wait for it in a collective: they are told
/// (abort) instead of waiting forever.
#[test]
fn a_panicking_rank_job_fails_the_local_world() {
    // The panic in the job's future, or in the closure that builds it.
    for (n, early) in RANK_COUNTS
        .into_iter()
        .flat_map(|n| [(n, false), (n, true)])
    {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = braid_core::run_world(
                &WorldSpec::Local { nranks: n },
                MemoryLimits::UNLIMITED,
                move |ctx: Context| {
                    let me = ctx.rank();
                    assert!(!early || me != n - 1, "job refuses rank {me}");
                    async move {
                        assert!(me != n - 1, "job refuses rank {me}");
                        braid_coll::barrier(&ctx).await?;
                        Ok(())
                    }
                },
            );
            let _ = tx.send(r.map(|v| v.len()).map_err(|e| e.to_string()));
        });
        let r = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("{n} ranks (early {early}): the world hung"));
        let e = r.expect_err("a rank panicked");
        assert!(
            e.contains("panicked") && e.contains(&format!("job refuses rank {}", n - 1)),
            "{n} ranks (early {early}): {e}"
        );
    }
}

/// Hooks registered with `Context::on_job_end` run once on every rank,
/// after the job: with `Finished` when every rank succeeded, with `Failed`
/// on every rank when one failed (a device communicator is destroyed in
/// the first case and aborted in the second).
#[test]
fn job_end_hooks_run_once_with_the_outcome() {
    use braid_core::JobEnd;
    use std::sync::Mutex;
    for n in RANK_COUNTS {
        for failing in [None, Some(0), Some(n - 1)] {
            let seen = Arc::new(Mutex::new(Vec::new()));
            let s = seen.clone();
            let res = braid_core::run_world(
                &WorldSpec::Local { nranks: n },
                MemoryLimits::UNLIMITED,
                move |ctx| {
                    let s = s.clone();
                    async move {
                        let r = ctx.rank();
                        ctx.on_job_end(move |end| s.lock().unwrap().push((r, end)));
                        if failing == Some(r) {
                            return Err("deliberate failure".into());
                        }
                        Ok(())
                    }
                },
            );
            assert_eq!(res.is_err(), failing.is_some(), "{n} ranks, {failing:?}");
            let mut got = seen.lock().unwrap().clone();
            got.sort_by_key(|&(r, _)| r);
            let end = if failing.is_some() {
                JobEnd::Failed
            } else {
                JobEnd::Finished
            };
            let want: Vec<(u32, JobEnd)> = (0..n).map(|r| (r, end)).collect();
            assert_eq!(got, want, "{n} ranks, failing rank {failing:?}");
        }
    }
}

/// An in-process job reports the failure of a rank's own, though the
/// ranks that only heard of it (the job's abort) report first: the failing
/// rank's end-of-job hook holds it back. Before, the first report won, and
/// the error named a bystander and "job aborted by rank k".
#[test]
fn the_failure_reported_is_the_failing_ranks_own() {
    for n in RANK_COUNTS.into_iter().filter(|n| *n >= 2) {
        for failing in [0, n - 1] {
            let res = braid_core::run_world(
                &WorldSpec::Local { nranks: n },
                MemoryLimits::UNLIMITED,
                move |ctx| async move {
                    if ctx.rank() == failing {
                        ctx.on_job_end(|_| std::thread::sleep(Duration::from_millis(300)));
                        return Err("deliberate failure".into());
                    }
                    ctx.comm().recv(failing, Tag::new(OpId(3), 0)).await?;
                    Ok(())
                },
            );
            let e = res.expect_err("a rank failed");
            assert_eq!(e.rank, failing, "{n} ranks: {e}");
            assert_eq!(e.to_string(), "deliberate failure", "{n} ranks");
            assert_eq!(braid_core::world::caused_by_peer(&e), None);
        }
    }
}

/// `graph_suite::concurrent_collective_nodes` and `concurrent_graphs` on
/// every rank count, local and tcp (the mpi suite runs them under
/// mpirun).
#[test]
fn nodes_that_run_at_once_keep_their_collectives_apart() {
    let rt = runtime();
    for n in RANK_COUNTS {
        for backend in ["local", "tcp"] {
            rt.block_on(async {
                let ctxs = if backend == "local" {
                    contexts(&WorldSpec::Local { nranks: n }, MemoryLimits::UNLIMITED)
                        .await
                        .expect("contexts")
                } else {
                    braid_tests::tcp_contexts(n, MemoryLimits::UNLIMITED).await
                };
                let hs: Vec<_> = ctxs
                    .iter()
                    .cloned()
                    .map(|c| {
                        tokio::spawn(async move {
                            braid_tests::graph_suite::concurrent_collective_nodes(c.clone())
                                .await?;
                            braid_tests::graph_suite::concurrent_graphs(c).await
                        })
                    })
                    .collect();
                for (r, h) in hs.into_iter().enumerate() {
                    let res = tokio::time::timeout(Duration::from_secs(30), h)
                        .await
                        .unwrap_or_else(|_| panic!("{backend}, {n} ranks: rank {r} hung"))
                        .expect("rank task");
                    if let Err(e) = res {
                        panic!("{backend}, {n} ranks: {e}");
                    }
                }
                braid_tests::shutdown_all(&ctxs).await;
            });
        }
    }
}

/// A node whose collective failed because another rank's job failed
/// reports that rank as the cause, through the node's own error type
/// (`DataError`, carried by `NodeError::Other`): its process then exits
/// with `PEER_FAILED_EXIT` and `braid-launch` names the rank that failed
/// on its own. Before, the chain stopped at `NodeError::Other`, the
/// bystanders exited 1 like the failing rank, and the launcher could name
/// a bystander.
#[test]
fn a_collective_failed_by_a_peer_names_the_peer_through_node_errors() {
    for n in RANK_COUNTS.into_iter().filter(|n| *n >= 2) {
        let failing = n - 1;
        let rt = runtime();
        let errs: Vec<GraphError> = rt.block_on(async {
            let ctxs = contexts(&WorldSpec::Local { nranks: n }, MemoryLimits::UNLIMITED)
                .await
                .expect("contexts");
            let hs: Vec<_> = ctxs
                .into_iter()
                .map(|ctx| {
                    tokio::spawn(async move {
                        let mut g = Graph::new(ctx.clone());
                        g.add("sum", async move {
                            if ctx.rank() == failing {
                                return Err(NodeError::other("deliberate failure"));
                            }
                            braid_coll::allreduce(&ctx, vec![1i64], braid_coll::ReduceKind::Sum)
                                .await
                                .map_err(|e| NodeError::from(braid_nodes::DataError::from(e)))?;
                            Ok(())
                        });
                        g.run().await
                    })
                })
                .collect();
            let mut errs = Vec::new();
            for h in hs {
                let r = tokio::time::timeout(Duration::from_secs(30), h)
                    .await
                    .expect("a rank hung")
                    .expect("rank task");
                errs.push(r.expect_err("every rank fails"));
            }
            errs
        });
        for (r, e) in errs.iter().enumerate() {
            let want = (r as u32 != failing).then_some(failing);
            assert_eq!(
                braid_core::world::caused_by_peer(e),
                want,
                "{n} ranks, rank {r}: {e}"
            );
        }
    }
}

/// `n` ranks' contexts: in-process (`"local"`) or over tcp in this process.
async fn world(backend: &str, n: u32) -> Vec<Context> {
    if backend == "local" {
        contexts(&WorldSpec::Local { nranks: n }, MemoryLimits::UNLIMITED)
            .await
            .expect("contexts")
    } else {
        TcpComm::in_process_world(n)
            .await
            .expect("world")
            .into_iter()
            .map(|c| context_for(Arc::new(c), MemoryLimits::UNLIMITED))
            .collect()
    }
}

/// Runs `one` on every rank of `n` (`backend` as in [`world`]); every
/// rank's error, by rank. Panics where a rank returns `Ok` or has not
/// ended `within` (it hung, or ran on after the failure).
async fn every_rank_fails<F, Fut>(
    backend: &str,
    n: u32,
    within: Duration,
    one: F,
) -> Vec<GraphError>
where
    F: Fn(Context) -> Fut,
    Fut: std::future::Future<Output = Result<u64, GraphError>> + Send + 'static,
{
    let hs: Vec<_> = world(backend, n)
        .await
        .into_iter()
        .map(|c| tokio::spawn(one(c)))
        .collect();
    let mut errs = Vec::new();
    for (r, h) in hs.into_iter().enumerate() {
        let res = tokio::time::timeout(within, h)
            .await
            .unwrap_or_else(|_| panic!("{backend}, {n} ranks: rank {r} did not end in {within:?}"))
            .expect("graph task");
        match res {
            Ok(_) => panic!("{backend}, {n} ranks: rank {r} returned Ok"),
            Err(e) => errs.push(e),
        }
    }
    errs
}

/// A rank whose nodes all succeed still fails when another rank's graph
/// failed: its graph ends at a barrier every rank reaches only on
/// success. Here the ranks' nodes share nothing (each a source and a sink
/// of its own), so before the barrier every other rank returned `Ok`; so
/// did, at times, ranks whose shuffle had taken the failed rank's
/// clean-looking end of input (its source's dropped sender) as all of it.
#[test]
fn a_graph_ends_well_only_where_every_ranks_graph_does() {
    async fn one(ctx: Context, failing: u32) -> Result<u64, GraphError> {
        let me = ctx.rank();
        let (mut tx, mut rx) = channel(2);
        let mut g = Graph::new(ctx.clone());
        g.add("source", async move {
            for s in 0..6 {
                if me == failing && s == 3 {
                    return Err(NodeError::other("source broke at message 3"));
                }
                tx.send(msg(s)).await?;
            }
            Ok(())
        });
        g.add("sink", async move {
            while rx.recv().await.is_some() {}
            Ok(())
        });
        let res = g.run().await;
        let _ = ctx.comm().shutdown().await;
        res.map(|()| 0)
    }
    let rt = runtime();
    for n in RANK_COUNTS.into_iter().filter(|n| *n >= 2) {
        for backend in ["local", "tcp"] {
            rt.block_on(async {
                let failing = n / 2;
                let errs =
                    every_rank_fails(backend, n, Duration::from_secs(30), |c| one(c, failing))
                        .await;
                for (r, e) in errs.into_iter().enumerate() {
                    if r as u32 == failing {
                        assert_eq!(e.node(), Some("source"), "{e}");
                    } else {
                        assert!(
                            matches!(e.source, NodeError::Comm(CommError::Aborted { peer, .. }) if peer == failing),
                            "{backend}, {n} ranks, rank {r}: {e}"
                        );
                    }
                }
            });
        }
    }
}

/// A rank whose nodes compute without messages for long after a peer
/// failed stops at once (the graph checks its communicator while its
/// nodes run), not when its nodes are done: before, the failure was seen
/// only at the graph's end, so a rank went on computing and writing for
/// the whole rest of the job.
#[test]
fn a_peer_failure_cancels_nodes_that_send_nothing() {
    /// Longer than the wait below: a rank that is not cancelled runs out
    /// the wait and fails the test.
    const WORK: Duration = Duration::from_secs(60);
    async fn one(ctx: Context, failing: u32) -> Result<u64, GraphError> {
        let me = ctx.rank();
        let mut g = Graph::new(ctx.clone());
        g.add("work", async move {
            if me == failing {
                return Err(NodeError::other("work broke"));
            }
            let end = tokio::time::Instant::now() + WORK;
            while tokio::time::Instant::now() < end {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok(())
        });
        let res = g.run().await;
        let _ = ctx.comm().shutdown().await;
        res.map(|()| 0)
    }
    let rt = runtime();
    for n in RANK_COUNTS.into_iter().filter(|n| *n >= 2) {
        for backend in ["local", "tcp"] {
            rt.block_on(async {
                let failing = n - 1;
                // (Not ended within 20 s: ran on after the failure.)
                let errs =
                    every_rank_fails(backend, n, Duration::from_secs(20), |c| one(c, failing))
                        .await;
                for (r, e) in errs.into_iter().enumerate() {
                    if r as u32 == failing {
                        assert_eq!(e.node(), Some("work"), "{e}");
                    } else {
                        assert!(
                            matches!(e.source, NodeError::Comm(CommError::Aborted { peer, .. }) if peer == failing),
                            "{backend}, {n} ranks, rank {r}: {e}"
                        );
                        let text = e.to_string();
                        assert!(text.contains("work broke"), "{text}");
                        // (The runner saw it: the node touched no channel
                        // or collective; each rank is named once.)
                        assert_eq!(e.at, FailedAt::PeerWhileRunning, "{text}");
                        assert!(text.starts_with(&format!("rank {r}: ")), "{text}");
                        assert_eq!(text.matches(&format!("rank {r}: ")).count(), 1, "{text}");
                        assert_eq!(
                            text.matches(&format!("rank {failing}: ")).count(),
                            1,
                            "{text}"
                        );
                        assert!(text.contains("node \"work\" failed"), "{text}");
                    }
                }
            });
        }
    }
}

/// A failed rank tells the others without waiting for a node that cannot
/// be cancelled (one in synchronous work or a blocking wait): before, the
/// abort went out only once every node had ended, so the other ranks
/// waited for it all that time, and for ever where that node itself waited
/// on them.
#[test]
fn a_failure_is_told_while_a_node_still_works() {
    /// Longer than the others' wait below.
    const BUSY: Duration = Duration::from_secs(10);
    async fn one(ctx: Context, failing: u32) -> Result<u64, GraphError> {
        let me = ctx.rank();
        let mut g = Graph::new(ctx.clone());
        if me == failing {
            g.add("broken", async { Err(NodeError::other("broken at once")) });
            g.add("busy", async {
                // Synchronous work a cancel cannot stop.
                tokio::task::block_in_place(|| std::thread::sleep(BUSY));
                Ok(())
            });
        } else {
            let comm = ctx.comm().clone();
            g.add("waiting", async move {
                comm.recv(failing, Tag::new(OpId(1 << 30), 0)).await?;
                Ok(())
            });
        }
        let res = g.run().await;
        let _ = ctx.comm().shutdown().await;
        res.map(|()| 0)
    }
    let rt = runtime();
    for n in [2u32, 3] {
        for backend in ["local", "tcp"] {
            rt.block_on(async {
                let failing = 0;
                let hs: Vec<_> = world(backend, n)
                    .await
                    .into_iter()
                    .map(|c| tokio::spawn(one(c, failing)))
                    .collect();
                let mut hs = hs.into_iter();
                let first = hs.next().expect("rank 0");
                for (r, h) in hs.enumerate() {
                    let r = r + 1;
                    let res = tokio::time::timeout(Duration::from_secs(6), h)
                        .await
                        .unwrap_or_else(|_| {
                            panic!("{backend}, {n} ranks: rank {r} was not told in 6 s")
                        })
                        .expect("graph task");
                    let e = res.expect_err("a rank ended well");
                    assert!(e.to_string().contains("broken at once"), "{backend}: {e}");
                }
                let e = tokio::time::timeout(BUSY * 2, first)
                    .await
                    .expect("the failing rank ended")
                    .expect("graph task")
                    .expect_err("the failing rank ended well");
                assert_eq!(e.node(), Some("broken"), "{e}");
            });
        }
    }
}

/// Two graphs of one rank at once: where one fails, the other's nodes are
/// cancelled (the rank's communicator has failed) and its error says the
/// failure was this rank's own, not a peer's.
#[test]
fn a_graph_cancelled_by_its_own_ranks_failure_says_so() {
    async fn busy(ctx: Context) -> Result<(), GraphError> {
        let mut g = Graph::new(ctx);
        g.add("busy", async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Ok(())
        });
        g.run().await
    }
    async fn failing(ctx: Context) -> Result<(), GraphError> {
        let mut g = Graph::new(ctx);
        g.add("broken", async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Err(NodeError::other("broken"))
        });
        g.run().await
    }
    let rt = runtime();
    rt.block_on(async {
        for backend in ["local", "tcp"] {
            let ctxs = world(backend, 2).await;
            let c0 = ctxs[0].clone();
            let (a, b) = tokio::time::timeout(
                Duration::from_secs(20),
                futures::future::join(busy(c0.clone()), failing(c0)),
            )
            .await
            .expect("the busy graph was not cancelled");
            assert_eq!(b.expect_err("failing graph").node(), Some("broken"));
            let a = a.expect_err("the busy graph ended well");
            assert_eq!(a.at, FailedAt::ElsewhereOnRank, "{backend}: {a}");
        }
    });
}
