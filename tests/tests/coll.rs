//! Collectives on every rank count, local and tcp (processes): the suite in
//! `braid_tests::coll_suite` checks each result against a brute-force
//! reference. Also: mismatched calls fail on every rank in bounded time, and
//! a shuffle over the host memory limit spills and stays correct.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail by panicking

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use braid_coll::{
    AllGather, AllToAllvSpec, ExtractOrder, HaloExchange, PartitionOwner, ReduceKind, ReduceOp,
    Shuffle, allgather, allreduce, alltoall, alltoallv, barrier, broadcast, sendrecv,
};
use braid_core::launch::{LaunchSpec, OutputMode, launch};
use braid_core::world::contexts;
use braid_core::{Buffer, Context, MemoryLimits, PackedData, WorldSpec};
use braid_tests::{RANK_COUNTS, coll_suite, runtime};
use bytes::Bytes;

async fn local_ctxs(n: u32, limits: MemoryLimits) -> Vec<Context> {
    contexts(&WorldSpec::Local { nranks: n }, limits)
        .await
        .unwrap()
}

async fn tcp_ctxs(n: u32, limits: MemoryLimits) -> Vec<Context> {
    braid_tests::tcp_contexts(n, limits).await
}

/// Runs `f` on every rank, each with a deadline; returns the results.
async fn on_all<T, F, Fut>(ctxs: Vec<Context>, f: F) -> Vec<Result<T, String>>
where
    F: Fn(Context) -> Fut,
    Fut: Future<Output = Result<T, String>> + Send + 'static,
    T: Send + 'static,
{
    let hs: Vec<_> = ctxs
        .into_iter()
        .map(|c| {
            let fut = f(c.clone());
            tokio::spawn(async move {
                let r = fut.await;
                // A rank that fails tells the others, as a job's rank does;
                // without it they would wait for it in their next
                // collective (and the harness would report a hang).
                if let Err(msg) = &r {
                    c.comm().abort(msg);
                }
                // Leave as a rank should: after all are done (or, failing,
                // once this rank's notices have left).
                let down = c.comm().shutdown().await;
                match (r, down) {
                    (Ok(v), Ok(())) => Ok(v),
                    (Ok(_), Err(e)) => Err(e.to_string()),
                    (Err(e), _) => Err(e),
                }
            })
        })
        .collect();
    let mut out = Vec::new();
    for h in hs {
        let r = tokio::time::timeout(Duration::from_secs(60), h)
            .await
            .expect("a rank hung")
            .expect("rank task");
        out.push(r);
    }
    out
}

#[test]
fn suite_local() {
    let rt = runtime();
    for n in RANK_COUNTS {
        rt.block_on(async {
            let res = on_all(local_ctxs(n, MemoryLimits::UNLIMITED).await, |c| {
                coll_suite::run(c, 40 + n as u64)
            })
            .await;
            for (r, x) in res.into_iter().enumerate() {
                let line = x.unwrap_or_else(|e| panic!("{n} ranks, rank {r}: {e}"));
                assert!(line.starts_with("coll ok"), "{line}");
            }
        });
    }
}

/// The suite in jobs as `run_world` starts them: in-process ranks that fit
/// the host's cores each on a runtime of their own, whose waiters poll for
/// bulk work too (`RankThreads::Own`; here 1 and 2 ranks on CI's 2 cores),
/// more ranks sharing one runtime.
#[test]
fn suite_in_jobs() {
    for n in RANK_COUNTS {
        let lines = local_job(n, 120, move |c| async move {
            Ok(coll_suite::run(c, 70 + n as u64).await?)
        });
        assert_eq!(lines.len(), n as usize);
        for (r, (rank, line)) in lines.into_iter().enumerate() {
            assert_eq!(rank, r as u32);
            assert!(line.starts_with("coll ok"), "{n} ranks, rank {r}: {line}");
        }
    }
}

/// Runs `job` as an `n`-rank local job (`run_world`, on a thread of its
/// own) and returns each rank's result; fails the test if the job fails or
/// has not ended within `secs` seconds.
fn local_job<T, F, Fut>(n: u32, secs: u64, job: F) -> Vec<(u32, T)>
where
    T: Send + 'static,
    F: Fn(Context) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, Box<dyn std::error::Error + Send + Sync>>> + Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = braid_core::run_world(
            &WorldSpec::Local { nranks: n },
            MemoryLimits::UNLIMITED,
            job,
        );
        let _ = tx.send(r.map_err(|e| format!("rank {}: {e}", e.rank)));
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("{n} ranks: the job hung"))
        .unwrap_or_else(|e| panic!("{n} ranks: {e}"))
}

/// A rank that gives up (returns an error and aborts, as a job's rank
/// does) ends its peers' pending collective with that error, on every rank
/// count, instead of leaving them waiting for it.
#[test]
fn a_failing_rank_ends_the_others() {
    let rt = runtime();
    for n in RANK_COUNTS {
        rt.block_on(async {
            let res = on_all(
                local_ctxs(n, MemoryLimits::UNLIMITED).await,
                |c| async move {
                    if c.rank() == n - 1 {
                        return Err::<(), String>("rank gives up".into());
                    }
                    allreduce(&c, vec![1i64; 10], ReduceKind::Sum)
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                },
            )
            .await;
            for (r, x) in res.iter().enumerate() {
                let err = x.as_ref().expect_err("no rank can finish");
                assert!(err.contains("rank gives up"), "{n} ranks, rank {r}: {err}");
            }
        });
    }
}

