//! Causal self-attention with grouped-query heads, materialised: the forward keeps the T×T
//! probabilities per head for the backward (O(T²) memory; [`crate::flash`] is the O(T) version).
//!
//! Packing: each qkv row (B,T,R) with R = (NH + 2 NKV) HD holds `[q heads | k heads | v heads]`;
//! query head `h` reads kv head `h / (NH / NKV)`; scale 1/sqrt(HD); `att[b,h,t,s] = 0` for s > t.
//!
//! Fast kernels: the forward runs (b, h) pairs in parallel, each computing `S = Q Kᵀ` and `O = P V`
//! with a sequential faer GEMM; the backward runs (b, kv head) groups in parallel, since the query
//! heads of one group all add into the same dK and dV. GEMMs compute the full T×T square and the
//! softmax masks it: twice the causal flops, but GEMM speed. [`reference`] holds llm.c-style loops.
//!
//! ```
//! // B = T = NH = NKV = 1, HD = 1: a single position attends only to itself.
//! let qkv = [0.3f32, -1.0, 2.5];
//! let (mut out, mut att) = ([0.0f32], [0.0f32]);
//! let shape = kernels::attention::Shape::causal(1, 1, 1, 1, 1);
//! kernels::attention::forward(&mut out, &mut att, &qkv, shape);
//! assert_eq!((out[0], att[0]), (2.5, 1.0));
//! ```

use crate::fastmath::{exp_shifted_sum, row_max};
use crate::matmul::capped::matmul;
use crate::par::SyncPtr;
use crate::Real;
use faer::{Accum, MatMut, MatRef, Par};
use rayon::prelude::*;

pub mod reference;
#[cfg(test)]
mod tests;

/// One attention call's sizes: fused q|k|v rows (B, T, (NH + 2 NKV) HD).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub batch: usize,
    pub seq: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Positions a query sees, itself included (a sliding window); `usize::MAX`: all earlier.
    pub window: usize,
}

impl Shape {
    /// Plain causal attention (no window).
    pub fn causal(
        batch: usize,
        seq: usize,
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> Self {
        let window = usize::MAX;
        Shape {
            batch,
            seq,
            n_heads,
            n_kv_heads,
            head_dim,
            window,
        }
    }

    /// (B, T, NH, NKV, HD).
    pub fn dims(&self) -> (usize, usize, usize, usize, usize) {
        (
            self.batch,
            self.seq,
            self.n_heads,
            self.n_kv_heads,
            self.head_dim,
        )
    }
}

/// Checks the shapes shared by every attention kernel; returns the packed row length R.
pub(crate) fn check_shapes(qkv: usize, out: usize, s: Shape) -> usize {
    let (b, t, nh, nkv, hd) = s.dims();
    assert!(s.window >= 1, "a window holds at least one position");
    assert!(
        nkv >= 1 && nh.is_multiple_of(nkv),
        "NH ({nh}) must be a multiple of NKV ({nkv})"
    );
    let r = (nh + 2 * nkv) * hd;
    assert_eq!(qkv, b * t * r, "qkv must be (B, T, (NH + 2 NKV) HD)");
    assert_eq!(out, b * t * nh * hd, "out must be (B, T, NH HD)");
    r
}

/// (T, HD) view of one head inside a (T, R) block of packed rows starting at column `col`.
pub(crate) fn head(x: &[f32], t: usize, hd: usize, row_len: usize, col: usize) -> MatRef<'_, f32> {
    MatRef::from_row_major_slice_with_stride(&x[col..], t, hd, row_len)
}

/// Mutable (T, HD) view of one head inside rows of length `row_len` starting at `base`.
///
/// # Safety
/// `base` must point into a live buffer holding `t` rows of `row_len` from which columns
/// `0..hd` are in bounds, and no other live view may touch those elements.
pub(crate) unsafe fn head_mut<'a>(
    base: *mut f32,
    t: usize,
    hd: usize,
    row_len: usize,
) -> MatMut<'a, f32> {
    MatMut::from_raw_parts_mut(base, t, hd, row_len as isize, 1)
}

/// out (B,T,NH*HD), att (B,NH,T,T), qkv (B,T,(NH+2*NKV)*HD). Query `t` sees keys
/// `t + 1 - window ..= t` (Mistral's `sliding_window`; `usize::MAX` is plain causal attention).
/// The backward needs no window of its own: the probabilities it reads are zero outside it.
pub fn forward(out: &mut [f32], att: &mut [f32], qkv: &[f32], s: Shape) {
    let (b, t, nh, nkv, hd) = s.dims();
    let window = s.window;
    let r = check_shapes(qkv.len(), out.len(), s);
    assert_eq!(att.len(), b * nh * t * t, "att must be (B, NH, T, T)");
    let (c, group) = (nh * hd, nh / nkv);
    let scale = 1.0 / (hd as f32).sqrt();
    let out_ptr = SyncPtr(out.as_mut_ptr());
    att.par_chunks_mut(t * t).enumerate().for_each(|(bh, p)| {
        let (bi, h) = (bh / nh, bh % nh);
        let rows = &qkv[bi * t * r..(bi + 1) * t * r];
        let q = head(rows, t, hd, r, h * hd);
        let k = head(rows, t, hd, r, (nh + h / group) * hd);
        let v = head(rows, t, hd, r, (nh + nkv + h / group) * hd);
        matmul(
            MatMut::from_row_major_slice_mut(p, t, t),
            Accum::Replace,
            q,
            k.transpose(),
            scale,
            Par::Seq,
        );
        for (ti, row) in p.chunks_exact_mut(t).enumerate() {
            window_softmax_row(row, (ti + 1).saturating_sub(window), ti);
        }
        // SAFETY: task (b, h) writes only columns h*HD..(h+1)*HD of batch b's rows of `out`, which
        // `out` (borrowed for this whole call) holds; tasks differ in b or h, so writes are disjoint.
        let o = unsafe { head_mut(out_ptr.get().add(bi * t * c + h * hd), t, hd, c) };
        matmul(
            o,
            Accum::Replace,
            MatRef::from_row_major_slice(p, t, t),
            v,
            1.0,
            Par::Seq,
        );
    });
}

