//! braid-core: the runtime every braid job stands on.
//!
//! - [`comm`]: the `Communicator` trait and its backends (`local`, `tcp`).
//! - [`tag`]: `Tag` and `OpId`, which name collective instances.
//! - [`memory`]: `Buffer`, `BufferResource`, reservations.
//! - [`context`]: a rank's `Context` and the `ProgressEngine`.
//! - [`event`]: the set-once `Event` collectives complete through.
//! - [`message`], [`mod@channel`], [`graph`]: the streaming layer.
//! - [`stats`]: per-rank statistics.
//! - `cuda` (feature `cuda`): device buffers, NCCL, CUDA IPC.
//! - [`world`]: starting ranks; [`launch`]: starting rank processes;
//!   [`rank_progress`]: their progress, summed where the launcher shows it.

pub mod channel;
pub mod comm;
pub mod context;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod env;
pub mod error;
pub mod event;
pub mod file_lock;
pub mod graph;
pub mod launch;
pub mod memory;
pub mod message;
pub mod par;
mod pipe;
pub mod rank_exits;
pub mod rank_progress;
pub mod stats;
pub mod tag;
pub mod world;

/// A rank index, `0..nranks`.
pub type Rank = u32;

pub use channel::{ChannelError, Receiver, Sender, channel};
pub use comm::{Backend, Communicator};
pub use context::{Context, CoreGuard, JobEnd, Placement, ProgressEngine, RankThreads, Waiting};
pub use error::{CommError, MemoryError};
pub use event::{BlockingOnDriver, Event};
pub use graph::{BoxError, FailedAt, Graph, GraphError, NodeError};
pub use memory::{Buffer, BufferResource, MemoryLimits, MemoryType, Reservation};
pub use message::{Message, PackedData, Payload, TableChunk};
pub use stats::Statistics;
pub use tag::{OpId, Tag};
pub use world::{RankError, WorldSpec, run_world};
