//! `braid-launch` as a user runs it: asked to stop by a signal, it ends
//! every rank (and what a rank's wrapper script started) before it exits;
//! killed outright, it takes them with it; a reader that does not read
//! its output does not stop it from stopping the job.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail by panicking

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use braid_tests::output_within;

/// The longest one launch of these tests may run: past it, it is stopped
/// and its test fails with its output, not CI's time.
const LIMIT: Duration = Duration::from_secs(300);

/// Whether process `pid` still runs (a zombie counts as gone).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// The pids the ranks wrote into `dir` (one file a rank), once all `n` did.
fn rank_pids(dir: &Path, n: usize) -> Vec<u32> {
    pids_named(dir, "pid", n)
}

/// The pids written into `dir` as `{name}{rank}`, once all `n` were.
fn pids_named(dir: &Path, name: &str, n: usize) -> Vec<u32> {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let pids: Vec<u32> = (0..n)
            .filter_map(|r| std::fs::read_to_string(dir.join(format!("{name}{r}"))).ok())
            .filter_map(|s| s.trim().parse().ok())
            .collect();
        if pids.len() == n {
            return pids;
        }
        assert!(Instant::now() < until, "the ranks did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `braid-launch -n 3` of ranks that write their pid into a fresh folder
/// named for `what`, then sleep; with the ranks' pids once all started.
#[cfg(target_os = "linux")]
fn launch_sleepers(what: &str) -> (std::process::Child, Vec<u32>, std::path::PathBuf) {
    launch_ranks(what, &[], "exec sleep 60")
}

/// `braid-launch -n 3 ARGS` of ranks that write their pid into a fresh
/// folder named for `what`, then run `then` (shell); with the ranks' pids
/// once all started.
#[cfg(target_os = "linux")]
fn launch_ranks(
    what: &str,
    args: &[&str],
    then: &str,
) -> (std::process::Child, Vec<u32>, std::path::PathBuf) {
    launch_ranks_to(what, args, then, Stdio::null())
}

/// [`launch_ranks`] with the launcher's stdout sent to `stdout`.
#[cfg(target_os = "linux")]
fn launch_ranks_to(
    what: &str,
    args: &[&str],
    then: &str,
    stdout: Stdio,
) -> (std::process::Child, Vec<u32>, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("braid-launch-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!(
        "BRAID_DIR={}; echo $$ > $BRAID_DIR/pid$BRAID_RANK; {then}",
        dir.display()
    );
    let launcher = Command::new(env!("CARGO_BIN_EXE_braid-launch"))
        .args(["-n", "3"])
        .args(args)
        .args(["--", "sh", "-c", &script])
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pids = rank_pids(&dir, 3);
    (launcher, pids, dir)
}

/// The launcher's exit status and stderr, once it ends (within 30 s).
#[cfg(target_os = "linux")]
fn finished(launcher: &mut std::process::Child, what: &str) -> (std::process::ExitStatus, String) {
    let until = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = launcher.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < until, "{what}: the launcher did not end");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut launcher.stderr.take().unwrap(), &mut err).unwrap();
    (status, err)
}

/// The pids still running within 10 s (each then killed, so that a failed
/// test leaves nothing behind).
#[cfg(target_os = "linux")]
fn still_running(pids: &[u32]) -> Vec<u32> {
    let until = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|p| alive(*p)) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<u32> = pids.iter().copied().filter(|p| alive(*p)).collect();
    for p in &left {
        // SAFETY: cleaning up a process this test caused.
        unsafe { libc::kill(*p as i32, libc::SIGKILL) };
    }
    left
}

