//! Graphs whose nodes run collectives at once, and graphs that run at
//! once: run by the graph tests over local and tcp ranks, and by the mpi
//! suite's worker under mpirun.

use std::time::Duration;

use braid_core::{Context, Graph, NodeError};

const NODES: u64 = 3;
const CALLS: u64 = 6;

/// Rank `r`'s contribution to call `c` of node `j` of graph `g`.
fn value(g: u64, j: u64, c: u64, r: u64) -> u64 {
    ((g * 10 + j) * 1000 + c) * 100 + r
}

/// Graph `gi` of `NODES` nodes, each making `CALLS` AllReduces and checking
/// every sum exactly. Before each call a node waits a moment that depends
/// on the rank, the node and the call, so a different node goes first on
/// each rank and call; one more node, without collectives, ends the graph
/// `tail` ms after it starts (a slow sink on this rank).
fn sums_graph(ctx: &Context, gi: u64, tail: u64) -> Graph {
    let (me, n) = (u64::from(ctx.rank()), u64::from(ctx.nranks()));
    let want = move |j: u64, c: u64| (0..n).map(|r| value(gi, j, c, r) as i64).sum::<i64>();
    let mut g = Graph::new(ctx.clone());
    for j in 0..NODES {
        let ctx = ctx.clone();
        g.add(format!("graph {gi}, sums {j}"), async move {
            for c in 0..CALLS {
                let delay = (me + j + c) % NODES;
                tokio::time::sleep(Duration::from_millis(3 * delay)).await;
                let got = braid_coll::allreduce(
                    &ctx,
                    vec![value(gi, j, c, me) as i64; 4],
                    braid_coll::ReduceKind::Sum,
                )
                .await
                .map_err(NodeError::other)?;
                if got != vec![want(j, c); 4] {
                    return Err(NodeError::other(format!(
                        "rank {me}, graph {gi}, node {j}, call {c}: sums {got:?}, want {}",
                        want(j, c)
                    )));
                }
            }
            Ok(())
        });
    }
    g.add(format!("graph {gi}, tail"), async move {
        tokio::time::sleep(Duration::from_millis(tail)).await;
        Ok(())
    });
    g
}

/// The ranks' next collective after the graphs: ids drawn after them
/// agree across ranks too.
async fn sum_after(ctx: &Context) -> Result<(), String> {
    let (me, n) = (i64::from(ctx.rank()), i64::from(ctx.nranks()));
    let after = braid_coll::allreduce(ctx, vec![me], braid_coll::ReduceKind::Sum)
        .await
        .map_err(|e| format!("rank {me}: after the graphs: {e}"))?;
    if after != vec![(0..n).sum::<i64>()] {
        return Err(format!("rank {me}: after the graphs, sum {after:?}"));
    }
    Ok(())
}

/// Nodes of one graph run at once, in an order that differs between
/// ranks; each still meets its own collectives on every rank. Before each
/// node drew OpIds of its own class, the nodes' collectives were paired
/// by call order across ranks: node 0's sum on one rank met node 1's on
/// the next (wrong sums, or a mismatch error where the calls differed).
pub async fn concurrent_collective_nodes(ctx: Context) -> Result<(), String> {
    sums_graph(&ctx, 0, 0)
        .run()
        .await
        .map_err(|e| e.to_string())?;
    sum_after(&ctx).await
}

/// Two graphs started together on every rank (in the same order) that
/// end in a different order on even and odd ranks: each graph's nodes
/// meet their own peers, and the collective after both still meets.
/// (A first form of the node classes set the context's counter from
/// whichever graph ended last, so the ranks' next ids differed and that
/// collective hung.)
pub async fn concurrent_graphs(ctx: Context) -> Result<(), String> {
    // Graph 1 ends last on odd ranks, graph 2 on even ones.
    let odd = u64::from(ctx.rank() % 2);
    let (a, b) = (
        sums_graph(&ctx, 1, 200 * odd),
        sums_graph(&ctx, 2, 200 * (1 - odd)),
    );
    let (ra, rb) = tokio::join!(a.run(), b.run());
    ra.map_err(|e| e.to_string())?;
    rb.map_err(|e| e.to_string())?;
    sum_after(&ctx).await
}