/// A user-supplied reduction operator that panics on one rank fails the
/// collective on every rank (the panicking rank names the panic, the others
/// hear of it through the abort) within the harness's deadline: the panic
/// completes the core's handle instead of leaving its waiter hanging.
#[test]
fn a_panicking_operator_fails_every_rank() {
    let rt = runtime();
    for n in RANK_COUNTS.into_iter().filter(|n| *n >= 2) {
        let case = |c: Context| async move {
            let me = c.rank();
            let op: ReduceOp<i64> =
                ReduceOp::Custom(Arc::new(move |acc: &mut [i64], x: &[i64]| {
                    assert!(me != 0, "operator refuses rank {me}");
                    for (a, b) in acc.iter_mut().zip(x) {
                        *a += *b;
                    }
                }));
            allreduce(&c, vec![1i64; 1000], op)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        rt.block_on(async {
            for (world, res) in [
                (
                    "local",
                    on_all(local_ctxs(n, MemoryLimits::UNLIMITED).await, case).await,
                ),
                (
                    "tcp",
                    on_all(tcp_ctxs(n, MemoryLimits::UNLIMITED).await, case).await,
                ),
            ] {
                for (r, x) in res.iter().enumerate() {
                    let err = x.as_ref().expect_err("no rank can finish");
                    assert!(
                        err.contains("panicked") && err.contains("operator refuses rank 0"),
                        "{world}, {n} ranks, rank {r}: {err}"
                    );
                }
            }
        });
    }
}

/// A user's completion callback that panics neither hangs the caller of
/// `extract` nor goes unnoticed: the collective still completes on every
/// rank and the job is aborted with the panic's message.
#[test]
fn a_panicking_completion_callback_aborts_without_a_hang() {
    let rt = runtime();
    for n in RANK_COUNTS {
        let case = |c: Context| async move {
            let cb: braid_coll::Callback = Box::new(|| panic!("callback refuses"));
            let ag = braid_coll::AllGather::new(&c, Some(cb));
            ag.insert_last(
                0,
                PackedData {
                    metadata: Bytes::new(),
                    data: Buffer::from_vec(vec![c.rank() as u8]),
                },
            )
            .map_err(|e| e.to_string())?;
            // Either outcome of the call is fine; what must hold is that it
            // returns and that the communicator carries the abort.
            let _ = ag.extract(braid_coll::ExtractOrder::RankSeq).await;
            match c.comm().failure() {
                Some(f) => Err(f.to_string()),
                None => Ok(()),
            }
        };
        rt.block_on(async {
            for (world, res) in [
                (
                    "local",
                    on_all(local_ctxs(n, MemoryLimits::UNLIMITED).await, case).await,
                ),
                (
                    "tcp",
                    on_all(tcp_ctxs(n, MemoryLimits::UNLIMITED).await, case).await,
                ),
            ] {
                for (r, x) in res.iter().enumerate() {
                    let err = x.as_ref().expect_err("the job is aborted");
                    assert!(
                        err.contains("completion callback") && err.contains("callback refuses"),
                        "{world}, {n} ranks, rank {r}: {err}"
                    );
                }
            }
        });
    }
}

/// A rank that leaves without a call the others make (a collective it
/// skips, a message it never sends) fails every rank in bounded time, on
/// both backends: once it has finished and all it sent has arrived, a
/// receive from it, or a meeting without it, can never complete.
#[test]
fn a_rank_that_skips_a_call_fails_every_rank() {
    let rt = runtime();
    for n in RANK_COUNTS.into_iter().filter(|n| *n >= 2) {
        for what in ["allreduce", "barrier after allreduce", "recv"] {
            let case = move |c: Context| async move {
                let skipper = c.rank() == n - 1;
                let e = |e: braid_coll::CollError| e.to_string();
                match what {
                    "allreduce" if !skipper => {
                        allreduce(&c, vec![1i64; 16], ReduceKind::Sum)
                            .await
                            .map_err(e)?;
                    }
                    "barrier after allreduce" => {
                        let v = allreduce(&c, vec![1i64; 16], ReduceKind::Sum)
                            .await
                            .map_err(e)?;
                        assert_eq!(v, vec![n as i64; 16]);
                        if !skipper {
                            barrier(&c).await.map_err(e)?;
                        }
                    }
                    "recv" if c.rank() == 0 => {
                        let tag = braid_core::Tag::new(braid_core::OpId(3), 0);
                        c.comm().recv(n - 1, tag).await.map_err(|e| e.to_string())?;
                    }
                    _ => {}
                }
                Ok::<(), String>(())
            };
            rt.block_on(async {
                for (world, res) in [
                    (
                        "local",
                        on_all(local_ctxs(n, MemoryLimits::UNLIMITED).await, case).await,
                    ),
                    (
                        "tcp",
                        on_all(tcp_ctxs(n, MemoryLimits::UNLIMITED).await, case).await,
                    ),
                ] {
                    let errs: Vec<String> = res
                        .into_iter()
                        .enumerate()
                        .map(|(r, x)| {
                            x.expect_err(&format!(
                                "{world}, {n} ranks, {what}: rank {r} cannot finish"
                            ))
                        })
                        .collect();
                    assert!(
                        errs.iter()
                            .any(|e| e.contains(&format!("rank {} finished its job", n - 1))),
                        "{world}, {n} ranks, {what}: {errs:?}"
                    );
                    // In-process ranks that meet without the skipper fail
                    // with its finish as their own error, as a receive from
                    // it does over tcp; no rank's abort is blamed on it.
                    if world == "local" && what != "recv" {
                        for (r, e) in errs.iter().enumerate().filter(|(r, _)| *r as u32 != n - 1) {
                            assert!(
                                e.starts_with(&format!("rank {r}: "))
                                    && e.contains(&format!(
                                        "rank {} finished its job while this rank waits",
                                        n - 1
                                    )),
                                "{world}, {n} ranks, {what}, rank {r}: {e}"
                            );
                        }
                        assert!(
                            errs.iter()
                                .all(|e| !e.contains(&format!("aborted by rank {}", n - 1))),
                            "{world}, {n} ranks, {what}: {errs:?}"
                        );
                    }
                }
            });
        }
    }
}

/// The suite over tcp with a message limit of 5000 bytes
/// (`BRAID_MAX_MESSAGE`): every part larger than that goes as pieces
/// (`wire`'s `PIECES`), the frames that would carry small data inline
/// send it after their header, and each result still equals its
/// reference. MPI's limit is 2 GiB - 1; `mpi.rs` runs the same suite
/// under `BRAID_MPI_MAX_MESSAGE`.
#[test]
fn suite_tcp_in_pieces() {
    let rt = runtime();
    for n in RANK_COUNTS {
        rt.block_on(async {
            let comms = braid_core::comm::tcp::TcpComm::in_process_world_with(n, |c| {
                c.max_message_bytes = 5000
            })
            .await
            .expect("tcp world");
            let ctxs = comms
                .into_iter()
                .map(|c| braid_core::world::context_for(Arc::new(c), MemoryLimits::UNLIMITED))
                .collect();
            let res = on_all(ctxs, |c| coll_suite::run(c, 90 + n as u64)).await;
            for (r, x) in res.into_iter().enumerate() {
                let line = x.unwrap_or_else(|e| panic!("{n} ranks, rank {r}: {e}"));
                assert!(line.starts_with("coll ok"), "{line}");
            }
        });
    }
}

#[test]
fn suite_tcp_processes() {
    let rt = runtime();
    for n in RANK_COUNTS {
        let mut spec = LaunchSpec::new(
            n,
            env!("CARGO_BIN_EXE_braid-test-worker"),
            vec!["coll".into(), (60 + n as u64).to_string().into()],
        );
        spec.output = OutputMode::Captured;
        let report = rt
            .block_on(launch(spec))
            .unwrap_or_else(|e| panic!("{n} ranks: {e:?}"));
        let lines: Vec<&str> = report.stdout.iter().map(|s| s.trim()).collect();
        let first = lines[0];
        assert!(first.starts_with("coll ok"), "rank 0: {first}");
        assert!(
            lines.iter().all(|l| *l == first),
            "ranks disagree on the checks run: {lines:?}"
        );
    }
}

/// Every rank must fail (no rank returns data) within the deadline.
fn all_fail(results: Vec<Result<(), String>>, what: &str, n: u32) {
    for (r, x) in results.into_iter().enumerate() {
        match x {
            Ok(()) => panic!("{what}, {n} ranks: rank {r} returned data from mismatched calls"),
            Err(e) => assert!(
                e.contains("does not match")
                    || e.contains("aborted")
                    || e.contains("invalid argument"),
                "{what}, {n} ranks, rank {r}: unclear error: {e}"
            ),
        }
    }
}

/// Every rank must fail with the mismatch itself (seen in this call, not
/// only through another rank's abort).
fn all_see_mismatch(results: Vec<Result<(), String>>, what: &str, n: u32) {
    for (r, x) in results.into_iter().enumerate() {
        match x {
            Ok(()) => panic!("{what}, {n} ranks: rank {r} returned data from mismatched calls"),
            Err(e) => assert!(
                e.contains("does not match"),
                "{what}, {n} ranks, rank {r}: expected the mismatch, got: {e}"
            ),
        }
    }
}

type Case = fn(Context) -> std::pin::Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// AllToAllv where every rank sends 2 elements to each peer but the last
/// rank expects 3 from rank 0 (every other pair agrees).
fn alltoallv_count_mismatch(
    c: Context,
) -> std::pin::Pin<Box<dyn Future<Output = Result<(), String>> + Send>> {
    Box::pin(async move {
        let n = c.nranks() as usize;
        let mut recv = vec![2usize; n];
        if c.rank() as usize == n - 1 {
            recv[0] = 3;
        }
        let spec = AllToAllvSpec::from_counts(vec![2; n], recv);
        alltoallv(&c, vec![7i32; 2 * n], spec)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
}

/// A streaming AllGather of `chunks` chunks of `bytes` bytes from this
/// rank (the last one flagged as its finish).
async fn streaming_allgather(
    c: &Context,
    chunks: u64,
    bytes: usize,
) -> Result<(), braid_coll::CollError> {
    let ag = AllGather::new(c, None);
    let chunk = || PackedData {
        metadata: Bytes::new(),
        data: Buffer::from_vec(vec![1u8; bytes]),
    };
    for seq in 0..chunks.saturating_sub(1) {
        ag.insert(seq, chunk())?;
    }
    ag.insert_last(chunks.saturating_sub(1), chunk())?;
    ag.extract(ExtractOrder::RankSeq).await.map(|_| ())
}

/// Shuffle owners that differ between ranks: rank 0 round-robin, the
/// others in ranges.
fn mixed_owners(c: &Context) -> PartitionOwner {
    if c.rank() == 0 {
        PartitionOwner::RoundRobin
    } else {
        PartitionOwner::Contiguous
    }
}

/// An 8-byte chunk of the rank's number.
fn rank_chunk(c: &Context) -> PackedData {
    PackedData {
        metadata: Bytes::new(),
        data: Buffer::from_vec(vec![c.rank() as u8; 8]),
    }
}

fn mismatch_cases() -> Vec<(&'static str, Case)> {
    vec![
        ("shuffle owners", |c| {
            Box::pin(async move {
                // Rank 0 routes partitions round-robin, the others in
                // ranges: every rank is sent a chunk it does not own. A
                // failed shuffle must stay failed for every later call.
                let (me, nparts) = (c.rank(), 4 * c.nranks());
                let sh = Shuffle::new(&c, nparts, mixed_owners(&c), None);
                for pid in 0..nparts {
                    sh.insert(pid, rank_chunk(&c)).map_err(|e| e.to_string())?;
                }
                sh.insert_finished().map_err(|e| e.to_string())?;
                let first = sh.wait().await;
                let again = sh.wait().await;
                let part = sh.extract(me).await;
                match (first, again, part) {
                    (Err(e), Err(_), Err(_)) => Err(e.to_string()),
                    (Ok(()), Ok(()), Ok(_)) => Ok(()),
                    (a, b, x) => Err(format!(
                        "a failed shuffle read as finished later: {a:?}, then {b:?}, then {:?}",
                        x.map(|v| v.len())
                    )),
                }
            })
        }),
        // Owner policies that differ where no chunk is routed wrongly
        // (each rank inserts only into partitions it owns by its own
        // policy): partitions would be split between ranks unnoticed.
        ("shuffle owners, no chunk misrouted", |c| {
            Box::pin(async move {
                let sh = Shuffle::new(&c, 4 * c.nranks(), mixed_owners(&c), None);
                for pid in sh.local_partitions() {
                    sh.insert(pid, rank_chunk(&c)).map_err(|e| e.to_string())?;
                }
                sh.insert_finished().map_err(|e| e.to_string())?;
                sh.wait().await.map_err(|e| e.to_string())
            })
        }),
        ("allreduce counts", |c| {
            Box::pin(async move {
                let len = if c.rank() == 0 { 10 } else { 11 };
                allreduce(&c, vec![1i64; len], ReduceKind::Sum)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            })
        }),
        ("allreduce algorithms", |c| {
            Box::pin(async move {
                // 80 bytes go the direct way, 800 KB the two-step way.
                let len = if c.rank() == 0 { 10 } else { 100_000 };
                allreduce(&c, vec![1i64; len], ReduceKind::Sum)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            })
        }),
        ("allreduce dtypes", |c| {
            Box::pin(async move {
                if c.rank() == 0 {
                    allreduce(&c, vec![1i64; 10], ReduceKind::Sum)
                        .await
                        .map(|_| ())
                } else {
                    allreduce(&c, vec![1f64; 10], ReduceKind::Sum)
                        .await
                        .map(|_| ())
                }
                .map_err(|e| e.to_string())
            })
        }),
        ("allreduce operators", |c| {
            Box::pin(async move {
                let k = if c.rank() == 0 {
                    ReduceKind::Min
                } else {
                    ReduceKind::Max
                };
                allreduce(&c, vec![1i32; 10], k)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            })
        }),
        ("broadcast roots", |c| {
            Box::pin(async move {
                // Rank 0 thinks rank 0 is the root; the others think rank 1 is.
                let root = if c.rank() == 0 { 0 } else { 1 };
                let data = (c.rank() == root).then(|| Buffer::from_vec(vec![c.rank() as u8; 10]));
                broadcast(&c, root, data)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            })
        }),
        ("alltoallv counts", alltoallv_count_mismatch),
        // The last rank's AllToAll does not split into N equal blocks: it
        // fails in its core (streaming on even ranks, started by hand on
        // odd ones), and the others, waiting for its blocks, with it.
        ("alltoall blocks", |c| {
            Box::pin(async move {
                let n = c.nranks() as usize;
                let len = if c.rank() == c.nranks() - 1 {
                    2 * n + 1
                } else {
                    2 * n
                };
                if c.rank() % 2 == 0 {
                    alltoall(&c, vec![7i32; len]).await.map(|_| ())
                } else {
                    let done = braid_core::Event::new();
                    let set = done.clone();
                    let h = braid_coll::start_alltoall(
                        &c,
                        vec![7i32; len],
                        Some(Box::new(move || set.set())),
                    );
                    done.wait().await;
                    h.take().map(|_| ())
                }
                .map_err(|e| e.to_string())
            })
        }),
        // AllToAll on rank 0, AllToAllv with the same counts elsewhere.
        ("alltoall against alltoallv", |c| {
            Box::pin(async move {
                let n = c.nranks() as usize;
                if c.rank() == 0 {
                    alltoall(&c, vec![7i32; 2 * n]).await.map(|_| ())
                } else {
                    let spec = AllToAllvSpec::from_counts(vec![2; n], vec![2; n]);
                    alltoallv(&c, vec![7i32; 2 * n], spec).await.map(|_| ())
                }
                .map_err(|e| e.to_string())
            })
        }),
        // Different collectives at one operation. In-process, both of
        // these meet: the meeting's heads differ in kind.
        ("allreduce against broadcast", |c| {
            Box::pin(async move {
                if c.rank() == 0 {
                    broadcast(&c, 0, Some(Buffer::from_vec(vec![7u8; 10])))
                        .await
                        .map(|_| ())
                } else {
                    allreduce(&c, vec![1i64; 10], ReduceKind::Sum)
                        .await
                        .map(|_| ())
                }
                .map_err(|e| e.to_string())
            })
        }),
        // In-process, the broadcast ranks meet while rank 0's streaming
        // AllGather sends its chunk as messages.
        ("streaming allgather against broadcast", |c| {
            Box::pin(async move {
                if c.rank() == 0 {
                    streaming_allgather(&c, 1, 4).await
                } else {
                    let data = (c.rank() == 1).then(|| Buffer::from_vec(vec![7u8; 10]));
                    broadcast(&c, 1, data).await.map(|_| ())
                }
                .map_err(|e| e.to_string())
            })
        }),
        ("allgather dtypes", |c| {
            Box::pin(async move {
                if c.rank() == c.nranks() - 1 {
                    allgather(&c, vec![1i64; 3]).await.map(|_| ())
                } else {
                    allgather(&c, vec![1f64; 3]).await.map(|_| ())
                }
                .map_err(|e| e.to_string())
            })
        }),
        // A one-shot AllGather is not the streaming one, even with one
        // chunk per rank (in-process: a meeting against messages; over
        // tcp: frames with and without the last-chunk flag).
        ("one-shot against streaming allgather", |c| {
            Box::pin(async move {
                if c.rank() == 0 {
                    streaming_allgather(&c, 1, 8).await
                } else {
                    allgather(&c, vec![1u8; 8]).await.map(|_| ())
                }
                .map_err(|e| e.to_string())
            })
        }),
        // A streaming rank's first chunk (not its last) is no one-shot
        // frame either: the one-shot ranks must not return it as data.
        ("one-shot against a two-chunk streaming allgather", |c| {
            Box::pin(async move {
                if c.rank() == 0 {
                    streaming_allgather(&c, 2, 8).await
                } else {
                    allgather(&c, vec![1u8; 8]).await.map(|_| ())
                }
                .map_err(|e| e.to_string())
            })
        }),
        ("barrier against sendrecv", |c| {
            Box::pin(async move {
                let (me, n) = (c.rank(), c.nranks());
                if me == n - 1 {
                    let b = Buffer::from_vec(vec![1u8; 8]);
                    sendrecv(&c, (me + 1) % n, b, (me + n - 1) % n)
                        .await
                        .map(|_| ())
                } else {
                    barrier(&c).await
                }
                .map_err(|e| e.to_string())
            })
        }),
    ]
}

#[test]
fn mismatched_calls_fail_everywhere() {
    let rt = runtime();
    for n in RANK_COUNTS.into_iter().filter(|n| *n >= 2) {
        for (what, case) in mismatch_cases() {
            rt.block_on(async {
                all_fail(
                    on_all(local_ctxs(n, MemoryLimits::UNLIMITED).await, case).await,
                    what,
                    n,
                );
                all_fail(
                    on_all(tcp_ctxs(n, MemoryLimits::UNLIMITED).await, case).await,
                    what,
                    n,
                );
            });
        }
    }
}

/// AllToAllv: a pair that disagrees on a count is noticed by every rank in
/// the same call (through the count digests), including the ranks that are
/// not in the pair.
#[test]
fn alltoallv_mismatch_is_seen_by_every_rank() {
    let rt = runtime();
    for n in RANK_COUNTS.into_iter().filter(|n| *n >= 2) {
        let case = alltoallv_count_mismatch;
        rt.block_on(async {
            let what = "alltoallv counts";
            for results in [
                on_all(local_ctxs(n, MemoryLimits::UNLIMITED).await, case).await,
                on_all(tcp_ctxs(n, MemoryLimits::UNLIMITED).await, case).await,
            ] {
                // The error names the collective the user called.
                for (r, e) in results.iter().enumerate() {
                    if let Err(e) = e {
                        assert!(e.contains(": alltoallv ("), "{n} ranks, rank {r}: {e}");
                    }
                }
                all_see_mismatch(results, what, n);
            }
        });
    }
}

#[test]
fn shuffle_over_memory_limit_spills() {
    let rt = runtime();
    // Each rank inserts up to ~4.4 MB; the host limit is 1 MiB per rank.
    let limits = MemoryLimits {
        device: None,
        host: Some(1 << 20),
    };
    for n in [1u32, 3, 4] {
        for tcp in [false, true] {
            rt.block_on(async {
                let ctxs = if tcp {
                    tcp_ctxs(n, limits).await
                } else {
                    local_ctxs(n, limits).await
                };
                let res = on_all(ctxs, |c| async move {
                    coll_suite::shuffle_check(&c, 5, 1).await
                })
                .await;
                let spilled: u64 = res.into_iter().map(|r| r.unwrap()).sum();
                assert!(spilled > 0, "{n} ranks (tcp: {tcp}): nothing spilled");
            });
        }
    }
}

/// Over tcp a large AllToAll part whose receive is posted before it is
/// sent lands in the reused result vector itself (the statistics count
/// it), and the result is right whichever way each part came: here rank 0
/// makes its second call late, so every other rank's part from it must
/// land whole.
#[test]
fn tcp_alltoall_parts_land_in_the_result() {
    let rt = runtime();
    for n in RANK_COUNTS.into_iter().filter(|n| *n >= 2) {
        let block = 40_000usize; // i64: 320 KB a part
        let res = rt.block_on(async {
            on_all(tcp_ctxs(n, MemoryLimits::UNLIMITED).await, |c| async move {
                let me = c.rank() as usize;
                let nn = c.nranks() as usize;
                let v = |k: usize, s: usize, d: usize, i: usize| {
                    (k * 77 + s * 1_000_003 + d * 7919 + i) as i64
                };
                // The first call fills a short vector (copied in); the
                // second reuses it, which is what lands.
                let mut out = vec![-1i64; 3];
                let mut landed = 0;
                for k in 0..2 {
                    if me == 0 && k == 1 {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                    }
                    let send: Vec<i64> = (0..nn)
                        .flat_map(|d| (0..block).map(move |i| v(k, me, d, i)))
                        .collect();
                    let before = c.comm().statistics().landed_bytes();
                    braid_coll::alltoall_into(&c, send, &mut out)
                        .await
                        .map_err(|e| e.to_string())?;
                    landed = c.comm().statistics().landed_bytes() - before;
                    let want: Vec<i64> = (0..nn)
                        .flat_map(|s| (0..block).map(move |i| v(k, s, me, i)))
                        .collect();
                    if out != want {
                        return Err(format!("rank {me}: result of call {k} differs"));
                    }
                }
                Ok(landed)
            })
            .await
        });
        for (r, x) in res.into_iter().enumerate() {
            let landed = x.unwrap_or_else(|e| panic!("{n} ranks: {e}"));
            if r > 0 {
                assert!(
                    landed >= (block * 8) as u64,
                    "{n} ranks, rank {r}: only {landed} bytes landed"
                );
            }
        }
    }
}

/// Over tcp the fresh-vector forms land too: an AllToAllv's large parts
/// (a late rank's, whose receives are posted first) are read straight
/// into the new result's unwritten memory, with the result laid out by
/// permuted offsets and gaps that come back zeroed; an AllReduce's reduced
/// blocks the same. Every value is checked against a brute-force layout
/// and sum.
#[test]
fn tcp_fresh_results_land_in_unwritten_memory() {
    let rt = runtime();
    for n in RANK_COUNTS.into_iter().filter(|n| *n >= 2) {
        let res = rt.block_on(async {
            on_all(tcp_ctxs(n, MemoryLimits::UNLIMITED).await, |c| async move {
                let me = c.rank() as usize;
                let nn = c.nranks() as usize;
                // Part s -> d: 20_000 + 1000 * ((s + d) % 3) i64 (160 KB
                // and up), placed in reverse rank order, 7 elements apart.
                let count = |s: usize, d: usize| 20_000 + 1000 * ((s + d) % 3);
                let v = |s: usize, d: usize, i: usize| (s * 1_000_003 + d * 7919 + i) as i64 + 1;
                let send_counts: Vec<usize> = (0..nn).map(|d| count(me, d)).collect();
                let recv_counts: Vec<usize> = (0..nn).map(|s| count(s, me)).collect();
                let mut spec = AllToAllvSpec::from_counts(send_counts, recv_counts.clone());
                let mut at = 0;
                for s in (0..nn).rev() {
                    spec.recv_offsets[s] = at;
                    at += recv_counts[s] + 7;
                }
                spec.recv_len = at;
                let send: Vec<i64> = (0..nn)
                    .flat_map(|d| (0..count(me, d)).map(move |i| v(me, d, i)))
                    .collect();
                let mut want = vec![0i64; at];
                for s in 0..nn {
                    for i in 0..recv_counts[s] {
                        want[spec.recv_offsets[s] + i] = v(s, me, i);
                    }
                }
                if me == 0 {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                let before = c.comm().statistics().landed_bytes();
                let got = braid_coll::alltoallv(&c, send, spec)
                    .await
                    .map_err(|e| e.to_string())?;
                let landed_a2a = c.comm().statistics().landed_bytes() - before;
                if got != want {
                    let bad = (0..want.len()).find(|&i| got.get(i) != Some(&want[i]));
                    return Err(format!("rank {me}: alltoallv differs at {bad:?}"));
                }
                // AllReduce: 300_001 f64 (blocks not all equal), rank 0 late.
                // Whether a reduced block lands depends on which rank's
                // reduction ends first (one that arrives before its receive
                // is posted is copied instead), so three calls are counted.
                let len = 300_001usize;
                let mut landed_ar = 0;
                for round in 0..3usize {
                    let x = |r: usize, i: usize| ((r * 7 + i + round) % 1000) as f64;
                    let data: Vec<f64> = (0..len).map(|i| x(me, i)).collect();
                    if me == 0 {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                    }
                    let before = c.comm().statistics().landed_bytes();
                    let sum = braid_coll::allreduce(&c, data, ReduceKind::Sum)
                        .await
                        .map_err(|e| e.to_string())?;
                    landed_ar += c.comm().statistics().landed_bytes() - before;
                    let bad =
                        (0..len).find(|&i| sum.get(i) != Some(&(0..nn).map(|r| x(r, i)).sum()));
                    if sum.len() != len || bad.is_some() {
                        return Err(format!("rank {me}: allreduce {round} differs at {bad:?}"));
                    }
                }
                Ok((landed_a2a, landed_ar))
            })
            .await
        });
        let mut landed_ar = 0;
        for (r, x) in res.into_iter().enumerate() {
            let (a2a, ar) = x.unwrap_or_else(|e| panic!("{n} ranks: {e}"));
            landed_ar += ar;
            if r > 0 {
                // Rank 0's part (20_000 i64 at the least) lands whole.
                assert!(
                    a2a >= 160_000,
                    "{n} ranks, rank {r}: only {a2a} bytes landed"
                );
            }
        }
        assert!(landed_ar > 0, "{n} ranks: no reduced block landed");
    }
}

/// Over tcp a reused `allreduce_into` vector takes the other ranks'
/// reduced blocks straight from the sockets (some of them land, counted
/// in the statistics), and every call's result equals a brute-force sum.
#[test]
fn tcp_allreduce_into_blocks_land_in_the_result() {
    let rt = runtime();
    for n in [2u32, 3, 4] {
        let len = 300_001usize; // f64: 2.4 MB, blocks not all equal
        let res = rt.block_on(async {
            on_all(tcp_ctxs(n, MemoryLimits::UNLIMITED).await, |c| async move {
                let me = c.rank() as usize;
                let nn = c.nranks() as usize;
                let x = |k: usize, r: usize, i: usize| ((k * 31 + r * 7 + i) % 1000) as f64;
                let mut out = vec![f64::NAN; 10];
                let before = c.comm().statistics().landed_bytes();
                for k in 0..4 {
                    let data: Vec<f64> = (0..len).map(|i| x(k, me, i)).collect();
                    braid_coll::allreduce_into(&c, data, ReduceKind::Sum, &mut out)
                        .await
                        .map_err(|e| e.to_string())?;
                    let bad = (0..len).find(|&i| {
                        let want: f64 = (0..nn).map(|r| x(k, r, i)).sum();
                        out.get(i) != Some(&want)
                    });
                    if out.len() != len || bad.is_some() {
                        return Err(format!("rank {me}, call {k}: result differs at {bad:?}"));
                    }
                }
                Ok(c.comm().statistics().landed_bytes() - before)
            })
            .await
        });
        let landed: u64 = res
            .into_iter()
            .map(|x| x.unwrap_or_else(|e| panic!("{n} ranks: {e}")))
            .sum();
        assert!(landed > 0, "{n} ranks: no reduced block landed");
    }
}

/// Local and tcp contexts for `n` ranks, each with its world's name.
async fn both_worlds(n: u32) -> [(&'static str, Vec<Context>); 2] {
    [
        ("local", local_ctxs(n, MemoryLimits::UNLIMITED).await),
        ("tcp", tcp_ctxs(n, MemoryLimits::UNLIMITED).await),
    ]
}

/// Every rank failed, each error naming `cause` and none `not`.
fn every_rank_fails_with(res: Vec<Result<(), String>>, cause: &str, not: &str, what: &str) {
    for (r, x) in res.into_iter().enumerate() {
        let e = x
            .err()
            .unwrap_or_else(|| panic!("{what}: rank {r} succeeded"));
        assert!(
            e.contains(cause) && (not.is_empty() || !e.contains(not)),
            "{what}, rank {r}: expected {cause:?}, got: {e}"
        );
    }
}

/// A streaming AllGather that one rank extracts (`Extract`) or drops and
/// leaves for a barrier (`Drop`) before it finished inserting, or that
/// every rank extracts unfinished (`ExtractAll`): every rank fails in
/// bounded time (the others would otherwise wait for its last chunk for
/// ever), saying why.
#[derive(Clone, Copy, Debug)]
enum Unfinished {
    Extract,
    Drop,
    ExtractAll,
}

/// A rank's chunk of a streaming AllGather takes a seq of its own: a seq
/// inserted twice is refused there (nothing sent), and the chunks
/// inserted around it, in any seq order, arrive whole and in (rank, seq)
/// order on every rank.
#[test]
fn a_seq_inserted_twice_is_refused() {
    let rt = runtime();
    for n in RANK_COUNTS {
        let case = move |c: Context| async move {
            let me = c.rank();
            let chunk = |seq: u64| PackedData {
                metadata: Bytes::new(),
                data: Buffer::from_vec(vec![me as u8 ^ seq as u8; 8 + seq as usize]),
            };
            let ag = AllGather::new(&c, None);
            ag.insert(5, chunk(5)).map_err(|e| e.to_string())?;
            let twice = ag
                .insert(5, chunk(6))
                .map(|_| ())
                .map_err(|e| e.to_string());
            let again = match twice {
                Err(e)
                    if e.contains("seq 5 inserted twice")
                        && e.starts_with(&format!("rank {me}: ")) =>
                {
                    Ok(())
                }
                other => Err(format!("rank {me}: a second seq 5 gave {other:?}")),
            };
            ag.insert(2, chunk(2)).map_err(|e| e.to_string())?;
            ag.insert_last(9, chunk(9)).map_err(|e| e.to_string())?;
            let got = ag
                .extract(ExtractOrder::RankSeq)
                .await
                .map_err(|e| e.to_string())?;
            again?;
            let want: Vec<(u32, u64)> = (0..n).flat_map(|r| [2, 5, 9].map(|s| (r, s))).collect();
            let seen: Vec<(u32, u64)> = got.iter().map(|g| (g.rank, g.seq)).collect();
            if seen != want {
                return Err(format!("rank {me}: chunks {seen:?}, want {want:?}"));
            }
            for g in &got {
                let exp = vec![g.rank as u8 ^ g.seq as u8; 8 + g.seq as usize];
                if g.data.data.as_slice() != exp.as_slice() {
                    return Err(format!("rank {me}: chunk ({}, {}) differs", g.rank, g.seq));
                }
            }
            Ok(())
        };
        rt.block_on(async {
            for (world, ctxs) in [
                ("local", local_ctxs(n, MemoryLimits::UNLIMITED).await),
                ("tcp", tcp_ctxs(n, MemoryLimits::UNLIMITED).await),
            ] {
                for (r, res) in on_all(ctxs, case).await.into_iter().enumerate() {
                    assert_eq!(res, Ok(()), "{world}, {n} ranks, rank {r}");
                }
            }
        });
    }
}

async fn unfinished_allgather(c: Context, how: Unfinished) -> Result<(), String> {
    let chunk = |b: u8| PackedData {
        metadata: Bytes::new(),
        data: Buffer::from_vec(vec![b; 16]),
    };
    let ag = AllGather::new(&c, None);
    ag.insert(0, chunk(1)).map_err(|e| e.to_string())?;
    if c.rank() == 0 || matches!(how, Unfinished::ExtractAll) {
        match how {
            Unfinished::Extract | Unfinished::ExtractAll => {
                ag.extract(ExtractOrder::RankSeq)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Unfinished::Drop => drop(ag),
        }
    } else {
        ag.insert_last(1, chunk(2)).map_err(|e| e.to_string())?;
        ag.extract(ExtractOrder::RankSeq)
            .await
            .map_err(|e| e.to_string())?;
    }
    barrier(&c).await.map_err(|e| e.to_string())
}

#[test]
fn an_allgather_left_unfinished_fails_every_rank() {
    let rt = runtime();
    for n in RANK_COUNTS.into_iter().filter(|n| *n >= 2) {
        for how in [
            Unfinished::Extract,
            Unfinished::Drop,
            Unfinished::ExtractAll,
        ] {
            rt.block_on(async {
                for (world, ctxs) in both_worlds(n).await {
                    let res = on_all(ctxs, move |c| unfinished_allgather(c, how)).await;
                    for (r, x) in res.into_iter().enumerate() {
                        let e = match x {
                            Ok(()) => panic!("{how:?}, {world}, {n} ranks: rank {r} succeeded"),
                            Err(e) => e,
                        };
                        let why = match how {
                            Unfinished::Extract | Unfinished::ExtractAll => {
                                "extracted before insert_finished"
                            }
                            Unfinished::Drop => "dropped before insert_finished",
                        };
                        // Rank 0 says why (its extract's own error, or the
                        // abort its drop caused); the others hear the abort
                        // (or, all extracting, say it themselves).
                        let own = r == 0 || matches!(how, Unfinished::ExtractAll);
                        assert!(
                            e.contains(why) && (own || e.contains("abort")),
                            "{how:?}, {world}, {n} ranks, rank {r}: unclear error: {e}"
                        );
                    }
                }
            });
        }
    }
}

/// What the last rank of a shuffle does with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LastRank {
    Drops,
    FailsAfter,
    ExtractsEarly,
    WaitsEarly,
}

/// A Shuffle dropped, extracted or waited on before this rank finished
/// inserting fails every rank (not a hang: the wait had nothing to end it,
/// even on one rank), with the cause where there is one; a partition is
/// extracted once, and only by its owner.
#[test]
fn shuffle_misuse_fails_instead_of_hanging_or_losing_data() {
    let rt = runtime();
    let chunk = |b: u8| PackedData {
        metadata: Bytes::new(),
        data: Buffer::from_vec(vec![b; 8]),
    };
    for n in RANK_COUNTS {
        rt.block_on(async {
            // The last rank drops its shuffle unfinished and goes on
            // (`Drops`), or drops it on the way out of a failure of its own
            // (`FailsAfter`): the others hear the drop, or that failure
            // (the drop waits a while for the job to fail otherwise). Or
            // it extracts a partition or waits first (one rank alone, too).
            let lasts: &[LastRank] = if n == 1 {
                &[LastRank::ExtractsEarly, LastRank::WaitsEarly]
            } else {
                &[
                    LastRank::Drops,
                    LastRank::FailsAfter,
                    LastRank::ExtractsEarly,
                    LastRank::WaitsEarly,
                ]
            };
            for &last in lasts {
                for (world, ctxs) in both_worlds(n).await {
                    let res = on_all(ctxs, move |c| async move {
                        let sh = Shuffle::new(&c, 2 * n, PartitionOwner::RoundRobin, None);
                        sh.insert(c.rank() % (2 * n), chunk(1))
                            .map_err(|e| e.to_string())?;
                        if c.rank() == n - 1 {
                            match last {
                                LastRank::ExtractsEarly => {
                                    sh.extract(c.rank()).await.map_err(|e| e.to_string())?;
                                }
                                LastRank::WaitsEarly => {
                                    sh.wait().await.map_err(|e| e.to_string())?;
                                }
                                LastRank::Drops | LastRank::FailsAfter => drop(sh),
                            }
                            if last == LastRank::FailsAfter {
                                // Work on the way out before the failure
                                // is reported.
                                tokio::time::sleep(Duration::from_millis(20)).await;
                                return Err("a failure of its own".to_string());
                            }
                        } else {
                            sh.insert_finished().map_err(|e| e.to_string())?;
                            sh.wait().await.map_err(|e| e.to_string())?;
                        }
                        barrier(&c).await.map_err(|e| e.to_string())
                    })
                    .await;
                    let what = format!("{last:?}, {world}, {n} ranks");
                    match last {
                        LastRank::Drops => {
                            every_rank_fails_with(res, "dropped before insert_finished", "", &what)
                        }
                        LastRank::ExtractsEarly => every_rank_fails_with(
                            res,
                            "extracted before insert_finished",
                            "",
                            &what,
                        ),
                        LastRank::WaitsEarly => every_rank_fails_with(
                            res,
                            "waited on before insert_finished",
                            "",
                            &what,
                        ),
                        LastRank::FailsAfter => every_rank_fails_with(
                            res,
                            "a failure of its own",
                            "dropped before",
                            &what,
                        ),
                    }
                }
            }
            // Extraction: each rank's own partitions once, then a second
            // time and another rank's (both errors).
            let res = on_all(
                local_ctxs(n, MemoryLimits::UNLIMITED).await,
                move |c| async move {
                    let (me, nparts) = (c.rank(), 2 * n);
                    let sh = Shuffle::new(&c, nparts, PartitionOwner::RoundRobin, None);
                    for pid in 0..nparts {
                        sh.insert(pid, chunk(me as u8)).map_err(|e| e.to_string())?;
                    }
                    sh.insert_finished().map_err(|e| e.to_string())?;
                    for pid in sh.local_partitions() {
                        let got = sh.extract(pid).await.map_err(|e| e.to_string())?;
                        let mut srcs: Vec<u8> = got.iter().map(|p| p.data.as_slice()[0]).collect();
                        srcs.sort_unstable();
                        assert_eq!(srcs, (0..n as u8).collect::<Vec<_>>(), "partition {pid}");
                        let again = sh.extract(pid).await.err().map(|e| e.to_string());
                        assert!(
                            again
                                .as_ref()
                                .is_some_and(|e| e.contains("extracted already")),
                            "rank {me}, partition {pid} twice: {again:?}"
                        );
                    }
                    if n > 1 {
                        let other = (me + 1) % n;
                        let theirs = sh.extract(other).await.err().map(|e| e.to_string());
                        assert!(
                            theirs
                                .as_ref()
                                .is_some_and(|e| e.contains(&format!("belongs to rank {other}"))),
                            "rank {me}, rank {other}'s partition: {theirs:?}"
                        );
                    }
                    Ok(())
                },
            )
            .await;
            for (r, x) in res.into_iter().enumerate() {
                assert!(x.is_ok(), "extraction, {n} ranks, rank {r}: {x:?}");
            }
        });
    }
}

/// A HaloExchange one rank creates and drops unstarted: every rank fails
/// in bounded time, told why (its neighbours would otherwise wait for its
/// halo for ever).
#[test]
fn a_halo_exchange_dropped_unstarted_fails_every_rank() {
    let rt = runtime();
    for n in RANK_COUNTS.into_iter().filter(|n| *n >= 2) {
        rt.block_on(async {
            for (world, ctxs) in both_worlds(n).await {
                let res = on_all(ctxs, move |c| async move {
                    let h = HaloExchange::new(&c);
                    if c.rank() == n / 2 {
                        drop(h);
                    } else {
                        let side = || PackedData {
                            metadata: Bytes::new(),
                            data: Buffer::from_vec(vec![1u8; 8]),
                        };
                        h.exchange(side(), side())
                            .await
                            .map_err(|e| e.to_string())?;
                    }
                    barrier(&c).await.map_err(|e| e.to_string())
                })
                .await;
                let what = format!("dropped halo exchange, {world}, {n} ranks");
                every_rank_fails_with(res, "dropped without being started", "", &what);
            }
        });
    }
}

/// Every backend counts the collectives' traffic per peer (DESIGN's
/// statistics): an AllToAllv in which rank r sends `r + 2q + 1` elements
/// to rank q, then a Broadcast of `64 + root` KiB. Between in-process
/// ranks, where the collectives meet instead of sending messages, each
/// rank's statistics show exactly those bytes from and to each peer (the
/// Broadcast's from and to the root), in one message or more each way.
/// Over tcp a message is counted when it arrives, which may be before its
/// receiver calls (so there the counts since the job began are checked),
/// agreements add a few bytes, and a Broadcast goes along a tree: each
/// rank has at least its AllToAllv bytes from and to each peer, and a
/// non-root rank at least the Broadcast's bytes more from its peers.
#[test]
fn collectives_count_bytes_per_peer() {
    let rt = runtime();
    for n in RANK_COUNTS {
        rt.block_on(async {
            for (world, ctxs) in both_worlds(n).await {
                let exact = world == "local";
                let res = on_all(ctxs, move |c| async move {
                    let (me, n) = (c.rank() as usize, c.nranks() as usize);
                    let stats = c.comm().statistics().clone();
                    let snap = || (0..n).map(|q| stats.peer(q as u32)).collect::<Vec<_>>();
                    let before = if exact { snap() } else { vec![Default::default(); n] };
                    let send_counts: Vec<usize> = (0..n).map(|q| me + 2 * q + 1).collect();
                    let recv_counts: Vec<usize> = (0..n).map(|q| q + 2 * me + 1).collect();
                    let offsets = |c: &[usize]| -> Vec<usize> {
                        c.iter()
                            .scan(0, |at, x| {
                                *at += x;
                                Some(*at - x)
                            })
                            .collect()
                    };
                    let spec = AllToAllvSpec {
                        send_offsets: offsets(&send_counts),
                        recv_offsets: offsets(&recv_counts),
                        recv_len: recv_counts.iter().sum(),
                        send_counts: send_counts.clone(),
                        recv_counts: recv_counts.clone(),
                    };
                    let send: Vec<i64> = (0..send_counts.iter().sum::<usize>() as i64).collect();
                    alltoallv(&c, send, spec).await.map_err(|e| e.to_string())?;
                    let root = n - 1;
                    let len = (64 + root) << 10;
                    let data = (me == root).then(|| Buffer::from_vec(vec![7u8; len]));
                    let got = broadcast(&c, root as u32, data).await.map_err(|e| e.to_string())?;
                    if got.len() != len {
                        return Err(format!("broadcast gave {} bytes, want {len}", got.len()));
                    }
                    let after = snap();
                    let mut bcast_recv = 0;
                    for q in (0..n).filter(|q| *q != me) {
                        let (b, a) = (before[q], after[q]);
                        let (recv, sent) = (a.bytes_recv - b.bytes_recv, a.bytes_sent - b.bytes_sent);
                        let (mut want_recv, mut want_sent) =
                            (8 * recv_counts[q] as u64, 8 * send_counts[q] as u64);
                        bcast_recv += recv - want_recv.min(recv);
                        if exact {
                            want_recv += if q == root { len as u64 } else { 0 };
                            want_sent += if me == root { len as u64 } else { 0 };
                        }
                        let ok = |got: u64, want: u64| if exact { got == want } else { got >= want };
                        if !ok(recv, want_recv) || !ok(sent, want_sent) {
                            return Err(format!(
                                "peer {q}: received {recv} bytes (want {want_recv}), sent {sent} (want {want_sent})"
                            ));
                        }
                        if a.msgs_recv <= b.msgs_recv || a.msgs_sent <= b.msgs_sent {
                            return Err(format!("peer {q}: no message counted"));
                        }
                    }
                    if me != root && bcast_recv < len as u64 {
                        return Err(format!(
                            "{bcast_recv} bytes received beyond the AllToAllv's, want the broadcast's {len} at least"
                        ));
                    }
                    Ok(())
                })
                .await;
                for (r, x) in res.into_iter().enumerate() {
                    x.unwrap_or_else(|e| panic!("{world}, {n} ranks, rank {r}: {e}"));
                }
            }
        });
    }
}

/// A collective's blocking `wait` called from a job's own task (a worker of
/// the rank's runtime, which also drives the collective) completes with the
/// right result, on every rank count, instead of holding the worker the
/// collective needs. Each rank's runtime has one worker where the ranks fit
/// the host's cores, the case that hung.
#[test]
fn blocking_waits_inside_a_job_complete() {
    for n in RANK_COUNTS {
        let out = local_job(n, 60, move |c| async move {
            let mut sums = Vec::new();
            for round in 0..20i64 {
                braid_coll::start_barrier(&c, None).wait()?;
                let v = vec![c.rank() as i64 + round; 3];
                let h = braid_coll::start_allreduce(&c, v, ReduceKind::Sum.into(), None);
                sums.push(h.wait()?);
            }
            // A shuffle's blocking wait too: every rank sends one
            // chunk to each partition, then checks what it owns.
            let n = c.nranks();
            let sh = Shuffle::new(&c, 2 * n, PartitionOwner::RoundRobin, None);
            for pid in 0..2 * n {
                sh.insert(pid, rank_chunk(&c))?;
            }
            sh.insert_finished()?;
            sh.wait_blocking()?;
            for pid in sh.local_partitions() {
                let got = sh.extract(pid).await?.len();
                if got != n as usize {
                    return Err(format!("partition {pid}: {got} chunks, not {n}").into());
                }
            }
            // From a blocking-pool thread running a LocalSet (where tokio
            // refuses `block_in_place`) the wait just blocks.
            let v = vec![c.rank() as i64];
            let h = braid_coll::start_allreduce(&c, v, ReduceKind::Sum.into(), None);
            let got = tokio::task::spawn_blocking(move || {
                let local = tokio::task::LocalSet::new();
                tokio::runtime::Handle::current().block_on(local.run_until(async { h.wait() }))
            })
            .await??;
            let want = i64::from(n) * (i64::from(n) - 1) / 2;
            if got != vec![want] {
                return Err(format!("allreduce from a LocalSet: {got:?}, not [{want}]").into());
            }
            Ok(sums)
        });
        let ranks = i64::from(n);
        for (rank, sums) in out {
            for (round, s) in sums.into_iter().enumerate() {
                // sum over ranks r of (r + round)
                let want = ranks * (ranks - 1) / 2 + ranks * round as i64;
                assert_eq!(s, vec![want; 3], "{n} ranks, rank {rank}, round {round}");
            }
        }
    }
}

/// On the one thread of a current-thread runtime that drives the
/// collective, a blocking wait could never end: it fails at once with an
/// error that says what to do, and the collective itself still completes
/// (the peer that awaits it gets its result).
#[test]
fn a_blocking_wait_on_the_driving_thread_is_refused() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let ctxs = local_ctxs(2, MemoryLimits::UNLIMITED).await;
        let h = braid_coll::start_barrier(&ctxs[0], None);
        let e = h.wait().unwrap_err().to_string();
        assert!(e.contains("await the operation instead"), "{e}");
        assert!(e.contains("rank 0"), "{e}");
        tokio::time::timeout(Duration::from_secs(30), barrier(&ctxs[1]))
            .await
            .expect("the peer's barrier hung")
            .unwrap();
        // From a thread of the runtime's blocking pool the same wait is
        // right, and completes.
        let h = braid_coll::start_allreduce(&ctxs[0], vec![1i32, 2], ReduceKind::Sum.into(), None);
        let waiter = tokio::task::spawn_blocking(move || h.wait());
        let peer = allreduce(&ctxs[1], vec![10i32, 20], ReduceKind::Sum);
        let (w, p) = tokio::time::timeout(Duration::from_secs(30), async {
            tokio::join!(waiter, peer)
        })
        .await
        .expect("an allreduce hung");
        assert_eq!(w.unwrap().unwrap(), vec![11, 22]);
        assert_eq!(p.unwrap(), vec![11, 22]);
    });
}

/// A graph's node on the one thread of a current-thread runtime that
/// drives its collectives: a blocking wait there fails at once (it would
/// hold the thread the collective needs) and the node's error says why;
/// the peer's collective still completes.
#[test]
fn a_blocking_wait_in_a_node_on_the_driving_thread_fails() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let ctxs = local_ctxs(2, MemoryLimits::UNLIMITED).await;
        let mut g = braid_core::Graph::new(ctxs[0].clone());
        let c0 = ctxs[0].clone();
        g.add("waits", async move {
            braid_coll::start_barrier(&c0, None)
                .wait()
                .map_err(braid_core::NodeError::other)
        });
        let run = tokio::time::timeout(Duration::from_secs(30), g.run());
        let peer = tokio::time::timeout(Duration::from_secs(30), barrier(&ctxs[1]));
        let (r, p) = tokio::join!(run, peer);
        let e = r.expect("the graph hung").unwrap_err().to_string();
        assert!(e.contains("await the operation instead"), "{e}");
        p.expect("the peer's barrier hung").unwrap();
    });
}

