//! Flash attention: causal GQA self-attention in tiles with an online softmax, keeping only the
//! log-sum-exp per row (B, NH, T) for the backward, which recomputes each tile's probabilities.
//! Extra memory is O(T) per head plus two fixed tiles per thread, against the O(T²) `att` of
//! [`crate::attention`], whose packing, layout and results it reproduces.
//!
//! Forward, per (b, h) and query tile i: for each key tile j ≤ i, `S = scale Q_i K_jᵀ` (masked
//! on the diagonal tile), running max `m` and sum `l` per row, `O_i = O_i * exp(m_old - m_new) +
//! exp(S - m_new) V_j`; finally `O_i /= l`, `lse = m + ln l`. The output buffer itself is the
//! accumulator. Backward, per (b, kv head) so that dK and dV of a group have one writer: for each
//! query head of the group and query tile i, `D = rowsum(dO ∘ O)`, then for each key tile j ≤ i:
//! `P = exp(S - lse)`, `dV_j += Pᵀ dO_i`, `dP = dO_i V_jᵀ`, `dS = scale P ∘ (dP - D)`,
//! `dQ_i += dS K_j`, `dK_j += dSᵀ Q_i`. Tiles are faer GEMMs on stack buffers. A sliding window
//! (`Shape::window`) masks keys before `t + 1 - window` and skips the key
//! tiles wholly before a query tile's window.
//!
//! ```
//! // The single-position case of `attention`: out = v, lse = q·k / sqrt(HD).
//! let qkv = [0.5f32, 2.0, 7.0]; // B = T = NH = NKV = HD = 1
//! let (mut out, mut lse) = ([0.0f32], [0.0f32]);
//! let shape = kernels::attention::Shape::causal(1, 1, 1, 1, 1);
//! kernels::flash::forward(&mut out, &mut lse, &qkv, shape);
//! assert_eq!((out[0], lse[0]), (7.0, 1.0));
//! ```

use crate::attention::{check_shapes, head, head_mut, Shape};
use crate::fastmath::exp_shifted_sum;
use crate::matmul::capped::matmul;
use crate::par::SyncPtr;
use faer::{Accum, MatMut, MatRef, Par};
use rayon::prelude::*;

/// Query and key rows per tile: a 64×64 f32 tile is 16 KiB, so the backward's two tiles fit in
/// L1+L2 next to the Q, K, V, dO panels they read.
pub const TILE: usize = 64;

/// Extra bytes the backward keeps per thread on its stack (the S/P and dP/dS tiles plus D).
pub const STACK_BYTES_PER_THREAD: usize = (2 * TILE * TILE + TILE) * 4;

/// The first key a query at `tq` sees under a window of `window` positions.
fn first_key(tq: usize, window: usize) -> usize {
    (tq + 1).saturating_sub(window)
}

