//! RMSNorm over the last axis (Llama): `out = x * rstd * weight`, `rstd = 1/sqrt(mean(x^2) + eps)`.
//! The forward keeps `rstd` per row for the backward.
//!
//! Fast kernels run rows in parallel, and the weight gradient (a reduction over rows) in column
//! blocks; [`reference`] is the sequential loop, generic over [`Real`].
//!
//! ```
//! let (mut out, mut rstd) = ([0.0f32; 2], [0.0f32]);
//! kernels::rmsnorm::forward(&mut out, &mut rstd, &[3.0, 4.0], &[1.0; 2], 1, 2, 0.0);
//! // rms = sqrt((9 + 16) / 2)
//! assert!((out[1] - 4.0 / 12.5f32.sqrt()).abs() < 1e-6);
//! ```

use crate::Real;
use rayon::prelude::*;

const ROWS: usize = 16;

/// out (N,C), rstd (N), inp (N,C), weight (C).
pub fn forward(
    out: &mut [f32],
    rstd: &mut [f32],
    inp: &[f32],
    weight: &[f32],
    n: usize,
    c: usize,
    eps: f32,
) {
    assert!(out.len() == n * c && inp.len() == n * c && rstd.len() == n && weight.len() == c);
    out.par_chunks_mut(ROWS * c)
        .zip(rstd.par_chunks_mut(ROWS))
        .zip(inp.par_chunks(ROWS * c))
        .for_each(|((o, r), x)| reference::forward(o, r, x, weight, r.len(), c, eps));
}

/// Accumulates dinp (N,C) and dweight (C) from dout (N,C).
#[allow(clippy::too_many_arguments)]
pub fn backward(
    dinp: &mut [f32],
    dweight: Option<&mut [f32]>,
    dout: &[f32],
    inp: &[f32],
    weight: &[f32],
    rstd: &[f32],
    n: usize,
    c: usize,
) {
    assert!(dinp.len() == n * c && inp.len() == n * c && dout.len() == n * c);
    assert!(rstd.len() == n && weight.len() == c);
    dinp.par_chunks_mut(c).enumerate().for_each(|(i, di)| {
        let (x, g, r) = (&inp[i * c..][..c], &dout[i * c..][..c], rstd[i]);
        let mut dnorm_norm_mean = 0.0f32;
        for j in 0..c {
            dnorm_norm_mean += weight[j] * g[j] * x[j] * r;
        }
        dnorm_norm_mean /= c as f32;
        for j in 0..c {
            di[j] += (weight[j] * g[j] - x[j] * r * dnorm_norm_mean) * r;
        }
    });
    let Some(dweight) = dweight else {
        return;
    };
    assert_eq!(dweight.len(), c);
    crate::layernorm::column_sums(dweight, inp, dout, n, |i, x, g| x * rstd[i] * g);
}

/// Plain loops, generic over the float type.
pub mod reference {
    use super::Real;

    pub fn forward<F: Real>(
        out: &mut [F],
        rstd: &mut [F],
        inp: &[F],
        weight: &[F],
        n: usize,
        c: usize,
        eps: F,
    ) {
        for i in 0..n {
            let x = &inp[i * c..][..c];
            let mut ss = F::zero();
            for &v in x {
                ss += v * v;
            }
            let r = F::one() / (ss / F::from_f64(c as f64) + eps).sqrt();
            for j in 0..c {
                out[i * c + j] = x[j] * r * weight[j];
            }
            rstd[i] = r;
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn backward<F: Real>(
        dinp: &mut [F],
        dweight: &mut [F],
        dout: &[F],
        inp: &[F],
        weight: &[F],
        rstd: &[F],
        n: usize,
        c: usize,
    ) {
        for i in 0..n {
            let (x, g, r) = (&inp[i * c..][..c], &dout[i * c..][..c], rstd[i]);
            let mut dnorm_norm_mean = F::zero();
            for j in 0..c {
                dnorm_norm_mean += weight[j] * g[j] * x[j] * r;
            }
            dnorm_norm_mean = dnorm_norm_mean / F::from_f64(c as f64);
            for j in 0..c {
                dweight[j] += x[j] * r * g[j];
                dinp[i * c + j] += (weight[j] * g[j] - x[j] * r * dnorm_norm_mean) * r;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    #[test]
    fn backward_matches_finite_differences() {
        let (n, c, eps) = (19, 70, 1e-6);
        let mut rng = Rng::new(6);
        let (x, w, r) = (rng.vec(n * c), rng.vec(c), rng.vec(n * c));
        let loss = |x: &[f64], w: &[f64]| {
            let (mut out, mut s) = (vec![0.0; n * c], vec![0.0; n]);
            reference::forward(&mut out, &mut s, x, w, n, c, eps);
            dot(&out, &r)
        };
        let fd_x = fd_grad(&x, |x| loss(x, &w));
        let fd_w = fd_grad(&w, |w| loss(&x, w));
        let (mut out, mut s) = (vec![0.0; n * c], vec![0.0; n]);
        reference::forward(&mut out, &mut s, &x, &w, n, c, eps);
        let (mut dx, mut dw) = (vec![0.0; n * c], vec![0.0; c]);
        reference::backward(&mut dx, &mut dw, &r, &x, &w, &s, n, c);
        assert_close("dinp f64", &dx, &fd_x, FD_TOL_F64);
        assert_close("dweight f64", &dw, &fd_w, FD_TOL_F64);

        let (x32, w32) = (to_f32(&x), to_f32(&w));
        let (mut out32, mut s32) = (vec![0.0f32; n * c], vec![0.0f32; n]);
        forward(&mut out32, &mut s32, &x32, &w32, n, c, eps as f32);
        assert_close_f32("out", &out32, &out, F32_TOL);
        let (mut dx32, mut dw32) = (vec![0.0f32; n * c], vec![0.0f32; c]);
        backward(
            &mut dx32,
            Some(&mut dw32),
            &to_f32(&r),
            &x32,
            &w32,
            &s32,
            n,
            c,
        );
        assert_close_f32("dinp f32", &dx32, &fd_x, F32_TOL);
        assert_close_f32("dweight f32", &dw32, &fd_w, F32_TOL);
    }
}
