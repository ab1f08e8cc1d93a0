//! Starting a job's ranks: every rank of an in-process (`local`) job, or the
//! one rank of this process in a `tcp` job, each with its own `Context`.

use std::future::Future;
use std::sync::Arc;

use futures::FutureExt as _;

use crate::Rank;
use crate::comm::local::LocalComm;
use crate::comm::tcp::{TcpComm, TcpConfig};
use crate::comm::{Backend, Communicator};
use crate::context::{Context, JobEnd, ProgressEngine, RankThreads};
use crate::error::CommError;
use crate::graph::BoxError;
use crate::memory::{BufferResource, MemoryLimits};

/// What mpirun (Open MPI), PMI launchers and srun tell their processes:
/// the launch's size (first three), then the process's task number.
pub const MPI_LAUNCH_VARS: [&str; 6] = [
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    "SLURM_STEP_NUM_TASKS",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "SLURM_PROCID",
];

/// The size of the MPI job this process was started in, as mpirun or srun
/// tell it (Open MPI's `OMPI_COMM_WORLD_SIZE`, the PMI `PMI_SIZE` of MPICH,
/// Intel MPI and srun, Slurm's `SLURM_STEP_NUM_TASKS`), with the variable
/// that said so; `None` outside one.
pub fn mpi_launch_size() -> Option<(&'static str, u32)> {
    MPI_LAUNCH_VARS[..3]
        .iter()
        .copied()
        .find_map(|v| Some((v, std::env::var(v).ok()?.trim().parse().ok()?)))
}

/// This process's rank in the MPI job it was started in, as mpirun or
/// srun tell it (`OMPI_COMM_WORLD_RANK`, `PMI_RANK`, `SLURM_PROCID`), where
/// that job has more than one rank: for errors before MPI is started,
/// which mpirun prints without saying whose they are.
pub fn mpi_launch_rank() -> Option<Rank> {
    mpi_launch_size().filter(|(_, n)| *n > 1)?;
    MPI_LAUNCH_VARS[3..]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
}

/// Which ranks this process runs.
#[derive(Debug, Clone)]
pub enum WorldSpec {
    /// All `nranks` ranks, as tasks of this process.
    Local {
        /// Number of ranks.
        nranks: u32,
    },
    /// One rank of a tcp job.
    Tcp(TcpConfig),
    /// This process's rank of an MPI job (started by mpirun or srun).
    #[cfg(feature = "mpi")]
    Mpi,
}

impl WorldSpec {
    /// The tcp rank described by the `BRAID_*` environment if it is set,
    /// else `nranks` local ranks.
    /// With `BRAID_BACKEND=mpi` (feature `mpi`), the MPI rank. A process
    /// that mpirun or srun started as one of several ([`mpi_launch_size`])
    /// without `BRAID_BACKEND=mpi` is refused: each would run a whole job
    /// of its own.
    pub fn from_env_or_local(nranks: u32) -> Result<WorldSpec, CommError> {
        if std::env::var("BRAID_BACKEND").is_ok_and(|b| b == "mpi") {
            #[cfg(feature = "mpi")]
            return Ok(WorldSpec::Mpi);
            #[cfg(not(feature = "mpi"))]
            return Err(CommError::Bootstrap {
                // (Every process of the job says so: each names its own
                // rank where mpirun or srun told it, else none.)
                rank: mpi_launch_rank().unwrap_or(Rank::MAX),
                detail: "BRAID_BACKEND=mpi, but braid was built without the mpi feature".into(),
            });
        }
        // Started by mpirun or srun as one of several processes, each is one
        // rank of the MPI job (above), or one rank of a tcp job that the
        // launch started (srun used to start processes, each given
        // BRAID_RANK as its own task number, or `BRAID_BACKEND=tcp` said
        // outright). A local job, or tcp variables left in the environment
        // (a one-rank job in every process), would run whole in every
        // process, on the same output.
        let launch = mpi_launch_size().filter(|(_, n)| *n > 1);
        let refuse = |(var, n): (&str, u32), why: &str| CommError::Bootstrap {
            rank: mpi_launch_rank().unwrap_or(Rank::MAX),
            detail: format!(
                "this process is one of {n} started by mpirun or srun ({var}={n}), but {why}: each would run a whole job of its own; set BRAID_BACKEND=mpi (a build with the mpi feature)"
            ),
        };
        Ok(match TcpConfig::from_env()? {
            Some(c) => {
                let said = std::env::var("BRAID_BACKEND").is_ok_and(|b| b == "tcp");
                let one_each =
                    |(_, n): (&str, u32)| c.nranks == n && mpi_launch_rank() == Some(c.rank);
                if let Some(l) = launch.filter(|l| !said && !one_each(*l)) {
                    return Err(refuse(
                        l,
                        &format!(
                            "its tcp variables (BRAID_RANK={}, BRAID_NRANKS={}) are not this launch's task and size, and BRAID_BACKEND is not mpi (or tcp)",
                            c.rank, c.nranks
                        ),
                    ));
                }
                WorldSpec::Tcp(c)
            }
            None => {
                if let Some(l) = launch {
                    return Err(refuse(l, "BRAID_BACKEND is not mpi"));
                }
                WorldSpec::Local { nranks }
            }
        })
    }

