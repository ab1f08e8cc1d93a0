//! Numeric columns cast on the device: values to f64 (the rolling kernel's
//! input) and integer keys to i64 (hash partition and sort keys).

use std::sync::Arc;

use braid_core::cuda::cudarc::driver::PushKernelArg;
use braid_core::cuda::{DeviceBuffer, Gpu};

use super::launch::{KernelError, Kernels, grid, launched};
use super::ops::{mark_written, wait_inputs};

/// A fixed-width numeric element type, as the cast kernels know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumType {
    /// i8.
    I8,
    /// i16.
    I16,
    /// i32.
    I32,
    /// i64 (also Arrow timestamps, dates and durations of 64 bits).
    I64,
    /// u8.
    U8,
    /// u16.
    U16,
    /// u32.
    U32,
    /// u64.
    U64,
    /// f32.
    F32,
    /// f64.
    F64,
}

impl NumType {
    /// Bytes per element.
    pub fn width(self) -> usize {
        match self {
            NumType::I8 | NumType::U8 => 1,
            NumType::I16 | NumType::U16 => 2,
            NumType::I32 | NumType::U32 | NumType::F32 => 4,
            NumType::I64 | NumType::U64 | NumType::F64 => 8,
        }
    }

    /// Whether this is an integer type.
    pub fn is_integer(self) -> bool {
        !matches!(self, NumType::F32 | NumType::F64)
    }

    /// The type code of `kernels.cu`.
    fn code(self) -> u32 {
        self as u32
    }
}

fn cast(
    gpu: &Arc<Gpu>,
    input: &DeviceBuffer,
    ty: NumType,
    name: &'static str,
) -> Result<DeviceBuffer, KernelError> {
    if input.len() % ty.width() != 0 {
        return Err(KernelError::Invalid {
            rank: gpu.rank(),
            kernel: name,
            detail: format!("{} bytes are not whole {ty:?} values", input.len()),
        });
    }
    let n = (input.len() / ty.width()) as u64;
    let mut out = DeviceBuffer::alloc(gpu, n as usize * 8)?;
    if n > 0 {
        let k = Kernels::get(gpu)?;
        let f = k.func(gpu.rank(), name)?;
        wait_inputs(gpu, &[input, &out])?;
        let (i, o, code) = (input.ptr(), out.ptr(), ty.code());
        let mut b = gpu.stream().launch_builder(f);
        b.arg(&i).arg(&code).arg(&o).arg(&n);
        // SAFETY: `n` elements of `ty` in, `n` 8-byte values out.
        launched(gpu.rank(), unsafe { b.launch(grid(n as usize)) })?;
    }
    mark_written(gpu, &[input], &mut [&mut out])?;
    Ok(out)
}

/// The values of `input` (elements of `ty`) as f64.
pub fn cast_to_f64(
    gpu: &Arc<Gpu>,
    input: &DeviceBuffer,
    ty: NumType,
) -> Result<DeviceBuffer, KernelError> {
    cast(gpu, input, ty, "cast_to_f64")
}

/// The values of `input` (an integer type) as i64; u64 wraps as `as i64`.
pub fn cast_to_i64(
    gpu: &Arc<Gpu>,
    input: &DeviceBuffer,
    ty: NumType,
) -> Result<DeviceBuffer, KernelError> {
    if !ty.is_integer() {
        return Err(KernelError::Invalid {
            rank: gpu.rank(),
            kernel: "cast_to_i64",
            detail: format!("{ty:?} is not an integer type"),
        });
    }
    cast(gpu, input, ty, "cast_to_i64")
}
