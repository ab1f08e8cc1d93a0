//! The collective suite with one-vector results filled by several threads
//! (`BRAID_COPY_THREADS=3`, set before anything reads it): on CI's 2
//! cores ranks would otherwise never split their copies, so the split
//! path (`braid_core::memory::fill_threads`) is checked here against the
//! suite's brute-force references, local and tcp, every rank count.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail by panicking

use std::time::Duration;

use braid_core::world::contexts;
use braid_core::{Context, MemoryLimits, WorldSpec};
use braid_tests::{RANK_COUNTS, coll_suite, runtime};

/// Runs the suite on every rank of `ctxs`, with a deadline; every rank's
/// line must say the suite passed.
async fn suite_on(ctxs: Vec<Context>, seed: u64, what: &str) {
    let n = ctxs.len();
    let hs: Vec<_> = ctxs
        .into_iter()
        .map(|c| {
            tokio::spawn(async move {
                let r = coll_suite::run(c.clone(), seed).await;
                if let Err(msg) = &r {
                    c.comm().abort(msg);
                }
                let _ = c.comm().shutdown().await;
                r
            })
        })
        .collect();
    for (r, h) in hs.into_iter().enumerate() {
        let line = tokio::time::timeout(Duration::from_secs(120), h)
            .await
            .unwrap_or_else(|_| panic!("{what}, {n} ranks: rank {r} hung"))
            .expect("rank task")
            .unwrap_or_else(|e| panic!("{what}, {n} ranks, rank {r}: {e}"));
        assert!(
            line.starts_with("coll ok"),
            "{what}, {n} ranks, rank {r}: {line}"
        );
    }
}

#[test]
fn suite_with_results_filled_by_several_threads() {
    // SAFETY: the only test of this binary, before any thread of it reads
    // the environment.
    unsafe { std::env::set_var("BRAID_COPY_THREADS", "3") };
    assert_eq!(
        braid_core::memory::fill_threads(8 << 20),
        3,
        "the override is in force"
    );
    let rt = runtime();
    for n in RANK_COUNTS {
        rt.block_on(async {
            let local = contexts(&WorldSpec::Local { nranks: n }, MemoryLimits::UNLIMITED)
                .await
                .unwrap();
            suite_on(local, 90 + n as u64, "local").await;
            let tcp = braid_tests::tcp_contexts(n, MemoryLimits::UNLIMITED).await;
            suite_on(tcp, 95 + n as u64, "tcp").await;
        });
    }
}
