//! braid-kernels: compute kernels on columns.
//!
//! - [`hash`]: the 64-bit mixing function of generated data and digests.
//! - [`par`]: a kernel's independent work items on scoped threads.
//! - [`reduce`]: element types of collectives and the reduction operators
//!   (sum, prod, min, max, user-supplied) over them.
//! - [`sort`]: stable LSD radix sort of 64-bit keys with a payload.
//! - [`mod@rolling`]: rolling time-window aggregations (sum, mean, min, max,
//!   count, std, var) in one O(n) pass over a sorted group.
//! - [`window`]: how far back a window reaches: a fixed length or
//!   calendar months (date arithmetic as DuckDB and Polars do it).
//! - `gpu` (feature `cuda`): NVRTC-compiled GPU kernels (gather, hash
//!   partition, order keys, radix sort).

#[cfg(feature = "cuda")]
pub mod gpu;
pub mod hash;
pub mod par;
pub mod reduce;
pub mod rolling;
pub mod sort;
pub mod window;

pub use reduce::{DType, Element, ReduceKind};
pub use rolling::{
    Agg, AggColumn, Closed, RollingError, RollingResult, Segments, rolling, rolling_segments,
};
pub use window::{CalendarUnit, Window, Zone};