    /// The backend.
    pub fn backend(&self) -> Backend {
        match self {
            WorldSpec::Local { .. } => Backend::Local,
            WorldSpec::Tcp(_) => Backend::Tcp,
            #[cfg(feature = "mpi")]
            WorldSpec::Mpi => Backend::Mpi,
        }
    }
}

/// Creates the contexts of the ranks this process hosts (call inside a
/// multi-threaded tokio runtime; the contexts' progress engine is that
/// runtime). Every context gets its own `BufferResource` with `limits`
/// (device memory defaults to none).
pub async fn contexts(spec: &WorldSpec, limits: MemoryLimits) -> Result<Vec<Context>, CommError> {
    contexts_with(spec, limits, RankThreads::Shared).await
}

/// [`contexts`], with engines that carry `threads`.
async fn contexts_with(
    spec: &WorldSpec,
    limits: MemoryLimits,
    threads: RankThreads,
) -> Result<Vec<Context>, CommError> {
    let comms: Vec<Arc<dyn Communicator>> = match spec {
        WorldSpec::Local { nranks } => LocalComm::world(*nranks)
            .into_iter()
            .map(|c| Arc::new(c) as Arc<dyn Communicator>)
            .collect(),
        WorldSpec::Tcp(cfg) => vec![Arc::new(TcpComm::connect(cfg.clone()).await?)],
        #[cfg(feature = "mpi")]
        WorldSpec::Mpi => vec![Arc::new(crate::comm::mpi::MpiComm::init()?)],
    };
    let handle = tokio::runtime::Handle::current();
    Ok(comms
        .into_iter()
        .map(|c| {
            context_on(
                c,
                limits,
                ProgressEngine::with_threads(handle.clone(), threads),
            )
        })
        .collect())
}

/// A context over `comm` with its own `BufferResource` of `limits`, driven
/// by the current runtime.
pub fn context_for(comm: Arc<dyn Communicator>, limits: MemoryLimits) -> Context {
    context_on(
        comm,
        limits,
        ProgressEngine::new(tokio::runtime::Handle::current()),
    )
}

/// A context over `comm` with its own `BufferResource` of `limits`, driven
/// by `engine`.
pub fn context_on(
    comm: Arc<dyn Communicator>,
    limits: MemoryLimits,
    engine: ProgressEngine,
) -> Context {
    Context::new(
        comm,
        BufferResource::new(MemoryLimits {
            device: limits.device.or(Some(0)),
            host: limits.host,
        }),
        engine,
    )
}

/// The exit status of a rank's process that failed only because another
/// rank did (it heard that rank's abort, or saw it die): `braid-launch`
/// then names the rank that failed on its own, even where this one
/// exited first. See [`exit_code`].
pub const PEER_FAILED_EXIT: u8 = 4;

/// Another rank's failure as this rank learned it from the job's own
/// agreement (the ranks' vote after a commit step, rank 0 refusing the
/// job), not from the transport: a rank that fails only with it passes
/// it on ([`caused_by_peer`]: exit status [`PEER_FAILED_EXIT`]), so that a
/// launcher names the rank that failed on its own.
#[derive(Debug, thiserror::Error)]
#[error("{detail}")]
pub struct PeerFailure {
    /// The rank that failed on its own.
    pub peer: Rank,
    /// What it failed at, as this rank says it.
    pub detail: String,
}

