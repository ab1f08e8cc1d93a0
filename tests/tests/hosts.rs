//! Ranks on several hosts: three network namespaces on a bridge, each with
//! an address of its own (`braid_tests::hosts`), so that every message
//! between two hosts crosses a network interface, not loopback.
//!
//! - tcp: ranks started by hand, rank r on host r mod 3, as a user starts
//!   them on machines: `BRAID_ROOT` = rank 0's host address, no
//!   `BRAID_LISTEN` (each rank listens on its interface toward rank 0).
//! - mpi (feature `mpi`): `mpirun --hostfile`, its daemons started on the
//!   hosts through an rsh agent that enters the host's namespace; and
//!   `srun` on a Slurm cluster of the hosts (where Slurm is installed).
//!
//! Each runs the collective suite and the all-pairs exchange for N in {1,
//! 2, 3, 4, 5, 8}, and kills a rank on another host than rank 0's: the
//! others fail, naming it, instead of waiting. Needs root (CAP_NET_ADMIN)
//! and iproute2; elsewhere each test says it skipped.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail by panicking

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use braid_tests::hosts::Hosts;
use braid_tests::{
    RANK_COUNTS, expected_summary, failed_within, killed_rank_is_named, line_values,
};
#[cfg(feature = "mpi")]
use braid_tests::{Scratch, output_within, ready_pids};

/// The longest one job of these tests may take; past it the job is stopped
/// and the test fails with its output.
const JOB_LIMIT: Duration = Duration::from_secs(300);

/// How long the other ranks may take to fail after one is killed.
const DEATH_NOTICE: Duration = Duration::from_secs(30);

fn worker() -> &'static str {
    env!("CARGO_BIN_EXE_braid-test-worker")
}

/// Starts `n` worker ranks by hand over tcp, rank r on host r mod 3,
/// each command as `adjust` leaves it; each job's rank 0 listens on a
/// port of its own.
fn start_tcp(
    hosts: &Hosts,
    n: u32,
    args: &[&str],
    token: &str,
    adjust: impl Fn(u32, &mut Command),
) -> Vec<Child> {
    static PORT: AtomicU16 = AtomicU16::new(7700);
    let port = PORT.fetch_add(1, Ordering::Relaxed);
    (0..n)
        .map(|r| {
            let mut c = hosts.command(r % hosts.count(), worker());
            c.args(args)
                .env("BRAID_RANK", r.to_string())
                .env("BRAID_NRANKS", n.to_string())
                .env("BRAID_ROOT", format!("{}:{port}", hosts.addr(0)))
                .env("BRAID_TOKEN", token)
                .env("BRAID_TIMEOUT", "30")
                .env_remove("BRAID_LISTEN")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            adjust(r, &mut c);
            c.spawn().expect("start a rank")
        })
        .collect()
}

