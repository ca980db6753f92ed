//! GELU with the tanh approximation, as GPT-2 uses:
//! `gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
//!
//! The fast kernels split the slice into chunks for rayon and evaluate tanh with
//! [`fastmath::tanh`] (a rational approximation, relative error <= 3e-7, that vectorises; glibc's
//! scalar `tanhf` was ~18% of a GPT-2 124M step); [`reference`] is the same formula over the
//! whole slice with the float type's own tanh, generic over [`Real`] (f64 for finite differences).
//!
//! ```
//! let mut out = [0.0f32; 2];
//! kernels::gelu::forward(&mut out, &[0.0, 10.0]);
//! assert_eq!(out[0], 0.0);
//! assert!((out[1] - 10.0).abs() < 1e-5);
//! ```

use crate::fastmath::{self, mul_add, simd_fn};
use crate::Real;
use rayon::prelude::*;

/// Elements per rayon task: 64 KiB of input, enough that scheduling is noise next to the work.
const CHUNK: usize = 1 << 14;

/// sqrt(2/pi) and the cubic coefficient of the tanh approximation.
const S: f32 = 0.797_884_6;
const K: f32 = 0.044_715;

/// out (N) = gelu(inp (N)).
pub fn forward(out: &mut [f32], inp: &[f32]) {
    assert_eq!(out.len(), inp.len());
    out.par_chunks_mut(CHUNK)
        .zip(inp.par_chunks(CHUNK))
        .for_each(|(o, x)| forward_chunk(o, x));
}

/// dinp (N) += gelu'(inp) * dout.
pub fn backward(dinp: &mut [f32], inp: &[f32], dout: &[f32]) {
    assert!(dinp.len() == inp.len() && inp.len() == dout.len());
    dinp.par_chunks_mut(CHUNK)
        .zip(inp.par_chunks(CHUNK))
        .zip(dout.par_chunks(CHUNK))
        .for_each(|((d, x), g)| backward_chunk(d, x, g));
}

simd_fn! {
    fn forward_chunk(out: &mut [f32], inp: &[f32]) = forward_body;
}

#[inline(always)]
fn forward_body<const FMA: bool>(out: &mut [f32], inp: &[f32]) {
    for (o, &x) in out.iter_mut().zip(inp) {
        let u = S * mul_add::<FMA>(K * x, x * x, x);
        *o = 0.5 * x * (1.0 + fastmath::tanh_with::<FMA>(u));
    }
}

simd_fn! {
    fn backward_chunk(dinp: &mut [f32], inp: &[f32], dout: &[f32]) = backward_body;
}

#[inline(always)]
fn backward_body<const FMA: bool>(dinp: &mut [f32], inp: &[f32], dout: &[f32]) {
    for ((d, &x), &g) in dinp.iter_mut().zip(inp).zip(dout) {
        let x2 = x * x;
        let u = S * mul_add::<FMA>(K * x, x2, x);
        let th = fastmath::tanh_with::<FMA>(u);
        let sech2 = mul_add::<FMA>(-th, th, 1.0);
        let du = S * mul_add::<FMA>(3.0 * K, x2, 1.0);
        let local = 0.5 * mul_add::<FMA>(x * sech2, du, 1.0 + th);
        *d = mul_add::<FMA>(g, local, *d);
    }
}

/// Plain loops, generic over the float type.
pub mod reference {
    use super::Real;

    fn coefs<F: Real>() -> (F, F) {
        (
            F::from_f64((2.0 / std::f64::consts::PI).sqrt()),
            F::from_f64(0.044715),
        )
    }

    pub fn forward<F: Real>(out: &mut [F], inp: &[F]) {
        let (s, k) = coefs::<F>();
        let half = F::from_f64(0.5);
        for (o, &x) in out.iter_mut().zip(inp) {
            let u = s * (x + k * x * x * x);
            *o = half * x * (F::one() + u.tanh());
        }
    }

    pub fn backward<F: Real>(dinp: &mut [F], inp: &[F], dout: &[F]) {
        let (s, k) = coefs::<F>();
        let (half, three) = (F::from_f64(0.5), F::from_f64(3.0));
        for ((d, &x), &g) in dinp.iter_mut().zip(inp).zip(dout) {
            let u = s * (x + k * x * x * x);
            let th = u.tanh();
            let sech2 = F::one() - th * th;
            let du = s * (F::one() + three * k * x * x);
            *d += g * (half * (F::one() + th) + half * x * sech2 * du);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    #[test]
    fn backward_matches_finite_differences() {
        let mut rng = Rng::new(3);
        let x: Vec<f64> = rng.vec(50).iter().map(|v| 4.0 * v).collect();
        let r = rng.vec(50);
        let loss = |x: &[f64]| {
            let mut out = vec![0.0; x.len()];
            reference::forward(&mut out, x);
            dot(&out, &r)
        };
        let fd = fd_grad(&x, loss);
        let mut d64 = vec![0.0; 50];
        reference::backward(&mut d64, &x, &r);
        assert_close("dinp f64", &d64, &fd, FD_TOL_F64);
        let mut d32 = vec![0.0f32; 50];
        backward(&mut d32, &to_f32(&x), &to_f32(&r));
        assert_close_f32("dinp f32", &d32, &fd, F32_TOL);
        let mut out32 = vec![0.0f32; 50];
        forward(&mut out32, &to_f32(&x));
        let mut out64 = vec![0.0; 50];
        reference::forward(&mut out64, &x);
        assert_close_f32("out", &out32, &out64, F32_TOL);
    }

    /// Worst error of the fast kernels against the f64 reference over [-12, 12] every 2^-10,
    /// relative to max(1, |value|), printed beside the same formula in f32 with the libm tanh.
    /// Backward is the looser one: 1 - tanh^2 cancels near |tanh| = 1 and x * du scales it.
    #[test]
    fn fast_kernels_close_to_f64() {
        let x: Vec<f64> = (-12 * 1024..=12 * 1024)
            .map(|i| i as f64 / 1024.0)
            .collect();
        let g = vec![1.0; x.len()];
        let (mut out64, mut d64) = (vec![0.0; x.len()], vec![0.0; x.len()]);
        reference::forward(&mut out64, &x);
        reference::backward(&mut d64, &x, &g);
        let (mut out32, mut d32) = (vec![0.0f32; x.len()], vec![0.0f32; x.len()]);
        forward(&mut out32, &to_f32(&x));
        backward(&mut d32, &to_f32(&x), &to_f32(&g));
        let worst = |got: &[f32], want: &[f64]| {
            got.iter()
                .zip(want)
                .map(|(&a, &b)| (a as f64 - b).abs() / b.abs().max(1.0))
                .fold(0.0f64, f64::max)
        };
        let (fwd, bwd) = (worst(&out32, &out64), worst(&d32, &d64));
        let (mut out_ref, mut d_ref) = (vec![0.0f32; x.len()], vec![0.0f32; x.len()]);
        reference::forward(&mut out_ref, &to_f32(&x));
        reference::backward(&mut d_ref, &to_f32(&x), &to_f32(&g));
        let (fwd_ref, bwd_ref) = (worst(&out_ref, &out64), worst(&d_ref, &d64));
        println!(
            "gelu vs f64: fast forward {fwd:.2e}, backward {bwd:.2e}; \
             f32 libm reference forward {fwd_ref:.2e}, backward {bwd_ref:.2e}"
        );
        assert!(
            fwd < 2e-7 && bwd < 1e-6,
            "forward {fwd:e}, backward {bwd:e}"
        );
    }
}
