//! `Context`: what a rank's nodes and collectives share: the communicator,
//! the OpId allocator, the buffer resource, statistics and the progress
//! engine. Cheap to clone.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::Rank;
use crate::comm::Communicator;
use crate::event::Event;
use crate::memory::BufferResource;
use crate::stats::Statistics;
use crate::tag::{OpId, OpIdAllocator};

/// Drives the non-streaming cores of collectives: each core is a task of
/// this engine that advances its protocol as messages arrive, then runs the
/// core's completion callback. It is a handle to the rank's tokio runtime,
/// so a core makes progress whether or not anyone is waiting on it. (A
/// task of this runtime that waits for a core may drive it itself
/// instead, handing it to the engine if it stops waiting: see
/// [`ProgressEngine::is_current`].)
#[derive(Debug, Clone)]
pub struct ProgressEngine {
    handle: tokio::runtime::Handle,
    id: tokio::runtime::Id,
    /// How its rank's peers are placed, as far as its context knows (set
    /// from the communicator's backend by [`Context::new`]).
    peers: Placement,
    /// Whether its runtime carries other ranks too.
    threads: RankThreads,
}

/// Whether a rank's runtime, and so its worker threads, carries other
/// ranks of the process too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankThreads {
    /// The ranks of the process share one runtime's workers.
    Shared,
    /// The rank's runtime carries this rank alone, and every rank on the
    /// host has one of the same size (as `run_world` starts in-process
    /// ranks that fit the cores, and a tcp rank's process): a waiting rank
    /// holds no thread that a peer needs.
    Own,
}

impl ProgressEngine {
    /// An engine running on `handle`'s runtime, which the process's ranks
    /// share.
    pub fn new(handle: tokio::runtime::Handle) -> Self {
        Self::with_threads(handle, RankThreads::Shared)
    }

    /// An engine running on `handle`'s runtime, shared with other ranks
    /// or not as `threads` says.
    pub fn with_threads(handle: tokio::runtime::Handle, threads: RankThreads) -> Self {
        let id = handle.id();
        ProgressEngine {
            handle,
            id,
            peers: Placement::Apart,
            threads,
        }
    }

    /// Whether the caller runs on this engine's runtime, where a core may
    /// be polled by the task that waits for it (what the core awaits, its
    /// timers and sockets, belongs to this runtime).
    pub fn is_current(&self) -> bool {
        tokio::runtime::Handle::try_current().is_ok_and(|h| h.id() == self.id)
    }

    /// The id of the runtime the engine runs on (what a blocking wait for
    /// one of its cores must not stop: [`crate::Event::wait_blocking_beside`]).
    pub fn runtime_id(&self) -> tokio::runtime::Id {
        self.id
    }

    /// The engine of the runtime the caller runs on; `None` outside one.
    pub fn current() -> Option<Self> {
        tokio::runtime::Handle::try_current().ok().map(Self::new)
    }

    /// Starts driving `fut`.
    pub fn spawn<F>(&self, fut: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle.spawn(fut)
    }

    /// The runtime handle.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }

    /// How a task waiting on this engine's work, an operation on `bytes`
    /// of its rank's data, waits now (see [`Waiting`]).
    pub fn waiting(&self, bytes: usize) -> Waiting {
        let (ranks, placement) = host_ranks();
        let placement = match (placement, self.peers) {
            (Placement::InProcess, Placement::InProcess) => Placement::InProcess,
            _ => Placement::Apart,
        };
        let workers = self.handle.metrics().num_workers();
        let chosen = Waiting::for_op(bytes, ranks, placement, self.threads, workers, host_cores());
        match wait_override() {
            None => chosen,
            Some(Waiting::Park) => Waiting::Park,
            Some(_) if bytes > Waiting::POLL_MAX_BYTES => chosen,
            // Already polling (`PollYield` of a tcp rank's process among
            // them): kept as chosen.
            Some(_) if chosen.limit().is_some() => chosen,
            Some(_) => Waiting::polling(placement),
        }
    }

