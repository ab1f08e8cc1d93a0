//! Errors of the pipeline nodes: bad input data or options, file I/O, and
//! failures of the layers below.

use braid_coll::CollError;
use braid_core::{ChannelError, CommError, NodeError, Rank};

/// A node's failure.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A column the job needs is not in the input.
    #[error("input has no column {name:?} (columns: {available})")]
    MissingColumn {
        /// The missing column.
        name: String,
        /// The columns there are.
        available: String,
    },
    /// A column has a type the job cannot use.
    #[error("column {name:?} has type {found}, expected {expected}")]
    WrongType {
        /// The column.
        name: String,
        /// Its type.
        found: String,
        /// What would do.
        expected: String,
    },
    /// The data breaks a rule (nulls in the order column, say).
    #[error("{0}")]
    Invalid(String),
    /// A file could not be read or written.
    #[error("{path}: {detail}")]
    File {
        /// The file.
        path: String,
        /// What went wrong.
        detail: String,
    },
    /// An Arrow kernel failed.
    #[error("arrow: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    /// Parquet encoding or decoding failed.
    #[error("parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    /// A collective failed.
    #[error(transparent)]
    Coll(#[from] CollError),
    /// The communicator failed.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// A channel failed.
    #[error(transparent)]
    Channel(#[from] ChannelError),
    /// A step of a distributed node (the sort, say) failed on this rank;
    /// `source` says why ([`DataError::at`]).
    #[error("rank {rank}: {step}: {source}")]
    At {
        /// This rank.
        rank: Rank,
        /// The step.
        step: &'static str,
        /// What went wrong.
        #[source]
        source: Box<DataError>,
    },
    /// Ranks called a distributed step with different arguments (sort
    /// keys, input columns): every rank fails, each naming a peer whose
    /// call differs from its own, instead of returning inconsistent
    /// results.
    #[error("rank {rank}: {step}: call does not match rank {peer}'s: {detail}")]
    Mismatch {
        /// This rank.
        rank: Rank,
        /// The step.
        step: &'static str,
        /// A rank whose call differs.
        peer: Rank,
        /// What differs.
        detail: String,
    },
}

impl DataError {
    /// This error as `step` on `rank` reports it: an error that names
    /// its rank already (a collective's, the communicator's, a channel's,
    /// or one placed before) is kept as it is.
    pub fn at(self, rank: Rank, step: &'static str) -> Self {
        match self {
            e @ (DataError::Coll(_)
            | DataError::Comm(_)
            | DataError::Channel(_)
            | DataError::At { .. }
            | DataError::Mismatch { .. }) => e,
            e => DataError::At {
                rank,
                step,
                source: Box::new(e),
            },
        }
    }

    /// A file error for `path`.
    pub fn file(path: impl AsRef<std::path::Path>, detail: impl std::fmt::Display) -> Self {
        DataError::File {
            path: path.as_ref().display().to_string(),
            detail: detail.to_string(),
        }
    }
}

impl From<DataError> for NodeError {
    fn from(e: DataError) -> Self {
        match e {
            DataError::Channel(c) => NodeError::Channel(c),
            DataError::Comm(c) => NodeError::Comm(c),
            other => NodeError::Other(Box::new(other)),
        }
    }
}

/// Result of node code.
pub type Result<T, E = DataError> = std::result::Result<T, E>;
