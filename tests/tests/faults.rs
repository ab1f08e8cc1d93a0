//! Fault tests of the tcp backend: a killed rank, a wrong token, random
//! bytes on a rank's port, a second data connection from one rank, a frame
//! claiming more memory than there is.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail by panicking

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid_core::comm::tcp::TcpComm;
use braid_core::comm::tcp::wire::{Answer, ConnKind, FrameHeader, Hello};
use braid_core::{CommError, Communicator, OpId, Tag};
use braid_tests::{exchange, expected_summary, payload, runtime};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port()
}

/// Starts `n` worker ranks in `wait` mode, kills `victim` once all are
/// ready, and checks every other rank fails within 30 s naming the victim.
fn killed_rank(n: u32, victim: u32) {
    let root = format!("127.0.0.1:{}", free_port());
    let mut children = Vec::new();
    for r in 0..n {
        let c = Command::new(env!("CARGO_BIN_EXE_braid-test-worker"))
            .arg("wait")
            .env("BRAID_RANK", r.to_string())
            .env("BRAID_NRANKS", n.to_string())
            .env("BRAID_ROOT", &root)
            .env("BRAID_TOKEN", "kill-test")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        children.push(c);
    }
    braid_tests::killed_rank_is_named(&mut children, victim as usize, Duration::from_secs(30));
}

#[test]
fn killed_rank_fails_the_others() {
    killed_rank(3, 1);
    killed_rank(4, 0);
}

fn in_process(n: u32, rt: &tokio::runtime::Runtime) -> Vec<Arc<TcpComm>> {
    rt.block_on(TcpComm::in_process_world(n))
        .expect("world")
        .into_iter()
        .map(Arc::new)
        .collect()
}

fn exchange_all(rt: &tokio::runtime::Runtime, comms: &[Arc<TcpComm>], seed: u64) {
    let n = comms.len() as u32;
    rt.block_on(async {
        let mut hs = Vec::new();
        for c in comms {
            let c = c.clone() as Arc<dyn Communicator>;
            hs.push(tokio::spawn(
                async move { (c.rank(), exchange(c, seed).await) },
            ));
        }
        for h in hs {
            let (r, res) = h.await.expect("task");
            assert_eq!(res.expect("exchange"), expected_summary(seed, n, r));
        }
    });
}

#[test]
fn wrong_token_is_refused_and_job_carries_on() {
    let rt = runtime();
    let comms = in_process(3, &rt);
    let target = comms[1].listen_addr();
    let mut s = std::net::TcpStream::connect(target).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let hello = Hello {
        kind: ConnKind::Data { lane: 0 },
        token: b"not-the-token".to_vec(),
        rank: 0,
        nranks: 3,
    };
    s.write_all(&hello.encode()).expect("write");
    // The server refuses it, saying why, and closes the connection.
    assert_eq!(
        answer(&mut s),
        Answer::Refused(
            "rank 1's job token is another (a process of another job, or BRAID_TOKEN differs between ranks)"
                .into()
        ),
        "a wrong token must not be acknowledged"
    );
    exchange_all(&rt, &comms, 11);
    assert_eq!(comms[1].statistics().rejected_connections(), 1);
    assert_eq!(comms[0].statistics().rejected_connections(), 0);
}

#[test]
fn random_bytes_on_a_port_are_an_error_not_a_panic() {
    let rt = runtime();
    let comms = in_process(2, &rt);
    for (i, c) in comms.iter().enumerate() {
        for k in 0..4u64 {
            let mut s = std::net::TcpStream::connect(c.listen_addr()).expect("connect");
            // Random bytes; for k == 0 a hello-looking start that claims a
            // huge token, to make sure no such allocation happens.
            let mut junk = payload(k * 31 + i as u64, 4096);
            if k == 0 {
                junk[..4].copy_from_slice(b"BRDH");
                junk[4..6].copy_from_slice(&1u16.to_le_bytes());
                junk[6] = 1;
                junk[7..9].copy_from_slice(&u16::MAX.to_le_bytes());
            }
            let _ = s.write_all(&junk);
            let mut b = [0u8; 1];
            s.set_read_timeout(Some(Duration::from_secs(20)))
                .expect("timeout");
            assert_eq!(s.read(&mut b).unwrap_or(0), 0);
        }
    }
    exchange_all(&rt, &comms, 12);
    for c in &comms {
        assert_eq!(c.statistics().rejected_connections(), 4);
    }
}

