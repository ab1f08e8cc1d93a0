//! Starting the processes of a tcp job on this host.
//!
//! [`launch`] starts N copies of a program with the rank environment
//! (`BRAID_RANK`, `BRAID_NRANKS`, `BRAID_ROOT`, `BRAID_TOKEN`), forwards
//! each line they print with a `[rank r]` prefix, and fails the whole job
//! (ending the other ranks) as soon as one rank fails. The root address's
//! socket is bound here and handed to rank 0 already listening
//! (`BRAID_ROOT_FD`, Unix): a port chosen free and bound later by rank 0
//! could be taken in between by another process's connection, which
//! failed a job on a busy host with "Address already in use".

use std::ffi::OsString;
use std::io::Write;
use std::process::{ExitStatus, Stdio};

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;
use tokio::sync::{mpsc, watch};

use crate::Rank;
use crate::comm::tcp::random_token;

/// What to start.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    /// Number of ranks.
    pub nranks: u32,
    /// The program.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Extra environment for every rank.
    pub env: Vec<(OsString, OsString)>,
    /// How the ranks' output is shown.
    pub output: OutputMode,
    /// How long the job may run: past it every rank still running is
    /// stopped and the launch fails with [`LaunchError::TimedOut`] (a rank
    /// stuck waiting, or in a computation that never ends, would otherwise
    /// keep the launcher waiting for ever, as it keeps `mpirun`). `None`:
    /// no limit.
    pub timeout: Option<std::time::Duration>,
    /// Where the ranks' progress is summed ([`crate::rank_progress`]):
    /// each rank that reports through a [`ProgressReporter`] adds its
    /// latest count. `None`: the ranks are not asked to report (Unix only).
    ///
    /// [`ProgressReporter`]: crate::rank_progress::ProgressReporter
    pub progress: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
}

impl LaunchSpec {
    /// `nranks` copies of `program args...`, output prefixed.
    pub fn new(nranks: u32, program: impl Into<OsString>, args: Vec<OsString>) -> Self {
        LaunchSpec {
            nranks,
            program: program.into(),
            args,
            env: Vec::new(),
            output: OutputMode::Prefixed,
            timeout: None,
            progress: None,
        }
    }
}

/// How rank output reaches the launcher's stdout and stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputMode {
    /// Each line as `[rank r] line`.
    Prefixed,
    /// Collected and returned in the [`LaunchReport`], not printed.
    Captured,
}

/// Why a launch failed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// `nranks` was 0.
    #[error("a job needs at least one rank")]
    NoRanks,
    /// No port for the root address could be found.
    #[error("cannot find a free port for the root address: {0}")]
    NoPort(std::io::Error),
    /// A rank's process could not be started.
    #[error("cannot start rank {rank} ({program}): {source}")]
    Spawn {
        /// The rank.
        rank: Rank,
        /// The program.
        program: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A rank failed; the others were ended.
    #[error("rank {rank} failed ({status}); the other ranks were stopped")]
    RankFailed {
        /// The first rank that failed on its own: not one that exited with
        /// [`PEER_FAILED_EXIT`](crate::world::PEER_FAILED_EXIT) (it only
        /// heard of another's failure), unless every failed rank did.
        rank: Rank,
        /// Its exit status.
        status: String,
        /// What every rank printed (captured mode only).
        report: Box<LaunchReport>,
    },
    /// The launcher was interrupted (Ctrl-C, SIGTERM, SIGHUP).
    #[error("interrupted; all ranks were stopped")]
    Interrupted,
    /// The job ran past [`LaunchSpec::timeout`]; the ranks still running
    /// were stopped.
    #[error(
        "the job ran past its timeout of {secs} s; rank(s) {} were still running and were stopped",
        rank_list(running)
    )]
    TimedOut {
        /// The timeout, in seconds.
        secs: f64,
        /// The ranks that had not ended.
        running: Vec<Rank>,
        /// What every rank printed (captured mode only).
        report: Box<LaunchReport>,
    },
}

/// "0, 2, 5": ranks for a message.
fn rank_list(ranks: &[Rank]) -> String {
    ranks
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the ranks did.
#[derive(Debug, Clone, Default)]
pub struct LaunchReport {
    /// Exit status per rank (`None`: not known).
    pub status: Vec<Option<ExitStatus>>,
    /// Captured stdout per rank (captured mode).
    pub stdout: Vec<String>,
    /// Captured stderr per rank (captured mode).
    pub stderr: Vec<String>,
}

/// How long the other ranks get to end on their own once one failed
/// before they are killed. They hear its abort within milliseconds and
/// end with errors of their own; killed at once, the rank whose failure
/// started it all could be killed before it printed why (when a rank that
/// only heard the abort exited first). A rank that does not end (stuck in
/// a computation) is killed when this runs out.
const KILL_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// How long a rank asked to stop (SIGTERM) gets to clean up (its staged
/// output, its spill files) before it is killed (SIGKILL).
const TERM_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// What the launcher asks of the ranks still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Stop {
    /// Nothing: let them run.
    Run,
    /// End, cleaning up (SIGTERM; where there are no signals, a kill).
    Term,
    /// End now (SIGKILL).
    Kill,
}

