//! Errors of the pipeline nodes: bad input data or options, file I/O, and
//! failures of the layers below.

use braid_coll::CollError;
use braid_core::{ChannelError, CommError, NodeError};

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
}

impl DataError {
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