/// Waits for every rank (stopping them all past `JOB_LIMIT`) and returns
/// each one's stdout; fails the test where a rank failed.
fn finish(children: Vec<Child>, what: &str) -> Vec<String> {
    let start = Instant::now();
    let mut outs = Vec::new();
    let mut children: Vec<Option<Child>> = children.into_iter().map(Some).collect();
    // Read each rank's pipes on threads of their own: a rank blocked on a
    // full pipe would hold the others.
    let readers: Vec<_> = children
        .iter_mut()
        .map(|c| {
            let c = c.as_mut().expect("child");
            let ot = braid_tests::read_in_background(c.stdout.take().expect("stdout"));
            let et = braid_tests::read_in_background(c.stderr.take().expect("stderr"));
            (ot, et)
        })
        .collect();
    let mut statuses = Vec::new();
    for c in children.iter_mut() {
        let mut child = c.take().expect("child");
        let status = loop {
            if let Some(s) = child.try_wait().expect("try_wait") {
                break s;
            }
            if start.elapsed() > JOB_LIMIT {
                let _ = child.kill();
                break child.wait().expect("wait");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        statuses.push(status);
    }
    let mut failed = Vec::new();
    for (r, ((ot, et), st)) in readers.into_iter().zip(statuses).enumerate() {
        let out = ot.join().unwrap_or_default();
        let err = et.join().unwrap_or_default();
        if !st.success() {
            failed.push(format!("rank {r} ({st}): {err}"));
        }
        outs.push(out);
    }
    assert!(failed.is_empty(), "{what}: {}", failed.join("\n"));
    outs
}

/// Checks the suite's lines: every rank ran it and counted the same checks.
fn check_suite(outs: &[String], n: u32, what: &str) {
    let lines: Vec<&str> = outs
        .iter()
        .flat_map(|o| o.lines())
        .filter(|l| l.starts_with("coll "))
        .collect();
    assert_eq!(lines.len(), n as usize, "{what}: {lines:?}");
    assert!(
        lines
            .iter()
            .all(|l| l.starts_with("coll ok ") && *l == lines[0]),
        "{what}: {lines:?}"
    );
}

/// Checks the all-pairs exchange's summaries (messages and bytes each rank
/// received) against the plan's.
fn check_exchange(outs: &[String], seed: u64, n: u32, what: &str) {
    let mut got: Vec<Vec<u64>> = outs
        .iter()
        .flat_map(|o| o.lines())
        .filter_map(|l| l.strip_prefix("exchange ok "))
        .map(|rest| {
            rest.split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect()
        })
        .collect();
    let mut want: Vec<Vec<u64>> = (0..n)
        .map(|r| {
            let s = expected_summary(seed, n, r);
            vec![s.messages, s.bytes]
        })
        .collect();
    // (mpirun's lines come in any order; a rank's summary differs with
    // its rank, so the sorted lists must agree.)
    got.sort();
    want.sort();
    assert_eq!(got, want, "{what}");
}

/// The collective suite and the all-pairs exchange for every rank count:
/// `run(n, worker arguments, what)` runs one job of `n` ranks and gives
/// what its ranks printed.
fn suite_and_exchange(run: impl Fn(u32, &[&str], &str) -> Vec<String>, seed0: u64, how: &str) {
    for n in RANK_COUNTS {
        let seed = seed0 + u64::from(n);
        for mode in ["coll", "exchange"] {
            let what = format!("{how}, {n} ranks on 3 hosts, {mode}");
            let outs = run(n, &[mode, &seed.to_string()], &what);
            if mode == "coll" {
                check_suite(&outs, n, &what);
            } else {
                check_exchange(&outs, seed, n, &what);
            }
        }
    }
}

/// Runs a launcher's job (mpirun or srun) to its end and gives its output;
/// fails the test where the job failed.
#[cfg(feature = "mpi")]
fn launched(mut job: Command, args: &[&str], what: &str) -> Vec<String> {
    succeeded(output_within(job.args(args), JOB_LIMIT), what)
}

/// A launcher's output where its job succeeded; fails the test otherwise.
#[cfg(feature = "mpi")]
fn succeeded(out: std::process::Output, what: &str) -> Vec<String> {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    vec![String::from_utf8_lossy(&out.stdout).into_owned()]
}

#[test]
fn tcp_ranks_on_three_hosts() {
    let Some(hosts) = Hosts::for_test("bht", "10.77.1") else {
        return;
    };
    suite_and_exchange(
        |n, args, what| {
            let token = format!("{n}-{}", args[0]);
            finish(start_tcp(&hosts, n, args, &token, |_, _| ()), what)
        },
        7100,
        "tcp",
    );
    // One large message from host 0 to host 1, split over the lanes (each
    // its own connection across the bridge); rank 1 checks every byte.
    let size = 64u64 << 20;
    let outs = finish(
        start_tcp(&hosts, 2, &["big", &size.to_string()], "big", |_, _| ()),
        "tcp, 64 MiB between hosts",
    );
    assert_eq!(line_values(&outs[1], "big ok "), Some(vec![size]));
}

/// A rank on another host than rank 0 told to listen on loopback
/// (`BRAID_LISTEN=127.0.0.1`) could be reached by no other host: every
/// rank fails at start, naming it, instead of timing out mid-job.
#[test]
fn tcp_rank_on_loopback_on_another_host_is_refused() {
    let Some(hosts) = Hosts::for_test("bhl", "10.77.10") else {
        return;
    };
    let n = 3u32;
    let mut children = start_tcp(&hosts, n, &["exchange", "1"], "loopback", |r, c| {
        if r == 1 {
            c.env("BRAID_LISTEN", "127.0.0.1");
        }
    });
    let start = Instant::now();
    for (r, c) in children.iter_mut().enumerate() {
        let err = failed_within(c, start, DEATH_NOTICE, &format!("rank {r}, started"));
        assert!(
            err.contains("rank 1 listens on 127.0.0.1:") && err.contains("a loopback address"),
            "rank {r}'s error should name rank 1's address: {err}"
        );
    }
}

#[test]
fn tcp_rank_killed_on_another_host() {
    let Some(hosts) = Hosts::for_test("bhk", "10.77.2") else {
        return;
    };
    let (n, victim) = (4u32, 2u32);
    let mut children = start_tcp(&hosts, n, &["wait"], "kill", |_, _| ());
    killed_rank_is_named(&mut children, victim as usize, DEATH_NOTICE);
}

/// An mpirun of the worker on the hosts, with a session folder of its own
/// (see `tests/mpi.rs`).
#[cfg(feature = "mpi")]
fn mpirun(hosts: &Hosts, n: u32, scratch: &Scratch) -> Command {
    let mut c = hosts.mpirun(n, scratch.path()).expect("hostfile");
    c.arg(worker())
        .env("BRAID_BACKEND", "mpi")
        .env("TMPDIR", scratch.path());
    c
}

#[cfg(feature = "mpi")]
#[test]
fn mpi_ranks_on_three_hosts() {
    let Some(hosts) = Hosts::for_test("bhm", "10.77.3") else {
        return;
    };
    let scratch = Scratch::new("hosts-mpi");
    suite_and_exchange(
        |n, args, what| launched(mpirun(&hosts, n, &scratch), args, what),
        7300,
        "mpirun",
    );
}

#[cfg(feature = "mpi")]
#[test]
fn mpi_rank_killed_on_another_host() {
    let Some(hosts) = Hosts::for_test("bhn", "10.77.4") else {
        return;
    };
    let scratch = Scratch::new("hosts-mpi-kill");
    killed_on_host_1(|| mpirun(&hosts, 4, &scratch), 4, "bhn1", "mpirun");
}

/// Starts `job()` (`n` worker ranks in `wait` mode, by mpirun or srun),
/// kills a rank that runs in namespace `ns` (host 1) once every rank is
/// ready, and checks that the whole job ends, failed, within
/// `DEATH_NOTICE`. A job whose ranks did not all get ready because one
/// died of SIGSEGV (Open MPI 4.1's `MPI_Init` race, see
/// `Slurm::output`) is started once more.
#[cfg(feature = "mpi")]
fn killed_on_host_1(job: impl Fn() -> Command, n: u32, ns: &str, what: &str) {
    let mut retried = false;
    let (mut child, pids) = loop {
        let mut child = job()
            .arg("wait")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the job");
        let err = braid_tests::read_in_background(child.stderr.take().expect("stderr"));
        let pids = ready_pids(child.stdout.take().expect("stdout"), n as usize, JOB_LIMIT);
        if pids.len() == n as usize {
            break (child, pids);
        }
        let _ = child.kill();
        let _ = child.wait();
        // A process the launcher left (an MPI daemon) may hold the pipe
        // open: wait for its end a bounded time only.
        let since = Instant::now();
        while !err.is_finished() && since.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let err = if err.is_finished() {
            err.join().unwrap_or_default()
        } else {
            "(not read: a process of the job still holds it open)".to_string()
        };
        if retried || !err.contains("Segmentation fault") {
            panic!(
                "{what}: {} of {n} ranks reported ready; stderr: {err}",
                pids.len()
            );
        }
        eprintln!(
            "{what}: a rank died of SIGSEGV before every rank was ready (Open MPI 4.1's \
             MPI_Init race, see Slurm::output); starting the job once more. Its stderr: {err}"
        );
        retried = true;
    };
    let there = Command::new("ip")
        .args(["netns", "pids", ns])
        .output()
        .expect("ip netns pids");
    let there: Vec<u32> = String::from_utf8_lossy(&there.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    let victim = *pids
        .iter()
        .find(|p| there.contains(p))
        .unwrap_or_else(|| panic!("{what}: no rank on host 1 ({pids:?}; {ns} has {there:?})"));
    let st = Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .expect("kill");
    assert!(st.success());
    let status = braid_tests::exit_within(
        &mut child,
        Instant::now(),
        DEATH_NOTICE,
        &format!("{what}, a rank on host 1 killed"),
    );
    assert!(
        !status.success(),
        "{what}: the job must fail when a rank is killed"
    );
}

/// The suite, the exchange and a killed rank under `srun`, on a Slurm
/// cluster of the three hosts (`tests/hosts/slurm.sh`; skipped where
/// Slurm's daemons are not installed).
#[cfg(feature = "mpi")]
#[test]
fn srun_ranks_on_three_hosts() {
    let Some(hosts) = Hosts::for_test("bhu", "10.77.8") else {
        return;
    };
    let scratch = Scratch::new("hosts-srun");
    let Some(slurm) = hosts.slurm_for_test(&scratch.path().join("slurm")) else {
        return;
    };
    let setup = |c: &mut Command| {
        c.arg(worker())
            .env("BRAID_BACKEND", "mpi")
            .env("TMPDIR", scratch.path());
    };
    suite_and_exchange(
        |n, args, what| {
            let out = slurm.output(
                n,
                |c| {
                    setup(c);
                    c.args(args);
                },
                JOB_LIMIT,
            );
            succeeded(out, what)
        },
        7500,
        "srun",
    );
    let killed = || {
        let mut c = slurm.srun(4);
        setup(&mut c);
        c
    };
    killed_on_host_1(killed, 4, "bhu1", "srun");
}
