//! Errors of the GPU data plane; each names the rank.

use crate::Rank;
use crate::error::{CommError, MemoryError};

/// A failure of a CUDA driver call, an NCCL call or a device buffer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CudaError {
    /// No usable CUDA device (no driver, no GPU, ordinal out of range).
    #[error("rank {rank}: no CUDA device: {detail}")]
    NoDevice {
        /// This rank.
        rank: Rank,
        /// What was found.
        detail: String,
    },
    /// A CUDA driver call failed.
    #[error("rank {rank}: CUDA {call} failed: {detail}")]
    Driver {
        /// This rank.
        rank: Rank,
        /// The call.
        call: &'static str,
        /// The driver's error.
        detail: String,
    },
    /// An NCCL call failed (or the communicator was aborted).
    #[error("rank {rank}: NCCL {call} failed: {detail}")]
    Nccl {
        /// This rank.
        rank: Rank,
        /// The call.
        call: &'static str,
        /// NCCL's error.
        detail: String,
    },
    /// Bad arguments (lengths, offsets, devices); nothing was enqueued.
    #[error("rank {rank}: {detail}")]
    Invalid {
        /// This rank.
        rank: Rank,
        /// What is wrong.
        detail: String,
    },
    /// The host communicator failed (used for ids, handles and checks).
    #[error(transparent)]
    Comm(#[from] CommError),
    /// Memory accounting refused an allocation.
    #[error("rank {rank}: {source}")]
    Memory {
        /// This rank.
        rank: Rank,
        /// The accounting error.
        #[source]
        source: MemoryError,
    },
}

impl CudaError {
    pub(crate) fn driver(
        rank: Rank,
        call: &'static str,
        e: cudarc::driver::DriverError,
    ) -> CudaError {
        let name = e
            .error_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|_| format!("{:?}", e.0));
        let text = e
            .error_string()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        CudaError::Driver {
            rank,
            call,
            detail: format!("{name}: {text}"),
        }
    }

    /// The error with `what` (the operation's arguments, say) added to a
    /// driver error's detail; other errors as they are.
    pub(crate) fn with_context(self, what: impl FnOnce() -> String) -> CudaError {
        match self {
            CudaError::Driver { rank, call, detail } => CudaError::Driver {
                rank,
                call,
                detail: format!("{detail} ({})", what()),
            },
            e => e,
        }
    }

    pub(crate) fn nccl(
        rank: Rank,
        call: &'static str,
        e: cudarc::nccl::result::NcclError,
    ) -> CudaError {
        CudaError::Nccl {
            rank,
            call,
            detail: format!("{:?}", e.0),
        }
    }
}

/// `Result` of a raw driver call as `CudaError`.
pub(crate) trait DriverResult<T> {
    fn on(self, rank: Rank, call: &'static str) -> Result<T, CudaError>;
}

impl<T> DriverResult<T> for Result<T, cudarc::driver::DriverError> {
    fn on(self, rank: Rank, call: &'static str) -> Result<T, CudaError> {
        self.map_err(|e| CudaError::driver(rank, call, e))
    }
}

impl DriverResult<()> for cudarc::driver::sys::CUresult {
    fn on(self, rank: Rank, call: &'static str) -> Result<(), CudaError> {
        self.result().map_err(|e| CudaError::driver(rank, call, e))
    }
}
