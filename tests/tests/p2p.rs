//! Point-to-point correctness over every backend and rank count: every
//! ordered pair exchanges random messages (0 B to 64 MiB) over interleaved
//! tags; every byte and the per-(src, tag) order are checked by the
//! receiver, and the totals are checked here against the plan.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail by panicking

use std::sync::Arc;

use braid_core::comm::local::LocalComm;
use braid_core::comm::tcp::TcpComm;
use braid_core::launch::{LaunchSpec, OutputMode, launch};
use braid_core::{Buffer, CommError, Communicator, OpId, Rank, Tag, Waiting};
use braid_tests::{RANK_COUNTS, exchange, expected_summary, line_values, runtime};

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

/// An `n`-rank tcp world in this process on `rt`, each rank's config
/// adjusted by `configure`.
/// `f`, or a panic naming `what` after 60 s: a test that would hang fails
/// instead, and says where.
async fn bounded<F: std::future::Future>(f: F, what: String) -> F::Output {
    match tokio::time::timeout(std::time::Duration::from_secs(60), f).await {
        Ok(r) => r,
        Err(_) => panic!("{what}: no result in 60 s"),
    }
}

fn tcp_world(
    rt: &tokio::runtime::Runtime,
    n: u32,
    configure: impl Fn(&mut braid_core::comm::tcp::TcpConfig),
) -> Vec<Arc<dyn Communicator>> {
    rt.block_on(TcpComm::in_process_world_with(n, configure))
        .expect("world")
        .into_iter()
        .map(|c| Arc::new(c) as Arc<dyn Communicator>)
        .collect()
}

