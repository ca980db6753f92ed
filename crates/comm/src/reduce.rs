//! Element-wise reduction kernels shared by the backends, and their plain serial reference.
//!
//! Holds arithmetic only, no synchronisation. The fixed order is the contract: element i of a
//! reduction over N ranks is `((x0 ⊕ x1) ⊕ x2) ⊕ … ⊕ x(N−1)` computed in f32 (bf16 inputs are
//! widened exactly), then `Avg` divides by N in f32, then the result is rounded once to the
//! element type. The fast kernel works in cache-sized blocks; `reference` is the plain loop the
//! tests hold it to, bit for bit.
//!
//! ```
//! use comm::{reference, ReduceOp};
//! let out = reference::reduce_f32(&[&[1.0, 2.0], &[3.0, 4.0]], ReduceOp::Avg);
//! assert_eq!(out, vec![2.0, 3.0]);
//! ```

use crate::ReduceOp;
use half::bf16;

/// The element types collectives carry. Sealed: only f32 and bf16.
pub(crate) trait Elem: Copy + Send + Sync + 'static {
    fn widen(self) -> f32;
    fn narrow(x: f32) -> Self;
}

impl Elem for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
    #[inline(always)]
    fn narrow(x: f32) -> Self {
        x
    }
}

impl Elem for bf16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        // Exact: a bf16 is the top 16 bits of an f32. Written out so the loop vectorises.
        f32::from_bits((self.to_bits() as u32) << 16)
    }
    /// Round to nearest, ties to even; NaN stays a (quiet) NaN. The same as `bf16::from_f32`
    /// (a test holds them together) but branch-free, so the reduction loop vectorises.
    #[inline(always)]
    fn narrow(x: f32) -> Self {
        let b = x.to_bits();
        let rounded = (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
        let quiet_nan = ((b >> 16) | 0x0040) as u16;
        bf16::from_bits(if x.is_nan() { quiet_nan } else { rounded })
    }
}

/// `max` that lets a NaN through, so "max over ranks" never hides an overflow.
#[inline(always)]
pub(crate) fn max_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || (!b.is_nan() && a >= b) {
        a
    } else {
        b
    }
}

/// Elements per block: the f32 accumulator (4 KiB) stays in L1 while each rank's block streams.
const BLOCK: usize = 1024;

/// `dst[i] = op over k of srcs[k][i]` for `i < len`, in rank order, in blocks.
///
/// # Safety
/// Every `srcs[k]` (a `*const T` as usize) is valid for reads of `len` elements and `dst` for
/// writes of `len`; nobody else writes those ranges during the call. `dst` may be the same range
/// as one source (a block is read completely before it is written) but must not partially
/// overlap any source.
pub(crate) unsafe fn reduce_into<T: Elem>(srcs: &[usize], dst: *mut T, len: usize, op: ReduceOp) {
    let n = srcs.len();
    let mut acc = [0f32; BLOCK];
    let mut start = 0;
    while start < len {
        let m = BLOCK.min(len - start);
        let acc = &mut acc[..m];
        for (k, &src) in srcs.iter().enumerate() {
            // SAFETY: in bounds per the contract; the slice dies before `dst` is written.
            let s = unsafe { std::slice::from_raw_parts((src as *const T).add(start), m) };
            accumulate(acc, s, k == 0, op);
        }
        if op == ReduceOp::Avg {
            let d = n as f32;
            acc.iter_mut().for_each(|a| *a /= d);
        }
        // SAFETY: in bounds per the contract; no source slice is alive.
        let out = unsafe { std::slice::from_raw_parts_mut(dst.add(start), m) };
        for (o, &a) in out.iter_mut().zip(acc.iter()) {
            *o = T::narrow(a);
        }
        start += m;
    }
}

#[inline(always)]
fn accumulate<T: Elem>(acc: &mut [f32], s: &[T], first: bool, op: ReduceOp) {
    if first {
        acc.iter_mut().zip(s).for_each(|(a, &x)| *a = x.widen());
        return;
    }
    match op {
        ReduceOp::Sum | ReduceOp::Avg => acc.iter_mut().zip(s).for_each(|(a, &x)| *a += x.widen()),
        ReduceOp::Max => acc
            .iter_mut()
            .zip(s)
            .for_each(|(a, &x)| *a = max_nan(*a, x.widen())),
    }
}

/// Plain serial reductions: the definition every backend must match bit for bit.
pub mod reference {
    use super::{max_nan, Elem};
    use crate::ReduceOp;
    use half::bf16;

    /// Reduces `inputs` (one slice per rank, all the same length) element-wise in rank order.
    pub fn reduce_f32(inputs: &[&[f32]], op: ReduceOp) -> Vec<f32> {
        reduce(inputs, op)
    }

    /// Like `reduce_f32`, accumulating in f32 and rounding once.
    pub fn reduce_bf16(inputs: &[&[bf16]], op: ReduceOp) -> Vec<bf16> {
        reduce(inputs, op)
    }

    fn reduce<T: Elem>(inputs: &[&[T]], op: ReduceOp) -> Vec<T> {
        assert!(!inputs.is_empty(), "reduce over zero ranks");
        let len = inputs[0].len();
        assert!(
            inputs.iter().all(|s| s.len() == len),
            "ranks' lengths differ"
        );
        (0..len)
            .map(|i| {
                let mut acc = inputs[0][i].widen();
                for s in &inputs[1..] {
                    acc = match op {
                        ReduceOp::Sum | ReduceOp::Avg => acc + s[i].widen(),
                        ReduceOp::Max => max_nan(acc, s[i].widen()),
                    };
                }
                if op == ReduceOp::Avg {
                    acc /= inputs.len() as f32;
                }
                T::narrow(acc)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::Elem;
    use half::bf16;

    #[test]
    fn bf16_narrow_matches_half() {
        let mut x = 0x1234_5678u32;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let f = f32::from_bits(x);
            let ours = <bf16 as Elem>::narrow(f);
            if f.is_nan() {
                assert!(ours.is_nan());
            } else {
                assert_eq!(ours.to_bits(), bf16::from_f32(f).to_bits(), "{x:#x}");
            }
        }
    }

    #[test]
    fn bf16_rounds_ties_to_even() {
        let narrow = |bits: u32| <bf16 as Elem>::narrow(f32::from_bits(bits)).to_bits();
        assert_eq!(
            narrow(0x3F80_8000),
            0x3F80,
            "1 + 2^-8 is a tie: down to the even 1.0"
        );
        assert_eq!(
            narrow(0x3F81_8000),
            0x3F82,
            "a tie above an odd value goes up"
        );
        assert_eq!(narrow(0x3F80_8001), 0x3F81, "just above a tie goes up");
        assert_eq!(
            narrow(0x7F7F_FFFF),
            0x7F80,
            "beyond bf16's max rounds to infinity"
        );
        assert_eq!(narrow(0xFF80_0000), 0xFF80, "-inf stays -inf");
        assert!(<bf16 as Elem>::narrow(f32::NAN).is_nan());
        assert!(<bf16 as Elem>::narrow(f32::from_bits(0xFFFF_FFFF)).is_nan());
        for x in [
            0.0f32,
            -0.0,
            1.5,
            -0.007_812_5,
            2f32.powi(100),
            f32::INFINITY,
        ] {
            assert_eq!(
                <bf16 as Elem>::narrow(x).to_f32(),
                x,
                "{x} is exact in bf16"
            );
        }
    }
}