/// Softmax over `row[lo..=ti]` in place; zeroes the masked entries outside it.
fn window_softmax_row(row: &mut [f32], lo: usize, ti: usize) {
    let (head, rest) = row.split_at_mut(lo);
    let (live, masked) = rest.split_at_mut(ti + 1 - lo);
    // Vectorised max and exp (fastmath::exp, <= 2 ulp), row sum in f64 lanes.
    let max = row_max(live);
    let sum = exp_shifted_sum(live, max) as f32;
    let inv = 1.0 / sum;
    live.iter_mut().for_each(|x| *x *= inv);
    head.fill(0.0);
    masked.fill(0.0);
}

/// Accumulates dqkv (B,T,R) from dout (B,T,NH*HD); datt (B,NH,T,T) is scratch (overwritten).
pub fn backward(
    dqkv: &mut [f32],
    datt: &mut [f32],
    dout: &[f32],
    qkv: &[f32],
    att: &[f32],
    s: Shape,
) {
    let (b, t, nh, nkv, hd) = s.dims();
    let r = check_shapes(qkv.len(), dout.len(), s);
    assert!(dqkv.len() == qkv.len() && att.len() == b * nh * t * t && datt.len() == att.len());
    let (c, group) = (nh * hd, nh / nkv);
    let scale = 1.0 / (hd as f32).sqrt();
    let dptr = SyncPtr(dqkv.as_mut_ptr());
    // The query heads of kv group g are g*G..(g+1)*G: contiguous in (B, NH, T, T).
    datt.par_chunks_mut(group * t * t)
        .enumerate()
        .for_each(|(bg, ds_group)| {
            let (bi, g) = (bg / nkv, bg % nkv);
            let rows = &qkv[bi * t * r..(bi + 1) * t * r];
            let drows = &dout[bi * t * c..(bi + 1) * t * c];
            let (k, v) = (
                head(rows, t, hd, r, (nh + g) * hd),
                head(rows, t, hd, r, (nh + nkv + g) * hd),
            );
            let base = dptr.get().wrapping_add(bi * t * r);
            for (j, ds) in ds_group.chunks_exact_mut(t * t).enumerate() {
                let h = g * group + j;
                let p = &att[(bi * nh + h) * t * t..][..t * t];
                let (q, d_o) = (head(rows, t, hd, r, h * hd), head(drows, t, hd, c, h * hd));
                let p_mat = MatRef::from_row_major_slice(p, t, t);
                // SAFETY: task (b, g) alone touches batch b's columns of q head h (h in group g) and of
                // kv head g, inside `dqkv`, which this call borrows mutably throughout; the three
                // views cover disjoint column ranges and each lives for one GEMM.
                let (dq, dk, dv) = unsafe {
                    (
                        head_mut(base.add(h * hd), t, hd, r),
                        head_mut(base.add((nh + g) * hd), t, hd, r),
                        head_mut(base.add((nh + nkv + g) * hd), t, hd, r),
                    )
                };
                matmul(dv, Accum::Add, p_mat.transpose(), d_o, 1.0, Par::Seq);
                matmul(
                    MatMut::from_row_major_slice_mut(ds, t, t),
                    Accum::Replace,
                    d_o,
                    v.transpose(),
                    1.0,
                    Par::Seq,
                );
                for ((ds_row, p_row), ti) in ds.chunks_exact_mut(t).zip(p.chunks_exact(t)).zip(0..)
                {
                    softmax_backward_row(ds_row, p_row, ti, scale);
                }
                let ds_mat = MatRef::from_row_major_slice(ds, t, t);
                matmul(dq, Accum::Add, ds_mat, k, 1.0, Par::Seq);
                matmul(dk, Accum::Add, ds_mat.transpose(), q, 1.0, Par::Seq);
            }
        });
}

/// Turns dP into dS = scale * P ∘ (dP − rowsum(P ∘ dP)) in place; masked entries become 0.
fn softmax_backward_row(ds: &mut [f32], p: &[f32], ti: usize, scale: f32) {
    let dot: f32 = ds[..=ti].iter().zip(&p[..=ti]).map(|(d, p)| d * p).sum();
    for (d, &pv) in ds[..=ti].iter_mut().zip(&p[..=ti]) {
        *d = scale * pv * (*d - dot);
    }
    ds[ti + 1..].fill(0.0);
}

/// Generic over the float type so the reference can call it in f64 as well.
pub(crate) fn inv_sqrt<F: Real>(hd: usize) -> F {
    F::one() / F::from_f64(hd as f64).sqrt()
}
