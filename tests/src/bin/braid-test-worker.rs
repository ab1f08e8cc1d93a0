//! Worker process for braid's tcp tests. Started by the tests (through the
//! launcher or by hand) with the `BRAID_*` rank environment.
//!
//! Modes:
//! - `exchange SEED`: the all-pairs exchange; prints `exchange ok MSGS BYTES`.
//! - `big BYTES`: rank 0 sends one message of BYTES to rank 1, which checks
//!   it; prints `big ok BYTES`.
//! - `land BYTES`: rank 1 posts a landing receive, then tells rank 0, which
//!   sends BYTES; rank 1 checks the bytes and that they landed in its
//!   zone; prints `land ok BYTES LANDED` (LANDED: 1 or 0).
//! - `swap BYTES`: every rank sends BYTES to the next rank and waits until
//!   that send completes before it receives from the one before (a send
//!   that needs no receive posted first); checks the bytes; prints `swap
//!   ok BYTES`.
//! - `idle BYTES`: ranks 0 and 1 swap BYTES; then rank 1 sends BYTES more
//!   and waits for that send while rank 0 computes (sleeps 1.5 s, its
//!   communicator untouched): the message must be received meanwhile (a
//!   rank that computes still answers its peers: over mpi a large message
//!   from a peer it exchanges with is held, then released at its limit by
//!   the progress thread); rank 0 then receives and checks it; every rank
//!   prints `idle ok BYTES`.
//! - `coll SEED`: the collective suite; prints `coll ok CHECKS`.
//! - `gpu SEED` (feature `cuda`): the device suite; prints `gpu ok CHECKS`.
//! - `gpu-fail CASE` (feature `cuda`): a GPU job that fails (mismatched
//!   calls, or one rank's error after device collectives); exits 3, or
//!   `PEER_FAILED_EXIT` on a rank that only heard of another's failure
//!   (every failing mode does).
//! - `fail-late RANK`: rank RANK fails its job, then waits 1 s before its
//!   process exits (the others, told of the failure, exit first).
//! - `wait`: prints `ready PID`, then waits for a message that never comes; the
//!   test kills a rank and expects the others to fail naming it.
//! - `after-shutdown`: each rank posts a receive from itself, shuts its
//!   communicator down, then checks that the receive, and a send and a
//!   receive to itself and to the next rank, fail with
//!   `CommError::Shutdown` within 10 s (the job's own shutdown then runs
//!   a second time); prints `after-shutdown ok`.
//! - `dropped-handles`: drops two started collectives' handles, then ends
//!   (`coll_suite::dropped_handles`); prints `dropped-handles ok N`.
//! - `threads`: prints `threads WORKERS SMALL BULK`: the rank's runtime
//!   workers and how it waits for an 8 B and a 1 MiB collective.

use std::process::ExitCode;

