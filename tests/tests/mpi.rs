//! The multi-rank suite under `mpirun` (feature `mpi`): point-to-point and
//! every collective for N in {1, 2, 3, 4, 5, 8}, and a killed rank ending
//! the job with an error. Needs OpenMPI (`mpirun`) on the PATH.

#![cfg(feature = "mpi")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail by panicking

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use braid_tests::{RANK_COUNTS, Scratch, expected_summary, output_within};

/// The longest one mpirun of these tests may take (the 8-rank suite takes
/// 2-20 s on the 2-core VM beside other tests): past it, the job is
/// stopped and its test fails with the job's output.
const JOB_LIMIT: Duration = Duration::from_secs(300);

/// An `mpirun` command with a session folder of its own (its `TMPDIR`,
/// removed when this drops). OpenMPI keeps its session directory at
/// `$TMPDIR/ompi.<host>.<uid>`, one for every mpirun of a user; the tests
/// of this file run in parallel, and one mpirun removing it while another
/// creates it failed a CI run ("mkdir /tmp/ompi.vm.0: File exists").
struct Mpirun {
    cmd: Command,
    _tmp: Scratch,
}

impl std::ops::Deref for Mpirun {
    type Target = Command;
    fn deref(&self) -> &Command {
        &self.cmd
    }
}

impl std::ops::DerefMut for Mpirun {
    fn deref_mut(&mut self) -> &mut Command {
        &mut self.cmd
    }
}

fn mpirun(n: u32) -> Mpirun {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = Scratch::new(&format!("mpirun-{k}"));
    let mut c = Command::new("mpirun");
    c.args(["--oversubscribe", "-np", &n.to_string()])
        // Open MPI (4 and 5) runs as root only with these or its
        // `--allow-run-as-root`; other launchers ignore variables, not flags.
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .arg(env!("CARGO_BIN_EXE_braid-test-worker"))
        .env("BRAID_BACKEND", "mpi")
        .env("TMPDIR", tmp.path());
    Mpirun { cmd: c, _tmp: tmp }
}

fn run(n: u32, args: &[&str]) -> Vec<String> {
    run_cmd(mpirun(n), n, args)
}

fn run_cmd(mut cmd: Mpirun, n: u32, args: &[&str]) -> Vec<String> {
    let out = output_within(cmd.args(args), JOB_LIMIT);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "mpirun -np {n} {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn mpi_all_pairs_exchange() {
    for n in RANK_COUNTS {
        let seed = 700 + n as u64;
        let mut got: Vec<(u64, u64)> = run(n, &["exchange", &seed.to_string()])
            .iter()
            .filter_map(|l| l.strip_prefix("exchange ok "))
            .map(|rest| {
                let v: Vec<u64> = rest
                    .split_whitespace()
                    .map(|w| w.parse().unwrap())
                    .collect();
                (v[0], v[1])
            })
            .collect();
        let mut want: Vec<(u64, u64)> = (0..n)
            .map(|r| {
                let s = expected_summary(seed, n, r);
                (s.messages, s.bytes)
            })
            .collect();
        got.sort_unstable();
        want.sort_unstable();
        assert_eq!(got, want, "{n} ranks");
    }
}

/// A large message whose receive offered a landing before it was sent is
/// received by MPI straight into that memory (`recv_landing`), whole.
#[test]
fn mpi_receive_lands_in_the_offered_memory() {
    for len in [3 << 20, 100_000, 65_536] {
        let out = run(2, &["land", &len.to_string()]);
        assert_eq!(out, vec![format!("land ok {len} 1")], "{len} bytes");
    }
}

