//! Gradient checks for loss scaling: unscale in place while looking for inf/NaN (torch's
//! `_amp_foreach_non_finite_check_and_unscale_`), and the same finite check on 2-byte gradients
//! by their bit patterns, without widening.
//!
//! Each loop is branch-free over fixed-width lanes (an `|=` of "exponent all ones") so the
//! compiler vectorises it; long slices split over rayon. Like torch, unscaling multiplies every
//! element, non-finite ones included: a skipped step ignores the gradients anyway.
//! What this module does not do: decide to skip (see `scaler`) or reduce over ranks (`comm`).
//!
//! ```
//! use train::precision::unscale_and_check;
//! let mut g = [4.0f32, -8.0];
//! assert!(!unscale_and_check(&mut g, 0.25));
//! assert_eq!(g, [1.0, -2.0]);
//! assert!(unscale_and_check(&mut [1.0, f32::NAN], 1.0));
//! ```

use half::{bf16, f16};
use rayon::prelude::*;

/// Elements per rayon task.
const CHUNK: usize = 1 << 15;
/// Lanes per inner step: one AVX-512 register of f32.
const LANES: usize = 16;

/// Multiplies every gradient by `inv_scale`; true when any input was inf or NaN.
pub fn unscale_and_check(grads: &mut [f32], inv_scale: f32) -> bool {
    if grads.len() <= CHUNK {
        return unscale_serial(grads, inv_scale);
    }
    grads
        .par_chunks_mut(CHUNK)
        .map(|c| unscale_serial(c, inv_scale))
        .reduce(|| false, |a, b| a | b)
}

/// True when any f32 is inf or NaN.
pub fn any_non_finite(grads: &[f32]) -> bool {
    let bits = |x: &f32| x.to_bits() & 0x7F80_0000 == 0x7F80_0000;
    any_bits(grads, bits)
}

/// True when any f16 is inf or NaN (exponent bits all ones).
pub fn any_non_finite_f16(grads: &[f16]) -> bool {
    any_bits(grads, |x: &f16| x.to_bits() & 0x7C00 == 0x7C00)
}

/// True when any bf16 is inf or NaN.
pub fn any_non_finite_bf16(grads: &[bf16]) -> bool {
    any_bits(grads, |x: &bf16| x.to_bits() & 0x7F80 == 0x7F80)
}

fn unscale_serial(grads: &mut [f32], inv_scale: f32) -> bool {
    let mut bad = [false; LANES];
    let mut lanes = grads.chunks_exact_mut(LANES);
    for lane in &mut lanes {
        for (b, g) in bad.iter_mut().zip(lane.iter_mut()) {
            *b |= g.to_bits() & 0x7F80_0000 == 0x7F80_0000;
            *g *= inv_scale;
        }
    }
    let mut found = bad.iter().any(|&b| b);
    for g in lanes.into_remainder() {
        found |= !g.is_finite();
        *g *= inv_scale;
    }
    found
}

fn any_bits<T: Sync>(xs: &[T], non_finite: impl Fn(&T) -> bool + Sync) -> bool {
    let serial = |xs: &[T]| {
        let mut bad = [false; LANES];
        let mut lanes = xs.chunks_exact(LANES);
        for lane in &mut lanes {
            for (b, x) in bad.iter_mut().zip(lane) {
                *b |= non_finite(x);
            }
        }
        bad.iter().any(|&b| b) || lanes.remainder().iter().any(&non_finite)
    };
    if xs.len() <= CHUNK {
        return serial(xs);
    }
    xs.par_chunks(CHUNK).any(serial)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_single_bad_value_anywhere() {
        for n in [1usize, 15, 16, 17, 100_000] {
            for &pos in &[0, n / 2, n - 1] {
                for bad in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
                    let mut g = vec![2.0f32; n];
                    g[pos] = bad;
                    assert!(any_non_finite(&g), "{n} {pos}");
                    let h: Vec<f16> = g.iter().map(|&x| f16::from_f32(x)).collect();
                    let b: Vec<bf16> = g.iter().map(|&x| bf16::from_f32(x)).collect();
                    assert!(any_non_finite_f16(&h) && any_non_finite_bf16(&b));
                    assert!(unscale_and_check(&mut g, 0.5));
                    let others = g.iter().enumerate().filter(|&(i, _)| i != pos);
                    assert!(others.into_iter().all(|(_, &x)| x == 1.0), "all unscaled");
                }
            }
            let mut clean = vec![f32::MAX; n];
            assert!(!unscale_and_check(&mut clean, 1.0));
            assert!(!any_non_finite_f16(&vec![f16::MAX; n]));
            assert!(!any_non_finite_bf16(&vec![bf16::MAX; n]));
        }
    }
}
