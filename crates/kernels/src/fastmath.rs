//! Vectorisable f32 `exp` and `tanh`, and the CPU-feature dispatch that lets LLVM widen loops
//! over them to AVX-512 or AVX2+FMA when the machine has them (the workspace builds for baseline
//! x86-64, where the same loops still vectorise 4-wide with SSE2).
//!
//! Both functions are branch-free straight-line code on purpose: a loop calling them compiles to
//! SIMD, unlike glibc's scalar `expf`/`tanhf`. Error bounds (measured against f64 by the tests in
//! this file over a dense sweep; the worst case is reported there):
//! - [`exp`]: Cephes `expf` (Cody–Waite reduction by ln 2, degree-6 polynomial on
//!   |r| <= ln2/2); relative error measured 8.3e-8 (< 1 ulp), tested <= 2 ulp (2.4e-7), for x in
//!   [-87.3, 88.37]; returns 0 below -87.34 (where the true value leaves f32's normal range) and
//!   +inf above 88.376 (true overflow is at 88.72); NaN stays NaN.
//! - [`tanh`]: an odd degree-15 polynomial for |x| < 0.9 and `1 - 2/(exp(2|x|) + 1)` above;
//!   relative error measured 9.6e-8, tested <= 1.5e-7, everywhere; |tanh| <= 1, ±1 for large
//!   |x|; NaN stays NaN. (Eigen's 13/6 rational approximation, tried first, is a little cheaper
//!   but measured 4.5e-7 and overshoots to 1.0000001.)
//!
//! Also the two row reductions softmaxes share (`row_max`, `exp_shifted_sum`). Not here: the
//! kernels themselves (classifier, attention, gelu call these).
//!
//! ```
//! let e = kernels::fastmath::exp(1.0);
//! assert!((e - std::f32::consts::E).abs() <= 2.0 * f32::EPSILON * e);
//! assert!((kernels::fastmath::tanh(0.5) - 0.5f32.tanh()).abs() < 1e-6);
//! ```

use crate::cpu::Level;

/// The widest instruction set the dispatching kernels may use on this machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Simd {
    /// Baseline x86-64 (SSE2) or a non-x86 target: plain loops, no FMA.
    Base,
    /// AVX2 with FMA: 8 lanes.
    Avx2,
    /// AVX-512F (with AVX2+FMA): 16 lanes.
    Avx512,
}

/// The [`Simd`] level [`crate::cpu::level`] allows.
#[inline]
pub fn simd() -> Simd {
    match crate::cpu::level() {
        Level::Portable => Simd::Base,
        Level::Avx2 | Level::Avx2Vnni => Simd::Avx2,
        _ => Simd::Avx512,
    }
}

/// Defines `$vis fn $name(args) -> ret` that calls `$body::<FMA>(args)` (a generic
/// `#[inline(always)]` function) compiled three times: inside an AVX-512 function, inside an
/// AVX2+FMA function, and plain, picking the one [`simd`] allows. Inlining the body into a
/// `#[target_feature]` function is what lets LLVM widen its loops past SSE2.
macro_rules! simd_fn {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? = $body:ident;) => {
        $(#[$m])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2,fma")]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                    $body::<true>($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    $body::<true>($($arg),*)
                }
                match $crate::fastmath::simd() {
                    // SAFETY: cpu::level() found these features on this CPU.
                    $crate::fastmath::Simd::Avx512 => unsafe { avx512($($arg),*) },
                    // SAFETY: as above.
                    $crate::fastmath::Simd::Avx2 => unsafe { avx2($($arg),*) },
                    $crate::fastmath::Simd::Base => $body::<false>($($arg),*),
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                $body::<false>($($arg),*)
            }
        }
    };
}
pub(crate) use simd_fn;

/// `a * b + c`, fused where the caller's code path has FMA (`FMA` true), two roundings otherwise
/// (a fused `mul_add` without the instruction would be a slow libm call).
#[inline(always)]
pub fn mul_add<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Below this, exp(x) is under f32's smallest normal: [`exp`] returns 0.
pub const EXP_LO: f32 = -87.336_55;
/// Above this, [`exp`] returns +inf (2^n with n = 128 is not representable in the scale factor).
pub const EXP_HI: f32 = 88.376_26;

/// Vectorisable f32 `exp`, without FMA; see the module docs for the error bound.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    exp_with::<false>(x)
}

