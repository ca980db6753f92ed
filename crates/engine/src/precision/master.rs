//! The mixed-precision optimizer step: AdamW on fp32 master weights and fp32 moments, fed by
//! gradients in f32, bf16 or f16 (multiplied by the loss scaler's inverse and the clip factor on
//! the way in), writing the bf16/f16 working copy the forward reads on the way out.
//!
//! One pass over memory instead of four (widen grads, unscale, update, narrow weights). The
//! arithmetic is `kernels::adamw::update`'s, expression for expression (same f64 bias
//! corrections rounded once, same f32 operation order, no fused multiply-add), so with f32
//! gradients and a multiplier of 1 the result is bit-identical to it; tests hold it to that.
//! Work runs in rayon chunks; inside a chunk, blocks of [`BLOCK`] elements go through stack
//! buffers, so nothing is allocated. Used on the device arena (`--precision bf16|fp16`) and on
//! host memory or a memory-mapped file (`offload`).
//!
//! ```
//! use engine::precision::{adamw_master_step, Grads, MasterStep, Working};
//! use half::bf16;
//! let (mut master, mut m, mut v) = (vec![1.0f32; 4], vec![0.0f32; 4], vec![0.0f32; 4]);
//! let grads = vec![bf16::from_f32(0.5); 4];
//! let mut working = vec![bf16::ZERO; 4];
//! let opt = kernels::adamw::AdamW { lr: 0.1, weight_decay: 0.0, ..Default::default() };
//! let step = MasterStep { opt, step: 1, grad_multiplier: 1.0 };
//! adamw_master_step(&mut master, &mut m, &mut v, Grads::Bf16(&grads), Some(Working::Bf16(&mut working)), step);
//! assert!((master[0] - 0.9).abs() < 1e-6); // the first step moves by lr * sign(g)
//! assert_eq!(working[0], bf16::from_f32(master[0]));
//! ```

use half::{bf16, f16};
use kernels::adamw::AdamW;
use kernels::convert;
use rayon::prelude::*;

/// Elements per rayon task.
const CHUNK: usize = 1 << 14;
/// Elements per stack block inside a task (3 KiB of f32 scratch).
pub const BLOCK: usize = 256;

/// This step's gradients, in the precision the backward produced them.
#[derive(Clone, Copy, Debug)]
pub enum Grads<'a> {
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
    F16(&'a [f16]),
}

impl Grads<'_> {
    pub fn len(&self) -> usize {
        match self {
            Grads::F32(g) => g.len(),
            Grads::Bf16(g) => g.len(),
            Grads::F16(g) => g.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn range(&self, start: usize, end: usize) -> Grads<'_> {
        match self {
            Grads::F32(g) => Grads::F32(&g[start..end]),
            Grads::Bf16(g) => Grads::Bf16(&g[start..end]),
            Grads::F16(g) => Grads::F16(&g[start..end]),
        }
    }

    /// Widens into `out` and multiplies by `multiplier` (skipped when it is 1, so f32 gradients
    /// pass through untouched, NaN payloads included).
    fn load(&self, out: &mut [f32], multiplier: f32) {
        match self {
            Grads::F32(g) => out.copy_from_slice(g),
            Grads::Bf16(g) => convert::bf16_to_f32(out, g),
            Grads::F16(g) => convert::f16_to_f32(out, g),
        }
        if multiplier != 1.0 {
            for x in out.iter_mut() {
                *x *= multiplier;
            }
        }
    }
}

/// The 2-byte copy of the weights the forward and backward read.
#[derive(Debug)]
pub enum Working<'a> {
    Bf16(&'a mut [bf16]),
    F16(&'a mut [f16]),
}

impl Working<'_> {
    fn len(&self) -> usize {
        match self {
            Working::Bf16(w) => w.len(),
            Working::F16(w) => w.len(),
        }
    }
}

/// Hyperparameters of one step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MasterStep {
    pub opt: AdamW,
    /// 1-based step count (bias correction).
    pub step: u32,
    /// Applied to every gradient first: `1 / loss_scale`, times the clip factor if clipping.
    /// With a power-of-two scale, `g * (inv_scale * clip)` equals unscaling then clipping.
    pub grad_multiplier: f32,
}

