//! Point-to-point correctness over every backend and rank count: every
//! ordered pair exchanges random messages (0 B to 64 MiB) over interleaved
//! tags; every byte and the per-(src, tag) order are checked by the
//! receiver, and the totals are checked here against the plan.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail by panicking

use std::sync::Arc;

use braid_core::comm::local::LocalComm;
use braid_core::comm::tcp::TcpComm;
use braid_core::launch::{LaunchSpec, OutputMode, launch};
use braid_core::{Communicator, Rank};
use braid_tests::{RANK_COUNTS, exchange, expected_summary, runtime};

fn run_exchange(comms: Vec<Arc<dyn Communicator>>, seed: u64) {
    let n = comms.len() as u32;
    let rt = runtime();
    rt.block_on(async move {
        let mut hs = Vec::new();
        for c in comms {
            hs.push(tokio::spawn(async move {
                let r = c.rank();
                (r, exchange(c, seed).await)
            }));
        }
        for h in hs {
            let (r, res) = h.await.expect("task");
            let got = res.unwrap_or_else(|e| panic!("rank {r}: {e}"));
            assert_eq!(got, expected_summary(seed, n, r), "rank {r} of {n}");
        }
    });
}

#[test]
fn local_all_pairs_exchange() {
    for n in RANK_COUNTS {
        let comms = LocalComm::world(n)
            .into_iter()
            .map(|c| Arc::new(c) as Arc<dyn Communicator>)
            .collect();
        run_exchange(comms, 1000 + n as u64);
    }
}

#[test]
fn tcp_in_process_all_pairs_exchange() {
    for n in [2u32, 5] {
        let rt = runtime();
        let comms: Vec<Arc<dyn Communicator>> = rt
            .block_on(TcpComm::in_process_world(n))
            .expect("world")
            .into_iter()
            .map(|c| Arc::new(c) as Arc<dyn Communicator>)
            .collect();
        // Keep the runtime that owns the connections alive while they run.
        rt.block_on(async {
            let mut hs = Vec::new();
            for c in comms {
                hs.push(tokio::spawn(async move {
                    let r = c.rank();
                    let res = exchange(c.clone(), 77).await;
                    c.shutdown().await.expect("shutdown");
                    (r, res)
                }));
            }
            for h in hs {
                let (r, res) = h.await.expect("task");
                assert_eq!(res.expect("exchange"), expected_summary(77, n, r));
            }
        });
    }
}

fn worker() -> &'static str {
    env!("CARGO_BIN_EXE_braid-test-worker")
}

/// Parses `PREFIX a b` from a rank's captured output.
fn parse_line(out: &str, prefix: &str) -> Option<Vec<u64>> {
    out.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .map(|rest| {
            rest.split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect()
        })
}

#[test]
fn tcp_processes_all_pairs_exchange() {
    let rt = runtime();
    for n in RANK_COUNTS {
        let seed = 5000 + n as u64;
        let mut spec = LaunchSpec::new(
            n,
            worker(),
            vec!["exchange".into(), seed.to_string().into()],
        );
        spec.output = OutputMode::Captured;
        let report = rt
            .block_on(launch(spec))
            .unwrap_or_else(|e| panic!("{n} ranks: {e:?}"));
        for r in 0..n as Rank {
            let got = parse_line(&report.stdout[r as usize], "exchange ok ").unwrap_or_else(|| {
                panic!(
                    "rank {r} of {n} printed no summary: {:?}",
                    report.stderr[r as usize]
                )
            });
            let want = expected_summary(seed, n, r);
            assert_eq!(got, vec![want.messages, want.bytes], "rank {r} of {n}");
        }
    }
}

#[test]
fn tcp_processes_one_gib_message() {
    let rt = runtime();
    let size: u64 = 1 << 30;
    let mut spec = LaunchSpec::new(2, worker(), vec!["big".into(), size.to_string().into()]);
    spec.output = OutputMode::Captured;
    let report = rt.block_on(launch(spec)).expect("launch");
    assert_eq!(parse_line(&report.stdout[1], "big ok "), Some(vec![size]));
}

/// A message over the tcp frame limit fails at the sender with an error
/// that names it; the next message within the limit still goes through.
#[test]
fn tcp_message_over_the_limit_is_refused_at_the_sender() {
    use braid_core::comm::tcp::{TcpConfig, random_token};
    use braid_core::{Buffer, CommError, Tag};
    let rt = runtime();
    rt.block_on(async {
        let root = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("bind");
        let addr = root.local_addr().expect("addr").to_string();
        let token = random_token();
        let cfg = |r| {
            let mut c = TcpConfig::new(r, 2, addr.clone(), token.clone());
            c.max_message_bytes = 1024;
            c
        };
        let a = tokio::spawn(TcpComm::with_listener(cfg(0), root));
        let b = tokio::spawn(TcpComm::connect(cfg(1)));
        let a = a.await.expect("task").expect("rank 0");
        let b = b.await.expect("task").expect("rank 1");
        let tag = Tag::new(braid_core::OpId(1), 0);
        match a.send(1, tag, Buffer::from_vec(vec![7u8; 1025])).await {
            Err(CommError::MessageTooLarge {
                rank: 0,
                peer: 1,
                size: 1025,
                limit: 1024,
                ..
            }) => {}
            other => panic!("expected MessageTooLarge, got {other:?}"),
        }
        a.send(1, tag, Buffer::from_vec(vec![9u8; 1024]))
            .await
            .expect("a message at the limit");
        let got = b.recv(0, tag).await.expect("recv");
        assert_eq!(got.as_slice(), &[9u8; 1024][..]);
        let (x, y) = tokio::join!(a.shutdown(), b.shutdown());
        x.expect("shutdown 0");
        y.expect("shutdown 1");
    });
}
