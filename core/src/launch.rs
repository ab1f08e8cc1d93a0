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
//!
//! Each rank runs in a process group of its own (Unix), and stopping a
//! rank signals its whole group: a rank started through a wrapper script
//! (`sh -c 'prog; echo done'`) is stopped with its program, not only the
//! shell. Since the ranks are then outside the terminal's foreground
//! group, Ctrl-C reaches only the launcher, which passes it on (SIGTERM
//! to every rank's group). What a rank leaves running in its group when
//! it exits ends with the job. The ranks' lines are printed by threads of
//! their own through bounded queues: a reader that stops reading stalls
//! the ranks' output, never the launcher's timeout or signal handling.

use std::ffi::OsString;
use std::io::Write;
use std::process::{ExitStatus, Stdio};

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;
use tokio::sync::{mpsc, oneshot, watch};

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
    /// keep the launcher waiting for ever, as it keeps `mpirun`); a job
    /// whose every rank still ends with status 0 (one that lets a commit
    /// in progress finish) succeeds. `None`: no limit.
    pub timeout: Option<std::time::Duration>,
    /// Where the ranks' progress is summed ([`crate::rank_progress`]):
    /// each rank that reports through a [`ProgressReporter`] adds its
    /// latest counts. `None`: the ranks are not asked to report (Unix only).
    ///
    /// [`ProgressReporter`]: crate::rank_progress::ProgressReporter
    pub progress: Option<std::sync::Arc<crate::rank_progress::Progress>>,
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
    #[error(
        "rank {rank} failed ({status}){}; the other ranks were stopped",
        early_note(exited_first)
    )]
    RankFailed {
        /// The first rank that failed on its own: not one that exited with
        /// [`PEER_FAILED_EXIT`](crate::world::PEER_FAILED_EXIT) (it only
        /// heard of another's failure), unless every failed rank did.
        rank: Rank,
        /// Its exit status.
        status: String,
        /// The ranks that had exited with success before the first
        /// failure, while others still ran: a rank that ends before it
        /// joins the job fails the others' start-up, and is named here.
        exited_first: Vec<Rank>,
        /// What every rank printed (captured mode only).
        report: Box<LaunchReport>,
    },
    /// The thread that prints the ranks' output could not be started.
    #[error("cannot start the thread that prints the ranks' output: {0}")]
    Output(std::io::Error),
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

/// "; rank(s) 2 had exited with status 0 before that": the ranks that
/// ended with success before a failure (none: nothing).
fn early_note(ranks: &[Rank]) -> String {
    if ranks.is_empty() {
        return String::new();
    }
    format!(
        "; rank(s) {} had already exited with status 0 before that, while the others ran",
        rank_list(ranks)
    )
}

/// What the ranks did.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct LaunchReport {
    /// Exit status per rank (`None`: not known).
    pub status: Vec<Option<ExitStatus>>,
    /// Captured stdout per rank (captured mode).
    pub stdout: Vec<String>,
    /// Captured stderr per rank (captured mode).
    pub stderr: Vec<String>,
    /// The ranks still running when the job's timeout passed, where every
    /// rank then ended with status 0 anyway (a rank asked to stop while it
    /// commits its output lets the commit finish): the job is whole, and
    /// a launcher says the timeout fired. Empty otherwise.
    pub outlived_timeout: Vec<Rank>,
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

/// How long a stopped job's output may take to reach the launcher's
/// stdout and stderr once its ranks have ended: a pipe held open by a
/// process that left its rank's group, or a reader that stopped reading,
/// does not keep the launcher waiting. (A job that ended on its own gets
/// [`IO_WAIT`] for its pipes, and its output is printed in full unless
/// the launcher is asked to stop.)
const STOPPED_IO_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// How long the launcher waits for a rank's pipes to close once the rank
/// has ended on its own (a process it started may hold them open).
const IO_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Lines queued for the launcher's stdout (and as many for its stderr)
/// before the ranks' output waits for the reader.
const PRINT_QUEUE: usize = 1024;

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

