//! LayerNorm over the last axis (GPT-2): `out = (x - mean) * rstd * weight + bias`, eps 1e-5.
//! The forward keeps `mean` and `rstd` per row for the backward.
//!
//! Fast kernels: rows in parallel for the forward and for `dinp`; the parameter gradients are a
//! reduction over rows, so a second pass runs column blocks in parallel (each block owns its
//! slice of `dweight`/`dbias`), which needs no per-thread scratch. [`reference`] is llm.c's single
//! sequential loop, generic over [`Real`].
//!
//! ```
//! let (mut out, mut mean, mut rstd) = ([0.0f32; 2], [0.0f32], [0.0f32]);
//! kernels::layernorm::forward(&mut out, &mut mean, &mut rstd, &[1.0, 3.0], &[1.0; 2], &[0.0; 2], 1, 2);
//! assert_eq!(mean[0], 2.0);
//! assert!((out[0] + 1.0).abs() < 1e-4 && (out[1] - 1.0).abs() < 1e-4);
//! ```

use crate::Real;
use rayon::prelude::*;

/// PyTorch's `nn.LayerNorm` default, which GPT-2 uses.
pub const EPS: f64 = 1e-5;

/// Rows per rayon task; columns per task in the parameter-gradient pass.
const ROWS: usize = 16;
const COLS: usize = 64;

/// out (N,C), mean (N), rstd (N), inp (N,C), weight (C), bias (C).
#[allow(clippy::too_many_arguments)]
pub fn forward(
    out: &mut [f32],
    mean: &mut [f32],
    rstd: &mut [f32],
    inp: &[f32],
    weight: &[f32],
    bias: &[f32],
    n: usize,
    c: usize,
) {
    check(
        out.len(),
        mean.len(),
        rstd.len(),
        inp.len(),
        weight.len(),
        n,
        c,
    );
    out.par_chunks_mut(ROWS * c)
        .zip(mean.par_chunks_mut(ROWS))
        .zip(rstd.par_chunks_mut(ROWS))
        .zip(inp.par_chunks(ROWS * c))
        .for_each(|(((o, m), r), x)| reference::forward(o, m, r, x, weight, bias, m.len(), c));
}

/// Accumulates dinp (N,C), dweight (C), dbias (C) from dout (N,C); `params` `None`: a frozen
/// norm (LoRA), only dinp.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    dinp: &mut [f32],
    params: Option<(&mut [f32], &mut [f32])>,
    dout: &[f32],
    inp: &[f32],
    weight: &[f32],
    mean: &[f32],
    rstd: &[f32],
    n: usize,
    c: usize,
) {
    check(
        dinp.len(),
        mean.len(),
        rstd.len(),
        inp.len(),
        weight.len(),
        n,
        c,
    );
    assert_eq!(dout.len(), n * c);
    dinp.par_chunks_mut(c).enumerate().for_each(|(i, di)| {
        let (x, g) = (&inp[i * c..][..c], &dout[i * c..][..c]);
        let (m, r) = (mean[i], rstd[i]);
        let (mut dnorm_mean, mut dnorm_norm_mean) = (0.0f32, 0.0f32);
        for j in 0..c {
            let dnorm = weight[j] * g[j];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * (x[j] - m) * r;
        }
        dnorm_mean /= c as f32;
        dnorm_norm_mean /= c as f32;
        for j in 0..c {
            let norm = (x[j] - m) * r;
            di[j] += (weight[j] * g[j] - dnorm_mean - norm * dnorm_norm_mean) * r;
        }
    });
    let Some((dweight, dbias)) = params else {
        return;
    };
    assert!(dweight.len() == c && dbias.len() == c);
    column_sums(dweight, inp, dout, n, |i, x, g| (x - mean[i]) * rstd[i] * g);
    column_sums(dbias, inp, dout, n, |_, _, g| g);
}

/// `dw[j] += term(i, x[i, j], g[i, j])` summed over the rows i in order, for the C = `dw.len()`
/// columns of inp (N, C) and dout (N, C) in parallel blocks of `COLS`: a norm's weight (or
/// bias) gradient, one writer per column.
pub(crate) fn column_sums(
    dw: &mut [f32],
    inp: &[f32],
    dout: &[f32],
    n: usize,
    term: impl Fn(usize, f32, f32) -> f32 + Sync,
) {
    let c = dw.len();
    dw.par_chunks_mut(COLS).enumerate().for_each(|(blk, dw)| {
        let j0 = blk * COLS;
        for i in 0..n {
            let (x, g) = (
                &inp[i * c + j0..][..dw.len()],
                &dout[i * c + j0..][..dw.len()],
            );
            for j in 0..dw.len() {
                dw[j] += term(i, x[j], g[j]);
            }
        }
    });
}

fn check(out: usize, mean: usize, rstd: usize, inp: usize, weight: usize, n: usize, c: usize) {
    assert!(out == n * c && inp == n * c, "activations must be (N, C)");
    assert!(
        mean == n && rstd == n && weight == c,
        "statistics (N), weight (C)"
    );
}

/// Plain loops, generic over the float type.
pub mod reference {
    use super::{Real, EPS};

    #[allow(clippy::too_many_arguments)]
    pub fn forward<F: Real>(
        out: &mut [F],
        mean: &mut [F],
        rstd: &mut [F],
        inp: &[F],
        weight: &[F],
        bias: &[F],
        n: usize,
        c: usize,
    ) {
        let cf = F::from_f64(c as f64);
        for i in 0..n {
            let x = &inp[i * c..][..c];
            let mut m = F::zero();
            for &v in x {
                m += v;
            }
            m = m / cf;
            let mut var = F::zero();
            for &v in x {
                var += (v - m) * (v - m);
            }
            let r = F::one() / (var / cf + F::from_f64(EPS)).sqrt();
            for j in 0..c {
                out[i * c + j] = (x[j] - m) * r * weight[j] + bias[j];
            }
            mean[i] = m;
            rstd[i] = r;
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn backward<F: Real>(
        dinp: &mut [F],
        dweight: &mut [F],
        dbias: &mut [F],
        dout: &[F],
        inp: &[F],
        weight: &[F],
        mean: &[F],
        rstd: &[F],
        n: usize,
        c: usize,
    ) {
        let cf = F::from_f64(c as f64);
        for i in 0..n {
            let (x, g) = (&inp[i * c..][..c], &dout[i * c..][..c]);
            let (mut dnorm_mean, mut dnorm_norm_mean) = (F::zero(), F::zero());
            for j in 0..c {
                let norm = (x[j] - mean[i]) * rstd[i];
                dnorm_mean += weight[j] * g[j];
                dnorm_norm_mean += weight[j] * g[j] * norm;
            }
            dnorm_mean = dnorm_mean / cf;
            dnorm_norm_mean = dnorm_norm_mean / cf;
            for j in 0..c {
                let norm = (x[j] - mean[i]) * rstd[i];
                dbias[j] += g[j];
                dweight[j] += norm * g[j];
                dinp[i * c + j] +=
                    (weight[j] * g[j] - dnorm_mean - norm * dnorm_norm_mean) * rstd[i];
            }
        }
    }
}

#[cfg(test)]
mod tests;
