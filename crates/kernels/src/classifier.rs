//! The final projection fused with softmax cross-entropy, over row chunks: for each chunk of
//! rows, `logits = inp @ wteᵀ` lands in a (chunk_rows, V) scratch, becomes per-row losses and,
//! in place, `dlogits = dloss * (softmax - onehot)`, which two GEMMs push into `dinp` and `dwte`.
//! Never holds N×V: peak extra memory is the scratch the caller sizes (llm.c's fused classifier,
//! chunked over rows instead of fused into one kernel).
//!
//! [`loss`] is the forward alone (validation), [`logits`] one row's logits (sampling).
//! [`reference`] materialises everything in plain loops and is the test oracle.
//!
//! ```
//! // N = 1, C = 1, V = 2, all logits zero: loss = ln 2.
//! use kernels::classifier::{forward_backward, Io};
//! let (mut losses, mut dinp, mut dwte, mut scratch) = ([0.0f32], [0.0f32], [0.0f32; 2], [0.0f32; 2]);
//! let io = Io::new(&mut losses, &mut dinp, Some(&mut dwte), &[0.0], &[1.0, 1.0], &[1], &mut scratch);
//! let sum = forward_backward(io, (1, 1, 2), 1.0);
//! assert!((sum - 2f32.ln()).abs() < 1e-6);
//! ```

use crate::fastmath::{exp_shifted_sum, row_max, simd_fn};
use crate::matmul::{gemm, view, view_mut};
use crate::Real;
use faer::Accum;
use rayon::prelude::*;

/// One classifier call's slices, the table and its gradient in `W` (f32, or bf16 in
/// [`bf16`]): per-row losses (N), the input gradient dinp (N, C), the table's gradient dwte
/// (V, C) (`None`: a frozen head, LoRA), inp (N, C), the table wte (V, C), targets (N), and the
/// scratch of a chunk of rows ((chunk_rows, V) f32 here; [`bf16::scratch_bytes_per_row`] there).
pub struct Io<'a, W> {
    pub losses: &'a mut [f32],
    pub dinp: &'a mut [f32],
    pub dwte: Option<&'a mut [W]>,
    pub inp: &'a [f32],
    pub wte: &'a [W],
    pub targets: &'a [u32],
    pub scratch: &'a mut [W],
}

impl<'a, W> Io<'a, W> {
    /// The slices, in the order of the fields.
    pub fn new(
        losses: &'a mut [f32],
        dinp: &'a mut [f32],
        dwte: Option<&'a mut [W]>,
        inp: &'a [f32],
        wte: &'a [W],
        targets: &'a [u32],
        scratch: &'a mut [W],
    ) -> Self {
        Io {
            losses,
            dinp,
            dwte,
            inp,
            wte,
            targets,
            scratch,
        }
    }

    /// The slices, in the order of the fields.
    #[allow(clippy::type_complexity)]
    pub fn parts(
        self,
    ) -> (
        &'a mut [f32],
        &'a mut [f32],
        Option<&'a mut [W]>,
        &'a [f32],
        &'a [W],
        &'a [u32],
        &'a mut [W],
    ) {
        let s = self;
        (s.losses, s.dinp, s.dwte, s.inp, s.wte, s.targets, s.scratch)
    }
}

/// A vocabulary shard's part of the softmax (tensor parallelism, [`shard`]): this rank's table
/// rows start at id `first`; `stats` (3 × chunk rows f32) carries the per-row max, sum of
/// exponentials and target logit through `reduce` over the ranks.
pub struct VocabShard<'a> {
    pub first: usize,
    pub stats: &'a mut [f32],
    pub reduce: &'a mut dyn FnMut(&mut [f32], shard::RowReduce),
}

/// Per-row losses and `dloss * d(sum of losses)` accumulated into `dinp` and `dwte` for
/// (N, C, V) = `shape`, the scratch holding at least one row. Returns the sum of the losses.
pub fn forward_backward(io: Io<'_, f32>, shape: (usize, usize, usize), dloss: f32) -> f32 {
    let (losses, dinp, mut dwte, inp, wte, targets, scratch) = io.parts();
    let (n, c, v) = shape;
    let lens = (losses.len(), inp.len(), wte.len(), scratch.len());
    let rows = check(lens, targets, shape);
    assert!(dinp.len() == n * c && dwte.as_ref().is_none_or(|d| d.len() == v * c));
    let mut sum = 0.0f64;
    for i0 in (0..n).step_by(rows) {
        let cr = rows.min(n - i0);
        let x = &inp[i0 * c..(i0 + cr) * c];
        let dl = &mut scratch[..cr * v];
        chunk_logits(dl, x, wte, cr, c, v);
        sum += softmax_xent_rows(
            dl,
            &mut losses[i0..i0 + cr],
            &targets[i0..i0 + cr],
            v,
            Some(dloss),
        );
        let dx = &mut dinp[i0 * c..(i0 + cr) * c];
        chunk_backward(dl, x, wte, (dx, dwte.as_deref_mut()), (cr, c, v));
    }
    sum as f32
}

/// dx (rows, C) += dl (rows, V) @ wte (V, C) and, unless frozen, dwte (V, C) += dlᵀ @ x: the
/// two GEMMs that push a chunk's logit gradient back.
fn chunk_backward(
    dl: &[f32],
    x: &[f32],
    wte: &[f32],
    (dx, dwte): (&mut [f32], Option<&mut [f32]>),
    (rows, c, v): (usize, usize, usize),
) {
    let dl = view(dl, rows, v);
    gemm(view_mut(dx, rows, c), Accum::Add, dl, view(wte, v, c));
    if let Some(dwte) = dwte {
        gemm(
            view_mut(dwte, v, c),
            Accum::Add,
            dl.transpose(),
            view(x, rows, c),
        );
    }
}