/// How long a rank that passes on another's failure ([`PeerFailure`])
/// waits for that rank's abort before it aborts the job itself.
const RELAY_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The rank a [`PeerFailure`] in `err`'s chain names.
fn relayed_from(err: &(dyn std::error::Error + 'static)) -> Option<Rank> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(p) = e.downcast_ref::<PeerFailure>() {
            return Some(p.peer);
        }
        cur = e.source();
    }
    None
}

/// The rank whose failure `err` only passes on: a [`PeerFailure`] in
/// `err`'s chain of sources, or the first [`CommError`] there if it says
/// another rank aborted the job or died. `None` for a failure of the
/// rank's own (or one that names no peer).
pub fn caused_by_peer(err: &(dyn std::error::Error + 'static)) -> Option<Rank> {
    if let Some(p) = relayed_from(err) {
        return Some(p);
    }
    match *first_comm_error(err)? {
        CommError::Aborted { rank, peer, .. } if peer != rank => Some(peer),
        CommError::PeerDied { peer, .. } | CommError::PeerMisfit { peer, .. } => Some(peer),
        _ => None,
    }
}

/// The first [`CommError`] in `err`'s chain of sources.
pub(crate) fn first_comm_error<'a>(
    err: &'a (dyn std::error::Error + 'static),
) -> Option<&'a CommError> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(c) = e.downcast_ref::<CommError>() {
            return Some(c);
        }
        // A transparent wrapper hands on its inner error's source, not
        // the inner error: the chain would skip the CommError itself.
        if let Some(crate::NodeError::Comm(c)) = e.downcast_ref::<crate::NodeError>() {
            return Some(c);
        }
        cur = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rank's task that failed outside its job (a panic the job did not
    /// catch) is reported under the rank's own number: a tcp or MPI
    /// process's one rank was named rank 0, its place in the list.
    #[test]
    fn a_failed_task_is_reported_under_its_rank() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let je = rt
            .block_on(async { tokio::spawn(async { panic!("in the shutdown") }).await })
            .err()
            .unwrap_or_else(|| panic!("the task did not fail"));
        let (_tx, rx) = std::sync::mpsc::channel();
        let outcomes: Vec<(Rank, Outcome<()>)> = vec![(5, Err(je))];
        let e = collect(outcomes, &rx)
            .err()
            .unwrap_or_else(|| panic!("no error"));
        assert_eq!(e.rank, 5, "{e}");
    }

    /// A node that failed on a peer's death or abort is "caused by the
    /// peer" (exit status 4), also where the node's error is the
    /// `CommError` itself (`NodeError::Comm`, a transparent wrapper whose
    /// `source` skips it): before, such ranks exited 1 and a launcher
    /// could name one of them as the failed rank.
    #[test]
    fn a_node_failed_by_a_peer_names_the_peer() {
        let died = CommError::PeerDied {
            rank: 0,
            peer: 2,
            detail: "gone".into(),
        };
        let e = crate::graph::GraphError {
            rank: 0,
            at: crate::graph::FailedAt::Node("sink".into()),
            source: crate::NodeError::Comm(died),
        };
        assert_eq!(caused_by_peer(&e), Some(2));
        let own = crate::graph::GraphError {
            rank: 0,
            at: crate::graph::FailedAt::Node("sink".into()),
            source: crate::NodeError::Panic("x".into()),
        };
        assert_eq!(caused_by_peer(&own), None);
    }

    /// A failure passed on through the job's own vote (`PeerFailure`, as
    /// a node's error) names the peer, also in the first-error report's
    /// copy: a rank that relayed rank 0's failed commit was reported as
    /// the job's error, and exited 1 as if it had failed on its own.
    #[test]
    fn a_relayed_failure_names_the_peer_in_the_report_too() {
        let e = crate::graph::GraphError {
            rank: 1,
            at: crate::graph::FailedAt::Node("sink".into()),
            source: crate::NodeError::other(PeerFailure {
                peer: 0,
                detail: "rank 0 could not move its part".into(),
            }),
        };
        assert_eq!(caused_by_peer(&e), Some(0));
        let r = Reported::of(&e);
        assert_eq!(caused_by_peer(&r), Some(0));
        assert_eq!(r.to_string(), e.to_string());
    }
}