/// Sends `sig` to the process group of a rank's process (`pgid`, the
/// rank's pid: each rank leads a group of its own), so that what a wrapper
/// script started goes with it. Whether any process got it.
#[cfg(unix)]
fn signal_group(pgid: libc::pid_t, sig: libc::c_int) -> bool {
    // SAFETY: kill(2) on the group this launcher made for one rank; its
    // id stays reserved while any process of the group lives (a group id
    // is not reused as a process id meanwhile), and it fails with ESRCH
    // once none does.
    pgid > 0 && unsafe { libc::kill(-pgid, sig) } == 0
}

/// Asks a rank to end and clean up: SIGTERM to its process group on Unix,
/// where a job's rank ends as on its own failure (it drops its work, so
/// its staged output and spill files go); elsewhere it is killed.
fn terminate(child: &mut tokio::process::Child, pgid: Option<i32>) {
    #[cfg(unix)]
    if let Some(g) = pgid {
        if term_group(g) {
            return;
        }
    }
    #[cfg(not(unix))]
    let _ = pgid;
    let _ = child.start_kill();
}

/// SIGTERM to a rank's process group, then SIGCONT: a stopped process
/// (SIGSTOP, Ctrl-Z) holds a SIGTERM pending until it runs again, and was
/// killed at the end of the grace without having cleaned up (its staged
/// output, lock and spill files stayed). Whether any process got it.
#[cfg(unix)]
fn term_group(pgid: libc::pid_t) -> bool {
    let sent = signal_group(pgid, libc::SIGTERM);
    if sent {
        signal_group(pgid, libc::SIGCONT);
    }
    sent
}

/// Kills a rank: its whole process group on Unix (SIGKILL), and its
/// process in any case.
fn kill_rank(child: &mut tokio::process::Child, pgid: Option<i32>) {
    #[cfg(unix)]
    if let Some(g) = pgid {
        signal_group(g, libc::SIGKILL);
    }
    #[cfg(not(unix))]
    let _ = pgid;
    let _ = child.start_kill();
}

/// Whether any process of a rank's group still runs. On Linux a zombie
/// does not count (an orphan the rank left is reaped by init, which may
/// take its time; it holds no pipe). `false` off Unix, where a rank has
/// no group.
fn group_alive(pgid: Option<i32>) -> bool {
    #[cfg(unix)]
    if let Some(g) = pgid {
        if !signal_group(g, 0) {
            return false;
        }
        #[cfg(target_os = "linux")]
        return linux_group_runs(g);
        #[cfg(not(target_os = "linux"))]
        return true;
    }
    let _ = pgid;
    false
}

/// Whether /proc lists a process of group `pgid` that is not a zombie
/// (true where /proc cannot be read: the group is then taken as alive).
#[cfg(target_os = "linux")]
fn linux_group_runs(pgid: i32) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return true;
    };
    dir.flatten().any(|e| {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            return false;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return false;
        };
        // "pid (comm) state ppid pgrp ...": the name may hold anything,
        // so the fields are counted from its closing parenthesis.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            return false;
        };
        let mut f = rest.split_whitespace();
        let (state, pgrp) = (f.next(), f.nth(1));
        state != Some("Z") && pgrp.and_then(|p| p.parse::<i32>().ok()) == Some(pgid)
    })
}

