//! Memory: `Buffer`s of bytes and the `BufferResource` that accounts for
//! them against per-memory-type limits through reservations.
//!
//! Invariant: `used[t]` of a resource is the sum of the live reservations'
//! remaining sizes and the live charged buffers' sizes of type `t`. A
//! reservation turns into charged buffers by `allocate`/`adopt`, so memory is
//! counted once from the moment it is reserved until the last handle to the
//! buffer is dropped.

mod buffer;
mod copy;
mod landing;
mod large;
mod pool;
mod resource;

pub use buffer::{Buffer, MemoryType};
pub use copy::{Pages, Stores, fill_threads, stores_for};
pub use landing::{AssembleError, Landing, LandingZone};
pub use large::{HUGE_PAGE_MIN, large_vec, reuse_freed_memory, try_large_vec};
pub use pool::BufferPool;
#[cfg(feature = "cuda")]
pub(crate) use resource::Charge;
pub use resource::{BufferResource, MemoryLimits, Reservation};