    /// Waits until `ev` is set, the way [`ProgressEngine::waiting`] says
    /// for an operation on `bytes` of this rank's data.
    pub async fn wait(&self, ev: &Event, bytes: usize) {
        // What sets `ev` may be a task of this worker's: a waiter that
        // would spin in place yields at every pass instead.
        let waiting = match self.waiting(bytes) {
            Waiting::Spin(limit) => Waiting::PollTasks(limit),
            w => w,
        };
        if let Some(limit) = waiting.limit() {
            let t = Instant::now();
            // Yielding polls: the worker keeps running other tasks (the
            // protocol itself, the socket readers) and, where `Poll` says,
            // checks for I/O between them, so a reply is seen without a
            // wake-up.
            let mut n = 0;
            while !ev.is_set() && t.elapsed() < limit {
                waiting.pass(n).await;
                n = n.wrapping_add(1);
            }
        }
        ev.wait().await;
    }
}

/// How a task that waits for a collective to complete waits.
///
/// Cost model: a wake-up that crosses threads (a parked worker woken by
/// the kernel) costs 2-8 us on the 2-core VM of 2026-11-23, about as much
/// as a whole small collective between two ranks, and more while that VM
/// is in a slow period; a task that keeps polling sees completion within
/// one scheduler pass. Polling pays:
/// - where every rank on the host has a runtime worker, and every worker a
///   core: nobody needs the core a poller holds;
/// - where the host's ranks are all tasks of this process that talk
///   through memory, and its runtime has 2 or more workers, however many
///   ranks: a polling rank yields to the ranks that share its worker, and
///   no other process needs the cores. (In-process ranks over tcp were no
///   faster polling: their sockets want the I/O driver's turns.) Measured
///   after waiters came to drive their collectives themselves
///   (2026-11-27, 2-core VM, 2 workers, 8 B, us): 4 ranks
///   Barrier 11.3-12.5 parked, 7.6-7.9 polling; AllReduce 16.1-18.0 and
///   9.9-12.5; 3 ranks AllReduce 11.5 and 7.5-7.8; 8 ranks 32-33 and
///   29-31. (Before that, when a waiter only watched a core that another
///   task drove, polling lost: 4 ranks, AllReduce 10 us parked, 22 us
///   polling.) On one worker it does not pay: every wake-up is local.
///
/// Nor does polling pay for bulk transfers where ranks share threads or
/// talk through sockets: a polling task slows them down (measured: 2 tcp
/// ranks, 1 MiB SendRecv 217-256 us parked, 281-652 us polling), so there
/// only operations on up to [`Waiting::POLL_MAX_BYTES`] of a rank's data
/// poll. In-process ranks on threads of their own ([`RankThreads::Own`])
/// poll for bulk operations too, up to [`Waiting::POLL_BULK`]: each copies
/// on its own core, and a parked rank woken for its copy starts it one
/// wake-up late (2026-11-28, 2 ranks on the 2-core VM, 1 MiB AllToAll
/// into a kept vector: 82-98 us parked, 44-56 us polling). Ranks apart on
/// runtimes of their own (a tcp rank's process, see
/// `braid_core::world::tcp_rank_workers`) poll their small operations up to
/// [`Waiting::POLL_BULK`] too: each is socket round trips of 15-20 us
/// on loopback, and a rank that parks is woken late for every reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// Sleep until woken.
    Park,
    /// Poll, yielding to other tasks and to the runtime's I/O driver
    /// (sockets, MPI's progress), for up to this long; then sleep.
    Poll(Duration),
    /// Poll, yielding to the other tasks of the worker but not to its I/O
    /// driver, for up to this long; then sleep. For ranks that talk
    /// through memory: their progress needs no I/O, and a turn of the
    /// driver is a system call (`epoll_wait`) per pass.
    PollTasks(Duration),
    /// Poll as `Poll` does, offering the core to the host's other threads
    /// before each pass, for up to this long; then sleep. For a rank in a
    /// process of its own (a tcp rank's, [`RankThreads::Own`] with ranks
    /// apart), whatever the host's load: a small collective is socket
    /// round trips of 15-20 us each on loopback, and a rank that sleeps is
    /// woken late for every reply; where the host's ranks outnumber its
    /// cores, the offer lets the rank a reply waits on run, as OpenMPI's
    /// processes yield when oversubscribed. Measured (2026-11-29, 2-core
    /// VM, `braid-bench coll --tcp-ranks processes`, 8 B, us; OpenMPI over
    /// TCP in the same runs): 2 ranks of 2 workers each, polling 20 us
    /// where they fit the cores, else sleeping: Barrier 69, AllReduce
    /// 77-92, SendRecv 59-68 (MPI 13-23); of one worker each, `PollYield`:
    /// 23-25, 25-29, 18-25; 4 ranks: 142-188, 182-222, 119-216 against
    /// 111-112, 123-145, 39 (MPI 38-88).
    PollYield(Duration),
    /// Poll in place for up to this long, then sleep: between polls the
    /// task spins on its worker (a few `pause`s) instead of going back to
    /// the scheduler, and only every [`Waiting::SPIN_TURN`]th pass gives
    /// the worker's other tasks a turn. For in-process ranks each on a
    /// runtime of its own ([`RankThreads::Own`]), where every worker has a
    /// core: a task that wakes itself to yield is queued as a yielded task,
    /// and tokio then wakes a parked sibling worker to steal it (a futex
    /// call, in a VM an interrupt to another virtual CPU) on every pass,
    /// and the task hops between workers. Measured (2026-11-29, 16-core
    /// KVM host, 4 ranks of 4 workers each, 8 B): see BENCHMARKS.md,
    /// "in-process waiters spin in place".
    Spin(Duration),
}