/// Sends that complete before their receives are posted: every rank
/// sends a large message to the next and waits for that send before it
/// receives (the mpi backend holds a large message that no receive waits
/// for, so as to post its own sends first; held without a limit, every
/// rank would wait for the others here). Bounded in time: a hang fails.
#[test]
fn mpi_sends_complete_before_their_receives_are_posted() {
    for n in [2, 3] {
        for len in [65_536u64, 4 << 20] {
            // The guard (and its TMPDIR) lives until the job has ended.
            let mut job = mpirun(n);
            let out = output_within(
                job.args(["swap", &len.to_string()]),
                Duration::from_secs(60),
            );
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{n} ranks, {len} bytes: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let ok = stdout
                .lines()
                .filter(|l| *l == format!("swap ok {len}"))
                .count();
            assert_eq!(ok, n as usize, "{n} ranks, {len} bytes: {stdout}");
        }
    }
}

/// A communicator dropped without a shutdown, with a large send in flight:
/// its engine shuts down by itself (the send finishes, MPI is finalised
/// once every rank has), no rank panics and the job ends well. Before,
/// MPI was finalised at once under the live send, and dropping it then
/// panicked in rsmpi.
#[test]
fn mpi_a_communicator_dropped_without_shutdown_ends_cleanly() {
    for n in [2, 3] {
        let mut job = mpirun(n);
        let out = output_within(
            job.args(["orphan", &(4 << 20).to_string()]),
            Duration::from_secs(60),
        );
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{n} ranks: {stdout}\n{stderr}");
        assert!(!stderr.contains("panicked"), "{n} ranks: {stderr}");
        let ok = stdout.lines().filter(|l| *l == "orphan ok").count();
        assert_eq!(ok, n as usize, "{n} ranks: {stdout}\n{stderr}");
    }
}

/// A rank that computes (sleeps, its communicator untouched) still
/// receives: a large message from a peer it exchanges with is held for a
/// receive at first, then released by the progress thread at its limit
/// (which naps meanwhile: nothing else is in flight), so the sender's send
/// completes during the computation (the worker's `idle` mode checks the
/// bytes and the statistics). Fails if that nap outlasts the computation.
#[test]
fn mpi_a_rank_that_computes_still_receives() {
    for n in [2, 3] {
        for len in [65_536u64, 4 << 20] {
            let out = run(n, &["idle", &len.to_string()]);
            let want = vec![format!("idle ok {len}"); n as usize];
            assert_eq!(out, want, "{n} ranks, {len} bytes");
        }
    }
}

/// With `BRAID_COPY_THREADS=2` a rank copies with two threads where it
/// would with one on a 2-core host (two ranks: a core each): result
/// copies split, and an AllToAll's own part copied by a helper while the
/// rank receives the others' (`helper_copies`). The tag-bound variant
/// below runs the default.
#[test]
fn mpi_collective_suite() {
    collective_suite(None);
}

