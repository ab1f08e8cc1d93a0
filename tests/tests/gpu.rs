//! Device collectives and CUDA IPC (feature `cuda`), against CPU
//! references: ranks as threads of one process and as tcp processes, for
//! N in {1, 2, 3, 4, 5, 8} (ranks beyond the host's GPUs share them, through
//! the host-staged transport). Without a GPU every test says it skipped and
//! passes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use braid_core::cuda::NcclMode;
use braid_core::launch::{LaunchSpec, OutputMode, launch};
use braid_core::{MemoryLimits, WorldSpec};
use braid_tests::{gpu_suite, runtime};

fn counts() -> Vec<u32> {
    gpu_suite::rank_counts("gpu tests")
}

fn worker() -> String {
    std::env::var("BRAID_TEST_WORKER")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_braid-test-worker").to_string())
}

#[test]
fn suite_threads() {
    for n in counts() {
        let seed = braid_tests::fresh_seed();
        let spec = WorldSpec::Local { nranks: n };
        let t = Instant::now();
        let res = braid_core::run_world(&spec, MemoryLimits::UNLIMITED, move |ctx| async move {
            gpu_suite::run(ctx, seed).await.map_err(Into::into)
        })
        .unwrap_or_else(|e| panic!("{n} ranks as threads: {e}"));
        for (r, line) in &res {
            assert!(line.starts_with("gpu ok"), "rank {r}: {line}");
            assert_eq!(line, &res[0].1, "ranks ran different checks");
        }
        eprintln!("threads, {n} ranks: {} in {:?}", res[0].1, t.elapsed());
    }
}

#[test]
fn suite_processes() {
    let rt = runtime();
    for n in counts() {
        let mut spec = LaunchSpec::new(
            n,
            worker(),
            vec!["gpu".into(), braid_tests::fresh_seed().to_string().into()],
        );
        spec.output = OutputMode::Captured;
        let t = Instant::now();
        let report = rt
            .block_on(launch(spec))
            .unwrap_or_else(|e| panic!("{n} ranks as processes: {e:?}"));
        let lines: Vec<&str> = report.stdout.iter().map(|s| s.trim()).collect();
        assert!(lines[0].starts_with("gpu ok"), "rank 0: {}", lines[0]);
        assert!(
            lines.iter().all(|l| *l == lines[0]),
            "ranks disagree: {lines:?}"
        );
        eprintln!("processes, {n} ranks: {} in {:?}", lines[0], t.elapsed());
    }
}

#[test]
fn mismatches_fail_every_rank() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    for n in counts().into_iter().filter(|&n| n >= 2) {
        for mode in [NcclMode::Blocking, NcclMode::NonBlocking] {
            for case in 0..7u32 {
                eprintln!("mismatch case {case}, {n} ranks, {mode:?}: start");
                let spec = WorldSpec::Local { nranks: n };
                let t = Instant::now();
                let res =
                    braid_core::run_world(&spec, MemoryLimits::UNLIMITED, move |ctx| async move {
                        gpu_suite::mismatch(ctx, case, mode)
                            .await
                            .map_err(Into::into)
                    });
                let err = match res {
                    Ok(_) => panic!("case {case}, {n} ranks, {mode:?}: mismatched calls succeeded"),
                    Err(e) => e.to_string(),
                };
                assert!(
                    err.contains("does not match") || err.contains("aborted"),
                    "case {case}, {n} ranks, {mode:?}: unclear error: {err}"
                );
                assert!(
                    t.elapsed() < Duration::from_secs(60),
                    "case {case}, {mode:?}: took {:?}",
                    t.elapsed()
                );
                eprintln!(
                    "mismatch case {case}, {n} ranks, {mode:?}: failed in {:?}: {err}",
                    t.elapsed()
                );
            }
        }
    }
}

/// A GPU job that fails, as tcp processes: mismatched device collectives
/// (cases 0-2) or one rank's error after collectives that worked (case 3).
/// Every rank must exit by itself within a bound, with one of the
/// worker's error statuses (3, or `PEER_FAILED_EXIT` where it only heard
/// of another rank's failure; at least one rank 3) and an error on
/// stderr: not hang, and not die of a signal on the way out while the
/// device communicator is torn down.
#[test]
fn failing_processes_exit_with_an_error() {
    use std::process::{Command, Stdio};
    for n in counts().into_iter().filter(|&n| n >= 2) {
        for case in 0..4u32 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("port")
                .port();
            let root = format!("127.0.0.1:{port}");
            let t = Instant::now();
            let mut ranks = Vec::new();
            for r in 0..n {
                let mut c = Command::new(worker())
                    .args(["gpu-fail", &case.to_string()])
                    .env("BRAID_RANK", r.to_string())
                    .env("BRAID_NRANKS", n.to_string())
                    .env("BRAID_ROOT", &root)
                    .env("BRAID_TOKEN", "gpu-fail-test")
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("spawn");
                let reader = braid_tests::read_in_background(c.stderr.take().expect("stderr"));
                ranks.push((c, reader));
            }
            let echo = i32::from(braid_core::world::PEER_FAILED_EXIT);
            let mut causes = 0;
            for (r, (mut c, reader)) in ranks.into_iter().enumerate() {
                let status = loop {
                    if let Some(s) = c.try_wait().expect("try_wait") {
                        break s;
                    }
                    if t.elapsed() > Duration::from_secs(120) {
                        let _ = c.kill();
                        panic!("case {case}, {n} ranks: rank {r} still running after 120 s");
                    }
                    std::thread::sleep(Duration::from_millis(20));
                };
                let err = reader.join().unwrap_or_default();
                assert!(
                    status.code() == Some(3) || status.code() == Some(echo),
                    "case {case}, {n} ranks: rank {r} ended with {status}; stderr: {err}"
                );
                causes += usize::from(status.code() == Some(3));
                assert!(
                    err.contains("error: "),
                    "case {case}, {n} ranks: rank {r} printed no error: {err}"
                );
            }
            assert!(
                causes > 0,
                "case {case}, {n} ranks: every rank says it only heard of another's failure"
            );
            eprintln!(
                "gpu-fail case {case}, {n} ranks: every rank exited with an error ({causes} of its own) in {:?}",
                t.elapsed()
            );
        }
    }
}

#[test]
fn shuffle_spills_over_the_device_limit() {
    for n in counts() {
        let seed = braid_tests::fresh_seed();
        let spec = WorldSpec::Local { nranks: n };
        let limits = MemoryLimits {
            device: Some(256 << 10),
            host: None,
        };
        let res = braid_core::run_world(&spec, limits, move |ctx| async move {
            gpu_suite::shuffle_spill(ctx, seed)
                .await
                .map_err(Into::into)
        })
        .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
        for (r, spilled) in &res {
            assert!(*spilled > 0, "rank {r} spilled nothing");
        }
        eprintln!(
            "shuffle under a 256 KiB device limit, {n} ranks: spilled {:?}",
            res
        );
    }
}