/// Asks a rank's process to end and clean up: SIGTERM on Unix, where a
/// job's rank ends as on its own failure (it drops its work, so its
/// staged output and spill files go); elsewhere it is killed.
fn terminate(child: &mut tokio::process::Child) {
    #[cfg(unix)]
    if let Some(pid) = child.id().and_then(|p| libc::pid_t::try_from(p).ok()) {
        // SAFETY: kill(2) with a pid this process spawned and has not yet
        // reaped (`id` is None once it has), so the pid is still its child.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        return;
    }
    let _ = child.start_kill();
}

/// The job's root listener: bound here and handed to rank 0 (see
/// `TcpConfig::root_fd`), so the port is never free between its choice
/// and rank 0's listening.
fn root_listener() -> Result<(std::net::TcpListener, String), LaunchError> {
    let l = std::net::TcpListener::bind(("127.0.0.1", 0)).map_err(LaunchError::NoPort)?;
    let port = l.local_addr().map_err(LaunchError::NoPort)?.port();
    Ok((l, format!("127.0.0.1:{port}")))
}

/// Lets rank 0's process inherit `listener` and tells it which descriptor
/// it is (`BRAID_ROOT_FD`).
#[cfg(unix)]
fn hand_over(cmd: &mut Command, listener: &std::net::TcpListener) {
    use std::os::fd::AsRawFd;
    inherit(cmd, "BRAID_ROOT_FD", listener.as_raw_fd());
}

