//! GELU with the tanh approximation, as GPT-2 uses:
//! `gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
//!
//! The fast kernels split the slice into chunks for rayon; [`reference`] is the same loop over the
//! whole slice, generic over [`Real`] (f64 for finite differences).
//!
//! ```
//! let mut out = [0.0f32; 2];
//! kernels::gelu::forward(&mut out, &[0.0, 10.0]);
//! assert_eq!(out[0], 0.0);
//! assert!((out[1] - 10.0).abs() < 1e-5);
//! ```

use crate::Real;
use rayon::prelude::*;

/// Elements per rayon task: large enough that scheduling is noise next to 16K tanh calls.
const CHUNK: usize = 1 << 14;

/// out (N) = gelu(inp (N)).
pub fn forward(out: &mut [f32], inp: &[f32]) {
    assert_eq!(out.len(), inp.len());
    out.par_chunks_mut(CHUNK)
        .zip(inp.par_chunks(CHUNK))
        .for_each(|(o, x)| reference::forward(o, x));
}

/// dinp (N) += gelu'(inp) * dout.
pub fn backward(dinp: &mut [f32], inp: &[f32], dout: &[f32]) {
    assert!(dinp.len() == inp.len() && inp.len() == dout.len());
    dinp.par_chunks_mut(CHUNK)
        .zip(inp.par_chunks(CHUNK))
        .zip(dout.par_chunks(CHUNK))
        .for_each(|((d, x), g)| reference::backward(d, x, g));
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
}