/// A blocking wait from a `LocalSet` on a multi-thread runtime's `block_on`
/// thread (where tokio refuses `block_in_place`) blocks that thread, not a
/// worker: it completes with the right result instead of panicking.
#[test]
fn a_blocking_wait_in_a_local_set_completes() {
    let rt = runtime();
    rt.block_on(async {
        let ctxs = local_ctxs(2, MemoryLimits::UNLIMITED).await;
        let c1 = ctxs[1].clone();
        let peer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            allreduce(&c1, vec![5i64], ReduceKind::Sum).await
        });
        let c0 = ctxs[0].clone();
        let mine = tokio::task::LocalSet::new()
            .run_until(async move {
                tokio::task::spawn_local(async move {
                    braid_coll::start_allreduce(&c0, vec![2i64], ReduceKind::Sum.into(), None)
                        .wait()
                })
                .await
            })
            .await
            .expect("the local task panicked")
            .unwrap();
        assert_eq!(mine, vec![7]);
        assert_eq!(peer.await.unwrap().unwrap(), vec![7]);
    });
}

/// A job that drops started collectives' handles and ends at once ends
/// cleanly on every rank: the rank waits for those cores (every rank made
/// the calls) before it shuts down. Before, the shutdown closed the
/// communicator under them and the job failed ("a collective it did not
/// call" between in-process ranks, "communicator is shut down" over tcp).
#[test]
fn dropped_handles_finish_before_the_rank_shuts_down() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    for n in RANK_COUNTS {
        let done = Arc::new(AtomicUsize::new(0));
        let d = done.clone();
        let res = braid_core::run_world(
            &WorldSpec::Local { nranks: n },
            MemoryLimits::UNLIMITED,
            move |ctx| {
                let d = d.clone();
                async move { Ok(coll_suite::dropped_handles(&ctx, d).await?) }
            },
        )
        .unwrap_or_else(|e| panic!("local, {n} ranks: {e}"));
        assert!(res.iter().all(|(_, v)| *v == n as i64), "{res:?}");
        assert_eq!(
            done.load(Ordering::Relaxed),
            2 * n as usize,
            "callbacks run"
        );
        let rt = runtime();
        let mut spec = LaunchSpec::new(
            n,
            env!("CARGO_BIN_EXE_braid-test-worker"),
            vec!["dropped-handles".into()],
        );
        spec.output = OutputMode::Captured;
        let report = rt
            .block_on(launch(spec))
            .unwrap_or_else(|e| panic!("tcp, {n} ranks: {e:?}"));
        let want = format!("dropped-handles ok {n}");
        assert_eq!(report.stdout.len(), n as usize, "{:?}", report.stdout);
        assert!(
            report.stdout.iter().all(|l| l.trim() == want),
            "tcp, {n} ranks: {:?}",
            report.stdout
        );
    }
}