/// A future that is pending once, having woken its task: the task goes to
/// the back of its worker's queue, and the I/O driver is not given a turn
/// for it (`tokio::task::yield_now` defers the task until the driver has
/// been polled).
struct PassTasks(bool);

impl Future for PassTasks {
    type Output = ();
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.0 {
            return std::task::Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

/// Where the ranks of a host run, as [`Waiting::choose`] weighs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Every rank on this host is a task of this process, and ranks talk
    /// through memory (the local backend): a rank waited for needs only a
    /// turn on a worker.
    InProcess,
    /// Other processes on this host run ranks too (a launcher said so), or
    /// ranks talk through sockets or MPI.
    Apart,
}

impl Waiting {
    /// How long a waiter polls when polling pays.
    pub const POLL: Duration = Duration::from_micros(20);
    /// The largest operation (bytes of this rank's data) whose waiter polls
    /// where ranks share threads or are apart.
    pub const POLL_MAX_BYTES: usize = 16 << 10;
    /// How long a waiter for a larger operation polls where it may (see
    /// [`Waiting`]): a wake-up (2-18 us) is lost in a wait longer than
    /// this, and a core that a rank's own helper threads need is given
    /// back after it.
    pub const POLL_BULK: Duration = Duration::from_millis(1);
    /// A [`Waiting::Spin`] waiter gives its worker's other tasks a turn
    /// once in this many passes (a pass is a poll and a few `pause`s,
    /// ~0.1-0.3 us: a task woken on the waiter's worker waits a few us at
    /// most).
    pub const SPIN_TURN: u32 = 16;

    /// A polling wait ([`Waiting::polling`]) where polling pays (see
    /// [`Waiting`]): no more runtime workers
    /// than cores, and either every one of `ranks` on this host has a
    /// worker of its own, or they are all in this process and it has 2
    /// workers or more; otherwise `Park`. (The environment variable
    /// `BRAID_WAIT=park` or `poll` overrides this choice for a whole
    /// process.)
    pub fn choose(ranks: usize, placement: Placement, workers: usize, cores: usize) -> Waiting {
        let poll = ranks >= 1
            && workers <= cores
            && (ranks <= workers || (placement == Placement::InProcess && workers >= 2));
        if poll {
            Self::polling(placement)
        } else {
            Waiting::Park
        }
    }

