//! The GPU data plane (feature `cuda`): devices, device buffers, the NCCL
//! communicator and CUDA IPC.
//!
//! - [`Gpu`]: one CUDA device as a rank sees it (primary context, a compute
//!   stream, a pool of plain `cuMemAlloc` allocations).
//! - [`DeviceBuffer`]: bytes in device memory with the event of their latest
//!   write; spilling to host ([`Resident`]).
//! - [`NcclComm`]: an NCCL communicator on its own OS thread, serving
//!   requests in call order and answering when the enqueued work completes;
//!   where ranks share a GPU its calls go through host memory instead
//!   ([`Transport::HostStaged`]), and a communicator of one rank copies on
//!   its stream without NCCL ([`Transport::Solo`]).
//! - [`PinnedPool`]: page-locked host blocks for fast, asynchronous copies
//!   to and from the device (downloads land in them and stay there).
//! - [`DeviceTable`]: a table chunk with its columns in device memory,
//!   converted from and to Arrow on the host.
//! - [`ipc`]: CUDA IPC between processes (and threads) of one host, and a
//!   copy-engine SendRecv over it.
//!
//! cudarc is loaded dynamically: a build needs no CUDA, and [`Gpu::count`]
//! answers 0 on a machine without a driver instead of failing.

mod buffer;
mod device;
mod error;
pub mod ipc;
mod nccl;
mod pinned;
mod solo;
mod staged;
mod table;

pub use buffer::{DeviceBuffer, POISON, Resident, poison_new_allocations};
pub use device::{Gpu, GpuEvent};
pub use error::CudaError;
pub use nccl::{
    Completion, KeepAlive, NcclComm, NcclDType, NcclMode, NcclOp, NcclWork, OnDone, Slot,
    TRANSPORT_VAR, Transport,
};
pub use pinned::{PinnedBlock, PinnedPool};
pub use table::{DeviceColumn, DeviceTable, RowsInFlight, device_width};

/// Re-export of cudarc, so that downstream crates use the same version.
pub use cudarc;