/// One AdamW step on `master`, `m`, `v` (all the same length as `grads`), then `working` (if
/// given) := `master` rounded to its format (round to nearest even).
pub fn adamw_master_step(
    master: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    grads: Grads<'_>,
    working: Option<Working<'_>>,
    step: MasterStep,
) {
    let n = master.len();
    assert!(
        grads.len() == n && m.len() == n && v.len() == n,
        "master, m, v and grads must have the same length"
    );
    assert!(step.step >= 1, "AdamW steps count from 1");
    if let Some(w) = &working {
        assert_eq!(w.len(), n, "the working copy must match the master weights");
    }
    let k = Coefficients::new(step.opt, step.step);
    let tasks = master
        .par_chunks_mut(CHUNK)
        .zip(m.par_chunks_mut(CHUNK).zip(v.par_chunks_mut(CHUNK)))
        .enumerate();
    match working {
        None => tasks.for_each(|(i, (p, (m, v)))| {
            let g = grads.range(i * CHUNK, i * CHUNK + p.len());
            chunk(p, m, v, g, None, &k, step.grad_multiplier);
        }),
        Some(Working::Bf16(w)) => {
            tasks
                .zip(w.par_chunks_mut(CHUNK))
                .for_each(|((i, (p, (m, v))), w)| {
                    let g = grads.range(i * CHUNK, i * CHUNK + p.len());
                    chunk(p, m, v, g, Some(Working::Bf16(w)), &k, step.grad_multiplier);
                })
        }
        Some(Working::F16(w)) => {
            tasks
                .zip(w.par_chunks_mut(CHUNK))
                .for_each(|((i, (p, (m, v))), w)| {
                    let g = grads.range(i * CHUNK, i * CHUNK + p.len());
                    chunk(p, m, v, g, Some(Working::F16(w)), &k, step.grad_multiplier);
                })
        }
    }
}

/// `kernels::adamw::update`'s per-step constants, computed the same way.
struct Coefficients {
    beta1: f32,
    beta2: f32,
    eps: f32,
    step_size: f32,
    bc2_sqrt: f32,
    decay: f32,
}

impl Coefficients {
    fn new(opt: AdamW, step: u32) -> Coefficients {
        let bc1 = 1.0 - (opt.beta1 as f64).powi(step as i32);
        let bc2 = 1.0 - (opt.beta2 as f64).powi(step as i32);
        Coefficients {
            beta1: opt.beta1,
            beta2: opt.beta2,
            eps: opt.eps,
            step_size: (opt.lr as f64 / bc1) as f32,
            bc2_sqrt: bc2.sqrt() as f32,
            decay: 1.0 - opt.lr * opt.weight_decay,
        }
    }
}

fn chunk(
    p: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    grads: Grads<'_>,
    mut working: Option<Working<'_>>,
    k: &Coefficients,
    multiplier: f32,
) {
    if let (Grads::F32(g), None, true) = (grads, &working, multiplier == 1.0) {
        // Nothing to widen, scale or narrow: one pass straight over the chunk.
        update_block(p, m, v, g, k);
        return;
    }
    let mut g = [0.0f32; BLOCK];
    let mut start = 0;
    while start < p.len() {
        let end = (start + BLOCK).min(p.len());
        let g = &mut g[..end - start];
        grads.range(start, end).load(g, multiplier);
        update_block(
            &mut p[start..end],
            &mut m[start..end],
            &mut v[start..end],
            g,
            k,
        );
        match &mut working {
            Some(Working::Bf16(w)) => convert::f32_to_bf16(&mut w[start..end], &p[start..end]),
            Some(Working::F16(w)) => convert::f32_to_f16(&mut w[start..end], &p[start..end]),
            None => {}
        }
        start = end;
    }
}

/// The update itself, over zipped slices (no bounds checks, so it vectorises).
#[inline(always)]
fn update_block(p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32], k: &Coefficients) {
    let (b1, b2) = (k.beta1, k.beta2);
    for (((p, m), v), &g) in p.iter_mut().zip(m.iter_mut()).zip(v.iter_mut()).zip(g) {
        *p *= k.decay;
        *m = b1 * *m + (1.0 - b1) * g;
        *v = b2 * *v + (1.0 - b2) * g * g;
        *p -= k.step_size * *m / (v.sqrt() / k.bc2_sqrt + k.eps);
    }
}