/// out (B,T,NH*HD), lse (B,NH,T), qkv (B,T,(NH+2*NKV)*HD). Query `t` sees keys
/// `t + 1 - window ..= t`, and key tiles wholly before a query tile's window are skipped
/// (`usize::MAX`: plain causal).
pub fn forward(out: &mut [f32], lse: &mut [f32], qkv: &[f32], s: Shape) {
    let (b, t, nh, nkv, hd) = s.dims();
    let window = s.window;
    let r = check_shapes(qkv.len(), out.len(), s);
    assert_eq!(lse.len(), b * nh * t, "lse must be (B, NH, T)");
    let (c, group) = (nh * hd, nh / nkv);
    let scale = 1.0 / (hd as f32).sqrt();
    let out_ptr = SyncPtr(out.as_mut_ptr());
    lse.par_chunks_mut(t).enumerate().for_each(|(bh, lse)| {
        let (bi, h) = (bh / nh, bh % nh);
        let rows = &qkv[bi * t * r..(bi + 1) * t * r];
        let g = h / group;
        let mut s = [0.0f32; TILE * TILE];
        let mut m = [0.0f32; TILE];
        let mut l = [0.0f32; TILE];
        for i0 in (0..t).step_by(TILE) {
            let bq = TILE.min(t - i0);
            let q = head(rows, bq, hd, r, i0 * r + h * hd);
            m[..bq].fill(f32::NEG_INFINITY);
            l[..bq].fill(0.0);
            // SAFETY: task (b, h) alone writes batch b's columns of head h in `out` (borrowed
            // mutably for this call); tasks differ in b or h, so their writes are disjoint, and
            // this view is the only one alive on these elements.
            let mut o =
                unsafe { head_mut(out_ptr.get().add((bi * t + i0) * c + h * hd), bq, hd, c) };
            o.fill(0.0);
            let j_first = first_key(i0, window) / TILE * TILE;
            for j0 in (j_first..i0 + bq).step_by(TILE) {
                let bk = TILE.min(t - j0);
                let k = head(rows, bk, hd, r, j0 * r + (nh + g) * hd);
                let v = head(rows, bk, hd, r, j0 * r + (nh + nkv + g) * hd);
                let st = &mut s[..bq * bk];
                matmul(
                    MatMut::from_row_major_slice_mut(st, bq, bk),
                    Accum::Replace,
                    q,
                    k.transpose(),
                    scale,
                    Par::Seq,
                );
                for (qi, row) in st.chunks_exact_mut(bk).enumerate() {
                    let tq = i0 + qi;
                    let lo = first_key(tq, window);
                    let corr = online_softmax_row(row, tq, lo, j0, &mut m[qi], &mut l[qi]);
                    o.as_mut().row_mut(qi).iter_mut().for_each(|x| *x *= corr);
                }
                matmul(
                    o.as_mut(),
                    Accum::Add,
                    MatRef::from_row_major_slice(st, bq, bk),
                    v,
                    1.0,
                    Par::Seq,
                );
            }
            for qi in 0..bq {
                let inv = 1.0 / l[qi];
                o.as_mut().row_mut(qi).iter_mut().for_each(|x| *x *= inv);
                lse[i0 + qi] = m[qi] + l[qi].ln();
            }
        }
    });
}

/// Masks `row` (scores of query `tq`, whose window starts at key `lo`, against keys `j0..`),
/// updates the running max `m` and sum `l`, turns the visible part into `exp(S - m_new)` (zero
/// elsewhere) and returns the factor that rescales earlier sums.
fn online_softmax_row(
    row: &mut [f32],
    tq: usize,
    lo: usize,
    j0: usize,
    m: &mut f32,
    l: &mut f32,
) -> f32 {
    let live = (tq + 1).saturating_sub(j0).min(row.len());
    let start = lo.saturating_sub(j0).min(live);
    row[live..].fill(0.0);
    row[..start].fill(0.0);
    let tile_max = row[start..live]
        .iter()
        .fold(f32::NEG_INFINITY, |a, &x| a.max(x));
    let m_new = m.max(tile_max);
    if m_new == f32::NEG_INFINITY {
        row[start..live].fill(0.0);
        return 1.0; // nothing visible yet: the row stays empty
    }
    let corr = (*m - m_new).exp();
    // Vectorised exp (fastmath, <= 2 ulp), the tile's sum in f64 lanes.
    let sum = exp_shifted_sum(&mut row[start..live], m_new) as f32;
    *l = *l * corr + sum;
    *m = m_new;
    corr
}

/// Accumulates dqkv (B,T,R) from dout (B,T,NH*HD), given the forward's out and lse (the same
/// shape and window as the forward).
pub fn backward(dqkv: &mut [f32], dout: &[f32], out: &[f32], lse: &[f32], qkv: &[f32], s: Shape) {
    let (b, t, nh, nkv, hd) = s.dims();
    let window = s.window;
    let r = check_shapes(qkv.len(), out.len(), s);
    assert!(dqkv.len() == qkv.len() && dout.len() == out.len() && lse.len() == b * nh * t);
    let dptr = SyncPtr(dqkv.as_mut_ptr());
    let dims = Dims {
        t,
        nh,
        nkv,
        hd,
        r,
        c: nh * hd,
        window,
    };
    (0..b * nkv).into_par_iter().for_each(|bg| {
        let (bi, g) = (bg / nkv, bg % nkv);
        let base = SyncPtr(dptr.get().wrapping_add(bi * t * r));
        for h in g * (nh / nkv)..(g + 1) * (nh / nkv) {
            let io = HeadIo {
                rows: &qkv[bi * t * r..(bi + 1) * t * r],
                d_o: &dout[bi * t * dims.c..(bi + 1) * t * dims.c],
                o: &out[bi * t * dims.c..(bi + 1) * t * dims.c],
                lse: &lse[(bi * nh + h) * t..][..t],
            };
            // SAFETY (for `backward_head`): task (b, g) is the only one touching batch b's columns
            // of kv head g and of the query heads of group g in `dqkv`, borrowed mutably here.
            unsafe { backward_head(base, &io, h, g, dims) };
        }
    });
}

