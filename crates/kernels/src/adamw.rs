//! AdamW exactly as `torch.optim.AdamW` (amsgrad off, maximize off): decoupled weight decay
//! `p -= lr * wd * p` first, then `m = b1 m + (1-b1) g`, `v = b2 v + (1-b2) g^2`,
//! `p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)` with `t` the 1-based step.
//!
//! The update is elementwise and memory bound; chunks run in parallel with rayon. The test's
//! oracle is torch's documented algorithm written out in f64.
//!
//! ```
//! use kernels::adamw::{update, AdamW};
//! let (mut p, mut m, mut v) = ([1.0f32], [0.0f32], [0.0f32]);
//! let opt = AdamW { lr: 0.1, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 };
//! update(&mut p, &[0.5], &mut m, &mut v, opt, 1);
//! assert!((p[0] - 0.9).abs() < 1e-6); // the first step moves by lr * sign(g)
//! ```

use crate::fastmath::simd_fn;
use rayon::prelude::*;

/// Hyperparameters, with torch's names and meaning.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
}

impl AdamW {
    /// `torch.optim.AdamW(lr, betas, eps, weight_decay)`.
    pub const fn new(lr: f32, (beta1, beta2): (f32, f32), eps: f32, weight_decay: f32) -> AdamW {
        AdamW {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        }
    }
}

impl Default for AdamW {
    /// torch.optim.AdamW's defaults.
    fn default() -> Self {
        AdamW::new(1e-3, (0.9, 0.999), 1e-8, 1e-2)
    }
}

/// Elements per rayon task.
const CHUNK: usize = 1 << 14;

/// One step on params (P) with grads (P) and state m (P), v (P); `step` counts from 1.
pub fn update(
    params: &mut [f32],
    grads: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    opt: AdamW,
    step: u32,
) {
    assert!(
        step >= 1,
        "AdamW steps count from 1 (bias correction divides by 1 - beta^step)"
    );
    let n = params.len();
    assert!(grads.len() == n && m.len() == n && v.len() == n);
    // torch computes the corrections in f64 from Python floats; do the same, then round once.
    let bc1 = 1.0 - (opt.beta1 as f64).powi(step as i32);
    let bc2 = 1.0 - (opt.beta2 as f64).powi(step as i32);
    let step_size = (opt.lr as f64 / bc1) as f32;
    let bc2_sqrt = bc2.sqrt() as f32;
    let decay = 1.0 - opt.lr * opt.weight_decay;
    let k = Consts {
        opt,
        step_size,
        bc2_sqrt,
        decay,
    };
    params
        .par_chunks_mut(CHUNK)
        .zip(grads.par_chunks(CHUNK))
        .zip(m.par_chunks_mut(CHUNK).zip(v.par_chunks_mut(CHUNK)))
        .for_each(|((p, g), (m, v))| update_chunk(p, g, m, v, k));
}

/// What every element's update reads besides its own four values.
#[derive(Clone, Copy)]
struct Consts {
    opt: AdamW,
    step_size: f32,
    bc2_sqrt: f32,
    decay: f32,
}

simd_fn! {
    fn update_chunk(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], k: Consts) = update_body;
}

/// Zipped iterators (no bounds checks) so the loop vectorises; no FMA even where the CPU has it,
/// so every path rounds exactly as the scalar expressions (the engine's mixed-precision master
/// step is held bit-identical to this).
#[inline(always)]
fn update_body<const FMA: bool>(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], k: Consts) {
    let Consts {
        opt,
        step_size,
        bc2_sqrt,
        decay,
    } = k;
    for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
        *p *= decay;
        *m = opt.beta1 * *m + (1.0 - opt.beta1) * g;
        *v = opt.beta2 * *v + (1.0 - opt.beta2) * g * g;
        *p -= step_size * *m / (v.sqrt() / bc2_sqrt + opt.eps);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    /// torch.optim.AdamW's documented algorithm, in f64, one parameter at a time.
    fn torch_adamw(p: &mut [f64], g: &[f64], m: &mut [f64], v: &mut [f64], o: AdamW, t: i32) {
        let (lr, b1, b2) = (o.lr as f64, o.beta1 as f64, o.beta2 as f64);
        for i in 0..p.len() {
            p[i] -= lr * o.weight_decay as f64 * p[i];
            m[i] = b1 * m[i] + (1.0 - b1) * g[i];
            v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
            let m_hat = m[i] / (1.0 - b1.powi(t));
            let v_hat = v[i] / (1.0 - b2.powi(t));
            p[i] -= lr * m_hat / (v_hat.sqrt() + o.eps as f64);
        }
    }

    #[test]
    fn matches_torch_algorithm_over_ten_steps() {
        let mut rng = Rng::new(10);
        let n = 40_000; // spans several rayon chunks
        let opt = AdamW::new(3e-3, (0.8, 0.95), 1e-6, 0.1);
        let mut p64 = rng.vec(n);
        let (mut m64, mut v64) = (vec![0.0; n], vec![0.0; n]);
        let mut p32 = to_f32(&p64);
        let (mut m32, mut v32) = (vec![0.0f32; n], vec![0.0f32; n]);
        for step in 1..=10 {
            let g = rng.vec(n);
            torch_adamw(&mut p64, &g, &mut m64, &mut v64, opt, step);
            update(&mut p32, &to_f32(&g), &mut m32, &mut v32, opt, step as u32);
        }
        // Ten f32 updates of size ~lr: rounding stays far below 1e-6 absolute.
        assert_close_f32("params", &p32, &p64, 1e-6);
        assert_close_f32("m", &m32, &m64, 1e-6);
        assert_close_f32("v", &v32, &v64, 1e-6);
    }

    #[test]
    fn weight_decay_is_decoupled() {
        // Zero gradient: Adam's term is 0/(0+eps) = 0, so only the decay acts.
        let (mut p, mut m, mut v) = ([2.0f32], [0.0f32], [0.0f32]);
        let opt = AdamW {
            lr: 0.1,
            weight_decay: 0.5,
            ..AdamW::default()
        };
        update(&mut p, &[0.0], &mut m, &mut v, opt, 1);
        assert_eq!(p[0], 2.0 * (1.0 - 0.1 * 0.5));
    }
}