/// SIGTERM and SIGHUP (what `kill`, a batch system's cancel and a closed
/// terminal send) end the launcher and every rank; before, the launcher
/// died at once and left its ranks running.
#[cfg(target_os = "linux")]
#[test]
fn a_stop_signal_ends_every_rank() {
    for (sig, name) in [(libc::SIGTERM, "SIGTERM"), (libc::SIGHUP, "SIGHUP")] {
        let (mut launcher, pids, dir) = launch_sleepers(name);
        // SAFETY: a signal to the child this test started.
        assert_eq!(unsafe { libc::kill(launcher.id() as i32, sig) }, 0);
        let (status, err) = finished(&mut launcher, name);
        assert!(!status.success(), "{name}: {status:?}");
        assert!(err.contains("interrupted"), "{name}: {err}");
        let left = still_running(&pids);
        assert!(left.is_empty(), "{name}: ranks {left:?} still run");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A stop signal whose ranks all end well anyway (as `rolling`'s do when
/// the signal comes while they move their output into place, which they
/// finish) is no interruption: the launcher succeeds. Before, it reported
/// "interrupted" and exit 130 over a whole, new output.
#[cfg(target_os = "linux")]
#[test]
fn a_stop_that_every_rank_outlives_is_no_failure() {
    // Each rank ignores SIGTERM (its sleep too), and ends well a moment
    // later.
    let (mut launcher, pids, dir) = launch_ranks(
        "outlived",
        &[],
        "trap '' TERM; echo x > $BRAID_DIR/ready$BRAID_RANK; sleep 1; exit 0",
    );
    for r in 0..3 {
        let ready = dir.join(format!("ready{r}"));
        let until = Instant::now() + Duration::from_secs(20);
        while !ready.exists() {
            assert!(Instant::now() < until, "rank {r} never started");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    // SAFETY: a signal to the child this test started.
    assert_eq!(
        unsafe { libc::kill(launcher.id() as i32, libc::SIGTERM) },
        0
    );
    let (status, err) = finished(&mut launcher, "outlived");
    assert!(status.success(), "{status:?}: {err}");
    assert!(!err.contains("interrupted"), "{err}");
    assert!(still_running(&pids).is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A launcher started ignoring SIGHUP (`nohup braid-launch ...`) lets
/// the job outlive a hangup: before, it installed its handler anyway and
/// a closed terminal stopped the job `nohup` was meant to keep.
#[cfg(target_os = "linux")]
#[test]
fn a_launcher_started_under_nohup_outlives_a_hangup() {
    use std::os::unix::process::CommandExt as _;
    let dir = std::env::temp_dir().join(format!("braid-launch-nohup-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!(
        "echo x > {}/ready$BRAID_RANK; sleep 1; echo done $BRAID_RANK",
        dir.display()
    );
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_braid-launch"));
    cmd.args(["-n", "3", "--", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: signal(2) only, between fork and exec, as nohup does.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut launcher = cmd.spawn().unwrap();
    for r in 0..3 {
        let ready = dir.join(format!("ready{r}"));
        let until = Instant::now() + Duration::from_secs(20);
        while !ready.exists() {
            assert!(Instant::now() < until, "rank {r} never started");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    // SAFETY: a signal to the child this test started.
    assert_eq!(unsafe { libc::kill(launcher.id() as i32, libc::SIGHUP) }, 0);
    let mut out = String::new();
    std::io::Read::read_to_string(&mut launcher.stdout.take().unwrap(), &mut out).unwrap();
    let (status, err) = finished(&mut launcher, "nohup");
    assert!(status.success(), "{status:?}: {err}");
    for r in 0..3 {
        assert!(out.contains(&format!("[rank {r}] done {r}")), "{out}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// What a rank leaves running in its group when it exits well (a
/// background process of its script) ends with the job, and the launcher
/// does not wait on the pipes it holds: before, it outlived the launcher.
#[cfg(target_os = "linux")]
#[test]
fn what_a_rank_left_running_ends_with_the_job() {
    let (mut launcher, pids, dir) = launch_ranks(
        "left",
        &[],
        "sleep 60 & echo $! > $BRAID_DIR/bg$BRAID_RANK; exit 0",
    );
    let bg = pids_named(&dir, "bg", 3);
    let (status, err) = finished(&mut launcher, "left");
    assert!(status.success(), "{status:?}: {err}");
    let left = still_running(&bg);
    assert!(
        left.is_empty(),
        "background processes {left:?} outlived the job"
    );
    assert!(still_running(&pids).is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A stopped job's ranks get SIGTERM first, so each can remove what it
/// staged and spilled (`rolling` does): here every rank writes a mark
/// when SIGTERM comes, but rank 1 then keeps running, and is killed once
/// the grace runs out. Before, the ranks were killed at once (SIGKILL),
/// and a tcp job's spill files stayed in the temporary folder.
#[cfg(target_os = "linux")]
#[test]
fn stopped_ranks_get_to_clean_up_then_are_killed() {
    let (mut launcher, pids, dir) = launch_ranks(
        "term",
        &[],
        // (Ranks 0 and 2 wait on a sleep so that the trap runs at once,
        // and end it; rank 1 sleeps in short steps, none left behind.)
        "mark=\"echo x > $BRAID_DIR/clean$BRAID_RANK\"; \
         if [ $BRAID_RANK = 1 ]; then trap \"$mark\" TERM; while true; do sleep 0.1; done; fi; \
         trap \"$mark; kill \\$!; exit 3\" TERM; sleep 60 & wait",
    );
    let started = Instant::now();
    // SAFETY: a signal to the child this test started.
    assert_eq!(
        unsafe { libc::kill(launcher.id() as i32, libc::SIGTERM) },
        0
    );
    let (status, err) = finished(&mut launcher, "term");
    assert!(!status.success(), "{status:?}: {err}");
    for r in 0..3 {
        assert!(
            dir.join(format!("clean{r}")).exists(),
            "rank {r} was not asked to stop before it was killed: {err}"
        );
    }
    // Rank 1 ignored the request: killed after the grace, not before.
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "ended before the grace: {err}"
    );
    let left = still_running(&pids);
    assert!(left.is_empty(), "ranks {left:?} still run");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A launcher killed with SIGKILL (no handler runs) takes its ranks with
/// it: each rank asked the kernel to kill it when its launcher dies.
#[cfg(target_os = "linux")]
#[test]
fn a_killed_launcher_leaves_no_rank() {
    let (mut launcher, pids, dir) = launch_sleepers("kill");
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    let left = still_running(&pids);
    assert!(
        left.is_empty(),
        "ranks {left:?} outlived their killed launcher"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--timeout`: a job whose ranks do not end is stopped when it runs out;
/// the launcher exits 124 and names the ranks that were still running (a
/// rank that already ended is not named), and no rank is left behind.
#[cfg(target_os = "linux")]
#[test]
fn a_job_past_its_timeout_is_stopped_and_named() {
    let started = Instant::now();
    let (mut launcher, pids, dir) = launch_ranks(
        "timeout",
        &["--timeout", "1.5"],
        "if [ $BRAID_RANK = 1 ]; then exit 0; fi; exec sleep 60",
    );
    let (status, err) = finished(&mut launcher, "timeout");
    assert_eq!(status.code(), Some(124), "{err}");
    assert!(err.contains("timeout of 1.5 s"), "{err}");
    assert!(err.contains("rank(s) 0, 2 were still running"), "{err}");
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "stopped before its timeout: {err}"
    );
    let left = still_running(&pids);
    assert!(left.is_empty(), "ranks {left:?} still run");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A rank that fails on its own before the timeout is the error reported,
/// not the timeout that stops the ranks it left waiting; the launcher
/// exits with that rank's own status.
#[cfg(target_os = "linux")]
#[test]
fn a_failure_before_the_timeout_is_what_is_reported() {
    let (mut launcher, pids, dir) = launch_ranks(
        "timeout-fail",
        &["--timeout", "1"],
        "if [ $BRAID_RANK = 2 ]; then exit 3; fi; exec sleep 60",
    );
    let (status, err) = finished(&mut launcher, "timeout-fail");
    assert_eq!(status.code(), Some(3), "{err}");
    assert!(err.contains("rank 2 failed"), "{err}");
    assert!(!err.contains("timeout"), "{err}");
    let left = still_running(&pids);
    assert!(left.is_empty(), "ranks {left:?} still run");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A timeout that every rank outlives with status 0 (as a `rolling` rank
/// does when the stop comes during its commit, which it finishes) is no
/// failure: the output is whole. Before, the launcher exited 124 over it.
#[cfg(target_os = "linux")]
#[test]
fn a_timeout_that_every_rank_outlives_is_no_failure() {
    let (mut launcher, pids, dir) = launch_ranks(
        "timeout-outlived",
        &["--timeout", "0.5"],
        "trap 'sleep 0.3; exit 0' TERM; sleep 60 & wait",
    );
    let (status, err) = finished(&mut launcher, "timeout-outlived");
    assert!(status.success(), "{status:?}: {err}");
    // Said once, naming the ranks it stopped: the timeout did fire.
    assert_eq!(
        err.matches("the timeout of 0.5 s passed").count(),
        1,
        "{err}"
    );
    assert!(err.contains("rank(s) 0, 1, 2 still ran"), "{err}");
    assert!(err.contains("the job is whole"), "{err}");
    let left = still_running(&pids);
    assert!(left.is_empty(), "ranks {left:?} still run");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A rank stopped by SIGSTOP (or Ctrl-Z) when the launcher stops the job
/// still gets to clean up: the SIGTERM comes with a SIGCONT. Before, it
/// stayed pending in the stopped process until the SIGKILL, and a
/// `rolling` rank left its lock and staging files behind.
#[cfg(target_os = "linux")]
#[test]
fn a_stopped_rank_is_continued_to_clean_up() {
    let (mut launcher, pids, dir) = launch_ranks(
        "sigstop",
        &[],
        "trap \"echo x > $BRAID_DIR/clean$BRAID_RANK; exit 3\" TERM; \
         if [ $BRAID_RANK = 1 ]; then kill -STOP $$; fi; sleep 60 & wait",
    );
    // Rank 1 is stopped (state T) before the launcher is asked to stop.
    let until = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(format!("/proc/{}/stat", pids[1])).is_ok_and(|s| {
        s.rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('T'))
    }) {
        assert!(Instant::now() < until, "rank 1 never stopped");
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: a signal to the child this test started.
    assert_eq!(
        unsafe { libc::kill(launcher.id() as i32, libc::SIGTERM) },
        0
    );
    let (status, err) = finished(&mut launcher, "sigstop");
    assert!(!status.success(), "{status:?}: {err}");
    assert!(
        dir.join("clean1").exists(),
        "the stopped rank was killed without cleaning up: {err}"
    );
    let left = still_running(&pids);
    assert!(left.is_empty(), "ranks {left:?} still run");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A timeout that is not a positive number of seconds is refused before
/// any rank starts.
#[test]
fn a_bad_timeout_is_refused() {
    for (bad, says) in [
        ("0", "positive"),
        ("-1", "positive"),
        ("soon", "not a number"),
        ("inf", "at most"),
        ("1e400", "at most"),
        ("1e9", "at most"),
        ("NaN", "positive"),
    ] {
        let out = output_within(
            Command::new(env!("CARGO_BIN_EXE_braid-launch")).args([
                "-n",
                "2",
                "--timeout",
                bad,
                "--",
                "true",
            ]),
            LIMIT,
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains(bad) && err.contains("timeout"), "{bad}: {err}");
        assert!(err.contains(says), "{bad}: {err}");
    }
}

/// A program started by `braid-launch` runs the launcher's count of
/// ranks: `rolling --ranks` that says otherwise is refused on every rank,
/// naming both counts, instead of being ignored; `--backend local`, which
/// would run a whole job in each process, is refused too (it was ignored
/// without a word).
#[test]
fn rolling_under_the_launcher_refuses_another_rank_count() {
    let run = |args: &[&str]| {
        output_within(
            Command::new(env!("CARGO_BIN_EXE_braid-launch"))
                .args([
                    "-n",
                    "2",
                    "--",
                    env!("CARGO_BIN_EXE_rolling"),
                    "--rows",
                    "1000",
                ])
                .args(args),
            LIMIT,
        )
    };
    let out = run(&["--ranks", "3"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("--ranks 3")
            && err.contains("BRAID_NRANKS=2")
            && err.contains("braid-launch -n 3"),
        "{err}"
    );
    let out = run(&["--backend", "local"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("--backend local") && err.contains("of the 2 that braid-launch started"),
        "{err}"
    );
    for args in [&["--ranks", "2"][..], &[], &["--backend", "tcp"]] {
        let out = run(args);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{args:?}: {text}");
        assert!(
            text.contains("1000 rows in, 1000 rows out, 2 ranks (tcp)"),
            "{args:?}: {text}"
        );
    }
}

/// A launcher given a progress counter sums what its ranks report on the
/// pipe it hands them (`BRAID_PROGRESS_FD`: each rank's latest rows read
/// and written), as `rolling --backend tcp` shows its ranks' rows read and
/// then computed; before, its bar stayed at 0 while the rank processes
/// read, and later said "sorting" until the end.
#[cfg(unix)]
#[test]
fn ranks_progress_reaches_the_launcher() {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let total = Arc::new(braid_core::rank_progress::Progress::default());
    // Rank r reports (1, 0), then (100 (r + 1), 10 (r + 1)): only the
    // latest counts.
    let script = "import os\n\
                  fd, r = int(os.environ['BRAID_PROGRESS_FD']), int(os.environ['BRAID_RANK'])\n\
                  os.write(fd, f'{r} 1 0\\n'.encode())\n\
                  os.write(fd, f'{r} {100 * (r + 1)} {10 * (r + 1)}\\n'.encode())\n";
    let mut spec =
        braid_core::launch::LaunchSpec::new(3, "python3", vec!["-c".into(), script.into()]);
    spec.output = braid_core::launch::OutputMode::Captured;
    spec.progress = Some(total.clone());
    let report = rt.block_on(braid_core::launch::launch(spec));
    assert!(report.is_ok(), "{report:?}");
    let until = Instant::now() + Duration::from_secs(10);
    let sums = || {
        (
            total.read.load(Ordering::Relaxed),
            total.written.load(Ordering::Relaxed),
        )
    };
    while sums() != (600, 60) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(sums(), (600, 60));
}

/// A launch whose future is dropped (its caller gave up on it, under a
/// timeout or a `select!`) while the runtime goes on ends its ranks: no
/// one would watch them otherwise.
#[cfg(target_os = "linux")]
#[test]
fn a_dropped_launch_ends_its_ranks() {
    let dir = std::env::temp_dir().join(format!("braid-launch-dropped-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!("echo $$ > {}/pid$BRAID_RANK; exec sleep 60", dir.display());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut spec = braid_core::launch::LaunchSpec::new(3, "sh", vec!["-c".into(), script.into()]);
    spec.output = braid_core::launch::OutputMode::Captured;
    let pids = rt.block_on(async {
        let launch = braid_core::launch::launch(spec);
        tokio::pin!(launch);
        // Until every rank has started, then the launch is let go of.
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            tokio::select! {
                r = &mut launch => panic!("the launch ended: {r:?}"),
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
            let pids: Vec<u32> = (0..3)
                .filter_map(|r| std::fs::read_to_string(dir.join(format!("pid{r}"))).ok())
                .filter_map(|s| s.trim().parse().ok())
                .collect();
            if pids.len() == 3 {
                break pids;
            }
            assert!(Instant::now() < until, "the ranks did not start");
        }
    });
    // The launch future is gone; the runtime (and its rank tasks) live on.
    let left = still_running(&pids);
    assert!(
        left.is_empty(),
        "ranks {left:?} outlived their dropped launch"
    );
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A reader that never reads the launcher's output (`braid-launch ... |
/// sleep 40`) does not stop the launcher from stopping the job: the ranks
/// print without end, the pipe fills, and still `--timeout` stops them
/// (status 124), as SIGTERM does (status 130). Before, the launcher wrote
/// the ranks' lines with blocking writes on its runtime's two workers,
/// which then never ran the timeout or the signal handling: it ran on,
/// and no rank was stopped.
#[cfg(target_os = "linux")]
#[test]
fn a_reader_that_does_not_read_does_not_stop_the_stopping() {
    for (what, args) in [
        ("stuck-timeout", &["--timeout", "2"][..]),
        ("stuck-term", &[]),
    ] {
        // (The test holds the read end of the launcher's stdout and never
        // reads it.)
        let (mut launcher, pids, dir) =
            launch_ranks_to(what, args, "exec yes hello", Stdio::piped());
        let started = Instant::now();
        if args.is_empty() {
            // Long enough for the pipe to fill and the printer to wait.
            std::thread::sleep(Duration::from_millis(1500));
            // SAFETY: a signal to the child this test started.
            assert_eq!(
                unsafe { libc::kill(launcher.id() as i32, libc::SIGTERM) },
                0
            );
        }
        let (status, err) = finished(&mut launcher, what);
        let want = if args.is_empty() { 130 } else { 124 };
        assert_eq!(status.code(), Some(want), "{what}: {err}");
        // Timeout or signal, then the grace and the bounded wait for the
        // output; not the launcher waiting on its reader.
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{what}: took {:?}",
            started.elapsed()
        );
        let left = still_running(&pids);
        assert!(left.is_empty(), "{what}: ranks {left:?} still run");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A rank started through a wrapper script (`sh -c 'prog; echo done'`) is
/// stopped with the program the wrapper runs: at the timeout and at
/// SIGTERM the launcher signals the rank's whole process group, and does
/// not then wait on pipes that the program holds. Before, only the shell
/// was signalled; the launcher said the ranks were stopped while each
/// program ran on, and waited 5 s more for their pipes.
#[cfg(target_os = "linux")]
#[test]
fn a_wrapped_rank_is_stopped_with_its_wrapper() {
    // The wrapper (this rank's shell) runs a program that writes its pid
    // as inner{rank}, then sleeps; the wrapper has more to do after it.
    let then = r#"sh -c "echo \$\$ > $BRAID_DIR/inner$BRAID_RANK; exec sleep 60"; echo done"#;
    for (what, args) in [
        ("wrapped-timeout", &["--timeout", "1.5"][..]),
        ("wrapped-term", &[]),
    ] {
        let (mut launcher, pids, dir) = launch_ranks(what, args, then);
        let inner = pids_named(&dir, "inner", 3);
        let stop_at = Instant::now();
        if args.is_empty() {
            // SAFETY: a signal to the child this test started.
            assert_eq!(
                unsafe { libc::kill(launcher.id() as i32, libc::SIGTERM) },
                0
            );
        }
        let (status, err) = finished(&mut launcher, what);
        let want = if args.is_empty() { 130 } else { 124 };
        assert_eq!(status.code(), Some(want), "{what}: {err}");
        // Each program was signalled with its wrapper: no waiting for
        // their pipes, and none left running.
        let inner_alive: Vec<u32> = inner.iter().copied().filter(|p| alive(*p)).collect();
        let left = still_running(&[pids, inner].concat());
        assert!(
            inner_alive.is_empty() && left.is_empty(),
            "{what}: {inner_alive:?} outlived the launcher: {err}"
        );
        assert!(
            stop_at.elapsed() < Duration::from_millis(4500),
            "{what}: took {:?}",
            stop_at.elapsed()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A rank that ends (status 0) before it joins the job fails the others'
/// start-up at once: the launcher names rank 0, whose error names the
/// missing rank, and says that rank 2 had exited; ranks 1 and 3 say rank
/// 0 aborted the start-up because rank 2 ended (or, not yet connected,
/// that rank 0 ended), and, only passing that on, are not named. Before,
/// the summary named rank 1 or 3, whose error was "expected the address
/// table from rank 0, got None"; and rank 0 waited out `BRAID_TIMEOUT`
/// (here far past the test's limit) for a rank its launcher knew ended.
#[cfg(unix)]
#[test]
fn a_rank_that_never_joins_is_named() {
    let script = format!(
        "[ \"$BRAID_RANK\" = 2 ] && exit 0; exec {} --len 1000 --laps 2",
        env!("CARGO_BIN_EXE_ring")
    );
    let out = output_within(
        Command::new(env!("CARGO_BIN_EXE_braid-launch"))
            .args(["-n", "4", "--", "sh", "-c", &script])
            .env("BRAID_TIMEOUT", "3600"),
        LIMIT,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("braid-launch: rank 0 failed")
            && err.contains("rank(s) 2 had already exited with status 0"),
        "{err}"
    );
    let gone = "rank 2 ended before it joined the job (exit status: 0; seen by the launcher)";
    assert!(
        err.contains(&format!("[rank 0] error: rank 0: bootstrap failed: {gone}")),
        "{err}"
    );
    for r in [1, 3] {
        let aborted =
            format!("[rank {r}] error: rank {r}: job aborted by rank 0: bootstrap failed: {gone}");
        let rank0_gone = format!(
            "[rank {r}] error: rank {r}: peer rank 0 died or disconnected (rank 0 ended before this rank could join the job (exit status: 1;"
        );
        assert!(err.contains(&aborted) || err.contains(&rank0_gone), "{err}");
    }
    assert!(!err.contains("got None"), "{err}");
}

/// `ring --backend tcp` stopped by Ctrl-C (SIGINT) or SIGTERM exits with
/// status 130, as `rolling` and `braid-launch` do; before, it exited 1.
#[cfg(target_os = "linux")]
#[test]
fn a_stopped_tcp_ring_exits_130() {
    for (sig, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM")] {
        let mut ring = Command::new(env!("CARGO_BIN_EXE_ring"))
            .args(["--backend", "tcp", "--ranks", "2", "--len", "100000"])
            .args(["--laps", "100000000"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Once both rank processes run, the launcher handles the signal.
        let until = Instant::now() + Duration::from_secs(30);
        while children(ring.id()).len() < 2 {
            assert!(Instant::now() < until, "{name}: the ranks did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        let ranks = children(ring.id());
        // SAFETY: a signal to the child this test started.
        assert_eq!(unsafe { libc::kill(ring.id() as i32, sig) }, 0);
        let (status, err) = finished(&mut ring, name);
        assert_eq!(status.code(), Some(130), "{name}: {err}");
        assert!(err.contains("interrupted"), "{name}: {err}");
        let left = still_running(&ranks);
        assert!(left.is_empty(), "{name}: ranks {left:?} still run");
    }
}

/// The processes whose parent is `pid` (Linux, from /proc).
#[cfg(target_os = "linux")]
fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(pid)
            })
        })
        .collect()
}

/// A launcher whose stderr reader has gone (`2>&1 | head -1`) still exits
/// with the failed rank's status: its summary line panicked on the broken
/// pipe (exit 101).
#[cfg(target_os = "linux")]
#[test]
fn a_broken_stderr_keeps_the_failed_ranks_status() {
    let mut launcher = Command::new(env!("CARGO_BIN_EXE_braid-launch"))
        .args(["-n", "2", "--", "sh", "-c"])
        .arg("sleep 0.5; if [ $BRAID_RANK = 1 ]; then exit 3; fi; exec sleep 60")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The reader goes before anything is written.
    drop(launcher.stderr.take());
    let until = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = launcher.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > until {
            let _ = launcher.kill();
            panic!("the launcher did not end");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(3));
}