/// [`exp`] with FMA chosen by `FMA` (for loop bodies behind `simd_fn!`).
#[inline(always)]
pub fn exp_with<const FMA: bool>(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that n * LN2_HI is exact for |n| <= 128 (Cody–Waite).
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding 1.5 * 2^23 rounds to the nearest integer in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    // clamp keeps NaN as NaN.
    let xc = x.clamp(EXP_LO, EXP_HI);
    let n = mul_add::<FMA>(xc, LOG2E, ROUND) - ROUND;
    let r = mul_add::<FMA>(n, -LN2_LO, mul_add::<FMA>(n, -LN2_HI, xc));
    let mut p = 1.987_569_1e-4f32;
    p = mul_add::<FMA>(p, r, 1.398_199_9e-3);
    p = mul_add::<FMA>(p, r, 8.333_452e-3);
    p = mul_add::<FMA>(p, r, 4.166_579_6e-2);
    p = mul_add::<FMA>(p, r, 1.666_666_5e-1);
    p = mul_add::<FMA>(p, r, 0.5);
    let p = mul_add::<FMA>(p, r * r, r) + 1.0;
    let scale = f32::from_bits(((n as i32 + 127) << 23) as u32);
    let y = p * scale;
    // Selects, not branches: NaN compares false everywhere and falls through as NaN.
    if x < EXP_LO {
        0.0
    } else if x > EXP_HI {
        f32::INFINITY
    } else {
        y
    }
}

/// Vectorisable f32 `tanh`, without FMA; see the module docs for the error bound.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    tanh_with::<false>(x)
}

/// [`tanh`] with FMA chosen by `FMA` (for loop bodies behind `simd_fn!`).
#[inline(always)]
pub fn tanh_with<const FMA: bool>(x: f32) -> f32 {
    // Below this |x| an odd polynomial; above, 1 - 2/(exp(2|x|) + 1), whose cancellation costs
    // little once tanh(x) > 0.7 (both sides measured ~1e-7 relative at the seam).
    const SEAM: f32 = 0.9;
    // tanh(x) = x + x^3 Q(x^2) on [0, 0.9]: degree-7 least-squares fit of Q on Chebyshev nodes
    // (numpy, f64), rounded to f32.
    const Q: [f32; 8] = [
        -0.333_333_34,
        0.133_333_28,
        -0.053_966_83,
        0.021_854_013,
        -0.008_781_201,
        0.003_352_433_4,
        -0.001_049_563_4,
        0.000_185_644_27,
    ];
    let a = x.abs();
    let z = x * x;
    let mut q = Q[7];
    for &c in Q[..7].iter().rev() {
        q = mul_add::<FMA>(q, z, c);
    }
    let small = mul_add::<FMA>(x * z, q, x);
    let e = exp_with::<FMA>(2.0 * a);
    let large = (1.0 - 2.0 / (e + 1.0)).copysign(x);
    if a < SEAM {
        small
    } else {
        large
    }
}

/// SIMD lanes the row loops keep separate partial results in (a multiple of every width used).
const LANES: usize = 16;

simd_fn! {
    /// Largest element of a row (NaNs skipped here; they surface through the exp sum).
    pub(crate) fn row_max(row: &[f32]) -> f32 = row_max_body;
}

/// [`row_max`]'s body, for loops already inside a level's function.
#[inline(always)]
pub(crate) fn row_max_body<const FMA: bool>(row: &[f32]) -> f32 {
    let larger = |a: f32, b: f32| if b > a { b } else { a };
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |m, &x| larger(m, x));
    for c in chunks {
        for j in 0..LANES {
            acc[j] = larger(acc[j], c[j]);
        }
    }
    acc.iter().fold(tail, |m, &x| larger(m, x))
}

simd_fn! {
    /// row[i] = exp(row[i] - max); returns the sum, accumulated in f64 lanes.
    pub(crate) fn exp_shifted_sum(row: &mut [f32], max: f32) -> f64 = exp_shifted_sum_body;
}

/// [`exp_shifted_sum`]'s body, for loops already inside a level's function.
#[inline(always)]
pub(crate) fn exp_shifted_sum_body<const FMA: bool>(row: &mut [f32], max: f32) -> f64 {
    let mut acc = [0.0f64; LANES];
    let mut chunks = row.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for j in 0..LANES {
            let e = exp_with::<FMA>(c[j] - max);
            c[j] = e;
            acc[j] += e as f64;
        }
    }
    let mut sum = 0.0f64;
    for x in chunks.into_remainder() {
        *x = exp_with::<FMA>(*x - max);
        sum += *x as f64;
    }
    acc.iter().sum::<f64>() + sum
}

#[cfg(test)]
mod tests;
