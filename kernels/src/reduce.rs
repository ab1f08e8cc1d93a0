//! Element types that collectives move and reduce, and the reduction
//! kernels over them.
//!
//! `reduce_into(acc, x, kind)` computes `acc[i] = acc[i] (op) x[i]` in one
//! pass the compiler vectorises. Min and max follow IEEE 754 minNum/maxNum
//! for floats (a NaN loses against a number), the same on every rank.

use std::fmt;

/// The element type of a typed collective, carried in its messages so that
/// ranks that disagree are caught.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// Raw bytes.
    Bytes,
    /// `i32`.
    I32,
    /// `i64`.
    I64,
    /// `f32`.
    F32,
    /// `f64`.
    F64,
}

impl DType {
    /// Wire code.
    pub const fn code(self) -> u8 {
        match self {
            DType::Bytes => 0,
            DType::I32 => 1,
            DType::I64 => 2,
            DType::F32 => 3,
            DType::F64 => 4,
        }
    }

    /// From a wire code.
    pub const fn from_code(c: u8) -> Option<DType> {
        Some(match c {
            0 => DType::Bytes,
            1 => DType::I32,
            2 => DType::I64,
            3 => DType::F32,
            4 => DType::F64,
            _ => return None,
        })
    }

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::Bytes => 1,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::Bytes => "bytes",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F32 => "f32",
            DType::F64 => "f64",
        })
    }
}

/// A built-in reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    /// Sum (wrapping for integers).
    Sum,
    /// Product (wrapping for integers).
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
}

/// A plain-old-data element that collectives can move and reduce.
pub trait Element: bytemuck::Pod + Send + Sync + PartialEq + fmt::Debug + 'static {
    /// Its type tag.
    const DTYPE: DType;
    /// `a (op) b`.
    fn combine(a: Self, b: Self, kind: ReduceKind) -> Self;
}

macro_rules! int_element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            #[inline(always)]
            fn combine(a: Self, b: Self, kind: ReduceKind) -> Self {
                match kind {
                    ReduceKind::Sum => a.wrapping_add(b),
                    ReduceKind::Prod => a.wrapping_mul(b),
                    ReduceKind::Min => a.min(b),
                    ReduceKind::Max => a.max(b),
                }
            }
        }
    };
}

macro_rules! float_element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            #[inline(always)]
            fn combine(a: Self, b: Self, kind: ReduceKind) -> Self {
                match kind {
                    ReduceKind::Sum => a + b,
                    ReduceKind::Prod => a * b,
                    ReduceKind::Min => a.min(b),
                    ReduceKind::Max => a.max(b),
                }
            }
        }
    };
}

int_element!(i32, DType::I32);
int_element!(i64, DType::I64);
float_element!(f32, DType::F32);
float_element!(f64, DType::F64);

impl Element for u8 {
    const DTYPE: DType = DType::Bytes;
    #[inline(always)]
    fn combine(a: Self, b: Self, kind: ReduceKind) -> Self {
        match kind {
            ReduceKind::Sum => a.wrapping_add(b),
            ReduceKind::Prod => a.wrapping_mul(b),
            ReduceKind::Min => a.min(b),
            ReduceKind::Max => a.max(b),
        }
    }
}

/// `acc[i] = acc[i] (kind) x[i]` for every `i` (the shorter length wins).
pub fn reduce_into<T: Element>(acc: &mut [T], x: &[T], kind: ReduceKind) {
    // One loop per kind so each is a tight, vectorisable loop.
    match kind {
        ReduceKind::Sum => acc
            .iter_mut()
            .zip(x)
            .for_each(|(a, b)| *a = T::combine(*a, *b, ReduceKind::Sum)),
        ReduceKind::Prod => acc
            .iter_mut()
            .zip(x)
            .for_each(|(a, b)| *a = T::combine(*a, *b, ReduceKind::Prod)),
        ReduceKind::Min => acc
            .iter_mut()
            .zip(x)
            .for_each(|(a, b)| *a = T::combine(*a, *b, ReduceKind::Min)),
        ReduceKind::Max => acc
            .iter_mut()
            .zip(x)
            .for_each(|(a, b)| *a = T::combine(*a, *b, ReduceKind::Max)),
    }
}