    /// How a rank waits for an operation on `bytes` of its data (see
    /// [`Waiting`]): as [`Waiting::choose`] says up to
    /// [`Waiting::POLL_MAX_BYTES`]; above, polling for up to
    /// [`Waiting::POLL_BULK`] where polling pays and the ranks are in
    /// process on threads of their own, else `Park`. A rank apart on a
    /// runtime of its own (a tcp rank's process) waits for small
    /// operations with [`Waiting::PollYield`] up to
    /// [`Waiting::POLL_BULK`], and parks for bulk ones. `workers` are the
    /// rank's runtime's (with [`RankThreads::Own`], every rank on the host
    /// has as many).
    pub fn for_op(
        bytes: usize,
        ranks: usize,
        placement: Placement,
        threads: RankThreads,
        workers: usize,
        cores: usize,
    ) -> Waiting {
        let bulk = bytes > Self::POLL_MAX_BYTES;
        let own = threads == RankThreads::Own && placement == Placement::InProcess;
        if bulk && !own {
            return Waiting::Park;
        }
        let workers = match threads {
            RankThreads::Shared => workers,
            RankThreads::Own => workers.saturating_mul(ranks),
        };
        if threads == RankThreads::Own && placement == Placement::Apart {
            // Processes of one rank each (tcp): see `PollYield`.
            return Waiting::PollYield(Self::POLL_BULK);
        }
        let mut chosen = Self::choose(ranks, placement, workers, cores);
        if own && chosen != Waiting::Park {
            chosen = Waiting::Spin(Self::POLL);
        }
        if bulk { chosen.for_bulk() } else { chosen }
    }

    /// How ranks so placed poll: without the I/O driver's turns in
    /// process (`PollTasks`), with them otherwise (`Poll`).
    pub fn polling(placement: Placement) -> Waiting {
        match placement {
            Placement::InProcess => Waiting::PollTasks(Self::POLL),
            Placement::Apart => Waiting::Poll(Self::POLL),
        }
    }

    /// The same kind of wait with the bulk operations' limit
    /// ([`Waiting::POLL_BULK`]).
    pub fn for_bulk(self) -> Waiting {
        match self {
            Waiting::Park => Waiting::Park,
            Waiting::Poll(_) => Waiting::Poll(Self::POLL_BULK),
            Waiting::PollTasks(_) => Waiting::PollTasks(Self::POLL_BULK),
            Waiting::PollYield(_) => Waiting::PollYield(Self::POLL_BULK),
            Waiting::Spin(_) => Waiting::Spin(Self::POLL_BULK),
        }
    }

    /// How long a waiter polls before it sleeps; `None` for `Park`.
    pub fn limit(self) -> Option<Duration> {
        match self {
            Waiting::Park => None,
            Waiting::Poll(l) | Waiting::PollTasks(l) | Waiting::PollYield(l) | Waiting::Spin(l) => {
                Some(l)
            }
        }
    }