/// Lets the rank's process inherit descriptor `fd` (which this process
/// holds open until the rank has been spawned) and names it in `var`.
#[cfg(unix)]
fn inherit(cmd: &mut Command, var: &str, fd: i32) {
    cmd.env(var, fd.to_string());
    // SAFETY: the closure only calls fcntl on a descriptor this process
    // holds open until the child has been spawned (async-signal-safe, no
    // allocation): it clears close-on-exec, so the child keeps it.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Linux: the rank is killed (SIGKILL) when the thread that started it
/// ends, so a launcher that dies without running its own cleanup (killed
/// with SIGKILL, say) leaves no rank behind. That thread is the one that
/// polls [`launch`] when it spawns: the caller's, under `block_on`, or a
/// runtime worker, both alive while the launcher runs. A rank whose
/// launcher is gone before this is set exits at once.
#[cfg(target_os = "linux")]
fn die_with_launcher(cmd: &mut Command) {
    let launcher = std::process::id() as libc::pid_t;
    // SAFETY: the closure only calls prctl, getppid and _exit
    // (async-signal-safe, no allocation).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != launcher {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

/// Elsewhere rank 0 binds the root address itself (the port may be taken
/// meanwhile, rarely).
#[cfg(not(unix))]
fn hand_over(_cmd: &mut Command, _listener: &std::net::TcpListener) {}

/// Completes when the launcher is asked to stop: Ctrl-C (SIGINT) and, on
/// Unix, SIGTERM or SIGHUP (what `kill`, a batch system's cancel or a
/// closed terminal sends). The ranks are then stopped (SIGTERM, then
/// SIGKILL after `TERM_GRACE`), not left running
/// (a launcher ended by SIGTERM left its ranks behind). Call it before
/// the first rank starts: on Unix the handlers are installed here, not
/// when the future is first polled (a signal in between would end the
/// launcher the default way). A signal whose handler cannot be installed
/// never completes.
fn stop_requested() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let streams: Vec<_> = [
            SignalKind::interrupt(),
            SignalKind::terminate(),
            SignalKind::hangup(),
        ]
        .into_iter()
        .filter_map(|k| signal(k).ok())
        .collect();
        async move {
            if streams.is_empty() {
                return std::future::pending::<()>().await;
            }
            let waits = streams.into_iter().map(|mut s| {
                Box::pin(async move {
                    s.recv().await;
                })
            });
            futures::future::select_all(waits).await;
        }
    }
    #[cfg(not(unix))]
    async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

async fn forward<R: AsyncRead + Unpin>(
    r: R,
    rank: Rank,
    to_stderr: bool,
    mode: OutputMode,
) -> String {
    let mut r = BufReader::new(r);
    let mut line = Vec::new();
    let mut captured = String::new();
    loop {
        line.clear();
        match r.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return captured,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end_matches(['\n', '\r']);
        match mode {
            OutputMode::Prefixed => {
                let out = format!("[rank {rank}] {text}\n");
                if to_stderr {
                    let _ = std::io::stderr().lock().write_all(out.as_bytes());
                } else {
                    let _ = std::io::stdout().lock().write_all(out.as_bytes());
                }
            }
            OutputMode::Captured => {
                captured.push_str(text);
                captured.push('\n');
            }
        }
    }
}

/// Starts the job and waits for it. Returns the report when every rank
/// exits with success; otherwise ends the remaining ranks and returns the
/// failure: the first rank's that failed on its own (see
/// [`LaunchError::RankFailed`]).
pub async fn launch(spec: LaunchSpec) -> Result<LaunchReport, LaunchError> {
    if spec.nranks == 0 {
        return Err(LaunchError::NoRanks);
    }
    let n = spec.nranks as usize;
    let stop = stop_requested();
    let (listener, root) = root_listener()?;
    // Where it cannot be handed over, rank 0 binds the address itself:
    // let go of it first.
    let mut listener = cfg!(unix).then_some(listener);
    let token = random_token();
    // The ranks' progress reports, where asked for (a pipe the launcher
    // cannot open only costs the reports).
    #[cfg(unix)]
    let progress_pipe = spec
        .progress
        .as_ref()
        .and_then(|_| crate::rank_progress::ProgressPipe::new().ok());
    let (stop_tx, stop_rx) = watch::channel(Stop::Run);
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(Rank, Option<ExitStatus>)>();
    let mut io_tasks = Vec::new();
    let mut rank_tasks = Vec::new();
    for rank in 0..spec.nranks {
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .env("BRAID_RANK", rank.to_string())
            .env("BRAID_NRANKS", spec.nranks.to_string())
            .env("BRAID_ROOT", &root)
            .env("BRAID_TOKEN", &token)
            // Every rank runs on this host: waiters poll only if that fits.
            .env(crate::context::HOST_RANKS_ENV, spec.nranks.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let (0, Some(l)) = (rank, listener.as_ref()) {
            hand_over(&mut cmd, l);
        }
        #[cfg(unix)]
        if let Some(fd) = progress_pipe.as_ref().and_then(|p| p.write_fd()) {
            inherit(&mut cmd, crate::rank_progress::PROGRESS_FD_ENV, fd);
        }
        #[cfg(target_os = "linux")]
        die_with_launcher(&mut cmd);
        let spawned = cmd.spawn();
        if rank == 0 {
            // Rank 0 holds the listening socket now (or failed to start).
            drop(listener.take());
        }
        let mut child = match spawned {
            Ok(c) => c,
            Err(source) => {
                let _ = stop_tx.send(Stop::Kill);
                return Err(LaunchError::Spawn {
                    rank,
                    program: spec.program.to_string_lossy().into_owned(),
                    source,
                });
            }
        };
        if let Some(o) = child.stdout.take() {
            io_tasks.push((
                rank,
                false,
                tokio::spawn(forward(o, rank, false, spec.output)),
            ));
        }
        if let Some(e) = child.stderr.take() {
            io_tasks.push((
                rank,
                true,
                tokio::spawn(forward(e, rank, true, spec.output)),
            ));
        }
        let mut stop_rx = stop_rx.clone();
        let done_tx = done_tx.clone();
        rank_tasks.push(tokio::spawn(async move {
            // Asked to stop: SIGTERM first, SIGKILL once the launcher says
            // so (or at once where it asks for that first).
            let mut asked = Stop::Run;
            let status = loop {
                tokio::select! {
                    s = child.wait() => break s.ok(),
                    c = stop_rx.changed() => {
                        if c.is_err() {
                            // The launch was dropped (its caller gave up on
                            // it): no one will watch this rank, so it ends.
                            let _ = child.start_kill();
                            break child.wait().await.ok();
                        }
                        let now = *stop_rx.borrow_and_update();
                        if now > asked {
                            match now {
                                Stop::Run => {}
                                Stop::Term => terminate(&mut child),
                                Stop::Kill => {
                                    let _ = child.start_kill();
                                }
                            }
                            asked = now;
                        }
                    }
                }
            };
            let _ = done_tx.send((rank, status));
        }));
    }
    drop(done_tx);
    #[cfg(unix)]
    if let (Some(pipe), Some(total)) = (progress_pipe, spec.progress.clone()) {
        pipe.collect(spec.nranks, total);
    }
    let mut report = LaunchReport {
        status: vec![None; n],
        stdout: vec![String::new(); n],
        stderr: vec![String::new(); n],
    };
    // The first rank to fail, and the first to fail on its own (not
    // with `PEER_FAILED_EXIT`, passing on another's failure): a rank
    // that only heard of the failure may exit before the one that caused
    // it, and the summary names the cause.
    let mut first_failure: Option<(Rank, String)> = None;
    let mut first_cause: Option<(Rank, String)> = None;
    let mut killing = false;
    // After a failure, when the ranks still running are asked to stop.
    let mut kill_at: Option<tokio::time::Instant> = None;
    // Once they have been asked (SIGTERM), when they are killed.
    let mut hard_at: Option<tokio::time::Instant> = None;
    let mut interrupted = false;
    // Past the job's timeout: the ranks that had not ended by then.
    let deadline = spec.timeout.map(|t| tokio::time::Instant::now() + t);
    let mut timed_out: Option<Vec<Rank>> = None;
    let mut ended = vec![false; n];
    let mut remaining = n;
    // Asks the ranks still running to stop, and kills them after
    // `TERM_GRACE` (a rank that ends on SIGTERM removes its staged output
    // and spill files; a SIGKILL at once left them behind).
    let ask_to_stop = |hard_at: &mut Option<tokio::time::Instant>| {
        // (Never back from Kill to Term.)
        stop_tx.send_if_modified(|s| {
            let ask = *s < Stop::Term;
            if ask {
                *s = Stop::Term;
            }
            ask
        });
        hard_at.get_or_insert(tokio::time::Instant::now() + TERM_GRACE);
    };
    tokio::pin!(stop);
    while remaining > 0 {
        tokio::select! {
            // Ranks that have ended are taken first: a stop signal that
            // comes as the last ones end finds them ended, and stops
            // nothing (the job, and what it wrote, is whole).
            biased;
            d = done_rx.recv() => {
                let Some((rank, status)) = d else { break };
                remaining -= 1;
                report.status[rank as usize] = status;
                ended[rank as usize] = true;
                let ok = status.map(|s| s.success()).unwrap_or(false);
                if !ok && !interrupted {
                    let text = status.map(|s| s.to_string()).unwrap_or_else(|| "unknown status".into());
                    let echo = status.and_then(|s| s.code())
                        == Some(i32::from(crate::world::PEER_FAILED_EXIT));
                    // (A rank the launcher stopped is no cause.)
                    if first_cause.is_none() && !echo && !killing {
                        first_cause = Some((rank, text.clone()));
                    }
                    if first_failure.is_none() {
                        first_failure = Some((rank, text));
                        kill_at = Some(tokio::time::Instant::now() + KILL_GRACE);
                    }
                }
            }
            _ = async {
                if let Some(t) = kill_at {
                    tokio::time::sleep_until(t).await;
                }
            }, if kill_at.is_some() => {
                kill_at = None;
                killing = true;
                ask_to_stop(&mut hard_at);
            }
            _ = async {
                if let Some(t) = hard_at {
                    tokio::time::sleep_until(t).await;
                }
            }, if hard_at.is_some() => {
                hard_at = None;
                let _ = stop_tx.send(Stop::Kill);
            }
            _ = &mut stop, if !interrupted => {
                interrupted = true;
                ask_to_stop(&mut hard_at);
            }
            _ = async {
                if let Some(t) = deadline {
                    tokio::time::sleep_until(t).await;
                }
            }, if deadline.is_some() && timed_out.is_none() && !killing && !interrupted => {
                timed_out = Some(
                    (0..spec.nranks)
                        .filter(|r| !ended[*r as usize])
                        .collect(),
                );
                killing = true;
                kill_at = None;
                ask_to_stop(&mut hard_at);
            }
        }
    }
    for t in rank_tasks {
        let _ = t.await;
    }
    // A grandchild may hold a pipe open; do not wait for it for ever (one
    // deadline for all of them, not 5 s a pipe).
    let io_deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    for (rank, is_err, t) in io_tasks {
        if let Ok(Ok(text)) = tokio::time::timeout_at(io_deadline, t).await {
            if is_err {
                report.stderr[rank as usize] = text;
            } else {
                report.stdout[rank as usize] = text;
            }
        }
    }
    if interrupted {
        return Err(LaunchError::Interrupted);
    }
    // A rank that failed on its own before the timeout is the cause; the
    // ranks stopped at the timeout (and those that only heard of it) are
    // not.
    if let (Some(running), None) = (timed_out, &first_cause) {
        return Err(LaunchError::TimedOut {
            secs: spec.timeout.map_or(0.0, |t| t.as_secs_f64()),
            running,
            report: Box::new(report),
        });
    }
    match first_cause.or(first_failure) {
        Some((rank, status)) => Err(LaunchError::RankFailed {
            rank,
            status,
            report: Box::new(report),
        }),
        None => Ok(report),
    }
}
