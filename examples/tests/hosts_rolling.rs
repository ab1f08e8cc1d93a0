//! The rolling job with its ranks on three hosts (network namespaces with
//! addresses of their own, `braid_tests::hosts`), checked against Polars
//! by the oracle script: tcp ranks started by hand as on machines
//! (`BRAID_ROOT` = rank 0's host address, no `BRAID_LISTEN`), and with the
//! `mpi` feature, `mpirun --hostfile` and `srun` on a Slurm cluster of
//! the hosts (where Slurm is installed). Needs root (CAP_NET_ADMIN),
//! iproute2, and python3 with polars and pyarrow; without network
//! namespaces each test says it skipped.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail by panicking

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use braid_tests::hosts::Hosts;
use braid_tests::{Scratch, output_within};

/// The longest one job of these tests may take.
const JOB_LIMIT: Duration = Duration::from_secs(300);

/// The job's terms after `--input`/`--output` (the oracle gets the same).
const JOB: [&str; 8] = [
    "--values",
    "v,w",
    "--window",
    "5000",
    "--closed",
    "both",
    "--aggs",
    "sum,mean,min,max,count,std,var",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A random input of 100k rows (ids, ts, 20 keys, two value columns).
fn input(d: &Path) -> PathBuf {
    let input = d.join("in.parquet");
    braid_tests::gen_input(&input, 100_000, 20, 1_000_000, 23);
    input
}

/// The oracle's verdict on `out`.
fn check(input: &Path, out: &Path, grouped: bool, what: &str) {
    let mut c = Command::new("python3");
    c.arg(repo().join("tests/oracle/check_rolling.py"))
        .arg("--input")
        .arg(input)
        .arg("--output")
        .arg(out)
        .args(["--order", "ts", "--engines", "polars"])
        .args(JOB);
    if grouped {
        c.args(["--by", "key"]);
    }
    let o = output_within(&mut c, JOB_LIMIT);
    assert!(
        o.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn rolling_by_hand_on_three_hosts_matches_the_oracle() {
    let Some(hosts) = Hosts::for_test("bhr", "10.77.5") else {
        return;
    };
    let scratch = Scratch::new("hosts-rolling");
    let input = input(scratch.path());
    for (job, (n, grouped)) in [(3u32, false), (5, true), (8, false)]
        .into_iter()
        .enumerate()
    {
        let what = format!("tcp, {n} ranks on 3 hosts, grouped={grouped}");
        let out = scratch.path().join(format!("out-{n}-{grouped}"));
        let root = format!("{}:{}", hosts.addr(0), 7800 + job);
        let mut ranks: Vec<_> = (0..n)
            .map(|r| {
                let mut c = hosts.command(r % hosts.count(), env!("CARGO_BIN_EXE_rolling"));
                c.args(["--backend", "tcp", "--input"])
                    .arg(&input)
                    .arg("--output")
                    .arg(&out)
                    .args(JOB)
                    .env("BRAID_RANK", r.to_string())
                    .env("BRAID_NRANKS", n.to_string())
                    .env("BRAID_ROOT", &root)
                    .env("BRAID_TOKEN", format!("rolling-{job}"))
                    .env("BRAID_TIMEOUT", "30")
                    .env_remove("BRAID_LISTEN")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped());
                if grouped {
                    c.args(["--by", "key"]);
                }
                c.spawn().expect("start a rank")
            })
            .collect();
        let start = Instant::now();
        for (r, c) in ranks.iter_mut().enumerate() {
            let st = loop {
                if let Some(s) = c.try_wait().expect("try_wait") {
                    break s;
                }
                if start.elapsed() > JOB_LIMIT {
                    let _ = c.kill();
                    panic!("{what}: rank {r} still runs after {JOB_LIMIT:?}");
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            let mut err = String::new();
            if let Some(e) = c.stderr.as_mut() {
                let _ = std::io::Read::read_to_string(e, &mut err);
            }
            assert!(st.success(), "{what}: rank {r} ({st}): {err}");
        }
        check(&input, &out, grouped, &what);
    }
}

#[cfg(feature = "mpi")]
#[test]
fn rolling_under_mpirun_on_three_hosts_matches_the_oracle() {
    let Some(hosts) = Hosts::for_test("bhp", "10.77.6") else {
        return;
    };
    let scratch = Scratch::new("hosts-rolling-mpi");
    let input = input(scratch.path());
    for (n, grouped) in [(5u32, true), (8, false)] {
        let run = |setup: &dyn Fn(&mut Command)| {
            let mut cmd = hosts.mpirun(n, scratch.path()).expect("hostfile");
            setup(&mut cmd);
            output_within(&mut cmd, JOB_LIMIT)
        };
        launched_job(run, n, grouped, &input, scratch.path(), "mpirun");
    }
}

/// Runs the job through `launch` (mpirun or srun, starting `n` ranks, with
/// the program, arguments and environment its argument sets on the
/// launcher's command) and checks its output against the oracle and its
/// summary's rank count.
#[cfg(feature = "mpi")]
fn launched_job(
    launch: impl Fn(&dyn Fn(&mut Command)) -> std::process::Output,
    n: u32,
    grouped: bool,
    input: &Path,
    dir: &Path,
    how: &str,
) {
    let what = format!("{how}, {n} ranks on 3 hosts, grouped={grouped}");
    let out = dir.join(format!("out-{how}-{n}-{grouped}"));
    let o = launch(&|launcher: &mut Command| {
        launcher
            .env("TMPDIR", dir)
            .arg(env!("CARGO_BIN_EXE_rolling"))
            .args(["--backend", "mpi", "--input"])
            .arg(input)
            .arg("--output")
            .arg(&out)
            .args(JOB);
        if grouped {
            launcher.args(["--by", "key"]);
        }
    });
    assert!(
        o.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(said.contains(&format!("{n} ranks (mpi)")), "{what}: {said}");
    check(input, &out, grouped, &what);
}

/// The job under `srun` on a Slurm cluster of the three hosts
/// (`tests/hosts/slurm.sh`; skipped where Slurm's daemons are not
/// installed), as the README's Slurm line runs it.
#[cfg(feature = "mpi")]
#[test]
fn rolling_under_srun_on_three_hosts_matches_the_oracle() {
    let Some(hosts) = Hosts::for_test("bhq", "10.77.9") else {
        return;
    };
    let scratch = Scratch::new("hosts-rolling-srun");
    let Some(slurm) = hosts.slurm_for_test(&scratch.path().join("slurm")) else {
        return;
    };
    let input = input(scratch.path());
    for (n, grouped) in [(6u32, true), (4, false)] {
        let run = |setup: &dyn Fn(&mut Command)| slurm.output(n, setup, JOB_LIMIT);
        launched_job(run, n, grouped, &input, scratch.path(), "srun");
    }
    // Started by srun without the mpi backend, each process would run a
    // whole job of its own on the same output: refused (Slurm's
    // SLURM_STEP_NUM_TASKS says there are several).
    let mut cmd = slurm.srun(3);
    cmd.env("TMPDIR", scratch.path())
        .env_remove("BRAID_BACKEND")
        .arg(env!("CARGO_BIN_EXE_rolling"))
        .args(["--rows", "3000", "--output"])
        .arg(scratch.path().join("out-refused"));
    let o = output_within(&mut cmd, JOB_LIMIT);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("pass --backend mpi"),
        "srun without the mpi backend: {err}"
    );
    assert!(!scratch.path().join("out-refused").exists());
}