    /// Pass `n` (counted from 0) of a polling waiter: lets the other
    /// tasks run (and, for `Poll` and `PollYield`, the I/O driver; for
    /// `PollYield` first the host's other threads), then returns. A
    /// `Spin` pass spins in place instead, but for every
    /// [`Waiting::SPIN_TURN`]th.
    pub async fn pass(self, n: u32) {
        match self {
            Waiting::Spin(_) if n % Self::SPIN_TURN != Self::SPIN_TURN - 1 => {
                for _ in 0..4 {
                    std::hint::spin_loop();
                }
            }
            Waiting::Poll(_) => tokio::task::yield_now().await,
            Waiting::PollYield(_) => {
                // A system call (sched_yield) that returns at once where
                // no other thread wants this core.
                std::thread::yield_now();
                tokio::task::yield_now().await
            }
            Waiting::PollTasks(_) | Waiting::Spin(_) | Waiting::Park => PassTasks(false).await,
        }
    }
}

fn wait_override() -> Option<Waiting> {
    static OVERRIDE: OnceLock<Option<Waiting>> = OnceLock::new();
    *OVERRIDE.get_or_init(|| {
        crate::env::choice(
            "BRAID_WAIT",
            &[
                ("park", Waiting::Park),
                ("poll", Waiting::Poll(Waiting::POLL)),
            ],
        )
    })
}

/// Ranks this process hosts (live contexts).
static LIVE_RANKS: AtomicUsize = AtomicUsize::new(0);

/// Cores of this host (or of this process's CPU quota), at least 1.
pub(crate) fn host_cores() -> usize {
    // (available_parallelism reads cgroup files: asked once.)
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Threads a rank may give to CPU work of its own, such as decoding or
/// encoding file data: the host's cores shared evenly among the ranks on
/// the host (see `ranks_on_host`), at least 1. Ranks of one host that each
/// took every core would only take turns on them.
pub fn cores_per_rank() -> usize {
    (host_cores() / ranks_on_host().max(1)).max(1)
}

/// Ranks on this host: this process's live contexts, or a launcher's
/// count of the processes it started here, whichever is more. Launchers
/// that say: `braid-launch` (`BRAID_HOST_RANKS`), OpenMPI's mpirun
/// (`OMPI_COMM_WORLD_LOCAL_SIZE`), MPICH's Hydra (`MPI_LOCALNRANKS`).
pub(crate) fn ranks_on_host() -> usize {
    host_ranks().0
}

/// [`ranks_on_host`], and whether all of them are in this process.
fn host_ranks() -> (usize, Placement) {
    static LAUNCHED: OnceLock<usize> = OnceLock::new();
    let launched = *LAUNCHED.get_or_init(|| {
        // (braid's own variable warns when it is not a count; the MPI
        // launchers' are theirs.)
        let own = crate::env::count(HOST_RANKS_ENV, 1);
        ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"]
            .iter()
            .filter_map(|k| std::env::var(k).ok()?.parse::<usize>().ok())
            .chain(own)
            .max()
            .unwrap_or(0)
    });
    let live = LIVE_RANKS.load(Ordering::Relaxed);
    if launched > live {
        (launched, Placement::Apart)
    } else {
        (live, Placement::InProcess)
    }
}

/// The variable through which a launcher tells its processes how many
/// ranks it started on their host.
pub const HOST_RANKS_ENV: &str = "BRAID_HOST_RANKS";

/// How a rank's job ended, as told to what is torn down with it
/// ([`Context::on_job_end`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobEnd {
    /// The job succeeded and the communicator shut down cleanly: every rank
    /// has finished, so no peer can still be using what this rank shared.
    Finished,
    /// The job failed on this rank or another: peers may still be waiting
    /// inside shared operations, so teardown must not wait for them.
    Failed,
}

type JobEndHook = Box<dyn FnOnce(JobEnd) + Send>;

tokio::task_local! {
    /// The OpId allocator of the graph node this task runs (with the
    /// address of the context it belongs to): see `Context::op_source`.
    static NODE_OPS: (usize, Arc<OpIdAllocator>);
}

struct Inner {
    comm: Arc<dyn Communicator>,
    op_ids: Arc<OpIdAllocator>,
    resource: Arc<BufferResource>,
    progress: ProgressEngine,
    job_end: std::sync::Mutex<Vec<JobEndHook>>,
    cores: Arc<Cores>,
}

/// The collectives this rank has started and not finished (their cores):
/// a rank's job waits for them before it shuts down
/// ([`Context::cores_finished`]), so that a handle dropped unwaited, whose
/// core runs on (peers may be in the same call), does not find the
/// communicator shut under it.
#[derive(Default)]
struct Cores {
    running: std::sync::atomic::AtomicUsize,
    idle: tokio::sync::Notify,
}

/// A running collective's place in [`Context::cores_finished`]'s count:
/// held by its core, given back when the core is dropped (finished or
/// not).
pub struct CoreGuard(Arc<Cores>);

impl Drop for CoreGuard {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        LIVE_RANKS.fetch_sub(1, Ordering::Relaxed);
        // A context that no `run_world` ended: its job is over now.
        let hooks = std::mem::take(self.job_end.get_mut().unwrap_or_else(|p| p.into_inner()));
        for h in hooks {
            h(JobEnd::Finished);
        }
    }
}

/// A rank's shared state.
#[derive(Clone)]
pub struct Context {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("rank", &self.rank())
            .field("nranks", &self.nranks())
            .field("backend", &self.inner.comm.backend())
            .finish()
    }
}

impl Context {
    /// A context over `comm`, accounting memory in `resource`, driving
    /// collectives on `progress`.
    pub fn new(
        comm: Arc<dyn Communicator>,
        resource: Arc<BufferResource>,
        progress: ProgressEngine,
    ) -> Self {
        LIVE_RANKS.fetch_add(1, Ordering::Relaxed);
        let mut progress = progress;
        progress.peers = match comm.backend() {
            crate::comm::Backend::Local => Placement::InProcess,
            crate::comm::Backend::Tcp | crate::comm::Backend::Mpi => Placement::Apart,
        };
        Context {
            inner: Arc::new(Inner {
                comm,
                op_ids: Arc::new(OpIdAllocator::new()),
                resource,
                progress,
                job_end: std::sync::Mutex::new(Vec::new()),
                cores: Arc::default(),
            }),
        }
    }

