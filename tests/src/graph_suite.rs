//! A graph whose nodes run collectives at once: run by the graph tests
//! over local and tcp ranks, and by the mpi suite's worker under mpirun.

use std::time::Duration;

use braid_core::{Context, Graph, NodeError};

/// Nodes of one graph run at once, in an order that differs between
/// ranks; each still meets its own collectives on every rank. Here every
/// rank's nodes start their AllReduces in a different order (each waits a
/// rank- and node-dependent moment first), and each checks every sum
/// exactly. Before each node drew OpIds of its own class, the nodes'
/// collectives were paired by call order across ranks: node 0's sum on
/// one rank met node 1's on the next (wrong sums, or a mismatch error
/// where the calls differed).
pub async fn concurrent_collective_nodes(ctx: Context) -> Result<(), String> {
    const NODES: u64 = 3;
    const CALLS: u64 = 6;
    let (me, n) = (u64::from(ctx.rank()), u64::from(ctx.nranks()));
    // Rank r's contribution to call c of node j; the sum over ranks.
    fn value(j: u64, c: u64, r: u64) -> u64 {
        (j * 1000 + c) * 100 + r
    }
    let want = move |j: u64, c: u64| (0..n).map(|r| value(j, c, r) as i64).sum::<i64>();
    let mut g = Graph::new(ctx.clone());
    for j in 0..NODES {
        let ctx = ctx.clone();
        g.add(format!("sums {j}"), async move {
            for c in 0..CALLS {
                // A different node goes first on each rank and call.
                let delay = (me + j + c) % NODES;
                tokio::time::sleep(Duration::from_millis(3 * delay)).await;
                let got = braid_coll::allreduce(
                    &ctx,
                    vec![value(j, c, me) as i64; 4],
                    braid_coll::ReduceKind::Sum,
                )
                .await
                .map_err(NodeError::other)?;
                if got != vec![want(j, c); 4] {
                    return Err(NodeError::other(format!(
                        "rank {me}, node {j}, call {c}: sums {got:?}, want {}",
                        want(j, c)
                    )));
                }
            }
            Ok(())
        });
    }
    g.run().await.map_err(|e| e.to_string())?;
    // Ids drawn after the graph agree across ranks too.
    let after = braid_coll::allreduce(&ctx, vec![me as i64], braid_coll::ReduceKind::Sum)
        .await
        .map_err(|e| e.to_string())?;
    if after != vec![(0..n as i64).sum::<i64>()] {
        return Err(format!("rank {me}: after the graph, sum {after:?}"));
    }
    Ok(())
}
