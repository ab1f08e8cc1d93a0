//! tcp worlds created and dropped in a loop in one process release their
//! sockets (a test of its own: it counts this process's descriptors).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail by panicking

use std::time::{Duration, Instant};

use braid_core::comm::tcp::TcpComm;
use braid_core::tag::OpId;
use braid_core::{Buffer, Communicator, Tag};
use braid_tests::runtime;

/// Descriptors this process has open.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Worlds of 3 tcp ranks, each exchanging messages (small and striped),
/// shut down and dropped, 15 times: the descriptors come back to where
/// they were. Before, each dropped world kept every socket open (each
/// rank's readers waited on peers' sockets that those peers' readers kept
/// alive) until the runtime ended: 12 -> 372 descriptors, ~800 MiB.
#[cfg(target_os = "linux")]
#[test]
fn dropped_tcp_worlds_release_their_sockets() {
    let rt = runtime();
    rt.block_on(async {
        // One world first: the runtime's own descriptors (its reactor,
        // blocking threads) are then in the baseline.
        let warm = TcpComm::in_process_world(2).await.unwrap();
        futures::future::try_join_all(warm.iter().map(|c| c.shutdown()))
            .await
            .unwrap();
        drop(warm);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before = open_fds();
        for round in 0..15u32 {
            let comms = TcpComm::in_process_world(3).await.unwrap();
            let n = comms.len() as u32;
            for (stage, size) in [(0u8, 300_000usize), (1, 16 << 20)] {
                let tag = Tag::new(OpId(round), stage);
                let sends: Vec<_> = comms
                    .iter()
                    .map(|c| {
                        let data = Buffer::from_vec(vec![c.rank() as u8; size]);
                        c.send((c.rank() + 1) % n, tag, data)
                    })
                    .collect();
                let recvs = comms.iter().map(|c| c.recv((c.rank() + n - 1) % n, tag));
                let (got, _) = futures::future::try_join(
                    futures::future::try_join_all(recvs),
                    futures::future::try_join_all(sends),
                )
                .await
                .unwrap();
                for (r, g) in got.iter().enumerate() {
                    let from = (r as u32 + n - 1) % n;
                    assert_eq!(g.len(), size);
                    assert!(g.as_slice().iter().all(|b| *b == from as u8));
                }
            }
            futures::future::try_join_all(comms.iter().map(|c| c.shutdown()))
                .await
                .unwrap();
            drop(comms);
        }
        // Dropped ranks let their queued notices out for a moment, then
        // close: give that time.
        let until = Instant::now() + Duration::from_secs(20);
        let mut now = open_fds();
        while now > before + 4 && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(100)).await;
            now = open_fds();
        }
        assert!(
            now <= before + 4,
            "{before} descriptors before 15 worlds, {now} after they were dropped"
        );
    });
}

/// A receive made before its rank's `TcpComm` was dropped (without a
/// shutdown) fails soon after, on that rank and on the peer it waited
/// for, instead of waiting for a message no task reads any more.
#[test]
fn a_receive_outliving_its_dropped_rank_fails() {
    let rt = runtime();
    rt.block_on(async {
        for n in [2u32, 3] {
            let mut comms = TcpComm::in_process_world(n).await.unwrap();
            let tag = Tag::new(OpId(1), 0);
            let gone = comms.remove(0);
            let mine = gone.recv(1, tag);
            let theirs: Vec<_> = comms.iter().map(|c| c.recv(0, tag)).collect();
            drop(gone);
            let mine = tokio::time::timeout(Duration::from_secs(20), mine)
                .await
                .expect("the dropped rank's receive still waits");
            let e = mine.expect_err("a receive on a dropped rank gave data");
            assert!(e.to_string().contains("shut down"), "{e}");
            for (r, f) in theirs.into_iter().enumerate() {
                let got = tokio::time::timeout(Duration::from_secs(20), f)
                    .await
                    .unwrap_or_else(|_| panic!("rank {}'s receive from 0 still waits", r + 1));
                let e = got.expect_err("a receive from the dropped rank gave data");
                assert!(e.to_string().contains("rank 0"), "{e}");
            }
        }
    });
}

/// Sends still queued when their rank's `TcpComm` is dropped (without a
/// shutdown) end, done or failed as shut down, instead of waiting for
/// ever: the connection task stopped at the close and left the rest of
/// its queue unanswered.
#[test]
fn sends_outliving_their_dropped_rank_end() {
    let rt = runtime();
    rt.block_on(async {
        // Before the data connection is made, and once it carries data.
        for round in 0..4u32 {
            let mut comms = TcpComm::in_process_world(2).await.unwrap();
            let tag = Tag::new(OpId(round), 0);
            let gone = comms.remove(0);
            if round % 2 == 1 {
                let first = Tag::new(OpId(100 + round), 0);
                let (sent, got) = futures::future::join(
                    gone.send(1, first, Buffer::from_vec(vec![1u8; 8])),
                    comms[0].recv(0, first),
                )
                .await;
                sent.unwrap();
                assert_eq!(got.unwrap().as_slice(), &[1u8; 8]);
            }
            // 256 MiB in 1000 frames: far more than is written before the
            // drop's close, and more than one write's batch of frames.
            let data = Buffer::from_vec(vec![7u8; 256 << 10]);
            let sends: Vec<_> = (0..1000).map(|_| gone.send(1, tag, data.clone())).collect();
            drop(gone);
            let ended =
                tokio::time::timeout(Duration::from_secs(30), futures::future::join_all(sends))
                    .await
                    .unwrap_or_else(|_| {
                        panic!("round {round}: a send of the dropped rank still waits")
                    });
            let failed: Vec<_> = ended.iter().filter_map(|r| r.as_ref().err()).collect();
            for e in &failed {
                assert!(e.to_string().contains("shut down"), "{e}");
            }
            eprintln!("round {round}: {} of 1000 sends failed", failed.len());
        }
    });
}