use braid_core::{Buffer, MemoryLimits, OpId, Tag, WorldSpec};
use braid_tests::{check_payload, exchange, payload};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let spec = match WorldSpec::from_env_or_local(1) {
        Ok(s) => s,
        Err(e) => {
            // One write: ranks share mpirun's stderr, and a line in pieces
            // interleaved with the others'.
            let line = format!("error: {e}\n");
            eprint!("{line}");
            return ExitCode::from(2);
        }
    };
    let mode = args.first().cloned().unwrap_or_default();
    let arg: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(0);
    #[cfg(feature = "mpi")]
    if mode == "orphan" {
        return orphan(arg as usize);
    }
    let res = braid_core::run_world(&spec, MemoryLimits::UNLIMITED, move |ctx| {
        let mode = mode.clone();
        async move {
            let comm = ctx.comm().clone();
            match mode.as_str() {
                "exchange" => {
                    let s = exchange(comm, arg).await?;
                    println!("exchange ok {} {}", s.messages, s.bytes);
                }
                "big" => {
                    let tag = Tag::new(OpId(1), 0);
                    let seed = 42;
                    if ctx.rank() == 0 {
                        comm.send(1, tag, Buffer::from_vec(payload(seed, arg as usize)))
                            .await?;
                    } else if ctx.rank() == 1 {
                        let b = comm.recv(0, tag).await?;
                        if b.len() as u64 != arg {
                            return Err(format!("got {} bytes, expected {arg}", b.len()).into());
                        }
                        check_payload(seed, b.as_slice())
                            .map_err(|off| format!("byte {off} differs"))?;
                        println!("big ok {}", b.len());
                    }
                }
                "land" => {
                    let (tag, go) = (Tag::new(OpId(2), 0), Tag::new(OpId(3), 0));
                    let (seed, len) = (43, arg as usize);
                    if ctx.rank() == 0 {
                        comm.recv(1, go).await?;
                        comm.send(1, tag, Buffer::from_vec(payload(seed, len)))
                            .await?;
                    } else if ctx.rank() == 1 {
                        let zone = braid_core::memory::LandingZone::new(vec![0u8; len + 8]);
                        let landing = zone.landing(8, len).ok_or("no landing")?;
                        let recv = comm.recv_landing(0, tag, landing);
                        comm.send(0, go, Buffer::from_vec(vec![1])).await?;
                        let b = recv.await?;
                        check_payload(seed, b.as_slice())
                            .map_err(|off| format!("byte {off} differs"))?;
                        let landed = zone.holds(&b, 8);
                        let counted = comm.statistics().landed_bytes();
                        if landed && counted < len as u64 {
                            return Err(format!("landed, but {counted} bytes counted").into());
                        }
                        println!("land ok {} {}", b.len(), u8::from(landed));
                    }
                }
                "swap" => {
                    let (me, n) = (ctx.rank(), ctx.nranks());
                    let tag = Tag::new(OpId(4), 0);
                    let len = arg as usize;
                    comm.send(
                        (me + 1) % n,
                        tag,
                        Buffer::from_vec(payload(44 + me as u64, len)),
                    )
                    .await?;
                    let from = (me + n - 1) % n;
                    let b = comm.recv(from, tag).await?;
                    if b.len() != len {
                        return Err(format!("got {} bytes, expected {len}", b.len()).into());
                    }
                    check_payload(44 + from as u64, b.as_slice())
                        .map_err(|off| format!("byte {off} differs"))?;
                    println!("swap ok {len}");
                }
                "idle" => {
                    // Ranks 0 and 1 swap BYTES (so that each sends the
                    // other large messages); then rank 1 sends BYTES more
                    // and waits for that send while rank 0 computes.
                    let tag = Tag::new(OpId(5), 0);
                    let len = arg as usize;
                    let me = ctx.rank();
                    if me < 2 {
                        let peer = 1 - me;
                        let sent =
                            comm.send(peer, tag, Buffer::from_vec(payload(45 + me as u64, len)));
                        let b = comm.recv(peer, tag).await?;
                        sent.await?;
                        if b.len() != len {
                            return Err(format!("got {} bytes, expected {len}", b.len()).into());
                        }
                        check_payload(45 + peer as u64, b.as_slice())
                            .map_err(|off| format!("byte {off} differs"))?;
                    }
                    if me == 1 {
                        comm.send(0, tag, Buffer::from_vec(payload(47, len)))
                            .await?;
                    } else if me == 0 {
                        // Far longer than any hold (4 MiB: 4.3 ms).
                        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
                        let before = comm.statistics().peer(1).bytes_recv;
                        let b = comm.recv(1, tag).await?;
                        if b.len() != len {
                            return Err(format!("got {} bytes, expected {len}", b.len()).into());
                        }
                        check_payload(47, b.as_slice())
                            .map_err(|off| format!("byte {off} differs"))?;
                        if before < 2 * len as u64 {
                            return Err(format!(
                                "{before} of {} bytes from rank 1 received while this \
                                 rank computed for 1.5 s",
                                2 * len
                            )
                            .into());
                        }
                    }
                    println!("idle ok {len}");
                }
                "coll" => {
                    let line = braid_tests::coll_suite::run(ctx.clone(), arg).await?;
                    println!("{line}");
                }
                #[cfg(feature = "cuda")]
                "gpu" => {
                    let line = braid_tests::gpu_suite::run(ctx.clone(), arg).await?;
                    println!("{line}");
                }
                #[cfg(feature = "cuda")]
                "gpu-fail" => braid_tests::gpu_suite::fail(ctx.clone(), arg as u32).await?,
                "skip" => {
                    // The last rank leaves without the AllReduce the others
                    // make (arg 0) or without the message rank 0 waits for
                    // (arg 1): the job must fail, not hang.
                    let last = ctx.rank() + 1 == ctx.nranks();
                    if arg == 0 && !last {
                        braid_coll::allreduce(&ctx, vec![1i64; 8], braid_coll::ReduceKind::Sum)
                            .await?;
                    } else if arg == 1 && ctx.rank() == 0 {
                        comm.recv(ctx.nranks() - 1, Tag::new(OpId(9), 0)).await?;
                    }
                }
                "dropped-handles" => {
                    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
                    let n = braid_tests::coll_suite::dropped_handles(&ctx, done).await?;
                    println!("dropped-handles ok {n}");
                }
                "wait" => {
                    println!("ready {}", std::process::id());
                    let src = (ctx.rank() + 1) % ctx.nranks();
                    comm.recv(src, Tag::new(OpId(9), 0)).await?;
                }
                "fail-late" => {
                    if u64::from(ctx.rank()) == arg {
                        return Err(format!("rank {arg} fails on purpose").into());
                    }
                    // Waits for a message that never comes: the failure
                    // ends this.
                    comm.recv(arg as u32, Tag::new(OpId(9), 0)).await?;
                }
                "after-shutdown" => {
                    let me = ctx.rank();
                    let shut = |what: String, r: Result<usize, braid_core::CommError>| match r {
                        Err(braid_core::CommError::Shutdown { rank }) if rank == me => Ok(()),
                        other => Err(format!("rank {me}: {what} after shutdown gave {other:?}")),
                    };
                    let limit = std::time::Duration::from_secs(10);
                    let early = comm.recv(me, Tag::new(OpId(7), 0));
                    comm.shutdown().await?;
                    let got = tokio::time::timeout(limit, early)
                        .await
                        .map_err(|_| format!("rank {me}: a receive from itself hung"))?;
                    shut(
                        "a receive from itself posted before".into(),
                        got.map(|b| b.len()),
                    )?;
                    for peer in [me, (me + 1) % ctx.nranks()] {
                        let tag = Tag::new(OpId(8), 0);
                        let sent = comm.send(peer, tag, Buffer::from_vec(vec![1, 2, 3])).await;
                        shut(format!("a send to {peer}"), sent.map(|_| 0))?;
                        let got = tokio::time::timeout(limit, comm.recv(peer, tag))
                            .await
                            .map_err(|_| format!("rank {me}: a receive from {peer} hung"))?;
                        shut(format!("a receive from {peer}"), got.map(|b| b.len()))?;
                    }
                    println!("after-shutdown ok");
                }
                "graph-nodes" => {
                    braid_tests::graph_suite::concurrent_collective_nodes(ctx.clone()).await?;
                    braid_tests::graph_suite::concurrent_graphs(ctx.clone()).await?;
                    println!("graph-nodes ok");
                }
                "threads" => {
                    let workers = tokio::runtime::Handle::current().metrics().num_workers();
                    let waiting = |b| format!("{:?}", ctx.progress().waiting(b));
                    println!("threads {workers} {} {}", waiting(8), waiting(1 << 20));
                }
                other => return Err(format!("unknown mode {other:?}").into()),
            }
            Ok(())
        }
    });
    let me: Option<u64> = std::env::var("BRAID_RANK")
        .ok()
        .and_then(|r| r.parse().ok());
    if args.first().map(String::as_str) == Some("fail-late") && me == Some(arg) {
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
    match res {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            // One write: ranks share mpirun's stderr, and a line in pieces
            // interleaved with the others'.
            let line = format!("error: {e}\n");
            eprint!("{line}");
            // 3 for a failure of this rank's own, `PEER_FAILED_EXIT` where
            // it only passes on another rank's.
            match braid_core::world::caused_by_peer(&e) {
                Some(_) => ExitCode::from(braid_core::world::PEER_FAILED_EXIT),
                None => ExitCode::from(3),
            }
        }
    }
}

/// `orphan LEN` (mpi): every rank starts a send of LEN bytes to the next
/// rank and drops it and its communicator without a shutdown, then lives
/// on for 3 s. The engine shuts down for the lost handles (the send
/// finishes, MPI is finalised) instead of finalising under a live
/// request; prints `orphan ok` once the 3 s are over.
#[cfg(feature = "mpi")]
fn orphan(len: usize) -> ExitCode {
    use braid_core::Communicator as _;
    let comm = match braid_core::comm::mpi::MpiComm::init() {
        Ok(c) => c,
        Err(e) => {
            // One write: ranks share mpirun's stderr.
            let line = format!("error: {e}\n");
            eprint!("{line}");
            return ExitCode::from(2);
        }
    };
    let (me, n) = (comm.rank(), comm.nranks());
    let send = comm.send(
        (me + 1) % n,
        Tag::new(OpId(6), 0),
        Buffer::from_vec(payload(48, len)),
    );
    drop(send);
    drop(comm);
    std::thread::sleep(std::time::Duration::from_secs(3));
    println!("orphan ok");
    ExitCode::SUCCESS
}