/// Appends `a[i] (kind) b[i]` for every `i` to `out` (the shorter input's
/// length wins): the first step of a rank-order reduction without first
/// copying `a` into the accumulator.
pub fn combine_extend<T: Element>(out: &mut Vec<T>, a: &[T], b: &[T], kind: ReduceKind) {
    let pairs = a.iter().zip(b);
    match kind {
        ReduceKind::Sum => out.extend(pairs.map(|(x, y)| T::combine(*x, *y, ReduceKind::Sum))),
        ReduceKind::Prod => out.extend(pairs.map(|(x, y)| T::combine(*x, *y, ReduceKind::Prod))),
        ReduceKind::Min => out.extend(pairs.map(|(x, y)| T::combine(*x, *y, ReduceKind::Min))),
        ReduceKind::Max => out.extend(pairs.map(|(x, y)| T::combine(*x, *y, ReduceKind::Max))),
    }
}

/// Writes `a[i] (kind) b[i]` to `out[i]` for every `i` of the shortest of
/// the three: [`combine_extend`] into memory not yet written (a share of
/// a result that several threads fill).
pub fn combine_write<T: Element>(
    out: &mut [std::mem::MaybeUninit<T>],
    a: &[T],
    b: &[T],
    kind: ReduceKind,
) {
    let cells = out.iter_mut().zip(a.iter().zip(b));
    match kind {
        ReduceKind::Sum => cells.for_each(|(o, (x, y))| {
            o.write(T::combine(*x, *y, ReduceKind::Sum));
        }),
        ReduceKind::Prod => cells.for_each(|(o, (x, y))| {
            o.write(T::combine(*x, *y, ReduceKind::Prod));
        }),
        ReduceKind::Min => cells.for_each(|(o, (x, y))| {
            o.write(T::combine(*x, *y, ReduceKind::Min));
        }),
        ReduceKind::Max => cells.for_each(|(o, (x, y))| {
            o.write(T::combine(*x, *y, ReduceKind::Max));
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reductions() {
        let mut a = vec![1i64, 5, -3];
        reduce_into(&mut a, &[2, 2, 2], ReduceKind::Sum);
        assert_eq!(a, [3, 7, -1]);
        reduce_into(&mut a, &[2, 2, 2], ReduceKind::Prod);
        assert_eq!(a, [6, 14, -2]);
        reduce_into(&mut a, &[7, 7, 7], ReduceKind::Min);
        assert_eq!(a, [6, 7, -2]);
        let mut f = vec![1.0f64, f64::NAN];
        reduce_into(&mut f, &[0.5, 3.0], ReduceKind::Max);
        assert_eq!(f, [1.0, 3.0]);
        let mut w = vec![i32::MAX];
        reduce_into(&mut w, &[1], ReduceKind::Sum);
        assert_eq!(w, [i32::MIN]);
    }

    #[test]
    fn combine_extend_and_write_are_reduce_into_of_a_copy() {
        let a = [1.5f64, f64::NAN, -0.0, 7.25, 1e300];
        let b = [2.0f64, 3.0, 0.0, f64::NAN, 1e300];
        for kind in [
            ReduceKind::Sum,
            ReduceKind::Prod,
            ReduceKind::Min,
            ReduceKind::Max,
        ] {
            let mut want = a.to_vec();
            reduce_into(&mut want, &b, kind);
            let mut got = vec![9.0];
            combine_extend(&mut got, &a, &b, kind);
            assert_eq!(got.len(), 1 + a.len());
            for (g, w) in got[1..].iter().zip(&want) {
                assert_eq!(g.to_bits(), w.to_bits(), "{kind:?}");
            }
            let mut cells = [std::mem::MaybeUninit::new(9.0f64); 5];
            combine_write(&mut cells, &a, &b, kind);
            for (c, w) in cells.iter().zip(&want) {
                // SAFETY: made initialized, and overwritten by combine_write.
                assert_eq!(
                    unsafe { c.assume_init() }.to_bits(),
                    w.to_bits(),
                    "{kind:?}"
                );
            }
        }
    }

    #[test]
    fn dtype_codes_roundtrip() {
        for d in [DType::Bytes, DType::I32, DType::I64, DType::F32, DType::F64] {
            assert_eq!(DType::from_code(d.code()), Some(d));
        }
        assert_eq!(DType::from_code(99), None);
    }
}