/// Two tcp ranks in this process whose token the test knows (to connect
/// as one of them), accepting messages of up to `max_message` bytes.
fn two_ranks(rt: &tokio::runtime::Runtime, token: &str, max_message: u64) -> Vec<Arc<TcpComm>> {
    rt.block_on(async {
        let root = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("bind");
        let addr = root.local_addr().expect("addr").to_string();
        let cfg = |r| {
            let mut c = braid_core::comm::tcp::TcpConfig::new(r, 2, addr.clone(), token);
            c.max_message_bytes = max_message;
            c
        };
        let a = tokio::spawn(TcpComm::with_listener(cfg(0), root));
        let b = tokio::spawn(TcpComm::connect(cfg(1)));
        vec![
            Arc::new(a.await.expect("task").expect("rank 0")),
            Arc::new(b.await.expect("task").expect("rank 1")),
        ]
    })
}

/// A raw data connection to `comms[1]` presenting itself as rank 0 on
/// `lane` (the opening written; the answer is the caller's to read).
fn data_connection(comms: &[Arc<TcpComm>], token: &str, lane: u8) -> std::net::TcpStream {
    let mut s = std::net::TcpStream::connect(comms[1].listen_addr()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let hello = Hello {
        kind: ConnKind::Data { lane },
        token: token.as_bytes().to_vec(),
        rank: 0,
        nranks: 2,
    };
    s.write_all(&hello.encode()).expect("write");
    s
}

/// The answer to an opening written on `s` (the whole of it read).
fn answer(s: &mut std::net::TcpStream) -> Answer {
    let mut bytes = Vec::new();
    let _ = s.read_to_end(&mut bytes);
    let rt = runtime();
    rt.block_on(Answer::read(&mut &bytes[..]))
        .unwrap_or_else(|e| panic!("no answer ({e}): {bytes:?}"))
}

/// The error a receive of (0, `tag`) on `comm` fails with, within 20 s.
fn receive_failure(rt: &tokio::runtime::Runtime, comm: &TcpComm, tag: Tag) -> CommError {
    rt.block_on(async { tokio::time::timeout(Duration::from_secs(20), comm.recv(0, tag)).await })
        .expect("the rank fails in time")
        .expect_err("no such message can be received")
}

/// A second data connection from a rank that has one (the right token and
/// all) is refused: two would interleave its messages and break their
/// per-tag order. The job carries on over the first.
#[test]
fn a_second_data_connection_from_one_rank_is_refused() {
    let rt = runtime();
    let token = braid_core::comm::tcp::random_token();
    let comms = two_ranks(
        &rt,
        &token,
        braid_core::comm::tcp::TcpConfig::DEFAULT_MAX_MESSAGE,
    );
    // Rank 0's data connection to rank 1 exists after an exchange.
    exchange_all(&rt, &comms, 21);
    let mut s = data_connection(&comms, &token, 0);
    assert_eq!(
        answer(&mut s),
        Answer::Refused("a second data connection from rank 0 on lane 0".into()),
        "a second data connection must not be acknowledged"
    );
    exchange_all(&rt, &comms, 22);
    assert_eq!(comms[1].statistics().rejected_connections(), 1);
}

/// A frame that claims more bytes than the host can allocate (a peer with a
/// corrupted header, under a limit raised as far as it goes) fails the
/// receiving rank with an error that names the peer: the process must not
/// abort on the allocation.
#[test]
fn a_frame_claiming_more_memory_than_exists_fails_the_rank() {
    let rt = runtime();
    let token = braid_core::comm::tcp::random_token();
    let comms = two_ranks(&rt, &token, u64::MAX);
    // Nothing has gone from rank 0 to rank 1 yet, so a data connection as
    // rank 0 is its first and is accepted.
    let mut s = data_connection(&comms, &token, 0);
    let mut b = [0u8; 1];
    assert_eq!(
        s.read(&mut b).expect("ack"),
        1,
        "the connection is accepted"
    );
    let tag = Tag::new(OpId(5), 0);
    let header = FrameHeader {
        tag,
        len: 1 << 62,
        pieces: 0,
    };
    s.write_all(&header.encode()).expect("write");
    let err = receive_failure(&rt, &comms[1], tag);
    assert!(
        matches!(
            err,
            CommError::Io {
                rank: 1,
                peer: Some(0),
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("cannot allocate"), "{err}");
    // Rank 0 (in this process, so no process exit tells it) hears of rank
    // 1's failure through the control plane, in bounded time.
    let heard = rt.block_on(async {
        let t = Instant::now();
        loop {
            if let Some(e) = comms[0].failure() {
                return Some(e);
            }
            if t.elapsed() > Duration::from_secs(20) {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    let heard = heard.expect("rank 0 hears of rank 1's failure");
    assert!(
        matches!(
            heard,
            CommError::Aborted {
                rank: 0,
                peer: 1,
                ..
            }
        ) && heard.to_string().contains("cannot allocate"),
        "{heard}"
    );
}

/// A striped message whose piece on another lane disagrees with what lane
/// 0 announced (a peer with a different idea of the split, or a corrupted
/// header) fails the receiving rank with an error that names the peer and
/// the lane, in bounded time; nothing half-written is delivered.
#[test]
fn a_lane_piece_that_disagrees_with_its_announcement_fails_the_rank() {
    let rt = runtime();
    let token = braid_core::comm::tcp::random_token();
    let comms = two_ranks(
        &rt,
        &token,
        braid_core::comm::tcp::TcpConfig::DEFAULT_MAX_MESSAGE,
    );
    let connect = |lane: u8| {
        let mut s = data_connection(&comms, &token, lane);
        let mut b = [0u8; 1];
        assert_eq!(s.read(&mut b).expect("ack"), 1, "lane {lane} accepted");
        s
    };
    let tag = Tag::new(OpId(9), 1);
    let len: u64 = 1 << 20;
    // Lane 0: a message of 1 MiB in 2 pieces, and piece 0 (512 KiB).
    let mut main = connect(0);
    let header = FrameHeader {
        tag,
        len,
        pieces: 2,
    };
    main.write_all(&header.encode()).expect("write");
    main.write_all(&vec![7u8; (len / 2) as usize])
        .expect("write");
    // Lane 1: a piece 8 bytes short of the 512 KiB announced.
    let mut lane = connect(1);
    let piece = FrameHeader {
        tag,
        len: len / 2 - 8,
        pieces: 0,
    };
    lane.write_all(&piece.encode()).expect("write");
    let err = receive_failure(&rt, &comms[1], tag);
    assert!(
        matches!(
            err,
            CommError::Protocol {
                rank: 1,
                peer: Some(0),
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("lane 1"), "{err}");
}

/// A root address where no braid rank answers fails the rank within its
/// timeout. What the address does depends on the network (unreachable,
/// refused, answered by a proxy that is not braid, or SYNs dropped, which
/// without the bounded connect held an attempt for the OS's connect
/// timeout of minutes).
#[test]
fn an_unanswering_root_fails_within_the_timeout() {
    let rt = runtime();
    let mut cfg = braid_core::comm::tcp::TcpConfig::new(
        1,
        2,
        "10.255.255.1:9",
        braid_core::comm::tcp::random_token(),
    );
    cfg.timeout = Duration::from_secs(2);
    let t0 = Instant::now();
    let r = rt.block_on(TcpComm::connect(cfg));
    let took = t0.elapsed();
    assert!(r.is_err(), "connected to a blackholed address");
    // A bound on a hang, not a speed check: the OS's own connect timeout
    // is over two minutes.
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

/// A send that only its own rank sees fail (a broadcast's data that would
/// take more than 65536 pieces of the message limit, refused at the
/// sender before any byte moves) aborts the job: the receiver, which waits
/// for the frame, gets an error in bounded time instead of waiting
/// forever. (Data over the limit in fewer pieces goes through:
/// `coll.rs`'s `suite_tcp_in_pieces`.)
#[test]
fn a_send_refused_at_the_sender_fails_the_receiver_too() {
    let rt = runtime();
    let token = braid_core::comm::tcp::random_token();
    let comms = two_ranks(&rt, &token, 1024);
    let res: Vec<Result<(), String>> = rt.block_on(async {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                let ctx =
                    braid_core::world::context_for(c.clone(), braid_core::MemoryLimits::UNLIMITED);
                tokio::spawn(async move {
                    // 65537 pieces of 1024 bytes.
                    let data = (ctx.rank() == 0)
                        .then(|| braid_core::Buffer::from_vec(vec![7u8; 1024 * 65537]));
                    braid_coll::broadcast(&ctx, 0, data)
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        let mut out = Vec::new();
        for h in hs {
            let r = tokio::time::timeout(Duration::from_secs(30), h)
                .await
                .expect("a rank hung")
                .expect("task");
            out.push(r);
        }
        out
    });
    let e0 = res[0].as_ref().expect_err("the root's send is refused");
    assert!(e0.contains("1024"), "rank 0: {e0}");
    let e1 = res[1].as_ref().expect_err("the receiver hears of it");
    assert!(e1.contains("rank 0"), "rank 1: {e1}");
}

/// Sends refused on every rank at once (a ring step, a halo exchange, an
/// AllToAll, an AllReduce, each rank's parts more than 65536 pieces of
/// tcp's message limit): each rank's own refused send fails its call in
/// bounded time. Before, the calls awaited their receives first, from
/// peers whose sends had failed alike, and every rank waited forever (seen
/// over MPI, whose limit is 2 GiB, before parts over it went as pieces).
#[test]
fn sends_refused_on_every_rank_fail_every_rank() {
    use braid_coll::{HaloExchange, ReduceKind};
    use braid_core::{Buffer, PackedData};
    const LIMIT: u64 = 64;
    // More than the 65536 pieces a frame may be sent as.
    const PART: usize = 65537 * LIMIT as usize;
    let rt = runtime();
    let big = || Buffer::from_vec(vec![3u8; PART]);
    for n in [2u32, 3, 5] {
        for what in [
            "sendrecv",
            "halo",
            "alltoall",
            "allreduce",
            "shuffle",
            "allgather",
        ] {
            let res: Vec<Result<(), String>> = rt.block_on(async {
                let comms = TcpComm::in_process_world_with(n, |c| c.max_message_bytes = LIMIT)
                    .await
                    .expect("world");
                let hs: Vec<_> = comms
                    .into_iter()
                    .map(|c| {
                        let ctx = braid_core::world::context_for(
                            Arc::new(c),
                            braid_core::MemoryLimits::UNLIMITED,
                        );
                        tokio::spawn(async move {
                            let (r, n) = (ctx.rank(), ctx.nranks());
                            let elems = n as usize * PART.div_ceil(8); // 8 B each: a part is PART bytes
                            let out = match what {
                                "sendrecv" => {
                                    braid_coll::sendrecv(&ctx, (r + 1) % n, big(), (r + n - 1) % n)
                                        .await
                                        .map(|_| ())
                                }
                                "halo" => {
                                    let p = || PackedData {
                                        metadata: Default::default(),
                                        data: big(),
                                    };
                                    HaloExchange::new(&ctx).exchange(p(), p()).await.map(|_| ())
                                }
                                "alltoall" => braid_coll::alltoall(&ctx, vec![1i64; elems])
                                    .await
                                    .map(|_| ()),
                                // Several framed chunks to each peer on one
                                // tag: the first refused must not let the
                                // next one's header stand in for its data.
                                "allgather" => {
                                    let ag = braid_coll::AllGather::new(&ctx, None);
                                    let c = || PackedData {
                                        metadata: Default::default(),
                                        data: big(),
                                    };
                                    match ag.insert(0, c()).and_then(|()| ag.insert_last(1, c())) {
                                        Ok(()) => ag
                                            .extract(braid_coll::ExtractOrder::RankSeq)
                                            .await
                                            .map(|_| ()),
                                        Err(e) => Err(e),
                                    }
                                }
                                "shuffle" => {
                                    let sh = braid_coll::Shuffle::new(
                                        &ctx,
                                        n,
                                        braid_coll::PartitionOwner::RoundRobin,
                                        None,
                                    );
                                    let mut res = Ok(());
                                    for pid in 0..n {
                                        for _ in 0..3 {
                                            let c = PackedData {
                                                metadata: Default::default(),
                                                data: big(),
                                            };
                                            res = res.and_then(|()| sh.insert(pid, c));
                                        }
                                    }
                                    match res.and_then(|()| sh.insert_finished()) {
                                        Ok(()) => sh.extract(r).await.map(|_| ()),
                                        Err(e) => Err(e),
                                    }
                                }
                                _ => braid_coll::allreduce(
                                    &ctx,
                                    vec![1.0f64; elems],
                                    ReduceKind::Sum,
                                )
                                .await
                                .map(|_| ()),
                            };
                            out.map_err(|e| e.to_string())
                        })
                    })
                    .collect();
                let mut out = Vec::new();
                for h in hs {
                    let r = tokio::time::timeout(Duration::from_secs(30), h)
                        .await
                        .unwrap_or_else(|_| panic!("{what}, {n} ranks: a rank hung"))
                        .expect("task");
                    out.push(r);
                }
                out
            });
            for (r, x) in res.iter().enumerate() {
                let e = x
                    .as_ref()
                    .expect_err(&format!("{what}, {n} ranks: rank {r} succeeded"));
                assert!(
                    e.contains(&format!("limit of {LIMIT} bytes")),
                    "{what}, {n} ranks, rank {r}: {e}"
                );
            }
        }
    }
}

/// The test worker's `exchange 5` job, with `unset` taken out of its
/// environment (what the test's own environment may hold).
fn exchange_worker(unset: &[&str]) -> Command {
    worker(&["exchange", "5"], unset)
}

/// The test worker with `args`, with `unset` taken out of its environment.
fn worker(args: &[&str], unset: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_braid-test-worker"));
    c.args(args);
    for v in unset {
        c.env_remove(v);
    }
    c
}

/// A process given `BRAID_RANK` but not `BRAID_NRANKS` (a rank started by
/// hand with a variable left out) is refused; before, it ran a whole job
/// of its own and reported success, while the real job waited for it.
#[test]
fn a_rank_without_the_job_size_is_refused() {
    let mut c = exchange_worker(&[
        "BRAID_BACKEND",
        "BRAID_NRANKS",
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "SLURM_STEP_NUM_TASKS",
    ]);
    c.env("BRAID_RANK", "1")
        .env("BRAID_ROOT", "127.0.0.1:9")
        .env("BRAID_TOKEN", "t");
    let out = braid_tests::output_within(&mut c, Duration::from_secs(300));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("rank 1: bootstrap failed: BRAID_RANK=1 is set but BRAID_NRANKS is not"),
        "{err}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("exchange ok"));
}

/// Under an mpirun launch of several processes, tcp variables left in the
/// environment do not make each process a whole one-rank job of its own
/// (they did: the check was skipped where they were set); the refusal
/// names the process's rank (it said "rank unknown").
#[test]
fn tcp_variables_under_an_mpi_launch_are_refused_too() {
    let mut c = exchange_worker(&["BRAID_BACKEND", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"]);
    c.env("OMPI_COMM_WORLD_SIZE", "2")
        .env("OMPI_COMM_WORLD_RANK", "1")
        .env("BRAID_RANK", "0")
        .env("BRAID_NRANKS", "1")
        .env("BRAID_ROOT", "127.0.0.1:0")
        .env("BRAID_TOKEN", "t");
    let out = braid_tests::output_within(&mut c, Duration::from_secs(300));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("rank 1: bootstrap failed: this process is one of 2 started by mpirun")
            && err.contains("BRAID_RANK"),
        "{err}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("exchange ok"));
    // Tcp ranks that the launch started (each its task number, the job its
    // size), or said outright with BRAID_BACKEND=tcp, are taken: they go
    // on to run (rank 1 times out connecting to a closed port here).
    for (rank, nranks, backend) in [("1", "2", None), ("0", "1", Some("tcp"))] {
        c.env("BRAID_RANK", rank)
            .env("BRAID_NRANKS", nranks)
            .env("BRAID_ROOT", "127.0.0.1:9")
            .env("BRAID_TIMEOUT", "1");
        if let Some(b) = backend {
            c.env("BRAID_BACKEND", b);
        }
        let out = braid_tests::output_within(&mut c, Duration::from_secs(300));
        let err = String::from_utf8_lossy(&out.stderr);
        let what = format!("BRAID_RANK={rank} BRAID_NRANKS={nranks} {backend:?}");
        // (Rank 0 of one listens there itself and runs its job.)
        let ran = String::from_utf8_lossy(&out.stdout).contains("exchange ok");
        assert!(
            !err.contains("started by mpirun")
                && (ran || err.contains("waiting for a connection to rank 0")),
            "{what}: {err}"
        );
    }
}

/// A message limit below what a collective's frame needs is refused
/// where it is read (a barrier under one waited for ever: its send was
/// refused, its receive from a peer in the same state never came).
#[test]
fn a_message_limit_below_a_frame_is_refused() {
    for (v, ok) in [("8", false), ("63", false), ("0", false), ("64", true)] {
        let mut c = exchange_worker(&[
            "BRAID_BACKEND",
            "OMPI_COMM_WORLD_SIZE",
            "PMI_SIZE",
            "SLURM_STEP_NUM_TASKS",
        ]);
        c.env("BRAID_RANK", "0")
            .env("BRAID_NRANKS", "1")
            .env("BRAID_ROOT", "127.0.0.1:0")
            .env("BRAID_TOKEN", "t")
            .env("BRAID_MAX_MESSAGE", v);
        let out = braid_tests::output_within(&mut c, Duration::from_secs(300));
        let err = String::from_utf8_lossy(&out.stderr);
        if ok {
            assert!(out.status.success(), "{v}: {err}");
        } else {
            assert!(!out.status.success(), "{v}: {err}");
            assert!(
                err.contains(&format!("BRAID_MAX_MESSAGE={v:?}")) && err.contains("at least 64"),
                "{v}: {err}"
            );
        }
    }
}

/// A program started by mpirun or srun as one of several processes, but
/// not told to use MPI, is refused (each would run a whole job of its own
/// and report success); started as the only one, it runs as a local job.
#[test]
fn a_process_of_an_mpi_launch_without_the_mpi_backend_is_refused() {
    for (var, n) in [
        ("OMPI_COMM_WORLD_SIZE", 3),
        ("PMI_SIZE", 2),
        ("OMPI_COMM_WORLD_SIZE", 1),
    ] {
        let mut c = exchange_worker(&[
            "BRAID_BACKEND",
            "BRAID_RANK",
            "BRAID_NRANKS",
            "BRAID_ROOT",
            "BRAID_TOKEN",
            "OMPI_COMM_WORLD_SIZE",
            "PMI_SIZE",
            "SLURM_STEP_NUM_TASKS",
        ]);
        let out = braid_tests::output_within(c.env(var, n.to_string()), Duration::from_secs(300));
        let err = String::from_utf8_lossy(&out.stderr);
        if n > 1 {
            assert_eq!(out.status.code(), Some(2), "{var}={n}: {err}");
            assert!(
                err.contains(&format!("one of {n} started by mpirun or srun ({var}={n})"))
                    && err.contains("BRAID_BACKEND=mpi"),
                "{var}={n}: {err}"
            );
        } else {
            let so = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && so.contains("exchange ok"),
                "{var}={n}: {so} {err}"
            );
        }
    }
}

/// A mistyped tuning setting is said on standard error (where the program
/// installed no tracing subscriber, as this worker does not), once, and the
/// job runs with the default; before, only a tracing warning said it, which
/// such a program never shows.
#[test]
fn a_mistyped_setting_is_said_without_a_subscriber() {
    // (The `threads` job reads how its rank waits.)
    let mut c = worker(
        &["threads"],
        &[
            "BRAID_BACKEND",
            "BRAID_RANK",
            "BRAID_NRANKS",
            "OMPI_COMM_WORLD_SIZE",
            "PMI_SIZE",
            "SLURM_STEP_NUM_TASKS",
        ],
    );
    c.env("BRAID_MALLOC", "System").env("BRAID_WAIT", "spin");
    let out = braid_tests::output_within(&mut c, Duration::from_secs(300));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("threads "),
        "{err}"
    );
    for said in [
        "braid: BRAID_MALLOC=\"System\" ignored: expected \"system\"",
        "braid: BRAID_WAIT=\"spin\" ignored: expected \"park\" or \"poll\"",
    ] {
        assert_eq!(err.matches(said).count(), 1, "{said:?} in {err}");
    }
}
