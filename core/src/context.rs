//! `Context`: what a rank's nodes and collectives share: the communicator,
//! the OpId allocator, the buffer resource, statistics and the progress
//! engine. Cheap to clone.

use std::future::Future;
use std::sync::Arc;

use tokio::task::JoinHandle;

use crate::Rank;
use crate::comm::Communicator;
use crate::memory::BufferResource;
use crate::stats::Statistics;
use crate::tag::{OpId, OpIdAllocator};

/// Drives the non-streaming cores of collectives: each core is a task of
/// this engine that advances its protocol as messages arrive, then runs the
/// core's completion callback. It is a handle to the rank's tokio runtime,
/// so a core makes progress whether or not anyone is waiting on it.
#[derive(Debug, Clone)]
pub struct ProgressEngine {
    handle: tokio::runtime::Handle,
}

impl ProgressEngine {
    /// An engine running on `handle`'s runtime.
    pub fn new(handle: tokio::runtime::Handle) -> Self {
        ProgressEngine { handle }
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
}

struct Inner {
    comm: Arc<dyn Communicator>,
    op_ids: OpIdAllocator,
    resource: Arc<BufferResource>,
    progress: ProgressEngine,
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
        Context {
            inner: Arc::new(Inner {
                comm,
                op_ids: OpIdAllocator::new(),
                resource,
                progress,
            }),
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

    /// The next OpId; every rank must call this in the same order.
    pub fn next_op_id(&self) -> OpId {
        self.inner.op_ids.next()
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
