//! Starting a job's ranks: every rank of an in-process (`local`) job, or the
//! one rank of this process in a `tcp` job, each with its own `Context`.

use std::future::Future;
use std::sync::Arc;

use futures::FutureExt as _;

use crate::Rank;
use crate::comm::local::LocalComm;
use crate::comm::tcp::{TcpComm, TcpConfig};
use crate::comm::{Backend, Communicator};
use crate::context::{Context, JobEnd, ProgressEngine};
use crate::error::CommError;
use crate::graph::BoxError;
use crate::memory::{BufferResource, MemoryLimits};

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
    /// With `BRAID_BACKEND=mpi` (feature `mpi`), the MPI rank.
    pub fn from_env_or_local(nranks: u32) -> Result<WorldSpec, CommError> {
        if std::env::var("BRAID_BACKEND").is_ok_and(|b| b == "mpi") {
            #[cfg(feature = "mpi")]
            return Ok(WorldSpec::Mpi);
            #[cfg(not(feature = "mpi"))]
            return Err(CommError::Bootstrap {
                rank: 0,
                detail: "BRAID_BACKEND=mpi, but braid was built without the mpi feature".into(),
            });
        }
        Ok(match TcpConfig::from_env()? {
            Some(c) => WorldSpec::Tcp(c),
            None => WorldSpec::Local { nranks },
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
    let comms: Vec<Arc<dyn Communicator>> = match spec {
        WorldSpec::Local { nranks } => LocalComm::world(*nranks)
            .into_iter()
            .map(|c| Arc::new(c) as Arc<dyn Communicator>)
            .collect(),
        WorldSpec::Tcp(cfg) => vec![Arc::new(TcpComm::connect(cfg.clone()).await?)],
        #[cfg(feature = "mpi")]
        WorldSpec::Mpi => vec![Arc::new(crate::comm::mpi::MpiComm::init()?)],
    };
    Ok(comms.into_iter().map(|c| context_for(c, limits)).collect())
}

/// A context over `comm` with its own `BufferResource` of `limits`, driven
/// by the current runtime.
pub fn context_for(comm: Arc<dyn Communicator>, limits: MemoryLimits) -> Context {
    Context::new(
        comm,
        BufferResource::new(MemoryLimits {
            device: limits.device.or(Some(0)),
            host: limits.host,
        }),
        ProgressEngine::new(tokio::runtime::Handle::current()),
    )
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
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .max(2);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .map_err(|e| RankError {
            rank: 0,
            source: Box::new(e),
        })?;
    rt.block_on(async move {
        let rank = match spec {
            WorldSpec::Tcp(cfg) => cfg.rank,
            _ => 0,
        };
        let ctxs = contexts(spec, limits).await.map_err(|e| RankError {
            rank,
            source: Box::new(e),
        })?;
        let job = Arc::new(job);
        let (err_tx, mut err_rx) = tokio::sync::mpsc::unbounded_channel::<RankError>();
        let mut handles = Vec::new();
        for ctx in ctxs {
            let comm = ctx.comm().clone();
            let job = job.clone();
            let err_tx = err_tx.clone();
            let rank = comm.rank();
            let ends = ctx.clone();
            handles.push(tokio::spawn(async move {
                // A job that panics fails its rank like one that returns an
                // error: the others are told (abort) instead of waiting for
                // it forever.
                // (Building the job's future may panic too.)
                let panicked = |p| -> BoxError {
                    format!("panicked: {}", crate::graph::panic_message(p)).into()
                };
                let ran = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(ctx)))
                {
                    Ok(fut) => std::panic::AssertUnwindSafe(fut)
                        .catch_unwind()
                        .await
                        .unwrap_or_else(|p| Err(panicked(p))),
                    Err(p) => Err(panicked(p)),
                };
                let r = match ran {
                    Ok(v) => comm
                        .shutdown()
                        .await
                        .map(|_| v)
                        .map_err(|e| Box::new(e) as BoxError),
                    Err(e) => {
                        comm.abort(&e.to_string());
                        // Lets the abort notice reach the other ranks.
                        let _ = comm.shutdown().await;
                        Err(e)
                    }
                };
                // What waits for the job's end (device communicators) is
                // torn down now, before the process may exit.
                let end = if r.is_ok() {
                    JobEnd::Finished
                } else {
                    JobEnd::Failed
                };
                let _ = tokio::task::spawn_blocking(move || ends.end_job(end)).await;
                r.map_err(|source| {
                    let e = RankError { rank, source };
                    let _ = err_tx.send(RankError {
                        rank,
                        source: e.source.to_string().into(),
                    });
                    e
                })
                .map(|v| (rank, v))
            }));
        }
        drop(err_tx);
        let mut out = Vec::new();
        let mut any_err = false;
        for h in handles {
            match h.await {
                Ok(Ok(v)) => out.push(v),
                Ok(Err(_)) => any_err = true,
                Err(je) => {
                    any_err = true;
                    tracing::error!("rank task failed: {je}");
                }
            }
        }
        if any_err {
            return Err(err_rx.recv().await.unwrap_or(RankError {
                rank: 0,
                source: "a rank's task panicked".into(),
            }));
        }
        Ok(out)
    })
}