/// The suite as under an MPI with the standard's smallest tag bound
/// (2^15 - 1: collective OpIds wrap every 64), so OpIds are reused on the wire
/// many times over (its 1000 back-to-back collectives among them).
#[test]
fn mpi_collective_suite_at_the_smallest_tag_bound() {
    // The ranks see the bound: one below the standard's minimum is refused.
    let out = output_within(
        mpirun(2)
            .env("BRAID_MPI_TAG_UB", "32766")
            .args(["coll", "1"]),
        JOB_LIMIT,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a bound of 32766 was accepted");
    assert!(err.contains("MPI_TAG_UB"), "no tag-bound error: {err}");
    // (Refused before MPI starts, as rank 0 and 1, from mpirun's variables.)
    assert!(err.contains("rank 1: bootstrap failed"), "{err}");
    collective_suite(Some(Env::TagUb("32767")));
}

/// The suite with messages of at most 5000 bytes (`BRAID_MPI_MAX_MESSAGE`,
/// as MPI's own 2 GiB - 1 for larger data): every larger part goes as
/// pieces, and each result still equals its reference. A value below
/// what a frame needs is refused on every rank.
#[test]
fn mpi_collective_suite_in_pieces() {
    let out = output_within(
        mpirun(2)
            .env("BRAID_MPI_MAX_MESSAGE", "31")
            .args(["coll", "1"]),
        JOB_LIMIT,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    // (Below a frame's header: a barrier waited for ever under it.)
    assert!(!out.status.success(), "a limit of 31 bytes was accepted");
    assert!(
        err.contains("BRAID_MPI_MAX_MESSAGE=\"31\"")
            && err.contains("from 64")
            && err.contains("rank 0: bootstrap failed"),
        "no limit error: {err}"
    );
    collective_suite(Some(Env::MaxMessage("5000")));
}

/// The environment a run of the suite gets.
#[derive(Debug, Clone, Copy)]
enum Env {
    /// `BRAID_MPI_TAG_UB`.
    TagUb(&'static str),
    /// `BRAID_MPI_MAX_MESSAGE`.
    MaxMessage(&'static str),
}

fn collective_suite(tag_ub: Option<Env>) {
    for n in RANK_COUNTS {
        let mut cmd = mpirun(n);
        match tag_ub {
            Some(Env::TagUb(ub)) => cmd.env("BRAID_MPI_TAG_UB", ub),
            Some(Env::MaxMessage(m)) => cmd.env("BRAID_MPI_MAX_MESSAGE", m),
            None => cmd.env("BRAID_COPY_THREADS", "2"),
        };
        let lines: Vec<String> = run_cmd(cmd, n, &["coll", &(800 + n).to_string()])
            .into_iter()
            .filter(|l| l.starts_with("coll"))
            .collect();
        assert_eq!(lines.len(), n as usize, "{n} ranks, {tag_ub:?}: {lines:?}");
        assert!(
            lines
                .iter()
                .all(|l| l.starts_with("coll ok") && *l == lines[0]),
            "{n} ranks, {tag_ub:?}: {lines:?}"
        );
    }
}

#[test]
fn mpi_killed_rank_ends_the_job() {
    let mut job = mpirun(3);
    let mut child = job
        .arg("wait")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut pids = Vec::new();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    while pids.len() < 3 {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 {
            break;
        }
        if let Some(p) = line.trim().strip_prefix("ready ") {
            pids.push(p.to_string());
        }
    }
    assert_eq!(pids.len(), 3, "every rank reports ready");
    let st = Command::new("kill")
        .args(["-9", &pids[1]])
        .status()
        .unwrap();
    assert!(st.success());
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("the MPI job still runs 30 s after a rank was killed");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success(), "the job must fail when a rank is killed");
}

/// A rank that leaves without a call the others make (an AllReduce, a
/// message rank 0 waits for) ends the job with an error naming it, for N
/// in {2, 3, 4, 5, 8}: its finish notice says how many messages it sent,
/// and a receive beyond those fails instead of waiting in MPI forever.
#[test]
fn mpi_a_rank_that_skips_a_call_fails_the_job() {
    for n in RANK_COUNTS.into_iter().filter(|n| *n >= 2) {
        for what in ["0", "1"] {
            let mut job = mpirun(n);
            let out = output_within(job.args(["skip", what]), Duration::from_secs(60));
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success(),
                "{n} ranks, case {what}: the job must fail"
            );
            assert!(
                err.contains(&format!("rank {} finished its job", n - 1)),
                "{n} ranks, case {what}: {err}"
            );
        }
    }
}

/// The nodes of one graph run collectives at once, in an order that
/// differs between ranks, and each meets its own (the graph gives each
/// node a class of OpIds; MPI's tags hold them modulo its tag bound).
#[test]
fn mpi_graph_nodes_keep_their_collectives_apart() {
    for n in RANK_COUNTS {
        let out = run(n, &["graph-nodes"]);
        let ok = out.iter().filter(|l| *l == "graph-nodes ok").count();
        assert_eq!(ok, n as usize, "{n} ranks: {out:?}");
    }
}

/// After a rank shuts its communicator down, its sends and receives fail
/// with `CommError::Shutdown` (none is lost or waits for ever), and the
/// job's own second shutdown returns.
#[test]
fn mpi_operations_after_shutdown_fail() {
    for n in RANK_COUNTS {
        let out = run(n, &["after-shutdown"]);
        let ok = out.iter().filter(|l| *l == "after-shutdown ok").count();
        assert_eq!(ok, n as usize, "{n} ranks: {out:?}");
    }
}