    /// Registers `hook` to run once this rank's job has ended:
    /// [`run_world`](crate::run_world) runs it after the communicator shut
    /// down ([`JobEnd::Finished`]) or was aborted ([`JobEnd::Failed`]); a
    /// context that nothing ends runs it with `Finished` when its last
    /// clone is dropped. For resources whose teardown depends on the
    /// peers: an NCCL communicator may only be destroyed once no peer can
    /// still be inside an operation with it, and must be aborted instead
    /// when the job failed (its drop, inside a failing job, comes before
    /// the peers are told). A hook may block for a bounded time.
    pub fn on_job_end(&self, hook: impl FnOnce(JobEnd) + Send + 'static) {
        self.inner
            .job_end
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Box::new(hook));
    }

    /// Runs the hooks registered with [`Context::on_job_end`] (each once).
    pub fn end_job(&self, end: JobEnd) {
        let hooks =
            std::mem::take(&mut *self.inner.job_end.lock().unwrap_or_else(|p| p.into_inner()));
        for h in hooks {
            h(end);
        }
    }

    /// This rank.
    pub fn rank(&self) -> Rank {
        self.inner.comm.rank()
    }

    /// Number of ranks.
    pub fn nranks(&self) -> u32 {
        self.inner.comm.nranks()
    }

    /// The communicator.
    pub fn comm(&self) -> &Arc<dyn Communicator> {
        &self.inner.comm
    }

    /// The next OpId; every rank must call this in the same order. Inside
    /// a node of a running [`Graph`](crate::graph::Graph) the ids come from
    /// that node's own class of the sequence (see
    /// [`OpIdAllocator`]), so nodes that run at once still agree across
    /// ranks on each one's ids.
    pub fn next_op_id(&self) -> OpId {
        self.op_source().next()
    }

    /// Where this task's OpIds come from: its graph node's allocator when
    /// it runs as a node of a graph on this context, else the context's.
    pub(crate) fn op_source(&self) -> Arc<OpIdAllocator> {
        let me = Arc::as_ptr(&self.inner) as usize;
        NODE_OPS
            .try_with(|(owner, ops)| (*owner == me).then(|| ops.clone()))
            .ok()
            .flatten()
            .unwrap_or_else(|| self.inner.op_ids.clone())
    }

    /// Runs `fut` with its OpIds drawn from `ops` (a graph node's class).
    pub(crate) fn with_op_source<F: Future>(
        &self,
        ops: Arc<OpIdAllocator>,
        fut: F,
    ) -> tokio::task::futures::TaskLocalFuture<(usize, Arc<OpIdAllocator>), F> {
        NODE_OPS.scope((Arc::as_ptr(&self.inner) as usize, ops), fut)
    }

    /// Counts a collective's core as running until the guard drops (a
    /// collective's core holds it: see [`Context::cores_finished`]).
    pub fn core_started(&self) -> CoreGuard {
        self.inner.cores.running.fetch_add(1, Ordering::AcqRel);
        CoreGuard(self.inner.cores.clone())
    }

    /// Waits until no collective this rank started is running. Bounded
    /// where the peers make the same calls or end their jobs (a core whose
    /// peer finished fails with `PeerFinished`).
    pub async fn cores_finished(&self) {
        let cores = &self.inner.cores;
        loop {
            let idle = cores.idle.notified();
            let mut idle = std::pin::pin!(idle);
            idle.as_mut().enable();
            if cores.running.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }

    /// The buffer resource.
    pub fn resource(&self) -> &Arc<BufferResource> {
        &self.inner.resource
    }

    /// This rank's statistics.
    pub fn statistics(&self) -> &Arc<Statistics> {
        self.inner.comm.statistics()
    }

    /// The progress engine.
    pub fn progress(&self) -> &ProgressEngine {
        &self.inner.progress
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiters_poll_only_where_no_rank_needs_the_core() {
        use Placement::{Apart, InProcess};
        for p in [InProcess, Apart] {
            let poll = Waiting::polling(p);
            assert_eq!(Waiting::choose(1, p, 1, 1), poll);
            assert_eq!(Waiting::choose(2, p, 2, 2), poll);
            assert_eq!(Waiting::choose(2, p, 4, 8), poll);
            // More workers than cores, or no rank at all.
            assert_eq!(Waiting::choose(2, p, 4, 2), Waiting::Park);
            assert_eq!(Waiting::choose(0, p, 2, 2), Waiting::Park);
        }
        // More ranks than workers: in-process ranks yield to each other on
        // 2 workers or more; processes would hold a core another needs
        // (and sockets want the I/O driver's turn), and on one worker
        // every wake-up is local anyway.
        let poll = Waiting::PollTasks(Waiting::POLL);
        assert_eq!(Waiting::choose(4, InProcess, 2, 2), poll);
        assert_eq!(Waiting::choose(8, InProcess, 2, 2), poll);
        // Polling in process passes over the I/O driver; apart it does not.
        assert_eq!(
            Waiting::choose(2, Apart, 2, 2),
            Waiting::Poll(Waiting::POLL)
        );
        assert_eq!(Waiting::choose(4, Apart, 2, 2), Waiting::Park);
        assert_eq!(Waiting::choose(4, InProcess, 1, 2), Waiting::Park);
    }

    #[test]
    fn bulk_waiters_poll_only_on_threads_of_their_own() {
        use Placement::{Apart, InProcess};
        use RankThreads::{Own, Shared};
        let big = Waiting::POLL_MAX_BYTES + 1;
        let small = Waiting::POLL_MAX_BYTES;
        // Ranks that share a runtime, or talk through sockets, park for
        // bulk work whatever else holds.
        for (p, t) in [(InProcess, Shared), (Apart, Shared), (Apart, Own)] {
            assert_eq!(Waiting::for_op(big, 2, p, t, 2, 2), Waiting::Park);
            assert_eq!(Waiting::for_op(64 << 20, 2, p, t, 1, 8), Waiting::Park);
        }
        // In-process ranks each on a runtime of their own poll for it, up
        // to the bulk limit, where they fit the cores.
        let bulk = Waiting::Spin(Waiting::POLL_BULK);
        assert_eq!(Waiting::for_op(big, 2, InProcess, Own, 1, 2), bulk);
        assert_eq!(Waiting::for_op(big, 4, InProcess, Own, 4, 16), bulk);
        assert_eq!(Waiting::for_op(big, 4, InProcess, Own, 2, 4), Waiting::Park);
        // Ranks in processes of their own poll small work, offering their
        // core, however many share the host's cores.
        let yielding = Waiting::PollYield(Waiting::POLL_BULK);
        assert_eq!(Waiting::for_op(small, 2, Apart, Own, 1, 2), yielding);
        assert_eq!(Waiting::for_op(8, 8, Apart, Own, 1, 2), yielding);
        assert_eq!(Waiting::for_op(0, 1, Apart, Own, 16, 16), yielding);
        // Small work as `choose` says, counting every rank's workers.
        // (In place where each rank has workers of its own.)
        assert_eq!(
            Waiting::for_op(small, 2, InProcess, Own, 1, 2),
            Waiting::Spin(Waiting::POLL)
        );
        let poll = Waiting::PollTasks(Waiting::POLL);
        assert_eq!(Waiting::for_op(small, 2, InProcess, Shared, 2, 2), poll);
        assert_eq!(
            Waiting::for_op(small, 3, InProcess, Own, 1, 2),
            Waiting::Park
        );
        assert_eq!(
            Waiting::for_op(small, 2, InProcess, Shared, 1, 2),
            Waiting::Park
        );
    }

    #[test]
    fn contexts_count_the_ranks_a_process_hosts() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"));
        let _guard = rt.enter();
        // The only test in this crate that makes contexts, so the counts
        // are exact.
        let before = LIVE_RANKS.load(Ordering::Relaxed);
        let comms = crate::comm::local::LocalComm::world(3);
        let ctxs: Vec<Context> = comms
            .into_iter()
            .map(|c| crate::world::context_for(Arc::new(c), crate::MemoryLimits::UNLIMITED))
            .collect();
        assert_eq!(LIVE_RANKS.load(Ordering::Relaxed), before + 3);
        // A clone is the same rank: it keeps one counted until it goes.
        let clone = ctxs[0].clone();
        drop(ctxs);
        assert_eq!(LIVE_RANKS.load(Ordering::Relaxed), before + 1);
        drop(clone);
        assert_eq!(LIVE_RANKS.load(Ordering::Relaxed), before);
    }
}
