//! braid-kernels: compute kernels on columns.
//!
//! - [`reduce`]: element types of collectives and the reduction operators
//!   (sum, prod, min, max, user-supplied) over them.

pub mod reduce;

pub use reduce::{DType, Element, ReduceKind};