/// Ends the processes still running in the ranks' groups once every rank
/// has ended: SIGTERM, then SIGKILL to those that outlast [`TERM_GRACE`].
/// A job's processes end with it; left running, they held the ranks'
/// pipes (the launcher waited [`IO_WAIT`] for them) and outlived the
/// launcher. (Off Unix a rank has no group: nothing to do.)
async fn sweep(groups: &[Option<i32>]) {
    #[cfg(unix)]
    {
        let mut left: Vec<i32> = groups
            .iter()
            .flatten()
            .copied()
            .filter(|g| group_alive(Some(*g)))
            .collect();
        for g in &left {
            term_group(*g);
        }
        let until = tokio::time::Instant::now() + TERM_GRACE;
        while !left.is_empty() && tokio::time::Instant::now() < until {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            left.retain(|g| group_alive(Some(*g)));
        }
        for g in left {
            signal_group(g, libc::SIGKILL);
        }
    }
    #[cfg(not(unix))]
    let _ = groups;
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

/// The requests to stop the launcher: Ctrl-C (SIGINT) and, on Unix,
/// SIGTERM or SIGHUP (what `kill`, a batch system's cancel or a closed
/// terminal sends). The ranks are then stopped (SIGTERM to each rank's
/// process group, then SIGKILL after `TERM_GRACE`), not left running (a
/// launcher ended by SIGTERM left its ranks behind). Made before the first
/// rank starts: on Unix the handlers are installed here, not when first
/// waited on (a signal in between would end the launcher the default
/// way). A signal whose handler cannot be installed never comes, and
/// neither does one this process was started ignoring (`nohup` ignores
/// SIGHUP, a shell ignores SIGINT in a job it starts in the background):
/// the user asked for the job to outlive it.
struct StopSignals {
    #[cfg(unix)]
    streams: Vec<tokio::signal::unix::Signal>,
}

impl StopSignals {
    /// Installs the handlers.
    fn install() -> StopSignals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let streams = [
                SignalKind::interrupt(),
                SignalKind::terminate(),
                SignalKind::hangup(),
            ]
            .into_iter()
            .filter(|k| !signal_ignored(k.as_raw_value()))
            .filter_map(|k| signal(k).ok())
            .collect();
            StopSignals { streams }
        }
        #[cfg(not(unix))]
        StopSignals {}
    }

    /// Completes at the next request to stop.
    async fn recv(&mut self) {
        #[cfg(unix)]
        {
            if self.streams.is_empty() {
                return std::future::pending::<()>().await;
            }
            let waits = self.streams.iter_mut().map(|s| {
                Box::pin(async move {
                    s.recv().await;
                })
            });
            futures::future::select_all(waits).await;
        }
        #[cfg(not(unix))]
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Whether this process ignores signal `sig` (its disposition is
/// `SIG_IGN`, as inherited through exec from `nohup` or a shell's
/// background job); `false` where that cannot be read. A program that
/// handles stop signals skips these: the user asked it to outlive them.
#[cfg(unix)]
pub fn signal_ignored(sig: libc::c_int) -> bool {
    // SAFETY: sigaction(2) with no new action only reads the current one
    // into `old`, a zeroed `sigaction` this function owns.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

/// Where the ranks' lines go in [`OutputMode::Prefixed`]: a thread that
/// writes them to the launcher's stdout or stderr, fed through a bounded
/// queue. A write blocks only that thread: a reader that stops reading
/// (`braid-launch ... | sleep`) fills the queue, and then the ranks' pipes,
/// while the runtime that signals and reaps the ranks runs on.
struct Printer {
    /// The queue (the forwarders hold clones; the thread ends once every
    /// one is dropped and the queue is written out).
    tx: mpsc::Sender<Vec<u8>>,
    /// Completes once the thread has written everything queued.
    drained: oneshot::Receiver<()>,
}

impl Printer {
    /// The printer of stdout (`to_stderr` false) or stderr.
    fn start(to_stderr: bool) -> Result<Printer, LaunchError> {
        let (tx, mut rx) = mpsc::channel::<Vec<u8>>(PRINT_QUEUE);
        let (done_tx, drained) = oneshot::channel();
        std::thread::Builder::new()
            .name(
                if to_stderr {
                    "braid-stderr"
                } else {
                    "braid-stdout"
                }
                .into(),
            )
            .spawn(move || {
                while let Some(line) = rx.blocking_recv() {
                    // A reader that is gone (EPIPE) costs only the output:
                    // the queue is still emptied, so no rank waits on it.
                    let _ = if to_stderr {
                        std::io::stderr().lock().write_all(&line)
                    } else {
                        std::io::stdout().lock().write_all(&line)
                    };
                }
                let _ = done_tx.send(());
            })
            .map_err(LaunchError::Output)?;
        Ok(Printer { tx, drained })
    }
}

/// The longest piece of a rank's output forwarded as one line: a longer
/// line (or output without newlines) goes on in pieces of this size,
/// rather than be held whole in the launcher's memory.
const LINE_MAX: usize = 64 << 10;

/// Reads a rank's stdout or stderr to its end: each line (or piece of
/// [`LINE_MAX`] bytes) goes to `print` prefixed with the rank (waiting
/// while its queue is full, never blocking a thread), or, without
/// `print`, is kept and returned.
async fn forward<R: AsyncRead + Unpin>(
    r: R,
    rank: Rank,
    print: Option<mpsc::Sender<Vec<u8>>>,
) -> String {
    let mut r = BufReader::new(r);
    let mut line = Vec::new();
    let mut captured = String::new();
    // Whether the last piece went out cut at `LINE_MAX` (a newline right
    // after it ends that line, not an empty one).
    let mut cut = false;
    loop {
        let (took, ended) = match r.fill_buf().await {
            Ok([]) | Err(_) => (0, true),
            Ok(buf) => {
                let room = LINE_MAX - line.len();
                match buf.iter().position(|&b| b == b'\n') {
                    Some(i) if i < room => {
                        line.extend_from_slice(&buf[..=i]);
                        (i + 1, true)
                    }
                    _ => {
                        let take = buf.len().min(room);
                        line.extend_from_slice(&buf[..take]);
                        (take, line.len() >= LINE_MAX)
                    }
                }
            }
        };
        r.consume(took);
        let eof = took == 0;
        if !ended || line.is_empty() {
            if eof {
                return captured;
            }
            continue;
        }
        let was_cut = std::mem::replace(&mut cut, !line.ends_with(b"\n"));
        if was_cut && line == b"\n" {
            line.clear();
            continue;
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end_matches(['\n', '\r']);
        match &print {
            Some(tx) => {
                // (The printer gone: the line is dropped, the pipe still
                // read to its end.)
                let _ = tx
                    .send(format!("[rank {rank}] {text}\n").into_bytes())
                    .await;
            }
            None => {
                captured.push_str(text);
                captured.push('\n');
            }
        }
        line.clear();
        if eof {
            return captured;
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
    let mut stop = StopSignals::install();
    // The printers of the ranks' lines (none where they are captured).
    let printers = match spec.output {
        OutputMode::Prefixed => Some((Printer::start(false)?, Printer::start(true)?)),
        OutputMode::Captured => None,
    };
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
    // Each rank's pipe of exit notices ([`crate::rank_exits`]).
    #[cfg(unix)]
    let mut exit_notices = crate::rank_exits::ExitNotices::new(n);
    let (stop_tx, stop_rx) = watch::channel(Stop::Run);
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(Rank, Option<ExitStatus>)>();
    let mut io_tasks = Vec::new();
    let mut rank_tasks = Vec::new();
    // Each started rank's process group.
    let mut groups: Vec<Option<i32>> = Vec::new();
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
            // Descriptors named by this process's own environment (a
            // launcher started as a rank of another job) are none of the
            // ranks': only those handed over below are named.
            .env_remove("BRAID_ROOT_FD")
            .env_remove(crate::rank_progress::PROGRESS_FD_ENV)
            .env_remove(crate::rank_exits::EXITS_FD_ENV);
        // The ranks are this launcher's job, not tasks of an mpirun or srun
        // launch this launcher runs in (each would take itself for one).
        for v in crate::world::MPI_LAUNCH_VARS {
            cmd.env_remove(v);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // A group of its own, which stopping the rank signals whole.
        #[cfg(unix)]
        cmd.process_group(0);
        if let (0, Some(l)) = (rank, listener.as_ref()) {
            hand_over(&mut cmd, l);
        }
        #[cfg(unix)]
        if let Some(fd) = progress_pipe.as_ref().and_then(|p| p.write_fd()) {
            inherit(&mut cmd, crate::rank_progress::PROGRESS_FD_ENV, fd);
        }
        #[cfg(unix)]
        if let Some(fd) = exit_notices.read_fd(rank) {
            inherit(&mut cmd, crate::rank_exits::EXITS_FD_ENV, fd);
        }
        #[cfg(target_os = "linux")]
        die_with_launcher(&mut cmd);
        let spawned = cmd.spawn();
        #[cfg(unix)]
        exit_notices.started(rank);
        if rank == 0 {
            // Rank 0 holds the listening socket now (or failed to start).
            drop(listener.take());
        }
        let mut child = match spawned {
            Ok(c) => c,
            Err(source) => {
                // The ranks started so far are asked to stop as a failed
                // job's are (SIGTERM: what they staged or spilled goes),
                // and killed if they outlast the grace.
                let _ = stop_tx.send(Stop::Term);
                let mut started = futures::future::join_all(std::mem::take(&mut rank_tasks));
                if tokio::time::timeout(TERM_GRACE, &mut started)
                    .await
                    .is_err()
                {
                    let _ = stop_tx.send(Stop::Kill);
                    started.await;
                }
                return Err(LaunchError::Spawn {
                    rank,
                    program: spec.program.to_string_lossy().into_owned(),
                    source,
                });
            }
        };
        // The rank leads its group: the group's id is its pid.
        let pgid = child.id().and_then(|p| i32::try_from(p).ok());
        groups.push(pgid);
        if let Some(o) = child.stdout.take() {
            let print = printers.as_ref().map(|(p, _)| p.tx.clone());
            io_tasks.push((rank, false, tokio::spawn(forward(o, rank, print))));
        }
        if let Some(e) = child.stderr.take() {
            let print = printers.as_ref().map(|(_, p)| p.tx.clone());
            io_tasks.push((rank, true, tokio::spawn(forward(e, rank, print))));
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
                            kill_rank(&mut child, pgid);
                            asked = Stop::Kill;
                            break child.wait().await.ok();
                        }
                        let now = *stop_rx.borrow_and_update();
                        if now > asked {
                            match now {
                                Stop::Run => {}
                                Stop::Term => terminate(&mut child, pgid),
                                Stop::Kill => kill_rank(&mut child, pgid),
                            }
                            asked = now;
                        }
                    }
                }
            };
            let _ = done_tx.send((rank, status));
            // A rank asked to stop may end before what it started in its
            // group (a wrapper shell ends at SIGTERM while its program
            // still cleans up): the group gets the same grace, and is
            // killed with the rest when it runs out.
            while asked >= Stop::Term && group_alive(pgid) {
                if asked == Stop::Kill {
                    kill_rank(&mut child, pgid);
                    break;
                }
                tokio::select! {
                    _ = tokio::time::sleep(std::time::Duration::from_millis(50)) => {}
                    c = stop_rx.changed() => {
                        asked = if c.is_err() {
                            Stop::Kill
                        } else {
                            asked.max(*stop_rx.borrow_and_update())
                        };
                    }
                }
            }
        }));
    }
    drop(done_tx);
    // Only the forwarders hold the printers' queues now: each printer ends
    // once they have ended and it has written what they queued.
    let drained: Vec<oneshot::Receiver<()>> = printers
        .into_iter()
        .flat_map(|(o, e)| [o.drained, e.drained])
        .collect();
    #[cfg(unix)]
    if let (Some(pipe), Some(total)) = (progress_pipe, spec.progress.clone()) {
        pipe.collect(spec.nranks, total);
    }
    let mut report = LaunchReport {
        status: vec![None; n],
        stdout: vec![String::new(); n],
        stderr: vec![String::new(); n],
        outlived_timeout: Vec::new(),
    };
    // The first rank to fail, and the first to fail on its own (not
    // with `PEER_FAILED_EXIT`, passing on another's failure): a rank
    // that only heard of the failure may exit before the one that caused
    // it, and the summary names the cause.
    let mut first_failure: Option<(Rank, String)> = None;
    let mut first_cause: Option<(Rank, String)> = None;
    // The ranks that ended with success before any failure while others
    // still ran (a rank that leaves before it joins fails the others).
    let mut exited_first: Vec<Rank> = Vec::new();
    let mut killing = false;
    // After a failure, when the ranks still running are asked to stop.
    let mut kill_at: Option<tokio::time::Instant> = None;
    // Once they have been asked (SIGTERM), when they are killed.
    let mut hard_at: Option<tokio::time::Instant> = None;
    let mut interrupted = false;
    // Past the job's timeout: the ranks that had not ended by then.
    // (A timeout past what the clock can count is none.)
    let deadline = spec
        .timeout
        .and_then(|t| tokio::time::Instant::now().checked_add(t));
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
                // The ranks still in their start-up stop waiting for it.
                #[cfg(unix)]
                exit_notices.tell(&crate::rank_exits::Ended {
                    rank,
                    ok,
                    status: status.map_or_else(|| "unknown status".into(), |s| s.to_string()),
                });
                if ok && remaining > 0 && first_failure.is_none() && !killing && !interrupted {
                    exited_first.push(rank);
                }
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
            _ = stop.recv(), if !interrupted => {
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
    // Every rank has ended; the groups of those asked to stop end within
    // the same grace (killed when it runs out).
    let ranks_done = futures::future::join_all(rank_tasks);
    tokio::pin!(ranks_done);
    match hard_at {
        Some(t) => tokio::select! {
            _ = &mut ranks_done => {}
            _ = tokio::time::sleep_until(t) => {
                let _ = stop_tx.send(Stop::Kill);
                ranks_done.await;
            }
        },
        None => {
            ranks_done.await;
        }
    }
    // What ranks that ended on their own left running in their groups
    // (`sh -c 'prog & exit 0'`) ends with the job, as a stopped rank's does.
    sweep(&groups).await;
    // A process that left its rank's group may hold a pipe open, and a
    // reader may not read: wait for neither for ever (one deadline for all
    // the pipes; a stopped job's output gets less).
    let stopped = interrupted || killing;
    let io_deadline = tokio::time::Instant::now() + if stopped { STOPPED_IO_WAIT } else { IO_WAIT };
    for (rank, is_err, mut t) in io_tasks {
        match tokio::time::timeout_at(io_deadline, &mut t).await {
            Ok(Ok(text)) if is_err => report.stderr[rank as usize] = text,
            Ok(Ok(text)) => report.stdout[rank as usize] = text,
            Ok(Err(_)) => {}
            // (Its queued lines stay queued; its pipe is let go of.)
            Err(_) => t.abort(),
        }
    }
    // The lines still queued for the launcher's stdout and stderr: a job
    // that ended on its own prints them all, unless the launcher is asked
    // to stop meanwhile or the job's timeout passes; a stopped job's get
    // until the deadline above.
    for d in drained {
        if stopped {
            let _ = tokio::time::timeout_at(io_deadline, d).await;
            continue;
        }
        tokio::select! {
            _ = d => {}
            _ = stop.recv() => break,
            _ = async {
                match deadline {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending::<()>().await,
                }
            } => break,
        }
    }
    // Interrupted, unless every rank succeeded anyway: a rank asked to stop
    // while it puts its output in place lets that finish (a stop then
    // could leave the ranks' parts mixed), and a job that ended whole is
    // no interrupted one.
    let all_ok = report.status.iter().all(|s| s.is_some_and(|s| s.success()));
    if interrupted && !all_ok {
        return Err(LaunchError::Interrupted);
    }
    // A rank that failed on its own before the timeout is the cause; the
    // ranks stopped at the timeout (and those that only heard of it) are
    // not. A job whose every rank still ended with status 0 (a rank asked
    // to stop during its commit lets the commit finish) is whole, as an
    // interrupted one is.
    match (timed_out, &first_cause, all_ok) {
        (Some(running), None, false) => {
            return Err(LaunchError::TimedOut {
                secs: spec.timeout.map_or(0.0, |t| t.as_secs_f64()),
                running,
                report: Box::new(report),
            });
        }
        (Some(running), _, true) => report.outlived_timeout = running,
        _ => {}
    }
    match first_cause.or(first_failure) {
        Some((rank, status)) => Err(LaunchError::RankFailed {
            rank,
            status,
            exited_first,
            report: Box::new(report),
        }),
        None => Ok(report),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines come out whole; a line longer than `LINE_MAX` in pieces of
    /// it (its newline ending it, not adding an empty line); a last line
    /// without a newline too.
    #[test]
    fn output_lines_are_cut_at_the_cap() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let long = "x".repeat(2 * LINE_MAX + 100);
        let exact = "y".repeat(LINE_MAX);
        let text = format!("a\n{long}\n{exact}\n\nb");
        let got = rt.block_on(forward(text.as_bytes(), 3, None));
        let want = [
            "a".to_string(),
            "x".repeat(LINE_MAX),
            "x".repeat(LINE_MAX),
            "x".repeat(100),
            exact,
            String::new(),
            "b".to_string(),
        ];
        let lines: Vec<&str> = got.lines().collect();
        assert_eq!(
            lines.len(),
            want.len(),
            "{:?}",
            lines.iter().map(|l| l.len()).collect::<Vec<_>>()
        );
        for (g, w) in lines.iter().zip(&want) {
            assert_eq!(g, w);
        }
    }
}