/// The forward alone: per-row losses (N); returns their sum. Same shapes as [`Io`].
pub fn loss(
    losses: &mut [f32],
    inp: &[f32],
    wte: &[f32],
    targets: &[u32],
    scratch: &mut [f32],
    shape: (usize, usize, usize),
) -> f32 {
    let (n, c, v) = shape;
    let lens = (losses.len(), inp.len(), wte.len(), scratch.len());
    let rows = check(lens, targets, shape);
    let mut sum = 0.0f64;
    for i0 in (0..n).step_by(rows) {
        let cr = rows.min(n - i0);
        let dl = &mut scratch[..cr * v];
        chunk_logits(dl, &inp[i0 * c..(i0 + cr) * c], wte, cr, c, v);
        sum += softmax_xent_rows(dl, &mut losses[i0..i0 + cr], &targets[i0..i0 + cr], v, None);
    }
    sum as f32
}

/// out (V) = wte (V,C) @ inp (C): one position's logits, for sampling.
pub fn logits(out: &mut [f32], inp: &[f32], wte: &[f32], c: usize, v: usize) {
    assert!(out.len() == v && inp.len() == c && wte.len() == v * c);
    chunk_logits(out, inp, wte, 1, c, v);
}

/// Checks the lengths of the losses, inputs, table and scratch and the targets; returns the
/// rows of a chunk.
fn check(
    (losses, inp, wte, scratch): (usize, usize, usize, usize),
    targets: &[u32],
    (n, c, v): (usize, usize, usize),
) -> usize {
    assert!(losses == n && inp == n * c && wte == v * c && targets.len() == n);
    let rows = scratch / v;
    assert!(
        rows >= 1,
        "scratch must hold at least one row of V = {v} logits"
    );
    if let Some(&bad) = targets.iter().find(|&&x| x as usize >= v) {
        panic!("target {bad} beyond vocabulary {v}");
    }
    rows
}

/// logits (rows, V) = x (rows, C) @ wteᵀ.
fn chunk_logits(logits: &mut [f32], x: &[f32], wte: &[f32], rows: usize, c: usize, v: usize) {
    let w_t = view(wte, v, c).transpose();
    gemm(
        view_mut(logits, rows, v),
        Accum::Replace,
        view(x, rows, c),
        w_t,
    );
}

/// Per row: loss = logsumexp - logit[target]; with `dloss`, turns the row into
/// `dloss * (softmax - onehot)` in place. Returns the sum of the rows' losses.
///
/// One exp per logit: the row becomes exp(x - max) (summed in f64 lanes), then is scaled by
/// dloss / sum. The exp is [`fastmath::exp`] (<= 2 ulp), so the gradient carries ~2e-7
/// relative error per element on top of f32 rounding.
fn softmax_xent_rows(
    logits: &mut [f32],
    losses: &mut [f32],
    targets: &[u32],
    v: usize,
    dloss: Option<f32>,
) -> f64 {
    logits
        .par_chunks_mut(v)
        .zip(losses.par_iter_mut())
        .zip(targets.par_iter())
        .map(|((row, loss), &tgt)| {
            let target_logit = row[tgt as usize];
            let max = row_max(row);
            let sum = exp_shifted_sum(row, max);
            let lse = max as f64 + sum.ln();
            *loss = (lse - target_logit as f64) as f32;
            if let Some(d) = dloss {
                scale_row(row, (d as f64 / sum) as f32);
                row[tgt as usize] -= d;
            }
            *loss as f64
        })
        .sum()
}

simd_fn! {
    /// row *= s.
    fn scale_row(row: &mut [f32], s: f32) = scale_row_body;
}

#[inline(always)]
fn scale_row_body<const FMA: bool>(row: &mut [f32], s: f32) {
    for x in row.iter_mut() {
        *x *= s;
    }
}

/// Materialised N×V logits in plain loops, generic over the float type.
pub mod reference {
    use super::Real;

    /// Returns `sum of losses` and accumulates `dloss * gradient` into dinp (N,C), dwte (V,C).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_backward<F: Real>(
        dinp: &mut [F],
        dwte: &mut [F],
        inp: &[F],
        wte: &[F],
        targets: &[u32],
        n: usize,
        c: usize,
        v: usize,
        dloss: F,
    ) -> F {
        let mut total = F::zero();
        let mut logits = vec![F::zero(); v];
        for i in 0..n {
            let x = &inp[i * c..][..c];
            let mut max = F::neg_infinity();
            for (j, l) in logits.iter_mut().enumerate() {
                *l = F::zero();
                for k in 0..c {
                    *l += x[k] * wte[j * c + k];
                }
                max = max.max(*l);
            }
            let mut sum = F::zero();
            for &l in &logits {
                sum += (l - max).exp();
            }
            let lse = max + sum.ln();
            total += lse - logits[targets[i] as usize];
            for (j, &l) in logits.iter().enumerate() {
                let onehot = if j == targets[i] as usize {
                    F::one()
                } else {
                    F::zero()
                };
                let g = dloss * ((l - lse).exp() - onehot);
                for k in 0..c {
                    dinp[i * c + k] += g * wte[j * c + k];
                    dwte[j * c + k] += g * x[k];
                }
            }
        }
        total
    }
}

pub mod bf16;
pub mod shard;

#[cfg(test)]
mod tests;