/// A copy of a rank's error for the first-error report (a `BoxError` is
/// not `Clone`): its text, and the [`PeerFailure`] or else the
/// [`CommError`] of its chain as the source, so [`caused_by_peer`] still
/// sees them.
#[derive(Debug)]
struct Reported {
    text: String,
    relayed: Option<PeerFailure>,
    comm: Option<CommError>,
}

impl Reported {
    fn of(err: &(dyn std::error::Error + 'static)) -> Reported {
        Reported {
            text: err.to_string(),
            relayed: relayed_from(err).map(|peer| PeerFailure {
                peer,
                detail: err.to_string(),
            }),
            comm: first_comm_error(err).cloned(),
        }
    }
}

impl std::fmt::Display for Reported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for Reported {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match (&self.relayed, &self.comm) {
            (Some(p), _) => Some(p as &(dyn std::error::Error + 'static)),
            (None, Some(c)) => Some(c as &(dyn std::error::Error + 'static)),
            (None, None) => None,
        }
    }
}

/// The exit status for a rank's process that ends with `err`:
/// [`PEER_FAILED_EXIT`] when the failure only passes on another rank's
/// ([`caused_by_peer`]), 1 otherwise.
pub fn exit_code(err: &(dyn std::error::Error + 'static)) -> std::process::ExitCode {
    match caused_by_peer(err) {
        Some(_) => std::process::ExitCode::from(PEER_FAILED_EXIT),
        None => std::process::ExitCode::FAILURE,
    }
}

/// Cleanup to run before the job's abort ends this process
/// ([`on_process_abort`]).
type AbortHook = Box<dyn FnOnce() + Send>;

static ABORT_HOOKS: std::sync::Mutex<Vec<AbortHook>> = std::sync::Mutex::new(Vec::new());

/// Registers `hook` to run if the job's abort is about to end this
/// process: the mpi backend's abort is `MPI_Abort`, which ends every
/// process of the job at once, so nothing after [`run_world`] runs there.
/// For the cleanup a program does once `run_world` has returned its error
/// (output it staged, directories it made). Hooks run once each, in the
/// order registered, on the failing rank's thread; the other backends
/// never run them (`run_world` returns, and the program's own error path
/// runs).
pub fn on_process_abort(hook: impl FnOnce() + Send + 'static) {
    ABORT_HOOKS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(Box::new(hook));
}

/// Runs the hooks of [`on_process_abort`] (each once).
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn run_process_abort_hooks() {
    let hooks = std::mem::take(&mut *ABORT_HOOKS.lock().unwrap_or_else(|p| p.into_inner()));
    for h in hooks {
        h();
    }
}

/// A rank's failure.
#[derive(Debug, thiserror::Error)]
#[error("{source}")]
pub struct RankError {
    /// The rank that failed.
    pub rank: Rank,
    /// Why.
    #[source]
    pub source: BoxError,
}

/// Runs `job` on every rank this process hosts and returns their results in
/// rank order. A rank whose job fails aborts the communicator so the other
/// ranks fail too; the error returned is the first one that happened. A
/// rank whose job succeeds shuts its communicator down cleanly (waiting for
/// all ranks).
///
/// Threads: in-process ranks that fit the host's cores (2 or more, no more
/// than the cores) each run on a tokio runtime of their own, with the
/// cores shared evenly among them ([`RankThreads::Own`]); otherwise the
/// ranks share one runtime with a worker per core. Ranks on threads of
/// their own copy on cores of their own and wait for each other by
/// polling: on the 2-core VM (2026-11-28) a 1 MiB AllToAll into a kept
/// vector between 2 ranks took 42-56 us a call, against 85-108 us on a
/// shared runtime, where the rank woken by the other's arrival waited on
/// that one's worker. More ranks than cores share workers, which lets a
/// rank that waits give its turn to one that works. `BRAID_RUNTIME=shared`
/// or `per-rank` overrides the choice for in-process ranks. A tcp rank's
/// process runs it on a runtime of [`tcp_rank_workers`] threads; an MPI
/// rank's on one of a worker per core (at least 2).
pub fn run_world<T, F, Fut>(
    spec: &WorldSpec,
    limits: MemoryLimits,
    job: F,
) -> Result<Vec<(Rank, T)>, RankError>
where
    F: Fn(Context) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, BoxError>> + Send + 'static,
    T: Send + 'static,
{
    // Not under MPI: there, OpenMPI's single-copy transfers ran 5-15%
    // slower with it (paired runs, 2026-11-23); see BENCHMARKS.md.
    #[cfg_attr(not(feature = "mpi"), allow(irrefutable_let_patterns))]
    if let WorldSpec::Local { .. } | WorldSpec::Tcp(_) = spec {
        crate::memory::reuse_freed_memory();
    }
    let cores = crate::context::host_cores();
    let threads = match spec {
        WorldSpec::Local { nranks } if *nranks >= 2 => {
            runtime_override().unwrap_or(if *nranks as usize <= cores {
                RankThreads::Own
            } else {
                RankThreads::Shared
            })
        }
        _ => RankThreads::Shared,
    };
    let job = Arc::new(job);
    let start: RankStart<T> =
        Arc::new(move |ctx, first_error| Box::pin(run_rank(ctx, job.clone(), first_error)));
    match (threads, spec) {
        (RankThreads::Own, WorldSpec::Local { nranks }) => {
            run_rank_threads(*nranks, cores / *nranks as usize, limits, start)
        }
        (_, WorldSpec::Tcp(_)) => {
            run_shared(spec, tcp_rank_workers(), RankThreads::Own, limits, start)
        }
        _ => run_shared(spec, cores.max(2), RankThreads::Shared, limits, start),
    }
}

/// `BRAID_RUNTIME=shared` (one runtime for all in-process ranks) or
/// `per-rank` (a runtime each, at least one worker each), overriding
/// [`run_world`]'s choice.
fn runtime_override() -> Option<RankThreads> {
    crate::env::choice(
        "BRAID_RUNTIME",
        &[
            ("shared", RankThreads::Shared),
            ("per-rank", RankThreads::Own),
        ],
    )
}

/// Where a failing rank reports, first come first served.
type FirstError = std::sync::mpsc::Sender<RankError>;

/// How a rank's task ended: its result, its error, or the task's failure.
type Outcome<T> = Result<Result<(Rank, T), RankError>, tokio::task::JoinError>;

/// A rank's whole run ([`run_rank`] with the job), as the two ways of
/// starting ranks take it.
type RankStart<T> = Arc<
    dyn Fn(Context, FirstError) -> futures::future::BoxFuture<'static, Result<(Rank, T), RankError>>
        + Send
        + Sync,
>;

/// A runtime of `workers` threads named `name`; its failure to build is
/// `rank`'s error.
fn runtime(workers: usize, rank: Rank, name: &str) -> Result<tokio::runtime::Runtime, RankError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers.max(1))
        .thread_name(name)
        .enable_all()
        .build()
        .map_err(|e| RankError {
            rank,
            source: Box::new(e),
        })
}

/// Worker threads of a tcp rank's runtime: its share of the host's cores
/// ([`crate::context::cores_per_rank`]: the cores over the ranks a launcher
/// started on this host), at least 1. The rank's runtime carries it alone
/// ([`RankThreads::Own`]), so a rank that waits for a small collective
/// polls its sockets, offering its core to the host's other threads,
/// instead of sleeping, as MPI's processes do
/// (`braid_core::Waiting::PollYield`).
/// More workers than that share cores with the other ranks' processes:
/// on the 2-core VM (2026-11-29, a process a rank) two tcp ranks of 2
/// workers each took 69-92 us for an 8 B Barrier or AllReduce, against
/// 23-29 us with one worker each; OpenMPI over TCP took 13-23 us.
pub fn tcp_rank_workers() -> usize {
    crate::context::cores_per_rank()
}

/// Every rank on one runtime of `workers` threads, their engines carrying
/// `threads`.
fn run_shared<T: Send + 'static>(
    spec: &WorldSpec,
    workers: usize,
    threads: RankThreads,
    limits: MemoryLimits,
    start: RankStart<T>,
) -> Result<Vec<(Rank, T)>, RankError> {
    // The rank an error before the contexts names: this process's.
    let rank = match spec {
        WorldSpec::Tcp(cfg) => cfg.rank,
        #[cfg(feature = "mpi")]
        WorldSpec::Mpi => mpi_launch_rank().unwrap_or(0),
        WorldSpec::Local { .. } => 0,
    };
    let rt = runtime(workers, rank, "braid-worker")?;
    let (err_tx, err_rx) = std::sync::mpsc::channel();
    let outcomes = rt.block_on(async move {
        let ctxs = contexts_with(spec, limits, threads)
            .await
            .map_err(|e| RankError {
                rank,
                source: Box::new(e),
            })?;
        let handles: Vec<_> = ctxs
            .into_iter()
            .map(|ctx| {
                let r = ctx.rank();
                let task = crate::event::spawned_task(start(ctx, err_tx.clone()));
                (r, tokio::spawn(task))
            })
            .collect();
        drop(err_tx);
        let mut outcomes = Vec::new();
        for (r, h) in handles {
            outcomes.push((r, h.await));
        }
        Ok::<_, RankError>(outcomes)
    });
    let failed = match &outcomes {
        Ok(o) => o.iter().any(|(_, o)| !matches!(o, Ok(Ok(_)))),
        Err(_) => true,
    };
    end_runtime(rt, failed);
    collect(outcomes?, &err_rx)
}

/// Ends a rank's runtime once its tasks are done. After a failure (a stop
/// signal, an error) without waiting for its blocking work: dropping the
/// runtime waits for every `spawn_blocking` task, and a local sort or a
/// kernel pass there kept a stopped job running for seconds (Ctrl-C at
/// 2 s of a 3.6 s job took 2.4 s to act). That work's threads end with
/// the process, or with their work; what they hold is dropped then
/// (shuffles' spill files: `braid_coll::remove_spill_dirs` removes them
/// for a process that exits first).
fn end_runtime(rt: tokio::runtime::Runtime, failed: bool) {
    if failed {
        rt.shutdown_background();
    } else {
        drop(rt);
    }
}

/// Each of `nranks` in-process ranks on a runtime of its own, of
/// `workers` threads (see [`run_world`]).
fn run_rank_threads<T: Send + 'static>(
    nranks: u32,
    workers: usize,
    limits: MemoryLimits,
    start: RankStart<T>,
) -> Result<Vec<(Rank, T)>, RankError> {
    // Every runtime and context first: a rank that cannot have one fails
    // the job before any rank runs.
    let mut ranks = Vec::new();
    for comm in LocalComm::world(nranks) {
        let rank = comm.rank();
        let rt = runtime(workers, rank, &format!("braid-rank-{rank}"))?;
        let engine = ProgressEngine::with_threads(rt.handle().clone(), RankThreads::Own);
        ranks.push((rt, context_on(Arc::new(comm), limits, engine)));
    }
    let (err_tx, err_rx) = std::sync::mpsc::channel();
    let mut threads = Vec::new();
    let mut ranks = ranks.into_iter();
    while let Some((rt, ctx)) = ranks.next() {
        let rank = ctx.rank();
        let comm = ctx.comm().clone();
        let task = start(ctx, err_tx.clone());
        let started = std::thread::Builder::new()
            .name(format!("braid-rank-{rank}"))
            .spawn(move || {
                let task = rt.spawn(crate::event::spawned_task(task));
                let out = rt.block_on(task);
                end_runtime(rt, !matches!(out, Ok(Ok(_))));
                out
            });
        match started {
            Ok(t) => threads.push(t),
            Err(e) => {
                // The ranks already started wait for this one: they are
                // told it will not come.
                let why = format!("rank {rank}: its thread did not start: {e}");
                comm.abort(&why);
                for (_, ctx) in ranks.by_ref() {
                    ctx.comm().abort(&why);
                }
                for t in threads {
                    let _ = t.join();
                }
                return Err(RankError {
                    rank,
                    source: why.into(),
                });
            }
        }
    }
    drop(err_tx);
    let mut outcomes = Vec::new();
    for (rank, t) in threads.into_iter().enumerate() {
        let rank = rank as Rank;
        outcomes.push((
            rank,
            t.join().unwrap_or_else(|p| {
                // run_rank catches the job's panics; this is one of the runtime.
                Ok(Err(RankError {
                    rank,
                    source: format!("panicked: {}", crate::graph::panic_message(p)).into(),
                }))
            }),
        ));
    }
    collect(outcomes, &err_rx)
}

/// The ranks' results in rank order, or the first error reported.
/// `outcomes` are by rank (the rank's number, which for a tcp or MPI
/// process's one rank is not its place in the list).
fn collect<T>(
    outcomes: Vec<(Rank, Outcome<T>)>,
    first_error: &std::sync::mpsc::Receiver<RankError>,
) -> Result<Vec<(Rank, T)>, RankError> {
    let mut out = Vec::new();
    let mut failed = None;
    for (rank, o) in outcomes {
        match o {
            Ok(Ok(v)) => out.push(v),
            Ok(Err(e)) => {
                failed.get_or_insert(e);
            }
            Err(je) => {
                tracing::error!("rank {rank}: its task failed: {je}");
                failed.get_or_insert(RankError {
                    rank,
                    source: format!("its task failed: {je}").into(),
                });
            }
        }
    }
    match failed {
        None => Ok(out),
        // The first failure of a rank's own: a rank that only heard of
        // another's (its abort) may have reported first.
        Some(e) => {
            let reported: Vec<RankError> = first_error.try_iter().collect();
            let own = reported.iter().position(|r| caused_by_peer(r).is_none());
            let mut reported = reported.into_iter();
            Err(match own {
                Some(i) => reported.nth(i).unwrap_or(e),
                None => reported.next().unwrap_or(e),
            })
        }
    }
}

/// One rank's whole run: its job, then a clean shutdown of its
/// communicator, or an abort that tells the other ranks it failed; then
/// the job's end for what waits for it. A failure is also reported to
/// `first_error`.
/// How long a rank whose job has ended waits for the collectives it
/// started and did not wait for (dropped handles) before it shuts down.
const CORES_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

async fn run_rank<T, F, Fut>(
    ctx: Context,
    job: Arc<F>,
    first_error: FirstError,
) -> Result<(Rank, T), RankError>
where
    F: Fn(Context) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, BoxError>> + Send + 'static,
    T: Send + 'static,
{
    let comm = ctx.comm().clone();
    let rank = comm.rank();
    let ends = ctx.clone();
    // A job that panics fails its rank like one that returns an error: the
    // others are told (abort) instead of waiting for it forever. (Building
    // the job's future may panic too.)
    let panicked =
        |p| -> BoxError { format!("panicked: {}", crate::graph::panic_message(p)).into() };
    let ran = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(ctx))) {
        Ok(fut) => std::panic::AssertUnwindSafe(fut)
            .catch_unwind()
            .await
            .unwrap_or_else(|p| Err(panicked(p))),
        Err(p) => Err(panicked(p)),
    };
    let r = match ran {
        // Collectives whose handles the job dropped unwaited finish first:
        // their peers may be in the same calls. Bounded: a peer that never
        // makes the call but waits for this rank in something else would
        // wait forever on a rank that waits for it; after the bound the
        // rank shuts down as before, and that peer fails (`PeerFinished`).
        Ok(v) => {
            if tokio::time::timeout(CORES_WAIT, ends.cores_finished())
                .await
                .is_err()
            {
                tracing::warn!(
                    "rank {rank}: collectives whose handles were dropped still run after {CORES_WAIT:?}; shutting down"
                );
            }
            comm.shutdown()
                .await
                .map(|_| v)
                .map_err(|e| Box::new(e) as BoxError)
        }
        Err(e) => {
            // A failure passed on from the job's own vote: the rank it
            // names fails on its own and aborts the job itself. This
            // rank's abort, sent at once, could reach that rank before its
            // own error and stand in for it (rank 0 refused the job, and
            // said "aborted by rank 1"): it waits for that abort first,
            // within a bound.
            if relayed_from(e.as_ref()).is_some() {
                let t0 = std::time::Instant::now();
                while comm.failure().is_none() && t0.elapsed() < RELAY_WAIT {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
            }
            comm.abort(&e.to_string());
            // Lets the abort notice reach the other ranks.
            let _ = comm.shutdown().await;
            Err(e)
        }
    };
    // What waits for the job's end (device communicators) is torn down
    // now, before the process may exit.
    let end = if r.is_ok() {
        JobEnd::Finished
    } else {
        JobEnd::Failed
    };
    let _ = tokio::task::spawn_blocking(move || ends.end_job(end)).await;
    r.map(|v| (rank, v)).map_err(|source| {
        let _ = first_error.send(RankError {
            rank,
            source: Box::new(Reported::of(source.as_ref())),
        });
        RankError { rank, source }
    })
}
