//! SwiGLU gating for Llama-style MLPs: `out = silu(gate) * up`, with each input row laid out as
//! `[gate (H) | up (H)]` so one fused matmul produces both halves.
//!
//! Fast kernels run rows in parallel with rayon; [`reference`] is the sequential loop, generic
//! over [`Real`].
//!
//! ```
//! let inp = [0.0f32, 5.0]; // N = 1, H = 1: gate 0, up 5
//! let mut out = [1.0f32];
//! kernels::swiglu::forward(&mut out, &inp, 1, 1);
//! assert_eq!(out[0], 0.0); // silu(0) = 0
//! ```

use crate::Real;
use rayon::prelude::*;

/// Rows per rayon task.
const ROWS: usize = 16;

/// out (N,H), inp (N,2H).
pub fn forward(out: &mut [f32], inp: &[f32], n: usize, h: usize) {
    assert!(out.len() == n * h && inp.len() == n * 2 * h);
    out.par_chunks_mut(ROWS * h)
        .zip(inp.par_chunks(ROWS * 2 * h))
        .for_each(|(o, x)| reference::forward(o, x, o.len() / h, h));
}

/// dinp (N,2H) += d/dinp of `sum(out * dout)`; dout (N,H).
pub fn backward(dinp: &mut [f32], inp: &[f32], dout: &[f32], n: usize, h: usize) {
    assert!(dinp.len() == n * 2 * h && inp.len() == n * 2 * h && dout.len() == n * h);
    dinp.par_chunks_mut(ROWS * 2 * h)
        .zip(inp.par_chunks(ROWS * 2 * h))
        .zip(dout.par_chunks(ROWS * h))
        .for_each(|((d, x), g)| reference::backward(d, x, g, g.len() / h, h));
}

/// Plain loops, generic over the float type.
pub mod reference {
    use super::Real;

    fn sigmoid<F: Real>(x: F) -> F {
        F::one() / (F::one() + (-x).exp())
    }

    pub fn forward<F: Real>(out: &mut [F], inp: &[F], n: usize, h: usize) {
        for i in 0..n {
            let (gate, up) = inp[i * 2 * h..(i + 1) * 2 * h].split_at(h);
            for j in 0..h {
                out[i * h + j] = gate[j] * sigmoid(gate[j]) * up[j];
            }
        }
    }

    pub fn backward<F: Real>(dinp: &mut [F], inp: &[F], dout: &[F], n: usize, h: usize) {
        for i in 0..n {
            let (gate, up) = inp[i * 2 * h..(i + 1) * 2 * h].split_at(h);
            let (dgate, dup) = dinp[i * 2 * h..(i + 1) * 2 * h].split_at_mut(h);
            for j in 0..h {
                let (g, d) = (gate[j], dout[i * h + j]);
                let s = sigmoid(g);
                // silu'(g) = s + g s (1 - s)
                dgate[j] += d * up[j] * (s + g * s * (F::one() - s));
                dup[j] += d * g * s;
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
        let (n, h) = (37, 5); // 37 rows: not a multiple of the rayon chunk
        let mut rng = Rng::new(4);
        let x: Vec<f64> = rng.vec(n * 2 * h).iter().map(|v| 3.0 * v).collect();
        let r = rng.vec(n * h);
        let loss = |x: &[f64]| {
            let mut out = vec![0.0; n * h];
            reference::forward(&mut out, x, n, h);
            dot(&out, &r)
        };
        let fd = fd_grad(&x, loss);
        let mut d64 = vec![0.0; n * 2 * h];
        reference::backward(&mut d64, &x, &r, n, h);
        assert_close("dinp f64", &d64, &fd, FD_TOL_F64);
        let mut d32 = vec![0.0f32; n * 2 * h];
        backward(&mut d32, &to_f32(&x), &to_f32(&r), n, h);
        assert_close_f32("dinp f32", &d32, &fd, F32_TOL);
        let (mut o32, mut o64) = (vec![0.0f32; n * h], vec![0.0; n * h]);
        forward(&mut o32, &to_f32(&x), n, h);
        reference::forward(&mut o64, &x, n, h);
        assert_close_f32("out", &o32, &o64, F32_TOL);
    }
}