#[derive(Clone, Copy)]
struct Dims {
    t: usize,
    nh: usize,
    nkv: usize,
    hd: usize,
    r: usize,
    c: usize,
    window: usize,
}

/// One batch element's inputs for one query head.
struct HeadIo<'a> {
    rows: &'a [f32],
    d_o: &'a [f32],
    o: &'a [f32],
    lse: &'a [f32],
}

/// # Safety
/// `base` points at batch b's rows of dqkv, and the caller has exclusive access to the columns of
/// query head `h` and kv head `g` in them.
unsafe fn backward_head(base: SyncPtr<f32>, io: &HeadIo, h: usize, g: usize, d: Dims) {
    let Dims {
        t,
        nh,
        nkv,
        hd,
        r,
        c,
        window,
    } = d;
    let scale = 1.0 / (hd as f32).sqrt();
    let (mut p, mut ds, mut dd) = ([0.0f32; TILE * TILE], [0.0f32; TILE * TILE], [0.0f32; TILE]);
    for i0 in (0..t).step_by(TILE) {
        let bq = TILE.min(t - i0);
        let q = head(io.rows, bq, hd, r, i0 * r + h * hd);
        let d_o = head(io.d_o, bq, hd, c, i0 * c + h * hd);
        for (qi, dv) in dd[..bq].iter_mut().enumerate() {
            let (a, b) = (
                &io.d_o[(i0 + qi) * c + h * hd..][..hd],
                &io.o[(i0 + qi) * c + h * hd..][..hd],
            );
            *dv = a.iter().zip(b).map(|(x, y)| x * y).sum();
        }
        let j_first = first_key(i0, window) / TILE * TILE;
        for j0 in (j_first..i0 + bq).step_by(TILE) {
            let bk = TILE.min(t - j0);
            let k = head(io.rows, bk, hd, r, j0 * r + (nh + g) * hd);
            let v = head(io.rows, bk, hd, r, j0 * r + (nh + nkv + g) * hd);
            let (pt, dst) = (&mut p[..bq * bk], &mut ds[..bq * bk]);
            matmul(
                MatMut::from_row_major_slice_mut(pt, bq, bk),
                Accum::Replace,
                q,
                k.transpose(),
                scale,
                Par::Seq,
            );
            matmul(
                MatMut::from_row_major_slice_mut(dst, bq, bk),
                Accum::Replace,
                d_o,
                v.transpose(),
                1.0,
                Par::Seq,
            );
            for qi in 0..bq {
                let live = (i0 + qi + 1).saturating_sub(j0).min(bk);
                let start = first_key(i0 + qi, window).saturating_sub(j0).min(live);
                let (prow, dsrow) = (&mut pt[qi * bk..][..bk], &mut dst[qi * bk..][..bk]);
                exp_shifted_sum(&mut prow[start..live], io.lse[i0 + qi]);
                for s in start..live {
                    dsrow[s] = scale * prow[s] * (dsrow[s] - dd[qi]);
                }
                prow[..start].fill(0.0);
                dsrow[..start].fill(0.0);
                prow[live..].fill(0.0);
                dsrow[live..].fill(0.0);
            }
            let (pm, dsm) = (
                MatRef::from_row_major_slice(pt, bq, bk),
                MatRef::from_row_major_slice(dst, bq, bk),
            );
            // SAFETY: per the function contract; each view lives for one GEMM and the three cover
            // disjoint columns (q head h, k head g, v head g).
            let dv = head_mut(base.get().add(j0 * r + (nh + nkv + g) * hd), bk, hd, r);
            matmul(dv, Accum::Add, pm.transpose(), d_o, 1.0, Par::Seq);
            let dq = head_mut(base.get().add(i0 * r + h * hd), bq, hd, r);
            matmul(dq, Accum::Add, dsm, k, 1.0, Par::Seq);
            let dk = head_mut(base.get().add(j0 * r + (nh + g) * hd), bk, hd, r);
            matmul(dk, Accum::Add, dsm.transpose(), q, 1.0, Par::Seq);
        }
    }
}

#[cfg(test)]
mod tests;