#[test]
fn tcp_in_process_all_pairs_exchange() {
    for n in [2u32, 5] {
        let rt = runtime();
        let comms = tcp_world(&rt, n, |_| {});
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
            let got =
                line_values(&report.stdout[r as usize], "exchange ok ").unwrap_or_else(|| {
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
    assert_eq!(line_values(&report.stdout[1], "big ok "), Some(vec![size]));
}

/// A rank that computes (sleeps, its communicator untouched) still
/// receives: rank 1's message to rank 0 is in by the time rank 0 asks
/// (the worker's `idle` mode checks the bytes and the statistics).
#[test]
fn tcp_processes_receive_while_a_rank_computes() {
    let rt = runtime();
    for n in [2u32, 3] {
        for len in [65_536u64, 4 << 20] {
            let mut spec =
                LaunchSpec::new(n, worker(), vec!["idle".into(), len.to_string().into()]);
            spec.output = OutputMode::Captured;
            let report = rt
                .block_on(launch(spec))
                .unwrap_or_else(|e| panic!("{n} ranks, {len} bytes: {e:?}"));
            for r in 0..n as usize {
                assert_eq!(
                    line_values(&report.stdout[r], "idle ok "),
                    Some(vec![len]),
                    "rank {r} of {n}, {len} bytes: {:?}",
                    report.stderr[r]
                );
            }
        }
    }
}

/// A message over the tcp frame limit fails at the sender with an error
/// that names it; the next message within the limit still goes through.
#[test]
fn tcp_message_over_the_limit_is_refused_at_the_sender() {
    use braid_core::comm::tcp::{TcpConfig, random_token};

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

/// Receives with a landing (`Communicator::recv_landing`) on every
/// backend: the bytes are always the message's, whether they landed in the
/// zone (tcp, a large message of the landing's length read after the
/// receive was posted) or came as a buffer of their own (a message queued
/// before, a length that differs, a small message, other backends); a
/// landing receive dropped before its message leaves the message to the
/// next receive; the zone's vector comes back with every landed byte.
#[test]
fn landing_receives_get_their_message_on_every_backend() {
    use braid_core::memory::LandingZone;

    use braid_tests::{check_payload, payload};

    async fn run(comms: Vec<Arc<dyn Communicator>>, backend: &str) {
        let (a, b) = (comms[0].clone(), comms[1].clone());
        let tag = |i: u32| Tag::new(OpId(900 + i), 0);
        let big = 3 << 20;
        // 1. Posted first, exact length: lands (tcp) at its offset.
        let zone = LandingZone::new(vec![0u8; big + 100]);
        let recv = b.recv_landing(0, tag(1), zone.landing(100, big).unwrap());
        a.send(1, tag(1), Buffer::from_vec(payload(1, big)))
            .await
            .unwrap();
        let got = recv.await.unwrap();
        assert_eq!(check_payload(1, got.as_slice()), Ok(()), "{backend}");
        let landed = zone.holds(&got, 100);
        assert_eq!(landed, backend == "tcp", "{backend}: landed in place");
        drop(got);
        let v = zone.into_vec().ok().expect("no view left");
        if landed {
            assert_eq!(check_payload(1, &v[100..]), Ok(()), "{backend}");
        }
        assert!(v[..100].iter().all(|x| *x == 0), "{backend}");
        // 2. A message queued before its receive (taken below), and 3. a
        // length that differs from the landing's: the message's own bytes.
        a.send(1, tag(2), Buffer::from_vec(payload(2, big)))
            .await
            .unwrap();
        let zone = LandingZone::new(vec![0u8; 2 * big]);
        let wrong = b.recv_landing(0, tag(3), zone.landing(0, big - 8).unwrap());
        a.send(1, tag(3), Buffer::from_vec(payload(3, big)))
            .await
            .unwrap();
        let got = wrong.await.unwrap();
        assert_eq!(check_payload(3, got.as_slice()), Ok(()), "{backend}");
        assert!(!zone.holds(&got, 0), "{backend}");
        // 4. A small message is never landed.
        let small = b.recv_landing(0, tag(4), zone.landing(big, 1000).unwrap());
        a.send(1, tag(4), Buffer::from_vec(payload(4, 1000)))
            .await
            .unwrap();
        let got = small.await.unwrap();
        assert_eq!(check_payload(4, got.as_slice()), Ok(()), "{backend}");
        assert!(!zone.holds(&got, big), "{backend}");
        // 5. A landing receive dropped before its message: the next
        // receive of that (src, tag) gets it, whole and in order.
        let zone2 = LandingZone::new(vec![0u8; big]);
        drop(b.recv_landing(0, tag(5), zone2.landing(0, big).unwrap()));
        a.send(1, tag(5), Buffer::from_vec(payload(5, big)))
            .await
            .unwrap();
        a.send(1, tag(5), Buffer::from_vec(payload(6, 10)))
            .await
            .unwrap();
        let first = b.recv(0, tag(5)).await.unwrap();
        assert_eq!(check_payload(5, first.as_slice()), Ok(()), "{backend}");
        let second = b.recv(0, tag(5)).await.unwrap();
        assert_eq!(check_payload(6, second.as_slice()), Ok(()), "{backend}");
        // 2 again: the queued message is handed over as it is.
        let zone3 = LandingZone::new(vec![0u8; big]);
        let got = b
            .recv_landing(0, tag(2), zone3.landing(0, big).unwrap())
            .await
            .unwrap();
        assert_eq!(check_payload(2, got.as_slice()), Ok(()), "{backend}");
        assert!(!zone3.holds(&got, 0), "{backend}");
        // 6. Many large messages in a row, each receive posted while the
        // previous one is read: every one whole, landed or not.
        for i in 0..8u32 {
            let len = big + i as usize * 4099;
            let zone = LandingZone::new(vec![0u8; len]);
            let recv = b.recv_landing(0, tag(10 + i), zone.landing(0, len).unwrap());
            let send = a.send(
                1,
                tag(10 + i),
                Buffer::from_vec(payload(10 + i as u64, len)),
            );
            let (s, got) = tokio::join!(send, recv);
            s.unwrap();
            let got = got.unwrap();
            assert_eq!(
                check_payload(10 + i as u64, got.as_slice()),
                Ok(()),
                "{backend} {i}"
            );
        }
        // 7. A landing partly written already, posted first, of the
        // message's length: not landed (its rest is shorter than the
        // message), the message's own bytes whole. It was landed from its
        // filled mark: tcp read the message's first bytes into the rest
        // and its last ones as the next frame; MPI wrote past the landing.
        let zone = LandingZone::new(vec![0u8; big]);
        let mut l = zone.landing(0, big).unwrap();
        assert!(l.put_copied(&[9u8; 10]));
        let recv = b.recv_landing(0, tag(30), l);
        a.send(1, tag(30), Buffer::from_vec(payload(30, big)))
            .await
            .unwrap();
        a.send(1, tag(30), Buffer::from_vec(payload(31, 1000)))
            .await
            .unwrap();
        let got = recv.await.unwrap();
        assert_eq!(check_payload(30, got.as_slice()), Ok(()), "{backend}");
        assert!(!zone.holds(&got, 0), "{backend}");
        let next = b.recv(0, tag(30)).await.unwrap();
        assert_eq!(check_payload(31, next.as_slice()), Ok(()), "{backend}");
    }

    let rt = runtime();
    let local: Vec<Arc<dyn Communicator>> = LocalComm::world(2)
        .into_iter()
        .map(|c| Arc::new(c) as Arc<dyn Communicator>)
        .collect();
    rt.block_on(run(local, "local"));
    let tcp: Vec<Arc<dyn Communicator>> = rt
        .block_on(TcpComm::in_process_world(2))
        .expect("world")
        .into_iter()
        .map(|c| Arc::new(c) as Arc<dyn Communicator>)
        .collect();
    rt.block_on(async {
        run(tcp.clone(), "tcp").await;
        let (a, b) = (tcp[0].clone(), tcp[1].clone());
        let (x, y) = tokio::join!(a.shutdown(), b.shutdown());
        x.unwrap();
        y.unwrap();
    });
}

/// A tcp rank's process runs on its share of the host's cores (at least
/// one worker) and polls for small collectives, offering its core, however
/// many ranks share the host; bulk ones park.
#[test]
fn tcp_processes_run_on_their_share_of_the_cores() {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let rt = runtime();
    for n in RANK_COUNTS {
        let mut spec = LaunchSpec::new(
            n,
            env!("CARGO_BIN_EXE_braid-test-worker"),
            vec!["threads".into()],
        );
        spec.output = OutputMode::Captured;
        let report = rt
            .block_on(launch(spec))
            .unwrap_or_else(|e| panic!("{n} ranks: {e:?}"));
        let want = format!(
            "threads {} {:?} {:?}",
            (cores / n as usize).max(1),
            Waiting::PollYield(Waiting::POLL_BULK),
            Waiting::Park
        );
        for (r, out) in report.stdout.iter().enumerate() {
            assert_eq!(out.trim(), want, "{n} ranks, rank {r}");
        }
    }
}

/// The tcp reader's boundaries (`braid_core::comm::tcp`'s reader): frames
/// whose headers and payloads straddle its 32 KiB socket reads, the 64 KiB
/// from which payloads land in place, and a waiting receive's 64 KiB turn,
/// in a shuffled stream over three tags. Receives that spin (each poll
/// reads the socket itself, racing the connection's task), receives posted
/// late (the task has read the message), and landing receives take them in
/// turn; every byte, length and the per-tag order are checked.
#[test]
fn tcp_reader_boundaries_spinning_late_and_landing_receives() {
    use braid_core::memory::LandingZone;
    use braid_core::{Buffer, OpId, Tag};
    use braid_tests::{check_payload, payload};

    const K: usize = 1 << 10;
    let bases = [
        0,
        1,
        23,
        24,
        25,
        1000,
        32 * K - 25,
        32 * K - 24,
        32 * K - 1,
        32 * K,
        32 * K + 1,
        64 * K - 1,
        64 * K,
        64 * K + 1,
        96 * K + 7,
        128 * K + 24,
        1 << 20,
    ];
    // Each size three times, shuffled by a fixed LCG (fresh per seed).
    for seed in [11u64, 12] {
        let mut sizes: Vec<usize> = bases.iter().chain(&bases).chain(&bases).copied().collect();
        let mut x = seed;
        for i in (1..sizes.len()).rev() {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            sizes.swap(i, (x >> 33) as usize % (i + 1));
        }
        let rt = runtime();
        rt.block_on(async move {
            // One lane: a 24 MiB message below goes whole, as one frame
            // whose late receive takes over its rest (a striped one is
            // read into a pooled buffer where no receive was posted first).
            let comms = TcpComm::in_process_world_with(2, |c| c.lanes = Some(1))
                .await
                .expect("world");
            let comms: Vec<Arc<dyn Communicator>> = comms
                .into_iter()
                .map(|c| Arc::new(c) as Arc<dyn Communicator>)
                .collect();
            let (a, b) = (comms[0].clone(), comms[1].clone());
            let tag = |i: usize| Tag::new(OpId(700 + (i % 3) as u32), 0);
            let pseed = move |i: usize| seed * 1000 + i as u64;
            let plan = sizes.clone();
            let sender = tokio::spawn(async move {
                for (i, len) in plan.iter().enumerate() {
                    a.send(1, tag(i), Buffer::from_vec(payload(pseed(i), *len)))
                        .await
                        .expect("send");
                    if i % 5 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
                a
            });
            for (i, len) in sizes.iter().enumerate() {
                let got = match i % 3 {
                    // Spins: polls its receive (which reads the socket)
                    // until the message is there.
                    0 => {
                        let mut f = std::pin::pin!(b.recv(0, tag(i)));
                        std::future::poll_fn(|cx| match f.as_mut().poll(cx) {
                            std::task::Poll::Ready(r) => std::task::Poll::Ready(r),
                            std::task::Poll::Pending => {
                                cx.waker().wake_by_ref();
                                std::task::Poll::Pending
                            }
                        })
                        .await
                    }
                    // Late: the connection's task has read it (or is at it).
                    1 => {
                        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                        b.recv(0, tag(i)).await
                    }
                    // A landing of the message's length.
                    _ => {
                        let zone = LandingZone::new(vec![0u8; *len + 8]);
                        // The view (landed or not) outlives the zone's
                        // handle, dropped at the end of this block.
                        b.recv_landing(0, tag(i), zone.landing(8, *len).expect("landing"))
                            .await
                    }
                }
                .unwrap_or_else(|e| panic!("seed {seed}, message {i} ({len} B): {e}"));
                assert_eq!(got.len(), *len, "seed {seed}, message {i}");
                assert_eq!(
                    check_payload(pseed(i), got.as_slice()),
                    Ok(()),
                    "seed {seed}, message {i} ({len} B)"
                );
            }
            let a = sender.await.expect("sender");
            // A landing receive posted while its (large) message is being
            // read into a buffer of its own: the rest lands in place after
            // one copy of what came before. Timing decides where the
            // receive comes: tries post it 0.3 to 5 ms after the send, over
            // and over, until one is seen landing part of its message (the
            // statistics count landed bytes), for up to 20 s. (A fixed 20
            // or 60 tries all missed the read in 1 run of 5 on a 2-core host
            // while the other tests ran: starved of the cores, this task
            // woke only after whole transfers.)
            let big = 24 << 20;
            let mut late_claims = 0;
            let mut tries = Vec::new();
            let since = std::time::Instant::now();
            for t in 0u64.. {
                if since.elapsed() > std::time::Duration::from_secs(20) {
                    break;
                }
                let s = pseed(10_000 + t as usize);
                let send = a.send(1, tag(0), Buffer::from_vec(payload(s, big)));
                let sending = tokio::spawn(send);
                tokio::time::sleep(std::time::Duration::from_micros(300 + 200 * (t % 25))).await;
                let zone = LandingZone::new(vec![0u8; big]);
                let before = b.statistics().landed_bytes();
                let got = b
                    .recv_landing(0, tag(0), zone.landing(0, big).expect("landing"))
                    .await
                    .expect("late landing receive");
                sending.await.expect("task").expect("send");
                let landed = b.statistics().landed_bytes() - before;
                assert_eq!(got.len(), big);
                assert_eq!(check_payload(s, got.as_slice()), Ok(()), "try {t}");
                if zone.holds(&got, 0) && landed > 0 && landed < big as u64 {
                    late_claims += 1;
                    break;
                }
                tries.push(zone.holds(&got, 0));
            }
            let whole = tries.iter().filter(|x| **x).count();
            assert_eq!(
                late_claims,
                1,
                "no receive came while its message was read: {} tries, {whole} landed whole, the rest read before their receive",
                tries.len()
            );
            let (x, y) = tokio::join!(a.shutdown(), b.shutdown());
            x.expect("shutdown 0");
            y.expect("shutdown 1");
        });
    }
}

/// Over tcp a large message goes in pieces over several connections
/// (lanes): with every lane count, and ranks that use different counts,
/// each message arrives whole (every byte checked), in order with the
/// small and large messages around it on its tag, into the landing of a
/// receive posted first (the bytes then in the caller's memory) or into a
/// pooled buffer for a receive posted later.
#[test]
fn tcp_striped_messages_arrive_whole_and_in_order() {
    use braid_core::comm::tcp::TcpConfig;
    use braid_core::memory::LandingZone;
    use braid_core::{Buffer, OpId, Tag};
    use braid_tests::{check_payload, payload};

    // Sizes around the split points: below and at two 512 KiB pieces,
    // pieces that are not multiples of 4 KiB, a few MiB.
    const SIZES: [usize; 9] = [
        0,
        1000,
        (1 << 20) - 1,
        1 << 20,
        (1 << 20) + 1,
        (2 << 20) + 4095,
        3 << 20,
        (5 << 20) + 12345,
        9 << 20,
    ];
    let seed = |src: Rank, i: usize| 7000 + 100 * src as u64 + i as u64;
    let tag = |i: usize| Tag::new(OpId(4000 + (i % 3) as u32), (i % 2) as u8);

    let rt = runtime();
    for (n, lanes) in [(2u32, [2u8, 2]), (2, [4, 3]), (3, [3, 8]), (2, [1, 8])] {
        let comms = tcp_world(&rt, n, |c: &mut TcpConfig| {
            c.lanes = Some(lanes[c.rank as usize % 2]);
        });
        rt.block_on(async {
            let ready = Arc::new(tokio::sync::Barrier::new(n as usize));
            let mut hs = Vec::new();
            for c in comms.clone() {
                let ready = ready.clone();
                hs.push(tokio::spawn(async move {
                    let (me, n) = (c.rank(), c.nranks());
                    // Receives first: from each peer, the odd messages
                    // into landings posted now (in order per tag).
                    let mut landed = Vec::new();
                    for src in (0..n).filter(|s| *s != me) {
                        for (i, &len) in SIZES.iter().enumerate().filter(|(i, _)| i % 2 == 1) {
                            let zone = LandingZone::new(vec![0u8; len + 8]);
                            let l = zone.landing(8, len).expect("landing");
                            landed.push((src, i, zone, c.recv_landing(src, tag(i), l)));
                        }
                    }
                    // Every rank's receives are posted before any rank
                    // sends (else a message may come first, and go to a
                    // pooled buffer instead of its landing).
                    bounded(
                        ready.wait(),
                        format!("rank {me}: ready (n {n}, lanes {lanes:?})"),
                    )
                    .await;
                    let mut sends = Vec::new();
                    for dst in (0..n).filter(|d| *d != me) {
                        for (i, &len) in SIZES.iter().enumerate() {
                            let data = Buffer::from_vec(payload(seed(me, i), len));
                            sends.push(c.send(dst, tag(i), data));
                        }
                    }
                    // The even ones: received once everything is sent.
                    for (k, s) in sends.into_iter().enumerate() {
                        bounded(s, format!("rank {me}: send {k} (n {n}, lanes {lanes:?})"))
                            .await
                            .expect("send");
                    }
                    for src in (0..n).filter(|s| *s != me) {
                        for (i, &len) in SIZES.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
                            let what =
                                format!("rank {me}: recv {i} from {src} (n {n}, lanes {lanes:?})");
                            let got = bounded(c.recv(src, tag(i)), what).await.expect("recv");
                            assert_eq!(got.len(), len, "rank {me}: {i} from {src}");
                            assert_eq!(
                                check_payload(seed(src, i), got.as_slice()),
                                Ok(()),
                                "rank {me}: {i} from {src}"
                            );
                        }
                    }
                    for (src, i, zone, recv) in landed {
                        let what = format!("rank {me}: {i} from {src}");
                        let got = bounded(
                            recv,
                            format!("{what}: landing recv (n {n}, lanes {lanes:?})"),
                        )
                        .await
                        .expect("landing recv");
                        assert_eq!(got.len(), SIZES[i], "{what}");
                        assert_eq!(
                            check_payload(seed(src, i), got.as_slice()),
                            Ok(()),
                            "{what}"
                        );
                        // Large messages land in the caller's memory.
                        assert_eq!(zone.holds(&got, 8), SIZES[i] >= 64 << 10, "{what}");
                    }
                    bounded(
                        c.shutdown(),
                        format!("rank {me}: shutdown (n {n}, lanes {lanes:?})"),
                    )
                    .await
                    .expect("shutdown");
                }));
            }
            for h in hs {
                h.await.expect("rank");
            }
        });
    }
}

/// After one rank fails, the others get a grace to end on their own and
/// say why (a rank that only heard of the failure may exit first; its
/// peers were killed at once, before printing), and a rank that does not
/// end is still killed within it.
#[test]
fn launcher_lets_ranks_finish_their_errors_then_kills_the_rest() {
    use braid_core::launch::LaunchError;
    let rt = runtime();
    let script = "case $BRAID_RANK in \
        0) exit 3 ;; \
        1) sleep 0.3; echo 'rank 1 says why' >&2; exit 1 ;; \
        *) sleep 100 ;; esac";
    let mut spec = LaunchSpec::new(3, "sh", vec!["-c".into(), script.into()]);
    spec.output = OutputMode::Captured;
    let t0 = std::time::Instant::now();
    let r = rt.block_on(launch(spec));
    let took = t0.elapsed();
    match r {
        Err(LaunchError::RankFailed { rank, report, .. }) => {
            assert_eq!(rank, 0, "the first failure is the one reported");
            assert!(
                report.stderr[1].contains("rank 1 says why"),
                "rank 1 was killed before it printed: {:?}",
                report.stderr[1]
            );
        }
        other => panic!("expected rank 0's failure, got {other:?}"),
    }
    assert!(
        took < std::time::Duration::from_secs(30),
        "the rank that does not end was not killed: {took:?}"
    );
}

/// An `n`-rank world of each in-process backend (local, tcp), named.
async fn local_and_tcp_worlds(n: u32) -> [(&'static str, Vec<Arc<dyn Communicator>>); 2] {
    let local = LocalComm::world(n).into_iter();
    let tcp = TcpComm::in_process_world(n).await.unwrap().into_iter();
    [
        ("local", local.map(|c| Arc::new(c) as _).collect()),
        ("tcp", tcp.map(|c| Arc::new(c) as _).collect()),
    ]
}

/// A rank that calls `shutdown` again (its first call timed out) counts
/// once: the barrier still waits for every other rank (in process, each
/// call counted, so a second call let ranks leave before the last had
/// arrived), over local and tcp.
#[test]
fn shutdown_called_twice_still_waits_for_every_rank() {
    let rt = runtime();
    for n in RANK_COUNTS.into_iter().filter(|n| *n >= 2) {
        rt.block_on(async {
            let worlds = local_and_tcp_worlds(n).await;
            for (world, comms) in worlds {
                let short = std::time::Duration::from_millis(100);
                let first = tokio::time::timeout(short, comms[0].shutdown()).await;
                assert!(first.is_err(), "{world}, {n} ranks: left alone");
                let again = comms[0].shutdown();
                let mut again = std::pin::pin!(again);
                let early = tokio::time::timeout(short, &mut again).await;
                assert!(
                    early.is_err(),
                    "{world}, {n} ranks: a second call left alone"
                );
                let others = futures::future::try_join_all(comms[1..].iter().map(|c| c.shutdown()));
                let all = futures::future::try_join(again, others);
                tokio::time::timeout(std::time::Duration::from_secs(30), all)
                    .await
                    .unwrap_or_else(|_| panic!("{world}, {n} ranks: shutdown hung"))
                    .unwrap_or_else(|e| panic!("{world}, {n} ranks: {e}"));
            }
        });
    }
}

/// After a rank's `shutdown`, its sends and receives fail with
/// `CommError::Shutdown` in bounded time: a send is not silently lost, and
/// a receive from the rank itself (which nothing can answer now) does not
/// wait for ever, whether it was posted before the shutdown or after.
#[test]
fn operations_after_shutdown_fail_instead_of_vanishing_or_hanging() {
    let rt = runtime();
    for n in RANK_COUNTS {
        rt.block_on(async {
            let worlds = local_and_tcp_worlds(n).await;
            let limit = std::time::Duration::from_secs(10);
            for (world, comms) in worlds {
                // A receive from itself, posted before the shutdown.
                let early = comms[0].recv(0, Tag::new(OpId(7), 0));
                futures::future::try_join_all(comms.iter().map(|c| c.shutdown()))
                    .await
                    .unwrap_or_else(|e| panic!("{world}, {n} ranks: shutdown: {e}"));
                let got = tokio::time::timeout(limit, early)
                    .await
                    .unwrap_or_else(|_| panic!("{world}, {n} ranks: early self receive hung"));
                assert!(
                    matches!(got, Err(CommError::Shutdown { rank: 0 })),
                    "{world}, {n} ranks: early self receive gave {got:?}"
                );
                for (r, c) in comms.iter().enumerate() {
                    let r = r as u32;
                    for peer in [r, (r + 1) % n] {
                        let tag = Tag::new(OpId(8), peer as u8);
                        let sent = c.send(peer, tag, Buffer::from_vec(vec![1, 2, 3])).await;
                        assert!(
                            matches!(sent, Err(CommError::Shutdown { rank }) if rank == r),
                            "{world}, {n} ranks: rank {r}'s send to {peer} after shutdown gave {sent:?}"
                        );
                        let got = tokio::time::timeout(limit, c.recv(peer, tag))
                            .await
                            .unwrap_or_else(|_| {
                                panic!("{world}, {n} ranks: rank {r}'s receive from {peer} hung")
                            });
                        assert!(
                            matches!(got, Err(CommError::Shutdown { rank }) if rank == r),
                            "{world}, {n} ranks: rank {r}'s receive from {peer} gave {:?}",
                            got.map(|b| b.len())
                        );
                    }
                }
            }
        });
    }
}

/// The same over tcp processes (the worker's `after-shutdown` mode), where
/// the job's own shutdown then runs a second time and must return.
#[test]
fn tcp_processes_operations_after_shutdown_fail() {
    let rt = runtime();
    for n in RANK_COUNTS {
        let mut spec = LaunchSpec::new(n, worker(), vec!["after-shutdown".into()]);
        spec.output = OutputMode::Captured;
        let report = rt
            .block_on(launch(spec))
            .unwrap_or_else(|e| panic!("{n} ranks: {e:?}"));
        for r in 0..n as usize {
            assert!(
                report.stdout[r].lines().any(|l| l == "after-shutdown ok"),
                "rank {r} of {n}: {:?} {:?}",
                report.stdout[r],
                report.stderr[r]
            );
        }
    }
}

/// The launcher names the rank whose failure started it all, though the
/// ranks that only heard of it (exiting with `PEER_FAILED_EXIT`) exit
/// first: the failing rank waits 1 s before its process ends.
#[test]
fn launcher_names_the_rank_that_failed_not_the_first_to_exit() {
    use braid_core::launch::LaunchError;
    use braid_core::world::PEER_FAILED_EXIT;
    let rt = runtime();
    for n in RANK_COUNTS.into_iter().filter(|n| *n >= 2) {
        for culprit in [n - 1, n / 2] {
            let mut spec = LaunchSpec::new(
                n,
                worker(),
                vec!["fail-late".into(), culprit.to_string().into()],
            );
            spec.output = OutputMode::Captured;
            match rt.block_on(launch(spec)) {
                Err(LaunchError::RankFailed { rank, report, .. }) => {
                    assert_eq!(rank, culprit, "{n} ranks: {report:?}");
                    for (r, st) in report.status.iter().enumerate() {
                        let code = st.and_then(|s| s.code());
                        let want = if r as u32 == culprit {
                            3
                        } else {
                            i32::from(PEER_FAILED_EXIT)
                        };
                        assert_eq!(
                            code,
                            Some(want),
                            "{n} ranks, culprit {culprit}: rank {r}: {:?}",
                            report.stderr[r]
                        );
                    }
                }
                other => panic!("{n} ranks: expected rank {culprit}'s failure, got {other:?}"),
            }
        }
    }
}

/// Without the convention's help (the first to exit says it only heard
/// of a failure), a later rank's own failure is the one named.
#[test]
fn launcher_skips_ranks_that_only_passed_a_failure_on() {
    use braid_core::launch::LaunchError;
    let rt = runtime();
    let script = format!(
        "case $BRAID_RANK in 0) exit {} ;; 1) sleep 0.3; exit 1 ;; *) sleep 100 ;; esac",
        braid_core::world::PEER_FAILED_EXIT
    );
    let spec = {
        let mut s = LaunchSpec::new(3, "sh", vec!["-c".into(), script.into()]);
        s.output = OutputMode::Captured;
        s
    };
    match rt.block_on(launch(spec)) {
        Err(LaunchError::RankFailed { rank, .. }) => assert_eq!(rank, 1),
        other => panic!("expected rank 1's failure, got {other:?}"),
    }
}

/// A rank that ends before it joins (with success or not) fails the
/// others' start-up at once, each naming it, through the launcher's exit
/// notices: before, rank 0 waited out its whole timeout (60 s) for a rank
/// its launcher knew had ended. The ranks' own timeout here is far past
/// the launch's, so a start-up that waited would fail the test.
#[test]
fn a_rank_gone_before_it_joined_fails_the_start_up_at_once() {
    use braid_core::launch::LaunchError;
    let rt = runtime();
    for n in RANK_COUNTS.into_iter().filter(|n| *n >= 2) {
        for gone in [0, n - 1, n / 2] {
            for code in [0, 3] {
                let script = format!(
                    "if [ $BRAID_RANK = {gone} ]; then exit {code}; fi; exec {} exchange 7",
                    worker()
                );
                let mut spec = LaunchSpec::new(n, "sh", vec!["-c".into(), script.into()]);
                spec.output = OutputMode::Captured;
                spec.env.push(("BRAID_TIMEOUT".into(), "600".into()));
                spec.timeout = Some(std::time::Duration::from_secs(60));
                let what = format!("{n} ranks, rank {gone} gone with status {code}");
                let report = match rt.block_on(launch(spec)) {
                    Err(LaunchError::RankFailed { rank, report, .. }) => {
                        // The rank named failed on its own, not only
                        // passed a failure on.
                        let named = report.status[rank as usize].and_then(|s| s.code());
                        assert_ne!(
                            named,
                            Some(i32::from(braid_core::world::PEER_FAILED_EXIT)),
                            "{what}: rank {rank}: {report:?}"
                        );
                        // Its own failure is the cause; a rank that left
                        // with success leaves rank 0 to fail the job (or,
                        // gone itself, every other rank).
                        let want = match (code, gone) {
                            (3, _) => vec![gone],
                            (_, 0) => (1..n).collect(),
                            _ => vec![0],
                        };
                        assert!(want.contains(&rank), "{what}: rank {rank}: {report:?}");
                        report
                    }
                    other => panic!("{what}: {other:?}"),
                };
                let ended =
                    format!("rank {gone} ended before it joined the job (exit status: {code};");
                for r in (0..n).filter(|r| *r != gone) {
                    let err = &report.stderr[r as usize];
                    // Rank 0 names the rank gone; the others were told by
                    // rank 0, or (connecting after it ended) heard that
                    // rank 0 ended.
                    let told = err.contains(&ended)
                        || (r != 0
                            && err.contains(
                                "rank 0 ended before this rank could join the job (exit status: ",
                            ));
                    assert!(told, "{what}: rank {r}: {err}");
                }
            }
        }
    }
}

/// A rank started with another job size than the others fails the
/// start-up at once, and the launcher names it (its own error says so),
/// not rank 0, which only saw it: rank 0 passes the failure on.
#[test]
fn a_rank_with_another_job_size_is_the_one_named() {
    use braid_core::launch::LaunchError;
    let rt = runtime();
    for n in RANK_COUNTS.into_iter().filter(|n| *n >= 2) {
        let odd = n - 1;
        let script = format!(
            "[ $BRAID_RANK = {odd} ] && export BRAID_NRANKS={}; exec {} exchange 7",
            n + 1,
            worker()
        );
        let mut spec = LaunchSpec::new(n, "sh", vec!["-c".into(), script.into()]);
        spec.output = OutputMode::Captured;
        spec.env.push(("BRAID_TIMEOUT".into(), "600".into()));
        spec.timeout = Some(std::time::Duration::from_secs(60));
        match rt.block_on(launch(spec)) {
            Err(LaunchError::RankFailed { rank, report, .. }) => {
                assert_eq!(rank, odd, "{n} ranks: {report:?}");
                let sizes = format!(
                    "rank {odd} says the job has {} ranks, rank 0 that it has {n}",
                    n + 1
                );
                assert!(
                    report.stderr[odd as usize]
                        .contains(&format!("refused our connection: {sizes}")),
                    "{n} ranks: {:?}",
                    report.stderr[odd as usize]
                );
                assert!(
                    report.stderr[0].contains(&format!("rank {odd} cannot join the job: {sizes}")),
                    "{n} ranks: {:?}",
                    report.stderr[0]
                );
            }
            other => panic!("{n} ranks: {other:?}"),
        }
    }
}

/// A rank that joined and then ended before the job started (the others
/// still joining) fails the start-up at once: rank 0 names it. Before,
/// rank 0 waited for the rest and started a job without it.
#[test]
fn a_rank_gone_after_joining_before_the_start_fails_the_start_up() {
    use braid_core::launch::LaunchError;
    let rt = runtime();
    let script = format!(
        "case $BRAID_RANK in \
         1) exec timeout -s KILL 0.5 {w} exchange 7 ;; \
         2) sleep 3; exec {w} exchange 7 ;; \
         *) exec {w} exchange 7 ;; esac",
        w = worker()
    );
    let mut spec = LaunchSpec::new(3, "sh", vec!["-c".into(), script.into()]);
    spec.output = OutputMode::Captured;
    spec.env.push(("BRAID_TIMEOUT".into(), "600".into()));
    spec.timeout = Some(std::time::Duration::from_secs(60));
    match rt.block_on(launch(spec)) {
        Err(LaunchError::RankFailed { rank, report, .. }) => {
            assert_eq!(rank, 1, "{report:?}");
            assert!(
                report.stderr[0].contains("rank 1 ended after it joined, before the job started"),
                "{:?}",
                report.stderr[0]
            );
        }
        other => panic!("{other:?}"),
    }
}
